"""Hostile multi-file checkpoints: DCP directories, shard indexes, transformers directories.

Every case is built in the test from real saves and raw bytes (``_dirs.py``) and runs in a
process of its own (``_hostile_child.py``: forked from a pre-imported parent started with an
address-space cap, killed at a deadline). Each case checks that the process did not crash or
hang, that the marker file a payload would write does not exist, that the process state
(``os.system``, builtins, torch's safe globals, a sentinel module) is intact, and that the
outcome is a ``CheckpointError`` or a load of exactly the trusted tensors. Where safetorch
replaces a torch call (DCP's default planner, ``torch.load(weights_only=True)``,
``safetensors.torch.load_file``) the test shows, in a child too, what that call does with the
same input.

``HOSTILE_FRESH=1`` runs every case in a fresh ``python _hostile_child.py SPEC`` instead
(slower: torch's import each time).
"""

from __future__ import annotations

import importlib.util
import json
import os
import resource
import select
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, Iterator, Optional

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hst

from safetorch import _compat

HERE = os.path.dirname(os.path.abspath(__file__))
RUNNER = os.path.join(HERE, "_hostile_child.py")
_spec = importlib.util.spec_from_file_location(
    "_hostile_dirs_builders", os.path.join(HERE, "_dirs.py")
)
assert _spec is not None and _spec.loader is not None
D = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(D)

# DCP directories are written and read with what the release offers (_dirs.save_dcp/load_dcp)
HAS_DCP = _compat.HAS_DCP
DCP_REASON = "needs torch.distributed.checkpoint (public from torch 2.0)"
try:
    import safetensors.torch  # noqa: F401

    HAS_SAFETENSORS = True
except ImportError:  # pragma: no cover
    HAS_SAFETENSORS = False

needs_dcp = pytest.mark.skipif(not HAS_DCP, reason=DCP_REASON)
needs_safetensors = pytest.mark.skipif(
    not HAS_SAFETENSORS,
    reason="needs the safetensors package (pip install 'safetorch[safetensors]')",
)
needs_fifo = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs os.mkfifo")

DEADLINE = 60.0  # seconds a case may take
FIFO_DEADLINE = 30.0  # a FIFO case hangs or not: a shorter deadline keeps the suite bounded
AS_LIMIT = 8 << 30  # address space of the children (CUDA wheels map ~3.3 GB at import)


# --- the child ---------------------------------------------------------------------------------
def _cap() -> None:  # preexec_fn: in the child before exec; its forks inherit the cap
    resource.setrlimit(resource.RLIMIT_AS, (AS_LIMIT, AS_LIMIT))


def _env() -> Dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}


class Children:
    """One pre-imported parent process; each case is a fork of it (see _hostile_child.py)."""

    def __init__(self, log: Path) -> None:
        self.log = log
        self.proc: Optional[subprocess.Popen] = None

    def _start(self) -> None:
        self._log = open(self.log, "ab")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(
            [sys.executable, RUNNER, "--serve"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            env=_env(),
            preexec_fn=_cap,
        )
        self._read(180)

    def _read(self, timeout: float) -> Dict[str, Any]:
        assert self.proc is not None and self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            self.close()
            raise RuntimeError(f"the hostile child parent died; see {self.log}")
        return json.loads(line)

    def run(self, spec: Dict[str, Any], timeout: float) -> Dict[str, Any]:
        if os.environ.get("HOSTILE_FRESH"):
            return self._fresh(spec, timeout)
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"spec": spec, "timeout": timeout}) + "\n")
        self.proc.stdin.flush()
        return self._read(timeout + 60)

    def _fresh(self, spec: Dict[str, Any], timeout: float) -> Dict[str, Any]:
        spec_path = spec["result"] + ".spec.json"
        Path(spec_path).write_text(json.dumps(spec))
        start = time.monotonic()
        try:
            out = subprocess.run(
                [sys.executable, RUNNER, spec_path],
                capture_output=True,
                text=True,
                timeout=timeout + 15,  # plus torch's import
                env=_env(),
                preexec_fn=_cap,
            )
        except subprocess.TimeoutExpired:
            return {"status": "timeout", "wall": time.monotonic() - start, "log": ""}
        wall = time.monotonic() - start
        if out.returncode < 0:
            return {"status": "signal", "signal": -out.returncode, "wall": wall, "log": out.stderr}
        return {"status": "exit", "code": out.returncode, "wall": wall, "log": out.stderr[-3000:]}

    def close(self) -> None:
        if self.proc is not None:
            if self.proc.stdin:
                self.proc.stdin.close()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            if self.proc.stdout:
                self.proc.stdout.close()
            self._log.close()
            self.proc = None


