"""safetorch: drop-in safe wrappers for PyTorch's well-known pitfalls, without the slowdown.

Use it as ``import safetorch as st``. Importing never patches anything; monkeypatch mode is
opt-in (``st.patch()`` / ``safetorch run``).

The package is lazy (PEP 562): ``import safetorch`` itself imports nothing heavy, and the first
access to a public name (``st.load``, ``st.__all__``, ``dir(st)``) imports the library, torch
included. So ``import safetorch.check`` and the ``safetorch check`` command never import torch
and run where torch is not installed.
"""

from __future__ import annotations

import importlib
from typing import Any, Dict, List

__version__ = "0.1.0.dev0"

# The public surface (``__all__``): the safe functions and classes (one or a few per pitfall,
# see safetorch._pitfalls), the patch API, and the errors and warnings a user catches or
# filters. Everything else is plumbing: importable from its subpackage (``safetorch.checkpoint
# .match_keys``, ``safetorch.nn.recalibrate_bn``, ...) and, so that code written against the
# earlier flat namespace keeps working, still resolved as ``st.<name>``, but not exported by
# ``from safetorch import *`` nor listed by ``dir(safetorch)``.
_PUBLIC = (
    # tensors
    *("safe_copy", "checked_index", "index_select", "gather"),
    # checkpoints
    *("load", "load_state_dict", "save_checkpoint", "CheckpointSaver", "save_state", "load_state"),
    # nn
    *("upsample", "upsample_nearest", "upsample_bilinear", "Upsample"),
    *("SyncBatchNorm", "convert_sync_batchnorm", "lint_model"),
    # data and timing
    *("PinnedBatch", "check_loader", "cuda_timer"),
    # patch API
    *("patch", "unpatch", "patched", "patches"),
    # errors and warnings
    *("SafetorchError", "SafetorchWarning", "CheckpointError", "UnsafeCheckpointError"),
    "IndexOutOfBoundsError",
)
# The areas whose ``__all__`` names stay reachable as ``st.<name>`` (the flat namespace of
# earlier releases).
_STAR_AREAS = ("errors", "tensor", "device", "checkpoint", "nn", "data", "timing", "patching")
_SUBMODULES = (
    *("checkpoint", "data", "device", "errors", "findings"),
    *("nn", "patching", "tensor", "timing", "legacy"),
)
# Helpers of this lazy module: kept out of dir().
_PRIVATE = frozenset({"annotations", "importlib", "Any", "Dict", "List", "_load"})
_PRIVATE |= {"__dir__"}
_PRIVATE |= {"__getattr__", "_loading", "_STAR_AREAS", "_SUBMODULES", "_PUBLIC", "_PRIVATE"}
_loading = False


def _load() -> Dict[str, Any]:
    """Import the library and bind every public name here (once); return the globals."""
    global _loading
    namespace = globals()
    if "__all__" in namespace:
        return namespace
    _loading = True
    try:
        modules = {name: importlib.import_module(f"safetorch.{name}") for name in _SUBMODULES}
        namespace["Finding"] = modules["findings"].Finding
        for area in _STAR_AREAS:
            module = modules[area]
            for name in module.__all__:
                namespace[name] = getattr(module, name)
        namespace["__all__"] = list(_PUBLIC)
    finally:
        _loading = False
    return namespace


def __getattr__(name: str) -> Any:
    # Only names that are not bound yet arrive here (PEP 562): load the library once. Private
    # names and lookups made while the library is importing stay plain AttributeErrors: that
    # is how `from safetorch import _compat` falls back to importing the submodule.
    if _loading or (name.startswith("_") and name != "__all__"):
        raise AttributeError(f"module 'safetorch' has no attribute {name!r}")
    namespace = _load()
    try:
        return namespace[name]
    except KeyError:
        raise AttributeError(f"module 'safetorch' has no attribute {name!r}") from None


def __dir__() -> List[str]:
    # The exported names, the subpackages and the module's dunders (not the flat plumbing).
    namespace = _load()
    shown = {*namespace["__all__"], *_SUBMODULES, "check", "__version__"}
    return sorted(n for n in namespace if n in shown or (n.startswith("__") and n not in _PRIVATE))
