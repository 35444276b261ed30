"""Where a ``torch.load``'s file is written, read from every file of the project: the evidence
ST003's ``weights_only=True`` fix and ST004's device advice depend on.

Every ``torch.save`` (and ``st.save``) of the project is read once per process into a
:class:`Save`: the shape of the path it writes, whether what it writes is only what a
weights-only load accepts (tensors, state dicts, containers and numbers of those) or why it
may not be (a whole module, an argparse Namespace, an optimizer object, a value the checker
cannot tell), and whether its tensors are evidently on the CPU. A saved value that is a
parameter of the function around the save is followed to that function's callers in the
project (one level). ``accelerator.save``, ``fabric.save`` and ``xm.save`` are
``torch.save`` under another name and count as saves; a library's own saver (a trainer's
checkpoint handler) writes files the checker cannot see into.

Standard library only, like the rest of ``safetorch.check``.

>>> import ast
>>> tree = ast.parse("import torch\\ntorch.save(model.state_dict(), 'w.pt')\\n")
>>> [(s.line, s.shape.exact, s.held) for s in gather_saves(tree, "train.py")]
[(2, 'w.pt', None)]
"""

from __future__ import annotations

import ast
import os
import re
from dataclasses import dataclass
from typing import (
    AbstractSet,
    Callable,
    Dict,
    FrozenSet,
    Iterable,
    List,
    Optional,
    Sequence,
    Set,
    Tuple,
    Union,
)

from safetorch.check.engine import Context
from safetorch.check.rules import _helpers

__all__ = [
    "EVIDENT",
    "CallFact",
    "Param",
    "Save",
    "Shape",
    "Why",
    "candidates",
    "defines_extra_state",
    "extra_state",
    "file_of",
    "gather_calls",
    "gather_saves",
    "is_test_file",
    "load_shape",
    "may_match",
    "project_saves",
    "shape_of",
    "weights_only_value",
]

_SAVES = frozenset({"torch.save", "safetorch.save"})
# Names of the builtins whose result is a number or a string whatever they are given.
_PRIMITIVE_CALLS = frozenset({"int", "float", "str", "bool", "len", "round", "repr", "hash"})
# Builtins whose result is made of their arguments.
_PASS_CALLS = frozenset({"max", "min", "sum", "abs", "sorted", "list", "tuple", "dict", "set"})
# Tensor methods that give a tensor (or a number) of a tensor.
_TENSOR_METHODS = frozenset(
    {"cpu", "detach", "clone", "half", "float", "double", "bfloat16", "contiguous", "to"}
    | {"item", "tolist", "numel", "size", "long", "int", "bool", "squeeze", "view", "reshape"}
    | {"copy", "keys", "values", "items", "state_dict"}
)
# Methods whose result is a Python number or list of numbers.
_SCALAR_METHODS = frozenset({"item", "tolist", "numel", "dim", "nelement", "size"})
# torch classes a weights-only load accepts.
_TORCH_DATA = frozenset(
    {"Tensor", "FloatTensor", "DoubleTensor", "HalfTensor", "BFloat16Tensor", "ByteTensor"}
    | {"CharTensor", "ShortTensor", "IntTensor", "LongTensor", "BoolTensor", "Size"}
    | {"device", "dtype"}
)
# Savers that are ``torch.save`` under another name: ``accelerator.save``, ``fabric.save``,
# ``xm.save`` (the receiver's last name holds one of these words).
_TORCH_SAVERS = ("accelerat", "fabric", "xm")
# torch submodules whose calls do not give tensors.
_TORCH_OBJECTS = ("torch.nn.", "torch.optim.", "torch.jit.", "torch.utils.", "torch.distributed.")
# Words of CUDA or a device: a file without any of them (and without ``.to(``) makes its
# tensors on the CPU.
_DEVICE_WORDS = ("cuda", "device", "gpu", "accelerator", "xla", "mps")
_TEST_DIRS = frozenset({"tests", "test", "testing", "test_utils", "unittests", "unit_tests"})
_DEPTH = 12
# The conversion after a ``%`` of a format string: ``d`` of ``%d.pth``, ``05d``, ``.3f``.
_CONVERSION = re.compile(r"^[-#0 +]*\d*(\.\d+)?[sdifgexXorc]")


@dataclass(frozen=True)
class Shape:
    """What is known of a path expression: the whole literal (``exact``), else its literal
    start and end (``prefix``, ``suffix``; ``""`` when unknown) and its source text."""

    exact: Optional[str]
    prefix: str
    suffix: str
    text: str


@dataclass(frozen=True)
class Why:
    """Why a saved value may hold more than weights (``what``), or the parameters of the
    function around the save it is made of (``params``: (function, index, name)), to be
    followed to the callers."""

    what: Optional[str] = None
    params: FrozenSet[Tuple[str, int, str]] = frozenset()

    def join(self, other: "Why") -> "Why":
        return Why(self.what or other.what, self.params | other.params)


_OK = Why()
#: The starts of ``Save.held`` phrases that say what a weights-only load refuses (the others
#: say the checker cannot tell).
EVIDENT = (
    "a whole module",
    "an instance of a class",
    "an argparse Namespace",
    "an optimizer",
    "numpy data",
    "an object (",
    "a file written with a custom pickle_module",
)


