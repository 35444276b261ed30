"""Whether a DataParallel wrapper is made only for its ``module.``-prefixed keys (ST011, ST013).

A conversion script or a test of prefix handling wraps a model to get or drop the prefix,
never to run it: both rules stay quiet there.
"""

from __future__ import annotations

import ast
from typing import Iterator, Sequence, Set, Tuple

from safetorch.check.engine import Context
from safetorch.check.rules._helpers import NN, bound_names, end_of, start_of, statements_in_order

# What a wrapper made only for its ``module.``-prefixed keys is used for.
KEY_ONLY_ATTRS = frozenset({"state_dict", "load_state_dict", "module"})


Branch = Tuple[Tuple[int, str], ...]


def statements_with_branch(
    body: Sequence[ast.stmt], branch: Branch = ()
) -> Iterator[Tuple[ast.stmt, Branch]]:
    """Like ``statements_in_order``, with the conditional branches each statement is in:
    ``((id(if), "body"), ...)``; a statement under no ``if``/``try``/loop has ``()``."""
    for stmt in body:
        yield stmt, branch
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        conditional = isinstance(stmt, (ast.If, ast.Try, ast.For, ast.AsyncFor, ast.While))
        conditional = conditional or type(stmt).__name__ == "Match"
        for name in ("body", "orelse", "finalbody", "handlers", "cases"):
            inner = getattr(stmt, name, None)
            if not isinstance(inner, list):
                continue
            here = branch + ((id(stmt), name),) if conditional and name != "finalbody" else branch
            for i, item in enumerate(inner):
                if isinstance(item, ast.stmt):
                    yield from statements_with_branch([item], here)
                elif hasattr(item, "body"):  # except handler, match case: one branch each
                    yield from statements_with_branch(item.body, here + ((id(item), str(i)),))


def only_for_its_keys(ctx: Context, scope: ast.AST, name: str, after: ast.stmt) -> bool:
    """Whether ``name``, bound at ``after`` to a wrapper, is used only for its state_dict keys
    afterwards in ``scope`` (``model.state_dict()``, ``.load_state_dict``, ``.module``): never
    called, trained or passed on."""
    start = end_of(after)
    nodes = ctx.walk(scope)
    stop = (10**9, 0)  # up to the next rebinding of the name
    for node in nodes:
        if isinstance(node, ast.Assign) and start_of(node) > start:
            if any(name in bound_names(t) for t in node.targets):
                stop = min(stop, end_of(node))
    key_uses = 0
    attribute_values: Set[int] = set()
    for node in nodes:
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if node.value.id == name and start < start_of(node) < stop:
                attribute_values.add(id(node.value))
                if node.attr not in KEY_ONLY_ATTRS:
                    return False
                key_uses += node.attr != "module"
    for node in nodes:
        if (
            isinstance(node, ast.Name)
            and node.id == name
            and isinstance(node.ctx, ast.Load)
            and start < start_of(node) < stop
            and id(node) not in attribute_values
        ):
            return False
    return key_uses > 0


# DataParallel arguments that do not change what the wrapper is made for.
PLACEMENT_KEYWORDS = frozenset({"device_ids", "output_device"})


def is_main_guard(test: ast.AST) -> bool:
    """``__name__ == "__main__"``."""
    return (
        isinstance(test, ast.Compare)
        and isinstance(test.left, ast.Name)
        and test.left.id == "__name__"
        and len(test.ops) == 1
        and isinstance(test.ops[0], ast.Eq)
        and is_const_str(test.comparators[0], "__main__")
    )


def is_const_str(node: ast.AST, value: str) -> bool:
    return isinstance(node, ast.Constant) and node.value == value


def runs_on_every_machine(ctx: Context, branch: Branch) -> bool:
    """Whether the branches a statement is in decide nothing about the machine: ``if
    __name__ == "__main__":``, a loop over literal constants, and ``if`` on that loop's
    variable (a test trying both: ``for wrap in [False, True]: if wrap:``)."""
    if not branch:
        return True
    nodes = ctx.cache.get("branch_nodes")
    if nodes is None:
        nodes = ctx.cache["branch_nodes"] = {
            id(n): n for n in ctx.walk(ctx.tree) if isinstance(n, (ast.If, ast.For))
        }
    literal_loop_names: Set[str] = set()
    for node_id, part in branch:
        node = nodes.get(node_id)
        if part != "body":
            return False
        if (
            isinstance(node, ast.For)
            and isinstance(node.target, ast.Name)
            and isinstance(node.iter, (ast.List, ast.Tuple))
            and all(isinstance(e, ast.Constant) for e in node.iter.elts)
        ):
            literal_loop_names.add(node.target.id)
        elif not isinstance(node, ast.If) or not (
            is_main_guard(node.test)
            or (isinstance(node.test, ast.Name) and node.test.id in literal_loop_names)
        ):
            return False
    return True


def made_for_its_keys(ctx: Context, stmt: ast.stmt, branch: Branch) -> bool:
    """``model = nn.DataParallel(model)`` made only to give its state_dict the ``module.``
    prefix (a conversion script, a test of prefix handling): DataParallel of the model alone
    (``device_ids=`` aside), not under a condition (a parallelism decision depends on the
    GPUs; ``if __name__ == "__main__":`` and a test's ``for wrap in [False, True]: if wrap:``
    decide nothing), and used afterwards only for its keys."""
    if not isinstance(stmt, ast.Assign) or len(stmt.targets) != 1:
        return False
    target, value = stmt.targets[0], stmt.value
    if not (isinstance(target, ast.Name) and isinstance(value, ast.Call)):
        return False
    if ctx.qualname(value.func) != NN + "DataParallel" or len(value.args) != 1:
        return False
    if any(kw.arg not in PLACEMENT_KEYWORDS for kw in value.keywords):
        return False
    if not runs_on_every_machine(ctx, branch):
        return False
    return only_for_its_keys(ctx, scope_of(ctx, stmt), target.id, stmt)


def scope_of(ctx: Context, stmt: ast.stmt) -> ast.AST:
    """The function (or the module) whose body holds ``stmt``."""
    scopes = ctx.cache.get("statement_scopes")
    if scopes is None:
        scopes = {}
        for fn in (
            ctx.tree,
            *(
                n
                for n in ctx.walk(ctx.tree)
                if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
            ),
        ):
            for inner in statements_in_order(fn.body):
                scopes[id(inner)] = fn
        ctx.cache["statement_scopes"] = scopes
    found: ast.AST = scopes.get(id(stmt), ctx.tree)
    return found
