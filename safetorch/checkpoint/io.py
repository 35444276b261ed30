"""Loading and saving checkpoints: st.load, st.load_state_dict, st.save_checkpoint, CheckpointSaver.

torch's own callables are captured at import (``_torch_load``, ``_module_load_state_dict``,
``_torch_save``): monkeypatch mode later routes ``torch.load`` and ``Module.load_state_dict``
to the functions here, and these must keep calling the originals rather than themselves.
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import math
import os
import pickle
import re
import warnings
from typing import (
    IO,
    Any,
    Callable,
    Dict,
    Iterable,
    Iterator,
    List,
    Mapping,
    Optional,
    Tuple,
    Union,
)

import torch
from torch import nn

from safetorch import _compat, _dist
from safetorch._atomic import atomic_write
from safetorch._stack import user_stacklevel
from safetorch.checkpoint import _unpickler, layouts
from safetorch.checkpoint.keys import (
    N_AVERAGED,
    canonical_key,
    find_state_dict,
    remap_state_dict,
    state_dict_keys,
    strip_wrapper_prefixes,
    tensor_shape,
    unwrap_model,
)
from safetorch.checkpoint.report import LoadReport
from safetorch.checkpoint.state import STATE_FORMAT
from safetorch.errors import (
    CheckpointError,
    CheckpointFileNotFoundError,
    CheckpointFileObjectError,
    CheckpointMismatchError,
    CheckpointNotSeekableError,
    CheckpointWarning,
    SafetorchError,
    UnsafeCheckpointError,
)

__all__ = [
    "load",
    "load_state_dict",
    "save_checkpoint",
    "CheckpointSaver",
]

logger = logging.getLogger("safetorch")

# The originals, captured before any monkeypatching can replace them.
_torch_load = torch.load
_torch_save = torch.save
_module_load_state_dict = nn.Module.load_state_dict

PathLike = Union[str, "os.PathLike[str]"]
FileLike = Union[PathLike, IO[bytes]]

_ZIP_MAGIC = b"PK\x03\x04"


# torch's own deprecation warnings raised from inside torch.load/torch.save, not about anything
# the caller did: torch 2.0-2.x warn "TypedStorage is deprecated" from torch/storage.py while
# loading (once per process). Filtered by message only, around safetorch's own calls.
_TORCH_INTERNAL_WARNINGS = ("TypedStorage is deprecated",)


@contextlib.contextmanager
def _torch_internals_quiet() -> Iterator[None]:
    """Hide torch-internal deprecation warnings raised inside safetorch's own torch calls.

    torch warns about TypedStorage once per process; a warning hidden here does not use up
    that one warning, so user code touching TypedStorage still sees it.
    """
    once = getattr(getattr(torch, "storage", None), "_warn_typed_storage_removal", None)
    had = once.__dict__.get("has_warned") if once is not None else None
    with warnings.catch_warnings():
        for message in _TORCH_INTERNAL_WARNINGS:
            warnings.filterwarnings("ignore", message=message, category=UserWarning)
        try:
            yield
        finally:
            if once is not None:
                if had is None:
                    once.__dict__.pop("has_warned", None)
                else:
                    once.__dict__["has_warned"] = had


def _quiet_torch_load(*args: Any, **kwargs: Any) -> Any:
    with _torch_internals_quiet():
        return _torch_load(*args, **kwargs)


# --- branch binding (see _compat.register_binder) -------------------------------------------
_defer_to_torch: bool
_load_restricted_impl: Callable[..., Any]
_mmap_supported: bool
_assign_supported: bool


def _load_restricted(
    f: Any, map_location: Any, use_mmap: bool, extra: Mapping[str, Any], encoding: str
) -> Any:
    """Load with safetorch's restricted unpickler (see _unpickler's opcode policy).

    torch's own format readers ``_load`` (zip) / ``_legacy_load`` do the file work: both
    subclass ``pickle_module.Unpickler`` and set its ``persistent_load``, so every opcode goes
    through the restricted unpickler (same signatures 1.13 to 2.x). Calling them directly,
    rather than ``torch.load(pickle_module=...)``, keeps the path independent of torch.load's
    defaults and environment switches (TORCH_FORCE_WEIGHTS_ONLY_LOAD) and of its TorchScript
    and tar dispatch, which ``load`` has already refused.
    """
    module = _unpickler.make_restricted_pickle_module(extra)
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


def _load_torch_weights_only(f: Any, map_location: Any, use_mmap: bool) -> Any:
    """torch >= 2.6: torch's own weights-only unpickler (defer to it where it is as strict)."""
    return _quiet_torch_load(
        f, map_location=map_location, weights_only=True, **_mmap_kwargs(use_mmap)
    )


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
    global _defer_to_torch, _mmap_supported, _assign_supported
    # torch 2.6 (the release whose weights-only loader refuses TorchScript archives, the fix for
    # CVE-2025-32434, and made weights_only the default): from there on torch's weights-only
    # unpickler is at least as strict as ours for every opcode it supports, so files that only
    # need torch's own allow-list and opcodes go to it. Older torch always uses ours.
    _defer_to_torch = _compat.LOAD_WEIGHTS_ONLY_DEFAULT_TRUE
    _mmap_supported = _compat.LOAD_HAS_MMAP  # torch >= 2.1
    _assign_supported = _compat.LOAD_STATE_DICT_HAS_ASSIGN  # torch >= 2.1


