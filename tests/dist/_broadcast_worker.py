"""Run by test_dist_broadcast.py: safetorch._dist.broadcast_from_rank0 in a 2-rank gloo group.

Usage: python _broadcast_worker.py DIR ROUNDS. Each round is a whole process-group lifetime:
DDP model, a backward, rank-0 results sent to every rank, barrier, the DDP model dropped
(checked with a weak reference), ``destroy_process_group()``. Each rank writes
DIR/rank<r>.json and reports each round to _ranks.run_ranks, which fails a rank that stops
making progress and shows its stack.

The model goes first, as in tests/checkpoint/_ddp_worker.py. This worker used to drop it after
``destroy_process_group()`` (the order in which ``broadcast_object_list`` hung torch 1.13.1,
safetorch/_dist.py), to show that results sent through the store do not hang it. But that
order hangs torch 2.13 by itself, without safetorch: rank 1 stopped in round 3 of a 400-round
run under load (gdb: main thread ``pybind11 dealloc -> ~Reducer -> ~ProcessGroupGloo ->
std::thread::join``, GIL held; gloo's ``pt_gloo_runloop`` in ``~AsyncAllreduceWork ->
~AsyncWork -> at::ThreadLocalState::~ThreadLocalState -> SafePyObject -> decref -> take_gil``:
DDP's own gradient all-reduce carries the caller's thread-local state, which holds a Python
object). That was the "ranks [0] still running" of issue 36 whenever it hit the last round.
"""

import gc
import json
import math
import os
import sys
import weakref

import torch
import torch.distributed as dist
from _ranks import run_ranks, step

from safetorch import _dist


def run(rank: int, directory: str, rounds: int) -> None:
    seen, released = [], []
    for r in range(rounds):
        dist.init_process_group(
            "gloo", init_method=f"file://{directory}/store{r}", rank=rank, world_size=2
        )
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2))
        model(torch.randn(3, 4)).sum().backward()
        sent = {"round": r, "path": f"/ckpt/{r}.pt", "metric": math.nan, "pair": (1, b"x")}
        got = _dist.broadcast_from_rank0(sent if rank == 0 else None)
        seen.append(
            got["round"] == r
            and got["path"] == f"/ckpt/{r}.pt"
            and math.isnan(got["metric"])
            and got["pair"] == (1, b"x")
        )
        try:  # not plain data: rank 0 raises TypeError, the others are told instead of waiting
            _dist.broadcast_from_rank0(torch.nn.Linear(1, 1) if rank == 0 else None)
            refused = None
        except (TypeError, RuntimeError) as exc:
            refused = type(exc).__name__
        dist.barrier()
        gone = weakref.ref(model)
        del model  # with its Reducer, before the process group (see the docstring)
        gc.collect()
        released.append(gone() is None)
        dist.destroy_process_group()
        step(f"round {r} torn down")
    with open(os.path.join(directory, f"rank{rank}.json"), "w") as fh:
        ok = all(seen) and all(released)
        json.dump({"rank": rank, "rounds": len(seen), "ok": ok, "refused": refused}, fh)


if __name__ == "__main__":
    directory, rounds = sys.argv[1], int(sys.argv[2])
    run_ranks(run, directory, args=(directory, rounds))
