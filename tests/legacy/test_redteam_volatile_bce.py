"""Red team: ``st.legacy.volatile`` (the ``Variable(x, volatile=True)`` shim, results made with
``Tensor._make_subclass``) and ST028 ``legacy-bce-target-shape``'s unsafe fix.

Confirmed defects that are not fixed yet would be ``xfail(strict=True)``; the rest pin what held
and what was fixed (tests/legacy/test_legacy_volatile_no_grad.py compares with ``torch.no_grad()``)."""

from __future__ import annotations

import copy
import textwrap
import warnings
from typing import Any, Dict

import torch
import torch.nn as nn

import safetorch as st
from safetorch.check import check_source, fix_source

V = st.legacy.volatile
HEADER = "import torch\nimport torch.nn as nn\nfrom torch.autograd import Variable\n"


def _exec(source: str) -> Dict[str, Any]:
    namespace: Dict[str, Any] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exec(compile(source, "<src>", "exec"), namespace)
    return namespace


def _fixed(body: str) -> str:
    return fix_source(HEADER + textwrap.dedent(body), select=["ST028"], unsafe_fixes=True)


# --- st.legacy.volatile: what held ----------------------------------------------------------
def test_volatile_results_detach_in_place_like_no_grad_results() -> None:
    w = torch.ones(3, requires_grad=True)
    y = V(torch.ones(3)) * w
    assert not y.requires_grad and y.grad_fn is None and not y._is_view()
    assert y.detach_() is y
    view = V(torch.arange(6.0)).view(2, 3)  # torch.no_grad()'s view refuses detach_()
    view.detach_()


def test_volatile_shares_memory_both_ways_and_views_write_through() -> None:
    x = torch.zeros(3)
    v = V(x)
    v.add_(1)
    x[0] = 5
    assert x.tolist() == [5.0, 1.0, 1.0] and v.tolist() == [5.0, 1.0, 1.0]
    base = torch.arange(4.0)
    V(base).view(2, 2)[0, 0] = 9
    assert base[0] == 9


def test_volatile_results_save_load_weights_only_and_keep_shared_storage(tmp_path: Any) -> None:
    base = V(torch.arange(4.0))
    torch.save({"all": base, "head": base[:2], "out": base * 2}, tmp_path / "f.pt")
    back = torch.load(tmp_path / "f.pt", weights_only=True)
    assert all(type(t) is torch.Tensor for t in back.values())
    back["all"][0] = 99
    assert back["head"][0] == 99


def test_requires_grad_on_a_volatile_result_still_records_nothing() -> None:
    """0.3: volatile overrides requires_grad (a torch.no_grad() result would record a graph
    after requires_grad_(); the shim keeps the 0.3 meaning)."""
    y = V(torch.ones(2)) * 2
    y.requires_grad_()
    assert not (y * 2).requires_grad


# --- st.legacy.volatile: defects (fixed) ----------------------------------------------------
def test_data_of_a_volatile_tensor_detaches_in_place_like_plain_data() -> None:
    # red team: .data was an as_subclass alias (a view): "Can't detach views in-place"
    torch.ones(2).data.detach_()  # plain torch
    y = V(torch.ones(2)) * 1
    data = y.data
    assert data.detach_() is data and type(data) is torch.Tensor and not data._is_view()
    assert data.data_ptr() == y.data_ptr()


def test_deepcopy_of_a_volatile_tensor_that_requires_grad() -> None:
    # red team: __deepcopy__ deep-copied an as_subclass alias, a non-leaf when it requires grad
    v = V(torch.ones(2)).requires_grad_()
    v.grad = torch.full((2,), 3.0)
    c = copy.deepcopy(v)
    assert type(c) is st.legacy.VolatileTensor and c.requires_grad and c.is_leaf
    assert c.grad is not None and c.grad.tolist() == [3.0, 3.0] and c.grad is not v.grad
    assert c.data_ptr() != v.data_ptr()
    assert not (c * torch.ones(2, requires_grad=True)).requires_grad  # still volatile


def test_a_parameter_made_from_a_volatile_tensor_trains_or_raises() -> None:
    # red team: nn.Parameter(volatile(x)) was a VolatileTensor flagged _is_param: every op on
    # it ran under no_grad, so it silently never trained (0.3 refused Parameter(Variable))
    x = torch.ones(2)
    p = nn.Parameter(V(x))
    assert type(p) is nn.Parameter and p.requires_grad and p.is_leaf
    assert p.data_ptr() == x.data_ptr()
    (p * 2).sum().backward()
    assert p.grad is not None and p.grad.tolist() == [2.0, 2.0]
    torch.optim.SGD([p], lr=0.5).step()
    assert p.tolist() == [0.0, 0.0]


