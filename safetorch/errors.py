"""Warnings and exceptions raised by safetorch.

Every exception subclasses the builtin a user already catches for that failure, so existing
``except IndexError`` / ``except RuntimeError`` / ``except pickle.UnpicklingError`` clauses
keep working when a torch call is replaced by its safetorch counterpart.
"""

from __future__ import annotations

import io
import pickle
from typing import Any

__all__ = [
    "SafetorchWarning",
    "CheckpointWarning",
    "DataWarning",
    "DistributedWarning",
    "PatchWarning",
    "ModelWarning",
    "SafetorchError",
    "IndexOutOfBoundsError",
    "DeviceMismatchError",
    "CheckpointError",
    "CheckpointFileNotFoundError",
    "CheckpointNotSeekableError",
    "CheckpointFormatError",
    "CheckpointFileObjectError",
    "UnsafeCheckpointError",
    "UnsafeAllowError",
    "CheckpointMismatchError",
]


class SafetorchWarning(UserWarning):
    """Base category of every warning safetorch emits.

    Each area has its own subclass (:class:`CheckpointWarning`, :class:`DataWarning`,
    :class:`DistributedWarning`, :class:`PatchWarning`, :class:`ModelWarning`), so one area can
    be silenced without the others. Filter them like any warning category:

    >>> import warnings, safetorch as st
    >>> warnings.simplefilter("ignore", st.SafetorchWarning)
    """


class CheckpointWarning(SafetorchWarning):
    """Warnings about checkpoints: full unpickles, renamed keys, skipped entries.

    >>> import warnings, safetorch as st
    >>> warnings.simplefilter("ignore", st.CheckpointWarning)
    >>> issubclass(st.CheckpointWarning, st.SafetorchWarning)
    True
    """


class DataWarning(SafetorchWarning):
    """Warnings about data loading: DataLoader settings, pinned memory, batch types.

    >>> import warnings, safetorch as st
    >>> warnings.simplefilter("ignore", st.DataWarning)
    >>> issubclass(st.DataWarning, st.SafetorchWarning)
    True
    """


class DistributedWarning(SafetorchWarning):
    """Warnings about distributed training: process groups, SyncBatchNorm, DataParallel.

    >>> import safetorch as st
    >>> issubclass(st.DistributedWarning, st.SafetorchWarning)
    True
    """


class PatchWarning(SafetorchWarning):
    """Warnings from monkeypatch mode (``st.patch()``, ``safetorch run``).

    >>> import safetorch as st
    >>> issubclass(st.PatchWarning, st.SafetorchWarning)
    True
    """


class ModelWarning(SafetorchWarning):
    """Warnings about model structure and layers (BatchNorm, upsampling, lint findings).

    >>> import safetorch as st
    >>> issubclass(st.ModelWarning, st.SafetorchWarning)
    True
    """


class SafetorchError(Exception):
    """Mixin base of every safetorch exception (always combined with a builtin).

    >>> import safetorch as st
    >>> issubclass(st.IndexOutOfBoundsError, st.SafetorchError)
    True
    """


class IndexOutOfBoundsError(SafetorchError, IndexError, RuntimeError):
    """An index is out of range for the dimension it indexes.

    Derives from both :class:`IndexError` (what CPU torch raises for ``x[idx]`` and
    ``index_select``) and :class:`RuntimeError` (what it raises for ``gather``), so every
    ``except`` clause written for CPU torch catches it.

    >>> import torch, safetorch as st
    >>> try:
    ...     st.checked_index(torch.arange(6), torch.tensor([6]), check="always")
    ... except IndexError as e:
    ...     print(e)
    index 6 is out of bounds for dimension 0 with size 6
    """


class DeviceMismatchError(SafetorchError, RuntimeError):
    """Tensors or modules that must share a device do not.

    >>> import torch, safetorch as st
    >>> st.assert_same_device(torch.zeros(1), torch.zeros(1))
    device(type='cpu')
    """