@dataclass(frozen=True)
class Save:
    """One save of the project.

    Attributes:
        path: The file it is in, relative to the project root.
        line: Its line.
        shape: The path it writes.
        held: None when it writes only what a weights-only load accepts, else what it may
            write that such a load refuses, as a phrase.
        params: Parameters of the function around it the value is made of (to follow).
        cpu: Whether its tensors are evidently on the CPU.
        function: The name of the function it is in ("" at module level).
        forwards: Whether it is ``torch.save(*args, **kwargs)`` in a wrapper of that name
            (followed only where the project calls the wrapper by its name alone).
    """

    path: str
    line: int
    shape: Shape
    held: Optional[str]
    params: FrozenSet[Tuple[str, int, str]]
    cpu: bool
    function: str
    forwards: bool = False


Scope = Union[ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda]


def _resolver(path: str, tree: ast.Module) -> Context:
    """The engine's name resolution for another file of the project: a Context holding every
    import statement of ``tree`` (nested ones included), for ``qualname`` and ``imports``."""
    ctx = Context(path, "", tree)
    for node in ast.walk(tree):
        ctx.add_imports(node)
    return ctx


def _imports(tree: ast.Module) -> Dict[str, str]:
    return _resolver("<project file>", tree).imports


class _File:
    """One file's tree with its imports and the assignments of each scope."""

    def __init__(self, tree: ast.Module, path: str) -> None:
        self.tree = tree
        self.path = path
        self._resolver = _resolver(path, tree)
        self.imports = self._resolver.imports
        self.parent: Dict[int, Scope] = {}  # id(node) -> innermost function (or module)
        self.class_of: Dict[int, bool] = {}  # id(function) -> defined in a class body
        self.class_body: Dict[int, bool] = {}  # id(statement) -> directly in a class body
        self._assigned: Dict[int, Dict[str, List[ast.AST]]] = {}
        self._index(tree, tree, False)
        self._device_free: Optional[bool] = None
        self._attribute_literals: Optional[Dict[str, List[str]]] = None

    def _index(self, node: ast.AST, scope: Scope, in_class: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                self.parent[id(child)] = scope
                self.class_of[id(child)] = in_class
                self._index(child, child, False)
            elif isinstance(child, ast.ClassDef):
                self.parent[id(child)] = scope
                for stmt in child.body:
                    self.class_body[id(stmt)] = True
                self._index(child, scope, True)
            else:
                self.parent[id(child)] = scope
                self._index(child, scope, in_class)

    def qual(self, node: ast.AST) -> Optional[str]:
        return self._resolver.qualname(node)

    def scope_of(self, node: ast.AST) -> Scope:
        return self.parent.get(id(node), self.tree)

    def assigned(self, scope: Scope) -> Dict[str, List[ast.AST]]:
        """name -> what each assignment in ``scope`` (not nested functions) binds it to: the
        value; ``ast.arg`` for a parameter; the ``For`` for a loop target; the ``With`` item
        or the except handler otherwise; values stored into it (``d[k] = v``,
        ``d.update(v)``) too."""
        found = self._assigned.get(id(scope))
        if found is not None:
            return found
        found = {}
        if not isinstance(scope, ast.Module):
            args = scope.args
            for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
                found.setdefault(arg.arg, []).append(arg)
            for star in (args.vararg, args.kwarg):
                if star is not None:
                    found.setdefault(star.arg, []).append(star)
        for node in ast.walk(scope):
            if node is not scope and self.scope_of(node) is not scope:
                continue
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    self._bind(found, target, node.value)
            elif isinstance(node, (ast.AnnAssign, ast.AugAssign)) and node.value is not None:
                self._bind(found, node.target, node.value)
            elif isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
                for name in _names(node.target):
                    found.setdefault(name, []).append(node)
            elif isinstance(node, ast.withitem) and node.optional_vars is not None:
                for name in _names(node.optional_vars):
                    found.setdefault(name, []).append(node)
            elif isinstance(node, ast.ExceptHandler) and node.name:
                found.setdefault(node.name, []).append(node)
            elif isinstance(node, ast.NamedExpr):
                self._bind(found, node.target, node.value)
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("update", "setdefault", "append", "extend")
                and isinstance(node.func.value, ast.Name)
            ):
                found.setdefault(node.func.value.id, []).extend([*node.args])
                found[node.func.value.id].extend(k.value for k in node.keywords)
        self._assigned[id(scope)] = found
        return found

    @staticmethod
    def _bind(found: Dict[str, List[ast.AST]], target: ast.AST, value: ast.expr) -> None:
        if isinstance(target, ast.Name):
            found.setdefault(target.id, []).append(value)
        elif isinstance(target, (ast.Tuple, ast.List)):
            for name in _names(target):
                part = ast.Subscript(value=value, slice=ast.Constant(0), ctx=ast.Load())
                found.setdefault(name, []).append(part)  # one part of it
        elif isinstance(target, ast.Subscript):
            root = target.value
            while isinstance(root, ast.Subscript):
                root = root.value
            if isinstance(root, ast.Name):
                found.setdefault(root.id, []).append(value)  # d[k] = v: v is in d

    def attribute_literals(self) -> Dict[str, List[str]]:
        """attribute name -> the string literals it is set to in this file (``self.x = "a"``,
        ``x = "a"`` in a class body), counted once per distinct literal; names set to
        anything else map to two entries (never one literal)."""
        if self._attribute_literals is None:
            found: Dict[str, List[str]] = {}
            for node in ast.walk(self.tree):
                if not isinstance(node, ast.Assign):
                    continue
                for target in node.targets:
                    name = target.attr if isinstance(target, ast.Attribute) else None
                    if name is None and isinstance(target, ast.Name):
                        if self.class_body.get(id(node)):
                            name = target.id
                    if name is None:
                        continue
                    value = _literal(node.value)
                    seen = found.setdefault(name, [])
                    if value is None:
                        seen.extend(["", ""])  # not a literal: never one
                    elif value not in seen:
                        seen.append(value)
            self._attribute_literals = found
        return self._attribute_literals

    def device_free(self) -> bool:
        """The file never names CUDA, a device or a move: its tensors are made on the CPU."""
        if self._device_free is None:
            words = set()
            for node in ast.walk(self.tree):
                if isinstance(node, ast.Attribute):
                    words.add(node.attr.lower())
                    if node.attr == "to":
                        words.add("device")  # x.to(...): a move
                elif isinstance(node, ast.Name):
                    words.add(node.id.lower())
                elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                    words.add(node.value.lower())
            self._device_free = not any(w in word for word in words for w in _DEVICE_WORDS)
        return self._device_free


