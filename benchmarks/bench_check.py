"""Benchmark ``safetorch check``: lines per second on a generated corpus, side by side with TorchFix.

The corpus is generated (>= 50,000 lines of training-script-like code, deterministic), then
checked in one run by:

* ``safetorch check`` in one process on one core (the checker itself, no startup);
* ``safetorch check -j 1`` and ``-j N`` as subprocesses (wall clock, startup included);
* ``torchfix --select ALL -j 1`` when installed (``TORCHFIX=/path/to/torchfix`` or on PATH);
* the parse step alone: ``ast.parse`` vs ``libcst.parse_module`` (when libcst is importable by
  the TorchFix interpreter) -- the measurement behind the ast-vs-libcst design note.

Prints markdown tables. Usage::

    python benchmarks/bench_check.py [--lines 67200] [--jobs 2] [--no-torchfix]
"""

from __future__ import annotations

import argparse
import ast
import os
import random
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# Snippets of legacy training code. {i} makes every copy distinct.
_SNIPPETS = [
    """\
class Block{i}(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, padding=1)
        self.bn = nn.BatchNorm2d(cout)
        self.drop = nn.Dropout(0.1)

    def forward(self, x):
        x = self.bn(self.conv(x))
        x = F.relu(x)
        return self.drop(x)
""",
    """\
def make_head{i}(cin, classes):
    return nn.Sequential(
        nn.Linear(cin, 256),
        nn.BatchNorm1d(256),
        nn.ReLU(inplace=True),
        nn.Dropout(0.5),
        nn.BatchNorm1d(256),
        nn.Linear(256, classes),
    )
""",
    """\
def decode{i}(feats, size):
    up = F.upsample(feats, size=size, mode="bilinear")
    up2 = F.upsample_bilinear(feats, scale_factor=2)
    up3 = F.interpolate(feats, scale_factor=2, mode="nearest")
    return up + up2 + up3
""",
    """\
def restore{i}(model, path):
    state = torch.load(path)
    model.load_state_dict(state["model"], strict=False)
    other = torch.load(path, map_location="cpu", weights_only=True)
    return other
""",
    """\
def train_step{i}(model, batch, opt):
    x, y = batch
    x = x.cuda(non_blocking=True)
    t0 = time.time()
    out = model(x)
    loss = F.cross_entropy(out, y.cuda())
    opt.zero_grad()
    loss.backward()
    opt.step()
    t1 = time.time()
    ema = out.detach()
    ema.mul_(0.9)
    return loss.item(), t1 - t0
""",
    """\
def parse_args{i}():
    parser = argparse.ArgumentParser(description="train {i}")
    parser.add_argument("configs", default="configs/base.yaml")
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--epochs", type=int, default=90)
    parser.add_argument("--out", default="runs/{i}")
    return parser.parse_args()
""",
    """\
class Batch{i}:
    def __init__(self, images, labels):
        self.images = images
        self.labels = labels


def collate{i}(samples):
    images = torch.stack([s[0] for s in samples])
    labels = torch.tensor([s[1] for s in samples])
    return Batch{i}(images, labels)


def make_loader{i}(dataset):
    return DataLoader(dataset, batch_size=64, shuffle=True, num_workers=4,
                      pin_memory=True, collate_fn=collate{i})
""",
    """\
def distribute{i}(model, rank):
    model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    model = DDP(model.cuda(rank), device_ids=[rank])
    return model


def save{i}(model, path, epoch):
    model = nn.DataParallel(model)
    torch.save({{"model": model.state_dict(), "epoch": epoch}}, path)
""",
    """\
def evaluate{i}(model, loader):
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for images, labels in loader:
            images = images.to("cuda", non_blocking=True)
            labels = labels.to("cuda", non_blocking=True)
            logits = model(images)
            correct += (logits.argmax(1) == labels).sum().item()
            total += labels.numel()
    return correct / max(total, 1)
""",
    """\
def schedule{i}(opt, epoch, base_lr, warmup=5):
    if epoch < warmup:
        lr = base_lr * (epoch + 1) / warmup
    else:
        lr = base_lr * 0.5 * (1 + math.cos(math.pi * epoch / 90))
    for group in opt.param_groups:
        group["lr"] = lr
    return lr
""",
]
_HEADER = """\
import argparse
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader

"""


def generate_corpus(root: Path, total_lines: int, lines_per_file: int = 336) -> Tuple[int, int]:
    """Write deterministic legacy-style files under ``root``; return (files, lines)."""
    rng = random.Random(0)
    files = lines = i = 0
    while lines < total_lines:
        parts = [_HEADER]
        count = _HEADER.count("\n")
        while count < lines_per_file:
            snippet = rng.choice(_SNIPPETS).format(i=i) + "\n\n"
            i += 1
            parts.append(snippet)
            count += snippet.count("\n")
        text = "".join(parts)
        (root / f"train_{files:04d}.py").write_text(text)
        files += 1
        lines += text.count("\n")
    return files, lines


