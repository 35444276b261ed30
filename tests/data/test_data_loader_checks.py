"""check_loader and SafeDataLoader: each rule, the numbers in the messages, warn-once."""

from __future__ import annotations

import dataclasses
import os
import warnings
from typing import Any, List

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

import safetorch as st
from safetorch import _device

NO_ACCEL = "ignore:.*no accelerator.*:UserWarning"  # torch's own notice on CPU machines


@dataclasses.dataclass
class Unpinnable:  # torch's pin_memory passes this through unpinned
    x: torch.Tensor


@dataclasses.dataclass
class Good(st.PinnedBatch):
    x: torch.Tensor


def rules(findings: List[st.Finding]) -> List[str]:
    return [f.rule for f in findings]


def ds(n: int) -> TensorDataset:
    return TensorDataset(torch.zeros(n, 2))


def test_seed_partial_batch_numbers() -> None:
    (f,) = st.check_loader(DataLoader(ds(19130), batch_size=4, num_workers=1))
    assert f.rule == "partial-last-batch" and f.where == "loader"
    assert "19130 samples" in f.message and "4782 full batches" in f.message
    assert "last batch of 2" in f.message and "drop_last=True" in (f.fix or "")
    # torch agrees about the last batch
    assert len(list(DataLoader(ds(10), batch_size=4))[-1][0]) == 10 % 4


def test_clean_loader_has_no_findings() -> None:
    assert st.check_loader(DataLoader(ds(12), batch_size=4, num_workers=2)) == []
    assert st.check_loader(DataLoader(ds(13), batch_size=4, num_workers=2, drop_last=True)) == []


def test_batch_size_one_with_training_batchnorm() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2))
    loader = DataLoader(ds(9), batch_size=4, num_workers=2)
    assert rules(st.check_loader(loader, model)) == [
        "partial-last-batch",
        "last-batch-size-1-batchnorm",
    ]
    message = st.check_loader(loader, model)[1].message
    assert "1 sample" in message and "Expected more than 1 value per channel" in message
    with pytest.raises(ValueError, match="Expected more than 1 value per channel"):
        model(list(loader)[-1][0])  # the failure the finding predicts
    model.eval()
    assert rules(st.check_loader(loader, model)) == ["partial-last-batch"]
    assert rules(st.check_loader(loader)) == ["partial-last-batch"]


def test_pin_memory_without_accelerator(monkeypatch: pytest.MonkeyPatch) -> None:
    loader = DataLoader(ds(8), batch_size=4, num_workers=2, pin_memory=True)
    monkeypatch.setattr(_device, "_accelerator_impl", lambda: False)
    assert rules(st.check_loader(loader)) == ["pin-memory-no-accelerator"]
    monkeypatch.setattr(_device, "_accelerator_impl", lambda: True)
    assert st.check_loader(loader) == []


def test_unpinnable_batch_type(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_device, "_accelerator_impl", lambda: True)
    bad = DataLoader(ds(8), batch_size=4, num_workers=2, pin_memory=True)
    found = st.check_loader(bad, batch=[Unpinnable(torch.zeros(1))])
    assert rules(found) == ["batch-not-pinnable"] and "Unpinnable" in found[0].message
    assert st.check_loader(bad, batch={"x": torch.zeros(1), "meta": Unpinnable(None)}) == []
    assert st.check_loader(bad, batch=Good(torch.zeros(1))) == []
    via_collate = DataLoader(
        ds(8), batch_size=4, num_workers=2, pin_memory=True, collate_fn=st.collate(Unpinnable)
    )
    assert rules(st.check_loader(via_collate)) == ["batch-not-pinnable"]
    good = DataLoader(
        ds(8), batch_size=4, num_workers=2, pin_memory=True, collate_fn=st.collate(Good)
    )
    assert st.check_loader(good) == []
    # without pin_memory the batch type does not matter
    plain = DataLoader(ds(8), batch_size=4, num_workers=2)
    assert st.check_loader(plain, batch=Unpinnable(torch.zeros(1))) == []


