"""safetorch's restricted unpickler and its bounded global scanner.

Untrusted checkpoints are never handed to :class:`pickle.Unpickler`, not even after a scan:
plain pickle runs ``BUILD`` (``setattr`` / ``__dict__.update``) on whatever object is on its
stack, including classes and functions reached by ``GLOBAL``, which poisons the process for
every later load. :class:`RestrictedUnpickler` is a pure-Python unpickler modelled opcode by
opcode on ``torch/_weights_only_unpickler.py`` (torch >= 2.6) and never less strict than it.
Nothing here decides from a pickle which code may run: a file is loaded by this policy or
trusted whole by its hash (``safetorch trust FILE`` / ``st.trust(path)``).

==========================  ==================================================================
opcode                      rule (anything not listed is refused with :class:`RefusedOpcode`)
==========================  ==================================================================
GLOBAL, STACK_GLOBAL        only allow-listed ``module.Name`` (torch's weights-only list, the
                            caller's ``allow=``, the user's ``add_safe_globals``); never
                            ``sys``, ``os``, ``posix``, ``nt``. STACK_GLOBAL: two str operands.
REDUCE                      only on an allow-listed callable; ``bytearray`` only from bytes/str,
                            ``set``/``frozenset`` only from a list or tuple; allow= classes and
                            numpy as below.
NEWOBJ                      only on an allow-listed *class* (``cls.__new__(cls, *args)``);
                            allow= classes as below; never a numpy type.
BUILD                       only on an instance created by this load (never on anything GLOBAL
                            reached) whose type is allow-listed (an ``allow=`` string counts once
                            imported; ``numpy.dtype`` covers ``numpy.dtypes.*``), ``Tensor``,
                            ``Parameter``, ``OrderedDict``; no dunder state keys.
BINPERSID                   only torch's storage ids ``("storage", <storage type>, key,
                            location, numel[, view])``; never ``("module", ...)`` nor ints.
INST, OBJ, EXT*, PERSID,    refused (they call arbitrary classes or the copyreg registry).
NEWOBJ_EX, POP, DUP, ...
containers, scalars, memo   as pickle defines them; SETITEM(S) only into dict / OrderedDict /
                            Counter, APPEND(S) only into list, ADDITEMS only into set.
==========================  ==================================================================

``allow=`` (``st.load``, ``safetorch run --allow``, ``SAFETORCH_ALLOW``) admits *data*, never
code, decided from what each entry *is*, never from a list of bad names; anything else raises
:class:`UnsafeAllowError`. A string is checked once its module is imported (never importing it):

=================  ===========================================================================
a class            unless it has a ``__del__`` (``subprocess.Popen``) or its only constructor is
                   its own code (``functools.partial``, ``type``, ``types.FunctionType``,
                   ``io.FileIO``). NEWOBJ only when ``__new__`` is ``object``'s or a builtin data
                   type's (int float complex str bytes bytearray tuple list dict set frozenset),
                   then BUILD (its ``__setstate__`` is the user's word). REDUCE only when the call
                   runs no foreign code (metaclass ``type``, ``__new__`` and ``__init__`` from
                   ``object`` / a builtin data type) or for a data class: ``datetime.date/time/
                   datetime/timedelta/timezone``, ``decimal.Decimal``, ``fractions.Fraction``,
                   ``uuid.UUID``, pathlib's six path classes, ``collections.OrderedDict/deque/
                   Counter/defaultdict`` (factory None or an allowed class),
                   ``argparse.Namespace``, ``builtins.set/frozenset/bytearray/complex/slice/
                   range``, ``numpy.dtype``, an ``enum.Enum`` by one value through enum's own
                   metaclass. Arguments: builtin data values or data-class instances only.
a function         only a known data reconstructor: ``copyreg._reconstructor`` (an allowed
                   class; base ``object`` or a builtin data type), ``_codecs.encode``, numpy's
                   ``_reconstruct`` / ``scalar`` (``numpy[._]core.multiarray``), torch's list.
=================  ===========================================================================

numpy (whoever allowed it): no path builds an object dtype. ``numpy.dtype`` is called only as
``(str, bool, True)``, ``_reconstruct`` as ``(numpy.ndarray, <empty shape>, str)``, ``scalar``
with a checked dtype and its itemsize in bytes. Each dtype made, BUILT or used is checked from
``.kind``, ``.fields``, ``.subdtype`` (recursively) and its layout, never trusted from its flags
(a forged state says ``hasobject=0`` for ``'O'``). A dtype is BUILT once, as a fresh copy,
before anything uses it; an array once, after ``_reconstruct`` made it.

Work is bounded: at most :data:`MAX_STACK` live stack items (all MARK levels together) and
:data:`MAX_MEMO` memo entries; strings and bytes are read with explicit lengths and checked.
The bounded scanner that names *every* unsafe global in a refusal, executing nothing, walks the
same opcodes in :mod:`safetorch.checkpoint._scan`.
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
import types
from typing import IO, Any, Callable, Dict, FrozenSet, Iterable, List, Mapping, Optional, Set, Tuple

import torch

from safetorch import _compat
from safetorch.errors import CheckpointError, UnsafeAllowError

__all__: List[str] = []  # private module

MAX_STACK = 1 << 22  # live stack items, all MARK levels together (pickle batches 1000 a MARK)
MAX_MEMO = 1 << 22  # memo entries (torch.save memoizes ~5 per tensor: ~800k tensors)
_BLOCKED_MODULES = frozenset({"sys", "os", "posix", "nt"})

# Allowed by safetorch on top of torch's list: training scripts store their argparse args.
DEFAULT_EXTRA_ALLOWED: Tuple[Any, ...] = (argparse.Namespace,)

# Globals that run code or reach the OS: flagged as dangerous in refusal messages.
KNOWN_DANGEROUS = frozenset(
    "os.system posix.system nt.system os.popen os.execv os.execve subprocess.Popen "
    "subprocess.call subprocess.check_call subprocess.check_output subprocess.run builtins.eval "
    "builtins.exec builtins.compile builtins.__import__ builtins.getattr builtins.setattr "
    "builtins.open runpy._run_code importlib.import_module".split()
)


class RefusedGlobal(pickle.UnpicklingError):
    """A GLOBAL outside the allow-list (``name`` is its ``module.Name``; ``reason``, when the
    allow= rule refused an ``allow=`` string once imported, says why)."""

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
    "_rebuild_tensor _rebuild_tensor_v2 _rebuild_tensor_v3 _rebuild_parameter "
    "_rebuild_parameter_with_state _rebuild_qtensor _rebuild_sparse_tensor "
    "_rebuild_meta_tensor_no_storage _rebuild_nested_tensor _rebuild_wrapper_subclass "
    "_rebuild_device_tensor_from_cpu_tensor"
).split()
_TORCH_ALLOWED: Optional[Dict[str, Any]] = None
_TORCH_IDS: Set[int] = set()  # ids of its objects


def _fallback_allowed_globals() -> Dict[str, Any]:
    rc: Dict[str, Any] = {
        qualified_name(obj): obj  # collections.OrderedDict, torch.nn.parameter.Parameter, ...
        for obj in (collections.OrderedDict, collections.Counter, torch.nn.Parameter, torch.Size)
    }
    rc.update({qualified_name(obj): obj for obj in (torch.Tensor, torch.device, codecs.encode)})
    rc.update({qualified_name(obj): obj for obj in (bytearray, set, complex)})
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
        _TORCH_IDS.update(id(v) for v in _TORCH_ALLOWED.values())
    return _TORCH_ALLOWED


def _torch_ids() -> Set[int]:
    torch_allowed_globals()  # fills _TORCH_IDS once
    return _TORCH_IDS


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


# --- the allow= rule: data classes and known data reconstructors, never code ------------------
# Builtin data types whose __new__ / __init__ run no foreign code, and the argument types a
# constructor of an allow= class may be given (or instances of the data classes below).
_DATA_BASES: Tuple[type, ...] = (object, int, float, complex, str, bytes, bytearray, tuple)
_DATA_BASES += (list, dict, set, frozenset)
_PLAIN_ARGS = frozenset({type(None), bool, *_DATA_BASES} - {object})
# Looked up by identity in modules already imported (nothing is imported to check an object).
_DATA_CLASSES = (
    "builtins.set builtins.frozenset builtins.bytearray builtins.complex builtins.slice "
    "builtins.range argparse.Namespace uuid.UUID collections.OrderedDict collections.defaultdict "
    "collections.deque collections.Counter decimal.Decimal fractions.Fraction datetime.date "
    "datetime.time datetime.datetime datetime.timedelta datetime.timezone pathlib.PurePath "
    "pathlib.PurePosixPath pathlib.PureWindowsPath pathlib.Path pathlib.PosixPath "
    "pathlib.WindowsPath numpy.dtype"
).split()
_DATA_FUNCTIONS = (
    "copyreg._reconstructor _codecs.encode codecs.encode numpy._core.multiarray._reconstruct "
    "numpy.core.multiarray._reconstruct numpy._core.multiarray.scalar numpy.core.multiarray.scalar"
).split()


def _loaded(name: str) -> Any:
    """The object ``"pkg.mod.Name"`` names in modules already imported, or None: imports
    nothing and runs no module ``__getattr__`` (plain ``__dict__`` lookups only). numpy 2's
    ``numpy.core`` shim (a ``__getattr__``) is read as the ``numpy._core`` it forwards to."""
    if name.startswith("numpy.core.") and "numpy._core" in sys.modules:
        name = "numpy._core." + name[len("numpy.core.") :]
    parts = name.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        obj: Any = sys.modules.get(".".join(parts[:cut]))
        if isinstance(obj, types.ModuleType):
            for attr in parts[cut:]:
                obj = vars(obj).get(attr) if isinstance(obj, (types.ModuleType, type)) else None
            return obj
    return None


def _is_one_of(obj: Any, names: Iterable[str]) -> bool:
    return any(_loaded(n) is obj for n in names)


def _owner(cls: type, attr: str) -> Any:
    """The class of ``cls``'s MRO whose own ``__dict__`` defines ``attr``."""
    return next((k for k in type.__dict__["__mro__"].__get__(cls) if attr in vars(k)), None)


