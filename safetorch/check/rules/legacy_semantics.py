"""Same spelling, another result since torch 0.3 (ST025 integer ``/``, ST026 ``.view`` of an
element-wise result): the ``legacy`` patch's pitfall (``safetorch run`` gives 0.3's result in a
0.3-era project); the removed APIs are in ``legacy_0_4`` and ``legacy_1_x``."""

from __future__ import annotations

import ast
import os
from typing import Optional, Union

from safetorch._eras import marks_0_3
from safetorch.check.engine import UNSAFE, Context, Fix
from safetorch.check.fixer import parents
from safetorch.check.rules._base import Rule
from safetorch.check.rules._helpers import Pos, start_of
from safetorch.check.rules._zero_dim import Unpacked, ZeroDim, int_constant

__all__ = ["LegacyIntegerDivision", "ViewOfStridedResult"]

_FACTS_KEY = "ST025-era-0.3"

# Producers of integer tensors: methods of a tensor, and torch functions.
_INT_METHODS = frozenset({"long", "int", "short", "byte", "argmax", "argmin", "argsort"})
_INT_METHODS |= frozenset({"multinomial", "nonzero"})
_INT_FUNCTIONS = frozenset({"LongTensor", "IntTensor", "ShortTensor", "ByteTensor"})
_INT_FUNCTIONS |= frozenset({"argmax", "argmin", "argsort", "randint", "multinomial", "nonzero"})
# Methods that keep the dtype of the tensor they are called on.
_SAME_DTYPE = frozenset({"view", "reshape", "squeeze", "unsqueeze", "t", "contiguous", "clone"})
_SAME_DTYPE |= frozenset({"cpu", "cuda", "detach", "expand", "expand_as", "flatten", "repeat"})
# (values, indices) pairs: element 1 is a LongTensor.
_PAIRS = frozenset({"max", "min", "median", "mode", "kthvalue", "topk", "sort"})
# Python ints from a tensor: x.size(0), x.numel(), x.dim().
_INT_OF_TENSOR = frozenset({"size", "numel", "dim", "nelement", "ndimension"})
# Operators that keep integers integers.
_INT_OPS = (ast.Add, ast.Sub, ast.Mult, ast.FloorDiv, ast.Mod)
# Layout changes whose result keeps the strides it was given.
_STRIDED = frozenset({"transpose", "permute", "t", "expand", "expand_as"})


def _is_0_3_project(ctx: Context) -> bool:
    """Whether a file of the project (this one included) shows torch 0.3-era code: the
    evidence the ``legacy`` patch asks for before it changes a result."""
    if marks_0_3(ctx.source.encode("utf-8", "replace")):
        return True
    root = ctx.project.root or ""

    def marked(tree: ast.Module, relpath: str) -> bool:
        try:
            with open(os.path.join(root, relpath), "rb") as f:
                return marks_0_3(f.read(1 << 20))
        except OSError:
            return False

    mine = ctx.project.relpath(ctx.path)
    return any(v for rel, v in ctx.project_facts(_FACTS_KEY, marked).items() if rel != mine)


