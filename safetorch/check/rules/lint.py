"""Layer order (ST008 bias before BatchNorm, ST009 Dropout before BatchNorm): what
``st.lint_model`` reports on a built model, found in source by following the layers.
"""

from __future__ import annotations

import ast
from typing import Dict, FrozenSet, Iterable, Iterator, List, Optional, Sequence, Set, Tuple, Union

from safetorch.check.engine import UNSAFE, Context, Fix
from safetorch.check.rules._base import Rule
from safetorch.check.rules._bias_flow import (
    bias_write_applies,
    bias_writes,
    fix_blocker,
    param_verdict,
)
from safetorch.check.rules._helpers import (
    FUNCTION_DEFS,
    NN,
    FunctionNode,
    add_keywords,
    bound_names,
    find_keyword,
    has_double_star,
    has_star,
    is_const,
    own_expressions,
    self_attr,
    short_name,
    statements_in_order,
)

# layer -> index of the positional ``bias`` parameter
_BIASED: Dict[str, int] = {
    **{f"{NN}Conv{d}d": 7 for d in (1, 2, 3)},
    **{f"{NN}ConvTranspose{d}d": 7 for d in (1, 2, 3)},
    **{f"{NN}LazyConv{d}d": 6 for d in (1, 2, 3)},
    **{f"{NN}LazyConvTranspose{d}d": 6 for d in (1, 2, 3)},
    NN + "Linear": 2,
    NN + "LazyLinear": 1,
}


_BATCHNORMS: FrozenSet[str] = frozenset(
    [f"{NN}BatchNorm{d}d" for d in (1, 2, 3)]
    + [f"{NN}LazyBatchNorm{d}d" for d in (1, 2, 3)]
    + [NN + "SyncBatchNorm"]
)


_DROPOUTS: FrozenSet[str] = frozenset(
    [NN + "Dropout", NN + "AlphaDropout", NN + "FeatureAlphaDropout"]
    + [f"{NN}Dropout{d}d" for d in (1, 2, 3)]
)


_NORM_WORDS = ("BatchNorm", "SyncBatchNorm")


# Sentinels among a layer's followers: the sequence ends there / something we cannot see.
_END = "end of the sequence"


_OPAQUE = "something the checker cannot see"


# List methods that reorder or drop layers: after them a list's order is unknown.
_LIST_SCRAMBLERS = frozenset({"insert", "pop", "remove", "reverse", "sort", "clear"})


class _Layer:
    """One layer constructor call the flow found (``nn.Conv2d(...)``, ``norm_layer(c)``).

    ``direct`` is False when the call was reached through a variable or a helper function
    that returns one layer: it may be used elsewhere too, so a fix there is not offered.
    """

    __slots__ = ("call", "kind", "direct", "fn")

    def __init__(self, call: ast.Call, kind: str, direct: bool, fn: Optional[FunctionNode]) -> None:
        self.call = call
        self.kind = kind
        self.direct = direct
        self.fn = fn  # the function whose body holds the call (None: module level)


_Item = Union[_Layer, str]


def _item_key(item: _Item) -> object:
    return id(item.call) if isinstance(item, _Layer) else item


def _unique(items: Iterable[_Item]) -> List[_Item]:
    seen: Dict[object, _Item] = {}
    for item in items:
        seen.setdefault(_item_key(item), item)
    return list(seen.values())


def _edge_key(item: _Item) -> object:
    return (id(item.call), item.direct) if isinstance(item, _Layer) else item


def _unique_edges(edges: Iterable[Tuple[_Item, _Item]]) -> List[Tuple[_Item, _Item]]:
    """Each (layer, next item) pair once: the branches of an ``if`` and the two readings of
    a loop body share the edges made before them, which doubled per branch without this
    (nested ``if``s in a long function grew the list exponentially)."""
    seen: Dict[object, Tuple[_Item, _Item]] = {}
    for a, b in edges:
        seen.setdefault((_edge_key(a), _edge_key(b)), (a, b))
    return list(seen.values())


