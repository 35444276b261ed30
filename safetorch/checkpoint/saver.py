"""CheckpointSaver: best/last/top-k checkpoints of a training run, saved atomically on rank 0.

It builds on both savers below it: :func:`safetorch.checkpoint.saving.save_checkpoint` for a
state (``CheckpointSaver.save``) and :func:`safetorch.checkpoint.state.save_state` for exact
resume (``CheckpointSaver.save_state`` / ``resume``). ``_resolve.saver_checkpoint`` tells the
checkpoint a saver directory holds (``safetorch ckpt`` commands accept such a directory).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import shutil
import stat
import sys
from typing import Any, Dict, Iterator, List, Optional, Tuple

import torch

from safetorch._atomic import atomic_write
from safetorch._types import SaverMode, unquoted
from safetorch.checkpoint import _reader
from safetorch.checkpoint._resolve import _STATE_FILE, _state_names, latest_complete
from safetorch.checkpoint.loading import PathLike
from safetorch.checkpoint.saving import _link_or_copy, _save_local, on_rank0
from safetorch.checkpoint.state import load_state, save_state
from safetorch.errors import CheckpointError, CheckpointFileNotFoundError

__all__ = ["CheckpointSaver"]

logger = logging.getLogger("safetorch")

# The index is a few lines of JSON (mode, last, best, one entry per kept checkpoint): far
# below these bounds. A larger or deeper one is not an index this saver wrote.
MAX_INDEX_BYTES = 16 << 20
MAX_INDEX_DEPTH = 16


class CheckpointSaver:
    """Keep ``last.pt`` and ``best.pt`` (``save``), or resumable top-k/history states
    (``save_state``/``resume``), each written atomically; one of the two per directory.

    ``save(state, epoch=, metric=)`` writes ``last.pt`` every time and ``best.pt`` when the
    metric improves; ``state`` is your own dict, which ``resume()`` cannot restore (load it
    with ``st.load``/``st.load_state_dict``). ``save_state(epoch=, metric=, **objects)`` writes a full
    :func:`safetorch.save_state` checkpoint (``state-<epoch>.pt``, or a DCP directory for a
    sharded model under a process group), keeps the ``top_k`` best by metric, the
    ``max_history`` most recent and the last one, and deletes the rest; ``resume(**objects)``
    restores the latest complete one. ``checkpoints.json`` records epoch, metric and file of
    each and is read back on construction, so a resumed run keeps comparing against the best
    metric so far. Every file is complete at every instant (temp file + rename), so a kill at
    any point leaves the previous checkpoints loadable. A directory holds the checkpoints of
    ``save()`` or of ``save_state()``, never both: mixing them (or ``top_k``/``max_history``
    other than 1 with ``save()``, or ``resume()`` in a ``save()`` directory) raises at once.

    Args:
        directory: where the files live (created if missing).
        mode: ``"min"`` (lower metric is better, e.g. loss) or ``"max"`` (e.g. accuracy).
        unwrap: passed to :func:`save_checkpoint` by ``save``.
        top_k: how many best ``save_state`` checkpoints to keep (by metric); ``save()`` keeps
            one (``best.pt``) and refuses any other value.
        max_history: how many most recent ``save_state`` checkpoints to keep besides them;
            ``save()`` keeps one (``last.pt``) and refuses any other value.
        last_name, best_name, index_name: file names inside ``directory``.

    Raises:
        ValueError: ``mode`` is neither ``"min"`` nor ``"max"``, or ``top_k``/``max_history``
            is negative.

    >>> import os, tempfile, torch, safetorch as st
    >>> run = tempfile.mkdtemp()
    >>> saver = st.CheckpointSaver(os.path.join(run, "weights"), mode="max")
    >>> net = torch.nn.Linear(2, 2)
    >>> saver.save({"model": net.state_dict()}, epoch=0, metric=0.5)
    True
    >>> saver.save({"model": net.state_dict()}, epoch=1, metric=0.4)
    False
    >>> saver.best_epoch, saver.best_metric
    (0, 0.5)
    >>> states = st.CheckpointSaver(os.path.join(run, "states"), mode="max", top_k=2)
    >>> opt = torch.optim.SGD(net.parameters(), lr=0.1)
    >>> states.save_state(epoch=1, metric=0.6, model=net, optimizer=opt)
    True
    >>> states.resume(model=net, optimizer=opt)
    {'epoch': 1, 'metric': 0.6}
    """

    @unquoted
    def __init__(
        self,
        directory: PathLike,
        *,
        mode: SaverMode = "min",
        unwrap: bool = False,
        top_k: int = 1,
        max_history: int = 1,
        last_name: str = "last.pt",
        best_name: str = "best.pt",
        index_name: str = "checkpoints.json",
    ) -> None:
        if mode not in ("min", "max"):
            raise ValueError(f"mode={mode!r}; expected 'min' (e.g. loss) or 'max' (e.g. accuracy)")
        for label, value in (("top_k", top_k), ("max_history", max_history)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{label}={value!r}; expected an int >= 0")
        self.directory = os.path.abspath(os.fspath(directory))
        self.mode = mode
        self.unwrap = unwrap
        self.top_k = top_k
        self.max_history = max_history
        self.last_path = os.path.join(self.directory, last_name)
        self.best_path = os.path.join(self.directory, best_name)
        self.index_path = os.path.join(self.directory, index_name)
        # Under torch.distributed rank 0 reads and broadcasts: construct on every rank.
        self.index: Dict[str, Any] = on_rank0(self._read_index)

    def _read_index(self) -> Dict[str, Any]:
        """The index, read through the checkpoint reader (inside the directory, a regular file,
        size- and depth-bounded) and checked: every file it names resolves inside the
        directory, and the ``save_state`` entries (which pruning deletes) carry the saver's own
        names (``state-<epoch>.pt``). Anything else is one ``CheckpointError`` naming the index
        and how to start afresh."""
        os.makedirs(self.directory, exist_ok=True)
        root = _reader.Root(self.directory)
        name = os.path.relpath(self.index_path, self.directory)
        real = ""
        try:
            real = root.resolve(name, "CheckpointSaver index")
            with _reader.RegularFile(real, "CheckpointSaver index") as f:
                data = f.read_all(MAX_INDEX_BYTES)
            index = json.loads(data.decode("utf-8"))
        except CheckpointFileNotFoundError:
            return {"mode": self.mode, "last": None, "best": None}
        except CheckpointError as exc:  # "CheckpointSaver index '<real>' is a FIFO ..."
            text = str(exc).replace(f"CheckpointSaver index {real!r} ", "it ", 1)
            raise self._bad_index(text) from None
        except RecursionError:
            raise self._bad_index(f"it nests deeper than {MAX_INDEX_DEPTH} levels") from None
        except (ValueError, UnicodeDecodeError) as exc:
            raise self._bad_index(f"it is not valid JSON ({exc})") from None
        problem = _index_problem(index, root)
        if problem:
            raise self._bad_index(problem)
        if index.get("mode") != self.mode:
            raise ValueError(
                f"{self.index_path!r} was written with mode={index.get('mode')!r}, "
                f"not mode={self.mode!r}"
            )
        return dict(index)

    def _bad_index(self, problem: str) -> CheckpointError:
        return CheckpointError(
            f"cannot use the checkpoint index {self.index_path!r}: {problem}; it is not an index "
            "CheckpointSaver wrote. Delete it (or move it away) to start a fresh index: the "
            f"checkpoints in {self.directory!r} stay, and resume() finds them by name"
        )

    @contextlib.contextmanager
    def _index_locked(self) -> Iterator[None]:
        """Hold the directory's index lock, with ``self.index`` read afresh: two jobs saving into
        one directory each update the index another just wrote, instead of overwriting it with
        the copy read at construction (a lost entry, and a pruned file the index still names)."""
        lock_path = os.path.join(self.directory, f".{os.path.basename(self.index_path)}.lock")
        with _exclusive_lock(lock_path):
            self.index = self._read_index()
            yield

    def _write_index(self, index: Dict[str, Any]) -> None:
        text = json.dumps(index, indent=2, sort_keys=True)

        def write_index(tmp: str) -> None:
            with open(tmp, "w", encoding="utf-8") as fh:
                fh.write(text)

        atomic_write(self.index_path, write_index)

    @property
    def best_metric(self) -> Optional[float]:
        """The best metric saved so far (``None`` before the first save)."""
        return self.index["best"]["metric"] if self.index.get("best") else None

    @property
    def best_epoch(self) -> Optional[int]:
        """The epoch of the best checkpoint (``None`` before the first save)."""
        return self.index["best"]["epoch"] if self.index.get("best") else None

    @property
    def last_epoch(self) -> Optional[int]:
        """The epoch of the last checkpoint; resume from ``last_epoch + 1``."""
        return self.index["last"]["epoch"] if self.index.get("last") else None

    @property
    def kept(self) -> List[str]:
        """Paths of the ``save_state`` checkpoints kept now, oldest first."""
        return [os.path.join(self.directory, e["file"]) for e in self.index.get("states", [])]

    def is_better(self, metric: float) -> bool:
        """Whether ``metric`` improves on the best so far (NaN never does)."""
        if math.isnan(metric):
            return False
        best = self.best_metric
        if best is None:
            return True
        return metric < best if self.mode == "min" else metric > best

    @staticmethod
    def _value(metric: Any) -> Optional[float]:
        if metric is None:
            return None
        return float(metric.item() if isinstance(metric, torch.Tensor) else metric)

    def save(self, state: Any, *, epoch: int, metric: Any) -> bool:
        """Write ``last.pt``, and ``best.pt`` if ``metric`` improved; update the index.

        Args:
            state: what to save (e.g. ``{"model": ..., "optimizer": ..., "epoch": ...}``).
            epoch: the epoch number recorded in the index.
            metric: a number or a 0-dim tensor (``.item()`` is called here).

        Returns:
            True when ``best.pt`` was rewritten.

        Raises:
            ValueError: the directory holds ``save_state()`` checkpoints, or ``top_k`` /
                ``max_history`` is not 1 (they apply to ``save_state()``).
        """
        if (self.top_k, self.max_history) != (1, 1):
            raise ValueError(
                f"CheckpointSaver(top_k={self.top_k}, max_history={self.max_history}).save(): "
                "save() keeps one last.pt and one best.pt; top_k= and max_history= apply to "
                "save_state() checkpoints. Call save_state(epoch=, metric=, **objects) to keep "
                "them, or construct the saver without top_k=/max_history="
            )
        if self._holds() == "save_state":
            raise ValueError(
                f"CheckpointSaver({self.directory!r}) holds save_state() checkpoints; save() "
                "writes last.pt/best.pt of your own dict, which resume() cannot restore. Use "
                "one of them per directory: keep calling save_state(epoch=, metric=, "
                "**objects), or give save() a directory of its own"
            )
        value = self._value(metric)
        assert value is not None
        entry = {"epoch": int(epoch), "metric": value}

        def write() -> Tuple[Dict[str, Any], bool]:
            with self._index_locked():
                return _write()

        def _write() -> Tuple[Dict[str, Any], bool]:
            improved = self.is_better(value)
            _save_local(state, self.last_path, self.unwrap)
            index = dict(self.index)
            index["last"] = dict(entry, file=os.path.basename(self.last_path))
            if improved:
                _link_or_copy(self.last_path, self.best_path)
                index["best"] = dict(entry, file=os.path.basename(self.best_path))
            self._write_index(index)
            return index, improved

        # Rank 0 decides and writes; every rank gets its index and verdict.
        self.index, improved = on_rank0(write)
        return bool(improved)

    def save_state(self, *, epoch: int, metric: Any = None, **objects: Any) -> bool:
        """Save a full resumable state (:func:`safetorch.save_state`) for ``epoch``.

        Call it on every rank. Keeps the ``top_k`` best by ``metric``, the ``max_history``
        most recent and the newest; older ones are deleted after the new one is complete.

        Args:
            epoch: the epoch number (the file is ``state-<epoch>.pt``).
            metric: a number or 0-dim tensor; ``None`` when there is none (never "best").
            **objects: what :func:`safetorch.save_state` takes (models, optimizers, values).

        Returns:
            True when this checkpoint is the best so far.

        Raises:
            ValueError: the directory holds ``save()`` checkpoints (``last.pt``/``best.pt``).
        """
        if self._holds() == "save":
            raise ValueError(
                f"CheckpointSaver({self.directory!r}) holds {os.path.basename(self.last_path)} "
                "written by save(); save_state() checkpoints go to a directory of their own "
                "(resume() restores only those): construct a CheckpointSaver on another "
                "directory for save_state(), or keep calling save()"
            )

        value = self._value(metric)
        name = f"state-{int(epoch):06d}.pt"
        save_state(os.path.join(self.directory, name), **objects, epoch=int(epoch), metric=value)
        entry = {"epoch": int(epoch), "metric": value, "file": name}

        def update() -> Tuple[Dict[str, Any], bool]:
            with self._index_locked():
                return _update()

        def _update() -> Tuple[Dict[str, Any], bool]:
            improved = value is not None and self.is_better(value)
            index = dict(self.index)
            states = [e for e in index.get("states", []) if e["file"] != name] + [entry]
            index["last"] = entry
            if improved:
                index["best"] = entry
            keep = {name}
            scored = [e for e in states if e["metric"] is not None and not math.isnan(e["metric"])]
            scored.sort(key=lambda e: e["metric"], reverse=self.mode == "max")
            keep.update(e["file"] for e in scored[: self.top_k])
            by_epoch = sorted(states, key=lambda e: e["epoch"])
            keep.update(e["file"] for e in by_epoch[len(by_epoch) - self.max_history :])
            if index.get("best"):
                keep.add(index["best"]["file"])
            index["states"] = [e for e in by_epoch if e["file"] in keep]
            self._write_index(index)  # the index first: it never names a deleted file
            for e in by_epoch:
                if e["file"] not in keep:
                    _prune(self.directory, e["file"])
            return index, improved

        self.index, improved = on_rank0(update)
        return bool(improved)

    def resume(self, **objects: Any) -> Optional[Dict[str, Any]]:
        """Restore the latest complete ``save_state`` checkpoint into ``objects``.

        The directory is scanned (not only the index), so a checkpoint written just before a
        crash that left the index behind is found too.

        Returns:
            The values it holds (``epoch``, ``metric`` and any saved values), or ``None`` when
            the directory holds no checkpoint at all (a fresh start).

        Raises:
            CheckpointError: the directory holds ``save()`` checkpoints (``last.pt``), which
                are not resumable states (a ``CheckpointError`` from :func:`load_state` too).
        """

        def find() -> Tuple[Optional[str], bool]:
            path = latest_complete(self.directory, _state_names(self.directory))
            if path is not None:  # a state-<epoch>.pt symlink out of the directory: refused
                path = _reader.Root(self.directory).resolve(os.path.basename(path), "checkpoint")
            return path, path is None and self._holds() == "save"

        path, by_save = on_rank0(find)
        if by_save:
            raise CheckpointError(
                f"{self.directory!r} holds {os.path.basename(self.last_path)} written by "
                "CheckpointSaver.save(), not a save_state() checkpoint; resume() restores only "
                "save_state() checkpoints (objects, values and RNG). Load the file with "
                "st.load(path) or st.load_state_dict(model, path), or save with "
                "saver.save_state(epoch=, metric=, model=, optimizer=) to resume"
            )
        if path is None:
            return None
        return load_state(path, **objects)

    def _holds(self) -> Optional[str]:
        """``"save"`` or ``"save_state"``: whose checkpoints the directory holds (by the index,
        else by the files there); ``None`` for an empty directory."""
        last = self.index.get("last")
        if self.index.get("states") or (
            isinstance(last, dict) and _STATE_FILE.fullmatch(str(last.get("file")))
        ):
            return "save_state"
        if last or os.path.exists(self.last_path):
            return "save"
        return "save_state" if _state_names(self.directory) else None


@contextlib.contextmanager
def _exclusive_lock(path: str) -> Iterator[None]:
    """An exclusive lock on the file ``path`` (created if missing, kept afterwards: removing a
    lock file another process may be waiting on would let a third one in), held until the body
    ends; the operating system drops it when the process dies, so a killed job never leaves the
    directory locked. ``fcntl.flock`` on POSIX, ``msvcrt.locking`` on Windows: what the
    ``filelock`` package does, without it (torch depends on filelock only from 2.0 on)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
    try:
        if sys.platform == "win32":
            import msvcrt

            while True:  # LK_LOCK retries for 10 s, then raises: wait as long as it takes
                try:
                    msvcrt.locking(fd, msvcrt.LK_LOCK, 1)
                    break
                except OSError:
                    continue
            try:
                yield
            finally:
                os.lseek(fd, 0, os.SEEK_SET)
                msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)
        else:
            import fcntl

            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _index_problem(index: Any, root: _reader.Root) -> Optional[str]:
    """What makes ``index`` not an index this saver wrote (``None`` when it is one)."""
    if not isinstance(index, dict):
        return f"it holds a JSON {type(index).__name__}, not an object"
    stack: List[Tuple[Any, int]] = [(index, 1)]
    while stack:  # iterative: a deep value is refused, never recursed into
        value, depth = stack.pop()
        if depth > MAX_INDEX_DEPTH:
            return f"it nests deeper than {MAX_INDEX_DEPTH} levels"
        if isinstance(value, dict):
            stack.extend((v, depth + 1) for v in value.values())
        elif isinstance(value, list):
            stack.extend((v, depth + 1) for v in value)
    states = index.get("states", [])
    if not isinstance(states, list):
        return "'states' is not a list"
    named = [(k, index.get(k)) for k in ("last", "best") if index.get(k) is not None]
    named += [("states", e) for e in states]
    for field, entry in named:
        if not (
            isinstance(entry, dict)
            and isinstance(entry.get("file"), str)
            and isinstance(entry.get("epoch"), int)
            and not isinstance(entry.get("epoch"), bool)
            and (entry.get("metric") is None or isinstance(entry["metric"], (int, float)))
        ):
            return f"its {field!r} entry {entry!r:.200} is not {{'epoch': int, 'metric': number, 'file': name}}"
        if field == "states" and not _STATE_FILE.fullmatch(entry["file"]):
            return (
                f"its 'states' entry names {entry['file']!r:.200}, not a save_state file "
                "(state-<epoch>.pt) of this saver"
            )
        try:
            root.resolve(entry["file"], "file")
        except CheckpointError as exc:
            return str(exc).replace(f" in {root.path!r}", "", 1)
    return None


