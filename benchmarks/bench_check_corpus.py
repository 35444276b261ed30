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

Unlabelled development findings are listed by place; unlabelled held-out findings only as a
count per rule, so that whoever tunes a rule never sees held-out code through this script.
``--list-unlabelled-heldout`` lists them too: for labellers only, who change no rule.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
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
from typing import Dict, FrozenSet, Iterable, List, Optional, Sequence, Tuple

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


def report_unlabelled(
    unlabelled: Sequence[Key], half_of: Dict[str, str], list_heldout: bool, who: str = ""
) -> None:
    """List the development half's unlabelled findings; count the held-out half's per rule
    (their places only with ``list_heldout``: held-out code is for labellers, not tuners)."""
    if not unlabelled:
        return
    dev = [k for k in unlabelled if half_for(k[0], k[3], half_of) == "dev"]
    held = [k for k in unlabelled if half_for(k[0], k[3], half_of) != "dev"]
    if dev:
        print(f"\n{len(dev)} development {who}finding(s) without a label (label them once):")
        for key in dev:
            print(f"- {key[0]}/{key[1]}:{key[2]} {key[3]}")
    if held:
        counts = Counter(k[3] for k in held)
        per_rule = ", ".join(f"{code} {n}" for code, n in sorted(counts.items()))
        print(f"\n{len(held)} held-out {who}finding(s) without a label: {per_rule}.")
        if list_heldout:
            print("Their places (--list-unlabelled-heldout, for labellers only):")
            for key in held:
                print(f"- {key[0]}/{key[1]}:{key[2]} {key[3]}")
        else:
            print(
                "(places not shown: a labeller who changes no rule lists them with "
                "--list-unlabelled-heldout)"
            )


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


def split_half(repo: str) -> str:
    """The half a repository added after the first twelve belongs to, by the fixed rule of
    ``check_corpus/README.md``: development when the first hex digit of
    sha256(``owner/name``) is 0-3, held-out otherwise.

    >>> split_half("karpathy/minGPT"), split_half("facebookresearch/detr")
    ('dev', 'held-out')
    """
    return "dev" if hashlib.sha256(repo.encode()).hexdigest()[0] in "0123" else "held-out"


# The twelve repositories labelled before the split existed: tuned on, so development.
FIRST_TWELVE = 12
BAR, BAR_FINDINGS = 97.0, 5
# The seed rules' findings on the first ten batches (rows 1-276) were retired into
# development at stop 55 (check_corpus/README.md, "Eleventh batch"): for these rules only the
# held-out rows after them are held out.
SEED_RULES = frozenset({"ST004", "ST005", "ST006", "ST012"})
SEED_RETIRED_ROWS = 276
# Held-out seed-rule findings read while planning a later stop, retired into development for
# that rule alone (check_corpus/README.md, "Twelfth batch", "Thirteenth batch"): rule ->
# repositories (for ST004, every held-out row of the eleventh and twelfth batches; for ST006,
# of the eleventh to thirteenth, retired at stop 57 before the thirteenth's reasons were read).
ELEVENTH_AND_TWELFTH = (277, 345)  # their rows in corpus.tsv, 1-based, inclusive
ELEVENTH_TO_THIRTEENTH = (277, 379)
# ST012's, retired at stop 57 before their reasons were read (rows 277-407, then to 435).
ELEVENTH_TO_FIFTEENTH = (277, 435)
# ST003's (a default rule, not a seed rule), retired at stop 58 before their reasons were read:
# its held-out findings of the fourteenth and fifteenth batches measured 277 / 28, against
# 98.6% on batches 1-13; the changed rule is judged on the sixteenth batch's held-out rows.
FOURTEENTH_AND_FIFTEENTH = (380, 435)
# ST004's, retired at stop 58 before their reasons were read (rows 346-460: the thirteenth
# to sixteenth batches, 45 right / 23 wrong held-out); judged on a seventeenth batch.
ELEVENTH_TO_SIXTEENTH = (277, 460)
SEED_READ: Dict[str, FrozenSet[str]] = {"ST005": frozenset({"yl4579/StyleTTS2"})}
SEED_READ_ROWS = {
    "ST004": ELEVENTH_TO_SIXTEENTH,
    "ST006": ELEVENTH_TO_THIRTEENTH,
    "ST012": ELEVENTH_TO_FIFTEENTH,
    "ST003": FOURTEENTH_AND_FIFTEENTH,
}


