"""st.load_state on hostile resume files: everything validated first, applied all or nothing.

Each case saves a real ``st.save_state`` checkpoint, loads its payload with
``torch.load(weights_only=False)``, breaks one entry, re-saves it with ``torch.save`` and calls
``st.load_state``. Each must raise ``CheckpointError`` naming the path, and leave the model,
the optimizer and every RNG (python, numpy, torch) exactly as they were. Cases that would crash
the interpreter without the checks (numpy's ``pos`` indexes the key array unchecked; an int
torch state would allocate gigabytes) run in a child process, so a crash fails the test rather
than killing pytest.
"""

from __future__ import annotations

import copy
import os
import random
import subprocess
import sys
import textwrap
from typing import Any, Callable, Dict, Optional

import pytest
import torch

import safetorch as st
from safetorch.checkpoint import _rng as rng_mod
from safetorch.checkpoint import state as state_mod

try:
    import numpy as np
except ImportError:  # pragma: no cover - numpy is a dev dependency
    np = None

needs_numpy = pytest.mark.skipif(np is None, reason="numpy is not installed")
HERE = os.path.dirname(os.path.abspath(__file__))
CHILD_TIMEOUT_S = 180


# --- helpers -----------------------------------------------------------------------------------
class Counter:
    """A stateful object that is not a module or optimizer; refuses a negative count."""

    def __init__(self, count: int = 0) -> None:
        self.count = count

    def state_dict(self) -> Dict[str, int]:
        return {"count": self.count}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        if state["count"] < 0:
            raise ValueError(f"count must be >= 0, got {state['count']}")
        self.count = state["count"]


def _objects(seed: int) -> Dict[str, Any]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    opt = torch.optim.Adam(model.parameters(), lr=0.01 * (seed + 1))
    model(torch.randn(5, 3)).pow(2).mean().backward()
    opt.step()  # the optimizer has state (exp_avg, ...) to compare
    opt.zero_grad()
    return {"model": model, "optimizer": opt, "counter": Counter(seed)}


def _payload(directory: Any) -> Dict[str, Any]:
    """A real save_state checkpoint's payload, read back in full (the test's own file)."""
    if np is not None:
        np.random.seed(11)
    random.seed(11)
    path = st.save_state(os.path.join(directory, "good.pt"), **_objects(0), epoch=3)
    return torch.load(path, weights_only=False)


def _write(directory: Any, payload: Dict[str, Any], name: str = "bad.pt") -> str:
    path = os.path.join(directory, name)
    torch.save(payload, path)
    return path


def _mine(payload: Dict[str, Any]) -> Dict[str, Any]:
    return payload["rng"]["0"]


def _state(objects: Dict[str, Any]) -> Dict[str, Any]:
    """Everything load_state could change, copied."""
    return {
        "model": {k: v.detach().clone() for k, v in objects["model"].state_dict().items()},
        "optimizer": copy.deepcopy(objects["optimizer"].state_dict()),
        "counter": objects["counter"].count,
        "python": random.getstate(),
        "numpy": np.random.get_state() if np is not None else None,
        "torch": torch.get_rng_state().clone(),
    }


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if np is not None and isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and np.array_equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def _assert_unchanged(before: Dict[str, Any], after: Dict[str, Any]) -> None:
    changed = [k for k in before if not _same(before[k], after[k])]
    assert not changed, f"a failed load_state changed {changed}"


def check_refused(path: str, match: Optional[str] = None, seed: int = 1) -> BaseException:
    """load_state(path) raises CheckpointError naming the path and changes nothing."""
    objects = _objects(seed)
    if np is not None:
        np.random.seed(5)
    random.seed(5)
    torch.manual_seed(5)
    before = _state(objects)
    with pytest.raises(st.CheckpointError, match=match) as info:
        st.load_state(path, **objects)
    assert path in str(info.value)
    _assert_unchanged(before, _state(objects))
    # the RNG really is usable afterwards (no corrupt state left behind)
    random.random(), torch.rand(1)
    if np is not None:
        np.random.randint(0, 2**31, size=1000)
    return info.value


