"""Each patch family against torch's own behaviour."""

from __future__ import annotations

import collections
import io
import os
import pickle
import warnings
from dataclasses import dataclass
from typing import Any, List

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.data._utils.pin_memory as torch_pin
from hypothesis import given, settings
from hypothesis import strategies as hs
from torch.utils.data import DataLoader

import safetorch as st
from safetorch import _compat
from safetorch.patching import _registry

# torch 2.0-2.x warn "TypedStorage is deprecated" (once per process) from inside torch.load;
# st.load hides it, a raw torch.load in a test must tolerate it.
_TYPED_STORAGE = "TypedStorage is deprecated"


def _kinds(patch: str) -> List[str]:
    return [e.kind for e in _registry.report_entries() if e.patch == patch]


# --- upsample ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name, kwargs",
    [
        ("upsample", {"scale_factor": 2}),
        ("upsample", {"size": (5, 7), "mode": "bilinear"}),
        ("upsample", {"scale_factor": 1.5, "mode": "bicubic", "align_corners": True}),
        ("upsample_nearest", {"size": 9}),
        ("upsample_bilinear", {"scale_factor": 3}),
    ],
)
def test_upsample_is_bit_identical_and_silent(name: str, kwargs: Any) -> None:
    x = torch.randn(2, 3, 4, 6, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = getattr(F, name)(x, **kwargs)
    (g_expected,) = torch.autograd.grad(expected.sum(), x)
    with st.patched("upsample"), warnings.catch_warnings():
        warnings.simplefilter("error")  # the deprecation warning would raise here
        got = getattr(F, name)(x, **kwargs)
    (g_got,) = torch.autograd.grad(got.sum(), x)
    assert torch.equal(got, expected) and torch.equal(g_got, g_expected)
    assert _kinds("upsample") == [f"F.{name} -> st.{name}"]


def test_upsample_positional_arguments() -> None:
    x = torch.randn(1, 1, 3, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = F.upsample(x, None, 2, "bilinear", True)
    with st.patched("upsample"):
        assert torch.equal(F.upsample(x, None, 2, "bilinear", True), expected)


# --- load ----------------------------------------------------------------------------------
def _saved(obj: Any) -> io.BytesIO:
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return buf


def test_load_plain_checkpoint_matches_torch(tmp_path) -> None:
    obj = {"w": torch.randn(3, 2), "step": 7, "nested": [torch.ones(2)]}
    path = tmp_path / "c.pt"
    torch.save(obj, path)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", _TYPED_STORAGE, UserWarning)
        expected = torch.load(path, weights_only=True)
    with st.patched("load"):
        for got in (torch.load(path), torch.load(str(path), None), torch.load(_saved(obj))):
            assert got.keys() == expected.keys() and got["step"] == 7
            assert torch.equal(got["w"], expected["w"])
            assert torch.equal(got["nested"][0], expected["nested"][0])
    assert "torch.load -> st.load" in _kinds("load")


class _Evil:
    def __reduce__(self) -> Any:
        return (os.system, ("echo pwned",))


def test_load_defaults_to_weights_only_and_refuses_code(simulate_torch) -> None:
    buf = _saved({"x": _Evil()})
    with st.patched("load"), pytest.raises(pickle.UnpicklingError) as info:
        torch.load(buf)
    assert isinstance(info.value, st.UnsafeCheckpointError)
    assert "os.system" in str(info.value) or "posix.system" in str(info.value)
    # On a torch whose own default is a full unpickle the patch says what it changed.
    with simulate_torch(LOAD_WEIGHTS_ONLY_DEFAULT_TRUE=False), st.patched("load"):
        torch.load(_saved({"a": torch.zeros(1)}))
    assert "weights_only=True (this torch defaults to False)" in _kinds("load")


def test_load_explicit_weights_only_false_reaches_torch() -> None:
    with st.patched("load"):
        got = torch.load(_saved({"n": [1, 2]}), weights_only=False)
    assert got == {"n": [1, 2]}
    assert "torch.load -> st.load" not in _kinds("load")


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="needs a machine without CUDA (the failure being fixed)"
)
def test_load_maps_cuda_tensors_to_cpu_without_cuda(tmp_path, monkeypatch) -> None:
    # Write a real checkpoint whose storages say "cuda:0", as one saved on a GPU does.
    path = tmp_path / "gpu.pt"
    with monkeypatch.context() as m:
        m.setattr(torch.serialization, "location_tag", lambda storage: "cuda:0")
        torch.save({"w": torch.arange(4.0)}, path)
    # torch's own failure: a RuntimeError, which 1.13's weights_only loader wraps in a
    # pickle.UnpicklingError ("Weights only load failed ... WeightsUnpickler error: ...").
    with (
        warnings.catch_warnings(),
        pytest.raises(
            (RuntimeError, pickle.UnpicklingError), match="deserialize object on a CUDA device"
        ),
    ):
        warnings.filterwarnings("ignore", _TYPED_STORAGE, UserWarning)
        torch.load(path, weights_only=True)
    with st.patched("load"):
        got = torch.load(path)
        # torch.load's own signature: mmap= exists from torch 2.1.
        got2 = torch.load(path, None, None, **({"mmap": False} if _compat.LOAD_HAS_MMAP else {}))
    assert got["w"].device.type == "cpu" and torch.equal(got["w"], torch.arange(4.0))
    assert torch.equal(got2["w"], got["w"])
    assert "CUDA tensors mapped to CPU (no CUDA here)" in _kinds("load")
    # An explicit map_location is the caller's: not touched.
    with st.patched("load"), pytest.raises(RuntimeError):
        torch.load(path, map_location=lambda s, loc: None)


def test_load_nested_call_reaches_the_original() -> None:
    # st.load must never come back into the wrapper: counted once, loads fine.
    with st.patched("load"):
        st.load(_saved({"a": torch.ones(1)}))
        torch.load(_saved({"a": torch.ones(1)}))
    entry = [e for e in _registry.report_entries() if e.kind == "torch.load -> st.load"]
    assert entry[0].count == 1


# --- state_dict ----------------------------------------------------------------------------
class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 1)
        self.bn = nn.BatchNorm2d(3)


