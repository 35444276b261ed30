"""Small helpers shared by the rules: call arguments, edits, positions, names, scopes.

Typed with the ``ast`` node types they take and give; standard library only.
"""

from __future__ import annotations

import ast
import posixpath
from typing import FrozenSet, Iterator, List, Optional, Sequence, Set, Tuple, Union

from safetorch.check.engine import Context, Edit, Positioned, end_position

__all__ = [
    "FUNCTIONAL",
    "FUNCTION_DEFS",
    "NEWER_APIS",
    "NN",
    "FunctionNode",
    "Pos",
    "add_keywords",
    "bound_names",
    "call_arg",
    "call_name",
    "end_of",
    "find_keyword",
    "has_double_star",
    "has_star",
    "is_const",
    "literal_bool",
    "min_torch",
    "module_files",
    "not_a_module",
    "own_expressions",
    "own_nodes",
    "rename_call",
    "self_attr",
    "short_name",
    "start_of",
    "statements_in_order",
    "torch_at_least",
    "var_key",
]

#: The qualified-name prefixes of ``torch.nn.functional`` and ``torch.nn``.
FUNCTIONAL = "torch.nn.functional."
NN = "torch.nn."
#: A function definition node, and the node classes to test with ``isinstance``.
FunctionNode = Union[ast.FunctionDef, ast.AsyncFunctionDef]
FUNCTION_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef)
#: A (line, UTF-8 byte column) position: to compare and order nodes, not to show.
Pos = Tuple[int, int]


# -- calls -------------------------------------------------------------------------------------
def find_keyword(call: ast.Call, name: str) -> Optional[ast.keyword]:
    """The ``name=`` keyword of ``call``, or None."""
    for kw in call.keywords:
        if kw.arg == name:
            return kw
    return None


def has_double_star(call: ast.Call) -> bool:
    """Whether ``call`` passes ``**kwargs``."""
    return any(kw.arg is None for kw in call.keywords)


def has_star(call: ast.Call) -> bool:
    """Whether ``call`` passes ``*args``."""
    return any(isinstance(a, ast.Starred) for a in call.args)


def is_const(node: Optional[ast.AST], value: object) -> bool:
    """Whether ``node`` is the literal ``value`` (``True``, ``False``, ``None``)."""
    return isinstance(node, ast.Constant) and node.value is value


def call_arg(call: ast.Call, index: int, name: str) -> Optional[ast.expr]:
    """The argument at position ``index`` or passed as ``name=``, or None."""
    if len(call.args) > index:
        return call.args[index]
    kw = find_keyword(call, name)
    return None if kw is None else kw.value


# -- edits -------------------------------------------------------------------------------------
def add_keywords(ctx: Context, call: ast.Call, text: str) -> Optional[Edit]:
    """Insert ``text`` (``name=value, ...``) as the last argument(s) of ``call``."""
    items: List[Union[ast.expr, ast.keyword]] = [*call.args, *call.keywords]
    if not items:
        line, col = ctx.end(call)
        return Edit(line, col - 1, line, col - 1, text)  # right before ")"
    if any(isinstance(a, ast.GeneratorExp) for a in call.args) and len(items) == 1:
        return None  # f(x for x in y): adding an argument would need parentheses
    last = max(items, key=end_position)
    return ctx.insert_after(last, ", " + text)


def rename_call(ctx: Context, call: ast.Call, new_qualname: str) -> Optional[Edit]:
    """Edit the callee of ``call`` into ``new_qualname``, reusing how the file spells it."""
    func = call.func
    if isinstance(func, ast.Attribute):
        return ctx.replace_attr(func, new_qualname.rsplit(".", 1)[1])
    spelled = ctx.spell(new_qualname)
    return None if spelled is None else ctx.replace(func, spelled)


