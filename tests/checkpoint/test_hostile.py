"""Hostile checkpoints, each built from pickle opcodes in the test.

Every payload goes through the three faces of safe loading (``st.load``, ``torch.load`` under
``st.patch("load")`` and ``safetorch ckpt inspect``) on the installed torch and on the
simulated torch < 2.6 branch (safetorch's own restricted unpickler everywhere). A marker file
proves that nothing ran; process state (function defaults, class attributes, torch's safe
globals) proves that nothing was poisoned; refusals are CheckpointError subclasses that name
the file.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import io
import os
import pickle
import struct
import sys
import threading
import tracemalloc
import zipfile
import zlib

import pytest
import torch

import safetorch as st
from safetorch import _compat
from safetorch.checkpoint import _scan, _unpickler

BRANCHES = {
    "installed": {},
    "torch_below_2.6": {"LOAD_WEIGHTS_ONLY_DEFAULT_TRUE": False},
}
pytestmark = pytest.mark.filterwarnings("ignore:Detected pickle protocol")


# --- opcode helpers --------------------------------------------------------------------------
def G(module: str, name: str) -> bytes:
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def U(text: str) -> bytes:
    data = text.encode()
    return b"X" + struct.pack("<I", len(data)) + data


PROTO2 = b"\x80\x02"
MARK, TUPLE, TUPLE1, TUPLE2, REDUCE, BUILD, STOP = b"(", b"t", b"\x85", b"\x86", b"R", b"b", b"."
EMPTY_DICT, EMPTY_TUPLE, SETITEM, NONE, NEWOBJ = b"}", b")", b"s", b"N", b"\x81"


def zipped(pkl: bytes, *members, prefix: str = "archive", compression=zipfile.ZIP_STORED) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression) as z:
        z.writestr(f"{prefix}/data.pkl", pkl)
        for name, data in members:
            z.writestr(name, data)
        z.writestr(f"{prefix}/version", "3\n")
    return buf.getvalue()


def legacy(main: bytes) -> bytes:
    """torch's legacy format: magic number, protocol, sys info, the object, storage keys."""
    ser = torch.serialization
    head = b"".join(
        pickle.dumps(x, protocol=2)
        for x in (ser.MAGIC_NUMBER, ser.PROTOCOL_VERSION, {"little_endian": True})
    )
    return head + main + pickle.dumps([], protocol=2)


def touch_marker(marker: str) -> bytes:
    return PROTO2 + G("os", "system") + U(f"touch {marker}") + TUPLE1 + REDUCE + STOP


def build_on(module: str, name: str, attr: str, value: bytes) -> bytes:
    """BUILD with {attr: value} on an object reached by GLOBAL (a class or function)."""
    return PROTO2 + G(module, name) + EMPTY_DICT + U(attr) + value + SETITEM + BUILD + STOP


# Pickle opcode sequences read best one payload per line: not reformatted.
# fmt: off
def build_slots_on(module: str, name: str, attr: str, value: bytes) -> bytes:
    """BUILD with (None, {attr: value}): pickle's slot state, applied with setattr()."""
    return (
        PROTO2 + G(module, name) + NONE + EMPTY_DICT + U(attr) + value + SETITEM + TUPLE2 + BUILD
        + STOP
    )


