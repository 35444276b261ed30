"""``allow=`` admits data, never code: decided from what each entry *is*.

``resolve_allowed`` (behind ``st.load(allow=)``, ``safetorch run --allow`` and
``SAFETORCH_ALLOW``) refuses every callable that can run code with an ``UnsafeAllowError`` (a
ValueError) that names it and points to full trust (``safetorch trust FILE`` / ``st.trust``);
data classes still load. A file that *calls* an allowed class whose construction runs foreign
code is refused, and a sentinel proves nothing ran. Hostile files are loaded side by side with
``torch.load(weights_only=True)``: torch refuses too, or (marked TORCH ADMITS) runs the code
where safetorch refuses it.
"""

from __future__ import annotations

import argparse
import builtins
import collections
import dataclasses
import datetime
import decimal
import enum
import fractions
import functools
import importlib
import io
import marshal
import operator
import os
import pathlib
import pickle
import runpy
import struct
import subprocess
import sys
import types
import uuid
from typing import Any, List

import pytest
import torch
from _pickles import archive  # tests/_pickles.py (on sys.path through conftest)
from hypothesis import given, settings
from hypothesis import strategies as hst

import safetorch as st
from safetorch.checkpoint import _unpickler
from safetorch.errors import UnsafeAllowError

SENTINEL: List[str] = []  # what hostile constructors append to: must stay empty


# --- classes a user may allow ----------------------------------------------------------------
@dataclasses.dataclass
class Config:
    lr: float = 0.1
    name: str = "run"


class Color(enum.Enum):
    RED = 1
    BLUE = 2


class Runner:
    """A class whose constructor runs code: allowed as data (NEWOBJ + BUILD), never called."""

    def __init__(self, cmd: str) -> None:
        SENTINEL.append(f"Runner({cmd!r}) ran")


class CallingMeta(type):
    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        SENTINEL.append("CallingMeta.__call__ ran")
        return super().__call__(*args, **kwargs)


class Metered(metaclass=CallingMeta):
    """Data-only __new__/__init__, but a metaclass __call__ that runs code."""


class WithFinalizer:
    def __del__(self) -> None:
        SENTINEL.append("__del__ ran")


class MyPartial(functools.partial):  # type: ignore[type-arg]  # a subclass: still partial's __new__
    pass


@pytest.fixture(autouse=True)
def _clean_sentinel() -> Any:
    SENTINEL.clear()
    yield
    assert SENTINEL == [], SENTINEL


# --- a tiny protocol-2 pickle writer and a torch zip around it -------------------------------
def g(module: str, name: str) -> bytes:
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def s(text: str) -> bytes:
    data = text.encode()
    return b"X" + struct.pack("<I", len(data)) + data


def t(*items: bytes) -> bytes:
    return b"(" + b"".join(items) + b"t"


def pkl(body: bytes) -> bytes:
    return b"\x80\x02" + body + b"."


HERE = __name__


def torch_with(data: bytes, allowed: List[Any]) -> str:
    """torch.load(weights_only=True) of ``data`` with ``allowed`` as safe globals."""
    try:
        with torch.serialization.safe_globals(allowed):
            torch.load(io.BytesIO(archive(data)), weights_only=True)
    except pickle.UnpicklingError:
        return "refused"
    except Exception as exc:
        return f"raised {type(exc).__name__}"
    return "loaded"


