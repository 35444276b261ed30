"""Patch ``state_dict``: ``Module.load_state_dict`` does what ``st.load_state_dict`` does.

When every checkpoint key is one the model expects, torch's original runs with the caller's
arguments and nothing else is done beyond one key-set comparison (a library's own resume
runs exactly as without the patch). Otherwise the call goes to ``st.load_state_dict`` with
the caller's ``strict`` and ``assign``: wrapper segments (``module.``, ``_orig_mod.``, FSDP,
checkpoint wrappers) and Lightning's ``model.`` are matched away, AveragedModel's
``n_averaged`` is reported rather than unexpected, a strict load refuses before touching the
model, and the return value is the :class:`~safetorch.LoadReport`, which unpacks, indexes and
compares like torch's ``_IncompatibleKeys`` (``missing, unexpected = model.load_state_dict(...)``).
"""

from __future__ import annotations

import importlib
import inspect
import logging
from collections.abc import Mapping
from typing import Any, Dict, Tuple

from torch import nn

from safetorch.patching import registry

__all__: list = []

_NAME = "state_dict"
_log = logging.getLogger("safetorch")
_model_state = importlib.import_module("safetorch.checkpoint.model_state")
_SIGNATURE = inspect.signature(nn.Module.load_state_dict)


def _select(instance: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
    """(source, strict, options) when the call needs st.load_state_dict, else None."""
    if not isinstance(instance, nn.Module):
        return None
    try:
        bound = _SIGNATURE.bind(instance, *args, **kwargs)
    except TypeError:
        return None  # torch's own error for a bad call
    source = bound.arguments.get("state_dict")
    if not isinstance(source, Mapping):
        return None
    expected = instance.state_dict(keep_vars=True).keys()
    if all(k in expected for k in source):
        return None  # nothing to rename: torch's own path, untouched
    strict = bound.arguments.get("strict", True)
    options = {}
    if "assign" in bound.arguments:
        options["assign"] = bound.arguments["assign"]
    return source, strict, options


def _load_state_dict_body(
    wrapped: Any, instance: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any]
) -> Any:
    ((source, strict, options),) = args
    try:
        report = _model_state.load_state_dict(instance, source, strict=bool(strict), **options)
    except RuntimeError as exc:
        registry.record(
            _NAME,
            "load_state_dict -> st.load_state_dict (refused)",
            str(exc).splitlines()[0].rstrip(":"),
        )
        raise
    _log.info("load_state_dict into %s: %s", type(instance).__name__, report.rule)
    registry.record(
        _NAME,
        f"load_state_dict -> st.load_state_dict: {report.rule}",
        f"{len(report.loaded)} loaded, {len(report.missing)} missing, "
        f"{len(report.unexpected)} unexpected",
    )
    return report


_load_state_dict = registry.route(_NAME, _load_state_dict_body, counted=True, select=_select)


PATCH = registry.declare(
    registry.Patch(
        name=_NAME,
        description=(
            "Module.load_state_dict: keys that match load as torch does; otherwise "
            "st.load_state_dict (wrapper prefixes, Lightning's model., AveragedModel's "
            "n_averaged), counted; returns a LoadReport that unpacks like torch's result"
        ),
        targets=(registry.Target("torch.nn", "Module.load_state_dict", _load_state_dict),),
        pitfalls=("state-dict-of-wrapped-model", "discarded-nonstrict-load"),
        implementation=("safetorch.checkpoint", "load_state_dict"),
    )
)
