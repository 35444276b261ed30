"""APIs newer torch removed or changed (ST017, ST019-ST022; ``torch._six`` has its own module,
``torch_six``): the ``legacy`` patch's pitfall."""

from __future__ import annotations

import ast
from typing import Dict, Iterator, List, Optional, Sequence, Set, Tuple, Union

from safetorch.check.engine import SAFE, UNSAFE, Context, Edit, Fix
from safetorch.check.fixer import enclosing_statement, import_edit, newline, parents, wrap_edits
from safetorch.check.rules._base import Rule
from safetorch.check.rules._helpers import (
    FUNCTION_DEFS,
    FUNCTIONAL,
    NN,
    Pos,
    call_arg,
    end_of,
    find_keyword,
    has_double_star,
    has_star,
    is_const,
    self_attr,
    start_of,
    statements_in_order,
    var_key,
)

_LEGACY_LINALG = {f"torch.{n}" for n in ("solve", "lstsq", "eig", "symeig", "matrix_rank")}


def _literal_bool(node: Optional[ast.AST], default: bool) -> Optional[bool]:
    """The value of a literal True/False argument (``default`` when absent), else None."""
    if node is None:
        return default
    if isinstance(node, ast.Constant) and isinstance(node.value, bool):
        return node.value
    return None


def _plain_call(call: ast.Call, names: Sequence[str]) -> bool:
    """Only positional/keyword arguments among ``names`` (no *args, **kw, out=)."""
    if has_star(call) or has_double_star(call) or len(call.args) > len(names):
        return False
    return all(kw.arg in names[len(call.args) :] for kw in call.keywords)