class _Seq:
    """What a list of layers may look like: its possible first and last items, whether it may
    be empty, and every (layer, next item) pair it may contain."""

    __slots__ = ("firsts", "lasts", "edges", "empty")

    def __init__(
        self,
        firsts: Sequence[_Item] = (),
        lasts: Sequence[_Item] = (),
        edges: Sequence[Tuple[_Item, _Item]] = (),
        empty: bool = False,
    ) -> None:
        self.firsts = list(firsts)
        self.lasts = list(lasts)
        self.edges = list(edges)
        self.empty = empty

    @staticmethod
    def one(item: _Item) -> _Seq:
        return _Seq([item], [item])

    def then(self, other: _Seq) -> _Seq:
        """This sequence followed by ``other``."""
        edges = _unique_edges(
            self.edges + other.edges + [(a, b) for a in self.lasts for b in other.firsts]
        )
        firsts = self.firsts + (other.firsts if self.empty else [])
        lasts = other.lasts + (self.lasts if other.empty else [])
        return _Seq(_unique(firsts), _unique(lasts), edges, self.empty and other.empty)

    def either(self, other: _Seq) -> _Seq:
        """One of the two (after an ``if``, or a loop that may not run)."""
        return _Seq(
            _unique(self.firsts + other.firsts),
            _unique(self.lasts + other.lasts),
            _unique_edges(self.edges + other.edges),
            self.empty or other.empty,
        )

    def as_indirect(self) -> _Seq:
        """The same layers, marked as reached through a name (no fix edits them)."""

        def indirect(item: _Item) -> _Item:
            if isinstance(item, _Layer) and item.direct:
                return _Layer(item.call, item.kind, False, item.fn)
            return item

        return _Seq(
            [indirect(i) for i in self.firsts],
            [indirect(i) for i in self.lasts],
            [(indirect(a), indirect(b)) for a, b in self.edges],
            self.empty,
        )


_OPAQUE_SEQ = _Seq([_OPAQUE], [_OPAQUE])


# A name's value while the flow reads a function: (holds a list of layers, its sequence).
_Env = Dict[str, Tuple[bool, _Seq]]


def _merge_envs(base: _Env, *branches: _Env) -> _Env:
    merged: _Env = {}
    for name in set(base).union(*branches):
        values = [b.get(name, base.get(name)) for b in branches]
        known = [v for v in values if v is not None]
        if not known or any(v[0] != known[0][0] for v in known):
            continue  # bound to different kinds of things: forget it
        seq = known[0][1]
        for _, other in known[1:]:
            seq = seq.either(other)
        merged[name] = (known[0][0], seq)
    return merged


