"""Benchmarks for the data & timing area; prints markdown tables of side-by-side ratios.

1. PointwiseConv1d (auto) vs nn.Conv1d(k=1) vs nn.Linear on the transposed input, over a
   sweep of B x C_in x L -> C_out shapes including the seed's 128x4096x256 -> 512.
   Target: PointwiseConv1d >= 0.95x the faster of the two everywhere.
2. DataLoader throughput with a PinnedBatch dataclass batch (st.collate) vs a tuple batch.
   Target: >= 0.98x.
3. st.benchmark / st.cuda_timer vs torch.utils.benchmark.Timer on the same workloads:
   medians within 10%; and the timer's own overhead.

Timings interleave the candidates round by round and keep each one's minimum (robust to a
noisy shared machine). ``--quick`` drops the seed shape (seconds per call on CPU).
"""

from __future__ import annotations

import argparse
import dataclasses
import platform
import statistics
import sys
import time
from typing import Callable, Dict, List, Tuple

import torch
import torch.utils.benchmark as tbench
from torch.utils.data import DataLoader, Dataset, default_collate

import safetorch as st

Shape = Tuple[int, int, int, int]  # B, C_in, L, C_out
SMALL: List[Shape] = [
    (1, 16, 32, 16),
    (8, 64, 128, 64),
    (32, 256, 64, 256),
    (16, 1024, 16, 1024),
    (64, 128, 512, 128),
    (4, 512, 1024, 512),
    (2, 2048, 128, 512),
]
SEED: Shape = (128, 4096, 256, 512)


