"""Issue 33, precision on unseen code: ST006 (unsynchronized CUDA timing) does not report an
interval that already waits for the GPU, ST005 (in-place op on a ``.detach()``) reports only
a detached tensor that shares memory with one still in use, and ST018 finds every use of
``torch._six``. Each idiom is written here in our own words: the findings kept, and the false
positives removed."""

from __future__ import annotations

import textwrap
from typing import List

import pytest

from safetorch.check import check_source

_CUDA_HEADER = """\
import time
import torch

net = torch.nn.Linear(8, 8).cuda()
opt = torch.optim.SGD(net.parameters(), lr=0.1)
"""


def _lines(src: str, code: str) -> List[int]:
    return [d.line for d in check_source(textwrap.dedent(src), "m.py", select=code)]


def _timing(body: str) -> List[int]:
    """Lines of the ST006 findings (numbered within ``body``) in ``body`` after a header
    that puts a model on CUDA; ST006 is a default rule (no ``select``)."""
    src = _CUDA_HEADER + textwrap.dedent(body)
    offset = _CUDA_HEADER.count("\n")
    return [d.line - offset for d in check_source(src, "m.py") if d.code == "ST006"]


# -- ST006: findings kept ----------------------------------------------------------------------
@pytest.mark.parametrize(
    "body, lines",
    [
        (  # a forward timed and nothing waits for it
            """
            def bench(batch):
                begin = time.perf_counter()
                out = net(batch)
                return out, time.perf_counter() - begin
            """,
            [5],
        ),
        (  # a training step: forward, backward, step; the loss is read after the clock
            """
            def train_step(batch, target):
                tic = time.time()
                loss = (net(batch) - target).pow(2).mean()
                loss.backward()
                opt.step()
                toc = time.time()
                return loss.item(), toc - tic
            """,
            [7],
        ),
        (  # the input copy waits only for what came before the forward
            """
            def infer(sample):
                tic = time.time()
                out = net(sample.cuda())
                return out, time.time() - tic
            """,
            [5],
        ),
        (  # a value read after the first forward, a second forward left running
            """
            def two_models(batch):
                tic = time.time()
                first = net(batch)
                score = first.sum().item()
                second = net(first)
                return score, second, time.time() - tic
            """,
            [7],
        ),
        (  # a scheduler step and model.train() are not the work; the forward after the copy is
            """
            def epoch_step(images, sched):
                tic = time.time()
                sched.step()
                net.train()
                images = images.to(device)
                loss = net(images).sum()
                loss.backward()
                opt.step()
                return time.time() - tic
            """,
            [10],
        ),
        (  # a helper of the file that launches the work and leaves it running
            """
            def run_once(batch):
                out = net(batch)
                out.sum().backward()

            def timed(batch):
                tic = time.time()
                run_once(batch)
                return time.time() - tic
            """,
            [9],
        ),
        (  # a helper that syncs first and launches work last is work, not a wait
            """
            def log_then_step(batch):
                print(batch.sum().item())
                net(batch).sum().backward()

            def timed(batch):
                tic = time.time()
                log_then_step(batch)
                return time.time() - tic
            """,
            [9],
        ),
        (  # a loop of forwards that never waits
            """
            def bench_loop(batch):
                tic = time.perf_counter()
                for _ in range(20):
                    net(batch)
                return time.perf_counter() - tic
            """,
            [6],
        ),
    ],
)
def test_timing_finding_kept(body: str, lines: List[int]) -> None:
    assert _timing(body) == lines


# -- ST006: intervals that already wait for the GPU --------------------------------------------
@pytest.mark.parametrize(
    "waits",
    [
        "value = out.sum().item()",
        "value = out.cpu()",
        "value = out.tolist()",
        "value = out.detach().cpu().numpy()",
        "value = float(out.mean())",
        "value = int(out.argmax())",
        "print(out.mean())",
        "value = f'{out.mean():.3f}'",
        "value = 'loss %.3f' % out.mean()",
        "value = 'loss {:.3f}'.format(out.mean())",
        "value = out.to('cpu')",
        "value = out.to(device='cpu')",
        "torch.cuda.synchronize()",
        "torch.cuda.current_stream().synchronize()",
        "done.synchronize()",
    ],
)
def test_timing_interval_that_waits_is_not_reported(waits: str) -> None:
    body = f"""
    def bench(batch, done):
        tic = time.time()
        out = net(batch)
        {waits}
        return time.time() - tic
    """
    assert _timing(body) == []


def test_timing_names_bound_to_a_synchronize_wait() -> None:
    body = """
    sync = torch.cuda.synchronize
    wait = getattr(torch, "cuda").synchronize

    def a(batch):
        tic = time.time()
        net(batch)
        sync()
        return time.time() - tic

    def b(batch):
        tic = time.time()
        net(batch)
        wait()
        return time.time() - tic
    """
    assert _timing(body) == []


def test_timing_helper_whose_last_cuda_interaction_waits() -> None:
    body = """
    def accuracy(batch, labels):
        hits = (net(batch).argmax(1) == labels).sum()
        return hits.item() / len(labels)

    def evaluate(loader):
        return [accuracy(x, y) for x, y in loader]

    class Trainer:
        def report(self, loss):
            self.history.append(loss.item())

        def step(self, batch):
            tic = time.time()
            loss = net(batch).sum()
            loss.backward()
            self.report(loss)
            return time.time() - tic

    def timed(loader):
        tic = time.time()
        scores = evaluate(loader)  # two levels down: accuracy() reads .item() last
        return scores, time.time() - tic
    """
    assert _timing(body) == []


def test_timing_arithmetic_after_a_blocking_copy_that_follows_the_forward() -> None:
    # The forward is synchronized by the blocking host-to-device copy after it; only a few
    # elementwise ops on its result are left running when the clock is read.
    body = """
    def detect(images, means):
        tic = time.time()
        boxes = net(images)
        offsets = torch.tensor(means).cuda()
        boxes = torch.clamp(boxes.view(-1, 4) * offsets + offsets, 0, 1)
        boxes = boxes.squeeze()
        return boxes, time.time() - tic
    """
    assert _timing(body) == []


def test_timing_of_a_whole_training_whose_iterations_wait() -> None:
    # An epoch loop around a batch loop that copies each batch to the device (a wait): every
    # iteration but the last is synchronized in the next; the hours of training are right.
    body = """
    def fit(loader, epochs):
        start = time.time()
        for epoch in range(epochs):
            for images, target in loader:
                images = images.to(device)
                loss = (net(images) - target).abs().mean()
                loss.backward()
                opt.step()
            net.eval()
        print(f"done in {(time.time() - start) / 3600:.2f} h")
    """
    assert _timing(body) == []


def test_seed_timing_fixture_found_by_default() -> None:
    from pathlib import Path

    path = Path(__file__).parent / "fixtures" / "timing.py"
    found = [(d.line, d.code) for d in check_source(path.read_text(), str(path))]
    assert [f for f in found if f[1] == "ST006"] == [(12, "ST006"), (20, "ST006"), (27, "ST006")]
