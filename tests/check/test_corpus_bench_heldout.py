"""The corpus benchmark never shows a tuner where the held-out half's unlabelled findings are."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_check_corpus.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_check_corpus_under_test", _SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_HALF = {"tuned": "dev", "secret": "held-out"}
_FOUND = [
    ("tuned", "train.py", 3, "ST004"),
    ("secret", "bench/speed.py", 41, "ST006"),
    ("secret", "bench/speed.py", 57, "ST006"),
    ("secret", "eval.py", 9, "ST004"),
]


def test_heldout_places_are_hidden_by_default(bench, capsys):
    bench.report_unlabelled(_FOUND, _HALF, list_heldout=False)
    out = capsys.readouterr().out
    assert "tuned/train.py:3 ST004" in out
    assert "speed.py" not in out and "eval.py" not in out
    assert "3 held-out finding(s) without a label: ST004 1, ST006 2." in out


def test_labellers_can_list_heldout_places(bench, capsys):
    bench.report_unlabelled(_FOUND, _HALF, list_heldout=True)
    out = capsys.readouterr().out
    assert "secret/bench/speed.py:41 ST006" in out
    assert "secret/eval.py:9 ST004" in out


def test_command_line_flag_is_documented_for_labellers(bench, capsys):
    with pytest.raises(SystemExit) as exc:
        bench.main(["--help"])
    assert exc.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "--list-unlabelled-heldout" in out and "labellers only" in out


def test_seed_rules_findings_on_retired_rows_count_as_development(bench):
    # Stop 55: the seed rules' findings on rows 1-276 were retired into development; their
    # held-out set is the held-out rows after them (for ST012 since stop 57: after row 435,
    # its eleventh- to fifteenth-batch findings retired too). Other rules keep their half.
    repos = [{"repo": f"owner/r{i}", "directory": f"r{i}"} for i in range(480)]
    for i, r in enumerate(repos):
        r["half"] = "dev" if i < bench.FIRST_TWELVE else bench.split_half(r["repo"])
    half_of = bench.halves(repos)
    late = next(r["directory"] for r in repos[435:] if r["half"] == "held-out")
    retired = next(r["directory"] for r in repos[276:435] if r["half"] == "held-out")
    early = next(r["directory"] for r in repos[12:276] if r["half"] == "held-out")
    found = [
        (f"{early}/a.py", 1, "ST012"),
        (f"{early}/a.py", 1, "ST003"),
        (f"{late}/b.py", 2, "ST012"),
        (f"{retired}/c.py", 3, "ST012"),
    ]
    out = bench.by_half(found, half_of)
    assert out["dev"] == [(f"{early}/a.py", 1, "ST012"), (f"{retired}/c.py", 3, "ST012")]
    assert out["held-out"] == [(f"{early}/a.py", 1, "ST003"), (f"{late}/b.py", 2, "ST012")]
