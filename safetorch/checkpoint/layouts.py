"""Checkpoint layouts beyond one file: DCP directories, sharded indexes, library directories.

:func:`resolve` turns a path into a :class:`Layout`: a single file, a
``torch.distributed.checkpoint`` (DCP) directory, or a sharded index
(``model.safetensors.index.json`` / ``pytorch_model.bin.index.json``); a directory written by
transformers (``save_pretrained``, ``checkpoint-N/``) or accelerate (``save_state``) resolves to
the file or index holding the model weights, and says which.

Each layout offers a *meta view* (``{key: meta tensor}``, nested by container the way a
``torch.save`` checkpoint is, zero bytes of tensor data), so ``st.load_state_dict`` matches keys
and shapes exactly as for one file, and then :meth:`Layout.load_into` reads only the matched
tensors into the model: DCP through ``torch.distributed.checkpoint.load`` (DTensor and
FSDP2 targets included; DCP's engine, never a substitute), shards one at a time.

Safety: DCP's ``.metadata`` is a pickle; it is read with safetorch's restricted unpickler and
an allow-list of DCP's metadata classes, never with plain pickle, and DCP's byte entries are
never requested by model loading (DCP's default planner would ``torch.load`` them with
``weights_only=False``). ``.bin`` shards load weights-only through :func:`safetorch.load`.
"""

from __future__ import annotations

import collections
import contextlib
import io
import json
import math
import os
import re
import warnings
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Tuple

import torch

from safetorch import _compat
from safetorch._atomic import atomic_write, atomic_write_dir, atomic_write_text
from safetorch.checkpoint import reader, torchfile
from safetorch.checkpoint.apply import Destination
from safetorch.checkpoint.dcp import (
    DCP_METADATA,
    BytesEntry,
    DCPMetadata,
    _meta,
    check_planner_data,
    dcp_metadata,
    nest_flat_keys,
)
from safetorch.checkpoint.keys import find_state_dict, known_prefixes, state_dict_keys
from safetorch.checkpoint.loading import (
    PathLike,
    _torch_internals_quiet,
    load_checked,
    load_for_copy,
)
from safetorch.errors import CheckpointError, CheckpointFileNotFoundError, UnsafeCheckpointError

__all__: List[str] = []  # private module: the layout stage of st.load_state_dict and the CLI

_dcp_available: bool


@_compat.register_binder
def _bind() -> None:
    global _dcp_available
    _dcp_available = _compat.HAS_DCP  # torch >= 2.0


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


class Layout:
    """A resolved checkpoint source: what it is, its meta view and how to read tensors."""

    kind = "file"

    def __init__(self, path: str, description: str) -> None:
        self.path = path
        self.description = description

    def meta_view(self) -> Any:  # pragma: no cover - overridden
        raise NotImplementedError

    def read(self, keys: List[str]) -> Dict[str, Any]:  # pragma: no cover - overridden
        """The values of the full source ``keys``, read into CPU memory."""
        raise NotImplementedError

    def batches(self, pairs: List[Tuple[str, str]]) -> Iterator[Dict[str, Any]]:
        """``{target_key: value}`` for ``pairs`` (``(target_key, full_source_key)``), read
        about ``_BATCH_BYTES`` at a time."""
        for batch in _batches(pairs, self.nbytes):
            values = self.read([s for _, s in batch])
            yield {t: values[s] for t, s in batch}

    def load_into(self, pairs: List[Tuple[str, str]], dest: Destination) -> None:
        """Load the source keys of ``pairs`` into ``dest`` (the apply stage): every value
        through ``dest.apply`` (torch's ``Module.load_state_dict``: ``assign=`` and load hooks
        honoured), in batches; a layout that can write bytes straight into ``dest.direct``
        targets does so and records it with ``dest.wrote``."""
        for batch in self.batches(pairs):
            dest.apply(batch)

    def nbytes(self, key: str) -> int:
        """The bytes of source ``key``'s tensor (0 where unknown): the batching measure."""
        return 0

    def files(self) -> List[str]:
        return [self.path]


_BATCH_BYTES = 256 << 20


