"""Builders for the hostile multi-file checkpoints of ``test_hostile_dirs.py`` (trusted code).

Imported by the test (to build directories from real saves and raw bytes) and by
``_hostile_child.py`` (to build the target models by name). Nothing here reads an untrusted file:
the one ``pickle.load`` rewrites DCP metadata this module wrote itself.
"""

from __future__ import annotations

import io
import json
import logging
import os
import pickle
import struct
import warnings
import zipfile
from typing import Any, Callable, Dict, List, Mapping, Optional

import torch
from torch import nn


# --- models, built by name in the child ------------------------------------------------------
class Small(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 3)
        self.bn = nn.BatchNorm1d(3)
        self.b = nn.Linear(3, 2)


class TensorExtra(nn.Module):
    """TransformerEngine style: the extra state is a tensor (an FP8 scale, say)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(2, 2))
        self.scale = torch.randn(4)

    def get_extra_state(self) -> torch.Tensor:
        return self.scale.clone()

    def set_extra_state(self, state: Any) -> None:
        if not isinstance(state, torch.Tensor):
            raise TypeError(f"extra state must be a tensor, got {type(state).__name__}")
        self.scale = state.clone()


class DictExtra(nn.Module):
    """Extra state that is a dict (DCP flattens it and pickles its non-tensor values)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(2, 2))
        self.extra: Dict[str, Any] = {"step": 0, "name": "init", "t": torch.zeros(3)}

    def get_extra_state(self) -> Dict[str, Any]:
        return dict(self.extra)

    def set_extra_state(self, state: Any) -> None:
        self.extra = dict(state)


class WithTensorExtra(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 2)
        self.ext = TensorExtra()


class WithDictExtra(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 2)
        self.ext = DictExtra()


class Wide(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)


class Many(nn.Module):
    def __init__(self, n: int = 20_000) -> None:
        super().__init__()
        self.p = nn.ParameterList([nn.Parameter(torch.randn(1)) for _ in range(n)])


def _averaged() -> nn.Module:
    return torch.optim.swa_utils.AveragedModel(Small())


MODELS: Dict[str, Callable[[], nn.Module]] = {
    "small": Small,
    "tensor_extra": WithTensorExtra,
    "dict_extra": WithDictExtra,
    "wide": Wide,
    "many": Many,
    "averaged": _averaged,
}


