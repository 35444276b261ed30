"""Patch ``legacy``: APIs newer torch removed or changed -> their old meaning in st.legacy.

Each shim fills a gap only where ``_compat`` reports one on the running torch (a torch that
still has a working ``torch.solve`` keeps it): ``torch._six`` (a module installed while the
patch is on), ``torch.solve/lstsq/eig/symeig/matrix_rank`` and their Tensor methods, a legacy
autograd Function called as ``Fn()(x)``, ``Variable(x, volatile=True)``, ``type(x) ==
Variable`` (through ``VariableMeta.__eq__``), ``x[0]`` / ``x[-1]`` of a 0-dim tensor (a handler
of ``Tensor.__getitem__``, whose one wrapper the registry shares with the ``index`` patch),
the ``size_average=``/``reduce=`` loss arguments (mapped without the warning),
``backward(retain_variables=)`` (0.2's name for ``retain_graph``, removed in 0.4) and a
``binary_cross_entropy`` / ``nn.BCELoss`` target of the input's number of elements in another
shape (paired element by element up to 1.6, an error from 1.7: project code only). Every
changed call is recorded with its modern spelling, which ``safetorch check --fix`` writes.

While the patch is on, a child made by ``os.fork()`` (``torch.multiprocessing``'s default on
Linux: Hogwild training, fork-started workers) runs with one intra-op thread, torch's own
remedy for the fork-after-OpenMP deadlock (its DataLoader workers do the same), unless
``OMP_NUM_THREADS`` or ``MKL_NUM_THREADS`` is set or the program called
``torch.set_num_threads`` while the patch was on.

Off in ``st.patch()`` unless named (or ``"all"``); on in ``safetorch run``.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any, Callable, Dict, List, Tuple

import torch

from safetorch import _compat, _legacy_values, _stack
from safetorch import legacy as _impl

# _index as a module, not its name: importing _index first imports the registry, which
# imports this declaration while _index is half-initialised (test_patch_torch_free_run)
from safetorch.patching import _attribution, _index
from safetorch.patching._attribution import (
    called_from_03_project,
    called_from_project,
    called_through_torch_from_project,
)
from safetorch.patching._registry import Patch, Target, declare
from safetorch.patching._report import call_site, record
from safetorch.patching._routing import WrapperFn

__all__: List[str] = []

_NAME = "legacy"

# torch function -> (safetorch implementation, modern spelling)
_LINALG: Dict[str, Tuple[Callable[..., Any], str]] = {
    "solve": (_impl.solve, "torch.linalg.solve(A, B) (arguments swapped)"),
    "lstsq": (_impl.lstsq, "torch.linalg.lstsq(A, B).solution"),
    "eig": (_impl.eig, "torch.linalg.eig(A) (complex results)"),
    "symeig": (_impl.symeig, "torch.linalg.eigh / eigvalsh(A, UPLO='U')"),
    "matrix_rank": (
        _impl.matrix_rank,
        "torch.linalg.matrix_rank(A, atol=tol, rtol=0, hermitian=symmetric)",
    ),
}

# Which shims are needed on this torch; rebound when tests simulate another torch. On every
# supported torch (>= 1.13) solve/lstsq/eig/matrix_rank are gone, legacy Functions and x[0] of a
# 0-dim tensor raise, volatile= is a no-op and size_average=/reduce= still map through
# legacy_get_string: only torch._six (gone in 2.0) and symeig (a stub from 2.0) vary.
_needed: Dict[str, bool] = dict.fromkeys(
    (
        *("solve", "lstsq", "eig", "matrix_rank", "function", "volatile", "variable_type"),
        *("index", "reduction", "scalar_key", "numpy_scalar", "int_division", "view"),
        "retain_variables",
        "bce_target_size",
    ),
    True,
)


@_compat.register_binder
def _bind() -> None:
    _needed["symeig"] = not _compat.HAS_TORCH_SYMEIG
    _needed["_six"] = not _compat.HAS_TORCH_SIX


def _record(kind: str, detail: str) -> None:
    """Record one shimmed call under its own call site, so the report lists every site to
    migrate (``safetorch check --fix`` rewrites them) rather than only the first one."""
    site = call_site(2)
    path, _, line = site.rpartition(":")
    record(_NAME, f"{kind}  [{os.path.basename(path)}:{line}]", detail)


def _linalg(name: str, method: bool) -> WrapperFn:
    impl, modern = _LINALG[name]
    kind = f"{'x.' if method else 'torch.'}{name} -> {modern}"

    def wrapper(wrapped: Any, instance: Any, args: Tuple[Any, ...], kwargs: Dict) -> Any:
        if not _needed[name]:
            return wrapped(*args, **kwargs)
        _record(kind, f"st.legacy.{name}: torch 1.x semantics")
        if instance is not None:
            args = (instance, *args)
        return impl(*args, **kwargs)

    return wrapper


def _function_call(wrapped: Any, instance: Any, args: Tuple[Any, ...], kwargs: Dict) -> Any:
    if not _needed["function"] or kwargs or not _impl.is_legacy_function(instance):
        return wrapped(*args, **kwargs)
    _record(
        "LegacyFn()(x) -> new-style Function (static forward(ctx, ...), called as Fn.apply(x))",
        "st.legacy.legacy_function",
    )
    return _impl.legacy_function(instance, *args)


def _function_init(wrapped: Any, instance: Any, args: Tuple[Any, ...], kwargs: Dict) -> Any:
    # torch warns that Function instances are deprecated; a legacy Function must be one.
    if _needed["function"] and _impl.is_legacy_function(instance):
        return None
    return wrapped(*args, **kwargs)


def _variable(wrapped: Any, instance: Any, args: Tuple[Any, ...], kwargs: Dict) -> Any:
    volatile = kwargs.get("volatile", args[2] if len(args) > 2 else False)
    if not (_needed["volatile"] and volatile):
        return wrapped(*args, **kwargs)
    data = args[0] if args else kwargs.get("data")
    _record("Variable(x, volatile=True) -> with torch.no_grad():", "st.legacy.volatile")
    return _impl.volatile(data)  # type: ignore[arg-type]  # torch's own error for None


def _zero_dim(x: Any, args: Tuple[Any, ...]) -> Any:
    # Called only after torch (or the index patch's check) raised IndexError: `x[...]` and
    # other indices that work in plain torch never get here.
    if len(args) != 1 or not _impl._first_or_last(args[0]) or x.dim() != 0 or x.is_meta:
        return _UNHANDLED
    _record("x[0] of a 0-dim tensor -> x.item()", "st.legacy.zero_dim_index")
    return _impl.zero_dim_index(x, args[0])


_UNHANDLED = object()


def _after_index_error(instance: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
    """Called from an ``except IndexError`` block: the legacy result, or the error re-raised."""
    if kwargs or not _needed["index"]:
        raise  # the IndexError being handled by the caller
    result = _zero_dim(instance, args)
    if result is _UNHANDLED:
        raise
    return result


def _int_index(index: Any) -> bool:
    """An index of ints only (``x[i]``, ``x[i, j]``): one element, a number in 0.3."""
    if type(index) is int:
        return True
    return type(index) is tuple and all(type(i) is int for i in index)


def _scalar_of_03(result: Any, args: Tuple[Any, ...]) -> Any:
    """``x[i]`` down to one element, called from 0.3-era project code: a LegacyScalar, which
    hashes as the number 0.3 gave (``index2word[topi[0][0]]``). Cheapest tests first: a
    modern caller pays them only for an int index whose result is a 0-dim plain tensor."""
    if (
        type(result) is _Tensor
        and len(args) == 1
        and _int_index(args[0])
        and result.dim() == 0
        and _needed["scalar_key"]
        and called_from_03_project()
    ):
        return _impl.legacy_scalar(result)
    return result


# x[0] of a 0-dim tensor (of any class: a subclass's __torch_function__ re-enters the wrapper).
# Indexing that succeeds pays nothing here: a `try` costs nothing in CPython >= 3.11 until
# something raises.
def _getitem(wrapped: Any, instance: Any, args: Tuple[Any, ...], kwargs: Dict) -> Any:
    try:
        result = _index.torch_getitem(wrapped, args, kwargs)
    except IndexError:
        return _after_index_error(instance, args, kwargs)
    return _scalar_of_03(result, args)


def _getitem_around(inner: WrapperFn) -> WrapperFn:
    """The same around the ``index`` patch's handler: it also sees the IndexError of a
    checked index (a 0-dim tensor on CUDA)."""

    def getitem(wrapped: Any, instance: Any, args: Tuple[Any, ...], kwargs: Dict) -> Any:
        try:
            result = inner(wrapped, instance, args, kwargs)
        except IndexError:
            return _after_index_error(instance, args, kwargs)
        return _scalar_of_03(result, args)

    return getitem


_Tensor = torch.Tensor


def _used_the_03_way(kind: str) -> None:
    """A LegacyScalar hashed, a ScalarArray indexed with [0]: the report's entry."""
    if kind == "hash":
        _record(
            "x[i] (0-dim) as a dict key or set member, hashed as 0.3's number -> x[i].item()",
            "st.legacy.LegacyScalar",
        )
    else:
        _record("x.numpy()[0] of a 0-dim tensor -> x.item()", "st.legacy.ScalarArray")


