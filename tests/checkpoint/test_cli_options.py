"""``safetorch ckpt`` command-line conventions: options in any order, ``diff --atol/--rtol``,
``--max-shard-size`` implying safetensors, ``--output-format`` with a versioned JSON document,
and a progress bar with rate and time left that ``--no-progress`` turns off."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import List, Tuple

import pytest
import torch

from safetorch._cli import main
from safetorch.checkpoint import _cli_progress
from safetorch.checkpoint._cli_source import JSON_SCHEMA_VERSION
from safetorch.checkpoint.cli import diff_checkpoints

ROOT = Path(__file__).resolve().parents[2]
ENTRY_POINT = Path(sys.executable).with_name("safetorch")


def _run(*argv: str) -> Tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def pair(tmp_path: Path) -> Tuple[Path, Path]:
    a, b = tmp_path / "a.pt", tmp_path / "b.pt"
    torch.save({"state_dict": {"w": torch.ones(4), "b": torch.zeros(2)}}, a)
    torch.save({"state_dict": {"w": torch.ones(4) + 1e-7, "b": torch.zeros(2)}}, b)
    return a, b


@pytest.mark.skipif(not ENTRY_POINT.exists(), reason="no safetorch console script next to python")
def test_inspect_keys_before_the_path_through_the_entry_point(pair: Tuple[Path, Path]) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}
    done = subprocess.run(
        [str(ENTRY_POINT), "ckpt", "inspect", "--keys", str(pair[0]), "--output-format", "json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    assert document["schema_version"] == JSON_SCHEMA_VERSION and document["command"] == "inspect"
    assert [r["key"] for r in document["keys"]] == ["w", "b"]


@pytest.mark.parametrize(
    "argv",
    [
        ["--keys", "{a}"],  # the optional GLOB would take the path: it is the path
        ["{a}", "--keys"],
        ["--keys", "w", "{a}"],
        ["{a}", "--keys", "w"],
    ],
)
def test_inspect_keys_in_any_order(pair: Tuple[Path, Path], argv: List[str]) -> None:
    code, out, err = _run("ckpt", "inspect", *[x.format(a=pair[0]) for x in argv], "--json")
    assert code == 0, err
    keys = [r["key"] for r in json.loads(out)["keys"]]
    assert keys == (["w"] if "w" in argv else ["w", "b"])


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--keys"], "required: PATH"),
        (["--keys", "*.weight"], "--keys '*.weight' and no PATH: pass the checkpoint too"),
    ],
)
def test_inspect_without_a_path_is_a_usage_error(argv: List[str], expected: str) -> None:
    code, out, err = _run("ckpt", "inspect", *argv)
    assert code == 2 and out == "" and expected in err and "usage: safetorch ckpt inspect" in err


def test_diff_tolerances_decide_the_exit_status(pair: Tuple[Path, Path]) -> None:
    a, b = map(str, pair)
    assert _run("ckpt", "diff", a, b)[0] == 1  # exact by default
    code, out, _ = _run("ckpt", "diff", a, b, "--atol", "1e-6")
    assert code == 0 and "within tolerance: state_dict" not in out
    assert "within tolerance: w" in out and "equal within atol=1e-06, rtol=0" in out
    code, out, _ = _run("ckpt", "diff", "--rtol", "1e-6", a, b, "--output-format", "json")
    r = json.loads(out)
    assert code == 0 and r["identical"] and r["rtol"] == 1e-6 and r["atol"] == 0.0
    assert [k for k, _ in r["within_tolerance"]] == ["w"] and r["value_changed"] == []
    code, out, _ = _run("ckpt", "diff", a, b, "--atol", "1e-9", "--json")
    assert code == 1 and [k for k, _ in json.loads(out)["value_changed"]] == ["w"]


def test_diff_tolerance_matches_torch_isclose(tmp_path: Path) -> None:
    x = torch.tensor([1.0, 100.0, float("nan")])
    y = torch.tensor([1.05, 104.0, float("nan")])
    torch.save({"x": x}, tmp_path / "x.pt")
    torch.save({"x": y}, tmp_path / "y.pt")
    for atol, rtol in [(0.05, 0.0), (0.06, 0.04), (0.0, 0.05), (0.01, 0.01)]:
        r = diff_checkpoints(str(tmp_path / "x.pt"), str(tmp_path / "y.pt"), atol=atol, rtol=rtol)
        close = bool(
            torch.isclose(x.double(), y.double(), atol=atol, rtol=rtol, equal_nan=True).all()
        )
        assert r["identical"] is close, (atol, rtol)


@pytest.mark.parametrize("value", ["-1", "nan", "inf", "abc", ""])
@pytest.mark.parametrize("option", ["--atol", "--rtol"])
def test_bad_tolerance_names_value_form_and_fix(
    pair: Tuple[Path, Path], option: str, value: str
) -> None:
    code, out, err = _run("ckpt", "diff", str(pair[0]), str(pair[1]), option, value)
    assert code == 2 and out == ""
    assert f"argument {option}: {value!r} is not a tolerance" in err
    assert "expected a finite number >= 0, e.g. 1e-6" in err and err.count("\n") == 1


def test_diff_function_refuses_a_negative_tolerance(pair: Tuple[Path, Path]) -> None:
    with pytest.raises(ValueError, match=r"atol=-0.1: expected a finite number >= 0"):
        diff_checkpoints(str(pair[0]), str(pair[1]), atol=-0.1)


def test_max_shard_size_implies_safetensors(pair: Tuple[Path, Path], tmp_path: Path) -> None:
    pytest.importorskip("safetensors", reason="shards are safetensors files")
    code, out, err = _run(
        "ckpt",
        "convert",
        str(pair[0]),
        str(tmp_path / "shards"),
        "--max-shard-size",
        "1KB",
        "--json",
    )
    assert code == 0, err
    summary = json.loads(out)
    assert summary["format"] == "safetensors" and summary["command"] == "convert"
    assert (tmp_path / "shards" / "model.safetensors.index.json").exists()


@pytest.mark.parametrize(
    "extra, expected",
    [
        (["--max-shard-size", "1KB", "--to", "torch"], "--max-shard-size with --to torch"),
        (["--max-shard-size", "1KB", "--to", "dcp"], "drop --to dcp"),
        (["--max-shard-size", "five"], "--max-shard-size 'five': expected a positive size"),
        (["--max-shard-size=-3MB"], "e.g. --max-shard-size 5GB"),
        (["--max-bytes", "lots"], "--max-bytes 'lots': expected a positive size"),
    ],
)
def test_bad_shard_options(
    pair: Tuple[Path, Path], tmp_path: Path, extra: List[str], expected: str
) -> None:
    code, out, err = _run("ckpt", "convert", str(pair[0]), str(tmp_path / "o"), *extra)
    assert code == 2 and out == "" and expected in err and err.count("\n") == 1
    assert not (tmp_path / "o").exists()


def test_every_json_document_carries_the_schema_version(
    pair: Tuple[Path, Path], tmp_path: Path
) -> None:
    sys.path.insert(0, str(tmp_path))
    (tmp_path / "conv_models.py").write_text(
        "import torch\ndef build():\n    return torch.nn.Linear(2, 2)\n"
    )
    a, b = map(str, pair)
    runs = {
        "inspect": ["inspect", a],
        "convert": ["convert", a, str(tmp_path / "c.pt")],
        "diff": ["diff", a, b],
        "verify": ["verify", a],
        "fit": ["fit", a, "--model", "conv_models:build"],
    }
    try:
        for command, argv in runs.items():
            code, out, err = _run("ckpt", *argv, "--output-format", "json")
            assert code in (0, 1), err
            document = json.loads(out)
            assert list(document)[:2] == ["schema_version", "command"]
            assert document["schema_version"] == JSON_SCHEMA_VERSION
            assert document["command"] == command
    finally:
        sys.path.remove(str(tmp_path))


def test_text_is_the_default_and_json_flags_must_agree(pair: Tuple[Path, Path]) -> None:
    code, out, _ = _run("ckpt", "inspect", str(pair[0]), "--output-format", "text")
    assert code == 0 and out.startswith("path: ")
    code, out, err = _run("ckpt", "inspect", str(pair[0]), "--json", "--output-format", "text")
    assert code == 2 and "pass one of them, not both" in err
    code, out, err = _run("ckpt", "inspect", str(pair[0]), "--output-format", "yaml")
    assert code == 2 and "invalid choice: 'yaml'" in err and "'json'" in err


def test_the_json_schema_documents_every_field(pair: Tuple[Path, Path], tmp_path: Path) -> None:
    """docs/cli.md lists each command's fields; a field added without a line there fails."""
    doc = (ROOT / "docs" / "cli.md").read_text()
    section = doc.split("## JSON output", 1)[1].split("\n## ", 1)[0]
    assert f"`schema_version`: {JSON_SCHEMA_VERSION}" in section
    a, b = map(str, pair)
    for argv in (["inspect", a], ["inspect", a, "--keys"], ["diff", a, b], ["verify", a]):
        document = json.loads(_run("ckpt", *argv, "--json")[1])
        command = document["command"] + (" --keys" if "--keys" in argv else "")
        part = section.split(f"### {command}\n", 1)[1].split("\n### ", 1)[0]
        for field in document:
            assert f"`{field}`" in part or f"`{field}`" in section.split("### ")[0], (
                command,
                field,
            )


