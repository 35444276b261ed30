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
the torch-op path below, which is the reference. A raise-mode check (either path) also raises
a violation that ``mode="deferred"`` recorded earlier on the same device (after its own index
passed): its one sync reads that record too.
"""

from __future__ import annotations

import functools
import itertools
import math
import sys
import threading
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple

import torch

from safetorch import _compat, _device, _triton_index
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


def _check_ranges(checks: "Sequence[Tuple[torch.Tensor, int, int, int]]") -> bool:
    """Raise for the first index tensor with a value outside ``[lo, n)``; one host sync.

    ``checks`` holds ``(index, lo, n, dim)``; empty tensors are skipped by the caller.
    Returns whether the device holds a deferred violation (read in the same sync): the caller
    then raises it with ``raise_deferred()``, after its own handling of a range error.
    """
    if not checks:
        return False
    extrema = []
    for t, _, _, _ in checks:
        lo_t, hi_t = _minmax(t)
        extrema.append(lo_t.to(torch.int64))
        extrema.append(hi_t.to(torch.int64))
    # A deferred record on this device rides along in the same sync: a raise-mode check is
    # one of the points where a deferred violation surfaces.
    state = _deferred.states.get(checks[0][0].device) if _deferred.states else None
    if state is not None:
        extrema.append(state[0])
    values = torch.stack(extrema).tolist()  # the one host sync
    for k, (t, lo, n, dim) in enumerate(checks):
        if values[2 * k] < lo or values[2 * k + 1] >= n:
            raise IndexOutOfBoundsError(_oob_message(_first_bad(t, lo, n), dim, n))
    return state is not None and bool(values[-1])


def _check_select(
    torch_op: Any, x: torch.Tensor, dim: int, index: torch.Tensor, d: int, n: int
) -> None:
    """Raise before an ``index_select``/``gather`` kernel when ``index`` leaves ``[0, n)``."""
    try:
        pending = _check_ranges([(index, 0, n, d)])
    except IndexOutOfBoundsError:
        _raise_like_cpu(torch_op, x, dim, index)  # CPU torch's wording, path by path
        pending = False
    if pending:
        raise_deferred()


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
    """Per-device record of the first violation (int64):
    ``[flag, value, dim, size, site, k0, k1, k2]``.

    The torch path writes ``flag = 1`` and the value in slot 1; the fused kernel writes its
    call id (>= 2) and the value in three chunk keys (see ``safetorch._triton_index``), which
    are ``_NO_KEY`` otherwise. Whichever records first keeps the record.
    """

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
_NO_KEY = _triton_index.NO_KEY
_SLOTS = _triton_index.RECORD_SLOTS


def _new_state(dev: torch.device) -> torch.Tensor:
    """An empty record on ``dev`` from fill kernels (no host-to-device copy, so no sync)."""
    state = torch.full((_SLOTS,), _NO_KEY, dtype=torch.int64, device=dev)
    state[:5].zero_()
    return state


def _device_state(dev: torch.device) -> torch.Tensor:
    """The device's record, made on first use; the caller holds ``_deferred.lock``."""
    state = _deferred.states.get(dev)
    if state is None:
        state = _deferred.states[dev] = _new_state(dev)
    return state


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
        values = (1, 0, dim, n, site) + (_NO_KEY,) * (_SLOTS - 5)
        entry = torch.stack([torch.full((), v, dtype=torch.int64, device=dev) for v in values])
        _deferred.entries[key] = entry
    slot = _deferred.value_slots.get(dev)
    if slot is None:
        slot = torch.arange(_SLOTS, device=dev) == 1
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
            state = _new_state(dev)
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
        flag, value, dim, size, site, *keys = state.tolist()
        if flag:
            if flag != 1:  # recorded by the fused kernel: the value is in the chunk keys
                value = _triton_index.unpack_value(*keys)
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
    if _check_ranges(list(zip(tensors, lo, n, dims))):
        raise_deferred()
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


# --- the fused path: one Triton kernel per checked call (safetorch._triton_index) ----------
# Where Triton is importable, a CUDA call of a covered form skips every torch op above: one
# kernel reads each index once, tests it, records a violation and gathers through a safe
# index. Raise mode then pays the one sync it needs by design (reading the kernel's flag); the
# other modes none. Anything the kernel does not cover (other index forms and dtypes, sparse
# gradients, a tensor fill_value, an empty output, ...) returns None here and takes the torch
# path, which stays the reference. On CPU the kernel runs only under Triton's interpreter
# (TRITON_INTERPRET=1) with the check path forced: how the CUDA path is tested without a GPU.
_FULL = slice(None)
_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)  # subclasses (vmap, DTensor): torch path
_INTERPRET = _triton_index.INTERPRET
_call_ids = itertools.count(2)  # 1 is the torch path's flag in a deferred record
_raise_buffers = threading.local()


