"""Discarding a non-strict load's result (ST012): the ``state_dict`` patch's pitfall,
reported where the state dict comes from a file and nothing looks at the keys it misses."""

from __future__ import annotations

import ast
from typing import Callable, Dict, FrozenSet, Iterator, List, Optional, Set, Tuple

from safetorch.check.engine import Context
from safetorch.check.rules._base import Rule
from safetorch.check.rules._helpers import call_name, find_keyword, is_const, own_expressions

_LOG_METHODS = frozenset({"info", "warning", "warn", "debug", "error", "log", "write", "print"})


def _built_under_a_test(
    ctx: Context, scope: ast.AST, name: str, own: FrozenSet[str] = frozenset()
) -> bool:
    """``name[k'] = v`` inside an ``if`` in a loop (or after an ``if k not in own: continue``
    there, ``own`` one of the names in ``own``): a dict built key by key from the keys the
    code chose (``if key.startswith(prefix): sd[key[len(prefix):]] = v``). Not a key
    renamed in place (``for k in list(sd): if k.startswith(p): sd[k[len(p):]] = sd.pop(k)``,
    the loop over the dict it writes, the value read from it): every key stays."""

    def mentions(node: ast.AST) -> bool:
        return any(isinstance(n, ast.Name) and n.id == name for n in ctx.walk(node))

    for loop in ctx.walk(scope):
        if not isinstance(loop, (ast.For, ast.AsyncFor)):
            continue
        in_place = mentions(loop.iter)
        # ``if k not in own: continue``, ``own`` the model's state dict (``own``: names
        # bound to it), guards the rest of the body as a filter against the model's keys
        guarded = any(
            isinstance(stmt, ast.If)
            and any(isinstance(n, ast.Continue) for n in stmt.body)
            and any(isinstance(n, ast.Name) and n.id in own for n in ctx.walk(stmt.test))
            for stmt in loop.body
        )
        tests = [loop] if guarded else [t for t in ctx.walk(loop) if isinstance(t, ast.If)]
        for test in tests:
            for node in ctx.walk(test):
                if (
                    isinstance(node, ast.Assign)
                    and any(
                        isinstance(t, ast.Subscript)
                        and isinstance(t.value, ast.Name)
                        and t.value.id == name
                        for t in node.targets
                    )
                    and not (in_place and mentions(node.value))
                ):
                    return True
    return False


def _root_name(node: ast.AST) -> str:
    """``model`` for ``model.module.encoder``, else ""."""
    while isinstance(node, (ast.Attribute, ast.Call, ast.Subscript)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else ""


def _own_state_names(ctx: Context, scope: ast.AST, root: str) -> Set[str]:
    """Names ``scope`` binds to a ``state_dict()`` of the model (of anything under its root
    name: ``model.module.state_dict()`` for a load into ``model``), and names derived from
    them (``keys = sorted(own.keys())``)."""
    seeds = {
        t.id
        for node in ctx.walk(scope)
        if isinstance(node, ast.Assign)
        and any(
            isinstance(sub, ast.Call)
            and isinstance(sub.func, ast.Attribute)
            and sub.func.attr == "state_dict"
            and _root_name(sub.func.value) == root
            for sub in ctx.walk(node.value)
        )
        for t in node.targets
        if isinstance(t, ast.Name)
    }
    if not seeds:
        return set()
    names = _derived(ctx, scope, seeds)
    for loop in ctx.walk(scope):  # for mine, theirs in zip(own_keys, other): ``mine`` too
        if isinstance(loop, (ast.For, ast.AsyncFor)) and isinstance(loop.target, ast.Tuple):
            if any(isinstance(n, ast.Name) and n.id in names for n in ctx.walk(loop.iter)):
                names.update(n.id for n in loop.target.elts if isinstance(n, ast.Name))
    return names


def _built_from_own_keys(
    ctx: Context, scope: ast.AST, name: str, root: str, own: FrozenSet[str]
) -> bool:
    """``for k, v in own.items(): name[k] = ...`` where ``own`` is the model's own
    ``state_dict()`` (``root``: the model's root name; ``own``: :func:`_own_state_names`): a
    dict built key by key from the model's keys, so the load misses none of them (a key the
    file lacks is filled or fails), whatever the code then discards."""
    if not root:
        return False
    for loop in ctx.walk(scope):
        if not isinstance(loop, (ast.For, ast.AsyncFor)):
            continue
        iterated = {n.id for n in ctx.walk(loop.iter) if isinstance(n, ast.Name)}
        direct = any(
            isinstance(sub, ast.Attribute)
            and sub.attr == "state_dict"
            and _root_name(sub.value) == root
            for sub in ctx.walk(loop.iter)
        )
        if not (direct or iterated & own):
            continue
        target = loop.target.elts[0] if isinstance(loop.target, ast.Tuple) else loop.target
        if not isinstance(target, ast.Name):
            continue
        for node in ctx.walk(loop):
            if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Subscript)
                and isinstance(t.value, ast.Name)
                and t.value.id == name
                and isinstance(t.slice, ast.Name)
                and t.slice.id == target.id
                for t in node.targets
            ):
                return True
    return False


