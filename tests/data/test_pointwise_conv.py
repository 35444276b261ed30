"""PointwiseConv1d: equal to nn.Conv1d(k=1), state_dict both ways, autotune cached once."""

from __future__ import annotations

import copy
import pickle
import threading
import time
from typing import Any, List

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st_h

import safetorch as st
from safetorch.nn import pointwise


@pytest.fixture(autouse=True)
def fresh_cache() -> Any:
    st.PointwiseConv1d.clear_autotune_cache()
    yield
    st.PointwiseConv1d.clear_autotune_cache()


def pair(cin: int, cout: int, bias: bool = True, impl: str = "auto") -> Any:
    conv = torch.nn.Conv1d(cin, cout, kernel_size=1, bias=bias)
    pw = st.PointwiseConv1d(cin, cout, bias=bias, impl=impl)
    pw.load_state_dict(conv.state_dict())
    return conv, pw


@settings(max_examples=40)
@given(
    b=st_h.integers(1, 4),
    cin=st_h.integers(1, 9),
    cout=st_h.integers(1, 9),
    length=st_h.integers(1, 12),
    bias=st_h.booleans(),
    impl=st_h.sampled_from(["conv", "linear", "auto"]),
)
def test_outputs_and_grads_equal_conv1d(
    b: int, cin: int, cout: int, length: int, bias: bool, impl: str
) -> None:
    conv, pw = pair(cin, cout, bias, impl)
    x = torch.randn(b, cin, length, requires_grad=True)
    x2 = x.detach().clone().requires_grad_(True)
    y, y2 = conv(x), pw(x2)
    torch.testing.assert_close(y2, y)
    y.square().sum().backward()
    y2.square().sum().backward()
    torch.testing.assert_close(x2.grad, x.grad)
    torch.testing.assert_close(pw.weight.grad, conv.weight.grad)
    if bias:
        torch.testing.assert_close(pw.bias.grad, conv.bias.grad)


@pytest.mark.parametrize("impl", ["conv", "linear", "auto"])
def test_unbatched_double_and_noncontiguous_inputs(impl: str) -> None:
    conv, pw = pair(5, 3, impl=impl)
    x = torch.randn(5, 7)
    torch.testing.assert_close(pw(x), conv(x))
    xt = torch.randn(2, 7, 5).transpose(1, 2)  # what a linear-path layer outputs
    torch.testing.assert_close(pw(xt), conv(xt))
    conv64, pw64 = conv.double(), pw.double()
    x64 = torch.randn(2, 5, 4, dtype=torch.float64)
    torch.testing.assert_close(pw64(x64), conv64(x64))


def test_parameters_and_state_dict_identical_both_ways() -> None:
    conv = torch.nn.Conv1d(6, 4, kernel_size=1)
    pw = st.PointwiseConv1d(6, 4)
    assert isinstance(pw, torch.nn.Conv1d)
    assert [(n, p.shape) for n, p in pw.named_parameters()] == [
        (n, p.shape) for n, p in conv.named_parameters()
    ]
    assert pw.load_state_dict(conv.state_dict()) is not None
    back = torch.nn.Conv1d(6, 4, kernel_size=1)
    back.load_state_dict(pw.state_dict(), strict=True)
    for k, v in pw.state_dict().items():
        assert torch.equal(v, back.state_dict()[k])
    no_bias = st.PointwiseConv1d(6, 4, bias=False)
    assert list(no_bias.state_dict()) == ["weight"] and no_bias.bias is None


def test_linear_path_returns_a_transposed_view() -> None:
    _, pw = pair(4, 3, impl="linear")
    y = pw(torch.randn(2, 4, 5))
    assert not y.is_contiguous() and y.transpose(1, 2).is_contiguous()
    assert pw(y.new_ones(2, 4, 5)).shape == (2, 3, 5)


def test_bad_impl_and_shape_errors_match_conv() -> None:
    with pytest.raises(ValueError, match="impl must be one of"):
        st.PointwiseConv1d(2, 2, impl="fast")
    pw = st.PointwiseConv1d(2, 2, impl="linear")
    with pytest.raises(ValueError, match="impl must be one of"):
        pw.impl = "Linear"
    conv = torch.nn.Conv1d(2, 2, kernel_size=1)
    bad = torch.randn(1, 3, 4)
    with pytest.raises(RuntimeError) as ours:
        pw(bad)
    with pytest.raises(RuntimeError) as theirs:
        conv(bad)
    assert str(ours.value) == str(theirs.value)
    assert "impl='linear'" in repr(pw)


# --- autotune ------------------------------------------------------------------------------
ONE_TUNING = ["conv", "linear"] * pointwise._ROUNDS


