"""``verify=`` agrees with torch's zip reader on which records a file holds (issue "Trust a
checkpoint for where it came from", item 7).

Python's ``zipfile`` (which ``verify`` reads) and torch's reader (miniz, which ``torch.load``
reads) resolve an archive differently where its layout is ambiguous: ``zipfile`` allows for data
prepended to an archive (it shifts every offset), miniz takes the offsets as written and follows
the zip64 locator; ``zipfile`` reads the central directory by size, miniz by entry count; of
two entries of one name, ``zipfile`` reads the last and torch's reader, depending on the release,
the last or the first. Each archive here is built from ``torch.save``
bytes, loaded side by side with ``torch.load(path, weights_only=True)``, and refused by verify.
"""

from __future__ import annotations

import io
import struct
import warnings
import zipfile
from pathlib import Path
from typing import List, Optional, Tuple

import pytest
import torch

import safetorch as st
from safetorch._cli import main
from safetorch.checkpoint.verify import check_file, verify_file
from safetorch.errors import CheckpointError

GOOD, EVIL = torch.ones(4), torch.full((4,), 666.0)
PAD = b"PK\x03\x04" + b"\x00" * 60  # prepended bytes that still sniff as a zip
Record = Tuple[bytes, bytes]  # (local header + data + descriptor, central directory entry)


def _saved(value: torch.Tensor) -> bytes:
    buf = io.BytesIO()
    torch.save({"w": value}, buf)
    return buf.getvalue()


def _records(data: bytes) -> List[Record]:
    """A torch.save zip's records in file order: its local blob and its central entry."""
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        infos = sorted(z.infolist(), key=lambda i: i.header_offset)
        start_dir = z.start_dir
    out: List[Record] = []
    pos = start_dir
    for k, info in enumerate(infos):
        end = infos[k + 1].header_offset if k + 1 < len(infos) else start_dir
        n, m, c = struct.unpack_from("<HHH", data, pos + 28)
        out.append((data[info.header_offset : end], data[pos : pos + 46 + n + m + c]))
        pos += 46 + n + m + c
    return out


def _entry(record: Record, offset: int, comment: bytes = b"") -> bytes:
    cd = bytearray(record[1])
    struct.pack_into("<I", cd, 42, offset)
    n, m, c = struct.unpack_from("<HHH", cd, 28)
    struct.pack_into("<H", cd, 32, len(comment))
    return bytes(cd[: 46 + n + m]) + comment


def _tail(cd_at: int, entries: List[bytes], count: Optional[int] = None, z64_count=None) -> bytes:
    """Central directory, zip64 end record, its locator and the end record, as torch writes."""
    cd = b"".join(entries)
    n = len(entries) if count is None else count
    z_n = n if z64_count is None else z64_count
    z_at = cd_at + len(cd)
    z64 = struct.pack("<4sQHHIIQQQQ", b"PK\x06\x06", 44, 45, 45, 0, 0, z_n, z_n, len(cd), cd_at)
    locator = struct.pack("<4sIQI", b"PK\x06\x07", 0, z_at, 1)
    eocd = struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, n, n, len(cd), cd_at, 0)
    return cd + z64 + locator + eocd


def _compose(records: List[Record], **kw) -> bytes:
    """The records laid out one after the other, with a central directory naming each."""
    body, entries = b"", []
    for rec in records:
        entries.append(_entry(rec, len(body)))
        body += rec[0]
    return body + _tail(len(body), entries, **kw)


def _storage(records: List[Record]) -> int:
    return next(i for i, r in enumerate(records) if r[1][46:].split(b"\x00")[0].endswith(b"/0"))


