"""safetorch's restricted unpickler and its bounded global scanner.

Untrusted checkpoints are never handed to :class:`pickle.Unpickler`, not even after a scan:
plain pickle runs ``BUILD`` (``setattr`` / ``__dict__.update``) on whatever object is on its
stack, including classes and functions reached by ``GLOBAL``, which poisons the process for
every later load. :class:`RestrictedUnpickler` is a pure-Python unpickler modelled opcode by
opcode on ``torch/_weights_only_unpickler.py`` (torch >= 2.6) and never less strict than it.

Opcode policy (anything not listed is refused with :class:`RefusedOpcode`):

==========================  ==================================================================
opcode                      rule
==========================  ==================================================================
GLOBAL, STACK_GLOBAL        resolved through ``find_class``: only allow-listed ``module.Name``
                            (torch's weights-only list, the caller's ``allow=``, the user's
                            ``torch.serialization.add_safe_globals``) or, with a trust rule,
                            what it admits; modules ``sys``, ``os``, ``posix``, ``nt`` never.
                            STACK_GLOBAL only with two str operands.
REDUCE                      only on an allow-listed callable; ``bytearray`` only from bytes/str
                            (never ``bytearray(<huge int>)``), ``set``/``frozenset`` only from a
                            list or tuple; a trust rule's numpy functions only with the
                            arguments numpy writes.
NEWOBJ                      only on an allow-listed *class* (``cls.__new__(cls, *args)``), or a
                            class a trust rule admits, without arguments.
BUILD                       only on an instance created by this load (never on a class,
                            function, module or any object reached by GLOBAL) whose type is
                            allow-listed (an ``allow=`` string counts once imported, and
                            ``numpy.dtype`` covers ``numpy.dtypes.*``), ``Tensor``,
                            ``Parameter`` or ``OrderedDict``, or a trust rule's class (a dict
                            state only) or numpy array/dtype (numpy's state, no object
                            dtype); state keys that are dunder names (``__class__``,
                            ``__dict__``, ...) are refused.
BINPERSID                   only torch's storage ids: ``("storage", <storage type>, key,
                            location, numel[, view])``; never ``("module", ...)`` (torch's
                            legacy reader writes ``.patch`` files for those) and never ints,
                            except ``("module", cls, file, source)`` of a class a trust rule
                            admitted, which stands for ``cls`` (torch's reader is not asked).
INST, OBJ, EXT1/2/4,        refused (they call arbitrary classes or the copyreg registry).
PERSID, NEWOBJ_EX, POP,
DUP, buffers, text-mode ops
containers, scalars,        as pickle defines them; SETITEM(S) only into dict / OrderedDict /
strings, memo, MARK, FRAME  Counter, APPEND(S) only into list, ADDITEMS only into set.
==========================  ==================================================================

The trust rule (``st.load(..., trust_root=DIR)``, ``safetorch run``) is
:mod:`safetorch.checkpoint._trust`; its docstring states the boundary exactly.

Work is bounded: at most :data:`MAX_STACK` live stack items (all MARK levels together) and
:data:`MAX_MEMO` memo entries; strings and bytes are read with explicit lengths and checked.

:func:`scan_pickle` walks the same opcodes without building anything, to name *every*
unsafe global in a refusal. It keeps only what ``STACK_GLOBAL`` needs (the last two strings
pushed, and memoized strings up to a cap), so its memory does not grow with the opcode count,
and it stops at the first opcode the unpickler would refuse, at a byte budget or a deadline.
"""

from __future__ import annotations

import _compat_pickle
import argparse
import codecs
import collections
import io
import pickle
import struct
import sys
import time
import types
import zipfile
from typing import IO, Any, Dict, FrozenSet, Iterable, List, Mapping, Optional, Tuple

import torch

from safetorch import _compat
from safetorch.checkpoint import _trust, formats
from safetorch.errors import CheckpointError

__all__: List[str] = []  # private module

MAX_STACK = 1 << 22  # live stack items, all MARK levels together (pickle batches 1000 a MARK)
MAX_MEMO = 1 << 22  # memo entries (torch.save memoizes ~5 per tensor: ~800k tensors)
_BLOCKED_MODULES = frozenset({"sys", "os", "posix", "nt"})

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
        "builtins.setattr",
        "builtins.open",
        "runpy._run_code",
        "importlib.import_module",
    }
)


class RefusedGlobal(pickle.UnpicklingError):
    """A GLOBAL outside the allow-list (``name`` is its ``module.Name``; ``reason``, when a
    trust rule was asked too, says why it did not admit it)."""

    def __init__(self, name: str, reason: str = "") -> None:
        text = f"global {name!r} is not allow-listed for weights-only loading"
        super().__init__(f"{text} ({reason})" if reason else text)
        self.name = name
        self.reason = reason


class RefusedOpcode(pickle.UnpicklingError):
    """An opcode, or an opcode applied to an object, that the policy refuses."""


def qualified_name(obj: Any) -> str:
    """``"module.Name"`` of a class or function, as pickle's GLOBAL opcode spells it."""
    return f"{obj.__module__}.{obj.__qualname__}"


def _normalize(module: str, name: str) -> str:
    """Python 2 names that protocol <= 2 pickles carry (``__builtin__.eval``) -> Python 3."""
    if (module, name) in _compat_pickle.NAME_MAPPING:
        module, name = _compat_pickle.NAME_MAPPING[(module, name)]
    elif module in _compat_pickle.IMPORT_MAPPING:
        module = _compat_pickle.IMPORT_MAPPING[module]
    return f"{module}.{name}"


