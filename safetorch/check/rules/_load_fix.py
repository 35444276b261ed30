"""ST003's migrations of a load ``weights_only=True`` would refuse, the way PyTorch recommends.

- A whole pickled module saved and loaded in one file (``torch.save(model, path)`` ...
  ``model = torch.load(path)`` where ``model`` is already built there): the save writes
  ``model.state_dict()`` and the load becomes ``model.load_state_dict(torch.load(path,
  weights_only=True))``, both sides in one fix, only where no other load of the project can
  read that file (it would get a state dict where it expects a module).
- A file whose writers (found in the project) put plain data in it besides tensors (an
  argparse Namespace, numpy arrays and scalars): ``st.load(path, allow=[...])`` with exactly
  those classes. ``torch.serialization.safe_globals`` does the same from torch 2.4 on only;
  ``st.load`` is weights-only with ``allow=`` on every torch safetorch supports.

Anything else is left unchanged, and the finding says why. No migration trusts a class for
where it is defined: the allow-list is the writer's evidence, spelled out in the fixed code.
"""

from __future__ import annotations

import ast
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

from safetorch.check.engine import UNSAFE, Context, Edit, Fix, end_position
from safetorch.check.fixer import import_edit, parents
from safetorch.check.rules import _load_flow as flow
from safetorch.check.rules import _receivers as receivers
from safetorch.check.rules._helpers import call_arg, find_keyword, has_double_star, has_star

__all__ = [
    "NUMPY_ALLOW",
    "allow_kinds",
    "allow_list_fix",
    "cross_file_load_fix",
    "migrate",
    "older_unpickler",
    "state_dict_takes_objects",
    "own_pickler",
    "protocol_saves",
    "module_save_fix",
    "plain_namespaces",
    "state_dict_fix",
    "writers_allow",
]

#: What a file of numpy arrays and scalars needs besides tensors, in numpy 2's spelling and
#: numpy 1's (a name the running numpy lacks allows nothing, so the list works with both).
NUMPY_ALLOW = (
    "numpy.ndarray",
    "numpy.dtype",
    "numpy._core.multiarray._reconstruct",
    "numpy._core.multiarray.scalar",
    "numpy.core.multiarray._reconstruct",
    "numpy.core.multiarray.scalar",
)
_NAMESPACE = "argparse.Namespace"
_ST_LOAD_KEYWORDS = frozenset({"f", "map_location", "mmap", "encoding"})


def _plain_save(save: ast.Call) -> Optional[ast.expr]:
    """The saved value of ``torch.save(value, path)`` with nothing else passed."""
    if has_star(save) or has_double_star(save) or len(save.args) != 2 or save.keywords:
        return None
    return save.args[0]


def _built_before(ctx: Context, name: str, load: ast.Call, scope: ast.AST) -> bool:
    """``name`` is bound in ``scope`` before ``load`` to a call of a class (``Net(...)``)."""
    last: Tuple[Tuple[int, int], bool] = ((0, 0), False)
    for node in ast.walk(scope):
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1):
            continue
        target = node.targets[0]
        if not (isinstance(target, ast.Name) and target.id == name):
            continue
        where = (node.lineno, node.col_offset)
        if end_position(node) > (load.lineno, load.col_offset) or where < last[0]:
            continue
        value = node.value
        func = value.func if isinstance(value, ast.Call) else None
        while isinstance(func, ast.Call):  # Net(...).to(device) and the like
            func = func.func
        if isinstance(func, ast.Attribute) and func.attr in ("to", "cuda", "cpu", "double"):
            inner = func.value
            func = inner.func if isinstance(inner, ast.Call) else None
        name_of = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
        last = (where, bool(name_of[:1].isupper()) and ctx.qualname(func or value) != "torch.load")
    return last[1]


class _Pairs(NamedTuple):
    """One file's whole-module loads and saves, for pairs across files (a ``project_facts``
    gather): (line, path shape, whether it can be migrated) for each ``torch.load`` (``name =
    torch.load(p)`` with ``name`` built before: ``load_state_dict`` can take its place) and
    each ``torch.save(name, p)`` of a module built in the same scope."""

    loads: List[Tuple[int, flow.Shape, bool]]
    saves: List[Tuple[int, flow.Shape, bool]]


