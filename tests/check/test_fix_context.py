"""Fixes checked against the code around them (issue 23.3): the crash cases, re-created."""

from __future__ import annotations

import pickle
import textwrap
import warnings
from pathlib import Path
from typing import Any, Dict

import numpy as np
import pytest
import torch

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
    (diag,) = [d for d in check_source(ZEROED) if d.code == "ST008"]
    assert diag.fix is None and "if m.bias is not None" in diag.message
    assert fix_source(ZEROED, unsafe_fixes=True) == ZEROED
    run(ZEROED)


def test_bias_false_is_applied_where_the_init_code_checks_for_it() -> None:
    source = (Path(__file__).parent / "fixtures" / "bias_guarded.in.py").read_text()
    fixed = fix_source(source + "\nmodel = Net()\n", unsafe_fixes=True)
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
    elif isinstance(payload, dict):
        save = "acc = np.float64(0.5)\ntorch.save({'acc': acc}, path)\n"
    else:
        save = "obj = np.zeros(3)\ntorch.save(obj, path)\n"
    source = (
        "import numpy as np\nimport torch\nimport torch.nn as nn\n"
        + save
        + "loaded = torch.load(path, map_location='cpu')\n"
    )
    (diag,) = [d for d in check_source(source) if d.code == "ST003"]
    assert "evidently holds" in diag.message
    # the fix is the st.load form of the project trust rule, never weights_only=True
    assert diag.fix is not None and not diag.fix.safe
    fixed = fix_source(source, unsafe_fixes=True)
    assert "weights_only=True" not in fixed and "trust_root=" in fixed and "st.load(" in fixed
    assert fix_source(source) == source  # nothing without --unsafe-fixes
