"""ST020's shape flow: whether an expression is a 0-dim tensor, decided from what produced it."""

from __future__ import annotations

import ast
from typing import Dict, List, Optional, Sequence, Set, Tuple

from safetorch.check.engine import Context
from safetorch.check.fixer import parents
from safetorch.check.rules._forward_shapes import made_by_batched_models
from safetorch.check.rules._helpers import (
    FUNCTION_DEFS,
    FUNCTIONAL,
    NN,
    Pos,
    find_keyword,
    is_const,
    own_nodes,
    self_attr,
    start_of,
    statements_in_order,
)

__all__ = ["SCALAR_NAMES", "Unpacked", "ZeroDim", "int_constant", "numpy_source"]

#: Names that say a value is a scalar where no producer is visible (ST020, for ``.data[0]``).
SCALAR_NAMES = ("loss", "acc", "correct", "total", "err", "cost")


# Tensor methods and torch functions that reduce every element to one (0-dim) when called
# without a dim; ``norm`` takes ``p`` first, the others a dim.
_REDUCTIONS = frozenset(
    {"sum", "mean", "prod", "std", "var", "max", "min", "amax", "amin", "median", "norm"}
    | {"all", "any", "dot", "trace", "nansum", "nanmean", "logsumexp", "count_nonzero"}
    | {"argmax", "argmin"}
)


# Element-wise operations of one tensor: the result has its shape.
_UNARY = frozenset(
    {"abs", "exp", "log", "sqrt", "rsqrt", "sigmoid", "tanh", "neg", "square", "reciprocal"}
    | {"detach", "float", "double", "half", "cpu", "cuda", "clone", "log1p", "expm1", "relu"}
    | {"contiguous", "to", "type", "long", "int"}
)

# Element-wise operations with operands (``x.mul(0.5)``, ``torch.add(x, 1)``, ``x.clamp(0,
# 1)``): the first input's shape where every operand is a number or a 0-dim tensor; a tensor
# operand broadcasts (``loss.mul(weights)`` has the weights' shape).
_BINARY = frozenset({"mul", "add", "sub", "div", "pow", "clamp"})

_ELEMENTWISE = _UNARY | _BINARY

# In-place methods return their receiver, whose shape they never change (an operand that
# would broadcast it raises): ``torch.sum(x).mul_(-0.5)`` is as 0-dim as the sum.
_IN_PLACE = frozenset(
    {"mul_", "add_", "sub_", "div_", "pow_", "clamp_", "clamp_min_", "clamp_max_", "neg_"}
    | {"abs_", "exp_", "log_", "sqrt_", "rsqrt_", "sigmoid_", "tanh_", "square_", "relu_"}
    | {"reciprocal_", "log1p_", "expm1_", "zero_", "fill_", "detach_", "requires_grad_"}
)


# Methods that return a (values, indices) pair of tensors of the same shape.
_PAIR_METHODS = frozenset({"max", "min", "median", "mode", "kthvalue", "topk", "sort"})


# Methods whose result is a tensor when called on one (the 1-D-index rule's evidence).
_TENSOR_METHODS = (
    _ELEMENTWISE
    | _IN_PLACE
    | _REDUCTIONS
    | _PAIR_METHODS
    | frozenset(
        {"view", "view_as", "reshape", "squeeze", "unsqueeze", "t", "multinomial", "eq", "ne"}
    )
)


# torch constructors whose integer arguments are the sizes (one per dimension).
_SIZED = frozenset(
    {"zeros", "ones", "rand", "randn", "empty", "Tensor", "FloatTensor", "DoubleTensor"}
    | {"LongTensor", "IntTensor", "ByteTensor", "HalfTensor"}
)


# Builtins whose result is a Python number.
_NUMBER_BUILTINS = frozenset({"len", "int", "float", "round"})


_FUNCTIONAL_LOSSES = frozenset(
    {"cross_entropy", "nll_loss", "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss"}
    | {"binary_cross_entropy", "binary_cross_entropy_with_logits", "kl_div", "margin_ranking_loss"}
    | {
        "hinge_embedding_loss",
        "soft_margin_loss",
        "multilabel_margin_loss",
        "cosine_embedding_loss",
    }
    | {"poisson_nll_loss", "gaussian_nll_loss", "triplet_margin_loss", "ctc_loss"}
)


def _dim_keyword(call: ast.Call) -> bool:
    """A reduction told its dimension by keyword: ``dim=``, or ``axis=`` (torch's NumPy
    alias, and numpy's own spelling)."""
    return find_keyword(call, "dim") is not None or find_keyword(call, "axis") is not None


def _keeps_dims(call: ast.Call) -> bool:
    """``keepdim=`` other than ``False``: ``torch.argmax(x, keepdim=True)`` keeps every dim."""
    keep = find_keyword(call, "keepdim")
    return keep is not None and not is_const(keep.value, False)


def _reduces_to_scalar(call: ast.Call) -> Optional[bool]:
    """Whether a loss call or constructor keeps the default reduction (a 0-dim result)."""
    reduction = find_keyword(call, "reduction")
    if reduction is not None:
        value = reduction.value
        if isinstance(value, ast.Constant):
            return value.value != "none"
        return None
    reduce = find_keyword(call, "reduce")
    if reduce is not None:
        return None if not isinstance(reduce.value, ast.Constant) else bool(reduce.value.value)
    return True