class RemovedLinalgFunction(Rule):
    """ST017: ``torch.solve``, ``lstsq``, ``eig``, ``symeig``, ``matrix_rank`` (removed).

    Deprecated in torch 1.9 and now stubs that raise. Their ``torch.linalg`` replacements
    differ: ``torch.solve(B, A)`` is ``torch.linalg.solve(A, B)`` (arguments swapped, no LU),
    ``symeig`` read the *upper* triangle and returned no eigenvectors by default, ``lstsq``
    returned ``max(m, n)`` rows (residuals below the solution), ``eig`` returned ``(n, 2)``
    real/imaginary rows where ``linalg.eig`` returns complex tensors.

    Fix (automatic) where the modern call computes the same values:

        torch.solve(B, A)[0]             ->  torch.linalg.solve(A, B)            (safe)
        torch.symeig(A)[0]               ->  torch.linalg.eigvalsh(A, UPLO="U")  (safe)
        torch.symeig(A, eigenvectors=True) -> torch.linalg.eigh(A, UPLO="U")     (safe)
        torch.matrix_rank(A, tol)        ->  torch.linalg.matrix_rank(A, atol=tol, rtol=0) (safe)
        torch.matrix_rank(A, symmetric=True) -> ...(A, hermitian=True)  (unsafe: reads the
                                            lower triangle where symeig read the upper)
        torch.lstsq(B, A)[0]             ->  torch.linalg.lstsq(A, B).solution   (unsafe: n
                                            rows, without the residual rows)

    ``eig`` and calls that use the ``LU``/``QR`` outputs are reported without a fix.

    safetorch: ``st.legacy.solve`` (and ``lstsq``, ``eig``, ``symeig``, ``matrix_rank``).
    """

    code = "ST017"

    name = "removed-linalg-function"
    torch_symbols = tuple(sorted(_LEGACY_LINALG))
    fixable = True
    fix_applicability = "safe, or unsafe for lstsq and symmetric matrix_rank"
    node_types = (ast.Subscript, ast.Attribute, ast.Call)

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self._done: Set[int] = set()

    def _spell(self, call: ast.Call, func: str, args: Sequence[str]) -> Optional[str]:
        spelled = self.ctx.spell("torch.linalg." + func)
        if spelled is None:
            root = self.ctx.spell("torch")
            spelled = None if root is None else f"{root}.linalg.{func}"
        return None if spelled is None else f"{spelled}({', '.join(args)})"

    def _first_item_fix(self, outer: ast.expr, call: ast.Call, name: str) -> Optional[Fix]:
        seg = self.ctx.segment
        if name == "solve" and _plain_call(call, ("input", "A")) and len(call.args) == 2:
            text = self._spell(call, "solve", [seg(call.args[1]), seg(call.args[0])])
            return None if text is None else Fix(f"use {text}", (self.ctx.replace(outer, text),))
        if name == "lstsq" and _plain_call(call, ("input", "A")) and len(call.args) == 2:
            text = self._spell(call, "lstsq", [seg(call.args[1]), seg(call.args[0])])
            if text is None:
                return None
            text += ".solution"
            return Fix(
                f"use {text} (n rows, no residual rows)", (self.ctx.replace(outer, text),), UNSAFE
            )
        if name == "symeig" and _plain_call(call, ("input", "eigenvectors", "upper")):
            upper = _literal_bool(call_arg(call, 2, "upper"), True)
            if upper is None or not call.args:
                return None
            uplo = '"U"' if upper else '"L"'
            text = self._spell(call, "eigvalsh", [seg(call.args[0]), f"UPLO={uplo}"])
            return None if text is None else Fix(f"use {text}", (self.ctx.replace(outer, text),))
        return None

    def _call_fix(self, call: ast.Call, name: str) -> Optional[Fix]:
        seg = self.ctx.segment
        if name == "symeig" and _plain_call(call, ("input", "eigenvectors", "upper")):
            vectors = _literal_bool(call_arg(call, 1, "eigenvectors"), False)
            upper = _literal_bool(call_arg(call, 2, "upper"), True)
            if vectors is not True or upper is None or not call.args:
                return None
            uplo = '"U"' if upper else '"L"'
            text = self._spell(call, "eigh", [seg(call.args[0]), f"UPLO={uplo}"])
            return None if text is None else Fix(f"use {text}", (self.ctx.replace(call, text),))
        if name == "matrix_rank" and _plain_call(call, ("input", "tol", "symmetric")):
            if not call.args:
                return None
            tol = call_arg(call, 1, "tol")
            symmetric = _literal_bool(call_arg(call, 2, "symmetric"), False)
            if symmetric is None:
                return None
            args = [seg(call.args[0])]
            if tol is not None and not is_const(tol, None):
                args += [f"atol={seg(tol)}", "rtol=0"]
            if symmetric:
                args.append("hermitian=True")
            text = self._spell(call, "matrix_rank", args)
            if text is None:
                return None
            how = UNSAFE if symmetric else SAFE
            return Fix(f"use {text}", (self.ctx.replace(call, text),), how)
        return None

    def _legacy_call(self, node: Optional[ast.AST]) -> Optional[str]:
        if isinstance(node, ast.Call) and self.ctx.qualname(node.func) in _LEGACY_LINALG:
            return (self.ctx.qualname(node.func) or "").rsplit(".", 1)[1]
        return None

    def visit(self, node: ast.AST) -> None:
        if isinstance(node, (ast.Subscript, ast.Attribute)):
            call = node.value
            name = self._legacy_call(call)
            first = (isinstance(node, ast.Subscript) and is_const(node.slice, 0)) or (
                isinstance(node, ast.Subscript)
                and isinstance(node.slice, ast.Constant)
                and node.slice.value == 0
            )
            first = first or (
                isinstance(node, ast.Attribute) and node.attr in ("solution", "eigenvalues")
            )
            if name is None or not first or not isinstance(call, ast.Call):
                return
            self._done.add(id(call))
            self._report(call, name, self._first_item_fix(node, call, name))
            return
        name = self._legacy_call(node)
        if name is None or id(node) in self._done or not isinstance(node, ast.Call):
            return
        self._report(node, name, self._call_fix(node, name))

    def _report(self, call: ast.Call, name: str, fix: Optional[Fix]) -> None:
        modern = {
            "solve": "torch.linalg.solve(A, B) (arguments swapped; torch.linalg.lu_factor for LU)",
            "lstsq": "torch.linalg.lstsq(A, B).solution (arguments swapped; n rows)",
            "eig": "torch.linalg.eig(A) (complex eigenvalues/eigenvectors)",
            "symeig": 'torch.linalg.eigvalsh(A, UPLO="U") or eigh(A, UPLO="U")',
            "matrix_rank": "torch.linalg.matrix_rank(A, atol=tol, rtol=0, hermitian=symmetric)",
        }[name]
        self.report(
            call,
            f"torch.{name} was removed (deprecated since 1.9): use {modern}, or "
            f"st.legacy.{name} for the torch 1.x result",
            fix,
        )


# Attributes of a legacy Function's ``self`` that the new-style ``ctx`` has under another name
# (``saved_variables`` was removed) or not at all (``mark_shared_storage``: gone in torch 1.0).
_CTX_RENAMES = {"saved_variables": "saved_tensors"}


_CTX_MISSING = frozenset({"mark_shared_storage", "previous_functions", "next_functions"})


def _is_staticmethod(fn: ast.FunctionDef) -> bool:
    return any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in fn.decorator_list)


def _own_nodes(fn: ast.AST) -> Iterator[ast.AST]:
    """The nodes of a function's body, not entering nested functions, lambdas or classes."""
    todo = list(ast.iter_child_nodes(fn))
    while todo:
        node = todo.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            todo.extend(ast.iter_child_nodes(node))


