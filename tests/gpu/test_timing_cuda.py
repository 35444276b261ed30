"""CUDA-only checks of cuda_timer / benchmark: events measure the GPU work, not the launch."""

from __future__ import annotations

import time

import torch

import safetorch as st


def test_timer_measures_kernel_not_launch() -> None:
    torch.cuda.synchronize()
    cycles = 50_000_000  # tens of ms on any current GPU
    t0 = time.perf_counter()
    torch.cuda._sleep(cycles)
    launch_ms = (time.perf_counter() - t0) * 1e3  # the pitfall: no synchronize
    torch.cuda.synchronize()
    with st.cuda_timer() as t:
        torch.cuda._sleep(cycles)
    assert t.device == "cuda"
    assert t.ms > 5 * launch_ms


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