def test_state_dict_dataparallel_checkpoint_into_plain_model() -> None:
    torch.manual_seed(0)
    dp = nn.DataParallel(_Net())
    plain = _Net()
    with pytest.raises(RuntimeError, match="Missing key"):
        plain.load_state_dict(dp.state_dict())
    with st.patched("state_dict"):
        result = plain.load_state_dict(dp.state_dict())
    assert isinstance(result, st.LoadReport)  # what st.load_state_dict returns ...
    missing, unexpected = result  # ... and it unpacks like torch's _IncompatibleKeys
    assert missing == result.missing_keys == [] and unexpected == result.unexpected_keys == []
    for k, v in dp.module.state_dict().items():
        assert torch.equal(plain.state_dict()[k], v)
    (entry,) = [e for e in _registry.report_entries() if e.patch == "state_dict"]
    assert "module." in entry.kind and "st.load_state_dict" in entry.kind
    assert "7 loaded" in entry.detail


def test_state_dict_patch_equals_st_load_state_dict_on_averaged_model() -> None:
    """An AveragedModel checkpoint into a plain model: n_averaged reported, not unexpected."""
    from torch.optim.swa_utils import AveragedModel

    torch.manual_seed(0)
    swa = AveragedModel(_Net())
    sd = swa.state_dict()
    assert "n_averaged" in sd
    expected = st.load_state_dict(_Net(), sd)
    with st.patched("state_dict"):
        result = _Net().load_state_dict(sd)
    assert result == expected and result.n_averaged == expected.n_averaged == 0
    assert (result.loaded, result.rule) == (expected.loaded, expected.rule)


def test_state_dict_patch_refuses_like_st_before_touching_the_model() -> None:
    sd = {f"module.{k}": v for k, v in _Net().state_dict().items()}
    sd["module.conv.weight"] = torch.zeros(9, 9)
    net = _Net()
    before = {k: v.clone() for k, v in net.state_dict().items()}
    with st.patched("state_dict"):
        with pytest.raises(st.CheckpointMismatchError, match="conv.weight"):
            net.load_state_dict(sd)
        with pytest.warns(st.CheckpointWarning, match="unloaded"):
            report = net.load_state_dict(sd, strict=False)  # torch would raise; st skips, says
    assert [k for k, _, _ in report.mismatched] == ["conv.weight"]
    assert torch.equal(net.state_dict()["conv.weight"], before["conv.weight"])


def test_state_dict_matching_keys_take_torchs_path_untouched(monkeypatch) -> None:
    from safetorch.checkpoint import keys

    def boom(*a: Any, **k: Any) -> Any:
        raise AssertionError("remap must not run when keys match")

    monkeypatch.setattr(keys, "remap_state_dict", boom)
    src, dst = _Net(), _Net()
    sd = src.state_dict()
    with st.patched("state_dict"):
        result = dst.load_state_dict(sd)
        partial = dst.load_state_dict({"conv.weight": sd["conv.weight"]}, strict=False)
    assert str(result) == "<All keys matched successfully>"
    expected = _Net().load_state_dict({"conv.weight": sd["conv.weight"]}, strict=False)
    assert partial == expected
    assert _registry.report_entries() == []


