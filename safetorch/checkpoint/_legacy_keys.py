"""Keys that older torch releases wrote and torch's own modules still accept.

torch keeps loading checkpoints of its older releases inside the modules' own
``_load_from_state_dict`` overrides and load pre-hooks, keyed on the version each module wrote
into ``state_dict._metadata``. ``st.load_state_dict`` matches keys before any of that runs
(:mod:`.keys`), so it knows those keys itself: :func:`legacy_keys` lists the ones a model
accepts, :func:`settle_legacy` decides, after matching, which were dropped, renamed or
defaulted.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple

from torch import nn

from safetorch.checkpoint.keys import KeyMatch

__all__: List[str] = []  # private module: the legacy-key stage of st.load_state_dict


# --- keys of older torch releases -------------------------------------------------------------
# torch keeps loading checkpoints of its older releases inside the modules' own
# ``_load_from_state_dict`` overrides and load pre-hooks, keyed on the version each module wrote
# into ``state_dict._metadata``. st.load_state_dict matches keys before any of that runs, so it
# has to know those keys itself: each rule below names one, the release that changed it and
# what torch does with it. Only these exact keys are tolerated, and only in the form the older
# release wrote (version, companions); anything else stays unexpected or missing.


def _unversioned(version: Optional[int]) -> bool:
    return version is None


def _before_2(version: Optional[int]) -> bool:
    return version is None or version < 2


def _at_most_1(version: Optional[int]) -> bool:
    return version is None or version <= 1


def _any_version(version: Optional[int]) -> bool:
    return True


@dataclass(frozen=True)
class LegacyKey:
    """A key in the form an older torch release wrote it, for one module of the model.

    Attributes:
        key: the key in model space (the module's prefix + the old name).
        action: ``"drop"``: old checkpoints have it and the module has no place for it;
            ``"rename"``: it loads into ``target``; ``"default"``: the model key ``key`` is
            absent from old checkpoints and torch's loader supplies its value.
        module: the module's prefix, whose ``_metadata`` entry holds the version it wrote.
        versions: whether a module version (``None``: no metadata) is one that wrote this form.
        note: which module and release, for the report.
        target: for ``"rename"``: the model key that receives the value.
        together: keys that all had to be written for the old form to be recognised.
        absent: keys the old release never wrote: their presence means another form.
    """

    key: str
    action: str
    module: str
    versions: Callable[[Optional[int]], bool]
    note: str
    target: Optional[str] = None
    together: Tuple[str, ...] = ()
    absent: Tuple[str, ...] = ()


def _instancenorm_running_stats(p: str, m: nn.Module) -> Iterable[LegacyKey]:
    # Before torch 0.4.0 InstanceNorm was a _BatchNorm and saved running_mean/running_var;
    # since 0.4.0 (module version 1) it has them only with track_running_stats=True. torch's
    # _InstanceNorm._load_from_state_dict removes them from a checkpoint without version
    # metadata and then refuses the load ("Unexpected running stats buffer(s) ... Please remove
    # these keys from state_dict"), strict or not. num_batches_tracked (torch 0.4.1) was never
    # written by those releases: with it the checkpoint is of a module that tracked its stats.
    if not isinstance(m, nn.modules.instancenorm._InstanceNorm) or m.track_running_stats:
        return
    stats = (p + "running_mean", p + "running_var")
    note = (
        f"{type(m).__name__} {p[:-1] or '<root>'!r} has track_running_stats=False: its "
        "running_mean/running_var are from a checkpoint of torch < 0.4.0 (no version "
        "metadata); dropped, as torch's own error asks"
    )
    for key in stats:
        yield LegacyKey(
            key,
            "drop",
            p[:-1],
            _unversioned,
            note,
            together=stats,
            absent=(p + "num_batches_tracked",),
        )


def _norm_num_batches_tracked(p: str, m: nn.Module) -> Iterable[LegacyKey]:
    # num_batches_tracked appeared in torch 0.4.1 (_NormBase version 2);
    # _NormBase._load_from_state_dict keeps the module's own value when a checkpoint of an
    # earlier version, or without version metadata, lacks it.
    if (
        isinstance(m, nn.modules.batchnorm._NormBase)
        and m.track_running_stats
        and m._buffers.get("num_batches_tracked") is not None
    ):
        yield LegacyKey(
            p + "num_batches_tracked",
            "default",
            p[:-1],
            _before_2,
            f"{type(m).__name__} {p[:-1] or '<root>'!r}: num_batches_tracked is absent from "
            "checkpoints of torch < 0.4.1 (version < 2 or no version metadata); the model's "
            "value is kept, as torch keeps it",
        )


def _has_load_pre_hook(m: nn.Module, name: str) -> bool:
    hooks = getattr(m, "_load_state_dict_pre_hooks", None) or {}
    # torch keeps the function (or a _WrappedHook that copies its __name__).
    return any(getattr(h, "__name__", None) == name for h in hooks.values())


def _weight_norm_g_v(p: str, m: nn.Module) -> Iterable[LegacyKey]:
    # torch.nn.utils.parametrizations.weight_norm (torch 2.1) registers a load pre-hook
    # (_weight_norm_compat_hook) that loads the keys of the older torch.nn.utils.weight_norm,
    # <name>_g and <name>_v (both), into parametrizations.<name>.original0/original1.
    plists = m._modules.get("parametrizations")  # no getattr: Module.__getattr__ raises
    if not isinstance(plists, nn.ModuleDict) or not _has_load_pre_hook(
        m, "_weight_norm_compat_hook"
    ):
        return
    for name, plist in plists.items():
        if not isinstance(plist, nn.ModuleList) or not len(plist):
            continue
        if type(plist[0]).__name__ != "_WeightNorm":
            continue
        g, v = f"{p}{name}_g", f"{p}{name}_v"
        note = (
            f"{p[:-1] or '<root>'!r}: {name}_g/{name}_v of torch.nn.utils.weight_norm loaded "
            f"into the parametrization (parametrizations.{name}.original0/original1), as "
            "torch's weight_norm load hook does"
        )
        for old, new in ((g, "original0"), (v, "original1")):
            yield LegacyKey(
                old,
                "rename",
                p[:-1],
                _any_version,
                note,
                target=f"{p}parametrizations.{name}.{new}",
                together=(g, v),
            )


def _qat_conv_bn_v1(p: str, m: nn.Module) -> Iterable[LegacyKey]:
    # QAT ConvBn*d version 2 (torch 1.6) moved gamma, beta and the running stats into the
    # ``bn`` submodule; _ConvBnNd._load_from_state_dict moves them there for version 1 or none.
    # Looked up only where the model uses it: importing torch.ao costs time.
    conv_fused = sys.modules.get("torch.ao.nn.intrinsic.qat.modules.conv_fused")
    cls = getattr(conv_fused, "_ConvBnNd", None)
    if cls is None or not isinstance(m, cls):
        return
    note = (
        f"{type(m).__name__} {p[:-1] or '<root>'!r}: gamma/beta/running stats of a version-1 "
        "QAT ConvBn checkpoint loaded into its bn submodule, as torch does"
    )
    for old, new in (
        ("gamma", "bn.weight"),
        ("beta", "bn.bias"),
        ("running_mean", "bn.running_mean"),
        ("running_var", "bn.running_var"),
        ("num_batches_tracked", "bn.num_batches_tracked"),
    ):
        yield LegacyKey(p + old, "rename", p[:-1], _at_most_1, note, target=p + new)


def _observer_eps(p: str, m: nn.Module) -> Iterable[LegacyKey]:
    # Observers' eps became a buffer at observer version 2;
    # UniformQuantizationObserverBase._load_from_state_dict sets float32's eps for version 1
    # or none.
    observer = sys.modules.get("torch.ao.quantization.observer")
    cls = getattr(observer, "UniformQuantizationObserverBase", None)
    if cls is None or not isinstance(m, cls) or m._buffers.get("eps") is None:
        return
    yield LegacyKey(
        p + "eps",
        "default",
        p[:-1],
        _at_most_1,
        f"{type(m).__name__} {p[:-1] or '<root>'!r}: eps is absent from observer checkpoints "
        "of version 1; torch's loader sets float32's eps",
    )


_LEGACY_RULES: Tuple[Callable[[str, nn.Module], Iterable[LegacyKey]], ...] = (
    _instancenorm_running_stats,
    _norm_num_batches_tracked,
    _weight_norm_g_v,
    _qat_conv_bn_v1,
    _observer_eps,
)


def legacy_keys(model: nn.Module) -> List[LegacyKey]:
    """The keys older torch releases wrote differently for the modules of ``model``.

    Args:
        model: the target model (wrapped or not).

    Returns:
        One :class:`LegacyKey` per old key (model-space names, every path of a shared module).

    >>> import torch
    >>> [(k.key, k.action) for k in legacy_keys(torch.nn.InstanceNorm1d(2))]
    [('running_mean', 'drop'), ('running_var', 'drop')]
    """
    out: List[LegacyKey] = []
    for name, module in model.named_modules(remove_duplicate=False):
        for rule in _LEGACY_RULES:
            out.extend(rule(f"{name}." if name else "", module))
    return out


def legacy_optional_targets(
    candidates: Iterable[LegacyKey], model_keys: Iterable[str]
) -> "frozenset[str]":
    """The model-space names a checkpoint key may match besides the model's own keys."""
    names: Set[str] = set()
    for c in candidates:
        if c.action != "default":
            names.add(c.key)
        names.update(c.absent)
    return frozenset(names.difference(model_keys))


@dataclass
class LegacySettlement:
    """What :func:`settle_legacy` decided (keys of older torch releases)."""

    dropped: List[str] = field(default_factory=list)  # checkpoint keys
    defaulted: List[str] = field(default_factory=list)  # model keys
    renamed: Dict[str, str] = field(default_factory=dict)  # checkpoint key -> model key
    notes: List[str] = field(default_factory=list)


def _module_version(metadata: Optional[Mapping[str, Any]], module: str) -> Optional[int]:
    # As Module.load_state_dict: local_metadata = metadata.get(prefix[:-1], {}).
    local = None if metadata is None else metadata.get(module)
    return local.get("version") if isinstance(local, Mapping) else None


def settle_legacy(
    match: KeyMatch,
    candidates: Sequence[LegacyKey],
    optional: "frozenset[str]",
    metadata: Optional[Mapping[str, Any]],
    source_order: Sequence[str],
) -> LegacySettlement:
    """Decide, in place on ``match``, the checkpoint keys matched to an old key's name.

    A key matched to a name from :func:`legacy_optional_targets` is dropped or renamed when its
    rule holds (the module's version in ``metadata``, its companions present, no key the old
    release never wrote), and is unexpected otherwise, as it would be without the rule. A model
    key an old checkpoint lacks is taken out of ``match.unmatched_target`` when its rule holds.

    Args:
        match: the result of matching with the optional names (changed in place).
        candidates: :func:`legacy_keys` of the model.
        optional: the names matching offered (:func:`legacy_optional_targets`).
        metadata: the checkpoint's ``_metadata`` renamed to the model's module prefixes.
        source_order: the checkpoint's keys, to keep unexpected keys in its order.

    Returns:
        A :class:`LegacySettlement`.
    """
    out = LegacySettlement()
    if not candidates:
        return out
    by_key = {c.key: c for c in candidates if c.action != "default"}
    source_of = {t: s for s, t in match.mapping.items()}
    unexpected = list(match.unmatched_source)
    notes: Dict[str, None] = {}
    for tgt_key, src_key in list(source_of.items()):
        if tgt_key not in optional:
            continue
        c = by_key.get(tgt_key)
        holds = (
            c is not None
            and c.versions(_module_version(metadata, c.module))
            and all(k in source_of for k in c.together)
            and not any(k in source_of for k in c.absent)
            and (
                c.action == "drop"
                or (c.target in match.unmatched_target and c.target not in source_of)
            )
        )
        del match.mapping[src_key]
        if not holds or c is None:
            unexpected.append(src_key)
            continue
        notes[c.note] = None
        if c.action == "drop":
            out.dropped.append(src_key)
        else:
            assert c.target is not None
            match.mapping[src_key] = c.target
            match.unmatched_target.remove(c.target)
            out.renamed[src_key] = c.target
    for c in candidates:
        if (
            c.action == "default"
            and c.key in match.unmatched_target
            and c.versions(_module_version(metadata, c.module))
        ):
            match.unmatched_target.remove(c.key)
            out.defaulted.append(c.key)
            notes[c.note] = None
    order = {k: i for i, k in enumerate(source_order)}
    match.unmatched_source = sorted(unexpected, key=lambda k: order.get(k, len(order)))
    out.dropped.sort(key=lambda k: order.get(k, len(order)))
    out.notes = list(notes)
    return out
