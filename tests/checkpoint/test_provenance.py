"""Trust by provenance: st.save records what a weights-only load refuses, st.trust is the
user's word, and st.load trusts nothing else; each hostile case beside torch.load(weights_only=
True) on the same bytes."""

from __future__ import annotations

import io
import multiprocessing
import os
import pickle
import stat
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any, List

import pytest
import torch
from _pickles import archive  # tests/_pickles.py (on sys.path through conftest)

import safetorch as st
from safetorch import _compat
from safetorch.checkpoint import _provenance, loading, saving
from safetorch.errors import CheckpointWarning, UnsafeCheckpointError

np = pytest.importorskip("numpy")


class _Evil:
    def __reduce__(self) -> Any:
        return (os.system, ("echo pwned > /dev/null",))


def _ledger_files() -> List[Path]:
    root = Path(_provenance.state_dir())
    return sorted(p for p in root.rglob("*") if p.is_file()) if root.exists() else []


def _torch_refuses(path: Path) -> None:
    with pytest.raises(pickle.UnpicklingError):
        torch.load(path, weights_only=True)


def test_a_whole_model_st_save_wrote_loads_fully(tmp_path: Path) -> None:
    net = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.ReLU())
    path = tmp_path / "model.pt"
    st.save(net, path)
    _torch_refuses(path)  # weights-only refuses these bytes ...
    loaded = st.load(path)  # ... safetorch wrote them: trusted by provenance
    assert isinstance(loaded, torch.nn.Sequential)
    assert torch.equal(loaded[0].weight, net[0].weight)
    assert len(_ledger_files()) == 1


class _CountedNet(torch.nn.Module):
    pickled = 0

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(3, 2)

    def __getstate__(self) -> Any:
        type(self).pickled += 1
        return self.__dict__.copy()


def test_a_whole_model_is_pickled_once_and_a_state_dict_loads_as_before(tmp_path: Path) -> None:
    """A whole module goes straight to the hashing writer (no first pass through torch's path
    writer that stops on its class): one pickling per save, and the same result."""
    net = _CountedNet()
    _CountedNet.pickled = 0
    st.save(net, tmp_path / "net.pt")
    assert _CountedNet.pickled == 1
    _torch_refuses(tmp_path / "net.pt")
    loaded = st.load(tmp_path / "net.pt")
    assert isinstance(loaded, _CountedNet) and torch.equal(loaded.fc.weight, net.fc.weight)
    st.save(net.state_dict(), tmp_path / "sd.pt")  # a state dict still gets the path writer
    assert torch.equal(torch.load(tmp_path / "sd.pt", weights_only=True)["fc.bias"], net.fc.bias)


# torch 2.0-2.x warn "TypedStorage is deprecated" from inside torch.load, once per process (a
# warning raised as an error does not count as the once): the raw torch.load below tolerates it.
@pytest.mark.filterwarnings("ignore:TypedStorage is deprecated:UserWarning")
def test_a_state_dict_save_is_not_hashed_and_is_torch_saves_archive(tmp_path: Path) -> None:
    sd = {"w": torch.arange(6.0), "b": torch.zeros(2)}
    path = tmp_path / "sd.pt"
    st.save(sd, path)
    assert _ledger_files() == []  # nothing recorded: it loads weights-only anyway
    (tmp_path / "torch").mkdir()
    torch.save(sd, tmp_path / "torch" / "sd.pt")  # same name: the same record prefix
    assert path.read_bytes() == (tmp_path / "torch" / "sd.pt").read_bytes()
    assert torch.equal(torch.load(path, weights_only=True)["w"], sd["w"])


def test_numpy_arrays_st_save_wrote_load(tmp_path: Path) -> None:
    path = tmp_path / "arr.pt"
    st.save({"x": np.linspace(0, 1, 5), "seed": np.int64(3)}, path)
    _torch_refuses(path)
    out = st.load(path)
    assert out["x"].tolist() == [0.0, 0.25, 0.5, 0.75, 1.0] and int(out["seed"]) == 3


def test_a_file_plain_torch_saved_is_refused_with_every_way_out(tmp_path: Path) -> None:
    path = tmp_path / "old.pkl"
    torch.save(torch.nn.Linear(2, 2), path)
    with pytest.raises(UnsafeCheckpointError) as info:
        st.load(path)
    text = str(info.value)
    assert repr(str(path)) in text and "torch.nn.modules.linear.Linear" in text
    assert f"safetorch trust {path}" in text and "st.trust(path)" in text
    assert "safetorch run --trust" in text and "Nothing from the file was executed" in text
    assert "pickle.loads" not in text


