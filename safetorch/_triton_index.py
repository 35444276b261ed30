"""Fused checked gathers: one Triton kernel reads each index once, tests it, records a
violation and gathers through a safe index, so no device-side assert can fire.

Only the kernel and its launch live here; which calls take this path, the deferred record's
owner and every message are :mod:`safetorch.tensor`'s. Triton is imported on first use, never
when safetorch is imported (``_compat.HAS_TRITON`` finds it without importing it).

Forms. The input is seen as ``[P, n, Q]`` around the indexed dimension ``d`` (``P`` the product
of the sizes before it, ``Q`` of those after it), the output as ``[P, K, Q]``:

* ``take``: ``out[p, k, q] = x[p, idx[k], q]``: ``x[idx]`` (one integer index tensor on
  dimension ``d``, after ``d`` full slices; valid ``-n <= i < n``) and ``index_select``
  (valid ``0 <= i < n``);
* ``gather``: ``out[p, k, q] = x[p, idx[p, k, q], q]`` (valid ``0 <= i < n``).

Every value moves as raw bits (``x`` is viewed as the integer type of its element size), so one
kernel per element size serves every dtype, bool and float8 included. Offsets are int64
throughout: a tensor past 2**31 elements is addressed correctly.

Records (``rec``: int64 device buffers; the host reads them only where safetorch syncs):

* raise: every program that meets an out-of-range index stores the call's id into ``rec[0]``
  (the same value from every thread: no atomic is needed); program 0 copies the device's
  deferred flag into ``rec[1]``. The caller reads both back with its one sync and compares
  ``rec[0]`` with the id, so the buffer is never reset.
* deferred: ``rec`` is the device's record ``[flag, value, dim, size, site, k0, k1, k2]``.
  The first call to record claims ``flag`` with a compare-and-swap of 0 to its id (the torch
  path writes 1, and ids start at 2, so a record is never overwritten by a later call); its
  programs then take the first out-of-range position with three atomic minimums of
  ``position << 22 | chunk``, each carrying a 22-bit (the last a 20-bit) chunk of the value:
  the minimum of each is the chunk of the same, first, position, so the value is rebuilt
  exactly without a lock.
"""

from __future__ import annotations

import math
import os
from typing import Any, Callable, Dict, Optional, Tuple

import torch

__all__: list = []  # private: safetorch.tensor is the only caller

TAKE, GATHER = 0, 1
RAISE, CLIP, WRAP, FILL, DEFERRED = 0, 1, 2, 3, 4
MODES: Dict[str, int] = {
    "raise": RAISE,
    "clip": CLIP,
    "wrap": WRAP,
    "fill": FILL,
    "deferred": DEFERRED,
}
#: Index dtypes every fused form takes (torch's own rule for x[idx], index_select, gather).
INDEX_DTYPES = frozenset({torch.int32, torch.int64})
#: The integer type each element size moves as.
BITS: Dict[int, torch.dtype] = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
NO_KEY = 2**63 - 1  # an unused chunk slot of the deferred record
RECORD_SLOTS = 8
_TILE = 1024  # elements per program
_NUM_WARPS = 4


def _interpret_requested() -> bool:
    # Triton's own reading of TRITON_INTERPRET (triton/knobs.py, env_bool).
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "on", "yes")


#: Whether Triton runs kernels in its interpreter (``TRITON_INTERPRET=1``): then the kernel
#: runs on CPU tensors, which is how the CUDA path is tested without a GPU.
INTERPRET: bool = _interpret_requested()

_kernel: Optional[Any] = None
_source: Optional[Callable[..., Any]] = None
_NOT_SPECIALIZED = ("n", "lo", "call_id", "fill_bits", "dim_no", "site")
tl: Any = None  # triton.language, bound by _define (the kernel's source names it as a global)


