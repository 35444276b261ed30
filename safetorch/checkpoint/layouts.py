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
import json
import os
import warnings
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Tuple

import torch

from safetorch import _compat
from safetorch._atomic import atomic_write, atomic_write_dir, atomic_write_text
from safetorch.checkpoint import _unpickler
from safetorch.errors import CheckpointError, CheckpointFileNotFoundError

__all__: List[str] = []  # private module: used by safetorch.checkpoint.io and cli

_dcp_available: bool


@_compat.register_binder
def _bind() -> None:
    global _dcp_available
    _dcp_available = _compat.HAS_DCP  # torch >= 2.0


DCP_METADATA = ".metadata"
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

_SAFETENSORS_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
for _name, _attr in (("F8_E4M3", "float8_e4m3fn"), ("F8_E5M2", "float8_e5m2")):
    if hasattr(torch, _attr):  # float8 dtypes: torch 2.1+
        _SAFETENSORS_DTYPES[_name] = getattr(torch, _attr)


def _meta(shape: Any, dtype: torch.dtype) -> torch.Tensor:
    return torch.empty(tuple(shape), dtype=dtype, device="meta")


def nest_flat_keys(flat: Mapping[str, Any]) -> Any:
    """``{"model.0.weight": t, "epoch": b}`` -> ``{"model": {"0.weight": t}, "epoch": b}``.

    A flat mapping whose entries are all tensors is a state dict as it is (DCP of a bare
    ``model.state_dict()``); otherwise keys are grouped by their first segment, the way DCP
    flattened the nested dict it saved.
    """
    if flat and all(isinstance(v, torch.Tensor) for v in flat.values()):
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


class Layout:
    """A resolved checkpoint source: what it is, its meta view and how to read tensors."""

    kind = "file"

    def __init__(self, path: str, description: str) -> None:
        self.path = path
        self.description = description

    def meta_view(self) -> Any:  # pragma: no cover - overridden
        raise NotImplementedError

    def load_into(
        self,
        model: torch.nn.Module,
        pairs: List[Tuple[str, str]],
        apply: Callable[[Dict[str, Any]], None],
    ) -> None:  # pragma: no cover - overridden
        """Read the source keys of ``pairs`` (``(target_key, full_source_key)``) and hand
        ``{target_key: tensor}`` batches to ``apply``."""
        raise NotImplementedError

    def files(self) -> List[str]:
        return [self.path]


# --- sharded indexes ---------------------------------------------------------------------------
def read_safetensors_header(path: str) -> Dict[str, Any]:
    """The JSON header of a .safetensors file (dtypes, shapes, offsets), reading only it."""
    with open(path, "rb") as fh:
        raw = fh.read(8)
        if len(raw) != 8:
            raise CheckpointError(f"{path!r} is not a safetensors file (shorter than 8 bytes)")
        size = int.from_bytes(raw, "little")
        if not 2 <= size <= 100_000_000 or size > os.path.getsize(path) - 8:
            raise CheckpointError(f"{path!r} is not a valid safetensors file (header size {size})")
        try:
            header = json.loads(fh.read(size))
        except ValueError as exc:
            raise CheckpointError(f"{path!r} has a corrupt safetensors header ({exc})") from None
    header.pop("__metadata__", None)
    return header


def _safetensors_meta(path: str) -> Dict[str, torch.Tensor]:
    out: Dict[str, torch.Tensor] = {}
    for key, info in read_safetensors_header(path).items():
        dtype = _SAFETENSORS_DTYPES.get(info.get("dtype"))
        if dtype is None:
            raise CheckpointError(f"{path!r}: tensor {key!r} has unsupported dtype {info!r}")
        out[key] = _meta(info["shape"], dtype)
    return out


def _safetensors_module() -> Any:
    try:
        import safetensors.torch as st_torch
    except ImportError:
        raise CheckpointError(
            "reading .safetensors shards needs the safetensors package; install it with: "
            "pip install 'safetorch[safetensors]'"
        ) from None
    return st_torch


