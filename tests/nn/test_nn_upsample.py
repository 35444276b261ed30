"""st.upsample* and the Upsample modules against torch's deprecated functions and classes."""

from __future__ import annotations

import importlib
import io
import pickle
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st_

import safetorch as st

upsample_module = importlib.import_module("safetorch.nn.upsampling")

MODES_BY_DIM = {
    3: ["nearest", "linear", "area", "nearest-exact"],
    4: ["nearest", "bilinear", "bicubic", "area", "nearest-exact"],
    5: ["nearest", "trilinear", "area", "nearest-exact"],
}
ALIGNABLE = {"linear", "bilinear", "bicubic", "trilinear"}


def torch_deprecated(fn, *args, **kwargs):
    """Call one of torch's deprecated upsample functions with its warning silenced."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args, **kwargs)


@st_.composite
def upsample_cases(draw):
    dim = draw(st_.sampled_from([3, 4, 5]))
    spatial = dim - 2
    shape = [draw(st_.integers(1, 2)), draw(st_.integers(1, 3))]
    shape += [draw(st_.integers(1, 5)) for _ in range(spatial)]
    mode = draw(st_.sampled_from(MODES_BY_DIM[dim]))
    align = draw(st_.sampled_from([None, True, False])) if mode in ALIGNABLE else None
    if draw(st_.booleans()):
        size = draw(st_.one_of(st_.integers(1, 7), st_.tuples(*[st_.integers(1, 7)] * spatial)))
        scale = None
    else:
        size = None
        scale = draw(
            st_.one_of(
                st_.sampled_from([0.5, 1.0, 1.5, 2.0, 2.7, 3.0]),
                st_.tuples(*[st_.sampled_from([1.0, 1.5, 2.0, 2.5])] * spatial),
            )
        )
    dtype = draw(st_.sampled_from([torch.float32, torch.float64]))
    return shape, mode, align, size, scale, dtype


@settings(max_examples=60)
@given(upsample_cases())
def test_upsample_is_bit_identical_to_F_upsample_outputs_and_grads(case):
    shape, mode, align, size, scale, dtype = case
    x = torch.randn(shape, dtype=dtype, generator=torch.Generator().manual_seed(0))
    a = x.clone().requires_grad_(True)
    b = x.clone().requires_grad_(True)
    try:
        theirs = torch_deprecated(F.upsample, b, size, scale, mode, align)
    except (RuntimeError, ValueError, NotImplementedError) as exc:
        # invalid combinations (an output size of 0, ...) fail the same way
        with pytest.raises(type(exc)) as ours_error:
            st.upsample(a, size, scale, mode, align)
        assert str(ours_error.value) == str(exc)
        return
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # st.upsample itself must not warn
        ours = st.upsample(a, size, scale, mode, align)
    assert torch.equal(ours, theirs)
    g = torch.randn(ours.shape, dtype=dtype)
    ours.backward(g)
    theirs.backward(g)
    assert torch.equal(a.grad, b.grad)


@settings(max_examples=30)
@given(
    st_.sampled_from([3, 4, 5]),
    st_.one_of(st_.integers(1, 6), st_.none()),
    st_.sampled_from([1.0, 2.0, 3.0]),
)
def test_upsample_nearest_matches_F_upsample_nearest(dim, size, scale):
    x = torch.randn([2, 3] + [3] * (dim - 2)).requires_grad_(True)
    y = x.detach().clone().requires_grad_(True)
    kwargs = {"size": size} if size is not None else {"scale_factor": scale}
    ours = st.upsample_nearest(x, **kwargs)
    theirs = torch_deprecated(F.upsample_nearest, y, **kwargs)
    assert torch.equal(ours, theirs)
    ours.sum().backward()
    theirs.sum().backward()
    assert torch.equal(x.grad, y.grad)


@settings(max_examples=30)
@given(
    st_.one_of(st_.integers(1, 6), st_.tuples(st_.integers(1, 6), st_.integers(1, 6)), st_.none()),
    st_.sampled_from([1.0, 1.5, 2.0, 3.0]),
)
def test_upsample_bilinear_matches_F_upsample_bilinear(size, scale):
    x = torch.randn(2, 3, 4, 5).requires_grad_(True)
    y = x.detach().clone().requires_grad_(True)
    kwargs = {"size": size} if size is not None else {"scale_factor": scale}
    ours = st.upsample_bilinear(x, **kwargs)
    theirs = torch_deprecated(F.upsample_bilinear, y, **kwargs)
    assert torch.equal(ours, theirs)
    ours.sum().backward()
    theirs.sum().backward()
    assert torch.equal(x.grad, y.grad)


def test_upsample_bilinear_means_align_corners_true_unlike_upsample_mode_bilinear():
    x = torch.tensor([[[[0.0, 3.0]]]])
    assert st.upsample_bilinear(x, size=(1, 4)).tolist() == [[[[0.0, 1.0, 2.0, 3.0]]]]
    assert st.upsample(x, size=(1, 4), mode="bilinear").tolist() == [[[[0.0, 0.75, 2.25, 3.0]]]]


def test_upsample_errors_match_interpolate():
    x = torch.randn(1, 1, 4)
    with pytest.raises(ValueError) as ours:
        st.upsample(x)
    with pytest.raises(ValueError) as theirs:
        F.interpolate(x)
    assert str(ours.value) == str(theirs.value)
    with pytest.raises((ValueError, NotImplementedError)):
        st.upsample_bilinear(x, scale_factor=2)


def test_upsample_uses_the_interpolate_captured_at_import(monkeypatch):
    """A patched F.interpolate (or F.upsample routed here) cannot make st.upsample recurse."""
    calls = []

    def patched(*args, **kwargs):
        calls.append(1)
        return st.upsample(*args, **kwargs)

    monkeypatch.setattr(F, "interpolate", patched)
    monkeypatch.setattr(F, "upsample", st.upsample)
    out = F.upsample(torch.ones(1, 1, 2), scale_factor=2)
    assert out.shape == (1, 1, 4) and calls == []
    assert upsample_module._interpolate is not F.interpolate


@pytest.mark.parametrize(
    ("ours", "theirs", "kwargs", "shape"),
    [
        (st.Upsample, nn.Upsample, {"scale_factor": 2}, (1, 2, 3)),
        (st.Upsample, nn.Upsample, {"size": (5, 4), "mode": "bilinear"}, (1, 2, 3, 3)),
        (
            st.Upsample,
            nn.Upsample,
            {"scale_factor": 1.5, "mode": "bicubic", "align_corners": True},
            (2, 1, 4, 4),
        ),
        (
            st.Upsample,
            nn.Upsample,
            {"scale_factor": (2, 1, 1.5), "mode": "trilinear", "recompute_scale_factor": True},
            (1, 1, 2, 3, 4),
        ),
        (st.UpsamplingNearest2d, nn.UpsamplingNearest2d, {"scale_factor": 3}, (1, 2, 3, 3)),
        (st.UpsamplingNearest2d, nn.UpsamplingNearest2d, {"size": 5}, (1, 2, 3, 3)),
        (st.UpsamplingBilinear2d, nn.UpsamplingBilinear2d, {"scale_factor": 2}, (1, 2, 3, 3)),
        (st.UpsamplingBilinear2d, nn.UpsamplingBilinear2d, {"size": (4, 7)}, (1, 2, 3, 3)),
    ],
)
def test_modules_are_drop_in_for_torch_classes(ours, theirs, kwargs, shape):
    a, b = ours(**kwargs), theirs(**kwargs)
    assert repr(a) == repr(b)
    assert a.state_dict() == b.state_dict() == {}
    assert isinstance(a, theirs) and isinstance(a, nn.Upsample)
    x = torch.randn(shape, requires_grad=True)
    y = x.detach().clone().requires_grad_(True)
    out_a, out_b = a(x), b(y)
    assert torch.equal(out_a, out_b)
    out_a.sum().backward()
    out_b.sum().backward()
    assert torch.equal(x.grad, y.grad)
    # pickling (torch.save of a whole model) and TorchScript keep working
    restored = pickle.loads(pickle.dumps(a))
    assert type(restored) is ours and torch.equal(restored(x), out_b)
    scripted = torch.jit.script(a)
    assert torch.equal(scripted(x), out_b)
    buffer = io.BytesIO()
    torch.save(a.state_dict(), buffer)


def test_module_positional_constructor_matches_torch():
    assert repr(st.Upsample(None, 2.0, "linear", False)) == repr(
        nn.Upsample(None, 2.0, "linear", False)
    )
    assert st.UpsamplingBilinear2d(4).align_corners is True
    assert st.UpsamplingNearest2d(None, 2).mode == "nearest"