def _batches(
    pairs: List[Tuple[str, str]], nbytes: Callable[[str], int]
) -> Iterator[List[Tuple[str, str]]]:
    batch: List[Tuple[str, str]] = []
    size = 0
    for pair in pairs:
        n = nbytes(pair[1])
        if batch and size + n > _BATCH_BYTES:
            yield batch
            batch, size = [], 0
        batch.append(pair)
        size += n
    if batch:
        yield batch


# --- sharded indexes ---------------------------------------------------------------------------
class ShardedIndex(Layout):
    """``*.index.json`` with a ``weight_map`` of key -> shard file (safetensors or torch).

    Every shard is resolved inside the index's directory by the one reader; headers (or, for
    ``.bin`` shards, the weights-only load) are checked for every shard before any tensor is
    applied, and a shard read again later must be the file checked.
    """

    kind = "sharded index"

    def __init__(self, path: str, description: str) -> None:
        super().__init__(path, description)
        index = reader.read_json(
            path, "shard index", "JSON with a 'weight_map' of tensor name -> shard file"
        )
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()
        ):
            raise CheckpointError(
                f"cannot read the shard index {path!r}: expected a JSON object with a "
                "'weight_map' of tensor name -> shard file name, got "
                f"{type(weight_map if isinstance(index, dict) else index).__name__}"
            )
        root = reader.Root(os.path.dirname(os.path.abspath(path)))
        resolved: Dict[str, str] = {}
        self.weight_map: Dict[str, str] = {}
        for key, name in weight_map.items():
            shard = resolved.get(name)
            if shard is None:
                shard = resolved[name] = root.resolve(name, "shard")
            self.weight_map[key] = shard
        self._init_shards()

    def _init_shards(self) -> None:
        self._keys_of: Dict[str, List[str]] = collections.defaultdict(list)
        for key, shard in self.weight_map.items():
            self._keys_of[shard].append(key)
        missing = sorted(s for s in self._keys_of if not os.path.exists(s))
        if missing:
            raise CheckpointFileNotFoundError(
                f"the shard index {self.path!r} names {len(missing)} missing shard(s): "
                f"{[os.path.basename(m) for m in missing[:5]]}"
            )
        self._headers: Dict[str, reader.SafetensorsHeader] = {}
        self._identity: Dict[str, reader.Identity] = {}
        self._meta: Dict[str, torch.Tensor] = {}

    def files(self) -> List[str]:
        return sorted(self._keys_of)

    def _is_safetensors(self, shard: str) -> bool:
        return shard.endswith(".safetensors")

    def _load_bin(self, f: reader.RegularFile) -> Mapping[str, Any]:
        loaded = load_checked(f.fh, f.path)
        if not isinstance(loaded, Mapping):
            raise CheckpointError(
                f"shard {f.path!r} holds a {type(loaded).__name__}, not a state dict"
            )
        return loaded

    def _check_shards(self) -> None:
        """Open every shard once, check it, and keep its meta view and identity."""
        if self._identity:
            return
        for shard in self.files():
            with reader.open_regular(shard, "shard") as f:
                if self._is_safetensors(shard):
                    header = reader.read_safetensors_header(f)
                    self._headers[shard] = header
                    meta = header.meta()
                else:
                    loaded = self._load_bin(f)
                    meta = {
                        k: _meta(v.shape, v.dtype) for k, v in loaded.items() if torch.is_tensor(v)
                    }
                self._identity[shard] = f.identity
            for key in self._keys_of[shard]:
                if key not in meta:
                    raise CheckpointError(
                        f"the shard index {self.path!r} maps {key!r} to "
                        f"{os.path.basename(shard)!r}, which does not contain it"
                    )
                self._meta[key] = meta[key]

    def meta_view(self) -> Any:
        self._check_shards()
        return {key: self._meta[key] for key in self.weight_map}

    def load_into(self, pairs: List[Tuple[str, str]], dest: Destination) -> None:
        """Safetensors tensors go straight into ``dest.direct`` targets with ``pread`` (one
        copy); everything else through ``dest.apply``."""
        direct = dest.direct
        self._check_shards()
        rest: List[Tuple[str, str]] = []
        by_shard: Dict[str, List[Tuple[str, str]]] = collections.defaultdict(list)
        for target, source in pairs:
            shard = self.weight_map[source]
            if target in direct and self._is_safetensors(shard):
                by_shard[shard].append((target, source))
            else:
                rest.append((target, source))
        for shard, items in sorted(by_shard.items()):
            header = self._headers[shard]
            with reader.open_regular(shard, "shard", expect=self._identity[shard]) as f:
                for target, source in items:
                    if header.read_into(f, source, direct[target]):
                        dest.wrote((target,))
                    else:
                        rest.append((target, source))
        super().load_into(rest, dest)

    def nbytes(self, key: str) -> int:
        t = self._meta.get(key)
        return 0 if t is None else t.numel() * t.element_size()

    def read(self, keys: List[str]) -> Dict[str, Any]:
        self._check_shards()
        by_shard: Dict[str, List[str]] = collections.defaultdict(list)
        for key in keys:
            by_shard[self.weight_map[key]].append(key)
        out: Dict[str, Any] = {}
        for shard, items in sorted(by_shard.items()):
            with reader.open_regular(shard, "shard", expect=self._identity[shard]) as f:
                if self._is_safetensors(shard):
                    out.update(self._headers[shard].read(f, items))
                else:
                    loaded = self._load_bin(f)
                    out.update((k, loaded[k]) for k in items)
        return out


