"""Issue 22, deliverable 1: 0.3-era code that indexes 0-dim tensors, compares ``type(h) ==
Variable`` and forks after OpenMP runs unedited under the ``legacy`` patch.

Every behaviour is checked side by side: the same input through plain torch (which raises,
or compares False, or deadlocks) and through the patch (which gives what 0.3 gave).
"""

from __future__ import annotations

import copy
import io
import json
import os
import pickle
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator, List

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as hs

import safetorch as st
from safetorch import _stack, legacy
from safetorch.errors import PatchWarning
from safetorch.legacy import VolatileTensor
from safetorch.patching import _registry, _report

Variable = torch.autograd.Variable  # bound before any patch, as `from torch.autograd import`
VariableMeta = type(Variable)


@pytest.fixture(autouse=True)
def _nothing_patched() -> Iterator[None]:
    _registry.reset()
    _report.reset_counts()
    yield
    _registry.reset()
    _report.reset_counts()


class UserTensor(torch.Tensor):
    """A user subclass with torch's default ``__torch_function__``."""


def _make(kind: str, value: Any, dtype: torch.dtype) -> torch.Tensor:
    base = torch.tensor(value, dtype=dtype)
    if kind == "volatile":
        return legacy.volatile(base)
    if kind == "user":
        return base.as_subclass(UserTensor)
    if kind == "parameter":  # a frozen parameter: no graph to keep
        return torch.nn.Parameter(base, requires_grad=False)
    return base


_DTYPES = [torch.float32, torch.float64, torch.int64, torch.int32, torch.bool]
_KINDS = ["plain", "volatile", "user", "parameter"]
_LEGACY_INDICES = [0, -1, np.int64(0), np.int32(-1)]


def _quiet(fn: Callable[[], Any]) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PatchWarning)
        return fn()


# --- 0-dim x[0] / x[-1]: the Python number --------------------------------------------------
@given(
    kind=hs.sampled_from(_KINDS),
    dtype=hs.sampled_from(_DTYPES),
    value=hs.integers(-1000, 1000),
    index=hs.sampled_from(_LEGACY_INDICES),
)
def test_zero_dim_first_or_last_is_the_number_where_plain_torch_raises(
    kind: str, dtype: torch.dtype, value: int, index: Any
) -> None:
    x = _make(kind, value, dtype)
    with pytest.raises(IndexError):
        x[index]  # plain torch: "invalid index of a 0-dim tensor" / "out of bounds"
    with pytest.raises(IndexError):
        x.data[index]
    expected = x.item()
    with st.patched("legacy"):
        got, got_data = _quiet(lambda: (x[index], x.data[index]))
    assert type(got) is type(expected) and got == expected
    assert type(got_data) is type(expected) and got_data == expected


@given(
    kind=hs.sampled_from(_KINDS),
    shape=hs.sampled_from([(), (1,), (3,), (2, 2)]),
    index=hs.one_of(
        hs.integers(-4, 4),
        hs.sampled_from([Ellipsis, None, True, False, (0,), (0, 0), slice(None), slice(1, 2)]),
    ),
)
def test_every_other_index_is_plain_torch(kind: str, shape: tuple, index: Any) -> None:
    x = _make(kind, torch.arange(int(np.prod(shape))).reshape(shape).tolist(), torch.int64)
    if x.dim() == 0 and type(index) is int and index in (0, -1):
        return  # the one case the patch changes (test above)
    try:
        plain: Any = x[index]
    except IndexError as e:
        plain = e
    with st.patched("legacy"):
        try:
            patched: Any = x[index]
        except IndexError as e:
            patched = e
    if isinstance(plain, Exception):
        assert type(patched) is type(plain) and str(patched) == str(plain)
    elif type(plain) is torch.Tensor and plain.dim() == 0 and type(index) in (int, tuple):
        # one element by ints, from this (0.3-era: it builds Variables) file: the number's hash
        assert type(patched) is st.legacy.LegacyScalar and hash(patched) == hash(plain.item())
        assert patched.item() == plain.item()
    else:
        assert type(patched) is type(plain) and patched.shape == plain.shape
        assert torch.equal(patched.as_subclass(torch.Tensor), plain.as_subclass(torch.Tensor))


