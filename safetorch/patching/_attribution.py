"""Attribution: warnings raised inside a patched call go to the caller's line in user code,
and which code is the legacy project's own (the ``legacy`` patch changes semantics there only)."""

from __future__ import annotations

import functools
import os
import sys
import threading
import warnings
from typing import Any, Callable, Dict, List, Optional, Tuple

from safetorch._eras import marks_0_3
from safetorch._stack import TORCH_DIR, first_frame_outside
from safetorch.patching._report import SKIP_ALWAYS, install_dirs
from safetorch.patching._routing import WrapperFn

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


# --- which code is the legacy project's own ---------------------------------------------------
# The shims that change a result rather than a raise (a scalar's hash, integer division) and
# those that turn a raise into a result (view of transposed strides, .numpy()[0]) apply to
# calls made from the legacy project's own files only: code of installed libraries, torch and
# the standard library keeps modern semantics. The project is the directory of the script
# `python` / `safetorch run` started (a `-m pkg.mod`: the directory above the package), or,
# when `__main__` is not a project file (pytest, a REPL), every file outside those libraries.
@functools.cache
def _library_dirs() -> Tuple[str, ...]:
    installed = install_dirs("stdlib", "platstdlib", "purelib", "platlib")
    return tuple(dict.fromkeys((*SKIP_ALWAYS, TORCH_DIR, *installed, "<frozen ")))


_LIBRARY_PARTS = (f"{os.sep}site-packages{os.sep}", f"{os.sep}dist-packages{os.sep}")
_project_files: Dict[str, bool] = {}
_era_files: Dict[str, bool] = {}
_era: Dict[str, Any] = {"found": False, "modules": -1, "root": None}


def _library(filename: str) -> bool:
    return filename.startswith(_library_dirs()) or any(p in filename for p in _LIBRARY_PARTS)


def _root() -> Optional[str]:
    """The project directory (``""``: none, every non-library file is the project's)."""
    root = _era["root"]
    if root is None:
        main = sys.modules.get("__main__")
        path = getattr(main, "__file__", None)
        root = ""
        if isinstance(path, str) and os.path.isabs(path) and not _library(path):
            root = os.path.dirname(os.path.realpath(path))
            package = getattr(main, "__package__", None) or ""
            for _ in package.split(".") if package else ():  # -m pkg.mod: above pkg/
                root = os.path.dirname(root)
            root += os.sep
        _era["root"] = root
    return root or None


def project_file(filename: str) -> bool:
    """Whether code of ``filename`` is the legacy project's own (cached per file name)."""
    known = _project_files.get(filename)
    if known is None:
        if _library(filename):
            known = False
        else:
            root = _root()
            if root is None:
                known = True
            elif not os.path.isabs(filename):
                known = False  # <string>, <doctest ...> while a script is the project
            else:
                known = os.path.realpath(filename).startswith(root)
        _project_files[filename] = known
    return known


def _marked_03(filename: str) -> bool:
    known = _era_files.get(filename)
    if known is None:
        try:
            with open(filename, "rb") as fh:
                known = marks_0_3(fh.read(1 << 20))
        except OSError:
            known = False
        _era_files[filename] = known
    return known


def _project_is_03(filename: str) -> bool:
    """Whether the project holds 0.3-era code: ``filename`` or a project module loaded so far
    builds or imports a ``Variable`` or passes ``volatile=`` (once found, for the process)."""
    if _era["found"]:
        return True
    if _marked_03(filename):
        _era["found"] = True
        return True
    count = len(sys.modules)
    if count == _era["modules"]:
        return False
    _era["modules"] = count
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if isinstance(path, str) and project_file(path) and _marked_03(path):
            _era["found"] = True
            return True
    return False


def _caller() -> Optional[str]:
    frame = first_frame_outside(sys._getframe(1), SKIP_ALWAYS)[0]
    return None if frame is None else frame.f_code.co_filename


def called_from_project() -> bool:
    """Whether the patched call was made by the legacy project's own code (its caller is the
    first frame outside safetorch and wrapt: torch calling torch is library code)."""
    filename = _caller()
    return filename is not None and project_file(filename)


def called_through_torch_from_project() -> bool:
    """:func:`called_from_project`, with torch's own frames skipped as well: for a torch
    function that torch's modules call on their caller's behalf (``nn.BCELoss.forward``
    calling ``F.binary_cross_entropy``), the module's caller decides."""
    frame = first_frame_outside(sys._getframe(1), (*SKIP_ALWAYS, TORCH_DIR))[0]
    return frame is not None and project_file(frame.f_code.co_filename)


def called_from_03_project() -> bool:
    """:func:`called_from_project`, in a project that holds 0.3-era code (for the shims that
    change a result: what a modern script computes never changes under ``safetorch run``)."""
    if not _era["found"] and len(sys.modules) == _era["modules"]:
        return False  # no 0.3-era module, and none imported since the last look: no frame walk
    filename = _caller()
    return filename is not None and project_file(filename) and _project_is_03(filename)


def _forget_project() -> None:
    """Decide the project anew (tests; ``st.patch("legacy")`` turning on)."""
    _project_files.clear()
    _era_files.clear()
    _era.update(found=False, modules=-1, root=None)
