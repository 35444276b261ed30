"""Error contract of the checked indexing path: CPU torch's exact wording, and TypeError for
arguments that are not tensors.

The checked path (the one CUDA takes) is forced on CPU, by ``check="always"`` and by
``st.set_index_check("always")``; CPU torch on the same input is the oracle for ``str(exc)``.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, Iterator

import numpy as np
import pytest
import torch
from _strategies import near_bound_index
from hypothesis import given, settings

import safetorch as st

T = torch.tensor


def _error(fn: Callable[[], Any]) -> Any:
    """The exception ``fn`` raises, or None."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's deprecation warnings are not tested here
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - compared below
            return e
    return None


def _assert_same_error(expected: Any, got: Any, *, ours: bool = True) -> None:
    """Same class (or a subclass) and same ``str``; ``ours``: safetorch's own error class."""
    assert expected is not None, "CPU torch accepts this input: not an error case"
    assert got is not None, f"torch raised {expected!r} but safetorch returned"
    assert isinstance(got, type(expected)), (expected, got)
    assert str(got) == str(expected)
    if ours:  # found by safetorch's host-side check, before any kernel
        assert isinstance(got, st.IndexOutOfBoundsError)


@pytest.fixture(params=["check=always", "set_index_check"])
def checked(request: Any) -> Iterator[dict]:
    """Keyword arguments that force the checked path, in both ways the API offers."""
    if request.param == "check=always":
        yield {"check": "always"}
        return
    previous = st.set_index_check("always")
    try:
        yield {}
    finally:
        st.set_index_check(previous)


GETITEM_CASES = {
    # the known gap: an index into a size-0 dimension
    "size-0 dim, list": ((10, 0), (slice(None), [0, 1])),
    "size-0 dim, tensor": ((10, 0), (slice(None), T([0, 1]))),
    "size-0 dim 0": ((0,), T([0])),
    "size-0 dim 0, negative": ((0,), T([-1])),
    "size-0 dim, two tensors": ((3, 0), (T([0, 1]), T([0, 0]))),
    "size-0 dim, int": ((3, 0), (1, 0)),
    "negative": ((4,), T([-5])),
    "negative after positive": ((4,), T([1, -5, 7])),
    "positive before negative": ((4,), T([1, 7, -5])),
    "int32": ((4,), T([9], dtype=torch.int32)),
    "2-d index": ((4,), T([[0, 1], [9, 2]])),
    "list": ((4,), [1, 9]),
    "nested list": ((3, 4), [[0, 1], [1, 9]]),
    # torch numbers the index tensors, not the dimensions of x
    "after a slice": ((3, 4), (slice(None), T([0, 9]))),
    "after an ellipsis": ((2, 3, 4), (Ellipsis, T([4]))),
    "after None": ((3, 4), (None, slice(None), T([4]))),
    "split by a slice": ((2, 3, 4), (T([0]), slice(None), T([4]))),
    # several index tensors: torch reports the first bad element in broadcast order
    "two tensors, second bad": ((3, 4), (T([0, 1]), T([1, 9]))),
    "two tensors, both bad": ((3, 4), (T([0, 5]), T([9, 1]))),
    "two tensors, broadcast": ((3, 4), (T([[0], [7]]), T([5, 1]))),
    "int then tensor": ((3, 4, 5), (1, T([0]), T([9]))),
    "int out of range": ((3, 4), (1, 7)),
    "int out of range, negative": ((3, 4), (-4,)),
    "int after a bad mask": ((3, 4), (T([True, False]), 9)),
    # bool masks
    "mask too short": ((3, 4), T([True, False])),
    "mask after a slice": ((3, 4), (slice(None), T([True, False]))),
    "2-d mask": ((3, 4), torch.ones(3, 3, dtype=torch.bool)),
    "list mask": ((3, 4), [True, False]),
    "mask then bad tensor": ((3, 4), (T([True, False, True]), T([1, 9]))),
    "uint8 mask too long": ((3,), T([1, 0, 1, 1], dtype=torch.uint8)),
    "bool then bad tensor": ((3, 4), (True, T([7]))),
}


