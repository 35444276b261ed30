"""BalancedDataParallel: chunk sizes (pure), batch-size detection, CPU forward, orchestration."""

from __future__ import annotations

import sys
import warnings
from typing import Any, List

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st_h

import safetorch as st
from safetorch.nn import parallel


@pytest.fixture(autouse=True)
def ddp_advice_reset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(parallel, "_ddp_advice_given", True)  # tested explicitly below


class AddKw(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(3, 2)

    def forward(self, x: torch.Tensor, *, y: torch.Tensor) -> torch.Tensor:
        return self.lin(x) + y


# --- pure chunk-size logic -----------------------------------------------------------------
@pytest.mark.parametrize(
    "batch, n, gpu0, expected, fallback",
    [
        (25, 4, 4, [4, 7, 7, 7], False),
        (26, 4, 4, [4, 8, 7, 7], False),
        (32, 1, 4, [32], False),  # one device: no division by zero
        (10, 4, 3, [3, 3, 2, 2], False),
        (10, 4, 4, [3, 3, 2, 2], True),  # 4 > ceil(10/4): even split
        (8, 3, 0, [0, 4, 4], False),
        (2, 4, 1, [1, 1, 0, 0], False),
        (0, 2, 0, [0, 0], False),
    ],
)
def test_chunk_sizes_table(
    batch: int, n: int, gpu0: int, expected: List[int], fallback: bool
) -> None:
    assert parallel._chunk_sizes(batch, n, gpu0) == (expected, fallback)


@given(st_h.integers(0, 4096), st_h.integers(1, 16), st_h.integers(0, 512))
def test_chunk_sizes_properties(batch: int, n: int, gpu0: int) -> None:
    sizes, fallback = parallel._chunk_sizes(batch, n, gpu0)
    assert len(sizes) == n and sum(sizes) == batch and min(sizes) >= 0
    rest = sizes if fallback or n == 1 else sizes[1:]
    assert max(rest) - min(rest) <= 1 and rest == sorted(rest, reverse=True)
    if n > 1 and not fallback:
        assert sizes[0] == gpu0
    # equal split agrees with torch.chunk's total and device count bound
    assert fallback == (n > 1 and gpu0 > -(-batch // n))


def test_chunk_sizes_rejects_no_devices() -> None:
    with pytest.raises(ValueError, match="at least one device"):
        parallel._chunk_sizes(4, 0, 1)


# --- batch size detection --------------------------------------------------------------------
def test_batch_size_from_keyword_only_and_nested_inputs() -> None:
    assert parallel._batch_size((), {"x": torch.zeros(6, 2)}, 0) == 6
    assert parallel._batch_size(([torch.zeros(2, 5)],), {"m": {"k": torch.zeros(3, 5)}}, 1) == 5
    assert parallel._batch_size((1, "s"), {}, 0) is None
    with pytest.raises(ValueError, match=r"\(6, 2\) and \(5,\)"):
        parallel._batch_size((torch.zeros(6, 2),), {"y": torch.zeros(5)}, 0)
    with pytest.raises(ValueError, match="dim=1"):
        parallel._batch_size((torch.zeros(6),), {}, 1)


# --- construction and CPU forward --------------------------------------------------------------
def test_validation() -> None:
    with pytest.raises(TypeError, match="gpu0_bsz must be an int"):
        st.BalancedDataParallel(torch.nn.Identity(), gpu0_bsz=2.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="gpu0_bsz must be >= 0"):
        st.BalancedDataParallel(torch.nn.Identity(), gpu0_bsz=-1)


def test_ddp_advice_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(parallel, "_ddp_advice_given", False)
    with pytest.warns(st.SafetorchWarning, match="DistributedDataParallel") as record:
        st.BalancedDataParallel(torch.nn.Identity(), gpu0_bsz=1)
    assert record[0].filename == __file__
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        st.BalancedDataParallel(torch.nn.Identity(), gpu0_bsz=1)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA plain forward")
def test_no_cuda_is_plain_forward_with_keywords() -> None:
    torch.manual_seed(0)
    inner = AddKw()
    dp = st.BalancedDataParallel(inner, gpu0_bsz=1)
    x, y = torch.randn(5, 3), torch.randn(5, 2)
    torch.testing.assert_close(dp(x, y=y), inner(x, y=y))
    assert dp.chunk_sizes(5) == [5] and dp.device_ids == []
    assert dp.state_dict().keys() == torch.nn.DataParallel(inner).state_dict().keys()


# --- multi-device orchestration on CPU (scatter/replicate/apply/gather replaced) ----------------
class FakeMultiDevice:
    def __init__(self, dp: st.BalancedDataParallel, monkeypatch: pytest.MonkeyPatch) -> None:
        self.replicated: List[Any] = []
        self.applied: List[Any] = []
        monkeypatch.setattr(dp, "device_ids", [0, 1, 2])
        monkeypatch.setattr(dp, "src_device_obj", torch.device("cpu"), raising=False)
        monkeypatch.setattr(dp, "output_device", 0, raising=False)

        class SplitScatter:
            @staticmethod
            def apply(devices: Any, sizes: Any, dim: int, t: torch.Tensor) -> Any:
                assert len(devices) == len(sizes)
                return t.split(list(sizes), dim)

        monkeypatch.setattr(parallel, "_Scatter", SplitScatter)
        monkeypatch.setattr(dp, "replicate", self.replicate)
        monkeypatch.setattr(dp, "parallel_apply", self.parallel_apply)
        monkeypatch.setattr(dp, "gather", lambda outs, device: torch.cat(outs, dp.dim))

    def replicate(self, module: torch.nn.Module, ids: List[int]) -> List[torch.nn.Module]:
        self.replicated.append(list(ids))
        return [module for _ in ids]

    def parallel_apply(self, replicas: Any, inputs: Any, kwargs: Any) -> List[Any]:
        assert len(replicas) == len(inputs) == len(kwargs)
        self.applied.append([len(kw["y"]) for kw in kwargs])
        return [r(*i, **k) for r, i, k in zip(replicas, inputs, kwargs)]


@pytest.mark.parametrize(
    "gpu0, batch, replicated, applied",
    [
        (2, 11, [0, 1, 2], [2, 5, 4]),
        (0, 6, [0, 1, 2], [3, 3]),  # GPU 0 idle: its replica is dropped
        (1, 2, [0, 1], [1, 1]),  # fewer samples than devices
    ],
)
def test_forward_scatters_positional_and_keyword_inputs(
    monkeypatch: pytest.MonkeyPatch, gpu0: int, batch: int, replicated: Any, applied: Any
) -> None:
    torch.manual_seed(0)
    inner = AddKw()
    dp = st.BalancedDataParallel(inner, gpu0_bsz=gpu0)
    fake = FakeMultiDevice(dp, monkeypatch)
    x, y = torch.randn(batch, 3), torch.randn(batch, 2)
    torch.testing.assert_close(dp(x, y=y), inner(x, y=y))
    assert fake.replicated == [replicated] and fake.applied == [applied]


def test_forward_falls_back_to_even_split_with_one_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    inner = AddKw()
    dp = st.BalancedDataParallel(inner, gpu0_bsz=8)
    fake = FakeMultiDevice(dp, monkeypatch)
    x, y = torch.randn(9, 3), torch.randn(9, 2)
    with pytest.warns(st.SafetorchWarning, match="exceeds an even share") as record:
        dp(x, y=y)
    assert record[0].filename == __file__
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dp(x, y=y)
    assert fake.applied == [[3, 3, 3], [3, 3, 3]]


def test_fallback_warning_points_at_the_user_line_under_torch_containers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Module.__call__ is one frame on torch 1.13 and two on 2.x; nesting adds more.
    dp = st.BalancedDataParallel(torch.nn.Linear(3, 2), gpu0_bsz=8)
    FakeMultiDevice(dp, monkeypatch)
    monkeypatch.setattr(dp, "parallel_apply", lambda r, i, k: [m(*a) for m, a in zip(r, i)])
    model = torch.nn.Sequential(torch.nn.Sequential(dp))
    with pytest.warns(st.SafetorchWarning, match="exceeds an even share") as record:
        model(torch.randn(9, 3))
    assert (record[0].filename, record[0].lineno) == (__file__, _lineno() - 1)


def test_chunk_sizes_warning_points_at_the_caller(monkeypatch: pytest.MonkeyPatch) -> None:
    dp = st.BalancedDataParallel(torch.nn.Identity(), gpu0_bsz=8)
    FakeMultiDevice(dp, monkeypatch)
    with pytest.warns(st.SafetorchWarning, match="exceeds an even share") as record:
        dp.chunk_sizes(9)
    assert record[0].filename == __file__


def _lineno() -> int:
    frame = sys._getframe(1)
    return frame.f_lineno
