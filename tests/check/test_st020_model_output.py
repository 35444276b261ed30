"""ST020: ``errD.data[0]`` of a model's output whose ``forward`` (in another module of the
project) evidently returns a row (``output.view(1)``): indexing it is valid on every torch,
so the name (``err``) no longer decides. Idioms of 2017 critics, in our own words."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Iterator, List

import pytest

from safetorch.check import project
from safetorch.check.runner import check_paths

CRITIC = """
import torch.nn as nn


class Critic(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Linear(4, 1)

    def forward(self, x):
        output = self.main(x)
        output = output.mean(0)
        return output.view(1)


class Averaged(nn.Module):
    def forward(self, x):
        return x.mean()
"""

TRAIN = """
import torch
import models

if torch.cuda.is_available():
    netD = models.{first}()
else:
    netD = models.{second}()
x = torch.ones(2, 4)
errD_real = netD(x)
errD_fake = netD(x * 2)
errD = errD_real - errD_fake
print(errD.data[0], errD_real.data[0])
"""


@pytest.fixture(autouse=True)
def _fresh_projects() -> Iterator[None]:
    project.clear()
    yield
    project.clear()


def _lines(root: Path, first: str, second: str) -> List[int]:
    (root / "setup.py").write_text("")
    (root / "models.py").write_text(CRITIC)
    (root / "train.py").write_text(textwrap.dedent(TRAIN.format(first=first, second=second)))
    results = check_paths([str(root)], ["ST020", "ST029"])
    return [d.line for r in results if r.path.endswith("train.py") for d in r.diagnostics]


def test_a_critic_whose_forward_returns_a_row_is_not_indexed_as_0_dim(tmp_path: Path) -> None:
    assert _lines(tmp_path, "Critic", "Critic") == []


@pytest.mark.parametrize("first, second", [("Averaged", "Averaged"), ("Critic", "Averaged")])
def test_a_model_that_may_return_a_0_dim_value_keeps_the_finding(
    tmp_path: Path, first: str, second: str
) -> None:
    # forward returns x.mean() (0-dim), on one branch or both: [0] raises there (what the
    # name `err` says: ST029, the flow does not see through the model call).
    assert _lines(tmp_path, first, second) == [13, 13]
