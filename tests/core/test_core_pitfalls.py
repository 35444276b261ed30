"""The pitfall table resolves: every function, patch, rule and finding it names exists."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import safetorch as st
from safetorch import _pitfalls
from safetorch.check import rules
from safetorch.patching import registry

ROOT = Path(__file__).resolve().parents[2]
ROWS = _pitfalls.PITFALLS


def test_ids_are_unique():
    ids = [row.id for row in ROWS]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_row_resolves(row):
    assert row.functions, row
    for name in row.functions:
        assert name.startswith("st."), name
        head, _, rest = name[3:].partition(".")
        if rest:  # plumbing: reached through its subpackage, not exported
            assert head in dir(st) and hasattr(getattr(st, head), rest), name
        else:  # the safe function itself (exported) or a whole subpackage (st.legacy)
            assert head in st.__all__ or head in st._SUBMODULES, name
    if row.patch is None:
        assert row.no_patch, f"{row.id}: no patch and no reason"
    else:
        assert row.patch in {p.name for p in registry.declared()}, row.patch
    if not row.rules:
        assert row.no_rule, f"{row.id}: no rule and no reason"
    codes = {r.code for r in rules.RULES}
    for code in row.rules:
        assert code in codes, code
    if row.finding is not None:
        source = "".join(p.read_text() for p in (ROOT / "safetorch").rglob("*.py"))
        assert f'"{row.finding}"' in source, row.finding


def _anchor(heading: str) -> str:
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_docs_anchor_exists(row):
    page, _, anchor = row.docs.partition("#")
    text = (ROOT / page).read_text(encoding="utf-8")
    anchors = {_anchor(h) for h in re.findall(r"^#+ (.*)$", text, flags=re.M)}
    assert anchor in anchors, f"{row.docs}: no heading with that anchor in {sorted(anchors)}"


def test_readme_table_is_generated_from_the_table():
    assert _pitfalls.markdown_table() in (ROOT / "README.md").read_text(encoding="utf-8")


def test_table_module_is_standard_library_only():
    code = "import sys, safetorch._pitfalls; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