def short_name(qualname: str) -> str:
    """``torch.nn.functional.upsample`` -> ``F.upsample``; ``torch.nn.Conv2d`` -> ``nn.Conv2d``."""
    if qualname.startswith(FUNCTIONAL):
        return "F." + qualname[len(FUNCTIONAL) :]
    if qualname.startswith(NN):
        return "nn." + qualname[len(NN) :]
    return qualname


# -- the torch the file needs -----------------------------------------------------------------
# torch APIs whose use shows the code needs at least that torch (the release that added them).
NEWER_APIS: Tuple[Tuple[str, Tuple[int, int]], ...] = (
    ("torch.accelerator", (2, 6)),  # torch 2.6: the device-generic accelerator module
    ("torch.serialization.safe_globals", (2, 5)),  # torch 2.5
    ("torch.serialization.add_safe_globals", (2, 4)),  # torch 2.4
    ("torch.amp.GradScaler", (2, 3)),  # torch 2.3: device-generic GradScaler
    ("torch.export", (2, 1)),  # torch 2.1
    ("torch.compile", (2, 0)),  # torch 2.0
    ("torch.func", (2, 0)),  # torch 2.0 (functorch merged)
)


def min_torch(ctx: Context) -> Tuple[Optional[Tuple[int, int]], str]:
    """The oldest torch the file can run on: the configured ``min-torch-version`` or, when
    higher, what its use of newer APIs implies; and why (``"torch.accelerator at line 3"``,
    ``"min-torch-version"`` or ``""`` when unknown)."""
    cached = ctx.cache.get("min_torch")
    if cached is not None:
        return cached
    best, why = ctx.options.min_torch, "min-torch-version" if ctx.options.min_torch else ""
    if "torch." in ctx.source or "from torch" in ctx.source:
        for node in ctx.walk(ctx.tree):
            if not isinstance(node, (ast.Attribute, ast.Name)):
                continue
            qual = ctx.qualname(node)
            if qual is None:
                continue
            for api, version in NEWER_APIS:
                if (qual == api or qual.startswith(api + ".")) and (best is None or version > best):
                    best, why = version, f"{api} at line {node.lineno}"
    ctx.cache["min_torch"] = (best, why)
    return best, why


def torch_at_least(ctx: Context, major: int, minor: int) -> bool:
    """True when every torch the file can run on is at least ``major.minor``."""
    found = min_torch(ctx)[0]
    return found is not None and found >= (major, minor)


# -- names and positions ----------------------------------------------------------------------
def bound_names(target: ast.AST) -> Iterator[str]:
    """Names an assignment target binds (``a``, ``a, (b, *c)``)."""
    if isinstance(target, ast.Name):
        yield target.id
    elif isinstance(target, (ast.Tuple, ast.List)):
        for elt in target.elts:
            yield from bound_names(elt)
    elif isinstance(target, ast.Starred):
        yield from bound_names(target.value)


def start_of(node: Positioned) -> Pos:
    """(line, UTF-8 byte column) where ``node`` starts: positions to compare, not to show."""
    return node.lineno, node.col_offset


#: (line, UTF-8 byte column) just past the end of a node (``engine.end_position``).
end_of = end_position


# Words in the name of a ``load_state_dict`` receiver that say it is no module.
_NOT_MODULES = ("optim", "sched", "scaler", "opt")


def not_a_module(receiver: str) -> bool:
    """The receiver of a ``load_state_dict`` call (its source text) names an optimizer, a
    scheduler or a grad scaler, not a module: ``optimizer``, ``self.lr_scheduler``,
    ``scaler``, ``opt_g``.

    >>> not_a_module("self.optimizer_center"), not_a_module("model.module")
    (True, False)
    """
    last = receiver.lower().split(".")[-1]
    return any(word in last for word in _NOT_MODULES)


def var_key(node: ast.AST) -> Optional[str]:
    """``t0`` or ``self.t0``: a variable a clock reading can be kept in."""
    if isinstance(node, ast.Name):
        return node.id
    attr = self_attr(node)
    return None if attr is None else "self." + attr