class Halves(Dict[str, str]):
    """directory -> half, and the directories whose seed-rule findings were retired into
    development (``retired``: the first ``SEED_RETIRED_ROWS`` rows; ``read``: per rule, the
    directories of ``SEED_READ``)."""

    def __init__(
        self,
        halves: Dict[str, str],
        retired: Iterable[str] = (),
        read: Optional[Dict[str, FrozenSet[str]]] = None,
    ) -> None:
        super().__init__(halves)
        self.retired = frozenset(retired)
        self.read: Dict[str, FrozenSet[str]] = dict(read or {})


def halves(repos: Sequence[Dict[str, str]]) -> Halves:
    """directory -> half, checking each row's ``half`` column against the rule."""
    found = {}
    for i, r in enumerate(repos):
        want = "dev" if i < FIRST_TWELVE else split_half(r["repo"])
        if r["half"] != want:
            raise SystemExit(f"corpus.tsv: {r['repo']} is marked {r['half']}, the rule says {want}")
        found[r["directory"]] = want
    read = {
        code: frozenset(r["directory"] for r in repos if r["repo"] in names)
        for code, names in SEED_READ.items()
    }
    for code, (first, last) in SEED_READ_ROWS.items():
        rows = frozenset(r["directory"] for r in repos[first - 1 : last])
        read[code] = read.get(code, frozenset()) | rows
    return Halves(found, (r["directory"] for r in repos[:SEED_RETIRED_ROWS]), read)


def half_for(directory: str, code: str, half_of: Dict[str, str]) -> str:
    """The half a finding counts in: its repository's, but development for a seed rule's
    finding on a retired row (``half_of`` a :class:`Halves`; a plain dict retires none).

    >>> half_for("old", "ST012", Halves({"old": "held-out"}, ["old"]))
    'dev'
    >>> half_for("old", "ST003", Halves({"old": "held-out"}, ["old"]))
    'held-out'
    >>> read = Halves({"new": "held-out"}, [], {"ST005": frozenset({"new"})})
    >>> half_for("new", "ST005", read), half_for("new", "ST006", read)
    ('dev', 'held-out')
    """
    if code in SEED_RULES and directory in getattr(half_of, "retired", ()):
        return "dev"
    if directory in getattr(half_of, "read", {}).get(code, ()):
        return "dev"
    return half_of[directory]


def by_half(
    findings: Iterable[Tuple[str, int, str]], half_of: Dict[str, str]
) -> Dict[str, List[Tuple[str, int, str]]]:
    out: Dict[str, List[Tuple[str, int, str]]] = {"dev": [], "held-out": []}
    for f in findings:
        out[half_for(split_path(f[0])[0], f[2], half_of)].append(f)
    return out


def verdict(c: Counter) -> str:
    judged = c["TP"] + c["FP"]
    if judged < BAR_FINDINGS:
        return f"n<{BAR_FINDINGS}"
    return "meets bar" if 100 * c["TP"] / judged >= BAR else "below bar"


