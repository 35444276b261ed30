"""Run a function on N forked ranks and tell a hang from a slow machine (used by the workers).

A worker's deadline used to be one number for the whole run (``20 s + 3 s a round``). On a loaded
2-core machine that number was spent before the first round: ``DistributedDataParallel()``
imports ``torch._dynamo`` on first use (torch 2.x), and both forked ranks did so at once, about
30 s of a 35 s budget, while each round itself took 0.1 s; a run that was merely slow failed as
"ranks [0] still running". A hang is something else: a rank that stops making progress. So:

- the parent imports what the ranks would import lazily (``torch._dynamo``) before it forks;
- each rank reports each step it finishes (:func:`step`), and the parent fails only when a rank
  has reported nothing for ``stall_s`` seconds (also after its function returned: a process that
  hangs on its way out is caught the same way), naming the rank, its last step and its stack
  (faulthandler, on SIGUSR1) before it kills the ranks.
"""

from __future__ import annotations

import contextlib
import faulthandler
import importlib
import os
import signal
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch.multiprocessing as mp

_progress: Optional[str] = None  # this rank's progress file (set in the forked rank)


def step(label: str) -> None:
    """Report, from a rank, that it finished ``label`` (the parent's stall clock restarts)."""
    if _progress is not None:
        with open(_progress, "a") as fh:
            fh.write(label + "\n")


def _rank_main(rank: int, fn: Callable[..., None], directory: str, args: Sequence[Any]) -> None:
    global _progress
    _progress = os.path.join(directory, f"progress{rank}.log")
    stacks = open(os.path.join(directory, f"stack{rank}.txt"), "w")  # noqa: SIM115 - until exit
    faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True)
    step("started")
    fn(rank, *args)
    step("returned (exiting)")


def _read(path: str) -> str:
    try:
        with open(path) as fh:
            return fh.read()
    except OSError:
        return ""


def run_ranks(
    fn: Callable[..., None],
    directory: str,
    args: Sequence[Any] = (),
    nprocs: int = 2,
    stall_s: float = 20.0,
    preload: Sequence[str] = ("torch._dynamo",),
) -> None:
    """Run ``fn(rank, *args)`` on ``nprocs`` forked ranks; exit the process with a message
    naming the stalled ranks when one reports no step for ``stall_s`` seconds. ``preload``:
    modules imported here, before the fork, that the ranks would otherwise import on first use
    (torch >= 2.0's DistributedDataParallel imports ``torch._dynamo``)."""
    for name in preload:
        with contextlib.suppress(ImportError):  # torch._dynamo: torch >= 2.0
            importlib.import_module(name)
    ctx = mp.start_processes(
        _rank_main, args=(fn, directory, args), nprocs=nprocs, join=False, start_method="fork"
    )
    seen: Dict[int, int] = {}
    last: Dict[int, float] = {r: time.monotonic() for r in range(nprocs)}
    while not ctx.join(timeout=1.0):
        now = time.monotonic()
        stalled: List[int] = []
        for r, p in enumerate(ctx.processes):
            size = len(_read(os.path.join(directory, f"progress{r}.log")))
            if size != seen.get(r):
                seen[r], last[r] = size, now
            elif p.is_alive() and now - last[r] > stall_s:
                stalled.append(r)
        if stalled:
            _fail(ctx, directory, stalled, stall_s)


def _fail(ctx: Any, directory: str, stalled: List[int], stall_s: float) -> None:
    for r in stalled:
        with contextlib.suppress(ProcessLookupError):
            os.kill(ctx.processes[r].pid, signal.SIGUSR1)
    time.sleep(2.0)  # faulthandler writes from a signal handler: give it a moment
    lines = []
    for r in stalled:
        steps = _read(os.path.join(directory, f"progress{r}.log")).splitlines()
        lines.append(
            f"rank {r} made no progress for {stall_s:.0f} s after step "
            f"{(steps or ['(none)'])[-1]!r}; its threads:\n"
            + _read(os.path.join(directory, f"stack{r}.txt"))[-4000:]
        )
    for p in ctx.processes:
        p.kill()
    sys.exit(f"ranks {stalled} hung\n" + "\n".join(lines))