class ShardedIndex(Layout):
    """``*.index.json`` with a ``weight_map`` of key -> shard file (safetensors or torch)."""

    kind = "sharded index"

    def __init__(self, path: str, description: str) -> None:
        super().__init__(path, description)
        try:
            with open(path, encoding="utf-8") as fh:
                index = json.load(fh)
            weight_map = index["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise CheckpointError(
                f"cannot read the shard index {path!r}: {exc}; expected JSON with a "
                "'weight_map' of tensor name -> shard file"
            ) from None
        root = os.path.dirname(os.path.abspath(path))
        self.weight_map: Dict[str, str] = {}
        for key, name in weight_map.items():
            shard = os.path.normpath(os.path.join(root, name))
            if os.path.dirname(shard) != root:  # "../x": never outside the index's directory
                raise CheckpointError(f"shard {name!r} in {path!r} is outside its directory")
            self.weight_map[key] = shard
        missing = sorted({s for s in self.weight_map.values() if not os.path.isfile(s)})
        if missing:
            raise CheckpointFileNotFoundError(
                f"the shard index {path!r} names {len(missing)} missing shard(s): "
                f"{[os.path.basename(m) for m in missing[:5]]}"
            )
        self._bin_cache: Dict[str, Any] = {}

    def files(self) -> List[str]:
        return sorted(set(self.weight_map.values()))

    def _is_safetensors(self, shard: str) -> bool:
        return shard.endswith(".safetensors")

    def _bin(self, shard: str) -> Mapping[str, Any]:
        if shard not in self._bin_cache:
            from safetorch.checkpoint import io as ckpt_io

            self._bin_cache[shard] = ckpt_io.load_for_copy(shard)
        return self._bin_cache[shard]

    def meta_view(self) -> Any:
        view: Dict[str, Any] = {}
        for shard in self.files():
            keys = [k for k, s in self.weight_map.items() if s == shard]
            if self._is_safetensors(shard):
                meta = _safetensors_meta(shard)
            else:
                loaded = self._bin(shard)
                meta = {k: _meta(v.shape, v.dtype) for k, v in loaded.items() if torch.is_tensor(v)}
            for key in keys:
                if key not in meta:
                    raise CheckpointError(
                        f"the shard index {self.path!r} maps {key!r} to "
                        f"{os.path.basename(shard)!r}, which does not contain it"
                    )
                view[key] = meta[key]
        return view

    def load_into(
        self,
        model: torch.nn.Module,
        pairs: List[Tuple[str, str]],
        apply: Callable[[Dict[str, Any]], None],
    ) -> None:
        by_shard: Dict[str, List[Tuple[str, str]]] = collections.defaultdict(list)
        for target, source in pairs:
            by_shard[self.weight_map[source]].append((target, source))
        for shard, items in sorted(by_shard.items()):
            if self._is_safetensors(shard):
                _safetensors_module()  # the install hint, if the package is missing
                from safetensors import safe_open

                with safe_open(shard, framework="pt", device="cpu") as fh:
                    apply({t: fh.get_tensor(s) for t, s in items})
            else:
                loaded = self._bin(shard)
                apply({t: loaded[s] for t, s in items})
                self._bin_cache.pop(shard, None)  # drop the map once copied


class SafetensorsFile(ShardedIndex):
    """One ``.safetensors`` file, read lazily like a one-shard index."""

    kind = "safetensors file"

    def __init__(self, path: str, description: str) -> None:
        Layout.__init__(self, path, description)
        self.weight_map = {k: path for k in read_safetensors_header(path)}
        self._bin_cache = {}


# --- DCP ---------------------------------------------------------------------------------------
_DCP_METADATA_GLOBALS = (
    "torch.distributed.checkpoint.metadata.Metadata",
    "torch.distributed.checkpoint.metadata.TensorStorageMetadata",
    "torch.distributed.checkpoint.metadata.BytesStorageMetadata",
    "torch.distributed.checkpoint.metadata.ChunkStorageMetadata",
    "torch.distributed.checkpoint.metadata.TensorProperties",
    "torch.distributed.checkpoint.metadata.MetadataIndex",
    "torch.distributed.checkpoint.metadata.StorageMeta",
    "torch.distributed.checkpoint.metadata._MEM_FORMAT_ENCODING",
    "torch.distributed.checkpoint.filesystem._StorageInfo",
    "torch.distributed.checkpoint.filesystem._StoragePrefix",
    "pathlib.PosixPath",
    "pathlib.WindowsPath",
    "pathlib.PurePosixPath",
    "pathlib.PureWindowsPath",
)


def read_dcp_metadata(directory: str) -> Any:
    """DCP's ``.metadata`` through the restricted unpickler (DCP's metadata classes only)."""
    path = os.path.join(directory, DCP_METADATA)
    allowed = {}
    for name in _DCP_METADATA_GLOBALS:
        try:
            allowed[name] = _unpickler.import_global(name)
        except (ImportError, AttributeError):
            continue  # a class this torch's DCP does not have: no file of it needs it
    module = _unpickler.make_restricted_pickle_module(allowed)
    try:
        with open(path, "rb") as fh:
            return module.Unpickler(fh, encoding="utf-8").load()
    except _unpickler.RefusedGlobal as exc:
        from safetorch.errors import UnsafeCheckpointError

        raise UnsafeCheckpointError(
            f"refused to read the DCP metadata {path!r}: it references {exc.name!r}, which "
            "is not a DCP metadata class; nothing from the file was executed",
            (exc.name,),
        ) from None
    except Exception as exc:
        raise CheckpointError(
            f"cannot read the DCP metadata {path!r}: {type(exc).__name__}: {exc}"
        ) from None


def _safe_reader(directory: str) -> Any:
    from torch.distributed.checkpoint import FileSystemReader

    class SafeReader(FileSystemReader):
        """FileSystemReader whose metadata comes from the restricted unpickler."""

        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            metadata = read_dcp_metadata(directory)
            storage_meta = getattr(metadata, "storage_meta", None)
            if storage_meta is not None and hasattr(self, "load_id"):
                storage_meta.load_id = self.load_id
            return metadata

    return SafeReader(directory)