def count_measurements(
    monkeypatch: pytest.MonkeyPatch, winner: str, delay: float = 0.0
) -> List[str]:
    calls: List[str] = []

    def fake(impl: str, x: Any, w: Any, b: Any) -> float:
        calls.append(impl)
        time.sleep(delay)
        return 1.0 if impl == winner else 2.0

    monkeypatch.setattr(pointwise, "_time_ms", fake)
    return calls


@pytest.mark.parametrize("winner", ["conv", "linear"])
def test_autotune_measures_once_per_bucket(monkeypatch: pytest.MonkeyPatch, winner: str) -> None:
    calls = count_measurements(monkeypatch, winner)
    conv, pw = pair(8, 4)
    x = torch.randn(3, 8, 100)
    y = pw(x)
    torch.testing.assert_close(y, conv(x))
    assert calls == ONE_TUNING and y.is_contiguous() == (winner == "conv")  # the winner ran
    assert pw(torch.randn(4, 8, 120)).is_contiguous() == (winner == "conv")  # bucket (4, 128)
    other = st.PointwiseConv1d(8, 4)  # another instance, same key: process-wide cache
    assert other(torch.randn(3, 8, 128)).is_contiguous() == (winner == "conv")
    assert calls == ONE_TUNING
    pw(torch.randn(3, 8, 300))  # new length bucket
    assert len(calls) == 2 * len(ONE_TUNING)
    assert set(st.PointwiseConv1d.autotune_cache().values()) == {winner}