class _LayerFlow:
    """Which layers a file applies one right after the other, following the layer lists.

    Lists are followed through ``layers = [...]``, ``layers += [...]``, ``.append``,
    ``.extend``, ``if``/``else`` and loops (each branch and iteration counted), helper
    functions that return a list or one layer (``*block(...)``, ``conv3x3(...)``), variables
    holding a layer, and class aliases from parameter defaults (``norm_layer=nn.BatchNorm2d``),
    into ``nn.Sequential(*layers)`` and into the ``self.<a>`` / ``self.<b>`` layers ``forward``
    applies back to back. The result is, for each layer, every item that may follow it.
    """

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.followers: Dict[int, List[_Item]] = {}  # id(layer call) -> what may follow it
        self.layers: Dict[int, _Layer] = {}
        self.parent: Dict[int, ast.AST] = {}  # function or class -> its enclosing scope
        self.functions: List[FunctionNode] = []
        self.classes: List[ast.ClassDef] = []
        self._returns: Dict[int, Optional[Tuple[bool, _Seq]]] = {}
        self._attrs: Dict[Tuple[int, str], _Seq] = {}  # (class, attr) -> layer(s) it holds
        self._aliases: Dict[Tuple[int, str], Optional[str]] = {}
        self._index_scopes(ctx.tree)
        self._flow_scope(ctx.tree, None)
        for fn in self.functions:
            self._flow_function(fn)
        for cls in self.classes:
            self._forward_edges(cls)

    # -- the file's functions and classes --------------------------------------------------
    def _index_scopes(self, tree: ast.Module) -> None:
        # From the file's pre-order node list (no second traversal): a scope encloses the
        # nodes up to the end of its own subtree.
        enclosing: List[Tuple[ast.AST, int]] = [(tree, 1 << 62)]
        for i, node in enumerate(self.ctx.walk(tree)):
            while i >= enclosing[-1][1]:
                enclosing.pop()
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                self.parent[id(node)] = enclosing[-1][0]
                if isinstance(node, ast.ClassDef):
                    self.classes.append(node)
                else:
                    self.functions.append(node)
                enclosing.append((node, i + len(self.ctx.walk(node))))

    def _enclosing(self, fn: Optional[ast.AST]) -> Iterator[ast.AST]:
        """``fn`` and the scopes around it, innermost first (the module last)."""
        while fn is not None:
            yield fn
            fn = self.parent.get(id(fn))
        yield self.ctx.tree

    def _class_of(self, fn: Optional[ast.AST]) -> Optional[ast.ClassDef]:
        for scope in self._enclosing(fn):
            if isinstance(scope, ast.ClassDef):
                return scope
        return None

    def _helper(self, func: ast.AST, fn: Optional[FunctionNode]) -> Optional[FunctionNode]:
        """The function of this file that a call's callee names (``block``, ``self._make``)."""
        attr = self_attr(func)
        if attr is not None:
            cls = self._class_of(fn)
            for stmt in cls.body if cls is not None else ():
                if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) and stmt.name == attr:
                    return stmt
            return None
        if not isinstance(func, ast.Name) or func.id in self.ctx.imports:
            return None
        for scope in self._enclosing(fn):
            for stmt in getattr(scope, "body", ()):
                if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) and (
                    stmt.name == func.id
                ):
                    return stmt
        return None

    # -- what a name or call stands for ----------------------------------------------------
    def kind(self, func: ast.AST, fn: Optional[FunctionNode]) -> Optional[str]:
        """The torch layer class a call's callee names, through imports and class aliases."""
        qual = self.ctx.qualname(func)
        if qual is not None:
            return qual
        if isinstance(func, ast.Name):
            for scope in self._enclosing(fn):
                key = (id(scope), func.id)
                if key not in self._aliases:
                    self._aliases[key] = self._alias_in(scope, func.id)
                found = self._aliases[key]
                if found is not None:
                    return found or None
        return None

    def _alias_in(self, scope: ast.AST, name: str) -> Optional[str]:
        """``norm_layer`` -> ``torch.nn.BatchNorm2d`` from ``norm_layer=nn.BatchNorm2d`` (a
        parameter default) or ``norm_layer = nn.BatchNorm2d`` in ``scope``; "" when the name
        is bound there to something else, None when it is not bound there."""
        values: List[ast.AST] = []
        args = getattr(scope, "args", None)
        if args is not None:
            positional = [*args.posonlyargs, *args.args]
            defaults: List[Optional[ast.expr]] = [None] * (
                len(positional) - len(args.defaults)
            ) + list(args.defaults)
            pairs = list(zip(positional, defaults)) + list(zip(args.kwonlyargs, args.kw_defaults))
            for arg, default in pairs:
                if arg.arg == name:
                    values.append(default if default is not None else ast.Constant(None))
        body = getattr(scope, "body", [])
        for stmt in statements_in_order(body):
            if isinstance(stmt, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == name for t in stmt.targets
            ):
                values.append(stmt.value)
        if not values:
            return None
        found: Set[str] = set()
        for value in values:
            if is_const(value, None):
                continue
            qual = self.ctx.qualname(value)
            if isinstance(value, ast.Call) and (self.ctx.qualname(value.func) or "").endswith(
                "functools.partial"
            ):
                qual = self.ctx.qualname(value.args[0]) if value.args else None
            if qual is None or not qual.startswith(NN):
                return ""
            found.add(qual)
        return found.pop() if len(found) == 1 else ""

    def _layer_call(
        self, call: ast.Call, fn: Optional[FunctionNode], direct: bool
    ) -> Optional[_Layer]:
        kind = self.kind(call.func, fn)
        if kind is None or not kind.startswith(NN):
            return None
        last = kind.rsplit(".", 1)[1]
        if not last[:1].isupper() or kind == NN + "Sequential":
            return None
        layer = _Layer(call, kind, direct, fn)
        self.layers.setdefault(id(call), layer)
        return layer

    def item(self, expr: ast.AST, env: _Env, fn: Optional[FunctionNode]) -> _Seq:
        """The layers one element of a layer list contributes (usually one)."""
        if isinstance(expr, ast.Starred):
            return self.sequence(expr.value, env, fn)
        if isinstance(expr, ast.Call):
            if self.kind(expr.func, fn) == NN + "Sequential":
                return self._sequential(expr, env, fn)
            layer = self._layer_call(expr, fn, True)
            if layer is not None:
                return _Seq.one(layer)
            helper = self._helper(expr.func, fn)
            returned = None if helper is None else self._flow_function(helper)
            if returned is not None and not returned[0]:
                return returned[1].as_indirect()
            return _OPAQUE_SEQ
        if isinstance(expr, ast.Name):
            bound = env.get(expr.id)
            if bound is not None and not bound[0]:
                return bound[1].as_indirect()
        return _OPAQUE_SEQ

    def sequence(self, expr: ast.AST, env: _Env, fn: Optional[FunctionNode]) -> _Seq:
        """The layers a list-valued expression holds, in order."""
        if isinstance(expr, (ast.List, ast.Tuple)):
            seq = _Seq(empty=True)
            for elt in expr.elts:
                seq = seq.then(self.item(elt, env, fn))
            return seq
        if isinstance(expr, ast.Name):
            bound = env.get(expr.id)
            return bound[1] if bound is not None and bound[0] else _OPAQUE_SEQ
        if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Add):
            return self.sequence(expr.left, env, fn).then(self.sequence(expr.right, env, fn))
        if isinstance(expr, ast.Call):
            qual = self.ctx.qualname(expr.func) or ""
            name = expr.func.id if isinstance(expr.func, ast.Name) else ""
            if name in ("list", "tuple") or qual == NN + "ModuleList":
                if not expr.args:
                    return _Seq(empty=True)
                return self.sequence(expr.args[0], env, fn)
            helper = self._helper(expr.func, fn)
            returned = None if helper is None else self._flow_function(helper)
            if returned is not None and returned[0]:
                return returned[1]
        return _OPAQUE_SEQ

    def _value(
        self, expr: ast.AST, env: _Env, fn: Optional[FunctionNode]
    ) -> Optional[Tuple[bool, _Seq]]:
        """(is a list, layers) for a value bound to a name or returned; None if neither."""
        if isinstance(expr, (ast.List, ast.Tuple, ast.BinOp)):
            seq = self.sequence(expr, env, fn)
            return None if seq is _OPAQUE_SEQ else (True, seq)
        if isinstance(expr, ast.Name):
            return env.get(expr.id)
        if isinstance(expr, ast.Call):
            name = expr.func.id if isinstance(expr.func, ast.Name) else ""
            if name in ("list", "tuple") or self.ctx.qualname(expr.func) == NN + "ModuleList":
                return True, self.sequence(expr, env, fn)
            one = self.item(expr, env, fn)
            if one is not _OPAQUE_SEQ:
                return False, one
            seq = self.sequence(expr, env, fn)
            if seq is not _OPAQUE_SEQ:
                return True, seq
        return None

    # -- nn.Sequential and forward ---------------------------------------------------------
    def _sequential(self, call: ast.Call, env: _Env, fn: Optional[FunctionNode]) -> _Seq:
        """The layers of ``nn.Sequential(...)``; its pairs are recorded (it ends there)."""
        args: List[ast.AST] = list(call.args)
        if len(call.args) == 1 and isinstance(call.args[0], ast.Call):
            inner = call.args[0]
            if (self.ctx.qualname(inner.func) or "").endswith("OrderedDict") and inner.args:
                items = inner.args[0]
                if isinstance(items, (ast.List, ast.Tuple)):
                    args = [
                        e.elts[1]
                        for e in items.elts
                        if isinstance(e, (ast.Tuple, ast.List)) and len(e.elts) == 2
                    ]
        seq = _Seq(empty=True)
        for arg in args:
            seq = seq.then(self.item(arg, env, fn))
        self._record(seq.then(_Seq.one(_END)))
        return seq

    def _record(self, seq: _Seq) -> None:
        for a, b in seq.edges:
            if isinstance(a, _Layer):
                found = self.followers.setdefault(id(a.call), [])
                if all(_item_key(f) != _item_key(b) for f in found):
                    found.append(b)
                known = self.layers.get(id(a.call))
                if known is None or (known.direct and not a.direct):
                    self.layers[id(a.call)] = a  # indirect anywhere: indirect

    def _forward_edges(self, cls: ast.ClassDef) -> None:
        pairs = _forward_pairs(self.ctx, cls)
        calls = _attr_calls(self.ctx, cls)
        for a_name, b_name, _ in pairs:
            a = self._attrs.get((id(cls), a_name))
            b = self._attrs.get((id(cls), b_name))
            if a is None or b is None:
                continue
            if any(isinstance(i, _Layer) and i.kind in _BIASED for i in a.lasts):
                # A bias matters wherever the layer's output is used without the norm: every
                # call of self.<a> in the class must feed a BatchNorm straight away.
                paired = {id(c) for x, y, c in pairs if x == a_name and c is not None}
                norms = [self._attrs.get((id(cls), y)) for x, y, _ in pairs if x == a_name]
                if paired != calls.get(a_name, set()) or not all(
                    n is not None and n.firsts and all(_is_norm(f) for f in n.firsts) for n in norms
                ):
                    continue
            self._record(_Seq(a.lasts, a.lasts).then(_Seq(b.firsts, b.firsts)))

    # -- reading one function top to bottom ------------------------------------------------
    def _flow_function(self, fn: FunctionNode) -> Optional[Tuple[bool, _Seq]]:
        """Read ``fn`` once (memoized); return what it returns, if a layer or a layer list."""
        key = id(fn)
        if key in self._returns:
            return self._returns[key]
        self._returns[key] = None  # recursion guard
        returned = self._flow_scope(fn, fn)
        self._returns[key] = returned
        return returned

    def _flow_scope(
        self, scope: ast.AST, fn: Optional[FunctionNode]
    ) -> Optional[Tuple[bool, _Seq]]:
        returns: List[Tuple[bool, _Seq]] = []
        self._flow(getattr(scope, "body", []), {}, fn, returns)
        if not returns or any(r[0] != returns[0][0] for r in returns):
            return None
        seq = returns[0][1]
        for _, other in returns[1:]:
            seq = seq.either(other)
        return returns[0][0], seq

    def _flow(
        self,
        body: Sequence[ast.stmt],
        env: _Env,
        fn: Optional[FunctionNode],
        returns: List[Tuple[bool, _Seq]],
    ) -> _Env:
        for stmt in body:
            for expr in own_expressions(stmt):
                for sub in self.ctx.walk(expr):
                    if isinstance(sub, ast.Call) and self.kind(sub.func, fn) == NN + "Sequential":
                        self._sequential(sub, env, fn)
            if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and stmt.value is not None:
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                for target, bound_to in _pairwise(targets, stmt.value):
                    self._bind(target, self._value(bound_to, env, fn), env, fn)
            elif isinstance(stmt, ast.AugAssign) and isinstance(stmt.target, ast.Name):
                bound = env.get(stmt.target.id)
                if bound is not None and bound[0] and isinstance(stmt.op, ast.Add):
                    env[stmt.target.id] = (True, bound[1].then(self.sequence(stmt.value, env, fn)))
                else:
                    env.pop(stmt.target.id, None)
            elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
                self._list_method(stmt.value, env, fn)
            elif isinstance(stmt, ast.Return) and stmt.value is not None:
                value = self._value(stmt.value, env, fn)
                if value is not None:
                    returns.append(value)
            elif isinstance(stmt, ast.If):
                taken = self._flow(stmt.body, dict(env), fn, returns)
                other = self._flow(stmt.orelse, dict(env), fn, returns)
                env = _merge_envs(env, taken, other)
            elif isinstance(stmt, (ast.For, ast.AsyncFor, ast.While)):
                once = self._flow(stmt.body, dict(env), fn, returns)
                again = self._flow(stmt.body, _merge_envs(env, once), fn, returns)
                env = _merge_envs(env, again)
                env = self._flow(stmt.orelse, env, fn, returns)
            elif isinstance(stmt, (ast.With, ast.AsyncWith)):
                env = self._flow(stmt.body, env, fn, returns)
            elif isinstance(stmt, ast.Try):
                env = self._flow(stmt.body, env, fn, returns)
                env = self._flow(stmt.orelse, env, fn, returns)
                env = self._flow(stmt.finalbody, env, fn, returns)
        return env

    def _bind(
        self,
        target: ast.AST,
        value: Optional[Tuple[bool, _Seq]],
        env: _Env,
        fn: Optional[FunctionNode],
    ) -> None:
        if isinstance(target, ast.Name):
            if value is None:
                env.pop(target.id, None)
            else:
                env[target.id] = value
            return
        attr = self_attr(target)
        cls = self._class_of(fn)
        if attr is not None and cls is not None:
            if value is not None and not value[0]:
                self._attrs[(id(cls), attr)] = value[1]
            else:
                self._attrs.pop((id(cls), attr), None)
        for name in bound_names(target):
            env.pop(name, None)

    def _list_method(self, call: ast.Call, env: _Env, fn: Optional[FunctionNode]) -> None:
        func = call.func
        if not (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name)):
            return
        name = func.value.id
        bound = env.get(name)
        if bound is None or not bound[0]:
            return
        if func.attr == "append" and len(call.args) == 1:
            env[name] = (True, bound[1].then(self.item(call.args[0], env, fn)))
        elif func.attr == "extend" and len(call.args) == 1:
            env[name] = (True, bound[1].then(self.sequence(call.args[0], env, fn)))
        elif func.attr in _LIST_SCRAMBLERS:
            env[name] = (True, _OPAQUE_SEQ)


