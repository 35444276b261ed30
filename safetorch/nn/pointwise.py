"""``PointwiseConv1d``: ``nn.Conv1d(kernel_size=1)`` run as conv or linear, whichever is faster.

A 1x1 convolution over ``(B, C_in, L)`` is a matrix product: ``F.linear`` on the transposed
view ``(B, L, C_in)`` computes the same numbers. Which is faster depends on the device, dtype,
shape and CPU thread count (the conv kernel pays for im2col-style layouts and thread start-up
on some backends, linear pays for the transposes on others), by factors that reach 2-4x on
CPU, small shapes included. ``PointwiseConv1d`` keeps ``nn.Conv1d``'s parameters and
state_dict keys exactly and, in ``impl="auto"``, measures both once per (device, dtype,
channels, shape bucket, threads) and caches the choice process-wide.

Two paths through ``forward``:

- eager: one dict lookup on the input's shape (the per-instance memo; ``.to()`` clears it); a
  miss asks the process-wide cache (keyed on device, dtype, channels, shape bucket, contiguity,
  grad mode and threads), which measures the first time a key is seen. Every shape is measured,
  small ones too (a few milliseconds, once): at 4x32x64 -> 64 on a 2-thread CPU linear runs
  2.4x faster than conv, on 1 thread conv 1.3x faster than linear, so no fixed rule fits.
- traced (``torch.compile``, ``torch.export``): nothing is timed and nothing depends on the
  input's sizes (a size in a lookup would specialize a dynamic dimension, one recompile per
  size); the graph gets this instance's latest eager choice for its parameters' device and
  dtype, else conv, ``nn.Conv1d``'s own kernel.
"""

from __future__ import annotations

import math
import threading
from typing import Any, Dict, Hashable, Optional, Tuple

import torch
import torch.nn.functional as F

from safetorch import _compat
from safetorch.timing import benchmark

__all__ = ["PointwiseConv1d"]

_IMPLS = ("conv", "linear", "auto")
_MEASURED_DEVICES = ("cpu", "cuda")

# Process-wide autotune cache: key -> "conv" | "linear". Reads are lock-free dict lookups;
# misses measure under the lock so each key is measured exactly once.
_cache: Dict[Hashable, str] = {}
_lock = threading.Lock()
# Bumped by clear_autotune_cache. It is part of every per-instance memo key, so entries from
# before a clear stop matching without visiting the instances.
_generation = 0
_MEMO_MAX = 64  # per-instance memo entries (variable-length inputs must not grow it forever)
# Stop measuring once this much time is spent (the seed's 128x4096x256 -> 512 takes seconds
# per call on CPU; one run of each then decides). Small shapes stay far below it.
_BUDGET_MS = 1000.0
# One warmup round + up to ten timed rounds: a 20 us call on a shared machine needs several
# samples for its minimum to settle, and costs well under a millisecond in all.
_ROUNDS = 11
# The traced path's choice when this instance has decided nothing eagerly for the device and
# dtype: nn.Conv1d's own kernel (one op, no transposes for the compiler to place).
_TRACED_DEFAULT = "conv"


#: ``_compat.tracing``, bound here (and re-bound by ``_compat.override``): one global read per
#: call instead of a module attribute lookup.
_tracing = _compat.tracing
_grad_enabled = torch.is_grad_enabled


@_compat.register_binder
def _bind_tracing() -> None:
    global _tracing
    _tracing = _compat.tracing


