"""The fused checked-index kernel (safetorch._triton_index) against torch, without a GPU.

The kernel runs on CPU tensors under Triton's interpreter (``TRITON_INTERPRET=1``) with the
check path forced (``check="always"``), which is the path a CUDA tensor takes. CPU torch is the
oracle where torch defines the answer (raise mode: values, or the same exception with the same
message); for clip / wrap / fill / deferred the torch-op path (``HAS_TRITON`` off) is the
reference. A launch counter proves each covered call ran exactly one kernel and each uncovered
one none. One test compiles the kernel for real NVIDIA targets (sm_80, sm_90), which the
interpreter (numpy semantics) cannot vouch for.

Run with ``make test-triton`` (its own venv with triton); skipped with a reason elsewhere.
"""

from __future__ import annotations

import functools
import os
import pathlib
import subprocess
import sys
import threading
import warnings
from typing import Any, Callable, Iterator, List

import pytest
import torch

from safetorch import _compat

if not _compat.HAS_TRITON:
    pytest.skip(
        "triton is not importable: `make test-triton` runs these tests in a venv with it",
        allow_module_level=True,
    )

from safetorch import _triton_index  # noqa: E402

if not _triton_index.INTERPRET:
    pytest.skip(
        "needs Triton's interpreter for CPU tensors: run with TRITON_INTERPRET=1 "
        "(`make test-triton`); tests/gpu/test_triton_index_cuda.py runs the kernel on CUDA",
        allow_module_level=True,
    )

from _strategies import index_dtypes  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st_  # noqa: E402

import safetorch as st  # noqa: E402
from safetorch import tensor as st_tensor  # noqa: E402

N = 150  # examples per property: each runs the interpreter a few times
MODES = ["clip", "wrap", "fill", "deferred"]
X_DTYPES = [
    torch.float32,
    torch.bfloat16,
    torch.float16,
    torch.float64,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.uint8,
    torch.bool,
    torch.complex64,
]


@pytest.fixture(autouse=True)
def _clean() -> Iterator[None]:
    st.clear_deferred()
    yield
    st.clear_deferred()


class Launches:
    """Counts kernel launches (wrapping ``_triton_index.launch``, which _index_fused looks up per
    call)."""

    def __init__(self) -> None:
        self.count = 0
        self._launch = _triton_index.launch

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        self.count += 1
        self._launch(*args, **kwargs)

    def take(self) -> int:
        count, self.count = self.count, 0
        return count


@pytest.fixture
def launches(monkeypatch: pytest.MonkeyPatch) -> Launches:
    counter = Launches()
    monkeypatch.setattr(_triton_index, "launch", counter)
    return counter


def _outcome(fn: Callable[[], Any]) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's own deprecation warnings are not tested
        try:
            return ("ok", fn())
        except Exception as e:  # noqa: BLE001 - class and message are compared below
            return ("err", e)


def _assert_same(expected: Any, got: Any) -> None:
    if expected[0] == "err":
        assert got[0] == "err", f"expected {expected[1]!r}, got a result"
        assert isinstance(got[1], type(expected[1])), (expected[1], got[1])
        assert str(got[1]) == str(expected[1])
        return
    assert got[0] == "ok", f"expected a result, got {got[1]!r}"
    a, b = expected[1], got[1]
    assert (a.dtype, a.shape, a.device) == (b.dtype, b.shape, b.device)
    if a.is_floating_point() or a.is_complex():  # fill's default is NaN: NaN == NaN here
        nan = a.isnan()
        assert torch.equal(nan, b.isnan()) and torch.equal(a[~nan], b[~nan]), (a, b)
        return
    assert torch.equal(a, b), (a, b)


def _reference(fn: Callable[[], Any]) -> Any:
    """``fn`` on the torch-op path (the reference): Triton reported absent."""
    with _compat.override(HAS_TRITON=False):
        return _outcome(fn)


def _deferred_message() -> Any:
    try:
        st.raise_deferred()
    except IndexError as e:
        return str(e).split(" (first")[0]  # the site differs: reference and fused lines
    return None