def _is_norm(item: _Item) -> bool:
    return isinstance(item, _Layer) and item.kind in _BATCHNORMS


def _attr_calls(ctx: Context, cls: ast.ClassDef) -> Dict[str, Set[int]]:
    """``attr`` -> the ``self.<attr>(...)`` calls anywhere in the class's methods."""
    found: Dict[str, Set[int]] = {}
    for node in ctx.walk(cls):
        called = _layer_called(node)
        if called is not None:
            found.setdefault(called[0], set()).add(id(called[1]))
    return found


def _pairwise(targets: Sequence[ast.expr], value: ast.expr) -> List[Tuple[ast.expr, ast.expr]]:
    """(target, value) pairs of an assignment: ``layers, c = [], 3`` binds each name to its
    own value; any other unpacking binds the targets to the whole value (which forgets them)."""
    pairs: List[Tuple[ast.expr, ast.expr]] = []
    for target in targets:
        if (
            isinstance(target, (ast.Tuple, ast.List))
            and isinstance(value, (ast.Tuple, ast.List))
            and len(target.elts) == len(value.elts)
            and not any(isinstance(e, ast.Starred) for e in [*target.elts, *value.elts])
        ):
            pairs.extend(zip(target.elts, value.elts))
        else:
            pairs.append((target, value))
    return pairs


