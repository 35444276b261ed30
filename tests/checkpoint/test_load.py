"""st.load: weights-only on every torch branch, refusals, corrupt files, mmap, safetensors."""

from __future__ import annotations

import argparse
import builtins
import io
import os
import pickle
import random
import subprocess
import sys
import warnings

import pytest
import torch

import safetorch as st
from safetorch import _compat
from safetorch.checkpoint import _scan, _unpickler
from safetorch.checkpoint import loading as ckpt_io

# Which st.load branch runs: the installed torch (>= 2.6: torch's own weights-only unpickler
# for files that need nothing beyond torch's allow-list and opcodes, safetorch's restricted
# unpickler otherwise), torch 1.13-2.5 (always safetorch's restricted unpickler driving torch's
# format readers) and torch 1.13 (the same, no mmap/assign).
# Branches only turn flags off: a feature the installed torch lacks cannot be simulated.
BRANCHES = {
    "installed": {},
    "torch_1.13_to_2.5": {"LOAD_WEIGHTS_ONLY_DEFAULT_TRUE": False},
    "torch_1.13": {
        "LOAD_WEIGHTS_ONLY_DEFAULT_TRUE": False,
        "LOAD_HAS_MMAP": False,
        "LOAD_STATE_DICT_HAS_ASSIGN": False,
    },
}
FORMATS = {
    "zip": {},
    "zip_protocol4": {"pickle_protocol": 4},  # STACK_GLOBAL instead of GLOBAL
    "legacy": {"_use_new_zipfile_serialization": False},
}

pytestmark = pytest.mark.filterwarnings("ignore:Detected pickle protocol 4")
# torch 2.0-2.x warn from inside torch.load itself, once per process; tests that call
# torch.load directly (not through st.load, which hides it) carry this mark.
torch_load_warns = pytest.mark.filterwarnings("ignore:TypedStorage is deprecated:UserWarning")


class TrainConfig:
    """A user class stored in a checkpoint (needs allow=)."""

    def __init__(self, lr: float) -> None:
        self.lr = lr


def _save(obj, path, fmt):
    torch.save(obj, path, **FORMATS[fmt])
    return path


