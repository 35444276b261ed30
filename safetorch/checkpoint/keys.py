"""Wrapper-aware state-dict keys: canonical names, matching, remapping, unwrapping.

Wrappers put a segment into every key of the module they wrap: DataParallel, DDP and
AveragedModel add ``module.``, ``torch.compile`` adds ``_orig_mod.``, FSDP adds
``_fsdp_wrapped_module.`` and activation checkpointing ``_checkpoint_wrapped_module.``. Such a
segment can sit anywhere in a key (``model._orig_mod.layer.weight`` when a Lightning module
compiled its submodule) and wrappers nest in any order. The *canonical* key drops every such
segment. Matching a checkpoint to a model compares canonical keys on both sides, and may also
strip one common leading prefix (a Lightning attribute such as ``model.``) from either side;
an ambiguous mapping is refused, never guessed.
"""

from __future__ import annotations

import collections
import functools
from dataclasses import dataclass, field
from typing import (
    Any,
    Callable,
    Dict,
    Iterable,
    List,
    Mapping,
    MutableMapping,
    Optional,
    Sequence,
    Tuple,
    Union,
)

import torch
from torch import nn

from safetorch.errors import CheckpointError

__all__ = [
    "WRAPPER_SEGMENTS",
    "canonical_key",
    "strip_wrapper_prefixes",
    "unwrap_model",
    "KeyMatch",
    "match_keys",
    "remap_state_dict",
]

#: Key segments that wrappers insert: DataParallel/DDP/AveragedModel, torch.compile, FSDP,
#: activation checkpointing (torch.distributed.algorithms._checkpoint.checkpoint_wrapper).
WRAPPER_SEGMENTS: Tuple[str, ...] = (
    "module",
    "_orig_mod",
    "_fsdp_wrapped_module",
    "_checkpoint_wrapped_module",
)
_WRAPPER_SET = frozenset(WRAPPER_SEGMENTS)

# Wrapper classes by name: importing torch._dynamo or FSDP just to run isinstance would cost
# seconds at import. Each holds the wrapped module in one of WRAPPER_SEGMENTS.
_WRAPPER_CLASS_NAMES = frozenset(
    {
        "DataParallel",
        "DistributedDataParallel",
        "AveragedModel",
        "OptimizedModule",
        "FullyShardedDataParallel",
        "CheckpointWrapper",
        "OffloadWrapper",
    }
)

# Module attributes that hold AveragedModel's counter; reported, never loaded into a plain model.
N_AVERAGED = "n_averaged"


def canonical_key(key: str) -> str:
    """The key with every wrapper segment removed, wherever it sits.

    Args:
        key: a state-dict key (or a module prefix).

    Returns:
        The key without ``module``, ``_orig_mod``, ``_fsdp_wrapped_module`` and
        ``_checkpoint_wrapped_module`` segments.

    >>> canonical_key("module._orig_mod.backbone.conv1.weight")
    'backbone.conv1.weight'
    >>> canonical_key("model._orig_mod.layer.weight")
    'model.layer.weight'
    """
    if not any(seg in key for seg in WRAPPER_SEGMENTS):  # fast path: nothing to drop
        return key
    return ".".join(s for s in key.split(".") if s not in _WRAPPER_SET)


def _wrapper_segments_in(keys: Iterable[str]) -> List[str]:
    seen: Dict[str, None] = {}
    for k in keys:
        for seg in k.split("."):
            if seg in _WRAPPER_SET:
                seen[seg] = None
    return list(seen)


def _copy_metadata(source: Any, target: MutableMapping[str, Any], rename: Callable) -> None:
    meta = getattr(source, "_metadata", None)
    if meta is None:
        return
    new_meta: "collections.OrderedDict[str, Any]" = collections.OrderedDict()
    for prefix, value in meta.items():
        new_prefix = rename(prefix)
        if new_prefix is not None and new_prefix not in new_meta:
            new_meta[new_prefix] = value
    target._metadata = new_meta  # type: ignore[attr-defined]


def strip_wrapper_prefixes(state_dict: Mapping[str, Any]) -> "collections.OrderedDict[str, Any]":
    """A new state dict whose keys are canonical (no wrapper segments); values are not copied.

    Args:
        state_dict: a state dict, e.g. from a DataParallel or compiled model.

    Returns:
        An OrderedDict with canonical keys and the same tensor objects (``_metadata`` kept).

    Raises:
        CheckpointError: two keys become the same canonical key (the error lists them).

    >>> import torch
    >>> sd = {"module._orig_mod.fc.weight": torch.zeros(2, 2)}
    >>> list(strip_wrapper_prefixes(sd))
    ['fc.weight']
    """
    out: "collections.OrderedDict[str, Any]" = collections.OrderedDict()
    origin: Dict[str, str] = {}
    collisions: List[str] = []
    for key, value in state_dict.items():
        new = canonical_key(key)
        if new in out:
            collisions.append(f"{origin[new]!r} and {key!r} -> {new!r}")
            continue
        out[new] = value
        origin[new] = key
    if collisions:
        raise CheckpointError(
            "stripping wrapper segments makes keys collide: "
            + "; ".join(collisions)
            + ". The state dict mixes wrapped and unwrapped copies of the same weights; "
            "select the keys you want before loading."
        )
    _copy_metadata(state_dict, out, canonical_key)
    return out