def _forward_pairs(ctx: Context, cls: ast.ClassDef) -> List[Tuple[str, str, Optional[ast.Call]]]:
    """``(a, b, call)`` for ``self.<a>``, ``self.<b>`` layers that ``forward`` applies back to
    back; ``call`` is the ``self.<a>(...)`` call when its output goes to ``self.<b>`` only
    (None when it is used again: ``y = self.conv(x); z = self.bn(y); return z + y``)."""
    forward = next(
        (s for s in cls.body if isinstance(s, ast.FunctionDef) and s.name == "forward"), None
    )
    if forward is None:
        return []
    pairs: List[Tuple[str, str, Optional[ast.Call]]] = []
    for node in ctx.walk(forward):
        # self.b(self.a(x))
        outer = _layer_called(node)
        if outer is not None and outer[1].args:
            inner = _layer_called(outer[1].args[0])
            if inner is not None:
                pairs.append((inner[0], outer[0], inner[1]))
        # x = self.a(x) \n x = self.b(x)   (or return self.b(x))
        body = getattr(node, "body", None)
        if isinstance(body, list):
            for first, second in zip(body, body[1:]):
                if not (isinstance(first, ast.Assign) and len(first.targets) == 1):
                    continue
                var = first.targets[0]
                a = _layer_called(first.value)
                b = _layer_called(getattr(second, "value", None))
                if (
                    a is not None
                    and b is not None
                    and isinstance(var, ast.Name)
                    and b[1].args
                    and isinstance(b[1].args[0], ast.Name)
                    and b[1].args[0].id == var.id
                ):
                    only = _only_read_by(ctx, forward, var.id, first, second, b[1].args[0])
                    pairs.append((a[0], b[0], a[1] if only else None))
    return pairs