class _Integers:
    """Whether an expression is an integer tensor of one or more dimensions, or a Python
    int, from what produced it (ST025)."""

    def __init__(self, flow: ZeroDim) -> None:
        self.flow = flow
        self.ctx = flow.ctx

    def tensor(self, expr: ast.AST, at: Pos, scope: ast.AST, depth: int = 0) -> bool:
        """An integer tensor (the caller checks its dimensions)."""
        if depth > 8:
            return False
        depth += 1
        flow = self.flow
        if isinstance(expr, ast.Attribute) and expr.attr == "data":
            return self.tensor(expr.value, at, scope, depth)
        if isinstance(expr, ast.Name):
            found = flow.binding(expr.id, at, scope)
            return found is not None and self.tensor(found[0], found[1], found[2], depth)
        if isinstance(expr, Unpacked):
            return expr.index == 1 and self._pair(expr.value)  # _, idx = x.topk(k)
        if isinstance(expr, ast.Subscript):
            if int_constant(expr.slice) == 1 and self._pair(expr.value):
                return True  # x.max(1)[1]
            return False
        if isinstance(expr, ast.BinOp) and isinstance(expr.op, _INT_OPS):
            sides = (expr.left, expr.right)
            tensors = [self.tensor(s, at, scope, depth) for s in sides]
            ints = [t or self.number(s, at, scope, depth) for s, t in zip(sides, tensors)]
            return any(tensors) and all(ints)
        if not isinstance(expr, ast.Call):
            return False
        qual = self.ctx.qualname(expr.func) or ""
        if qual.startswith("torch.") and qual.count(".") == 1:
            name = qual[len("torch.") :]
            if name == "arange":
                return bool(expr.args) and all(self.number(a, at, scope) for a in expr.args)
            return name in _INT_FUNCTIONS
        func = expr.func
        if not isinstance(func, ast.Attribute) or qual:
            return False
        if func.attr in _INT_METHODS:
            return True
        if func.attr in _SAME_DTYPE:
            return self.tensor(func.value, at, scope, depth)
        return False

    def _pair(self, call: ast.AST) -> bool:
        return (
            isinstance(call, ast.Call)
            and isinstance(call.func, ast.Attribute)
            and call.func.attr in _PAIRS
            and not self.ctx.qualname(call.func)
        )

    def number(self, expr: ast.AST, at: Pos, scope: ast.AST, depth: int = 0) -> bool:
        """A Python int: a literal, ``len(...)``, ``int(...)``, ``x.size(0)``,
        ``x.shape[1]``, a ``range`` loop variable, integer arithmetic of those."""
        if depth > 8:
            return False
        depth += 1
        if isinstance(expr, ast.Constant):
            return type(expr.value) is int
        if isinstance(expr, ast.UnaryOp) and isinstance(expr.op, ast.USub):
            return self.number(expr.operand, at, scope, depth)
        if isinstance(expr, ast.BinOp) and isinstance(expr.op, _INT_OPS):
            return self.number(expr.left, at, scope, depth) and self.number(
                expr.right, at, scope, depth
            )
        if isinstance(expr, ast.Call):
            func = expr.func
            if isinstance(func, ast.Name) and func.id in ("len", "int"):
                return func.id not in self.ctx.imports and not self.flow.functions(func.id)
            return (
                isinstance(func, ast.Attribute)
                and func.attr in _INT_OF_TENSOR
                and (func.attr != "size" or len(expr.args) == 1)
            )
        if isinstance(expr, ast.Subscript):
            value = expr.value
            return (
                isinstance(value, ast.Attribute)
                and value.attr == "shape"
                and int_constant(expr.slice) is not None
            )
        if isinstance(expr, ast.Name):
            found = self.flow.binding(expr.id, at, scope)
            if found is None:
                return self.flow.is_number(expr, at, scope)  # for i in range(...)
            return self.number(found[0], found[1], found[2], depth)
        return False


