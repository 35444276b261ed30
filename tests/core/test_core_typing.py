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


def test_no_private_name_is_imported_across_packages() -> None:
    """A subpackage (checkpoint, patching, nn, check) imports no ``_name`` from another one;
    the top-level private modules (``safetorch._compat``, ``_stack``, ...) are the shared
    internals every package may import."""
    import ast

    root = ROOT / "safetorch"

    def package(module: str) -> str:
        parts = module.split(".")
        return ".".join(parts[:2]) if len(parts) > 1 and (root / parts[1]).is_dir() else "safetorch"

    leaks = []
    for path in sorted(root.rglob("*.py")):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        here = package(module)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.ImportFrom) and node.module):
                continue
            if not node.module.startswith("safetorch.") or package(node.module) == here:
                continue
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    leaks.append(
                        f"{path.relative_to(ROOT)}: from {node.module} import {alias.name}"
                    )
    assert leaks == []
