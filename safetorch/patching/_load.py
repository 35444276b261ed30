"""Patch ``load``: ``torch.load`` with st.load's semantics, keeping torch.load's contract.

* ``weights_only`` unset or ``None`` means weights-only on every torch (torch < 2.6 defaults to
  a full unpickle); an explicit ``weights_only=False`` is the caller's decision and is honoured.
* ``pickle_module=pickle`` (the standard module, torch's own default) loads weights-only
  through ``st.load``, as torch >= 2.6 would load the file. Any other ``pickle_module`` (e.g.
  ``dill``) is passed to torch untouched: it unpickles fully, so the call is recorded in the
  patch report and warned about.
* ``encoding=`` (Python 2 checkpoints) reaches st.load's unpickler; other pickle arguments
  only matter to a full unpickle and go to torch with ``weights_only=False``.
* With ``map_location`` unset and no CUDA, storages saved on CUDA are mapped to the CPU
  instead of failing ("Attempting to deserialize object on a CUDA device but
  torch.cuda.is_available() is False"); a file saved on CPU loads exactly as before. This is
  st.load's documented ``map_location="available"`` (``safetorch.checkpoint.MapToAvailable``,
  a callable that sees every storage's location).
* Globals named with ``safetorch run --allow`` / ``SAFETORCH_ALLOW`` are allowed for these
  loads (``allow.allowed_globals()``); torch's ``add_safe_globals`` registrations too.
* ``weights_only`` unset: a file trusted by provenance (its hash is in the user's ledger:
  safetorch wrote it, or ``safetorch trust FILE``; or ``safetorch run --trust FILE``) loads
  fully, as st.load loads it; each such load is a report line. An explicit
  ``weights_only=True`` stays weights-only.
* ``torch.save`` is ``st.save``: the same archive, and a file a weights-only load would refuse
  (a whole model, numpy arrays) has its hash recorded as it is written, so the program's own
  ``torch.save(model, path)`` ... ``torch.load(path)`` runs unedited. Each save that recorded a
  hash is a report line.
* Tensors are read into memory unless the caller passes ``mmap=True`` (as torch): a later
  ``torch.save`` over the same path never changes what an earlier ``torch.load`` returned.
"""

from __future__ import annotations

import inspect
import os
import pickle
import warnings
from typing import Any, Dict, Optional, Tuple

import torch

from safetorch import _compat
from safetorch._stack import user_stacklevel
from safetorch.errors import PatchWarning, UnsafeCheckpointError
from safetorch.patching._allow import allowed_globals
from safetorch.patching._registry import Patch, Target, declare
from safetorch.patching._report import record
from safetorch.patching._routing import LazyModule, route

__all__: list = []

_NAME = "load"
_SIGNATURE = inspect.signature(torch.load)
# Imported at the first patched load or save: a run that never loads never imports them.
# A full load (weights_only=False) needs only MapToAvailable (_common), not st.load's modules.
_checkpoint: Any = LazyModule("safetorch.checkpoint")
_common: Any = LazyModule("safetorch.checkpoint._common")
_cuda_available = torch.cuda.is_available
_saving: Any = LazyModule("safetorch.checkpoint.saving")
_SAVE_SIGNATURE = inspect.signature(torch.save)


_DEFAULT_NOTE: Optional[str] = None


@_compat.register_binder
def _bind() -> None:
    global _DEFAULT_NOTE
    # Only a change worth reporting where torch's own default is a full unpickle.
    _DEFAULT_NOTE = (
        None
        if _compat.LOAD_WEIGHTS_ONLY_DEFAULT_TRUE
        else "weights_only=True (this torch defaults to False)"
    )


# torch.serialization's true values for TORCH_FORCE_WEIGHTS_ONLY_LOAD (torch >= 2.4).
_TRUE = ("1", "y", "yes", "true")

# The first words of torch.load's weights-only refusal (torch 2.x), which callers match on.
_TORCH_REFUSAL = "Weights only load failed."


