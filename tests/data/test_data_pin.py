"""PinnedBatch, st.pin and st.collate: recursion, the no-accelerator no-op, DataLoader use."""

from __future__ import annotations

import dataclasses
import warnings
from collections import OrderedDict, namedtuple
from typing import Any, Dict, List

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

import safetorch as st
from safetorch import _compat, _device
from safetorch._nest import map_tensors

Pair = namedtuple("Pair", ["a", "b"])


@dataclasses.dataclass
class Batch(st.PinnedBatch):
    x: torch.Tensor
    y: torch.Tensor


@dataclasses.dataclass(frozen=True)
class FrozenBatch(st.PinnedBatch):
    x: torch.Tensor
    extra: Dict[str, Any]


class PlainBatch(st.PinnedBatch):
    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x = x
        self.y = y


class SlotBatch(st.PinnedBatch):
    __slots__ = ("x",)

    def __init__(self, x: torch.Tensor) -> None:
        self.x = x


@dataclasses.dataclass
class Inner:  # a dataclass torch's own pin_memory leaves unpinned
    t: torch.Tensor
    name: str = "inner"


class HasPin:
    def __init__(self, t: torch.Tensor) -> None:
        self.t = t
        self.calls = 0

    def pin_memory(self) -> "HasPin":
        self.calls += 1
        return self


class Samples(Dataset):
    def __len__(self) -> int:
        return 10

    def __getitem__(self, i: int) -> Any:
        return torch.full((3,), float(i)), i


def tensors_in(obj: Any) -> List[torch.Tensor]:
    out: List[torch.Tensor] = []
    map_tensors(out.append, obj)
    return out


# --- no accelerator: a no-op, silent ----------------------------------------------------
@pytest.mark.skipif(st.accelerator_available(), reason="checks the no-accelerator path")
def test_plain_tensor_pin_raises_but_st_pin_is_a_silent_noop() -> None:
    with pytest.raises(RuntimeError):
        torch.zeros(2).pin_memory()  # the pitfall this package removes
    b = Batch(torch.zeros(2), torch.ones(2))
    nested = {"b": b, "l": [torch.zeros(1)], "d": Inner(torch.zeros(1))}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert b.pin_memory() is b
        assert st.pin(nested) is nested
        assert st.pin(torch.zeros(1)).is_pinned() is False


def test_older_torch_branch_uses_cuda_detection(simulate_torch: Any) -> None:
    with simulate_torch(HAS_ACCELERATOR=False):
        assert _device._accelerator_impl is _device._accelerator_available_old
        b = Batch(torch.zeros(2), torch.ones(2))
        assert b.pin_memory() is b
        assert st.pin([b])[0] is b
    # restored on exit: torch.accelerator where the installed torch has it (2.6), CUDA before
    if _compat.HAS_ACCELERATOR:
        assert _device._accelerator_impl is _device._accelerator_available_new
        assert st.accelerator_available() == torch.accelerator.is_available()
    else:
        assert not hasattr(getattr(torch, "accelerator", None), "is_available")
        assert _device._accelerator_impl is _device._accelerator_available_old
        assert st.accelerator_available() == torch.cuda.is_available()


# --- recursion (fake accelerator) -------------------------------------------------------
def test_pin_recurses_through_every_container(fake_accelerator: Any) -> None:
    obj = {
        "list": [torch.zeros(1), (torch.zeros(2), "s")],
        "pair": Pair(torch.zeros(3), 7),
        "dc": Inner(torch.zeros(4)),
        "od": OrderedDict(k=torch.zeros(5)),
        "batch": Batch(torch.zeros(6), torch.zeros(6)),
        "bytes": b"raw",
    }
    out = st.pin(obj)
    leaves = tensors_in(out)
    assert len(leaves) == 7
    assert all(id(t) in fake_accelerator.pinned for t in leaves)
    assert isinstance(out["pair"], Pair) and out["pair"].b == 7
    assert isinstance(out["dc"], Inner) and out["dc"].name == "inner"
    assert type(out["od"]) is OrderedDict
    assert out["list"][1][1] == "s" and out["bytes"] == b"raw"
    # the input is not mutated, except the PinnedBatch which pins itself in place
    assert id(obj["list"][0]) not in fake_accelerator.pinned
    assert out["batch"] is obj["batch"]


def test_pin_calls_custom_pin_memory_methods(fake_accelerator: Any) -> None:
    h = HasPin(torch.zeros(1))
    out = st.pin([h, {"h": h}])
    assert out[0] is h and out[1]["h"] is h and h.calls == 2


