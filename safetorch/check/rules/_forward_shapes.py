"""Models of the project whose ``forward`` evidently returns a tensor of one dimension or more
(ST020): ``errD.data[0]`` of such a model's output indexes a row, not a 0-dim value.

Standard library only, like the rest of ``safetorch.check``.

>>> import ast
>>> tree = ast.parse('''
... class Critic(nn.Module):
...     def forward(self, x):
...         out = self.main(x).mean(0)
...         return out.view(1)
... class Loss(nn.Module):
...     def forward(self, x):
...         return x.sum()
... ''')
>>> sorted(batched_models(tree, "models.py"))
['Critic']
"""

from __future__ import annotations

import ast
from typing import FrozenSet, List, Optional, Sequence

from safetorch.check.engine import Context
from safetorch.check.rules._helpers import FUNCTION_DEFS, start_of, statements_in_order

__all__ = ["batched_models", "made_by_batched_models"]

# Methods whose result has at least one dimension whatever their input has.
_AT_LEAST_1D = frozenset({"unsqueeze", "flatten", "unflatten"})
# torch functions whose result has at least one dimension.
_STACKING = frozenset({"cat", "stack", "hstack", "vstack", "concat", "concatenate"})


def _at_least_1d(expr: Optional[ast.AST], fn: ast.AST, before: int, depth: int = 0) -> bool:
    """``expr`` (returned by ``fn`` at line ``before``) is evidently a tensor of one dimension
    or more: ``x.view(1)``, ``x.view(n, -1)``, ``x.unsqueeze(0)``, ``torch.cat(...)``, or a
    name of ``fn`` last bound to one of those."""
    if depth > 3 or expr is None:
        return False
    if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute):
        attr, args = expr.func.attr, expr.args
        if attr in ("view", "reshape") and args:
            if any(isinstance(a, ast.Starred) for a in args):
                return False
            if len(args) == 1 and isinstance(args[0], (ast.Tuple, ast.List)):
                return len(args[0].elts) >= 1
            return True  # one argument per dimension: at least one
        if attr in _AT_LEAST_1D:
            return True
        return attr in _STACKING and isinstance(expr.func.value, ast.Name)
    if isinstance(expr, ast.Name):
        bound = [
            stmt.value
            for stmt in statements_in_order(getattr(fn, "body", []))
            if isinstance(stmt, ast.Assign)
            and start_of(stmt)[0] < before
            and any(isinstance(t, ast.Name) and t.id == expr.id for t in stmt.targets)
        ]
        return bool(bound) and _at_least_1d(bound[-1], fn, before, depth + 1)
    return False


def _returns(fn: ast.AST) -> List[ast.Return]:
    """``fn``'s own ``return`` statements (not those of functions nested in it)."""
    found: List[ast.Return] = []
    stack = list(getattr(fn, "body", []))
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Return):
            found.append(node)
        elif not isinstance(node, (*FUNCTION_DEFS, ast.ClassDef, ast.Lambda)):
            stack.extend(ast.iter_child_nodes(node))
    return found


def batched_models(tree: ast.Module, path: str) -> FrozenSet[str]:
    """Names of the module-level classes of a file whose ``forward`` returns, at every
    ``return``, a tensor of one dimension or more (a gather function for ``project_facts``)."""
    found = set()
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        forward = next(
            (m for m in node.body if isinstance(m, FUNCTION_DEFS) and m.name == "forward"), None
        )
        if forward is None:
            continue
        returns = _returns(forward)
        if returns and all(_at_least_1d(r.value, forward, r.lineno) for r in returns):
            found.add(node.name)
    return frozenset(found)


def made_by_batched_models(ctx: Context, values: Sequence[ast.AST]) -> bool:
    """Every value a model name is bound to is an instance of such a class of the project
    (``netD = dcgan.DCGAN_D(...)`` on one branch, ``mlp.MLP_D(...)`` on the other)."""
    if not values:
        return False
    names = {
        n for found in ctx.project_facts("ST020-batched", batched_models).values() for n in found
    }
    for value in values:
        if not isinstance(value, ast.Call):
            return False
        func = value.func
        called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if called not in names:
            return False
    return True
