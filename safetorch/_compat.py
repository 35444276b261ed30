"""The only module that inspects torch's version or features.

Every flag is resolved once, at import. Feature detection comes first (``hasattr``,
``inspect.signature``); ``TORCH_RELEASE`` (``Version(...).release``, by :func:`release_of`: a
``2.5.0.dev`` nightly does not compare below ``2.5``) is used only where detection is
impossible. Each flag is declared once, by :func:`_flag`, with its value, the torch release
and PR that introduced the behaviour, and how it is detected; :func:`flags` lists them (the
``safetorch doctor`` table). Behaviour that is the same on every supported torch (>= 1.13) is
not a flag. Private torch APIs (``torch.serialization._load``, ``_BatchNorm``, the default
store, ...) are reached only through the names at the end of this module.

Implementations never test a flag per call: they select their branch at import through
:func:`register_binder`, and tests simulate an older torch with :func:`override`, which sets
flags and re-runs every binder so each branch runs on the installed torch.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import re
import sys
import threading
import typing
from typing import Any, Callable, Dict, Iterator, List, NamedTuple, Optional

import torch

if typing.TYPE_CHECKING:
    from torch.distributed import Store

__all__: List[str] = []  # private module; names are used by safetorch internals and tests

TORCH_VERSION: str = torch.__version__


def release_of(version: str) -> typing.Tuple[int, ...]:
    """``packaging.version.Version(version).release``: the release numbers of a PEP 440
    version, without importing ``packaging`` (about 4 ms at every ``safetorch run`` start).
    Local labels (+cpu, +cu121), pre-, post- and dev-release tags are dropped.

    >>> release_of("2.5.0.dev20240601+cu121"), release_of("v1.13.1"), release_of("2.4.0rc1")
    ((2, 5, 0), (1, 13, 1), (2, 4, 0))
    """
    match = _RELEASE.match(version)
    if match is None:
        raise ValueError(
            f"{version!r} is not a PEP 440 version: expected a release such as '2.5.0', "
            "optionally followed by a tag ('rc1', '.dev2024', '+cpu')"
        )
    return tuple(int(part) for part in match.group(1).split("."))


_RELEASE = re.compile(r"\s*v?(?:\d+!)?(\d+(?:\.\d+)*)", re.IGNORECASE)
# .release drops local labels (+cpu, +cu121) and pre-release tags: 2.5.0.dev2024 -> (2, 5, 0).
TORCH_RELEASE = release_of(TORCH_VERSION)


def _params(fn: Any) -> Dict[str, inspect.Parameter]:
    try:
        return dict(inspect.signature(fn).parameters)
    except (TypeError, ValueError):  # builtins without a signature
        return {}


_LOAD_PARAMS = _params(torch.load)
_LOAD_STATE_DICT_PARAMS = _params(torch.nn.Module.load_state_dict)


class Flag(NamedTuple):
    """A resolved feature flag: the release and PR that introduced it, and how it is detected."""

    name: str
    value: bool
    since: str  # the torch release ("-" for a build property or a removal without a release)
    source: str  # the PR (or file) that introduced it
    detected_by: str


_FLAGS: Dict[str, Flag] = {}


def _flag(name: str, value: Any, since: str, source: str, detected_by: str) -> bool:
    """Declare a flag: its value and, in one place, its release, PR and detection method."""
    _FLAGS[name] = Flag(name, bool(value), since, source, detected_by)
    return bool(value)


# --- serialization -------------------------------------------------------------------------
# The signature cannot tell 2.6's default: it reads `weights_only: Optional[bool] = None` in 2.4,
# 2.5 and 2.6+. 2.6 added the private resolver torch.serialization._default_to_weights_only
# (pickle_module), which answers exactly this question (False in fbcode builds). The env vars
# TORCH_FORCE_WEIGHTS_ONLY_LOAD / TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD still override it per
# process, so safetorch always passes weights_only explicitly and uses this flag only to decide
# whether torch's own weights-only unpickler is strict enough to defer to (the CVE-2025-32434
# fix landed in the same release).
_default_to_weights_only = getattr(torch.serialization, "_default_to_weights_only", None)
LOAD_WEIGHTS_ONLY_DEFAULT_TRUE: bool = _flag(
    "LOAD_WEIGHTS_ONLY_DEFAULT_TRUE",
    _default_to_weights_only is not None and _default_to_weights_only(None),
    "2.6",
    "pytorch/pytorch#137602",
    "torch.serialization._default_to_weights_only(None)",
)
LOAD_HAS_MMAP: bool = _flag(
    "LOAD_HAS_MMAP",
    "mmap" in _LOAD_PARAMS,
    "2.1",
    "pytorch/pytorch#102549",
    "inspect.signature(torch.load)",
)
LOAD_STATE_DICT_HAS_ASSIGN: bool = _flag(
    "LOAD_STATE_DICT_HAS_ASSIGN",
    "assign" in _LOAD_STATE_DICT_PARAMS,
    "2.1",
    "pytorch/pytorch#102212",
    "inspect.signature(Module.load_state_dict)",
)
# 1.13 has only Tensor.storage() (a TypedStorage, deprecated with a warning from 2.0 on).
HAS_UNTYPED_STORAGE: bool = _flag(
    "HAS_UNTYPED_STORAGE",
    hasattr(torch.Tensor, "untyped_storage"),
    "2.0",
    "absent from the 1.13 sources, present in 2.0.0",
    "hasattr(torch.Tensor, 'untyped_storage')",
)

# --- devices -------------------------------------------------------------------------------
# In 2.6 current_accelerator() raises without an accelerator; is_available() never does.
HAS_ACCELERATOR: bool = _flag(
    "HAS_ACCELERATOR",
    hasattr(torch, "accelerator") and hasattr(torch.accelerator, "is_available"),
    "2.6",
    "pytorch/pytorch#132204",
    "hasattr(torch.accelerator, 'is_available')",
)
# ROCm builds: their index kernels may not bounds-check at all. A build property.
IS_ROCM: bool = _flag(
    "IS_ROCM", getattr(torch.version, "hip", None) is not None, "-", "-", "torch.version.hip"
)

# --- compile / ops -------------------------------------------------------------------------
# torch.compile and torch._dynamo.eval_frame.OptimizedModule (`_orig_mod`).
HAS_COMPILE: bool = _flag(
    "HAS_COMPILE",
    hasattr(torch, "compile"),
    "2.0",
    "pytorch/pytorch#88629",
    "hasattr(torch, 'compile')",
)
# torch._dynamo.is_compiling before (deprecated in its favour in 2.4). Monkeypatch wrappers use
# it to call torch's original while dynamo traces.
HAS_COMPILER_IS_COMPILING: bool = _flag(
    "HAS_COMPILER_IS_COMPILING",
    hasattr(getattr(torch, "compiler", None), "is_compiling"),
    "2.3",
    "torch/compiler/__init__.py",
    "hasattr(torch.compiler, 'is_compiling')",
)
# torch._utils.is_compiling: False when called, folded to True by dynamo while it traces (one of
# dynamo's constant_functions, torch/_dynamo/config.py, 2.1 and 2.2); the tracing test of torch
# 2.1/2.2 (before torch.compiler.is_compiling), without importing torch._dynamo. Dynamo 2.1
# cannot trace the fallback's `sys.modules.get(...) is not None` ("comparison
# PythonModuleVariable() is_not ConstantVariable(NoneType)").
HAS_UTILS_IS_COMPILING: bool = _flag(
    "HAS_UTILS_IS_COMPILING",
    hasattr(torch._utils, "is_compiling"),
    "2.1",
    "torch/_utils.py is_compiling; torch/_dynamo/config.py constant_functions",
    "hasattr(torch._utils, 'is_compiling')",
)
# trace_rules.py replaced allowed_functions.py: dynamo looks torch functions up by object
# (through __wrapped__), so it treats a monkeypatch wrapper like the function it wraps; 2.0/2.1
# look them up by id() and need allow_in_graph(wrapper). Detected by the file, because
# importing torch._dynamo costs ~1 s.
DYNAMO_HAS_TRACE_RULES: bool = _flag(
    "DYNAMO_HAS_TRACE_RULES",
    os.path.isfile(os.path.join(os.path.dirname(torch.__file__), "_dynamo", "trace_rules.py")),
    "2.2",
    "torch/_dynamo/trace_rules.py",
    "torch/_dynamo/trace_rules.py exists",
)

# dynamo 2.1 refuses type() of a container the traced code built itself ("Can't call type() on
# generated custom object", UserError; pytorch/pytorch#109056); 2.2's BuiltinVariable.call_type
# builds the type of a sourceless value (SourcelessBuilder). An internal behaviour with nothing
# to probe without tracing: decided by the release (read in the 2.1.2 and 2.2.2 wheels).
DYNAMO_TYPES_BUILT_VALUES: bool = _flag(
    "DYNAMO_TYPES_BUILT_VALUES",
    TORCH_RELEASE >= (2, 2),
    "2.2",
    "pytorch/pytorch#109056; torch/_dynamo/variables/builtin.py call_type",
    "TORCH_RELEASE >= (2, 2)",
)

# torch.library.custom_op: a Python function registered as an operator dynamo puts into the
# graph opaquely (it runs eagerly, with real values, every time the graph runs).
HAS_CUSTOM_OP: bool = _flag(
    "HAS_CUSTOM_OP",
    hasattr(getattr(torch, "library", None), "custom_op"),
    "2.4",
    "torch/_library/custom_ops.py",
    "hasattr(torch.library, 'custom_op')",
)

# --- nn ------------------------------------------------------------------------------------
# 1.13 raises "SyncBatchNorm expected input tensor to be on GPU" for any CPU input. No attribute
# or parameter changed, so this is a release check.
SYNCBN_FALLS_BACK_WITHOUT_PG: bool = _flag(
    "SYNCBN_FALLS_BACK_WITHOUT_PG",
    TORCH_RELEASE >= (2, 0),
    "2.0",
    "pytorch/pytorch#89706",
    "release >= 2.0 (not detectable)",
)


# torch.distributed.checkpoint (DCP) as a public package (1.13 had it under
# torch.distributed._shard.checkpoint). Found without importing it.
def _has_module(name: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


HAS_DCP: bool = _flag(
    "HAS_DCP",
    _has_module("torch.distributed.checkpoint"),
    "2.0",
    "torch/distributed/checkpoint/",
    "importlib.util.find_spec('torch.distributed.checkpoint')",
)

# dcp.save / dcp.load with checkpoint_id= and without a process group (they assume one process
# when none is initialized) replaced save_state_dict / load_state_dict (which need no_dist=True
# without one) in 2.3. 2.1 has only save_state_dict / load_state_dict; 2.2's save / load take the
# storage writer / reader positionally, no checkpoint_id=, and still need no_dist=True, so 2.2
# takes the older branch. A release check: detecting it means importing
# torch.distributed.checkpoint (~0.3 s) at import time.
DCP_HAS_SAVE_LOAD: bool = _flag(
    "DCP_HAS_SAVE_LOAD",
    HAS_DCP and TORCH_RELEASE >= (2, 3),
    "2.3",
    "torch/distributed/checkpoint/state_dict_saver.py",
    "release >= 2.3 (importing DCP to look costs ~0.3 s)",
)

# Triton, which torch's CUDA wheels install (pytorch-triton, a dependency since torch 2.0): the
# fused checked-index kernels (safetorch._triton_index) run where it is importable. Found
# without importing it (import triton costs ~1 s); an installed package, not a torch release.
HAS_TRITON: bool = _flag(
    "HAS_TRITON",
    _has_module("triton"),
    "-",
    "torch's CUDA wheels depend on triton (torch/utils/_triton.py)",
    "importlib.util.find_spec('triton')",
)


# --- legacy APIs (the `legacy` patch fills only the gaps these flags report) ----------------
# Legacy behaviours that are the same on every supported torch (>= 1.13) are not flags: torch
# .solve/lstsq/eig/matrix_rank raise (removed in 1.13), legacy autograd Functions raise (1.5),
# x[0] of a 0-dim tensor raises (0.5), volatile= is a no-op (0.4), size_average=/reduce= map
# through torch.nn._reduction.legacy_get_string (1.0). Only what changes within the range is.
HAS_TORCH_SIX: bool = _flag(
    "HAS_TORCH_SIX",
    os.path.isfile(os.path.join(os.path.dirname(torch.__file__), "_six.py")),
    "-",
    "removed in torch 2.0 (no torch/_six.py in the 2.0 sources)",
    "torch/_six.py exists",
)


def _symeig_works() -> bool:
    import warnings

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.symeig(torch.ones(1, 1))
    except (RuntimeError, AttributeError):
        return False
    return True


HAS_TORCH_SYMEIG: bool = _flag(
    "HAS_TORCH_SYMEIG",
    _symeig_works(),
    "-",
    "deprecated in 1.9; a raising stub in torch/_linalg_utils.py from 2.0",
    "torch.symeig(1x1) does not raise",
)


def flags() -> List[Flag]:
    """Every feature flag with its current value, introducing release, PR and detection method.

    >>> from safetorch import _compat
    >>> [f.since for f in _compat.flags() if f.name == "LOAD_HAS_MMAP"]
    ['2.1']
    """
    g = globals()
    return [flag._replace(value=bool(g[name])) for name, flag in _FLAGS.items()]


# --- private torch APIs: safetorch reaches them only through the names below ---------------
# Each is present, with the signature safetorch uses, from torch 1.13 to 2.14.
from torch.nn.modules.batchnorm import _BatchNorm as BatchNormBase  # noqa: E402, F401 (re-exported)
from torch.nn.modules.conv import _ConvNd as ConvNdBase  # noqa: E402, F401 (re-exported)
from torch.nn.modules.dropout import _DropoutNd as DropoutNdBase  # noqa: E402, F401 (re-exported)
from torch.nn.parallel._functions import Scatter  # noqa: E402, F401 (re-exported)

# A context that turns off __torch_function__ of tensor subclasses (not modes): torch 2.0
# renamed 1.13's DisableTorchFunction to DisableTorchFunctionSubclass (the old name then
# disables modes too).
disable_torch_function_subclass: Any = getattr(
    torch._C, "DisableTorchFunctionSubclass", getattr(torch._C, "DisableTorchFunction", None)
)

_serialization: Any = torch.serialization  # private readers, not in torch's type stubs
#: torch.load's file openers and format readers; _load/_legacy_load take any pickle_module
#: (whose Unpickler they subclass) and an ``encoding``; _load takes ``overall_storage`` (2.1+).
open_file_like: Callable[..., Any] = _serialization._open_file_like
is_zipfile: Callable[[Any], bool] = _serialization._is_zipfile
open_zipfile_reader: Callable[..., Any] = _serialization._open_zipfile_reader
zip_load: Callable[..., Any] = _serialization._load
legacy_load: Callable[..., Any] = _serialization._legacy_load
#: torch's weights-only allow-list builder (torch/_weights_only_unpickler.py), None if absent.
weights_only_allowed_globals: Optional[Callable[[], Any]] = getattr(
    getattr(torch, "_weights_only_unpickler", None), "_get_allowed_globals", None
)
#: Rebuild functions a torch.save pickle names (torch._utils / torch._tensor / serialization).
torch_utils: Any = torch._utils
rebuild_from_type_v2: Optional[Callable[..., Any]] = getattr(
    torch._tensor, "_rebuild_from_type_v2", None
)
get_layout: Optional[Callable[..., Any]] = getattr(_serialization, "_get_layout", None)


def privateuse1_backend_name() -> Optional[str]:
    """The name of the out-of-tree (PrivateUse1) backend, e.g. ``"npu"``; None without one."""
    getter = getattr(torch._C, "_get_privateuse1_backend_name", None)
    return getter() if getter is not None else None


def default_store() -> "Store":
    """The default process group's store (the one ``init_process_group`` was given or built)."""
    from torch.distributed import distributed_c10d

    return distributed_c10d._get_default_store()


