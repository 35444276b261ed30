"""convert/revert_sync_batchnorm and st.SyncBatchNorm in one process (2-rank checks: tests/dist)."""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import logging
import os
import subprocess
import sys
import warnings
import weakref

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

import safetorch as st
from safetorch import _compat

syncbn = importlib.import_module("safetorch.nn.syncbn")
_problem_since_2_0 = syncbn._problem_since_2_0
_problem_before_2_0 = syncbn._problem_before_2_0


class BNReLU(nn.BatchNorm2d):
    """A BatchNorm subclass with its own forward (BN + activation)."""

    def forward(self, x):
        return super().forward(x).relu()


class NamedBN(nn.BatchNorm2d):
    """A BatchNorm subclass that does not override forward."""


@contextlib.contextmanager
def outlived_gloo_group(tmp_path):
    """A one-rank gloo group; yields a weak reference to it (the test may outlive it)."""
    saved_excepthook = sys.excepthook  # torch >= 2.2's init_process_group replaces it
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rdv'}", rank=0, world_size=1)
    try:
        yield weakref.ref(dist.group.WORLD)
    finally:
        gc.collect()
        dist.destroy_process_group()
        gc.collect()
        sys.excepthook = saved_excepthook


def small_model():
    return nn.Sequential(
        nn.Conv1d(2, 3, 1),
        nn.BatchNorm1d(3),
        nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4, momentum=None)),
        nn.BatchNorm3d(5, affine=False),
    )


def test_no_process_group_returns_module_unchanged_and_logs_why(caplog):
    model = small_model()
    before = [type(m) for m in model.modules()]
    with caplog.at_level(logging.DEBUG, logger="safetorch"):
        assert st.convert_sync_batchnorm(model) is model
    assert [type(m) for m in model.modules()] == before
    assert "no process group is initialized" in caplog.text


_LAUNCH_VARS = ("WORLD_SIZE", "RANK", "LOCAL_RANK")


@pytest.fixture
def launch_env(monkeypatch):
    """Set the launcher variables for one test (all others of the three removed)."""

    def set_env(**values):
        for name in _LAUNCH_VARS:
            monkeypatch.delenv(name, raising=False)
        for name, value in values.items():
            monkeypatch.setenv(name, value)

    return set_env


@pytest.mark.parametrize(
    ("env", "seen"),
    [
        ({"WORLD_SIZE": "2"}, "WORLD_SIZE=2"),
        ({"WORLD_SIZE": "2", "RANK": "1"}, "WORLD_SIZE=2, RANK=1"),
        ({"WORLD_SIZE": "4", "LOCAL_RANK": "3"}, "WORLD_SIZE=4, LOCAL_RANK=3"),
    ],
)
def test_launched_without_process_group_warns_at_the_caller(launch_env, env, seen):
    launch_env(**env)
    model = small_model()
    before = [type(m) for m in model.modules()]
    with pytest.warns(st.DistributedWarning) as record:
        assert st.convert_sync_batchnorm(model) is model
    assert [type(m) for m in model.modules()] == before  # still plain BatchNorm
    assert len(record) == 1
    message = str(record[0].message)
    assert f"({seen})" in message
    assert "no process group is initialized" in message
    assert "torch.distributed.init_process_group" in message
    assert 'policy="portable"' in message
    assert record[0].filename == __file__
    assert issubclass(record[0].category, st.SafetorchWarning)


def test_launched_without_process_group_warns_through_the_patch(launch_env):
    launch_env(WORLD_SIZE="2", RANK="0")
    with st.patched("syncbn"), pytest.warns(st.DistributedWarning, match="WORLD_SIZE=2") as rec:
        nn.SyncBatchNorm.convert_sync_batchnorm(small_model())
    assert [w.filename for w in rec] == [__file__]


@pytest.mark.parametrize(
    "env",
    [
        {},  # plain single-process run
        {"RANK": "0", "LOCAL_RANK": "0"},  # no WORLD_SIZE: nothing says there are other ranks
        {"WORLD_SIZE": "1", "RANK": "0"},
        {"WORLD_SIZE": "0"},
        {"WORLD_SIZE": "two"},
        {"WORLD_SIZE": ""},
    ],
)
def test_single_process_environment_stays_quiet(launch_env, env, caplog):
    launch_env(**env)
    model = small_model()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with caplog.at_level(logging.DEBUG, logger="safetorch"):
            assert st.convert_sync_batchnorm(model) is model
    assert "no process group is initialized" in caplog.text  # still said at debug level


