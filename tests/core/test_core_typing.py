"""Typing discipline: strict mypy flags stay on, and every ``type: ignore`` says why."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Dict

import pytest

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

    # `safetorch doctor` reports the monkeypatch mode's internal state (the hook file, the
    # active patches): it reads patching's private modules on purpose, and only there.
    doctor = {
        ("safetorch/_doctor.py", "safetorch.patching", "_hook"),
        ("safetorch/_doctor.py", "safetorch.patching", "_registry"),
    }
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
                where = (path.relative_to(ROOT).as_posix(), node.module, alias.name)
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    if where in doctor:
                        continue
                    leaks.append(
                        f"{path.relative_to(ROOT)}: from {node.module} import {alias.name}"
                    )
    assert leaks == []


# -- `import safetorch as st` for type checkers ------------------------------------------------
# The package resolves names lazily (a module __getattr__, hidden from type checkers); what
# mypy and pyright see are the `if TYPE_CHECKING:` imports of safetorch/__init__.py. These
# tests keep them equal to the run-time map (`_HOME`, `_SUBMODULES`) and `__all__`, and run mypy
# on a user's file.


def _type_checking_imports() -> Dict[str, str]:
    """``{name: "area"}`` (``""`` for a subpackage) of the ``if TYPE_CHECKING:`` block."""
    import ast

    tree = ast.parse((ROOT / "safetorch" / "__init__.py").read_text(encoding="utf-8"))
    blocks = [
        node
        for node in tree.body
        if isinstance(node, ast.If)
        and isinstance(node.test, ast.Name)
        and node.test.id == "TYPE_CHECKING"
    ]
    assert len(blocks) == 1
    seen: Dict[str, str] = {}
    for stmt in blocks[0].body:
        assert isinstance(stmt, ast.ImportFrom) and stmt.level == 1, ast.dump(stmt)
        for alias in stmt.names:
            # `import x as x`: the explicit re-export form both mypy and pyright accept
            assert alias.asname == alias.name, f"import {alias.name} as {alias.name}"
            seen[alias.name] = stmt.module or ""
    return seen


def _expected_block() -> str:
    import safetorch as st

    lines = ["if TYPE_CHECKING:"]
    lines += [f"    from . import {s} as {s}" for s in sorted(st._SUBMODULES)]
    lines += [
        f"    from .{st._HOME[n]} import {n} as {n}" for n in sorted(st._HOME, key=st._HOME.get)
    ]
    return "\n".join(lines)


def test_type_checking_imports_match_the_lazy_map() -> None:
    import importlib

    import safetorch as st

    expected = {**{s: "" for s in st._SUBMODULES}, **st._HOME}
    assert _type_checking_imports() == expected, "regenerate the block:\n" + _expected_block()
    assert set(st.__all__) <= set(st._HOME)
    assert len(st.__all__) == len(set(st.__all__))
    for name, area in st._HOME.items():
        module = importlib.import_module(f"safetorch.{area}")
        assert name in module.__all__, f"safetorch.{area}.__all__ lacks {name}"
        assert getattr(st, name) is getattr(module, name), name
    assert sorted(n for n in dir(st) if not n.startswith("__")) == sorted(expected)


_USER_FILE = """\
import safetorch as st

reveal_type(st.load)
st.load("ckpt.pt", weights_only="yes")
st.no_such_function
report = st.load_state_dict
plumbing = st.checkpoint.LoadReport
checker = st.check.check_source
NAMES = [{names}]
"""


def test_mypy_sees_the_real_names(tmp_path: Path) -> None:
    """mypy on a user's file: real signatures, and a typo in ``st.`` is an error."""
    import os
    import subprocess
    import sys

    pytest.importorskip("mypy.api", reason="mypy is not installed (it needs Python >= 3.10)")
    import safetorch as st

    names = ", ".join(f"st.{n}" for n in (*st._HOME, *st._SUBMODULES))
    (tmp_path / "user.py").write_text(_USER_FILE.format(names=names), encoding="utf-8")
    # Only safetorch is analysed (torch, numpy, ... are skipped: Any), so this takes seconds.
    (tmp_path / "mypy.ini").write_text(
        "[mypy]\nfollow_imports = skip\n\n[mypy-safetorch,safetorch.*]\nfollow_imports = silent\n",
        encoding="utf-8",
    )
    # MYPYPATH: an editable install is an import hook, which mypy does not follow.
    env = {**os.environ, "MYPYPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", "mypy.ini", "--no-incremental", "user.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = [line for line in out.stdout.splitlines() if line.startswith("user.py:")]
    assert len(lines) == 3, out.stdout + out.stderr
    revealed, wrong_type, typo = lines
    assert revealed.startswith('user.py:3: note: Revealed type is "def (f:'), revealed
    assert "weights_only" in revealed and "-> Any" in revealed, revealed
    assert wrong_type.startswith("user.py:4: error:") and "[arg-type]" in wrong_type, wrong_type
    assert typo.startswith("user.py:5: error:") and "no_such_function" in typo, typo
    assert "[attr-defined]" in typo, typo