# --- is dynamo (torch.compile / torch.export) tracing? -----------------------------------------
# compiling() is True while dynamo traces a frame or runs a wrapper on FakeTensors to learn
# output shapes. The second happens outside any traced frame: there torch.compiler
# .is_compiling() is False up to at least torch 2.9 (2.13 holds it True for the whole compile
# session), so compiling() also asks whether a dynamo compile is in progress (torch._guards
# .CompileContext, torch 2.1+). Code that would sync the host or time something (a checked
# index, an autotuner) calls torch's plain path instead, and nothing is counted.
def _never_compiling() -> bool:
    return False


def _compile_session() -> bool:
    guards = sys.modules.get("torch._guards")
    context = getattr(guards, "CompileContext", None)  # None on torch 2.0
    return context is not None and context.current_compile_id() is not None


def _dynamo_is_compiling() -> bool:  # torch 2.0; never imports dynamo itself
    dynamo = sys.modules.get("torch._dynamo")
    return dynamo is not None and bool(dynamo.is_compiling())


#: ``tracing()``: whether dynamo is tracing the calling frame (torch.compiler.is_compiling, which
#: dynamo folds to True; torch._utils.is_compiling on 2.1-2.2, dynamo's own flag on 2.0). Cheap:
#: hot paths ask this one.
tracing: Callable[[], bool] = _never_compiling


