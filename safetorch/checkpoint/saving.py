"""Saving and trusting: st.save (torch.save that records provenance), st.save_checkpoint
(atomic, rank 0 only; CheckpointSaver builds on it, saver.py) and st.trust (the user's word).

A file that a weights-only load would refuse (a whole model, numpy arrays, custom objects) gets
its content hash recorded in the user's ledger (:mod:`safetorch.checkpoint._provenance`) while
it is written; ``st.load`` then loads it fully. A state dict is written exactly as
``torch.save`` writes it, with nothing hashed. torch's ``torch.save`` is captured at import
(``_torch_save``).
"""

from __future__ import annotations

import collections
import io
import logging
import os
import pickle
import types
import zipfile
from typing import (
    IO,
    Any,
    Callable,
    FrozenSet,
    Iterable,
    Mapping,
    NamedTuple,
    Optional,
    Tuple,
)

import torch
from torch import nn

from safetorch import _dist
from safetorch.checkpoint import _formats, _provenance, _unpickler
from safetorch.checkpoint._common import PathLike, _first_line, _torch_internals_quiet
from safetorch.errors import (
    CheckpointError,
)

# What st.save needs is imported above: the patched torch.save imports this module at a
# program's first save. The scanner, the file reader, the zip verifier, the key helpers and
# the atomic writer are imported by the functions that use them (trust, an unsure pickle,
# save_checkpoint), so a plain torch.save never imports st.load's machinery.

__all__ = ["save", "save_checkpoint", "trust", "untrust", "Trusted", "on_rank0"]

logger = logging.getLogger("safetorch")
_torch_save = torch.save
_DEFAULT_PROTOCOL = 2  # torch.serialization.DEFAULT_PROTOCOL, every torch since 0.4


# --- provenance: what a weights-only load would refuse is recorded ---------------------------
_EXTRA = _unpickler.resolve_allowed(_unpickler.DEFAULT_EXTRA_ALLOWED)
_ALLOWED: Optional[FrozenSet[str]] = None  # "module.Name" a weights-only load admits
# Instances the pickler reduces with globals it then checks itself (their classes/functions):
# the types of a state dict. Any other instance makes the exact scan decide (it may reduce to
# a global by name, as a dtype does).
_PLAIN = (torch.Tensor, torch.nn.Parameter, torch.Size, collections.OrderedDict, torch.dtype)


def _allowed() -> FrozenSet[str]:
    global _ALLOWED
    if _ALLOWED is None:
        _ALLOWED = frozenset(_unpickler.torch_allowed_globals()) | frozenset(_EXTRA)
    return _ALLOWED


def needs_trust(data: bytes) -> bool:
    """Whether a weights-only load refuses the pickle ``data`` (the exact scanner decides).

    >>> import pickle, collections
    >>> needs_trust(pickle.dumps(collections.OrderedDict(a=1), protocol=2))
    False
    >>> needs_trust(pickle.dumps(NamedTuple, protocol=2))
    True
    """
    from safetorch.checkpoint import _scan

    result = _scan.ScanResult()
    complete = _scan.scan_pickle(io.BytesIO(data), result)
    return (
        not complete
        or result.refused is not None
        or bool(_unpickler.unsafe_globals(result.globals, _EXTRA))
    )


class _NeedsTrust(Exception):
    """Raised out of torch.save's pickling: this object must be written with its hash."""


def _deciding_module(on_needs: Callable[[], None]) -> Any:
    """``pickle`` whose Pickler watches what it writes: every class and function it saves by
    name (``reducer_override`` sees each first), and instances of types a state dict does not
    hold (then the exact scan of the pickle decides). Once the object pickle is complete, and
    before torch.save writes any of it (data.pkl is written after pickling), ``on_needs()`` runs
    when a weights-only load would refuse it."""

    class Pickler(pickle.Pickler):
        def __init__(self, file: Any, *args: Any, **kwargs: Any) -> None:
            super().__init__(file, *args, **kwargs)
            self._safetorch_file = file
            self._safetorch_needs = False
            self._safetorch_unsure = False

        def reducer_override(self, obj: Any) -> Any:
            if not self._safetorch_needs and not isinstance(obj, _PLAIN):
                if isinstance(obj, (type, types.FunctionType, types.BuiltinFunctionType)):
                    name = (
                        f"{getattr(obj, '__module__', None)}.{getattr(obj, '__qualname__', None)}"
                    )
                    if name not in _allowed():
                        self._safetorch_needs = True
                else:
                    self._safetorch_unsure = True
            return NotImplemented

        def dump(self, obj: Any) -> None:
            super().dump(obj)
            file = self._safetorch_file
            if isinstance(file, io.BytesIO):  # torch.save's data.pkl buffer (the zip format)
                if self._safetorch_needs or (
                    self._safetorch_unsure and needs_trust(file.getvalue())
                ):
                    on_needs()

    module = types.ModuleType("pickle")
    module.__dict__.update(vars(pickle))
    module.Pickler = Pickler  # type: ignore[attr-defined]  # a synthetic pickle module
    return module


