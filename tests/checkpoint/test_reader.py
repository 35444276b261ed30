"""The one reader under every layout (safetorch/checkpoint/_reader.py), side by side with torch.

Each hostile directory is built here from real saves and edited metadata; where torch's own call
is what safetorch replaces (DCP's default planner), the same directory goes through it too.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import shutil
import struct

import pytest
import torch
from torch import nn

import safetorch as st
from safetorch import _compat
from safetorch.checkpoint import _conversions, _dcp_load, _reader, _resolve

needs_dcp = pytest.mark.skipif(not _compat.HAS_DCP, reason="DCP needs torch >= 2.0")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")


def _dcp_save(obj, path):
    import torch.distributed.checkpoint as dcp

    with _dcp_load._single_process_quiet():
        if _compat.DCP_HAS_SAVE_LOAD:  # 2.2's dcp.save takes no checkpoint_id=
            dcp.save(obj, checkpoint_id=str(path))
        else:
            dcp.save_state_dict(obj, storage_writer=dcp.FileSystemWriter(str(path)), no_dist=True)


def _edit_metadata(path, edit):
    with open(path / ".metadata", "rb") as fh:
        md = pickle.load(fh)  # our own file: trusted in the test
    edit(md)
    with open(path / ".metadata", "wb") as fh:
        pickle.dump(md, fh)


class _Payload:
    """Unpickling it writes a marker file: proof that code ran."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').write('ran')",))