# --- st.load ----------------------------------------------------------------------------------
def _is_path(f: Any) -> bool:
    return isinstance(f, (str, bytes)) or hasattr(f, "__fspath__")


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


_HEAD_BYTES = 512  # a tar header is 512 bytes; its "ustar" magic sits at offset 257


def _head(f: Any, n: int = _HEAD_BYTES) -> bytes:
    if _is_path(f):
        with open(f, "rb") as fh:
            return fh.read(n)
    start = f.tell()
    try:
        return f.read(n)
    finally:
        f.seek(start)


def _looks_like_safetensors(f: Any, head: bytes) -> bool:
    if _is_path(f) and os.fsdecode(f).endswith(".safetensors"):
        return True
    if len(head) >= 9 and head[8:9] == b"{" and head[:4] != _ZIP_MAGIC:
        header_len = int.from_bytes(head[:8], "little")
        return 2 <= header_len < 100_000_000
    return False


def _is_tar(head: bytes) -> bool:
    return len(head) >= 262 and head[257:262] == b"ustar"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


class _ZipFacts:
    """What load needs to know about a zip checkpoint, read from its central directory."""

    __slots__ = ("problem", "storages_stored", "scan")

    def __init__(self, problem: Optional[str], storages_stored: bool) -> None:
        self.problem = problem
        self.storages_stored = storages_stored
        self.scan: Optional[_unpickler.ScanResult] = None  # data.pkl's, when asked for


def _zip_facts(f: Any, scan: bool) -> _ZipFacts:
    """Central-directory facts (nothing is decompressed): torch's record prefix, whether it is
    a TorchScript archive, whether data.pkl exists and every storage is stored uncompressed,
    and whether each storage's entry is sound; with ``scan``, also data.pkl's globals, from
    the same open archive (the directory is read once)."""
    import zipfile

    with contextlib.ExitStack() as stack:
        try:
            fh = stack.enter_context(open(f, "rb")) if _is_path(f) else _unpickler.seekable(f)
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
            facts.scan = _unpickler.scan_archive(archive)
        return facts


def _storage_facts(archive: Any, infos: List[Any]) -> _ZipFacts:
    import zipfile

    names = [i.filename for i in infos]
    prefix = _unpickler.zip_record_prefix(names)
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
    return _ZipFacts(None, stored)


def _refusal_message(name: str, unsafe: List[str]) -> str:
    dangerous = [n for n in unsafe if n in _unpickler.KNOWN_DANGEROUS]
    listed = ", ".join(unsafe)
    message = (
        f"refused to load {name}: it references {len(unsafe)} global(s) outside the "
        f"weights-only allow-list: {listed}. Nothing from the file was executed."
    )
    if dangerous:
        message += (
            f" {', '.join(dangerous)} can run arbitrary code: do not allow them unless you "
            "wrote this file yourself."
        )
    flags = " ".join(f"--allow {n}" for n in unsafe)
    message += (
        f" If you trust the file and these globals, allow them for this load: "
        f"st.load({name}, allow={unsafe!r}); or register them with torch: "
        f"torch.serialization.add_safe_globals([...]) or `with "
        f"torch.serialization.safe_globals([...]):`; under `safetorch run`: {flags} (or "
        f"SAFETORCH_ALLOW={','.join(unsafe)}). To load a fully trusted file: "
        "weights_only=False."
    )
    return message


def _load_safetensors(f: Any, name: str, map_location: Any) -> Any:
    try:
        import safetensors.torch as st_torch
    except ImportError:
        raise CheckpointError(
            f"{name} is a .safetensors file and the safetensors package is not installed; "
            "install it with: pip install 'safetorch[safetensors]'"
        ) from None
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


class MapToAvailable:
    """A ``map_location`` for checkpoints that may come from another machine: storages saved on
    CUDA load on the CPU where this machine has no CUDA (torch's default raises "Attempting to
    deserialize object on a CUDA device but torch.cuda.is_available() is False"); everything
    else loads where torch would put it. ``mapped`` counts the storages it moved.

    ``st.load(f, map_location="available")`` uses one; ``torch.load`` accepts one too. The
    ``load`` patch passes one when a legacy ``torch.load(f)`` call gives no ``map_location``.

    >>> import io, torch
    >>> from safetorch.checkpoint import MapToAvailable
    >>> buf = io.BytesIO(); torch.save({"w": torch.ones(2)}, buf); _ = buf.seek(0)
    >>> where = MapToAvailable()
    >>> torch.load(buf, map_location=where, weights_only=True)["w"].device, where.mapped
    (device(type='cpu'), 0)
    """

    __slots__ = ("mapped", "_cuda")

    def __init__(self) -> None:
        self.mapped = 0
        self._cuda = torch.cuda.is_available()

    def __call__(self, storage: Any, location: str) -> Any:
        if not self._cuda and str(location).startswith("cuda"):
            self.mapped += 1
            return storage  # deserialized on the CPU: keep it there
        return None  # torch's default_restore_location

    def __repr__(self) -> str:
        return f"MapToAvailable(mapped={self.mapped})"


