"""Patch ``pin_memory``: DataLoader pinning via ``st.data.pin``, silently off without accelerator.

torch's pin thread (and the single-process iterator) call the module-level function
``torch.utils.data._utils.pin_memory.pin_memory`` by name at call time, so wrapping that one
attribute reaches every DataLoader; no other module binds it at import. ``st.data.pin`` pins
dataclasses and custom batch types that torch passes through unpinned.

Without an accelerator torch 2.x turns pinning off itself but warns on every iterator
("'pin_memory' argument is set as true but no accelerator is found"). The second target
builds each iterator from ``safetorch.data.loader_to_iterate(loader)``: a read-only view whose
``pin_memory`` is False there, so the iterator behaves exactly as torch's would (no pinning)
and says nothing, and the loader object itself is never modified.
"""

from __future__ import annotations

import inspect
from typing import Any, Dict, Optional, Tuple

import torch.utils.data._utils.pin_memory as _torch_pin

from safetorch.patching._registry import Patch, Target, declare
from safetorch.patching._report import record
from safetorch.patching._routing import LazyModule, route

__all__: list = []

_data: Any = LazyModule("safetorch.data")  # at the first pinned batch or loader

_NAME = "pin_memory"
# torch's parameter names (data, device): a call by keyword keeps working, and a call torch
# refuses gets torch's own TypeError (st.data.pin names its first parameter obj).
_SIGNATURE = inspect.signature(_torch_pin.pin_memory)


def _select(instance: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Optional[Any]:
    try:
        bound = _SIGNATURE.bind(*args, **kwargs)
    except TypeError:
        return None
    return bound.arguments["data"], bound.arguments.get("device")


def _pin_body(wrapped: Any, instance: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
    ((batch, device),) = args
    return _data.pin(batch, device)


_pin = route(
    _NAME,
    _pin_body,
    kind="DataLoader pinning -> st.data.pin",
    detail="dataclasses and custom batches pinned",
    select=_select,
)


def _iter_init(wrapped: Any, instance: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
    loader = args[0] if args else kwargs.get("loader")
    if not getattr(loader, "pin_memory", False):
        # loader_to_iterate's own first test: nothing to turn off, and a program whose loaders
        # never pin never imports safetorch.data.
        return wrapped(*args, **kwargs)
    view = _data.loader_to_iterate(loader)
    if view is loader:
        return wrapped(*args, **kwargs)
    record(_NAME, "DataLoader(pin_memory=True) without accelerator", "pinning off, no warning")
    if args:
        return wrapped(view, *args[1:], **kwargs)
    return wrapped(**{**kwargs, "loader": view})


PATCH = declare(
    Patch(
        name=_NAME,
        targets=(
            # Runs on the DataLoader's pin-memory thread: no global warning-state swaps there.
            Target(
                "torch.utils.data._utils.pin_memory", "pin_memory", _pin, attribute_warnings=False
            ),
            Target("torch.utils.data.dataloader", "_BaseDataLoaderIter.__init__", _iter_init),
        ),
    )
)
