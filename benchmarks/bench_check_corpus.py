"""Precision and speed of ``safetorch check`` on a labelled corpus of real repositories.

The corpus is a set of public PyTorch repositories at pinned commits
(``benchmarks/check_corpus/corpus.tsv``); every finding ``safetorch check --select
ALL,PREVIEW`` makes on it is labelled TP or FP with a one-line reason in
``benchmarks/check_corpus/labels.tsv`` (TorchFix's findings in ``torchfix_labels.tsv``).
This script fetches nothing (CI has no network): extract the repositories first, each into
the directory named in ``corpus.tsv``::

    git --git-dir=<bare clone of pytorch/examples> archive <commit> -- '*.py' \\
        | tar -x -C CORPUS/examples

Then, in one run, it checks the same files with ``safetorch check`` and, when given, TorchFix
(and ruff for the rules that overlap ours, if ruff has any), and prints markdown tables:
findings, TP, FP and precision per rule (default set and preview), and wall/CPU time side by
side. Without the corpus it says so and exits 0.

Usage::

    python benchmarks/bench_check_corpus.py --corpus /tmp/corpus \\
        [--torchfix /tmp/tfx/bin/torchfix] [--ruff .venv/bin/ruff] [--jobs 1]
    python benchmarks/bench_check_corpus.py --corpus /tmp/corpus --findings before.json
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import re
import resource
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

REPO = Path(__file__).resolve().parents[1]
DATA = Path(__file__).resolve().parent / "check_corpus"
sys.path.insert(0, str(REPO))

# A finding, as labels name it: (corpus directory, path inside the repository, line, code).
Key = Tuple[str, str, int, str]
# TorchFix prints flake8's ``path:line:col: CODE message``.
_FLAKE8 = re.compile(r"^(?P<path>.+?):(?P<line>\d+):(?P<col>\d+): (?P<code>[A-Z]+\d+) ")
# Words in a ruff rule's documentation that mean it looks at what one of our rules does.
_OVERLAP_WORDS = ("torch.load", "weights_only", "upsample", "DataParallel", "BatchNorm")
# TorchFix's rule for the same pitfall as ours (same call, same line).
_SAME_PITFALL = {"TOR102": "ST003"}


def read_tsv(path: Path) -> List[Dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f, delimiter="\t"))


def read_labels(path: Path, dirs: Dict[str, str]) -> Dict[Key, Tuple[str, str]]:
    """(directory, path, line, code) -> (TP or FP, reason)."""
    labels: Dict[Key, Tuple[str, str]] = {}
    if not path.exists():
        return labels
    for row in read_tsv(path):
        key = (dirs[row["repo"]], row["path"], int(row["line"]), row["code"])
        labels[key] = (row["label"], row["reason"])
    return labels


def corpus_files(corpus: Path, repos: Sequence[Dict[str, str]]) -> List[str]:
    """Every ``*.py`` of the repositories present, relative to ``corpus``, sorted."""
    files: List[str] = []
    for repo in repos:
        root = corpus / repo["directory"]
        files.extend(str(p.relative_to(corpus)) for p in root.rglob("*.py") if p.is_file())
    return sorted(files)


def count_lines(corpus: Path, files: Iterable[str]) -> int:
    total = 0
    for name in files:
        with open(corpus / name, "rb") as f:
            total += sum(1 for _ in f)
    return total


def timed(
    cmd: List[str], cwd: Path, env: Optional[Dict[str, str]] = None
) -> Tuple[float, float, str]:
    """(wall s, CPU s of the child, stdout) of one command."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if proc.returncode not in (0, 1):
        sys.exit(f"{cmd[0]} failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")
    return wall, cpu, proc.stdout


def split_path(path: str) -> Tuple[str, str]:
    """``./examples/dcgan/main.py`` -> (``examples``, ``dcgan/main.py``)."""
    path = path[2:] if path.startswith("./") else path
    top, _, rest = path.partition("/")
    return top, rest


def score(
    findings: Iterable[Tuple[str, int, str]], labels: Dict[Key, Tuple[str, str]]
) -> Tuple[Dict[str, Counter], List[Key]]:
    """Per code: Counter of TP/FP/unlabelled; and the unlabelled findings."""
    per_code: Dict[str, Counter] = defaultdict(Counter)
    unlabelled: List[Key] = []
    for path, line, code in findings:
        top, rest = split_path(path)
        key = (top, rest, line, code)
        label = labels.get(key)
        per_code[code]["findings"] += 1
        if label is None:
            per_code[code]["unlabelled"] += 1
            unlabelled.append(key)
        else:
            per_code[code][label[0]] += 1
    return per_code, unlabelled


def precision(c: Counter) -> str:
    judged = c["TP"] + c["FP"]
    return f"{100 * c['TP'] / judged:.1f}%" if judged else "-"


