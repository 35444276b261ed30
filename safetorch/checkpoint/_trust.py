"""The project trust rule: whole-model pickles of a project's own ``nn.Module`` s.

``torch.save(model)`` pickles the model's classes by name (``model.RNNModel``,
``torch.nn.modules.rnn.LSTM``) and ``torch.save(array)`` numpy's rebuild functions; a
weights-only load refuses them all. ``st.load(f, trust_root=DIR)`` (and ``safetorch run``, for
the script's directory) admits exactly these, on top of everything the weights-only policy
already allows, and nothing else:

==========================  ==================================================================
global                      admitted when
==========================  ==================================================================
``M.N`` (a project class)   ``N`` is a class whose canonical name is ``M.N`` (no re-exports),
                            a subclass of ``torch.nn.Module``, and module ``M``'s file lies
                            inside ``DIR`` (real paths; never below a ``site-packages`` or
                            ``dist-packages`` directory nor inside a Python installation that
                            sits in ``DIR``). ``M`` is used as already imported (``__main__``
                            included); otherwise it is imported only if ``importlib`` finds it
                            as a ``.py`` file inside ``DIR`` (each parent package too) *and*
                            that file defines ``class N`` at top level (read with ``ast``,
                            before anything runs). Nested classes are not admitted.
``torch.nn.*.N``            ``N`` is an ``nn.Module`` subclass defined in torch's own
                            ``torch.nn`` package files (``Linear``, ``LSTM``, ``DataParallel``).
either of the above         only if every special method that unpickling or dropping the
                            object can run (``__new__``, ``__setstate__``, ``__setattr__``,
                            ``__getattr__``, ``__getattribute__``, ``__delattr__``,
                            ``__hash__``, ``__eq__``, ``__del__``) is ``object``'s, defined in
                            ``torch.nn.modules`` or defined inside ``DIR``.
``torch.nn.functional.N``,  as a plain value only (``TransformerEncoderLayer.activation``):
``torch._C._nn.N``          a function ``torch.nn.functional`` defines or exports as ``N``.
numpy                       ``numpy[._]core.multiarray._reconstruct`` and ``.scalar``,
                            ``numpy.dtype`` (called), ``numpy.ndarray`` (as a value).
==========================  ==================================================================

How admitted globals may be used (the unpickler enforces it): a project or ``torch.nn`` class
only through ``NEWOBJ`` with no arguments (``cls.__new__(cls)``, never ``__init__``) and a
``BUILD`` whose state is a dict of non-dunder string keys (applied by the class's
``__setstate__``, else ``__dict__.update``); calling one (``REDUCE``) is refused. numpy's
functions are called only in the forms numpy writes: ``_reconstruct(numpy.ndarray, (0,),
b"b")`` (an empty array; BUILD fills it from the file's bytes), ``numpy.dtype(str, bool,
True)`` (a fresh copy, never the shared singleton) and ``scalar(dtype, bytes)``, and an array
or dtype is built only from numpy's own state tuple, never with an object dtype (an object
array could hold anything). Every other opcode rule is the
weights-only policy's, so a callable outside this set is refused wherever it appears (a
module's ``_forward_hooks`` included). Admitted classes and functions may also appear as plain
values (``self._norm_layer = nn.BatchNorm2d``), as with torch's ``safe_globals``.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import importlib.machinery
import importlib.util
import os
import sys
import threading
import types
from typing import Any, Dict, Iterator, List, NamedTuple, Optional, Sequence, Tuple

import torch

__all__: List[str] = []  # private module

CLASS = "class"  # NEWOBJ (no arguments) then BUILD
CALL = "call"  # REDUCE, with arguments checked by check_call
VALUE = "value"  # a plain value: never called, never built

# Special methods that NEWOBJ, BUILD, dict/set insertion or garbage collection can run.
_SPECIAL = (
    "__new__",
    "__setstate__",
    "__setattr__",
    "__getattr__",
    "__getattribute__",
    "__delattr__",
    "__hash__",
    "__eq__",
    "__del__",
)
_INSTALLED = frozenset({"site-packages", "dist-packages"})
_MAX_SOURCE = 8 << 20  # a project module larger than this is not parsed (nor imported)
_TORCH_DIR = os.path.dirname(os.path.realpath(torch.__file__)) + os.sep


class Decision(NamedTuple):
    """What the rule says about one global: the object and its role, or why not."""

    obj: Any
    role: Optional[str]  # CLASS / CALL / VALUE; None when refused
    reason: str  # why it was refused ("" when admitted)


_local = threading.local()


@contextlib.contextmanager
def recording() -> Iterator[List[str]]:
    """Collect, in this thread, the names the rule admits inside the block (for reports)."""
    seen: List[str] = []
    previous = getattr(_local, "seen", None)
    _local.seen = seen
    try:
        yield seen
    finally:
        _local.seen = previous


def _record(name: str) -> None:
    seen = getattr(_local, "seen", None)
    if seen is not None and name not in seen:
        seen.append(name)


def _real(path: str) -> str:
    return os.path.realpath(os.path.abspath(path))


def _within(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip(os.sep) + os.sep)


def _module_file(module: types.ModuleType) -> Optional[str]:
    path = getattr(module, "__file__", None)
    return _real(path) if isinstance(path, str) else None


def _torch_nn_file(module_name: str) -> bool:
    """``module_name`` is one of torch's own ``torch.nn`` modules (its file, not its name)."""
    if not module_name.startswith("torch.nn."):
        return False
    module = sys.modules.get(module_name)
    path = _module_file(module) if module is not None else None
    return path is not None and path.startswith(_TORCH_DIR)