class _TensorExtraState(nn.Module):
    """TransformerEngine-style: get_extra_state returns a tensor."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2, 2)

    def get_extra_state(self):
        return torch.zeros(3)

    def set_extra_state(self, state):
        self.seen = state


class _DictExtraState(nn.Module):
    def __init__(self, value=None):
        super().__init__()
        self.lin = nn.Linear(2, 2)
        self.value = value if value is not None else {"step": 0}

    def get_extra_state(self):
        return self.value

    def set_extra_state(self, state):
        self.value = state


# --- the reader itself -------------------------------------------------------------------------
def test_root_resolves_only_inside(tmp_path):
    (tmp_path / "a.bin").write_bytes(b"x")
    (tmp_path / "sub").mkdir()
    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    outside.write_bytes(b"secret")
    os.symlink(outside, tmp_path / "link.bin")
    os.symlink(tmp_path / "a.bin", tmp_path / "inner.bin")
    root = _reader.Root(tmp_path)
    assert root.resolve("a.bin", "shard") == os.path.realpath(tmp_path / "a.bin")
    assert root.resolve("inner.bin", "shard") == os.path.realpath(tmp_path / "a.bin")
    for name, why in [
        ("../x", "outside"),
        ("sub/../../x", "outside"),
        (str(outside), "absolute"),
        ("link.bin", "symlink"),
        ("", "not a file name"),
        (3, "not a file name"),
        ("a\x00b", "not a file name"),
    ]:
        with pytest.raises(st.CheckpointError, match=why):
            root.resolve(name, "shard")


def test_hf_cache_snapshot_links_into_blobs_are_followed(tmp_path):
    repo = tmp_path / "models--org--name"
    (repo / "blobs").mkdir(parents=True)
    (repo / "snapshots" / "abc").mkdir(parents=True)
    (repo / "blobs" / "1234").write_bytes(b"{}")
    os.symlink("../../blobs/1234", repo / "snapshots" / "abc" / "config.json")
    root = _reader.Root(repo / "snapshots" / "abc")
    assert root.read("config.json", "config", limit=10) == b"{}"


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs need a POSIX system")
def test_fifo_and_directory_are_refused_without_blocking(tmp_path):
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(st.CheckpointError, match="FIFO"):
        _reader.open_regular(tmp_path / "pipe", "checkpoint")
    with pytest.raises(st.CheckpointError, match="a directory"):
        _reader.open_regular(tmp_path, "checkpoint")
    with pytest.raises(FileNotFoundError):
        _reader.open_regular(tmp_path / "missing", "checkpoint")


def test_a_file_changed_after_its_check_is_refused(tmp_path):
    path = tmp_path / "shard.bin"
    path.write_bytes(b"abc")
    with _reader.open_regular(path, "shard") as f:
        ident = f.identity
    path.write_bytes(b"abcdef")
    with pytest.raises(st.CheckpointError, match="changed while"):
        _reader.open_regular(path, "shard", expect=ident)


def test_pread_refuses_records_outside_and_truncation(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"0123456789")
    with _reader.open_regular(path, "record file") as f:
        assert f.pread(3, 2) == b"234"
        with pytest.raises(st.CheckpointError, match="outside the file"):
            f.pread(5, 8)
        os.truncate(path, 4)  # truncated while open: an error, never SIGBUS
        with pytest.raises(st.CheckpointError, match="truncated"):
            f.pread(4, 5)


# --- safetensors: read through the safetensors package ----------------------------------------
def _safetensors_bytes(header, data):
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + data


_BAD_HEADERS = [
    ({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 16]}}, b"\0" * 8),
    ({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 8]}}, b"\0" * 8),
    ({"w": {"dtype": "X9", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 8),
    (
        {
            "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
            "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]},
        },
        b"\0" * 12,
    ),
    ({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 8),
    ([1, 2], b""),
    ({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 0]}}, b""),
]
_BAD_IDS = ["offsets-past-data", "shape-vs-offsets", "dtype", "overlap", "gap", "array", "shape"]


@pytest.mark.parametrize("header, data", _BAD_HEADERS, ids=_BAD_IDS)
@pytest.mark.parametrize("where", ["directory", "index", "file"])
def test_safetensors_headers_are_checked_by_safetensors_itself(tmp_path, header, data, where):
    """Side by side: the safetensors package refuses the file, and every way safetorch reads
    it (a directory, a shard index, the file itself) refuses it with the package's reason."""
    safetensors = pytest.importorskip("safetensors.torch")
    path = tmp_path / "model.safetensors"
    path.write_bytes(_safetensors_bytes(header, data))
    with pytest.raises(Exception) as theirs:  # noqa: B017 - safetensors raises its own type
        safetensors.load_file(str(path))
    if where == "index":
        source = tmp_path / "model.safetensors.index.json"
        source.write_text(json.dumps({"weight_map": {"weight": "model.safetensors"}}))
    else:
        source = tmp_path if where == "directory" else path
    model = nn.Linear(2, 2)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(st.CheckpointError) as ours:
        st.load_state_dict(model, source)
    text = " ".join(str(ours.value).split())
    assert "not a valid safetensors file" in text
    reason = " ".join(str(theirs.value).split()).split(": ", 1)[-1]
    assert reason in text  # the package's own reason
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_huge_header_length_is_refused(tmp_path):
    pytest.importorskip("safetensors")
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", 2**62) + b"{}")
    # the package's words: "HeaderTooLarge" (safetensors 0.4), "header too large" (0.8)
    with pytest.raises(st.CheckpointError, match="(?i)header ?too ?large"):
        st.load_state_dict(nn.Linear(2, 2), tmp_path)


@pytest.mark.skipif(not hasattr(torch, "uint32"), reason="torch.uint32 needs torch >= 2.3")
def test_uint32_tensor_loads_from_a_directory_as_from_a_file(tmp_path):
    pytest.importorskip("safetensors")

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("ids", torch.zeros(3, dtype=torch.uint32))

    data = torch.tensor([1, 2, 3], dtype=torch.int32).numpy().tobytes()
    header = {"ids": {"dtype": "U32", "shape": [3], "data_offsets": [0, 12]}}
    (tmp_path / "model.safetensors").write_bytes(_safetensors_bytes(header, data))
    m = M()
    assert st.load_state_dict(m, tmp_path).ok
    assert m.ids.to(torch.int64).tolist() == [1, 2, 3]


