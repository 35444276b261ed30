"""Benchmark: safetorch's tensor wrappers vs the raw torch calls, measured side by side.

Prints markdown tables of per-call medians and the ratio safetorch/raw:

* CPU passthrough (policy "auto": CPU kernels check bounds, safetorch adds nothing) of
  checked_index, index_select, gather and safe_copy at 10, 10k and 1M elements.
  Targets: <= 1.05x at >= 10k elements, <= 1.5 us added per call at 10.
* The forced check path on CPU (``check="always"``: what CUDA runs, one host "sync").
* On CUDA, when present: raise / deferred / clip vs raw at 1M indices (target <= 1.3x) and
  whether each mode ran with zero host syncs (``torch.cuda.set_sync_debug_mode("error")``).

Run: ``python benchmarks/bench_tensor.py [--quick]``.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import statistics
import time
from typing import Callable, List, Tuple

import torch

import safetorch as st


def _per_call(fn: Callable[[], object], number: int, sync: Callable[[], None]) -> float:
    sync()
    t0 = time.perf_counter()
    for _ in range(number):
        fn()
    sync()
    return (time.perf_counter() - t0) / number


def compare(
    raw: Callable[[], object],
    ours: Callable[[], object],
    *,
    repeat: int,
    sync: Callable[[], None] = lambda: None,
    budget_s: float = 0.02,
) -> Tuple[float, float]:
    """Median seconds per call of raw and ours, interleaved repeat by repeat."""
    raw()
    ours()  # warm up (allocator, dispatch caches)
    one = max(_per_call(raw, 3, sync), 1e-7)
    number = max(1, min(20000, int(budget_s / one)))
    r: List[float] = []
    o: List[float] = []
    for i in range(repeat):
        pair = [(raw, r), (ours, o)] if i % 2 == 0 else [(ours, o), (raw, r)]
        for fn, acc in pair:
            acc.append(_per_call(fn, number, sync))
    return statistics.median(r), statistics.median(o)


def _row(name: str, n: int, raw: float, ours: float) -> str:
    return (
        f"| {name} | {n:,} | {raw * 1e6:.2f} | {ours * 1e6:.2f} | {ours / raw:.3f} | "
        f"{(ours - raw) * 1e6:+.2f} |"
    )


HEADER = (
    "| op | elements | raw µs | safetorch µs | ratio | added µs |\n|---|---:|---:|---:|---:|---:|"
)


def cpu_tables(sizes: List[int], repeat: int) -> None:
    torch.manual_seed(0)
    for title, check in (
        ("CPU passthrough (policy auto: torch directly)", None),
        ('CPU, forced check path (check="always")', "always"),
    ):
        print(f"\n### {title}\n\n{HEADER}")
        for n in sizes:
            x = torch.randn(n)
            idx = torch.randint(0, n, (n,))
            cases = [
                ("checked_index", lambda: x[idx], lambda: st.checked_index(x, idx, check=check)),
                (
                    "index_select",
                    lambda: torch.index_select(x, 0, idx),
                    lambda: st.index_select(x, 0, idx, check=check),
                ),
                (
                    "gather",
                    lambda: torch.gather(x, 0, idx),
                    lambda: st.gather(x, 0, idx, check=check),
                ),
            ]
            if check is None:
                cases.append(("safe_copy", lambda: x.detach().clone(), lambda: st.safe_copy(x)))
            for name, raw, ours in cases:
                r, o = compare(raw, ours, repeat=repeat)
                print(_row(name, n, r, o))


def overhead_table() -> None:
    """Added cost per call at 10 elements from the *minimum* of many timeit runs.

    The minimum is the least noisy estimate of a fixed per-call cost on a shared machine
    (medians include the time the process waits for a core).
    """
    import timeit

    x = torch.randn(10)
    idx = torch.randint(0, 10, (10,))
    cases = [
        ("checked_index", lambda: x[idx], lambda: st.checked_index(x, idx)),
        ("index_select", lambda: torch.index_select(x, 0, idx), lambda: st.index_select(x, 0, idx)),
        ("gather", lambda: torch.gather(x, 0, idx), lambda: st.gather(x, 0, idx)),
        ("safe_copy", lambda: x.detach().clone(), lambda: st.safe_copy(x)),
    ]
    print("\n### CPU passthrough at 10 elements: added µs per call (min of 15 x 20k calls)\n")
    print("| op | raw µs | safetorch µs | added µs | target |\n|---|---:|---:|---:|---|")
    for name, raw, ours in cases:
        r = o = float("inf")
        for _ in range(15):  # interleaved: both see the same machine state
            r = min(r, timeit.timeit(raw, number=20000) / 20000)
            o = min(o, timeit.timeit(ours, number=20000) / 20000)
        verdict = "met" if (o - r) * 1e6 <= 1.5 else "missed"
        print(
            f"| {name} | {r * 1e6:.2f} | {o * 1e6:.2f} | {(o - r) * 1e6:+.2f} | ≤ 1.5 µs: {verdict} |"
        )


def cuda_table(repeat: int) -> None:
    if not torch.cuda.is_available():
        print("\n### CUDA\n\nno CUDA device: skipped (run `make gpu-check` on a GPU machine)")
        return
    dev = torch.device("cuda")
    n = 1_000_000
    x = torch.randn(n, device=dev)
    idx = torch.randint(0, n, (n,), device=dev)
    sync = torch.cuda.synchronize
    print(f"\n### CUDA ({torch.cuda.get_device_name(0)}), 1M indices\n")
    print(
        "| op | mode | raw µs | safetorch µs | ratio | zero host syncs |\n|---|---|---:|---:|---:|---|"
    )
    ops = {
        "checked_index": (lambda: x[idx], lambda m: st.checked_index(x, idx, mode=m)),
        "index_select": (
            lambda: torch.index_select(x, 0, idx),
            lambda m: st.index_select(x, 0, idx, mode=m),
        ),
        "gather": (lambda: torch.gather(x, 0, idx), lambda m: st.gather(x, 0, idx, mode=m)),
    }
    for name, (raw, ours) in ops.items():
        for mode in ("raise", "deferred", "clip"):
            r, o = compare(raw, lambda m=mode: ours(m), repeat=repeat, sync=sync)
            st.clear_deferred()
            torch.cuda.set_sync_debug_mode("error")
            try:
                ours(mode)
                no_sync = "yes"
            except RuntimeError:
                no_sync = "no"
            finally:
                torch.cuda.set_sync_debug_mode("default")
            print(f"| {name} | {mode} | {r * 1e6:.1f} | {o * 1e6:.1f} | {o / r:.3f} | {no_sync} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    parser.add_argument("--cuda-only", action="store_true")
    args = parser.parse_args()
    repeat = 5 if args.quick else 15
    print(
        f"# bench_tensor — {datetime.date.today()} — torch {torch.__version__}, "
        f"Python {platform.python_version()}, {platform.machine()}, "
        f"{torch.get_num_threads()} threads"
    )
    if not args.cuda_only:
        cpu_tables([10, 10_000, 1_000_000], repeat)
        overhead_table()
    cuda_table(repeat)


if __name__ == "__main__":
    main()