def test_trusting_a_file_loads_it_and_a_changed_file_is_refused_again(tmp_path: Path) -> None:
    path = tmp_path / "old.pkl"
    torch.save(torch.nn.Linear(2, 2), path)
    trusted = st.trust(path)
    assert "torch.nn.modules.linear.Linear" in trusted.globals
    assert trusted.size == path.stat().st_size
    assert isinstance(st.load(path), torch.nn.Linear)
    data = bytearray(path.read_bytes())
    data[-30] ^= 0xFF  # same size, other bytes
    path.write_bytes(bytes(data))
    with pytest.raises(UnsafeCheckpointError):
        st.load(path)


def test_an_untrusted_malicious_file_runs_nothing(tmp_path: Path, monkeypatch: Any) -> None:
    path = tmp_path / "evil.pt"
    torch.save({"x": _Evil()}, path)
    calls: List[Any] = []
    monkeypatch.setattr(os, "system", lambda *a: calls.append(a))
    _torch_refuses(path)
    with pytest.raises(UnsafeCheckpointError, match="os.system|posix.system"):
        st.load(path)
    assert calls == []


def test_a_file_swapped_after_the_scan_is_not_what_loads(tmp_path: Path, monkeypatch: Any) -> None:
    """The hash is taken over the bytes that are then unpickled: a file trusted when scanned
    but replaced before it is read is refused (no window between check and use)."""
    good = tmp_path / "good.pt"
    st.save(torch.nn.Linear(2, 2), good)
    evil = tmp_path / "evil.pt"
    torch.save({"x": _Evil()}, evil)
    evil_bytes = evil.read_bytes()
    real_may_hold = _provenance.may_hold

    def swap(size: int) -> bool:
        good.write_bytes(evil_bytes)  # the attacker's move, between scan and read
        return real_may_hold(size) or True

    calls: List[Any] = []
    monkeypatch.setattr(os, "system", lambda *a: calls.append(a))
    monkeypatch.setattr(_provenance, "may_hold", swap)
    with pytest.raises(st.CheckpointError):  # changed under the open file, or refused
        st.load(good)
    assert calls == []


def test_a_same_size_change_after_the_scan_is_refused(tmp_path: Path, monkeypatch: Any) -> None:
    good = tmp_path / "good.pt"
    st.save(torch.nn.Linear(2, 2), good)
    data = bytearray(good.read_bytes())
    data[-40] ^= 0xFF
    real_may_hold = _provenance.may_hold

    def swap(size: int) -> bool:
        good.write_bytes(bytes(data))  # same size, other bytes: after the scan, before the read
        return real_may_hold(size)

    monkeypatch.setattr(_provenance, "may_hold", swap)
    with pytest.raises(UnsafeCheckpointError):
        st.load(good)


def test_the_bytes_hashed_are_the_bytes_unpickled(tmp_path: Path, monkeypatch: Any) -> None:
    path = tmp_path / "m.pt"
    st.save(torch.nn.Linear(2, 2), path)
    seen: List[bytes] = []
    if _compat.LOAD_HAS_MMAP:  # torch >= 2.1: unpickled from the buffer the hash was read into
        real = loading._load_full_in_memory

        def spy(view: Any, *args: Any) -> Any:
            seen.append(bytes(view))
            return real(view, *args)

        monkeypatch.setattr(loading, "_load_full_in_memory", spy)
    else:  # before: from a BytesIO of the bytes read and hashed
        real = loading._load_full

        def spy(src: Any, *args: Any) -> Any:
            seen.append(src.getvalue())
            return real(src, *args)

        monkeypatch.setattr(loading, "_load_full", spy)
    st.load(path)
    import hashlib

    (data,) = seen
    (entry,) = _ledger_files()
    assert entry.name == hashlib.sha256(data).hexdigest() and entry.parent.name == str(len(data))


def test_a_size_no_trusted_file_has_reads_nothing(tmp_path: Path, monkeypatch: Any) -> None:
    st.save(torch.nn.Linear(2, 2), tmp_path / "other.pt")
    path = tmp_path / "old.pkl"
    torch.save(torch.nn.Linear(3, 3), path)

    def fail(*a: Any) -> Any:
        raise AssertionError("read and hashed a file no entry can match")

    monkeypatch.setattr(_provenance, "read_hashed", fail)
    with pytest.raises(UnsafeCheckpointError):
        st.load(path)


def test_explicit_weights_only_true_stays_weights_only(tmp_path: Path) -> None:
    path = tmp_path / "m.pt"
    st.save(torch.nn.Linear(2, 2), path)
    with pytest.raises(UnsafeCheckpointError):
        st.load(path, weights_only=True)


