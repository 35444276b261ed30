"""Patch ``state_dict``: ``Module.load_state_dict`` does what ``st.load_state_dict`` does.

When every checkpoint key is one the model expects, torch's original runs with the caller's
arguments and nothing else is done beyond one key-set comparison (a library's own resume
runs exactly as without the patch). Otherwise the call goes to ``st.load_state_dict`` with
the caller's ``strict`` and ``assign``: wrapper segments (``module.``, ``_orig_mod.``, FSDP,
checkpoint wrappers) and Lightning's ``model.`` are matched away, AveragedModel's
``n_averaged`` is reported rather than unexpected, a strict load refuses before touching the
model, and the return value is a :class:`~safetorch.checkpoint.report.PatchedLoadReport`: the
report, printed, compared and unpacked as torch's ``_IncompatibleKeys``
(``missing, unexpected = model.load_state_dict(...)``). Keys an older torch wrote (InstanceNorm
running stats of torch < 0.4.0, BatchNorm checkpoints without ``num_batches_tracked``, ...) go
the same way and are reported as dropped or defaulted.

torch's contract holds: every error is a ``RuntimeError`` whose message starts with torch's own
(``Error(s) in loading state_dict for Net:`` with its ``Missing key(s) in state_dict: ...``,
``Unexpected key(s) ...`` and ``size mismatch for ...`` lines), safetorch's guidance after it.
``strict=False`` that leaves parameters unloaded warns (a ``CheckpointWarning``) once per
call site.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Mapping
from typing import Any, Dict, Tuple

from torch import nn

from safetorch.errors import CheckpointError
from safetorch.patching._registry import Patch, Target, declare
from safetorch.patching._report import record
from safetorch.patching._routing import LazyModule, route

__all__: list = []

_NAME = "state_dict"
_log = logging.getLogger("safetorch")
# Imported at the first load that needs st.load_state_dict (most loads go to torch's own).
_model_state: Any = LazyModule("safetorch.checkpoint.model_state")
_report: Any = LazyModule("safetorch.checkpoint.report")
_SIGNATURE = inspect.signature(nn.Module.load_state_dict)
# Leaf names of model keys that torch's own loader fills in for older checkpoints
# (safetorch.checkpoint._legacy_keys.legacy_keys, action "default"): a load that lacks only such keys
# goes through st.load_state_dict, which reports them as defaulted.
_DEFAULTED_LEAVES = frozenset({"num_batches_tracked", "eps"})


def _only_defaultable_missing(source: Mapping, expected: Any) -> bool:
    if len(source) >= len(expected):
        return False
    missing = [k for k in expected if k not in source]
    return bool(missing) and all(k.rpartition(".")[2] in _DEFAULTED_LEAVES for k in missing)


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
    if all(k in expected for k in source) and not _only_defaultable_missing(source, expected):
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
        record(_NAME, "load_state_dict -> st.load_state_dict (refused)", _reason(exc))
        if isinstance(exc, CheckpointError) and not str(exc).startswith("Error(s) in loading"):
            raise _with_torch_text(exc, instance, source, bool(strict)) from exc
        raise
    _log.info("load_state_dict into %s: %s", type(instance).__name__, report.rule)
    record(
        _NAME,
        f"load_state_dict -> st.load_state_dict: {report.rule}",
        f"{len(report.loaded)} loaded, {len(report.missing)} missing, "
        f"{len(report.unexpected)} unexpected"
        + (
            f", {len(report.dropped)} dropped, {len(report.defaulted)} defaulted (keys of an "
            "older torch)"
            if report.dropped or report.defaulted
            else ""
        ),
    )
    return _report.PatchedLoadReport.of(report)


def _reason(exc: BaseException) -> str:
    """What safetorch refused, for the patch report (torch's lines come first in the error)."""
    report = getattr(exc, "report", None)
    if isinstance(report, _report.LoadReport):
        return report.summary()
    lines = str(exc).splitlines()
    for line in lines:
        if line.startswith("safetorch: "):
            return line[len("safetorch: ") :].rstrip(".")
    return lines[0].rstrip(":") if lines else type(exc).__name__


def _with_torch_text(
    exc: CheckpointError, instance: nn.Module, source: Mapping, strict: bool
) -> CheckpointError:
    """A refusal that is not about keys (an ambiguous mapping, no state dict found) with what
    torch would have said first: its header, and with ``strict`` its lines for the keys."""
    expected = list(instance.state_dict(keep_vars=True))
    keys = _report.LoadReport(
        missing=[k for k in expected if k not in source] if strict else [],
        unexpected=[k for k in source if k not in expected] if strict else [],
    )
    text = keys.torch_error(type(instance).__name__)
    text = text[:-2] if text.endswith("\n\t") else text  # no key lines: the header alone
    return CheckpointError(f"{text}\nsafetorch: {exc}")


_load_state_dict = route(_NAME, _load_state_dict_body, counted=True, select=_select)


PATCH = declare(
    Patch(
        name=_NAME,
        targets=(Target("torch.nn", "Module.load_state_dict", _load_state_dict),),
    )
)
