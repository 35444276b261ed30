"""Wrapping ``__getitem__`` on a class without making its instances sequences.

Assigning any Python object to ``Tensor.__getitem__`` makes CPython fill *both* slots that
name it: ``mp_subscript`` (what ``x[i]`` calls) and ``sq_item``, which ``Tensor`` lacks (its
``__getitem__`` is a mapping slot of ``torch._C.TensorBase``). With ``sq_item`` set,
``PySequence_Check(x)`` is true for every tensor, so torch's constructors treat a tensor inside
a list as a nested sequence and ``torch.tensor([loss_a, loss_b])`` of 0-dim tensors raises
"len() of a 0-d tensor". :func:`set_keeping_sequence_slot` sets the attribute and puts back
the ``sq_item`` the class (and each subclass it updated) had: NULL for ``Tensor``. Restoring
the attribute needs nothing: CPython then recomputes ``sq_item`` from ``TensorBase``'s
descriptor, which is NULL again. Subclasses created *while* the wrapper is on get
``sq_item`` from it (CPython fills the slots of a new class from its MRO).

``sq_item`` is read and written through ``ctypes`` at its offset in ``PyTypeObject`` (stable
since CPython 3.8); a class whose header does not read back as the documented layout (a
free-threaded or ``Py_TRACE_REFS`` build) is left as it is.
"""

from __future__ import annotations

import ctypes
from typing import Any, Dict, List, Optional

__all__: List[str] = []

_WORD = ctypes.sizeof(ctypes.c_void_p)
_BASICSIZE, _ITEMSIZE = 4, 5  # words into PyTypeObject: after ob_refcnt, ob_type, ob_size, tp_name
_AS_SEQUENCE = 13  # tp_as_sequence: after tp_dealloc .. tp_as_number
_SQ_ITEM = 3  # in PySequenceMethods: after sq_length, sq_concat, sq_repeat


def _sq_item_address(cls: type) -> Optional[int]:
    base = id(cls)
    if (
        ctypes.c_ssize_t.from_address(base + _BASICSIZE * _WORD).value != cls.__basicsize__
        or ctypes.c_ssize_t.from_address(base + _ITEMSIZE * _WORD).value != cls.__itemsize__
    ):
        return None  # not the layout this module knows
    methods = ctypes.c_void_p.from_address(base + _AS_SEQUENCE * _WORD).value
    return None if not methods else methods + _SQ_ITEM * _WORD


def _family(cls: type) -> List[type]:
    seen: Dict[int, type] = {}
    todo = [cls]
    while todo:
        c = todo.pop()
        if id(c) not in seen:
            seen[id(c)] = c
            todo += type.__subclasses__(c)
    return list(seen.values())


def set_keeping_sequence_slot(parent: Any, attr: str, value: Any) -> None:
    """``setattr(parent, attr, value)``; for ``__getitem__`` on a class, the ``sq_item`` slot
    of it and its subclasses stays what it was."""
    if attr != "__getitem__" or not isinstance(parent, type):
        setattr(parent, attr, value)
        return
    before = []
    for cls in _family(parent):
        address = _sq_item_address(cls)
        if address is not None:
            before.append((address, ctypes.c_void_p.from_address(address).value))
    setattr(parent, attr, value)
    for address, slot in before:
        ctypes.c_void_p.from_address(address).value = slot
