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
import posixpath
from typing import Collection, FrozenSet, List, Optional, Sequence, Tuple

from safetorch.check.engine import Context
from safetorch.check.rules._helpers import (
    FUNCTION_DEFS,
    module_files,
    own_nodes,
    start_of,
    statements_in_order,
)

__all__ = ["batched_models", "made_by_batched_models"]

# Methods whose result has at least one dimension whatever their input has.
_AT_LEAST_1D = frozenset({"unsqueeze", "flatten", "unflatten"})
# torch functions whose result has at least one dimension.
_STACKING = frozenset({"cat", "stack", "hstack", "vstack", "concat", "concatenate"})


def _int_literal(node: ast.AST) -> bool:
    """``1``, ``-1``."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        node = node.operand
    return isinstance(node, ast.Constant) and type(node.value) is int


def _rebound_otherwise(fn: ast.AST, name: str) -> bool:
    """``name`` is bound in ``fn`` by more than plain ``name = value`` (a tuple target, a
    ``for`` or ``with`` target, ``:=``, ``+=``) or changed in place (``name.squeeze_()``)."""
    for node in ast.walk(fn):
        targets: List[ast.AST] = []
        if isinstance(node, ast.Assign):
            targets = [t for t in node.targets if not isinstance(t, ast.Name)]
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign, ast.For, ast.AsyncFor)):
            targets = [node.target]
        elif isinstance(node, ast.NamedExpr):
            targets = [node.target]
        elif isinstance(node, (ast.With, ast.AsyncWith)):
            targets = [i.optional_vars for i in node.items if i.optional_vars is not None]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr.endswith("_")
            and not node.func.attr.startswith("_")
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == name
        ):
            return True
        if any(isinstance(n, ast.Name) and n.id == name for t in targets for n in ast.walk(t)):
            return True
    return False


def _at_least_1d(expr: Optional[ast.AST], fn: ast.AST, before: int, depth: int = 0) -> bool:
    """``expr`` (returned by ``fn`` at line ``before``) is evidently a tensor of one dimension
    or more: ``x.view(1)``, ``x.view(n, -1)``, ``x.unsqueeze(0)``, ``torch.cat(...)``, or a
    name of ``fn`` bound only by plain assignments, the last one before of those. A single
    argument of ``view`` that is not a literal may be an empty shape or a dtype."""
    if depth > 3 or expr is None:
        return False
    if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute):
        attr, args = expr.func.attr, expr.args
        if attr in ("view", "reshape") and args:
            if any(isinstance(a, ast.Starred) for a in args):
                return False
            if len(args) >= 2:
                return True  # one argument per dimension
            (arg,) = args
            if isinstance(arg, (ast.Tuple, ast.List)):
                return len(arg.elts) >= 1 and not any(isinstance(e, ast.Starred) for e in arg.elts)
            return _int_literal(arg)
        if attr in _AT_LEAST_1D:
            return True
        owner = expr.func.value
        return attr in _STACKING and isinstance(owner, ast.Name) and owner.id == "torch"
    if isinstance(expr, ast.Name):
        if _rebound_otherwise(fn, expr.id):
            return False
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
    return [n for n in own_nodes(fn) if isinstance(n, ast.Return)]


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


def _class_file(ctx: Context, func: ast.AST, files: Collection[str]) -> Optional[Tuple[str, str]]:
    """(project file among ``files``, class name) of the class a call builds: a class of the
    file itself, ``from mod import C``, ``mod.C`` with ``import mod``; None where it is not
    resolved."""
    here = ctx.project.relpath(ctx.path)
    if isinstance(func, ast.Name):
        if any(isinstance(n, ast.ClassDef) and n.name == func.id for n in ctx.tree.body):
            return here, func.id
        qual = ctx.imports.get(func.id)
        module, _, name = (qual or "").rpartition(".")
    elif isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
        module, name = ctx.imports.get(func.value.id, ""), func.attr
    else:
        return None
    if not module or not name:
        return None
    found = [f for f in module_files(posixpath.dirname(here), module) if f in files]
    return (found[0], name) if found else None


def made_by_batched_models(ctx: Context, values: Sequence[ast.AST]) -> bool:
    """Every value a model name is bound to is an instance of such a class of the project,
    the class found where the file imports it from (``netD = dcgan.DCGAN_D(...)`` on one
    branch, ``mlp.MLP_D(...)`` on the other); a namesake elsewhere says nothing."""
    if not values or not all(isinstance(v, ast.Call) for v in values):
        return False
    facts = ctx.project_facts("ST020-batched", batched_models)
    for value in values:
        assert isinstance(value, ast.Call)  # checked above
        found = _class_file(ctx, value.func, facts)
        if found is None or found[1] not in facts.get(found[0], frozenset()):
            return False
    return True
