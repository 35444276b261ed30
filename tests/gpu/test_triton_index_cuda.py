"""CUDA only: the fused checked-index kernel on the device it is for (``make gpu-check``).

tests/tensor/test_triton_index.py proves the kernel's semantics under Triton's interpreter on
CPU; this file checks what only a GPU shows: the compiled kernel is the path CUDA calls take,
agrees with torch on real sizes and dtypes, keeps the context alive, and syncs the host
exactly as documented (0 times in clip/wrap/fill/deferred, once in raise).
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, Iterator, List

import pytest
import torch

import safetorch as st
from safetorch import _compat, _triton_index

DEV = "cuda"
MODES = ["raise", "clip", "wrap", "fill", "deferred"]
_SYNC_DEBUG = "ignore:Synchronization debug mode is a prototype feature:UserWarning"

pytestmark = pytest.mark.skipif(
    not _compat.HAS_TRITON, reason="triton is not importable (torch's CUDA wheels ship it)"
)


@pytest.fixture(autouse=True)
def _clean() -> Iterator[None]:
    st.clear_deferred()
    yield
    st.clear_deferred()


@pytest.fixture
def launches(monkeypatch: pytest.MonkeyPatch) -> List[int]:
    counted: List[int] = []
    launch = _triton_index.launch

    def counting(*args: Any, **kwargs: Any) -> None:
        counted.append(1)
        launch(*args, **kwargs)

    monkeypatch.setattr(_triton_index, "launch", counting)
    return counted


def _syncs(fn: Callable[[], Any]) -> int:
    """Host syncs ``fn`` makes, as torch counts them (one warning per sync)."""
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message).lower() for w in caught)


# Each call indexes a 2-D x: dimension 0 for "getitem", dimension 1 for the others.
CALLS = {
    "getitem": lambda x, i, m: st.checked_index(x, i, mode=m, fill_value=0),
    "getitem-dim1": lambda x, i, m: st.checked_index(x, (slice(None), i), mode=m, fill_value=0),
    "index_select": lambda x, i, m: st.index_select(x, 1, i, mode=m, fill_value=0),
    "gather": lambda x, i, m: st.gather(
        x, 1, i.reshape(1, -1).expand(x.shape[0], -1), mode=m, fill_value=0
    ),
}


def _index(op: str, x: torch.Tensor, count: int, valid: bool) -> torch.Tensor:
    """``count`` indices for ``op`` on ``x``: all valid for the op, or a quarter out of range."""
    n = x.shape[0 if op == "getitem" else 1]
    lo = -n if op.startswith("getitem") else 0
    if valid:
        return torch.randint(lo, n, (count,), device=x.device)
    return torch.randint(lo - n // 3 - 1, n + n // 3 + 1, (count,), device=x.device)


@pytest.mark.filterwarnings(_SYNC_DEBUG)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("op", list(CALLS))
def test_one_kernel_and_the_documented_syncs(op: str, mode: str, launches: List[int]) -> None:
    x = torch.randn(64, 1000, device=DEV)
    i = _index(op, x, 4096, valid=mode == "raise")
    call = CALLS[op]
    call(x, i, mode)  # compile this specialization first (Triton syncs while compiling)
    launches.clear()
    assert _syncs(lambda: call(x, i, mode)) == (1 if mode == "raise" else 0)
    assert len(launches) == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int64])
@pytest.mark.parametrize("op", list(CALLS))
def test_matches_torch_on_valid_indices(op: str, dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    x = (torch.randn(1000, 3) * 100).to(dtype).to(DEV)
    if op != "getitem":
        x = x.t().contiguous()
    i = _index(op, x, 1_000_003, valid=True)
    ours = CALLS[op](x, i, "raise")
    with _compat.override(HAS_TRITON=False):  # the torch path, the reference
        ref = CALLS[op](x, i, "raise")
    assert torch.equal(ours, ref)


@pytest.mark.parametrize("mode", ["clip", "wrap", "fill", "deferred"])
def test_modes_match_the_torch_path(mode: str) -> None:
    x = torch.randn(300, 8, device=DEV, dtype=torch.bfloat16).t()  # non-contiguous
    for op in CALLS:
        i = _index(op, x, 10_000, valid=False)
        ours = CALLS[op](x, i, mode)
        with _compat.override(HAS_TRITON=False):
            ref = CALLS[op](x, i, mode)
        assert torch.equal(ours, ref), op
    if mode == "deferred":
        with pytest.raises(IndexError, match="test_triton_index_cuda.py"):
            st.raise_deferred()


@pytest.mark.parametrize("op", list(CALLS))
def test_out_of_range_raises_cpu_wording_and_the_context_survives(op: str) -> None:
    x = torch.arange(12.0).reshape(2, 6)
    bad = torch.tensor([0, 7])  # out of range in both dimensions
    with pytest.raises((IndexError, RuntimeError)) as cpu:
        CALLS[op](x, bad, "raise")  # CPU torch's own error (policy auto on CPU)
    with pytest.raises(IndexError) as info:
        CALLS[op](x.to(DEV), bad.to(DEV), "raise")
    assert str(info.value) == str(cpu.value)
    torch.cuda.synchronize()  # raises "device-side assert triggered" if a kernel faulted
    assert (x.to(DEV) * 2).sum().item() == 132


def test_deferred_then_raise_mode_check_surfaces_it() -> None:
    x = torch.arange(6.0, device=DEV)
    st.index_select(x, 0, torch.tensor([0, 6], device=DEV), mode="deferred")
    with pytest.raises(IndexError, match="index 6 is out of bounds.*mode='deferred'"):
        st.checked_index(x, torch.tensor([1], device=DEV))


@pytest.mark.parametrize("mode", MODES)
def test_gradients_match_torch(mode: str) -> None:
    base = torch.randn(16, 50, device=DEV, dtype=torch.float64)
    i = _index("getitem-dim1", base, 200, valid=mode == "raise")
    grads = []
    for fused in (True, False):
        x = base.clone().requires_grad_(True)
        if fused:
            out = CALLS["getitem-dim1"](x, i, mode)
        else:
            with _compat.override(HAS_TRITON=False):
                out = CALLS["getitem-dim1"](x, i, mode)
        (out * torch.arange(out.numel(), device=DEV).reshape(out.shape)).sum().backward()
        grads.append(x.grad)
    torch.testing.assert_close(grads[0], grads[1])


@pytest.mark.skipif(not _compat.HAS_CUSTOM_OP, reason="needs torch >= 2.4 (custom ops)")
def test_compiled_graph_runs_the_fused_op(launches: List[int]) -> None:
    torch._dynamo.reset()

    def f(x: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
        return st.checked_index(x, i).sum() + st.gather(x, 0, i.abs(), mode="deferred").sum()

    g = torch.compile(f, fullgraph=True, backend="aot_eager")
    x = torch.randn(100, device=DEV)
    i = torch.randint(-99, 100, (1000,), device=DEV)
    torch.testing.assert_close(g(x, i), f(x, i))
    with pytest.raises(IndexError, match="index 100 is out of bounds"):
        g(x, torch.tensor([100], device=DEV))
    torch._dynamo.reset()
    assert launches