class SafetensorsFile(ShardedIndex):
    """One ``.safetensors`` file, read lazily like a one-shard index."""

    kind = "safetensors file"

    def __init__(self, path: str, description: str) -> None:
        Layout.__init__(self, path, description)
        with reader.open_regular(path, "safetensors file") as f:
            header = reader.read_safetensors_header(f)
        real = path
        self.weight_map = {k: real for k in header.entries}
        self._init_shards()
        self._headers[real] = header
        self._identity[real] = header.identity
        self._meta.update(header.meta())


# --- DCP ---------------------------------------------------------------------------------------


def _narrow(tensor: torch.Tensor, offsets: Any, lengths: Any) -> torch.Tensor:
    for dim, (offset, length) in enumerate(zip(offsets, lengths)):
        if length < tensor.size(dim):
            tensor = tensor.narrow(dim, offset, length)
    return tensor


def _record_object(data: bytes, where: str) -> Any:
    return load_checked(io.BytesIO(data), where)


def _safe_reader(checked: DCPMetadata, allow_bytes: bool) -> Any:
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.planner import LoadItemType

    class SafeReader(FileSystemReader):
        """DCP's file reader with every byte read by safetorch: the metadata checked once (no
        second read), records through the one reader, tensor records through the restricted
        unpickler (torch 2.0-2.5's reader ``torch.load``s them without weights_only), bytes
        entries only where allowed, and then only through the restricted unpickler."""

        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            metadata = checked.metadata
            storage_meta = getattr(metadata, "storage_meta", None)
            if storage_meta is not None and hasattr(self, "load_id"):
                storage_meta.load_id = self.load_id
            return metadata

        def read_data(self, plan: Any, planner: Any) -> Any:
            from torch.futures import Future

            storage = checked.metadata.storage_data
            root = reader.Root(checked.directory)
            per_file: Dict[str, List[Any]] = collections.defaultdict(list)
            for item in plan.items:
                per_file[storage[item.storage_index].relative_path].append(item)
            for rel, items in per_file.items():
                with root.open(rel, "DCP record file", expect=checked.files[rel]) as f:
                    for req in items:
                        info = storage[req.storage_index]
                        data = f.pread(info.length, info.offset)
                        where = f"{f.path!r} record {req.storage_index.fqn!r}"
                        if req.type == LoadItemType.BYTE_IO:
                            if not allow_bytes:
                                raise UnsafeCheckpointError(
                                    f"refused to read {where}: it is a pickled object and "
                                    "the model's entry is a tensor; nothing was executed"
                                )
                            clean = io.BytesIO()
                            torch.save(_record_object(data, where), clean)
                            clean.seek(0)
                            planner.load_bytes(req, clean)
                            continue
                        tensor = _record_object(data, where)
                        if type(tensor) is not torch.Tensor:
                            raise CheckpointError(
                                f"{where} holds a {type(tensor).__name__}, not a tensor"
                            )
                        tensor = _narrow(tensor, req.storage_offsets, req.lengths)
                        target = planner.resolve_tensor(req).detach()
                        if target.size() != tensor.size() or target.dtype != tensor.dtype:
                            raise CheckpointError(
                                f"{where} holds a {tensor.dtype} tensor of size "
                                f"{list(tensor.size())}; its metadata says {target.dtype} "
                                f"{list(target.size())}"
                            )
                        target.copy_(tensor)
                        planner.commit_tensor(req, target)
            fut: Any = Future()
            fut.set_result(None)
            return fut

    return SafeReader(checked.directory)