# --- integer division: 0.3 truncated (legacy project code only) ------------------------------
def _division(in_place: bool) -> WrapperFn:
    impl = _impl.div_ if in_place else _impl.div
    spelling = "a //= b" if in_place else "a // b"
    kind = (
        f"integer tensor {'/=' if in_place else '/'} integer (0.3 truncated) -> "
        f"torch.div(a, b, rounding_mode='trunc') ({spelling} for non-negative values)"
    )

    def wrapper(wrapped: Any, instance: Any, args: Tuple[Any, ...], kwargs: Dict) -> Any:
        if kwargs or len(args) != (1 if instance is not None else 2):
            return wrapped(*args, **kwargs)  # rounding_mode= or out= given: said explicitly
        a, b = (instance, args[0]) if instance is not None else args
        if not (_truncates(a, b) and _needed["int_division"] and called_from_03_project()):
            return wrapped(*args, **kwargs)
        _record(kind, f"st.legacy.{'div_' if in_place else 'div'}")
        return impl(a, b)

    return wrapper


_truncates = _legacy_values.truncates


# --- .numpy() of a 0-dim tensor: an array that takes [0] -------------------------------------
def _numpy(wrapped: Any, instance: Any, args: Tuple[Any, ...], kwargs: Dict) -> Any:
    array = wrapped(*args, **kwargs)
    if array.ndim == 0 and _needed["numpy_scalar"] and called_from_project():
        return array.view(_impl.ScalarArray)  # what st.legacy.numpy returns, without a copy
    return array