def _raise_needs_trust() -> None:
    raise _NeedsTrust


def save(
    obj: Any,
    f: Any,
    pickle_module: Any = pickle,
    pickle_protocol: int = _DEFAULT_PROTOCOL,
    **kwargs: Any,
) -> None:
    """``torch.save``, and a file a weights-only load would refuse is trusted by provenance.

    Same arguments as ``torch.save``; a state dict saved to a path is written by torch's own
    path writer, byte for byte what ``torch.save`` writes. When the pickle holds something
    ``st.load``'s weights-only policy refuses (a whole ``nn.Module``, numpy arrays, custom
    objects), the SHA-256 of the bytes written is computed while they are written and recorded
    in the user's ledger (no path, only size and hash), so a later ``st.load`` of the same
    bytes loads them fully, as ``torch.load(weights_only=False)`` would; a state dict is not
    hashed. Under ``st.patch()`` / ``safetorch
    run``, ``torch.save`` is this function. A custom ``pickle_module`` (``dill``) goes to
    torch untouched and is not recorded. The legacy format
    (``_use_new_zipfile_serialization=False``) is always hashed.

    Args:
        obj: what to save.
        f: a path or a binary file object (the hash recorded is that of the bytes written to
            it; a file holding other bytes too will not match it).
        pickle_module, pickle_protocol, kwargs: as ``torch.save``.

    >>> import os, tempfile, torch, safetorch as st
    >>> path = os.path.join(tempfile.mkdtemp(), "model.pt")
    >>> st.save(torch.nn.Linear(2, 2), path)   # a whole model: its hash is recorded
    >>> type(st.load(path)).__name__           # loaded fully: safetorch wrote it
    'Linear'
    """
    if pickle_module is not pickle:
        with _torch_internals_quiet():
            _torch_save(obj, f, pickle_module, pickle_protocol, **kwargs)
        return
    legacy = not kwargs.get("_use_new_zipfile_serialization", True)
    opened: Optional[IO[bytes]] = None
    if _formats.is_path(f) and not legacy and isinstance(obj, torch.nn.Module):
        # A whole module (its class is pickled by name: almost always a pickle that needs
        # trust) goes straight to the hashing writer rather than being pickled twice; the
        # writer still hashes only what needs it. A path that cannot be opened goes on to
        # torch's path writer, which raises torch's own error for it.
        try:
            opened = open(f, "wb")
        except OSError:
            opened = None
    if opened is None and _formats.is_path(f) and not legacy:
        # torch's own path writer first: a state dict is written exactly as torch.save writes
        # it. A pickle that needs trust stops before any of it is written, and the file is
        # written again below through the hashing writer.
        try:
            with _torch_internals_quiet():
                _torch_save(obj, f, _deciding_module(_raise_needs_trust), pickle_protocol, **kwargs)
            return
        except _NeedsTrust:
            pass
    if _formats.is_path(f):
        with opened if opened is not None else open(f, "wb") as fh:
            entry = _save_through(obj, fh, pickle_protocol, legacy, kwargs)
    else:
        entry = _save_through(obj, f, pickle_protocol, legacy, kwargs)
    if entry is not None:
        _provenance.record(entry)


def _save_through(
    obj: Any, fh: IO[bytes], protocol: int, legacy: bool, kwargs: Mapping[str, Any]
) -> Optional[_provenance.Entry]:
    seekable = getattr(fh, "seekable", None)
    begin = fh.tell() if callable(seekable) and seekable() else None
    writer = _provenance.HashingWriter(fh)
    if legacy:
        writer.start()  # the legacy format pickles straight into the file
    with _torch_internals_quiet():
        _torch_save(obj, writer, _deciding_module(writer.start), protocol, **kwargs)  # type: ignore[arg-type]  # a file-like writer (write/flush), which torch.save accepts
    if writer.late and begin is not None:
        # Bytes went out before the pickle was known to need trust (no torch does this
        # today): write it again, hashed from the first byte.
        fh.seek(begin)
        fh.truncate()
        writer = _provenance.HashingWriter(fh)
        writer.start()
        with _torch_internals_quiet():
            _torch_save(obj, writer, _deciding_module(writer.start), protocol, **kwargs)  # type: ignore[arg-type]  # a file-like writer (write/flush), which torch.save accepts
    return writer.entry()  # None for what loads weights-only: nothing was hashed