def safe_planner() -> Any:
    """A DefaultLoadPlanner whose byte entries load weights-only (the restricted read of
    st.load) rather than through DCP's own ``torch.load(weights_only=False)``."""
    from torch.distributed.checkpoint import DefaultLoadPlanner

    class SafeLoadPlanner(DefaultLoadPlanner):
        def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
            obj = load_checked(value, "DCP bytes")  # weights-only; refuses anything else
            clean = io.BytesIO()
            torch.save(obj, clean)  # what DCP's own path then unpickles is benign
            clean.seek(0)
            super().load_bytes(read_item, clean)

    return SafeLoadPlanner()


class _ObjectPlanner:
    """A DefaultLoadPlanner that keeps bytes entries as the objects the restricted unpickler
    rebuilt (DCP's own ``load_bytes`` would ``torch.load`` them again)."""

    @staticmethod
    def make(sink: Dict[str, Any]) -> Any:
        from torch.distributed.checkpoint import DefaultLoadPlanner

        class ObjectPlanner(DefaultLoadPlanner):
            def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
                sink[read_item.dest_index.fqn] = _record_object(value.getvalue(), "DCP bytes")

        return ObjectPlanner()


@contextlib.contextmanager
def _single_process_quiet() -> Iterator[None]:
    # torch 2.x's DCP filesystem writer calls tensor.storage(), which warns "TypedStorage is
    # deprecated" from inside torch (once per process): not about anything the caller did.
    with warnings.catch_warnings(), _torch_internals_quiet():
        # DCP says it "assumes the intent is to load in a single process" without a group.
        warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
        warnings.filterwarnings("ignore", message=".*assuming the intent is to.*")
        yield


def dcp_load(
    state_dict: Dict[str, Any],
    directory: str,
    planner: Any = None,
    *,
    checked: Optional[DCPMetadata] = None,
    allow_bytes: bool = True,
) -> None:
    """``torch.distributed.checkpoint.load`` (in place), driven only through safetorch's reader.

    ``checked`` is the directory's metadata as read once (:func:`dcp_metadata`); without it,
    it is read here. ``allow_bytes=False`` refuses every bytes entry (model loading: tensors
    only). Every DCP failure, including its ``CheckpointException`` (a ``BaseException``), is
    a ``CheckpointError`` naming the directory.

    torch 2.2+ has ``dcp.load``, which works without a process group; before it,
    ``dcp.load_state_dict`` needs ``no_dist=True`` when no group is initialized.
    """
    import torch.distributed.checkpoint as dcp

    if checked is None:
        checked = dcp_metadata(directory)
    kwargs: Dict[str, Any] = {"storage_reader": _safe_reader(checked, allow_bytes)}
    if planner is not None:
        kwargs["planner"] = planner
    try:
        with _single_process_quiet():
            if _compat.DCP_HAS_SAVE_LOAD:
                dcp.load(state_dict, **kwargs)
            else:
                from safetorch import _dist

                if not _dist.initialized():
                    kwargs["no_dist"] = True
                dcp.load_state_dict(state_dict, **kwargs)
    except (KeyboardInterrupt, SystemExit, GeneratorExit):
        raise
    except BaseException as exc:  # DCP's CheckpointException is a BaseException
        inner = _dcp_cause(exc)
        if isinstance(inner, CheckpointError):
            raise inner.with_traceback(None) from exc
        raise CheckpointError(
            f"cannot load the DCP checkpoint {directory!r}: {type(inner).__name__}: "
            f"{str(inner).strip().splitlines()[0] if str(inner).strip() else ''}"
        ) from exc


