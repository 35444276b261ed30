"""APIs that newer torch removed or changed, as the last torch release that had them defined them.

Legacy (PyTorch 0.3 - 1.x) code fails on torch 2.x for reasons that have nothing to do with
what it computes: ``from torch._six import string_classes`` is gone, ``torch.solve(B, A)`` and
its siblings raise "deprecated since version 1.9 and is now removed", a legacy autograd
Function (instance ``forward``/``backward``) raises, ``loss.data[0]`` raises an IndexError,
``Variable(x, volatile=True)`` silently builds a graph and ``type(h) == Variable`` is False for
every tensor. This module is the one implementation of each old meaning, built on the modern
API; the ``legacy`` patch family (``st.patch("legacy")``, on in ``safetorch run``) routes the
old entry points here and ``safetorch check`` (ST017-ST029) rewrites call sites into the
modern spelling.

Semantics are taken from torch's own documentation and sources of the releases that still
had each API (``torch/_torch_docs.py`` of the 1.x series for ``solve``, ``eig``, ``lstsq``,
``symeig``; ``aten/src/ATen/native/LinearAlgebra.cpp`` for ``matrix_rank``; ``torch/_six.py``
of 1.5; 0.3's one-element tensors and ``python_variable_indexing.cpp`` of 0.4 for indexing a
0-dim tensor; ``torch/autograd/variable.py`` of 0.3 for ``Variable``;
``torch/nn/_reduction.py`` for ``size_average``/``reduce``; ``torch/nn/functional.py`` of
0.3-1.6 and THNN's ``BCECriterion`` for a ``binary_cross_entropy`` target of another shape).
"""

from __future__ import annotations

import collections.abc
import copy
import inspect
import io
import math
import queue
import sys
import types
import warnings
from typing import Any, Callable, Dict, NamedTuple, Optional, Sequence, Set, Tuple

import torch

from safetorch import _compat, _six_names
from safetorch._legacy_values import (
    LegacyScalar,
    ScalarArray,
    _first_or_last,
    div,
    div_,
    legacy_scalar,
    numpy,
    view,
)
from safetorch._stack import user_frame, user_stacklevel
from safetorch.errors import PatchWarning

__all__ = [
    "solve",
    "symeig",
    "eig",
    "lstsq",
    "matrix_rank",
    "six",
    "SIX_MODERN",
    "legacy_function",
    "is_legacy_function",
    "volatile",
    "VolatileTensor",
    "is_variable_type",
    "zero_dim_index",
    "reduction",
    "binary_cross_entropy",
    "LegacyScalar",
    "legacy_scalar",
    "div",
    "div_",
    "ScalarArray",
    "numpy",
    "view",
    "SolveResult",
    "SymeigResult",
    "EigResult",
    "LstsqResult",
]


# --- results -------------------------------------------------------------------------------
class SolveResult(NamedTuple):
    """``torch.solve``'s namedtuple: ``(solution, LU)``.

    >>> import torch
    >>> from safetorch.legacy import solve
    >>> solve(torch.ones(1, 1), 2 * torch.eye(1)).solution
    tensor([[0.5000]])
    """

    solution: torch.Tensor
    LU: torch.Tensor


class SymeigResult(NamedTuple):
    """``torch.symeig``'s namedtuple: ``(eigenvalues, eigenvectors)``.

    >>> import torch
    >>> from safetorch.legacy import symeig
    >>> symeig(torch.eye(2)).eigenvalues
    tensor([1., 1.])
    """

    eigenvalues: torch.Tensor
    eigenvectors: torch.Tensor


class EigResult(NamedTuple):
    """``torch.eig``'s namedtuple: ``(eigenvalues, eigenvectors)``, both real.

    >>> import torch
    >>> from safetorch.legacy import eig
    >>> eig(2 * torch.eye(1)).eigenvalues
    tensor([[2., 0.]])
    """

    eigenvalues: torch.Tensor
    eigenvectors: torch.Tensor


class LstsqResult(NamedTuple):
    """``torch.lstsq``'s namedtuple: ``(solution, QR)``.

    >>> import torch
    >>> from safetorch.legacy import lstsq
    >>> lstsq(torch.ones(1, 1), 2 * torch.eye(1)).solution
    tensor([[0.5000]])
    """

    solution: torch.Tensor
    QR: torch.Tensor


def _write_out(out: Optional[Sequence[torch.Tensor]], result: Tuple[torch.Tensor, ...]) -> Any:
    """Copy ``result`` into the caller's ``out=`` tensors (resized), as torch's out= did."""
    if out is None:
        return result
    if len(out) != len(result):
        raise TypeError(f"out= expects {len(result)} tensors, got {len(out)}")
    for dst, src in zip(out, result):
        dst.resize_(src.shape).copy_(src)
    return type(result)(*out)


def _matrix(name: str, x: Any, what: str) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}(): {what} must be a Tensor, got {type(x).__name__}")
    if x.dim() < 2:
        raise RuntimeError(
            f"{name}(): {what} must have at least 2 dimensions (got shape {tuple(x.shape)}); "
            "add a trailing dimension with .unsqueeze(-1)"
        )