# --- allow-lists ----------------------------------------------------------------------------
# torch's own list: torch._weights_only_unpickler._get_allowed_globals (torch 1.13+). The names
# below are the fallback when that private function is missing or fails; they mirror torch
# 2.13's list (no builtins.slice / builtins.range: torch does not allow them).
_TORCH_UTILS_REBUILDERS = (
    "_rebuild_tensor",
    "_rebuild_tensor_v2",
    "_rebuild_tensor_v3",
    "_rebuild_parameter",
    "_rebuild_parameter_with_state",
    "_rebuild_qtensor",
    "_rebuild_sparse_tensor",
    "_rebuild_meta_tensor_no_storage",
    "_rebuild_nested_tensor",
    "_rebuild_wrapper_subclass",
    "_rebuild_device_tensor_from_cpu_tensor",
)
_TORCH_ALLOWED: Optional[Dict[str, Any]] = None


def _fallback_allowed_globals() -> Dict[str, Any]:
    rc: Dict[str, Any] = {
        "collections.OrderedDict": collections.OrderedDict,
        "collections.Counter": collections.Counter,
        "torch.nn.parameter.Parameter": torch.nn.Parameter,
        "torch.Size": torch.Size,
        "torch.Tensor": torch.Tensor,
        "torch.device": torch.device,
        "_codecs.encode": codecs.encode,
        "builtins.bytearray": bytearray,
        "builtins.set": set,
        "builtins.complex": complex,
    }
    if _compat.get_layout is not None:
        rc["torch.serialization._get_layout"] = _compat.get_layout
    for name in _TORCH_UTILS_REBUILDERS:
        fn = getattr(_compat.torch_utils, name, None)
        if fn is not None:
            rc[f"torch._utils.{name}"] = fn
    if _compat.rebuild_from_type_v2 is not None:
        rc["torch._tensor._rebuild_from_type_v2"] = _compat.rebuild_from_type_v2
    for value in vars(torch).values():
        if isinstance(value, (torch.dtype, torch.qscheme)):
            rc[str(value)] = value
    for cls in getattr(torch, "_tensor_classes", ()):
        rc[f"{cls.__module__}.{cls.__name__}"] = cls
    for cls in getattr(torch, "_storage_classes", ()):
        rc[f"{cls.__module__}.{cls.__name__}"] = cls
    return rc


def torch_allowed_globals() -> Dict[str, Any]:
    """torch's default weights-only allow-list (``{"module.Name": object}``), computed once:
    the installed torch's own list joined with the newest torch's (written out below)."""
    global _TORCH_ALLOWED
    if _TORCH_ALLOWED is None:
        found: Optional[Dict[str, Any]] = None
        getter = _compat.weights_only_allowed_globals
        if getter is not None:
            try:
                found = dict(getter())
            except Exception:  # a private helper that changed shape: use the written-out list
                found = None
        # Older torch lists fewer safe types (1.13 has no set, bytes or complex); the written-out
        # list mirrors the newest torch's, so a file loads alike on every torch.
        _TORCH_ALLOWED = {**_fallback_allowed_globals(), **(found or {})}
    return _TORCH_ALLOWED


def user_safe_globals() -> Dict[str, Any]:
    """Globals the user registered with ``torch.serialization.add_safe_globals`` (torch 2.4+)."""
    getter = getattr(torch.serialization, "get_safe_globals", None)
    if getter is None:
        return {}
    out: Dict[str, Any] = {}
    for entry in getter():
        if isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[1], str):
            out[entry[1]] = entry[0]
        elif callable(entry):
            out[qualified_name(entry)] = entry
    return out


def resolve_allowed(allow: Iterable[Any]) -> Dict[str, Any]:
    """Map each ``allow`` entry (a class/function or a ``"module.Name"`` string) to its name.

    Strings are kept unresolved (``None``): the object is imported only if a file uses it.

    Raises:
        TypeError: an entry is neither a class/function, a ``(obj, "module.Name")`` pair nor
            a string.
        ValueError: a string entry has no dot.
    """
    if isinstance(allow, (str, bytes)) or not isinstance(allow, Iterable):
        raise TypeError(
            f"allow must be a list of classes/functions or 'module.Name' strings, got "
            f"{type(allow).__name__} {allow!r}; e.g. allow=[argparse.Namespace]"
        )
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


