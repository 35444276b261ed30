"""Integrity checks torch does not make: every zip record's CRC-32, every safetensors offset.

``torch.load`` (weights-only or not, mmap or not) never checks the CRC-32 its own zip writer
records for each archive member, and a flipped bit inside a storage loads silently as a wrong
weight. :func:`verify_file` reads every record of a ``torch.save`` zip to its end in 1 MiB
chunks (``zipfile`` compares the CRC-32 on the last read), so memory stays bounded whatever the
file's size; for a ``.safetensors`` file it checks the header against the file size (8-byte
length, a JSON object, every tensor's ``data_offsets`` in bounds, contiguous, non-overlapping,
covering the data section exactly, each ``numel * itemsize`` bytes). safetensors stores no
checksum, so its tensor bytes cannot be checked. :func:`verify_checkpoint` does the same for
every weights file of a directory or a shard index.

A zip's layout is checked first, so that ``zipfile`` (which verifies) and torch's reader (miniz,
which loads) see the same records: one end-of-central-directory record, its zip64 locator
pointing where ``zipfile`` looks, the central directory exactly where the end record says (no
prepended or inserted data: miniz does not allow for it, ``zipfile`` silently does), as many
entries as it counts, no two entries of one name, no two entries' bytes overlapping each other
or the central directory (:func:`zip_layout_problem`).

Files are opened through the checkpoint reader: regular files only, without blocking (a FIFO is
refused at once), names from an index resolved inside its directory.

Opt-in: ``st.load(path, verify=True)`` and ``safetorch ckpt verify PATH``.
"""

from __future__ import annotations

import dataclasses
import io
import os
import struct
import zipfile
import zlib
from typing import IO, Any, Dict, Iterator, List, Optional, Tuple, cast

from safetorch.checkpoint import _dcp, _formats, _reader
from safetorch.errors import CheckpointError, CheckpointFileObjectError

__all__ = ["VerifyReport", "verify_file", "verify_checkpoint", "check_file", "zip_layout_problem"]

CHUNK = 1 << 20  # bytes read per call while streaming a record
WEIGHT_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt", ".safetensors", ".distcp")
# Deflate cannot expand data more than ~1032:1; a record declaring more is corrupt (or a bomb),
# and is reported without being decompressed.
_MAX_DEFLATE_RATIO = 1032


@dataclasses.dataclass
class VerifyReport:
    """What :func:`verify_file` / :func:`verify_checkpoint` found.

    Attributes:
        path: the file or directory verified.
        format: ``"zip"``, ``"safetensors"``, ``"legacy"``, ``"distcp"``, ``"directory"``,
            ``"dcp"`` (a directory with DCP ``.metadata``), ``"index"`` or ``"unknown"``.
        problems: one sentence per problem (empty when ``ok``); in a directory report each is
            prefixed with the file's name.
        bytes_checked: bytes whose integrity was checked (record data, headers).
        records: zip records (or safetensors tensors) checked.
        skipped: what could not be checked, and why (no checksum in that format, ...).
        files: for a directory or index, one report per file.

    >>> import io, torch
    >>> buf = io.BytesIO(); torch.save({"w": torch.ones(2)}, buf)
    >>> report = verify_file(buf)
    >>> report.ok, report.format, report.problems
    (True, 'zip', [])
    """

    path: str
    format: str
    problems: List[str] = dataclasses.field(default_factory=list)
    bytes_checked: int = 0
    records: int = 0
    skipped: List[str] = dataclasses.field(default_factory=list)
    files: List["VerifyReport"] = dataclasses.field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when no problem was found."""
        return not self.problems

    def summary(self) -> str:
        """One line: ``ok: ...`` or ``corrupt: ...`` with counts.

        >>> VerifyReport("m.pt", "zip", records=3, bytes_checked=2048).summary()
        'ok: m.pt (zip, 3 records, 2048 bytes checked)'
        """
        many = self.format in ("directory", "dcp", "index")
        what = f"{len(self.files)} files, " if many else ""
        unit = "tensors" if self.format == "safetensors" else "records"
        detail = f"{self.format}, {what}{self.records} {unit}, {self.bytes_checked} bytes checked"
        if self.skipped:
            detail += f", {len(self.skipped)} not checkable"
        if self.ok:
            return f"ok: {self.path} ({detail})"
        n = len(self.problems)
        return f"corrupt: {self.path}: {n} problem{'s' if n != 1 else ''} ({detail})"

    def to_json(self) -> Dict[str, Any]:
        """A JSON-ready dict (``ok`` included).

        >>> VerifyReport("m.pt", "zip").to_json()["ok"]
        True
        """
        out = dataclasses.asdict(self)
        out["ok"] = self.ok
        out["files"] = [f.to_json() for f in self.files]
        return out


class _Span:
    """A seekable binary file object seen as the reader's RegularFile (path, size, pread)."""

    def __init__(self, fh: IO[bytes], path: str, size: int) -> None:
        self.fh, self.path, self.size, self.what = fh, path, size, "checkpoint"
        self.identity = (0, 0, size, 0)

    def pread(self, n: int, offset: int) -> bytes:
        if n < 0 or offset < 0 or offset + n > self.size:
            raise CheckpointError(
                f"{self.path!r}: bytes {offset}..{offset + n} lie outside the file "
                f"({self.size} bytes); it is truncated or corrupt"
            )
        self.fh.seek(offset)
        data = self.fh.read(n)
        if len(data) != n:
            raise CheckpointError(f"{self.path!r} is truncated ({offset + len(data)} bytes)")
        return data


