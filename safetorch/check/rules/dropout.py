"""``F.dropout`` in ``forward`` without ``training=`` (ST016)."""

from __future__ import annotations

import ast
from typing import Dict, List, Optional, Union

from safetorch.check.engine import UNSAFE, Fix
from safetorch.check.rules._base import Rule
from safetorch.check.rules._helpers import (
    FUNCTIONAL,
    add_keywords,
    end_of,
    find_keyword,
    has_double_star,
    has_star,
    short_name,
    start_of,
)

# F.<name> -> its ``training`` default
_FUNCTIONAL_DROPOUTS: Dict[str, bool] = {
    FUNCTIONAL + "dropout": True,
    FUNCTIONAL + "dropout1d": True,
    FUNCTIONAL + "dropout2d": True,
    FUNCTIONAL + "dropout3d": True,
    FUNCTIONAL + "alpha_dropout": False,
    FUNCTIONAL + "feature_alpha_dropout": False,
}


def _training_branch(node: Union[ast.If, ast.IfExp], owner: str) -> List[Union[ast.stmt, ast.expr]]:
    """The statements (or expression) of ``node`` that run when ``owner.training`` is true."""

    def is_training(test: ast.AST) -> Optional[bool]:
        if (
            isinstance(test, ast.Attribute)
            and test.attr == "training"
            and isinstance(test.value, ast.Name)
            and test.value.id == owner
        ):
            return True
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            inner = is_training(test.operand)
            return None if inner is None else not inner
        if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
            if any(is_training(v) is True for v in test.values):
                return True
        return None

    positive = is_training(node.test)
    if positive is None:
        return []
    branch = node.body if positive else node.orelse
    return list(branch) if isinstance(branch, list) else [branch]


class FunctionalDropoutWithoutTraining(Rule):
    """ST016: ``F.dropout(x, p)`` inside ``forward`` without ``training=``.

    The functional form does not know whether the module is in train or eval mode:
    ``F.dropout``, ``dropout1d/2d/3d`` default to ``training=True`` and keep dropping in
    ``model.eval()`` (noisy, wrong validation and inference), while ``F.alpha_dropout`` and
    ``F.feature_alpha_dropout`` default to ``training=False`` and never drop at all.
    Reported in a method named ``forward`` when ``training`` is not passed, except for the
    ``training=True`` functions inside ``if self.training:`` (or ``... if self.training else
    ...``), which run only in training mode.

    Fix (unsafe, ``--unsafe-fixes``): add ``training=self.training``, which changes what
    the model computes in eval mode (on purpose). Or use an ``nn.Dropout`` module, which
    follows ``model.train()`` / ``model.eval()``.

    safetorch: none (``nn.Dropout`` is the safe spelling).
    """

    code = "ST016"

    preview = True  # 0 of 1 on the held-out corpus half, 0 of 1 on development: docs/check.md
    name = "functional-dropout-without-training"
    torch_symbols = ()  # nothing to route: only the call site knows self.training
    fixable = True
    fix_applicability = UNSAFE
    node_types = (ast.Call,)

    def visit(self, node: ast.Call) -> None:
        qual = self.ctx.qualname(node.func)
        if qual not in _FUNCTIONAL_DROPOUTS:
            return
        scope = self.ctx.scope
        if not (isinstance(scope, ast.FunctionDef) and scope.name == "forward"):
            return
        params = scope.args.posonlyargs + scope.args.args
        if not params or find_keyword(node, "training") is not None or len(node.args) > 2:
            return
        if has_double_star(node) or has_star(node):
            return
        owner = params[0].arg
        if _FUNCTIONAL_DROPOUTS[qual] and self._in_training_branch(scope, owner, node):
            return  # runs only in training, where training=True is right
        spelled = f"training={owner}.training"
        edit = add_keywords(self.ctx, node, spelled)
        fix = None if edit is None else Fix(f"add {spelled}", (edit,), UNSAFE)
        if _FUNCTIONAL_DROPOUTS[qual]:
            what = "keeps dropping in eval mode (training defaults to True)"
        else:
            what = "never drops, not even in training (training defaults to False)"
        self.report(
            node,
            f"{short_name(qual)} in forward without training= {what}: pass {spelled} "
            "or use an nn.Dropout module",
            fix,
        )

    def _in_training_branch(self, forward: ast.FunctionDef, owner: str, call: ast.Call) -> bool:
        """Whether ``call`` sits in the branch of ``if self.training:`` (or of
        ``... if self.training else ...``) that runs in training mode."""
        key = f"training_branches:{id(forward)}"
        spans = self.ctx.cache.get(key)
        if spans is None:
            spans = []
            for node in self.ctx.walk(forward):
                if isinstance(node, (ast.If, ast.IfExp)):
                    branch = _training_branch(node, owner)
                    if branch:
                        spans.append((start_of(branch[0]), end_of(branch[-1])))
            self.ctx.cache[key] = spans
        where = start_of(call)
        return any(lo <= where <= hi for lo, hi in spans)
