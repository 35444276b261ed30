"""What every ``safetorch ckpt`` command shares: reading any layout (:func:`read_source`), the
view of a checkpoint's models, ``--allow``, the checks of the paths given, and the guard that
turns every failure into one line on stderr with its exit status.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import stat
import sys
from typing import (
    IO,
    Any,
    Callable,
    Dict,
    Iterable,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
    Type,
)

import torch

from safetorch import _compat
from safetorch._cli import say_error
from safetorch._text import escape, escape_all
from safetorch.checkpoint import _dcp, _dcp_load, _formats, _layouts, _reader, _resolve
from safetorch.checkpoint._cli_progress import (
    _bytes_under,
    _CountingReader,
    _make_progress,
    _Progress,
)
from safetorch.checkpoint._formats import STATE_FORMAT
from safetorch.checkpoint._resolve import saver_checkpoint
from safetorch.checkpoint.keys import (
    is_state_dict,
)
from safetorch.checkpoint.loading import load
from safetorch.errors import CheckpointError, UnsafeCheckpointError

# verify_checkpoint lives in safetorch.checkpoint.verify (``safetorch ckpt verify``).


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
    (:func:`safetorch.patching._allow.parse_allow_list`): the ``allow=`` of every load here."""
    from safetorch.patching._allow import allowed_globals, parse_allow_list

    return list(dict.fromkeys(parse_allow_list([*allowed_globals(), *(values or [])])))


def _as_state_dict(value: Any) -> Mapping[str, Any]:
    return value.state_dict() if isinstance(value, torch.nn.Module) else value


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
    src: str,
    *,
    allow: Iterable[str] = (),
    progress_stream: Optional[IO[str]] = None,
    show_progress: bool = True,
) -> Any:
    """The whole checkpoint at ``src``, whatever its layout, weights-only.

    A file through :func:`safetorch.load` (``allow=`` as there), a ``CheckpointSaver``
    directory through the checkpoint it stands for, a DCP directory through DCP with
    safetorch's reader, a shard index or library directory shard by shard. A progress bar is
    drawn on ``progress_stream`` (default stderr) only if it is a terminal and ``src`` is large
    (``show_progress=False``: never).

    Raises:
        CheckpointError: ``src`` cannot be read (see :func:`safetorch.load`).
    """
    progress = _make_progress(progress_stream, _size_of(src), show_progress)
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


def _size_of(path: str) -> int:
    """The bytes a source takes on disk (decides whether a progress bar is worth drawing)."""
    with contextlib.suppress(CheckpointError, OSError):
        path = _saver_source(path) or path
    if path.endswith(".index.json"):
        path = os.path.dirname(os.path.abspath(path))
    return _bytes_under(path)


# --- inspect --keys ----------------------------------------------------------------------------
def _dtype_name(t: torch.Tensor) -> str:
    return str(t.dtype).replace("torch.", "")


def _storage_bytes(t: torch.Tensor) -> int:
    try:
        return int(_storage_of(t).nbytes())
    except (RuntimeError, NotImplementedError):  # a tensor without storage (meta, sparse, ...)
        return _nbytes(t)


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


#: The version of the JSON document every ``--output-format json`` prints (docs/cli.md, "JSON
#: output"): raised when a field is removed or changes meaning; a new field keeps it.
JSON_SCHEMA_VERSION = 1


def json_document(command: str, value: Any) -> Dict[str, Any]:
    """What ``safetorch ckpt COMMAND --output-format json`` prints: ``schema_version``, the
    ``command``, then the command's fields (``inspect --keys``: its rows under ``keys``).

    >>> json_document("diff", {"identical": True})
    {'schema_version': 1, 'command': 'diff', 'identical': True}
    """
    fields = value if isinstance(value, Mapping) else {"keys": value}
    return {"schema_version": JSON_SCHEMA_VERSION, "command": command, **fields}


def write_json(command: str, value: Any) -> None:
    """Print :func:`json_document` (``json.dumps`` escapes text from files)."""
    sys.stdout.write(json.dumps(json_document(command, value), indent=2) + "\n")


def _emit(args: argparse.Namespace, value: Any, printer: Callable[[Any, IO[str]], None]) -> None:
    if args.json:
        write_json(args.ckpt_command, value)
    else:
        printer(escape_all(value), sys.stdout)
