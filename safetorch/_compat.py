"""The only module that inspects torch's version or features.

Every flag is resolved once, at import. Feature detection comes first (``hasattr``,
``inspect.signature``); ``TORCH_RELEASE`` (a ``Version(...).release`` tuple, so a
``2.5.0.dev`` nightly does not compare below ``2.5``) is used only where detection is
impossible. Each flag names the torch release / PR that introduced the behaviour.

Implementations never test a flag per call: they select their branch at import through
:func:`register_binder`, and tests simulate an older torch with :func:`override`, which sets
flags and re-runs every binder so each branch runs on the installed torch.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import threading
from typing import Any, Callable, Dict, Iterator, List, NamedTuple

import torch
from packaging.version import Version

__all__: List[str] = []  # private module; names are used by safetorch internals and tests

TORCH_VERSION: str = torch.__version__
# .release drops local labels (+cpu, +cu121) and pre-release tags: 2.5.0.dev2024 -> (2, 5, 0).
TORCH_RELEASE = Version(TORCH_VERSION.split("+")[0]).release


def _params(fn: Any) -> Dict[str, inspect.Parameter]:
    try:
        return dict(inspect.signature(fn).parameters)
    except (TypeError, ValueError):  # builtins without a signature
        return {}


_LOAD_PARAMS = _params(torch.load)
_LOAD_STATE_DICT_PARAMS = _params(torch.nn.Module.load_state_dict)


class Flag(NamedTuple):
    """A resolved feature flag, with the release that introduced it and how it was detected."""

    name: str
    value: bool
    since: str
    detected_by: str


# --- serialization -------------------------------------------------------------------------
# torch.load(weights_only=) -- torch 1.13 (pytorch/pytorch#86812).
LOAD_HAS_WEIGHTS_ONLY: bool = "weights_only" in _LOAD_PARAMS
# torch.load(weights_only=None) means True -- torch 2.6 (pytorch/pytorch#137602). The signature
# cannot tell: it reads `weights_only: Optional[bool] = None` in 2.4, 2.5 and 2.6+. 2.6 added the
# private resolver torch.serialization._default_to_weights_only(pickle_module), which answers
# exactly this question (False in fbcode builds). Env vars TORCH_FORCE_WEIGHTS_ONLY_LOAD /
# TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD still override it per process, so safetorch always passes
# weights_only explicitly and uses this flag only to describe torch's own default.
_default_to_weights_only = getattr(torch.serialization, "_default_to_weights_only", None)
LOAD_WEIGHTS_ONLY_DEFAULT_TRUE: bool = bool(
    _default_to_weights_only is not None and _default_to_weights_only(None)
)
# torch.load(mmap=) -- torch 2.1 (pytorch/pytorch#102549).
LOAD_HAS_MMAP: bool = "mmap" in _LOAD_PARAMS
# Module.load_state_dict(assign=) -- torch 2.1 (pytorch/pytorch#102212).
LOAD_STATE_DICT_HAS_ASSIGN: bool = "assign" in _LOAD_STATE_DICT_PARAMS
# torch.serialization.add_safe_globals -- torch 2.4 (pytorch/pytorch#124331).
HAS_ADD_SAFE_GLOBALS: bool = hasattr(torch.serialization, "add_safe_globals")
# torch.serialization.safe_globals context manager -- torch 2.5 (pytorch/pytorch#127939).
HAS_SAFE_GLOBALS_CTX: bool = hasattr(torch.serialization, "safe_globals")
# torch.serialization.get_unsafe_globals_in_checkpoint -- torch 2.6 (pytorch/pytorch#139221).
HAS_GET_UNSAFE_GLOBALS: bool = hasattr(torch.serialization, "get_unsafe_globals_in_checkpoint")


def _probe_load_honours_pickle_module() -> bool:
    import io
    import pickle
    import types
    import warnings

    if "weights_only" not in _LOAD_PARAMS:
        return False  # torch < 1.13: no weights_only=False to pass
    used: List[bool] = []

    class _Unpickler(pickle.Unpickler):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            used.append(True)
            super().__init__(*args, **kwargs)

    module = types.ModuleType("_safetorch_probe_pickle")
    module.Unpickler = _Unpickler  # type: ignore[attr-defined]
    module.load = pickle.load  # type: ignore[attr-defined]
    buf = io.BytesIO()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.save(0, buf)
            buf.seek(0)
            torch.load(buf, pickle_module=module, weights_only=False)
    except Exception:  # e.g. TORCH_FORCE_WEIGHTS_ONLY_LOAD=1: treat as not honoured (safe side)
        return False
    return bool(used)


# torch.load(pickle_module=M, weights_only=False) unpickles with M -- torch 2.0 (1.13.x's load
# did `else: pickle_module = pickle`, ignoring it unless weights_only=True; 2.0.0 reads `if
# pickle_module is None`). Probed by a tiny load at import. False before 1.13 (no weights_only).
LOAD_HONOURS_PICKLE_MODULE: bool = _probe_load_honours_pickle_module()
# Tensor.untyped_storage() -- torch 2.0 (absent from the 1.13 sources, present in 2.0.0); 1.13 has
# only Tensor.storage() (a TypedStorage, deprecated with a warning from 2.0 on).
HAS_UNTYPED_STORAGE: bool = hasattr(torch.Tensor, "untyped_storage")

# --- devices -------------------------------------------------------------------------------
# torch.accelerator with is_available()/current_accelerator() -- torch 2.6 (pytorch/pytorch#132204).
# In 2.6 current_accelerator() raises without an accelerator; is_available() never does.
HAS_ACCELERATOR: bool = hasattr(torch, "accelerator") and hasattr(torch.accelerator, "is_available")
# torch.cuda.set_sync_debug_mode -- torch 1.10 (pytorch/pytorch#62092).
HAS_SYNC_DEBUG_MODE: bool = hasattr(torch.cuda, "set_sync_debug_mode")
# ROCm builds: torch.version.hip is a string. Their index kernels may not bounds-check at all.
IS_ROCM: bool = getattr(torch.version, "hip", None) is not None

# --- compile / ops -------------------------------------------------------------------------
# torch.compile and torch._dynamo.eval_frame.OptimizedModule (`_orig_mod`) -- torch 2.0
# (pytorch/pytorch#88629).
HAS_COMPILE: bool = hasattr(torch, "compile")
# torch.compiler.is_compiling -- torch 2.3 (torch._dynamo.is_compiling before; deprecated in its
# favour in 2.4). Monkeypatch wrappers use it to call torch's original while dynamo traces.
HAS_COMPILER_IS_COMPILING: bool = hasattr(getattr(torch, "compiler", None), "is_compiling")
# torch._dynamo.trace_rules -- torch 2.2 (replaced allowed_functions.py): dynamo looks torch
# functions up by object (through __wrapped__), so it treats a monkeypatch wrapper like the
# function it wraps; 2.0/2.1 look them up by id() and need allow_in_graph(wrapper). Detected by
# the file, because importing torch._dynamo costs ~1 s.
DYNAMO_HAS_TRACE_RULES: bool = os.path.isfile(
    os.path.join(os.path.dirname(torch.__file__), "_dynamo", "trace_rules.py")
)
# Dynamo guards the identity of a function it read from a module global (GuardBuilder
# .FUNCTION_MATCH is ID_MATCH for every source) -- torch 2.4; up to 2.3 only local functions are
# guarded, so code compiled before st.patch()/st.unpatch() keeps the function it saw. Internal to
# torch._dynamo.guards, not detectable without importing dynamo: a release check.
DYNAMO_GUARDS_GLOBAL_FUNCTIONS: bool = TORCH_RELEASE >= (2, 4)
# torch.aminmax -- torch 1.10 (pytorch/pytorch#62401; one pass for min and max).
HAS_AMINMAX: bool = hasattr(torch, "aminmax")

# --- data ----------------------------------------------------------------------------------
# DataLoader(pin_memory=True) without an accelerator warns "'pin_memory' argument is set as true
# but no accelerator is found" on every iterator -- torch 2.7 (pytorch/pytorch#131858); up to 2.6
# pinning is turned off silently. Only the message in _BaseDataLoaderIter.__init__ changed: a
# release check.
DATALOADER_WARNS_PIN_WITHOUT_ACCELERATOR: bool = TORCH_RELEASE >= (2, 7)

# --- nn ------------------------------------------------------------------------------------
# SyncBatchNorm falls back to plain batch_norm when torch.distributed is not initialized
# -- torch 2.0 (pytorch/pytorch#89706; 1.13 raises "SyncBatchNorm expected input tensor to be on
# GPU" for any CPU input). No attribute or parameter changed, so this is a release check.
SYNCBN_FALLS_BACK_WITHOUT_PG: bool = TORCH_RELEASE >= (2, 0)


# torch.distributed.checkpoint (DCP) as a public package -- torch 2.0 (1.13 had it under
# torch.distributed._shard.checkpoint). Found without importing it.
def _has_module(name: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


HAS_DCP: bool = _has_module("torch.distributed.checkpoint")


# --- legacy APIs (the `legacy` patch fills only the gaps these flags report) ----------------
def _raises(fn: Callable[[], Any], *errors: type[BaseException]) -> bool:
    import warnings

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fn()
    except errors:
        return True
    return False


# torch._six -- removed in torch 2.0 (no torch/_six.py in the 2.0 sources); detected by looking for
# the module file, so nothing is imported.
HAS_TORCH_SIX: bool = os.path.isfile(os.path.join(os.path.dirname(torch.__file__), "_six.py"))
# torch.solve / lstsq / eig / symeig / matrix_rank -- deprecated in torch 1.9 in favour of
# torch.linalg; later releases keep stubs in torch/_linalg_utils.py that raise "This function was
# deprecated since version 1.9 and is now removed". Detected by calling each on a 1x1 matrix.
_ONE = torch.ones(1, 1)
HAS_TORCH_SOLVE: bool = not _raises(lambda: torch.solve(_ONE, _ONE), RuntimeError, AttributeError)
HAS_TORCH_LSTSQ: bool = not _raises(lambda: torch.lstsq(_ONE, _ONE), RuntimeError, AttributeError)
HAS_TORCH_EIG: bool = not _raises(lambda: torch.eig(_ONE), RuntimeError, AttributeError)
HAS_TORCH_SYMEIG: bool = not _raises(lambda: torch.symeig(_ONE), RuntimeError, AttributeError)
HAS_TORCH_MATRIX_RANK: bool = not _raises(
    lambda: torch.matrix_rank(_ONE), RuntimeError, AttributeError
)


def _call_legacy_function() -> None:
    class _Legacy(torch.autograd.Function):
        def forward(self, x: Any) -> Any:  # type: ignore[override]  # the legacy form itself
            return x

    _Legacy()(torch.ones(1))


# Legacy autograd Functions (instance forward/backward, called as Fn()(x)) -- raise since torch
# 1.5 ("Legacy autograd function with non-static forward method is deprecated"). Probed.
LEGACY_FUNCTION_RAISES: bool = _raises(_call_legacy_function, RuntimeError)
# x[0] of a 0-dim tensor -- raises IndexError since torch 0.5 (0.4 warned and returned the
# tensor). Probed.
ZERO_DIM_INDEX_RAISES: bool = _raises(lambda: torch.tensor(0.0)[0], IndexError)


# Variable(x, volatile=True) -- a no-op with a warning since torch 0.4 ("volatile was removed and
# now has no effect"): the result does not carry volatile any more. Probed.
def _volatile_kept() -> bool:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        v = torch.autograd.Variable(torch.ones(1), volatile=True)
        return bool(getattr(v, "volatile", False))


VOLATILE_IS_NOOP: bool = not _volatile_kept()
# size_average=/reduce= on losses map to reduction= through torch.nn._reduction.legacy_get_string
# (emit_warning=) -- torch 1.0 (pytorch/pytorch#10512 added reduction=).
HAS_LEGACY_REDUCTION: bool = "emit_warning" in _params(
    getattr(getattr(torch.nn, "_reduction", None), "legacy_get_string", None)
)

_FLAG_DOCS: Dict[str, tuple[str, str]] = {
    "LOAD_HAS_WEIGHTS_ONLY": ("1.13", "inspect.signature(torch.load)"),
    "LOAD_WEIGHTS_ONLY_DEFAULT_TRUE": (
        "2.6",
        "torch.serialization._default_to_weights_only(None)",
    ),
    "LOAD_HAS_MMAP": ("2.1", "inspect.signature(torch.load)"),
    "LOAD_STATE_DICT_HAS_ASSIGN": ("2.1", "inspect.signature(Module.load_state_dict)"),
    "HAS_ADD_SAFE_GLOBALS": ("2.4", "hasattr(torch.serialization, 'add_safe_globals')"),
    "HAS_SAFE_GLOBALS_CTX": ("2.5", "hasattr(torch.serialization, 'safe_globals')"),
    "HAS_GET_UNSAFE_GLOBALS": (
        "2.6",
        "hasattr(torch.serialization, 'get_unsafe_globals_in_checkpoint')",
    ),
    "LOAD_HONOURS_PICKLE_MODULE": (
        "2.0",
        "torch.load(pickle_module=probe, weights_only=False) uses probe.Unpickler",
    ),
    "HAS_UNTYPED_STORAGE": ("2.0", "hasattr(torch.Tensor, 'untyped_storage')"),
    "HAS_ACCELERATOR": ("2.6", "hasattr(torch.accelerator, 'is_available')"),
    "HAS_SYNC_DEBUG_MODE": ("1.10", "hasattr(torch.cuda, 'set_sync_debug_mode')"),
    "IS_ROCM": ("-", "torch.version.hip"),
    "HAS_COMPILE": ("2.0", "hasattr(torch, 'compile')"),
    "HAS_COMPILER_IS_COMPILING": ("2.3", "hasattr(torch.compiler, 'is_compiling')"),
    "DYNAMO_HAS_TRACE_RULES": ("2.2", "torch/_dynamo/trace_rules.py exists"),
    "DYNAMO_GUARDS_GLOBAL_FUNCTIONS": (
        "2.4",
        "release >= 2.4 (torch._dynamo.guards, not detectable)",
    ),
    "DATALOADER_WARNS_PIN_WITHOUT_ACCELERATOR": (
        "2.7",
        "release >= 2.7 (a warning in DataLoader, not detectable)",
    ),
    "HAS_AMINMAX": ("1.10", "hasattr(torch, 'aminmax')"),
    "SYNCBN_FALLS_BACK_WITHOUT_PG": ("2.0", "release >= 2.0 (PR #89706, not detectable)"),
    "HAS_DCP": ("2.0", "importlib.util.find_spec('torch.distributed.checkpoint')"),
    "HAS_TORCH_SIX": ("-", "torch/_six.py exists (removed in torch 2.0)"),
    "HAS_TORCH_SOLVE": (
        "-",
        "torch.solve(1x1, 1x1) does not raise (deprecated in 1.9, later a raising stub)",
    ),
    "HAS_TORCH_LSTSQ": (
        "-",
        "torch.lstsq(1x1, 1x1) does not raise (deprecated in 1.9, later a raising stub)",
    ),
    "HAS_TORCH_EIG": (
        "-",
        "torch.eig(1x1) does not raise (deprecated in 1.9, later a raising stub)",
    ),
    "HAS_TORCH_SYMEIG": (
        "-",
        "torch.symeig(1x1) does not raise (deprecated in 1.9, later a raising stub)",
    ),
    "HAS_TORCH_MATRIX_RANK": (
        "-",
        "torch.matrix_rank(1x1) does not raise (deprecated in 1.9, later a raising stub)",
    ),
    "LEGACY_FUNCTION_RAISES": ("1.5", "calling a legacy Function instance raises"),
    "ZERO_DIM_INDEX_RAISES": ("0.5", "torch.tensor(0.)[0] raises IndexError"),
    "VOLATILE_IS_NOOP": ("0.4", "Variable(x) has no .volatile"),
    "HAS_LEGACY_REDUCTION": ("1.0", "legacy_get_string(..., emit_warning=) exists"),
}


def flags() -> List[Flag]:
    """Every feature flag with its current value, introducing release and detection method."""
    g = globals()
    return [Flag(name, bool(g[name]), since, how) for name, (since, how) in _FLAG_DOCS.items()]


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
    unknown = sorted(set(values) - set(_FLAG_DOCS))
    if unknown:
        raise KeyError(f"unknown _compat flag(s) {unknown}; known: {sorted(_FLAG_DOCS)}")
    with _lock:
        saved = {name: g[name] for name in values}
        g.update(values)
        try:
            _rebind()
            yield
        finally:
            g.update(saved)
            _rebind()