@pytest.mark.parametrize("cls", [Batch, PlainBatch])
def test_pinned_batch_pins_every_field_in_place(cls: Any, fake_accelerator: Any) -> None:
    b = cls(torch.zeros(2), [torch.zeros(1), {"k": Inner(torch.zeros(1))}])
    assert b.pin_memory() is b
    leaves = tensors_in([b.x, b.y])
    assert len(leaves) == 3 and all(id(t) in fake_accelerator.pinned for t in leaves)


def test_frozen_and_slotted_batches_pin(fake_accelerator: Any) -> None:
    f = FrozenBatch(torch.zeros(1), {"m": torch.zeros(1)})
    assert f.pin_memory() is f
    assert id(f.x) in fake_accelerator.pinned and id(f.extra["m"]) in fake_accelerator.pinned
    s = SlotBatch(torch.zeros(1))
    s.pin_memory()
    assert id(s.x) in fake_accelerator.pinned


def test_pin_matches_torch_on_torch_supported_structures(fake_accelerator: Any) -> None:
    # Same structure and values as torch's own pin_memory for what torch handles.
    from torch.utils.data._utils.pin_memory import pin_memory as torch_pin

    obj = {"a": [torch.arange(3), (torch.ones(2), 1)], "p": Pair(torch.zeros(1), "x")}
    with pytest.MonkeyPatch.context() as m:
        m.setattr(torch.Tensor, "pin_memory", lambda t, device=None: t.clone())
        expected = torch_pin(obj)
    got = st.pin(obj)
    assert type(got["p"]) is type(expected["p"]) and got["p"].b == expected["p"].b
    for g, e in zip(tensors_in(got), tensors_in(expected)):
        torch.testing.assert_close(g, e)


# --- .to ---------------------------------------------------------------------------------
def test_to_moves_every_field_and_returns_a_copy() -> None:
    b = Batch(torch.zeros(2), torch.ones(2))
    moved = b.to("meta")
    assert moved is not b and type(moved) is Batch
    assert moved.x.device.type == "meta" and moved.y.device.type == "meta"
    assert b.x.device.type == "cpu"
    p = PlainBatch(torch.zeros(1), {"k": [torch.zeros(1)]}).to(torch.device("meta"))
    assert p.y["k"][0].is_meta


def test_to_passes_non_blocking(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: List[Any] = []
    real = st.to_device

    def spy(obj: Any, device: Any, non_blocking: Any = None) -> Any:
        seen.append(non_blocking)
        return real(obj, device, non_blocking=non_blocking)

    monkeypatch.setattr(st.device, "to_device", spy)
    Batch(torch.zeros(1), torch.zeros(1)).to("cpu", non_blocking=True)
    Batch(torch.zeros(1), torch.zeros(1)).to("cpu")
    assert seen == [True, True, None, None]


# --- collate + DataLoader ----------------------------------------------------------------
def test_collate_from_tuples_dicts_and_records() -> None:
    fn = st.collate(Batch)
    b = fn([(torch.zeros(2), 0), (torch.ones(2), 1)])
    assert type(b) is Batch and b.x.shape == (2, 2) and b.y.tolist() == [0, 1]
    b = fn([{"x": torch.zeros(2), "y": 3}, {"x": torch.zeros(2), "y": 4}])
    assert b.y.tolist() == [3, 4]
    b = fn([Batch(torch.zeros(2), torch.tensor(5)), Batch(torch.ones(2), torch.tensor(6))])
    assert b.x.shape == (2, 2) and b.y.tolist() == [5, 6]
    p = st.collate(PlainBatch)([PlainBatch(torch.zeros(1), torch.zeros(1))] * 3)
    assert type(p) is PlainBatch and p.x.shape == (3, 1)


def test_collate_errors_name_the_fields() -> None:
    with pytest.raises(TypeError, match=r"collate\(Batch\).*3 positional fields"):
        st.collate(Batch)([(1, 2, 3)])
    with pytest.raises(ValueError, match="empty"):
        st.collate(Batch)([])


@pytest.mark.parametrize("workers", [0, 2])
def test_dataloader_pin_memory_returns_the_class(workers: int) -> None:
    loader = DataLoader(
        Samples(), batch_size=4, num_workers=workers, pin_memory=True, collate_fn=st.collate(Batch)
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        batches = list(loader)
    assert [type(b) for b in batches] == [Batch] * 3
    assert [len(b.y) for b in batches] == [4, 4, 2]
    assert torch.equal(torch.cat([b.y for b in batches]), torch.arange(10))
    assert not [w for w in caught if issubclass(w.category, st.SafetorchWarning)]
    if st.accelerator_available():
        assert all(b.x.is_pinned() for b in batches)
    else:  # torch's own notice; safetorch adds nothing
        assert all("accelerator" in str(w.message) for w in caught)
