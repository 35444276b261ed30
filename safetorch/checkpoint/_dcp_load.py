"""The DCP layout: a ``torch.distributed.checkpoint`` directory loaded through DCP itself.

:class:`DCPDirectory` opens the directory (its ``.metadata`` read once and checked by
:mod:`._dcp`), offers its meta view and reads or applies tensors through
``torch.distributed.checkpoint.load`` driven only by safetorch's reader (:func:`dcp_load`):
DTensor and FSDP2 targets included; DCP's engine, never a substitute. DCP's byte entries are
never requested by model loading (DCP's default planner would ``torch.load`` them with
``weights_only=False``); where asked for, they go through the restricted unpickler.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import io
import math
import os
import warnings
from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple

import torch

from safetorch import _compat
from safetorch.checkpoint import _reader
from safetorch.checkpoint._apply import Destination
from safetorch.checkpoint._dcp import (
    DCP_METADATA,
    BytesEntry,
    DCPMetadata,
    _meta,
    check_planner_data,
    dcp_metadata,
    nest_flat_keys,
)
from safetorch.checkpoint._layouts import Layout, batches
from safetorch.checkpoint.loading import (
    _torch_internals_quiet,
    load_checked,
)
from safetorch.errors import CheckpointError, UnsafeCheckpointError

__all__: List[str] = []  # private module: the DCP layout of loads, st.load_state and the CLI

_dcp_available: bool


@_compat.register_binder
def _bind() -> None:
    global _dcp_available
    _dcp_available = _compat.HAS_DCP  # torch >= 2.0


# --- DCP ---------------------------------------------------------------------------------------


def _narrow(tensor: torch.Tensor, offsets: Any, lengths: Any) -> torch.Tensor:
    for dim, (offset, length) in enumerate(zip(offsets, lengths)):
        if length < tensor.size(dim):
            tensor = tensor.narrow(dim, offset, length)
    return tensor


def _record_object(data: bytes, where: str) -> Any:
    return load_checked(io.BytesIO(data), where)


def _safe_reader(
    checked: DCPMetadata,
    allow_bytes: bool,
    opened: Optional[Mapping[str, _reader.RegularFile]] = None,
) -> Any:
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
            root = _reader.Root(checked.directory)
            per_file: Dict[str, List[Any]] = collections.defaultdict(list)
            for item in plan.items:
                per_file[storage[item.storage_index].relative_path].append(item)
            for rel, items in per_file.items():
                kept = None if opened is None else opened.get(rel)
                record_file = (
                    contextlib.nullcontext(kept)
                    if kept is not None
                    else root.open(rel, "DCP record file", expect=checked.files[rel])
                )
                with record_file as f:
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
    opened: Optional[Mapping[str, _reader.RegularFile]] = None,
) -> None:
    """``torch.distributed.checkpoint.load`` (in place), driven only through safetorch's reader.

    ``checked`` is the directory's metadata as read once (:func:`dcp_metadata`); without it,
    it is read here. ``allow_bytes=False`` refuses every bytes entry (model loading: tensors
    only). Every DCP failure, including its ``CheckpointException`` (a ``BaseException``), is
    a ``CheckpointError`` naming the directory.

    torch 2.3+ has ``dcp.load`` that works without a process group; before it,
    ``dcp.load_state_dict`` needs ``no_dist=True`` when no group is initialized.
    """
    import torch.distributed.checkpoint as dcp

    if checked is None:
        checked = dcp_metadata(directory)
    kwargs: Dict[str, Any] = {"storage_reader": _safe_reader(checked, allow_bytes, opened)}
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
        self._checked: Optional[DCPMetadata] = None

    @property
    def checked(self) -> DCPMetadata:
        """The ``.metadata``, read once through the restricted unpickler and checked against
        the directory's files (:func:`dcp_metadata`)."""
        if self._checked is None:
            self._checked = dcp_metadata(self.path)
        return self._checked

    @property
    def metadata(self) -> Any:
        return self.checked.metadata

    def open(self, assign: Optional[bool] = None) -> "DCPDirectory":
        """The open stage: ``.metadata`` read and checked, every record file it names opened
        (the same files it was checked against) and kept open for the reads of the load."""
        if self._open is None:
            root = _reader.Root(self.checked.directory)
            self._open = _reader.open_all(
                {
                    rel: functools.partial(root.open, rel, "DCP record file", expect=identity)
                    for rel, identity in self.checked.files.items()
                }
            )
        return self

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
            dcp_load(tensors, self.path, checked=self.checked, allow_bytes=False, opened=self._open)
        if objects:
            sink: Dict[str, Any] = {}
            dcp_load(
                dict(objects),
                self.path,
                _ObjectPlanner.make(sink),
                checked=self.checked,
                opened=self._open,
            )
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
                opened=self._open,
            )
            dest.wrote(t for t, _ in sharded)
        elif sharded:
            # assign= or a load hook: DCP fills DTensors of the same placement, and torch's
            # Module.load_state_dict applies them (hooks run, assign= assigns them).
            for batch in batches(sharded, self.nbytes):
                fresh = {s: torch.empty_like(targets[t].detach()) for t, s in batch}
                dcp_load(
                    fresh, self.path, checked=self.checked, allow_bytes=False, opened=self._open
                )
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
            dcp_load(inplace, self.path, checked=self.checked, allow_bytes=False, opened=self._open)
        super().load_into(plain, dest)
