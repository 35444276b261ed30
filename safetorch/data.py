"""Data loading: pin-aware batch types, nested pinning, collate, loader checks.

Three pitfalls live here:

* ``DataLoader(pin_memory=True)`` pins only tensors, mappings, sequences and objects with a
  ``pin_memory()`` method. A dataclass batch is passed through *unpinned*, silently, so the
  following ``.to("cuda", non_blocking=True)`` is a synchronous pageable copy.
  :class:`PinnedBatch` and :func:`pin` pin every tensor of any nested structure.
* ``Tensor.pin_memory()`` raises without an accelerator ("Cannot access accelerator device
  when none is available", torch 2.13 CPU). Here pinning is a no-op without one, so the same
  code runs on a laptop and on a GPU node.
* A dataset size not divisible by the batch size gives a smaller last batch (19,130 samples
  with ``batch_size=4`` end with a batch of 2); code that hard-codes the batch size then fails
  on the last step of every epoch. :func:`check_loader` and :class:`SafeDataLoader` say so
  before the first batch.

:func:`pin` is the single implementation of "pin an arbitrary nested structure": monkeypatch
mode routes ``torch.utils.data._utils.pin_memory.pin_memory`` to it, so it never calls that
function (a patched entry point would recurse into itself); the torch callables it relies on
are captured at import.
"""

from __future__ import annotations

import collections.abc
import copy
import dataclasses
import logging
import os
import warnings
from typing import (
    Any,
    Callable,
    Iterable,
    Iterator,
    List,
    Optional,
    Sequence,
    Tuple,
    Type,
    TypeVar,
    Union,
)

import torch
import torch.utils.data

from safetorch import _device
from safetorch import device as _device_move
from safetorch._nest import DESCEND, iter_tensors, map_tensors
from safetorch._nest import attribute_names as _attribute_names
from safetorch._stack import user_stacklevel
from safetorch.errors import DataWarning
from safetorch.findings import Finding

__all__ = [
    "PinnedBatch",
    "pin",
    "collate",
    "check_loader",
    "SafeDataLoader",
    "loader_to_iterate",
]

_log = logging.getLogger("safetorch")

# Captured at import: a monkeypatched torch entry point that routes to `pin` must never be
# reached again from inside `pin` (it would recurse into itself).
_tensor_pin_memory = torch.Tensor.pin_memory
_Tensor = torch.Tensor
_default_collate = torch.utils.data.default_collate
_BatchNorm = torch.nn.modules.batchnorm._BatchNorm

_T = TypeVar("_T")
_B = TypeVar("_B", bound="PinnedBatch")


# --- nested pinning ----------------------------------------------------------------------
def pin(obj: _T, device: Optional[Union[str, torch.device]] = None) -> _T:
    """Pin every tensor in a nested structure; a no-op without an accelerator.

    Recurses like ``DataLoader(pin_memory=True)`` does (tensors, mappings, sequences,
    namedtuples, objects with a ``pin_memory()`` method, asked first) and also through
    dataclasses, which torch passes through unpinned. Containers are rebuilt (same type where
    possible; a tuple stays a tuple where torch makes it a list); the leaves that are not
    tensors are returned as they are. The rules are ``safetorch._nest``'s, shared with
    :func:`safetorch.to_device` and :func:`safetorch.safe_copy`.

    Args:
        obj: A tensor, or any nesting of dicts, lists, tuples, namedtuples, dataclasses and
            objects with a ``pin_memory()`` method (such as :class:`PinnedBatch`).
        device: Accepted for signature compatibility with torch's internal
            ``pin_memory(data, device)``; the current accelerator is always used (torch
            deprecated ``pin_memory_device``).

    Returns:
        The same structure with every tensor in page-locked memory, or ``obj`` itself,
        untouched, when no accelerator is available (``Tensor.pin_memory()`` would raise).

    >>> import torch, safetorch as st
    >>> batch = {"x": torch.zeros(2, 3), "ids": [1, 2]}
    >>> pinned = st.pin(batch)
    >>> pinned["x"].is_pinned() == st.accelerator_available()
    True
    """
    del device  # the current accelerator is the only target torch supports
    if not _device.accelerator_available():
        return obj
    return _pin_nested(obj)


class _NoPinLoader:
    """Read-only view of a DataLoader with ``pin_memory`` False (for iterator setup only)."""

    __slots__ = ("_loader",)
    pin_memory = False

    def __init__(self, loader: Any) -> None:
        object.__setattr__(self, "_loader", loader)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


