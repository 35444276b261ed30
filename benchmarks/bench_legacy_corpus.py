"""Real 2017-2019 scripts the project has not seen, on this torch (issue 34).

Reads ``benchmarks/legacy_corpus/corpus.tsv`` (or ``--corpus``: repository, commit, path, command, half) and a
directory holding each repository extracted at that commit as ``owner+name/`` (this script
fetches nothing). For every script, three legs, each in a fresh copy of its repository and
run from the script's directory:

- ``plain``: ``python SCRIPT ARGS``;
- ``run``: ``python -m safetorch run SCRIPT ARGS``;
- ``fixed``: ``python -m safetorch check --fix --unsafe-fixes --select ALL,PREVIEW`` on a copy
  of the whole repository, then plain ``python`` on the fixed copy. ``fixed-default`` is the
  same with the default rule selection (no ``PREVIEW``); it is run only where its fixed tree
  differs from the ``fixed`` one, else it inherits that outcome.

Data and environment, without editing a script: a ``sitecustomize.py`` on ``PYTHONPATH``
replaces torchvision's downloadable datasets (MNIST, FashionMNIST, KMNIST, CIFAR10,
CIFAR100, SVHN, STL10) by small deterministic synthetic ones (``--train-size`` /
``--test-size`` items, the classes' old attribute names too), refuses network connections,
seeds ``random``, numpy and torch (0) when each is first imported and fixes
``PYTHONHASHSEED`` (so every leg draws the same numbers and orders a ``set()`` of words the
same way, even where the script sets no seed), uses matplotlib's Agg backend, and touches a
marker file at the first ``optimizer.step()``. ``--torchvision-0.2-normalize`` (a separate,
labelled measurement) also makes ``transforms.Normalize`` work channel by channel as
torchvision 0.2 did, to see what a script does past that torchvision change. Files a script reads from its
working directory (MNIST's idx files where a script parses them itself) are written before
the run, outside the script; so is ``legacy_eval_text.txt`` (seeded common English words)
where a command names it as the text corpus to train on.

Outcome rule: ``ok`` is exit status 0; a run stopped by the ``--timeout`` (default 60 s)
counts as ``ok (timeout)`` only when at least one optimizer step completed before it, else
it is ``timeout``; anything else is ``fail`` with the exception's last line. Losses: the
numbers on the first three stdout lines that mention "loss" (or "cost") are compared between the legs
(``same`` when equal to 4 significant digits).

    python benchmarks/bench_legacy_corpus.py /tmp/legacy_eval/src --out /tmp/legacy_eval/out
    python benchmarks/bench_legacy_corpus.py SRC --only 6_lstm.py,GAN.py --legs plain,run

Child processes run under ``nice -n 10`` with ``OMP_NUM_THREADS=1``; ``--jobs`` legs run at
once. Writes ``results.json`` and a TSV (``--tsv``) in the layout of
``benchmarks/legacy_corpus/scripts.tsv``.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import filecmp
import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np

HERE = Path(__file__).resolve().parent
CORPUS = HERE / "legacy_corpus" / "corpus.tsv"
LIB: Optional[Path] = None  # --lib: the safetorch package to measure, first on PYTHONPATH

SITECUSTOMIZE = r"""
import importlib.abc, importlib.machinery, os, random, socket, sys

random.seed(0)
_MARK = os.environ.get("LEGACY_EVAL_MARK")
_TRAIN = int(os.environ.get("LEGACY_EVAL_TRAIN", "512"))
_TEST = int(os.environ.get("LEGACY_EVAL_TEST", "128"))
os.environ.setdefault("MPLBACKEND", "Agg")


def _no_network(*args, **kwargs):
    raise OSError("network access is blocked by the legacy-corpus harness")


_connect = socket.socket.connect


def _local_only(self, address, *args, **kwargs):
    # AF_UNIX stays open: DataLoader workers hand tensors over through a local socket
    if self.family == getattr(socket, "AF_UNIX", None):
        return _connect(self, address, *args, **kwargs)
    return _no_network()