def run_safetorch(
    corpus: Path, files: List[str], jobs: int, select: Optional[str]
) -> Tuple[float, float, list]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    cmd = [sys.executable, "-m", "safetorch", "check", "--isolated", "--exit-zero"]
    cmd += ["--select", select] if select else []
    cmd += ["--output-format", "json", "-j", str(jobs), *files]
    wall, cpu, out = timed(cmd, corpus, env)
    return wall, cpu, json.loads(out)


def run_torchfix(torchfix: str, corpus: Path, files: List[str]) -> Tuple[float, float, list]:
    wall, cpu, out = timed([torchfix, "--select", "ALL", "-j", "1", *files], corpus)
    found = []
    for line in out.splitlines():
        m = _FLAKE8.match(line)
        if m:
            found.append((m["path"], int(m["line"]), m["code"]))
    return wall, cpu, found


def ruff_overlaps(ruff: str) -> List[str]:
    """Codes of ruff rules whose documentation mentions what one of our rules checks."""
    proc = subprocess.run(
        [ruff, "rule", "--all", "--output-format", "json"], capture_output=True, text=True
    )
    if proc.returncode != 0:
        return []
    codes = []
    for rule in json.loads(proc.stdout):
        text = rule.get("explanation", "")
        if any(w in text for w in _OVERLAP_WORDS) and "import" not in rule.get("name", ""):
            codes.append(rule["code"])
    return codes