def _model_keys_asserted(ctx: Context, scope: ast.AST, own: FrozenSet[str]) -> bool:
    """An ``assert`` (or a test that raises) compares the model's own keys (``own``:
    :func:`_own_state_names`) with something (``assert key1 == key2`` over
    ``zip(sorted(model.state_dict()), ckpt_keys)``): the code checks what it loads against
    the model before it loads it."""
    if not own:
        return False
    for node in ctx.walk(scope):
        test: Optional[ast.AST] = None
        if isinstance(node, ast.Assert):
            test = node.test
        elif isinstance(node, ast.If) and any(isinstance(b, ast.Raise) for b in node.body):
            test = node.test
        if test is None:
            continue
        for sub in ctx.walk(test):
            if isinstance(sub, ast.Compare) and any(
                isinstance(n, ast.Name) and n.id in own
                for side in (sub.left, *sub.comparators)
                for n in ctx.walk(side)
            ):
                return True
    return False


def _keys_compared(ctx: Context, scope: ast.AST, name: str, model_text: str) -> bool:
    """A statement compares the loaded keys with the model's (``[k for k in
    model.state_dict() if k not in sd]``, ``set(sd) - set(own)``): the code looks at the
    mismatches itself."""
    for stmt in ctx.walk(scope):
        if not isinstance(stmt, ast.stmt):
            continue
        parts = [n for part in own_expressions(stmt) for n in ctx.walk(part)]
        if not any(
            (isinstance(n, ast.Compare) and any(isinstance(o, (ast.In, ast.NotIn)) for o in n.ops))
            or (isinstance(n, ast.BinOp) and isinstance(n.op, ast.Sub))
            for n in parts
        ):
            continue
        names = {n.id for n in parts if isinstance(n, ast.Name)}
        if name not in names:
            continue
        if any(isinstance(n, ast.Attribute) and n.attr == "state_dict" for n in parts):
            return True
        if _holds_model_state(ctx, scope, names - {name}, model_text):
            return True
    return False


def _derived(ctx: Context, scope: ast.AST, seeds: Set[str]) -> Set[str]:
    """``seeds`` and every name bound in ``scope`` from an expression that mentions one of
    them, transitively (``keys = set(sd.keys())`` derives ``keys`` from ``sd``)."""
    names = set(seeds)
    binders: List[Tuple[ast.AST, List[ast.expr]]] = [
        (n.value, n.targets) for n in ctx.walk(scope) if isinstance(n, ast.Assign)
    ]
    binders += [  # for k in missing: print(k)
        (n.iter, [n.target]) for n in ctx.walk(scope) if isinstance(n, (ast.For, ast.AsyncFor))
    ]
    changed = True
    while changed:
        changed = False
        for value, targets in binders:
            if not any(isinstance(n, ast.Name) and n.id in names for n in ctx.walk(value)):
                continue
            for target in targets:
                if isinstance(target, ast.Name) and target.id not in names:
                    names.add(target.id)
                    changed = True
    return names


