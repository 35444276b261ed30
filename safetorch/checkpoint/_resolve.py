"""The resolve stage of every load: what the user pointed at, as a layout (nothing opened).

:func:`resolve` turns a path into a :class:`~._layouts.Layout`: a single file, a
``torch.distributed.checkpoint`` (DCP) directory, or a sharded index
(``model.safetensors.index.json`` / ``pytorch_model.bin.index.json``); a directory written by
transformers (``save_pretrained``, ``checkpoint-N/``), accelerate (``save_state``) or
``st.CheckpointSaver`` resolves to the file or index holding the model weights, and says which.
Only names are looked at here (a directory listing; a saver's ``checkpoints.json``, read
through the one reader): the layout opens its files in the next stage.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any, Dict, List, Optional, Tuple

import torch

from safetorch.checkpoint import _reader
from safetorch.checkpoint._formats import DCP_METADATA
from safetorch.checkpoint._layouts import FileLayout, Layout, SafetensorsFile, ShardedIndex
from safetorch.checkpoint.keys import find_state_dict, known_prefixes, state_dict_keys
from safetorch.checkpoint.loading import (
    PathLike,
)
from safetorch.errors import CheckpointError

__all__: List[str] = []  # private module: the resolve stage of st.load_state_dict and the CLI

SAFETENSORS_INDEX = "model.safetensors.index.json"
BIN_INDEX = "pytorch_model.bin.index.json"
# What transformers and accelerate name the model weights file, in the order they are tried.
_MODEL_FILES = (
    SAFETENSORS_INDEX,
    BIN_INDEX,
    "model.safetensors",
    "pytorch_model.bin",
    "diffusion_pytorch_model.safetensors",
    "diffusion_pytorch_model.bin",
    "pytorch_model.pt",
    "model.pt",
    "model.pth",
)
_WEIGHT_SUFFIXES = (".safetensors", ".pt", ".pth", ".bin", ".ckpt", ".tar")
# Files in such directories that are not model weights (never picked, never unpickled here).
_NOT_WEIGHTS = ("optimizer", "scheduler", "scaler", "random_states", "rng_state", "training_args")


# --- CheckpointSaver directories -------------------------------------------------------------
_STATE_FILE = re.compile(r"state-\d+\.pt")


INDEX_NAME = "checkpoints.json"


def _state_names(directory: str) -> List[str]:
    """The ``save_state`` checkpoints (``state-<epoch>.pt``) in ``directory``, newest first."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return sorted((n for n in names if _STATE_FILE.fullmatch(n)), reverse=True)


def saver_checkpoint(
    directory: PathLike, index_name: str = INDEX_NAME
) -> Optional[Tuple[str, str]]:
    """The checkpoint a ``CheckpointSaver`` directory stands for, and what it is.

    The newest complete ``save_state`` checkpoint (the one :meth:`CheckpointSaver.resume`
    restores), else, in a directory of :meth:`CheckpointSaver.save`, the last checkpoint its
    index names (resolved inside the directory by the checkpoint reader). ``safetorch ckpt``
    reads a saver directory through this.

    Returns:
        ``(path, description)``, or ``None`` when ``directory`` is not a ``CheckpointSaver``
        directory (no index, no ``state-<epoch>.pt``).

    Raises:
        CheckpointError: the index is unreadable, or the directory holds no checkpoint yet.

    >>> import tempfile, torch, safetorch as st
    >>> saver = st.CheckpointSaver(tempfile.mkdtemp())
    >>> _ = saver.save({"w": torch.ones(1)}, epoch=3, metric=0.5)
    >>> path, what = saver_checkpoint(saver.directory)
    >>> os.path.basename(path), what
    ('last.pt', 'last checkpoint of CheckpointSaver.save (epoch 3)')
    """
    root = os.path.abspath(os.fsdecode(os.fspath(directory)))
    names = _state_names(root)
    index_path = os.path.join(root, index_name)
    if not names and not os.path.isfile(index_path):
        return None
    path = latest_complete(root, names)
    if path is not None:
        return path, "newest save_state checkpoint (CheckpointSaver.resume restores it)"
    # Inside the directory (a checkpoints.json symlink pointing out is refused), bounded.
    raw = _reader.Root(root).read(index_name, "CheckpointSaver index", _reader.MAX_JSON_BYTES)
    try:
        index = json.loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise CheckpointError(
            f"CheckpointSaver index {index_path!r} is not valid JSON ({str(exc)[:200]}); "
            "delete it to start a fresh index"
        ) from None
    last = index.get("last") if isinstance(index, dict) else None
    if not isinstance(last, dict) or last.get("file") is None:
        raise CheckpointError(
            f"{root!r} is a CheckpointSaver directory that holds no complete checkpoint yet "
            f"({index_name} names none)"
        )
    path = _reader.Root(root).resolve(last["file"], "checkpoint")
    return path, f"last checkpoint of CheckpointSaver.save (epoch {last.get('epoch')})"


def latest_complete(directory: str, names: List[str]) -> Optional[str]:
    """The newest of ``names`` in ``directory`` that is a complete checkpoint (used by
    CheckpointSaver.resume): a file that opens, or a DCP directory with its .metadata."""
    root = _reader.Root(directory)
    for name in names:
        p = root.resolve(name, "checkpoint")  # a state-<epoch>.pt symlink out is refused
        if os.path.isdir(p) and os.path.exists(os.path.join(p, DCP_METADATA)):
            return p
        if os.path.isfile(p) and os.path.getsize(p) > 0:
            return p
    return None