@pytest.mark.parametrize("branch", BRANCHES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_roundtrip_every_branch(tmp_path, simulate_torch, branch, fmt, monkeypatch):
    net = torch.nn.BatchNorm1d(3)
    ckpt = {
        "state_dict": net.state_dict(),
        "args": argparse.Namespace(lr=0.1, name="run"),  # allowed by default
        "epoch": 3,
        "misc": {"set": {1, 2}, "bytes": b"x", "tuple": (1.5, None), "dtype": torch.float16},
    }
    path = _save(ckpt, tmp_path / "c.pt", fmt)
    # argparse.Namespace is in safetorch's allow-list, not torch's: the restricted unpickler
    # loads this file on every branch.
    expect_restricted = True
    calls = []
    real = _unpickler.make_restricted_pickle_module
    monkeypatch.setattr(
        _unpickler, "make_restricted_pickle_module", lambda e: calls.append(1) or real(e)
    )
    with simulate_torch(**BRANCHES[branch]):
        out = st.load(path)
    assert out["args"] == ckpt["args"] and out["misc"] == ckpt["misc"] and out["epoch"] == 3
    for k, v in ckpt["state_dict"].items():
        assert torch.equal(out["state_dict"][k], v)
        assert out["state_dict"][k].device.type == "cpu"
    assert bool(calls) == expect_restricted


@pytest.mark.parametrize("branch", BRANCHES)
@pytest.mark.parametrize("as_string", [False, True])
def test_allow_extends_the_allow_list(tmp_path, simulate_torch, branch, as_string):
    path = _save({"cfg": TrainConfig(0.5), "w": torch.ones(1)}, tmp_path / "c.pt", "zip")
    with simulate_torch(**BRANCHES[branch]):
        with pytest.raises(st.UnsafeCheckpointError) as info:
            st.load(path)
        name = f"{TrainConfig.__module__}.TrainConfig"
        assert info.value.unsafe_globals == (name,)
        assert f"allow=[{name!r}]" in str(info.value)
        allow = [name] if as_string else [TrainConfig]
        assert st.load(path, allow=allow)["cfg"].lr == 0.5


# --- malicious pickles -----------------------------------------------------------------------
class _Reduce:
    def __init__(self, fn, args):
        self.fn, self.args = fn, args

    def __reduce__(self):
        return self.fn, self.args


class _CallableReduce(_Reduce):
    def __call__(self, *a):  # pickle insists the reduce callable be callable
        raise AssertionError("never called at save time")


def _payloads(canary: str):
    touch = f"open({canary!r}, 'w').close()"
    return {
        "os.system": (_Reduce(os.system, (f"touch {canary}",)), {"posix.system", "os.system"}),
        "subprocess": (
            _Reduce(subprocess.run, (["touch", canary],)),
            {"subprocess.run"},
        ),
        "eval": (_Reduce(builtins.eval, (touch,)), {"builtins.eval"}),
        "exec": (_Reduce(builtins.exec, (touch,)), {"builtins.exec"}),
        # __import__('os') -> getattr(..., 'system') -> call: REDUCE on a computed callable
        "__import__": (
            _Reduce(
                _CallableReduce(
                    builtins.getattr, (_Reduce(builtins.__import__, ("os",)), "system")
                ),
                (f"touch {canary}",),
            ),
            {"builtins.getattr", "builtins.__import__"},
        ),
    }


def _nested(payload):
    sd = torch.nn.Linear(2, 2).state_dict()
    sd["evil"] = payload  # nested inside a state dict inside a container
    return {"state_dict": sd, "epoch": 1}


@torch_load_warns
@pytest.mark.parametrize("kind", ["os.system", "subprocess", "eval", "exec", "__import__"])
def test_payloads_are_real(tmp_path, canary, kind):
    """Loaded without protection, each payload does create the canary (so the tests can fail)."""
    payload, _ = _payloads(canary)[kind]
    path = _save(_nested(payload), tmp_path / "evil.pt", "zip")
    torch.load(path, weights_only=False)
    assert os.path.exists(canary)


@pytest.mark.parametrize("branch", BRANCHES)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("kind", ["os.system", "subprocess", "eval", "exec", "__import__"])
def test_malicious_refused_and_nothing_runs(tmp_path, simulate_torch, canary, branch, fmt, kind):
    payloads = _payloads(canary)
    payload, expected = payloads[kind]
    # a second payload elsewhere in the file: the error lists every unsafe global
    obj = _nested(payload)
    obj["other"] = [payloads["eval"][0]]
    path = _save(obj, tmp_path / "evil.pt", fmt)
    with simulate_torch(**BRANCHES[branch]):
        with pytest.raises(pickle.UnpicklingError) as info:
            st.load(path)
    err = info.value
    assert isinstance(err, st.UnsafeCheckpointError)
    found = set(err.unsafe_globals)
    assert found & expected and "builtins.eval" in found, found
    assert "Nothing from the file was executed" in str(err)
    # a callable that can run code is never suggested for allow=: the way out is full trust
    assert "allow=[" not in str(err) and "--allow" not in str(err)
    assert "safetorch trust" in str(err) and "st.trust(path)" in str(err)
    assert not os.path.exists(canary)


@pytest.mark.parametrize("branch", BRANCHES)
def test_raw_pickle_stack_global(tmp_path, simulate_torch, canary, branch):
    """A bare pickle (no torch.save framing) with STACK_GLOBAL, memoized strings, REDUCE."""
    path = tmp_path / "raw.pt"
    with open(path, "wb") as fh:
        pickle.dump(_Reduce(os.system, (f"touch {canary}",)), fh, protocol=4)
    with simulate_torch(**BRANCHES[branch]):
        with pytest.raises(st.UnsafeCheckpointError) as info:
            st.load(path)
    assert set(info.value.unsafe_globals) & {"posix.system", "os.system"}
    assert not os.path.exists(canary)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("kind", ["os.system", "eval", "__import__"])
def test_restricted_loader_itself_refuses(tmp_path, canary, fmt, kind):
    """The restricted load (not only the static scan in front of it) refuses every payload."""
    payload, expected = _payloads(canary)[kind]
    path = _save(_nested(payload), tmp_path / "evil.pt", fmt)
    extra = _unpickler.resolve_allowed(_unpickler.DEFAULT_EXTRA_ALLOWED)
    with pytest.raises(pickle.UnpicklingError) as info:
        ckpt_io._load_restricted(str(path), "cpu", False, extra, "utf-8")
    assert _unpickler.is_refused_global(info.value), info.value
    assert info.value.name in expected | {"builtins.getattr", "builtins.__import__"}
    assert not os.path.exists(canary)
    # and it loads what it may: tensors, containers, the default-allowed Namespace
    good = _save({"w": torch.arange(3.0), "args": argparse.Namespace(a=1)}, tmp_path / "ok.pt", fmt)
    out = ckpt_io._load_restricted(str(good), "cpu", False, extra, "utf-8")
    assert torch.equal(out["w"], torch.arange(3.0)) and out["args"].a == 1


def test_plain_state_dict_defers_to_torch_where_torch_is_as_strict(
    tmp_path, simulate_torch, monkeypatch
):
    """torch >= 2.6: a file within torch's allow-list goes to torch's own weights-only loader;
    simulated older torch always uses safetorch's restricted unpickler."""
    path = _save(torch.nn.Linear(2, 2).state_dict(), tmp_path / "sd.pt", "zip")
    calls = []
    real = _unpickler.make_restricted_pickle_module
    monkeypatch.setattr(
        _unpickler, "make_restricted_pickle_module", lambda e: calls.append(1) or real(e)
    )
    st.load(path)
    assert bool(calls) is not _compat.LOAD_WEIGHTS_ONLY_DEFAULT_TRUE
    calls.clear()
    with simulate_torch(**BRANCHES["torch_1.13_to_2.5"]):
        st.load(path)
    assert calls


@torch_load_warns
def test_honours_pickle_module_flag_matches_torch(tmp_path):
    """Behaviour probe: torch.load(pickle_module=M, weights_only=False) unpickles with M iff
    torch >= 2.0 (1.13.x uses plain pickle there): why safetorch drives torch's format readers
    itself rather than pass its unpickler as torch.load's pickle_module."""
    used = []

    class Unpickler(pickle.Unpickler):
        def find_class(self, module, name):
            used.append(f"{module}.{name}")
            return super().find_class(module, name)

    spy = type(pickle)("spy_pickle")
    spy.Unpickler = Unpickler
    spy.load = pickle.load
    path = _save({"w": torch.ones(1)}, tmp_path / "c.pt", "zip")
    torch.load(path, pickle_module=spy, weights_only=False)
    assert bool(used) is (_compat.TORCH_RELEASE >= (2, 0))


@pytest.mark.skipif(
    not hasattr(torch.serialization, "get_unsafe_globals_in_checkpoint"),
    reason="torch.serialization.get_unsafe_globals_in_checkpoint needs torch 2.6",
)
def test_scan_matches_torch_where_torch_can_scan(tmp_path, canary):
    payload, _ = _payloads(canary)["__import__"]
    path = _save(_nested(payload), tmp_path / "evil.pt", "zip")
    names, complete = _scan.scan_globals(path)
    ours = set(_unpickler.unsafe_globals(names, {}))
    assert complete
    assert ours == set(torch.serialization.get_unsafe_globals_in_checkpoint(path))


def test_weights_only_false_warns_once_and_loads(tmp_path):
    path = _save({"cfg": TrainConfig(1.0)}, tmp_path / "c.pt", "zip")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = st.load(path, weights_only=False)
    assert out["cfg"].lr == 1.0
    assert [w.category for w in caught] == [st.CheckpointWarning]
    assert caught[0].filename == __file__  # points at the caller
    assert "trust" in str(caught[0].message)


# --- corrupt files -----------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["zip", "legacy"])
def test_truncation_at_20_random_offsets(tmp_path, fmt):
    good = _save(
        {"state_dict": torch.nn.Linear(8, 8).state_dict(), "epoch": 2}, tmp_path / "g.pt", fmt
    )
    data = good.read_bytes()
    rng = random.Random(1234)
    offsets = sorted(rng.sample(range(len(data)), 20))
    for offset in offsets:
        bad = tmp_path / f"t{offset}.pt"
        bad.write_bytes(data[:offset])
        with pytest.raises(st.CheckpointError) as info:
            st.load(bad)
        msg = str(info.value)
        assert str(bad) in msg, msg
        assert not isinstance(info.value, st.UnsafeCheckpointError), msg
        assert any(w in msg for w in ("empty", "truncated", "corrupt", "damaged")), msg


@pytest.mark.parametrize(
    "content,expected",
    [
        (b"", "the file is empty"),
        (b"hello world, not a checkpoint", "not a PyTorch checkpoint"),
        (b"\x89HDF\r\n\x1a\n" + b"\0" * 40, "not a PyTorch checkpoint"),
    ],
)
def test_not_a_checkpoint(tmp_path, content, expected):
    path = tmp_path / "x.pt"
    path.write_bytes(content)
    with pytest.raises(st.CheckpointError, match=expected):
        st.load(path)


def test_warning_turned_error_inside_torch_propagates(tmp_path, monkeypatch):
    """A warning the caller turned into an error (-W error) is theirs: it propagates unchanged
    instead of becoming a CheckpointError."""
    path = _save({"w": torch.ones(2)}, tmp_path / "c.pt", "zip")
    error = UserWarning("raised by -W error")

    def fail(*args, **kwargs):
        raise error

    monkeypatch.setattr(ckpt_io, "_torch_load", fail)
    monkeypatch.setattr(ckpt_io, "_load_restricted", fail)
    with pytest.raises(UserWarning) as info:
        st.load(path)
    assert info.value is error


@pytest.mark.parametrize("error", [ValueError("bad size"), MemoryError(), KeyError("x")])
def test_raw_errors_from_rebuilding_become_checkpoint_errors(tmp_path, monkeypatch, error):
    path = _save({"w": torch.ones(2)}, tmp_path / "c.pt", "zip")

    def fail(*args, **kwargs):
        raise error

    monkeypatch.setattr(ckpt_io, "_torch_load", fail)
    monkeypatch.setattr(ckpt_io, "_load_restricted", fail)
    with pytest.raises(st.CheckpointError) as info:
        st.load(path)
    assert str(path) in str(info.value) and info.value.__cause__ is error


def test_damaged_zip_member_is_named(tmp_path):
    good = _save({"w": torch.arange(64.0)}, tmp_path / "g.pt", "zip")
    data = bytearray(good.read_bytes())
    pkl = data.find(b"data.pkl")
    at = data.find(b"\x80\x02", pkl)  # PROTO 2: the start of data.pkl's content
    data[at + 2] = 0xFF  # not an opcode: every unpickler fails, and the member's CRC is wrong
    bad = tmp_path / "bad.pt"
    bad.write_bytes(bytes(data))
    with pytest.raises(st.CheckpointError, match="the zip archive is damaged"):
        st.load(bad)


@pytest.mark.skipif(
    not hasattr(torch.storage, "_set_always_warn_typed_storage_removal"),
    reason="torch < 2.0 has no TypedStorage deprecation warning",
)
def test_torch_internal_typed_storage_warning_is_hidden(tmp_path):
    """torch 2.1 warns "TypedStorage is deprecated" inside torch.load (once per process): st.load
    and st.save_checkpoint hide it without using up the user's one warning."""
    once = torch.storage._warn_typed_storage_removal
    saved = once.__dict__.get("has_warned")
    paths = {fmt: _save({"w": torch.ones(2)}, tmp_path / f"{fmt}.pt", fmt) for fmt in FORMATS}
    once.__dict__["has_warned"] = False
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            # torch's own unpickler capability note, left visible by st.load (not a deprecation)
            warnings.filterwarnings("ignore", "Detected pickle protocol 4")
            st.save_checkpoint({"w": torch.ones(2)}, tmp_path / "c.pt")
            for path in [*paths.values(), tmp_path / "c.pt"]:
                assert torch.equal(st.load(path)["w"], torch.ones(2))
                assert torch.equal(st.load(path, allow=[TrainConfig])["w"], torch.ones(2))
        assert once.__dict__["has_warned"] is False  # the user still gets torch's warning
        with pytest.warns(UserWarning, match="TypedStorage is deprecated"):
            torch.ones(1).storage()
    finally:
        if saved is None:
            once.__dict__.pop("has_warned", None)
        else:
            once.__dict__["has_warned"] = saved


def test_zip_without_data_pkl(tmp_path):
    import zipfile

    path = tmp_path / "x.pt"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("readme.txt", "hi")
    with pytest.raises(st.CheckpointError, match="without data.pkl"):
        st.load(path)


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist") as info:
        st.load(tmp_path / "nope.pt")
    assert isinstance(info.value, st.CheckpointError)


# --- mmap, map_location, file objects -------------------------------------------------------
def _spy_torch_load(monkeypatch):
    calls = []
    real = ckpt_io._torch_load

    def spy(f, **kwargs):
        calls.append(dict(kwargs, f=f))
        return real(f, **kwargs)

    monkeypatch.setattr(ckpt_io, "_torch_load", spy)
    return calls


@pytest.mark.skipif(not _compat.LOAD_HAS_MMAP, reason="torch.load(mmap=) needs torch 2.1")
def test_mmap_only_when_asked(tmp_path, monkeypatch):
    path = _save(torch.nn.Linear(2, 2).state_dict(), tmp_path / "c.pt", "zip")  # a pathlib.Path
    calls = _spy_torch_load(monkeypatch)
    st.load(path)
    assert all("mmap" not in c for c in calls)
    st.load(path, mmap=True)
    if calls:  # the torch path: torch 2.1-2.5 map only a str path (isinstance(f, str))
        assert calls[-1].get("mmap") is True and type(calls[-1]["f"]) is str


@pytest.mark.skipif(not _compat.LOAD_HAS_MMAP, reason="torch.load(mmap=) needs torch 2.1")
@pytest.mark.parametrize("branch", ["installed", "torch_1.13_to_2.5"])
def test_returned_tensors_survive_a_rewrite_of_the_file(tmp_path, simulate_torch, branch):
    """st.load reads into memory by default: a later torch.save over the same path (a new best
    checkpoint) or a truncation does not change, or crash on, the tensors already returned."""
    path = tmp_path / "best.pt"
    torch.save({"w": torch.ones(1000)}, path)
    with simulate_torch(**BRANCHES[branch]):
        best = st.load(path)
        mapped = st.load(path, mmap=True)
    assert torch.equal(mapped["w"], torch.ones(1000))
    del mapped
    torch.save({"w": torch.zeros(1000)}, path)
    assert torch.equal(best["w"], torch.ones(1000))
    with open(path, "r+b") as fh:
        fh.truncate(10)
    assert float(best["w"].sum()) == 1000.0


def _deflate(src, dst):
    import zipfile

    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as zout:
        for info in zin.infolist():
            zout.writestr(info.filename, zin.read(info.filename))
    return dst


@pytest.mark.parametrize("branch", ["installed", "torch_1.13_to_2.5"])
def test_deflated_storages_are_never_mapped(tmp_path, simulate_torch, branch):
    """A checkpoint re-zipped with DEFLATE: mapping it would return compressed bytes as tensor
    values; st.load reads it (with a warning when mmap=True was asked) and returns the values."""
    src = _save({"w": torch.arange(1000.0)}, tmp_path / "src.pt", "zip")
    path = _deflate(src, tmp_path / "deflated.pt")
    sd = {"weight": torch.full((1, 1), 3.0), "bias": torch.zeros(1)}
    sd_path = _deflate(_save(sd, tmp_path / "sd.pt", "zip"), tmp_path / "sd_deflated.pt")
    model = torch.nn.Linear(1, 1)
    with simulate_torch(**BRANCHES[branch]):
        assert torch.equal(st.load(path)["w"], torch.arange(1000.0))
        if _compat.LOAD_HAS_MMAP:
            with pytest.warns(st.SafetorchWarning, match="compressed"):
                out = st.load(path, mmap=True)
            assert torch.equal(out["w"], torch.arange(1000.0))
        st.load_state_dict(model, sd_path)
    assert model.weight.detach().item() == 3.0


def test_no_mmap_on_torch_before_2_1_or_file_objects(tmp_path, monkeypatch, simulate_torch):
    """mmap=True maps only a zip file given by path on torch >= 2.1; elsewhere it reads."""
    path = _save({"w": torch.ones(1)}, tmp_path / "c.pt", "zip")
    used = []
    real_restricted = ckpt_io._load_restricted
    # every zip load, with safetorch's unpickler or (torch >= 2.6) torch's, goes through it
    monkeypatch.setattr(
        ckpt_io,
        "_load_restricted",
        lambda f, ml, use_mmap, *a, **k: (
            used.append(use_mmap) or real_restricted(f, ml, use_mmap, *a, **k)
        ),
    )
    with simulate_torch(LOAD_HAS_MMAP=False):
        assert torch.equal(st.load(path, mmap=True)["w"], torch.ones(1))
    with open(path, "rb") as fh:
        st.load(fh, mmap=True)
    st.load(io.BytesIO(path.read_bytes()), mmap=True)
    assert used == [False, False, False]
    if _compat.LOAD_HAS_MMAP:
        st.load(path, mmap=True)
        assert used[-1] is True


def test_patched_torch_load_does_not_recurse(tmp_path, monkeypatch):
    path = _save({"w": torch.ones(1)}, tmp_path / "c.pt", "zip")
    monkeypatch.setattr(torch, "load", lambda f, **kw: st.load(f))
    assert torch.equal(torch.load(path)["w"], torch.ones(1))


# --- safetensors -------------------------------------------------------------------------------
def test_safetensors_file(tmp_path):
    safetensors_torch = pytest.importorskip("safetensors.torch")
    sd = {"a.weight": torch.randn(2, 3), "a.bias": torch.zeros(2)}
    path = tmp_path / "m.safetensors"
    safetensors_torch.save_file(sd, str(path))
    out = st.load(path)
    assert out.keys() == sd.keys() and all(torch.equal(out[k], sd[k]) for k in sd)
    with open(path, "rb") as fh:  # sniffed from the header without the extension
        assert torch.equal(st.load(fh)["a.weight"], sd["a.weight"])


def test_safetensors_missing_package_says_how_to_install(tmp_path, monkeypatch):
    path = tmp_path / "m.safetensors"
    path.write_bytes(b"\x02\x00\x00\x00\x00\x00\x00\x00{}")
    monkeypatch.setitem(sys.modules, "safetensors", None)
    monkeypatch.setitem(sys.modules, "safetensors.torch", None)
    with pytest.raises(st.CheckpointError, match=r"pip install 'safetorch\[safetensors\]'"):
        st.load(path)


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="needs a machine without CUDA (the failure being fixed)"
)
def test_map_location_available_loads_cuda_checkpoints_on_cpu(tmp_path, monkeypatch):
    """st.load(map_location="available"): what the load patch does for torch.load(f) (one
    implementation); torch's default raises on the same file."""
    path = tmp_path / "gpu.pt"
    with monkeypatch.context() as m:
        m.setattr(torch.serialization, "location_tag", lambda storage: "cuda:0")
        torch.save({"w": torch.arange(4.0), "n": 3}, path)
    with pytest.raises(st.CheckpointError, match="CUDA"):
        st.load(path, map_location=None)  # torch's placement: the CUDA device it was saved on
    got = st.load(path, map_location="available")
    assert got["w"].device.type == "cpu" and torch.equal(got["w"], torch.arange(4.0))
    where = st.checkpoint.MapToAvailable()
    assert torch.equal(st.load(path, map_location=where)["w"], got["w"]) and where.mapped == 1
    # a CPU-saved file is untouched by it
    torch.save({"w": torch.ones(2)}, tmp_path / "cpu.pt")
    where = st.checkpoint.MapToAvailable()
    assert st.load(tmp_path / "cpu.pt", map_location=where)["w"].device.type == "cpu"
    assert where.mapped == 0


