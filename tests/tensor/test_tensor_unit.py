"""Unit tests for safetorch.tensor: modes, deferred errors, device policy, bad input, safe_copy."""

from __future__ import annotations

import collections
import dataclasses
import os
import subprocess
import sys
from typing import Any, List, NamedTuple

import pytest
import torch

import safetorch as st
from safetorch import _compat, _device, _index_checks, _index_parse

# --- fast path ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "call",
    [
        lambda x, i: st.checked_index(x, i),
        lambda x, i: st.index_select(x, 0, i),
        lambda x, i: st.gather(x, 0, i),
    ],
)
def test_cpu_auto_calls_torch_directly_without_checks(call: Any, monkeypatch: Any) -> None:
    def boom(*a: Any, **k: Any) -> None:
        raise AssertionError("the check path ran on CPU in auto mode")

    monkeypatch.setattr(_index_checks, "_check_ranges", boom)
    monkeypatch.setattr(_index_parse, "_parse", boom)
    assert torch.equal(call(torch.arange(5), torch.tensor([4, 1])), torch.tensor([4, 1]))
    with pytest.raises((IndexError, RuntimeError)) as info:
        call(torch.arange(5), torch.tensor([5]))  # CPU torch's own error
    assert not isinstance(info.value, st.IndexOutOfBoundsError)


def test_always_mode_runs_the_check_path(index_check_always: None, monkeypatch: Any) -> None:
    calls = []
    original = _index_checks._check_ranges
    monkeypatch.setattr(_index_checks, "_check_ranges", lambda c: calls.append(c) or original(c))
    with _compat.override(HAS_TRITON=False):  # the torch-op path (the fused one is tested apart)
        st.checked_index(torch.arange(5), torch.tensor([1]))
        st.index_select(torch.arange(5), 0, torch.tensor([1]))
        st.gather(torch.arange(5), 0, torch.tensor([1]))
    assert len(calls) == 3


def test_check_never_skips_even_when_forced_globally(index_check_always: None) -> None:
    with pytest.raises(IndexError):  # torch's own CPU error, not ours
        st.checked_index(torch.arange(3), torch.tensor([3]), check="never")


def test_set_index_check_validates_and_returns_previous() -> None:
    prev = st.set_index_check("never")
    try:
        assert st.get_index_check() == "never"
        assert not _device.needs_index_check("cuda")
    finally:
        st.set_index_check(prev)
    assert _device.needs_index_check("cuda") and _device.needs_index_check("mps")
    assert not _device.needs_index_check("cpu")
    with pytest.raises(ValueError, match="'auto'"):
        st.set_index_check("sometimes")


