"""ST005 (issue 33, stop 56): a write through ``x.data`` in a ``forward`` is the old spelling
of a write meant to reach ``x`` (attention scores masked before a softmax), so only a backward
in the same function is evidence there; ``x.new(n)`` is a fresh tensor. Each quiet case sits
beside the look-alike that stays reported; the idioms are written in our own words."""

from __future__ import annotations

import textwrap
from typing import List

from safetorch.check import check_source


def _st005(body: str) -> List[int]:
    src = "import torch\n" + textwrap.dedent(body)
    return [d.line - 1 for d in check_source(src, "m.py", select=["ST005"])]


def test_masking_scores_through_data_in_a_forward_is_quiet() -> None:
    body = """
    class Attention(torch.nn.Module):
        def forward(self, query, keys, mask):
            scores = self.proj(query * keys).squeeze(-1)
            scores.data.masked_fill_(mask, -float("inf"))
            return torch.softmax(scores, dim=-1)
    """
    assert _st005(body) == []


def test_the_same_write_through_detach_in_a_forward_is_reported() -> None:
    body = """
    class Attention(torch.nn.Module):
        def forward(self, query, keys, mask):
            scores = self.proj(query * keys).squeeze(-1)
            masked = scores.detach()
            masked.masked_fill_(mask, -float("inf"))
            return torch.softmax(scores, dim=-1), masked
    """
    assert _st005(body) == [5]


def test_a_data_write_before_a_backward_is_reported() -> None:
    body = """
    def step(model, x, mask):
        out = model(x)
        out.data.masked_fill_(mask, 0.0)
        loss = out.sum()
        loss.backward()
        return out
    """
    assert _st005(body) == [4]


def test_a_tensor_made_with_new_is_fresh() -> None:
    body = """
    def check(layer, x):
        out = layer(x)
        target = out.new(out.shape)
        target.data.uniform_(-1, 1)
        ((out - target) ** 2).sum().backward()
        return out, target
    """
    assert _st005(body) == []
