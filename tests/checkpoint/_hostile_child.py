"""Runs one hostile-directory case in a process of its own and writes what happened as JSON.

Usage:
    python _hostile_child.py SPEC.json   one case in this fresh process
    python _hostile_child.py --serve     a pre-imported parent (torch, safetorch, DCP loaded
                                         once): reads one JSON request per line on stdin,
                                         forks a process per case, kills it at the deadline,
                                         answers one JSON line per request on stdout

Started by ``test_hostile_dirs.py`` with an address-space cap (forks inherit it). A case is a
spec: ``face`` (``load_state_dict``, ``inspect``, ``torch_dcp_load``, ``torch_load``,
``safetensors_load_file``, ``fuzz``), ``model`` and ``seed`` (the target, built by
``_dirs.make_model``), ``path``, ``marker``, ``expected`` (a torch.save file of the trusted
tensors) and ``result`` (where the JSON goes). The result records the outcome (loaded / raised /
exit code), the exception's type, MRO and message, whether the message names the path,
whether the marker exists, the process-state fingerprint differences, and whether the model
holds exactly the expected tensors (or is unchanged after a refusal).
"""

from __future__ import annotations

import builtins
import contextlib
import io
import json
import os
import pickle
import shutil
import signal
import sys
import tempfile
import time
import traceback
import types
from typing import Any, Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)


# --- process-state fingerprint ---------------------------------------------------------------
def _install_sentinel() -> types.ModuleType:
    import _dirs

    mod = types.ModuleType(_dirs.SENTINEL)
    mod.state = "intact"  # type: ignore[attr-defined]
    sys.modules[_dirs.SENTINEL] = mod
    return mod


def fingerprint() -> Dict[str, str]:
    import _dirs
    import torch

    sentinel = sys.modules.get(_dirs.SENTINEL)
    safe = getattr(torch.serialization, "get_safe_globals", list)()
    return {
        "os.system": repr(id(os.system)),
        "os.popen": repr(id(os.popen)),
        "builtins.exec": repr(id(builtins.exec)),
        "builtins.eval": repr(id(builtins.eval)),
        "builtins.open": repr(id(builtins.open)),
        "builtins.__import__": repr(id(builtins.__import__)),
        "builtins names": repr(sorted(vars(builtins))),
        "pickle.Unpickler": repr(id(pickle.Unpickler)),
        "torch.load": repr(id(torch.load)),
        "_rebuild_tensor_v2.__defaults__": repr(torch._utils._rebuild_tensor_v2.__defaults__),
        "safe_globals": repr(sorted(map(repr, safe))),
        "sentinel.state": repr(getattr(sentinel, "state", None)),
    }


def _diff(before: Dict[str, str], after: Dict[str, str]) -> List[str]:
    return [k for k in before if before[k] != after.get(k)]


# --- comparing states --------------------------------------------------------------------------
def _same(a: Any, b: Any) -> bool:
    import torch

    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and torch.equal(a.detach().cpu(), b.detach().cpu())
        )
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def _mismatch(state: Dict[str, Any], expected: Dict[str, Any]) -> List[str]:
    out = [f"missing {k}" for k in expected if k not in state]
    out += [f"extra {k}" for k in state if k not in expected]
    out += [f"differs {k}" for k in expected if k in state and not _same(state[k], expected[k])]
    return out[:20]


def _snapshot(model: Any) -> Dict[str, Any]:
    import torch

    return {
        k: v.detach().clone() if isinstance(v, torch.Tensor) else v
        for k, v in model.state_dict().items()
    }


# --- opens of a file name --------------------------------------------------------------------
def _count_opens(suffix: str, seen: List[str]) -> None:
    """Count every open of a path ending in ``suffix`` (builtins.open, io.open, os.open)."""
    real_open, real_os_open = builtins.open, os.open

    def _note(path: Any) -> None:
        try:
            p = os.fsdecode(path) if not isinstance(path, int) else ""
        except TypeError:
            p = ""
        if p.endswith(suffix):
            seen.append(p)

    def counting_open(file: Any, *args: Any, **kwargs: Any) -> Any:
        _note(file)
        return real_open(file, *args, **kwargs)

    def counting_os_open(path: Any, *args: Any, **kwargs: Any) -> Any:
        _note(path)
        return real_os_open(path, *args, **kwargs)

    builtins.open = counting_open
    io.open = counting_open
    os.open = counting_os_open


# --- faces -----------------------------------------------------------------------------------
def _exc_info(exc: BaseException, path: str) -> Dict[str, Any]:
    from safetorch.errors import CheckpointError

    message = str(exc)
    return {
        "outcome": "raised",
        "exc_type": type(exc).__name__,
        "exc_mro": [c.__name__ for c in type(exc).__mro__],
        "checkpoint_error": isinstance(exc, CheckpointError),
        "message": message[:3000],
        "names_path": bool(path) and (path in message or os.path.basename(path) in message),
        "traceback": "" if isinstance(exc, CheckpointError) else traceback.format_exc()[-4000:],
    }


