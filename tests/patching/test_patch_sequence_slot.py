"""Wrapping ``Tensor.__getitem__`` leaves tensors non-sequences: torch's constructors still
take 0-dim tensors inside lists (``torch.tensor([loss_a, loss_b])``), as in plain torch."""

from __future__ import annotations

from typing import Iterator

import pytest
import torch

import safetorch as st
from safetorch.patching import _registry


@pytest.fixture(autouse=True)
def _nothing_patched() -> Iterator[None]:
    _registry.reset()
    yield
    _registry.reset()


class UserTensor(torch.Tensor):
    """A subclass made before patching: CPython updates its slots with Tensor's."""


@pytest.mark.parametrize("names", [("index",), ("legacy",), ("index", "legacy")])
def test_0_dim_tensors_in_lists_build_tensors_while_getitem_is_wrapped(names: tuple) -> None:
    a, b = torch.tensor(3), torch.tensor(4).as_subclass(UserTensor)
    built = [
        torch.tensor([a, b]),
        torch.tensor([[a]]),
        torch.LongTensor([[a, b]]),
        torch.Tensor([a]),
    ]
    with st.patched(*names):
        assert type(vars(torch.Tensor)["__getitem__"]).__name__ == "FunctionWrapper"
        patched = [
            torch.tensor([a, b]),
            torch.tensor([[a]]),
            torch.LongTensor([[a, b]]),
            torch.Tensor([a]),
        ]
        assert torch.arange(6).view(2, 3)[1, 2].item() == 5  # indexing still goes through
    for want, got in zip(built, patched):
        assert torch.equal(want, got) and want.dtype == got.dtype
    assert torch.equal(torch.tensor([a, b]), built[0])  # and after unpatching