def _payloads(marker: str):
    """name -> (file bytes, what it would do under plain pickle)."""
    module_pid = (
        PROTO2
        + MARK
        + U("module")
        + G("torch._utils", "_rebuild_tensor")
        + U("evil.py")
        + U("def evil(): pass")
        + TUPLE
        + b"Q"  # BINPERSID
        + STOP
    )
    return {
        "os.system": zipped(touch_marker(marker)),
        "os.system_legacy": legacy(touch_marker(marker)),
        "os.system_protocol4_stack_global": zipped(
            b"\x80\x04" + U("os") + b"\x94" + U("system") + b"\x94" + b"\x93"
            + U(f"touch {marker}") + TUPLE1 + REDUCE + STOP
        ),
        "subprocess": zipped(
            PROTO2 + G("subprocess", "call") + MARK + U("touch") + U(marker) + b"l" + TUPLE1
            + REDUCE + STOP
        ),
        "eval": zipped(
            PROTO2 + G("builtins", "eval") + U(f"open({marker!r}, 'w').close()") + TUPLE1
            + REDUCE + STOP
        ),
        "py2_builtin_eval": zipped(
            PROTO2 + G("__builtin__", "eval") + U(f"open({marker!r}, 'w').close()") + TUPLE1
            + REDUCE + STOP
        ),
        "getattr_import": zipped(
            PROTO2 + G("builtins", "getattr") + G("builtins", "__import__") + U("os") + TUPLE1
            + REDUCE + U("system") + TUPLE2 + REDUCE + U(f"touch {marker}") + TUPLE1 + REDUCE
            + STOP
        ),
        "inst": zipped(b"(" + U(f"touch {marker}") + b"ios\nsystem\n" + STOP),
        "obj": zipped(PROTO2 + MARK + G("os", "system") + U(f"touch {marker}") + b"o" + STOP),
        "ext1": zipped(PROTO2 + b"\x82\x01" + STOP),
        "newobj_ex": zipped(
            PROTO2 + G("argparse", "Namespace") + EMPTY_TUPLE + EMPTY_DICT + b"\x92" + STOP
        ),
        "build_fn_defaults": zipped(
            build_on("torch._utils", "_rebuild_tensor_v2", "__defaults__", NONE)
        ),
        "build_slots_fn_defaults": zipped(
            build_slots_on("torch._utils", "_rebuild_tensor_v2", "__defaults__", NONE)
        ),
        "build_slots_namespace_class": zipped(
            build_slots_on("argparse", "Namespace", "poisoned", b"\x88")
        ),
        "build_namespace_class": zipped(build_on("argparse", "Namespace", "poisoned", b"\x88")),
        "build_counter_class": zipped(build_on("collections", "Counter", "poisoned", b"\x88")),
        "build_untyped_storage_class": zipped(
            build_on("torch", "UntypedStorage", "poisoned", b"\x88")
        ),
        "build_dunder_on_instance": zipped(
            PROTO2 + G("argparse", "Namespace") + EMPTY_TUPLE + NEWOBJ + EMPTY_DICT
            + U("__class__") + G("collections", "OrderedDict") + SETITEM + BUILD + STOP
        ),
        "module_persistent_id": zipped(module_pid),
        "module_persistent_id_legacy": legacy(module_pid),
        "int_persistent_id": zipped(PROTO2 + b"K\x00Q" + STOP),
        "newobj_not_a_class": zipped(
            PROTO2 + G("torch._utils", "_rebuild_tensor_v2") + EMPTY_TUPLE + NEWOBJ + STOP
        ),
        "reduce_not_allowed_callable": zipped(
            PROTO2 + G("collections", "OrderedDict") + EMPTY_TUPLE + REDUCE + U("items")
            + TUPLE1 + b"0" + STOP
        ),
        "bytearray_alloc": zipped(
            PROTO2 + G("builtins", "bytearray") + b"J\x00\x00\x00\x40" + TUPLE1 + REDUCE + STOP
        ),
        "setitem_into_list": zipped(PROTO2 + b"]" + U("k") + U("v") + SETITEM + STOP),
        "truncated_string": zipped(PROTO2 + b"X\xff\xff\xff\x7fabc"),
        "blocked_module_sys": zipped(PROTO2 + G("sys", "modules") + STOP),
        "torchscript": zipped(PROTO2 + NONE + STOP, ("archive/constants.pkl", PROTO2 + NONE + STOP)),
    }

# fmt: on


PAYLOADS = sorted(_payloads("m"))


@pytest.fixture
def in_tmp(tmp_path):
    """Run in tmp_path (torch's legacy reader writes .patch files into the cwd)."""
    old = os.getcwd()
    os.chdir(tmp_path)
    try:
        yield tmp_path
    finally:
        os.chdir(old)


# torch.distributed.tensor registers its classes as safe globals when it is first imported
# (torch >= 2.5); ckpt inspect can be what imports it first. Imported here, so the
# fingerprint below sees only what a payload could have changed.
try:
    import torch.distributed.tensor  # noqa: F401
except Exception:  # absent before torch 2.4, or no distributed build
    pass


def _process_fingerprint():
    return (
        torch._utils._rebuild_tensor_v2.__defaults__,
        torch._utils._rebuild_tensor.__dict__.copy(),
        sorted(vars(argparse.Namespace)),
        sorted(vars(collections.Counter)),
        sorted(vars(torch.UntypedStorage)),
        list(getattr(torch.serialization, "get_safe_globals", list)()),
    )


def _inspect(path: str) -> int:
    from safetorch._cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            return main(["ckpt", "inspect", path])
        except SystemExit as exc:  # argparse-style exits count as handled
            return int(exc.code or 0)