@pytest.fixture(scope="module")
def children(tmp_path_factory) -> Iterator[Children]:
    c = Children(tmp_path_factory.mktemp("hostile_child") / "parent.log")
    yield c
    c.close()


_COUNTER = [0]


@pytest.fixture
def run_case(children, tmp_path):
    """run_case(face, path, model=..., expected=state or None, ...) -> the child's result."""

    def run(face: str, path: Any, *, model: str = "small", expected: Any = None,
            timeout: float = DEADLINE, **spec: Any) -> Dict[str, Any]:  # fmt: skip
        _COUNTER[0] += 1
        n = _COUNTER[0]
        result = str(tmp_path / f"result{n}.json")
        other = spec.pop("expected_other", None)
        full = {"face": face, "path": str(path), "model": model, "result": result, **spec}
        full.setdefault("marker", str(tmp_path / "MARKER"))
        if expected is not None:
            full["expected"] = str(tmp_path / f"expected{n}.pt")
            torch.save(expected, full["expected"])
        if other is not None:
            full["expected_other"] = str(tmp_path / f"expected_other{n}.pt")
            torch.save(other, full["expected_other"])
        status = children.run(full, timeout)
        out: Dict[str, Any] = dict(status)
        if os.path.exists(result):
            out.update(json.loads(Path(result).read_text()))
        out["case"] = f"{face} {os.path.relpath(str(path), str(tmp_path))}"
        print(summary(out))
        return out

    return run


def summary(r: Dict[str, Any]) -> str:
    if r.get("status") != "exit" or r.get("code") != 0:
        return f"[{r.get('case')}] CHILD {r.get('status')} {r.get('signal', r.get('code', ''))} "\
               f"after {r.get('wall')}s; log: {r.get('log', '')[-800:]}"  # fmt: skip
    bits = [f"[{r['case']}] {r.get('outcome')}", f"{r.get('elapsed')}s"]
    if r.get("outcome") == "raised":
        bits.append(f"{r['exc_type']} (CheckpointError={r['checkpoint_error']}, "
                    f"names path={r['names_path']}): {r['message'][:300]}")  # fmt: skip
        if r.get("traceback"):
            bits.append(r["traceback"][-1200:])
    if r.get("outcome") == "exit":
        bits.append(f"exit code {r['exit_code']}: {r['stderr'][-300:].strip()}")
    if r.get("outcome") == "loaded":
        bits.append(f"equal_expected={r.get('equal_expected')} mismatch={r.get('mismatch')}")
    if "equal_expected_other" in r:
        bits.append(f"equal_other={r['equal_expected_other']}")
    bits.append(f"marker={r.get('marker')} fingerprint={r.get('fingerprint')}")
    bits.append(f"unchanged={r.get('unchanged')}")
    return " | ".join(map(str, bits))


# --- assertions ------------------------------------------------------------------------------
def assert_safe(r: Dict[str, Any]) -> None:
    assert r["status"] == "exit" and r["code"] == 0, summary(r)
    assert not r["marker"], "the payload ran: " + summary(r)
    assert not r["fingerprint"], "process state poisoned: " + summary(r)


def assert_refused(r: Dict[str, Any]) -> None:
    assert_safe(r)
    assert r["outcome"] == "raised" and r["checkpoint_error"], summary(r)


