"""Run by test_nn_syncbn.py: free st.SyncBatchNorm outputs after ``destroy_process_group()``.

Usage: python _syncbn_teardown_worker.py DIR ROUNDS. Each round is a single-rank gloo process
group's whole lifetime in the order of issue 27: outputs of ``_SyncBatchNormFunction`` (one
never backwarded, one backwarded), ``destroy_process_group()`` right after backward's
``all_reduce``, and only then the outputs (and with them their autograd graphs) are freed.
Two ways this hung on Python 3.9 with torch 2.6.0, both a ``~ProcessGroupGloo`` joining gloo's
worker threads with the GIL held while a worker needs the GIL to free the Python object of a
collective's tensor: the group's last reference held by a graph and dropped inside a tensor
deallocation (the issue), and, once graphs no longer held it, ``destroy_process_group()`` itself
dropping it before the worker had let go of that last ``all_reduce`` (4 of 4 processes hung in
their first round until safetorch kept the collective's tensors alive). Each round also records
whether the group was still alive after ``destroy_process_group()`` (a weak reference), which
does not depend on timing. Writes DIR/result.json when every round is done; the caller's
timeout turns a hang into a failure.
"""

import gc
import json
import os
import sys
import weakref

import torch
import torch.distributed as dist

from safetorch.nn.syncbn import _SyncBatchNormFunction


def one_round(directory: str, r: int) -> bool:
    """One group lifetime; returns whether the group outlived ``destroy_process_group()``."""
    dist.init_process_group("gloo", init_method=f"file://{directory}/rdv{r}", rank=0, world_size=1)
    group = dist.group.WORLD
    x = torch.randn(6, 4, 3, requires_grad=True)
    weight = torch.rand(4, requires_grad=True)
    bias = torch.rand(4, requires_grad=True)
    rm, rv = torch.zeros(4), torch.ones(4)
    never_backwarded = _SyncBatchNormFunction.apply(x, weight, bias, rm, rv, 1e-5, 0.1, group)
    backwarded = _SyncBatchNormFunction.apply(x, weight, bias, rm, rv, 1e-5, 0.1, group)
    backwarded.sum().backward()
    alive = weakref.ref(group)
    del group
    dist.destroy_process_group()  # right after backward's all_reduce, as user code does
    outlived = alive() is not None
    del never_backwarded, backwarded  # the graphs go last, at once: the order that hung
    gc.collect()
    return outlived


if __name__ == "__main__":
    directory, rounds = sys.argv[1], int(sys.argv[2])
    outlived = [one_round(directory, r) for r in range(rounds)]
    with open(os.path.join(directory, "result.json"), "w") as fh:
        json.dump({"rounds": len(outlived), "group_outlived_destroy": sum(outlived)}, fh)
