"""st.SyncBatchNorm and convert_sync_batchnorm in a real 2-process gloo group on CPU.

One spawn runs every check inside the workers (spawning costs seconds); a failed check raises
in the worker and surfaces here with its traceback. The join is bounded in time.
"""

from __future__ import annotations

import gc
import time
from typing import List

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn

pytestmark = pytest.mark.dist

WORLD = 2
JOIN_TIMEOUT_S = 120.0


def _close(actual: torch.Tensor, expected: torch.Tensor, what: str, tol: float = 1e-5) -> None:
    torch.testing.assert_close(
        actual, expected.to(actual.dtype), rtol=tol, atol=tol, msg=lambda m: f"{what}: {m}"
    )


def _check_against_single_process(
    rank: int,
    sizes: List[int],
    shape_tail: List[int],
    dtype: torch.dtype,
    *,
    momentum,
    affine: bool = True,
    steps: int = 2,
    offset: float = 0.0,
    reference_dtype=None,
    tol: float = 1e-5,
) -> None:
    """Train `steps` steps with st.SyncBatchNorm on this rank's slice; compare with plain BN.

    The reference is one process's BatchNorm on the concatenated batch, in `reference_dtype`
    (default: `dtype`).
    """
    import safetorch as st

    channels = shape_tail[0]
    bn_cls = {1: nn.BatchNorm1d, 2: nn.BatchNorm1d, 3: nn.BatchNorm2d, 4: nn.BatchNorm3d}[
        len(shape_tail)
    ]
    reference = bn_cls(channels, momentum=momentum, affine=affine).to(reference_dtype or dtype)
    if affine:
        with torch.no_grad():
            reference.weight.uniform_(0.5, 1.5)
            reference.bias.uniform_(-0.5, 0.5)
    sync = st.convert_sync_batchnorm(bn_cls(channels, momentum=momentum, affine=affine).to(dtype))
    assert type(sync) is st.SyncBatchNorm, type(sync)
    sync.load_state_dict(
        {k: v.to(dtype) if v.is_floating_point() else v for k, v in reference.state_dict().items()}
    )

    start = sum(sizes[:rank])
    stop = start + sizes[rank]
    for step in range(steps):
        gen = torch.Generator().manual_seed(1000 * step + sum(sizes))
        full = torch.randn(sum(sizes), *shape_tail, generator=gen, dtype=dtype) * 3 + offset
        upstream = torch.randn(full.shape, generator=gen, dtype=dtype)

        x_ref = full.to(reference_dtype or dtype).clone().requires_grad_(True)
        y_ref = reference(x_ref)
        (y_ref * upstream.to(x_ref.dtype)).sum().backward()

        x = full[start:stop].clone().requires_grad_(True)
        y = sync(x)
        (y * upstream[start:stop]).sum().backward()

        _close(y, y_ref[start:stop].detach(), f"step {step} output", tol)
        _close(x.grad, x_ref.grad[start:stop], f"step {step} input grad", tol)
        if affine:
            for name in ("weight", "bias"):
                grad = getattr(sync, name).grad.clone()
                dist.all_reduce(grad)  # per-rank shares, as DDP would combine them
                _close(grad, getattr(reference, name).grad, f"step {step} {name} grad", tol)
                getattr(sync, name).grad = None
                getattr(reference, name).grad = None
        _close(sync.running_mean, reference.running_mean, f"step {step} running_mean")
        _close(sync.running_var, reference.running_var, f"step {step} running_var")
        assert int(sync.num_batches_tracked) == int(reference.num_batches_tracked)

    # eval mode: running statistics, no communication, same as torch
    sync.eval()
    reference.eval()
    probe = torch.randn(3, *shape_tail, dtype=dtype)
    _close(sync(probe), reference(probe.to(reference.running_mean.dtype)), "eval output", tol)


