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
raise       IndexError before the kernel (default)              1 (only if tensor indices)
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
"""

from __future__ import annotations

import sys
import threading
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from safetorch import _compat, _device
from safetorch._nest import map_tensors
from safetorch._stack import user_frame
from safetorch.errors import DeviceMismatchError, IndexOutOfBoundsError

__all__ = [
    "safe_copy",
    "checked_index",
    "index_select",
    "gather",
    "raise_deferred",
    "clear_deferred",
]

# The originals, captured at import: monkeypatch mode may later wrap these attributes and
# route them here, so calling through torch.* at call time could recurse.
_getitem = torch.Tensor.__getitem__
_index_select = torch.index_select
_gather = torch.gather
_Tensor = torch.Tensor
_index_check_needed = _device.index_check_needed

_MODES = ("raise", "clip", "wrap", "fill", "deferred")
_INT_DTYPES = frozenset({torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8})
_MASK_DTYPES = frozenset({torch.bool, torch.uint8})


# --- safe_copy -----------------------------------------------------------------------------
def _detach_clone(t: torch.Tensor) -> torch.Tensor:
    return t.detach().clone()


def safe_copy(obj: Any) -> Any:
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
        The copy: same dtype/device/layout/strides, ``requires_grad=False``.

    >>> import torch, safetorch as st
    >>> w = torch.ones(2, requires_grad=True)
    >>> best = st.safe_copy({"w": w * 2, "epoch": 3})
    >>> best["w"].requires_grad, best["w"].data_ptr() != w.data_ptr(), best["epoch"]
    (False, True, 3)
    """
    if isinstance(obj, _Tensor):
        return obj.detach().clone()
    import copy

    return map_tensors(_detach_clone, obj, copy.deepcopy)


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
        isinstance(item, (_Tensor, list, tuple, slice)) or item is Ellipsis or item is None
        for item in index
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
        return t if t is not None and t.dtype == torch.bool else None
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
        if it is None or it is Ellipsis or isinstance(it, bool):
            continue
        mask = _mask_of(it)
        consumed += mask.dim() if mask is not None else 1
    advs: List[_Adv] = []
    produced: List[int] = []
    dim = 0
    for pos, it in enumerate(items):
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
        if isinstance(it, (_Tensor, list)):
            mask = _mask_of(it)
            if mask is not None:
                _check_mask_shape(mask, shape, dim)
                advs.append(_Adv(pos, mask, dim, 0, "mask"))
                dim += mask.dim()
                continue
            t = it if isinstance(it, _Tensor) else _as_index_tensor(it)
            if t is None or t.dtype not in _INT_DTYPES or dim >= len(shape):
                # float index, non-numeric list, too many indices: torch raises its own error
                dim += 1
                continue
            if t.device != x.device and t.device.type != "cpu":
                _device_mismatch("x[index]", x, t)
            advs.append(_Adv(pos, t, dim, shape[dim], "int"))
            dim += 1
            continue
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


# --- bounds checks -------------------------------------------------------------------------
def _minmax(t: torch.Tensor) -> "Tuple[torch.Tensor, torch.Tensor]":
    lo, hi = torch.aminmax(t)  # one pass (torch >= 1.10, below the supported floor)
    return lo, hi


def _first_bad(t: torch.Tensor, lo: int, n: int) -> int:
    """The first out-of-range value in ``t`` (flat order); error path only (syncs freely)."""
    flat = t.reshape(-1)
    bad = (flat < lo) | (flat >= n)
    pos = int(bad.to(torch.uint8).argmax())
    return int(flat[pos])


def _check_ranges(checks: "Sequence[Tuple[torch.Tensor, int, int, int]]") -> None:
    """Raise for the first index tensor with a value outside ``[lo, n)``; one host sync.

    ``checks`` holds ``(index, lo, n, dim)``; empty tensors are skipped by the caller.
    """
    if not checks:
        return
    extrema = []
    for t, _, _, _ in checks:
        lo_t, hi_t = _minmax(t)
        extrema.append(lo_t.to(torch.int64))
        extrema.append(hi_t.to(torch.int64))
    values = torch.stack(extrema).tolist()  # the one host sync
    for k, (t, lo, n, dim) in enumerate(checks):
        if values[2 * k] < lo or values[2 * k + 1] >= n:
            raise IndexOutOfBoundsError(_oob_message(_first_bad(t, lo, n), dim, n))


