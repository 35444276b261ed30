"""The ``torch.distributed.checkpoint`` format's facts: its ``.metadata`` read and checked.

DCP's ``.metadata`` is a pickle: it is read once through the one reader, unpickled with
safetorch's restricted unpickler and an allow-list of DCP's metadata classes (never with plain
pickle), and checked against the directory before DCP itself may see it: every record inside
its ``.distcp`` file, every tensor's chunks covering it, ``planner_data`` matching DCP's own
flattening. :func:`nest_flat_keys` turns DCP's flat keys back into the nested object saved.

This module reads no tensor data: loading (the safe DCP reader and planners) is
:mod:`safetorch.checkpoint._dcp_load`, which builds on it, as ``safetorch ckpt verify`` does.
"""

from __future__ import annotations

import io
import math
import os
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple

import torch

from safetorch.checkpoint import _reader, _unpickler
from safetorch.checkpoint._formats import DCP_METADATA as DCP_METADATA
from safetorch.errors import CheckpointError, UnsafeCheckpointError

__all__: List[str] = []  # private module: the DCP stage of safetorch.checkpoint


def _meta(shape: Any, dtype: torch.dtype) -> torch.Tensor:
    return torch.empty(tuple(shape), dtype=dtype, device="meta")


class BytesEntry:
    """A DCP entry holding a pickled object (not a tensor), in a meta view: it is read only
    through the restricted unpickler, and never into a tensor of the model."""

    __slots__ = ("key",)

    def __init__(self, key: str) -> None:
        self.key = key

    def __repr__(self) -> str:
        return "<pickled object>"


def _is_state_value(key: str, value: Any) -> bool:
    return isinstance(value, torch.Tensor) or key.endswith("_extra_state")


def nest_flat_keys(flat: Mapping[str, Any], paths: Optional[Mapping[str, Any]] = None) -> Any:
    """``{"model.0.weight": t, "epoch": b}`` -> ``{"model": {"0.weight": t}, "epoch": b}``.

    ``paths`` (DCP's ``planner_data``, checked by :func:`check_planner_data`) gives each flat
    key's original path and decides the nesting. Without it, a flat mapping whose entries are
    all tensors (or ``*_extra_state``) is a state dict as it is (DCP of a bare
    ``model.state_dict()``); otherwise keys are grouped by their first segment, the way DCP
    flattened the nested dict it saved.

    >>> nest_flat_keys({"model.w": 1, "epoch": 2}, {"model.w": ("model", "w"), "epoch": ("epoch",)})
    {'model': {'w': 1}, 'epoch': 2}
    """
    if paths:
        out: Dict[Any, Any] = {}
        for key, value in flat.items():
            path = paths.get(key, (key,))
            node = out
            for part in path[:-1]:
                child = node.setdefault(part, {})
                if not isinstance(child, dict):
                    raise CheckpointError(
                        f"DCP planner_data nests {key!r} under {part!r}, which holds a value"
                    )
                node = child
            node[path[-1]] = value
        return _lists_from_int_keys(out, len(flat))
    if flat and all(_is_state_value(k, v) for k, v in flat.items()):
        return dict(flat)
    nested: Dict[str, Any] = {}
    for key, value in flat.items():
        head, dot, rest = key.partition(".")
        if not dot:
            nested[head] = value
            continue
        group = nested.setdefault(head, {})
        if isinstance(group, dict):
            group[rest] = value
    return nested


def _lists_from_int_keys(node: Any, bound: int, depth: int = 0) -> Any:
    """Dicts whose keys are all ints back into lists, as DCP's own unflattening rebuilds them
    (``param_groups.0.lr`` came from a list); missing indices are ``None``, as DCP fills
    them. An index is below the number of flat entries (``bound``): planner_data cannot ask
    for a list longer than the checkpoint holds."""
    if not isinstance(node, dict) or depth > 100:
        return node
    items = {k: _lists_from_int_keys(v, bound, depth + 1) for k, v in node.items()}
    if items and all(type(k) is int for k in items):
        top = max(items)
        if min(items) < 0 or top >= bound:
            raise CheckpointError(
                f"DCP planner_data puts an entry at list index {top if top >= bound else min(items)}"
                f", outside a list of at most {bound} entries"
            )
        out: List[Any] = [None] * (top + 1)
        for k, v in items.items():
            out[k] = v
        return out
    return items