class Trusted(NamedTuple):
    """What :func:`trust` recorded: the file, its size and SHA-256, and the globals its pickle
    imports (what a full load of it may run).

    >>> import os, tempfile, torch, safetorch as st
    >>> path = os.path.join(tempfile.mkdtemp(), "arr.pt")
    >>> torch.save({"w": torch.ones(1)}, path)
    >>> t = st.trust(path)
    >>> t.size == os.path.getsize(path), len(t.sha256), "torch._utils._rebuild_tensor_v2" in t.globals
    (True, 64, True)
    """

    path: str
    size: int
    sha256: str
    globals: Tuple[str, ...]


_SHOWN = 1 << 16  # globals st.trust lists (each a distinct name the pickle imports)


class Inspected(NamedTuple):
    """What a full load of a file would import, from the bytes that were hashed."""

    entry: _provenance.Entry
    globals: Tuple[str, ...]
    more: int  # globals past those listed (the scan lists at most 65,536)
    incomplete: Optional[str]  # why the list may miss globals (the scan stopped), else None


def inspect_for_trust(path: PathLike) -> Inspected:
    """Read ``path`` once (a regular file): its entry and the globals its pickle names, scanned
    from the same bytes. A zip archive that torch's reader and Python's ``zipfile`` could read
    as different records (two central directories, duplicate members, ...) is refused: the
    globals shown must be those of the ``data.pkl`` torch unpickles.

    Raises:
        CheckpointError: the file is missing, not a regular file, or an ambiguous or damaged
            zip archive.
    """
    from safetorch.checkpoint import _reader, _scan
    from safetorch.checkpoint.verify import zip_layout_problem

    shown = os.fspath(path)
    with _reader.open_regular(path, "checkpoint") as opened:
        data, entry = _provenance.read_hashed(opened.fh)
    buffer = io.BytesIO(data)
    kind = _formats.sniff(buffer, _formats.read_head(buffer))
    if kind == "safetensors":
        return Inspected(entry, (), 0, None)
    if kind == "zip":
        problem = zip_layout_problem(buffer, len(data))
        if problem is not None:
            raise CheckpointError(
                f"cannot trust {shown!r}: {problem}; torch could unpickle another record than "
                "the one shown, so it is not trusted"
            )
        buffer.seek(0)
        try:
            with zipfile.ZipFile(buffer) as archive:
                scan = _scan.scan_archive(archive, cap=_SHOWN)
        except Exception as exc:  # BadZipFile, OSError, ...
            raise CheckpointError(
                f"cannot trust {shown!r}: the zip archive is damaged ({exc})"
            ) from None
    else:
        scan = _scan.scan_file(buffer, cap=_SHOWN)
    incomplete = None
    if scan.refused is not None or not scan.complete:
        incomplete = scan.refused or scan.stopped or "the pickle could not be read to its end"
    return Inspected(entry, tuple(scan.globals), scan.more, incomplete)


def trust(path: PathLike) -> Trusted:
    """Trust the checkpoint at ``path`` as it is now: record its hash in the user's ledger.

    ``st.load`` then loads these bytes fully (a whole-model pickle, numpy arrays, custom
    objects), as ``torch.load(weights_only=False)`` would; a changed file is untrusted again.
    This is the user's word, for files safetorch did not write (a legacy script's old
    ``model.pkl``): calling it runs nothing from the file. ``safetorch trust FILE`` is the same
    after showing the globals and asking.

    Returns:
        :class:`Trusted` with the globals the file's pickle imports (look at them first).

    Raises:
        CheckpointError: ``path`` is missing, not a regular file or not a checkpoint.

    >>> import os, tempfile, torch, safetorch as st
    >>> path = os.path.join(tempfile.mkdtemp(), "old.pkl")
    >>> torch.save(torch.nn.Linear(2, 2), path)   # written by plain torch: not trusted
    >>> st.trust(path).globals[:1]
    ('torch.nn.modules.linear.Linear',)
    >>> type(st.load(path)).__name__
    'Linear'
    """
    seen = inspect_for_trust(path)
    record_inspected(path, seen.entry)
    return Trusted(
        os.path.abspath(os.fspath(path)), seen.entry.size, seen.entry.sha256, seen.globals
    )


def record_inspected(path: PathLike, entry: _provenance.Entry) -> None:
    """Record ``entry`` (what :func:`inspect_for_trust` read from ``path``) as trusted: the
    bytes the user was shown, never a second read of the path.

    Raises:
        CheckpointError: the ledger cannot be written.
    """
    if not _provenance.record(entry):
        raise CheckpointError(
            f"cannot trust {os.fspath(path)!r}: the trust ledger {_provenance.state_dir()!r} "
            "cannot be written (see the warning); fix its permissions and run it again"
        )


