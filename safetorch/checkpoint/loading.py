"""st.load: weights-only loading on every torch, with a clear error for every failure.

torch's own ``torch.load`` is captured at import (``_torch_load``): monkeypatch mode later
routes ``torch.load`` here, and this module must keep calling the original.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import pickle
import types
import warnings
from typing import (
    IO,
    Any,
    Callable,
    Dict,
    Iterable,
    List,
    Mapping,
    Optional,
    Union,
)

import torch

from safetorch import _compat
from safetorch._stack import user_stacklevel
from safetorch._text import escape
from safetorch.checkpoint import _bytes, _formats, _reader, _scan, _unpickler
from safetorch.checkpoint._common import (  # re-exported: the same objects
    MapToAvailable,
    PathLike,
    _first_line,
    _torch_internals_quiet,
)
from safetorch.errors import (
    CheckpointError,
    CheckpointFileNotFoundError,
    CheckpointFileObjectError,
    CheckpointFormatError,
    CheckpointNotSeekableError,
    CheckpointWarning,
    SafetorchError,
    UnsafeCheckpointError,
)

__all__ = ["load", "MapToAvailable", "load_for_copy"]

logger = logging.getLogger("safetorch")

# The originals, captured before any monkeypatching can replace them.
_torch_load = torch.load

FileLike = Union[PathLike, IO[bytes]]


def _quiet_torch_load(*args: Any, **kwargs: Any) -> Any:
    with _torch_internals_quiet():
        return _torch_load(*args, **kwargs)


# --- branch binding (see _compat.register_binder) -------------------------------------------
_defer_to_torch: bool
_load_restricted_impl: Callable[..., Any]
_mmap_supported: bool


def _load_restricted(
    f: Any,
    map_location: Any,
    use_mmap: bool,
    extra: Mapping[str, Any],
    encoding: str,
    records: Optional[Mapping[str, int]] = None,
    unpickler: Any = None,
) -> Any:
    """Load with safetorch's restricted unpickler (see _unpickler's opcode policy).

    torch's own format readers ``_load`` (zip) / ``_legacy_load`` do the file work: both
    subclass ``pickle_module.Unpickler`` and set its ``persistent_load``, so every opcode goes
    through the restricted unpickler (same signatures 1.13 to 2.x). Calling them directly,
    rather than ``torch.load(pickle_module=...)``, keeps the path independent of torch.load's
    defaults and environment switches (TORCH_FORCE_WEIGHTS_ONLY_LOAD) and of its TorchScript
    and tar dispatch, which ``load`` has already refused.

    ``records`` (storage record -> bytes, from the zip directory) checks every storage the
    pickle claims against its record before torch reads it, mapped or not. ``unpickler`` is
    another pickle module to drive the same way (torch's own weights-only one).
    """
    if unpickler is not None:
        module = unpickler
    else:
        module = _unpickler.make_restricted_pickle_module(extra)
    if records is not None:
        module = _records_checked(module, records, _display(f))
    with _torch_internals_quiet(), _compat.open_file_like(f, "rb") as opened:
        if _compat.is_zipfile(opened):
            with _compat.open_zipfile_reader(opened) as archive:
                kwargs: Dict[str, Any] = {}
                if use_mmap:  # MAP_PRIVATE, as torch.load(mmap=True) by default
                    kwargs["overall_storage"] = torch.UntypedStorage.from_file(
                        os.fspath(f), False, os.path.getsize(f)
                    )
                return _compat.zip_load(archive, map_location, module, encoding=encoding, **kwargs)
        return _compat.legacy_load(opened, map_location, module, encoding=encoding)


def _load_torch_weights_only(
    f: Any, map_location: Any, use_mmap: bool, records: Optional[Mapping[str, int]] = None
) -> Any:
    """torch >= 2.6: torch's own weights-only unpickler (defer to it where it is as strict).

    A zip file goes through torch's zip reader with that unpickler, as ``torch.load`` does,
    plus the storage-record check (torch 2.6-2.9 have none, and no torch checks a mapped
    storage); the legacy format through ``torch.load`` itself.
    """
    if records is not None:
        from torch import _weights_only_unpickler

        try:
            return _load_restricted(
                f, map_location, use_mmap, {}, "utf-8", records, _weights_only_unpickler
            )
        except pickle.UnpicklingError as exc:  # worded as torch.load words its unpickler's
            raise pickle.UnpicklingError(
                f"Weights only load failed. WeightsUnpickler error: {exc}"
            ) from exc
    return _quiet_torch_load(
        f, map_location=map_location, weights_only=True, **_mmap_kwargs(use_mmap)
    )


def _records_checked(module: Any, records: Mapping[str, int], name: str) -> Any:
    """``module`` with an Unpickler that compares each storage's size, as its pickle claims it,
    with its zip record before torch's ``persistent_load`` reads (or maps) it.

    torch's reader checks this only from late 2025 (pytorch#165553), and never on the mapped
    path: before, a storage longer than its record read the bytes after it (other records, the
    zip directory) as tensor data.
    """
    base = module.Unpickler

    def check(pid: Any) -> None:
        if type(pid) is not tuple or len(pid) != 5 or pid[0] != "storage":
            return  # torch's own persistent_load refuses what it cannot read
        _, storage_type, key, _location, numel = pid
        held = records.get(str(key))
        if held is None or type(numel) is not int:
            return  # a missing record: torch's reader names it
        _unpickler.check_storage_fits(
            name, str(key), _unpickler.storage_nbytes(storage_type, numel), held
        )

    class Unpickler(base):  # type: ignore[valid-type, misc]  # a class of a pickle module
        @property
        def persistent_load(self) -> Callable[[Any], Any]:
            return self.__dict__.get("_checked_persistent_load") or super().persistent_load

        @persistent_load.setter
        def persistent_load(self, load: Callable[[Any], Any]) -> None:
            def checked(pid: Any) -> Any:
                check(pid)
                return load(pid)

            self.__dict__["_checked_persistent_load"] = checked

    checked_module = types.ModuleType(getattr(module, "__name__", "pickle_module"))
    checked_module.__dict__.update(vars(module))
    checked_module.Unpickler = Unpickler  # type: ignore[attr-defined]  # a synthetic pickle module
    return checked_module


def _load_full(f: Any, map_location: Any, pickle_module: Any, use_mmap: bool, encoding: str) -> Any:
    # weights_only=False said explicitly: torch 2.6's default and TORCH_FORCE_* environment
    # variables decide nothing then.
    kwargs: Dict[str, Any] = dict(_mmap_kwargs(use_mmap), encoding=encoding, weights_only=False)
    if pickle_module is not None:
        kwargs["pickle_module"] = pickle_module
    return _quiet_torch_load(f, map_location=map_location, **kwargs)


def _mmap_kwargs(use_mmap: bool) -> Dict[str, Any]:
    return {"mmap": True} if use_mmap else {}


@_compat.register_binder
def _bind() -> None:
    global _defer_to_torch, _mmap_supported
    # torch 2.6 (the release whose weights-only loader refuses TorchScript archives, the fix for
    # CVE-2025-32434, and made weights_only the default): from there on torch's weights-only
    # unpickler is at least as strict as ours for every opcode it supports, so files that only
    # need torch's own allow-list and opcodes go to it. Older torch always uses ours.
    _defer_to_torch = _compat.LOAD_WEIGHTS_ONLY_DEFAULT_TRUE
    _mmap_supported = _compat.LOAD_HAS_MMAP  # torch >= 2.1


# --- st.load ----------------------------------------------------------------------------------
_is_path = _formats.is_path


def _display(f: Any) -> str:
    if _is_path(f):
        return repr(os.fsdecode(f))
    name = getattr(f, "name", None)
    return repr(name) if isinstance(name, str) else f"<{type(f).__name__}>"


def _check_file_argument(f: Any, function: str = "st.load") -> None:
    if _is_path(f):
        return
    if not callable(getattr(f, "read", None)):
        raise TypeError(
            f"{function}: f must be a path (str or os.PathLike) or a binary file object with "
            f"read(), seek() and tell(), got {type(f).__name__} {f!r:.80}"
        )
    missing = [m for m in ("seek", "tell") if not callable(getattr(f, m, None))]
    if missing:
        raise CheckpointFileObjectError(
            f"cannot load checkpoint {_display(f)}: the file object has no "
            f"{' or '.join(m + '()' for m in missing)}. You can only torch.load from a file that "
            "is seekable. Please pre-load the data into a buffer like io.BytesIO and try to "
            "load from it instead."
        )
    seekable = getattr(f, "seekable", None)
    if callable(seekable) and not seekable():
        raise CheckpointNotSeekableError(
            f"cannot load checkpoint {_display(f)}: the file object is not seekable. You can "
            "only torch.load from a file that is seekable. Please pre-load the data into a "
            "buffer like io.BytesIO and try to load from it instead."
        )


class _ZipFacts:
    """What load needs to know about a zip checkpoint, read from its central directory."""

    __slots__ = ("problem", "storages_stored", "scan", "records")

    def __init__(
        self,
        problem: Optional[str],
        storages_stored: bool,
        records: Optional[Dict[str, int]] = None,
    ) -> None:
        self.problem = problem
        self.storages_stored = storages_stored
        self.records = records  # storage record name (after data/) -> bytes in the zip
        self.scan: Optional[_scan.ScanResult] = None  # data.pkl's, when asked for


def _zip_facts(f: Any, scan: bool) -> _ZipFacts:
    """Central-directory facts (nothing is decompressed): torch's record prefix, whether it is
    a TorchScript archive, whether data.pkl exists and every storage is stored uncompressed,
    and whether each storage's entry is sound; with ``scan``, also data.pkl's globals, from
    the same open archive (the directory is read once)."""
    import zipfile

    with contextlib.ExitStack() as stack:
        try:
            fh = stack.enter_context(open(f, "rb")) if _is_path(f) else _scan.seekable(f)
            start = fh.tell()
            stack.callback(fh.seek, start)
            archive = stack.enter_context(zipfile.ZipFile(fh))
            infos = archive.infolist()
        except Exception:  # BadZipFile, OSError, OverflowError (Python 3.9, bad end record), ...
            return _ZipFacts(
                "the zip archive is truncated or corrupt (its directory is unreadable)", False
            )
        facts = _storage_facts(archive, infos)
        if scan and facts.problem is None:
            facts.scan = _scan.scan_archive(archive)
        return facts


def _storage_facts(archive: Any, infos: List[Any]) -> _ZipFacts:
    import zipfile

    names = [i.filename for i in infos]
    prefix = _scan.zip_record_prefix(names)
    if f"{prefix}/constants.pkl" in names:
        return _ZipFacts(
            "it is a TorchScript archive (torch.jit.save), not a torch.save checkpoint; load it "
            "with torch.jit.load, which runs the TorchScript code it contains: only for files "
            "you trust",
            False,
        )
    if f"{prefix}/data.pkl" not in names:
        return _ZipFacts("it is a zip archive without data.pkl, not a torch.save checkpoint", False)
    data = f"{prefix}/data/"
    storages = [i for i in infos if i.filename.startswith(data)]
    stored = all(i.compress_type == zipfile.ZIP_STORED for i in storages)
    # torch's zip reader (miniz) takes an entry whose MS-DOS directory bit is set for a directory
    # and hands back uninitialized memory for it (seen on torch 2.8): never a storage.
    marked_dirs = [i.filename for i in storages if i.external_attr & 0x10 or i.is_dir()]
    if marked_dirs:
        return _ZipFacts(
            f"the zip archive is damaged (storage record {marked_dirs[0]!r} is marked as a "
            "directory)",
            False,
        )
    # Each storage's local header must agree with the directory (a 30-byte read each, nothing
    # decompressed): a damaged entry would make torch read tensor data from the wrong place.
    try:
        for info in storages:
            with archive.open(info):
                pass
    except Exception as exc:  # a local header that disagrees with the directory, ...
        return _ZipFacts(f"the zip archive is damaged ({type(exc).__name__}: {exc})", False)
    return _ZipFacts(None, stored, {i.filename[len(data) :]: i.file_size for i in storages})


def _refusal_message(name: str, unsafe: List[str]) -> str:
    """Why ``name`` was refused and every way out, in one message: the globals it names, the
    ones ``allow=`` may admit (classes of data, never a callable that can run code), and the
    two ways to trust the whole file."""
    dangerous = [n for n in unsafe if n in _unpickler.KNOWN_DANGEROUS]
    listed = ", ".join(escape(n) for n in unsafe)  # the file's text: never raw to a terminal
    message = (
        f"refused to load {name}: it references {len(unsafe)} global(s) outside the "
        f"weights-only allow-list: {listed}. Nothing from the file was executed."
    )
    if dangerous:
        message += (
            f" {', '.join(dangerous)} can run arbitrary code: trust this file only if you "
            "wrote it yourself."
        )
    admissible = [n for n in unsafe if _unpickler.allow_would_admit(n)]
    if admissible and len(admissible) == len(unsafe):
        flags = " ".join(f"--allow {n}" for n in admissible)
        message += (
            f" If they are data classes you trust, allow them for this load: "
            f"st.load({name}, allow={admissible!r}); or register them with torch: "
            f"torch.serialization.add_safe_globals([...]); under `safetorch run`: {flags} "
            f"(or SAFETORCH_ALLOW={','.join(admissible)})."
        )
    message += (
        f" Otherwise it needs full trust (a whole-model pickle, numpy arrays, custom objects): "
        f"if you trust the file, run `safetorch trust {_shown_path(name)}` once (or "
        f"st.trust(path)), or `safetorch run --trust {_shown_path(name)} ...` for one run; "
        "st.load then loads it as torch.load(weights_only=False) would. Files written by "
        "st.save, st.save_checkpoint, st.CheckpointSaver or under `safetorch run` are trusted "
        "already; a file saved before safetorch was used needs this one step, and a changed "
        "file needs it again."
    )
    return message


def _shown_path(name: str) -> str:
    """A display name (``repr`` of a path) as a shell word for the messages."""
    if len(name) >= 2 and name[0] == name[-1] and name[0] in "'\"":
        inner = name[1:-1]
        if inner and all(c.isalnum() or c in "._-/+~:@" for c in inner):
            return inner
    return "FILE"


def _load_safetensors(f: Any, name: str, map_location: Any) -> Any:
    st_torch = _reader.safetensors_package().torch  # or the error saying how to install it
    device = str(map_location) if isinstance(map_location, (str, torch.device)) else "cpu"
    try:
        if _is_path(f):
            return st_torch.load_file(os.fsdecode(f), device=device)
        tensors = st_torch.load(f.read())
        return {k: v.to(device) for k, v in tensors.items()} if device != "cpu" else tensors
    except Exception as exc:
        raise CheckpointError(
            f"cannot load {name}: not a valid safetensors file ({_first_line(exc)})"
        ) from None


def _failure_reason(exc: BaseException) -> str:
    if isinstance(exc, MemoryError):
        return "rebuilding its tensors ran out of memory (the file asks for huge sizes)"
    if isinstance(exc, (EOFError, pickle.UnpicklingError)):
        return "its pickle data is truncated or corrupt"
    text = str(exc)
    if any(k in text for k in ("PytorchStreamReader", "inline_container", "CRC", "zip")):
        return "the zip archive is damaged (a storage record is truncated or corrupt)"
    if isinstance(exc, (RuntimeError, OSError)):
        return "torch could not rebuild its tensors (truncated or corrupt storage data)"
    return "its contents are malformed"


def load(
    f: FileLike,
    map_location: Any = "cpu",
    pickle_module: Any = None,
    *,
    weights_only: Optional[bool] = None,
    mmap: Optional[bool] = None,
    allow: Iterable[Any] = (),
    encoding: str = "utf-8",
    verify: bool = False,
) -> Any:
    """Load a checkpoint safely: weights-only on every torch, CPU by default, never less strict
    than ``torch.load(weights_only=True)`` of the newest torch.

    Arguments follow ``torch.load``'s order. Every pickle goes through a weights-only unpickler:
    torch's own on torch >= 2.6 when the file needs nothing beyond torch's allow-list, else
    safetorch's (same opcode policy or stricter; see ``safetorch/checkpoint/_unpickler.py``).
    ``allow=`` applies to this call only: no other thread or later call sees it.

    Args:
        f: a path or a seekable binary file object (``torch.save`` zip or legacy format, or a
            ``.safetensors`` file).
        map_location: where tensors go, as for ``torch.load``; ``"cpu"`` by default so a
            checkpoint saved on a GPU loads on a CPU-only machine. ``"available"`` keeps
            torch's placement (each storage on the device it was saved from) except that
            storages saved on CUDA load on the CPU where there is no CUDA (see
            :class:`MapToAvailable`).
        pickle_module: ``None`` or the standard ``pickle`` module (both load weights-only);
            any other module (e.g. ``dill``) unpickles fully and needs ``weights_only=False``.
        weights_only: ``None`` (default): only tensors, containers and allow-listed
            classes are rebuilt, unless the file is trusted by provenance: its bytes hash to
            an entry of the user's ledger (safetorch wrote it: ``st.save``,
            ``st.save_checkpoint``, ``st.CheckpointSaver``, ``torch.save`` under
            ``safetorch run``; or the user trusted it: ``safetorch trust FILE``,
            ``st.trust``, ``safetorch run --trust FILE``). A trusted file that a weights-only
            load would refuse is read once into memory, hashed, and those same bytes are
            loaded as ``torch.load(weights_only=False)`` loads them (a whole-model pickle,
            numpy arrays). ``True``: weights-only, whatever the ledger says. ``False`` runs
            arbitrary pickle code: use it only for trusted files (a CheckpointWarning says
            so).
        mmap: ``True`` memory-maps the storages (torch >= 2.1, zip files given by path, and
            only uncompressed storages; otherwise the file is read, with a warning). The
            returned tensors then change if the file is rewritten later. ``None``/``False``
            read the file into memory.
        allow: extra globals allowed for this call, as classes/functions or ``"module.Name"``
            strings. ``argparse.Namespace`` is always allowed.
        encoding: for Python 2 strings in old checkpoints, as ``torch.load`` (e.g.
            ``"latin1"``).
        verify: ``True`` first checks the file's integrity, which torch never does: the
            CRC-32 of every record of a zip checkpoint, the header and offsets of a
            ``.safetensors`` file (see :mod:`safetorch.checkpoint.verify`); a flipped byte
            inside a storage raises ``CheckpointError`` instead of loading as a wrong weight.
            It reads the whole file once more (see ``benchmarks/RESULTS.md`` for the cost).
            A file trusted by provenance is checked the same way before it is hashed.
    Returns:
        The loaded object.

    Raises:
        UnsafeCheckpointError: the file references globals or pickle operations outside the
            weights-only policy; the error lists every unsafe global and each way to allow
            them; nothing was executed.
        CheckpointError: the file is empty, truncated, corrupt, not a checkpoint, a TorchScript
            or legacy tar archive, or its tensors cannot be rebuilt (also a FileNotFoundError
            when it does not exist, an io.UnsupportedOperation when it is not seekable).
        TypeError: ``f`` is neither a path nor a binary file object.

    >>> import io, torch, safetorch as st
    >>> buf = io.BytesIO(); torch.save({"w": torch.ones(2)}, buf); _ = buf.seek(0)
    >>> st.load(buf)
    {'w': tensor([1., 1.])}
    >>> _ = buf.seek(0); st.load(buf, verify=True)  # every record's CRC-32 checked first
    {'w': tensor([1., 1.])}
    """
    if verify:
        _check_file_argument(f)
        from safetorch.checkpoint.verify import check_file  # only when asked for

        check_file(f)  # a file object's position is restored
    if isinstance(map_location, str) and map_location == "available":
        map_location = MapToAvailable()
    return _load(
        f,
        map_location,
        pickle_module,
        weights_only=weights_only,
        mmap=mmap,
        allow=allow,
        encoding=encoding,
        mmap_for_copy=False,
    )


def _load(
    f: Any,
    map_location: Any,
    pickle_module: Any,
    *,
    weights_only: Optional[bool],
    mmap: Optional[bool],
    allow: Iterable[Any],
    encoding: str,
    mmap_for_copy: bool,
    display: Optional[str] = None,
) -> Any:
    _check_file_argument(f)
    if weights_only not in (None, True, False):
        raise TypeError(
            f"st.load: weights_only must be None, True or False, got "
            f"{type(weights_only).__name__} {weights_only!r}"
        )
    if not isinstance(encoding, str):
        raise TypeError(f"st.load: encoding must be a str, got {type(encoding).__name__}")
    if pickle_module is pickle:
        pickle_module = None  # the standard module: torch's default; load it weights-only
    safe = weights_only is not False
    name = display or _display(f)
    if pickle_module is not None and safe:
        raise ValueError(
            f"st.load({name}, pickle_module={getattr(pickle_module, '__name__', pickle_module)})"
            " unpickles fully, which can run arbitrary code; pass weights_only=False as well "
            "if you trust the file, or drop pickle_module to load it weights-only"
        )
    extra = _unpickler.resolve_allowed((*_unpickler.DEFAULT_EXTRA_ALLOWED, *allow))
    src: Any = f
    if _is_path(src):
        if os.path.isdir(src) or os.fsdecode(src).endswith(".index.json"):
            raise CheckpointError(
                f"cannot load checkpoint {name}: it is a "
                f"{'directory' if os.path.isdir(src) else 'shard index'}; load model weights "
                "from it with st.load_state_dict(model, path) (DCP directories, shard indexes "
                "and transformers/accelerate directories), or pass one file inside it"
            )
        try:
            size = os.path.getsize(src)
        except FileNotFoundError:
            raise CheckpointFileNotFoundError(
                f"checkpoint {name} does not exist (cwd: {os.getcwd()!r})"
            ) from None
        if size == 0:
            raise CheckpointError(f"cannot load checkpoint {name}: the file is empty")
    # A path is opened once, through the one reader: the sniff, the zip directory, the scan and
    # torch's reader all read this file object (torch's reader is as fast on a file object as
    # on a path: benchmarks/RESULTS.md); only a memory-mapped load maps the path as well.
    how = (name, map_location, pickle_module, weights_only, mmap, mmap_for_copy, extra, encoding)
    if _is_path(src):
        with _reader.open_regular(src, "checkpoint") as opened:
            return _load_file(opened.fh, os.fsdecode(os.fspath(src)), 0, *how)
    return _load_file(src, None, src.tell(), *how)


def _load_file(
    src: Any,
    path: Optional[str],
    start: int,
    name: str,
    map_location: Any,
    pickle_module: Any,
    weights_only: Optional[bool],
    mmap: Optional[bool],
    mmap_for_copy: bool,
    extra: Mapping[str, Any],
    encoding: str,
) -> Any:
    """The rest of :func:`_load`: ``src`` is an open binary file at ``start``; ``path`` its
    path where the caller gave one (what a memory map maps, and trust by provenance hashes)."""
    safe = weights_only is not False
    head = _formats.read_head(src)
    kind = _formats.sniff(src, head)
    if kind == "empty":
        raise CheckpointError(f"cannot load checkpoint {name}: the file is empty")
    if kind == "safetensors":
        return _load_safetensors(src if path is None else path, name, map_location)
    is_zip = kind == "zip"
    facts = _zip_facts(src, scan=safe) if is_zip else None
    want_mmap = bool(mmap) or (mmap_for_copy and mmap is not False)
    use_mmap = bool(
        want_mmap and _mmap_supported and facts and facts.storages_stored and path is not None
    )
    if mmap and not use_mmap:
        if facts is not None and facts.problem is None and not facts.storages_stored:
            warnings.warn(
                f"mmap=True ignored for {name}: its storages are compressed and a map would "
                "return the compressed bytes; the file is read instead",
                CheckpointWarning,
                stacklevel=user_stacklevel(),
            )
        else:
            logger.info(
                "mmap not possible for %s (legacy format, file object or torch < 2.1)", name
            )
    # torch 2.1-2.5's mmap path accepts only a str path (isinstance(f, str))
    load_src = path if use_mmap else src

    if not safe:
        warnings.warn(
            f"loading {name} with weights_only=False: unpickling can run arbitrary code; "
            "do this only for files you trust",
            CheckpointWarning,
            stacklevel=user_stacklevel(),
        )
        return _wrap_failures(
            name, lambda: _load_full(load_src, map_location, pickle_module, use_mmap, encoding)
        )

    if facts is not None and facts.problem is not None:
        raise CheckpointError(f"cannot load checkpoint {name}: {facts.problem}")
    if not is_zip:
        if kind == "tar":
            raise CheckpointError(
                f"cannot load checkpoint {name}: it is in the legacy tar format of torch < 0.4, "
                "which cannot be loaded weights-only. If you trust the file, load it with "
                "weights_only=False and re-save it with st.save_checkpoint"
            )
        if head[:1] != b"\x80":
            raise CheckpointFormatError(
                f"cannot load checkpoint {name}: it is not a PyTorch checkpoint (it starts "
                f"with {head[:8]!r})"
            )
    scan = facts.scan if facts is not None and facts.scan is not None else _scan.scan_file(src)
    src.seek(start)
    unsafe = _unpickler.unsafe_globals(scan.globals, extra)
    if (unsafe or scan.refused is not None) and weights_only is None:
        loaded = _load_if_trusted(
            src if path is None else path,
            start if path is None else None,
            name,
            map_location,
            encoding,
        )
        if loaded is not _UNTRUSTED:
            return loaded
    if unsafe:
        raise UnsafeCheckpointError(_refusal_message(name, unsafe), tuple(unsafe))
    if scan.refused is not None:
        raise UnsafeCheckpointError(
            f"refused to load {name}: it uses {scan.refused}, which weights-only loading "
            "refuses; nothing from the file was executed. If you trust the file: "
            f"`safetorch trust {_shown_path(name)}` once (or st.trust(path)), then load it "
            "again."
        )
    if not scan.complete:
        raise CheckpointFormatError(
            f"cannot load checkpoint {name}: {scan.stopped or 'its pickle data is corrupt'}"
        )
    defer = (
        _defer_to_torch
        and scan.torch_opcodes_only
        and encoding == "utf-8"
        # only torch's list and the user's add_safe_globals, which torch's loader honours too
        and not _unpickler.unsafe_globals(scan.globals, {})
        and not set(scan.globals) & set(extra)
        # bytearray and numpy's names: ours is stricter (see ours_is_stricter)
        and not any(_unpickler.ours_is_stricter(n) for n in scan.globals)
    )
    records = facts.records if facts is not None else None
    if defer:
        return _wrap_failures(
            name, lambda: _load_torch_weights_only(load_src, map_location, use_mmap, records)
        )
    return _wrap_failures(
        name,
        lambda: _load_restricted(load_src, map_location, use_mmap, extra, encoding, records),
    )


_UNTRUSTED = object()


def _load_if_trusted(
    src: Any, start: Optional[int], name: str, map_location: Any, encoding: str
) -> Any:
    """Load ``src`` fully if its bytes are trusted by provenance, else ``_UNTRUSTED``.

    The bytes are read once into memory and hashed while they are read; those same bytes are
    what torch unpickles (and, for a zip file on torch >= 2.1, what its tensors are views of,
    as torch's own ``mmap=True`` load makes them of a mapped file), so a file changed after the
    check is never what loads. A size no trusted file has costs one ``stat`` and reads nothing.
    """
    from safetorch.checkpoint import _provenance  # only for a file a weights-only load refuses

    if _is_path(src):
        with _reader.open_regular(src, "checkpoint") as opened:
            if not _provenance.may_hold(opened.size):
                return _UNTRUSTED
            if _mmap_supported and _formats.sniff(opened.fh) == "zip":
                memory = torch.empty(opened.size, dtype=torch.uint8)
                view = _bytes.writable_view(memory)
                try:
                    entry = _provenance.read_hashed_into(opened.fh, view)
                except OSError as exc:
                    raise CheckpointError(f"cannot load checkpoint {name}: {exc}") from None
                how = _provenance.trusted(entry)
                if how is None:
                    return _UNTRUSTED
                return _trusted_load(
                    name, how, lambda: _load_full_in_memory(view, memory, map_location, encoding)
                )
            data, entry = _provenance.read_hashed(opened.fh)
    else:
        begin = src.tell() if start is None else start
        end = src.seek(0, os.SEEK_END)
        src.seek(begin)
        if not _provenance.may_hold(end - begin):
            return _UNTRUSTED
        data, entry = _provenance.read_hashed(src)
        src.seek(begin)
    how = _provenance.trusted(entry)
    if how is None:
        return _UNTRUSTED
    buffer = io.BytesIO(data)
    result = _trusted_load(
        name, how, lambda: _load_full(buffer, map_location, None, False, encoding)
    )
    if not _is_path(src):
        src.seek(begin + len(data))
    return result


def _trusted_load(name: str, how: str, run: Callable[[], Any]) -> Any:
    from safetorch.checkpoint import _provenance

    logger.info("loading %s fully: its hash is in %s", name, how)
    _provenance.note("loaded", how)
    return _wrap_failures(name, run)


class _MemoryFile:
    """A read-only, seekable binary file over a byte view (what torch's zip reader reads the
    directory and data.pkl from; the storages come from the same memory, uncopied)."""

    def __init__(self, view: memoryview) -> None:
        self._view = view
        self._pos = 0

    def read(self, n: Optional[int] = -1) -> bytes:
        end = len(self._view) if n is None or n < 0 else min(len(self._view), self._pos + n)
        out = bytes(self._view[self._pos : end])
        self._pos = max(self._pos, end)
        return out

    def readinto(self, b: Any) -> int:
        n = max(0, min(len(b), len(self._view) - self._pos))
        b[:n] = self._view[self._pos : self._pos + n]
        self._pos += n
        return n

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._pos, os.SEEK_END: len(self._view)}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True


def _load_full_in_memory(view: memoryview, memory: Any, map_location: Any, encoding: str) -> Any:
    """A full unpickle of the zip checkpoint held in ``memory``; its storages are slices of it."""
    with _torch_internals_quiet(), _compat.open_zipfile_reader(_MemoryFile(view)) as archive:
        return _compat.zip_load(
            archive,
            map_location,
            pickle,
            encoding=encoding,
            overall_storage=memory.untyped_storage(),
        )


def load_checked(f: IO[bytes], display: Optional[str] = None) -> Any:
    """Weights-only load of an open binary file (one the checkpoint reader opened, or a record's
    bytes), read into memory, never mapped, onto the CPU; failures name ``display``."""
    return _load(
        f,
        "cpu",
        None,
        weights_only=True,
        mmap=False,
        allow=(),
        encoding="utf-8",
        mmap_for_copy=False,
        display=display,
    )


def _wrap_failures(name: str, run: Callable[[], Any]) -> Any:
    """Run a load; every failure becomes a CheckpointError naming the file and the reason."""
    try:
        return run()
    except (SafetorchError, Warning):
        raise  # ours already, or a warning the caller turned into an error
    except _unpickler.RefusedGlobal as exc:
        message = _refusal_message(name, [exc.name])
        if exc.reason:
            message = message.replace(
                " Nothing from the file was executed.",
                f" ({exc.reason}) Nothing from the file was executed.",
                1,
            )
        raise UnsafeCheckpointError(message, (exc.name,)) from None
    except (_unpickler.RefusedOpcode, pickle.UnpicklingError) as exc:
        text = str(exc)
        if isinstance(exc, _unpickler.RefusedOpcode) or "Weights only load failed" in text:
            # torch's message wraps its unpickler's reason after "WeightsUnpickler error:".
            reason = text.rsplit("WeightsUnpickler error:", 1)[-1].strip().splitlines()[0]
            raise UnsafeCheckpointError(
                f"refused to load {name}: {reason}; nothing from the file was executed. If "
                f"you trust the file: `safetorch trust {_shown_path(name)}` once (or "
                "st.trust(path)), then load it again."
            ) from None
        raise CheckpointFormatError(
            f"cannot load checkpoint {name}: {_failure_reason(exc)} ({_first_line(exc)})"
        ) from exc
    except Exception as exc:  # MemoryError included (an Exception subclass)
        raise CheckpointError(
            f"cannot load checkpoint {name}: {_failure_reason(exc)} ({_first_line(exc)})"
        ) from exc


def load_for_copy(source: Any) -> Any:
    """Weights-only load of a checkpoint whose tensors the caller copies before it returns.

    A path is opened once through the checkpoint reader (a regular file, never a FIFO) and
    read, not memory-mapped: a file truncated or rewritten during the call gives a
    ``CheckpointError`` or the old bytes, never ``SIGBUS`` or garbage.
    """
    if not _is_path(source):
        return load_checked(source)
    with _reader.open_regular(source, "checkpoint") as f:
        return load_checked(f.fh, repr(f.path))