_DCP_METADATA_GLOBALS = (
    "torch.distributed.checkpoint.metadata.Metadata",
    "torch.distributed.checkpoint.metadata.TensorStorageMetadata",
    "torch.distributed.checkpoint.metadata.BytesStorageMetadata",
    "torch.distributed.checkpoint.metadata.ChunkStorageMetadata",
    "torch.distributed.checkpoint.metadata.TensorProperties",
    "torch.distributed.checkpoint.metadata.MetadataIndex",
    "torch.distributed.checkpoint.metadata.StorageMeta",
    "torch.distributed.checkpoint.metadata._MEM_FORMAT_ENCODING",
    # torch 2.0-2.1's DCP pickles sharded_tensor's TensorProperties (moved into DCP in 2.2)
    "torch.distributed._shard.sharded_tensor.metadata.TensorProperties",
    "torch.distributed._shard.sharded_tensor.metadata.MEM_FORMAT_ENCODING",
    "torch.distributed.checkpoint.filesystem._StorageInfo",
    "torch.distributed.checkpoint.filesystem._StoragePrefix",
    "pathlib.PosixPath",
    "pathlib.WindowsPath",
    "pathlib.PurePosixPath",
    "pathlib.PureWindowsPath",
)


# Chunks per tensor beyond which the pairwise overlap test is replaced by the volume test alone
# (DCP writes one chunk per rank and shard; thousands only on very large jobs).
_PAIRWISE_CHUNKS = 2048


class DCPMetadata:
    """DCP's ``.metadata``, read once through the restricted unpickler and checked against the
    directory: ``metadata`` (DCP's object), ``files`` (relative path -> identity)."""

    __slots__ = ("directory", "metadata", "files")

    def __init__(self, directory: str, metadata: Any, files: Dict[str, _reader.Identity]) -> None:
        self.directory = directory
        self.metadata = metadata
        self.files = files


def read_dcp_metadata(directory: str) -> Any:
    """DCP's ``.metadata`` through the restricted unpickler (DCP's metadata classes only), read
    once through the one reader and checked (:func:`check_dcp_metadata`); returns DCP's
    ``Metadata`` object. :func:`dcp_metadata` also returns what the check found."""
    return dcp_metadata(directory).metadata


def dcp_metadata(directory: str) -> DCPMetadata:
    """Read, unpickle (restricted) and check a DCP directory's ``.metadata`` once."""
    root = _reader.Root(directory)
    raw = root.read(DCP_METADATA, "DCP metadata", limit=_reader.MAX_METADATA_BYTES)
    path = os.path.join(root.path, DCP_METADATA)
    allowed = {}
    for name in _DCP_METADATA_GLOBALS:
        try:
            allowed[name] = _unpickler.import_global(name)
        except (ImportError, AttributeError):
            continue  # a class this torch's DCP does not have: no file of it needs it
    module = _unpickler.make_restricted_pickle_module(allowed)
    try:
        metadata = module.Unpickler(io.BytesIO(raw), encoding="utf-8").load()
    except _unpickler.RefusedGlobal as exc:
        raise UnsafeCheckpointError(
            f"refused to read the DCP metadata {path!r}: it references {exc.name!r}, which "
            "is not a DCP metadata class; nothing from the file was executed",
            (exc.name,),
        ) from None
    except Exception as exc:  # RecursionError, MemoryError and corrupt pickles included
        raise CheckpointError(
            f"cannot read the DCP metadata {path!r}: {type(exc).__name__}: {exc}"
        ) from exc
    files = check_dcp_metadata(metadata, root, path)
    return DCPMetadata(root.path, metadata, files)


def _bad_dcp(path: str, why: str) -> CheckpointError:
    return CheckpointError(f"the DCP metadata {path!r} is not valid: {why}")


def _ints(value: Any, n: Optional[int] = None) -> bool:
    try:
        items = list(value)
    except TypeError:
        return False
    return all(type(v) is int and v >= 0 for v in items) and (n is None or len(items) == n)


