"""Fixes checked against the code around them (issue 23.3): the crash cases, re-created."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path
from typing import Any, Dict

import numpy as np
import pytest
import torch

from safetorch._compat import LOAD_WEIGHTS_ONLY_DEFAULT_TRUE
from safetorch.check import check_source, fix_source

ZEROED = textwrap.dedent(
    """
    import torch.nn as nn

    class Zeroed(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU())
            for m in self.modules():
                if isinstance(m, nn.Conv2d):
                    m.bias.data.zero_()

    model = Zeroed()
    """
)


def run(source: str, **env: Any) -> Dict[str, Any]:
    namespace: Dict[str, Any] = dict(env)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exec(compile(source, "<snippet>", "exec"), namespace)
    return namespace


def test_bias_false_is_not_offered_where_init_code_would_crash() -> None:
    naive = ZEROED.replace("nn.Conv2d(3, 8, 3)", "nn.Conv2d(3, 8, 3, bias=False)")
    with pytest.raises(AttributeError):  # what the old fix produced
        run(naive)
    (diag,) = [d for d in check_source(ZEROED, select=["ST008"]) if d.code == "ST008"]
    assert diag.fix is None and "if m.bias is not None" in diag.message
    assert fix_source(ZEROED, select=["ST008"], unsafe_fixes=True) == ZEROED
    run(ZEROED)


def test_bias_false_is_applied_where_the_init_code_checks_for_it() -> None:
    source = (Path(__file__).parent / "fixtures" / "bias_guarded.in.py").read_text()
    fixed = fix_source(source + "\nmodel = Net()\n", select=["ST008"], unsafe_fixes=True)
    model = run(fixed)["model"]
    convs = [m for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    assert convs and all(m.bias is None for m in convs)


@pytest.mark.parametrize(
    "payload",
    [torch.nn.Linear(2, 2), np.zeros(3), {"acc": np.float64(0.5), "w": torch.zeros(2)}],
    ids=["module", "numpy", "numpy-scalars"],
)
def test_weights_only_is_not_offered_for_payloads_it_refuses(tmp_path: Path, payload: Any) -> None:
    path = tmp_path / "x.pt"
    torch.save(payload, path)
    with pytest.raises(pickle.UnpicklingError):  # what the old fix would have made the load do
        torch.load(path, weights_only=True)
    if isinstance(payload, torch.nn.Module):
        save = "obj = nn.Linear(2, 2)\ntorch.save(obj, path)\nobj.eval()\n"
        check = "assert isinstance(loaded, nn.Linear), loaded\n"
    elif isinstance(payload, dict):
        save = "acc = np.float64(0.5)\ntorch.save({'acc': acc}, path)\n"
        check = "assert loaded == {'acc': 0.5} and isinstance(loaded['acc'], np.float64)\n"
    else:
        save = "obj = np.zeros(3)\ntorch.save(obj, path)\n"
        check = "assert isinstance(loaded, np.ndarray) and loaded.shape == (3,)\n"
    source = (
        "import sys\nimport numpy as np\nimport torch\nimport torch.nn as nn\n"
        + "path = sys.argv[1]\n"
        + save
        + "loaded = torch.load(path, map_location='cpu')\n"
        + check
        + "print('loaded', type(loaded).__name__)\n"
    )
    (diag,) = [d for d in check_source(source) if d.code == "ST003"]
    assert "evidently holds" in diag.message
    assert "st.save" in diag.message and "safetorch trust FILE" in diag.message
    # never weights_only=True (it refuses the file): the save in this file becomes st.save,
    # which records the file, and the load st.load, which then loads it fully
    assert diag.fix is not None and not diag.fix.safe
    assert "safetorch trust FILE" in diag.fix.message
    fixed = fix_source(source, unsafe_fixes=True)
    assert "weights_only=True" not in fixed
    assert "import safetorch as st\n" in fixed
    assert "st.save(" in fixed and "torch.save(" not in fixed
    assert "st.load(path, map_location='cpu')" in fixed
    assert fix_source(source) == source  # nothing without --unsafe-fixes
    assert fix_source(fixed, unsafe_fixes=True) == fixed
    assert [d.code for d in check_source(fixed) if d.code == "ST003"] == []

    def execute(text: str, name: str) -> "subprocess.CompletedProcess[str]":
        script = tmp_path / name
        script.write_text(text)
        # the child inherits XDG_STATE_HOME: this test's own ledger (conftest.py)
        env = {k: v for k, v in os.environ.items() if not k.startswith("SAFETORCH_")}
        env["PYTHONWARNINGS"] = "ignore"
        target = str(tmp_path / f"{name}.pt")
        return subprocess.run(
            [sys.executable, str(script), target], env=env, capture_output=True, text=True
        )

    if LOAD_WEIGHTS_ONLY_DEFAULT_TRUE:
        original = execute(source, "original.py")
        assert original.returncode != 0 and "Weights only load failed" in original.stderr
    done = execute(fixed, "fixed.py")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("loaded "), done.stdout


def test_saved_load_fix_is_offered_only_where_a_save_here_writes_the_file() -> None:
    head = "import torch\nimport torch.nn as nn\n"
    # only the use says it is a module: no save in this file writes it
    used = head + "m = torch.load('pretrained.pt', map_location='cpu')\nm.eval()\n"
    (diag,) = [d for d in check_source(used) if d.code == "ST003"]
    assert "evidently holds a whole module" in diag.message and diag.fix is None
    # a custom pickle module on either side: st.save does not record the file
    dill = (
        head + "import dill\nnet = nn.Linear(2, 2)\ntorch.save(net, 'n.pt', pickle_module=dill)\n"
    )
    for load in ("torch.load('n.pt')\n", "torch.load('n.pt', pickle_module=dill)\n"):
        (diag,) = [d for d in check_source(dill + load) if d.code == "ST003"]
        assert "evidently holds a whole module" in diag.message and diag.fix is None, load
    star = head + "net = nn.Linear(2, 2)\ntorch.save(net, *where)\ntorch.load(*where)\n"
    assert all(d.fix is None for d in check_source(star) if d.code == "ST003")
    # every save of that path becomes st.save, the weights_only=True goes, the map_location
    # is torch.load's placement (CPU without CUDA) where the load had none
    both = (
        head
        + "import safetorch as st\nnet = nn.Linear(2, 2)\n"
        + "def save(path):\n    torch.save(net, path)\n"
        + "torch.save(net, 'n.pt')\nif net.training:\n    torch.save(net, 'n.pt')\n"
        + "with open('n.pt', 'rb') as f:\n    again = torch.load(f, weights_only=True)\n"
    )
    fixed = fix_source(both, unsafe_fixes=True)
    assert fixed.count("st.save(net, 'n.pt')") == 2 and "    torch.save(net, path)" in fixed
    assert 'again = st.load(f, map_location="available")\n' in fixed
    assert fixed.count("import safetorch as st") == 1