def _enum_class(cls: type) -> bool:
    """An Enum subclass whose metaclass call is enum's own (a lookup by value)."""
    enum = sys.modules.get("enum")
    return enum is not None and _owner(type(cls), "__call__") is enum.EnumMeta


def _class_refusal(cls: type) -> str:
    """Why the allow= rule does not admit the class ``cls`` ("" when it does)."""
    owner = _owner(cls, "__del__")
    if owner not in (None, object):
        return f"its instances run {_describe(owner)}.__del__ when destroyed"
    if _is_one_of(cls, _DATA_CLASSES) or _enum_class(cls) or id(cls) in _torch_ids():
        return ""
    np = sys.modules.get("numpy")
    if np is not None and (cls is np.ndarray or issubclass(cls, np.dtype)):  # BUILD targets
        objects = cls is type(np.dtype(object))
        return "numpy's object dtype: its arrays hold Python objects" if objects else ""
    owner = _owner(cls, "__new__")
    return "" if owner in _DATA_BASES else f"its constructor is {_describe(owner)}.__new__"


def allow_refusal(obj: Any) -> str:
    """Why ``allow=`` cannot admit ``obj`` ("" when it can): classes by what constructs them,
    other callables only when they are known data reconstructors or already allowed."""
    if isinstance(obj, type):
        return _class_refusal(obj)
    if id(obj) in _torch_ids() or _is_one_of(obj, _DATA_FUNCTIONS):
        return ""
    if any(obj is v for v in user_safe_globals().values()):
        return ""  # the user's add_safe_globals allows it already
    return f"a {type(obj).__name__}, not a class nor a known data reconstructor"


