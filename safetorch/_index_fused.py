"""The fused path: one Triton kernel per checked call (:mod:`safetorch._triton_index`).

Where Triton is importable, a CUDA call of a covered form skips every torch op of the torch path: one
kernel reads each index once, tests it, records a violation and gathers through a safe
index. Raise mode then pays the one sync it needs by design (reading the kernel's flag); the
other modes none. Anything the kernel does not cover (other index forms and dtypes, sparse
gradients, a tensor fill_value, an empty output, ...) returns None here and takes the torch
path, which stays the reference. On CPU the kernel runs only under Triton's interpreter
(TRITON_INTERPRET=1) with the check path forced: how the CUDA path is tested without a GPU.
"""

from __future__ import annotations

import functools
import itertools
import math
import threading
from typing import Any, List, NamedTuple, Optional, Sequence, Tuple, cast

import torch

from safetorch import _compat, _device, _triton_index
from safetorch._index_checks import (
    _call_site,
    _default_fill,
    _deferred,
    _device_state,
    _first_bad,
    _out_of_range,
    _site_id,
    _transform,
    _zero_bad,
    raise_deferred,
)
from safetorch._index_compile import _COMPILED_SITE_KEY, _OPS, _SELECT_OPS, _route
from safetorch._index_parse import IndexMode, _getitem, _oob_message, _raise_like_cpu, _Tensor
from safetorch.errors import IndexOutOfBoundsError

__all__: List[str] = []  # private: safetorch.tensor is the only caller

_index_check_needed = _device.index_check_needed
_FULL = slice(None)
_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)  # subclasses (vmap, DTensor): torch path
_INTERPRET = _triton_index.INTERPRET
_call_ids = itertools.count(2)  # 1 is the torch path's flag in a deferred record
_raise_buffers = threading.local()


class _Fused(NamedTuple):
    """One covered call: the op, its normalized dimension, that dimension's size, the lowest
    valid index (``-n`` for ``x[idx]``, else 0) and the output shape."""

    op: str  # "getitem" (x[idx] after d full slices), "index_select" or "gather"
    d: int
    n: int
    lo: int
    shape: Tuple[int, ...]


def _fused_plan(op: str, x: Any, index: Any, dim: int) -> Optional[_Fused]:
    """The covered form of this call, or None (then the torch path runs it)."""
    if type(x) not in _PLAIN_TENSORS or type(index) not in _PLAIN_TENSORS:
        return None
    if index.dtype not in _triton_index.INDEX_DTYPES or index.device != x.device:
        return None
    if not _triton_index.coverable(x) or index.numel() == 0:
        return None
    nd = x.dim()
    if not -nd <= dim < nd:
        return None
    d = dim % nd
    n = x.shape[d]
    outer, inner = x.shape[:d], x.shape[d + 1 :]
    if op == "gather":
        if index.dim() != nd or any(index.shape[k] > x.shape[k] for k in range(nd) if k != d):
            return None  # torch raises its own error
        shape = tuple(index.shape)
    elif op == "index_select":
        if index.dim() > 1:
            return None
        shape = (*outer, index.numel(), *inner)
    else:
        shape = (*outer, *index.shape, *inner)
    if math.prod(shape) == 0:
        return None  # nothing is read: torch decides whether that raises
    return _Fused(op, d, n, -n if op == "getitem" else 0, shape)


def _fused_never(x: torch.Tensor, check: Optional[str]) -> bool:
    return False


def _fused_on_device(x: torch.Tensor, check: Optional[str]) -> bool:
    if x.is_cpu:
        return _INTERPRET and _index_check_needed(x, check)
    return x.is_cuda


def _raise_buffer(dev: torch.device) -> Tuple[torch.Tensor, torch.Tensor]:
    """This thread's raise-mode buffer on ``dev`` and the flag the kernel copies into it.

    ``[bad call id, deferred flag, 0]``: per thread, so that a call compares ``rec[0]`` with
    its own id after its own sync; slot 2 stands in for a device without a deferred record.
    """
    buffers = getattr(_raise_buffers, "by_device", None)
    if buffers is None:
        buffers = _raise_buffers.by_device = {}
    rec = buffers.get(dev)
    if rec is None:
        rec = buffers[dev] = torch.zeros(3, dtype=torch.int64, device=dev)
    state = _deferred.states.get(dev)
    return rec, (rec[2:] if state is None else state)


def _fill_bits(fill_value: Any, dtype: torch.dtype) -> Optional[int]:
    """``fill_value`` as the kernel takes it (the bits of the value in ``dtype``), or None."""
    if fill_value is None:
        fill_value = _default_fill(dtype)
    if type(fill_value) in (int, float, bool):
        if fill_value != fill_value:
            fill_value = _NAN  # one NaN object: NaN != NaN, so a new one never hits the cache
        return _scalar_fill_bits(dtype, fill_value)  # cached: no host op per call
    if isinstance(fill_value, _Tensor):
        return None  # a tensor fill_value may broadcast: the torch path handles it
    return _triton_index.fill_bits_of(fill_value, dtype)


_NAN = float("nan")


