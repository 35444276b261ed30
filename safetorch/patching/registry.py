"""The monkeypatch mechanism: declarations, apply/restore, post-import hooks, call counting.

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
* **Counting.** :func:`record` counts a changed call per (patch, kind) and remembers the first
  call site in user code, for the report at the end of ``safetorch run``.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import itertools
import logging
import os
import sys
import sysconfig
import threading
import warnings
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Set, Tuple

import torch
import wrapt

from safetorch import _compat
from safetorch._stack import user_stacklevel
from safetorch.errors import PatchWarning

__all__: List[str] = []  # private: the public API is in safetorch.patching

logger = logging.getLogger("safetorch")

# (wrapped, instance, args, kwargs) -> result: wrapt's wrapper protocol.
WrapperFn = Callable[[Any, Any, Tuple[Any, ...], Dict[str, Any]], Any]


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
        register_with_dynamo(wrapper)  # module functions; methods reach dynamo as methods
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


# --- re-entrancy ---------------------------------------------------------------------------
_local = threading.local()


class reentry:
    """``with reentry(name) as nested:`` -- ``nested`` is True inside an outer call of ``name``.

    A safetorch implementation may call the very torch entry point its patch wraps (st.load
    calls torch.load); the nested call must reach torch's original, never the wrapper again.
    """

    __slots__ = ("_name", "_outer")

    def __init__(self, name: str) -> None:
        self._name = name

    def __enter__(self) -> bool:
        busy = _local.__dict__.setdefault("busy", set())
        self._outer = self._name not in busy
        busy.add(self._name)
        return not self._outer

    def __exit__(self, *exc: object) -> None:
        if self._outer:
            _local.busy.discard(self._name)


def nested(name: str) -> bool:
    """Whether the current thread is inside a safetorch-routed call of patch ``name``."""
    busy: Optional[Set[str]] = _local.__dict__.get("busy")
    return busy is not None and name in busy


# --- torch.compile ---------------------------------------------------------------------------
# Dynamo meets a wrapper in two ways. (1) It traces a function that calls it: dynamo >= 2.2
# looks torch functions up by object (trace_rules; a wrapt proxy hashes and compares like the
# function it wraps) and puts the *wrapper* into the graph as a call_function node; dynamo
# 2.0/2.1 looks them up by id(), so the wrapper must be registered with allow_in_graph or the
# call is `Unsupported: call_method UserDefinedObjectVariable(FunctionWrapper)`. Tensor methods
# (x[i], x.index_select) go into the graph as methods either way. (2) The graph node runs the
# wrapper with FakeTensors to learn output shapes, outside any traced frame: there
# torch.compiler.is_compiling() is False up to at least torch 2.9 (2.13 holds it True for the
# whole compile session), so `compiling()` also asks whether a dynamo compile is in progress
# (torch._guards.CompileContext, torch 2.1+). Either way the wrapper calls torch's original: a
# checked index would sync the host (`.tolist()` of a FakeTensor raises
# DataDependentOutputException) and nothing is counted. When the compiled graph runs (backend
# "eager", or a graph break) the wrapper runs again with real tensors and does its job.
def _never_compiling() -> bool:
    return False


_is_compiling: Callable[[], bool] = _never_compiling


def _compile_session() -> bool:
    guards = sys.modules.get("torch._guards")
    context = getattr(guards, "CompileContext", None)  # None on torch 2.0
    return context is not None and context.current_compile_id() is not None


def _compiling_any() -> bool:
    return bool(_is_compiling()) or _compile_session()


def _dynamo_is_compiling() -> bool:  # torch 2.0-2.2; never imports dynamo itself
    dynamo = sys.modules.get("torch._dynamo")
    return dynamo is not None and bool(dynamo.is_compiling())


compiling: Callable[[], bool] = _never_compiling


def _no_registration(wrapper: Any) -> None:
    return None


# Wrappers registered with dynamo < 2.2 by id(): kept alive so that no later object reuses an
# id that dynamo still allows in graphs.
_allowed_in_graph: List[Any] = []


def _allow_in_graph(wrapper: Any) -> None:
    import torch._dynamo  # 2.0/2.1 only: ~0.6 s, once, when a patch is first applied

    torch._dynamo.allow_in_graph(wrapper)
    _allowed_in_graph.append(wrapper)


register_with_dynamo: Callable[[Any], None] = _no_registration


@_compat.register_binder
def _bind_compiling() -> None:
    global compiling, _is_compiling, register_with_dynamo
    if not _compat.HAS_COMPILE:  # torch < 2.0: no dynamo
        compiling, register_with_dynamo = _never_compiling, _no_registration
        return
    if _compat.HAS_COMPILER_IS_COMPILING:
        _is_compiling = torch.compiler.is_compiling
    else:  # torch 2.0-2.2
        _is_compiling = _dynamo_is_compiling
    compiling = _compiling_any
    register_with_dynamo = _no_registration if _compat.DYNAMO_HAS_TRACE_RULES else _allow_in_graph


# --- counting ------------------------------------------------------------------------------
def _dir_of(module: Any) -> str:
    return os.path.dirname(os.path.abspath(module.__file__)) + os.sep


_SAFETORCH_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_SKIP_ALWAYS = (_SAFETORCH_DIR, _dir_of(wrapt))
_LIBRARY: Tuple[str, ...] = (
    os.path.abspath(sysconfig.get_paths()["stdlib"]) + os.sep,
    "<frozen ",
)


def _torch_dir() -> Tuple[str, ...]:
    torch = sys.modules.get("torch")
    return (_dir_of(torch),) if torch is not None and getattr(torch, "__file__", None) else ()


def call_site(depth: int = 2) -> str:
    """``file:line`` of the innermost frame in user code (not safetorch, wrapt, torch, stdlib).

    Falls back to the innermost frame outside safetorch and wrapt (a DataLoader pin thread
    has no user frame at all).
    """
    library = _LIBRARY + _torch_dir()
    frame: Any = sys._getframe(depth)
    fallback = None
    while frame is not None:
        filename = frame.f_code.co_filename
        if not filename.startswith(_SKIP_ALWAYS):
            here = f"{filename}:{frame.f_lineno}"
            if not filename.startswith(library):
                return here
            fallback = fallback or here
        frame = frame.f_back
    return fallback or "<unknown>"


class _Stat:
    __slots__ = ("counter", "site", "detail")

    def __init__(self, site: str, detail: str) -> None:
        self.counter = itertools.count(1)
        self.site = site
        self.detail = detail

    @property
    def count(self) -> int:
        # itertools.count's repr is "count(N)": the next value, so N - 1 calls were counted.
        return int(repr(self.counter)[6:-1]) - 1


_stats: Dict[Tuple[str, str], _Stat] = {}
_calls: Dict[str, _Stat] = {}  # changed calls per patch (a call may make several changes)
_stats_lock = threading.Lock()
_scopes = threading.local()


class counted_call:
    """``with counted_call(patch):`` -- every :func:`record` inside is one call's change.

    Without it each :func:`record` counts one call. A wrapper that may make several changes
    in one call (``torch.load``: the weights_only default, then CUDA storages mapped to the
    CPU) records them inside one ``counted_call``, so the report says "1 call changed (2
    changes)" rather than "2 calls changed".
    """

    __slots__ = ("_patch", "_outer")

    def __init__(self, patch: str) -> None:
        self._patch = patch

    def __enter__(self) -> None:
        open_scopes = _scopes.__dict__.setdefault("open", {})
        self._outer = self._patch not in open_scopes
        if self._outer:
            open_scopes[self._patch] = False  # no call counted yet

    def __exit__(self, *exc: object) -> None:
        if self._outer:
            del _scopes.open[self._patch]


def route(
    patch: str,
    body: WrapperFn,
    *,
    kind: Optional[str] = None,
    detail: str = "",
    counted: bool = False,
    select: Optional[Callable[[Any, Tuple[Any, ...], Dict[str, Any]], Any]] = None,
) -> WrapperFn:
    """The wrapper skeleton every patch shares, around ``body`` (which routes to st.<name>).

    A call made while ``patch`` is already routing on this thread (a safetorch function calling
    the torch entry point it replaces) goes straight to torch's original. Otherwise ``kind`` (if
    given) is recorded, and ``body(wrapped, instance, args, kwargs)`` runs inside
    :class:`reentry`, and inside :class:`counted_call` when ``counted`` (a body that records
    several changes of one call, or decides itself whether to record). ``select(instance, args,
    kwargs)``, when given, decides first: ``None`` sends the call to torch untouched (outside
    the reentry scope, so calls torch makes from there still route); anything else reaches the
    body as its only argument, ``args == (selected,)``. A patch
    module then only declares what routes where::

        Target("torch.nn", "SyncBatchNorm.convert_sync_batchnorm",
               route("syncbn", lambda w, i, a, k: st_convert(*a, **k), kind="..."))
    """

    def wrapper(wrapped: Any, instance: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
        if nested(patch):
            return wrapped(*args, **kwargs)
        if select is not None:
            selected = select(instance, args, kwargs)
            if selected is None:
                return wrapped(*args, **kwargs)
            args, kwargs = (selected,), {}
        if kind is not None:
            record(patch, kind, detail)
        if counted:
            with counted_call(patch), reentry(patch):
                return body(wrapped, instance, args, kwargs)
        with reentry(patch):
            return body(wrapped, instance, args, kwargs)

    return wrapper


def _count_call(patch: str) -> None:
    open_scopes: Optional[Dict[str, bool]] = _scopes.__dict__.get("open")
    if open_scopes is not None and patch in open_scopes:
        if open_scopes[patch]:
            return  # this call was already counted
        open_scopes[patch] = True
    stat = _calls.get(patch)
    if stat is None:
        with _stats_lock:
            stat = _calls.setdefault(patch, _Stat("", ""))
    next(stat.counter)


def record(patch: str, kind: str, detail: str = "") -> None:
    """Count one change of ``kind`` under ``patch``; the first one keeps its call site.

    Each record is also one changed call, unless it happens inside :class:`counted_call`,
    where all records of the same patch make one call. Nothing is counted while dynamo
    traces (a compiled graph has no Python call to count).
    """
    if compiling():
        return
    stat = _stats.get((patch, kind))
    if stat is None:
        site = call_site(3)
        with _stats_lock:
            stat = _stats.setdefault((patch, kind), _Stat(site, detail))
    next(stat.counter)
    _count_call(patch)


def call_count(patch: str) -> int:
    """How many calls ``patch`` changed (each may have made several changes)."""
    stat = _calls.get(patch)
    return 0 if stat is None else stat.count


@dataclass(frozen=True)
class ReportEntry:
    """One line of the report: ``count`` calls of ``kind`` changed by ``patch``."""

    patch: str
    kind: str
    count: int
    first_site: str
    detail: str


def report_entries() -> List[ReportEntry]:
    with _stats_lock:
        items = list(_stats.items())
    order = {n: i for i, n in enumerate(_declared)}
    items.sort(key=lambda kv: (order.get(kv[0][0], len(order)), kv[0][1]))
    return [ReportEntry(p, k, s.count, s.site, s.detail) for (p, k), s in items]


def reset_counts() -> None:
    with _stats_lock:
        _stats.clear()
        _calls.clear()


# --- --allow / SAFETORCH_ALLOW -----------------------------------------------------------------
ALLOW_ENV = "SAFETORCH_ALLOW"


def allowed_globals() -> Tuple[str, ...]:
    """Globals the ``load`` patch allows in weights-only loads: ``safetorch run --allow``.

    ``safetorch run --allow mypkg.Config`` (repeatable) and the environment variable
    ``SAFETORCH_ALLOW=mypkg.Config,other.Name`` (comma-separated; child processes inherit
    it) name ``"module.Name"`` globals that a checkpoint loaded through the patched
    ``torch.load`` may reference, as ``st.load(..., allow=[...])`` does for one call.

    Returns:
        The names, in order, without duplicates (empty when nothing is configured).
    """
    raw = os.environ.get(ALLOW_ENV, "")
    return tuple(dict.fromkeys(p.strip() for p in raw.split(",") if p.strip()))


# --- warnings raised inside patched calls -----------------------------------------------------
_WARNING_REGISTRIES: Dict[str, Dict[Any, Any]] = {}


def _user_frame() -> Any:
    library = _SKIP_ALWAYS + _torch_dir()
    frame: Any = sys._getframe(2)
    while frame is not None and frame.f_code.co_filename.startswith(library):
        frame = frame.f_back
    return frame


def _reemit(caught: List[warnings.WarningMessage]) -> None:
    """Warn again as ``warnings.warn`` would have, with lines inside safetorch or wrapt
    replaced by the caller's line in user code (whose filters and registry then apply)."""
    user = None
    for w in caught:
        if not w.filename.startswith(_SKIP_ALWAYS):  # torch attributed it itself: keep that
            warnings.warn_explicit(
                w.message,
                w.category,
                w.filename,
                w.lineno,
                registry=_WARNING_REGISTRIES.setdefault(w.filename, {}),
                source=w.source,
            )
            continue
        user = user or _user_frame()
        if user is None:  # no user frame at all: keep the original attribution
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, source=w.source)
            continue
        g = user.f_globals
        warnings.warn_explicit(
            w.message,
            w.category,
            user.f_code.co_filename,
            user.f_lineno,
            module=g.get("__name__"),
            registry=g.setdefault("__warningregistry__", {}),
            module_globals=g,
            source=w.source,
        )


