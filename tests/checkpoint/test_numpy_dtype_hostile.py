"""Hostile numpy pickles: no path of the restricted unpickler builds an object dtype.

Each case is a hand-written protocol-2 pickle (the opcodes numpy itself writes, with the
arguments or BUILD states changed), wrapped in a torch zip archive, and loaded three ways:
``st.load`` (safetorch's unpickler, in a child process wherever a regression could read raw
pointers), the restricted unpickler directly (``_unpickler``), and ``torch.load(...,
weights_only=True)`` with the same numpy globals allowed (in one child process for all cases:
torch admits some of these, and then reading the array crashes the interpreter). Where torch
admits a case, the test records it ("TORCH ADMITS") and safetorch must still refuse it.

The attack behind the rule: numpy's dtype ``__setstate__`` takes the flags from the state, so
``dtype('O')`` BUILT with flags 0 says ``hasobject=False`` and its array holds raw pointers that
segfault when read. The unpickler decides from ``.kind`` / ``.fields`` / ``.subdtype`` instead.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import signal
import struct
import warnings
from typing import Any, Callable, Dict, List, Sequence, Tuple

import pytest
import torch
from _pickles import archive  # tests/_pickles.py (on sys.path through conftest)
from hypothesis import given, settings
from hypothesis import strategies as hst

import safetorch as st
from safetorch.checkpoint import _unpickler
from safetorch.errors import UnsafeAllowError

np = pytest.importorskip("numpy")

MA = "numpy._core.multiarray" if hasattr(np, "_core") else "numpy.core.multiarray"
ARRAY_GLOBALS = [f"{MA}._reconstruct", "numpy.ndarray", "numpy.dtype"]


# --- a tiny protocol-2 pickle writer ---------------------------------------------------------
def g(module: str, name: str) -> bytes:
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def s(text: str) -> bytes:
    data = text.encode("utf-8", "surrogatepass")
    return b"X" + struct.pack("<I", len(data)) + data


def i(n: int) -> bytes:
    return b"J" + struct.pack("<i", n)


def raw(data: bytes) -> bytes:
    """bytes as protocol 2 writes them (torch's unpickler has no BINBYTES)."""
    return g("_codecs", "encode") + t(s(data.decode("latin1")), s("latin1")) + b"R"


def t(*items: bytes) -> bytes:
    return b"(" + b"".join(items) + b"t"


NONE, TRUE, FALSE, REDUCE, BUILD, NEWOBJ = b"N", b"\x88", b"\x89", b"R", b"b", b"\x81"


def put(n: int) -> bytes:
    return b"q" + bytes([n])


def get(n: int) -> bytes:
    return b"h" + bytes([n])


def pkl(body: bytes) -> bytes:
    return b"\x80\x02" + body + b"."


def dtype(spec: str, copy: bytes = TRUE) -> bytes:
    return g("numpy", "dtype") + t(s(spec), FALSE, copy) + REDUCE


def dstate(
    order: str = "|",
    sub: bytes = NONE,
    names: bytes = NONE,
    fields: bytes = NONE,
    elsize: int = -1,
    align: int = -1,
    flags: int = 0,
) -> bytes:
    return t(i(3), s(order), sub, names, fields, i(elsize), i(align), i(flags))


def built_dtype(spec: str, **state: Any) -> bytes:
    return dtype(spec) + dstate(**state) + BUILD


def empty_array() -> bytes:
    return g(MA, "_reconstruct") + t(g("numpy", "ndarray"), t(i(0)), s("b")) + REDUCE


def array(dtype_ops: bytes, shape: Sequence[int], data: bytes) -> bytes:
    shape_ops = t(*(i(n) for n in shape))
    return empty_array() + t(i(1), shape_ops, dtype_ops, FALSE, raw(data)) + BUILD


def restricted(data_pkl: bytes, allow: Sequence[Any] = ARRAY_GLOBALS) -> Any:
    extra = _unpickler.resolve_allowed(allow)
    return _unpickler.make_restricted_pickle_module(extra).loads(data_pkl)


# --- the hostile cases -----------------------------------------------------------------------
O_FORGED = built_dtype("O8", flags=0)  # dtype('O') whose state claims hasobject=0
POINTERS = struct.pack("<QQ", 0x4141414141414141, 0x10)  # two "PyObject*" to read

CASES: Dict[str, bytes] = {
    # an object dtype, flags forged to say "no objects"
    "object_dtype_forged_flags": pkl(O_FORGED),
    "object_dtype_plain": pkl(built_dtype("O8", flags=63)),
    # ... and an array of it: raw pointers (torch: segfault on access)
    "object_array_forged_flags": pkl(array(O_FORGED, (2,), POINTERS)),
    # a structured dtype with an 'O' field; the field dtype forged too
    "structured_object_field": pkl(
        built_dtype(
            "V8", names=t(s("a")), fields=b"}" + s("a") + t(O_FORGED, i(0)) + b"s", elsize=8
        )
    ),
    # a subarray of 'O'
    "subarray_of_object": pkl(built_dtype("V16", sub=t(O_FORGED, t(i(2))), elsize=16)),
    # a structured array whose only field is 'O' (flags 0): pointers again
    "structured_object_array": pkl(
        array(
            built_dtype(
                "V8", names=t(s("a")), fields=b"}" + s("a") + t(O_FORGED, i(0)) + b"s", elsize=8
            ),
            (1,),
            POINTERS[:8],
        )
    ),
    # flags claiming object items on a float dtype (a DECREF of raw floats on free)
    "float_dtype_flags_hasobject": pkl(built_dtype("f8", order="<", flags=63)),
    # a field outside the item (out-of-bounds reads)
    "field_outside_item": pkl(
        built_dtype(
            "V8",
            names=t(s("a")),
            fields=b"}" + s("a") + t(dtype("f8"), i(1000)) + b"s",
            elsize=8,
        )
    ),
    # a subarray larger than the item
    "subarray_larger_than_item": pkl(built_dtype("V16", sub=t(dtype("f8"), t(i(100))), elsize=16)),
    # copy=False: the process-wide float64 singleton, then BUILT with object flags
    "singleton_dtype_rebuilt": pkl(dtype("f8", copy=FALSE) + dstate(order="<", flags=63) + BUILD),
    # NEWOBJ: numpy.dtype.__new__ without copy (the singleton again)
    "dtype_by_newobj": pkl(g("numpy", "dtype") + t(s("f8")) + NEWOBJ + dstate(flags=63) + BUILD),
    # numpy.dtypes.ObjectDType called directly
    "object_dtype_class_called": pkl(g("numpy.dtypes", "ObjectDType") + t() + REDUCE),
    # scalar() of an object dtype: the "bytes" become an object
    "scalar_of_object_dtype": pkl(g(MA, "scalar") + t(O_FORGED, raw(POINTERS[:8])) + REDUCE),
    # an array rebuilt with a big shape up front (allocation before the bytes arrive)
    "reconstruct_huge_shape": pkl(
        g(MA, "_reconstruct") + t(g("numpy", "ndarray"), t(i(1 << 30), i(1 << 30)), s("b")) + REDUCE
    ),
    # unicode of 3 bytes (not a whole UCS4 code point)
    "unicode_of_3_bytes": pkl(built_dtype("U1", order="<", elsize=3, align=4, flags=8)),
}
# a dtype BUILT after an array uses it: its item grows under the array (out-of-bounds reads)
CASES["dtype_rebuilt_after_use"] = pkl(
    b"("  # MARK: a tuple (array, dtype) so both stay on the stack
    + dtype("V8")
    + put(0)
    + empty_array()
    + t(i(1), t(i(1)), get(0), FALSE, raw(b"\0" * 8))
    + BUILD
    + get(0)
    + dstate(elsize=1 << 20, align=1)
    + BUILD
    + b"t"
)
GLOBALS_FOR = {
    "object_dtype_class_called": ["numpy.dtype", "numpy.dtypes.ObjectDType"],
    "scalar_of_object_dtype": ["numpy.dtype", f"{MA}.scalar"],
}


def in_child(run: Callable[[], Any]) -> Tuple[int, Any]:
    """``run()`` in a forked child (a crash there is an exit status here): (status, result)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        status = 0
        try:
            os.close(r)
            os.dup2(os.open(os.devnull, os.O_WRONLY), 2)  # no faulthandler dump of a crash
            signal.alarm(60)
            os.write(w, json.dumps(run()).encode())
        except BaseException:
            status = 3
        finally:
            os._exit(status)
    os.close(w)
    with os.fdopen(r, "rb") as pipe:
        out = pipe.read()
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), json.loads(out) if out else None


def _globals_for(name: str) -> List[str]:
    return GLOBALS_FOR.get(name, ARRAY_GLOBALS + [f"{MA}.scalar"])


def _torch_load(data: bytes, names: List[str]) -> str:
    objs = [_unpickler.import_global(n) for n in names]
    objs += [type(np.dtype(c)) for c in ("f8", "V8", "O", "U1")]  # what numpy.dtype returns
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # numpy's "object scalar" warning is no refusal
        try:
            with torch.serialization.safe_globals(objs):
                out = torch.load(io.BytesIO(data), weights_only=True)
        except Exception:
            return "refused"
        try:
            repr(out)  # reading the array: raw pointers crash here
        except Exception as exc:
            return f"loaded, reading it raised {type(exc).__name__}"
    return "loaded+read"


def _st_load(data: bytes, names: List[str]) -> List[Any]:
    try:
        out = st.load(io.BytesIO(data), allow=names)
    except Exception as exc:
        return [type(exc).__name__, str(exc), bool(np.dtype("f8").hasobject)]
    return ["loaded", repr(out)[:200], bool(np.dtype("f8").hasobject)]


# ``numpy.dtypes`` (ObjectDType, Float64DType, ...) is new in numpy 1.25: before it, the case
# that names ``numpy.dtypes.ObjectDType`` names nothing numpy has.
_NEEDS_NUMPY_DTYPES = pytest.mark.skipif(
    not hasattr(np, "dtypes"), reason="numpy.dtypes (ObjectDType) is new in numpy 1.25"
)


def _case_params(names: Any) -> List[Any]:
    return [
        pytest.param(n, marks=_NEEDS_NUMPY_DTYPES) if n == "object_dtype_class_called" else n
        for n in sorted(names)
    ]


@pytest.mark.parametrize("name", _case_params(CASES))
def test_hostile_numpy_case_is_refused_where_torch_is_not_stricter(name: str) -> None:
    """st.load refuses every case (in a child: a regression would read raw pointers and crash
    the test run), without touching the process-wide float64 dtype; torch.load(weights_only=
    True) with the same globals allowed refuses too or, recorded as TORCH ADMITS, does not."""
    data, names = archive(CASES[name]), _globals_for(name)
    status, verdict = in_child(lambda: _st_load(data, names))
    assert status == 0, f"safetorch crashed (status {status}) on {name}"
    assert verdict[0] in ("UnsafeCheckpointError", "UnsafeAllowError"), verdict
    assert verdict[0] == "UnsafeAllowError" or "nothing from the file was executed" in verdict[1]
    assert verdict[2] is False  # float64 is not poisoned
    status, seen = in_child(lambda: _torch_load(data, names))
    seen = seen if status == 0 else f"crashed {status}"
    print(
        f"{name}: torch weights_only -> {seen}" + ("" if seen == "refused" else " (TORCH ADMITS)")
    )


@pytest.mark.parametrize("name", sorted(set(CASES) - {"object_dtype_class_called"}))
def test_restricted_unpickler_refuses_in_process(name: str) -> None:
    """The same bytes straight into the restricted unpickler: a RefusedOpcode / RefusedGlobal
    (an UnpicklingError) and never an object (safe in-process: refused before any array)."""
    allow = GLOBALS_FOR.get(name, ARRAY_GLOBALS + [f"{MA}.scalar"])
    with pytest.raises(pickle.UnpicklingError):
        restricted(CASES[name], allow)
    assert not np.dtype("f8").hasobject


@_NEEDS_NUMPY_DTYPES
def test_object_dtype_class_is_no_allow_entry() -> None:
    """numpy.dtypes.ObjectDType is refused as an allow= entry; via allow=['numpy.dtype'] the
    file's GLOBAL of it is refused (torch needs it listed too)."""
    with pytest.raises(UnsafeAllowError):
        restricted(CASES["object_dtype_class_called"], ["numpy.dtype", "numpy.dtypes.ObjectDType"])
    with pytest.raises(_unpickler.RefusedGlobal):
        restricted(CASES["object_dtype_class_called"], ["numpy.dtype"])
    with pytest.raises(pickle.UnpicklingError):
        torch.load(io.BytesIO(archive(CASES["object_dtype_class_called"])), weights_only=True)


def test_float64_array_loads_with_exactly_the_globals_the_refusal_lists(tmp_path: Any) -> None:
    want = np.arange(6, dtype=np.float64).reshape(2, 3)
    path = tmp_path / "arr.pt"
    torch.save({"a": want}, path)
    with pytest.raises(st.UnsafeCheckpointError) as info:
        st.load(path)
    listed = list(info.value.unsafe_globals)
    assert set(listed) <= set(ARRAY_GLOBALS) | {"numpy.core.multiarray._reconstruct"}
    got = st.load(path, allow=listed)["a"]
    assert got.dtype == want.dtype and (got == want).all()
    # torch refuses the same bytes without these globals, as safetorch did
    with pytest.raises(pickle.UnpicklingError):
        torch.load(path, weights_only=True)


@pytest.mark.parametrize(
    "value",
    [
        np.arange(4, dtype=np.int32),
        np.zeros((2, 2), dtype=[("x", "<f4"), ("y", "<i2", (3,))]),
        np.array(["ab", "c"]),
        np.array([1, 2], dtype="datetime64[ns]"),
        np.float64(2.5),
        np.array(1.5, dtype=np.float16),
    ],
    ids=["int32", "structured", "unicode", "datetime", "scalar", "0d"],
)
def test_numpy_data_still_loads(value: Any, tmp_path: Any) -> None:
    """What numpy itself writes for non-object dtypes passes every check."""
    path = tmp_path / "v.pt"
    torch.save({"v": value}, path)
    allow = ARRAY_GLOBALS + [f"{MA}.scalar"] + [type(np.dtype(value.dtype))]
    got = st.load(path, allow=allow)["v"]
    assert type(got) is type(value) and got.dtype == value.dtype
    assert np.array_equal(np.asarray(got), np.asarray(value))


def test_scalar_with_wrong_byte_count_is_refused() -> None:
    data = pkl(g(MA, "scalar") + t(dtype("f8"), raw(b"\0" * 4)) + REDUCE)
    with pytest.raises(_unpickler.RefusedOpcode, match="itemsize"):
        restricted(data, ARRAY_GLOBALS + [f"{MA}.scalar"])


def test_reconstruct_of_a_subclass_is_refused() -> None:
    """numpy.matrix runs its own code on construction: no allow= entry; named by a caller's
    own allow-list (as add_safe_globals would), _reconstruct still builds only ndarray."""
    data = pkl(g(MA, "_reconstruct") + t(g("numpy", "matrix"), t(i(0)), s("b")) + REDUCE)
    with pytest.raises(UnsafeAllowError, match="numpy.matrix"):
        restricted(data, ARRAY_GLOBALS + ["numpy.matrix"])
    extra = {**_unpickler.resolve_allowed(ARRAY_GLOBALS), "numpy.matrix": np.matrix}
    with pytest.raises(_unpickler.RefusedOpcode, match="only as numpy pickles it"):
        _unpickler.make_restricted_pickle_module(extra).loads(data)


_KINDS = ["f8", "i4", "u1", "f2", "i8"]


@settings(max_examples=60, deadline=None)
@given(
    elsize=hst.integers(0, 64),
    fields=hst.lists(
        hst.tuples(hst.sampled_from(_KINDS), hst.integers(-8, 72)), min_size=1, max_size=4
    ),
    flags=hst.sampled_from([0, 16, 1, 63, 0x20, 0x80 | 0x10]),
)
def test_fuzzed_structured_states_are_refused_or_consistent(
    elsize: int, fields: List[Tuple[str, int]], flags: int
) -> None:
    """Random structured-dtype BUILD states: each is refused, or the dtype it yields has every
    field inside its item, no object flags, and the array of it loads (never read raw)."""
    names = [f"f{n}" for n in range(len(fields))]
    field_ops = b"}" + b"".join(
        s(n) + t(dtype(k), i(off)) + b"s" for n, (k, off) in zip(names, fields)
    )
    state = dict(names=t(*(s(n) for n in names)), fields=field_ops, elsize=elsize, align=1)
    body = built_dtype(f"V{max(elsize, 1)}", flags=flags, **state)
    try:
        d = restricted(pkl(body))
    except (pickle.UnpicklingError, ValueError, TypeError):
        return
    assert not d.hasobject and d.flags & ~0x98 == 0
    for k, off in fields:
        assert 0 <= off and off + np.dtype(k).itemsize <= d.itemsize