class _Fused(NamedTuple):
    """One covered call: the op, its normalized dimension, that dimension's size, the lowest
    valid index (``-n`` for ``x[idx]``, else 0) and the output shape."""

    op: str  # "getitem" (x[idx] after d full slices), "index_select" or "gather"
    d: int
    n: int
    lo: int
    shape: Tuple[int, ...]


def _fused_plan(op: str, x: Any, index: Any, dim: int) -> Optional[_Fused]:
    """The covered form of this call, or None (then the torch path runs it)."""
    if type(x) not in _PLAIN_TENSORS or type(index) not in _PLAIN_TENSORS:
        return None
    if index.dtype not in _triton_index.INDEX_DTYPES or index.device != x.device:
        return None
    if not _triton_index.coverable(x) or index.numel() == 0:
        return None
    nd = x.dim()
    if not -nd <= dim < nd:
        return None
    d = dim % nd
    n = x.shape[d]
    outer, inner = x.shape[:d], x.shape[d + 1 :]
    if op == "gather":
        if index.dim() != nd or any(index.shape[k] > x.shape[k] for k in range(nd) if k != d):
            return None  # torch raises its own error
        shape = tuple(index.shape)
    elif op == "index_select":
        if index.dim() > 1:
            return None
        shape = (*outer, index.numel(), *inner)
    else:
        shape = (*outer, *index.shape, *inner)
    if math.prod(shape) == 0:
        return None  # nothing is read: torch decides whether that raises
    return _Fused(op, d, n, -n if op == "getitem" else 0, shape)


def _fused_never(x: torch.Tensor, check: Optional[str]) -> bool:
    return False


def _fused_on_device(x: torch.Tensor, check: Optional[str]) -> bool:
    if x.is_cpu:
        return _INTERPRET and _index_check_needed(x, check)
    return x.is_cuda


#: ``_fused_device(x, check)``: whether a call on ``x``'s device takes the fused path.
_fused_device = _fused_never


@_compat.register_binder
def _bind_fused() -> None:
    # Triton importable, and not ROCm: its kernels are unmeasured there (torch path kept).
    global _fused_device
    _fused_device = _fused_on_device if _compat.HAS_TRITON and not _compat.IS_ROCM else _fused_never


def _raise_buffer(dev: torch.device) -> Tuple[torch.Tensor, torch.Tensor]:
    """This thread's raise-mode buffer on ``dev`` and the flag the kernel copies into it.

    ``[bad call id, deferred flag, 0]``: per thread, so that a call compares ``rec[0]`` with
    its own id after its own sync; slot 2 stands in for a device without a deferred record.
    """
    buffers = getattr(_raise_buffers, "by_device", None)
    if buffers is None:
        buffers = _raise_buffers.by_device = {}
    rec = buffers.get(dev)
    if rec is None:
        rec = buffers[dev] = torch.zeros(3, dtype=torch.int64, device=dev)
    state = _deferred.states.get(dev)
    return rec, (rec[2:] if state is None else state)


def _fill_bits(fill_value: Any, dtype: torch.dtype) -> Optional[int]:
    """``fill_value`` as the kernel takes it (the bits of the value in ``dtype``), or None."""
    if fill_value is None:
        fill_value = _default_fill(dtype)
    if type(fill_value) in (int, float, bool):
        if fill_value != fill_value:
            fill_value = _NAN  # one NaN object: NaN != NaN, so a new one never hits the cache
        return _scalar_fill_bits(dtype, fill_value)  # cached: no host op per call
    if isinstance(fill_value, _Tensor):
        return None  # a tensor fill_value may broadcast: the torch path handles it
    return _triton_index.fill_bits_of(fill_value, dtype)


_NAN = float("nan")


@functools.lru_cache(maxsize=256, typed=True)
def _scalar_fill_bits(dtype: torch.dtype, value: Any) -> Optional[int]:
    return _triton_index.fill_bits_of(value, dtype)


def _restricted(x: torch.Tensor, index: torch.Tensor, d: int) -> torch.Tensor:
    """``x`` cut to ``index``'s sizes outside ``d`` (gather reads only that part): a view."""
    size = list(index.shape)
    size[d] = x.shape[d]
    if size == list(x.shape):
        return x
    return x.as_strided(size, x.stride(), x.storage_offset())


