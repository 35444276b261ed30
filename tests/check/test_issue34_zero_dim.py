"""ST020 decides 0-dim by shape flow (issue 34.4): the fix is offered only where the flow proves
the value 0-dim, and every fixed idiom is run with plain torch."""

from __future__ import annotations

import textwrap
from typing import Any, Dict, List

import pytest
import torch
from _check_project import run_fixed

from safetorch.check import check_source
from safetorch.check.engine import Diagnostic

HEADER = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n"


def _findings(body: str) -> List[Diagnostic]:
    """ST020's findings (the flow proves 0-dim) and ST029's (only the name or nothing says)."""
    source = HEADER + textwrap.dedent(body)
    return [d for d in check_source(source, select=["ST020", "ST029"])]


def _run_fixed(body: str) -> Dict[str, Any]:
    return run_fixed(HEADER + textwrap.dedent(body), ["ST020"])


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
    assert finding.code == "ST029"  # the name decides: the preview rule, not ST020


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


def test_a_dict_key_of_unknown_dims_from_max_gets_its_first_element() -> None:
    # top[0][0] was a number under torch 0.1 for a 2-D out (max kept the dim: (N, 1)) and
    # under 0.2-0.3 for a 3-D one ((N, L)): the first element either way, as flatten()[0]
    body = """
        words = {0: "a", 1: "b", 2: "c"}

        def decode(out):
            _, top = out.data.max(1)
            ni = top[0][0]
            return words[ni]

        two_d = decode(torch.tensor([[0.1, 0.7, 0.2]]))
        three_d = decode(torch.tensor([[[0.1, 0.9], [0.0, 0.0], [0.8, 0.1]]]))
    """
    (finding,) = _findings(body)
    assert finding.fix is not None and "top.flatten()[0].item()" in finding.fix.message
    fixed = _run_fixed(body)
    assert (fixed["two_d"], fixed["three_d"]) == ("b", "c")


def test_a_1_d_max_index_as_a_dict_key_in_a_range_comprehension_gets_item() -> None:
    # 0.2/0.3: max(1) dropped the dim and idx[i] was a Python int; now a 0-dim tensor, which
    # a dict of ints never finds (tensors hash by identity)
    body = """
        ix_to_tag = {v: k for k, v in {"DET": 0, "NN": 1}.items()}

        def tags(scores):
            _, idx = scores.data.max(1)
            return [ix_to_tag[idx[i]] for i in range(scores.size(0))]

        got = tags(torch.tensor([[0.1, 0.9], [0.7, 0.3]]))
    """
    (finding,) = _findings(body)
    assert finding.fix is not None
    assert _run_fixed(body)["got"] == ["NN", "DET"]


def test_a_sample_returned_and_passed_to_a_method_reaches_its_dict_key() -> None:
    body = """
        MOVES = {0: -1, 1: 1}

        class Walk(object):
            def step(self, action):
                return MOVES[action]

        def select(probs):
            action = probs.multinomial(1).view(-1)
            return action.data[0]

        env = Walk()
        move = env.step(select(torch.tensor([0.0, 1.0])))
    """
    (finding,) = _findings(body)
    assert finding.fix is not None and "action.data[0].item()" in finding.fix.message
    assert _run_fixed(body)["move"] == 1


def test_the_plain_dict_key_raises_on_plain_torch_before_the_fix() -> None:
    moves = {0: -1, 1: 1}
    action = torch.tensor([1])
    with pytest.raises(KeyError):
        moves[action.data[0]]  # what the fix replaces: it can only raise today
    assert moves[action.data[0].item()] == 1


def test_a_defaultdict_key_of_unknown_dims_gets_no_fix() -> None:
    # a defaultdict answers a fresh tensor key with its default: the code may run as it is
    body = """
        from collections import defaultdict
        counts = defaultdict(int)

        def count(scores):
            _, idx = scores.data.max(1)
            return counts[idx[0]]
    """
    (finding,) = _findings(body)
    assert finding.fix is None


def test_a_key_passed_to_an_unrelated_method_is_not_followed() -> None:
    # opt.step(...) of an object the file did not build: its parameters are not the file's
    body = """
        table = {0: "a"}

        def pick(scores, opt):
            _, idx = scores.max(1)
            opt.step(idx[0])
    """
    assert _findings(body) == []


def test_an_accumulator_started_in_a_tuple_assignment_is_followed() -> None:
    body = """
        criterion = nn.MSELoss()
        total, seen = 0, []
        for _ in range(2):
            loss = criterion(torch.ones(3), torch.zeros(3))
            total += loss.data
        average = total[0] / 2
    """
    (finding,) = _findings(body)
    assert finding.fix is not None
    assert _run_fixed(body)["average"] == 1.0