# --- torch.solve -----------------------------------------------------------------------------
def solve(input: torch.Tensor, A: torch.Tensor, *, out: Any = None) -> SolveResult:
    """``torch.solve(B, A)`` of torch 1.x: solve ``A X = B``; returns ``(solution, LU)``.

    Note the argument order: the right-hand side ``B`` comes first (``torch.linalg.solve``
    takes ``(A, B)``). Batch dimensions broadcast; ``LU`` is the packed LU factorization of
    ``A`` (broadcast to the batch shape), as LAPACK ``getrf`` returns it.

    Args:
        input: ``B``, shape ``(*, m, k)``.
        A: square matrices ``(*, m, m)``.
        out: Optional ``(solution, LU)`` tensors to write into.

    Returns:
        ``SolveResult(solution, LU)``.

    Raises:
        RuntimeError: ``B`` or ``A`` has fewer than 2 dimensions, or ``A`` is singular.

    >>> import torch, safetorch as st
    >>> A = torch.tensor([[2., 0.], [0., 4.]]); B = torch.tensor([[2.], [8.]])
    >>> st.legacy.solve(B, A).solution
    tensor([[1.],
            [2.]])
    """
    _matrix("solve", input, "input (B)")
    _matrix("solve", A, "A")
    batch = torch.broadcast_shapes(input.shape[:-2], A.shape[:-2])
    A_b = A.expand(*batch, *A.shape[-2:])
    B_b = input.expand(*batch, *input.shape[-2:])
    LU, pivots, info = torch.linalg.lu_factor_ex(A_b)
    if bool((info > 0).any()):
        raise RuntimeError(
            "solve: U(i,i) is zero, singular U (A is singular); check A, or use "
            "torch.linalg.lstsq for a least-squares solution"
        )
    solution = torch.linalg.lu_solve(LU, pivots, B_b)
    return _write_out(out, SolveResult(solution, LU))


# --- torch.symeig ----------------------------------------------------------------------------
def symeig(
    input: torch.Tensor, eigenvectors: bool = False, upper: bool = True, *, out: Any = None
) -> SymeigResult:
    """``torch.symeig`` of torch 1.x: eigenvalues (ascending) and, if asked, eigenvectors.

    Only one triangle of ``input`` is read: the upper one by default (``upper=True``), as
    ``torch.linalg.eigh(UPLO="U")``. With ``eigenvectors=False`` (the default) the
    eigenvectors are an empty tensor, as torch 1.x returned them.

    Args:
        input: Symmetric (Hermitian) matrices ``(*, n, n)``.
        eigenvectors: Also compute the eigenvectors.
        upper: Read the upper triangle (else the lower one).
        out: Optional ``(eigenvalues, eigenvectors)`` tensors to write into.

    Returns:
        ``SymeigResult(eigenvalues, eigenvectors)``.

    >>> import torch, safetorch as st
    >>> st.legacy.symeig(torch.tensor([[2., 1.], [1., 2.]]))
    SymeigResult(eigenvalues=tensor([1., 3.]), eigenvectors=tensor([]))
    """
    _matrix("symeig", input, "input")
    uplo = "U" if upper else "L"
    if eigenvectors:
        values, vectors = torch.linalg.eigh(input, UPLO=uplo)
    else:
        values = torch.linalg.eigvalsh(input, UPLO=uplo)
        vectors = input.new_empty(0)
    return _write_out(out, SymeigResult(values, vectors))


# --- torch.eig -------------------------------------------------------------------------------
def eig(input: torch.Tensor, eigenvectors: bool = False, *, out: Any = None) -> EigResult:
    """``torch.eig`` of torch 1.x: eigenvalues as ``(n, 2)`` (real, imaginary) rows.

    ``eigenvectors`` (an empty tensor unless asked for) is real ``(n, n)`` in LAPACK
    ``geev``'s packed form: column ``j`` of a real eigenvalue is its eigenvector; for a
    complex conjugate pair ``j, j + 1`` (positive imaginary part first) the eigenvectors
    are ``v[:, j] + i v[:, j + 1]`` and ``v[:, j] - i v[:, j + 1]``. Computed with
    ``torch.linalg.eig``, which calls the same ``geev`` and unpacks it.

    Args:
        input: A real square matrix ``(n, n)`` (no batches, as in torch 1.x).
        eigenvectors: Also compute the eigenvectors.
        out: Optional ``(eigenvalues, eigenvectors)`` tensors to write into.

    Returns:
        ``EigResult(eigenvalues, eigenvectors)``.

    Raises:
        RuntimeError: ``input`` is not a real 2-D square matrix.

    >>> import torch, safetorch as st
    >>> st.legacy.eig(torch.tensor([[0., -1.], [1., 0.]])).eigenvalues
    tensor([[ 0.,  1.],
            [ 0., -1.]])
    """
    if not isinstance(input, torch.Tensor) or input.dim() != 2 or input.is_complex():
        raise RuntimeError(
            "eig: expected a real 2-D square matrix (torch 1.x's torch.eig took no batches "
            "and no complex input); use torch.linalg.eig for those"
        )
    if eigenvectors:
        w, v = torch.linalg.eig(input)
        packed = v.real.clone()
        # geev stores a pair's vector once: real part in column j, imaginary part in j + 1.
        for j in torch.nonzero(w.imag > 0).flatten().tolist():
            packed[:, j + 1] = v[:, j].imag
    else:
        w = torch.linalg.eigvals(input)
        packed = input.new_empty(0)
    values = torch.view_as_real(w).to(input.dtype)
    return _write_out(out, EigResult(values, packed))