def test_ellipsis_of_a_zero_dim_tensor_stays_a_view_as_in_plain_torch() -> None:
    # x[...] succeeds in plain torch (a 0-dim view; 0.3's x[...] was a tensor too): unchanged.
    x = torch.tensor(2.5)
    plain = x[...]
    with st.patched("legacy"):
        patched = x[...]
    assert isinstance(patched, torch.Tensor) and patched.dim() == plain.dim() == 0
    assert patched.data_ptr() == plain.data_ptr() == x.data_ptr()


def test_a_zero_dim_tensor_that_requires_grad_keeps_its_graph() -> None:
    w = torch.tensor([1.0, 2.0], requires_grad=True)
    loss = (w * w).sum()
    with st.patched("legacy"):
        picked = _quiet(lambda: loss[0])
        assert isinstance(picked, torch.Tensor) and picked.grad_fn is not None
        (3 * picked).backward()
        assert w.grad is not None and w.grad.tolist() == [6.0, 12.0]  # d(3 * sum w^2)
        with torch.no_grad():
            assert _quiet(lambda: loss[0]) == 5.0  # no graph to keep: the number
        assert _quiet(lambda: loss.data[0]) == 5.0  # .data never requires grad
        p = torch.nn.Parameter(torch.tensor(3.0))
        assert _quiet(lambda: p.data[-1]) == 3.0 and isinstance(_quiet(lambda: p[0]), torch.Tensor)


def test_the_warning_names_each_line_once() -> None:
    loss = torch.tensor(0.25)
    volatile_loss = legacy.volatile(torch.tensor(0.5))
    with st.patched("legacy"):
        with pytest.warns(PatchWarning, match=r"x\.item\(\)") as caught:
            for _ in range(3):
                value = loss.data[0]  # one line, three calls
            again = volatile_loss.data[0] + volatile_loss[0]  # one line, two calls
        assert value == 0.25 and again == 1.0
        lines = [(w.filename, w.lineno) for w in caught if w.category is PatchWarning]
    here = test_the_warning_names_each_line_once.__code__.co_firstlineno
    assert [f for f, _ in lines] == [__file__, __file__]
    assert [n - here for _, n in lines] == [6, 7]
    kinds = [e for e in _registry.report_entries() if "0-dim" in e.kind]
    assert kinds and sum(e.count for e in kinds) == 5  # the report counts every call


def test_the_public_function_returns_the_number_without_the_patch() -> None:
    with pytest.warns(PatchWarning) as caught:
        assert legacy.zero_dim_index(torch.tensor(7), -1) == 7
    assert caught[0].filename == __file__
    assert torch.equal(legacy.zero_dim_index(torch.arange(3), 1), torch.tensor(1))
    with pytest.raises(IndexError):
        legacy.zero_dim_index(torch.tensor(1.0), 1)  # only 0 / -1 ever meant "the value"
    with pytest.raises(IndexError):
        legacy.zero_dim_index(torch.empty((), device="meta"), 0)  # no number to give


def test_checked_indexing_path_gives_the_number_too(index_check_always: None) -> None:
    # CUDA/ROCm/MPS path (forced on CPU): st.checked_index raises before torch would.
    x = torch.tensor(7)
    with st.patched("index", "legacy"):
        assert _quiet(lambda: x[0]) == 7
        with pytest.raises(IndexError):
            x[1]
        assert torch.arange(3)[2].item() == 2