def allow_would_admit(name: str) -> bool:
    """True only when ``name`` (``module.Name``) names an object of an *already imported*
    module (nothing is imported: a file's names never run module code) that ``allow=`` admits.
    A refusal suggests ``allow=`` / ``--allow`` only for such names."""
    if not isinstance(name, str) or name.split(".", 1)[0] in _BLOCKED_MODULES:
        return False
    obj = _loaded(name)
    return obj is not None and not allow_refusal(obj)


def resolve_allowed(allow: Iterable[Any]) -> Dict[str, Any]:
    """Map each ``allow`` entry (a class/function or a ``"module.Name"`` string) to its name.

    Strings are kept unresolved (``None``): the object is imported only if a file uses it, and
    checked then (or now, when its module is imported already).

    Raises:
        UnsafeAllowError: an entry can run code (the allow= table in the module docstring).
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
            name, obj = entry, _loaded(entry)
        elif isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[1], str):
            name, obj = entry[1], entry[0]  # torch's (obj, "module.Name") form
        elif callable(entry):
            name, obj = qualified_name(entry), entry
        else:
            raise TypeError(
                f"allow entry {entry!r} must be a class, a function or a 'module.Name' string"
            )
        why = allow_refusal(obj) if obj is not None else ""
        if why:
            raise UnsafeAllowError(name, why)
        out[name] = None if isinstance(entry, str) else obj
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
    """The globals one load may resolve: torch's list, the user's safe globals and ``extra``
    (whose classes, and whose strings once imported, follow the allow= rule).

    Built per call, so an ``allow=`` never outlives its call nor reaches another thread.
    """

    def __init__(self, extra: Mapping[str, Any]) -> None:
        self.names: Dict[str, Any] = {**torch_allowed_globals(), **user_safe_globals()}
        self._base_ids = frozenset(id(v) for v in self.names.values())
        self._pending: Dict[str, Any] = {}
        for name, obj in extra.items():
            if obj is None:
                self._pending[name] = None
            else:
                self.names[name] = obj
        self.values_ids: FrozenSet[int] = frozenset(id(v) for v in self.names.values())

    def allows(self, full: str) -> bool:
        if full.split(".", 1)[0] in _BLOCKED_MODULES:
            return False
        return full in self.names or full in self._pending

    def resolve(self, full: str) -> Any:
        if not self.allows(full):
            raise RefusedGlobal(full)
        if full in self.names:
            return self.names[full]
        obj = import_global(full)  # an allow= string: import it on first use, then check it
        why = allow_refusal(obj)
        if why:
            raise RefusedGlobal(full, f"allow= names it, but it can run code: {why}")
        self.names[full] = obj
        self.values_ids = self.values_ids | {id(obj)}
        return obj

    def is_extra(self, obj: Any) -> bool:
        """``obj`` is allowed by ``extra`` only (not by torch's list nor add_safe_globals)."""
        return id(obj) not in self._base_ids

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


def _own_name(obj: Any) -> Optional[str]:
    """``"module.Qualname"`` of a class or function (None for other objects)."""
    if not isinstance(obj, type) and not callable(obj):
        return None
    module = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None)
    if isinstance(module, str) and isinstance(qualname, str):
        return f"{module}.{qualname}"
    return None


