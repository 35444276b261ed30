"""Shared fixtures: simulated older torch, index-check mode, hypothesis profile."""

from __future__ import annotations

import os
from typing import Callable, ContextManager, Iterator

import pytest
from hypothesis import HealthCheck, settings

from safetorch import _compat, _device

# Shared CI machines are noisy: no per-example deadline. Property tests that must reach a
# number of examples set max_examples themselves.
settings.register_profile(
    "safetorch",
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=os.environ.get("SAFETORCH_HYPOTHESIS_RANDOM") is None,
)
settings.load_profile("safetorch")


@pytest.fixture
def simulate_torch() -> Callable[..., ContextManager[None]]:
    """Simulate an older torch: ``with simulate_torch(LOAD_HAS_MMAP=False): ...``.

    Sets the given ``_compat`` flags and re-selects every module's import-time branch; both
    are restored on exit.
    """
    return _compat.override


@pytest.fixture
def index_check_always() -> Iterator[None]:
    """Run the device-check path (the CUDA path) on CPU tensors."""
    previous = _device.set_mode("always")
    try:
        yield
    finally:
        _device.set_mode(previous)


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


requires_cuda = pytest.mark.skipif(not _cuda_available(), reason="needs a CUDA device")