def _pairs(tree: ast.Module, relpath: str) -> _Pairs:
    ctx = flow._resolver(relpath, tree)
    file = flow._File(tree, relpath)
    up = {id(c): n for n in ast.walk(tree) for c in ast.iter_child_nodes(n)}
    loads: List[Tuple[int, flow.Shape, bool]] = []
    saves: List[Tuple[int, flow.Shape, bool]] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        qual = ctx.qualname(node.func)
        if qual not in ("torch.load", "torch.save"):
            continue
        index = 0 if qual == "torch.load" else 1
        path = call_arg(node, index, "f")
        if path is None or isinstance(path, ast.Starred):
            continue
        shape = flow.shape_of(path, file)
        scope = _scope_in(up, node, tree)
        if qual == "torch.load":
            statement = up.get(id(node))
            target = statement.targets[0] if isinstance(statement, ast.Assign) else None
            ok = (
                isinstance(target, ast.Name)
                and len(getattr(statement, "targets", [])) == 1
                and _built_before(ctx, target.id, node, scope)
                and not has_star(node)
                and find_keyword(node, "pickle_module") is None
            )
            loads.append((node.lineno, shape, bool(ok)))
        else:
            value = _plain_save(node)
            ok = isinstance(value, ast.Name) and _built_before(ctx, value.id, node, scope)
            saves.append((node.lineno, shape, bool(ok)))
    return _Pairs(loads, saves)


def _scope_in(up: Dict[int, ast.AST], node: ast.AST, tree: ast.Module) -> ast.AST:
    current = up.get(id(node))
    while current is not None and not isinstance(current, (ast.FunctionDef, ast.AsyncFunctionDef)):
        current = up.get(id(current))
    return tree if current is None else current


def _matching(ctx: Context, shape: flow.Shape, kind: str) -> List[Tuple[str, int, bool]]:
    """(path, line, migratable) of every load (``kind`` "loads") or save ("saves") of the
    project whose path may be ``shape``."""
    found: List[Tuple[str, int, bool]] = []
    for path, facts in ctx.project_facts("ST003-module-pairs", _pairs).items():
        for line, other, ok in getattr(facts, kind):
            if flow.may_match(shape, other):
                found.append((path, line, ok))
    return found


def _other_loads(ctx: Context, load: ast.Call) -> List[str]:
    """``path:line`` of the loads elsewhere in the project that may read the file ``load``
    reads and cannot take a state dict (``name = torch.load(p)`` with ``name`` built)."""
    shape = flow.load_shape(ctx, load)
    if shape is None:
        return ["(a load whose path is not visible)"]
    here = ctx.project.relpath(ctx.path)
    return [
        f"{path}:{line}"
        for path, line, ok in _matching(ctx, shape, "loads")
        if (path, line) != (here, load.lineno) and not ok
    ]


def module_save_fix(ctx: Context, save: ast.Call) -> Optional[Tuple[Fix, str]]:
    """The save side of a whole-module pair across files: ``torch.save(model, p)`` ->
    ``torch.save(model.state_dict(), p)`` where every load of the project that may read ``p``
    is in another file and takes a state dict in its fix (:func:`cross_file_load_fix`), and
    every save of ``p`` saves a module built where it is saved; with the loads it pairs with."""
    value = _plain_save(save)
    path = call_arg(save, 1, "f")
    if not isinstance(value, ast.Name) or path is None or not _complete(ctx):
        return None
    shape = flow.shape_of(path, flow.file_of(ctx))
    if shape.exact is None and not shape.suffix.strip("./"):
        return None  # a path the checker cannot read can be any load's
    loads = _matching(ctx, shape, "loads")
    saves = _matching(ctx, shape, "saves")
    here = ctx.project.relpath(ctx.path)
    if not loads or not all(ok for _, _, ok in loads + saves):
        return None
    if any(p == here for p, _, _ in loads):
        return None  # a load of this file: its own fix writes both sides
    if not _built_before(ctx, value.id, save, _scope_of(ctx, save)):
        return None
    where = ", ".join(f"{p}:{line}" for p, line, _ in loads)
    fix = Fix(
        f"save {value.id}.state_dict() (the load at {where} becomes load_state_dict)",
        (ctx.insert_after(value, ".state_dict()"),),
        UNSAFE,
    )
    return fix, where