# --- shard indexes -----------------------------------------------------------------------------
def test_index_of_many_shards_is_linear(tmp_path):
    pytest.importorskip("safetensors")
    from safetensors.torch import save_file

    n = 3000
    weight_map = {}
    for i in range(n):
        name = f"s{i}.safetensors"
        save_file({f"b{i}": torch.full((1,), float(i))}, str(tmp_path / name))
        weight_map[f"b{i}"] = name
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    layout = _resolve.resolve(tmp_path)
    view = layout.meta_view()
    assert len(view) == n and len(layout._keys_of) == n
    assert layout.read(["b7"])["b7"].item() == 7.0


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs need a POSIX system")
def test_fifo_shard_and_index_do_not_hang(tmp_path):
    os.mkfifo(tmp_path / "s.safetensors")
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"weight": "s.safetensors"}})
    )
    with pytest.raises(st.CheckpointError, match="FIFO"):
        st.load_state_dict(nn.Linear(2, 2), tmp_path)
    os.remove(tmp_path / "model.safetensors.index.json")
    os.mkfifo(tmp_path / "model.safetensors.index.json")
    with pytest.raises(st.CheckpointError):
        st.load_state_dict(nn.Linear(2, 2), tmp_path / "model.safetensors.index.json")


def test_corrupt_second_shard_leaves_the_model_untouched(tmp_path):
    pytest.importorskip("safetensors")
    from safetensors.torch import save_file

    src = nn.Linear(2, 2)
    save_file({"weight": src.weight.detach().clone()}, str(tmp_path / "a.safetensors"))
    save_file({"bias": src.bias.detach().clone()}, str(tmp_path / "b.safetensors"))
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"weight": "a.safetensors", "bias": "b.safetensors"}})
    )
    with open(tmp_path / "b.safetensors", "r+b") as fh:
        fh.truncate(os.path.getsize(tmp_path / "b.safetensors") - 2)
    model = nn.Linear(2, 2)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(st.CheckpointError):
        st.load_state_dict(model, tmp_path)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_bin_shards_are_read_not_mapped(tmp_path, monkeypatch):
    src = nn.Linear(2, 2)
    torch.save({"weight": src.weight.detach()}, tmp_path / "pytorch_model-1.bin")
    torch.save({"bias": src.bias.detach()}, tmp_path / "pytorch_model-2.bin")
    (tmp_path / "pytorch_model.bin.index.json").write_text(
        json.dumps({"weight_map": {"weight": "pytorch_model-1.bin", "bias": "pytorch_model-2.bin"}})
    )

    def no_map(*a, **k):
        raise AssertionError("the file was memory-mapped")

    monkeypatch.setattr(torch.UntypedStorage, "from_file", no_map)
    model = nn.Linear(2, 2)
    assert st.load_state_dict(model, tmp_path).ok
    assert torch.equal(model.weight, src.weight)


def test_single_file_load_state_dict_is_not_mapped(tmp_path, monkeypatch):
    src = nn.Linear(2, 2)
    torch.save(src.state_dict(), tmp_path / "m.pt")

    def no_map(*a, **k):
        raise AssertionError("the file was memory-mapped")

    monkeypatch.setattr(torch.UntypedStorage, "from_file", no_map)
    model = nn.Linear(2, 2)
    assert st.load_state_dict(model, tmp_path / "m.pt").ok
    assert torch.equal(model.weight, src.weight)


# --- DCP -----------------------------------------------------------------------------------------
@needs_dcp
@pytest.mark.parametrize("container", [False, True])
def test_dcp_bytes_entry_for_a_tensor_extra_state_never_runs(tmp_path, container):
    marker = tmp_path / "marker"
    sd = dict(_TensorExtraState().state_dict())
    sd["_extra_state"] = _Payload(marker)
    _dcp_save({"model": sd, "epoch": 3} if container else sd, tmp_path / "ckpt")
    with pytest.raises(st.UnsafeCheckpointError, match="pickled objects"):
        st.load_state_dict(_TensorExtraState(), tmp_path / "ckpt")
    assert not marker.exists()
    with pytest.raises(st.CheckpointError):  # the whole-directory read (ckpt convert/inspect)
        _conversions.dcp_to_object(str(tmp_path / "ckpt"))
    assert not marker.exists()
    # Side by side: DCP's own default planner unpickles the entry with weights_only=False.
    import torch.distributed.checkpoint as dcp

    if not container and hasattr(dcp, "load"):
        target = {"_extra_state": None}
        with _dcp_load._single_process_quiet():
            try:
                dcp.load(target, checkpoint_id=str(tmp_path / "ckpt"))
            except BaseException:  # noqa: BLE001 - DCP may fail after running the payload
                pass
        assert marker.exists(), "torch's DCP default planner ran the payload"


