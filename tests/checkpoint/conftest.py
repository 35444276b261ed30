"""Fixtures for checkpoint tests: a small model and a zoo of real wrappers (CPU only)."""

from __future__ import annotations

import os
from typing import Callable, Dict, Iterator

import pytest
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.backbone = nn.Sequential()
        self.backbone.add_module("conv1", nn.Conv2d(3, 4, 3))
        self.backbone.add_module("bn1", nn.BatchNorm2d(4))
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x).mean((2, 3)))


class LitModule(nn.Module):
    """Lightning-style: the user network sits under an attribute (keys ``model.…``)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model


def _checkpoint_wrapped(net: Net) -> nn.Module:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl,
        checkpoint_wrapper,
    )

    # Explicit impl: torch 2.1 warns when checkpoint_impl is left to its (reentrant) default.
    net.backbone = checkpoint_wrapper(net.backbone, checkpoint_impl=CheckpointImpl.NO_REENTRANT)
    return net


def _compiled(m: nn.Module) -> nn.Module:
    return torch.compile(m)  # creating the wrapper compiles nothing


# name -> (wrap function, the user Net inside)
WRAPPERS: Dict[str, Callable[[nn.Module], nn.Module]] = {
    "plain": lambda m: m,
    "dataparallel": nn.DataParallel,
    "compile": _compiled,
    "averaged": torch.optim.swa_utils.AveragedModel,
    "ckpt_wrapper": _checkpoint_wrapped,
    "dp_compile": lambda m: nn.DataParallel(_compiled(m)),
    "compile_dp": lambda m: _compiled(nn.DataParallel(m)),
    "averaged_dp": lambda m: torch.optim.swa_utils.AveragedModel(nn.DataParallel(m)),
    "lightning_compiled": lambda m: LitModule(_compiled(m)),
}


def randomized_net(seed: int) -> Net:
    torch.manual_seed(seed)
    net = Net()
    with torch.no_grad():
        for p in net.state_dict().values():
            if p.is_floating_point():
                p.copy_(torch.randn_like(p))
    return net


@pytest.fixture
def canary(tmp_path) -> Iterator[str]:
    path = str(tmp_path / "canary")
    yield path
    if os.path.exists(path):
        os.unlink(path)


@pytest.fixture(scope="session")
def zoo():
    """The test helpers (tests cannot import conftest under --import-mode=importlib)."""
    import types

    return types.SimpleNamespace(
        Net=Net, LitModule=LitModule, WRAPPERS=WRAPPERS, randomized_net=randomized_net
    )


@pytest.fixture(scope="session")
def ckpt_dirs():
    """``tests/checkpoint/_dirs.py`` (the hostile-file builders), loaded from its path: the
    suite imports test files with ``--import-mode=importlib``, so ``tests`` is no package."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "_ckpt_dirs", os.path.join(os.path.dirname(os.path.abspath(__file__)), "_dirs.py")
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