# --- torch.lstsq -----------------------------------------------------------------------------
def _zero_diagonal(R: torch.Tensor) -> None:
    zero = torch.nonzero(torch.diagonal(R) == 0).flatten().tolist()
    if zero:
        raise RuntimeError(
            f"Lapack Error in gels : The {zero[0] + 1}-th diagonal element of the triangular "
            "factor of A is zero (A is rank deficient); use torch.linalg.lstsq(A, B, "
            "driver='gelsd') for a rank-deficient least-squares solution"
        )


def lstsq(input: torch.Tensor, A: torch.Tensor, *, out: Any = None) -> LstsqResult:
    """``torch.lstsq(B, A)`` of torch 1.x (LAPACK ``gels``): least squares / least norm.

    For ``A`` of shape ``(m, n)`` and ``B`` of shape ``(m, k)`` the solution has shape
    ``(max(m, n), k)``: its first ``n`` rows solve the problem, and when ``m > n`` the
    remaining ``m - n`` rows hold the residuals (their squares sum to the residual sum of
    squares of each column). ``QR`` is ``gels``'s factorization of ``A`` (``geqrf``'s
    output for ``m >= n``; the LQ form of ``gelqf`` for ``m < n``). ``A`` must have full
    rank: an exactly zero diagonal element of the triangular factor raises, as ``gels`` did.
    A 1-D ``B`` is one column. Same algorithm as ``gels``: QR (LQ), apply ``Q``, one
    triangular solve.

    Args:
        input: ``B``, shape ``(m, k)`` or ``(m,)``.
        A: ``(m, n)``.
        out: Optional ``(solution, QR)`` tensors to write into.

    Returns:
        ``LstsqResult(solution, QR)``.

    Raises:
        RuntimeError: Not 2-D matrices, or ``A`` rank deficient.

    >>> import torch, safetorch as st
    >>> A = torch.tensor([[1., 0.], [0., 1.], [0., 0.]]); B = torch.tensor([[1.], [2.], [3.]])
    >>> st.legacy.lstsq(B, A).solution  # rows 0-1: solution, row 2: residual
    tensor([[1.],
            [2.],
            [3.]])
    """
    if not isinstance(A, torch.Tensor) or A.dim() != 2:
        raise RuntimeError("lstsq: A must be a 2-D matrix (torch 1.x's lstsq took no batches)")
    B = input.unsqueeze(-1) if isinstance(input, torch.Tensor) and input.dim() == 1 else input
    if not isinstance(B, torch.Tensor) or B.dim() != 2 or B.shape[0] != A.shape[0]:
        raise RuntimeError(
            f"lstsq: B must be (m, k) with m = A.size(0) = {A.shape[0]}, "
            f"got {tuple(getattr(input, 'shape', ()))}"
        )
    m, n = A.shape
    k = B.shape[1]
    if m >= n:
        a, tau = torch.geqrf(A)
        R = a[:n, :n].triu()
        _zero_diagonal(R)
        qtb = torch.ormqr(a, tau, B, left=True, transpose=True)  # Q^T B
        x = torch.linalg.solve_triangular(R, qtb[:n], upper=True)
        solution = torch.cat([x, qtb[n:]], dim=0)
        qr = a
    else:
        # gelqf(A) is geqrf(A^T) transposed: A = L Q with L = R^T.
        a, tau = torch.geqrf(A.mT)
        R = a[:m, :m].triu()
        _zero_diagonal(R)
        y = torch.linalg.solve_triangular(R.mT, B, upper=False)
        padded = torch.cat([y, B.new_zeros(n - m, k)], dim=0)
        solution = torch.ormqr(a, tau, padded, left=True, transpose=False)
        qr = a.mT
    return _write_out(out, LstsqResult(solution, qr))


# --- torch.matrix_rank -----------------------------------------------------------------------
def matrix_rank(
    input: torch.Tensor, tol: Optional[float] = None, symmetric: bool = False, *, out: Any = None
) -> torch.Tensor:
    """``torch.matrix_rank`` of torch 1.x: how many singular values exceed ``tol``.

    ``tol`` is absolute; by default ``S.max() * max(m, n) * eps`` for the dtype. With
    ``symmetric=True`` the absolute eigenvalues of the *upper* triangle (``symeig``'s
    default) replace the singular values.

    Args:
        input: A 2-D floating point matrix.
        tol: Values ``<= tol`` count as zero.
        symmetric: ``input`` is symmetric: use eigenvalues.
        out: Optional 0-dim int64 tensor to write into.

    Returns:
        The rank, a 0-dim ``int64`` tensor.

    Raises:
        RuntimeError: ``input`` is not a 2-D floating point matrix.

    >>> import torch, safetorch as st
    >>> st.legacy.matrix_rank(torch.eye(3))
    tensor(3)
    """
    if not isinstance(input, torch.Tensor) or input.dim() != 2 or not input.is_floating_point():
        raise RuntimeError("matrix_rank: expected a 2-D tensor of floating types")
    if symmetric:
        S = torch.linalg.eigvalsh(input, UPLO="U").abs()
    else:
        S = torch.linalg.svdvals(input)
    if tol is None:
        eps = torch.finfo(input.dtype).eps
        rank = (S > S.max() * (eps * max(input.shape))).sum()
    else:
        rank = (S > tol).sum()
    if out is not None:
        out.resize_(rank.shape).copy_(rank)
        return out
    return rank