def print_rule_table(
    per_half: Dict[str, Dict[str, Counter]], groups: Dict[str, str], with_group: bool = True
) -> Dict[str, Dict[str, Counter]]:
    """One row per rule: findings, TP, FP, unlabelled and precision on each half."""
    head = "| rule | group |" if with_group else "| rule |"
    print(
        head + " dev findings | dev TP | dev FP | dev precision |"
        " held-out findings | TP | FP | unlabelled | held-out precision | held-out verdict |"
    )
    print(
        "|---|"
        + ("---|" if with_group else "")
        + "---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"
    )
    totals: Dict[str, Dict[str, Counter]] = defaultdict(lambda: defaultdict(Counter))
    codes = set(per_half["dev"]) | set(per_half["held-out"])
    if with_group:
        codes |= {c for c in groups if c != "ST000"}
    for code in sorted(codes):
        d, h = per_half["dev"].get(code, Counter()), per_half["held-out"].get(code, Counter())
        group = groups.get(code, "-")
        if code != "ST000":
            totals[group]["dev"].update(d)
            totals[group]["held-out"].update(h)
        cells = f"| {code} | {group} |" if with_group else f"| {code} |"
        print(
            f"{cells} {d['findings']} | {d['TP']} | {d['FP']} | {precision(d)} | "
            f"{h['findings']} | {h['TP']} | {h['FP']} | {h['unlabelled']} | {precision(h)} | "
            f"{verdict(h) if code != 'ST000' else '-'} |"
        )
    for group in sorted(totals):
        d, h = totals[group]["dev"], totals[group]["held-out"]
        label = f"**{group} set**" if with_group else "**all**"
        print(
            f"| {label} |{' |' if with_group else ''} **{d['findings']}** | {d['TP']} | "
            f"{d['FP']} | **{precision(d)}** | **{h['findings']}** | {h['TP']} | {h['FP']} | "
            f"{h['unlabelled']} | **{precision(h)}** | {verdict(h)} |"
        )
    return totals


