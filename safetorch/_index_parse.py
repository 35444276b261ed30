"""``x[index]`` taken apart as torch does, and the errors CPU torch would raise for it.

Private to :mod:`safetorch.tensor`: the parser of every index form ``x[...]`` accepts (ints,
slices, None, Ellipsis, bool masks, integer tensors and lists), the messages of range errors,
and the CPU stand-in that makes a checked call raise CPU torch's own error, word for word.
"""

from __future__ import annotations

from typing import Any, List, Literal, Optional, Tuple, get_args

import torch

from safetorch import _compat
from safetorch.errors import DeviceMismatchError, IndexOutOfBoundsError

__all__: List[str] = []  # private: safetorch.tensor and its _index_* modules

# The originals, captured at import: monkeypatch mode may later wrap these attributes and
# route them here, so calling through torch.* at call time could recurse.
_getitem = torch.Tensor.__getitem__
_index_select = torch.index_select
_gather = torch.gather
_Tensor = torch.Tensor

#: ``mode=`` of ``checked_index`` / ``index_select`` / ``gather`` (see safetorch.tensor).
IndexMode = Literal["raise", "clip", "wrap", "fill", "deferred"]
#: ``check=``: a per-call override of the device policy (``st.set_index_check``'s values).
IndexCheck = Literal["auto", "always", "never"]
MODES: Tuple[str, ...] = get_args(IndexMode)
# Tuples, not frozensets: dynamo 2.1 cannot trace ``dtype in frozenset`` (it can ``in tuple``).
_INT_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)
_MASK_DTYPES = (torch.bool, torch.uint8)

# Traced by torch.compile: dynamo 2.1 cannot compare a tensor with ``is`` (``t is None``,
# ``t is Ellipsis``: Unsupported), so a value that may be a tensor is tested with isinstance()
# first, and an optional tensor with ``isinstance(t, _Tensor)`` rather than ``t is not None``.


# --- index parsing -------------------------------------------------------------------------
def _is_int_like(obj: Any) -> bool:
    return isinstance(obj, int) or (hasattr(obj, "__index__") and not isinstance(obj, _Tensor))


def _treat_sequence_as_tuple(index: Any) -> bool:
    # torch's treatSequenceAsTuple (python_variable_indexing.cpp): a short non-tuple sequence
    # containing a tensor, sequence, slice, Ellipsis or None is a multi-dimensional index.
    if isinstance(index, tuple):
        return True
    if isinstance(index, _Tensor) or not isinstance(index, (list,)):
        return False
    if len(index) >= 32:
        return False
    return any(
        isinstance(item, (_Tensor, list, tuple, slice)) or _is_marker(item) for item in index
    )


class _Adv:
    """An advanced index component of ``x[index]``.

    ``kind`` is ``"int"`` (integer tensor or list: ``size`` is the indexed dimension's size),
    ``"mask"`` (bool/uint8 tensor; 0-d masks included) or ``"bool"`` (a Python bool, which
    torch turns into an index tensor of shape ``(1,)`` or ``(0,)`` on a new dimension).
    """

    __slots__ = ("pos", "tensor", "dim", "size", "kind")

    def __init__(self, pos: int, tensor: Any, dim: int, size: int, kind: str):
        self.pos = pos  # position in the index tuple
        self.tensor = tensor
        self.dim = dim  # first dimension of x it indexes
        self.size = size
        self.kind = kind

    def broadcast_shape(self) -> Tuple[int, ...]:
        """Shape this component contributes to the advanced-index broadcast (may sync)."""
        if self.kind == "int":
            return tuple(self.tensor.shape)
        if self.kind == "bool":
            return (int(bool(self.tensor)),)
        return (int(self.tensor.count_nonzero()),)


def _is_marker(it: Any) -> bool:
    """``it`` is None or Ellipsis (``it`` is not a tensor: see the note above)."""
    return it is None or it is Ellipsis