class CheckpointError(SafetorchError, RuntimeError):
    """A checkpoint file is missing, empty, truncated, corrupt or not a checkpoint.

    >>> import safetorch as st
    >>> issubclass(st.CheckpointError, RuntimeError)
    True
    """


class CheckpointFileNotFoundError(CheckpointError, FileNotFoundError):
    """The checkpoint path does not exist (a CheckpointError and a FileNotFoundError).

    >>> import safetorch as st
    >>> try:
    ...     st.load("no/such/file.pt")
    ... except FileNotFoundError as e:
    ...     print(type(e).__name__)
    CheckpointFileNotFoundError
    """


class CheckpointNotSeekableError(CheckpointError, io.UnsupportedOperation):
    """The file object cannot seek (a pipe, a socket, a streamed response).

    Also an :class:`io.UnsupportedOperation`, what ``torch.load`` raises there; pre-load the
    data into ``io.BytesIO``.

    >>> import io, safetorch as st
    >>> issubclass(st.CheckpointNotSeekableError, io.UnsupportedOperation)
    True
    """


class CheckpointFileObjectError(CheckpointError, AttributeError):
    """A file object lacks a method loading needs (``read``, ``seek``, ``tell``).

    Also an :class:`AttributeError`, what ``torch.load`` raises there; pre-load the data into
    ``io.BytesIO``.

    >>> import safetorch as st
    >>> issubclass(st.CheckpointFileObjectError, AttributeError)
    True
    """


class UnsafeCheckpointError(CheckpointError, pickle.UnpicklingError):
    """A checkpoint references globals outside the weights-only allow-list.

    Nothing from the file is executed. ``unsafe_globals`` lists every offending
    ``"module.Name"``.

    >>> import pickle, safetorch as st
    >>> issubclass(st.UnsafeCheckpointError, pickle.UnpicklingError)
    True
    """

    def __init__(self, message: str, unsafe_globals: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.unsafe_globals = tuple(unsafe_globals)


class UnsafeAllowError(SafetorchError, ValueError):
    """An ``allow=`` entry (``st.load``, ``safetorch run --allow``, ``SAFETORCH_ALLOW``) that can
    run code: ``allow=`` admits data classes and known data reconstructors only (``name`` is
    its ``module.Name``). A file that needs such a callable needs full trust
    (``safetorch trust FILE`` / ``st.trust(path)``).

    >>> import io, pickle, torch, safetorch as st
    >>> buf = io.BytesIO(); torch.save({"w": torch.ones(1)}, buf); _ = buf.seek(0)
    >>> try:
    ...     st.load(buf, allow=[pickle.loads])
    ... except st.UnsafeAllowError as e:
    ...     print(type(e).__name__, isinstance(e, ValueError))
    UnsafeAllowError True
    """

    def __init__(self, name: str, why: str) -> None:
        super().__init__(
            f"allow entry {name!r} can run code ({why}), so allow= cannot admit it: allow= "
            "admits data classes and known data reconstructors only. A file that needs it needs "
            "full trust: if you trust the file, record it with `safetorch trust FILE` or "
            "st.trust(path), and st.load then loads it fully."
        )
        self.name = name


class CheckpointFormatError(CheckpointError, pickle.UnpicklingError):
    """A file that is not a checkpoint, or whose pickle data is truncated or corrupt: where
    ``torch.load`` raises ``pickle.UnpicklingError`` ("invalid load key", "pickle data was
    truncated"), so code that catches it keeps working under ``st.patch()``.

    >>> import pickle
    >>> from safetorch.errors import CheckpointFormatError
    >>> issubclass(CheckpointFormatError, pickle.UnpicklingError)
    True
    """


class CheckpointMismatchError(CheckpointError):
    """A state dict does not match the model; ``report`` holds the full LoadReport.

    >>> import safetorch as st
    >>> issubclass(st.CheckpointMismatchError, RuntimeError)
    True
    """

    def __init__(self, message: str, report: Any = None) -> None:
        super().__init__(message)
        self.report = report
