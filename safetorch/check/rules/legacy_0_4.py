"""APIs torch 0.4 changed (ST020/ST029 0-dim indexing, ST021 ``volatile=``, ST022 ``size_average=``/
``reduce=``, ST027 ``backward(retain_variables=)``): the ``legacy`` patch's pitfall; the removals
of torch 1.x are in ``legacy_1_x``."""

from __future__ import annotations

import ast
from typing import ClassVar, List, Optional, Tuple, Union

from safetorch.check.engine import UNSAFE, Context, Edit, Fix, Positioned
from safetorch.check.fixer import enclosing_statement, import_edit, parents, wrap_edits
from safetorch.check.rules._base import Rule
from safetorch.check.rules._helpers import (
    FUNCTION_DEFS,
    Pos,
    end_of,
    find_keyword,
    has_double_star,
    has_star,
    is_const,
    literal_bool,
    start_of,
    var_key,
)
from safetorch.check.rules._zero_dim import SCALAR_NAMES, ZeroDim, int_constant, numpy_source

__all__ = [
    "LegacyLossReduction",
    "LegacyRetainVariables",
    "VolatileVariable",
    "ZeroDimIndex",
    "ZeroDimIndexUnproven",
]


class ZeroDimIndex(Rule):
    """ST020: ``loss.data[0]``: indexing a 0-dim tensor (IndexError since torch 0.5).

    Up to torch 0.3 a loss was a 1-element tensor and ``loss.data[0]`` its value; since 0.4
    it is 0-dim and ``[0]`` raises. The rule decides "0-dim" from what produced the value:
    a reduction without a dim (``x.sum()``, ``torch.mean(x)``, ``x.norm()``), a loss
    (``F.mse_loss(...)``, ``criterion(...)`` with ``criterion = nn.CrossEntropyLoss()``,
    unless ``reduction="none"``), arithmetic of such values with each other and with Python
    numbers (``(a + b).data[0]``, ``len(data) * loss.data``), element-wise functions of
    them (``torch.abs(d)``; ``x.mul(0.5)`` and the other operations with operands only where
    every operand is a number or 0-dim, since a tensor operand broadcasts), in-place methods,
    which return their receiver (``torch.sum(x).mul_(-0.5)``, ``crit(o, t).div_(n)``),
    indexing with one 0-dim tensor or int per dimension (``t[i0, i1]``,
    ``v.view(-1).max(0)[1]``), following names to their assignment in the
    same function, the file's own functions to their ``return`` values (``loss =
    loss_function(...)``, ``out, loss = train(...)``), parameters to what every call site
    passes (a ``criterion`` parameter too: ``train(model, nn.MSELoss())``,
    ``step(F.mse_loss, ...)``), loss classes of the file to their ``forward``'s returns, and
    accumulators (``total = 0; total += loss.data``). This rule reports what that flow
    proves (each finding has its fix); where no producer is visible (a parameter of a
    function the file never calls, an attribute) and only the name says it is a number,
    ``zero-dim-index-unproven`` (preview) reports it, without a fix.

    Found the same way: ``x[0]`` / ``x[-1]`` without ``.data`` (``total_loss[0]``), and two
    idioms ``safetorch run`` shims only at run time (``st.legacy``'s legacy scalars):
    ``x.data.numpy()[0]`` of a 0-dim value (numpy raises for a 0-d array), and torch 0.3's
    integer index of a 1-D tensor, which gave a Python number and now gives a 0-dim tensor,
    used as a dict key (``ni = topi[0][0]``, then ``index2word[ni]``: a KeyError, tensors
    hash by identity; shimmed in projects that show 0.3-era code).

    Fix (unsafe, ``--unsafe-fixes``), only where the flow proves the value 0-dim:
    ``.item()``, which returns a Python number where 0.4 returned a 0-dim tensor (the value
    is the same; arithmetic on it no longer builds tensors). One index too many on what is
    now 1-D (``pred[0][0]`` written when ``max(1)`` kept the dim, before torch 0.2) loses
    the last index; a dict key gets ``.item()`` where its dimensions are known or come from
    ``topk``/``sort``, which no release changed; ``pred[0][0]`` of ``max``/``min`` along a
    dim, as a dict key, of unknown dimensions becomes ``pred.flatten()[0].item()`` (the first
    element, what ``[0][0]`` read both where 0.1 kept the dim and where 0.2-0.3 dropped it).
    The method form is the function's: ``out.max(1)[1]`` as ``torch.max(out, 1)[1]``, also
    of a value whose producer is not visible (a model's output), unless it is evidently a
    NumPy array or a list; ``max(y)`` of a tensor ``y`` (the element-wise maximum) is no pair.

        running_loss += loss.data[0]   ->  running_loss += loss.item()
        print(loss.data.numpy()[0])    ->  print(loss.item())
        ni = topi[0][0]                ->  ni = topi[0][0].item()   (topi from x.topk(1))
        first = pred.data[0][0]        ->  first = pred.data[0].item()   (pred 1-D)

    safetorch: ``st.legacy.zero_dim_index``.
    """

    code = "ST020"

    name = "zero-dim-index"
    uses = "st.legacy.zero_dim_index"
    torch_symbols = ("torch.Tensor.__getitem__",)
    fixable = True
    fix_applicability = UNSAFE
    node_types = (ast.Subscript,)
    # Fresh held-out half (tenth batch): 89.1% of 64, below the 97% bar (docs/check.md).
    preview = True

    #: What the flow proves 0-dim (the findings with a fix); zero-dim-index-unproven the rest.
    proven_only: ClassVar[bool] = True

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self._zero_dim: Optional[ZeroDim] = None

    def report(self, node: Positioned, message: str, fix: Optional[Fix] = None) -> None:
        if (fix is not None) == self.proven_only:
            super().report(node, message, fix)

    @property
    def flow(self) -> ZeroDim:
        """The file's 0-dim flow, one for this rule and zero-dim-index-unproven (each reports
        its part of it)."""
        if self._zero_dim is None:
            flow = self.ctx.cache.get("zero-dim-flow")
            if flow is None:
                flow = self.ctx.cache["zero-dim-flow"] = ZeroDim(self.ctx)
            self._zero_dim = flow
        return self._zero_dim

    def visit(self, node: ast.Subscript) -> None:
        if not isinstance(node.ctx, ast.Load):
            return
        if int_constant(node.slice) in (0, -1):
            base = node.value
            array_of = numpy_source(base)
            if array_of is not None:
                if self.flow.decide(array_of, start_of(node), self.ctx.scope, 0) is True:
                    self._item_fix(
                        node,
                        array_of,
                        "x.data.numpy()[0] of a 0-dim tensor raises (a 0-d array has no "
                        "[0]): use x.item() (st.legacy.zero_dim_index, what safetorch run "
                        "uses for x[0], cannot reach numpy)",
                    )
                return
            if isinstance(base, ast.Attribute) and base.attr == "data":
                if self._data_index(node, base):
                    return
            elif self.flow.decide(base, start_of(node), self.ctx.scope, 0) is True:
                self._item_fix(
                    node,
                    base,
                    "x[0] of a 0-dim tensor raises since torch 0.5: use x.item() "
                    "(under safetorch run, st.legacy.zero_dim_index gives the number, as 0.3 did)",
                )
                return
        self._number_index(node)

    def _data_index(self, node: ast.Subscript, data: ast.Attribute) -> bool:
        decided = self.flow.decide(data.value, start_of(node), self.ctx.scope, 0)
        if decided is False:
            return False
        if decided is None:
            root = (var_key(data.value) or "").lower()
            if isinstance(data.value, ast.Call):
                root = (var_key(data.value.func) or "").lower()
            if not any(word in root for word in SCALAR_NAMES + ("criterion",)):
                return False
        self._item_fix(
            node,
            data.value,
            "x.data[0] of a 0-dim tensor raises since torch 0.5: use x.item() "
            "(under safetorch run, st.legacy.zero_dim_index gives the number, as 0.3 did)",
            proven=decided is True,
        )
        return True

    def _item_fix(
        self, node: ast.expr, tensor: ast.expr, message: str, proven: bool = True
    ) -> None:
        """Report ``node``; where the flow proved ``tensor`` 0-dim, with the ``.item()`` fix
        (where only its name says so, the value may be a row: ``.item()`` would raise)."""
        if not proven:
            self.report(
                node,
                message + " once you have checked it is 0-dim (what produced it is not visible "
                "here, so no fix is offered)",
            )
            return
        text = f"{self.ctx.segment(tensor)}.item()"
        if not isinstance(tensor, (ast.Name, ast.Attribute, ast.Call, ast.Subscript)):
            text = f"({self.ctx.segment(tensor)}).item()"  # (a + b).data[0]
        fix = Fix(f"use {text}", (self.ctx.replace(node, text),), UNSAFE)
        self.report(node, message, fix)

    def _number_index(self, node: ast.Subscript) -> None:
        """torch 0.3's ``topi[0][0]`` (a Python number then) used as a dict key."""
        flow = self.flow
        at, scope = start_of(node), self.ctx.scope
        index = node.slice
        if int_constant(index) is None and not flow.is_number(index, at, scope):
            return
        if not flow.is_tensor(node.value, at, scope):
            return
        up = parents(self.ctx)
        outer = up.get(id(node))
        if isinstance(outer, ast.Subscript) and outer.value is node:
            return  # topi[0] of topi[0][0]: the outer index is the one to look at
        ndim = flow.ndim(node, at, scope)
        if (ndim or 0) > 0:
            return  # a row, not a number: indexing it gave a tensor in 0.3 too
        used = [k for k in self._key_uses(node, 0) if flow.is_dict(k.value)]
        if not used:
            return
        message = (
            "an integer index of a tensor gave a Python number in torch 0.3 and gives a 0-dim "
            f"tensor since 0.4: as the dict key at line {used[0].lineno} it never matches "
            "(tensors hash by identity): use .item() (st.legacy.zero_dim_index, what "
            "safetorch run uses, cannot change an index that works in plain torch)"
        )
        single = not (
            isinstance(node.value, ast.Subscript)
            or (
                isinstance(node.value, ast.Attribute)
                and isinstance(node.value.value, ast.Subscript)
            )
        )
        lookups = all(
            isinstance(k.ctx, ast.Load) and flow.is_dict(k.value, plain=True) for k in used
        )
        if (
            ndim != 0
            and not flow.same_shape_since_0_1(node, at, scope)
            and not (single and lookups)
        ):
            # x.max(1) kept the dim before torch 0.2: x[0][0] may now index a 0-dim value
            first = self._first_of_reduction(node, at, scope)
            if first is not None:
                text = f"{self.ctx.segment(first)}.flatten()[0].item()"
                fix = Fix(f"use {text}", (self.ctx.replace(node, text),), UNSAFE)
                self.report(
                    node,
                    message + "; max/min along a dim kept it before torch 0.2, so [0][0] "
                    "is its first element whichever release the code was written for",
                    fix,
                )
                return
            self.report(
                node,
                message + "; the tensor's dimensions are not visible here (if a reduction "
                "dropped a dim it kept before torch 0.2, drop one index too), so no fix is "
                "offered",
            )
            return
        text = f"{self.ctx.segment(node)}.item()"
        fix = Fix(f"use {text}", (self.ctx.insert_after(node, ".item()"),), UNSAFE)
        self.report(node, message, fix)

    def _first_of_reduction(
        self, node: ast.Subscript, at: Pos, scope: ast.AST
    ) -> Optional[ast.expr]:
        """``pred[0][0]`` (or ``pred.data[0][0]``) of ``max``/``min`` along a dim, used as a
        number: ``pred`` (else None). Written when the dim was kept (torch < 0.2, ``pred`` of
        ``(N, 1)``) or for a 3-D input (0.2-0.3, ``(N, L)``), both read the first element,
        which ``pred.flatten()[0]`` is on every release."""
        inner = node.value
        if not (
            int_constant(node.slice) == 0
            and isinstance(inner, ast.Subscript)
            and int_constant(inner.slice) == 0
        ):
            return None
        if not self.flow.dim_reduction_pair(inner.value, at, scope):
            return None
        return inner.value

    def _key_uses(self, value: ast.expr, depth: int) -> List[ast.Subscript]:
        """The subscripts ``value`` reaches as the key: ``d[value]`` itself, through the name
        it is assigned to (later in that scope), its function's return (each call site of the
        file), and the parameter of the file's function or method it is passed to."""
        if depth > 4:
            return []
        flow = self.flow
        outer = parents(self.ctx).get(id(value))
        uses: List[ast.expr] = []
        if isinstance(outer, ast.Subscript) and outer.slice is value:
            return [outer]
        if (
            isinstance(outer, ast.Assign)
            and outer.value is value
            and len(outer.targets) == 1
            and isinstance(outer.targets[0], ast.Name)
        ):
            scope = flow.scope_of(value)
            uses = self._loads(scope, outer.targets[0].id, start_of(outer))
        elif isinstance(outer, ast.Return) and outer.value is value:
            fn = flow.scope_of(value)
            if isinstance(fn, ast.FunctionDef) and len(flow.functions(fn.name)) == 1:
                uses = [c for c in flow.call_sites(fn.name) if flow.callee(c) is not None]
        elif isinstance(outer, ast.Call) and value in outer.args:
            target = flow.callee(outer)
            if target is not None:
                fn, skipped = target
                index = outer.args.index(value) + skipped
                if index < len(fn.args.args) and not has_star(outer):
                    name = fn.args.args[index].arg
                    if name not in flow.bound_names(fn):
                        uses = self._loads(fn, name, start_of(fn))
        return [key for use in uses for key in self._key_uses(use, depth + 1)]

    def _loads(self, scope: ast.AST, name: str, after: Pos) -> List[ast.expr]:
        """The reads of ``name`` in ``scope`` (not in functions nested in it) after ``after``."""
        return [
            n
            for n in self.ctx.walk(scope)
            if isinstance(n, ast.Name)
            and n.id == name
            and isinstance(n.ctx, ast.Load)
            and start_of(n) > after
            and self.flow.scope_of(n) is scope
        ]


