"""Demo of ``safetorch check``: find, explain, diff and fix PyTorch pitfalls in a legacy script.

Usage: ``python examples/demo_check.py [PATH ...]`` -- with paths (e.g. ``examples/legacy``) it
only checks them; without, it writes a small legacy training script to a temporary directory
and walks through check -> --diff -> --fix -> check again.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from safetorch._cli import main as safetorch_main

LEGACY = """\
import argparse
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

parser = argparse.ArgumentParser()
parser.add_argument("configs", default="configs/base.yaml")

net = nn.Sequential(nn.Conv2d(3, 16, 3), nn.BatchNorm2d(16), nn.ReLU()).cuda()
net = nn.DataParallel(net)
net.load_state_dict(torch.load("init.pt"), strict=False)

x = torch.randn(8, 3, 32, 32).cuda()
t0 = time.time()
y = F.upsample_bilinear(net(x), scale_factor=2)
print("forward took", time.time() - t0)
torch.save(net.state_dict(), "model.pt")
"""


def cli(*argv: str) -> int:
    print(f"\n$ safetorch check {' '.join(argv)}", flush=True)
    code = safetorch_main(["check", *argv])
    print(f"(exit status {code})", flush=True)
    return code


def main(paths: list) -> int:
    if paths:
        return cli("--exit-zero", *paths)
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "train.py"
        script.write_text(LEGACY)
        cli(str(script))
        cli("--explain", "ST001")
        cli("--diff", str(script))
        cli("--fix", str(script))
        print("\nWhat remains needs a human (or the safetorch function each message names).")
        cli("--format", "json", "--select", "ST011", str(script))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
