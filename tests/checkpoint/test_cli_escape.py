"""``safetorch ckpt`` output escapes the control characters of file-derived text: key names,
nested container keys, safetensors metadata, file and directory names, error messages (issue
"Trust a checkpoint for where it came from", item 8). One function does it:
:func:`safetorch._text.escape`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Tuple

import pytest
import torch

import safetorch as st
from safetorch._cli import main
from safetorch._text import escape, escape_all

HOSTILE = "\x1b[31m\r\x07\u202e"
RAW = ("\x1b", "\r", "\x07", "\u202e", "\x9b")
SHOWN = "\\x1b[31m\\r\\x07\\u202e"  # what the user sees instead


@pytest.fixture(autouse=True)
def _plain_streams(monkeypatch: pytest.MonkeyPatch) -> None:
    """No colour codes of our own: every escape byte in the output came from a file."""
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    monkeypatch.setenv("NO_COLOR", "1")


@pytest.fixture
def where(tmp_path: Path) -> Path:
    d = tmp_path / f"dir{HOSTILE}"
    d.mkdir()
    return d


def _state(value: float = 1.0) -> Dict[str, torch.Tensor]:
    return {
        f"w{HOSTILE}": torch.full((2,), value),
        "plain.weight": torch.ones(3),
        "rtl\u202egnp.exe": torch.zeros(1),
    }


@pytest.fixture
def pt(where: Path) -> Path:
    path = where / f"m{HOSTILE}.pt"
    torch.save(_state(), path)
    return path


@pytest.fixture
def nested(where: Path) -> Path:
    path = where / f"n{HOSTILE}.pt"
    torch.save({f"model{HOSTILE}": _state(), f"ema{HOSTILE}": _state(), "epoch": 1}, path)
    return path


@pytest.fixture
def sf(where: Path) -> Path:
    safetensors = pytest.importorskip("safetensors.torch")
    path = where / f"s{HOSTILE}.safetensors"
    safetensors.save_file(
        _state(), str(path), metadata={f"note{HOSTILE}": f"v{HOSTILE}", "format": "pt"}
    )
    return path


def _run(capsys: pytest.CaptureFixture, *argv: str) -> Tuple[int, str]:
    status = main(["ckpt", *argv])
    out, err = capsys.readouterr()
    text = out + err
    for ch in RAW:
        assert ch not in text, f"raw {ch!r} reached the terminal: {text!r}"
    return status, text


def test_the_one_function_escapes_controls_bidi_and_keeps_text() -> None:
    assert escape(f"a{HOSTILE}b") == f"a{SHOWN}b"
    for ch in ("\x00", "\x1b", "\x7f", "\x9b", "\u200e", "\u2066", "\u2028", "\ufeff", "\udcff"):
        shown = escape(ch)
        assert shown.startswith("\\") and shown.isprintable()
    assert escape("模型.权重_ñ/ü name") == "模型.权重_ñ/ü name"
    assert escape("a\nb", keep="\n") == "a\nb" and escape("a\nb") == "a\\nb"
    assert escape_all({f"k{HOSTILE}": [f"v{HOSTILE}", (1, None)]}) == {
        f"k{SHOWN}": [f"v{SHOWN}", (1, None)]
    }


def test_inspect_a_file(capsys: pytest.CaptureFixture, nested: Path) -> None:
    status, text = _run(capsys, "inspect", str(nested))
    assert status == 0 and f"model{SHOWN}" in text and f"ema{SHOWN}" in text
    assert f"n{SHOWN}.pt" in text


def test_inspect_keys(capsys: pytest.CaptureFixture, pt: Path) -> None:
    status, text = _run(capsys, "inspect", str(pt), "--keys", "*")
    assert status == 0 and f"w{SHOWN}" in text and "rtl\\u202egnp.exe" in text


def test_inspect_safetensors_with_metadata(capsys: pytest.CaptureFixture, sf: Path) -> None:
    status, text = _run(capsys, "inspect", str(sf))
    assert status == 0 and f"s{SHOWN}.safetensors" in text
    status, text = _run(capsys, "inspect", str(sf), "--keys", "*")
    assert status == 0 and f"w{SHOWN}" in text


def test_inspect_a_directory(capsys: pytest.CaptureFixture, where: Path) -> None:
    torch.save(_state(), where / "model.pt")
    (where / f"notes{HOSTILE}.txt").write_text("x")
    status, text = _run(capsys, "inspect", str(where))
    assert status == 0 and f"dir{SHOWN}" in text


def test_inspect_a_saver_directory(capsys: pytest.CaptureFixture, where: Path) -> None:
    saver = st.CheckpointSaver(where / f"run{HOSTILE}")
    saver.save(_state(), epoch=0, metric=1.0)
    status, text = _run(capsys, "inspect", saver.directory)
    assert status == 0 and f"run{SHOWN}" in text and "last.pt" in text


def test_diff(capsys: pytest.CaptureFixture, where: Path, pt: Path) -> None:
    other = _state(2.0)
    other[f"only{HOSTILE}"] = other.pop("plain.weight")
    b = where / f"b{HOSTILE}.pt"
    torch.save(other, b)
    status, text = _run(capsys, "diff", str(pt), str(b))
    assert status == 1
    assert f"values differ: w{SHOWN}" in text and f"only{SHOWN}" in text and f"b{SHOWN}.pt" in text


def test_convert(capsys: pytest.CaptureFixture, where: Path, nested: Path) -> None:
    pytest.importorskip("safetensors")
    out = where / f"o{HOSTILE}.safetensors"
    status, text = _run(capsys, "convert", str(nested), str(out), "--key", f"model{HOSTILE}")
    assert status == 0 and f"o{SHOWN}.safetensors" in text
    assert f"ema{SHOWN}" in text  # not carried over: named, escaped


def test_fit(
    capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, pt: Path
) -> None:
    (tmp_path / "esc_models.py").write_text(
        "import torch\ndef build():\n    return torch.nn.Linear(2, 2)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    status, text = _run(capsys, "fit", str(pt), "--model", "esc_models:build")
    assert status == 1 and f"w{SHOWN}" in text


def test_verify(capsys: pytest.CaptureFixture, where: Path, pt: Path) -> None:
    status, text = _run(capsys, "verify", str(pt))
    assert status == 0 and f"m{SHOWN}.pt" in text
    (where / f"bad{HOSTILE}.pt").write_bytes(b"PK\x03\x04 not a zip")
    status, text = _run(capsys, "verify", str(where))
    assert status == 1 and f"bad{SHOWN}.pt" in text


def test_errors_name_hostile_paths_escaped(capsys: pytest.CaptureFixture, where: Path) -> None:
    status, text = _run(capsys, "inspect", str(where / f"missing{HOSTILE}.pt"))
    assert status == 2 and f"missing{SHOWN}" in text
    status, text = _run(capsys, "diff", str(where / f"gone{HOSTILE}" / "a.pt"), "b.pt")
    assert status == 2 and f"directory {escape(str(where))}/gone{SHOWN} does not exist" in text
    torch.save(_state(), where / "model.pt")
    status, text = _run(capsys, "inspect", str(where / "model.pt"), "--key", f"nope{HOSTILE}")
    assert status == 2 and "nope" in text
    (where / f"cut{HOSTILE}.pt").write_bytes(b"PK\x03\x04 truncated")
    status, text = _run(capsys, "inspect", str(where / f"cut{HOSTILE}.pt"))
    assert status == 2 and f"cut{SHOWN}" in text


def test_json_output_is_escaped_by_json(capsys: pytest.CaptureFixture, nested: Path) -> None:
    status, text = _run(capsys, "inspect", str(nested), "--json")
    assert status == 0 and f"model{HOSTILE}" in json.loads(text)["container_keys"]


def test_a_subprocess_sees_no_raw_control_characters(where: Path, nested: Path) -> None:
    env = dict(os.environ, NO_COLOR="1", PYTHONWARNINGS="always")
    env.pop("FORCE_COLOR", None)
    runs: List[subprocess.CompletedProcess] = []
    for argv in (["inspect", str(nested)], ["inspect", str(nested), "--keys", "*"]):
        runs.append(
            subprocess.run(
                [sys.executable, "-m", "safetorch", "ckpt", *argv],
                capture_output=True,
                env=env,
                timeout=240,
            )
        )
    for proc in runs:
        assert proc.returncode == 0, proc.stderr
        both = proc.stdout + proc.stderr
        for ch in RAW:
            assert ch.encode() not in both, both
        assert SHOWN.encode() in proc.stdout
