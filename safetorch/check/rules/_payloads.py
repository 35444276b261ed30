"""What a file's ``torch.load`` calls read and its ``torch.save`` calls write (the payloads
ST003 and ST004 reason about): whole modules, numpy data, plain state dicts."""

from __future__ import annotations

import ast
import bisect
from typing import Dict, List, Optional, Set, Tuple

from safetorch.check.engine import Context
from safetorch.check.rules._helpers import (
    FUNCTION_DEFS,
    NN,
    Pos,
    call_arg,
    end_of,
    find_keyword,
    start_of,
    statements_in_order,
    var_key,
)


def _loads_something(call: ast.Call) -> bool:
    """``torch.load(path)`` or ``torch.load(f=path)`` (not a bare ``torch.load()``)."""
    return bool(call.args) or find_keyword(call, "f") is not None


# What the file's save calls are: torch's, and st.save (a file an earlier fix rewrote).
_SAVES = ("torch.save", "safetorch.save")
# What a weights-only load refuses (the kinds ``_Payloads._holds`` names).
_REFUSED = ("a whole module", "numpy data", "numpy scalars")
# torch.load keywords st.load takes too (weights_only is dropped by the fix).
_ST_LOAD_KEYWORDS = frozenset({"f", "map_location", "weights_only", "mmap", "encoding"})


# Methods only a module has: a loaded object used with them is a whole pickled module.
_MODULE_METHODS = frozenset(
    {"eval", "train", "parameters", "named_parameters", "modules", "children", "forward"}
    | {"state_dict", "named_modules", "zero_grad", "requires_grad_"}
)