def call_name(func: ast.AST) -> str:
    """The last name of a callee: ``nms`` for ``nms``, ``ops.nms`` and ``self.nms``; ""
    for anything else (``f()()``, ``fs[0]()``).

    >>> call_name(ast.parse("torch.nn.DataParallel(m)", mode="eval").body.func)
    'DataParallel'
    """
    if isinstance(func, ast.Attribute):
        return func.attr
    return func.id if isinstance(func, ast.Name) else ""


def module_files(folder: str, module: str, level: int = 0) -> List[str]:
    """Where the project file of ``module`` would be, relative to the project root, for an
    import in a file of ``folder``: ``pkg/mod.py`` or ``pkg/mod/__init__.py``, looked up
    from the root and from ``folder`` (``level`` dots: from ``folder``'s ancestor only).

    >>> module_files("tools", "nets.core")[:2]
    ['nets/core.py', 'nets/core/__init__.py']
    >>> module_files("pkg/sub", "util", level=2)
    ['pkg/util.py', 'pkg/util/__init__.py']
    """
    if level:
        base = folder
        for _ in range(level - 1):
            base = posixpath.dirname(base)
        bases = [base]
    else:
        bases = ["", folder]
    stems = [posixpath.join(b, *module.split(".")) if module else b for b in bases]
    return [f for stem in stems for f in (stem + ".py", posixpath.join(stem, "__init__.py"))]


def self_attr(node: ast.AST) -> Optional[str]:
    """``x`` for ``self.x``, else None."""
    if (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
    ):
        return node.attr
    return None


# -- scopes ------------------------------------------------------------------------------------
def own_expressions(stmt: ast.stmt) -> List[ast.AST]:
    """The expressions of a statement itself (not of nested blocks, functions, classes)."""
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return []
    own: List[ast.AST] = []
    for name, value in ast.iter_fields(stmt):
        if name in ("body", "orelse", "finalbody", "handlers", "cases"):
            continue
        if isinstance(value, list):
            own.extend(v for v in value if isinstance(v, ast.AST))
        elif isinstance(value, ast.AST):
            own.append(value)
    return own


def statements_in_order(body: Sequence[ast.stmt]) -> Iterator[ast.stmt]:
    """The statements of one scope in source order, entering compound statements but not
    nested functions or classes."""
    for stmt in body:
        yield stmt
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        for name in ("body", "orelse", "finalbody", "handlers", "cases"):
            inner = getattr(stmt, name, None)
            if isinstance(inner, list):
                for item in inner:
                    if isinstance(item, ast.stmt):
                        yield from statements_in_order([item])
                    elif hasattr(item, "body"):  # except handler, match case
                        yield from statements_in_order(item.body)


def literal_bool(node: Optional[ast.AST], default: bool) -> Optional[bool]:
    """The value of a literal True/False argument (``default`` when absent), else None."""
    if node is None:
        return default
    if isinstance(node, ast.Constant) and isinstance(node.value, bool):
        return node.value
    return None


def own_nodes(fn: ast.AST) -> Iterator[ast.AST]:
    """The nodes of a function's body, not entering nested functions, lambdas or classes."""
    todo = list(ast.iter_child_nodes(fn))
    while todo:
        node = todo.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            todo.extend(ast.iter_child_nodes(node))


def referenced_not_called(tree: ast.Module, path: str) -> FrozenSet[str]:
    """Names and attributes one file uses other than as the function of a call: passed as an
    argument (``partial(f, ...)``, ``Trainer(f)``), assigned (``fn = U.f``), put in a
    container, or imported under another name (``from u import f as g``). A save wrapper
    among them may be called where the checker cannot see what it is given."""
    called = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    found: Set[str] = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and id(n) not in called:
            found.add(n.id)
        elif isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Load) and id(n) not in called:
            found.add(n.attr)
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            found.update(a.name.split(".")[-1] for a in n.names if a.asname is not None)
    return frozenset(found)