def _define() -> Callable[..., Any]:
    """Import triton and define the kernel's Python source (once per process)."""
    global tl, _source
    if _source is not None:
        return _source
    import triton.language as tl

    def fused_index_kernel(
        x_ptr,
        idx_ptr,
        out_ptr,
        rec_ptr,
        flag_ptr,
        R,  # rows of the output: P * K
        K,
        Q,
        n,
        lo,
        xs_p,
        xs_d,
        xs_q,
        is_p,
        is_k,
        is_q,
        NQ,  # programs along Q
        call_id,
        fill_bits,
        dim_no,
        site,
        MODE: tl.constexpr,
        FORM: tl.constexpr,
        HAS_P: tl.constexpr,
        BLOCK_R: tl.constexpr,
        BLOCK_Q: tl.constexpr,
    ):
        pid = tl.program_id(0)
        pid_r = pid // NQ
        pid_q = pid - pid_r * NQ
        r = pid_r.to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R).to(tl.int64)
        q = pid_q.to(tl.int64) * BLOCK_Q + tl.arange(0, BLOCK_Q).to(tl.int64)
        r_in = r < R
        inside = r_in[:, None] & (q < Q)[None, :]
        if HAS_P:
            p = r // K
            k = r - p * K
        else:
            p = r * 0
            k = r
        big = r * 0 + 4611686018427387904  # 2**62: no position reaches it
        if FORM == 1:  # gather: one index per output element
            i = tl.load(
                idx_ptr + p[:, None] * is_p + k[:, None] * is_k + q[None, :] * is_q,
                mask=inside,
                other=0,
            ).to(tl.int64)
            pos = r[:, None] * Q + q[None, :]
            live = inside
        else:  # take: one index per row, shared by its Q columns
            i = tl.load(idx_ptr + k * is_k, mask=r_in, other=0).to(tl.int64)[:, None]
            pos = k[:, None]
            live = r_in[:, None]
        bad = ((i < lo) | (i >= n)) & live
        if MODE == 1:  # clip: below the range -> 0 (numpy.take), above -> n - 1
            j = tl.where(i < lo, 0, tl.minimum(i, n - 1))
        elif MODE == 2:  # wrap: modulo n, into [0, n)
            j = i % n
        else:  # raise / fill / deferred: out-of-range positions read index 0 (or nothing)
            j = tl.where(bad, 0, i)
        j = tl.where(j < 0, j + n, j)
        x_off = p[:, None] * xs_p + j * xs_d + q[None, :] * xs_q
        if MODE == 0 or MODE == 3:  # raise / fill: never read through a bad index (n may be 0)
            v = tl.load(x_ptr + x_off, mask=inside & (bad == 0), other=0)
        else:
            v = tl.load(x_ptr + x_off, mask=inside, other=0)
        if MODE == 3:
            v = tl.where(bad, fill_bits.to(tl.int64).to(v.dtype), v)
        tl.store(out_ptr + r[:, None] * Q + q[None, :], v, mask=inside)
        if MODE == 0:
            call = call_id.to(tl.int64)
            tl.store(rec_ptr + pos * 0, pos * 0 + call, mask=bad)
            if pid == 0:
                tl.store(rec_ptr + 1, tl.load(flag_ptr))
        if MODE == 4:
            cand = tl.where(bad, pos, big[:, None])
            first = tl.min(tl.min(cand, axis=1), axis=0)
            if first < 4611686018427387904:
                lowest = -9223372036854775807 - 1
                value = tl.max(tl.max(tl.where(cand == first, i, lowest), axis=1), axis=0)
                call = call_id.to(tl.int64)
                owner = tl.atomic_cas(rec_ptr, call * 0, call)
                if (owner == 0) | (owner == call):
                    key = first << 22
                    tl.atomic_min(rec_ptr + 5, key | ((value >> 42) & 0x3FFFFF))
                    tl.atomic_min(rec_ptr + 6, key | ((value >> 20) & 0x3FFFFF))
                    tl.atomic_min(rec_ptr + 7, key | (value & 0xFFFFF))
                    tl.store(rec_ptr + 2, call * 0 + dim_no)
                    tl.store(rec_ptr + 3, call * 0 + n)
                    tl.store(rec_ptr + 4, call * 0 + site)

    _source = fused_index_kernel
    return fused_index_kernel


def kernel() -> Any:
    """The Triton kernel, ``triton.jit`` of its source (defined on first use)."""
    global _kernel
    if _kernel is None:
        import triton

        _kernel = triton.jit(_define(), do_not_specialize=list(_NOT_SPECIALIZED))
    return _kernel


def unpack_value(k0: int, k1: int, k2: int) -> int:
    """The int64 value the deferred record's three chunk keys carry (see the module doc)."""
    bits = ((k0 & 0x3FFFFF) << 42) | ((k1 & 0x3FFFFF) << 20) | (k2 & 0xFFFFF)
    return bits - (1 << 64) if bits >= 1 << 63 else bits


def _pnq(t: torch.Tensor, d: int) -> torch.Tensor:
    """``t`` as ``[P, n, Q]`` around dimension ``d``: a view where its strides allow one."""
    shape = t.shape
    size = (math.prod(shape[:d]), shape[d], math.prod(shape[d + 1 :]))
    try:
        return t.view(size)
    except RuntimeError:  # dimensions that no stride can merge: one copy of t
        return t.reshape(size)


def _bits(t: torch.Tensor) -> torch.Tensor:
    dtype = BITS[t.element_size()]
    return t if t.dtype == dtype else t.view(dtype)