class Policy:
    """The globals one load may resolve: torch's list, the user's safe globals, ``extra``,
    and what ``trust`` (the project trust rule, :mod:`safetorch.checkpoint._trust`) admits.

    Built per call, so an ``allow=`` never outlives its call nor reaches another thread.
    """

    def __init__(
        self, extra: Mapping[str, Any], trust: Optional[_trust.ProjectTrust] = None
    ) -> None:
        self.names: Dict[str, Any] = {**torch_allowed_globals(), **user_safe_globals()}
        self._pending: Dict[str, Any] = {}
        for name, obj in extra.items():
            if obj is None:
                self._pending[name] = None
            else:
                self.names[name] = obj
        self.values_ids: FrozenSet[int] = frozenset(id(v) for v in self.names.values())
        self.trust = trust
        self._trusted: Dict[str, Any] = {}  # name -> object the trust rule admitted
        self._roles: Dict[int, str] = {}  # id(object) -> its role (_trust.CLASS / CALL / VALUE)

    def allows(self, full: str) -> bool:
        module = full.split(".", 1)[0]
        if module in _BLOCKED_MODULES:
            return False
        if full in self.names or full in self._pending or full in self._trusted:
            return True
        return self._admit(full)

    def _admit(self, full: str) -> bool:
        if self.trust is None:
            return False
        decision = self.trust.decide(full)
        if decision.role is None:
            return False
        self._trusted[full] = decision.obj
        self._roles[id(decision.obj)] = decision.role
        return True

    def why_refused(self, full: str) -> str:
        """The trust rule's reason for refusing ``full`` ("" without a trust rule)."""
        if self.trust is None or full.split(".", 1)[0] in _BLOCKED_MODULES:
            return ""
        return self.trust.decide(full).reason

    def resolve(self, full: str) -> Any:
        if not self.allows(full):
            raise RefusedGlobal(full, self.why_refused(full))
        if full in self.names:
            return self.names[full]
        if full in self._pending:  # an allow= string: import it on first use
            obj = import_global(full)
            self.names[full] = obj
            self.values_ids = self.values_ids | {id(obj)}
            return obj
        return self._trusted[full]

    def is_allowed_object(self, obj: Any) -> bool:
        """``obj`` is on the allow-list (an ``allow=`` string names it once it is imported:
        BUILD sees the type of what a REDUCE made, ``numpy.dtypes.Float64DType``, which no
        GLOBAL of the file names)."""
        if id(obj) in self.values_ids:
            return True
        if self._pending:
            name = _own_name(obj)
            if name is not None and name in self._pending and name not in self.names:
                try:
                    return self.resolve(name) is obj
                except Exception:  # not importable as named: not the object the user allowed
                    return False
        return False

    def trusted_role(self, obj: Any) -> Optional[str]:
        """The role the trust rule gave ``obj`` in this load (None: not admitted by it)."""
        return self._roles.get(id(obj)) if self._roles else None


def _own_name(obj: Any) -> Optional[str]:
    """``"module.Qualname"`` of a class or function (None for other objects)."""
    if not isinstance(obj, type) and not callable(obj):
        return None
    module = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None)
    if isinstance(module, str) and isinstance(qualname, str):
        return f"{module}.{qualname}"
    return None


def unsafe_globals(
    names: Iterable[str], extra: Mapping[str, Any], trust: Optional[_trust.ProjectTrust] = None
) -> List[str]:
    """The subset of ``names`` that neither torch's list, the user's safe globals, ``extra``
    nor ``trust`` allow (torch maps ``torch.<X>Storage`` names to storage types before any list
    is read)."""
    policy = Policy(extra, trust)
    return [
        n
        for n in names
        if not policy.allows(n) and not (n.startswith("torch.") and n.endswith("Storage"))
    ]


# --- the unpickler --------------------------------------------------------------------------
_op = {
    name: getattr(pickle, name)[0]
    for name in dir(pickle)
    if name.isupper()
    and isinstance(getattr(pickle, name), bytes)
    and len(getattr(pickle, name)) == 1
}
_unpack = struct.unpack
_DICT_TYPES = (dict, collections.OrderedDict, collections.Counter)


def _is_dunder(key: Any) -> bool:
    return isinstance(key, str) and key.startswith("__") and key.endswith("__")


def _check_state_keys(state: Any, what: str) -> None:
    if isinstance(state, dict):
        bad = [k for k in state if not isinstance(k, str) or _is_dunder(k)]
        if bad:
            raise RefusedOpcode(f"BUILD {what} with refused attribute name(s) {bad[:3]!r}")
    elif state is not None:
        raise RefusedOpcode(f"BUILD {what} with a {type(state).__name__} state")


def _storage_type_ok(obj: Any) -> bool:
    storage_type = getattr(torch.serialization, "StorageType", None)
    if storage_type is not None and type(obj) is storage_type:
        return True
    return isinstance(obj, type) and obj in getattr(torch, "_storage_classes", ())


def storage_nbytes(storage_type: Any, numel: int) -> int:
    """The bytes a zip persistent id's storage claims: ``numel`` elements of its dtype (an
    ``UntypedStorage`` counts bytes), as torch's ``persistent_load`` computes them."""
    dtype = torch.uint8 if storage_type is torch.UntypedStorage else storage_type.dtype
    return numel * torch.empty((), dtype=dtype).element_size()


def check_storage_fits(name: str, key: str, nbytes: int, held: int) -> None:
    """Refuse a storage that claims more bytes than its zip record ``key`` holds (``name``:
    the file as shown in errors): torch before pytorch#165553, and torch's mapped path on
    every release, would read the bytes after the record as tensor data."""
    if nbytes < 0 or nbytes > held:
        raise CheckpointError(
            f"cannot load checkpoint {name}: storage {key!r} claims {nbytes} bytes but its zip "
            f"record holds {held} (the file is truncated or corrupt)"
        )


def check_persistent_id(pid: Any) -> None:
    """Refuse every persistent id but torch's storage forms (zip: 5 fields, legacy: 6)."""
    if type(pid) is not tuple or len(pid) not in (5, 6):
        raise RefusedOpcode(
            f"persistent id {type(pid).__name__} of length {len(pid) if type(pid) is tuple else '-'}"
            " is not a torch storage id"
        )
    tag = pid[0]
    if isinstance(tag, bytes):
        tag = tag.decode("ascii", "replace")
    if tag != "storage":
        raise RefusedOpcode(f"persistent id {tag!r} refused: only 'storage' ids are loaded")
    storage_type, key, location, numel = pid[1:5]
    if not _storage_type_ok(storage_type):
        raise RefusedOpcode(f"storage id with a {type(storage_type).__name__} storage type")
    if type(key) not in (str, bytes, int) or type(location) not in (str, bytes):
        raise RefusedOpcode("storage id with a key or location that is not a string")
    if type(numel) is not int or numel < 0:
        raise RefusedOpcode(f"storage id with numel {numel!r}")
    if len(pid) == 6:
        view = pid[5]
        if view is not None and not (
            type(view) is tuple and len(view) == 3 and all(type(v) in (int, str) for v in view)
        ):
            raise RefusedOpcode("storage id with a malformed view")


