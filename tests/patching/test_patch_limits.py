"""The documented limits of monkeypatch mode, each shown to hold (README "Legacy code")."""

from __future__ import annotations

import warnings
from typing import Any, List

import pytest
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

import safetorch as st
from safetorch import _compat
from safetorch.patching import _registry, _report

needs_compile = pytest.mark.skipif(not _compat.HAS_COMPILE, reason="torch.compile needs torch 2.0")


def _upsample_user(y: torch.Tensor) -> torch.Tensor:
    return F.upsample_bilinear(y, scale_factor=2.0)


def test_torchscript_drops_the_python_wrapper() -> None:
    x = torch.randn(1, 1, 3, 3)
    with st.patched("upsample"):
        scripted = torch.jit.script(_upsample_user)
        _report.reset_counts()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # TorchScript runs torch's deprecated body
            out = scripted(x)
        # Compiled from source to TorchScript IR: the wrapper is not in the graph and the
        # call is not counted; the output is still F.interpolate's (same as the patch).
        assert _registry.report_entries() == []
        assert torch.equal(out, st.upsample_bilinear(x, scale_factor=2))


def test_name_bound_before_patching_keeps_the_original() -> None:
    from torch.nn.functional import upsample as bound_early

    st.patch("upsample")
    from torch.nn.functional import upsample as bound_late

    assert bound_early is bound_late.__wrapped__  # the early name is torch's function
    assert not hasattr(bound_early, "__wrapped__")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        bound_early(torch.ones(1, 1, 2, 2), scale_factor=2)
        bound_late(torch.ones(1, 1, 2, 2), scale_factor=2)
    assert len(caught) == 1 and "deprecated" in str(caught[0].message)  # only the early one


class _Recorder(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.funcs: List[Any] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.funcs.append(func)
        return func(*args, **(kwargs or {}))


_INDEX_OPS = {"index_select", "__getitem__", "gather"}


def _index_ops(funcs: List[Any]) -> List[Any]:
    return [f for f in funcs if getattr(getattr(f, "__wrapped__", f), "__name__", "") in _INDEX_OPS]


def test_torch_function_modes_see_the_wrapper() -> None:
    x, i = torch.arange(6.0), torch.tensor([1, 4])

    def ops() -> List[torch.Tensor]:
        return [x.index_select(0, i), x[i], torch.gather(x, 0, i)]

    with _Recorder() as plain:
        expected = ops()
    with st.patched("index"), _Recorder() as patched:
        got = ops()
    assert all(torch.equal(a, b) for a, b in zip(got, expected))
    seen_plain, seen_patched = _index_ops(plain.funcs), _index_ops(patched.funcs)
    assert not any(hasattr(f, "__wrapped__") for f in seen_plain)
    # The mode sees the same torch calls, in the same order, patched or not. Which ones is
    # torch's business: torch <= 2.1 does not hand plain-tensor indexing (x[i]) to a
    # TorchFunctionMode at all, patched or not.
    assert [getattr(f, "__wrapped__", f) for f in seen_patched] == seen_plain
    # Tensor methods reach the mode as safetorch's wrapper; a module function (torch.gather)
    # enters the mode from inside torch's builtin, so the mode sees the builtin. What to
    # compare against in a mode: the unwrapped function.
    wrapped = {f.__wrapped__.__name__ for f in seen_patched if hasattr(f, "__wrapped__")}
    assert wrapped == {f.__name__ for f in seen_plain} - {"gather"}
    assert "index_select" in wrapped


@needs_compile
@pytest.mark.skipif(
    _compat.TORCH_RELEASE < (2, 4),
    reason="dynamo < 2.4 does not guard module-level functions: code compiled before "
    "st.patch()/st.unpatch() keeps the function it saw until torch._dynamo.reset()",
)
def test_dynamo_recompiles_after_patch_and_unpatch() -> None:
    compiles: List[int] = []

    def backend(gm: Any, example_inputs: Any) -> Any:
        compiles.append(1)
        return gm.forward

    torch._dynamo.reset()
    fn = torch.compile(_upsample_user, backend=backend)
    x = torch.randn(1, 1, 2, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fn(x)
        fn(x)
        assert len(compiles) == 1
        with st.patched("upsample"):
            fn(x)  # F.upsample_bilinear is another object now: guards fail, recompile
        assert len(compiles) == 2
        fn(x)  # back to the original object
    assert len(compiles) in (2, 3)  # a cached graph may be reused, never a stale wrapper
    torch._dynamo.reset()


def _compiled_user(x: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
    up = F.upsample_bilinear(x, scale_factor=2)
    return (
        up[:, :, i]
        + x.index_select(2, i).sum()
        + torch.gather(x, 3, i.view(1, 1, 1, -1).expand(1, 2, 4, -1)).sum()
    )


@needs_compile
@pytest.mark.parametrize("dynamo", ["installed", "dynamo_2_0_to_2_1"])
@pytest.mark.parametrize("check", ["auto", "always"])
def test_compile_fullgraph_of_patched_ops_matches_eager(
    check: str, dynamo: str, simulate_torch: Any
) -> None:
    # "dynamo_2_0_to_2_1": the wrappers are registered with allow_in_graph and compiling()
    # asks torch._dynamo.is_compiling(), as on torch 2.0 (2.1 asks torch._utils.is_compiling,
    # which newer torch deprecates with a warning, so it cannot be simulated here).
    old = dict(
        DYNAMO_HAS_TRACE_RULES=False, HAS_COMPILER_IS_COMPILING=False, HAS_UTILS_IS_COMPILING=False
    )
    x = torch.randn(1, 2, 4, 4)
    i = torch.tensor([0, 3])
    previous = st.set_index_check(check)  # "always": the device-check path, on CPU
    try:
        with simulate_torch(**(old if dynamo != "installed" else {})):
            with st.patched("upsample", "index"):
                eager = _compiled_user(x, i)
                _report.reset_counts()
                torch._dynamo.reset()
                compiled = torch.compile(_compiled_user, fullgraph=True, backend="eager")(x, i)
    finally:
        st.set_index_check(previous)
        torch._dynamo.reset()
    torch.testing.assert_close(compiled, eager, rtol=0, atol=0)
    # Counted once per call of the compiled graph (it runs the wrappers), never while tracing.
    counts = {e.kind: e.count for e in _registry.report_entries()}
    assert counts.get("F.upsample_bilinear -> st.upsample_bilinear") == 1
