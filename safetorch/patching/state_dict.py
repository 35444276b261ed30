"""Patch ``state_dict``: ``Module.load_state_dict`` re-maps wrapper prefixes when keys differ.

When every checkpoint key is one the model expects, torch's original runs with the caller's
arguments and nothing else is done beyond one key-set comparison. Otherwise the keys are
re-mapped by ``safetorch.checkpoint.remap_state_dict`` (the logic behind
``st.load_state_dict``: ``module.``, ``_orig_mod.``, FSDP/checkpoint-wrapper segments,
Lightning-style leading prefixes), the renaming is logged and counted, and torch's original
loads the renamed dict, so the return value is torch's ``_IncompatibleKeys`` and
``strict``/``assign`` keep their meaning.
"""

from __future__ import annotations

import importlib
import logging
import warnings
from collections.abc import Mapping
from typing import Any, Dict, Tuple

from safetorch._stack import user_stacklevel
from safetorch.errors import CheckpointError, SafetorchWarning
from safetorch.patching import registry

__all__: list = []

_NAME = "state_dict"
_log = logging.getLogger("safetorch")
_keys = importlib.import_module("safetorch.checkpoint.keys")


def _load_state_dict(
    wrapped: Any, instance: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any]
) -> Any:
    source = args[0] if args else kwargs.get("state_dict")
    if registry.nested(_NAME) or not isinstance(source, Mapping):
        return wrapped(*args, **kwargs)
    model_keys = list(instance.state_dict(keep_vars=True).keys())
    expected = set(model_keys)
    if all(k in expected for k in source):
        return wrapped(*args, **kwargs)  # nothing to rename: torch's own path, untouched
    try:
        with registry.reentry(_NAME):
            renamed, match = _keys.remap_state_dict(source, model_keys)
    except CheckpointError as exc:
        warnings.warn(
            f"safetorch patch 'state_dict': keys not re-mapped ({exc}); "
            "loading with torch's own key matching",
            SafetorchWarning,
            stacklevel=user_stacklevel(),
        )
        return wrapped(*args, **kwargs)
    renames = {k: v for k, v in match.mapping.items() if k != v}
    if not renames:
        return wrapped(*args, **kwargs)
    _log.info(
        "load_state_dict into %s: renamed %d checkpoint keys (%s)",
        type(instance).__name__,
        len(renames),
        match.rule,
    )
    example = next(iter(renames.items()))
    registry.record(
        _NAME,
        f"load_state_dict: {match.rule}",
        f"{len(renames)} keys renamed, e.g. {example[0]!r} -> {example[1]!r}",
    )
    if args:
        return wrapped(renamed, *args[1:], **kwargs)
    return wrapped(**{**kwargs, "state_dict": renamed})


PATCH = registry.declare(
    registry.Patch(
        name=_NAME,
        description=(
            "Module.load_state_dict: keys that match load as torch does; wrapper prefixes "
            "(module., _orig_mod., ...) re-mapped as st.load_state_dict does, logged and counted"
        ),
        targets=(registry.Target("torch.nn", "Module.load_state_dict", _load_state_dict),),
        implementation=("safetorch.checkpoint.keys", "remap_state_dict"),
    )
)
