"""Checkpoints: safe loading on every torch, wrapper-aware state-dict loading, atomic saving.

``st.load`` (weights-only everywhere, CPU by default, mmap when possible),
``st.load_state_dict`` (through DataParallel/DDP/compile/AveragedModel/FSDP prefixes, from one
file, a shard index, a library directory or a DCP directory, with a :class:`LoadReport`),
``st.save`` (torch.save that records the files a weights-only load would refuse as trusted),
``st.trust`` (the user's word for a file from elsewhere), ``st.save_checkpoint`` and
``st.CheckpointSaver`` (atomic, rank 0 only), ``st.save_state`` /
``st.load_state`` (exact resume: objects, values and RNG, one file or DCP shards), and the key
helpers behind them (``canonical_key``, ``remap_state_dict``, ...).
"""

from typing import List

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