def check_dcp_metadata(metadata: Any, root: _reader.Root, path: str) -> Dict[str, _reader.Identity]:
    """Check everything DCP would trust in ``.metadata``: types, every record's file (inside
    the directory, a regular file, the record within it), every tensor's chunks (in bounds,
    not overlapping, covering the tensor), and a record for every chunk and bytes entry.
    Returns the identity of each record file, for the reads to come. Linear in the metadata
    (pairwise chunk overlap up to ``_PAIRWISE_CHUNKS`` chunks per tensor)."""
    from torch.distributed.checkpoint.metadata import (
        BytesStorageMetadata,
        Metadata,
        MetadataIndex,
        TensorStorageMetadata,
    )

    if not isinstance(metadata, Metadata):
        raise _bad_dcp(path, f"it holds a {type(metadata).__name__}, not DCP's Metadata")
    entries = getattr(metadata, "state_dict_metadata", None)
    storage = getattr(metadata, "storage_data", None)
    if not isinstance(entries, dict) or not isinstance(storage, dict):
        raise _bad_dcp(path, "state_dict_metadata or storage_data is not a dict")
    files: Dict[str, _reader.Identity] = {}
    sizes: Dict[str, int] = {}
    for index, info in storage.items():
        if not isinstance(index, MetadataIndex):
            raise _bad_dcp(path, f"a storage_data key is a {type(index).__name__}")
        rel = getattr(info, "relative_path", None)
        offset, length = getattr(info, "offset", None), getattr(info, "length", None)
        if not isinstance(rel, str) or type(offset) is not int or type(length) is not int:
            raise _bad_dcp(path, f"record {index.fqn!r} has storage info {info!r:.120}")
        if getattr(info, "transform_descriptors", None):
            raise CheckpointError(
                f"the DCP checkpoint {root.path!r} stores {index.fqn!r} with transforms "
                f"{list(info.transform_descriptors)!r:.80} (a storage extension, e.g. "
                "compression), which safetorch does not read; load it with the DCP planner "
                "that wrote it, or re-save it without the extension"
            )
        if rel not in sizes:
            with root.open(rel, "DCP record file") as f:
                files[rel] = f.identity
                sizes[rel] = f.size
        if offset < 0 or length < 0 or offset + length > sizes[rel]:
            raise _bad_dcp(
                path,
                f"record {index.fqn!r} claims bytes {offset}..{offset + length} of {rel!r}, "
                f"which has {sizes[rel]} bytes (truncated or corrupt)",
            )
    for key, md in entries.items():
        if not isinstance(key, str):
            raise _bad_dcp(path, f"an entry key is a {type(key).__name__}, not a str")
        if isinstance(md, BytesStorageMetadata):
            if MetadataIndex(key) not in storage:
                raise _bad_dcp(path, f"bytes entry {key!r} has no record")
            continue
        if not isinstance(md, TensorStorageMetadata):
            raise _bad_dcp(path, f"entry {key!r} is a {type(md).__name__}")
        size = md.size
        dtype = getattr(getattr(md, "properties", None), "dtype", None)
        if (
            not isinstance(size, torch.Size)
            or not _ints(size)
            or not isinstance(dtype, torch.dtype)
        ):
            raise _bad_dcp(path, f"tensor {key!r} has size {size!r:.80} and dtype {dtype!r:.40}")
        _check_chunks(key, md, size, storage, path)
    return files


def _check_chunks(
    key: str, md: Any, size: torch.Size, storage: Mapping[Any, Any], path: str
) -> None:
    from torch.distributed.checkpoint.metadata import MetadataIndex

    chunks = md.chunks
    if not isinstance(chunks, list):
        raise _bad_dcp(path, f"tensor {key!r} has chunks {chunks!r:.80}")
    ndim = len(size)
    boxes: List[Tuple[Tuple[int, ...], Tuple[int, ...]]] = []
    volume = 0
    for chunk in chunks:
        offsets, lengths = getattr(chunk, "offsets", None), getattr(chunk, "sizes", None)
        if not _ints(offsets, ndim) or not _ints(lengths, ndim):
            raise _bad_dcp(path, f"tensor {key!r} has a chunk {chunk!r:.120}")
        lo, ln = tuple(offsets or ()), tuple(lengths or ())
        if any(o + n > d for o, n, d in zip(lo, ln, size)):
            raise _bad_dcp(
                path,
                f"tensor {key!r} of size {list(size)} has a chunk at {list(lo)} "
                f"of size {list(ln)} outside it",
            )
        if MetadataIndex(key, torch.Size(lo)) not in storage:
            raise _bad_dcp(path, f"tensor {key!r}'s chunk at {list(lo)} has no record")
        volume += math.prod(ln)
        boxes.append((lo, ln))
    if volume != math.prod(size):
        raise CheckpointError(
            f"the DCP checkpoint {os.path.dirname(path)!r} is incomplete: the chunks of "
            f"{key!r} cover {volume} of its {math.prod(size)} elements (a shard is missing or "
            "the metadata is corrupt); nothing was loaded from it"
        )
    if len(boxes) <= _PAIRWISE_CHUNKS:
        for i, (a, an) in enumerate(boxes):
            for b, bn in boxes[i + 1 :]:
                if all(x < y + m and y < x + n for x, n, y, m in zip(a, an, b, bn)) and all(
                    n and m for n, m in zip(an, bn)
                ):
                    raise _bad_dcp(
                        path, f"tensor {key!r} has overlapping chunks at {list(a)} and {list(b)}"
                    )


def check_planner_data(
    planner_data: Any, keys: Iterable[str], path: str
) -> Dict[str, Tuple[Any, ...]]:
    """DCP's ``planner_data`` (flat key -> original path) checked: each path a non-empty tuple of
    str/int whose dotted join is its key (DCP's own flattening), keys of ``keys`` only."""
    if not planner_data:
        return {}
    if not isinstance(planner_data, dict):
        raise _bad_dcp(path, f"planner_data is a {type(planner_data).__name__}")
    known = set(keys)
    out: Dict[str, Tuple[Any, ...]] = {}
    for key, parts in planner_data.items():
        if key not in known:
            continue
        if (
            not isinstance(parts, (tuple, list))
            or not parts
            or not all(type(p) in (str, int) for p in parts)
            or ".".join(map(str, parts)) != key
        ):
            raise _bad_dcp(path, f"planner_data gives {key!r} the path {parts!r:.120}")
        out[key] = tuple(parts)
    return out
