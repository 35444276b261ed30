"""st.load_state_dict from multi-file layouts: DCP directories, shard indexes, library dirs."""

from __future__ import annotations

import json
import os
import pickle
import warnings

import pytest
import torch

import safetorch as st
from safetorch import _compat
from safetorch.checkpoint import _dcp, _layouts, _resolve

needs_dcp = pytest.mark.skipif(
    not _compat.HAS_DCP, reason="torch.distributed.checkpoint is public from torch 2.0"
)

safetensors_torch = pytest.importorskip("safetensors.torch")


def _net(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 2))
    with torch.no_grad():
        for p in net.state_dict().values():
            if p.is_floating_point():
                p.copy_(torch.randn_like(p))
    return net


SRC = _net(0)
DP = torch.nn.DataParallel(SRC).state_dict()  # "module."-prefixed keys


def _assert_loaded(path, **kwargs):
    model = _net(1)
    report = st.load_state_dict(model, path, **kwargs)
    assert report.ok, report
    for k, v in SRC.state_dict().items():
        assert torch.equal(model.state_dict()[k], v), k
    return report


def _dcp_save(state, path):
    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "assuming the intent is to save in a single process"
        if _compat.DCP_HAS_SAVE_LOAD:  # 2.2's dcp.save takes no checkpoint_id=
            dcp.save(state, checkpoint_id=str(path))
        else:
            dcp.save_state_dict(state, storage_writer=dcp.FileSystemWriter(str(path)), no_dist=True)


@needs_dcp
@pytest.mark.parametrize("container", [None, "model"])
def test_dcp_directory_with_dataparallel_keys_into_plain_model(tmp_path, container):
    state = DP if container is None else {container: DP, "epoch": 3, "note": "x"}
    _dcp_save(state, tmp_path / "dcp")
    report = _assert_loaded(tmp_path / "dcp")
    assert "DCP" in report.source and report.source_key == container
    assert "module." in report.rule


@needs_dcp
def test_dcp_metadata_is_read_with_the_restricted_unpickler(tmp_path, canary):
    _dcp_save(DP, tmp_path / "dcp")

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {canary}",))

    with open(tmp_path / "dcp" / ".metadata", "wb") as fh:
        pickle.dump(Evil(), fh)
    with pytest.raises(st.UnsafeCheckpointError, match="metadata"):
        st.load_state_dict(_net(1), tmp_path / "dcp")
    assert not os.path.exists(canary)


def _shard(tmp_path, kind):
    keys = list(DP)
    half = len(keys) // 2
    ext = "safetensors" if kind == "safetensors" else "bin"
    stem = "model" if kind == "safetensors" else "pytorch_model"
    names = [f"{stem}-0000{i}-of-00002.{ext}" for i in (1, 2)]
    parts = [keys[:half], keys[half:]]
    for name, part in zip(names, parts):
        sd = {k: DP[k].contiguous() for k in part}
        if kind == "safetensors":
            safetensors_torch.save_file(sd, str(tmp_path / name))
        else:
            torch.save(sd, tmp_path / name)
    weight_map = {k: names[0] if k in parts[0] else names[1] for k in keys}
    index = tmp_path / f"{stem}.{ext}.index.json"
    index.write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return index


@pytest.mark.parametrize("kind", ["safetensors", "bin"])
def test_sharded_index_and_its_directory(tmp_path, kind):
    index = _shard(tmp_path, kind)
    assert "index" in _assert_loaded(index).source
    assert os.path.basename(str(index)) in _assert_loaded(tmp_path).source


def test_transformers_checkpoint_directory_picks_the_model_file(tmp_path):
    run = tmp_path / "checkpoint-500"
    run.mkdir()
    safetensors_torch.save_file(
        {k: v.contiguous() for k, v in DP.items()}, str(run / "model.safetensors")
    )
    torch.save({"state": {}}, run / "optimizer.pt")
    torch.save({"x": 1}, run / "scheduler.pt")
    (run / "trainer_state.json").write_text("{}")
    report = _assert_loaded(run)
    assert "model.safetensors" in report.source