class RestrictedUnpickler:
    """A weights-only unpickler; see the module docstring for the opcode policy.

    Usable as ``pickle_module.Unpickler`` for torch's readers, which subclass it, override
    ``find_class`` (storage names) and set ``persistent_load``.
    """

    policy: Policy  # set by make_restricted_pickle_module

    def __init__(
        self,
        file: IO[bytes],
        *,
        encoding: str = "ASCII",
        errors: str = "strict",
        fix_imports: bool = True,
        **_ignored: Any,
    ) -> None:
        self.read = file.read
        self.readline = file.readline
        self.encoding = encoding
        self.errors = errors
        self.memo: Dict[int, Any] = {}
        self.proto = -1

    def find_class(self, module: str, name: str) -> Any:
        if not isinstance(module, str) or not isinstance(name, str):
            raise RefusedOpcode("STACK_GLOBAL with operands that are not strings")
        return self.policy.resolve(_normalize(module, name))

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("unsupported persistent id encountered")

    def _read_exact(self, n: int) -> bytes:
        data = self.read(n)
        if len(data) != n:
            raise pickle.UnpicklingError("pickle data was truncated")
        return data

    def _string(self, data: bytes) -> Any:
        if self.encoding == "bytes":
            return data
        return data.decode(self.encoding, self.errors)

    def load(self) -> Any:  # noqa: C901 - one dispatch loop, as pickle's own
        read = self._read_exact
        policy = self.policy
        stack: List[Any] = []
        metastack: List[List[Any]] = []
        memo = self.memo
        created_globals: set = set()  # ids of objects reached by GLOBAL: never BUILD targets
        depth = 0  # items below the current MARK level
        op = _op
        while True:
            if len(stack) + depth > MAX_STACK:
                raise RefusedOpcode(f"pickle stack grew beyond {MAX_STACK} items")
            key = self.read(1)
            if not key:
                raise EOFError("pickle data was truncated")
            c = key[0]
            if c == op["BINPUT"] or c == op["LONG_BINPUT"]:
                i = read(1)[0] if c == op["BINPUT"] else _unpack("<I", read(4))[0]
                if i not in memo and len(memo) >= MAX_MEMO:
                    raise RefusedOpcode(f"pickle memo grew beyond {MAX_MEMO} entries")
                memo[i] = stack[-1]
            elif c == op["MEMOIZE"]:
                if len(memo) >= MAX_MEMO:
                    raise RefusedOpcode(f"pickle memo grew beyond {MAX_MEMO} entries")
                memo[len(memo)] = stack[-1]
            elif c == op["BINGET"] or c == op["LONG_BINGET"]:
                i = read(1)[0] if c == op["BINGET"] else _unpack("<I", read(4))[0]
                try:
                    stack.append(memo[i])
                except KeyError:
                    raise pickle.UnpicklingError(f"memo key {i} is not defined") from None
            elif c == op["MARK"]:
                metastack.append(stack)
                depth += len(stack)
                stack = []
            elif c in (op["BINUNICODE"], op["SHORT_BINUNICODE"], op["BINUNICODE8"]):
                n = (
                    read(1)[0]
                    if c == op["SHORT_BINUNICODE"]
                    else _unpack("<I", read(4))[0]
                    if c == op["BINUNICODE"]
                    else _unpack("<Q", read(8))[0]
                )
                stack.append(str(read(n), "utf-8", "surrogatepass"))
            elif c == op["GLOBAL"]:
                module = self.readline()[:-1].decode("utf-8")
                name = self.readline()[:-1].decode("utf-8")
                obj = self.find_class(module, name)
                created_globals.add(id(obj))
                stack.append(obj)
            elif c == op["STACK_GLOBAL"]:
                name = stack.pop()
                module = stack.pop()
                obj = self.find_class(module, name)
                created_globals.add(id(obj))
                stack.append(obj)
            elif c == op["BINPERSID"]:
                pid = stack.pop()
                if policy.trust is not None and _trusted_module_pid(pid, policy):
                    # torch < 1.6's legacy format names each module class in a ("module",
                    # cls, source file, source) id; torch's reader would compare sources (and
                    # may write .patch files): the class a trust rule admitted is all it means.
                    stack.append(pid[1])
                    continue
                check_persistent_id(pid)
                stack.append(self.persistent_load(pid))
            elif c == op["REDUCE"]:
                args = stack.pop()
                func = stack[-1]
                if type(args) is not tuple:
                    raise RefusedOpcode(f"REDUCE on {_describe(func)} is not allowed")
                if policy.is_allowed_object(func):
                    _check_reduce_args(func, args)
                elif policy.trust is not None and policy.trusted_role(func) == _trust.CALL:
                    why = policy.trust.check_call(func, args)
                    if why:
                        raise RefusedOpcode(f"REDUCE refused: {why}")
                else:
                    raise RefusedOpcode(f"REDUCE on {_describe(func)} is not allowed")
                stack[-1] = func(*args)
            elif c == op["NEWOBJ"]:
                args = stack.pop()
                cls = stack.pop()
                if type(args) is not tuple or not isinstance(cls, type):
                    raise RefusedOpcode(f"NEWOBJ on {_describe(cls)} is not allowed")
                if cls is torch.nn.Parameter:
                    stack.append(torch.nn.Parameter(*args))
                elif policy.is_allowed_object(cls):
                    stack.append(cls.__new__(cls, *args))
                elif policy.trusted_role(cls) == _trust.CLASS:
                    if args:  # torch.save writes NEWOBJ(cls, ()) for a module
                        raise RefusedOpcode(f"NEWOBJ on {_describe(cls)} with arguments")
                    stack.append(cls.__new__(cls, *args))  # args is () here
                else:
                    raise RefusedOpcode(f"NEWOBJ on {_describe(cls)} is not allowed")
            elif c == op["BUILD"]:
                state = stack.pop()
                inst = stack[-1]
                _build(inst, state, policy, created_globals)
            elif c == op["EMPTY_DICT"]:
                stack.append({})
            elif c == op["EMPTY_LIST"]:
                stack.append([])
            elif c == op["EMPTY_TUPLE"]:
                stack.append(())
            elif c == op["EMPTY_SET"]:
                stack.append(set())
            elif c == op["SETITEM"]:
                v = stack.pop()
                k = stack.pop()
                if type(stack[-1]) not in _DICT_TYPES:
                    raise RefusedOpcode(f"SETITEM into {type(stack[-1]).__name__}")
                stack[-1][k] = v
            elif c == op["SETITEMS"] or c == op["APPENDS"] or c == op["ADDITEMS"]:
                items = stack
                stack = metastack.pop()
                depth -= len(stack)
                target = stack[-1]
                if c == op["SETITEMS"]:
                    if type(target) not in _DICT_TYPES or len(items) % 2:
                        raise RefusedOpcode(f"SETITEMS into {type(target).__name__}")
                    for i in range(0, len(items), 2):
                        target[items[i]] = items[i + 1]
                elif c == op["APPENDS"]:
                    if type(target) is not list:
                        raise RefusedOpcode(f"APPENDS to {type(target).__name__}")
                    target.extend(items)
                else:
                    if type(target) is not set:
                        raise RefusedOpcode(f"ADDITEMS to {type(target).__name__}")
                    target.update(items)
            elif c == op["APPEND"]:
                item = stack.pop()
                if type(stack[-1]) is not list:
                    raise RefusedOpcode(f"APPEND to {type(stack[-1]).__name__}")
                stack[-1].append(item)
            elif c == op["TUPLE"] or c == op["FROZENSET"]:
                items = stack
                stack = metastack.pop()
                depth -= len(stack)
                stack.append(tuple(items) if c == op["TUPLE"] else frozenset(items))
            elif c == op["TUPLE1"]:
                stack[-1] = (stack[-1],)
            elif c == op["TUPLE2"]:
                stack[-2:] = [(stack[-2], stack[-1])]
            elif c == op["TUPLE3"]:
                stack[-3:] = [(stack[-3], stack[-2], stack[-1])]
            elif c == op["NONE"]:
                stack.append(None)
            elif c == op["NEWTRUE"]:
                stack.append(True)
            elif c == op["NEWFALSE"]:
                stack.append(False)
            elif c == op["BININT"]:
                stack.append(_unpack("<i", read(4))[0])
            elif c == op["BININT1"]:
                stack.append(read(1)[0])
            elif c == op["BININT2"]:
                stack.append(_unpack("<H", read(2))[0])
            elif c == op["LONG1"]:
                stack.append(pickle.decode_long(read(read(1)[0])))
            elif c == op["BINFLOAT"]:
                stack.append(_unpack(">d", read(8))[0])
            elif c == op["SHORT_BINSTRING"] or c == op["BINSTRING"]:
                n = read(1)[0] if c == op["SHORT_BINSTRING"] else _unpack("<i", read(4))[0]
                if n < 0:
                    raise pickle.UnpicklingError("BINSTRING pickle has negative byte count")
                stack.append(self._string(read(n)))
            elif c in (op["SHORT_BINBYTES"], op["BINBYTES"], op["BINBYTES8"], op["BYTEARRAY8"]):
                n = (
                    read(1)[0]
                    if c == op["SHORT_BINBYTES"]
                    else _unpack("<I", read(4))[0]
                    if c == op["BINBYTES"]
                    else _unpack("<Q", read(8))[0]
                )
                data = read(n)
                stack.append(bytearray(data) if c == op["BYTEARRAY8"] else data)
            elif c == op["FRAME"]:
                read(8)  # a length hint; opcodes are read one by one regardless
            elif c == op["PROTO"]:
                self.proto = read(1)[0]
                if self.proto > pickle.HIGHEST_PROTOCOL:
                    raise pickle.UnpicklingError(f"unsupported pickle protocol: {self.proto}")
            elif c == op["STOP"]:
                if not stack:
                    raise pickle.UnpicklingError("pickle STOP with an empty stack")
                return stack.pop()
            else:
                raise RefusedOpcode(
                    f"pickle opcode {_opname(c)} is refused by weights-only loading"
                )