# --- torch._six ------------------------------------------------------------------------------
def _with_metaclass(meta: type, *bases: type) -> type:
    """Create a base class with a metaclass (torch._six.with_metaclass)."""

    class metaclass(meta):
        def __new__(cls, name: str, this_bases: Any, d: Dict[str, Any]) -> Any:
            return meta(name, bases, d)

    return type.__new__(metaclass, "temporary_class", (), {})


def _raise_from(value: BaseException, from_value: Optional[BaseException]) -> None:
    raise value from from_value


def _istuple(obj: Any) -> bool:
    t = type(obj)
    return isinstance(obj, tuple) or t.__module__ == "torch.return_types"


def _bind_method(fn: Callable[..., Any], obj: Any, obj_type: Any) -> Any:
    return types.MethodType(fn, obj)


# The Python 3 values of torch/_six.py's names and their modern spelling, for the report and
# the rule (one torch-free table, which the checker shares).
SIX_MODERN = _six_names.SIX_MODERN

six = types.ModuleType(
    "torch._six",
    "torch._six as torch 1.x had it on Python 3 (removed in torch 2.0); see SIX_MODERN.",
)
"""``torch._six`` of torch 1.x (Python 3 values), a module ``st.patch("legacy")`` installs.

>>> import safetorch as st
>>> st.legacy.six.string_classes, st.legacy.six.int_classes
((<class 'str'>, <class 'bytes'>), <class 'int'>)
"""
import builtins as _builtins  # noqa: E402

six.__dict__.update(
    PY2=False,
    PY3=True,
    PY37=sys.version_info >= (3, 7),
    inf=math.inf,
    nan=math.nan,
    string_classes=(str, bytes),
    int_classes=int,
    container_abcs=collections.abc,
    FileNotFoundError=FileNotFoundError,
    queue=queue,
    builtins=_builtins,
    with_metaclass=_with_metaclass,
    imap=map,
    exec_=_builtins.exec,
    raise_from=_raise_from,
    get_function_from_type=lambda cls, name: getattr(cls, name, None),
    StringIO=io.StringIO,
    istuple=_istuple,
    bind_method=_bind_method,
)
assert set(SIX_MODERN) == {n for n in vars(six) if not n.startswith("__")}


# --- legacy autograd Function ----------------------------------------------------------------
_FunctionBase = torch.autograd.Function


def is_legacy_function(fn: Any) -> bool:
    """Whether ``fn`` (a Function instance or class) defines ``forward`` as an instance method.

    >>> import torch, safetorch as st
    >>> class Double(torch.autograd.Function):
    ...     def forward(self, x): return 2 * x
    ...     def backward(self, g): return 2 * g
    >>> st.legacy.is_legacy_function(Double)
    True
    """
    cls = fn if isinstance(fn, type) else type(fn)
    if not (isinstance(cls, type) and issubclass(cls, _FunctionBase)):
        return False
    forward = inspect.getattr_static(cls, "forward", None)
    return inspect.isfunction(forward) and forward is not inspect.getattr_static(
        _FunctionBase, "forward", None
    )


# Attributes of the legacy object that, inside forward/backward, mean the new-style ctx.
_CTX_ATTRS = frozenset(
    {
        "save_for_backward",
        "saved_tensors",
        "saved_variables",
        "mark_dirty",
        "mark_non_differentiable",
        "mark_shared_storage",
        "set_materialize_grads",
    }
)


class _LegacySelf:
    """``self`` inside a legacy forward/backward: the instance, with ctx methods on the ctx."""

    __slots__ = ("_legacy", "_ctx")

    def __init__(self, legacy: Any, ctx: Any) -> None:
        object.__setattr__(self, "_legacy", legacy)
        object.__setattr__(self, "_ctx", ctx)

    def __getattr__(self, name: str) -> Any:
        if name in _CTX_ATTRS:
            return getattr(self._ctx, "saved_tensors" if name == "saved_variables" else name)
        if name == "needs_input_grad":
            return self._ctx.needs_input_grad[1:]  # slot 0 is the legacy object
        static = inspect.getattr_static(type(self._legacy), name, None)
        if inspect.isfunction(static) and name not in vars(self._legacy):
            return types.MethodType(static, self)  # helper methods see this self too
        return getattr(self._legacy, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._legacy, name, value)  # kept from forward to backward, as before


