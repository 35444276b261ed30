"""Run by test_dist_broadcast.py: safetorch._dist.broadcast_from_rank0 in a 2-rank gloo group.

Usage: python _broadcast_worker.py DIR ROUNDS. Each round is a whole process-group lifetime
in the order user code often has: DDP model, rank-0 results sent to every rank, barrier,
``destroy_process_group()``, and only then the DDP model is dropped. With results sent by
``broadcast_object_list`` this order hangs torch 1.13.1 in most of 10 rounds (see
safetorch/_dist.py); through the store it must not. Each rank writes DIR/rank<r>.json and
reports each round to _ranks.run_ranks, which fails a rank that stops making progress.
"""

import json
import math
import os
import sys

import torch
import torch.distributed as dist
from _ranks import run_ranks, step

from safetorch import _dist


def run(rank: int, directory: str, rounds: int) -> None:
    seen = []
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
        dist.destroy_process_group()
        del model  # last: the user's order that deadlocks with tensor collectives on 1.13
        step(f"round {r} torn down")
    with open(os.path.join(directory, f"rank{rank}.json"), "w") as fh:
        json.dump({"rank": rank, "rounds": len(seen), "ok": all(seen), "refused": refused}, fh)


if __name__ == "__main__":
    directory, rounds = sys.argv[1], int(sys.argv[2])
    run_ranks(run, directory, args=(directory, rounds))