def _as_index_tensor(item: Any) -> Optional[torch.Tensor]:
    """A list index as a CPU tensor (for host-side checks), or None if it is not numeric."""
    try:
        t = torch.as_tensor(item)
    except (TypeError, ValueError, RuntimeError):
        return None
    return t if (t.dtype in _INT_DTYPES or t.dtype == torch.bool) else None


def _mask_of(it: Any) -> Optional[torch.Tensor]:
    if isinstance(it, _Tensor):
        return it if it.dtype in _MASK_DTYPES else None
    if isinstance(it, list):
        t = _as_index_tensor(it)
        return t if isinstance(t, _Tensor) and t.dtype == torch.bool else None
    return None


def _parse(x: torch.Tensor, index: Any) -> Tuple[tuple, List[_Adv], List[int]]:
    """Split ``index`` into components and check the host-side parts.

    Returns the normalized tuple, the advanced components, and the number of output
    dimensions each component produces before advanced indexing (for ``fill`` layout).
    Integers are checked here (no sync); malformed indices are left for torch to reject.
    """
    items = tuple(index) if _treat_sequence_as_tuple(index) else (index,)
    shape = x.shape
    consumed = 0
    for it in items:
        if isinstance(it, (_Tensor, list)):
            mask = _mask_of(it)
            consumed += mask.dim() if isinstance(mask, _Tensor) else 1
        elif not (isinstance(it, bool) or _is_marker(it)):
            consumed += 1
    advs: List[_Adv] = []
    produced: List[int] = []
    dim = 0
    for pos, it in enumerate(items):
        if isinstance(it, (_Tensor, list)):
            produced.append(0)
            mask = _mask_of(it)
            if isinstance(mask, _Tensor):
                _check_mask_shape(mask, shape, dim)
                advs.append(_Adv(pos, mask, dim, 0, "mask"))
                dim += mask.dim()
                continue
            t = it if isinstance(it, _Tensor) else _as_index_tensor(it)
            if not isinstance(t, _Tensor) or t.dtype not in _INT_DTYPES or dim >= len(shape):
                # float index, non-numeric list, too many indices: torch raises its own error
                dim += 1
                continue
            if t.device != x.device and t.device.type != "cpu":
                _device_mismatch("x[index]", x, t)
            advs.append(_Adv(pos, t, dim, shape[dim], "int"))
            dim += 1
            continue
        if isinstance(it, bool):
            produced.append(0)
            advs.append(_Adv(pos, it, dim, 0, "bool"))
            continue
        if it is None or isinstance(it, slice):
            produced.append(1)
            dim += it is not None
            continue
        if it is Ellipsis:
            skip = max(len(shape) - consumed, 0)
            produced.append(skip)
            dim += skip
            continue
        produced.append(0)
        if _is_int_like(it) and dim < len(shape):
            i = int(it.__index__())
            n = shape[dim]
            if not -n <= i < n:
                raise IndexOutOfBoundsError(_oob_message(i, dim, n))
        dim += 1  # an int, or an unknown object torch will judge
    return items, advs, produced


def _cpu_proxy(x: torch.Tensor) -> torch.Tensor:
    """A zero-memory CPU stand-in with ``x``'s shape (a stride-0 expanded scalar)."""
    return torch.zeros((), dtype=torch.uint8).expand(x.shape)


def _on_cpu(obj: Any) -> Any:
    if isinstance(obj, _Tensor):
        return obj.cpu()
    if type(obj) is tuple or type(obj) is list:  # x[[t0, t1]] is x[t0, t1] (see above)
        return type(obj)(_on_cpu(o) for o in obj)
    return obj


def _cpu_torch_error(op: Any, x: torch.Tensor, *args: Any) -> Optional[Exception]:
    """The error CPU torch raises for this call, or None (error path only: copies indices).

    A range check is a necessary condition only: torch reads no element, and so raises
    nothing, when the output is empty (a zero-size dimension of ``x``, a ``False`` or an
    all-False mask beside the index, ...). Running the same call on a zero-memory CPU proxy
    lets CPU torch itself decide, and gives its exact wording, which depends on the path
    the kernel takes (``index_select`` alone has three) and, for ``x[idx]``, numbers the
    advanced indices rather than the dimensions of ``x``. Other errors (``TypeError``, ...)
    propagate as torch raised them.
    """
    try:
        op(_cpu_proxy(x), *_on_cpu(args))
    except (IndexError, RuntimeError) as e:
        return e
    return None