def test_explicit_policy_converts_without_the_launch_warning(launch_env):
    launch_env(WORLD_SIZE="2", RANK="0")
    model = small_model()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        st.convert_sync_batchnorm(model, policy="portable")
    assert type(model[1]) is st.SyncBatchNorm


def test_world_size_one_returns_module_unchanged(one_rank_gloo, caplog):
    model = small_model()
    with caplog.at_level(logging.DEBUG, logger="safetorch"):
        assert st.convert_sync_batchnorm(model) is model
    assert type(model[1]) is nn.BatchNorm1d
    assert "world size 1" in caplog.text
    # st.SyncBatchNorm with one rank is plain BatchNorm
    bn, ref = st.SyncBatchNorm(3), nn.BatchNorm1d(3)
    x = torch.randn(5, 3)
    torch.testing.assert_close(bn(x), ref(x), rtol=0, atol=0)


@pytest.mark.parametrize(
    ("policy", "target"), [("portable", st.SyncBatchNorm), ("torch", nn.SyncBatchNorm)]
)
def test_conversion_shares_state_and_reverts_to_original_classes(policy, target):
    model = small_model()
    model[1].weight.requires_grad_(False)
    model[2][1].eval()
    model[2][1].qconfig = "kept"
    calls = []
    handle = model[1].register_forward_hook(lambda m, i, o: calls.append(1))
    tensors = {k: v for k, v in model.state_dict(keep_vars=True).items()}
    keys = list(model.state_dict())

    converted = st.convert_sync_batchnorm(model, policy=policy)
    assert converted is model
    for path in ("1", "2.1", "3"):
        assert type(model.get_submodule(path)) is target
    assert list(model.state_dict()) == keys
    for key, value in model.state_dict(keep_vars=True).items():
        assert value is tensors[key], key  # shared, not copied
    assert not model[1].weight.requires_grad
    assert model[1].training and not model[2][1].training
    assert model[2][1].qconfig == "kept" and model[2][1].momentum is None
    assert model[3].weight is None and not model[3].affine

    x = torch.randn(4, 2, 6)
    if policy == "portable":  # without a process group: plain BatchNorm, same numbers
        model[1](model[0](x))
        assert calls == [1]  # hooks carried over
    handle.remove()
    if policy == "portable":
        model[1](model[0](x))
        assert calls == [1]  # ... and their handles still remove them

    reverted = st.revert_sync_batchnorm(model)
    assert reverted is model
    assert type(model[1]) is nn.BatchNorm1d
    assert type(model[2][1]) is nn.BatchNorm2d
    assert type(model[3]) is nn.BatchNorm3d
    assert not hasattr(model[1], "process_group")
    for key, value in model.state_dict(keep_vars=True).items():
        assert value is tensors[key], key


def test_root_batchnorm_is_replaced_and_returned():
    bn = nn.BatchNorm2d(3)
    sync = st.convert_sync_batchnorm(bn, policy="portable")
    assert type(sync) is st.SyncBatchNorm and sync.weight is bn.weight
    back = st.revert_sync_batchnorm(sync)
    assert type(back) is nn.BatchNorm2d and back.running_mean is bn.running_mean


def test_shared_layer_is_converted_once():
    bn = nn.BatchNorm1d(3)
    model = nn.Sequential(bn, nn.ReLU(), bn)
    st.convert_sync_batchnorm(model, policy="portable")
    assert model[0] is model[2] and type(model[0]) is st.SyncBatchNorm


def test_subclass_with_own_forward_is_skipped_with_a_warning_naming_it():
    model = nn.Sequential(nn.Conv2d(3, 3, 1), BNReLU(3), NamedBN(3), nn.BatchNorm2d(3))
    with pytest.warns(st.SafetorchWarning, match=r"1 \(BNReLU defines its own forward\)"):
        st.convert_sync_batchnorm(model, policy="portable")
    assert type(model[1]) is BNReLU
    # a subclass without its own forward converts, and reverts to itself
    assert type(model[2]) is st.SyncBatchNorm and type(model[3]) is st.SyncBatchNorm
    st.revert_sync_batchnorm(model)
    assert type(model[2]) is NamedBN and type(model[3]) is nn.BatchNorm2d


