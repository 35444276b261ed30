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
* Under ``safetorch run`` (``SAFETORCH_TRUST_ROOT``, see ``allow.trust_root``) the project
  trust rule is on: whole-model pickles of the script's own ``nn.Module`` classes (plus
  ``torch.nn``'s and numpy arrays) load, as ``st.load(trust_root=...)``; each load it
  admitted something for is a report line naming what.
* Tensors are read into memory unless the caller passes ``mmap=True`` (as torch): a later
  ``torch.save`` over the same path never changes what an earlier ``torch.load`` returned.
"""

from __future__ import annotations

import importlib
import inspect
import pickle
import warnings
from typing import Any, Dict, Optional, Tuple

import torch

from safetorch import _compat
from safetorch._stack import user_stacklevel
from safetorch.errors import PatchWarning, UnsafeCheckpointError
from safetorch.patching.allow import TRUST_ENV, allowed_globals, trust_root
from safetorch.patching.registry import Patch, Target, declare
from safetorch.patching.report import record
from safetorch.patching.routing import route

__all__: list = []

_NAME = "load"
_SIGNATURE = inspect.signature(torch.load)
_checkpoint = importlib.import_module("safetorch.checkpoint")
_cuda_available = torch.cuda.is_available
_MapToAvailable = _checkpoint.MapToAvailable
_trust = importlib.import_module("safetorch.checkpoint._trust")


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

    if weights_only is None:
        weights_only = True
        if _DEFAULT_NOTE is not None:
            record(_NAME, _DEFAULT_NOTE, "a full unpickle can run arbitrary code")
    to_cpu = None
    if map_location is None and not _cuda_available():
        # st.load(map_location="available"), keeping the count for the report.
        map_location = to_cpu = _MapToAvailable()

    if weights_only is False:
        if mmap is not None:
            extra["mmap"] = mmap
        result = wrapped(f, map_location, None, weights_only=False, **extra)
    else:
        encoding = extra.pop("encoding", "utf-8")
        record(_NAME, "torch.load -> st.load", "weights_only, clear errors")
        root = trust_root()
        with _trust.recording() as trusted:
            try:
                result = _checkpoint.load(
                    f,
                    map_location,
                    weights_only=True,
                    mmap=mmap,
                    encoding=encoding,
                    allow=allowed_globals(),
                    trust_root=root,
                )
            except UnsafeCheckpointError as exc:
                # torch's own words first, as torch.load(weights_only=True) raises it (code
                # matches on them), then safetorch's: what was refused and every way out.
                if exc.args and not str(exc.args[0]).startswith(_TORCH_REFUSAL):
                    exc.args = (f"{_TORCH_REFUSAL} {exc.args[0]}", *exc.args[1:])
                raise
        if trusted:
            shown = ", ".join(trusted[:6]) + (
                f" and {len(trusted) - 6} more" if len(trusted) > 6 else ""
            )
            record(
                _NAME,
                f"whole-model pickle loaded by the project trust rule ({TRUST_ENV}={root})",
                f"admitted {shown}",
            )
    if to_cpu is not None and to_cpu.mapped:
        record(
            _NAME,
            "CUDA tensors mapped to CPU (no CUDA here)",
            f"{to_cpu.mapped} storages in the first such file",
        )
    return result


# One call, however many changes it records (the weights_only default, CUDA storages mapped).
_torch_load = route(_NAME, _load, counted=True)

PATCH = declare(
    Patch(
        name=_NAME,
        targets=(
            Target("torch", "load", _torch_load),
            Target("torch.serialization", "load", _torch_load),
        ),
    )
)
