"""``warnings.warn`` stacklevel that points at the first frame outside torch and safetorch.

A constant stacklevel counts frames that differ between releases: ``Module.__call__`` is one
frame (``_call_impl``) in torch 1.13 and two (``_wrapped_call_impl`` + ``_call_impl``) from
torch 2.0, and a monkeypatched torch function adds a safetorch wrapper frame. Walking the stack
finds the user's line on every release.
"""

from __future__ import annotations

import os
import sys

import torch

__all__: list[str] = []  # private: every SafetorchWarning uses it

_INTERNAL_DIRS = (
    os.path.dirname(os.path.abspath(torch.__file__)) + os.sep,
    os.path.dirname(os.path.abspath(__file__)) + os.sep,
)


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
    frame = sys._getframe(1)
    level = 1
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_INTERNAL_DIRS):
        frame = frame.f_back
        level += 1
    return level
