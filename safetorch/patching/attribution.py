"""Warnings raised inside a patched call, attributed to the caller's line in user code."""

from __future__ import annotations

import sys
import threading
import warnings
from typing import Any, Callable, Dict, List, Tuple

from safetorch._stack import TORCH_DIR, first_frame_outside
from safetorch.patching.report import SKIP_ALWAYS
from safetorch.patching.routing import WrapperFn

__all__: List[str] = []  # private: the public API is in safetorch.patching

_scopes = threading.local()
_WARNING_REGISTRIES: Dict[str, Dict[Any, Any]] = {}


def _user_frame() -> Any:
    return first_frame_outside(sys._getframe(2), (*SKIP_ALWAYS, TORCH_DIR))[0]


def _reemit(caught: List[warnings.WarningMessage]) -> None:
    """Warn again as ``warnings.warn`` would have, with lines inside safetorch or wrapt
    replaced by the caller's line in user code (whose filters and registry then apply)."""
    user = None
    for w in caught:
        if not w.filename.startswith(SKIP_ALWAYS):  # torch attributed it itself: keep that
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


def attributed(handler: WrapperFn) -> WrapperFn:
    """``handler`` with warnings raised inside it attributed to the caller's line."""

    def attributing(wrapped: Any, instance: Any, args: Tuple[Any, ...], kwargs: Dict) -> Any:
        return call_attributing_warnings(handler, wrapped, instance, args, kwargs)

    attributing.__wrapped__ = handler  # type: ignore[attr-defined]  # functools-style __wrapped__ on a function object
    return attributing
