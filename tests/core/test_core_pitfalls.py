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


def _resolve(name: str) -> object:
    assert name.startswith("st."), name
    head, _, rest = name[3:].partition(".")
    if rest:  # plumbing: reached through its subpackage, not exported
        assert head in dir(st), name
        obj = getattr(st, head)
        for part in rest.split("."):
            obj = getattr(obj, part)
        return obj
    # the safe function itself (exported or a documented st.<name>) or a subpackage (st.legacy)
    assert head in st.__all__ or head in st._HOME or head in st._SUBMODULES, name
    return getattr(st, head)


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_row_resolves(row):
    assert row.functions or row.no_function, f"{row.id}: no function and no reason"
    for name in row.functions:
        _resolve(name)
    if row.patch is None:
        assert row.no_patch, f"{row.id}: no patch and no reason"
    else:
        assert row.patch in {p.name for p in registry.declared()}, row.patch
    if not row.rules:
        assert row.no_rule, f"{row.id}: no rule and no reason"
    codes = {r.code for r in rules.RULES}
    for code in row.rules:
        assert code in codes, code
    source = "".join(p.read_text() for p in (ROOT / "safetorch").rglob("*.py"))
    for finding in row.findings:
        assert f'"{finding}"' in source, finding


def test_every_rule_refers_to_its_row_by_id():
    for rule in rules.RULES:
        row = _pitfalls.by_id(rule.pitfall_id)
        assert rule.code in row.rules, (rule.code, row.id)
        assert rules.RULE_TABLE[rule.code].pitfall_id == row.id
        if rule.safetorch is not None:  # the function it points to exists (flat names too)
            obj = st
            for part in rule.safetorch[3:].split("."):
                obj = getattr(obj, part)
    assert sorted(c for row in ROWS for c in row.rules) == sorted(r.code for r in rules.RULES)


def test_every_patch_refers_to_its_rows_by_id():
    for patch in registry.declared():
        assert patch.pitfalls and patch.pitfalls == _pitfalls.for_patch(patch.name), patch.name
    for info in st.patches():
        assert info.pitfalls == _pitfalls.for_patch(info.name)
        for pitfall_id in info.pitfalls:
            assert _pitfalls.by_id(pitfall_id).patch == info.name


def test_every_runtime_finding_id_belongs_to_one_row():
    source = "".join(
        p.read_text() for p in (ROOT / "safetorch").rglob("*.py") if p.parent.name != "check"
    )
    # Finding("<id>", ...) in lint_model and check_loader
    emitted = set(re.findall(r'Finding\(\s*"([a-z0-9-]+)"', source))
    assert emitted, "no Finding(...) found: the pattern is stale"
    listed = [f for row in ROWS for f in row.findings]
    assert len(listed) == len(set(listed)), "a finding id is listed by two rows"
    assert emitted == set(listed)
    for finding_id in emitted:
        assert (
            st.findings.Finding(finding_id, "x", "m").pitfall
            == _pitfalls.for_finding(finding_id).id
        )


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_one_id_per_pitfall(row):
    """A check that exists as a rule and as a runtime finding has one id in both; a pitfall
    with one rule names that rule; a pitfall with one finding and no other face uses its id."""
    names = {rules.rule_for(code).name for code in row.rules}
    if len(row.rules) == 1 and not row.findings:
        assert names == {row.id}, (row.id, names)
    if len(row.findings) == 1 and len(row.rules) <= 1:  # e.g. bias-before-bn: ST008 and lint
        assert set(row.findings) | names == {row.id}, (row.id, names, row.findings)
    for other in ROWS:  # no rule name or finding id is another row's id
        if other is not row:
            assert other.id not in names and other.id not in row.findings


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


def test_docs_tables_name_pitfalls_by_id():
    """docs/check.md's rule table and docs/patching.md's patch table carry each row's
    pitfall id, the same as the rule's pitfall_id and the patch's pitfalls."""
    check = (ROOT / "docs" / "check.md").read_text(encoding="utf-8")
    seen = set()
    for code, last in re.findall(r"^\| (ST\d{3}) \|.*\| ([^|]+) \|$", check, flags=re.M):
        expected = "-" if code == "ST000" else f"`{rules.RULE_TABLE[code].pitfall_id}`"
        assert last.strip() == expected, code
        seen.add(code)
    assert seen == set(rules.RULE_TABLE)
    patching = (ROOT / "docs" / "patching.md").read_text(encoding="utf-8")
    rows = dict(re.findall(r"^\| `([a-z_]+)` \|.*\| ([^|]+) \|$", patching, flags=re.M))
    for patch in registry.declared():
        if patch.name in rows:
            assert rows[patch.name].strip() == ", ".join(f"`{p}`" for p in patch.pitfalls)