# --- what legacy code did with loss.data[0], volatile or not ---------------------------------
def _volatile_eval() -> tuple:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    with warnings.catch_warnings():  # plain torch: "volatile was removed and now has no effect"
        warnings.filterwarnings("ignore", "volatile was removed", UserWarning)
        scores = model(torch.autograd.Variable(torch.ones(1, 4), volatile=True))  # 0.3 idiom
    loss = scores.sum()
    idx = scores.max(1)[1]  # the argmax, shape (1,)
    return loss, idx.squeeze(0)


def test_legacy_uses_of_data0_fail_plain_and_work_patched() -> None:
    vocab = {i: f"word{i}" for i in range(3)}
    loss, idx = _volatile_eval()  # plain torch: volatile= ignored, 0-dim tensors
    with pytest.raises(IndexError):
        "{:.4f}".format(loss.data[0])  # noqa: UP032
    with pytest.raises(IndexError):
        vocab[idx.data[0]]
    with st.patched("legacy"):
        loss, idx = _volatile_eval()
        assert type(loss) is VolatileTensor and loss.grad_fn is None
        value, word = _quiet(lambda: (loss.data[0], vocab[idx.data[0]]))
        assert isinstance(value, float) and not isinstance(value, torch.Tensor)
        assert "{:.4f}".format(value) == f"{loss.item():.4f}"  # noqa: UP032
        assert word == vocab[idx.item()] and json.loads(json.dumps(value)) == value
        assert np.asarray(value).dtype == np.float64 and hash(value) == hash(loss.item())
        assert {value: 1}[loss.item()] == 1


def test_volatility_does_not_leak_out_of_the_tensor() -> None:
    plain = torch.tensor([[0.5, -1.25]])
    v = legacy.volatile(plain)
    scalar, plain_scalar = v.sum(), plain.sum()
    assert type(scalar) is VolatileTensor and scalar.volatile
    # formatting: exactly what the plain tensor formats to
    for spec in ("", ".4f", "+.2e", "10.3f"):
        assert format(scalar, spec) == format(plain_scalar, spec)
    assert f"{scalar:.3f}" == f"{plain_scalar:.3f}" and f"{v}" == f"{plain}"
    # .data is plain, as 0.3's Variable.data; iterating it yields plain tensors
    assert type(v.data) is torch.Tensor and v.data.data_ptr() == plain.data_ptr()
    assert [type(row) for row in v.data] == [torch.Tensor]
    # numbers and arrays
    assert type(scalar.item()) is float and type(v.tolist()[0][0]) is float
    assert type(v.numpy()) is np.ndarray and type(np.asarray(v)) is np.ndarray
    np.testing.assert_array_equal(np.asarray(v), plain.numpy())
    # hashing: by identity, as for a plain tensor
    assert hash(v) == id(v) and hash(plain) == id(plain)
    # volatile where 0.3's volatile Variable was: results, views, rows, deepcopy
    assert type(v[0]) is VolatileTensor and type(v.t()) is VolatileTensor
    assert [type(row) for row in v] == [VolatileTensor]
    copied = copy.deepcopy(v)
    assert type(copied) is VolatileTensor and copied.data_ptr() != v.data_ptr()
    assert torch.equal(copied.data, plain)
    v.data = torch.zeros(2)  # the setter still swaps the data
    assert type(v) is VolatileTensor and v.tolist() == [0.0, 0.0]


def test_a_saved_volatile_result_is_a_plain_tensor_that_loads_back() -> None:
    with st.patched("legacy"):
        loss, _ = _volatile_eval()
    assert type(loss) is VolatileTensor
    buffer = io.BytesIO()
    torch.save({"loss": loss, "rows": legacy.volatile(torch.arange(4.0))}, buffer)
    buffer.seek(0)
    back = torch.load(buffer, weights_only=True)  # no allowlist entry needed
    assert type(back["loss"]) is torch.Tensor and type(back["rows"]) is torch.Tensor
    assert back["loss"].item() == loss.item() and back["rows"].tolist() == [0, 1, 2, 3]
    assert type(pickle.loads(pickle.dumps(loss))) is torch.Tensor
    assert type(copy.copy(loss)) is torch.Tensor  # copy.copy pickles (documented)