def _timed(cmd: List[str], env: Optional[Dict[str, str]] = None) -> Tuple[float, float, str]:
    """Run ``cmd``; return (wall seconds, CPU seconds of the child, stdout)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, out.stdout


def _codes(output: str) -> Counter:
    return Counter(re.findall(r":\d+:\d+: ([A-Z]+\d+) ", output))


def _cpu_all() -> float:
    """CPU seconds used by this process and its reaped children so far."""
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    return total


def _best(fn: Callable[[], object], repeat: int) -> Tuple[float, float]:
    """Best (wall, CPU) seconds of ``repeat`` calls of ``fn`` in this process."""
    wall = cpu = float("inf")
    for _ in range(repeat):
        w, c = time.perf_counter(), time.process_time()
        fn()
        wall = min(wall, time.perf_counter() - w)
        cpu = min(cpu, time.process_time() - c)
    return wall, cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--lines", type=int, default=67_200, help="corpus size (>= 50,000)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="-j to compare")
    parser.add_argument("--no-torchfix", action="store_true", help="skip TorchFix")
    parser.add_argument("--repeat", type=int, default=3, help="best of N for in-process timings")
    args = parser.parse_args()

    from safetorch.check import check_paths

    root = Path(tempfile.mkdtemp(prefix="safetorch-bench-check-"))
    try:
        n_files, n_lines = generate_corpus(root, args.lines)
        sources = [p.read_text() for p in sorted(root.glob("*.py"))]
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
        print(f"corpus: {n_files} files, {n_lines:,} lines; load average at start {load:.1f}\n")

        results: list = []

        def check_serial() -> None:
            results[:] = check_paths([str(root)], jobs=1)

        rows: List[Tuple[str, float, float, str]] = []
        wall1, cpu1 = _best(check_serial, args.repeat)
        ours = Counter(d.code for r in results for d in r.diagnostics)
        rows.append(("safetorch check, in-process, -j 1", wall1, cpu1, ""))

        def parse_all() -> None:
            for src in sources:  # one tree alive at a time, as in the checker
                ast.parse(src)

        pw, pc = _best(parse_all, args.repeat)
        rows.append(("  of which ast.parse alone", pw, pc, ""))
        wallj = cpuj = float("inf")
        for _ in range(args.repeat):
            before = _cpu_all()
            start = time.perf_counter()
            check_paths([str(root)], jobs=args.jobs)
            wallj = min(wallj, time.perf_counter() - start)
            cpuj = _cpu_all() - before  # this process + the (reaped) workers
        rows.append(
            (
                f"safetorch check, in-process, -j {args.jobs}",
                wallj,
                cpuj,
                f"wall {wall1 / wallj:.2f}x faster than -j 1 (CPU: all processes)",
            )
        )

        # End to end: interpreter start + `import safetorch` (which imports torch) + check.
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        cli = [sys.executable, "-m", "safetorch", "check", "--exit-zero"]
        w, c, out = _timed([*cli, "-j", "1", str(root)], env)
        assert sum(_codes(out).values()) == sum(ours.values()), "CLI and API disagree"
        rows.append(("`python -m safetorch check -j 1` (CLI)", w, c, ""))
        w, c, _ = _timed([sys.executable, "-c", "import safetorch.check"], env)
        rows.append(("  of which `import safetorch.check` (standard library only)", w, c, ""))

        torchfix = os.environ.get("TORCHFIX") or shutil.which("torchfix")
        theirs: Counter = Counter()
        tf_cpu = None
        if torchfix and not args.no_torchfix:
            w, tf_cpu, tf_out = _timed([torchfix, "--select", "ALL", "-j", "1", str(root)])
            theirs = _codes(tf_out)
            rows.append(("`torchfix --select ALL -j 1` (CLI)", w, tf_cpu, ""))
            # libcst's parse alone, with TorchFix's interpreter (libcst comes with TorchFix).
            code = (
                "import sys, time, glob, libcst\n"
                "srcs = [open(p).read() for p in sorted(glob.glob(sys.argv[1] + '/*.py'))]\n"
                "w, c = time.perf_counter(), time.process_time()\n"
                "for s in srcs: libcst.parse_module(s)\n"
                "print(time.perf_counter() - w, time.process_time() - c)\n"
            )
            tf_python = str(Path(torchfix).with_name("python"))
            res = subprocess.run([tf_python, "-c", code, str(root)], capture_output=True, text=True)
            if res.returncode == 0:
                lw, lc = map(float, res.stdout.split())
                rows.append(("  libcst.parse_module alone (TorchFix's parser)", lw, lc, ""))

        print("| run | wall s | CPU s | lines per CPU s | CPU vs TorchFix | note |")
        print("|---|---:|---:|---:|---:|---|")
        for name, wall, cpu, note in rows:
            rate = f"{n_lines / cpu:,.0f}" if cpu == cpu else ""
            vs = f"{tf_cpu / cpu:.0f}x" if tf_cpu and cpu == cpu else ""
            print(f"| {name} | {wall:.2f} | {cpu:.2f} | {rate} | {vs} | {note} |")
        if tf_cpu is None:
            print("\nTorchFix not installed (set TORCHFIX=/path/to/torchfix): not compared.")

        print("\n| findings | count |")
        print("|---|---:|")
        for code, count in sorted(ours.items()):
            print(f"| safetorch {code} | {count} |")
        print(f"| **safetorch total** | **{sum(ours.values())}** |")
        for code, count in sorted(theirs.items()):
            print(f"| torchfix {code} | {count} |")
        if tf_cpu is not None:
            print(f"| **torchfix total** | **{sum(theirs.values())}** |")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