# --- strategies ------------------------------------------------------------------------------
@st_.composite
def tensors(draw: Any, min_dims: int = 1) -> torch.Tensor:
    """A tensor of any dtype, sizes 0-5 (dims of size 0 and 1 included), possibly
    non-contiguous (transposed, strided or expanded)."""
    shape = draw(st_.lists(st_.integers(0, 5), min_size=min_dims, max_size=3))
    dtype = draw(st_.sampled_from(X_DTYPES))
    layout = draw(st_.sampled_from(["contiguous", "transposed", "strided", "expanded"]))
    numel = 1
    for s in shape:
        numel *= s
    if layout == "strided":
        base = _values(numel * 2, dtype).reshape(*shape[:-1], shape[-1] * 2) if shape else None
        return base[..., ::2] if base is not None else _values(1, dtype).reshape(())
    if layout == "transposed" and len(shape) >= 2:
        return _values(numel, dtype).reshape(*shape[:-2], shape[-1], shape[-2]).transpose(-1, -2)
    if layout == "expanded" and shape:
        rest = numel // shape[0] if shape[0] else 0
        if shape[0] == 0:
            rest = 1
            for s in shape[1:]:
                rest *= s
        return _values(rest, dtype).reshape([1, *shape[1:]]).expand(shape)
    return _values(numel, dtype).reshape(shape)


def _values(n: int, dtype: torch.dtype) -> torch.Tensor:
    v = torch.arange(n, dtype=torch.float64) * 1.5 - 3
    if dtype == torch.bool:
        return v > 0
    if dtype == torch.complex64:
        return torch.complex(v.float(), -v.float())
    return v.to(dtype)


@st_.composite
def index_tensors(draw: Any, n: int, lo: int, max_dims: int = 2) -> torch.Tensor:
    shape = draw(st_.lists(st_.integers(0, 4), max_size=max_dims))
    count = 1
    for s in shape:
        count *= s
    vals = draw(st_.lists(st_.integers(lo - 3, n + 2), min_size=count, max_size=count))
    dtype = draw(index_dtypes)
    t = torch.tensor(vals, dtype=torch.int64).to(dtype).reshape(shape)
    if t.dim() == 2 and draw(st_.booleans()):
        t = t.t().contiguous().t()  # non-contiguous index
    return t


@st_.composite
def getitem_cases(draw: Any) -> Any:
    x = draw(tensors())
    d = draw(st_.integers(0, x.dim() - 1))
    n = x.shape[d]
    t = draw(index_tensors(n, -n))
    return x, (t if d == 0 and draw(st_.booleans()) else (slice(None),) * d + (t,))


@st_.composite
def select_cases(draw: Any) -> Any:
    x = draw(tensors())
    dim = draw(st_.integers(-x.dim(), x.dim() - 1))
    n = x.shape[dim]
    return x, dim, draw(index_tensors(n, 0, max_dims=1))


@st_.composite
def gather_cases(draw: Any) -> Any:
    x = draw(tensors())
    dim = draw(st_.integers(-x.dim(), x.dim() - 1))
    n = x.shape[dim]
    shape = [draw(st_.integers(0, s)) if draw(st_.booleans()) else s for s in x.shape]
    shape[dim] = draw(st_.integers(0, 4))
    count = 1
    for s in shape:
        count *= s
    vals = draw(st_.lists(st_.integers(-3, n + 2), min_size=count, max_size=count))
    dtype = draw(index_dtypes)
    return x, dim, torch.tensor(vals, dtype=torch.int64).to(dtype).reshape(shape)


# --- raise mode: CPU torch is the oracle -------------------------------------------------------
@settings(max_examples=N)
@given(getitem_cases())
def test_getitem_raise_matches_torch(case: Any) -> None:
    x, index = case
    _assert_same(
        _outcome(lambda: x[index]), _outcome(lambda: st.checked_index(x, index, check="always"))
    )


@settings(max_examples=N)
@given(select_cases())
def test_index_select_raise_matches_torch(case: Any) -> None:
    x, dim, index = case
    expected = _outcome(lambda: torch.index_select(x, dim, index))
    _assert_same(expected, _outcome(lambda: st.index_select(x, dim, index, check="always")))


@settings(max_examples=N)
@given(gather_cases())
def test_gather_raise_matches_torch(case: Any) -> None:
    x, dim, index = case
    expected = _outcome(lambda: torch.gather(x, dim, index))
    _assert_same(expected, _outcome(lambda: st.gather(x, dim, index, check="always")))


# --- clip / wrap / fill / deferred: the torch-op path is the reference ------------------------
def _same_as_reference(call: Callable[[], Any], mode: str) -> None:
    expected = _reference(call)
    ref_deferred = _deferred_message() if mode == "deferred" else None
    got = _outcome(call)
    _assert_same(expected, got)
    if mode == "deferred":
        assert _deferred_message() == ref_deferred


