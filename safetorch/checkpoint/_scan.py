"""The bounded global scanner: every global a ``torch.save`` file's pickles name, nothing run.

:func:`scan_pickle` walks the opcodes the restricted unpickler (:mod:`._unpickler`) knows,
without building anything, to name *every* unsafe global in a refusal. It keeps only what
``STACK_GLOBAL`` needs (the last two strings pushed, and memoized strings up to a cap), so its
memory does not grow with the opcode count, and it stops at the first opcode the unpickler would
refuse, at a byte budget or a deadline.
"""

from __future__ import annotations

import struct
import time
import zipfile
from typing import IO, Any, Dict, List, Optional, Tuple

from safetorch.checkpoint import _formats
from safetorch.checkpoint._unpickler import _LEN_PREFIXED, _NAMES, _normalize, _opname

__all__: List[str] = []  # private module

_STRING_OPS = frozenset({"BINUNICODE", "SHORT_BINUNICODE", "BINUNICODE8"})


class ScanResult:
    """What :func:`scan_pickle` saw: globals in order, and why it stopped."""

    __slots__ = ("globals", "complete", "refused", "torch_opcodes_only", "stopped", "more", "cap")

    def __init__(self, cap: int = 256) -> None:
        self.globals: List[str] = []
        self.cap = cap  # globals kept (a refusal names 256; st.trust shows up to 65,536)
        self.more = 0  # globals past the cap (not kept, only counted)
        self.complete = False  # reached STOP of every pickle scanned
        self.refused: Optional[str] = None  # the first opcode the unpickler would refuse
        self.torch_opcodes_only = True  # no opcode torch's own weights-only unpickler lacks
        self.stopped: Optional[str] = None  # budget / deadline / truncation

    def add(self, name: str) -> None:
        if name not in self.globals:
            if len(self.globals) < self.cap:
                self.globals.append(name)
            else:
                self.more += 1  # may count a repeated name again: "at least" this many


_ARG_LEN = {  # fixed-size arguments
    op: int(n)
    for op, n in (
        x.split("=")
        for x in "BININT=4 BININT1=1 BININT2=2 BINFLOAT=8 BINGET=1 LONG_BINGET=4 BINPUT=1 "
        "LONG_BINPUT=4 FRAME=8 PROTO=1".split()
    )
}
_NO_ARG = frozenset(
    "NEWOBJ REDUCE BUILD APPEND APPENDS SETITEM SETITEMS MARK TUPLE TUPLE1 TUPLE2 TUPLE3 NONE "
    "NEWFALSE NEWTRUE EMPTY_TUPLE EMPTY_LIST EMPTY_DICT EMPTY_SET BINPERSID ADDITEMS FROZENSET "
    "MEMOIZE STOP STACK_GLOBAL".split()
)
# Opcodes torch's own weights-only unpickler (torch 2.6+) supports; ours adds protocol 3-5
# conveniences (FRAME, MEMOIZE, STACK_GLOBAL, short strings, bytes, sets).
_TORCH_OPS = frozenset(
    "GLOBAL NEWOBJ REDUCE BUILD APPEND APPENDS SETITEM SETITEMS MARK TUPLE TUPLE1 TUPLE2 TUPLE3 "
    "NONE NEWFALSE NEWTRUE EMPTY_TUPLE EMPTY_LIST EMPTY_DICT EMPTY_SET BININT BININT1 BININT2 "
    "BINFLOAT BINUNICODE SHORT_BINSTRING BINPERSID BINGET LONG_BINGET BINPUT LONG_BINPUT LONG1 "
    "PROTO STOP".split()
)
_MEMO_STRINGS_CAP = 65536


def scan_pickle(
    stream: IO[bytes],
    result: ScanResult,
    *,
    byte_budget: int = 1 << 30,
    deadline: Optional[float] = None,
) -> bool:
    """Record the globals of one pickle in ``stream`` into ``result``, executing nothing.

    Stops at STOP (returns True), or at the first refused opcode, truncation, the byte budget
    or the deadline (returns False and says why in ``result``). Memory stays bounded: the last
    two strings pushed and up to 65,536 memoized strings are all it keeps.
    """
    read = stream.read
    readline = stream.readline
    last: List[Any] = [None, None]  # the two most recent pushes, for STACK_GLOBAL
    memo_strings: Dict[int, str] = {}
    memo_count = 0
    used = 0
    ops = 0
    names = _NAMES
    while True:
        key = read(1)
        if not key:
            result.stopped = "the pickle data is truncated"
            return False
        used += 1
        ops += 1
        if ops & 0xFFFF == 0:
            if used > byte_budget:
                result.stopped = f"the pickle is larger than {byte_budget} bytes"
                return False
            if deadline is not None and time.monotonic() > deadline:
                result.stopped = "the scan ran out of time"
                return False
        name = names.get(key[0])
        if name is None or (
            name not in _TORCH_OPS
            and name not in _NO_ARG
            and name not in _LEN_PREFIXED
            and name not in _ARG_LEN
        ):
            result.refused = _opname(key[0])
            return False
        if name not in _TORCH_OPS:
            result.torch_opcodes_only = False
        pushed: Any = None
        if name == "STOP":
            result.complete = True
            return True
        if name in _ARG_LEN:
            n = _ARG_LEN[name]
            arg = read(n)
            used += n
            if len(arg) != n:
                result.stopped = "the pickle data is truncated"
                return False
            if name in ("BINPUT", "LONG_BINPUT"):
                index = arg[0] if n == 1 else struct.unpack("<I", arg)[0]
                if isinstance(last[1], str) and len(memo_strings) < _MEMO_STRINGS_CAP:
                    memo_strings[index] = last[1]
                continue  # PUT pushes nothing
            if name in ("BINGET", "LONG_BINGET"):
                pushed = memo_strings.get(arg[0] if n == 1 else struct.unpack("<I", arg)[0])
        elif name in _LEN_PREFIXED:
            size, fmt = _LEN_PREFIXED[name]
            raw = read(size)
            if len(raw) != size:
                result.stopped = "the pickle data is truncated"
                return False
            n = struct.unpack(fmt, raw)[0]
            if n < 0:
                result.refused = f"{name} with a negative length"
                return False
            if name in _STRING_OPS and n <= 4096:
                data = read(n)
                if len(data) != n:
                    result.stopped = "the pickle data is truncated"
                    return False
                pushed = data.decode("utf-8", "surrogatepass")
            else:
                skipped = _skip(stream, n)
                if skipped != n:
                    result.stopped = "the pickle data is truncated"
                    return False
            used += size + n
        elif name == "GLOBAL":
            module = readline(4096)
            attr = readline(4096)
            used += len(module) + len(attr)
            if not module.endswith(b"\n") or not attr.endswith(b"\n"):
                result.stopped = "the pickle data is truncated"
                return False
            result.add(
                _normalize(
                    module[:-1].decode("utf-8", "replace"), attr[:-1].decode("utf-8", "replace")
                )
            )
        elif name == "STACK_GLOBAL":
            if isinstance(last[0], str) and isinstance(last[1], str):
                result.add(_normalize(last[0], last[1]))
            else:
                result.refused = "STACK_GLOBAL with a computed name"
                return False
        elif name == "MEMOIZE":
            if isinstance(last[1], str) and len(memo_strings) < _MEMO_STRINGS_CAP:
                memo_strings[memo_count] = last[1]
            memo_count += 1
            continue
        last[0], last[1] = last[1], pushed


