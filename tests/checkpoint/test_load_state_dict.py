"""st.load_state_dict through real wrappers, containers, prefixes, shape mismatches."""

from __future__ import annotations

import collections
import itertools

import pytest
import torch
from torch import nn

import safetorch as st
from safetorch import _compat
from safetorch.checkpoint import model_state as ckpt_io

WRAPPER_NAMES = [
    "plain",
    "dataparallel",
    "compile",
    "averaged",
    "ckpt_wrapper",
    "dp_compile",
    "compile_dp",
    "averaged_dp",
    "lightning_compiled",
]
# Zoo wrappers built with torch.compile (torch 2.0+). On older torch their cases skip and
# test_synthetic_orig_mod_keys covers ``_orig_mod.`` keys with hand-made state dicts.
NEEDS_COMPILE = frozenset({"compile", "dp_compile", "compile_dp", "lightning_compiled"})
needs_compile = pytest.mark.skipif(
    not _compat.HAS_COMPILE, reason="torch.compile (OptimizedModule) needs torch 2.0"
)


def _inner(model: nn.Module, zoo) -> nn.Module:
    inner = st.unwrap_model(model)
    if isinstance(inner, zoo.LitModule):
        inner = st.unwrap_model(inner.model)
    return inner


def _assert_same_weights(a: nn.Module, b: nn.Module) -> None:
    sa = {st.canonical_key(k): v for k, v in a.state_dict().items()}
    sb = {st.canonical_key(k): v for k, v in b.state_dict().items()}
    assert sa.keys() == sb.keys()
    for k in sa:
        torch.testing.assert_close(sa[k], sb[k], rtol=0, atol=0, msg=k)


@pytest.mark.parametrize(
    "src_name,dst_name",
    [
        pytest.param(a, b, marks=[needs_compile] if {a, b} & NEEDS_COMPILE else [])
        for a, b in itertools.product(WRAPPER_NAMES, WRAPPER_NAMES)
        # Lightning targets are covered by the prefix tests; keep the matrix fast.
        if b != "lightning_compiled" or a == "plain"
    ],
)
def test_zoo_matrix(zoo, src_name, dst_name):
    source = zoo.WRAPPERS[src_name](zoo.randomized_net(1))
    target = zoo.WRAPPERS[dst_name](zoo.randomized_net(2))
    sd = source.state_dict()
    report = st.load_state_dict(target, sd)
    assert report.ok, str(report)
    _assert_same_weights(_inner(source, zoo), _inner(target, zoo))
    # Torch's own loader rejects the same pair whenever the keys differ.
    if set(sd) != set(target.state_dict()) and src_name != "averaged" and dst_name != "averaged":
        with pytest.raises(RuntimeError, match="Missing key|Unexpected key"):
            target.load_state_dict(sd)


def test_lightning_checkpoint_into_plain_and_back(zoo):
    lit = zoo.LitModule(zoo.randomized_net(3))
    ckpt = {"state_dict": lit.state_dict(), "epoch": 4, "optimizer_states": []}
    plain = zoo.randomized_net(4)
    report = st.load_state_dict(plain, ckpt)
    assert report.ok and report.source_key == "state_dict"
    assert "stripped leading 'model.' from checkpoint keys" in report.rule
    _assert_same_weights(lit.model, plain)
    # plain checkpoint -> Lightning-style target, wrapped in DataParallel too
    target = nn.DataParallel(zoo.LitModule(zoo.randomized_net(5)))
    report = st.load_state_dict(target, plain.state_dict())
    assert report.ok and "from model keys" in report.rule
    _assert_same_weights(plain, target.module.model)


@needs_compile
def test_lightning_with_compiled_submodule_mid_key(zoo):
    lit = zoo.LitModule(torch.compile(zoo.randomized_net(6)))
    keys = list(lit.state_dict())
    assert keys[0].startswith("model._orig_mod.")
    plain = zoo.randomized_net(7)
    report = st.load_state_dict(plain, {"state_dict": lit.state_dict()})
    assert report.ok
    assert "'_orig_mod.'" in report.rule and "'model.'" in report.rule
    _assert_same_weights(lit.model._orig_mod, plain)


def _prefixed(sd, prefix):
    out = collections.OrderedDict((prefix + k, v) for k, v in sd.items())
    out._metadata = collections.OrderedDict(  # type: ignore[attr-defined]
        ((prefix + k).rstrip("."), v) for k, v in sd._metadata.items()
    )
    return out