def _key_names(side: ast.AST) -> Iterator[ast.AST]:
    """The nodes of ``side`` that stand for keys: not inside ``len(...)`` (a count) nor the
    container of a subscript (``sd[k]`` is a value)."""
    stack = [side]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "len":
            continue
        if isinstance(node, ast.Subscript):
            stack.append(node.slice)
            continue
        yield node
        stack.extend(ast.iter_child_nodes(node))


_REPORTS = frozenset({"print", "warn", *_LOG_METHODS})


def _report_places(ctx: Context, function: ast.AST) -> List[ast.AST]:
    """Where the function shows the user something or acts on it: ``assert``, ``if``/``while``
    tests, ``raise`` and the arguments of print/log/warn calls."""
    places: List[ast.AST] = []
    for node in ctx.walk(function):
        if isinstance(node, (ast.Assert, ast.If, ast.While, ast.IfExp)):
            places.append(node.test)
        elif isinstance(node, ast.Raise) and node.exc is not None:
            places.append(node.exc)
        elif isinstance(node, ast.Call):
            if call_name(node.func) in _REPORTS:
                places.extend([*node.args, *(k.value for k in node.keywords)])
    return places


def _is_own_state(node: ast.AST, model_param: str) -> bool:
    """``<model_param>.state_dict`` (the attribute, called or not)."""
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "state_dict"
        and isinstance(node.value, ast.Name)
        and node.value.id == model_param
    )


def _alternatives(value: ast.AST) -> Set[str]:
    """Names ``value`` may be instead of what it computes: a side of a conditional expression
    or an operand of ``or``/``and`` (``ref if ref is not None else model.state_dict()``,
    ``ref or model.state_dict()``); not a name used inside (``if not k.endswith(skip)``)."""
    found: Set[str] = set()
    for node in ast.walk(value):
        sides: List[ast.AST] = []
        if isinstance(node, ast.IfExp):
            sides = [node.body, node.orelse]
        elif isinstance(node, ast.BoolOp):
            sides = list(node.values)
        found.update(s.id for s in sides if isinstance(s, ast.Name))
    return found


def _checker_compares(
    ctx: Context, function: ast.AST, sd_param: str, model_param: str, passed: Set[str]
) -> bool:
    """Whether ``function`` compares the keys of its ``sd_param`` with those of
    ``model_param.state_dict()`` (``unused = set(sd.keys()) - set(model.state_dict().keys())``
    through any number of intermediate names) and shows or acts on the result (an ``assert``,
    an ``if``, a ``raise`` or a print/log call uses it): a difference computed and dropped, a
    count (``len(sd) - len(own)``) or values (``sd[k] - own[k]``) are no key check. A name
    bound from the model's state dict and another parameter the call passes
    (``ref = ref if ref is not None else model.state_dict()``, given a teacher's) may hold
    that other parameter's keys: it is not the model's."""
    loaded = _derived(ctx, function, {sd_param})
    others = passed - {model_param}
    own_seeds: Set[str] = set()
    for node in ctx.walk(function):
        if (
            isinstance(node, ast.Assign)
            and any(
                isinstance(sub, ast.Call) and _is_own_state(sub.func, model_param)
                for sub in ctx.walk(node.value)
            )
            and not (_alternatives(node.value) & others)
        ):
            own_seeds.update(t.id for t in node.targets if isinstance(t, ast.Name))
    own = _derived(ctx, function, own_seeds) - loaded
    places = _report_places(ctx, function)
    reported = {n.id for place in places for n in ctx.walk(place) if isinstance(n, ast.Name)}
    bound = {
        id(sub): node
        for node in ctx.walk(function)
        if isinstance(node, ast.Assign)
        for sub in ctx.walk(node.value)
    }
    for node in ctx.walk(function):
        if isinstance(node, ast.Compare) and any(
            isinstance(o, (ast.In, ast.NotIn)) for o in node.ops
        ):
            sides = [node.left, *node.comparators]
        elif isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Sub, ast.BitAnd)):
            sides = [node.left, node.right]
        else:
            continue
        keys = [list(_key_names(side)) for side in sides]
        mentioned = [{n.id for n in k if isinstance(n, ast.Name)} for k in keys]
        if not (
            any(m & loaded for m in mentioned)
            and any(
                m & own or any(_is_own_state(n, model_param) for n in k)
                for m, k in zip(mentioned, keys)
            )
        ):
            continue
        assign = bound.get(id(node))
        if assign is not None:
            targets = {t.id for t in assign.targets if isinstance(t, ast.Name)}
            if _derived(ctx, function, targets) & reported:
                return True
        elif any(node is sub for place in places for sub in ctx.walk(place)):
            return True  # itself inside an assert/if/while test, a raise or a report call
    return False


