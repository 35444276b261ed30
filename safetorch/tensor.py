"""Tensor safety: ``safe_copy`` and bounds-checked indexing that never kills a CUDA context.

Indexing pitfall: on CPU an out-of-range index raises ``IndexError`` (``RuntimeError`` for
``gather``); on CUDA the kernel hits a device-side assert and the CUDA context is unusable
until the process restarts. ``checked_index`` / ``index_select`` / ``gather`` check indices
*before* any indexing kernel is launched on devices that need it (see ``safetorch._device``)
and call torch directly, adding nothing, where the kernel already checks (CPU).

Modes (``mode=``), following ``numpy.take`` and JAX's ``.at[].get(mode=)``:

==========  ==================================================  ===========================
mode        out-of-range index                                  host syncs per call (CUDA)
==========  ==================================================  ===========================
raise       IndexError; no kernel reads through it (default)   1 (only if tensor indices)
clip        clamped into range (numpy.take ``clip``)            0
wrap        taken modulo the size (numpy.take ``wrap``)         0
fill        that output position is ``fill_value``              0 (1 with bool masks)
deferred    replaced by 0 and recorded on the device;           0
            ``st.raise_deferred()`` raises later
==========  ==================================================  ===========================

Valid ranges follow torch: ``x[idx]`` accepts ``-n <= i < n``; ``index_select`` and ``gather``
accept ``0 <= i < n``. In ``clip``/``wrap``/``fill``, indices valid for the op keep their
meaning; only out-of-range ones are changed (for ``index_select``/``gather`` this is exactly
``numpy.take``).

Two implementations, one behaviour. Where Triton is importable (``_compat.HAS_TRITON``) a CUDA
call of a common form (``x[idx]`` with one int32/int64 index tensor after full slices,
``index_select``, ``gather``) runs one fused kernel (``safetorch._triton_index``) that tests,
records and gathers in a single pass; every other call, and every call without Triton, takes
the torch-op path, which is the reference. A raise-mode check (either path) also raises
a violation that ``mode="deferred"`` recorded earlier on the same device (after its own index
passed): its one sync reads that record too.

Where the code lives: this module holds ``safe_copy`` and the public indexing functions with
their torch-op paths; the private modules beside it each hold one job: ``_index_parse`` (the
index taken apart as torch does, and CPU torch's own errors), ``_index_checks`` (the check
before the kernel, the index maps of clip / wrap / fill and the deferred record),
``_index_compile`` (the same checks while dynamo traces) and ``_index_fused`` (the Triton path).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple, TypeVar, cast

import torch

from safetorch import _compat, _device
from safetorch._index_checks import (
    _call_site,
    _check_getitem,
    _check_select,
    _fill_tensor,
    _out_of_range,
    _record,
    _transform,
    _zero_bad,
    clear_deferred,
    raise_deferred,
)
from safetorch._index_compile import (
    _EAGER,
    _OPS,
    _OUTSIDE,
    _checked_ranges_op,
    _checked_select_op,
    _deferred_op,
    _route,
)
from safetorch._index_fused import _fused_call, _fused_getitem, _fused_never, _fused_on_device
from safetorch._index_parse import (
    _INT_DTYPES,
    IndexCheck,
    IndexMode,
    _Adv,
    _device_mismatch,
    _fill_layout,
    _gather,
    _getitem,
    _index_select,
    _not_a_tensor,
    _oob_message,
    _parse_like_cpu,
    _Tensor,
    _validate_mode,
)
from safetorch._nest import map_tensors
from safetorch.errors import IndexOutOfBoundsError

__all__ = [
    "safe_copy",
    "checked_index",
    "index_select",
    "gather",
    "raise_deferred",
    "clear_deferred",
]

_index_check_needed = _device.index_check_needed
# Defined with the deferred record (safetorch._index_checks); public here, under this name.
raise_deferred.__module__ = clear_deferred.__module__ = __name__


# --- safe_copy -----------------------------------------------------------------------------
def _detach_clone(t: torch.Tensor) -> torch.Tensor:
    return t.detach().clone()


_T = TypeVar("_T")


def safe_copy(obj: _T) -> _T:
    """Copy tensors out of the autograd graph into new memory: ``detach().clone()``.

    ======================  ===========  ===================
    call                    memory       autograd graph
    ======================  ===========  ===================
    ``x.clone()``           new          stays in the graph
    ``x.detach()``          **shared**   leaves the graph
    ``x.detach().clone()``  new          leaves the graph
    ======================  ===========  ===================

    Works on a tensor or recursively on mappings (state dicts keep their ``OrderedDict`` type
    and ``_metadata``), sequences, tuples, namedtuples and dataclasses (the container rules of
    :func:`safetorch.pin` and :func:`safetorch.to_device`); other values are deep-copied so the
    snapshot shares nothing mutable with the original.

    Args:
        obj: A tensor or nested structure (e.g. ``model.state_dict()``).

    Returns:
        The copy, of the type given: same dtype/device/layout/strides,
        ``requires_grad=False``.

    >>> import torch, safetorch as st
    >>> w = torch.ones(2, requires_grad=True)
    >>> best = st.safe_copy({"w": w * 2, "epoch": 3})
    >>> best["w"].requires_grad, best["w"].data_ptr() != w.data_ptr(), best["epoch"]
    (False, True, 3)
    """
    if isinstance(obj, _Tensor):
        return cast(_T, obj.detach().clone())
    import copy

    out: _T = map_tensors(_detach_clone, obj, copy.deepcopy)  # the same structure and types
    return out


# --- which path a checked call takes ---------------------------------------------------------
#: ``_fused_device(x, check)``: whether a call on ``x``'s device takes the fused path.
_fused_device = _fused_never


@_compat.register_binder
def _bind_fused() -> None:
    # Triton importable, and not ROCm: its kernels are unmeasured there (torch path kept).
    global _fused_device
    _fused_device = _fused_on_device if _compat.HAS_TRITON and not _compat.IS_ROCM else _fused_never


# --- public indexing -----------------------------------------------------------------------
def _checked_getitem_raise(x: torch.Tensor, index: Any) -> torch.Tensor:
    route = _route()
    if route == _OUTSIDE:
        return _getitem_raise_outside(x, index)
    items, advs, _ = _parse_like_cpu(x, index)
    ints = [a for a in advs if a.kind == "int" and a.tensor.numel()]
    if route == _OPS:
        if not ints:
            return _getitem(x, index)
        assert _checked_ranges_op is not None
        checked = _checked_ranges_op(
            [a.tensor for a in ints],
            [-a.size for a in ints],
            [a.size for a in ints],
            [a.dim for a in ints],
        )
        new_items = list(items)
        for a, t in zip(ints, checked):
            new_items[a.pos] = t
        return _getitem(x, tuple(new_items))
    _check_getitem(x, index, [(a.tensor, -a.size, a.size, a.dim) for a in ints])
    return _getitem(x, index)


def checked_index(
    x: torch.Tensor,
    index: Any,
    *,
    mode: IndexMode = "raise",
    fill_value: Any = None,
    check: Optional[IndexCheck] = None,
) -> torch.Tensor:
    """``x[index]`` that never launches an indexing kernel with an out-of-range index.

    Accepts every index form ``x[...]`` accepts (ints, slices, None, Ellipsis, bool masks,
    integer tensors and lists, tuples mixing them) and returns exactly ``x[index]`` (values,
    dtype, device, autograd). On devices whose kernels check bounds themselves (CPU) it is
    ``x[index]`` with nothing added.

    Args:
        x: The tensor to index.
        index: Anything ``x[index]`` accepts.
        mode: ``"raise"`` (default), ``"clip"``, ``"wrap"``, ``"fill"`` or ``"deferred"``;
            see the module documentation for each mode's meaning and host-sync cost.
        fill_value: Value for out-of-range positions with ``mode="fill"`` (default: NaN for
            floating types, the minimum of signed and the maximum of unsigned integer
            types, True for bool).
        check: Override the device policy for this call (``"auto"``, ``"always"``,
            ``"never"``); default: ``st.get_index_check()``.

    Returns:
        ``x[index]``.

    Raises:
        IndexOutOfBoundsError: (an ``IndexError`` and a ``RuntimeError``) an index is out of
            range (``mode="raise"``), or a bool mask does not match the shape it indexes.
        DeviceMismatchError: an index tensor is on another non-CPU device than ``x``.
        TypeError: ``x`` is not a tensor.

    >>> import torch, safetorch as st
    >>> x = torch.arange(6)
    >>> st.checked_index(x, torch.tensor([0, -1]))
    tensor([0, 5])
    >>> st.checked_index(x, torch.tensor([2, 9]), mode="clip")
    tensor([2, 5])
    >>> try:
    ...     st.checked_index(x, torch.tensor([6]), check="always")
    ... except IndexError as e:
    ...     print(e)
    index 6 is out of bounds for dimension 0 with size 6
    """
    try:
        if mode == "raise":
            if _index_check_needed(x, check):
                if _fused_device(x, check):
                    out = _fused_getitem(x, index, mode, None)
                    if out is not None:
                        return out
                return _checked_getitem_raise(x, index)
            if check is None:
                # CPU kernels raise IndexError themselves. Plain syntax, not the captured
                # slot: it is ~0.6 us cheaper, and a patched __getitem__ asks the same gate.
                return x[index]
            return _getitem(x, index)  # an explicit check= must not meet the index patch
        _validate_mode(mode)
        if _fused_device(x, check):
            out = _fused_getitem(x, index, mode, fill_value)
            if out is not None:
                return out
        items, advs, produced = _parse_like_cpu(x, index)
        ints = [a for a in advs if a.kind == "int" and a.tensor.numel() > 0]
        if not ints:
            return _getitem(x, index)
        return _getitem_modes(x, items, advs, ints, produced, mode, fill_value)
    except (AttributeError, TypeError):
        # x.is_cpu / x.shape / Tensor.__getitem__ on a non-tensor: say what is wrong. A
        # try block costs nothing on the normal path.
        _not_a_tensor("checked_index", x=x)
        raise


def _getitem_modes(
    x: torch.Tensor,
    items: tuple,
    advs: "List[_Adv]",
    ints: "List[_Adv]",
    produced: "List[int]",
    mode: str,
    fill_value: Any,
) -> torch.Tensor:
    route = _route() if mode == "deferred" else _EAGER
    if route == _OUTSIDE:
        args = (x, items, advs, ints, produced, mode, fill_value)
        return _getitem_modes_outside(*args)
    new_items = list(items)
    empty_dims = [a for a in ints if a.size == 0]
    if empty_dims and mode != "fill":
        a = empty_dims[0]
        raise IndexOutOfBoundsError(
            _oob_message(int(a.tensor.reshape(-1)[0]), a.dim, 0)
            + f" (mode={mode!r} cannot map an index into an empty dimension)"
        )
    traced = route == _OPS
    site = _call_site() if mode == "deferred" and not traced else 0
    bad: Optional[torch.Tensor] = None  # fill: positions where any index is out of range
    for a in ints:
        t = a.tensor.to(x.device) if a.tensor.device != x.device else a.tensor
        if mode == "clip" or mode == "wrap":
            new_items[a.pos] = _transform(t, -a.size, a.size, mode)  # a.size > 0 here
            continue
        # fill / deferred: one out-of-range mask serves the record, the fill and the index
        b = _out_of_range(t, -a.size, a.size)
        if traced:
            assert _deferred_op is not None
            new_items[a.pos] = _deferred_op(t, b, a.dim, a.size)
            continue
        if mode == "deferred":
            _record(t, b, a.dim, a.size, site)
        else:
            bad = bad | b if isinstance(bad, _Tensor) else b
        new_items[a.pos] = _zero_bad(t, b)
    if mode == "fill" and empty_dims:
        # Some dimension is empty: pad it with one slab (cheap: that dimension is empty)
        # so index 0 exists, then every output position that hit it is filled below.
        for a in empty_dims:
            pad_shape = list(x.shape)
            pad_shape[a.dim] = 1
            x = torch.cat([x, x.new_zeros(pad_shape)], dim=a.dim)
    out = _getitem(x, tuple(new_items))
    if mode != "fill":
        return out
    assert isinstance(bad, _Tensor)
    others = [a.broadcast_shape() for a in advs if a.kind != "int"]
    if others:
        # Masks contribute their nonzero() counts (torch syncs for them anyway) and Python
        # bools (1,) or (0,) to the broadcast shape of the advanced indices.
        bad = bad.expand(torch.broadcast_shapes(bad.shape, *others))
    start = _fill_layout(items, advs, produced)
    view = [1] * start + list(bad.shape) + [1] * (out.dim() - start - bad.dim())
    return torch.where(bad.reshape(view), _fill_tensor(fill_value, out), out)


def _normalize_dim(x: torch.Tensor, dim: int) -> Optional[Tuple[int, int]]:
    """(dim, size) for a valid dim, None to let torch raise its own error."""
    nd = x.dim()
    if nd == 0:
        return (0, 1) if dim in (0, -1) else None
    if not -nd <= dim < nd:
        return None
    d = dim % nd
    return d, x.shape[d]


def _select_like(
    op: str,
    torch_op: Any,
    x: torch.Tensor,
    dim: int,
    index: torch.Tensor,
    mode: str,
    fill_value: Any,
    extra: Dict[str, Any],
) -> torch.Tensor:
    if (
        not isinstance(index, _Tensor)
        or index.dtype not in _INT_DTYPES
        or index.dtype == torch.uint8
    ):
        return torch_op(x, dim, index, **extra)  # torch validates type/dtype on the host
    norm = _normalize_dim(x, dim)
    if norm is None or index.numel() == 0:
        return torch_op(x, dim, index, **extra)
    d, n = norm
    if index.device != x.device:
        _device_mismatch(f"{op}()", x, index)
    route = _route() if mode == "raise" or mode == "deferred" else _EAGER
    if route == _OUTSIDE:
        args = (op, torch_op, x, dim, index, mode, fill_value, extra)
        return _select_like_outside(*args)
    if mode == "raise":
        if route == _OPS:
            assert _checked_select_op is not None
            return torch_op(x, dim, _checked_select_op(x, dim, index, d, n, op), **extra)
        _check_select(torch_op, x, dim, index, d, n)
        return torch_op(x, dim, index, **extra)
    if n == 0 and mode != "fill":
        raise IndexOutOfBoundsError(
            _oob_message(int(index.reshape(-1)[0]), d, 0)
            + f" (mode={mode!r} cannot map an index into an empty dimension)"
        )
    bad = _out_of_range(index, 0, n) if mode in ("fill", "deferred") else None
    if route == _OPS:  # deferred
        assert _deferred_op is not None and isinstance(bad, _Tensor)
        return torch_op(x, dim, _deferred_op(index, bad, d, n), **extra)
    if mode == "deferred":
        assert isinstance(bad, _Tensor)
        _record(index, bad, d, n, _call_site())
    if n == 0:  # fill into an empty dimension: every position is fill_value
        pad_shape = list(x.shape) if x.dim() else [1]
        pad_shape[d] = 1
        x = torch.cat([x, x.new_zeros(pad_shape)], dim=d)
        safe = torch.zeros_like(index)
    elif not isinstance(bad, _Tensor):
        safe = _transform(index, 0, n, mode)
    else:
        safe = _zero_bad(index, bad)
    out = torch_op(x, dim, safe, **extra)
    if mode != "fill":
        return out
    assert isinstance(bad, _Tensor)
    if op == "index_select" and out.dim():
        view = [1] * out.dim()
        view[d] = -1
        bad = bad.reshape(view)
    return torch.where(bad, _fill_tensor(fill_value, out), out)


def index_select(
    x: torch.Tensor,
    dim: int,
    index: torch.Tensor,
    *,
    mode: IndexMode = "raise",
    fill_value: Any = None,
    check: Optional[IndexCheck] = None,
) -> torch.Tensor:
    """``torch.index_select(x, dim, index)`` checked before the kernel where needed.

    Args:
        x: Input tensor.
        dim: Dimension to select along.
        index: 1-D (or 0-D) int64/int32 tensor with values in ``[0, x.size(dim))``.
        mode: ``"raise"``, ``"clip"``, ``"wrap"``, ``"fill"`` or ``"deferred"``
            (``clip``/``wrap`` are exactly ``numpy.take``'s).
        fill_value: Value for out-of-range positions with ``mode="fill"``.
        check: Per-call override of the device policy (``"auto"``/``"always"``/``"never"``).

    Returns:
        Exactly ``torch.index_select(x, dim, index)`` for valid indices.

    Raises:
        IndexOutOfBoundsError: an index is out of range (an ``IndexError``, as CPU torch).
        DeviceMismatchError: ``index`` is on another device than ``x``.
        TypeError: ``x`` or ``index`` is not a tensor.

    >>> import torch, safetorch as st
    >>> st.index_select(torch.arange(6), 0, torch.tensor([5, 0]))
    tensor([5, 0])
    >>> st.index_select(torch.arange(6), 0, torch.tensor([7, -1]), mode="wrap")
    tensor([1, 5])
    """
    try:
        if mode == "raise":
            if not _index_check_needed(x, check):
                return _index_select(x, dim, index)  # e.g. CPU kernels raise by themselves
        _validate_mode(mode)
        if _fused_device(x, check):
            out = _fused_call("index_select", x, index, dim, mode, fill_value)
            if out is not None:
                return out
        return _select_like("index_select", _index_select, x, dim, index, mode, fill_value, {})
    except (AttributeError, TypeError):
        _not_a_tensor("index_select", x=x, index=index)  # free on the normal path
        raise


def gather(
    x: torch.Tensor,
    dim: int,
    index: torch.Tensor,
    *,
    sparse_grad: bool = False,
    mode: IndexMode = "raise",
    fill_value: Any = None,
    check: Optional[IndexCheck] = None,
) -> torch.Tensor:
    """``torch.gather(x, dim, index)`` checked before the kernel where needed.

    Args:
        x: Input tensor.
        dim: Dimension to gather along.
        index: int64 tensor with ``x``'s number of dimensions, values in ``[0, x.size(dim))``.
        sparse_grad: As torch.gather.
        mode: ``"raise"``, ``"clip"``, ``"wrap"``, ``"fill"`` or ``"deferred"``.
        fill_value: Value for out-of-range positions with ``mode="fill"``.
        check: Per-call override of the device policy (``"auto"``/``"always"``/``"never"``).

    Returns:
        Exactly ``torch.gather(x, dim, index)`` for valid indices.

    Raises:
        IndexOutOfBoundsError: an index is out of range (a ``RuntimeError``, as CPU torch, and
            an ``IndexError``).
        DeviceMismatchError: ``index`` is on another device than ``x``.
        TypeError: ``x`` or ``index`` is not a tensor.

    >>> import torch, safetorch as st
    >>> st.gather(torch.tensor([[1, 2], [3, 4]]), 1, torch.tensor([[1], [0]]))
    tensor([[2],
            [3]])
    """
    try:
        if mode == "raise":
            if not _index_check_needed(x, check):
                return _gather(x, dim, index, sparse_grad=sparse_grad)  # CPU raises by itself
        extra: Dict[str, Any] = {"sparse_grad": sparse_grad} if sparse_grad else {}
        _validate_mode(mode)
        if not sparse_grad and _fused_device(x, check):
            out = _fused_call("gather", x, index, dim, mode, fill_value)
            if out is not None:
                return out
        return _select_like("gather", _gather, x, dim, index, mode, fill_value, extra)
    except (AttributeError, TypeError):
        _not_a_tensor("gather", x=x, index=index)  # free on the normal path
        raise


# Tracing without custom ops (torch 2.0-2.3): these run outside the graph, at a graph break.
_getitem_raise_outside: Any = None
_getitem_modes_outside: Any = None
_select_like_outside: Any = None


@_compat.register_binder
def _bind_outside() -> None:
    global _getitem_raise_outside, _getitem_modes_outside, _select_like_outside
    _getitem_raise_outside = _compat.eager_only(_checked_getitem_raise)
    _getitem_modes_outside = _compat.eager_only(_getitem_modes)
    _select_like_outside = _compat.eager_only(_select_like)
