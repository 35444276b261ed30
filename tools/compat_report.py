"""Record and render the torch compatibility matrix (used by tools/compat.sh).

``record VERSION --venv DIR [--pytest-rc N | --install-failed]`` runs in the version's venv (or
in any Python for ``--install-failed``) and writes ``benchmarks/compat/VERSION.json`` from the
venv's JUnit XML, pytest log and install logs, plus the detected ``safetorch._compat`` flags.
``render`` regenerates ``benchmarks/COMPAT.md`` from every recorded JSON; text below the notes
marker of an existing COMPAT.md is kept.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path
from typing import Any, Dict, List, Optional

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "compat"
COMPAT_MD = ROOT / "benchmarks" / "COMPAT.md"
NOTES_MARKER = "<!-- notes: everything below this line is kept by tools/compat_report.py -->"


def _version_key(v: str) -> tuple:
    return tuple(int(p) if p.isdigit() else 0 for p in re.split(r"[.+]", v))


def _commit() -> str:
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "safetorch", "tests"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        ).stdout.strip()
        return sha + ("+dirty" if dirty else "")
    except OSError:
        return "unknown"


def _flags() -> List[Dict[str, Any]]:
    """Detected flags, loading safetorch/_compat.py by path (works if safetorch is broken)."""
    import torch  # noqa: F401  (the venv's torch; fails loudly if it cannot import)
    from packaging.version import Version

    spec = importlib.util.spec_from_file_location(
        "_safetorch_compat_probe", ROOT / "safetorch" / "_compat.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    release = Version(".".join(map(str, mod.TORCH_RELEASE)))
    out = []
    for f in mod.flags():
        expected = None if f.since == "-" else release >= Version(f.since)
        out.append({"name": f.name, "value": f.value, "since": f.since, "expected": expected})
    return out


def _first_line(text: str, limit: int = 240) -> str:
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    # pytest's per-test temporary paths would keep identical failures from grouping
    line = re.sub(r"/tmp/pytest-of-[^/]+/pytest-\d+/[^/'\s]+", "<tmp>", line)
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _where(text: str) -> str:
    """Where the exception was raised (pytest's ``path:line: ExcName`` line), and the last
    safetorch frame on the way when that is somewhere else (torch, pytest)."""
    frames = re.findall(r"^([\w./-]+\.py):(\d+): (?:in \w+|(\w+))\s*$", text, flags=re.M)
    if not frames:
        return ""

    def short(path: str) -> str:
        return path.split("/work/main/")[-1]

    raised = [f for f in frames if f[2]]
    path, line, exc = raised[-1] if raised else frames[-1]
    out = f"{short(path)}:{line}" + (f" ({exc})" if exc else "")
    own = [f for f in frames if f[0].startswith("safetorch/")]
    if own and own[-1][0] != path:
        out += f", via {own[-1][0]}:{own[-1][1]}"
    return out


def _parse_junit(path: Path) -> Dict[str, Any]:
    root = ET.parse(path).getroot()
    counts = Counter()
    failures: List[Dict[str, str]] = []
    skips: Counter = Counter()
    for case in root.iter("testcase"):
        cid = f"{case.get('classname', '')}::{case.get('name', '')}".strip(":")
        counts["total"] += 1
        for kind in ("failure", "error"):
            el = case.find(kind)
            if el is not None:
                counts["failed" if kind == "failure" else "errors"] += 1
                text = el.text or ""
                failures.append(
                    {
                        "test": cid,
                        "kind": kind,
                        "message": _first_line(el.get("message") or text),
                        "where": _where(text),
                    }
                )
                break
        else:
            sk = case.find("skipped")
            if sk is not None:
                counts["skipped"] += 1
                skips[_first_line(sk.get("message") or sk.text or "", 200)] += 1
            else:
                counts["passed"] += 1
    return {
        "counts": {k: counts.get(k, 0) for k in ("passed", "failed", "errors", "skipped", "total")},
        "failures": failures,
        "skips": [{"reason": r, "count": n} for r, n in skips.most_common()],
    }


def record(args: argparse.Namespace) -> int:
    venv = Path(args.venv)
    data: Dict[str, Any] = {
        "version": args.version,
        "date": datetime.date.today().isoformat(),
        "commit": args.commit or _commit(),
        "python": platform.python_version(),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "note": os.environ.get("COMPAT_NOTE", "").strip(),
    }
    if args.install_failed:
        err = venv / "install.err"
        data["status"] = "not installable"
        data["install_error"] = err.read_text().strip() if err.exists() else "(no install log)"
    else:
        import torch

        data["torch"] = torch.__version__
        data["cuda_available"] = bool(torch.cuda.is_available())
        data["python"] = platform.python_version()
        try:
            data["flags"] = _flags()
        except Exception as exc:  # recorded, never hidden
            data["flags_error"] = f"{type(exc).__name__}: {exc}"
        log = venv / "pytest.log"
        tail = log.read_text(errors="replace").strip().splitlines()[-1:] if log.exists() else []
        data["pytest_summary"] = tail[0] if tail else ""
        data["pytest_rc"] = args.pytest_rc
        junit = venv / "junit.xml"
        if junit.exists() and args.pytest_rc != 124:
            data.update(_parse_junit(junit))
        if args.pytest_rc == 124:
            data["status"] = "timed out"
        elif args.pytest_rc == 0:
            data["status"] = "green"
        else:
            data["status"] = "red"
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"{args.version}.json"
    out.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    print(f"recorded {out.relative_to(ROOT)}: {data['status']}")
    return 0


def _load_all() -> List[Dict[str, Any]]:
    rows = [json.loads(p.read_text()) for p in RESULTS.glob("*.json")]
    return sorted(rows, key=lambda r: _version_key(r["version"]))


def render(args: argparse.Namespace) -> int:
    rows = _load_all()
    notes = ""
    if COMPAT_MD.exists():
        old = COMPAT_MD.read_text()
        if NOTES_MARKER in old:
            notes = old.split(NOTES_MARKER, 1)[1].strip("\n")
    out: List[str] = [
        "# Compatibility matrix",
        "",
        "Generated by `make test-compat` (`bash tools/compat.sh [VERSION ...]`, which writes",
        "`benchmarks/compat/<version>.json` and renders this file). Each torch runs the whole",
        "suite (`python -m pytest -q -p no:cacheprovider tests`) in its own venv",
        "`.venv-compat/<version>`; a row keeps the date and commit of its last run.",
        "",
    ]
    notes_by_text: Dict[str, List[str]] = {}
    for r in rows:
        if r.get("note"):
            notes_by_text.setdefault(r["note"], []).append(r["version"])
    for text, versions in notes_by_text.items():
        out += [f"> **{text}** (torch {', '.join(versions)})", ""]
    out += [
        "| torch | installed build | Python | date | commit | passed | failed | errors | skipped | result |",
        "|---|---|---|---|---|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        c = r.get("counts", {})
        out.append(
            "| {v} | {t} | {py} | {d} | {cm} | {p} | {f} | {e} | {s} | {st} |".format(
                v=r["version"],
                t=r.get("torch", "-"),
                py=r.get("python", "-"),
                d=r["date"],
                cm=f"`{r.get('commit', '?')}`",
                p=c.get("passed", "-"),
                f=c.get("failed", "-"),
                e=c.get("errors", "-"),
                s=c.get("skipped", "-"),
                st=r["status"],
            )
        )
    machines = sorted({r["machine"] for r in rows if r.get("machine")})
    if machines:
        gpu = {r.get("cuda_available") for r in rows if "cuda_available" in r}
        where = " (no GPU: CUDA builds ran on the CPU)" if gpu == {False} else ""
        out += ["", f"Machine: {'; '.join(machines)}{where}."]
    flagged = [r for r in rows if r.get("flags")]
    if flagged:
        names = [f["name"] for f in flagged[-1]["flags"]]
        since = {f["name"]: f["since"] for r in flagged for f in r["flags"]}
        out += [
            "",
            "## `safetorch._compat` flags detected per version",
            "",
            "`yes`/`no` is the detected value; `!` marks a value that disagrees with the release",
            "named in the flag's comment (checked by `tests/compat/test_compat_flags.py`).",
            "",
            "| flag | since | " + " | ".join(r["version"] for r in flagged) + " |",
            "|---|---|" + "---|" * len(flagged),
        ]
        for name in names:
            cells = []
            for r in flagged:
                f = next((f for f in r["flags"] if f["name"] == name), None)
                if f is None:
                    cells.append("n/a")
                    continue
                cell = "yes" if f["value"] else "no"
                if f["expected"] is not None and f["expected"] != f["value"]:
                    cell += " !"
                cells.append(cell)
            out.append(f"| `{name}` | {since.get(name, '?')} | " + " | ".join(cells) + " |")
    for r in rows:
        if r.get("install_error"):
            out += ["", f"## torch {r['version']}: not installable", "", "```"]
            out += [r["install_error"], "```"]
        if r.get("flags_error"):
            out += ["", f"torch {r['version']}: flags could not be read: `{r['flags_error']}`"]
    failing = [r for r in rows if r.get("failures")]
    if failing:
        out += ["", "## Failures", ""]
        for r in failing:
            out += [f"### torch {r['version']} ({len(r['failures'])})", ""]
            # one bullet per (test function, location, message); parametrizations grouped
            groups: Dict[tuple, List[str]] = {}
            for f in r["failures"]:
                base, _, param = f["test"].partition("[")
                key = (base, f["kind"], f.get("where", ""), f["message"])
                groups.setdefault(key, []).append(param.rstrip("]"))
            for (base, kind, where_, message), params in groups.items():
                where = f" at `{where_}`" if where_ else ""
                msg = message.replace("|", "\\|").replace("`", "'")
                ids = [p for p in params if p]
                shown = ""
                if ids:
                    more = f", +{len(ids) - 4} more" if len(ids) > 4 else ""
                    shown = f" [{len(ids)}: {', '.join(ids[:4])}{more}]"
                out.append(f"- `{base}`{shown} ({kind}){where}: {msg}")
            out.append("")
    skipping = [r for r in rows if r.get("skips")]
    if skipping:
        out += ["", "## Skips (reason: count)", ""]
        for r in skipping:
            out += [f"- torch {r['version']}:"]
            out += [f"  - {s['reason']}: {s['count']}" for s in r["skips"]]
    for r in rows:
        if r.get("status") == "timed out":
            out += [
                "",
                f"torch {r['version']}: the suite timed out ({r.get('pytest_summary', '')})",
            ]
    out += ["", NOTES_MARKER, ""]
    if notes:
        out += [notes, ""]
    COMPAT_MD.write_text("\n".join(out).rstrip("\n") + "\n")
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    rec = sub.add_parser("record")
    rec.add_argument("version")
    rec.add_argument("--venv", required=True)
    rec.add_argument("--pytest-rc", type=int, default=None)
    rec.add_argument("--install-failed", action="store_true")
    rec.add_argument("--commit", help="commit tested (default: HEAD now, + dirty mark)")
    rec.set_defaults(func=record)
    ren = sub.add_parser("render")
    ren.set_defaults(func=render)
    com = sub.add_parser("commit", help="print the commit id recorded for a run")
    com.set_defaults(func=lambda _args: print(_commit()) or 0)
    args = p.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
