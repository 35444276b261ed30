"""Every test under tests/gpu needs CUDA: marked `gpu`, skipped with a reason without it."""

import pytest
import torch


def pytest_collection_modifyitems(items):
    skip = pytest.mark.skip(reason="needs a CUDA device (torch.cuda.is_available() is False)")
    for item in items:
        if "tests/gpu/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.gpu)
            if not torch.cuda.is_available():
                item.add_marker(skip)
