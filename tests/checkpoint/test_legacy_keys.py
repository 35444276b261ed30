"""Old checkpoints into new modules: keys that older torch releases wrote, side by side with
torch's own ``Module.load_state_dict`` (with the ``_metadata`` versions as those releases
wrote them, and without any), through ``st.load_state_dict`` and the patched
``load_state_dict``."""

from __future__ import annotations

import collections
import warnings
from typing import Any, Dict, Optional

import pytest
import torch
from torch import nn

import safetorch as st
from safetorch.checkpoint._legacy_keys import legacy_keys
from safetorch.checkpoint.report import PatchedLoadReport
from safetorch.patching import _registry as registry
from safetorch.patching import _report as report


@pytest.fixture(autouse=True)
def _no_patches() -> Any:
    registry.reset()
    report.reset_counts()
    yield
    registry.reset()
    report.reset_counts()


class StyleNet(nn.Module):
    """A style-transfer block as 0.3-era code built it: InstanceNorm between convolutions."""

    def __init__(self, track: bool = False) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.in1 = nn.InstanceNorm2d(4, affine=True, track_running_stats=track)
        self.bn = nn.BatchNorm2d(4)


def _randomized(model: nn.Module, seed: int) -> nn.Module:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for v in model.state_dict(keep_vars=True).values():
            if v.is_floating_point():
                v.copy_(torch.rand(v.shape, generator=g) + 0.5)
            else:
                v.fill_(int(torch.randint(1, 9, (), generator=g)))
    return model


def _plain(sd: Dict[str, torch.Tensor]) -> "collections.OrderedDict[str, torch.Tensor]":
    """The same entries without ``_metadata``: a checkpoint of torch < 0.4, or safetensors."""
    return collections.OrderedDict(sd.items())


def _versioned(sd: Any, versions: Dict[str, Optional[int]]) -> Any:
    """``sd`` with its modules' ``_metadata`` versions set (None: the entry has no version)."""
    out = collections.OrderedDict(sd.items())
    meta = collections.OrderedDict((k, dict(v)) for k, v in sd._metadata.items())
    for prefix, version in versions.items():
        if version is None:
            meta[prefix].pop("version", None)
        else:
            meta[prefix]["version"] = version
    out._metadata = meta  # type: ignore[attr-defined]
    return out


def _pre_0_4_style_checkpoint(seed: int = 1) -> "collections.OrderedDict[str, torch.Tensor]":
    """What torch 0.3 saved for StyleNet: InstanceNorm with running stats, no
    num_batches_tracked anywhere, no version metadata."""
    sd = _randomized(StyleNet(track=True), seed).state_dict()
    del sd["in1.num_batches_tracked"], sd["bn.num_batches_tracked"]
    return _plain(sd)


def _assert_loaded_from(model: nn.Module, sd: Any, skip: tuple = ()) -> None:
    mine = model.state_dict()
    for k, v in sd.items():
        if k in mine and k not in skip:
            assert torch.equal(mine[k], v), k


# --- InstanceNorm running stats of torch < 0.4.0 --------------------------------------------
def test_instancenorm_running_stats_of_torch_0_3_are_dropped_and_reported() -> None:
    sd = _pre_0_4_style_checkpoint()
    with pytest.raises(RuntimeError, match="Unexpected running stats buffer"):
        StyleNet().load_state_dict(sd, strict=False)  # torch refuses even with strict=False
    # torch's message says to remove the keys; that load is the reference.
    expected = StyleNet()
    fixed = _plain({k: v for k, v in sd.items() if not k.startswith("in1.running_")})
    torch_result = expected.load_state_dict(fixed)
    model = StyleNet()
    report = st.load_state_dict(model, sd)
    assert report.ok and report.missing == report.unexpected == []
    assert report.dropped == ["in1.running_mean", "in1.running_var"]
    assert report.defaulted == ["bn.num_batches_tracked"]
    assert (report.missing_keys, report.unexpected_keys) == tuple(torch_result)
    for k, v in expected.state_dict().items():
        assert torch.equal(model.state_dict()[k], v), k
    text = str(report)
    assert "dropped (keys of an older torch): in1.{running_mean, running_var}" in text
    assert "torch < 0.4.0" in text and "torch < 0.4.1" in text
    assert "2 dropped, 1 defaulted" in report.summary()


