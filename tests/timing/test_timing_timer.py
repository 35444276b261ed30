"""cuda_timer / benchmark / TimingStats semantics (timing accuracy is in the benchmark script)."""

from __future__ import annotations

import threading
from typing import Any, Iterator, List

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st_h

import safetorch as st
from safetorch import timing


class FakeClock:
    """perf_counter stand-in advancing a fixed step per read."""

    def __init__(self, step: float) -> None:
        self.now = 0.0
        self.step = step
        self.reads = 0

    def __call__(self) -> float:
        self.reads += 1
        self.now += self.step
        return self.now


class FakeStream:
    """torch.cuda.Stream stand-in: only the device index matters to the timer."""

    def __init__(self, device_index: int = 0) -> None:
        self.device_index = device_index


class FakeEvent:
    """torch.cuda.Event stand-in: a global tick counter, 2 ms per tick."""

    tick = 0
    log: List[str] = []
    created = 0

    def __init__(self, enable_timing: bool = False) -> None:
        assert enable_timing
        FakeEvent.created += 1
        self.at: Any = None
        self.device_index: Any = None

    def record(self, stream: Any = None) -> None:
        if stream is not None:  # a real event records only on streams of one device
            assert self.device_index in (None, stream.device_index), "event on two devices"
            self.device_index = stream.device_index
        FakeEvent.tick += 1
        self.at = FakeEvent.tick
        FakeEvent.log.append("record")

    def synchronize(self) -> None:
        FakeEvent.log.append("event-sync")

    def elapsed_time(self, end: FakeEvent) -> float:
        assert self.at is not None and end.at is not None, "elapsed_time before record"
        return 2.0 * (end.at - self.at)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    c = FakeClock(0.25)
    monkeypatch.setattr(timing, "_perf_counter", c)
    return c


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> Iterator[List[str]]:
    FakeEvent.tick = 0
    FakeEvent.log = []
    FakeEvent.created = 0
    monkeypatch.setattr(timing, "_Event", FakeEvent)
    monkeypatch.setattr(timing, "_current_stream", FakeStream)
    monkeypatch.setattr(timing, "_cuda_available", lambda: True)
    monkeypatch.setattr(timing, "_synchronize", lambda: FakeEvent.log.append("device-sync"))
    yield FakeEvent.log


# --- TimingStats -------------------------------------------------------------------------
@given(st_h.lists(st_h.floats(0.001, 1e4), min_size=1, max_size=50))
def test_stats_match_numpy(times: List[float]) -> None:
    s = st.TimingStats.from_times(times, "cpu")
    a = np.asarray(times)
    assert s.n == len(times) and s.times == tuple(times)
    assert s.min == a.min() and s.max == a.max()
    assert s.median == pytest.approx(np.median(a))
    assert s.mean == pytest.approx(a.mean())
    q1, q3 = np.percentile(a, [25, 75])
    assert s.iqr == pytest.approx(q3 - q1, abs=1e-9)


def test_stats_errors_and_str() -> None:
    with pytest.raises(ValueError, match="at least one"):
        st.TimingStats.from_times([], "cpu")
    assert "median 2 ms" in str(st.TimingStats.from_times([1, 2, 3], "cpu"))


# --- cuda_timer, CPU path ------------------------------------------------------------------
def test_context_manager_uses_perf_counter(clock: FakeClock) -> None:
    with st.cuda_timer(device="cpu") as t:
        pass
    assert t.ms == pytest.approx(250.0) and clock.reads == 2 and t.device == "cpu"


def test_default_device_without_cuda_is_cpu() -> None:
    assert st.cuda_timer().device == ("cuda" if torch.cuda.is_available() else "cpu")


def test_decorator_times_every_call_and_keeps_the_function(clock: FakeClock) -> None:
    timer = st.cuda_timer(device="cpu")

    @timer
    def add(a: int, b: int = 1) -> int:
        """Add."""
        return a + b

    assert add(1) == 2 and add(1, b=5) == 6
    assert add.__name__ == "add" and add.__doc__ == "Add."
    assert timer.times == pytest.approx([250.0, 250.0]) and timer.stats().n == 2


def test_nested_and_threaded_use(clock: FakeClock) -> None:
    t = st.cuda_timer(device="cpu")
    with t:
        with t:
            pass
    assert t.times == pytest.approx([250.0, 750.0])  # inner, then outer

    real = st.cuda_timer(device="cpu")
    threads = [
        threading.Thread(target=lambda: real.__enter__() and real.__exit__()) for _ in range(4)
    ]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert len(real.times) == 4


