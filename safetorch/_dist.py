"""torch.distributed helpers: send rank 0's result to every rank without a collective.

Why not ``dist.broadcast_object_list``: gloo runs each collective on a worker thread, and a
finished work item keeps its tensors alive until the last (weak) reference to it is gone; a later
``barrier()`` holds one. The worker thread can then be the one that frees a tensor whose Python
object the caller already dropped, and freeing that Python object takes the GIL. If the main
thread holds the GIL while it waits for that worker, the process never exits: that is what
happens when a DDP model outlives ``destroy_process_group()``. The model's ``Reducer`` (a pybind11
class whose destructor keeps the GIL, pytorch/pytorch#56297) then drops the last reference to the
process group, and ``~ProcessGroupGloo`` joins its worker threads with the GIL held. Seen on torch
1.13.1 (gdb: main thread in ``Reducer::~Reducer -> ~ProcessGroupGloo -> thread::join``, worker in
``~AsyncBarrierWork -> ~AsyncBroadcastWork -> TensorImpl::~TensorImpl -> take_gil``); the
same teardown order also hung torch 2.8.0 (3 of 5 trials), so this is not gated on a release. The process group's key-value store needs no tensor
and no worker thread, on any backend and device, so safetorch's rank-0 results travel through it.

What travels is plain data only (None, bool, int, float, str, bytes, and lists, tuples, dicts
and sets of them): it is pickled without any global reference and read back by an unpickler that
refuses every global, so no rank ever runs code from the store.
"""

from __future__ import annotations

import io
import itertools
import pickle
from typing import Any, List

__all__: List[str] = []  # private module; used by safetorch.checkpoint

# One key per call. Every rank calls broadcast_from_rank0 in the same order (as with any
# collective), so the n-th call of each rank reads the n-th value rank 0 wrote.
_calls = itertools.count()
_KEY = "safetorch/rank0/{}"


class _PlainDataUnpickler(pickle.Unpickler):
    """Unpickles plain data only: any global (class, function) is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(
            f"refusing global {module}.{name}: only plain data is sent between ranks"
        )


def _loads(data: bytes) -> Any:
    return _PlainDataUnpickler(io.BytesIO(data)).load()


def _dumps(value: Any) -> bytes:
    data = pickle.dumps(value, protocol=4)
    _loads(data)  # the same check every other rank will make, here where the value came from
    return data


def initialized() -> bool:
    """Whether torch.distributed is available and its default process group is initialized
    (the one probe safetorch uses for "under torch.distributed").

    >>> initialized()
    False
    """
    import torch.distributed as dist

    return bool(dist.is_available() and dist.is_initialized())


def broadcast_from_rank0(value: Any) -> Any:
    """Return rank 0's ``value`` on every rank of the default process group.

    Call it on every rank (only rank 0's ``value`` is used). Rank 0 returns at once; the other
    ranks wait until rank 0 has called it, for at most the store's timeout (the process group's).

    Args:
        value: plain data (None, bool, int, float, str, bytes; lists, tuples, dicts, sets).

    Returns:
        rank 0's ``value`` (a copy on the other ranks).

    Raises:
        TypeError: on rank 0 when ``value`` is not plain data; the other ranks then raise
            RuntimeError naming it, rather than wait.
        RuntimeError: the store's timeout expired, or rank 0's value was not plain data.

    >>> broadcast_from_rank0({"path": "/ckpt/last.pt", "improved": True})  # no process group
    {'path': '/ckpt/last.pt', 'improved': True}
    """
    if not initialized():
        return value
    import torch.distributed as dist

    from safetorch import _compat

    store = _compat.default_store()
    key = _KEY.format(next(_calls))
    if dist.get_rank() == 0:
        try:
            data = _dumps(("ok", value))
        except Exception as exc:
            store.set(key, _dumps(("error", f"{type(exc).__name__}: {exc}")))  # type: ignore[arg-type]  # Store.set takes bytes at run time; its stub says str
            raise TypeError(
                f"rank 0's result ({type(value).__name__}) cannot be sent to the other ranks: "
                f"{exc}; only plain data (None, bool, int, float, str, bytes, lists, tuples, "
                "dicts, sets) can"
            ) from exc
        # Store.set takes a C++ std::string: bytes pass through unchanged (the stub says str).
        store.set(key, data)  # type: ignore[arg-type]  # Store.set takes bytes at run time; its stub says str
        return value
    kind, payload = _loads(store.get(key))
    if kind == "error":
        raise RuntimeError(f"rank 0's result could not be sent to this rank: {payload}")
    return payload
