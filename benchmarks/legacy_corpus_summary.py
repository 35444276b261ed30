"""The table issue 34's done-when asks for, from the TSV ``bench_legacy_corpus.py --tsv`` writes.

Per half: the scripts whose failure is a torch API change and how many of them ``safetorch
run`` runs; the runnable scripts (those that ran under plain ``python`` or under ``safetorch
run``) and how many of them the fixed copies run (``fixed``: ``--select ALL,PREVIEW``;
``fixed-default``: the default selection); and every script whose fixed copy fails where
``safetorch run`` ran it.

A script counts as failing on a torch API change when its ``plain`` leg failed and its
``cause`` column (filled in by whoever read the traceback) starts with ``torch API change``.
Where ``cause`` is empty, a plain failure is counted as *unclassified*, and the check is
marked provisional: read those tracebacks (``results.json``) and fill the column in.

    python benchmarks/legacy_corpus_summary.py /tmp/legacy_eval2/heldout.tsv
    python benchmarks/legacy_corpus_summary.py dev.tsv heldout.tsv --half held-out
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path
from typing import Dict, List, Optional


def _ran(outcome: str) -> bool:
    return outcome.startswith("ok")


def _rows(paths: List[Path]) -> List[Dict[str, str]]:
    rows: List[Dict[str, str]] = []
    for path in paths:
        with open(path, encoding="utf-8", newline="") as f:
            rows.extend(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    return rows


def summarize(rows: List[Dict[str, str]]) -> str:
    """The done-when table as Markdown, one column per half.

    >>> row = {"repo": "a/b", "path": "x.py", "half": "dev", "plain": "fail: TypeError",
    ...        "run": "ok", "fixed": "ok", "fixed_default": "ok",
    ...        "cause": "torch API change: volatile"}
    >>> "| torch API change | 1 |" in summarize([row])
    True
    """
    halves = sorted({r["half"] for r in rows})
    lines = ["| | " + " | ".join(halves) + " |", "| --- |" + " --- |" * len(halves)]
    cells: Dict[str, List[str]] = {}
    notes: List[str] = []
    for half in halves:
        rs = [r for r in rows if r["half"] == half]
        failed = [r for r in rs if not _ran(r["plain"])]
        api = [r for r in failed if r.get("cause", "").lower().startswith("torch api change")]
        unclassified = [r for r in failed if not r.get("cause", "").strip()]
        api_run = [r for r in api if _ran(r["run"])]
        runnable = [r for r in rs if _ran(r["plain"]) or _ran(r["run"])]
        fixed = [r for r in runnable if _ran(r["fixed"])]
        fixed_default = [r for r in runnable if _ran(r.get("fixed_default", "-"))]
        broken = [r for r in rs if _ran(r["run"]) and not _ran(r["fixed"])]
        allowed = len(runnable) // 12
        ok = len(api_run) == len(api) and len(runnable) - len(fixed) <= allowed and not broken
        verdict = ("met" if ok else "not met") + (" (provisional)" if unclassified else "")
        values = {
            "scripts": str(len(rs)),
            "plain fails": str(len(failed)),
            "of which unclassified (cause empty)": str(len(unclassified)),
            "torch API change": str(len(api)),
            "of those, `safetorch run` runs": str(len(api_run)),
            "runnable (plain or run ran)": str(len(runnable)),
            "fixed copy runs (ALL,PREVIEW)": str(len(fixed)),
            "fixed copy runs (default rules)": str(len(fixed_default)),
            "misses allowed (one per dozen)": str(allowed),
            "fixed fails where run ran": str(len(broken)),
            "done-when": verdict,
        }
        for key, value in values.items():
            cells.setdefault(key, []).append(value)
        for r in broken:
            notes.append(f"- {half}: {r['repo']}:{r['path']}: run {r['run']}; fixed {r['fixed']}")
        for r in api:
            if not _ran(r["run"]):
                notes.append(f"- {half}: API change not run: {r['repo']}:{r['path']}: {r['run']}")
        for r in runnable:
            if not _ran(r["fixed"]) and r not in broken:
                notes.append(f"- {half}: fixed copy fails: {r['repo']}:{r['path']}: {r['fixed']}")
    for key, values_ in cells.items():
        lines.append(f"| {key} | " + " | ".join(values_) + " |")
    return "\n".join(lines + ([""] + notes if notes else [])) + "\n"


def main(argv: Optional[List[str]] = None) -> int:
    """Print the table for the TSVs given (``--half`` keeps one half)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("tsv", type=Path, nargs="+")
    ap.add_argument("--half", default=None, help="only this half (dev or held-out)")
    args = ap.parse_args(argv)
    rows = _rows(args.tsv)
    if args.half:
        rows = [r for r in rows if r["half"] == args.half]
    sys.stdout.write(summarize(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
