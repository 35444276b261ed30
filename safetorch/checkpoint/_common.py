"""What both ``st.load`` and ``st.save`` need, without the loader's imports.

The patched ``torch.save`` (``safetorch run``, ``st.patch()``) imports the checkpoint writer
at the first save, and the patched ``torch.load(weights_only=False)`` needs only
:class:`MapToAvailable`: neither imports the restricted unpickler's scanner, the file reader
or the verifier from here. ``safetorch.checkpoint.loading`` re-exports these names, the same
objects.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from typing import Any, Iterator, List, Union

import torch

__all__: List[str] = []  # private: MapToAvailable is public as safetorch.checkpoint's

# A file path, as the public signatures spell it (st.load, st.save_checkpoint, st.trust).
PathLike = Union[str, "os.PathLike[str]"]

# torch's own deprecation warnings raised from inside torch.load/torch.save, not about anything
# the caller did: torch 2.0-2.x warn "TypedStorage is deprecated" from torch/storage.py while
# loading (once per process). Filtered by message only, around safetorch's own calls.
_TORCH_INTERNAL_WARNINGS = ("TypedStorage is deprecated",)


@contextlib.contextmanager
def _torch_internals_quiet() -> Iterator[None]:
    """Hide torch-internal deprecation warnings raised inside safetorch's own torch calls.

    torch warns about TypedStorage once per process; a warning hidden here does not use up
    that one warning, so user code touching TypedStorage still sees it.
    """
    once = getattr(getattr(torch, "storage", None), "_warn_typed_storage_removal", None)
    had = once.__dict__.get("has_warned") if once is not None else None
    with warnings.catch_warnings():
        for message in _TORCH_INTERNAL_WARNINGS:
            warnings.filterwarnings("ignore", message=message, category=UserWarning)
        try:
            yield
        finally:
            if once is not None:
                if had is None:
                    once.__dict__.pop("has_warned", None)
                else:
                    once.__dict__["has_warned"] = had


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


class MapToAvailable:
    """A ``map_location`` for checkpoints that may come from another machine: storages saved on
    CUDA load on the CPU where this machine has no CUDA (torch's default raises "Attempting to
    deserialize object on a CUDA device but torch.cuda.is_available() is False"); everything
    else loads where torch would put it. ``mapped`` counts the storages it moved.

    ``st.load(f, map_location="available")`` uses one; ``torch.load`` accepts one too. The
    ``load`` patch passes one when a legacy ``torch.load(f)`` call gives no ``map_location``.

    >>> import io, torch
    >>> from safetorch.checkpoint import MapToAvailable
    >>> buf = io.BytesIO(); torch.save({"w": torch.ones(2)}, buf); _ = buf.seek(0)
    >>> where = MapToAvailable()
    >>> torch.load(buf, map_location=where, weights_only=True)["w"].device, where.mapped
    (device(type='cpu'), 0)
    """

    __slots__ = ("mapped", "_cuda")

    def __init__(self) -> None:
        self.mapped = 0
        self._cuda = torch.cuda.is_available()

    def __call__(self, storage: Any, location: str) -> Any:
        if not self._cuda and str(location).startswith("cuda"):
            self.mapped += 1
            return storage  # deserialized on the CPU: keep it there
        return None  # torch's default_restore_location

    def __repr__(self) -> str:
        return f"MapToAvailable(mapped={self.mapped})"
