"""``BalancedDataParallel``: DataParallel with a smaller share of the batch on GPU 0.

Under ``nn.DataParallel`` GPU 0 also holds the gathered outputs, the loss and the optimizer
state, so it runs out of memory first. Giving it ``gpu0_bsz`` samples and splitting the rest
evenly over the other GPUs balances memory. The widely copied kimiyoung/transformer-xl version
divides by zero on one device, reads the batch size from ``inputs[0]`` only (keyword inputs
break it) and hides every error behind ``quit()`` in a bare ``except``; this one handles one
device, no CUDA (plain forward), keyword-only inputs, and raises errors as they are.

``torch.nn.parallel.DistributedDataParallel`` (one process per GPU) is faster and balanced by
construction; it remains the recommended tool, and the class says so once.
"""

from __future__ import annotations

import math
import warnings
from itertools import chain
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch

from safetorch._compat import Scatter
from safetorch._nest import iter_tensors, map_tensors
from safetorch._stack import user_stacklevel
from safetorch.errors import DistributedWarning

__all__ = ["BalancedDataParallel"]

_Scatter = Scatter  # captured at import
_ddp_advice_given = False


def _chunk_sizes(batch_size: int, num_devices: int, gpu0_bsz: int) -> Tuple[List[int], bool]:
    """Per-device batch sizes ``[gpu0_bsz, rest split evenly, remainder spread]``.

    Returns the sizes (one per device, summing to ``batch_size``, possibly with zeros when the
    batch is smaller than the device count) and whether it fell back to an even split because
    ``gpu0_bsz`` exceeds an even share (``ceil(batch_size / num_devices)``).
    """
    if num_devices < 1:
        raise ValueError(f"need at least one device, got num_devices={num_devices}")
    if num_devices == 1:
        return [batch_size], False
    fallback = gpu0_bsz > math.ceil(batch_size / num_devices)
    if fallback:
        return _even(batch_size, num_devices), True
    return [gpu0_bsz] + _even(batch_size - gpu0_bsz, num_devices - 1), False


def _even(total: int, parts: int) -> List[int]:
    base, extra = divmod(total, parts)
    return [base + 1 if i < extra else base for i in range(parts)]


def _batch_size(inputs: Tuple[Any, ...], kwargs: Dict[str, Any], dim: int) -> Optional[int]:
    """Size along ``dim`` shared by every tensor in ``inputs`` and ``kwargs``."""
    sizes: List[Tuple[int, torch.Size]] = []
    for t in iter_tensors((inputs, kwargs)):
        if t.dim() <= dim:
            raise ValueError(
                f"BalancedDataParallel scatters along dim={dim}, but got a tensor of shape "
                f"{tuple(t.shape)}; pass batch tensors with a dimension {dim}, or move "
                "constant tensors into the module (as buffers)"
            )
        sizes.append((t.shape[dim], t.shape))
    if not sizes:
        return None
    first, first_shape = sizes[0]
    for size, shape in sizes[1:]:
        if size != first:
            raise ValueError(
                f"BalancedDataParallel needs every input tensor to have the batch size along "
                f"dim={dim}; got shapes {tuple(first_shape)} and {tuple(shape)}; move "
                "non-batch tensors into the module (as buffers or attributes)"
            )
    return first


def _scatter(obj: Any, devices: Sequence[int], sizes: Sequence[int], dim: int) -> List[Any]:
    """One copy of ``obj`` per device, each tensor replaced by that device's chunk.

    torch's ``scatter_map`` with explicit chunk sizes, over safetorch's one container walker
    (``safetorch._nest``): the tensors scattered are exactly the ones ``_batch_size`` checked,
    dataclasses and other mappings and sequences included; other values are shared.
    """
    chunks: Dict[int, Tuple[torch.Tensor, ...]] = {}

    def chunk(i: int) -> Callable[[torch.Tensor], torch.Tensor]:
        def pick(t: torch.Tensor) -> torch.Tensor:
            parts = chunks.get(id(t))
            if parts is None:  # each tensor is scattered once (obj keeps it alive meanwhile)
                parts = chunks[id(t)] = tuple(_Scatter.apply(devices, sizes, dim, t))
            return parts[i]

        return pick

    return [map_tensors(chunk(i), obj) for i in range(len(devices))]