class LegacyIntegerDivision(Rule):
    """ST025: ``indices / n`` of an integer tensor in 0.3-era code (truncated then, a float
    tensor since torch 1.7).

    Up to torch 1.4 ``/`` of an integer tensor by an integer truncated (``LongTensor / int``
    was a LongTensor); 1.5 deprecated it, 1.6 raised, and since 1.7 it divides truly and
    returns a float tensor: a beam search's ``prev_k = best_scores_id / num_words`` now gives
    float indices, which break the embedding lookup or indexing that follows (``x /= n`` on
    an integer tensor raises). Reported in a project that shows 0.3-era code (a file builds
    or imports a ``Variable`` or passes ``volatile=``: the evidence ``safetorch run``
    asks for before it shims the division) where the dividend is evidently an integer
    tensor of one or more dimensions (the indices of ``topk``/``sort``/``max(dim)``,
    ``torch.LongTensor(...)``, ``.long()``, ``argmax``, ``torch.arange`` of ints, integer
    arithmetic of those; a 0-dim one stands for 0.3's Python number, which Python 3
    divides truly) and the divisor an integer (a literal, ``len(...)``, ``x.size(1)``, an
    integer tensor).

    Fix (unsafe, ``--unsafe-fixes``): ``torch.div(a, b, rounding_mode="trunc")``, 0.3's
    result (what ``safetorch run`` computes, ``st.legacy.div``); on a modern torch this
    changes the value ``/`` gives, so it is not automatic.

        prev_k = best_scores_id / num_words
          ->  prev_k = torch.div(best_scores_id, num_words, rounding_mode="trunc")
        counts /= 2  ->  counts.div_(2, rounding_mode="trunc")

    safetorch: ``st.legacy.div`` (``st.legacy.div_`` in place).
    """

    code = "ST025"

    preview = True  # new: no corpus figure yet

    name = "legacy-integer-division"
    uses = "st.legacy.div"
    torch_symbols = ("torch.Tensor.__truediv__", "torch.Tensor.__itruediv__")
    functions_by_symbol = {
        "torch.Tensor.__truediv__": "st.legacy.div",
        "torch.Tensor.__itruediv__": "st.legacy.div_",
    }
    fixable = True
    fix_applicability = UNSAFE
    node_types = (ast.BinOp, ast.AugAssign)

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self._integers: Optional[_Integers] = None
        self._era: Optional[bool] = None

    def visit(self, node: ast.AST) -> None:
        if not isinstance(getattr(node, "op", None), ast.Div):
            return
        if isinstance(node, ast.BinOp):
            statement: Union[ast.BinOp, ast.AugAssign] = node
            dividend, divisor = node.left, node.right
        elif isinstance(node, ast.AugAssign) and isinstance(node.target, (ast.Name, ast.Attribute)):
            statement = node
            dividend, divisor = node.target, node.value
        else:
            return
        if self._integers is None:
            self._integers = _Integers(ZeroDim(self.ctx))
        ints = self._integers
        at, scope = start_of(node), ints.flow.scope_of(node)
        if not ints.tensor(dividend, at, scope):
            return
        ndim = ints.flow.ndim(dividend, at, scope)
        if ndim is not None and ndim < 1:
            return
        if ndim is None and not self._shaped(dividend, at, scope):
            return
        if not (ints.number(divisor, at, scope) or ints.tensor(divisor, at, scope)):
            return
        if self._era is None:
            self._era = _is_0_3_project(self.ctx)
        if not self._era:
            return
        self.report(
            node,
            "torch 0.3 truncated / of an integer tensor; since torch 1.7 it divides truly "
            "(a float tensor, which breaks indexing and embedding lookups): use "
            'torch.div(a, b, rounding_mode="trunc") (st.legacy.div, what safetorch run uses)',
            self._fix(statement, dividend, divisor),
        )

    def _shaped(self, expr: ast.AST, at: Pos, scope: ast.AST) -> bool:
        """Producers that give one or more dimensions whatever their input's shape."""
        assert self._integers is not None
        if isinstance(expr, ast.Name):
            found = self._integers.flow.binding(expr.id, at, scope)
            if found is None:
                return False
            expr = found[0]
        if not isinstance(expr, ast.Call):
            return False
        qual = self.ctx.qualname(expr.func) or ""
        if qual in ("torch.LongTensor", "torch.IntTensor", "torch.arange", "torch.nonzero"):
            return True
        return (
            isinstance(expr.func, ast.Attribute)
            and not qual
            and expr.func.attr in ("nonzero", "multinomial")
        )

    def _fix(
        self, node: Union[ast.BinOp, ast.AugAssign], dividend: ast.expr, divisor: ast.expr
    ) -> Optional[Fix]:
        torch_name = self.ctx.spell("torch")
        a, b = self.ctx.segment(dividend), self.ctx.segment(divisor)
        if isinstance(node, ast.AugAssign):
            new = f'{a}.div_({b}, rounding_mode="trunc")'
            return Fix(f"use {new}", (self.ctx.replace(node, new),), UNSAFE)
        if torch_name is None:
            return None
        new = f'{torch_name}.div({a}, {b}, rounding_mode="trunc")'
        return Fix(f"use {new}", (self.ctx.replace(node, new),), UNSAFE)