def _display(f: Any) -> str:
    name = getattr(f, "name", None)
    return name if isinstance(name, str) else f"<{type(f).__name__}>"


def verify_file(f: Any) -> VerifyReport:
    """Check one checkpoint file's integrity without loading it (bounded memory).

    A ``torch.save`` zip: every record is read to its end and its CRC-32 compared with the one
    the archive records (records written with ``torch.serialization.set_crc32_options(False)``
    carry none and are listed in ``skipped``). A ``.safetensors`` file: the header is checked
    against the file size. A legacy (pre-1.6) pickle has no checksum: ``skipped`` says so.

    Args:
        f: a path, or a seekable binary file object (its position is restored).

    Returns:
        A :class:`VerifyReport`; ``ok`` is False when a problem was found.

    Raises:
        CheckpointError: the path does not exist (also a FileNotFoundError), is not a regular
            file (a FIFO, a device, a directory: refused without blocking) or cannot be read.
        TypeError: ``f`` is neither a path nor a binary file object.

    >>> import io, torch
    >>> buf = io.BytesIO(); torch.save({"w": torch.arange(4.0)}, buf)
    >>> data = bytearray(buf.getvalue()); at = data.index(torch.arange(4.0).numpy().tobytes())
    >>> data[at + 5] ^= 0xFF   # one flipped byte inside the storage record
    >>> verify_file(io.BytesIO(bytes(data))).problems  # doctest: +ELLIPSIS
    ["record '.../data/0' fails its CRC-32 check: the file is corrupt"]
    """
    if _formats.is_path(f):
        with _reader.open_regular(f, "checkpoint") as rf:
            return _verify_open(rf.fh, rf.path, rf.size, rf, by_name=True)
    if not callable(getattr(f, "read", None)):
        raise TypeError(
            f"verify_file: f must be a path or a binary file object, got {type(f).__name__}"
        )
    if not (callable(getattr(f, "seek", None)) and callable(getattr(f, "tell", None))):
        raise CheckpointFileObjectError(
            f"cannot verify {_display(f)}: the file object cannot seek; verify needs to read its "
            "records in place (pre-load it into io.BytesIO)"
        )
    start = f.tell()
    try:
        size = f.seek(0, io.SEEK_END)
        f.seek(0)
        name = _display(f)
        return _verify_open(f, name, size, _Span(f, name, size), by_name=False)
    finally:
        f.seek(start)


def check_file(f: Any) -> None:
    """Raise :class:`~safetorch.errors.CheckpointError` naming the file and its first problem
    (what ``st.load(f, verify=True)`` runs before loading); return None for a sound file.

    >>> import io, torch
    >>> buf = io.BytesIO(); torch.save({"w": torch.ones(2)}, buf)
    >>> check_file(buf) is None
    True
    """
    report = verify_file(f)
    if not report.ok:
        more = len(report.problems) - 1
        extra = f" (and {more} more problem{'s' if more != 1 else ''})" if more else ""
        raise CheckpointError(
            f"cannot load checkpoint {report.path!r}: {report.problems[0]}{extra}; nothing "
            "was loaded"
        )