def load(
    f: FileLike,
    map_location: Any = "cpu",
    pickle_module: Any = None,
    *,
    weights_only: Optional[bool] = None,
    mmap: Optional[bool] = None,
    allow: Iterable[Any] = (),
    encoding: str = "utf-8",
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
        weights_only: ``None`` (default) or ``True``: only tensors, containers and
            allow-listed classes are rebuilt. ``False`` runs arbitrary pickle code: use it
            only for trusted files (a CheckpointWarning says so).
        mmap: ``True`` memory-maps the storages (torch >= 2.1, zip files given by path, and
            only uncompressed storages; otherwise the file is read, with a warning). The
            returned tensors then change if the file is rewritten later. ``None``/``False``
            read the file into memory.
        allow: extra globals allowed for this call, as classes/functions or ``"module.Name"``
            strings. ``argparse.Namespace`` is always allowed.
        encoding: for Python 2 strings in old checkpoints, as ``torch.load`` (e.g.
            ``"latin1"``).

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
    """
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
    name = _display(f)
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
        start: Optional[int] = None
    else:
        start = src.tell()
    head = _head(src)
    if not head:
        raise CheckpointError(f"cannot load checkpoint {name}: the file is empty")
    if _looks_like_safetensors(src, head):
        return _load_safetensors(src, name, map_location)
    is_zip = head.startswith(_ZIP_MAGIC)
    facts = _zip_facts(src, scan=safe) if is_zip else None
    want_mmap = bool(mmap) or (mmap_for_copy and mmap is not False)
    use_mmap = bool(
        want_mmap and _mmap_supported and facts and facts.storages_stored and _is_path(src)
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
    if use_mmap:
        src = os.fspath(src)  # torch 2.1-2.5's mmap path accepts only str (isinstance(f, str))

    if not safe:
        warnings.warn(
            f"loading {name} with weights_only=False: unpickling can run arbitrary code; "
            "do this only for files you trust",
            CheckpointWarning,
            stacklevel=user_stacklevel(),
        )
        return _wrap_failures(
            name, lambda: _load_full(src, map_location, pickle_module, use_mmap, encoding)
        )

    if facts is not None and facts.problem is not None:
        raise CheckpointError(f"cannot load checkpoint {name}: {facts.problem}")
    if not is_zip:
        if _is_tar(head):
            raise CheckpointError(
                f"cannot load checkpoint {name}: it is in the legacy tar format of torch < 0.4, "
                "which cannot be loaded weights-only. If you trust the file, load it with "
                "weights_only=False and re-save it with st.save_checkpoint"
            )
        if head[:1] != b"\x80":
            raise CheckpointError(
                f"cannot load checkpoint {name}: it is not a PyTorch checkpoint (it starts "
                f"with {head[:8]!r})"
            )
    scan = facts.scan if facts is not None and facts.scan is not None else _unpickler.scan_file(src)
    if start is not None:
        src.seek(start)
    unsafe = _unpickler.unsafe_globals(scan.globals, extra)
    if unsafe:
        raise UnsafeCheckpointError(_refusal_message(name, unsafe), tuple(unsafe))
    if scan.refused is not None:
        raise UnsafeCheckpointError(
            f"refused to load {name}: it uses {scan.refused}, which weights-only loading "
            "refuses; nothing from the file was executed. To load a fully trusted file: "
            "weights_only=False."
        )
    if not scan.complete:
        raise CheckpointError(
            f"cannot load checkpoint {name}: {scan.stopped or 'its pickle data is corrupt'}"
        )
    defer = (
        _defer_to_torch
        and scan.torch_opcodes_only
        and encoding == "utf-8"
        # only torch's list and the user's add_safe_globals, which torch's loader honours too
        and not _unpickler.unsafe_globals(scan.globals, {})
        and not set(scan.globals) & (set(extra) | _STRICTER_HERE)
    )
    if defer:
        return _wrap_failures(name, lambda: _load_torch_weights_only(src, map_location, use_mmap))
    return _wrap_failures(
        name, lambda: _load_restricted(src, map_location, use_mmap, extra, encoding)
    )


# Globals whose REDUCE ours checks more strictly than torch (bytearray(<int>) allocates).
_STRICTER_HERE = frozenset({"builtins.bytearray"})


def _wrap_failures(name: str, run: Callable[[], Any]) -> Any:
    """Run a load; every failure becomes a CheckpointError naming the file and the reason."""
    try:
        return run()
    except (SafetorchError, Warning):
        raise  # ours already, or a warning the caller turned into an error
    except _unpickler.RefusedGlobal as exc:
        raise UnsafeCheckpointError(_refusal_message(name, [exc.name]), (exc.name,)) from None
    except (_unpickler.RefusedOpcode, pickle.UnpicklingError) as exc:
        text = str(exc)
        if isinstance(exc, _unpickler.RefusedOpcode) or "Weights only load failed" in text:
            # torch's message wraps its unpickler's reason after "WeightsUnpickler error:".
            reason = text.rsplit("WeightsUnpickler error:", 1)[-1].strip().splitlines()[0]
            raise UnsafeCheckpointError(
                f"refused to load {name}: {reason}; nothing from the file was executed. To "
                "load a fully trusted file: weights_only=False."
            ) from None
        raise CheckpointError(
            f"cannot load checkpoint {name}: {_failure_reason(exc)} ({_first_line(exc)})"
        ) from exc
    except Exception as exc:  # MemoryError included (an Exception subclass)
        raise CheckpointError(
            f"cannot load checkpoint {name}: {_failure_reason(exc)} ({_first_line(exc)})"
        ) from exc


# --- st.load_state_dict -----------------------------------------------------------------------
def _shape_mismatch(value: Any, param: Any) -> bool:
    v_shape, p_shape = tensor_shape(value), tensor_shape(param)
    if v_shape is None or p_shape is None or v_shape == p_shape:
        return False
    if nn.parameter.is_lazy(param):
        return False  # lazy modules take their shape from the checkpoint
    # torch's own backward-compat rule: a 0-dim parameter accepts a 1-element 1-dim tensor.
    return not (len(p_shape) == 0 and v_shape == (1,))


def _split_n_averaged(
    state_dict: Mapping[str, Any], target_keys: Iterable[str]
) -> Tuple[Mapping[str, Any], Optional[int]]:
    """Take AveragedModel's counter out of a checkpoint bound for a model without one."""
    if any(canonical_key(k) == N_AVERAGED for k in target_keys):
        return state_dict, None
    found = [k for k in state_dict if canonical_key(k) == N_AVERAGED]
    if len(found) != 1:
        return state_dict, None
    value = state_dict[found[0]]
    rest: "collections.OrderedDict[str, Any]" = collections.OrderedDict(
        (k, v) for k, v in state_dict.items() if k != found[0]
    )
    meta = getattr(state_dict, "_metadata", None)
    if meta is not None:
        rest._metadata = meta  # type: ignore[attr-defined]  # state dicts carry torch's _metadata attribute (an OrderedDict subclass attr)
    return rest, int(value.item()) if isinstance(value, torch.Tensor) else int(value)


def load_state_dict(
    model: nn.Module,
    source: Union[FileLike, Mapping[str, Any]],
    *,
    strict: bool = True,
    key: Optional[str] = None,
    assign: Optional[bool] = None,
    prefix: Optional[str] = None,
) -> LoadReport:
    """Load a checkpoint into a model through any wrapper, with a report of what happened.

    The state dict inside a container is found automatically (``state_dict``, ``model``, ...;
    EMA entries only with ``key=``). Wrapper segments (``module.``, ``_orig_mod.``,
    ``_fsdp_wrapped_module.``, ``_checkpoint_wrapped_module.``) anywhere in the keys of either
    side, and Lightning's leading ``model.``, are matched away; any other leading path is a
    real module and needs ``prefix=``; see :func:`safetorch.checkpoint.remap_state_dict`.
    Tensors are not copied before the final in-place copy into the model (none at all with
    ``assign=True``).

    Multi-file checkpoints load the same way, matched on their shapes before any tensor is
    read, then read lazily (only matched tensors; one shard at a time): a
    ``torch.distributed.checkpoint`` directory (through DCP itself, into plain or DTensor /
    FSDP2 parameters), a sharded index (``model.safetensors.index.json``,
    ``pytorch_model.bin.index.json``) or a directory written by transformers or accelerate;
    ``report.source`` names the file or layout used.

    Args:
        model: the target, wrapped or not.
        source: a path (file, directory or shard index), a file object, a state dict or a
            checkpoint dict.
        strict: raise on any missing, unexpected or shape-mismatched key, before touching the
            model. With ``strict=False`` those are skipped and reported (shape mismatches
            never raise, unlike torch).
        key: the container key holding the state dict (needed for EMA weights).
        assign: passed to ``Module.load_state_dict(assign=)`` (torch >= 2.1).
        prefix: take the sub-module under this path out of a larger checkpoint (e.g.
            ``"backbone."``); checkpoint keys outside it are ignored, not unexpected.

    Returns:
        A :class:`LoadReport`.

    Raises:
        CheckpointMismatchError: ``strict=True`` and the keys or shapes differ (``.report``).
        CheckpointError: no or several state dicts in the container, ambiguous key mapping,
            or a file problem (see :func:`load`).

    >>> import torch, safetorch as st
    >>> sd = torch.nn.DataParallel(torch.nn.Linear(2, 2)).state_dict()
    >>> report = st.load_state_dict(torch.nn.Linear(2, 2), sd)
    >>> report.ok, report.rule
    (True, "dropped wrapper segment(s) 'module.' from checkpoint keys")
    """
    if assign and not _assign_supported:
        raise TypeError(
            "assign=True needs torch >= 2.1 (Module.load_state_dict(assign=)); upgrade torch "
            "or leave assign unset"
        )
    if not isinstance(model, nn.Module):
        swapped = isinstance(source, nn.Module)
        raise TypeError(
            f"st.load_state_dict: model must be a torch.nn.Module, got {type(model).__name__}"
            + (
                "; the arguments look swapped: call st.load_state_dict(model, source)"
                if swapped
                else ""
            )
        )
    if isinstance(source, nn.Module):
        raise TypeError(
            "st.load_state_dict: source must be a path, a file object or a state dict, got a "
            f"{type(source).__name__} module; pass source.state_dict() to copy a module's weights"
        )
    # A directory, a shard index or a DCP checkpoint: match on its meta view (shapes and
    # dtypes, no data), then read only the matched tensors (layouts.py).
    layout = layouts.resolve(source) if _is_path(source) else None
    picked = None if layout is None else f"{layout.description} ({layout.kind})"
    if isinstance(layout, layouts.FileLayout):
        source, layout = layout.path, None
    if layout is not None:
        logger.info("loading %s (%s)", layout.description, layout.kind)
        obj: Any = layout.meta_view()
    elif isinstance(source, Mapping):
        obj = source
    else:
        # Storages may be memory-mapped here (zip files by path, uncompressed, torch >= 2.1):
        # the in-place copy into the model below happens before this call returns. Not with
        # assign=True, where the model would keep the mapped tensors.
        obj = load_for_copy(source, may_map=not assign)
    if isinstance(obj, Mapping) and obj.get("__safetorch__") == STATE_FORMAT:
        obj = obj["objects"]  # a st.save_state file: the models' state dicts are in there
    state_dict, source_key = find_state_dict(obj, key)
    target = model.state_dict(keep_vars=True)
    state_dict, n_averaged = _split_n_averaged(state_dict, target.keys())
    # Plain weights into an AveragedModel: its counter keeps its value rather than being missing.
    source_has_counter = any(canonical_key(k) == N_AVERAGED for k in state_dict)
    target_keys = [k for k in target if source_has_counter or canonical_key(k) != N_AVERAGED]
    # A mapping (not only the keys) gives the matcher shapes to settle colliding keys with.
    remapped, match = remap_state_dict(
        state_dict, {k: target[k] for k in target_keys}, prefix=prefix
    )

    mismatched = []
    to_load: "collections.OrderedDict[str, Any]" = collections.OrderedDict()
    source_of = {t: s for s, t in match.mapping.items()}
    for tgt_key in target_keys:  # model order, so the report reads like the model
        if tgt_key not in source_of:
            continue
        value = state_dict[source_of[tgt_key]]
        if _shape_mismatch(value, target[tgt_key]):
            mismatched.append((tgt_key, tensor_shape(value), tensor_shape(target[tgt_key])))
        else:
            to_load[tgt_key] = value
    meta = getattr(remapped, "_metadata", None)
    if meta is not None:
        to_load._metadata = meta  # type: ignore[attr-defined]  # state dicts carry torch's _metadata attribute (an OrderedDict subclass attr)
    report = LoadReport(
        loaded=list(to_load),
        missing=list(match.unmatched_target),
        unexpected=list(match.unmatched_source),
        mismatched=mismatched,  # type: ignore[arg-type]  # LoadReport declares the list type; the shape tuples are its documented form
        rule=match.rule,
        source_key=source_key,
        n_averaged=n_averaged,
        strict=strict,
        hint=match.hint,
        other_state_dicts=[k for k in state_dict_keys(obj) if k != source_key],
        source=picked,
    )
    if strict and not report.ok:
        report.refused = True
        raise CheckpointMismatchError(
            f"checkpoint does not match {type(model).__name__} (nothing was loaded; pass "
            f"strict=False to load the matching keys):\n{report}",
            report,
        )
    kwargs = {} if assign is None else {"assign": assign}
    if layout is not None:
        _load_from_layout(model, layout, to_load, source_of, source_key, report, kwargs)
        logger.debug("%s", report)
        return report
    result = _module_load_state_dict(model, to_load, strict=False, **kwargs)
    # torch is the final word: a load hook may have consumed or rejected keys.
    kept = set(target) - set(target_keys)  # AveragedModel's counter, kept on purpose
    skipped = {k for k, _, _ in mismatched}
    torch_missing = set(result.missing_keys) - set(report.missing) - kept - skipped
    if torch_missing:
        report.missing.extend(k for k in result.missing_keys if k in torch_missing)
        report.loaded = [k for k in report.loaded if k not in torch_missing]
    report.unexpected.extend(k for k in result.unexpected_keys if k not in report.unexpected)
    if strict and not report.ok:
        raise CheckpointMismatchError(f"load hooks reported mismatches:\n{report}", report)
    logger.debug("%s", report)
    return report


def _load_from_layout(
    model: nn.Module,
    layout: Any,
    to_load: Mapping[str, Any],
    source_of: Mapping[str, str],
    source_key: Optional[str],
    report: LoadReport,
    kwargs: Dict[str, Any],
) -> None:
    """Read the matched tensors of a multi-file layout into the model, batch by batch."""
    prefix = f"{source_key}." if source_key else ""
    pairs = [(tgt, prefix + source_of[tgt]) for tgt in to_load]
    unexpected: List[str] = []

    def apply(batch: Dict[str, Any]) -> None:
        result = _module_load_state_dict(model, batch, strict=False, **kwargs)
        unexpected.extend(k for k in result.unexpected_keys if k not in unexpected)

    layout.load_into(model, pairs, apply)
    report.unexpected.extend(k for k in unexpected if k not in report.unexpected)
    if report.strict and not report.ok:
        raise CheckpointMismatchError(f"load hooks reported mismatches:\n{report}", report)


def load_for_copy(source: Any, may_map: bool = True) -> Any:
    """Weights-only load whose tensors the caller copies before it returns, so the file may be
    memory-mapped (``may_map``); used by ``load_state_dict`` and for ``.bin`` shards."""
    return _load(
        source,
        "cpu",
        None,
        weights_only=True,
        mmap=None,
        allow=(),
        encoding="utf-8",
        mmap_for_copy=may_map,
    )


# --- saving -----------------------------------------------------------------------------------
# atomic_write (safetorch/_atomic.py): temp file in the same directory, fsync, os.replace,
# fsync the directory -- the one writer shared with `safetorch check --fix`.


def on_rank0(fn: Callable[[], Any]) -> Any:
    """Run ``fn`` on rank 0 only; every rank returns its result once it has finished.

    Without an initialized process group, just calls ``fn``. The result (or the failure) is
    broadcast, so no rank waits forever when rank 0 fails.
    """
    if not _dist.initialized():
        return fn()
    dist = torch.distributed
    box: list = [None, None]
    error: Optional[BaseException] = None
    if dist.get_rank() == 0:
        try:
            box[0] = fn()
        except BaseException as exc:  # broadcast first, then re-raise
            error = exc
            box[1] = _first_line(exc)
    # Through the process group's store, not broadcast_object_list: a gloo collective's work
    # objects can deadlock the process at teardown (safetorch/_dist.py). Plain data only.
    box = _dist.broadcast_from_rank0(box)
    if error is not None:
        raise error
    if box[1] is not None:
        raise CheckpointError(f"rank 0 failed to save the checkpoint: {box[1]}")
    return box[0]


def _unwrapped(obj: Any) -> Any:
    if isinstance(obj, nn.Module):
        return strip_wrapper_prefixes(unwrap_model(obj).state_dict())
    if isinstance(obj, Mapping):
        from safetorch.checkpoint.keys import is_state_dict

        if is_state_dict(obj):
            return strip_wrapper_prefixes(obj)
        return (
            type(obj)((k, _unwrapped(v)) for k, v in obj.items())
            if isinstance(obj, dict)
            else {k: _unwrapped(v) for k, v in obj.items()}
        )
    return obj


def save_checkpoint(obj: Any, path: PathLike, *, unwrap: bool = False) -> str:
    """Save with ``torch.save`` atomically; under torch.distributed only rank 0 writes.

    Args:
        obj: what to save (a state dict, a checkpoint dict, ...).
        path: destination file; its directory must exist.
        unwrap: save modules as the state dict of the innermost user module, and strip wrapper
            segments (``module.``, ``_orig_mod.``, ...) from every state dict in ``obj``.

    Returns:
        The absolute path written.

    Raises:
        OSError: the file cannot be written (the previous file, if any, is left intact).
        CheckpointError: on ranks other than 0, when rank 0 failed to write.

    >>> import os, tempfile, torch, safetorch as st
    >>> path = os.path.join(tempfile.mkdtemp(), "model.pt")
    >>> _ = st.save_checkpoint(torch.nn.DataParallel(torch.nn.Linear(2, 2)), path, unwrap=True)
    >>> sorted(st.load(path))
    ['bias', 'weight']
    """

    return on_rank0(lambda: _save_local(obj, path, unwrap))


def _save_local(obj: Any, path: PathLike, unwrap: bool) -> str:
    payload = _unwrapped(obj) if unwrap else obj

    def write(tmp: str) -> None:
        with _torch_internals_quiet():
            _torch_save(payload, tmp)

    return atomic_write(path, write)


def _link_or_copy(src: str, dst: str) -> None:
    """Atomically make ``dst`` a copy of ``src`` (a hard link when the filesystem allows)."""

    def write(tmp: str) -> None:
        os.unlink(tmp)
        try:
            os.link(src, tmp)
        except OSError:
            import shutil

            shutil.copyfile(src, tmp)

    atomic_write(dst, write)


class CheckpointSaver:
    """Keep ``last.pt`` and ``best.pt`` (``save``), or resumable top-k/history states
    (``save_state``/``resume``), each written atomically.

    ``save(state, epoch=, metric=)`` writes ``last.pt`` every time and ``best.pt`` when the
    metric improves. ``save_state(epoch=, metric=, **objects)`` writes a full
    :func:`safetorch.save_state` checkpoint (``state-<epoch>.pt``, or a DCP directory for a
    sharded model under a process group), keeps the ``top_k`` best by metric, the
    ``max_history`` most recent and the last one, and deletes the rest; ``resume(**objects)``
    restores the latest complete one. ``checkpoints.json`` records epoch, metric and file of
    each and is read back on construction, so a resumed run keeps comparing against the best
    metric so far. Every file is complete at every instant (temp file + rename), so a kill at
    any point leaves the previous checkpoints loadable.

    Args:
        directory: where the files live (created if missing).
        mode: ``"min"`` (lower metric is better, e.g. loss) or ``"max"`` (e.g. accuracy).
        unwrap: passed to :func:`save_checkpoint` by ``save``.
        top_k: how many best ``save_state`` checkpoints to keep (by metric).
        max_history: how many most recent ``save_state`` checkpoints to keep besides them.
        last_name, best_name, index_name: file names inside ``directory``.

    Raises:
        ValueError: ``mode`` is neither ``"min"`` nor ``"max"``, or ``top_k``/``max_history``
            is negative.

    >>> import tempfile, torch, safetorch as st
    >>> saver = st.CheckpointSaver(tempfile.mkdtemp(), mode="max")
    >>> net = torch.nn.Linear(2, 2)
    >>> saver.save({"model": net.state_dict()}, epoch=0, metric=0.5)
    True
    >>> saver.save({"model": net.state_dict()}, epoch=1, metric=0.4)
    False
    >>> saver.best_epoch, saver.best_metric
    (0, 0.5)
    >>> opt = torch.optim.SGD(net.parameters(), lr=0.1)
    >>> saver.save_state(epoch=1, metric=0.6, model=net, optimizer=opt)
    True
    >>> saver.resume(model=net, optimizer=opt)
    {'epoch': 1, 'metric': 0.6}
    """

    def __init__(
        self,
        directory: PathLike,
        *,
        mode: str = "min",
        unwrap: bool = False,
        top_k: int = 1,
        max_history: int = 1,
        last_name: str = "last.pt",
        best_name: str = "best.pt",
        index_name: str = "checkpoints.json",
    ) -> None:
        if mode not in ("min", "max"):
            raise ValueError(f"mode={mode!r}; expected 'min' (e.g. loss) or 'max' (e.g. accuracy)")
        for label, value in (("top_k", top_k), ("max_history", max_history)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{label}={value!r}; expected an int >= 0")
        self.directory = os.path.abspath(os.fspath(directory))
        self.mode = mode
        self.unwrap = unwrap
        self.top_k = top_k
        self.max_history = max_history
        self.last_path = os.path.join(self.directory, last_name)
        self.best_path = os.path.join(self.directory, best_name)
        self.index_path = os.path.join(self.directory, index_name)
        # Under torch.distributed rank 0 reads and broadcasts: construct on every rank.
        self.index: Dict[str, Any] = on_rank0(self._read_index)

    def _read_index(self) -> Dict[str, Any]:
        os.makedirs(self.directory, exist_ok=True)
        try:
            with open(self.index_path, encoding="utf-8") as fh:
                index = json.load(fh)
        except FileNotFoundError:
            return {"mode": self.mode, "last": None, "best": None}
        except (OSError, ValueError) as exc:
            raise CheckpointError(
                f"cannot read the checkpoint index {self.index_path!r}: {exc}; delete it to "
                "start a fresh index"
            ) from None
        if index.get("mode") != self.mode:
            raise ValueError(
                f"{self.index_path!r} was written with mode={index.get('mode')!r}, "
                f"not mode={self.mode!r}"
            )
        return index

    def _write_index(self, index: Dict[str, Any]) -> None:
        text = json.dumps(index, indent=2, sort_keys=True)

        def write_index(tmp: str) -> None:
            with open(tmp, "w", encoding="utf-8") as fh:
                fh.write(text)

        atomic_write(self.index_path, write_index)

    @property
    def best_metric(self) -> Optional[float]:
        """The best metric saved so far (``None`` before the first save)."""
        return self.index["best"]["metric"] if self.index.get("best") else None

    @property
    def best_epoch(self) -> Optional[int]:
        """The epoch of the best checkpoint (``None`` before the first save)."""
        return self.index["best"]["epoch"] if self.index.get("best") else None

    @property
    def last_epoch(self) -> Optional[int]:
        """The epoch of the last checkpoint; resume from ``last_epoch + 1``."""
        return self.index["last"]["epoch"] if self.index.get("last") else None

    @property
    def kept(self) -> List[str]:
        """Paths of the ``save_state`` checkpoints kept now, oldest first."""
        return [os.path.join(self.directory, e["file"]) for e in self.index.get("states", [])]

    def is_better(self, metric: float) -> bool:
        """Whether ``metric`` improves on the best so far (NaN never does)."""
        if math.isnan(metric):
            return False
        best = self.best_metric
        if best is None:
            return True
        return metric < best if self.mode == "min" else metric > best

    @staticmethod
    def _value(metric: Any) -> Optional[float]:
        if metric is None:
            return None
        return float(metric.item() if isinstance(metric, torch.Tensor) else metric)

    def save(self, state: Any, *, epoch: int, metric: Any) -> bool:
        """Write ``last.pt``, and ``best.pt`` if ``metric`` improved; update the index.

        Args:
            state: what to save (e.g. ``{"model": ..., "optimizer": ..., "epoch": ...}``).
            epoch: the epoch number recorded in the index.
            metric: a number or a 0-dim tensor (``.item()`` is called here).

        Returns:
            True when ``best.pt`` was rewritten.
        """
        value = self._value(metric)
        assert value is not None
        entry = {"epoch": int(epoch), "metric": value}

        def write() -> Tuple[Dict[str, Any], bool]:
            improved = self.is_better(value)
            _save_local(state, self.last_path, self.unwrap)
            index = dict(self.index)
            index["last"] = dict(entry, file=os.path.basename(self.last_path))
            if improved:
                _link_or_copy(self.last_path, self.best_path)
                index["best"] = dict(entry, file=os.path.basename(self.best_path))
            self._write_index(index)
            return index, improved

        # Rank 0 decides and writes; every rank gets its index and verdict.
        self.index, improved = on_rank0(write)
        return bool(improved)

    def save_state(self, *, epoch: int, metric: Any = None, **objects: Any) -> bool:
        """Save a full resumable state (:func:`safetorch.save_state`) for ``epoch``.

        Call it on every rank. Keeps the ``top_k`` best by ``metric``, the ``max_history``
        most recent and the newest; older ones are deleted after the new one is complete.

        Args:
            epoch: the epoch number (the file is ``state-<epoch>.pt``).
            metric: a number or 0-dim tensor; ``None`` when there is none (never "best").
            **objects: what :func:`safetorch.save_state` takes (models, optimizers, values).

        Returns:
            True when this checkpoint is the best so far.
        """
        from safetorch.checkpoint.state import save_state

        value = self._value(metric)
        name = f"state-{int(epoch):06d}.pt"
        save_state(os.path.join(self.directory, name), **objects, epoch=int(epoch), metric=value)
        entry = {"epoch": int(epoch), "metric": value, "file": name}

        def update() -> Tuple[Dict[str, Any], bool]:
            improved = value is not None and self.is_better(value)
            index = dict(self.index)
            states = [e for e in index.get("states", []) if e["file"] != name] + [entry]
            index["last"] = entry
            if improved:
                index["best"] = entry
            keep = {name}
            scored = [e for e in states if e["metric"] is not None and not math.isnan(e["metric"])]
            scored.sort(key=lambda e: e["metric"], reverse=self.mode == "max")
            keep.update(e["file"] for e in scored[: self.top_k])
            by_epoch = sorted(states, key=lambda e: e["epoch"])
            keep.update(e["file"] for e in by_epoch[len(by_epoch) - self.max_history :])
            if index.get("best"):
                keep.add(index["best"]["file"])
            index["states"] = [e for e in by_epoch if e["file"] in keep]
            self._write_index(index)  # the index first: it never names a deleted file
            for e in by_epoch:
                if e["file"] not in keep:
                    _remove(os.path.join(self.directory, e["file"]))
            return index, improved

        self.index, improved = on_rank0(update)
        return bool(improved)

    def resume(self, **objects: Any) -> Optional[Dict[str, Any]]:
        """Restore the latest complete ``save_state`` checkpoint into ``objects``.

        The directory is scanned (not only the index), so a checkpoint written just before a
        crash that left the index behind is found too.

        Returns:
            The values it holds (``epoch``, ``metric`` and any saved values), or ``None`` when
            the directory holds no ``save_state`` checkpoint (a fresh start).
        """
        from safetorch.checkpoint.state import latest_complete, load_state

        def find() -> Optional[str]:
            names = sorted(
                (n for n in os.listdir(self.directory) if _STATE_FILE.fullmatch(n)), reverse=True
            )
            return latest_complete(self.directory, names)

        path = on_rank0(find)
        if path is None:
            return None
        return load_state(path, **objects)


_STATE_FILE = re.compile(r"state-\d+\.pt")


def _remove(path: str) -> None:
    import shutil

    if os.path.isdir(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