@needs_dcp
def test_dcp_metadata_is_read_once(tmp_path, monkeypatch):
    _dcp_save(nn.Linear(2, 2).state_dict(), tmp_path / "ckpt")
    opened = []
    real_open = os.open

    def counting_open(path, *a, **k):
        if str(path).endswith(".metadata"):
            opened.append(path)
        return real_open(path, *a, **k)

    monkeypatch.setattr(os, "open", counting_open)
    real_builtin_open = open

    def counting_builtin(path, *a, **k):
        if str(path).endswith(".metadata"):
            opened.append(path)
        return real_builtin_open(path, *a, **k)

    monkeypatch.setattr("builtins.open", counting_builtin)
    assert st.load_state_dict(nn.Linear(2, 2), tmp_path / "ckpt").ok
    assert len(opened) == 1


@needs_dcp
@pytest.mark.parametrize("rel", ["../secret.distcp", "/etc/hostname", "sub/../../x"])
def test_dcp_relative_path_outside_is_refused(tmp_path, rel):
    _dcp_save(nn.Linear(2, 2).state_dict(), tmp_path / "ckpt")

    def edit(md):
        for info in md.storage_data.values():
            info.relative_path = rel

    _edit_metadata(tmp_path / "ckpt", edit)
    with pytest.raises(st.CheckpointError, match="outside|absolute"):
        st.load_state_dict(nn.Linear(2, 2), tmp_path / "ckpt")


@needs_dcp
def test_dcp_record_beyond_its_file_and_uncovered_chunks_are_refused(tmp_path):
    _dcp_save(nn.Linear(2, 2).state_dict(), tmp_path / "ckpt")
    shutil.copytree(tmp_path / "ckpt", tmp_path / "short")

    def longer(md):
        for info in md.storage_data.values():
            info.length += 10**6

    _edit_metadata(tmp_path / "short", longer)
    with pytest.raises(st.CheckpointError, match="truncated or corrupt"):
        st.load_state_dict(nn.Linear(2, 2), tmp_path / "short")

    def uncovered(md):
        md.state_dict_metadata["weight"].chunks[0].sizes = torch.Size([1, 2])

    _edit_metadata(tmp_path / "ckpt", uncovered)
    model = nn.Linear(2, 2)
    before = model.weight.detach().clone()
    with pytest.raises(st.CheckpointError, match="incomplete"):
        st.load_state_dict(model, tmp_path / "ckpt")
    assert torch.equal(model.weight, before)


@needs_dcp
@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs need a POSIX system")
@pytest.mark.parametrize("victim", [".metadata", "distcp"])
def test_dcp_fifo_does_not_hang(tmp_path, victim):
    _dcp_save(nn.Linear(2, 2).state_dict(), tmp_path / "ckpt")
    name = (
        victim
        if victim == ".metadata"
        else next(n for n in os.listdir(tmp_path / "ckpt") if n.endswith(".distcp"))
    )
    os.remove(tmp_path / "ckpt" / name)
    os.mkfifo(tmp_path / "ckpt" / name)
    with pytest.raises(st.CheckpointError, match="FIFO"):
        st.load_state_dict(nn.Linear(2, 2), tmp_path / "ckpt")


@needs_dcp
def test_dcp_planner_data_must_match_dcp_flattening(tmp_path):
    _dcp_save({"model": nn.Linear(2, 2).state_dict(), "epoch": 3}, tmp_path / "ckpt")

    def edit(md):
        md.planner_data["model.weight"] = ("elsewhere", "weight")

    _edit_metadata(tmp_path / "ckpt", edit)
    with pytest.raises(st.CheckpointError, match="planner_data"):
        _conversions.dcp_to_object(str(tmp_path / "ckpt"))


@needs_dcp
def test_dcp_dict_extra_state_loads_through_the_restricted_unpickler(tmp_path):
    src = _DictExtraState({"step": 5, "scale": torch.ones(2)})
    _dcp_save(src.state_dict(), tmp_path / "ckpt")
    model = _DictExtraState()
    assert st.load_state_dict(model, tmp_path / "ckpt").ok
    assert model.value["step"] == 5 and torch.equal(model.value["scale"], torch.ones(2))
    assert torch.equal(model.lin.weight, src.lin.weight)


