"""An argparse positional with ``default=`` but no ``nargs="?"`` (ST007)."""

from __future__ import annotations

import ast
from typing import Dict, List, Optional, Set, Tuple

from safetorch.check.engine import Context, Fix
from safetorch.check.rules._base import Rule
from safetorch.check.rules._helpers import (
    FUNCTION_DEFS,
    add_keywords,
    call_name,
    find_keyword,
    has_double_star,
    has_star,
)

# Parser constructors: ``argparse.ArgumentParser(...)``, ``subparsers.add_parser(...)``.
_PARSER_MAKERS = ("ArgumentParser", "add_parser")
# Calls that return a group whose arguments land on the parser it is called on.
_GROUP_MAKERS = frozenset({"add_argument_group", "add_mutually_exclusive_group"})
# Calls that build a path or a name the script can use as it is.
_VALUE_CALLS = frozenset(
    {"os.path.join", "os.getcwd", "os.path.expanduser", "os.path.abspath", "os.path.dirname"}
    | {"pathlib.Path", "os.path.realpath"}
)
# Strings that say "no value": the script cannot run on them.
_SENTINELS = frozenset({"", "none", "null", "nil"})
_Key = int  # the parser: id() of the call that makes it


class PositionalWithDefault(Rule):
    """ST007: an argparse positional argument with a usable ``default=`` that is still
    required.

    A positional argument is required unless ``nargs`` is ``"?"`` or ``"*"``, whatever its
    ``default``: ``parser.add_argument("config", default="configs/base.yaml")`` still fails
    with ``error: the following arguments are required: config`` when it is left out.

    Reported only where the default is a value the script would use (not ``None``, ``""``
    or ``"none"``, which mark an argument the script cannot run without, and not a value
    outside ``choices=``) and where ``nargs="?"`` would change no command line that works
    now: the argument is the only positional of a parser made in this file (no other
    positional, no subparsers, no ``parents=``, the parser not passed to code that could add
    one). With a second positional, argparse binds ``a --flag v b`` differently once one of
    them is optional (``b`` becomes an unrecognized argument). An argument that already has
    ``nargs`` is left alone.

    Fix (automatic, safe): add ``nargs="?"``, which makes the argument optional and uses the
    default when it is missing. Every command line that worked before means the same.

    safetorch: none (a plain argparse pitfall, common in training scripts).
    """

    code = "ST007"

    name = "positional-with-default"
    torch_symbols = ()
    fixable = True
    node_types = (ast.Call,)
    # Held-out half: 80.0% of 5 (its first false positive, tenth batch), below 97% (docs/check.md).
    preview = True

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self._calls: List[Tuple[ast.Call, ast.AST]] = []  # (add_argument call, its scope)
        self._escaping: Set[_Key] = set()  # parsers other code may add positionals to

    def visit(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in ("add_argument", "add_subparsers"):
            self._calls.append((node, self.ctx.scope))

    def finish(self) -> None:
        if not self._calls:
            return
        makers = self._parser_assignments()
        # Every call that adds to a parser, per parser: None for a parser we cannot follow.
        adds: Dict[Optional[_Key], List[ast.Call]] = {}
        for call, scope in self._calls:
            assert isinstance(call.func, ast.Attribute)
            adds.setdefault(self._lookup(call.func.value, scope, makers), []).append(call)
        for parser, calls in adds.items():
            if parser is None or parser in self._escaping:
                continue
            positionals = [c for c in calls if _maybe_positional(c)]
            if len(positionals) == 1:
                self._judge(positionals[0])

    # -- which parser --------------------------------------------------------------------
    def _parser_assignments(self) -> Dict[Tuple[int, str], Optional[_Key]]:
        """(id of scope, name) -> the parser (or group's parser) the name is bound to there;
        None where it is bound twice or to something else. Also collects the parsers that
        escape (passed to other code, given ``parents=``, used as a parent)."""
        found: Dict[Tuple[int, str], Optional[_Key]] = {}
        tree = self.ctx.tree
        scopes = [tree, *(n for n in self.ctx.walk(tree) if isinstance(n, FUNCTION_DEFS))]
        for scope in scopes:
            assigns = [n for n in self._own_nodes(scope) if isinstance(n, ast.Assign)]
            for node in sorted(assigns, key=lambda n: (n.lineno, n.col_offset)):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        key = (id(scope), target.id)
                        made = self._made_parser(node.value, scope, found)
                        found[key] = made if key not in found else None
        for scope in scopes:
            for sub in self._own_nodes(scope):
                if isinstance(sub, ast.Call):
                    self._note_escapes(sub, scope, found)
        return found

    def _own_nodes(self, scope: ast.AST) -> List[ast.AST]:
        """Nodes of ``scope`` outside its nested functions and classes."""
        out: List[ast.AST] = []
        stack = list(ast.iter_child_nodes(scope))
        while stack:
            node = stack.pop()
            if isinstance(node, (*FUNCTION_DEFS, ast.ClassDef, ast.Lambda)):
                continue
            out.append(node)
            stack.extend(ast.iter_child_nodes(node))
        return out

    def _made_parser(
        self, value: ast.AST, scope: ast.AST, found: Dict[Tuple[int, str], Optional[_Key]]
    ) -> Optional[_Key]:
        if not isinstance(value, ast.Call):
            return None
        name = call_name(value.func)
        if name.endswith(_PARSER_MAKERS):
            if find_keyword(value, "parents") is not None:
                return None  # its parents' positionals are not in view
            return id(value)
        if name in _GROUP_MAKERS and isinstance(value.func, ast.Attribute):
            return self._lookup(value.func.value, scope, found)
        return None

    def _lookup(
        self, receiver: ast.AST, scope: ast.AST, found: Dict[Tuple[int, str], Optional[_Key]]
    ) -> Optional[_Key]:
        if isinstance(receiver, ast.Call):
            return self._made_parser(receiver, scope, found)
        if not isinstance(receiver, ast.Name):
            return None
        key = (id(scope), receiver.id)
        if key in found:
            return found[key]
        return found.get((id(self.ctx.tree), receiver.id))  # a module-level parser

    def _note_escapes(
        self, call: ast.Call, scope: ast.AST, found: Dict[Tuple[int, str], Optional[_Key]]
    ) -> None:
        """A parser passed to other code (``add_model_args(parser)``, ``parents=[parser]``)
        may get more positionals there."""
        for arg in [*call.args, *(kw.value for kw in call.keywords)]:
            if isinstance(arg, ast.Starred):
                arg = arg.value
            names = arg.elts if isinstance(arg, (ast.List, ast.Tuple)) else [arg]
            for name in names:
                if isinstance(name, ast.Name):
                    parser = self._lookup(name, scope, found)
                    if parser is not None:
                        self._escaping.add(parser)

    # -- the finding -----------------------------------------------------------------------
    def _judge(self, node: ast.Call) -> None:
        if not isinstance(node.func, ast.Attribute) or node.func.attr != "add_argument":
            return
        if (
            has_double_star(node)
            or len(node.args) != 1
            or not isinstance(node.args[0], ast.Constant)
        ):
            return
        dest = node.args[0].value
        if not isinstance(dest, str):
            return
        default = find_keyword(node, "default")
        if default is None or find_keyword(node, "nargs") is not None:
            return
        if find_keyword(node, "required") is not None:
            return
        action = find_keyword(node, "action")
        if action is not None and not (
            isinstance(action.value, ast.Constant) and action.value.value == "store"
        ):
            return
        shown = self._usable_default(default.value, node)
        if shown is None:
            return
        edit = add_keywords(self.ctx, node, 'nargs="?"')
        fix = None if edit is None else Fix('add nargs="?"', (edit,))
        self.report(
            node,
            f'positional argument "{dest}" has default={shown} but is still required '
            f'("the following arguments are required: {dest}"): add nargs="?" to use the '
            "default when it is left out",
            fix,
        )

    def _usable_default(self, value: ast.expr, call: ast.Call) -> Optional[str]:
        """The default as written when it is a value the script can run on, else None."""
        resolved = self._module_constant(value) if isinstance(value, ast.Name) else value
        if isinstance(resolved, ast.Constant):
            v = resolved.value
            if v is None or v is Ellipsis:
                return None
            if isinstance(v, str) and v.strip().lower() in _SENTINELS:
                return None
            if not isinstance(v, (str, int, float)):
                return None
            choices = find_keyword(call, "choices")
            if choices is not None and isinstance(choices.value, (ast.List, ast.Tuple, ast.Set)):
                options = [e.value for e in choices.value.elts if isinstance(e, ast.Constant)]
                if len(options) == len(choices.value.elts) and v not in options:
                    return None
            return self.ctx.segment(value)
        if isinstance(resolved, ast.JoinedStr) and any(
            isinstance(p, ast.Constant) and p.value for p in resolved.values
        ):
            return self.ctx.segment(value)
        if isinstance(resolved, ast.Call) and self.ctx.qualname(resolved.func) in _VALUE_CALLS:
            return self.ctx.segment(value)
        return None

    def _module_constant(self, name: ast.Name) -> Optional[ast.AST]:
        """The value of a module-level name bound once, to a literal."""
        bound = [
            stmt.value
            for stmt in self.ctx.tree.body
            if isinstance(stmt, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == name.id for t in stmt.targets)
        ]
        if len(bound) == 1 and isinstance(bound[0], (ast.Constant, ast.JoinedStr)):
            return bound[0]
        return None


def _maybe_positional(call: ast.Call) -> bool:
    """Whether the call may add a positional: ``add_subparsers``, or ``add_argument`` whose
    first name is not an option string (or cannot be read)."""
    if not isinstance(call.func, ast.Attribute) or call.func.attr == "add_subparsers":
        return True
    if has_star(call) or not call.args:
        return True
    first = call.args[0]
    if not (isinstance(first, ast.Constant) and isinstance(first.value, str)):
        return True
    return not first.value or first.value[0] not in "-+"