def make_model(name: str, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    model = MODELS[name]()
    if name == "dict_extra":  # non-tensor extra state that differs between seeds
        model.ext.extra = {"step": seed, "name": f"seed{seed}", "t": torch.randn(3)}
    return model


def trusted_state(name: str, seed: int) -> Dict[str, Any]:
    """The state a model of ``seed`` saves (what every successful load must reproduce)."""
    model = make_model(name, seed)
    if name == "averaged":
        src = Small()
        for _ in range(3):
            model.update_parameters(src)
    return {k: _detach(v) for k, v in model.state_dict().items()}


def _detach(v: Any) -> Any:
    return v.detach().clone() if isinstance(v, torch.Tensor) else v


# --- payload -----------------------------------------------------------------------------------
SENTINEL = "_hostile_sentinel"


def payload_code(marker: str) -> str:
    """What a hostile pickle runs: a marker file, a poisoned sentinel and builtins."""
    return (
        f"open({marker!r}, 'w').write('pwned'); import sys, builtins; "
        f"s = sys.modules.get({SENTINEL!r}); s is not None and setattr(s, 'state', 'poisoned'); "
        "builtins._hostile_poisoned = True"
    )


class Evil:
    """Pickles as ``exec(payload)``: plain pickle (DCP's default planner) runs it."""

    def __init__(self, marker: str) -> None:
        self.code = payload_code(marker)

    def __reduce__(self):
        return (exec, (self.code,))


# --- DCP -------------------------------------------------------------------------------------
# What the release offers on one process: dcp.save / dcp.load with checkpoint_id= (torch 2.3+),
# before it save_state_dict / load_state_dict with no_dist=True (safetorch._compat.
# DCP_HAS_SAVE_LOAD); both run DCP's default planner.
def save_dcp(obj: Mapping[str, Any], directory: str) -> None:
    import torch.distributed.checkpoint as dcp

    from safetorch import _compat

    logging.disable(logging.INFO)  # DCP's own logger is chatty at DEBUG
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if _compat.DCP_HAS_SAVE_LOAD:
                dcp.save(dict(obj), checkpoint_id=directory)
            else:
                writer = dcp.FileSystemWriter(directory)
                dcp.save_state_dict(dict(obj), storage_writer=writer, no_dist=True)
    finally:
        logging.disable(logging.NOTSET)


def load_dcp(state_dict: Dict[str, Any], directory: str) -> None:
    """torch's own DCP load into ``state_dict``, in place: DCP's default planner and reader."""
    import torch.distributed.checkpoint as dcp

    from safetorch import _compat

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if _compat.DCP_HAS_SAVE_LOAD:
            dcp.load(state_dict, checkpoint_id=directory)
        else:
            reader = dcp.FileSystemReader(directory)
            dcp.load_state_dict(state_dict, storage_reader=reader, no_dist=True)


def read_metadata(directory: str) -> Any:
    with open(os.path.join(directory, ".metadata"), "rb") as fh:
        return pickle.load(fh)  # our own file, written by save_dcp above


def write_metadata(directory: str, metadata: Any) -> None:
    with open(os.path.join(directory, ".metadata"), "wb") as fh:
        pickle.dump(metadata, fh)


def rewrite_metadata(directory: str, fn: Callable[[Any], None]) -> None:
    md = read_metadata(directory)
    fn(md)
    write_metadata(directory, md)


def distcp_files(directory: str) -> List[str]:
    return sorted(n for n in os.listdir(directory) if n.endswith(".distcp"))


def save_two_chunk_dcp(sd: Mapping[str, torch.Tensor], directory: str) -> None:
    """A DCP directory whose ``lin.weight`` (8x8) is stored as two row chunks, the way a
    2-rank sharded save writes it: saved as two halves, then joined in the metadata."""
    from torch.distributed.checkpoint.metadata import (
        ChunkStorageMetadata,
        MetadataIndex,
        TensorStorageMetadata,
    )

    w = sd["lin.weight"]
    save_dcp(
        {"lin.weight_a": w[:4].clone(), "lin.weight_b": w[4:].clone(), "lin.bias": sd["lin.bias"]},
        directory,
    )

    def join(md: Any) -> None:
        a = md.state_dict_metadata.pop("lin.weight_a")
        md.state_dict_metadata.pop("lin.weight_b")
        md.state_dict_metadata["lin.weight"] = TensorStorageMetadata(
            properties=a.properties,
            size=torch.Size([8, 8]),
            chunks=[
                ChunkStorageMetadata(offsets=torch.Size([0, 0]), sizes=torch.Size([4, 8])),
                ChunkStorageMetadata(offsets=torch.Size([4, 0]), sizes=torch.Size([4, 8])),
            ],
        )
        sa = md.storage_data.pop(MetadataIndex("lin.weight_a", [0, 0]))
        sb = md.storage_data.pop(MetadataIndex("lin.weight_b", [0, 0]))
        md.storage_data[MetadataIndex("lin.weight", [0, 0])] = sa
        md.storage_data[MetadataIndex("lin.weight", [4, 0])] = sb
        if isinstance(getattr(md, "planner_data", None), dict):
            md.planner_data.pop("lin.weight_a", None)
            md.planner_data.pop("lin.weight_b", None)
            md.planner_data["lin.weight"] = ("lin.weight",)

    rewrite_metadata(directory, join)


# --- safetensors, written from raw bytes (no safetensors package needed) ---------------------
ST_DTYPES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}


def tensor_bytes(t: torch.Tensor) -> bytes:
    t = t.detach().contiguous().cpu()
    if t.numel() == 0:
        return b""
    return t.reshape(-1).view(torch.uint8).numpy().tobytes()


def safetensors_header(tensors: Mapping[str, torch.Tensor]) -> Dict[str, Any]:
    header: Dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for key in sorted(tensors):
        t = tensors[key]
        n = len(tensor_bytes(t))
        header[key] = {
            "dtype": ST_DTYPES[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + n],
        }
        offset += n
    return header