def test_state_dict_strict_false_returns_torchs_incompatible_keys() -> None:
    compiled_like = {f"_orig_mod.{k}": v for k, v in _Net().state_dict().items()}
    compiled_like["_orig_mod.extra.weight"] = torch.zeros(1)
    with st.patched("state_dict"):
        result = _Net().load_state_dict(compiled_like, strict=False)
    assert result.missing_keys == [] and result.unexpected_keys == ["_orig_mod.extra.weight"]


# --- index ---------------------------------------------------------------------------------
def test_index_cpu_fast_path_calls_torch_only(monkeypatch) -> None:
    import safetorch.tensor as tensor_mod

    def boom(*a: Any, **k: Any) -> Any:
        raise AssertionError("CPU must not reach safetorch's checks")

    for name in ("checked_index", "index_select", "gather"):
        # `st.<name>` binds on first access (safetorch.__getattr__): bind it to the real
        # function before the module attribute is replaced, and patch the binding too, so that
        # no first access inside this test keeps `boom` after monkeypatch undoes the rest.
        monkeypatch.setattr(st, name, boom)
        monkeypatch.setattr(tensor_mod, name, boom)
    x = torch.arange(12).reshape(3, 4)
    i = torch.tensor([2, 0])
    with st.patched("index"):
        assert torch.equal(x[i], x.__getitem__(i))
        assert torch.equal(x.index_select(1, i), torch.index_select(x, 1, i))
        assert torch.equal(x.gather(1, i.expand(3, 2)), torch.gather(x, 1, i.expand(3, 2)))
        with pytest.raises(IndexError):
            x[torch.tensor([3])]  # torch's own CPU error
    assert _registry.report_entries() == []


@settings(max_examples=60)
@given(
    n=hs.integers(1, 6),
    idx=hs.lists(hs.integers(-8, 8), min_size=0, max_size=5),
)
def test_index_checked_path_matches_cpu_torch(n: int, idx: List[int]) -> None:
    x = torch.arange(n * 2).reshape(n, 2)
    index = torch.tensor(idx, dtype=torch.long)
    previous = st.set_index_check("always")  # the CUDA path, on CPU tensors
    try:
        for op in (
            lambda: x[index],
            lambda: x.index_select(0, index),
            lambda: torch.index_select(x, 0, index),
            lambda: x.gather(0, index.clamp(max=n + 3).reshape(-1, 1).expand(-1, 2)),
            lambda: torch.gather(x, dim=0, index=index.reshape(-1, 1).expand(-1, 2)),
        ):
            try:
                expected: Any = op()
            except (IndexError, RuntimeError) as exc:
                expected = type(exc)
            with st.patched("index"):
                try:
                    got: Any = op()
                except (IndexError, RuntimeError) as exc:
                    assert isinstance(expected, type) and isinstance(exc, expected)
                    assert isinstance(exc, st.IndexOutOfBoundsError)
                    continue
            assert not isinstance(expected, type), "torch raised, the patched call did not"
            assert torch.equal(got, expected)
    finally:
        st.set_index_check(previous)


def test_index_checked_path_is_counted(index_check_always) -> None:
    x = torch.arange(6)
    with st.patched("index"):
        x[torch.tensor([1])]
        x.index_select(0, torch.tensor([1]))
        torch.gather(x, 0, torch.tensor([1]))
        buf = torch.empty(1, dtype=torch.long)
        torch.index_select(x, 0, torch.tensor([1]), out=buf)  # out=: torch's own call
    assert sorted(_kinds("index")) == [
        "torch.gather -> st.gather (cpu)",
        "x.index_select -> st.index_select (cpu)",
        "x[index] -> st.checked_index (cpu)",
    ]
    assert int(buf) == 1


# --- pin_memory ----------------------------------------------------------------------------
@dataclass
class _Batch:
    x: torch.Tensor
    y: torch.Tensor


def _collate(samples: Any) -> _Batch:
    return _Batch(torch.stack([s for s in samples]), torch.stack([s * 2 for s in samples]))