def loader_to_iterate(loader: Any) -> Any:
    """The loader a DataLoader iterator should be built from: ``loader`` itself, or, when it
    asks for ``pin_memory=True`` on a machine without an accelerator, a read-only view of it
    with ``pin_memory`` False.

    torch turns pinning off by itself there, and from torch 2.7 also warns on every iterator
    ("'pin_memory' argument is set as true but no accelerator is found"); an iterator built
    from the view behaves exactly as torch's (no pinning) and says nothing. The loader object
    is never modified, so other threads see no flip. The ``pin_memory`` patch builds every
    DataLoader iterator through this function.

    >>> import torch, safetorch as st
    >>> loader = torch.utils.data.DataLoader([torch.zeros(2)], pin_memory=True)
    >>> view = st.data.loader_to_iterate(loader)
    >>> (view is loader) == st.accelerator_available(), view.pin_memory == st.accelerator_available()
    (True, True)
    """
    if not getattr(loader, "pin_memory", False) or _device.accelerator_available():
        return loader
    return _NoPinLoader(loader)


def _pin_nested(obj: Any) -> Any:
    """Pin recursively (safetorch._nest's rules); the caller has checked for an accelerator."""
    return map_tensors(_tensor_pin_memory, obj, own=_pin_itself)


def _pin_itself(obj: Any) -> Any:
    # An object with a pin_memory() method (a PinnedBatch, a TensorDict) pins itself.
    method = getattr(obj, "pin_memory", None)
    return method() if callable(method) else DESCEND


def _contains_tensor(obj: Any) -> bool:
    # Attributes of any object too: a batch class need not be a dataclass.
    return next(iter_tensors(obj, objects=True), None) is not None


# --- batch base class --------------------------------------------------------------------
class PinnedBatch:
    """Base class for batch types that ``DataLoader(pin_memory=True)`` pins field by field.

    Use it as the base of a dataclass or of a class with plain attributes. torch's loader
    calls ``batch.pin_memory()`` on any object that has one; this one pins every tensor field
    (recursing through lists, tuples, dicts, namedtuples and dataclasses) in place and
    returns ``self``. Without an accelerator it is a no-op: no exception, no warning.

    >>> import dataclasses, torch, safetorch as st
    >>> @dataclasses.dataclass
    ... class Batch(st.PinnedBatch):
    ...     x: torch.Tensor
    ...     y: torch.Tensor
    >>> b = Batch(torch.zeros(4, 3), torch.zeros(4)).pin_memory()
    >>> b.x.is_pinned() == st.accelerator_available()
    True
    >>> b.to("cpu").y.shape
    torch.Size([4])
    """

    def pin_memory(self: _B) -> _B:
        """Pin every tensor field in place and return ``self``; a no-op without an accelerator.

        Returns:
            ``self``, with each field replaced by its pinned counterpart.

        >>> import torch, safetorch as st
        >>> class Batch(st.PinnedBatch):
        ...     def __init__(self, x):
        ...         self.x = x
        >>> b = Batch(torch.ones(2))
        >>> b.pin_memory() is b
        True
        """
        if not _device.accelerator_available():
            return self
        for name in _attribute_names(self):
            # object.__setattr__ also works for frozen dataclasses.
            object.__setattr__(self, name, _pin_nested(getattr(self, name)))
        return self

    def to(
        self: _B,
        device: Union[str, int, torch.device],
        non_blocking: Optional[bool] = None,
    ) -> _B:
        """Return a copy of the batch with every field moved to ``device``.

        Each field goes through :func:`safetorch.to_device`, which recurses through nested
        containers and copies asynchronously only from pinned memory.

        Args:
            device: Target device (``"cuda"``, ``"cuda:1"``, ``torch.device``, index).
            non_blocking: ``None`` (default) copies asynchronously exactly when the source is
                pinned; ``True``/``False`` force the choice.

        Returns:
            A shallow copy of ``self`` whose fields are on ``device``; ``self`` is unchanged.

        >>> import torch, safetorch as st
        >>> class Batch(st.PinnedBatch):
        ...     def __init__(self, x):
        ...         self.x = x
        >>> Batch(torch.ones(2)).to("cpu").x.device
        device(type='cpu')
        """
        moved = copy.copy(self)
        to_device = _device_move.to_device
        for name in _attribute_names(self):
            value = to_device(getattr(self, name), device, non_blocking=non_blocking)
            object.__setattr__(moved, name, value)
        return moved


