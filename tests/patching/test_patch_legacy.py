"""Patch ``legacy``: opt-in, fills only gaps, coexists with ``index``, exactly reversible."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

import safetorch as st
from safetorch import _compat
from safetorch.errors import PatchWarning
from safetorch.patching import _registry

ROOT = Path(__file__).parents[2]


def test_no_name_patch_leaves_legacy_off_all_turns_it_on() -> None:
    assert "legacy" not in st.patch()
    st.unpatch()
    assert "legacy" in st.patch("all")
    assert "legacy" in [p.name for p in st.patches() if p.active]


def test_removed_functions_work_and_unpatch_restores_identity() -> None:
    original = torch.solve
    before = {k: v for k, v in vars(torch.Tensor).items()}
    st.patch("legacy")
    X, _ = torch.solve(torch.ones(2, 1), 2 * torch.eye(2))
    assert X.flatten().tolist() == [0.5, 0.5]
    assert torch.eye(2).symeig().eigenvalues.tolist() == [1.0, 1.0]
    import torch._six as six  # noqa: PLC0415

    assert six.string_classes == (str, bytes)
    st.unpatch("legacy")
    assert torch.solve is original
    # torch < 2.0 imports its own torch._six; only the module the patch installed goes away
    assert _compat.HAS_TORCH_SIX or "torch._six" not in sys.modules
    assert _compat.HAS_TORCH_SIX or "_six" not in vars(torch)
    assert vars(torch.Tensor).keys() == before.keys()
    with pytest.raises(RuntimeError, match="removed"):
        torch.solve(torch.ones(2, 1), torch.eye(2))


@pytest.mark.skipif(_compat.HAS_TORCH_SYMEIG, reason="torch < 2.0 has a working torch.symeig")
def test_a_torch_that_still_has_the_api_keeps_its_own() -> None:
    st.patch("legacy")
    with _compat.override(HAS_TORCH_SYMEIG=True):  # simulate torch 1.13: call torch's
        with pytest.raises(RuntimeError, match="removed"):
            torch.symeig(torch.eye(2))
    assert torch.symeig(torch.eye(2)).eigenvalues.tolist() == [1.0, 1.0]


@pytest.mark.parametrize("order", [("index", "legacy"), ("legacy", "index")])
@pytest.mark.parametrize("off_first", ["index", "legacy"])
def test_index_and_legacy_share_getitem_in_any_order(order: tuple, off_first: str) -> None:
    loss = torch.tensor(2.0)
    for name in order:
        st.patch(name)
    with pytest.warns(PatchWarning):
        assert loss[0] == 2.0
    assert torch.arange(3)[1].item() == 1
    st.unpatch(off_first)
    still = "legacy" if off_first == "index" else "index"
    assert "__getitem__" in vars(torch.Tensor) and _registry.is_active(still)
    if still == "legacy":
        with pytest.warns(PatchWarning):
            assert loss[0] == 2.0
    else:
        with pytest.raises(IndexError):
            loss[0]
    st.unpatch(still)
    assert "__getitem__" not in vars(torch.Tensor)
    with pytest.raises(IndexError):
        loss[0]


def test_legacy_hook_is_read_only_after_torch_raises(monkeypatch) -> None:
    """The legacy x[i] handler adds nothing to indexing that succeeds: its 0-dim fallback is
    consulted only on torch's IndexError (a structural check; speed is benchmarks' job)."""
    from safetorch.patching import _legacy

    calls = []
    st.patch("index", "legacy")
    real = _legacy._zero_dim
    monkeypatch.setattr(_legacy, "_zero_dim", lambda x, a: calls.append(a) or real(x, a))
    x = torch.arange(10)
    assert x[3].item() == 3 and x[[1, 2]].tolist() == [1, 2]
    assert calls == []
    with pytest.warns(st.PatchWarning):
        assert torch.tensor(2.5)[0] == 2.5  # 0.3: x[0] of a 0-dim tensor is its number
    assert len(calls) == 1


# The class that defines Tensor.__getitem__ (torch._C.TensorBase, _TensorBase on older torch).
_BASE = next(c for c in torch.Tensor.__mro__ if "__getitem__" in vars(c))
_BASE_GETITEM = vars(_BASE)["__getitem__"]


def _getitem_state() -> tuple:
    return dict(vars(torch.Tensor)), dict(vars(_BASE))


@pytest.mark.parametrize("order", [("index", "legacy"), ("legacy", "index")])
@pytest.mark.parametrize("off", [("index", "legacy"), ("legacy", "index"), ("index,legacy",)])
def test_getitem_has_one_wrapper_and_is_restored_exactly(order: tuple, off: tuple) -> None:
    """Both patches contribute a handler to one Tensor.__getitem__ wrapper: installed by the
    first, kept (the same object) while either is on, removed exactly with the last."""
    before = _getitem_state()
    st.patch(order[0])
    wrapper = vars(torch.Tensor)["__getitem__"]
    assert wrapper.__wrapped__ is _BASE_GETITEM
    st.patch(order[1])
    assert vars(torch.Tensor)["__getitem__"] is wrapper  # one wrapper, not a second layer
    assert {k[0] for k in _registry.iter_applied() if k[2] == "Tensor.__getitem__"} == {
        "index",
        "legacy",
    }
    for i, names in enumerate(off):
        st.unpatch(names)
        if i + 1 < len(off):
            assert vars(torch.Tensor)["__getitem__"] is wrapper
    assert "__getitem__" not in vars(torch.Tensor)  # deleted: it was inherited
    assert torch.Tensor.__getitem__ is _BASE_GETITEM
    after = _getitem_state()
    assert before[0].keys() == after[0].keys() and before[1].keys() == after[1].keys()
    assert all(after[0][k] is v for k, v in before[0].items())
    assert all(after[1][k] is v for k, v in before[1].items())
    with pytest.raises(IndexError):
        torch.tensor(2.0)[0]


@pytest.mark.parametrize("order", [("index", "legacy"), ("legacy", "index")])
def test_both_orders_index_the_same(order: tuple, monkeypatch) -> None:
    """The handlers' order is the declaration order whatever the patching order: legacy's x[0]
    fallback sees the IndexError of index's check (forced here, as on CUDA)."""
    for name in order:
        st.patch(name)
    previous = st.set_index_check("always")
    try:
        with pytest.warns(PatchWarning):
            assert torch.tensor(3.0)[0] == 3.0  # checked by st.checked_index, then legacy
        with pytest.raises(IndexError, match="out of bounds"):
            torch.arange(3)[torch.tensor([5])]
        assert torch.arange(3)[torch.tensor([2])].tolist() == [2]
    finally:
        st.set_index_check(previous)
    kinds = [e.kind for e in _registry.report_entries()]
    assert any(k.startswith("x[index] -> st.checked_index") for k in kinds)
    assert any(k.startswith("x[0] of a 0-dim tensor") for k in kinds)