def _numpy_objects() -> Dict[str, Tuple[Any, str]]:
    """numpy's rebuild globals under both spellings (numpy 1: ``numpy.core``, 2: ``numpy._core``),
    taken from what numpy's own ``__reduce__`` returns (no deprecated shim is imported)."""
    import numpy as np

    reconstruct = np.ndarray.__reduce__(np.zeros(0))[0]
    scalar = np.float64(0).__reduce__()[0]
    out: Dict[str, Tuple[Any, str]] = {
        "numpy.dtype": (np.dtype, CALL),
        "numpy.ndarray": (np.ndarray, VALUE),
    }
    for package in ("numpy.core", "numpy._core"):
        out[f"{package}.multiarray._reconstruct"] = (reconstruct, CALL)
        out[f"{package}.multiarray.scalar"] = (scalar, CALL)
    return out


class ProjectTrust:
    """The trust rule for one root directory (see the module docstring for the boundary).

    Args:
        root: the directory whose own ``nn.Module`` classes may be rebuilt.

    Raises:
        TypeError: ``root`` is not a path.
        ValueError: ``root`` is not an existing directory, or is a filesystem root.
    """

    def __init__(self, root: Any) -> None:
        if isinstance(root, bytes) or not isinstance(root, (str, os.PathLike)):
            raise TypeError(
                f"trust_root must be a directory path (str or os.PathLike), got "
                f"{type(root).__name__} {root!r:.80}"
            )
        real = _real(os.fspath(root))
        if not os.path.isdir(real):
            raise ValueError(
                f"trust_root {os.fspath(root)!r} is not an existing directory; pass the "
                "directory that holds your model's source files (e.g. the script's directory)"
            )
        if os.path.dirname(real) == real:
            raise ValueError(
                f"trust_root {real!r} is a filesystem root; pass your project's directory"
            )
        self.root = real
        # Pythons that live inside the root (a .venv in the repository) are not the project.
        prefixes = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
        self._excluded: Tuple[str, ...] = tuple(
            p for p in {_real(x) for x in prefixes} if _within(p, real) and p != real
        )
        self._decisions: Dict[str, Decision] = {}
        self._numpy: Optional[Dict[str, Tuple[Any, str]]] = None

    def __repr__(self) -> str:
        return f"ProjectTrust({self.root!r})"

    # --- where a file lies -----------------------------------------------------------------
    def _outside(self, path: Optional[str]) -> Optional[str]:
        """Why ``path`` (a real path) is not a project file; None when it is one."""
        if path is None:
            return "it has no source file"
        if not _within(path, self.root):
            return f"its file {path} is outside the trusted root {self.root}"
        parts = os.path.relpath(path, self.root).split(os.sep)
        if _INSTALLED & set(parts[:-1]) or any(_within(path, p) for p in self._excluded):
            return f"its file {path} belongs to an installed package, not to the project"
        return None

    def _class_home(self, cls: type) -> Optional[str]:
        """Why ``cls`` is neither a project class nor torch.nn's; None when it is one."""
        module = sys.modules.get(getattr(cls, "__module__", "") or "")
        if module is None:
            return f"its module {cls.__module__!r} is not imported"
        return self._outside(_module_file(module))

    def _owner_ok(self, owner: type) -> bool:
        if owner is object:
            return True
        module = getattr(owner, "__module__", "") or ""
        if module.startswith("torch.nn.modules.") or owner is torch.nn.Module:
            return _torch_nn_file(module)
        return self._class_home(owner) is None

    def _special_methods_ok(self, cls: type) -> Optional[str]:
        for attr in _SPECIAL:
            owner = next((k for k in cls.__mro__ if attr in vars(k)), object)
            if not self._owner_ok(owner):
                return (
                    f"it inherits {attr} from {owner.__module__}.{owner.__qualname__}, which is "
                    "neither torch.nn's nor the project's"
                )
        return None

    def _module_outside(self, module: types.ModuleType) -> Optional[str]:
        path = _module_file(module)
        if path is None and getattr(module, "__path__", None) is not None:
            # a namespace package: every directory it spans must be the project's
            return next((w for w in map(self._outside, map(_real, module.__path__)) if w), None)
        return self._outside(path)

    # --- finding and importing a project module --------------------------------------------
    def _spec_file(self, name: str) -> Tuple[Optional[Any], str]:
        """The spec of a not yet imported module ``name`` when it is a project source file."""
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError) as exc:
            return None, f"module {name!r} cannot be found ({exc})"
        if spec is None:
            return None, f"no module named {name!r} is importable"
        if spec.origin is None or not isinstance(spec.loader, importlib.machinery.SourceFileLoader):
            locations = list(spec.submodule_search_locations or ())
            if spec.origin is None and locations:  # a namespace package: nothing to execute
                bad = [why for why in (self._outside(_real(p)) for p in locations) if why]
                return (None, f"package {name!r}: {bad[0]}") if bad else (spec, "")
            return None, f"module {name!r} is not a Python source file of the project"
        why = self._outside(_real(spec.origin))
        return (None, f"module {name!r}: {why}") if why else (spec, "")

    def _import_project_module(self, name: str, attr: str) -> Tuple[Optional[Any], str]:
        """``sys.modules[name]``, importing it (and its parents) only from project files, and
        only if its source defines ``class attr`` at top level."""
        parts = name.split(".")
        for i in range(1, len(parts) + 1):
            prefix = ".".join(parts[:i])
            module = sys.modules.get(prefix)
            if module is None:
                spec, why = self._spec_file(prefix)
                if spec is None:
                    return None, why
                if i == len(parts) and not _defines_class(spec.origin, attr):
                    return None, (
                        f"{spec.origin} does not define class {attr} at top level (it is not "
                        "imported)"
                    )
                try:
                    module = importlib.import_module(prefix)
                except Exception as exc:
                    return None, f"importing {prefix!r} raised {type(exc).__name__}: {exc}"
            outside = self._module_outside(module)
            if outside:
                return None, f"module {prefix!r}: {outside}"
        return sys.modules.get(name), ""

    # --- the decision ----------------------------------------------------------------------
    def decide(self, full: str) -> Decision:
        """Admit or refuse the global ``"module.Name"`` (cached per instance)."""
        found = self._decisions.get(full)
        if found is None:
            try:
                found = self._decide(full)
            except Exception as exc:  # a project module whose attributes raise, ...
                found = Decision(None, None, f"checking it raised {type(exc).__name__}: {exc}")
            self._decisions[full] = found
        if found.role is not None:
            _record(full)
        return found

    def _decide(self, full: str) -> Decision:
        module_name, _, attr = full.rpartition(".")
        if not module_name or not attr.isidentifier():
            return Decision(None, None, "it is not a 'module.Name' global")
        if module_name == "numpy" or module_name.startswith("numpy."):
            return self._decide_numpy(full)
        if module_name in ("torch.nn.functional", "torch._C._nn"):
            return _decide_functional(module_name, attr)
        if module_name.startswith("torch.nn."):
            module = sys.modules.get(module_name)
            if module is None:
                try:
                    module = importlib.import_module(module_name)
                except Exception as exc:
                    return Decision(None, None, f"importing it raised {type(exc).__name__}")
            if not _torch_nn_file(module_name):
                return Decision(None, None, "its module is not one of torch's own files")
        elif module_name == "__main__":
            module = sys.modules.get("__main__")
            why = self._outside(_module_file(module) if module is not None else None)
            if why:
                return Decision(None, None, f"__main__: {why}")
        else:
            module, why = self._import_project_module(module_name, attr)
            if module is None:
                return Decision(None, None, why)
        obj = getattr(module, attr, None)
        if not isinstance(obj, type) or not issubclass(obj, torch.nn.Module):
            return Decision(
                None,
                None,
                "it is not an nn.Module class (the trust rule admits only the project's and "
                "torch.nn's modules, torch.nn.functional functions as values and numpy arrays)",
            )
        if f"{obj.__module__}.{obj.__qualname__}" != full:
            return Decision(
                None, None, f"it names {obj.__module__}.{obj.__qualname__} (not its own name)"
            )
        if not module_name.startswith("torch.nn."):
            why = self._class_home(obj)
            if why:
                return Decision(None, None, why)
        why = self._special_methods_ok(obj)
        if why:
            return Decision(None, None, why)
        return Decision(obj, CLASS, "")

    def _decide_numpy(self, full: str) -> Decision:
        if self._numpy is None:
            try:
                self._numpy = _numpy_objects()
            except ImportError:
                return Decision(None, None, "numpy is not installed")
        entry = self._numpy.get(full)
        if entry is None:
            return Decision(
                None, None, "the trust rule admits only numpy's array and dtype rebuild globals"
            )
        return Decision(entry[0], entry[1], "")

    # --- how admitted objects are used ------------------------------------------------------
    def check_call(self, func: Any, args: Tuple[Any, ...]) -> Optional[str]:
        """Why the REDUCE ``func(*args)`` of an admitted numpy function is refused, or None."""
        import numpy as np

        if self._numpy is None:  # not reached: check_call follows an admitted numpy global
            return "numpy is not loaded"
        if func is np.dtype:
            if not (
                len(args) == 3
                and type(args[0]) is str
                and type(args[1]) is bool
                and args[2] is True
            ):
                return "numpy.dtype(...) only as numpy pickles it: (str, bool, True)"
            return None
        if func is self._numpy["numpy._core.multiarray._reconstruct"][0]:
            # numpy writes _reconstruct(type, (0,), b"b"): an empty array that BUILD fills from
            # the file's bytes (numpy checks their size), so nothing is allocated ahead of them.
            if not (
                len(args) == 3
                and args[0] is np.ndarray
                and type(args[1]) is tuple
                and args[1] == (0,)
                and type(args[1][0]) is int
                and args[2] == b"b"
                and type(args[2]) is bytes
            ):
                return (
                    "numpy _reconstruct(...) only as numpy pickles it: (numpy.ndarray, (0,), b'b')"
                )
            return None
        if not (
            len(args) == 2
            and isinstance(args[0], np.dtype)
            and not args[0].hasobject
            and type(args[1]) is bytes
        ):
            return "numpy scalar(...) only from a dtype without objects and bytes"
        return None

    def check_build(self, inst: Any, state: Any) -> Optional[str]:
        """Why BUILD of ``state`` on a numpy array or dtype is refused, or None (numpy's own
        ``__setstate__`` then applies it)."""
        import numpy as np

        if type(inst) is np.ndarray:
            if not (
                type(state) is tuple
                and len(state) == 5
                and type(state[0]) is int
                and type(state[1]) is tuple
                and isinstance(state[2], np.dtype)
                and type(state[3]) is bool
                and type(state[4]) is bytes
            ):
                return (
                    "BUILD on a numpy array only with numpy's state (version, shape, dtype, "
                    "fortran, bytes)"
                )
            if state[2].hasobject:
                return "BUILD on a numpy array of an object dtype (it could hold anything)"
            return None
        if not _numpy_dtype_state_ok(np, state):
            return (
                "BUILD on a numpy dtype only with numpy's state (version, byte order, subarray, "
                "names, fields, size, alignment, flags[, metadata])"
            )
        return None