def _dcp_cause(exc: BaseException) -> BaseException:
    """The first rank's original error inside DCP's CheckpointException, else ``exc``."""
    failures = getattr(exc, "failures", None)
    if isinstance(failures, dict):
        for value in failures.values():
            if isinstance(value, tuple) and value and isinstance(value[0], BaseException):
                return value[0]  # torch's WRAPPED_EXCEPTION: (exception, stack summary)
            if isinstance(value, BaseException):
                return value
            inner = getattr(value, "exception", None)  # torch's _WrappedException
            if isinstance(inner, BaseException):
                return inner
    return exc


class DCPDirectory(Layout):
    """A ``torch.distributed.checkpoint`` directory (``.metadata`` + ``*.distcp``)."""

    kind = "DCP directory"

    def __init__(self, path: str, description: str) -> None:
        super().__init__(path, description)
        if not _dcp_available:
            raise CheckpointError(
                f"{path!r} is a torch.distributed.checkpoint directory, which needs torch >= 2.0 "
                f"(this is torch {torch.__version__}); convert it to one file with "
                "`safetorch ckpt convert DIR model.pt` on a newer torch"
            )
        self.checked = dcp_metadata(path)
        self.metadata = self.checked.metadata

    def files(self) -> List[str]:
        return sorted(
            os.path.join(self.path, n)
            for n in os.listdir(self.path)
            if n == DCP_METADATA or n.endswith(".distcp")
        )

    def flat_meta(self) -> Dict[str, Any]:
        from torch.distributed.checkpoint.metadata import TensorStorageMetadata

        out: Dict[str, Any] = {}
        for key, md in self.metadata.state_dict_metadata.items():
            if isinstance(md, TensorStorageMetadata):
                out[key] = _meta(md.size, md.properties.dtype)
            else:
                out[key] = BytesEntry(key)  # a pickled value: read only when asked, restricted
        return out

    def paths(self) -> Dict[str, Tuple[Any, ...]]:
        """DCP's own flattening (flat key -> original path), checked."""
        return check_planner_data(
            getattr(self.metadata, "planner_data", None),
            self.metadata.state_dict_metadata,
            os.path.join(self.path, DCP_METADATA),
        )

    def meta_view(self) -> Any:
        return nest_flat_keys(self.flat_meta(), self.paths())

    def nbytes(self, key: str) -> int:
        md = self.metadata.state_dict_metadata.get(key)
        size = getattr(md, "size", None)
        if not isinstance(size, torch.Size):
            return 0
        return math.prod(size) * torch.empty((), dtype=md.properties.dtype).element_size()

    def _flat_keys(self, key: str) -> List[str]:
        """The flat DCP keys a (possibly nested) source key stands for: itself, or the
        entries DCP flattened out of a dict saved under it (a dict extra state)."""
        entries = self.metadata.state_dict_metadata
        if key in entries:
            return [key]
        inner = [k for k in entries if k.startswith(key + ".")]
        if not inner:
            raise CheckpointError(f"the DCP checkpoint {self.path!r} has no entry {key!r}")
        return inner

    def read(self, keys: List[str], allow_bytes: bool = True) -> Dict[str, Any]:
        from torch.distributed.checkpoint.metadata import TensorStorageMetadata

        entries = self.metadata.state_dict_metadata
        flat_of = {key: self._flat_keys(key) for key in keys}
        tensors: Dict[str, Any] = {}
        objects: Dict[str, Any] = {}
        for flat in flat_of.values():
            for key in flat:
                md = entries[key]
                if isinstance(md, TensorStorageMetadata):
                    tensors[key] = torch.empty(md.size, dtype=md.properties.dtype)
                else:
                    objects[key] = None
        if objects and not allow_bytes:
            raise UnsafeCheckpointError(
                f"refused to read {sorted(objects)[:3]} from {self.path!r}: pickled objects "
                "where tensors are expected; nothing was executed"
            )
        if tensors:
            dcp_load(tensors, self.path, checked=self.checked, allow_bytes=False)
        if objects:
            sink: Dict[str, Any] = {}
            dcp_load(dict(objects), self.path, _ObjectPlanner.make(sink), checked=self.checked)
            objects = {k: sink[k] for k in objects}
        values = {**tensors, **objects}
        paths = self.paths()
        out: Dict[str, Any] = {}
        for key, flat in flat_of.items():
            if flat == [key]:
                out[key] = values[key]
                continue
            depth = len(key.split("."))
            rel: Dict[str, Any] = {}
            for k in flat:
                parts = paths.get(k)
                if parts is not None:  # DCP's own path; drop the components that spell key
                    for i in range(1, len(parts)):
                        if ".".join(map(str, parts[:i])) == key:
                            depth = i
                            break
                    rel[k] = tuple(parts[depth:])
                else:
                    rel[k] = tuple(k[len(key) + 1 :].split("."))
            out[key] = nest_flat_keys({k: values[k] for k in flat}, rel)
        return out

    def load_into(self, pairs: List[Tuple[str, str]], dest: Destination) -> None:
        """Through DCP itself: DTensor (FSDP2) targets resharded by DCP, in place where
        ``dest.in_place`` (no load hook, no ``assign=``), else into fresh DTensors of the same
        placement handed to ``dest.apply``; plain ``dest.direct`` targets filled record by
        record; everything else read and applied in batches."""
        from torch.distributed.checkpoint.metadata import TensorStorageMetadata

        targets = dest.targets
        entries = self.metadata.state_dict_metadata
        refused = [
            s
            for t, s in pairs
            if torch.is_tensor(targets.get(t))
            and not isinstance(entries.get(s), TensorStorageMetadata)
        ]
        if refused:
            raise UnsafeCheckpointError(
                f"refused to load {refused[:3]} from the DCP checkpoint {self.path!r}: the "
                "checkpoint stores pickled objects where the model has tensors (DCP would "
                "unpickle them with weights_only=False); nothing was executed or loaded"
            )
        sharded = [(t, s) for t, s in pairs if type(targets.get(t)).__name__ == "DTensor"]
        if sharded and dest.in_place:
            # In place into DTensor shards: DCP reads and reshards each chunk into the
            # model's own shard (what Module.load_state_dict's copy_ would do, one copy less).
            dcp_load(
                {s: targets[t].detach() for t, s in sharded},
                self.path,
                checked=self.checked,
                allow_bytes=False,
            )
            dest.wrote(t for t, _ in sharded)
        elif sharded:
            # assign= or a load hook: DCP fills DTensors of the same placement, and torch's
            # Module.load_state_dict applies them (hooks run, assign= assigns them).
            for batch in _batches(sharded, self.nbytes):
                fresh = {s: torch.empty_like(targets[t].detach()) for t, s in batch}
                dcp_load(fresh, self.path, checked=self.checked, allow_bytes=False)
                dest.apply({t: fresh[s] for t, s in batch})
        plain: List[Tuple[str, str]] = []
        inplace: Dict[str, torch.Tensor] = {}
        for t, s in pairs:
            if type(targets.get(t)).__name__ == "DTensor":
                continue
            md, into = entries.get(s), dest.direct.get(t)
            if (
                into is not None
                and isinstance(md, TensorStorageMetadata)
                and tuple(md.size) == tuple(into.shape)
                and md.properties.dtype == into.dtype
                and s not in inplace
            ):
                inplace[s] = into.detach()  # the reader copies each record straight into it
                dest.wrote((t,))
            else:
                plain.append((t, s))
        if inplace:
            dcp_load(inplace, self.path, checked=self.checked, allow_bytes=False)
        super().load_into(plain, dest)


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
    raw = reader.Root(root).read(index_name, "CheckpointSaver index", reader.MAX_JSON_BYTES)
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
    path = reader.Root(root).resolve(last["file"], "checkpoint")
    return path, f"last checkpoint of CheckpointSaver.save (epoch {last.get('epoch')})"


