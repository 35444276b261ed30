"""Saving a wrapped model's state_dict (ST011): the ``state_dict`` patch's pitfall (a
discarded non-strict load's result is :mod:`safetorch.check.rules.nonstrict_load`'s).
"""

from __future__ import annotations

import ast
from typing import Dict, Iterator, List, Optional, Sequence, Set, Tuple, Union

from safetorch.check.engine import Context
from safetorch.check.rules._b1_loads import Load, file_loads
from safetorch.check.rules._base import Rule
from safetorch.check.rules._helpers import (
    FUNCTION_DEFS,
    NN,
    FunctionNode,
    bound_names,
    call_name,
    find_keyword,
    has_star,
    own_expressions,
    self_attr,
    statements_in_order,
)
from safetorch.check.rules._wrapped import Branch, made_for_its_keys, statements_with_branch

_WRAPPERS = {
    NN + "DataParallel": "DataParallel",
    NN + "parallel.DistributedDataParallel": "DistributedDataParallel",
}


# Calls chained on a freshly wrapped model that return the same wrapper.
_CHAINED_ON_MODELS = frozenset({"cuda", "to", "cpu", "float", "half", "double", "train", "eval"})


def _state_dict_of(node: ast.AST) -> Optional[ast.expr]:
    """``m`` for ``m.state_dict()``."""
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "state_dict"
    ):
        return node.func.value
    return None


