"""The one reader: every file a checkpoint layout, ``st.load_state`` or ``safetorch ckpt`` opens.

A multi-file checkpoint names its own files (a shard index's ``weight_map``, DCP's
``relative_path``): those names are untrusted input. Every such file is opened here, and only
here, under one policy:

* **Inside the root.** A name is resolved inside the checkpoint's root directory: no absolute
  path, no drive, no ``..`` component, no NUL. Symlinks are followed only where their target
  stays inside the root, or, for a root inside a Hugging Face cache snapshot
  (``.../snapshots/<revision>/``), inside that repository's ``blobs/`` folder (the layout
  ``huggingface_hub`` writes and transformers reads). The path the user passed is theirs: it
  may itself be a symlink anywhere.
* **A regular file.** Opened without blocking (``O_NONBLOCK``) and checked with ``fstat``
  on the open descriptor: a FIFO, a socket, a device or a directory is refused at once
  instead of hanging or reading forever.
* **Bounded.** Metadata (DCP ``.metadata``, index JSON) is read up to a size limit and
  parsed once; the parsed form is handed on, never read again. A safetensors header is parsed
  and checked by the safetensors package itself, on the descriptor opened here.
* **The same file.** A file opened again later (a shard read after its header was checked)
  must be the one checked: same device, inode, size and modification time, else
  :class:`~safetorch.errors.CheckpointError` ("changed while it was being read").
* **Read, never mapped.** Tensor bytes are read with ``pread`` (short reads are a truncated
  file, a ``CheckpointError``), so a file truncated or rewritten during the call gives an
  error or the old bytes, never ``SIGBUS``.

>>> import os, tempfile
>>> root = Root(tempfile.mkdtemp())
>>> with open(os.path.join(root.path, "a.json"), "w") as fh:
...     _ = fh.write("{}")
>>> root.read("a.json", "index", limit=1024)
b'{}'
>>> try:
...     root.resolve("../etc/passwd", "shard")
... except CheckpointError as exc:
...     print(type(exc).__name__)
CheckpointError
"""

from __future__ import annotations

import io
import json
import math
import os
import stat
import warnings
from typing import IO, Any, Callable, Dict, List, Mapping, Optional, Tuple

import torch

from safetorch.checkpoint import _bytes
from safetorch.errors import CheckpointError, CheckpointFileNotFoundError

__all__: List[str] = []  # private: used by safetorch.checkpoint's layouts, state and cli

MAX_METADATA_BYTES = 1 << 30  # DCP .metadata: 1 GiB (a model of millions of tensors fits)
MAX_JSON_BYTES = 256 << 20  # an index or config JSON

_O_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
_O_FLAGS |= getattr(os, "O_BINARY", 0)

Identity = Tuple[int, int, int, int]


