"""Hypothesis strategies shared by several test files (``from _strategies import ...``).

``tests/conftest.py`` puts this folder on ``sys.path`` (the suite imports test files with
``--import-mode=importlib``, which adds nothing there).
"""

from __future__ import annotations

from typing import Any, List, Sequence, Tuple

import numpy as np
import torch
from hypothesis import strategies as hst

__all__ = ["shapes", "index_dtypes", "near_bound_index"]

index_dtypes = hst.sampled_from([torch.int64, torch.int32])
"""The dtypes torch accepts for an index tensor."""


def shapes(min_dims: int = 0, max_dims: int = 3, max_size: int = 4) -> Any:
    """Tensor shapes (tuples), dimensions of size 0 included."""
    return hst.lists(hst.integers(0, max_size), min_size=min_dims, max_size=max_dims).map(tuple)


_KINDS = ("tensor", "tensor", "list", "mask", "int", "slice")
_INDEX_SHAPES = ((1,), (2,), (2, 1), (0,), ())


@hst.composite
def near_bound_index(
    draw: Any,
    kinds: Sequence[str] = _KINDS,
    index_shapes: Sequence[Tuple[int, ...]] = _INDEX_SHAPES,
    mask_offsets: Sequence[int] = (0, 1, -1),
    extras: bool = True,
) -> Tuple[Tuple[int, ...], Tuple[Any, ...]]:
    """``(shape, index)``: a shape of 1-3 dimensions of size 0..3 and an index of one
    component per leading dimension, often just out of range: int64 tensors of the
    ``index_shapes``, lists, boolean masks of the dimension's size plus one of
    ``mask_offsets``, ints and full slices (``kinds`` weights them); with ``extras``, maybe a
    ``None`` or ``...`` inserted somewhere."""
    shape = draw(shapes(min_dims=1, max_dims=3, max_size=3))
    comps: List[Any] = []
    for dim in range(draw(hst.integers(1, len(shape)))):
        kind = draw(hst.sampled_from(list(kinds)))
        n = shape[dim]
        if kind == "tensor":
            ishape = draw(hst.sampled_from(list(index_shapes)))
            k = int(np.prod(ishape))
            vals = draw(hst.lists(hst.integers(-n - 2, n + 2), min_size=k, max_size=k))
            comps.append(torch.tensor(vals, dtype=torch.int64).reshape(ishape))
        elif kind == "list":
            comps.append(draw(hst.lists(hst.integers(-n - 2, n + 2), min_size=1, max_size=3)))
        elif kind == "mask":
            m = max(n + draw(hst.sampled_from(list(mask_offsets))), 0)
            mask = draw(hst.lists(hst.booleans(), min_size=m, max_size=m))
            comps.append(torch.tensor(mask, dtype=torch.bool))
        elif kind == "int":
            comps.append(draw(hst.integers(-n - 1, n + 1)))
        else:
            comps.append(slice(None))
    if extras and draw(hst.booleans()):
        comps.insert(draw(hst.integers(0, len(comps))), draw(hst.sampled_from([None, Ellipsis])))
    return shape, tuple(comps)
