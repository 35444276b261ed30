"""Issue 34, deliverable 1: 0.3-era values under the ``legacy`` patch -- an index used as a
dict key, ``.numpy()[0]`` of a scalar, integer division, ``view`` of transposed strides.

Each input goes through plain torch and through the patch: identical where plain torch
succeeds (division: what 0.3 computed, ``rounding_mode="trunc"``, in 0.3-era code only), and
0.3's result where it raises. Calls made by library code (here: code compiled with a file
name inside torch's directory) and by a project without 0.3-era code keep torch's semantics.
"""

from __future__ import annotations

import copy
import io
import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Dict, Iterator

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as hs

import safetorch as st
from safetorch import _legacy_values, _stack
from safetorch.patching import _attribution, _registry, _report

Variable = torch.autograd.Variable  # this file builds Variables: 0.3-era project code


@pytest.fixture(autouse=True)
def _nothing_patched() -> Iterator[None]:
    _registry.reset()
    _report.reset_counts()
    yield
    _registry.reset()
    _report.reset_counts()
    _attribution._forget_project()


def _as_library(source: str, env: Dict[str, Any]) -> Any:
    """Run ``source`` as if it were code inside torch's package (library code)."""
    code = compile(textwrap.dedent(source), os.path.join(_stack.TORCH_DIR, "_st_fake.py"), "exec")
    exec(code, env)
    return env["result"]


def _outcome(fn: Any) -> Any:
    try:
        return fn()
    except (IndexError, RuntimeError, KeyError, TypeError) as e:
        return e


_INT = [torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8]
_ANY = [*_INT, torch.float32, torch.float64, torch.bool]


# --- a. an index used as a dict key ------------------------------------------------------------
@given(values=hs.lists(hs.integers(0, 50), min_size=1, max_size=6), pick=hs.integers(0, 5))
def test_an_index_from_a_1d_tensor_is_a_dict_key_as_0_3s_number(values: list, pick: int) -> None:
    x = torch.tensor(values)
    i = pick % len(values)
    words = {v: f"w{v}" for v in values}
    with pytest.raises(KeyError):
        words[x[i]]  # plain torch: a 0-dim tensor hashes by identity
    with st.patched("legacy"):
        ni = x[i]
        two_d = x.view(1, -1)[0][i], x.view(1, -1)[0, i]
        assert words[ni] == f"w{values[i]}" and all(words[k] == words[ni] for k in two_d)
        assert ni in set(values) and {ni, values[i]} == {values[i]}
        assert (ni == values[i]) is not False and bool(ni == values[i])
    assert type(ni) is st.legacy.LegacyScalar
    assert ni.data_ptr() == x[i].data_ptr()  # the same view
    assert torch.equal(ni.as_subclass(torch.Tensor), x[i]) and type(ni + 1) is torch.Tensor
    assert f"{ni:d}" == f"{values[i]:d}" and repr(ni) == repr(x[i]) and str(ni) == str(x[i])
    assert type(copy.deepcopy(ni)) is st.legacy.LegacyScalar and copy.deepcopy(ni) == ni
    buf = io.BytesIO()
    torch.save({"i": ni}, buf)
    buf.seek(0)
    assert type(torch.load(buf, weights_only=True)["i"]) is torch.Tensor  # plain when loaded
    assert type(pickle.loads(pickle.dumps(ni))) is torch.Tensor


@given(
    dtype=hs.sampled_from(_ANY),
    shape=hs.sampled_from([(3,), (2, 2), (1, 3, 1)]),
    index=hs.sampled_from([0, -1, 1, (0, 0), slice(None), None, ..., (0, slice(None))]),
)
def test_every_other_index_result_is_plain_torchs(
    dtype: torch.dtype, shape: tuple, index: Any
) -> None:
    x = torch.arange(int(np.prod(shape))).reshape(shape).to(dtype)
    plain = _outcome(lambda: x[index])
    with st.patched("legacy"):
        patched = _outcome(lambda: x[index])
    if isinstance(plain, Exception):
        assert type(patched) is type(plain) and str(patched) == str(plain)
        return
    assert torch.equal(patched.as_subclass(torch.Tensor), plain)
    one_element = type(index) in (int, tuple) and plain.dim() == 0
    assert type(patched) is (st.legacy.LegacyScalar if one_element else torch.Tensor)


