"""Same spelling, another result since torch 0.3 (ST025 integer ``/``, ST026 ``.view`` of an
element-wise result, ST028 a BCE target of the input's size in another shape): the ``legacy``
patch's pitfall (``safetorch run`` gives 0.3's result in a 0.3-era project); the removed APIs
are in ``legacy_0_4`` and ``legacy_1_x``."""

from __future__ import annotations

import ast
import os
from typing import Dict, FrozenSet, List, Optional, Set, Tuple, Union

from safetorch._eras import marks_0_3
from safetorch.check.engine import UNSAFE, Context, Fix
from safetorch.check.fixer import parents
from safetorch.check.rules._base import Rule
from safetorch.check.rules._helpers import Pos, call_arg, self_attr, start_of
from safetorch.check.rules._zero_dim import Unpacked, ZeroDim, int_constant

__all__ = ["LegacyBceTargetShape", "LegacyIntegerDivision", "ViewOfStridedResult"]

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

    preview = True  # new in issue 34: under 5 held-out findings or below 97% (docs/check.md)

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

    preview = True  # new in issue 34: under 5 held-out findings or below 97% (docs/check.md)

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


# Constructors whose shape is written out: a label tensor built for a BCE target.
_SHAPED_CONSTRUCTORS = frozenset(
    f"torch.{n}"
    for n in (
        "ones",
        "zeros",
        "full",
        "empty",
        "rand",
        "Tensor",
        "FloatTensor",
        "DoubleTensor",
        "HalfTensor",
    )
)
# Methods that move or retype a tensor and keep its shape (followed through).
_KEEPS_SHAPE = frozenset({"cuda", "cpu", "to", "float", "double", "half", "fill_", "detach"})
_BCE_FUNCTION = "torch.nn.functional.binary_cross_entropy"
_BCE_MODULE = "torch.nn.BCELoss"