@functools.lru_cache(maxsize=256, typed=True)
def _scalar_fill_bits(dtype: torch.dtype, value: Any) -> Optional[int]:
    return _triton_index.fill_bits_of(value, dtype)


def _restricted(x: torch.Tensor, index: torch.Tensor, d: int) -> torch.Tensor:
    """``x`` cut to ``index``'s sizes outside ``d`` (gather reads only that part): a view."""
    size = list(index.shape)
    size[d] = x.shape[d]
    if size == list(x.shape):
        return x
    return x.as_strided(size, x.stride(), x.storage_offset())


def _fused_forward(
    plan: _Fused, x: torch.Tensor, index: torch.Tensor, dim: int, mode: str, fill: int, site: int
) -> torch.Tensor:
    """Run the kernel for ``plan``; raise (mode raise) after its one sync. No autograd."""
    if plan.n == 0 and mode in ("clip", "wrap", "deferred"):
        raise IndexOutOfBoundsError(
            _oob_message(int(index.reshape(-1)[0]), plan.d, 0)
            + f" (mode={mode!r} cannot map an index into an empty dimension)"
        )
    xd = x.detach() if x.requires_grad else x
    out = torch.empty(plan.shape, dtype=x.dtype, device=x.device)
    if plan.op == "gather":
        form, xk, kidx = _triton_index.GATHER, _restricted(xd, index, plan.d), index
    else:
        form, xk, kidx = _triton_index.TAKE, xd, index.reshape(-1)
    # The kernel on these operands; each mode adds its record buffers.
    code = _triton_index.MODES[mode]
    launch = functools.partial(
        _triton_index.launch, xk, kidx, out, form=form, d=plan.d, lo=plan.lo, mode=code
    )
    if mode == "raise":
        rec, flag = _raise_buffer(x.device)
        call = next(_call_ids)
        launch(rec=rec, flag=flag, call_id=call)
        bad, pending = rec[:2].tolist()  # the one host sync
        if bad == call:
            _raise_fused_error(plan, x, index, dim)
        if pending:
            raise_deferred()  # recorded earlier by mode="deferred": it surfaces here
        return out
    if mode == "deferred":
        # Under the lock: the torch path replaces the record under it, and the kernel must
        # write into the record that is current (the fused kernel writes in place).
        with _deferred.lock:
            rec = _device_state(x.device)
            launch(rec=rec, call_id=next(_call_ids), dim_no=plan.d, site=site)
        return out
    # clip / wrap / fill record nothing: the index stands in for the unused record pointers
    launch(rec=kidx, fill_bits=fill)
    return out


def _raise_fused_error(plan: _Fused, x: torch.Tensor, index: torch.Tensor, dim: int) -> None:
    """The kernel saw an out-of-range index: raise CPU torch's error for the same call."""
    if plan.op == "getitem":
        args: Tuple[Any, ...] = ((_FULL,) * plan.d + (index,) if plan.d else index,)
        _raise_like_cpu(_getitem, x, *args)
    else:
        _raise_like_cpu(_SELECT_OPS[plan.op], x, dim, index)
    # CPU torch accepts the call (not expected with a non-empty output): keep safetorch's own
    raise IndexOutOfBoundsError(_oob_message(_first_bad(index, plan.lo, plan.n), plan.d, plan.n))


def _safe_index(
    index: torch.Tensor, lo: int, n: int, mode: str
) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """The index the kernel read through, with torch ops (backward only), and the
    out-of-range mask for fill / deferred: the torch path's own mapping."""
    if mode == "raise":
        return index, None  # validated before anything was returned
    if mode in ("clip", "wrap"):
        return _transform(index, lo, n, mode), None
    bad = _out_of_range(index, lo, n)
    return _zero_bad(index, bad), bad


def _fused_backward(
    op: str, dim: int, mode: str, x_shape: Sequence[int], index: torch.Tensor, grad: torch.Tensor
) -> torch.Tensor:
    """The gradient of ``x``: torch's own backward ops on the index the kernel read."""
    nd = len(x_shape)
    d = dim % nd
    n = x_shape[d]
    zeros = grad.new_zeros(tuple(x_shape))
    if n == 0:
        return zeros  # fill into an empty dimension: nothing was read
    safe, bad = _safe_index(index, -n if op == "getitem" else 0, n, mode)
    if mode == "fill":
        assert bad is not None  # filled positions read nothing: they get no gradient
        if op == "index_select":
            bad = bad.reshape([1] * d + [-1] + [1] * (nd - d - 1))
        elif op == "getitem":
            bad = bad.reshape([1] * d + list(bad.shape) + [1] * (nd - d - 1))
        grad = grad.masked_fill(bad, 0)
    if op == "gather":
        return zeros.scatter_add(d, safe, grad)  # gather's backward
    if op == "index_select":
        return zeros.index_add(d, safe.reshape(-1), grad)  # index_select's backward
    return torch.ops.aten.index_put(zeros, [None] * d + [safe], grad, True)  # x[idx]'s


