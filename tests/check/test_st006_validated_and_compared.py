"""ST006 sees two more ways an interval already waits for the GPU (issue 33, stop 57): building a
``torch.distributions`` distribution, which validates its arguments by default (``if not
valid.all()`` reads a tensor back), and an ``if``/``while``/``assert`` that compares a tensor
reduction (``if torch.norm(r) <= tol:``), in the interval or in project code it calls. Each idiom
is written here in our own words; each quiet case sits beside the look-alike that stays
reported. Run side by side with torch: the waits are real (the checks below execute them)."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path
from typing import List

import pytest
import torch
from _check_project import timed_call_lines

from safetorch.check import check_source
from safetorch.check.rules._sync_calls import Distributions, compares_reduction, syncing_definitions

_HEAD = """\
import time
import numpy as np
import torch
import torch.distributions
from torch import distributions as pyd
from torch.distributions import Normal

model = torch.nn.Linear(4, 4).cuda()

"""


def _lines(body: str) -> List[int]:
    """ST006's lines, counted within ``body``."""
    source = _HEAD + textwrap.dedent(body)
    offset = _HEAD.count("\n")
    return [d.line - offset for d in check_source(source, "bench.py", select=["ST006"])]


_VALIDATED = {
    "qualified": "d = torch.distributions.Categorical(logits=out)",
    "module alias": "d = pyd.Normal(out, 1.0)",
    "imported class": "d = Normal(out, torch.ones_like(out))",
    "submodule path": "d = pyd.normal.Normal(out, 1.0)",
}


@pytest.mark.parametrize("build", sorted(_VALIDATED.values()), ids=sorted(_VALIDATED))
def test_building_a_validated_distribution_waits(build: str) -> None:
    body = f"""
    def bench(x):
        t0 = time.time()
        out = model(x)
        {build}
        return time.time() - t0
    """
    assert _lines(body) == []
    # The look-alike that validates nothing stays reported.
    quiet = build[:-1] + ", validate_args=False)"
    assert _lines(body.replace(build, quiet)) == [6]


def test_validation_turned_off_for_the_file_is_no_wait() -> None:
    body = """
    pyd.Distribution.set_default_validate_args(False)

    def bench(x):
        t0 = time.time()
        out = model(x)
        d = pyd.Normal(out, 1.0)
        return time.time() - t0
    """
    assert _lines(body) == [8]


def test_not_a_distribution_class_is_no_wait() -> None:
    body = """
    def bench(x, p, q):
        t0 = time.time()
        out = model(x)
        kl = pyd.kl_divergence(p, q)
        return time.time() - t0
    """
    assert _lines(body) == [6]


@pytest.mark.parametrize(
    "test",
    ["torch.norm(out) <= 1e-3", "out.abs().max() > 10", "out.sum() == 0 or step > 3"],
)
def test_a_compared_reduction_tested_in_the_interval_waits(test: str) -> None:
    body = f"""
    def bench(x, step):
        t0 = time.time()
        out = model(x)
        if {test}:
            print("converged")
        return time.time() - t0
    """
    assert _lines(body) == []


@pytest.mark.parametrize(
    "test", ["np.abs(values).max() > 10", "max(step, 2) > 3", "len(x) > 2", "step.count > 1"]
)
def test_host_values_compared_are_no_wait(test: str) -> None:
    body = f"""
    def bench(x, step, values):
        t0 = time.time()
        out = model(x)
        if {test}:
            print("big")
        return time.time() - t0
    """
    assert _lines(body) == [7]


_NETS = """
import torch
from torch import distributions as pyd


def solve(a, b, tol):
    r = b - a @ b
    for _ in range(50):
        if torch.norm(r) <= tol:
            break
        r = r * 0.5
    return r


def scale(a, b, tol):
    if abs(tol) > 1:
        return a
    return a * b


class Tanh(pyd.transformed_distribution.TransformedDistribution):
    def __init__(self, loc, scale):
        super().__init__(pyd.Normal(loc, scale), [])


class Solver(torch.nn.Module):
    def forward(self, x):
        return solve(x, x, 1e-4)


class Scaler(torch.nn.Module):
    def forward(self, x):
        return scale(x, x, 1e-4)


class Actor(torch.nn.Module):
    def forward(self, x):
        return Tanh(x, torch.ones_like(x))
"""


def test_project_code_that_waits_this_way_quiets_the_interval(tmp_path: Path) -> None:
    found, _reaches, _defined = syncing_definitions(ast.parse(_NETS), "nets.py")
    assert {"solve", "Tanh"} <= found  # the classes calling them wait once the project is joined
    assert not {"scale", "Solver", "Scaler", "Actor"} & found
    assert timed_call_lines(tmp_path, _NETS, "Solver") == []
    assert timed_call_lines(tmp_path, _NETS, "Actor") == []
    assert timed_call_lines(tmp_path, _NETS, "Scaler") == [11]  # the look-alike stays reported


def test_the_helpers_on_their_own() -> None:
    assert compares_reduction(ast.parse("x.norm() < 1").body[0].value)  # type: ignore[attr-defined]
    assert not compares_reduction(ast.parse("math.fabs(a).max() < 1").body[0].value)  # type: ignore[attr-defined]
    d = Distributions(
        ast.parse("import torch.distributions as D\nfrom torch.distributions import Beta")
    )
    assert d.names_class(ast.parse("D.Normal").body[0].value)  # type: ignore[attr-defined]
    assert d.names_class(ast.parse("Beta").body[0].value)  # type: ignore[attr-defined]
    assert not d.names_class(ast.parse("Gamma").body[0].value)  # type: ignore[attr-defined]
    assert not d.names_class(ast.parse("D.constraints").body[0].value)  # type: ignore[attr-defined]


def test_the_waits_are_real_in_torch() -> None:
    # Side by side with torch: building a distribution validates its arguments by default,
    # and a compared reduction is a tensor turned into a Python bool (both read the value).
    assert torch.distributions.Distribution._validate_args
    with pytest.raises(ValueError):
        torch.distributions.Normal(torch.zeros(2), -torch.ones(2))  # read: scale > 0 checked
    torch.distributions.Normal(torch.zeros(2), -torch.ones(2), validate_args=False)  # not read
    assert isinstance(bool(torch.norm(torch.ones(3)) <= 1.0), bool)