def _raise_like_cpu(op: Any, x: torch.Tensor, *args: Any) -> None:
    """After a host-side check found a bad index: raise CPU torch's error, if it has one.

    Raises ``IndexOutOfBoundsError`` with ``str()`` equal to CPU torch's message; returns
    (nothing to raise) when CPU torch accepts the call, e.g. because the output is empty.
    """
    if _compat.compiling():
        # Dynamo traces this error path (torch < 2.4, or an index check outside the custom
        # ops): the CPU stand-in would run on FakeTensors and raise nothing. Keep the error
        # being handled (safetorch's own message), so the bad index never reaches the kernel.
        raise  # noqa: PLE0704 - only called from an `except IndexOutOfBoundsError` block
    err = _cpu_torch_error(op, x, *args)
    if err is not None:
        raise IndexOutOfBoundsError(str(err)) from None


def _check_mask_shape(mask: torch.Tensor, shape: torch.Size, dim: int) -> None:
    for j, m in enumerate(mask.shape):
        d = dim + j
        if d >= len(shape):
            return  # too many indices: torch raises its own IndexError
        if m != shape[d]:
            # CPU torch's wording (the checked path raises CPU torch's own message anyway)
            raise IndexOutOfBoundsError(
                f"The shape of the mask {list(mask.shape)} at index {j} does not match the "
                f"shape of the indexed tensor {list(shape)} at index {d}"
            )


def _oob_message(i: int, dim: int, n: int) -> str:
    return f"index {i} is out of bounds for dimension {dim} with size {n}"


def _not_a_tensor(op: str, **args: Any) -> None:
    """Raise ``TypeError`` for the first of ``args`` that is not a tensor (else return).

    Called only from an ``except`` clause after torch or attribute access failed, so the
    normal path pays nothing for it.
    """
    for name, value in args.items():
        if not isinstance(value, _Tensor):
            raise TypeError(
                f"{op}: {name} must be a torch.Tensor, got {type(value).__name__}; "
                "wrap it with torch.as_tensor(...)"
            ) from None


def _device_mismatch(op: str, x: torch.Tensor, idx: torch.Tensor) -> None:
    raise DeviceMismatchError(
        f"{op}: the index is on {idx.device} but the indexed tensor is on {x.device}; "
        f"move the index with index.to({str(x.device)!r})"
    )


def _validate_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(
            f"mode must be one of {', '.join(map(repr, MODES))}, got {mode!r}; "
            "see the table in safetorch.tensor's documentation"
        )


def _fill_layout(items: tuple, advs: List[_Adv], produced: List[int]) -> int:
    """Output dimension where the broadcast advanced-index dims start (torch's rule).

    Integers are applied as select() before advanced indexing in torch, so they neither count
    as advanced nor break adjacency; None/slices/Ellipsis between advanced indices do.
    """
    positions = [a.pos for a in advs]
    first, last = min(positions), max(positions)
    adjacent = all(
        isinstance(items[p], (_Tensor, list))
        or not (isinstance(items[p], slice) or _is_marker(items[p]))
        for p in range(first, last + 1)
    )
    return sum(produced[:first]) if adjacent else 0


def _parse_like_cpu(x: torch.Tensor, index: Any) -> Tuple[tuple, List[_Adv], List[int]]:
    """``_parse``, raising CPU torch's own error when an integer or a mask is bad."""
    try:
        return _parse(x, index)
    except IndexOutOfBoundsError:
        _raise_like_cpu(_getitem, x, index)
        raise  # CPU torch accepts it (not expected): keep safetorch's own error
