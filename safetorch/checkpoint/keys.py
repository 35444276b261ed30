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
import itertools
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
    "KNOWN_PREFIXES",
    "known_prefixes",
    "state_dict_keys",
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
    target._metadata = new_meta  # type: ignore[attr-defined]  # state dicts carry torch's _metadata attribute (an OrderedDict subclass attr)


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
        ignored: checkpoint keys outside ``prefix=`` (another part of the network; not loaded
            and not unexpected).
        hint: what to change when keys are left unmatched on both sides (``None``: nothing to
            suggest), e.g. ``"pass prefix='features.' ..."``.

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
    ignored: List[str] = field(default_factory=list)
    hint: Optional[str] = None


#: Leading prefixes that training frameworks put in front of a whole model's keys and that
#: matching strips by itself, from either side: PyTorch Lightning's ``self.model``. Any other
#: leading path (``features.``, ``0.``) is a real module path: taking a sub-module out of a
#: larger checkpoint needs an explicit ``prefix=``.
KNOWN_PREFIXES: Tuple[str, ...] = ("model.",)


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
        for depth in (1, 2, 3):
            if len(parts) > depth:
                counts[".".join(parts[:depth]) + "."] += 1
    return [p for p, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:limit]]


def known_prefixes(keys: Iterable[str]) -> List[str]:
    """Every wrapper segment and known leading prefix found in ``keys`` (``["module.", ...]``).

    >>> known_prefixes(["model._orig_mod.fc.weight", "model._orig_mod.fc.bias"])
    ['model.', '_orig_mod.']
    """
    keys = list(keys)
    found = [p for p in KNOWN_PREFIXES if any(canonical_key(k).startswith(p) for k in keys)]
    return found + [s + "." for s in _wrapper_segments_in(keys)]


_Transform = Tuple[Callable[[str], str], Callable[[str], str], str]
Shapes = Optional[Mapping[str, Optional[Tuple[int, ...]]]]


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


def _normalise_prefix(prefix: str) -> str:
    if not isinstance(prefix, str):
        raise TypeError(f"prefix must be a str such as 'features.', not {type(prefix).__name__}")
    prefix = canonical_key(prefix.strip(".")) if prefix.strip(".") else ""
    if not prefix:
        raise ValueError("prefix='' selects nothing; pass None to match the whole checkpoint")
    return prefix + "."


def _resolve_by_shape(
    canon: str, s_keys: List[str], t_keys: List[str], s_shapes: Shapes, t_shapes: Shapes
) -> Optional[Dict[str, str]]:
    """Pair colliding keys whose shapes identify them uniquely; None if shapes cannot."""
    if s_shapes is None or t_shapes is None:
        return None
    pairs: Dict[str, str] = {}
    for t in t_keys:
        shape = t_shapes.get(t)
        fits = [s for s in s_keys if shape is not None and s_shapes.get(s) == shape]
        if len(fits) != 1 or fits[0] in pairs:
            return None
        pairs[fits[0]] = t
    return pairs


def _shape_text(shapes: Shapes, key: str) -> str:
    shape = None if shapes is None else shapes.get(key)
    return "?" if shape is None else str(list(shape))


def _suggest(rest_src: Sequence[str], rest_tgt: Sequence[str]) -> Optional[str]:
    """A prefix that would match most of the keys left over on both sides."""
    if not rest_src or not rest_tgt:
        return None
    canon_tgt = {canonical_key(k) for k in rest_tgt}
    canon_src = {canonical_key(k) for k in rest_src}
    best: Tuple[int, str, str] = (0, "", "")
    for p in _leading_prefixes(canon_src):
        n = sum(1 for k in canon_src if k.startswith(p) and k[len(p) :] in canon_tgt)
        if n > best[0]:
            best = (n, p, "source")
    for q in _leading_prefixes(canon_tgt):
        n = sum(1 for k in canon_tgt if k.startswith(q) and k[len(q) :] in canon_src)
        if n > best[0]:
            best = (n, q, "target")
    n, p, side = best
    if n * 2 < min(len(canon_tgt), len(canon_src)) or n == 0:
        return None
    if side == "source":
        return (
            f"the model's keys are under {p!r} in the checkpoint ({n} keys): it holds a larger "
            f"network; to load that part pass prefix={p!r}"
        )
    return (
        f"the checkpoint matches the model's {p[:-1]!r} sub-module ({n} keys): load it into "
        f"that sub-module (model.{p[:-1]}) instead of the whole model"
    )