def assert_refused_or_exact(r: Dict[str, Any]) -> None:
    assert_safe(r)
    if r["outcome"] == "raised":
        assert r["checkpoint_error"], summary(r)
    else:
        assert r["outcome"] == "loaded" and r["equal_expected"], summary(r)


def assert_loaded_exactly(r: Dict[str, Any]) -> None:
    assert_safe(r)
    assert r["outcome"] == "loaded" and r["equal_expected"], summary(r)


def assert_inspect_refused(r: Dict[str, Any]) -> None:
    assert_safe(r)
    if r["outcome"] == "raised":  # main() let an exception out
        pytest.fail("ckpt inspect raised instead of exiting: " + summary(r))
    assert r["outcome"] == "exit" and r["exit_code"] in (1, 2), summary(r)
    assert "Traceback" not in r["stderr"], summary(r)


# --- builders --------------------------------------------------------------------------------
SEED, OTHER_SEED = 1, 2  # the saved model; another save of the same architecture


def build_dcp(tmp_path: Path, name: str = "dcp", model: str = "small", seed: int = SEED) -> Path:
    d = tmp_path / name
    D.save_dcp(D.trusted_state(model, seed), str(d))
    return d


def build_st_index(tmp_path: Path, name: str = "st_index", seed: int = SEED) -> Path:
    d = tmp_path / name
    D.save_sharded_safetensors(D.trusted_state("small", seed), str(d))
    return d


def build_bin_index(tmp_path: Path, name: str = "bin_index", seed: int = SEED) -> Path:
    d = tmp_path / name
    D.save_sharded_bin(D.trusted_state("small", seed), str(d))
    return d


def build_hf(tmp_path: Path, name: str = "hf", seed: int = SEED) -> Path:
    d = tmp_path / name
    D.save_transformers_dir(D.trusted_state("small", seed), str(d))
    return d


TRUSTED = D.trusted_state("small", SEED)


# --- controls: the untampered layouts load exactly -------------------------------------------
LAYOUTS = {
    "dcp": build_dcp,
    "st_index": build_st_index,
    "bin_index": build_bin_index,
    "hf": build_hf,
}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_untampered_layout_loads_exactly(tmp_path, run_case, layout):
    if layout == "dcp" and not HAS_DCP:
        pytest.skip(DCP_REASON)
    if layout in ("st_index", "hf") and not HAS_SAFETENSORS:
        pytest.skip("needs the safetensors package (pip install 'safetorch[safetensors]')")
    d = LAYOUTS[layout](tmp_path)
    assert_loaded_exactly(run_case("load_state_dict", d, expected=TRUSTED))


# --- 1. code execution from a static DCP directory -------------------------------------------
def _evil_dcp(tmp_path: Path, model: str, container: bool) -> Path:
    sd = D.trusted_state(model, SEED)
    sd["ext._extra_state"] = D.Evil(str(tmp_path / "MARKER"))
    obj: Dict[str, Any] = {"model": sd, "epoch": 3} if container else sd
    d = tmp_path / ("evil_container" if container else "evil")
    D.save_dcp(obj, str(d))
    return d


@needs_dcp
@pytest.mark.parametrize("container", [False, True], ids=["flat", "container"])
@pytest.mark.parametrize("model", ["tensor_extra", "dict_extra"])
def test_dcp_pickled_extra_state_never_runs(tmp_path, run_case, model, container):
    d = _evil_dcp(tmp_path, model, container)
    r = run_case("load_state_dict", d, model=model, expected=D.trusted_state(model, SEED))
    assert_refused(r)  # the extra state is a hostile pickle: refused, never a load
    ri = run_case("inspect", d, model=model)
    assert_safe(ri)


@needs_dcp
@pytest.mark.parametrize("container", [False, True], ids=["flat", "container"])
def test_side_by_side_dcp_default_planner_runs_the_payload(tmp_path, run_case, container):
    """What safetorch replaces: dcp.load with DCP's default planner unpickles the bytes entry
    with weights_only=False, and the payload runs (in the child)."""
    d = _evil_dcp(tmp_path, "tensor_extra", container)
    extra = {"container_key": "model", "container_extra": {"epoch": 0}} if container else {}
    r = run_case("torch_dcp_load", d, model="tensor_extra", **extra)
    assert r["status"] == "exit" and r["code"] == 0, summary(r)
    assert r["marker"], "DCP's default planner did not run the payload: " + summary(r)
    assert "sentinel.state" in r["fingerprint"], summary(r)