class _Payloads:
    """What the file's ``torch.save`` calls write and how its ``torch.load`` results are used:
    the evidence ST003/ST004 advise from (ST003 never offers ``weights_only=True`` for a file
    that evidently holds a whole module or numpy data)."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.saves: List[Tuple[ast.Call, Optional[str]]] = []  # (save call, what it holds)
        self.bindings: Dict[int, str] = {}  # id(load call) -> name its result is bound to
        self.bound_by: Dict[int, ast.stmt] = {}  # id(load call) -> the assignment binding it
        self._blocks: Optional[Dict[int, Tuple[List[ast.stmt], int]]] = None
        self._rebinds: Dict[int, Dict[str, List[int]]] = {}
        self.scope_of: Dict[int, ast.AST] = {}
        self.loads_in_else: Set[int] = set()  # loads in a branch whose sibling maps
        self.call_scope: Dict[int, ast.AST] = {}  # id(call) -> innermost function (or module)
        self._numpy_names: Set[str] = set()
        self._module_names: Set[str] = set()
        self._read(ctx.tree)

    def _read(self, tree: ast.Module) -> None:
        ctx = self.ctx
        self.functions = [n for n in self.ctx.walk(tree) if isinstance(n, FUNCTION_DEFS)]
        scopes = [tree, *self.functions]
        for scope in scopes:
            for stmt in statements_in_order(scope.body):
                if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
                    target, value = stmt.targets[0], stmt.value
                    name = var_key(target)
                    root = _chain_root(value)
                    if name is not None and isinstance(root, ast.Call):
                        qual = ctx.qualname(root.func) or ""
                        if qual == "torch.load":
                            self.bindings[id(root)] = name
                            self.bound_by[id(root)] = stmt
                            self.scope_of[id(root)] = scope
                        elif qual.startswith(("numpy.", "np.")):
                            self._numpy_names.add(name)
                        elif qual.startswith(NN) and qual[len(NN) : len(NN) + 1].isupper():
                            self._module_names.add(name)
                elif isinstance(stmt, ast.If):
                    self._note_mapped_branches(stmt)
        # id(load) -> line: a module's method called on the loaded object itself
        # (``torch.load(p).state_dict()``, ``torch.load(p).to(device).eval()``; not
        # ``requires_grad_``, a tensor's method too).
        self.module_chains: Dict[int, int] = {}
        for node in self.ctx.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in _MODULE_METHODS:
                name = var_key(node.value)
                if name is not None:
                    self._module_names.add(name)
                root = _chain_root(node.value)
                if (
                    node.attr != "requires_grad_"
                    and isinstance(root, ast.Call)
                    and ctx.qualname(root.func) == "torch.load"
                ):
                    self.module_chains.setdefault(id(root), node.lineno)
        # (extent of the body, handle name, path) of each ``with open(path, ...) as handle:``
        self.handles: List[Tuple[Pos, Pos, str, ast.expr]] = []
        for node in self.ctx.walk(tree):
            if isinstance(node, ast.With) and node.body:
                for item in node.items:
                    opened = _opened(item.context_expr)
                    if opened is not item.context_expr and isinstance(item.optional_vars, ast.Name):
                        extent = (start_of(node.body[0]), end_of(node.body[-1]))
                        self.handles.append((*extent, item.optional_vars.id, opened))
        for node in self.ctx.walk(tree):
            if isinstance(node, ast.Call) and ctx.qualname(node.func) in _SAVES and node.args:
                self.saves.append((node, self._holds(node.args[0])))
        for scope in scopes:  # outer functions first: the innermost one wins
            for node in self.ctx.walk(scope):
                if isinstance(node, ast.Call):
                    self.call_scope[id(node)] = scope

    def _note_mapped_branches(self, stmt: ast.If) -> None:
        """``if cuda: torch.load(p) else: torch.load(p, map_location="cpu")``: the CUDA branch
        loads where the tensors were saved, on purpose."""
        branches = [stmt.body, stmt.orelse]
        loads = []
        for branch in branches:
            calls = [
                n
                for s in branch
                for n in self.ctx.walk(s)
                if isinstance(n, ast.Call) and self.ctx.qualname(n.func) == "torch.load"
            ]
            loads.append(calls)
        mapped = [any(find_keyword(c, "map_location") for c in calls) for calls in loads]
        for i, calls in enumerate(loads):
            if mapped[1 - i]:
                self.loads_in_else.update(id(c) for c in calls)

    def _holds(self, obj: ast.AST) -> Optional[str]:
        """``"a whole module"``, ``"numpy data"``, ``"CPU tensors"`` or None (a state dict or
        something the checker cannot tell)."""
        ctx = self.ctx
        if isinstance(obj, ast.Call):
            qual = ctx.qualname(obj.func) or ""
            if qual.startswith(("numpy.", "np.")):
                return "numpy data"
            if isinstance(obj.func, ast.Attribute) and obj.func.attr == "cpu":
                return "CPU tensors"
            return None
        if isinstance(obj, ast.Dict):
            for value in obj.values:
                inner = self._holds(value) if value is not None else None
                if inner == "numpy data":
                    return "numpy scalars"
                if inner == "a whole module":
                    return inner
            return None
        name = var_key(obj)
        if name in self._numpy_names:
            return "numpy data"
        if name in self._module_names:
            return "a whole module"
        return None

    def load_holds(self, load: ast.Call) -> Optional[Tuple[str, int]]:
        """What the file loaded by ``load`` evidently holds, and the line that shows it."""
        name = self.bindings.get(id(load))
        scope = self.scope_of.get(id(load), self.ctx.tree)
        if id(load) in self.module_chains:
            return "a whole module", self.module_chains[id(load)]
        if name is not None:
            rebound = self._rebinding(load, name)
            for node in self.ctx.walk(scope):
                if not isinstance(node, (ast.Attribute, ast.Call)):
                    continue
                if rebound is not None and _after(node, rebound):
                    continue  # the name holds something else there
                if (
                    isinstance(node, ast.Attribute)
                    and var_key(node.value) == name
                    and start_of(node) > start_of(load)
                ):
                    if node.attr in _MODULE_METHODS:
                        return "a whole module", node.lineno
                    if node.attr in ("astype", "tobytes"):
                        return "numpy data", node.lineno
                if (
                    isinstance(node, ast.Call)
                    and var_key(node.func) == name
                    and start_of(node) > start_of(load)
                ):
                    return "a whole module", node.lineno  # called: model(x)
                if isinstance(node, ast.Call) and start_of(node) > start_of(load):
                    qual = self.ctx.qualname(node.func) or ""
                    numpy = qual == "torch.from_numpy" or qual.startswith(("numpy.", "np."))
                    if numpy and any(var_key(_subscript_root(a)) == name for a in node.args):
                        return "numpy data", node.lineno  # torch.from_numpy(data[3:])
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                    if node.func.attr == "load_state_dict" and any(
                        var_key(a) == name or _chain_root(a) is load for a in node.args
                    ):
                        return None  # loaded as a state dict
        path = call_arg(load, 0, "f")
        candidates = [(held, save) for save, held in self.saves if self._same_file(path, save)]
        kinds = {held for held, _ in candidates}
        if len(kinds) == 1 and kinds <= {"a whole module", "numpy data", "numpy scalars"}:
            held, save = candidates[0]
            if held is not None:
                return held, save.lineno
        return None

    def _rebinding(self, load: ast.Call, name: str) -> Optional[ast.stmt]:
        """The first later statement of the load's own block that binds ``name`` anew
        (``model = torch.load(p)`` ... ``model = Net.from_pretrained(model["args"])``), or
        None: what the name is used for after it says nothing of the file. Not one that
        keeps what it held, whole or a part of it (``model = nn.DataParallel(model)``,
        ``ckpt = ckpt["model"].float()``: still the file's)."""
        stmt = self.bound_by.get(id(load))
        if stmt is None:
            return None
        if self._blocks is None:
            self._blocks = {}
            for node in self.ctx.walk(self.ctx.tree):
                for field in ("body", "orelse", "finalbody"):
                    block = getattr(node, field, None)
                    if isinstance(block, list):
                        for i, item in enumerate(block):
                            self._blocks[id(item)] = (block, i)
        if id(stmt) not in self._blocks:
            return None
        block, index = self._blocks[id(stmt)]
        if id(block) not in self._rebinds:  # name -> the indices of the block binding it
            binds: Dict[str, List[int]] = {}
            for i, later in enumerate(block):
                for target in _targets(later):
                    key = var_key(target)
                    if key is not None:
                        binds.setdefault(key, []).append(i)
            self._rebinds[id(block)] = binds
        found = self._rebinds[id(block)].get(name, [])
        for i in found[bisect.bisect_right(found, index) :]:
            value = getattr(block[i], "value", None)
            if not (_part_of(value, name) or _passed_whole(value, name)):
                return block[i]
        return None

    def _same_file(self, path: Optional[ast.expr], save: ast.Call) -> bool:
        """Whether ``save`` may write the file a load reads from ``path``: the same path
        expression, or a path that is not a literal on either side."""
        target = call_arg(save, 1, "f")
        if path is None or target is None:
            return False
        if self.ctx.segment(path) == self.ctx.segment(target):
            # A local name (``path``) means the same file only within one function.
            local = isinstance(path, ast.Name) and self._scope(path) is not self.ctx.tree
            return not local or self._scope(path) is self._scope(save)
        return not (isinstance(path, ast.Constant) and isinstance(target, ast.Constant))

    def saves_of(self, load: ast.Call) -> List[Tuple[ast.Call, Optional[str]]]:
        """The saves of this file that write the very path ``load`` reads, with what each
        holds: the same path expression (``path``, ``args.save``), also through
        ``open(path, "wb")`` or the handle of a ``with open(path, ...) as f:``; a local name
        only within one function."""
        path = call_arg(load, 0, "f")
        if path is None:
            return []
        path = self._file_of(path)
        key = self.ctx.segment(path)
        # A local name (``path``) means the same file only within one function.
        local = isinstance(path, ast.Name) and self._scope(path) is not self.ctx.tree
        found = []
        for save, held in self.saves:
            target = call_arg(save, 1, "f")
            if target is None or self.ctx.segment(self._file_of(target)) != key:
                continue
            if not local or self._scope(path) is self._scope(save):
                found.append((save, held))
        return found

    def _file_of(self, node: ast.expr) -> ast.expr:
        """The path expression of the file ``node`` names: ``path`` for ``open(path, "wb")``
        and for the handle of the innermost ``with open(path, ...) as handle:`` around it."""
        if isinstance(node, ast.Name):
            where = start_of(node)
            around = [h for h in self.handles if h[2] == node.id and h[0] <= where <= h[1]]
            if around:
                return max(around, key=lambda h: h[0])[3]
        return _opened(node)

    def _scope(self, node: ast.expr) -> ast.AST:
        """The function whose body holds the call ``node`` is in (by position), or the module."""
        if id(node) in self.call_scope:
            return self.call_scope[id(node)]
        where = start_of(node)
        best: ast.AST = self.ctx.tree
        for scope in self.functions:  # in pre-order: a later match is nested deeper
            if start_of(scope) <= where <= end_of(scope):
                best = scope
        return best

    def saves_here(self, load: ast.Call) -> bool:
        """The file itself saves the file ``load`` reads (the same path expression)."""
        path = call_arg(load, 0, "f")
        for save, _ in self.saves:
            target = call_arg(save, 1, "f")
            if path is not None and target is not None and self._same_file(path, save):
                if self.ctx.segment(path) == self.ctx.segment(target):
                    return True
        return False

    def saved_on_cpu(self, load: ast.Call) -> bool:
        """The file writes what ``load`` reads from CPU tensors (``.cpu()``, numpy data)."""
        path = call_arg(load, 0, "f")
        for save, held in self.saves:
            if held in ("CPU tensors", "numpy data") and self._same_file(path, save):
                target = call_arg(save, 1, "f")
                if (
                    path is not None  # always: _same_file is False without one
                    and target is not None
                    and self.ctx.segment(target) == self.ctx.segment(path)
                ):
                    return True
        return False


def _part_of(value: Optional[ast.expr], name: str) -> bool:
    """``value`` is ``name`` or a part of it, moved or converted (``(ckpt.get("ema") or
    ckpt["model"]).to(device)``); not a call that is only given it (``Net(ckpt["args"])``)."""
    todo: List[ast.AST] = [] if value is None else [value]
    while todo:
        node = todo.pop()
        if var_key(node) == name:
            return True
        if isinstance(node, ast.Call):
            todo.append(node.func)
        elif isinstance(node, (ast.Attribute, ast.Subscript)):
            todo.append(node.value)
        elif isinstance(node, ast.BoolOp):
            todo.extend(node.values)
        elif isinstance(node, ast.IfExp):
            todo.extend((node.body, node.orelse))
    return False


def _targets(stmt: ast.stmt) -> List[ast.expr]:
    if isinstance(stmt, ast.Assign):
        return stmt.targets
    if isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
        return [stmt.target]
    return []


def _passed_whole(value: Optional[ast.expr], name: str) -> bool:
    """``value`` reads ``name`` itself, not only a part of it (``nn.DataParallel(model)``;
    not ``Net(ckpt["args"])``)."""
    if value is None:
        return False
    parts = {id(n.value) for n in ast.walk(value) if isinstance(n, (ast.Subscript, ast.Attribute))}
    return any(var_key(n) == name and id(n) not in parts for n in ast.walk(value))


def _after(node: ast.AST, stmt: ast.stmt) -> bool:
    """``node`` runs after ``stmt`` binds its targets: from ``stmt`` on, but not its value."""
    if not isinstance(node, (ast.expr, ast.stmt)) or start_of(node) < start_of(stmt):
        return False
    value = getattr(stmt, "value", None)
    return value is None or not start_of(value) <= start_of(node) <= end_of(value)


def _opened(node: ast.expr) -> ast.expr:
    """``path`` for ``open(path, "wb")`` (the builtin's name); ``node`` itself otherwise."""
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "open"
        and node.args
        and not isinstance(node.args[0], ast.Starred)
    ):
        return node.args[0]
    return node


def _subscript_root(node: ast.AST) -> ast.AST:
    """``data`` for ``data[3:, :-1]``."""
    while isinstance(node, ast.Subscript):
        node = node.value
    return node


def _chain_root(node: ast.AST) -> ast.AST:
    """``torch.load(p)`` for ``torch.load(p).to(device).eval()``."""
    while (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Call)
    ):
        node = node.func.value
    return node


def payloads(ctx: Context) -> _Payloads:
    found = ctx.cache.get("payloads")
    if found is None:
        found = ctx.cache["payloads"] = _Payloads(ctx)
    return found


# Words in an ``if`` test that say it decides about CUDA.
