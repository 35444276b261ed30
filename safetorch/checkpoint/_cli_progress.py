"""The ``safetorch ckpt`` progress bar (a terminal only) and the file wrappers that move it."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from typing import IO, Any, Callable, Iterator, Optional

# Show a progress bar only for inputs larger than this (and only on a terminal).
PROGRESS_MIN_BYTES = 256 * 1024 * 1024


def _human(n: float) -> str:
    """Bytes in binary units (KiB, MiB, GiB: one system everywhere in ``safetorch ckpt``)."""
    if n < 1024:
        return f"{int(n)} B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        n /= 1024
        if n < 1024 or unit == "TiB":
            break
    return f"{n:.1f} {unit}"


# --- progress ----------------------------------------------------------------------------------
class _Progress:
    """A one-line progress bar on a terminal: nothing when the stream is not a TTY (or the work
    is small, or ``--no-progress``), at most ``1 / INTERVAL`` redraws a second, binary units;
    the rate and the time left (``ETA m:ss``) of the phase follow the bytes once a phase has
    run for ``RATE_AFTER`` seconds (before that a rate says nothing).

    ``advance``/``update`` may be called as often as bytes move (every write, every read) and
    from a watcher thread (:func:`_watching`): drawing is throttled and locked. ``close(True)``
    draws the final state and ends the line; ``close(False)`` (a failure, Ctrl-C) erases it, so
    that the one-line error is all that is left on the terminal.
    """

    INTERVAL = 0.125  # at most 8 redraws a second
    RATE_AFTER = 0.5  # seconds into a phase before its rate and ETA are shown

    def __init__(self, total: int, stream: IO[str], enabled: bool, label: str = "") -> None:
        self.total, self.stream, self.enabled = max(total, 1), stream, enabled
        self.label, self.done, self.draws = label, 0, 0
        self._last = -1.0
        self._began = time.monotonic()
        self._lock = threading.Lock()

    def start(self, total: int, label: str) -> None:
        """Begin a new phase on the same line (``reading``, ``writing``, ``comparing``)."""
        with self._lock:
            self.total, self.label, self.done, self._last = max(total, 1), label, 0, -1.0
            self._began = time.monotonic()

    def advance(self, n: int, label: Optional[str] = None) -> None:
        self.update(self.done + n, label)

    def update(self, done: int, label: Optional[str] = None, force: bool = False) -> None:
        with self._lock:
            self.done = min(max(done, 0), self.total)
            if label is not None:
                self.label = label
            if not self.enabled:
                return
            now = time.monotonic()
            if not force and now - self._last < self.INTERVAL:
                return
            self._last = now
            self._draw(now)

    def _draw(self, now: float) -> None:
        frac = self.done / self.total
        bar = "#" * int(frac * 30)
        self.stream.write(
            f"\r{self.label:<9} [{bar:<30}] {frac:6.1%} {_human(self.done)}/{_human(self.total)}"
            f"{_rate_and_eta(self.done, self.total, now - self._began, self.RATE_AFTER)}\x1b[K"
        )
        self.stream.flush()
        self.draws += 1

    def finish(self) -> None:
        """The phase is complete: draw it at 100%."""
        self.update(self.total, force=True)

    def close(self, ok: bool = True) -> None:
        if not self.enabled or self.draws == 0:
            return
        with self._lock:
            self.stream.write("\n" if ok else "\r\x1b[K")
            self.stream.flush()


def _rate_and_eta(done: int, total: int, elapsed: float, after: float) -> str:
    """`` 120.5 MiB/s ETA 0:05`` once ``after`` seconds have passed with bytes moved, else ``""``.

    >>> _rate_and_eta(2**20, 4 * 2**20, 1.0, 0.5)
    ' 1.0 MiB/s ETA 0:03'
    >>> _rate_and_eta(2**20, 4 * 2**20, 0.1, 0.5)
    ''
    """
    if elapsed < after or done <= 0:
        return ""
    rate = done / elapsed
    left = int(round((total - done) / rate))
    minutes, seconds = divmod(left, 60)
    return f" {_human(rate)}/s ETA {minutes}:{seconds:02d}"


def _make_progress(stream: Optional[IO[str]], size: int, show: bool = True) -> _Progress:
    """A bar on ``stream`` (default stderr), drawn only when ``show`` (``--no-progress``
    clears it), the stream is a terminal and ``size`` exceeds :data:`PROGRESS_MIN_BYTES`."""
    out = sys.stderr if stream is None else stream
    tty = bool(getattr(out, "isatty", lambda: False)())
    return _Progress(size, out, show and tty and size > PROGRESS_MIN_BYTES)


@contextlib.contextmanager
def _watching(progress: _Progress, measure: Callable[[], int]) -> Iterator[None]:
    """While the body runs (a write torch, safetensors or DCP does in one call), a thread
    updates ``progress`` from ``measure()`` (the bytes written so far) every ``INTERVAL``."""
    if not progress.enabled:
        yield
        return
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(progress.INTERVAL):
            with contextlib.suppress(OSError):
                progress.update(measure())

    thread = threading.Thread(target=watch, name="safetorch-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def _bytes_under(path: Optional[str]) -> int:
    """Bytes of the file ``path``, or of the files in the directory ``path`` (0 if absent)."""
    if path is None:
        return 0
    if os.path.isdir(path):
        total = 0
        for entry in os.scandir(path):
            with contextlib.suppress(OSError):
                if entry.is_file(follow_symlinks=False):
                    total += entry.stat(follow_symlinks=False).st_size
        return total
    return os.path.getsize(path) if os.path.exists(path) else 0


class _CountingWriter:
    def __init__(self, fh: IO[bytes], progress: _Progress) -> None:
        self.fh, self.progress = fh, progress

    def write(self, data: Any) -> int:
        n = self.fh.write(data)
        self.progress.advance(len(memoryview(data).cast("B")))
        return n

    def flush(self) -> None:
        self.fh.flush()


class _CountingReader:
    """A binary file object that reports the bytes read to a progress bar (st.load reads it as
    it reads any seekable file; ``name`` is the path, so failures name the file)."""

    def __init__(self, fh: IO[bytes], name: str, progress: _Progress) -> None:
        self.fh, self.name, self.progress = fh, name, progress

    def read(self, n: int = -1) -> bytes:
        data = self.fh.read(n)
        self.progress.update(self.fh.tell())
        return data

    def readline(self, size: int = -1) -> bytes:
        line = self.fh.readline(size)
        self.progress.update(self.fh.tell())
        return line

    def __getattr__(self, name: str) -> Any:  # anything else a reader asks of a file
        return getattr(self.fh, name)

    def readinto(self, buffer: Any) -> int:
        n = self.fh.readinto(buffer)  # type: ignore[attr-defined]  # a real file object has it
        self.progress.update(self.fh.tell())
        return int(n or 0)

    def seek(self, offset: int, whence: int = 0) -> int:
        return self.fh.seek(offset, whence)

    def tell(self) -> int:
        return self.fh.tell()

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True
