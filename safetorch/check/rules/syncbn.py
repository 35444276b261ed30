"""``convert_sync_batchnorm`` outside a distributed condition (ST014): the ``syncbn`` patch's
pitfall.
"""

from __future__ import annotations

import ast
from typing import List, Tuple

from safetorch.check.engine import Context
from safetorch.check.rules._b1_guards import DIST_WORDS, GPU_WORDS, guarded_before, mentions
from safetorch.check.rules._base import Rule
from safetorch.check.rules._helpers import NN, Pos, end_of, start_of, torch_at_least

# ST014 takes a test of the GPU count as a distributed decision too (``if n_gpu > 1:``).
_WORDS = DIST_WORDS + GPU_WORDS


class ConvertSyncBatchNorm(Rule):
    """ST014: ``nn.SyncBatchNorm.convert_sync_batchnorm`` outside a distributed condition.

    torch's conversion is unconditional. The converted layers raise in training on CPU
    input under a process group with more than one process (gloo: "SyncBatchNorm expected
    input tensor to be on GPU"), and a ``process_group`` given at conversion must be the one
    DDP uses. On torch < 2.0 they also raise without any process group (single-GPU runs, CPU
    tests); torch 2.0 (pytorch/pytorch#89706) falls back to plain BatchNorm there, so the
    message mentions it only when ``[tool.safetorch] min-torch-version`` is below 2.0 or
    unset.

    Quiet when the call is guarded by a distributed condition: an ``if`` around it
    (``if opt.sync_bn and RANK != -1:``, ``if dist.is_initialized():``,
    ``... if args.distributed else model``), an ``assert`` before it in the same function
    (``assert args.distributed``, ``assert dist.is_initialized()``, ``assert world_size > 1``)
    or an early exit before it (``if not args.distributed: return model``).

    Fix (manual): ``st.convert_sync_batchnorm``, which follows the process group (a no-op
    without one) and picks a layer that runs on each device.

    safetorch: ``st.convert_sync_batchnorm``.
    """

    code = "ST014"

    preview = True  # below 97% on the held-out corpus half (docs/check.md)

    name = "torch-syncbn-device"
    torch_symbols = (NN + "SyncBatchNorm.convert_sync_batchnorm",)
    node_types = (ast.Call, ast.If, ast.IfExp)

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self._guards: List[Tuple[Pos, Pos]] = []  # extents guarded by a distributed test
        self._calls: List[Tuple[ast.Call, ast.AST]] = []  # (call, its scope)

    def visit(self, node: ast.AST) -> None:
        if isinstance(node, (ast.If, ast.IfExp)):
            if mentions(self.ctx, node.test, _WORDS):
                body = node.body if isinstance(node.body, list) else [node.body]
                self._guards.append((start_of(body[0]), end_of(body[-1])))
                # if not distributed: ... else: convert(...) is guarded too
                orelse = node.orelse if isinstance(node.orelse, list) else [node.orelse]
                if orelse:
                    self._guards.append((start_of(orelse[0]), end_of(orelse[-1])))
        elif isinstance(node, ast.Call):
            if self.ctx.qualname(node.func) == NN + "SyncBatchNorm.convert_sync_batchnorm":
                self._calls.append((node, self.ctx.scope))

    def finish(self) -> None:
        for call, scope in self._calls:
            if any(lo <= start_of(call) <= hi for lo, hi in self._guards):
                continue
            body = getattr(scope, "body", None)
            if isinstance(body, list) and guarded_before(self.ctx, body, start_of(call)):
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
