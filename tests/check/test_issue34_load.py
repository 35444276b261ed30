"""ST003 migrates loads the way PyTorch recommends (issue 34.3): a whole-module pair becomes a
state dict save and load, plain data written by the project's own writers gets ``allow=`` for
exactly those classes, and what cannot be migrated is reported with the reason.

Each test writes a small project into ``tmp_path`` (``setup.py`` marks its root) and runs the
fixed code: the writer, then the fixed load.
"""

from __future__ import annotations

import runpy
from pathlib import Path
from typing import Iterator, List

import pytest
from _check_project import TORCH_LOAD_WARNS, fresh_project, project_findings, write_project

from safetorch.check.engine import Diagnostic
from safetorch.check.runner import check_file

torch = pytest.importorskip("torch")


@pytest.fixture(autouse=True)
def _fresh_projects(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    yield from fresh_project(tmp_path, monkeypatch, ("net",))


_write = write_project


def _findings(root: Path, name: str) -> List[Diagnostic]:
    return project_findings(root, "ST003")[name]


def _fixed(root: Path, name: str) -> str:
    result = check_file(str(root / name), select=["ST003"], fix=True, unsafe_fixes=True)
    assert result.after is not None and result.after != result.before
    return result.after


NET = """
    import torch.nn as nn

    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 2)

        def forward(self, x):
            return self.lin(x)
"""

PAIR = """
    import torch
    from net import Tiny

    model = Tiny()
    torch.nn.init.constant_(model.lin.weight, 0.5)
    torch.save(model, "tiny.pt")
    model = Tiny()
    model = torch.load("tiny.pt")
    out = model(torch.ones(1, 4))
"""


@TORCH_LOAD_WARNS
def test_whole_module_pair_becomes_a_state_dict_save_and_load(tmp_path: Path) -> None:
    _write(tmp_path, {"net.py": NET, "train.py": PAIR})
    (finding,) = _findings(tmp_path, "train.py")
    assert finding.fix is not None and "state_dict" in finding.fix.message
    after = _fixed(tmp_path, "train.py")
    assert 'torch.save(model.state_dict(), "tiny.pt")' in after
    assert 'model.load_state_dict(torch.load("tiny.pt", weights_only=True))' in after
    (tmp_path / "train_fixed.py").write_text(after)
    ran = runpy.run_path(str(tmp_path / "train_fixed.py"))
    assert torch.equal(ran["model"].lin.weight, torch.full((2, 4), 0.5))
    # the file it now writes loads weights-only on every torch
    assert set(torch.load(tmp_path / "tiny.pt", weights_only=True)) == {"lin.weight", "lin.bias"}


def test_no_state_dict_migration_when_another_file_loads_the_module(tmp_path: Path) -> None:
    other = """
        import torch

        model = torch.load("tiny.pt")
        print(model)
    """
    _write(tmp_path, {"net.py": NET, "train.py": PAIR, "show.py": other})
    (finding,) = _findings(tmp_path, "train.py")
    # the other load would get a state dict where it expects the module: unchanged, and why
    assert finding.fix is None
    assert "no automatic fix: another load may read the file (show.py:3)" in finding.message


def test_no_state_dict_migration_without_the_class_built_here(tmp_path: Path) -> None:
    source = """
        import torch

        def save(model):
            torch.save(model, "tiny.pt")

        def restore():
            model = torch.load("tiny.pt")
            return model
    """
    _write(tmp_path, {"train.py": source})
    (finding,) = _findings(tmp_path, "train.py")
    assert finding.fix is None or "state_dict" not in finding.fix.message


NUMPY_WRITER = """
    import numpy as np
    import torch

    stats = {"mean": np.arange(3.0), "count": np.int64(7), "w": torch.ones(2)}
    torch.save(stats, "stats.pt")
"""

NUMPY_READER = """
    import torch

    stats = torch.load("stats.pt")
    total = float(stats["mean"].sum()) + int(stats["count"])
"""


def test_numpy_data_of_a_writer_in_another_file_gets_exactly_numpy_allowed(
    tmp_path: Path,
) -> None:
    _write(tmp_path, {"prepare.py": NUMPY_WRITER, "train.py": NUMPY_READER})
    (finding,) = _findings(tmp_path, "train.py")
    assert finding.fix is not None and "numpy data" in finding.fix.message
    after = _fixed(tmp_path, "train.py")
    assert "st.load(" in after and '"numpy.ndarray"' in after and "import safetorch as st" in after
    runpy.run_path(str(tmp_path / "prepare.py"))
    (tmp_path / "train_fixed.py").write_text(after)
    assert runpy.run_path(str(tmp_path / "train_fixed.py"))["total"] == 10.0


def test_the_allow_list_admits_nothing_but_the_listed_data(tmp_path: Path) -> None:
    import safetorch as st
    from safetorch.check.rules._load_fix import NUMPY_ALLOW
    from safetorch.errors import UnsafeCheckpointError

    torch.save({"m": torch.nn.Linear(1, 1)}, tmp_path / "other.pt")
    with pytest.raises(UnsafeCheckpointError):
        st.load(tmp_path / "other.pt", allow=list(NUMPY_ALLOW))


def test_a_namespace_with_a_path_type_is_not_migrated(tmp_path: Path) -> None:
    writer = """
        import argparse
        import pathlib
        import torch

        parser = argparse.ArgumentParser()
        parser.add_argument("--out", type=pathlib.Path, default="runs")
        args = parser.parse_args([])
        torch.save({"args": args, "w": torch.ones(1)}, "start.pt")
    """
    reader = """
        import torch

        start = torch.load("start.pt")
    """
    _write(tmp_path, {"prepare.py": writer, "train.py": reader})
    (finding,) = _findings(tmp_path, "train.py")
    assert finding.fix is None
    assert "an argparse Namespace" in finding.message


def test_an_object_of_a_class_is_reported_with_the_reason_and_unchanged(tmp_path: Path) -> None:
    writer = """
        import torch

        class Vocab:
            def __init__(self):
                self.words = ["a", "b"]

        torch.save({"vocab": Vocab()}, "vocab.pt")
    """
    reader = """
        import torch

        vocab = torch.load("vocab.pt")
    """
    _write(tmp_path, {"prepare.py": writer, "train.py": reader})
    (finding,) = _findings(tmp_path, "train.py")
    assert finding.fix is None
    assert "no automatic fix: prepare.py:7 may write it with the result of `Vocab(...)`" in (
        finding.message
    )


@TORCH_LOAD_WARNS
def test_a_pair_across_files_is_migrated_on_both_sides(tmp_path: Path) -> None:
    export = """
        import torch
        from net import Tiny

        model = Tiny()
        torch.nn.init.constant_(model.lin.weight, 0.25)
        torch.save(model, "tiny.pt")
    """
    serve = """
        import torch
        from net import Tiny

        model = Tiny()
        model = torch.load("tiny.pt")
        out = model(torch.ones(1, 4))
    """
    _write(tmp_path, {"net.py": NET, "export.py": export, "serve.py": serve})
    findings = project_findings(tmp_path, "ST003")
    (save,) = findings["export.py"]
    (load,) = findings["serve.py"]
    assert save.fix is not None and "serve.py:5" in save.message
    assert load.fix is not None and "load_state_dict" in load.fix.message
    for name in ("export.py", "serve.py"):
        (tmp_path / name).write_text(_fixed(tmp_path, name))
    assert 'torch.save(model.state_dict(), "tiny.pt")' in (tmp_path / "export.py").read_text()
    runpy.run_path(str(tmp_path / "export.py"))
    served = runpy.run_path(str(tmp_path / "serve.py"))
    assert torch.equal(served["model"].lin.weight, torch.full((2, 4), 0.25))


def test_a_pair_across_files_with_an_unbuilt_load_is_left_alone(tmp_path: Path) -> None:
    export = """
        import torch
        from net import Tiny

        model = Tiny()
        torch.save(model, "tiny.pt")
    """
    serve = """
        import torch

        model = torch.load("tiny.pt")
    """
    _write(tmp_path, {"net.py": NET, "export.py": export, "serve.py": serve})
    findings = project_findings(tmp_path, "ST003")
    assert findings["export.py"] == []  # the save is not changed
    (load,) = findings["serve.py"]
    assert load.fix is None
