"""``safetorch run`` trusts a script's own saves by provenance, and nothing by inspection.

A script's whole-model pickles (``torch.save(model)`` in ``train.py``, ``torch.load`` in
``generate.py`` without importing the model module), a tutorial's reload of a class defined in
the script, and numpy arrays load under ``safetorch run`` because the patched ``torch.save``
recorded their hashes, where plain ``python`` on torch >= 2.6 refuses them. A file written
without safetorch is refused, whatever classes it names, until ``safetorch trust FILE`` or
``safetorch run --trust FILE``; ``--allow`` with the names a refusal lists loads a numpy array.
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
from safetorch.patching import _runner

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
def runs(proj, tmp_path_factory) -> Dict[str, subprocess.CompletedProcess]:
    state = str(tmp_path_factory.mktemp("state"))  # this module's own trust ledger
    out = {"train": _run(proj, *SAFETORCH, "run", "train.py", XDG_STATE_HOME=state)}
    out["generate"] = _run(proj, *SAFETORCH, "run", "generate.py", XDG_STATE_HOME=state)
    out["generate_python"] = _run(proj, sys.executable, "generate.py", XDG_STATE_HOME=state)
    out["tutorial"] = _run(proj, *SAFETORCH, "run", "tutorial.py", XDG_STATE_HOME=state)
    out["shared"] = _run(
        proj, *SAFETORCH, "run", "--no-report", "scripts/use_shared.py", XDG_STATE_HOME=state
    )
    # model.pt again, written by plain python: a file from elsewhere
    other = str(tmp_path_factory.mktemp("other-state"))
    out["train_python"] = _run(proj, sys.executable, "train.py", XDG_STATE_HOME=other)
    out["generate_untrusted"] = _run(
        proj, *SAFETORCH, "run", "--no-report", "generate.py", XDG_STATE_HOME=other
    )
    out["generate_run_trust"] = _run(
        proj, *SAFETORCH, "run", "--trust", "model.pt", "generate.py", XDG_STATE_HOME=other
    )
    out["generate_after_run_trust"] = _run(
        proj, *SAFETORCH, "run", "--no-report", "generate.py", XDG_STATE_HOME=other
    )
    out["trust"] = _run(proj, *SAFETORCH, "trust", "--yes", "model.pt", XDG_STATE_HOME=other)
    out["generate_trusted"] = _run(
        proj, *SAFETORCH, "run", "--no-report", "generate.py", XDG_STATE_HOME=other
    )
    return out


def test_generate_loads_what_train_saved(runs) -> None:
    train, gen = runs["train"], runs["generate"]
    assert train.returncode == 0 and train.stdout.strip() == "saved", train.stderr
    assert "recorded as trusted" in train.stderr  # the report says what torch.save did
    assert gen.returncode == 0, gen.stderr
    # the model module was imported by the full load itself (generate.py never imports it)
    assert gen.stdout.split() == ["RNNModel", "True", "True"]
    assert "file trusted by provenance loaded fully" in gen.stderr


@pytest.mark.skipif(
    not _compat.LOAD_WEIGHTS_ONLY_DEFAULT_TRUE, reason="torch < 2.6 unpickles fully by default"
)
def test_plain_python_refuses_the_same_file(runs) -> None:
    plain = runs["generate_python"]
    assert plain.returncode == 1 and "Weights only load failed" in plain.stderr


def test_a_file_from_elsewhere_is_refused_with_the_way_to_trust_it(runs) -> None:
    assert runs["train_python"].returncode == 0, runs["train_python"].stderr
    off = runs["generate_untrusted"]
    assert off.returncode == 1
    assert "UnsafeCheckpointError" in off.stderr and "model.RNNModel" in off.stderr
    assert "safetorch trust" in off.stderr and "--trust" in off.stderr
    assert "trust_root" not in off.stderr


def test_run_trust_is_for_one_run_and_trust_lasts(runs) -> None:
    once = runs["generate_run_trust"]
    assert once.returncode == 0 and once.stdout.split()[0] == "RNNModel", once.stderr
    assert "this run" in once.stderr
    assert runs["generate_after_run_trust"].returncode == 1  # nothing was written down
    trust = runs["trust"]
    assert trust.returncode == 0 and "model.RNNModel" in trust.stdout, trust.stderr
    later = runs["generate_trusted"]
    assert later.returncode == 0 and later.stdout.split()[0] == "RNNModel", later.stderr


def test_tutorial_reload_and_numpy_arrays(runs) -> None:
    tut = runs["tutorial"]
    assert tut.returncode == 0, tut.stderr
    assert tut.stdout.split() == ["TheModelClass", "[0.0,", "0.25,", "0.5,", "0.75,", "1.0]", "3"]


def test_a_class_outside_the_scripts_directory_loads_when_the_run_saved_it(runs) -> None:
    """Where a class is defined decides nothing: who wrote the file does."""
    shared = runs["shared"]
    assert shared.returncode == 0 and shared.stdout.strip() == "Shared", shared.stderr


def test_run_trust_of_a_missing_file_is_a_usage_error(proj) -> None:
    out = _run(proj, *SAFETORCH, "run", "--trust", "nope.pt", "generate.py")
    assert out.returncode == 2 and "nope.pt" in out.stderr and "does not exist" in out.stderr


@pytest.mark.skipif(
    not _numpy_has_dtypes(),
    reason="needs numpy 1.25+ (numpy.dtypes: importable names for the allow= strings)",
)
def test_allow_with_the_refused_names_loads_a_numpy_array(proj, tmp_path) -> None:
    """The names a refusal lists are enough for --allow (torch's safe_globals also needs
    numpy.dtypes.Float64DType). The file is written by plain python: not trusted."""
    state = str(tmp_path)
    saved = _run(
        proj,
        sys.executable,
        "-c",
        "import numpy as np, torch; torch.save(np.arange(4.0), 'arr2.pt')",
        XDG_STATE_HOME=state,
    )
    assert saved.returncode == 0, saved.stderr
    script = "import torch; print(torch.load('arr2.pt').tolist())"
    (proj / "load_arr2.py").write_text(script)
    off = _run(proj, *SAFETORCH, "run", "--no-report", "load_arr2.py", XDG_STATE_HOME=state)
    assert off.returncode == 1 and "numpy.ndarray" in off.stderr
    import numpy

    core = "numpy._core" if int(numpy.__version__.split(".")[0]) >= 2 else "numpy.core"
    names = f"{core}.multiarray._reconstruct,numpy.ndarray,numpy.dtype"  # as numpy pickles it
    allowed = _run(
        proj, *SAFETORCH, "run", "--no-report", "--allow", names, "load_arr2.py",
        XDG_STATE_HOME=state,
    )  # fmt: skip
    assert allowed.returncode == 0 and allowed.stdout.strip() == "[0.0, 1.0, 2.0, 3.0]", (
        allowed.stderr
    )


@pytest.fixture
def clean_env(monkeypatch) -> Iterator[None]:
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setitem(sys.modules, "__main__", sys.modules["__main__"])
    for name in ("SAFETORCH_PATCH", "SAFETORCH_TRUST"):
        monkeypatch.setenv(name, "")  # records the value, so monkeypatch restores it
        monkeypatch.delenv(name)
    yield


def test_run_trust_sets_only_hashes_in_the_environment(tmp_path, clean_env) -> None:
    ckpt = tmp_path / "m.pt"
    torch_save = __import__("torch").save
    torch_save({"w": __import__("torch").ones(1)}, ckpt)
    script = tmp_path / "probe.py"
    script.write_text("import os\nprint(os.environ.get('SAFETORCH_TRUST'))\n")
    assert _runner.run(str(script), [], report=False, patches=["load"], trust=[str(ckpt)]) == 0
    value = os.environ["SAFETORCH_TRUST"]
    size, _, digest = value.partition(":")
    assert int(size) == ckpt.stat().st_size and len(digest) == 64 and str(tmp_path) not in value