def match_keys(
    source_keys: Iterable[str],
    target_keys: Iterable[str],
    *,
    prefix: Optional[str] = None,
    source_shapes: Shapes = None,
    target_shapes: Shapes = None,
) -> KeyMatch:
    """Map checkpoint keys to model keys through wrapper segments and known prefixes.

    Exact matches win. The remaining keys are compared canonically (wrapper segments such as
    ``module.`` and ``_orig_mod.`` dropped anywhere, on both sides), optionally after stripping
    a known framework prefix (Lightning's ``model.``) from either side -- whichever matches
    most keys. A real module path (``features.``) is never stripped by itself: pass
    ``prefix="features."`` to take that sub-module out of a larger checkpoint (checkpoint keys
    outside it are ``ignored``). When several keys land on one name, shapes (if given) decide
    when they identify each key uniquely, and the rule says so; otherwise the mapping is
    refused.

    Args:
        source_keys: keys of the checkpoint's state dict.
        target_keys: keys of the model's ``state_dict()``.
        prefix: take only the checkpoint keys under this module path, with it removed.
        source_shapes: checkpoint key -> tensor shape (``None`` for non-tensors), optional.
        target_shapes: model key -> tensor shape, optional.

    Returns:
        A :class:`KeyMatch` with the mapping, the unmatched keys on each side, the rule, the
        keys ``prefix`` left out, and a hint when keys are left unmatched on both sides.

    Raises:
        CheckpointError: two keys map onto the same key and shapes cannot tell them apart
            (the error lists the collision), or ``prefix`` matches no checkpoint key.
        TypeError: ``prefix`` is not a str.

    >>> m = match_keys(["module.fc.weight", "module.fc.bias"], ["fc.weight", "fc.bias"])
    >>> m.mapping["module.fc.weight"], m.rule
    ('fc.weight', "dropped wrapper segment(s) 'module.' from checkpoint keys")
    >>> m = match_keys(["features.0.weight", "classifier.weight"], ["0.weight"],
    ...                prefix="features.")
    >>> m.mapping, m.ignored
    ({'features.0.weight': '0.weight'}, ['classifier.weight'])
    """
    return _match_keys(
        source_keys,
        target_keys,
        prefix=prefix,
        source_shapes=source_shapes,
        target_shapes=target_shapes,
        optional=frozenset(),
    )


