"""st.load_state_dict: a checkpoint of any layout into any model, wrapped or not, with a report.

The load is a pipeline (docs/design.md draws it), each stage once and in order: resolve the path
(:func:`._resolve.resolve`), open the layout's files (:meth:`._layouts.Layout.open`), read and
check its meta view (:meth:`~._layouts.Layout.meta_view`), find the state dict and match keys
(:mod:`.keys`, :mod:`._legacy_keys`), apply (:class:`._apply.Destination`, which calls torch's
own ``Module.load_state_dict``, captured at import so that monkeypatch mode can route it here),
report (:class:`.report.LoadReport`).
"""

from __future__ import annotations

import collections
import logging
import warnings
from typing import (
    Any,
    Callable,
    Dict,
    Iterable,
    List,
    Mapping,
    Optional,
    Tuple,
    Union,
)

import torch
from torch import nn

from safetorch import _compat
from safetorch._stack import user_stacklevel
from safetorch.checkpoint import _layouts, _resolve
from safetorch.checkpoint._apply import Destination, _module_load_state_dict
from safetorch.checkpoint._formats import STATE_FORMAT
from safetorch.checkpoint._legacy_keys import legacy_keys, legacy_optional_targets, settle_legacy
from safetorch.checkpoint.keys import (
    N_AVERAGED,
    _remap_state_dict,
    canonical_key,
    find_state_dict,
    state_dict_keys,
    tensor_shape,
)
from safetorch.checkpoint.loading import FileLike, _is_path, load_for_copy
from safetorch.checkpoint.report import LoadReport, group_keys
from safetorch.errors import (
    CheckpointError,
    CheckpointMismatchError,
    CheckpointWarning,
)

__all__ = ["load_state_dict"]

logger = logging.getLogger("safetorch")
_assign_supported: bool


@_compat.register_binder
def _bind() -> None:
    global _assign_supported
    _assign_supported = _compat.LOAD_STATE_DICT_HAS_ASSIGN  # torch >= 2.1


# --- st.load_state_dict -----------------------------------------------------------------------
def _shape_mismatch(value: Any, param: Any) -> bool:
    v_shape, p_shape = tensor_shape(value), tensor_shape(param)
    if v_shape is None or p_shape is None or v_shape == p_shape:
        return False
    if nn.parameter.is_lazy(param):
        return False  # lazy modules take their shape from the checkpoint
    # torch's own backward-compat rule: a 0-dim parameter accepts a 1-element 1-dim tensor.
    return not (len(p_shape) == 0 and v_shape == (1,))


def _split_n_averaged(
    state_dict: Mapping[str, Any],
    target_keys: Iterable[str],
    read: Optional[Callable[[str], Any]] = None,
) -> Tuple[Mapping[str, Any], Optional[int]]:
    """Take AveragedModel's counter out of a checkpoint bound for a model without one."""
    if any(canonical_key(k) == N_AVERAGED for k in target_keys):
        return state_dict, None
    found = [k for k in state_dict if canonical_key(k) == N_AVERAGED]
    if len(found) != 1:
        return state_dict, None
    value = state_dict[found[0]]
    rest: "collections.OrderedDict[str, Any]" = collections.OrderedDict(
        (k, v) for k, v in state_dict.items() if k != found[0]
    )
    meta = getattr(state_dict, "_metadata", None)
    if meta is not None:
        rest._metadata = meta  # type: ignore[attr-defined]  # state dicts carry torch's _metadata attribute (an OrderedDict subclass attr)
    if read is not None and isinstance(value, torch.Tensor) and value.is_meta:
        value = read(found[0])  # a layout's meta view: read the one counter
    try:
        return rest, int(value.item()) if isinstance(value, torch.Tensor) else int(value)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise CheckpointError(
            f"the checkpoint's AveragedModel counter {found[0]!r} is {value!r:.80}, not a "
            "one-element number"
        ) from exc