# --- 2. .metadata read once ------------------------------------------------------------------
@needs_dcp
def test_dcp_metadata_is_opened_once_per_load(tmp_path, run_case):
    d = build_dcp(tmp_path)
    r = run_case("load_state_dict", d, expected=TRUSTED, count_opens=".metadata")
    assert_loaded_exactly(r)
    assert len(r["opens"]) == 1, f".metadata opened {len(r['opens'])} times: {r['opens']}"


# --- 3. record paths outside the directory ---------------------------------------------------
def _redirect_records(d: Path, where: str) -> None:
    def edit(md: Any) -> None:
        for info in md.storage_data.values():
            info.relative_path = where

    D.rewrite_metadata(str(d), edit)


@needs_dcp
@pytest.mark.parametrize("kind", ["dotdot", "absolute", "symlink"])
def test_dcp_relative_path_outside_the_directory_is_refused(tmp_path, run_case, kind):
    other = build_dcp(tmp_path, "other", seed=OTHER_SEED)  # same layout, other values
    d = build_dcp(tmp_path)
    (distcp,) = D.distcp_files(str(d))
    shutil.copy(other / distcp, tmp_path / "outside.distcp")
    if kind == "dotdot":
        _redirect_records(d, "../outside.distcp")
    elif kind == "absolute":
        _redirect_records(d, str(tmp_path / "outside.distcp"))
    else:
        os.symlink(tmp_path / "outside.distcp", d / "link.distcp")
        _redirect_records(d, "link.distcp")
    other_state = D.trusted_state("small", OTHER_SEED)
    r = run_case("load_state_dict", d, expected=TRUSTED, expected_other=other_state)
    assert_refused(r)
    assert r["unchanged"], summary(r)
    if kind == "dotdot":  # side by side: DCP's own reader reads the other file into the model
        rt = run_case("torch_dcp_load", d, expected_other=other_state)
        assert rt["status"] == "exit" and rt["outcome"] == "loaded", summary(rt)
        assert rt["equal_expected_other"], summary(rt)


# --- 4. FIFOs --------------------------------------------------------------------------------
def _fifo(path: Path) -> None:
    if path.exists():
        path.unlink()
    os.mkfifo(path)


def _fifo_case(tmp_path: Path, where: str) -> Path:
    if where == "dcp_metadata":
        d = build_dcp(tmp_path)
        _fifo(d / ".metadata")
        return d
    if where == "dcp_distcp":
        d = build_dcp(tmp_path)
        _fifo(d / D.distcp_files(str(d))[0])
        return d
    if where == "hf_model_safetensors":
        d = build_hf(tmp_path)
        _fifo(d / "model.safetensors")
        return d
    if where == "index_shard":
        d = build_st_index(tmp_path)
        _fifo(d / "model-00002-of-00002.safetensors")
        return d
    d = build_st_index(tmp_path)
    _fifo(d / "model.safetensors.index.json")
    return d if where == "index_json_in_dir" else d / "model.safetensors.index.json"


FIFO_PLACES = [
    "dcp_metadata",
    "dcp_distcp",
    "hf_model_safetensors",
    "index_shard",
    "index_json_in_dir",
    "index_json_path",
]


@needs_fifo
@pytest.mark.parametrize("face", ["load_state_dict", "inspect"])
@pytest.mark.parametrize("where", FIFO_PLACES)
def test_fifo_in_a_layout_is_refused_without_hanging(tmp_path, run_case, where, face):
    if where.startswith("dcp") and not HAS_DCP:
        pytest.skip(DCP_REASON)
    path = _fifo_case(tmp_path, where)
    r = run_case(face, path, expected=TRUSTED, timeout=FIFO_DEADLINE)
    assert r["status"] != "timeout", f"hung on a FIFO ({where}): " + summary(r)
    if face == "inspect":
        assert_inspect_refused(r)
    else:
        assert_refused(r)