class _StaticRewrite:
    """The mechanical rewrite of one legacy autograd Function into a static-method one (ST019).

    Only what carries over exactly: ``self`` becomes ``ctx`` in ``forward``/``backward``
    (attributes set in forward and read in backward live on ``ctx``); ``__init__`` may only
    call ``super().__init__()`` and store parameters or constants on ``self``, which become
    extra ``forward`` arguments (their gradients ``None``); every use of the class in the file
    is ``Fn(...)(x)`` or ``f = Fn()`` with ``f`` only ever called. ``why`` says what blocked it.
    """

    def __init__(self, ctx: Context, cls: ast.ClassDef) -> None:
        self.ctx = ctx
        self.cls = cls
        self.why = ""
        self.edits: List[Edit] = []
        self.params: List[Tuple[str, Optional[ast.expr]]] = []  # __init__'s, with defaults
        self.init: Optional[ast.FunctionDef] = None

    def fail(self, why: str) -> None:
        if not self.why:
            self.why = why

    def build(self) -> Optional[Fix]:
        methods = {item.name: item for item in self.cls.body if isinstance(item, ast.FunctionDef)}
        forward, backward = methods.get("forward"), methods.get("backward")
        if forward is None or backward is None:
            self.fail("it has no backward")
            return None
        others = [n for n in methods if n not in ("forward", "backward", "__init__")]
        class_attrs = {
            t.id
            for item in self.cls.body
            if isinstance(item, ast.Assign)
            for t in item.targets
            if isinstance(t, ast.Name)
        }
        self.init = methods.get("__init__")
        stored = self._init(self.init)
        if self.why:
            return None
        n_inputs = self._inputs(forward)
        for fn in (forward, backward):
            self._method(fn, set(others) | class_attrs)
        if self.why:
            return None
        if self.params or stored:
            self._extend_forward(forward, stored)
        if self.params:
            self._extra_grads(backward, n_inputs)
        self._call_sites()
        if self.why:
            return None
        return Fix(
            f"make {self.cls.name}.forward/backward static methods with ctx, "
            f"call {self.cls.name}.apply(...)",
            tuple(self.edits),
            UNSAFE,
        )

    # -- __init__ ----------------------------------------------------------------------------
    def _init(self, init: Optional[ast.FunctionDef]) -> Dict[str, str]:
        """attribute -> the text of its value (an ``__init__`` parameter or a constant), in
        parameter order; and the edit that removes ``__init__``."""
        if init is None:
            return {}
        args = init.args
        if args.vararg or args.kwarg or args.kwonlyargs or args.posonlyargs or init.decorator_list:
            self.fail("its __init__ takes *args, **kwargs or keyword-only arguments")
            return {}
        names = [a.arg for a in args.args[1:]]
        defaults: List[Optional[ast.expr]] = [None] * (len(names) - len(args.defaults))
        defaults += list(args.defaults)
        self.params = list(zip(names, defaults))
        me = args.args[0].arg if args.args else "self"
        stored: Dict[str, str] = {}
        for stmt in init.body:
            if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
                continue  # docstring
            if isinstance(stmt, ast.Pass):
                continue
            if (
                isinstance(stmt, ast.Expr)
                and isinstance(stmt.value, ast.Call)
                and isinstance(stmt.value.func, ast.Attribute)
                and stmt.value.func.attr == "__init__"
            ):
                continue  # super().__init__() / Function.__init__(self)
            if (
                isinstance(stmt, ast.Assign)
                and len(stmt.targets) == 1
                and isinstance(stmt.targets[0], ast.Attribute)
                and isinstance(stmt.targets[0].value, ast.Name)
                and stmt.targets[0].value.id == me
            ):
                value = stmt.value
                if isinstance(value, ast.Name) and value.id in names:
                    stored[stmt.targets[0].attr] = value.id
                    continue
                if isinstance(value, ast.Constant):
                    stored[stmt.targets[0].attr] = self.ctx.segment(value)
                    continue
            self.fail("its __init__ does more than store its arguments")
            return {}
        first = init.lineno
        last = init.end_lineno or first
        # Remove the whole lines of __init__ (and one blank line after it, if any).
        if last < len(self.ctx.lines) and not self.ctx.lines[last].strip():
            last += 1
        self.edits.append(Edit(first, 0, last + 1, 0, ""))
        return stored

    # -- forward / backward ------------------------------------------------------------------
    def _inputs(self, forward: ast.FunctionDef) -> Optional[int]:
        a = forward.args
        if a.vararg or a.kwarg or a.kwonlyargs or a.posonlyargs:
            return None
        return len(a.args) - 1

    def _method(self, fn: ast.FunctionDef, helpers: Set[str]) -> None:
        if fn.decorator_list or not fn.args.args or fn.args.posonlyargs:
            self.fail(f"{fn.name} has decorators or no self")
            return
        me = fn.args.args[0].arg
        new = "ctx"
        if me != new and any(
            isinstance(n, ast.Name) and n.id == new or isinstance(n, ast.arg) and n.arg == new
            for n in self.ctx.walk(fn)
        ):
            self.fail(f"{fn.name} already uses the name ctx")
            return
        for node in self.ctx.walk(fn):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                if node is not fn and any(a.arg == me for a in node.args.args):
                    self.fail(f"{fn.name} rebinds {me} in a nested function")
                    return
        up = {id(c): p for p in self.ctx.walk(fn) for c in ast.iter_child_nodes(p)}
        renames: List[Edit] = []
        for node in self.ctx.walk(fn):
            if not (isinstance(node, ast.Name) and node.id == me):
                continue
            if not isinstance(node.ctx, ast.Load):
                self.fail(f"{fn.name} assigns {me}")
                return
            owner = up.get(id(node))
            if not (isinstance(owner, ast.Attribute) and owner.value is node):
                self.fail(f"{fn.name} passes {me} itself on")
                return
            if owner.attr in helpers:
                self.fail(f"{fn.name} uses {me}.{owner.attr} of the class, which ctx lacks")
                return
            if owner.attr in _CTX_MISSING:
                self.fail(f"{me}.{owner.attr} has no new-style equivalent")
                return
            if me != new:
                renames.append(self.ctx.replace(node, new))
            if owner.attr in _CTX_RENAMES:
                renames.append(self.ctx.replace_attr(owner, _CTX_RENAMES[owner.attr]))
        line, col = self.ctx.start(fn)
        indent = self.ctx.lines[line - 1][:col]
        if indent.strip():
            self.fail(f"{fn.name} does not start its line")
            return
        self.edits.append(Edit(line, col, line, col, f"@staticmethod{newline(self.ctx)}{indent}"))
        if me != new:
            self.edits.append(self.ctx.replace(fn.args.args[0], new))
        self.edits.extend(renames)

    def _extend_forward(self, forward: ast.FunctionDef, stored: Dict[str, str]) -> None:
        a = forward.args
        params = [name for name, _ in self.params]
        if params:
            if self._inputs(forward) is None or a.defaults or len(a.args) < 2:
                self.fail("its forward takes defaults, *args or **kwargs besides __init__'s")
                return
            taken = {x.arg for x in a.args} | {
                n.id for n in self.ctx.walk(forward) if isinstance(n, ast.Name)
            }
            if taken & set(params):
                self.fail("an __init__ argument has the name of a forward variable")
                return
            self.edits.append(self.ctx.insert_after(a.args[-1], "".join(f", {p}" for p in params)))
        first = forward.body[0]
        if (
            isinstance(first, ast.Expr)
            and isinstance(first.value, ast.Constant)
            and isinstance(first.value.value, str)
            and len(forward.body) > 1
        ):
            first = forward.body[1]  # after the docstring
        line, col = self.ctx.start(first)
        indent = self.ctx.lines[line - 1][:col]
        if indent.strip():
            self.fail("forward's body does not start its line")
            return
        nl = newline(self.ctx)
        text = "".join(f"ctx.{attr} = {value}{nl}{indent}" for attr, value in stored.items())
        self.edits.append(Edit(line, col, line, col, text))

    def _extra_grads(self, backward: ast.FunctionDef, n_inputs: Optional[int]) -> None:
        """``None`` gradients for the arguments that came from ``__init__``."""
        nones = ", None" * len(self.params)
        returns = [n for n in _own_nodes(backward) if isinstance(n, ast.Return)]
        if not returns or n_inputs is None:
            self.fail("its backward has no return")
            return
        for ret in returns:
            value = ret.value
            if value is None:
                self.fail("its backward returns nothing")
                return
            if isinstance(value, ast.Tuple):
                if len(value.elts) != n_inputs or any(
                    isinstance(e, ast.Starred) for e in value.elts
                ):
                    self.fail("its backward returns a tuple of another length")
                    return
                self.edits.append(self.ctx.insert_after(value.elts[-1], nones))
            elif n_inputs == 1:
                self.edits.append(self.ctx.insert_after(value, nones))
            else:
                self.fail("its backward returns a value that may be a tuple")
                return

    # -- uses of the class -------------------------------------------------------------------
    def _call_sites(self) -> None:
        name = self.cls.name
        up = parents(self.ctx)
        calls = 0
        removed = self.init  # super(Fn, self).__init__() goes with __init__
        inside = (
            set()
            if removed is None
            else {id(n) for n in self.ctx.walk(removed) if isinstance(n, ast.Name)}
        )
        for node in self.ctx.walk(self.ctx.tree):
            if not (isinstance(node, ast.Name) and node.id == name) or id(node) in inside:
                continue
            call = up.get(id(node))
            if not (isinstance(call, ast.Call) and call.func is node):
                self.fail(f"{name} is used other than called")
                return
            outer = up.get(id(call))
            init_args = self._init_args(call)
            if init_args is None:
                return
            if isinstance(outer, ast.Call) and outer.func is call:
                starred = any(isinstance(a, ast.Starred) for a in outer.args)
                if outer.keywords or (self.params and starred):
                    self.fail(f"{name}()(...) passes keyword or starred arguments")
                    return
                args = [self.ctx.segment(a) for a in outer.args] + init_args
                self.edits.append(self.ctx.replace(outer, f"{name}.apply({', '.join(args)})"))
                calls += 1
                continue
            if init_args or not self._only_called(call, outer):
                self.fail(f"an instance of {name} is kept and used other than called")
                return
            self.edits.append(self.ctx.replace(call, f"{name}.apply"))
            calls += 1
        if not calls:
            self.fail(f"{name} is not called in this file (its callers would break)")

    def _init_args(self, call: ast.Call) -> Optional[List[str]]:
        """The ``__init__`` arguments of ``Fn(...)`` as forward arguments, in order."""
        if any(isinstance(a, ast.Starred) for a in call.args) or any(
            k.arg is None for k in call.keywords
        ):
            self.fail(f"{self.cls.name}(...) passes *args or **kwargs")
            return None
        params = self.params
        if len(call.args) > len(params):
            self.fail(f"{self.cls.name}(...) passes more arguments than __init__ takes")
            return None
        given: Dict[str, str] = {p: self.ctx.segment(a) for (p, _), a in zip(params, call.args)}
        for kw in call.keywords:
            if kw.arg not in dict(params) or kw.arg in given:
                self.fail(f"{self.cls.name}(...) passes an unknown keyword")
                return None
            given[str(kw.arg)] = self.ctx.segment(kw.value)
        out: List[str] = []
        for p, default in params:
            if p in given:
                out.append(given[p])
            elif isinstance(default, ast.Constant):
                out.append(self.ctx.segment(default))
            else:
                self.fail(f"{self.cls.name}(...) leaves an __init__ argument to its default")
                return None
        return out

    def _only_called(self, call: ast.Call, owner: Optional[ast.AST]) -> bool:
        """``f = Fn()`` / ``self.f = Fn()`` where every later use of ``f`` is a call."""
        if not (isinstance(owner, ast.Assign) and len(owner.targets) == 1):
            return False
        target = owner.targets[0]
        up = parents(self.ctx)
        uses: List[ast.expr] = []
        if isinstance(target, ast.Name):
            uses = [
                n
                for n in self.ctx.walk(self.ctx.tree)
                if isinstance(n, ast.Name) and n.id == target.id and isinstance(n.ctx, ast.Load)
            ]
        elif isinstance(target, ast.Attribute) and self_attr(target) is not None:
            uses = [
                n
                for n in self.ctx.walk(self.ctx.tree)
                if isinstance(n, ast.Attribute)
                and self_attr(n) == target.attr
                and isinstance(n.ctx, ast.Load)
            ]
        else:
            return False
        for use in uses:
            user = up.get(id(use))
            if not (isinstance(user, ast.Call) and user.func is use):
                return False
        return bool(uses)