def _trusted_module_pid(pid: Any, policy: Policy) -> bool:
    """``("module", cls, source_file, source)`` whose ``cls`` the trust rule admitted as a class."""
    if type(pid) is not tuple or len(pid) != 4 or type(pid[2]) is not str:
        return False
    tag = pid[0].decode("ascii", "replace") if isinstance(pid[0], bytes) else pid[0]
    return tag == "module" and type(pid[3]) is str and policy.trusted_role(pid[1]) == _trust.CLASS


def _opname(code: int) -> str:
    name = _NAMES.get(code)
    return f"{name} ({bytes([code])!r})" if name else repr(bytes([code]))


def _describe(obj: Any) -> str:
    if isinstance(obj, type) or callable(obj):
        name = getattr(obj, "__qualname__", None) or type(obj).__name__
        return f"{getattr(obj, '__module__', '?')}.{name}"
    return f"a {type(obj).__name__}"


def _check_reduce_args(func: Any, args: Tuple[Any, ...]) -> None:
    if func is bytearray:
        if args and not isinstance(args[0], (bytes, bytearray, str)):
            raise RefusedOpcode("REDUCE bytearray(...) only from bytes or str")
    elif func is set or func is frozenset:
        if args and type(args[0]) not in (list, tuple):
            raise RefusedOpcode("REDUCE set(...) only from a list or tuple")


