"""An argparse positional with ``default=`` but no ``nargs="?"`` (ST007)."""

from __future__ import annotations

import ast

from safetorch.check.engine import Fix
from safetorch.check.rules._base import Rule
from safetorch.check.rules._helpers import add_keywords, find_keyword, has_double_star


class PositionalWithDefault(Rule):
    """ST007: an argparse positional argument with ``default=`` but no ``nargs="?"``.

    A positional argument is required unless ``nargs`` is ``"?"`` or ``"*"``, whatever its
    ``default``: ``parser.add_argument("configs", default="a.yaml")`` still fails with
    ``error: the following arguments are required: configs`` when it is left out.

    Fix (automatic, safe): add ``nargs="?"``, which makes the argument optional and uses the
    default when it is missing. Every command line that worked before means the same.

    safetorch: none (a plain argparse pitfall, common in training scripts).
    """

    code = "ST007"

    name = "positional-with-default"
    torch_symbols = ()
    fixable = True
    node_types = (ast.Call,)

    def visit(self, node: ast.Call) -> None:
        func = node.func
        if not (isinstance(func, ast.Attribute) and func.attr == "add_argument"):
            return
        if len(node.args) != 1 or has_double_star(node):
            return
        first = node.args[0]
        if not (isinstance(first, ast.Constant) and isinstance(first.value, str)):
            return
        dest = first.value
        if not dest or dest[0] in "-+" or find_keyword(node, "default") is None:
            return
        action = find_keyword(node, "action")
        if action is not None and not (
            isinstance(action.value, ast.Constant) and action.value.value == "store"
        ):
            return
        nargs = find_keyword(node, "nargs")
        fix = None
        if nargs is None:
            edit = add_keywords(self.ctx, node, 'nargs="?"')
            fix = None if edit is None else Fix('add nargs="?"', (edit,))
        elif not isinstance(nargs.value, ast.Constant) or nargs.value.value in ("?", "*"):
            return
        self.report(
            node,
            f'positional argument "{dest}" has default= but is still required '
            f'("the following arguments are required: {dest}"): add nargs="?"',
            fix,
        )