class LegacyBceTargetShape(Rule):
    """ST028: a ``BCELoss`` / ``binary_cross_entropy`` target built with a written-out shape,
    in 0.3-era code (torch 0.2-1.6 paired a target of the input's size in another shape
    element by element; since torch 1.7 it is a ValueError).

    2017-2019 GANs built their labels as ``torch.ones(batch, 1)`` (or ``torch.ones([1, 1])``)
    and fed them to ``nn.BCELoss`` beside a discriminator output of shape ``(batch,)``; torch
    then compared the two in order, and since 1.7 (pytorch/pytorch#41426) it raises "Using a
    target size ... that is different to the input size". Reported in a 0.3-era project
    (the evidence the ``legacy`` patch asks for) where the criterion is ``nn.BCELoss`` (called
    at once, or through the name or ``self`` attribute it is assigned to) or
    ``F.binary_cross_entropy``, and the target is such a constructor (through ``Variable``,
    ``.cuda()``/``.to()``/``.fill_()``, and the name or attribute it is assigned to). A target
    already shaped by the input (``ones_like``, ``.view_as``, ``torch.ones(out.size())``) is
    left alone, and so is a criterion name that a parameter, a lambda, a loop or a ``with``
    also binds in the file (it may not be the ``BCELoss``).

    Fix (unsafe, ``--unsafe-fixes``, only where the input is a name or attribute and no
    ``weight`` is given: a weight shaped like the old target would not follow the reshape):
    ``target.reshape_as(input)``: nothing where the shapes already match, and where they
    differ the pairing old torch did (``st.legacy.binary_cross_entropy``, what ``safetorch
    run`` does).

        d_loss = criterion(d_out, Variable(torch.ones(batch, 1)))
          ->  d_loss = criterion(d_out, Variable(torch.ones(batch, 1)).reshape_as(d_out))

    safetorch: ``st.legacy.binary_cross_entropy``.
    """

    code = "ST028"

    preview = True  # 6 of 6 held-out, no development finding yet (docs/check.md)

    name = "legacy-bce-target-shape"
    uses = "st.legacy.binary_cross_entropy"
    torch_symbols = (_BCE_FUNCTION, "torch.nn.BCELoss.forward")
    fixable = True
    fix_applicability = UNSAFE
    node_types = (ast.Call,)

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self._flow: Optional[ZeroDim] = None
        self._era: Optional[bool] = None
        self._attrs: Optional[Dict[str, List[ast.AST]]] = None
        self._binders: Optional[FrozenSet[str]] = None

    def visit(self, node: ast.Call) -> None:
        if not self._is_bce(node.func, node):
            return
        source = call_arg(node, 0, "input")
        target = call_arg(node, 1, "target")
        if source is None or target is None:
            return
        if self._flow is None:
            self._flow = ZeroDim(self.ctx)
        at, scope = start_of(node), self._flow.scope_of(node)
        shaped_by_input = _shaped_by(self._unwrap(target), source, self.ctx)
        if not self._shaped_label(target, at, scope, 0) or shaped_by_input:
            return
        if self._era is None:
            self._era = _is_0_3_project(self.ctx)
        if not self._era:
            return
        fix = None
        # a weight shaped like the old target would broadcast against the reshaped one:
        # st.legacy reshapes both, a one-span fix cannot; report without a fix there
        if _pure(source) and not self._weighted(node):
            new = f"{self.ctx.segment(target)}.reshape_as({self.ctx.segment(source)})"
            if not isinstance(target, (ast.Name, ast.Attribute, ast.Call, ast.Subscript)):
                new = f"({self.ctx.segment(target)}).reshape_as({self.ctx.segment(source)})"
            fix = Fix("use target.reshape_as(input)", (self.ctx.replace(target, new),), UNSAFE)
        self.report(
            node,
            "a BCE label built with a written-out shape: where it is the input's size in "
            "another shape, torch 0.2-1.6 paired them element by element and torch 1.7+ "
            "raises (ValueError: Using a target size ...): use target.reshape_as(input), "
            "which changes nothing where the shapes match (st.legacy.binary_cross_entropy, "
            "what safetorch run uses)",
            fix,
        )

    # -- the criterion ---------------------------------------------------------------------
    def _is_bce(self, func: ast.AST, call: ast.Call) -> bool:
        if self.ctx.qualname(func) == _BCE_FUNCTION:
            return True
        if isinstance(func, ast.Call):  # nn.BCELoss()(x, t)
            return self._bce_module(func)
        if self.ctx.qualname(func) is not None:
            return False
        if isinstance(func, ast.Name) and func.id in self._other_binders():
            return False  # a lambda or function parameter, a loop or `with` target: unknown
        values = self._assigned(func, call)
        return bool(values) and all(self._bce_module(v) for v in values)

    def _other_binders(self) -> FrozenSet[str]:
        """Names the file binds other than by ``name = value``: parameters (of functions and
        lambdas), ``for`` / comprehension / ``with ... as`` / ``except ... as`` targets."""
        if self._binders is None:
            names: Set[str] = set()
            for node in self.ctx.walk(self.ctx.tree):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                    args = node.args
                    every = args.posonlyargs + args.args + args.kwonlyargs
                    every += [a for a in (args.vararg, args.kwarg) if a is not None]
                    names.update(a.arg for a in every)
                elif isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
                    names.update(_target_names(node.target))
                elif isinstance(node, ast.withitem) and node.optional_vars is not None:
                    names.update(_target_names(node.optional_vars))
                elif isinstance(node, ast.ExceptHandler) and node.name:
                    names.add(node.name)
                elif isinstance(node, ast.NamedExpr):
                    names.update(_target_names(node.target))
            self._binders = frozenset(names)
        return self._binders

    def _weighted(self, call: ast.Call) -> bool:
        """A ``weight`` given to the call or to the criterion's constructor (any we see)."""
        if self.ctx.qualname(call.func) == _BCE_FUNCTION:
            return call_arg(call, 2, "weight") is not None
        func = call.func
        makers = [func] if isinstance(func, ast.Call) else self._assigned(func, call)
        for maker in makers:
            for made in (maker.body, maker.orelse) if isinstance(maker, ast.IfExp) else (maker,):
                made = _strip_moves(made)
                if not isinstance(made, ast.Call) or made.args:
                    return True  # nn.BCELoss(w): weight is the first parameter
                if any(k.arg in (None, "weight") for k in made.keywords):
                    return True  # weight=w, or **kwargs that may hold one
        return False

    def _bce_module(self, expr: ast.AST) -> bool:
        if isinstance(expr, ast.IfExp):  # nn.BCELoss().cuda() if cuda else nn.BCELoss()
            return self._bce_module(expr.body) and self._bce_module(expr.orelse)
        expr = _strip_moves(expr)
        return isinstance(expr, ast.Call) and self.ctx.qualname(expr.func) == _BCE_MODULE

    # -- the target ------------------------------------------------------------------------
    def _shaped_label(self, expr: ast.AST, at: Pos, scope: ast.AST, depth: int) -> bool:
        if depth > 4:
            return False
        expr = self._unwrap(expr)
        if isinstance(expr, ast.Call):
            qual = self.ctx.qualname(expr.func)
            return qual in _SHAPED_CONSTRUCTORS and bool(expr.args)
        if isinstance(expr, ast.Name):
            assert self._flow is not None
            found = self._flow.binding(expr.id, at, scope)
            return found is not None and self._shaped_label(*found, depth + 1)
        if self_attr(expr) is not None:
            values = [v for v in self._attr_values(expr) if _strip_moves(v) is not None]
            own = [v for v in values if not _same_attr(_strip_moves(v), expr)]
            return bool(own) and all(self._shaped_label(v, at, scope, depth + 1) for v in own)
        return False

    def _unwrap(self, expr: ast.AST) -> ast.AST:
        """``Variable(x)``, ``x.cuda()``, ``x.fill_(1)``: the tensor ``x`` they keep the shape of."""
        while isinstance(expr, ast.Call):
            if self.ctx.qualname(expr.func) == "torch.autograd.Variable" and expr.args:
                expr = expr.args[0]
            elif isinstance(expr.func, ast.Attribute) and expr.func.attr in _KEEPS_SHAPE:
                expr = expr.func.value
            else:
                break
        return expr

    def _assigned(self, func: ast.AST, call: ast.Call) -> List[ast.AST]:
        """What the criterion name or ``self`` attribute is assigned in this file."""
        if isinstance(func, ast.Name):
            if self._flow is None:
                self._flow = ZeroDim(self.ctx)
            found = self._flow.binding(func.id, start_of(call), self._flow.scope_of(call))
            return [] if found is None else [found[0]]
        if self_attr(func) is not None:
            return self._attr_values(func)
        return []

    def _attr_values(self, attr: ast.AST) -> List[ast.AST]:
        if self._attrs is None:
            self._attrs = {}
            for node in self.ctx.walk(self.ctx.tree):
                if isinstance(node, ast.Assign):
                    for target in node.targets:
                        for key, value in _pairs(target, node.value):
                            self._attrs.setdefault(key, []).append(value)
        name = self_attr(attr)
        return list(self._attrs.get(name, [])) if name is not None else []