def score_halves(
    findings: Sequence[Tuple[str, int, str]],
    labels: Dict[Key, Tuple[str, str]],
    half_of: Dict[str, str],
) -> Tuple[Dict[str, Dict[str, Counter]], List[Key]]:
    per_half, missing = {}, []
    for half, found in by_half(findings, half_of).items():
        per_half[half], unlabelled = score(found, labels)
        missing += unlabelled
    return per_half, missing


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", required=True, type=Path, help="the extracted repositories")
    parser.add_argument("--torchfix", help="TorchFix executable (own venv)")
    parser.add_argument("--ruff", help="ruff executable (for rules that overlap ours)")
    parser.add_argument("--jobs", type=int, default=1, help="safetorch check -j (default 1)")
    parser.add_argument(
        "--findings", type=Path, help="score this saved `--output-format json` output instead"
    )
    parser.add_argument(
        "--no-timing", action="store_true", help="skip the one-file timings (faster)"
    )
    parser.add_argument(
        "--list-unlabelled-heldout",
        action="store_true",
        help="also list the places of unlabelled held-out findings (for labellers only: "
        "whoever tunes a rule sees held-out counts, never held-out code)",
    )
    args = parser.parse_args(argv)

    repos = read_tsv(DATA / "corpus.tsv")
    half_of = halves(repos)
    present = [r for r in repos if (args.corpus / r["directory"]).is_dir()]
    if not present:
        print(
            f"corpus not found under {args.corpus}: extract the repositories of "
            f"{DATA / 'corpus.tsv'} there (see check_corpus/README.md); nothing measured."
        )
        return 0
    for r in repos:
        if r not in present:
            print(f"note: {r['repo']} missing under {args.corpus}; its labels are not used.")
    dirs = {r["repo"]: r["directory"] for r in repos}
    labels = read_labels(DATA / "labels.tsv", dirs)
    labels.update(read_labels(DATA / "labels_heldout.tsv", dirs))
    files = corpus_files(args.corpus, present)
    lines = count_lines(args.corpus, files)
    load = os.getloadavg()[0]
    print(
        f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}; load average {load:.1f} at start; "
        f"{time.strftime('%Y-%m-%d')}.\n"
    )
    print("| repository | half | commit | files | lines |")
    print("|---|---|---|---:|---:|")
    size: Dict[str, Counter] = defaultdict(Counter)
    for r in present:
        n = [f for f in files if f.startswith(r["directory"] + "/")]
        n_lines = count_lines(args.corpus, n)
        size[r["half"]].update(repos=1, files=len(n), lines=n_lines)
        print(f"| {r['repo']} | {r['half']} | {r['commit'][:12]} | {len(n)} | {n_lines} |")
    for half in ("dev", "held-out"):
        s = size[half]
        print(
            f"| **{half}: {s['repos']} repositories** | | | **{s['files']}** | **{s['lines']}** |"
        )
    print()

    groups = rule_groups()
    if args.findings is not None:
        saved = json.loads(args.findings.read_text())
        found = [(d["path"], d["line"], d["code"]) for d in saved]
        per_half, _ = score_halves(found, labels, half_of)
        print(f"Scored {args.findings} (not run now):\n")
        print_rule_table(per_half, groups)
        return 0

    # One path per repository: each is its own project (cross-file rules look inside it).
    roots = [r["directory"] for r in present]
    df_wall, df_cpu, df_found = run_safetorch(args.corpus, roots, args.jobs, None)
    st_wall, st_cpu, st_found = run_safetorch(args.corpus, roots, args.jobs, "ALL,PREVIEW")
    st_keys = [(d["path"], d["line"], d["code"]) for d in st_found]
    per_half, unlabelled = score_halves(st_keys, labels, half_of)
    print(f"`safetorch check --select ALL,PREVIEW -j {args.jobs}`, per rule, both halves:\n")
    totals = print_rule_table(per_half, groups)
    report_unlabelled(unlabelled, half_of, args.list_unlabelled_heldout)
    df_keys = [(d["path"], d["line"], d["code"]) for d in df_found]
    df_half, _ = score_halves(df_keys, labels, half_of)
    df: Dict[str, Counter] = {h: Counter() for h in df_half}
    for half, per_code in df_half.items():
        for code, c in per_code.items():
            if code != "ST000":
                df[half].update(c)
    print(
        f"\nDefault set as run (no --select): dev {precision(df['dev'])} of "
        f"{df['dev']['findings']}, held-out {precision(df['held-out'])} of "
        f"{df['held-out']['findings']}."
    )
    del totals
    rows = [
        (f"safetorch check -j {args.jobs} (default set)", len(df_found), df, df_wall, df_cpu),
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
        tf_labels.update(read_labels(DATA / "torchfix_labels_heldout.tsv", dirs))
        tf_wall, tf_cpu, tf_found = run_torchfix(args.torchfix, args.corpus, roots)
        tf_half, tf_unlabelled = score_halves(tf_found, tf_labels, half_of)
        print(f"\n`torchfix --select ALL -j 1` on the same {len(files)} files, both halves:\n")
        tf_totals = print_rule_table(tf_half, {}, with_group=False)
        for tor, st in _SAME_PITFALL.items():
            ours = {(split_path(p), n) for p, n, c in st_keys if c == st}
            theirs = {(split_path(p), n) for p, n, c in tf_found if c == tor}
            print(
                f"\n{tor} vs {st} (same calls): both {len(ours & theirs)}, only {st} "
                f"{len(ours - theirs)}, only {tor} {len(theirs - ours)}."
            )
        report_unlabelled(tf_unlabelled, half_of, args.list_unlabelled_heldout, "TorchFix ")
        tf = {h: tf_totals["-"][h] for h in ("dev", "held-out")}
        rows.append(("torchfix --select ALL -j 1", len(tf_found), tf, tf_wall, tf_cpu))
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
            r_wall, r_cpu, out = timed(cmd + ["--output-format", "concise", *roots], args.corpus)
            found_r = [ln for ln in out.splitlines() if _FLAKE8.match(ln)]
            print(f"\nruff --select {','.join(codes)}: {len(found_r)} finding(s).")
            rows.append(
                (f"ruff check --select {','.join(codes)}", len(found_r), None, r_wall, r_cpu)
            )

    print(
        "\n| run | findings | dev precision | held-out precision | wall s | CPU s |"
        " lines per CPU s | CPU vs TorchFix |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, count, prec, wall, cpu in rows:
        ratio = f"{tf_cpu / cpu:.1f}x" if tf_cpu and cpu else "-"
        dev = precision(prec["dev"]) if prec else "(per rule above)"
        held = precision(prec["held-out"]) if prec else "(per rule above)"
        print(
            f"| {name} | {count} | {dev} | {held} | {wall:.2f} | {cpu:.2f} | "
            f"{lines / cpu:,.0f} | {ratio} |"
        )
    if args.no_timing:
        return 0
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
