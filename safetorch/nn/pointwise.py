"""``PointwiseConv1d``: ``nn.Conv1d(kernel_size=1)`` run as conv or linear, whichever is faster.

A 1x1 convolution over ``(B, C_in, L)`` is a matrix product: ``F.linear`` on the transposed
view ``(B, L, C_in)`` computes the same numbers. Which is faster depends on the device, dtype
and shape (the conv kernel pays for im2col-style layouts on some backends, linear pays for
the transposes on others), by factors that reach 2-4x on CPU. ``PointwiseConv1d`` keeps
``nn.Conv1d``'s parameters and state_dict keys exactly and, in ``impl="auto"``, measures both
once per (device, dtype, channels, shape bucket) and caches the choice process-wide.
"""

from __future__ import annotations

import math
import threading
from typing import Any, Dict, Hashable, Optional

import torch
import torch.nn.functional as F

from safetorch.timing import benchmark

__all__ = ["PointwiseConv1d"]

_IMPLS = ("conv", "linear", "auto")
_MEASURED_DEVICES = ("cpu", "cuda")

# Process-wide autotune cache: key -> "conv" | "linear". Reads are lock-free dict lookups;
# misses measure under the lock so each key is measured exactly once.
_cache: Dict[Hashable, str] = {}
_lock = threading.Lock()
# Bumped by clear_autotune_cache so every instance drops its per-shape memo too.
_generation = 0
_MEMO_MAX = 64  # per-instance memo entries (variable-length inputs must not grow it forever)
# Stop measuring once this much time is spent (the seed's 128x4096x256 -> 512 takes seconds
# per call on CPU; one run of each then decides).
_BUDGET_MS = 1000.0
_ROUNDS = 7  # one warmup round + up to six timed rounds
# Below this many multiply-adds (~8M: tens of microseconds on a GPU, where the call is
# launch-bound) the signature lookup costs about as much as the choice can gain: use conv
# (one kernel, no transposes) directly.
_TINY_MACS = 1 << 23


