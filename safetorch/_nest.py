"""Map a function over the tensors of a nested structure (the one recursion safetorch uses).

Containers rebuilt: dict (and subclasses: OrderedDict keeps ``_metadata``, defaultdict keeps its
factory), list, tuple, namedtuple, torch's structseq return types, and dataclass instances
(every field, ``frozen`` ones included). Anything else is a leaf, passed to ``leaf`` (default:
returned unchanged).
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, Callable, Optional

import torch

__all__ = ["map_tensors"]

_Tensor = torch.Tensor


def map_tensors(
    fn: Callable[[torch.Tensor], Any],
    obj: Any,
    leaf: Optional[Callable[[Any], Any]] = None,
) -> Any:
    """Return ``obj`` rebuilt with ``fn`` applied to every tensor inside it.

    Args:
        fn: Applied to each tensor.
        obj: A tensor or a nested structure of containers and dataclasses.
        leaf: Applied to every non-tensor, non-container value (default: unchanged).

    >>> import torch
    >>> from safetorch._nest import map_tensors
    >>> map_tensors(lambda t: t * 2, {"a": [torch.tensor(1), (torch.tensor(2), "x")]})
    {'a': [tensor(2), (tensor(4), 'x')]}
    """
    if isinstance(obj, _Tensor):
        return fn(obj)
    cls = type(obj)
    if cls is dict:
        return {k: map_tensors(fn, v, leaf) for k, v in obj.items()}
    if cls is list:
        return [map_tensors(fn, v, leaf) for v in obj]
    if cls is tuple:
        return tuple(map_tensors(fn, v, leaf) for v in obj)
    if isinstance(obj, dict):
        # copy.copy keeps the subclass, OrderedDict's _metadata (state dicts) and a
        # defaultdict's default_factory; then every value is replaced in place.
        out_d: Any = copy.copy(obj)
        for k, v in obj.items():
            out_d[k] = map_tensors(fn, v, leaf)
        return out_d
    if isinstance(obj, tuple):
        values = [map_tensors(fn, v, leaf) for v in obj]
        if hasattr(obj, "_fields"):  # namedtuple
            return cls(*values)
        return cls(values)  # tuple subclass / torch.return_types structseq
    if isinstance(obj, list):
        out_l: Any = copy.copy(obj)
        out_l[:] = [map_tensors(fn, v, leaf) for v in obj]
        return out_l
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out_c: Any = copy.copy(obj)
        for f in dataclasses.fields(obj):
            # object.__setattr__ also works on frozen dataclasses.
            object.__setattr__(out_c, f.name, map_tensors(fn, getattr(obj, f.name), leaf))
        return out_c
    return obj if leaf is None else leaf(obj)
