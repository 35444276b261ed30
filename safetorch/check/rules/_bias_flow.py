"""ST008's evidence from the whole project (``bias-before-bn``).

Whether a ``bias`` before BatchNorm is wasted, and whether ``bias=False`` can be written
without breaking code, are often decided in other files: who calls a ``conv_bn(..., bias=...)``
builder with which value, whether an init helper writes ``m.bias.data``, whether a checkpoint
is loaded into the model. One pass per file (:func:`gather`, run through
``ctx.project_facts``) records what ST008 needs from it; :func:`program` says which files run
together with the layer's file (the import graph), and :func:`param_verdict`,
:func:`fix_blocker` answer from those files only.

>>> import ast
>>> facts = gather(ast.parse("import torch\\nnet.load_state_dict(torch.load(p))\\n"), "t.py")
>>> [what for _, what in facts.loads]
['load_state_dict', 'torch.load']
"""

from __future__ import annotations

import ast
from typing import Dict, FrozenSet, List, NamedTuple, Optional, Set, Tuple

from safetorch.check.engine import Context
from safetorch.check.rules._helpers import FUNCTION_DEFS, NN, FunctionNode, self_attr

__all__ = [
    "FACTS_KEY",
    "BiasWrite",
    "FileFacts",
    "Site",
    "bias_write_applies",
    "bias_writes",
    "fix_blocker",
    "gather",
    "param_verdict",
    "program",
]

#: The ``ctx.project_facts`` key of :func:`gather`.
FACTS_KEY = "ST008-bias-flow"

#: (line, the layer classes an enclosing ``isinstance`` test limits it to or None for any
#: layer, the module-level function or class it is in or None for module-level code).
BiasWrite = Tuple[int, Optional[FrozenSet[str]], Optional[ast.AST]]

# Loads that put saved tensors into a model (a checkpoint saved before ``bias=False`` then
# has a key the fixed model lacks). Qualified names, then words a loader's name contains.
_LOADERS = frozenset(
    {
        "torch.load",
        "torch.hub.load",
        "torch.hub.load_state_dict_from_url",
        "torch.utils.model_zoo.load_url",
        "torch.distributed.checkpoint.load",
        "torch.distributed.checkpoint.load_state_dict",
    }
)
_LOAD_WORDS = (
    *("state", "checkpoint", "ckpt", "pretrain", "weight", "model", "param", "url"),
    *("snapshot", "resume"),
)

# Calls that import a module named at run time: (the argument naming it, by position and
# keyword; True when it names a file rather than a module). With an argument the checker
# cannot read, any file of the project may run with any other.
_DYNAMIC_IMPORTS: Dict[str, Tuple[int, str, bool]] = {
    "importlib.import_module": (0, "name", False),
    "runpy.run_module": (0, "mod_name", False),
    "importlib.util.spec_from_file_location": (1, "location", True),
    "importlib.machinery.SourceFileLoader": (1, "path", True),
    "runpy.run_path": (0, "path_name", True),
    "imp.load_source": (1, "pathname", True),
    "torch.hub.load": (0, "repo_or_dir", True),
}


class Site(NamedTuple):
    """One call of a function or class, its arguments summarised as ``"T"`` (a true
    constant), ``"F"`` (a false one: ``False``, ``None``, ``0``) or ``"?"``."""

    path: str
    line: int
    args: Tuple[str, ...]  # positional, in order ("*" for a starred one)
    keywords: Dict[str, str]
    double_star: bool


class FileFacts(NamedTuple):
    """What ST008 needs to know about one file of the project."""

    module: str  # dotted module name from the path ("pkg.models.resnet")
    imports: FrozenSet[str]  # dotted names it imports, relative imports resolved
    dynamic: bool  # imports a module named at run time
    loads: List[Tuple[int, str]]  # (line, loader) of checkpoint loads
    writes: List[Tuple[int, Optional[FrozenSet[str]]]]  # unguarded uses of ``m.bias``
    calls: Dict[str, List[Site]]  # callee's last name -> its calls here
    refs: Dict[str, int]  # name -> uses other than calling it
    defines: FrozenSet[str]  # module-level functions and classes