@settings(max_examples=N)
@given(getitem_cases(), st_.sampled_from(MODES), st_.sampled_from([None, 7]))
def test_getitem_modes_match_the_torch_path(case: Any, mode: str, fill: Any) -> None:
    x, index = case
    _same_as_reference(
        lambda: st.checked_index(x, index, mode=mode, fill_value=fill, check="always"), mode
    )


@settings(max_examples=N)
@given(select_cases(), st_.sampled_from(MODES))
def test_index_select_modes_match_the_torch_path(case: Any, mode: str) -> None:
    x, dim, index = case
    _same_as_reference(lambda: st.index_select(x, dim, index, mode=mode, check="always"), mode)


@settings(max_examples=N)
@given(gather_cases(), st_.sampled_from(MODES))
def test_gather_modes_match_the_torch_path(case: Any, mode: str) -> None:
    x, dim, index = case
    _same_as_reference(lambda: st.gather(x, dim, index, mode=mode, check="always"), mode)


@pytest.mark.parametrize("mode", ["raise", *MODES])
def test_large_dims_span_many_programs_on_both_axes(mode: str, launches: Launches) -> None:
    # Q = 2,500 elements after the indexed dimension: three programs along Q per row (tiles
    # of 1,024), and P = 2 before it. Then 1-D: 3,000 indices, three programs of rows.
    torch.manual_seed(0)
    x = torch.randn(2, 70, 2500)
    n = x.shape[1]
    valid = mode == "raise"
    idx = torch.randint(-n if valid else -2 * n, n if valid else 2 * n, (5,))
    sel = idx.remainder(n) if valid else idx
    gidx = torch.randint(0, n if valid else 2 * n, (2, 3, 2500))
    long_idx = torch.randint(-2500 if valid else -5000, 2500 if valid else 5000, (3000,))
    calls = [
        lambda: st.checked_index(x, (slice(None), idx), mode=mode, check="always"),
        lambda: st.index_select(x, 1, sel, mode=mode, check="always"),
        lambda: st.gather(x, 1, gidx, mode=mode, check="always"),
        lambda: st.checked_index(x[0, 0], long_idx, mode=mode, check="always"),
    ]
    for call in calls:
        expected = _reference(call)
        ref_deferred = _deferred_message()
        _assert_same(expected, _outcome(call))
        assert _deferred_message() == ref_deferred
    assert launches.take() == 4


# --- which calls take the kernel ---------------------------------------------------------------
def test_covered_forms_run_exactly_one_kernel(launches: Launches) -> None:
    x = torch.arange(24.0).reshape(4, 6)
    idx = torch.tensor([3, -1, 0])
    for mode in ["raise", *MODES]:
        st.checked_index(x, idx, mode=mode, check="always")
        assert launches.take() == 1, mode
        st.checked_index(x, (slice(None), idx), mode=mode, check="always")
        assert launches.take() == 1, mode
        st.index_select(x, 1, idx.abs(), mode=mode, check="always")
        assert launches.take() == 1, mode
        st.gather(x, 0, idx.abs().reshape(3, 1).expand(3, 6), mode=mode, check="always")
        assert launches.take() == 1, mode


@pytest.mark.parametrize(
    "call",
    [
        lambda x: st.checked_index(x, [0, 1], check="always"),  # a list
        lambda x: st.checked_index(x, (torch.tensor([0]), torch.tensor([1])), check="always"),
        lambda x: st.checked_index(x, (slice(1, None), torch.tensor([1])), check="always"),
        lambda x: st.checked_index(x, (0, torch.tensor([1])), check="always"),
        lambda x: st.checked_index(x, torch.tensor([True, False, True, True]), check="always"),
        lambda x: st.checked_index(x, torch.tensor([1], dtype=torch.uint8), check="always"),
        lambda x: st.checked_index(x, torch.tensor([], dtype=torch.int64), check="always"),
        lambda x: st.checked_index(
            x, torch.tensor([1]), mode="fill", fill_value=torch.ones(6), check="always"
        ),
        lambda x: st.index_select(x, 0, torch.tensor([[1]]), check="always"),  # torch raises
        lambda x: st.gather(x, 0, torch.tensor([[1]]), sparse_grad=True, check="always"),
        lambda x: st.gather(x, 0, torch.tensor([1]), check="always"),  # ndim mismatch
        lambda x: st.checked_index(x, torch.tensor([1])),  # policy auto: CPU torch directly
        lambda x: st.checked_index(x, torch.tensor([9]), mode="clip"),  # auto: torch path
    ],
)
def test_uncovered_forms_take_the_torch_path(call: Any, launches: Launches) -> None:
    x = torch.arange(24.0).reshape(4, 6)
    _assert_same(_reference(lambda: call(x)), _outcome(lambda: call(x)))
    assert launches.take() == 0