@pytest.mark.parametrize("value,expected", [("always", "always"), ("never", "never"), ("", "auto")])
def test_env_var_sets_initial_mode(value: str, expected: str) -> None:
    env = dict(os.environ, SAFETORCH_INDEX_CHECK=value)
    out = subprocess.run(
        [sys.executable, "-c", "import safetorch as st; print(st.get_index_check())"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == expected


def test_env_var_typo_warns_and_uses_auto() -> None:
    env = dict(os.environ, SAFETORCH_INDEX_CHECK="alwys")
    out = subprocess.run(
        [sys.executable, "-c", "import safetorch as st; print(st.get_index_check())"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "auto"
    assert "SafetorchWarning" in out.stderr and "alwys" in out.stderr


# --- errors -----------------------------------------------------------------------------------


def test_error_wording_and_classes(index_check_always: None) -> None:
    x = torch.zeros(2, 6)
    # CPU torch numbers the index tensors, not the dimensions of x: "dimension 0" here
    with pytest.raises(
        st.IndexOutOfBoundsError, match="^index 6 is out of bounds for dimension 0 with size 6$"
    ):
        st.checked_index(x, (slice(None), torch.tensor([0, 6])))
    with pytest.raises(IndexError, match="index -3 is out of bounds for dimension 0 with size 2"):
        st.checked_index(x, torch.tensor([-3]))
    with pytest.raises(IndexError, match="^index out of range in self$"):  # CPU's wording
        st.index_select(x, 0, torch.tensor([-1]))  # index_select does not accept negatives
    with pytest.raises(RuntimeError, match="index 7 is out of bounds for dimension 1 with size 6"):
        st.gather(x, 1, torch.tensor([[7], [0]]))


def test_bool_mask_wrong_shape_names_both_shapes(index_check_always: None) -> None:
    with pytest.raises(IndexError, match=r"mask \[3\].*indexed tensor \[4, 2\]"):
        st.checked_index(torch.zeros(4, 2), torch.tensor([True, False, True]))


@pytest.mark.parametrize("check", ["always", "never"])
def test_float_index_raises_like_torch(check: str) -> None:
    x = torch.arange(4)
    with pytest.raises(IndexError, match="tensors used as indices must be long"):
        st.checked_index(x, torch.tensor([1.0]), check=check)
    with pytest.raises(RuntimeError, match="index_select"):
        st.index_select(x, 0, torch.tensor([1.0]), check=check)
    with pytest.raises(RuntimeError, match="gather"):
        st.gather(x, 0, torch.tensor([1.0]), check=check)


def test_index_on_another_device_names_both(index_check_always: None) -> None:
    x = torch.arange(4)
    idx = torch.zeros(1, dtype=torch.long, device="meta")
    for call in (
        lambda: st.checked_index(x, idx),
        lambda: st.index_select(x, 0, idx),
        lambda: st.gather(x, 0, idx),
    ):
        with pytest.raises(st.DeviceMismatchError, match="meta.*cpu"):
            call()


def test_bad_mode_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="'clip'"):
        st.checked_index(torch.arange(3), torch.tensor([0]), mode="clamp")


def test_modes_into_an_empty_dimension() -> None:
    x = torch.zeros(0, 2)
    with pytest.raises(IndexError, match="empty dimension"):
        st.checked_index(x, torch.tensor([0]), mode="clip")
    out = st.checked_index(x, torch.tensor([0, 3]), mode="fill", fill_value=7.0)
    assert torch.equal(out, torch.full((2, 2), 7.0))
    out = st.index_select(x, 0, torch.tensor([1]), mode="fill", fill_value=7.0)
    assert torch.equal(out, torch.full((1, 2), 7.0))


def test_fill_defaults_follow_jax() -> None:
    idx = torch.tensor([5])
    assert st.checked_index(torch.zeros(2), idx, mode="fill").isnan().all()
    assert st.checked_index(torch.zeros(2, dtype=torch.int32), idx, mode="fill").item() == -(2**31)
    assert st.checked_index(torch.zeros(2, dtype=torch.uint8), idx, mode="fill").item() == 255
    assert st.checked_index(torch.zeros(2, dtype=torch.bool), idx, mode="fill").item() is True


# --- deferred -------------------------------------------------------------------------------


def test_deferred_raises_later_with_call_site() -> None:
    st.clear_deferred()
    x = torch.arange(5.0)
    out = st.checked_index(x, torch.tensor([1, 7, 9]), mode="deferred")  # line A
    line_a = sys._getframe().f_lineno - 1
    assert torch.equal(out, torch.tensor([1.0, 0.0, 0.0]))  # out-of-range read as index 0
    st.index_select(x, 0, torch.tensor([8]), mode="deferred")  # a later violation
    with pytest.raises(st.IndexOutOfBoundsError) as info:
        st.raise_deferred()
    msg = str(info.value)
    assert msg.startswith("index 7 is out of bounds for dimension 0 with size 5")
    assert f"test_tensor_unit.py:{line_a}" in msg
    st.raise_deferred()  # cleared: nothing left to raise


def test_deferred_valid_calls_never_raise_and_gather_records() -> None:
    st.clear_deferred()
    x = torch.arange(6.0).reshape(2, 3)
    st.gather(x, 1, torch.tensor([[0], [2]]), mode="deferred")
    st.raise_deferred()
    st.gather(x, 1, torch.tensor([[0], [3]]), mode="deferred")
    with pytest.raises(RuntimeError, match="index 3 is out of bounds for dimension 1 with size 3"):
        st.raise_deferred()


def test_clear_deferred_forgets() -> None:
    st.checked_index(torch.arange(3), torch.tensor([5]), mode="deferred")
    st.clear_deferred()
    st.raise_deferred()


def _int32_indexing() -> bool:
    try:
        torch.arange(3)[torch.tensor([0], dtype=torch.int32)]
    except IndexError:
        return False
    return True


_INT32_INDEXING = _int32_indexing()


def test_deferred_keeps_the_first_violation_across_sites_and_dtypes(monkeypatch: Any) -> None:
    # The per-(device, dim, size, site) records are cached device constants: a tiny cache
    # bound forces rebuilding them, which must not change what is recorded.
    monkeypatch.setattr(_index_checks, "_MAX_CACHED_ENTRIES", 1)
    st.clear_deferred()
    x = torch.arange(12.0).reshape(3, 4)
    st.checked_index(x, (torch.tensor([0, 2]), torch.tensor([1, 3])), mode="deferred")
    # int32 index tensors where torch's indexing takes them (torch < 2.0: int64 only)
    dtype = torch.int32 if _INT32_INDEXING else torch.int64
    rows = torch.tensor([[1, 0], [2, -1]], dtype=dtype)
    cols = torch.tensor([2, 4], dtype=dtype)  # the first violation: 4 in dimension 1
    out = st.checked_index(x, (rows, cols), mode="deferred")
    line = sys._getframe().f_lineno - 1
    assert torch.equal(out, x[rows, torch.tensor([2, 0])])  # out of range read as index 0
    st.gather(x, 1, torch.tensor([[9]]), mode="deferred")  # later, other site and size
    st.index_select(x, 0, torch.tensor([-3]), mode="deferred")
    with pytest.raises(IndexError) as info:
        st.raise_deferred()
    msg = str(info.value)
    assert msg.startswith("index 4 is out of bounds for dimension 1 with size 4")
    assert f"test_tensor_unit.py:{line}" in msg
    st.index_select(x, 0, torch.tensor([0, 5]), mode="deferred")
    with pytest.raises(IndexError, match="index 5 is out of bounds for dimension 0 with size 3"):
        st.raise_deferred()


# Ops that synchronize a CUDA host when x is on the GPU: reading a value back
# (_local_scalar_dense: item/tolist/bool), data-dependent shapes (nonzero), and turning host
# data into a tensor (lift_fresh: torch.tensor / as_tensor of Python values), which becomes a
# synchronizing copy from pageable memory onto the device.
_SYNCING_OPS = ("_local_scalar_dense", "nonzero", "is_nonzero", "lift_fresh", "equal", "item")


def _aten_ops(fn: Any) -> List[str]:
    python_dispatch = pytest.importorskip("torch.utils._python_dispatch")

    class Record(python_dispatch.TorchDispatchMode):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.ops: List[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    with Record() as rec:
        fn()
    return rec.ops


@pytest.mark.parametrize("mode", ["clip", "wrap", "fill", "deferred"])
def test_sync_free_modes_use_no_syncing_op(mode: str, index_check_always: None) -> None:
    """CPU stand-in for tests/gpu's sync-debug-mode test: no op that syncs a CUDA host."""
    st.clear_deferred()
    x = torch.randn(3, 5)
    idx = torch.tensor([[-9, 0], [2, 7]])
    gidx = torch.tensor([[0, 9], [1, 2]])
    calls = [
        lambda: st.checked_index(x, idx, mode=mode, fill_value=0.0),
        lambda: st.checked_index(x, (slice(None), idx), mode=mode),  # default fill: NaN
        lambda: st.checked_index(x, (idx, idx.abs() % 5), mode=mode, fill_value=1),
        lambda: st.index_select(x, 1, gidx[0], mode=mode, fill_value=0.0),
        lambda: st.gather(x, 1, gidx, mode=mode, fill_value=0.0),
    ]
    for call in calls:
        ops = _aten_ops(call)
        assert ops, "nothing recorded: the check would prove nothing"
        syncing = [op for op in ops if op.split(".")[1] in _SYNCING_OPS]
        assert not syncing, (mode, syncing)
    st.clear_deferred()


# --- autograd, simulated older torch --------------------------------------------------------


@pytest.mark.parametrize("mode", ["raise", "clip", "wrap", "fill", "deferred"])
def test_autograd_flows_like_torch(mode: str, index_check_always: None) -> None:
    st.clear_deferred()
    x = torch.arange(6.0, requires_grad=True)
    idx = torch.tensor([0, 2, 2])
    st.checked_index(x, idx, mode=mode, fill_value=0.0).sum().backward()
    ours = x.grad.clone()
    x.grad = None
    x[idx].sum().backward()
    assert torch.equal(ours, x.grad)


def test_list_and_numpy_int_indices(index_check_always: None) -> None:
    import numpy as np

    x = torch.arange(12).reshape(3, 4)
    assert torch.equal(st.checked_index(x, [0, -1]), x[[0, -1]])
    assert torch.equal(st.checked_index(x, (np.int64(2), 1)), x[2, 1])
    with pytest.raises(IndexError, match="index 3 is out of bounds for dimension 0 with size 3"):
        st.checked_index(x, [0, 3])
    with pytest.raises(IndexError, match="index 4 is out of bounds for dimension 1 with size 4"):
        st.checked_index(x, (1, 4))


# --- safe_copy --------------------------------------------------------------------------------


class Pair(NamedTuple):
    a: torch.Tensor
    b: Any


@dataclasses.dataclass(frozen=True)
class Snap:
    w: torch.Tensor
    step: int
    extra: list


def test_safe_copy_tensor_semantics() -> None:
    x = torch.randn(3, 4, requires_grad=True)
    y = (x * 2).t()  # non-contiguous, in the graph
    c = st.safe_copy(y)
    assert not c.requires_grad and c.grad_fn is None
    assert c.data_ptr() != y.data_ptr()
    assert c.dtype == y.dtype and c.device == y.device and c.stride() == y.stride()
    assert torch.equal(c, y)


def test_safe_copy_nested_state_dict_keeps_types_and_metadata() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2))
    sd = model.state_dict()
    snap = st.safe_copy(sd)
    assert type(snap) is collections.OrderedDict and list(snap) == list(sd)
    assert snap._metadata == sd._metadata
    for k in sd:
        assert torch.equal(snap[k], sd[k]) and snap[k].data_ptr() != sd[k].data_ptr()
    with torch.no_grad():
        model[0].weight.add_(1)
    assert not torch.equal(snap["0.weight"], model[0].weight)
    model.load_state_dict(snap)  # the snapshot restores the model


def test_safe_copy_namedtuple_dataclass_and_leaves() -> None:
    t = torch.ones(2, requires_grad=True)
    obj = {"p": Pair(t, [t, "s"]), "d": Snap(t, 3, [1, 2]), "tup": (t,)}
    out = st.safe_copy(obj)
    assert isinstance(out["p"], Pair) and isinstance(out["d"], Snap)
    assert out["p"].a.data_ptr() != t.data_ptr() and not out["d"].w.requires_grad
    assert out["d"].extra == [1, 2] and out["d"].extra is not obj["d"].extra
    assert out["p"].b[1] == "s" and isinstance(out["tup"], tuple)


# --- device helpers ---------------------------------------------------------------------------


def test_device_of_and_assert_same_device() -> None:
    lin = torch.nn.Linear(2, 2)
    assert st.device_of(lin) == torch.device("cpu")
    assert st.device_of(torch.nn.ReLU()) is None
    assert st.assert_same_device(lin, torch.zeros(1)) == torch.device("cpu")
    with pytest.raises(TypeError, match="torch.Tensor or torch.nn.Module"):
        st.device_of([torch.zeros(1)])
    meta = torch.zeros(2, 3, device="meta")
    with pytest.raises(st.DeviceMismatchError) as info:
        st.assert_same_device(lin, meta)
    assert "arg 0 (Linear) on cpu" in str(info.value)
    assert "arg 1 (Tensor[2, 3]) on meta" in str(info.value)
    mixed = torch.nn.Sequential(torch.nn.Linear(1, 1), torch.nn.Linear(1, 1).to("meta"))
    with pytest.raises(st.DeviceMismatchError, match="several devices"):
        st.device_of(mixed)


def test_to_device_recurses_and_moves_objects() -> None:
    class Batch:
        def __init__(self) -> None:
            self.moved_to: Any = None

        def to(self, device: Any) -> "Batch":
            self.moved_to = device
            return self

    batch = {"x": torch.zeros(2), "p": Pair(torch.ones(1), "id"), "b": Batch(), "n": 3}
    out = st.to_device(batch, "meta")
    assert out["x"].device.type == "meta" and out["p"].a.device.type == "meta"
    assert isinstance(out["p"], Pair) and out["p"].b == "id" and out["n"] == 3
    assert out["b"].moved_to == torch.device("meta")
    assert batch["x"].device.type == "cpu"  # the input is not modified


def test_to_device_non_blocking_only_from_pinned(monkeypatch: Any) -> None:
    seen = []
    real_to = torch.Tensor.to

    def spy(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        seen.append(kwargs.get("non_blocking"))
        return real_to(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "to", spy)
    st.to_device([torch.zeros(1)], "meta")
    st.to_device([torch.zeros(1)], "meta", non_blocking=True)
    assert seen == [False, True]  # unpinned source: synchronous unless forced