FACES = ["st.load", "patched torch.load", "ckpt inspect"]


@pytest.mark.parametrize("branch", BRANCHES)
@pytest.mark.parametrize("face", FACES)
@pytest.mark.parametrize("name", PAYLOADS)
def test_hostile_file_is_refused_and_nothing_runs(in_tmp, simulate_torch, branch, face, name):
    marker = str(in_tmp / "marker")
    path = in_tmp / f"{name}.pt"
    path.write_bytes(_payloads(marker)[name])
    before = _process_fingerprint()
    with simulate_torch(**BRANCHES[branch]):
        if face == "ckpt inspect":
            code = _inspect(str(path))
            assert code != 0
        else:
            with pytest.raises(st.CheckpointError) as info:
                if face == "st.load":
                    st.load(path)
                else:
                    with st.patched("load"):
                        torch.load(path)
            message = str(info.value)
            assert str(path) in message, message
            assert "Traceback" not in message
    assert not os.path.exists(marker)
    assert not list(in_tmp.glob("*.patch"))
    assert _process_fingerprint() == before
    # and the process still loads a real checkpoint exactly, through torch itself too
    good = in_tmp / "good.pt"
    torch.save({"w": torch.arange(4.0)}, good)
    assert torch.equal(torch.load(good, weights_only=True)["w"], torch.arange(4.0))
    assert torch.equal(st.load(good)["w"], torch.arange(4.0))


def test_payloads_are_real(in_tmp):
    """Plain pickle does run them: the marker appears (so the refusal tests can fail)."""
    marker = str(in_tmp / "marker")
    pkl = touch_marker(marker)
    pickle.loads(pkl)
    assert os.path.exists(marker)


def test_build_on_a_function_poisons_plain_pickle():
    """What the old fallback did: plain pickle BUILD on an allowed function sets attributes."""

    def victim(a=1):
        return a

    sys.modules[__name__].victim = victim  # type: ignore[attr-defined]
    try:
        pkl = build_slots_on(__name__, "victim", "__defaults__", b"K\x05" + TUPLE1)
        pickle.loads(pkl)
        assert victim() == 5
    finally:
        del sys.modules[__name__].victim  # type: ignore[attr-defined]


@pytest.mark.parametrize("branch", BRANCHES)
def test_build_on_allowed_user_class_is_refused(tmp_path, simulate_torch, branch):
    class Config:
        pass

    Config.__module__, Config.__qualname__ = __name__, "ConfigForHostileTest"
    sys.modules[__name__].ConfigForHostileTest = Config  # type: ignore[attr-defined]
    try:
        path = tmp_path / "c.pt"
        path.write_bytes(zipped(build_on(__name__, "ConfigForHostileTest", "lr", b"K\x05")))
        with simulate_torch(**BRANCHES[branch]):
            with pytest.raises(st.UnsafeCheckpointError):
                st.load(path, allow=[Config])
        assert not hasattr(Config, "lr")
    finally:
        del sys.modules[__name__].ConfigForHostileTest  # type: ignore[attr-defined]


# --- bounded work ----------------------------------------------------------------------------
def _peak_mb(fn) -> float:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("branch", BRANCHES)
def test_scanner_bomb_stops_at_the_first_refused_opcode(tmp_path, simulate_torch, branch):
    """20M x NONE/POP, deflated to a small file: refused without reading the stream."""
    ops = 20_000_000
    pkl = PROTO2 + b"N0" * ops + NONE + STOP
    path = tmp_path / "bomb.pt"
    path.write_bytes(zipped(pkl, compression=zipfile.ZIP_DEFLATED))
    assert path.stat().st_size < 1_000_000
    with simulate_torch(**BRANCHES[branch]):
        with pytest.raises(st.UnsafeCheckpointError, match="POP"):
            peak = _peak_mb(lambda: st.load(path))
        peak = _peak_mb(lambda: _scan.scan_file(path))
    assert peak < 50, peak


def test_scan_memory_does_not_grow_with_the_opcode_count(tmp_path):
    """A valid pickle of 2M memoized small ints: the scan keeps only strings."""
    obj = list(range(2_000_000))
    pkl = pickle.dumps(obj, protocol=2)
    result = _scan.ScanResult()
    peak = _peak_mb(lambda: _scan.scan_pickle(io.BytesIO(pkl), result))
    assert result.complete
    assert peak < 5, peak


