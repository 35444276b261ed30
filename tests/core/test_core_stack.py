"""The one stack walker (safetorch._stack): stacklevels, user frames, deferred call sites.

Frames "inside safetorch" are made by compiling helpers under a file name in the package
directory, as a wrapper or a monkeypatched entry point would be.
"""

from __future__ import annotations

import os
import sys
import warnings
from typing import Any, Dict

import pytest
import torch

import safetorch as st
from safetorch import _stack

_FAKE_INTERNAL = os.path.join(_stack.SAFETORCH_DIR, "_fake_wrapper.py")


def _internal(source: str) -> Dict[str, Any]:
    """Define the functions of ``source`` as if they lived inside safetorch."""
    namespace: Dict[str, Any] = {"st": st, "_stack": _stack, "warnings": warnings}
    exec(compile(source, _FAKE_INTERNAL, "exec"), namespace)
    return namespace


INTERNAL = _internal(
    """
def warn_here():
    warnings.warn("from inside", st.SafetorchWarning, stacklevel=_stack.user_stacklevel())

def two_deep():
    return warn_here()

def frame_seen():
    return _stack.user_frame()

def deferred_via_wrapper(x, idx):
    return st.checked_index(x, idx, mode="deferred")

def call(fn):
    return fn()
"""
)


def test_user_stacklevel_skips_every_internal_frame() -> None:
    for fn in (INTERNAL["warn_here"], INTERNAL["two_deep"]):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fn()
            line = sys._getframe().f_lineno - 1
        assert [(w.filename, w.lineno) for w in caught] == [(__file__, line)]


def test_user_frame_is_the_frame_user_stacklevel_points_at() -> None:
    frame = INTERNAL["frame_seen"]()
    assert frame is not None and frame.f_code is sys._getframe().f_code


def test_first_frame_outside_counts_the_steps() -> None:
    here = sys._getframe()
    found, steps = _stack.first_frame_outside(here, (os.path.dirname(__file__) + os.sep,))
    assert found is not None and found is not here and steps >= 1
    assert not found.f_code.co_filename.startswith(os.path.dirname(__file__) + os.sep)
    assert _stack.first_frame_outside(here, ("",)) == (None, _depth(here))
    assert _stack.first_frame_outside(None, ("",)) == (None, 0)


def _depth(frame: Any) -> int:
    n = 0
    while frame is not None:
        frame, n = frame.f_back, n + 1
    return n


def test_whole_stack_internal_gives_the_outermost_level(monkeypatch: pytest.MonkeyPatch) -> None:
    # The stacklevel of a stack with no user frame is its outermost frame (warnings.warn
    # then attributes the warning to it), as before the walker was shared.
    monkeypatch.setattr(_stack, "INTERNAL_DIRS", ("",))  # every file is "internal"
    assert _stack.user_stacklevel() == _depth(sys._getframe())
    assert _stack.user_frame() is None


def test_deferred_call_site_is_the_user_line_behind_a_wrapper() -> None:
    # A fixed frame depth recorded the wrapper's line; the walker finds the caller's.
    st.clear_deferred()
    INTERNAL["deferred_via_wrapper"](torch.arange(3.0), torch.tensor([5]))
    line = sys._getframe().f_lineno - 1
    with pytest.raises(IndexError) as info:
        st.raise_deferred()
    assert f"{__file__}:{line}" in str(info.value) and "_fake_wrapper" not in str(info.value)