# --- a storage longer than its zip record ------------------------------------------------------
@pytest.mark.parametrize("how", ["path", "mmap", "file object", "torch below 2.6"])
def test_a_storage_longer_than_its_record_is_refused_on_every_path(
    tmp_path, how, simulate_torch, ckpt_dirs
):
    """Storage sizes are checked against their zip records on every st.load path: read or
    mapped, safetorch's unpickler or torch's. torch's reader checks this only from late 2025
    (pytorch#165553) and never when mapping, where it reads the bytes after the record."""
    _dirs = ckpt_dirs
    path = tmp_path / "short.pt"
    torch.save({"w": torch.arange(64.0), "b": torch.ones(8)}, path)
    assert _dirs.truncate_storage_record(str(path))
    try:  # side by side: what this torch does with the same file
        torch.load(path, weights_only=True)
        torch_outcome = "loaded"
    except Exception:
        torch_outcome = "raised"
    assert torch_outcome in ("loaded", "raised")
    if how == "mmap" and not _compat.LOAD_HAS_MMAP:
        pytest.skip("torch.load(mmap=True) needs torch >= 2.1")
    branch = {"LOAD_WEIGHTS_ONLY_DEFAULT_TRUE": False} if how == "torch below 2.6" else {}
    with simulate_torch(**branch), pytest.raises(st.CheckpointError) as info:
        if how == "mmap":
            st.load(path, mmap=True)
        elif how == "file object":
            with open(path, "rb") as fh:
                st.load(fh)
        else:
            st.load(path)
    text = str(info.value)
    assert "claims 256 bytes but its zip record holds 128" in text and "short.pt" in text