def test_only_the_record_prefix_data_pkl_is_read(tmp_path):
    """Other members ending in data.pkl (highly compressible, 200 MB each) are never inflated."""
    big = b"\x00" * (200 << 20)
    real = zipped(PROTO2 + EMPTY_DICT + STOP)
    buf = io.BytesIO(real)
    with zipfile.ZipFile(buf, "a", zipfile.ZIP_DEFLATED) as z:
        for i in range(3):
            z.writestr(f"archive/extra{i}/data.pkl", big)
    path = tmp_path / "amp.pt"
    path.write_bytes(buf.getvalue())
    assert path.stat().st_size < 2_000_000
    peak = _peak_mb(lambda: st.load(path))
    assert peak < 50, peak


@pytest.mark.parametrize("branch", BRANCHES)
def test_stack_and_memo_are_bounded(tmp_path, simulate_torch, branch, monkeypatch):
    monkeypatch.setattr(_unpickler, "MAX_STACK", 1000)
    monkeypatch.setattr(_unpickler, "MAX_MEMO", 1000)
    deep = zipped(PROTO2 + b"N" * 2000 + STOP)
    memo = zipped(PROTO2 + NONE + b"".join(b"r" + struct.pack("<I", i) for i in range(2000)) + STOP)
    with simulate_torch(**BRANCHES["torch_below_2.6"]):
        for data in (deep, memo):
            path = tmp_path / "x.pt"
            path.write_bytes(data)
            with pytest.raises(st.UnsafeCheckpointError, match="beyond 1000"):
                st.load(path, allow=["argparse.ArgumentParser"])  # forces the restricted path


# --- formats with a name ---------------------------------------------------------------------
def test_legacy_tar_format_is_recognised(tmp_path):
    import tarfile

    path = tmp_path / "old.tar"
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for member in ("storages", "tensors", "pickle"):
            data = pickle.dumps(0, protocol=2)
            info = tarfile.TarInfo(member)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    with pytest.raises(st.CheckpointError, match="legacy tar format") as info:
        st.load(path)
    assert "weights_only=False" in str(info.value)


def test_torchscript_archive_is_named(tmp_path):
    path = tmp_path / "scripted.pt"
    torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), str(path))
    with pytest.raises(st.CheckpointError, match="TorchScript") as info:
        st.load(path)
    assert "torch.jit.load" in str(info.value)


@pytest.mark.parametrize("weights_only", [None, True])
def test_weights_only_none_means_safe(tmp_path, weights_only):
    path = tmp_path / "evil.pt"
    path.write_bytes(zipped(touch_marker(str(tmp_path / "m"))))
    with pytest.raises(st.UnsafeCheckpointError):
        st.load(path, weights_only=weights_only)
    assert not (tmp_path / "m").exists()


def test_non_seekable_file_keeps_torchs_guidance():
    class Pipe(io.RawIOBase):
        def readable(self):
            return True

        def seekable(self):
            return False

    with pytest.raises(io.UnsupportedOperation, match="io.BytesIO") as info:
        st.load(Pipe())
    assert isinstance(info.value, st.CheckpointError)
    with pytest.raises(io.UnsupportedOperation):  # torch's own, same class
        torch.load(Pipe(), weights_only=True)


def test_wrong_argument_types_raise_typeerror():
    with pytest.raises(TypeError, match="f must be a path"):
        st.load(42)
    with pytest.raises(TypeError, match="swapped"):
        st.load_state_dict("model.pt", torch.nn.Linear(1, 1))


# --- allow= is scoped to the call ------------------------------------------------------------
class Scoped:
    """A user class allowed for one call; its __setstate__ runs inside that load."""

    seen = []

    def __setstate__(self, state):
        # Inside st.load(allow=[Scoped]): torch's process-wide list must not contain it, so a
        # concurrent plain torch.load(weights_only=True) in another thread refuses it.
        Scoped.seen.append(list(torch.serialization.get_safe_globals()))
        result = {}

        def other_thread():
            try:
                torch.load(io.BytesIO(_SCOPED_FILE), weights_only=True)
                result["loaded"] = True
            except pickle.UnpicklingError:
                result["loaded"] = False

        t = threading.Thread(target=other_thread)
        t.start()
        t.join()
        Scoped.seen.append(result["loaded"])
        self.__dict__.update(state)


_SCOPED_FILE = b""