def test_instancenorm_legacy_keys_behind_a_wrapper_prefix() -> None:
    sd = collections.OrderedDict(
        (f"module.{k}", v) for k, v in _pre_0_4_style_checkpoint(2).items()
    )
    model = StyleNet()
    report = st.load_state_dict(model, sd)
    assert report.ok
    assert report.dropped == ["module.in1.running_mean", "module.in1.running_var"]
    assert "'module.'" in report.rule
    _assert_loaded_from(model, {k[len("module.") :]: v for k, v in sd.items()})


@pytest.mark.parametrize("version", [1, 2])
def test_instancenorm_running_stats_with_a_version_are_unexpected_as_in_torch(version) -> None:
    """A versioned checkpoint (torch >= 0.4) with running stats came from a module that
    tracked them: a configuration mismatch, which torch and safetorch both report."""
    sd = _versioned(_randomized(StyleNet(track=True), 3).state_dict(), {"in1": version})
    expected = StyleNet().load_state_dict(sd, strict=False)
    report = st.load_state_dict(StyleNet(), sd, strict=False)
    assert report.dropped == []
    assert sorted(report.unexpected) == sorted(expected.unexpected_keys)
    assert report.missing == expected.missing_keys == []
    with pytest.raises(RuntimeError) as plain:
        StyleNet().load_state_dict(sd)
    with pytest.raises(st.CheckpointMismatchError) as mine:
        st.load_state_dict(StyleNet(), sd)
    assert str(mine.value).startswith("Error(s) in loading state_dict for StyleNet:\n\t")
    assert "Unexpected key(s) in state_dict: " in str(plain.value)
    assert "Unexpected key(s) in state_dict: " in str(mine.value)


def test_instancenorm_stats_with_num_batches_tracked_are_not_the_old_form() -> None:
    """torch < 0.4.0 never wrote num_batches_tracked: with it, even without metadata, the
    checkpoint is of a module that tracked its stats, and nothing is dropped."""
    sd = _plain(_randomized(StyleNet(track=True), 4).state_dict())
    with pytest.raises(RuntimeError, match="Unexpected running stats buffer"):
        StyleNet().load_state_dict(sd)
    with pytest.raises(st.CheckpointMismatchError, match="Unexpected key"):
        st.load_state_dict(StyleNet(), sd)
    report = st.load_state_dict(StyleNet(), sd, strict=False)
    assert report.dropped == []
    assert report.unexpected == [
        "in1.running_mean",
        "in1.running_var",
        "in1.num_batches_tracked",
    ]


def test_only_the_exact_legacy_keys_are_tolerated() -> None:
    sd = _pre_0_4_style_checkpoint(5)
    # one running stat without its companion: not what torch 0.3 wrote
    half = _plain({k: v for k, v in sd.items() if k != "in1.running_var"})
    with pytest.raises(st.CheckpointMismatchError, match='Unexpected key.*"in1.running_mean"'):
        st.load_state_dict(StyleNet(), half)
    # an unknown key next to the legacy ones stays unexpected
    extra = _plain({**sd, "in1.running_std": torch.ones(4)})
    with pytest.raises(st.CheckpointMismatchError) as info:
        st.load_state_dict(StyleNet(), extra)
    assert info.value.report.unexpected == ["in1.running_std"]
    # running stats on a module that never had them in any release
    conv = _plain({**sd, "conv.running_mean": torch.ones(4)})
    with pytest.raises(st.CheckpointMismatchError) as info:
        st.load_state_dict(StyleNet(), conv)
    assert info.value.report.unexpected == ["conv.running_mean"]
    # a real key of the module is still required
    missing = _plain({k: v for k, v in sd.items() if k != "in1.weight"})
    with pytest.raises(st.CheckpointMismatchError) as info:
        st.load_state_dict(StyleNet(), missing)
    assert info.value.report.missing == ["in1.weight"]


