"""The seed fixtures (one per pitfall the checker was built for) are all found by the
*default* rules, the set a user gets with no ``--select``: issue 33 moved four seed rules to
preview and the default set stopped finding 8 of them; this keeps that from recurring."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from _fixture_run import expected_codes

from safetorch.check import check_source
from safetorch.check.rules import RULE_TABLE

FIXTURES = Path(__file__).parent / "fixtures"
_EXPECT = re.compile(r"# expect: ([A-Z0-9 ]+)")
SEEDS = sorted(p for p in FIXTURES.glob("*.py") if not p.name.endswith((".in.py", ".out.py")))


def test_seed_rules_are_default() -> None:
    # The pitfalls issue 33 names: detach-then-inplace, unsynced timing, the discarded
    # strict=False result, torch.load without map_location.
    for code in ("ST004", "ST005", "ST006", "ST012"):
        assert not RULE_TABLE[code].preview, code


@pytest.mark.parametrize("path", SEEDS, ids=lambda p: p.name)
def test_seed_fixture_found_by_default_rules(path: Path) -> None:
    source = path.read_text()
    want = expected_codes(source, _EXPECT)
    got = sorted((d.line, d.code) for d in check_source(source, str(path)))
    assert got == want, f"default rules missed {sorted(set(want) - set(got))}"


def test_every_seed_pitfall_has_a_fixture_finding() -> None:
    found = {code for path in SEEDS for _line, code in expected_codes(path.read_text(), _EXPECT)}
    for code in ("ST004", "ST005", "ST006", "ST012", "ST003", "ST008", "ST013"):
        assert code in found, code
