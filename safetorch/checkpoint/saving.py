"""Saving: st.save_checkpoint (atomic, rank 0 only); CheckpointSaver builds on it (saver.py).

torch's ``torch.save`` is captured at import (``_torch_save``).
"""

from __future__ import annotations

import logging
import os
from typing import (
    Any,
    Callable,
    Mapping,
    Optional,
)

import torch
from torch import nn

from safetorch import _dist
from safetorch._atomic import atomic_write
from safetorch.checkpoint.keys import is_state_dict, strip_wrapper_prefixes, unwrap_model
from safetorch.checkpoint.loading import PathLike, _first_line, _torch_internals_quiet
from safetorch.errors import (
    CheckpointError,
)

__all__ = ["save_checkpoint", "on_rank0"]

logger = logging.getLogger("safetorch")
_torch_save = torch.save

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
    payload = _unwrapped(obj) if unwrap else obj

    def write(tmp: str) -> None:
        with _torch_internals_quiet():
            _torch_save(payload, tmp)

    return atomic_write(path, write)


def _link_or_copy(src: str, dst: str) -> None:
    """Atomically make ``dst`` a copy of ``src`` (a hard link when the filesystem allows)."""

    def write(tmp: str) -> None:
        os.unlink(tmp)
        try:
            os.link(src, tmp)
        except OSError:
            import shutil

            shutil.copyfile(src, tmp)

    atomic_write(dst, write)
