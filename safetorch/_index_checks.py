"""Bounds checks before the kernel, the index maps of clip / wrap / fill, and the deferred record.

Private to :mod:`safetorch.tensor` (which exports :func:`raise_deferred` and
:func:`clear_deferred`): the raise-mode check (one host sync for every index tensor of a call,
which also reads a deferred record of the same device), the sync-free maps of the other
modes, and the per-device record that ``mode="deferred"`` writes without a host sync.
"""

from __future__ import annotations

import sys
import threading
from typing import Any, Dict, List, Sequence, Tuple

import torch

from safetorch import _triton_index
from safetorch._index_parse import (
    _getitem,
    _index_select,
    _oob_message,
    _raise_like_cpu,
    _Tensor,
)
from safetorch._stack import user_frame
from safetorch.errors import IndexOutOfBoundsError

__all__: List[str] = []  # private: raise_deferred/clear_deferred are safetorch.tensor's


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


def _check_getitem(
    x: torch.Tensor, index: Any, checks: "List[Tuple[torch.Tensor, int, int, int]]"
) -> None:
    """Raise before an ``x[index]`` kernel when an index tensor leaves its range."""
    try:
        pending = _check_ranges(checks)
    except IndexOutOfBoundsError:
        # CPU torch's message: which index it reports first and how it numbers dimensions
        # (and "index is out of bounds for dimension with size 0") are its kernel's.
        _raise_like_cpu(_getitem, x, index)
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
    """``fill`` (None: the mode's default for the dtype) as a 0-d tensor of ``out``'s dtype on
    ``out``'s device, without a host sync.

    ``torch.as_tensor(3.0, device="cuda")`` builds the value on the host and copies it to the
    device from pageable memory, a synchronizing copy; ``torch.full`` launches a fill kernel.
    """
    if isinstance(fill, _Tensor):
        return fill.to(device=out.device, dtype=out.dtype)  # the caller's tensor, as given
    if fill is None:  # (not before the tensor test: dynamo 2.1 cannot trace `tensor is None`)
        fill = _default_fill(out.dtype)
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
