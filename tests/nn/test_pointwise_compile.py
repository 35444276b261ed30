"""PointwiseConv1d under torch.compile(fullgraph=True) and torch.export: no timing while traced.

The traced forward never measures (the timer is replaced by one that raises), uses the
instance's latest eager choice for the device and dtype (else conv), and gives the eager
numbers. Skipped without torch.compile (torch < 2.0).
"""

from __future__ import annotations

import functools
import os
import shutil
from typing import Any, List

import pytest
import torch

import safetorch as st
from safetorch import _compat
from safetorch.nn import pointwise

pytestmark = [
    pytest.mark.skipif(not hasattr(torch, "compile"), reason="torch.compile needs torch >= 2.0"),
    # torch 2.1's aot_autograd reads torch.has_cuda / has_cudnn / ..., which warn
    # (torch-internal, not ours)
    pytest.mark.filterwarnings(r"ignore:'has_\w+' is deprecated:UserWarning"),
]

BACKENDS = ["eager", "aot_eager"]


@pytest.fixture(autouse=True)
def fresh_cache() -> Any:
    st.PointwiseConv1d.clear_autotune_cache()
    torch._dynamo.reset()
    yield
    st.PointwiseConv1d.clear_autotune_cache()
    torch._dynamo.reset()


def forbid_timing(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_timing(*a: Any) -> float:
        raise AssertionError("PointwiseConv1d timed a candidate inside a traced forward")

    monkeypatch.setattr(pointwise, "_time_ms", no_timing)


def decide_eagerly(monkeypatch: pytest.MonkeyPatch, pw: Any, x: torch.Tensor, winner: str) -> None:
    """One eager forward that measures (a fake timer that makes ``winner`` win)."""
    monkeypatch.setattr(pointwise, "_time_ms", lambda impl, *a: 1.0 if impl == winner else 2.0)
    assert pw(x).is_contiguous() == (winner == "conv")


def pair(cin: int, cout: int, impl: str = "auto") -> Any:
    conv = torch.nn.Conv1d(cin, cout, kernel_size=1)
    pw = st.PointwiseConv1d(cin, cout, impl=impl)
    pw.load_state_dict(conv.state_dict())
    return conv, pw


def assert_same_outputs_and_grads(compiled: Any, pw: Any, conv: Any, x: torch.Tensor) -> Any:
    # conv and linear sum in different orders: float32 rounding of the weight gradient's
    # 256-term sums (magnitude ~10) reaches a few 1e-5
    close = functools.partial(torch.testing.assert_close, rtol=1e-4, atol=1e-4)
    x1 = x.clone().requires_grad_(True)
    x2 = x.clone().requires_grad_(True)
    y, ref = compiled(x1), conv(x2)
    close(y, ref)
    y.square().sum().backward()
    ref.square().sum().backward()
    close(x1.grad, x2.grad)
    close(pw.weight.grad, conv.weight.grad)
    close(pw.bias.grad, conv.bias.grad)
    pw.zero_grad()
    conv.zero_grad()
    return y


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("impl", ["auto", "conv", "linear"])
def test_fullgraph_matches_eager_without_timing(
    monkeypatch: pytest.MonkeyPatch, backend: str, impl: str
) -> None:
    conv, pw = pair(32, 64, impl)
    forbid_timing(monkeypatch)
    compiled = torch.compile(pw, fullgraph=True, backend=backend)
    for shape in [(4, 32, 64), (2, 32, 7), (32, 5)]:
        y = assert_same_outputs_and_grads(compiled, pw, conv, torch.randn(shape))
        # auto with no eager choice traces conv, nn.Conv1d's kernel
        assert y.is_contiguous() == (impl != "linear")
    assert st.PointwiseConv1d.autotune_cache() == {} and pw._memo == {}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("winner", ["conv", "linear"])
def test_traced_forward_uses_the_eager_choice(
    monkeypatch: pytest.MonkeyPatch, backend: str, winner: str
) -> None:
    conv, pw = pair(32, 64)
    x = torch.randn(4, 32, 64)
    decide_eagerly(monkeypatch, pw, x, winner)
    forbid_timing(monkeypatch)
    compiled = torch.compile(pw, fullgraph=True, backend=backend)
    for shape in [(4, 32, 64), (3, 32, 9)]:  # the choice does not depend on sizes when traced
        y = assert_same_outputs_and_grads(compiled, pw, conv, torch.randn(shape))
        assert y.is_contiguous() == (winner == "conv")
    torch.testing.assert_close(compiled(x.double().float()), pw(x))  # eager: memo, no timing


def test_other_dtype_or_cleared_cache_traces_conv(monkeypatch: pytest.MonkeyPatch) -> None:
    conv, pw = pair(16, 8)
    x = torch.randn(2, 16, 10)
    decide_eagerly(monkeypatch, pw, x, "linear")
    forbid_timing(monkeypatch)
    conv64, pw64 = conv.double(), pw.double()
    y = torch.compile(pw64, fullgraph=True, backend="eager")(x.double())
    torch.testing.assert_close(y, conv64(x.double()))
    assert y.is_contiguous()  # float64 was never decided eagerly: conv
    pw32 = pw64.float()
    compiled = torch.compile(pw32, fullgraph=True, backend="eager")
    assert not compiled(x).is_contiguous()  # float32: the eager choice
    st.PointwiseConv1d.clear_autotune_cache()  # the graph is guarded on it: traced again
    assert compiled(x).is_contiguous()


def test_dynamic_sizes_stay_dynamic(monkeypatch: pytest.MonkeyPatch) -> None:
    from torch._dynamo.testing import CompileCounter

    conv, pw = pair(8, 4)
    decide_eagerly(monkeypatch, pw, torch.randn(2, 8, 16), "linear")
    forbid_timing(monkeypatch)
    counter = CompileCounter()
    compiled = torch.compile(pw, fullgraph=True, backend=counter)
    for batch in (2, 3, 4, 5, 6):
        x = torch.randn(batch, 8, 16)
        torch.testing.assert_close(compiled(x), conv(x))
    # static for the first size, one dynamic graph for every later one: the choice adds no
    # size guard (a size in its lookup would recompile once per batch size)
    assert counter.frame_count <= 2


@pytest.mark.skipif(not hasattr(torch, "export"), reason="torch.export needs torch >= 2.1")
def test_export_does_not_time(monkeypatch: pytest.MonkeyPatch) -> None:
    conv, pw = pair(8, 4)
    x = torch.randn(2, 8, 16)
    decide_eagerly(monkeypatch, pw, x, "linear")
    forbid_timing(monkeypatch)
    exported = torch.export.export(pw, (x,))
    torch.testing.assert_close(exported.module()(x), conv(x))


def _cxx_compiler() -> bool:
    names: List[str] = [os.environ.get("CXX", ""), "g++", "clang++"]
    return any(name and shutil.which(name) for name in names)


@pytest.mark.slow
@pytest.mark.skipif(not _cxx_compiler(), reason="inductor on CPU needs a C++ compiler")
@pytest.mark.parametrize("winner", ["conv", "linear"])
def test_inductor_fullgraph_matches_eager(monkeypatch: pytest.MonkeyPatch, winner: str) -> None:
    conv, pw = pair(32, 64)
    x = torch.randn(4, 32, 64)
    decide_eagerly(monkeypatch, pw, x, winner)
    forbid_timing(monkeypatch)
    compiled = torch.compile(pw, fullgraph=True)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), conv(x))