def _passed_to_a_key_checker(
    ctx: Context, scope: ast.AST, name: str, model_text: str, load: ast.Call
) -> bool:
    """``check_keys(model, sd)`` in ``scope`` before the load, ``sd`` not rebound between
    them: a function of this file (not shadowed in ``scope``), given both the model and
    ``name``, that compares their keys and reports the result (``_checker_compares``)."""
    functions = {
        node.name: node
        for node in ctx.tree.body
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
    }
    shadowed = {
        n.name for n in ctx.walk(scope) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
    } | {
        n.id for n in ctx.walk(scope) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)
    }
    load_at = ctx.start(load)
    stores = [
        ctx.start(n)
        for n in ctx.walk(scope)
        if isinstance(n, ast.Name) and n.id == name and not isinstance(n.ctx, ast.Load)
    ]
    for call in ctx.walk(scope):
        if not (
            isinstance(call, ast.Call)
            and isinstance(call.func, ast.Name)
            and call.func.id in functions
            and call.func.id not in shadowed
            and not call.keywords
            and ctx.start(call) < load_at
            and not any(ctx.start(call) < at < load_at for at in stores)
        ):
            continue
        function = functions[call.func.id]
        params = [a.arg for a in function.args.posonlyargs + function.args.args]
        if len(params) < len(call.args):
            continue
        sd_at = [i for i, a in enumerate(call.args) if isinstance(a, ast.Name) and a.id == name]
        model_at = [i for i, a in enumerate(call.args) if ctx.segment(a) == model_text]
        passed = set(params[: len(call.args)])
        if any(
            _checker_compares(ctx, function, params[i], params[j], passed)
            for i in sd_at
            for j in model_at
        ):
            return True
    return False


def _holds_model_state(ctx: Context, scope: ast.AST, names: Set[str], model_text: str) -> bool:
    """Whether one of ``names`` is bound to ``<model>.state_dict()`` in ``scope``."""
    for node in ctx.walk(scope):
        if (
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id in names for t in node.targets)
            and isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Attribute)
            and node.value.func.attr == "state_dict"
            and ctx.segment(node.value.func.value) == model_text
        ):
            return True
    return False