@pytest.mark.parametrize("case", GETITEM_CASES.values(), ids=list(GETITEM_CASES))
def test_checked_index_error_wording_equals_cpu_torch(case: Any, checked: dict) -> None:
    shape, index = case
    x = torch.zeros(shape)
    _assert_same_error(
        _error(lambda: x[index]), _error(lambda: st.checked_index(x, index, **checked))
    )


SELECT_CASES = {
    # (x shape, dim, index): CPU torch's index_select has three wordings, by path
    "1-d": ((6,), 0, T([0, 9, -1])),
    "1-d negative": ((6,), 0, T([-1])),
    "0-d": ((), 0, T([1])),
    "dim 0": ((3, 4), 0, T([0, 5])),
    "dim 1": ((3, 4), 1, T([0, 5, -2])),
    "dim 1 negative first": ((3, 4), 1, T([-2, 5])),
    "dim -1": ((3, 4), -1, T([7])),
    "3-d dim 1": ((2, 3, 4), 1, T([3])),
    "int32": ((3, 4), 1, T([9], dtype=torch.int32)),
    "size-0 dim": ((4, 0), 1, T([0])),
    "size-0 dim, negative": ((4, 0), 1, T([-1])),
    "size-0 other dim": ((0, 4), 1, T([5])),
    "size-0 other dim, dim 0": ((4, 0), 0, T([9])),
    "size-0 1-d": ((0,), 0, T([0])),
}


@pytest.mark.parametrize("case", SELECT_CASES.values(), ids=list(SELECT_CASES))
def test_index_select_error_wording_equals_cpu_torch(case: Any, checked: dict) -> None:
    shape, dim, index = case
    x = torch.zeros(shape)
    _assert_same_error(
        _error(lambda: torch.index_select(x, dim, index)),
        _error(lambda: st.index_select(x, dim, index, **checked)),
    )


GATHER_CASES = {
    "1-d": ((4,), 0, T([1, 9])),
    "negative": ((2, 6), 1, T([[-1], [0]])),
    "negative below -n": ((2, 6), 1, T([[0], [-7]])),
    "dim 1": ((2, 6), 1, T([[7], [0]])),
    "dim -2": ((3, 2), -2, T([[0, 3]])),
    "size-0 dim": ((2, 0), 1, T([[0], [0]])),
    "first bad in order": ((2, 3), 1, T([[0, 5], [9, 0]])),
}


@pytest.mark.parametrize("case", GATHER_CASES.values(), ids=list(GATHER_CASES))
def test_gather_error_wording_equals_cpu_torch(case: Any, checked: dict) -> None:
    shape, dim, index = case
    x = torch.zeros(shape)
    _assert_same_error(
        _error(lambda: torch.gather(x, dim, index)),
        _error(lambda: st.gather(x, dim, index, **checked)),
    )


def test_no_index_error_where_cpu_torch_has_none(checked: dict) -> None:
    # out-of-range values that torch never reads: empty broadcast, all-False mask, False
    x = torch.zeros(3, 0)
    assert st.checked_index(x, (T([], dtype=torch.long), T([5])), **checked).shape == (0,)
    assert st.checked_index(x.t(), (slice(None), T([5])), **checked).shape == (0, 1)
    y = torch.zeros(3, 4)
    assert st.checked_index(y, (T([False] * 3), T([9])), **checked).shape == (0,)
    assert st.checked_index(y, (False, T([9])), **checked).shape == (0, 4)