def latest_complete(directory: str, names: List[str]) -> Optional[str]:
    """The newest of ``names`` in ``directory`` that is a complete checkpoint (used by
    CheckpointSaver.resume): a file that opens, or a DCP directory with its .metadata."""
    root = reader.Root(directory)
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
            reader.open_regular(p, "checkpoint").close()
        return FileLayout(p, None)  # st.load reports the missing file
    names = set(os.listdir(p))
    if DCP_METADATA in names:
        return DCPDirectory(p, f"DCP directory {p!r}")
    saver_error: Optional[CheckpointError] = None
    try:
        saver = saver_checkpoint(p)
    except CheckpointError as exc:  # an index but nothing complete yet: other files may do
        saver, saver_error = None, exc
    if saver is not None:  # the checkpoint CheckpointSaver.resume (or its index) names
        path, what = saver
        where = f"{os.path.basename(path)} in {p!r}, the {what}"
        return DCPDirectory(path, where) if os.path.isdir(path) else _file_layout(path, where)
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


def _file_layout(path: str, description: str) -> Layout:
    if _is_index(path):
        return ShardedIndex(path, f"shard index {description}")
    if path.endswith(".safetensors"):
        return SafetensorsFile(path, description)
    return FileLayout(path, description)


class FileLayout(Layout):
    """One torch.save file, given directly (``description`` None) or picked inside a
    directory, read like every layout once :meth:`open` has read its meta view.

    ``open(assign)`` reads the meta view with :mod:`safetorch.checkpoint.torchfile` (one
    restricted pass over the pickle, no tensor data; the matched bytes are read later with
    ``pread``, straight into plain targets), or, where that pass does not cover the file
    (legacy format, compressed storages, other tensor kinds) or ``assign=True`` keeps the
    values, loads it whole through ``st.load``'s restricted path. Never memory-mapped: a file
    truncated during the call is an error, not ``SIGBUS``. Keys are the dotted paths of the
    view (``"state_dict.fc.weight"``: containers are walked by their keys, longest first).
    """

    def __init__(self, path: str, description: Optional[str]) -> None:
        super().__init__(path, description or path)
        self.picked = description is not None
        self._view: Any = None
        self._tfile: Optional[torchfile.TorchFile] = None

    def open(self, assign: Optional[bool] = None) -> "FileLayout":
        """Read the meta view (see the class docstring); :meth:`close` releases the file."""
        if self._view is None:
            self._tfile = None if assign else torchfile.TorchFile.open(self.path)
            self._view = self._tfile.view if self._tfile else load_for_copy(self.path)
        return self

    def close(self) -> None:
        if self._tfile is not None:
            self._tfile.close()
            self._tfile = None

    def meta_view(self) -> Any:
        return self.open()._view

    def _locate(self, key: str) -> Any:
        node, rest = self.meta_view(), key
        while True:
            if not isinstance(node, Mapping):
                raise CheckpointError(f"the checkpoint {self.path!r} has no entry {key!r}")
            if rest in node:
                return node[rest]
            cuts = [i for i, c in enumerate(rest) if c == "."]
            for i in reversed(cuts):  # the longest container key that prefixes the rest
                if rest[:i] in node and isinstance(node[rest[:i]], Mapping):
                    node, rest = node[rest[:i]], rest[i + 1 :]
                    break
            else:
                raise CheckpointError(f"the checkpoint {self.path!r} has no entry {key!r}")

    def read(self, keys: List[str]) -> Dict[str, Any]:
        out: Dict[str, Any] = {}
        tfile = self._tfile  # a meta view's tensors are read; a whole load's are the values
        for key in keys:
            value = self._locate(key)
            if tfile is not None and isinstance(value, torch.Tensor):
                value = tfile.materialize(value)
            out[key] = value
        return out

    def nbytes(self, key: str) -> int:
        value = self._locate(key)
        return value.numel() * value.element_size() if isinstance(value, torch.Tensor) else 0

    def load_into(self, pairs: List[Tuple[str, str]], dest: Destination) -> None:
        """The matched bytes straight into ``dest.direct`` targets, the rest in batches
        through ``dest.apply`` (torchfile reuses one buffer); values loaded whole go through
        ``dest.apply`` in one call, as ``Module.load_state_dict`` would see them."""
        values = {t: self._locate(s) for t, s in pairs}
        if self._tfile is None:
            dest.apply(values)
            return
        direct = {t: d for t, d in dest.direct.items() if t in values}
        self._tfile.load_values(values, dest.apply, direct=direct)
        dest.wrote(direct)  # each direct target is read straight in, or applied