def _bucket(n: int) -> int:
    """Next power of two >= n (shape bucket: 100 and 128 share a measurement)."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def _linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    # (B, C_in, L) -> (B, L, C_in) view -> (B, L, C_out) -> (B, C_out, L) view.
    return F.linear(x.transpose(-1, -2), weight.squeeze(-1), bias).transpose(-1, -2)


def _conv(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    return F.conv1d(x, weight, bias)


_RUN = {"conv": _conv, "linear": _linear}


def _key(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> Hashable:
    batch = x.shape[0] if x.dim() == 3 else 0
    return (
        x.device,
        x.dtype,
        weight.shape[1],
        weight.shape[0],
        bias is not None,
        x.dim(),
        _bucket(batch),
        _bucket(x.shape[-1]),
        x.is_contiguous(),
        torch.is_grad_enabled() and weight.requires_grad,
    )


def _time_ms(impl: str, x: torch.Tensor, w: torch.Tensor, b: Optional[torch.Tensor]) -> float:
    """One timed run of one candidate (CUDA events or perf_counter, via st.benchmark)."""
    return benchmark(_RUN[impl], x, w, b, warmup=0, repeat=1).min


def _measure(x: torch.Tensor, w: torch.Tensor, b: Optional[torch.Tensor]) -> Dict[str, float]:
    """Best time of each candidate over interleaved rounds (robust to load drift).

    Round 0 warms caches, allocators and backend primitives and is discarded (a first call
    can be several times slower, and not equally for both). Timed rounds stop once the budget
    is spent, so a multi-second shape is timed once each after its warmup.
    """
    best = {"conv": math.inf, "linear": math.inf}
    spent = 0.0
    for round_ in range(_ROUNDS):
        for impl in best:
            ms = _time_ms(impl, x, w, b)
            spent += ms
            if round_ > 0:
                best[impl] = min(best[impl], ms)
        if round_ > 0 and spent > _BUDGET_MS:
            break
    return best


def _choose(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> str:
    if x.device.type not in _MEASURED_DEVICES:
        return "conv"  # no timer for it (meta holds no data; other backends: torch's default)
    key = _key(x, weight, bias)
    impl = _cache.get(key)
    if impl is not None:
        return impl
    with _lock:
        impl = _cache.get(key)
        if impl is None:
            best = _measure(x, weight, bias)
            impl = "linear" if best["linear"] < best["conv"] else "conv"
            _cache[key] = impl
    return impl


class PointwiseConv1d(torch.nn.Conv1d):
    """Drop-in ``nn.Conv1d(in, out, kernel_size=1)`` that runs as conv or linear, the faster.

    Parameters are ``weight`` of shape ``(out_channels, in_channels, 1)`` and ``bias`` of
    shape ``(out_channels,)``, exactly as ``nn.Conv1d``'s (it is a subclass), so state dicts
    load both ways and ``isinstance(m, nn.Conv1d)`` holds. ``impl="auto"`` times
    ``F.conv1d`` against ``F.linear`` on the transposed view once per (device, dtype,
    channels, power-of-two bucket of batch and length, contiguity, grad mode), caches the
    winner process-wide (thread-safe) and uses it from then on; CPU and CUDA are measured,
    other devices, and inputs under about 8 million multiply-adds, use conv. The linear path
    returns a transposed view (the strides of a ``(B, L, C_out)`` tensor): call
    ``.contiguous()`` before ``.view()`` on its output, and chain pointwise layers freely (the
    next one reads it without a copy).

    Float32 on CUDA: the two paths follow torch's two precision settings. By default cuDNN
    convolutions may use TF32 on Ampere and later GPUs
    (``torch.backends.cudnn.conv.fp32_precision``, formerly ``cudnn.allow_tf32``) while
    matmuls stay in full float32 (``torch.backends.cuda.matmul.fp32_precision``), so conv
    and linear then agree only to TF32 rounding (about 1e-3 relative), and ``"auto"`` compares
    their speeds at those precisions. Set both to the same precision for matching numbers.

    Args:
        in_channels: Input channels ``C_in``.
        out_channels: Output channels ``C_out``.
        bias: Whether to add a learnable bias.
        device: Parameter device.
        dtype: Parameter dtype.
        impl: ``"auto"`` (measure once, then cached), ``"conv"`` or ``"linear"``.

    Raises:
        ValueError: ``impl`` is not one of the three.

    >>> import torch, safetorch as st
    >>> conv = torch.nn.Conv1d(8, 4, kernel_size=1)
    >>> pw = st.PointwiseConv1d(8, 4)
    >>> _ = pw.load_state_dict(conv.state_dict())
    >>> x = torch.randn(2, 8, 16)
    >>> torch.testing.assert_close(pw(x), conv(x))
    >>> pw.impl
    'auto'
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        bias: bool = True,
        device: Any = None,
        dtype: Optional[torch.dtype] = None,
        impl: str = "auto",
    ) -> None:
        super().__init__(
            in_channels, out_channels, kernel_size=1, bias=bias, device=device, dtype=dtype
        )
        self.impl = impl
        # Per-instance memo of the process-wide decision, keyed by the exact input signature:
        # one hash of a small tuple instead of building the bucketed key on every call.
        self._memo: Dict[Hashable, str] = {}
        self._memo_generation = _generation

    @property
    def impl(self) -> str:
        """``"auto"``, ``"conv"`` or ``"linear"``; settable."""
        return self._impl

    @impl.setter
    def impl(self, value: str) -> None:
        if value not in _IMPLS:
            raise ValueError(
                f"impl must be one of {', '.join(repr(i) for i in _IMPLS)}, got {value!r}"
            )
        self._impl = value

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        impl = self._impl
        if impl == "conv" or input.dim() not in (2, 3) or input.shape[-2] != self.in_channels:
            return F.conv1d(input, self.weight, self.bias)  # wrong shapes: conv's own error
        if impl == "auto":
            if input.numel() * self.out_channels < _TINY_MACS:
                return F.conv1d(input, self.weight, self.bias)
            impl = self._auto_impl(input)
        return _RUN[impl](input, self.weight, self.bias)

    def _auto_impl(self, input: torch.Tensor) -> str:
        sig = (
            input.shape,
            input.dtype,
            input.device,
            input.is_contiguous(),
            torch.is_grad_enabled() and self.weight.requires_grad,
        )
        if self._memo_generation != _generation:
            self._memo, self._memo_generation = {}, _generation
        impl = self._memo.get(sig)
        if impl is None:
            impl = _choose(input, self.weight, self.bias)
            if len(self._memo) >= _MEMO_MAX:
                self._memo.clear()
            self._memo[sig] = impl
        return impl

    def extra_repr(self) -> str:
        bias = self.bias is not None
        return f"{self.in_channels}, {self.out_channels}, bias={bias}, impl={self._impl!r}"

    @staticmethod
    def autotune_cache() -> Dict[Hashable, str]:
        """A copy of the process-wide autotune decisions (key -> ``"conv"``/``"linear"``).

        Returns:
            The decisions measured so far.

        >>> import safetorch as st
        >>> isinstance(st.PointwiseConv1d.autotune_cache(), dict)
        True
        """
        with _lock:
            return dict(_cache)

    @staticmethod
    def clear_autotune_cache() -> None:
        """Forget every measured decision (the next ``"auto"`` forward measures again).

        >>> import safetorch as st
        >>> st.PointwiseConv1d.clear_autotune_cache()
        >>> st.PointwiseConv1d.autotune_cache()
        {}
        """
        global _generation
        with _lock:
            _cache.clear()
            _generation += 1