def test_accelerate_save_state_directory(tmp_path):
    torch.save(DP, tmp_path / "pytorch_model.bin")
    torch.save({"x": 1}, tmp_path / "optimizer.bin")
    with open(tmp_path / "random_states_0.pkl", "wb") as fh:
        pickle.dump({"python": 1}, fh)  # never read: not model weights
    assert "pytorch_model.bin" in _assert_loaded(tmp_path).source


def test_directory_errors_name_the_way_out(tmp_path):
    with pytest.raises(st.CheckpointError, match="no model weights"):
        st.load_state_dict(_net(1), tmp_path)
    torch.save(DP, tmp_path / "a.pt")
    torch.save(DP, tmp_path / "b.pt")
    with pytest.raises(st.CheckpointError, match="several weight files"):
        st.load_state_dict(_net(1), tmp_path)
    with pytest.raises(st.CheckpointError, match="st.load_state_dict"):
        st.load(tmp_path)


def test_index_cannot_point_outside_its_directory_or_to_missing_shards(tmp_path):
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {"0.weight": "../outside.safetensors"}}))
    with pytest.raises(st.CheckpointError, match="outside the checkpoint directory"):
        st.load_state_dict(_net(1), index)
    index.write_text(json.dumps({"weight_map": {"0.weight": "gone.safetensors"}}))
    with pytest.raises(FileNotFoundError, match="missing shard"):
        st.load_state_dict(_net(1), index)
    index.write_text("not json")
    with pytest.raises(st.CheckpointError, match="weight_map"):
        st.load_state_dict(_net(1), index)


@needs_dcp
def test_strict_mismatch_on_a_layout_touches_nothing(tmp_path):
    _dcp_save({"model": DP}, tmp_path / "dcp")
    model = torch.nn.Sequential(
        torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 3)
    )
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(st.CheckpointMismatchError):
        st.load_state_dict(model, tmp_path / "dcp")
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    with pytest.warns(st.CheckpointWarning, match="unloaded"):
        report = st.load_state_dict(model, tmp_path / "dcp", strict=False)
    assert [m[0] for m in report.mismatched] == ["2.weight", "2.bias"]
    assert torch.equal(model[0].weight, SRC[0].weight)


def test_nest_flat_keys():
    t = torch.zeros(1)
    assert _dcp.nest_flat_keys({"a.b": t, "c": t}) == {"a.b": t, "c": t}
    assert _dcp.nest_flat_keys({"model.0.w": t, "epoch": "<bytes>"}) == {
        "model": {"0.w": t},
        "epoch": "<bytes>",
    }


@needs_dcp
def test_dcp_directory_on_a_torch_without_dcp_says_so(tmp_path, simulate_torch):
    _dcp_save({"model": DP}, tmp_path / "dcp")
    with simulate_torch(HAS_DCP=False):
        with pytest.raises(st.CheckpointError, match="needs torch >= 2.0"):
            st.load_state_dict(_net(1), tmp_path / "dcp")


