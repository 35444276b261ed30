"""Integrity beyond torch: ``safetorch.checkpoint.verify``, ``st.load(verify=True)`` and
``safetorch ckpt verify`` (issue 21)."""

from __future__ import annotations

import io
import json
import os
import signal
import struct
import zipfile
from pathlib import Path

import pytest
import torch

import safetorch as st
from safetorch import _compat
from safetorch._cli import main
from safetorch.checkpoint.verify import VerifyReport, check_file, verify_checkpoint, verify_file
from safetorch.errors import CheckpointError


def _storage_data_offset(path: Path, member_suffix: str = "data/0") -> tuple:
    """(record name, offset of its first data byte) of a stored zip record."""
    with zipfile.ZipFile(path) as zf:
        info = next(i for i in zf.infolist() if i.filename.endswith(member_suffix))
    assert info.compress_type == zipfile.ZIP_STORED  # torch.save stores, never deflates
    data = path.read_bytes()
    n, m = struct.unpack("<HH", data[info.header_offset + 26 : info.header_offset + 30])
    return info.filename, info.header_offset + 30 + n + m


@pytest.fixture
def good(tmp_path: Path) -> Path:
    path = tmp_path / "good.pt"
    torch.save({"w": torch.arange(1000, dtype=torch.float32), "b": torch.ones(3)}, path)
    return path


@pytest.fixture
def flipped(tmp_path: Path, good: Path) -> tuple:
    name, start = _storage_data_offset(good)
    data = bytearray(good.read_bytes())
    data[start + 100] ^= 0xFF  # inside record data/0 (the 1000 floats)
    path = tmp_path / "flipped.pt"
    path.write_bytes(bytes(data))
    return path, name


def test_a_good_file_passes(good: Path) -> None:
    report = verify_file(good)
    assert report.ok and report.problems == [] and report.format == "zip"
    # every record torch wrote (4 on torch 1.13, 5+ later: .format_version, byteorder, ...)
    with zipfile.ZipFile(good) as z:
        assert report.records == len(z.infolist()) >= 4
    assert report.bytes_checked >= 4000 + 12
    assert report.summary().startswith(f"ok: {good} (zip, ")
    assert st.load(good, verify=True)["w"].equal(torch.arange(1000, dtype=torch.float32))


def test_a_flipped_byte_is_found_where_torch_checks_nothing(flipped: tuple) -> None:
    path, record = flipped
    # torch (weights-only, mmap or not) loads the corrupt file silently: a wrong weight
    silent = torch.load(path, weights_only=True)["w"]
    assert not silent.equal(torch.arange(1000, dtype=torch.float32))
    if _compat.LOAD_HAS_MMAP:  # torch >= 2.1
        assert not torch.load(str(path), weights_only=True, mmap=True)["w"].equal(
            torch.arange(1000, dtype=torch.float32)
        )
    assert st.load(path)["w"].equal(silent)  # st.load without verify: what torch does
    report = verify_file(path)
    assert not report.ok
    assert report.problems == [f"record {record!r} fails its CRC-32 check: the file is corrupt"]
    with pytest.raises(CheckpointError) as info:
        st.load(path, verify=True)
    text = str(info.value)
    assert str(path) in text
    assert f"record {record!r} fails its CRC-32 check: the file is corrupt" in text
    with pytest.raises(CheckpointError):
        check_file(str(path))


def test_file_objects_are_verified_and_their_position_restored(flipped: tuple, good: Path) -> None:
    buf = io.BytesIO(good.read_bytes())
    buf.seek(7)
    assert verify_file(buf).ok and buf.tell() == 7
    buf.seek(0)
    assert st.load(buf, verify=True)["b"].equal(torch.ones(3))
    bad = io.BytesIO(flipped[0].read_bytes())
    with pytest.raises(CheckpointError, match="fails its CRC-32 check"):
        st.load(bad, verify=True)
    assert bad.tell() == 0


def test_a_truncated_zip_is_reported(tmp_path: Path, good: Path) -> None:
    path = tmp_path / "cut.pt"
    path.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    report = verify_file(path)
    assert not report.ok and "truncated or corrupt" in report.problems[0]
    with pytest.raises(CheckpointError, match="cut.pt"):
        st.load(path, verify=True)


def test_records_written_without_crc_are_listed_not_failed(tmp_path: Path) -> None:
    if not hasattr(torch.serialization, "set_crc32_options"):
        pytest.skip("torch < 2.5 always writes CRC-32")
    path = tmp_path / "nocrc.pt"
    torch.serialization.set_crc32_options(False)
    try:
        torch.save({"w": torch.arange(10.0)}, path)
    finally:
        torch.serialization.set_crc32_options(True)
    report = verify_file(path)
    assert report.ok and report.skipped and "set_crc32_options(False)" in report.skipped[0]


