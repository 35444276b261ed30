"""Which class the module of a ``module.load_state_dict(...)`` call is built from (ST003).

A class of the project with its own ``load_state_dict`` may take any object from the dict it
is given, so ST003 withholds its ``weights_only=True`` fix from a load whose dict may reach
one. ``nn.Module.load_state_dict`` runs no submodule's ``load_state_dict``: only the module
the call is made on matters. This module answers, strictly, which classes that module may be
an instance of; anything it cannot prove gives None ("unknown"), and the fix stays withheld.

Proof, by name across the project:

- the receiver is a plain name of one function (or of the module), every binding of it there
  an assignment (no loop, ``with``, import, ``global``/``nonlocal``, match capture, lambda
  parameter or parameter), each a call of a class, moved or not (``Net(...).to(device)``),
  or the module itself moved (``model = model.half()``);
- that class is ``torch.nn.<Class>``, or a class the project defines (under that name only:
  no assignment, function or aliased import binds the name anywhere in the project) whose
  bases are each ``torch.nn.<Class>`` or such a class, and which neither defines nor
  inherits its own ``load_state_dict``.
"""

from __future__ import annotations

import ast
from typing import Dict, FrozenSet, List, Optional, Sequence, Set, Tuple

from safetorch.check.engine import Context, dotted_name
from safetorch.check.rules._helpers import FUNCTION_DEFS, end_of, own_nodes, start_of, var_key
from safetorch.check.rules._payloads import payloads

__all__ = ["file_classes", "receiver_classes"]

# Module methods that return the module itself: ``Net().to(device).eval()`` is a ``Net``.
_RETURNS_SELF = frozenset(
    {"to", "cuda", "cpu", "eval", "train", "float", "half", "double", "bfloat16"}
    | {"requires_grad_", "to_empty"}
)
_UNKNOWN = "?"
_DYNAMIC = "<setattr>"  # the project sets attributes by computed names: no class is proven

# One file's classes: name -> the resolved bases of each definition ("torch.nn.X", a class
# name of the project, or "?"); and the names the file binds otherwise.
FileClasses = Tuple[Dict[str, List[Tuple[str, ...]]], FrozenSet[str]]


def _captured(node: ast.AST) -> List[str]:
    """The name an ``except ... as e`` or a match pattern (``case Net() as m``, ``case [*m]``,
    ``case {**m}``) binds, if any."""
    if type(node).__name__ in ("ExceptHandler", "MatchAs", "MatchStar"):
        name = getattr(node, "name", None)
    elif type(node).__name__ == "MatchMapping":
        name = getattr(node, "rest", None)
    else:
        return []
    return [name] if isinstance(name, str) else []


def _imports(tree: ast.Module) -> Dict[str, str]:
    found: Dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    found[alias.asname] = alias.name
                else:
                    root = alias.name.split(".")[0]
                    found[root] = root
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                found[alias.asname or alias.name] = f"{node.module or ''}.{alias.name}"
    return found


def _torch_class(dotted: str) -> bool:
    """``torch.nn.Linear``: a class torch itself defines, directly under ``torch.nn``."""
    parts = dotted.split(".")
    return len(parts) == 3 and parts[:2] == ["torch", "nn"] and parts[2][:1].isupper()


