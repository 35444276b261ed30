"""The project trust rule (``st.load(..., trust_root=DIR)``) and explicit numpy allows.

Whole-model pickles of a project's own ``nn.Module`` s load, as torch loads them with every
class in ``safe_globals``; hostile whole-model pickles are refused side by side with torch, in a
process of their own (``_trust_child.py``), with a marker file proving nothing ran; every
payload of ``test_hostile.py`` is still refused with the rule on; an explicit allow admits what
the same allow admits in torch's weights-only loader (numpy arrays and dtypes included).
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import pickle
import struct
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Dict, Iterator, List, Sequence

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hst

import safetorch as st
from safetorch.checkpoint import _trust, _unpickler

np = pytest.importorskip("numpy")
# numpy < 1.25 has no numpy.dtypes: its dtype classes ("numpy.dtype[float64]") have no name
# an allow= string can import.
needs_numpy_dtypes = pytest.mark.skipif(
    not hasattr(np, "dtypes"), reason="numpy.dtypes (importable dtype class names) is numpy 1.25+"
)

# side by side with torch.serialization.safe_globals (a context manager from torch 2.5)
needs_safe_globals = pytest.mark.skipif(
    not hasattr(torch.serialization, "safe_globals"),
    reason="compared with torch.serialization.safe_globals, which needs torch >= 2.5",
)

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location(
    "_trust_hostile_payloads", os.path.join(HERE, "test_hostile.py")
)
assert _spec is not None and _spec.loader is not None
H = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(H)
G, U, zipped = H.G, H.U, H.zipped
PROTO2, MARK, TUPLE, TUPLE1, TUPLE2, TUPLE3 = H.PROTO2, H.MARK, H.TUPLE, H.TUPLE1, H.TUPLE2, b"\x87"
REDUCE, BUILD, STOP, EMPTY_DICT, EMPTY_TUPLE = (
    H.REDUCE,
    H.BUILD,
    H.STOP,
    H.EMPTY_DICT,
    H.EMPTY_TUPLE,
)
SETITEM, NONE, NEWOBJ, TRUE, FALSE, EMPTY_LIST = H.SETITEM, H.NONE, H.NEWOBJ, b"\x88", b"\x89", b"]"
BRANCHES = H.BRANCHES
pytestmark = pytest.mark.filterwarnings("ignore:Detected pickle protocol")

MODEL = "sttrust_model"
MODEL_SOURCE = textwrap.dedent(
    """
    import torch
    from torch import nn
    from sttrust_outside import OutsideNet, SetstateMixin


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(3, 4)
            self.act = nn.GELU()
            self.norm_layer = nn.BatchNorm1d  # a class kept as a value (torchvision style)
            self.norm = self.norm_layer(4)
            self.rnn = nn.LSTM(4, 4)
            self.enc = nn.TransformerEncoderLayer(4, 1, 8, dropout=0.0)
            self.note = "hello"

        def forward(self, x):
            h = self.norm(self.act(self.fc(x)))
            return self.enc(self.rnn(h.unsqueeze(1))[0])


    class Custom(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = Net()
            self.seq = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.ModuleList([nn.Dropout()]))

        def __setstate__(self, state):  # the project's own __setstate__ runs
            super().__setstate__(state)
            self.restored = True


    class Toucher(nn.Module):
        def __init__(self, path=None):
            super().__init__()
            if path:
                open(path, "w").close()


    class MixNet(SetstateMixin, nn.Module):
        pass


    class Config:
        lr = 0.1


    Reexported = OutsideNet


    def helper(path):
        open(path, "w").close()
    """
)
OUTSIDE_SOURCE = textwrap.dedent(
    """
    from torch import nn


    class OutsideNet(nn.Module):
        pass


    class SetstateMixin:
        def __setstate__(self, state):
            open(state["marker"], "w").close()
            self.__dict__.update(state)
    """
)
# Importing these creates a file next to them: the rule must never import them.
IMPORT_MARKER_SOURCE = textwrap.dedent(
    """
    import pathlib
    from torch import nn
    pathlib.Path(__file__).with_suffix(".imported").touch()
    {body}
    """
)


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Iterator[SimpleNamespace]:
    """A project root (model module, a module that marks its import, a vendored site-packages
    inside the root) and a directory outside it, both on sys.path."""
    base = tmp_path_factory.mktemp("trust")
    root, outside = base / "proj", base / "outside"
    vendored = root / ".venv" / "lib" / "python3.11" / "site-packages"
    for d in (root, outside, vendored):
        d.mkdir(parents=True)
    (root / f"{MODEL}.py").write_text(MODEL_SOURCE)
    (root / "sttrust_sideeffect.py").write_text(IMPORT_MARKER_SOURCE.format(body="X = 1"))
    (outside / "sttrust_outside.py").write_text(OUTSIDE_SOURCE)
    (outside / "sttrust_outside_effect.py").write_text(
        IMPORT_MARKER_SOURCE.format(body="class Net(nn.Module):\n    pass")
    )
    (vendored / "sttrust_vendored.py").write_text(
        "from torch import nn\nclass Net(nn.Module):\n    pass\n"
    )
    paths = [str(root), str(outside), str(vendored)]
    sys.path[:0] = paths
    try:
        yield SimpleNamespace(
            root=root,
            outside=outside,
            vendored=vendored,
            model=importlib.import_module(MODEL),
            paths=paths,
        )
    finally:
        for p in paths:
            sys.path.remove(p)
        for name in [m for m in sys.modules if m.startswith("sttrust_")]:
            del sys.modules[name]


def _saved(obj: Any, path: Path) -> Path:
    torch.save(obj, path)
    return path


def _same_state(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return list(sa) == list(sb) and all(torch.equal(sa[k], sb[k]) for k in sa)


def _classes_in(path: Path) -> List[Any]:
    """The objects of every global the file names (what torch's safe_globals needs)."""
    names, complete = _unpickler.scan_globals(str(path))
    assert complete
    allowed = _unpickler.torch_allowed_globals()
    return [_unpickler.import_global(n) for n in names if n not in allowed]


@needs_safe_globals
# --- what the rule admits ------------------------------------------------------------------
@pytest.mark.parametrize("branch", BRANCHES)
def test_whole_model_loads_like_torch_with_every_class_allowed(
    project, tmp_path, simulate_torch, branch
):
    torch.manual_seed(0)
    model = project.model.Custom().eval()
    path = _saved(model, tmp_path / "model.pt")
    with pytest.raises(pickle.UnpicklingError):
        torch.load(path, weights_only=True)
    with simulate_torch(**BRANCHES[branch]):
        with pytest.raises(st.UnsafeCheckpointError, match="trust_root"):  # default unchanged
            st.load(path)
        ours = st.load(path, trust_root=project.root).eval()
    with torch.serialization.safe_globals(_classes_in(path)):
        theirs = torch.load(path, weights_only=True).eval()
    assert type(ours) is type(theirs) is project.model.Custom
    assert ours.restored is True and ours.inner.norm_layer is torch.nn.BatchNorm1d
    assert _same_state(ours, model) and _same_state(theirs, model)
    x = torch.randn(2, 3)
    with torch.no_grad():
        assert torch.equal(ours.inner(x), model.inner(x))
        assert torch.equal(theirs.inner(x), model.inner(x))


@needs_safe_globals
def test_legacy_format_whole_model(project, tmp_path, monkeypatch):
    """torch < 1.6's format names each module class in a ("module", cls, file, source) id,
    which torch's weights-only loader refuses even with the classes allowed."""
    monkeypatch.chdir(tmp_path)  # torch's legacy reader would write .patch files here
    model = project.model.Custom()
    path = tmp_path / "legacy.pt"
    torch.save(model, path, _use_new_zipfile_serialization=False)
    with pytest.raises(pickle.UnpicklingError):
        with torch.serialization.safe_globals(_classes_in(path)):
            torch.load(path, weights_only=True)
    out = st.load(path, trust_root=project.root)
    assert type(out) is project.model.Custom and _same_state(out, model)
    assert not list(tmp_path.glob("*.patch"))


def test_data_parallel_and_main_classes(project, tmp_path, monkeypatch):
    wrapped = torch.nn.DataParallel(project.model.Net())
    path = _saved(wrapped, tmp_path / "dp.pt")
    out = st.load(path, trust_root=project.root)
    assert type(out) is torch.nn.DataParallel and _same_state(out, wrapped)
    # A class of the running script (`__main__`) whose file lies in the root.
    main = type(sys)("__main__")
    main.__file__ = str(project.root / "train.py")
    Tut = type("Tut", (torch.nn.Module,), {"__module__": "__main__"})
    main.Tut = Tut
    monkeypatch.setitem(sys.modules, "__main__", main)
    tut = Tut()
    tut.fc = torch.nn.Linear(1, 1)
    path = _saved(tut, tmp_path / "tut.pt")
    assert type(st.load(path, trust_root=project.root)) is Tut
    main.__file__ = str(project.outside / "train.py")
    with pytest.raises(st.UnsafeCheckpointError, match="outside the trusted root"):
        st.load(path, trust_root=project.root)


def test_a_module_not_yet_imported_is_imported_from_the_project(project, tmp_path):
    """generate.py loads what train.py saved without importing the model module itself."""
    path = _saved(project.model.Net(), tmp_path / "m.pt")
    del sys.modules[MODEL]
    try:
        out = st.load(path, trust_root=project.root)
        assert MODEL in sys.modules and type(out) is sys.modules[MODEL].Net
    finally:
        sys.modules[MODEL] = project.model


def test_a_project_module_is_imported_only_if_it_defines_the_class(project, tmp_path):
    marker = project.root / "sttrust_sideeffect.imported"
    path = tmp_path / "x.pt"
    path.write_bytes(zipped(PROTO2 + G("sttrust_sideeffect", "Net") + EMPTY_TUPLE + NEWOBJ + STOP))
    with pytest.raises(st.UnsafeCheckpointError, match="does not define class Net"):
        st.load(path, trust_root=project.root)
    assert not marker.exists() and "sttrust_sideeffect" not in sys.modules
    path.write_bytes(
        zipped(PROTO2 + G("sttrust_outside_effect", "Net") + EMPTY_TUPLE + NEWOBJ + STOP)
    )
    with pytest.raises(st.UnsafeCheckpointError, match="outside the trusted root"):
        st.load(path, trust_root=project.root)
    assert not (project.outside / "sttrust_outside_effect.imported").exists()
    assert "sttrust_outside_effect" not in sys.modules


@pytest.mark.parametrize(
    "obj",
    [
        np.arange(6.0).reshape(2, 3),
        np.array([[1, 2], [3, 4]], dtype=np.int32).T,  # Fortran order
        np.zeros(3, dtype=[("a", "<i4"), ("b", ">f8")]),  # a structured dtype
        np.array(["2020-01-01"], dtype="M8[s]"),  # a datetime dtype (metadata in its state)
        np.float64(2.5),
        {"x": np.ones(2, dtype=np.float16), "epoch": np.int64(3)},
    ],
    ids=["float64", "fortran_int32", "structured", "datetime", "scalar", "dict"],
)
def test_numpy_arrays_load_with_the_rule(project, tmp_path, obj):
    path = _saved(obj, tmp_path / "a.pt")
    with pytest.raises(st.UnsafeCheckpointError):
        st.load(path)
    out = st.load(path, trust_root=project.root)
    expected = obj if isinstance(obj, dict) else {"v": obj}
    got = out if isinstance(obj, dict) else {"v": out}
    for k, v in expected.items():
        assert type(got[k]) is type(v) and got[k].dtype == v.dtype
        np.testing.assert_array_equal(got[k], v)


def test_the_rule_admits_nothing_else(project, tmp_path):
    cases = {
        "subprocess.call": "is outside the trusted root",
        f"{MODEL}.Config": "not an nn.Module class",
        f"{MODEL}.helper": "not an nn.Module class",
        f"{MODEL}.Reexported": "names sttrust_outside.OutsideNet",
        f"{MODEL}.MixNet": "inherits __setstate__ from sttrust_outside.SetstateMixin",
        "sttrust_outside.OutsideNet": "outside the trusted root",
        "sttrust_vendored.Net": "installed package",
        "torch.nn.parallel.distributed.DistributedDataParallel": "inherits __setstate__",
        "torch.nn.init.uniform_": "not an nn.Module class",
        "torch.nn.functional._in_projection": "private",
        "torch.nn.functional.torch": "not a function of torch.nn.functional",
        "numpy.load": "only numpy's array and dtype",
        "numpy.matrix": "only numpy's array and dtype",
        "builtins.eval": "has no source file",
    }
    trust = _trust.ProjectTrust(project.root)
    for name, reason in cases.items():
        decision = trust.decide(name)
        assert decision.role is None and reason in decision.reason, (name, decision)
    assert trust.decide(f"{MODEL}.Net").role == _trust.CLASS
    assert trust.decide("torch.nn.modules.linear.Linear").role == _trust.CLASS
    assert trust.decide("torch.nn.functional.relu").role == _trust.VALUE
    assert trust.decide("torch._C._nn.gelu").role == _trust.VALUE
    assert trust.decide("numpy.ndarray").role == _trust.VALUE
    assert trust.decide("numpy._core.multiarray._reconstruct").role == _trust.CALL


def test_refusal_names_why_the_rule_refused(project, tmp_path):
    path = tmp_path / "x.pt"
    path.write_bytes(
        zipped(PROTO2 + G("sttrust_outside", "OutsideNet") + EMPTY_TUPLE + NEWOBJ + STOP)
    )
    with pytest.raises(st.UnsafeCheckpointError) as info:
        st.load(path, trust_root=project.root)
    message = str(info.value)
    assert "sttrust_outside.OutsideNet" in message and "trust rule" in message
    assert str(project.outside) in message and str(path) in message
    assert info.value.unsafe_globals == ("sttrust_outside.OutsideNet",)


def test_trust_root_argument_errors(project, tmp_path):
    path = _saved({"w": torch.ones(1)}, tmp_path / "w.pt")
    with pytest.raises(ValueError, match="not an existing directory"):
        st.load(path, trust_root=tmp_path / "missing")
    with pytest.raises(ValueError, match="filesystem root"):
        st.load(path, trust_root="/")
    with pytest.raises(TypeError, match="directory path"):
        st.load(path, trust_root=3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="weights-only"):
        st.load(path, weights_only=False, trust_root=project.root)
    assert torch.equal(st.load(path, trust_root=project.root)["w"], torch.ones(1))


def test_patched_torch_load_uses_the_trust_root_variable(project, tmp_path, monkeypatch):
    from safetorch.patching import registry, report

    path = _saved(project.model.Net(), tmp_path / "m.pt")
    monkeypatch.delenv("SAFETORCH_TRUST_ROOT", raising=False)
    report.reset_counts()
    with st.patched("load"):
        with pytest.raises(st.UnsafeCheckpointError):
            torch.load(path)
        monkeypatch.setenv("SAFETORCH_TRUST_ROOT", str(project.root))
        assert type(torch.load(path)) is project.model.Net
        monkeypatch.setenv("SAFETORCH_TRUST_ROOT", "")  # empty: the rule is off
        with pytest.raises(st.UnsafeCheckpointError):
            torch.load(path)
    kinds = {e.kind: e.detail for e in registry.report_entries()}
    key = next(k for k in kinds if "project trust rule" in k)
    assert str(project.root) in key and f"{MODEL}.Net" in kinds[key]
    report.reset_counts()


# --- explicit allows match torch's safe_globals (numpy) --------------------------------------
def _numpy_globals(with_dtype_class: bool) -> List[Any]:
    arr = np.arange(3.0)
    listed = [arr.__reduce__()[0], np.ndarray, np.dtype, np.float64(0).__reduce__()[0]]
    return listed + [type(np.dtype(np.float64))] if with_dtype_class else listed


def _name(obj: Any) -> str:
    return f"{obj.__module__}.{obj.__qualname__}"


@needs_safe_globals
@pytest.mark.parametrize("branch", BRANCHES)
@pytest.mark.parametrize(
    "with_dtype_class", [True, False], ids=["torch_docs_list", "names_refused"]
)
def test_explicit_numpy_allow_admits_what_torch_admits(
    tmp_path, simulate_torch, branch, with_dtype_class
):
    data = {"a": np.arange(6.0).reshape(2, 3), "s": np.float64(2.5)}
    path = _saved(data, tmp_path / "np.pt")
    listed = _numpy_globals(with_dtype_class)
    try:
        with torch.serialization.safe_globals(listed):
            theirs = torch.load(path, weights_only=True)
    except pickle.UnpicklingError:
        theirs = None
    # torch admits the list its docs give (with type(np.dtype(np.float64))); with only the
    # names a refusal lists, torch refuses BUILD on Float64DType and safetorch loads.
    assert (theirs is not None) == with_dtype_class
    with simulate_torch(**BRANCHES[branch]):
        for allow in (listed, [_name(o) for o in listed]):  # objects, and --allow strings
            ours = st.load(path, allow=allow)
            np.testing.assert_array_equal(ours["a"], data["a"])
            assert ours["s"] == data["s"] and type(ours["s"]) is np.float64
        with torch.serialization.safe_globals(listed):
            assert st.load(path)["s"] == data["s"]


@needs_numpy_dtypes
def test_allow_strings_from_the_refusal_load_under_the_patch(tmp_path, monkeypatch):
    path = _saved({"a": np.arange(3.0)}, tmp_path / "np.pt")
    with pytest.raises(st.UnsafeCheckpointError) as info:
        st.load(path)
    monkeypatch.setenv("SAFETORCH_ALLOW", ",".join(info.value.unsafe_globals))
    monkeypatch.delenv("SAFETORCH_TRUST_ROOT", raising=False)
    with st.patched("load"):
        np.testing.assert_array_equal(torch.load(path)["a"], np.arange(3.0))


@needs_numpy_dtypes
def test_an_allow_string_names_a_type_once_imported():
    """BUILD sees the type a REDUCE made (no GLOBAL names it): an allow= string covers it by
    identity, and covers nothing else."""
    policy = _unpickler.Policy({"numpy.dtypes.Float64DType": None})
    assert policy.is_allowed_object(type(np.dtype(np.float64)))
    assert not policy.is_allowed_object(type(np.dtype(np.float32)))
    assert not _unpickler.Policy({}).is_allowed_object(type(np.dtype(np.float64)))


# --- hostile whole-model pickles, side by side with torch, in a child process -----------------
def _obj(module: str, name: str, state: bytes) -> bytes:
    """NEWOBJ(module.name, ()) then BUILD(state), as torch.save writes a module."""
    return G(module, name) + EMPTY_TUPLE + NEWOBJ + state + BUILD


def _dict(*items: bytes) -> bytes:
    return EMPTY_DICT + b"".join(items[i] + items[i + 1] + SETITEM for i in range(0, len(items), 2))


class _Evil:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> Any:
        return os.system, (f"touch {self.marker}",)


def _hostile_cases(project: SimpleNamespace, tmp: Path) -> List[Dict[str, Any]]:
    """Every hostile case written to ``tmp``: name, path, marker, and the ``safe_globals``
    (``"module:attr"``) torch's side allows."""
    m = MODEL
    cases: Dict[str, Any] = {}

    def add(name: str, data: bytes, safe: Sequence[str] = ()) -> None:
        cases[name] = (data, list(safe))

    def real(name: str, build: Any, safe: List[str]) -> None:
        marker = str(tmp / f"{name}.marker")
        buf = io.BytesIO()
        torch.save(build(marker), buf)
        add(name, buf.getvalue(), safe)

    net = f"{m}:Net"
    lin = "torch.nn.modules.linear:Linear"

    def hooked(marker: str) -> Any:
        model = project.model.Net()
        model.register_forward_hook(os.system)  # pickled by reference: posix.system
        return model

    def smuggled(marker: str) -> Any:
        model = project.model.Net()
        model.extra = _Evil(marker)
        return model

    real("hook_smuggles_os_system", hooked, [net])
    real("state_smuggles_reduce_os_system", smuggled, [net])
    for name, marker_op in [
        ("hook_smuggles_eval", G("builtins", "eval")),
        ("hook_smuggles_exec", G("builtins", "exec")),
    ]:
        hooks = _dict(b"K\x00", marker_op)
        add(name, zipped(PROTO2 + _obj(m, "Net", _dict(U("_forward_hooks"), hooks)) + STOP), [net])

    def marker_of(name: str) -> str:
        return str(tmp / f"{name}.marker")

    add(
        "reduce_calls_a_project_class",
        zipped(
            PROTO2
            + G(m, "Toucher")
            + U(marker_of("reduce_calls_a_project_class"))
            + TUPLE1
            + REDUCE
            + STOP
        ),
        [f"{m}:Toucher"],
    )
    add(
        "newobj_with_arguments",
        zipped(
            PROTO2
            + G(m, "Toucher")
            + U(marker_of("newobj_with_arguments"))
            + TUPLE1
            + NEWOBJ
            + STOP
        ),
        [f"{m}:Toucher"],
    )
    add(
        "build_on_the_class",
        zipped(PROTO2 + G(m, "Net") + _dict(U("poisoned"), TRUE) + BUILD + STOP),
        [net],
    )
    add(
        "build_on_a_torch_class",
        zipped(
            PROTO2
            + G("torch.nn.modules.linear", "Linear")
            + _dict(U("poisoned"), TRUE)
            + BUILD
            + STOP
        ),
        [lin],
    )
    add(
        "build_dunder_dict",
        zipped(PROTO2 + _obj(m, "Net", _dict(U("__dict__"), EMPTY_DICT)) + STOP),
        [net],
    )
    add(
        "build_dunder_class",
        zipped(PROTO2 + _obj(m, "Net", _dict(U("__class__"), G(m, "Custom"))) + STOP),
        [net, f"{m}:Custom"],
    )
    add(
        "build_slot_state",
        zipped(PROTO2 + _obj(m, "Net", NONE + _dict(U("forward"), NONE) + TUPLE2) + STOP),
        [net],
    )
    add("build_list_state", zipped(PROTO2 + _obj(m, "Net", EMPTY_LIST) + STOP), [net])
    add(
        "mixin_setstate_from_outside",
        zipped(
            PROTO2
            + _obj(m, "MixNet", _dict(U("marker"), U(marker_of("mixin_setstate_from_outside"))))
            + STOP
        ),
        [f"{m}:MixNet"],
    )
    add(
        "class_from_outside_the_tree",
        zipped(PROTO2 + _obj("sttrust_outside", "OutsideNet", EMPTY_DICT) + STOP),
        ["sttrust_outside:OutsideNet"],
    )
    add(
        "outside_module_never_imported",
        zipped(PROTO2 + _obj("sttrust_outside_effect", "Net", EMPTY_DICT) + STOP),
    )
    add(
        "module_without_the_class_never_imported",
        zipped(PROTO2 + _obj("sttrust_sideeffect", "Net", EMPTY_DICT) + STOP),
    )
    add(
        "site_packages_inside_the_root",
        zipped(PROTO2 + _obj("sttrust_vendored", "Net", EMPTY_DICT) + STOP),
        ["sttrust_vendored:Net"],
    )
    add(
        "reexported_outside_class",
        zipped(PROTO2 + _obj(m, "Reexported", EMPTY_DICT) + STOP),
        [f"{m}:Reexported"],
    )
    add(
        "project_plain_class",
        zipped(PROTO2 + _obj(m, "Config", _dict(U("lr"), b"K\x05")) + STOP),
        [f"{m}:Config"],
    )
    add(
        "project_function_called",
        zipped(
            PROTO2
            + G(m, "helper")
            + U(marker_of("project_function_called"))
            + TUPLE1
            + REDUCE
            + STOP
        ),
        [f"{m}:helper"],
    )
    add("main_outside_the_root", zipped(PROTO2 + _obj("__main__", "Net", EMPTY_DICT) + STOP))
    add(
        "torch_ddp_setstate",
        zipped(
            PROTO2
            + _obj("torch.nn.parallel.distributed", "DistributedDataParallel", EMPTY_DICT)
            + STOP
        ),
        ["torch.nn.parallel.distributed:DistributedDataParallel"],
    )
    add(
        "functional_called",
        zipped(PROTO2 + G("torch.nn.functional", "relu") + b"K\x01" + TUPLE1 + REDUCE + STOP),
        ["torch.nn.functional:relu"],
    )
    add(
        "torch_nn_function_called",
        zipped(PROTO2 + G("torch.nn.init", "calculate_gain") + U("relu") + TUPLE1 + REDUCE + STOP),
        ["torch.nn.init:calculate_gain"],
    )
    # numpy: only the forms numpy writes.
    rec = "numpy._core.multiarray"
    dtype_state = (
        MARK + b"K\x03" + U("<") + NONE + NONE + NONE + b"J\xff\xff\xff\xff" * 2 + b"K\x00" + TUPLE
    )
    as_bytes = (
        G("_codecs", "encode") + U("b") + U("latin1") + TUPLE2 + REDUCE
    )  # b"b", as torch.save
    np_safe = [
        "numpy._core.multiarray:_reconstruct",
        "numpy:ndarray",
        "numpy:dtype",
        "numpy.dtypes:Float64DType",
    ]
    add(
        "numpy_dtype_singleton",
        zipped(
            PROTO2
            + G("numpy", "dtype")
            + U("f8")
            + FALSE
            + FALSE
            + TUPLE3
            + REDUCE
            + dtype_state
            + BUILD
            + STOP
        ),
        np_safe,
    )
    bad_fields = _dict(U("a"), U("x") + b"K\x00" + TUPLE2)  # a field whose dtype is a str
    add(
        "numpy_dtype_malformed_state",
        zipped(
            PROTO2 + G("numpy", "dtype") + U("V8") + FALSE + TRUE + TUPLE3 + REDUCE
            + MARK + b"K\x03" + U("|") + NONE + U("a") + TUPLE1 + bad_fields + b"K\x08K\x01K\x10"
            + TUPLE + BUILD + STOP
        ),
        ["numpy:dtype", "numpy.dtypes:VoidDType"],
    )  # fmt: skip
    add(
        "numpy_reconstruct_huge",
        zipped(
            PROTO2
            + G(rec, "_reconstruct")
            + G("numpy", "ndarray")
            + b"J\x00\x00\x00\x40"
            + TUPLE1
            + as_bytes
            + TUPLE3
            + REDUCE
            + STOP
        ),
        np_safe,
    )
    add(
        "numpy_newobj_ndarray",
        zipped(PROTO2 + G("numpy", "ndarray") + b"K\x02" + TUPLE1 + NEWOBJ + STOP),
        np_safe,
    )
    add(
        "numpy_matrix",
        zipped(
            PROTO2
            + G(rec, "_reconstruct")
            + G("numpy", "matrix")
            + b"K\x00"
            + TUPLE1
            + as_bytes
            + TUPLE3
            + REDUCE
            + STOP
        ),
        np_safe,
    )
    buf = io.BytesIO()
    torch.save({"a": np.array([1, None], dtype=object)}, buf)
    add("numpy_object_array", buf.getvalue(), np_safe)
    add(
        "numpy_scalar_of_an_object",
        zipped(
            PROTO2
            + G(rec, "scalar")
            + G("numpy", "dtype")
            + U("O8")
            + FALSE
            + TRUE
            + TUPLE3
            + REDUCE
            + U("x")
            + TUPLE2
            + REDUCE
            + STOP
        ),
        ["numpy._core.multiarray:scalar", "numpy:dtype"],
    )
    out = []
    for name, (data, safe) in cases.items():
        path = tmp / f"{name}.pt"
        path.write_bytes(data)
        out.append(
            {"name": name, "path": str(path), "marker": marker_of(name), "safe_globals": safe}
        )
    return out


# torch with these classes in safe_globals runs the payload (calls the class, the function or
# the mixin's __setstate__): the rule refuses what torch's explicit allow lets through.
TORCH_SAFE_GLOBALS_RUNS = {
    "reduce_calls_a_project_class",
    "mixin_setstate_from_outside",
    "project_function_called",
}


@pytest.fixture(scope="module")
def hostile_results(project, tmp_path_factory) -> Dict[str, Any]:
    tmp = tmp_path_factory.mktemp("trust_hostile")
    cases = _hostile_cases(project, tmp)
    spec = {
        "root": str(project.root),
        "path": project.paths[1:],
        "cases": cases,
        "model_module": MODEL,
    }
    (tmp / "spec.json").write_text(json.dumps(spec))
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAFETORCH_")}
    proc = subprocess.run(
        [
            sys.executable,
            os.path.join(HERE, "_trust_child.py"),
            str(tmp / "spec.json"),
            str(tmp / "out.json"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**env, "PYTHONFAULTHANDLER": "1"},
        cwd=tmp,
    )
    assert proc.returncode == 0, proc.stderr
    return {"cases": cases, **json.loads((tmp / "out.json").read_text())}


def test_hostile_whole_model_pickles_are_refused_and_nothing_runs(hostile_results):
    names = [c["name"] for c in hostile_results["cases"]]
    assert len(names) >= 30
    for name in names:
        faces = hostile_results[name]
        for face in ("st.load(trust_root=)", "patched torch.load"):
            got = faces[face]
            assert got["outcome"].startswith("UnsafeCheckpointError"), (name, face, got)
            assert not got["marker"], (name, face)
        assert faces["torch weights_only"]["outcome"] != "loaded", name  # torch refuses too
    assert hostile_results["__fingerprint__"] == []
    # modules outside the root, or without the named class, were never imported
    assert "sttrust_outside_effect" not in hostile_results["__imported__"]
    assert "sttrust_sideeffect" not in hostile_results["__imported__"]


@needs_safe_globals
def test_torch_safe_globals_side_by_side(hostile_results):
    """Where torch's explicit allow of the same classes runs the payload, the rule does not;
    everything torch's allow refuses, the rule refuses too (checked above)."""
    for name in TORCH_SAFE_GLOBALS_RUNS:
        faces = hostile_results[name]
        assert faces["torch safe_globals"]["marker"], (name, faces)
        assert not faces["st.load(trust_root=)"]["marker"]


# --- every payload of the hostile suite, with the rule on -----------------------------------
@pytest.mark.parametrize("branch", BRANCHES)
@pytest.mark.parametrize("face", ["st.load", "patched torch.load"])
@pytest.mark.parametrize("name", H.PAYLOADS)
def test_hostile_suite_payloads_are_refused_with_the_rule_on(
    project, tmp_path, simulate_torch, monkeypatch, branch, face, name
):
    monkeypatch.chdir(tmp_path)  # torch's legacy reader writes .patch files into the cwd
    marker = str(tmp_path / "marker")
    path = tmp_path / f"{name}.pt"
    path.write_bytes(H._payloads(marker)[name])
    before = H._process_fingerprint()
    with simulate_torch(**BRANCHES[branch]):
        with pytest.raises(st.CheckpointError) as info:
            if face == "st.load":
                st.load(path, trust_root=project.root)
            else:
                monkeypatch.setenv("SAFETORCH_TRUST_ROOT", str(project.root))
                with st.patched("load"):
                    torch.load(path)
    assert str(path) in str(info.value)
    assert not os.path.exists(marker)
    assert not list(tmp_path.glob("*.patch"))
    assert H._process_fingerprint() == before


# --- fuzz: random opcode streams over the admitted globals ----------------------------------
FUZZ_MARKER = os.path.join(HERE, "_trust_fuzz_marker_never_created")
TRUST_GLOBALS = [
    (MODEL, "Net"),
    (MODEL, "Toucher"),
    (MODEL, "MixNet"),
    ("torch.nn.modules.linear", "Linear"),
    ("torch.nn.modules.rnn", "LSTM"),
    ("torch.nn.functional", "relu"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "scalar"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("collections", "OrderedDict"),
    ("builtins", "set"),
    ("os", "system"),
]
FUZZ_CHUNK = hst.one_of(
    hst.sampled_from(
        [
            MARK,
            TUPLE,
            TUPLE1,
            TUPLE2,
            TUPLE3,
            REDUCE,
            BUILD,
            NEWOBJ,
            EMPTY_DICT,
            EMPTY_LIST,
            EMPTY_TUPLE,
            SETITEM,
            b"u",
            b"a",
            b"e",
            NONE,
            TRUE,
            FALSE,
            b"0",
            b"2",
            b"\x94",
            b"\x93",
            b"C\x01b",
            b"C\x08\x00\x00\x00\x00\x00\x00\xf0?",
        ]
    ),  # fmt: skip
    hst.sampled_from(TRUST_GLOBALS).map(lambda mn: G(*mn)),
    hst.sampled_from(
        ["touch " + FUZZ_MARKER, FUZZ_MARKER, "marker", "f8", "O8", "<", "_forward_hooks"]
    ).map(U),
    hst.integers(0, 255).map(lambda i: b"K" + bytes([i])),
    hst.integers(0, 2**31 - 1).map(lambda i: b"J" + struct.pack("<i", i)),
    hst.integers(0, 8).map(lambda i: b"h" + bytes([i])),
)


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(chunks=hst.lists(FUZZ_CHUNK, max_size=30))
def test_random_streams_over_admitted_globals(project, chunks):
    pkl = PROTO2 + b"".join(chunks) + STOP
    before = (sorted(vars(project.model.Net)), np.dtype("f8").str, H._process_fingerprint())
    try:
        st.load(io.BytesIO(zipped(pkl)), trust_root=project.root)
    except st.CheckpointError:
        pass
    assert not os.path.exists(FUZZ_MARKER)
    assert (sorted(vars(project.model.Net)), np.dtype("f8").str, H._process_fingerprint()) == before


def test_fuzz_alphabet_builds_a_module(project):
    """The fuzz alphabet can build a module, so the property above is not vacuous."""
    pkl = PROTO2 + _obj(MODEL, "Net", _dict(U("note"), U("marker"))) + STOP
    assert st.load(io.BytesIO(zipped(pkl)), trust_root=project.root).note == "marker"