class BalancedDataParallel(torch.nn.DataParallel):
    """``nn.DataParallel`` that gives GPU 0 ``gpu0_bsz`` samples and splits the rest evenly.

    Chunk sizes are ``[gpu0_bsz, rest split evenly, remainder spread over the first]``; a
    device whose share is 0 (``gpu0_bsz=0``, or fewer samples than devices) is skipped. When
    ``gpu0_bsz`` exceeds an even share of a batch, that batch is split evenly and a warning
    is given (once). Positional and keyword inputs are scattered alike; every input tensor
    must have the batch size along ``dim``. With one device the module runs there; without
    CUDA ``forward`` calls the module directly. Warns once per process that
    ``DistributedDataParallel`` is the recommended tool.

    Args:
        module: The module to replicate.
        gpu0_bsz: Samples per batch for ``device_ids[0]``.
        dim: Batch dimension.
        device_ids: CUDA devices (default: all).
        output_device: Where outputs are gathered (default: ``device_ids[0]``).

    Raises:
        ValueError: ``gpu0_bsz`` is negative; (in forward) input tensors disagree on the
            batch size.
        TypeError: ``gpu0_bsz`` is not an int.

    >>> import warnings, torch, safetorch as st
    >>> with warnings.catch_warnings():
    ...     warnings.simplefilter("ignore", st.SafetorchWarning)
    ...     model = st.BalancedDataParallel(torch.nn.Linear(4, 2), gpu0_bsz=2)
    >>> model(torch.randn(8, 4)).shape
    torch.Size([8, 2])
    """

    def __init__(
        self,
        module: torch.nn.Module,
        gpu0_bsz: int,
        dim: int = 0,
        device_ids: Optional[Sequence[Union[int, torch.device]]] = None,
        output_device: Optional[Union[int, torch.device]] = None,
    ) -> None:
        if isinstance(gpu0_bsz, bool) or not isinstance(gpu0_bsz, int):
            raise TypeError(f"gpu0_bsz must be an int (samples on GPU 0), got {gpu0_bsz!r}")
        if gpu0_bsz < 0:
            raise ValueError(f"gpu0_bsz must be >= 0, got {gpu0_bsz}; 0 leaves GPU 0 idle")
        super().__init__(module, device_ids=device_ids, output_device=output_device, dim=dim)
        self.dim = dim  # DataParallel leaves it unset without CUDA
        self.gpu0_bsz = gpu0_bsz
        self._fallback_warned = False
        _advise_ddp()

    def chunk_sizes(self, batch_size: int) -> List[int]:
        """Per-device batch sizes for a batch of ``batch_size`` (one per ``device_ids``).

        Args:
            batch_size: Samples in the batch.

        Returns:
            One size per device in ``device_ids`` (``[batch_size]`` without CUDA).

        >>> import warnings, torch, safetorch as st
        >>> with warnings.catch_warnings():
        ...     warnings.simplefilter("ignore", st.SafetorchWarning)
        ...     dp = st.BalancedDataParallel(torch.nn.Identity(), gpu0_bsz=2)
        >>> sum(dp.chunk_sizes(30))
        30
        """
        return self._sizes(batch_size)

    def _sizes(self, batch_size: int) -> List[int]:
        sizes, fallback = _chunk_sizes(batch_size, max(len(self.device_ids), 1), self.gpu0_bsz)
        if fallback and not self._fallback_warned:
            self._fallback_warned = True
            warnings.warn(
                f"BalancedDataParallel: gpu0_bsz={self.gpu0_bsz} exceeds an even share of a "
                f"batch of {batch_size} over {len(self.device_ids)} devices; splitting it "
                f"evenly ({sizes}). Lower gpu0_bsz to at most "
                f"{math.ceil(batch_size / len(self.device_ids))}.",
                DistributedWarning,
                stacklevel=user_stacklevel(),
            )
        return sizes

    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        if not self.device_ids:
            return self.module(*inputs, **kwargs)
        batch = _batch_size(inputs, kwargs, self.dim)
        if not batch:  # no tensors, or an empty batch: torch's own path (device_ids[0])
            return super().forward(*inputs, **kwargs)
        for t in chain(self.module.parameters(), self.module.buffers()):
            if t.device != self.src_device_obj:
                raise RuntimeError(
                    f"module must have its parameters and buffers on device "
                    f"{self.src_device_obj} (device_ids[0]) but found one on {t.device}; "
                    f"call module.to({str(self.src_device_obj)!r}) before wrapping it"
                )
        sizes = self._sizes(batch)
        used = [i for i, s in enumerate(sizes) if s > 0]
        first, end = used[0], used[-1] + 1
        devices = self.device_ids[first:end]
        sizes = sizes[first:end]
        # Empty inputs/kwargs scatter to one empty tuple/dict per device.
        scattered_inputs = _scatter(inputs, devices, sizes, self.dim)
        scattered_kwargs = _scatter(kwargs, devices, sizes, self.dim)
        if len(devices) == 1 and first == 0:
            return self.module(*scattered_inputs[0], **scattered_kwargs[0])
        # Replicas are broadcast from device_ids[0], which must be in the list even when it
        # gets no samples (gpu0_bsz=0); its replica is then dropped.
        replicas = self.replicate(self.module, self.device_ids[:end])[first:]
        outputs = self.parallel_apply(replicas, scattered_inputs, scattered_kwargs)
        return self.gather(outputs, self.output_device)


def _advise_ddp() -> None:
    global _ddp_advice_given
    if _ddp_advice_given:
        return
    _ddp_advice_given = True
    warnings.warn(
        "BalancedDataParallel balances memory under nn.DataParallel (one process, threads); "
        "torch.nn.parallel.DistributedDataParallel (one process per GPU) is faster and "
        "balanced by construction, and is the recommended tool.",
        DistributedWarning,
        stacklevel=user_stacklevel(),
    )