class LegacyAutogradFunction(Rule):
    """ST019: an ``autograd.Function`` with instance ``forward``/``backward`` (legacy style).

    Calling such a Function (``MyFn()(x)``) raises since torch 1.5. The new style declares
    ``@staticmethod def forward(ctx, ...)`` and ``@staticmethod def backward(ctx, ...)``,
    stores state on ``ctx`` and is called as ``MyFn.apply(x)``.

    Fix (unsafe, ``--unsafe-fixes``) where the rewrite is mechanical: both methods become
    ``@staticmethod`` with ``self`` renamed ``ctx`` (``self.save_for_backward``,
    ``self.saved_tensors``, ``self.needs_input_grad`` and attributes set in forward for
    backward are ``ctx``'s), arguments ``__init__`` stored on ``self`` become extra
    ``forward`` arguments (backward returns ``None`` for them) and every call site in the
    file is rewritten:

        relu = MyReLU()            ->  relu = MyReLU.apply
        GradReverse(lambd)(x)      ->  GradReverse.apply(x, lambd)

    Not offered (the finding says why) where the class is used other than called, not called
    in the file at all (callers elsewhere would break), ``forward``/``backward`` pass
    ``self`` on or use its other methods, ``__init__`` does more than store its arguments, or
    backward's return cannot be extended exactly.

    safetorch: ``st.legacy.legacy_function`` runs the legacy class unchanged.
    """

    code = "ST019"

    preview = True  # below 97% on the held-out corpus half (docs/check.md)

    name = "legacy-autograd-function"
    uses = "st.legacy.legacy_function"
    torch_symbols = ("torch.autograd.Function",)
    fixable = True
    fix_applicability = UNSAFE
    node_types = (ast.ClassDef,)

    def visit(self, node: ast.ClassDef) -> None:
        if not any(self.ctx.qualname(b) == "torch.autograd.Function" for b in node.bases):
            return
        for item in node.body:
            if isinstance(item, ast.FunctionDef) and item.name == "forward":
                if _is_staticmethod(item):
                    return
                rewrite = _StaticRewrite(self.ctx, node)
                fix = rewrite.build()
                why = "" if fix is not None else f" (no automatic fix: {rewrite.why})"
                self.report(
                    item,
                    f"{node.name}.forward is an instance method (legacy autograd "
                    "Function, raises since torch 1.5): make forward/backward "
                    f"@staticmethod with ctx and call {node.name}.apply(...) "
                    f"(st.legacy.legacy_function runs it unchanged){why}",
                    fix,
                )
                return


