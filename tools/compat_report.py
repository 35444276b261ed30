"""Record and render the compatibility matrix (used by tools/compat.sh).

``record ROW --venv DIR --python X.Y --torch V [--pytest-rcs 0,0 | --install-failed]`` runs in
the row's venv (or in any Python for ``--install-failed``) and writes
``benchmarks/compat/ROW.json`` from the venv's JUnit XMLs (one per run of the suite), pytest logs
and install logs, plus the detected ``safetorch._compat`` flags. A test whose outcome differs
between the runs is flaky and makes the row red; ``record`` exits 1 unless the row is green.
``render`` regenerates ``benchmarks/COMPAT.md`` from every recorded JSON; text below the notes
marker of an existing COMPAT.md is kept. Must run on Python 3.9 (the venvs' interpreters).
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


# The line tests/conftest.py's deadline watchdog writes before it aborts a hung pytest run.
_HUNG = re.compile(r"safetorch test deadline: (.+?) is still running after ([\d.]+) s")


def _parse_junit(path: Path) -> Dict[str, Any]:
    root = ET.parse(path).getroot()
    counts: Counter = Counter()
    failures: List[Dict[str, str]] = []
    skips: Counter = Counter()
    outcomes: Dict[str, str] = {}
    for case in root.iter("testcase"):
        cid = f"{case.get('classname', '')}::{case.get('name', '')}".strip(":")
        counts["total"] += 1
        for kind in ("failure", "error"):
            el = case.find(kind)
            if el is not None:
                counts["failed" if kind == "failure" else "errors"] += 1
                outcomes[cid] = "failed" if kind == "failure" else "error"
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
                outcomes[cid] = "skipped"
                skips[_first_line(sk.get("message") or sk.text or "", 200)] += 1
            else:
                counts["passed"] += 1
                outcomes.setdefault(cid, "passed")  # a teardown error keeps the "error"
    return {
        "counts": {k: counts.get(k, 0) for k in ("passed", "failed", "errors", "skipped", "total")},
        "failures": failures,
        "skips": [{"reason": r, "count": n} for r, n in skips.most_common()],
        "outcomes": outcomes,
    }


def _flaky(outcomes: List[Dict[str, str]]) -> List[Dict[str, Any]]:
    """Tests whose outcome differs between runs (missing from a run counts as "absent")."""
    if len(outcomes) < 2:
        return []
    tests = sorted(set().union(*outcomes))
    out = []
    for t in tests:
        seen = [o.get(t, "absent") for o in outcomes]
        if len(set(seen)) > 1:
            out.append({"test": t, "outcomes": seen})
    return out


def record(args: argparse.Namespace) -> int:
    venv = Path(args.venv)
    data: Dict[str, Any] = {
        "row": args.row,
        "version": args.torch,
        "python_requested": args.python,
        "deps": args.deps,
        "date": datetime.date.today().isoformat(),
        "commit": args.commit or _commit(),
        "python": platform.python_version() if not args.install_failed else args.python,
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
        try:
            data["flags"] = _flags()
        except Exception as exc:  # recorded, never hidden
            data["flags_error"] = f"{type(exc).__name__}: {exc}"
        freeze = venv / "freeze.txt"
        if freeze.exists():
            wanted = {"pytest", "hypothesis", "numpy", "safetensors", "wrapt", "packaging"}
            data["packages"] = {
                name: ver
                for name, _, ver in (ln.partition("==") for ln in freeze.read_text().split())
                if name.lower() in wanted
            }
        rcs = [int(x) for x in args.pytest_rcs.split(",") if x != ""]
        runs: List[Dict[str, Any]] = []
        for i, rc in enumerate(rcs, start=1):
            log = venv / f"pytest-{i}.log"
            text = log.read_text(errors="replace") if log.exists() else ""
            tail = text.strip().splitlines()[-1:]
            run: Dict[str, Any] = {"rc": rc, "summary": tail[0] if tail else ""}
            junit = venv / f"junit-{i}.xml"
            if junit.exists() and rc != 124:
                run.update(_parse_junit(junit))
            hung = _HUNG.search(text)
            if hung:  # aborted by tests/conftest.py's watchdog: no JUnit XML, the log names it
                run["hung"] = hung.group(1)
                run["summary"] = f"aborted: {hung.group(1)} hung (rc {rc})"
                run.setdefault("failures", []).append(
                    {
                        "test": hung.group(1),
                        "kind": "hang",
                        "message": "still running past SAFETORCH_TEST_DEADLINE plus grace "
                        f"({hung.group(2)} s): pytest aborted, stacks in pytest-{i}.log",
                        "where": "",
                    }
                )
            runs.append(run)
        flaky = _flaky([r["outcomes"] for r in runs if "outcomes" in r])
        data["runs"] = len(runs)
        data["run_counts"] = [r.get("counts", {}) for r in runs]
        data["run_summaries"] = [r["summary"] for r in runs]
        data["pytest_rcs"] = rcs
        data["flaky"] = flaky
        # failures and skips: the union over the runs, each failure once per test
        seen, failures = set(), []
        for r in runs:
            for f in r.get("failures", []):
                if f["test"] not in seen:
                    seen.add(f["test"])
                    failures.append(f)
        data["failures"] = failures
        data["skips"] = runs[0].get("skips", []) if runs else []
        data["counts"] = runs[-1].get("counts", {}) if runs else {}
        if any("hung" in r for r in runs):
            data["status"] = "hung"
        elif any(rc == 124 for rc in rcs):
            data["status"] = "timed out"
        elif flaky:
            data["status"] = "red (flaky)"
        elif rcs and all(rc == 0 for rc in rcs):
            data["status"] = "green"
        else:
            data["status"] = "red"
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"{args.row}.json"
    out.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    print(f"recorded {out.relative_to(ROOT)}: {data['status']}")
    for f in data.get("flaky", []):
        print(f"  flaky: {f['test']}: {' / '.join(f['outcomes'])}")
    return 0 if data["status"] == "green" else 1


def _row_id(r: Dict[str, Any]) -> str:
    """The row's name; records from before rows had a Python get it from the Python they ran."""
    if r.get("row"):
        return str(r["row"])
    return f"py{'.'.join(str(r.get('python', '?')).split('.')[:2])}-{r['version']}"