def cross_file_load_fix(ctx: Context, load: ast.Call) -> Tuple[Optional[Fix], str]:
    """The load side of a whole-module pair whose saves are all in other files (each gets
    :func:`module_save_fix`): ``model = torch.load(p)`` -> ``model.load_state_dict(
    torch.load(p, weights_only=True))``; (None, why not) otherwise."""
    shape = flow.load_shape(ctx, load)
    if shape is None or (shape.exact is None and not shape.suffix.strip("./")):
        return None, ""
    if not _complete(ctx):
        return None, ""
    here = ctx.project.relpath(ctx.path)
    saves = _matching(ctx, shape, "saves")
    if not saves or any(p == here for p, _, _ in saves):
        return None, ""
    if not all(ok for _, _, ok in saves):
        return None, "a save of the path may not write a module it builds"
    return _load_side(ctx, load, [])


def _complete(ctx: Context) -> bool:
    ctx.project.paths()
    return ctx.project.root is not None and ctx.project.complete


def _assignment(ctx: Context, load: ast.Call) -> Optional[Tuple[ast.Assign, ast.Name]]:
    """The statement ``name = <load>`` (one plain name target) and its ``name``, else None."""
    statement = parents(ctx).get(id(load))
    if not (isinstance(statement, ast.Assign) and statement.value is load):
        return None
    target = statement.targets[0]
    if len(statement.targets) != 1 or not isinstance(target, ast.Name):
        return None
    return statement, target


def state_dict_fix(
    ctx: Context, load: ast.Call, saves: Sequence[ast.Call]
) -> Tuple[Optional[Fix], str]:
    """Both sides of a whole-module pair of this file as a state dict save and load (see the
    module docstring), or (None, why not)."""
    values = [_plain_save(s) for s in saves]
    if not saves or any(v is None for v in values):
        return None, "a save passes more than the module and the path"
    texts = {ctx.segment(v) for v in values if v is not None}
    assigned = _assignment(ctx, load)
    if assigned is None:
        return None, "the loaded module is not assigned to a name"
    _, target = assigned
    if texts != {target.id}:
        return None, f"the saves write {', '.join(sorted(texts))}, the load binds {target.id}"
    for save in saves:  # each saves a module the file builds (Net(), not a state dict)
        if not _built_before(ctx, target.id, save, _scope_of(ctx, save)):
            return None, f"the save at line {save.lineno} may not write a module built here"
    return _load_side(ctx, load, [v for v in values if v is not None])


def _load_side(
    ctx: Context, load: ast.Call, saved: Sequence[ast.expr]
) -> Tuple[Optional[Fix], str]:
    """``name = torch.load(...)`` -> ``name.load_state_dict(torch.load(..., weights_only=True))``,
    with ``.state_dict()`` after each of ``saved`` (the saves of this file)."""
    assigned = _assignment(ctx, load)
    if assigned is None:
        return None, "the loaded module is not assigned to a name"
    statement, target = assigned
    scope = _scope_of(ctx, load)
    if not _built_before(ctx, target.id, load, scope):
        return None, f"{target.id} is not built before the load here (its class is not known)"
    if has_star(load) or len(load.args) > 2 or any(k.arg is None for k in load.keywords):
        return None, "the load passes *args or **kwargs"
    if find_keyword(load, "pickle_module") is not None:
        return None, "the load passes pickle_module"
    others = _other_loads(ctx, load)
    if others:
        return None, f"another load may read the file ({others[0]}) and expects the module"
    edits: List[Edit] = [ctx.insert_after(v, ".state_dict()") for v in saved]
    seg = ctx.segment
    parts = [seg(a) for a in load.args] + [seg(k) for k in load.keywords if k.arg != "weights_only"]
    parts.append("weights_only=True")
    new = f"{target.id}.load_state_dict({seg(load.func)}({', '.join(parts)}))"
    edits.append(ctx.replace(statement, new))
    message = f"load the state dict into {target.id} with {target.id}.load_state_dict"
    if saved:
        message = f"save {target.id}.state_dict() and load it with {target.id}.load_state_dict"
    return Fix(message, tuple(edits), UNSAFE), ""


