"""safetorch: drop-in safe wrappers for PyTorch's well-known pitfalls, without the slowdown.

Use it as ``import safetorch as st``. Importing never patches anything; monkeypatch mode is
opt-in (``st.patch()`` / ``safetorch run``).

The package is lazy (PEP 562): ``import safetorch`` imports nothing heavy, and the first access
to a name imports only the subpackage that defines it (``st.load`` imports
``safetorch.checkpoint`` and torch, not ``safetorch.nn`` or ``safetorch.patching``). So
``import safetorch.check`` and the ``safetorch check`` command never import torch and run where
torch is not installed.

Type checkers do not run ``__getattr__``: they read the ``TYPE_CHECKING`` imports below, which
give every name of ``dir(safetorch)`` its real signature and make a typo in ``st.<name>`` an
error. tests/core/test_core_typing.py keeps those imports, ``__all__`` and ``_HOME`` in step.
"""

from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING, Any, Dict, List, Tuple

__version__ = "0.1.0.dev0"  # the one version source: pyproject.toml reads it (dynamic)

# The public surface, exported by ``from safetorch import *``: the safe functions and classes
# (one or a few per pitfall, see safetorch._pitfalls), the patch API, and the errors and
# warnings a user catches or filters.
__all__ = [
    # tensors
    *("safe_copy", "checked_index", "index_select", "gather"),
    # checkpoints
    *("load", "load_state_dict", "save_checkpoint", "CheckpointSaver", "save_state", "load_state"),
    "save",
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
]

# Where each name lives: its first use imports that subpackage and nothing else. Besides the
# exported names, the plumbing the docs (and the checker's fixes and messages) write as
# ``st.<name>``: listed by dir() and known to type checkers, but not exported. A test keeps this
# second group equal to what the docs teach; everywhere else plumbing is reached through its
# subpackage (``st.checkpoint.LoadReport``).
_NAMES_BY_AREA: Dict[str, Tuple[str, ...]] = {
    "tensor": (
        *("safe_copy", "checked_index", "index_select", "gather"),
        *("raise_deferred", "clear_deferred"),
    ),
    "device": (
        *("device_of", "assert_same_device", "to_device", "set_index_check", "get_index_check"),
        "accelerator_available",
    ),
    "checkpoint": (
        *("load", "load_state_dict", "save_checkpoint", "CheckpointSaver"),
        *("save_state", "load_state", "save", "trust", "untrust", "Trusted"),
        *("unwrap_model", "canonical_key", "strip_wrapper_prefixes", "remap_state_dict"),
        *("match_keys", "KeyMatch", "find_state_dict", "LoadReport"),
    ),
    "nn": (
        *("upsample", "upsample_nearest", "upsample_bilinear", "Upsample"),
        *("UpsamplingNearest2d", "UpsamplingBilinear2d"),
        *("SyncBatchNorm", "convert_sync_batchnorm", "revert_sync_batchnorm"),
        *("register_sync_batchnorm_converter", "unregister_sync_batchnorm_converter"),
        *("lint_model", "recalibrate_bn", "eval_mode", "bn_report", "BNLayerStats"),
        *("BalancedDataParallel", "PointwiseConv1d"),
    ),
    "data": ("PinnedBatch", "check_loader", "pin", "collate", "SafeDataLoader"),
    "timing": ("cuda_timer", "benchmark", "TimingStats"),
    "patching": ("patch", "unpatch", "patched", "patches"),
    "errors": (
        *("SafetorchError", "SafetorchWarning", "CheckpointError", "UnsafeCheckpointError"),
        *("IndexOutOfBoundsError", "DeviceMismatchError", "DataWarning"),
        *("CheckpointMismatchError", "CheckpointFormatError", "CheckpointFileNotFoundError"),
        *("CheckpointFileObjectError", "CheckpointNotSeekableError", "CheckpointWarning"),
        *("DistributedWarning", "ModelWarning", "PatchWarning", "UnsafeAllowError"),
    ),
    "findings": ("Finding",),
}
_HOME: Dict[str, str] = {n: area for area, names in _NAMES_BY_AREA.items() for n in names}

# The subpackages, reached as ``st.<name>`` (each imported on first access).
_SUBMODULES: Tuple[str, ...] = (
    *("check", "checkpoint", "data", "device", "errors", "findings"),
    *("legacy", "nn", "patching", "tensor", "timing"),
)