def _stored(name: str, payload: bytes) -> Record:
    """A stored record (local blob, central entry) of ``payload`` as zipfile writes it."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        z.writestr(name, payload)
    return _records(buf.getvalue())[0]


def _torch_sees(path: Path) -> object:
    try:
        with warnings.catch_warnings():
            # torch's own TypedStorage use warns in some 2.x loaders (2.1.2's), once per process
            warnings.filterwarnings("ignore", "TypedStorage is deprecated", UserWarning)
            return torch.load(path, weights_only=True)["w"]
    except Exception as exc:  # noqa: BLE001 - what torch does is the point
        return type(exc)


def _zipfile_sees(data: bytes) -> torch.Tensor:
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        name = next(n for n in z.namelist() if n.endswith("data/0"))
        return torch.frombuffer(bytearray(z.read(name)), dtype=torch.float32)


def _refused(path: Path, *words: str) -> str:
    report = verify_file(path)
    assert not report.ok and report.format == "zip"
    text = report.problems[0]
    assert "ambiguous or broken" in text, text
    for word in words:
        assert word in text, text
    with pytest.raises(CheckpointError) as info:
        st.load(path, verify=True)
    assert str(path) in str(info.value) and "nothing was loaded" in str(info.value)
    with pytest.raises(CheckpointError):
        check_file(io.BytesIO(path.read_bytes()))  # the same verdict on a file object
    return text


def _write(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def test_two_central_directories_torch_loads_one_zipfile_checks_the_other(tmp_path: Path) -> None:
    good, evil = _saved(GOOD), _saved(EVIL)
    data = evil[: evil.rindex(b"PK\x06\x06")] + good  # evil records + directory, then good
    path = _write(tmp_path, "twocd.pt", data)
    assert torch.equal(_torch_sees(path), EVIL)  # torch follows the end record's offset
    assert torch.equal(_zipfile_sees(data), GOOD)  # zipfile the directory before the end record
    _refused(path, "zip64 locator")


def test_a_zip64_locator_pointing_at_another_zip64_record(tmp_path: Path) -> None:
    good, evil = _saved(GOOD), _saved(EVIL)
    data = evil[: evil.rindex(b"PK\x05\x06")] + good  # the locator now hits evil's zip64 record
    path = _write(tmp_path, "z64.pt", data)
    assert torch.equal(_torch_sees(path), EVIL)
    assert torch.equal(_zipfile_sees(data), GOOD)
    _refused(path, "zip64 locator")


def test_prepended_data_zipfile_allows_for_and_torch_does_not(tmp_path: Path) -> None:
    data = PAD + _saved(GOOD)
    path = _write(tmp_path, "prepend.pt", data)
    assert _torch_sees(path) is not None and not isinstance(_torch_sees(path), torch.Tensor)
    assert torch.equal(_zipfile_sees(data), GOOD)
    _refused(path, "prepended")


def test_prepended_data_with_a_consistent_zip64_locator(tmp_path: Path) -> None:
    good = bytearray(PAD + _saved(GOOD))
    loc = good.rindex(b"PK\x06\x07")
    struct.pack_into("<Q", good, loc + 8, loc - 56)  # the locator fixed: only the offsets shift
    data = bytes(good)
    path = _write(tmp_path, "prepend64.pt", data)
    assert not isinstance(_torch_sees(path), torch.Tensor)
    assert torch.equal(_zipfile_sees(data), GOOD)
    _refused(path, "central directory is not where the end record says", "prepended")


def test_two_entries_of_one_name(tmp_path: Path) -> None:
    records = _records(_saved(GOOD))
    evil = _records(_saved(EVIL))[_storage(records)]
    data = _compose([*records, evil])  # data/0 twice: the good record first, the evil one last
    path = _write(tmp_path, "dup.pt", data)
    seen = _torch_sees(path)
    assert isinstance(seen, torch.Tensor)
    assert torch.equal(_zipfile_sees(data), EVIL)  # zipfile: the last entry of a name
    # torch's reader picks one of them, which one depends on the release (measured: 2.1.2 reads
    # the last, as zipfile does; 2.13 the first): the name does not say which bytes load
    assert torch.equal(seen, GOOD) or torch.equal(seen, EVIL)
    # without verify=, st.load reads the record torch's own loader reads on this release
    assert torch.equal(st.load(path)["w"], seen)
    assert verify_file(_write(tmp_path, "ok.pt", _compose(records))).ok  # the composer is sound
    _refused(path, "two entries are named")


def test_an_end_record_counting_fewer_entries_than_the_directory_holds(tmp_path: Path) -> None:
    records = _records(_saved(GOOD))
    evil = _records(_saved(EVIL))[_storage(records)]
    data = _compose([*records, evil], count=len(records), z64_count=len(records))
    path = _write(tmp_path, "count.pt", data)
    assert torch.equal(_torch_sees(path), GOOD)  # miniz reads the counted entries
    assert torch.equal(_zipfile_sees(data), EVIL)  # zipfile reads the directory to its size
    _refused(path, "more entries than the end record counts")


def test_zip64_and_32_bit_end_records_disagree_on_the_count(tmp_path: Path) -> None:
    records = _records(_saved(GOOD))
    data = _compose(records, count=len(records) - 1, z64_count=len(records))
    path = _write(tmp_path, "count32.pt", data)
    assert torch.equal(_torch_sees(path), GOOD)
    _refused(path, "contradicts its zip64 record")


def test_an_entry_hidden_inside_another_entrys_data(tmp_path: Path) -> None:
    records = _records(_saved(GOOD))
    k = _storage(records)
    evil = _records(_saved(EVIL))[k]
    carrier = _stored("archive/zz_padding", evil[0])  # a record whose bytes hold evil's record
    body, entries = b"", []
    for i, rec in enumerate(records):
        if i != k:
            entries.append(_entry(rec, len(body)))
            body += rec[0]
    inner = len(body) + 30 + len("archive/zz_padding")  # carrier's data: evil's local header
    entries += [_entry(carrier, len(body)), _entry(evil, inner)]
    body += carrier[0]
    data = body + _tail(len(body), entries)
    path = _write(tmp_path, "overlap.pt", data)
    assert torch.equal(_torch_sees(path), EVIL)
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        assert z.testzip() is None  # every CRC-32 holds
    _refused(path, "overlap")


def test_an_entry_hidden_in_the_central_directory(tmp_path: Path) -> None:
    records = _records(_saved(GOOD))
    k = _storage(records)
    evil = _records(_saved(EVIL))[k]
    body, entries = b"", []
    for i, rec in enumerate(records):
        if i != k:
            entries.append(_entry(rec, len(body)))
            body += rec[0]
    # evil's local record rides in the comment of the directory's first entry
    first = _entry(records[0], 0, comment=evil[0])
    n = struct.unpack_from("<H", first, 28)[0]
    entries[0] = first
    entries.append(_entry(evil, len(body) + 46 + n))
    data = body + _tail(len(body), entries)
    path = _write(tmp_path, "incd.pt", data)
    assert torch.equal(_torch_sees(path), EVIL)
    assert torch.equal(_zipfile_sees(data), EVIL)
    _refused(path, "overlaps the central directory")


def test_a_second_end_record_in_the_central_directory(tmp_path: Path) -> None:
    records = _records(_saved(GOOD))
    fake = struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, 1, 1, 46, 0, 0)
    body, entries = b"", []
    for rec in records:
        entries.append(_entry(rec, len(body), comment=fake if not entries else b""))
        body += rec[0]
    data = body + _tail(len(body), entries)
    path = _write(tmp_path, "twoeocd.pt", data)
    assert torch.equal(_torch_sees(path), GOOD)
    assert torch.equal(_zipfile_sees(data), GOOD)  # both take the last; another reader may not
    _refused(path, "second end-of-central-directory signature")


def test_bytes_after_the_end_record(tmp_path: Path) -> None:
    data = _saved(GOOD) + b"\x00" * 10
    path = _write(tmp_path, "trailing.pt", data)
    assert torch.equal(_torch_sees(path), GOOD)
    _refused(path, "10 bytes follow it")


def test_data_before_the_first_entry_with_offsets_fixed(tmp_path: Path) -> None:
    records = _records(_saved(GOOD))
    entries, body = [], PAD
    for rec in records:
        entries.append(_entry(rec, len(body)))
        body += rec[0]
    data = body + _tail(len(body), entries)
    path = _write(tmp_path, "gap.pt", data)
    _refused(path, "64 bytes before the first entry")


# --- what verified before still does ---------------------------------------------------------
def test_sound_files_verify_as_before(tmp_path: Path) -> None:
    plain = tmp_path / "plain.pt"
    torch.save({"w": torch.arange(10.0)}, plain)
    legacy = tmp_path / "legacy.pt"
    torch.save({"w": torch.arange(10.0)}, legacy, _use_new_zipfile_serialization=False)
    many = tmp_path / "many.pt"
    torch.save({f"k{i}": torch.randn(3) for i in range(300)}, many)
    for path, kind in ((plain, "zip"), (legacy, "legacy"), (many, "zip")):
        report = verify_file(path)
        assert report.ok and report.format == kind, report.problems
        check_file(path)
    pytest.importorskip("safetensors")
    from safetensors.torch import save_file

    sf = tmp_path / "m.safetensors"
    save_file({"w": torch.ones(3)}, str(sf))
    assert verify_file(sf).ok and verify_file(sf).format == "safetensors"


def test_end_record_bytes_inside_tensor_data_are_not_a_second_record(tmp_path: Path) -> None:
    payload = torch.frombuffer(
        bytearray(b"PK\x05\x06" * 256 + b"PK\x06\x07" * 16), dtype=torch.uint8
    )
    path = tmp_path / "sig.pt"
    torch.save({"w": payload.clone()}, path)
    assert b"PK\x05\x06" * 4 in path.read_bytes()
    assert verify_file(path).ok
    assert torch.equal(st.load(path, verify=True)["w"], payload)


def test_cli_verify_refuses_the_two_directory_archive(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    good, evil = _saved(GOOD), _saved(EVIL)
    path = _write(tmp_path, "twocd.pt", evil[: evil.rindex(b"PK\x06\x06")] + good)
    assert main(["ckpt", "verify", str(path)]) == 1
    out = capsys.readouterr().out
    assert "ambiguous or broken" in out and out.strip().splitlines()[-1].startswith("corrupt:")


def test_the_crc_check_still_runs_on_a_sound_layout(tmp_path: Path) -> None:
    records = _records(_saved(GOOD))
    k = _storage(records)
    blob = bytearray(records[k][0])
    at = blob.index(GOOD.numpy().tobytes())
    blob[at] ^= 0xFF
    records[k] = (bytes(blob), records[k][1])
    path = _write(tmp_path, "crc.pt", _compose(records))
    report = verify_file(path)
    assert report.problems and "CRC-32" in report.problems[0]