def file_classes(tree: ast.Module, path: str) -> FileClasses:
    """The file's classes with their bases resolved through its imports, and every name the
    file binds other than by a ``class`` statement or an import under the class's own name
    (an assignment anywhere, a function, an aliased import, a loop or ``with`` target, a
    match capture): such a name may be any class.

    >>> classes, other = file_classes(ast.parse(
    ...     "import torch.nn as nn\\nfrom nets import Speaker as Base\\n"
    ...     "class A(nn.Module): pass\\nclass B(Base): pass\\nAlias = A"), "m.py")
    >>> classes, sorted(other)
    ({'A': [('torch.nn.Module',)], 'B': [('Speaker',)]}, ['Alias', 'Base'])
    """
    imports = _imports(tree)
    defined = {n.name for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}
    classes: Dict[str, List[Tuple[str, ...]]] = {}
    other: Set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            # A metaclass or a decorator may give the class anything, and a class of its own
            # ``to``/``cuda``/... may return another module: unknown.
            own = {
                item.name
                for item in node.body
                if isinstance(item, FUNCTION_DEFS) and item.name in _RETURNS_SELF
            }
            bases = [_UNKNOWN] if node.keywords or node.decorator_list or own else []
            for base in node.bases:
                dotted = dotted_name(base, imports, local="local:")
                if dotted is None:
                    bases.append(_UNKNOWN)
                elif dotted in ("torch.nn.Module", "torch.nn.modules.module.Module"):
                    bases.append("torch.nn.Module")
                elif _torch_class(dotted):
                    bases.append(dotted)
                elif dotted.startswith("local:"):
                    name = dotted[len("local:") :]
                    bases.append(name if name in defined and "." not in name else _UNKNOWN)
                elif dotted.split(".")[0] in ("torch", ""):
                    bases.append(_UNKNOWN)
                else:
                    bases.append(dotted.split(".")[-1])  # a class of the project, or unknown
            classes.setdefault(node.name, []).append(tuple(bases))
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            other.add(node.id)
        elif isinstance(node, ast.arg):
            other.add(node.arg)  # def build(Vocoder): ... Vocoder() is whatever is passed
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Store)
            and var_key(node) is None
        ):
            other.add(node.attr)  # nets.Vocoder = nets.SpeakerNet (not self.x)
        elif isinstance(node, FUNCTION_DEFS):
            other.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if alias.asname and alias.asname != alias.name.split(".")[-1]:
                    other.add(alias.asname)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            other.update(node.names)
        elif _captured(node):
            other.update(_captured(node))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "setattr"
            and not (len(node.args) > 1 and isinstance(node.args[1], ast.Constant))
        ):
            other.add(_DYNAMIC)  # setattr(obj, name, ...): any method of any class
    return classes, frozenset(other)


def _clean_classes(ctx: Context, owners: FrozenSet[str]) -> Set[str]:
    """The project's classes that provably neither define nor inherit their own
    ``load_state_dict``: every definition of the name has only ``torch.nn`` bases or clean
    classes of the project, and nothing else binds the name."""
    key = "ST003-clean-classes:" + ",".join(sorted(owners))
    cached = ctx.cache.get(key)
    if cached is not None:
        return cached
    classes: Dict[str, List[Tuple[str, ...]]] = {}
    other: Set[str] = set()
    for per_file, names in ctx.project_facts("ST003-file-classes", file_classes).values():
        for name, bases in per_file.items():
            classes.setdefault(name, []).extend(bases)
        other |= names
    clean: Set[str] = set()
    grew = _DYNAMIC not in other
    while grew:  # a class is clean once all its project bases are
        grew = False
        for name, definitions in classes.items():
            if name in clean or name in owners or name in other:
                continue
            if all(
                base.startswith("torch.nn.") or base in clean
                for bases in definitions
                for base in bases
            ):
                clean.add(name)
                grew = True
    ctx.cache[key] = clean
    return clean


class _Scope:
    """One function's (or the module's) bindings: name -> assigned values, and the names it
    binds any other way."""

    def __init__(self, scope: ast.AST) -> None:
        self.values: Dict[str, List[ast.expr]] = {}
        self.other: Set[str] = set()
        simple: Set[int] = set()
        nodes = list(own_nodes(scope))
        for node in nodes:
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    if isinstance(target, ast.Name):
                        self.values.setdefault(target.id, []).append(node.value)
                        simple.add(id(target))
        for node in nodes:
            if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
                if id(node) not in simple:
                    self.other.add(node.id)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                self.other.update((a.asname or a.name).split(".")[0] for a in node.names)
            elif _captured(node):
                self.other.update(_captured(node))
        # the class bodies of the scope: a call there reads the class's own bindings
        self.classes = [n for n in nodes if isinstance(n, ast.ClassDef)]
        for node in nodes:
            if isinstance(node, (*FUNCTION_DEFS, ast.ClassDef)):
                self.other.add(node.name)
        if isinstance(scope, FUNCTION_DEFS):
            self.other.update(a.arg for a in ast.walk(scope.args) if isinstance(a, ast.arg))


