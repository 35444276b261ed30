"""lint_model: each rule through torch.fx, forward hooks and nn.Sequential order; fix=True."""

from __future__ import annotations

import copy
import dataclasses
import logging

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from hypothesis import given, settings
from hypothesis import strategies as st_

import safetorch as st
from safetorch import _compat


def rules(findings):
    return [(f.rule, f.where) for f in findings]


class Traceable(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.drop = nn.Dropout(0.3)
        self.fc = nn.Linear(8, 6)
        self.bn1d = nn.BatchNorm1d(6)

    def forward(self, x):
        x = torch.relu(self.bn(self.conv(x)))
        x = torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1)
        return self.bn1d(self.fc(self.drop(x)))


class Untraceable(Traceable):
    def forward(self, x):
        x = self.bn(self.conv(x)).relu()
        if x.sum() > float("-inf"):  # data-dependent control flow: torch.fx cannot trace it
            x = x.mean((2, 3))
        return self.bn1d(self.fc(self.drop(x)))


EXPECTED = [
    ("bias-before-bn", "conv"),
    ("dropout-before-bn", "drop"),
    ("bias-before-bn", "fc"),
]


def test_rules_through_torch_fx(caplog):
    with caplog.at_level(logging.DEBUG, logger="safetorch"):
        assert rules(st.lint_model(Traceable())) == EXPECTED
    assert "data flow from torch.fx" in caplog.text


def test_rules_through_forward_hooks_when_fx_fails(caplog):
    with caplog.at_level(logging.DEBUG, logger="safetorch"):
        assert rules(st.lint_model(Untraceable(), torch.randn(2, 3, 4, 4))) == EXPECTED
    assert "data flow from forward hooks" in caplog.text