def _prune(directory: str, name: str) -> None:
    """Delete the old ``save_state`` checkpoint ``name`` in ``directory``, only where it is
    one this saver writes: a regular file, or a DCP directory (``.metadata`` and ``.distcp``
    files, nothing else) named ``state-<epoch>.pt``. A symlink, or anything else there, is
    left alone (never followed) with a log line."""
    path = os.path.join(directory, name)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if _STATE_FILE.fullmatch(name) and stat.S_ISREG(st.st_mode):
        os.unlink(path)
        return
    if _STATE_FILE.fullmatch(name) and stat.S_ISDIR(st.st_mode) and _is_dcp_dir(path):
        shutil.rmtree(path, ignore_errors=True)
        return
    logger.warning(
        "CheckpointSaver: left %r in place: it is not a checkpoint this saver wrote (a "
        "symlink, or not a state-<epoch>.pt file or DCP directory); delete it yourself if "
        "it is no longer needed",
        path,
    )


def _is_dcp_dir(path: str) -> bool:
    """A DCP checkpoint directory as ``save_state`` writes it: regular files only (no
    symlinks, no sub-directories), its ``.metadata`` and ``.distcp`` shards."""
    with os.scandir(path) as entries:
        names = []
        for entry in entries:
            if not entry.is_file(follow_symlinks=False):
                return False
            names.append(entry.name)
    return ".metadata" in names and all(n == ".metadata" or n.endswith(".distcp") for n in names)