socket.socket.connect = _local_only
socket.create_connection = _no_network


def _after_numpy(mod):
    mod.random.seed(0)


def _after_torch(mod):
    mod.manual_seed(0)

    def _mark(optimizer, args, kwargs):
        global _MARK
        if _MARK:
            open(_MARK, "w").close()
            _MARK = None

    import torch.optim.optimizer as optimizer

    optimizer.register_optimizer_step_post_hook(_mark)


def _after_datasets(mod):
    import numpy as np
    import torch
    from PIL import Image

    def fake(name, shape, classes, mode, chw=False):
        class Fake(torch.utils.data.Dataset):
            def __init__(self, root=None, train=True, transform=None, target_transform=None,
                         download=False, split=None, **kwargs):
                training = train if split is None else split in ("train", "unlabeled")
                n = _TRAIN if training else _TEST
                rs = np.random.RandomState(1234 + (0 if training else 1))
                data = rs.randint(0, 256, (n,) + shape).astype(np.uint8)
                labels = rs.randint(0, classes, n)
                self.root, self.train, self.transform = root, training, transform
                self.target_transform = target_transform
                if mode == "L":
                    self.data = torch.from_numpy(data)
                    self.targets = torch.from_numpy(labels).long()
                else:
                    self.data = data.transpose(0, 3, 1, 2) if chw else data
                    self.targets = [int(t) for t in labels]
                self.labels = self.targets
                self.classes = [str(i) for i in range(classes)]
                self.train_data = self.test_data = self.data
                self.train_labels = self.test_labels = self.targets

            def __len__(self):
                return len(self.targets)

            def __getitem__(self, index):
                arr = self.data[index]
                if mode == "L":
                    img = Image.fromarray(arr.numpy(), mode="L")
                else:
                    img = Image.fromarray(arr.transpose(1, 2, 0) if chw else arr)
                target = int(self.targets[index])
                if self.transform is not None:
                    img = self.transform(img)
                if self.target_transform is not None:
                    target = self.target_transform(target)
                return img, target

        Fake.__name__ = Fake.__qualname__ = name
        return Fake

    for name in ("MNIST", "FashionMNIST", "KMNIST", "EMNIST", "QMNIST"):
        setattr(mod, name, fake(name, (28, 28), 10, "L"))
    mod.CIFAR10 = fake("CIFAR10", (32, 32, 3), 10, "RGB")
    mod.CIFAR100 = fake("CIFAR100", (32, 32, 3), 100, "RGB")
    mod.SVHN = fake("SVHN", (3, 32, 32), 10, "RGB", chw=True)
    mod.STL10 = fake("STL10", (3, 96, 96), 10, "RGB", chw=True)


def _after_transforms(mod):
    # --torchvision-0.2-normalize: Normalize as torchvision <= 0.2 applied it, channel by
    # channel through zip(), so a 3-value mean on a 1-channel image used the first value
    # (torchvision 0.3 broadcasts and raises)
    def forward(self, tensor):
        out = tensor.clone() if not getattr(self, "inplace", False) else tensor
        for t, m, s in zip(out, self.mean, self.std):
            t.sub_(m).div_(s)
        return out

    mod.Normalize.forward = forward


_AFTER = {"numpy": _after_numpy, "torch": _after_torch, "torchvision.datasets": _after_datasets}
if os.environ.get("LEGACY_EVAL_TV02_NORMALIZE"):
    _AFTER["torchvision.transforms.transforms"] = _after_transforms


class _Loader(importlib.abc.Loader):
    def __init__(self, inner, name):
        self.inner, self.name = inner, name

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module):
        self.inner.exec_module(module)
        after = _AFTER.pop(self.name, None)  # once, when the module really runs
        if after is not None:
            after(module)


class _Finder(importlib.abc.MetaPathFinder):
    # a find_spec alone (importlib.util.find_spec("torch"), as `safetorch run` asks before
    # importing torch) must not use the hook up: it fires when the module's code runs
    def find_spec(self, name, path, target=None):
        if name not in _AFTER:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader, name)
        return spec