def test_a_file_object_of_a_trusted_file_loads(tmp_path: Path) -> None:
    buf = io.BytesIO()
    st.save(torch.nn.Linear(2, 2), buf)
    buf.seek(0)
    assert isinstance(st.load(buf), torch.nn.Linear)
    assert buf.tell() == len(buf.getvalue())


@pytest.mark.skipif(not hasattr(os, "geteuid"), reason="POSIX permissions")
def test_a_ledger_others_can_write_is_never_used(tmp_path: Path) -> None:
    path = tmp_path / "m.pt"
    st.save(torch.nn.Linear(2, 2), path)
    root = Path(_provenance.state_dir())
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    root.chmod(0o777)
    try:
        with pytest.warns(CheckpointWarning, match="others can write"):
            with pytest.raises(UnsafeCheckpointError):
                st.load(path)
        with pytest.warns(CheckpointWarning, match="not recorded"):
            st.save(torch.nn.Linear(3, 3), tmp_path / "n.pt")
    finally:
        root.chmod(0o700)


@pytest.mark.skipif(not hasattr(os, "symlink"), reason="needs symlinks")
def test_a_ledger_that_is_a_symlink_is_never_used(tmp_path: Path, monkeypatch: Any) -> None:
    elsewhere = tmp_path / "attacker"
    (elsewhere / "safetorch").mkdir(parents=True, mode=0o700)
    state = tmp_path / "state"
    state.mkdir()
    (state / "safetorch").symlink_to(elsewhere / "safetorch")
    monkeypatch.setenv("XDG_STATE_HOME", str(state))
    path = tmp_path / "old.pkl"
    torch.save(torch.nn.Linear(2, 2), path)
    entry = _provenance.Entry(
        path.stat().st_size, __import__("hashlib").sha256(path.read_bytes()).hexdigest()
    )
    planted = elsewhere / "safetorch" / "trusted" / str(entry.size)
    planted.mkdir(parents=True)
    (planted / entry.sha256).touch()
    with pytest.warns(CheckpointWarning, match="not a directory"):
        with pytest.raises(UnsafeCheckpointError):
            st.load(path)


def test_the_ledger_holds_no_path_and_is_private(tmp_path: Path) -> None:
    path = tmp_path / "secret-project-name.pt"
    st.save(torch.nn.Linear(2, 2), path)
    (entry,) = _ledger_files()
    assert entry.read_bytes() == b"" and "secret" not in str(entry)
    assert stat.S_IMODE(entry.stat().st_mode) & 0o077 == 0
    for d in entry.parents:
        if d == Path(_provenance.state_dir()).parent:
            break
        assert stat.S_IMODE(d.stat().st_mode) == 0o700


def test_xdg_state_home_is_honoured_and_a_relative_one_ignored(
    monkeypatch: Any, tmp_path: Path
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "s"))
    assert _provenance.state_dir() == str(tmp_path / "s" / "safetorch")
    monkeypatch.setenv("XDG_STATE_HOME", "relative/dir")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert _provenance.state_dir() == str(tmp_path / "home" / ".local" / "state" / "safetorch")


def test_run_scoped_trust_comes_from_the_environment_only_by_hash(
    tmp_path: Path, monkeypatch: Any
) -> None:
    path = tmp_path / "old.pkl"
    torch.save(torch.nn.Linear(2, 2), path)
    with open(path, "rb") as fh:
        token = _provenance.hash_file(fh).token()
    monkeypatch.setenv(_provenance.RUN_ENV, f"garbage,{path},12:zz,{token}")
    assert isinstance(st.load(path), torch.nn.Linear)
    assert _ledger_files() == []  # nothing lasting
    monkeypatch.setenv(_provenance.RUN_ENV, str(path))  # a path is not a trust token
    with pytest.raises(UnsafeCheckpointError):
        st.load(path)


def test_the_legacy_format_is_recorded_too(tmp_path: Path) -> None:
    path = tmp_path / "legacy.pt"
    st.save(torch.nn.Linear(2, 2), path, _use_new_zipfile_serialization=False)
    _torch_refuses(path)
    assert isinstance(st.load(path), torch.nn.Linear)


def test_a_custom_pickle_module_is_passed_through_and_not_recorded(tmp_path: Path) -> None:
    import types

    custom = types.ModuleType("mypickle")
    custom.__dict__.update(vars(pickle))
    path = tmp_path / "m.pt"
    st.save(torch.nn.Linear(2, 2), path, pickle_module=custom)
    assert _ledger_files() == []
    with pytest.raises(UnsafeCheckpointError):
        st.load(path)