def unsafe_globals(names: Iterable[str], extra: Mapping[str, Any]) -> List[str]:
    """The subset of ``names`` that neither torch's list, the user's safe globals nor ``extra``
    allow (torch maps ``torch.<X>Storage`` names to storage types before any list is read)."""
    policy = Policy(extra)
    return [
        n
        for n in names
        if not policy.allows(n) and not (n.startswith("torch.") and n.endswith("Storage"))
    ]


def ours_is_stricter(name: str) -> bool:
    """Globals whose use this unpickler checks differently from torch's, so a file naming one
    must not be deferred to torch's unpickler: ``bytearray`` (REDUCE never from an int, which
    allocates), numpy's (no object dtype by any path; and an allowed ``numpy.dtype`` covers the
    ``numpy.dtypes.*`` instance it returns, where torch also needs that class listed)."""
    return name == "builtins.bytearray" or name.split(".", 1)[0] == "numpy"


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
_EMPTY = {_op[f"EMPTY_{t.__name__.upper()}"]: t for t in (dict, list, tuple, set)}
_TUPLE_N = {_op["TUPLE1"]: 1, _op["TUPLE2"]: 2, _op["TUPLE3"]: 3}
_CONSTANTS = {_op["NONE"]: None, _op["NEWTRUE"]: True, _op["NEWFALSE"]: False}
_NUMBERS = {_op[k]: (struct.calcsize(f), f) for k, f in (("BININT", "<i"), ("BININT1", "<B"))}
_NUMBERS.update(
    {_op[k]: (struct.calcsize(f), f) for k, f in (("BININT2", "<H"), ("BINFLOAT", ">d"))}
)


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

    def __init__(self, file: IO[bytes], *, encoding: str = "ASCII", **kwargs: Any) -> None:
        self.read, self.readline = file.read, file.readline
        self.encoding, self.errors = encoding, kwargs.get("errors", "strict")  # fix_imports: on
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
        numpy = _NumpyGuard()
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
            elif c in _LEN_CODES:  # strings, bytes, LONG1: a length, then that many bytes
                kind, size, fmt = _LEN_CODES[c]
                n = _unpack(fmt, read(size))[0]
                if n < 0:
                    raise pickle.UnpicklingError("BINSTRING pickle has negative byte count")
                data = read(n)
                if kind == "BINUNICODE":
                    stack.append(str(data, "utf-8", "surrogatepass"))
                elif kind == "BINSTRING":
                    stack.append(self._string(data))
                else:
                    stack.append(_LEN_VALUE[kind](data))
            elif c == op["GLOBAL"] or c == op["STACK_GLOBAL"]:
                if c == op["GLOBAL"]:
                    module = self.readline()[:-1].decode("utf-8")
                    name = self.readline()[:-1].decode("utf-8")
                else:
                    name, module = stack.pop(), stack.pop()
                obj = self.find_class(module, name)
                created_globals.add(id(obj))
                stack.append(obj)
            elif c == op["BINPERSID"]:
                pid = stack.pop()
                check_persistent_id(pid)
                stack.append(self.persistent_load(pid))
            elif c == op["REDUCE"]:
                args = stack.pop()
                func = stack[-1]
                if type(args) is not tuple or not policy.is_allowed_object(func):
                    raise RefusedOpcode(f"REDUCE on {_describe(func)} is not allowed")
                _check_reduce_args(func, args, policy)
                np = sys.modules.get("numpy")
                stack[-1] = func(*args) if np is None else numpy.call(np, func, args)
            elif c == op["NEWOBJ"]:
                args = stack.pop()
                cls = stack.pop()
                if type(args) is not tuple or not isinstance(cls, type):
                    raise RefusedOpcode(f"NEWOBJ on {_describe(cls)} is not allowed")
                if cls is torch.nn.Parameter:
                    stack.append(torch.nn.Parameter(*args))
                elif policy.is_allowed_object(cls):
                    np = sys.modules.get("numpy")
                    if np is not None and issubclass(cls, (np.dtype, np.ndarray, np.generic)):
                        raise RefusedOpcode(f"NEWOBJ on numpy's {_describe(cls)} is refused")
                    if policy.is_extra(cls):
                        _check_construction(cls, args, policy, "NEWOBJ")
                    stack.append(cls.__new__(cls, *args))
                else:
                    raise RefusedOpcode(f"NEWOBJ on {_describe(cls)} is not allowed")
            elif c == op["BUILD"]:
                state = stack.pop()
                inst = stack[-1]
                _build(inst, state, policy, created_globals, numpy)
            elif c in _EMPTY:
                stack.append(_EMPTY[c]())
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
            elif c in _TUPLE_N:
                n = _TUPLE_N[c]
                stack[-n:] = [tuple(stack[-n:])]
            elif c in _CONSTANTS:
                stack.append(_CONSTANTS[c])
            elif c in _NUMBERS:
                size, fmt = _NUMBERS[c]
                stack.append(_unpack(fmt, read(size))[0])
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