# --- type(h) == Variable ---------------------------------------------------------------------
def repackage_hidden(h: Any) -> Any:
    """word_language_model/main.py of PyTorch 0.3, verbatim."""
    if type(h) == Variable:  # noqa: E721
        return Variable(h.data)
    else:
        return tuple(repackage_hidden(v) for v in h)


def _lstm_hidden(volatile: bool) -> tuple:
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(3, 2)
    x = torch.autograd.Variable(torch.ones(4, 1, 3), volatile=volatile)  # the name as patched
    return lstm(x)[1]


def test_repackage_hidden_fails_plain_and_detaches_patched() -> None:
    hidden = _lstm_hidden(volatile=False)
    assert hidden[0].grad_fn is not None
    with pytest.raises(TypeError, match="iteration over a 0-d tensor"):
        repackage_hidden(hidden)  # plain torch recurses into the tensor
    with st.patched("legacy"):
        for volatile in (False, True):
            hidden = _lstm_hidden(volatile)
            fresh = repackage_hidden(hidden)
            assert type(fresh) is tuple and len(fresh) == 2
            for new, old in zip(fresh, hidden):
                assert type(new) is torch.Tensor and new.grad_fn is None
                assert not new.requires_grad and torch.equal(new, old.as_subclass(torch.Tensor))
    names = [e.kind for e in _registry.report_entries()]
    assert any(n.startswith("type(x) == Variable -> isinstance") for n in names), names


def test_variable_equality_under_the_patch_and_exactly_restored() -> None:
    before = dict(vars(VariableMeta))
    hash_before = hash(Variable)
    t, p = torch.ones(1), torch.nn.Parameter(torch.ones(1))
    # E721: comparing types with == is the legacy idiom under test
    assert type(t) != Variable and not (Variable == torch.Tensor)  # noqa: E721
    with st.patched("legacy"):
        assert type(t) == Variable and Variable == type(t)  # noqa: E721
        assert not (type(t) != Variable)  # noqa: E721
        assert type(legacy.volatile(t)) == Variable  # noqa: E721  # a volatile Variable
        wrapped_name = torch.autograd.Variable  # the name as the patch wrapped it
        assert type(wrapped_name(t)) == wrapped_name  # noqa: E721
        assert type(p) != Variable and UserTensor != Variable  # noqa: E721  # not in 0.3 either
        assert Variable == Variable and Variable != int  # noqa: E721
        assert isinstance(t, Variable) and isinstance(p, Variable)  # as in plain torch
        assert hash(Variable) == hash_before and {Variable: 1}[Variable] == 1
    assert dict(vars(VariableMeta)) == before and hash(Variable) == hash_before
    assert type(t) != Variable  # noqa: E721


# --- fork children: one intra-op thread -----------------------------------------------------
needs_fork = pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is POSIX only")


