"""0.3-era values on modern torch: scalars that hash as numbers, truncating integer division,
NumPy scalars that take ``[0]``, ``view`` of a result old torch returned contiguous.

Public through :mod:`safetorch.legacy` (``st.legacy.LegacyScalar``, ``st.legacy.div``, ...);
the ``legacy`` patch routes the old spellings here, for the legacy project's own files only
(``safetorch.patching._attribution`` decides which code that is). Semantics come from torch's
own record of what changed: ``python_variable_indexing.cpp`` of 0.4 (a 1-D tensor's ``x[i]``
became a 0-dim tensor, 0.3's Python number before), TorchScript's operator upgraders for
files of format version <= 3 (``div_Tensor_0_3``, ``div_Scalar_0_3`` in torch's
``upgraders_entry.cpp``: integer division truncated, as ``rounding_mode="trunc"``; pytorch#34570
deprecated it in 1.5, #38620 made it an error in 1.6, true division from 1.7), and 0.3's TH
kernels, which wrote every elementwise result into a fresh contiguous tensor.
"""

from __future__ import annotations

import operator
from typing import Any, Callable, Dict, List

import torch

try:
    import numpy as np
except ImportError:  # torch runs without NumPy; no tensor has a .numpy() to shim then
    np = None  # type: ignore[assignment]  # only read where NumPy exists

__all__ = ["LegacyScalar", "legacy_scalar", "div", "div_", "ScalarArray", "numpy", "view"]

_plain = torch.Tensor
# torch's own methods, bound before any patch wraps them (the patch's handlers call these
# functions, which must not re-enter the handlers).
_tensor_numpy: Any = getattr(_plain.numpy, "__wrapped__", _plain.numpy)
_tensor_view: Any = getattr(_plain.view, "__wrapped__", _plain.view)

# Listeners told when a legacy value is used the 0.3 way (the patch records the call site).
_listeners: List[Callable[[str], None]] = []


def _used(kind: str) -> None:
    for listener in _listeners:
        listener(kind)


def _first_or_last(index: Any) -> bool:
    """``index`` is the integer 0 or -1 (an int or NumPy integer; not a bool or tensor)."""
    if type(index) is int:
        return index == 0 or index == -1
    if isinstance(index, (bool, torch.Tensor)):
        return False
    try:
        value = operator.index(index)
    except TypeError:
        return False
    return value == 0 or value == -1


# --- a 0-dim tensor that hashes as its number ------------------------------------------------
class LegacyScalar(torch.Tensor):
    """A 0-dim tensor that hashes as its Python number, as 0.3's ``x[i]`` (a number) did.

    Up to torch 0.3 indexing a 1-D tensor down to one element gave a Python number, so an
    index found with ``topi[0][0]`` looked words up in a dict (``index2word[ni]``); since
    0.4 it is a 0-dim tensor, which hashes by identity, and the lookup raises ``KeyError``.
    A ``LegacyScalar`` is that 0-dim tensor (the same view, the same graph) with
    ``hash(x) == hash(x.item())``; equality is a tensor's own (``x == 3`` is a 0-dim bool
    tensor whose truth is the comparison), so dict keys, sets and ``in`` work as with the
    number. Everything else is a plain tensor's: results of operations on it are plain
    tensors (no ``__torch_function__``), formatting is a plain 0-dim tensor's (its number's),
    and it pickles as a plain tensor. A key whose tensor is changed in place after it was
    inserted is lost, as with any mutable key.

    >>> import torch, safetorch as st
    >>> ni = st.legacy.legacy_scalar(torch.tensor([4, 7])[1])
    >>> {7: "dog"}[ni], type(ni + 1).__name__
    ('dog', 'Tensor')
    """

    __torch_function__ = torch._C._disabled_torch_function_impl  # type: ignore[assignment]  # torch's own opt-out (nn.Parameter's)

    def __hash__(self) -> int:
        _used("hash")
        return hash(self.item())

    def __format__(self, format_spec: str) -> str:
        # torch formats a 0-dim tensor as its number only when type(x) is Tensor.
        return self.as_subclass(_plain).__format__(format_spec)

    def __repr__(self) -> str:  # type: ignore[override]  # Tensor's takes a private keyword
        return repr(self.as_subclass(_plain))

    def __reduce_ex__(self, protocol: Any) -> Any:
        # Pickle the plain tensor: a file never needs safetorch (or an allowlist) to load.
        return self.as_subclass(_plain).__reduce_ex__(protocol)

    def __deepcopy__(self, memo: Dict[int, Any]) -> "LegacyScalar":
        if id(self) not in memo:
            memo[id(self)] = self.as_subclass(_plain).__deepcopy__(memo).as_subclass(LegacyScalar)
        return memo[id(self)]


