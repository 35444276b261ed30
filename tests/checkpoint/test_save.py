"""save_checkpoint / CheckpointSaver: atomicity (SIGKILL), rank-0 writes, best/last index."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
import torch

import safetorch as st
from safetorch import _atomic, _compat

HERE = os.path.dirname(os.path.abspath(__file__))


class _Unpicklable:
    def __reduce__(self):
        raise RuntimeError("boom while pickling")


def test_atomic_replace_keeps_previous_on_failure(tmp_path):
    path = tmp_path / "c.pt"
    st.save_checkpoint({"epoch": 1, "w": torch.ones(3)}, path)
    with pytest.raises(RuntimeError, match="boom"):
        st.save_checkpoint({"epoch": 2, "w": torch.zeros(3), "bad": _Unpicklable()}, path)
    assert st.load(path)["epoch"] == 1
    assert sorted(os.listdir(tmp_path)) == ["c.pt"]  # no temp file left behind


def test_temp_file_is_in_the_target_directory(tmp_path, monkeypatch):
    seen = []
    real = _atomic.tempfile.mkstemp
    monkeypatch.setattr(
        _atomic.tempfile, "mkstemp", lambda **kw: seen.append(kw["dir"]) or real(**kw)
    )
    st.save_checkpoint({"w": torch.ones(1)}, tmp_path / "c.pt")
    assert seen == [str(tmp_path)]


def test_file_mode_follows_umask(tmp_path):
    path = st.save_checkpoint({"w": torch.ones(1)}, tmp_path / "c.pt")
    mask = os.umask(0)
    os.umask(mask)
    assert os.stat(path).st_mode & 0o777 == 0o666 & ~mask


def _dp_compiled(m):
    return torch.nn.DataParallel(torch.compile(m))


@pytest.mark.parametrize(
    "wrap",
    [
        pytest.param(torch.nn.DataParallel, id="dp"),
        pytest.param(
            lambda m: torch.nn.DataParallel(torch.optim.swa_utils.AveragedModel(m)),
            id="dp_averaged",
        ),
        pytest.param(
            _dp_compiled,
            id="dp_compile",
            marks=pytest.mark.skipif(
                not _compat.HAS_COMPILE, reason="torch.compile (OptimizedModule) needs torch 2.0"
            ),
        ),
    ],
)
def test_unwrap_saves_canonical_keys(tmp_path, wrap):
    dp = wrap(torch.nn.Linear(2, 2))
    st.save_checkpoint({"model": dp, "epoch": 1}, tmp_path / "c.pt", unwrap=True)
    out = st.load(tmp_path / "c.pt")
    assert sorted(out["model"]) == ["bias", "weight"] and out["epoch"] == 1


@pytest.mark.slow
def test_sigkill_during_save_leaves_previous_checkpoint(tmp_path):
    """24 trials: a child saving in a loop is SIGKILLed at random moments."""
    out = subprocess.run(
        [sys.executable, os.path.join(HERE, "_sigkill_worker.py"), str(tmp_path), "24"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["trials"] == 24 and result["failures"] == []
    assert result["killed_mid_save"] >= 20  # the kills really landed inside save_checkpoint


def test_checkpoint_saver_best_and_last(tmp_path):
    saver = st.CheckpointSaver(tmp_path, mode="max")
    metrics = [0.5, 0.7, 0.6, float("nan"), 0.9, 0.8]
    improved = [
        saver.save({"epoch": e, "w": torch.full((2,), float(e))}, epoch=e, metric=torch.tensor(m))
        for e, m in enumerate(metrics)
    ]
    assert improved == [True, True, False, False, True, False]
    assert st.load(saver.last_path)["epoch"] == 5
    assert st.load(saver.best_path)["epoch"] == 4
    index = json.loads((tmp_path / "checkpoints.json").read_text())
    assert index["best"] == {"epoch": 4, "metric": pytest.approx(0.9), "file": "best.pt"}
    assert index["last"] == {"epoch": 5, "metric": pytest.approx(0.8), "file": "last.pt"}
    # last.pt is replaced by a new file: best.pt (a hard link to an older last.pt) is unchanged
    assert torch.equal(st.load(saver.best_path)["w"], torch.full((2,), 4.0))


def test_checkpoint_saver_resumes_from_index(tmp_path):
    first = st.CheckpointSaver(tmp_path, mode="min")
    first.save({"epoch": 0}, epoch=0, metric=1.0)
    resumed = st.CheckpointSaver(tmp_path, mode="min")
    assert (resumed.best_metric, resumed.best_epoch, resumed.last_epoch) == (1.0, 0, 0)
    assert not resumed.save({"epoch": 1}, epoch=1, metric=2.0)  # worse than before the restart
    assert resumed.save({"epoch": 2}, epoch=2, metric=0.5)
    with pytest.raises(ValueError, match="mode='min'"):
        st.CheckpointSaver(tmp_path, mode="max")
    with pytest.raises(ValueError, match="expected 'min'"):
        st.CheckpointSaver(tmp_path, mode="lowest")


def test_nan_never_becomes_best(tmp_path):
    saver = st.CheckpointSaver(tmp_path)
    assert not saver.save({}, epoch=0, metric=math.nan)
    assert saver.best_metric is None and not os.path.exists(saver.best_path)
    assert os.path.exists(saver.last_path)


_DDP_WORLD_SIZE_1 = """
import gc, sys, torch, torch.distributed as dist
import safetorch as st
tmp = sys.argv[1]
dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=0, world_size=1)
try:
    ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(3, 3))
    path = st.save_checkpoint({"state_dict": ddp.state_dict()}, f"{tmp}/ddp.pt")
    plain = torch.nn.Linear(3, 3)
    report = st.load_state_dict(plain, path)
    assert report.ok and report.source_key == "state_dict", report
    assert torch.equal(plain.weight, ddp.module.weight)
    # and back: a plain checkpoint into the DDP model
    assert st.load_state_dict(ddp, torch.nn.Linear(3, 3).state_dict()).ok
finally:
    # the DDP model (its Reducer) goes before the process group: see _ddp_worker.py
    ddp = None
    gc.collect()
    dist.destroy_process_group()
print("ok")
"""


@pytest.mark.dist
def test_ddp_world_size_1(tmp_path):
    # A real process group, in a child process with a deadline: a collective that never
    # returns must fail this test, not hang the suite (and init_process_group's process-wide
    # side effects, e.g. torch >= 2.2 replacing sys.excepthook, stay out of the test run).
    out = subprocess.run(
        [sys.executable, "-c", _DDP_WORLD_SIZE_1, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    # the last line: gloo in torch 2.8 prints "[Gloo] Rank 0 is connected to 0 peer ranks..."
    assert out.stdout.strip().splitlines()[-1:] == ["ok"], out.stdout[-2000:]


@pytest.mark.dist
@pytest.mark.slow
def test_ddp_world_size_2_rank0_writes_everyone_loads(tmp_path):
    out = subprocess.run(
        [sys.executable, os.path.join(HERE, "_ddp_worker.py"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["writes"] for r in results] == [4, 0]  # 1 save_checkpoint + 3 saver saves
    for r in results:
        assert r["complete"] and r["ok"] and r["same"], r
        assert r["rule"] == "dropped wrapper segment(s) 'module.' from checkpoint keys"
        assert r["improved"] == [True, True, False] and r["best_epoch"] == 1
        assert r["ddp_released_before_destroy"], r  # the shutdown order that cannot deadlock
