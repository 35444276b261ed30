"""The automatic fixes keep behaviour: run the code before and after ``fix_source`` with torch."""

from __future__ import annotations

import textwrap
import warnings
from typing import Any, Dict

import pytest
import torch

from safetorch.check import check_source, fix_source

HEADER = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n"


def run(source: str, **env: Any) -> Dict[str, Any]:
    namespace: Dict[str, Any] = dict(env)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the deprecated originals warn on purpose
        exec(compile(source, "<snippet>", "exec"), namespace)
    return namespace


def fixed(body: str) -> str:
    source = HEADER + textwrap.dedent(body)
    after = fix_source(source, select=["ALL", "PREVIEW"], unsafe_fixes=True)
    assert after != source, "expected a fix"
    assert [d for d in check_source(after, select=["ALL", "PREVIEW"]) if d.fix is not None] == []
    return after


@pytest.mark.parametrize(
    "body",
    [
        "y = F.upsample(x, scale_factor=2)",
        "y = F.upsample(x, None, 2, 'bilinear')",
        "y = F.upsample(x, size=(7, 9), mode='bicubic', align_corners=True)",
        "y = F.upsample_nearest(x, scale_factor=3)",
        "y = F.upsample_nearest(x, (5, 6))",
        "y = F.upsample_bilinear(x, scale_factor=2)",
        "y = F.upsample_bilinear(x, None, 1.5)",
        "y = nn.UpsamplingNearest2d(scale_factor=2)(x)",
        "y = nn.UpsamplingBilinear2d(None, 2)(x)",
        "y = nn.UpsamplingBilinear2d(size=(7, 5))(x)",
    ],
)
def test_upsample_fixes_are_exactly_equivalent(body: str) -> None:
    x = torch.randn(2, 3, 4, 5)
    before = run(HEADER + body, x=x)["y"]
    after = run(fixed(body), x=x)["y"]
    assert "upsample" not in fixed(body).split("\n", 3)[3].replace("Upsample(", "")
    torch.testing.assert_close(after, before, rtol=0, atol=0)


def test_load_fix_loads_the_same_tensors(tmp_path: Any) -> None:
    path = tmp_path / "w.pt"
    torch.save({"w": torch.arange(6.0)}, path)
    # The snippet writes the file it loads (a dict of tensors): the fix is offered, as st.load
    # (its oldest torch is unknown; torch 1.13's weights-only unpickler refuses floats).
    body = "torch.save({'w': torch.arange(6.0)}, path)\nsd = torch.load(path, map_location='cpu')"
    assert "sd = st.load(path, map_location='cpu')" in fixed(body)
    before = run(HEADER + body, path=str(path))["sd"]
    after = run(fixed(body), path=str(path))["sd"]
    torch.testing.assert_close(after, before)


def test_detach_fix_leaves_the_source_tensor_alone() -> None:
    # h is a graph's output, used again by the loss after the write: ST005's evidence.
    body = "h = double(x)\ny = h.detach()\ny.add_(1)\nout = y * 2\nloss = h.sum()\nloss.backward()"

    def double(t: "torch.Tensor") -> "torch.Tensor":
        return t * 2

    x = torch.zeros(3, requires_grad=True)
    assert run(HEADER + body, x=x, double=double)["loss"].item() == 3  # the write reached h
    x2 = torch.zeros(3, requires_grad=True)
    found = run(fixed(body), x=x2, double=double)
    assert found["loss"].item() == 0  # the fix does not write into h
    torch.testing.assert_close(found["out"], torch.full((3,), 2.0))
    torch.testing.assert_close(x2.grad, torch.full((3,), 2.0))


def test_argparse_fix_makes_the_default_work(capsys: pytest.CaptureFixture[str]) -> None:
    body = """
    import argparse
    parser = argparse.ArgumentParser(prog="train.py")
    parser.add_argument("configs", default="base.yaml")
    """
    with pytest.raises(SystemExit):
        run(HEADER + textwrap.dedent(body))["parser"].parse_args([])
    assert (
        "train.py: error: the following arguments are required: configs" in capsys.readouterr().err
    )
    parser = run(fixed(body))["parser"]
    assert parser.parse_args([]).configs == "base.yaml"
    assert parser.parse_args(["other.yaml"]).configs == "other.yaml"


def test_bias_fix_keeps_the_batchnorm_output_in_training() -> None:
    body = "net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))"
    torch.manual_seed(0)
    before = run(HEADER + body)["net"]
    torch.manual_seed(0)
    after = run(fixed(body))["net"]
    assert before[0].bias is not None and after[0].bias is None
    with torch.no_grad():
        after[0].weight.copy_(before[0].weight)
    x = torch.randn(2, 3, 8, 8)
    # The bias was cancelled by BatchNorm's mean subtraction: same output without it.
    torch.testing.assert_close(after(x), before(x), rtol=1e-5, atol=1e-5)


def test_bias_fix_is_unsafe_because_checkpoints_stop_loading() -> None:
    # The reason ST008's fix is only applied with --unsafe-fixes: a checkpoint saved before
    # the fix no longer loads into the fixed model.
    body = "net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))"
    source = HEADER + body
    assert fix_source(source, select=["ST008"]) == source
    state = run(source)["net"].state_dict()
    with pytest.raises(RuntimeError, match=r'Unexpected key\(s\) in state_dict: "0.bias"'):
        run(fixed(body))["net"].load_state_dict(state)


def test_dropout_fix_turns_dropout_off_in_eval() -> None:
    body = """
    class Net(nn.Module):
        def forward(self, x):
            return F.dropout(x, 0.5)
    net = Net().eval()
    """
    source = HEADER + textwrap.dedent(body)
    assert fix_source(source) == source  # unsafe: plain --fix leaves it
    x = torch.ones(1000)
    torch.manual_seed(0)
    assert not torch.equal(run(source)["net"](x), x)  # still dropping in eval
    assert torch.equal(run(fixed(body))["net"](x), x)