def _in_child(path: str, match: str) -> None:
    """check_refused in a fresh interpreter: a segfault or an OOM kill fails the test."""
    code = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {HERE!r})
        try:
            import numpy  # imported, as in a training script: load_state restores its state
        except ImportError:
            pass
        import test_state_hostile as t
        t.check_refused({path!r}, match={match!r})
        print("REFUSED-AND-UNCHANGED")
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT_S,
        env={**os.environ, "PYTHONFAULTHANDLER": "1"},
    )
    assert proc.returncode == 0 and "REFUSED-AND-UNCHANGED" in proc.stdout, (
        f"child exited with {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    )


# --- RNG states that could crash the process: child processes ----------------------------------
@needs_numpy
@pytest.mark.parametrize("pos", [10**6, -1, 625])
def test_numpy_pos_out_of_range_is_refused_in_a_child(tmp_path, pos):
    payload = _payload(tmp_path)
    name, keys, _, has_gauss, cached = _mine(payload)["numpy"]
    _mine(payload)["numpy"] = (name, keys, pos, has_gauss, cached)
    _in_child(_write(tmp_path, payload), match=r"numpy RNG state: got -?\d+, expected pos")


def test_torch_state_an_int_is_refused_without_allocating(tmp_path):
    payload = _payload(tmp_path)
    _mine(payload)["torch"] = 10**10  # bytearray(10**10) would allocate 10 GB
    _in_child(_write(tmp_path, payload), match="torch CPU RNG state: got 10000000000")


@needs_numpy
def test_numpy_itself_takes_the_bad_pos_side_by_side(tmp_path):
    """The same state straight into np.random.set_state: numpy (2.x at least) accepts it, and
    the next draw reads outside the key array (pos=625: one word past it; pos=10**6: a
    segfault). Its behaviour is version-dependent and only recorded here; safetorch refuses it
    on every version."""
    code = textwrap.dedent(
        """
        import numpy as np
        name, keys, _, has_gauss, cached = np.random.get_state()
        try:
            np.random.set_state((name, keys, 10**6, has_gauss, cached))
        except Exception as exc:
            print("NUMPY-RAISED", type(exc).__name__)
            raise SystemExit(0)
        print("NUMPY-ACCEPTED", flush=True)
        np.random.randint(0, 2**31, size=10)
        print("DRAW-RETURNED")
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=CHILD_TIMEOUT_S
    )
    numpy_raised = "NUMPY-RAISED" in proc.stdout
    # recorded: rc -11 (SIGSEGV) after NUMPY-ACCEPTED on numpy 2.4
    print(f"numpy {np.__version__}: rc={proc.returncode} stdout={proc.stdout.split()}")
    payload = _payload(tmp_path)
    name, keys, _, has_gauss, cached = _mine(payload)["numpy"]
    _mine(payload)["numpy"] = (name, keys, 10**6, has_gauss, cached)
    # safetorch refuses it whatever numpy does (in a child too: a regression would crash)
    _in_child(_write(tmp_path, payload), match="expected pos an int 0..624")
    assert numpy_raised or "NUMPY-ACCEPTED" in proc.stdout


# --- malformed RNG states: refused before anything is applied ----------------------------------
def _set_part(part: str, value: Any) -> Callable[[Dict[str, Any]], None]:
    def mutate(payload: Dict[str, Any]) -> None:
        _mine(payload)[part] = value

    return mutate


def _edit_python(edit: Callable[[list], Any]) -> Callable[[Dict[str, Any]], None]:
    def mutate(payload: Dict[str, Any]) -> None:
        version, internal, gauss = _mine(payload)["python"]
        state = [version, list(internal), gauss]
        edit(state)
        _mine(payload)["python"] = (state[0], tuple(state[1]), state[2])

    return mutate


def _edit_numpy(index: int, value: Any) -> Callable[[Dict[str, Any]], None]:
    def mutate(payload: Dict[str, Any]) -> None:
        state = list(_mine(payload)["numpy"])
        state[index] = value(state[index]) if callable(value) else value
        _mine(payload)["numpy"] = tuple(state)

    return mutate


def _set(key: str, value: Any) -> Callable[[Dict[str, Any]], None]:
    def mutate(payload: Dict[str, Any]) -> None:
        payload[key] = value

    return mutate


def _delete(key: str) -> Callable[[Dict[str, Any]], None]:
    def mutate(payload: Dict[str, Any]) -> None:
        del payload[key]

    return mutate


def _set_item(list_index: int, value: Any) -> Callable[[list], None]:
    def edit(state: list) -> None:
        state[1][list_index] = value

    return edit


RNG_CASES = {
    # numpy (keys, has_gauss, cached, name); pos out of range runs in a child, above
    "numpy_keys_too_short": (_edit_numpy(1, lambda k: k[:-4]), "keys bytes of length 2496"),
    "numpy_keys_an_int": (_edit_numpy(1, 10**9), "keys bytes of length 2496"),
    "numpy_keys_a_list": (_edit_numpy(1, [0] * 624), "keys bytes of length 2496"),
    "numpy_pos_a_float": (_edit_numpy(2, 3.0), "pos an int"),
    "numpy_has_gauss_2": (_edit_numpy(3, 2), "has_gauss 0 or 1"),
    "numpy_cached_a_str": (_edit_numpy(4, "0.5"), "cached_gaussian a float"),
    "numpy_other_generator": (_edit_numpy(0, "PCG64"), "'MT19937'"),
    "numpy_not_a_tuple": (_set_part("numpy", {"pos": 0}), "numpy RNG state"),
    # torch CPU
    "torch_too_short": (_set_part("torch", b"\0" * 16), "bytes of length 5056|torch CPU"),
    "torch_too_long": (_set_part("torch", b"\0" * 10**5), "torch CPU RNG state"),
    "torch_a_str": (_set_part("torch", "x" * 5056), "torch CPU RNG state"),
    "torch_rejected_by_torch": (_set_part("torch", None), "torch CPU RNG state"),
    # python random
    "python_too_few_words": (_edit_python(lambda s: s[1].pop()), "tuple of 625 ints"),
    "python_word_too_big": (_edit_python(_set_item(0, 2**32)), "word 0 an int in 0..4294967295"),
    "python_word_negative": (_edit_python(_set_item(5, -1)), "word 5 an int"),
    "python_word_a_float": (_edit_python(_set_item(5, 1.0)), "word 5 an int"),
    "python_index_625": (_edit_python(_set_item(624, 625)), "the index an int in 0..624"),
    "python_version_2": (_edit_python(lambda s: s.__setitem__(0, 2)), "version 3"),
    "python_gauss_a_str": (_edit_python(lambda s: s.__setitem__(2, "x")), "gauss None"),
    "python_not_a_tuple": (_set_part("python", 3), "python RNG state"),
    # cuda (checked for type even where CUDA is not available)
    "cuda_not_a_list": (_set_part("cuda", 5), "cuda RNG state"),
    "cuda_list_of_ints": (_set_part("cuda", [1, 2]), "cuda RNG state"),
    "cuda_bytes_not_in_a_list": (_set_part("cuda", b"\0" * 16), "cuda RNG state"),
}


@pytest.mark.parametrize("case", sorted(RNG_CASES))
def test_malformed_rng_state_is_refused_and_nothing_changes(tmp_path, case):
    mutate, match = RNG_CASES[case]
    if case.startswith("numpy") and np is None:
        pytest.skip("numpy is not installed")
    payload = _payload(tmp_path)
    mutate(payload)
    check_refused(_write(tmp_path, payload), match=match)


def test_torch_state_the_generator_rejects_is_refused(tmp_path):
    """Right size, but not a valid mt19937 state (all zeros: never seeded): torch itself
    rejects it, on a throwaway generator, before the global one changes."""
    payload = _payload(tmp_path)
    _mine(payload)["torch"] = bytes(rng_mod.torch_state_bytes())
    error = check_refused(_write(tmp_path, payload), match="the generator rejects it")
    assert isinstance(error.__cause__, RuntimeError)


# --- malformed structure -----------------------------------------------------------------------
STRUCTURE_CASES = {
    "rng_not_a_mapping": (_set("rng", [1, 2]), "'rng' entry: got a list"),
    "rng_missing": (_delete("rng"), "no 'rng' entry"),
    "rng_rank_not_a_str": (_set("rng", {0: {}}), "not a rank"),
    "rng_rank_state_not_a_mapping": (_set("rng", {"0": [1]}), r"rank 0\): bad RNG state"),
    "extras_not_a_dict": (_set("extras", [("epoch", 3)]), "'extras' entry: got a list"),
    "extras_missing": (_delete("extras"), "'extras' entry: got nothing"),
    "objects_missing": (_delete("objects"), "'objects' entry: got nothing"),
    "objects_not_a_dict": (_set("objects", "model"), "'objects' entry: got a str"),
    "objects_key_not_a_str": (_set("objects", {1: {}}), "with str keys"),
}


@pytest.mark.parametrize("case", sorted(STRUCTURE_CASES))
def test_malformed_structure_is_refused_and_nothing_changes(tmp_path, case):
    mutate, match = STRUCTURE_CASES[case]
    payload = _payload(tmp_path)
    mutate(payload)
    check_refused(_write(tmp_path, payload), match=match)


def test_a_model_state_that_is_not_a_mapping_is_refused_before_loading(tmp_path):
    payload = _payload(tmp_path)
    payload["objects"]["optimizer"] = [1, 2, 3]
    check_refused(_write(tmp_path, payload), match="expected a state dict")


def test_a_bad_rng_state_of_another_rank_is_refused_on_every_rank(tmp_path):
    payload = _payload(tmp_path)
    payload["rng"]["1"] = dict(_mine(payload), torch=b"\0")
    check_refused(_write(tmp_path, payload), match=r"rank 1\): bad torch CPU RNG state")


# --- failures after something was applied: rolled back -----------------------------------------
def test_optimizer_failing_after_the_model_loaded_rolls_the_model_back(tmp_path):
    payload = _payload(tmp_path)
    groups = payload["objects"]["optimizer"]["param_groups"]
    groups[0]["params"] = groups[0]["params"][:1]  # the optimizer's group size check fails
    error = check_refused(_write(tmp_path, payload), match="loading the state of 'optimizer'")
    assert isinstance(error.__cause__, ValueError)


def test_third_object_failing_rolls_back_the_model_and_the_optimizer(tmp_path):
    payload = _payload(tmp_path)
    payload["objects"]["counter"] = {"count": -1}
    error = check_refused(_write(tmp_path, payload), match="loading the state of 'counter'")
    assert isinstance(error.__cause__, ValueError) and "count must be >= 0" in str(error)


def test_model_mismatch_is_a_mismatch_error_naming_the_path(tmp_path):
    payload = _payload(tmp_path)
    del payload["objects"]["model"]["1.bias"]
    error = check_refused(_write(tmp_path, payload), match="loading the state of 'model'")
    assert isinstance(error, st.CheckpointMismatchError) and error.report is not None


def test_rng_failing_while_applied_rolls_back_everything(tmp_path, monkeypatch):
    """The last line of defence: a part that passes every check but fails to apply (simulated:
    torch.set_rng_state raises) puts back the RNG parts already set and every object."""
    payload = _payload(tmp_path)
    path = _write(tmp_path, payload)

    def refuse(state: torch.Tensor) -> None:
        raise RuntimeError("simulated failure")

    monkeypatch.setattr(torch, "set_rng_state", refuse)
    error = check_refused(path, match="restoring the RNG state failed")
    assert isinstance(error.__cause__, RuntimeError)


def test_a_good_file_still_loads_everything(tmp_path):
    payload = _payload(tmp_path)
    path = _write(tmp_path, payload)
    expected_python = _mine(payload)["python"]
    objects = _objects(1)
    assert st.load_state(path, **objects) == {"epoch": 3}
    assert random.getstate() == expected_python
    assert objects["counter"].count == 0
    saved = payload["objects"]["model"]
    assert all(torch.equal(saved[k], v) for k, v in objects["model"].state_dict().items())


# --- the RNG functions on their own ------------------------------------------------------------
def test_restore_rng_refuses_a_bad_state_and_keeps_the_current_one():
    good = state_mod.capture_rng()
    before = (random.getstate(), torch.get_rng_state().clone())
    bad = dict(good, python=(3, (0,) * 625, None), torch=b"\0" * 3)
    with pytest.raises(st.CheckpointError, match="torch CPU RNG state"):
        state_mod.restore_rng(bad)
    assert random.getstate() == before[0] and torch.equal(torch.get_rng_state(), before[1])
    with pytest.raises(st.CheckpointError, match="expected a mapping"):
        state_mod.restore_rng([1, 2])


def test_check_rng_accepts_what_capture_rng_returns_and_skips_unknown_parts():
    checked = rng_mod.check_rng(dict(state_mod.capture_rng(), mps=b"future part"))
    assert checked.python is not None and checked.torch is not None
    if np is not None:
        assert checked.numpy is not None
    if not torch.cuda.is_available():
        assert rng_mod.check_rng({"cuda": [b"\0" * 16]}).cuda is None  # skipped, as before


def test_cuda_states_are_checked_against_this_machine(monkeypatch):
    """Simulated two-GPU machine (the real path runs in tests/gpu): states of the wrong size
    are refused before anything is set; a different device count is skipped, as before."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(
        torch.cuda, "get_rng_state", lambda *a, **k: torch.zeros(16, dtype=torch.uint8)
    )
    with pytest.raises(st.CheckpointError, match=r"cuda:1 RNG state: got a bytes of length 3"):
        rng_mod.check_rng({"cuda": [bytes(16), bytes(3)]})
    assert rng_mod.check_rng({"cuda": [bytes(16)] * 3}).cuda is None  # 3 devices saved


# --- the DCP layout (one process, no process group): also all or nothing -----------------------
def _has_dcp_state_dict() -> bool:
    try:
        import torch.distributed.checkpoint.state_dict  # noqa: F401 - torch >= 2.2
    except ImportError:
        return False
    return True


@pytest.mark.skipif(not _has_dcp_state_dict(), reason="DCP's get/set_state_dict need torch >= 2.2")
@pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")
def test_dcp_state_with_a_bad_rng_puts_the_model_back(tmp_path):
    pytest.importorskip("torch.distributed.checkpoint")
    objects = _objects(0)
    keys = bytes(rng_mod._NP_KEY_BYTES)
    bad_rng = {"0": dict(state_mod.capture_rng(), numpy=("MT19937", keys, 10**6, 0, 0.0))}
    path = os.path.join(str(tmp_path), "dcp-state")
    models = {"model": objects["model"]}
    state_mod._save_dcp(path, {**objects, "epoch": 1}, models, bad_rng)
    # DCP loads the model and optimizer in place: without the rollback they would change
    check_refused(path, match="numpy RNG state: got 1000000")
