"""The apply stage of a load: the model side, as every layout sees it.

A :class:`Destination` is what ``st.load_state_dict`` hands a layout once keys are matched:
the model's tensors (``targets``), ``apply`` (torch's own ``Module.load_state_dict``, captured at
import, with ``strict=False`` and the caller's ``assign=``, so load hooks and ``assign=`` are
honoured), and what a layout may write in place instead:

* ``direct``: plain contiguous CPU tensors of modules that keep torch's
  ``_load_from_state_dict``, in a model without any load hook, with ``assign=`` unset: exactly
  the targets ``Module.load_state_dict`` would fill by ``param.copy_(value)``, so a layout may
  read a file's bytes straight into them (one copy);
* ``in_place``: whether a layout may write into the model's own tensors at all (DTensor shards
  filled by DCP): false with ``assign=True`` or any load hook, where such values go through
  ``apply`` like every other.

torch's ``Module.load_state_dict`` is captured here at import: monkeypatch mode later routes it
to ``st.load_state_dict``, and the apply stage must keep calling the original.
"""

from __future__ import annotations

import collections
from typing import Any, Dict, List, Mapping, Optional, Set

import torch
from torch import nn

__all__: List[str] = []  # private module: the apply stage of safetorch.checkpoint

_module_load_state_dict = nn.Module.load_state_dict


def _has_load_hooks(model: nn.Module) -> bool:
    return any(
        getattr(m, "_load_state_dict_pre_hooks", None)
        or getattr(m, "_load_state_dict_post_hooks", None)
        for m in model.modules()
    )


def _direct_targets(model: nn.Module, keys: Any) -> Dict[str, torch.Tensor]:
    """The targets ``Module.load_state_dict`` would fill by a plain ``param.copy_(value)`` in a
    model without load hooks (the caller checks): a contiguous CPU tensor of a module that
    keeps torch's ``_load_from_state_dict``; the file's bytes may go straight into them."""
    base = nn.Module._load_from_state_dict
    modules = dict(model.named_modules())
    out: Dict[str, torch.Tensor] = {}
    for key in keys:
        owner_name, _, name = key.rpartition(".")
        owner = modules.get(owner_name)
        if owner is None or type(owner)._load_from_state_dict is not base:
            continue
        dest = owner._parameters.get(name)
        if dest is None:
            dest = owner._buffers.get(name)
            if dest is None or name in owner._non_persistent_buffers_set:
                continue
        if (
            type(dest) in (torch.Tensor, nn.Parameter)
            and dest.device.type == "cpu"
            and dest.is_contiguous()
            and not dest.is_conj()
            and not dest.is_neg()
        ):
            out[key] = dest
    return out


class Destination:
    """The model side of a load: its tensors, what may be written in place, and ``apply``.

    Args:
        model: The module loaded into.
        keys: The target keys that will be loaded (``direct`` is computed for them).
        assign: ``Module.load_state_dict(assign=)``; ``None`` leaves torch's default.
        metadata: The source state dict's ``_metadata`` (module versions), given to every
            ``apply`` batch as torch would see it in one call.
        targets: ``model.state_dict(keep_vars=True)`` where the caller has it already.

    ``apply(batch)`` loads ``{target key: value}`` with torch's ``Module.load_state_dict``
    (``strict=False``); over all batches, :meth:`result` says what torch reported: a key is
    missing when no batch loaded it (nor a direct write), unexpected when any batch found no
    place for it.

    >>> import torch
    >>> from safetorch.checkpoint._apply import Destination
    >>> net = torch.nn.Linear(2, 1)
    >>> dest = Destination(net, ["weight", "bias"])
    >>> sorted(dest.direct), dest.in_place
    (['bias', 'weight'], True)
    >>> dest.apply({"weight": torch.zeros(1, 2), "extra": torch.ones(1)})
    >>> dest.result().missing_keys, dest.result().unexpected_keys
    (['bias'], ['extra'])
    """

    def __init__(
        self,
        model: nn.Module,
        keys: Any,
        assign: Optional[bool] = None,
        metadata: Any = None,
        targets: Optional[Dict[str, Any]] = None,
    ) -> None:
        self.model = model
        self.targets: Dict[str, Any] = (
            model.state_dict(keep_vars=True) if targets is None else targets
        )
        self.assign = assign
        self._kwargs = {} if assign is None else {"assign": assign}
        self._metadata = metadata
        self.in_place = not assign and not _has_load_hooks(model)
        self.direct: Dict[str, torch.Tensor] = _direct_targets(model, keys) if self.in_place else {}
        self._missing: Optional[Set[str]] = None
        self._written: Set[str] = set()
        self.unexpected: List[str] = []

    def apply(self, batch: Mapping[str, Any]) -> None:
        """Load one batch through torch's ``Module.load_state_dict(strict=False)``."""
        ordered: "collections.OrderedDict[str, Any]" = collections.OrderedDict(batch)
        if self._metadata is not None:
            ordered._metadata = self._metadata  # type: ignore[attr-defined]  # state dicts carry torch's _metadata attribute (an OrderedDict subclass attr)
        result = _module_load_state_dict(self.model, ordered, strict=False, **self._kwargs)
        missing = set(result.missing_keys)
        self._missing = missing if self._missing is None else self._missing & missing
        self.unexpected.extend(k for k in result.unexpected_keys if k not in self.unexpected)

    def wrote(self, keys: Any) -> None:
        """Record targets a layout filled in place (loaded, as torch would have said)."""
        self._written.update(keys)

    def result(self) -> Any:
        """What one ``Module.load_state_dict`` call would have returned for all batches: an
        object with ``missing_keys`` (model order) and ``unexpected_keys``."""
        order = list(self.targets)
        if self._missing is None:  # no batch: torch would call every key not written missing
            missing = set(order) - self._written
        else:
            missing = self._missing - self._written
        return _Keys([k for k in order if k in missing], list(self.unexpected))


class _Keys:
    __slots__ = ("missing_keys", "unexpected_keys")

    def __init__(self, missing: List[str], unexpected: List[str]) -> None:
        self.missing_keys = missing
        self.unexpected_keys = unexpected
