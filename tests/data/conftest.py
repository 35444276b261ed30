"""Fixtures for data tests: an accelerator simulated on CPU for the pinning paths."""

from __future__ import annotations

from typing import Set

import pytest
import torch

from safetorch import _device, data


class FakePin:
    """Stand-in for Tensor.pin_memory on a machine without an accelerator: returns a clone
    and remembers it, so a test can check that every tensor leaf went through it."""

    def __init__(self) -> None:
        self.pinned: Set[int] = set()

    def __call__(self, t: torch.Tensor) -> torch.Tensor:
        out = t.clone()
        self.pinned.add(id(out))
        return out


@pytest.fixture
def fake_accelerator(monkeypatch: pytest.MonkeyPatch) -> FakePin:
    """``st.accelerator_available()`` is True and pinning is :class:`FakePin`."""
    fake = FakePin()
    monkeypatch.setattr(_device, "_accelerator_impl", lambda: True)
    monkeypatch.setattr(data, "_tensor_pin_memory", fake)
    return fake