@pytest.mark.skipif(st.accelerator_available(), reason="checks the no-accelerator behaviour")
def test_pin_memory_without_accelerator_is_silent_and_unchanged() -> None:
    data = [torch.full((2,), float(i)) for i in range(5)]
    loader = DataLoader(data, batch_size=2, collate_fn=_collate, pin_memory=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        expected = list(loader)
    # torch itself turns pinning off here; from 2.7 it also warns on every iterator.
    messages = [str(w.message) for w in caught]
    if _compat.TORCH_RELEASE >= (2, 7):  # pytorch/pytorch#131858
        assert len(messages) == 1 and "no accelerator is found" in messages[0]
    else:
        assert messages == []
    with st.patched("pin_memory"), warnings.catch_warnings():
        warnings.simplefilter("error")
        got = list(loader)
    assert loader.pin_memory is True  # the loader itself is never modified
    assert [torch.equal(a.x, b.x) and torch.equal(a.y, b.y) for a, b in zip(got, expected)] == [
        True
    ] * 3
    assert _kinds("pin_memory") == ["DataLoader(pin_memory=True) without accelerator"]


def test_pin_memory_a_loader_that_does_not_pin_reaches_torch_untouched(monkeypatch) -> None:
    # The fast path (no pin_memory): torch's iterator gets the loader object itself, and
    # st.data's view is never asked for.
    import safetorch.data

    def refuse(loader: Any) -> Any:
        raise AssertionError("loader_to_iterate called for a loader that does not pin")

    monkeypatch.setattr(safetorch.data, "loader_to_iterate", refuse)
    data = [torch.full((2,), float(i)) for i in range(5)]
    loader = DataLoader(data, batch_size=2, collate_fn=_collate)
    expected = list(loader)
    with st.patched("pin_memory"):
        it = iter(loader)
        got = list(it)
    assert it._dataset is loader.dataset and it._pin_memory is False
    assert [torch.equal(a.x, b.x) and torch.equal(a.y, b.y) for a, b in zip(got, expected)] == [
        True
    ] * 3
    assert _kinds("pin_memory") == []


def test_pin_memory_routes_to_st_pin(monkeypatch) -> None:
    import safetorch.data as data_mod

    seen: List[Any] = []
    monkeypatch.setattr(data_mod, "pin", lambda obj, device=None: seen.append(obj) or obj)
    batch = _Batch(torch.zeros(1), torch.ones(1))
    with st.patched("pin_memory"):
        assert torch_pin.pin_memory(batch, None) is batch
    assert seen == [batch]
    assert _kinds("pin_memory") == ["DataLoader pinning -> st.data.pin"]


# --- syncbn --------------------------------------------------------------------------------
def test_syncbn_routes_to_st_convert_and_keeps_bn_without_group() -> None:
    model = nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4))
    original = vars(nn.SyncBatchNorm)["convert_sync_batchnorm"]
    with st.patched("syncbn"):
        out = nn.SyncBatchNorm.convert_sync_batchnorm(model)
        direct = st.convert_sync_batchnorm(nn.Sequential(nn.BatchNorm2d(4)))
    assert out is model and type(out[1]) is nn.BatchNorm2d
    assert type(direct[0]) is nn.BatchNorm2d
    assert vars(nn.SyncBatchNorm)["convert_sync_batchnorm"] is original
    assert _kinds("syncbn") == [
        "convert_sync_batchnorm -> st.convert_sync_batchnorm (no process group: BatchNorm kept)"
    ]
    # Unpatched, torch converts (and its layer falls back to plain BN on CPU).
    assert type(nn.SyncBatchNorm.convert_sync_batchnorm(model)[1]) is nn.SyncBatchNorm


@pytest.mark.parametrize(
    "data",
    [b"<html><body>404 Not Found</body></html>", b"\x80\x04\x95"],
    ids=["an HTML page saved as .pt", "truncated pickle"],
)
def test_patched_load_raises_what_torch_raises_for_a_non_checkpoint(tmp_path, data) -> None:
    """torch.load raises pickle.UnpicklingError for an HTML page downloaded in place of a
    checkpoint ("invalid load key, '<'") or a truncated pickle; under the patch the same
    `except` clause still catches the error."""
    path = tmp_path / "junk.pt"
    path.write_bytes(data)
    with pytest.raises(pickle.UnpicklingError), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's "Detected pickle protocol 4" note
        torch.load(path, weights_only=True)  # side by side: torch itself
    with st.patched("load"), pytest.raises(pickle.UnpicklingError) as info:
        torch.load(path)
    assert isinstance(info.value, st.CheckpointError) and str(path) in str(info.value)


def test_patched_load_refusal_starts_with_torchs_words(tmp_path) -> None:
    """A refusal under the patch begins as torch.load(weights_only=True)'s does ("Weights only
    load failed."), so code that matches torch's text keeps working; safetorch's own account
    (what was refused, every way out) follows."""
    path = tmp_path / "evil.pt"
    torch.save({"ns": collections.OrderedDict, "f": print}, path)
    with pytest.raises(pickle.UnpicklingError) as plain:
        torch.load(path, weights_only=True)
    assert str(plain.value).startswith("Weights only load failed.")
    with st.patched("load"), pytest.raises(st.UnsafeCheckpointError) as info:
        torch.load(path)
    text = str(info.value)
    assert text.startswith("Weights only load failed.") and "builtins.print" in text
    assert text.count("Weights only load failed.") == 1
    with pytest.raises(st.UnsafeCheckpointError) as direct:  # st.load keeps its own first line
        st.load(path)
    assert not str(direct.value).startswith("Weights only")