def _fused_forward(
    plan: _Fused, x: torch.Tensor, index: torch.Tensor, dim: int, mode: str, fill: int, site: int
) -> torch.Tensor:
    """Run the kernel for ``plan``; raise (mode raise) after its one sync. No autograd."""
    if plan.n == 0 and mode in ("clip", "wrap", "deferred"):
        raise IndexOutOfBoundsError(
            _oob_message(int(index.reshape(-1)[0]), plan.d, 0)
            + f" (mode={mode!r} cannot map an index into an empty dimension)"
        )
    xd = x.detach() if x.requires_grad else x
    out = torch.empty(plan.shape, dtype=x.dtype, device=x.device)
    if plan.op == "gather":
        form, xk, kidx = _triton_index.GATHER, _restricted(xd, index, plan.d), index
    else:
        form, xk, kidx = _triton_index.TAKE, xd, index.reshape(-1)
    # The kernel on these operands; each mode adds its record buffers.
    code = _triton_index.MODES[mode]
    launch = functools.partial(
        _triton_index.launch, xk, kidx, out, form=form, d=plan.d, lo=plan.lo, mode=code
    )
    if mode == "raise":
        rec, flag = _raise_buffer(x.device)
        call = next(_call_ids)
        launch(rec=rec, flag=flag, call_id=call)
        bad, pending = rec[:2].tolist()  # the one host sync
        if bad == call:
            _raise_fused_error(plan, x, index, dim)
        if pending:
            raise_deferred()  # recorded earlier by mode="deferred": it surfaces here
        return out
    if mode == "deferred":
        # Under the lock: the torch path replaces the record under it, and the kernel must
        # write into the record that is current (the fused kernel writes in place).
        with _deferred.lock:
            rec = _device_state(x.device)
            launch(rec=rec, call_id=next(_call_ids), dim_no=plan.d, site=site)
        return out
    # clip / wrap / fill record nothing: the index stands in for the unused record pointers
    launch(rec=kidx, fill_bits=fill)
    return out


def _raise_fused_error(plan: _Fused, x: torch.Tensor, index: torch.Tensor, dim: int) -> None:
    """The kernel saw an out-of-range index: raise CPU torch's error for the same call."""
    if plan.op == "getitem":
        args: Tuple[Any, ...] = ((_FULL,) * plan.d + (index,) if plan.d else index,)
        _raise_like_cpu(_getitem, x, *args)
    else:
        _raise_like_cpu(_SELECT_OPS[plan.op], x, dim, index)
    # CPU torch accepts the call (not expected with a non-empty output): keep safetorch's own
    raise IndexOutOfBoundsError(_oob_message(_first_bad(index, plan.lo, plan.n), plan.d, plan.n))


def _safe_index(
    index: torch.Tensor, lo: int, n: int, mode: str
) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """The index the kernel read through, with torch ops (backward only), and the
    out-of-range mask for fill / deferred: the torch path's own mapping."""
    if mode == "raise":
        return index, None  # validated before anything was returned
    if mode in ("clip", "wrap"):
        return _transform(index, lo, n, mode), None
    bad = _out_of_range(index, lo, n)
    return _zero_bad(index, bad), bad


def _fused_backward(
    op: str, dim: int, mode: str, x_shape: Sequence[int], index: torch.Tensor, grad: torch.Tensor
) -> torch.Tensor:
    """The gradient of ``x``: torch's own backward ops on the index the kernel read."""
    nd = len(x_shape)
    d = dim % nd
    n = x_shape[d]
    zeros = grad.new_zeros(tuple(x_shape))
    if n == 0:
        return zeros  # fill into an empty dimension: nothing was read
    safe, bad = _safe_index(index, -n if op == "getitem" else 0, n, mode)
    if mode == "fill":
        assert bad is not None  # filled positions read nothing: they get no gradient
        if op == "index_select":
            bad = bad.reshape([1] * d + [-1] + [1] * (nd - d - 1))
        elif op == "getitem":
            bad = bad.reshape([1] * d + list(bad.shape) + [1] * (nd - d - 1))
        grad = grad.masked_fill(bad, 0)
    if op == "gather":
        return zeros.scatter_add(d, safe, grad)  # gather's backward
    if op == "index_select":
        return zeros.index_add(d, safe.reshape(-1), grad)  # index_select's backward
    return torch.ops.aten.index_put(zeros, [None] * d + [safe], grad, True)  # x[idx]'s


class _FusedIndex(torch.autograd.Function):
    """The fused kernel in eager mode when ``x`` requires grad."""

    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        index: torch.Tensor,
        plan: _Fused,
        dim: int,
        mode: str,
        fill: int,
        site: int,
    ) -> torch.Tensor:
        ctx.save_for_backward(index)
        ctx.info = (plan.op, plan.d, mode, tuple(x.shape))
        return _fused_forward(plan, x, index, dim, mode, fill, site)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Tuple[Optional[torch.Tensor], ...]:
        (index,) = ctx.saved_tensors
        op, d, mode, x_shape = ctx.info
        return (_fused_backward(op, d, mode, x_shape, index, grad),) + (None,) * 6