def _py_minor(r: Dict[str, Any]) -> str:
    return r.get("python_requested") or ".".join(str(r.get("python", "?")).split(".")[:2])


# the deps column: how the row's test dependencies were chosen (tools/compat.sh's row KIND)
_DEPS_LABEL = {"newest": "newest", "min": "floors", "noextras": "no extras"}


def _label(r: Dict[str, Any]) -> str:
    deps = r.get("deps", "newest")
    suffix = "" if deps == "newest" else " " + _DEPS_LABEL.get(deps, deps)
    return f"{r['version']}/py{_py_minor(r)}{suffix}"


def _load_all() -> List[Dict[str, Any]]:
    rows = [json.loads(p.read_text()) for p in RESULTS.glob("*.json")]
    return sorted(
        rows,
        key=lambda r: (_version_key(_py_minor(r)), _version_key(r["version"]), r.get("deps", "")),
    )


def _cell(values: List[Any]) -> str:
    """One number when every run agrees, else each run's, e.g. 664/665."""
    if not values:
        return "-"
    return str(values[0]) if len(set(values)) == 1 else "/".join(str(v) for v in values)


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
        "Generated by `make test-compat` (`bash tools/compat.sh [ROW ...]`, which writes",
        "`benchmarks/compat/<row>.json` and renders this file). Each row (a Python and a torch)",
        "runs the whole suite (`python -m pytest -q -p no:cacheprovider tests`) in its own venv",
        "`.venv-compat/<row>`, `runs` times in a row (2 by default); a test whose outcome differs",
        "between the runs is flaky and makes the row red. Passed/failed/... show each run's count",
        "where the runs differ. `deps`: `newest` installs the newest test dependencies pip finds,",
        "`floors` every dependency at the floor pyproject.toml declares, `no extras` the newest",
        "without any of safetorch's optional extras (safetensors, ...) or triton. A row keeps the",
        "date and commit of its last run.",
        "",
    ]
    notes_by_text: Dict[str, List[str]] = {}
    for r in rows:
        if r.get("note"):
            notes_by_text.setdefault(r["note"], []).append(_label(r))
    for text, labels in notes_by_text.items():
        out += [f"> **{text}** ({', '.join(labels)})", ""]
    out += [
        "| Python | torch | deps | installed build | date | commit | runs | passed | failed"
        " | errors | skipped | flaky | result |",
        "|---|---|---|---|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        runs = r.get("run_counts") or ([r["counts"]] if r.get("counts") else [])
        checked = "runs" in r
        out.append(
            "| {py} | {v} | {deps} | {t} | {d} | {cm} | {n} | {p} | {f} | {e} | {s} | {fl} | {st} |".format(
                py=r.get("python", "-"),
                v=r["version"],
                deps=_DEPS_LABEL.get(r.get("deps", ""), "newest"),
                t=r.get("torch", "-"),
                d=r["date"],
                cm=f"`{r.get('commit', '?')}`",
                n=r.get("runs", 1 if runs else 0),
                p=_cell([c.get("passed") for c in runs]),
                f=_cell([c.get("failed") for c in runs]),
                e=_cell([c.get("errors") for c in runs]),
                s=_cell([c.get("skipped") for c in runs]),
                fl=len(r.get("flaky", [])) if checked and r.get("runs", 0) > 1 else "not checked",
                st=r["status"],
            )
        )
    legacy = [_label(r) for r in rows if "runs" not in r and r.get("counts")]
    if legacy:
        out += [
            "",
            "Rows recorded before repeated runs (one run each, flakiness not checked): "
            + ", ".join(legacy)
            + ".",
        ]
    pinned = [r for r in rows if r.get("deps") == "min" and r.get("packages")]
    for r in pinned:
        pk = ", ".join(
            f"{k} {v}" for k, v in sorted(r["packages"].items(), key=lambda kv: kv[0].lower())
        )
        out += ["", f"Floors row {_label(r)}: {pk}."]
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
            "## `safetorch._compat` flags detected per row",
            "",
            "`yes`/`no` is the detected value; `!` marks a value that disagrees with the release",
            "named in the flag's comment (checked by `tests/compat/test_compat_flags.py`).",
            "",
            "| flag | since | " + " | ".join(_label(r) for r in flagged) + " |",
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
            out += ["", f"## {_label(r)}: not installable", "", "```"]
            out += [r["install_error"], "```"]
        if r.get("flags_error"):
            out += ["", f"{_label(r)}: flags could not be read: `{r['flags_error']}`"]
    failing = [r for r in rows if r.get("failures")]
    if failing:
        out += ["", "## Failures", ""]
        for r in failing:
            out += [f"### {_label(r)} ({len(r['failures'])})", ""]
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
    flaky_rows = [r for r in rows if r.get("flaky")]
    if flaky_rows:
        out += ["", "## Flaky tests (outcome per run)", ""]
        for r in flaky_rows:
            out += [f"- {_label(r)}:"]
            out += [f"  - `{f['test']}`: {' / '.join(f['outcomes'])}" for f in r["flaky"]]
    skipping = [r for r in rows if r.get("skips")]
    if skipping:
        out += ["", "## Skips (reason: count)", ""]
        for r in skipping:
            out += [f"- {_label(r)}:"]
            out += [f"  - {s['reason']}: {s['count']}" for s in r["skips"]]
    for r in rows:
        if r.get("status") == "timed out":
            out += [
                "",
                f"{_label(r)}: a run of the suite timed out ({r.get('run_summaries', '')})",
            ]
    out += ["", NOTES_MARKER, ""]
    if notes:
        out += [notes, ""]
    COMPAT_MD.write_text("\n".join(out).rstrip("\n") + "\n")
    # docs/compatibility.md's matrix section follows COMPAT.md (tools/compat_docs.py).
    sys.path.insert(0, str(ROOT / "tools"))
    import compat_docs

    return compat_docs.main([])


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    rec = sub.add_parser("record")
    rec.add_argument("row", help="row name, e.g. py3.9-1.13.1 (the JSON file's name)")
    rec.add_argument("--venv", required=True)
    rec.add_argument("--python", required=True, help="Python X.Y the row asks for")
    rec.add_argument("--torch", required=True, help="torch release the row asks for")
    rec.add_argument("--deps", choices=["newest", "min", "noextras"], default="newest")
    rec.add_argument("--pytest-rcs", default="", help="exit status of each run, e.g. 0,0")
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
