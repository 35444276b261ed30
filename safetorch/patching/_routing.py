"""Routing a patched torch call to its safetorch implementation: scope and skeleton.

:class:`reentry` marks a thread as inside a routed call of a patch, so that a safetorch
implementation calling the torch entry point it replaces (st.load calls torch.load) reaches
torch's original; :func:`route` is the wrapper skeleton every patch shares.
"""

from __future__ import annotations

import importlib
import threading
from types import ModuleType
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

from safetorch.patching._report import counted_call, record

__all__: List[str] = []  # private: the public API is in safetorch.patching

# (wrapped, instance, args, kwargs) -> result: wrapt's wrapper protocol.
WrapperFn = Callable[[Any, Any, Tuple[Any, ...], Dict[str, Any]], Any]

_local = threading.local()


class LazyModule:
    """The module ``name``, imported on the first attribute access: a patch's implementation
    (``safetorch.checkpoint``, ``safetorch.nn``, ...), which a program that never calls the
    patched function never imports, so ``safetorch run`` and ``st.patch()`` start faster.

    >>> json = LazyModule("json")
    >>> json.dumps([1])
    '[1]'
    """

    __slots__ = ("_name", "_module")

    def __init__(self, name: str) -> None:
        self._name = name
        self._module: Optional[ModuleType] = None

    def __getattr__(self, attr: str) -> Any:
        module = self._module
        if module is None:  # importlib's lock serialises a first use from several threads
            module = self._module = importlib.import_module(self._name)
        return getattr(module, attr)


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


def route(
    patch: str,
    body: WrapperFn,
    *,
    kind: Optional[str] = None,
    detail: str = "",
    counted: bool = False,
    select: Optional[Callable[[Any, Tuple[Any, ...], Dict[str, Any]], Any]] = None,
    scoped: bool = True,
) -> WrapperFn:
    """The wrapper skeleton every patch shares, around ``body`` (which routes to st.<name>).

    A call made while ``patch`` is already routing on this thread (a safetorch function calling
    the torch entry point it replaces) goes straight to torch's original. Otherwise ``kind`` (if
    given) is recorded, and ``body(wrapped, instance, args, kwargs)`` runs inside
    :class:`reentry`, and inside :class:`counted_call` when ``counted`` (a body that records
    several changes of one call, or decides itself whether to record). ``select(instance, args,
    kwargs)``, when given, decides first: ``None`` sends the call to torch untouched (outside
    the reentry scope, so calls torch makes from there still route); anything else reaches the
    body as its only argument, ``args == (selected,)``. ``scoped=False`` drops the re-entry
    scope for a body that never calls the entry point it replaces (``st.upsample`` calls
    ``F.interpolate``, never ``F.upsample``): it saves ~1 us per call. A patch
    module then only declares what routes where::

        Target("torch.nn", "SyncBatchNorm.convert_sync_batchnorm",
               route("syncbn", lambda w, i, a, k: st_convert(*a, **k), kind="..."))
    """

    if not scoped and select is None and not counted:

        def unscoped(wrapped: Any, instance: Any, args: Tuple[Any, ...], kwargs: Dict) -> Any:
            if kind is not None:
                record(patch, kind, detail)
            return body(wrapped, instance, args, kwargs)

        return unscoped

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