# --- 5. DCP chunks that do not cover a tensor ------------------------------------------------
WIDE = D.trusted_state("wide", SEED)


def _two_chunk(tmp_path: Path) -> Path:
    d = tmp_path / "two_chunk"
    D.save_two_chunk_dcp(WIDE, str(d))
    return d


@needs_dcp
def test_two_chunk_dcp_control_loads_exactly(tmp_path, run_case):
    assert_loaded_exactly(run_case("load_state_dict", _two_chunk(tmp_path), model="wide",
                                   expected=WIDE))  # fmt: skip
    r = run_case("torch_dcp_load", _two_chunk(tmp_path / "t"), model="wide", expected=WIDE)
    assert r["outcome"] == "loaded" and r["equal_expected"], summary(r)  # DCP agrees


def _edit_chunks(d: Path, how: str) -> None:
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex

    def edit(md: Any) -> None:
        tmd = md.state_dict_metadata["lin.weight"]
        if how == "drop_chunk":
            tmd.chunks.pop()
        elif how == "shrink_chunk":
            tmd.chunks[1] = ChunkStorageMetadata(offsets=torch.Size([4, 0]),
                                                 sizes=torch.Size([3, 8]))  # fmt: skip
        elif how == "overlap_same_volume":  # rows 0-3 and 3-6: 8 rows' volume, row 7 missing
            tmd.chunks[1] = ChunkStorageMetadata(offsets=torch.Size([3, 0]),
                                                 sizes=torch.Size([4, 8]))  # fmt: skip
            info = md.storage_data.pop(MetadataIndex("lin.weight", [4, 0]))
            md.storage_data[MetadataIndex("lin.weight", [3, 0])] = info
        elif how == "drop_record":
            md.storage_data.pop(MetadataIndex("lin.weight", [4, 0]))

    D.rewrite_metadata(str(d), edit)


CHUNK_EDITS = ["drop_chunk", "shrink_chunk", "overlap_same_volume", "drop_record"]


@needs_dcp
@pytest.mark.parametrize("how", CHUNK_EDITS)
def test_dcp_chunks_not_covering_the_tensor_are_refused(tmp_path, run_case, how):
    d = _two_chunk(tmp_path)
    _edit_chunks(d, how)
    r = run_case("load_state_dict", d, model="wide", expected=WIDE)
    assert_refused(r)
    assert r["unchanged"], summary(r)


@needs_dcp
def test_side_by_side_dcp_loads_a_dropped_chunk_silently(tmp_path, run_case):
    """DCP's default planner with a chunk dropped from the metadata: it reports success and
    the uncovered rows keep the target's initial values."""
    d = _two_chunk(tmp_path)
    _edit_chunks(d, "drop_chunk")
    r = run_case("torch_dcp_load", d, model="wide", expected=WIDE)
    assert r["status"] == "exit" and r["code"] == 0, summary(r)
    assert r["outcome"] == "loaded" and not r["equal_expected"], summary(r)


# --- 6. shard indexes --------------------------------------------------------------------------
def _index_case(tmp_path: Path, kind: str) -> Path:
    d = build_st_index(tmp_path)
    name = "model.safetensors.index.json"
    index = D.read_index(str(d), name)
    wm = index["weight_map"]
    second = "model-00002-of-00002.safetensors"
    other = D.trusted_state("small", OTHER_SEED)
    outside = tmp_path / "outside.safetensors"
    outside.write_bytes(D.safetensors_bytes({k: other[k] for k in wm if wm[k] == second}))
    if kind == "dotdot":
        wm = {k: ("../outside.safetensors" if v == second else v) for k, v in wm.items()}
    elif kind == "absolute":
        wm = {k: (str(outside) if v == second else v) for k, v in wm.items()}
    elif kind == "symlink":
        (d / second).unlink()
        os.symlink(outside, d / second)
    elif kind == "missing_shard":
        (d / second).unlink()
    elif kind == "weight_map_list":
        wm = sorted(wm.items())
    elif kind == "key_in_wrong_shard":
        first_key = next(k for k, v in wm.items() if v != second)
        wm = {**wm, first_key: second}
    elif kind == "weight_map_null":
        wm = None
    elif kind == "shard_is_directory":
        (d / second).unlink()
        (d / second).mkdir()
    D.write_index(str(d), name, wm)
    return d