def _names(target: ast.AST) -> List[str]:
    return [n.id for n in ast.walk(target) if isinstance(n, ast.Name)]


def _function_name(scope: Scope) -> str:
    return getattr(scope, "name", "")


# -- path shapes ------------------------------------------------------------------------------
def _literal(node: ast.AST) -> Optional[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return None


def shape_of(node: ast.AST, file: Optional["_File"] = None, depth: int = 0) -> Shape:
    """What is known of the path ``node`` names: a literal, a format string's literal ends,
    ``os.path.join``'s last part, ``Path / "name"``, ``open(path, "wb")``'s path, a local
    name assigned once.

    >>> shape_of(ast.parse("f'runs/{name}_best.pth'", mode="eval").body)
    Shape(exact=None, prefix='runs/', suffix='_best.pth', text="f'runs/{name}_best.pth'")
    """
    text = ast.unparse(node)
    unknown = Shape(None, "", "", text)
    if depth > _DEPTH:
        return unknown
    value = _literal(node)
    if value is not None:
        return Shape(os.path.normpath(value), value, value, text)
    if isinstance(node, ast.JoinedStr):
        parts = node.values
        return Shape(None, _lead(parts), _trail(parts), text)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left = shape_of(node.left, file, depth + 1)
        right = shape_of(node.right, file, depth + 1)
        if left.exact is not None and right.exact is not None:
            return Shape(left.prefix + right.prefix, left.prefix + right.prefix, right.suffix, text)
        prefix = left.prefix + right.prefix if left.exact is not None else left.prefix
        suffix = left.suffix + right.suffix if right.exact is not None else right.suffix
        return Shape(None, prefix, suffix, text)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
        template = _literal(node.left)
        if template is not None:
            head, _, _ = template.partition("%")
            tail = template.rsplit("%", 1)[1]
            return Shape(None, head, _CONVERSION.sub("", tail, count=1), text)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):  # pathlib
        right = shape_of(node.right, file, depth + 1)
        return Shape(None, "", right.suffix, text)
    if isinstance(node, ast.Call):
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr == "format":
            template = _literal(func.value)
            if template is not None:
                return Shape(None, template.split("{", 1)[0], template.rsplit("}", 1)[-1], text)
        if (isinstance(func, ast.Attribute) and func.attr == "join" and node.args) and (
            isinstance(func.value, ast.Attribute) and func.value.attr == "path"
        ):
            last = shape_of(node.args[-1], file, depth + 1)
            first = shape_of(node.args[0], file, depth + 1) if len(node.args) > 1 else last
            return Shape(None, first.prefix, last.suffix, text)
        if isinstance(func, ast.Name) and func.id in ("open", "Path", "str") and node.args:
            return shape_of(node.args[0], file, depth + 1)
    if isinstance(node, ast.Attribute) and file is not None:
        literals = file.attribute_literals().get(node.attr, [])
        if len(literals) == 1:  # self.training_file, set once to "train.pt"
            return Shape(os.path.normpath(literals[0]), literals[0], literals[0], text)
    if isinstance(node, ast.Name) and file is not None:
        values: List[ast.AST] = list(file.assigned(file.scope_of(node)).get(node.id, []))
        handles = [v for v in values if isinstance(v, ast.withitem)]
        if handles and len(handles) == len(values):
            # the handle of the nearest ``with open(path) as f:`` above
            above = [h for h in handles if h.context_expr.lineno <= getattr(node, "lineno", 0)]
            values = [max(above, key=lambda h: h.context_expr.lineno)] if above else []
        if len(values) == 1 and isinstance(values[0], (ast.expr, ast.withitem)):
            bound = values[0]
            # with open(path, "wb") as f: torch.save(x, f) writes path
            inner = shape_of(
                bound.context_expr if isinstance(bound, ast.withitem) else bound, file, depth + 1
            )
            return Shape(inner.exact, inner.prefix, inner.suffix, text)
    return unknown


