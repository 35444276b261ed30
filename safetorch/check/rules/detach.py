"""An in-place op on a ``.detach()`` result (ST005): ``st.safe_copy``'s pitfall."""

from __future__ import annotations

import ast
from typing import Dict, List, Optional, Set, Tuple, Union

from safetorch.check.engine import UNSAFE, Context, Fix
from safetorch.check.rules._base import Rule
from safetorch.check.rules._helpers import Pos, bound_names, end_of, self_attr, start_of

# Trailing-underscore methods that do not write the tensor's data.
_NOT_DATA_WRITES = frozenset({"requires_grad_", "share_memory_", "detach_", "retain_grad_"})

# torch functions whose result is a new tensor nothing else refers to (and that requires no
# grad unless asked): what its ``.detach()`` shares memory with is that tensor alone.
_FRESH = frozenset(
    f"torch.{n}"
    for n in (
        "clone",
        "zeros",
        "ones",
        "empty",
        "full",
        "rand",
        "randn",
        "randint",
        "randperm",
        "arange",
        "linspace",
        "logspace",
        "eye",
        "tensor",
        "zeros_like",
        "ones_like",
        "empty_like",
        "full_like",
        "rand_like",
        "randn_like",
        "randint_like",
        "cat",
        "stack",
    )
)


# Tensor methods whose result is a new tensor: a copy, or one made like ``x`` (``x.new(n)``,
# ``x.new_zeros(n)``) that shares nothing with it.
_FRESH_METHODS = frozenset(
    {"clone", "new", "new_zeros", "new_ones", "new_empty", "new_full", "new_tensor"}
)


def _detach_call(node: ast.AST) -> Optional[Tuple[ast.expr, ast.expr]]:
    """``(node, x)`` for an ``x.detach()`` call or an ``x.data`` read, else None: both are
    ``x``'s memory outside autograd."""
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "detach"
        and not node.args
        and not node.keywords
    ):
        return node, node.func.value
    if isinstance(node, ast.Attribute) and node.attr == "data" and isinstance(node.ctx, ast.Load):
        return node, node.value
    return None


def _fresh_copy(ctx: Context, node: Optional[ast.AST]) -> bool:
    """``x.clone()``, ``x.new(n)``, ``torch.clone(x)``, ``torch.zeros(...)``, ``torch.cat(...)``, or the
    ``.detach()`` of one: a new tensor nothing else refers to, so what its ``.detach()``
    shares memory with is that copy alone (torch's own optimizers write
    ``buf = torch.clone(grad).detach()``)."""
    if not isinstance(node, ast.Call):
        return False
    detached = _detach_call(node)
    if detached is not None:
        return _fresh_copy(ctx, detached[1])
    func = node.func
    return (isinstance(func, ast.Attribute) and func.attr in _FRESH_METHODS) or ctx.qualname(
        func
    ) in _FRESH


def _is_gradient(node: ast.AST) -> bool:
    """``p.grad``, ``p.grad.data``, ``p.grad[0]``: a gradient, which is not part of a graph;
    writing into it through ``.detach()`` (clipping, scaling) is the point, not a slip."""
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        if isinstance(node, ast.Attribute) and node.attr == "grad":
            return True
        node = node.value
    return False


def _inplace_method(func: ast.expr) -> Optional[str]:
    """The name of the in-place method ``func`` (``x.add_``) calls, if it writes data."""
    if isinstance(func, ast.Attribute):
        attr = func.attr
        if attr.endswith("_") and not attr.startswith("_") and attr not in _NOT_DATA_WRITES:
            return attr
    return None


# Calls that start or run a backward pass.
_BACKWARD = frozenset({"torch.autograd.grad", "torch.autograd.backward"})
# Contexts and decorators that turn autograd off.
_NO_GRAD = frozenset({"torch.no_grad", "torch.inference_mode"})
# torch functions whose result is data, not part of a graph.
_DATA = frozenset(
    {"torch.from_numpy", "torch.as_tensor", "torch.load", "torch.Tensor", "torch.tensor"}
    | {"torch.FloatTensor", "torch.LongTensor", "torch.no_grad"}
)
# Methods whose result is not a graph tensor (a copy, the host's data, a number).
_NOT_GRAPH_METHODS = frozenset(
    {"clone", "cpu", "numpy", "item", "tolist", "detach", "new_zeros", "new_ones", "new_empty"}
    | {"new_full", "new_tensor", "size", "dim", "numel", "state_dict", "parameters", "copy"}
)
# Tensor methods that keep a graph tensor in the graph.
_TENSOR_OPS = frozenset(
    {"sigmoid", "softmax", "log_softmax", "tanh", "relu", "view", "reshape", "permute", "sum"}
    | {"mean", "exp", "log", "squeeze", "unsqueeze", "transpose", "flatten", "contiguous", "to"}
    | {"cuda", "float", "half", "abs", "clamp", "pow", "max", "min", "mul", "add", "sub", "div"}
)


