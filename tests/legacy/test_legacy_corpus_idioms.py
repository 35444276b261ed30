"""Idioms of the real 2017-2019 scripts measured in ``benchmarks/legacy_corpus`` (issue 34),
re-created in our own words: each run with plain torch (where it fails), under the ``legacy``
patch (what ``safetorch run`` does) and as ``safetorch check --fix`` rewrites it, side by side.
"""

from __future__ import annotations

import textwrap
from typing import Any, Dict, List

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as hst

import safetorch as st
from safetorch.check import check_source
from safetorch.errors import PatchWarning
from tests._check_project import run_fixed

# A Jacobian filled one row per backward pass through the same graph, as 0.2-era tutorials
# wrote it: the first pass keeps the graph for the second.
JACOBIAN = """
    import torch
    from torch.autograd import Variable

    point = Variable(torch.FloatTensor([[1.5, -2.0]]), requires_grad=True)
    out = torch.cat([point[:, :1] ** 2 + 4 * point[:, 1:], point[:, 1:] ** 3 - point[:, :1]], 1)
    rows = []
    out.backward(torch.FloatTensor([[1, 0]]), retain_variables=True)
    rows.append(point.grad.data.clone())
    point.grad.data.zero_()
    out.backward(torch.FloatTensor([[0, 1]]))
    rows.append(point.grad.data.clone())
    jacobian = torch.cat(rows)
"""

EXPECTED = [[3.0, 4.0], [-1.0, 12.0]]  # d(x^2 + 4y, y^3 - x) / d(x, y) at (1.5, -2)


def _exec(source: str) -> Dict[str, Any]:
    namespace: Dict[str, Any] = {}
    exec(compile(textwrap.dedent(source), "<legacy>", "exec"), namespace)
    return namespace


def test_retain_variables_plain_patched_and_fixed() -> None:
    with pytest.raises(TypeError, match="retain_variables"):
        _exec(JACOBIAN)  # plain torch: removed in 0.4
    with st.patched("legacy"):
        patched = _exec(JACOBIAN)["jacobian"]
    fixed_source = textwrap.dedent(JACOBIAN)
    (finding,) = check_source(fixed_source, select=["ST027"])
    assert finding.fix is not None and "retain_graph=" in finding.fix.message
    fixed = run_fixed(fixed_source, ["ST027"])["jacobian"]
    assert patched.tolist() == fixed.tolist() == EXPECTED


@settings(max_examples=20, deadline=None)
@given(hst.booleans(), hst.sampled_from(["method", "function"]))
def test_retain_variables_means_retain_graph(keep: bool, spelling: str) -> None:
    """Under the patch the old keyword does what ``retain_graph`` does with the same value:
    a second pass works after True and raises torch's error after False."""

    def two_passes(**kwargs: bool) -> List[Any]:
        x = torch.tensor([2.0, -1.0], requires_grad=True)
        y = (x.exp() * x).sum()
        results: List[Any] = []
        for _ in range(2):
            try:
                if spelling == "method":
                    y.backward(**kwargs)
                else:
                    torch.autograd.backward([y], **kwargs)
                results.append(x.grad.tolist())
            except RuntimeError as error:
                results.append(type(error))
        return results

    modern = two_passes(retain_graph=keep)
    with st.patched("legacy"):
        legacy = two_passes(retain_variables=keep)
        with pytest.raises(TypeError):  # both names: torch's own error, unchanged
            x = torch.ones(1, requires_grad=True)
            (x * 2).sum().backward(retain_graph=True, retain_variables=True)
    assert legacy == modern


def test_retain_variables_rule_leaves_other_backward_methods_alone() -> None:
    own_api = """
        import torch
        import mylib

        mylib.backward(retain_variables=True)
        class Graph:
            def backward(self, retain_variables=False):
                return retain_variables
        Graph().backward(retain_variables=True)
        torch.ones(1, requires_grad=True).sum().backward(retain_variables=True)
    """
    # another library's function, and a file whose own API takes retain_variables (a fix
    # there could rename the keyword of the project's method): nothing reported
    assert list(check_source(textwrap.dedent(own_api), select=["ST027"])) == []
    both = "import torch\nloss = torch.ones(1, requires_grad=True).sum()\n"
    both += "loss.backward(retain_graph=True, retain_variables=True)\n"
    (finding,) = check_source(both, select=["ST027"])
    assert finding.fix is None  # nothing to rename: torch's own error says what to drop


# The predicted word of a tiny n-gram model, looked up as torch 0.1 code did: max along the
# class dim kept it then, so the index of the best class was pred[0][0].
NGRAM_LOOKUP = """
    import torch
    from torch.autograd import Variable

    idx_to_word = {0: "winter", 1: "brow", 2: "field", 3: "beauty"}
    scores = Variable(torch.FloatTensor([[0.25, -1.0, 2.5, 0.75]]))
    log_prob = torch.nn.functional.log_softmax(scores, 1)
    _, predict_label = torch.max(log_prob, 1)
    predict_word = idx_to_word[predict_label.data[0][0]]
"""


def test_first_index_of_max_along_a_dim_plain_patched_and_fixed() -> None:
    with pytest.raises(IndexError):
        _exec(NGRAM_LOOKUP)  # plain torch: predict_label is 1-D, [0] is 0-dim, [0][0] raises
    with st.patched("legacy"), pytest.warns(PatchWarning):
        patched = _exec(NGRAM_LOOKUP)["predict_word"]
    source = textwrap.dedent(NGRAM_LOOKUP)
    (finding,) = check_source(source, select=["ST020"])
    assert finding.fix is not None
    assert "predict_label.data.flatten()[0].item()" in finding.fix.message
    assert patched == run_fixed(source, ["ST020"])["predict_word"] == "field"


@settings(max_examples=25, deadline=None)
@given(
    hst.lists(
        hst.lists(hst.floats(-5, 5, allow_nan=False), min_size=3, max_size=3),
        min_size=1,
        max_size=4,
    ),
    hst.booleans(),
)
def test_flatten_first_is_what_either_era_read(rows: List[List[float]], three_d: bool) -> None:
    """``pred.flatten()[0]`` is ``pred[0][0]`` of torch 0.1's kept dim ((N, 1) for a 2-D
    input) and of 0.2-0.3's dropped one ((N, L) for a 3-D input)."""
    scores = torch.tensor(rows)
    if three_d:
        scores = scores.unsqueeze(2).expand(-1, -1, 2)
    kept = scores.max(1, keepdim=True)[1]  # torch 0.1's shape
    dropped = scores.max(1)[1]  # 0.2's and today's
    # a number then: [0][0] of (N, 1) under 0.1 for a 2-D input, of (N, L) under 0.2-0.3 for
    # a 3-D one ((N, 1, L)[0][0] under 0.1 was a row, never a dict key)
    old = dropped[0][0] if three_d else kept[0][0]
    assert dropped.flatten()[0].item() == old.item()