def unwrap_model(model: nn.Module) -> nn.Module:
    """The innermost user module inside DataParallel/DDP/compile/AveragedModel/FSDP wrappers.

    Args:
        model: a module, possibly wrapped several times in any order.

    Returns:
        The wrapped user module (``model`` itself when it is not a wrapper).

    >>> import torch
    >>> net = torch.nn.Linear(2, 2)
    >>> unwrap_model(torch.nn.DataParallel(torch.nn.DataParallel(net))) is net
    True
    """
    seen = 0
    while seen < 64:  # guards against a cyclic wrapper chain
        seen += 1
        if type(model).__name__ not in _WRAPPER_CLASS_NAMES and not isinstance(
            model, (nn.DataParallel, nn.parallel.DistributedDataParallel)
        ):
            return model
        for attr in ("_orig_mod", "_fsdp_wrapped_module", "_checkpoint_wrapped_module", "module"):
            inner = model._modules.get(attr)
            if isinstance(inner, nn.Module):
                model = inner
                break
        else:
            return model
    return model


@dataclass
class KeyMatch:
    """How checkpoint keys map onto model keys (the result of :func:`match_keys`).

    Attributes:
        mapping: checkpoint key -> model key, for every matched key.
        unmatched_source: checkpoint keys that match nothing.
        unmatched_target: model keys no checkpoint key maps to.
        rule: human-readable description of the renaming applied (``"exact"`` when none).

    >>> from safetorch import match_keys
    >>> m = match_keys(["module.fc.weight", "extra"], ["fc.weight", "fc.bias"])
    >>> m.mapping, m.unmatched_source, m.unmatched_target
    ({'module.fc.weight': 'fc.weight'}, ['extra'], ['fc.bias'])
    >>> m.rule
    "dropped wrapper segment(s) 'module.' from checkpoint keys"
    """

    mapping: Dict[str, str]
    unmatched_source: List[str] = field(default_factory=list)
    unmatched_target: List[str] = field(default_factory=list)
    rule: str = "exact"


def _strip_leading(key: str, prefix: str) -> str:
    """``prefix`` ends with '.'; also maps the module prefix itself (``"model"``) to ``""``."""
    if key.startswith(prefix):
        return key[len(prefix) :]
    if key == prefix[:-1]:
        return ""
    return key


def _canonical_without(key: str, prefix: str) -> str:
    return _strip_leading(canonical_key(key), prefix)


def _leading_prefixes(keys: Iterable[str], limit: int = 24) -> List[str]:
    counts: Dict[str, int] = collections.Counter()
    for k in keys:
        parts = k.split(".")
        for depth in (1, 2):
            if len(parts) > depth:
                counts[".".join(parts[:depth]) + "."] += 1
    return [p for p, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:limit]]


_Transform = Tuple[Callable[[str], str], Callable[[str], str], str]


def _group(keys: Sequence[str], fn: Callable[[str], str]) -> Dict[str, List[str]]:
    groups: Dict[str, List[str]] = collections.defaultdict(list)
    for k in keys:
        groups[fn(k)].append(k)
    return groups


def _score(src: Sequence[str], tgt: Sequence[str], transform: _Transform) -> Tuple[int, Any, Any]:
    s_fn, t_fn, _ = transform
    sg, tg = _group(src, s_fn), _group(tgt, t_fn)
    common = sg.keys() & tg.keys()
    return sum(min(len(sg[c]), len(tg[c])) for c in common), sg, tg


