"""The index modes and policies are ``Literal`` types, and ``safe_copy`` returns what it is given.

mypy on a user's file (as tests/core/test_core_typing.py runs it: only safetorch is analysed):
a mode or policy that is not one of the documented strings is a type error, not only the
``ValueError`` it raises at run time.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import get_args

import pytest

from safetorch import _index_parse

ROOT = Path(__file__).resolve().parents[2]

_USER_FILE = """\
import torch, safetorch as st
x = torch.arange(6)
i = torch.tensor([1])
st.index_select(x, 0, i, mode="bogus")
st.gather(x, 0, i, mode="clip", check="sometimes")
st.checked_index(x, i, mode="wrap", check="always")
reveal_type(st.safe_copy({"epoch": 3, "best": 0}))
"""


def test_modes_are_the_literal_types_values() -> None:
    assert _index_parse.MODES == get_args(_index_parse.IndexMode)
    assert get_args(_index_parse.IndexCheck) == ("auto", "always", "never")


def test_mypy_rejects_unknown_modes_and_keeps_safe_copys_type(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    api = pytest.importorskip("mypy.api", reason="mypy is not installed (it needs Python >= 3.10)")
    (tmp_path / "user.py").write_text(_USER_FILE, encoding="utf-8")
    (tmp_path / "mypy.ini").write_text(
        "[mypy]\nfollow_imports = skip\n[mypy-safetorch.*,safetorch]\nfollow_imports = silent\n",
        encoding="utf-8",
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MYPYPATH", str(ROOT))  # an editable install is an import hook
    # Only safetorch is analysed (torch is skipped: Any), in this process: a few seconds.
    stdout, stderr, _ = api.run(
        ["--config-file", "mypy.ini", "--no-incremental", "--no-error-summary", "user.py"]
        + ["--python-executable", sys.executable]
    )
    lines = [line for line in stdout.splitlines() if line.startswith("user.py:")]
    assert len(lines) == 3, stdout + stderr
    bad_mode, bad_check, revealed = lines
    assert bad_mode.startswith("user.py:4: error:") and '"mode"' in bad_mode, bad_mode
    assert "[arg-type]" in bad_mode and "Literal[" in bad_mode, bad_mode
    assert bad_check.startswith("user.py:5: error:") and '"check"' in bad_check, bad_check
    assert revealed.startswith("user.py:7: note: Revealed type is"), revealed
    assert "dict[str, int]" in revealed.replace("builtins.", ""), revealed  # not Any
