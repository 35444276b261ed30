"""``safetorch ckpt inspect|convert|diff|verify|fit``: look inside, rewrite, compare, check, try.

Every command reads every layout the library writes or loads, the same way (:func:`read_source`):
a ``torch.save`` or ``.safetensors`` file, a :func:`safetorch.save_state` file (its models are
found where ``st.load_state_dict`` finds them: in its ``objects``), a ``CheckpointSaver``
directory (the checkpoint ``resume()`` restores, or ``save()``'s ``last.pt``), a DCP
directory, a shard index, a transformers/accelerate directory. Every file is read through
:func:`safetorch.load` (weights-only; ``--allow`` and ``SAFETORCH_ALLOW`` are its ``allow=``),
never plain pickle.

Text from files (keys, metadata, paths) is printed through :func:`safetorch._text.escape`
(``--json``: ``json.dumps`` escapes it). Expected failures end in one line on stderr naming the
value and the fix; exit status 2 for bad input (missing or unreadable paths, directories, bad
options, corrupt files), 1 for findings (unsafe globals, differences, a checkpoint that does not
fit) or failed work, 130 when interrupted, 0 otherwise. The argument definitions live in
:mod:`safetorch._cli` (``--help`` never imports torch); :func:`run_command` runs one.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import errno
import fnmatch
import importlib
import json
import os
import stat
import sys
import threading
import time
import warnings
from typing import (
    IO,
    Any,
    Callable,
    Dict,
    Iterable,
    Iterator,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
    Type,
)

import torch

from safetorch import _compat
from safetorch._atomic import atomic_write, atomic_write_dir
from safetorch._cli import paint, say_error
from safetorch._nest import iter_named_tensors, iter_tensors
from safetorch._text import escape, escape_all
from safetorch.checkpoint import (
    _conversions,
    _dcp,
    _dcp_load,
    _formats,
    _layouts,
    _reader,
    _resolve,
    _scan,
    _torchfile,
    _unpickler,
)
from safetorch.checkpoint._formats import STATE_FORMAT
from safetorch.checkpoint._resolve import saver_checkpoint
from safetorch.checkpoint.keys import (
    _leading_prefixes,
    _wrapper_segments_in,
    canonical_key,
    find_state_dict,
    is_state_dict,
    known_prefixes,
    match_keys,
    state_dict_keys,
)
from safetorch.checkpoint.loading import _torch_internals_quiet, load
from safetorch.checkpoint.model_state import load_state_dict
from safetorch.checkpoint.saving import _unwrapped
from safetorch.checkpoint.verify import verify_checkpoint
from safetorch.errors import CheckpointError, UnsafeCheckpointError

__all__ = [
    "add_parsers",
    "run_command",
    "read_source",
    "inspect_checkpoint",
    "convert_checkpoint",
    "list_keys",
    "diff_checkpoints",
    "fit_checkpoint",
]
# verify_checkpoint lives in safetorch.checkpoint.verify (``safetorch ckpt verify``).

# Show a progress bar only for inputs larger than this (and only on a terminal).
PROGRESS_MIN_BYTES = 256 * 1024 * 1024


_storage_of: Callable[[torch.Tensor], Any]


@_compat.register_binder
def _bind() -> None:
    global _storage_of
    # Tensor.untyped_storage() is torch 2.0+; 1.13's Tensor.storage() (a TypedStorage) has the
    # same data_ptr()/nbytes(), and warns about TypedStorage only from 2.0 on.
    _storage_of = (
        torch.Tensor.untyped_storage if _compat.HAS_UNTYPED_STORAGE else torch.Tensor.storage
    )


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _format_of(path: str) -> str:
    kind = _formats.sniff(path)  # the one sniffer st.load uses
    return kind if kind in ("safetensors", "zip") else "legacy"


# --- what a checkpoint holds: one view for every command ----------------------------------------
def state_parts(obj: Any) -> Optional[Mapping[str, Any]]:
    """``obj`` when it is a :func:`safetorch.save_state` payload (its ``STATE_FORMAT`` marker and
    an ``objects`` mapping), else ``None``."""
    if (
        isinstance(obj, Mapping)
        and obj.get("__safetorch__") == STATE_FORMAT
        and isinstance(obj.get("objects"), Mapping)
    ):
        return obj
    return None


def model_view(obj: Any) -> Any:
    """Where ``st.load_state_dict`` looks for the state dict in ``obj``: a ``save_state``
    file's ``objects`` (model name -> state dict), anything else as it is. ``--key`` names a
    key of this view (an object name for a ``save_state`` file), as ``key=`` does."""
    parts = state_parts(obj)
    return parts["objects"] if parts is not None else obj


def _carried_keys(obj: Any) -> List[str]:
    """What a checkpoint holds besides tensors of the state dict written: the keys of its
    container (for a ``save_state`` file: the object names, the value names and ``rng``)."""
    parts = state_parts(obj)
    if parts is not None:
        extras = parts.get("extras")
        values = [str(k) for k in extras] if isinstance(extras, Mapping) else []
        return [*map(str, parts["objects"]), *values, "rng"]
    if isinstance(obj, Mapping) and not is_state_dict(obj):
        return [str(k) for k in obj]
    return []


def _state_info(parts: Mapping[str, Any]) -> Dict[str, Any]:
    extras, rng = parts.get("extras"), parts.get("rng")
    return {
        "format": STATE_FORMAT,
        "objects": [str(k) for k in parts["objects"]],
        "values": sorted(map(str, extras)) if isinstance(extras, Mapping) else [],
        "rng_ranks": len(rng) if isinstance(rng, Mapping) else 0,
    }


def allow_list(values: Optional[Sequence[str]]) -> List[str]:
    """``--allow`` values and ``SAFETORCH_ALLOW``, through the one parser ``safetorch run`` uses
    (:func:`safetorch.patching.allow.parse_allow_list`): the ``allow=`` of every load here."""
    from safetorch.patching.allow import allowed_globals, parse_allow_list

    return list(dict.fromkeys(parse_allow_list([*allowed_globals(), *(values or [])])))


def inspect_checkpoint(
    path: str, *, allow: Iterable[str] = (), key: Optional[str] = None
) -> Dict[str, Any]:
    """Describe a checkpoint without executing anything outside the weights-only allow-list.

    Args:
        path: the checkpoint file.
        allow: globals allowed as for ``st.load(allow=)`` (``--allow``).
        key: the container key (object name in a ``save_state`` file) of the state dict to
            describe, as ``st.load_state_dict(key=)``.

    Returns:
        A JSON-ready dict: format, size, container keys, every state dict the container holds
        (``state_dicts``: key -> entries, EMA copies included), the one ``st.load_state_dict``
        picks (``state_dict_key``), tensor count, total bytes, dtypes, known prefixes
        (``wrapper_prefixes``: wrapper segments such as ``module.`` and Lightning's ``model.``),
        ``save_state`` (objects, values, RNG ranks of a ``st.save_state`` file, else ``None``)
        and unsafe globals (when there are any, nothing is loaded and only those are reported).

    Raises:
        CheckpointError: the file is missing, empty, truncated or not a checkpoint, or ``key``
            is not a state dict in it.

    >>> import os, tempfile, torch
    >>> path = os.path.join(tempfile.mkdtemp(), "m.pt")
    >>> torch.save({"state_dict": torch.nn.DataParallel(torch.nn.Linear(2, 2)).state_dict()}, path)
    >>> info = inspect_checkpoint(path)
    >>> info["tensor_count"], info["wrapper_prefixes"], info["unsafe_globals"]
    (2, ['module.'], [])
    """
    allow = list(allow)
    info: Dict[str, Any] = {"path": path}
    if not os.path.exists(path):
        load(path)  # raises the not-found error
    info["file_bytes"] = os.path.getsize(path)
    info["format"] = _format_of(path) if info["file_bytes"] else "empty"
    unsafe: List[str] = []
    if info["format"] in ("zip", "legacy"):
        names, _ = _scan.scan_globals(path)
        extra = _unpickler.resolve_allowed((*_unpickler.DEFAULT_EXTRA_ALLOWED, *allow))
        unsafe = _unpickler.unsafe_globals(names, extra)
    info["unsafe_globals"] = unsafe
    if allow:
        info["allowed_globals"] = allow
    if unsafe:
        return info
    obj = _meta_view(path) if info["format"] == "zip" else None
    if obj is None:
        obj = _load_file(path, allow, None)
    parts = state_parts(obj)
    info["save_state"] = _state_info(parts) if parts is not None else None
    info["container_keys"] = (
        [str(k) for k in obj] if isinstance(obj, Mapping) and not is_state_dict(obj) else None
    )
    view = model_view(obj)
    holders = state_dict_keys(view)
    info["state_dicts"] = {k: len(_as_state_dict(view[k])) for k in holders}
    if key is not None:
        find_state_dict(view, key)  # CheckpointError naming the keys there
    try:
        state_dict, picked = find_state_dict(view, key)
        info["state_dict_key"] = picked
        info["state_dict_tensors"] = len(state_dict)
        info["wrapper_prefixes"] = known_prefixes(state_dict)
    except CheckpointError as exc:
        info["state_dict_key"] = None
        info["state_dict_note"] = str(exc)
        info["wrapper_prefixes"] = sorted(
            {p for k in holders for p in known_prefixes(_as_state_dict(view[k]))}
        )
    seen = set()
    count, total = 0, 0
    dtypes: Dict[str, int] = collections.Counter()
    for t in iter_tensors(obj):
        count += 1
        dtypes[str(t.dtype).replace("torch.", "")] += 1
        storage = _storage_of(t)
        # a meta view's storages have no data pointer: told apart by the storage itself
        ptr = storage._cdata if t.device.type == "meta" else storage.data_ptr()
        ident = (ptr, storage.nbytes(), str(t.device))
        if ident not in seen:  # tensors sharing a storage count once
            seen.add(ident)
            total += storage.nbytes()
    info["tensor_count"] = count
    info["tensor_bytes"] = total
    info["dtypes"] = dict(sorted(dtypes.items()))
    return info


def _meta_view(path: str) -> Any:
    """The checkpoint's structure with its tensors on ``meta`` (nothing read but the pickle and
    the zip directory, every storage checked against its record), or ``None`` where the file
    needs ``st.load`` (legacy format, compressed records, other tensor kinds, allowed
    globals): ``inspect`` then costs the pickle, not the file's size."""

    found = _torchfile.TorchFile.open(path)
    if found is None:
        return None
    found.close()
    return found.view