if TYPE_CHECKING:
    from . import check as check
    from . import checkpoint as checkpoint
    from . import data as data
    from . import device as device
    from . import errors as errors
    from . import findings as findings
    from . import legacy as legacy
    from . import nn as nn
    from . import patching as patching
    from . import tensor as tensor
    from . import timing as timing
    from .checkpoint import CheckpointSaver as CheckpointSaver
    from .checkpoint import KeyMatch as KeyMatch
    from .checkpoint import LoadReport as LoadReport
    from .checkpoint import Trusted as Trusted
    from .checkpoint import canonical_key as canonical_key
    from .checkpoint import find_state_dict as find_state_dict
    from .checkpoint import load as load
    from .checkpoint import load_state as load_state
    from .checkpoint import load_state_dict as load_state_dict
    from .checkpoint import match_keys as match_keys
    from .checkpoint import remap_state_dict as remap_state_dict
    from .checkpoint import save as save
    from .checkpoint import save_checkpoint as save_checkpoint
    from .checkpoint import save_state as save_state
    from .checkpoint import strip_wrapper_prefixes as strip_wrapper_prefixes
    from .checkpoint import trust as trust
    from .checkpoint import untrust as untrust
    from .checkpoint import unwrap_model as unwrap_model
    from .data import PinnedBatch as PinnedBatch
    from .data import SafeDataLoader as SafeDataLoader
    from .data import check_loader as check_loader
    from .data import collate as collate
    from .data import pin as pin
    from .device import accelerator_available as accelerator_available
    from .device import assert_same_device as assert_same_device
    from .device import device_of as device_of
    from .device import get_index_check as get_index_check
    from .device import set_index_check as set_index_check
    from .device import to_device as to_device
    from .errors import CheckpointError as CheckpointError
    from .errors import CheckpointFileNotFoundError as CheckpointFileNotFoundError
    from .errors import CheckpointFileObjectError as CheckpointFileObjectError
    from .errors import CheckpointFormatError as CheckpointFormatError
    from .errors import CheckpointMismatchError as CheckpointMismatchError
    from .errors import CheckpointNotSeekableError as CheckpointNotSeekableError
    from .errors import CheckpointWarning as CheckpointWarning
    from .errors import DataWarning as DataWarning
    from .errors import DeviceMismatchError as DeviceMismatchError
    from .errors import DistributedWarning as DistributedWarning
    from .errors import IndexOutOfBoundsError as IndexOutOfBoundsError
    from .errors import ModelWarning as ModelWarning
    from .errors import PatchWarning as PatchWarning
    from .errors import SafetorchError as SafetorchError
    from .errors import SafetorchWarning as SafetorchWarning
    from .errors import UnsafeAllowError as UnsafeAllowError
    from .errors import UnsafeCheckpointError as UnsafeCheckpointError
    from .findings import Finding as Finding
    from .nn import BalancedDataParallel as BalancedDataParallel
    from .nn import BNLayerStats as BNLayerStats
    from .nn import PointwiseConv1d as PointwiseConv1d
    from .nn import SyncBatchNorm as SyncBatchNorm
    from .nn import Upsample as Upsample
    from .nn import UpsamplingBilinear2d as UpsamplingBilinear2d
    from .nn import UpsamplingNearest2d as UpsamplingNearest2d
    from .nn import bn_report as bn_report
    from .nn import convert_sync_batchnorm as convert_sync_batchnorm
    from .nn import eval_mode as eval_mode
    from .nn import lint_model as lint_model
    from .nn import recalibrate_bn as recalibrate_bn
    from .nn import register_sync_batchnorm_converter as register_sync_batchnorm_converter
    from .nn import revert_sync_batchnorm as revert_sync_batchnorm
    from .nn import unregister_sync_batchnorm_converter as unregister_sync_batchnorm_converter
    from .nn import upsample as upsample
    from .nn import upsample_bilinear as upsample_bilinear
    from .nn import upsample_nearest as upsample_nearest
    from .patching import patch as patch
    from .patching import patched as patched
    from .patching import patches as patches
    from .patching import unpatch as unpatch
    from .tensor import checked_index as checked_index
    from .tensor import clear_deferred as clear_deferred
    from .tensor import gather as gather
    from .tensor import index_select as index_select
    from .tensor import raise_deferred as raise_deferred
    from .tensor import safe_copy as safe_copy
    from .timing import TimingStats as TimingStats
    from .timing import benchmark as benchmark
    from .timing import cuda_timer as cuda_timer


def _no_attribute(name: str) -> AttributeError:
    return AttributeError(f"module 'safetorch' has no attribute {name!r}")


def _getattr(name: str) -> Any:
    # Only names that are not bound yet arrive here (PEP 562). Private names stay plain
    # AttributeErrors: that is how `from safetorch import _compat` falls back to importing the
    # submodule.
    if name.startswith("_"):
        raise _no_attribute(name)
    if name in _SUBMODULES:
        return importlib.import_module(f"safetorch.{name}")
    home = _HOME.get(name)
    if home is None:
        raise _no_attribute(name)
    value = getattr(importlib.import_module(f"safetorch.{home}"), name)
    if callable(value):  # help(st.<name>) shows `mode: Literal[...]`, not the string 'IndexMode'
        from ._types import unquoted

        value = unquoted(value)
    globals()[name] = value  # bound: the next access is a plain global lookup
    return value


def _knows(name: str) -> bool:
    """Whether ``st.<name>`` exists, known from the lazy table without importing its module
    (how the patches check their functions exist: the first call imports them)."""
    if name in globals() or name in _SUBMODULES:
        return True
    home = _HOME.get(name)
    if home is None:
        return False
    module = sys.modules.get(f"safetorch.{home}")
    return module is None or hasattr(module, name)  # imported: it must have it


def __dir__() -> List[str]:
    # The names of _HOME, the subpackages and the module's dunders.
    dunders = (n for n in globals() if n.startswith("__") and n not in _HIDDEN_DUNDERS)
    return sorted({*_HOME, *_SUBMODULES, *dunders})


_HIDDEN_DUNDERS = frozenset({"__annotations__", "__builtins__", "__dir__", "__getattr__"})

# Type checkers must not see a module __getattr__: with one, every `st.<typo>` is `Any`.
if not TYPE_CHECKING:
    __getattr__ = _getattr
