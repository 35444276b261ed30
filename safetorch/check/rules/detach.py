"""An in-place op on a ``.detach()`` result (ST005): ``st.safe_copy``'s pitfall."""

from __future__ import annotations

import ast
from typing import Dict, List, Optional, Set, Tuple

from safetorch.check.engine import UNSAFE, Context, Fix
from safetorch.check.rules._base import Rule
from safetorch.check.rules._helpers import bound_names

# Trailing-underscore methods that do not write the tensor's data.
_NOT_DATA_WRITES = frozenset({"requires_grad_", "share_memory_", "detach_", "retain_grad_"})


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


def _fresh_copy(ctx: Context, node: ast.AST) -> bool:
    """``x.clone()`` / ``torch.clone(x)``: a new tensor nothing else refers to, so what its
    ``.detach()`` shares memory with is that copy alone (torch's own optimizers write
    ``buf = torch.clone(grad).detach()``)."""
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    return (isinstance(func, ast.Attribute) and func.attr == "clone") or ctx.qualname(
        func
    ) == "torch.clone"


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

    __slots__ = ("call", "source", "ops", "read_after_write")

    def __init__(self, call: ast.Call, source: ast.expr) -> None:
        self.call = call
        self.source = source  # the x of x.detach()
        self.ops: List[Tuple[str, int]] = []  # (operation, line)
        self.read_after_write = False


class DetachThenInPlace(Rule):
    """ST005: the result of ``.detach()`` is modified in place.

    ``x.detach()`` is a new tensor that *shares memory* with ``x``: ``y = x.detach();
    y.add_(1)`` (or ``x.detach().zero_()``, ``y[0] = 0``, ``y += 1``) also changes ``x``,
    and autograd then fails with "one of the variables needed for gradient computation has
    been modified by an inplace operation" -- or, worse, silently computes wrong gradients.

    Fix (unsafe, ``--unsafe-fixes``): ``.detach().clone()``, an independent copy: the
    original tensor is no longer modified, which changes behaviour on purpose. Offered only where the
    modified value is used afterwards and the op is not a write-through idiom. A statement
    whose only effect is the write into ``x`` (``x.detach().zero_()`` on its own line,
    ``y = x.detach(); y.copy_(src)``) would become dead code with a clone, so it is reported
    without a fix: write it as ``with torch.no_grad(): x.zero_()`` if the write is intended.
    The ``.detach()`` of a fresh copy (``torch.clone(g).detach()``) shares memory with nothing
    else and is not reported.

    Preview: neither finding on the labelled corpus of real repositories
    (``benchmarks/check_corpus``) was a bug (0 of 2: a write into ``p.grad`` on purpose, a
    clone's detach, now quiet).

    safetorch: ``st.safe_copy``.
    """

    # Opt-in: 0 of 2 findings right on the labelled corpus (benchmarks/check_corpus).
    preview = True
    code = "ST005"

    name = "detach-then-inplace"
    torch_symbols = ("torch.Tensor.detach",)
    fixable = True
    fix_applicability = UNSAFE
    node_types = (ast.Assign, ast.AugAssign, ast.Call, ast.Expr, ast.Name)

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self._bound: Dict[int, Dict[str, _Detached]] = {}  # scope -> name -> binding
        self._mutated: List[_Detached] = []
        # (x.detach() call, x, op, line, fixable)
        self._direct: List[Tuple[ast.Call, ast.expr, str, int, bool]] = []
        self._not_reads: Set[int] = set()  # Name nodes that are the target of a mutation
        self._discarded: Set[int] = set()  # calls whose value is thrown away

    def _binding(self, node: ast.AST) -> Optional[_Detached]:
        if isinstance(node, ast.Name):
            return self._bound.get(id(self.ctx.scope), {}).get(node.id)
        return None

    def _mutation(self, target: ast.AST, op: str, line: int, value_used: bool) -> None:
        """Record ``op`` applied in place to ``target`` (a name or an ``x.detach()`` call)."""
        detached = _detach_call(target)
        if detached is not None:
            call, source = detached
            if _fresh_copy(self.ctx, source):
                return
            fixable = value_used and op.strip(".()") not in _WRITE_THROUGH
            self._direct.append((call, source, op, line, fixable))
            return
        binding = self._binding(target)
        if binding is not None:
            if not binding.ops:
                self._mutated.append(binding)
            binding.ops.append((op, line))
            self._not_reads.add(id(target))

    def visit(self, node: ast.AST) -> None:
        if isinstance(node, ast.Name):
            if isinstance(node.ctx, ast.Load) and id(node) not in self._not_reads:
                binding = self._binding(node)
                if binding is not None and binding.ops:
                    binding.read_after_write = True
        elif isinstance(node, ast.Expr):
            self._discarded.add(id(node.value))
        elif isinstance(node, ast.Call):
            func = node.func
            method = _inplace_method(func)
            if method is not None and isinstance(func, ast.Attribute):
                used = id(node) not in self._discarded
                self._mutation(func.value, f".{method}()", node.lineno, used)
        elif isinstance(node, ast.AugAssign):
            target = node.target
            base = target.value if isinstance(target, ast.Subscript) else target
            self._mutation(base, "augmented assignment", node.lineno, False)
        else:
            assert isinstance(node, ast.Assign)
            bound = self._bound.setdefault(id(self.ctx.scope), {})
            for assigned in node.targets:
                if isinstance(assigned, ast.Subscript):
                    self._mutation(assigned.value, "item assignment", node.lineno, False)
                if bound:
                    for name in bound_names(assigned):
                        bound.pop(name, None)
            first = node.targets[0]
            if len(node.targets) == 1 and isinstance(first, ast.Name):
                detached = _detach_call(node.value)
                if detached is not None and not _fresh_copy(self.ctx, detached[1]):
                    bound[first.id] = _Detached(*detached)

    def _report(
        self, detach: ast.Call, source: ast.expr, op: str, line: int, fixable: bool
    ) -> None:
        x = self.ctx.segment(source)
        head = f"{self.ctx.segment(detach)} shares memory with {x} and is modified in place "
        head += f"({op}, line {line}), which changes {x} too"
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
        for detach, source, op, line, fixable in self._direct:
            self._report(detach, source, op, line, fixable)
        for binding in self._mutated:
            op, line = binding.ops[0]
            fixable = binding.read_after_write and not any(
                o.strip(".()") in _WRITE_THROUGH for o, _ in binding.ops
            )
            self._report(binding.call, binding.source, op, line, fixable)