def test_clearing_the_cache_reaches_instance_memos(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = count_measurements(monkeypatch, "linear")
    _, pw = pair(8, 4)
    x = torch.randn(2, 8, 16)
    pw(x)
    pw(x)
    assert calls == ONE_TUNING
    st.PointwiseConv1d.clear_autotune_cache()
    pw(x)
    assert calls == ONE_TUNING * 2
    for length in range(1, 200):  # the per-instance memo stays bounded
        pw(torch.randn(1, 8, length))
        assert len(pw._memo) <= pointwise._MEMO_MAX


def test_autotune_key_separates_dtype_channels_and_grad_mode() -> None:
    k = pointwise._key
    w = torch.zeros(4, 8, 1, requires_grad=True)
    x = torch.zeros(3, 8, 100)
    base = k(x, w, None)
    assert k(torch.zeros(4, 8, 128), w, None) == base
    assert k(x.double(), w, None) != base
    assert k(x, torch.zeros(5, 8, 1, requires_grad=True), None) != base
    assert k(x, w, torch.zeros(4)) != base
    with torch.no_grad():
        assert k(x, w, None) != base
    assert k(torch.zeros(3, 100, 8).transpose(1, 2), w, None) != base
    threads = torch.get_num_threads()
    try:  # on CPU the thread count moves the balance at small shapes
        torch.set_num_threads(threads + 1)
        assert k(x, w, None) != base
    finally:
        torch.set_num_threads(threads)
    assert k(x, w, None) == base


def test_autotune_is_thread_safe(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = count_measurements(monkeypatch, "linear", delay=0.01)
    conv, pw = pair(4, 4)
    x = torch.randn(2, 4, 16)
    expected = conv(x)
    errors: List[BaseException] = []

    def run() -> None:
        try:
            torch.testing.assert_close(pw(x), expected)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=run) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and calls == ONE_TUNING


def test_autotune_real_measurement_and_meta(monkeypatch: pytest.MonkeyPatch) -> None:
    conv, pw = pair(16, 8)
    x = torch.randn(2, 16, 32)
    torch.testing.assert_close(pw(x), conv(x))
    assert list(st.PointwiseConv1d.autotune_cache().values())[0] in ("conv", "linear")
    calls = count_measurements(monkeypatch, "linear")
    meta = st.PointwiseConv1d(16, 8, device="meta")
    assert meta(torch.empty(2, 16, 32, device="meta")).shape == (2, 8, 32)
    assert calls == []


def test_measurement_stops_at_the_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: List[str] = []

    def slow(impl: str, *a: Any) -> float:
        calls.append(impl)
        return 550.0 if impl == "conv" else 520.0  # over the 1 s budget every round

    monkeypatch.setattr(pointwise, "_time_ms", slow)
    assert pointwise._measure(torch.zeros(1, 1, 1), torch.zeros(1, 1, 1), None) == {
        "conv": 550.0,
        "linear": 520.0,
    }
    assert calls == ["conv", "linear"] * 2  # the warmup round, then one timed round


def test_warmup_round_is_discarded(monkeypatch: pytest.MonkeyPatch) -> None:
    times = iter([900.0, 1.0] + [5.0, 6.0] * 10)  # conv's first call is slow (warmup)
    monkeypatch.setattr(pointwise, "_time_ms", lambda impl, *a: next(times))
    assert pointwise._measure(torch.zeros(1, 1, 1), torch.zeros(1, 1, 1), None) == {
        "conv": 5.0,
        "linear": 6.0,
    }


def test_small_shapes_are_measured_once_then_looked_up(monkeypatch: pytest.MonkeyPatch) -> None:
    # 4x32x64 -> 64: the shape the old "tiny: use conv" rule got wrong on CPU (0.39x linear).
    conv, pw = pair(32, 64)
    x = torch.randn(4, 32, 64)
    torch.testing.assert_close(pw(x), conv(x))  # real measurement, recorded
    (key, choice), *rest = st.PointwiseConv1d.autotune_cache().items()
    assert not rest and key[2:4] == (32, 64) and choice in ("conv", "linear")
    assert choice in pw._memo.values()

    def no_timing(*a: Any) -> float:
        raise AssertionError("a decided signature was measured again")

    monkeypatch.setattr(pointwise, "_time_ms", no_timing)
    for _ in range(3):
        y = pw(x)
        torch.testing.assert_close(y, conv(x))
        assert y.is_contiguous() == (choice == "conv")  # the recorded choice ran
    other = st.PointwiseConv1d(32, 64)  # another instance: the process-wide decision
    assert other(x).is_contiguous() == (choice == "conv")


def test_wrong_shapes_are_not_memoized() -> None:
    _, pw = pair(4, 3)
    with pytest.raises(RuntimeError):
        pw(torch.randn(2, 5, 7))
    with pytest.raises(RuntimeError):
        pw(torch.randn(2, 4, 5, 7))
    assert pw._memo == {} and st.PointwiseConv1d.autotune_cache() == {}


def test_copies_and_pickles_start_with_an_empty_memo(monkeypatch: pytest.MonkeyPatch) -> None:
    count_measurements(monkeypatch, "linear")
    conv, pw = pair(8, 4)
    x = torch.randn(2, 8, 16)
    pw(x)
    assert pw._memo
    for clone in (copy.deepcopy(pw), pickle.loads(pickle.dumps(pw))):
        assert clone._memo == {} and clone.impl == "auto"
        assert list(clone.state_dict()) == list(conv.state_dict())
        torch.testing.assert_close(clone(x), conv(x))
    assert pw._memo  # the original keeps its own


# --- the per-call dispatch (issue 35): memo by shape, cached 2-D weight view -------------------
_STEPS = st_h.lists(
    st_h.one_of(
        st_h.tuples(st_h.just("call"), st_h.integers(1, 3), st_h.integers(1, 9), st_h.booleans()),
        st_h.tuples(st_h.just("inplace")),
        st_h.tuples(st_h.just("replace_data")),
        st_h.tuples(st_h.just("dtype")),
        st_h.tuples(st_h.just("clear")),
    ),
    min_size=1,
    max_size=12,
)


@settings(max_examples=40, deadline=None)
@given(steps=_STEPS, winner=st_h.sampled_from(["conv", "linear"]))
def test_any_sequence_of_calls_and_weight_changes_matches_conv1d(
    steps: List[Any], winner: str
) -> None:
    """Whatever happened to the module since its decision (in-place updates, a new storage
    through ``weight.data``, a dtype change, a cleared cache), each forward equals
    ``F.conv1d`` with the module's current parameters, with and without grad."""
    with pytest.MonkeyPatch.context() as patch:  # a fake timer: `winner` wins
        patch.setattr(pointwise, "_time_ms", lambda impl, *a: 1.0 if impl == winner else 2.0)
        _run_steps(steps, winner)


def _run_steps(steps: List[Any], winner: str) -> None:
    st.PointwiseConv1d.clear_autotune_cache()
    pw = st.PointwiseConv1d(3, 2)
    for step in steps:
        if step[0] == "call":
            _, batch, length, grad = step
            x = torch.randn(batch, 3, length, dtype=pw.weight.dtype)
            with torch.set_grad_enabled(grad):
                y = pw(x)
            expected = torch.nn.functional.conv1d(x, pw.weight.detach(), pw.bias.detach())
            torch.testing.assert_close(y.detach(), expected)
            assert y.requires_grad == grad
            if length > 1:  # (B, 2, 1) is contiguous either way
                assert y.is_contiguous() == (winner == "conv")  # the decided kernel ran
        elif step[0] == "inplace":
            with torch.no_grad():
                pw.weight.mul_(-2.0).add_(0.5)
        elif step[0] == "replace_data":
            pw.weight.data = torch.randn_like(pw.weight)
        elif step[0] == "dtype":
            pw.to(torch.float64 if pw.weight.dtype == torch.float32 else torch.float32)
        else:
            st.PointwiseConv1d.clear_autotune_cache()
