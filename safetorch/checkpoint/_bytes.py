"""A tensor's memory as Python bytes, without numpy (torch does not require it).

``tensor.numpy()`` raises ``RuntimeError: Numpy is not available`` where numpy is not
installed, so the bytes of a CPU tensor are reached through ``ctypes`` (which torch itself
imports): a writable :class:`memoryview` over the tensor's own memory, no copy. Measured
against ``memoryview(t.numpy())`` and ``bytearray`` + ``torch.frombuffer`` + ``copy_`` in
``benchmarks/bench_checkpoint.py --views`` (see benchmarks/RESULTS.md): as fast as numpy's
view, about half the time of the copy.
"""

from __future__ import annotations

import ctypes
from typing import List

import torch

__all__: List[str] = []  # private module: used by the reader, rng, state and the CLI


def writable_view(t: torch.Tensor) -> memoryview:
    """A writable byte view of the contiguous CPU tensor ``t``'s memory (no copy).

    The view keeps ``t`` alive. Writing through it bypasses autograd's version counter: the
    caller bumps it (see ``reader.RegularFile.readinto``).

    >>> t = torch.zeros(2, dtype=torch.int16)
    >>> v = writable_view(t); v[:2] = b"\\x01\\x00"; t.tolist()
    [1, 0]
    """
    if t.device.type != "cpu" or not t.is_contiguous():
        raise ValueError("writable_view needs a contiguous CPU tensor")
    n = t.numel() * t.element_size()
    if n == 0:
        return memoryview(bytearray())
    array = (ctypes.c_ubyte * n).from_address(t.data_ptr())
    array._owner = t  # type: ignore[attr-defined]  # ctypes instances take attributes: the view keeps t alive
    return memoryview(array).cast("B")


def tensor_bytes(t: torch.Tensor) -> bytes:
    """A copy of the bytes of ``t`` (any device, any layout of strides), in element order.

    >>> tensor_bytes(torch.tensor([1, 2], dtype=torch.uint8))
    b'\\x01\\x02'
    """
    return bytes(writable_view(t.detach().cpu().contiguous()))
