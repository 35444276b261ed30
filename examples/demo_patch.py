"""Monkeypatch mode: run the legacy training script under `safetorch run` and show the report.

examples/legacy/train_legacy.py fails under plain python on a CPU machine (a DataParallel
checkpoint loaded into a plain model). Under `safetorch run` it trains, prints the same numbers
as its hand-fixed twin, and reports every fix with its first call site.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch.nn.functional as F

import safetorch as st

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    print("patches:", ", ".join(p.name for p in st.patches()))
    with st.patched("upsample"):
        print(
            "inside st.patched('upsample'): F.upsample_bilinear ->",
            F.upsample_bilinear.__wrapped__.__name__,
            "wrapped",
        )
    print("after: restored =", not hasattr(F.upsample_bilinear, "__wrapped__"))
    cmd = [
        sys.executable,
        "-m",
        "safetorch",
        "run",
        "examples/legacy/train_legacy.py",
        "--epochs",
        "1",
    ]
    print("$", " ".join(["safetorch", *cmd[3:]]), flush=True)
    return subprocess.run(cmd, cwd=ROOT, stderr=subprocess.STDOUT).returncode


if __name__ == "__main__":
    raise SystemExit(main())