def _numpy_dtype_state_ok(np: Any, state: Any) -> bool:
    """``state`` has the shape ``numpy.dtype.__reduce__`` writes (numpy's C ``__setstate__`` is
    then given only what numpy itself produces)."""
    if type(state) is not tuple or len(state) not in (8, 9):
        return False
    version, order, subarray, names, fields, size, alignment, flags = state[:8]
    if type(version) is not int or order not in ("<", ">", "|", "="):
        return False
    if not all(type(v) is int for v in (size, alignment, flags)):
        return False
    if subarray is not None and not (
        type(subarray) is tuple
        and len(subarray) == 2
        and isinstance(subarray[0], np.dtype)
        and type(subarray[1]) is tuple
        and all(type(n) is int for n in subarray[1])
    ):
        return False
    if (names is None) != (fields is None):
        return False
    if names is not None:
        # fields also holds each field's title as a key (numpy's titled fields)
        if type(names) is not tuple or type(fields) is not dict or not set(names) <= set(fields):
            return False
        for name, field in fields.items():
            if type(name) is not str or type(field) is not tuple or len(field) not in (2, 3):
                return False
            if not isinstance(field[0], np.dtype) or type(field[1]) is not int:
                return False
    if len(state) == 8 or state[8] is None or type(state[8]) is dict:
        return True
    extra = state[8]  # datetime dtypes: (metadata, (unit, count, 1, 1))
    return (
        type(extra) is tuple
        and len(extra) == 2
        and (extra[0] is None or type(extra[0]) is dict)
        and type(extra[1]) is tuple
        and len(extra[1]) == 4
        and type(extra[1][0]) is bytes
        and all(type(v) is int for v in extra[1][1:])
    )