def legacy_scalar(x: torch.Tensor) -> torch.Tensor:
    """The 0-dim tensor ``x`` as a :class:`LegacyScalar` (a view: same data, same graph).

    Args:
        x: A 0-dim tensor; any other tensor is returned unchanged.

    Returns:
        The ``LegacyScalar``, or ``x``.

    >>> import torch, safetorch as st
    >>> hash(st.legacy.legacy_scalar(torch.tensor(3)))
    3
    """
    if x.dim() != 0:
        return x
    return x.as_subclass(LegacyScalar)


# --- integer division ------------------------------------------------------------------------
_INTEGER_DTYPES = frozenset({torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64})


def _integer_number(value: Any) -> bool:
    """A Python or NumPy integer (``bool`` included: 0.3 took it as 0 or 1)."""
    return type(value) is int or (
        not isinstance(value, (float, complex, torch.Tensor)) and hasattr(type(value), "__index__")
    )


def truncates(input: Any, other: Any) -> bool:
    """Whether torch 0.3's ``input / other`` truncated: an integer tensor of one or more
    dimensions divided by an integer (a number or an integer tensor).

    A 0-dim integer tensor stands for what was a Python number in 0.3 (``correct.sum()``,
    ``x[i]``), which Python 3 divides truly: it keeps torch's true division.
    """
    if not isinstance(input, torch.Tensor):
        return False
    if input.dtype not in _INTEGER_DTYPES or input.dim() == 0:
        return False
    if isinstance(other, torch.Tensor):
        return other.dtype in _INTEGER_DTYPES
    return _integer_number(other)


def div(input: torch.Tensor, other: Any) -> torch.Tensor:
    """``input / other`` as torch 0.3 computed it: integer division truncates.

    An integer tensor (of one or more dimensions) divided by an integer or an integer tensor
    gives ``torch.div(input, other, rounding_mode="trunc")`` in ``input``'s integer type:
    what TorchScript's upgraders give files of torch <= 1.5 (``div_Tensor_0_3``). torch 1.5
    deprecated it, 1.6 raised, 1.7 divides truly (a float result), which turns a beam
    search's ``best_id / n_words`` into float indices. Every other division is torch's own
    ``input / other``: floats, a 0-dim dividend (0.3's Python number), a float divisor.

    Args:
        input: The dividend.
        other: The divisor.

    Returns:
        The quotient.

    >>> import torch, safetorch as st
    >>> st.legacy.div(torch.tensor([7, -7]), 2), st.legacy.div(torch.tensor([7.0]), 2)
    (tensor([ 3, -3]), tensor([3.5000]))
    """
    if truncates(input, other):
        return torch.div(input, other, rounding_mode="trunc")
    return input / other


def div_(input: torch.Tensor, other: Any) -> torch.Tensor:
    """``input /= other`` as torch 0.3 computed it: in place, truncating integer division.

    Plain torch >= 1.7 refuses ``long_tensor /= 2`` (the float result cannot be written into
    an integer tensor); torch 0.3 truncated, as :func:`div` does.

    Args:
        input: The tensor to divide in place.
        other: The divisor.

    Returns:
        ``input``.

    >>> import torch, safetorch as st
    >>> st.legacy.div_(torch.tensor([9, 4]), 4)
    tensor([2, 1])
    """
    if truncates(input, other):
        return input.div_(other, rounding_mode="trunc")
    return input.div_(other)


