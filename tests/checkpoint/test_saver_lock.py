"""Two jobs saving into one ``CheckpointSaver`` directory: ``checkpoints.json`` is updated under
a lock, from the index on disk, so no job's entry is lost to another's stale copy."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import torch

import safetorch as st
from safetorch.checkpoint import saver as saver_module
from safetorch.checkpoint.verify import verify_checkpoint

ROOT = Path(__file__).resolve().parents[2]

# A job: wait for the other at a file barrier, then save EPOCHS states (epochs offset by job id).
_JOB = """
import os, sys, time, torch, safetorch as st
directory, job, epochs, go = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
saver = st.CheckpointSaver(directory, mode="max", top_k=1000, max_history=1000)
open(os.path.join(os.path.dirname(go), f"ready-{job}"), "w").close()
while not os.path.exists(go):
    time.sleep(0.01)
net = torch.nn.Linear(2, 2)
for i in range(epochs):
    saver.save_state(epoch=job * 1000 + i, metric=float(i), model=net)
"""


def test_two_processes_saving_states_lose_no_entry(tmp_path: Path) -> None:
    directory, epochs = tmp_path / "run", 12
    script = tmp_path / "job.py"
    script.write_text(_JOB)
    go = tmp_path / "go"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}
    logs = [tmp_path / f"job-{job}.log" for job in (1, 2)]
    jobs = []
    for job, log in zip((1, 2), logs):
        with open(log, "w") as err:
            argv = [sys.executable, str(script), str(directory), str(job), str(epochs), str(go)]
            jobs.append(subprocess.Popen(argv, env=env, stderr=err))
    try:
        while not all((tmp_path / f"ready-{j}").exists() for j in (1, 2)):
            assert all(p.poll() is None for p in jobs), [log.read_text() for log in logs]
            threading.Event().wait(0.05)
        go.touch()  # both start saving at once
        for p, log in zip(jobs, logs):
            assert p.wait(timeout=600) == 0, log.read_text()
    finally:
        for p in jobs:
            if p.poll() is None:
                p.kill()
                p.wait()
    index = json.loads((directory / "checkpoints.json").read_text())
    recorded = sorted(e["epoch"] for e in index["states"])
    assert recorded == sorted(j * 1000 + i for j in (1, 2) for i in range(epochs))
    on_disk = sorted(p.name for p in directory.glob("state-*.pt"))
    assert on_disk == sorted(e["file"] for e in index["states"])
    assert verify_checkpoint(str(directory)).ok  # the lock file is not a checkpoint problem


def test_saver_reads_the_index_afresh_under_the_lock(tmp_path: Path) -> None:
    """Two savers in one process stand for two jobs: each save sees the other's entries."""
    net = torch.nn.Linear(2, 2)
    a = st.CheckpointSaver(tmp_path, mode="min", top_k=10, max_history=10)
    b = st.CheckpointSaver(tmp_path, mode="min", top_k=10, max_history=10)
    a.save_state(epoch=1, metric=0.5, model=net)
    assert b.save_state(epoch=2, metric=0.7, model=net) is False  # a's 0.5 is still the best
    a.save_state(epoch=3, metric=0.9, model=net)
    assert [e["epoch"] for e in a.index["states"]] == [1, 2, 3]
    assert a.best_epoch == 1 and st.CheckpointSaver(tmp_path, mode="min").last_epoch == 3


def test_save_updates_best_from_the_other_job(tmp_path: Path) -> None:
    net = torch.nn.Linear(2, 2)
    a, b = st.CheckpointSaver(tmp_path, mode="max"), st.CheckpointSaver(tmp_path, mode="max")
    assert a.save({"model": net.state_dict()}, epoch=0, metric=0.9) is True
    assert b.save({"model": net.state_dict()}, epoch=1, metric=0.5) is False  # 0.9 stands
    assert b.best_epoch == 0 and b.last_epoch == 1


def test_the_lock_is_exclusive(tmp_path: Path) -> None:
    lock = str(tmp_path / ".lock")
    order = []
    inside = threading.Event()

    def other() -> None:
        inside.wait()
        with saver_module._exclusive_lock(lock):  # flock: a second open file description
            order.append("other")

    thread = threading.Thread(target=other)
    thread.start()
    with saver_module._exclusive_lock(lock):
        inside.set()
        thread.join(timeout=0.5)
        assert thread.is_alive()  # waits while the lock is held
        order.append("first")
    thread.join(timeout=30)
    assert order == ["first", "other"]
