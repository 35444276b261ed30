"""Weights-only unpickling for torch without ``weights_only``, and a static global scanner.

Two tools, both used by :func:`safetorch.checkpoint.load`:

* :data:`RESTRICTED_PICKLE` is a module-like object that ``torch.load(pickle_module=...)``
  accepts. Its ``Unpickler.find_class`` resolves only allow-listed globals, so a pickle can build
  tensors, storages, containers and a few plain classes, and nothing else. That is the same
  guarantee ``torch.load(weights_only=True)`` gives from torch 1.13 on; we use it where torch
  lacks ``weights_only`` and where torch cannot scope an extra allow-list to one call (< 2.5).
* :func:`scan_globals` lists every global a pickle stream references by walking its opcodes with
  :func:`pickletools.genops` -- it executes nothing -- so a refusal can name *every* unsafe
  global, not only the first one an unpickler trips over.
"""

from __future__ import annotations

import _compat_pickle
import argparse
import collections
import io
import pickle
import pickletools
import types
import zipfile
from typing import IO, Any, Dict, Iterable, List, Mapping, Optional, Set, Tuple

import torch

__all__: List[str] = []  # private module

# Globals a plain ``torch.save`` of tensors / state dicts / containers references. Names, not
# objects: some do not exist on every torch (``_rebuild_tensor_v3`` is 2.0+); missing ones are
# skipped. Mirrors torch._weights_only_unpickler._get_allowed_globals (torch 1.13+), written out
# so the fallback does not depend on a private torch module that older torch lacks.
_TORCH_UTILS_REBUILDERS = (
    "_rebuild_tensor",
    "_rebuild_tensor_v2",
    "_rebuild_tensor_v3",
    "_rebuild_parameter",
    "_rebuild_parameter_with_state",
    "_rebuild_qtensor",
    "_rebuild_sparse_tensor",
    "_rebuild_sparse_csr_tensor",
    "_rebuild_meta_tensor_no_storage",
    "_rebuild_nested_tensor",
    "_rebuild_wrapper_subclass",
    "_rebuild_device_tensor_from_cpu_tensor",
)

# Allowed by safetorch on top of torch's list: training scripts store their argparse args.
DEFAULT_EXTRA_ALLOWED: Tuple[Any, ...] = (argparse.Namespace,)

# Globals that run code or reach the OS: flagged as dangerous in refusal messages.
KNOWN_DANGEROUS = frozenset(
    {
        "os.system",
        "posix.system",
        "nt.system",
        "os.popen",
        "os.execv",
        "os.execve",
        "subprocess.Popen",
        "subprocess.call",
        "subprocess.check_call",
        "subprocess.check_output",
        "subprocess.run",
        "builtins.eval",
        "builtins.exec",
        "builtins.compile",
        "builtins.__import__",
        "builtins.getattr",
        "builtins.open",
        "runpy._run_code",
        "importlib.import_module",
    }
)


def qualified_name(obj: Any) -> str:
    """``"module.Name"`` of a class or function, as pickle's GLOBAL opcode spells it."""
    return f"{obj.__module__}.{obj.__qualname__}"


def _torch_allowed_globals() -> Dict[str, Any]:
    rc: Dict[str, Any] = {
        "collections.OrderedDict": collections.OrderedDict,
        "collections.Counter": collections.Counter,
        "torch.nn.parameter.Parameter": torch.nn.Parameter,
        "torch.Size": torch.Size,
        "torch.Tensor": torch.Tensor,
        "torch.device": torch.device,
        "_codecs.encode": __import__("codecs").encode,
        "builtins.bytearray": bytearray,
        "builtins.set": set,
        "builtins.frozenset": frozenset,
        "builtins.complex": complex,
        "builtins.slice": slice,
        "builtins.range": range,
    }
    get_layout = getattr(torch.serialization, "_get_layout", None)
    if get_layout is not None:
        rc["torch.serialization._get_layout"] = get_layout
    for name in _TORCH_UTILS_REBUILDERS:
        fn = getattr(torch._utils, name, None)
        if fn is not None:
            rc[f"torch._utils.{name}"] = fn
    rebuild_from_type = getattr(torch._tensor, "_rebuild_from_type_v2", None)
    if rebuild_from_type is not None:
        rc["torch._tensor._rebuild_from_type_v2"] = rebuild_from_type
    for value in vars(torch).values():
        if isinstance(value, (torch.dtype, torch.layout, torch.memory_format)):
            rc[str(value)] = value
        elif isinstance(value, torch.qscheme):
            rc[str(value)] = value
    for cls in getattr(torch, "_tensor_classes", ()):
        rc[f"{cls.__module__}.{cls.__name__}"] = cls
    for cls in getattr(torch, "_storage_classes", ()):
        # Legacy typed storages (torch.FloatStorage) are swapped for StorageType by torch's own
        # find_class before ours runs; the generic ones are listed for legacy-format streams.
        rc[f"{cls.__module__}.{cls.__name__}"] = cls
    return rc