def trust_for_run(paths: Iterable[PathLike]) -> None:
    """Trust the checkpoint files ``paths``, as they are now, for this process and its children
    (``SAFETORCH_TRUST``: size and hash of each, never a path); nothing is written down.

    Raises:
        CheckpointError: a file is missing or not a regular file (nothing is trusted then).
    """
    from safetorch.checkpoint import _reader

    tokens = [t for t in os.environ.get(_provenance.RUN_ENV, "").split(",") if t]
    for path in paths:
        with _reader.open_regular(path, "checkpoint") as opened:
            tokens.append(_provenance.hash_file(opened.fh).token())
    os.environ[_provenance.RUN_ENV] = ",".join(dict.fromkeys(tokens))


noting = _provenance.noting  # what the patched torch.load / torch.save report


def untrust(path: PathLike) -> bool:
    """Remove the trust :func:`trust` or a safetorch save gave the file at ``path`` (as it is
    now); True if it was trusted.

    >>> import os, tempfile, torch, safetorch as st
    >>> path = os.path.join(tempfile.mkdtemp(), "m.pt")
    >>> st.save(torch.nn.Linear(2, 2), path)
    >>> st.untrust(path), st.untrust(path)
    (True, False)
    """
    from safetorch.checkpoint import _reader

    with _reader.open_regular(path, "checkpoint") as opened:
        entry = _provenance.hash_file(opened.fh)
    return _provenance.forget(entry)


# --- saving -----------------------------------------------------------------------------------
# atomic_write (safetorch/_atomic.py): temp file in the same directory, fsync, os.replace,
# fsync the directory -- the one writer shared with `safetorch check --fix`.


def on_rank0(fn: Callable[[], Any]) -> Any:
    """Run ``fn`` on rank 0 only; every rank returns its result once it has finished.

    Without an initialized process group, just calls ``fn``. The result (or the failure) is
    broadcast, so no rank waits forever when rank 0 fails.
    """
    if not _dist.initialized():
        return fn()
    dist = torch.distributed
    box: list = [None, None]
    error: Optional[BaseException] = None
    if dist.get_rank() == 0:
        try:
            box[0] = fn()
        except BaseException as exc:  # broadcast first, then re-raise
            error = exc
            box[1] = _first_line(exc)
    # Through the process group's store, not broadcast_object_list: a gloo collective's work
    # objects can deadlock the process at teardown (safetorch/_dist.py). Plain data only.
    box = _dist.broadcast_from_rank0(box)
    if error is not None:
        raise error
    if box[1] is not None:
        raise CheckpointError(f"rank 0 failed to save the checkpoint: {box[1]}")
    return box[0]


def _unwrapped(obj: Any) -> Any:
    from safetorch.checkpoint.keys import is_state_dict, strip_wrapper_prefixes, unwrap_model

    if isinstance(obj, nn.Module):
        return strip_wrapper_prefixes(unwrap_model(obj).state_dict())
    if isinstance(obj, Mapping):
        if is_state_dict(obj):
            return strip_wrapper_prefixes(obj)
        return (
            type(obj)((k, _unwrapped(v)) for k, v in obj.items())
            if isinstance(obj, dict)
            else {k: _unwrapped(v) for k, v in obj.items()}
        )
    return obj


def save_checkpoint(obj: Any, path: PathLike, *, unwrap: bool = False) -> str:
    """Save with ``torch.save`` atomically; under torch.distributed only rank 0 writes.

    Args:
        obj: what to save (a state dict, a checkpoint dict, ...).
        path: destination file; its directory must exist.
        unwrap: save modules as the state dict of the innermost user module, and strip wrapper
            segments (``module.``, ``_orig_mod.``, ...) from every state dict in ``obj``.

    Returns:
        The absolute path written.

    Raises:
        OSError: the file cannot be written (the previous file, if any, is left intact).
        CheckpointError: on ranks other than 0, when rank 0 failed to write.

    >>> import os, tempfile, torch, safetorch as st
    >>> path = os.path.join(tempfile.mkdtemp(), "model.pt")
    >>> _ = st.save_checkpoint(torch.nn.DataParallel(torch.nn.Linear(2, 2)), path, unwrap=True)
    >>> sorted(st.load(path))
    ['bias', 'weight']
    """

    return on_rank0(lambda: _save_local(obj, path, unwrap))


def _save_local(obj: Any, path: PathLike, unwrap: bool) -> str:
    from safetorch._atomic import atomic_write

    payload = _unwrapped(obj) if unwrap else obj

    def write(tmp: str) -> None:
        save(payload, tmp)

    return atomic_write(path, write)


def _link_or_copy(src: str, dst: str) -> None:
    """Atomically make ``dst`` a copy of ``src`` (a hard link when the filesystem allows)."""
    from safetorch._atomic import atomic_write

    def write(tmp: str) -> None:
        os.unlink(tmp)
        try:
            os.link(src, tmp)
        except OSError:
            import shutil

            shutil.copyfile(src, tmp)

    atomic_write(dst, write)
