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

# The areas whose ``__all__`` make up the public API, in ``__all__`` order; ``errors`` adds its
# names after the four below, as the eager package did.
_STAR_AREAS = ("tensor", "device", "checkpoint", "nn", "data", "timing", "patching")
_SUBMODULES = (
    *("checkpoint", "data", "device", "errors", "findings"),
    *("nn", "patching", "tensor", "timing", "legacy"),
)
_HEAD = ["__version__", "accelerator_available", "get_index_check", "set_index_check", "Finding"]
# Helpers of this lazy module: kept out of dir(), which lists what the eager package had.
_PRIVATE = frozenset({"annotations", "importlib", "Any", "Dict", "List", "_load"})
_PRIVATE |= {"__dir__"}
_PRIVATE |= {"__getattr__", "_loading", "_STAR_AREAS", "_SUBMODULES", "_HEAD", "_PRIVATE"}
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
        device_policy = importlib.import_module("safetorch._device")
        for name in ("accelerator_available", "get_index_check", "set_index_check"):
            namespace[name] = getattr(device_policy, name)
        namespace["Finding"] = modules["findings"].Finding
        errors = modules["errors"]
        for name in errors.__all__:
            namespace[name] = getattr(errors, name)
        public: List[str] = [*_HEAD, *errors.__all__]
        for area in _STAR_AREAS:
            module = modules[area]
            for name in module.__all__:
                namespace[name] = getattr(module, name)
            public.extend(module.__all__)
        namespace["__all__"] = public
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
    return sorted(n for n in _load() if n not in _PRIVATE)
