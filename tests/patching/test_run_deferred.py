"""``safetorch run`` raises a deferred out-of-range index at the end of the script (issue 26):
a record that ``mode="deferred"`` made and nothing raised is the script's error."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """\
import torch
import safetorch as st

x = torch.arange(4)
y = st.checked_index(x, torch.tensor([1, 9]), mode="deferred")
print("ran", y.tolist())
"""


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAFETORCH_")}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


def test_a_deferred_record_nobody_raised_fails_the_run_naming_the_line(tmp_path) -> None:
    (tmp_path / "train.py").write_text(SCRIPT)
    plain = _run("train.py", cwd=tmp_path)  # side by side: plain python never hears of it
    assert plain.returncode == 0 and plain.stdout.startswith("ran"), plain.stderr
    run = _run("-m", "safetorch", "run", "--no-report", "train.py", cwd=tmp_path)
    assert run.returncode == 1 and run.stdout.startswith("ran")
    assert "IndexError" in run.stderr or "IndexOutOfBoundsError" in run.stderr, run.stderr
    assert "index 9 is out of bounds for dimension 0 with size 4" in run.stderr
    assert "train.py:5" in run.stderr, run.stderr


def test_a_clean_deferred_script_runs_as_plain_python(tmp_path) -> None:
    (tmp_path / "ok.py").write_text(SCRIPT.replace("[1, 9]", "[1, 3]"))
    run = _run("-m", "safetorch", "run", "--no-report", "ok.py", cwd=tmp_path)
    assert run.returncode == 0 and run.stdout.strip() == "ran [1, 3]", run.stderr