# --- every layout honours assign= and load hooks, as Module.load_state_dict does ----------------
def _write_layout(kind, tmp_path):
    """The same weights (SRC) as each layout; returns the path st.load_state_dict is given."""
    sd = {k: v.clone() for k, v in SRC.state_dict().items()}
    if kind == "file":
        torch.save(sd, tmp_path / "w.pt")
        return tmp_path / "w.pt"
    if kind == "file in dir":
        (tmp_path / "d").mkdir()
        torch.save(sd, tmp_path / "d" / "pytorch_model.bin")
        return tmp_path / "d"
    if kind == "safetensors in dir":
        (tmp_path / "d").mkdir()
        safetensors_torch.save_file(sd, str(tmp_path / "d" / "model.safetensors"))
        return tmp_path / "d"
    if kind in ("safetensors index", "bin index"):
        keys = sorted(sd)
        halves = {"a": keys[: len(keys) // 2], "b": keys[len(keys) // 2 :]}
        weight_map = {}
        for name, part in halves.items():
            shard = {k: sd[k] for k in part}
            if kind == "safetensors index":
                fname = f"model-{name}.safetensors"
                safetensors_torch.save_file(shard, str(tmp_path / fname))
            else:
                fname = f"pytorch_model-{name}.bin"
                torch.save(shard, tmp_path / fname)
            weight_map.update({k: fname for k in part})
        index = tmp_path / ("model.safetensors.index.json" if "safe" in kind else "x.index.json")
        index.write_text(json.dumps({"weight_map": weight_map}))
        return index
    assert kind == "dcp"
    _dcp_save(sd, tmp_path / "dcp")
    return tmp_path / "dcp"


_LAYOUT_KINDS = ["file", "file in dir", "safetensors in dir", "safetensors index", "bin index"]
_LAYOUT_KINDS += [pytest.param("dcp", marks=needs_dcp)]


@pytest.mark.parametrize("kind", _LAYOUT_KINDS)
def test_every_layout_honours_load_hooks_like_torch(tmp_path, kind):
    path = _write_layout(kind, tmp_path)
    seen = {"ours": [], "torch": []}

    def build(who):
        model = _net(1)

        def pre_hook(state_dict, prefix, *args):  # a module that rescales its weight on load
            key = prefix + "weight"
            if key in state_dict:
                seen[who].append(key)
                state_dict[key] = state_dict[key] * 2

        model[0]._register_load_state_dict_pre_hook(pre_hook)
        return model

    ours, theirs = build("ours"), build("torch")
    report = st.load_state_dict(ours, path)
    theirs.load_state_dict({k: v.clone() for k, v in SRC.state_dict().items()})
    assert report.ok, report
    assert seen["ours"] == seen["torch"] == ["0.weight"]
    for k, v in theirs.state_dict().items():
        assert torch.equal(ours.state_dict()[k], v), k
    assert torch.equal(ours[0].weight, SRC[0].weight * 2)


@pytest.mark.parametrize("kind", _LAYOUT_KINDS)
@pytest.mark.skipif(
    not _compat.LOAD_STATE_DICT_HAS_ASSIGN, reason="Module.load_state_dict(assign=) is torch 2.1+"
)
def test_every_layout_honours_assign_like_torch(tmp_path, kind):
    path = _write_layout(kind, tmp_path)
    ours, theirs = _net(1), _net(1)
    before = {k: v for k, v in ours.state_dict(keep_vars=True).items()}
    report = st.load_state_dict(ours, path, assign=True)
    theirs.load_state_dict({k: v.clone() for k, v in SRC.state_dict().items()}, assign=True)
    assert report.ok, report
    after = ours.state_dict(keep_vars=True)
    for k, v in theirs.state_dict(keep_vars=True).items():
        assert torch.equal(after[k], v), k
        assert type(after[k]) is type(v), k  # Parameters stay Parameters, buffers tensors
        # assign=True puts the loaded tensors in place of the model's own, as torch does
        assert after[k] is not before[k], k


@pytest.mark.parametrize("kind", _LAYOUT_KINDS)
def test_every_layout_reports_what_a_load_hook_consumed_like_torch(tmp_path, kind):
    """torch is the final word on every layout: a key a load hook takes away is missing in
    the report (strict=False) or refused (strict=True), as Module.load_state_dict says."""
    path = _write_layout(kind, tmp_path)

    def build():
        model = _net(1)

        def pre_hook(state_dict, prefix, *args):  # a module that drops its bias on load
            state_dict.pop(prefix + "bias", None)

        model[2]._register_load_state_dict_pre_hook(pre_hook)
        return model

    theirs = build().load_state_dict(
        {k: v.clone() for k, v in SRC.state_dict().items()}, strict=False
    )
    assert theirs.missing_keys == ["2.bias"]
    with pytest.warns(st.errors.CheckpointWarning, match="2.bias"):
        report = st.load_state_dict(build(), path, strict=False)
    assert report.missing == theirs.missing_keys and "2.bias" not in report.loaded
    with pytest.raises(st.CheckpointMismatchError, match="2.bias"):
        st.load_state_dict(build(), path)


_ASSIGN = [None]
_ASSIGN += [
    pytest.param(
        True,
        marks=pytest.mark.skipif(
            not _compat.LOAD_STATE_DICT_HAS_ASSIGN,
            reason="Module.load_state_dict(assign=) is torch 2.1+",
        ),
    )
]


@pytest.mark.parametrize("assign", _ASSIGN)
def test_one_file_is_a_layout_like_the_others(tmp_path, assign):
    """resolve() of one torch.save file gives a FileLayout with the whole Layout interface:
    a meta view (no tensor data unless assign= keeps the values), reads by dotted key, batches
    and load_into through the apply stage."""
    from safetorch.checkpoint._apply import Destination

    path = tmp_path / "ckpt.pt"
    torch.save(
        {"state_dict": {k: v.clone() for k, v in SRC.state_dict().items()}, "epoch": 3}, path
    )
    layout = _resolve.resolve(path)
    assert isinstance(layout, _layouts.FileLayout) and not layout.picked
    layout.open(assign)
    try:
        view = layout.meta_view()
        assert view["epoch"] == 3
        # meta (no data) where torchfile's pass covers the file; values where assign= keeps
        # them, or where this torch's files are read whole
        covered = layout._tfile is not None
        assert view["state_dict"]["0.weight"].is_meta is covered
        assert not (assign and covered)
        got = layout.read(["state_dict.0.weight", "epoch"])
        assert torch.equal(got["state_dict.0.weight"], SRC[0].weight) and got["epoch"] == 3
        pairs = [(k, "state_dict." + k) for k in SRC.state_dict()]
        batches = list(layout.batches(pairs))
        assert {k for b in batches for k in b} == set(SRC.state_dict())
        model = _net(1)
        dest = Destination(model, SRC.state_dict(), assign)
        layout.load_into(pairs, dest)
        assert dest.result().missing_keys == [] and dest.result().unexpected_keys == []
        for k, v in SRC.state_dict().items():
            assert torch.equal(model.state_dict()[k], v), k
        with pytest.raises(st.CheckpointError, match="no entry 'state_dict.nope'"):
            layout.read(["state_dict.nope"])
    finally:
        layout.close()


@pytest.mark.parametrize("kind", ["save", "save_state"])
def test_a_checkpointsaver_directory_resolves_to_the_checkpoint_it_stands_for(tmp_path, kind):
    """st.load_state_dict(model, saver_dir) loads what CheckpointSaver.resume (or its index)
    names, as `safetorch ckpt` reads such a directory; the report says which file."""
    saver = st.CheckpointSaver(tmp_path / "run")
    for epoch in (1, 2):  # the newest one is what loads
        net = _net(10 + epoch)
        if kind == "save":
            saver.save(net.state_dict(), epoch=epoch, metric=float(epoch))
        else:
            saver.save_state(epoch=epoch, metric=float(epoch), model=net)
    layout = _resolve.resolve(tmp_path / "run")
    assert isinstance(layout, _layouts.FileLayout) and layout.picked
    model = _net(1)
    report = st.load_state_dict(model, tmp_path / "run")
    assert report.ok, report
    assert ("last.pt" if kind == "save" else "state-000002.pt") in report.source
    for k, v in _net(12).state_dict().items():
        assert torch.equal(model.state_dict()[k], v), k


def test_a_checkpointsaver_index_with_nothing_complete_says_so(tmp_path):
    (tmp_path / "checkpoints.json").write_text(json.dumps({"last": None}))
    with pytest.raises(st.CheckpointError, match="holds no complete checkpoint yet"):
        st.load_state_dict(_net(1), tmp_path)
    # other weights beside such an index still load
    torch.save(SRC.state_dict(), tmp_path / "model.pt")
    _assert_loaded(tmp_path)