# --- 1. allow= of a code-running callable is refused, naming it ---------------------------
CODE_RUNNERS = {
    "pickle.loads": pickle.loads,
    "builtins.eval": eval,
    "builtins.exec": exec,
    "builtins.compile": compile,
    "builtins.getattr": getattr,
    "builtins.setattr": setattr,
    "builtins.__import__": builtins.__import__,
    "builtins.open": open,
    "builtins.type": type,
    "os.system": os.system,
    "importlib.import_module": importlib.import_module,
    "subprocess.run": subprocess.run,
    "subprocess.check_output": subprocess.check_output,
    "subprocess.Popen": subprocess.Popen,
    "runpy._run_code": runpy._run_code,
    "marshal.loads": marshal.loads,
    "functools.reduce": functools.reduce,
    "functools.partial": functools.partial,
    "operator.attrgetter": operator.attrgetter,
    "operator.itemgetter": operator.itemgetter,
    "operator.methodcaller": operator.methodcaller,
    "operator.add": operator.add,
    "types.FunctionType": types.FunctionType,
    "types.CodeType": types.CodeType,
    "io.FileIO": io.FileIO,
    "builtins.dict.fromkeys": dict.fromkeys,
    f"{HERE}.MyPartial": MyPartial,
    f"{HERE}.WithFinalizer": WithFinalizer,
}


@pytest.mark.parametrize("as_string", [False, True], ids=["object", "string"])
@pytest.mark.parametrize("name", sorted(CODE_RUNNERS))
def test_allow_of_a_code_running_callable_is_refused(name: str, as_string: bool) -> None:
    entry = name if as_string else CODE_RUNNERS[name]
    path = io.BytesIO()
    torch.save({"w": torch.ones(1)}, path)
    with pytest.raises(UnsafeAllowError) as info:
        st.load(io.BytesIO(path.getvalue()), allow=[entry])
    err = info.value
    assert isinstance(err, ValueError) and isinstance(err, st.SafetorchError)
    text = str(err)
    assert "can run code" in text and "full trust" in text
    assert "safetorch trust FILE" in text and "st.trust(path)" in text
    if as_string:
        assert repr(name) in text
    assert not _unpickler.allow_would_admit(name)


def test_allow_error_names_the_torch_pair_form() -> None:
    with pytest.raises(UnsafeAllowError, match="'my.alias'"):
        _unpickler.resolve_allowed([(eval, "my.alias")])


# --- 2. data classes still load ------------------------------------------------------------
DATA = {
    "dataclass": (Config(lr=0.5), [Config]),
    "namespace": (argparse.Namespace(lr=0.5, epochs=3), []),
    "enum": (Color.BLUE, [Color]),
    "datetime": (
        datetime.datetime(2024, 5, 6, 7, 8, tzinfo=datetime.timezone.utc),
        [datetime.datetime, datetime.timezone, datetime.timedelta],
    ),
    "date_and_delta": (
        (datetime.date(2020, 1, 2), datetime.timedelta(3)),
        [datetime.date, datetime.timedelta],
    ),
    "decimal": (decimal.Decimal("1.25"), [decimal.Decimal]),
    "fraction": (fractions.Fraction(1, 3), [fractions.Fraction]),
    "uuid": (uuid.UUID(int=12345), [uuid.UUID]),
    "path": (pathlib.PurePosixPath("a/b.pt"), [pathlib.PurePosixPath]),
    "slice_range": ((slice(1, 5, 2), range(3)), [slice, range]),
    "empty_deque": (collections.deque(maxlen=4), [collections.deque]),
    "string_allow": (Config(), [f"{HERE}.Config"]),
}


@pytest.mark.parametrize("case", sorted(DATA))
def test_allow_of_data_classes_still_loads(case: str, tmp_path: Any) -> None:
    value, allow = DATA[case]
    path = tmp_path / "data.pt"
    torch.save({"v": value, "w": torch.arange(3)}, path)
    got = st.load(path, allow=allow)
    assert got["v"] == value and torch.equal(got["w"], torch.arange(3))
    for entry in allow:
        name = entry if isinstance(entry, str) else _unpickler.qualified_name(entry)
        assert _unpickler.allow_would_admit(name), name


