"""CheckpointSaver.save_state / resume: top-k by metric, max_history, latest complete state."""

from __future__ import annotations

import json
import os

import pytest
import torch

import safetorch as st


def _objects(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Linear(3, 2)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def test_top_k_history_and_last_are_kept(tmp_path):
    saver = st.CheckpointSaver(tmp_path, mode="max", top_k=2, max_history=1)
    model, opt = _objects()
    metrics = [0.5, 0.9, 0.1, 0.7, 0.2, 0.3]
    best_flags = [
        saver.save_state(epoch=e, metric=m, model=model, optimizer=opt)
        for e, m in enumerate(metrics)
    ]
    assert best_flags == [True, True, False, False, False, False]
    kept = sorted(os.path.basename(p) for p in saver.kept)
    # top-2 by metric: epochs 1 (0.9) and 3 (0.7); the newest: epoch 5
    assert kept == ["state-000001.pt", "state-000003.pt", "state-000005.pt"]
    assert sorted(n for n in os.listdir(tmp_path) if n.startswith("state-")) == kept
    assert saver.best_epoch == 1 and saver.last_epoch == 5
    index = json.loads((tmp_path / "checkpoints.json").read_text())
    assert [e["epoch"] for e in index["states"]] == [1, 3, 5]


def test_resume_restores_the_latest_and_a_new_saver_keeps_the_best(tmp_path):
    saver = st.CheckpointSaver(tmp_path, mode="min", top_k=1, max_history=2)
    model, opt = _objects()
    for epoch, loss in enumerate([1.0, 0.5, 0.8]):
        with torch.no_grad():
            model.weight.add_(1.0)
        saver.save_state(epoch=epoch, metric=loss, model=model, optimizer=opt, step=epoch * 10)
    final = model.weight.detach().clone()
    fresh, fresh_opt = _objects(seed=3)
    again = st.CheckpointSaver(tmp_path, mode="min", top_k=1, max_history=2)
    assert again.best_metric == 0.5
    extras = again.resume(model=fresh, optimizer=fresh_opt)
    assert extras == {"epoch": 2, "metric": 0.8, "step": 20}
    assert torch.equal(fresh.weight, final)


def test_resume_finds_a_state_the_index_missed_and_ignores_temp_files(tmp_path):
    saver = st.CheckpointSaver(tmp_path, max_history=5)
    model, opt = _objects()
    saver.save_state(epoch=0, metric=1.0, model=model)
    # written just before a crash: on disk, not in the index yet
    st.save_state(tmp_path / "state-000001.pt", model=model, epoch=1, metric=0.9)
    (tmp_path / ".state-000002.pt.abc.tmp").write_bytes(b"torn")
    assert saver.resume(model=model) == {"epoch": 1, "metric": 0.9}


def test_resume_on_an_empty_directory_is_a_fresh_start(tmp_path):
    assert st.CheckpointSaver(tmp_path).resume(model=torch.nn.Linear(1, 1)) is None


@pytest.mark.parametrize("bad", [{"top_k": -1}, {"max_history": 1.5}, {"mode": "best"}])
def test_bad_arguments(tmp_path, bad):
    with pytest.raises(ValueError):
        st.CheckpointSaver(tmp_path, **bad)