def _only_read_by(
    ctx: Context,
    forward: ast.FunctionDef,
    name: str,
    first: ast.stmt,
    second: ast.stmt,
    arg: ast.AST,
) -> bool:
    """Whether the value ``first`` binds to ``name`` is read by ``arg`` (of ``second``) only:
    ``second`` binds ``name`` again (``x = self.bn(x)``), or nothing else reads ``name``."""
    if isinstance(second, ast.Assign) and any(
        isinstance(t, ast.Name) and t.id == name for t in second.targets
    ):
        return True
    inside = {id(n) for n in ctx.walk(first)}
    return not any(
        isinstance(n, ast.Name)
        and n.id == name
        and isinstance(n.ctx, ast.Load)
        and n is not arg
        and id(n) not in inside
        for n in ctx.walk(forward)
    )


def _layer_called(node: Optional[ast.AST]) -> Optional[Tuple[str, ast.Call]]:
    """``self.layer(arg, ...)`` -> ("layer", call)."""
    if isinstance(node, ast.Call):
        attr = self_attr(node.func)
        if attr is not None:
            return attr, node
    return None


def layer_flow(ctx: Context) -> Optional[_LayerFlow]:
    """The file's layer flow (shared by ST008 and ST009), or None in a file without
    BatchNorm (nothing either rule looks for can be there)."""
    if "layer_flow" not in ctx.cache:
        relevant = any(word in ctx.source for word in _NORM_WORDS)
        ctx.cache["layer_flow"] = _LayerFlow(ctx) if relevant else None
    flow: Optional[_LayerFlow] = ctx.cache["layer_flow"]
    return flow


def _followed_by_norm(flow: _LayerFlow, kinds: FrozenSet[str]) -> Iterator[Tuple[_Layer, str]]:
    """(layer of one of ``kinds``, the BatchNorm class after it) for every such pair."""
    for key, followers in flow.followers.items():
        layer = flow.layers[key]
        if layer.kind not in kinds:
            continue
        norm = next(
            (
                f.kind
                for f in followers
                if isinstance(f, _Layer) and f.kind in _BATCHNORMS and _widths_agree(layer, f)
            ),
            None,
        )
        if norm is not None:
            yield layer, norm


# The argument giving a layer's output width, and a norm's input width: (index, keyword).
_WIDTH_OUT = {kind: (0 if ".Lazy" in kind else 1, "out_features") for kind in _BIASED}
_WIDTH_OUT.update(
    {kind: (0 if ".Lazy" in kind else 1, "out_channels") for kind in _BIASED if "Conv" in kind}
)


