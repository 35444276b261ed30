"""``convert_sync_batchnorm`` outside a distributed condition (ST014): the ``syncbn`` patch's
pitfall.
"""

from __future__ import annotations

import ast
from typing import List, Tuple

from safetorch.check.engine import Context
from safetorch.check.rules._base import Rule
from safetorch.check.rules._helpers import NN, Pos, end_of, start_of, torch_at_least

# Names whose presence in a condition says the code is deciding about distributed training.
_DIST_WORDS: Tuple[str, ...] = ("sync_bn", "syncbn", "sync_batchnorm", "distributed", "ddp")
_DIST_WORDS += ("world_size", "rank", "is_initialized", "n_gpu", "ngpu", "num_gpus")
_DIST_WORDS += ("device_count", "gpus")


def _mentions_distributed(ctx: Context, test: ast.AST) -> bool:
    for sub in ctx.walk(test):
        word = sub.id if isinstance(sub, ast.Name) else getattr(sub, "attr", None)
        if word is None and isinstance(sub, ast.Constant) and isinstance(sub.value, str):
            word = sub.value
        if isinstance(word, str) and any(w in word.lower() for w in _DIST_WORDS):
            return True
    return False


class ConvertSyncBatchNorm(Rule):
    """ST014: ``nn.SyncBatchNorm.convert_sync_batchnorm`` outside a distributed condition.

    torch's conversion is unconditional. The converted layers raise in training on CPU
    input under a process group with more than one process (gloo: "SyncBatchNorm expected
    input tensor to be on GPU"), and a ``process_group`` given at conversion must be the one
    DDP uses. On torch < 2.0 they also raise without any process group (single-GPU runs, CPU
    tests); torch 2.0 (pytorch/pytorch#89706) falls back to plain BatchNorm there, so the
    message mentions it only when ``[tool.safetorch] min-torch-version`` is below 2.0 or
    unset.

    Quiet when the call is guarded by a distributed condition
    (``if opt.sync_bn and RANK != -1:``, ``if dist.is_initialized():``,
    ``... if args.distributed else model``).

    Fix (manual): ``st.convert_sync_batchnorm``, which follows the process group (a no-op
    without one) and picks a layer that runs on each device.

    safetorch: ``st.convert_sync_batchnorm``.
    """

    code = "ST014"

    name = "torch-syncbn-device"
    torch_symbols = (NN + "SyncBatchNorm.convert_sync_batchnorm",)
    node_types = (ast.Call, ast.If, ast.IfExp)

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self._guards: List[Tuple[Pos, Pos]] = []  # extents guarded by a distributed test
        self._calls: List[ast.Call] = []

    def visit(self, node: ast.AST) -> None:
        if isinstance(node, (ast.If, ast.IfExp)):
            if _mentions_distributed(self.ctx, node.test):
                body = node.body if isinstance(node.body, list) else [node.body]
                self._guards.append((start_of(body[0]), end_of(body[-1])))
                # if not distributed: ... else: convert(...) is guarded too
                orelse = node.orelse if isinstance(node.orelse, list) else [node.orelse]
                if orelse:
                    self._guards.append((start_of(orelse[0]), end_of(orelse[-1])))
        elif isinstance(node, ast.Call):
            if self.ctx.qualname(node.func) == NN + "SyncBatchNorm.convert_sync_batchnorm":
                self._calls.append(node)

    def finish(self) -> None:
        for call in self._calls:
            if any(lo <= start_of(call) <= hi for lo, hi in self._guards):
                continue
            older = (
                ""
                if torch_at_least(self.ctx, 2, 0)
                else " (and on torch < 2.0 also without a process group)"
            )
            self.report(
                call,
                "nn.SyncBatchNorm.convert_sync_batchnorm converts unconditionally: the "
                "converted layers raise in training on CPU under a gloo process group"
                f"{older}: guard it with the distributed condition or use "
                "st.convert_sync_batchnorm",
            )
