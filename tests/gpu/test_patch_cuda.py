"""Monkeypatch mode on CUDA: checked indexing keeps the context alive; pinning reaches dataclasses."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from torch.utils.data import DataLoader

import safetorch as st
from safetorch.patching import _registry, _report


@pytest.fixture(autouse=True)
def _clean():
    _registry.reset()
    _report.reset_counts()
    yield
    _registry.reset()


def test_patched_getitem_raises_before_the_kernel_and_context_survives() -> None:
    x = torch.arange(6, device="cuda")
    with st.patched("index"):
        with pytest.raises(IndexError, match="index 6 is out of bounds"):
            x[torch.tensor([6], device="cuda")]
        with pytest.raises(RuntimeError):
            torch.gather(x, 0, torch.tensor([9], device="cuda"))
        assert x[torch.tensor([5], device="cuda")].item() == 5
    torch.cuda.synchronize()  # the CUDA context still works
    assert (x + 1).sum().item() == 21


@dataclass
class _Batch:
    x: torch.Tensor
    y: torch.Tensor


def _collate(samples):
    return _Batch(torch.stack(samples), torch.stack(samples) * 2)


def test_pinning_reaches_dataclass_batches() -> None:
    data = [torch.ones(3) * i for i in range(4)]
    loader = DataLoader(data, batch_size=2, collate_fn=_collate, pin_memory=True)
    assert not next(iter(loader)).x.is_pinned()  # torch leaves dataclasses unpinned
    with st.patched("pin_memory"):
        batch = next(iter(loader))
    assert batch.x.is_pinned() and batch.y.is_pinned()
