"""One container walker (safetorch._nest): pin, to_device, safe_copy and the DataParallel
scatter rebuild the same nested input into the same structure, with one dataclass rule."""

from __future__ import annotations

import dataclasses
from collections import OrderedDict, UserDict, defaultdict, deque, namedtuple
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Callable, Dict, List

import pytest
import torch

import safetorch as st
from safetorch._nest import map_tensors
from safetorch.nn import parallel

Point = namedtuple("Point", ["x", "y"])
POST_INITS: List[str] = []


@dataclasses.dataclass
class Derived:
    x: torch.Tensor
    scale: float = 2.0
    cache: torch.Tensor = dataclasses.field(init=False)  # a tensor dataclasses.replace skips

    def __post_init__(self) -> None:
        POST_INITS.append("Derived")
        self.cache = self.x * self.scale


@dataclasses.dataclass(frozen=True)
class Frozen:
    a: torch.Tensor
    tag: str


@dataclasses.dataclass
class WithInitVar:  # dataclasses.replace raises: "InitVar 'seed' must be specified"
    x: torch.Tensor
    seed: dataclasses.InitVar[int]

    def __post_init__(self, seed: int) -> None:
        POST_INITS.append("WithInitVar")


def nested() -> Dict[str, Any]:
    """Every container kind, each holding tensors of batch size 4 along dim 0."""
    od: Any = OrderedDict(w=torch.ones(4, 2))
    od._metadata = {"": {"version": 1}}  # as a state dict
    dd: Any = defaultdict(list)
    dd["k"].append(torch.ones(4))
    return {
        "dc": Derived(torch.ones(4, 3)),
        "frozen": Frozen(torch.zeros(4), "t"),
        "initvar": WithInitVar(torch.zeros(4, 1), seed=3),
        "point": Point(torch.ones(4), [torch.zeros(4, 2), "s"]),
        "od": od,
        "dd": dd,
        "user": UserDict(u=torch.ones(4)),
        "proxy": MappingProxyType({"p": torch.ones(4)}),
        "deque": deque([torch.ones(4), 1]),
        "tuple": (torch.ones(4), 5),
        "leaves": ["x", b"b", range(3), 1.5, None],
    }


def describe(obj: Any) -> Any:
    """The structure with every tensor replaced by "T": types, keys, fields, extra state."""
    if isinstance(obj, torch.Tensor):
        return "T"
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        fields = dataclasses.fields(obj)
        return type(obj), tuple((f.name, describe(getattr(obj, f.name))) for f in fields)
    if isinstance(obj, Mapping):
        extra = (getattr(obj, "_metadata", None), getattr(obj, "default_factory", None))
        return type(obj), tuple((k, describe(v)) for k, v in obj.items()), extra
    if isinstance(obj, (list, tuple, deque)):
        return type(obj), tuple(describe(v) for v in obj)
    return type(obj), obj


def tensors_in(obj: Any) -> List[torch.Tensor]:
    out: List[torch.Tensor] = []
    map_tensors(out.append, obj)
    return out


class SplitScatter:
    @staticmethod
    def apply(devices: Any, sizes: Any, dim: int, t: torch.Tensor) -> Any:
        return t.split(list(sizes), dim)


