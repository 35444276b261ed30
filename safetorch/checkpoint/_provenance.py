"""Trust by provenance: the per-user ledger of checkpoint files safetorch may load fully.

A weights-only load refuses whole-model pickles, numpy arrays and custom objects. Such a file is
loaded fully (as ``torch.load(weights_only=False)`` loads a file its user trusts) only when the
SHA-256 of its bytes, with its size, is in this user's ledger, which holds it when

* safetorch itself wrote the file: ``st.save``, ``st.save_checkpoint``, ``st.CheckpointSaver``
  and the patched ``torch.save`` under ``st.patch()`` / ``safetorch run`` record the hash of
  what they write, computed while writing (a state dict, which loads weights-only anyway, is
  not hashed: it pays nothing);
* the user said so: ``safetorch trust FILE`` / ``st.trust(path)``, or ``safetorch run --trust
  FILE`` for one run (``SAFETORCH_TRUST``, inherited by child processes, never written down).

Nothing in the file decides it: the hash is computed over the bytes that are then unpickled (they
are read once, into memory; no window between check and use), so a changed file is untrusted.

The ledger is a directory, ``$XDG_STATE_HOME/safetorch`` (``~/.local/state/safetorch`` when
unset; ``%LOCALAPPDATA%\\safetorch`` on Windows), mode 0700, owned by the user: one empty file
``trusted/<size>/<sha256>`` per trusted file. No path, name or content of a file is stored. A
ledger directory that others can write to (or that is a symlink, or owned by someone else) is
never read from nor written to: a warning says how to repair it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import stat
import sys
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor
from typing import IO, Any, Iterator, List, NamedTuple, Optional, Tuple

from safetorch.errors import CheckpointWarning

__all__: List[str] = []  # private module: the public face is st.save / st.trust / st.load

RUN_ENV = "SAFETORCH_TRUST"  # one run's trusted files: "<size>:<sha256>,..." (safetorch run)
_HEX = re.compile(r"[0-9a-f]{64}")
_SIZE = re.compile(r"[0-9]{1,20}")  # ASCII digits only (str.isdigit takes "²")
_CHUNK = 8 << 20  # read and hash in 8 MiB pieces
_PARALLEL = 1 << 20  # hash a write this large beside the write itself (both release the GIL)


class Entry(NamedTuple):
    """A file's identity in the ledger: its size and the SHA-256 of its bytes."""

    size: int
    sha256: str

    def token(self) -> str:
        return f"{self.size}:{self.sha256}"


def state_dir() -> str:
    """The ledger directory (``XDG_STATE_HOME`` honoured; a relative value is ignored, as the
    XDG specification says)."""
    if sys.platform == "win32":  # pragma: no cover - exercised on Windows only
        base = os.environ.get("LOCALAPPDATA") or os.path.expanduser("~")
        return os.path.join(base, "safetorch")
    base = os.environ.get("XDG_STATE_HOME", "")
    if not os.path.isabs(base):
        base = os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "safetorch")


def _private(path: str, create: bool) -> Optional[str]:
    """``path`` as a private directory of this user (created 0700 when ``create``), else None
    after a warning saying why it is not used."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        if not create:
            return None
        try:
            os.makedirs(path, mode=0o700, exist_ok=True)
            info = os.lstat(path)
        except OSError as exc:
            _warn(f"cannot create the trust ledger {path!r} ({exc})")
            return None
    except OSError as exc:
        _warn(f"cannot read the trust ledger {path!r} ({exc})")
        return None
    problem = _not_private(info)
    if problem is not None:
        _warn(f"the trust ledger {path!r} is not used: {problem}")
        return None
    return path


def _not_private(info: os.stat_result) -> Optional[str]:
    """Why a directory's ``lstat`` is not a private directory of this user (None if it is)."""
    if not stat.S_ISDIR(info.st_mode):
        return "it is not a directory (a symlink or a file)"
    if hasattr(os, "geteuid") and info.st_uid != os.geteuid():
        return "it is owned by another user"
    if info.st_mode & 0o022:
        return f"others can write to it (mode {stat.filemode(info.st_mode)}); chmod 700 it"
    return None


