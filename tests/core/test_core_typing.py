"""Typing discipline: strict mypy flags stay on, and every ``type: ignore`` says why."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_type_ignore_has_a_code_and_a_reason() -> None:
    bare = []
    for path in sorted((ROOT / "safetorch").rglob("*.py")):
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if "type: ignore" not in line:
                continue
            if not re.search(r"# type: ignore\[[-a-z, ]+\]\s+#\s*\S", line):
                bare.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert bare == [], "type: ignore without [code] and a reason:\n" + "\n".join(bare)


def test_strict_mypy_flags_stay_on() -> None:
    config = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    for flag in ("check_untyped_defs = true", "warn_unused_ignores = true"):
        assert flag in config, flag
