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
import warnings
from typing import IO, Any, Callable, Dict, Iterable, Iterator, Mapping, Optional, Tuple, Union

import torch
from torch import nn

from safetorch import _compat
from safetorch._atomic import atomic_write
from safetorch._stack import user_stacklevel
from safetorch.checkpoint import _unpickler
from safetorch.checkpoint.keys import (
    N_AVERAGED,
    canonical_key,
    find_state_dict,
    remap_state_dict,
    strip_wrapper_prefixes,
    tensor_shape,
    unwrap_model,
)
from safetorch.checkpoint.report import LoadReport
from safetorch.errors import (
    CheckpointError,
    CheckpointFileNotFoundError,
    CheckpointMismatchError,
    SafetorchError,
    SafetorchWarning,
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
_load_weights_only: Callable[..., Any]
_load_trusted: Callable[..., Any]
_load_restricted_impl: Callable[..., Any]
_mmap_supported: bool
_assign_supported: bool


def _mmap_kwargs(use_mmap: bool) -> Dict[str, Any]:
    return {"mmap": True} if use_mmap else {}


def _load_restricted(f: Any, map_location: Any, use_mmap: bool, extra: Mapping[str, Any]) -> Any:
    """Load with safetorch's restricted unpickler (torch < 1.13, or globals torch cannot scope)."""
    return _load_restricted_impl(f, map_location, use_mmap, extra)


def _load_restricted_via_torch_load(
    f: Any, map_location: Any, use_mmap: bool, extra: Mapping[str, Any]
) -> Any:
    """torch.load(pickle_module=<restricted>) where torch honours it (torch >= 2.0).

    Leaving ``weights_only`` unset is right: from 2.6 on its default resolves to False when a
    pickle_module is given, and before that it is False.
    """
    module = _unpickler.make_restricted_pickle_module(extra)
    return _quiet_torch_load(
        f, map_location=map_location, pickle_module=module, **_mmap_kwargs(use_mmap)
    )


def _load_restricted_own(
    f: Any, map_location: Any, use_mmap: bool, extra: Mapping[str, Any]
) -> Any:
    """torch 1.13 ignores ``torch.load(pickle_module=)`` unless weights_only=True (it unpickles
    with plain pickle), and torch < 1.13 has no weights_only: drive torch's format readers
    ``_load`` (zip) / ``_legacy_load`` ourselves. Both subclass ``pickle_module.Unpickler``, so
    every global goes through the restricted ``find_class`` (same signatures 1.6 to 2.x). No mmap.
    """
    module = _unpickler.make_restricted_pickle_module(extra)
    ser: Any = torch.serialization  # private readers, not in torch's type stubs
    with _torch_internals_quiet(), ser._open_file_like(f, "rb") as opened:
        if ser._is_zipfile(opened):
            with ser._open_zipfile_reader(opened) as archive:
                return ser._load(archive, map_location, module, encoding="utf-8")
        return ser._legacy_load(opened, map_location, module, encoding="utf-8")


def _allow_objects(extra: Mapping[str, Any]) -> list:
    objs = []
    for name, obj in extra.items():
        if obj is None:
            try:
                obj = _unpickler.import_global(name)
            except (ImportError, AttributeError):
                continue  # not importable here: the file cannot use it either
        objs.append((obj, name))
    return objs


def _load_torch_scoped(f: Any, map_location: Any, use_mmap: bool, extra: Mapping[str, Any]) -> Any:
    """torch >= 2.5: torch's weights-only unpickler with the extra globals scoped to this call."""
    with torch.serialization.safe_globals(_allow_objects(extra)):
        return _quiet_torch_load(
            f, map_location=map_location, weights_only=True, **_mmap_kwargs(use_mmap)
        )


def _load_torch_then_restricted(
    f: Any, map_location: Any, use_mmap: bool, extra: Mapping[str, Any]
) -> Any:
    """torch 1.13-2.4: torch's weights-only load; if it refuses only globals the caller allowed
    (torch cannot scope an allow-list to one call), reload with the restricted unpickler."""
    start = f.tell() if hasattr(f, "tell") else None
    try:
        return _quiet_torch_load(
            f, map_location=map_location, weights_only=True, **_mmap_kwargs(use_mmap)
        )
    except pickle.UnpicklingError:
        if start is not None:
            f.seek(start)
        names, _ = _unpickler.scan_globals(f)
        beyond_torch = _unpickler.unsafe_globals(names, {})
        if not extra or not beyond_torch or _unpickler.unsafe_globals(beyond_torch, extra):
            raise
        if start is not None:
            f.seek(start)
        return _load_restricted(f, map_location, use_mmap, extra)


def _load_full_old(f: Any, map_location: Any, use_mmap: bool) -> Any:
    return _quiet_torch_load(f, map_location=map_location, **_mmap_kwargs(use_mmap))


def _load_full(f: Any, map_location: Any, use_mmap: bool) -> Any:
    return _quiet_torch_load(
        f, map_location=map_location, weights_only=False, **_mmap_kwargs(use_mmap)
    )


@_compat.register_binder
def _bind() -> None:
    global _load_weights_only, _load_trusted, _load_restricted_impl
    global _mmap_supported, _assign_supported
    if not _compat.LOAD_HAS_WEIGHTS_ONLY:  # torch < 1.13
        _load_weights_only = _load_restricted
        _load_trusted = _load_full_old
    elif _compat.HAS_SAFE_GLOBALS_CTX:  # torch >= 2.5
        _load_weights_only = _load_torch_scoped
        _load_trusted = _load_full
    else:  # torch 1.13 - 2.4
        _load_weights_only = _load_torch_then_restricted
        _load_trusted = _load_full
    # torch 1.13 ignores pickle_module without weights_only=True; torch < 1.13 lacks the flag.
    _load_restricted_impl = (
        _load_restricted_via_torch_load
        if _compat.LOAD_HONOURS_PICKLE_MODULE
        else _load_restricted_own
    )
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


def _head(f: Any, n: int = 16) -> bytes:
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


# What torch raises on a damaged file (PytorchStreamReader errors, short reads, bad pickles).
# Anything else (ValueError, TypeError, a warning raised as an error, ...) from a file whose
# structure checks out is not the file's fault and propagates unchanged.
_READ_ERRORS = (RuntimeError, EOFError, OSError, pickle.UnpicklingError)


def _diagnose(f: Any, head: bytes, exc: BaseException) -> Optional[str]:
    """What is wrong with a file torch.load failed on (read-only look, executes nothing).

    ``None`` when the file looks intact and ``exc`` is not a read error: then the failure is
    not the file's and the caller re-raises ``exc``.
    """
    import zipfile

    if not head:
        return "the file is empty"
    read_error = isinstance(exc, _READ_ERRORS) and not isinstance(exc, Warning)
    if head.startswith(_ZIP_MAGIC):
        try:
            if not _is_path(f):
                f.seek(f.tell())
            with zipfile.ZipFile(f) as archive:
                names = archive.namelist()
                pkls = [n for n in names if n.endswith("data.pkl")]
                bad_member = archive.testzip() if pkls else None  # CRC of every member
        except (zipfile.BadZipFile, OSError, ValueError, EOFError):
            return "the zip archive is truncated or corrupt (its central directory is unreadable)"
        if not pkls:
            return (
                "it is a zip archive without data.pkl, not a torch.save checkpoint "
                "(TorchScript archives load with torch.jit.load)"
            )
        if bad_member is not None:
            return f"the zip archive is damaged ({bad_member!r} fails its CRC check)"
        if not _unpickler.scan_globals(f)[1]:
            return "the zip archive is damaged (its data.pkl pickle is truncated or corrupt)"
        return "torch could not read the zip archive" if read_error else None
    if head[:1] == b"\x80":
        if not _unpickler.scan_globals(f)[1]:
            return "the pickle stream is truncated or corrupt (legacy torch.save format)"
        return (
            "the storage data after the pickle stream is truncated or corrupt (legacy format)"
            if read_error
            else None
        )
    return f"it is not a PyTorch checkpoint (it starts with {head[:8]!r})"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def _refusal(
    f: Any, name: str, extra: Mapping[str, Any], start: Optional[int]
) -> Tuple[Optional[UnsafeCheckpointError], bool]:
    """(the refusal listing every unsafe global or None, whether the pickle scanned cleanly)."""
    if start is not None:
        f.seek(start)
    try:
        names, complete = _unpickler.scan_globals(f)
    except Exception:  # unreadable: not a refusal but a corrupt file
        return None, False
    unsafe = _unpickler.unsafe_globals(names, extra)
    if not unsafe:
        return None, complete
    dangerous = [n for n in unsafe if n in _unpickler.KNOWN_DANGEROUS]
    call = f"st.load({name}, allow={unsafe!r})"
    message = (
        f"refused to load {name}: it references {len(unsafe)} global(s) outside the "
        f"weights-only allow-list: {', '.join(unsafe)}. Nothing from the file was executed."
    )
    if dangerous:
        message += (
            f" {', '.join(dangerous)} can run arbitrary code: do not allow them unless you "
            "wrote this file yourself."
        )
    message += (
        f" If you trust the file and these globals, load it with {call}; to load a fully "
        f"trusted file use st.load({name}, weights_only=False)."
    )
    return UnsafeCheckpointError(message, tuple(unsafe)), complete


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


def load(
    f: FileLike,
    *,
    map_location: Any = "cpu",
    weights_only: bool = True,
    mmap: Optional[bool] = None,
    allow: Iterable[Any] = (),
) -> Any:
    """Load a checkpoint safely: weights-only on every torch, CPU by default, mmap when possible.

    Args:
        f: a path or a seekable binary file object (``torch.save`` zip or legacy format, or a
            ``.safetensors`` file).
        map_location: where tensors go, as for ``torch.load``; ``"cpu"`` by default so a
            checkpoint saved on a GPU loads on a CPU-only machine.
        weights_only: only tensors, containers and allow-listed classes are rebuilt. ``False``
            runs arbitrary pickle code: use it only for trusted files (a SafetorchWarning says so).
        mmap: memory-map the file instead of reading it. ``None`` (default) maps zip-format
            files given by path on torch >= 2.1 and silently reads everything else.
        allow: extra globals allowed with ``weights_only=True``, as classes/functions or
            ``"module.Name"`` strings. ``argparse.Namespace`` is always allowed.

    Returns:
        The loaded object.

    Raises:
        UnsafeCheckpointError: the file references globals outside the allow-list; the error
            lists every one of them and the call that would allow them; nothing was executed.
        CheckpointError: the file is empty, truncated, corrupt or not a checkpoint (also a
            FileNotFoundError when it does not exist).

    >>> import io, torch, safetorch as st
    >>> buf = io.BytesIO(); torch.save({"w": torch.ones(2)}, buf); _ = buf.seek(0)
    >>> st.load(buf)
    {'w': tensor([1., 1.])}
    """
    src: Any = f
    name = _display(src)
    if _is_path(src):
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
    use_mmap = bool(_mmap_supported and is_zip and _is_path(src) and mmap is not False)
    if mmap and not use_mmap:
        logger.info("mmap not possible for %s (legacy format, file object or torch < 2.1)", name)
    if use_mmap:
        src = os.fspath(src)  # torch 2.1-2.5's mmap path accepts only str (isinstance(f, str))
    extra = _unpickler.resolve_allowed((*_unpickler.DEFAULT_EXTRA_ALLOWED, *allow))
    if not weights_only:
        warnings.warn(
            f"loading {name} with weights_only=False: unpickling can run arbitrary code; "
            "do this only for files you trust",
            SafetorchWarning,
            stacklevel=user_stacklevel(),
        )
    try:
        if not weights_only:
            return _load_trusted(src, map_location, use_mmap)
        return _load_weights_only(src, map_location, use_mmap, extra)
    except SafetorchError:
        raise
    except Exception as exc:
        if weights_only and (
            isinstance(exc, pickle.UnpicklingError) or _unpickler.is_refused_global(exc)
        ):
            refusal, clean = _refusal(src, name, extra, start)
            if refusal is not None:
                raise refusal from None
            if clean and _load_weights_only is not _load_restricted:
                # Only allowed globals, yet torch's weights-only unpickler gave up (e.g. it
                # lacks protocol-4 FRAME support): the restricted unpickler is as strict.
                logger.debug("torch refused %s (%s); retrying restricted", name, exc)
                if start is not None:
                    src.seek(start)
                try:
                    return _load_restricted(src, map_location, use_mmap, extra)
                except Exception as retry_exc:
                    exc = retry_exc
        if start is not None:
            src.seek(start)
        problem = _diagnose(src, head, exc)
        if start is not None:
            src.seek(start)
        if problem is None:  # the file is intact: not a file problem, torch's error as is
            raise exc
        raise CheckpointError(
            f"cannot load checkpoint {name}: {problem} ({_first_line(exc)})"
        ) from None


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
        rest._metadata = meta  # type: ignore[attr-defined]
    return rest, int(value.item()) if isinstance(value, torch.Tensor) else int(value)


def load_state_dict(
    model: nn.Module,
    source: Union[FileLike, Mapping[str, Any]],
    *,
    strict: bool = True,
    key: Optional[str] = None,
    assign: Optional[bool] = None,
) -> LoadReport:
    """Load a checkpoint into a model through any wrapper, with a report of what happened.

    The state dict inside a container is found automatically (``state_dict``, ``model``, ...;
    EMA entries only with ``key=``). Wrapper segments (``module.``, ``_orig_mod.``,
    ``_fsdp_wrapped_module.``, ``_checkpoint_wrapped_module.``) anywhere in the keys of either
    side, and one common leading prefix (``model.``), are matched away; see
    :func:`safetorch.checkpoint.remap_state_dict`. Tensors are not copied before the final
    in-place copy into the model (none at all with ``assign=True``).

    Args:
        model: the target, wrapped or not.
        source: a path, a file object, a state dict or a checkpoint dict.
        strict: raise on any missing, unexpected or shape-mismatched key, before touching the
            model. With ``strict=False`` those are skipped and reported (shape mismatches
            never raise, unlike torch).
        key: the container key holding the state dict (needed for EMA weights).
        assign: passed to ``Module.load_state_dict(assign=)`` (torch >= 2.1).

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
    obj = source if isinstance(source, Mapping) else load(source)
    state_dict, source_key = find_state_dict(obj, key)
    target = model.state_dict(keep_vars=True)
    state_dict, n_averaged = _split_n_averaged(state_dict, target.keys())
    # Plain weights into an AveragedModel: its counter keeps its value rather than being missing.
    source_has_counter = any(canonical_key(k) == N_AVERAGED for k in state_dict)
    target_keys = [k for k in target if source_has_counter or canonical_key(k) != N_AVERAGED]
    remapped, match = remap_state_dict(state_dict, target_keys)

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
        to_load._metadata = meta  # type: ignore[attr-defined]
    report = LoadReport(
        loaded=list(to_load),
        missing=list(match.unmatched_target),
        unexpected=list(match.unmatched_source),
        mismatched=mismatched,  # type: ignore[arg-type]
        rule=match.rule,
        source_key=source_key,
        n_averaged=n_averaged,
        strict=strict,
    )
    if strict and not report.ok:
        raise CheckpointMismatchError(
            f"checkpoint does not match {type(model).__name__} (nothing was loaded; pass "
            f"strict=False to load the matching keys):\n{report}",
            report,
        )
    kwargs = {} if assign is None else {"assign": assign}
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


# --- saving -----------------------------------------------------------------------------------
# atomic_write (safetorch/_atomic.py): temp file in the same directory, fsync, os.replace,
# fsync the directory -- the one writer shared with `safetorch check --fix`.


def _distributed() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def on_rank0(fn: Callable[[], Any]) -> Any:
    """Run ``fn`` on rank 0 only; every rank returns its result once it has finished.

    Without an initialized process group, just calls ``fn``. The result (or the failure) is
    broadcast, so no rank waits forever when rank 0 fails.
    """
    if not _distributed():
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
    dist.broadcast_object_list(box, src=0)
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
    """Keep ``last.pt`` (every save) and ``best.pt`` (when the metric improves), resumably.

    Each file is replaced atomically, so both are loadable with :func:`safetorch.load` at every
    instant; ``checkpoints.json`` records epoch, metric and file of each, and is read back on
    construction, so a resumed run keeps comparing against the best metric so far.

    Args:
        directory: where the files live (created if missing).
        mode: ``"min"`` (lower metric is better, e.g. loss) or ``"max"`` (e.g. accuracy).
        unwrap: passed to :func:`save_checkpoint`.
        last_name, best_name, index_name: file names inside ``directory``.

    Raises:
        ValueError: ``mode`` is neither ``"min"`` nor ``"max"``.

    >>> import tempfile, torch, safetorch as st
    >>> saver = st.CheckpointSaver(tempfile.mkdtemp(), mode="max")
    >>> net = torch.nn.Linear(2, 2)
    >>> saver.save({"model": net.state_dict()}, epoch=0, metric=0.5)
    True
    >>> saver.save({"model": net.state_dict()}, epoch=1, metric=0.4)
    False
    >>> saver.best_epoch, saver.best_metric
    (0, 0.5)
    """

    def __init__(
        self,
        directory: PathLike,
        *,
        mode: str = "min",
        unwrap: bool = False,
        last_name: str = "last.pt",
        best_name: str = "best.pt",
        index_name: str = "checkpoints.json",
    ) -> None:
        if mode not in ("min", "max"):
            raise ValueError(f"mode={mode!r}; expected 'min' (e.g. loss) or 'max' (e.g. accuracy)")
        self.directory = os.path.abspath(os.fspath(directory))
        self.mode = mode
        self.unwrap = unwrap
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

    @property
    def best_metric(self) -> Optional[float]:
        """The best metric saved so far (``None`` before the first save)."""
        return self.index["best"]["metric"] if self.index.get("best") else None

    @property
    def best_epoch(self) -> Optional[int]:
        """The epoch of ``best.pt`` (``None`` before the first save)."""
        return self.index["best"]["epoch"] if self.index.get("best") else None

    @property
    def last_epoch(self) -> Optional[int]:
        """The epoch of ``last.pt``; resume from ``last_epoch + 1``."""
        return self.index["last"]["epoch"] if self.index.get("last") else None

    def is_better(self, metric: float) -> bool:
        """Whether ``metric`` improves on the best so far (NaN never does)."""
        if math.isnan(metric):
            return False
        best = self.best_metric
        if best is None:
            return True
        return metric < best if self.mode == "min" else metric > best

    def save(self, state: Any, *, epoch: int, metric: Any) -> bool:
        """Write ``last.pt``, and ``best.pt`` if ``metric`` improved; update the index.

        Args:
            state: what to save (e.g. ``{"model": ..., "optimizer": ..., "epoch": ...}``).
            epoch: the epoch number recorded in the index.
            metric: a number or a 0-dim tensor (call ``.item()`` is done here).

        Returns:
            True when ``best.pt`` was rewritten.
        """
        value = float(metric.item() if isinstance(metric, torch.Tensor) else metric)
        entry = {"epoch": int(epoch), "metric": value}

        def write() -> Tuple[Dict[str, Any], bool]:
            improved = self.is_better(value)
            _save_local(state, self.last_path, self.unwrap)
            index = dict(self.index)
            index["last"] = dict(entry, file=os.path.basename(self.last_path))
            if improved:
                _link_or_copy(self.last_path, self.best_path)
                index["best"] = dict(entry, file=os.path.basename(self.best_path))
            text = json.dumps(index, indent=2, sort_keys=True)

            def write_index(tmp: str) -> None:
                with open(tmp, "w", encoding="utf-8") as fh:
                    fh.write(text)

            atomic_write(self.index_path, write_index)
            return index, improved

        # Rank 0 decides and writes; every rank gets its index and verdict.
        self.index, improved = on_rank0(write)
        return bool(improved)