class ViewOfStridedResult(Rule):
    """ST026: ``.view(...)`` of an element-wise result of a transposed tensor (contiguous in
    torch 0.3; it keeps its input's strides now, and ``view`` raises).

    torch 0.3 wrote the result of ``a * b`` (and every element-wise op) into a new
    contiguous tensor; torch now gives it the memory layout of its inputs, so
    ``(output.transpose(0, 1) * mask).view(-1, n)``, which ran then, raises "view size is
    not compatible with input tensor's size and stride". Reported where ``.view`` is called
    on an arithmetic result (``+ - * /``, directly or through the name it is assigned to)
    one of whose operands is a ``transpose``/``permute``/``t``/``expand`` result not made
    ``.contiguous()``.

    Fix (unsafe, ``--unsafe-fixes``): ``.reshape(...)``, which returns the same view where
    ``view`` works and a contiguous copy where it raises (0.3's contiguous result; what
    ``safetorch run`` does, ``st.legacy.view``).

        out = out.transpose(0, 1) * mask
        dec(out.view(-1, nhid))  ->  dec(out.reshape(-1, nhid))

    safetorch: ``st.legacy.view``.
    """

    code = "ST026"

    preview = True  # new: no corpus figure yet

    name = "view-of-strided-result"
    uses = "st.legacy.view"
    torch_symbols = ("torch.Tensor.view",)
    fixable = True
    fix_applicability = UNSAFE
    node_types = (ast.Call,)

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self._flow: Optional[ZeroDim] = None

    def visit(self, node: ast.Call) -> None:
        func = node.func
        if not (isinstance(func, ast.Attribute) and func.attr == "view") or not node.args:
            return
        if any(
            isinstance(a, ast.Attribute) and a.attr in ("dtype",) for a in node.args
        ) or self.ctx.qualname(func):
            return  # x.view(torch.float16): a dtype view, not a shape
        if self._flow is None:
            self._flow = ZeroDim(self.ctx)
        at, scope = start_of(node), self._flow.scope_of(node)
        if not self._strided(func.value, at, scope, 0, True):
            return
        fix = Fix("use .reshape(...)", (self.ctx.replace_attr(func, "reshape"),), UNSAFE)
        self.report(
            node,
            "torch 0.3 returned element-wise results contiguous; torch now keeps a transposed "
            "input's strides and .view raises on them: use .reshape(...) (st.legacy.view, what "
            "safetorch run uses: the same view where view works, a copy where it raises)",
            fix,
        )

    def _strided(
        self, expr: ast.AST, at: Pos, scope: ast.AST, depth: int, arithmetic: bool
    ) -> bool:
        """With ``arithmetic``: ``expr`` is an arithmetic result with a strided operand;
        without: ``expr`` is strided (a ``transpose``/``permute``/... result, or such an
        arithmetic result). Names are followed to their assignment."""
        flow = self._flow
        assert flow is not None
        if depth > 4:
            return False
        if isinstance(expr, ast.Name):
            found = flow.binding(expr.id, at, scope)
            return found is not None and self._strided(*found, depth + 1, arithmetic)
        if isinstance(expr, ast.BinOp):
            return isinstance(expr.op, (ast.Add, ast.Sub, ast.Mult, ast.Div)) and any(
                self._strided(side, at, scope, depth + 1, False) for side in (expr.left, expr.right)
            )
        if arithmetic or not (isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute)):
            return False
        if self.ctx.qualname(expr.func) or expr.func.attr not in _STRIDED:
            return False
        return not _made_contiguous(self.ctx, expr)


def _made_contiguous(ctx: Context, call: ast.Call) -> bool:
    """``x.transpose(0, 1).contiguous()``: the strided result is copied at once."""
    outer = parents(ctx).get(id(call))
    return isinstance(outer, ast.Attribute) and outer.attr == "contiguous"