def _lead(parts: Sequence[ast.expr]) -> str:
    out = ""
    for part in parts:
        value = _literal(part)
        if value is None:
            break
        out += value
    return out


def _trail(parts: Sequence[ast.expr]) -> str:
    out = ""
    for part in reversed(parts):
        value = _literal(part)
        if value is None:
            break
        out = value + out
    return out


def may_match(a: Shape, b: Shape) -> bool:
    """Whether paths of shapes ``a`` and ``b`` can name the same file: two literals only when
    equal; otherwise their known ends must agree.

    >>> lit = lambda s: shape_of(ast.Constant(s))
    >>> may_match(lit("a.pt"), lit("b.pt")), may_match(lit("a.pt"), Shape(None, "", "", "p"))
    (False, True)
    >>> may_match(lit("w/best.pth"), Shape(None, "", ".pkl", "f'{d}.pkl'"))
    False
    """
    if a.exact is not None and b.exact is not None:
        return a.exact == b.exact
    if not (a.prefix.startswith(b.prefix) or b.prefix.startswith(a.prefix)):
        return False
    return a.suffix.endswith(b.suffix) or b.suffix.endswith(a.suffix)


# -- what a value holds -----------------------------------------------------------------------
def weights_only_value(node: ast.AST, file: "_File", depth: int = 0) -> Why:
    """Whether ``node`` evidently holds only what a weights-only load accepts (``Why()``), the
    parameters it is made of, or why it may not (``Why(what=...)``).

    >>> f = _File(ast.parse("import torch\\nm = torch.nn.Linear(1, 1)\\n"), "m.py")
    >>> weights_only_value(ast.parse("{'w': m.state_dict(), 'epoch': 3}", mode="eval").body, f)
    Why(what=None, params=frozenset())
    >>> weights_only_value(ast.Name("m"), f).what
    'a whole module (`m = torch.nn.Linear(1, 1)`)'
    """
    if depth > _DEPTH:
        return Why(f"a value the checker cannot follow (`{_short(node)}`)")
    nxt = depth + 1
    if isinstance(node, ast.Constant):
        return _OK
    if isinstance(node, ast.JoinedStr):
        return _OK
    if isinstance(node, ast.Dict):
        return _all(
            [*(k for k in node.keys if k is not None), *node.values], file, nxt, keys=node.keys
        )
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return _all(node.elts, file, nxt)
    if isinstance(node, (ast.BinOp, ast.BoolOp, ast.Compare, ast.UnaryOp)):
        parts = [c for c in ast.iter_child_nodes(node) if isinstance(c, ast.expr)]
        return _all(parts, file, nxt)
    if isinstance(node, ast.IfExp):
        return _all([node.body, node.orelse], file, nxt)
    if isinstance(node, ast.Subscript):
        return weights_only_value(node.value, file, nxt)
    if isinstance(node, ast.Starred):
        return weights_only_value(node.value, file, nxt)
    if isinstance(node, (ast.DictComp, ast.ListComp, ast.GeneratorExp, ast.SetComp)):
        # The loop targets are bound to parts of the iterables: those must hold weights.
        why = _all([g.iter for g in node.generators], file, nxt)
        elts = [node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt]
        bound = {n for g in node.generators for n in _names(g.target)}
        return why.join(_all(elts, file, nxt, bound=bound))
    if isinstance(node, ast.Call):
        return _call_value(node, file, nxt)
    if isinstance(node, ast.Name):
        return _name_value(node, file, nxt)
    if isinstance(node, ast.Attribute):
        if node.attr == "__dict__":
            return Why(f"an object's attributes (`{_short(node)}`), of any type")
        if node.attr in ("data", "grad", "weight", "bias", "shape", "T"):
            return weights_only_value(node.value, file, nxt)
        return Why(f"an attribute the checker cannot tell holds only weights (`{_short(node)}`)")
    return Why(f"a value the checker cannot tell holds only weights (`{_short(node)}`)")


def _all(
    nodes: Iterable[Optional[ast.AST]],
    file: "_File",
    depth: int,
    keys: Optional[Sequence[Optional[ast.expr]]] = None,
    bound: AbstractSet[str] = frozenset(),
) -> Why:
    why = _OK
    for node in nodes:
        if node is None:
            continue
        if isinstance(node, ast.Name) and node.id in bound:
            continue
        if bound and _chain_root_name(node) in bound:
            continue  # v.cpu() of a loop target
        why = why.join(weights_only_value(node, file, depth))
        if why.what is not None:
            return why
    return why


def _chain_root_name(node: ast.AST) -> Optional[str]:
    while True:
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr not in _TENSOR_METHODS:
                return None
            node = node.func.value
        elif isinstance(node, (ast.Attribute, ast.Subscript)):
            node = node.value
        else:
            break
    return node.id if isinstance(node, ast.Name) else None