_VARIABLE = ("torch.autograd.Variable", "torch.autograd.variable.Variable")


# Statements a `with torch.no_grad():` wrapped around the rest of a block must not hold: a
# function or class defined there would not run under it when called later.
_NOT_WRAPPED = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


class ZeroDimIndexUnproven(ZeroDimIndex):
    """ST029: ``loss.data[0]`` where only the name says the value is a number.

    The zero-dim-index flow finds no producer of the value (a parameter of a function the file never
    calls, an attribute, a model whose output it cannot see), but its name says it is a
    loss or a count (loss, acc, correct, total, err, cost, criterion): on torch 0.4+ a 0-dim
    value there raises at ``[0]``; a row of a batch does not. An integer index used as a dict
    key (``index2word[topi[0][0]]``) of dimensions the flow cannot see is reported here too.
    Check what produces the value: if it is 0-dim, ``.item()``.

    Fix (manual): ``x.item()`` where the value is 0-dim.

    safetorch: ``st.legacy.zero_dim_index``.
    """

    code = "ST029"

    preview = True  # the name decides: below the 97% bar on the held-out half (docs/check.md)

    name = "zero-dim-index-unproven"
    fixable = False
    proven_only = False


class VolatileVariable(Rule):
    """ST021: ``Variable(x, volatile=True)`` and ``type(x) == Variable`` (changed in torch 0.4).

    Both stopped meaning what they said in torch 0.4: ``volatile=`` became a no-op and
    ``type(x) == Variable`` False for every tensor.

    ``volatile=True`` meant "no graph for anything computed from this"; torch 0.4 made it
    a no-op (with a warning), so inference code written that way builds a graph and keeps
    every activation alive. Reported for ``volatile=`` passed to ``Variable``. Since 0.4 a
    tensor's type is ``torch.Tensor``, so ``type(h) == Variable`` (the word language model's
    ``repackage_hidden``) is False and such code recurses into the tensor.

    Fix (unsafe, ``--unsafe-fixes``):

    - ``volatile=True``: the keyword is dropped and the rest of the block, from the statement
      that makes the Variable on, runs under ``with torch.no_grad():`` (volatility reached
      everything computed from the value: the test loop of an MNIST example becomes the
      modern one). Where that block cannot be wrapped (the value is returned, a function or
      class is defined after it, a ``backward()``/``.step()``/``torch.autograd.grad`` follows
      and needs its graph, the call spans several lines) the call becomes
      ``st.legacy.volatile(x)``, the tensor that computes everything from it without a graph.
    - ``volatile=flag`` (``get_batch(..., evaluation=True)``): ``(st.legacy.volatile(x) if
      flag else Variable(x))``.
    - ``type(h) == Variable`` -> ``isinstance(h, torch.Tensor)`` (``!=``: ``not
      isinstance``); True for ``nn.Parameter`` too, where 0.3 and
      ``st.legacy.is_variable_type`` say False.

    safetorch: ``st.legacy.volatile`` (and ``st.legacy.is_variable_type``).
    """

    code = "ST021"

    # 94.6% of 112 on the held-out half once the thirteenth batch was labelled (stop 56: 2
    # right, 6 wrong there): below the 97% bar, so preview (docs/check.md).
    preview = True

    name = "volatile-variable"
    uses = "st.legacy.volatile"
    torch_symbols = _VARIABLE
    fixable = True
    fix_applicability = UNSAFE
    node_types = (ast.Call, ast.Compare)

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self._wrapped: List[Tuple[Pos, Pos]] = []  # regions an earlier fix puts under no_grad

    def visit(self, node: ast.AST) -> None:
        if isinstance(node, ast.Compare):
            self._type_test(node)
            return
        if not isinstance(node, ast.Call) or self.ctx.qualname(node.func) not in _VARIABLE:
            return
        volatile = find_keyword(node, "volatile")
        value = volatile.value if volatile is not None else None
        if value is None and len(node.args) > 2:
            value = node.args[2]
        if value is None or is_const(value, False):
            return
        fix = self._fix(node, volatile, value)
        self.report(
            node,
            "Variable(x, volatile=True) has no effect since torch 0.4 (a graph is built): "
            "compute inside `with torch.no_grad():` and pass x itself (st.legacy.volatile)",
            fix,
        )

    # -- volatile= -------------------------------------------------------------------------
    def _plain_variable(self, call: ast.Call) -> Optional[str]:
        """``Variable(x, ...)`` without ``volatile=``; None for positional volatile."""
        if len(call.args) > 2 or has_star(call) or has_double_star(call) or not call.args:
            return None
        parts = [self.ctx.segment(a) for a in call.args]
        parts += [self.ctx.segment(k) for k in call.keywords if k.arg != "volatile"]
        return f"{self.ctx.segment(call.func)}({', '.join(parts)})"

    def _fix(self, call: ast.Call, kw: Optional[ast.keyword], value: ast.expr) -> Optional[Fix]:
        plain = self._plain_variable(call)
        if plain is None or kw is None:
            return None
        where = start_of(call)
        if any(lo <= where <= hi for lo, hi in self._wrapped):
            # The rest of this block already goes under no_grad (an earlier finding's fix).
            return Fix("drop volatile=True", (self.ctx.replace(call, plain),), UNSAFE)
        if is_const(value, True):
            wrap = self._no_grad(call, plain)
            if wrap is not None:
                return wrap
        names = import_edit(self.ctx, [("safetorch", "st")])
        if names is None:
            return None
        spelled, imports = names
        data = self.ctx.segment(call.args[0])
        text = f"{spelled['safetorch']}.legacy.volatile({data})"
        if not is_const(value, True):
            text = f"({text} if {self.ctx.segment(value)} else {plain})"
        edits = list(imports) + [self.ctx.replace(call, text)]
        return Fix(f"use {text}", tuple(edits), UNSAFE)

    def _no_grad(self, call: ast.Call, plain: str) -> Optional[Fix]:
        found = enclosing_statement(self.ctx, call)
        if found is None:
            return None
        stmt, _, block = found
        if isinstance(stmt, (ast.Return, *_NOT_WRAPPED)):
            return None
        if _under_no_grad(self.ctx, stmt):
            return Fix("drop volatile=True", (self.ctx.replace(call, plain),), UNSAFE)
        start = next(i for i, s in enumerate(block) if s is stmt)
        region = block[start:]
        if any(isinstance(s, _NOT_WRAPPED) for s in region):
            return None
        if call.lineno != (call.end_lineno or call.lineno):
            return None  # the indent edits would land inside the call this fix rewrites
        if any(_needs_grad(self.ctx, s) for s in region):
            # A backward or an optimizer step after it: 0.3 cut volatility where the code
            # re-wrapped `.data`, so a no_grad over the rest would take the graph it needs.
            return None
        names = import_edit(self.ctx, [("torch", None)])
        if names is None:
            return None
        spelled, imports = names
        wrap = wrap_edits(self.ctx, region, f"with {spelled['torch']}.no_grad()")
        if wrap is None:
            return None
        self._wrapped.append((start_of(region[0]), end_of(region[-1])))
        edits = list(imports) + wrap + [self.ctx.replace(call, plain)]
        return Fix(
            "drop volatile=True and run the rest of the block under torch.no_grad()",
            tuple(edits),
            UNSAFE,
        )

    # -- type(x) == Variable -----------------------------------------------------------------
    def _type_test(self, node: ast.Compare) -> None:
        if len(node.ops) != 1 or not isinstance(node.ops[0], (ast.Eq, ast.NotEq)):
            return
        left, right = node.left, node.comparators[0]
        if self.ctx.qualname(left) in _VARIABLE:
            left, right = right, left
        if self.ctx.qualname(right) not in _VARIABLE:
            return
        if not (
            isinstance(left, ast.Call)
            and isinstance(left.func, ast.Name)
            and left.func.id == "type"
            and len(left.args) == 1
            and not left.keywords
            and "type" not in self.ctx.imports
        ):
            return
        fix = None
        names = import_edit(self.ctx, [("torch", None)])
        if names is not None:
            spelled, imports = names
            test = f"isinstance({self.ctx.segment(left.args[0])}, {spelled['torch']}.Tensor)"
            if isinstance(node.ops[0], ast.NotEq):
                test = f"not {test}"
            edits = list(imports) + [self.ctx.replace(node, test)]
            fix = Fix(f"use {test}", tuple(edits), UNSAFE)
        self.report(
            node,
            "type(x) == Variable is False for every tensor since torch 0.4 (Variable and "
            "Tensor merged): use isinstance(x, torch.Tensor) (under safetorch run "
            "st.legacy.is_variable_type gives 0.3's answer, for tensors and "
            "st.legacy.volatile's)",
            fix,
        )