def _scope_of(ctx: Context, node: ast.AST) -> ast.AST:
    up = parents(ctx)
    current = up.get(id(node))
    while current is not None and not isinstance(current, (ast.FunctionDef, ast.AsyncFunctionDef)):
        current = up.get(id(current))
    return ctx.tree if current is None else current


def allow_kinds(helds: Sequence[Optional[str]]) -> Optional[Tuple[str, ...]]:
    """The ``allow=`` entries for saves that write these (``Save.held`` phrases, None for
    weights only), or None where one writes something else or none writes plain data."""
    allow: List[str] = []
    for held in helds:
        if held is None:
            continue
        if held.startswith("an argparse Namespace (") and "vars(" not in held:
            if _NAMESPACE not in allow:
                allow.append(_NAMESPACE)
        elif held.startswith(("numpy data", "numpy scalars")):
            allow.extend(n for n in NUMPY_ALLOW if n not in allow)
        else:
            return None
    return tuple(allow) or None


def allow_list_fix(ctx: Context, load: ast.Call, allow: Sequence[str]) -> Optional[Fix]:
    """``st.load(<the load's arguments>, allow=[...])`` (``map_location="available"`` where
    the load passed none: torch.load's placement), or None where the load passes what
    ``st.load`` lacks (``pickle_module``, ``*args``, ``**kwargs``)."""
    if has_star(load) or has_double_star(load) or len(load.args) > 2:
        return None
    if any(k.arg not in _ST_LOAD_KEYWORDS | {"weights_only"} for k in load.keywords):
        return None
    names = import_edit(ctx, [("safetorch", "st")])
    if names is None:
        return None
    spelled, imports = names
    seg = ctx.segment
    parts = [seg(a) for a in load.args] + [seg(k) for k in load.keywords if k.arg != "weights_only"]
    if call_arg(load, 1, "map_location") is None:
        parts.append('map_location="available"')
    parts.append("allow=[" + ", ".join(repr(a).replace("'", '"') for a in allow) + "]")
    text = f"{spelled['safetorch']}.load({', '.join(parts)})"
    edits = (*imports, ctx.replace(load, text))
    kinds = (("argparse Namespace", _NAMESPACE), ("numpy data", "numpy.ndarray"))
    what = [word for word, name in kinds if name in allow]
    message = f"load with st.load, allowing exactly the {' and '.join(what)} its writers save"
    return Fix(message, edits, UNSAFE)


# argparse ``type=`` values whose results a weights-only load accepts inside a Namespace.
_PLAIN_TYPES = frozenset({"int", "float", "str", "bool"})


def plain_namespaces(ctx: Context) -> bool:
    """Every ``add_argument`` of the project gives plain values: ``type=`` int, float, str or
    bool (or none) and a literal ``default=`` (a ``type=Path`` or a ``default=Path(...)``
    puts a class in the Namespace the allow-list would not name)."""
    return all(ctx.project_facts("ST003-plain-args", _plain_arguments).values())


def _plain_arguments(tree: ast.Module, relpath: str) -> bool:
    for node in ast.walk(tree):
        if not (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("add_argument", "set_defaults")
        ):
            continue
        for kw in node.keywords:
            value = kw.value
            if kw.arg == "type" and not (isinstance(value, ast.Name) and value.id in _PLAIN_TYPES):
                return False
            if kw.arg in ("default", None) or node.func.attr == "set_defaults":
                if kw.arg is None or not _literal(value):
                    return False
    return True


def _literal(node: ast.AST) -> bool:
    try:
        ast.literal_eval(node)
    except ValueError:
        return False
    return True