def _in_fork_child(work: Callable[[], Any], deadline: float = 30.0) -> Any:
    """Run ``work`` in an ``os.fork()`` child; its JSON result, or a failure after ``deadline``."""
    read, write = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+: fork with threads
        pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        code = 1
        try:
            os.close(read)
            os.write(write, json.dumps(work()).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    end = time.monotonic() + deadline
    try:
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > end:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                pytest.fail(f"the fork child did not finish within {deadline:.0f} s (deadlock)")
            time.sleep(0.02)
        chunks: List[bytes] = []
        while chunk := os.read(read, 65536):
            chunks.append(chunk)
    finally:
        os.close(read)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    return json.loads(b"".join(chunks))


@pytest.fixture
def two_threads(monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    """The parent runs OpenMP regions on (at least) two threads; restored afterwards."""
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)
    before = torch.get_num_threads()
    torch.set_num_threads(max(2, before))  # before the patch: not the user's choice it sees
    try:
        yield torch.get_num_threads()
    finally:
        torch.set_num_threads(before)


def _conv_in_parent() -> tuple:
    conv = torch.nn.Conv2d(3, 8, 3)
    x = torch.randn(4, 3, 64, 64)
    with torch.no_grad():
        conv(x)  # the parent's OpenMP thread pool exists from here on
    return conv, x


@needs_fork
def test_a_fork_child_of_a_patched_process_runs_conv2d_on_one_thread(two_threads: int) -> None:
    conv, x = _conv_in_parent()
    expected = conv(x).sum().item()

    def child() -> Any:
        with torch.no_grad():
            out = conv(x).sum().item()  # deadlocks on the inherited pool (GNU libgomp)
        return [torch.get_num_threads(), out]

    with st.patched("legacy"):
        threads, out = _in_fork_child(child)
        assert torch.get_num_threads() == two_threads  # the parent keeps its threads
    assert threads == 1 and out == pytest.approx(expected, rel=1e-5)


@needs_fork
def test_fork_children_keep_threads_the_user_chose_or_after_unpatch(
    two_threads: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    _conv_in_parent()
    count = torch.get_num_threads  # no parallel work in these children: they may not use it

    with st.patched("legacy"):
        torch.set_num_threads(two_threads)  # the user's explicit choice, under the patch
        assert _in_fork_child(count) == two_threads
    with st.patched("legacy"):  # a new session forgets it: one thread again
        assert _in_fork_child(count) == 1
        # torch's own calls (the DataLoader's pin-memory thread) are not the user's choice
        torch_frame = compile("torch.set_num_threads(n)", _stack.TORCH_DIR + "fake.py", "exec")
        exec(torch_frame, {"torch": torch, "n": two_threads})
        assert _in_fork_child(count) == 1
        monkeypatch.setenv("OMP_NUM_THREADS", str(two_threads))
        assert _in_fork_child(count) == two_threads
        monkeypatch.delenv("OMP_NUM_THREADS")
        monkeypatch.setenv("MKL_NUM_THREADS", str(two_threads))
        assert _in_fork_child(count) == two_threads
        monkeypatch.delenv("MKL_NUM_THREADS")
    assert _in_fork_child(count) == two_threads  # unpatched: the hook is inert
    assert torch.set_num_threads is torch._C.set_num_threads  # restored


# --- a 0.3-era script, unedited, end to end --------------------------------------------------
ERA03 = Path(__file__).with_name("era03_script.py")


def _python(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    env["PYTHONPATH"] = str(ERA03.parents[2])
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, env=env, timeout=240
    )


@needs_fork
def test_era03_script_fails_plain_and_runs_unedited_under_safetorch_run() -> None:
    plain = _python("-W", "ignore", str(ERA03))
    assert plain.returncode == 1 and "iteration over a 0-d tensor" in plain.stderr
    done = _python("-m", "safetorch", "run", str(ERA03))
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert [line[:18] for line in got["log"]] == [f"| step {i:3d} | loss " for i in range(3)]
    assert all(w in ("<unk>", "the", "cat", "sat", "on", "mat") for w in got["words"])
    assert isinstance(got["loss"], float) and got["hidden_is_tensor"] == ["Tensor", "Tensor"]
    assert got["exitcodes"] == [0, 0] and got["child_threads"] == [1, 1]  # Hogwild workers
    lines = ERA03.read_text().splitlines()
    log_line = 1 + next(i for i, line in enumerate(lines) if "loss {:5.2f}" in line)
    type_line = 1 + next(i for i, line in enumerate(lines) if "if type(h) == Variable" in line)
    report = done.stderr
    assert f"3 x x[0] of a 0-dim tensor -> x.item()  [era03_script.py:{log_line}]" in report
    assert f"type(x) == Variable -> isinstance(x, torch.Tensor)  [era03_script.py:{type_line}]" in (
        report
    )
    # the loop's three calls warn once, naming the line
    assert report.count(f"era03_script.py:{log_line}: PatchWarning") == 1
