"""ST020 decides 0-dim by shape flow (issue 34.4): the fix is offered only where the flow proves
the value 0-dim, and every fixed idiom is run with plain torch."""

from __future__ import annotations

import textwrap
import warnings
from typing import Any, Dict, List

import pytest
import torch

from safetorch.check import check_source, fix_source
from safetorch.check.engine import Diagnostic

HEADER = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n"


def _findings(body: str) -> List[Diagnostic]:
    return [d for d in check_source(HEADER + textwrap.dedent(body), select=["ST020"])]


def _run_fixed(body: str) -> Dict[str, Any]:
    source = HEADER + textwrap.dedent(body)
    after = fix_source(source, select=["ST020"], unsafe_fixes=True)
    assert after != source, "expected a fix"
    namespace: Dict[str, Any] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exec(compile(after, "<fixed>", "exec"), namespace)
    return namespace


def test_a_criterion_passed_as_a_parameter_is_followed_to_its_callers() -> None:
    body = """
        def step(net, crit, x, y):
            out = crit(net(x), y)
            return out.data[0]

        net = nn.Linear(3, 2)
        value = step(net, nn.CrossEntropyLoss(), torch.randn(4, 3), torch.tensor([0, 1, 0, 1]))
    """
    (finding,) = _findings(body)
    assert finding.fix is not None
    assert isinstance(_run_fixed(body)["value"], float)


def test_a_functional_loss_passed_by_name_is_0_dim() -> None:
    body = """
        def step(fn, a, b):
            err = fn(a, b)
            return err.data[0]

        value = step(F.mse_loss, torch.ones(3), torch.zeros(3))
    """
    assert _run_fixed(body)["value"] == 1.0


def test_a_criterion_some_caller_passes_unreduced_gets_no_fix() -> None:
    body = """
        def step(crit, a, b):
            out = crit(a, b)
            return out.data[0]

        step(nn.MSELoss(), torch.ones(3), torch.zeros(3))
        step(nn.MSELoss(reduction="none"), torch.ones(3), torch.zeros(3))
    """
    assert [d.fix for d in _findings(body)] in ([], [None])


def test_a_loss_class_of_the_file_is_followed_to_its_forward() -> None:
    body = """
        class PixelLoss(nn.Module):
            def forward(self, a, b):
                return F.l1_loss(a, b) + 0.5 * F.mse_loss(a, b)

        crit = PixelLoss()
        g = crit(torch.ones(2, 2), torch.zeros(2, 2))
        total = g.data[0]
    """
    assert _run_fixed(body)["total"] == pytest.approx(1.5)


def test_a_name_alone_reports_without_a_fix() -> None:
    # ``loss`` may be a row of per-sample losses: .item() would raise, so only a report
    (finding,) = _findings("def f(loss):\n    return loss.data[0]\n")
    assert finding.fix is None
    assert "no fix is offered" in finding.message


def test_a_tensor_of_a_list_name_is_not_0_dim() -> None:
    # torch.tensor(values): one element per batch; loss[-1] is right, .item() is not
    body = """
        losses = [0.5, 0.25]
        loss = torch.tensor(losses)
        last = loss[-1]
    """
    assert _findings(body) == []


def test_x_0_0_on_what_max_made_1_d_becomes_one_index_and_item() -> None:
    # written for torch 0.1, where max(1) kept the dim: pred was (N, 1)
    body = """
        out = torch.tensor([[0.1, 0.9], [0.8, 0.2]]).view(2, 2)
        _, pred = out.max(1)
        first = pred.data[0][0]
    """
    (finding,) = _findings(body)
    assert finding.fix is not None
    assert "pred.data[0].item()" in finding.fix.edits[0].content
    assert _run_fixed(body)["first"] == 1


def test_the_old_fix_raises_where_the_new_one_runs() -> None:
    pred = torch.tensor([1, 0])
    with pytest.raises(IndexError):
        pred.data[0][0].item()
    assert pred.data[0].item() == 1


def test_a_dict_key_from_topk_gets_item() -> None:
    body = """
        words = {0: "a", 1: "b"}
        out = torch.tensor([[0.2, 0.8]])
        topv, topi = out.data.topk(1)
        ni = topi[0][0]
        word = words[ni]
    """
    assert _run_fixed(body)["word"] == "b"


def test_a_dict_key_of_unknown_dims_from_max_gets_no_fix() -> None:
    body = """
        words = {0: "a", 1: "b"}

        def decode(out):
            _, top = out.data.max(1)
            ni = top[0][0]
            return words[ni]
    """
    (finding,) = _findings(body)
    assert finding.fix is None