_SCALAR_NAMES = ("loss", "acc", "correct", "total", "err", "cost")


# Tensor methods and torch functions that reduce every element to one (0-dim) when called
# without a dim; ``norm`` takes ``p`` first, the others a dim.
_REDUCTIONS = frozenset(
    {"sum", "mean", "prod", "std", "var", "max", "min", "amax", "amin", "median", "norm"}
    | {"all", "any", "dot", "trace", "nansum", "nanmean", "logsumexp", "count_nonzero"}
    | {"argmax", "argmin"}
)


# Element-wise operations: the result has the shape of the (first) input.
_ELEMENTWISE = frozenset(
    {"abs", "exp", "log", "sqrt", "rsqrt", "sigmoid", "tanh", "neg", "clamp", "pow", "square"}
    | {"detach", "float", "double", "half", "cpu", "cuda", "clone", "mul", "add", "sub", "div"}
    | {"reciprocal", "log1p", "expm1", "relu", "contiguous", "to", "type", "long", "int"}
)


# Methods that return a (values, indices) pair of tensors of the same shape.
_PAIR_METHODS = frozenset({"max", "min", "median", "mode", "kthvalue", "topk", "sort"})


# Methods whose result is a tensor when called on one (the 1-D-index rule's evidence).
_TENSOR_METHODS = (
    _ELEMENTWISE
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


def _int_constant(node: ast.AST) -> Optional[int]:
    """The value of an integer literal (``0``, ``-1``; not a bool), else None."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _int_constant(node.operand)
        return None if inner is None else -inner
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    return None


class _Unpacked(ast.AST):
    """``a, b = value``: the binding of one name of an unpacking (element ``index``)."""

    _fields = ()

    def __init__(self, value: ast.AST, index: int) -> None:
        super().__init__()
        self.value = value
        self.index = index


_Binding = Tuple[Pos, ast.AST, bool]


class _ZeroDim:
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
                        for i, elt in enumerate(target.elts):
                            if isinstance(elt, ast.Name):
                                item = _Unpacked(stmt.value, i)
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

    def _call_sites(self, name: str) -> List[ast.Call]:
        if self._calls is None:
            self._calls = {}
            for node in self.ctx.walk(self.ctx.tree):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                    self._calls.setdefault(node.func.id, []).append(node)
        return self._calls.get(name, [])

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
        calls = self._call_sites(fn.name)
        if not calls or len(self.functions(fn.name)) != 1:
            return None
        name = fn.args.args[index].arg
        results = []
        for call in calls:
            arg: Optional[ast.AST] = None
            if index < len(call.args) and not any(isinstance(a, ast.Starred) for a in call.args):
                arg = call.args[index]
            kw = find_keyword(call, name)
            if kw is not None:
                arg = kw.value
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

    def _is_loss_module(self, func: ast.AST, at: Pos, scope: ast.AST) -> Optional[bool]:
        """``criterion(...)`` where ``criterion = nn.CrossEntropyLoss()``."""
        value: Optional[ast.AST] = None
        attr = self_attr(func)
        if attr is not None:
            value = self._self_attr_value(attr)
        elif isinstance(func, ast.Name):
            for where in (scope, self.ctx.tree):
                bindings = [b for b in self._bindings(where).get(func.id, []) if not b[2]]
                if bindings:
                    value = bindings[-1][1]
                    break
        if isinstance(value, ast.Call):
            qual = self.ctx.qualname(value.func) or ""
            if qual.startswith(NN) and qual.endswith("Loss"):
                return _reduces_to_scalar(value)
        return None

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
            return found is not None and self.is_number(found[0], found[1], found[2], depth)
        return False

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
        if isinstance(expr, _Unpacked):
            return self._pair_ndim(expr.value, at, scope, depth)
        if isinstance(expr, ast.Subscript):
            pair = _int_constant(expr.slice)
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
                if _int_constant(e) is None and not self.is_number(e, at, scope):
                    return None
                dropped += 1
            return base - dropped if base >= dropped else None
        if isinstance(expr, ast.Call):
            return self._call_ndim(expr, at, scope, depth)
        return None

    def _pair_ndim(self, call: ast.AST, at: Pos, scope: ast.AST, depth: int) -> Optional[int]:
        """Dimensions of each tensor of ``x.max(0)``, ``x.topk(k)``, ``x.sort()``."""
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)):
            return None
        method = call.func.attr
        if method not in _PAIR_METHODS or self.ctx.qualname(call.func):
            return None
        base = self.ndim(call.func.value, at, scope, depth)
        if base is None:
            return None
        if method in ("topk", "sort"):
            return base
        keep = find_keyword(call, "keepdim")
        if keep is not None and not is_const(keep.value, False):
            return base if is_const(keep.value, True) else None
        has_dim = bool(call.args) or find_keyword(call, "dim") is not None
        return base - 1 if has_dim and base >= 1 else None

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
        if method in _ELEMENTWISE or method in ("multinomial", "t"):
            return base
        if method in _REDUCTIONS:
            has_dim = bool(call.args) if method != "norm" else len(call.args) > 1
            has_dim = has_dim or _dim_keyword(call)
            if not has_dim:
                return 0
            keep = find_keyword(call, "keepdim")
            if base is None or method in _PAIR_METHODS:
                return None
            if keep is not None:
                return base if is_const(keep.value, True) else None
            return base - 1 if base >= 1 else None
        return None

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
        if isinstance(expr, _Unpacked):
            call = expr.value
            return (
                isinstance(call, ast.Call)
                and isinstance(call.func, ast.Attribute)
                and call.func.attr in _PAIR_METHODS
                and self.is_tensor(call.func.value, at, scope, depth)
            )
        if isinstance(expr, ast.Subscript):
            return self.is_tensor(expr.value, at, scope, depth)
        if isinstance(expr, ast.Call):
            qual = self.ctx.qualname(expr.func) or ""
            if qual.startswith("torch.") and qual.count(".") == 1:
                return qual[len("torch.") :] in _REDUCTIONS | _PAIR_METHODS | {"multinomial"}
            func = expr.func
            return (
                isinstance(func, ast.Attribute)
                and not qual
                and func.attr in _TENSOR_METHODS
                and self.is_tensor(func.value, at, scope, depth)
            )
        return False

    def is_dict(self, expr: ast.AST) -> bool:
        """Whether ``expr`` is a name or attribute the file assigns a dict literal to."""
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
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    for target in targets:
                        if isinstance(target, ast.Name):
                            names.add(target.id)
                        elif isinstance(target, ast.Attribute):
                            attrs.add(target.attr)
            self._dicts = (names, attrs)
        names, attrs = self._dicts
        if isinstance(expr, ast.Name):
            return expr.id in names
        return isinstance(expr, ast.Attribute) and expr.attr in attrs

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
        if isinstance(expr, _Unpacked):
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

    def _item(self, item: _Unpacked, at: Pos, scope: ast.AST, depth: int) -> Optional[bool]:
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
                return True
            if name in _ELEMENTWISE and call.args:
                return self.decide(call.args[0], at, scope, depth)
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
                return True
            if attr in _ELEMENTWISE and self_attr(func) is None:
                return self.decide(func.value, at, scope, depth)
        loss = self._is_loss_module(func, at, scope)
        if loss is None and isinstance(func, ast.Name) and not qual:
            if self.binding(func.id, at, scope) is None:
                return self._returns(func.id, depth)
        return loss


def _literal_depth(node: ast.AST) -> Optional[int]:
    """Nesting depth of a list literal: ``3`` -> 0, ``[1, 2]`` -> 1, ``[[1]]`` -> 2."""
    depth = 0
    while isinstance(node, (ast.List, ast.Tuple)):
        if not node.elts:
            return depth + 1
        node = node.elts[0]
        depth += 1
    if isinstance(node, (ast.Constant, ast.Name, ast.UnaryOp, ast.BinOp)):
        return depth
    return None


def _own_returns(fn: ast.AST) -> List[ast.Return]:
    return [n for n in _own_nodes(fn) if isinstance(n, ast.Return)]


def _all_true(results: Sequence[Optional[bool]]) -> Optional[bool]:
    if not results:
        return None
    if False in results:
        return False
    return True if all(r is True for r in results) else None


def _numpy_source(node: ast.expr) -> Optional[ast.expr]:
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


class ZeroDimIndex(Rule):
    """ST020: ``loss.data[0]``: indexing a 0-dim tensor (IndexError since torch 0.5).

    Up to torch 0.3 a loss was a 1-element tensor and ``loss.data[0]`` its value; since 0.4
    it is 0-dim and ``[0]`` raises. The rule decides "0-dim" from what produced the value:
    a reduction without a dim (``x.sum()``, ``torch.mean(x)``, ``x.norm()``), a loss
    (``F.mse_loss(...)``, ``criterion(...)`` with ``criterion = nn.CrossEntropyLoss()``,
    unless ``reduction="none"``), arithmetic of such values with each other and with Python
    numbers (``(a + b).data[0]``, ``len(data) * loss.data``), element-wise functions of
    them (``torch.abs(d)``), indexing with one 0-dim tensor or int per dimension
    (``t[i0, i1]``, ``v.view(-1).max(0)[1]``), following names to their assignment in the
    same function, the file's own functions to their ``return`` values (``loss =
    loss_function(...)``, ``out, loss = train(...)``), parameters to what every call site
    passes, and accumulators (``total = 0; total += loss.data``). Where no producer is
    visible (a parameter of a function the file never calls, an attribute) the name decides
    for ``.data[0]``: loss, acc, correct, total, err, cost.

    Found the same way: ``x[0]`` / ``x[-1]`` without ``.data`` (``total_loss[0]``), and two
    idioms ``safetorch run`` cannot shim: ``x.data.numpy()[0]`` of a 0-dim value (numpy
    raises for a 0-d array), and torch 0.3's integer index of a 1-D tensor, which gave a
    Python number and now gives a 0-dim tensor, used as a dict key (``ni = topi[0][0]``,
    then ``index2word[ni]``: a KeyError, tensors hash by identity).

    Fix (unsafe, ``--unsafe-fixes``): ``.item()``, which returns a Python number where 0.4
    returned a 0-dim tensor (the value is the same; arithmetic on it no longer builds tensors).

        running_loss += loss.data[0]   ->  running_loss += loss.item()
        print(loss.data.numpy()[0])    ->  print(loss.item())
        ni = topi[0][0]                ->  ni = topi[0][0].item()

    safetorch: ``st.legacy.zero_dim_index``.
    """

    code = "ST020"

    preview = True  # below 97% on the held-out corpus half (docs/check.md)

    name = "zero-dim-index"
    uses = "st.legacy.zero_dim_index"
    torch_symbols = ("torch.Tensor.__getitem__",)
    fixable = True
    fix_applicability = UNSAFE
    node_types = (ast.Subscript,)

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self._zero_dim: Optional[_ZeroDim] = None

    @property
    def flow(self) -> _ZeroDim:
        if self._zero_dim is None:
            self._zero_dim = _ZeroDim(self.ctx)
        return self._zero_dim

    def visit(self, node: ast.Subscript) -> None:
        if not isinstance(node.ctx, ast.Load):
            return
        if _int_constant(node.slice) in (0, -1):
            base = node.value
            array_of = _numpy_source(base)
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
            if not any(word in root for word in _SCALAR_NAMES + ("criterion",)):
                return False
        self._item_fix(
            node,
            data.value,
            "x.data[0] of a 0-dim tensor raises since torch 0.5: use x.item() "
            "(under safetorch run, st.legacy.zero_dim_index gives the number, as 0.3 did)",
        )
        return True

    def _item_fix(self, node: ast.expr, tensor: ast.expr, message: str) -> None:
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
        if _int_constant(index) is None and not flow.is_number(index, at, scope):
            return
        if not flow.is_tensor(node.value, at, scope):
            return
        up = parents(self.ctx)
        outer = up.get(id(node))
        if isinstance(outer, ast.Subscript) and outer.value is node:
            return  # topi[0] of topi[0][0]: the outer index is the one to look at
        if (flow.ndim(node, at, scope) or 0) > 0:
            return  # a row, not a number: indexing it gave a tensor in 0.3 too
        keys: List[ast.Subscript] = []
        if isinstance(outer, ast.Subscript) and outer.slice is node:
            keys.append(outer)
        elif (
            isinstance(outer, ast.Assign)
            and outer.value is node
            and len(outer.targets) == 1
            and isinstance(outer.targets[0], ast.Name)
        ):
            name = outer.targets[0].id
            keys = [
                n
                for n in self.ctx.walk(scope)
                if isinstance(n, ast.Subscript)
                and isinstance(n.slice, ast.Name)
                and n.slice.id == name
                and start_of(n) > at
                and flow.scope_of(n) is scope
            ]
        used = [k for k in keys if flow.is_dict(k.value)]
        if not used:
            return
        text = f"{self.ctx.segment(node)}.item()"
        fix = Fix(f"use {text}", (self.ctx.insert_after(node, ".item()"),), UNSAFE)
        self.report(
            node,
            "an integer index of a tensor gave a Python number in torch 0.3 and gives a 0-dim "
            f"tensor since 0.4: as the dict key at line {used[0].lineno} it never matches "
            "(tensors hash by identity): use .item() (st.legacy.zero_dim_index, what "
            "safetorch run uses, cannot change an index that works in plain torch)",
            fix,
        )


_VARIABLE = ("torch.autograd.Variable", "torch.autograd.variable.Variable")


# Statements a `with torch.no_grad():` wrapped around the rest of a block must not hold: a
# function or class defined there would not run under it when called later.
_NOT_WRAPPED = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


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
                values.append(_literal_bool(node_value, True))
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