class _TTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_shows_rate_and_time_left(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [100.0]
    monkeypatch.setattr(_cli_progress.time, "monotonic", lambda: clock[0])
    stream = _TTY()
    bar = _cli_progress._Progress(8 * 2**20, stream, True)
    bar.start(8 * 2**20, "reading")
    bar.update(2**20, force=True)  # at once: no rate yet
    assert "/s" not in stream.getvalue()
    clock[0] += 2.0
    bar.update(2 * 2**20, force=True)  # 2 MiB in 2 s: 1 MiB/s, 6 MiB left
    last = stream.getvalue().split("\r")[-1]
    assert re.search(r"2\.0 MiB/8\.0 MiB 1\.0 MiB/s ETA 0:06", last), last


def test_no_progress_draws_nothing(
    monkeypatch: pytest.MonkeyPatch, pair: Tuple[Path, Path], tmp_path: Path
) -> None:
    monkeypatch.setattr(_cli_progress, "PROGRESS_MIN_BYTES", 0)
    tty = _TTY()
    monkeypatch.setattr(sys, "stderr", tty)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["ckpt", "convert", str(pair[0]), str(tmp_path / "p.pt")]) == 0
    assert "reading" in tty.getvalue()  # the bar is drawn on a terminal ...
    quiet = _TTY()
    monkeypatch.setattr(sys, "stderr", quiet)
    with contextlib.redirect_stdout(out):
        assert main(["ckpt", "convert", str(pair[0]), str(tmp_path / "q.pt"), "--no-progress"]) == 0
        assert main(["ckpt", "diff", str(pair[0]), str(pair[1]), "--no-progress"]) == 1
        assert main(["ckpt", "inspect", "--keys", str(pair[0]), "--no-progress"]) == 0
    assert quiet.getvalue() == ""  # ... and never with --no-progress


def test_ckpt_help_lists_the_new_options() -> None:
    for action, options in {
        "inspect": ["--output-format", "--no-progress", "--keys"],
        "convert": ["--output-format", "--no-progress", "implies --to safetensors"],
        "diff": ["--atol", "--rtol", "--output-format", "--no-progress"],
        "verify": ["--output-format"],
        "fit": ["--output-format"],
    }.items():
        code, out, _ = _run("ckpt", action, "--help")
        assert code == 0 and all(o in " ".join(out.split()) for o in options), action