def load_state_dict(
    model: nn.Module,
    source: Union[FileLike, Mapping[str, Any]],
    *,
    strict: bool = True,
    key: Optional[str] = None,
    assign: Optional[bool] = None,
    prefix: Optional[str] = None,
) -> LoadReport:
    """Load a checkpoint into a model through any wrapper, with a report of what happened.

    The state dict inside a container is found automatically (``state_dict``, ``model``, ...;
    EMA entries only with ``key=``). Wrapper segments (``module.``, ``_orig_mod.``,
    ``_fsdp_wrapped_module.``, ``_checkpoint_wrapped_module.``) anywhere in the keys of either
    side, and Lightning's leading ``model.``, are matched away; any other leading path is a
    real module and needs ``prefix=``; see :func:`safetorch.checkpoint.remap_state_dict`.
    Tensors are not copied before the final in-place copy into the model (none at all with
    ``assign=True``). Keys that older torch releases wrote and torch's own modules still
    accept (InstanceNorm running stats of torch < 0.4.0, BatchNorm checkpoints without
    ``num_batches_tracked``, ``weight_norm``'s ``weight_g``/``weight_v``, ...) are dropped,
    renamed or defaulted by the module's ``_metadata`` version and structure, and reported
    (``report.dropped``, ``report.defaulted``, ``report.legacy``); see
    :func:`safetorch.checkpoint._legacy_keys.legacy_keys`.

    Multi-file checkpoints load the same way, matched on their shapes before any tensor is
    read, then read lazily (only matched tensors; one shard at a time): a
    ``torch.distributed.checkpoint`` directory (through DCP itself, into plain or DTensor /
    FSDP2 parameters), a sharded index (``model.safetensors.index.json``,
    ``pytorch_model.bin.index.json``) or a directory written by transformers or accelerate;
    ``report.source`` names the file or layout used.

    Args:
        model: the target, wrapped or not.
        source: a path (file, directory or shard index), a file object, a state dict or a
            checkpoint dict.
        strict: raise on any missing, unexpected or shape-mismatched key, before touching the
            model. With ``strict=False`` those are skipped and reported (shape mismatches
            never raise, unlike torch), and parameters left unloaded are warned about.
        key: the container key holding the state dict (needed for EMA weights).
        assign: passed to ``Module.load_state_dict(assign=)`` (torch >= 2.1).
        prefix: take the sub-module under this path out of a larger checkpoint (e.g.
            ``"backbone."``); checkpoint keys outside it are ignored, not unexpected.

    Returns:
        A :class:`LoadReport`.

    Raises:
        CheckpointMismatchError: ``strict=True`` and the keys or shapes differ (``.report``);
            the message starts with the one ``Module.load_state_dict`` raises.
        CheckpointError: no or several state dicts in the container, ambiguous key mapping,
            or a file problem (see :func:`load`).

    Warns:
        CheckpointWarning: ``strict=False`` left parameters unloaded (missing or skipped for
            their shape); the message carries the report's summary and hint. Once per call
            site (Python's warning registry); buffers never warn.

    >>> import torch, safetorch as st
    >>> sd = torch.nn.DataParallel(torch.nn.Linear(2, 2)).state_dict()
    >>> report = st.load_state_dict(torch.nn.Linear(2, 2), sd)
    >>> report.ok, report.rule
    (True, "dropped wrapper segment(s) 'module.' from checkpoint keys")
    """
    if assign and not _assign_supported:
        raise TypeError(
            "assign=True needs torch >= 2.1 (Module.load_state_dict(assign=)); upgrade torch "
            "or leave assign unset"
        )
    if not isinstance(model, nn.Module):
        swapped = isinstance(source, nn.Module)
        raise TypeError(
            f"st.load_state_dict: model must be a torch.nn.Module, got {type(model).__name__}"
            + (
                "; the arguments look swapped: call st.load_state_dict(model, source)"
                if swapped
                else ""
            )
        )
    if isinstance(source, nn.Module):
        raise TypeError(
            "st.load_state_dict: source must be a path, a file object or a state dict, got a "
            f"{type(source).__name__} module; pass source.state_dict() to copy a module's weights"
        )
    # The pipeline (docs/design.md), each stage once and in order: resolve -> a layout (one
    # file, a directory, a shard index, a DCP checkpoint); open its files; read and check its
    # meta view (shapes and dtypes, no data); match keys; apply the matched tensors (read from
    # the open files); report.
    if not _is_path(source):
        obj = source if isinstance(source, Mapping) else load_for_copy(source)
        return _load_state_dict(model, obj, key, strict, assign, prefix, None, None)
    layout = _resolve.resolve(source)
    plain_file = isinstance(layout, _layouts.FileLayout) and not layout.picked
    picked = None if plain_file else f"{layout.description} ({layout.kind})"
    logger.info("loading %s (%s)", layout.description, layout.kind)
    layout.open(assign)
    try:
        return _load_state_dict(
            model, layout.meta_view(), key, strict, assign, prefix, layout, picked
        )
    finally:
        layout.close()


