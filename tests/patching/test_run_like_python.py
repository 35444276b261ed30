"""`safetorch run` behaves like `python`: tracebacks, warnings, options, the report."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any, List, Optional

import pytest
import torch

import safetorch as st
from safetorch.patching import _allow, _report, _runner


def _run(tmp_path: Path, code: str, *options: str, env: Optional[dict] = None) -> Any:
    script = tmp_path / "prog.py"
    script.write_text(code)
    return subprocess.run(
        [sys.executable, "-m", "safetorch", "run", *options, str(script)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), **(env or {})},
        timeout=180,
    )


def test_traceback_has_no_safetorch_frames(tmp_path: Path) -> None:
    code = (
        "import torch\n"
        "m = torch.nn.Linear(2, 2)\n"
        "sd = {'module.weight': torch.zeros(3, 3), 'module.bias': torch.zeros(2)}\n"
        "m.load_state_dict(sd)\n"
    )
    out = _run(tmp_path, code, "--patch", "state_dict")
    assert out.returncode == 1
    tb = out.stderr.split("safetorch run: patches on")[0]
    assert 'prog.py", line 4, in <module>' in tb and "CheckpointMismatchError" in tb
    assert os.sep + "safetorch" + os.sep not in tb and "wrapt" not in tb, tb


def test_repeated_patch_accumulates_and_report_counts_calls(tmp_path: Path) -> None:
    code = (
        "import io, torch\n"
        "b = io.BytesIO(); torch.save({'a': torch.ones(1)}, b); b.seek(0)\n"
        "torch.load(b)\n"
    )
    out = _run(tmp_path, code, "--patch", "load", "--patch", "index")
    assert out.returncode == 0, out.stderr
    assert "patches on: load, index" in out.stderr
    assert "load   1 call changed" in out.stderr


def test_allow_reaches_the_load_patch_through_the_environment(tmp_path: Path) -> None:
    code = (
        "import os\n"
        "from safetorch.patching import _allow\n"
        "print(_allow.allowed_globals(), os.environ['SAFETORCH_ALLOW'])\n"
    )
    out = _run(
        tmp_path, code, "--allow", "a.B", "--allow", "c.D,a.B", env={"SAFETORCH_ALLOW": "x.Y"}
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "('x.Y', 'a.B', 'c.D') x.Y,a.B,c.D"
    assert "allowed globals (--allow / SAFETORCH_ALLOW): x.Y, a.B, c.D" in out.stderr


def test_allowed_globals_parses_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SAFETORCH_ALLOW", " a.B, ,c.D,a.B ")
    assert _allow.allowed_globals() == ("a.B", "c.D")
    monkeypatch.delenv("SAFETORCH_ALLOW")
    assert _allow.allowed_globals() == ()


def test_one_call_with_two_changes_counts_once() -> None:
    _report.reset_counts()
    with _report.counted_call("load"):
        _report.record("load", "change one")
        _report.record("load", "change two")
    _report.record("load", "change one")
    try:
        assert _report.call_count("load") == 2
        text = _runner.format_report(["load"])
        assert "2 calls changed (3 changes)" in text
        assert "2 x change one" in text and "1 x change two" in text
    finally:
        _report.reset_counts()


def test_patch_accepts_lists_and_rejects_non_strings() -> None:
    try:
        assert st.patch(["upsample", "load"]) == ["upsample", "load"]
        assert st.patch(("upsample",), "load") == []
    finally:
        st.unpatch(["upsample", "load"])
    with pytest.raises(TypeError, match="patch names must be str .* got int"):
        st.patch(3)  # type: ignore[arg-type]


def _uint8_lines() -> List[int]:
    x = torch.arange(4)
    mask = torch.tensor([1, 0, 1, 0], dtype=torch.uint8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        for _ in range(3):
            x[mask]  # one line, three calls
        x[mask]  # another line
    return [w.lineno for w in caught if "uint8" in str(w.message)]


def test_torch_warning_inside_patched_index_points_at_the_caller() -> None:
    plain = _uint8_lines()
    with st.patched("index"):
        patched = _uint8_lines()
    assert len(plain) == 2 and patched == plain  # once per user line, as without the patch


def test_warning_filters_keyed_on_the_user_module_still_match() -> None:
    x = torch.arange(4)
    mask = torch.tensor([1, 0, 1, 0], dtype=torch.uint8)
    with st.patched("index"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        warnings.filterwarnings("error", message=".*uint8", module=__name__)
        with pytest.raises(UserWarning, match="uint8"):
            x[mask]