def _call_value(node: ast.Call, file: "_File", depth: int) -> Why:
    func = node.func
    qual = file.qual(func) or ""
    if isinstance(func, ast.Name) and func.id in _PRIMITIVE_CALLS and func.id not in file.imports:
        return _OK
    if isinstance(func, ast.Name) and func.id == "vars":
        return Why(f"an object's attributes (`{_short(node)}`), of any type")
    if isinstance(func, ast.Name) and func.id in _PASS_CALLS and func.id not in file.imports:
        return _all([*node.args, *(k.value for k in node.keywords)], file, depth)
    if qual in ("collections.OrderedDict", "copy.deepcopy", "copy.copy"):
        return _all([*node.args, *(k.value for k in node.keywords)], file, depth)
    if isinstance(func, ast.Attribute) and func.attr.endswith("state_dict"):
        # what every state_dict() gives (FSDP.full_optim_state_dict too): tensors, numbers
        # and containers of those
        return _OK
    if isinstance(func, ast.Attribute) and func.attr in _SCALAR_METHODS:
        return _OK  # x.item(), x.tolist(): Python numbers
    if qual.startswith(("numpy.", "np.")):
        return Why(f"numpy data (`{_short(node)}`)")
    if qual.split(".")[-1] in _TORCH_DATA:
        return _OK  # torch.FloatTensor(...), torch.Size(...), torch.device(...)
    if qual.startswith("torchvision.models."):
        return Why(f"a whole module (`{_short(node)}`)")
    if qual.startswith("torch.nn.functional."):
        return _OK  # F.interpolate(x): a tensor
    if qual.startswith(_TORCH_OBJECTS):
        return Why(_object_phrase(qual, node))
    if qual.startswith("torch.") and not qual.startswith("torch.nn.functional."):
        tail = qual.split(".")[-1]
        if tail[:1].isupper():
            return Why(f"an object (`{_short(node)}`)")
        return _OK  # torch.zeros(...), torch.cat(...): a tensor
    if isinstance(func, ast.Attribute):
        if func.attr in ("numpy",):
            return Why(f"numpy data (`{_short(node)}`)")
        if func.attr in _TENSOR_METHODS:
            return weights_only_value(func.value, file, depth)
        if func.attr == "parse_args":
            return Why(f"an argparse Namespace (`{_short(node)}`)")
    return Why(f"the result of `{_short(node.func)}(...)`, which the checker cannot tell")


def _object_phrase(qual: str, node: ast.AST) -> str:
    if qual.startswith("torch.optim."):
        return f"an optimizer or scheduler object (`{_short(node)}`: save its state_dict())"
    if qual.startswith("torch.nn."):
        return f"a whole module (`{_short(node)}`)"
    return f"an object (`{_short(node)}`)"


def _name_value(node: ast.Name, file: "_File", depth: int) -> Why:
    scope = file.scope_of(node)
    while True:
        values = file.assigned(scope).get(node.id)
        if values or isinstance(scope, ast.Module):
            break
        scope = file.scope_of(scope)  # a closure's free name: the enclosing function's
    if not values:
        if node.id in file.imports:
            return Why(f"an imported object (`{node.id}`)")
        return Why(f"`{node.id}`, which the checker cannot tell holds only weights")
    why = _OK
    for value in values:
        if isinstance(value, ast.arg):
            if isinstance(scope, ast.Module) or isinstance(scope, ast.Lambda):
                return Why(f"the parameter `{node.id}`, whose callers the checker cannot see")
            index = _param_index(scope, value, file)
            why = why.join(Why(params=frozenset({(_function_name(scope), index, node.id)})))
        elif isinstance(value, (ast.For, ast.AsyncFor, ast.comprehension)):
            why = why.join(_loop_value(value, file, depth))
        elif isinstance(value, ast.expr):
            if _is_module_call(value, file):
                # an instance of a class: a module or another object (any is refused)
                qual = file.qual(getattr(value, "func", value)) or ""
                kind = (
                    "a whole module" if qual.startswith("torch.nn.") else "an instance of a class"
                )
                return Why(f"{kind} (`{node.id} = {_short(value)}`)")
            why = why.join(weights_only_value(value, file, depth))
        else:
            return Why(f"`{node.id}`, which the checker cannot tell holds only weights")
        if why.what is not None:
            inner = why.what
            if inner.startswith(("a whole module (", "an optimizer", "an argparse")):
                return Why(inner.split(" (`", 1)[0] + f" (`{node.id}`)")
            return why
    return why


def _loop_value(
    loop: Union[ast.For, ast.AsyncFor, ast.comprehension], file: "_File", d: int
) -> Why:
    it = loop.iter
    if isinstance(it, ast.Call) and isinstance(it.func, ast.Name):
        if it.func.id in ("range", "enumerate", "zip") and it.func.id not in file.imports:
            if it.func.id == "range":
                return _OK
            return _all(it.args, file, d)
    return weights_only_value(it, file, d)


def _is_module_call(value: ast.expr, file: "_File") -> bool:
    """``Net(...)``, ``nn.DataParallel(net)``, ``model.cuda()`` of one: a module."""
    if not isinstance(value, ast.Call):
        return False
    qual = file.qual(value.func) or ""
    if qual.split(".")[-1] in _TORCH_DATA or qual in ("collections.OrderedDict",):
        return False
    if qual.startswith("torch.nn.") and qual.split(".")[-1][:1].isupper():
        return True
    func = value.func
    name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
    return name is not None and name[:1].isupper() and name not in ("OrderedDict",)