@contextlib.contextmanager
def _single_process_quiet() -> Iterator[None]:
    from safetorch.checkpoint.loading import _torch_internals_quiet

    # torch 2.x's DCP filesystem writer calls tensor.storage(), which warns "TypedStorage is
    # deprecated" from inside torch (once per process): not about anything the caller did.
    with warnings.catch_warnings(), _torch_internals_quiet():
        # DCP says it "assumes the intent is to load in a single process" without a group.
        warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
        warnings.filterwarnings("ignore", message=".*assuming the intent is to.*")
        yield


def dcp_load(state_dict: Dict[str, Any], directory: str, planner: Any = None) -> None:
    """``torch.distributed.checkpoint.load`` (in place) with the safe metadata reader.

    torch 2.2+ has ``dcp.load``, which works without a process group; before it,
    ``dcp.load_state_dict`` needs ``no_dist=True`` when no group is initialized.
    """
    import torch.distributed.checkpoint as dcp

    kwargs: Dict[str, Any] = {"storage_reader": _safe_reader(directory)}
    if planner is not None:
        kwargs["planner"] = planner
    with _single_process_quiet():
        if hasattr(dcp, "load"):
            dcp.load(state_dict, **kwargs)
        else:
            from safetorch import _dist

            if not _dist.initialized():
                kwargs["no_dist"] = True
            dcp.load_state_dict(state_dict, **kwargs)


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
        self.metadata = read_dcp_metadata(path)

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
                out[key] = "<bytes>"  # a pickled value: never read by model loading
        return out

    def meta_view(self) -> Any:
        return nest_flat_keys(self.flat_meta())

    def load_into(
        self,
        model: torch.nn.Module,
        pairs: List[Tuple[str, str]],
        apply: Callable[[Dict[str, Any]], None],
    ) -> None:
        # In place into the model's own tensors (DTensor shards included): DCP reads and
        # reshards each chunk into its destination, so peak memory stays near one chunk.
        targets = model.state_dict(keep_vars=True)
        dest = {source: targets[target].detach() for target, source in pairs}
        dcp_load(dest, self.path)


# --- resolution --------------------------------------------------------------------------------
def _is_index(path: str) -> bool:
    return path.endswith(".index.json")


def resolve(path: Any) -> Optional[Layout]:
    """The layout of a path, or ``None`` for a single torch.save file (read by ``st.load``).

    Raises:
        CheckpointError: a directory holding no model weights, or several candidates (the
            error lists them).
    """
    p = os.fsdecode(os.fspath(path))
    if os.path.isfile(p):
        if _is_index(p):
            return ShardedIndex(p, f"shard index {os.path.basename(p)}")
        return None
    if not os.path.isdir(p):
        return None  # st.load reports the missing file
    names = set(os.listdir(p))
    if DCP_METADATA in names:
        return DCPDirectory(p, f"DCP directory {p!r}")
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


def _file_layout(path: str, description: str) -> Optional[Layout]:
    if _is_index(path):
        return ShardedIndex(path, f"shard index {description}")
    if path.endswith(".safetensors"):
        return SafetensorsFile(path, description)
    return FileLayout(path, description)


class FileLayout(Layout):
    """One torch.save file picked inside a directory (loaded by st.load as usual)."""

    kind = "file"


# --- conversions (safetorch ckpt convert / inspect) --------------------------------------------
def dcp_to_object(directory: str) -> Any:
    """The whole content of a DCP directory as the nested object it was saved from.

    Tensors are allocated on the CPU and filled by DCP; byte entries are loaded weights-only.
    The nesting comes from DCP's own ``planner_data`` (flattened key -> original path) where
    it is present, else from the first key segment.
    """
    from safetorch.checkpoint.state import _safe_planner

    dcp_dir = DCPDirectory(directory, directory)
    flat: Dict[str, Any] = {}
    for key, value in dcp_dir.flat_meta().items():
        flat[key] = torch.empty(value.shape, dtype=value.dtype) if torch.is_tensor(value) else None
    dcp_load(flat, directory, planner=_safe_planner())
    paths = getattr(dcp_dir.metadata, "planner_data", None) or {}
    if not paths:
        return nest_flat_keys(flat)
    out: Dict[Any, Any] = {}
    for key, value in flat.items():
        path = paths.get(key, (key,))
        node = out
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = value
    return out


def save_dcp(obj: Mapping[str, Any], directory: str) -> None:
    """Write ``obj`` as a DCP directory on one process, atomically (``_atomic``'s directory
    writer: a temp sibling, then a rename over ``directory``, which it replaces)."""
    import torch.distributed.checkpoint as dcp

    def write(tmp: str) -> None:
        with _single_process_quiet():
            if hasattr(dcp, "save"):  # torch 2.2+
                dcp.save(dict(obj), checkpoint_id=tmp)
            else:
                dcp.save_state_dict(
                    dict(obj), storage_writer=dcp.FileSystemWriter(tmp), no_dist=True
                )

    atomic_write_dir(directory, write)


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
    st_torch = _safetensors_module()
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
    if layout is None:
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
        from safetorch.checkpoint.keys import find_state_dict, known_prefixes, state_dict_keys

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
