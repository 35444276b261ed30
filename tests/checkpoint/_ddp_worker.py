"""Run by test_save.py: DDP over gloo, world size 2; rank 0 saves, every rank loads.

Usage: python _ddp_worker.py DIR. Each rank writes DIR/rank<r>.json with what it observed.

Shutdown order matters: every DDP model is gone before ``destroy_process_group()``. A model
that outlives it makes its C++ Reducer drop the last reference to the gloo process group, and
``~ProcessGroupGloo`` then joins gloo's worker threads with the GIL held; a worker that is just
freeing a finished collective's tensors needs the GIL, and the rank hangs (torch 1.13.1, about 1
run in 8; see safetorch/_dist.py). Destroyed from Python, the process group releases the GIL first.
"""

import gc
import json
import os
import sys
import weakref

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import safetorch as st
from safetorch.checkpoint import saving as ckpt_io


def run(rank: int, directory: str) -> None:
    dist.init_process_group(
        "gloo", init_method=f"file://{directory}/store", rank=rank, world_size=2
    )
    saves = []
    real_save = ckpt_io._torch_save
    ckpt_io._torch_save = lambda obj, f, *a, **k: (saves.append(f), real_save(obj, f, *a, **k))[1]
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 2))
    )
    loss = model(torch.randn(6, 4) + rank).sum()
    loss.backward()  # gradients are all-reduced; weights stay identical
    with torch.no_grad():
        for p in model.parameters():
            p -= 0.1 * p.grad
    path = os.path.join(directory, "ddp.pt")
    st.save_checkpoint({"state_dict": model.state_dict(), "epoch": 1}, path)
    complete = os.path.exists(path)  # every rank returns only after the file is complete
    plain = torch.nn.Sequential(
        torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 2)
    )
    report = st.load_state_dict(plain, path)
    # Parameters agree on every rank (BatchNorm running stats are per rank under DDP).
    same = all(torch.equal(a, b) for a, b in zip(plain.parameters(), model.module.parameters()))
    saver = st.CheckpointSaver(os.path.join(directory, "run"), mode="min")
    improved = [
        saver.save({"model": model.state_dict()}, epoch=e, metric=m)
        for e, m in enumerate([3.0, 1.0, 2.0])
    ]
    result = {
        "rank": rank,
        "writes": len(saves),
        "complete": complete,
        "ok": report.ok,
        "rule": report.rule,
        "same": same,
        "improved": improved,
        "best_epoch": saver.best_epoch,
    }
    # Ordered shutdown: every rank is done with collectives, then the DDP model (and its
    # Reducer) goes, then the process group.
    dist.barrier()
    gone = weakref.ref(model)
    del model
    gc.collect()
    result["ddp_released_before_destroy"] = gone() is None
    dist.destroy_process_group()
    with open(os.path.join(directory, f"rank{rank}.json"), "w") as fh:
        json.dump(result, fh)


if __name__ == "__main__":
    import time

    ctx = mp.start_processes(run, args=(sys.argv[1],), nprocs=2, join=False, start_method="fork")
    deadline = time.monotonic() + 40.0
    while not ctx.join(timeout=1.0):
        if time.monotonic() > deadline:
            alive = [r for r, p in enumerate(ctx.processes) if p.is_alive()]
            reported = [
                r for r in (0, 1) if os.path.exists(os.path.join(sys.argv[1], f"rank{r}.json"))
            ]
            for p in ctx.processes:
                p.kill()
            sys.exit(f"timed out: ranks {alive} still running, ranks {reported} had reported")
