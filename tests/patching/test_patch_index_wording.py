"""Patch ``index`` with the check forced on CPU: ``x[idx]``, ``index_select`` and ``gather``
raise CPU torch's exact message (the path CUDA takes, compared against CPU torch itself)."""

from __future__ import annotations

import warnings
from typing import Any, Callable

import numpy as np
import pytest
import torch
from _strategies import near_bound_index
from hypothesis import given, settings

import safetorch as st
from safetorch.patching import _report

T = torch.tensor


def _error(fn: Callable[[], Any]) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's deprecation warnings are not tested here
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - compared below
            return e
    return None


def _both(call: Callable[[], Any]) -> Any:
    """(CPU torch's error, the patched checked path's error, calls routed to st) for ``call``."""
    expected = _error(call)  # unpatched, default policy: CPU torch itself
    before = _report.call_count("index")
    previous = st.set_index_check("always")
    try:
        with st.patched("index"):
            got = _error(call)
    finally:
        st.set_index_check(previous)
    return expected, got, _report.call_count("index") - before


CASES = {
    "size-0 dim, list": (lambda: torch.empty(10, 0)[:, [0, 1]]),
    "size-0 dim, tensor": (lambda: torch.empty(10, 0)[:, T([0, 1])]),
    "size-0 dim 0, negative": (lambda: torch.empty(0)[T([-1])]),
    "negative": (lambda: torch.zeros(4)[T([1, -5, 7])]),
    "after a slice": (lambda: torch.zeros(3, 4)[:, T([0, 9])]),
    "after an ellipsis": (lambda: torch.zeros(2, 3, 4)[..., T([4])]),
    "two tensors": (lambda: torch.zeros(3, 4)[T([0, 5]), T([9, 1])]),
    "int": (lambda: torch.zeros(3, 4)[1, 7]),
    "mask shape": (lambda: torch.zeros(3, 4)[T([True, False])]),
    "mask then tensor": (lambda: torch.zeros(3, 4)[T([True, False, True]), T([1, 9])]),
    "torch.index_select dim 0": (lambda: torch.index_select(torch.zeros(3, 4), 0, T([5]))),
    "Tensor.index_select dim 1": (lambda: torch.zeros(3, 4).index_select(1, T([0, 5]))),
    "index_select size-0 dim": (lambda: torch.zeros(4, 0).index_select(1, T([0]))),
    "torch.gather": (lambda: torch.gather(torch.zeros(2, 6), 1, T([[7], [0]]))),
    "Tensor.gather negative": (lambda: torch.zeros(2, 6).gather(1, T([[-1], [0]]))),
    "gather size-0 dim": (lambda: torch.zeros(2, 0).gather(1, T([[0], [0]]))),
}


@pytest.mark.parametrize("call", CASES.values(), ids=list(CASES))
def test_patched_checked_path_raises_cpu_torch_wording(call: Callable[[], Any]) -> None:
    expected, got, routed = _both(call)
    assert routed == 1  # the patch sent the call to st's checked path
    assert expected is not None and got is not None
    assert isinstance(got, st.IndexOutOfBoundsError)
    assert isinstance(got, type(expected))
    assert str(got) == str(expected)


def test_patched_getitem_goes_through_the_checked_path() -> None:
    # Guard against a vacuous comparison: under "always" the patch must route to st.
    previous = st.set_index_check("always")
    try:
        with st.patched("index"):
            with pytest.raises(st.IndexOutOfBoundsError):
                torch.empty(10, 0)[:, [0, 1]]
    finally:
        st.set_index_check(previous)
    with pytest.raises(IndexError) as info:
        torch.empty(10, 0)[:, [0, 1]]
    assert not isinstance(info.value, st.IndexOutOfBoundsError)  # unpatched: torch's own


# The shared near-bound index strategy (tests/_strategies.py): int64 index tensors of 0-2
# elements, masks of the dimension's size or one more, ints and full slices.
getitem_case = near_bound_index(
    kinds=("tensor", "tensor", "mask", "int", "slice"),
    index_shapes=((0,), (1,), (2,)),
    mask_offsets=(0, 1),
    extras=False,
).map(lambda c: (torch.arange(int(np.prod(c[0])), dtype=torch.float32).reshape(c[0]), c[1]))


@settings(max_examples=200, deadline=None)
@given(getitem_case)
def test_patched_getitem_wording_property(case: Any) -> None:
    x, index = case
    expected, got, _ = _both(lambda: x[index])
    if expected is None:
        assert got is None, got
        return
    assert got is not None, f"torch raised {expected!r}, the patched path returned"
    assert isinstance(got, type(expected))
    assert str(got) == str(expected)
