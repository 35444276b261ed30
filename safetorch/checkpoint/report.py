"""LoadReport: what :func:`safetorch.load_state_dict` loaded, skipped and renamed."""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Any, ClassVar, Dict, Iterable, Iterator, List, Optional, Tuple

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


@dataclass(repr=False)
class LoadReport:
    """The outcome of :func:`safetorch.load_state_dict`.

    It also behaves like the ``_IncompatibleKeys`` named tuple ``Module.load_state_dict``
    returns: ``missing_keys`` and ``unexpected_keys`` are there, and it unpacks, indexes and
    iterates as ``(missing_keys, unexpected_keys)``, so ``missing, unexpected =
    model.load_state_dict(...)`` keeps working under the ``state_dict`` patch.

    Attributes:
        loaded: model keys that received a value from the checkpoint (with ``refused``: that
            would have received one).
        missing: model keys the checkpoint has no value for (also ``missing_keys``).
        unexpected: checkpoint keys that match no model key, original names (also
            ``unexpected_keys``).
        mismatched: ``(model key, checkpoint shape, model shape)`` for skipped shape mismatches.
        rule: how checkpoint keys were renamed (``"exact"`` when they were not).
        source_key: the container key the state dict was taken from (``None``: top level).
        n_averaged: AveragedModel's ``n_averaged`` counter found in the checkpoint, reported
            rather than loaded (``None`` when absent).
        strict: whether the load was strict.
        hint: what to change when the keys do not match (e.g. ``prefix='features.'``).
        other_state_dicts: container keys of the other state dicts in the checkpoint
            (``state_dict_ema``, ...), which were not loaded.
        refused: a strict load found mismatches and loaded nothing.
        source: for a directory, a shard index or a DCP checkpoint: which layout and file the
            weights came from (e.g. ``"model.safetensors.index.json in 'run/'"``).

    >>> r = LoadReport(loaded=["fc.weight", "fc.bias"], missing=["head.weight"])
    >>> r.ok
    False
    >>> missing, unexpected = r
    >>> missing, r.unexpected_keys
    (['head.weight'], [])
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
    hint: Optional[str] = None
    other_state_dicts: List[str] = field(default_factory=list)
    refused: bool = False
    source: Optional[str] = None

    # --- torch's _IncompatibleKeys(missing_keys, unexpected_keys) ------------------------------
    _fields: ClassVar[Tuple[str, str]] = ("missing_keys", "unexpected_keys")

    @property
    def missing_keys(self) -> List[str]:
        """Model keys the checkpoint has no value for (torch's name for ``missing``)."""
        return self.missing

    @property
    def unexpected_keys(self) -> List[str]:
        """Checkpoint keys that match no model key (torch's name for ``unexpected``)."""
        return self.unexpected

    def _as_tuple(self) -> Tuple[List[str], List[str]]:
        return (self.missing, self.unexpected)

    def __iter__(self) -> Iterator[List[str]]:
        return iter(self._as_tuple())

    def __len__(self) -> int:
        return 2

    def __getitem__(self, index: Any) -> Any:
        return self._as_tuple()[index]

    def _asdict(self) -> Dict[str, List[str]]:
        return {"missing_keys": self.missing, "unexpected_keys": self.unexpected}

    # --- text ----------------------------------------------------------------------------------
    @property
    def ok(self) -> bool:
        """True when every model key was loaded and every checkpoint key was used."""
        return not (self.missing or self.unexpected or self.mismatched)

    def summary(self) -> str:
        """The first line of ``str(report)``."""
        counts = (
            f"{len(self.missing)} missing, {len(self.unexpected)} unexpected, "
            f"{len(self.mismatched)} mismatched"
        )
        if self.refused:
            return f"LoadReport: nothing loaded (refused); {len(self.loaded)} would load, {counts}"
        return f"LoadReport: {len(self.loaded)} loaded, {counts}"

    def __repr__(self) -> str:
        return (
            f"LoadReport(missing_keys={self.missing!r}, unexpected_keys={self.unexpected!r}, "
            f"loaded={len(self.loaded)}, mismatched={self.mismatched!r}, rule={self.rule!r})"
        )

    def __str__(self) -> str:
        lines = [self.summary()]
        if self.source is not None:
            lines.append(f"  source: {self.source}")
        if self.source_key is not None:
            lines.append(f"  source key: {self.source_key!r}")
        lines.append(f"  rule: {self.rule}")
        labels: List[Tuple[str, List[str]]] = [
            ("would load" if self.refused else "loaded", self.loaded),
            ("missing", self.missing),
            ("unexpected", self.unexpected),
        ]
        for label, keys in labels:
            if keys:
                lines.append(f"  {label}: " + ", ".join(group_keys(keys)))
        for key, ckpt_shape, model_shape in self.mismatched:
            lines.append(
                f"  mismatched: {key} checkpoint {list(ckpt_shape)} vs model {list(model_shape)}"
            )
        if self.n_averaged is not None:
            lines.append(
                f"  n_averaged: {self.n_averaged} (AveragedModel counter, not loaded into the model)"
            )
        if self.other_state_dicts:
            others = ", ".join(repr(k) for k in self.other_state_dicts)
            lines.append(
                f"  also in the checkpoint: {others} (not loaded; pick one with "
                f"key={self.other_state_dicts[0]!r})"
            )
        if self.hint:
            lines.append(f"  hint: {self.hint}")
        return "\n".join(lines)
