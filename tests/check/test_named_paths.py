"""A directory named on the command line is checked even when configured as excluded (as ruff)."""

from __future__ import annotations

import contextlib
import io

from safetorch._cli import main


def _run(*argv: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        main(["check", "--exit-zero", *argv])
    return out.getvalue()


def test_named_excluded_directory_is_checked_unless_force_exclude(tmp_path, monkeypatch):
    (tmp_path / "pyproject.toml").write_text('[tool.safetorch]\nextend-exclude = ["legacy"]\n')
    (tmp_path / "legacy").mkdir()
    (tmp_path / "legacy" / "old.py").write_text("import torch\nsd = torch.load('x.pt')\n")
    monkeypatch.chdir(tmp_path)
    assert "ST003" in _run("legacy")
    assert "ST003" not in _run(".")
    assert "ST003" not in _run("--force-exclude", "legacy")