def test_without_triton_no_kernel_runs(launches: Launches) -> None:
    with _compat.override(HAS_TRITON=False):
        assert st_tensor._fused_device is st_tensor._fused_never
        st.checked_index(torch.arange(4), torch.tensor([9]), mode="clip", check="always")
    assert launches.take() == 0
    assert st_tensor._fused_device is st_tensor._fused_on_device


@pytest.mark.parametrize(
    "dtype", [torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool]
)
def test_every_integer_index_dtype_matches_torch(dtype: torch.dtype, launches: Launches) -> None:
    x = torch.arange(12.0).reshape(3, 4)
    idx = torch.tensor([1, 0, 1]).to(dtype)
    for call, raw in (
        (lambda: st.checked_index(x, idx, check="always"), lambda: x[idx]),
        (lambda: st.index_select(x, 1, idx, check="always"), lambda: torch.index_select(x, 1, idx)),
        (
            lambda: st.gather(x, 1, idx.reshape(3, 1), check="always"),
            lambda: torch.gather(x, 1, idx.reshape(3, 1)),
        ),
    ):
        _assert_same(_outcome(raw), _outcome(call))
    # int32 / int64 are what torch's ops take: only those reach the kernel
    assert launches.take() == (3 if dtype in (torch.int32, torch.int64) else 0)


# --- deferred records ---------------------------------------------------------------------------
def test_deferred_keeps_the_first_bad_position_across_programs() -> None:
    # 5,000 indices span five programs; the first bad position (1,500) is not in the first.
    x = torch.arange(10.0)
    idx = torch.zeros(5000, dtype=torch.int64)
    idx[4000], idx[1500], idx[3000] = -77, 2**40 + 3, 12
    out = st.checked_index(x, idx, mode="deferred", check="always")
    assert torch.equal(out, torch.zeros(5000))
    assert _deferred_message() == f"index {2**40 + 3} is out of bounds for dimension 0 with size 10"


@pytest.mark.parametrize("value", [-(2**63), 2**63 - 1, -(2**31) - 5, 2**42 + 12345, -11])
def test_deferred_values_survive_the_chunked_record(value: int) -> None:
    x = torch.arange(10.0).reshape(2, 5)
    st.index_select(x, 1, torch.tensor([0, 1, value]), mode="deferred", check="always")
    assert _deferred_message() == f"index {value} is out of bounds for dimension 1 with size 5"


def test_deferred_first_violation_wins_between_both_paths() -> None:
    x = torch.arange(6.0)
    st.checked_index(x, torch.tensor([7]), mode="deferred", check="always")  # fused, first
    st.checked_index(x, [8], mode="deferred", check="always")  # a list: the torch path
    st.index_select(x, 0, torch.tensor([9]), mode="deferred", check="always")
    assert _deferred_message() == "index 7 is out of bounds for dimension 0 with size 6"
    st.checked_index(x, [8], mode="deferred", check="always")  # torch path first
    st.gather(x, 0, torch.tensor([9]), mode="deferred", check="always")
    assert _deferred_message() == "index 8 is out of bounds for dimension 0 with size 6"


def test_deferred_names_the_calling_line() -> None:
    st.gather(torch.arange(6.0), 0, torch.tensor([0, 6]), mode="deferred", check="always")
    line = sys._getframe().f_lineno - 1
    with pytest.raises(IndexError, match=f"test_triton_index.py:{line} in "):
        st.raise_deferred()


@pytest.mark.parametrize("path", ["fused", "torch"])
def test_a_raise_mode_check_surfaces_a_deferred_violation(path: str) -> None:
    x = torch.arange(6.0)
    st.index_select(x, 0, torch.tensor([6]), mode="deferred", check="always")
    valid = torch.tensor([1]) if path == "fused" else [1]  # a list takes the torch path
    with pytest.raises(IndexError, match="index 6 is out of bounds.*mode='deferred'"):
        st.checked_index(x, valid, check="always")
    st.checked_index(x, valid, check="always")  # reported once, then cleared