def _skip(stream: IO[bytes], n: int) -> int:
    """Skip ``n`` bytes of ``stream`` in bounded chunks; returns how many were there."""
    done = 0
    while done < n:
        chunk = stream.read(min(n - done, 1 << 20))
        if not chunk:
            break
        done += len(chunk)
    return done


def zip_record_prefix(names: List[str]) -> str:
    """The record prefix torch's PyTorchStreamReader uses: the first entry's top directory."""
    first = names[0] if names else ""
    return first.split("/", 1)[0] if "/" in first else ""


class _SeekableView:
    """A file object with read/seek/tell (all torch.load needs) seen through the full file API
    that ``zipfile`` expects (``seekable()``)."""

    def __init__(self, f: Any) -> None:
        self._f = f
        self.read = f.read
        self.seek = f.seek
        self.tell = f.tell

    def seekable(self) -> bool:
        return True


def seekable(f: Any) -> Any:
    """``f`` itself when it has ``seekable()``, else a view that adds it (for ``zipfile``)."""
    return f if callable(getattr(f, "seekable", None)) else _SeekableView(f)


def scan_archive(
    archive: zipfile.ZipFile,
    *,
    byte_budget: int = 1 << 30,
    seconds: float = 30.0,
    cap: int = 256,
) -> ScanResult:
    """Scan ``<record prefix>/data.pkl`` of an open torch.save zip archive, streamed."""
    result = ScanResult(cap)
    try:
        names = archive.namelist()
        member = f"{zip_record_prefix(names)}/data.pkl"
        if member not in names:
            result.stopped = "the archive has no data.pkl"
            return result
        with archive.open(member) as pkl:
            scan_pickle(pkl, result, byte_budget=byte_budget, deadline=time.monotonic() + seconds)
    except Exception as exc:  # BadZipFile (CRC, headers), OSError, ...
        result.complete = False
        result.stopped = f"the zip archive is damaged ({type(exc).__name__}: {exc})"
    return result


def scan_file(
    source: Any, *, byte_budget: int = 1 << 30, seconds: float = 30.0, cap: int = 256
) -> ScanResult:
    """Scan the pickle(s) of a ``torch.save`` file that torch itself would read.

    Zip format: only ``<record prefix>/data.pkl``, streamed (nothing else is decompressed).
    Legacy format: the magic number, protocol, system info, object and storage-key pickles.
    """
    result = ScanResult(cap)
    deadline = time.monotonic() + seconds
    opened: Optional[IO[bytes]] = None
    if isinstance(source, (str, bytes)) or hasattr(source, "__fspath__"):
        opened = open(source, "rb")  # noqa: SIM115 - closed below
        stream: IO[bytes] = opened
    else:
        stream = source
    try:
        start = stream.tell()
        if _formats.sniff(stream) == "zip":  # reads the head, restores the position
            try:
                with zipfile.ZipFile(seekable(stream)) as archive:
                    result = scan_archive(
                        archive, byte_budget=byte_budget, seconds=seconds, cap=cap
                    )
            except Exception as exc:  # BadZipFile, OSError, OverflowError (3.9), ...
                result.complete = False
                result.stopped = f"the zip archive is damaged ({type(exc).__name__}: {exc})"
        else:
            for _ in range(5):
                if not scan_pickle(stream, result, byte_budget=byte_budget, deadline=deadline):
                    break
                result.complete = False  # complete only once all five pickles ended
            else:
                result.complete = True
        stream.seek(start)
    finally:
        if opened is not None:
            opened.close()
    return result


def scan_globals(source: Any) -> Tuple[List[str], bool]:
    """Every global the pickles of a ``torch.save`` file reference, executing nothing.

    Returns:
        ``(names, complete)``: ``"module.Name"`` strings in file order without duplicates,
        and whether the scan reached the end of every pickle without a refused opcode.
    """
    result = scan_file(source)
    return list(result.globals), result.complete