def test_legacy_keys_lists_only_modules_that_have_them() -> None:
    assert legacy_keys(nn.Sequential(nn.Linear(2, 2), nn.ReLU())) == []
    found = {(k.key, k.action) for k in legacy_keys(StyleNet())}
    assert found == {
        ("in1.running_mean", "drop"),
        ("in1.running_var", "drop"),
        ("bn.num_batches_tracked", "default"),
    }
    assert {k.key for k in legacy_keys(StyleNet(track=True))} == {
        "in1.num_batches_tracked",
        "bn.num_batches_tracked",
    }


# --- BatchNorm without num_batches_tracked (torch < 0.4.1) -----------------------------------
@pytest.mark.parametrize("version", [None, 1])
def test_batchnorm_without_num_batches_tracked_loads_as_in_torch(version) -> None:
    src = _randomized(nn.Sequential(nn.Conv2d(2, 3, 1), nn.BatchNorm2d(3)), 6).state_dict()
    del src["1.num_batches_tracked"]
    sd = _versioned(src, {"1": version})
    expected = nn.Sequential(nn.Conv2d(2, 3, 1), nn.BatchNorm2d(3))
    torch_result = expected.load_state_dict(sd)  # torch keeps the module's value
    model = nn.Sequential(nn.Conv2d(2, 3, 1), nn.BatchNorm2d(3))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning: nothing was left unloaded
        report = st.load_state_dict(model, sd)
    assert report.ok and report.defaulted == ["1.num_batches_tracked"]
    assert report == torch_result  # compares like torch's result
    assert model[1].num_batches_tracked.dtype == torch.long
    assert model[1].num_batches_tracked.item() == expected[1].num_batches_tracked.item() == 0
    _assert_loaded_from(model, expected.state_dict())


def test_batchnorm_keeps_the_models_counter_like_torch() -> None:
    sd = _versioned(nn.BatchNorm1d(2).state_dict(), {"": 1})
    del sd["num_batches_tracked"]
    expected, model = nn.BatchNorm1d(2), nn.BatchNorm1d(2)
    expected.num_batches_tracked.fill_(7)
    model.num_batches_tracked.fill_(7)
    expected.load_state_dict(sd)
    assert st.load_state_dict(model, sd).defaulted == ["num_batches_tracked"]
    # what the installed torch does: newer releases keep the model's counter, older ones (2.1
    # here) reset it to 0; safetorch reports it as defaulted either way
    assert model.num_batches_tracked.item() == expected.num_batches_tracked.item()
    assert expected.num_batches_tracked.item() in (0, 7)


