"""_compat: flags resolved once, overridable to simulate older torch; doctor reports them."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest
import torch

from safetorch import _compat, _device


def test_flags_match_features_of_installed_torch() -> None:
    import inspect

    assert _compat.LOAD_HAS_MMAP == ("mmap" in inspect.signature(torch.load).parameters)
    assert _compat.HAS_COMPILE == hasattr(torch, "compile")
    names = [f.name for f in _compat.flags()]
    assert len(names) == len(set(names))
    for f in _compat.flags():
        assert f.since and f.detected_by


def test_override_sets_and_restores_and_rebinds() -> None:
    calls = []
    _compat.register_binder(lambda: calls.append(_compat.HAS_ACCELERATOR))
    before = _compat.HAS_ACCELERATOR
    with _compat.override(HAS_ACCELERATOR=not before):
        assert _compat.HAS_ACCELERATOR is (not before)
        # the accelerator probe was re-selected for the simulated torch
        expected = (
            _device._accelerator_available_old if before else _device._accelerator_available_new
        )
        assert _device._accelerator_impl is expected
    assert _compat.HAS_ACCELERATOR is before
    assert calls[-3:] == [before, not before, before]
    _compat._binders.pop()


def test_override_rejects_unknown_flags() -> None:
    with pytest.raises(KeyError, match="unknown _compat flag"):
        with _compat.override(NOT_A_FLAG=True):
            pass


def test_accelerator_available_both_branches_agree_on_cpu(simulate_torch: Any) -> None:
    import safetorch as st

    now = st.accelerator_available()
    with simulate_torch(HAS_ACCELERATOR=False):
        assert st.accelerator_available() == torch.cuda.is_available()
    assert now == st.accelerator_available()


@pytest.mark.parametrize(
    "argv",
    [["-m", "safetorch"], ["-c", "from safetorch._cli import main; raise SystemExit(main())"]],
)
def test_doctor_json(argv: Any) -> None:
    out = subprocess.run(
        [sys.executable, *argv, "doctor", "--json"], capture_output=True, text=True, check=True
    )
    report = json.loads(out.stdout)
    assert report["versions"]["torch"] == torch.__version__
    assert {f["name"] for f in report["flags"]} == {f.name for f in _compat.flags()}
    decisions = {d["decision"]: d for d in report["decisions"]}
    assert decisions["index on cpu"]["path"] == "torch directly"
    assert decisions["index on cuda"]["path"] == "pre-check, then torch"
    assert "device-side assert" in decisions["index on cuda"]["why"]


def test_doctor_text_and_no_command() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "safetorch", "doctor"], capture_output=True, text=True, check=True
    )
    assert "LOAD_HAS_MMAP" in out.stdout and "dispatch decisions" in out.stdout
    bare = subprocess.run([sys.executable, "-m", "safetorch"], capture_output=True, text=True)
    assert bare.returncode == 2 and "usage" in bare.stderr