def _opname(code: int) -> str:
    name = _NAMES.get(code)
    return f"{name} ({bytes([code])!r})" if name else repr(bytes([code]))


def _describe(obj: Any) -> str:
    if isinstance(obj, type) or callable(obj):
        name = getattr(obj, "__qualname__", None) or type(obj).__name__
        return f"{getattr(obj, '__module__', '?')}.{name}"
    return f"a {type(obj).__name__}"


def _check_reduce_args(func: Any, args: Tuple[Any, ...], policy: Policy) -> None:
    if func is bytearray:
        if args and not isinstance(args[0], (bytes, bytearray, str)):
            raise RefusedOpcode("REDUCE bytearray(...) only from bytes or str")
    elif func is set or func is frozenset:
        if args and type(args[0]) not in (list, tuple):
            raise RefusedOpcode("REDUCE set(...) only from a list or tuple")
    elif isinstance(func, type) and policy.is_extra(func):
        _check_construction(func, args, policy, "REDUCE")
    elif policy.is_extra(func) and _is_one_of(func, ("copyreg._reconstructor",)):
        cls, base, state = args if len(args) == 3 else (None, object, None)
        if not (isinstance(cls, type) and policy.is_allowed_object(cls) and base in _DATA_BASES):
            raise RefusedOpcode("REDUCE copyreg._reconstructor only of an allowed class")
        if base is not object and not (issubclass(cls, base) and type(state) in _PLAIN_ARGS):
            raise RefusedOpcode("REDUCE copyreg._reconstructor with a bad base or state")
        _check_construction(cls, (), policy, "NEWOBJ")  # object.__new__(cls) or base's