def file_kind(mode: int) -> str:
    """What a non-regular ``st_mode`` is, for errors ("a FIFO (named pipe)", ...)."""
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def identity(st: os.stat_result) -> Identity:
    """What makes an open file the one that was checked (device, inode, size, mtime)."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


class RegularFile:
    """An open regular file: ``fh`` (a buffered binary reader named by its path), ``size``,
    ``identity``; ``pread(n, offset)`` reads exactly ``n`` bytes or raises."""

    __slots__ = ("path", "what", "fh", "size", "identity")

    def __init__(self, path: str, what: str, expect: Optional[Identity] = None) -> None:
        self.path = path
        self.what = what
        try:
            fd = os.open(path, _O_FLAGS)
        except FileNotFoundError:
            raise CheckpointFileNotFoundError(f"{what} {path!r} does not exist") from None
        except OSError as exc:
            raise CheckpointError(f"cannot open {what} {path!r}: {exc.strerror or exc}") from exc
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise CheckpointError(
                    f"{what} {path!r} is {file_kind(st.st_mode)}, not a regular file; a checkpoint "
                    "is read only from regular files"
                )
            if expect is not None and identity(st) != expect:
                raise CheckpointError(
                    f"{what} {path!r} changed while the checkpoint was being read (its size, "
                    "inode or modification time differ from when it was checked); load it "
                    "again once nothing is writing it"
                )
            raw = io.FileIO(fd, "rb", closefd=True)
        except BaseException:
            os.close(fd)
            raise
        raw.name = path  # FileIO.name is writable (open() sets it so)
        self.fh: IO[bytes] = io.BufferedReader(raw)
        self.size = st.st_size
        self.identity = identity(st)

    def pread(self, n: int, offset: int) -> bytes:
        """Exactly ``n`` bytes at ``offset`` (a short read is a truncated file)."""
        if n < 0 or offset < 0 or offset + n > self.size:
            raise CheckpointError(
                f"{self.what} {self.path!r}: a record at bytes {offset}..{offset + n} lies "
                f"outside the file ({self.size} bytes); the checkpoint is truncated or corrupt"
            )
        fd = self.fh.fileno()
        parts: List[bytes] = []
        got = 0
        while got < n:
            chunk = os.pread(fd, min(n - got, 1 << 30), offset + got)
            if not chunk:
                raise CheckpointError(
                    f"{self.what} {self.path!r} was truncated while it was being read "
                    f"({offset + got} of the {offset + n} bytes needed are there)"
                )
            parts.append(chunk)
            got += len(chunk)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def readinto(self, dest: torch.Tensor, offset: int) -> None:
        """Fill the contiguous CPU tensor ``dest`` with its byte size from ``offset`` (a short
        read is a truncated file).

        The bytes go straight into ``dest``'s memory, so its autograd version counter is bumped
        as ``copy_`` would bump it: a graph that saved ``dest`` then refuses to backward
        through the changed values instead of using them silently.
        """
        if not dest.is_contiguous():
            raise ValueError("readinto needs a contiguous tensor")
        n = dest.numel() * dest.element_size()
        if n == 0:
            return
        if offset < 0 or offset + n > self.size:
            self.pread(n, offset)  # raises: the record lies outside the file
        with torch.no_grad():
            flat = dest.detach().reshape(-1).view(torch.uint8)
        view = _bytes.writable_view(flat)  # no numpy: torch does not require it
        fd = self.fh.fileno()
        got = 0
        workers = torch.get_num_threads()
        if n >= PARALLEL_BYTES and workers > 1 and hasattr(os, "preadv"):
            got = _parallel_preadv(fd, view, offset, workers)
            if got < n:
                self._truncated(offset, got, n)
        while got < n:
            if hasattr(os, "preadv"):
                k = os.preadv(fd, [view[got:]], offset + got)
            else:  # pragma: no cover - platforms without preadv (Windows)
                data = os.pread(fd, n - got, offset + got)
                view[got : got + len(data)] = data
                k = len(data)
            if k <= 0:
                self._truncated(offset, got, n)
            got += k
        with torch.no_grad():  # an in-place op on an empty view: the version bump, no work
            dest.view(-1)[:0].zero_()

    def _truncated(self, offset: int, got: int, n: int) -> None:
        raise CheckpointError(
            f"{self.what} {self.path!r} was truncated while it was being read "
            f"({offset + got} of the {offset + n} bytes needed are there); the model "
            "may hold part of it: load it again"
        )

    def read_all(self, limit: int) -> bytes:
        """The whole file, refusing one larger than ``limit`` bytes."""
        if self.size > limit:
            raise CheckpointError(
                f"{self.what} {self.path!r} is {self.size} bytes, more than the {limit} a "
                f"{self.what} may take; it is not a valid {self.what}"
            )
        data = self.fh.read(self.size + 1)  # never a buffer of `limit` bytes up front
        if len(data) > min(limit, self.size):
            raise CheckpointError(f"{self.what} {self.path!r} grew while it was being read")
        return data

    def close(self) -> None:
        self.fh.close()

    def __enter__(self) -> "RegularFile":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


# A large read is split over torch's intra-op threads, as torch's own copy_ out of a mapped file
# is: most of its time is the kernel faulting in fresh destination pages, which one thread does
# at about 2/3 of the speed of two (benchmarks/RESULTS.md). Below this size one preadv is as fast.
PARALLEL_BYTES = 64 << 20
PARALLEL_CHUNK = 16 << 20
_pool: Any = None
_pool_key: Tuple[int, int] = (0, 0)  # (pid, workers): a forked child has none of the threads


def _preadv_all(fd: int, view: memoryview, offset: int) -> int:
    """Read into ``view`` from ``offset`` until it is full or the file ends; the bytes read."""
    got = 0
    while got < len(view):
        k = os.preadv(fd, [view[got:]], offset + got)
        if k <= 0:
            break
        got += k
    return got


def _parallel_preadv(fd: int, view: memoryview, offset: int, workers: int) -> int:
    """``view`` filled from ``offset`` in chunks on ``workers`` threads (preadv releases the
    GIL); the bytes read before the first chunk the file ended in."""
    global _pool, _pool_key
    from concurrent.futures import ThreadPoolExecutor

    if _pool is None or _pool_key != (os.getpid(), workers):
        _pool = ThreadPoolExecutor(workers, thread_name_prefix="safetorch-read")
        _pool_key = (os.getpid(), workers)
    starts = range(0, len(view), PARALLEL_CHUNK)
    counts = list(
        _pool.map(lambda s: _preadv_all(fd, view[s : s + PARALLEL_CHUNK], offset + s), starts)
    )
    for start, count in zip(starts, counts):
        if count < min(PARALLEL_CHUNK, len(view) - start):
            return start + count
    return len(view)


def open_regular(path: Any, what: str, expect: Optional[Identity] = None) -> RegularFile:
    """Open ``path`` (the user's own path: symlinks followed) as a regular file, never blocking.

    >>> import tempfile
    >>> with open_regular(tempfile.mkstemp()[1], "checkpoint") as f:
    ...     f.size
    0
    """
    return RegularFile(os.fsdecode(os.fspath(path)), what, expect)


# A layout keeps at most this many files open for its load (a process has 1,024 descriptors by
# default); one of more files (20,000 shards) opens each where it reads it, checked to be the
# file it checked (``expect``).
MAX_KEPT_OPEN = 256


def open_all(openers: Mapping[str, Callable[[], RegularFile]]) -> Dict[str, RegularFile]:
    """Every file of ``openers`` (name -> how to open it) opened, or none: a failure closes
    the ones already open before it propagates. More than :data:`MAX_KEPT_OPEN` files: none
    is kept open (an empty dict), each is opened where it is read."""
    opened: Dict[str, RegularFile] = {}
    if len(openers) > MAX_KEPT_OPEN:
        return opened
    try:
        for name, opener in openers.items():
            opened[name] = opener()
    except BaseException:
        for f in opened.values():
            f.close()
        raise
    return opened


def _within(path: str, root: str) -> bool:
    try:
        return os.path.commonpath([path, root]) == root
    except ValueError:  # different drives
        return False


class Root:
    """A checkpoint's root directory, inside which the names the checkpoint holds resolve."""

    def __init__(self, directory: Any) -> None:
        self.path = os.path.abspath(os.fsdecode(os.fspath(directory)))
        self.real = os.path.realpath(self.path)
        self.allowed = [self.real]
        # huggingface_hub's cache: <repo>/snapshots/<revision>/<file> -> ../../blobs/<hash>
        parent = os.path.dirname(self.real)
        if os.path.basename(parent) == "snapshots":
            self.allowed.append(os.path.join(os.path.dirname(parent), "blobs"))

    def resolve(self, name: Any, what: str) -> str:
        """The real path of ``name`` inside the root; a ``CheckpointError`` for any name that
        would leave it (absolute, ``..``, a symlink pointing outside)."""
        if not isinstance(name, str) or not name or "\x00" in name:
            raise CheckpointError(
                f"{what} {name!r} in {self.path!r} is not a file name (expected a non-empty "
                "string naming a file inside the checkpoint directory)"
            )
        parts = name.replace("\\", "/").split("/")
        if os.path.isabs(name) or name.startswith(("/", "\\")) or os.path.splitdrive(name)[0]:
            raise CheckpointError(
                f"{what} {name!r} in {self.path!r} is an absolute path; a checkpoint may only "
                "name files inside its own directory"
            )
        if ".." in parts:
            raise CheckpointError(
                f"{what} {name!r} in {self.path!r} points outside the checkpoint directory "
                "('..'); a checkpoint may only name files inside its own directory"
            )
        real = os.path.realpath(os.path.join(self.path, name))
        if not any(_within(real, root) for root in self.allowed):
            raise CheckpointError(
                f"{what} {name!r} in {self.path!r} is a symlink to {real!r}, outside the "
                "checkpoint directory; only links inside it (or into a Hugging Face cache's "
                "blobs/) are followed"
            )
        return real

    def open(self, name: Any, what: str, expect: Optional[Identity] = None) -> RegularFile:
        """Open the file ``name`` names inside the root (see :meth:`resolve`)."""
        return RegularFile(self.resolve(name, what), what, expect)

    def read(self, name: Any, what: str, limit: int) -> bytes:
        """The bytes of a small file inside the root (metadata, JSON), read once."""
        with self.open(name, what) as f:
            return f.read_all(limit)


def read_json(path: Any, what: str, expected: str = "", limit: int = MAX_JSON_BYTES) -> Any:
    """A JSON file (the user's own path) through the reader: regular, bounded, parsed once;
    ``expected`` describes the form a user should give (for the error)."""
    with open_regular(path, what) as f:
        data = f.read_all(limit)
    try:
        return json.loads(data.decode("utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise CheckpointError(
            f"{what} {f.path!r} is not valid JSON ({exc}){'; expected ' + expected if expected else ''}"
        ) from None


# --- safetensors: read through the safetensors package itself ---------------------------------
def safetensors_package() -> Any:
    """The ``safetensors`` package (its parser checks every header we read), or a
    CheckpointError saying how to install it."""
    try:
        import safetensors
        import safetensors.torch  # noqa: F401 - the "pt" framework of safe_open
    except ImportError:
        raise CheckpointError(
            "reading .safetensors files needs the safetensors package; install it with: "
            "pip install 'safetorch[safetensors]'"
        ) from None
    return safetensors


_CODES: Dict[torch.dtype, str] = {}


def safetensors_codes() -> Dict[torch.dtype, str]:
    """``{torch dtype: the safetensors package's name for it}`` (``torch.float32: "F32"``)
    for every dtype of this torch the package can write: asked of the package itself, once,
    from the header it writes for an empty tensor (no table of ours)."""
    if not _CODES:
        package = safetensors_package()
        codes: Dict[torch.dtype, str] = {}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's notes on experimental/deprecated dtypes
            for value in vars(torch).values():
                if not isinstance(value, torch.dtype) or value in codes:
                    continue
                try:
                    data = package.torch.save({"x": torch.empty(0, dtype=value)})
                except Exception:  # a dtype the package has no name for
                    continue
                n = int.from_bytes(data[:8], "little")
                codes[value] = json.loads(data[8 : 8 + n])["x"]["dtype"]
        _CODES.update(codes)  # complete, or not at all (another thread may be here too)
    return _CODES


# Where an open descriptor can be opened again by name (the same open file, whatever its path
# names now): the safetensors package opens files by name only.
_FD_DIR = next((d for d in ("/proc/self/fd", "/dev/fd") if os.path.isdir(d)), None)


class SafetensorsHeader:
    """A checked safetensors header: ``entries`` (key -> (dtype, shape, begin, end)), the data
    section's start, and the identity of the file it was read from."""

    __slots__ = ("path", "entries", "data_start", "identity", "metadata")

    def __init__(
        self,
        path: str,
        entries: Dict[str, Tuple[torch.dtype, Tuple[int, ...], int, int]],
        data_start: int,
        ident: Identity,
        metadata: Dict[str, Any],
    ) -> None:
        self.path = path
        self.entries = entries
        self.data_start = data_start
        self.identity = ident
        self.metadata = metadata

    def meta(self) -> Dict[str, torch.Tensor]:
        """``{key: meta tensor}``: shapes and dtypes, no data."""
        return {
            k: torch.empty(shape, dtype=dtype, device="meta")
            for k, (dtype, shape, _, _) in self.entries.items()
        }

    def read_into(self, f: RegularFile, key: str, dest: torch.Tensor) -> bool:
        """Read ``key`` straight into ``dest`` when dtype and shape agree (else ``False``)."""
        dtype, shape, begin, _ = self.entries[key]
        if dest.dtype != dtype or tuple(dest.shape) != shape:
            return False
        f.readinto(dest, self.data_start + begin)
        return True

    def read(self, f: RegularFile, keys: List[str]) -> Dict[str, torch.Tensor]:
        """The tensors ``keys`` from the open file ``f`` (the same file: checked by identity)."""
        out: Dict[str, torch.Tensor] = {}
        for key in keys:
            dtype, shape, begin, end = self.entries[key]
            if end == begin:
                out[key] = torch.empty(shape, dtype=dtype)
                continue
            data = bytearray(f.pread(end - begin, self.data_start + begin))
            out[key] = torch.frombuffer(data, dtype=dtype).reshape(shape)
        return out


def _bad(path: str, why: str) -> CheckpointError:
    return CheckpointError(f"{path!r} is not a valid safetensors file: {why}")


def _fileno(f: Any) -> Optional[int]:
    try:
        return int(f.fh.fileno())
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return None  # an in-memory file object


def _tensors_of(f: RegularFile) -> Dict[str, Tuple[torch.dtype, Tuple[int, ...]]]:
    """``{key: (dtype, shape)}`` as the safetensors package reads the file (its parser checks
    the header: known dtypes, shapes that match the offsets, offsets contiguous and covering
    the data exactly, the header size limit); no tensor data is read but 0-dim values."""
    safetensors = safetensors_package()
    fd = _fileno(f)
    out: Dict[str, Tuple[torch.dtype, Tuple[int, ...]]] = {}
    if fd is None:  # a file object: the package checks the bytes it holds
        for key, t in safetensors.torch.load(f.pread(f.size, 0)).items():
            out[key] = (t.dtype, tuple(t.shape))
        return out
    # The descriptor the one reader opened and checked, opened again: the same file.
    name = f"{_FD_DIR}/{fd}" if _FD_DIR else f.path
    dtypes = {code: dtype for dtype, code in safetensors_codes().items()}
    with safetensors.safe_open(name, framework="pt") as handle:
        if _FD_DIR is None and identity(os.stat(f.path)) != f.identity:
            raise CheckpointError(f"{f.path!r} changed while it was being read")
        for key in handle.keys():
            piece = handle.get_slice(key)
            shape = tuple(piece.get_shape())
            dtype = dtypes.get(piece.get_dtype())
            if dtype is None:  # a name the package reads but never wrote here: ask it
                dtype = (piece[0:0] if shape else handle.get_tensor(key)).dtype
            out[key] = (dtype, shape)
    return out


def read_safetensors_header(f: RegularFile) -> SafetensorsHeader:
    """A safetensors file's entries, as the safetensors package reads it.

    The package parses and checks the header (:func:`_tensors_of`) and gives each tensor's
    dtype and shape; the offsets it checked are then looked up in the header so that tensor
    bytes can be read with ``pread`` (straight into a model's tensor, one copy), each one's
    size agreeing with its dtype and shape.
    """
    path = f.path
    try:
        tensors = _tensors_of(f)
    except CheckpointError:
        raise
    except Exception as exc:  # SafetensorError, and what a corrupt file raises on the way
        raise _bad(path, f"{type(exc).__name__}: {' '.join(str(exc).split())}") from None
    n = int.from_bytes(f.pread(8, 0), "little")  # checked by the package: header in the file
    header = json.loads(f.pread(n, 8).decode("utf-8"))
    metadata = header.get("__metadata__") or {}
    entries: Dict[str, Tuple[torch.dtype, Tuple[int, ...], int, int]] = {}
    for key, (dtype, shape) in tensors.items():
        begin, end = header[key]["data_offsets"]
        nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        if end - begin != nbytes:  # a packed dtype read its own way: not by pread
            raise _bad(path, f"tensor {key!r} of {dtype} {list(shape)} is not {nbytes} bytes")
        entries[key] = (dtype, shape, begin, end)
    return SafetensorsHeader(path, entries, 8 + n, f.identity, metadata)