def match_keys(source_keys: Iterable[str], target_keys: Iterable[str]) -> KeyMatch:
    """Map checkpoint keys to model keys through wrapper segments and one leading prefix.

    Exact matches win. The remaining keys are compared canonically (wrapper segments dropped
    on both sides), optionally after stripping one common leading prefix (``model.``,
    ``net.backbone.``) from the checkpoint side or the model side -- whichever matches most keys.

    Args:
        source_keys: keys of the checkpoint's state dict.
        target_keys: keys of the model's ``state_dict()``.

    Returns:
        A :class:`KeyMatch` with the mapping, the unmatched keys on each side and the rule.

    Raises:
        CheckpointError: two keys map onto the same key (the error lists the collision).

    >>> m = match_keys(["module.fc.weight", "module.fc.bias"], ["fc.weight", "fc.bias"])
    >>> m.mapping["module.fc.weight"], m.rule
    ('fc.weight', "dropped wrapper segment(s) 'module.' from checkpoint keys")
    """
    src = list(source_keys)
    tgt = list(target_keys)
    tgt_set = set(tgt)
    mapping = {k: k for k in src if k in tgt_set}
    rest_src = [k for k in src if k not in mapping]
    taken = set(mapping.values())
    rest_tgt = [k for k in tgt if k not in taken]
    if not rest_src or not rest_tgt:
        return KeyMatch(mapping, rest_src, rest_tgt, "exact")

    canon_src = [canonical_key(k) for k in rest_src]
    canon_tgt = [canonical_key(k) for k in rest_tgt]
    transforms: List[_Transform] = [(canonical_key, canonical_key, "")]
    for p in _leading_prefixes(canon_src):
        transforms.append(
            (
                functools.partial(_canonical_without, prefix=p),
                canonical_key,
                f"stripped leading {p!r} from checkpoint keys",
            )
        )
    for q in _leading_prefixes(canon_tgt):
        transforms.append(
            (
                canonical_key,
                functools.partial(_canonical_without, prefix=q),
                f"stripped leading {q!r} from model keys",
            )
        )
    best_score, best_sg, best_tg, best = -1, None, None, transforms[0]
    for transform in transforms:
        score, sg, tg = _score(rest_src, rest_tgt, transform)
        if score > best_score:  # ties keep the earlier (simpler) transform
            best_score, best_sg, best_tg, best = score, sg, tg, transform
    assert best_sg is not None and best_tg is not None
    if best_score == 0:
        return KeyMatch(mapping, rest_src, rest_tgt, "exact")

    collisions: List[str] = []
    for canon in best_sg.keys() & best_tg.keys():
        s_keys, t_keys = best_sg[canon], best_tg[canon]
        if len(s_keys) == 1 and len(t_keys) == 1:
            mapping[s_keys[0]] = t_keys[0]
        else:
            collisions.append(f"checkpoint {s_keys} vs model {t_keys} (both -> {canon!r})")
    if collisions:
        raise CheckpointError(
            "ambiguous key mapping between checkpoint and model: "
            + "; ".join(sorted(collisions)[:10])
            + (f" (and {len(collisions) - 10} more)" if len(collisions) > 10 else "")
            + ". Remove the duplicate entries, or rename the keys yourself and pass the "
            "state dict to st.load_state_dict."
        )
    matched_src = [k for k in rest_src if k in mapping]
    matched_tgt = set(mapping[k] for k in matched_src)
    parts: List[str] = []
    seg_src = _wrapper_segments_in(matched_src)
    seg_tgt = _wrapper_segments_in(matched_tgt)
    if seg_src:
        parts.append(
            "dropped wrapper segment(s) "
            + ", ".join(repr(s + ".") for s in seg_src)
            + " from checkpoint keys"
        )
    if seg_tgt:
        parts.append(
            "dropped wrapper segment(s) "
            + ", ".join(repr(s + ".") for s in seg_tgt)
            + " from model keys"
        )
    if best[2]:
        parts.append(best[2])
    return KeyMatch(
        mapping,
        [k for k in rest_src if k not in mapping],
        [k for k in rest_tgt if k not in matched_tgt],
        "; ".join(parts) or "exact",
    )


def _target_keys(target: Union[nn.Module, Iterable[str]]) -> List[str]:
    if isinstance(target, nn.Module):
        return list(target.state_dict(keep_vars=True).keys())
    return list(target)


def remap_state_dict(
    state_dict: Mapping[str, Any], target: Union[nn.Module, Iterable[str]]
) -> Tuple["collections.OrderedDict[str, Any]", KeyMatch]:
    """Rename a state dict's keys to the keys ``target`` expects; tensors are not copied.

    This is the key logic behind :func:`safetorch.load_state_dict`, public so that monkeypatch
    mode (or your own code) can fix the keys before calling ``Module.load_state_dict``.
    Unmatched checkpoint keys are kept under their original names, so torch still reports
    them as unexpected.

    Args:
        state_dict: the checkpoint's state dict.
        target: the model, or the keys of its ``state_dict()``.

    Returns:
        ``(renamed_state_dict, key_match)``; ``key_match.rule`` describes the renaming.

    Raises:
        CheckpointError: the mapping is ambiguous (the error lists the collision).

    >>> import torch
    >>> model = torch.nn.Linear(2, 2)
    >>> sd = torch.nn.DataParallel(torch.nn.Linear(2, 2)).state_dict()
    >>> new_sd, match = remap_state_dict(sd, model)
    >>> sorted(new_sd), match.rule
    (['bias', 'weight'], "dropped wrapper segment(s) 'module.' from checkpoint keys")
    >>> model.load_state_dict(new_sd)
    <All keys matched successfully>
    """
    tgt = _target_keys(target)
    match = match_keys(state_dict.keys(), tgt)
    out: "collections.OrderedDict[str, Any]" = collections.OrderedDict()
    for key, value in state_dict.items():
        out[match.mapping.get(key, key)] = value
    meta = getattr(state_dict, "_metadata", None)
    if meta is not None:
        prefixes = {""}
        for k in tgt:
            parts = k.split(".")
            for i in range(1, len(parts)):
                prefixes.add(".".join(parts[:i]))

        # Module prefixes follow the parameter renaming: rename "<prefix>.\0" like a key.
        def encode(prefix: str) -> str:
            return f"{prefix}.\0" if prefix else "\0"

        try:
            renamed = match_keys([encode(p) for p in meta], [encode(p) for p in prefixes])
        except CheckpointError:  # ambiguous module prefixes: keep no version metadata
            renamed = KeyMatch({})

        def rename(prefix: str) -> Optional[str]:
            new = renamed.mapping.get(encode(prefix))
            return None if new is None else new[:-1].rstrip(".")

        _copy_metadata(state_dict, out, rename)
    return out, match


