"""CUDA-only: an out-of-range index leaves the CUDA context usable; deferred/clip never sync."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

import safetorch as st
from safetorch import _compat

DEV = "cuda"


@pytest.mark.parametrize(
    "call",
    [
        lambda x, i: st.checked_index(x, i),
        lambda x, i: st.index_select(x, 0, i),
        lambda x, i: st.gather(x, 0, i),
    ],
    ids=["checked_index", "index_select", "gather"],
)
def test_out_of_range_raises_and_context_survives(call) -> None:
    x = torch.arange(6, device=DEV)
    # CPU torch's own wording for the same call (index_select says "index out of range in self")
    with pytest.raises((IndexError, RuntimeError)) as cpu:  # CPU gather: RuntimeError
        call(x.cpu(), torch.tensor([0, 6]))
    with pytest.raises(IndexError) as info:
        call(x, torch.tensor([0, 6], device=DEV))
    assert str(info.value) == str(cpu.value)
    torch.cuda.synchronize()  # would raise "device-side assert triggered" if a kernel faulted
    assert (x * 2).sum().item() == 30
    assert torch.equal(call(x, torch.tensor([5, 0], device=DEV)).cpu(), torch.tensor([5, 0]))


@pytest.mark.skipif(_compat.IS_ROCM, reason="ROCm kernels may not bounds-check at all")
def test_raw_torch_would_have_killed_the_context() -> None:
    """The pitfall itself, in a child process: raw CUDA indexing poisons the context."""
    code = textwrap.dedent(
        """
        import torch
        x = torch.arange(6, device="cuda")
        try:
            x[torch.tensor([6], device="cuda")]
            torch.cuda.synchronize()
        except RuntimeError:
            pass
        try:
            (x + 1).sum().item()
            print("alive")
        except RuntimeError:
            print("dead")
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "dead", out.stdout + out.stderr


# torch warns (UserWarning, from C++) whenever the sync debug mode is set: a statement about
# the tool, not about the code under test. Ignored here only, for this exact message.
@pytest.mark.filterwarnings("ignore:Synchronization debug mode is a prototype feature:UserWarning")
@pytest.mark.parametrize("mode", ["deferred", "clip", "wrap", "fill"])
def test_no_host_sync_modes(mode: str) -> None:
    st.clear_deferred()
    x = torch.randn(1000, device=DEV)
    idx = torch.randint(-2000, 2000, (10_000,), device=DEV)
    gidx = idx.abs()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        st.checked_index(x, idx, mode=mode, fill_value=0.0)
        st.index_select(x, 0, gidx, mode=mode, fill_value=0.0)
        st.gather(x, 0, gidx, mode=mode, fill_value=0.0)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    if mode == "deferred":
        with pytest.raises(IndexError, match="test_tensor_cuda.py"):
            st.raise_deferred()


def test_raise_mode_syncs_at_most_once(recwarn) -> None:
    x = torch.randn(1000, device=DEV)
    idx = torch.randint(0, 1000, (10_000,), device=DEV)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        st.index_select(x, 0, idx)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    syncs = [w for w in recwarn.list if "synchroniz" in str(w.message).lower()]
    assert len(syncs) <= 1, [str(w.message) for w in syncs]


def test_cuda_matches_cpu_for_valid_indices() -> None:
    torch.manual_seed(0)
    x = torch.randn(5, 7)
    idx = torch.randint(-5, 5, (3, 4))
    assert torch.equal(st.checked_index(x.to(DEV), idx.to(DEV)).cpu(), x[idx])
    assert torch.equal(
        st.checked_index(x.to(DEV), (slice(None), idx.abs() % 7)).cpu(), x[:, idx.abs() % 7]
    )
