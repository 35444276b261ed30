"""Fixture files: ``*.py`` with ``# expect: CODE`` comments, and ``*.in.py`` -> ``*.out.py`` fixes."""

from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path

import pytest
from _fixture_run import expected_codes

from safetorch.check import check_source, fix_source

FIXTURES = Path(__file__).parent / "fixtures"
# Fixtures test every rule, preview rules included (opt-in for users, not here).
EVERY_RULE = ["ALL", "PREVIEW"]
_EXPECT = re.compile(r"# expect: ([A-Z0-9 ]+)")

FINDING_FIXTURES = sorted(
    p for p in FIXTURES.glob("*.py") if not p.name.endswith((".in.py", ".out.py"))
) + sorted((FIXTURES / "issue34").glob("*.py"))  # a project of its own (its setup.cfg)
# The labelled corpus of real-code idioms: corpus/<rule>_tp.py / <rule>_fp.py.
CORPUS = sorted((FIXTURES / "corpus").glob("*.py"))
FIX_PAIRS = sorted(FIXTURES.glob("*.in.py"))


def test_fixture_sets_are_not_empty() -> None:
    assert len(FINDING_FIXTURES) >= 10
    assert len(FIX_PAIRS) >= 5


@pytest.mark.parametrize("path", FINDING_FIXTURES + CORPUS, ids=lambda p: p.name)
def test_expected_findings(path: Path) -> None:
    source = path.read_text()
    got = sorted((d.line, d.code) for d in check_source(source, str(path), select=EVERY_RULE))
    assert got == expected_codes(source, _EXPECT)


def test_clean_idioms_have_no_findings() -> None:
    source = (FIXTURES / "clean.py").read_text()
    assert expected_codes(source, _EXPECT) == []
    assert check_source(source, select=EVERY_RULE) == []


@pytest.mark.parametrize("path", FIX_PAIRS, ids=lambda p: p.name)
def test_fix_pair(path: Path) -> None:
    before = path.read_text()
    expected = path.with_name(path.name.replace(".in.py", ".out.py")).read_text()
    after = fix_source(before, str(path), EVERY_RULE, unsafe_fixes=True)
    assert after == expected
    # Idempotent: a second fix changes nothing.
    assert fix_source(after, str(path), EVERY_RULE, unsafe_fixes=True) == after
    safe_expected = path.with_name(path.name.replace(".in.py", ".safe.out.py"))
    safe_after = fix_source(before, str(path), EVERY_RULE)
    if safe_expected.exists():
        assert safe_after == safe_expected.read_text()
        assert safe_after != after, "a .safe.out.py that equals .out.py is not needed"
    else:
        assert safe_after == after
    # The fixed file parses, nothing fixable is left, and no new finding appeared.
    ast.parse(after)
    left = check_source(after, str(path), select=EVERY_RULE)
    assert [d for d in left if d.fix is not None] == []
    before_codes = Counter(d.code for d in check_source(before, str(path), select=EVERY_RULE))
    after_codes = Counter(d.code for d in left)
    assert after_codes - before_codes == Counter()
    # Every fixable finding of the input was fixed.
    assert sum(d.fix is not None for d in check_source(before, str(path), select=EVERY_RULE)) > 0


@pytest.mark.parametrize("path", FIX_PAIRS, ids=lambda p: p.name)
def test_fix_only_touches_finding_lines(path: Path) -> None:
    before = path.read_text()
    after = fix_source(before, select=EVERY_RULE, unsafe_fixes=True)
    touched = {
        line
        for d in check_source(before, select=EVERY_RULE)
        if d.fix is not None
        for e in d.fix.edits
        for line in range(e.line, e.end_line + 1)
    }
    for number, (old, new) in enumerate(zip(before.splitlines(), after.splitlines()), start=1):
        if number not in touched:
            assert old == new, f"line {number} changed outside any finding"
