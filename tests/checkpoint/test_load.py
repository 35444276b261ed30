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
from safetorch.checkpoint import _unpickler
from safetorch.checkpoint import io as ckpt_io

# Which st.load branch runs: the installed torch (2.5+: safe_globals scoped to the call),
# torch 1.13-2.4 (torch's weights_only, restricted unpickler for extra allows), and torch
# without weights_only (safetorch's restricted unpickler on the real file).
BRANCHES = {
    "installed": {},
    "torch_1.13_to_2.4": {"HAS_SAFE_GLOBALS_CTX": False, "HAS_ADD_SAFE_GLOBALS": False},
    "torch_without_weights_only": {
        "LOAD_HAS_WEIGHTS_ONLY": False,
        "LOAD_WEIGHTS_ONLY_DEFAULT_TRUE": False,
        "HAS_SAFE_GLOBALS_CTX": False,
        "HAS_ADD_SAFE_GLOBALS": False,
        "HAS_GET_UNSAFE_GLOBALS": False,
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
    # Old-torch branches really ran the restricted unpickler on the real file (1.13-2.4: torch
    # refuses the Namespace it cannot allow per call, so the restricted unpickler reloads).
    # torch's own weights-only unpickler lacks protocol 4's FRAME opcode: the scan finds only
    # allowed globals, so the restricted unpickler loads it there too.
    assert bool(calls) == (branch != "installed" or fmt == "zip_protocol4")


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
    assert "weights_only=False" in str(err) and "allow=[" in str(err)
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


def test_scan_matches_torch_where_torch_can_scan(tmp_path, canary):
    payload, _ = _payloads(canary)["__import__"]
    path = _save(_nested(payload), tmp_path / "evil.pt", "zip")
    names, complete = _unpickler.scan_globals(path)
    ours = set(_unpickler.unsafe_globals(names, {}))
    assert complete
    assert ours == set(torch.serialization.get_unsafe_globals_in_checkpoint(path))


def test_weights_only_false_warns_once_and_loads(tmp_path):
    path = _save({"cfg": TrainConfig(1.0)}, tmp_path / "c.pt", "zip")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = st.load(path, weights_only=False)
    assert out["cfg"].lr == 1.0
    assert [w.category for w in caught] == [st.SafetorchWarning]
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

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(ckpt_io, "_torch_load", spy)
    return calls


@pytest.mark.parametrize("fmt,expect_mmap", [("zip", True), ("legacy", False)])
def test_mmap_default_for_zip_paths(tmp_path, monkeypatch, fmt, expect_mmap):
    path = _save({"w": torch.arange(4.0)}, tmp_path / "c.pt", fmt)
    calls = _spy_torch_load(monkeypatch)
    assert torch.equal(st.load(path)["w"], torch.arange(4.0))
    assert calls[-1].get("mmap", False) is expect_mmap
    assert calls[-1]["map_location"] == "cpu"
    st.load(path, mmap=True)  # legacy: silent fallback, no error
    assert calls[-1].get("mmap", False) is expect_mmap
    st.load(path, mmap=False)
    assert "mmap" not in calls[-1]


def test_no_mmap_on_torch_before_2_1_or_file_objects(tmp_path, monkeypatch, simulate_torch):
    path = _save({"w": torch.ones(1)}, tmp_path / "c.pt", "zip")
    calls = _spy_torch_load(monkeypatch)
    with simulate_torch(LOAD_HAS_MMAP=False):
        st.load(path)
    assert "mmap" not in calls[-1]
    with open(path, "rb") as fh:
        st.load(fh)
    assert "mmap" not in calls[-1]
    st.load(io.BytesIO(path.read_bytes()))
    assert "mmap" not in calls[-1]


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