# --- view of transposed strides: reshape where view raises ----------------------------------
def _view(wrapped: Any, instance: Any, args: Tuple[Any, ...], kwargs: Dict) -> Any:
    try:
        return wrapped(*args, **kwargs)
    except RuntimeError as error:
        if (
            kwargs
            or instance is None
            or not _legacy_values.view_error(error)
            or not _needed["view"]
            or not called_from_project()
        ):
            raise
    _record(
        "x.view(...) of a result with its inputs' strides (0.3: contiguous) -> x.reshape(...)",
        "st.legacy.view: a copy, as 0.3's contiguous result was",
    )
    return _impl.view(instance, *args)


# The class `type(x) == Variable` compares with (the module attribute is shadowed by the
# function torch.autograd.variable, hence sys.modules).
_VARIABLE = sys.modules["torch.autograd.variable"].Variable
_VARIABLE = getattr(_VARIABLE, "__wrapped__", _VARIABLE)


def _variable_eq(wrapped: Any, instance: Any, args: Tuple[Any, ...], kwargs: Dict) -> Any:
    # VariableMeta.__eq__: `type(h) == Variable` reaches it as the reflected comparison,
    # since type.__eq__(torch.Tensor, Variable) is NotImplemented. Hashes stay as they are.
    if (
        _needed["variable_type"]
        and instance is _VARIABLE
        and len(args) == 1
        and not kwargs
        and _impl.is_variable_type(args[0])
    ):
        _record("type(x) == Variable -> isinstance(x, torch.Tensor)", "st.legacy.is_variable_type")
        return True
    return wrapped(*args, **kwargs)


def _reduction(wrapped: Any, instance: Any, args: Tuple[Any, ...], kwargs: Dict) -> Any:
    if not _needed["reduction"]:
        return wrapped(*args, **kwargs)
    size_average = args[0] if args else kwargs.get("size_average")
    reduce = args[1] if len(args) > 1 else kwargs.get("reduce")
    result = _impl.reduction(size_average, reduce)
    _record(f"size_average=/reduce= -> reduction={result!r}", "no warning")
    return result