def _build(inst: Any, state: Any, policy: Policy, created_globals: set) -> None:
    if id(inst) in created_globals or isinstance(
        inst, (type, types.FunctionType, types.BuiltinFunctionType, types.ModuleType)
    ):
        raise RefusedOpcode(
            f"BUILD on {_describe(inst)} refused: only objects created by this load are built"
        )
    kind = type(inst)
    if kind is torch.Tensor:  # legacy tensors: set_(storage, offset, size, stride)
        if type(state) is not tuple:
            raise RefusedOpcode("BUILD on a Tensor needs a tuple state")
        inst.set_(*state)
    elif kind is torch.nn.Parameter:
        inst.__setstate__(state)
    elif kind is collections.OrderedDict:  # state dicts carry `_metadata`
        _check_state_keys(state, "on an OrderedDict")
        inst.__dict__.update(state)
    elif policy.is_allowed_object(kind) or _numpy_dtype_allowed(kind, policy):
        setstate = getattr(inst, "__setstate__", None)
        if setstate is not None and getattr(kind, "__setstate__", None) is not getattr(
            object, "__setstate__", None
        ):
            setstate(state)
            return
        slotstate = None
        if isinstance(state, tuple) and len(state) == 2:
            state, slotstate = state
        if state:
            _check_state_keys(state, f"on {_describe(kind)}")
            inst.__dict__.update(state)
        if slotstate:
            _check_state_keys(slotstate, f"on {_describe(kind)}")
            for k, v in slotstate.items():
                setattr(inst, k, v)
    elif policy.trusted_role(kind) == _trust.CLASS:
        # A project or torch.nn module: a dict of attributes, through the class's own
        # __setstate__ (nn.Module's: __dict__.update plus defaults) when it has one.
        if type(state) is not dict:
            raise RefusedOpcode(
                f"BUILD on {_describe(kind)} with a {type(state).__name__} state (a dict only)"
            )
        _check_state_keys(state, f"on {_describe(kind)}")
        if getattr(kind, "__setstate__", None) is not getattr(object, "__setstate__", None):
            inst.__setstate__(state)
        else:
            inst.__dict__.update(state)
    elif policy.trust is not None and _trust.is_numpy_build_target(inst):
        why = policy.trust.check_build(inst, state)
        if why:
            raise RefusedOpcode(why)
        inst.__setstate__(state)  # numpy's own (C) __setstate__
    else:
        hint = ""
        if isinstance(kind, type) and _own_name(kind) is not None:
            hint = f"; allow {_own_name(kind)} if you trust it"
        raise RefusedOpcode(f"BUILD on {_describe(inst)} is not allowed{hint}")


def _numpy_dtype_allowed(kind: Any, policy: Policy) -> bool:
    """BUILD on a ``numpy.dtypes.Float64DType`` (what ``numpy.dtype(...)`` returns) where
    ``numpy.dtype`` itself is allowed: the names a refusal lists are enough for an array
    (torch's safe_globals also needs ``type(np.dtype(np.float64))``)."""
    np = sys.modules.get("numpy")
    return (
        np is not None
        and isinstance(kind, type)
        and kind.__module__ == "numpy.dtypes"
        and issubclass(kind, np.dtype)
        and policy.is_allowed_object(np.dtype)
    )


def make_restricted_pickle_module(
    extra: Mapping[str, Any], trust: Optional[_trust.ProjectTrust] = None
) -> types.ModuleType:
    """A ``pickle_module`` for torch's readers whose ``Unpickler`` is :class:`RestrictedUnpickler`
    with a per-call :class:`Policy` (torch's list + the user's safe globals + ``extra``, and
    what ``trust`` admits)."""
    policy = Policy(extra, trust)

    class Unpickler(RestrictedUnpickler):
        pass

    Unpickler.policy = policy

    def load(file: IO[bytes], **kwargs: Any) -> Any:
        return Unpickler(file, **kwargs).load()

    def loads(data: bytes, **kwargs: Any) -> Any:
        return Unpickler(io.BytesIO(data), **kwargs).load()

    module = types.ModuleType("safetorch_restricted_pickle")
    module.Unpickler = Unpickler  # type: ignore[attr-defined]  # attributes of a synthetic pickle module (ModuleType)
    module.load = load  # type: ignore[attr-defined]  # attributes of a synthetic pickle module (ModuleType)
    module.loads = loads  # type: ignore[attr-defined]  # attributes of a synthetic pickle module (ModuleType)
    module.UnpicklingError = pickle.UnpicklingError  # type: ignore[attr-defined]  # attributes of a synthetic pickle module (ModuleType)
    return module