def _check_construction(cls: type, args: Tuple[Any, ...], policy: Policy, how: str) -> None:
    """REDUCE ``cls(*args)`` / NEWOBJ ``cls.__new__(cls, *args)`` of a class only ``extra``
    allows: only when it runs no foreign code (the allow= table in the module docstring)."""
    why = _class_refusal(cls)
    data_class = _is_one_of(cls, _DATA_CLASSES)
    new = _owner(cls, "__new__")
    if why or data_class or (how == "NEWOBJ" and new in _DATA_BASES):
        pass
    elif how == "NEWOBJ":
        why = f"its __new__ is {_describe(new)}'s own code"
    elif _enum_class(cls):
        why = "" if len(args) == 1 else "an Enum is called with its value only"
    elif _owner(type(cls), "__call__") is not type:
        why = f"its metaclass {_describe(type(cls))} has its own __call__"
    elif new not in _DATA_BASES or _owner(cls, "__init__") not in _DATA_BASES:
        why = f"calling it runs {_describe(_owner(cls, '__init__'))}.__init__ / __new__ code"
    if data_class and cls is collections.defaultdict and args:
        factory, args = args[0], args[1:]
        if factory is not None and not (
            isinstance(factory, type) and policy.is_allowed_object(factory)
        ):
            why = "a defaultdict's factory must be None or an allowed class"
    plain = all(type(a) in _PLAIN_ARGS or _is_one_of(type(a), _DATA_CLASSES) for a in args)
    if why or not plain:
        raise RefusedOpcode(
            f"{how} on {_describe(cls)} refused: {why or 'its arguments must be builtin data'}; "
            "allow= admits data only, a file that needs more needs full trust (`safetorch "
            "trust FILE` / st.trust(path))"
        )


# --- numpy: no path builds an object dtype ---------------------------------------------------
_NPY_DATA_FLAGS = 0x08 | 0x10 | 0x80  # NEEDS_INIT, NEEDS_PYAPI, ALIGNED_STRUCT: no object bits


