"""st.save_state / st.load_state on one process: exact resume, safety, errors."""

from __future__ import annotations

import os
import random

import numpy as np
import pytest
import torch

import safetorch as st


def _setup(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.3), torch.nn.Linear(8, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, 2, 0.5)
    scaler = (
        torch.amp.GradScaler("cpu", enabled=False)
        if hasattr(torch, "amp") and hasattr(torch.amp, "GradScaler")
        else None
    )
    return model, opt, sched, scaler


def _steps(model, opt, sched, n):
    out = []
    for _ in range(n):
        x = torch.randn(8, 4) + random.random() + float(np.random.rand())
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        out.append(loss.item())
    return out


@pytest.mark.parametrize("wrap", [False, True])
def test_resume_is_bit_identical(tmp_path, wrap):
    random.seed(1)
    np.random.seed(1)
    model, opt, sched, scaler = _setup()
    _steps(model, opt, sched, 3)
    saved = torch.nn.DataParallel(model) if wrap else model
    objects = dict(model=saved, optimizer=opt, scheduler=sched)
    if scaler is not None:
        objects["scaler"] = scaler
    path = st.save_state(tmp_path / "state.pt", **objects, epoch=3, best=0.5)
    reference = _steps(model, opt, sched, 4)
    final = {k: v.clone() for k, v in model.state_dict().items()}

    random.seed(7)
    np.random.seed(7)
    model2, opt2, sched2, scaler2 = _setup(seed=5)
    objects2 = dict(model=model2, optimizer=opt2, scheduler=sched2)
    if scaler2 is not None:
        objects2["scaler"] = scaler2
    extras = st.load_state(path, **objects2)
    assert extras == {"epoch": 3, "best": 0.5}
    assert _steps(model2, opt2, sched2, 4) == reference
    assert all(torch.equal(final[k], v) for k, v in model2.state_dict().items())


def test_state_file_loads_weights_only_and_is_atomic(tmp_path):
    model, opt, sched, _ = _setup()
    path = st.save_state(tmp_path / "s.pt", model=model, optimizer=opt)
    assert os.path.isabs(path)
    assert sorted(os.listdir(tmp_path)) == ["s.pt"]  # no temp file left behind
    saved = st.load(path)  # weights-only: no numpy arrays, no custom classes
    assert saved["__safetorch__"] == "safetorch.state/1"
    assert set(saved["rng"]["0"]) >= {"python", "torch", "numpy"}


def test_load_state_errors(tmp_path):
    model, opt, _, _ = _setup()
    path = st.save_state(tmp_path / "s.pt", model=model)
    with pytest.raises(st.CheckpointError, match="holds no state for 'optimizer'"):
        st.load_state(path, model=model, optimizer=opt)
    torch.save(model.state_dict(), tmp_path / "plain.pt")
    with pytest.raises(st.CheckpointError, match="not a st.save_state checkpoint"):
        st.load_state(tmp_path / "plain.pt", model=model)
    with pytest.raises(FileNotFoundError):
        st.load_state(tmp_path / "nope.pt", model=model)
    with pytest.raises(ValueError, match="reserved"):
        st.save_state(tmp_path / "x.pt", rng=1)


def test_rng_round_trip():
    from safetorch.checkpoint import state

    random.seed(3)
    np.random.seed(3)
    torch.manual_seed(3)
    snap = state.capture_rng()
    a = (random.random(), float(np.random.rand()), torch.rand(1).item())
    random.seed(4)
    np.random.seed(4)
    torch.manual_seed(4)
    state.restore_rng(snap)
    assert (random.random(), float(np.random.rand()), torch.rand(1).item()) == a