def tensor_shape(value: Any) -> Optional[Tuple[int, ...]]:
    """Shape of a tensor value, or None for non-tensor entries (``_extra_state``)."""
    return tuple(value.shape) if isinstance(value, torch.Tensor) else None


# --- finding the state dict inside a checkpoint container -----------------------------------
def is_state_dict(obj: Any) -> bool:
    """True for a non-empty mapping of str keys to tensors (``*_extra_state`` may be anything)."""
    if not isinstance(obj, Mapping) or not obj:
        return False
    has_tensor = False
    for k, v in obj.items():
        if not isinstance(k, str):
            return False
        if isinstance(v, torch.Tensor):
            has_tensor = True
        elif not k.endswith("_extra_state"):
            return False
    return has_tensor


def _is_ema_key(key: str) -> bool:
    return "ema" in key.lower().replace("-", "_").replace(".", "_").split("_")


def find_state_dict(obj: Any, key: Optional[str] = None) -> Tuple[Mapping[str, Any], Optional[str]]:
    """The state dict inside a checkpoint and the container key it came from.

    Args:
        obj: a state dict, a checkpoint dict (``{"state_dict": ..., "epoch": ...}``) or a module.
        key: the container key to use; required for EMA entries (``state_dict_ema``,
            ``model_ema``) and for containers holding several state dicts.

    Returns:
        ``(state_dict, key)``; ``key`` is ``None`` when ``obj`` itself is the state dict.

    Raises:
        CheckpointError: ``key`` is absent, or no / several state dicts are found (the error
            lists the candidates).

    >>> import torch
    >>> sd = torch.nn.Linear(1, 1).state_dict()
    >>> find_state_dict({"epoch": 3, "state_dict": sd, "state_dict_ema": sd})[1]
    'state_dict'
    """
    if key is not None:
        if not isinstance(obj, Mapping) or key not in obj:
            available = sorted(map(str, obj)) if isinstance(obj, Mapping) else type(obj).__name__
            raise CheckpointError(
                f"key={key!r} is not in the checkpoint; its top-level keys are {available}"
            )
        value = obj[key]
        if isinstance(value, nn.Module):
            return value.state_dict(), key
        if not is_state_dict(value):
            raise CheckpointError(
                f"checkpoint[{key!r}] is a {type(value).__name__}, not a state dict "
                "(a mapping of str keys to tensors)"
            )
        return value, key
    if isinstance(obj, nn.Module):
        return obj.state_dict(), None
    if is_state_dict(obj):
        return obj, None
    if not isinstance(obj, Mapping):
        raise CheckpointError(
            f"the checkpoint holds a {type(obj).__name__}, not a state dict or a dict containing "
            "one; save model.state_dict() (or a dict with it under 'state_dict')"
        )
    found = [k for k, v in obj.items() if isinstance(k, str) and is_state_dict(v)]
    plain = [k for k in found if not _is_ema_key(k)]
    if len(plain) == 1:
        return obj[plain[0]], plain[0]
    if len(plain) > 1:
        raise CheckpointError(
            f"the checkpoint holds several state dicts: {plain}; pick one with key=, "
            f"e.g. st.load_state_dict(model, path, key={plain[0]!r})"
        )
    if found:
        raise CheckpointError(
            f"the checkpoint holds only EMA state dicts {found}; EMA weights are loaded only on "
            f"request: st.load_state_dict(model, path, key={found[0]!r})"
        )
    raise CheckpointError(
        "no state dict found in the checkpoint; its top-level keys are "
        f"{sorted(map(str, obj))[:20]} and none maps str keys to tensors"
    )