def test_older_torch_branches(monkeypatch: pytest.MonkeyPatch, simulate_torch: Any) -> None:
    conv, pw = pair(8, 4)
    x = torch.randn(2, 8, 16)
    forbid_timing(monkeypatch)
    installed = _compat.tracing
    # torch 2.1-2.2: no torch.compiler.is_compiling; torch._utils.is_compiling, which dynamo
    # folds to True, is asked instead (and bound into the module's hot path)
    if _compat.HAS_UTILS_IS_COMPILING:
        with simulate_torch(HAS_COMPILER_IS_COMPILING=False):
            assert _compat.tracing is pointwise._tracing is torch._utils.is_compiling
            y = torch.compile(pw, fullgraph=True, backend="eager")(x)
            torch.testing.assert_close(y, conv(x))
    # torch 2.0: dynamo's own flag
    with simulate_torch(HAS_COMPILER_IS_COMPILING=False, HAS_UTILS_IS_COMPILING=False):
        assert _compat.tracing is pointwise._tracing is _compat._dynamo_is_compiling
        assert not _compat.tracing()
    # torch < 2.0: nothing traces forward
    with simulate_torch(HAS_COMPILER_IS_COMPILING=False, HAS_COMPILE=False):
        assert _compat.tracing is _compat._never_compiling
    assert _compat.tracing is pointwise._tracing is installed
