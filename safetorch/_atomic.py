"""Atomic replacement of files and directories: the one writer safetorch uses.

Files (:func:`atomic_write`): checkpoints, shards and their index, ``--fix``, the
``install-hook`` ``.pth`` file. Directories (:func:`atomic_write_dir`, or
:func:`temp_sibling` + :func:`replace_dir` when several processes write the directory): DCP
checkpoints. Every temp name lives next to its target (``os.replace`` is atomic only within
one filesystem), everything is fsynced before the rename and the parent directory after it.

Standard library only (``safetorch.check`` uses it and never imports torch).
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import tempfile
import uuid
from typing import Callable, Union

__all__ = [
    "atomic_write",
    "atomic_write_text",
    "atomic_write_dir",
    "replace_dir",
    "temp_sibling",
    "require_parent",
]

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


def require_parent(path: PathLike) -> str:
    """Absolute path of ``path``, after checking that its directory exists.

    Raises:
        FileNotFoundError: the directory is missing (or is a file); the message names the
            target, the directory and its first missing part, never a temp name.

    >>> import os, tempfile
    >>> d = tempfile.mkdtemp()
    >>> require_parent(os.path.join(d, "a.pt")) == os.path.join(d, "a.pt")
    True
    """
    target = os.path.abspath(os.fspath(path))
    directory = os.path.dirname(target)
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
    return target


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
    target = require_parent(path)
    directory = os.path.dirname(target)
    try:
        mode = os.stat(target).st_mode & 0o7777
    except FileNotFoundError:
        mode = _NEW_FILE_MODE
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


def temp_sibling(path: PathLike) -> str:
    """A new hidden name next to ``path`` (``.NAME.<random>.tmp``), not created.

    For a directory that several processes write (DCP): rank 0 picks the name and broadcasts
    it, every rank writes into it, then rank 0 calls :func:`replace_dir`.

    >>> import os
    >>> os.path.basename(temp_sibling("/ckpt/step10")).startswith(".step10.")
    True
    """
    target = os.path.abspath(os.fspath(path))
    name = f".{os.path.basename(target)}.{uuid.uuid4().hex}.tmp"
    return os.path.join(os.path.dirname(target), name)


def _fsync_tree(top: str) -> None:
    for root, _dirs, files in os.walk(top):
        for name in files:
            _fsync_path(os.path.join(root, name))
        _fsync_dir(root)


def _remove(path: str) -> None:
    if stat.S_ISDIR(os.lstat(path).st_mode):
        shutil.rmtree(path, ignore_errors=True)
    else:
        os.unlink(path)


def replace_dir(tmp: PathLike, path: PathLike) -> str:
    """Put the written directory ``tmp`` in place of ``path`` (a sibling of it), durably.

    Every file and directory under ``tmp`` is fsynced, then ``tmp`` is renamed to ``path``
    and the parent directory fsynced. An existing ``path`` (a previous checkpoint, directory
    or file) is replaced: POSIX cannot rename a directory over a non-empty one, so it is
    first renamed aside (``TMP.old``) and removed after the swap; if the swap fails it is put
    back. A crash between the two renames leaves the previous checkpoint at ``TMP.old`` and
    the new one at ``TMP``: readers of ``path`` see the old one, the new one or none, never
    a mix.

    Args:
        tmp: The new directory, complete (every writer has finished).
        path: The target; its directory is ``tmp``'s.

    Returns:
        The absolute path of the target.

    >>> import os, tempfile
    >>> d = tempfile.mkdtemp()
    >>> target, tmp = os.path.join(d, "ckpt"), temp_sibling(os.path.join(d, "ckpt"))
    >>> os.mkdir(tmp); open(os.path.join(tmp, "x"), "w").close()
    >>> replace_dir(tmp, target) == target and os.listdir(target)
    ['x']
    """
    tmp, target = os.path.abspath(os.fspath(tmp)), os.path.abspath(os.fspath(path))
    _fsync_tree(tmp)
    old = None
    if os.path.lexists(target):
        old = f"{tmp}.old"
        os.replace(target, old)
    try:
        os.replace(tmp, target)
    except BaseException:
        if old is not None:
            os.replace(old, target)
        raise
    _fsync_dir(os.path.dirname(target))
    if old is not None:
        _remove(old)
    return target


def atomic_write_dir(path: PathLike, write: Callable[[str], None]) -> str:
    """Write a directory atomically: ``write(tmp)`` fills a new sibling, then :func:`replace_dir`.

    Readers see the previous directory or the new one, never a partial one. On failure the
    temp directory is removed and ``path`` is untouched.

    Args:
        path: The directory to create or replace.
        write: Called with the temp directory's path (created, empty); writes the content.

    Returns:
        The absolute path written.

    Raises:
        FileNotFoundError: the target's parent directory does not exist.

    >>> import os, pathlib, tempfile
    >>> p = os.path.join(tempfile.mkdtemp(), "out")
    >>> _ = atomic_write_dir(p, lambda tmp: pathlib.Path(tmp, "a.txt").write_text("hi"))
    >>> os.listdir(p)
    ['a.txt']
    """
    target = require_parent(path)
    tmp = temp_sibling(target)
    os.mkdir(tmp)
    try:
        write(tmp)
        replace_dir(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target