def test_num_workers_zero_and_unsized_datasets() -> None:
    class Stream(IterableDataset):
        def __iter__(self) -> Any:
            return iter(range(5))

    assert rules(st.check_loader(DataLoader(Stream(), batch_size=2))) == ["num-workers-0"]
    sampler_loader = DataLoader(ds(10), batch_sampler=[[0, 1, 2]], num_workers=1)
    assert st.check_loader(sampler_loader) == []


def test_safe_loader_warns_once_with_user_stacklevel() -> None:
    loader = st.SafeDataLoader(ds(10), batch_size=4)
    with pytest.warns(st.SafetorchWarning) as record:
        first = [b[0].shape[0] for b in loader]
    assert first == [4, 4, 2]
    # a 10-sample in-memory loader: workers cannot help, so only the partial batch is reported
    assert [str(w.message).split("[")[1].split("]")[0] for w in record] == ["partial-last-batch"]
    assert all(issubclass(w.category, st.DataWarning) for w in record)
    assert all(w.filename == __file__ for w in record)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(list(loader)) == 3  # second epoch: silent


def test_safe_loader_ignore_and_model() -> None:
    model = torch.nn.BatchNorm1d(2)
    loader = st.SafeDataLoader(ds(9), batch_size=4, model=model, ignore=["num-workers-0"])
    with pytest.warns(st.SafetorchWarning) as record:
        iter(loader)
    assert len(record) == 2 and "BatchNorm" in str(record[1].message)


@pytest.mark.filterwarnings(NO_ACCEL)
def test_safe_loader_checks_first_batch_type(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_device, "_accelerator_impl", lambda: True)

    def to_record(samples: Any) -> Unpinnable:
        return Unpinnable(torch.stack([s[0] for s in samples]))

    loader = st.SafeDataLoader(
        ds(8), batch_size=4, pin_memory=True, collate_fn=to_record, ignore=["num-workers-0"]
    )
    it = iter(loader)
    assert len(it) == 2
    with pytest.warns(st.SafetorchWarning, match="batch-not-pinnable.*Unpinnable") as record:
        next(it)
    assert record[0].filename == __file__
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert type(next(it)) is Unpinnable


class _Indexed(torch.utils.data.Dataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.zeros(2)


def test_num_workers_advice_scales_with_the_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    loader = DataLoader(_Indexed(64), batch_size=2)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    (f,) = st.check_loader(loader)
    assert f.rule == "num-workers-0" and f.fix.startswith("num_workers=1 (2 CPU cores")
    monkeypatch.setattr(os, "cpu_count", lambda: 32)
    (f,) = st.check_loader(loader)
    assert f.fix.startswith("num_workers=8 (32 CPU cores")
    monkeypatch.setattr(os, "cpu_count", lambda: 1)
    assert st.check_loader(loader) == []


def test_num_workers_quiet_where_it_cannot_matter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    assert st.check_loader(DataLoader(_Indexed(8), batch_size=2)) == []  # 4 batches
    assert st.check_loader(DataLoader(ds(4000), batch_size=2)) == []  # in-memory tensors
    assert rules(st.check_loader(DataLoader(_Indexed(400), batch_size=2))) == ["num-workers-0"]


def test_batch_objects_hold_tensors_at_any_depth_and_in_any_container(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Whether a pass-through batch object holds tensors is ``_nest.iter_tensors``'s answer.

    The walker it replaced saw only list/tuple/Mapping and stopped at depth 8, so it let these
    batches through as "no tensors inside" although torch leaves every tensor in them unpinned.
    """
    from collections import deque

    class Holder:
        def __init__(self, value: Any) -> None:
            self.value = value

    monkeypatch.setattr(_device, "_accelerator_impl", lambda: True)
    loader = DataLoader(ds(8), batch_size=4, num_workers=2, pin_memory=True)
    in_deque = Holder(deque([torch.zeros(1)]))
    deep: Any = torch.zeros(1)
    for _ in range(12):
        deep = Holder(deep)
    cycle = Holder(None)
    cycle.value = [cycle, "no tensor"]  # a cycle is cut, not followed forever
    assert rules(st.check_loader(loader, batch=in_deque)) == ["batch-not-pinnable"]
    assert rules(st.check_loader(loader, batch=deep)) == ["batch-not-pinnable"]
    assert st.check_loader(loader, batch=cycle) == []