class _FusedIndex(torch.autograd.Function):
    """The fused kernel in eager mode when ``x`` requires grad."""

    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        index: torch.Tensor,
        plan: _Fused,
        dim: int,
        mode: str,
        fill: int,
        site: int,
    ) -> torch.Tensor:
        ctx.save_for_backward(index)
        ctx.info = (plan.op, plan.d, mode, tuple(x.shape))
        return _fused_forward(plan, x, index, dim, mode, fill, site)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Tuple[Optional[torch.Tensor], ...]:
        (index,) = ctx.saved_tensors
        op, d, mode, x_shape = ctx.info
        return (_fused_backward(op, d, mode, x_shape, index, grad),) + (None,) * 6


def _fused_call(
    op: str, x: torch.Tensor, index: Any, dim: int, mode: str, fill_value: Any
) -> Optional[torch.Tensor]:
    """The call through the fused kernel, or None when it is not covered."""
    plan = _fused_plan(op, x, index, dim)
    if plan is None:
        return None
    if _compat.tracing():
        # raise / deferred inside the graph as one opaque op (where the torch path's own ops
        # are, see _route); clip / wrap / fill are plain tensor ops on the torch path, which
        # the compiler fuses by itself.
        if _fused_op is None or _route() != _OPS or mode not in ("raise", "deferred"):
            return None
        return _fused_op(x, index, op, dim, mode)
    fill = 0
    if mode == "fill":
        bits = _fill_bits(fill_value, x.dtype)
        if bits is None:
            return None
        fill = bits
    site = _call_site() if mode == "deferred" else 0
    if x.requires_grad and torch.is_grad_enabled():
        out: torch.Tensor = _FusedIndex.apply(x, index, plan, dim, mode, fill, site)
        return out
    return _fused_forward(plan, x, index, dim, mode, fill, site)


def _fused_getitem(x: torch.Tensor, index: Any, mode: str, fill_value: Any) -> Optional[Any]:
    """``x[index]`` through the fused kernel when ``index`` is one integer tensor, alone or
    after full slices (``x[:, idx]``); None otherwise."""
    if isinstance(index, _Tensor):
        t, d = index, 0
    elif (
        type(index) is tuple
        and index
        and isinstance(index[-1], _Tensor)
        and all(type(it) is slice and it == _FULL for it in index[:-1])
    ):
        t, d = index[-1], len(index) - 1
        if d >= x.dim():
            return None
    else:
        return None
    return _fused_call("getitem", x, t, d, mode, fill_value)


# Under torch.compile: one custom op (torch >= 2.4) runs the kernel with real values every
# time the graph runs, raising or recording as in eager mode; its backward is torch's ops.
def _fused_op_eager(x: torch.Tensor, index: torch.Tensor, op: str, dim: int, mode: str) -> Any:
    plan = _fused_plan(op, x, index, dim)
    if plan is None:  # a shape the trace did not see (dynamic shapes): the torch path
        from safetorch.tensor import checked_index, gather, index_select

        checked_mode = cast(IndexMode, mode)  # the op's schema takes a str
        if op == "getitem":
            return checked_index(x, (_FULL,) * dim + (index,), mode=checked_mode, check="always")
        public = index_select if op == "index_select" else gather
        return public(x, dim, index, mode=checked_mode, check="always")
    key = _COMPILED_SITE_KEY
    site = _site_id(key, f"{key[0]} {key[2]}") if mode == "deferred" else 0
    return _fused_forward(plan, x, index, dim, mode, 0, site)


def _fused_op_fake(x: torch.Tensor, index: torch.Tensor, op: str, dim: int, mode: str) -> Any:
    nd = x.dim()
    d = dim % nd
    if op == "gather":
        shape: Tuple[Any, ...] = tuple(index.shape)
    elif op == "index_select":
        shape = (*x.shape[:d], index.numel(), *x.shape[d + 1 :])
    else:
        shape = (*x.shape[:d], *index.shape, *x.shape[d + 1 :])
    return x.new_empty(shape)


def _fused_op_setup(ctx: Any, inputs: Tuple[Any, ...], output: Any) -> None:
    x, index, op, dim, mode = inputs
    ctx.save_for_backward(index)
    ctx.info = (op, dim, mode, tuple(x.shape))


def _fused_op_backward(ctx: Any, grad: torch.Tensor) -> Tuple[Optional[torch.Tensor], ...]:
    (index,) = ctx.saved_tensors
    op, dim, mode, x_shape = ctx.info
    return (_fused_backward(op, dim, mode, x_shape, index, grad),) + (None,) * 4


_fused_op: Optional[Any] = None


def _register_fused_op() -> None:
    global _fused_op
    op = torch.library.custom_op(
        "safetorch::fused_index",
        _fused_op_eager,
        mutates_args=(),
        schema="(Tensor x, Tensor index, str op, int dim, str mode) -> Tensor",
    )
    op.register_fake(_fused_op_fake)
    op.register_autograd(_fused_op_backward, setup_context=_fused_op_setup)
    _fused_op = op


if _compat.HAS_CUSTOM_OP and _compat.HAS_TRITON:
    _register_fused_op()
