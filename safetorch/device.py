"""Device helpers: where a model or tensor lives, assert they agree, move nested data.

Seed pitfall: "check which device the model and the data are on". ``device_of`` answers it,
``assert_same_device`` fails early with every object's device listed, and ``to_device`` moves
a whole nested batch (mappings, sequences, namedtuples, dataclasses, objects with ``.to``)
with ``non_blocking`` only where it is safe and useful (from pinned memory).
"""

from __future__ import annotations

import itertools
from typing import Any, List, Optional, Union

import torch

from safetorch import _device
from safetorch._nest import DESCEND, map_tensors
from safetorch._types import IndexCheckMode, unquoted
from safetorch.errors import DeviceMismatchError

__all__ = [
    "device_of",
    "assert_same_device",
    "to_device",
    "set_index_check",
    "get_index_check",
    "accelerator_available",
]

DeviceLike = Union[torch.device, str, int]


def _describe(obj: Any) -> str:
    if isinstance(obj, torch.Tensor):
        return f"Tensor{list(obj.shape)}"
    return type(obj).__name__


def _module_devices(module: torch.nn.Module) -> "List[torch.device]":
    seen: "List[torch.device]" = []
    for t in itertools.chain(module.parameters(), module.buffers()):
        if t.device not in seen:
            seen.append(t.device)
    return seen


def device_of(obj: Union[torch.nn.Module, torch.Tensor]) -> Optional[torch.device]:
    """Return the device of a tensor, or the one device of a module's parameters and buffers.

    Args:
        obj: A tensor or an ``nn.Module``.

    Returns:
        The device; ``None`` for a module without parameters or buffers.

    Raises:
        DeviceMismatchError: the module's parameters/buffers are spread over several devices
            (model parallel): the message lists them.
        TypeError: ``obj`` is neither a tensor nor a module.

    >>> import torch, safetorch as st
    >>> st.device_of(torch.nn.Linear(2, 2))
    device(type='cpu')
    """
    if isinstance(obj, torch.Tensor):
        return obj.device
    if isinstance(obj, torch.nn.Module):
        devices = _module_devices(obj)
        if not devices:
            return None
        if len(devices) > 1:
            raise DeviceMismatchError(
                f"{type(obj).__name__} has parameters/buffers on several devices "
                f"({', '.join(map(str, devices))}); device_of needs one. Move it with "
                f"model.to(device), or ask for the device of a specific submodule or tensor."
            )
        return devices[0]
    raise TypeError(
        f"device_of expects a torch.Tensor or torch.nn.Module, got {type(obj).__name__}; "
        "for nested data use st.to_device or pass one tensor of it"
    )


def assert_same_device(*objs: Union[torch.nn.Module, torch.Tensor]) -> Optional[torch.device]:
    """Raise unless every tensor/module given lives on one device; return that device.

    Args:
        *objs: Tensors and/or modules (a module counts with every device it uses).

    Returns:
        The common device (``None`` when no argument has one).

    Raises:
        DeviceMismatchError: the message lists each argument with its device(s).

    >>> import torch, safetorch as st
    >>> st.assert_same_device(torch.nn.Linear(2, 2), torch.zeros(3, 2))
    device(type='cpu')
    """
    found: "List[tuple[int, Any, List[torch.device]]]" = []
    for i, obj in enumerate(objs):
        if isinstance(obj, torch.Tensor):
            devs = [obj.device]
        elif isinstance(obj, torch.nn.Module):
            devs = _module_devices(obj)
        else:
            raise TypeError(
                f"assert_same_device argument {i} is {type(obj).__name__}; "
                "expected torch.Tensor or torch.nn.Module"
            )
        found.append((i, obj, devs))
    distinct = {d for _, _, devs in found for d in devs}
    if len(distinct) > 1:
        lines = ", ".join(
            f"arg {i} ({_describe(obj)}) on {'+'.join(map(str, devs)) or 'no device'}"
            for i, obj, devs in found
        )
        raise DeviceMismatchError(
            f"expected all tensors and modules on one device, got {lines}. "
            "Move them with .to(device) (st.to_device for nested data)."
        )
    return next(iter(distinct)) if distinct else None


def to_device(obj: Any, device: DeviceLike, non_blocking: Optional[bool] = None) -> Any:
    """Move every tensor in a nested structure (and objects with ``.to``) to ``device``.

    Objects with a callable ``.to`` (modules, batch classes) are moved with it; the walker
    recurses through mappings, sequences, tuples, namedtuples and dataclasses, rebuilding
    each container (the rules of ``safetorch._nest``, shared with :func:`safetorch.pin` and
    :func:`safetorch.safe_copy`); everything else is returned unchanged.

    Args:
        obj: A tensor or nested structure.
        device: Target device.
        non_blocking: ``None`` (default) copies asynchronously only from pinned memory, where
            it is both safe and faster; ``True``/``False`` force it for every tensor.

    Returns:
        The moved structure (tensors already on ``device`` are returned as they are).

    >>> import torch, safetorch as st
    >>> batch = {"x": torch.zeros(2), "meta": ("id", [torch.ones(1)])}
    >>> st.to_device(batch, "cpu")["meta"][1][0].device
    device(type='cpu')
    """
    target = torch.device(device)

    if non_blocking is None:

        def move(t: torch.Tensor) -> torch.Tensor:
            # Asynchronous copies are only asynchronous (and only safe to overlap) from
            # pinned host memory; asking for them elsewhere silently synchronises.
            nb = t.device.type == "cpu" and target.type != "cpu" and t.is_pinned()
            return t.to(target, non_blocking=nb)

    else:

        def move(t: torch.Tensor) -> torch.Tensor:
            return t.to(target, non_blocking=non_blocking)

    def move_itself(o: Any) -> Any:
        # Modules, batch classes, TensorDicts: an object with its own .to() moves itself.
        to = getattr(o, "to", None)
        if not callable(to):
            return DESCEND
        if non_blocking is None:
            return to(target)
        return to(target, non_blocking=non_blocking)

    return map_tensors(move, obj, own=move_itself)


@unquoted
def set_index_check(mode: IndexCheckMode) -> IndexCheckMode:
    """Set where safetorch checks index bounds before launching an indexing kernel.

    Args:
        mode: ``"auto"`` (check on every device whose kernels do not raise cleanly: CUDA,
            ROCm, MPS, XPU, ...), ``"always"`` (also on CPU), or ``"never"``.

    Returns:
        The previous mode, so it can be restored.

    Raises:
        ValueError: ``mode`` is not one of the three.

    >>> import safetorch as st
    >>> previous = st.set_index_check("always")
    >>> st.get_index_check()
    'always'
    >>> _ = st.set_index_check(previous)
    """
    return _device.set_mode(mode)


@unquoted
def get_index_check() -> IndexCheckMode:
    """Return the current index-check mode (``"auto"``, ``"always"`` or ``"never"``).

    >>> import safetorch as st
    >>> st.get_index_check() in ("auto", "always", "never")
    True
    """
    return _device.get_mode()


def accelerator_available() -> bool:
    """Whether an accelerator (CUDA, XPU, MPS, ...) is present, so memory can be pinned.

    Dispatches by torch version: ``torch.accelerator`` where it exists (2.6+),
    ``torch.cuda.is_available()`` otherwise.

    >>> import safetorch as st
    >>> isinstance(st.accelerator_available(), bool)
    True
    """
    return _device.accelerator_available()
