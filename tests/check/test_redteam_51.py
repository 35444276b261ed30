"""Red team, stop 51: inputs on which this stop's first versions of its new exceptions made
the checker wrong (each failed as a strict xfail on them); the rules were fixed the same stop
and every case now holds."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Dict, Iterator, List, Sequence

import pytest

from safetorch.check import check_source, project
from safetorch.check._newer_syntax import parses as _parses
from safetorch.check.runner import check_paths


@pytest.fixture(autouse=True)
def _fresh_projects() -> Iterator[None]:
    project.clear()
    yield
    project.clear()


def _project(root: Path, files: Dict[str, str], name: str, codes: Sequence[str]) -> List[int]:
    """Lines of the findings of ``codes`` in ``name`` of a project made of ``files``."""
    (root / "setup.py").write_text("")
    for rel, text in files.items():
        target = root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(textwrap.dedent(text).lstrip())
    return [
        d.line
        for r in check_paths([str(root)], list(codes))
        if r.path.endswith(name)
        for d in r.diagnostics
        if d.code in codes
    ]


def _line_of(text: str, needle: str) -> int:
    lines = textwrap.dedent(text).lstrip().splitlines()
    return next(i for i, line in enumerate(lines, 1) if needle in line)


# -- ST020 (default set): a class name shared by two modules --------------------------------

_OWN_LOSS = """
import torch
import torch.nn as nn


class Loss(nn.Module):
    def forward(self, a, b):
        return (a - b).abs().mean()


crit = Loss()
x = torch.ones(2, 4)
loss = crit(x, x * 2)
print(loss.data[0])
"""

# Another module of the project happens to define a class of the same name that returns a
# column: it says nothing about the file's own Loss, whose mean is 0-dim.
_OTHER_LOSS = """
import torch.nn as nn


class Loss(nn.Module):
    def forward(self, a, b):
        return (a - b).abs().mean(1).view(-1, 1)
"""


def test_st020_a_same_named_class_elsewhere_does_not_hide_a_proven_finding(
    tmp_path: Path,
) -> None:
    files = {"train.py": _OWN_LOSS, "other.py": _OTHER_LOSS}
    assert _project(tmp_path, files, "train.py", ["ST020", "ST029"]) == [13]


_CRITIC_TRAIN = """
import torch
from wgan import Critic

netD = Critic()
x = torch.ones(2, 4)
errD = netD(x)
print(errD.data[0])
"""


def test_st029_the_imported_class_decides_not_a_namesake(tmp_path: Path) -> None:
    wgan = (
        "import torch.nn as nn\n\nclass Critic(nn.Module):\n"
        "    def forward(self, x):\n        return x.mean()\n"
    )
    dcgan = (
        "import torch.nn as nn\n\nclass Critic(nn.Module):\n"
        "    def forward(self, x):\n        return x.mean(0).view(1)\n"
    )
    files = {"train.py": _CRITIC_TRAIN, "wgan.py": wgan, "dcgan.py": dcgan}
    assert _project(tmp_path, files, "train.py", ["ST020", "ST029"]) == [7]


# -- ST029: forwards taken as "returns a row at every return" that do not -------------------

_NOT_A_ROW = {
    # a single non-literal argument of view/reshape may be an empty shape or a dtype
    "view-empty-shape": "        shape = ()\n        return x.mean().view(shape)\n",
    "view-size": "        return x.mean().view(torch.Size([]))\n",
    "view-dtype": "        return x.mean().view(torch.float32)\n",
    # the row is rebound by something other than a plain `name = ...`
    "tuple-target": "        out = x.mean(0).view(1)\n        out, _ = out.max(0)\n        return out\n",
    "for-target": "        out = x.mean(0).view(1)\n        for out in [x.sum()]:\n"
    "            pass\n        return out\n",
    "walrus": "        out = x.mean(0).view(1)\n        if (out := x.sum()) is not None:\n"
    "            pass\n        return out\n",
    "squeeze-in-place": "        out = x.mean(0).view(1)\n        out.squeeze_()\n        return out\n",
    # a method of the model that happens to be called cat is not torch.cat
    "self-cat": "        return self.cat(x)\n\n    def cat(self, x):\n        return x.sum()\n",
}


@pytest.mark.parametrize("forward", sorted(_NOT_A_ROW))
def test_st029_a_forward_that_may_return_0_dim_keeps_the_finding(
    tmp_path: Path, forward: str
) -> None:
    models = (
        "import torch\nimport torch.nn as nn\n\n\nclass Critic(nn.Module):\n"
        "    def forward(self, x):\n" + _NOT_A_ROW[forward]
    )
    train = _CRITIC_TRAIN.replace("from wgan import Critic", "from models import Critic")
    files = {"train.py": train, "models.py": models}
    assert _project(tmp_path, files, "train.py", ["ST020", "ST029"]) == [7]


# -- ST000 (default set): the "not checked, Python 3.12 syntax" message ----------------------

_NEWER_PARSES = _parses('f"{d["k"]}"') and _parses("type P = int")


@pytest.mark.skipif(_NEWER_PARSES, reason="only a Python older than 3.12 gives this message")
@pytest.mark.parametrize(
    "source",
    [
        'a = 1\nx = f"{a"\n',  # an unclosed replacement field
        "def f[T](x) -> T return x\n",  # the colon is missing
        "class C[T:\n    pass\n",  # the bracket is never closed
        "type X = \n",  # nothing after the =
        "type X = int int\n",
    ],
)
def test_st000_broken_code_is_not_called_newer_syntax(source: str) -> None:
    found = [d for d in check_source(source, "b.py") if d.code == "ST000"]
    assert len(found) == 1
    assert "not checked" not in found[0].message


@pytest.mark.skipif(_NEWER_PARSES, reason="this Python parses Python 3.12 f-strings")
@pytest.mark.parametrize(
    "source",
    [
        "xs = ['a']\nx = f\"{'\\n'.join(xs)}\"\n",
        'a = 1\nx = f"{a # the value\n}"\n',
    ],
)
def test_st000_other_newer_f_strings_are_not_called_broken(source: str) -> None:
    found = [d for d in check_source(source, "n.py") if d.code == "ST000"]
    assert len(found) == 1
    assert "not checked" in found[0].message


# -- ST004: the CPU-only script --------------------------------------------------------------

_TRAIN = """
import torch
from model import Net