class _LegacyAdapter(torch.autograd.Function):
    """The generated new-style Function: forward/backward call the legacy instance's."""

    @staticmethod
    def forward(ctx: Any, legacy: Any, *args: Any) -> Any:
        ctx.legacy = legacy
        return type(legacy).forward(_LegacySelf(legacy, ctx), *args)

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> Any:
        result = type(ctx.legacy).backward(_LegacySelf(ctx.legacy, ctx), *grads)
        if not isinstance(result, tuple):
            result = (result,)
        return (None, *result)


def legacy_function(fn: Any, *args: Any) -> Any:
    """Call a legacy autograd Function instance (``MyFn()(x)``) as torch 0.4-1.4 did.

    ``forward`` and ``backward`` are the instance's own methods; they run inside a
    generated new-style Function, with ``self.save_for_backward``, ``self.saved_tensors``,
    ``self.mark_dirty``, ``self.mark_non_differentiable`` and ``self.needs_input_grad``
    meaning the new-style ``ctx``'s, and other attributes set on ``self`` in forward
    visible in backward. Gradients are exactly what the legacy ``backward`` returns.

    Args:
        fn: An instance of a Function subclass with instance ``forward``/``backward``.
        *args: The inputs.

    Returns:
        ``forward``'s output, connected to the graph.

    Raises:
        TypeError: ``fn`` is not a legacy Function instance.

    >>> import torch, safetorch as st
    >>> class Double(torch.autograd.Function):
    ...     def forward(self, x): return 2 * x
    ...     def backward(self, g): return 2 * g
    >>> x = torch.ones(2, requires_grad=True)
    >>> st.legacy.legacy_function(Double.__new__(Double), x).sum().backward(); x.grad
    tensor([2., 2.])
    """
    if isinstance(fn, type) or not is_legacy_function(fn):
        raise TypeError(
            f"legacy_function expects an instance of an autograd.Function subclass with "
            f"instance forward/backward, got {fn!r}; call new-style Functions as Fn.apply(...)"
        )
    return _LegacyAdapter.apply(fn, *args)


# --- Variable(..., volatile=True) ------------------------------------------------------------
_plain = torch.Tensor
_set_grad_enabled = torch._C._set_grad_enabled  # what torch.no_grad() calls
_NOWRAP = torch.overrides.get_default_nowrap_functions()  # what Tensor.__torch_function__ skips
_make_subclass = torch.Tensor._make_subclass  # a detached tensor of a subclass (not a view)
# The C getset descriptor behind ``x.data`` (torch's stubs type it as a Tensor).
_tensor_data: Any = torch.Tensor.data
_Parameter = torch.nn.Parameter


