"""`make demo`: a tour of safetorch, one section per area (each a script in examples/)."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SECTIONS = [
    "demo_tensor.py",  # safe_copy, checked indexing, deferred errors, device helpers
    "demo_checkpoint.py",  # a DataParallel checkpoint into a plain model, with its report
    "demo_nn.py",  # lint_model finds and fixes conv-bias-before-BN
    "demo_data.py",  # a PinnedBatch DataLoader, check_loader, a cuda_timer measurement
    "demo_patch.py",  # the legacy example under `safetorch run`, with the report
    "demo_check.py",  # `safetorch check` find / diff / fix
]


def main() -> int:
    for name in SECTIONS:
        print(f"\n=== {name} ===", flush=True)
        sys.argv = [str(HERE / name)]
        try:
            runpy.run_path(str(HERE / name), run_name="__main__")
        except SystemExit as exit_:  # a section ending with sys.exit(main()) must not end the tour
            if exit_.code not in (None, 0):
                print(f"{name} exited with {exit_.code!r}", file=sys.stderr)
                return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
