"""Device policy: which devices' kernels check index bounds, and whether memory can be pinned.

Why a policy at all:

* CPU index kernels raise a clean ``IndexError`` (``index_select``/``x[idx]``) or
  ``RuntimeError`` (``gather``) before touching memory, so safetorch adds nothing there.
* CUDA kernels fail with a *device-side assert*, which leaves the CUDA context unusable until
  the process restarts (PyTorch maintainers: no reset is possible), so indices must be checked
  before the kernel is launched.
* ROCm builds may not bounds-check at all (silent garbage), MPS/XPU/other backends differ
  between releases: all of them are treated as needing a check.
* ``meta`` tensors hold no data; there is nothing to check.

``set_index_check("always")`` forces the check path on CPU (tests, debugging);
``"never"`` trusts the kernels everywhere. The environment variable
``SAFETORCH_INDEX_CHECK`` sets the initial mode.
"""

from __future__ import annotations

import os
import threading
import warnings
from typing import FrozenSet, Optional, cast

import torch

from safetorch import _compat
from safetorch._types import IndexCheckMode

__all__: list = []  # private: the public functions are in safetorch.device

_MODES = ("auto", "always", "never")
# Device types whose index kernels already raise a clean Python exception, or hold no data.
_KERNEL_CHECKED: FrozenSet[str] = frozenset({"cpu", "meta"})

_mode: IndexCheckMode = "auto"
# Hot-path shortcut read by safetorch.tensor: CPU tensors skip the check unless "always".
# (`x.is_cpu` costs ~0.1 us where `x.device.type` costs ~0.7 us.)
cpu_unchecked: bool = True
# Device types that need no pre-check under the current mode. "never" uses _ALL (every type).
_unchecked: FrozenSet[str] | _All


class _All:
    """A set that contains every device type (mode "never")."""

    def __contains__(self, item: object) -> bool:
        return True


_ALL = _All()


def _validate(mode: object, source: str) -> IndexCheckMode:
    if mode not in _MODES:
        raise ValueError(
            f"{source} must be one of {', '.join(repr(m) for m in _MODES)}, got {mode!r}; "
            'use "auto" (check only where kernels do not), "always" (check everywhere, '
            'e.g. to run the CUDA path on CPU) or "never"'
        )
    return cast(IndexCheckMode, mode)


def set_mode(mode: IndexCheckMode) -> IndexCheckMode:
    """``st.set_index_check``'s implementation (see there); returns the previous mode."""
    global _mode, _unchecked, cpu_unchecked
    mode = _validate(mode, "set_index_check(mode)")
    with _lock:
        previous, _mode = _mode, mode
        cpu_unchecked = mode != "always"
        if mode == "auto":
            _unchecked = _KERNEL_CHECKED
        elif mode == "always":
            _unchecked = frozenset()
        else:
            _unchecked = _ALL
    return previous


def get_mode() -> IndexCheckMode:
    """The current index-check mode (``st.get_index_check``)."""
    return _mode


def index_check_needed(x: torch.Tensor, check: Optional[str] = None) -> bool:
    """The device gate: whether an index into ``x`` must be checked before the kernel.

    The one predicate every checked path and the ``index`` patch ask. ``check`` overrides the
    mode for one call. CPU first: ``x.is_cpu`` costs ~0.1 us where ``x.device.type`` costs
    ~0.7 us, and CPU tensors are the common case.
    """
    if check is None:
        if x.is_cpu:
            return not cpu_unchecked
        return x.device.type not in _unchecked
    return needs_index_check(x.device.type, check)


def needs_index_check(device_type: str, mode: Optional[str] = None) -> bool:
    """Whether an index into a tensor on ``device_type`` must be checked before the kernel."""
    if mode is None:
        return device_type not in _unchecked
    if mode == "auto":
        return device_type not in _KERNEL_CHECKED
    return _validate(mode, "check") == "always"


def index_check_reason(device_type: str) -> str:
    """Human explanation of the auto decision for a device type (``safetorch doctor``)."""
    if device_type == "cpu":
        return "CPU kernels raise IndexError/RuntimeError themselves: call torch directly"
    if device_type == "meta":
        return "meta tensors hold no data: nothing to check"
    if device_type == "cuda" and _compat.IS_ROCM:
        return "ROCm kernels may not bounds-check at all: check before launching"
    if device_type == "cuda":
        return "CUDA kernels fail with a device-side assert that kills the context: check first"
    return f"{device_type} kernels are not known to raise cleanly: check first"


def _initial_mode() -> IndexCheckMode:
    value = os.environ.get("SAFETORCH_INDEX_CHECK", "auto").strip().lower() or "auto"
    if value in _MODES:
        return cast(IndexCheckMode, value)
    # A typo in an environment variable must not make `import safetorch` fail.
    from safetorch.errors import SafetorchWarning

    warnings.warn(
        f"SAFETORCH_INDEX_CHECK={value!r} is not one of {', '.join(_MODES)}; using 'auto'",
        SafetorchWarning,
        stacklevel=2,
    )
    return "auto"


_lock = threading.Lock()
_unchecked = _KERNEL_CHECKED
set_mode(_initial_mode())


# --- accelerator / pinning -----------------------------------------------------------------
def _accelerator_available_new() -> bool:
    # torch >= 2.6: one API for CUDA, XPU, MPS, HPU, ... (torch.accelerator). is_available()
    # rather than current_accelerator(): in 2.6 the latter raises when there is none.
    return bool(torch.accelerator.is_available())


def _accelerator_available_old() -> bool:
    # torch < 2.6: only CUDA can pin memory through Tensor.pin_memory().
    return torch.cuda.is_available()


_accelerator_impl = _accelerator_available_old


def accelerator_available() -> bool:
    """Whether memory can be pinned (``st.device.accelerator_available``'s implementation)."""
    return _accelerator_impl()


@_compat.register_binder
def _bind() -> None:
    global _accelerator_impl
    _accelerator_impl = (
        _accelerator_available_new if _compat.HAS_ACCELERATOR else _accelerator_available_old
    )
