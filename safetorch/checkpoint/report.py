"""LoadReport: what :func:`safetorch.load_state_dict` loaded, skipped and renamed."""

from __future__ import annotations

import collections
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Dict, Iterable, Iterator, List, Optional, Tuple

__all__ = ["LoadReport", "PatchedLoadReport", "group_keys"]


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


@dataclass(repr=False, eq=False)
class LoadReport:
    """The outcome of :func:`safetorch.load_state_dict`.

    It also behaves like the ``_IncompatibleKeys`` named tuple ``Module.load_state_dict``
    returns: ``missing_keys`` and ``unexpected_keys`` are there, and it unpacks, indexes and
    iterates as ``(missing_keys, unexpected_keys)`` and compares equal to that pair, so
    ``missing, unexpected = model.load_state_dict(...)`` keeps working under the ``state_dict``
    patch (which returns a :class:`PatchedLoadReport`, printed as torch prints its result).

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
        dropped: checkpoint keys an older torch wrote that the module no longer has (e.g.
            InstanceNorm running stats of torch < 0.4.0), left out rather than unexpected.
        defaulted: model keys older torch releases did not write (e.g. BatchNorm's
            ``num_batches_tracked`` before torch 0.4.1), which keep the value torch's own
            loader gives them rather than being missing.
        legacy: one line per kind of older-torch key found: which module, which release,
            what was done.

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
    dropped: List[str] = field(default_factory=list)
    defaulted: List[str] = field(default_factory=list)
    legacy: List[str] = field(default_factory=list)

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

    def __eq__(self, other: object) -> bool:
        # Another report: every field. A pair (torch's _IncompatibleKeys, a tuple): as torch's
        # named tuple compares, on (missing_keys, unexpected_keys).
        if isinstance(other, LoadReport):
            return all(getattr(self, f.name) == getattr(other, f.name) for f in fields(self))
        if isinstance(other, tuple):
            return self._as_tuple() == tuple(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable, like the lists torch's result holds

    def torch_error(self, model_name: str) -> str:
        """The message ``Module.load_state_dict`` raises for these mismatches, in torch's words.

        Args:
            model_name: the class name of the model (torch names ``type(model).__name__``).

        Returns:
            ``"Error(s) in loading state_dict for <model_name>:"`` followed by torch's lines
            for the missing and unexpected keys and every shape mismatch.

        >>> r = LoadReport(missing=["fc.bias"], unexpected=["extra"])
        >>> for line in r.torch_error("Net").splitlines():
        ...     print(repr(line))
        'Error(s) in loading state_dict for Net:'
        '\\tMissing key(s) in state_dict: "fc.bias". '
        '\\tUnexpected key(s) in state_dict: "extra". '
        """
        lines = []
        if self.missing:
            keys = ", ".join(f'"{k}"' for k in self.missing)
            lines.append(f"Missing key(s) in state_dict: {keys}. ")
        if self.unexpected:
            keys = ", ".join(f'"{k}"' for k in self.unexpected)
            lines.append(f"Unexpected key(s) in state_dict: {keys}. ")
        for key, ckpt_shape, model_shape in self.mismatched:
            lines.append(
                f"size mismatch for {key}: copying a param with shape "
                f"{_size(ckpt_shape)} from checkpoint, the shape in current model is "
                f"{_size(model_shape)}."
            )
        return f"Error(s) in loading state_dict for {model_name}:\n\t" + "\n\t".join(lines)

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
        for n, what in ((len(self.dropped), "dropped"), (len(self.defaulted), "defaulted")):
            if n:
                counts += f", {n} {what}"
        if self.refused:
            return f"LoadReport: nothing loaded (refused); {len(self.loaded)} would load, {counts}"
        return f"LoadReport: {len(self.loaded)} loaded, {counts}"

    def __repr__(self) -> str:
        return (
            f"LoadReport(missing_keys={self.missing!r}, unexpected_keys={self.unexpected!r}, "
            f"loaded={len(self.loaded)}, mismatched={self.mismatched!r}, rule={self.rule!r})"
        )

    def __str__(self) -> str:
        return self.describe()

    def describe(self) -> str:
        """The full text: the summary line, then the keys per kind, the rule and the hint.

        This is ``str(report)``; a :class:`PatchedLoadReport` prints as torch's result
        instead, and ``describe()`` gives this text for it too.
        """
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
            ("dropped (keys of an older torch)", self.dropped),
            ("defaulted (absent in older torch's checkpoints)", self.defaulted),
        ]
        for label, keys in labels:
            if keys:
                lines.append(f"  {label}: " + ", ".join(group_keys(keys)))
        for key, ckpt_shape, model_shape in self.mismatched:
            lines.append(
                f"  mismatched: {key} checkpoint {list(ckpt_shape)} vs model {list(model_shape)}"
            )
        lines.extend(f"  older torch: {note}" for note in self.legacy)
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


def _size(shape: Tuple[int, ...]) -> str:
    return f"torch.Size({list(shape)})"  # how torch prints the shapes in its message


@dataclass(repr=False, eq=False)
class PatchedLoadReport(LoadReport):
    """What the patched ``Module.load_state_dict`` returns: a :class:`LoadReport` that prints
    as torch's ``_IncompatibleKeys`` does.

    Code written for torch keeps working on it: ``str()`` and ``repr()`` are torch's
    (``<All keys matched successfully>`` or ``_IncompatibleKeys(missing_keys=[...],
    unexpected_keys=[...])``), it compares equal to torch's result for the same keys, and it
    unpacks as ``missing, unexpected``. The report's own text is :meth:`describe`.

    >>> r = PatchedLoadReport(loaded=["weight"], unexpected=["extra"])
    >>> print(r)
    _IncompatibleKeys(missing_keys=[], unexpected_keys=['extra'])
    >>> r == ([], ["extra"]), r.summary()
    (True, 'LoadReport: 1 loaded, 0 missing, 1 unexpected, 0 mismatched')
    """

    @classmethod
    def of(cls, report: LoadReport) -> "PatchedLoadReport":
        """The same report (its lists shared, not copied), printed as torch's result."""
        return cls(**{f.name: getattr(report, f.name) for f in fields(report)})

    def __repr__(self) -> str:
        if not self.missing and not self.unexpected:
            return "<All keys matched successfully>"
        return (
            f"_IncompatibleKeys(missing_keys={self.missing!r}, unexpected_keys={self.unexpected!r})"
        )

    __str__ = __repr__