class VolatileTensor(torch.Tensor):
    """A tensor marked ``volatile`` as in torch <= 0.3: every result computed from it is
    computed under ``torch.no_grad()`` and is volatile too, so no graph is recorded.

    Volatility propagates to exactly what a volatile ``Variable`` of 0.3 passed it on to:
    the tensor results of torch functions, Tensor methods and operators on it (modules
    included), its views, ``.detach()``, rows met by iterating it, and ``copy.deepcopy``.
    It does not reach ``.data`` (a plain tensor, as 0.3's ``Variable.data`` was a plain
    ``Tensor``), Python numbers (``.item()``, ``.tolist()``, ``x[0]`` of a 0-dim result
    under ``st.patch("legacy")``), NumPy arrays (``.numpy()``, ``numpy.asarray``),
    formatting (``format(x, spec)`` and f-strings give what a plain tensor gives) or
    pickling (``torch.save``, ``pickle``, ``copy.copy``, multiprocessing queues write a
    plain tensor, which ``torch.load(weights_only=True)`` reads back). Hashing and
    equality are a plain tensor's (by identity, elementwise). An in-place target or an
    ``out=`` tensor is returned as itself, volatile or not, as under ``torch.no_grad()``;
    ``nn.Parameter(x)`` of a volatile ``x`` is a plain ``Parameter`` that trains, as
    ``nn.Parameter`` of a tensor computed under ``torch.no_grad()`` is. ``x.volatile =
    False`` makes ``x`` a plain tensor (0.3 cleared the flag the same way), so a target
    computed without a graph can enter a loss that has one.

    >>> import torch, safetorch as st
    >>> w = torch.ones(2, requires_grad=True)
    >>> y = st.legacy.volatile(torch.ones(2)) * w
    >>> y.requires_grad, y.volatile, type(y.data).__name__
    (False, True, 'Tensor')
    """

    @property
    def volatile(self) -> bool:
        """True: results computed from this tensor record no graph."""
        return True

    @volatile.setter
    def volatile(self, value: bool) -> None:
        # 0.3 let a leaf's flag be cleared (``next_q.volatile = False``, the DDPG/DQN idiom
        # to use a target computed without a graph in a loss that has one): the tensor
        # becomes a plain one, a leaf that needs no grad, so ops mixing it with tensors that
        # require grad record a graph again. Setting True again is a no-op.
        if not isinstance(value, bool):
            kind = type(value)
            where = "" if kind.__module__ == "builtins" else f"{kind.__module__}."
            raise TypeError(f"volatile must be a bool, got {where}{kind.__qualname__} ({value!r})")
        if not value:
            object.__setattr__(self, "__class__", _plain)

    @classmethod
    def __torch_function__(
        cls, func: Any, types: Any, args: Sequence[Any] = (), kwargs: Optional[Dict] = None
    ) -> Any:
        # torch.Tensor.__torch_function__ under no_grad, spelled out: every op on a volatile
        # tensor comes here (a module's forward makes dozens of calls), and the context
        # manager objects were half of the cost (benchmarks/bench_legacy_run.py).
        if not all(issubclass(cls, t) for t in types):
            return NotImplemented
        enabled = torch.is_grad_enabled()
        if enabled:
            _set_grad_enabled(False)
        try:
            with _compat.disable_torch_function_subclass():
                ret = func(*args, **(kwargs or {}))
        finally:
            if enabled:
                _set_grad_enabled(True)
        if func in _NOWRAP:
            return ret
        return _as_volatile(ret, args, kwargs)

    @property
    def data(self) -> torch.Tensor:
        """The plain tensor behind this one (no volatility), as 0.3's ``Variable.data``."""
        # torch's own .data of the tensor (a plain, detached, non-view tensor with its own
        # version counter), not an as_subclass alias: detach_() refuses aliases (views).
        with _compat.disable_torch_function_subclass():
            return _tensor_data.__get__(self)

    @data.setter
    def data(self, value: torch.Tensor) -> None:
        _tensor_data.__set__(self, value)

    def __format__(self, format_spec: str) -> str:
        # torch formats a 0-dim tensor as its number only when type(x) is Tensor.
        return self.as_subclass(_plain).__format__(format_spec)

    def __reduce_ex__(self, protocol: Any) -> Any:
        # Pickle the plain tensor: a file never needs safetorch (or an allowlist) to load.
        return self.as_subclass(_plain).__reduce_ex__(protocol)

    def __deepcopy__(self, memo: Dict[int, Any]) -> "VolatileTensor":
        # torch's default refuses subclasses whose new_empty() returns a plain tensor, so
        # torch's deepcopy of the plain tensor behind this one (storage sharing across the
        # memo, requires_grad, .grad) made volatile again. That plain tensor is a detached
        # leaf with this one's flags: an as_subclass alias of a tensor that requires grad is
        # a non-leaf, which torch refuses to deep-copy (and so it does for a non-leaf here).
        if id(self) not in memo:
            if self.is_leaf:
                plain = _make_subclass(_plain, self, self.requires_grad)
                plain.grad = self.grad
            else:
                plain = self.as_subclass(_plain)  # raises torch's own "graph leaves" error
            twin = copy.deepcopy(plain, memo)
            result = _make_subclass(VolatileTensor, twin, twin.requires_grad)
            result.grad = twin.grad
            if self.__dict__:
                result.__dict__ = copy.deepcopy(self.__dict__, memo)
            memo[id(self)] = result
        return memo[id(self)]

    @property
    def _is_param(self) -> bool:
        return False

    @_is_param.setter
    def _is_param(self, value: bool) -> None:
        # nn.Parameter(x) of a Tensor subclass returns x.detach().requires_grad_() flagged
        # with _is_param = True (torch/nn/parameter.py), which would leave a parameter whose
        # every op runs under no_grad: it would never train. A parameter is a new leaf,
        # not a result computed from x, so it becomes the plain Parameter that
        # nn.Parameter(x) of a plain x is (both made by _make_subclass: a detached leaf
        # sharing x's memory). 0.3's Parameter(Variable) raised; this never ran there.
        if value:
            object.__setattr__(self, "__class__", _Parameter)


def _as_volatile(ret: Any, args: Sequence[Any] = (), kwargs: Optional[Dict] = None) -> Any:
    """Tensor results (also inside tuples and lists) as volatile tensors, as
    ``Tensor.__torch_function__``'s ``_convert`` wraps them, but not as a differentiable view:
    ``as_subclass`` returns an alias, a view whose ``detach_()`` torch refuses ("Can't detach
    views in-place"), where the same result computed under ``torch.no_grad()`` is no view. A
    volatile result has no history, so it is made the detached tensor it is. A result that
    is one of the op's own arguments (an in-place target, ``out=``, ``x.to()`` of nothing to
    change) is no new tensor: it is returned as itself, as under ``torch.no_grad()``
    (``_convert`` would alias it, so ``m.weight += v`` would rebind a Parameter)."""
    if isinstance(ret, _plain):
        if isinstance(ret, VolatileTensor):
            return ret
        for arg in args:  # inlined: this runs for every result of every op
            if arg is ret:
                return ret
        if kwargs and _is_out(ret, kwargs):
            return ret
        return _make_subclass(VolatileTensor, ret)
    if isinstance(ret, (tuple, list)):
        # Also namedtuples of results (torch.return_types take one iterable)
        return type(ret)(_as_volatile(r, args, kwargs) for r in ret)
    return ret


def _is_out(ret: torch.Tensor, kwargs: Dict[str, Any]) -> bool:
    """Whether ``ret`` is a keyword argument or one of a tuple of them (``out=(v, i)``)."""
    for arg in kwargs.values():
        if arg is ret or (isinstance(arg, (tuple, list)) and any(a is ret for a in arg)):
            return True
    return False