@pytest.mark.parametrize(
    "prefix", ["_orig_mod.", "module._orig_mod.", "_orig_mod.module.", "model._orig_mod."]
)
def test_synthetic_orig_mod_keys(zoo, prefix):
    """``_orig_mod.`` keys as torch.compile (2.0+) writes them, built by hand: runs on every
    torch, so the key handling is covered where the compile zoo cases skip."""
    src = zoo.randomized_net(11)
    sd = _prefixed(src.state_dict(), prefix)
    for target in (zoo.randomized_net(12), nn.DataParallel(zoo.randomized_net(13))):
        report = st.load_state_dict(target, {"state_dict": sd})
        assert report.ok, str(report)
        assert "'_orig_mod.'" in report.rule
        if prefix.startswith("model."):
            assert "'model.'" in report.rule
        _assert_same_weights(src, st.unwrap_model(target))
        with pytest.raises(RuntimeError, match="Missing key|Unexpected key"):
            target.load_state_dict(sd)  # torch's own loader rejects the same keys
    # and the other way: a plain checkpoint into a model whose keys carry `_orig_mod.`
    holder = nn.Module()
    holder._orig_mod = zoo.randomized_net(14)  # the attribute OptimizedModule uses
    assert next(iter(holder.state_dict())).startswith("_orig_mod.")
    assert st.load_state_dict(holder, src.state_dict()).ok
    _assert_same_weights(src, holder._orig_mod)


def test_timm_ema_only_on_request(zoo):
    net, ema = zoo.randomized_net(8), zoo.randomized_net(9)
    ckpt = {"state_dict": net.state_dict(), "state_dict_ema": ema.state_dict(), "epoch": 1}
    target = zoo.randomized_net(10)
    assert st.load_state_dict(target, ckpt).source_key == "state_dict"
    _assert_same_weights(net, target)
    assert st.load_state_dict(target, ckpt, key="state_dict_ema").source_key == "state_dict_ema"
    _assert_same_weights(ema, target)
    with pytest.raises(st.CheckpointError, match="only EMA.*key='model_ema'"):
        st.load_state_dict(target, {"model_ema": ema.state_dict(), "epoch": 1})


def test_ambiguous_container_lists_candidates(zoo):
    sd = zoo.randomized_net(0).state_dict()
    with pytest.raises(st.CheckpointError, match=r"several state dicts: \['generator', 'disc'\]"):
        st.load_state_dict(zoo.Net(), {"generator": sd, "disc": sd})
    with pytest.raises(st.CheckpointError, match="key='nope' is not in the checkpoint"):
        st.load_state_dict(zoo.Net(), {"generator": sd}, key="nope")


def test_ambiguous_key_mapping_is_refused(zoo):
    sd = zoo.randomized_net(0).state_dict()
    mixed = collections.OrderedDict()
    for k, v in sd.items():
        mixed["module." + k] = v
        mixed["_orig_mod." + k] = v
    with pytest.raises(st.CheckpointError, match="ambiguous key mapping.*module.head.weight"):
        st.load_state_dict(zoo.Net(), mixed)


def test_averaged_model_counter_is_reported(zoo):
    swa = torch.optim.swa_utils.AveragedModel(zoo.randomized_net(1))
    swa.update_parameters(zoo.randomized_net(1))
    swa.update_parameters(zoo.randomized_net(2))
    report = st.load_state_dict(zoo.Net(), swa.state_dict())
    assert report.ok and report.n_averaged == 2
    assert "n_averaged: 2" in str(report)
    # plain weights into an AveragedModel: its counter keeps its value, not "missing"
    target = torch.optim.swa_utils.AveragedModel(zoo.Net())
    assert st.load_state_dict(target, zoo.randomized_net(3).state_dict()).ok


def test_shape_mismatch_strict_raises_before_touching_model(zoo):
    sd = zoo.randomized_net(1).state_dict()
    sd["head.weight"] = torch.zeros(3, 4)
    target = zoo.randomized_net(2)
    before = {k: v.clone() for k, v in target.state_dict().items()}
    with pytest.raises(st.CheckpointMismatchError) as info:
        st.load_state_dict(target, sd)
    assert isinstance(info.value, RuntimeError)
    assert info.value.report.mismatched == [("head.weight", (3, 4), (2, 4))]
    for k, v in target.state_dict().items():
        assert torch.equal(v, before[k]), k  # nothing was loaded


def test_shape_mismatch_non_strict_skips_where_torch_raises(zoo):
    sd = zoo.randomized_net(1).state_dict()
    sd["head.weight"] = torch.zeros(3, 4)
    with pytest.raises(RuntimeError, match="size mismatch"):
        zoo.Net().load_state_dict(sd, strict=False)  # torch raises even with strict=False
    target = zoo.randomized_net(2)
    old_head = target.head.weight.clone()
    with pytest.warns(st.CheckpointWarning, match="unloaded"):
        report = st.load_state_dict(target, sd, strict=False)
    assert not report.ok and report.mismatched == [("head.weight", (3, 4), (2, 4))]
    assert report.missing == [] and report.unexpected == []
    assert "head.weight" not in report.loaded
    assert torch.equal(target.head.weight, old_head)
    assert torch.equal(target.head.bias, sd["head.bias"])
    assert "mismatched: head.weight checkpoint [3, 4] vs model [2, 4]" in str(report)


