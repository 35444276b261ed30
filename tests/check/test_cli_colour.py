"""``safetorch check``'s findings in colour on a terminal, as ruff prints them, and the same
text without (issue 24.5)."""

from __future__ import annotations

import pytest

from safetorch._cli import main

SRC = "import torch\nx = torch.load('a.pt')\n"


@pytest.mark.parametrize("env", [{"FORCE_COLOR": "1"}, {"FORCE_COLOR": "1", "NO_COLOR": "1"}, {}])
def test_findings_are_coloured_only_where_colour_is_wanted(tmp_path, capsys, monkeypatch, env):
    for name in ("FORCE_COLOR", "NO_COLOR"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    path = tmp_path / "t.py"
    path.write_text(SRC)
    assert main(["check", str(path)]) == 1
    line = capsys.readouterr().out.splitlines()[0]
    coloured = env.get("FORCE_COLOR") and not env.get("NO_COLOR")
    assert ("\x1b[1;31mST003\x1b[0m" in line) == bool(coloured)
    plain = line.replace("\x1b[1m", "").replace("\x1b[1;31m", "").replace("\x1b[0m", "")
    assert plain.startswith(f"{path}:2:5: ST003 torch.load")
