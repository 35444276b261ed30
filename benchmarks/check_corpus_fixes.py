"""Every fix ``safetorch check`` offers on the labelled corpus, applied and compiled.

For each repository of ``benchmarks/check_corpus/corpus.tsv`` extracted under ``--corpus``,
this copies it to a temporary directory, lists the fixes ``check --select ALL,PREVIEW``
offers (safe and unsafe), applies them all with ``--fix --unsafe-fixes``, and compiles every
file the fixer changed (a file that compiled before must compile after). It prints a table
per rule (fixes offered, files changed, files that no longer compile) and, with ``--list``,
every unsafe fix as ``repo path:line CODE`` (the corpus README records a verdict for each).
Nothing under ``--corpus`` is written. Without the corpus it says so and exits 0.

Usage::

    python benchmarks/check_corpus_fixes.py --corpus /tmp/corpus [--list]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections import Counter, defaultdict
from pathlib import Path
from typing import Dict, List, Optional, Tuple

REPO = Path(__file__).resolve().parents[1]
DATA = Path(__file__).resolve().parent / "check_corpus"


def _check(cwd: Path, target: str, *extra: str) -> List[dict]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    cmd = [sys.executable, "-m", "safetorch", "check", "--isolated", "--exit-zero"]
    cmd += ["--select", "ALL,PREVIEW", "--output-format", "json", *extra, target]
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"safetorch check failed on {target}: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout or "[]")


def compiles(path: Path) -> bool:
    """True when ``path`` compiles as Python 3 source."""
    try:
        compile(path.read_bytes(), str(path), "exec", dont_inherit=True)
    except (SyntaxError, ValueError):
        return False
    return True


def fix_repository(corpus: Path, directory: str) -> Tuple[List[dict], Dict[str, bool]]:
    """(findings with a fix, {changed file: still compiles}) for one repository."""
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        shutil.copytree(corpus / directory, work / directory)
        offered = [d for d in _check(work, directory) if d.get("fix")]
        before = {p: (p.read_bytes(), compiles(p)) for p in (work / directory).rglob("*.py")}
        _check(work, directory, "--fix", "--unsafe-fixes")
        changed: Dict[str, bool] = {}
        for p, (text, compiled) in before.items():
            if p.read_bytes() != text and compiled:
                changed[str(p.relative_to(work))] = compiles(p)
        return offered, changed


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", required=True, type=Path, help="the extracted repositories")
    parser.add_argument("--list", action="store_true", help="list every unsafe fix")
    args = parser.parse_args(argv)
    with (DATA / "corpus.tsv").open(newline="") as f:
        repos = list(csv.DictReader(f, delimiter="\t"))
    present = [r for r in repos if (args.corpus / r["directory"]).is_dir()]
    if not present:
        print(f"corpus not found under {args.corpus}; nothing measured.")
        return 0
    per_rule: Dict[str, Counter] = defaultdict(Counter)
    unsafe: List[str] = []
    broken: List[str] = []
    for r in present:
        offered, changed = fix_repository(args.corpus, r["directory"])
        for d in offered:
            kind = d["fix"]["applicability"]
            per_rule[d["code"]][kind] += 1
            per_rule[d["code"]][f"{kind}:{r['half']}"] += 1
            if kind == "unsafe":
                unsafe.append(f"{r['repo']} {d['path']}:{d['line']} {d['code']} ({r['half']})")
        for path, ok in changed.items():
            if not ok:
                broken.append(path)
        for code in {d["code"] for d in offered}:
            files = {d["path"] for d in offered if d["code"] == code}
            per_rule[code]["files"] += len(files & set(changed))
    print("| rule | safe fixes | unsafe fixes (dev / held-out) | files changed |")
    print("|---|---:|---:|---:|")
    for code in sorted(per_rule):
        c = per_rule[code]
        print(
            f"| {code} | {c['safe']} | {c['unsafe']} ({c['unsafe:dev']} / "
            f"{c['unsafe:held-out']}) | {c['files']} |"
        )
    print(f"\n{len(broken)} changed file(s) no longer compile" + (":" if broken else "."))
    for path in broken:
        print(f"- {path}")
    if args.list:
        print(f"\n{len(unsafe)} unsafe fix(es):")
        for line in unsafe:
            print(f"- {line}")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