@pytest.mark.skipif(
    not hasattr(torch.serialization, "add_safe_globals"),
    reason="torch.serialization.add_safe_globals needs 2.4",
)
@pytest.mark.parametrize("branch", BRANCHES)
def test_allow_is_invisible_to_other_threads_and_keeps_user_globals(simulate_torch, branch):
    global _SCOPED_FILE
    obj = Scoped()
    obj.x = 1
    buf = io.BytesIO()
    torch.save({"cfg": obj}, buf)
    _SCOPED_FILE = buf.getvalue()
    torch.serialization.add_safe_globals([argparse.Namespace])  # the user's own registration
    try:
        Scoped.seen.clear()
        with simulate_torch(**BRANCHES[branch]):
            out = st.load(io.BytesIO(_SCOPED_FILE), allow=[Scoped])
        assert out["cfg"].x == 1
        inside, other_thread_loaded = Scoped.seen
        assert Scoped not in inside
        assert other_thread_loaded is False
        assert argparse.Namespace in torch.serialization.get_safe_globals()
        assert Scoped not in torch.serialization.get_safe_globals()
    finally:
        torch.serialization.clear_safe_globals()


def test_users_safe_globals_are_honoured(tmp_path):
    if not hasattr(torch.serialization, "add_safe_globals"):
        pytest.skip("torch.serialization.add_safe_globals needs torch 2.4")
    path = tmp_path / "c.pt"
    import datetime

    torch.save({"c": datetime.timedelta(days=1)}, path)
    with pytest.raises(st.UnsafeCheckpointError):
        st.load(path)
    with torch.serialization.safe_globals([datetime.timedelta]):
        assert st.load(path)["c"] == datetime.timedelta(days=1)


# --- the patched torch.load keeps torch's contract ---------------------------------------------
def test_patched_load_with_standard_pickle_module_loads_safely(tmp_path):
    path = tmp_path / "c.pt"
    torch.save({"w": torch.ones(2)}, path)
    evil = tmp_path / "evil.pt"
    evil.write_bytes(zipped(touch_marker(str(tmp_path / "m"))))
    with st.patched("load"):
        assert torch.equal(torch.load(path, pickle_module=pickle)["w"], torch.ones(2))
        with pytest.raises(pickle.UnpicklingError):
            torch.load(evil, pickle_module=pickle)
    assert not (tmp_path / "m").exists()


def test_patched_load_passes_a_custom_pickle_module_untouched(tmp_path):
    path = tmp_path / "c.pt"
    torch.save({"w": torch.ones(2)}, path)
    used = []

    class Unpickler(pickle.Unpickler):
        def find_class(self, module, name):
            used.append(name)
            return super().find_class(module, name)

    custom = type(pickle)("custom_pickle")
    custom.Unpickler = Unpickler
    custom.load = pickle.load
    custom.__name__ = "custom_pickle"
    with st.patched("load"):
        with pytest.warns(st.SafetorchWarning, match="custom_pickle"):
            out = torch.load(path, pickle_module=custom, weights_only=False)
    assert torch.equal(out["w"], torch.ones(2))
    assert used == [] or _compat.TORCH_RELEASE >= (2, 0)  # torch 1.13 ignores it
    assert any("custom pickle_module" in str(c) for c in _report_changes())


def _report_changes():
    from safetorch.patching import _registry

    return [entry.kind for entry in _registry.report_entries()]


def test_encoding_reaches_the_unpickler(tmp_path):
    """A Python 2 checkpoint: a byte string (SHORT_BINSTRING) decoded with encoding=."""
    path = tmp_path / "py2.pt"
    path.write_bytes(zipped(PROTO2 + b"U\x03caf" + STOP))
    assert st.load(path) == "caf"
    assert st.load(path, encoding="bytes") == b"caf"
    path.write_bytes(zipped(PROTO2 + b"U\x01\xe9" + STOP))
    assert st.load(path, encoding="latin1") == "\xe9"
    with st.patched("load"):
        assert torch.load(path, encoding="latin1") == "\xe9"


def test_positional_map_location_like_torch(tmp_path):
    path = tmp_path / "c.pt"
    torch.save({"w": torch.ones(1)}, path)
    assert st.load(path, "cpu")["w"].device.type == "cpu"
    assert st.load(path, torch.device("cpu"), None)["w"].device.type == "cpu"


def test_zlib_is_the_only_compression_torch_reads():
    # Sanity for the deflate tests: zipfile's DEFLATE is zlib's raw deflate.
    assert zlib.decompress(zlib.compress(b"x")) == b"x"