def test_warning_points_at_the_caller():
    with pytest.warns(st.SafetorchWarning) as record:
        st.convert_sync_batchnorm(nn.Sequential(BNReLU(2)), policy="portable")
    assert record[0].filename == __file__


def test_warning_through_the_patched_torch_converter_points_at_the_caller():
    # The patch adds a safetorch wrapper frame; the stacklevel is found by walking frames.
    with st.patched("syncbn"), pytest.warns(st.SafetorchWarning) as record:
        # policy= passes through the patch (without a process group "auto" converts nothing)
        nn.SyncBatchNorm.convert_sync_batchnorm(nn.Sequential(BNReLU(2)), policy="portable")
    assert [w.filename for w in record if issubclass(w.category, st.SafetorchWarning)] == [__file__]


def test_registered_converter_is_used_through_the_mro():
    class BNReLUChild(BNReLU):
        pass

    seen = []

    @st.register_sync_batchnorm_converter(BNReLU)
    def convert(module, group, sync_class):
        seen.append((type(module), sync_class))
        sync = st.convert_sync_batchnorm(nn.BatchNorm2d(module.num_features), policy="portable")
        return nn.Sequential(sync, nn.ReLU())

    try:
        model = nn.Sequential(BNReLU(3), BNReLUChild(3))
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            st.convert_sync_batchnorm(model, policy="portable")
        assert [type(m[0]) for m in model] == [st.SyncBatchNorm, st.SyncBatchNorm]
        assert seen == [(BNReLU, st.SyncBatchNorm), (BNReLUChild, st.SyncBatchNorm)]
    finally:
        st.unregister_sync_batchnorm_converter(BNReLU)
    with pytest.warns(st.SafetorchWarning):
        st.convert_sync_batchnorm(nn.Sequential(BNReLU(3)), policy="portable")


def test_register_rejects_non_classes_and_non_callables():
    with pytest.raises(TypeError, match="cls must be a class"):
        st.register_sync_batchnorm_converter("BatchNorm2d", lambda *a: None)
    with pytest.raises(TypeError, match="converter must be callable"):
        st.register_sync_batchnorm_converter(BNReLU, 3)


def test_uninitialized_lazy_layer_is_skipped_with_a_warning():
    with warnings.catch_warnings():
        # torch <= 2.3 warns on constructing any lazy module; only that warning is tolerated
        warnings.filterwarnings(
            "ignore", message="Lazy modules are a new feature", category=UserWarning
        )
        model = nn.Sequential(nn.LazyBatchNorm2d())
    with pytest.warns(st.SafetorchWarning, match="uninitialized lazy layer"):
        st.convert_sync_batchnorm(model, policy="portable")
    assert isinstance(model[0], nn.LazyBatchNorm2d)


def test_torch_syncbn_swapped_for_portable_one_and_reverted_with_default():
    model = nn.SyncBatchNorm.convert_sync_batchnorm(nn.Sequential(nn.BatchNorm1d(3)))
    st.convert_sync_batchnorm(model, policy="portable")
    assert type(model[0]) is st.SyncBatchNorm
    st.revert_sync_batchnorm(model, default=nn.BatchNorm1d)
    assert type(model[0]) is nn.BatchNorm1d
    made_by_torch = nn.SyncBatchNorm.convert_sync_batchnorm(nn.Sequential(nn.BatchNorm3d(3)))
    assert type(st.revert_sync_batchnorm(made_by_torch)[0]) is nn.BatchNorm2d


def test_invalid_policy_names_the_choices():
    with pytest.raises(ValueError, match="'auto', 'torch', 'portable'"):
        st.convert_sync_batchnorm(nn.BatchNorm1d(2), policy="always")


