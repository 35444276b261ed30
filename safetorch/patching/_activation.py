"""Patch names, and turning patches on when the program imports torch (standard library only).

``safetorch run``, the ``.pth`` hook and spawned children turn patches on through
:func:`enable`. Every patch targets an attribute of a ``torch`` module, so until the program
imports torch there is nothing to wrap: :func:`enable` applies the patches at once when torch
is already imported, and otherwise from a post-import hook that fires when ``import torch``
has finished, before the statement that imported it returns. A script that never imports
torch (a data generator, a plotting step of a pipeline) then starts as fast under
``safetorch run`` as under ``python``: it never pays for torch's import or the patches'.

Names are resolved here too, torch-free, so that a bad ``--patch`` name is reported before
anything is imported; ``_registry.resolve_names`` uses the same function with the patches it
has declared (a test asserts they are :data:`ORDER`).
"""

from __future__ import annotations

import sys
import threading
from typing import List, Optional, Sequence

from safetorch.patching._finder import PostImportFinder

__all__: List[str] = []  # private: the public API is in safetorch.patching

#: Every patch family, in the order ``"all"`` applies them and the report lists them
#: (``safetorch.patching`` declares them in this order).
ORDER = ("upsample", "load", "state_dict", "index", "pin_memory", "syncbn", "legacy")
#: The patches that st.patch() / st.patched() with no names leave off: they change what legacy
#: code computes, so a user asks for them by name or with ``"all"``; ``safetorch run`` turns
#: them on.
OPT_IN = ("legacy",)

_lock = threading.Lock()
_pending: List[str] = []  # names to enable when torch is imported
_finder: Optional[PostImportFinder] = None


def resolve_names(
    names: Sequence[object], *, default_all: bool, known: Sequence[str] = ORDER
) -> List[str]:
    """Validate names; ``"all"`` (or nothing, when ``default_all``) means every patch.

    >>> resolve_names(["load, index", "load"], default_all=False)
    ['load', 'index']
    """
    flat: List[object] = []
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
    if not flat:
        return list(known) if default_all else []
    out: List[str] = []
    for n in flat:
        for part in str(n).split(","):  # str() for mypy: every n is a str by now
            part = part.strip()
            if not part:
                continue
            if part == "all":
                out.extend(known)
            elif part in known:
                out.append(part)
            else:
                raise ValueError(
                    f"unknown patch {part!r}; expected one of {', '.join(known)} or 'all' "
                    "(see st.patches())"
                )
    return list(dict.fromkeys(out))


def enable(names: Sequence[str]) -> bool:
    """Turn the patches ``names`` on now if torch is imported, else when it is.

    Returns whether they went on now. Names must be resolved (:func:`resolve_names`).
    """
    if "torch" in sys.modules:
        _enable_now(names)
        return True
    global _finder
    with _lock:
        _pending.extend(n for n in names if n not in _pending)
        if _finder is None:
            _finder = PostImportFinder(lambda name: name == "torch", _torch_imported)
        _finder.install()
    return False


def _enable_now(names: Sequence[str]) -> None:
    from safetorch.patching import _registry  # imports torch and the patch declarations

    _registry.enable(names)


def _torch_imported(name: str) -> None:
    with _lock:
        names = list(_pending)
        _pending.clear()
        if _finder is not None:
            _finder.remove()
    if names:
        _enable_now(names)


def waiting() -> List[str]:
    """The names :func:`enable` keeps for torch's import (empty once torch is imported)."""
    with _lock:
        return list(_pending)
