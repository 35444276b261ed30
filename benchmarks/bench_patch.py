"""Monkeypatch-mode overhead: a CPU training step with all patches vs none, and per call.

Prints markdown tables of ratios measured side by side in one run (interleaved, medians).
Run: .venv/bin/python benchmarks/bench_patch.py [--steps 40] [--repeat 15]
"""

from __future__ import annotations

import argparse
import io
import platform
import statistics
import time
import warnings
from typing import Any, Callable, List, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.data._utils.pin_memory as torch_pin

import safetorch as st

warnings.simplefilter("ignore")  # torch's deprecation warnings on the unpatched side


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(32)
        self.head = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.upsample_bilinear(x, scale_factor=2)  # a patched op inside the step
        x = F.relu(self.bn2(self.conv2(x)))
        return self.head(x.mean(dim=(2, 3)))


def bench_training_step(steps: int) -> Tuple[float, float]:
    torch.manual_seed(0)
    model = SmallCNN()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(32, 3, 32, 32)
    y = torch.randint(0, 10, (32,))
    idx = torch.randperm(32)

    def step() -> float:
        t0 = time.perf_counter()
        xb, yb = x[idx], y[idx]  # fancy indexing (patched: CPU fast path)
        loss = F.cross_entropy(model(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return time.perf_counter() - t0

    for _ in range(5):
        step()
    plain: List[float] = []
    patched: List[float] = []
    for i in range(2 * steps):  # interleaved, order alternating
        on = (i % 4) in (1, 2)
        if on:
            st.patch()
            patched.append(step())
            st.unpatch()
        else:
            plain.append(step())
    return statistics.median(plain), statistics.median(patched)


def _per_call(fn: Callable[[], Any], number: int, repeat: int) -> List[float]:
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        out.append((time.perf_counter() - t0) / number)
    return out


def bench_calls(repeat: int) -> List[Tuple[str, str, float, float]]:
    x4 = torch.randn(1, 2, 4, 4)
    x = torch.arange(64.0).reshape(8, 8)
    i = torch.tensor([1, 5, 2])
    gi = torch.tensor([[1, 0], [2, 3]])
    buf = io.BytesIO()
    torch.save({"w": torch.ones(4, 4)}, buf)
    data = buf.getvalue()
    lin, lin_sd = nn.Linear(8, 8), nn.Linear(8, 8).state_dict()
    bn_model = nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4))
    batch = {"ids": [1, 2, 3], "name": "x"}
    cases: List[Tuple[str, str, Callable[[], Any], int]] = [
        ("upsample", "F.upsample", lambda: F.upsample(x4, scale_factor=2), 500),
        ("upsample", "F.upsample_nearest", lambda: F.upsample_nearest(x4, scale_factor=2), 500),
        ("upsample", "F.upsample_bilinear", lambda: F.upsample_bilinear(x4, scale_factor=2), 500),
        ("load", "torch.load (BytesIO, 1 tensor)", lambda: torch.load(io.BytesIO(data)), 50),
        (
            "state_dict",
            "Module.load_state_dict (keys match)",
            lambda: lin.load_state_dict(lin_sd),
            300,
        ),
        ("index", "x[idx] (CPU)", lambda: x[i], 2000),
        ("index", "x.index_select (CPU)", lambda: x.index_select(0, i), 2000),
        ("index", "x.gather (CPU)", lambda: x.gather(1, gi), 2000),
        ("index", "torch.index_select (CPU)", lambda: torch.index_select(x, 0, i), 2000),
        ("index", "torch.gather (CPU)", lambda: torch.gather(x, 1, gi), 2000),
        (
            "pin_memory",
            "_utils.pin_memory.pin_memory (no accelerator)",
            lambda: torch_pin.pin_memory(batch),
            2000,
        ),
        (
            "syncbn",
            "SyncBatchNorm.convert_sync_batchnorm (2 layers)",
            lambda: nn.SyncBatchNorm.convert_sync_batchnorm(bn_model),
            200,
        ),
    ]
    rows = []
    for patch, label, fn, number in cases:
        fn()
        plain: List[float] = []
        patched: List[float] = []
        for r in range(repeat):
            if r % 2:
                plain += _per_call(fn, number, 1)
                with st.patched(patch):
                    fn()
                    patched += _per_call(fn, number, 1)
            else:
                with st.patched(patch):
                    fn()
                    patched += _per_call(fn, number, 1)
                plain += _per_call(fn, number, 1)
        rows.append((patch, label, statistics.median(plain), statistics.median(patched)))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=40, help="steps per side (>= 30)")
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(
        f"torch {torch.__version__}, Python {platform.python_version()}, {platform.machine()}, 1 thread"
    )
    plain, patched = bench_training_step(args.steps)
    print(
        "\n| CPU training step (SmallCNN, batch 32, fwd+bwd+SGD) | none (ms) | all patches (ms) | ratio |"
    )
    print("|---|---|---|---|")
    print(
        f"| median of {args.steps} interleaved steps | {plain * 1e3:.2f} | {patched * 1e3:.2f} | {patched / plain:.3f}x |"
    )
    print("\n| patch | call | original (us) | patched (us) | ratio | added (us) |")
    print("|---|---|---|---|---|---|")
    for patch, label, p, q in bench_calls(args.repeat):
        print(
            f"| {patch} | {label} | {p * 1e6:.2f} | {q * 1e6:.2f} | {q / p:.2f}x | {(q - p) * 1e6:+.2f} |"
        )
    print(
        "\nupsample: the original warns (deprecation) on every call, the patch does not; "
        "syncbn: torch converts, st.convert_sync_batchnorm (auto) keeps BatchNorm without a "
        "process group; pin_memory: torch walks the batch, st.pin returns it at once without "
        "an accelerator."
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