def test_library_code_and_requires_grad_keep_torchs_scalar() -> None:
    x = torch.tensor([3, 4])
    with st.patched("legacy"):
        lib = _as_library("result = x[0]", {"x": x})
        w = torch.ones(2, requires_grad=True)
        g = (w * 2)[0]
        g.backward()
    assert type(lib) is torch.Tensor  # torch's own code: modern semantics
    assert type(g) is st.legacy.LegacyScalar and w.grad.tolist() == [2.0, 0.0]  # graph kept


# --- b. [0] on the NumPy array of a scalar --------------------------------------------------
@given(
    value=hs.floats(-1e6, 1e6, width=32),
    dtype=hs.sampled_from(_ANY),
    index=hs.sampled_from([0, -1, np.int64(0)]),
)
def test_numpy_of_a_0_dim_tensor_takes_0_as_0_3s_one_element_array(
    value: float, dtype: torch.dtype, index: Any
) -> None:
    x = torch.tensor(value).to(dtype)
    with pytest.raises(IndexError):
        x.numpy()[index]  # plain: too many indices for array
    with st.patched("legacy"):
        array = x.numpy()
        got = array[index]
        got_data = x.data.cpu().numpy()[index]
    want = x.numpy()[()]
    assert type(got) is type(want) and got == want and got_data == want
    assert np.shares_memory(array, x.numpy()) and isinstance(array, np.ndarray)
    assert repr(array) == repr(x.numpy()) and str(array) == str(x.numpy())
    assert type(pickle.loads(pickle.dumps(array))) is np.ndarray
    assert type(st.legacy.numpy(x)[index]) is type(want)


@given(
    shape=hs.sampled_from([(), (1,), (3,), (2, 2)]),
    index=hs.sampled_from([0, -1, 1, (), ..., (0, 0), slice(None)]),
)
def test_every_other_numpy_index_is_numpys(shape: tuple, index: Any) -> None:
    x = torch.arange(float(np.prod(shape))).reshape(shape)
    if x.dim() == 0 and type(index) is int and index in (0, -1):
        return  # the one case the patch changes (test above)
    plain = _outcome(lambda: x.numpy()[index])
    with st.patched("legacy"):
        patched = _outcome(lambda: x.numpy()[index])
    if isinstance(plain, Exception):
        assert type(patched) is type(plain) and str(patched) == str(plain)
    else:
        assert np.array_equal(np.asarray(patched), np.asarray(plain))
    with st.patched("legacy"):
        assert type(_as_library("result = x.numpy()", {"x": x})) is np.ndarray


# --- c. integer division -----------------------------------------------------------------------
_small = hs.integers(-100, 100)


@given(
    values=hs.lists(_small, min_size=1, max_size=5),
    divisor=_small.filter(bool),
    dtype=hs.sampled_from([torch.int64, torch.int32, torch.int16]),
    as_tensor=hs.booleans(),
)
def test_integer_division_truncates_as_0_3_did(
    values: list, divisor: int, dtype: torch.dtype, as_tensor: bool
) -> None:
    x = torch.tensor(values, dtype=dtype)
    d: Any = torch.tensor(divisor, dtype=dtype) if as_tensor else divisor
    plain = x / d
    assert plain.is_floating_point()  # torch >= 1.7: true division
    want = torch.div(x, d, rounding_mode="trunc")  # 0.3 (TorchScript's div_Tensor_0_3)
    assert want.tolist() == [int(v / divisor) for v in values]  # C's truncation, not floor
    with st.patched("legacy"):
        got = [x / d, x.div(d), torch.div(x, d)]
        y = x.clone()
        y /= d
        z = x.clone()
        z.div_(d)
        lib = _as_library("result = x / d", {"x": x, "d": d})
        explicit = torch.div(x, d, rounding_mode="floor")
    for g in (*got, y, z):
        assert g.dtype == want.dtype and torch.equal(g, want)
    assert torch.equal(lib, plain)  # torch's own code: true division
    assert torch.equal(explicit, torch.div(x, d, rounding_mode="floor"))  # said explicitly