# --- .numpy()[0] of a 0-dim tensor -----------------------------------------------------------
_NDARRAY: Any = np.ndarray if np is not None else object


class ScalarArray(_NDARRAY):
    """A 0-d NumPy array that also takes ``[0]`` and ``[-1]``, as 0.3's one-element array did.

    ``loss.data.numpy()[0]`` was the loss as a NumPy scalar while losses were one-element
    tensors; since 0.4 ``.numpy()`` of a 0-dim tensor is a 0-d array and ``[0]`` raises
    ``IndexError: too many indices``. This array (a view of the same memory) gives the
    scalar (``a[()]``) for index 0 or -1; every other index, every operation, ``str``,
    ``repr`` and pickling are a plain 0-d array's.

    >>> import torch, safetorch as st
    >>> loss = st.legacy.numpy(torch.tensor(1.5))[0]  # a NumPy scalar, as 0.3 gave
    >>> type(loss).__name__, float(loss)
    ('float32', 1.5)
    """

    def __getitem__(self, index: Any) -> Any:
        if self.ndim == 0 and _first_or_last(index):
            _used("numpy")
            return self.view(np.ndarray)[()]
        return super().__getitem__(index)

    def __repr__(self) -> str:
        return repr(self.view(np.ndarray))

    def __reduce_ex__(self, protocol: Any) -> Any:
        return self.view(np.ndarray).__reduce_ex__(protocol)


def numpy(x: torch.Tensor, **kwargs: Any) -> Any:
    """``x.numpy()``, where the 0-d array of a 0-dim tensor is a :class:`ScalarArray`.

    Args:
        x: A tensor.
        **kwargs: ``Tensor.numpy``'s own (``force=``).

    Returns:
        The array (sharing memory with ``x``, as ``Tensor.numpy`` does).

    >>> import torch, safetorch as st
    >>> float(st.legacy.numpy(torch.tensor(2.0))[-1]), st.legacy.numpy(torch.ones(2)).shape
    (2.0, (2,))
    """
    array = _tensor_numpy(x, **kwargs)
    if array.ndim == 0:
        return array.view(ScalarArray)
    return array


# --- view of a result that 0.3 returned contiguous -------------------------------------------
_STRIDE_ERROR = "view size is not compatible with input tensor's size and stride"


def view_error(error: BaseException) -> bool:
    """Whether ``error`` is ``Tensor.view``'s refusal of the tensor's strides."""
    return isinstance(error, RuntimeError) and _STRIDE_ERROR in str(error)


def view(x: torch.Tensor, *shape: Any) -> torch.Tensor:
    """``x.view(*shape)``, or ``x.reshape(*shape)`` where the strides make ``view`` raise.

    torch 0.3 wrote the result of every elementwise operation into a new contiguous tensor,
    so ``(a.t() * b.t()).view(-1)`` worked; torch now gives the result its inputs' memory
    layout (transposed strides), and ``view`` raises "view size is not compatible with input
    tensor's size and stride". Only that call changes: it gets ``reshape``'s result, a copy
    (as 0.3's contiguous temporary was one); every ``view`` that works is torch's own.

    Args:
        x: A tensor.
        *shape: ``view``'s arguments (sizes, or one ``torch.Size``/tuple).

    Returns:
        The view, or the reshaped copy.

    Raises:
        RuntimeError: ``view`` fails for another reason (a size that does not fit).

    >>> import torch, safetorch as st
    >>> st.legacy.view(torch.arange(6).reshape(2, 3).t() * 1, -1)
    tensor([0, 3, 1, 4, 2, 5])
    """
    try:
        return _tensor_view(x, *shape)
    except RuntimeError as error:
        if not view_error(error):
            raise
    return x.reshape(*shape)