def _filtered_or_own(
    ctx: Context,
    scope: ast.AST,
    name: str,
    model: ast.expr,
    load: ast.Call,
    own: FrozenSet[str],
) -> bool:
    """Whether ``name`` in ``scope`` holds a state_dict whose mismatches the code handles.

    It was built by filtering (a dict comprehension with ``if``, a call such as
    ``intersect_dicts(...)`` or ``filter_...``), it starts as the model's own
    ``state_dict()`` (then updated), or the code reports on it (``len(name)`` or the name in a
    print/log call). ``own``: the names bound to the model's own state dict
    (:func:`_own_state_names`).
    """
    model_text = ctx.segment(model)
    if (
        _built_under_a_test(ctx, scope, name, own)
        or _built_from_own_keys(ctx, scope, name, _root_name(model), own)
        or (isinstance(model, ast.Name) and _checker_compares(ctx, scope, name, model.id, set()))
        or _keys_compared(ctx, scope, name, model_text)
        or _passed_to_a_key_checker(ctx, scope, name, model_text, load)
    ):
        return True
    for node in ctx.walk(scope):
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == name for t in node.targets
        ):
            value = node.value
            if isinstance(value, ast.DictComp) and any(g.ifs for g in value.generators):
                return True
            if isinstance(value, ast.Call):
                callee = value.func
                callee_name = (
                    callee.attr if isinstance(callee, ast.Attribute) else getattr(callee, "id", "")
                )
                if any(w in callee_name.lower() for w in ("intersect", "filter", "match")):
                    return True
                if (
                    callee_name == "state_dict"
                    and isinstance(callee, ast.Attribute)
                    and ctx.segment(callee.value) == model_text
                ):
                    return True
        elif isinstance(node, ast.Call):
            func = node.func
            logs = (isinstance(func, ast.Name) and func.id == "print") or (
                isinstance(func, ast.Attribute) and func.attr in _LOG_METHODS
            )
            if logs:
                for sub in ctx.walk(node):
                    if isinstance(sub, ast.Name) and sub.id == name:
                        return True
    return False


# Loaders whose result is a file's contents (a checkpoint or pretrained weights), by the
# qualified name the file's imports give them.
_FILE_LOADERS = frozenset(
    {
        "torch.load",
        "torch.hub.load_state_dict_from_url",
        "torch.utils.model_zoo.load_url",
        "safetensors.torch.load_file",
        "safetensors.torch.load",
        "safetorch.load",
        "torch.jit.load",
    }
)
# Calls that hand back (part of) the dict they are called on.
_DICT_VIEWS = frozenset({"get", "pop", "copy", "items", "values", "setdefault"})


def _is_file_loader(ctx: Context, call: ast.Call, model_text: str) -> bool:
    """A checkpoint loader: ``torch.load``, ``torch.jit.load``, ``load_state_dict_from_url``,
    safetensors' ``load_file``, safetorch's loader, or a function of the project whose name
    says it loads (not another framework's: :func:`_other_framework`)."""
    qualname = ctx.qualname(call.func)
    if qualname in _FILE_LOADERS:
        return True
    name = call_name(call.func).rsplit(".", 1)[-1]
    return "load" in name.lower() and name != "load_state_dict" and not _other_framework(qualname)


def _other_framework(qualname: Optional[str]) -> bool:
    """A name another deep-learning framework defines (``megengine.load``): its modules
    are not torch's, and its ``load_state_dict`` is not torch's either."""
    return qualname is not None and qualname.split(".", 1)[0] in _OTHER_FRAMEWORKS


def _is_made_in_memory(ctx: Context, call: ast.Call, model_text: str) -> bool:
    """State made by a live model, not read from a file: a module's ``state_dict()`` or
    parameters, a call given the loading model itself (its own buffers, all-reduced), or
    another framework's loader (``megengine.load``: not a torch module)."""
    func = call.func
    if isinstance(func, ast.Attribute) and func.attr in _MODULE_STATE:
        return True
    if any(ctx.segment(a) == model_text for a in call.args):
        return True
    return _other_framework(ctx.qualname(func))


_MODULE_STATE = frozenset({"state_dict", "named_parameters", "named_buffers", "parameters"})
_OTHER_FRAMEWORKS = frozenset(
    {"megengine", "paddle", "jittor", "mindspore", "oneflow", "mxnet", "tensorflow", "keras"}
    | {"jax", "flax", "haiku", "chainer"}
)