def _tests_the_wrap(test: ast.expr) -> Optional[bool]:
    """True for a test that holds where the model is wrapped (``hasattr(m, "module")``,
    ``isinstance(m, DataParallel)``, ``is_parallel(m)``), False for its negation, None for
    a test of anything else (``args.ema``)."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = _tests_the_wrap(test.operand)
        return None if inner is None else not inner
    if not isinstance(test, ast.Call):
        return None
    name = call_name(test.func)
    if name == "hasattr" and len(test.args) == 2:
        key = test.args[1]
        return True if isinstance(key, ast.Constant) and key.value == "module" else None
    if name == "isinstance" and len(test.args) == 2:
        return True if "Parallel" in ast.unparse(test.args[1]) else None
    return True if "parallel" in name.lower() else None


def _state_dict_holders(ctx: Context, expr: ast.AST) -> Iterator[Tuple[ast.Call, ast.expr]]:
    """``(m.state_dict() call, m)`` for every ``m.state_dict()`` inside ``expr``, but the
    bare side of an unwrap under a test of the wrap (``m.module.state_dict() if
    is_parallel(m) else m.state_dict()``, ``hasattr(m, "module")``, negated with the sides
    swapped): that side runs only where ``m`` holds bare keys."""
    unwrapped: Set[int] = set()
    for sub in ctx.walk(expr):  # pre-order: a conditional comes before its sides
        if isinstance(sub, ast.IfExp):
            wrapped = _tests_the_wrap(sub.test)
            if wrapped is None:
                continue  # `if args.ema`: decides nothing about the wrap
            inner = _state_dict_of(sub.body if wrapped else sub.orelse)
            bare = sub.orelse if wrapped else sub.body
            held = _state_dict_of(bare)
            if (
                held is not None
                and isinstance(inner, ast.Attribute)
                and inner.attr == "module"
                and ctx.segment(inner.value) == ctx.segment(held)
            ):
                unwrapped.add(id(bare))
            continue
        held = _state_dict_of(sub)
        if isinstance(sub, ast.Call) and held is not None and id(sub) not in unwrapped:
            yield sub, held


class _Scope:
    """What ST011 knows while it reads one scope top to bottom."""

    def __init__(self, node: Union[ast.Module, FunctionNode], local_names: Set[str]) -> None:
        self.node = node
        self.local_names = local_names  # names bound here (not declared global)
        # name -> (wrapper class, branch of the wrapping statement, wrapped only sometimes)
        self.wrapped: Dict[str, Tuple[str, Branch, bool]] = {}
        # name -> state_dict() calls of wrapped models its value holds
        self.holds: Dict[str, List[Tuple[ast.Call, str, str, bool]]] = {}


def _bound_here(fn: FunctionNode) -> Set[str]:
    """Names a function binds locally (parameters and assignments, minus ``global`` ones)."""
    names: Set[str] = set()
    declared: Set[str] = set()
    args = fn.args
    for arg in (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg):
        if arg is not None:
            names.add(arg.arg)
    for stmt in statements_in_order(fn.body):
        if isinstance(stmt, ast.Global):
            declared.update(stmt.names)
        elif isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            for target in targets:
                names.update(bound_names(target))
        elif isinstance(stmt, (ast.For, ast.AsyncFor)):
            names.update(bound_names(stmt.target))
    return names - declared


class StateDictOfWrappedModel(Rule):
    """ST011: saving the ``state_dict()`` of a DataParallel/DDP-wrapped model.

    The wrapper's state_dict keys all start with ``module.``, so the file does not load into
    the bare model (``Missing key(s) in state_dict: "conv.weight" ... Unexpected key(s):
    "module.conv.weight"``).

    The rule follows the wrapped model within the module: through assignments
    (``model = nn.DataParallel(model)``, also under ``if n_gpu > 1:``), ``self.model``
    attributes, dict literals and variables that hold its ``state_dict()``
    (``state = {"model": model.state_dict()}; torch.save(state, path)``), module-level models
    wrapped in ``__main__`` code and saved inside a function, and one call level: a
    function of the module that passes its parameter to ``torch.save``
    (``save_checkpoint({"state_dict": model.state_dict()}, path)``).

    The wrapper is seen through calls chained on it (``DataParallel(model).cuda()``) and
    through ``DataParallel(m) if n_gpu > 1 else m``; a rebinding on another branch
    (``else: model = model.cuda()``) does not hide it. A wrapper used only for its keys
    (``nn.DataParallel(model).state_dict()`` to add the prefix on purpose, or a test of
    prefix handling: never called, trained or passed on) is not reported, nor the bare side
    of a save that unwraps (``m.module.state_dict() if is_parallel(m) else m.state_dict()``).
    A loader under ``if __name__ == "__main__":`` counts as always wrapping its model when
    it wraps there: the block runs whenever the script does.

    Fix (manual): save ``st.unwrap_model(m).state_dict()`` (``m.module.state_dict()`` only
    where ``m`` is always wrapped: it crashes where the wrap is conditional), and change the
    load side too where the project resumes from its own files: ``st.load_state_dict(m,
    sd)`` loads keys with or without the prefix into a wrapped or a bare model.

    safetorch: ``st.unwrap_model``.
    """

    code = "ST011"

    preview = True  # below 97% on the held-out corpus half (docs/check.md)

    name = "state-dict-of-wrapped-model"
    uses = "st.unwrap_model"
    torch_symbols = ("torch.save",)
    node_types = (ast.Call,)

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self._any_wrapper = False

    def visit(self, node: ast.Call) -> None:
        # The shared walk only notes whether the file wraps a model at all: most files do
        # not, and the dataflow below (its own walks) is then skipped.
        if not self._any_wrapper and self._wrap_call(node) is not None:
            self._any_wrapper = True

    def _wrap_call(self, value: Optional[ast.AST]) -> Optional[str]:
        if isinstance(value, ast.Call):
            return _WRAPPERS.get(self.ctx.qualname(value.func) or "")
        return None

    def _wrapper(self, value: Optional[ast.AST]) -> Optional[Tuple[str, bool]]:
        """(wrapper class, only sometimes) for ``DataParallel(m)``, seen through device and
        mode calls chained on it (``DataParallel(m).cuda()``) and ``DP(m) if c else m``."""
        while (
            isinstance(value, ast.Call)
            and isinstance(value.func, ast.Attribute)
            and value.func.attr in _CHAINED_ON_MODELS
            and self._wrap_call(value) is None
        ):
            value = value.func.value
        if isinstance(value, ast.IfExp):
            for side in (value.body, value.orelse):
                found = self._wrapper(side)
                if found is not None:
                    return found[0], True
            return None
        wrapper = self._wrap_call(value)
        return None if wrapper is None else (wrapper, False)

    def finish(self) -> None:
        if not self._any_wrapper:
            return
        tree = self.ctx.tree
        functions = [
            n for n in self.ctx.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
        ]
        self._self_wrapped: Dict[str, Tuple[str, Branch, bool]] = {}
        for scope_node in (tree, *functions):
            for stmt, branch in statements_with_branch(scope_node.body):
                if isinstance(stmt, ast.Assign):
                    found = self._wrapper(stmt.value)
                    for target in stmt.targets:
                        attr = self_attr(target)
                        if attr is not None and found is not None:
                            self._self_wrapped[attr] = (found[0], branch, found[1] or bool(branch))
        self._savers = self._saving_functions(functions)
        self._reported: Set[int] = set()
        module = _Scope(tree, set())
        self._read_scope(module, None)  # module level first: its wrapped globals
        for fn in functions:
            self._read_scope(_Scope(fn, _bound_here(fn)), module)

    def _saving_functions(self, functions: Sequence[FunctionNode]) -> Dict[str, Tuple[int, str]]:
        """Module functions that ``torch.save`` one of their parameters: name -> (index, param)."""
        savers: Dict[str, Tuple[int, str]] = {}
        for fn in functions:
            params = [a.arg for a in (*fn.args.posonlyargs, *fn.args.args)]
            if params and params[0] in ("self", "cls"):
                continue
            for sub in self.ctx.walk(fn):
                if (
                    isinstance(sub, ast.Call)
                    and sub.args
                    and self.ctx.qualname(sub.func) == "torch.save"
                    and isinstance(sub.args[0], ast.Name)
                    and sub.args[0].id in params
                ):
                    name = fn.name
                    savers[name] = (params.index(sub.args[0].id), sub.args[0].id)
                    break
        return savers

    def _lookup(self, scope: _Scope, module: Optional[_Scope], name: str) -> Tuple[_Scope, bool]:
        """The scope whose binding of ``name`` is meant here (and whether it is local)."""
        if module is None or name in scope.local_names:
            return scope, True
        return module, False

    def _wrapped_holder(
        self, scope: _Scope, module: Optional[_Scope], holder: ast.AST
    ) -> Optional[Tuple[str, Branch, bool]]:
        if isinstance(holder, ast.Name):
            owner, _ = self._lookup(scope, module, holder.id)
            return owner.wrapped.get(holder.id)
        attr = self_attr(holder)
        return None if attr is None else self._self_wrapped.get(attr)

    def _wrapped_state_dicts(
        self, scope: _Scope, module: Optional[_Scope], expr: ast.AST
    ) -> List[Tuple[ast.Call, str, str, bool]]:
        """The wrapped models' ``state_dict()`` calls whose result ``expr`` holds:
        (call, model as written, wrapper, wrapped only sometimes)."""
        found: List[Tuple[ast.Call, str, str, bool]] = []
        for call, holder in _state_dict_holders(self.ctx, expr):
            wrapped = self._wrapped_holder(scope, module, holder)
            if wrapped is not None:
                found.append((call, self.ctx.segment(holder), wrapped[0], wrapped[2]))
        for sub in self.ctx.walk(expr):
            if isinstance(sub, ast.Name):
                owner, _ = self._lookup(scope, module, sub.id)
                found.extend(owner.holds.get(sub.id, ()))
        return found

    def _read_scope(self, scope: _Scope, module: Optional[_Scope]) -> None:
        body = scope.node.body
        for stmt, branch in statements_with_branch(body):
            if isinstance(stmt, ast.Assign):
                self._assign(scope, module, stmt, branch)
            for sub in self._calls_of(stmt):
                self._judge_call(scope, module, sub)

    def _calls_of(self, stmt: ast.stmt) -> Iterator[ast.Call]:
        """Calls in the statement itself (not in nested blocks, functions or classes)."""
        for part in own_expressions(stmt):
            for sub in self.ctx.walk(part):
                if isinstance(sub, ast.Call):
                    yield sub

    def _assign(
        self, scope: _Scope, module: Optional[_Scope], stmt: ast.Assign, branch: Branch
    ) -> None:
        found = self._wrapper(stmt.value)
        held = self._wrapped_state_dicts(scope, module, stmt.value)
        for target in stmt.targets:
            if isinstance(target, ast.Name):
                owner, _ = self._lookup(scope, module, target.id)
                if found is not None:
                    if not made_for_its_keys(self.ctx, stmt, branch):
                        owner.wrapped[target.id] = (found[0], branch, found[1] or bool(branch))
                else:
                    # Rebound to something else (model = model.module): it is no longer
                    # wrapped, unless the wrap happened only on a branch this is not on
                    # (if n_gpu > 1: model = DataParallel(model) / else: model = model.cuda()).
                    previous = owner.wrapped.get(target.id)
                    if previous is not None and branch == previous[1][: len(branch)]:
                        owner.wrapped.pop(target.id, None)
                if held:
                    owner.holds[target.id] = list(held)
                else:
                    owner.holds.pop(target.id, None)
            elif isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name):
                # state["model"] = model.state_dict()
                if held:
                    owner, _ = self._lookup(scope, module, target.value.id)
                    owner.holds.setdefault(target.value.id, []).extend(held)

    def _resume_line(self, scope: _Scope, model: str) -> Optional[int]:
        """The line where the code loads a state dict into ``model`` (its own resume): in the
        saving function, or anywhere for ``self.<model>`` and module-level models."""
        local = isinstance(scope.node, FUNCTION_DEFS) and model.split(".")[0] in scope.local_names
        for node in self.ctx.walk(scope.node if local else self.ctx.tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "load_state_dict"
                and self.ctx.segment(node.func.value) == model
            ):
                return node.lineno
        return None

    def _judge_call(self, scope: _Scope, module: Optional[_Scope], call: ast.Call) -> None:
        saved: Optional[ast.AST] = None
        if call.args and self.ctx.qualname(call.func) == "torch.save":
            saved = call.args[0]
        elif isinstance(call.func, ast.Name) and call.func.id in self._savers:
            if self.ctx.imports.get(call.func.id) is None:  # the module's own function
                index, param = self._savers[call.func.id]
                kw = find_keyword(call, param)
                if kw is not None:
                    saved = kw.value
                elif len(call.args) > index and not has_star(call):
                    saved = call.args[index]
        if saved is None:
            return
        for sd_call, model, wrapper, sometimes in self._wrapped_state_dicts(scope, module, saved):
            if id(sd_call) in self._reported:
                continue
            self._reported.add(id(sd_call))
            found = self._project_loads(sd_call)
            loads, keyed = found if found is not None else ([], False)
            if found is not None and self._format_is_wrapped(loads, sometimes):
                continue
            message = self._message(scope, call, model, wrapper, sometimes, loads, keyed)
            self.report(sd_call, message)

    # -- the project's own loaders ----------------------------------------------------------
    def _project_loads(
        self, sd_call: ast.Call
    ) -> Optional[Tuple[List[Tuple[str, Load, bool]], bool]]:
        """(file, load, whether that file strips the prefix) for every load of a
        ``torch.load``-ed state dict into a model in the project (only those reading the key
        the state dict is saved under, where some do), and whether they read that key. None
        when the project is not read whole."""
        facts = self.ctx.project_facts("ST011-loads", file_loads)
        if not self.ctx.project.complete:
            return None
        here = self.ctx.project.relpath(self.ctx.path)
        stripping = {name for found in facts.values() for name in found.stripping_functions}
        loads = [
            (path, load, load.strips or bool(stripping.intersection(load.through)))
            for path, found in sorted(facts.items(), key=lambda item: item[0] != here)
            for load in found.loads
        ]
        key = self._saved_under().get(id(sd_call))
        if key is not None:
            keyed = [item for item in loads if key in item[1].keys]
            if keyed:
                return keyed, True
        return loads, False

    def _saved_under(self) -> Dict[int, str]:
        """id(``m.state_dict()`` call) -> the string key it is stored under in this file
        (``{"model": m.state_dict()}``, ``ckpt["model"] = m.state_dict()``)."""
        found: Optional[Dict[int, str]] = self.ctx.cache.get("ST011-saved-under")
        if found is None:
            found = {}
            for node in self.ctx.walk(self.ctx.tree):
                if isinstance(node, ast.Dict):
                    for k, v in zip(node.keys, node.values):
                        if isinstance(k, ast.Constant) and isinstance(k.value, str):
                            found[id(v)] = k.value
                elif isinstance(node, ast.Assign) and len(node.targets) == 1:
                    target = node.targets[0]
                    if isinstance(target, ast.Subscript) and isinstance(target.slice, ast.Constant):
                        if isinstance(target.slice.value, str):
                            found[id(node.value)] = target.slice.value
            self.ctx.cache["ST011-saved-under"] = found
        return found

    @staticmethod
    def _format_is_wrapped(loads: List[Tuple[str, Load, bool]], sometimes: bool) -> bool:
        """Whether the wrapped form is the project's checkpoint format: it has loaders, and
        each strips the prefix itself or (for a model that is always saved wrapped) loads
        into a model that is always wrapped too."""
        if not loads:
            return False
        return all(
            strips or (not sometimes and load.wrapped == "always") for _, load, strips in loads
        )

    def _message(
        self,
        scope: _Scope,
        call: ast.Call,
        model: str,
        wrapper: str,
        sometimes: bool,
        loads: List[Tuple[str, Load, bool]],
        keyed: bool,
    ) -> str:
        if sometimes:
            advice = (
                f"save st.unwrap_model({model}).state_dict() ({model}.module exists only "
                "when it is wrapped)"
            )
            what = (
                f"{model} is wrapped in {wrapper} on some paths only, so the file saved at "
                f"line {call.lineno} has 'module.'-prefixed keys on those paths and bare "
                "keys on the others"
            )
        else:
            advice = f"save st.unwrap_model({model}).state_dict() (or {model}.module.state_dict())"
            what = (
                f"{model} is saved from the {wrapper} wrapper, so the keys of the file saved "
                f"at line {call.lineno} all start with 'module.'"
            )
        bare = [(path, load) for path, load, strips in loads if not strips]
        bare = [(path, load) for path, load in bare if load.wrapped != "always" or sometimes]
        if bare:
            path, load = bare[0]
            into = {"no": "an unwrapped model", "sometimes": "a model wrapped only sometimes"}
            what += (
                f", and the project loads {'it' if keyed else 'checkpoints'} into "
                f"{into.get(load.wrapped, 'a wrapped model')} (`{load.model}` at "
                f"{path}:{load.line})"
            )
        else:
            what += " and do not load into the bare model"
        resume = self._resume_line(scope, model)
        if resume is not None:
            load_advice = (
                f", and load it at line {resume} with st.load_state_dict({model}, ...), "
                "which accepts keys with or without the prefix"
            )
        else:
            load_advice = "; st.load_state_dict loads files with or without the prefix"
        return f"{what}: {advice}{load_advice}"
