"""ST008 (bias before BatchNorm) on evidence (issue 33 items 2 and 4, issue 34 item 2).

A ``bias=bias`` parameter is judged from what the project's calls pass; conv -> BN pairs are
followed through variables and ``forward``, and not where something between them uses the
bias; ``bias=False`` is written only where nothing in the project (an init helper, a
checkpoint load) would break, and the fixed code is run to show it.
"""

from __future__ import annotations

import sys
import textwrap
import warnings
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest
import torch
from _check_project import TORCH_LOAD_WARNS

from safetorch.check import check_source, fix_source
from safetorch.check import project as project_module
from safetorch.check.engine import Diagnostic
from safetorch.check.runner import check_file, check_paths

HEADER = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n"


@pytest.fixture(autouse=True)
def _fresh_projects() -> Iterator[None]:
    project_module.clear()
    yield
    project_module.clear()


def st008(source: str, path: str = "<string>") -> List[Diagnostic]:
    return [d for d in check_source(textwrap.dedent(source), path, ["ST008"]) if d.code == "ST008"]


def write_project(root: Path, files: Dict[str, str]) -> None:
    (root / "setup.py").write_text("")
    for name, text in files.items():
        target = root / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(textwrap.dedent(text))


def project_st008(root: Path) -> Dict[str, List[Diagnostic]]:
    found: Dict[str, List[Diagnostic]] = {}
    for result in check_paths([str(root)], ["ST008"]):
        rel = str(Path(result.path).relative_to(root))
        found[rel] = [d for d in result.diagnostics if d.code == "ST008"]
    return found