def safetensors_bytes(
    tensors: Mapping[str, torch.Tensor], header: Optional[Dict[str, Any]] = None
) -> bytes:
    """A .safetensors file: 8-byte little-endian header length, JSON header (space padded to
    8 bytes, as the safetensors writer does), then the tensors' bytes in key order."""
    if header is None:
        header = safetensors_header(tensors)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    data = b"".join(tensor_bytes(tensors[k]) for k in sorted(tensors))
    return struct.pack("<Q", len(text)) + text + data


def split(sd: Mapping[str, Any], n: int) -> List[Dict[str, Any]]:
    keys = list(sd)
    per = -(-len(keys) // n)
    return [{k: sd[k] for k in keys[i * per : (i + 1) * per]} for i in range(n)]


def save_sharded_safetensors(sd: Mapping[str, torch.Tensor], directory: str, n: int = 2) -> None:
    os.makedirs(directory, exist_ok=True)
    weight_map = {}
    for i, part in enumerate(split(sd, n), 1):
        name = f"model-{i:05d}-of-{n:05d}.safetensors"
        with open(os.path.join(directory, name), "wb") as fh:
            fh.write(safetensors_bytes(part))
        weight_map.update((k, name) for k in part)
    write_index(directory, "model.safetensors.index.json", weight_map)


def save_sharded_bin(sd: Mapping[str, torch.Tensor], directory: str, n: int = 2) -> None:
    os.makedirs(directory, exist_ok=True)
    weight_map = {}
    for i, part in enumerate(split(sd, n), 1):
        name = f"pytorch_model-{i:05d}-of-{n:05d}.bin"
        torch.save(part, os.path.join(directory, name))
        weight_map.update((k, name) for k in part)
    write_index(directory, "pytorch_model.bin.index.json", weight_map)


def write_index(directory: str, name: str, weight_map: Any, total: int = 0) -> str:
    path = os.path.join(directory, name)
    with open(path, "w") as fh:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, fh)
    return path


def read_index(directory: str, name: str) -> Dict[str, Any]:
    with open(os.path.join(directory, name)) as fh:
        return json.load(fh)


def save_transformers_dir(sd: Mapping[str, torch.Tensor], directory: str) -> None:
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "config.json"), "w") as fh:
        json.dump({"model_type": "small", "architectures": ["Small"]}, fh)
    with open(os.path.join(directory, "generation_config.json"), "w") as fh:
        json.dump({"max_length": 8}, fh)
    with open(os.path.join(directory, "model.safetensors"), "wb") as fh:
        fh.write(safetensors_bytes(sd))


def save_many_shards(sd: Mapping[str, torch.Tensor], directory: str) -> None:
    """One shard per tensor (20k shards for the ``many`` model)."""
    os.makedirs(directory, exist_ok=True)
    weight_map = {}
    n = len(sd)
    for i, (key, t) in enumerate(sd.items(), 1):
        name = f"model-{i:05d}-of-{n:05d}.safetensors"
        with open(os.path.join(directory, name), "wb") as fh:
            fh.write(safetensors_bytes({key: t}))
        weight_map[key] = name
    write_index(directory, "model.safetensors.index.json", weight_map)


# --- torch.save zips, edited by hand ---------------------------------------------------------
def rewrite_zip(path: str, edit: Callable[[str, bytes], Optional[bytes]]) -> List[str]:
    """Rewrite the zip at ``path`` member by member; ``edit(name, data)`` returns the new data
    (``None`` keeps it). Returns the names edited."""
    with zipfile.ZipFile(path) as z:
        members = [(info, z.read(info)) for info in z.infolist()]
    edited = []
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as out:
        for info, data in members:
            new = edit(info.filename, data)
            if new is not None and new != data:
                edited.append(info.filename)
                data = new
            out.writestr(info.filename, data)
    with open(path, "wb") as fh:
        fh.write(buf.getvalue())
    return edited


def truncate_storage_record(path: str, record: str = "data/0") -> List[str]:
    """Cut the storage record ``*/data/0`` of a torch.save zip to half its length."""
    return rewrite_zip(
        path, lambda name, data: data[: len(data) // 2] if name.endswith("/" + record) else None
    )
