"""ST006 follows the project's code further (issue 33, stop 56): a class's own methods to any
depth, methods called on instances of project classes, torch's LBFGS, and models whose class
the file never names (a factory's, a registry's, one passed in). Each idiom is written here in
our own words; each quiet case sits beside the look-alike that stays reported."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path
from typing import List

import pytest

from safetorch.check.rules._sync_calls import syncing_definitions

_HEADER = """\
import time
import torch

"""

# A detector whose head waits three methods deep (a label assignment reads a count back), a
# box decoder whose suppression copies to the host, a factory and a registry of models.
_NETS = """
import torch


class Head(torch.nn.Module):
    def forward(self, feats, targets=None):
        if targets is not None:
            return self.losses(feats, targets)
        return feats

    def losses(self, feats, targets):
        return self.assign(feats, targets)

    def assign(self, feats, targets):
        count = int(targets[0].sum())
        return feats[:count].sum()


class Decoder:
    def suppress(self, boxes):
        keep = boxes[:, 4] > 0.5
        return boxes[keep].cpu()

    def scale(self, boxes):
        return boxes * 2


class Flip:
    def __call__(self, image):
        return image.flip(-1).numpy()


def get_model(cfg):
    return Head()


MODELS = {"head": Head}
"""

# The same project without the waiting head: nothing it defines waits in a forward.
_PLAIN_NETS = """
import torch


class Head(torch.nn.Module):
    def forward(self, feats, targets=None):
        return feats * 2


class Flip:
    def __call__(self, image):
        return image.flip(-1).numpy()


def get_model(cfg):
    return Head()


MODELS = {"head": Head}
"""


def _lines(tmp_path: Path, nets: str, body: str) -> List[int]:
    """ST006's lines (within ``body``) in ``train.py`` of a project whose ``nets.py`` is
    ``nets``."""
    from safetorch.check import project
    from safetorch.check.runner import check_paths

    project.clear()
    (tmp_path / "setup.py").write_text("")
    (tmp_path / "nets.py").write_text(nets)
    (tmp_path / "train.py").write_text(_HEADER + textwrap.dedent(body))
    offset = _HEADER.count("\n")
    found = [
        d.line - offset
        for r in check_paths([str(tmp_path)], ["ST006"])
        if r.path.endswith("train.py")
        for d in r.diagnostics
    ]
    project.clear()
    return found


def test_a_class_waits_through_its_own_methods_to_any_depth() -> None:
    found, _reaches, defined = syncing_definitions(ast.parse(_NETS), "nets.py")
    assert {"Head", "Head.forward", "Head.losses", "Head.assign"} <= found
    assert "Decoder.suppress" in found and "Decoder.scale" not in found
    assert "get_model" in defined and "Head" not in defined  # classes are not factories


_UNNAMED = {
    "factory": """
        from nets import get_model

        model = get_model("cfg").cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)

        def step(x, t):
            tic = time.time()
            loss = model(x, t)
            loss.backward()
            opt.step()
            return time.time() - tic
        """,
    "registry": """
        from nets import MODELS

        model = MODELS["head"]().cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)

        def step(x, t):
            tic = time.time()
            loss = model(x, t)
            loss.backward()
            opt.step()
            return time.time() - tic
        """,
    "passed in": """
        class Trainer:
            def __init__(self, model, opt):
                self.model = model
                self.opt = opt

            def step(self, x, t):
                tic = time.time()
                loss = self.model(x.cuda(), t)
                loss.backward()
                self.opt.step()
                return time.time() - tic
        """,
}


@pytest.mark.parametrize("body", list(_UNNAMED.values()), ids=list(_UNNAMED))
def test_a_model_whose_class_the_file_never_names_may_be_the_waiting_one(
    tmp_path: Path, body: str
) -> None:
    assert _lines(tmp_path, _NETS, body) == []


@pytest.mark.parametrize("body", list(_UNNAMED.values()), ids=list(_UNNAMED))
def test_the_same_model_in_a_project_whose_forwards_never_wait_is_reported(
    tmp_path: Path, body: str
) -> None:
    # Flip's __call__ reads back, but a transform is no model: the interval stays unsynced.
    lines = textwrap.dedent(body).splitlines()
    end = next(i for i, ln in enumerate(lines) if "return time.time() - tic" in ln)
    assert _lines(tmp_path, _PLAIN_NETS, body) == [end + 1]


def test_a_lowercase_class_is_named_not_a_factory(tmp_path: Path) -> None:
    nets = (
        _NETS
        + """

class tinyNet(torch.nn.Module):
    def forward(self, x):
        return x * 2
"""
    )
    body = """
    from nets import tinyNet

    net = tinyNet().cuda()

    def bench(x):
        t1 = time.time()
        y = net(x)
        t2 = time.time()
        return y, t2 - t1
    """
    assert _lines(tmp_path, nets, body) == [9]


def test_a_method_of_a_project_instance_that_waits_is_a_wait(tmp_path: Path) -> None:
    body = """
    from nets import Decoder

    class Demo:
        def __init__(self):
            self.net = torch.nn.Linear(5, 5).cuda()
            self.decoder = Decoder()

        def detect(self, x):
            tic = time.time()
            boxes = self.decoder.suppress(self.net(x))
            return boxes, time.time() - tic

        def raw(self, x):
            tic = time.time()
            boxes = self.decoder.scale(self.net(x))
            return boxes, time.time() - tic
    """
    # suppress() copies the kept boxes to the host; scale() is arithmetic: only raw is reported.
    assert _lines(tmp_path, _NETS, body) == [17]


def test_lbfgs_step_reads_the_closure_loss_back(tmp_path: Path) -> None:
    body = """
    net = torch.nn.Linear(5, 1).cuda()

    def fit(x, y, make):
        opt = torch.optim.LBFGS(net.parameters())

        def closure():
            opt.zero_grad()
            loss = ((net(x) - y) ** 2).mean()
            loss.backward()
            return loss

        tic = time.perf_counter()
        net(x).sum().backward()
        opt.step(closure)
        took = time.perf_counter() - tic
        sgd = torch.optim.SGD(net.parameters(), lr=0.1)
        tic = time.perf_counter()
        net(x).sum().backward()
        sgd.step(closure)
        return took, time.perf_counter() - tic
    """
    assert _lines(tmp_path, _PLAIN_NETS, body) == [21]


def test_a_backward_of_cpu_tensors_is_no_cuda_work(tmp_path: Path) -> None:
    # x is copied to the GPU under another name, so x (and what the local layer makes of it)
    # is on the CPU; z comes from a factory given no device. Only the GPU halves are reported.
    body = """
    def compare(x):
        layer = torch.nn.Linear(64, 64)
        t0 = time.time()
        out = layer(x)
        out.backward(out.data)
        cpu_time = time.time() - t0
        x_cuda = x.cuda()
        t0 = time.time()
        out_cuda = layer(x_cuda)
        out_cuda.backward(out_cuda.data)
        gpu_time = time.time() - t0
        z = torch.randn(64, 64).float().requires_grad_()
        t0 = time.time()
        torch.exp(-z).sum().backward()
        w = torch.exp(-z) / 2
        w.sum().backward()
        plain = time.time() - t0
        z_cuda = torch.randn(64, 64, device="cuda").requires_grad_()
        t0 = time.time()
        (z_cuda * 2).sum().backward()
        return cpu_time, gpu_time, plain, time.time() - t0
    """
    assert _lines(tmp_path, _PLAIN_NETS, body) == [12, 22]