def _load_state_dict(
    model: nn.Module,
    obj: Any,
    key: Optional[str],
    strict: bool,
    assign: Optional[bool],
    prefix: Optional[str],
    layout: Optional[_layouts.Layout],
    picked: Optional[str],
) -> LoadReport:
    base = ""
    if isinstance(obj, Mapping) and obj.get("__safetorch__") == STATE_FORMAT:
        obj, base = obj["objects"], "objects."  # a st.save_state file: the models' state dicts
    state_dict, source_key = find_state_dict(obj, key)
    full = base + (f"{source_key}." if source_key else "")  # a source key's path in the view
    target = model.state_dict(keep_vars=True)
    read = None
    if layout is not None:
        read = lambda k: layout.read([full + k])[full + k]  # noqa: E731 - one use, below
    state_dict, n_averaged = _split_n_averaged(state_dict, target.keys(), read)
    # Plain weights into an AveragedModel: its counter keeps its value rather than being missing.
    source_has_counter = any(canonical_key(k) == N_AVERAGED for k in state_dict)
    target_keys = [k for k in target if source_has_counter or canonical_key(k) != N_AVERAGED]
    # A mapping (not only the keys) gives the matcher shapes to settle colliding keys with.
    # Keys an older torch wrote are offered as optional names, matched through the same
    # wrappers and prefixes, then dropped, renamed or left unexpected by their rule.
    candidates = legacy_keys(model)
    optional = legacy_optional_targets(candidates, target)
    remapped, match = _remap_state_dict(
        state_dict, {k: target[k] for k in target_keys}, prefix=prefix, optional=optional
    )
    legacy = settle_legacy(
        match, candidates, optional, getattr(remapped, "_metadata", None), list(state_dict)
    )
    rule = match.rule
    if legacy.renamed:
        renamed = ", ".join(f"{s!r} -> {t!r}" for s, t in list(legacy.renamed.items())[:4])
        more = len(legacy.renamed) - 4
        rule = ("" if rule == "exact" else f"{rule}; ") + (
            f"renamed keys of an older torch: {renamed}"
            + (f" (and {more} more)" if more > 0 else "")
        )

    mismatched: List[Tuple[str, Any, Any]] = []
    to_load: "collections.OrderedDict[str, Any]" = collections.OrderedDict()
    source_of = {t: s for s, t in match.mapping.items()}
    for tgt_key in target_keys:  # model order, so the report reads like the model
        if tgt_key not in source_of:
            continue
        value = state_dict[source_of[tgt_key]]
        if _shape_mismatch(value, target[tgt_key]):
            mismatched.append((tgt_key, tensor_shape(value), tensor_shape(target[tgt_key])))
        else:
            to_load[tgt_key] = value
    meta = getattr(remapped, "_metadata", None)
    if meta is not None:
        to_load._metadata = meta  # type: ignore[attr-defined]  # state dicts carry torch's _metadata attribute (an OrderedDict subclass attr)
    fields: Dict[str, Any] = dict(  # the report's, built once the load is done (or refused)
        loaded=list(to_load),
        missing=list(match.unmatched_target),
        unexpected=list(match.unmatched_source),
        mismatched=mismatched,
        rule=rule,
        source_key=source_key,
        n_averaged=n_averaged,
        strict=strict,
        hint=match.hint,
        other_state_dicts=[k for k in state_dict_keys(obj) if k != source_key],
        source=picked,
        dropped=legacy.dropped,
        defaulted=legacy.defaulted,
        legacy=legacy.notes,
    )
    if strict and (fields["missing"] or fields["unexpected"] or mismatched):
        report = LoadReport(**fields)  # the report stage, straight after matching: refused
        report.refused = True
        raise _mismatch_error(
            model, report, "nothing was loaded; pass strict=False to load the matching keys"
        )
    if layout is not None:
        result = _load_from_layout(model, layout, to_load, source_of, full, assign, target)
    else:
        kwargs = {} if assign is None else {"assign": assign}
        result = _module_load_state_dict(model, to_load, strict=False, **kwargs)
    report = LoadReport(**fields)
    # torch is the final word: a load hook may have consumed or rejected keys.
    kept = set(target) - set(target_keys)  # AveragedModel's counter, kept on purpose
    skipped = {k for k, _, _ in mismatched}
    torch_missing = (
        set(result.missing_keys) - set(report.missing) - kept - skipped - set(report.defaulted)
    )
    if torch_missing:
        report.missing.extend(k for k in result.missing_keys if k in torch_missing)
        report.loaded = [k for k in report.loaded if k not in torch_missing]
    report.unexpected.extend(k for k in result.unexpected_keys if k not in report.unexpected)
    return _finish(model, report)


