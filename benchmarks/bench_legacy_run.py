"""What ``safetorch run`` costs, per script (issues 22.6 and 34), side by side with plain python.

For each script of ``tests/legacy/scripts/manifest.json`` whose legacy copy runs under the
shims, three commands, each step in a fresh process: plain ``python`` on the hand-modernised
copy (``<name>/modern``), ``python -m safetorch run`` on that same modernised copy (what the
patches cost code that needs none of them: the target is at most 1.05x per script), and
``safetorch run`` on the unedited legacy copy (``<name>/legacy``). Each is the best of
``--repeat`` runs per step (the commands alternate, so drift of a shared machine hits all)
of the child's CPU time (user + system: steadier than wall time where other jobs share the
cores; wall time is shown for the modernised copy too), summed over the script's steps (its
``bench_steps`` where the manifest gives them: the same scripts with more iterations, as a
real run has). The first line times a script that only imports torch: the fixed start-up
cost of ``safetorch run``.

    python benchmarks/bench_legacy_run.py                 # the timing table (markdown)
    python benchmarks/bench_legacy_run.py --repeat 7 --only mnist,vae
    python benchmarks/bench_legacy_run.py --outcomes      # plain / run / fixed table
    python benchmarks/bench_legacy_run.py --instructions  # the same ratio in instructions

``--instructions`` counts the user-space instructions of each step (valgrind's cachegrind,
children included, one run per step after a warm-up run): the per-script ratio that CPU
seconds on a shared machine cannot show (they swing by 10% from run to run there). It
leaves out kernel time (file writes), which the timing table's wall ratio covers.

``--outcomes`` prints what ``tests/legacy/test_legacy_scripts.py`` asserts: whether plain
python runs the legacy copy, whether ``safetorch run`` does, and whether plain python runs
the copy ``safetorch check --fix --unsafe-fixes`` wrote. Child processes get
``OMP_NUM_THREADS=1`` (steady timings on a shared machine; the scripts are small) and
bytecode caching on, as in an installed package.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "tests" / "legacy" / "scripts"
RUN = ["-m", "safetorch", "run", "--no-report"]


def manifest() -> List[Dict]:
    return json.loads((SCRIPTS / "manifest.json").read_text())["scripts"]


def child_env() -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAFETORCH_")}
    env.update(OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    # As installed: bytecode is cached (a sandbox that sets PYTHONDONTWRITEBYTECODE would
    # make every run compile safetorch's modules again, about 0.25 s).
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_step(workdir: Path, step: Sequence[str], shim: bool) -> Tuple[int, float, float, str]:
    """(exit status, CPU seconds, wall seconds, stderr) of one step in a fresh process."""
    cmd = [sys.executable, *(RUN if shim else []), *step]
    cpu, start = _children_cpu(), time.perf_counter()
    proc = subprocess.run(cmd, cwd=workdir, env=child_env(), capture_output=True, text=True)
    wall = time.perf_counter() - start
    return proc.returncode, _children_cpu() - cpu, wall, proc.stderr


def prepare(tmp: Path, name: str, flavour: str, suffix: str = "") -> Path:
    target = tmp / f"{name}-{flavour}{suffix}"
    shutil.copytree(SCRIPTS / name / ("modern" if flavour == "modern" else "legacy"), target)
    if flavour == "fixed":
        sys.path.insert(0, str(ROOT))
        from safetorch._cli import main

        argv = ["check", "--fix", "--unsafe-fixes", "--isolated", "--exit-zero", str(target)]
        with open(os.devnull, "w") as sink:
            stdout, stderr, sys.stdout, sys.stderr = sys.stdout, sys.stderr, sink, sink
            try:
                main(argv)
            finally:
                sys.stdout, sys.stderr = stdout, stderr
    return target


# CPU seconds [python modern, run modern, run legacy], then wall seconds in the same order.
Times = List[float]


def time_script(entry: Dict, repeat: int, tmp: Path) -> Optional[Times]:
    modern = prepare(tmp, entry["name"], "modern")
    modern_run = prepare(tmp, entry["name"], "modern", "-run")  # its own working directory
    legacy = prepare(tmp, entry["name"], "legacy")
    commands = ((modern, False), (modern_run, True), (legacy, True))
    totals = [0.0] * 6
    steps = entry.get("bench_steps", entry["steps"])
    setup = entry.get("setup", 0)  # writes the data the original downloaded: not timed
    for step in steps[:setup]:
        for where, _ in commands:
            run_step(where, step, False)
    for step in steps[setup:]:
        best = [float("inf")] * 6
        for _ in range(repeat):
            for i, (where, shim) in enumerate(commands):
                code, cpu, wall, err = run_step(where, step, shim)
                if code:
                    print(f"{entry['name']} {step}: exit {code}\n{err[-2000:]}", file=sys.stderr)
                    return None
                best[i] = min(best[i], cpu)
                best[3 + i] = min(best[3 + i], wall)
        totals = [t + b for t, b in zip(totals, best)]
    return totals


def startup(repeat: int, tmp: Path) -> Times:
    script = tmp / "import_torch.py"
    script.write_text("import torch\n")
    best = [float("inf")] * 6
    for _ in range(repeat):
        for i, shim in enumerate((False, True, True)):
            _, cpu, wall, _ = run_step(tmp, [str(script)], shim)
            best[i], best[3 + i] = min(best[i], cpu), min(best[3 + i], wall)
    return best


def timing_table(entries: List[Dict], repeat: int) -> None:
    import torch

    print(
        f"safetorch run vs python, best of {repeat} fresh processes per step; "
        f"torch {torch.__version__}, Python {platform.python_version()}, "
        f"{os.cpu_count()} CPUs, OMP_NUM_THREADS=1, {time.strftime('%Y-%m-%d')}"
    )
    print()
    print(
        "| script | steps | CPU s: python, modernised | CPU s: safetorch run, modernised "
        "| ratio | wall ratio | CPU s: safetorch run, legacy | ratio |"
    )
    print("|---|---|---|---|---|---|---|---|")

    def row(label: str, steps: object, t: Times) -> None:
        print(
            f"| {label} | {steps} | {t[0]:.2f} | {t[1]:.2f} | {t[1] / t[0]:.3f} "
            f"| {t[4] / t[3]:.3f} | {t[2]:.2f} | {t[2] / t[0]:.3f} |"
        )

    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        row("`import torch` only", 1, startup(repeat, tmp))
        sums = [0.0] * 6
        for entry in entries:
            steps = len(entry.get("bench_steps", entry["steps"])) - entry.get("setup", 0)
            if not entry["run_completes"]:
                print(f"| {entry['name']} | {steps} | - | - | - | - | - | n/a (not shimmable) |")
                continue
            found = time_script(entry, repeat, tmp)
            if found is None:
                print(f"| {entry['name']} | {steps} | - | - | failed | - | - | - |")
                continue
            sums = [s + f for s, f in zip(sums, found)]
            row(entry["name"], steps, found)
        if sums[0]:
            row("**all**", "", sums)


_ERROR = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception))\b")


def outcome(entry: Dict, tmp: Path, flavour: str, shim: bool) -> str:
    where = prepare(tmp, entry["name"], flavour)
    for step in entry["steps"]:
        code, _, _, err = run_step(where, step, shim)
        if code:
            errors = [m.group(1) for m in map(_ERROR.match, err.splitlines()) if m]
            return f"fails in {step[0]} ({errors[-1] if errors else f'exit {code}'})"
    return "runs"


def outcomes_table(entries: List[Dict]) -> None:
    print("| script (after) | plain python | safetorch run | --fix, then plain python |")
    print("|---|---|---|---|")
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        for entry in entries:
            cells = [
                outcome(entry, tmp / "plain", "legacy", False),
                outcome(entry, tmp / "run", "legacy", True),
                outcome(entry, tmp / "fixed", "fixed", False),
            ]
            print(f"| {entry['name']} ({entry['origin']}) | " + " | ".join(cells) + " |")


# What valgrind's cachegrind prints per process: "==123== I   refs:      5,295,725,690".
_IREFS = re.compile(r"^==\d+== I\s+refs:\s+([\d,]+)", re.MULTILINE)
VALGRIND = [
    "valgrind",
    "--tool=cachegrind",
    "--cache-sim=no",
    "--trace-children=yes",  # DataLoader workers and mp.Process children count too
    "--cachegrind-out-file=/dev/null",
]


def count_step(workdir: Path, step: Sequence[str], shim: bool) -> int:
    """User-space instructions one step executes in a fresh process (its children included),
    counted by cachegrind: the same on a busy machine as on a quiet one."""
    cmd = [*VALGRIND, sys.executable, *(RUN if shim else []), *step]
    env = {**child_env(), "PYTHONHASHSEED": "0"}
    proc = subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True)
    counts = [int(m.replace(",", "")) for m in _IREFS.findall(proc.stderr)]
    if proc.returncode or not counts:
        raise RuntimeError(f"{step}: exit {proc.returncode}\n{proc.stderr[-2000:]}")
    return sum(counts)


def count_script(entry: Dict, tmp: Path) -> List[int]:
    """Instructions [python modern, run modern] over the script's timed steps. Each step
    runs once natively first (bytecode caches written, as in an installed package)."""
    modern = prepare(tmp, entry["name"], "modern")
    modern_run = prepare(tmp, entry["name"], "modern", "-run")
    commands = ((modern, False), (modern_run, True))
    steps = entry.get("bench_steps", entry["steps"])
    setup = entry.get("setup", 0)
    totals = [0, 0]
    for step in steps[:setup]:
        for where, _ in commands:
            run_step(where, step, False)
    for step in steps[setup:]:
        for i, (where, shim) in enumerate(commands):
            run_step(where, step, shim)  # warm: .pyc written, files the step leaves in place
            totals[i] += count_step(where, step, shim)
    return totals


def instructions_table(entries: List[Dict]) -> None:
    """Per script: instructions of ``safetorch run`` on the modernised copy over plain
    python's. Deterministic where CPU seconds swing by 10% on a shared machine; it leaves out
    kernel time (file writes, fsync), which the timing table's wall ratio shows."""
    import torch

    print(
        "safetorch run vs python, user-space instructions (cachegrind, children included, "
        f"PYTHONHASHSEED=0); torch {torch.__version__}, Python {platform.python_version()}, "
        f"OMP_NUM_THREADS=1, {time.strftime('%Y-%m-%d')}"
    )
    print()
    print("| script | steps | instructions: python, modernised (M) | safetorch run (M) | ratio |")
    print("|---|---|---:|---:|---:|")

    def row(label: str, steps: object, plain: int, shim: int) -> None:
        print(
            f"| {label} | {steps} | {plain / 1e6:,.1f} | {shim / 1e6:,.1f} | {shim / plain:.3f} |"
        )

    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        script = tmp / "import_torch.py"
        script.write_text("import torch\n")
        row("`import torch` only", 1, *(count_step(tmp, [str(script)], s) for s in (False, True)))
        sums = [0, 0]
        for entry in entries:
            steps = len(entry.get("bench_steps", entry["steps"])) - entry.get("setup", 0)
            if not entry["run_completes"]:
                print(f"| {entry['name']} | {steps} | - | - | n/a (not shimmable) |")
                continue
            plain, shim = count_script(entry, tmp)
            sums = [sums[0] + plain, sums[1] + shim]
            row(entry["name"], steps, plain, shim)
            sys.stdout.flush()
        if sums[0]:
            row("**all**", "", *sums)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5, help="runs per step (best of)")
    parser.add_argument("--only", default="", help="comma-separated script names")
    parser.add_argument("--outcomes", action="store_true", help="plain / run / fixed table")
    parser.add_argument(
        "--instructions",
        action="store_true",
        help="count instructions under valgrind (cachegrind) instead of timing",
    )
    args = parser.parse_args(argv)
    entries = manifest()
    if args.only:
        wanted = set(args.only.split(","))
        entries = [e for e in entries if e["name"] in wanted]
    if args.outcomes:
        outcomes_table(entries)
    elif args.instructions:
        instructions_table(entries)
    else:
        timing_table(entries, args.repeat)
    return 0


if __name__ == "__main__":
    sys.exit(main())