def _load(wrapped: Any, instance: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
    try:
        bound = _SIGNATURE.bind(*args, **kwargs)
    except TypeError:
        return wrapped(*args, **kwargs)  # torch's own error for a bad call
    a = bound.arguments
    f = a["f"]
    map_location = a.get("map_location")
    pickle_module = a.get("pickle_module")
    weights_only = a.get("weights_only")
    mmap = a.get("mmap")
    extra = dict(a.get("pickle_load_args") or {})

    if pickle_module is not None and pickle_module is not pickle:
        # A custom unpickler (dill, ...) is the caller's explicit choice: torch gets the call
        # exactly as written, and the report and a warning say it is a full unpickle.
        module_name = getattr(pickle_module, "__name__", type(pickle_module).__name__)
        record(
            _NAME,
            f"custom pickle_module={module_name} passed to torch.load untouched",
            "a full unpickle: it can run arbitrary code",
        )
        warnings.warn(
            f"torch.load(pickle_module={module_name}) unpickles fully and can run arbitrary "
            "code; safetorch passes it to torch untouched. Drop pickle_module to load "
            "weights-only.",
            PatchWarning,
            stacklevel=user_stacklevel(),
        )
        return wrapped(*args, **kwargs)

    if os.environ.get("TORCH_FORCE_WEIGHTS_ONLY_LOAD", "0").lower() in _TRUE:
        weights_only = True  # torch's own switch: weights-only, whatever the call or the ledger
    if weights_only is None and _DEFAULT_NOTE is not None:
        record(_NAME, _DEFAULT_NOTE, "a full unpickle can run arbitrary code")
    to_cpu = None
    if map_location is None and not _cuda_available():
        # st.load(map_location="available"), keeping the count for the report.
        map_location = to_cpu = _common.MapToAvailable()

    if weights_only is False:
        if mmap is not None:
            extra["mmap"] = mmap
        result = wrapped(f, map_location, None, weights_only=False, **extra)
    else:
        encoding = extra.pop("encoding", "utf-8")
        record(_NAME, "torch.load -> st.load", "weights_only, clear errors")
        with _saving.noting() as seen:
            try:
                result = _checkpoint.load(
                    f,
                    map_location,
                    weights_only=weights_only,
                    mmap=mmap,
                    encoding=encoding,
                    allow=allowed_globals(),
                )
            except UnsafeCheckpointError as exc:
                # torch's own words first, as torch.load(weights_only=True) raises it (code
                # matches on them), then safetorch's: what was refused and every way out.
                if exc.args and not str(exc.args[0]).startswith(_TORCH_REFUSAL):
                    exc.args = (f"{_TORCH_REFUSAL} {exc.args[0]}", *exc.args[1:])
                raise
        for event, how in seen:
            if event == "loaded":
                record(_NAME, "file trusted by provenance loaded fully", f"its hash is in {how}")
    if to_cpu is not None and to_cpu.mapped:
        record(
            _NAME,
            "CUDA tensors mapped to CPU (no CUDA here)",
            f"{to_cpu.mapped} storages in the first such file",
        )
    return result


def _save(wrapped: Any, instance: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
    try:
        bound = _SAVE_SIGNATURE.bind(*args, **kwargs)
    except TypeError:
        return wrapped(*args, **kwargs)  # torch's own error for a bad call
    a = dict(bound.arguments)
    obj, f = a.pop("obj"), a.pop("f")
    with _saving.noting() as seen:
        _saving.save(obj, f, **a)
    if any(event == "recorded" for event, _ in seen):
        record(
            _NAME,
            "torch.save -> st.save: a file weights-only loads refuse, recorded as trusted",
            "its hash is in the trust ledger: torch.load of it loads fully",
        )
    return None


# One call, however many changes it records (the weights_only default, CUDA storages mapped).
_torch_load = route(_NAME, _load, counted=True)
_torch_save = route(_NAME, _save, counted=True)

PATCH = declare(
    Patch(
        name=_NAME,
        targets=(
            Target("torch", "load", _torch_load),
            Target("torch.serialization", "load", _torch_load),
            Target("torch", "save", _torch_save),
            Target("torch.serialization", "save", _torch_save),
        ),
    )
)
