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
import functools
import os
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Tuple

import torch

from safetorch.checkpoint import _reader, _torchfile
from safetorch.checkpoint._apply import Destination
from safetorch.checkpoint.loading import (
    load_checked,
)
from safetorch.errors import CheckpointError, CheckpointFileNotFoundError

__all__: List[str] = []  # private module: the layouts of st.load_state_dict and the CLI


class Layout:
    """A resolved checkpoint source: what it is, its meta view and how to read tensors.

    A load drives it through the stages in order: :meth:`open` (every file of the layout
    opened once through the one reader, kept open), :meth:`meta_view` (read and checked from
    those files, no tensor data), :meth:`load_into` (the matched tensors into the model, read
    from the files already open), :meth:`close`. A layout used without :meth:`open` (the CLI's
    inspection) opens each file where it reads it, and checks it is the file checked.
    """

    kind = "file"

    def __init__(self, path: str, description: str) -> None:
        self.path = path
        self.description = description
        self._open: Optional[Dict[str, _reader.RegularFile]] = None  # path -> file, once opened

    def open(self, assign: Optional[bool] = None) -> "Layout":
        """The open stage: every file of the layout opened through the one reader."""
        if self._open is None:
            self._open = _reader.open_all(
                {p: functools.partial(_reader.open_regular, p, self._what) for p in self.files()}
            )
        return self

    def close(self) -> None:
        """Close what :meth:`open` opened."""
        opened, self._open = self._open, None
        for f in (opened or {}).values():
            f.close()

    _what = "checkpoint"

    @contextlib.contextmanager
    def _file(self, path: str, expect: Optional[_reader.Identity] = None) -> Iterator[Any]:
        """``path`` as :meth:`open` opened it (rewound), else opened here (and closed)."""
        kept = None if self._open is None else self._open.get(path)
        if kept is not None:
            kept.fh.seek(0)
            yield kept
            return
        with _reader.open_regular(path, self._what, expect=expect) as f:
            yield f

    def meta_view(self) -> Any:  # pragma: no cover - overridden
        raise NotImplementedError

    def read(self, keys: List[str]) -> Dict[str, Any]:  # pragma: no cover - overridden
        """The values of the full source ``keys``, read into CPU memory."""
        raise NotImplementedError

    def batches(self, pairs: List[Tuple[str, str]]) -> Iterator[Dict[str, Any]]:
        """``{target_key: value}`` for ``pairs`` (``(target_key, full_source_key)``), read
        about ``_BATCH_BYTES`` at a time."""
        for batch in batches(pairs, self.nbytes):
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


def batches(
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
        index = _reader.read_json(
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
        root = _reader.Root(os.path.dirname(os.path.abspath(path)))
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
        self._headers: Dict[str, _reader.SafetensorsHeader] = {}
        self._identity: Dict[str, _reader.Identity] = {}
        self._meta: Dict[str, torch.Tensor] = {}

    def files(self) -> List[str]:
        return sorted(self._keys_of)

    def _is_safetensors(self, shard: str) -> bool:
        return shard.endswith(".safetensors")

    def _load_bin(self, f: _reader.RegularFile) -> Mapping[str, Any]:
        loaded = load_checked(f.fh, f.path)
        if not isinstance(loaded, Mapping):
            raise CheckpointError(
                f"shard {f.path!r} holds a {type(loaded).__name__}, not a state dict"
            )
        return loaded

    _what = "shard"

    def _check_shards(self) -> None:
        """Check every shard once (opened by :meth:`open`, or here), and keep its meta view
        and identity."""
        if self._identity:
            return
        for shard in self.files():
            with self._file(shard) as f:
                if self._is_safetensors(shard):
                    header = _reader.read_safetensors_header(f)
                    self._headers[shard] = header
                    meta = header.meta()
                else:
                    loaded = self._load_bin(f)
                    meta = {
                        k: torch.empty(v.shape, dtype=v.dtype, device="meta")
                        for k, v in loaded.items()
                        if torch.is_tensor(v)
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
            with self._file(shard, expect=self._identity[shard]) as f:
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
            with self._file(shard, expect=self._identity[shard]) as f:
                if self._is_safetensors(shard):
                    out.update(self._headers[shard].read(f, items))
                else:
                    loaded = self._load_bin(f)
                    out.update((k, loaded[k]) for k in items)
        return out


class SafetensorsFile(ShardedIndex):
    """One ``.safetensors`` file, read lazily like a one-shard index."""

    kind = "safetensors file"
    _what = "safetensors file"

    def __init__(self, path: str, description: str) -> None:
        Layout.__init__(self, path, description)
        self.weight_map: Dict[str, str] = {}
        self._init_shards()

    def files(self) -> List[str]:
        return [self.path]

    def _check_shards(self) -> None:
        """The header, read once from the file (opened by :meth:`open`, or here)."""
        if self._identity:
            return
        with self._file(self.path) as f:
            header = _reader.read_safetensors_header(f)
        self.weight_map = {k: self.path for k in header.entries}
        self._init_shards()
        self._headers[self.path] = header
        self._identity[self.path] = header.identity
        self._meta.update(header.meta())


class FileLayout(Layout):
    """One torch.save file, given directly (``description`` None) or picked inside a
    directory, read like every layout.

    :meth:`open` opens the file once; :meth:`meta_view` reads it with :mod:`safetorch.checkpoint._torchfile` (one
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
        self._tfile: Optional[_torchfile.TorchFile] = None
        self._assign: Optional[bool] = None

    def open(self, assign: Optional[bool] = None) -> "FileLayout":
        """Open the file (``assign=True``: its values will be kept, so it is loaded whole)."""
        self._assign = assign
        super().open(assign)
        return self

    def close(self) -> None:
        self._tfile = None  # it reads from the file the layout opened, closed here
        super().close()

    def meta_view(self) -> Any:
        """The file's meta view (see the class docstring), read once from the open file."""
        if self._view is None:
            if self._open is None:  # used without open() (the CLI's inspection)
                self.open(self._assign)
            assert self._open is not None
            f = self._open[self.path]
            self._tfile = None if self._assign else _torchfile.TorchFile.read(f)
            if self._tfile is not None:
                self._view = self._tfile.view
            else:
                f.fh.seek(0)
                self._view = load_checked(f.fh, repr(f.path))
        return self._view

    def _locate(self, key: str) -> Any:
        node, rest = self._view if self._view is not None else self.meta_view(), key
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
