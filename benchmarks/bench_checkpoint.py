"""Loading a ~1 GB DataParallel checkpoint into a plain model: torch.load vs mmap vs st.

Each variant runs in its own process (fresh peak RSS from resource.getrusage); the file is
read once beforehand so every variant starts from a warm page cache. Prints a markdown table
with times and peak RSS, and the ratios the issue targets.

Usage: python benchmarks/bench_checkpoint.py [--gb 1.0] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

VARIANTS = {
    "a": "torch.load + dict comprehension + load_state_dict",
    "b": "torch.load(mmap=True) + dict comprehension + load_state_dict",
    "c": "st.load_state_dict(model, path)",
}


def build_model(gb: float):
    import torch

    width = 4096
    layers = max(1, round(gb * 2**30 / (width * width * 4)))
    with torch.device("meta"):
        model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
    return model.to_empty(device="cpu")


def child(variant: str, path: str, gb: float) -> None:
    import torch

    import safetorch as st

    model = build_model(gb)
    start = time.perf_counter()
    if variant == "c":
        report = st.load_state_dict(model, path)
        assert report.ok
    else:
        kwargs = {"mmap": True} if variant == "b" else {}
        sd = torch.load(path, map_location="cpu", weights_only=True, **kwargs)
        sd = {k[len("module.") :] if k.startswith("module.") else k: v for k, v in sd.items()}
        model.load_state_dict(sd)
    seconds = time.perf_counter() - start
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"seconds": seconds, "peak_rss_mb": peak_kib / 1024}))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gb", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--child", nargs=2, metavar=("VARIANT", "PATH"))
    args = parser.parse_args()
    if args.child:
        child(args.child[0], args.child[1], args.gb)
        return
    import torch

    directory = tempfile.mkdtemp(prefix="bench_ckpt_")
    path = os.path.join(directory, "dp.pt")
    model = build_model(args.gb)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_()
    torch.save(torch.nn.DataParallel(model).state_dict(), path)
    size_gb = os.path.getsize(path) / 2**30
    del model
    with open(path, "rb") as fh:  # warm the page cache for every variant alike
        while fh.read(64 << 20):
            pass
    results = {v: [] for v in VARIANTS}
    for _ in range(args.repeats):
        for v in VARIANTS:  # interleaved, so drift hits every variant
            out = subprocess.run(
                [sys.executable, __file__, "--gb", str(args.gb), "--child", v, path],
                capture_output=True,
                text=True,
                check=True,
            )
            results[v].append(json.loads(out.stdout.strip().splitlines()[-1]))
    os.unlink(path)
    os.rmdir(directory)
    best = {v: min(r["seconds"] for r in rs) for v, rs in results.items()}
    rss = {v: max(r["peak_rss_mb"] for r in rs) for v, rs in results.items()}
    print(f"checkpoint: {size_gb:.2f} GB, best of {args.repeats}, torch {torch.__version__}\n")
    print("| variant | time (s) | peak RSS (MB) | time vs (c) | RSS vs (c) |")
    print("|---|---|---|---|---|")
    for v, label in VARIANTS.items():
        print(
            f"| ({v}) {label} | {best[v]:.3f} | {rss[v]:.0f} | "
            f"{best[v] / best['c']:.2f}x | {rss[v] / rss['c']:.2f}x |"
        )
    print(
        f"\n(c) is {best['a'] / best['c']:.2f}x faster than (a) (target >= 3x); "
        f"(c)/(b) time {best['c'] / best['b']:.2f} (target <= 1.1), "
        f"(c)/(b) peak RSS {rss['c'] / rss['b']:.2f} (target <= 1.1)"
    )


if __name__ == "__main__":
    main()