def _check_conversion(rank: int) -> None:
    import safetorch as st

    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.BatchNorm2d(4))
    model[1].weight.requires_grad_(False)
    model[3].eval()
    weight = model[1].weight
    converted = st.convert_sync_batchnorm(model)
    assert converted is model
    assert type(model[1]) is st.SyncBatchNorm and type(model[3]) is st.SyncBatchNorm
    assert model[1].weight is weight and not model[1].weight.requires_grad
    assert model[1].training and not model[3].training

    # torch's own SyncBatchNorm on CPU under gloo: the failure this module exists for
    torch_sync = nn.SyncBatchNorm.convert_sync_batchnorm(nn.Sequential(nn.BatchNorm2d(4)))
    with pytest.raises(ValueError, match="expected input tensor to be on GPU"):
        torch_sync(torch.randn(2, 4, 3, 3))
    # ... which convert_sync_batchnorm(policy="auto") swaps for the portable one
    fixed = st.convert_sync_batchnorm(torch_sync)
    assert type(fixed[0]) is st.SyncBatchNorm
    fixed(torch.randn(2, 4, 3, 3))

    reverted = st.revert_sync_batchnorm(model)
    assert type(reverted[1]) is nn.BatchNorm2d and reverted[1].weight is weight


def _check_too_few_values(rank: int) -> None:
    import safetorch as st

    bn = st.SyncBatchNorm(3)
    x = torch.randn(1 if rank == 0 else 0, 3)
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        bn(x)


def _check_ddp_step(rank: int) -> None:
    """A DDP training step with converted BN equals one process on the whole batch."""
    import safetorch as st

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU())
    reference = nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU())
    reference.load_state_dict(model.state_dict())
    ddp = nn.parallel.DistributedDataParallel(st.convert_sync_batchnorm(model))
    full = torch.randn(6, 2, 5, 5, generator=torch.Generator().manual_seed(3))
    reference(full).square().mean().backward()
    ddp(full[3 * rank : 3 * rank + 3]).square().mean().backward()  # DDP averages over ranks
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        _close(p.grad, q.grad, f"DDP grad {name}")


def _worker(rank: int, init_method: str) -> None:
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=WORLD)
    try:
        torch.manual_seed(0)
        f32, f64 = torch.float32, torch.float64
        _check_against_single_process(rank, [3, 5], [4, 6, 5], f32, momentum=0.1)
        _check_against_single_process(rank, [4, 2], [3, 7], f64, momentum=None)
        _check_against_single_process(rank, [6, 0], [3, 4, 4], f32, momentum=0.3)  # empty rank
        _check_against_single_process(rank, [0, 5], [5], f64, momentum=0.1, affine=False)
        _check_against_single_process(rank, [5, 3], [2, 2, 3, 3], f32, momentum=0.1, steps=1)
        # |mean| >> std: a float32 sum of squares would cancel (variance off by ~10%); with
        # float64 accumulation the error is float32 rounding of x - mean (~1e-5 of std)
        _check_against_single_process(
            rank, [4, 4], [3, 8], f32, momentum=0.1, offset=1e3, reference_dtype=f64, tol=1e-4
        )
        _check_conversion(rank)
        _check_too_few_values(rank)
        _check_ddp_step(rank)
        dist.barrier()
    finally:
        # Every DDP model (its C++ Reducer) must be gone before the process group: a Reducer
        # that drops the last reference joins gloo's worker threads with the GIL held, and
        # hangs on torch 1.13 (see safetorch/_dist.py). _check_ddp_step's model is a local;
        # collect any cycle that still holds one.
        gc.collect()
        dist.destroy_process_group()


def test_sync_batchnorm_matches_single_process_batchnorm_over_two_gloo_ranks(tmp_path):
    context = mp.start_processes(
        _worker,
        args=(f"file://{tmp_path / 'rendezvous'}",),
        nprocs=WORLD,
        join=False,
        start_method="spawn",
    )
    deadline = time.monotonic() + JOIN_TIMEOUT_S
    try:
        while not context.join(timeout=max(0.1, deadline - time.monotonic())):
            if time.monotonic() > deadline:
                pytest.fail(f"gloo workers did not finish within {JOIN_TIMEOUT_S:.0f} s")
    finally:
        for process in context.processes:
            if process.is_alive():
                process.terminate()
                process.join(5)