def _truth(node: ast.AST) -> str:
    if isinstance(node, ast.Constant) and isinstance(node.value, (bool, int, type(None))):
        return "T" if node.value else "F"
    return "?"


def _module_of(relpath: str) -> str:
    parts = relpath.replace("\\", "/").split("/")
    parts[-1] = parts[-1][:-3] if parts[-1].endswith(".py") else parts[-1]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(p for p in parts if p)


def _with_parents(name: str) -> List[str]:
    parts = name.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


def _imports_of(nodes: List[ast.AST], relpath: str, ctx: Context) -> Tuple[Set[str], bool]:
    module = _module_of(relpath)
    package = module.split(".") if relpath.endswith("__init__.py") else module.split(".")[:-1]
    found: Set[str] = set()
    dynamic = False
    for node in nodes:
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.update(_with_parents(alias.name))
        elif isinstance(node, ast.ImportFrom):
            base_parts = package[: len(package) - (node.level - 1)] if node.level else []
            base = ".".join(base_parts + ([node.module] if node.module else []))
            if base:
                found.update(_with_parents(base))
            for alias in node.names:
                if alias.name != "*":
                    found.add(f"{base}.{alias.name}" if base else alias.name)
        elif isinstance(node, ast.Call):
            qual = ctx.qualname(node.func) or (
                "importlib.import_module" if _is_name(node.func, "__import__") else ""
            )
            how = _DYNAMIC_IMPORTS.get(qual)
            if how is None:
                continue
            index, keyword, is_path = how
            kw = next((k.value for k in node.keywords if k.arg == keyword), None)
            arg = kw if kw is not None else (node.args[index] if len(node.args) > index else None)
            names = _strings(arg, nodes, ctx) if arg is not None else None
            if is_path:
                names = {n.replace("\\", "/").rsplit("/", 1)[-1] for n in names or ()}
                names = {"file:" + n for n in names if n.endswith(".py")}
            if not names:
                dynamic = True
            for name in names or ():
                found.update([name] if is_path else _with_parents(name))
    return found, dynamic


_PATH_CALLS = frozenset({"os.path.join", "posixpath.join", "str", "os.fspath"})
_PATH_CALLS |= {"pathlib.Path", "pathlib.PurePath", "Path"}
_DIR_CALLS = frozenset({"os.path.dirname", "os.path.abspath", "os.path.realpath", "os.getcwd"})


def _strings(
    expr: ast.AST, nodes: List[ast.AST], ctx: Context, depth: int = 3
) -> Optional[Set[str]]:
    """The strings an import's argument can be: built from constants with ``+``, ``/``,
    ``os.path.join``, f-strings and names bound in the file (``for name in ("a", "b")``,
    ``PATH = os.path.join(HERE, "x.py")``); a directory is ``"<dir>"``. None when it cannot
    be read (a parameter, ``args.model``, a call's result)."""
    parts: Optional[List[ast.expr]] = None
    sep = ""
    if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
        return {expr.value}
    if isinstance(expr, ast.Name):
        if expr.id == "__file__":
            return {"<dir>/<this file>"}
        bound = _bound_values(expr.id, nodes)
        if not bound or depth == 0:  # unbound here, a parameter, an import
            return None
        found: Set[str] = set()
        for value in bound:
            more = _strings(value, nodes, ctx, depth - 1)
            if more is None:
                return None
            found |= more
        return found
    if isinstance(expr, (ast.List, ast.Tuple, ast.Set)):
        union: Set[str] = set()
        for elt in expr.elts:
            more = _strings(elt, nodes, ctx, depth)
            if more is None:
                return None
            union |= more
        return union
    if isinstance(expr, ast.Attribute) and expr.attr == "parent":
        return {"<dir>"}
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, (ast.Add, ast.Div)):
        parts, sep = [expr.left, expr.right], "" if isinstance(expr.op, ast.Add) else "/"
    elif isinstance(expr, ast.JoinedStr):
        parts = list(expr.values)
    elif isinstance(expr, ast.FormattedValue):
        return _strings(expr.value, nodes, ctx, depth)
    elif isinstance(expr, ast.Call) and not expr.keywords:
        qual = ctx.qualname(expr.func) or (expr.func.id if isinstance(expr.func, ast.Name) else "")
        if qual in _DIR_CALLS:
            return {"<dir>"}
        if qual in _PATH_CALLS and expr.args:
            parts, sep = list(expr.args), "/"
    if parts is None:
        return None
    combined = {""}
    for i, part in enumerate(parts):
        options = _strings(part, nodes, ctx, depth)
        if options is None:
            return None
        joiner = sep if i else ""
        combined = {a + joiner + b for a in combined for b in options}
        if len(combined) > 64:
            return None
    return combined


