"""Test modules import their shared helpers the one way every supported pytest accepts.

Under ``--import-mode=importlib`` (pyproject's addopts) pytest 7.0, the floor pyproject
declares, imports ``tests/check/test_x.py`` as ``tests.check.test_x`` after putting an empty,
non-package module named ``tests`` into ``sys.modules``; ``from tests._check_project import
...`` then fails at collection ("'tests' is not a package"), while newer pytest imports it. The
helpers are on ``sys.path`` through ``tests/conftest.py``: ``from _check_project import ...``
works on every pytest (the floors row of benchmarks/COMPAT.md found the four that did not).
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import List

TESTS = Path(__file__).resolve().parents[1]


def _package_imports(path: Path, root: Path = TESTS.parent) -> List[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        found += [
            f"{path.relative_to(root)}:{node.lineno} imports {name}"
            for name in names
            if name == "tests" or name.startswith("tests.")
        ]
    return found


def test_no_test_module_imports_the_tests_folder_as_a_package() -> None:
    modules = [p for p in sorted(TESTS.rglob("*.py")) if "fixtures" not in p.parts]
    offenders = [hit for path in modules for hit in _package_imports(path)]
    assert offenders == [], (
        "pytest 7.0 (the floor) cannot import these under --import-mode=importlib; write "
        "`from _check_project import ...` (tests/ is on sys.path via conftest.py): "
        + "; ".join(offenders)
    )


def test_the_check_sees_a_package_import(tmp_path: Path) -> None:
    sample = tmp_path / "test_sample.py"
    sample.write_text(
        "import os\nfrom tests._check_project import run_fixed\nimport tests.check\n"
        "from _check_project import write_project\n",
        encoding="utf-8",
    )
    assert _package_imports(sample, tmp_path) == [
        "test_sample.py:2 imports tests._check_project",
        "test_sample.py:3 imports tests.check",
    ]