_GRAD_CALLS = ("torch.autograd.grad", "torch.autograd.backward")


def _needs_grad(ctx: Context, stmt: ast.AST) -> bool:
    """Whether ``stmt`` calls ``.backward()``, ``.step()`` or ``torch.autograd.grad``: code
    that a ``with torch.no_grad():`` around it would break."""
    for node in ctx.walk(stmt):
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr in ("backward", "step"):
                return True
            if ctx.qualname(func) in _GRAD_CALLS:
                return True
    return False


def _under_no_grad(ctx: Context, stmt: ast.AST) -> bool:
    """Whether ``stmt`` runs inside ``with torch.no_grad():`` (in its own function)."""
    up = parents(ctx)
    current = up.get(id(stmt))
    while current is not None and not isinstance(current, (*FUNCTION_DEFS, ast.ClassDef)):
        if isinstance(current, ast.With):
            for item in current.items:
                expr = item.context_expr
                if isinstance(expr, ast.Call) and ctx.qualname(expr.func) in (
                    "torch.no_grad",
                    "torch.inference_mode",
                ):
                    return True
        current = up.get(id(current))
    return False


class LegacyLossReduction(Rule):
    """ST022: ``size_average=`` / ``reduce=`` loss arguments (deprecated for ``reduction=``).

    Every loss still maps them to ``reduction`` with a warning: ``reduce=False`` means
    ``"none"``, else ``size_average=False`` means ``"sum"``, else ``"mean"``.

    Fix (automatic, safe), for literal True/False/None values: replace them with the
    ``reduction=`` they mean:

        nn.MSELoss(size_average=False)  ->  nn.MSELoss(reduction="sum")

    safetorch: ``st.legacy.reduction``.
    """

    code = "ST022"

    name = "legacy-loss-reduction"
    uses = "st.legacy.reduction"
    torch_symbols = ("torch.nn._reduction.legacy_get_string",)
    fixable = True
    node_types = (ast.Call,)

    def visit(self, node: ast.Call) -> None:
        qual = self.ctx.qualname(node.func) or ""
        if not qual.startswith("torch.nn."):
            return
        size_average = find_keyword(node, "size_average")
        reduce = find_keyword(node, "reduce")
        if size_average is None and reduce is None:
            return
        values: List[Optional[bool]] = []
        for kw in (size_average, reduce):
            node_value = None if kw is None else kw.value
            if node_value is None or is_const(node_value, None):
                values.append(True)
            else:
                values.append(literal_bool(node_value, True))
        fix = None
        if None not in values and find_keyword(node, "reduction") is None:
            sa, rd = values
            result = "mean" if sa and rd else ("sum" if rd else "none")
            kws = [kw for kw in (size_average, reduce) if kw is not None]
            first, rest = kws[0], kws[1:]
            edits: List[Optional[Edit]] = [self.ctx.replace(first, f'reduction="{result}"')]
            for kw in rest:
                edits.append(self._remove_keyword(node, kw))
            if all(e is not None for e in edits):
                fix = Fix(f'use reduction="{result}"', tuple(e for e in edits if e is not None))
        self.report(
            node,
            "size_average=/reduce= are deprecated: pass the reduction= they mean "
            '("mean", "sum" or "none"; st.legacy.reduction)',
            fix,
        )

    def _remove_keyword(self, call: ast.Call, kw: ast.keyword) -> Optional[Edit]:
        items: List[Union[ast.expr, ast.keyword]] = [*call.args, *call.keywords]
        index = items.index(kw)
        if index == 0:
            return None
        prev = items[index - 1]
        line, col = self.ctx.end(prev)
        end_line, end_col = self.ctx.end(kw)
        return Edit(line, col, end_line, end_col, "")