sys.meta_path.insert(0, _Finder())
"""


def _idx(path: Path, arr: np.ndarray) -> None:
    """MNIST's idx format (gzip): magic, sizes, then the bytes."""
    header = bytes([0, 0, 8, arr.ndim]) + b"".join(d.to_bytes(4, "big") for d in arr.shape)
    with gzip.open(path, "wb", compresslevel=1) as f:
        f.write(header + arr.astype(np.uint8).tobytes())


TEXT_FILE = "legacy_eval_text.txt"
_WORDS = (
    "the of and to in a is that for it as was with be by on not he this are or his from at "
    "which but have an they you were her she there been one all we their has would when if "
    "so no will more can who said what about out up into them then some could time these two"
).split()


def _text(path: Path, n_words: int = 40000) -> None:
    """A plain-text corpus of common English words (seeded), for a script that reads one."""
    rs = np.random.RandomState(11)
    words = rs.choice(_WORDS, n_words)
    lines = [" ".join(words[i : i + 12]).capitalize() + "." for i in range(0, n_words, 12)]
    path.write_text("\n".join(lines) + "\n")


def _setup(workdir: Path, argv: Optional[List[str]] = None) -> None:
    """Files a script reads from its working directory, written outside the script.

    ``legacy_eval_text.txt`` is written wherever a command names it (a text corpus for
    character- or word-level language models that take the corpus's path as an argument).
    """
    if argv and TEXT_FILE in argv:
        _text(workdir / TEXT_FILE)
    if (workdir / "data_util.py").exists() and "yann.lecun.com" in (
        workdir / "data_util.py"
    ).read_text(errors="replace"):
        d = workdir / "datasets" / "mnist"
        d.mkdir(parents=True, exist_ok=True)
        rs = np.random.RandomState(7)
        for name, shape, hi in (
            ("train-images-idx3-ubyte.gz", (60000, 28, 28), 256),
            ("train-labels-idx1-ubyte.gz", (60000,), 10),
            ("t10k-images-idx3-ubyte.gz", (10000, 28, 28), 256),
            ("t10k-labels-idx1-ubyte.gz", (10000,), 10),
        ):
            _idx(d / name, rs.randint(0, hi, shape))


def _last_error(stderr: str) -> str:
    for line in reversed(stderr.strip().splitlines()):
        line = line.strip()
        if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Warning)\b", line):
            return line[:200]
    tail = stderr.strip().splitlines()
    return tail[-1][:200] if tail else ""


_NUM = re.compile(r"[-+]?\d+\.\d+(?:[eE][-+]?\d+)?|[-+]?\d+[eE][-+]?\d+")


def _losses(stdout: str) -> List[str]:
    """The numbers on the first three stdout lines that mention a loss, to 4 digits."""
    lines = [ln for ln in stdout.splitlines() if "loss" in ln.lower() or "cost" in ln.lower()][:3]
    return [f"{float(x):.4g}" for line in lines for x in _NUM.findall(line)]


def _run_leg(
    python: str,
    sitedir: Path,
    repo_copy: Path,
    rel: str,
    argv: List[str],
    leg: str,
    timeout: float,
    train: int,
    test: int,
) -> Dict[str, object]:
    script_dir = repo_copy / Path(rel).parent
    mark = repo_copy.parent / f".{leg}.stepped"
    env = dict(os.environ)
    env.update(
        PYTHONPATH=os.pathsep.join(str(p) for p in (LIB, sitedir) if p),
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        LEGACY_EVAL_MARK=str(mark),
        LEGACY_EVAL_TRAIN=str(train),
        LEGACY_EVAL_TEST=str(test),
        MPLBACKEND="Agg",
        PYTHONDONTWRITEBYTECODE="1",
        PYTHONHASHSEED="0",  # set() of words: the same vocabulary order in every leg
        CUDA_VISIBLE_DEVICES="",
    )
    head = [python, "-m", "safetorch", "run"] if leg == "run" else [python]
    cmd = ["nice", "-n", "10", "timeout", "-s", "KILL", str(timeout), *head, *argv]
    t0 = time.time()
    p = subprocess.run(
        cmd, cwd=script_dir, env=env, capture_output=True, text=True, errors="replace"
    )
    wall = time.time() - t0
    stepped = mark.exists()
    if p.returncode == 0:
        outcome = "ok"
    elif p.returncode in (124, 137, -9):
        outcome = "ok (timeout)" if stepped else "timeout"
    else:
        outcome = "fail"
    return {
        "leg": leg,
        "rc": p.returncode,
        "outcome": outcome,
        "stepped": stepped,
        "wall": round(wall, 1),
        "error": "" if outcome.startswith("ok") else _last_error(p.stderr),
        "losses": _losses(p.stdout),
        "stdout_tail": p.stdout[-1500:],
        "stderr_tail": p.stderr[-4000:],
    }


