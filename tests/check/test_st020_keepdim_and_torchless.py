"""ST020 proves 0-dim only where torch would give one: a reduction told ``keepdim=True``
keeps every dim (``torch.argmax(x, keepdim=True)`` of a ``(1, 1, V)`` row is ``(1, 1, 1)``),
and in a file that imports no torch a ``.all()``/``.sum()`` proves nothing (a database
query's ``.all()`` is a list of rows). Idioms of a greedy-decoding benchmark and a SQL helper,
in our own words; each is run side by side with torch."""

from __future__ import annotations

import textwrap
from typing import List

import pytest
import torch

from safetorch.check import check_source
from safetorch.check.engine import Diagnostic


def _findings(source: str) -> List[Diagnostic]:
    return list(check_source(textwrap.dedent(source), select=["ST020", "ST029"]))


def test_argmax_with_keepdim_and_no_dim_is_no_0_dim_tensor() -> None:
    source = """
        import torch
        logits = torch.randn(1, 1, 7)
        token = torch.argmax(logits, keepdim=True)[0]
        other = logits.argmax(keepdim=True)[0]
    """
    assert _findings(source) == []
    logits = torch.randn(1, 1, 7)
    assert torch.argmax(logits, keepdim=True)[0].shape == (1, 1)  # indexing is valid
    assert logits.argmax(keepdim=True)[0].shape == (1, 1)


@pytest.mark.parametrize("keep", ["keepdim=False", ""])
def test_argmax_without_dim_stays_a_proven_0_dim_finding(keep: str) -> None:
    call = f"torch.argmax(logits, {keep})" if keep else "torch.argmax(logits)"
    source = f"""
        import torch
        logits = torch.randn(1, 1, 7)
        token = {call}[0]
    """
    (finding,) = _findings(source)
    assert finding.code == "ST020" and finding.fix is not None
    with pytest.raises(IndexError):  # what torch does with [0] of the 0-dim result
        torch.argmax(torch.randn(1, 1, 7))[0]


def test_a_file_without_torch_proves_no_0_dim_reduction() -> None:
    source = """
        import records

        def schema(db, name):
            info = db.query("SELECT sql FROM sqlite_master WHERE tbl_name = :n", n=name).all()[0]
            rows = db.query("SELECT 1").all()
            if rows:
                return rows[0], info
            total = db.query("SELECT 2").sum()
            return total[0]
    """
    assert _findings(source) == []


def test_the_same_reductions_with_torch_imported_are_still_found() -> None:
    source = """
        import torch

        def score(out):
            flags = out.all()
            return flags[0]

        score(torch.ones(3) > 0)
    """
    (finding,) = _findings(source)
    assert finding.code == "ST020" and finding.fix is not None
    with pytest.raises(IndexError):
        (torch.ones(3) > 0).all()[0]
