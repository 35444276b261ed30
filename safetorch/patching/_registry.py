"""The monkeypatch mechanism: declarations, one wrapper per torch attribute, post-import hooks.

Imports only go downward: ``allow``, ``report``, ``routing``, ``attribution`` and ``_finder``
at the bottom (one concern each), this module above them, the patch declarations
(``upsample``, ``load``, ...) above it, ``runner`` and ``cli`` at the top. A declaration
imports each name from the module that defines it.

A patch family (``upsample``, ``load``, ...) is a :class:`Patch`: the name its rows of the
pitfall table (``safetorch._pitfalls``) give it, and :class:`Target` s, each a dotted attribute
path in a module plus a handler (a wrapt wrapper function). What a patch does, the safetorch
functions it routes to and the pitfalls it routes are read from those rows, never restated in
the declaration. This module owns everything else, so a declaration stays a few lines long:

* **One wrapper per attribute.** Every patched torch attribute has one wrapper, a
  :class:`_Slot` here, to which the active patches contribute handlers. It is installed when
  the first handler arrives and the original is restored exactly when the last one leaves.
  An attribute only one declared patch targets is wrapped with that patch's handler itself
  (nothing between wrapt and the handler); for one that several target (``Tensor.__getitem__``:
  ``index`` and ``legacy``) the wrapper's function is the chain of the active handlers, each
  later-declared one around the earlier ones (``legacy``'s ``x[0]`` fallback sees the
  ``IndexError`` of ``index``'s check), replaced in place when a handler arrives or leaves.
* **Finding the owner.** ``wrapt.resolve_path`` walks a class's MRO and returns the object
  stored in the ``__dict__`` that defines the attribute (``Tensor.__getitem__`` lives on
  ``torch._C.TensorBase``, not on ``torch.Tensor``). We keep that object and whether the
  attribute was the parent's *own*, because restoring an inherited attribute by ``setattr``
  would leave a copy in the subclass's ``__dict__``: it has to be deleted instead.
* **Wrapping.** ``wrapt.FunctionWrapper`` keeps descriptor binding right for functions,
  methods, slot wrappers and classmethods, and exposes ``__wrapped__``.
* **Not imported yet.** A target whose module is not in ``sys.modules`` waits for its import
  (:mod:`safetorch.patching._finder`, a ``sys.meta_path`` finder present only while something
  waits, so that ``unpatch`` can undo it).
* **Thread safety.** One re-entrant lock serialises patch/unpatch/hook firing. Wrappers take
  no lock on their fast path (a shared wrapper's chain is swapped in one step); counting
  uses ``itertools.count``, whose ``next`` is atomic.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import sys
import threading
import warnings
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Set, Tuple

import wrapt

from safetorch import _compat, _pitfalls
from safetorch._stack import user_stacklevel
from safetorch.errors import PatchWarning
from safetorch.patching import _activation, _report
from safetorch.patching._attribution import attributed
from safetorch.patching._finder import PostImportFinder
from safetorch.patching._routing import WrapperFn
from safetorch.patching._slots import set_keeping_sequence_slot

__all__: List[str] = []  # private: the public API is in safetorch.patching

logger = logging.getLogger("safetorch")


class Target(NamedTuple):
    """One attribute to wrap: ``module`` (dotted, importable), ``path`` inside it, and the
    patch's ``handler`` for it (wrapt's ``(wrapped, instance, args, kwargs)`` protocol).

    A named tuple, not a dataclass: every patch family declares its targets when ``safetorch
    run`` turns the patches on, and a frozen dataclass costs ~0.8 ms to create at import.
    """

    module: str
    path: str
    handler: WrapperFn
    # Re-attribute warnings raised inside the call to the caller's line (see
    # call_attributing_warnings). Off for hot paths (which do it themselves when a warning is
    # possible) and for calls made on helper threads (pin memory), where swapping the global
    # warning state would race with the main thread.
    attribute_warnings: bool = True
    # For an attribute several patches target: ``around(inner)`` is this patch's handler
    # around ``inner``, the chain of the handlers of the patches declared before it (which it
    # calls instead of torch's original). Without it, a later handler calls the earlier ones
    # through its ``wrapped`` argument (one frame more per call).
    around: Optional[Callable[[WrapperFn], WrapperFn]] = None

    @property
    def qualname(self) -> str:
        return f"{self.module}.{self.path}"


def _resolves(function: str) -> bool:
    """Whether a pitfall-table function (``st.<name>``, ``st.<subpackage>.<name>``) exists,
    without importing a module only to ask (a patched call imports its implementation when it
    is first made; tests/core resolve every function of the table)."""
    # ``st`` is the package facade (PEP 562: names resolve on first access), which imports
    # safetorch.patching on demand, never the reverse: it is always in sys.modules while a
    # submodule is, so it is read from there rather than imported.
    obj: Any = sys.modules["safetorch"]
    parts = function.split(".")[1:]
    if len(parts) == 1:  # st.<name>: from the facade's table, without importing its module
        return bool(obj._knows(parts[0]))
    home = f"safetorch.{parts[0]}"
    if home not in sys.modules:  # st.<sub>.<name> of a subpackage not imported yet: its file
        return bool(obj._knows(parts[0])) and importlib.util.find_spec(home) is not None
    for part in parts:
        try:
            obj = getattr(obj, part)
        except (AttributeError, ImportError):
            return False
    return True


class Patch(NamedTuple):
    """A patch family: its name and what it wraps; the rest comes from the pitfall table.

    ``name`` is the ``patch`` of its rows in ``safetorch._pitfalls``: :attr:`pitfalls`,
    :attr:`functions` and :attr:`description` are read from those rows. The patch is
    unavailable (and ``patch()`` refuses it) while one of its rows' functions does not exist.
    """

    name: str
    targets: Tuple[Target, ...]
    # Called (under the registry lock) after the targets are applied / before they are restored.
    on_enable: Optional[Callable[[], None]] = None
    on_disable: Optional[Callable[[], None]] = None

    @property
    def pitfalls(self) -> Tuple[str, ...]:
        """Ids of the pitfall-table rows it routes."""
        return _pitfalls.for_patch(self.name)

    @property
    def rows(self) -> Tuple[_pitfalls.Pitfall, ...]:
        return tuple(_pitfalls.by_id(pitfall_id) for pitfall_id in self.pitfalls)

    @property
    def functions(self) -> Tuple[str, ...]:
        """The safetorch functions of its rows (``st.<name>``), each once, in row order."""
        return tuple(dict.fromkeys(f for row in self.rows for f in row.functions))

    @property
    def description(self) -> str:
        """Its rows' titles and the functions they route to."""
        rows = self.rows
        if not rows:
            return ""
        return f"{'; '.join(row.title for row in rows)} -> {', '.join(self.functions)}"

    def unavailable(self) -> List[str]:
        """Its rows' functions that do not exist in this safetorch build."""
        return [f for f in self.functions if not _resolves(f)]

    def available(self) -> bool:
        return not self.unavailable()


