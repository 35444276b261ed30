"""Run by test_resume_dist.py: exact resume through st.save_state/st.load_state on 2 gloo ranks.

Usage: python _resume_worker.py DIR KIND, KIND in {fsdp2, ddp}. Each rank trains a few steps
(dropout and per-rank random data, so every RNG matters), saves, trains on (the reference),
then a fresh model and optimizer with other seeds load the state and train the same steps.
Each rank writes DIR/rank<r>.json with both loss sequences and whether the final parameters
are bit-identical. FSDP2 saves a DCP directory (each rank its shards); DDP one file (rank 0).
"""

import faulthandler
import gc
import json
import os
import random
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import safetorch as st

STEPS = 3
_full_saved: dict = {}


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.Dropout(0.25), torch.nn.ReLU(), torch.nn.Linear(16, 4)
    )


def _wrap(model: torch.nn.Module, kind: str) -> torch.nn.Module:
    if kind == "ddp":
        return torch.nn.parallel.DistributedDataParallel(model)
    from torch.distributed.device_mesh import init_device_mesh

    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:  # torch 2.4-2.5 keep FSDP2 under _composable
        from torch.distributed._composable.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def _steps(model, opt, sched, n):
    losses = []
    for _ in range(n):
        x = torch.randn(4, 8) + random.random()
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        losses.append(loss.item())
    return losses


def _full(model):
    out = {}
    for k, v in model.state_dict().items():
        out[k] = v.full_tensor() if hasattr(v, "full_tensor") else v
    return {k: v.detach().clone() for k, v in out.items()}


def run(rank: int, directory: str, kind: str) -> None:
    faulthandler.dump_traceback_later(100, exit=True)
    dist.init_process_group(
        "gloo", init_method=f"file://{directory}/store", rank=rank, world_size=2
    )
    _train_save_resume(rank, directory, kind)
    # Ordered shutdown: every model, optimizer and DTensor of _train_save_resume is gone (its
    # frame is), so the process group dies here, from Python, and not later from the C++ object
    # (DDP Reducer, FSDP2 state) that would hold its last reference. See
    # tests/checkpoint/_ddp_worker.py: torch 1.13 hangs, and 2.14.1 aborted ("terminate called
    # without an active exception") once in 7 runs, in the old order.
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


def _train_save_resume(rank: int, directory: str, kind: str) -> None:
    torch.manual_seed(100 + rank)
    random.seed(200 + rank)
    model = _wrap(_model(0), kind)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, 2, 0.5)
    _steps(model, opt, sched, STEPS)
    target = os.path.join(directory, "state" if kind == "fsdp2" else "state.pt")
    path = st.save_state(target, model=model, optimizer=opt, scheduler=sched, epoch=STEPS)
    global _full_saved
    _full_saved = _full(model)
    reference = _steps(model, opt, sched, STEPS)
    ref_params = _full(model)

    torch.manual_seed(999 + rank)  # everything different until load_state restores it
    random.seed(999)
    model2 = _wrap(_model(7), kind)
    opt2 = torch.optim.Adam(model2.parameters(), lr=1e-3)
    sched2 = torch.optim.lr_scheduler.StepLR(opt2, 2, 0.5)
    extras = st.load_state(path, model=model2, optimizer=opt2, scheduler=sched2)
    resumed = _steps(model2, opt2, sched2, STEPS)
    params = _full(model2)
    same = all(torch.equal(params[k], ref_params[k]) for k in ref_params)
    # The weights alone, through st.load_state_dict, into a third (sharded) model
    model3 = _wrap(_model(11), kind)
    report = st.load_state_dict(model3, path)
    weights_loaded = report.ok and all(
        torch.equal(v, _full_saved[k]) for k, v in _full(model3).items()
    )
    # A load hook on the model: the values go through Module.load_state_dict (the hook runs),
    # not in place into the shards, and arrive all the same.
    model4 = _wrap(_model(13), kind)
    hooked: list = []
    model4.register_load_state_dict_post_hook(lambda module, keys: hooked.append(len(hooked)))
    report4 = st.load_state_dict(model4, path)
    hook_loaded = (
        report4.ok
        and bool(hooked)
        and all(torch.equal(v, _full_saved[k]) for k, v in _full(model4).items())
    )
    with open(os.path.join(directory, f"rank{rank}.json"), "w") as fh:
        json.dump(
            {
                "reference": reference,
                "resumed": resumed,
                "params_equal": same,
                "weights_loaded": weights_loaded,
                "hook_loaded": hook_loaded,
                "extras": extras,
                "path": path,
                "is_dir": os.path.isdir(path),
            },
            fh,
        )


if __name__ == "__main__":
    directory, kind = sys.argv[1], sys.argv[2]
    ctx = mp.start_processes(
        run, args=(directory, kind), nprocs=2, join=False, start_method="spawn"
    )
    deadline = time.monotonic() + 110.0
    while not ctx.join(timeout=1.0):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
            sys.exit("timed out")