def test_rules_through_sequential_order_as_last_resort(caplog):
    class Wrapper(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(
                nn.Conv2d(3, 4, 3),
                nn.Sequential(nn.BatchNorm2d(4), nn.ReLU()),
                nn.Dropout2d(0.1),
                nn.Conv2d(4, 4, 1, bias=False),
                nn.BatchNorm2d(4),
            )

        def forward(self, x):
            if x.sum() > 0:
                return self.body(x)
            return x

    with caplog.at_level(logging.DEBUG, logger="safetorch"):
        found = rules(st.lint_model(Wrapper()))
    assert "nn.Sequential order" in caplog.text
    assert found == [("bias-before-bn", "body.0"), ("dropout-before-bn", "body.2")]


def test_no_findings_for_a_clean_model():
    model = nn.Sequential(
        nn.Conv2d(3, 4, 3, bias=False), nn.BatchNorm2d(4), nn.ReLU(), nn.Dropout(0.5)
    )
    assert st.lint_model(model, torch.randn(4, 3, 5, 5)) == []


def test_bias_not_reported_when_output_also_goes_elsewhere_or_layer_is_shared():
    class Branch(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(2, 2, 1)
            self.bn = nn.BatchNorm2d(2)

        def forward(self, x):
            y = self.conv(x)
            return self.bn(y) + y  # the bias is not cancelled on the skip path

    assert st.lint_model(Branch()) == []
    conv = nn.Conv2d(2, 2, 1)
    assert st.lint_model(nn.Sequential(conv, nn.BatchNorm2d(2), conv)) == []


def test_linear_on_sequences_is_not_per_channel():
    class Seq(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(5, 4)
            self.bn = nn.BatchNorm1d(4)  # BatchNorm1d over (N, 4, L): channels are dim 1

        def forward(self, x):  # x: (N, 4, 5) -> Linear on the last dim -> (N, 4, 4)
            return self.bn(self.fc(x))

    assert rules(st.lint_model(Seq())) == [("bias-before-bn", "fc")]  # shapes unknown
    assert st.lint_model(Seq(), torch.randn(3, 4, 5)) == []  # 3-D: the bias is per position


def test_bn_layer_rules_and_batch_of_one():
    model = nn.Sequential(
        nn.Conv2d(3, 4, 3, bias=False),
        nn.BatchNorm2d(4, momentum=0.99),
        nn.Conv2d(4, 4, 1, bias=False),
        nn.BatchNorm2d(4, momentum=0.0),
        nn.Flatten(),
        nn.Linear(4 * 3 * 3, 3, bias=False),
        nn.BatchNorm1d(3, track_running_stats=False),
    )
    found = st.lint_model(model, torch.randn(1, 3, 5, 5))
    assert rules(found) == [
        ("bn-momentum", "1"),
        ("bn-batch-of-one", "1"),
        ("bn-momentum", "3"),
        ("bn-batch-of-one", "3"),
        ("bn-no-running-stats", "6"),
        ("bn-batch-of-one", "6"),
    ]
    assert found[0].fix == "momentum=0.01"
    assert "raises ValueError" in found[5].message  # (1, 3): one value per channel
    assert "one sample's statistics" in found[1].message
    assert model.training and all(m.training for m in model.modules())  # restored


def test_example_input_errors_propagate():
    with pytest.raises(RuntimeError):
        st.lint_model(nn.Sequential(nn.Linear(3, 2)), torch.randn(2, 5))


@pytest.mark.parametrize("falls_back", [True, False], ids=["torch>=2.0", "torch<2.0"])
def test_torch_syncbn_device_rule_depends_on_torch_release(simulate_torch, falls_back):
    model = nn.SyncBatchNorm.convert_sync_batchnorm(nn.Sequential(nn.BatchNorm2d(2)))
    with simulate_torch(SYNCBN_FALLS_BACK_WITHOUT_PG=falls_back):
        found = st.lint_model(model)
    if falls_back:  # torch >= 2.0: plain batch_norm without a process group
        assert found == []
    else:
        assert rules(found) == [("torch-syncbn-device", "0")]
        assert "every forward" in found[0].message


@pytest.mark.skipif(dist.is_available() and dist.is_initialized(), reason="needs no process group")
def test_torch_syncbn_device_rule_matches_the_installed_torch():
    # whichever side of SYNCBN_FALLS_BACK_WITHOUT_PG the installed torch is on, the rule fires
    # exactly when torch's own SyncBatchNorm raises on this CPU input
    model = nn.SyncBatchNorm.convert_sync_batchnorm(nn.Sequential(nn.BatchNorm2d(2)))
    found = st.lint_model(model)
    try:
        model(torch.randn(2, 2, 3, 3))
    except ValueError as e:
        assert "GPU" in str(e)
        raised = True
    else:
        raised = False
    assert rules(found) == ([("torch-syncbn-device", "0")] if raised else [])
    assert raised is not _compat.SYNCBN_FALLS_BACK_WITHOUT_PG


def conv_bn_model(seed, conv_kind, bn_momentum, affine):
    torch.manual_seed(seed)
    if conv_kind == "linear":
        layers = [nn.Linear(5, 4), nn.BatchNorm1d(4, momentum=bn_momentum, affine=affine)]
        shape = (6, 5)
    elif conv_kind == "conv1d":
        layers = [nn.Conv1d(3, 4, 3), nn.BatchNorm1d(4, momentum=bn_momentum, affine=affine)]
        shape = (6, 3, 7)
    else:
        layers = [
            nn.ConvTranspose2d(3, 4, 2, stride=2),
            nn.BatchNorm2d(4, momentum=bn_momentum, affine=affine),
        ]
        shape = (6, 3, 3, 3)
    model = nn.Sequential(*layers, nn.ReLU())
    with torch.no_grad():
        layers[0].bias.uniform_(-3, 3)
    return model, shape


@settings(max_examples=15)
@given(
    st_.integers(0, 10_000),
    st_.sampled_from(["linear", "conv1d", "convtranspose2d"]),
    st_.sampled_from([0.1, None, 0.3]),
    st_.booleans(),
    st_.integers(1, 3),
)
def test_fix_folds_bias_eval_equal_training_identical(seed, kind, momentum, affine, steps):
    model, shape = conv_bn_model(seed, kind, momentum, affine)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):  # give the running stats some history, bias included
        model(torch.randn(shape, generator=gen))
    fixed = copy.deepcopy(model)
    found = st.lint_model(fixed, fix=True)
    assert rules(found) == [("bias-before-bn", "0")]
    assert fixed[0].bias is None
    assert st.lint_model(fixed) == []

    x = torch.randn(shape, generator=gen)
    model.eval()
    fixed.eval()
    torch.testing.assert_close(fixed(x), model(x), rtol=0, atol=1e-5)
    model.train()
    fixed.train()
    torch.testing.assert_close(fixed(x), model(x))  # training: BN cancels the bias
    # ... and the folded running_mean keeps tracking: eval still equal after more training
    model.eval()
    fixed.eval()
    torch.testing.assert_close(fixed(x), model(x), rtol=0, atol=1e-5)


def test_fix_with_example_input_and_no_running_stats():
    model = nn.Sequential(nn.Conv2d(2, 3, 1), nn.BatchNorm2d(3, track_running_stats=False))
    x = torch.randn(4, 2, 3, 3)
    expected = model(x)
    found = st.lint_model(model, x, fix=True)
    assert [f.rule for f in found] == ["bias-before-bn", "bn-no-running-stats"]
    assert model[0].bias is None
    torch.testing.assert_close(model(x), expected)


def test_portable_syncbn_and_bn_subclasses_stay_single_fx_nodes(caplog):
    class BNReLU(nn.BatchNorm2d):
        def forward(self, x):
            return super().forward(x).relu()

    model = nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4), nn.Conv2d(4, 4, 1), BNReLU(4))
    with pytest.warns(st.SafetorchWarning, match="BNReLU"):
        st.convert_sync_batchnorm(model, policy="portable")
    assert type(model[1]) is st.SyncBatchNorm
    with caplog.at_level(logging.DEBUG, logger="safetorch"):
        found = st.lint_model(model)
    assert "data flow from torch.fx" in caplog.text
    assert rules(found) == [("bias-before-bn", "0"), ("bias-before-bn", "2")]


def test_lint_model_wrong_types_raise_type_error() -> None:
    with pytest.raises(
        TypeError, match=r"lint_model\(model=\.\.\.\) expects a torch.nn.Module, got str"
    ):
        st.lint_model("m")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"fix=\.\.\.\) expects a bool, got str"):
        st.lint_model(torch.nn.Linear(1, 1), fix="yes")  # type: ignore[arg-type]


@dataclasses.dataclass
class _Out:
    x: torch.Tensor


class _DropToRecord(nn.Dropout):
    def forward(self, x):
        return _Out(super().forward(x))


class _RecordFlow(nn.Module):
    def __init__(self):
        super().__init__()
        self.drop = _DropToRecord(0.5)
        self.bn = nn.BatchNorm1d(4)

    def forward(self, x):
        if x.sum() > 0:  # data-dependent: torch.fx cannot trace, so the forward hooks decide
            x = x + 1
        return self.bn(self.drop(x).x)


def test_forward_hooks_follow_tensors_through_dataclass_outputs():
    """The hook graph finds tensors with safetorch._nest's rules: the walker it replaced saw
    only list/tuple/dict, so a module returning a dataclass fed nothing and this was missed."""
    assert rules(st.lint_model(_RecordFlow(), torch.ones(2, 4))) == [("dropout-before-bn", "drop")]