net = Net().cuda()
torch.save({"model": net.state_dict()}, "runs/last.pth")
"""

_EXPORT = """
import torch
from model import Net

if __name__ == "__main__":
    net = Net()
    net.load_state_dict(torch.load("runs/last.pth")["model"])
    torch.onnx.export(net, torch.randn(1, 3), "net.onnx")
"""

_PLAIN_NET = "import torch\nNet = torch.nn.Linear\n"
_CUDA_NET = "import torch\n\ndef Net():\n    return torch.nn.Linear(3, 3).cuda()\n"


@pytest.mark.parametrize("layout", ["src-path", "re-export"])
def test_st004_a_cuda_module_imported_indirectly_is_seen(tmp_path: Path, layout: str) -> None:
    if layout == "src-path":
        imports = "import sys\nsys.path.insert(0, 'src')\nfrom mypkg.model import Net"
        files = {
            "src/mypkg/__init__.py": "",
            "src/mypkg/model.py": _CUDA_NET,
            "train.py": _TRAIN.replace("from model import Net", imports),
            "export.py": _EXPORT.replace("from model import Net", imports),
        }
    else:
        files = {
            "model.py": "from nets.core import Net\n",
            "nets/__init__.py": "",
            "nets/core.py": _CUDA_NET,
            "train.py": _TRAIN,
            "export.py": _EXPORT,
        }
    assert _project(tmp_path, files, "export.py", ["ST004"]) == []


@pytest.mark.parametrize(
    "move",
    [
        "    net = Net().to(0)",
        '    net = Net()\n    torch.set_default_tensor_type("torch.cuda.FloatTensor")',
        '    import os\n    net = Net().to(torch.device(os.environ["DEVICE"]))',
        "    import pytorch_lightning as pl\n    net = Net()\n"
        '    pl.Trainer(accelerator="gpu", devices=1).validate(net)',
    ],
)
def test_st004_a_script_on_the_gpu_without_the_word_cuda(tmp_path: Path, move: str) -> None:
    export = _EXPORT.replace("    net = Net()", move, 1)
    files = {"train.py": _TRAIN, "model.py": _PLAIN_NET, "export.py": export}
    assert _project(tmp_path, files, "export.py", ["ST004"]) == []


# -- ST004: a type test that does decide the machine ----------------------------------------

_PRUNE = """
import argparse
import torch
import torch.nn as nn

parser = argparse.ArgumentParser()
parser.add_argument("--no-cuda", action="store_true")
args = parser.parse_args()
gpu = None if args.no_cuda else 0
model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8))
model.load_state_dict(torch.load("runs/last.pth")["model"])
{move}
"""

_TYPE_TESTS = {
    # the type of `gpu` is the --no-cuda switch itself
    "decides": "if isinstance(gpu, int):\n    model.cuda(gpu)",
    # the model is never a DataParallel: the move never runs
    "never-runs": "if isinstance(model, nn.DataParallel):\n    model.module.cuda()",
    # the else of a type test is the other branch, not code that always runs
    "else-branch": "if isinstance(gpu, type(None)):\n    pass\nelse:\n    model.cuda(gpu)",
}


@pytest.mark.parametrize("case", sorted(_TYPE_TESTS))
def test_st004_a_type_test_can_still_be_the_cpu_path(tmp_path: Path, case: str) -> None:
    prune = _PRUNE.format(move=_TYPE_TESTS[case])
    load = _line_of(prune, "torch.load")
    files = {"train.py": _TRAIN, "model.py": _PLAIN_NET, "prune.py": prune}
    assert _project(tmp_path, files, "prune.py", ["ST004"]) == [load]


# -- ST004: signs of a device per process that are not ----------------------------------------

_PER_NODE = """
import torch
import torch.distributed as dist
import torch.nn as nn

