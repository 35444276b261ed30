"""The patched ``torch.save`` is ``st.save``: torch's contract, and provenance for what a
weights-only load would refuse."""

from __future__ import annotations

import io
import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any, List

import pytest
import torch

import safetorch as st
from safetorch.checkpoint import _provenance
from safetorch.patching import _registry


def _ledger() -> List[Path]:
    root = Path(_provenance.state_dir())
    return sorted(p for p in root.rglob("*") if p.is_file()) if root.exists() else []


def _kinds() -> List[str]:
    return [e.kind for e in _registry.report_entries() if e.patch == "load"]


def test_patched_save_then_load_of_a_whole_model_runs_unedited(tmp_path: Path) -> None:
    path = tmp_path / "model.pt"
    with st.patched("load"):
        assert torch.save(torch.nn.Linear(2, 2), path) is None
        loaded = torch.load(path)
    assert isinstance(loaded, torch.nn.Linear)
    kinds = _kinds()
    assert any("recorded as trusted" in k for k in kinds)
    assert "file trusted by provenance loaded fully" in kinds
    with pytest.raises(pickle.UnpicklingError):  # torch alone still refuses the bytes
        torch.load(path, weights_only=True)


def test_patched_save_of_a_state_dict_writes_torchs_bytes_and_records_nothing(
    tmp_path: Path,
) -> None:
    sd = {"w": torch.arange(4.0)}
    with st.patched("load"):
        buf = io.BytesIO()
        torch.save(sd, buf)
    plain = io.BytesIO()
    torch.save(sd, plain)
    assert buf.getvalue() == plain.getvalue() and _ledger() == []
    assert not any("recorded" in k for k in _kinds())


def test_patched_save_keeps_torchs_arguments(tmp_path: Path) -> None:
    path = tmp_path / "legacy.pt"
    with st.patched("load"):
        torch.save({"w": torch.ones(2)}, path, pickle, 2, _use_new_zipfile_serialization=False)
        torch.save({"w": torch.ones(2)}, f=str(tmp_path / "kw.pt"), pickle_protocol=4)
        with pytest.raises(TypeError):
            torch.save()  # torch's own error for a bad call
    assert torch.equal(torch.load(path, weights_only=True)["w"], torch.ones(2))
    assert torch.equal(st.load(tmp_path / "kw.pt")["w"], torch.ones(2))


# Each bad call in its own process: torch 1.13 aborts the interpreter (pybind11's
# error_already_set escapes a destructor) on a file argument that is not a file, where newer
# torch raises AttributeError; the patched save must do what torch does either way.
_BAD_SAVE = """
import contextlib, sys
from pathlib import Path
import torch
import safetorch as st
tmp, case, patched = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
cases = [
    lambda: torch.save({"w": torch.ones(1)}, tmp / "missing-dir" / "x.pt"),
    lambda: torch.save(lambda: 0, tmp / "lambda.pt"),
    lambda: torch.save({"w": torch.ones(1)}, 42),
]
with st.patched("load") if patched else contextlib.nullcontext():
    try:
        cases[case]()
    except Exception as exc:  # what torch raises, whatever it is
        print(type(exc).__name__)
    else:
        print("no error")
"""


@pytest.mark.parametrize("case", [0, 1, 2], ids=["missing-dir", "lambda", "not-a-file"])
def test_patched_save_errors_are_torchs(tmp_path: Path, case: int) -> None:
    def outcome(patched: bool) -> str:
        args = [sys.executable, "-c", _BAD_SAVE, str(tmp_path), str(case), str(int(patched))]
        proc = subprocess.run(args, capture_output=True, text=True, timeout=120)
        if proc.returncode < 0:
            return f"killed by signal {-proc.returncode}"
        assert proc.returncode == 0, proc.stderr[-2000:]
        return proc.stdout.strip().splitlines()[-1]

    plain = outcome(False)
    assert plain != "no error"
    assert outcome(True) == plain


def test_unpatching_restores_torch_save() -> None:
    original = torch.save
    with st.patched("load"):
        assert torch.save is not original
    assert torch.save is original


def test_explicit_weights_only_true_under_the_patch_stays_strict(tmp_path: Path) -> None:
    path = tmp_path / "model.pt"
    with st.patched("load"):
        torch.save(torch.nn.Linear(2, 2), path)
        with pytest.raises(pickle.UnpicklingError):
            torch.load(path, weights_only=True)


def test_a_malicious_file_is_refused_under_the_patch(tmp_path: Path, monkeypatch: Any) -> None:
    calls: List[Any] = []

    class Evil:
        def __reduce__(self) -> Any:
            return (os.system, ("true",))

    path = tmp_path / "evil.pt"
    torch.save({"x": Evil()}, path)  # plain torch: nothing recorded
    monkeypatch.setattr(os, "system", lambda *a: calls.append(a))
    with st.patched("load"):
        with pytest.raises(pickle.UnpicklingError, match="safetorch trust"):
            torch.load(path)
    assert calls == []