# In-place ops whose point is to write *into* the destination: ``p.detach().copy_(new)`` is the
# documented way to overwrite a parameter outside autograd, so a clone would break it.
_WRITE_THROUGH = frozenset({"copy_", "set_"})


class _Detached:
    """A ``name = <expr>.detach()`` binding and what happens to the name afterwards."""

    __slots__ = ("call", "source", "scope", "ops", "read_after_write")

    def __init__(self, call: ast.expr, source: ast.expr, scope: ast.AST) -> None:
        self.call = call
        self.source = source  # the x of x.detach()
        self.scope = scope
        self.ops: List[Tuple[str, int, Pos]] = []  # (operation, line, end of the op)
        self.read_after_write = False


class _Names:
    """The reads and bindings of plain names in one scope, with positions (source order)."""

    __slots__ = ("reads", "binds", "loops", "backward")

    def __init__(self) -> None:
        self.reads: Dict[str, List[Pos]] = {}
        self.binds: Dict[str, List[Optional[ast.expr]]] = {}  # value bound, None if unknown
        self.loops: List[Tuple[Pos, Pos]] = []
        self.backward: List[Pos] = []  # .backward() / torch.autograd.grad(...) calls


class DetachThenInPlace(Rule):
    """ST005: the result of ``.detach()`` is modified in place.

    ``x.detach()`` is a new tensor that *shares memory* with ``x``: ``y = x.detach();
    y.add_(1)`` (or ``x.detach().zero_()``, ``y[0] = 0``, ``y += 1``) also changes ``x``,
    and autograd then fails with "one of the variables needed for gradient computation has
    been modified by an inplace operation" -- or, worse, silently computes wrong gradients.

    The rule reports it (``.detach()`` and ``.data`` alike) on evidence, within one
    function, that the write corrupts values autograd or the code still needs: ``x`` is a
    local name bound only to a tensor in a graph (the output of a model or function call,
    ``self.net(h)``, or an op on one, ``h.relu()``, ``h * 2``); ``x`` is read again after
    the write; and a backward runs after the write (``.backward()``,
    ``torch.autograd.grad``) or the function is a ``forward``, whose output the caller
    differentiates, and the write goes through ``.detach()`` (a write through ``x.data`` in a
    forward, ``scores.data.masked_fill_(mask, -inf)`` before a softmax, is the old spelling of
    a write meant to reach ``x``: only a backward in the function is evidence there). It is
    quiet without that evidence: a parameter of the function or a
    global (nothing shows it is in a graph), an attribute (an EMA copy, a buffer, state
    written outside autograd on purpose), the output of a call nothing else holds, a copy
    or a factory's tensor (``torch.clone(g).detach()``, ``torch.zeros(n)``, ``x.new(n)``), data
    (``torch.from_numpy``), a gradient (``p.grad.detach().mul_(scale)``), a loop variable
    (``for p in params: p.data.add_(...)``), a tensor made under ``torch.no_grad()``, an
    original not used after the write, or a chain that copies (``.detach().clone()``;
    ``.detach().cpu()`` and ``.detach().float()`` copy only a CUDA or a non-float32 tensor,
    so they are not followed at all).

    Fix (unsafe, ``--unsafe-fixes``): ``.detach().clone()``, an independent copy: the
    original tensor is no longer modified, which changes behaviour on purpose. Offered only where the
    modified value is used afterwards and the op is not a write-through idiom. A statement
    whose only effect is the write into ``x`` (``x.detach().zero_()`` on its own line,
    ``y = x.detach(); y.copy_(src)``) would become dead code with a clone, so it is reported
    without a fix: write it as ``with torch.no_grad(): x.zero_()`` if the write is intended.

    safetorch: ``st.safe_copy``.
    """

    code = "ST005"

    # Rewritten for issue 33 (evidence of a graph still used); no finding on the development
    # half to measure it by (the fourth batch added none either), so it stays opt-in until
    # the held-out half is measured again.
    preview = True

    name = "detach-then-inplace"
    torch_symbols = ("torch.Tensor.detach",)
    fixable = True
    fix_applicability = UNSAFE
    node_types = (
        ast.Assign,
        ast.AugAssign,
        ast.Call,
        ast.Expr,
        ast.Name,
        ast.For,
        ast.AsyncFor,
        ast.While,
    )

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self._bound: Dict[int, Dict[str, _Detached]] = {}  # scope -> name -> binding
        self._mutated: List[_Detached] = []
        # (x.detach() call, x, op, line, fixable, scope, end of the op)
        self._direct: List[Tuple[ast.expr, ast.expr, str, int, bool, ast.AST, Pos]] = []
        self._not_reads: Set[int] = set()  # Name nodes that are the target of a mutation
        self._discarded: Set[int] = set()  # calls whose value is thrown away
        self._names: Dict[int, _Names] = {}  # scope -> its names
        self._assigned: Dict[int, ast.expr] = {}  # id(Name target) -> the value bound to it

    def _scope_names(self, scope: Optional[ast.AST] = None) -> _Names:
        key = id(self.ctx.scope if scope is None else scope)
        found = self._names.get(key)
        if found is None:
            found = self._names[key] = _Names()
        return found

    def _binding(self, node: ast.AST) -> Optional[_Detached]:
        if isinstance(node, ast.Name):
            return self._bound.get(id(self.ctx.scope), {}).get(node.id)
        return None

    def _mutation(
        self, target: ast.AST, op: str, node: Union[ast.expr, ast.stmt], value_used: bool
    ) -> None:
        """Record ``op`` (``node``) applied in place to ``target`` (a name or an
        ``x.detach()`` call)."""
        line, after = node.lineno, end_of(node)
        detached = _detach_call(target)
        if detached is not None:
            call, source = detached
            fixable = value_used and op.strip(".()") not in _WRITE_THROUGH
            self._direct.append((call, source, op, line, fixable, self.ctx.scope, after))
            return
        binding = self._binding(target)
        if binding is not None:
            if not binding.ops:
                self._mutated.append(binding)
            binding.ops.append((op, line, after))
            self._not_reads.add(id(target))

    def visit(self, node: ast.AST) -> None:
        if isinstance(node, ast.Name):
            names = self._scope_names()
            if isinstance(node.ctx, ast.Load):
                names.reads.setdefault(node.id, []).append(start_of(node))
                if id(node) not in self._not_reads:
                    binding = self._binding(node)
                    if binding is not None and binding.ops:
                        binding.read_after_write = True
            else:
                names.binds.setdefault(node.id, []).append(self._assigned.get(id(node)))
        elif isinstance(node, (ast.For, ast.AsyncFor, ast.While)):
            self._scope_names().loops.append((start_of(node), end_of(node)))
        elif isinstance(node, ast.Expr):
            self._discarded.add(id(node.value))
        elif isinstance(node, ast.Call):
            func = node.func
            if (isinstance(func, ast.Attribute) and func.attr == "backward") or self.ctx.qualname(
                func
            ) in _BACKWARD:
                self._scope_names().backward.append(start_of(node))
            method = _inplace_method(func)
            if method is not None and isinstance(func, ast.Attribute):
                used = id(node) not in self._discarded
                self._mutation(func.value, f".{method}()", node, used)
        elif isinstance(node, ast.AugAssign):
            target = node.target
            base = target.value if isinstance(target, ast.Subscript) else target
            self._mutation(base, "augmented assignment", node, False)
        else:
            assert isinstance(node, ast.Assign)
            bound = self._bound.setdefault(id(self.ctx.scope), {})
            for assigned in node.targets:
                if isinstance(assigned, ast.Subscript):
                    self._mutation(assigned.value, "item assignment", node, False)
                if bound:
                    for name in bound_names(assigned):
                        bound.pop(name, None)
            first = node.targets[0]
            if len(node.targets) == 1 and isinstance(first, ast.Name):
                self._assigned[id(first)] = node.value
                detached = _detach_call(node.value)
                if detached is not None:
                    bound[first.id] = _Detached(*detached, self.ctx.scope)

    # -- evidence ----------------------------------------------------------------------------
    def _evidence(
        self, source: ast.expr, scope: ast.AST, after: Pos, data: bool = False
    ) -> Optional[str]:
        """Why writing into ``source`` (the x of ``x.detach()``) corrupts what autograd or the
        code still needs, or None without that evidence. It needs all of: ``x`` is a local
        name of this function bound only to a value in a graph (a model's output, an op on
        one; not a copy, a factory, a gradient, data, or anything made under ``no_grad``);
        ``x`` is read again after the write; and a backward runs after the write in this
        function, or the function is a ``forward`` (its output is differentiated by the
        caller) and the write goes through ``.detach()``. ``data``: the write goes through
        ``x.data``, the old spelling of a write meant to reach ``x`` outside autograd
        (attention scores masked in a forward, ``energies.data.masked_fill_(mask, -inf)``):
        only a backward in the function is evidence then."""
        if _is_gradient(source):
            return None
        node: ast.AST = source
        while isinstance(node, ast.Subscript):  # x[0].detach(): a view of x
            node = node.value
        if not isinstance(node, ast.Name):
            return None  # an attribute (state, an EMA copy), a call's output nothing else holds
        name = node.id
        names = self._scope_names(scope)
        binds = names.binds.get(name)
        if not binds or not all(v is not None and self._in_graph(v, names, 0) for v in binds):
            return None  # a parameter, a global, a copy, a factory's tensor, a loop variable
        if self._without_grad(scope, after):
            return None
        later = [p for p in names.reads.get(name, []) if p > after]
        if not later:
            return None  # the original is not used after the write
        backward = [p for p in names.backward if p > after]
        where = f"{name} is a graph's output, read again at line {later[0][0]}"
        if backward:
            return f"{where}, and backward runs at line {backward[0][0]}"
        if getattr(scope, "name", "") == "forward" and not data:
            return f"{where} of a forward whose output is differentiated"
        return None

    def _in_graph(self, value: ast.AST, names: _Names, depth: int) -> bool:
        """``value`` is a tensor in an autograd graph: the output of a model or function call
        (``self.net(x)``, ``model(x)``), or an op on one (``h.sigmoid()``, ``torch.relu(h)``,
        ``h * 2``); not a copy, a factory's tensor, data (``torch.from_numpy``), a gradient."""
        if depth > 4:
            return False
        if isinstance(value, (ast.BinOp, ast.UnaryOp)):
            parts = [value.left, value.right] if isinstance(value, ast.BinOp) else [value.operand]
            return any(self._in_graph(p, names, depth + 1) for p in parts)
        if isinstance(value, ast.Subscript):
            return self._in_graph(value.value, names, depth + 1)
        if isinstance(value, ast.Name):
            binds = names.binds.get(value.id) or []
            return bool(binds) and all(
                v is not None and self._in_graph(v, names, depth + 1) for v in binds
            )
        if not isinstance(value, ast.Call) or _is_gradient(value) or _fresh_copy(self.ctx, value):
            return False
        func = value.func
        qual = self.ctx.qualname(func) or ""
        if qual in _DATA or _detach_call(value) is not None:
            return False
        if qual.startswith("torch."):
            args = [*value.args, *(k.value for k in value.keywords)]
            return any(self._in_graph(a, names, depth + 1) for a in args)
        if isinstance(func, ast.Attribute):
            if func.attr in _NOT_GRAPH_METHODS:
                return False
            if self_attr(func) is not None:
                return True  # self.net(x): a submodule's forward
            if func.attr in _TENSOR_OPS or isinstance(func.value, ast.Name):
                # h.sigmoid(), h.view(-1): a graph tensor's op; model.forward(x) too
                return self._in_graph(func.value, names, depth + 1) or func.attr == "forward"
            return False
        return isinstance(func, ast.Name)  # model(x), net(x): a forward

    def _without_grad(self, scope: ast.AST, where: Pos) -> bool:
        """``where`` runs with autograd off: the function is decorated ``@torch.no_grad()``
        (or ``inference_mode``), or ``where`` is in a ``with torch.no_grad():`` block."""
        qual = self.ctx.qualname
        for deco in getattr(scope, "decorator_list", []):
            target = deco.func if isinstance(deco, ast.Call) else deco
            if qual(target) in _NO_GRAD:
                return True
        for node in self.ctx.walk(scope):
            if isinstance(node, (ast.With, ast.AsyncWith)) and any(
                isinstance(i.context_expr, ast.Call) and qual(i.context_expr.func) in _NO_GRAD
                for i in node.items
            ):
                if start_of(node) <= where <= end_of(node):
                    return True
        return False

    def _report(
        self, detach: ast.expr, source: ast.expr, op: str, line: int, fixable: bool, why: str
    ) -> None:
        x = self.ctx.segment(source)
        head = f"{self.ctx.segment(detach)} shares memory with {x} and is modified in place "
        head += f"({op}, line {line}), which changes {x} too ({why})"
        if fixable:
            # Unsafe: the original tensor is no longer written, which is the point but is
            # a change of behaviour.
            fix = Fix("add .clone()", (self.ctx.insert_after(detach, ".clone()"),), UNSAFE)
            self.report(detach, head + ": use .detach().clone() or st.safe_copy", fix)
        else:
            self.report(
                detach,
                head + f": if writing into {x} is intended, write it under torch.no_grad() "
                "without detach(); otherwise use .detach().clone() or st.safe_copy",
            )

    def finish(self) -> None:
        for detach, source, op, line, fixable, scope, after in self._direct:
            why = self._evidence(source, scope, after, isinstance(detach, ast.Attribute))
            if why is not None:
                self._report(detach, source, op, line, fixable, why)
        for binding in self._mutated:
            op, line, after = binding.ops[0]
            data = isinstance(binding.call, ast.Attribute)
            why = self._evidence(binding.source, binding.scope, after, data)
            if why is None:
                continue
            fixable = binding.read_after_write and not any(
                o.strip(".()") in _WRITE_THROUGH for o, _, _ in binding.ops
            )
            self._report(binding.call, binding.source, op, line, fixable, why)