def one_file_seconds(corpus: Path, name: str, repeat: int = 3) -> List[Tuple[float, float]]:
    """(wall s, CPU s) of ``safetorch check FILE`` runs, process start included, with the
    bytecode cache an installed package has (one warm-up run writes it)."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # else every run compiles the checker again
    cmd = [sys.executable, "-m", "safetorch", "check", "--isolated", "--exit-zero", name]
    timed(cmd, corpus, env)
    return [timed(cmd, corpus, env)[:2] for _ in range(repeat)]


def rule_groups() -> Dict[str, str]:
    from safetorch.check.rules import RULE_TABLE

    return {code: ("preview" if info.preview else "default") for code, info in RULE_TABLE.items()}


def print_rule_table(per_code: Dict[str, Counter], groups: Dict[str, str]) -> None:
    print("| rule | group | findings | TP | FP | unlabelled | precision |")
    print("|---|---|---:|---:|---:|---:|---:|")
    totals: Dict[str, Counter] = defaultdict(Counter)
    for code in sorted(set(per_code) | {c for c in groups if c != "ST000"}):
        c = per_code.get(code, Counter())
        group = groups.get(code, "-")
        if code != "ST000":
            totals[group].update(c)
        print(
            f"| {code} | {group} | {c['findings']} | {c['TP']} | {c['FP']} | "
            f"{c['unlabelled']} | {precision(c)} |"
        )
    for group in ("default", "preview"):
        c = totals[group]
        print(
            f"| **{group} set** | | **{c['findings']}** | {c['TP']} | {c['FP']} | "
            f"{c['unlabelled']} | **{precision(c)}** |"
        )


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", required=True, type=Path, help="the extracted repositories")
    parser.add_argument("--torchfix", help="TorchFix executable (own venv)")
    parser.add_argument("--ruff", help="ruff executable (for rules that overlap ours)")
    parser.add_argument("--jobs", type=int, default=1, help="safetorch check -j (default 1)")
    parser.add_argument(
        "--findings", type=Path, help="score this saved `--output-format json` output instead"
    )
    args = parser.parse_args(argv)

    repos = read_tsv(DATA / "corpus.tsv")
    present = [r for r in repos if (args.corpus / r["directory"]).is_dir()]
    if not present:
        print(
            f"corpus not found under {args.corpus}: extract the repositories of "
            f"{DATA / 'corpus.tsv'} there (see this script's docstring); nothing measured."
        )
        return 0
    for r in repos:
        if r not in present:
            print(f"note: {r['repo']} missing under {args.corpus}; its labels are not used.")
    dirs = {r["repo"]: r["directory"] for r in repos}
    labels = read_labels(DATA / "labels.tsv", dirs)
    files = corpus_files(args.corpus, present)
    lines = count_lines(args.corpus, files)
    load = os.getloadavg()[0]
    print(
        f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}; load average {load:.1f} at start; "
        f"{time.strftime('%Y-%m-%d')}.\n"
    )
    print("| repository | commit | files | lines |")
    print("|---|---|---:|---:|")
    for r in present:
        n = [f for f in files if f.startswith(r["directory"] + "/")]
        print(f"| {r['repo']} | {r['commit'][:12]} | {len(n)} | {count_lines(args.corpus, n)} |")
    print(f"| **total** | | **{len(files)}** | **{lines}** |\n")

    groups = rule_groups()
    if args.findings is not None:
        saved = json.loads(args.findings.read_text())
        per_code, unlabelled = score(((d["path"], d["line"], d["code"]) for d in saved), labels)
        print(f"Scored {args.findings} (not run now):\n")
        print_rule_table(per_code, groups)
        return 0

    df_wall, df_cpu, df_found = run_safetorch(args.corpus, files, args.jobs, None)
    st_wall, st_cpu, st_found = run_safetorch(args.corpus, files, args.jobs, "ALL,PREVIEW")
    st_keys = [(d["path"], d["line"], d["code"]) for d in st_found]
    per_code, unlabelled = score(st_keys, labels)
    print(f"`safetorch check --select ALL,PREVIEW -j {args.jobs}` on the corpus:\n")
    print_rule_table(per_code, groups)
    if unlabelled:
        print(f"\n{len(unlabelled)} finding(s) without a label (add them to labels.tsv):")
        for key in unlabelled:
            print(f"- {key[0]}/{key[1]}:{key[2]} {key[3]}")

    df_per_code, _ = score(((d["path"], d["line"], d["code"]) for d in df_found), labels)
    df: Counter = Counter()
    for code, c in df_per_code.items():
        if code != "ST000":
            df.update(c)
    rows = [
        (
            f"safetorch check -j {args.jobs} (default set)",
            len(df_found),
            precision(df),
            df_wall,
            df_cpu,
        ),
        (
            f"safetorch check --select ALL,PREVIEW -j {args.jobs}",
            len(st_found),
            None,
            st_wall,
            st_cpu,
        ),
    ]
    tf_cpu = None
    if args.torchfix:
        tf_labels = read_labels(DATA / "torchfix_labels.tsv", dirs)
        tf_wall, tf_cpu, tf_found = run_torchfix(args.torchfix, args.corpus, files)
        tf_per_code, tf_unlabelled = score(tf_found, tf_labels)
        print(f"\n`torchfix --select ALL -j 1` on the same {len(files)} files:\n")
        print("| rule | findings | TP | FP | unlabelled | precision | same pitfall as |")
        print("|---|---:|---:|---:|---:|---:|---|")
        for code in sorted(tf_per_code):
            c = tf_per_code[code]
            print(
                f"| {code} | {c['findings']} | {c['TP']} | {c['FP']} | {c['unlabelled']} | "
                f"{precision(c)} | {_SAME_PITFALL.get(code, '-')} |"
            )
        for tor, st in _SAME_PITFALL.items():
            ours = {(split_path(p), n) for p, n, c in st_keys if c == st}
            theirs = {(split_path(p), n) for p, n, c in tf_found if c == tor}
            print(
                f"\n{tor} vs {st} (same calls): both {len(ours & theirs)}, only {st} "
                f"{len(ours - theirs)}, only {tor} {len(theirs - ours)}."
            )
        if tf_unlabelled:
            print(f"\n{len(tf_unlabelled)} TorchFix finding(s) without a label.")
        tf: Counter = Counter()
        for c in tf_per_code.values():
            tf.update(c)
        rows.append(("torchfix --select ALL -j 1", len(tf_found), precision(tf), tf_wall, tf_cpu))
    if args.ruff:
        codes = ruff_overlaps(args.ruff)
        if not codes:
            version = subprocess.run([args.ruff, "--version"], capture_output=True, text=True)
            print(
                f"\n{version.stdout.strip()}: no rule overlaps ours (none of its rules' "
                f"documentation mentions {', '.join(_OVERLAP_WORDS)}); not run."
            )
        else:
            cmd = [args.ruff, "check", "--isolated", "--exit-zero", "--select", ",".join(codes)]
            r_wall, r_cpu, out = timed(cmd + ["--output-format", "concise", *files], args.corpus)
            found = [ln for ln in out.splitlines() if _FLAKE8.match(ln)]
            print(f"\nruff --select {','.join(codes)}: {len(found)} finding(s).")
            rows.append((f"ruff check --select {','.join(codes)}", len(found), "-", r_wall, r_cpu))

    print("\n| run | findings | precision | wall s | CPU s | lines per CPU s | CPU vs TorchFix |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, count, prec, wall, cpu in rows:
        ratio = f"{tf_cpu / cpu:.0f}x" if tf_cpu and cpu else "-"
        print(
            f"| {name} | {count} | {prec or '(per rule above)'} | {wall:.2f} | {cpu:.2f} | "
            f"{lines / cpu:,.0f} | {ratio} |"
        )

    by_size = sorted(files, key=lambda f: (args.corpus / f).stat().st_size)
    print("\nOne file, end to end (`safetorch check FILE`, process start included, 3 runs):\n")
    print("| file | lines | wall s | CPU s |")
    print("|---|---:|---:|---:|")
    for label, name in (("median", by_size[len(by_size) // 2]), ("largest", by_size[-1])):
        runs = one_file_seconds(args.corpus, name)
        walls, cpus = [w for w, _ in runs], [c for _, c in runs]
        print(
            f"| {label}: {name} | {count_lines(args.corpus, [name])} | "
            f"{min(walls):.2f}-{max(walls):.2f} | {min(cpus):.2f}-{max(cpus):.2f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