def _file_index(ctx: Context) -> Tuple[Set[str], List[ast.Lambda]]:
    cached = ctx.cache.get("ST003-receiver-index")
    if cached is None:
        declared: Set[str] = set()
        lambdas: List[ast.Lambda] = []
        for node in ctx.walk(ctx.tree):
            if isinstance(node, (ast.Global, ast.Nonlocal)):
                declared.update(node.names)
            elif isinstance(node, ast.Lambda):
                lambdas.append(node)
        cached = ctx.cache["ST003-receiver-index"] = (declared, lambdas)
    return cached


def _scope(ctx: Context, scope: ast.AST) -> _Scope:
    key = "ST003-scope-" + str(id(scope))
    found = ctx.cache.get(key)
    if found is None:
        found = ctx.cache[key] = _Scope(scope)
    return found


def _class_of(ctx: Context, value: ast.expr, clean: Set[str]) -> Optional[str]:
    """The class ``value`` (a call) builds, when it is ``torch.nn.<Class>`` or a clean
    class of the project, else None."""
    if not isinstance(value, ast.Call) or not isinstance(value.func, (ast.Name, ast.Attribute)):
        return None
    qual = ctx.qualname(value.func)
    if qual is not None and _torch_class(qual):
        return qual
    if isinstance(value.func, ast.Name):
        name = value.func.id if qual is None else qual.split(".")[-1]
    elif qual is not None and not qual.startswith("torch."):
        name = qual.split(".")[-1]  # nets.Vocoder(...) through ``import nets``
    else:
        return None
    return name if name in clean else None


def receiver_classes(
    ctx: Context, loaders: Sequence[ast.Call], owners: FrozenSet[str]
) -> Optional[FrozenSet[str]]:
    """The classes the modules of ``loaders`` (``module.load_state_dict(...)`` calls) are
    built from, each ``torch.nn.<Class>`` or a class of the project that provably has no own
    ``load_state_dict`` (``owners``: the classes that define one); None where any is not
    proven (see the module's docstring)."""
    clean = _clean_classes(ctx, owners)
    declared, lambdas = _file_index(ctx)
    found: Set[str] = set()
    for call in loaders:
        receiver = call.func.value if isinstance(call.func, ast.Attribute) else None
        if not isinstance(receiver, ast.Name) or receiver.id in declared:
            return None
        key = receiver.id
        if any(
            key in {a.arg for a in ast.walk(lam.args) if isinstance(a, ast.arg)}
            and lam.lineno <= call.lineno <= (lam.end_lineno or lam.lineno)
            for lam in lambdas
        ):
            return None
        bindings = _scope(ctx, payloads(ctx).call_scope.get(id(call), ctx.tree))
        if any(start_of(c) <= start_of(call) <= end_of(c) for c in bindings.classes):
            return None  # in a class body: its own bindings, which this does not read
        values = bindings.values.get(key, [])
        if key in bindings.other or not values:
            return None
        for value in values:
            while (
                isinstance(value, ast.Call)
                and isinstance(value.func, ast.Attribute)
                and value.func.attr in _RETURNS_SELF
            ):
                value = value.func.value
            if var_key(value) == key:
                continue  # model = model.half().to(device): the same module
            cls = _class_of(ctx, value, clean)
            if cls is None:
                return None
            found.add(cls)
    return frozenset(found)
