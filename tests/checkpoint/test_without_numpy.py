"""Without numpy (torch does not require it): the README's first block, resume state, a trusted
whole-model file and ``safetorch doctor`` work in a process where ``import numpy`` fails.

The child gets a ``sitecustomize`` on ``PYTHONPATH`` whose meta-path finders find no numpy,
as a clean install without it would (torch then warns "Failed to initialize NumPy" at import,
its own warning, left alone here).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Every finder answers for numpy as where it is not installed: no spec (None), so
# importlib.util.find_spec("numpy") is None and `import numpy` raises ModuleNotFoundError. A
# finder that raises from find_spec instead is no install's behaviour: torch 2.1's dynamo asks
# find_spec for numpy at import (torch/_dynamo/skipfiles.py) and would fail only here.
_BLOCKER = """
import sys

class _NoNumpy:
    def __init__(self, finder):
        self.finder = finder

    def find_spec(self, name, path=None, target=None):
        if name == "numpy" or name.startswith("numpy."):
            return None
        return self.finder.find_spec(name, path, target)

    def invalidate_caches(self):
        if hasattr(self.finder, "invalidate_caches"):
            self.finder.invalidate_caches()

sys.meta_path[:] = [_NoNumpy(f) if hasattr(f, "find_spec") else f for f in sys.meta_path]
"""


def _run_without_numpy(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    blocker = tmp_path / "blocker"
    blocker.mkdir(exist_ok=True)
    (blocker / "sitecustomize.py").write_text(_BLOCKER, encoding="utf-8")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(blocker), str(ROOT)]))
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    return subprocess.run(
        [sys.executable, *args], cwd=work, env=env, capture_output=True, text=True, timeout=300
    )


def _readme_first_block() -> tuple:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    found = re.search(r"```python\n(.*?)```\s*```text\n(.*?)```", text, flags=re.S)
    assert found is not None, "the README's first python block and its output"
    return found.group(1), found.group(2)


def test_numpy_is_blocked_in_the_child(tmp_path: Path) -> None:
    out = _run_without_numpy(tmp_path, "-c", "import numpy")
    assert out.returncode != 0 and "No module named 'numpy'" in out.stderr
    look = "import importlib.util; assert importlib.util.find_spec('numpy') is None"
    assert _run_without_numpy(tmp_path, "-c", look).returncode == 0  # as where it is absent


def test_readme_first_block_runs_without_numpy(tmp_path: Path) -> None:
    code, expected = _readme_first_block()
    check = "\nimport sys\nassert 'numpy' not in sys.modules\n"
    out = _run_without_numpy(tmp_path, "-c", code + check)
    assert out.returncode == 0, out.stderr
    assert out.stdout == expected


def test_resume_state_and_trusted_file_without_numpy(tmp_path: Path) -> None:
    code = """
import random, torch, safetorch as st
model = torch.nn.Linear(3, 2)
random.seed(1); torch.manual_seed(1)
st.save_state("state.pt", model=model, step=5)
want = (random.random(), torch.rand(2).tolist())
fresh = torch.nn.Linear(3, 2)
extras = st.load_state("state.pt", model=fresh)  # RNG restored: the same draws again
assert extras == {"step": 5}, extras
assert (random.random(), torch.rand(2).tolist()) == want
assert torch.equal(fresh.weight, model.weight)
st.save(model, "whole.pt")  # a whole module: trusted by provenance, loaded fully
assert torch.equal(st.load("whole.pt").weight, model.weight)
print("ok")
"""
    out = _run_without_numpy(tmp_path, "-c", code)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "ok\n"


@pytest.mark.parametrize("with_numpy", [False, True])
def test_doctor_reports_numpy(tmp_path: Path, with_numpy: bool) -> None:
    args = ("-m", "safetorch", "doctor", "--json")
    if with_numpy:
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        out = subprocess.run(
            [sys.executable, *args], env=env, capture_output=True, text=True, timeout=300
        )
    else:
        out = _run_without_numpy(tmp_path, *args)
    report = json.loads(out.stdout)
    numpy = report["versions"]["numpy"]
    if with_numpy:
        import numpy as np

        assert numpy == np.__version__
    else:
        assert numpy.startswith("not importable")
    assert not any("numpy" in p for p in report["problems"])