def _check_select(
    torch_op: Any, x: torch.Tensor, dim: int, index: torch.Tensor, d: int, n: int
) -> None:
    """Raise before an ``index_select``/``gather`` kernel when ``index`` leaves ``[0, n)``."""
    try:
        _check_ranges([(index, 0, n, d)])
    except IndexOutOfBoundsError:
        _raise_like_cpu(torch_op, x, dim, index)  # CPU torch's wording, path by path


# --- index transforms for clip / wrap / fill / deferred ------------------------------------
def _out_of_range(t: torch.Tensor, lo: int, n: int) -> torch.Tensor:
    """Bool mask of the entries of ``t`` outside ``[lo, n)`` (no host sync)."""
    return (t < lo) | (t >= n)


def _transform(t: torch.Tensor, lo: int, n: int, mode: str) -> torch.Tensor:
    """Map out-of-range entries of ``t`` into range for clip / wrap (no host sync). ``n > 0``.

    fill / deferred use ``_zero_bad`` with the mask they need anyway.
    """
    if mode == "clip":
        if lo < 0:  # in-range negatives keep their meaning; beyond -n clamps to 0
            return torch.where(t < lo, torch.zeros_like(t), t.clamp(max=n - 1))
        return t.clamp(0, n - 1)
    return t.remainder(n)  # wrap


def _zero_bad(t: torch.Tensor, bad: torch.Tensor) -> torch.Tensor:
    # fill / deferred: any in-range value will do; 0 is valid for n > 0 (for n == 0, fill pads
    # the empty dimension with one slab first). A Python scalar, not a tensor made from one:
    # that would be a host-to-device copy, which synchronizes.
    return t.masked_fill(bad, 0)


def _fill_tensor(fill: Any, out: torch.Tensor) -> torch.Tensor:
    """``fill`` as a 0-d tensor of ``out``'s dtype on ``out``'s device, without a host sync.

    ``torch.as_tensor(3.0, device="cuda")`` builds the value on the host and copies it to the
    device from pageable memory, a synchronizing copy; ``torch.full`` launches a fill kernel.
    """
    if isinstance(fill, _Tensor):
        return fill.to(device=out.device, dtype=out.dtype)  # the caller's tensor, as given
    try:
        return torch.full((), fill, dtype=out.dtype, device=out.device)
    except TypeError:  # not a scalar (a nested list, ...): torch.as_tensor judges it
        return torch.as_tensor(fill, dtype=out.dtype, device=out.device)


def _default_fill(dtype: torch.dtype) -> Any:
    # JAX's defaults for .at[].get(mode="fill")
    if dtype == torch.bool:
        return True
    if dtype.is_floating_point or dtype.is_complex:
        return float("nan")
    return torch.iinfo(dtype).min if dtype.is_signed else torch.iinfo(dtype).max


