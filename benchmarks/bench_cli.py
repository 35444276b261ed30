"""Benchmark the ``safetorch`` command's start-up: ``--help`` of every command and subcommand.

Each ``--help`` runs in a fresh interpreter (``python -m safetorch ... --help``), as a user
types it; the table gives the median and the best wall time of ``--repeat`` runs, and whether
torch was imported (it must not be: the argument definitions are torch-free). ``python -c
pass`` and ``python -c "import torch"`` are the baselines. Also measured: how often the
``safetorch ckpt`` progress bar redraws while 10,000 reads stream past in 1 s (at most 10).

Prints markdown tables. Usage::

    python benchmarks/bench_cli.py [--repeat 7]
"""

from __future__ import annotations

import argparse
import io
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import List, Sequence, Tuple

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

COMMANDS: List[List[str]] = [
    [],
    ["doctor"],
    ["check"],
    ["ckpt"],
    ["ckpt", "inspect"],
    ["ckpt", "convert"],
    ["ckpt", "diff"],
    ["ckpt", "verify"],
    ["ckpt", "fit"],
    ["run"],
    ["install-hook"],
    ["uninstall-hook"],
]

# Prints whether torch got imported, after the command ran in-process (as `python -m` would).
_PROBE = (
    "import sys, runpy\n"
    "sys.argv = ['safetorch', *sys.argv[1:]]\n"
    "try:\n"
    "    runpy.run_module('safetorch', run_name='__main__')\n"
    "except SystemExit:\n"
    "    pass\n"
    "sys.stderr.write('torch imported: %s\\n' % ('torch' in sys.modules))\n"
)


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": str(REPO)}


def _time(argv: Sequence[str], repeat: int) -> Tuple[float, float]:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run(argv, capture_output=True, env=_env(), check=False)
        times.append(time.perf_counter() - start)
    return statistics.median(times), min(times)


def _imports_torch(words: Sequence[str]) -> bool:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, *words, "--help"],
        capture_output=True,
        text=True,
        env=_env(),
        check=False,
    )
    return "torch imported: True" in done.stderr


def _redraws() -> Tuple[int, float]:
    """Redraws of the ckpt progress bar while 10,000 reads arrive over about one second."""
    from safetorch.checkpoint._cli_progress import _Progress

    class TTY(io.StringIO):
        def isatty(self) -> bool:
            return True

    bar = _Progress(10_000, TTY(), True)
    bar.start(10_000, "reading")
    start = time.perf_counter()
    for _ in range(10_000):
        bar.advance(1)
        time.sleep(0.0001)
    elapsed = time.perf_counter() - start
    return bar.draws, elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    import torch

    print(
        f"### Run: {time.strftime('%Y-%m-%d')} — torch {torch.__version__}, Python "
        f"{platform.python_version()}, {platform.machine()}, {os.cpu_count()} CPUs\n"
    )
    print("| command | median s | best s | imports torch |")
    print("|---|---:|---:|---|")
    for label, argv in (
        ("python -c pass", [sys.executable, "-c", "pass"]),
        ("python -c 'import torch'", [sys.executable, "-c", "import torch"]),
    ):
        median, best = _time(argv, args.repeat)
        print(f"| `{label}` (baseline) | {median:.3f} | {best:.3f} | - |")
    for words in COMMANDS:
        median, best = _time([sys.executable, "-m", "safetorch", *words, "--help"], args.repeat)
        label = " ".join(["safetorch", *words, "--help"])
        torch_in = "yes" if _imports_torch(words) else "no"
        print(f"| `{label}` | {median:.3f} | {best:.3f} | {torch_in} |")
    draws, elapsed = _redraws()
    print("\n| progress bar | redraws | seconds | redraws/s |")
    print("|---|---:|---:|---:|")
    print(f"| 10,000 reads | {draws} | {elapsed:.2f} | {draws / elapsed:.1f} |")


if __name__ == "__main__":
    main()