# --- 3. a file that calls an allowed class whose construction runs code ---------------------
HOSTILE = {
    # REDUCE Runner("touch pwned"): an allowed class whose own __init__ runs code
    "own_init": (pkl(g(HERE, "Runner") + t(s("touch pwned")) + b"R"), [Runner], "__init__"),
    # REDUCE Metered(): data __new__/__init__ but a metaclass __call__ that runs code
    "metaclass_call": (pkl(g(HERE, "Metered") + t() + b"R"), [Metered], "metaclass"),
    # REDUCE functools.partial(os.system, ...) with only an allowed data class named
    "partial_not_allowed": (
        pkl(g("functools", "partial") + t(g("posix", "system"), s("id")) + b"R"),
        [Config],
        "outside the weights-only allow-list",
    ),
    # REDUCE types.FunctionType(...) reached while only Config is allowed
    "function_type_not_allowed": (
        pkl(g("types", "FunctionType") + t(s("x"), s("y")) + b"R"),
        [Config],
        "outside the weights-only allow-list",
    ),
    # REDUCE subprocess.Popen(["id"]) with Config allowed
    "popen_not_allowed": (
        pkl(g("subprocess", "Popen") + t(b"](" + s("id") + b"e") + b"R"),
        [Config],
        "outside the weights-only allow-list",
    ),
    # REDUCE Config(<a Runner instance>): a constructor argument that is no plain data
    "config_with_object_argument": (
        pkl(g(HERE, "Config") + t(g(HERE, "Runner") + t() + b"\x81") + b"R"),
        [Config, Runner],
        "REDUCE on",
    ),
    # copyreg._reconstructor(Runner, Runner, "x"): a base that is no builtin data type runs
    # base.__init__ (protocol 0/1's form, rebuilt by hand)
    "reconstructor_foreign_base": (
        pkl(
            g("copyreg", "_reconstructor") + t(g(HERE, "Runner"), g(HERE, "Runner"), s("x")) + b"R"
        ),
        ["copyreg._reconstructor", Runner],
        "_reconstructor",
    ),
    # defaultdict whose factory is a function
    "defaultdict_function_factory": (
        pkl(g("collections", "defaultdict") + t(g("torch._utils", "_rebuild_tensor_v2")) + b"R"),
        [collections.defaultdict],
        "factory",
    ),
    # an Enum called with more than its value (enum's functional API makes a new class)
    "enum_functional_api": (
        pkl(g(HERE, "Color") + t(s("Evil"), s("A B")) + b"R"),
        [Color],
        "value",
    ),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_file_calling_code_through_allowed_classes_is_refused_and_nothing_runs(
    case: str, tmp_path: Any
) -> None:
    data, allow, match = HOSTILE[case]
    path = tmp_path / "evil.pt"
    path.write_bytes(archive(data))
    with pytest.raises(st.UnsafeCheckpointError, match=match) as info:
        st.load(path, allow=allow)
    assert "nothing from the file was executed" in str(info.value).lower()
    # the restricted unpickler itself, on the bare pickle
    with pytest.raises(pickle.UnpicklingError):
        _unpickler.make_restricted_pickle_module(_unpickler.resolve_allowed(allow)).loads(data)
    assert SENTINEL == []
    # torch, with the same classes registered: refuses too, or runs the code (TORCH ADMITS)
    objs = [_unpickler.import_global(a) if isinstance(a, str) else a for a in allow]
    verdict = torch_with(data, objs)
    ran = list(SENTINEL)
    SENTINEL.clear()
    admits = f" (TORCH ADMITS; it ran: {ran})" if verdict == "loaded" else ""
    print(f"{case}: torch weights_only -> {verdict}{admits}")


def test_runner_as_data_is_built_without_its_init(tmp_path: Any) -> None:
    """NEWOBJ + BUILD of an allowed class whose __init__ runs code: no __init__ is called."""
    data = pkl(g(HERE, "Runner") + t() + b"\x81" + b"}" + s("cmd") + s("x") + b"s" + b"b")
    out = _unpickler.make_restricted_pickle_module(_unpickler.resolve_allowed([Runner])).loads(data)
    assert type(out) is Runner and out.cmd == "x"


def test_lazy_string_allow_is_checked_once_imported(tmp_path: Any, monkeypatch: Any) -> None:
    """A 'module.Name' string whose module is not imported yet: resolve_allowed cannot look,
    the load imports it (the user named it) and then applies the same rule."""
    (tmp_path / "lazy_allow_mod.py").write_text(
        "import os\ndef run(cmd):\n    os.environ['LAZY_RAN'] = cmd\nclass Data:\n    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("LAZY_RAN", raising=False)
    extra = _unpickler.resolve_allowed(["lazy_allow_mod.run", "lazy_allow_mod.Data"])
    assert "lazy_allow_mod" not in sys.modules
    module = _unpickler.make_restricted_pickle_module(extra)
    with pytest.raises(_unpickler.RefusedGlobal, match="can run code"):
        module.loads(pkl(g("lazy_allow_mod", "run") + t(s("pwned")) + b"R"))
    assert "LAZY_RAN" not in os.environ
    out = module.loads(pkl(g("lazy_allow_mod", "Data") + t() + b"\x81"))
    assert type(out).__name__ == "Data"
    sys.modules.pop("lazy_allow_mod", None)


# --- 4. allow_would_admit ------------------------------------------------------------------
@pytest.mark.parametrize(
    "name",
    [
        "pickle.loads",
        "builtins.eval",
        "os.system",
        "posix.system",
        "functools.partial",
        "subprocess.Popen",
        "types.FunctionType",
        "builtins.type",
        "nosuchpkg_xyz.Thing",
        "collections.nosuch",
        "builtins",
        "numpy.dtypes.ObjectDType",
    ],
)
def test_allow_would_admit_is_false_for_code_and_unknowns(name: str) -> None:
    assert _unpickler.allow_would_admit(name) is False


def test_allow_would_admit_never_imports(tmp_path: Any, monkeypatch: Any) -> None:
    (tmp_path / "never_imported_mod.py").write_text(
        "raise SystemExit('imported!')\nclass C: pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert _unpickler.allow_would_admit("never_imported_mod.C") is False
    assert "never_imported_mod" not in sys.modules
    # a module-level __getattr__ (lazy attributes) is not run either
    lazy = types.ModuleType("lazy_getattr_mod")
    lazy.__getattr__ = lambda attr: SENTINEL.append(attr)  # type: ignore[attr-defined]  # module __getattr__
    monkeypatch.setitem(sys.modules, "lazy_getattr_mod", lazy)
    assert _unpickler.allow_would_admit("lazy_getattr_mod.Thing") is False


@pytest.mark.parametrize(
    "name",
    [
        "argparse.Namespace",
        "datetime.datetime",
        "collections.OrderedDict",
        f"{HERE}.Config",
        f"{HERE}.Color",
        f"{HERE}.Runner",
        "copyreg._reconstructor",
        "torch._utils._rebuild_tensor_v2",
    ],
)
def test_allow_would_admit_is_true_for_loaded_data(name: str) -> None:
    assert _unpickler.allow_would_admit(name) is True


_POOL = {
    **CODE_RUNNERS,
    "argparse.Namespace": argparse.Namespace,
    f"{HERE}.Config": Config,
    f"{HERE}.Color": Color,
    "datetime.date": datetime.date,
    "uuid.UUID": uuid.UUID,
}


@settings(max_examples=50, deadline=None)
@given(hst.lists(hst.sampled_from(sorted(_POOL)), max_size=5), hst.booleans())
def test_resolve_allowed_refuses_exactly_when_an_entry_runs_code(
    names: List[str], strings: bool
) -> None:
    entries = list(names) if strings else [_POOL[n] for n in names]
    bad = [n for n in names if n in CODE_RUNNERS]
    if bad:
        with pytest.raises(UnsafeAllowError):
            _unpickler.resolve_allowed(entries)
    else:
        assert set(_unpickler.resolve_allowed(entries)) >= set(names if strings else ())