# --- in-place and scalar element-wise methods keep the shape ---------------------------------
def test_in_place_methods_on_a_0_dim_value_keep_it_0_dim() -> None:
    # a VAE's KL term scaled in place, a criterion's loss divided in place: .mul_/.div_
    # return their receiver, so .data[0] of the sum is proven 0-dim and fixed to .item()
    body = """
        def vae_loss(recon, x, mu, logvar):
            rec = F.binary_cross_entropy(recon, x, reduction="sum")
            kld = torch.sum(1 + logvar - mu.pow(2) - logvar.exp()).mul_(-0.5)
            return rec + kld

        crit = nn.MSELoss()

        def scaled(o, t, n):
            loss = crit(o, t).div_(n)
            return loss.data[0]

        mu, logvar = torch.zeros(2, 3), torch.zeros(2, 3)
        loss = vae_loss(torch.full((2, 4), 0.5), torch.ones(2, 4), mu, logvar)
        total = loss.data[0]
        other = scaled(torch.ones(4), torch.zeros(4), 4)
    """
    findings = _findings(body)
    assert len(findings) == 2 and all(f.fix is not None for f in findings)
    fixed = _run_fixed(body)
    assert fixed["total"] == pytest.approx(8 * 0.6931471805599453, rel=1e-6)
    assert fixed["other"] == pytest.approx(0.25)


def test_scalar_operands_keep_the_shape_and_tensor_operands_broadcast() -> None:
    body = """
        x = torch.ones(3)
        s = x.sum().mul(0.5).add(1).neg().abs()
        first = s.data[0]
        n = len(x)
        t = torch.div(x.mean(), n)
        second = t.data[0]
    """
    findings = _findings(body)
    assert [f.fix is not None for f in findings] == [True, True]
    fixed = _run_fixed(body)
    assert (fixed["first"], fixed["second"]) == (2.5, pytest.approx(1 / 3))


def test_a_reduction_times_a_tensor_of_unknown_shape_is_not_proven() -> None:
    # loss.mul(weights) has the weights' shape: no fix (a name that says "loss" still
    # reports, without one); a 1-D operand makes it evidently not 0-dim: quiet
    body = """
        def weighted(x, w):
            s = x.sum().mul(w)
            loss = x.sum().add(w)
            return s.data[0], loss.data[0]

        def rows(x):
            s = x.sum().mul(torch.ones(3))
            return s[0]
    """
    findings = _findings(body)
    assert [(f.line, f.fix) for f in findings] == [(8, None)]  # loss.data[0], name only


# --- the method form of max/min along a dim ---------------------------------------------------
def test_the_method_form_of_max_along_a_dim_is_the_function_forms_pair() -> None:
    # out.max(1)[1] of a model's output (not .data, dims not visible) as torch.max(out, 1)[1]
    body = """
        words = {0: "a", 1: "b", 2: "c"}

        def decode(out):
            pred = out.max(1)[1]
            return words[pred[0][0]]

        def decode_fn(out):
            pred = torch.max(out, 1)[1]
            return words[pred[0][0]]

        two_d = decode(torch.tensor([[0.1, 0.7, 0.2]]))
        three_d = decode_fn(torch.tensor([[[0.1, 0.9], [0.0, 0.0], [0.8, 0.1]]]))
    """
    findings = _findings(body)
    assert [f.fix.message for f in findings if f.fix] == ["use pred.flatten()[0].item()"] * 2
    with pytest.raises(IndexError):
        exec(HEADER + textwrap.dedent(body), {})  # plain torch: [0][0] of a 1-D pred
    fixed = _run_fixed(body)
    assert (fixed["two_d"], fixed["three_d"]) == ("b", "c")


def test_the_method_form_with_known_dims_and_keepdim() -> None:
    body = """
        words = {0: "a", 1: "b"}
        out = torch.tensor([[0.2, 0.8], [0.9, 0.1]])
        first = words[torch.max(out, 1)[1][0]]
        second = words[out.max(1)[1][1]]
        kept = words[out.max(1, keepdim=True)[1][0][0]]
    """
    findings = _findings(body)
    assert [f.fix.message for f in findings if f.fix] == [
        "use torch.max(out, 1)[1][0].item()",
        "use out.max(1)[1][1].item()",
        "use out.max(1, keepdim=True)[1][0][0].item()",
    ]
    fixed = _run_fixed(body)
    assert (fixed["first"], fixed["second"], fixed["kept"]) == ("b", "a", "b")


def test_max_of_a_numpy_array_or_of_another_tensor_is_not_a_pair() -> None:
    body = """
        import numpy as np

        words = {0: "a", 1: "b"}
        arr = np.zeros((2, 3, 4, 5))
        best = arr.max(1)[1]
        key = words[best[0][0]]

        def pick(out, other):
            both = out.max(other)[1]
            return words[both[0][0]]

        def whole(out):
            m = out.max()
            return words[m]
    """
    assert _findings(body) == []