# --- the two candidates and their measurement -------------------------------------------------
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
    # On CPU the thread count moves the balance at small shapes (conv's parallel region costs
    # more than it gains there: 4x32x64 -> 64 measured 1.8x slower than linear on 2 threads,
    # 1.3x faster on 1).
    threads = torch.get_num_threads() if x.device.type == "cpu" else 0
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
        threads,
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
    channels, power-of-two bucket of batch and length, contiguity, grad mode, CPU threads),
    caches the winner process-wide (thread-safe) and uses it from then on; every shape is
    measured, small ones included, on CPU and CUDA (other devices use conv). After the first
    call with a given input shape, choosing costs one dict lookup (the first decision for a
    shape holds for that instance, also if grad mode or contiguity change later). The linear
    path returns
    a transposed view (the strides of a ``(B, L, C_out)`` tensor): call ``.contiguous()``
    before ``.view()`` on its output, and chain pointwise layers freely (the next one reads it
    without a copy). After ``torch.set_num_threads`` call :meth:`clear_autotune_cache` so
    that instances measure again.

    Under ``torch.compile`` (``fullgraph=True`` included) and ``torch.export`` nothing is
    timed: the traced graph uses this instance's latest eager choice for its parameters'
    device and dtype, else conv. Run the model once eagerly before compiling it to trace the measured
    choice; the choice does not depend on the input's sizes there, so dynamic shapes stay
    dynamic.

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
    >>> conv = torch.nn.Conv1d(32, 64, kernel_size=1)
    >>> pw = st.PointwiseConv1d(32, 64)
    >>> _ = pw.load_state_dict(conv.state_dict())
    >>> x = torch.randn(4, 32, 64)
    >>> torch.testing.assert_close(pw(x), conv(x))  # the first call measures; later ones look up
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
        self._forget()

    def _forget(self) -> None:
        """Drop every per-instance decision (a new instance, a copy, a cleared cache)."""
        # input.shape -> "conv" | "linear": the eager hot path's one lookup. The process-wide
        # cache decided it for the full key (_key: device, dtype, contiguity, grad mode, ...);
        # this memo is keyed on the shape alone (the module's device and dtype are fixed
        # between .to() calls, see _apply), so a call pays one hash of a torch.Size.
        self._memo: Dict[Hashable, str] = {}
        # (device, dtype) -> the latest eager choice; _traced_impl is the one for the
        # parameters' device and dtype: a plain attribute, which is all a traced forward reads
        # (dynamo guards on its value; 2.1 cannot trace a lookup in this dict).
        self._traced_choices: Dict[Hashable, str] = {}
        self._traced_impl = _TRACED_DEFAULT
        self._generation = _generation
        # (weight, its data_ptr, its 2-D view) for the linear path without grad
        self._weight_2d: Optional[Tuple[torch.Tensor, int, torch.Tensor]] = None

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
        if impl == "auto":
            if not _tracing():  # torch.compile / torch.export trace the else branch
                # The hot path: a generation test and one lookup. A memoized shape passed the
                # shape check in _decide, so it is not repeated here.
                if self._generation != _generation:  # clear_autotune_cache() since
                    self._forget()
                impl = self._memo.get(input.shape) or self._decide(input)
                if impl == "linear":
                    if _grad_enabled():
                        return _linear(input, self.weight, self.bias)
                    return self._linear_no_grad(input)
                return F.conv1d(input, self.weight, self.bias)
            # Traced: no timing, and no size in the lookup (it would specialize dynamic dims).
            # Both values read here are guarded: a new eager choice or a cleared cache traces
            # again.
            impl = self._traced_impl if self._generation == _generation else _TRACED_DEFAULT
        if impl == "linear" and input.dim() in (2, 3) and input.shape[-2] == self.in_channels:
            return _linear(input, self.weight, self.bias)
        return F.conv1d(input, self.weight, self.bias)  # conv, and wrong shapes: conv's own error

    def _linear_no_grad(self, input: torch.Tensor) -> torch.Tensor:
        """The linear path without autograd, through a cached 2-D view of the weight.

        ``weight.squeeze(-1)`` costs about 1 us per call (a Python-level view), which is most of
        what linear's path pays over ``nn.Linear`` at small shapes. The view is reused while it
        is a view of the same parameter's same storage: in-place updates (optimizer steps,
        ``load_state_dict``) show through it; ``weight.data = ...`` (a new storage: the cached
        view keeps the old one alive, so an equal address means the same storage) or a new
        parameter builds it again. Only without grad: a view made once would carry autograd
        state across steps.
        """
        weight = self.weight
        cached = self._weight_2d
        if cached is None or cached[0] is not weight or cached[1] != weight.data_ptr():
            # Made without grad (this path's condition): measured 2x faster in F.linear on torch
            # 2.13 CPU than weight.detach().squeeze(-1) at 16x1024x16 -> 1024.
            cached = self._weight_2d = (weight, weight.data_ptr(), weight.squeeze(-1))
        out: torch.Tensor = F.linear(input.transpose(-1, -2), cached[2], self.bias)
        return out.transpose(-1, -2)

    def _decide(self, input: torch.Tensor) -> str:
        """The memo's miss path (eager only): check the shape, ask the process-wide cache."""
        if input.dim() not in (2, 3) or input.shape[-2] != self.in_channels:
            return "conv"  # not memoized: conv raises its own error
        impl = _choose(input, self.weight, self.bias)
        memo = self._memo
        if len(memo) >= _MEMO_MAX:
            memo.clear()
        memo[input.shape] = impl
        # What a traced forward uses: the latest eager choice (for this device and dtype).
        self._traced_choices[(input.device, input.dtype)] = impl
        self._traced_impl = impl
        return impl

    def _apply(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        # .to() / .double() / .cuda() / ...: the memo's decisions were for the old device or
        # dtype; a traced forward takes the choice made for the new one, if any.
        out = super()._apply(fn, *args, **kwargs)
        self._memo = {}
        self._weight_2d = None
        weight = self.weight
        key = (weight.device, weight.dtype)
        self._traced_impl = self._traced_choices.get(key, _TRACED_DEFAULT)
        return out

    def __getstate__(self) -> Dict[str, Any]:
        # Copies and pickles start with empty memos: their choices belong to this process's
        # cache generation and machine, not to wherever the copy runs.
        # nn.Module's own (torch 2.x: it drops the compiled call), else object's (Python 3.11+);
        # torch 1.13 on Python 3.9 has neither.
        getstate = getattr(super(), "__getstate__", None)
        state = dict(getstate() if getstate is not None else self.__dict__)
        state.update(_memo={}, _traced_choices={}, _traced_impl=_TRACED_DEFAULT, _weight_2d=None)
        return state

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

        Instances' memos are dropped too. Compiled graphs are guarded on the cache's
        generation, so they are traced again, with conv until an eager forward decides again.

        >>> import safetorch as st
        >>> st.PointwiseConv1d.clear_autotune_cache()
        >>> st.PointwiseConv1d.autotune_cache()
        {}
        """
        global _generation
        with _lock:
            _cache.clear()
            _generation += 1
