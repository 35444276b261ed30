"""Checked indexing while dynamo traces (``torch.compile``, ``torch.export``).

Dynamo can trace neither the host-side check (a .tolist() sync, then Python branches on the
values) nor the deferred record (a lock, the caller's frame); and an error path it traces
runs the CPU stand-in on FakeTensors, which raise nothing, so the bad index would reach the
kernel. While dynamo traces, the check and the record therefore run inside opaque custom ops
(torch >= 2.4): the op is a node of the graph and runs eagerly, with real values, every time
the graph runs, raising or recording exactly as eager mode does. Each op returns the index
the graph then uses (a copy), so it can never be dropped as dead code. With fullgraph=False
on torch 2.0-2.3 the check runs at a graph break instead, and its error re-raises as is.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import torch

from safetorch import _compat
from safetorch._index_checks import (
    _check_ranges,
    _check_select,
    _record,
    _site_id,
    _zero_bad,
    raise_deferred,
)
from safetorch._index_parse import _gather, _index_select

__all__: List[str] = []  # private: safetorch.tensor and safetorch._index_fused

# torch's originals (captured by _index_parse before any patch): this module may be imported
# after monkeypatch mode wrapped torch.index_select / torch.gather (safetorch.patching._index).
_SELECT_OPS: Dict[str, Any] = {"index_select": _index_select, "gather": _gather}
_COMPILED_SITE_KEY = ("<a torch.compile graph>", 0, "(line unknown inside a compiled graph)")


def _checked_ranges_eager(
    tensors: List[torch.Tensor], lo: List[int], n: List[int], dims: List[int]
) -> List[torch.Tensor]:
    if _check_ranges(list(zip(tensors, lo, n, dims))):
        raise_deferred()
    return [t.clone() for t in tensors]


def _checked_select_eager(
    x: torch.Tensor, dim: int, index: torch.Tensor, d: int, n: int, op: str
) -> torch.Tensor:
    _check_select(_SELECT_OPS[op], x, dim, index, d, n)
    return index.clone()


def _deferred_eager(t: torch.Tensor, bad: torch.Tensor, dim: int, n: int) -> torch.Tensor:
    key = _COMPILED_SITE_KEY
    _record(t, bad, dim, n, _site_id(key, f"{key[0]} {key[2]}"))
    return _zero_bad(t, bad)


_checked_ranges_op: Optional[Any] = None
_checked_select_op: Optional[Any] = None
_deferred_op: Optional[Any] = None


def _register_ops() -> None:
    global _checked_ranges_op, _checked_select_op, _deferred_op
    library = torch.library
    ops = (
        (
            "checked_ranges",
            _checked_ranges_eager,
            "(Tensor[] tensors, int[] lo, int[] n, int[] dims) -> Tensor[]",
        ),
        (
            "checked_select_index",
            _checked_select_eager,
            "(Tensor x, int dim, Tensor index, int d, int n, str op) -> Tensor",
        ),
        ("deferred_index", _deferred_eager, "(Tensor t, Tensor bad, int dim, int n) -> Tensor"),
    )
    made = []
    for name, fn, schema in ops:
        op = library.custom_op(f"safetorch::{name}", fn, mutates_args=(), schema=schema)
        made.append(op)
    ranges, select, deferred = made
    ranges.register_fake(lambda tensors, lo, n, dims: [torch.empty_like(t) for t in tensors])
    select.register_fake(lambda x, dim, index, d, n, op: torch.empty_like(index))
    deferred.register_fake(lambda t, bad, dim, n: torch.empty_like(t))
    _checked_ranges_op, _checked_select_op, _deferred_op = ranges, select, deferred


if _compat.HAS_CUSTOM_OP:
    _register_ops()


# How a checked call runs, decided once per call: eagerly; while dynamo traces it, through the
# custom ops; or, tracing on torch 2.0-2.3 (no custom ops), outside the graph (a graph break:
# fullgraph=True refuses to compile).
_EAGER, _OPS, _OUTSIDE = 0, 1, 2


def _route() -> int:
    if not _compat.tracing():
        return _EAGER
    return _OPS if _checked_ranges_op is not None else _OUTSIDE