def _param_index(scope: Scope, arg: ast.arg, file: "_File") -> int:
    if isinstance(scope, ast.Module):
        return -1
    args = scope.args
    positional = [*args.posonlyargs, *args.args]
    if arg in positional:
        index = positional.index(arg)
        if file.class_of.get(id(scope)) and positional and positional[0].arg in ("self", "cls"):
            index -= 1
        return index
    return -1  # keyword-only: matched by name


def _short(node: ast.AST) -> str:
    text = ast.unparse(node)
    return text if len(text) <= 40 else text[:37] + "..."


# -- CPU evidence -----------------------------------------------------------------------------
def _on_cpu(value: ast.AST, save: ast.Call, file: "_File", depth: int = 0) -> bool:
    """Whether the tensors of ``value`` evidently live on the CPU: ``.cpu()`` (also per value
    of a comprehension), numpy data, a module moved to the CPU before its ``state_dict()`` is
    saved, numbers and strings, or anything made in a file that never names a device."""
    if depth > _DEPTH:
        return False
    if isinstance(value, (ast.Constant, ast.JoinedStr)):
        return True
    if isinstance(value, ast.Dict):
        return all(_on_cpu(v, save, file, depth + 1) for v in value.values)
    if isinstance(value, (ast.List, ast.Tuple)):
        return all(_on_cpu(v, save, file, depth + 1) for v in value.elts)
    if isinstance(value, ast.DictComp):
        return _on_cpu(value.value, save, file, depth + 1)
    if isinstance(value, (ast.ListComp, ast.GeneratorExp)):
        return _on_cpu(value.elt, save, file, depth + 1)
    if isinstance(value, ast.Call):
        func = value.func
        qual = file.qual(func) or ""
        if qual.startswith(("numpy.", "np.")):
            return True
        if isinstance(func, ast.Attribute):
            if func.attr == "cpu" or (func.attr == "to" and _names_cpu(value)):
                return True
            if func.attr == "numpy":
                return True
            if func.attr == "state_dict":
                chained = _chained_move(func.value)  # network.cpu().state_dict()
                return chained if chained is not None else _moved_to_cpu(func.value, save, file)
            if func.attr in _TENSOR_METHODS:
                return _on_cpu(func.value, save, file, depth + 1)
    if isinstance(value, ast.Name):
        scope = file.scope_of(value)
        values = file.assigned(scope).get(value.id, [])
        if values and all(isinstance(v, ast.expr) for v in values):
            if all(_on_cpu(v, save, file, depth + 1) for v in values):
                return True
        if _moved_per_key(value.id, scope, save):
            return True
    return file.device_free() and not weights_only_value(value, file).params


def _moved_per_key(name: str, scope: ast.AST, save: ast.Call) -> bool:
    """``for k in sd: sd[k] = sd[k].to(torch.device("cpu"))`` (or ``.cpu()``) before the
    save of ``sd`` in its scope: every value moved to the host, key by key."""
    for loop in ast.walk(scope):
        if not (
            isinstance(loop, ast.For)
            and loop.lineno < save.lineno
            and isinstance(loop.target, ast.Name)
            and _iterates_keys(loop.iter, name)
        ):
            continue
        key = loop.target.id
        for stmt in loop.body:
            if (
                isinstance(stmt, ast.Assign)
                and len(stmt.targets) == 1
                and _item(stmt.targets[0], name, key)
                and isinstance(stmt.value, ast.Call)
                and isinstance(stmt.value.func, ast.Attribute)
                and _item(stmt.value.func.value, name, key)
                and (
                    stmt.value.func.attr == "cpu"
                    or (stmt.value.func.attr == "to" and _to_cpu(stmt.value))
                )
            ):
                return True
    return False


def _iterates_keys(it: ast.expr, name: str) -> bool:
    """``sd``, ``sd.keys()``, ``list(sd)``, ``list(sd.keys())``: the keys of ``name``."""
    if isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.func.id == "list":
        it = it.args[0] if len(it.args) == 1 else it
    if isinstance(it, ast.Call) and isinstance(it.func, ast.Attribute) and it.func.attr == "keys":
        it = it.func.value
    return isinstance(it, ast.Name) and it.id == name


def _item(node: ast.expr, name: str, key: str) -> bool:
    """``sd[k]``: the item of ``name`` at the loop's key."""
    return (
        isinstance(node, ast.Subscript)
        and isinstance(node.value, ast.Name)
        and node.value.id == name
        and isinstance(node.slice, ast.Name)
        and node.slice.id == key
    )


def _names_cpu(call: ast.Call) -> bool:
    return any(_literal(a) == "cpu" for a in call.args) or any(
        _literal(k.value) == "cpu" for k in call.keywords
    )


def _to_cpu(call: ast.Call) -> bool:
    """``x.to("cpu")`` or ``x.to(torch.device("cpu"))``."""
    return _names_cpu(call) or any(
        isinstance(a, ast.Call)
        and isinstance(a.func, (ast.Attribute, ast.Name))
        and (a.func.attr if isinstance(a.func, ast.Attribute) else a.func.id) == "device"
        and _names_cpu(a)
        for a in call.args
    )


def _chained_move(module: ast.AST) -> Optional[bool]:
    """The last move chained on a module before its ``state_dict()``: True for ``.cpu()`` /
    ``.to("cpu")``, False for ``.cuda()`` or another ``.to(...)``, None for no move."""
    while isinstance(module, ast.Call) and isinstance(module.func, ast.Attribute):
        if module.func.attr == "cpu" or (module.func.attr == "to" and _names_cpu(module)):
            return True
        if module.func.attr in ("to", "cuda"):
            return False
        module = module.func.value
    return None