@pytest.mark.parametrize("layout", ["dcp", "safetensors"])
def test_averaged_model_counter_loads_from_directories(tmp_path, layout):
    from torch.optim.swa_utils import AveragedModel

    base = nn.Linear(2, 2)
    averaged = AveragedModel(base)
    averaged.update_parameters(base)
    averaged.update_parameters(base)
    if layout == "dcp":
        if not _compat.HAS_DCP:
            pytest.skip("DCP needs torch >= 2.0")
        _dcp_save(averaged.state_dict(), tmp_path / "ckpt")
    else:
        safetensors = pytest.importorskip("safetensors.torch")
        (tmp_path / "ckpt").mkdir()
        safetensors.save_file(averaged.state_dict(), str(tmp_path / "ckpt" / "model.safetensors"))
    into_plain = nn.Linear(2, 2)
    report = st.load_state_dict(into_plain, tmp_path / "ckpt")
    assert report.ok and report.n_averaged == 2
    assert torch.equal(into_plain.weight, base.weight)
    into_averaged = AveragedModel(nn.Linear(2, 2))
    assert st.load_state_dict(into_averaged, tmp_path / "ckpt").ok
    assert int(into_averaged.n_averaged) == 2


@pytest.mark.parametrize("layout", ["file", "safetensors", "shards", "dcp"])
def test_direct_reads_bump_the_version_counter_as_copy_does(tmp_path, layout: str) -> None:
    """Bytes read straight into a parameter count as an in-place change, as torch's
    load_state_dict (``param.copy_``) counts it: backward through a graph that saved the old
    values raises instead of silently using the new ones."""
    model = torch.nn.Linear(64, 64)
    state = {k: torch.randn_like(v) for k, v in model.state_dict().items()}
    if layout == "file":
        path = tmp_path / "m.pt"
        torch.save(state, path)
    elif layout == "dcp":
        if not _compat.HAS_DCP:
            pytest.skip("DCP needs torch >= 2.0")
        path = tmp_path / "dcp"
        _conversions.save_dcp(state, str(path))
    else:
        safetensors_torch = pytest.importorskip("safetensors.torch")
        if layout == "safetensors":
            path = tmp_path / "m.safetensors"
            safetensors_torch.save_file(state, str(path))
        else:
            path = tmp_path / "shards"
            path.mkdir()
            index = {"metadata": {}, "weight_map": {}}
            for i, (k, v) in enumerate(state.items()):
                name = f"model-{i:05d}.safetensors"
                safetensors_torch.save_file({k: v}, str(path / name))
                index["weight_map"][k] = name
            (path / "model.safetensors.index.json").write_text(json.dumps(index))
    for loader in ("torch", "safetorch"):
        x = torch.randn(2, 64, requires_grad=True)
        out = (model(x) * model.weight.sum()).sum()  # saves weight for backward
        before = model.weight._version
        if loader == "torch":
            model.load_state_dict(state)
        else:
            st.load_state_dict(model, path)
        assert model.weight._version > before, loader
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            out.backward()
        assert torch.equal(model.weight.detach(), state["weight"])


@needs_dcp
def test_dcp_reads_in_place_only_where_no_load_hook_could_see_the_values(tmp_path) -> None:
    """DCP records are copied straight into plain targets; a model with a load hook gets them
    through Module.load_state_dict, so the hook sees (and may change) every value."""
    state = {k: torch.randn_like(v) for k, v in nn.Linear(8, 8).state_dict().items()}
    _conversions.save_dcp(state, str(tmp_path / "dcp"))
    plain = nn.Linear(8, 8)
    st.load_state_dict(plain, tmp_path / "dcp")
    assert torch.equal(plain.weight.detach(), state["weight"])
    hooked = nn.Linear(8, 8)
    seen = []

    def hook(sd, prefix, *args):
        seen.extend(sorted(sd))
        sd[prefix + "bias"] = sd[prefix + "bias"] + 1

    hooked._register_load_state_dict_pre_hook(hook)
    st.load_state_dict(hooked, tmp_path / "dcp")
    assert seen == ["bias", "weight"]
    assert torch.equal(hooked.bias.detach(), state["bias"] + 1)
    assert torch.equal(hooked.weight.detach(), state["weight"])