# --- collate -----------------------------------------------------------------------------
class _CollateInto:
    """Picklable collate_fn that builds ``batch_cls`` from default-collated fields."""

    def __init__(self, batch_cls: Type[Any], base: Callable[[Any], Any]) -> None:
        self.batch_cls = batch_cls
        self.base = base

    def __call__(self, samples: Sequence[Any]) -> Any:
        if len(samples) == 0:
            raise ValueError(
                f"collate({self.batch_cls.__name__}) got an empty list of samples; "
                "a DataLoader never calls collate_fn with one - check a custom batch_sampler"
            )
        first = samples[0]
        if _is_record(first):
            names = _init_field_names(first)
            fields = {n: self.base([getattr(s, n) for s in samples]) for n in names}
            return self._build(kwargs=fields)
        collated = self.base(samples)
        if isinstance(collated, collections.abc.Mapping):
            return self._build(kwargs=dict(collated))
        if isinstance(collated, (list, tuple)):
            return self._build(args=tuple(collated))
        return self._build(args=(collated,))

    def _build(self, args: Tuple[Any, ...] = (), kwargs: Optional[dict] = None) -> Any:
        kwargs = kwargs or {}
        try:
            return self.batch_cls(*args, **kwargs)
        except TypeError as e:
            got = f"{len(args)} positional fields" if args else f"fields {sorted(kwargs)}"
            raise TypeError(
                f"collate({self.batch_cls.__name__}): cannot build the batch from {got}: {e}; "
                "samples must be tuples in constructor order, dicts keyed by constructor "
                "arguments, or objects whose attributes match them"
            ) from e

    def __repr__(self) -> str:
        return f"collate({self.batch_cls.__qualname__})"


def _is_record(obj: Any) -> bool:
    """A per-sample object with named fields (dataclass or plain attributes)."""
    if isinstance(obj, (_Tensor, str, bytes, collections.abc.Mapping, collections.abc.Sequence)):
        return False
    return dataclasses.is_dataclass(obj) or bool(_attribute_names(obj))


def _init_field_names(obj: Any) -> List[str]:
    if dataclasses.is_dataclass(obj):
        return [f.name for f in dataclasses.fields(obj) if f.init]
    return _attribute_names(obj)


def collate(
    batch_cls: Type[_T], collate_fn: Optional[Callable[[Any], Any]] = None
) -> Callable[[Sequence[Any]], _T]:
    """Build a ``collate_fn`` that returns ``batch_cls`` built from default-collated fields.

    Samples may be tuples (fields in constructor order), dicts (keyed by constructor
    argument), or objects with those attributes (dataclasses, ``batch_cls`` itself); each
    field is collated by ``collate_fn`` (``torch.utils.data.default_collate`` by default).

    Args:
        batch_cls: The batch class, typically a :class:`PinnedBatch` subclass.
        collate_fn: How to collate one field's samples (default: ``default_collate``).

    Returns:
        A picklable callable usable as ``DataLoader(collate_fn=...)``, also with workers.

    Raises:
        TypeError: (when called) the collated fields do not fit ``batch_cls``'s constructor.

    >>> import dataclasses, torch, safetorch as st
    >>> @dataclasses.dataclass
    ... class Batch(st.PinnedBatch):
    ...     x: torch.Tensor
    ...     y: torch.Tensor
    >>> fn = st.collate(Batch)
    >>> b = fn([(torch.zeros(3), 0), (torch.ones(3), 1)])
    >>> type(b).__name__, tuple(b.x.shape), b.y.tolist()
    ('Batch', (2, 3), [0, 1])
    """
    return _CollateInto(batch_cls, collate_fn or _default_collate)


# --- loader checks -----------------------------------------------------------------------
_FIX_PARTIAL = (
    "drop_last=True, or take the batch size from the batch (x.size(0)) instead of hard-coding it"
)


