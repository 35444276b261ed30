"""The monkeypatch mechanism: declarations, apply/restore and post-import hooks.

The rest of the mechanism is one module per concern: ``routing`` (the wrapper skeleton and
re-entry scope), ``report`` (counting changed calls), ``attribution`` (warnings inside patched
calls), ``allow`` (``--allow``); dynamo detection is ``_compat.compiling``. This module
re-exports what patch modules use, so a declaration only imports ``registry``.

A patch family (``upsample``, ``load``, ...) is a :class:`Patch`: a name, one line saying what
it does, and :class:`Target` s, each a dotted attribute path in a module plus a wrapt wrapper
function. This module owns everything else, so a declaration stays a few lines long:

* **Finding the owner.** ``wrapt.resolve_path`` walks a class's MRO and returns the object
  stored in the ``__dict__`` that defines the attribute (``Tensor.__getitem__`` lives on
  ``torch._C.TensorBase``, not on ``torch.Tensor``). We keep that object and whether the
  attribute was the parent's *own*, because restoring an inherited attribute by ``setattr``
  would leave a copy in the subclass's ``__dict__``: it has to be deleted instead.
* **Wrapping.** ``wrapt.FunctionWrapper`` keeps descriptor binding right for functions,
  methods, slot wrappers and classmethods, and exposes ``__wrapped__``.
* **Not imported yet.** A target whose module is not in ``sys.modules`` waits in our own
  post-import registry (a ``sys.meta_path`` finder that is removed again when nothing waits).
  wrapt's ``when_imported`` hooks cannot be deregistered, so ``unpatch`` could not undo them.
* **Thread safety.** One re-entrant lock serialises patch/unpatch/hook firing. Wrappers take
  no lock on their fast path; counting uses ``itertools.count``, whose ``next`` is atomic.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import sys
import threading
import warnings
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Set, Tuple

import wrapt

from safetorch import _compat
from safetorch._stack import user_stacklevel
from safetorch.errors import PatchWarning
from safetorch.patching.allow import ALLOW_ENV, allowed_globals
from safetorch.patching.attribution import _attributing, call_attributing_warnings
from safetorch.patching.report import (
    ReportEntry,
    call_count,
    call_site,
    counted_call,
    record,
    report_entries,
    reset_counts,
)
from safetorch.patching.routing import WrapperFn, nested, reentry, route

__all__: List[str] = []  # private: the public API is in safetorch.patching

# The mechanism is one module per concern; this one declares and applies patches, and names
# what patch modules use from the others (``registry.route``, ``registry.record``, ...):
_REEXPORTED = (
    *(ALLOW_ENV, allowed_globals, call_attributing_warnings, ReportEntry, call_count),
    *(call_site, counted_call, record, report_entries, reset_counts, nested, reentry, route),
)

logger = logging.getLogger("safetorch")


def compiling() -> bool:
    """Whether dynamo is tracing or compiling now (``_compat.compiling``, bound at import)."""
    return _compat.compiling()


@dataclass(frozen=True)
class Target:
    """One attribute to wrap: ``module`` (dotted, importable) and ``path`` inside it."""

    module: str
    path: str
    wrapper: WrapperFn = field(compare=False, repr=False)
    # Re-attribute warnings raised inside the call to the caller's line (see
    # call_attributing_warnings). Off for hot paths (which do it themselves when a warning is
    # possible) and for calls made on helper threads (pin memory), where swapping the global
    # warning state would race with the main thread.
    attribute_warnings: bool = field(default=True, compare=False, repr=False)

    @property
    def qualname(self) -> str:
        return f"{self.module}.{self.path}"


@dataclass(frozen=True)
class Patch:
    """A patch family: what it does, what it wraps, and the implementation it routes to.

    ``implementation`` is ``(module, attribute)`` of the public safetorch function; the patch
    is unavailable (and ``patch()`` refuses it) while that attribute does not exist.
    """

    name: str
    description: str
    targets: Tuple[Target, ...]
    implementation: Tuple[str, str]
    #: Ids of the pitfall-table rows it routes (``safetorch._pitfalls``).
    pitfalls: Tuple[str, ...] = ()
    # Called (under the registry lock) after the targets are applied / before they are restored.
    on_enable: Optional[Callable[[], None]] = field(default=None, compare=False, repr=False)
    on_disable: Optional[Callable[[], None]] = field(default=None, compare=False, repr=False)

    def available(self) -> bool:
        module = sys.modules.get(self.implementation[0])
        if module is None:
            try:
                module = importlib.import_module(self.implementation[0])
            except ImportError:
                return False
        return hasattr(module, self.implementation[1])


@dataclass
class _Applied:
    parent: Any
    attr: str
    original: Any
    own: bool  # the attribute was in vars(parent): restore by setattr, else delete
    wrapper: Any


_lock = threading.RLock()
_declared: Dict[str, Patch] = {}
_explicit: Set[str] = set()  # turned on by patch()
_holds: Dict[str, int] = {}  # open patched() contexts per name
_active: Set[str] = set()
_applied: Dict[Tuple[str, str, str], _Applied] = {}  # (patch, module, path) -> record
_pending: Dict[str, List[Tuple[str, Target]]] = {}  # module name -> targets waiting for import
_missing: Dict[str, List[str]] = {}  # patch -> targets that do not exist on this torch


# --- declarations --------------------------------------------------------------------------
def declare(p: Patch) -> Patch:
    """Add a patch family to the registry (declaration modules call this at import)."""
    with _lock:
        if p.name in _declared and _declared[p.name] is not p:
            raise ValueError(f"patch {p.name!r} is already declared")
        _declared[p.name] = p
    return p


def undeclare(name: str) -> None:
    """Remove a (test) declaration; it must not be active."""
    with _lock:
        if name in _active:
            raise RuntimeError(f"patch {name!r} is active; unpatch it first")
        _declared.pop(name, None)


def declared() -> List[Patch]:
    with _lock:
        return list(_declared.values())


def resolve_names(names: Sequence[str], *, default_all: bool) -> List[str]:
    """Validate names; ``"all"`` (or nothing, when ``default_all``) means every patch."""
    with _lock:
        known = list(_declared)
    flat: List[str] = []
    for n in names:  # st.patch("a,b"), st.patch("a", "b") and st.patch(["a", "b"]) alike
        if isinstance(n, (list, tuple, set, frozenset)):
            flat.extend(n)
        else:
            flat.append(n)
    for n in flat:
        if not isinstance(n, str):
            raise TypeError(
                f"patch names must be str (or lists of str), got {type(n).__name__}: {n!r}; "
                "see st.patches()"
            )
    names = flat
    if not names:
        return known if default_all else []
    out: List[str] = []
    for n in names:
        for part in n.split(","):
            part = part.strip()
            if not part:
                continue
            if part == "all":
                out.extend(known)
            elif part in _declared:
                out.append(part)
            else:
                raise ValueError(
                    f"unknown patch {part!r}; expected one of {', '.join(known)} or 'all' "
                    "(see st.patches())"
                )
    return list(dict.fromkeys(out))


# --- apply / restore -----------------------------------------------------------------------
def _apply_target(name: str, t: Target) -> None:
    key = (name, t.module, t.path)
    if key in _applied:
        return  # idempotent: patching twice wraps once
    module = sys.modules.get(t.module)
    if module is None:
        _add_pending(name, t)
        return
    try:
        parent, attr, original = wrapt.resolve_path(module, t.path)
    except (AttributeError, wrapt.PathResolutionError):
        logger.debug("safetorch patch %s: %s does not exist on this torch", name, t.qualname)
        _missing.setdefault(name, []).append(t.qualname)
        return
    if isinstance(original, wrapt.FunctionWrapper) and getattr(original, "_self_safetorch", None):
        return  # already ours (e.g. a second registry after a reload): never wrap twice
    own = attr in vars(parent)
    wrapper = wrapt.FunctionWrapper(
        original, _attributing(t.wrapper) if t.attribute_warnings else t.wrapper
    )
    wrapper._self_safetorch = name  # type: ignore[attr-defined]  # stays on the proxy
    if not isinstance(parent, type):
        _compat.register_with_dynamo(wrapper)  # module functions; methods reach dynamo as such
    setattr(parent, attr, wrapper)
    _applied[key] = _Applied(parent, attr, original, own, wrapper)


def _restore(key: Tuple[str, str, str]) -> None:
    rec = _applied.pop(key)
    current = vars(rec.parent).get(rec.attr, None)
    if current is not rec.wrapper:
        # Someone rebound the attribute after us: restoring would clobber their object.
        warnings.warn(
            f"safetorch unpatch: {key[1]}.{key[2]} was replaced by another object after "
            f"patch {key[0]!r} wrapped it; leaving that object in place",
            PatchWarning,
            stacklevel=user_stacklevel(),
        )
        return
    if rec.own:
        setattr(rec.parent, rec.attr, rec.original)
    else:
        delattr(rec.parent, rec.attr)


def _enable(name: str) -> None:
    p = _declared[name]
    if not p.available():
        mod, attr = p.implementation
        raise NotImplementedError(
            f"patch {name!r} routes to {mod}.{attr}, which does not exist in this safetorch "
            f"build; patch the others with st.patch(*names) (see st.patches())"
        )
    _missing.pop(name, None)
    try:
        for t in p.targets:
            _apply_target(name, t)
        if p.on_enable is not None:
            p.on_enable()
    except BaseException:
        _disable(name)
        raise
    _active.add(name)


def _disable(name: str) -> None:
    p = _declared[name]
    if p.on_disable is not None and name in _active:
        p.on_disable()
    _active.discard(name)
    _drop_pending(name)
    for key in [k for k in _applied if k[0] == name]:
        _restore(key)


def _sync(name: str) -> bool:
    """Make the applied state of ``name`` match its explicit flag and open contexts."""
    want = name in _explicit or _holds.get(name, 0) > 0
    if want and name not in _active:
        _enable(name)
        return True
    if not want and name in _active:
        _disable(name)
        return True
    return False


def enable(names: Sequence[str]) -> List[str]:
    with _lock:
        changed = []
        for n in names:
            _explicit.add(n)
            try:
                if _sync(n):
                    changed.append(n)
            except BaseException:
                _explicit.discard(n)
                raise
        return changed


def disable(names: Sequence[str]) -> List[str]:
    with _lock:
        changed = []
        for n in names:
            _explicit.discard(n)
            if _sync(n):  # stays on while a patched() context holds it
                changed.append(n)
        return changed


def reset() -> None:
    """Everything off, open contexts forgotten (tests and interpreter shutdown)."""
    with _lock:
        _explicit.clear()
        _holds.clear()
        for n in list(_declared):
            _sync(n)


def hold(names: Sequence[str]) -> None:
    with _lock:
        done: List[str] = []
        try:
            for n in names:
                _holds[n] = _holds.get(n, 0) + 1
                done.append(n)
                _sync(n)
        except BaseException:
            release(done)
            raise


def release(names: Sequence[str]) -> None:
    with _lock:
        for n in names:
            if _holds.get(n, 0) > 0:
                _holds[n] -= 1
            _sync(n)


def is_active(name: str) -> bool:
    return name in _active


def active_names() -> List[str]:
    with _lock:
        return [n for n in _declared if n in _active]


def missing_targets(name: str) -> List[str]:
    with _lock:
        return list(_missing.get(name, ()))


# --- post-import hooks ---------------------------------------------------------------------
class _HookLoader(importlib.abc.Loader):
    """Delegates to the real loader, then applies the targets waiting for this module."""

    def __init__(self, loader: Any, fullname: str) -> None:
        self._loader = loader
        self._fullname = fullname

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Optional[ModuleType]:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        # Put the real loader back first: code in the module (and importlib.resources)
        # must see the loader it would have seen without us.
        module.__loader__ = self._loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        _fire(self._fullname)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """A ``sys.meta_path`` entry present only while some target waits for its module."""

    _busy = threading.local()

    def find_spec(
        self, fullname: str, path: Optional[Sequence[str]], target: Optional[ModuleType] = None
    ) -> Optional[importlib.machinery.ModuleSpec]:
        if fullname not in _pending or getattr(self._busy, "on", False):
            return None
        self._busy.on = True
        try:
            for finder in list(sys.meta_path):
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
            else:
                return None
        finally:
            self._busy.on = False
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec  # namespace package or legacy loader: nothing to attach to
        spec.loader = _HookLoader(loader, fullname)
        return spec


_finder = _PostImportFinder()


def _add_pending(name: str, t: Target) -> None:
    _pending.setdefault(t.module, []).append((name, t))
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)


def _drop_pending(name: str) -> None:
    for mod in list(_pending):
        _pending[mod] = [(n, t) for n, t in _pending[mod] if n != name]
        if not _pending[mod]:
            del _pending[mod]
    _remove_finder_if_idle()


def _remove_finder_if_idle() -> None:
    if not _pending and _finder in sys.meta_path:
        sys.meta_path.remove(_finder)


def _fire(fullname: str) -> None:
    with _lock:
        waiting = _pending.pop(fullname, [])
        for name, t in waiting:
            if name in _active:
                _apply_target(name, t)
        _remove_finder_if_idle()


def pending_modules() -> List[str]:
    with _lock:
        return sorted(_pending)


def iter_applied() -> Iterator[Tuple[str, str, str]]:
    with _lock:
        return iter(list(_applied))