def _human(n: float) -> str:
    """Bytes in binary units (KiB, MiB, GiB: one system everywhere in ``safetorch ckpt``)."""
    if n < 1024:
        return f"{int(n)} B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        n /= 1024
        if n < 1024 or unit == "TiB":
            break
    return f"{n:.1f} {unit}"


def _as_state_dict(value: Any) -> Mapping[str, Any]:
    return value.state_dict() if isinstance(value, torch.nn.Module) else value


_PREFIX_NOTES = {"model.": "Lightning's model attribute", "module.": "DataParallel/DDP"}
_PREFIX_NOTES.update({"_orig_mod.": "torch.compile", "_fsdp_wrapped_module.": "FSDP"})
_PREFIX_NOTES["_checkpoint_wrapped_module."] = "activation checkpointing"


def _print_info(info: Dict[str, Any], out: IO[str]) -> None:
    out.write(f"path: {info['path']} ({info['format']}, {_human(info['file_bytes'])})\n")
    if info.get("allowed_globals"):
        out.write("allowed globals (--allow / SAFETORCH_ALLOW): ")
        out.write(", ".join(info["allowed_globals"]) + "\n")
    if info["unsafe_globals"]:
        out.write(paint("unsafe globals: " + ", ".join(info["unsafe_globals"]), "red", out) + "\n")
        out.write(
            "not loaded: it would run code outside the weights-only allow-list (if you trust "
            "the file: --allow " + " --allow ".join(info["unsafe_globals"]) + ")\n"
        )
        return
    state = info.get("save_state")
    if state:
        out.write(
            f"st.save_state checkpoint: objects {', '.join(state['objects']) or '-'}; values "
            f"{', '.join(state['values']) or '-'}; RNG of {state['rng_ranks']} rank(s) "
            "(st.load_state / CheckpointSaver.resume restore it)\n"
        )
    if info.get("container_keys") is not None:
        out.write("container keys: " + ", ".join(info["container_keys"]) + "\n")
    if info.get("state_dict_key") is not None or "state_dict_tensors" in info:
        out.write(
            f"state dict: {info['state_dict_key'] or '(top level)'} "
            f"({info.get('state_dict_tensors', 0)} entries; st.load_state_dict loads it)\n"
        )
    elif info.get("state_dict_note"):
        out.write(f"state dict: {info['state_dict_note']}\n")
    others = {k: n for k, n in info.get("state_dicts", {}).items() if k != info["state_dict_key"]}
    if others:
        out.write(
            "other state dicts: "
            + ", ".join(f"{k} ({n} entries; key='{k}')" for k, n in others.items())
            + "\n"
        )
    out.write(f"tensors: {info['tensor_count']}, {_human(info['tensor_bytes'])}\n")
    out.write(
        "dtypes: " + (", ".join(f"{k} ({v})" for k, v in info["dtypes"].items()) or "-") + "\n"
    )
    prefixes = [
        f"{p} ({_PREFIX_NOTES[p]})" if p in _PREFIX_NOTES else p for p in info["wrapper_prefixes"]
    ]
    out.write("wrapper prefixes: " + (", ".join(prefixes) or "none") + "\n")
    out.write("unsafe globals: none\n")


