"""Every patching test starts and ends with nothing patched and empty counters."""

from __future__ import annotations

from typing import Iterator

import pytest

from safetorch.patching import _registry, _report


@pytest.fixture(autouse=True)
def _clean_patches() -> Iterator[None]:
    _registry.reset()
    _report.reset_counts()
    yield
    _registry.reset()
    _report.reset_counts()
