"""Every subcommand of ckpt, run, install-hook, uninstall-hook and doctor with bad input:
one line on stderr naming the value, the documented exit status, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import List

import pytest
import torch

from safetorch._cli import main


@pytest.fixture
def files(tmp_path: Path) -> Path:
    torch.save(torch.nn.Linear(2, 2).state_dict(), tmp_path / "ok.pt")
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint at all")
    (tmp_path / "empty.pt").write_bytes(b"")
    (tmp_path / "dir").mkdir()
    (tmp_path / "cli_err_models.py").write_text(
        "import torch\n"
        "def build():\n    return torch.nn.Linear(2, 2)\n"
        "def broken():\n    raise ValueError('bad config')\n"
        "not_a_factory = 3\n"
    )
    return tmp_path


# (argv with {d} for the temp dir, exit status, text the one line must contain)
CASES = [
    (["ckpt", "inspect", "{d}/dir"], 2, "holds no model weights"),
    (["ckpt", "inspect", "{d}/missing.pt"], 2, "no such file"),
    (["ckpt", "inspect", "{d}/junk.pt"], 2, "junk.pt"),
    (["ckpt", "inspect", "{d}/empty.pt"], 2, "empty.pt"),
    (["ckpt", "inspect", "{d}/dir", "--keys"], 2, "is a directory"),
    (["ckpt", "convert", "{d}/ok.pt", "{d}/missing_dir/x.pt"], 2, "missing_dir"),
    (["ckpt", "convert", "{d}/ok.pt", "{d}/dir"], 2, "is a directory"),
    (["ckpt", "convert", "{d}/missing.pt", "{d}/x.pt"], 2, "no such file"),
    (["ckpt", "convert", "{d}/ok.pt", "{d}/x.pt", "--key", "nope"], 2, "key='nope'"),
    (["ckpt", "convert", "{d}/ok.pt", "{d}/x.pt", "--strip", "model."], 2, "--strip 'model.'"),
    (["ckpt", "convert", "{d}/ok.pt", "{d}/x.pt", "--strip", "bad"], 2, "--strip 'bad'"),
    (["ckpt", "convert", "{d}/ok.pt", "{d}/ok.pt"], 2, "same path"),
    (["ckpt", "diff", "{d}/ok.pt", "{d}/missing.pt"], 2, "no such file"),
    (["ckpt", "diff", "{d}/dir", "{d}/ok.pt"], 2, "is a directory"),
    (["ckpt", "diff", "{d}/ok.pt", "{d}/junk.pt"], 2, "junk.pt"),
    (["ckpt", "diff", "{d}/ok.pt", "{d}/ok.pt", "--key", "nope"], 2, "key='nope'"),
    (["ckpt", "fit", "{d}/ok.pt", "--model", "nomodule_xyz:build"], 2, "nomodule_xyz"),
    (["ckpt", "fit", "{d}/ok.pt", "--model", "cli_err_models"], 2, "MODULE:FACTORY"),
    (["ckpt", "fit", "{d}/ok.pt", "--model", "cli_err_models:nope"], 2, "no attribute 'nope'"),
    (["ckpt", "fit", "{d}/ok.pt", "--model", "cli_err_models:not_a_factory"], 2, "not a factory"),
    (["ckpt", "fit", "{d}/ok.pt", "--model", "cli_err_models:broken"], 2, "bad config"),
    (["ckpt", "fit", "{d}/dir", "--model", "cli_err_models:build"], 2, "is a directory"),
    (["install-hook", "--dir", "{d}/missing/dir"], 2, "does not exist"),
    (["install-hook", "--dir", "{d}/ok.pt"], 2, "not a directory"),
    (["uninstall-hook", "--dir", "{d}/missing/dir"], 2, "does not exist"),
    (["run", "--patch", "nope", "x.py"], 2, "unknown patch 'nope'"),
    (["run", "--allow", "not a name", "x.py"], 2, "--allow 'not a name'"),
    (["run"], 2, "missing SCRIPT"),
]


@pytest.mark.parametrize("argv,status,text", CASES, ids=[" ".join(c[0]) for c in CASES])
def test_bad_input_is_one_line_without_traceback(
    files: Path, argv: List[str], status: int, text: str, capsys, monkeypatch
) -> None:
    monkeypatch.chdir(files)
    monkeypatch.syspath_prepend(str(files))
    args = [a.replace("{d}", str(files)) for a in argv]
    assert main(args) == status
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"safetorch {args[0]}") and text in lines[0], lines[0]


# `safetorch run` exits as python does; it is run in a child so that the program runs for real.
RUN_CASES = [
    (["{d}/missing.py"], 2, "can't open file"),
    (["{d}/dir"], 1, "can't find '__main__' module"),
    (["-m", "no_such_module_xyz"], 1, "No module named no_such_module_xyz"),
]


@pytest.mark.parametrize("argv,status,text", RUN_CASES, ids=[" ".join(c[0]) for c in RUN_CASES])
def test_run_refuses_like_python_without_report(
    files: Path, argv: List[str], status: int, text: str
) -> None:
    args = [a.replace("{d}", str(files)) for a in argv]
    out = subprocess.run(
        [sys.executable, "-m", "safetorch", "run", *args],
        capture_output=True,
        text=True,
        cwd=files,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        timeout=120,
    )
    assert out.returncode == status, out.stderr
    assert "Traceback" not in out.stderr and "patches on" not in out.stderr  # no report
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and text in lines[0], out.stderr
    python = subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, cwd=files, timeout=60
    )
    assert python.returncode == status  # the same status python gives


def test_doctor_flags_a_bad_environment(capsys, monkeypatch) -> None:
    monkeypatch.setenv("SAFETORCH_PATCH", "bogus")
    assert main(["doctor"]) == 1
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("safetorch doctor: 2 problems: SAFETORCH_PATCH='bogus' is ignored")
    monkeypatch.delenv("SAFETORCH_PATCH")
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("safetorch doctor: ok: torch ")
    assert "SAFETORCH_PATCH   (unset)" in out and "hook " in out