# --- progress ----------------------------------------------------------------------------------
class _Progress:
    """A one-line progress bar on a terminal: nothing when the stream is not a TTY (or the work
    is small), at most ``1 / INTERVAL`` redraws a second, binary units.

    ``advance``/``update`` may be called as often as bytes move (every write, every read) and
    from a watcher thread (:func:`_watching`): drawing is throttled and locked. ``close(True)``
    draws the final state and ends the line; ``close(False)`` (a failure, Ctrl-C) erases it, so
    that the one-line error is all that is left on the terminal.
    """

    INTERVAL = 0.125  # at most 8 redraws a second

    def __init__(self, total: int, stream: IO[str], enabled: bool, label: str = "") -> None:
        self.total, self.stream, self.enabled = max(total, 1), stream, enabled
        self.label, self.done, self.draws = label, 0, 0
        self._last = -1.0
        self._lock = threading.Lock()

    def start(self, total: int, label: str) -> None:
        """Begin a new phase on the same line (``reading``, ``writing``, ``comparing``)."""
        with self._lock:
            self.total, self.label, self.done, self._last = max(total, 1), label, 0, -1.0

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
            self._draw()

    def _draw(self) -> None:
        frac = self.done / self.total
        bar = "#" * int(frac * 30)
        self.stream.write(
            f"\r{self.label:<9} [{bar:<30}] {frac:6.1%} {_human(self.done)}/{_human(self.total)}"
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


def _make_progress(stream: Optional[IO[str]], size: int) -> _Progress:
    out = sys.stderr if stream is None else stream
    tty = bool(getattr(out, "isatty", lambda: False)())
    return _Progress(size, out, tty and size > PROGRESS_MIN_BYTES)


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


# --- reading any layout ------------------------------------------------------------------------
def _load_file(path: str, allow: Sequence[str], progress: Optional[_Progress]) -> Any:
    """``st.load(path, allow=allow)``; on a terminal, through the checkpoint reader with the
    bytes read shown (the same load: st.load reads a file object as it reads a path)."""
    if progress is None or not progress.enabled:
        return load(path, allow=list(allow))
    with _reader.open_regular(path, "checkpoint") as f:
        progress.start(f.size, "reading")
        obj = load(_CountingReader(f.fh, path, progress), allow=list(allow))
        progress.finish()
        return obj


def _saver_source(path: str) -> Optional[str]:
    """The checkpoint a ``CheckpointSaver`` directory stands for, or ``None`` for any other path."""
    if not os.path.isdir(path):
        return None
    picked = saver_checkpoint(path)
    return None if picked is None else picked[0]


def read_source(
    src: str, *, allow: Iterable[str] = (), progress_stream: Optional[IO[str]] = None
) -> Any:
    """The whole checkpoint at ``src``, whatever its layout, weights-only.

    A file through :func:`safetorch.load` (``allow=`` as there), a ``CheckpointSaver``
    directory through the checkpoint it stands for, a DCP directory through DCP with
    safetorch's reader, a shard index or library directory shard by shard. A progress bar is
    drawn on ``progress_stream`` (default stderr) only if it is a terminal and ``src`` is large.

    Raises:
        CheckpointError: ``src`` cannot be read (see :func:`safetorch.load`).
    """
    progress = _make_progress(progress_stream, _size_of(src))
    try:
        obj = _read_source(src, list(allow), progress)
    except BaseException:
        progress.close(False)
        raise
    progress.close(True)
    return obj


def _read_source(src: str, allow: List[str], progress: _Progress) -> Any:
    src = _saver_source(src) or src
    layout = _resolve.resolve(src)
    if isinstance(layout, _layouts.FileLayout):
        return _load_file(layout.path, allow, progress)
    dcp_dir = layout if isinstance(layout, _dcp_load.DCPDirectory) else None
    # DCP: every flat entry, nested again by DCP's own paths; others: the meta view's keys.
    keys = list(dcp_dir.metadata.state_dict_metadata if dcp_dir else layout.meta_view())
    progress.start(sum(map(layout.nbytes, keys)), "reading")
    out: Dict[str, Any] = {}
    for batch in layout.batches([(k, k) for k in keys]):  # a bar that moves, batch by batch
        out.update(batch)
        progress.advance(sum(map(layout.nbytes, batch)))
    progress.finish()
    if dcp_dir:
        return _dcp.nest_flat_keys(out, dcp_dir.paths())
    return {k: out[k] for k in keys}


def _for_safetensors(state_dict: Mapping[str, Any]) -> Tuple[Dict[str, torch.Tensor], List[str]]:
    """Contiguous tensors, shared storages cloned (safetensors refuses aliasing)."""
    out: Dict[str, torch.Tensor] = {}
    dropped: List[str] = []
    seen = set()
    for k, v in state_dict.items():
        if not isinstance(v, torch.Tensor):
            dropped.append(k)
            continue
        ptr = (_storage_of(v).data_ptr(), v.device) if v.numel() else None
        if ptr is not None and ptr in seen:
            v = v.clone()
        elif ptr is not None:
            seen.add(ptr)
        out[k] = v.contiguous()
    return out, dropped


# A tensor is written in pieces of this size, so the progress bar moves within large ones.
_WRITE_CHUNK = 16 * 1024 * 1024


def _write_safetensors(
    tensors: Mapping[str, torch.Tensor], fh: IO[bytes], progress: _Progress
) -> None:
    """Stream ``tensors`` (contiguous, unaliased: :func:`_for_safetensors`) to ``fh`` in the
    safetensors format: an 8-byte little-endian header length, the JSON header (padded with
    spaces to 8 bytes, ``__metadata__`` ``{"format": "pt"}`` as ``safetensors.torch`` writes
    it), then each tensor's bytes in header order; the safetensors library reads it back. Unlike ``safetensors.torch.save_file``, no second copy of
    every tensor is held in memory, and ``progress`` moves as the bytes are written."""
    header: Dict[str, Any] = {}
    offset = 0
    for key, t in tensors.items():
        code = _reader.safetensors_codes().get(t.dtype)
        if code is None or t.layout != torch.strided:
            raise CheckpointError(
                f"--to safetensors: {key!r} is a {t.dtype} tensor ({t.layout}), which a "
                "safetensors file cannot hold; write it with --to torch"
            )
        n = _nbytes(t)
        header[key] = {"dtype": code, "shape": list(t.shape), "data_offsets": [offset, offset + n]}
        offset += n
    header["__metadata__"] = {"format": "pt"}
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    fh.write(len(text).to_bytes(8, "little"))
    fh.write(text)
    for t in tensors.values():
        data = t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().data
        for start in range(0, len(data), _WRITE_CHUNK):
            piece = data[start : start + _WRITE_CHUNK]
            fh.write(piece)
            progress.advance(len(piece))


def convert_checkpoint(
    src: str,
    dst: str,
    *,
    strip: str = "auto",
    to: Optional[str] = None,
    key: Optional[str] = None,
    progress_stream: Optional[IO[str]] = None,
    max_shard_size: Optional[str] = None,
    max_bytes: Optional[int] = None,
    allow: Iterable[str] = (),
) -> Dict[str, Any]:
    """Rewrite a checkpoint atomically: strip wrapper prefixes, change format or layout.

    The source is any layout :func:`read_source` reads (a torch.save or ``.safetensors`` file,
    a ``st.save_state`` file, a ``CheckpointSaver`` directory, a DCP directory, a shard index or
    library directory); the output is one torch file, one ``.safetensors`` file, a directory of
    safetensors shards with ``model.safetensors.index.json`` (``max_shard_size``), or a DCP
    directory (``to="dcp"``). ``torch`` and ``dcp`` output keep the whole checkpoint (a
    ``save_state`` file stays one); safetensors holds the tensors of one state dict, and what
    it leaves behind is listed in ``dropped``.

    Args:
        src: input checkpoint (loaded weights-only).
        dst: output path, replaced atomically.
        strip: ``"auto"`` drops wrapper segments (``module.``, ``_orig_mod.``, ...) from every
            state dict; ``"none"`` keeps keys; any other value ending in ``.`` is also stripped
            as a leading prefix (e.g. ``"model."``).
        to: ``"torch"``, ``"safetensors"`` or ``"dcp"``; default from ``dst``'s extension.
        key: container key (object name in a ``save_state`` file) of the state dict to write
            (only that state dict is written); needed for safetensors output when the
            container holds several.
        progress_stream: where a progress bar goes (default stderr); drawn only if it is a TTY
            and ``src`` is larger than 256 MiB, while reading and while writing.
        max_shard_size: with ``to="safetensors"``: write shards of at most this size
            (``"5GB"``, ``"500MB"``) into the directory ``dst``, plus the index.
        max_bytes: safetensors and DCP store every tensor contiguously, so an expanded or
            overlapping view (``torch.zeros(1).expand(2**32)``: a 4-byte storage) or a storage
            shared by many entries is written out in full. The tensor data written may take at
            most this many bytes; by default twice the bytes of the source's tensor storages
            plus 64 MiB (so tied weights convert, and a small file cannot ask for gigabytes).
            ``torch`` output keeps views as they are and needs no limit.
        allow: globals allowed as for ``st.load(allow=)`` (``--allow``).

    Returns:
        A summary dict: ``format``, ``tensors``, ``key`` (the state dict written, for
        safetensors or ``key=``) and ``dropped``: what the output does not carry over (container
        keys such as ``optimizer`` or ``epoch``, a ``save_state`` file's ``rng``, and non-tensor
        state-dict entries as ``<key>.<entry>``).

    Raises:
        CheckpointError: ``src`` cannot be loaded, ``key`` is not a state dict in it, or the
            safetensors/DCP output would exceed ``max_bytes`` (naming the largest tensor).
        ValueError: a bad ``to`` or ``strip``, or a ``strip`` prefix that matches no key.

    >>> import os, tempfile, torch, safetorch as st
    >>> d = tempfile.mkdtemp(); src = os.path.join(d, "dp.pt"); dst = os.path.join(d, "plain.pt")
    >>> torch.save(torch.nn.DataParallel(torch.nn.Linear(2, 2)).state_dict(), src)
    >>> _ = convert_checkpoint(src, dst)
    >>> sorted(st.load(dst))
    ['bias', 'weight']
    >>> summary = convert_checkpoint(src, os.path.join(d, "m.pt"), key=None)
    >>> summary["dropped"]
    []
    """
    fmt = to or ("safetensors" if dst.endswith(".safetensors") else "torch")
    if fmt not in ("torch", "safetensors", "dcp"):
        raise ValueError(f"--to {fmt!r}; expected 'torch', 'safetensors' or 'dcp'")
    if max_shard_size is not None and fmt != "safetensors":
        raise ValueError("--max-shard-size writes safetensors shards; add --to safetensors")
    if strip != "auto" and strip != "none" and not strip.endswith("."):
        raise ValueError(f"--strip {strip!r}; expected 'auto', 'none' or a prefix ending in '.'")
    progress = _make_progress(progress_stream, _size_of(src))
    try:
        summary = _convert(
            src, dst, fmt, strip, key, max_shard_size, max_bytes, list(allow), progress
        )
    except BaseException:
        progress.close(False)  # the bar is erased: the one-line error is all that is left
        raise
    progress.close(True)
    return summary


def _convert(
    src: str,
    dst: str,
    fmt: str,
    strip: str,
    key: Optional[str],
    max_shard_size: Optional[str],
    max_bytes: Optional[int],
    allow: List[str],
    progress: _Progress,
) -> Dict[str, Any]:
    obj = _read_source(src, allow, progress)
    carried = _carried_keys(obj)
    written_key: Optional[str] = None
    if key is not None or fmt == "safetensors":
        state_dict, written_key = find_state_dict(model_view(obj), key)  # names the keys there
        if key is not None:
            obj = state_dict
    dropped = [k for k in carried if k != written_key] if key is not None else []
    if strip != "none":
        obj = _unwrapped(obj)
    if strip not in ("auto", "none"):
        if not any(k.startswith(strip) for sd in _state_dicts_in(obj) for k in sd):
            keys = [k for sd in _state_dicts_in(obj) for k in sd]
            raise ValueError(
                f"--strip {strip!r} matches no key; the keys' leading prefixes are "
                f"{_leading_prefixes(keys, 6) or 'none'}"
            )
        obj = _strip_leading_prefix(obj, strip)
    tensors = list(iter_tensors(obj))
    summary: Dict[str, Any] = {"format": fmt, "tensors": len(tensors), "key": written_key}
    box: List[Optional[str]] = [None]  # the temp path being written, for the progress bar

    def written() -> int:
        return _bytes_under(box[0])

    if fmt == "dcp":
        if not isinstance(obj, Mapping):
            raise CheckpointError(
                f"--to dcp needs a dict checkpoint; {src!r} holds a {type(obj).__name__}"
            )
        _check_output_bytes(src, list(iter_named_tensors(obj)), tensors, max_bytes, "dcp")
        progress.start(sum(map(_nbytes, tensors)), "writing")

        def write_dcp(tmp: str) -> None:
            box[0] = tmp
            with _watching(progress, written):
                _conversions.dcp_save(obj, tmp)

        atomic_write_dir(dst, write_dcp)
    elif fmt == "safetensors":
        try:
            import safetensors.torch as st_torch
        except ImportError:
            raise CheckpointError(
                "--to safetensors needs the safetensors package: "
                "pip install 'safetorch[safetensors]'"
            ) from None
        # The state dict picked above, after --strip (with --key, obj is that state dict).
        state_dict = obj if key is not None else find_state_dict(model_view(obj), written_key)[0]
        written_pairs = [(str(k), v) for k, v in state_dict.items() if isinstance(v, torch.Tensor)]
        _check_output_bytes(src, written_pairs, tensors, max_bytes, "safetensors")
        flat, entries = _for_safetensors(state_dict)
        where = f"{written_key}." if written_key else ""
        dropped = [k for k in carried if k != written_key] + [where + e for e in entries]
        summary["tensors"] = len(flat)
        progress.start(sum(map(_nbytes, flat.values())), "writing")
        if max_shard_size is not None:
            limit = _conversions.parse_size(max_shard_size)

            def write_shards(tmp: str) -> None:
                box[0] = tmp
                with _watching(progress, written):
                    summary.update(_conversions.save_sharded_safetensors(flat, tmp, limit))

            atomic_write_dir(dst, write_shards)
        else:

            def write_file(tmp: str) -> None:
                if sys.byteorder != "little":  # safetensors is little-endian: let it swap
                    st_torch.save_file(flat, tmp, metadata={"format": "pt"})
                    return
                with open(tmp, "wb") as fh:
                    _write_safetensors(flat, fh, progress)

            atomic_write(dst, write_file)
    else:
        progress.start(sum(map(_nbytes, tensors)), "writing")

        def write(tmp: str) -> None:
            with open(tmp, "wb") as fh, _torch_internals_quiet():
                torch.save(obj, _CountingWriter(fh, progress))  # type: ignore[arg-type]  # a file-like writer (write/flush), which torch.save accepts; its stub names IO[bytes]

        atomic_write(dst, write)
    progress.finish()
    summary["dropped"] = dropped
    return summary


# What safetensors/DCP output may take beyond twice the source's storage bytes by default.
OUTPUT_SLACK_BYTES = 64 * 1024 * 1024


def _distinct_storage_bytes(tensors: List[torch.Tensor]) -> int:
    seen = set()
    total = 0
    for t in tensors:
        try:
            storage = _storage_of(t)
            ident = (storage.data_ptr(), storage.nbytes(), str(t.device))
        except (RuntimeError, NotImplementedError):
            total += _nbytes(t)
            continue
        if ident not in seen:  # tensors sharing a storage count once
            seen.add(ident)
            total += storage.nbytes()
    return total


def _check_output_bytes(
    src: str,
    written: List[Tuple[str, torch.Tensor]],
    source: List[torch.Tensor],
    max_bytes: Optional[int],
    fmt: str,
) -> None:
    """Refuse, before anything is materialised, an output whose contiguous tensor data would
    exceed ``max_bytes`` (default: 2x the source's storage bytes + 64 MiB)."""
    need = sum(_nbytes(t) for _, t in written)
    have = _distinct_storage_bytes(source)
    limit = max_bytes if max_bytes is not None else 2 * have + OUTPUT_SLACK_BYTES
    if need <= limit:
        return
    where, t = max(written, key=lambda kt: _nbytes(kt[1]) - _storage_bytes(kt[1]))
    rule = (
        f"--max-bytes {_human(max_bytes)}"
        if max_bytes is not None
        else f"the default limit, 2x the {_human(have)} of tensor storage in the source "
        f"+ {_human(OUTPUT_SLACK_BYTES)}"
    )
    raise CheckpointError(
        f"--to {fmt} would write {_human(need)} of contiguous tensor data from {src!r}, over "
        f"{rule}; the largest is {where!r} (shape {list(t.shape)}, stride {list(t.stride())}, "
        f"{_human(_nbytes(t))} contiguous from a {_human(_storage_bytes(t))} storage). The file "
        "holds expanded or shared views; pass --max-bytes SIZE (e.g. "
        f"--max-bytes {max(1, -(-need // 2**30))}GiB) to write them anyway, or --to torch, which "
        "keeps views as they are"
    )


def _size_of(path: str) -> int:
    """The bytes a source takes on disk (decides whether a progress bar is worth drawing)."""
    with contextlib.suppress(CheckpointError, OSError):
        path = _saver_source(path) or path
    if path.endswith(".index.json"):
        path = os.path.dirname(os.path.abspath(path))
    return _bytes_under(path)


def _state_dicts_in(obj: Any) -> List[Mapping[str, Any]]:
    if is_state_dict(obj):
        return [obj]
    if isinstance(obj, Mapping):
        return [v for v in obj.values() if is_state_dict(v)]
    return []


def _strip_leading_prefix(obj: Any, prefix: str) -> Any:
    if is_state_dict(obj):
        out = collections.OrderedDict(
            (k[len(prefix) :] if k.startswith(prefix) else k, v) for k, v in obj.items()
        )
        if len(out) != len(obj):
            raise CheckpointError(f"stripping {prefix!r} makes keys collide")
        return out
    if isinstance(obj, Mapping):
        return {k: _strip_leading_prefix(v, prefix) for k, v in obj.items()}
    return obj


# --- inspect --keys ----------------------------------------------------------------------------
def _dtype_name(t: torch.Tensor) -> str:
    return str(t.dtype).replace("torch.", "")


def list_keys(
    path: str, pattern: str = "*", *, key: Optional[str] = None, allow: Iterable[str] = ()
) -> List[Dict[str, Any]]:
    """Every tensor entry of every state dict in a checkpoint: key, shape, dtype, bytes.

    Args:
        path: the checkpoint (any layout :func:`read_source` reads; loaded weights-only).
        pattern: a glob (``fnmatch``) matched against the key and its canonical form
            (wrapper segments dropped), e.g. ``"*.bn1.*"``.
        key: only the state dict under this container key (object name in a ``save_state``
            file), as ``st.load_state_dict(key=)``.
        allow: globals allowed as for ``st.load(allow=)`` (``--allow``).

    Returns:
        One dict per entry, in file order: ``state_dict`` (container key, or object name in a
        ``save_state`` file; ``None`` for the top level), ``key``, ``canonical`` (the key
        without wrapper segments), ``wrappers`` (the wrapper segments in it), ``shape``,
        ``dtype`` and ``bytes`` (``None`` for non-tensors).

    Raises:
        CheckpointError: the file cannot be loaded, or ``key`` is not a state dict in it.

    >>> import os, tempfile, torch
    >>> path = os.path.join(tempfile.mkdtemp(), "m.pt")
    >>> torch.save(torch.nn.DataParallel(torch.nn.Linear(2, 3)).state_dict(), path)
    >>> [(r["key"], r["shape"], r["dtype"], r["bytes"]) for r in list_keys(path, "*weight")]
    [('module.weight', [3, 2], 'float32', 24)]
    """
    view = model_view(read_source(path, allow=allow))
    holders: List[Tuple[Optional[str], Mapping[str, Any]]]
    if key is not None:
        holders = [(key, find_state_dict(view, key)[0])]
    elif is_state_dict(view):
        holders = [(None, view)]
    else:
        holders = [(k, _as_state_dict(view[k])) for k in state_dict_keys(view)]
    rows: List[Dict[str, Any]] = []
    for holder, sd in holders:
        for name, value in sd.items():
            canon = canonical_key(name)
            if not (fnmatch.fnmatchcase(name, pattern) or fnmatch.fnmatchcase(canon, pattern)):
                continue
            tensor = isinstance(value, torch.Tensor)
            rows.append(
                {
                    "state_dict": holder,
                    "key": name,
                    "canonical": canon,
                    "wrappers": [s + "." for s in _wrapper_segments_in([name])],
                    "shape": list(value.shape) if tensor else None,
                    "dtype": _dtype_name(value) if tensor else type(value).__name__,
                    "bytes": _nbytes(value) if tensor else None,
                }
            )
    return rows


def _print_keys(rows: List[Dict[str, Any]], out: IO[str]) -> None:
    if not rows:
        out.write("no matching keys\n")
        return
    width = min(max(len(r["key"]) for r in rows), 60)
    current: Any = object()
    for r in rows:
        if r["state_dict"] != current:
            current = r["state_dict"]
            out.write(f"[{current if current is not None else 'top level'}]\n")
        shape = "-" if r["shape"] is None else str(r["shape"])
        size = "-" if r["bytes"] is None else _human(r["bytes"])
        note = f"  wrapper: {', '.join(r['wrappers'])}" if r["wrappers"] else ""
        out.write(f"  {r['key']:<{width}}  {shape:<16} {r['dtype']:<9} {size:>9}{note}\n")


# --- diff --------------------------------------------------------------------------------------
def _pick_state_dict(obj: Any, key: Optional[str]) -> Mapping[str, Any]:
    return find_state_dict(obj, key)[0]


def diff_checkpoints(
    a: str,
    b: str,
    *,
    key: Optional[str] = None,
    progress_stream: Optional[IO[str]] = None,
    allow: Iterable[str] = (),
) -> Dict[str, Any]:
    """Compare the state dicts of two checkpoints, after wrapper normalisation.

    Keys are matched as :func:`safetorch.match_keys` matches them (``module.``,
    ``_orig_mod.`` ... anywhere, Lightning's ``model.``), so a DataParallel checkpoint and a
    plain one of the same weights are equal.

    Args:
        a: the first checkpoint (any layout :func:`read_source` reads: a file, a
            ``save_state`` file, a ``CheckpointSaver``, DCP or library directory, a shard index).
        b: the second checkpoint.
        key: the container key (object name in a ``save_state`` file) of the state dict in
            both (default: the one ``st.load_state_dict`` would pick).
        progress_stream: where a progress bar goes (default stderr; drawn only on a TTY for
            checkpoints above 256 MiB, while reading and comparing).
        allow: globals allowed as for ``st.load(allow=)`` (``--allow``).

    Returns:
        A JSON-ready dict: ``only_in_a``, ``only_in_b``, ``shape_changed`` and
        ``dtype_changed`` (``[key, a, b]``), ``value_changed`` (``[key, max abs diff]``),
        ``equal`` (count), ``rule`` (how keys were matched) and ``identical``.

    Raises:
        CheckpointError: a file cannot be loaded or holds no (or several) state dicts.

    >>> import os, tempfile, torch
    >>> d = tempfile.mkdtemp(); net = torch.nn.Linear(2, 2)
    >>> with torch.no_grad():
    ...     _ = net.bias.zero_()
    >>> torch.save(torch.nn.DataParallel(net).state_dict(), os.path.join(d, "a.pt"))
    >>> with torch.no_grad():
    ...     _ = net.bias.fill_(0.5)
    >>> torch.save(net.state_dict(), os.path.join(d, "b.pt"))
    >>> r = diff_checkpoints(os.path.join(d, "a.pt"), os.path.join(d, "b.pt"))
    >>> r["value_changed"], r["equal"], r["only_in_a"]
    ([['bias', 0.5]], 1, [])
    """
    allow = list(allow)
    sd_a = _pick_state_dict(
        model_view(read_source(a, allow=allow, progress_stream=progress_stream)), key
    )
    sd_b = _pick_state_dict(
        model_view(read_source(b, allow=allow, progress_stream=progress_stream)), key
    )
    match = match_keys(
        sd_a.keys(),
        sd_b.keys(),
        source_shapes={k: _shape(v) for k, v in sd_a.items()},
        target_shapes={k: _shape(v) for k, v in sd_b.items()},
    )
    result: Dict[str, Any] = {
        "a": a,
        "b": b,
        "rule": match.rule,
        "only_in_a": list(match.unmatched_source),
        "only_in_b": list(match.unmatched_target),
        "shape_changed": [],
        "dtype_changed": [],
        "value_changed": [],
        "equal": 0,
    }
    tensors = [v for v in sd_a.values() if isinstance(v, torch.Tensor)]
    progress = _make_progress(progress_stream, sum(map(_nbytes, tensors)))
    progress.start(progress.total, "comparing")
    try:
        _compare(sd_a, sd_b, match.mapping, result, progress)
    except BaseException:
        progress.close(False)
        raise
    progress.finish()
    progress.close(True)
    result["identical"] = not any(
        result[k]
        for k in ("only_in_a", "only_in_b", "shape_changed", "dtype_changed", "value_changed")
    )
    return result


def _compare(
    sd_a: Mapping[str, Any],
    sd_b: Mapping[str, Any],
    mapping: Mapping[str, str],
    result: Dict[str, Any],
    progress: _Progress,
) -> None:
    for ka, kb in mapping.items():
        va, vb = sd_a[ka], sd_b[kb]
        name = kb if ka == kb else f"{kb}"
        if not (isinstance(va, torch.Tensor) and isinstance(vb, torch.Tensor)):
            if _values_equal(va, vb):
                result["equal"] += 1
            else:
                result["value_changed"].append([name, None])
            continue
        progress.advance(_nbytes(va))
        if va.shape != vb.shape:
            result["shape_changed"].append([name, list(va.shape), list(vb.shape)])
            continue
        if va.dtype != vb.dtype:
            result["dtype_changed"].append([name, _dtype_name(va), _dtype_name(vb)])
        va, vb = _comparable(name, va, vb)
        diff = _max_abs_diff(va, vb)
        if diff is None:
            result["equal"] += 1
        else:
            result["value_changed"].append([name, diff])


# A comparison may touch this many bytes beyond what the two tensors' storages hold (small
# expanded buffers compare as usual).
DIFF_SLACK_BYTES = 64 * 1024 * 1024


def _storage_bytes(t: torch.Tensor) -> int:
    try:
        return int(_storage_of(t).nbytes())
    except (RuntimeError, NotImplementedError):  # a tensor without storage (meta, sparse, ...)
        return _nbytes(t)


def _comparable(key: str, a: torch.Tensor, b: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """``a`` and ``b`` with the dimensions both broadcast (stride 0) narrowed to one element,
    which compares the same; a CheckpointError when what is left would still touch more bytes
    than their storages hold (an expanded or overlapping view: ``torch.zeros(1).expand(2**32)``
    is a 4-byte storage whose elementwise comparison would take 16 GB)."""
    if a.layout != torch.strided or b.layout != torch.strided:
        return a, b
    for d in range(a.dim()):
        if a.size(d) > 1 and a.stride(d) == 0 and b.stride(d) == 0:
            a, b = a.narrow(d, 0, 1), b.narrow(d, 0, 1)
    need = a.numel() * max(a.element_size(), b.element_size(), 8)  # compared in float64
    have = _storage_bytes(a) + _storage_bytes(b)
    if need > 8 * have + DIFF_SLACK_BYTES:
        which = a if _nbytes(a) > _storage_bytes(a) else b
        raise CheckpointError(
            f"cannot compare {key!r}: it is a view of shape {list(which.shape)} with stride "
            f"{list(which.stride())} over a storage of {_human(_storage_bytes(which))}; an "
            f"elementwise comparison would take {_human(need)} (views are compared only up to "
            f"8x their storage bytes + {_human(DIFF_SLACK_BYTES)}); the checkpoint holds an "
            "expanded or overlapping tensor"
        )
    return a, b


def _shape(value: Any) -> Optional[Tuple[int, ...]]:
    return tuple(value.shape) if isinstance(value, torch.Tensor) else None


def _values_equal(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:  # objects without a truthful ==: treat as changed
        return False


def _max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> Optional[float]:
    """None when equal (NaNs in the same places count as equal), else the max abs diff."""
    if a.dtype == b.dtype and torch.equal(a, b):
        return None
    if a.is_complex() or b.is_complex():
        da, db = a.to(torch.complex128), b.to(torch.complex128)
    elif a.dtype == torch.bool and b.dtype == torch.bool:
        return float((a != b).sum().item() > 0)
    else:
        da, db = a.to(torch.float64), b.to(torch.float64)
    both_nan = torch.isnan(da) & torch.isnan(db)
    delta = (da - db).abs().masked_fill(both_nan, 0)
    if delta.numel() == 0:
        return None
    m = delta.max().item()
    if m != m:  # NaN on one side only
        return float("nan")
    return None if m == 0 else float(m)


def _print_diff(r: Dict[str, Any], out: IO[str]) -> None:
    out.write(f"a: {r['a']}\nb: {r['b']}\n")
    if r["rule"] != "exact":
        out.write(f"keys matched: {r['rule']}\n")
    for label, name in (("only in a", "only_in_a"), ("only in b", "only_in_b")):
        if r[name]:
            out.write(f"{label} ({len(r[name])}): {', '.join(r[name])}\n")
    for key, sa, sb in r["shape_changed"]:
        out.write(f"shape changed: {key} {sa} -> {sb}\n")
    for key, da, db in r["dtype_changed"]:
        out.write(f"dtype changed: {key} {da} -> {db}\n")
    for key, diff in r["value_changed"]:
        out.write(f"values differ: {key}" + (f" (max abs diff {diff:.6g})" if diff else "") + "\n")
    changed = len(r["value_changed"]) + len(r["shape_changed"])
    out.write(
        f"{paint('identical', 'green', out) if r['identical'] else paint('different', 'red', out)}"
        f": {r['equal']} equal, "
        f"{changed} changed, {len(r['only_in_a'])} only in a, {len(r['only_in_b'])} only in b\n"
    )


# --- fit ---------------------------------------------------------------------------------------
def _is_cwd_entry(entry: Any, cwd: str) -> bool:
    if not isinstance(entry, str):
        return False
    if entry in ("", "."):
        return True
    try:
        return os.path.realpath(entry) == cwd
    except (OSError, ValueError):
        return False


@contextlib.contextmanager
def _cwd_searched_last() -> Iterator[None]:
    """While the user's ``--model`` module is imported, the working directory is searched after
    every installed package, never before: a ``safetensors.py``, ``torch.py`` or ``numpy.py``
    shipped in a downloaded checkpoint directory cannot shadow the real package when ``fit`` is
    run there, while the user's own module (and its siblings) in that directory are still found.
    Entries the import adds to ``sys.path`` are kept; the interpreter's own are restored."""
    cwd = os.path.realpath(os.getcwd())
    saved = list(sys.path)
    sys.path[:] = [p for p in saved if not _is_cwd_entry(p, cwd)] + [cwd]
    try:
        yield
    finally:
        before = set(saved)
        sys.path[:] = [p for p in sys.path if p not in before and p != cwd] + saved


def _model_from(spec: str) -> torch.nn.Module:
    """The model ``module:factory`` names (a callable is called without arguments)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(
            f"--model {spec!r}: expected MODULE:FACTORY, e.g. torchvision.models:resnet18 or "
            "mypkg.model:build (a callable without required arguments, or an nn.Module)"
        )
    with _cwd_searched_last():  # the factory may import its siblings lazily: keep it around
        return _build_model(spec, module_name, attr)


def _build_model(spec: str, module_name: str, attr: str) -> torch.nn.Module:
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"--model {spec!r}: cannot import {module_name!r} ({exc})") from None
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"--model {spec!r}: {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if isinstance(obj, torch.nn.Module):
        return obj
    if not callable(obj):
        raise ValueError(f"--model {spec!r}: {attr!r} is a {type(obj).__name__}, not a factory")
    model = obj()
    if not isinstance(model, torch.nn.Module):
        raise ValueError(
            f"--model {spec!r}: {attr}() returned a {type(model).__name__}, not an nn.Module"
        )
    return model


def fit_checkpoint(
    path: str,
    model: torch.nn.Module,
    *,
    key: Optional[str] = None,
    prefix: Optional[str] = None,
    allow: Iterable[str] = (),
) -> Any:
    """What ``st.load_state_dict(model, path)`` would do, without loading into ``model``.

    The load runs with ``strict=False`` into a copy of ``model`` on the ``meta`` device (no
    memory for its weights, and ``model`` is untouched), through the very function a real
    load uses; ``report.ok`` says whether a strict load would succeed.

    Args:
        path: the checkpoint: a file (a ``save_state`` file too), a ``CheckpointSaver``, DCP
            or library directory, a shard index.
        model: the model the checkpoint is meant for.
        key: the container key of the state dict (as for ``st.load_state_dict``).
        prefix: take a sub-module's keys (as for ``st.load_state_dict``, where supported).
        allow: globals allowed as for ``st.load(allow=)`` (``--allow``; files only: the other
            layouts hold no pickled globals a model load reads).

    Returns:
        The :class:`~safetorch.LoadReport`.

    Raises:
        CheckpointError: the file cannot be loaded, holds no (or several) state dicts, or the
            key mapping is ambiguous.
        TypeError: ``model`` is not an ``nn.Module``.

    >>> import os, tempfile, torch
    >>> path = os.path.join(tempfile.mkdtemp(), "m.pt")
    >>> torch.save(torch.nn.DataParallel(torch.nn.Linear(2, 2)).state_dict(), path)
    >>> report = fit_checkpoint(path, torch.nn.Linear(2, 3))
    >>> report.ok, report.mismatched[0]
    (False, ('weight', (2, 2), (3, 2)))
    """

    if not isinstance(model, torch.nn.Module):
        raise TypeError(
            f"fit_checkpoint(model=...) expects an nn.Module, got {type(model).__name__}"
        )
    import copy

    shadow = copy.deepcopy(model).to("meta")
    kwargs: Dict[str, Any] = {"strict": False, "key": key}
    if prefix is not None:
        kwargs["prefix"] = prefix
    with warnings.catch_warnings():
        # torch says each copy into a meta parameter is a no-op: that is the point here.
        warnings.filterwarnings("ignore", message=".*copying from a non-meta parameter")
        # The load is strict=False on purpose: what it left unloaded is the report itself.
        warnings.filterwarnings("ignore", message=r"load_state_dict\(strict=False\) left")
        path = _saver_source(path) or path
        layout = _resolve.resolve(path)
        if not isinstance(layout, _layouts.FileLayout):
            return load_state_dict(shadow, path, **kwargs)  # matched on its meta view
        return load_state_dict(shadow, load(layout.path, allow=list(allow)), **kwargs)


def _report_json(report: Any) -> Dict[str, Any]:
    return {
        "ok": report.ok,
        "rule": report.rule,
        "source_key": report.source_key,
        "loaded": report.loaded,
        "missing": report.missing,
        "unexpected": report.unexpected,
        "mismatched": [[k, list(a), list(b)] for k, a, b in report.mismatched],
        "n_averaged": report.n_averaged,
        "hint": getattr(report, "hint", None),
        "other_state_dicts": getattr(report, "other_state_dicts", []),
    }


# --- commands ----------------------------------------------------------------------------------
class _BadInput(Exception):
    """An expected failure: one line on stderr and this exit status."""

    def __init__(self, message: str, status: int = 2) -> None:
        super().__init__(message)
        self.status = status


def _readable_file(path: str, what: str = "checkpoint") -> None:
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _BadInput(f"{path!r} is a symlink loop; pass the path of a {what} file") from None
        mode = None
    if mode is not None and not stat.S_ISREG(mode) and not stat.S_ISDIR(mode):
        raise _BadInput(
            f"{path!r} is {_reader.file_kind(mode)}, not a regular file; a {what} is read only from a "
            "regular file (copy it to one first)"
        )
    if not os.path.exists(path):
        parent = os.path.dirname(os.path.abspath(path))
        where = "" if os.path.isdir(parent) else f" (directory {parent} does not exist either)"
        raise _BadInput(f"no such file: {path!r}{where}; pass the path of a {what} file")
    if os.path.isdir(path):
        raise _BadInput(
            f"{path!r} is a directory; pass a {what} file inside it "
            "(e.g. .../model.pt; a torch.distributed.checkpoint directory loads with DCP)"
        )
    if not os.access(path, os.R_OK):
        raise _BadInput(f"cannot read {path!r}: permission denied")


def _writable_target(path: str) -> None:
    if os.path.isdir(path):
        raise _BadInput(
            f"OUT {path!r} is a directory; pass a file path, e.g. {os.path.join(path, 'model.pt')}"
        )
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise _BadInput(
            f"cannot write {path!r}: directory {parent} does not exist; create it first"
        )


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= 2000 else text[:2000] + " ..."


def _dcp_exception() -> Tuple[Type[BaseException], ...]:
    """torch.distributed.checkpoint's CheckpointException: a BaseException, not an Exception
    (imported lazily: it is absent from builds without torch.distributed)."""
    try:
        from torch.distributed.checkpoint.api import CheckpointException
    except Exception:  # no torch.distributed, or an old torch without the module
        return ()
    return (CheckpointException,)


def _dcp_failures(exc: BaseException) -> str:
    """A CheckpointException's per-rank causes, without the tracebacks its str() holds."""
    failures = getattr(exc, "failures", None)
    if not isinstance(failures, Mapping) or not failures:
        return _one_line(exc).split(" Traceback ")[0]
    parts = []
    for rank, failure in list(failures.items())[:4]:
        cause = failure[0] if isinstance(failure, tuple) and failure else failure
        parts.append(f"rank {rank}: {type(cause).__name__}: {_one_line(cause)}")
    more = f" (and {len(failures) - 4} more ranks)" if len(failures) > 4 else ""
    return "; ".join(parts) + more


def _guarded(command: str, body: Callable[[argparse.Namespace], int]) -> Callable[..., int]:
    """Run a command; every failure ends in one line on stderr (never a traceback): exit 2 for
    bad input, 1 for failed work, 130 when interrupted."""

    def say(text: str) -> None:
        say_error(f"safetorch ckpt {command}", escape(text))

    def run(args: argparse.Namespace) -> int:
        dcp_errors = _dcp_exception()
        try:
            return body(args)
        except _BadInput as exc:
            say(str(exc))
            return exc.status
        except UnsafeCheckpointError as exc:
            say(str(exc).splitlines()[0])
            return 1
        except (CheckpointError, ValueError) as exc:
            say(_one_line(exc))
            return 2
        except BrokenPipeError:
            raise  # `safetorch ckpt inspect ... | head`: the top-level command ends quietly
        except KeyboardInterrupt:
            say("interrupted")
            return 130
        except RecursionError:
            say("the checkpoint nests too deeply to be processed (RecursionError); it is malformed")
            return 2
        except MemoryError:
            say("out of memory (the checkpoint asks for more memory than this machine has)")
            return 1
        except OSError as exc:  # e.g. disk full while writing
            say(_one_line(exc))
            return 1
        except dcp_errors as exc:  # a BaseException: not caught by `except Exception`
            say(f"torch.distributed.checkpoint failed: {_dcp_failures(exc)}")
            return 2
        except Exception as exc:  # anything else: still one line, with what it was
            say(f"failed with {type(exc).__name__}: {_one_line(exc)}")
            return 1

    return run


def _is_layout(path: str) -> bool:
    return os.path.isdir(path) or path.endswith(".index.json")


def _readable_source(path: str) -> None:
    """A path any command reads: a directory or shard index (its layout is resolved when it is
    read), or a readable regular file."""
    if not (_is_layout(path) and os.path.exists(path)):
        _readable_file(path)
    elif os.path.isdir(path) and saver_checkpoint(path) is None:
        try:
            _resolve.resolve(path)
        except CheckpointError as exc:
            raise _BadInput(f"{path!r} is a directory; {_one_line(exc)}") from None


def _print_layout(info: Dict[str, Any], out: IO[str]) -> None:
    out.write(f"path: {info['path']} ({info['layout']})\n")
    out.write(f"model weights: {info['model']}\n")
    for f in info["files"]:
        out.write(f"  {f['file']:<40} {_human(f['bytes']):>10}  {f['role']}\n")
    if "state_dict_tensors" in info:
        where = info.get("state_dict_key") or "(top level)"
        out.write(
            f"state dict: {where} ({info['state_dict_tensors']} tensors, "
            f"{_human(info['tensor_bytes'])}; st.load_state_dict loads it)\n"
        )
        others = [k for k in info.get("state_dicts", []) if k != info.get("state_dict_key")]
        if others:
            out.write("other state dicts: " + ", ".join(others) + "\n")
        prefixes = [
            f"{p} ({_PREFIX_NOTES[p]})" if p in _PREFIX_NOTES else p
            for p in info.get("wrapper_prefixes", [])
        ]
        out.write("wrapper prefixes: " + (", ".join(prefixes) or "none") + "\n")
    elif info.get("state_dict_note"):
        out.write(f"state dict: {info['state_dict_note']}\n")


def _describe_saver(path: str, picked: str, why: str) -> Dict[str, Any]:
    """A ``CheckpointSaver`` directory file by file, with the checkpoint it stands for named."""
    files = []
    for name in sorted(os.listdir(path)):
        full = os.path.join(path, name)
        if name.startswith("."):
            continue  # a temp file of an interrupted write
        role = "CheckpointSaver index" if name.endswith(".json") else "checkpoint"
        if os.path.realpath(full) == os.path.realpath(picked):
            role = why
        files.append({"file": name, "bytes": _bytes_under(full), "role": role})
    return {
        "path": path,
        "layout": "CheckpointSaver directory",
        "model": f"{os.path.basename(picked)} in {path!r}",
        "files": files,
    }


def _describe_state_layout(path: str, info: Dict[str, Any]) -> None:
    """A DCP directory written from a ``save_state`` file (``ckpt convert state.pt d --to
    dcp``) keeps the file's structure: find its models in ``objects``, as for the file. The
    marker is read (a bytes entry, through the restricted unpickler) before it is trusted."""
    layout = _resolve.resolve(path)
    if not isinstance(layout, _dcp_load.DCPDirectory):
        return
    view = layout.meta_view()
    if not (isinstance(view, Mapping) and isinstance(view.get("objects"), Mapping)):
        return
    if "__safetorch__" not in layout.metadata.state_dict_metadata:
        return
    if layout.read(["__safetorch__"])["__safetorch__"] != STATE_FORMAT:
        return
    objects = view["objects"]
    info["state_dicts"] = state_dict_keys(objects)
    try:
        sd, key = find_state_dict(objects)
    except CheckpointError as exc:
        info["state_dict_note"] = str(exc)
        return
    del info["state_dict_note"]
    info["state_dict_key"] = key
    info["state_dict_tensors"] = len(sd)
    info["tensor_bytes"] = sum(_nbytes(t) for t in sd.values() if isinstance(t, torch.Tensor))
    info["wrapper_prefixes"] = known_prefixes(sd)


def _inspect_directory(args: argparse.Namespace, allow: List[str]) -> Dict[str, Any]:
    """``inspect`` of a directory or shard index: its files, and the checkpoint it stands for
    (``checkpoint`` when that is one file, ``checkpoint_layout`` when it is a DCP directory)."""
    saver = saver_checkpoint(args.path) if os.path.isdir(args.path) else None
    if saver is not None:
        info = _describe_saver(args.path, *saver)
        picked = saver[0]
        if os.path.isdir(picked):  # a DCP state directory
            info["checkpoint_layout"] = _resolve.describe(picked)
        else:
            info["checkpoint"] = inspect_checkpoint(picked, allow=allow, key=args.key)
        return info
    info = _resolve.describe(args.path)
    if "state_dict_note" in info:
        _describe_state_layout(args.path, info)
    if info["layout"] == "file":  # a directory with one torch.save file: describe it too
        picked = os.path.join(
            args.path, next(f["file"] for f in info["files"] if "model" in f["role"])
        )
        info["checkpoint"] = inspect_checkpoint(picked, allow=allow, key=args.key)
    return info


def _cmd_inspect(args: argparse.Namespace) -> int:
    allow = allow_list(args.allow)
    if args.keys is not None:
        _readable_source(args.path)
        if not _is_layout(args.path):
            info = inspect_checkpoint(args.path, allow=allow)  # refuses unsafe files unloaded
            if info["unsafe_globals"]:
                _emit(args, info, _print_info)
                return 1
        rows = list_keys(args.path, args.keys, key=args.key, allow=allow)
        _emit(args, rows, _print_keys)
        return 0
    if _is_layout(args.path) and os.path.exists(args.path):
        _readable_source(args.path)
        info = _inspect_directory(args, allow)
        if args.json:
            _emit(args, info, _print_layout)
        else:  # escaped once, then printed part by part
            _print_layout(shown := escape_all(info), sys.stdout)
            if "checkpoint_layout" in shown:
                _print_layout(shown["checkpoint_layout"], sys.stdout)
            if "checkpoint" in shown:
                _print_info(shown["checkpoint"], sys.stdout)
        return 1 if info.get("checkpoint", {}).get("unsafe_globals") else 0
    _readable_file(args.path)
    info = inspect_checkpoint(args.path, allow=allow, key=args.key)
    _emit(args, info, _print_info)
    return 1 if info["unsafe_globals"] else 0


def _emit(args: argparse.Namespace, value: Any, printer: Callable[[Any, IO[str]], None]) -> None:
    if args.json:
        sys.stdout.write(json.dumps(value, indent=2) + "\n")
    else:
        printer(escape_all(value), sys.stdout)


def _cmd_convert(args: argparse.Namespace) -> int:
    _readable_source(args.src)
    if os.path.abspath(args.src) == os.path.abspath(args.dst):
        raise _BadInput(f"IN and OUT are the same path ({args.src!r}); write to a new path")
    if args.to == "dcp" or args.max_shard_size is not None:  # OUT is a directory
        if os.path.exists(args.dst) and (not os.path.isdir(args.dst) or os.listdir(args.dst)):
            raise _BadInput(
                f"OUT {args.dst!r} exists; a {'DCP' if args.to == 'dcp' else 'shard'} directory "
                "is written to a new path"
            )
        parent = os.path.dirname(os.path.abspath(args.dst))
        if not os.path.isdir(parent):
            raise _BadInput(f"cannot write {args.dst!r}: directory {parent} does not exist")
    else:
        _writable_target(args.dst)
    summary = convert_checkpoint(
        args.src,
        args.dst,
        strip=args.strip,
        to=args.to,
        key=args.key,
        max_shard_size=args.max_shard_size,
        max_bytes=None if args.max_bytes is None else _conversions.parse_size(args.max_bytes),
        allow=allow_list(args.allow),
    )
    if args.json:
        sys.stdout.write(json.dumps({"path": args.dst, **summary}, indent=2) + "\n")
        return 0
    summary, what = escape_all(summary), f"{summary['tensors']} tensors"
    if summary.get("key"):
        what += f" of {summary['key']!r}"
    line = f"wrote {escape(args.dst)} ({summary['format']}, {what})"
    if summary["dropped"]:
        why = (
            "a safetensors file holds one state dict's tensors; --to torch keeps everything"
            if summary["format"] == "safetensors"
            else f"--key {escape(args.key)} writes only that state dict"
        )
        line += "; " + paint(
            f"not carried over: {', '.join(summary['dropped'])}", "yellow", sys.stdout
        )
        line += f" ({why})"
    sys.stdout.write(line + "\n")
    return 0


def _cmd_diff(args: argparse.Namespace) -> int:
    _readable_source(args.a)
    _readable_source(args.b)
    result = diff_checkpoints(args.a, args.b, key=args.key, allow=allow_list(args.allow))
    _emit(args, result, _print_diff)
    return 0 if result["identical"] else 1


def _cmd_fit(args: argparse.Namespace) -> int:
    _readable_source(args.path)
    allow = allow_list(args.allow)
    try:
        model = _model_from(args.model)
    except ValueError:
        raise
    except Exception as exc:  # the user's factory failed: their error, in one line
        raise _BadInput(
            f"--model {args.model!r}: building the model raised {type(exc).__name__}: {exc}"
        ) from None
    report = fit_checkpoint(args.path, model, key=args.key, prefix=args.prefix, allow=allow)
    if args.json:
        sys.stdout.write(json.dumps(_report_json(report), indent=2) + "\n")
    else:
        sys.stdout.write(escape(report, keep="\n") + "\n")
        verdict = (
            paint("fits", "green", sys.stdout) + ": st.load_state_dict(model, path) loads every key"
            if report.ok
            else (
                paint("does not fit", "red", sys.stdout) + ": a strict st.load_state_dict would "
                f"refuse; strict=False would load {len(report.loaded)} keys"
            )
        )
        sys.stdout.write(verdict + "\n")
    return 0 if report.ok else 1


def _cmd_verify(args: argparse.Namespace) -> int:
    allow_list(args.allow)  # validated as everywhere; verify unpickles nothing
    if not os.path.isdir(args.path):  # a directory (a CheckpointSaver's too): every file in it
        _readable_file(args.path)
    report = verify_checkpoint(args.path)
    if report.format == "directory" and not report.files:
        raise _BadInput(f"{args.path!r}: {report.problems[0]}; pass a checkpoint file or directory")
    if args.json:
        sys.stdout.write(json.dumps(report.to_json(), indent=2) + "\n")
    else:
        for problem in report.problems:
            sys.stdout.write(escape(f"{args.path}: {problem}") + "\n")
        sys.stdout.write(escape(report.summary()) + "\n")
    return 0 if report.ok else 1


_COMMANDS: Dict[str, Callable[[argparse.Namespace], int]] = {
    "inspect": _guarded("inspect", _cmd_inspect),
    "convert": _guarded("convert", _cmd_convert),
    "diff": _guarded("diff", _cmd_diff),
    "verify": _guarded("verify", _cmd_verify),
    "fit": _guarded("fit", _cmd_fit),
}


def run_command(args: argparse.Namespace) -> int:
    """Run the ``safetorch ckpt`` action ``args.ckpt_command`` (parsed by
    :func:`safetorch._cli.add_ckpt_parsers`); returns the exit status."""
    return _COMMANDS[args.ckpt_command](args)


def add_parsers(subparsers: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    """Register ``safetorch ckpt inspect|convert|diff|verify|fit`` (defined, torch-free, in
    :func:`safetorch._cli.add_ckpt_parsers`)."""
    from safetorch._cli import add_ckpt_parsers

    add_ckpt_parsers(subparsers)
