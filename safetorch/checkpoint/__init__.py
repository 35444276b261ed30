"""Checkpoints: safe loading on every torch, wrapper-aware state-dict loading, atomic saving.

``st.load`` (weights-only everywhere, CPU by default, mmap when possible),
``st.load_state_dict`` (through DataParallel/DDP/compile/AveragedModel/FSDP prefixes, from one
file, a shard index, a library directory or a DCP directory, with a :class:`LoadReport`),
``st.save`` (torch.save that records the files a weights-only load would refuse as trusted),
``st.trust`` (the user's word for a file from elsewhere), ``st.save_checkpoint`` and
``st.CheckpointSaver`` (atomic, rank 0 only), ``st.save_state`` /
``st.load_state`` (exact resume: objects, values and RNG, one file or DCP shards), and the key
helpers behind them (``canonical_key``, ``remap_state_dict``, ...).

The names are imported on first use (PEP 562), each from its own module, so that a load
imports only the stages its layout needs (a load of one file never imports the saver, resume
state, RNG or DCP modules). docs/design.md draws the load pipeline.
"""

import importlib
from typing import TYPE_CHECKING, Any, Dict, List

# name -> the module (under safetorch.checkpoint) that defines it
_HOME: Dict[str, str] = {
    "load": "loading",
    "MapToAvailable": "loading",
    "load_state_dict": "model_state",
    "LoadReport": "report",
    "unwrap_model": "keys",
    "canonical_key": "keys",
    "strip_wrapper_prefixes": "keys",
    "remap_state_dict": "keys",
    "match_keys": "keys",
    "KeyMatch": "keys",
    "find_state_dict": "keys",
    "save_checkpoint": "saving",
    "save": "saving",
    "trust": "saving",
    "untrust": "saving",
    "Trusted": "saving",
    "CheckpointSaver": "saver",
    "save_state": "state",
    "load_state": "state",
}

__all__: List[str] = [
    "load",
    "load_state_dict",
    "LoadReport",
    "unwrap_model",
    "save_checkpoint",
    "save",
    "trust",
    "untrust",
    "Trusted",
    "CheckpointSaver",
    "save_state",
    "load_state",
    "canonical_key",
    "strip_wrapper_prefixes",
    "remap_state_dict",
    "match_keys",
    "KeyMatch",
    "find_state_dict",
    "MapToAvailable",
]

if TYPE_CHECKING:
    from safetorch.checkpoint.keys import (
        KeyMatch,
        canonical_key,
        find_state_dict,
        match_keys,
        remap_state_dict,
        strip_wrapper_prefixes,
        unwrap_model,
    )
    from safetorch.checkpoint.loading import MapToAvailable, load
    from safetorch.checkpoint.model_state import load_state_dict
    from safetorch.checkpoint.report import LoadReport
    from safetorch.checkpoint.saver import CheckpointSaver
    from safetorch.checkpoint.saving import Trusted, save, save_checkpoint, trust, untrust
    from safetorch.checkpoint.state import load_state, save_state


def _getattr(name: str) -> Any:
    # Only names not bound yet arrive here. A submodule (`safetorch.checkpoint.keys`) is bound
    # by the import system itself once imported; other names are plain AttributeErrors.
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'safetorch.checkpoint' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"safetorch.checkpoint.{home}"), name)
    globals()[name] = value  # bound: the next access is a plain global lookup
    return value


def __dir__() -> List[str]:
    return sorted({*__all__, *(n for n in globals() if n.startswith("__"))})


# Type checkers must not see a module __getattr__: with one, every misspelt name is `Any`.
if not TYPE_CHECKING:
    __getattr__ = _getattr