def migrate(
    ctx: Context,
    load: ast.Call,
    kind: str,
    saves: Sequence[Tuple[ast.Call, Optional[str]]],
    external: bool,
) -> Tuple[Optional[Fix], str]:
    """The migration of a load that evidently holds ``kind`` (ST003's ``held``), given what
    each save of this file that writes its path holds (``saves``) and whether the file comes
    from elsewhere (``external``): a whole module saved and loaded here, both sides as a state
    dict (:func:`state_dict_fix`), saved in other files, the load side
    (:func:`cross_file_load_fix`); numpy data every writer of the project saves,
    ``st.load(..., allow=[...])``. (None, why not) otherwise."""
    if kind == "a whole module":
        if not saves:
            return cross_file_load_fix(ctx, load)  # the saves are elsewhere
        if any(h not in ("a whole module", None) for _, h in saves):
            return None, "a save of the path writes something else too"
        return state_dict_fix(ctx, load, [s for s, _ in saves])
    allow = writers_allow(ctx, load, external)
    return (None, "") if allow is None else (allow_list_fix(ctx, load, allow), "")


def writers_allow(ctx: Context, load: ast.Call, external: bool) -> Optional[Tuple[str, ...]]:
    """The ``allow=`` entries for the plain data (Namespace, numpy) the project's saves of
    the loaded path write, or None where one may write anything else, the file comes from
    elsewhere (``external``), the project is not read whole or no save is found."""
    ctx.project.paths()
    if external or not ctx.project.complete or flow.defines_extra_state(ctx):
        return None
    shape = flow.load_shape(ctx, load)
    if shape is None or (shape.exact is None and not shape.suffix.strip("./")):
        return None
    allow = allow_kinds([s.held for s in flow.candidates(ctx, load)])
    if allow is not None and _NAMESPACE in allow:
        return allow if plain_namespaces(ctx) else None
    return allow


# -- what torch's own weights-only unpickler refuses but st.load reads ------------------------
def own_pickler(tree: ast.Module, path: str) -> Optional[int]:
    """The first line of a file that writes torch's file format with its own pickler
    (``torch._C.PyTorchFileWriter``: an incremental or lazy saver), else None."""
    for node in ast.walk(tree):
        name = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", None)
        if name == "PyTorchFileWriter":
            return getattr(node, "lineno", None)
    return None


_OWN_STATE_METHODS = ("load_state_dict", "_load_from_state_dict", "set_extra_state")
_STATE_HOOKS = (
    "_register_state_dict_hook",
    "register_state_dict_pre_hook",
    "register_state_dict_post_hook",
    "_register_load_state_dict_pre_hook",
    "register_load_state_dict_pre_hook",
    "register_load_state_dict_post_hook",
)
# Packages whose module classes put objects in their state dicts (torch2trt's and
# torch_tensorrt.fx's TRTModule: a bytearray engine, from a state-dict hook).
_OBJECT_STATE_PACKAGES = ("torch2trt", "torch_tensorrt")


def state_dict_takes_objects(tree: ast.Module, path: str) -> Optional[Tuple[int, str]]:
    """(line, what) of the first thing in the file that lets a strict ``load_state_dict``
    take more than tensors, else None: a class with its own ``load_state_dict``,
    ``_load_from_state_dict`` or ``set_extra_state`` (an EMA or a meter: its state may hold
    floats), a state-dict hook registered, or an import of a package whose modules keep
    objects in their state dicts (torch2trt's ``TRTModule``: a ``bytearray``).

    >>> state_dict_takes_objects(ast.parse("from torch2trt import TRTModule"), "m.py")
    (1, 'the project imports torch2trt, whose modules keep objects in their state dicts')
    """
    found = takes_objects(tree, path)
    return min((line, what) for line, what, _cls in found) if found else None


