"""Benchmark st.PointwiseConv1d(impl="auto") against both of its candidates, side by side.

For each B x C_in x L -> C_out shape, three modules with the same weights run the same input
(forward, no_grad):

- ``nn.Conv1d(C_in, C_out, kernel_size=1)``,
- ``nn.Linear(C_in, C_out)`` on the transposed input (``lin(x.transpose(1, 2)).transpose(1, 2)``),
- ``st.PointwiseConv1d(C_in, C_out)`` in ``impl="auto"``, after its first call (which measures
  and caches the choice; that one-time cost is its own column),
- and, as an A/A control, a second ``nn.Conv1d`` timed against the first: its distance from
  1.00x is the noise floor of that row (on a shared machine it is not small).

Target (issue 16 item 9, issue 35 item 4): PointwiseConv1d >= 0.95x the faster of the two at
every shape. The last table ("auto adds") is the per-call cost of the dispatch itself.

Rounds interleave the three candidates; each round times ``number`` calls of each, and the
ratios are the medians of the per-round ratios (on a shared machine a single min() is at the
mercy of one lucky or unlucky round; adjacent rounds see the same load). Large shapes get
fewer rounds (``--seconds`` per shape and thread count bounds them).

Usage::

    python benchmarks/bench_pointwise.py [--threads 1,2] [--quick] [--seconds 8] [--device cuda]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
from pathlib import Path
from typing import Callable, Dict, List, Tuple

import torch
import torch.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_tensor import _per_call  # noqa: E402  (per-call seconds of back-to-back calls)

import safetorch as st  # noqa: E402

Shape = Tuple[int, int, int, int]  # B, C_in, L, C_out
SHAPES: List[Shape] = [
    (1, 16, 32, 16),
    (4, 32, 64, 64),  # the example: conv ran at 0.39x nn.Linear here
    (8, 64, 128, 64),
    (32, 256, 64, 256),
    (16, 1024, 16, 1024),
    (4, 512, 1024, 512),
    (2, 2048, 128, 512),
    (64, 128, 512, 128),
]
SEED: Shape = (128, 4096, 256, 512)  # seconds per call on CPU; dropped by --quick


def _sync(device: str) -> Callable[[], None]:
    return torch.cuda.synchronize if device == "cuda" else (lambda: None)


def _paired(
    fns: Dict[str, Callable[[], object]], seconds: float, device: str
) -> Dict[str, List[float]]:
    """Per-call seconds of each fn, one entry per interleaved round."""
    sync = _sync(device)
    for fn in fns.values():  # warm up
        fn()
    once = max(_per_call(next(iter(fns.values())), 1, sync), 1e-7)
    number = max(1, int(0.02 / once))  # >= ~20 ms per timed block
    rounds = int(seconds / (len(fns) * number * once))
    rounds = max(3, min(41, rounds))
    times: Dict[str, List[float]] = {k: [] for k in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            times[name].append(_per_call(fn, number, sync))
    return times


def _fmt_time(s: float) -> str:
    return f"{s * 1e3:.1f} ms" if s >= 1e-3 else f"{s * 1e6:.1f} us"


def bench(shapes: List[Shape], seconds: float, device: str) -> Tuple[List[str], float]:
    rows = []
    worst = float("inf")
    for b, cin, length, cout in shapes:
        torch.manual_seed(0)
        x = torch.randn(b, cin, length, device=device)
        conv = nn.Conv1d(cin, cout, kernel_size=1).to(device)
        again = nn.Conv1d(cin, cout, kernel_size=1).to(device)  # A/A control: the noise floor
        lin = nn.Linear(cin, cout).to(device)
        pw = st.PointwiseConv1d(cin, cout).to(device)
        with torch.no_grad():
            lin.weight.copy_(conv.weight.squeeze(-1))
            lin.bias.copy_(conv.bias)
            pw.load_state_dict(conv.state_dict())
            decide = _per_call(lambda: pw(x), 1, _sync(device))  # measures once, caches the winner
            y = pw(x)
            choice = "conv" if y.is_contiguous() else "linear"
            torch.testing.assert_close(y, conv(x), rtol=1e-4, atol=1e-4)
            t = _paired(
                {
                    "conv": lambda: conv(x),
                    "linear": lambda: lin(x.transpose(1, 2)).transpose(1, 2),
                    "pw": lambda: pw(x),
                    "again": lambda: again(x),
                },
                seconds,
                device,
            )
        n = len(t["pw"])
        control = statistics.median(t["conv"][i] / t["again"][i] for i in range(n))
        vs_conv = statistics.median(t["conv"][i] / t["pw"][i] for i in range(n))
        vs_lin = statistics.median(t["linear"][i] / t["pw"][i] for i in range(n))
        med = {k: statistics.median(v) for k, v in t.items()}
        # "The faster of the two" by median time; a per-round min() of two noisy samples would
        # be biased low against a single sample of PointwiseConv1d.
        faster = "conv" if med["conv"] <= med["linear"] else "linear"
        vs_faster = vs_conv if faster == "conv" else vs_lin
        worst = min(worst, vs_faster)
        mark = "" if vs_faster >= 0.95 else " **miss**"
        rows.append(
            f"| {b}×{cin}×{length} → {cout} | {_fmt_time(med['conv'])} | "
            f"{_fmt_time(med['linear'])} | {_fmt_time(med['pw'])} | {choice} | {faster} | "
            f"{vs_conv:.2f}× | {vs_lin:.2f}× | {vs_faster:.2f}×{mark} | {control:.2f}× | "
            f"{n} | {_fmt_time(decide)} |"
        )
    return rows, worst


def bench_dispatch(seconds: float, device: str) -> List[str]:
    """What impl="auto" adds per call: the same module forced to the choice it made."""
    rows = []
    for b, cin, length, cout in SHAPES[:2]:
        x = torch.randn(b, cin, length, device=device)
        auto = st.PointwiseConv1d(cin, cout).to(device)
        with torch.no_grad():
            choice = "conv" if auto(x).is_contiguous() else "linear"
            forced = st.PointwiseConv1d(cin, cout, impl=choice).to(device)
            forced.load_state_dict(auto.state_dict())
            t = _paired({"forced": lambda: forced(x), "auto": lambda: auto(x)}, seconds, device)
        delta = statistics.median(a - f for a, f in zip(t["auto"], t["forced"]))
        rows.append(
            f"| {b}×{cin}×{length} → {cout} | {choice} | {_fmt_time(statistics.median(t['forced']))}"
            f" | {_fmt_time(statistics.median(t['auto']))} | {delta * 1e6:+.2f} us |"
        )
    return rows


HEADER = (
    "| B×C_in×L → C_out | Conv1d | Linear (transposed) | PointwiseConv1d | choice | "
    "faster (median) | vs Conv1d | vs Linear | vs faster (≥0.95) | A/A: Conv1d vs Conv1d | "
    "rounds | first call (decides) |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--threads",
        default="0",
        help="comma-separated torch CPU thread counts to run (0: torch's default)",
    )
    parser.add_argument("--quick", action="store_true", help="skip the seed 128x4096x256 shape")
    parser.add_argument(
        "--seconds", type=float, default=8.0, help="timing budget per shape and thread count"
    )
    parser.add_argument("--device", default="cpu", help='"cpu" (default) or "cuda"')
    args = parser.parse_args()
    default_threads = torch.get_num_threads()
    shapes = SHAPES if args.quick else SHAPES + [SEED]
    print(
        f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
        f"Python {sys.version.split()[0]}, device {args.device}, float32, forward under "
        "no_grad\n"
    )
    print("Ratios are speeds (time of the other / time of PointwiseConv1d): >1 is faster.\n")
    worst_all = float("inf")
    for threads in (int(t) for t in args.threads.split(",")):
        torch.set_num_threads(threads or default_threads)
        st.PointwiseConv1d.clear_autotune_cache()  # decisions are per thread count
        print(f"### torch.get_num_threads() = {torch.get_num_threads()}\n")
        rows, worst = bench(shapes, args.seconds, args.device)
        print(HEADER)
        print("\n".join(rows))
        print(f"\nWorst PointwiseConv1d vs faster-of-two: {worst:.2f}× (target ≥ 0.95×)\n")
        worst_all = min(worst_all, worst)
        print("Per-call cost of the decision (auto vs the same module forced to its choice):\n")
        print('| shape | choice | impl=choice | impl="auto" | auto adds |\n|---|---|---|---|---|')
        print("\n".join(bench_dispatch(args.seconds, args.device)) + "\n")
    print(f"Overall worst: {worst_all:.2f}× (target ≥ 0.95×)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