def _match_keys(
    source_keys: Iterable[str],
    target_keys: Iterable[str],
    *,
    prefix: Optional[str],
    source_shapes: Shapes,
    target_shapes: Shapes,
    optional: "frozenset[str]",
) -> KeyMatch:
    """:func:`match_keys`, with ``optional`` target keys: matched like any target key (through
    the same wrapper segments and prefixes), never reported unmatched, never in a hint. The
    legacy-key step offers the keys an older torch wrote this way (:func:`legacy_keys`)."""
    real_tgt = list(target_keys)
    real_set = set(real_tgt)
    tgt = real_tgt + sorted(k for k in optional if k not in real_set)

    def done(
        mapping: Dict[str, str],
        left_src: List[str],
        left_tgt: List[str],
        rule: str,
        hint: bool = False,
    ) -> KeyMatch:
        left_tgt = [k for k in left_tgt if k in real_set]
        return KeyMatch(
            mapping, left_src, left_tgt, rule, hint=_suggest(left_src, left_tgt) if hint else None
        )

    src_all = list(source_keys)
    ignored: List[str] = []
    prefix_rule = ""
    if prefix is not None:
        p = _normalise_prefix(prefix)
        inside = [k for k in src_all if canonical_key(k).startswith(p)]
        if not inside:
            raise CheckpointError(
                f"prefix={prefix!r} matches no checkpoint key; its leading module paths are "
                f"{_leading_prefixes([canonical_key(k) for k in src_all], 8)}"
            )
        ignored = [k for k in src_all if not canonical_key(k).startswith(p)]
        prefix_rule = f"took checkpoint keys under {p!r} ({len(ignored)} other keys ignored)"
        # Rename the chosen keys first; everything below works on the renamed keys.
        renamed = {k: canonical_key(k)[len(p) :] for k in inside}
        sub = _match_keys(
            list(renamed.values()),
            real_tgt,
            prefix=None,
            source_shapes=None
            if source_shapes is None
            else {renamed[k]: source_shapes.get(k) for k in inside},
            target_shapes=target_shapes,
            optional=optional,
        )
        back = {v: k for k, v in renamed.items()}
        return KeyMatch(
            {back[s]: t for s, t in sub.mapping.items()},
            [back[s] for s in sub.unmatched_source],
            sub.unmatched_target,
            prefix_rule if sub.rule == "exact" else f"{prefix_rule}; {sub.rule}",
            ignored,
            sub.hint,
        )

    src = src_all
    tgt_set = set(tgt)

    def same_shape(k: str) -> bool:  # unknown shapes count as the same
        if source_shapes is None or target_shapes is None:
            return True
        a, b = source_shapes.get(k), target_shapes.get(k)
        return a is None or b is None or a == b

    # An exact name with the wrong shape competes with the other candidates below (a wrapped
    # copy of the right shape wins); alone, it still maps and is reported as a mismatch.
    mapping = {k: k for k in src if k in tgt_set and same_shape(k)}
    rest_src = [k for k in src if k not in mapping]
    taken = set(mapping.values())
    rest_tgt = [k for k in tgt if k not in taken]
    if not rest_src or not rest_tgt:
        return done(mapping, rest_src, rest_tgt, "exact")

    transforms: List[_Transform] = [(canonical_key, canonical_key, "")]
    for p in KNOWN_PREFIXES:
        transforms.append(
            (
                functools.partial(_canonical_without, prefix=p),
                canonical_key,
                f"stripped leading {p!r} from checkpoint keys",
            )
        )
        transforms.append(
            (
                canonical_key,
                functools.partial(_canonical_without, prefix=p),
                f"stripped leading {p!r} from model keys",
            )
        )
    best_score, best_sg, best_tg, best = -1, None, None, transforms[0]
    for transform in transforms:
        score, sg, tg = _score(rest_src, rest_tgt, transform)
        if score > best_score:  # ties keep the earlier (simpler) transform
            best_score, best_sg, best_tg, best = score, sg, tg, transform
    assert best_sg is not None and best_tg is not None
    if best_score == 0:
        return done(mapping, rest_src, rest_tgt, "exact", hint=True)

    collisions: List[str] = []
    by_shape: List[str] = []
    for canon in sorted(best_sg.keys() & best_tg.keys()):
        s_keys, t_keys = best_sg[canon], best_tg[canon]
        if len(s_keys) == 1 and len(t_keys) == 1:
            mapping[s_keys[0]] = t_keys[0]
            continue
        pairs = _resolve_by_shape(canon, s_keys, t_keys, source_shapes, target_shapes)
        if pairs is None:
            collisions.append(
                f"checkpoint {[f'{k} {_shape_text(source_shapes, k)}' for k in s_keys]} vs "
                f"model {[f'{k} {_shape_text(target_shapes, k)}' for k in t_keys]} "
                f"(all -> {canon!r})"
            )
            continue
        mapping.update(pairs)
        for s, t in pairs.items():
            left = [k for k in s_keys if k != s]
            by_shape.append(
                f"{s!r} -> {t!r} by shape {_shape_text(target_shapes, t)}"
                + (f" (not {', '.join(map(repr, left))})" if left else "")
            )
    if collisions:
        raise CheckpointError(
            "ambiguous key mapping between checkpoint and model, and shapes do not tell the "
            "keys apart: "
            + "; ".join(collisions[:10])
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
    if by_shape:
        parts.append("resolved colliding keys by shape: " + "; ".join(by_shape))
    left_src = [k for k in rest_src if k not in mapping]
    left_tgt = [k for k in rest_tgt if k not in matched_tgt]
    return done(mapping, left_src, left_tgt, "; ".join(parts) or "exact", hint=True)


def _target_keys(target: Union[nn.Module, Iterable[str]]) -> List[str]:
    if isinstance(target, nn.Module):
        return list(target.state_dict(keep_vars=True).keys())
    return list(target)


def _shapes_of(obj: Any) -> Shapes:
    if isinstance(obj, nn.Module):
        obj = obj.state_dict(keep_vars=True)
    if isinstance(obj, Mapping):
        return {k: tensor_shape(v) for k, v in obj.items()}
    return None


def remap_state_dict(
    state_dict: Mapping[str, Any],
    target: Union[nn.Module, Mapping[str, Any], Iterable[str]],
    *,
    prefix: Optional[str] = None,
) -> Tuple["collections.OrderedDict[str, Any]", KeyMatch]:
    """Rename a state dict's keys to the keys ``target`` expects; tensors are not copied.

    This is the key logic behind :func:`safetorch.load_state_dict`, public so that your own
    code can fix the keys before calling ``Module.load_state_dict``. Unmatched checkpoint keys
    are kept under their original names, so torch still reports them as unexpected; keys
    outside ``prefix`` are left out (``key_match.ignored``).

    Args:
        state_dict: the checkpoint's state dict.
        target: the model, its ``state_dict()`` (shapes then settle colliding keys), or the
            keys of its ``state_dict()``.
        prefix: take only the checkpoint keys under this module path (``"features."``), with
            it removed: a sub-module out of a larger checkpoint.

    Returns:
        ``(renamed_state_dict, key_match)``; ``key_match.rule`` describes the renaming.

    Raises:
        CheckpointError: the mapping is ambiguous (the error lists the collision).
        TypeError: ``state_dict`` is not a mapping, or ``target`` is not a module, a mapping
            or an iterable of keys.

    >>> import torch
    >>> model = torch.nn.Linear(2, 2)
    >>> sd = torch.nn.DataParallel(torch.nn.Linear(2, 2)).state_dict()
    >>> new_sd, match = remap_state_dict(sd, model)
    >>> sorted(new_sd), match.rule
    (['bias', 'weight'], "dropped wrapper segment(s) 'module.' from checkpoint keys")
    >>> model.load_state_dict(new_sd)
    <All keys matched successfully>
    """
    if not isinstance(state_dict, Mapping):
        raise TypeError(
            f"remap_state_dict(state_dict=...) expects a mapping of str keys to tensors, got "
            f"{type(state_dict).__name__}"
        )
    if isinstance(target, (str, bytes)) or not isinstance(target, (nn.Module, Iterable)):
        raise TypeError(
            f"remap_state_dict(target=...) expects an nn.Module, its state_dict() or its keys, "
            f"got {type(target).__name__}"
        )
    return _remap_state_dict(state_dict, target, prefix=prefix, optional=frozenset())


def _remap_state_dict(
    state_dict: Mapping[str, Any],
    target: Union[nn.Module, Mapping[str, Any], Iterable[str]],
    *,
    prefix: Optional[str],
    optional: "frozenset[str]",
) -> Tuple["collections.OrderedDict[str, Any]", KeyMatch]:
    """:func:`remap_state_dict` with ``optional`` target keys (see :func:`_match_keys`)."""
    tgt = _target_keys(target)
    match = _match_keys(
        state_dict.keys(),
        tgt,
        prefix=prefix,
        source_shapes=_shapes_of(state_dict),
        target_shapes=_shapes_of(target),
        optional=optional,
    )
    ignored = set(match.ignored)
    taken = set(match.mapping.values())
    out: "collections.OrderedDict[str, Any]" = collections.OrderedDict()
    for key, value in state_dict.items():
        if key in match.mapping:
            out[match.mapping[key]] = value
        elif key not in ignored and key not in taken:  # never overwrite a matched entry
            out[key] = value
    meta = getattr(state_dict, "_metadata", None)
    if meta is not None:
        prefixes = {""}
        for k in itertools.chain(tgt, optional):  # a legacy key's module may have no other key
            parts = k.split(".")
            for i in range(1, len(parts)):
                prefixes.add(".".join(parts[:i]))

        # Module prefixes follow the parameter renaming: rename "<prefix>.\0" like a key.
        def encode(module_prefix: str) -> str:
            return f"{module_prefix}.\0" if module_prefix else "\0"

        try:
            renamed = match_keys(
                [encode(p) for p in meta], [encode(p) for p in prefixes], prefix=prefix
            )
        except CheckpointError:  # ambiguous module prefixes: keep no version metadata
            renamed = KeyMatch({})

        def rename(module_prefix: str) -> Optional[str]:
            new = renamed.mapping.get(encode(module_prefix))
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


def state_dict_keys(obj: Any) -> List[str]:
    """Container keys of every state dict a checkpoint dict holds (EMA copies included).

    >>> import torch
    >>> sd = torch.nn.Linear(1, 1).state_dict()
    >>> state_dict_keys({"epoch": 3, "state_dict": sd, "state_dict_ema": sd})
    ['state_dict', 'state_dict_ema']
    """
    if not isinstance(obj, Mapping) or is_state_dict(obj):
        return []
    return [
        k
        for k, v in obj.items()
        if isinstance(k, str) and (is_state_dict(v) or isinstance(v, nn.Module))
    ]


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