def _verify_open(fh: IO[bytes], path: str, size: int, span: Any, by_name: bool) -> VerifyReport:
    fh.seek(0)
    head = fh.read(_formats.HEAD_BYTES)
    kind = _formats.sniff(path if by_name and path.endswith(".safetensors") else io.BytesIO(head))
    report = VerifyReport(path, kind if kind in ("zip", "safetensors") else "legacy")
    if kind == "empty":
        report.format = "unknown"
        report.problems.append("the file is empty")
    elif kind == "zip":
        _verify_zip(fh, size, report)
    elif kind == "safetensors":
        _verify_safetensors(span, report)
    elif by_name and path.endswith(".distcp"):
        report.format = "distcp"
        report.skipped.append(
            "a DCP shard (.distcp) carries no checksum of its own; its items are checked "
            "against .metadata when they are loaded"
        )
    elif kind == "tar" or head[:1] == b"\x80":
        report.skipped.append(
            "legacy (pre-1.6 torch.save) format: it records no checksum; only its structure "
            "is checked when it is loaded"
        )
    else:
        report.format = "unknown"
        report.problems.append(
            f"not a PyTorch or safetensors checkpoint (it starts with {head[:8]!r})"
        )
    return report


def _verify_zip(fh: IO[bytes], size: int, report: VerifyReport) -> None:
    layout = zip_layout_problem(fh, size)
    if layout is not None:
        report.problems.append(
            f"its zip structure is ambiguous or broken: {layout}; torch's reader and Python's "
            "zipfile could load different records from it (a corrupt or crafted file)"
        )
        return
    fh.seek(0)
    try:
        archive = zipfile.ZipFile(fh)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError, ValueError) as exc:
        report.problems.append(
            f"its zip directory is unreadable ({exc}): the file is truncated or corrupt"
        )
        return
    with archive:
        for info in archive.infolist():
            if info.is_dir():
                continue
            report.records += 1
            problem = _check_record(archive, info)
            if problem is None:
                report.bytes_checked += info.file_size
            elif problem.startswith("no CRC-32"):
                report.skipped.append(f"record {info.filename!r}: {problem}")
            else:
                report.problems.append(f"record {info.filename!r} {problem}")
        if not archive.infolist():
            report.problems.append("the zip archive holds no records")


# --- zip layout: the records torch's reader (miniz) finds are the ones zipfile checks -----------
_EOCD, _EOCD_SIZE = b"PK\x05\x06", 22
_Z64_LOCATOR, _Z64_LOCATOR_SIZE = b"PK\x06\x07", 20
_Z64_EOCD, _Z64_EOCD_SIZE = b"PK\x06\x06", 56
_CDIR, _CDIR_SIZE = b"PK\x01\x02", 46
_LOCAL, _LOCAL_SIZE = b"PK\x03\x04", 30
_TAIL = _EOCD_SIZE + 0xFFFF  # where readers search for the end record (a maximal comment)


class _Ambiguous(Exception):
    """A zip layout two readers may read differently (the message says how)."""


def _at(fh: IO[bytes], size: int, offset: int, n: int, what: str) -> bytes:
    if offset < 0 or offset + n > size:
        raise _Ambiguous(
            f"{what} at byte {offset} lies outside the file ({size} bytes): the file is "
            "truncated or corrupt"
        )
    fh.seek(offset)
    data = fh.read(n)
    if len(data) != n:
        raise _Ambiguous(f"{what} at byte {offset} is cut short")
    return data


def _z64_field(extra: bytes, wanted: List[bool], what: str) -> List[int]:
    """The zip64 extended-information values (``0x0001`` extra field) of the fields marked in
    ``wanted`` (uncompressed size, compressed size, local header offset), in order."""
    pos = 0
    while pos + 4 <= len(extra):
        tag, n = struct.unpack_from("<HH", extra, pos)
        if tag == 1:
            need = 8 * sum(wanted)
            if n < need:
                raise _Ambiguous(f"{what}: its zip64 extra field is too short")
            return list(struct.unpack_from(f"<{sum(wanted)}Q", extra, pos + 4))
        pos += 4 + n
    raise _Ambiguous(f"{what}: a 0xFFFFFFFF size or offset without its zip64 extra field")


