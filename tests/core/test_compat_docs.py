"""docs/compatibility.md's matrix section and pyproject.toml's Python classifiers follow
benchmarks/COMPAT.md: neither can claim a Python or a result the matrix did not record."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _compat_docs() -> ModuleType:
    spec = importlib.util.spec_from_file_location("compat_docs", ROOT / "tools" / "compat_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_generated_section_matches_compat_md() -> None:
    docs = _compat_docs()
    page = (ROOT / "docs" / "compatibility.md").read_text(encoding="utf-8")
    compat = (ROOT / "benchmarks" / "COMPAT.md").read_text(encoding="utf-8")
    assert docs.render(page, compat) == page, "run: python tools/compat_docs.py"
    assert docs.main(["--check"]) == 0


def test_every_matrix_row_is_on_the_page() -> None:
    docs = _compat_docs()
    rows = docs.matrix_rows((ROOT / "benchmarks" / "COMPAT.md").read_text(encoding="utf-8"))
    assert len(rows) >= 2
    page = (ROOT / "docs" / "compatibility.md").read_text(encoding="utf-8")
    for r in rows:
        assert f"| {r['Python']} | {r['torch']} | {r['deps']} |" in page


def test_classifiers_name_exactly_the_pythons_the_matrix_ran() -> None:
    docs = _compat_docs()
    rows = docs.matrix_rows((ROOT / "benchmarks" / "COMPAT.md").read_text(encoding="utf-8"))
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    classifiers = re.findall(r'"Programming Language :: Python :: (3\.\d+)"', text)
    assert classifiers == docs.python_minors(rows)
    floor = re.search(r'requires-python = ">=(3\.\d+)"', text)
    assert floor is not None and floor.group(1) == classifiers[0]  # the floor is tested


def test_a_stale_page_is_caught() -> None:
    docs = _compat_docs()
    page = (ROOT / "docs" / "compatibility.md").read_text(encoding="utf-8")
    compat = (ROOT / "benchmarks" / "COMPAT.md").read_text(encoding="utf-8")
    edited = compat.replace("| 3.11.7 | 2.13.0 |", "| 3.10.14 | 2.13.0 |", 1)
    assert edited != compat
    new = docs.render(page, edited)
    assert new != page and "Python 3.9, 3.10, 3.11" in new
    with pytest.raises(ValueError, match="no generated section"):
        docs.render("no markers here", compat)
    with pytest.raises(ValueError, match="no matrix table"):
        docs.render(page, "# empty\n")
