"""APIs torch 1.x removed (ST017 ``torch.solve``/``eig``/... and ST019 legacy autograd
Functions); what torch 0.4 changed is in ``legacy_0_4``, ``torch._six`` in ``torch_six``: the
``legacy`` patch's pitfall."""

from __future__ import annotations

import ast
from typing import Dict, List, Optional, Sequence, Set, Tuple

from safetorch.check.engine import SAFE, UNSAFE, Context, Edit, Fix
from safetorch.check.fixer import newline, parents
from safetorch.check.rules._base import Rule
from safetorch.check.rules._helpers import (
    call_arg,
    has_double_star,
    has_star,
    is_const,
    literal_bool,
    own_nodes,
    self_attr,
)

__all__ = ["LegacyAutogradFunction", "RemovedLinalgFunction"]

_LEGACY_LINALG = {f"torch.{n}" for n in ("solve", "lstsq", "eig", "symeig", "matrix_rank")}


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
            upper = literal_bool(call_arg(call, 2, "upper"), True)
            if upper is None or not call.args:
                return None
            uplo = '"U"' if upper else '"L"'
            text = self._spell(call, "eigvalsh", [seg(call.args[0]), f"UPLO={uplo}"])
            return None if text is None else Fix(f"use {text}", (self.ctx.replace(outer, text),))
        return None

    def _call_fix(self, call: ast.Call, name: str) -> Optional[Fix]:
        seg = self.ctx.segment
        if name == "symeig" and _plain_call(call, ("input", "eigenvectors", "upper")):
            vectors = literal_bool(call_arg(call, 1, "eigenvectors"), False)
            upper = literal_bool(call_arg(call, 2, "upper"), True)
            if vectors is not True or upper is None or not call.args:
                return None
            uplo = '"U"' if upper else '"L"'
            text = self._spell(call, "eigh", [seg(call.args[0]), f"UPLO={uplo}"])
            return None if text is None else Fix(f"use {text}", (self.ctx.replace(call, text),))
        if name == "matrix_rank" and _plain_call(call, ("input", "tol", "symmetric")):
            if not call.args:
                return None
            tol = call_arg(call, 1, "tol")
            symmetric = literal_bool(call_arg(call, 2, "symmetric"), False)
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
        returns = [n for n in own_nodes(backward) if isinstance(n, ast.Return)]
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