# --- conversions (safetorch ckpt convert / inspect) --------------------------------------------
def dcp_to_object(directory: str) -> Any:
    """The whole content of a DCP directory as the nested object it was saved from.

    Tensors are allocated on the CPU and filled through safetorch's reader; byte entries are
    rebuilt by the restricted unpickler. The nesting comes from DCP's own ``planner_data``
    (flattened key -> original path, checked against DCP's flattening) where it is present,
    else from the first key segment.
    """
    dcp_dir = DCPDirectory(directory, directory)
    flat = dcp_dir.read(list(dcp_dir.metadata.state_dict_metadata))
    return nest_flat_keys(flat, dcp_dir.paths())


def save_dcp(obj: Mapping[str, Any], directory: str) -> None:
    """Write ``obj`` as a DCP directory on one process, atomically (``_atomic``'s directory
    writer: a temp sibling, then a rename over ``directory``, which it replaces)."""
    atomic_write_dir(directory, lambda tmp: dcp_save(obj, tmp))


def dcp_save(obj: Mapping[str, Any], directory: str) -> None:
    """``torch.distributed.checkpoint.save`` of ``obj`` into ``directory`` (no atomicity: the
    caller writes into a temp directory), with or without a process group, without DCP's
    single-process and torch-internal warnings."""
    import torch.distributed.checkpoint as dcp

    from safetorch import _dist

    with _single_process_quiet():
        if _compat.DCP_HAS_SAVE_LOAD:
            dcp.save(dict(obj), checkpoint_id=directory)
        else:
            dcp.save_state_dict(
                dict(obj),
                storage_writer=dcp.FileSystemWriter(directory),
                no_dist=not _dist.initialized(),
            )