def _finish(model: nn.Module, report: LoadReport) -> LoadReport:
    """Raise what a strict load's hooks left unmatched; warn when strict=False left parameters
    unloaded (nobody reads a return value that a strict=False call usually discards)."""
    if report.strict and not report.ok:
        raise _mismatch_error(model, report, "load hooks reported mismatches")
    logger.debug("%s", report)
    if not report.strict:
        _warn_unloaded_parameters(model, report)
    return report


def _mismatch_error(model: nn.Module, report: LoadReport, what: str) -> CheckpointMismatchError:
    """torch's own message first (code that matches it keeps working), then safetorch's."""
    return CheckpointMismatchError(
        f"{report.torch_error(type(model).__name__)}\nsafetorch: {what}.\n{report}", report
    )


def _warn_unloaded_parameters(model: nn.Module, report: LoadReport) -> None:
    # Parameters only: torch itself lets buffers go missing (num_batches_tracked of old
    # checkpoints, which the report lists as defaulted). Python's warning registry shows one
    # warning text once per call site.
    if not report.missing and not report.mismatched:
        return
    sd = model.state_dict(keep_vars=True)  # every path of a shared parameter, as the report
    params = {k for k, v in sd.items() if isinstance(v, nn.Parameter)}
    unloaded = [k for k in report.missing if k in params]
    unloaded += [k for k, _, _ in report.mismatched if k in params]
    if not unloaded:
        return
    text = ", ".join(group_keys(unloaded[:8])) + (" ..." if len(unloaded) > 8 else "")
    warnings.warn(
        f"load_state_dict(strict=False) left {len(unloaded)} of {len(params)} parameters of "
        f"{type(model).__name__} unloaded ({text}): {report.summary()}"
        + (f"; hint: {report.hint}" if report.hint else "")
        + ". The returned report says what was loaded; pass strict=True to refuse instead",
        CheckpointWarning,
        stacklevel=user_stacklevel(),
    )


def _load_from_layout(
    model: nn.Module,
    layout: _layouts.Layout,
    to_load: Mapping[str, Any],
    source_of: Mapping[str, str],
    full: str,
    assign: Optional[bool],
    targets: Dict[str, Any],
) -> Any:
    """Read the matched tensors of a layout into the model (the apply stage); what torch
    reported over all batches (as one ``Module.load_state_dict`` call would)."""
    pairs = [(tgt, full + source_of[tgt]) for tgt in to_load]
    dest = Destination(model, to_load, assign, getattr(to_load, "_metadata", None), targets)
    layout.load_into(pairs, dest)
    return dest.result()