INDEX_CASES = [
    "dotdot",
    "absolute",
    "symlink",
    "missing_shard",
    "weight_map_list",
    "weight_map_null",
    "key_in_wrong_shard",
    "shard_is_directory",
]


@pytest.mark.parametrize("face", ["load_state_dict", "inspect"])
@pytest.mark.parametrize("kind", INDEX_CASES)
def test_hostile_shard_index_is_refused(tmp_path, run_case, kind, face):
    d = _index_case(tmp_path, kind)
    other = D.trusted_state("small", OTHER_SEED)
    r = run_case(face, d, expected=TRUSTED, expected_other=other)
    if face == "inspect":
        assert_inspect_refused(r)
    else:
        assert_refused(r)
        assert r["unchanged"], summary(r)


@needs_safetensors
def test_twenty_thousand_shards_load_within_the_deadline(tmp_path, run_case):
    state = D.trusted_state("many", SEED)
    d = tmp_path / "many"
    D.save_many_shards(state, str(d))
    r = run_case("load_state_dict", d, model="many", expected=state)
    assert r["status"] != "timeout", f"20k shards: no answer within {DEADLINE}s"
    assert_loaded_exactly(r)
    print(f"20k shards loaded in {r['elapsed']}s")


# --- 7. safetensors headers ------------------------------------------------------------------
def _bad_safetensors(kind: str) -> bytes:
    sd = TRUSTED
    header = D.safetensors_header(sd)
    good = D.safetensors_bytes(sd)
    if kind == "offsets_beyond_file":
        last = max((k for k in header if k != "__metadata__"),
                   key=lambda k: header[k]["data_offsets"][1])  # fmt: skip
        start, end = header[last]["data_offsets"]
        header[last]["data_offsets"] = [start + 4096, end + 4096]
        return D.safetensors_bytes(sd, header)
    if kind == "overlapping_offsets":  # bn.bias reads bn.weight's bytes (same size)
        header["bn.bias"]["data_offsets"] = list(header["bn.weight"]["data_offsets"])
        return D.safetensors_bytes(sd, header)
    if kind == "huge_header_length":
        return (1 << 62).to_bytes(8, "little") + good[8:]
    if kind == "header_length_past_file":
        return (len(good) + 100).to_bytes(8, "little") + good[8:]
    if kind == "truncated":
        return good[:-7]
    if kind == "unknown_dtype":
        header["a.weight"]["dtype"] = "Q9"
        return D.safetensors_bytes(sd, header)
    if kind == "shape_disagrees_with_offsets":
        header["a.weight"]["shape"] = [4, 4]
        return D.safetensors_bytes(sd, header)
    if kind == "negative_offset":
        header["a.bias"]["data_offsets"] = [-4, 8]
        return D.safetensors_bytes(sd, header)
    raise AssertionError(kind)


ST_CASES = [
    "offsets_beyond_file",
    "overlapping_offsets",
    "huge_header_length",
    "header_length_past_file",
    "truncated",
    "unknown_dtype",
    "shape_disagrees_with_offsets",
    "negative_offset",
]


@pytest.mark.parametrize("kind", ST_CASES)
def test_hostile_safetensors_header_is_refused(tmp_path, run_case, kind):
    d = build_hf(tmp_path)
    (d / "model.safetensors").write_bytes(_bad_safetensors(kind))
    r = run_case("load_state_dict", d, expected=TRUSTED)
    assert_refused(r)
    assert r["unchanged"], summary(r)
    assert_inspect_refused(run_case("inspect", d))