@given(
    dtype=hs.sampled_from(_ANY),
    shape=hs.sampled_from([(), (3,)]),
    divisor=hs.one_of(hs.sampled_from([2, 3, -2]), hs.floats(0.5, 4.0)),
)
def test_every_other_division_is_torchs(dtype: torch.dtype, shape: tuple, divisor: Any) -> None:
    x = (torch.arange(int(np.prod(shape))) + 1).reshape(shape).to(dtype)
    if _legacy_values.truncates(x, divisor):
        return  # the case the patch changes (test above)
    plain = _outcome(lambda: x / divisor)
    with st.patched("legacy"):
        patched = _outcome(lambda: x / divisor)
    if isinstance(plain, Exception):
        assert type(patched) is type(plain)
    else:
        assert patched.dtype == plain.dtype and torch.equal(patched, plain)


def test_a_0_dim_count_divides_truly_as_0_3s_python_number() -> None:
    correct = (torch.tensor([1, 2, 3]) == torch.tensor([1, 0, 3])).sum()  # 0.3: the int 2
    with st.patched("legacy"):
        assert (correct / 3).item() == pytest.approx(2 / 3)


# --- d. view of transposed strides -----------------------------------------------------------
@given(
    rows=hs.integers(1, 4),
    cols=hs.integers(1, 4),
    shape=hs.sampled_from([(-1,), (-1, 1), (1, -1), (2, -1), (5,)]),
)
def test_view_falls_back_to_reshape_only_where_view_raises(
    rows: int, cols: int, shape: tuple
) -> None:
    a = torch.arange(rows * cols, dtype=torch.float32).reshape(rows, cols).t()
    y = a * 2  # an elementwise result with its input's (transposed) strides; 0.3: contiguous
    plain = _outcome(lambda: y.view(*shape))
    with st.patched("legacy"):
        patched = _outcome(lambda: y.view(*shape))
        lib = _outcome(lambda: _as_library("result = y.view(*shape)", {"y": y, "shape": shape}))
    contiguous = _outcome(lambda: y.contiguous().view(*shape))  # what 0.3 computed
    if not isinstance(plain, Exception):
        assert torch.equal(patched, plain) and patched.data_ptr() == plain.data_ptr()  # a view
    elif isinstance(contiguous, Exception):
        assert type(patched) is type(plain) and str(patched) == str(plain)  # a size error
    else:
        assert torch.equal(patched, contiguous)  # was raising: 0.3's result
    assert type(lib) is type(plain)  # library code: torch's own outcome
    with st.patched("legacy"):
        assert torch.equal(y.view(torch.int32), y.view(torch.int32))  # view(dtype): torch's


def test_the_report_lists_each_shim() -> None:
    x = torch.tensor([[1, 2], [3, 4]])
    with st.patched("legacy"):
        {2: 0}[x[0][1]]
        torch.tensor(1.0).numpy()[0]
        _ = x / 2
        (x.t() * 1).view(-1)
    kinds = " | ".join(e.kind for e in _report.entries())
    for text in ("dict key", "numpy()[0]", "rounding_mode='trunc'", "x.reshape"):
        assert text in kinds, kinds


# --- a project without 0.3-era code keeps torch's results ------------------------------------
def test_a_modern_script_under_safetorch_run_keeps_true_division_and_hashes(tmp_path: Path) -> None:
    script = tmp_path / "modern.py"
    script.write_text(
        "import torch\n"
        "x = torch.tensor([7, 4])\n"
        "print((x / 2).tolist(), type(x[0]).__name__, {7: 1}.get(x[0]))\n"
        "print((x.view(2, 1).t() * 1).view(-1).tolist())\n"  # contiguous already: a view
        "print(torch.tensor(2.0).numpy().shape)\n"
    )
    legacy = tmp_path / "old.py"
    legacy.write_text(
        script.read_text().replace(
            "import torch\n", "import torch\nfrom torch.autograd import Variable\n"
        )
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAFETORCH_")}
    run = [sys.executable, "-m", "safetorch", "run", "--no-report"]
    modern = subprocess.run(
        [*run, str(script)], capture_output=True, text=True, env=env, cwd=tmp_path
    )
    old = subprocess.run([*run, str(legacy)], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert modern.returncode == 0 and old.returncode == 0, modern.stderr + old.stderr
    assert modern.stdout.splitlines()[0] == "[3.5, 2.0] Tensor None"
    assert old.stdout.splitlines()[0] == "[3, 2] LegacyScalar 1"