def _dtype_problem(np: Any, d: Any, depth: int = 0) -> str:
    """Why dtype ``d`` is refused ("" if not), from its kind, fields and subarray (recursively)
    and its layout, never from its flags alone (a forged state can say ``hasobject=0``)."""
    if not isinstance(d, np.dtype) or depth > 32:
        return f"a {type(d).__name__} where a numpy dtype (nested at most 32 deep) belongs"
    if d.kind == "O" or d.hasobject or d.flags & ~_NPY_DATA_FLAGS:
        return f"a numpy {d.kind!r} dtype (flags {d.flags:#x}): object dtypes are refused"
    if d.kind == "U" and d.itemsize % 4:
        return f"a numpy unicode dtype of {d.itemsize} bytes"
    if d.subdtype is not None:
        base, shape = d.subdtype
        count = 1
        for n in shape:
            count *= n if type(n) is int and n >= 0 else -1
        if count < 0 or base.itemsize * count != d.itemsize:
            return "a numpy subarray dtype whose size disagrees with its base and shape"
        return _dtype_problem(np, base, depth + 1)
    fields, names = d.fields, d.names
    if (fields is None) != (names is None) or any(n not in fields for n in names or ()):
        return "a numpy structured dtype whose names disagree with its fields"
    for value in (fields or {}).values():
        why = _dtype_problem(np, value[0], depth + 1)
        if why or not 0 <= value[1] <= d.itemsize - value[0].itemsize:
            return why or "a numpy structured dtype with a field outside its item"
    return ""


def _short(text: Any) -> bool:
    return type(text) in (str, bytes) and len(text) <= 64


class _NumpyGuard:
    """One load's numpy objects: ``fresh`` (a ``numpy.dtype(..., True)`` copy or an array
    ``_reconstruct`` made: BUILT at most once) and ``used`` (dtypes an array, scalar or dtype
    holds: never BUILT). Both keep their objects alive, so ids stay unique."""

    def __init__(self) -> None:
        self.fresh: Dict[int, Any] = {}
        self.used: Dict[int, Any] = {}

    def use(self, np: Any, d: Any, keep: bool = True) -> None:
        why = _dtype_problem(np, d)
        if why:
            raise RefusedOpcode(f"numpy refused: {why}")
        if keep:
            self.used[id(d)] = d

    def call(self, np: Any, func: Any, args: Tuple[Any, ...]) -> Any:
        """``func(*args)`` where numpy is imported: numpy's callables only as numpy pickles."""
        mod = sys.modules.get("numpy._core.multiarray") or sys.modules.get("numpy.core.multiarray")
        rebuild, a = getattr(mod, "_reconstruct", None), (*args, None, None, None)
        if func is np.dtype:
            ok = len(args) == 3 and _short(a[0]) and type(a[1]) is bool and a[2] is True
            form = "" if ok else "(str, bool, True)"
        elif isinstance(func, type) and issubclass(func, (np.dtype, np.ndarray, np.generic)):
            form = "numpy.dtype, _reconstruct or scalar, never the class"
        elif func is rebuild and rebuild is not None:
            shape = a[1] if type(a[1]) is tuple and all(type(x) is int for x in a[1]) else (-1,)
            ok = len(args) == 3 and a[0] is np.ndarray and min(shape, default=0) == 0
            form = "" if ok and _short(a[2]) else "(numpy.ndarray, <an empty shape>, str)"
        elif func is getattr(mod, "scalar", None) and func is not None:
            ok = len(args) == 2 and isinstance(a[0], np.dtype) and type(a[1]) is bytes
            form = "" if ok and len(a[1]) == a[0].itemsize else "(a dtype, its itemsize in bytes)"
        else:
            form = ""
        if form:
            raise RefusedOpcode(f"REDUCE {_describe(func)}(...) only as numpy pickles it: {form}")
        for arg in args:
            if isinstance(arg, np.dtype):
                self.use(np, arg)
        result = func(*args)
        if isinstance(result, (np.dtype, np.ndarray, np.generic)):
            self.use(np, getattr(result, "dtype", result), not isinstance(result, np.dtype))
            if func is np.dtype or func is rebuild:
                self.fresh[id(result)] = result
        return result

    def build(self, np: Any, inst: Any, state: Any) -> None:
        """BUILD on a numpy dtype or array: numpy's own ``__setstate__``, once, checked."""
        if id(inst) not in self.fresh or id(inst) in self.used or type(state) is not tuple:
            raise RefusedOpcode(
                f"BUILD on {_describe(inst)} refused: a numpy object is built once, with a "
                "tuple state, right after numpy.dtype(..., True) / _reconstruct made it"
            )
        if isinstance(inst, np.dtype):
            if len(state) not in (8, 9) or type(state[7]) is not int or state[7] & ~_NPY_DATA_FLAGS:
                raise RefusedOpcode(
                    "BUILD on a numpy dtype only with numpy's state, no object flags"
                )
            sub, fields = state[2], state[4]
            for d in [sub[0]] if type(sub) is tuple and sub else []:
                self.use(np, d)
            for value in fields.values() if type(fields) is dict else ():
                self.use(np, value[0] if type(value) is tuple and value else value)
        elif len(state) not in (4, 5) or type(state[-1]) not in (bytes, bytearray):
            raise RefusedOpcode("BUILD on a numpy array only with numpy's state and bytes")
        else:
            self.use(np, state[-3])
        del self.fresh[id(inst)]
        inst.__setstate__(state)
        self.use(np, inst if isinstance(inst, np.dtype) else inst.dtype)