def volatile(data: torch.Tensor) -> VolatileTensor:
    """``Variable(data, volatile=True)`` as its authors meant it: no graph from here on.

    Returns ``data`` (sharing memory, no history) as a :class:`VolatileTensor`: results
    of any torch operation on it (modules included) are computed under ``torch.no_grad()``
    and are volatile themselves, which is what ``volatile=True`` meant up to torch 0.3
    ("volatile is infectious"); :class:`VolatileTensor` lists what volatility does not
    reach (``.data``, numbers, arrays, formatting, saved files). The modern spelling is
    ``with torch.no_grad():``.

    Args:
        data: The tensor to wrap.

    Returns:
        The volatile tensor.

    Raises:
        TypeError: ``data`` is not a tensor.

    >>> import torch, safetorch as st
    >>> model = torch.nn.Linear(2, 1)
    >>> model(st.legacy.volatile(torch.ones(1, 2))).grad_fn is None
    True
    """
    if not isinstance(data, torch.Tensor):
        raise TypeError(f"volatile() expects a Tensor, got {type(data).__name__}")
    return _make_subclass(VolatileTensor, data)  # detached, sharing memory, not a view


# --- type(x) == Variable ---------------------------------------------------------------------
def is_variable_type(cls: Any) -> bool:
    """Whether ``type(x) == Variable`` meant "x is a Variable" for tensors of type ``cls``.

    Up to torch 0.3 ``type(h) == Variable`` told a Variable from a tuple of them (the word
    language model's ``repackage_hidden``); since 0.4 a tensor's type is ``torch.Tensor``
    and the test is False, so such code recurses into the tensor until it iterates a
    0-dim one. True for ``torch.Tensor`` and :class:`VolatileTensor` (a volatile
    ``Variable``); False for ``nn.Parameter`` (its own class in 0.3 as well) and other
    subclasses. ``st.patch("legacy")`` makes ``type(x) == Variable`` use it;
    ``isinstance(x, Variable)`` is True for every tensor in plain torch already. The modern
    spelling is ``isinstance(x, torch.Tensor)``.

    Args:
        cls: A class, usually ``type(x)``.

    Returns:
        Whether 0.3's ``type(x) == Variable`` would have been True.

    >>> import torch, safetorch as st
    >>> st.legacy.is_variable_type(torch.Tensor), st.legacy.is_variable_type(torch.nn.Parameter)
    (True, False)
    """
    return cls is _plain or cls is VolatileTensor or cls is LegacyScalar


# --- x[0] of a 0-dim tensor ------------------------------------------------------------------
_warned_lines: Set[Tuple[str, int]] = set()  # (file, line) of each call site warned about


def _warn_once_per_line(message: str) -> None:
    """A PatchWarning at the user's line, the first time that line gets here."""
    frame = user_frame()
    if frame is not None:
        line = (frame.f_code.co_filename, frame.f_lineno)
        if line in _warned_lines:
            return
        _warned_lines.add(line)
    warnings.warn(message, PatchWarning, stacklevel=user_stacklevel())


def _forget_warned_lines() -> None:
    """Warn again at every line (``st.patch("legacy")`` calls this when it turns on)."""
    _warned_lines.clear()


def zero_dim_index(x: torch.Tensor, index: Any) -> Any:
    """``x[index]``, where ``x[0]`` / ``x[-1]`` of a 0-dim tensor is its Python number.

    Up to torch 0.3 a loss was a one-element tensor and ``loss.data[0]`` its Python
    number; since 0.4 it is 0-dim, and ``[0]`` raises ``IndexError`` from 0.5 on. This
    returns ``x.item()`` for index ``0`` or ``-1`` of a 0-dim ``x`` of any class
    (``VolatileTensor``, user subclasses), so formatting, dict keys, ``json``,
    ``isinstance(v, float)`` and arithmetic see the number 0.3 gave. One exception keeps
    gradients: a 0-dim ``x`` that requires grad while grad mode is on gives ``x`` itself
    (an alias in the graph), as 0.3's ``Variable[0]`` gave a Variable and 0.4 an alias.
    A :class:`~safetorch.errors.PatchWarning` names each call site once. Every other
    ``x[index]`` is torch's own, including ``x[...]``, which returns a 0-dim view on every
    torch (and a tensor in 0.3): only calls that raise in plain torch change.

    Args:
        x: A tensor.
        index: The index.

    Returns:
        ``x.item()``, ``x`` (requires grad), or ``x[index]``.

    Raises:
        IndexError: ``x[index]`` raises (any other index of a 0-dim tensor, for one).

    >>> import torch, warnings, safetorch as st
    >>> with warnings.catch_warnings():
    ...     warnings.simplefilter("ignore")
    ...     st.legacy.zero_dim_index(torch.tensor(2.5), 0)
    2.5
    """
    if not (_first_or_last(index) and x.dim() == 0) or x.is_meta:
        return x[index]
    if x.requires_grad and torch.is_grad_enabled():
        _warn_once_per_line(
            "x[0] of a 0-dim tensor that requires grad returns the tensor itself (its "
            "graph kept, as torch 0.3's Variable[0] and 0.4 did); write x, or x.item() "
            "for the Python number (safetorch check --fix rewrites loss.data[0])"
        )
        return torch.ops.aten.alias(x)
    _warn_once_per_line(
        "x[0] of a 0-dim tensor (loss.data[0]) returns its Python number, as torch 0.3 "
        "did; write x.item() (safetorch check --fix rewrites it)"
    )
    return x.item()