def is_refused_global(exc: BaseException) -> bool:
    """True for the error the restricted unpickler raises on a non-allow-listed global."""
    return isinstance(exc, RefusedGlobal)


# --- bounded scan ---------------------------------------------------------------------------
class ScanResult:
    """What :func:`scan_pickle` saw: globals in order, and why it stopped."""

    __slots__ = ("globals", "complete", "refused", "torch_opcodes_only", "stopped")

    def __init__(self) -> None:
        self.globals: List[str] = []
        self.complete = False  # reached STOP of every pickle scanned
        self.refused: Optional[str] = None  # the first opcode the unpickler would refuse
        self.torch_opcodes_only = True  # no opcode torch's own weights-only unpickler lacks
        self.stopped: Optional[str] = None  # budget / deadline / truncation

    def add(self, name: str) -> None:
        if name not in self.globals and len(self.globals) < 256:
            self.globals.append(name)


_ARG_LEN = {  # fixed-size arguments
    "BININT": 4,
    "BININT1": 1,
    "BININT2": 2,
    "BINFLOAT": 8,
    "BINGET": 1,
    "LONG_BINGET": 4,
    "BINPUT": 1,
    "LONG_BINPUT": 4,
    "FRAME": 8,
    "PROTO": 1,
}
_NO_ARG = frozenset(
    "NEWOBJ REDUCE BUILD APPEND APPENDS SETITEM SETITEMS MARK TUPLE TUPLE1 TUPLE2 TUPLE3 NONE "
    "NEWFALSE NEWTRUE EMPTY_TUPLE EMPTY_LIST EMPTY_DICT EMPTY_SET BINPERSID ADDITEMS FROZENSET "
    "MEMOIZE STOP STACK_GLOBAL".split()
)
# Opcodes torch's own weights-only unpickler (torch 2.6+) supports; ours adds protocol 3-5
# conveniences (FRAME, MEMOIZE, STACK_GLOBAL, short strings, bytes, sets).
_TORCH_OPS = frozenset(
    "GLOBAL NEWOBJ REDUCE BUILD APPEND APPENDS SETITEM SETITEMS MARK TUPLE TUPLE1 TUPLE2 TUPLE3 "
    "NONE NEWFALSE NEWTRUE EMPTY_TUPLE EMPTY_LIST EMPTY_DICT EMPTY_SET BININT BININT1 BININT2 "
    "BINFLOAT BINUNICODE SHORT_BINSTRING BINPERSID BINGET LONG_BINGET BINPUT LONG_BINPUT LONG1 "
    "PROTO STOP".split()
)
_LEN_PREFIXED = {  # (length field size, struct format)
    "BINUNICODE": (4, "<I"),
    "SHORT_BINUNICODE": (1, "<B"),
    "BINUNICODE8": (8, "<Q"),
    "SHORT_BINSTRING": (1, "<B"),
    "BINSTRING": (4, "<i"),
    "SHORT_BINBYTES": (1, "<B"),
    "BINBYTES": (4, "<I"),
    "BINBYTES8": (8, "<Q"),
    "BYTEARRAY8": (8, "<Q"),
    "LONG1": (1, "<B"),
}
_STRING_OPS = frozenset({"BINUNICODE", "SHORT_BINUNICODE", "BINUNICODE8"})
_NAMES = {code: name for name, code in _op.items()}
_MEMO_STRINGS_CAP = 65536


def scan_pickle(
    stream: IO[bytes],
    result: ScanResult,
    *,
    byte_budget: int = 1 << 30,
    deadline: Optional[float] = None,
) -> bool:
    """Record the globals of one pickle in ``stream`` into ``result``, executing nothing.

    Stops at STOP (returns True), or at the first refused opcode, truncation, the byte budget
    or the deadline (returns False and says why in ``result``). Memory stays bounded: the last
    two strings pushed and up to 65,536 memoized strings are all it keeps.
    """
    read = stream.read
    readline = stream.readline
    last: List[Any] = [None, None]  # the two most recent pushes, for STACK_GLOBAL
    memo_strings: Dict[int, str] = {}
    memo_count = 0
    used = 0
    ops = 0
    names = _NAMES
    while True:
        key = read(1)
        if not key:
            result.stopped = "the pickle data is truncated"
            return False
        used += 1
        ops += 1
        if ops & 0xFFFF == 0:
            if used > byte_budget:
                result.stopped = f"the pickle is larger than {byte_budget} bytes"
                return False
            if deadline is not None and time.monotonic() > deadline:
                result.stopped = "the scan ran out of time"
                return False
        name = names.get(key[0])
        if name is None or (
            name not in _TORCH_OPS
            and name not in _NO_ARG
            and name not in _LEN_PREFIXED
            and name not in _ARG_LEN
        ):
            result.refused = _opname(key[0])
            return False
        if name not in _TORCH_OPS:
            result.torch_opcodes_only = False
        pushed: Any = None
        if name == "STOP":
            result.complete = True
            return True
        if name in _ARG_LEN:
            n = _ARG_LEN[name]
            arg = read(n)
            used += n
            if len(arg) != n:
                result.stopped = "the pickle data is truncated"
                return False
            if name in ("BINPUT", "LONG_BINPUT"):
                index = arg[0] if n == 1 else struct.unpack("<I", arg)[0]
                if isinstance(last[1], str) and len(memo_strings) < _MEMO_STRINGS_CAP:
                    memo_strings[index] = last[1]
                continue  # PUT pushes nothing
            if name in ("BINGET", "LONG_BINGET"):
                pushed = memo_strings.get(arg[0] if n == 1 else struct.unpack("<I", arg)[0])
        elif name in _LEN_PREFIXED:
            size, fmt = _LEN_PREFIXED[name]
            raw = read(size)
            if len(raw) != size:
                result.stopped = "the pickle data is truncated"
                return False
            n = struct.unpack(fmt, raw)[0]
            if n < 0:
                result.refused = f"{name} with a negative length"
                return False
            if name in _STRING_OPS and n <= 4096:
                data = read(n)
                if len(data) != n:
                    result.stopped = "the pickle data is truncated"
                    return False
                pushed = data.decode("utf-8", "surrogatepass")
            else:
                skipped = _skip(stream, n)
                if skipped != n:
                    result.stopped = "the pickle data is truncated"
                    return False
            used += size + n
        elif name == "GLOBAL":
            module = readline(4096)
            attr = readline(4096)
            used += len(module) + len(attr)
            if not module.endswith(b"\n") or not attr.endswith(b"\n"):
                result.stopped = "the pickle data is truncated"
                return False
            result.add(
                _normalize(
                    module[:-1].decode("utf-8", "replace"), attr[:-1].decode("utf-8", "replace")
                )
            )
        elif name == "STACK_GLOBAL":
            if isinstance(last[0], str) and isinstance(last[1], str):
                result.add(_normalize(last[0], last[1]))
            else:
                result.refused = "STACK_GLOBAL with a computed name"
                return False
        elif name == "MEMOIZE":
            if isinstance(last[1], str) and len(memo_strings) < _MEMO_STRINGS_CAP:
                memo_strings[memo_count] = last[1]
            memo_count += 1
            continue
        last[0], last[1] = last[1], pushed


