"""ST028 (issue 34): a BCE label built with a written-out shape in 0.3-era code. The fix,
``target.reshape_as(input)``, is what torch 0.2-1.6 computed where the shapes differ and changes
nothing where they match; each fixed idiom is run with plain torch beside the ``legacy`` shim
(``st.legacy.binary_cross_entropy``) and torch's own call."""

from __future__ import annotations

import textwrap
import warnings
from typing import Any, Dict, List

import pytest
import torch
from _check_project import run_fixed
from hypothesis import given, settings
from hypothesis import strategies as hst

import safetorch as st
from safetorch.check import check_source, fix_source
from safetorch.check.engine import Diagnostic
from safetorch.errors import PatchWarning

# ``from torch.autograd import Variable``: the 0.3-era evidence the rule (and the shim) ask for.
HEADER = "import torch\nimport torch.nn as nn\nfrom torch.autograd import Variable\n"


def _findings(body: str, header: str = HEADER) -> List[Diagnostic]:
    return list(check_source(header + textwrap.dedent(body), select=["ST028"]))


def _run_fixed(body: str) -> Dict[str, Any]:
    return run_fixed(HEADER + textwrap.dedent(body), ["ST028"])


def test_labels_of_a_column_shape_against_a_squeezed_output_are_fixed_and_run() -> None:
    body = """
        torch.manual_seed(0)
        criterion = nn.BCELoss()
        out = torch.sigmoid(torch.randn(6))
        real = criterion(out, Variable(torch.ones(6, 1)))
        label = Variable(torch.FloatTensor(6, 1).fill_(0))
        fake = criterion(out, label)
        direct = nn.functional.binary_cross_entropy(out, torch.zeros([6, 1]))
    """
    found = _findings(body)
    assert len(found) == 3 and all(d.fix is not None for d in found)
    with pytest.raises(ValueError, match="target size"):  # torch itself, unfixed
        exec(compile(HEADER + textwrap.dedent(body), "<plain>", "exec"), {})
    fixed = _run_fixed(body)
    out = fixed["out"]
    assert torch.equal(fixed["real"], torch.nn.functional.binary_cross_entropy(out, torch.ones(6)))
    assert torch.equal(fixed["fake"], torch.nn.functional.binary_cross_entropy(out, torch.zeros(6)))
    assert torch.equal(fixed["direct"], fixed["fake"])


def test_a_criterion_and_labels_kept_on_self_with_device_moves() -> None:
    """The 2018 GAN-collection layout: the criterion chosen by device in one expression, the
    labels assigned as a tuple and moved to CUDA in another tuple."""
    body = """
        class Trainer:
            def __init__(self, batch):
                self.D = nn.Sequential(nn.Linear(2, 1), nn.Sigmoid())
                cuda = torch.cuda.is_available()
                self.bce = nn.BCELoss().cuda() if cuda else nn.BCELoss()
                self.y_real_, self.y_fake_ = torch.ones(batch, 1), torch.zeros(batch, 1)
                if cuda:
                    self.y_real_, self.y_fake_ = self.y_real_.cuda(), self.y_fake_.cuda()

            def step(self, x):
                d_real = self.D(x)[:, 0]
                return self.bce(d_real, self.y_real_)

        torch.manual_seed(1)
        x = torch.randn(5, 2)
        trainer = Trainer(5)
        loss = trainer.step(x)
    """
    (finding,) = _findings(body)
    assert finding.fix is not None
    fixed = _run_fixed(body)
    d_real = fixed["trainer"].D(fixed["x"])[:, 0]
    with pytest.raises(ValueError, match="target size"):  # torch on the unfixed call
        torch.nn.BCELoss()(d_real, torch.ones(5, 1))
    with pytest.warns(PatchWarning, match="pairs their elements in order"):
        shimmed = st.legacy.binary_cross_entropy(d_real, torch.ones(5, 1))
    assert torch.equal(fixed["loss"], shimmed)


@pytest.mark.parametrize(
    "body",
    [
        # the label already has the input's shape
        "c = nn.BCELoss()\no = torch.rand(3)\nl = c(o, torch.ones_like(o))\n",
        "c = nn.BCELoss()\no = torch.rand(3)\nl = c(o, torch.ones(3, 1).view_as(o))\n",
        # not a BCE criterion
        "c = nn.MSELoss()\no = torch.rand(3)\nl = c(o, torch.ones(3))\n",
        "c = nn.BCEWithLogitsLoss()\no = torch.rand(3)\nl = c(o, torch.ones(3))\n",
        # a criterion the file does not build (a parameter) and a label of unknown origin
        "def f(c, o):\n    return c(o, torch.ones(3, 1))\n",
        "c = nn.BCELoss()\ndef f(o, t):\n    return c(o, t)\n",
        # a label from data, not a written-out shape
        "c = nn.BCELoss()\no = torch.rand(3)\nl = c(o, (torch.rand(3) > 0.5).float())\n",
    ],
)
def test_no_finding_without_a_bce_criterion_and_a_written_out_label(body: str) -> None:
    assert _findings(body) == []


def test_modern_code_is_left_alone() -> None:
    """No 0.3-era mark in the project: the same call is not reported (torch's error stands)."""
    body = "c = nn.BCELoss()\no = torch.rand(3)\nl = c(o, torch.ones(3, 1))\n"
    assert len(_findings(body)) == 1
    assert _findings(body, header="import torch\nimport torch.nn as nn\n") == []


def test_an_input_that_is_a_call_is_reported_without_a_fix() -> None:
    """``reshape_as(D(x))`` would run the model twice: no fix is offered."""
    body = """
        c = nn.BCELoss()
        d = nn.Sequential(nn.Linear(2, 1), nn.Sigmoid())
        l = c(d(torch.randn(4, 2)).squeeze(), torch.ones(4, 1))
    """
    (finding,) = _findings(body)
    assert finding.fix is None
    source = HEADER + textwrap.dedent(body)
    assert fix_source(source, select=["ST028"], unsafe_fixes=True) == source


@settings(max_examples=40, deadline=None)
@given(
    n=hst.integers(1, 6),
    label_rows=hst.booleans(),
    value=hst.sampled_from([0.0, 1.0, 0.3]),
    reduction=hst.sampled_from(["mean", "sum", "none"]),
)
def test_the_fix_is_the_shims_loss_and_torchs_where_shapes_match(
    n: int, label_rows: bool, value: float, reduction: str
) -> None:
    """Fixed code (plain torch) = the legacy shim on the unfixed call; where the label already
    has the input's shape, fixed code = torch's own call."""
    shape = f"({n}, 1)" if label_rows else f"({n},)"
    body = f"""
        torch.manual_seed({n})
        crit = nn.BCELoss(reduction="{reduction}")
        out = torch.sigmoid(torch.randn({n}))
        loss = crit(out, torch.full({shape}, {value}))
    """
    assert len(_findings(body)) == 1
    fixed = _run_fixed(body)
    out = fixed["out"]
    label = torch.full((n, 1) if label_rows else (n,), value)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PatchWarning)  # the shim names the call site once
        shim = st.legacy.binary_cross_entropy(out, label, reduction=reduction)
    assert torch.equal(fixed["loss"], shim)
    if not label_rows:
        assert torch.equal(fixed["loss"], torch.nn.BCELoss(reduction=reduction)(out, label))
    else:
        with pytest.raises(ValueError):
            torch.nn.BCELoss(reduction=reduction)(out, label)