def _traces(
    ctx: Context,
    scope: ast.AST,
    expr: Optional[ast.AST],
    source: Callable[[Context, ast.Call, str], bool],
    model_text: str,
    receivers: bool,
) -> bool:
    """Whether ``expr`` (the state dict a non-strict load takes) holds, or is read, filtered
    or converted from, what a ``source`` call in ``scope`` returns: through names,
    subscripts (keys and values stored), ``.get``/``.items()`` (with ``receivers``, any
    method's receiver: ``torch.load(p).state_dict()``), loops, comprehensions and calls
    given it. A work list, not recursion: a chain of thousands of names is followed."""
    seen: Set[int] = set()
    names: Set[str] = set()
    todo: List[Optional[ast.AST]] = [expr]
    modules: Set[int] = set()  # nodes reached as the module whose state_dict() is taken
    while todo:
        node = todo.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        module = id(node) in modules
        if isinstance(node, ast.Call):
            if source(ctx, node, model_text):
                return True
            func = node.func
            if module and call_name(func).rsplit(".", 1)[-1][:1].isupper():
                continue  # Net(depth=n, ...).state_dict(): its own weights, not its arguments
            if isinstance(func, ast.Attribute) and (receivers or func.attr in _DICT_VIEWS):
                todo.append(func.value)
                if module or func.attr in _MODULE_STATE:
                    modules.add(id(func.value))
            todo.extend(node.args)
            todo.extend(k.value for k in node.keywords)
        elif isinstance(node, (ast.Subscript, ast.Starred)):
            todo.append(node.value)
        elif isinstance(node, (ast.DictComp, ast.ListComp, ast.SetComp, ast.GeneratorExp)):
            todo.extend(g.iter for g in node.generators)
        elif isinstance(node, ast.IfExp):
            todo.extend((node.body, node.orelse))
        elif isinstance(node, ast.BoolOp):
            todo.extend(node.values)
        elif isinstance(node, ast.Dict):
            todo.extend(node.values)
        elif isinstance(node, (ast.Tuple, ast.List)):
            todo.extend(node.elts)
        elif isinstance(node, ast.Name) and node.id not in names:
            names.add(node.id)
            bound = _values_bound(ctx, scope, node.id)
            if module:
                modules.update(id(v) for v in bound)
            todo.extend(bound)
    return False


def _values_bound(ctx: Context, scope: ast.AST, name: str) -> List[ast.AST]:
    """What ``name`` is given in ``scope``: assigned values, the iterables of the loops and
    comprehensions that bind it, keys and values stored into it (``name[k] = v``) or merged
    into it (``name.update(v)``), and what a ``with`` binds it to. The scope is indexed once
    (:func:`_bindings`): a trace asks for every name it meets, twice per finding."""
    return _bindings(ctx, scope).get(name, [])


def _bindings(ctx: Context, scope: ast.AST) -> Dict[str, List[ast.AST]]:
    """name -> what :func:`_values_bound` returns for it, for every name of ``scope``
    (cached on the file's context)."""
    key = f"ST012-bindings-{id(scope)}"
    found: Optional[Dict[str, List[ast.AST]]] = ctx.cache.get(key)
    if found is not None:
        return found
    found = {}

    def bind(target: ast.AST, value: ast.AST) -> None:
        for name in {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}:
            found.setdefault(name, []).append(value)

    for node in ctx.walk(scope):
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            value = node.value
            for target in targets:
                if value is None:  # x: Dict[str, Tensor] declares, binds nothing
                    continue
                if not isinstance(target, ast.Subscript):
                    bind(target, value)
                elif isinstance(target.value, ast.Name):
                    stored = found.setdefault(target.value.id, [])
                    stored += [target.slice, value]  # the keys stored, then the values
        elif isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
            bind(node.target, node.iter)
        elif isinstance(node, ast.withitem) and node.optional_vars is not None:
            bind(node.optional_vars, node.context_expr)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "update"
            and isinstance(node.func.value, ast.Name)
        ):
            found.setdefault(node.func.value.id, []).extend(node.args)
    ctx.cache[key] = found
    return found