def _levels(root: str, size: int) -> Tuple[str, str]:
    """The ledger's directories under ``root`` that hold the entries of one size."""
    trusted_dir = os.path.join(root, "trusted")
    return trusted_dir, os.path.join(trusted_dir, str(size))


def _levels_private(root: str, entry: Entry) -> bool:
    """Whether ``trusted/`` and ``trusted/<size>/`` under ``root`` are private directories of
    this user (each checked itself, never through a symlink); warns when one is not."""
    for level in _levels(root, entry.size):
        try:
            problem = _not_private(os.lstat(level))
        except FileNotFoundError:
            return False
        except OSError as exc:
            problem = str(exc)
        if problem is not None:
            _warn(f"the trust ledger directory {level!r} is not used: {problem}")
            return False
    return True


def _warn(message: str) -> None:
    warnings.warn(
        f"{message}. Files safetorch wrote are then not recorded as trusted, and st.load "
        "refuses whole-model files as any untrusted file",
        CheckpointWarning,
        stacklevel=3,
    )


def _entry_path(root: str, entry: Entry) -> str:
    return os.path.join(_levels(root, entry.size)[1], entry.sha256)


def record(entry: Entry) -> bool:
    """Add ``entry`` to the ledger; False (after a warning) when the ledger cannot be written."""
    root = _private(state_dir(), create=True)
    if root is None:
        return False
    path = _entry_path(root, entry)
    try:
        for level in _levels(root, entry.size):
            with contextlib.suppress(FileExistsError):
                os.mkdir(level, 0o700)
        if not _levels_private(root, entry):
            return False
        flags = os.O_WRONLY | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)
        os.close(os.open(path, flags, 0o600))
    except OSError as exc:
        _warn(f"cannot write to the trust ledger {root!r} ({exc})")
        return False
    note("recorded")
    return True


def forget(entry: Entry) -> bool:
    """Remove ``entry`` from the ledger; True if it was there."""
    root = _private(state_dir(), create=False)
    if root is None:
        return False
    try:
        os.unlink(_entry_path(root, entry))
    except FileNotFoundError:
        return False
    return True


def _run_entries() -> Tuple[Entry, ...]:
    out = []
    for token in os.environ.get(RUN_ENV, "").split(","):
        size, _, digest = token.strip().partition(":")
        if _SIZE.fullmatch(size) and _HEX.fullmatch(digest):
            out.append(Entry(int(size), digest))
    return tuple(out)


def may_hold(size: int) -> bool:
    """Whether any trusted file has this size (one ``stat``): else nothing needs hashing."""
    if any(e.size == size for e in _run_entries()):
        return True
    return os.path.isdir(_levels(state_dir(), size)[1])


def trusted(entry: Entry) -> Optional[str]:
    """How ``entry`` is trusted (``"this run"``, ``"the ledger"``), or None."""
    if entry in _run_entries():
        return "this run (safetorch run --trust)"
    root = _private(state_dir(), create=False)
    if root is None:
        return None
    try:
        info = os.lstat(_entry_path(root, entry))
    except OSError:
        return None
    if not stat.S_ISREG(info.st_mode) or not _levels_private(root, entry):
        return None
    return "the trust ledger"


# --- hashing while reading and writing -------------------------------------------------------
_pool_lock = threading.Lock()
_pool: Optional[ThreadPoolExecutor] = None


def _forget_pool() -> None:  # a forked child has no hashing thread: make a new pool there
    global _pool
    _pool = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


def _submit(fn: Any, data: Any) -> Any:
    """``fn(data)`` in the hashing thread (a future), or done here (None) where no thread can
    start: at interpreter shutdown (an atexit handler saving a checkpoint)."""
    try:
        return _hasher_pool().submit(fn, data)
    except RuntimeError:  # "cannot schedule new futures after (interpreter) shutdown"
        fn(data)
        return None


def _hasher_pool() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(1, thread_name_prefix="safetorch-hash")
        return _pool