class _Slot:
    """One wrapped torch attribute: its original, its one wrapper, the patches' handlers."""

    __slots__ = ("parent", "attr", "original", "own", "wrapper", "handlers", "_function")

    def __init__(self, parent: Any, attr: str, original: Any, shared: bool) -> None:
        self.parent = parent
        self.attr = attr
        self.original = original
        self.own = attr in vars(parent)  # restore by setattr, else delete (it was inherited)
        self.handlers: Dict[str, Target] = {}  # patch -> its target here, in declaration order
        # Shared slots: the wrapper's function is a C partial whose target is the chain of the
        # handlers contributed now, swapped in place (partial.__setstate__, the pickle hook) on
        # every change: the wrapper object stays, readers need no lock, and a call pays no
        # Python frame for the dispatch.
        self._function: Optional[functools.partial] = None
        if shared:
            self._function = functools.partial(_unreachable)
        self.wrapper: Any = None

    @property
    def shared(self) -> bool:
        """Whether several declared patches target it (its function is swapped in place)."""
        return self._function is not None

    def add(self, name: str, target: Target, order: Sequence[str]) -> None:
        """Contribute patch ``name``'s handler; the first one installs the wrapper."""
        added = {**self.handlers, name: target}
        handlers = {n: added[n] for n in order if n in added}
        if self._function is not None:
            self._rechain(handlers)
        if self.wrapper is None:
            self._install(_handler(target) if self._function is None else self._function)
        self.handlers = handlers

    def remove(self, name: str) -> bool:
        """Withdraw patch ``name``'s handler; True when it was the last (wrapper gone)."""
        del self.handlers[name]
        if not self.handlers:
            return True
        self._rechain(self.handlers)  # several handlers: a shared slot
        return False

    def _rechain(self, handlers: Dict[str, Target]) -> None:
        assert self._function is not None
        chain = _chain(list(handlers.values()))
        self._function.__setstate__((chain, (), None, None))  # type: ignore[attr-defined]  # typeshed omits partial's pickle hook

    def _install(self, fn: WrapperFn) -> None:
        wrapper = wrapt.FunctionWrapper(self.original, fn)
        wrapper._self_safetorch = True  # type: ignore[attr-defined]  # stays on the proxy
        if not isinstance(self.parent, type):
            _compat.register_with_dynamo(wrapper)  # module functions; methods reach dynamo as such
        set_keeping_sequence_slot(self.parent, self.attr, wrapper)  # torch.tensor([x0d])
        self.wrapper = wrapper

    def restore(self, qualname: str, name: str) -> None:
        """Put the original back exactly (``name``: the last patch that wrapped it)."""
        current = vars(self.parent).get(self.attr, None)
        if current is not self.wrapper:
            # Someone rebound the attribute after us: restoring would clobber their object.
            warnings.warn(
                f"safetorch unpatch: {qualname} was replaced by another object after "
                f"patch {name!r} wrapped it; leaving that object in place",
                PatchWarning,
                stacklevel=user_stacklevel(),
            )
            return
        if self.own:
            setattr(self.parent, self.attr, self.original)
        else:
            delattr(self.parent, self.attr)