_LOAD_STATE_DICT_ARGS = ("state_dict", "strict", "assign")


def _fallback_after_a_strict_load(ctx: Context, call: ast.Call) -> bool:
    """The non-strict load is the fallback of a strict one that raised: it sits in an
    ``except`` handler for the error a mismatch raises (``RuntimeError``, ``Exception`` or a
    bare ``except``; not ``OSError``, a file that is not there) that reads the error it
    caught (whose message lists the missing and unexpected keys), and the ``try`` body
    loads the same state dict (the same expression) into the same module, strictly."""
    if not isinstance(call.func, ast.Attribute) or not call.args:
        return False
    model_text = ctx.segment(call.func.value)
    loaded_text = ctx.segment(call.args[0])
    for node in ctx.walk(ctx.scope):
        if not isinstance(node, ast.Try):
            continue
        handler = next((h for h in node.handlers if call in ctx.walk(h)), None)
        if handler is None or not handler.name or not _catches_a_mismatch(handler):
            continue
        reads_error = any(
            isinstance(n, ast.Name) and n.id == handler.name and isinstance(n.ctx, ast.Load)
            for n in ctx.walk(handler)
        )
        strict_load = any(
            isinstance(n, ast.Call)
            and isinstance(n.func, ast.Attribute)
            and n.func.attr == "load_state_dict"
            and ctx.segment(n.func.value) == model_text
            and bool(n.args)
            and ctx.segment(n.args[0]) == loaded_text
            and all(k.arg != "strict" or is_const(k.value, True) for k in n.keywords)
            and (len(n.args) < 2 or is_const(n.args[1], True))
            for stmt in node.body
            for n in ctx.walk(stmt)
        )
        if reads_error and strict_load:
            return True
    return False


def _catches_a_mismatch(handler: ast.ExceptHandler) -> bool:
    """An ``except`` clause that catches the ``RuntimeError`` a strict load raises."""
    if handler.type is None:
        return True
    kinds = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any(call_name(k) in ("RuntimeError", "Exception", "BaseException") for k in kinds)


