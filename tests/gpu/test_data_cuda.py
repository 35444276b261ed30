"""CUDA-only checks: real pinning, PinnedBatch.to, BalancedDataParallel, PointwiseConv1d."""

from __future__ import annotations

import contextlib
import dataclasses
from collections import namedtuple
from typing import Any, Iterator, List

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

import safetorch as st
from safetorch._nest import map_tensors
from safetorch.nn import parallel, pointwise

Pair = namedtuple("Pair", ["a", "b"])


@dataclasses.dataclass
class Inner:
    t: torch.Tensor


@dataclasses.dataclass
class Batch(st.PinnedBatch):
    x: torch.Tensor
    y: torch.Tensor


@dataclasses.dataclass
class NestedBatch(st.PinnedBatch):
    x: torch.Tensor
    extra: Any


class Samples(Dataset):
    def __len__(self) -> int:
        return 10

    def __getitem__(self, i: int) -> Any:
        return torch.full((3,), float(i)), i


def tensors_in(obj: Any) -> List[torch.Tensor]:
    out: List[torch.Tensor] = []
    map_tensors(out.append, obj)
    return out


@pytest.mark.parametrize("workers", [0, 2])
def test_loader_pins_every_field(workers: int) -> None:
    loader = DataLoader(
        Samples(), batch_size=4, num_workers=workers, pin_memory=True, collate_fn=st.collate(Batch)
    )
    batches = list(loader)
    assert [type(b) for b in batches] == [Batch] * 3
    assert all(b.x.is_pinned() and b.y.is_pinned() for b in batches)


def test_pin_nested_dataclass_and_namedtuple() -> None:
    b = NestedBatch(torch.zeros(2), {"p": Pair(torch.zeros(1), [Inner(torch.zeros(1))])})
    assert b.pin_memory() is b
    leaves = tensors_in([b.x, b.extra])
    assert len(leaves) == 3 and all(t.is_pinned() for t in leaves)
    out = st.pin({"d": Inner(torch.ones(1)), "p": Pair(torch.ones(1), 2)})
    assert out["d"].t.is_pinned() and out["p"].a.is_pinned() and out["p"].b == 2
    # torch's own pin_memory leaves the dataclass unpinned: the pitfall
    from torch.utils.data._utils.pin_memory import pin_memory as torch_pin

    assert not torch_pin(Inner(torch.ones(1))).t.is_pinned()


def test_to_moves_pinned_batch_to_cuda() -> None:
    b = Batch(torch.arange(4.0), torch.arange(4)).pin_memory()
    moved = b.to("cuda")
    torch.cuda.synchronize()
    assert moved.x.is_cuda and moved.y.is_cuda and b.x.device.type == "cpu"
    assert torch.equal(moved.x.cpu(), b.x)


def test_check_loader_quiet_with_accelerator() -> None:
    loader = DataLoader(
        Samples(), batch_size=5, num_workers=2, pin_memory=True, collate_fn=st.collate(Batch)
    )
    assert st.check_loader(loader) == []


# --- BalancedDataParallel ----------------------------------------------------------------
class Recorder(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(3, 2)
        self.seen: List[Any] = []

    def forward(self, x: torch.Tensor, *, y: torch.Tensor) -> torch.Tensor:
        self.seen.append((x.device.index, x.shape[0]))
        return self.lin(x) + y


@pytest.fixture(autouse=True)
def no_ddp_advice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(parallel, "_ddp_advice_given", True)


def test_balanced_one_device_keyword_inputs() -> None:
    inner = Recorder().cuda()
    dp = st.BalancedDataParallel(inner, gpu0_bsz=1, device_ids=[0])
    x, y = torch.randn(5, 3), torch.randn(5, 2)
    out = dp(x, y=y)
    torch.testing.assert_close(out.cpu(), inner(x.cuda(), y=y.cuda()).cpu())
    assert inner.seen[0] == (0, 5)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2+ CUDA devices")
@pytest.mark.parametrize("gpu0", [0, 1, 3])
def test_balanced_multi_gpu_chunks(gpu0: int) -> None:
    n = torch.cuda.device_count()
    inner = Recorder().cuda()
    dp = st.BalancedDataParallel(inner, gpu0_bsz=gpu0)
    batch = 3 * n + 1
    x, y = torch.randn(batch, 3), torch.randn(batch, 2)
    out = dp(x, y=y)
    expected, _ = parallel._chunk_sizes(batch, n, gpu0)
    torch.testing.assert_close(out.cpu(), inner.lin(x.cuda()).cpu() + y, rtol=1e-4, atol=1e-4)
    assert out.shape == (batch, 2) and out.device.index == 0
    # replicas share the `seen` list (replicate copies __dict__ shallowly)
    assert sorted(inner.seen) == sorted((i, s) for i, s in enumerate(expected) if s > 0)


# --- PointwiseConv1d -----------------------------------------------------------------------
@contextlib.contextmanager
def ieee_float32() -> Iterator[None]:
    """Full float32 precision for cuDNN convolutions and cuBLAS matmuls inside the block.

    torch's defaults let cuDNN convolutions use TF32 on Ampere and later GPUs (10-bit
    mantissa: ~1e-3 relative error on a 64-term dot product) but keep matmuls in full
    float32, so ``nn.Conv1d`` and the ``F.linear`` path differ by TF32 rounding, not by a
    bug. With both in IEEE float32 they agree to float32 rounding of the summation order.
    """
    conv = getattr(torch.backends.cudnn, "conv", None)
    if conv is not None and hasattr(conv, "fp32_precision"):
        # torch 2.9+: the per-op fp32_precision API. Setting the legacy allow_tf32 flags
        # there warns, and mixing both APIs makes legacy reads raise.
        matmul = torch.backends.cuda.matmul
        old = (conv.fp32_precision, matmul.fp32_precision)
        conv.fp32_precision = matmul.fp32_precision = "ieee"
        try:
            yield
        finally:
            conv.fp32_precision, matmul.fp32_precision = old
    else:
        old_flags = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)
        torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
        try:
            yield
        finally:
            torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = old_flags


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("impl", ["conv", "linear", "auto"])
def test_pointwise_matches_conv_on_cuda(dtype: torch.dtype, impl: str) -> None:
    conv = torch.nn.Conv1d(64, 32, kernel_size=1).cuda().to(dtype)
    pw = st.PointwiseConv1d(64, 32, impl=impl).cuda().to(dtype)
    pw.load_state_dict(conv.state_dict())
    # Both shapes are measured on CUDA in "auto" (every shape is, small ones included).
    shapes = [(8, 64, 100), (8, 64, 4096)]
    # float32 in IEEE precision on both sides (see ieee_float32); half types: their rounding.
    tol = dict(rtol=1e-2, atol=1e-2) if dtype != torch.float32 else dict(rtol=1e-4, atol=1e-4)
    with torch.no_grad(), ieee_float32():
        for shape in shapes:
            x = torch.randn(*shape, device="cuda", dtype=dtype)
            torch.testing.assert_close(pw(x), conv(x), **tol)
        if impl == "auto":
            key = pointwise._key(x, pw.weight, pw.bias)
            assert st.PointwiseConv1d.autotune_cache().get(key) in ("conv", "linear")
