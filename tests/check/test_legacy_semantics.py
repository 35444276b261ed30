"""ST025 (0.3's truncating integer ``/``) and ST026 (``.view`` of an element-wise result of a
transposed tensor): found on evidence, quiet elsewhere, and each fix run with plain torch side
by side with what ``safetorch run`` computes for the unfixed code (``st.legacy.div`` /
``st.legacy.view``)."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any, Dict, List

import pytest
import torch
from _check_project import run_fixed
from hypothesis import given, settings
from hypothesis import strategies as hst

import safetorch as st
from safetorch.check import check_paths, check_source
from safetorch.check.engine import Diagnostic

ERA = "import torch\nfrom torch.autograd import Variable\n"
MODERN = "import torch\n"


def _findings(source: str, code: str) -> List[Diagnostic]:
    return list(check_source(textwrap.dedent(source), select=[code]))


def _run_fixed(source: str, code: str) -> Dict[str, Any]:
    return run_fixed(textwrap.dedent(source), [code])


BEAM = """
    def advance(word_lk, size):
        num_words = word_lk.size(1)
        flat = word_lk.view(-1)
        best, best_id = flat.topk(size, 0, True, True)
        prev_k = best_id / num_words
        return prev_k, best_id - prev_k * num_words
    prev_k, word = advance(torch.arange(12.0).view(3, 4), 3)
"""


def test_a_beam_search_division_is_found_and_fixed_to_0_3s_result() -> None:
    (finding,) = _findings(ERA + textwrap.dedent(BEAM), "ST025")
    assert finding.fix is not None and "rounding_mode" in finding.fix.message
    assert "st.legacy.div" in finding.message
    fixed = _run_fixed(ERA + textwrap.dedent(BEAM), "ST025")
    assert fixed["prev_k"].dtype == torch.int64
    assert fixed["prev_k"].tolist() == [2, 2, 2] and fixed["word"].tolist() == [3, 2, 1]


def test_plain_torch_gives_float_indices_where_the_fix_gives_0_3s() -> None:
    best_id = torch.tensor([11, 10, 9])
    assert (best_id / 4).dtype == torch.float32  # what the unfixed line computes today
    assert torch.equal(st.legacy.div(best_id, 4), torch.div(best_id, 4, rounding_mode="trunc"))


@settings(max_examples=60, deadline=None)
@given(
    hst.lists(hst.integers(-1000, 1000), min_size=1, max_size=8),
    hst.integers(-50, 50).filter(lambda d: d != 0),
)
def test_the_fix_computes_what_safetorch_run_computes(values: List[int], divisor: int) -> None:
    x = torch.tensor(values)
    fixed = torch.div(x, divisor, rounding_mode="trunc")  # the fix's text
    assert torch.equal(fixed, st.legacy.div(x, divisor))
    assert fixed.tolist() == [int(v / divisor) for v in values]  # C's truncation, as 0.3


def test_in_place_division_gets_div_() -> None:
    source = ERA + "counts = torch.LongTensor([9, 4, -7])\ncounts /= 2\n"
    (finding,) = _findings(source, "ST025")
    assert finding.fix is not None
    with pytest.raises(RuntimeError):  # plain torch >= 1.7 refuses the float result
        counts = torch.tensor([9, 4, -7])
        counts /= 2
    assert _run_fixed(source, "ST025")["counts"].tolist() == [4, 2, -3]


def test_modern_code_is_not_reported() -> None:
    # no 0.3-era evidence in the project: torch >= 1.7 code that divides truly on purpose
    assert _findings(MODERN + textwrap.dedent(BEAM), "ST025") == []


def test_float_and_0_dim_division_is_not_reported() -> None:
    source = ERA + textwrap.dedent(
        """
        x = torch.randn(4, 5)
        mean = x.sum() / x.size(0)            # float tensor
        _, idx = x.max(1)
        ratio = idx / 2.0                      # a float divisor divides truly in 0.3 too
        correct = idx.eq(idx).sum() / 4        # 0-dim: 0.3's Python number, true division
        n = len([1, 2]) / 2                    # Python numbers
        """
    )
    assert _findings(source, "ST025") == []


def test_the_era_evidence_may_be_in_another_file_of_the_project(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text("")
    (tmp_path / "train.py").write_text("from torch.autograd import Variable\n")
    (tmp_path / "beam.py").write_text(MODERN + textwrap.dedent(BEAM))
    found = [d for r in check_paths([str(tmp_path)], select=["ST025"]) for d in r.diagnostics]
    assert [(Path(d.path).name, d.code) for d in found] == [("beam.py", "ST025")]


LSTM = """
    def decode(rnn, data, mask, nhid):
        output, _ = rnn(data)
        output = output.transpose(0, 1) * mask.unsqueeze(2)
        return output.view(-1, nhid)
    out = decode(torch.nn.LSTM(2, 3), torch.randn(5, 4, 2), torch.ones(4, 5), 3)
"""


def test_view_of_a_transposed_products_is_found_and_fixed() -> None:
    (finding,) = _findings(MODERN + textwrap.dedent(LSTM), "ST026")
    assert finding.fix is not None and "st.legacy.view" in finding.message
    assert _run_fixed(MODERN + textwrap.dedent(LSTM), "ST026")["out"].shape == (20, 3)


def test_plain_torch_raises_where_the_fix_matches_safetorch_run() -> None:
    output, mask = torch.randn(5, 4, 3), torch.ones(4, 5)
    product = output.transpose(0, 1) * mask.unsqueeze(2)
    with pytest.raises(RuntimeError, match="view size is not compatible"):
        product.view(-1, 3)
    assert torch.equal(product.reshape(-1, 3), st.legacy.view(product, -1, 3))


def test_views_that_work_are_not_reported() -> None:
    source = MODERN + textwrap.dedent(
        """
        x = torch.randn(5, 4, 3)
        a = (x * 2).view(-1, 3)                          # no transposed operand
        b = (x.transpose(0, 1).contiguous() * 2).view(-1, 3)
        c = x.transpose(0, 1).reshape(-1, 3)
        d = (x + 1).view(torch.int32)                    # a dtype view
        """
    )
    assert _findings(source, "ST026") == []


def test_reshape_is_the_same_view_where_view_works() -> None:
    x = torch.randn(4, 6)
    assert x.reshape(-1).data_ptr() == x.view(-1).data_ptr() == x.data_ptr()