def _fix(python: str, src: Path, dest: Path, preview: bool) -> str:
    shutil.copytree(src, dest, symlinks=True)
    cmd = [
        python,
        "-m",
        "safetorch",
        "check",
        "--fix",
        "--unsafe-fixes",
        "--isolated",
        "--exit-zero",
        "--show-fixes",
    ]
    if preview:
        cmd += ["--select", "ALL,PREVIEW"]
    p = subprocess.run(
        [*cmd, str(dest)],
        capture_output=True,
        text=True,
        errors="replace",
        env={**os.environ, "OMP_NUM_THREADS": "1", **({"PYTHONPATH": str(LIB)} if LIB else {})},
        cwd=dest.parent,  # not ours: `-m` puts the working directory first on sys.path
    )
    return p.stdout[-20000:] + p.stderr[-5000:]


def _same_tree(a: Path, b: Path) -> bool:
    for path in a.rglob("*.py"):
        other = b / path.relative_to(a)
        if not other.exists() or not filecmp.cmp(path, other, shallow=False):
            return False
    return True


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src", type=Path, help="directory of extracted repositories (owner+name/)")
    ap.add_argument("--out", type=Path, default=None, help="where results and copies go")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--timeout", type=float, default=60.0)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--train-size", type=int, default=512)
    ap.add_argument("--test-size", type=int, default=128)
    ap.add_argument("--only", default="", help="comma-separated paths (or their file names)")
    ap.add_argument("--half", default=None, help="only the scripts of this half (dev, held-out)")
    ap.add_argument("--legs", default="plain,run,fixed,fixed-default")
    ap.add_argument("--tsv", type=Path, default=None)
    ap.add_argument(
        "--corpus",
        type=Path,
        default=CORPUS,
        help="the corpus TSV (default: the first batch, legacy_corpus/corpus.tsv; the second "
        "batch is legacy_corpus/corpus2.tsv)",
    )
    ap.add_argument(
        "--torchvision-0.2-normalize",
        dest="tv02_normalize",
        action="store_true",
        help="Normalize channel by channel as torchvision <= 0.2 did (a 3-value mean on a "
        "1-channel image used its first value; torchvision 0.3 raises), in every leg",
    )
    ap.add_argument(
        "--lib",
        type=Path,
        default=None,
        help="a directory holding the safetorch package to measure (first on PYTHONPATH)",
    )
    args = ap.parse_args(argv)
    global LIB
    LIB = args.lib
    if args.tv02_normalize:
        os.environ["LEGACY_EVAL_TV02_NORMALIZE"] = "1"
    out = args.out or Path(tempfile.mkdtemp(prefix="legacy_corpus_"))
    out.mkdir(parents=True, exist_ok=True)
    sitedir = out / "site"
    sitedir.mkdir(exist_ok=True)
    (sitedir / "sitecustomize.py").write_text(SITECUSTOMIZE)
    legs = args.legs.split(",")
    only = {x for x in args.only.split(",") if x}

    rows = [
        line.rstrip("\n").split("\t")
        for line in args.corpus.read_text(encoding="utf-8").splitlines()[1:]
    ]
    if only:
        rows = [r for r in rows if r[3] in only or Path(r[3]).name in only]
    if args.half:
        rows = [r for r in rows if r[5] == args.half]

    fixed_trees: Dict[Tuple[str, bool], Path] = {}
    same_default: Dict[str, bool] = {}
    for repo in sorted({r[0] for r in rows}):
        src = args.src / repo.replace("/", "+")
        for preview in (True, False):
            if ("fixed" if preview else "fixed-default") not in legs:
                continue
            dest = out / "fixed" / ("preview" if preview else "default") / repo.replace("/", "+")
            if dest.exists():
                shutil.rmtree(dest)
            dest.parent.mkdir(parents=True, exist_ok=True)
            log = _fix(args.python, src, dest, preview)
            (dest.parent / (repo.replace("/", "+") + ".fix.log")).write_text(log)
            fixed_trees[(repo, preview)] = dest
        if (repo, True) in fixed_trees and (repo, False) in fixed_trees:
            same_default[repo] = _same_tree(
                fixed_trees[(repo, True)], fixed_trees[(repo, False)]
            ) and _same_tree(fixed_trees[(repo, False)], fixed_trees[(repo, True)])

    jobs = []
    for r in rows:
        repo, _commit, _date, rel, command, _half = r
        argv_ = _split_command(command)
        for leg in legs:
            if leg == "fixed-default" and same_default.get(repo, False):
                continue
            if leg in ("plain", "run"):
                base = args.src / repo.replace("/", "+")
            else:
                base = fixed_trees[(repo, leg == "fixed")]
            jobs.append((r, leg, base, rel, argv_))

    def one(job: Tuple[List[str], str, Path, str, List[str]]) -> Tuple[str, str, Dict[str, object]]:
        r, leg, base, rel, argv_ = job
        work = Path(tempfile.mkdtemp(prefix="w_", dir=out))
        copy = work / "repo"
        shutil.copytree(base, copy, symlinks=True)
        _setup(copy / Path(rel).parent, argv_)
        res = _run_leg(
            args.python,
            sitedir,
            copy,
            rel,
            argv_,
            leg,
            args.timeout,
            args.train_size,
            args.test_size,
        )
        shutil.rmtree(work, ignore_errors=True)
        return r[0] + ":" + r[3], leg, res

    results: Dict[str, Dict[str, object]] = {}
    with cf.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        for key, leg, res in pool.map(one, jobs):
            results.setdefault(key, {})[leg] = res
            print(
                f"{key:75s} {leg:14s} {res['outcome']:13s} {res['wall']:6.1f}s {res['error']}",
                flush=True,
            )
    for r in rows:
        key = r[0] + ":" + r[3]
        if "fixed-default" in legs and same_default.get(r[0], False):
            results[key]["fixed-default"] = dict(results[key]["fixed"], inherited=True)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    if args.tsv:
        _write_tsv(args.tsv, rows, results)
    return 0


def _split_command(command: str) -> List[str]:
    import shlex

    return shlex.split(command)


def _write_tsv(path: Path, rows: List[List[str]], results: Dict[str, Dict[str, object]]) -> None:
    def word(res: Optional[Dict[str, object]]) -> str:
        if res is None:
            return "-"
        o = str(res["outcome"])
        return o if o.startswith("ok") else f"{o}: {res['error']}"

    with open(path, "w") as f:
        f.write("repo\tcommit\tpath\thalf\tplain\trun\tfixed\tfixed_default\tlosses\tcause\n")
        for r in rows:
            res = results.get(r[0] + ":" + r[3], {})
            run, fixed = res.get("run"), res.get("fixed")
            if run and fixed and run.get("losses") and fixed.get("losses"):
                lo = "same" if run["losses"] == fixed["losses"] else "differ"
            else:
                lo = "n/a"
            f.write(
                "\t".join(
                    [
                        r[0],
                        r[1],
                        r[3],
                        r[5],
                        word(res.get("plain")),
                        word(run),
                        word(fixed),
                        word(res.get("fixed-default")),
                        lo,
                        "",
                    ]
                )
                + "\n"
            )


if __name__ == "__main__":
    sys.exit(main())
