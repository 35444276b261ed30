"""CUDA-only checks of cuda_timer / benchmark: events measure the GPU work, not the launch."""

from __future__ import annotations

import time

import torch

import safetorch as st


def _launch_ms(cycles: int) -> float:
    """Host time to launch one ``_sleep`` kernel without waiting for it (the pitfall)."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    torch.cuda._sleep(cycles)
    ms = (time.perf_counter() - t0) * 1e3
    torch.cuda.synchronize()
    return ms


def test_timer_measures_kernel_not_launch() -> None:
    cycles = 50_000_000  # tens of ms on any current GPU
    # The first launch of a kernel pays one-time costs (module loading, lazy init: 7 ms on
    # an H200), which are neither launch nor kernel time: warm up, then take the best launch.
    _launch_ms(1000)
    launch_ms = min(_launch_ms(cycles) for _ in range(3))
    with st.cuda_timer() as t:
        torch.cuda._sleep(cycles)
    assert t.device == "cuda"
    assert t.ms > 5 * launch_ms


def test_timer_reuses_events_across_and_within_measurements() -> None:
    """Pooled events: sequential and nested measurements stay independent."""
    timer = st.cuda_timer()
    short, long = 1_000_000, 20_000_000
    _launch_ms(1000)  # warm up _sleep
    with timer:
        torch.cuda._sleep(long)
    with timer:
        torch.cuda._sleep(short)
    with timer:  # outer
        torch.cuda._sleep(short)
        with timer:  # inner
            torch.cuda._sleep(long)
    first, second, inner, outer = timer.times
    assert first > 5 * second  # the reused events saw only the second kernel
    assert outer >= inner > 5 * second


def test_benchmark_cuda_stats_and_flush() -> None:
    a = torch.randn(512, 512, device="cuda")
    s = st.benchmark(torch.mm, a, a, warmup=2, repeat=10)
    assert s.device == "cuda" and s.n == 10 and 0 < s.min <= s.median <= s.max
    f = st.benchmark(torch.mm, a, a, warmup=1, repeat=5, flush_l2=True)
    assert f.n == 5 and f.device == "cuda"


def test_decorator_on_cuda() -> None:
    timer = st.cuda_timer()

    @timer
    def step() -> torch.Tensor:
        return torch.ones(1024, device="cuda").sum()

    step()
    step()
    assert len(timer.times) == 2 and all(ms > 0 for ms in timer.times)