def is_numpy_build_target(inst: Any) -> bool:
    """``inst`` is a numpy array or dtype (BUILD on it goes through :meth:`check_build`)."""
    np = sys.modules.get("numpy")
    return np is not None and (type(inst) is np.ndarray or isinstance(inst, np.dtype))


def _decide_functional(module_name: str, attr: str) -> Decision:
    import torch.nn.functional as F

    if attr.startswith("_"):
        return Decision(None, None, "private torch.nn.functional names are not admitted")
    exported = getattr(F, attr, None)
    if module_name == "torch.nn.functional":
        ok = (
            isinstance(exported, types.FunctionType)
            and exported.__module__ == "torch.nn.functional"
            and exported.__qualname__ == attr
        )
    else:  # builtins torch.nn.functional re-exports under the same name (F.gelu)
        ok = isinstance(exported, types.BuiltinFunctionType) and exported is getattr(
            torch._C._nn, attr, None
        )
    if not ok:
        return Decision(None, None, "it is not a function of torch.nn.functional")
    return Decision(exported, VALUE, "")


def _top_level_classes(body: Sequence[ast.stmt]) -> Iterator[str]:
    for node in body:
        if isinstance(node, ast.ClassDef):
            yield node.name
        elif isinstance(node, ast.If):
            yield from _top_level_classes(node.body)
            yield from _top_level_classes(node.orelse)
        elif isinstance(node, ast.Try):
            yield from _top_level_classes(node.body)
            for handler in node.handlers:
                yield from _top_level_classes(handler.body)
            yield from _top_level_classes(node.orelse)
            yield from _top_level_classes(node.finalbody)
        elif isinstance(node, ast.With):
            yield from _top_level_classes(node.body)


def _defines_class(path: Optional[str], name: str) -> bool:
    """The source file at ``path`` has ``class name`` at top level (or under if/try/with)."""
    if path is None:
        return False
    try:
        if os.path.getsize(path) > _MAX_SOURCE:
            return False
        with open(path, "rb") as fh:
            tree = ast.parse(fh.read(), filename=path)
    except (OSError, SyntaxError, ValueError):
        return False
    return name in set(_top_level_classes(tree.body))