def _bound_values(name: str, nodes: List[ast.AST]) -> Optional[List[ast.AST]]:
    """What ``name`` is bound to in the file; None when a parameter or import binds it."""
    values: List[ast.AST] = []
    for node in nodes:
        if isinstance(node, ast.Assign) and any(_is_name(t, name) for t in node.targets):
            values.append(node.value)
        elif isinstance(node, (ast.For, ast.comprehension)) and _is_name(node.target, name):
            values.append(node.iter)
        elif isinstance(node, ast.arg) and node.arg == name:
            return None
        elif isinstance(node, (ast.Import, ast.ImportFrom)) and any(
            (a.asname or a.name).split(".")[0] == name for a in node.names
        ):
            return None
    return values


def _is_name(node: ast.AST, name: str) -> bool:
    return isinstance(node, ast.Name) and node.id == name


def _callee_name(func: ast.AST) -> Optional[str]:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def _loader(ctx: Context, call: ast.Call) -> Optional[str]:
    """What ``call`` loads a checkpoint with (``"torch.load"``, ``"load_state_dict"``), or
    None when it does not look like a load."""
    qual = ctx.qualname(call.func) or ""
    if qual in _LOADERS or qual.startswith("safetensors."):
        return qual
    name = _callee_name(call.func)
    if name is None or qual.startswith(("json.", "pickle.", "yaml.", "numpy.", "np.")):
        return None
    low = name.lower()
    if name == "from_pretrained" or low.startswith("restore"):
        return name
    words = low.split("_")
    if any(w.startswith("load") for w in words) and any(x in low for x in _LOAD_WORDS):
        return name  # load_state_dict, load_pretrained_model; not offload_*, dataloader
    if name == "load" and isinstance(call.func, ast.Attribute) and not qual:
        return name  # model.load(path), self.load(...): a loader of the project's own
    return None


def _site(relpath: str, call: ast.Call, skip: int) -> Site:
    args = tuple("*" if isinstance(a, ast.Starred) else _truth(a) for a in call.args[skip:])
    keywords = {k.arg: _truth(k.value) for k in call.keywords if k.arg is not None}
    double = any(k.arg is None for k in call.keywords)
    return Site(relpath, call.lineno, args, keywords, double)


def _base_names(cls: ast.ClassDef) -> List[str]:
    return [n for n in (_callee_name(b) for b in cls.bases) if n is not None]