def int_constant(node: ast.AST) -> Optional[int]:
    """The value of an integer literal (``0``, ``-1``; not a bool), else None."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = int_constant(node.operand)
        return None if inner is None else -inner
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    return None


class Unpacked(ast.AST):
    """``a, b = value``: the binding of one name of an unpacking (element ``index``)."""

    _fields = ()

    def __init__(self, value: ast.AST, index: int) -> None:
        super().__init__()
        self.value = value
        self.index = index


_Binding = Tuple[Pos, ast.AST, bool]


class ZeroDim:
    """Decides whether an expression is a 0-dim tensor from what produced it (ST020).

    The producer is followed through assignments (also tuple unpacking), the file's own
    functions (their ``return`` values, and their parameters through every call site) and
    ``total = 0; total += loss`` accumulators; shapes are tracked where the code states
    them (``torch.zeros(3)``, ``.view(-1)``, ``.max(0)[1]``, integer indexing).
    """

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self._assigns: Dict[int, Dict[str, List[_Binding]]] = {}
        self._self_attrs: Optional[Dict[str, ast.AST]] = None
        self._functions: Optional[Dict[str, List[ast.FunctionDef]]] = None
        self._calls: Optional[Dict[str, List[ast.Call]]] = None
        self._dicts: Optional[Tuple[Set[str], Set[str]]] = None
        self._defaulting: Tuple[Set[str], Set[str]] = (set(), set())
        self._class_defs: Optional[List[ast.ClassDef]] = None
        # A file that imports no torch shows no tensor: x.all() may be a query's rows.
        self.torch_file = any(m.split(".")[0] == "torch" for m in ctx.imports.values())

    # -- where names come from ---------------------------------------------------------------
    def _bindings(self, scope: ast.AST) -> Dict[str, List[_Binding]]:
        """name -> [(position, value, augmented)] for the plain names ``scope`` binds."""
        found = self._assigns.get(id(scope))
        if found is None:
            found = {}
            body = getattr(scope, "body", [])
            for stmt in statements_in_order(body if isinstance(body, list) else []):
                if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
                    target = stmt.targets[0]
                    if isinstance(target, ast.Name):
                        found.setdefault(target.id, []).append((start_of(stmt), stmt.value, False))
                    elif isinstance(target, (ast.Tuple, ast.List)):
                        value = stmt.value
                        # a, b = 0, []: each name its own element
                        literal = isinstance(value, (ast.Tuple, ast.List)) and len(
                            value.elts
                        ) == len(target.elts)
                        for i, elt in enumerate(target.elts):
                            if isinstance(elt, ast.Name):
                                item: ast.AST = Unpacked(value, i)
                                if literal:
                                    assert isinstance(value, (ast.Tuple, ast.List))
                                    item = value.elts[i]
                                found.setdefault(elt.id, []).append((start_of(stmt), item, False))
                elif isinstance(stmt, ast.AugAssign) and isinstance(stmt.target, ast.Name):
                    found.setdefault(stmt.target.id, []).append((start_of(stmt), stmt.value, True))
            self._assigns[id(scope)] = found
        return found

    def _self_attr_value(self, attr: str) -> Optional[ast.AST]:
        if self._self_attrs is None:
            self._self_attrs = {}
            for node in self.ctx.walk(self.ctx.tree):
                if isinstance(node, ast.Assign) and len(node.targets) == 1:
                    name = self_attr(node.targets[0])
                    if name is not None:
                        self._self_attrs[name] = node.value
        return self._self_attrs.get(attr)

    def functions(self, name: str) -> List[ast.FunctionDef]:
        """The functions and methods of the file called ``name``."""
        if self._functions is None:
            self._functions = {}
            for node in self.ctx.walk(self.ctx.tree):
                if isinstance(node, ast.FunctionDef):
                    self._functions.setdefault(node.name, []).append(node)
        return self._functions.get(name, [])

    def call_sites(self, name: str) -> List[ast.Call]:
        """The calls ``name(...)`` of the file."""
        if self._calls is None:
            self._calls = {}
            for node in self.ctx.walk(self.ctx.tree):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                    self._calls.setdefault(node.func.id, []).append(node)
        return self._calls.get(name, [])

    def bound_names(self, scope: ast.AST) -> Set[str]:
        """The plain names ``scope`` assigns (a parameter among them is rebound)."""
        return set(self._bindings(scope))

    def scope_of(self, node: ast.AST) -> ast.AST:
        """The function (or the module) whose body holds ``node``."""
        up = parents(self.ctx)
        current = up.get(id(node))
        while current is not None and not isinstance(current, (*FUNCTION_DEFS, ast.Lambda)):
            current = up.get(id(current))
        return self.ctx.tree if current is None else current

    def _param_index(self, scope: ast.AST, name: str) -> Optional[int]:
        if not isinstance(scope, ast.FunctionDef):
            return None
        names = [a.arg for a in scope.args.args]
        return names.index(name) if name in names else None

    def _from_callers(self, fn: ast.FunctionDef, index: int, depth: int) -> Optional[bool]:
        """A parameter decided from the argument every call site in the file passes."""
        calls = self.call_sites(fn.name)
        if not calls or len(self.functions(fn.name)) != 1:
            return None
        name = fn.args.args[index].arg
        results = []
        for call in calls:
            arg = self._argument(call, index, name)
            if arg is None:
                return None
            results.append(self.decide(arg, start_of(call), self.scope_of(call), depth))
        if False in results:
            return False
        return True if all(r is True for r in results) else None

    def binding(self, name: str, at: Pos, scope: ast.AST) -> Optional[Tuple[ast.AST, Pos, ast.AST]]:
        """The last plain binding of ``name`` before ``at`` (value, position, scope)."""
        for where in (scope, self.ctx.tree) if scope is not self.ctx.tree else (scope,):
            if where is not self.ctx.tree and self._param_index(where, name) is not None:
                return None
            plain = [b for b in self._bindings(where).get(name, []) if b[0] < at and not b[2]]
            if plain:
                pos, value, _ = plain[-1]
                return value, pos, where
            if name in self._bindings(where):
                return None
        return None

    def _value_of(self, name: str, at: Pos, scope: ast.AST, depth: int) -> Optional[bool]:
        for where in (scope, self.ctx.tree) if scope is not self.ctx.tree else (scope,):
            index = self._param_index(where, name)
            if index is not None and name not in self._bindings(where):
                assert isinstance(where, ast.FunctionDef)  # _param_index is None for the rest
                return self._from_callers(where, index, depth)
            bindings = [b for b in self._bindings(where).get(name, []) if b[0] < at]
            if not bindings:
                if name in self._bindings(where):
                    return None  # bound only later (a loop): cannot tell
                continue
            plain = [b for b in bindings if not b[2]]
            if not plain:
                return None
            pos, value, _ = plain[-1]
            result = self.decide(value, pos, where, depth)
            if self.is_number(value, pos, where, depth):
                # total = 0; total += loss  -> a 0-dim tensor from the first addition
                added = [
                    self.decide(v, p, where, depth) for p, v, aug in bindings if aug and p > pos
                ]
                return True if any(a is True for a in added) else None
            return result
        return None

    def _is_loss_module(
        self, func: ast.AST, at: Pos, scope: ast.AST, depth: int = 0
    ) -> Optional[bool]:
        """``criterion(...)`` where ``criterion = nn.CrossEntropyLoss()`` (also a loss class of
        the file whose ``forward`` returns 0-dim values, and a ``criterion`` parameter every
        call site of its function passes such a loss to)."""
        value: Optional[ast.AST] = None
        attr = self_attr(func)
        if attr is not None:
            value = self._self_attr_value(attr)
        elif isinstance(func, ast.Name):
            index = self._param_index(scope, func.id)
            if index is not None and func.id not in self._bindings(scope):
                assert isinstance(scope, ast.FunctionDef)  # _param_index is None for the rest
                return self._loss_from_callers(scope, index, depth)
            for where in (scope, self.ctx.tree):
                bindings = [b for b in self._bindings(where).get(func.id, []) if not b[2]]
                if bindings:
                    value = bindings[-1][1]
                    break
        return None if value is None else self._loss_value(value, depth)

    def _loss_value(self, value: ast.AST, depth: int) -> Optional[bool]:
        """Whether calling ``value`` gives a 0-dim loss: an ``nn.*Loss()`` without
        ``reduction="none"``, ``F.mse_loss`` and the other functional losses (passed as a
        function), a class of the file whose ``forward`` returns 0-dim values."""
        if depth > 8:
            return None
        qual = self.ctx.qualname(value) or ""
        if qual.startswith(FUNCTIONAL):
            return True if qual[len(FUNCTIONAL) :] in _FUNCTIONAL_LOSSES else None
        if not isinstance(value, ast.Call):
            return None
        qual = self.ctx.qualname(value.func) or ""
        if qual.startswith(NN) and qual.endswith("Loss"):
            return _reduces_to_scalar(value)
        if qual or not isinstance(value.func, ast.Name):
            return None
        classes = [c for c in self._classes() if c.name == value.func.id]
        forwards = [
            f
            for c in classes
            for f in c.body
            if isinstance(f, ast.FunctionDef) and f.name == "forward"
        ]
        if len(classes) != 1 or len(forwards) != 1:
            return None
        rets = [r.value for r in _own_returns(forwards[0])]
        if not rets or any(r is None for r in rets):
            return None
        return _all_true(
            [self.decide(r, start_of(r), forwards[0], depth + 1) for r in rets if r is not None]
        )

    def _classes(self) -> List[ast.ClassDef]:
        if self._class_defs is None:
            self._class_defs = [
                n for n in self.ctx.walk(self.ctx.tree) if isinstance(n, ast.ClassDef)
            ]
        return self._class_defs

    def _loss_from_callers(self, fn: ast.FunctionDef, index: int, depth: int) -> Optional[bool]:
        """A ``criterion`` parameter called in ``fn``: decided from what every call site of
        ``fn`` in the file passes (``train(model, nn.MSELoss())``, ``train(..., criterion)``)."""
        calls = self.call_sites(fn.name)
        if not calls or len(self.functions(fn.name)) != 1 or depth > 8:
            return None
        name = fn.args.args[index].arg
        results: List[Optional[bool]] = []
        for call in calls:
            arg = self._argument(call, index, name)
            if arg is None:
                return None
            if isinstance(arg, ast.Name):
                caller = self.scope_of(call)
                outer = self._param_index(caller, arg.id)
                if outer is not None and arg.id not in self._bindings(caller):
                    assert isinstance(caller, ast.FunctionDef)
                    results.append(self._loss_from_callers(caller, outer, depth + 1))
                    continue
                found = self.binding(arg.id, start_of(call), caller)
                results.append(None if found is None else self._loss_value(found[0], depth + 1))
            else:
                results.append(self._loss_value(arg, depth + 1))
        return _all_true(results)

    @staticmethod
    def _argument(call: ast.Call, index: int, name: str) -> Optional[ast.AST]:
        """What ``call`` passes for parameter ``index`` called ``name``, or None."""
        arg: Optional[ast.AST] = None
        if index < len(call.args) and not any(isinstance(a, ast.Starred) for a in call.args):
            arg = call.args[index]
        kw = find_keyword(call, name)
        return arg if kw is None else kw.value

    # -- numbers -----------------------------------------------------------------------------
    def is_number(self, expr: ast.AST, at: Pos, scope: ast.AST, depth: int = 0) -> bool:
        """Whether ``expr`` is evidently a Python number (a literal, ``len(x)``, ``float(x)``,
        ``args.lr`` of an argparse namespace, arithmetic of those)."""
        if depth > 8:
            return False
        depth += 1
        if isinstance(expr, ast.Constant):
            return isinstance(expr.value, (int, float)) and not isinstance(expr.value, bool)
        if isinstance(expr, ast.UnaryOp):
            return self.is_number(expr.operand, at, scope, depth)
        if isinstance(expr, ast.BinOp):
            return self.is_number(expr.left, at, scope, depth) and self.is_number(
                expr.right, at, scope, depth
            )
        if isinstance(expr, ast.Call):
            func = expr.func
            if isinstance(func, ast.Name) and func.id in _NUMBER_BUILTINS:
                return func.id not in self.ctx.imports and not self.functions(func.id)
            return (self.ctx.qualname(func) or "").startswith("math.")
        if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name):
            found = self.binding(expr.value.id, at, scope)
            value = None if found is None else found[0]
            return (
                isinstance(value, ast.Call)
                and isinstance(value.func, ast.Attribute)
                and value.func.attr == "parse_args"
            )
        if isinstance(expr, ast.Name):
            found = self.binding(expr.id, at, scope)
            if found is None:
                return self._range_variable(expr)
            return self.is_number(found[0], found[1], found[2], depth)
        return False

    def _range_variable(self, name: ast.Name) -> bool:
        """``i`` inside ``for i in range(...)`` or ``[... for i in range(...)]``."""
        up = parents(self.ctx)
        node = up.get(id(name))
        while node is not None and not isinstance(node, (*FUNCTION_DEFS, ast.Lambda)):
            loops: List[Tuple[ast.AST, ast.AST]] = []
            if isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
                loops = [(g.target, g.iter) for g in node.generators]
            elif isinstance(node, ast.For):
                loops = [(node.target, node.iter)]
            for target, values in loops:
                if isinstance(target, ast.Name) and target.id == name.id:
                    return (
                        isinstance(values, ast.Call)
                        and isinstance(values.func, ast.Name)
                        and values.func.id == "range"
                        and "range" not in self.ctx.imports
                        and not self.functions("range")
                    )
            node = up.get(id(node))
        return False

    def callee(self, call: ast.Call) -> Optional[Tuple[ast.FunctionDef, int]]:
        """The file's function a call runs, and how many leading parameters the call does
        not pass (1 for ``self``): ``f(...)`` of the file's one ``f``, ``self.m(...)`` in a
        class that defines ``m``, ``obj.m(...)`` where ``obj = Cls(...)`` of a class of the
        file; None otherwise."""
        func = call.func
        if isinstance(func, ast.Name):
            fns = self.functions(func.id)
            if len(fns) != 1 or func.id in self.ctx.imports:
                return None
            if self.binding(func.id, start_of(call), self.scope_of(call)) is not None:
                return None
            owner = parents(self.ctx).get(id(fns[0]))
            return (fns[0], 0) if not isinstance(owner, ast.ClassDef) else None
        if not (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name)):
            return None
        receiver = func.value.id
        classes: List[ast.ClassDef] = []
        if receiver == "self":
            scope: Optional[ast.AST] = self.scope_of(call)
            owner = parents(self.ctx).get(id(scope)) if scope is not None else None
            if isinstance(owner, ast.ClassDef):
                classes = [owner]
        else:
            found = self.binding(receiver, start_of(call), self.scope_of(call))
            made = None if found is None else found[0]
            if isinstance(made, ast.Call) and isinstance(made.func, ast.Name):
                classes = [c for c in self._classes() if c.name == made.func.id]
        if len(classes) != 1:
            return None
        methods = [
            s for s in classes[0].body if isinstance(s, ast.FunctionDef) and s.name == func.attr
        ]
        if len(methods) != 1 or not methods[0].args.args:
            return None
        return methods[0], 1

    # -- shapes ------------------------------------------------------------------------------
    def ndim(self, expr: ast.AST, at: Pos, scope: ast.AST, depth: int = 0) -> Optional[int]:
        """The number of dimensions of a tensor expression where the code states it."""
        if depth > 8:
            return None
        depth += 1
        if isinstance(expr, ast.Attribute) and expr.attr == "data":
            return self.ndim(expr.value, at, scope, depth)
        if isinstance(expr, ast.Name):
            found = self.binding(expr.id, at, scope)
            return None if found is None else self.ndim(found[0], found[1], found[2], depth)
        if isinstance(expr, Unpacked):
            return self._pair_ndim(expr.value, at, scope, depth)
        if isinstance(expr, ast.Subscript):
            pair = int_constant(expr.slice)
            if pair in (0, 1) and isinstance(expr.value, ast.Call):
                inner = self._pair_ndim(expr.value, at, scope, depth)
                if inner is not None:
                    return inner
            base = self.ndim(expr.value, at, scope, depth)
            if base is None:
                return None
            elts = expr.slice.elts if isinstance(expr.slice, ast.Tuple) else [expr.slice]
            dropped = 0
            for e in elts:
                if isinstance(e, ast.Slice):
                    continue
                if int_constant(e) is None and not self.is_number(e, at, scope):
                    return None
                dropped += 1
            return base - dropped if base >= dropped else None
        if isinstance(expr, ast.Call):
            return self._call_ndim(expr, at, scope, depth)
        return None

    def _pair_ndim(self, call: ast.AST, at: Pos, scope: ast.AST, depth: int) -> Optional[int]:
        """Dimensions of each tensor of ``x.max(0)``, ``x.topk(k)``, ``x.sort()``, and of the
        function forms ``torch.max(x, 0)``, ``torch.topk(x, k)``, ``torch.sort(x)``."""
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)):
            return None
        qual = self.ctx.qualname(call.func)
        if qual is None:
            method, receiver, rest = call.func.attr, call.func.value, call.args
        elif qual.startswith("torch.") and qual.count(".") == 1 and call.args:
            method, receiver, rest = qual[len("torch.") :], call.args[0], call.args[1:]
        else:
            return None
        if method not in _PAIR_METHODS:
            return None
        base = self.ndim(receiver, at, scope, depth)
        if base is None:
            return None
        if method in ("topk", "sort"):
            return base
        if rest and int_constant(rest[0]) is None and not self.is_number(rest[0], at, scope):
            return None  # x.max(y) of a tensor y: the element-wise maximum, not a pair
        keep = find_keyword(call, "keepdim")
        if keep is not None and not is_const(keep.value, False):
            return base if is_const(keep.value, True) else None
        has_dim = bool(rest) or find_keyword(call, "dim") is not None
        return base - 1 if has_dim and base >= 1 else None

    def _method_pair(self, call: ast.Call, at: Pos, scope: ast.AST) -> bool:
        """``x.max(1)``, ``x.min(dim=0)``, ``x.sort()``, ``x.topk(k)`` of a value whose
        producer is not visible (a parameter, a model's output): torch's (values, indices)
        pair, as ``torch.max(x, 1)`` is. NumPy spells the dim ``axis=``, its ``sort`` sorts
        in place and returns None and it has no ``topk``; an array whose producer is visible
        (``np.zeros(...)``, ``x.numpy()``, a list) is not taken for a tensor."""
        func = call.func
        if not isinstance(func, ast.Attribute) or self.ctx.qualname(func):
            return False
        if func.attr in ("max", "min"):
            if not self._dim_given(call, call.args, at, scope):
                return False  # x.max(): one value; x.max(y): the element-wise maximum
        elif func.attr not in _PAIR_METHODS:
            return False
        return not self._evidently_not_tensor(func.value, at, scope)

    def _evidently_not_tensor(self, expr: ast.AST, at: Pos, scope: ast.AST) -> bool:
        """A value (through names) the code made with NumPy, pandas, ``.numpy()``/``.tolist()``
        or a Python literal."""
        for _ in range(8):
            if not isinstance(expr, ast.Name):
                break
            found = self.binding(expr.id, at, scope)
            if found is None:
                return False
            expr, at, scope = found
        if isinstance(expr, (ast.List, ast.Tuple, ast.Dict, ast.Set, ast.Constant)):
            return True
        if isinstance(expr, (ast.ListComp, ast.DictComp, ast.SetComp)):
            return True
        if not isinstance(expr, ast.Call):
            return False
        root = (self.ctx.qualname(expr.func) or "").split(".", 1)[0]
        if root in ("numpy", "pandas", "scipy"):
            return True
        return isinstance(expr.func, ast.Attribute) and expr.func.attr in ("numpy", "tolist")

    def dim_reduction_pair(self, expr: ast.AST, at: Pos, scope: ast.AST) -> bool:
        """``expr`` (through ``.data`` and names) is the values or indices of ``max``/``min``
        along a dim without ``keepdim=True``: ``_, pred = torch.max(out, 1)``,
        ``out.max(1)[1]`` (one dim fewer since torch 0.2; before, the dim was kept)."""
        for _ in range(8):
            if isinstance(expr, ast.Attribute) and expr.attr == "data":
                expr = expr.value
            elif isinstance(expr, ast.Name):
                found = self.binding(expr.id, at, scope)
                if found is None:
                    return False
                expr, at, scope = found
            else:
                break
        if isinstance(expr, Unpacked):
            call: ast.AST = expr.value
        elif isinstance(expr, ast.Subscript) and int_constant(expr.slice) in (0, 1):
            call = expr.value
        else:
            return False
        if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Attribute):
            return False
        qual = self.ctx.qualname(call.func)
        if call.func.attr not in ("max", "min") or qual not in (None, f"torch.{call.func.attr}"):
            return False
        if _keeps_dims(call):
            return False
        return self._dim_given(call, call.args[1:] if qual else call.args, at, scope)

    def _dim_given(self, call: ast.Call, rest: Sequence[ast.AST], at: Pos, scope: ast.AST) -> bool:
        """``max``/``min`` told a dim (``dim=``, or a number after the input): a pair. A tensor
        there (``x.max(y)``) asks for the element-wise maximum."""
        if find_keyword(call, "dim") is not None:
            return True
        return bool(rest) and (
            int_constant(rest[0]) is not None or self.is_number(rest[0], at, scope)
        )

    def _call_ndim(self, call: ast.Call, at: Pos, scope: ast.AST, depth: int) -> Optional[int]:
        func = call.func
        qual = self.ctx.qualname(func) or ""
        if qual.startswith("torch.") and qual.count(".") == 1:
            name = qual[len("torch.") :]
            if name == "tensor" and call.args:
                return _literal_depth(call.args[0])
            if name in _SIZED and call.args:
                if len(call.args) == 1 and isinstance(call.args[0], (ast.List, ast.Tuple)):
                    return _literal_depth(call.args[0]) if name[0].isupper() else None
                if all(self.is_number(a, at, scope) for a in call.args):
                    return len(call.args)
            return None
        if not isinstance(func, ast.Attribute) or qual:
            return None
        method = func.attr
        base = self.ndim(func.value, at, scope, depth)
        if method in ("view", "reshape"):
            args = call.args
            if len(args) == 1 and isinstance(args[0], (ast.Tuple, ast.List)):
                return len(args[0].elts)
            if args and all(self.is_number(a, at, scope) for a in args):
                return len(args)
            return None
        if method == "flatten" and not call.args and not call.keywords:
            return 1
        if method in ("unsqueeze",) and base is not None:
            return base + 1
        if method in _UNARY or method in _IN_PLACE or method in ("multinomial", "t"):
            return base
        if method in _BINARY:
            return self._broadcast_ndim(base, _operands(call, call.args), at, scope, depth)
        if method in _REDUCTIONS:
            has_dim = bool(call.args) if method != "norm" else len(call.args) > 1
            has_dim = has_dim or _dim_keyword(call)
            if not has_dim and not _keeps_dims(call):
                return 0 if self.torch_file else None
            keep = find_keyword(call, "keepdim")
            if base is None or method in _PAIR_METHODS:
                return None
            if keep is not None:
                return base if is_const(keep.value, True) else None
            return base - 1 if base >= 1 else None
        return None

    def _broadcast_ndim(
        self, base: Optional[int], operands: Sequence[ast.AST], at: Pos, scope: ast.AST, depth: int
    ) -> Optional[int]:
        """Dimensions of an element-wise result of a tensor of ``base`` dims and operands."""
        for operand in operands:
            if base is None:
                return None
            if isinstance(operand, ast.Constant) or self.is_number(operand, at, scope):
                continue
            other = self.ndim(operand, at, scope, depth)
            base = None if other is None else max(base, other)
        return base

    def same_shape_since_0_1(self, expr: ast.AST, at: Pos, scope: ast.AST) -> bool:
        """Whether integer indexing ``expr`` reaches a tensor whose shape no torch release
        changed: one of ``x.topk(k)`` / ``x.sort()`` (they keep every dimension), where
        ``x.max(1)`` and the other reductions with a dim kept it before torch 0.2."""
        while isinstance(expr, ast.Subscript):
            index = expr.slice
            if int_constant(index) is None and not self.is_number(index, at, scope):
                return False
            expr = expr.value
            if isinstance(expr, ast.Attribute) and expr.attr == "data":
                expr = expr.value
        if isinstance(expr, ast.Name):
            found = self.binding(expr.id, at, scope)
            if found is None:
                return False
            expr = found[0]
        call = expr.value if isinstance(expr, Unpacked) else expr
        return (
            isinstance(call, ast.Call)
            and isinstance(call.func, ast.Attribute)
            and call.func.attr in ("topk", "sort")
            and not self.ctx.qualname(call.func)
        )

    def is_tensor(self, expr: ast.AST, at: Pos, scope: ast.AST, depth: int = 0) -> bool:
        """Whether ``expr`` is evidently a tensor (``x.data``, tensor methods on one, torch
        functions, what ``x.topk(k)`` / ``x.max(d)`` unpack to)."""
        if depth > 8:
            return False
        depth += 1
        if self.ndim(expr, at, scope) is not None:
            return True
        if isinstance(expr, ast.Attribute):
            return expr.attr == "data"
        if isinstance(expr, ast.Name):
            found = self.binding(expr.id, at, scope)
            return found is not None and self.is_tensor(found[0], found[1], found[2], depth)
        if isinstance(expr, Unpacked):
            call = expr.value
            return (
                isinstance(call, ast.Call)
                and isinstance(call.func, ast.Attribute)
                and call.func.attr in _PAIR_METHODS
                and (
                    self.is_tensor(call.func.value, at, scope, depth)
                    or self._method_pair(call, at, scope)
                )
            )
        if isinstance(expr, ast.Subscript):
            return self.is_tensor(expr.value, at, scope, depth)
        if isinstance(expr, ast.Call):
            qual = self.ctx.qualname(expr.func) or ""
            if qual.startswith("torch.") and qual.count(".") == 1:
                return qual[len("torch.") :] in _REDUCTIONS | _PAIR_METHODS | {"multinomial"}
            func = expr.func
            if not isinstance(func, ast.Attribute) or qual or func.attr not in _TENSOR_METHODS:
                return False
            return self.is_tensor(func.value, at, scope, depth) or self._method_pair(
                expr, at, scope
            )
        return False

    def is_dict(self, expr: ast.AST, plain: bool = False) -> bool:
        """Whether ``expr`` is a name or attribute the file assigns a dict literal to (with
        ``plain``: and never a ``defaultdict``/``Counter``, whose missing keys get a value)."""
        if self._dicts is None:
            names: Set[str] = set()
            attrs: Set[str] = set()
            for node in self.ctx.walk(self.ctx.tree):
                if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                    value = node.value
                    is_dict = isinstance(value, (ast.Dict, ast.DictComp)) or (
                        isinstance(value, ast.Call)
                        and isinstance(value.func, (ast.Name, ast.Attribute))
                        and getattr(value.func, "id", getattr(value.func, "attr", ""))
                        in ("dict", "defaultdict", "OrderedDict", "Counter")
                    )
                    if not is_dict:
                        continue
                    defaulting = isinstance(value, ast.Call) and getattr(
                        value.func, "id", getattr(value.func, "attr", "")
                    ) in ("defaultdict", "Counter")
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    for target in targets:
                        if isinstance(target, ast.Name):
                            names.add(target.id)
                            if defaulting:
                                self._defaulting[0].add(target.id)
                        elif isinstance(target, ast.Attribute):
                            attrs.add(target.attr)
                            if defaulting:
                                self._defaulting[1].add(target.attr)
            self._dicts = (names, attrs)
        return _named(expr, self._dicts) and not (plain and _named(expr, self._defaulting))

    # -- 0-dim -------------------------------------------------------------------------------
    def decide(self, expr: ast.AST, at: Pos, scope: ast.AST, depth: int) -> Optional[bool]:
        """True: 0-dim; False: evidently not; None: the producer is not visible."""
        if depth > 8:
            return None
        depth += 1
        result = self._decide(expr, at, scope, depth)
        if result is None and not isinstance(expr, (ast.Attribute, ast.Name, ast.BinOp)):
            n = self.ndim(expr, at, scope, depth)
            if n is not None:
                return n == 0
        return result

    def _decide(self, expr: ast.AST, at: Pos, scope: ast.AST, depth: int) -> Optional[bool]:
        if isinstance(expr, ast.Attribute) and expr.attr == "data":
            return self.decide(expr.value, at, scope, depth)
        if isinstance(expr, ast.Name):
            return self._value_of(expr.id, at, scope, depth)
        if isinstance(expr, Unpacked):
            return self._item(expr, at, scope, depth)
        if isinstance(expr, ast.UnaryOp):
            return self.decide(expr.operand, at, scope, depth)
        if isinstance(expr, ast.BinOp):
            sides = [self.decide(s, at, scope, depth) for s in (expr.left, expr.right)]
            numbers = [self.is_number(s, at, scope) for s in (expr.left, expr.right)]
            if False in sides:
                return False
            if all(s is True or n for s, n in zip(sides, numbers)) and True in sides:
                return True
            return None
        if isinstance(expr, ast.Subscript):
            index = expr.slice
            if isinstance(index, ast.Tuple) and len(index.elts) >= 2:
                kinds = [
                    True
                    if isinstance(e, ast.Constant) and isinstance(e.value, int)
                    else self.decide(e, at, scope, depth)
                    for e in index.elts
                ]
                tensors = [e for e in index.elts if not isinstance(e, ast.Constant)]
                if all(k is True for k in kinds) and tensors:
                    return True  # every index a 0-dim tensor or an int: one element
            return None
        if isinstance(expr, ast.Call):
            return self._call(expr, at, scope, depth)
        return None

    def _with_operands(
        self,
        first: Optional[bool],
        operands: Sequence[ast.AST],
        at: Pos,
        scope: ast.AST,
        depth: int,
    ) -> Optional[bool]:
        """Whether an element-wise result is 0-dim: its first input is, and every operand is
        a number or a 0-dim tensor (a tensor operand broadcasts the result to its shape)."""
        if first is False:
            return False
        for operand in operands:
            if isinstance(operand, ast.Constant) or self.is_number(operand, at, scope):
                continue
            n = self.ndim(operand, at, scope, depth)
            if n is not None and n > 0:
                return False
            if n != 0 and self.decide(operand, at, scope, depth) is not True:
                return None
        return first

    def _item(self, item: Unpacked, at: Pos, scope: ast.AST, depth: int) -> Optional[bool]:
        """``a, b = f(...)`` with ``f`` a function of the file returning tuples."""
        call = item.value
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name)):
            return None
        fns = self.functions(call.func.id)
        if len(fns) != 1 or call.func.id in self.ctx.imports:
            return None
        results = []
        for ret in _own_returns(fns[0]):
            value = ret.value
            if not isinstance(value, ast.Tuple) or len(value.elts) <= item.index:
                return None
            results.append(self.decide(value.elts[item.index], start_of(ret), fns[0], depth))
        return _all_true(results)

    def _returns(self, name: str, depth: int) -> Optional[bool]:
        """``f(...)`` with ``f`` a function of the file: decided from its return values."""
        fns = self.functions(name)
        if len(fns) != 1 or name in self.ctx.imports:
            return None
        rets = [r.value for r in _own_returns(fns[0])]
        if not rets or any(r is None for r in rets):
            return None
        return _all_true(
            [self.decide(r, start_of(r), fns[0], depth) for r in rets if r is not None]
        )

    def _call(self, call: ast.Call, at: Pos, scope: ast.AST, depth: int) -> Optional[bool]:
        func = call.func
        qual = self.ctx.qualname(func) or ""
        if qual.startswith(FUNCTIONAL):
            if qual[len(FUNCTIONAL) :] in _FUNCTIONAL_LOSSES:
                return _reduces_to_scalar(call)
            return None
        if qual.startswith("torch.") and qual.count(".") == 1:
            name = qual[len("torch.") :]
            if name in _REDUCTIONS:
                if _dim_keyword(call) or len(call.args) != 1:
                    return False if name != "norm" or len(call.args) > 2 else None
                return None if _keeps_dims(call) else True
            if name in _ELEMENTWISE and call.args:
                first = self.decide(call.args[0], at, scope, depth)
                if name in _BINARY:
                    return self._with_operands(
                        first, _operands(call, call.args[1:]), at, scope, depth
                    )
                return first
            return None
        if qual.startswith(NN) and qual.endswith("Loss"):
            return None  # the constructor itself
        if isinstance(func, ast.Call):  # nn.MSELoss()(a, b)
            inner = self.ctx.qualname(func.func) or ""
            if inner.startswith(NN) and inner.endswith("Loss"):
                return _reduces_to_scalar(func)
            return None
        if isinstance(func, ast.Attribute) and not qual:
            attr = func.attr
            if attr in _REDUCTIONS and self_attr(func) is None:
                positional = len(call.args) - (1 if attr == "norm" else 0)
                if _dim_keyword(call) or positional > 0:
                    return False
                return None if _keeps_dims(call) or not self.torch_file else True
            if (attr in _UNARY or attr in _IN_PLACE) and self_attr(func) is None:
                return self.decide(func.value, at, scope, depth)
            if attr in _BINARY and self_attr(func) is None:
                first = self.decide(func.value, at, scope, depth)
                return self._with_operands(first, _operands(call, call.args), at, scope, depth)
        if isinstance(func, ast.Name) and not qual:
            bound = self._bindings(scope).get(func.id) or self._bindings(self.ctx.tree).get(func.id)
            if made_by_batched_models(self.ctx, [b[1] for b in bound or []]):
                return False  # a model whose forward returns a row (errD = netD(x))
        loss = self._is_loss_module(func, at, scope, depth)
        if loss is None and isinstance(func, ast.Name) and not qual:
            if self.binding(func.id, at, scope) is None:
                return self._returns(func.id, depth)
        return loss


def _operands(call: ast.Call, positional: Sequence[ast.expr]) -> List[ast.expr]:
    """The operands of an element-wise call: ``positional`` and its keyword values but
    ``out=`` (a tensor written into, resized to the result)."""
    return [*positional, *(k.value for k in call.keywords if k.arg not in (None, "out"))]


def _named(expr: ast.AST, table: Tuple[Set[str], Set[str]]) -> bool:
    """Whether ``expr`` is one of the names, or an attribute of one of the attribute names."""
    names, attrs = table
    if isinstance(expr, ast.Name):
        return expr.id in names
    return isinstance(expr, ast.Attribute) and expr.attr in attrs


def _literal_depth(node: ast.AST) -> Optional[int]:
    """Nesting depth of a list literal: ``3`` -> 0, ``[1, 2]`` -> 1, ``[[1]]`` -> 2."""
    depth = 0
    while isinstance(node, (ast.List, ast.Tuple)):
        if not node.elts:
            return depth + 1
        node = node.elts[0]
        depth += 1
    if depth == 0:
        # torch.tensor(values): a name may hold a list (the corpus's torch.tensor(losses))
        number = node.operand if isinstance(node, ast.UnaryOp) else node
        return 0 if isinstance(number, ast.Constant) else None
    if isinstance(node, (ast.Constant, ast.Name, ast.UnaryOp, ast.BinOp)):
        return depth
    return None


def _own_returns(fn: ast.AST) -> List[ast.Return]:
    return [n for n in own_nodes(fn) if isinstance(n, ast.Return)]


def _all_true(results: Sequence[Optional[bool]]) -> Optional[bool]:
    if not results:
        return None
    if False in results:
        return False
    return True if all(r is True for r in results) else None


def numpy_source(node: ast.expr) -> Optional[ast.expr]:
    """``x`` for ``x.numpy()``, ``x.data.numpy()``, ``x.cpu().data.numpy()``,
    ``x.data.cpu().numpy()``: the tensor a ``.numpy()`` array was made from."""
    if not (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "numpy"
        and not node.args
    ):
        return None
    inner: ast.expr = node.func.value
    while True:
        if isinstance(inner, ast.Attribute) and inner.attr == "data":
            inner = inner.value
        elif (
            isinstance(inner, ast.Call)
            and isinstance(inner.func, ast.Attribute)
            and inner.func.attr in ("cpu", "detach")
            and not inner.args
        ):
            inner = inner.func.value
        else:
            return inner