def _fused_call(
    op: str, x: torch.Tensor, index: Any, dim: int, mode: str, fill_value: Any
) -> Optional[torch.Tensor]:
    """The call through the fused kernel, or None when it is not covered."""
    plan = _fused_plan(op, x, index, dim)
    if plan is None:
        return None
    if _compat.tracing():
        # raise / deferred inside the graph as one opaque op (where the torch path's own ops
        # are, see _route); clip / wrap / fill are plain tensor ops on the torch path, which
        # the compiler fuses by itself.
        if _fused_op is None or _route() != _OPS or mode not in ("raise", "deferred"):
            return None
        return _fused_op(x, index, op, dim, mode)
    fill = 0
    if mode == "fill":
        bits = _fill_bits(fill_value, x.dtype)
        if bits is None:
            return None
        fill = bits
    site = _call_site() if mode == "deferred" else 0
    if x.requires_grad and torch.is_grad_enabled():
        out: torch.Tensor = _FusedIndex.apply(x, index, plan, dim, mode, fill, site)
        return out
    return _fused_forward(plan, x, index, dim, mode, fill, site)


def _fused_getitem(x: torch.Tensor, index: Any, mode: str, fill_value: Any) -> Optional[Any]:
    """``x[index]`` through the fused kernel when ``index`` is one integer tensor, alone or
    after full slices (``x[:, idx]``); None otherwise."""
    if isinstance(index, _Tensor):
        t, d = index, 0
    elif (
        type(index) is tuple
        and index
        and isinstance(index[-1], _Tensor)
        and all(type(it) is slice and it == _FULL for it in index[:-1])
    ):
        t, d = index[-1], len(index) - 1
        if d >= x.dim():
            return None
    else:
        return None
    return _fused_call("getitem", x, t, d, mode, fill_value)


# Under torch.compile: one custom op (torch >= 2.4) runs the kernel with real values every
# time the graph runs, raising or recording as in eager mode; its backward is torch's ops.
def _fused_op_eager(x: torch.Tensor, index: torch.Tensor, op: str, dim: int, mode: str) -> Any:
    plan = _fused_plan(op, x, index, dim)
    if plan is None:  # a shape the trace did not see (dynamic shapes): the torch path
        if op == "getitem":
            return checked_index(x, (_FULL,) * dim + (index,), mode=mode, check="always")
        public = index_select if op == "index_select" else gather
        return public(x, dim, index, mode=mode, check="always")
    key = _COMPILED_SITE_KEY
    site = _site_id(key, f"{key[0]} {key[2]}") if mode == "deferred" else 0
    return _fused_forward(plan, x, index, dim, mode, 0, site)


def _fused_op_fake(x: torch.Tensor, index: torch.Tensor, op: str, dim: int, mode: str) -> Any:
    nd = x.dim()
    d = dim % nd
    if op == "gather":
        shape: Tuple[Any, ...] = tuple(index.shape)
    elif op == "index_select":
        shape = (*x.shape[:d], index.numel(), *x.shape[d + 1 :])
    else:
        shape = (*x.shape[:d], *index.shape, *x.shape[d + 1 :])
    return x.new_empty(shape)


def _fused_op_setup(ctx: Any, inputs: Tuple[Any, ...], output: Any) -> None:
    x, index, op, dim, mode = inputs
    ctx.save_for_backward(index)
    ctx.info = (op, dim, mode, tuple(x.shape))


def _fused_op_backward(ctx: Any, grad: torch.Tensor) -> Tuple[Optional[torch.Tensor], ...]:
    (index,) = ctx.saved_tensors
    op, dim, mode, x_shape = ctx.info
    return (_fused_backward(op, dim, mode, x_shape, index, grad),) + (None,) * 4


_fused_op: Optional[Any] = None


def _register_fused_op() -> None:
    global _fused_op
    op = torch.library.custom_op(
        "safetorch::fused_index",
        _fused_op_eager,
        mutates_args=(),
        schema="(Tensor x, Tensor index, str op, int dim, str mode) -> Tensor",
    )
    op.register_fake(_fused_op_fake)
    op.register_autograd(_fused_op_backward, setup_context=_fused_op_setup)
    _fused_op = op


if _compat.HAS_CUSTOM_OP and _compat.HAS_TRITON:
    _register_fused_op()


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
        pending = _check_ranges([(a.tensor, -a.size, a.size, a.dim) for a in ints])
    except IndexOutOfBoundsError:
        # CPU torch's message: which index it reports first and how it numbers dimensions
        # (and "index is out of bounds for dimension with size 0") are its kernel's.
        _raise_like_cpu(_getitem, x, index)
        pending = False
    if pending:
        raise_deferred()
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
        if not sparse_grad and _fused_device(x, check):
            out = _fused_call("gather", x, index, dim, mode, fill_value)
            if out is not None:
                return out
        return _select_like("gather", _gather, x, dim, index, mode, fill_value, extra)
    except (AttributeError, TypeError):
        _not_a_tensor("gather", x=x, index=index)  # free on the normal path
        raise