@needs_dcp
def test_dcp_lists_come_back_as_lists_and_their_indices_are_bounded(tmp_path):
    """A list (an optimizer's param_groups) comes back as a list: DCP 2.4+ flattens it with int
    path components, which reading the directory back as an object rebuilds as DCP's own
    unflattening does; up to 2.3 DCP pickles a container holding no tensor whole (one entry at
    ("optim", "param_groups"); pytorch/pytorch#125335 flattens every mapping from 2.4). A
    planner_data that puts an entry at a list index beyond what the checkpoint holds is refused
    instead of allocated, whichever of the two DCP wrote."""
    model = nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.25, momentum=0.9)
    model(torch.ones(1, 2)).sum().backward()
    opt.step()  # momentum buffers: tensors under "optim", which DCP then traverses on any torch
    _dcp_save({"optim": opt.state_dict(), "epoch": 3}, tmp_path / "ckpt")
    obj = _conversions.dcp_to_object(str(tmp_path / "ckpt"))
    groups = obj["optim"]["param_groups"]
    assert isinstance(groups, list) and groups[0]["lr"] == 0.25 and obj["epoch"] == 3
    assert torch.equal(
        obj["optim"]["state"]["0"]["momentum_buffer"], opt.state[model.weight]["momentum_buffer"]
    )
    assert groups[0]["params"] == opt.state_dict()["param_groups"][0]["params"]

    def edit(md):
        # 2.4+: ("optim", "param_groups", 0, "lr") -> ("optim", "param_groups", 10**12, "lr");
        # up to 2.3, the whole list: ("optim", "param_groups") -> (..., "param_groups", 10**12)
        keys = [k for k, p in md.planner_data.items() if tuple(p[:2]) == ("optim", "param_groups")]
        assert keys, md.planner_data
        for key in keys:
            parts = tuple(md.planner_data[key])
            moved = (*parts[:2], 10**12, *parts[3:])
            new = ".".join(map(str, moved))
            md.state_dict_metadata[new] = md.state_dict_metadata.pop(key)
            md.planner_data[new] = moved
            for index in [i for i in md.storage_data if i.fqn == key]:
                info = md.storage_data.pop(index)
                md.storage_data[dataclasses.replace(index, fqn=new)] = info

    _edit_metadata(tmp_path / "ckpt", edit)
    with pytest.raises(st.CheckpointError, match="list index 1000000000000"):
        _conversions.dcp_to_object(str(tmp_path / "ckpt"))


def test_safetensors_header_is_read_from_the_open_file_not_the_path(tmp_path):
    """The safetensors package opens files by name; safetorch gives it the descriptor the one
    reader opened and checked, so a path swapped in between names another file in vain."""
    safetensors = pytest.importorskip("safetensors.torch")
    from safetorch.checkpoint import _reader

    path = tmp_path / "model.safetensors"
    safetensors.save_file({"checked": torch.ones(2)}, str(path))
    other = tmp_path / "other.safetensors"
    safetensors.save_file({"swapped": torch.zeros(3), "extra": torch.zeros(1)}, str(other))
    with _reader.open_regular(path, "safetensors file") as f:
        os.replace(other, path)  # the path now names another file
        header = _reader.read_safetensors_header(f)
        assert list(header.entries) == ["checked"]
        assert torch.equal(header.read(f, ["checked"])["checked"], torch.ones(2))


def test_safetensors_dtype_names_are_the_packages_own():
    safetensors = pytest.importorskip("safetensors.torch")
    from safetorch.checkpoint import _reader

    codes = _reader.safetensors_codes()
    assert codes[torch.float32] == "F32" and codes[torch.bfloat16] == "BF16"
    for dtype, code in codes.items():  # each name round-trips through the package itself
        data = safetensors.save({"x": torch.empty(0, dtype=dtype)})
        assert f'"dtype":"{code}"' in data[: 8 + int.from_bytes(data[:8], "little")].decode()
