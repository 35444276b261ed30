"""Map a function over the tensors of a nested structure: the one container walker.

Every recursion through user data in safetorch is :func:`map_tensors`: ``st.pin`` and
``PinnedBatch.pin_memory``, ``st.to_device`` and ``PinnedBatch.to``, ``st.safe_copy``, and
``BalancedDataParallel``'s batch-size check and scatter. So one rule decides, for all of them,
what a container is and how it is rebuilt; ``fn`` is applied to each tensor.

Containers (rebuilt; the input is never modified):

* **mappings**: ``dict``, its subclasses and any other ``collections.abc.Mapping``. A mutable
  one is shallow-copied and its values replaced key by key, so the copy keeps its type and
  extra state (an ``OrderedDict``'s ``_metadata`` in state dicts, a ``defaultdict``'s
  factory, a ``UserDict`` subclass's attributes); an immutable one is rebuilt with
  ``type(obj)(dict)``; where neither works, a plain ``dict`` (as torch's ``pin_memory``).
* **tuples**: namedtuples (positional constructor), torch's structseq return types and other
  subclasses (``type(obj)(values)``), plain tuples (stay tuples).
* **sequences**: ``list`` and any other ``collections.abc.Sequence``: a mutable one is copied
  and assigned item by item, an immutable one rebuilt with ``type(obj)(list)``, else a
  ``list``. ``str``, ``bytes``, ``bytearray``, ``memoryview`` and ``range`` are leaves (they
  hold no tensors), and so is every class.
* **dataclass instances**: a shallow copy whose every field (``init=False`` and ``frozen``
  ones included) is set with ``object.__setattr__``; ``__init__`` and ``__post_init__`` do not
  run again.

``own`` lets an object do the job itself (``pin_memory()``, ``.to()``): it is asked first,
for every object but a tensor, a plain dict/list/tuple and the leaves above, and returns
:data:`DESCEND` to let the walker go on. Anything else is a leaf, passed to ``leaf``
(default: returned unchanged).

Where the copies this module replaced disagreed (the changelog lists the differences):

* Dataclasses: the copy-and-set rule above, not ``dataclasses.replace`` (which ``st.pin``
  used). ``replace`` passes only ``init`` fields, so a tensor in an ``init=False`` field was
  left unpinned (or recomputed, unpinned, by ``__post_init__``); it re-runs ``__post_init__``
  (validation, side effects, derived fields) on a mere change of memory; and it raises for an
  ``InitVar`` without a default. Copy-and-set is also how ``PinnedBatch`` pins itself.
* Generic ``Mapping``/``Sequence`` (which ``st.pin`` handled like torch's ``pin_memory`` and
  the others passed through as leaves) are containers for every caller: ``to_device`` no
  longer leaves the tensors of a ``UserDict`` or ``deque`` behind, ``safe_copy`` detaches them
  instead of deep-copying the graph, ``BalancedDataParallel`` scatters them (and the tensors
  of dataclasses, whose sizes it already checked) instead of giving every device the whole
  batch.
* ``own`` comes before the container rules, as ``st.pin`` asked ``pin_memory()`` first; for
  ``to_device`` a container with its own ``.to()`` (a ``PinnedBatch`` dataclass, a
  ``TensorDict``) now moves itself.
"""

from __future__ import annotations

import collections.abc
import copy
import dataclasses
from typing import Any, Callable, List, Optional

import torch

__all__ = ["map_tensors", "DESCEND"]

_Tensor = torch.Tensor
_Mapping = collections.abc.Mapping
_MutableMapping = collections.abc.MutableMapping
_Sequence = collections.abc.Sequence
_MutableSequence = collections.abc.MutableSequence
# Leaves although they are sequences (or classes, whose attributes look like methods).
_ATOMS = (str, bytes, bytearray, memoryview, range, type)

DESCEND: Any = object()
"""Returned by ``own`` when the walker should treat the object itself."""


def map_tensors(
    fn: Callable[[torch.Tensor], Any],
    obj: Any,
    leaf: Optional[Callable[[Any], Any]] = None,
    own: Optional[Callable[[Any], Any]] = None,
) -> Any:
    """Return ``obj`` rebuilt with ``fn`` applied to every tensor inside it.

    Args:
        fn: Applied to each tensor.
        obj: A tensor or a nested structure of containers and dataclasses.
        leaf: Applied to every value that is neither a tensor nor a container (default:
            returned unchanged).
        own: Asked first for each object that may handle itself; returns the result, or
            :data:`DESCEND` to let the walker recurse (default: never asked).

    Returns:
        The rebuilt structure (see the module docstring for what counts as a container).

    >>> import torch
    >>> from safetorch._nest import map_tensors
    >>> map_tensors(lambda t: t * 2, {"a": [torch.tensor(1), (torch.tensor(2), "x")]})
    {'a': [tensor(2), (tensor(4), 'x')]}
    """

    def walk(o: Any) -> Any:
        if isinstance(o, _Tensor):
            return fn(o)
        cls = type(o)
        if cls is dict:  # the common containers first, exactly
            return {k: walk(v) for k, v in o.items()}
        if cls is list:
            return [walk(v) for v in o]
        if cls is tuple:
            return tuple(walk(v) for v in o)
        if isinstance(o, _ATOMS):
            return o if leaf is None else leaf(o)
        if own is not None:
            out = own(o)
            if out is not DESCEND:
                return out
        if isinstance(o, _Mapping):
            return _rebuild_mapping(o, {k: walk(v) for k, v in o.items()})
        if isinstance(o, tuple):
            values = [walk(v) for v in o]
            return cls(*values) if hasattr(o, "_fields") else cls(values)  # namedtuple or not
        if isinstance(o, _Sequence):
            return _rebuild_sequence(o, [walk(v) for v in o])
        if dataclasses.is_dataclass(o):
            out = copy.copy(o)
            for f in dataclasses.fields(o):
                # object.__setattr__ also works on frozen dataclasses.
                object.__setattr__(out, f.name, walk(getattr(o, f.name)))
            return out
        return o if leaf is None else leaf(o)

    return walk(obj)


def _rebuild_mapping(obj: Any, values: dict) -> Any:
    # As torch's pin_memory: copy a mutable mapping (it may carry extra state) rather than
    # calling type(obj)(...); the values are mapped before, so their TypeErrors propagate.
    try:
        if isinstance(obj, _MutableMapping):
            out = copy.copy(obj)
            for k, v in values.items():
                out[k] = v
            return out
        return type(obj)(values)
    except TypeError:  # no copy, no item assignment, or no constructor from a dict
        return values


def _rebuild_sequence(obj: Any, values: List[Any]) -> Any:
    try:
        if isinstance(obj, _MutableSequence):
            out = copy.copy(obj)
            for i, v in enumerate(values):
                out[i] = v
            return out
        return type(obj)(values)
    except TypeError:  # custom sequences without a constructor from a list
        return values
