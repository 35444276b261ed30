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
from typing import List, Optional, Sequence, Tuple

from safetorch.check.engine import UNSAFE, Context, Edit, Fix
from safetorch.check.fixer import import_edit, parents
from safetorch.check.rules import _load_flow as flow
from safetorch.check.rules._helpers import call_arg, find_keyword, has_double_star, has_star

__all__ = ["NUMPY_ALLOW", "allow_list_fix", "state_dict_fix"]

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
    for node in ctx.walk(scope):
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1):
            continue
        target = node.targets[0]
        if not (isinstance(target, ast.Name) and target.id == name):
            continue
        where = (node.lineno, node.col_offset)
        if ctx.end(node) > (load.lineno, load.col_offset) or where < last[0]:
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


def _other_loads(ctx: Context, load: ast.Call) -> List[str]:
    """``path:line`` of the loads elsewhere in the project that may read the file ``load``
    reads (by path shape)."""
    shape = flow.load_shape(ctx, load)
    if shape is None:
        return ["(a load whose path is not visible)"]
    here = ctx.project.relpath(ctx.path)
    out: List[str] = []
    for path, shapes in ctx.project_facts("ST003-load-shapes", _load_shapes).items():
        for line, other in shapes:
            if (path, line) != (here, load.lineno) and flow.may_match(shape, other):
                out.append(f"{path}:{line}")
    return out


def _load_shapes(tree: ast.Module, relpath: str) -> List[Tuple[int, flow.Shape]]:
    """(line, path shape) of every ``torch.load`` of one file (a ``project_facts`` gather)."""
    ctx = flow._resolver(relpath, tree)
    file = flow._File(tree, relpath)
    out: List[Tuple[int, flow.Shape]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and ctx.qualname(node.func) == "torch.load":
            path = node.args[0] if node.args else find_keyword(node, "f")
            arg = path.value if isinstance(path, ast.keyword) else path
            if arg is not None and not isinstance(arg, ast.Starred):
                out.append((node.lineno, flow.shape_of(arg, file)))
    return out


def state_dict_fix(
    ctx: Context, load: ast.Call, saves: Sequence[ast.Call]
) -> Tuple[Optional[Fix], str]:
    """Both sides of a whole-module pair of this file as a state dict save and load (see the
    module docstring), or (None, why not)."""
    values = [_plain_save(s) for s in saves]
    if not saves or any(v is None for v in values):
        return None, "a save passes more than the module and the path"
    texts = {ctx.segment(v) for v in values if v is not None}
    statement = parents(ctx).get(id(load))
    target = statement.targets[0] if isinstance(statement, ast.Assign) else None
    if not (
        isinstance(statement, ast.Assign)
        and len(statement.targets) == 1
        and isinstance(target, ast.Name)
        and statement.value is load
    ):
        return None, "the loaded module is not assigned to a name"
    assert isinstance(target, ast.Name)
    if texts != {target.id}:
        return None, f"the saves write {', '.join(sorted(texts))}, the load binds {target.id}"
    for save in saves:  # each saves a module the file builds (Net(), not a state dict)
        if not _built_before(ctx, target.id, save, _scope_of(ctx, save)):
            return None, f"the save at line {save.lineno} may not write a module built here"
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
    edits: List[Edit] = [ctx.insert_after(v, ".state_dict()") for v in values if v is not None]
    seg = ctx.segment
    parts = [seg(a) for a in load.args] + [seg(k) for k in load.keywords if k.arg != "weights_only"]
    parts.append("weights_only=True")
    new = f"{target.id}.load_state_dict({seg(load.func)}({', '.join(parts)}))"
    edits.append(ctx.replace(statement, new))
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