def zip_layout_problem(fh: IO[bytes], size: int) -> Optional[str]:
    """Why the zip archive in ``fh`` (``size`` bytes) could be read as different records by
    torch's reader (miniz) and Python's ``zipfile``, or ``None`` when its layout is unambiguous.

    Refused: more than one end-of-central-directory signature where readers search for it (the
    last 64 KiB, outside record data) or bytes after it; a zip64 locator that does not point at
    the zip64 record just before it, or zip64 values the 32-bit record contradicts; a central
    directory that is not where the end record says (data prepended or inserted: ``zipfile``
    shifts every offset by the difference, miniz does not); an entry count the directory does
    not hold; two entries of one name; entries whose bytes (local header to data end) overlap
    each other or the central directory, or data before the first entry.

    >>> import io, torch
    >>> buf = io.BytesIO(); torch.save({"w": torch.ones(2)}, buf)
    >>> zip_layout_problem(buf, len(buf.getvalue())) is None
    True
    >>> data = b"junk" + buf.getvalue()
    >>> zip_layout_problem(io.BytesIO(data), len(data))  # doctest: +ELLIPSIS
    'the zip64 locator points at byte ..., not at the zip64 record just before it (byte ...'
    """
    try:
        _check_zip_layout(fh, size)
    except _Ambiguous as exc:
        return str(exc)
    return None


def _check_zip_layout(fh: IO[bytes], size: int) -> None:
    start = max(0, size - _TAIL)
    tail = _at(fh, size, start, size - start, "the archive's end")
    eocd = tail.rfind(_EOCD, 0, max(0, len(tail) - _EOCD_SIZE + 4))  # miniz's pick: the last
    if eocd < 0:
        return  # no archive at all: zipfile reports it (truncated or not a zip)
    eocd_at = start + eocd
    (_, disk, cd_disk, n_disk, n, cd_size, cd_at, comment) = struct.unpack_from(
        "<4sHHHHIIH", tail, eocd
    )
    if eocd_at + _EOCD_SIZE + comment != size:
        raise _Ambiguous(
            f"the end record at byte {eocd_at} declares a {comment}-byte comment, but "
            f"{size - eocd_at - _EOCD_SIZE} bytes follow it"
        )
    if disk or cd_disk or n_disk != n:
        raise _Ambiguous("the end record describes a multi-disk archive")
    cd_end = eocd_at  # where the central directory must end
    if eocd_at >= _Z64_LOCATOR_SIZE and _at(fh, size, eocd_at - 20, 4, "") == _Z64_LOCATOR:
        _, z_disk, z_at, z_disks = struct.unpack(
            "<4sIQI", _at(fh, size, eocd_at - 20, 20, "the zip64 locator")
        )
        expected = eocd_at - _Z64_LOCATOR_SIZE - _Z64_EOCD_SIZE
        if z_at != expected or z_disk or z_disks > 1:
            raise _Ambiguous(
                f"the zip64 locator points at byte {z_at}, not at the zip64 record just "
                f"before it (byte {expected}): data was prepended or inserted, and readers "
                "would use different zip64 records"
            )
        record = _at(fh, size, z_at, _Z64_EOCD_SIZE, "the zip64 end record")
        fields = struct.unpack("<4sQHHIIQQQQ", record)
        (sig, rest, _, _, z_disk, z_cd_disk, z_n_disk, z_n, z_cd_size, z_cd_at) = fields
        if sig != _Z64_EOCD or rest != _Z64_EOCD_SIZE - 12 or z_disk or z_cd_disk:
            raise _Ambiguous(f"the zip64 end record at byte {z_at} is malformed")
        for label, small, big, full in (
            ("entry count", n, z_n, 0xFFFF),
            ("entry count", n_disk, z_n_disk, 0xFFFF),
            ("directory size", cd_size, z_cd_size, 0xFFFFFFFF),
            ("directory offset", cd_at, z_cd_at, 0xFFFFFFFF),
        ):
            if small not in (big, full):
                raise _Ambiguous(
                    f"the end record's {label} ({small}) contradicts its zip64 record's ({big})"
                )
        n, cd_size, cd_at, cd_end = z_n, z_cd_size, z_cd_at, z_at
    if cd_at + cd_size != cd_end:
        raise _Ambiguous(
            f"the central directory is not where the end record says (it ends at byte "
            f"{cd_at + cd_size}, the end records start at byte {cd_end}): data was prepended "
            "or inserted, which zipfile allows for and torch's reader does not"
        )
    directory = _at(fh, size, cd_at, cd_size, "the central directory")
    pos, names, spans = 0, set(), []
    for i in range(n):
        if directory[pos : pos + 4] != _CDIR or pos + _CDIR_SIZE > cd_size:
            raise _Ambiguous(f"the end record counts {n} entries, the central directory holds {i}")
        entry = struct.unpack_from("<4sHHHHHHIIIHHHHHII", directory, pos)
        flags, csize, usize, nlen, xlen, clen, off = (entry[k] for k in (3, 8, 9, 10, 11, 12, 16))
        raw = directory[pos + _CDIR_SIZE : pos + _CDIR_SIZE + nlen]
        name = raw.decode("utf-8" if flags & 0x800 else "cp437", "replace")
        extra = directory[pos + _CDIR_SIZE + nlen : pos + _CDIR_SIZE + nlen + xlen]
        wanted = [usize == 0xFFFFFFFF, csize == 0xFFFFFFFF, off == 0xFFFFFFFF]
        if any(wanted):
            values = iter(_z64_field(extra, wanted, f"entry {name!r}"))
            usize, csize, off = (
                next(values) if w else v for w, v in zip(wanted, (usize, csize, off))
            )
        pos += _CDIR_SIZE + nlen + xlen + clen
        if pos > cd_size:
            raise _Ambiguous(f"entry {name!r} runs past the central directory")
        if name in names:
            raise _Ambiguous(f"two entries are named {name!r} (readers pick different ones)")
        names.add(name)
        local = _at(fh, size, off, _LOCAL_SIZE, f"the local header of {name!r}")
        if local[:4] != _LOCAL:
            raise _Ambiguous(f"entry {name!r} points at byte {off}, where no local header is")
        (lflags,), (lnlen, lxlen) = (
            struct.unpack_from("<H", local, 6),
            struct.unpack_from("<HH", local, 26),
        )
        end = off + _LOCAL_SIZE + lnlen + lxlen + csize + (12 if lflags & 0x8 else 0)
        spans.append((off, end, name))
    if pos != cd_size:
        raise _Ambiguous(
            f"the central directory holds {cd_size - pos} bytes after its {n} entries "
            "(more entries than the end record counts)"
        )
    spans.sort()
    if spans and spans[0][0] != 0:
        raise _Ambiguous(f"{spans[0][0]} bytes before the first entry's local header")
    for (_, end, name), (begin, _, after) in zip(spans, spans[1:]):
        if begin < end:
            raise _Ambiguous(f"entries {name!r} and {after!r} overlap")
    if spans and spans[-1][1] > cd_at:
        raise _Ambiguous(f"entry {spans[-1][2]!r} overlaps the central directory")
    # One end record: no other signature where readers search, outside the records' data.
    data = [(b + _LOCAL_SIZE, e) for b, e, _ in spans]
    for found in _all(tail, _EOCD):
        at = start + found
        if at != eocd_at and not any(b <= at and at + 4 <= e for b, e in data):
            raise _Ambiguous(
                f"a second end-of-central-directory signature at byte {at} (besides byte "
                f"{eocd_at}): readers may pick different ones"
            )