class _Digest:
    """The SHA-256 of pieces in order, each large piece hashed in the hashing thread while the
    caller does its next read or write (hashlib and file I/O both release the GIL). ``add``
    waits for the previous piece first; ``wait`` before the caller lets a piece's memory go."""

    def __init__(self) -> None:
        self._sha = hashlib.sha256()
        self._pending: Any = None
        self.size = 0

    def add(self, piece: Any) -> None:
        self.wait()
        self.size += len(piece)
        if len(piece) >= _PARALLEL:
            self._pending = _submit(self._sha.update, piece)
        else:
            self._sha.update(piece)

    def wait(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def entry(self) -> Entry:
        self.wait()
        return Entry(self.size, self._sha.hexdigest())


def read_hashed(fh: IO[bytes]) -> Tuple[bytes, Entry]:
    """Read ``fh`` from its position to the end; return the bytes and their entry (each piece
    is hashed while the next is read)."""
    digest = _Digest()
    pieces: List[bytes] = []
    try:
        while True:
            piece = fh.read(_CHUNK)
            if not piece:
                break
            pieces.append(piece)
            digest.add(piece)
    finally:
        digest.wait()
    data = pieces[0] if len(pieces) == 1 else b"".join(pieces)
    return data, digest.entry()


def read_hashed_into(fh: IO[bytes], view: memoryview) -> Entry:
    """Fill the writable byte view ``view`` from ``fh`` and return the entry of those bytes.

    Each piece is hashed while the next is read, so the cost is about the larger of reading
    and hashing. A file shorter or longer than ``view`` raises ``OSError``.
    """
    digest = _Digest()
    size = len(view)
    try:
        while digest.size < size:
            off = digest.size
            n = fh.readinto(view[off : off + _CHUNK])  # type: ignore[attr-defined]  # a binary file
            if not n:
                raise OSError(f"the file ended after {off} of its {size} bytes")
            digest.add(view[off : off + n])
        if fh.read(1):
            raise OSError(f"the file grew beyond its {size} bytes while it was read")
    finally:
        digest.wait()
    return digest.entry()


def hash_file(fh: IO[bytes]) -> Entry:
    """The entry of ``fh``'s bytes from its position to the end, read in pieces (not kept)."""
    digest = _Digest()
    try:
        while True:
            piece = fh.read(_CHUNK)
            if not piece:
                return digest.entry()
            digest.add(piece)
    finally:
        digest.wait()


class HashingWriter:
    """A binary file-like writer over ``fh`` that hashes what passes through once ``start()``
    was called before the first write (``torch.save`` writes nothing before its pickle is
    complete). ``entry()`` is the hash of everything written, or None when hashing started late
    or never."""

    def __init__(self, fh: IO[bytes]) -> None:
        self._fh = fh
        self._digest: Optional[_Digest] = None
        self._written = 0
        self._late = False

    def start(self) -> None:
        if self._written:
            self._late = True
        elif self._digest is None:
            self._digest = _Digest()

    @property
    def late(self) -> bool:
        """Hashing was asked for after bytes had been written."""
        return self._late

    def write(self, data: Any) -> int:
        digest = self._digest
        if digest is None:
            n = self._fh.write(data)
        else:
            digest.add(data)  # a large piece is hashed while it is written
            try:
                n = self._fh.write(data)
            finally:
                digest.wait()  # torch's memoryview is valid only during this call
        self._written += len(data)
        return n

    def flush(self) -> None:
        self._fh.flush()

    def entry(self) -> Optional[Entry]:
        if self._digest is None or self._late:
            return None
        return self._digest.entry()


# --- what was trusted or recorded, for reports ----------------------------------------------
_local = threading.local()


@contextlib.contextmanager
def noting() -> Iterator[List[Tuple[str, str]]]:
    """Collect, in this thread, ``("loaded", how)`` for each file loaded fully by provenance and
    ``("recorded", "")`` for each file recorded in the ledger inside the block."""
    seen: List[Tuple[str, str]] = []
    previous = getattr(_local, "seen", None)
    _local.seen = seen
    try:
        yield seen
    finally:
        _local.seen = previous


def note(event: str, detail: str = "") -> None:
    seen = getattr(_local, "seen", None)
    if seen is not None:
        seen.append((event, detail))