def test_missing_unexpected_match_torch(zoo):
    sd = zoo.randomized_net(1).state_dict()
    del sd["head.bias"]
    sd["extra.weight"] = torch.zeros(1)
    expected = zoo.Net().load_state_dict(sd, strict=False)
    with pytest.warns(st.CheckpointWarning, match="unloaded"):
        report = st.load_state_dict(zoo.Net(), sd, strict=False)
    assert report.missing == expected.missing_keys == ["head.bias"]
    assert report.unexpected == expected.unexpected_keys == ["extra.weight"]
    with pytest.raises(st.CheckpointMismatchError, match="1 missing, 1 unexpected") as info:
        st.load_state_dict(zoo.Net(), sd)
    assert info.value.report.missing == ["head.bias"]


def test_report_groups_keys_per_module(zoo):
    report = st.load_state_dict(zoo.Net(), nn.DataParallel(zoo.Net()).state_dict())
    text = str(report)
    assert "backbone.conv1.{bias, weight}" in text
    assert "backbone.bn1.{bias, num_batches_tracked, running_mean, running_var, weight}" in text
    assert report.rule == "dropped wrapper segment(s) 'module.' from checkpoint keys"


def test_source_from_path_and_file_object(zoo, tmp_path):
    net = zoo.randomized_net(1)
    path = tmp_path / "dp.pt"
    torch.save({"model": nn.DataParallel(net).state_dict()}, path)
    target = zoo.Net()
    assert st.load_state_dict(target, path).source_key == "model"
    _assert_same_weights(net, target)
    with open(path, "rb") as fh:
        assert st.load_state_dict(zoo.Net(), fh).ok


@pytest.mark.skipif(
    not _compat.LOAD_STATE_DICT_HAS_ASSIGN, reason="Module.load_state_dict(assign=) needs torch 2.1"
)
def test_no_copies_before_final_copy(zoo):
    sd = nn.DataParallel(zoo.randomized_net(1)).state_dict()
    remapped, _ = st.remap_state_dict(sd, zoo.Net())
    for k, v in sd.items():
        assert remapped[k[len("module.") :]] is v  # same tensor objects
    target = zoo.Net()
    st.load_state_dict(target, sd, assign=True)  # assign: the model takes the tensors
    assert target.head.weight.data_ptr() == sd["module.head.weight"].data_ptr()


def test_assign_needs_torch_2_1(zoo, simulate_torch):
    with simulate_torch(LOAD_STATE_DICT_HAS_ASSIGN=False):
        with pytest.raises(TypeError, match="torch >= 2.1"):
            st.load_state_dict(zoo.Net(), zoo.Net().state_dict(), assign=True)


def test_uses_original_module_load_state_dict(zoo, monkeypatch):
    """A patched Module.load_state_dict routed to st.load_state_dict must not recurse."""

    def patched(self, state_dict, strict=True, assign=False):
        return st.load_state_dict(self, state_dict, strict=strict)

    monkeypatch.setattr(nn.Module, "load_state_dict", patched)
    report = zoo.Net().load_state_dict(nn.DataParallel(zoo.Net()).state_dict())
    assert report.ok
    assert ckpt_io._module_load_state_dict is not nn.Module.load_state_dict


def test_unwrap_model_every_wrapper(zoo):
    for name, wrap in zoo.WRAPPERS.items():
        if name in ("lightning_compiled", "ckpt_wrapper"):
            continue
        if name in NEEDS_COMPILE and not _compat.HAS_COMPILE:
            continue  # torch < 2.0: no torch.compile; OptimizedModule is tested where it exists
        wrapped = wrap(zoo.Net())
        # AveragedModel deep-copies: the user module is the one Net inside the wrappers.
        (net,) = [m for m in wrapped.modules() if isinstance(m, zoo.Net)]
        assert st.unwrap_model(wrapped) is net, name
    lit = zoo.LitModule(zoo.Net())
    assert st.unwrap_model(lit) is lit  # a user module is not a wrapper


def test_batchnorm_version_metadata_follows_renaming(zoo):
    sd = nn.DataParallel(zoo.Net()).state_dict()
    assert "module.backbone.bn1" in sd._metadata
    remapped, _ = st.remap_state_dict(sd, zoo.Net())
    assert remapped._metadata["backbone.bn1"] == sd._metadata["module.backbone.bn1"]
    assert remapped._metadata[""] == sd._metadata["module"]