@pytest.mark.parametrize("momentum", [0.1, None, 0.5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_portable_syncbn_without_process_group_equals_batchnorm(momentum, dtype):
    ours = st.SyncBatchNorm(4, momentum=momentum, dtype=dtype)
    ref = nn.BatchNorm2d(4, momentum=momentum, dtype=dtype)
    for _ in range(3):
        x = torch.randn(3, 4, 2, 2, dtype=dtype)
        torch.testing.assert_close(ours(x), ref(x), rtol=0, atol=0)
    torch.testing.assert_close(ours.state_dict(), ref.state_dict(), rtol=0, atol=0)
    ours.eval()
    ref.eval()
    x = torch.randn(2, 4, 2, 2, dtype=dtype)
    torch.testing.assert_close(ours(x), ref(x), rtol=0, atol=0)


@pytest.mark.parametrize(
    ("dtype", "pdtype"),
    [
        (torch.float32, torch.float32),
        (torch.float64, torch.float64),
        (torch.bfloat16, torch.float32),  # mixed precision: float32 parameters and statistics
    ],
)
def test_sync_function_matches_batch_norm_per_dtype(one_rank_gloo, dtype, pdtype):
    """CPU twin of tests/gpu's check: the all_reduce path (one gloo rank) equals F.batch_norm.

    Parameters and running statistics have the input's dtype, or float32 for a half input, as
    in torch's own BatchNorm; outputs and gradients come back in their own dtypes.
    """
    torch.manual_seed(0)
    x = (torch.randn(6, 4, 5, 5) * 2 + 3).to(dtype)
    weight = torch.rand(4, dtype=pdtype, requires_grad=True)
    bias = torch.rand(4, dtype=pdtype, requires_grad=True)
    rm, rv = torch.zeros(4, dtype=pdtype), torch.ones(4, dtype=pdtype)
    rm2, rv2 = rm.clone(), rv.clone()
    w2 = weight.detach().clone().requires_grad_(True)
    b2 = bias.detach().clone().requires_grad_(True)
    a = x.clone().requires_grad_(True)
    b = x.clone().requires_grad_(True)
    group = dist.group.WORLD
    ours = syncbn._SyncBatchNormFunction.apply(a, weight, bias, rm, rv, 1e-5, 0.1, group)
    theirs = torch.nn.functional.batch_norm(b, rm2, rv2, w2, b2, True, 0.1, 1e-5)
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-5
    assert ours.dtype == theirs.dtype == dtype
    torch.testing.assert_close(ours, theirs, rtol=tol, atol=tol)
    g = torch.randn_like(ours)
    ours.backward(g)
    theirs.backward(g)
    assert weight.grad is not None and bias.grad is not None
    assert weight.grad.dtype == bias.grad.dtype == pdtype
    torch.testing.assert_close(a.grad, b.grad, rtol=tol, atol=tol)
    torch.testing.assert_close(weight.grad, w2.grad, rtol=tol * 10, atol=tol * 10)
    torch.testing.assert_close(bias.grad, b2.grad, rtol=tol * 10, atol=tol * 10)
    torch.testing.assert_close(rm, rm2, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(rv, rv2, rtol=1e-4, atol=1e-4)


def _sync_output(group):
    x = torch.randn(6, 4, 3, requires_grad=True)
    weight = torch.rand(4, requires_grad=True)
    bias = torch.rand(4, requires_grad=True)
    return syncbn._SyncBatchNormFunction.apply(
        x, weight, bias, torch.zeros(4), torch.ones(4), 1e-5, 0.1, group
    )


@pytest.mark.parametrize("backward", [False, True], ids=["no-backward", "backward"])
def test_sync_graph_does_not_own_the_process_group(tmp_path, backward):
    """An output's autograd graph (its ctx) holds no reference to the group (issue 27)."""
    with outlived_gloo_group(tmp_path) as group:
        out = _sync_output(group())
        if backward:
            out.sum().backward()
    # the group died in destroy_process_group() although the graph is still alive
    assert group() is None
    assert out.grad_fn is not None
    del out


def test_sync_backward_twice_with_retain_graph_and_on_the_default_group(one_rank_gloo):
    out = _sync_output(dist.group.WORLD)
    g = torch.randn_like(out)
    out.backward(g, retain_graph=True)
    out.backward(g)  # the group is looked up again: nothing was released by the first one
    by_default = _sync_output(None)  # None: the default group, resolved by all_reduce
    by_default.sum().backward()


def test_sync_collective_tensors_outlive_the_call(one_rank_gloo):
    """The tensors given to all_reduce stay alive from Python after forward and backward, so
    gloo's worker thread never frees their Python objects (which needs the GIL)."""
    syncbn._recent_collective_tensors.clear()
    out = _sync_output(dist.group.WORLD)
    assert [t.numel() for t in syncbn._recent_collective_tensors] == [2 * 4 + 1]  # statistics
    out.sum().backward()
    assert [t.numel() for t in syncbn._recent_collective_tensors] == [9, 2 * 4]  # + gradients
    assert syncbn._recent_collective_tensors.maxlen == 8


def test_sync_backward_after_destroy_says_so(tmp_path):
    with outlived_gloo_group(tmp_path) as group:
        out = _sync_output(group())
    with pytest.raises(RuntimeError, match="destroyed .* before backward"):
        out.sum().backward()


def test_freeing_graphs_after_destroy_never_hangs(tmp_path):
    """Issue 27 in a child process with a deadline: ``destroy_process_group()`` right after
    backward, then outputs (backwarded or not) freed, 20 times. Before the fix their graphs
    kept the group alive in every round (freeing them destroyed it inside a tensor
    deallocation); with only that fixed, ``destroy_process_group()`` itself hung on Python 3.9
    with torch 2.6.0 until the collective's tensors were kept alive (see
    ``_syncbn_teardown_worker.py``; no hang either way on Python 3.11 with torch 2.13.0)."""
    worker = os.path.join(os.path.dirname(__file__), "_syncbn_teardown_worker.py")
    rounds = 20
    try:
        out = subprocess.run(
            [sys.executable, worker, str(tmp_path), str(rounds)],
            capture_output=True,
            text=True,
            timeout=180,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the teardown worker hung (freeing graphs after destroy_process_group): {exc}")
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads((tmp_path / "result.json").read_text())
    assert result == {"rounds": rounds, "group_outlived_destroy": 0}


def test_portable_syncbn_state_dict_interchangeable_with_torch_classes():
    ours = st.SyncBatchNorm(3)
    ours.load_state_dict(nn.SyncBatchNorm(3).state_dict())
    nn.BatchNorm2d(3).load_state_dict(ours.state_dict())
    assert repr(ours).replace("SyncBatchNorm", "") == repr(nn.SyncBatchNorm(3)).replace(
        "SyncBatchNorm", ""
    )


def test_portable_syncbn_rejects_bad_input_with_the_shape():
    with pytest.raises(ValueError, match=r"at least 2D input.*\(5,\)"):
        st.SyncBatchNorm(5)(torch.randn(5))
    with pytest.raises(ValueError, match="non-zero"):
        st.SyncBatchNorm(0)(torch.randn(2, 0))


@pytest.mark.parametrize("falls_back", [True, False], ids=["torch>=2.0", "torch<2.0"])
def test_torch_syncbn_problem_is_bound_per_torch_release(simulate_torch, falls_back):
    with simulate_torch(SYNCBN_FALLS_BACK_WITHOUT_PG=falls_back):
        if falls_back:  # torch >= 2.0: falls back to batch_norm without a process group
            assert syncbn.torch_syncbn_problem("cpu", False) is None
            assert {"cuda", "xpu"} <= syncbn._torch_syncbn_devices
            assert "initialized process group" in syncbn.torch_syncbn_problem("cpu", True)
            assert syncbn.torch_syncbn_problem("cuda", True) is None
            assert syncbn._sync_class_for(nn.BatchNorm1d(2), "auto") is st.SyncBatchNorm
        else:  # torch < 2.0: CUDA only, and a process group even for CUDA
            assert syncbn._torch_syncbn_devices == frozenset({"cuda"})
            assert "every forward" in syncbn.torch_syncbn_problem("cpu", False)
            assert "without an initialized process group" in syncbn.torch_syncbn_problem(
                "cuda", False
            )
            assert syncbn.torch_syncbn_problem("cuda", True) is None
            # "auto" picks the portable class for devices torch's SyncBatchNorm then lacked
            fake_xpu = nn.BatchNorm1d(2)
            assert syncbn._sync_class_for(fake_xpu, "auto") is st.SyncBatchNorm
    # restored on exit: bound from the installed torch's flag
    expected = _problem_since_2_0 if _compat.SYNCBN_FALLS_BACK_WITHOUT_PG else _problem_before_2_0
    assert syncbn.torch_syncbn_problem is expected
    assert ("xpu" in syncbn._torch_syncbn_devices) is _compat.SYNCBN_FALLS_BACK_WITHOUT_PG


@pytest.mark.parametrize("training", [True, False])
def test_torch_syncbn_problem_matches_the_installed_torch_on_cpu(training):
    # no process group: the bound rule says torch fails exactly when torch's own layer raises
    assert not (dist.is_available() and dist.is_initialized())
    layer = nn.SyncBatchNorm(2).train(training)
    try:
        layer(torch.randn(2, 2, 3))
    except ValueError:
        raised = True
    else:
        raised = False
    problem = syncbn.torch_syncbn_problem("cpu", False)
    assert raised is (problem is not None), problem
