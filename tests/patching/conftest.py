"""Every patching test starts and ends with nothing patched and empty counters."""

from __future__ import annotations

from typing import Iterator

import pytest

from safetorch.patching import registry, report


@pytest.fixture(autouse=True)
def _clean_patches() -> Iterator[None]:
    registry.reset()
    report.reset_counts()
    yield
    registry.reset()
    report.reset_counts()