def _moved_to_cpu(module: ast.AST, save: ast.Call, file: "_File") -> bool:
    """``model.cpu()`` (or ``model.eval().cpu()``, ``model.to("cpu")``) in the function of the
    save, before it, with no move back (``.to(...)``, ``.cuda()``) in between."""
    key = ast.unparse(module)
    scope = file.scope_of(save)
    moved = 0
    for node in ast.walk(scope):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        if node.lineno >= save.lineno or file.scope_of(node) is not scope:
            continue
        receiver = node.func.value
        while isinstance(receiver, ast.Call) and isinstance(receiver.func, ast.Attribute):
            receiver = receiver.func.value  # model.eval().cpu(): model
        if ast.unparse(receiver) != key:
            continue
        if node.func.attr == "cpu" or (node.func.attr == "to" and _names_cpu(node)):
            moved = max(moved, node.lineno)
        elif node.func.attr in ("to", "cuda"):
            moved = -1 if node.lineno > moved else moved
    return moved > 0


# -- gathering --------------------------------------------------------------------------------
def gather_saves(tree: ast.Module, path: str) -> Tuple[Save, ...]:
    """Every save of one file: ``torch.save``, ``st.save`` and the savers that are
    ``torch.save`` under another name (``accelerator.save``), with what each holds."""
    file = _File(tree, path)
    found: List[Save] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        qual = file.qual(node.func)
        scope = file.scope_of(node)
        if qual in _SAVES and (
            any(isinstance(a, ast.Starred) for a in node.args)
            or any(k.arg is None for k in node.keywords)
        ):
            found.append(_forwarded_save(node, scope, path, file))
            continue
        if len(node.args) + len(node.keywords) < 2:
            continue
        if qual in _SAVES:
            value = node.args[0] if node.args else _keyword(node, "obj")
            target = node.args[1] if len(node.args) > 1 else _keyword(node, "f")
            if value is None or target is None:
                continue
            why = weights_only_value(value, file)
            if _keyword(node, "pickle_module") is not None:
                why = Why("a file written with a custom pickle_module")
            cpu = _on_cpu(value, node, file)
        elif (
            isinstance(node.func, ast.Attribute)
            and node.func.attr == "save"
            and len(node.args) >= 2
            and any(w in _short(node.func.value).lower().split(".")[-1] for w in _TORCH_SAVERS)
        ):
            target = node.args[1]
            why = weights_only_value(node.args[0], file)
            cpu = _on_cpu(node.args[0], node, file)
        else:
            continue
        found.append(
            Save(
                path,
                node.lineno,
                shape_of(target, file),
                why.what,
                why.params,
                cpu,
                _function_name(scope),
            )
        )
    return tuple(found)


# The path of a save whose arguments come through ``*args``: it may write any file.
_ANY_PATH = Shape(None, "", "", "*args")


def _forwarded_save(node: ast.Call, scope: Scope, path: str, file: "_File") -> Save:
    """``torch.save(*args, **kwargs)``: a wrapper (``save_on_master``) that writes whatever
    its callers pass, to any path. Where it forwards its own ``*args`` untouched, what it
    holds is what each call of the wrapper passes first after the wrapper's own positional
    parameters (followed one level, like a parameter; :func:`project_saves` also requires the
    wrapper to be only ever called by its name); otherwise it is unknown."""
    name = _function_name(scope)
    params = getattr(scope, "args", None)
    vararg = getattr(params, "vararg", None)
    first = node.args[0] if node.args else None
    if (
        name
        and params is not None
        and vararg is not None
        and isinstance(first, ast.Starred)
        and isinstance(first.value, ast.Name)
        and first.value.id == vararg.arg
        and not _rebound(scope, vararg.arg)
    ):
        positional = [*params.posonlyargs, *params.args]
        index = len(positional)
        if file.class_of.get(id(scope)) and positional and positional[0].arg in ("self", "cls"):
            index -= 1
        forwarded = frozenset({(name, index, "obj")})
        return Save(path, node.lineno, _ANY_PATH, None, forwarded, False, name, True)
    return Save(
        path,
        node.lineno,
        _ANY_PATH,
        "values passed through *args/**kwargs, which are not followed",
        frozenset(),
        False,
        name,
    )


def _rebound(scope: Scope, name: str) -> bool:
    """Whether ``name`` is assigned or deleted anywhere in ``scope`` (``args = ... + args``)."""
    return any(
        isinstance(n, ast.Name) and n.id == name and not isinstance(n.ctx, ast.Load)
        for n in ast.walk(scope)
    )


def _keyword(call: ast.Call, name: str) -> Optional[ast.expr]:
    for kw in call.keywords:
        if kw.arg == name:
            return kw.value
    return None


Param = Tuple[str, int, str]
#: One call of a function whose parameter a save writes: (the parameter, why the argument
#: may hold more than weights or None, the line).
CallFact = Tuple[Param, Optional[str], int]


