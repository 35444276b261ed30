"""Atomic file replacement: the one writer safetorch uses for checkpoints and ``--fix``.

Standard library only (``safetorch.check`` uses it and never imports torch).
"""

from __future__ import annotations

import errno
import os
import tempfile
from typing import Callable, Union

__all__ = ["atomic_write", "atomic_write_text"]

PathLike = Union[str, "os.PathLike[str]"]


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# Mode of a new file, as open() would create it (mkstemp creates 0600).
_NEW_FILE_MODE = 0o666 & ~_umask()


def _fsync_path(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(directory: str) -> None:
    if os.name == "posix":  # Windows cannot open a directory for fsync
        _fsync_path(directory)


def atomic_write(path: PathLike, write: Callable[[str], None]) -> str:
    """Write a file atomically: ``write(tmp)`` in the same directory, fsync, rename, fsync dir.

    Readers see the old file or the new one, never a partial one, even if the process is
    killed. The temp file lives next to the target (never in another filesystem, where
    ``os.replace`` would not be atomic). An existing file keeps its permission bits; a new
    one gets the umask's. On failure the temp file is removed and the target is untouched.

    Args:
        path: The file to create or replace.
        write: Called with the temp file's path; writes the whole content there.

    Returns:
        The absolute path written.

    Raises:
        FileNotFoundError: the target's directory does not exist (the message names the target
            and the directory, never the temp file).

    >>> import os, pathlib, tempfile
    >>> p = os.path.join(tempfile.mkdtemp(), "a.txt")
    >>> _ = atomic_write(p, lambda tmp: pathlib.Path(tmp).write_text("hi"))
    >>> pathlib.Path(p).read_text()
    'hi'
    """
    target = os.path.abspath(os.fspath(path))
    directory = os.path.dirname(target)
    try:
        mode = os.stat(target).st_mode & 0o7777
    except FileNotFoundError:
        mode = _NEW_FILE_MODE
    if not os.path.isdir(directory):
        # mkstemp would name its hidden temp file ("No such file or directory:
        # '/run/x/.ckpt.pt.abc.tmp'"); the user needs the target and the missing directory.
        missing = directory
        while not os.path.exists(os.path.dirname(missing)) and os.path.dirname(missing) != missing:
            missing = os.path.dirname(missing)
        what = "does not exist" if not os.path.exists(directory) else "is not a directory"
        exc = FileNotFoundError(
            f"cannot write {target}: directory {directory} {what}"
            + (f" ({missing} is the first missing part)" if missing != directory else "")
            + "; create it first (os.makedirs(path, exist_ok=True))"
        )
        exc.errno = errno.ENOENT  # (a filename attribute would turn str() into "[Errno 2] None")
        raise exc
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(target)}.", suffix=".tmp", dir=directory)
    os.close(fd)
    try:
        write(tmp)
        _fsync_path(tmp)
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _fsync_dir(directory)
    return target


def atomic_write_text(path: PathLike, text: str, encoding: str = "utf-8") -> str:
    """Atomically replace ``path`` with ``text`` (newlines written exactly as given).

    >>> import os, pathlib, tempfile
    >>> p = os.path.join(tempfile.mkdtemp(), "m.py")
    >>> _ = atomic_write_text(p, "x = 1\\r\\n")
    >>> pathlib.Path(p).read_bytes()
    b'x = 1\\r\\n'
    """

    def write(tmp: str) -> None:
        with open(tmp, "w", encoding=encoding, newline="") as handle:
            handle.write(text)

    return atomic_write(path, write)
