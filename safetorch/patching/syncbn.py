"""Patch ``syncbn``: ``nn.SyncBatchNorm.convert_sync_batchnorm`` -> ``st.convert_sync_batchnorm``.

The auto policy keeps plain BatchNorm where nothing would be synchronized (no process group,
or world size 1) and picks a SyncBatchNorm class that runs on each layer's device (CPU under
gloo included). The target is a classmethod: wrapt binds it to the class, and the registry
restores the very ``classmethod`` object found in ``vars(nn.SyncBatchNorm)``.
"""

from __future__ import annotations

import importlib
from typing import Any, Dict, Tuple

import torch

from safetorch import _dist
from safetorch.patching import registry

__all__: list = []

_NAME = "syncbn"
_impl = importlib.import_module("safetorch.nn.syncbn")


def _world() -> str:
    if _dist.initialized():
        return f"world size {torch.distributed.get_world_size()}"
    return "no process group: BatchNorm kept"


def _convert_body(wrapped: Any, instance: Any, args: Tuple[Any, ...], kwargs: Dict) -> Any:
    registry.record(_NAME, f"convert_sync_batchnorm -> st.convert_sync_batchnorm ({_world()})")
    return _impl.convert_sync_batchnorm(*args, **kwargs)


_convert = registry.route(_NAME, _convert_body)


PATCH = registry.declare(
    registry.Patch(
        name=_NAME,
        description=(
            "nn.SyncBatchNorm.convert_sync_batchnorm -> st.convert_sync_batchnorm (auto: keep "
            "BatchNorm without a process group, a class that runs on each device otherwise)"
        ),
        targets=(registry.Target("torch.nn", "SyncBatchNorm.convert_sync_batchnorm", _convert),),
        pitfalls=("torch-syncbn-device",),
        implementation=("safetorch.nn.syncbn", "convert_sync_batchnorm"),
    )
)
