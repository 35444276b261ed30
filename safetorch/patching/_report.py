"""What monkeypatch mode changed: per-patch counts of changed calls and their first call site.

:func:`record` counts a changed call per (patch, kind) and remembers the first call site in
user code, for the report at the end of ``safetorch run``; :class:`counted_call` makes several
changes of one call count as one call. Counting uses ``itertools.count``, whose ``next`` is
atomic, so wrappers take no lock on their fast path. Nothing is counted while dynamo traces.
"""

from __future__ import annotations

import functools
import itertools
import os
import sys
import threading
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import wrapt

from safetorch import _compat
from safetorch._stack import SAFETORCH_DIR, TORCH_DIR, first_frame_outside

__all__: List[str] = []  # private: the public API is in safetorch.patching


def _dir_of(module: Any) -> str:
    return os.path.dirname(os.path.abspath(module.__file__)) + os.sep


# Frames that are never the user's: safetorch and wrapt (the wrapper layer); torch and the
# standard library are skipped too when looking for the user's line.
SKIP_ALWAYS = (SAFETORCH_DIR, _dir_of(wrapt))


@functools.cache
def install_dirs(*keys: str) -> Tuple[str, ...]:
    """The interpreter's directories ``keys`` of ``sysconfig.get_paths()`` (``"stdlib"``,
    ``"purelib"``, ...), each ending in ``os.sep``. Looked up on first use, not at import:
    torch does not import sysconfig, and a run whose calls no patch changes never needs it.

    >>> install_dirs("stdlib")[0].endswith(os.sep)
    True
    """
    import sysconfig

    paths = sysconfig.get_paths()
    return tuple(os.path.abspath(paths[key]) + os.sep for key in keys if paths.get(key))


@functools.cache
def _not_user() -> Tuple[str, ...]:
    return (*SKIP_ALWAYS, TORCH_DIR, *install_dirs("stdlib"), "<frozen ")


def call_site(depth: int = 2) -> str:
    """``file:line`` of the innermost frame in user code (not safetorch, wrapt, torch, stdlib).

    Falls back to the innermost frame outside safetorch and wrapt (a DataLoader pin thread
    has no user frame at all).
    """
    start = sys._getframe(depth)
    user, _ = first_frame_outside(start, _not_user())
    if user is None:
        user, _ = first_frame_outside(start, SKIP_ALWAYS)
    return "<unknown>" if user is None else f"{user.f_code.co_filename}:{user.f_lineno}"


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
    if _compat.compiling():
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


def anything_changed() -> bool:
    """Whether any patch changed a call since the last :func:`reset_counts` (``safetorch run``
    prints its report only then, unless ``-v``).

    >>> isinstance(anything_changed(), bool)
    True
    """
    with _stats_lock:
        return any(stat.count for stat in _calls.values())


def entries() -> List[ReportEntry]:
    """Every counted kind of change, by patch name and kind (``registry.report_entries``
    lists them in the order the patches are declared)."""
    with _stats_lock:
        items = sorted(_stats.items(), key=lambda kv: kv[0])
    return [ReportEntry(p, k, s.count, s.site, s.detail) for (p, k), s in items]


def reset_counts() -> None:
    with _stats_lock:
        _stats.clear()
        _calls.clear()