# --- backward(retain_variables=): 0.2 renamed it retain_graph, 0.4 removed the old name -----
def _backward(position: int) -> WrapperFn:
    """``x.backward(g, retain_variables=True)`` / ``torch.autograd.backward(...)``: the old
    keyword passed on as ``retain_graph`` (``position``: where ``retain_graph`` sits among the
    positional arguments, so a positional one is not given twice)."""

    def wrapper(wrapped: Any, instance: Any, args: Tuple[Any, ...], kwargs: Dict) -> Any:
        if "retain_variables" not in kwargs or not _needed["retain_variables"]:
            return wrapped(*args, **kwargs)
        if "retain_graph" in kwargs or len(args) > position:
            return wrapped(*args, **kwargs)  # both given: torch's own error
        kwargs = dict(kwargs)
        kwargs["retain_graph"] = kwargs.pop("retain_variables")
        _record(
            "backward(retain_variables=...) -> backward(retain_graph=...)",
            "renamed in 0.2, removed in 0.4",
        )
        return wrapped(*args, **kwargs)

    return wrapper


# --- binary_cross_entropy: a target of input's size in another shape ------------------------
_BCE_SIZE_ERROR = "that is different to the input size"


def _bce_operands(args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Tuple[Any, Any, Any]:
    """``input``, ``target``, ``weight`` of a ``binary_cross_entropy`` call."""
    named = dict(zip(("input", "target", "weight"), args))
    for name in ("input", "target", "weight"):
        if name in kwargs:
            named[name] = kwargs[name]
    return named.get("input"), named.get("target"), named.get("weight")


def _binary_cross_entropy(wrapped: Any, instance: Any, args: Tuple[Any, ...], kwargs: Dict) -> Any:
    # nn.BCELoss.forward calls F.binary_cross_entropy: torch's frames are skipped to find the
    # caller, so the module called from the project's code counts as the project's call.
    try:
        return wrapped(*args, **kwargs)
    except ValueError as error:
        if (
            _BCE_SIZE_ERROR not in str(error)
            or not _needed["bce_target_size"]
            or _impl.bce_legacy_operands(*_bce_operands(args, kwargs)) is None
            or not called_through_torch_from_project()
        ):
            raise
    _record(
        "binary_cross_entropy / BCELoss of a target of input's size in another shape "
        "(0.2-1.6: element by element) -> target.view_as(input)",
        "st.legacy.binary_cross_entropy",
    )
    return _impl.binary_cross_entropy(*args, **kwargs)


# --- torch._six: a module, installed while the patch is on -----------------------------------
class _SixModule(type(sys)):  # type: ignore[misc]  # type(sys) is ModuleType, a valid base mypy cannot see through type()
    """``torch._six`` whose attribute reads are recorded with their modern spelling."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name not in _impl.SIX_MODERN:
            raise AttributeError(f"module 'torch._six' has no attribute {name!r}")
        _record(f"torch._six.{name} -> {_impl.SIX_MODERN[name]}", "st.legacy.six")
        return getattr(_impl.six, name)


_six_module = _SixModule("torch._six", _impl.six.__doc__)


_filled: List[str] = []  # names added to a real torch._six that lacked them (torch 1.9-1.13)


def _install_six() -> None:
    if not _needed["_six"]:
        # torch < 2.0 still has torch._six, but 1.9+ dropped names old code imports
        # (container_abcs, int_classes): fill only those gaps, on the real module.
        real = importlib.import_module("torch._six")
        for name in _impl.SIX_MODERN:
            if name not in vars(real):
                setattr(real, name, getattr(_impl.six, name))
                _filled.append(name)
        return
    if "torch._six" in sys.modules:
        return
    sys.modules["torch._six"] = _six_module
    torch._six = _six_module  # type: ignore[attr-defined]  # `import torch._six` reads it


def _remove_six() -> None:
    if _filled:
        real = sys.modules.get("torch._six")
        for name in _filled:
            if real is not None and name in vars(real):
                delattr(real, name)
        _filled.clear()
    if sys.modules.get("torch._six") is _six_module:
        del sys.modules["torch._six"]
    if vars(torch).get("_six") is _six_module:
        del torch._six  # type: ignore[attr-defined]  # the attribute the patch set; torch's stubs do not declare it


# --- fork children: one intra-op thread ------------------------------------------------------
# A child forked after the parent ran an OpenMP parallel region (a Conv2d, a matmul) inherits
# a thread pool whose threads do not exist in it, and its first parallel region deadlocks
# (GNU libgomp). torch's DataLoader workers call torch.set_num_threads(1) first; fork
# children of a patched process do the same unless the user chose a thread count: the
# environment variables torch reads (OMP_NUM_THREADS, MKL_NUM_THREADS), or a
# torch.set_num_threads call from outside torch made while the patch is on (calls made before
# it are not seen).
_THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
_set_num_threads = getattr(torch.set_num_threads, "__wrapped__", torch.set_num_threads)
_fork_guard = {"armed": False, "user_threads": False}
_fork_hook_registered = False


def _one_thread_in_fork_child() -> None:
    """os.register_at_fork(after_in_child=...) hook: inert unless the patch is on."""
    if not _fork_guard["armed"] or _fork_guard["user_threads"]:
        return
    if any(os.environ.get(name) for name in _THREAD_ENV):
        return
    _set_num_threads(1)


def _user_set_threads(wrapped: Any, instance: Any, args: Tuple[Any, ...], kwargs: Dict) -> Any:
    # torch's own calls are not the program's choice: the DataLoader's pin-memory thread
    # calls torch.set_num_threads(1) in this process.
    if not sys._getframe(1).f_code.co_filename.startswith(_stack.TORCH_DIR):
        _fork_guard["user_threads"] = True  # children keep what the program chose
    return wrapped(*args, **kwargs)


def _arm_fork_guard() -> None:
    global _fork_hook_registered
    _fork_guard["user_threads"] = False
    _fork_guard["armed"] = True
    if not _fork_hook_registered and hasattr(os, "register_at_fork"):  # POSIX only
        # Registered once: fork hooks cannot be removed, so unpatching disarms it instead.
        os.register_at_fork(after_in_child=_one_thread_in_fork_child)
        _fork_hook_registered = True


def _on_enable() -> None:
    _install_six()
    _impl._forget_warned_lines()  # each patched session names each x[0] line once
    _arm_fork_guard()
    _attribution._forget_project()  # which files are the project's: decided anew
    if _used_the_03_way not in _legacy_values._listeners:
        _legacy_values._listeners.append(_used_the_03_way)


def _on_disable() -> None:
    _fork_guard["armed"] = False
    _remove_six()
    if _used_the_03_way in _legacy_values._listeners:
        _legacy_values._listeners.remove(_used_the_03_way)


PATCH = declare(
    Patch(
        name=_NAME,
        targets=(
            *(Target("torch", n, _linalg(n, method=False)) for n in _LINALG),
            *(
                Target("torch", f"Tensor.{n}", _linalg(n, method=True))
                for n in ("solve", "lstsq", "eig", "symeig")
            ),
            Target("torch.autograd.function", "Function.__call__", _function_call),
            Target("torch.autograd.function", "Function.__init__", _function_init),
            Target("torch.autograd", "Variable", _variable),
            Target("torch.autograd.variable", "Variable", _variable),
            Target(
                "torch.autograd.variable",
                "VariableMeta.__eq__",
                _variable_eq,
                attribute_warnings=False,
            ),
            Target("torch", "set_num_threads", _user_set_threads, attribute_warnings=False),
            Target("torch.nn._reduction", "legacy_get_string", _reduction),
            # retain_graph is the 2nd positional argument of Tensor.backward(gradient, ...),
            # the 3rd of torch.autograd.backward(tensors, grad_tensors, ...)
            Target("torch", "Tensor.backward", _backward(1)),
            Target("torch.autograd", "backward", _backward(2)),
            Target(
                "torch",
                "Tensor.__getitem__",
                _getitem,
                attribute_warnings=False,
                around=_getitem_around,
            ),
            # Hot paths: no warning re-attribution (torch warns for none of these calls).
            *(
                Target("torch", path, _division(in_place), attribute_warnings=False)
                for path, in_place in (
                    ("Tensor.__truediv__", False),
                    ("Tensor.div", False),
                    ("div", False),
                    ("Tensor.__itruediv__", True),
                    ("Tensor.div_", True),
                )
            ),
            Target("torch", "Tensor.numpy", _numpy, attribute_warnings=False),
            Target("torch", "Tensor.view", _view, attribute_warnings=False),
            Target("torch.nn.functional", "binary_cross_entropy", _binary_cross_entropy),
        ),
        on_enable=_on_enable,
        on_disable=_on_disable,
    )
)