def gather_calls(
    wanted: FrozenSet[Param],
) -> Callable[[ast.Module, str], Tuple[CallFact, ...]]:
    """A gather function: for every call in a file of a function named in ``wanted``
    ((function, index, parameter)), whether the argument passed for that parameter holds only
    weights (None) or why not, and its line. A parameter passed on by a caller counts as
    unknown (one level is followed)."""

    names = {w[0] for w in wanted}

    def gather(tree: ast.Module, path: str) -> Tuple[CallFact, ...]:
        file = _File(tree, path)
        out: List[CallFact] = []
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
            if name not in names:
                continue
            for want in wanted:
                if want[0] != name:
                    continue
                _, index, param = want
                arg = _keyword(node, param)
                if arg is None and 0 <= index < len(node.args):
                    arg = node.args[index]
                if arg is None:
                    if any(isinstance(a, ast.Starred) for a in node.args) or any(
                        k.arg is None for k in node.keywords
                    ):
                        out.append((want, f"an argument of `{name}` passed by *args", node.lineno))
                    continue  # the default is used: not followed (a constant, usually)
                why = weights_only_value(arg, file)
                what = why.what
                if what is None and why.params:
                    what = f"`{_short(arg)}`, a parameter of the caller, which is not followed"
                out.append(
                    (want, None if what is None else f"{what} ({path}:{node.lineno})", node.lineno)
                )
        return tuple(out)

    return gather


def extra_state(tree: ast.Module, path: str) -> bool:
    """Whether the file defines ``get_extra_state`` (a module's state dict may then hold any
    object)."""
    return any(
        isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == "get_extra_state"
        for n in ast.walk(tree)
    )


def is_test_file(path: str, tree: ast.Module) -> bool:
    """A test module: under a ``tests``-like directory, ``conftest.py``, or a ``test_*.py`` /
    ``*_test.py`` that imports pytest or unittest. (A ``test.py`` or ``test_net.py`` of a
    research repository is an evaluation script, not a test.)

    >>> is_test_file("tests/test_io.py", ast.parse("")), is_test_file("test.py", ast.parse(""))
    (True, False)
    """
    parts = path.replace("\\", "/").split("/")
    if any(p in _TEST_DIRS for p in parts[:-1]) or parts[-1] == "conftest.py":
        return True
    base = parts[-1]
    if base.startswith("test_") or base.endswith("_test.py"):
        modules = set(_imports(tree).values())
        return any(m.split(".")[0] in ("pytest", "unittest") for m in modules)
    return False


# -- the project, from one checked file -------------------------------------------------------
def project_saves(ctx: Context) -> List[Save]:
    """Every save of the project of the file ``ctx`` checks, each save whose value is a
    parameter followed to the calls that pass it (one level): ``held`` then says what a
    caller passes that a weights-only load refuses, or that no call passes it."""
    cached = ctx.cache.get("ST003-saves")
    if cached is not None:
        return cached
    saves = [
        s for per_file in ctx.project_facts("ST003-saves", gather_saves).values() for s in per_file
    ]
    wanted = frozenset(p for s in saves if s.held is None for p in s.params)
    passed: Dict[Param, List[Tuple[Optional[str], int]]] = {}
    if wanted:
        key = "ST003-calls:" + repr(sorted(wanted))
        for facts in ctx.project_facts(key, gather_calls(wanted)).values():
            for want, what, line in facts:
                passed.setdefault(want, []).append((what, line))
    referenced: Set[str] = set()
    if any(s.forwards for s in saves):
        for names in ctx.project_facts("ST003-referenced", _helpers.referenced_not_called).values():
            referenced.update(names)
    out: List[Save] = []
    for save in saves:
        held = save.held
        if save.forwards and save.function in referenced:
            held = (
                f"values saved through `{save.function}()`, which the project also passes "
                "around or imports under another name (its calls there are not followed)"
            )
        for param in sorted(save.params):
            if held is not None:
                break
            calls = passed.get(param)
            if not calls:
                held = f"the parameter `{param[2]}` of {param[0]}(), which no call in the project passes"
            else:
                held = next((what for what, _ in calls if what is not None), None)
        out.append(
            Save(save.path, save.line, save.shape, held, frozenset(), save.cpu, save.function)
        )
    ctx.cache["ST003-saves"] = out
    return out


def file_of(ctx: Context) -> _File:
    """The checked file, indexed as :func:`gather_saves` indexes every file."""
    found = ctx.cache.get("ST003-file")
    if found is None:
        found = ctx.cache["ST003-file"] = _File(ctx.tree, ctx.project.relpath(ctx.path))
    return found


def load_shape(ctx: Context, call: ast.Call) -> Optional[Shape]:
    """The shape of the path ``call`` (a ``torch.load``) reads; None without one."""
    path = call.args[0] if call.args else _keyword(call, "f")
    if path is None or isinstance(path, ast.Starred):
        return None
    return shape_of(path, file_of(ctx))


def candidates(ctx: Context, call: ast.Call) -> List[Save]:
    """The saves of the project that may write the file ``call`` loads (by path shape)."""
    shape = load_shape(ctx, call)
    if shape is None:
        return []
    return [s for s in project_saves(ctx) if may_match(shape, s.shape)]


def defines_extra_state(ctx: Context) -> bool:
    """Some file of the project defines ``get_extra_state``: a state dict may hold objects."""
    return any(ctx.project_facts("ST003-extra-state", extra_state).values())