def gather(tree: ast.Module, relpath: str) -> FileFacts:
    """ST008's facts about one file (the ``gather`` of ``ctx.project_facts``)."""
    # One list of the nodes, not ctx.walk: its index costs more than this pass over a file
    # the rules never visit.
    nodes = list(ast.walk(tree))
    ctx = Context(relpath, "", tree=tree)
    for node in nodes:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            ctx.add_imports(node)
    imports, dynamic = _imports_of(nodes, relpath, ctx)
    loads: List[Tuple[int, str]] = []
    calls: Dict[str, List[Site]] = {}
    refs: Dict[str, int] = {}
    not_refs: Set[int] = set()  # ids of names that are called, or only tested or inherited
    classes = [n for n in nodes if isinstance(n, ast.ClassDef)]
    for node in nodes:
        if isinstance(node, ast.ClassDef):
            not_refs.update(id(b) for b in node.bases)
        if not isinstance(node, ast.Call):
            continue
        skip = _super_init_skip(node)
        cls = None if skip is None else _class_around(classes, node)
        if cls is not None and skip is not None:
            for base in _base_names(cls):
                calls.setdefault(base, []).append(_site(relpath, node, skip))
        not_refs.add(id(node.func))
        what = _loader(ctx, node)
        if what is not None:
            loads.append((node.lineno, what))
        name = _callee_name(node.func)
        if name is not None:
            calls.setdefault(name, []).append(_site(relpath, node, 0))
        if _is_name(node.func, "isinstance") and len(node.args) == 2:
            not_refs.update(id(n) for n in ast.walk(node.args[1]))
        if (ctx.qualname(node.func) or "").endswith("functools.partial") and node.args:
            inner = _callee_name(node.args[0])
            if inner is not None:
                not_refs.add(id(node.args[0]))
                site = _site(relpath, node, 1)
                calls.setdefault(inner, []).append(site)
    for node in nodes:
        if id(node) in not_refs:
            continue
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            refs[node.id] = refs.get(node.id, 0) + 1
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
            refs[node.attr] = refs.get(node.attr, 0) + 1
    defines = frozenset(n.name for n in tree.body if isinstance(n, (*FUNCTION_DEFS, ast.ClassDef)))
    writes: List[Tuple[int, Optional[FrozenSet[str]]]] = []
    if any(isinstance(n, ast.Attribute) and n.attr == "bias" for n in nodes):
        writes = [(line, kinds) for line, kinds, _ in bias_writes(ctx)]
    return FileFacts(
        _module_of(relpath), frozenset(imports), dynamic, loads, writes, calls, refs, defines
    )


def _class_around(classes: List[ast.ClassDef], node: ast.AST) -> Optional[ast.ClassDef]:
    """The innermost class whose method holds ``node`` (by position)."""
    found = None
    for cls in classes:
        for method in cls.body:
            if (
                isinstance(method, FUNCTION_DEFS)
                and (method.lineno, method.col_offset)
                <= (getattr(node, "lineno", 0), getattr(node, "col_offset", 0))
                and getattr(node, "end_lineno", 0) <= (method.end_lineno or 0)
            ):
                found = cls
    return found


def _super_init_skip(node: ast.AST) -> Optional[int]:
    """For ``super().__init__(...)`` / ``super(C, self).__init__(...)`` 0, for
    ``Base.__init__(self, ...)`` 1 (the positional arguments before the parameters after
    ``self``); None for any other node."""
    if not isinstance(node, ast.Call):
        return None
    func = node.func
    if not (isinstance(func, ast.Attribute) and func.attr == "__init__"):
        return None
    value = func.value
    if isinstance(value, ast.Call):
        return 0 if _is_name(value.func, "super") else None
    return 1 if isinstance(value, (ast.Name, ast.Attribute)) else None


# -- which files run together ----------------------------------------------------------------
def program(facts: Dict[str, FileFacts], path: str) -> Set[str]:
    """The files that may run in one process with the file ``path``: every file that imports
    it (directly or not), and everything those import. All of them when a file imports a
    module named at run time (``importlib.import_module(name)``).

    >>> import ast
    >>> files = {
    ...     "model.py": "import torch.nn as nn\\n",
    ...     "train.py": "from model import Net\\nimport utils\\n",
    ...     "utils.py": "",
    ...     "other.py": "",
    ... }
    >>> facts = {p: gather(ast.parse(s), p) for p, s in files.items()}
    >>> sorted(program(facts, "model.py"))
    ['model.py', 'train.py', 'utils.py']
    """
    if path not in facts or any(f.dynamic for f in facts.values()):
        return set(facts)
    by_last: Dict[str, List[str]] = {}
    for rel, f in facts.items():
        by_last.setdefault(f.module.rsplit(".", 1)[-1], []).append(rel)
    by_file: Dict[str, List[str]] = {}
    for rel in facts:
        by_file.setdefault("file:" + rel.replace("\\", "/").rsplit("/", 1)[-1], []).append(rel)
    imports: Dict[str, Set[str]] = {}
    for rel, f in facts.items():
        found = imports[rel] = set()
        for name in f.imports:
            if name.startswith("file:"):
                found.update(o for o in by_file.get(name, ()) if o != rel)
                continue
            for other in by_last.get(name.rsplit(".", 1)[-1], ()):
                module = facts[other].module
                if other != rel and (module == name or module.endswith("." + name)):
                    found.add(other)
    importers: Dict[str, Set[str]] = {rel: set() for rel in facts}
    for rel, found in imports.items():
        for other in found:
            importers[other].add(rel)
    roots = _closure({path}, importers)
    return _closure(roots, imports)