def takes_objects(tree: ast.Module, path: str) -> List[Tuple[int, str, Optional[str]]]:
    """Every (line, what, class) of :func:`state_dict_takes_objects` in the file; ``class``
    names the class whose own ``load_state_dict`` it is (None for anything else: a
    ``_load_from_state_dict`` or ``set_extra_state`` runs for a submodule of any module that
    loads, a hook or an import for any module).

    >>> takes_objects(ast.parse("class E:\\n    def load_state_dict(self, sd): pass"), "m.py")
    [(2, 'a class of the project defines its own load_state_dict', 'E')]
    """
    found: List[Tuple[int, str, Optional[str]]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for stmt in node.body:  # ``from helpers import load_state_dict``: a method too
                if isinstance(stmt, (ast.Import, ast.ImportFrom)) and any(
                    (a.asname or a.name).split(".")[-1] in _OWN_STATE_METHODS for a in stmt.names
                ):
                    what = "a class of the project imports a state-loading method"
                    found.append((stmt.lineno, what, None))
            for item in ast.walk(node):  # also under an ``if`` of the class body, or async
                if (
                    isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
                    and item.name in _OWN_STATE_METHODS
                ):
                    own = node.name if item.name == "load_state_dict" else None
                    what = f"a class of the project defines its own {item.name}"
                    found.append((item.lineno, what, own))
        elif (
            isinstance(node, (ast.Name, ast.Attribute))
            and isinstance(node.ctx, ast.Store)
            and (node.id if isinstance(node, ast.Name) else node.attr) in _OWN_STATE_METHODS
        ) or (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "setattr"
            and len(node.args) > 1
            and isinstance(node.args[1], ast.Constant)
            and node.args[1].value in _OWN_STATE_METHODS
        ):
            # ``load_state_dict = other``, ``Net.load_state_dict = f``, ``setattr(...)``: not
            # a ``def`` of one class, so it may be any module's
            what = "the project assigns a state-loading method (" + ast.unparse(node)[:40] + ")"
            found.append((node.lineno, what, None))
        elif isinstance(node, ast.Attribute) and node.attr in _STATE_HOOKS:
            found.append(
                (node.lineno, f"the project registers a state-dict hook ({node.attr})", None)
            )
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
            )
            for name in names:
                if name.split(".")[0] in _OBJECT_STATE_PACKAGES and not getattr(node, "level", 0):
                    what = (
                        f"the project imports {name.split('.')[0]}, whose modules keep objects "
                        "in their state dicts"
                    )
                    found.append((node.lineno, what, None))
    return sorted(found, key=lambda t: (t[0], t[1]))


def _protocol(call: ast.Call) -> Optional[ast.expr]:
    """The ``pickle_protocol`` a save call passes: by keyword, 4th positional (``torch.save``'s
    order: obj, f, pickle_module, pickle_protocol) or in a ``**{...}`` literal."""
    for keyword in call.keywords:
        if keyword.arg == "pickle_protocol":
            return keyword.value
        if keyword.arg is None and isinstance(keyword.value, ast.Dict):
            for key, value in zip(keyword.value.keys, keyword.value.values):
                if isinstance(key, ast.Constant) and key.value == "pickle_protocol":
                    return value
    return call.args[3] if len(call.args) > 3 else None


def protocol_saves(tree: ast.Module, path: str) -> Dict[int, Tuple[str, bool]]:
    """line -> (the protocol as written, whether st.load reads it) for the ``save`` calls of a
    file (and ``partial(torch.save, ...)``, keyed by line 0: any save may be it) that pass a
    ``pickle_protocol`` other than a literal 2 (``torch.save``'s default). Protocol 3 writes
    ``bytes`` and 4+ frames, which torch's weights-only unpickler refuses (torch 2.13 too) and
    st.load reads; protocols 0 and 1 are read by no weights-only load, st.load's included."""
    found: Dict[int, Tuple[str, bool]] = {}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, (ast.Name, ast.Attribute))):
            continue
        name = node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id
        if name == "save":
            value = _protocol(node)
        elif name == "partial" and node.args and _names_save(node.args[0]):
            keyword = find_keyword(
                node, "pickle_protocol"
            )  # partial(torch.save, pickle_protocol=4)
            value = None if keyword is None else keyword.value
        else:
            continue
        if value is None:
            continue
        literal = value.value if isinstance(value, ast.Constant) else None
        if type(literal) is int and literal == 2:
            continue
        old = type(literal) is int and literal < 2
        found[0 if name == "partial" else node.lineno] = (ast.unparse(value), not old)
    return found