def test_batchnorm_of_version_2_without_counter_is_missing_as_in_torch() -> None:
    sd = nn.BatchNorm2d(3).state_dict()  # version 2, as torch >= 0.4.1 writes it
    del sd["num_batches_tracked"]
    with pytest.raises(RuntimeError) as plain:
        nn.BatchNorm2d(3).load_state_dict(sd)
    with pytest.raises(st.CheckpointMismatchError) as mine:
        st.load_state_dict(nn.BatchNorm2d(3), sd)
    assert str(mine.value).startswith(str(plain.value))
    expected = nn.BatchNorm2d(3).load_state_dict(sd, strict=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a buffer: no warning about unloaded parameters
        report = st.load_state_dict(nn.BatchNorm2d(3), sd, strict=False)
    assert report.missing == expected.missing_keys == ["num_batches_tracked"]
    assert report.defaulted == []


def test_untracked_batchnorm_has_no_counter_to_default() -> None:
    sd = _plain(nn.BatchNorm1d(2, track_running_stats=False).state_dict())
    assert legacy_keys(nn.BatchNorm1d(2, track_running_stats=False)) == []
    assert st.load_state_dict(nn.BatchNorm1d(2, track_running_stats=False), sd).ok


# --- through files: the batched torch.save reader and safetensors (no metadata) ---------------
def test_old_checkpoint_from_a_torch_save_file(tmp_path) -> None:
    sd = _pre_0_4_style_checkpoint(7)
    path = tmp_path / "old.pt"
    torch.save(sd, path)
    model = StyleNet()
    report = st.load_state_dict(model, path)
    assert report.ok and report.dropped == ["in1.running_mean", "in1.running_var"]
    assert report.defaulted == ["bn.num_batches_tracked"]
    _assert_loaded_from(model, sd)
    assert model.bn.num_batches_tracked.item() == 0


def test_old_checkpoint_from_a_safetensors_file(tmp_path) -> None:
    safetensors_torch = pytest.importorskip("safetensors.torch")
    sd = _pre_0_4_style_checkpoint(8)
    path = tmp_path / "old.safetensors"
    safetensors_torch.save_file(dict(sd), str(path))
    model = StyleNet()
    report = st.load_state_dict(model, path)
    assert report.ok and sorted(report.dropped) == ["in1.running_mean", "in1.running_var"]
    _assert_loaded_from(model, sd)


# --- weight_norm: torch.nn.utils.weight_norm keys into the parametrization --------------------
needs_weight_norm_parametrization = pytest.mark.skipif(
    not hasattr(nn.utils.parametrizations, "weight_norm"),
    reason="torch.nn.utils.parametrizations.weight_norm needs torch >= 2.1",
)


def _old_weight_norm_keys(seed: int) -> "collections.OrderedDict[str, torch.Tensor]":
    # What torch.nn.utils.weight_norm(nn.Linear(3, 2)) saves: weight_g (2, 1), weight_v.
    g = torch.Generator().manual_seed(seed)
    return collections.OrderedDict(
        [
            ("fc.bias", torch.rand(2, generator=g)),
            ("fc.weight_g", torch.rand(2, 1, generator=g) + 0.5),
            ("fc.weight_v", torch.rand(2, 3, generator=g)),
        ]
    )


def _weight_normed() -> nn.Module:
    net = nn.Module()
    net.fc = nn.utils.parametrizations.weight_norm(nn.Linear(3, 2))
    return net


@needs_weight_norm_parametrization
def test_weight_norm_g_v_load_into_the_parametrization_as_in_torch() -> None:
    sd = _old_weight_norm_keys(9)
    expected = _weight_normed()
    assert expected.load_state_dict(sd) == ([], [])  # torch's load hook renames them
    model = _weight_normed()
    report = st.load_state_dict(model, sd)
    assert report.ok
    assert "renamed keys of an older torch: 'fc.weight_g' -> " in report.rule
    assert "fc.parametrizations.weight.original0" in report.loaded
    for k, v in expected.state_dict().items():
        assert torch.equal(model.state_dict()[k], v), k
    assert torch.equal(model.fc.weight, expected.fc.weight)


@needs_weight_norm_parametrization
def test_weight_norm_g_alone_is_unexpected_as_in_torch() -> None:
    sd = _old_weight_norm_keys(10)
    del sd["fc.weight_v"]
    expected = _weight_normed().load_state_dict(sd, strict=False)
    with pytest.warns(st.CheckpointWarning, match="unloaded"):
        report = st.load_state_dict(_weight_normed(), sd, strict=False)
    assert report.unexpected == expected.unexpected_keys == ["fc.weight_g"]
    assert report.missing == expected.missing_keys


# --- torch.ao: QAT ConvBn version 1 and observers' eps --------------------------------------
def _qat_conv_bn() -> nn.Module:
    qat = pytest.importorskip("torch.ao.nn.intrinsic.qat")
    quantization = pytest.importorskip("torch.ao.quantization")
    torch.manual_seed(0)
    return qat.ConvBn2d(2, 2, 1, qconfig=quantization.get_default_qat_qconfig("fbgemm"))


def test_qat_conv_bn_version_1_loads_into_its_bn_as_in_torch() -> None:
    new = _randomized(_qat_conv_bn(), 11).state_dict()
    old = collections.OrderedDict()
    for k, v in new.items():
        for v2, v1 in (
            ("bn.weight", "gamma"),
            ("bn.bias", "beta"),
            ("bn.running_mean", "running_mean"),
            ("bn.running_var", "running_var"),
            ("bn.num_batches_tracked", "num_batches_tracked"),
        ):
            if k == v2:
                k = v1
        old[k] = v
    old._metadata = collections.OrderedDict(  # type: ignore[attr-defined]
        (p, dict(m)) for p, m in new._metadata.items() if not p.startswith("bn")
    )
    old._metadata[""]["version"] = 1  # type: ignore[attr-defined]
    expected = _qat_conv_bn()
    expected.load_state_dict(old)
    model = _qat_conv_bn()
    report = st.load_state_dict(model, old)
    assert report.ok, str(report)
    assert "'gamma' -> 'bn.weight'" in report.rule
    for k, v in expected.state_dict().items():
        assert torch.equal(model.state_dict()[k], v), k
    # version 2 with the old names: no rule applies, and torch says the same
    v2 = _versioned(old, {"": 2})
    with pytest.raises(RuntimeError, match="Unexpected key"):
        _qat_conv_bn().load_state_dict(v2)
    with pytest.raises(st.CheckpointMismatchError, match='Unexpected key.*"gamma"'):
        st.load_state_dict(_qat_conv_bn(), v2)


def test_observer_eps_of_version_1_is_defaulted_as_in_torch() -> None:
    quantization = pytest.importorskip("torch.ao.quantization")
    sd = _versioned(quantization.MinMaxObserver().state_dict(), {"": 1})
    del sd["eps"]
    expected, model = quantization.MinMaxObserver(), quantization.MinMaxObserver()
    expected.load_state_dict(sd)
    report = st.load_state_dict(model, sd)
    assert report.ok and report.defaulted == ["eps"]
    assert torch.equal(model.eps, expected.eps)


# --- the patched load_state_dict --------------------------------------------------------------
def test_patched_load_state_dict_drops_and_defaults_like_st() -> None:
    sd = _pre_0_4_style_checkpoint(12)
    expected = st.load_state_dict(StyleNet(), sd)
    model = StyleNet()
    with st.patched("state_dict"):
        result = model.load_state_dict(sd)
    assert isinstance(result, PatchedLoadReport) and result == expected
    assert str(result) == "<All keys matched successfully>"  # as torch prints a clean load
    assert result.dropped == expected.dropped and result.defaulted == expected.defaulted
    assert "dropped (keys of an older torch)" in result.describe()
    _assert_loaded_from(model, sd)
    (entry,) = [e for e in registry.report_entries() if e.patch == "state_dict"]
    assert "st.load_state_dict" in entry.kind


@pytest.mark.parametrize("version", [None, 1])
def test_patched_batchnorm_without_counter_reports_the_default(version) -> None:
    """torch's own test_load_state_dict_BC, under the patch: same values, and the report
    says the counter was defaulted."""
    bn = nn.BatchNorm2d(3)
    sd = bn.state_dict()
    del sd["num_batches_tracked"]
    sd = _versioned(sd, {"": version})
    with st.patched("state_dict"):
        result = bn.load_state_dict(sd)
    assert bn.num_batches_tracked.dtype == torch.long and bn.num_batches_tracked.item() == 0
    assert str(result) == "<All keys matched successfully>"
    assert result.defaulted == ["num_batches_tracked"]


def test_patched_partial_load_without_legacy_keys_stays_on_torchs_path() -> None:
    sd = nn.BatchNorm2d(3).state_dict()
    partial = {"weight": sd["weight"]}  # lacks more than the counter: torch's own call
    with st.patched("state_dict"):
        result = nn.BatchNorm2d(3).load_state_dict(partial, strict=False)
    assert not isinstance(result, st.LoadReport)
    assert registry.report_entries() == []