def _unreachable(*args: Any) -> Any:  # a shared slot's function before its first handler
    raise AssertionError("safetorch: a shared wrapper called without a handler")


def _handler(t: Target) -> WrapperFn:
    return attributed(t.handler) if t.attribute_warnings else t.handler


def _around(outer: WrapperFn, inner: WrapperFn) -> WrapperFn:
    """A plain handler around others: its ``wrapped`` is ``inner`` applied to torch's original."""

    def chained(wrapped: Any, instance: Any, args: Tuple[Any, ...], kwargs: Dict) -> Any:
        return outer(lambda *a, **k: inner(wrapped, instance, a, k), instance, args, kwargs)

    return chained


def _chain(targets: List[Target]) -> WrapperFn:
    """The handlers of ``targets`` (declaration order), each later one around those before it:
    through its ``around`` when it has one (no extra frame), else as a plain wrapper."""
    chain = _handler(targets[0])
    for t in targets[1:]:
        if t.around is not None:
            chain = t.around(chain)
            chain = attributed(chain) if t.attribute_warnings else chain
        else:
            chain = _around(_handler(t), chain)
    return chain


_lock = threading.RLock()
_declared: Dict[str, Patch] = {}
_RANK = {name: i for i, name in enumerate(_activation.ORDER)}
_explicit: Set[str] = set()  # turned on by patch()
_holds: Dict[str, int] = {}  # open patched() contexts per name
_active: Set[str] = set()
_slots: Dict[Tuple[str, str], _Slot] = {}  # (module, path) -> the attribute's one wrapper
_pending: Dict[str, List[Tuple[str, Target]]] = {}  # module name -> targets waiting for import
_missing: Dict[str, List[str]] = {}  # patch -> targets that do not exist on this torch


# --- declarations --------------------------------------------------------------------------
def _shared(key: Tuple[str, str]) -> bool:
    """Whether more than one declared patch targets the attribute ``(module, path)``."""
    return sum(1 for p in _declared.values() for t in p.targets if (t.module, t.path) == key) > 1


