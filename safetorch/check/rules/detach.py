"""An in-place op on a ``.detach()`` result (ST005): ``st.safe_copy``'s pitfall."""

from __future__ import annotations

import ast
from typing import Dict, List, Optional, Set, Tuple, Union

from safetorch.check.engine import UNSAFE, Context, Fix
from safetorch.check.rules._base import Rule
from safetorch.check.rules._helpers import FUNCTION_DEFS, Pos, bound_names, end_of, start_of

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


def _detach_call(node: ast.AST) -> Optional[Tuple[ast.Call, ast.expr]]:
    """``(call, x)`` for an ``x.detach()`` call, else None."""
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "detach"
        and not node.args
        and not node.keywords
    ):
        return node, node.func.value
    return None


def _fresh_copy(ctx: Context, node: Optional[ast.AST]) -> bool:
    """``x.clone()``, ``torch.clone(x)``, ``torch.zeros(...)``, ``torch.cat(...)``, or the
    ``.detach()`` of one: a new tensor nothing else refers to, so what its ``.detach()``
    shares memory with is that copy alone (torch's own optimizers write
    ``buf = torch.clone(grad).detach()``)."""
    if not isinstance(node, ast.Call):
        return False
    detached = _detach_call(node)
    if detached is not None:
        return _fresh_copy(ctx, detached[1])
    func = node.func
    return (isinstance(func, ast.Attribute) and func.attr == "clone") or ctx.qualname(
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


# In-place ops whose point is to write *into* the destination: ``p.detach().copy_(new)`` is the
# documented way to overwrite a parameter outside autograd, so a clone would break it.
_WRITE_THROUGH = frozenset({"copy_", "set_"})


class _Detached:
    """A ``name = <expr>.detach()`` binding and what happens to the name afterwards."""

    __slots__ = ("call", "source", "scope", "ops", "read_after_write")

    def __init__(self, call: ast.Call, source: ast.expr, scope: ast.AST) -> None:
        self.call = call
        self.source = source  # the x of x.detach()
        self.scope = scope
        self.ops: List[Tuple[str, int, Pos]] = []  # (operation, line, end of the op)
        self.read_after_write = False


class _Names:
    """The reads and bindings of plain names in one scope, with positions (source order)."""

    __slots__ = ("reads", "binds", "loops")

    def __init__(self) -> None:
        self.reads: Dict[str, List[Pos]] = {}
        self.binds: Dict[str, List[Optional[ast.expr]]] = {}  # value bound, None if unknown
        self.loops: List[Tuple[Pos, Pos]] = []


class DetachThenInPlace(Rule):
    """ST005: the result of ``.detach()`` is modified in place.

    ``x.detach()`` is a new tensor that *shares memory* with ``x``: ``y = x.detach();
    y.add_(1)`` (or ``x.detach().zero_()``, ``y[0] = 0``, ``y += 1``) also changes ``x``,
    and autograd then fails with "one of the variables needed for gradient computation has
    been modified by an inplace operation" -- or, worse, silently computes wrong gradients.

    The rule reports it on evidence that the write reaches a tensor that matters: ``x`` is
    read after the write, is a parameter of the function (the caller's tensor), an attribute
    or a global (state that outlives the call), or the output of a model or function (it
    requires grad). It is quiet where the detached tensor is a fresh one anyway: the
    ``.detach()`` of a copy or a new tensor (``torch.clone(g).detach()``,
    ``torch.zeros(n).detach()``, a local bound to one and not read again), a gradient
    (``p.grad.detach().mul_(scale)`` writes into the gradient on purpose), or a chain that
    copies (``.detach().clone()``; ``.detach().cpu()`` and ``.detach().float()`` copy only a
    CUDA or a non-float32 tensor, so they are not followed at all).

    Fix (unsafe, ``--unsafe-fixes``): ``.detach().clone()``, an independent copy: the
    original tensor is no longer modified, which changes behaviour on purpose. Offered only where the
    modified value is used afterwards and the op is not a write-through idiom. A statement
    whose only effect is the write into ``x`` (``x.detach().zero_()`` on its own line,
    ``y = x.detach(); y.copy_(src)``) would become dead code with a clone, so it is reported
    without a fix: write it as ``with torch.no_grad(): x.zero_()`` if the write is intended.

    safetorch: ``st.safe_copy``.
    """

    code = "ST005"

    preview = True  # below 97% on the held-out corpus half (docs/check.md)

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
        self._direct: List[Tuple[ast.Call, ast.expr, str, int, bool, ast.AST, Pos]] = []
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
    def _fresh_value(self, value: ast.expr) -> bool:
        """A value that is a new tensor nothing else refers to: a copy, a factory's result,
        arithmetic (``a + b``), or the ``.detach()`` of one."""
        detached = _detach_call(value)
        if detached is not None:
            return self._fresh_value(detached[1])
        return isinstance(value, (ast.BinOp, ast.UnaryOp)) or _fresh_copy(self.ctx, value)

    def _evidence(self, source: ast.expr, scope: ast.AST, after: Pos) -> Optional[str]:
        """Why writing into ``source`` (the x of ``x.detach()``) matters, or None when it is a
        fresh tensor or a gradient: ``"it is read at line N"``, ``"it is the caller's"``, ..."""
        if _is_gradient(source):
            return None
        node: ast.AST = source
        while isinstance(node, ast.Subscript):  # x[0].detach(): a view of x
            node = node.value
        if isinstance(node, ast.Attribute):
            return "it is an attribute, state that outlives this code"
        if isinstance(node, ast.Call):
            if _fresh_copy(self.ctx, node):
                return None
            return "it is the output of a call, which requires grad when a model made it"
        if not isinstance(node, ast.Name):
            return None  # (a + b).detach(): a new tensor nothing else refers to
        name = node.id
        names = self._scope_names(scope)
        later = [p for p in names.reads.get(name, []) if p > after]
        if later:
            return f"{name} is read again at line {later[0][0]}"
        if isinstance(scope, FUNCTION_DEFS):
            args = scope.args
            params = [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]
            if any(p is not None and p.arg == name for p in params):
                return f"{name} is a parameter: the caller's tensor changes"
        binds = names.binds.get(name)
        if not binds:
            return f"{name} is not bound here: a global or enclosing tensor changes"
        if any(v is not None and _is_gradient(v) for v in binds):
            return None  # g = p.grad: a gradient
        if all(v is not None and self._fresh_value(v) for v in binds):
            # A fresh tensor of this scope: only a read in the same loop (next iteration) sees
            # the write.
            reads = names.reads.get(name, [])
            for lo, hi in names.loops:
                if lo <= after <= hi and any(lo <= p <= hi for p in reads):
                    return f"{name} is read again in the loop"
            return None
        return f"{name} is bound to a tensor that may require grad or be used elsewhere"

    def _report(
        self, detach: ast.Call, source: ast.expr, op: str, line: int, fixable: bool, why: str
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
            why = self._evidence(source, scope, after)
            if why is not None:
                self._report(detach, source, op, line, fixable, why)
        for binding in self._mutated:
            op, line, after = binding.ops[0]
            why = self._evidence(binding.source, binding.scope, after)
            if why is None:
                continue
            fixable = binding.read_after_write and not any(
                o.strip(".()") in _WRITE_THROUGH for o, _, _ in binding.ops
            )
            self._report(binding.call, binding.source, op, line, fixable, why)