def _width(call: ast.Call, index: int, keyword: str) -> Optional[ast.expr]:
    kw = find_keyword(call, keyword)
    if kw is not None:
        return kw.value
    if len(call.args) > index and not any(isinstance(a, ast.Starred) for a in call.args):
        return call.args[index]
    return None


def _widths_agree(layer: _Layer, norm: _Layer) -> bool:
    """False when the layer's output width and the norm's width are different literals
    (``nn.Conv2d(3, 8, 3)`` then ``nn.BatchNorm2d(16)``: the norm is fed something else)."""
    if layer.kind not in _WIDTH_OUT or ".Lazy" in norm.kind:
        return True
    out = _width(layer.call, *_WIDTH_OUT[layer.kind])
    width = _width(norm.call, 0, "num_features")
    if isinstance(out, ast.Constant) and isinstance(width, ast.Constant):
        return bool(out.value == width.value)
    return True


# -- ST008: the bias argument and the code that touches .bias ------------------------------
def _bias_arg(call: ast.Call, index: int) -> Tuple[bool, Optional[ast.expr]]:
    """(known, value) of the bias argument; value None means "not given" (bias=True)."""
    kw = find_keyword(call, "bias")
    if kw is not None:
        return True, kw.value
    if has_star(call) or has_double_star(call):
        return False, None
    if len(call.args) > index:
        return True, call.args[index]
    return True, None


def _reaches(ctx: Context, cls: ast.ClassDef, owner: Optional[ast.AST]) -> bool:
    """Whether code in ``owner`` (a module-level function or class; None: module code) can
    run on the layers of class ``cls``: it is ``cls`` or one of its bases in this file, a
    function ``cls`` names (``self.apply(init_weights)``), or a function applied outside any
    class (``model.apply(weights_init)`` in the training script)."""
    if owner is None:
        return True
    classes = {c.name: c for c in ctx.tree.body if isinstance(c, ast.ClassDef)}
    todo, seen = [cls], set()
    while todo:
        current = todo.pop()
        if current is owner:
            return True
        seen.add(current.name)
        for base in current.bases:
            name = base.id if isinstance(base, ast.Name) else None
            if name in classes and name not in seen:
                todo.append(classes[name])
    if not isinstance(owner, FUNCTION_DEFS):
        return False
    named = {n.id for n in ctx.walk(cls) if isinstance(n, ast.Name)}
    if owner.name in named:
        return True
    for node in ctx.tree.body:
        if isinstance(node, ast.ClassDef):
            continue
        for sub in ctx.walk(node):
            if isinstance(sub, ast.Name) and sub.id == owner.name and isinstance(sub.ctx, ast.Load):
                return True
    return False


