"""One ``torch.save`` zip file as a layout: a meta view first, then only the matched bytes.

``st.load_state_dict(model, "model.pt")`` used to memory-map the file and copy from the map:
fast, but a file truncated during the call killed the process with ``SIGBUS``, a file
rewritten in place gave garbage, and a storage claiming more bytes than its zip record was
accepted (torch's reader refuses it). Reading the whole file instead costs a fresh allocation
of every tensor (about 2x the mapped path). This module does neither:

1. the record ``data.pkl`` is unpickled by safetorch's restricted unpickler (the same policy
   as ``st.load``) with storages on the ``meta`` device, so the result has the checkpoint's
   structure and shapes and no data; torch's own rebuild functions build every tensor, and
   each is noted with its storage record, offset, size and stride;
2. every storage record is checked against the zip directory: stored (not compressed), its
   local header sound, and at least as large as the storage the pickle claims; every tensor
   lies inside its storage;
3. after key matching, only the matched tensors are read, with ``pread`` into one reusable
   buffer, and handed to ``Module.load_state_dict`` batch by batch (hooks honoured).

A short read (the file truncated meanwhile) is a ``CheckpointError``; nothing is mapped. Any
file this path does not cover (legacy format, compressed records, tensor kinds other than
plain tensors and parameters, ``assign=True``) goes through :func:`safetorch.load` as before;
so does any file the meta pass refuses, which then gets ``st.load``'s own error.
"""

from __future__ import annotations

import io
import logging
import struct
import zipfile
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

import torch

from safetorch.checkpoint import _reader, _scan, _unpickler
from safetorch.errors import CheckpointError

__all__: List[str] = []  # private: used by safetorch.checkpoint.model_state

logger = logging.getLogger("safetorch")

_SCRATCH_BYTES = 256 << 20
_ALIGN = 64

# (record data offset, record bytes, dtype, storage offset, size, stride)
_Where = Tuple[int, int, torch.dtype, int, Tuple[int, ...], Tuple[int, ...]]


class _Fallback(Exception):
    """This file is not for the meta path: load it through st.load."""


def _span(offset: int, size: Tuple[int, ...], stride: Tuple[int, ...]) -> Tuple[int, int]:
    """(first, end) element of a strided view, relative to its storage."""
    if any(s == 0 for s in size):
        return offset, offset
    last = offset + sum((s - 1) * st for s, st in zip(size, stride))
    low = offset + sum((s - 1) * st for s, st in zip(size, stride) if st < 0)
    return min(offset, low), last + 1


def _contiguous_strides(size: Tuple[int, ...]) -> Tuple[int, ...]:
    strides, acc = [], 1
    for s in reversed(size):
        strides.append(acc)
        acc *= max(s, 1)
    return tuple(reversed(strides))