def interleaved_min(fns: Dict[str, Callable[[], object]], rounds: int) -> Dict[str, float]:
    """Minimum time (ms) of each fn, timed in alternating rounds after one warmup each."""
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    for fn in fns.values():
        fn()
    best = {k: float("inf") for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            sync()
            t0 = time.perf_counter()
            fn()
            sync()
            best[k] = min(best[k], (time.perf_counter() - t0) * 1e3)
    return best


def bench_pointwise(shapes: List[Shape], device: str) -> List[str]:
    rows = [
        "| B×C_in×L → C_out | Conv1d ms | Linear ms | PointwiseConv1d ms | choice | "
        "vs faster (≥0.95) | speedup vs Conv1d |",
        "|---|---|---|---|---|---|---|",
    ]
    worst = float("inf")
    for b, cin, length, cout in shapes:
        x = torch.randn(b, cin, length, device=device)
        conv = torch.nn.Conv1d(cin, cout, kernel_size=1).to(device)
        lin = torch.nn.Linear(cin, cout).to(device)
        pw = st.PointwiseConv1d(cin, cout).to(device)
        with torch.no_grad():
            lin.weight.copy_(conv.weight.squeeze(-1))
            lin.bias.copy_(conv.bias)
            pw.load_state_dict(conv.state_dict())
            pw(x)  # autotune (measured once, cached)
            choice = next(
                (
                    v
                    for k, v in st.PointwiseConv1d.autotune_cache().items()
                    if k[2:4] == (cin, cout) and k[0].type == device
                ),
                "(not measured)",
            )
            big = b * cin * length >= 1 << 26
            t = interleaved_min(
                {
                    "conv": lambda conv=conv, x=x: conv(x),
                    "linear": lambda lin=lin, x=x: lin(x.transpose(1, 2)).transpose(1, 2),
                    "pw": lambda pw=pw, x=x: pw(x),
                },
                rounds=2 if big else 15,
            )
        faster = min(t["conv"], t["linear"])
        ratio = faster / t["pw"]
        worst = min(worst, ratio)
        rows.append(
            f"| {b}×{cin}×{length} → {cout} | {t['conv']:.3f} | {t['linear']:.3f} | "
            f"{t['pw']:.3f} | {choice} | {ratio:.2f}× | {t['conv'] / t['pw']:.2f}× |"
        )
        del x
    rows.append(f"\nWorst PointwiseConv1d vs faster-of-two ratio: {worst:.2f}× (target ≥ 0.95×)")
    return rows


@dataclasses.dataclass
class ImageBatch(st.PinnedBatch):
    image: torch.Tensor
    label: torch.Tensor


class Images(Dataset):
    def __init__(self, n: int) -> None:
        self.data = torch.randn(n, 3, 32, 32)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> Tuple[torch.Tensor, int]:
        return self.data[i], i


def bench_loader() -> List[str]:
    ds = Images(4096)
    pin = st.accelerator_available()
    loaders = {
        "tuple": DataLoader(ds, batch_size=64, pin_memory=pin),
        "PinnedBatch": DataLoader(
            ds, batch_size=64, pin_memory=pin, collate_fn=st.collate(ImageBatch)
        ),
    }

    def epoch(loader: DataLoader) -> Callable[[], object]:
        return lambda: sum(1 for _ in loader)

    t = interleaved_min({k: epoch(v) for k, v in loaders.items()}, rounds=11)
    ratio = t["tuple"] / t["PinnedBatch"]
    # The only per-batch difference is the collate_fn: time it alone, many rounds.
    samples = [ds[i] for i in range(64)]
    to_batch = st.collate(ImageBatch)
    c = interleaved_min(
        {"default": lambda: default_collate(samples), "st": lambda: to_batch(samples)},
        rounds=300,
    )
    return [
        "| batch type | epoch ms (4096 samples, batch 64, pin_memory="
        f"{pin}) | samples/s | throughput vs tuple (≥0.98) |",
        "|---|---|---|---|",
        f"| tuple | {t['tuple']:.1f} | {4096 / t['tuple'] * 1e3:,.0f} | 1.00× |",
        f"| PinnedBatch (st.collate) | {t['PinnedBatch']:.1f} | "
        f"{4096 / t['PinnedBatch'] * 1e3:,.0f} | {ratio:.2f}× |",
        f"\nPer batch of 64, collate alone: default_collate {c['default'] * 1e3:.1f} µs, "
        f"st.collate(ImageBatch) {c['st'] * 1e3:.1f} µs "
        f"(ratio {c['default'] / c['st']:.2f}×)",
    ]


def bench_timer(device: str) -> List[str]:
    rows = [
        "| workload | st.benchmark median ms | Timer.blocked_autorange median ms | ratio "
        "(target 0.9-1.1) | Timer.timeit(1) median ms | ratio |",
        "|---|---|---|---|---|---|",
    ]
    threads = torch.get_num_threads()
    for n in (128, 512, 1024):
        a = torch.randn(n, n, device=device)
        timer = tbench.Timer(
            "torch.mm(a, a)", globals={"a": a, "torch": torch}, num_threads=threads
        )
        ours: List[float] = []
        theirs: List[float] = []
        single: List[float] = []
        for _ in range(5):  # alternate the tools so load drift hits them alike
            ours.append(st.benchmark(torch.mm, a, a, warmup=3, repeat=50, device=device).median)
            theirs.append(timer.blocked_autorange(min_run_time=0.2).median * 1e3)
            single.extend(timer.timeit(1).raw_times[0] * 1e3 for _ in range(20))
        o, t = statistics.median(ours), statistics.median(theirs)
        one = statistics.median(single)
        rows.append(
            f"| mm {n}×{n} ({device}) | {o:.4f} | {t:.4f} | {o / t:.2f} | {one:.4f} | "
            f"{o / one:.2f} |"
        )
    # Overhead: an empty timed region.
    timer_cm = st.cuda_timer(device=device)

    def empty_cm() -> None:
        with timer_cm:
            pass

    def empty_pc() -> None:
        t0 = time.perf_counter()
        time.perf_counter() - t0

    o = interleaved_min({"cuda_timer": empty_cm, "perf_counter": empty_pc}, rounds=2000)
    rows.append(
        f"\nOverhead of an empty `with st.cuda_timer()` ({device}): {o['cuda_timer'] * 1e3:.2f} µs "
        f"(bare perf_counter pair: {o['perf_counter'] * 1e3:.2f} µs)"
    )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="skip the seed shape")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads (default 1: on a shared, oversubscribed VM every OpenMP "
        "barrier can stall for a scheduler quantum, which swamps the comparison; "
        "0 keeps torch's default)",
    )
    args = parser.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    print(
        f"# data & timing benchmarks\n\nMachine: {platform.machine()} {platform.processor() or ''}, "
        f"{torch.get_num_threads()} threads, torch {torch.__version__}, Python "
        f"{sys.version.split()[0]}, device {device}\n"
    )
    shapes = SMALL if args.quick else SMALL + [SEED]
    print("## PointwiseConv1d vs nn.Conv1d(k=1) vs nn.Linear (forward, no_grad)\n")
    print("\n".join(bench_pointwise(shapes, device)))
    print("\n## DataLoader throughput: PinnedBatch vs tuple batch\n")
    print("\n".join(bench_loader()))
    print("\n## st.benchmark vs torch.utils.benchmark.Timer\n")
    print("\n".join(bench_timer(device)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