def parse_size(text: str) -> int:
    """``"5GB"``, ``"500MB"``, ``"1024"`` -> bytes (decimal units, as transformers)."""
    units = {"KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "KB": 10**3, "MB": 10**6, "GB": 10**9}
    t = text.strip().upper().replace(" ", "")
    factor, number = 1, t[:-1] if t.endswith("B") else t
    for unit, scale in units.items():  # the 3-letter units first: "MIB" also ends in "IB"
        if t.endswith(unit):
            factor, number = scale, t[: -len(unit)]
            break
    try:
        value = float(number) * factor
    except ValueError:
        raise ValueError(
            f"size {text!r}; expected e.g. '5GB', '500MB' or a number of bytes"
        ) from None
    if value <= 0:
        raise ValueError(f"size {text!r} must be positive")
    return int(value)


def save_sharded_safetensors(
    state_dict: Mapping[str, torch.Tensor], directory: str, max_shard_bytes: int
) -> Dict[str, Any]:
    """Write ``model-0000i-of-0000n.safetensors`` shards and ``model.safetensors.index.json``.

    Shards are filled in key order up to ``max_shard_bytes`` (a larger tensor gets a shard of
    its own), each written atomically; the index is written last.
    """
    st_torch = reader.safetensors_package().torch
    shards: List[Dict[str, torch.Tensor]] = [{}]
    size = 0
    for key, tensor in state_dict.items():
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][key] = tensor.contiguous()
        size += nbytes
    os.makedirs(directory, exist_ok=True)
    n = len(shards)
    weight_map: Dict[str, str] = {}
    total = 0
    for i, shard in enumerate(shards, 1):
        name = f"model-{i:05d}-of-{n:05d}.safetensors"

        def write(tmp: str, shard: Dict[str, torch.Tensor] = shard) -> None:
            st_torch.save_file(shard, tmp, metadata={"format": "pt"})

        atomic_write(os.path.join(directory, name), write)
        for key, tensor in shard.items():
            weight_map[key] = name
            total += tensor.numel() * tensor.element_size()
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    text = json.dumps(index, indent=2, sort_keys=True)
    atomic_write_text(os.path.join(directory, SAFETENSORS_INDEX), text)
    return {"shards": n, "tensors": len(weight_map), "total_bytes": total}


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
    picked = os.path.basename(layout.path) if not isinstance(layout, DCPDirectory) else None
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
