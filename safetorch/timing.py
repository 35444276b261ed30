"""Timing GPU code correctly: ``cuda_timer`` (context manager / decorator) and ``benchmark``.

The pitfall: CUDA kernels run asynchronously, so ``time.perf_counter()`` around GPU code
without a ``torch.cuda.synchronize()`` measures only how long the *launches* took, often a
hundredth of the real time. The fix, as ``torch.utils.benchmark`` and triton's ``do_bench``
do it: record a pair of ``torch.cuda.Event(enable_timing=True)`` on the current stream around
the work and read ``start.elapsed_time(end)`` after one synchronization at the end. On CPU the
same API uses ``time.perf_counter``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import statistics
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch

__all__ = ["cuda_timer", "benchmark", "TimingStats"]

# Captured at import (monkeypatch mode and tests may replace the public names).
_perf_counter = time.perf_counter
_Event: Any = torch.cuda.Event
_current_stream: Any = torch.cuda.current_stream
_synchronize = torch.cuda.synchronize
_cuda_available = torch.cuda.is_available

_CPU_FLUSH_BYTES = 64 << 20  # larger than the last-level cache of common server CPUs
_CUDA_FLUSH_FALLBACK_BYTES = 256 << 20  # triton's do_bench buffer size


@dataclasses.dataclass(frozen=True)
class TimingStats:
    """Summary of repeated timings, in milliseconds.

    Attributes:
        mean: Arithmetic mean.
        median: Median (the number to compare; robust to outliers).
        min: Fastest run.
        max: Slowest run.
        iqr: Interquartile range (75th minus 25th percentile, linear interpolation as
            ``numpy.percentile`` and ``torch.utils.benchmark`` compute it).
        n: Number of timed runs.
        device: ``"cuda"`` (CUDA events) or ``"cpu"`` (``time.perf_counter``).
        times: Every run, in order.

    >>> import safetorch as st
    >>> s = st.TimingStats.from_times([1.0, 2.0, 3.0, 10.0], "cpu")
    >>> s.median, s.iqr, s.n
    (2.5, 3.0, 4)
    """

    mean: float
    median: float
    min: float
    max: float
    iqr: float
    n: int
    device: str
    times: Tuple[float, ...] = dataclasses.field(repr=False, default=())

    @classmethod
    def from_times(cls, times: Sequence[float], device: str) -> TimingStats:
        """Build the summary from per-run times in milliseconds.

        Args:
            times: At least one time, in milliseconds.
            device: Where they were measured.

        Returns:
            The summary.

        Raises:
            ValueError: ``times`` is empty.

        >>> import safetorch as st
        >>> st.TimingStats.from_times([2.0], "cpu").iqr
        0.0
        """
        ts = tuple(float(t) for t in times)
        if not ts:
            raise ValueError("TimingStats.from_times needs at least one time; got none")
        if len(ts) > 1:
            q1, _, q3 = statistics.quantiles(ts, n=4, method="inclusive")
            iqr = q3 - q1
        else:
            iqr = 0.0
        return cls(
            mean=statistics.fmean(ts),
            median=statistics.median(ts),
            min=min(ts),
            max=max(ts),
            iqr=iqr,
            n=len(ts),
            device=device,
            times=ts,
        )

    def __str__(self) -> str:
        return (
            f"median {self.median:.4g} ms (iqr {self.iqr:.3g}, min {self.min:.4g}, "
            f"max {self.max:.4g}, n={self.n}, {self.device})"
        )


def _resolve_device(device: Optional[Union[str, torch.device]]) -> str:
    if device is None:
        return "cuda" if _cuda_available() else "cpu"
    kind = torch.device(device).type
    if kind not in ("cpu", "cuda"):
        raise ValueError(
            f"device must be a CPU or CUDA device, got {device!r}; other accelerators are "
            "timed by synchronizing them yourself around time.perf_counter()"
        )
    if kind == "cuda" and not _cuda_available():
        raise RuntimeError(
            f"device={device!r} but CUDA is not available; use device='cpu' or None (auto)"
        )
    return kind


class _TimerState(threading.local):
    """One thread's state of one ``cuda_timer``: open measurements and idle CUDA events.

    Events are reused rather than created per measurement: a new ``torch.cuda.Event`` costs
    a ``cudaEventCreate`` on its first record and a ``cudaEventDestroy`` when collected, per
    block timed. An event goes back to the pool only after its ``elapsed_time`` has been read,
    and events are pooled per device (an event records only on streams of its own device).
    """

    def __init__(self) -> None:
        self.starts: List[Any] = []  # stack (nesting): (event, device index) or perf_counter()
        self.free: Dict[int, List[Any]] = {}  # device index -> idle timing events


def _pooled_event(state: _TimerState, index: int) -> Any:
    free = state.free.setdefault(index, [])
    return free.pop() if free else _Event(enable_timing=True)


class cuda_timer(contextlib.ContextDecorator):  # lowercase: used like torch.no_grad
    """Time a block or a function correctly on CUDA (events + one sync) and on CPU.

    As a context manager: ``with st.cuda_timer() as t: ...`` then ``t.ms``. As a decorator:
    ``timer = st.cuda_timer()``, ``@timer`` on a function; every call appends to
    ``timer.times``. On CUDA a pair of ``torch.cuda.Event(enable_timing=True)`` is recorded on
    the current stream of the current device and the end event is synchronized once on
    exit (the timer reuses its events from one measurement to the next); on CPU
    ``time.perf_counter`` is read. Nesting and use from several threads are safe.

    Args:
        device: ``"cuda"``, ``"cpu"`` or ``None`` (CUDA when available, else CPU).

    Attributes:
        ms: The last measurement in milliseconds (``nan`` before the first).
        times: Every measurement in milliseconds, in order.

    Raises:
        ValueError: ``device`` is neither CPU nor CUDA.
        RuntimeError: ``device`` is CUDA and CUDA is not available.

    >>> import torch, safetorch as st
    >>> with st.cuda_timer() as t:
    ...     y = torch.ones(256, 256) @ torch.ones(256, 256)
    >>> t.ms > 0
    True
    >>> timer = st.cuda_timer(device="cpu")
    >>> @timer
    ... def step():
    ...     return torch.ones(8).sum()
    >>> _ = step(); _ = step()
    >>> len(timer.times), timer.stats().n
    (2, 2)
    """

    def __init__(self, device: Optional[Union[str, torch.device]] = None) -> None:
        self.device = _resolve_device(device)
        self.ms: float = math.nan
        self.times: List[float] = []
        self._local = _TimerState()

    def __enter__(self) -> cuda_timer:
        state = self._local
        if self.device == "cuda":
            stream = _current_stream()  # record() would look it up anyway; we need its device
            index = stream.device_index
            start = _pooled_event(state, index)
            start.record(stream)
            state.starts.append((start, index))
        else:
            state.starts.append(_perf_counter())
        return self

    def __exit__(self, *exc: Any) -> None:
        state = self._local
        if self.device == "cuda":
            start, start_index = state.starts.pop()
            stream = _current_stream()
            end = _pooled_event(state, stream.device_index)
            end.record(stream)
            end.synchronize()  # the one synchronization: wait for the timed work only
            ms = float(start.elapsed_time(end))
            # Both events are complete and read: free to record again (nested timers hold
            # their own start events on the stack, so they never share one).
            state.free[start_index].append(start)
            state.free[stream.device_index].append(end)
        else:
            ms = (_perf_counter() - state.starts.pop()) * 1e3
        self.ms = ms
        self.times.append(ms)

    def stats(self) -> TimingStats:
        """Summary of every measurement so far.

        Returns:
            A :class:`TimingStats` over ``times``.

        Raises:
            ValueError: nothing has been measured yet.

        >>> import safetorch as st
        >>> t = st.cuda_timer(device="cpu")
        >>> with t:
        ...     pass
        >>> t.stats().n
        1
        """
        return TimingStats.from_times(self.times, self.device)

    def __repr__(self) -> str:
        return f"cuda_timer(device={self.device!r}, ms={self.ms:.4g}, n={len(self.times)})"


def _first_tensor_device(args: Sequence[Any], kwargs: dict) -> Optional[str]:
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            return value.device.type
    return None


def _make_flush(device: str) -> Callable[[], None]:
    if device == "cuda":
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        l2 = int(getattr(props, "L2_cache_size", 0) or 0)
        nbytes = 2 * l2 if l2 else _CUDA_FLUSH_FALLBACK_BYTES
        buf = torch.empty(nbytes // 4, dtype=torch.int32, device="cuda")
    else:
        buf = torch.empty(_CPU_FLUSH_BYTES // 4, dtype=torch.int32)
    return buf.zero_  # type: ignore[return-value]  # Tensor.zero_ returns the tensor; callers use it as a no-arg callable


def benchmark(
    fn: Callable[..., Any],
    *args: Any,
    warmup: int = 5,
    repeat: int = 30,
    flush_l2: bool = False,
    device: Optional[Union[str, torch.device]] = None,
    **kwargs: Any,
) -> TimingStats:
    """Time ``fn(*args, **kwargs)`` ``repeat`` times after ``warmup`` untimed calls.

    On CUDA each run is bracketed by its own event pair on the current stream and the host
    synchronizes once, after the last run, so launch overhead overlaps as in real training.
    ``flush_l2=True`` writes a buffer larger than the L2 cache (twice its size; 256 MiB when
    unknown) between runs, as triton's ``do_bench`` does, to time cold-cache behaviour; on
    CPU a 64 MiB buffer is written. The flush is outside the timed region.

    Args:
        fn: The callable to time.
        *args: Positional arguments for ``fn``.
        warmup: Untimed calls first (compilation, caching allocators, autotuners).
        repeat: Timed calls.
        flush_l2: Evict the cache between timed calls.
        device: ``"cuda"`` or ``"cpu"``; ``None`` picks the device of the first tensor
            argument, else CUDA when available.
        **kwargs: Keyword arguments for ``fn`` (``warmup``, ``repeat``, ``flush_l2`` and
            ``device`` are this function's own).

    Returns:
        :class:`TimingStats` in milliseconds.

    Raises:
        ValueError: ``repeat < 1`` or ``warmup < 0``, or an unsupported device.

    >>> import torch, safetorch as st
    >>> a = torch.randn(64, 64)
    >>> s = st.benchmark(torch.mm, a, a, warmup=1, repeat=5)
    >>> s.n, s.device, s.min <= s.median <= s.max
    (5, 'cpu', True)
    """
    if repeat < 1 or warmup < 0:
        raise ValueError(
            f"benchmark needs repeat >= 1 and warmup >= 0, got repeat={repeat}, warmup={warmup}"
        )
    kind = _resolve_device(device if device is not None else _first_tensor_device(args, kwargs))
    flush = _make_flush(kind) if flush_l2 else None
    for _ in range(warmup):
        fn(*args, **kwargs)
    times: List[float] = []
    if kind == "cuda":
        _synchronize()  # warmup work must not leak into the first timed run
        starts = [_Event(enable_timing=True) for _ in range(repeat)]
        ends = [_Event(enable_timing=True) for _ in range(repeat)]
        for start, end in zip(starts, ends):
            if flush is not None:
                flush()
            start.record()
            fn(*args, **kwargs)
            end.record()
        _synchronize()
        times = [float(s.elapsed_time(e)) for s, e in zip(starts, ends)]
    else:
        for _ in range(repeat):
            if flush is not None:
                flush()
            t0 = _perf_counter()
            fn(*args, **kwargs)
            times.append((_perf_counter() - t0) * 1e3)
    return TimingStats.from_times(times, kind)