# --- resolution --------------------------------------------------------------------------------
def _is_index(path: str) -> bool:
    return path.endswith(".index.json")


def resolve(path: Any) -> Layout:
    """The layout of a path: the resolve stage of every load.

    A file given directly is a :class:`FileLayout` with no ``description`` (read by
    ``st.load``; a missing path too, which ``st.load`` reports), or a :class:`ShardedIndex`; a
    directory resolves to its DCP checkpoint, its index, or the one weights file in it (whose
    ``description`` says which was picked).

    Raises:
        CheckpointError: a directory holding no model weights, or several candidates (the
            error lists them).
    """
    p = os.fsdecode(os.fspath(path))
    if os.path.isfile(p):
        if _is_index(p):
            return ShardedIndex(p, f"shard index {os.path.basename(p)}")
        return FileLayout(p, None)
    if not os.path.isdir(p):
        if os.path.exists(p):  # a FIFO, socket or device: refused here, never opened
            _reader.open_regular(p, "checkpoint").close()
        return FileLayout(p, None)  # st.load reports the missing file
    names = set(os.listdir(p))
    if DCP_METADATA in names:
        return _dcp_directory(p, f"DCP directory {p!r}")
    saver_error: Optional[CheckpointError] = None
    try:
        saver = saver_checkpoint(p)
    except CheckpointError as exc:  # an index but nothing complete yet: other files may do
        saver, saver_error = None, exc
    if saver is not None:  # the checkpoint CheckpointSaver.resume (or its index) names
        path, what = saver
        where = f"{os.path.basename(path)} in {p!r}, the {what}"
        return _dcp_directory(path, where) if os.path.isdir(path) else _file_layout(path, where)
    for name in _MODEL_FILES:
        if name in names:
            return _file_layout(os.path.join(p, name), f"{name} in {p!r}")
    candidates = sorted(
        n
        for n in names
        if (n.endswith(_WEIGHT_SUFFIXES) or _is_index(n))
        and not any(n.startswith(x) for x in _NOT_WEIGHTS)
        and os.path.isfile(os.path.join(p, n))
    )
    indexes = [n for n in candidates if _is_index(n)]
    if len(indexes) == 1:
        return ShardedIndex(os.path.join(p, indexes[0]), f"{indexes[0]} in {p!r}")
    if len(candidates) == 1:
        return _file_layout(os.path.join(p, candidates[0]), f"{candidates[0]} in {p!r}")
    if not candidates and saver_error is not None:
        raise saver_error
    if not candidates:
        raise CheckpointError(
            f"cannot load checkpoint {p!r}: the directory holds no model weights (no "
            f"{DCP_METADATA}, *.index.json, *.safetensors or torch.save file); its files: "
            f"{sorted(names)[:10]}"
        )
    raise CheckpointError(
        f"cannot load checkpoint {p!r}: the directory holds several weight files "
        f"{candidates[:10]}; pass the one holding the model"
    )


def _dcp_directory(path: str, description: str) -> Layout:
    # Imported here: a load of one file or an index never imports DCP's loader (nor torch's DCP).
    from safetorch.checkpoint._dcp_load import DCPDirectory

    return DCPDirectory(path, description)


def _file_layout(path: str, description: str) -> Layout:
    if _is_index(path):
        return ShardedIndex(path, f"shard index {description}")
    if path.endswith(".safetensors"):
        return SafetensorsFile(path, description)
    return FileLayout(path, description)


def _role(name: str, picked: Optional[str]) -> str:
    if picked is not None and name == picked:
        return "model weights (st.load_state_dict reads this)"
    if name == DCP_METADATA:
        return "DCP metadata (read with the restricted unpickler)"
    if name.endswith(".distcp"):
        return "DCP shard"
    if name.endswith(".index.json"):
        return "shard index"
    for hint in _NOT_WEIGHTS:
        if name.startswith(hint):
            return hint.replace("_", " ")
    if name.endswith((".json", ".txt", ".md", ".yaml")):
        return "metadata"
    if name.endswith(_WEIGHT_SUFFIXES):
        return "weights"
    return "other"


def describe(path: str) -> Dict[str, Any]:
    """A directory or index described file by file, with the one holding the model named."""
    layout = resolve(path)
    if isinstance(layout, FileLayout) and not layout.picked:
        raise CheckpointError(f"{path!r} is a single checkpoint file; inspect it directly")
    root = path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
    model_files = {os.path.basename(f) for f in layout.files()}
    picked = os.path.basename(layout.path) if layout.kind != "DCP directory" else None
    files = []
    for name in sorted(os.listdir(root)):
        full = os.path.join(root, name)
        if not os.path.isfile(full) or name.startswith(".") and name != DCP_METADATA:
            continue
        role = _role(name, picked)
        if name in model_files and role in ("weights", "other"):
            role = "model weights shard"
        files.append({"file": name, "bytes": os.path.getsize(full), "role": role})
    info: Dict[str, Any] = {
        "path": path,
        "layout": layout.kind,
        "model": layout.description,
        "files": files,
    }
    if not isinstance(layout, FileLayout):
        view = layout.meta_view()

        info["state_dicts"] = state_dict_keys(view)
        try:
            sd, key = find_state_dict(view)
            info["state_dict_key"] = key
            info["state_dict_tensors"] = len(sd)
            info["tensor_bytes"] = sum(
                t.numel() * t.element_size() for t in sd.values() if torch.is_tensor(t)
            )
            info["wrapper_prefixes"] = known_prefixes(sd)
        except CheckpointError as exc:
            info["state_dict_note"] = str(exc)
    return info