def _compiling_any() -> bool:
    return bool(tracing()) or _compile_session()


#: ``compiling()``: whether dynamo is tracing or compiling now (always False before torch 2.0).
compiling: Callable[[], bool] = _never_compiling


def _no_registration(wrapper: Any) -> None:
    return None


# Wrappers registered with dynamo < 2.2 by id(): kept alive so that no later object reuses an
# id that dynamo still allows in graphs.
_allowed_in_graph: List[Any] = []


def _allow_in_graph(wrapper: Any) -> None:
    import torch._dynamo  # 2.0/2.1 only: ~0.6 s, once, when a patch is first applied

    torch._dynamo.allow_in_graph(wrapper)
    _allowed_in_graph.append(wrapper)


_eager_versions: Dict[Any, Any] = {}


def run_eagerly(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``, never traced: dynamo breaks the graph and runs ``fn`` with real values
    (``torch._dynamo.disable``; only called while dynamo traces, so dynamo is imported)."""
    eager = _eager_versions.get(fn)
    if eager is None:
        import torch._dynamo

        eager = _eager_versions[fn] = torch._dynamo.disable(fn)
    return eager(*args)


def eager_only(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` as a function dynamo never traces: called from a traced frame, the graph breaks
    and ``fn`` runs with real values. Call it from a binder (:func:`register_binder`), once.

    Where dynamo can trace checked code without custom ops (torch 2.0-2.3) this is
    ``torch._dynamo.disable(fn)``, made now: dynamo 2.1 cannot trace the lazy look-up of
    :func:`run_eagerly` (``dict.get`` keyed by a function), so dynamo is imported once, at
    bind time, on those releases only. Elsewhere that path runs only where a test removes the
    custom ops, and :func:`run_eagerly` (no import before the first trace) serves.
    """
    if HAS_COMPILE and not HAS_CUSTOM_OP:
        import torch._dynamo  # torch 2.0-2.3 only: ~0.6 s, once

        return torch._dynamo.disable(fn)

    def run(*args: Any) -> Any:
        return run_eagerly(fn, *args)

    return run


#: ``register_with_dynamo(wrapper)``: make a monkeypatch wrapper of a torch function traceable.
#: dynamo >= 2.2 looks torch functions up by object (trace_rules, through ``__wrapped__``) and
#: needs nothing; 2.0/2.1 look them up by id() and need ``allow_in_graph(wrapper)``.
register_with_dynamo: Callable[[Any], None] = _no_registration


def _bind_compiling() -> None:
    global compiling, tracing, register_with_dynamo
    if not HAS_COMPILE:  # torch < 2.0: no dynamo
        compiling = tracing = _never_compiling
        register_with_dynamo = _no_registration
        return
    compiler: Any = getattr(torch, "compiler", None)
    if HAS_COMPILER_IS_COMPILING:
        tracing = compiler.is_compiling
    elif HAS_UTILS_IS_COMPILING:
        tracing = torch._utils.is_compiling
    else:
        tracing = _dynamo_is_compiling
    compiling = _compiling_any
    register_with_dynamo = _no_registration if DYNAMO_HAS_TRACE_RULES else _allow_in_graph


# --- branch binding ------------------------------------------------------------------------
_binders: List[Callable[[], None]] = []
_lock = threading.RLock()


def register_binder(binder: Callable[[], None]) -> Callable[[], None]:
    """Register (and run now) a function that selects a module's branches from the flags.

    Used as a decorator at module level; it is re-run by :func:`override`.
    """
    with _lock:
        _binders.append(binder)
    binder()
    return binder


def _rebind() -> None:
    for binder in list(_binders):
        binder()


@contextlib.contextmanager
def override(**values: bool) -> Iterator[None]:
    """Temporarily set flags (simulating another torch) and re-select every branch.

    >>> from safetorch import _compat
    >>> with _compat.override(LOAD_HAS_MMAP=False):
    ...     _compat.LOAD_HAS_MMAP
    False
    """
    g = globals()
    unknown = sorted(set(values) - set(_FLAGS))
    if unknown:
        raise KeyError(f"unknown _compat flag(s) {unknown}; known: {sorted(_FLAGS)}")
    with _lock:
        saved = {name: g[name] for name in values}
        g.update(values)
        try:
            _rebind()
            yield
        finally:
            g.update(saved)
            _rebind()


register_binder(_bind_compiling)
