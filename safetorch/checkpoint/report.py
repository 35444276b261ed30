"""LoadReport: what :func:`safetorch.load_state_dict` loaded, skipped and renamed."""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Tuple

__all__ = ["LoadReport", "group_keys"]


def group_keys(keys: Iterable[str]) -> List[str]:
    """Group keys per module: ``["a.b.weight", "a.b.bias"]`` -> ``["a.b.{bias, weight}"]``.

    Args:
        keys: state-dict keys.

    Returns:
        One string per module prefix, in first-seen order, leaves sorted.

    >>> group_keys(["backbone.conv1.weight", "backbone.conv1.bias", "head.weight"])
    ['backbone.conv1.{bias, weight}', 'head.weight']
    """
    groups: Dict[str, List[str]] = collections.OrderedDict()
    for key in keys:
        prefix, _, leaf = key.rpartition(".")
        groups.setdefault(prefix, []).append(leaf)
    out = []
    for prefix, leaves in groups.items():
        leaves = sorted(leaves)
        body = leaves[0] if len(leaves) == 1 else "{" + ", ".join(leaves) + "}"
        out.append(f"{prefix}.{body}" if prefix else body)
    return out


Mismatch = Tuple[str, Tuple[int, ...], Tuple[int, ...]]


@dataclass
class LoadReport:
    """The outcome of :func:`safetorch.load_state_dict`.

    Attributes:
        loaded: model keys that received a value from the checkpoint.
        missing: model keys the checkpoint has no value for.
        unexpected: checkpoint keys that match no model key (original checkpoint names).
        mismatched: ``(model key, checkpoint shape, model shape)`` for skipped shape mismatches.
        rule: how checkpoint keys were renamed (``"exact"`` when they were not).
        source_key: the container key the state dict was taken from (``None``: top level).
        n_averaged: AveragedModel's ``n_averaged`` counter found in the checkpoint, reported
            rather than loaded (``None`` when absent).
        strict: whether the load was strict.

    >>> r = LoadReport(loaded=["fc.weight", "fc.bias"], missing=["head.weight"])
    >>> r.ok
    False
    >>> print(r)
    LoadReport: 2 loaded, 1 missing, 0 unexpected, 0 mismatched
      rule: exact
      loaded: fc.{bias, weight}
      missing: head.weight
    """

    loaded: List[str] = field(default_factory=list)
    missing: List[str] = field(default_factory=list)
    unexpected: List[str] = field(default_factory=list)
    mismatched: List[Mismatch] = field(default_factory=list)
    rule: str = "exact"
    source_key: Optional[str] = None
    n_averaged: Optional[int] = None
    strict: bool = True

    @property
    def ok(self) -> bool:
        """True when every model key was loaded and every checkpoint key was used."""
        return not (self.missing or self.unexpected or self.mismatched)

    def summary(self) -> str:
        """The first line of ``str(report)``."""
        return (
            f"LoadReport: {len(self.loaded)} loaded, {len(self.missing)} missing, "
            f"{len(self.unexpected)} unexpected, {len(self.mismatched)} mismatched"
        )

    def __str__(self) -> str:
        lines = [self.summary()]
        if self.source_key is not None:
            lines.append(f"  source key: {self.source_key!r}")
        lines.append(f"  rule: {self.rule}")
        for name in ("loaded", "missing", "unexpected"):
            keys = getattr(self, name)
            if keys:
                lines.append(f"  {name}: " + ", ".join(group_keys(keys)))
        for key, ckpt_shape, model_shape in self.mismatched:
            lines.append(
                f"  mismatched: {key} checkpoint {list(ckpt_shape)} vs model {list(model_shape)}"
            )
        if self.n_averaged is not None:
            lines.append(
                f"  n_averaged: {self.n_averaged} (AveragedModel counter, not loaded into the model)"
            )
        return "\n".join(lines)
