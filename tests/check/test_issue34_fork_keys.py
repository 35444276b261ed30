"""Two rules of issue 34.4 whose fixes reproduce what ``safetorch run`` does: ST023 (fork after
OpenMP: one intra-op thread in the child) and ST024 (InstanceNorm keys of torch < 0.4:
``st.load_state_dict``). The fixed code is run: the Hogwild child trains with one thread, the
old checkpoint loads."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import textwrap
from collections import OrderedDict
from pathlib import Path
from typing import Iterator, List

import pytest
from _check_project import fresh_project, project_findings, write_project

from safetorch.check import check_source, fix_source
from safetorch.check.engine import Diagnostic
from safetorch.check.runner import check_file

torch = pytest.importorskip("torch")

HOGWILD = """
import torch
import torch.multiprocessing as mp
import torch.nn as nn


def train(rank, model, out):
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(3):
        loss = model(torch.randn(8, 16)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    out.put((rank, torch.get_num_threads()))


if __name__ == "__main__":
    torch.manual_seed(0)
    model = nn.Linear(16, 4)
    model(torch.randn(64, 16)).sum()  # the parent runs torch ops first
    model.share_memory()
    out = mp.SimpleQueue()
    workers = []
    for rank in range(2):
        p = mp.Process(target=train, args=(rank, model, out))
        p.start()
        workers.append(p)
    for p in workers:
        p.join()
    print(sorted(out.get() for _ in workers))
"""


def _st(source: str, code: str) -> List[Diagnostic]:
    return check_source(textwrap.dedent(source), "hogwild.py", [code])


def test_from_torch_import_multiprocessing_is_found_too() -> None:
    source = HOGWILD.replace(
        "import torch.multiprocessing as mp", "from torch import multiprocessing as mp"
    )
    assert [d.code for d in _st(source, "ST023")] == ["ST023"]


def test_hogwild_after_torch_ops_is_found_and_fixed_with_one_thread() -> None:
    (finding,) = _st(HOGWILD, "ST023")
    assert finding.fix is not None and "set_num_threads(1)" in finding.message
    fixed = fix_source(HOGWILD, "hogwild.py", ["ST023"], unsafe_fixes=True)
    assert "def train(rank, model, out):\n    torch.set_num_threads(1)\n    opt =" in fixed
    assert _st(fixed, "ST023") == []


@pytest.mark.skipif(
    "fork" not in multiprocessing.get_all_start_methods(), reason="fork is POSIX-only"
)
def test_the_fixed_hogwild_script_runs_and_each_child_has_one_thread(tmp_path: Path) -> None:
    fixed = fix_source(HOGWILD, "hogwild.py", ["ST023"], unsafe_fixes=True)
    script = tmp_path / "hogwild.py"
    script.write_text(fixed)
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[(0, 1), (1, 1)]"


@pytest.mark.parametrize(
    "change",
    [
        (
            'if __name__ == "__main__":\n',
            'if __name__ == "__main__":\n    mp.set_start_method("spawn")\n',
        ),
        (
            "def train(rank, model, out):\n",
            "def train(rank, model, out):\n    torch.set_num_threads(1)\n",
        ),
        ("    model(torch.randn(64, 16)).sum()  # the parent runs torch ops first\n", ""),
    ],
    ids=["spawn", "threads-set", "no-torch-before"],
)
def test_not_reported_where_the_child_is_safe(change: tuple) -> None:
    source = HOGWILD.replace(*change)
    if change[0].startswith("    model(torch"):
        source = source.replace("    model = nn.Linear(16, 4)\n", "    model = None\n")
        source = source.replace("    model.share_memory()\n", "")
    assert _st(source, "ST023") == []


# -- ST024 ------------------------------------------------------------------------------------
NET = """
import torch.nn as nn


class Stylizer(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.in1 = nn.InstanceNorm2d(4, affine=True)

    def forward(self, x):
        return self.in1(self.conv(x))
"""

STYLIZE = """
import sys
import torch
from net import Stylizer

model = Stylizer()
model.load_state_dict(torch.load(sys.argv[1]))
out = model(torch.ones(1, 3, 8, 8))
"""


@pytest.fixture()
def project_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    for _ in fresh_project(tmp_path, monkeypatch, ("net",)):
        yield tmp_path


def _old_checkpoint(path: Path) -> None:
    """What torch 0.3 saved for Stylizer: InstanceNorm running stats, no version metadata."""
    sys.path.insert(0, str(path.parent))
    try:
        from net import Stylizer
    finally:
        sys.path.remove(str(path.parent))
    state = OrderedDict(Stylizer().state_dict().items())
    state["in1.running_mean"] = torch.zeros(4)
    state["in1.running_var"] = torch.ones(4)
    torch.save(state, path)


def test_an_old_release_checkpoint_load_is_routed_to_st_load_state_dict(project_dir: Path) -> None:
    write_project(project_dir, {"net.py": NET, "stylize.py": STYLIZE})
    (finding,) = project_findings(project_dir, "ST024")["stylize.py"]
    assert finding.fix is not None
    result = check_file(str(project_dir / "stylize.py"), ["ST024"], fix=True, unsafe_fixes=True)
    assert result.after is not None
    assert "st.load_state_dict(model, sys.argv[1])" in result.after
    old = project_dir / "mosaic.pth"
    _old_checkpoint(old)
    model = sys.modules["net"].Stylizer()
    with pytest.raises(RuntimeError, match="running stats"):
        model.load_state_dict(torch.load(old))  # what the unfixed script does
    (project_dir / "stylize_fixed.py").write_text(result.after)
    done = subprocess.run(
        [sys.executable, "stylize_fixed.py", str(old)],
        cwd=project_dir,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(project_dir), *sys.path])},
    )
    assert done.returncode == 0, done.stderr


def test_a_file_the_project_writes_is_not_reported(project_dir: Path) -> None:
    save = (
        "import torch\nfrom net import Stylizer\ntorch.save(Stylizer().state_dict(), sys.argv[1])\n"
    )
    write_project(project_dir, {"net.py": NET, "stylize.py": STYLIZE, "train.py": save})
    assert project_findings(project_dir, "ST024")["stylize.py"] == []


def test_keys_removed_by_hand_and_tracked_stats_are_not_reported(project_dir: Path) -> None:
    by_hand = STYLIZE.replace(
        "model.load_state_dict(torch.load(sys.argv[1]))\n",
        "state = torch.load(sys.argv[1])\n"
        "for k in [k for k in state if k.endswith(('running_mean', 'running_var'))]:\n"
        "    del state[k]\n"
        "model.load_state_dict(state)\n",
    )
    tracked = NET.replace("affine=True)", "affine=True, track_running_stats=True)")
    write_project(project_dir, {"net.py": NET, "stylize.py": by_hand})
    assert project_findings(project_dir, "ST024")["stylize.py"] == []
    write_project(project_dir, {"net.py": tracked, "stylize.py": STYLIZE})
    from safetorch.check import project

    project.clear()
    assert project_findings(project_dir, "ST024")["stylize.py"] == []