def _build(inst: Any, state: Any, policy: Policy, created_globals: set, numpy: _NumpyGuard) -> None:
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
    elif not (policy.is_allowed_object(kind) or _numpy_dtype_allowed(kind, policy)):
        hint = ""
        if isinstance(kind, type) and allow_would_admit(_own_name(kind) or ""):
            hint = f"; allow {_own_name(kind)} if you trust it"
        raise RefusedOpcode(f"BUILD on {_describe(inst)} is not allowed{hint}")
    elif _numpy_object(inst):
        np = sys.modules["numpy"]
        if not isinstance(inst, (np.dtype, np.ndarray)):
            raise RefusedOpcode(f"BUILD on {_describe(inst)} is refused")
        numpy.build(np, inst, state)
    else:
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


def _numpy_object(obj: Any) -> bool:
    np = sys.modules.get("numpy")
    return np is not None and isinstance(obj, (np.dtype, np.ndarray, np.generic))


def _numpy_dtype_allowed(kind: Any, policy: Policy) -> bool:
    """BUILD on a ``numpy.dtypes.Float64DType`` (what ``numpy.dtype(...)`` returns; before
    numpy 1.25 the same class is ``numpy.dtype[float64]`` of module ``numpy``) where
    ``numpy.dtype`` itself is allowed: the names a refusal lists are enough for an array
    (torch's safe_globals also needs ``type(np.dtype(np.float64))``)."""
    np = sys.modules.get("numpy")
    return (
        np is not None
        and isinstance(kind, type)
        and kind.__module__ in ("numpy.dtypes", "numpy")
        and issubclass(kind, np.dtype)
        and policy.is_allowed_object(np.dtype)
    )


def make_restricted_pickle_module(extra: Mapping[str, Any]) -> types.ModuleType:
    """A ``pickle_module`` for torch's readers whose ``Unpickler`` is :class:`RestrictedUnpickler`
    with a per-call :class:`Policy` (torch's list + the user's safe globals + ``extra``)."""
    policy = Policy(extra)

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


# --- opcode tables the scanner (checkpoint/_scan.py) shares -----------------------------
_LEN_PREFIXED = {  # (length field size, struct format)
    op: (struct.calcsize(fmt), fmt)
    for op, fmt in (
        x.split("=")
        for x in "BINUNICODE=<I SHORT_BINUNICODE=<B BINUNICODE8=<Q SHORT_BINSTRING=<B "
        "BINSTRING=<i SHORT_BINBYTES=<B BINBYTES=<I BINBYTES8=<Q BYTEARRAY8=<Q LONG1=<B".split()
    )
}
# The unpickler's view: code -> (kind: BINUNICODE, BINSTRING, BINBYTES, BYTEARRAY, LONG1, size, fmt)
_LEN_CODES = {
    _op[k]: (k.replace("SHORT_", "").replace("8", ""), size, fmt)
    for k, (size, fmt) in _LEN_PREFIXED.items()
}
_LEN_VALUE: Dict[str, Callable[[bytes], Any]] = {
    "BINBYTES": bytes,
    "BYTEARRAY": bytearray,
    "LONG1": pickle.decode_long,
}
_NAMES = {code: name for name, code in _op.items()}