def _pairs(target: ast.AST, value: ast.AST) -> List[Tuple[str, ast.AST]]:
    """``self.a, self.b = x, y``: (``a``, x), (``b``, y); a tuple target from another value
    binds nothing we can follow."""
    name = self_attr(target)
    if name is not None:
        return [(name, value)]
    if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple):
        if len(target.elts) == len(value.elts):
            return [p for t, v in zip(target.elts, value.elts) for p in _pairs(t, v)]
    return []


def _target_names(target: ast.AST) -> List[str]:
    return [n.id for n in ast.walk(target) if isinstance(n, ast.Name)]


def _shaped_by(made: ast.AST, source: ast.expr, ctx: Context) -> bool:
    """``torch.ones(out.size())``, ``torch.ones(*out.shape)``: a label made in the input's own
    shape (``made`` is the constructor call; names are not followed)."""
    if not isinstance(made, ast.Call) or len(made.args) != 1 or made.keywords:
        return False
    arg = made.args[0]
    arg = arg.value if isinstance(arg, ast.Starred) else arg
    base: Optional[ast.expr] = None
    if isinstance(arg, ast.Call) and not arg.args and isinstance(arg.func, ast.Attribute):
        base = arg.func.value if arg.func.attr == "size" else None
    elif isinstance(arg, ast.Attribute) and arg.attr == "shape":
        base = arg.value
    return base is not None and ctx.segment(base) == ctx.segment(source)


def _strip_moves(expr: ast.AST) -> ast.AST:
    """``nn.BCELoss().cuda()``, ``self.y.cuda()``: the expression moved."""
    while (
        isinstance(expr, ast.Call)
        and isinstance(expr.func, ast.Attribute)
        and expr.func.attr in ("cuda", "cpu", "to")
    ):
        expr = expr.func.value
    return expr


def _same_attr(expr: ast.AST, attr: ast.AST) -> bool:
    return self_attr(expr) is not None and self_attr(expr) == self_attr(attr)


def _pure(expr: ast.AST) -> bool:
    """A name, an attribute chain of names or a constant subscript: safe to spell twice."""
    while isinstance(expr, (ast.Attribute, ast.Subscript)):
        if isinstance(expr, ast.Subscript) and not isinstance(expr.slice, ast.Constant):
            return False
        expr = expr.value
    return isinstance(expr, ast.Name)
