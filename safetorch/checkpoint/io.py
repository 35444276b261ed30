"""Loading and saving checkpoints, one module per concern, named here together.

``safetorch.checkpoint.loading`` (``st.load``), ``safetorch.checkpoint.model_state``
(``st.load_state_dict``) and ``safetorch.checkpoint.saving`` (``st.save_checkpoint``,
``CheckpointSaver``) hold the implementations; this module keeps the import path
``safetorch.checkpoint.io`` that earlier releases documented.

>>> from safetorch.checkpoint import io
>>> io.load is io.loading.load
True
"""

from __future__ import annotations

from safetorch.checkpoint import loading, model_state, saving
from safetorch.checkpoint.loading import MapToAvailable, load
from safetorch.checkpoint.model_state import load_for_copy, load_state_dict
from safetorch.checkpoint.saving import CheckpointSaver, on_rank0, save_checkpoint

__all__ = ["load", "load_state_dict", "save_checkpoint", "CheckpointSaver"]
_ALSO = (MapToAvailable, load_for_copy, on_rank0, loading, model_state, saving)
