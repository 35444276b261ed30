"""Red team of stop 57 (issue 33) on ST006's new waits (distributions, compared reductions) and
ST003's chained whole-module evidence: each problem found, as a regression test, with torch's
own behaviour beside it where the rule relies on it."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import List

import pytest
from _check_project import timed_call_lines

from safetorch.check import check_source

_HEAD = """\
import time
import pandas as pd
import torch
import torch.distributions as D
from torch.distributions.transforms import AffineTransform

model = torch.nn.Linear(4, 4).cuda()

"""


def _st006(statement: str, before: str = "") -> List[int]:
    body = f"""
    {before}
    def bench(x, base, losses, best, v):
        t0 = time.time()
        out = model(x)
        {statement}
        return time.time() - t0
    """
    source = _HEAD + textwrap.dedent(body)
    return [d.line for d in check_source(source, "bench.py", select=["ST006"])]


@pytest.mark.parametrize(
    "statement",
    [
        "d = D.Independent(base, 1)",
        "d = D.TransformedDistribution(base, [D.TanhTransform()])",
        "t = D.transforms.TanhTransform(cache_size=1)",
        "t = AffineTransform(out, 2.0)",
        "c = D.constraints.Interval(0.0, 1.0)",
        "noise = D.Normal(0.0, 0.1)",
        "prior = D.Normal(torch.zeros(4), torch.ones(4))",
        "flag = 1 if torch.tensor(losses).mean() < best else 0",
        "flag = 1 if pd.Series(v).max() > 3 else 0",
    ],
)
def test_what_reads_nothing_from_the_gpu_is_no_wait(statement: str) -> None:
    # No argument constraints to check, no distribution at all, or values on the host: the
    # interval still times only the launch, and stays reported.
    if "flag" in statement:
        statement = statement.replace("flag = 1 if ", "if ").replace(
            " else 0", ":\n            pass"
        )
    assert len(_st006(statement)) == 1


def test_validation_off_only_for_a_literal_false() -> None:
    quiet = _st006("d = D.Normal(out, 1.0)", "D.Distribution.set_default_validate_args(True)")
    assert quiet == []
    off = _st006("d = D.Normal(out, 1.0)", "D.Distribution._validate_args = False")
    assert len(off) == 1


def test_torch_agrees() -> None:
    torch = pytest.importorskip("torch")
    # A distribution without argument constraints builds from an invalid base without a check;
    # a validated one refuses a negative scale (it read the value).
    assert torch.distributions.Independent.arg_constraints == {}
    assert torch.distributions.TransformedDistribution.arg_constraints == {}
    with pytest.raises(ValueError):
        torch.distributions.Normal(torch.zeros(2), -torch.ones(2))


_NETS = """
import torch
from torch import distributions as pyd


class Squashed(pyd.transformed_distribution.TransformedDistribution):
    def __init__(self, loc, scale):
        super().__init__(pyd.Normal(loc, scale), [pyd.transforms.TanhTransform()])


class Scale(pyd.transforms.Transform):
    def _call(self, x):
        return x * 2


class Actor(torch.nn.Module):
    def forward(self, x):
        return Squashed(x, torch.ones_like(x))


class Plain(torch.nn.Module):
    def forward(self, x):
        return Scale()(x)
"""


def test_a_project_distribution_waits_by_what_its_init_builds(tmp_path: Path) -> None:
    assert (
        timed_call_lines(tmp_path, _NETS, "Actor") == []
    )  # its __init__ builds a validated Normal
    assert timed_call_lines(tmp_path, _NETS, "Plain") == [11]  # a transform validates nothing


def test_requires_grad_on_the_loaded_object_is_no_whole_module() -> None:
    source = textwrap.dedent(
        """
        import torch

        def weights(path):
            return torch.load(path).requires_grad_()
        """
    )
    (finding,) = check_source(source, "w.py", select=["ST003"])
    assert "whole module" not in finding.message
    loaded = check_source(source.replace("(path)", "(path, weights_only=True)"), "w.py")
    assert [d.code for d in loaded if d.code == "ST003"] == []
