"""Benchmark first use: ``import safetorch`` and the first ``st.load``, each in a fresh process.

Targets (issue 24): ``import safetorch`` costs <= 50 ms over ``import torch``, and the first use
of one name imports only the subpackage that defines it (``st.load``: ``safetorch.checkpoint``,
not ``safetorch.nn``, ``safetorch.patching`` or ``safetorch.data``). Each case runs in its own
interpreter, ``--repeat`` times, interleaved so that every case sees the same load; the table
shows the median and the minimum of the in-process times (interpreter start-up excluded) and
the median wall clock of the whole process (start-up included). Imports read bytecode, as
from an installed package (written once to a temporary ``PYTHONPYCACHEPREFIX``).

Cases:

* ``import torch``;
* ``import safetorch`` (alone: torch is not imported) and ``import safetorch.check`` (the
  torch-free checker);
* ``import torch; import safetorch``: the second import's cost over torch's;
* the first ``torch.load`` of a small checkpoint vs the first ``st.load`` of the same file,
  imports included (``st.load`` imports torch itself);
* the first ``st.load_state_dict`` of that file (a cold load: the checkpoint modules it
  imports included) vs torch's ``load_state_dict(torch.load(mmap=True))``; the second table
  lists the checkpoint modules the cold load imported (it must not import the saver, resume
  state, RNG, DCP, verify or the CLI).

Prints markdown tables and the safetorch modules each case imported. Usage::

    python benchmarks/bench_import.py [--repeat 7]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Tuple

REPO = Path(__file__).resolve().parents[1]

# Each child prints {"ms": in-process milliseconds of the timed statements, "modules": [...]}.
# `setup` runs before the clock starts (inside the same fresh process).
_CHILD = """
import json, sys, time
{setup}
t0 = time.perf_counter()
{timed}
ms = (time.perf_counter() - t0) * 1e3
mods = sorted(m for m in sys.modules if m == "safetorch" or m.startswith("safetorch."))
print(json.dumps({{"ms": ms, "modules": mods, "torch": "torch" in sys.modules}}))
"""

# (label, setup, timed statements); {path} is the checkpoint file.
_CASES: List[Tuple[str, str, str]] = [
    ("import torch", "", "import torch"),
    ("import safetorch (alone)", "", "import safetorch"),
    ("import safetorch.check (alone)", "", "import safetorch.check"),
    ("import safetorch, after import torch", "import torch", "import safetorch"),
    (
        "first torch.load (import torch included)",
        "",
        "import torch\ntorch.load({path!r}, map_location='cpu', weights_only=True)",
    ),
    (
        "first st.load (import safetorch + torch included)",
        "",
        "import safetorch as st\nst.load({path!r})",
    ),
    (
        "st.load first use, after import torch + safetorch",
        "import torch, safetorch as st",
        "st.load({path!r})",
    ),
    (
        "torch.load first use, after import torch",
        "import torch",
        "torch.load({path!r}, map_location='cpu', weights_only=True)",
    ),
    (
        "st.load_state_dict first use (one file), after import torch + safetorch",
        "import torch, safetorch as st\nm = torch.nn.Linear(64, 64)",
        "st.load_state_dict(m, {path!r})",
    ),
    (
        "load_state_dict(torch.load(mmap=True)) first use, after import torch",
        "import torch\nm = torch.nn.Linear(64, 64)",
        "m.load_state_dict(torch.load({path!r}, map_location='cpu', weights_only=True, mmap=True))",
    ),
]


def _run(
    setup: str, timed: str, path: str, env: Dict[str, str]
) -> Tuple[float, float, Dict[str, Any]]:
    code = _CHILD.format(setup=setup.format(path=path), timed=timed.format(path=path))
    start = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, check=True
    )
    wall = (time.perf_counter() - start) * 1e3
    result = json.loads(out.stdout.strip().splitlines()[-1])
    return float(result["ms"]), wall, result


def _checkpoint(directory: str) -> str:
    import torch

    path = str(Path(directory) / "small.pt")
    torch.save({"weight": torch.randn(64, 64), "bias": torch.zeros(64)}, path)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        path = _checkpoint(tmp)
        # Bytecode as an installed package has it (pip compiles at install time), kept out of
        # the repository; PYTHONDONTWRITEBYTECODE would make every import compile its source.
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env["PYTHONPYCACHEPREFIX"] = str(Path(tmp) / "pycache")
        for _, setup, timed in _CASES:  # warm the file cache and write the bytecode once
            _run(setup, timed, path, env)
        times: Dict[str, List[Tuple[float, float]]] = {label: [] for label, _, _ in _CASES}
        last: Dict[str, Dict[str, Any]] = {}
        for _ in range(args.repeat):
            for label, setup, timed in _CASES:
                ms, wall, result = _run(setup, timed, path, env)
                times[label].append((ms, wall))
                last[label] = result

    import torch

    print(
        f"### Run: {time.strftime('%Y-%m-%d')} — torch {torch.__version__}, "
        f"Python {platform.python_version()}, {platform.machine()}, "
        f"{args.repeat} fresh processes per case\n"
    )
    print("| case | median ms | min ms | process wall ms (median) | torch imported |")
    print("|---|---:|---:|---:|---|")
    for label, _, _ in _CASES:
        ms = [m for m, _ in times[label]]
        wall = [w for _, w in times[label]]
        print(
            f"| {label} | {statistics.median(ms):.1f} | {min(ms):.1f} | "
            f"{statistics.median(wall):.0f} | {'yes' if last[label]['torch'] else 'no'} |"
        )

    over = statistics.median(m for m, _ in times["import safetorch, after import torch"])
    print(f"\n`import safetorch` over `import torch`: {over:.1f} ms (target <= 50 ms).")
    first_st = statistics.median(
        m for m, _ in times["st.load first use, after import torch + safetorch"]
    )
    first_torch = statistics.median(m for m, _ in times["torch.load first use, after import torch"])
    print(
        f"First `st.load` call over the first `torch.load` call (both after their imports): "
        f"{first_st - first_torch:.1f} ms ({first_st:.1f} vs {first_torch:.1f} ms)."
    )

    first_lsd = statistics.median(
        m
        for m, _ in times["st.load_state_dict first use (one file), after import torch + safetorch"]
    )
    first_mmap = statistics.median(
        m for m, _ in times["load_state_dict(torch.load(mmap=True)) first use, after import torch"]
    )
    print(
        f"First `st.load_state_dict` of one file over torch's mmap load + `load_state_dict` "
        f"(imports included): {first_lsd - first_mmap:.1f} ms ({first_lsd:.1f} vs "
        f"{first_mmap:.1f} ms)."
    )
    cold = last["st.load_state_dict first use (one file), after import torch + safetorch"]
    stages = sorted(m.split(".", 2)[2] for m in cold["modules"] if m.count(".") == 2)
    print(f"\nA cold `st.load_state_dict` of one file imports: {', '.join(stages)}.")

    print("\n| case | safetorch modules imported |")
    print("|---|---|")
    for label in (
        "import safetorch (alone)",
        "import safetorch.check (alone)",
        "first st.load (import safetorch + torch included)",
    ):
        modules: List[str] = last[label]["modules"]
        subpackages = sorted({m.split(".")[1] for m in modules if "." in m})
        print(
            f"| {label} | {len(modules)} modules; under safetorch: {', '.join(subpackages) or '-'} |"
        )


if __name__ == "__main__":
    main()