def run(source: str) -> Dict[str, Any]:
    namespace: Dict[str, Any] = {"__name__": "fixed"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exec(compile(source, "<fixed>", "exec"), namespace)
    return namespace


# -- bias=bias: judged from the calls ---------------------------------------------------------
BUILDER = """
import torch.nn as nn


def conv_bn(cin, cout, bias={default}):
    return nn.Sequential(nn.Conv2d(cin, cout, 3, bias=bias), nn.BatchNorm2d(cout))
"""


def test_a_false_default_that_no_caller_overrides_is_not_a_finding(tmp_path: Path) -> None:
    write_project(
        tmp_path,
        {
            "blocks.py": BUILDER.format(default="False"),
            "net.py": "from blocks import conv_bn\nstem = conv_bn(3, 8)\nbody = conv_bn(8, 8)\n",
        },
    )
    assert project_st008(tmp_path)["blocks.py"] == []


def test_a_true_default_every_caller_sets_false_is_not_a_finding(tmp_path: Path) -> None:
    write_project(
        tmp_path,
        {
            "blocks.py": BUILDER.format(default="True"),
            "net.py": (
                "from blocks import conv_bn\n"
                "stem = conv_bn(3, 8, bias=False)\n"
                "body = conv_bn(8, 8, False)\n"
            ),
        },
    )
    assert project_st008(tmp_path)["blocks.py"] == []


def test_a_true_default_a_caller_leaves_is_a_finding_with_the_call(tmp_path: Path) -> None:
    write_project(
        tmp_path,
        {
            "blocks.py": BUILDER.format(default="True"),
            "net.py": (
                "from blocks import conv_bn\n"
                "stem = conv_bn(3, 8, bias=False)\n"
                "body = conv_bn(8, 8)\n"
            ),
        },
    )
    (diag,) = project_st008(tmp_path)["blocks.py"]
    assert diag.fix is None
    assert "bias=bias, whose default is True; the call at net.py:3 leaves it" in diag.message
    assert "pass bias=False where it is built" in diag.message


def test_a_caller_passing_true_is_a_finding_with_the_call(tmp_path: Path) -> None:
    write_project(
        tmp_path,
        {
            "blocks.py": BUILDER.format(default="False"),
            "net.py": "import blocks\nhead = blocks.conv_bn(8, 8, bias=True)\n",
        },
    )
    (diag,) = project_st008(tmp_path)["blocks.py"]
    assert "bias=bias; the call at net.py:2 passes True" in diag.message


def test_a_true_default_nothing_calls_is_a_finding() -> None:
    (diag,) = st008(BUILDER.format(default="True"))
    assert "whose default is True; no call of conv_bn in the project passes False" in diag.message


def test_an_unknown_value_at_a_call_is_not_evidence() -> None:
    source = BUILDER.format(default="True") + "\nx = conv_bn(3, 8, bias=use_bias)\n"
    assert st008(source) == []


def test_a_parameter_reassigned_in_the_builder_is_not_judged() -> None:
    source = """
    import torch.nn as nn

    def conv_bn(cin, cout, bias=True, norm=True):
        bias = bias and not norm
        return nn.Sequential(nn.Conv2d(cin, cout, 3, bias=bias), nn.BatchNorm2d(cout))
    """
    assert st008(source) == []


CONV_BN_MODULE = """
import torch.nn as nn


class ConvBN(nn.Module):
    def __init__(self, cin, cout, bias=True):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, padding=1, bias=bias)
        self.bn = nn.BatchNorm2d(cout)

    def forward(self, x):
        return self.bn(self.conv(x))
"""


@pytest.mark.parametrize(
    "calls",
    [
        "a = ConvBN(3, 8, bias=False)\nb = ConvBN(8, 8, False)\n",
        "class Wide(ConvBN):\n    def __init__(self, c):\n        super().__init__(c, c, bias=False)\n",
        "class Old(ConvBN):\n    def __init__(self, c):\n        ConvBN.__init__(self, c, c, False)\n",
        "import functools\nmake = functools.partial(ConvBN, bias=False)\n",
    ],
    ids=["calls", "super", "base-init", "partial"],
)
def test_a_module_every_construction_of_which_sets_false_is_not_a_finding(calls: str) -> None:
    assert st008(CONV_BN_MODULE + calls) == []


def test_a_module_built_with_its_true_default_is_a_finding() -> None:
    (diag,) = st008(CONV_BN_MODULE + "a = ConvBN(3, 8, bias=False)\nb = ConvBN(8, 8)\n")
    assert "the call at line 14 leaves it" in diag.message


# -- pairs reached through variables and forward ----------------------------------------------
def test_pairs_through_variables_are_found() -> None:
    source = """
    import torch.nn as nn

    conv = nn.Conv2d(3, 8, 3)
    bn = nn.BatchNorm2d(8)
    stem = nn.Sequential(conv, bn)

    def features(cfg):
        layers, c = [], 3
        for width in cfg:
            conv = nn.Conv2d(c, width, 3, padding=1)
            layers += [conv, nn.BatchNorm2d(width)]
            c = width
        return nn.Sequential(*layers)
    """
    diags = st008(source)
    assert [d.line for d in diags] == [4, 11]
    assert all(d.fix is None for d in diags)  # a layer held in a name may be used elsewhere


FORWARD = """
import torch
import torch.nn as nn


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d({width})
        self.act = nn.ReLU()

    def forward(self, x):
{body}
"""


def forward_source(body: str, width: int = 8) -> str:
    return FORWARD.format(width=width, body=textwrap.indent(textwrap.dedent(body), " " * 8))


def test_forward_sequencing_is_found_and_fixed() -> None:
    source = forward_source("x = self.conv(x)\nx = self.bn(x)\nreturn self.act(x)\n")
    (diag,) = st008(source)
    assert diag.line == 9 and diag.fix is not None
    fixed = fix_source(source, select=["ST008"], unsafe_fixes=True)
    assert "nn.Conv2d(3, 8, 3, padding=1, bias=False)" in fixed
    block = run(fixed)["Block"]()
    assert block.conv.bias is None and block(torch.randn(2, 3, 8, 8)).shape == (2, 8, 8, 8)


@pytest.mark.parametrize(
    "body",
    [
        "x = self.conv(x)\nx = self.act(x)\nx = self.bn(x)\nreturn x\n",
        "y = self.conv(x)\nz = self.bn(y)\nreturn z + y\n",
        "a = self.bn(self.conv(x))\nb = self.conv(x)\nreturn a + b\n",
        "x = self.conv(x)\nx = torch.cat([x, x], 1)[:, :8]\nx = self.bn(x)\nreturn x\n",
        "x = self.conv(x)\nx = x + 1\nreturn self.bn(x)\n",
    ],
    ids=["activation", "output-reused", "conv-used-twice", "concatenation", "addition"],
)
def test_forward_where_the_bias_matters_is_not_a_finding(body: str) -> None:
    assert st008(forward_source(body)) == []


def test_a_norm_of_another_width_is_not_fed_by_the_conv() -> None:
    assert st008(forward_source("x = self.conv(x)\nreturn self.bn(x)\n", width=16)) == []
    assert (
        st008("import torch.nn as nn\nf = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(4))\n")
        == []
    )


def test_dropout_before_bn_is_still_found_with_a_shared_dropout() -> None:
    source = """
    import torch.nn as nn

    class Head(nn.Module):
        def __init__(self):
            super().__init__()
            self.drop = nn.Dropout(0.3)
            self.bn = nn.BatchNorm1d(8)

        def forward(self, x, y):
            x = self.drop(x)
            x = self.bn(x)
            return x + self.drop(y)
    """
    codes = [d.code for d in check_source(textwrap.dedent(source), select=["ALL", "PREVIEW"])]
    assert codes == ["ST009"]


# -- the fix: never where it breaks code ------------------------------------------------------
def test_an_explicit_bias_true_is_reported_but_never_flipped() -> None:
    source = HEADER + "net = nn.Sequential(nn.Conv2d(3, 8, 3, bias=True), nn.BatchNorm2d(8))\n"
    (diag,) = st008(source)
    assert diag.fix is None and "bias=True is written explicitly" in diag.message
    assert "published or saved weights" in diag.message
    assert fix_source(source, select=["ST008"], unsafe_fixes=True) == source


def test_a_positional_bias_is_reported_but_never_rewritten() -> None:
    source = HEADER + "net = nn.Sequential(nn.Linear(4, 8, True), nn.BatchNorm1d(8))\n"
    (diag,) = st008(source)
    assert diag.fix is None and "True (positional) is written explicitly" in diag.message
    assert fix_source(source, select=["ST008"], unsafe_fixes=True) == source


def test_the_fix_adds_a_keyword_and_keeps_every_positional_argument() -> None:
    body = "net = nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1, 1, 1), nn.BatchNorm2d(8))\n"
    fixed = fix_source(HEADER + body, select=["ST008"], unsafe_fixes=True)
    assert fixed.endswith("nn.Conv2d(3, 8, 3, 2, 1, 1, 1, bias=False), nn.BatchNorm2d(8))\n")
    conv = run(fixed)["net"][0]
    assert (conv.stride, conv.padding, conv.dilation, conv.groups) == ((2, 2), (1, 1), (1, 1), 1)
    assert conv.bias is None


def test_a_layer_class_named_through_a_variable_gets_no_fix() -> None:
    source = """
    import torch.nn as nn

    def block(c, conv_layer=nn.Conv2d):
        return nn.Sequential(conv_layer(c, c, 3), nn.BatchNorm2d(c))
    """
    (diag,) = st008(source)
    assert diag.fix is None and "named through a variable" in diag.message


MODEL = """
import torch.nn as nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        return self.head(self.features(x).mean((2, 3)))
"""

ZEROING_INIT = """
import torch.nn as nn


def init_weights(m):
    if isinstance(m, nn.Conv2d):
        nn.init.kaiming_normal_(m.weight)
        m.bias.data.zero_()
"""

GUARDED_INIT = """
import torch.nn as nn


def init_weights(m):
    if isinstance(m, nn.Conv2d):
        nn.init.kaiming_normal_(m.weight)
        if m.bias is not None:
            m.bias.data.zero_()
"""

TRAIN = """
import torch
from model import Net
from init import init_weights

net = Net()
net.apply(init_weights)
"""


def test_an_init_helper_in_another_file_writing_the_bias_blocks_the_fix(tmp_path: Path) -> None:
    write_project(tmp_path, {"model.py": MODEL, "init.py": ZEROING_INIT, "train.py": TRAIN})
    (diag,) = project_st008(tmp_path)["model.py"]
    assert diag.fix is None
    assert "writes .bias at init.py:8" in diag.message and "if m.bias is not None" in diag.message
    # What the fix would have done: the helper crashes on the missing bias.
    broken = MODEL.replace("padding=1)", "padding=1, bias=False)")
    net = run(broken)["Net"]()
    with pytest.raises(AttributeError):
        net.apply(run(ZEROING_INIT)["init_weights"])


def test_a_checkpoint_load_in_another_file_blocks_the_fix(tmp_path: Path) -> None:
    train = TRAIN + "net.load_state_dict(torch.load('net.pt', weights_only=True))\n"
    write_project(tmp_path, {"model.py": MODEL, "init.py": GUARDED_INIT, "train.py": train})
    (diag,) = project_st008(tmp_path)["model.py"]
    assert diag.fix is None
    assert "load_state_dict at train.py:8 may load one saved with it" in diag.message
    assert "strict load would then fail on its unexpected key" in diag.message
    # What the fix would have done: the checkpoint saved before it no longer loads.
    saved = run(MODEL)["Net"]().state_dict()
    fixed_net = run(MODEL.replace("padding=1)", "padding=1, bias=False)"))["Net"]()
    with pytest.raises(RuntimeError, match="Unexpected key"):
        fixed_net.load_state_dict(saved)


def test_a_load_in_a_file_that_never_runs_with_the_model_does_not_block(tmp_path: Path) -> None:
    other = "import torch\nstate = torch.load('other.pt', weights_only=True)\n"
    write_project(
        tmp_path,
        {"model.py": MODEL, "init.py": GUARDED_INIT, "train.py": TRAIN, "tools/other.py": other},
    )
    (diag,) = project_st008(tmp_path)["model.py"]
    assert diag.fix is not None


def test_a_module_imported_by_name_at_run_time_makes_every_load_count(tmp_path: Path) -> None:
    other = (
        "import importlib, sys, torch\n"
        "net = importlib.import_module(sys.argv[1]).Net()\n"
        "net.load_state_dict(torch.load('net.pt', weights_only=True))\n"
    )
    write_project(tmp_path, {"model.py": MODEL, "tools/run.py": other})
    (diag,) = project_st008(tmp_path)["model.py"]
    assert diag.fix is None and "tools/run.py:3" in diag.message


def test_no_fix_where_the_project_is_too_big_to_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_project(tmp_path, {"model.py": MODEL, "a.py": "", "b.py": ""})
    monkeypatch.setattr(project_module, "MAX_FILES", 2)
    (diag,) = check_file(str(tmp_path / "model.py"), ["ST008"]).diagnostics
    assert diag.fix is None and "too big to read whole" in diag.message


@TORCH_LOAD_WARNS
def test_the_fix_offered_runs_and_its_checkpoints_load_strictly(tmp_path: Path) -> None:
    write_project(tmp_path, {"model.py": MODEL, "init.py": GUARDED_INIT, "train.py": TRAIN})
    result = check_file(str(tmp_path / "model.py"), ["ST008"], fix=True, unsafe_fixes=True)
    assert result.fixed == 1 and result.after is not None
    assert "nn.Conv2d(3, 8, 3, padding=1, bias=False)" in result.after
    (tmp_path / "model.py").write_text(result.after)
    sys.path.insert(0, str(tmp_path))
    try:
        namespace = run((tmp_path / "train.py").read_text())
    finally:
        sys.path.remove(str(tmp_path))
        for name in ("model", "init"):
            sys.modules.pop(name, None)
    net = namespace["net"]
    assert net.features[0].bias is None
    assert net(torch.randn(2, 3, 8, 8)).shape == (2, 2)
    path = tmp_path / "net.pt"
    torch.save(net.state_dict(), path)
    again = type(net)()
    again.load_state_dict(torch.load(path, weights_only=True))  # strict
    torch.testing.assert_close(again.state_dict(), net.state_dict())


@pytest.mark.parametrize(
    ("call", "blocks"),
    [
        ("net.load_state_dict(state)", True),
        ("load_pretrained_model(net, path)", True),
        ("Net.from_pretrained('name')", True),
        ("offload_state_dict(folder, state)", False),
        ("is_stateful_dataloader_available()", False),
        ("torch.utils.data.DataLoader(data)", False),
    ],
)
def test_what_counts_as_a_checkpoint_load(call: str, blocks: bool) -> None:
    source = HEADER + "net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8))\n" + call + "\n"
    (diag,) = st008(source)
    assert (diag.fix is None) is blocks