def _safetensors(tmp_path: Path) -> Path:
    safetensors_torch = pytest.importorskip("safetensors.torch")
    path = tmp_path / "m.safetensors"
    safetensors_torch.save_file({"a": torch.ones(4), "b": torch.zeros(2, 3)}, str(path))
    return path


def test_safetensors_good_and_truncated(tmp_path: Path) -> None:
    path = _safetensors(tmp_path)
    report = verify_file(path)
    assert report.ok and report.format == "safetensors" and report.records == 2
    assert "no checksum" in report.skipped[0]
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(path.read_bytes()[:-4])
    report = verify_file(cut)
    safetensors = pytest.importorskip("safetensors.torch")
    with pytest.raises(Exception) as theirs:  # noqa: B017 - safetensors' own error type
        safetensors.load_file(str(cut))
    reason = " ".join(str(theirs.value).split()).split(": ", 1)[-1]
    assert not report.ok and reason in report.problems[0]  # the package's own reason
    with pytest.raises(CheckpointError, match="cut.safetensors"):
        st.load(cut, verify=True)
    header = tmp_path / "header.safetensors"
    header.write_bytes(struct.pack("<Q", 10**6) + b"{}")
    with pytest.raises(Exception) as theirs:  # noqa: B017 - safetensors' own error type
        safetensors.load_file(str(header))
    reason = " ".join(str(theirs.value).split()).split(": ", 1)[-1]
    assert reason in verify_file(header).problems[0]


def test_legacy_format_has_nothing_to_check(tmp_path: Path) -> None:
    path = tmp_path / "old.pt"
    torch.save({"w": torch.ones(2)}, path, _use_new_zipfile_serialization=False)
    report = verify_file(path)
    assert report.ok and report.format == "legacy" and "no checksum" in report.skipped[0]
    assert st.load(path, verify=True)["w"].equal(torch.ones(2))


def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.pt"
    os.mkfifo(fifo)
    signal.alarm(30)  # a blocking open would hang here
    try:
        with pytest.raises(CheckpointError, match="FIFO"):
            verify_file(fifo)
        with pytest.raises(CheckpointError):
            st.load(fifo, verify=True)
        report = verify_checkpoint(tmp_path)  # a FIFO among the files: a problem, no hang
        assert not report.ok and "FIFO" in report.problems[0]
    finally:
        signal.alarm(0)


def test_directory_and_index(tmp_path: Path, good: Path, flipped: tuple) -> None:
    d = tmp_path / "run"
    (d / "sub").mkdir(parents=True)
    (d / "model.pt").write_bytes(good.read_bytes())
    (d / "sub" / "bad.bin").write_bytes(flipped[0].read_bytes())
    (d / "notes.txt").write_text("not weights")
    report = verify_checkpoint(d)
    assert [f.path for f in report.files] == ["model.pt", os.path.join("sub", "bad.bin")]
    assert not report.ok and report.problems[0].startswith(os.path.join("sub", "bad.bin") + ": ")
    index = d / "model.index.json"
    index.write_text(json.dumps({"weight_map": {"x": "model.pt", "y": "model.pt"}}))
    report = verify_checkpoint(index)
    assert report.ok and report.format == "index" and len(report.files) == 1
    index.write_text(json.dumps({"weight_map": {"x": "../good.pt"}}))
    assert "outside" in verify_checkpoint(index).problems[0]
    index.write_text("[1, 2]")
    with pytest.raises(CheckpointError, match="weight_map"):
        verify_checkpoint(index)
    (tmp_path / "empty").mkdir()
    assert "no weights file" in verify_checkpoint(tmp_path / "empty").problems[0]


def test_cli_verify(tmp_path: Path, good: Path, flipped: tuple, capsys) -> None:
    assert main(["ckpt", "verify", str(good)]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith(f"ok: {good} (zip, ")
    assert main(["ckpt", "verify", str(flipped[0])]) == 1
    out = capsys.readouterr().out.strip().splitlines()
    assert "fails its CRC-32 check" in out[0] and out[-1].startswith("corrupt: ")
    assert main(["ckpt", "verify", str(flipped[0]), "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["ok"] is False and data["format"] == "zip" and len(data["problems"]) == 1
    assert main(["ckpt", "verify", str(tmp_path)]) == 1  # the directory: good + flipped
    assert main(["ckpt", "verify", str(tmp_path / "missing.pt")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("safetorch ckpt verify: no such file")


def test_report_summary_and_json() -> None:
    r = VerifyReport("x.pt", "zip", problems=["record 'a' is damaged"], records=2)
    assert r.summary() == "corrupt: x.pt: 1 problem (zip, 2 records, 0 bytes checked)"
    assert r.to_json()["ok"] is False