class TorchFile:
    """A checked ``torch.save`` zip file: ``view`` (the object, tensors on ``meta``) and the
    means to read matched tensors; :meth:`open` returns ``None`` where the file is for
    ``st.load``'s path instead."""

    kind = "file"

    def __init__(self, f: _reader.RegularFile, view: Any, where: Dict[int, _Where]) -> None:
        self.file = f
        self.path = f.path
        self.view = view
        self._where = where

    @classmethod
    def open(cls, path: Any) -> Optional["TorchFile"]:
        """:meth:`read` of ``path``, opened through the one reader (closed when ``None``)."""
        f = _reader.open_regular(path, "checkpoint")
        try:
            tfile = cls.read(f)
        except BaseException:
            f.close()
            raise
        if tfile is None:
            f.close()
        return tfile

    @classmethod
    def read(cls, f: _reader.RegularFile) -> Optional["TorchFile"]:
        """The meta pass over the open file ``f`` (which stays the caller's to close), or
        ``None`` where the file is for ``st.load``'s path."""
        try:
            view, where = _meta_pass(f)
        except _Fallback as why:
            logger.debug("%s: read through st.load (%s)", f.path, why)
            return None
        return cls(f, view, where)

    def close(self) -> None:
        self.file.close()

    def materialize(self, value: torch.Tensor) -> torch.Tensor:
        """One meta tensor of the view, read (a fresh tensor)."""
        out: Dict[str, Any] = {}
        self.load_values({"v": value}, out.update, scratch_bytes=0)
        return out["v"].clone()

    def load_values(
        self,
        values: Mapping[str, Any],
        apply: Callable[[Dict[str, Any]], None],
        scratch_bytes: int = _SCRATCH_BYTES,
        direct: Optional[Mapping[str, torch.Tensor]] = None,
    ) -> None:
        """Read the meta tensors among ``values`` (target key -> value of the view) and hand
        ``{target key: tensor}`` batches to ``apply``, which must copy them before it returns
        (the buffer is reused); other values pass through in the first batch.

        ``direct`` (target key -> destination) names the targets whose bytes may be read
        straight into the destination's memory, which is what ``Module.load_state_dict``
        would copy there (the caller has checked: same dtype and shape, contiguous CPU
        tensor, no load hook or ``_load_from_state_dict`` override on the way); a source
        that is not one contiguous run of bytes goes through ``apply`` instead.
        """
        plan: List[Tuple[str, _Where, int, int]] = []
        batch: Dict[str, Any] = {}
        direct = direct or {}
        for target, value in values.items():
            if not isinstance(value, torch.Tensor):
                batch[target] = value
                continue
            data_offset, _, dtype, offset, size, stride = self._where[id(value)]
            es = _element_size(dtype)
            first, end = _span(offset, size, stride)
            dest = direct.get(target)
            if (
                dest is not None
                and dest.dtype == dtype
                and tuple(dest.shape) == size
                and stride == _contiguous_strides(size)
                and offset == first
            ):
                self._read_into(dest, data_offset + first * es)
                continue
            plan.append(
                (target, self._where[id(value)], data_offset + first * es, (end - first) * es)
            )
        largest = max((n for *_, n in plan), default=0)
        scratch = torch.empty(max(scratch_bytes, largest) + _ALIGN, dtype=torch.uint8)
        used = 0
        for target, (_, _, dtype, offset, size, stride), start, nbytes in plan:
            if batch and used + nbytes > scratch.numel() - _ALIGN:
                apply(batch)
                batch, used = {}, 0
            buf = scratch[used : used + nbytes]
            self._read_into(buf, start)
            es = _element_size(dtype)
            first, _ = _span(offset, size, stride)
            typed = buf.view(dtype) if nbytes else torch.empty(0, dtype=dtype)
            if stride == _contiguous_strides(size) and offset == first:
                tensor = typed.view(size)
            else:
                tensor = typed.as_strided(size, stride, offset - first)
            batch[target] = tensor
            used += -(-nbytes // _ALIGN) * _ALIGN
            del es
        if batch:
            apply(batch)

    def _read_into(self, buf: torch.Tensor, start: int) -> None:
        self.file.readinto(buf, start)


def _element_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _record_offsets(f: _reader.RegularFile) -> Tuple[str, Dict[str, Tuple[int, int]]]:
    """The record prefix and, for each storage record, (data offset, bytes), checked."""
    try:
        archive = zipfile.ZipFile(f.fh)
        infos = archive.infolist()
    except Exception as exc:  # BadZipFile, OverflowError, ...: st.load says what is wrong
        raise _Fallback(f"zip directory: {exc}") from None
    names = [i.filename for i in infos]
    prefix = _scan.zip_record_prefix(names)
    if f"{prefix}/data.pkl" not in names or f"{prefix}/constants.pkl" in names:
        raise _Fallback("not a torch.save zip")
    records: Dict[str, Tuple[int, int]] = {}
    data = f"{prefix}/data/"
    for info in infos:
        if not info.filename.startswith(data):
            continue
        if info.compress_type != zipfile.ZIP_STORED or info.external_attr & 0x10:
            raise _Fallback("compressed or damaged storage record")
        header = f.pread(30, info.header_offset)
        if header[:4] != b"PK\x03\x04":
            raise _Fallback("bad local header")
        n, m = struct.unpack("<HH", header[26:30])
        start = info.header_offset + 30 + n + m
        if info.file_size != info.compress_size or start + info.file_size > f.size:
            raise _Fallback("storage record outside the file")
        records[info.filename[len(data) :]] = (start, info.file_size)
    f.fh.seek(0)
    return prefix, records


def _meta_pass(f: _reader.RegularFile) -> Tuple[Any, Dict[int, _Where]]:
    if f.pread(min(4, f.size), 0) != b"PK\x03\x04":
        raise _Fallback("not a zip file")
    prefix, records = _record_offsets(f)
    storages: Dict[int, Tuple[Any, str, int]] = {}  # id(storage) -> (storage, key, nbytes)
    where: Dict[int, _Where] = {}
    keep: List[Any] = []
    rebuild_v2 = torch._utils._rebuild_tensor_v2
    rebuild_parameter = torch._utils._rebuild_parameter

    def note(t: Any, storage: Any, offset: int, size: Any, stride: Any) -> None:
        held = storages.get(id(storage))
        if held is None:
            raise _Fallback("a tensor on a storage the meta pass did not make")
        _, key, nbytes = held
        if key not in records:
            raise CheckpointError(
                f"cannot load checkpoint {f.path!r}: storage record {key!r} is missing from the "
                "zip archive"
            )
        data_offset, record_bytes = records[key]
        _unpickler.check_storage_fits(repr(f.path), key, nbytes, record_bytes)
        dtype = t.dtype
        size_t, stride_t = tuple(int(s) for s in size), tuple(int(s) for s in stride)
        first, end = _span(int(offset), size_t, stride_t)
        if first < 0 or end * _element_size(dtype) > nbytes:
            raise CheckpointError(
                f"cannot load checkpoint {f.path!r}: a tensor of size {list(size_t)} lies "
                f"outside its storage {key!r} ({nbytes} bytes)"
            )
        keep.append(t)
        where[id(t)] = (data_offset, record_bytes, dtype, int(offset), size_t, stride_t)

    def tensor_v2(storage: Any, storage_offset: Any, size: Any, stride: Any, *rest: Any) -> Any:
        t = rebuild_v2(storage, storage_offset, size, stride, *rest)
        note(t, storage, storage_offset, size, stride)
        return t

    def parameter(data: Any, *rest: Any) -> Any:
        p = rebuild_parameter(data, *rest)
        if id(data) not in where:
            raise _Fallback("a parameter of an unknown tensor")
        keep.append(p)
        where[id(p)] = where[id(data)]
        return p

    module = _unpickler.make_restricted_pickle_module(
        {"torch._utils._rebuild_tensor_v2": tensor_v2, "torch._utils._rebuild_parameter": parameter}
    )

    class MetaUnpickler(module.Unpickler):  # type: ignore[name-defined]  # a class of the synthetic pickle module
        def find_class(self, mod: str, name: str) -> Any:
            if isinstance(name, str) and "Storage" in name and mod == "torch":
                try:
                    return torch.serialization.StorageType(name)
                except Exception:
                    pass
            return super().find_class(mod, name)

        def persistent_load(self, pid: Any) -> Any:
            _, storage_type, key, _location, numel = pid[:5]
            dtype = torch.uint8 if storage_type is torch.UntypedStorage else storage_type.dtype
            nbytes = _unpickler.storage_nbytes(storage_type, numel)
            for s, k, _n in storages.values():
                if k == str(key):
                    return s  # the same storage again (tied weights)
            untyped = torch.UntypedStorage(nbytes, device="meta")
            typed = torch.storage.TypedStorage(wrap_storage=untyped, dtype=dtype, _internal=True)
            storages[id(typed)] = (typed, str(key), nbytes)
            return typed

    try:
        archive = zipfile.ZipFile(f.fh)
        pickled = archive.read(f"{prefix}/data.pkl")
        if len(pickled) > 1 << 30:
            raise _Fallback("data.pkl is large")
        view = MetaUnpickler(io.BytesIO(pickled), encoding="utf-8").load()
    except (_Fallback, CheckpointError):
        raise
    except Exception as exc:  # refused globals, corrupt pickles...: st.load gives the error
        raise _Fallback(f"{type(exc).__name__}: {exc}") from None
    if not _covered(view, where):
        raise _Fallback("tensors of a kind the meta pass does not read")
    return view, where


def _covered(obj: Any, where: Dict[int, _Where], depth: int = 0) -> bool:
    if isinstance(obj, torch.Tensor):
        return id(obj) in where
    if depth > 50:
        return False
    if isinstance(obj, Mapping):
        return all(_covered(v, where, depth + 1) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return all(_covered(v, where, depth + 1) for v in obj)
    return not hasattr(obj, "__dict__") or not any(
        isinstance(v, torch.Tensor) for v in vars(obj).values()
    )
