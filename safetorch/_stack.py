"""The one stack walker: the first frame outside given directories (torch, safetorch, ...).

Users of it: ``warnings.warn`` stacklevels (:func:`user_stacklevel`, every SafetorchWarning),
the call site recorded by ``mode="deferred"`` indexing (:func:`user_frame`), and the
monkeypatch registry's call sites and re-emitted warnings (:func:`first_frame_outside` with
its own directories: wrapt, the standard library).

A constant stacklevel or frame depth counts frames that differ between releases:
``Module.__call__`` is one frame (``_call_impl``) in torch 1.13 and two
(``_wrapped_call_impl`` + ``_call_impl``) from torch 2.0, and a monkeypatched torch function
adds a safetorch wrapper frame. Walking the stack finds the user's line on every release.
"""

from __future__ import annotations

import os
import sys
from types import FrameType
from typing import Optional, Tuple

import torch

__all__: list[str] = []  # private: every SafetorchWarning uses it

SAFETORCH_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
INTERNAL_DIRS = (TORCH_DIR, SAFETORCH_DIR)


def first_frame_outside(
    frame: Optional[FrameType], dirs: Tuple[str, ...]
) -> Tuple[Optional[FrameType], int]:
    """The first frame, from ``frame`` outwards, whose file is not inside one of ``dirs``.

    Args:
        frame: Where to start (it is tested too); ``None`` is an empty stack.
        dirs: Path prefixes (directories ending in ``os.sep``; ``"<frozen "`` also works).

    Returns:
        ``(found, steps)``: the frame (``None`` when every frame up to the outermost is
        inside ``dirs``) and how many ``f_back`` steps led from ``frame`` to it (to ``None``:
        the number of frames walked).

    >>> import sys
    >>> from safetorch._stack import first_frame_outside, INTERNAL_DIRS
    >>> here = sys._getframe()
    >>> first_frame_outside(here, INTERNAL_DIRS) == (here, 0)  # a doctest is user code
    True
    """
    steps = 0
    while frame is not None and frame.f_code.co_filename.startswith(dirs):
        frame = frame.f_back
        steps += 1
    return frame, steps


def user_stacklevel() -> int:
    """``stacklevel`` for a ``warnings.warn`` made by this function's caller.

    Counts the caller as level 1 and skips every frame whose file lies inside the torch or
    safetorch package, so the warning is attributed to the first frame of user code (the
    outermost frame when the whole stack is internal).

    Returns:
        The stacklevel to pass to ``warnings.warn``.

    >>> from safetorch._stack import user_stacklevel
    >>> user_stacklevel()  # called from a doctest: the caller is already user code
    1
    """
    frame, steps = first_frame_outside(sys._getframe(1), INTERNAL_DIRS)
    return steps + 1 if frame is not None else steps


def user_frame() -> Optional[FrameType]:
    """The first frame outside torch and safetorch, from this function's caller outwards.

    Returns:
        The frame (the one :func:`user_stacklevel` points at), or ``None`` when the whole
        stack is internal (a thread that torch started).

    >>> from safetorch._stack import user_frame
    >>> user_frame().f_code.co_filename.startswith("<doctest")
    True
    """
    return first_frame_outside(sys._getframe(1), INTERNAL_DIRS)[0]