def coverable(x: torch.Tensor) -> bool:
    """Whether the kernel can move ``x``'s elements (a strided, non-quantized tensor whose
    element is 1, 2, 4 or 8 bytes: every real dtype, bool, float8, complex32/64)."""
    return (
        x.layout == torch.strided
        and x.element_size() in BITS
        and not x.is_quantized
        and x.dim() > 0
    )


def launch(
    x: torch.Tensor,
    index: torch.Tensor,
    out: torch.Tensor,
    *,
    form: int,
    d: int,
    lo: int,
    mode: int,
    rec: torch.Tensor,
    flag: Optional[torch.Tensor] = None,
    call_id: int = 0,
    fill_bits: int = 0,
    dim_no: int = 0,
    site: int = 0,
) -> None:
    """Run the kernel: ``out`` (contiguous, ``[P, K, Q]`` elements) from ``x`` and ``index``.

    ``index`` is 1-D for ``take`` and has ``out``'s shape for ``gather``; for ``gather``,
    ``x`` is already restricted to ``index``'s sizes outside ``d``. ``rec``/``flag`` are the
    record buffers of the mode (see the module documentation); ``out`` must have at least one
    element. No host sync.
    """
    xv = _pnq(_bits(x.detach()), d)
    n = xv.shape[1]
    P, Q = xv.shape[0], xv.shape[2]
    if form == GATHER:
        iv = _pnq(index, d)
        K = iv.shape[1]
        is_p, is_k, is_q = iv.stride()
    else:
        iv = index
        K = index.shape[0]
        is_p, is_k, is_q = 0, index.stride(0), 0
    xs_p, xs_d, xs_q = xv.stride()
    block_q = min(1 << max(Q - 1, 0).bit_length(), _TILE)
    block_r = _TILE // block_q
    nq = -(-Q // block_q)
    rows = P * K
    grid = (-(-rows // block_r) * nq,)
    args: Tuple[Any, ...] = (xv, iv, _bits(out), rec, rec if flag is None else flag)
    args += (rows, K, Q, n, lo, xs_p, xs_d, xs_q, is_p, is_k, is_q, nq)
    args += (call_id, fill_bits, dim_no, site)
    run = kernel()[grid]
    options = dict(MODE=mode, FORM=form, HAS_P=P > 1, BLOCK_R=block_r, BLOCK_Q=block_q)
    # No floating-point arithmetic to fuse; saying so also keeps Triton >= 3.9 from warning.
    options.update(num_warps=_NUM_WARPS, enable_fp_fusion=False)
    if x.is_cuda and x.device.index != torch.cuda.current_device():
        with torch.cuda.device(x.device):  # Triton launches on the current device
            run(*args, **options)
        return
    run(*args, **options)


def fill_bits_of(value: Any, dtype: torch.dtype) -> Optional[int]:
    """``value`` in ``dtype``, as the signed integer of the same bits; None if torch refuses
    the scalar (the torch path then raises torch's own error)."""
    try:
        scalar = torch.full((), value, dtype=dtype)  # on the host: no device, no sync
    except (TypeError, RuntimeError, ValueError, OverflowError):
        return None
    bits: Any = scalar.view(BITS[scalar.element_size()]).tolist()  # a host read, no dispatch
    return int(bits)


def compile_for(
    arch: int = 90,
    *,
    mode: int = RAISE,
    form: int = TAKE,
    dtype: str = "i32",
    ints: str = "i32",
    has_p: bool = True,
    block_r: int = 8,
    block_q: int = 128,
) -> Tuple[str, ...]:
    """Compile the kernel ahead of time for an NVIDIA target (no GPU needed): the stages made.

    Lets CPU-only tests prove the kernel is valid Triton for a real GPU, which the interpreter
    (numpy semantics) cannot: a type mismatch in an atomic, say, fails only on a target. Run it
    without ``TRITON_INTERPRET`` (the interpreter patches ``triton.language`` in place).
    """
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.runtime.jit import JITFunction

    # A JITFunction of its own: under TRITON_INTERPRET, triton.jit makes an interpreted one.
    fn = JITFunction(_define(), do_not_specialize=list(_NOT_SPECIALIZED))
    sig = {name: ints for name in fn.arg_names}
    sig.update(x_ptr="*" + dtype, out_ptr="*" + dtype, idx_ptr="*i64")
    sig.update(rec_ptr="*i64", flag_ptr="*i64")
    constexprs = dict(MODE=mode, FORM=form, HAS_P=has_p, BLOCK_R=block_r, BLOCK_Q=block_q)
    sig.update({name: "constexpr" for name in constexprs})
    src = ASTSource(fn=fn, signature=sig, constexprs=constexprs)
    options = {"enable_fp_fusion": False, "num_warps": _NUM_WARPS}
    compiled = triton.compile(src, target=GPUTarget("cuda", arch, 32), options=options)
    return tuple(sorted(compiled.asm))