def resolve_allowed(allow: Iterable[Any]) -> Dict[str, Any]:
    """Map each ``allow`` entry (a class/function or a ``"module.Name"`` string) to its name.

    Strings are kept unresolved (the object is imported only if a file references it).
    """
    out: Dict[str, Any] = {}
    for entry in allow:
        if isinstance(entry, str):
            if "." not in entry:
                raise ValueError(
                    f"allow entry {entry!r} is not a 'module.Name' string; pass e.g. "
                    "'argparse.Namespace' or the class itself"
                )
            out[entry] = None
        elif isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[1], str):
            out[entry[1]] = entry[0]  # torch's (obj, "module.Name") form
        elif callable(entry):
            out[qualified_name(entry)] = entry
        else:
            raise TypeError(
                f"allow entry {entry!r} must be a class, a function or a 'module.Name' string"
            )
    return out


def import_global(name: str) -> Any:
    """Import ``"pkg.mod.Name"`` (longest importable module prefix, then attributes)."""
    import importlib

    parts = name.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(f"cannot import {name!r}")


class _RefusedGlobal(pickle.UnpicklingError):
    def __init__(self, name: str) -> None:
        super().__init__(f"global {name!r} is not allow-listed for weights-only loading")
        self.name = name


def make_restricted_pickle_module(extra: Mapping[str, Any]) -> types.ModuleType:
    """A ``pickle_module`` for ``torch.load`` whose unpickler only resolves allowed globals.

    Args:
        extra: ``{"module.Name": obj_or_None}`` allowed on top of torch's tensor globals
            (``None`` means import it on first use).
    """
    allowed = dict(_torch_allowed_globals())
    pending = {name: obj for name, obj in extra.items()}

    class Unpickler(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> Any:
            full = _normalize(module, name)  # what pickle's own find_class does for proto <= 2
            if full in allowed:
                return allowed[full]
            if full in pending:
                obj = pending[full]
                return obj if obj is not None else import_global(full)
            raise _RefusedGlobal(full)

    def load(file: IO[bytes], **kwargs: Any) -> Any:
        return Unpickler(file, **kwargs).load()

    def loads(data: bytes, **kwargs: Any) -> Any:
        return Unpickler(io.BytesIO(data), **kwargs).load()

    module = types.ModuleType("safetorch_restricted_pickle")
    module.Unpickler = Unpickler  # type: ignore[attr-defined]
    module.load = load  # type: ignore[attr-defined]
    module.loads = loads  # type: ignore[attr-defined]
    module.UnpicklingError = pickle.UnpicklingError  # type: ignore[attr-defined]
    return module


def is_refused_global(exc: BaseException) -> bool:
    """True for the error our restricted unpickler raises on a non-allow-listed global."""
    return isinstance(exc, _RefusedGlobal)


# --- static scan ----------------------------------------------------------------------------
_STRING_OPS = {
    "SHORT_BINUNICODE",
    "BINUNICODE",
    "BINUNICODE8",
    "UNICODE",
    "STRING",
    "BINSTRING",
    "SHORT_BINSTRING",
}


def _normalize(module: str, name: str) -> str:
    """Python 2 names that protocol <= 2 pickles carry (``__builtin__.eval``) -> Python 3."""
    module, name = _compat_pickle.NAME_MAPPING.get((module, name), (module, name))
    module = _compat_pickle.IMPORT_MAPPING.get(module, module)
    return f"{module}.{name}"


def _globals_in_stream(stream: IO[bytes], found: List[str]) -> bool:
    """Append the globals of one pickle in ``stream``; False when the stream ended or broke."""
    memo: Dict[Any, Any] = {}
    pushed: List[Any] = []
    saw_any = False
    try:
        for opcode, arg, _pos in pickletools.genops(stream):
            saw_any = True
            name = opcode.name
            if name in ("GLOBAL", "INST"):
                module, _, attr = str(arg).partition(" ")
                found.append(_normalize(module, attr))
                pushed.append(None)
            elif name == "STACK_GLOBAL":
                s_attr = pushed[-1] if pushed else None
                s_mod = pushed[-2] if len(pushed) > 1 else None
                if isinstance(s_mod, str) and isinstance(s_attr, str):
                    found.append(_normalize(s_mod, s_attr))
                else:
                    found.append("<STACK_GLOBAL with a computed name>")
                pushed.append(None)
            elif name in ("EXT1", "EXT2", "EXT4"):
                found.append(f"<copyreg extension code {arg}>")
                pushed.append(None)
            elif name in _STRING_OPS:
                pushed.append(arg)
            elif name == "MEMOIZE":
                memo[len(memo)] = pushed[-1] if pushed else None
            elif name in ("PUT", "BINPUT", "LONG_BINPUT"):
                memo[arg] = pushed[-1] if pushed else None
            elif name in ("GET", "BINGET", "LONG_BINGET"):
                pushed.append(memo.get(arg))
            elif name == "STOP":
                return True
            else:
                pushed.append(None)
    except Exception:  # truncated / corrupt stream: report what was seen
        return False
    return saw_any


def scan_globals(source: Any) -> Tuple[List[str], bool]:
    """Every global referenced by the pickles of a ``torch.save`` file, executing nothing.

    Args:
        source: a path or a seekable binary file object (zip or legacy format, or a raw pickle).

    Returns:
        ``(names, complete)``: the ``"module.Name"`` strings in file order without duplicates,
        and whether the whole pickle stream could be parsed.
    """
    opened: Optional[IO[bytes]] = None
    if isinstance(source, (str, bytes)) or hasattr(source, "__fspath__"):
        opened = open(source, "rb")  # noqa: SIM115 - closed below
        stream: IO[bytes] = opened
    else:
        stream = source
    try:
        start = stream.tell()
        head = stream.read(4)
        stream.seek(start)
        found: List[str] = []
        complete = True
        if head == b"PK\x03\x04":
            try:
                with zipfile.ZipFile(stream) as archive:
                    pkls = [n for n in archive.namelist() if n.endswith("data.pkl")]
                    complete = bool(pkls)
                    for member in pkls:
                        data = archive.read(member)
                        complete &= _globals_in_stream(io.BytesIO(data), found)
            except (zipfile.BadZipFile, OSError, EOFError, ValueError):
                complete = False  # damaged archive: the loader reports it
        else:
            # Legacy format: magic number, protocol, sys info, the object, storage keys -- five
            # pickles, then raw storage bytes. A raw malicious pickle is just the first one.
            for _ in range(5):
                if not _globals_in_stream(stream, found):
                    complete = False
                    break
        stream.seek(start)
    finally:
        if opened is not None:
            opened.close()
    return list(dict.fromkeys(found)), complete


def unsafe_globals(names: Iterable[str], extra: Mapping[str, Any]) -> List[str]:
    """The subset of ``names`` that neither torch's tensor globals nor ``extra`` allow."""
    allowed: Set[str] = set(_torch_allowed_globals()) | set(extra)
    return [
        n
        for n in names
        # torch maps "torch.<X>Storage" to StorageType before any allow-list is consulted.
        if n not in allowed and not (n.startswith("torch.") and n.endswith("Storage"))
    ]