def _face(spec: Dict[str, Any], model: Any) -> Dict[str, Any]:
    import torch

    face, path = spec["face"], spec.get("path", "")
    kwargs = spec.get("kwargs", {})
    out: Dict[str, Any] = {}
    try:
        if face == "load_state_dict":
            import safetorch as st

            report = st.load_state_dict(model, path, **kwargs)
            out = {"outcome": "loaded", "report": str(report)[:1500]}
        elif face == "inspect":
            from safetorch._cli import main

            so, se = io.StringIO(), io.StringIO()
            with contextlib.redirect_stdout(so), contextlib.redirect_stderr(se):
                try:
                    code = main(["ckpt", "inspect", path])
                except SystemExit as exc:
                    code = exc.code if isinstance(exc.code, int) else 1
            err = se.getvalue()
            out = {
                "outcome": "exit",
                "exit_code": code,
                "stderr": err[-3000:],
                "stdout": so.getvalue()[-1500:],
                "names_path": path in err or os.path.basename(path) in err,
            }
        elif face == "torch_dcp_load":
            import _dirs

            sd = model.state_dict()
            target = {spec["container_key"]: sd} if spec.get("container_key") else sd
            if spec.get("container_key"):
                target.update(spec.get("container_extra", {}))
            _dirs.load_dcp(target, path)  # DCP's default planner and reader
            model.load_state_dict(sd)
            out = {"outcome": "loaded"}
        elif face == "torch_load":
            obj = torch.load(path, weights_only=True)
            out = {"outcome": "loaded", "value": repr(type(obj).__name__)}
        elif face == "safetensors_load_file":
            import safetensors.torch

            obj = safetensors.torch.load_file(path)
            out = {"outcome": "loaded", "keys": sorted(obj)[:20]}
        else:
            raise ValueError(f"unknown face {face!r}")
    except Exception as exc:  # classified below: CheckpointError or not
        out = _exc_info(exc, path)
    return out


def _run_one(spec: Dict[str, Any]) -> Dict[str, Any]:
    import _dirs
    import torch

    model = _dirs.make_model(spec.get("model", "small"), spec.get("seed", 1000))
    before_state = _snapshot(model)
    seen: List[str] = []
    if spec.get("count_opens"):
        _count_opens(spec["count_opens"], seen)
    before = fingerprint()
    start = time.monotonic()
    out = _face(spec, model)
    out["elapsed"] = round(time.monotonic() - start, 3)
    after = fingerprint()
    out["fingerprint"] = _diff(before, after)
    marker = spec.get("marker")
    out["marker"] = bool(marker) and os.path.exists(marker)
    if spec.get("count_opens"):
        out["opens"] = seen
    state = _snapshot(model)
    out["unchanged"] = not _mismatch(state, before_state)
    for name in ("expected", "expected_other"):
        if spec.get(name):
            expected = torch.load(spec[name], weights_only=True)
            mismatch = _mismatch(state, expected)
            out[f"equal_{name}"] = not mismatch
            if name == "expected":
                out["mismatch"] = mismatch
    return out


# --- fuzz: many mutations of one base directory in this one process -------------------------
def _mutate(data: bytes, op: str, pos: float, blob: bytes) -> bytes:
    i = min(int(pos * len(data)), max(len(data) - 1, 0))
    if op == "flip" and data:
        b = bytearray(data)
        for k, x in enumerate(blob or b"\xff"):
            if i + k < len(b):
                b[i + k] ^= x or 0x80
        return bytes(b)
    if op == "truncate":
        return data[:i]
    if op == "insert":
        return data[:i] + blob + data[i:]
    if op == "overwrite":
        return data[:i] + blob + data[i + len(blob) :]
    return data


def _reference(target: str, model_name: str) -> Dict[str, Any]:
    """What the trusted readers safetorch replaces give for the same (mutated) bytes: DCP's
    default planner (the small model has no bytes entries), torch.load(weights_only=True)
    per .bin shard, safetensors.torch.load_file per .safetensors file."""

    import _dirs
    import torch

    names = sorted(os.listdir(target))
    if ".metadata" in names:
        sd = _dirs.make_model(model_name, 0).state_dict()
        _dirs.load_dcp(sd, target)
        return {k: v.detach().clone() for k, v in sd.items()}
    out: Dict[str, Any] = {}
    for n in names:
        p = os.path.join(target, n)
        if n.endswith(".safetensors"):
            import safetensors.torch

            out.update(safetensors.torch.load_file(p))
        elif n.endswith(".bin"):
            out.update(torch.load(p, weights_only=True))
    return out