def _closure(start: Set[str], edges: Dict[str, Set[str]]) -> Set[str]:
    seen = set(start)
    todo = list(start)
    while todo:
        for nxt in edges.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def _program_of(ctx: Context) -> Tuple[Dict[str, FileFacts], str, Set[str]]:
    cached = ctx.cache.get("ST008-program")
    if cached is None:
        facts = ctx.project_facts(FACTS_KEY, gather)
        here = ctx.project.relpath(ctx.path)
        cached = ctx.cache["ST008-program"] = (facts, here, program(facts, here))
    found: Tuple[Dict[str, FileFacts], str, Set[str]] = cached
    return found


def _own_facts(ctx: Context) -> Tuple[str, FileFacts]:
    """This file's facts alone (without reading the rest of the project)."""
    here = ctx.project.relpath(ctx.path)
    mine = ctx.cache.get("ST008-own-facts")
    if mine is None:
        mine = ctx.cache["ST008-own-facts"] = gather(ctx.tree, here)
    found: FileFacts = mine
    return here, found


def _where(path: str, line: int, here: str) -> str:
    return f"line {line}" if path == here else f"{path}:{line}"


# -- ``bias=bias``: what the callers pass ------------------------------------------------------
def _param_value(site: Site, name: str, index: Optional[int], default: str) -> str:
    if name in site.keywords:
        return site.keywords[name]
    if index is not None:
        before = site.args[: index + 1]
        if "*" in before:
            return "?"
        if len(site.args) > index:
            return site.args[index]
    return "?" if site.double_star or "*" in site.args else default


def _assigned_in(fn: FunctionNode, name: str) -> bool:
    for node in ast.walk(fn):
        if isinstance(node, ast.Name) and node.id == name and not isinstance(node.ctx, ast.Load):
            return True
        if isinstance(node, (ast.Global, ast.Nonlocal)) and name in node.names:
            return True
    return False


def param_verdict(
    ctx: Context, fn: FunctionNode, cls: Optional[ast.ClassDef], name: str
) -> Optional[str]:
    """Why the layer built with ``bias=<name>`` inside ``fn`` has a bias: a call in the
    project that passes True or leaves a True default (``"the call at train.py:9 passes
    True"``), or a True default nobody overrides; None when no call shows a bias (every call
    passes False, or the value is not known).

    ``fn`` is a function, a method or ``__init__`` (whose callers are the class's calls and
    ``super().__init__`` of its subclasses), found by name in the files that run with it.
    """
    args = fn.args
    positional = [a.arg for a in (*args.posonlyargs, *args.args)]
    if name not in positional and name not in [a.arg for a in args.kwonlyargs]:
        return None  # a closure or module variable
    if _assigned_in(fn, name):
        return None
    default = _default(fn, name)
    method = cls is not None and fn in cls.body
    static = any(_is_name(d, "staticmethod") for d in fn.decorator_list)
    callee = cls.name if method and fn.name == "__init__" and cls is not None else fn.name
    index = positional.index(name) if name in positional else None
    if index is not None and method and not static:
        index -= 1
    here, own = _own_facts(ctx)
    facts, files = {here: own}, {here}
    if method and fn.name != "__init__":
        pass  # self.make_layer(...): a method of this class, called here
    elif not any(_param_value(s, name, index, default) == "T" for s in own.calls.get(callee, ())):
        # No call here shows a bias: the other files that run with this one decide.
        facts, here, files = _program_of(ctx)
    values: List[Tuple[str, Site]] = []
    for rel in sorted(files):
        f = facts[rel]
        if rel != here and callee in f.defines:
            continue  # a function of the same name of its own
        for site in f.calls.get(callee, ()):
            values.append((_param_value(site, name, index, default), site))
    shown = "True" if default == "T" else None
    for value, site in values:
        if value == "T":
            where = _where(site.path, site.line, here)
            passed = name in site.keywords or (index is not None and len(site.args) > index)
            how = "passes True" if passed else "leaves it"
            head = f"{name}={name}, whose default is True" if shown else f"{name}={name}"
            return f"{head}; the call at {where} {how}"
    if default == "T" and not values:
        return (
            f"{name}={name}, whose default is True; no call of {callee} in the project passes False"
        )
    return None