def _skip(stream: IO[bytes], n: int) -> int:
    """Skip ``n`` bytes of ``stream`` in bounded chunks; returns how many were there."""
    done = 0
    while done < n:
        chunk = stream.read(min(n - done, 1 << 20))
        if not chunk:
            break
        done += len(chunk)
    return done


def zip_record_prefix(names: List[str]) -> str:
    """The record prefix torch's PyTorchStreamReader uses: the first entry's top directory."""
    first = names[0] if names else ""
    return first.split("/", 1)[0] if "/" in first else ""


class _SeekableView:
    """A file object with read/seek/tell (all torch.load needs) seen through the full file API
    that ``zipfile`` expects (``seekable()``)."""

    def __init__(self, f: Any) -> None:
        self._f = f
        self.read = f.read
        self.seek = f.seek
        self.tell = f.tell

    def seekable(self) -> bool:
        return True


def seekable(f: Any) -> Any:
    """``f`` itself when it has ``seekable()``, else a view that adds it (for ``zipfile``)."""
    return f if callable(getattr(f, "seekable", None)) else _SeekableView(f)


def scan_archive(
    archive: zipfile.ZipFile, *, byte_budget: int = 1 << 30, seconds: float = 30.0
) -> ScanResult:
    """Scan ``<record prefix>/data.pkl`` of an open torch.save zip archive, streamed."""
    result = ScanResult()
    try:
        names = archive.namelist()
        member = f"{zip_record_prefix(names)}/data.pkl"
        if member not in names:
            result.stopped = "the archive has no data.pkl"
            return result
        with archive.open(member) as pkl:
            scan_pickle(pkl, result, byte_budget=byte_budget, deadline=time.monotonic() + seconds)
    except Exception as exc:  # BadZipFile (CRC, headers), OSError, ...
        result.complete = False
        result.stopped = f"the zip archive is damaged ({type(exc).__name__}: {exc})"
    return result


def scan_file(source: Any, *, byte_budget: int = 1 << 30, seconds: float = 30.0) -> ScanResult:
    """Scan the pickle(s) of a ``torch.save`` file that torch itself would read.

    Zip format: only ``<record prefix>/data.pkl``, streamed (nothing else is decompressed).
    Legacy format: the magic number, protocol, system info, object and storage-key pickles.
    """
    result = ScanResult()
    deadline = time.monotonic() + seconds
    opened: Optional[IO[bytes]] = None
    if isinstance(source, (str, bytes)) or hasattr(source, "__fspath__"):
        opened = open(source, "rb")  # noqa: SIM115 - closed below
        stream: IO[bytes] = opened
    else:
        stream = source
    try:
        start = stream.tell()
        if formats.sniff(stream) == "zip":  # reads the head, restores the position
            try:
                with zipfile.ZipFile(seekable(stream)) as archive:
                    result = scan_archive(archive, byte_budget=byte_budget, seconds=seconds)
            except Exception as exc:  # BadZipFile, OSError, OverflowError (3.9), ...
                result.complete = False
                result.stopped = f"the zip archive is damaged ({type(exc).__name__}: {exc})"
        else:
            for _ in range(5):
                if not scan_pickle(stream, result, byte_budget=byte_budget, deadline=deadline):
                    break
                result.complete = False  # complete only once all five pickles ended
            else:
                result.complete = True
        stream.seek(start)
    finally:
        if opened is not None:
            opened.close()
    return result


def scan_globals(source: Any) -> Tuple[List[str], bool]:
    """Every global the pickles of a ``torch.save`` file reference, executing nothing.

    Returns:
        ``(names, complete)``: ``"module.Name"`` strings in file order without duplicates,
        and whether the scan reached the end of every pickle without a refused opcode.
    """
    result = scan_file(source)
    return list(result.globals), result.complete
