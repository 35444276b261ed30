"""`make demo`: a tour of safetorch, one section per area (each a script in examples/)."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SECTIONS = [
    "demo_tensor.py",
]


def main() -> int:
    for name in SECTIONS:
        print(f"\n=== {name} ===", flush=True)
        sys.argv = [str(HERE / name)]
        runpy.run_path(str(HERE / name), run_name="__main__")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