def _all(data: bytes, needle: bytes) -> Iterator[int]:
    at = data.find(needle)
    while at >= 0:
        yield at
        at = data.find(needle, at + 1)


def _check_record(archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> Optional[str]:
    if (
        info.compress_type != zipfile.ZIP_STORED
        and info.file_size > _MAX_DEFLATE_RATIO * info.compress_size + 1024
    ):
        return (
            f"declares {info.file_size} bytes from {info.compress_size} compressed, more than "
            "compression can produce: the file is corrupt"
        )
    read = 0
    try:
        with archive.open(info) as member:
            while True:
                chunk = member.read(CHUNK)
                if not chunk:
                    break
                read += len(chunk)
    except zipfile.BadZipFile as exc:
        if "CRC" in str(exc):
            if info.CRC == 0:
                return (
                    "no CRC-32 recorded (written with "
                    "torch.serialization.set_crc32_options(False)): not checked"
                )
            return "fails its CRC-32 check: the file is corrupt"
        return f"is damaged ({exc}): the file is corrupt"
    except EOFError:
        return (
            f"is truncated ({read} of its {info.file_size} bytes are there): the file is "
            "truncated or corrupt"
        )
    except (zlib.error, NotImplementedError, OSError, ValueError, RuntimeError) as exc:
        return f"cannot be read ({type(exc).__name__}: {exc}): the file is corrupt"
    if read != info.file_size:
        return f"holds {read} bytes, its header says {info.file_size}: the file is corrupt"
    return None


def _verify_safetensors(span: Any, report: VerifyReport) -> None:
    try:
        header = _reader.read_safetensors_header(cast(_reader.RegularFile, span))
    except CheckpointError as exc:
        text = str(exc)
        prefix = f"{span.path!r} is not a valid safetensors file: "
        report.problems.append(text[len(prefix) :] if text.startswith(prefix) else text)
        return
    report.records = len(header.entries)
    report.bytes_checked = header.data_start
    report.skipped.append("tensor data: safetensors stores no checksum, only offsets are checked")


# --- directories and shard indexes ------------------------------------------------------------
def _weights_files(directory: str) -> Tuple[List[str], List[str]]:
    """Weights files under ``directory`` (relative names, sorted), and the other files' names."""
    found: List[str] = []
    other: List[str] = []
    for top, dirs, names in os.walk(directory):  # never follows directory symlinks
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for n in sorted(names):
            rel = os.path.relpath(os.path.join(top, n), directory)
            (found if n.endswith(WEIGHT_SUFFIXES) else other).append(rel)
    return found, other


def _index_files(path: str) -> List[str]:
    index = _reader.read_json(path, "shard index", "an object with a 'weight_map'")
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise CheckpointError(
            f"shard index {path!r} has no 'weight_map' object of file names; expected "
            '{"weight_map": {"key": "model-00001-of-00002.safetensors", ...}}'
        )
    return sorted(set(weight_map.values()))


def _verify_dcp_metadata(directory: str, report: VerifyReport) -> None:
    """A DCP directory: ``.metadata`` read (restricted) and checked against its files, as a
    load checks it: every record inside its ``.distcp`` file, every tensor's chunks covering
    it. The ``.distcp`` bytes themselves carry no checksum."""
    report.format = "dcp"
    try:
        _dcp.dcp_metadata(directory)
    except CheckpointError as exc:
        report.problems.append(f".metadata: {' '.join(str(exc).split())}")
        return
    report.records += 1
    report.bytes_checked += os.path.getsize(os.path.join(directory, ".metadata"))


def verify_checkpoint(path: Any) -> VerifyReport:
    """Verify a checkpoint file, every weights file of a directory, or the shards of an index.

    A directory is walked (hidden folders and directory symlinks left out) for ``*.pt``,
    ``*.pth``, ``*.bin``, ``*.ckpt``, ``*.safetensors`` and ``*.distcp``; a
    ``*.index.json`` names its shards (resolved inside its directory, never outside). Each file
    is checked as :func:`verify_file` does; a file that cannot be opened is a problem. A DCP
    directory's ``.metadata`` is read (restricted) and checked against its ``.distcp`` files as
    a load checks it (their bytes carry no checksum and are listed in ``skipped``).

    Args:
        path: a file, a directory or a shard index.

    Returns:
        A :class:`VerifyReport` (for a directory or index: ``files`` holds one per file).

    Raises:
        CheckpointError: ``path`` does not exist, is not a regular file or directory, or an
            index is not valid JSON with a ``weight_map``.

    >>> import os, tempfile, torch
    >>> d = tempfile.mkdtemp(); torch.save({"w": torch.ones(2)}, os.path.join(d, "a.pt"))
    >>> r = verify_checkpoint(d)
    >>> r.ok, [os.path.basename(f.path) for f in r.files]
    (True, ['a.pt'])
    """
    text = os.fsdecode(os.fspath(path))
    if not os.path.isdir(text) and not text.endswith(".index.json"):
        return verify_file(text)
    if os.path.isdir(text):
        root = _reader.Root(text)
        names, others = _weights_files(text)
        report = VerifyReport(text, "directory")
        if ".metadata" in others:
            _verify_dcp_metadata(text, report)
        if not names:
            report.problems.append(
                "no weights file (" + ", ".join("*" + s for s in WEIGHT_SUFFIXES) + ") in it"
            )
    else:
        root = _reader.Root(os.path.dirname(os.path.abspath(text)))
        names = _index_files(text)
        report = VerifyReport(text, "index")
    for name in names:
        try:
            with root.open(name, "weights file") as rf:
                sub = _verify_open(rf.fh, rf.path, rf.size, rf, by_name=True)
            sub.path = name
        except CheckpointError as exc:
            sub = VerifyReport(name, "unknown", problems=[" ".join(str(exc).split())])
        report.files.append(sub)
        report.problems.extend(f"{name}: {p}" for p in sub.problems)
        report.skipped.extend(f"{name}: {s}" for s in sub.skipped)
        report.bytes_checked += sub.bytes_checked
        report.records += sub.records
    return report