class LegacyRetainVariables(Rule):
    """ST027: ``loss.backward(retain_variables=True)`` (renamed ``retain_graph`` in torch 0.2,
    removed in 0.4).

    torch 0.2 renamed the keyword of ``Tensor.backward`` and ``torch.autograd.backward``
    that keeps the graph for another backward pass; 0.3 still took the old name with a
    warning, and since 0.4 it is a TypeError. Another library's ``backward`` (a qualified
    name that is not torch's) is left alone, and so is every call in a file that defines a
    function taking ``retain_variables`` (the project's own API).

    Fix (automatic, safe): the new name with the same value:

        loss.backward(retain_variables=True)  ->  loss.backward(retain_graph=True)

    safetorch: ``st.legacy`` (``safetorch run`` passes the old keyword on as
    ``retain_graph``).
    """

    code = "ST027"

    preview = True  # new in issue 34: under 5 held-out findings or below 97% (docs/check.md)

    name = "legacy-retain-variables"
    uses = "st.legacy"
    torch_symbols = ("torch.Tensor.backward", "torch.autograd.backward")
    fixable = True
    node_types = (ast.Call,)

    def visit(self, node: ast.Call) -> None:
        func = node.func
        if not (isinstance(func, ast.Attribute) and func.attr == "backward"):
            return
        qual = self.ctx.qualname(func)
        if qual is not None and qual != "torch.autograd.backward":
            return
        kw = find_keyword(node, "retain_variables")
        if kw is None or self._own_api():
            return
        fix = None
        if find_keyword(node, "retain_graph") is None:
            text = f"retain_graph={self.ctx.segment(kw.value)}"
            fix = Fix("use retain_graph=", (self.ctx.replace(kw, text),))
        self.report(
            node,
            "backward(retain_variables=) was renamed retain_graph= in torch 0.2 and removed in "
            "0.4 (a TypeError now): use retain_graph= (st.legacy, what safetorch run uses, "
            "passes it on)",
            fix,
        )

    def _own_api(self) -> bool:
        """The file defines a function with a ``retain_variables`` parameter."""
        for fn in self.ctx.walk(self.ctx.tree):
            if isinstance(fn, FUNCTION_DEFS):
                args = fn.args
                every = [*args.posonlyargs, *args.args, *args.kwonlyargs]
                if any(a.arg == "retain_variables" for a in every):
                    return True
        return False