# --- deferred errors -----------------------------------------------------------------------
class _DeferredState:
    """Per-device record of the first violation: [flag, value, dim, size, site] (int64)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.states: "Dict[torch.device, torch.Tensor]" = {}
        self.sites: "List[str]" = []
        self.site_ids: "Dict[Tuple[str, int, str], int]" = {}
        # Device constants reused by every call: the record [1, 0, dim, size, site] per
        # (device, dim, size, site) and, per device, the mask of the value slot. Building them
        # per call cost five small kernels (four fills and a stack) on every deferred call.
        self.entries: "Dict[Tuple[torch.device, int, int, int], torch.Tensor]" = {}
        self.value_slots: "Dict[torch.device, torch.Tensor]" = {}


_deferred = _DeferredState()
_MAX_CACHED_ENTRIES = 4096  # bounds the cache when sizes vary from call to call


def _call_site() -> int:
    """Id of the user's line calling the public function (the first frame outside torch and
    safetorch, so a monkeypatched ``Tensor.__getitem__`` or a helper calling another one in
    between changes nothing)."""
    frame = user_frame() or sys._getframe(1)
    key = (frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name)
    return _site_id(key, f"{key[0]}:{key[1]} in {key[2]}")


def _site_id(key: Tuple[str, int, str], label: str) -> int:
    """The id of a recorded call site (``label`` is what ``raise_deferred`` names)."""
    site = _deferred.site_ids.get(key)  # a dict read is atomic: lock only to add a site
    if site is not None:
        return site
    with _deferred.lock:
        site = _deferred.site_ids.get(key)
        if site is None:
            site = len(_deferred.sites)
            _deferred.sites.append(label)
            _deferred.site_ids[key] = site
    return site


def _entry_constants(
    dev: torch.device, dim: int, n: int, site: int
) -> "Tuple[torch.Tensor, torch.Tensor]":
    """(record with value 0, value-slot mask) on ``dev``; caller holds ``_deferred.lock``.

    Built once from fill kernels (``torch.tensor([...], device=dev)`` would copy from the host
    and synchronize), then reused.
    """
    key = (dev, dim, n, site)
    entry = _deferred.entries.get(key)
    if entry is None:
        if len(_deferred.entries) >= _MAX_CACHED_ENTRIES:
            _deferred.entries.clear()
        entry = torch.stack(
            [torch.full((), v, dtype=torch.int64, device=dev) for v in (1, 0, dim, n, site)]
        )
        _deferred.entries[key] = entry
    slot = _deferred.value_slots.get(dev)
    if slot is None:
        slot = torch.arange(5, device=dev) == 1
        _deferred.value_slots[dev] = slot
    return entry, slot


def _record(t: torch.Tensor, bad: torch.Tensor, dim: int, n: int, site: int) -> None:
    """Record the first ``True`` of ``bad`` (the out-of-range mask of ``t``) on the device.

    No host sync: every step is a kernel on ``t``'s device, and ``_zero_bad`` reuses ``bad``.
    """
    dev = t.device
    # A bool -> uint8 view is free (same element size); max has no bool kernel everywhere.
    bad_flat = bad.reshape(-1).view(torch.uint8)
    # One reduction gives both: hit (1 iff any entry is bad) and pos, the first position of
    # the maximum (torch documents first-index ties), i.e. the first bad entry (0 if none).
    hit, pos = bad_flat.max(0)
    # index_select with a 1-element device tensor: indexing with a 0-d tensor could sync.
    first = _index_select(t.reshape(-1), 0, pos.reshape(1)).to(torch.int64)
    with _deferred.lock:
        base, value_slot = _entry_constants(dev, dim, n, site)
        entry = torch.where(value_slot, first, base)
        state = _deferred.states.get(dev)
        if state is None:
            state = torch.zeros(5, dtype=torch.int64, device=dev)
        # Keep the first violation: take this call's iff it is bad and no flag is set yet;
        # with hit and flag in {0, 1} that is hit > flag (one comparison instead of ==, &).
        _deferred.states[dev] = torch.where(hit > state[:1], entry, state)


def raise_deferred() -> None:
    """Raise the first out-of-range index recorded by ``mode="deferred"`` calls, if any.

    Synchronizes with each device that has records (one host sync per device), then clears
    the records.

    Raises:
        IndexOutOfBoundsError: naming the first offending call site (file:line) and index.

    >>> import torch, safetorch as st
    >>> y = st.checked_index(torch.arange(4), torch.tensor([1, 9]), mode="deferred")
    >>> try:
    ...     st.raise_deferred()
    ... except IndexError as e:
    ...     print(str(e).split(" (first")[0])
    index 9 is out of bounds for dimension 0 with size 4
    """
    with _deferred.lock:
        states = list(_deferred.states.items())
        _deferred.states.clear()
        sites = list(_deferred.sites)
    for dev, state in states:
        flag, value, dim, size, site = state.tolist()
        if flag:
            raise IndexOutOfBoundsError(
                _oob_message(value, dim, size)
                + f" (first out-of-range index recorded by mode='deferred' at {sites[site]},"
                f" on {dev}; out-of-range positions were read as index 0)"
            )


def clear_deferred() -> None:
    """Forget every deferred violation recorded so far, without raising.

    >>> import safetorch as st
    >>> st.clear_deferred()
    """
    with _deferred.lock:
        _deferred.states.clear()


# --- public indexing -----------------------------------------------------------------------
def _validate_mode(mode: str) -> None:
    if mode not in _MODES:
        raise ValueError(
            f"mode must be one of {', '.join(map(repr, _MODES))}, got {mode!r}; "
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
        not (items[p] is None or isinstance(items[p], slice) or items[p] is Ellipsis)
        for p in range(first, last + 1)
    )
    return sum(produced[:first]) if adjacent else 0


def checked_index(
    x: torch.Tensor,
    index: Any,
    *,
    mode: str = "raise",
    fill_value: Any = None,
    check: Optional[str] = None,
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
                return _checked_getitem_raise(x, index)
            if check is None:
                # CPU kernels raise IndexError themselves. Plain syntax, not the captured
                # slot: it is ~0.6 us cheaper, and a patched __getitem__ asks the same gate.
                return x[index]
            return _getitem(x, index)  # an explicit check= must not meet the index patch
        _validate_mode(mode)
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


# --- under torch.compile -----------------------------------------------------------------------
# Dynamo can trace neither the host-side check (a .tolist() sync, then Python branches on the
# values) nor the deferred record (a lock, the caller's frame); and an error path it traces
# runs the CPU stand-in on FakeTensors, which raise nothing, so the bad index would reach the
# kernel. While dynamo traces, the check and the record therefore run inside opaque custom ops
# (torch >= 2.4): the op is a node of the graph and runs eagerly, with real values, every time
# the graph runs, raising or recording exactly as eager mode does. Each op returns the index
# the graph then uses (a copy), so it can never be dropped as dead code. With fullgraph=False
# on torch 2.0-2.3 the check runs at a graph break instead, and its error re-raises as is.
_SELECT_OPS: Dict[str, Any] = {"index_select": torch.index_select, "gather": torch.gather}
_COMPILED_SITE_KEY = ("<a torch.compile graph>", 0, "(line unknown inside a compiled graph)")


def _checked_ranges_eager(
    tensors: List[torch.Tensor], lo: List[int], n: List[int], dims: List[int]
) -> List[torch.Tensor]:
    _check_ranges(list(zip(tensors, lo, n, dims)))
    return [t.clone() for t in tensors]


def _checked_select_eager(
    x: torch.Tensor, dim: int, index: torch.Tensor, d: int, n: int, op: str
) -> torch.Tensor:
    _check_select(_SELECT_OPS[op], x, dim, index, d, n)
    return index.clone()


def _deferred_eager(t: torch.Tensor, bad: torch.Tensor, dim: int, n: int) -> torch.Tensor:
    key = _COMPILED_SITE_KEY
    _record(t, bad, dim, n, _site_id(key, f"{key[0]} {key[2]}"))
    return _zero_bad(t, bad)


_checked_ranges_op: Optional[Any] = None
_checked_select_op: Optional[Any] = None
_deferred_op: Optional[Any] = None


def _register_ops() -> None:
    global _checked_ranges_op, _checked_select_op, _deferred_op
    library = torch.library
    ops = (
        (
            "checked_ranges",
            _checked_ranges_eager,
            "(Tensor[] tensors, int[] lo, int[] n, int[] dims) -> Tensor[]",
        ),
        (
            "checked_select_index",
            _checked_select_eager,
            "(Tensor x, int dim, Tensor index, int d, int n, str op) -> Tensor",
        ),
        ("deferred_index", _deferred_eager, "(Tensor t, Tensor bad, int dim, int n) -> Tensor"),
    )
    made = []
    for name, fn, schema in ops:
        op = library.custom_op(f"safetorch::{name}", fn, mutates_args=(), schema=schema)
        made.append(op)
    ranges, select, deferred = made
    ranges.register_fake(lambda tensors, lo, n, dims: [torch.empty_like(t) for t in tensors])
    select.register_fake(lambda x, dim, index, d, n, op: torch.empty_like(index))
    deferred.register_fake(lambda t, bad, dim, n: torch.empty_like(t))
    _checked_ranges_op, _checked_select_op, _deferred_op = ranges, select, deferred


if _compat.HAS_CUSTOM_OP:
    _register_ops()


# How a checked call runs, decided once per call: eagerly; while dynamo traces it, through the
# custom ops; or, tracing on torch 2.0-2.3 (no custom ops), outside the graph (a graph break:
# fullgraph=True refuses to compile).
_EAGER, _OPS, _OUTSIDE = 0, 1, 2


def _route() -> int:
    if not _compat.tracing():
        return _EAGER
    return _OPS if _checked_ranges_op is not None else _OUTSIDE


def _parse_like_cpu(x: torch.Tensor, index: Any) -> Tuple[tuple, List[_Adv], List[int]]:
    """``_parse``, raising CPU torch's own error when an integer or a mask is bad."""
    try:
        return _parse(x, index)
    except IndexOutOfBoundsError:
        _raise_like_cpu(_getitem, x, index)
        raise  # CPU torch accepts it (not expected): keep safetorch's own error