def test_every_walker_rebuilds_the_same_structure(
    fake_accelerator: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(parallel, "_Scatter", SplitScatter)
    batch = nested()
    expected = describe(batch)
    originals = tensors_in(batch)
    assert len(originals) == 12  # Derived.cache (init=False) included
    del POST_INITS[:]
    pinned = st.pin(batch)
    moved = st.to_device(batch, "meta")
    copied = st.safe_copy(batch)
    first, rest = parallel._scatter(batch, [0, 1], [1, 3], 0)
    for out in (pinned, moved, copied, first, rest):
        assert describe(out) == expected
    assert POST_INITS == []  # no walker runs __init__/__post_init__ again
    # every tensor went through the walker's function, init=False fields included
    assert all(id(t) in fake_accelerator.pinned for t in tensors_in(pinned))
    assert all(t.is_meta for t in tensors_in(moved))
    ptrs = {t.data_ptr() for t in originals}
    assert not any(t.data_ptr() in ptrs for t in tensors_in(copied))
    assert [t.shape[0] for t in tensors_in(first)] == [1] * 12
    assert [t.shape[0] for t in tensors_in(rest)] == [3] * 12
    # the input is untouched
    assert describe(batch) == expected
    assert all(a is b for a, b in zip(tensors_in(batch), originals))


@pytest.mark.parametrize(
    "walk",
    [
        pytest.param(lambda x: st.pin(x), id="pin"),
        pytest.param(lambda x: st.to_device(x, "cpu"), id="to_device"),
        pytest.param(st.safe_copy, id="safe_copy"),
        pytest.param(lambda x: map_tensors(lambda t: t, x), id="map_tensors"),
    ],
)
def test_one_dataclass_rule_copy_and_set_every_field(
    walk: Callable[[Any], Any], fake_accelerator: Any
) -> None:
    d = Derived(torch.ones(2))
    d.cache = torch.full((2,), 7.0)  # not what __post_init__ would recompute
    del POST_INITS[:]
    out = walk(d)
    assert type(out) is Derived and out is not d and POST_INITS == []
    assert torch.equal(out.cache, torch.full((2,), 7.0))  # mapped, not recomputed
    f = walk(Frozen(torch.zeros(1), "t"))
    assert type(f) is Frozen and f.tag == "t"
    w = walk(WithInitVar(torch.zeros(1), seed=1))  # dataclasses.replace would raise
    assert type(w) is WithInitVar and POST_INITS == ["WithInitVar"]  # the constructor above


def test_an_object_that_does_the_job_itself_is_asked_first(fake_accelerator: Any) -> None:
    class Pins(dict):
        def pin_memory(self) -> str:
            return "pinned itself"

    @dataclasses.dataclass
    class Moves:
        x: torch.Tensor

        def to(self, device: Any) -> str:
            return f"moved itself to {device}"

    assert st.pin({"p": Pins(t=torch.ones(1))})["p"] == "pinned itself"
    assert st.to_device([Moves(torch.ones(1))], "meta") == ["moved itself to meta"]


def test_generic_mappings_and_sequences_are_containers_for_every_walker() -> None:
    t = torch.ones(2, requires_grad=True) * 2  # in the graph: deepcopy would raise
    moved = st.to_device({"u": UserDict(a=t), "q": deque([t])}, "meta")
    assert moved["u"]["a"].is_meta and moved["q"][0].is_meta
    copied = st.safe_copy(UserDict(a=t))
    assert type(copied) is UserDict and not copied["a"].requires_grad


def test_sequences_that_hold_no_tensors_stay_as_they_are(fake_accelerator: Any) -> None:
    obj = [range(3), "ab", b"cd", bytearray(b"ef")]
    for out in (st.pin(obj), st.to_device(obj, "cpu"), st.safe_copy(obj)):
        assert out == obj and [type(v) for v in out] == [type(v) for v in obj]


def test_a_mapping_that_cannot_be_rebuilt_becomes_a_dict() -> None:
    class NoCopy(Mapping):  # immutable, and its constructor is not dict-like
        def __init__(self, data: Dict[str, Any], owner: str) -> None:
            self._data = data

        def __getitem__(self, k: str) -> Any:
            return self._data[k]

        def __iter__(self) -> Any:
            return iter(self._data)

        def __len__(self) -> int:
            return len(self._data)

    out = st.to_device(NoCopy({"a": torch.ones(1)}, "me"), "meta")
    assert type(out) is dict and out["a"].is_meta  # as torch's pin_memory falls back


def test_iter_tensors_reads_what_map_tensors_maps() -> None:
    """``iter_tensors``: the same containers as ``map_tensors``, the same tensors in the same
    order, nothing rebuilt and nothing called."""
    from safetorch._nest import iter_tensors

    batch = nested()
    assert [id(t) for t in iter_tensors(batch)] == [id(t) for t in tensors_in(batch)]
    assert list(iter_tensors("text")) == [] and list(iter_tensors(range(3))) == []


def test_iter_tensors_depth_and_cycle_policy() -> None:
    from safetorch._nest import iter_tensors

    t = torch.ones(1)
    deep: Any = t
    for _ in range(5000):  # no depth limit (the readers it replaced stopped at 8 or 20) and
        deep = [deep]  # no recursion: deeper than Python's recursion limit
    assert list(iter_tensors(deep)) == [t]
    loop: List[Any] = [t]
    loop.append(loop)  # a cycle is cut: its container is entered once
    assert list(iter_tensors(loop)) == [t]
    shared = [t]
    assert len(list(iter_tensors([shared, shared, t]))) == 2  # a container once, a tensor each time

    class Plain:
        def __init__(self) -> None:
            self.x = t

    assert list(iter_tensors(Plain())) == []  # a plain object is a leaf ...
    assert list(iter_tensors(Plain(), objects=True)) == [t]  # ... unless objects=True
    holder = Plain()
    holder.x = torch  # a module: its globals are not walked
    assert list(iter_tensors(holder, objects=True)) == []


def test_iter_named_tensors_paths() -> None:
    from safetorch._nest import iter_named_tensors

    batch = {"dc": Derived(torch.ones(1)), "point": Point(torch.ones(1), [torch.zeros(1)])}
    names = [name for name, _ in iter_named_tensors(batch)]
    assert names == ["dc.x", "dc.cache", "point.0", "point.1.0"]
    assert [name for name, _ in iter_named_tensors(torch.ones(1))] == [""]
