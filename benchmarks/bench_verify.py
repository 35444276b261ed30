"""Cost of ``verify``: CRC-32 of every record of a ~1 GB torch.save file, next to torch.load.

Times, on one file from a warm page cache (read once beforehand), best of ``--repeats``:
``torch.load(weights_only=True)``, ``torch.load(weights_only=True, mmap=True)`` (which touches
no storage byte), ``verify_file`` and ``st.load(verify=True)``; prints a markdown table with
seconds, GB/s and the ratio to torch.load.

Usage: python benchmarks/bench_verify.py [--gb 1.0] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gb", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    import torch

    import safetorch as st
    from safetorch.checkpoint.verify import verify_file

    width = 4096
    layers = max(1, round(args.gb * 2**30 / (width * width * 4)))
    path = os.path.join(tempfile.mkdtemp(prefix="bench_verify_"), "model.pt")
    torch.save({f"{i}.weight": torch.randn(width, width) for i in range(layers)}, path)
    size = os.path.getsize(path)
    with open(path, "rb") as fh:  # warm the page cache
        while fh.read(1 << 24):
            pass

    def best(fn) -> float:
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return min(times)

    rows = [
        ("torch.load(weights_only=True)", lambda: torch.load(path, weights_only=True)),
        (
            "torch.load(weights_only=True, mmap=True)",
            lambda: torch.load(path, weights_only=True, mmap=True),
        ),
        ("verify_file(path)", lambda: verify_file(path)),
        ("st.load(path)", lambda: st.load(path)),
        ("st.load(path, verify=True)", lambda: st.load(path, verify=True)),
    ]
    results = [(name, best(fn)) for name, fn in rows]
    base = results[0][1]
    print(
        f"file: {size / 1e9:.2f} GB ({layers} tensors), torch {torch.__version__}, "
        f"best of {args.repeats}, threads {torch.get_num_threads()}"
    )
    print("| variant | seconds | GB/s | vs torch.load |")
    print("|---|---:|---:|---:|")
    for name, t in results:
        print(f"| {name} | {t:.3f} | {size / 1e9 / t:.2f} | {t / base:.2f}x |")
    os.unlink(path)


if __name__ == "__main__":
    main()