def test_in_place_op_with_a_volatile_operand_returns_self() -> None:
    # red team: the in-place target came back as a new VolatileTensor alias, not self;
    # m.weight += v then raised TypeError after weight was already changed
    w = torch.ones(3)
    assert w.add_(V(torch.ones(3))) is w and type(w) is torch.Tensor
    m = nn.Linear(2, 2)
    before = m.weight
    m.weight += V(torch.ones(2, 2))  # `with torch.no_grad(): m.weight += t` works
    assert m.weight is before and type(m.weight) is nn.Parameter and m.weight.requires_grad


# --- ST028: what held -------------------------------------------------------------------------
def test_st028_fix_is_idempotent_and_keeps_comments_and_continuations_compiling() -> None:
    body = """
        crit = nn.BCELoss()
        out = torch.rand(4, 1)
        a = crit(out,
                 Variable(torch.ones(4,   # a comment inside
                                     )))
        b = crit(out, \\
                 torch.ones(4))
        c = crit(out, target=torch.ones(4))
        d = nn.functional.binary_cross_entropy(input=out, target=torch.ones(4))
    """
    once = _fixed(body)
    assert once.count(".reshape_as(out)") == 4 and "# a comment inside" in once
    assert fix_source(once, select=["ST028"], unsafe_fixes=True) == once
    ns = _exec(once)
    assert torch.allclose(ns["a"], ns["b"]) and torch.allclose(ns["c"], ns["d"])


def test_st028_leaves_with_logits_losses_and_modern_code_alone() -> None:
    body = """
        out = torch.rand(4, 1)
        a = nn.functional.binary_cross_entropy_with_logits(out, torch.ones(4, 1))
        b = nn.BCEWithLogitsLoss()(out, torch.ones(4, 1))
    """
    assert not list(check_source(HEADER + textwrap.dedent(body), select=["ST028"]))
    modern = "import torch\nimport torch.nn as nn\nnn.BCELoss()(torch.rand(4), torch.ones(4, 1))\n"
    assert not list(check_source(modern, select=["ST028"]))


# --- ST028: defects -------------------------------------------------------------------------
def test_st028_reports_a_weighted_bce_without_a_fix_that_would_break_it() -> None:
    # red team: reshaping only the target made a (b, 1) weight broadcast to (b, b) and raise;
    # a weight (on the call or the criterion) keeps the finding and drops the fix
    body = """
        out = torch.full((4,), 0.25)
        w = torch.Tensor([[1.0], [0.0], [0.0], [0.0]])
        f = nn.functional.binary_cross_entropy(out, Variable(torch.ones(4, 1)), w)
        m = nn.BCELoss(weight=w)(out, Variable(torch.ones(4, 1)))
        crit = nn.BCELoss(w)
        c = crit(out, Variable(torch.ones(4, 1)))
    """
    source = HEADER + textwrap.dedent(body)
    found = list(check_source(source, select=["ST028"]))
    assert len(found) == 3 and all(d.fix is None for d in found)
    assert _fixed(body) == source
    # the same script without weights is fixed and then runs with the 0.3 value
    plain = (
        body.replace(", w)", ")").replace("weight=w", "").replace("nn.BCELoss(w)", "nn.BCELoss()")
    )
    ns = _exec(_fixed(plain))
    expected = torch.nn.functional.binary_cross_entropy(torch.full((4,), 0.25), torch.ones(4))
    assert all(torch.allclose(ns[k], expected) for k in ("f", "m", "c"))


def test_st028_does_not_rewrite_a_shadowed_criterion_name() -> None:
    body = """
        criterion = nn.BCELoss()
        logits = torch.randn(4, 3)
        f = lambda criterion, x: criterion(x, torch.zeros(4, dtype=torch.long))
        a = f(nn.CrossEntropyLoss(), logits)
        for criterion in [nn.CrossEntropyLoss()]:
            b = criterion(logits, torch.zeros(4, dtype=torch.long))
    """
    assert _fixed(body) == HEADER + textwrap.dedent(body)


def test_st028_leaves_labels_built_from_the_inputs_size_alone() -> None:
    body = """
        out = torch.rand(4, 1)
        a = nn.BCELoss()(out, torch.ones(out.size()))
        b = nn.BCELoss()(out, Variable(torch.FloatTensor(*out.shape).fill_(1)))
    """
    assert not list(check_source(HEADER + textwrap.dedent(body), select=["ST028"]))
