"""Exact resume on 2 gloo ranks (FSDP2: a DCP directory; DDP: one file), and N -> 1 loading."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

import safetorch as st

HERE = os.path.dirname(os.path.abspath(__file__))


def _has_fsdp2() -> bool:
    """FSDP2 that runs on CPU: fully_shard, and a CPU stream with record_event (FSDP2 records
    events on its all-gather stream; the CPU no-ops came in pytorch#145935, torch 2.7)."""
    import importlib

    cpu_stream = getattr(getattr(torch, "cpu", None), "Stream", None)
    if cpu_stream is None or not hasattr(cpu_stream, "record_event"):
        return False
    for module in ("torch.distributed.fsdp", "torch.distributed._composable.fsdp"):
        try:
            if hasattr(importlib.import_module(module), "fully_shard"):
                return True
        except Exception:  # torch 1.13 on Python 3.11: ValueError, a dataclass with a mutable
            continue  # default in torch.distributed._shard (Python 3.11 refuses it)
    return False


def _run(tmp_path, kind):
    out = subprocess.run(
        [sys.executable, os.path.join(HERE, "_resume_worker.py"), str(tmp_path), kind],
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]


@pytest.mark.dist
@pytest.mark.slow
@pytest.mark.skipif(not _has_fsdp2(), reason="FSDP2 (fully_shard) on CPU needs torch >= 2.7")
def test_fsdp2_two_ranks_resume_bit_identical_and_load_on_one(tmp_path):
    results = _run(tmp_path, "fsdp2")
    for r in results:
        assert r["is_dir"], r  # a DCP directory, each rank wrote its shards
        assert r["resumed"] == r["reference"], r
        assert r["params_equal"] and r["extras"] == {"epoch": 3}
        assert r["weights_loaded"]  # st.load_state_dict of the DCP state into an FSDP2 model
        assert r["hook_loaded"]  # ... and into one with a load hook, which runs
    assert results[0]["reference"] != results[1]["reference"]  # per-rank data and RNG
    files = os.listdir(tmp_path / "state")
    assert ".metadata" in files and sum(f.endswith(".distcp") for f in files) == 2
    # saved on 2 ranks, loaded on 1 into a plain model (weights, and the whole state)
    torch.manual_seed(3)
    plain = torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.Dropout(0.25), torch.nn.ReLU(), torch.nn.Linear(16, 4)
    )
    report = st.load_state_dict(plain, tmp_path / "state")
    assert report.ok and report.source_key == "model" and "DCP" in report.source
    opt = torch.optim.Adam(plain.parameters(), lr=1.0)
    sched = torch.optim.lr_scheduler.StepLR(opt, 2, 0.5)
    extras = st.load_state(tmp_path / "state", model=plain, optimizer=opt, scheduler=sched)
    assert extras == {"epoch": 3} and sched.last_epoch == 3
    assert opt.param_groups[0]["lr"] == pytest.approx(0.005)
    assert len(opt.state) == 4  # Adam moments of every parameter


@pytest.mark.dist
@pytest.mark.slow
def test_ddp_two_ranks_resume_bit_identical_one_file(tmp_path):
    results = _run(tmp_path, "ddp")
    for r in results:
        assert not r["is_dir"] and r["resumed"] == r["reference"] and r["params_equal"], r
        assert r["weights_loaded"]  # st.load_state_dict of the state file into a DDP model
        assert r["hook_loaded"]
    saved = st.load(tmp_path / "state.pt")
    assert sorted(saved["rng"]) == ["0", "1"]  # each rank's RNG
    assert "module." not in "".join(saved["objects"]["model"])  # saved unwrapped