def test_raise_buffers_are_per_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    # Triton's interpreter is not thread-safe (it patches triton.language per launch): the
    # launches are serialized, the reads of each thread's buffer are not.
    lock = threading.Lock()
    launch = _triton_index.launch

    def serialized(*args: Any, **kwargs: Any) -> None:
        with lock:
            launch(*args, **kwargs)

    monkeypatch.setattr(_triton_index, "launch", serialized)
    x = torch.arange(6.0)
    errors: List[str] = []

    def work(bad: bool) -> None:
        for _ in range(20):
            try:
                st.checked_index(x, torch.tensor([6 if bad else 5]), check="always")
            except IndexError as e:
                errors.append(str(e))

    threads = [threading.Thread(target=work, args=(b,)) for b in (True, False, True, False)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == ["index 6 is out of bounds for dimension 0 with size 6"] * 40


def test_empty_dimension_under_non_raising_modes() -> None:
    x = torch.zeros(0, 3)
    idx = torch.tensor([0, 2])
    for mode in ["clip", "wrap", "deferred"]:
        call = functools.partial(st.checked_index, x, idx, mode=mode, check="always")
        _assert_same(_reference(call), _outcome(call))
    filled = st.index_select(x, 0, idx, mode="fill", check="always")
    assert filled.shape == (2, 3) and bool(filled.isnan().all())


# --- no host sync, one kernel: what the host does per call ---------------------------------------
def _aten_ops(fn: Callable[[], Any]) -> List[str]:
    from torch.utils._python_dispatch import TorchDispatchMode

    class Record(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.ops: List[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            self.ops.append(str(func).split(".")[1])
            return func(*args, **(kwargs or {}))

    with Record() as rec:
        fn()
    return rec.ops


# Allocation and views only: anything else would be a kernel of its own.
_HOST_OPS = {"empty", "view", "_reshape_alias", "reshape", "as_strided", "detach", "alias", "t"}


@pytest.mark.parametrize("mode", MODES)
def test_the_kernel_is_the_only_device_work(mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_triton_index, "launch", lambda *a, **k: None)  # the host side alone
    x = torch.randn(3, 5)
    i2, i1, g = torch.tensor([[-9, 0], [2, 7]]), torch.tensor([1, 9]), torch.tensor([[0, 9]])
    calls = [
        lambda: st.checked_index(x, i2, mode=mode, fill_value=0.5),
        lambda: st.checked_index(x, (slice(None), i1), mode=mode),
        lambda: st.index_select(x, 1, i1, mode=mode, fill_value=2),
        lambda: st.gather(x, 1, g, mode=mode),
    ]
    previous = st.set_index_check("always")
    try:
        for call in calls:
            call()  # warm: the device record, fill-value bits
            idx_free = [op for op in _aten_ops(call) if op not in _HOST_OPS]
            assert idx_free == [], (mode, idx_free)
    finally:
        st.set_index_check(previous)


# --- autograd and torch.compile ------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["raise", *MODES])
@pytest.mark.parametrize("op", ["getitem", "getitem-dim1", "index_select", "gather"])
def test_gradients_match_the_torch_path(mode: str, op: str, launches: Launches) -> None:
    base = torch.arange(12.0, dtype=torch.float64).reshape(3, 4)
    idx = torch.tensor([0, 2, 2, 1]) if mode == "raise" else torch.tensor([0, 2, 9, -5])

    def call(x: torch.Tensor) -> torch.Tensor:
        if op == "getitem":
            return st.checked_index(
                x, idx.remainder(3) if mode == "raise" else idx, mode=mode, check="always"
            )
        if op == "getitem-dim1":
            return st.checked_index(x, (slice(None), idx), mode=mode, check="always")
        if op == "index_select":
            return st.index_select(x, 1, idx, mode=mode, check="always")
        return st.gather(
            x, 1, idx.reshape(1, 4).expand(3, 4).contiguous(), mode=mode, check="always"
        )

    def grad(fused: bool) -> torch.Tensor:
        x = base.clone().requires_grad_(True)
        if fused:
            out = call(x)
        else:
            with _compat.override(HAS_TRITON=False):
                out = call(x)
        w = torch.arange(1.0, out.numel() + 1, dtype=torch.float64).reshape(out.shape)
        (out * w).sum().backward()
        assert x.grad is not None
        return x.grad

    assert torch.equal(grad(True), grad(False))
    assert launches.take() == 1
    st.clear_deferred()


def test_gradcheck_through_the_kernel() -> None:
    x = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    idx = torch.tensor([[0, 3, 1], [2, 2, 0]])
    assert torch.autograd.gradcheck(
        lambda t: st.gather(t, 0, idx, mode="clip", check="always"), (x,)
    )
    assert torch.autograd.gradcheck(
        lambda t: st.checked_index(t, (slice(None), torch.tensor([2, -1, 2])), check="always"),
        (x,),
    )


@pytest.fixture
def fresh_dynamo() -> Iterator[None]:
    if not (_compat.HAS_COMPILE and _compat.HAS_CUSTOM_OP):
        pytest.skip("the fused op under torch.compile needs torch >= 2.4 (custom ops)")
    torch._dynamo.reset()
    previous = st.set_index_check("always")
    try:
        yield
    finally:
        st.set_index_check(previous)
        torch._dynamo.reset()


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_compiled_raise_and_deferred_run_the_fused_op(
    backend: str, fresh_dynamo: None, launches: Launches
) -> None:
    def f(x: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
        a = st.checked_index(x, i)
        b = st.index_select(x, 0, i.abs(), mode="deferred")
        return a + b

    g = torch.compile(f, fullgraph=True, backend=backend)
    x = torch.arange(6.0)
    torch.testing.assert_close(g(x, torch.tensor([1, -2])), torch.tensor([2.0, 6.0]))
    assert launches.take() == 2
    with pytest.raises(IndexError, match="index 9 is out of bounds for dimension 0 with size 6"):
        g(x, torch.tensor([1, 9]))
    st.clear_deferred()
    g(x, torch.tensor([1, -6]))  # valid for x[i]; |-6| is out of range for index_select
    assert _deferred_message() == "index 6 is out of bounds for dimension 0 with size 6"


def test_compiled_gradient_through_the_fused_op(fresh_dynamo: None, launches: Launches) -> None:
    idx = torch.tensor([[0, 2], [9, 1]])

    def f(x: torch.Tensor) -> torch.Tensor:
        return st.gather(x, 1, idx, mode="deferred").sum()

    x = torch.arange(6.0).reshape(2, 3).requires_grad_(True)
    torch.compile(f, fullgraph=True, backend="aot_eager")(x).backward()
    assert x.grad is not None
    assert torch.equal(x.grad, torch.tensor([[1.0, 0.0, 1.0], [1.0, 1.0, 0.0]]))
    assert launches.take() == 1
    assert _deferred_message() == "index 9 is out of bounds for dimension 1 with size 3"


# --- large offsets and the real compiler --------------------------------------------------------
def _available_bytes() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


@pytest.mark.slow
@pytest.mark.skipif(_available_bytes() < 8 * 2**30, reason="needs 8 GiB free for a 2 GiB tensor")
def test_offsets_past_2_31_elements(launches: Launches) -> None:
    n = 2**31 + 16
    x = torch.empty(n, dtype=torch.int8)
    picks = [n - 1, 2**31 + 3, 2**31 - 1, 0]
    for k, p in enumerate(picks):
        x[p] = k + 1
    idx = torch.tensor([2**31 + 3, -1, 2**31 - 1, 0, -(2**31) - 15])
    assert torch.equal(st.checked_index(x, idx, check="always"), x[idx])
    x2 = x[: 2**31 + 8].view(2, 2**30 + 4)  # row 1 starts past 2**31 - 2**30
    gidx = torch.tensor([[0], [2**30 + 3]])
    assert torch.equal(st.gather(x2, 1, gidx, check="always"), torch.gather(x2, 1, gidx))
    assert launches.take() == 2


def test_kernel_compiles_for_nvidia_targets() -> None:
    """Every mode x form x element size compiles to a cubin for sm_80 and sm_90 (no GPU)."""
    code = (
        "from safetorch import _triton_index as t\n"
        "for arch in (80, 90):\n"
        "    for mode in range(5):\n"
        "        for form in (t.TAKE, t.GATHER):\n"
        "            assert 'cubin' in t.compile_for(arch, mode=mode, form=form)\n"
        "    for dtype in ('i8', 'i16', 'i64'):\n"
        "        assert 'cubin' in t.compile_for(arch, dtype=dtype, mode=t.DEFERRED)\n"
        "    assert 'cubin' in t.compile_for(arch, ints='i64', has_p=False, block_r=1024,"
        " block_q=1)\n"
        "    assert 'cubin' in t.compile_for(arch, block_r=1, block_q=1024)\n"
        "print('compiled')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "0"
    root = str(pathlib.Path(_triton_index.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join([root, env.get("PYTHONPATH", "")])
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=500, env=env
    )
    assert out.returncode == 0 and "compiled" in out.stdout, out.stderr[-3000:]
