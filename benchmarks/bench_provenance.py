"""The cost of trust by provenance, side by side in one run (alternated, median of repeats).

* state dict save: ``st.save`` vs ``torch.save`` (nothing is hashed: the ratio should be ~1.0);
* whole-model save: ``st.save`` (hashes while writing, recorded in the ledger) vs
  ``torch.save``;
* whole-model load: ``st.load`` of the file st.save wrote (read once into memory, hashed, then
  loaded fully) vs ``torch.load(weights_only=False)``;
* refusal of an untrusted whole-model file: ``st.load`` (a size no entry has: one stat) vs
  ``torch.load(weights_only=True)`` raising.

The ledger is a temporary ``XDG_STATE_HOME``; files live in ``/dev/shm`` where there is one
(``--dir``), so that disk writeback does not dominate the save times. Prints a markdown table.

Usage: python benchmarks/bench_provenance.py [--mb 256] [--repeats 7]
"""

from __future__ import annotations

import argparse
import os
import pickle
import statistics
import tempfile
import time
from typing import Callable, Dict, List


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=int, default=256, help="weights in MiB")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument(
        "--dir", default=None, help="where the files go (default: /dev/shm if present, else tmp)"
    )
    args = parser.parse_args()
    os.environ["XDG_STATE_HOME"] = tempfile.mkdtemp(prefix="st-bench-state-")
    import torch

    import safetorch as st

    n = max(1, args.mb // 16)
    model = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(n)])
    sd = model.state_dict()
    small = {f"layer{i}.weight": torch.randn(16) for i in range(2000)}  # many small tensors
    base = args.dir or ("/dev/shm" if os.path.isdir("/dev/shm") else None)
    work = tempfile.mkdtemp(prefix="st-bench-", dir=base)
    names = ("sd_t", "sd_s", "sm_t", "sm_s", "m_t", "m_s", "plain")
    p = {k: os.path.join(work, f"{k}.pt") for k in names}
    torch.save(model, p["plain"])
    st.save(model, p["m_s"])

    def refuse_st() -> None:
        try:
            st.load(p["plain"])
        except st.UnsafeCheckpointError:
            pass

    def refuse_torch() -> None:
        try:
            torch.load(p["plain"], weights_only=True)
        except pickle.UnpicklingError:
            pass

    pairs: Dict[str, List[Callable[[], object]]] = {
        "state dict save": [lambda: st.save(sd, p["sd_s"]), lambda: torch.save(sd, p["sd_t"])],
        "state dict save, 2,000 small tensors": [
            lambda: st.save(small, p["sm_s"]),
            lambda: torch.save(small, p["sm_t"]),
        ],
        "whole-model save": [
            lambda: st.save(model, p["m_s"]),
            lambda: torch.save(model, p["m_t"]),
        ],
        "whole-model load": [
            lambda: st.load(p["m_s"]),
            lambda: torch.load(p["m_s"], weights_only=False),
        ],
        "untrusted whole-model refusal": [refuse_st, refuse_torch],
    }
    rows = []
    for label, (ours, theirs) in pairs.items():
        a: List[float] = []
        b: List[float] = []
        for _ in range(args.repeats):
            for fn, out in ((ours, a), (theirs, b)):
                t = time.perf_counter()
                fn()
                out.append(time.perf_counter() - t)
        ma, mb = statistics.median(a), statistics.median(b)
        rows.append((label, ma, mb, ma / mb))
    size = os.path.getsize(p["m_s"]) / 2**20
    print(f"weights: {size:.0f} MiB, torch {torch.__version__}, repeats {args.repeats}\n")
    print("| case | safetorch (s) | torch (s) | ratio |")
    print("|---|---|---|---|")
    for label, ma, mb, r in rows:
        print(f"| {label} | {ma:.4f} | {mb:.4f} | {r:.2f}x |")


if __name__ == "__main__":
    main()