@needs_safetensors
@pytest.mark.parametrize("kind", ST_CASES)
def test_side_by_side_safetensors_load_file_refuses(tmp_path, run_case, kind):
    path = tmp_path / "model.safetensors"
    path.write_bytes(_bad_safetensors(kind))
    r = run_case("safetensors_load_file", path)
    assert r["status"] == "exit" and r["code"] == 0, summary(r)
    assert r["outcome"] == "raised", "safetensors.torch.load_file accepted it: " + summary(r)


# --- 8. a .bin shard with a storage record shorter than its storage ----------------------------
@pytest.mark.parametrize("layout", ["bin_index_shard", "pytorch_model_bin"])
def test_short_storage_record_is_refused(tmp_path, run_case, layout):
    if layout == "bin_index_shard":
        d = build_bin_index(tmp_path)
        victim = d / "pytorch_model-00001-of-00002.bin"
    else:
        d = tmp_path / "hf_bin"
        d.mkdir()
        (d / "config.json").write_text("{}")
        victim = d / "pytorch_model.bin"
        torch.save(TRUSTED, victim)
    assert D.truncate_storage_record(str(victim)), "no */data/0 record"
    # side by side: torch refuses the file where its reader compares a storage with its record
    # (pytorch#165553, Oct 2025); earlier releases load it, reading past the record. safetorch
    # refuses it on every torch.
    rt = run_case("torch_load", victim)
    assert rt["status"] == "exit" and rt["outcome"] in ("raised", "loaded"), summary(rt)
    r = run_case("load_state_dict", d, expected=TRUSTED)
    assert_refused(r)
    assert r["unchanged"], summary(r)


def test_rewritten_zip_control_still_loads(tmp_path):
    """The zip rewrite itself (no truncation) keeps a file torch reads: the refusals above are
    about the short record, not the rewrite."""
    path = tmp_path / "x.bin"
    torch.save(TRUSTED, path)
    D.rewrite_zip(str(path), lambda name, data: None)
    loaded = torch.load(path, weights_only=True)
    assert all(torch.equal(loaded[k], TRUSTED[k]) for k in TRUSTED)


# --- 9. a corrupt second shard leaves the model unchanged --------------------------------------
def _corrupt_second(tmp_path: Path, how: str) -> Path:
    if how.startswith("bin"):
        d = build_bin_index(tmp_path)
        second = d / "pytorch_model-00002-of-00002.bin"
        if how == "bin_truncated_zip":
            second.write_bytes(second.read_bytes()[:-100])
        else:
            D.truncate_storage_record(str(second))
        return d
    d = build_st_index(tmp_path)
    second = d / "model-00002-of-00002.safetensors"
    data = second.read_bytes()
    if how == "st_truncated":
        second.write_bytes(data[:-5])
    elif how == "st_bad_json":
        second.write_bytes(data[:8] + b"[" + data[9:])
    elif how == "st_wrong_shape":
        sd = {k: TRUSTED[k] for k in D.read_index(str(d), "model.safetensors.index.json")
              ["weight_map"] if k in TRUSTED and k.startswith("b.")}  # fmt: skip
        header = D.safetensors_header(D.split(TRUSTED, 2)[1])
        key = next(iter(sd))
        header[key]["shape"] = list(reversed(header[key]["shape"]))
        second.write_bytes(D.safetensors_bytes(D.split(TRUSTED, 2)[1], header))
    return d


SECOND_SHARD = ["st_truncated", "st_bad_json", "st_wrong_shape", "bin_truncated_zip",
                "bin_short_record"]  # fmt: skip


@pytest.mark.parametrize("how", SECOND_SHARD)
def test_corrupt_second_shard_leaves_the_model_unchanged(tmp_path, run_case, how):
    d = _corrupt_second(tmp_path, how)
    r = run_case("load_state_dict", d, expected=TRUSTED)
    assert_refused(r)
    assert r["unchanged"], "the model changed before the refusal: " + summary(r)