def test_a_late_declaration_of_a_wrapped_single_target_is_refused() -> None:
    """An attribute one declared patch wraps directly cannot gain a second patch while it is
    wrapped (its wrapper has no dispatcher); a shared one can."""
    st.patch("upsample")
    clash = _registry.Patch(
        "fake_clash", (_registry.Target("torch.nn.functional", "upsample", lambda w, i, a, k: 0),)
    )
    with pytest.raises(ValueError, match="declare patches before turning them on"):
        _registry.declare(clash)
    assert "fake_clash" not in {p.name for p in _registry.declared()}


def test_size_average_maps_to_reduction_without_warning() -> None:
    st.patch("legacy")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loss = torch.nn.MSELoss(size_average=False)
        assert loss.reduction == "sum"
        out = torch.nn.functional.l1_loss(torch.ones(2), torch.zeros(2), reduce=False)
    assert out.tolist() == [1.0, 1.0]


def test_legacy_function_and_volatile_under_the_patch() -> None:
    st.patch("legacy")

    class Twice(torch.autograd.Function):
        def forward(self, x):  # type: ignore[no-untyped-def, override]
            return 2 * x

        def backward(self, g):  # type: ignore[no-untyped-def, override]
            return 2 * g

    x = torch.ones(3, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "should not be instantiated" either
        Twice()(x).sum().backward()
    assert x.grad.tolist() == [2.0, 2.0, 2.0]
    v = torch.autograd.Variable(torch.ones(1, 2), volatile=True)
    assert torch.nn.Linear(2, 1)(v).grad_fn is None
    assert isinstance(v, torch.autograd.Variable)


def _run_cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-m", "safetorch", "run", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=240,
    )


def _line_of(text: str) -> str:
    lines = (ROOT / "tests" / "legacy" / "era_script.py").read_text().splitlines()
    return f"era_script.py:{lines.index(text) + 1}"


def test_era_script_runs_unedited_under_safetorch_run() -> None:
    done = _run_cli(str(ROOT / "tests" / "legacy" / "era_script.py"))
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert got["six"] == [True, True, True]
    A = torch.tensor([[4.0, 1.0], [2.0, 3.0]], dtype=torch.float64)
    B = torch.tensor([[1.0], [2.0]], dtype=torch.float64)
    torch.testing.assert_close(
        torch.tensor(got["X"], dtype=torch.float64), torch.linalg.solve(A, B).flatten()
    )
    torch.testing.assert_close(
        torch.tensor(got["LU"], dtype=torch.float64), torch.linalg.lu_factor(A).LU.flatten()
    )
    torch.testing.assert_close(
        torch.tensor(got["evals"], dtype=torch.float64), torch.linalg.eigvalsh(A + A.t())
    )
    assert sorted(got["eig"]) == [[2.0, 0.0], [5.0, 0.0]]
    torch.testing.assert_close(got["lstsq"][:2], [4 / 3, 7 / 3])
    assert abs(got["lstsq"][2]) == pytest.approx(3**-0.5)
    assert got["rank"] == 1 and got["grad"] == [6.0]
    assert got["pred_requires_grad"] is False and got["loss_is_sum"] is True
    for spelling in (
        "torch.linalg.solve(A, B)",
        "x.item()",
        "with torch.no_grad():",
        "reduction='sum'",
        "Fn.apply(x)",
        _line_of("total += loss.data[0]"),
        # reads of the installed module are recorded (torch < 2.0 keeps its own torch._six)
        *([] if _compat.HAS_TORCH_SIX else ["torch._six.string_classes -> (str, bytes)"]),
    ):
        assert spelling in done.stderr, spelling
    off = _run_cli("--no-patch", "legacy", str(ROOT / "tests" / "legacy" / "era_script.py"))
    assert off.returncode == 1 and "torch._six" in off.stderr
