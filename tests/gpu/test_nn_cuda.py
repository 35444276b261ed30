"""safetorch.nn on CUDA: upsample identity, SyncBN class choice, the sync kernel's numerics."""

from __future__ import annotations

import importlib
import warnings

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import safetorch as st
from safetorch import _compat

syncbn = importlib.import_module("safetorch.nn.syncbn")


@pytest.mark.parametrize("mode", ["nearest", "bilinear", "bicubic"])
def test_upsample_bit_identical_on_cuda(mode):
    x = torch.randn(2, 3, 9, 7, device="cuda", requires_grad=True)
    y = x.detach().clone().requires_grad_(True)
    ours = st.upsample(x, scale_factor=2.5, mode=mode)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = F.upsample(y, scale_factor=2.5, mode=mode)
    assert torch.equal(ours, theirs)
    g = torch.randn_like(ours)
    ours.backward(g)
    theirs.backward(g)
    # CUDA upsample backward uses atomics: deterministic only up to summation order
    torch.testing.assert_close(x.grad, y.grad)


def test_auto_policy_picks_torch_syncbn_for_cuda_layers():
    cuda_bn, cpu_bn = nn.BatchNorm2d(3).cuda(), nn.BatchNorm2d(3)
    assert syncbn._sync_class_for(cuda_bn, "auto") is nn.SyncBatchNorm
    assert syncbn._sync_class_for(cpu_bn, "auto") is st.SyncBatchNorm
    model = st.convert_sync_batchnorm(nn.Sequential(cuda_bn), policy="torch")
    assert type(model[0]) is nn.SyncBatchNorm and model[0].weight is cuda_bn.weight
    # without a process group torch >= 2.0 falls back to batch_norm; torch < 2.0 raises in
    # training (get_world_size), which the lint rule reports
    found = st.lint_model(model)
    try:
        model(torch.randn(4, 3, 2, 2, device="cuda"))
    except RuntimeError:
        raised = True
    else:
        raised = False
    assert raised is not _compat.SYNCBN_FALLS_BACK_WITHOUT_PG
    assert [f.rule for f in found] == (["torch-syncbn-device"] if raised else [])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_sync_function_on_cuda_matches_batch_norm(one_rank_nccl, dtype):
    """The all_reduce path (forced with one rank) equals F.batch_norm in training on CUDA.

    Parameters and running statistics are float32 for float32, float16 and bfloat16 input
    (mixed precision: what torch's BatchNorm under autocast or a half model with float32
    norm layers holds, and what F.batch_norm accepts) and float64 for float64 input (a
    ``.double()`` model): cuDNN rejects float64 input with float32 parameters.
    """
    x = (torch.randn(6, 4, 5, 5, device="cuda") * 2 + 3).to(dtype)
    pdtype = torch.float64 if dtype == torch.float64 else torch.float32
    weight = torch.rand(4, device="cuda", dtype=pdtype, requires_grad=True)
    bias = torch.rand(4, device="cuda", dtype=pdtype, requires_grad=True)
    rm = torch.zeros(4, device="cuda", dtype=pdtype)
    rv = torch.ones(4, device="cuda", dtype=pdtype)
    rm2, rv2 = rm.clone(), rv.clone()
    a = x.clone().requires_grad_(True)
    b = x.clone().requires_grad_(True)
    group = dist.group.WORLD  # one_rank_nccl (tests/conftest.py)
    ours = syncbn._SyncBatchNormFunction.apply(a, weight, bias, rm, rv, 1e-5, 0.1, group)
    w2, b2 = (
        weight.detach().clone().requires_grad_(True),
        bias.detach().clone().requires_grad_(True),
    )
    theirs = F.batch_norm(b, rm2, rv2, w2, b2, True, 0.1, 1e-5)
    tol = {torch.float16: 2e-3, torch.bfloat16: 2e-2}.get(dtype, 1e-5)
    torch.testing.assert_close(ours, theirs, rtol=tol, atol=tol)
    g = torch.randn_like(ours)
    ours.backward(g)
    theirs.backward(g)
    torch.testing.assert_close(a.grad, b.grad, rtol=tol, atol=tol)
    torch.testing.assert_close(weight.grad, w2.grad, rtol=tol * 10, atol=tol * 10)
    torch.testing.assert_close(bias.grad, b2.grad, rtol=tol * 10, atol=tol * 10)
    torch.testing.assert_close(rm, rm2, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(rv, rv2, rtol=1e-4, atol=1e-4)
