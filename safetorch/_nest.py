"""Map a function over the tensors of a nested structure: the one container walker.

Every recursion through user data in safetorch is :func:`map_tensors` (rebuild the structure)
or :func:`iter_tensors` (only read its tensors): ``st.pin`` and ``PinnedBatch.pin_memory``,
``st.to_device`` and ``PinnedBatch.to``, ``st.safe_copy``, ``BalancedDataParallel``'s
batch-size check and scatter, ``st.lint_model``'s data flow through module inputs and outputs,
and ``st.check_loader``'s "does this batch hold tensors". So one rule decides, for all of them,
what a container is (and, for ``map_tensors``, how it is rebuilt); ``fn`` is applied to each
tensor.

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

Depth and cycles. :func:`map_tensors` has no depth limit but Python's recursion limit (it
rebuilds, so it cannot cut a cycle: a container that contains itself raises
``RecursionError``). :func:`iter_tensors` and :func:`iter_named_tensors` have no depth limit
and no recursion (an explicit stack: any depth costs time in proportion to the input, never a
``RecursionError``), and enter each container (and, with ``objects=True``, each object) at
most once per walk, by identity: a cycle is cut and a container shared by two places yields
its tensors once, at the first; a tensor is yielded at every place it appears. The readers
it replaced cut the walk at a fixed depth (8 in ``check_loader``, 20 in ``safetorch ckpt``)
and saw only ``list``/``tuple``/``dict`` (and ``Mapping``): a tensor in a dataclass, a
``deque`` or below that depth was missed, and ``lint_model`` lost the data flow through a
module that returns a dataclass.
"""

from __future__ import annotations

import collections.abc
import copy
import dataclasses
import types
from typing import Any, Callable, Iterator, List, Optional, Set, Tuple

import torch

from safetorch import _compat

__all__ = ["map_tensors", "iter_tensors", "iter_named_tensors", "attribute_names", "DESCEND"]

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
        cls = _class_of(o)
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


def _class_while_traced(o: Any) -> Any:
    """``type(o)``, also where dynamo 2.1 refuses ``type()`` of a value the traced code built
    ("Can't call type() on generated custom object", pytorch/pytorch#109056): while tracing,
    a ``dict`` or ``list`` is told by ``isinstance`` (``OrderedDict``, ``defaultdict``,
    tuples and the rest still go through ``type()``; a dict or list subclass of the user's
    own is taken for its base class there, and rebuilt as one).

    >>> _class_while_traced({"a": 1}), _class_while_traced((1,))
    (<class 'dict'>, <class 'tuple'>)
    """
    if not _compat.tracing():
        return type(o)
    if isinstance(o, dict) and not isinstance(
        o, (collections.OrderedDict, collections.defaultdict)
    ):
        return dict
    if isinstance(o, list):
        return list
    return type(o)  # dynamo 2.1 answers it for a tuple (not for a namedtuple it built)


#: ``_class_of(o)``: ``type(o)``, or :func:`_class_while_traced` on dynamo 2.1.
_class_of: Callable[[Any], Any] = type


@_compat.register_binder
def _bind_class_of() -> None:
    global _class_of
    _class_of = type if _compat.DYNAMO_TYPES_BUILT_VALUES else _class_while_traced


def iter_tensors(obj: Any, *, objects: bool = False) -> Iterator[torch.Tensor]:
    """Yield every tensor inside ``obj``, depth first, in container order.

    The containers are :func:`map_tensors`'s (mappings, tuples, sequences, dataclass fields;
    strings, bytes, ranges and classes are leaves); nothing is rebuilt or called. See the
    module docstring for the depth and cycle policy.

    Args:
        obj: A tensor or a nested structure.
        objects: Also look into the instance attributes (``__dict__`` and filled
            ``__slots__``, see :func:`attribute_names`) of every other object, dataclasses
            included (their non-field attributes too; not of modules): what
            ``st.check_loader`` needs to tell whether a batch object holds tensors.

    >>> import torch
    >>> from safetorch._nest import iter_tensors
    >>> [int(t) for t in iter_tensors({"a": [torch.tensor(1), (torch.tensor(2), "x")]})]
    [1, 2]
    """
    for _, tensor in _walk(obj, objects):
        yield tensor


def iter_named_tensors(obj: Any, *, objects: bool = False) -> Iterator[Tuple[str, torch.Tensor]]:
    """:func:`iter_tensors` with each tensor's dotted path: keys, indices and field names.

    >>> import torch
    >>> from safetorch._nest import iter_named_tensors
    >>> [k for k, _ in iter_named_tensors({"a": [torch.tensor(1), {"b": torch.tensor(2)}]})]
    ['a.0', 'a.1.b']
    """
    for path, tensor in _walk(obj, objects):
        yield ".".join(map(str, path)), tensor


def _walk(obj: Any, objects: bool) -> Iterator[Tuple[Tuple[Any, ...], torch.Tensor]]:
    # Iterative (an explicit stack), so that depth costs no Python recursion: a deeply nested
    # input (an untrusted checkpoint) is walked, never a RecursionError.
    entered: Set[int] = set()
    stack: List[Tuple[Tuple[Any, ...], Any]] = [((), obj)]
    while stack:
        path, o = stack.pop()
        if isinstance(o, _Tensor):
            yield path, o
            continue
        if isinstance(o, _ATOMS) or id(o) in entered:
            continue
        if isinstance(o, _Mapping):
            items: List[Tuple[Any, Any]] = list(o.items())
        elif isinstance(o, _Sequence):  # tuples (named or not) included
            items = list(enumerate(o))
        elif objects and not isinstance(o, types.ModuleType):  # a module's globals: no batch
            items = [(name, getattr(o, name)) for name in attribute_names(o)]
        elif dataclasses.is_dataclass(o):
            items = [(f.name, getattr(o, f.name)) for f in dataclasses.fields(o)]
        else:
            continue
        entered.add(id(o))
        stack.extend((path + (key,), value) for key, value in reversed(items))


def attribute_names(obj: Any) -> List[str]:
    """The instance attributes of an object: ``__dict__`` entries and filled ``__slots__``.

    >>> class A:
    ...     __slots__ = ("x", "y")
    ...     def __init__(self):
    ...         self.x = 1
    >>> attribute_names(A())
    ['x']
    """
    names = list(getattr(obj, "__dict__", {}))
    for klass in type(obj).__mro__:
        slots = klass.__dict__.get("__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            if name not in ("__dict__", "__weakref__") and name not in names:
                if hasattr(obj, name):
                    names.append(name)
    return names


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
