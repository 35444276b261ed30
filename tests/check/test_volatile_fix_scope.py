"""ST021's fix never puts a backward or an optimizer step under ``torch.no_grad()``, and never
emits overlapping edits on a multi-line ``Variable(...)`` (issue 33 item 4: on the corpus
both broke scripts). The fixed code is run."""

from __future__ import annotations

import ast

import torch

from safetorch.check import fix_source

CRITIC_STEP = """\
import torch
from torch import nn
from torch.autograd import Variable

gen, critic = nn.Linear(3, 4), nn.Linear(4, 1)
opt = torch.optim.SGD(critic.parameters(), lr=0.1)
noise = torch.randn(2, 3)
frozen = Variable(noise, volatile=True)  # the generator is not trained in this step
fake = Variable(gen(frozen).data)
loss = critic(fake).mean()
loss.backward()
opt.step()
"""

MULTI_LINE = """\
import torch
from torch.autograd import Variable

x = torch.ones(2, 2)
y = Variable(x,
             volatile=True)
z = (y * 2).sum()
"""


def _run(source: str) -> dict:
    scope: dict = {"__name__": "fixture"}
    exec(compile(source, "<fixed>", "exec"), scope)
    return scope


def test_a_backward_after_the_variable_is_not_put_under_no_grad() -> None:
    fixed = fix_source(CRITIC_STEP, "wgan.py", ["ST021"], unsafe_fixes=True)
    assert fixed != CRITIC_STEP
    assert "no_grad" not in fixed
    assert "st.legacy.volatile(noise)" in fixed
    scope = _run(fixed)  # backward and step work: the critic still has its graph
    assert scope["critic"].weight.grad is not None
    assert scope["gen"].weight.grad is None


def test_a_multi_line_variable_gets_one_edit_that_parses_and_runs() -> None:
    fixed = fix_source(MULTI_LINE, "speed.py", ["ST021"], unsafe_fixes=True)
    assert fixed != MULTI_LINE
    ast.parse(fixed)
    scope = _run(fixed)
    assert not scope["z"].requires_grad
    assert torch.equal(scope["z"], torch.tensor(8.0))


def test_an_inference_block_is_still_wrapped() -> None:
    source = (
        "import torch\nfrom torch.autograd import Variable\n"
        "net = torch.nn.Linear(2, 1)\n"
        "x = Variable(torch.ones(1, 2), volatile=True)\nout = net(x)\n"
    )
    fixed = fix_source(source, "eval.py", ["ST021"], unsafe_fixes=True)
    assert "with torch.no_grad():" in fixed
    assert not _run(fixed)["out"].requires_grad