def _default(fn: FunctionNode, name: str) -> str:
    """``"T"``/``"F"``/``"?"`` for the default of parameter ``name``; ``"?"`` when none."""
    args = fn.args
    positional = [*args.posonlyargs, *args.args]
    offset = len(positional) - len(args.defaults)
    for i, arg in enumerate(positional):
        if arg.arg == name:
            return _truth(args.defaults[i - offset]) if i >= offset else "?"
    for arg, default in zip(args.kwonlyargs, args.kw_defaults):
        if arg.arg == name:
            return "?" if default is None else _truth(default)
    return "?"


# -- what makes ``bias=False`` break code ------------------------------------------------------
def fix_blocker(ctx: Context, kind: str) -> Optional[str]:
    """Why no ``bias=False`` may be written on a layer of class ``kind`` of this file,
    judged on the files that run with it, or None: a project too big to read whole, a
    checkpoint load (a strict load of a checkpoint saved with the bias fails on the
    unexpected key), code in another file that uses ``m.bias`` of such layers as a tensor
    (it crashes on None). Writes in this file are judged by the caller, which sees which
    classes they reach.
    """
    _, mine = _own_facts(ctx)
    if mine.loads:  # decided without reading the other files
        line, what = mine.loads[0]
        return _load_blocks(what, f"line {line}")
    facts, here, files = _program_of(ctx)  # reads the project: ``complete`` is known after
    if not ctx.project.complete:
        return (
            " by hand (the project is too big to read whole: a checkpoint load or a .bias "
            "write in another file cannot be ruled out)"
        )
    ordered = sorted(files, key=lambda r: (r != here, r))
    load = next(((rel, *ld) for rel in ordered for ld in facts[rel].loads), None)
    if load is not None:
        rel, line, what = load
        return _load_blocks(what, _where(rel, line, here))
    for rel in sorted(files):
        if rel == here:
            continue
        for line, kinds in facts[rel].writes:
            if bias_write_applies(kinds, kind):
                return (
                    f", after guarding the code that writes .bias at {rel}:{line} with "
                    "`if m.bias is not None:` (with bias=False it would crash)"
                )
    return None


def _load_blocks(what: str, where: str) -> str:
    return (
        f" by hand if no saved checkpoint needs the bias ({what} at {where} may load one "
        "saved with it, and a strict load would then fail on its unexpected key)"
    )


# -- code that uses ``m.bias`` as a tensor -----------------------------------------------------
def _mentions_bias(ctx: Context, test: ast.AST) -> bool:
    for sub in ctx.walk(test):
        if isinstance(sub, ast.Attribute) and sub.attr == "bias":
            return True
        if isinstance(sub, ast.Constant) and sub.value == "bias":
            return True
    return False


def _isinstance_kinds(ctx: Context, test: ast.AST) -> Optional[FrozenSet[str]]:
    """The classes an ``isinstance(m, (A, B))`` test (possibly inside ``and``) admits."""
    calls = [test]
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        calls = list(test.values)
    for call in calls:
        word = _class_name_test(call)
        if word is not None:
            return frozenset({"~" + word})
        if isinstance(call, ast.Call) and _is_name(call.func, "isinstance") and len(call.args) == 2:
            classes = call.args[1]
            elts = classes.elts if isinstance(classes, ast.Tuple) else [classes]
            kinds: Set[str] = set()
            for elt in elts:
                qual = ctx.qualname(elt)
                if qual is None:
                    return None  # a class defined elsewhere: it may be a conv
                kinds.add(qual)
            return frozenset(kinds)
    return None