@pytest.mark.parametrize("mode", ["clip", "wrap", "fill", "deferred"])
def test_modes_raise_cpu_wording_for_bad_ints_and_masks(mode: str) -> None:
    # Integers and masks mean the same in every mode; only index tensors are remapped.
    x = torch.zeros(3, 4)
    indices: list[Any] = [(1, 7), (T([True, False]), T([0])), (T([0]), -5)]
    for index in indices:
        expected = _error(lambda: x[index])  # noqa: B023 - called at once
        _assert_same_error(expected, _error(lambda: st.checked_index(x, index, mode=mode)))  # noqa: B023
    st.clear_deferred()


# --- property: random indices, shapes with empty dimensions ---------------------------------
def error_case() -> Any:
    """x (dims of size 0..3) and an index of 1-3 tensors/lists/masks/ints, often out of range."""
    return near_bound_index().map(lambda case: (torch.zeros(case[0]), case[1]))


@settings(max_examples=300, deadline=None)
@given(error_case())
def test_checked_index_wording_property(case: Any) -> None:
    x, index = case
    expected = _error(lambda: x[index])
    got = _error(lambda: st.checked_index(x, index, check="always"))
    if expected is None:
        assert got is None, got
        return
    # torch's own errors (broadcast shape mismatch, too many indices) pass through unchanged
    _assert_same_error(expected, got, ours=False)


# --- arguments that are not tensors ----------------------------------------------------------
NOT_TENSORS = [[1, 2, 3], (1, 2, 3), np.arange(3), 5]


@pytest.mark.parametrize("x", NOT_TENSORS, ids=lambda v: type(v).__name__)
@pytest.mark.parametrize("kwargs", [{}, {"check": "always"}, {"check": "never"}, {"mode": "clip"}])
def test_checked_index_rejects_a_non_tensor_x_with_type_error(x: Any, kwargs: dict) -> None:
    with pytest.raises(TypeError) as info:
        st.checked_index(x, T([0]), **kwargs)
    assert str(info.value) == (
        f"checked_index: x must be a torch.Tensor, got {type(x).__name__}; "
        "wrap it with torch.as_tensor(...)"
    )


@pytest.mark.parametrize("op", ["index_select", "gather"])
@pytest.mark.parametrize("kwargs", [{}, {"check": "always"}, {"mode": "wrap"}])
def test_select_like_reject_non_tensors_naming_the_parameter(op: str, kwargs: dict) -> None:
    fn = getattr(st, op)
    with pytest.raises(TypeError, match=rf"^{op}: x must be a torch.Tensor, got list; wrap it"):
        fn([1, 2, 3], 0, T([0]), **kwargs)
    with pytest.raises(TypeError, match=rf"^{op}: index must be a torch.Tensor, got list; wrap"):
        fn(torch.arange(3), 0, [0], **kwargs)
    with pytest.raises(TypeError, match=rf"^{op}: x must be a torch.Tensor, got ndarray"):
        fn(np.arange(3), 0, [0], **kwargs)  # both wrong: x, the first parameter, is named


def test_type_errors_of_tensor_arguments_stay_torch_own() -> None:
    x = torch.arange(3)
    # a bad dim is torch's to report, with torch's own exception (TypeError on 2.x,
    # RuntimeError "You passed a dimname" on 1.13)
    with pytest.raises(Exception) as theirs:
        torch.index_select(x, None, T([0]))  # type: ignore[arg-type]
    with pytest.raises(type(theirs.value)) as ours:
        st.index_select(x, None, T([0]))  # type: ignore[arg-type]
    assert str(ours.value) == str(theirs.value)
    with pytest.raises(IndexError, match="only integers, slices"):
        st.checked_index(x, object())
    with pytest.raises(IndexError, match="only integers, slices"):
        st.checked_index(x, object(), check="always")


def test_valid_non_tensor_indices_still_work() -> None:
    x = torch.arange(6).reshape(2, 3)
    assert torch.equal(st.checked_index(x, [1, 0]), x[[1, 0]])
    assert torch.equal(st.checked_index(x, (1, 2), check="always"), x[1, 2])
