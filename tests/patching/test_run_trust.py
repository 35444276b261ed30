"""``safetorch run`` turns the project trust rule on for the script's own files.

A script's whole-model pickles (``torch.save(model)`` in ``train.py``, ``torch.load`` in
``generate.py`` without importing the model module), a tutorial's reload of a class defined in
the script, and numpy arrays load under ``safetorch run``, where plain ``python`` on torch >= 2.6
refuses them; a model class from outside the script's directory stays refused unless
``SAFETORCH_TRUST_ROOT`` widens the root; an empty value switches the rule off, and then
``--allow`` with the names a refusal lists loads a numpy array.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Dict, Iterator

import pytest

from safetorch import _compat
from safetorch.patching import allow, runner

SAFETORCH = [sys.executable, "-m", "safetorch"]

FILES = {
    "model.py": """
        import torch
        from torch import nn


        class RNNModel(nn.Module):
            def __init__(self, ntoken=10, ninp=4):
                super().__init__()
                self.drop = nn.Dropout(0.0)
                self.encoder = nn.Embedding(ntoken, ninp)
                self.rnn = nn.LSTM(ninp, ninp, 2)
                self.decoder = nn.Linear(ninp, ntoken)

            def forward(self, x):
                out, _ = self.rnn(self.drop(self.encoder(x)))
                return self.decoder(out)
        """,
    "train.py": """
        import torch
        import model

        torch.manual_seed(0)
        net = model.RNNModel()
        with open("model.pt", "wb") as f:
            torch.save(net, f)
        torch.save(net(torch.arange(6).view(3, 2)), "expected.pt")
        print("saved")
        """,
    "generate.py": """
        import sys
        import torch

        with open("model.pt", "rb") as f:
            net = torch.load(f, map_location="cpu")
        out = net(torch.arange(6).view(3, 2))
        print(type(net).__name__, torch.equal(out, torch.load("expected.pt")),
              "model" in sys.modules)
        """,
    "tutorial.py": """
        import numpy as np
        import torch
        from torch import nn


        class TheModelClass(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(2, 2)


        torch.save(TheModelClass(), "tutorial.pt")
        torch.save({"x": np.linspace(0, 1, 5), "seed": np.int64(3)}, "data.pt")
        model = torch.load("tutorial.pt")
        data = torch.load("data.pt")
        print(type(model).__name__, data["x"].tolist(), int(data["seed"]))
        """,
    "lib/shared_model.py": """
        from torch import nn


        class Shared(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(1, 1)
        """,
    "scripts/use_shared.py": """
        import os, sys
        import torch
        sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
        import shared_model

        torch.save(shared_model.Shared(), "shared.pt")
        print(type(torch.load("shared.pt")).__name__)
        """,
    "numpy_data.py": """
        import numpy as np
        import torch

        torch.save(np.arange(4.0), "arr.pt")
        print(torch.load("arr.pt").tolist())
        """,
}


def _numpy_has_dtypes() -> bool:
    """numpy >= 1.25: its dtype classes have names an allow= string can import."""
    try:
        import numpy
    except ImportError:
        return False
    return hasattr(numpy, "dtypes")


def _env(**extra: str) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAFETORCH_")}
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def proj(tmp_path_factory) -> Path:
    pytest.importorskip("numpy")
    root = tmp_path_factory.mktemp("proj")
    for name, text in FILES.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


def _run(proj: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        list(args), cwd=proj, env=_env(**env), capture_output=True, text=True, timeout=240
    )


@pytest.fixture(scope="module")
def runs(proj) -> Dict[str, subprocess.CompletedProcess]:
    out = {"train": _run(proj, *SAFETORCH, "run", "train.py")}
    out["generate"] = _run(proj, *SAFETORCH, "run", "generate.py")
    out["generate_python"] = _run(proj, sys.executable, "generate.py")
    out["generate_off"] = _run(
        proj, *SAFETORCH, "run", "--no-report", "generate.py", SAFETORCH_TRUST_ROOT=""
    )
    out["tutorial"] = _run(proj, *SAFETORCH, "run", "tutorial.py")
    out["shared"] = _run(proj, *SAFETORCH, "run", "--no-report", "scripts/use_shared.py")
    out["shared_widened"] = _run(
        proj, *SAFETORCH, "run", "--no-report", "scripts/use_shared.py",
        SAFETORCH_TRUST_ROOT=str(proj),
    )  # fmt: skip
    return out


def test_generate_loads_what_train_saved(runs) -> None:
    train, gen = runs["train"], runs["generate"]
    assert train.returncode == 0 and train.stdout.strip() == "saved", train.stderr
    assert gen.returncode == 0, gen.stderr
    # the model module was imported by the load itself (generate.py never imports it)
    assert gen.stdout.split() == ["RNNModel", "True", "True"]
    assert "whole-model pickle loaded by the project trust rule" in gen.stderr
    assert "model.RNNModel" in gen.stderr and "torch.nn.modules.rnn.LSTM" in gen.stderr


@pytest.mark.skipif(
    not _compat.LOAD_WEIGHTS_ONLY_DEFAULT_TRUE, reason="torch < 2.6 unpickles fully by default"
)
def test_plain_python_refuses_the_same_file(runs) -> None:
    plain = runs["generate_python"]
    assert plain.returncode == 1 and "Weights only load failed" in plain.stderr


def test_an_empty_trust_root_switches_the_rule_off(runs) -> None:
    off = runs["generate_off"]
    assert off.returncode == 1
    assert "UnsafeCheckpointError" in off.stderr and "model.RNNModel" in off.stderr
    assert "trust_root=" in off.stderr  # the refusal names the way in


def test_tutorial_reload_and_numpy_arrays(runs) -> None:
    tut = runs["tutorial"]
    assert tut.returncode == 0, tut.stderr
    assert tut.stdout.split() == ["TheModelClass", "[0.0,", "0.25,", "0.5,", "0.75,", "1.0]", "3"]
    assert "__main__.TheModelClass" in tut.stderr


def test_a_class_outside_the_scripts_directory_needs_a_wider_root(runs) -> None:
    shared, widened = runs["shared"], runs["shared_widened"]
    assert shared.returncode == 1 and "shared_model.Shared" in shared.stderr
    assert "outside the trusted root" in shared.stderr
    assert widened.returncode == 0 and widened.stdout.strip() == "Shared", widened.stderr


@pytest.mark.skipif(
    not _numpy_has_dtypes(),
    reason="needs numpy 1.25+ (numpy.dtypes: importable names for the allow= strings)",
)
def test_allow_with_the_refused_names_loads_a_numpy_array(proj) -> None:
    """The names a refusal lists are enough for --allow (torch's safe_globals also needs
    numpy.dtypes.Float64DType)."""
    off = _run(proj, *SAFETORCH, "run", "--no-report", "numpy_data.py", SAFETORCH_TRUST_ROOT="")
    assert off.returncode == 1 and "numpy.ndarray" in off.stderr
    import numpy

    core = "numpy._core" if int(numpy.__version__.split(".")[0]) >= 2 else "numpy.core"
    names = f"{core}.multiarray._reconstruct,numpy.ndarray,numpy.dtype"  # as numpy pickles it
    allowed = _run(
        proj, *SAFETORCH, "run", "--no-report", "--allow", names, "numpy_data.py",
        SAFETORCH_TRUST_ROOT="",
    )  # fmt: skip
    assert allowed.returncode == 0 and allowed.stdout.strip() == "[0.0, 1.0, 2.0, 3.0]", (
        allowed.stderr
    )


# --- the root and the variable, in process ----------------------------------------------------
def test_trust_root_for_a_script_a_directory_and_a_module(tmp_path, monkeypatch) -> None:
    script = tmp_path / "sub" / "train.py"
    script.parent.mkdir()
    script.write_text("")
    link = tmp_path / "link.py"
    link.symlink_to(script)
    assert runner.trust_root_for(str(script)) == str(script.parent.resolve())
    assert runner.trust_root_for(str(link)) == str(script.parent.resolve())  # the real file's
    assert runner.trust_root_for(str(tmp_path)) == str(tmp_path.resolve())
    monkeypatch.chdir(tmp_path)
    assert runner.trust_root_for("pkg.tool", module=True) == os.getcwd()


@pytest.fixture
def clean_env(monkeypatch) -> Iterator[None]:
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setitem(sys.modules, "__main__", sys.modules["__main__"])
    for name in ("SAFETORCH_PATCH", allow.TRUST_ENV):
        monkeypatch.setenv(name, "")  # records the value, so monkeypatch restores it
        monkeypatch.delenv(name)
    yield


def test_run_sets_the_variable_unless_already_set(tmp_path, clean_env, monkeypatch) -> None:
    script = tmp_path / "probe.py"
    script.write_text(
        "import os\nfrom safetorch.patching import allow\n"
        "print(os.environ.get('SAFETORCH_TRUST_ROOT'), allow.trust_root())\n"
    )
    assert runner.run(str(script), [], report=False, patches=["load"]) == 0
    assert os.environ[allow.TRUST_ENV] == str(tmp_path.resolve())
    assert allow.trust_root() == str(tmp_path.resolve())
    monkeypatch.setenv(allow.TRUST_ENV, "")  # the user's own value (off) wins
    assert runner.run(str(script), [], report=False, patches=["load"]) == 0
    assert os.environ[allow.TRUST_ENV] == "" and allow.trust_root() is None
    monkeypatch.delenv(allow.TRUST_ENV)
    assert runner.run(str(script), [], report=False, patches=["load"], trust=False) == 0
    assert allow.TRUST_ENV not in os.environ


def test_trust_root_ignores_a_missing_directory(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(allow.TRUST_ENV, str(tmp_path / "gone"))
    assert allow.trust_root() is None
    monkeypatch.setenv(allow.TRUST_ENV, str(tmp_path))
    assert allow.trust_root() == str(tmp_path)