def _checked_getitem_raise(x: torch.Tensor, index: Any) -> torch.Tensor:
    route = _route()
    if route == _OUTSIDE:
        return _compat.run_eagerly(_checked_getitem_raise, x, index)
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
    try:
        _check_ranges([(a.tensor, -a.size, a.size, a.dim) for a in ints])
    except IndexOutOfBoundsError:
        # CPU torch's message: which index it reports first and how it numbers dimensions
        # (and "index is out of bounds for dimension with size 0") are its kernel's.
        _raise_like_cpu(_getitem, x, index)
    return _getitem(x, index)


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
        return _compat.run_eagerly(_getitem_modes, *args)
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
            bad = b if bad is None else bad | b
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
    assert bad is not None
    others = [a.broadcast_shape() for a in advs if a.kind != "int"]
    if others:
        # Masks contribute their nonzero() counts (torch syncs for them anyway) and Python
        # bools (1,) or (0,) to the broadcast shape of the advanced indices.
        bad = bad.expand(torch.broadcast_shapes(bad.shape, *others))
    start = _fill_layout(items, advs, produced)
    view = [1] * start + list(bad.shape) + [1] * (out.dim() - start - bad.dim())
    fill = _default_fill(out.dtype) if fill_value is None else fill_value
    return torch.where(bad.reshape(view), _fill_tensor(fill, out), out)


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
        return _compat.run_eagerly(_select_like, *args)
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
        assert _deferred_op is not None and bad is not None
        return torch_op(x, dim, _deferred_op(index, bad, d, n), **extra)
    if mode == "deferred":
        assert bad is not None
        _record(index, bad, d, n, _call_site())
    if n == 0:  # fill into an empty dimension: every position is fill_value
        pad_shape = list(x.shape) if x.dim() else [1]
        pad_shape[d] = 1
        x = torch.cat([x, x.new_zeros(pad_shape)], dim=d)
        safe = torch.zeros_like(index)
    elif bad is None:
        safe = _transform(index, 0, n, mode)
    else:
        safe = _zero_bad(index, bad)
    out = torch_op(x, dim, safe, **extra)
    if mode != "fill":
        return out
    assert bad is not None
    if op == "index_select" and out.dim():
        view = [1] * out.dim()
        view[d] = -1
        bad = bad.reshape(view)
    fill = _default_fill(out.dtype) if fill_value is None else fill_value
    return torch.where(bad, _fill_tensor(fill, out), out)


def index_select(
    x: torch.Tensor,
    dim: int,
    index: torch.Tensor,
    *,
    mode: str = "raise",
    fill_value: Any = None,
    check: Optional[str] = None,
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
    mode: str = "raise",
    fill_value: Any = None,
    check: Optional[str] = None,
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
        return _select_like("gather", _gather, x, dim, index, mode, fill_value, extra)
    except (AttributeError, TypeError):
        _not_a_tensor("gather", x=x, index=index)  # free on the normal path
        raise