def test_save_checkpoint_and_checkpointsaver_record_whole_models(tmp_path: Path) -> None:
    st.save_checkpoint({"model": torch.nn.Linear(2, 2), "arr": np.ones(2)}, tmp_path / "c.pt")
    assert isinstance(st.load(tmp_path / "c.pt")["model"], torch.nn.Linear)
    saver = st.CheckpointSaver(tmp_path / "run")
    saver.save({"net": torch.nn.Linear(2, 2)}, epoch=0, metric=1.0)
    assert isinstance(st.load(saver.last_path)["net"], torch.nn.Linear)


def test_untrust_takes_it_back(tmp_path: Path) -> None:
    path = tmp_path / "m.pt"
    st.save(torch.nn.Linear(2, 2), path)
    assert st.untrust(path) is True
    with pytest.raises(UnsafeCheckpointError):
        st.load(path)


def test_trust_refuses_what_is_not_a_regular_file(tmp_path: Path) -> None:
    if not hasattr(os, "mkfifo"):
        pytest.skip("needs FIFOs")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(st.CheckpointError, match="not a regular file"):
        st.trust(fifo)  # refused without blocking
    with pytest.raises(st.CheckpointError):
        st.trust(tmp_path / "missing.pt")


def _save_big_in_child(path: str) -> None:
    st.save({"m": torch.nn.Linear(512, 1024), "pad": np.zeros(1 << 18)}, path)
    assert isinstance(st.load(path)["m"], torch.nn.Linear)


@pytest.mark.skipif(sys.platform == "win32", reason="fork")
def test_hashing_after_fork_does_not_hang(tmp_path: Path) -> None:
    # the parent's hashing thread does not exist in a fork child
    st.save({"m": torch.nn.Linear(512, 1024)}, tmp_path / "parent.pt")
    ctx = multiprocessing.get_context("fork")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads (3.12+)
        child = ctx.Process(target=_save_big_in_child, args=(str(tmp_path / "child.pt"),))
        child.start()
    child.join(120)
    alive = child.is_alive()
    if alive:
        child.kill()
    assert not alive and child.exitcode == 0


def test_needs_trust_matches_the_load_policy() -> None:
    assert not saving.needs_trust(pickle.dumps({"a": [1, 2.0, "x"]}, protocol=2))
    assert saving.needs_trust(pickle.dumps(_Evil, protocol=2))
    assert saving.needs_trust(pickle.dumps(np.zeros(2), protocol=4))  # the exact scanner decides
    assert not saving.needs_trust(pickle.dumps({"c\nfoo\n": 1}, protocol=2))  # a key, not a global


def test_the_cli_trusts_after_showing_the_globals(tmp_path: Path) -> None:
    path = tmp_path / "old\x1b[31m.pkl"
    torch.save(torch.nn.Linear(2, 2), path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAFETORCH_")}
    cmd = [sys.executable, "-m", "safetorch", "trust"]
    no = subprocess.run(
        [*cmd, str(path)],
        env=env,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=120,
    )
    assert no.returncode == 2 and "--yes" in no.stderr and "\x1b" not in no.stderr
    assert _ledger_files() == []
    yes = subprocess.run(
        [*cmd, "--yes", str(path)], env=env, capture_output=True, text=True, timeout=120
    )
    assert yes.returncode == 0, yes.stderr
    assert "torch.nn.modules.linear.Linear" in yes.stdout and "\x1b" not in yes.stdout
    assert isinstance(st.load(path), torch.nn.Linear)
    rm = subprocess.run(
        [*cmd, "--remove", str(path)], env=env, capture_output=True, text=True, timeout=120
    )
    assert rm.returncode == 0 and "no longer trusted" in rm.stdout
    with pytest.raises(UnsafeCheckpointError):
        st.load(path)
    missing = subprocess.run(
        [*cmd, "--yes", str(tmp_path / "nope.pt")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert missing.returncode == 1 and "does not exist" in missing.stderr


def test_a_refusal_never_prints_the_files_control_characters(tmp_path: Path) -> None:
    path = tmp_path / "esc.pt"
    body = b"\x80\x02cevil\x1b[2J\nName\x1b[31m\nq\x00."  # GLOBAL with escape sequences
    path.write_bytes(archive(body))
    with pytest.raises(UnsafeCheckpointError) as info:
        st.load(path)
    assert "\x1b" not in str(info.value) and "\\x1b" in str(info.value)
    assert any("\x1b" in n for n in info.value.unsafe_globals)  # the data itself is kept