def check_loader(
    loader: torch.utils.data.DataLoader,
    model: Optional[torch.nn.Module] = None,
    *,
    batch: Any = None,
) -> List[Finding]:
    """Check a DataLoader for the configurations that fail or slow down training.

    Rules (``Finding.rule``):

    * ``partial-last-batch``: the sample count is not a multiple of ``batch_size`` and
      ``drop_last`` is off; the last batch is smaller (numbers in the message).
    * ``last-batch-size-1-batchnorm``: that last batch has one sample and ``model`` has a
      BatchNorm layer in training mode ("Expected more than 1 value per channel").
    * ``pin-memory-no-accelerator``: ``pin_memory=True`` with no accelerator present.
    * ``batch-not-pinnable``: ``pin_memory=True`` but the batch type (from
      ``collate_fn=st.collate(cls)`` or from ``batch``) holds tensors torch will not pin.
    * ``num-workers-0``: batches are loaded in the training process, between steps. Quiet
      where workers cannot help (one CPU core, an in-memory ``TensorDataset``, fewer than 16
      batches per epoch); the advice scales with ``os.cpu_count()`` and the accelerators.

    Args:
        loader: The loader to check; nothing is loaded from it.
        model: The model the batches feed, to check for training-mode BatchNorm.
        batch: Optionally one batch from the loader, to check its type.

    Returns:
        The findings, in the order above; empty when nothing is wrong.

    >>> import torch, safetorch as st
    >>> from torch.utils.data import DataLoader, TensorDataset
    >>> ds = TensorDataset(torch.zeros(19130, 2))
    >>> for f in st.check_loader(DataLoader(ds, batch_size=4, num_workers=2)):
    ...     print(f.rule)
    partial-last-batch
    """
    findings: List[Finding] = []
    last = _last_batch_size(loader)
    if last is not None:
        n, bs, remainder = last
        findings.append(
            Finding(
                "partial-last-batch",
                "loader",
                f"{n} samples with batch_size={bs} give {n // bs} full batches and a last "
                f"batch of {remainder}; code that assumes {bs} samples per batch fails on the "
                f"last step of every epoch (e.g. 'Expected input batch_size ({bs}) to match "
                f"target batch_size ({remainder})')",
                _FIX_PARTIAL,
            )
        )
        bn = _training_batchnorm(model) if model is not None else None
        if remainder == 1 and bn is not None:
            findings.append(
                Finding(
                    "last-batch-size-1-batchnorm",
                    "loader",
                    f"the last batch has 1 sample and {bn} is a BatchNorm in training mode: "
                    "it raises 'Expected more than 1 value per channel when training'",
                    "drop_last=True",
                )
            )
    if loader.pin_memory and not _device.accelerator_available():
        findings.append(
            Finding(
                "pin-memory-no-accelerator",
                "loader",
                "pin_memory=True but no accelerator is available: nothing is pinned",
                "pin_memory=st.accelerator_available()",
            )
        )
    if loader.pin_memory:
        unpinnable = _unpinnable_type(loader, batch)
        if unpinnable is not None:
            findings.append(
                Finding(
                    "batch-not-pinnable",
                    "loader",
                    f"pin_memory=True, but DataLoader leaves batches of type {unpinnable} "
                    "unpinned: it pins only tensors, mappings, sequences and objects with a "
                    "pin_memory() method, so the copy to the device is synchronous",
                    f"class {unpinnable}(st.PinnedBatch), or define {unpinnable}.pin_memory()",
                )
            )
    if loader.num_workers == 0 and _workers_can_help(loader):
        workers, why = _worker_advice()
        findings.append(
            Finding(
                "num-workers-0",
                "loader",
                "num_workers=0 loads every batch in the training process, between steps",
                f"num_workers={workers} ({why})",
            )
        )
    return findings


# Below this many batches per epoch, starting worker processes costs more than it saves.
_MIN_BATCHES_FOR_WORKERS = 16


def _workers_can_help(loader: torch.utils.data.DataLoader) -> bool:
    """False where ``num-workers-0`` cannot matter: one CPU core, an in-memory
    TensorDataset (a batch is one indexing op; workers would only add pickling), or an epoch
    of a few batches."""
    if (os.cpu_count() or 1) < 2:
        return False
    if isinstance(loader.dataset, torch.utils.data.TensorDataset):
        return False
    try:
        return len(loader) >= _MIN_BATCHES_FOR_WORKERS
    except TypeError:  # iterable-style dataset without __len__: unknown, assume long
        return True