# --- size_average / reduce -------------------------------------------------------------------
def reduction(size_average: Optional[bool] = None, reduce: Optional[bool] = None) -> str:
    """The ``reduction=`` string that legacy ``size_average=``/``reduce=`` arguments mean.

    ``None`` counts as ``True``; ``reduce=False`` wins (``"none"``), then
    ``size_average=False`` gives ``"sum"``, else ``"mean"`` (torch/nn/_reduction.py).

    >>> import safetorch as st
    >>> st.legacy.reduction(size_average=False), st.legacy.reduction(reduce=False)
    ('sum', 'none')
    """
    if size_average is None:
        size_average = True
    if reduce is None:
        reduce = True
    if size_average and reduce:
        return "mean"
    return "sum" if reduce else "none"


# --- binary_cross_entropy: a target of input's size in another shape -------------------------
# torch's function, bound before any patch wraps it (the patch's handler calls this module).
_F_bce: Any = getattr(
    torch.nn.functional.binary_cross_entropy,
    "__wrapped__",
    torch.nn.functional.binary_cross_entropy,
)


def bce_legacy_operands(
    input: Any, target: Any, weight: Any
) -> Optional[Tuple[torch.Tensor, Optional[torch.Tensor]]]:
    """``(target, weight)`` in ``input``'s shape, paired element by element as torch 0.2-1.6
    paired them, where the target has ``input``'s number of elements in another shape;
    ``None`` where torch's own call decides (same shape, another size, not tensors)."""
    if not (isinstance(input, torch.Tensor) and isinstance(target, torch.Tensor)):
        return None
    if target.shape == input.shape or target.numel() != input.numel():
        return None
    if weight is not None:
        if not isinstance(weight, torch.Tensor):
            return None
        # 0.3-1.6: weight.expand(_infer_size(target.size(), weight.size())), then element by
        # element with the input, as the target
        try:
            weight = weight.expand(torch.broadcast_shapes(target.shape, weight.shape))
        except RuntimeError:
            return None
        if weight.numel() != input.numel():
            return None
        weight = weight.reshape(input.shape)
    return target.reshape(input.shape), weight


def binary_cross_entropy(
    input: torch.Tensor,
    target: torch.Tensor,
    weight: Optional[torch.Tensor] = None,
    size_average: Optional[bool] = None,
    reduce: Optional[bool] = None,
    reduction: str = "mean",
) -> torch.Tensor:
    """``F.binary_cross_entropy`` (``nn.BCELoss``) as torch 0.2-1.6 computed it for a target
    of another shape: element by element, in order.

    A discriminator's ``(N,)`` output (``.view(-1)``, ``.squeeze()``) against a target built
    as ``torch.ones(N, 1)`` had the input's number of elements in another shape: torch 0.2
    warned that this "is deprecated" and paired the elements in order (THNN's
    ``BCECriterion`` iterated both tensors element by element; a ``weight`` was first
    expanded to the target's shape), and from torch 1.7 (pytorch#41426) it raises
    ``ValueError``. Here such a target (and weight) is reshaped to ``input``'s shape, which
    gives that result, its gradient, and with ``reduction="none"`` the input's shape, as
    before. A :class:`~safetorch.errors.PatchWarning` names each call site once. Every other
    call is torch's own: the same shape, and a target of another number of elements (torch's
    error). The modern spelling is ``target.view_as(input)``.

    Args:
        input: Probabilities.
        target: Labels, of ``input``'s shape or its number of elements.
        weight: Optional rescaling weight, broadcast against the target's shape.
        size_average: Legacy reduction argument (torch's own handling).
        reduce: Legacy reduction argument (torch's own handling).
        reduction: ``"mean"``, ``"sum"`` or ``"none"``.

    Returns:
        The loss.

    Raises:
        ValueError: The target's number of elements differs from the input's (torch's error).

    >>> import torch, warnings, safetorch as st
    >>> with warnings.catch_warnings():
    ...     warnings.simplefilter("ignore")
    ...     st.legacy.binary_cross_entropy(torch.full((2,), 0.5), torch.ones(2, 1), reduction="sum")
    tensor(1.3863)
    """
    operands = bce_legacy_operands(input, target, weight)
    if operands is not None:
        _warn_once_per_line(
            f"binary_cross_entropy of a target of size {tuple(target.shape)} against an input "
            f"of size {tuple(input.shape)} pairs their elements in order, as torch 0.2-1.6 did "
            "(an error from torch 1.7); write target.view_as(input)"
        )
        target, weight = operands
    return _F_bce(input, target, weight, size_average, reduce, reduction)