def _run_fuzz(spec: Dict[str, Any]) -> Dict[str, Any]:
    import _dirs
    import torch

    import safetorch as st
    from safetorch.errors import CheckpointError

    expected = torch.load(spec["expected"], weights_only=True)
    base = spec["base"]
    files = sorted(
        os.path.relpath(os.path.join(d, n), base) for d, _, ns in os.walk(base) for n in ns
    )
    results = []
    bad = []
    for n, (file_pick, op, pos, blob_hex) in enumerate(spec["mutations"]):
        work = tempfile.mkdtemp(dir=spec["scratch"])
        target = os.path.join(work, "ckpt")
        shutil.copytree(base, target)
        rel = files[file_pick % len(files)]
        full = os.path.join(target, rel)
        with open(full, "rb") as fh:
            data = fh.read()
        new = _mutate(data, op, pos, bytes.fromhex(blob_hex))
        with open(full, "wb") as fh:
            fh.write(new)
        model = _dirs.make_model(spec.get("model", "small"), 1000 + n)
        before = fingerprint()
        entry: Dict[str, Any] = {"file": rel, "op": op, "pos": pos, "changed": new != data}
        try:
            st.load_state_dict(model, target)
            state = _snapshot(model)
            mismatch = _mismatch(state, expected)
            entry.update(outcome="loaded", mismatch=mismatch)
            if mismatch:  # a flipped data byte: then exactly what the trusted reader gives
                try:
                    ref = _reference(target, spec.get("model", "small"))
                    ref_mismatch = [m for m in _mismatch(state, ref) if not m.startswith("extra")]
                except Exception as exc:
                    ref_mismatch = [f"the trusted reader refuses: {type(exc).__name__}: {exc}"]
                entry["reference_mismatch"] = ref_mismatch[:5]
                if ref_mismatch:
                    bad.append(entry)
        except CheckpointError as exc:
            entry.update(outcome="refused", exc_type=type(exc).__name__)
        except Exception as exc:
            entry.update(
                outcome="other",
                exc_type=type(exc).__name__,
                message=str(exc)[:500],
                traceback=traceback.format_exc()[-2000:],
            )
            bad.append(entry)
        diff = _diff(before, fingerprint())
        if diff or (spec.get("marker") and os.path.exists(spec["marker"])):
            entry.update(poisoned=diff)
            bad.append(entry)
        results.append(entry)
        shutil.rmtree(work, ignore_errors=True)
    return {"outcome": "fuzz", "results": results, "bad": bad[:10]}


def _preload() -> None:
    """What a case may import lazily, imported before the fingerprint (importing
    torch.distributed.tensor registers DTensor's classes as torch safe globals)."""
    import torch  # noqa: F401

    try:
        import torch.distributed.checkpoint  # noqa: F401
    except ImportError:  # torch < 2.0 has no DCP
        pass

    try:
        import torch.distributed.tensor  # noqa: F401
    except ImportError:
        pass
    import _dirs  # noqa: F401

    import safetorch  # noqa: F401
    import safetorch._cli  # noqa: F401

    try:
        import safetensors.torch  # noqa: F401
    except ImportError:
        pass


def run_case(spec: Dict[str, Any]) -> Dict[str, Any]:
    _preload()
    _install_sentinel()
    if spec["face"] == "fuzz":
        out = _run_fuzz(spec)
        out["fingerprint"], out["marker"] = [], False
        return out
    return _run_one(spec)


def _write(path: str, obj: Dict[str, Any]) -> None:
    tmp = path + ".tmp"
    with builtins.open(tmp, "w") as fh:
        json.dump(obj, fh, default=repr)
    os.replace(tmp, path)


def main_one(spec_path: str) -> int:
    with open(spec_path) as fh:
        spec = json.load(fh)
    _write(spec["result"], run_case(spec))
    return 0


# --- the pre-imported parent -----------------------------------------------------------------
def _forked(spec: Dict[str, Any], timeout: float) -> Dict[str, Any]:
    log = spec["result"] + ".log"
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:  # the case's own process
        code = 3
        try:
            fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            os.setsid()
            _write(spec["result"], run_case(spec))
            code = 0
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    status = None
    while time.monotonic() - start < timeout:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.02)
    else:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        return {"status": "timeout", "wall": round(time.monotonic() - start, 2), "log": _tail(log)}
    wall = round(time.monotonic() - start, 2)
    if os.WIFSIGNALED(status):
        return {"status": "signal", "signal": os.WTERMSIG(status), "wall": wall, "log": _tail(log)}
    return {"status": "exit", "code": os.WEXITSTATUS(status), "wall": wall, "log": _tail(log)}


def _tail(path: str) -> str:
    try:
        with open(path, errors="replace") as fh:
            return fh.read()[-3000:]
    except OSError:
        return ""


def serve() -> int:
    proto = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    _preload()  # imported once, forked into every case
    proto.write(json.dumps({"ready": True}) + "\n")
    proto.flush()
    for line in sys.stdin:
        request = json.loads(line)
        answer = _forked(request["spec"], request["timeout"])
        proto.write(json.dumps(answer) + "\n")
        proto.flush()
    return 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--serve"]:
        sys.exit(serve())
    sys.exit(main_one(sys.argv[1]))
