"""``nn.DataParallel`` (ST013)."""

from __future__ import annotations

import ast
from typing import List, Set

from safetorch.check.engine import Context
from safetorch.check.rules._base import Rule
from safetorch.check.rules._helpers import FUNCTION_DEFS, NN
from safetorch.check.rules._wrapped import KEY_ONLY_ATTRS, made_for_its_keys, statements_with_branch


class DataParallelUsed(Rule):
    """ST013: ``nn.DataParallel``.

    DataParallel runs one process with a thread per GPU: the GIL, re-broadcasting the model
    every step and gathering every output on ``cuda:0`` make it slower than
    DistributedDataParallel even on a single machine, and ``cuda:0`` runs out of memory
    first. Its state_dict keys are prefixed with ``module.``. Not reported where the wrapper
    is made only for those keys (``nn.DataParallel(model).state_dict()``, or an unconditional
    ``m = nn.DataParallel(model)`` used only for ``m.state_dict()``): a conversion script or a
    test of prefix handling, which never runs it.

    Fix (manual): ``torch.nn.parallel.DistributedDataParallel`` (one process per GPU).

    safetorch: ``st.unwrap_model`` for saving either wrapper's weights.
    """

    code = "ST013"

    name = "data-parallel"
    uses = "st.unwrap_model"
    torch_symbols = (NN + "DataParallel",)
    node_types = (ast.Call, ast.Attribute)

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self._calls: List[ast.Call] = []
        self._for_keys: Set[int] = set()

    def visit(self, node: ast.AST) -> None:
        if isinstance(node, ast.Attribute):
            # nn.DataParallel(model).state_dict(): made for its prefixed keys, not to run
            if node.attr in KEY_ONLY_ATTRS and isinstance(node.value, ast.Call):
                self._for_keys.add(id(node.value))
        elif isinstance(node, ast.Call) and self.ctx.qualname(node.func) == NN + "DataParallel":
            self._calls.append(node)

    def finish(self) -> None:
        if not self._calls:
            return
        scopes = [
            self.ctx.tree,
            *(n for n in self.ctx.walk(self.ctx.tree) if isinstance(n, FUNCTION_DEFS)),
        ]
        for scope in scopes:
            for stmt, branch in statements_with_branch(scope.body):
                if isinstance(stmt, ast.Assign) and made_for_its_keys(self.ctx, stmt, branch):
                    self._for_keys.add(id(stmt.value))
        for call in self._calls:
            if id(call) in self._for_keys:
                continue
            self.report(
                call,
                "nn.DataParallel is slower than DistributedDataParallel and gathers on cuda:0: "
                "use DistributedDataParallel (st.unwrap_model to save its weights)",
            )