def declare(p: Patch) -> Patch:
    """Add a patch family to the registry (declaration modules call this at import)."""
    with _lock:
        if p.name in _declared:
            if _declared[p.name] is not p:
                raise ValueError(f"patch {p.name!r} is already declared")
            return p
        for t in p.targets:
            slot = _slots.get((t.module, t.path))
            if slot is not None and not slot.shared:
                raise ValueError(
                    f"patch {p.name!r} targets {t.qualname}, which is wrapped now for one "
                    "patch only; declare patches before turning them on"
                )
        _declared[p.name] = p
        # ORDER's families first, in its order, whichever was imported first (importing one
        # declaration module imports this module, which imports the others); test patches
        # after them in the order they were declared (the sort is stable).
        ranked = sorted(_declared.items(), key=lambda kv: _RANK.get(kv[0], len(_RANK)))
        _declared.clear()
        _declared.update(ranked)
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
    return _activation.resolve_names(names, default_all=default_all, known=known)


# --- apply / restore -----------------------------------------------------------------------
def _apply_target(name: str, t: Target) -> None:
    key = (t.module, t.path)
    slot = _slots.get(key)
    if slot is None:
        module = sys.modules.get(t.module)
        if module is None:
            _wait(name, t)
            return
        try:
            parent, attr, original = wrapt.resolve_path(module, t.path)
        except (AttributeError, wrapt.PathResolutionError):
            logger.debug("safetorch patch %s: %s does not exist on this torch", name, t.qualname)
            _missing.setdefault(name, []).append(t.qualname)
            return
        if isinstance(original, wrapt.FunctionWrapper) and getattr(
            original, "_self_safetorch", None
        ):
            return  # already ours (e.g. a second registry after a reload): never wrap twice
        slot = _Slot(parent, attr, original, shared=_shared(key))
    elif name in slot.handlers:
        return  # idempotent: patching twice wraps once
    slot.add(name, t, list(_declared))
    _slots[key] = slot


def _withdraw(name: str, key: Tuple[str, str]) -> None:
    slot = _slots[key]
    if slot.remove(name):
        del _slots[key]
        slot.restore(".".join(key), name)


def _enable(name: str) -> None:
    p = _declared[name]
    missing = p.unavailable()
    if missing:
        raise NotImplementedError(
            f"patch {name!r} routes to {', '.join(missing)}, which this safetorch build "
            "lacks; patch the others with st.patch(*names) (see st.patches())"
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
    for key in [k for k, slot in _slots.items() if name in slot.handlers]:
        _withdraw(name, key)


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


def iter_applied() -> List[Tuple[str, str, str]]:
    """``(patch, module, path)`` of every handler contributed now."""
    with _lock:
        return [(n, *key) for key, slot in _slots.items() for n in slot.handlers]


def report_entries() -> List[_report.ReportEntry]:
    """What the patches changed (``_report.entries``), in the order the patches are declared."""
    with _lock:
        order = {n: i for i, n in enumerate(_declared)}
    return sorted(_report.entries(), key=lambda e: (order.get(e.patch, len(order)), e.kind))


# --- post-import hooks ---------------------------------------------------------------------
def _fire(fullname: str) -> None:
    with _lock:
        waiting = _pending.pop(fullname, [])
        for name, t in waiting:
            if name in _active:
                _apply_target(name, t)
        _remove_finder_if_idle()


_finder = PostImportFinder(_pending.__contains__, _fire)


def _wait(name: str, t: Target) -> None:
    _pending.setdefault(t.module, []).append((name, t))
    _finder.install()


def _drop_pending(name: str) -> None:
    for mod in list(_pending):
        _pending[mod] = [(n, t) for n, t in _pending[mod] if n != name]
        if not _pending[mod]:
            del _pending[mod]
    _remove_finder_if_idle()


def _remove_finder_if_idle() -> None:
    if not _pending:
        _finder.remove()


def pending_modules() -> List[str]:
    with _lock:
        return sorted(_pending)


# Importing this module declares every patch family: the declaration modules register
# themselves through declare() (each imports this module, which is complete by now).
for _module in _activation.ORDER:
    importlib.import_module(f"safetorch.patching._{_module}")
del _module