def _names_save(node: ast.expr) -> bool:
    """``torch.save``, ``save`` or ``st.save``: the function a ``partial`` wraps."""
    return (isinstance(node, ast.Attribute) and node.attr == "save") or (
        isinstance(node, ast.Name) and node.id == "save"
    )


def older_unpickler(
    ctx: Context, load: ast.Call, loaders: Optional[Sequence[ast.Call]]
) -> Optional[Tuple[str, bool]]:
    """Why ``weights_only=True`` on ``load`` may refuse a file the project's flow shows holds
    only plain data, and whether ``st.load`` (weights-only too) reads it: the project writes
    torch files with its own pickler, a save of that path passes a pickle protocol other than
    2, or the file may hold data an older torch's weights-only unpickler lacks (anything but
    a strict module state dict, whose ``loaders``, the strict ``load_state_dict`` calls it
    goes into, are given; a class of the project with its own ``load_state_dict`` (unless
    every loader's module is built from a class that neither has nor inherits one: nn.Module's
    own load takes only tensors, and calls no submodule's ``load_state_dict``), a
    ``_load_from_state_dict``, a state-dict hook or an import of torch2trt makes no load
    tensors-only: :func:`state_dict_takes_objects`; ``st.load`` reads what a module's own
    state keeps, not what a class's own ``load_state_dict`` may take: any object). None where
    ``weights_only=True`` reads it on every torch the finding concerns (before 2.6)."""
    for path, line in sorted(ctx.project_facts("ST003-own-pickler", own_pickler).items()):
        if line is not None:
            return (
                "may refuse it: the project writes torch files with its own pickler "
                f"({path}:{line}, PyTorchFileWriter)",
                True,
            )
    protocols = ctx.project_facts("ST003-protocol", protocol_saves)
    for path, lines in sorted(protocols.items()):
        if 0 in lines:  # partial(torch.save, pickle_protocol=...): any save of the project
            return _protocol_reason(path, 0, lines[0])
    for save in flow.candidates(ctx, load):
        found = protocols.get(save.path, {}).get(save.line)
        if found is not None:
            return _protocol_reason(save.path, save.line, found)
    if loaders is not None:
        own = ctx.project_facts("ST003-takes-objects", takes_objects)
        takes = sorted((p, found[0][:2]) for p, found in own.items() if found)
        if not takes:
            return None
        named = [cls for found in own.values() for _l, _w, cls in found]
        if all(named):
            owners = frozenset(c for c in named if c)
            # Only classes' own load_state_dict: it runs for a module of that class alone.
            if receivers.receiver_classes(ctx, loaders, owners) is not None:
                return None
        # A class's own load_state_dict anywhere decides (no fix); else the first thing found.
        where = next((t for t in takes if t[1][1].endswith("its own load_state_dict")), takes[0])
        path, (line, what) = where
        # st.load reads the plain data a module's own state keeps (a TRTModule's bytearray, a
        # hook's bytes or floats); a class's own load_state_dict (a trainer's, not a
        # module's) may take any object from its dict (a whole module: CORL's Scalar), which
        # st.load refuses as well: no fix then.
        readable = not what.endswith("its own load_state_dict")
        return (
            f"may refuse it: {what} ({path}:{line}), so a strict load_state_dict may take "
            "more than tensors",
            readable,
        )
    return (
        "refuses plain data some torch releases before 2.6 cannot read weights-only (a float "
        "on 1.13; a torch.device, set, complex or bytes on 2.1)",
        True,
    )


def _protocol_reason(path: str, line: int, found: Tuple[str, bool]) -> Tuple[str, bool]:
    protocol, readable = found
    where = f"{path}:{line}" if line else f"{path} (a partial of torch.save)"
    if readable:
        return (
            f"refuses it: {where} saves with pickle_protocol={protocol}, not torch.save's "
            "default 2 (protocol 3's bytes and 4's frames are refused)",
            True,
        )
    return (
        f"refuses it: {where} saves with pickle_protocol={protocol}, which no weights-only "
        "load reads (st.load's neither): save with torch.save's default protocol 2",
        False,
    )
