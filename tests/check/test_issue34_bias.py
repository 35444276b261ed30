"""ST008 consults the whole project before it offers ``bias=False`` (issue 34.2): a bias that an
init helper in another file writes, or that a load in another file fills, is never removed.

Each test writes a small project into ``tmp_path`` (``setup.py`` marks its root); where the
fix is offered, the fixed project is run and its checkpoints load strictly.
"""

from __future__ import annotations

import runpy
from pathlib import Path
from typing import Dict, Iterator, List

import pytest
from _check_project import TORCH_LOAD_WARNS, fresh_project, project_findings, write_project

from safetorch.check.engine import Diagnostic
from safetorch.check.runner import check_file

torch = pytest.importorskip("torch")


@pytest.fixture(autouse=True)
def _fresh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    yield from fresh_project(tmp_path, monkeypatch, ("model", "init"))


def project_st008(root: Path) -> Dict[str, List[Diagnostic]]:
    return project_findings(root, "ST008")


MODEL = """
import torch.nn as nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        return self.head(self.features(x).mean((2, 3)))
"""


CLASSNAME_INIT = """
import torch.nn as nn


def weights_init(m):
    classname = m.__class__.__name__
    if classname.find("Conv") != -1:
        nn.init.normal_(m.weight, 0.0, 0.02)
        nn.init.constant_(m.bias, 0)
"""

DCGAN_INIT = """
def weights_init(m):
    classname = m.__class__.__name__
    if classname.find("Conv") != -1:
        m.weight.data.normal_(0.0, 0.02)
    elif classname.find("BatchNorm") != -1:
        m.weight.data.normal_(1.0, 0.02)
        m.bias.data.fill_(0)
"""

TRAIN = """
from model import Net
from init import weights_init

net = Net()
net.apply(weights_init)
"""


def test_init_constant_of_the_bias_in_a_helper_file_blocks_the_fix(tmp_path: Path) -> None:
    write_project(tmp_path, {"model.py": MODEL, "init.py": CLASSNAME_INIT, "train.py": TRAIN})
    (diag,) = project_st008(tmp_path)["model.py"]
    assert diag.fix is None and "init.py:8" in diag.message
    # what bias=False would do: the helper raises on the missing bias
    (tmp_path / "model.py").write_text(MODEL.replace("padding=1)", "padding=1, bias=False)"))
    with pytest.raises((AttributeError, ValueError)):
        runpy.run_path(str(tmp_path / "train.py"))


@TORCH_LOAD_WARNS
def test_a_helper_that_writes_only_batchnorm_biases_keeps_the_fix(tmp_path: Path) -> None:
    write_project(tmp_path, {"model.py": MODEL, "init.py": DCGAN_INIT, "train.py": TRAIN})
    (diag,) = project_st008(tmp_path)["model.py"]
    assert diag.fix is not None
    result = check_file(str(tmp_path / "model.py"), ["ST008"], fix=True, unsafe_fixes=True)
    assert result.after is not None
    (tmp_path / "model.py").write_text(result.after)
    net = runpy.run_path(str(tmp_path / "train.py"))["net"]  # the fixed project runs
    assert net.features[0].bias is None
    torch.save(net.state_dict(), tmp_path / "net.pt")
    type(net)().load_state_dict(torch.load(tmp_path / "net.pt", weights_only=True))


def test_a_package_helper_imported_relatively_blocks_the_fix(tmp_path: Path) -> None:
    write_project(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/model.py": MODEL,
            "pkg/init.py": CLASSNAME_INIT,
            "pkg/train.py": TRAIN.replace("from model", "from .model").replace(
                "from init", "from .init"
            ),
        },
    )
    (diag,) = project_st008(tmp_path)["pkg/model.py"]
    assert diag.fix is None and "pkg/init.py:8" in diag.message


def test_a_bias_loop_over_modules_in_the_training_script_blocks_the_fix(tmp_path: Path) -> None:
    train = """
import torch.nn as nn
from model import Net

net = Net()
for m in net.modules():
    if isinstance(m, nn.Conv2d):
        m.bias.data.fill_(0.01)
"""
    write_project(tmp_path, {"model.py": MODEL, "train.py": train})
    (diag,) = project_st008(tmp_path)["model.py"]
    assert diag.fix is None and "train.py:7" in diag.message


def test_a_pretrained_load_into_a_submodule_elsewhere_blocks_the_fix(tmp_path: Path) -> None:
    train = """
import torch
from model import Net

net = Net()
net.features.load_state_dict(torch.load("features.pt", weights_only=True))
"""
    write_project(tmp_path, {"model.py": MODEL, "train.py": train})
    (diag,) = project_st008(tmp_path)["model.py"]
    assert diag.fix is None and "train.py:5" in diag.message