dist.init_process_group("nccl")
model = nn.Linear(3, 3)
model.cuda()
model = nn.parallel.DistributedDataParallel(model)
state = torch.load("runs/last.pth")
"""


@pytest.mark.parametrize(
    "extra",
    [
        "query = torch.zeros(3).to(reranker_device)\n",
        "aux = nn.DataParallel(nn.Linear(3, 3), device_ids=[0, 1])\n",
    ],
)
def test_st004_one_process_per_node_with_unrelated_signals(tmp_path: Path, extra: str) -> None:
    files = {"train.py": _TRAIN, "model.py": _PLAIN_NET, "eval.py": _PER_NODE + extra}
    assert _project(tmp_path, files, "eval.py", ["ST004"]) == []


# -- ST011: the "bare side" of an unwrap -------------------------------------------------------

_SAVE = """
import torch
import torch.nn as nn

def train(model, path, n_gpu, args):
    if n_gpu > 1:
        model = nn.DataParallel(model)
    state = {expr}
    torch.save(state, path)
"""


@pytest.mark.parametrize(
    "expr",
    [
        # inverted: the wrapped model saves its own prefixed keys
        'model.state_dict() if hasattr(model, "module") else model.module.state_dict()',
        # a test unrelated to the wrap: wrapped and not args.ema saves prefixed keys
        "model.module.state_dict() if args.ema else model.state_dict()",
    ],
)
def test_st011_the_bare_side_counts_only_under_a_test_of_the_wrap(expr: str) -> None:
    source = textwrap.dedent(_SAVE.format(expr=expr))
    found = [d for d in check_source(source, "t.py", select=["ST011"]) if d.code == "ST011"]
    assert found != []


# -- ST006: names bound from .data and whole unpickled models ----------------------------------

_HEADER = """\
import time
import torch

net = torch.nn.Linear(8, 8).cuda()
crit = torch.nn.MSELoss()
"""

_DATA_BODIES = {
    # the .data name is rebound to the model's output: [0] is its first row, no host read
    "rebound": """
def bench(x, y):
    loss = crit(net(x), y).data
    tic = time.time()
    loss = net(x)
    first = loss[0]
    print("took", time.time() - tic)
    return first
""",
    # the input's .data flows into the output through the model call
    "through-the-model": """
def bench(batch):
    x = batch.data
    tic = time.time()
    out = net(x)
    first = out[0]
    print("took", time.time() - tic)
    return first
""",
    # a dataset's .data (a CPU tensor) is no loss read back
    "dataset": """
def bench(train_set):
    images = train_set.data
    tic = time.time()
    out = net(images.cuda(non_blocking=True))
    first = images[0]
    print("took", time.time() - tic)
    return out, first
""",
}


@pytest.mark.parametrize("case", sorted(_DATA_BODIES))
def test_st006_index_of_a_name_not_holding_a_data_loss_is_no_sync(case: str) -> None:
    body = _DATA_BODIES[case]
    src = _HEADER + body
    printed = _line_of(src, 'print("took"')
    found = [d.line for d in check_source(src, "m.py", select=["ST006"]) if d.code == "ST006"]
    assert found == [printed]


_LOSSES = """
import torch


class BoxLoss(torch.nn.Module):
    def forward(self, pred, target):
        positive = target > 0
        return pred[positive].sum()
"""

_SMALL = """
import time
import torch


class Small(torch.nn.Module):
    def forward(self, x):
        return x * 2


model = torch.load("small_weights.pt")
model = Small().cuda()


def infer(image):
    tic = time.time()
    out = model(image)
    print("took", time.time() - tic)
    return out
"""


def test_st006_a_rebound_name_is_not_an_unpickled_model(tmp_path: Path) -> None:
    files = {"losses.py": _LOSSES, "demo.py": _SMALL}
    printed = _line_of(_SMALL, 'print("took"')
    assert _project(tmp_path, files, "demo.py", ["ST006"]) == [printed]


def test_st006_only_a_loss_class_reads_back(tmp_path: Path) -> None:
    demo = _SMALL.replace(
        'model = torch.load("small_weights.pt")\nmodel = Small().cuda()',
        'model = torch.load("resnet.pt").cuda()',
    )
    files = {"losses.py": _LOSSES, "demo.py": demo}
    printed = _line_of(demo, 'print("took"')
    assert _project(tmp_path, files, "demo.py", ["ST006"]) == [printed]


# -- ST012: a key checker whose own keys mention another argument ------------------------------


def test_st012_a_filtered_reference_of_the_models_keys_is_still_a_key_check() -> None:
    source = """
    import torch

    def check_keys(net, weights, skip):
        own = {k for k in net.state_dict() if not k.endswith(skip)}
        missing = own - set(weights)
        assert not missing, missing

    def load(model, sd):
        check_keys(model, sd, "num_batches_tracked")
        model.load_state_dict(sd, strict=False)
    """
    found = check_source(textwrap.dedent(source), "k.py", select=["ST012"])
    assert [d.code for d in found] == []