# --- 10. valid layouts that must load ----------------------------------------------------------
AVERAGED = D.trusted_state("averaged", SEED)
INNER = {k[len("module.") :]: v for k, v in AVERAGED.items() if k.startswith("module.")}


@pytest.mark.parametrize("target", ["averaged", "small"])
@pytest.mark.parametrize("layout", ["safetensors_dir", "dcp"])
def test_averaged_model_state_loads(tmp_path, run_case, layout, target):
    d = tmp_path / "avg"
    if layout == "dcp":
        if not HAS_DCP:
            pytest.skip(DCP_REASON)
        D.save_dcp(AVERAGED, str(d))
    else:
        if not HAS_SAFETENSORS:
            pytest.skip("needs the safetensors package (pip install 'safetorch[safetensors]')")
        d.mkdir()
        (d / "model.safetensors").write_bytes(D.safetensors_bytes(AVERAGED))
    assert AVERAGED["n_averaged"].item() == 3
    expected = AVERAGED if target == "averaged" else INNER
    r = run_case("load_state_dict", d, model=target, expected=expected,
                 kwargs={} if target == "averaged" else {"strict": False})  # fmt: skip
    assert_loaded_exactly(r)


@needs_dcp
def test_dict_extra_state_in_dcp_loads_or_is_clearly_refused(tmp_path, run_case):
    """DCP flattens a dict extra state and pickles its non-tensor values: safetorch either
    reads them through the restricted unpickler (exact state) or refuses with a
    CheckpointError; either way nothing runs."""
    state = D.trusted_state("dict_extra", SEED)
    d = build_dcp(tmp_path, model="dict_extra")
    r = run_case("load_state_dict", d, model="dict_extra", expected=state)
    assert_refused_or_exact(r)
    print("dict extra state through DCP:", "loaded exactly" if r["outcome"] == "loaded"
          else f"refused: {r['exc_type']}: {r['message'][:200]}")  # fmt: skip


# --- fuzz ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def fuzz_bases(tmp_path_factory) -> Dict[str, Path]:
    root = tmp_path_factory.mktemp("fuzz_bases")
    bases = {"st_index": build_st_index(root), "bin_index": build_bin_index(root),
             "hf": build_hf(root)}  # fmt: skip
    if HAS_DCP:
        bases["dcp"] = build_dcp(root)
    expected = root / "expected.pt"
    torch.save(TRUSTED, expected)
    return {**bases, "_expected": expected, "_root": root}


MUTATION = hst.tuples(
    hst.integers(0, 50),
    hst.sampled_from(["flip", "truncate", "insert", "overwrite"]),
    hst.floats(0, 1, allow_nan=False),
    hst.binary(min_size=1, max_size=8).map(bytes.hex),
)


@settings(max_examples=50, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])  # fmt: skip
@given(layout=hst.sampled_from(["dcp", "st_index", "bin_index", "hf"]),
       mutations=hst.lists(MUTATION, min_size=6, max_size=12))  # fmt: skip
def test_fuzz_mutated_layouts_refuse_or_load_exactly(children, fuzz_bases, layout, mutations):
    if layout not in fuzz_bases:
        pytest.skip(DCP_REASON)
    root: Path = fuzz_bases["_root"]
    _COUNTER[0] += 1
    scratch = root / f"scratch{_COUNTER[0]}"
    scratch.mkdir()
    spec = {
        "face": "fuzz",
        "base": str(fuzz_bases[layout]),
        "expected": str(fuzz_bases["_expected"]),
        "mutations": [list(m) for m in mutations],
        "scratch": str(scratch),
        "marker": str(root / "MARKER"),
        "result": str(scratch / "result.json"),
    }
    status = children.run(spec, DEADLINE)
    assert status["status"] == "exit" and status["code"] == 0, f"{layout}: {status}"
    result = json.loads(Path(spec["result"]).read_text())
    shutil.rmtree(scratch, ignore_errors=True)
    assert not result["bad"], f"{layout}: {json.dumps(result['bad'], indent=1)[:4000]}"