def test_exceptions_still_record_and_propagate(clock: FakeClock) -> None:
    t = st.cuda_timer(device="cpu")
    with pytest.raises(KeyError):
        with t:
            raise KeyError("x")
    assert len(t.times) == 1


def test_bad_devices() -> None:
    with pytest.raises(ValueError, match="CPU or CUDA"):
        st.cuda_timer(device="meta")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="CUDA is not available"):
            st.cuda_timer(device="cuda")


# --- cuda_timer / benchmark, CUDA control flow (fake events) --------------------------------
def test_cuda_timer_records_on_stream_and_syncs_the_end_event(fake_cuda: List[str]) -> None:
    with st.cuda_timer(device="cuda") as t:
        pass
    assert fake_cuda == ["record", "record", "event-sync"]
    assert t.ms == 2.0 and t.device == "cuda"


def test_cuda_timer_reuses_its_events(fake_cuda: List[str]) -> None:
    """Events are created once per timer, thread and device, not per measurement."""
    t = st.cuda_timer(device="cuda")
    for _ in range(5):
        with t:
            pass
    assert FakeEvent.created == 2
    assert t.times == [2.0] * 5
    assert fake_cuda == ["record", "record", "event-sync"] * 5


def test_cuda_timer_nested_uses_distinct_events(fake_cuda: List[str]) -> None:
    t = st.cuda_timer(device="cuda")
    with t:  # ticks 1 .. 4: outer start, inner start, inner end, outer end
        with t:
            pass
    assert t.times == [2.0, 6.0]  # inner, then outer: an event shared would break this
    with t:
        with t:
            pass
    assert t.times[2:] == [2.0, 6.0] and FakeEvent.created == 3


def test_cuda_timer_pools_events_per_device(
    fake_cuda: List[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    t = st.cuda_timer(device="cuda")
    for index in (0, 1, 0, 1):
        monkeypatch.setattr(timing, "_current_stream", lambda i=index: FakeStream(i))
        with t:
            pass
    assert FakeEvent.created == 4 and t.times == [2.0] * 4  # 2 per device, then reused


def test_cuda_timer_threads_use_their_own_events(fake_cuda: List[str]) -> None:
    t = st.cuda_timer(device="cuda")
    barrier = threading.Barrier(4)

    def work() -> None:
        with t:
            barrier.wait()  # all four open at once: each needs its own start event

    threads = [threading.Thread(target=work) for _ in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert len(t.times) == 4 and FakeEvent.created == 8


def test_benchmark_cuda_synchronizes_once_after_the_timed_runs(fake_cuda: List[str]) -> None:
    calls: List[int] = []
    s = st.benchmark(lambda: calls.append(1), warmup=2, repeat=4, device="cuda")
    assert len(calls) == 6 and s.n == 4 and s.device == "cuda"
    # one sync after warmup, then 4 record pairs, then the single sync that reads them
    assert fake_cuda == ["device-sync"] + ["record"] * 8 + ["device-sync"]
    assert s.times == (2.0,) * 4


# --- benchmark, CPU ------------------------------------------------------------------------
def test_benchmark_counts_and_arguments(clock: FakeClock) -> None:
    seen: List[Any] = []
    s = st.benchmark(lambda a, k=None: seen.append((a, k)), 1, k=2, warmup=3, repeat=7)
    assert seen == [(1, 2)] * 10
    assert s.n == 7 and s.device == "cpu" and s.median == pytest.approx(250.0)


def test_benchmark_device_from_tensor_arguments() -> None:
    s = st.benchmark(torch.add, torch.ones(4), torch.ones(4), warmup=0, repeat=2)
    assert s.device == "cpu" and s.n == 2 and s.min > 0


def test_flush_l2_runs_between_timed_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    order: List[str] = []
    monkeypatch.setattr(timing, "_make_flush", lambda device: lambda: order.append("flush"))
    st.benchmark(lambda: order.append("run"), warmup=1, repeat=3, flush_l2=True, device="cpu")
    assert order == ["run"] + ["flush", "run"] * 3


def test_cpu_flush_buffer_is_real() -> None:
    flush = timing._make_flush("cpu")
    flush()
    assert flush.__self__.numel() * 4 >= 64 << 20  # type: ignore[attr-defined]


@pytest.mark.parametrize("bad", [dict(repeat=0), dict(warmup=-1)])
def test_benchmark_validates(bad: Any) -> None:
    with pytest.raises(ValueError, match="repeat >= 1"):
        st.benchmark(lambda: None, **bad)