class BiasBeforeBatchNorm(Rule):
    """ST008: a Conv/Linear layer with a bias immediately followed by BatchNorm.

    BatchNorm subtracts the per-channel mean, so the bias of the layer before it cancels
    out: parameters and compute spent on nothing (and weight decay applied to them).

    The rule follows the layers: ``nn.Sequential(a, b, ...)``, lists built with
    ``layers = [...]``, ``layers += [...]``, ``.append(...)``, ``.extend(...)`` (through
    ``if``/``else`` and loops) and splatted into ``nn.Sequential(*layers)``, helper functions
    returning a list or one layer, variables holding a layer, class aliases from parameter
    defaults (``norm_layer=nn.BatchNorm2d``), and ``forward`` methods that apply
    ``self.conv`` then ``self.bn`` directly (``x = self.conv(x); x = self.bn(x)``). Not a
    finding where the bias matters: the layer's output is also used without the norm (read
    again, or ``self.conv`` called elsewhere), or the norm's width is not the layer's.
    ``bias=bias`` is judged from the project's calls of the builder (function, method, or
    module class with its ``super().__init__`` calls and ``functools.partial``): a finding
    when a call passes True or leaves a True default, not when every call passes False.

    Fix (unsafe, ``--unsafe-fixes`` only): add ``bias=False`` to the Conv/Linear layer. It
    removes a parameter, so checkpoints saved before no longer load strictly
    (``Unexpected key(s) in state_dict: "0.bias"``) and the random initialisation of later
    layers changes (one fewer draw from the RNG). Offered only where the layer is written at
    that place with the layer class itself, is followed by BatchNorm wherever it is used,
    the bias is not written explicitly (``bias=True`` may be what published weights need;
    a positional one is never rewritten), and no file that runs with it (the files that
    import it, and what they import) loads a checkpoint or uses ``m.bias`` of such layers
    as a tensor without checking ``m.bias is not None`` (an init helper that zeroes every
    conv's bias would crash). Never where the project is too big to read whole. Elsewhere
    the finding says what to change by hand, and why not automatically.

    safetorch: ``st.lint_model`` reports the same on a built model at runtime.
    """

    code = "ST008"

    preview = True  # below 97% on the held-out corpus half (docs/check.md)

    name = "bias-before-bn"
    torch_symbols = ()
    fixable = True
    fix_applicability = UNSAFE

    def finish(self) -> None:
        flow = layer_flow(self.ctx)
        if flow is None:
            return
        for layer, norm in _followed_by_norm(flow, frozenset(_BIASED)):
            self._judge(flow, layer, norm)

    def _judge(self, flow: _LayerFlow, layer: _Layer, norm: str) -> None:
        call, qual = layer.call, layer.kind
        known, value = _bias_arg(call, _BIASED[qual])
        if not known:
            return
        head = f"{short_name(qual)} has a bias that the following {short_name(norm)} cancels"
        tail = " (st.lint_model finds this at runtime)"
        if isinstance(value, ast.Name):
            fn = layer.fn
            verdict = None
            if fn is not None:
                verdict = param_verdict(self.ctx, fn, flow._class_of(fn), value.id)
            if verdict is not None:
                self.report(
                    call,
                    f"{head} ({verdict}): pass {value.id}=False where it is built before "
                    f"BatchNorm{tail}",
                )
            return  # every call passes False, or a value the rule cannot judge
        if value is not None and not is_const(value, True):
            return  # bias=False, or an expression we cannot judge
        why = self._no_fix_reason(flow, layer, value)
        if why is not None:
            self.report(call, f"{head}: pass bias=False{why}{tail}")
            return
        edit = add_keywords(self.ctx, call, "bias=False")
        fix = None if edit is None else Fix("add bias=False", (edit,), UNSAFE)
        self.report(call, f"{head}: pass bias=False{tail}", fix)

    def _no_fix_reason(
        self, flow: _LayerFlow, layer: _Layer, value: Optional[ast.expr]
    ) -> Optional[str]:
        """Why ``bias=False`` cannot be written automatically here, or None."""
        if value is not None:
            given = "bias=True" if find_keyword(layer.call, "bias") else "True (positional)"
            return (
                f" by hand if no published or saved weights need it ({given} is written explicitly)"
            )
        cls = flow._class_of(layer.fn)
        for line, kinds, owner in bias_writes(self.ctx):
            if cls is not None and not _reaches(self.ctx, cls, owner):
                continue
            if bias_write_applies(kinds, layer.kind):
                return (
                    f", after guarding the code that writes .bias at line {line} with "
                    "`if m.bias is not None:` (with bias=False it would crash)"
                )
        if not flow.layers[id(layer.call)].direct:
            return " where it is built (it is reached through a helper or a variable)"
        followers = flow.followers.get(id(layer.call), [])
        if any(not (isinstance(f, _Layer) and f.kind in _BATCHNORMS) for f in followers):
            return " where it is followed by BatchNorm (elsewhere it is not)"
        if self.ctx.qualname(layer.call.func) != layer.kind:
            return " where the layer class is chosen (it is named through a variable here)"
        return fix_blocker(self.ctx, layer.kind)


class DropoutBeforeBatchNorm(Rule):
    """ST009: Dropout immediately followed by BatchNorm.

    BatchNorm's running statistics are collected on dropped-out activations in training but
    applied to full activations in eval ("variance shift"), so eval accuracy drops. Put
    Dropout after BatchNorm (or after the block). Found wherever ``bias-before-bn`` looks: literal
    ``nn.Sequential(...)`` arguments, layer lists built with ``+=``/``.append``/``.extend``
    and splatted into ``nn.Sequential(*layers)``, helper functions returning layer lists
    (``*block(...)``), and ``forward`` methods.

    Fix (manual): swap the two layers.

    safetorch: ``st.lint_model`` reports the same on a built model at runtime.
    """

    code = "ST009"

    # 5 of 6 on the held-out half once the thirteenth batch was labelled (stop 56: its one
    # finding there wrong): below the 97% bar, so preview (docs/check.md).
    preview = True

    name = "dropout-before-bn"
    torch_symbols = ()

    def finish(self) -> None:
        flow = layer_flow(self.ctx)
        if flow is None:
            return
        for layer, norm in _followed_by_norm(flow, _DROPOUTS):
            self.report(
                layer.call,
                f"{short_name(layer.kind)} right before {short_name(norm)} shifts the statistics "
                "BatchNorm sees between train and eval: put Dropout after BatchNorm "
                "(st.lint_model finds this at runtime)",
            )
