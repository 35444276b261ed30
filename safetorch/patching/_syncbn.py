"""Patch ``syncbn``: ``nn.SyncBatchNorm.convert_sync_batchnorm`` -> ``st.convert_sync_batchnorm``.

The auto policy keeps plain BatchNorm where nothing would be synchronized (no process group,
or world size 1) and picks a SyncBatchNorm class that runs on each layer's device (CPU under
gloo included). The target is a classmethod: wrapt binds it to the class, and the registry
restores the very ``classmethod`` object found in ``vars(nn.SyncBatchNorm)``.

Calls are bound to torch's signature ``(module, process_group=None)``, plus st's
``policy=`` keyword (which only the patched call accepts); a call that does not bind (no
module, an unknown argument) goes to torch's original, which raises its own ``TypeError``.
"""

from __future__ import annotations

import inspect
from typing import Any, Dict, Optional, Tuple

import torch
from torch import nn

from safetorch import _dist
from safetorch.patching._registry import Patch, Target, declare
from safetorch.patching._report import record
from safetorch.patching._routing import LazyModule, route

__all__: list = []

_NAME = "syncbn"
_impl: Any = LazyModule("safetorch.nn.syncbn")  # at the first patched conversion
_SIGNATURE = inspect.signature(nn.SyncBatchNorm.convert_sync_batchnorm)  # bound: no cls


def _world() -> str:
    if _dist.initialized():
        return f"world size {torch.distributed.get_world_size()}"
    return "no process group: BatchNorm kept"


def _select(instance: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Optional[Any]:
    """``(module, process_group, options)`` for a call that binds; None sends it to torch."""
    options = {k: v for k, v in kwargs.items() if k == "policy"}
    try:
        bound = _SIGNATURE.bind(*args, **{k: v for k, v in kwargs.items() if k != "policy"})
    except TypeError:
        return None  # torch's own error for a bad call
    return bound.arguments["module"], bound.arguments.get("process_group"), options


def _convert_body(wrapped: Any, instance: Any, args: Tuple[Any, ...], kwargs: Dict) -> Any:
    ((module, process_group, options),) = args
    record(_NAME, f"convert_sync_batchnorm -> st.convert_sync_batchnorm ({_world()})")
    return _impl.convert_sync_batchnorm(module, process_group, **options)


_convert = route(_NAME, _convert_body, select=_select)


PATCH = declare(
    Patch(
        name=_NAME,
        targets=(Target("torch.nn", "SyncBatchNorm.convert_sync_batchnorm", _convert),),
    )
)