def _worker_advice() -> Tuple[int, str]:
    """A worker count for this machine: the CPU cores per accelerator, one left for training."""
    cpus = os.cpu_count() or 1
    accelerators = torch.cuda.device_count() if torch.cuda.is_available() else 0
    per_process = max(1, cpus // max(1, accelerators))
    workers = max(1, min(8, per_process - 1))
    where = f"{cpus} CPU cores" + (
        f" shared by {accelerators} accelerators" if accelerators > 1 else ""
    )
    return workers, f"{where}; one stays with the training process"


def _last_batch_size(loader: torch.utils.data.DataLoader) -> Optional[Tuple[int, int, int]]:
    """``(samples, batch_size, last batch size)`` when the last batch is partial."""
    bs = loader.batch_size
    if bs is None or loader.drop_last:  # custom batch_sampler or no auto-batching
        return None
    try:
        n = len(loader.sampler)  # type: ignore[arg-type]  # Sampler has no __len__ in its stub; TypeError below when it lacks one
    except TypeError:  # iterable-style dataset without __len__
        return None
    if n % bs == 0:
        return None
    return n, bs, n % bs


def _training_batchnorm(model: torch.nn.Module) -> Optional[str]:
    for name, module in model.named_modules():
        if isinstance(module, _BatchNorm) and module.training:
            return name or type(module).__name__
    return None


def _unpinnable_type(loader: torch.utils.data.DataLoader, batch: Any) -> Optional[str]:
    if isinstance(loader.collate_fn, _CollateInto):
        cls = loader.collate_fn.batch_cls
        return None if callable(getattr(cls, "pin_memory", None)) else cls.__qualname__
    if batch is None:
        return None
    found = _find_unpinnable(batch, 0)
    return None if found is None else type(found).__qualname__


def _find_unpinnable(obj: Any, depth: int) -> Any:
    """The first object torch's pin_memory would pass through with tensors inside.

    Not a walker over safetorch's containers (``safetorch._nest``) but a model of torch's own
    ``pin_memory`` recursion (mappings, sequences, objects with ``pin_memory()``), which is
    what decides what torch leaves unpinned; whether such an object holds tensors is
    ``_nest.iter_tensors``'s answer.
    """
    if depth > 8 or isinstance(obj, (_Tensor, str, bytes, type)):
        return None
    if callable(getattr(obj, "pin_memory", None)):
        return None
    if isinstance(obj, collections.abc.Mapping):
        return next((f for v in obj.values() if (f := _find_unpinnable(v, depth + 1))), None)
    if isinstance(obj, collections.abc.Sequence):
        return next((f for v in obj if (f := _find_unpinnable(v, depth + 1))), None)
    return obj if _contains_tensor(obj) else None


class _FirstBatchCheck:
    """Iterator proxy that checks the first batch's type, then only delegates."""

    def __init__(self, it: Any, loader: SafeDataLoader) -> None:
        self._it = it
        self._loader: Optional[SafeDataLoader] = loader

    def __iter__(self) -> _FirstBatchCheck:
        return self

    def __next__(self) -> Any:
        batch = next(self._it)
        if self._loader is not None:
            loader, self._loader = self._loader, None
            name = _unpinnable_type(loader, batch)
            if name is not None and "batch-not-pinnable" not in loader.ignore:
                finding = [
                    f for f in check_loader(loader, batch=batch) if f.rule == "batch-not-pinnable"
                ]
                _warn(finding)
        return batch

    def __len__(self) -> int:
        return len(self._it)

    def __getattr__(self, name: str) -> Any:
        if name == "_it":  # not set yet (copy/unpickling): do not recurse
            raise AttributeError(name)
        return getattr(self._it, name)


def _warn(findings: Iterable[Finding]) -> None:
    # Attributed to the user's `for` statement (first frame outside torch and safetorch).
    for f in findings:
        warnings.warn(f"SafeDataLoader: {f}", DataWarning, stacklevel=user_stacklevel())


class SafeDataLoader(torch.utils.data.DataLoader):
    """A ``DataLoader`` that runs :func:`check_loader` once, at its first iteration.

    Each finding becomes one :class:`~safetorch.DataWarning`; the batch type is checked
    on the first batch. Everything else is ``torch.utils.data.DataLoader``.

    Args:
        *args: Passed to ``DataLoader``.
        model: The model the batches feed (checks for training-mode BatchNorm).
        ignore: Rule ids not to warn about, e.g. ``("num-workers-0",)``.
        **kwargs: Passed to ``DataLoader``.

    >>> import warnings, torch, safetorch as st
    >>> from torch.utils.data import TensorDataset
    >>> loader = st.SafeDataLoader(TensorDataset(torch.zeros(10, 2)), batch_size=4)
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     batches = [b for b in loader]
    >>> sorted(str(w.message).split("[")[1].split("]")[0] for w in caught)  # workers cannot help here
    ['partial-last-batch']
    """

    def __init__(
        self,
        *args: Any,
        model: Optional[torch.nn.Module] = None,
        ignore: Iterable[str] = (),
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.model = model
        self.ignore = frozenset(ignore)
        self._checked = False

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]  # DataLoader.__iter__ is typed to return its private _BaseDataLoaderIter
        it = super().__iter__()
        if self._checked:
            return it
        self._checked = True
        findings = check_loader(self, self.model)
        _warn(f for f in findings if f.rule not in self.ignore)
        checks_batch_type = self.pin_memory and not isinstance(self.collate_fn, _CollateInto)
        if checks_batch_type and "batch-not-pinnable" not in self.ignore:
            return _FirstBatchCheck(it, self)
        return it