class DiscardedNonStrictLoad(Rule):
    """ST012: ``model.load_state_dict(sd, strict=False)`` with its result thrown away.

    With ``strict=False`` mismatching keys are not errors: they are only returned, as
    ``missing_keys`` and ``unexpected_keys``. Discarding the result means a checkpoint that
    matches nothing (say, every key prefixed with ``module.``) loads silently and the model
    keeps its random weights.

    It reports on evidence that the state dict may not match the model: it is read from a
    file (``torch.load``, ``torch.jit.load``, ``load_state_dict_from_url``, safetensors'
    ``load_file``, a function of the project whose name says it loads; also a module read
    from one, ``torch.load(p).state_dict()``), or it is passed in by a caller (``def
    restore(model, sd)``: nothing shows where it came from). Quiet where a live model made
    it and no file did: another model's ``state_dict()`` (a training model's weights into
    its deploy twin), a call given the loading module itself (its own buffers,
    all-reduced), a dict built key by key from the model's own keys, the state dict of a
    model built in memory (``twin.state_dict()``, whatever its constructor was given); quiet
    where it is not
    torch's ``load_state_dict`` (another framework's loader such as ``megengine.load``, a
    keyword torch's method does not take: ``precision=``, ``device=``), and for the
    fallback of a strict load of the same state dict into the same module, in the
    ``except RuntimeError`` (or ``Exception``) handler that reads the error it caught
    (whose message lists the keys).

    Quiet when the result is used, and when the code already handles mismatches: the state
    dict was filtered against the model (a dict comprehension with ``if``,
    ``intersect_dicts(...)``, a dict built key by key under a test in a loop, or after an
    ``if k not in own: continue`` against the model's own state dict), it is the
    model's own ``state_dict()`` updated with some entries, the code compares its keys with
    the model's (``k not in model_sd``, ``set(sd) - set(model.state_dict())``; also through
    names, and after the load, where it prints or tests the difference), it is built key by
    key over the model's own ``state_dict()`` (``for k, v in own.items(): sd[k] = ...``: no
    key of the model is left out), an ``assert`` (or a test that raises) compares the model's
    own keys with what is loaded, itself or in a
    function of the same file it passes both to before the load (``check_keys(model,
    sd)`` whose body compares ``sd``'s keys with ``model.state_dict()``'s and asserts, tests,
    raises or prints on the difference), or it logs what it loaded
    (``len(sd)`` in a print or logger call). Quiet with ``assign=True`` too (loading onto
    meta tensors): a key left out stays on the meta device and fails at first use.

    Fix (manual): check the returned keys, or use ``st.load_state_dict``, whose
    ``LoadReport`` says what matched and fails when nothing did.

    On the labelled corpus (``benchmarks/check_corpus``): 51 of 51 findings right on the
    held-out half (the sixteenth batch's, chosen for it and labelled once after the rule was
    frozen; the eleventh to fifteenth batches' were read to rewrite it), at the 97% bar: a
    default rule.

    safetorch: ``st.load_state_dict``.
    """

    code = "ST012"

    # Default again at stop 55 (issue 33): 8 of 8 on the eleventh batch's held-out half;
    # preview at stop 57 (the fourteenth batch: 94.6% of 37), rewritten twice on read
    # findings; default again at stop 58: 51 of 51 on the sixteenth batch's held-out half.
    preview = False
    name = "discarded-nonstrict-load"
    torch_symbols = ("torch.nn.Module.load_state_dict",)
    node_types = (ast.Expr,)

    def visit(self, node: ast.Expr) -> None:
        call = node.value
        if not (
            isinstance(call, ast.Call)
            and isinstance(call.func, ast.Attribute)
            and call.func.attr == "load_state_dict"
        ):
            return
        strict = find_keyword(call, "strict")
        value = (
            strict.value if strict is not None else (call.args[1] if len(call.args) > 1 else None)
        )
        if not is_const(value, False):
            return
        if is_const(getattr(find_keyword(call, "assign"), "value", None), True):
            # assign=True onto meta tensors: a key left out stays on meta and fails at first
            # use, and an extra one fails where the code looks it up: not silent.
            return
        if any(k.arg not in (None, *_LOAD_STATE_DICT_ARGS) for k in call.keywords):
            return  # precision=, device=: the project's own load_state_dict, not torch's
        if _fallback_after_a_strict_load(self.ctx, call):
            return
        root = _root_name(call.func.value)
        scope = self.ctx.scope
        own = frozenset(_own_state_names(self.ctx, scope, root)) if root else frozenset()
        if _model_keys_asserted(self.ctx, scope, own):
            return  # the model's keys checked against what is loaded, before the load
        loaded = (
            call.args[0] if call.args else getattr(find_keyword(call, "state_dict"), "value", None)
        )
        if isinstance(loaded, ast.Name) and _filtered_or_own(
            self.ctx, scope, loaded.id, call.func.value, call, own
        ):
            return
        if isinstance(loaded, ast.DictComp) and any(g.ifs for g in loaded.generators):
            return
        model_text = self.ctx.segment(call.func.value)
        if _traces(
            self.ctx, scope, loaded, _is_made_in_memory, model_text, receivers=False
        ) and not _traces(self.ctx, scope, loaded, _is_file_loader, model_text, receivers=True):
            return  # made by a live model (its own keys, a twin's), not read from a file
        self.report(
            call,
            "load_state_dict(..., strict=False) discards the missing/unexpected keys it "
            "returns, so a mismatched checkpoint loads silently: check the result or use "
            "st.load_state_dict (returns a LoadReport)",
        )
