"""recalibrate_bn (against torch.optim.swa_utils.update_bn), eval_mode, bn_report."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn as nn
from torch.optim.swa_utils import update_bn

import safetorch as st


def cnn(dropout=0.0):
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 4, 3),
        nn.BatchNorm2d(4, momentum=0.3),
        nn.ReLU(),
        nn.Dropout(dropout),
        nn.Conv2d(4, 4, 1),
        nn.BatchNorm2d(4),
        nn.Flatten(),
        nn.Linear(4 * 4 * 4, 2),
        nn.BatchNorm1d(2, momentum=None),
    )


def batches(n=4):
    gen = torch.Generator().manual_seed(1)
    return [(torch.randn(5, 3, 6, 6, generator=gen) * 2 + 1, torch.zeros(5)) for _ in range(n)]


def bn_buffers(model):
    return {k: v.clone() for k, v in model.state_dict().items() if "running" in k or "num_b" in k}


def test_recalibrate_matches_update_bn_and_restores_modes_and_momentum():
    ours, theirs = cnn(), cnn()
    ours[5].eval()  # a frozen BN stays frozen in the caller's view
    loader = batches()
    assert st.recalibrate_bn(ours, loader) == 4
    update_bn(loader, theirs)
    torch.testing.assert_close(bn_buffers(ours), bn_buffers(theirs))
    assert [m.momentum for m in ours if isinstance(m, nn.BatchNorm2d)] == [0.3, 0.1]
    assert ours[8].momentum is None
    assert ours.training and not ours[5].training and ours[1].training


def test_recalibrate_runs_dropout_off_so_stats_match_eval():
    model = cnn(dropout=0.5)
    loader = batches(3)
    st.recalibrate_bn(model, loader)
    reference = cnn(dropout=0.0)  # same weights, no dropout at all
    update_bn(loader, reference)
    torch.testing.assert_close(bn_buffers(model), bn_buffers(reference))


def test_num_batches_and_forward_fn_for_dict_batches():
    model, reference = cnn(), cnn()
    loader = [{"image": x, "label": y} for x, y in batches(4)]
    used = st.recalibrate_bn(
        model, loader, num_batches=2, forward_fn=lambda m, b: m(b["image"].double().float())
    )
    assert used == 2
    update_bn([b["image"] for b in loader[:2]], reference)
    torch.testing.assert_close(bn_buffers(model), bn_buffers(reference))


def test_dict_batch_without_forward_fn_names_the_keys_and_restores_stats():
    model = cnn()
    before = bn_buffers(model)
    with pytest.raises(TypeError, match=r"\['image', 'label'\].*forward_fn"):
        st.recalibrate_bn(model, [{"image": torch.randn(2, 3, 6, 6), "label": 0}])
    torch.testing.assert_close(bn_buffers(model), before)
    assert model[1].momentum == 0.3 and model.training


def test_empty_loader_leaves_statistics_unchanged():
    model = cnn()
    model(batches(1)[0][0])
    before = bn_buffers(model)
    with pytest.raises(ValueError, match="no batch"):
        st.recalibrate_bn(model, [])
    torch.testing.assert_close(bn_buffers(model), before)
    with pytest.raises(ValueError, match="positive"):
        st.recalibrate_bn(model, batches(), num_batches=0)


def test_recalibration_fixes_eval_far_worse_than_train():
    model = cnn()
    with torch.no_grad():  # weights change after the statistics were gathered (stale stats)
        model(batches(1)[0][0])
        model[0].weight.mul_(5)
        model[0].bias.add_(3)
    x = batches(1)[0][0]
    with st.eval_mode(model):
        train_like = copy.deepcopy(model).train()(x)
        stale_gap = (model(x) - train_like).abs().max()
    st.recalibrate_bn(model, batches(8))
    with st.eval_mode(model):
        fresh_gap = (model(x) - train_like).abs().max()
    assert fresh_gap < stale_gap / 3


def test_eval_mode_restores_each_flag_even_on_error():
    model = cnn()
    model[1].eval()
    with pytest.raises(RuntimeError, match="boom"):
        with st.eval_mode(model) as m:
            assert m is model and not any(x.training for x in model.modules())
            raise RuntimeError("boom")
    assert model.training and not model[1].training and model[5].training


def test_bn_report_flags_stale_and_broken_statistics():
    model = nn.Sequential(
        nn.BatchNorm1d(3),
        nn.BatchNorm1d(3),
        nn.BatchNorm1d(3, track_running_stats=False),
        nn.BatchNorm1d(3),
    )
    model[1](torch.randn(4, 3))
    model[3](torch.randn(4, 3))
    with torch.no_grad():
        model[3].running_mean[0] = float("nan")
        model[3].running_var[1] = -1.0
    report = st.bn_report(model)
    assert [r.path for r in report] == ["0", "1", "2", "3"]
    assert "never updated" in report[0].problems[0] and report[0].num_batches_tracked == 0
    assert report[1].problems == () and report[1].num_batches_tracked == 1
    assert "track_running_stats=False" in report[2].problems[0]
    assert math.isnan(report[2].mean_min) and report[2].num_batches_tracked is None
    assert report[3].nonfinite == 1
    assert any("NaN/Inf" in p for p in report[3].problems)
    assert any("<= 0" in p for p in report[3].problems) and report[3].var_min == -1.0
    assert "! 1 NaN/Inf" in str(report[3])