def call_attributing_warnings(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``, with warnings raised inside attributed to the caller's line.

    A warning that torch raises from C++ (``x[uint8_mask]``) is attributed to the innermost
    Python frame, which inside a patched call is safetorch's wrapper: the once-per-location
    filter would then merge warnings from different user lines, and filters keyed on the
    user's module would stop matching. The warnings are caught (under a temporary "always"
    filter, so the wrapper frame's registry sees nothing) and issued again from the first frame outside
    safetorch, wrapt and torch, through that module's ``__warningregistry__``: what a
    direct torch call shows. They are issued when the call returns or raises (an "error"
    filter raises then). The warning state is process-global in Python < 3.14, so this is
    used only on calls made from the user's thread, never on the pin-memory thread.
    """
    if _scopes.__dict__.get("attributing"):
        return fn(*args, **kwargs)  # an outer patched call re-attributes everything
    caught: List[warnings.WarningMessage] = []

    def record(message: Any, category: Any, filename: str, lineno: int, *rest: Any) -> None:
        caught.append(warnings.WarningMessage(message, category, filename, lineno))

    # Not warnings.catch_warnings: entering and leaving it bumps the filters' version, which
    # empties every module's once-per-location registry, so "default" filters would show a
    # repeated warning every time. Mutating the list in place keeps the registries.
    always = ("always", None, Warning, None, 0)
    filters: List[Any] = warnings.filters  # type: ignore[assignment]  # a list at runtime
    shown = warnings.showwarning
    filters.insert(0, always)
    warnings.showwarning = record  # type: ignore[assignment]  # our recorder has showwarning's signature; typeshed's Callable differs in defaults
    _scopes.attributing = True
    try:
        return fn(*args, **kwargs)
    finally:
        _scopes.attributing = False
        warnings.showwarning = shown
        for i, entry in enumerate(filters):
            if entry is always:
                del filters[i]
                break
        if caught:
            _reemit(caught)


def _attributing(wrapper: WrapperFn) -> WrapperFn:
    def attributing(wrapped: Any, instance: Any, args: Tuple[Any, ...], kwargs: Dict) -> Any:
        return call_attributing_warnings(wrapper, wrapped, instance, args, kwargs)

    attributing.__wrapped__ = wrapper  # type: ignore[attr-defined]  # functools-style __wrapped__ on a function object
    return attributing


def iter_applied() -> Iterator[Tuple[str, str, str]]:
    with _lock:
        return iter(list(_applied))