def _class_name_test(test: ast.AST) -> Optional[str]:
    """``"Conv"`` for ``classname.find("Conv") != -1`` or ``"Conv" in classname`` (the DCGAN
    ``weights_init`` idiom), else None."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1):
        return None
    left, op = test.left, test.ops[0]
    if isinstance(op, ast.In) and isinstance(left, ast.Constant) and isinstance(left.value, str):
        return left.value
    if (
        isinstance(op, (ast.NotEq, ast.Gt, ast.GtE))
        and isinstance(left, ast.Call)
        and isinstance(left.func, ast.Attribute)
        and left.func.attr == "find"
        and len(left.args) == 1
        and isinstance(left.args[0], ast.Constant)
        and isinstance(left.args[0].value, str)
    ):
        return left.args[0].value
    return None


def bias_write_applies(kinds: Optional[FrozenSet[str]], kind: str) -> bool:
    """Whether a ``.bias`` write limited to ``kinds`` (see :func:`bias_writes`) can reach a
    layer of class ``kind``.

    >>> bias_write_applies(frozenset({"torch.nn.Linear"}), "torch.nn.Conv2d")
    False
    >>> bias_write_applies(frozenset({"~Conv"}), "torch.nn.Conv2d")
    True
    """
    if kinds is None or kind in kinds:
        return True
    short = kind.rsplit(".", 1)[1]
    for k in kinds:
        if k.startswith("~"):
            if k[1:] in short:
                return True
        elif not (k.startswith(NN) and k[len(NN) : len(NN) + 1].isupper()):
            return True  # a class of its own or a private base (_ConvNd): it may be one
    return False


def bias_writes(ctx: Context) -> List[BiasWrite]:
    """Code of ``ctx``'s file that uses ``X.bias`` as a tensor without checking it exists.

    ``m.bias.data.zero_()``, ``m.bias.fill_(0)``, ``nn.init.constant_(m.bias, 0)``,
    ``m.bias[...]`` crash once the layer has ``bias=False`` (``m.bias`` is then None); under
    ``if m.bias is not None:`` (any test that mentions ``bias``) or ``try`` they do not.

    >>> ctx = Context("m.py", "import torch.nn as nn\\nnn.init.zeros_(m.bias)\\n")
    >>> ctx.add_imports(ctx.tree.body[0])
    >>> [(line, kinds) for line, kinds, _ in bias_writes(ctx)]
    [(2, None)]
    """
    found: Optional[List[BiasWrite]] = ctx.cache.get("bias_writes")
    if found is not None:
        return found
    writes: List[BiasWrite] = []

    def visit(
        node: ast.AST, guarded: bool, kinds: Optional[FrozenSet[str]], owner: Optional[ast.AST]
    ) -> None:
        if isinstance(node, ast.If):
            inner_kinds = _isinstance_kinds(ctx, node.test)
            inner = guarded or _mentions_bias(ctx, node.test)
            for child in node.body:
                visit(child, inner, inner_kinds if inner_kinds is not None else kinds, owner)
            for child in node.orelse:
                visit(child, guarded, kinds, owner)
            visit(node.test, guarded, kinds, owner)
            return
        if isinstance(node, ast.IfExp):
            inner = guarded or _mentions_bias(ctx, node.test)
            visit(node.body, inner, kinds, owner)
            visit(node.orelse, guarded, kinds, owner)
            return
        if isinstance(node, ast.Try):
            return  # a try around it: the author expected it to fail sometimes
        if not guarded and isinstance(node, ast.expr) and _uses_bias_tensor(ctx, node):
            writes.append((node.lineno, kinds, owner))
        for sub in ast.iter_child_nodes(node):
            top = owner
            if owner is None and isinstance(sub, (*FUNCTION_DEFS, ast.ClassDef)):
                top = sub
            visit(sub, guarded, kinds, top)

    if any(isinstance(n, ast.Attribute) and n.attr == "bias" for n in ctx.walk(ctx.tree)):
        visit(ctx.tree, False, None, None)
    ctx.cache["bias_writes"] = writes
    return writes


def _is_bias(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "bias" and not self_attr(node)


def _uses_bias_tensor(ctx: Context, node: ast.expr) -> bool:
    if isinstance(node, (ast.Attribute, ast.Subscript)) and _is_bias(node.value):
        return True
    if isinstance(node, ast.Call) and node.args and _is_bias(node.args[0]):
        return (ctx.qualname(node.func) or "").startswith(NN + "init.")
    return False
