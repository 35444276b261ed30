"""The rules of ``safetorch check``: one small class per pitfall, its docstring is its ``--explain``.

Each rule names (or rewrites into) the public safetorch function for its pitfall.
``RULE_TABLE`` maps every code to that pitfall and function, and to the torch entry points
it lives in, so monkeypatch mode can pair each patch with its rule.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import (
    Dict,
    FrozenSet,
    Iterable,
    Iterator,
    List,
    Optional,
    Sequence,
    Set,
    Tuple,
    Type,
    Union,
)

from safetorch.check.engine import SAFE, SYNTAX_ERROR_CODE, UNSAFE, Context, Edit, Fix, Rule
from safetorch.check.engine import walk as walk_nodes
from safetorch.check.fixer import (
    enclosing_statement,
    import_edit,
    newline,
    parents,
    wrap_edits,
)

__all__ = [
    "PREVIEW",
    "PREVIEW_RULES",
    "RULES",
    "RULE_TABLE",
    "RuleInfo",
    "SyntaxErrorRule",
    "explain_text",
    "rule_for",
    "select_rules",
]

#: The ``--select`` token that turns on every preview rule.
PREVIEW = "PREVIEW"

_F = "torch.nn.functional."
_NN = "torch.nn."


# ---------------------------------------------------------------------------------------------
# Small helpers shared by the rules
# ---------------------------------------------------------------------------------------------
def _keyword(call: ast.Call, name: str) -> Optional[ast.keyword]:
    for kw in call.keywords:
        if kw.arg == name:
            return kw
    return None


def _has_double_star(call: ast.Call) -> bool:
    return any(kw.arg is None for kw in call.keywords)


def _has_star(call: ast.Call) -> bool:
    return any(isinstance(a, ast.Starred) for a in call.args)


def _is_const(node: Optional[ast.AST], value: object) -> bool:
    return isinstance(node, ast.Constant) and node.value is value


def _add_keywords(ctx: Context, call: ast.Call, text: str) -> Optional[Edit]:
    """Insert ``text`` (``name=value, ...``) as the last argument(s) of ``call``."""
    items: List[ast.AST] = [*call.args, *call.keywords]
    if not items:
        line, col = ctx.end(call)
        return Edit(line, col - 1, line, col - 1, text)  # right before ")"
    if any(isinstance(a, ast.GeneratorExp) for a in call.args) and len(items) == 1:
        return None  # f(x for x in y): adding an argument would need parentheses
    last = max(items, key=lambda n: (n.end_lineno, n.end_col_offset))  # type: ignore[attr-defined]  # ast.AST has no position attributes in typeshed; every item is an expr
    return ctx.insert_after(last, ", " + text)


def _rename_call(ctx: Context, call: ast.Call, new_qualname: str) -> Optional[Edit]:
    """Edit the callee of ``call`` into ``new_qualname``, reusing how the file spells it."""
    func = call.func
    if isinstance(func, ast.Attribute):
        return ctx.replace_attr(func, new_qualname.rsplit(".", 1)[1])
    spelled = ctx.spell(new_qualname)
    return None if spelled is None else ctx.replace(func, spelled)


def _short(qualname: str) -> str:
    """``torch.nn.functional.upsample`` -> ``F.upsample``; ``torch.nn.Conv2d`` -> ``nn.Conv2d``."""
    if qualname.startswith(_F):
        return "F." + qualname[len(_F) :]
    if qualname.startswith(_NN):
        return "nn." + qualname[len(_NN) :]
    return qualname


# ---------------------------------------------------------------------------------------------
# Deprecated upsampling
# ---------------------------------------------------------------------------------------------
# deprecated name -> (extra keyword arguments that make F.interpolate / nn.Upsample identical,
#                     safetorch function)
_UPSAMPLE_FUNCS: Dict[str, Tuple[str, str]] = {
    _F + "upsample": ("", "st.upsample"),
    _F + "upsample_nearest": ('mode="nearest"', "st.upsample_nearest"),
    _F + "upsample_bilinear": ('mode="bilinear", align_corners=True', "st.upsample_bilinear"),
}
_UPSAMPLE_MODULES: Dict[str, str] = {
    _NN + "UpsamplingNearest2d": 'mode="nearest"',
    _NN + "UpsamplingBilinear2d": 'mode="bilinear", align_corners=True',
}


class DeprecatedUpsampleFunction(Rule):
    """ST001: deprecated ``F.upsample``, ``F.upsample_nearest``, ``F.upsample_bilinear``.

    These functions warn on every call and are thin aliases of ``F.interpolate``;
    ``upsample_bilinear`` silently uses ``align_corners=True``, which ``interpolate``'s
    default (``False``) does not, so a naive rename shifts every output pixel.

    Fix (automatic, safe): rename to ``F.interpolate`` and add exactly the arguments that keep the
    result identical: ``mode="nearest"`` for ``upsample_nearest``,
    ``mode="bilinear", align_corners=True`` for ``upsample_bilinear``.

        F.upsample_bilinear(x, scale_factor=2)
        ->  F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=True)

    safetorch: ``st.upsample``, ``st.upsample_nearest``, ``st.upsample_bilinear``.
    """

    code = "ST001"

    pitfall_id = "deprecated-upsample"
    name = "deprecated-upsample-function"
    pitfall = "F.upsample* are deprecated; upsample_bilinear implies align_corners=True"
    safetorch = "st.upsample"
    torch_symbols = tuple(_UPSAMPLE_FUNCS)
    fixable = True
    node_types = (ast.Call,)

    def visit(self, node: ast.Call) -> None:
        qual = self.ctx.qualname(node.func)
        if qual not in _UPSAMPLE_FUNCS:
            return
        extra, st_name = _UPSAMPLE_FUNCS[qual]
        shown = "F.interpolate(..." + (", " + extra if extra else "") + ")"
        fix = None
        if not (extra and _keyword(node, "mode")) and node.args:
            edits = [_rename_call(self.ctx, node, _F + "interpolate")]
            if extra:
                edits.append(_add_keywords(self.ctx, node, extra))
            if all(e is not None for e in edits):
                fix = Fix(f"replace with {shown}", tuple(e for e in edits if e is not None))
        self.report(
            node,
            f"{_short(qual)} is deprecated: use {shown} (identical result) or {st_name}",
            fix,
        )


class DeprecatedUpsamplingModule(Rule):
    """ST002: deprecated ``nn.UpsamplingNearest2d`` / ``nn.UpsamplingBilinear2d``.

    Both are deprecated subclasses of ``nn.Upsample``; ``UpsamplingBilinear2d`` hard-codes
    ``align_corners=True``, unlike ``nn.Upsample(mode="bilinear")``.

    Fix (automatic, safe): ``nn.Upsample(...)`` with the equivalent mode and align_corners:

        nn.UpsamplingBilinear2d(scale_factor=2)
        ->  nn.Upsample(scale_factor=2, mode="bilinear", align_corners=True)

    safetorch: ``st.Upsample``.
    """

    code = "ST002"

    pitfall_id = "deprecated-upsample"
    name = "deprecated-upsampling-module"
    pitfall = "nn.Upsampling*2d are deprecated; UpsamplingBilinear2d implies align_corners=True"
    safetorch = "st.Upsample"
    torch_symbols = tuple(_UPSAMPLE_MODULES)
    fixable = True
    node_types = (ast.Call,)

    def visit(self, node: ast.Call) -> None:
        qual = self.ctx.qualname(node.func)
        if qual not in _UPSAMPLE_MODULES:
            return
        extra = _UPSAMPLE_MODULES[qual]
        shown = f"nn.Upsample(..., {extra})"
        fix = None
        if not _keyword(node, "mode"):
            rename = _rename_call(self.ctx, node, _NN + "Upsample")
            add = _add_keywords(self.ctx, node, extra)
            if rename is not None and add is not None:
                fix = Fix(f"replace with {shown}", (rename, add))
        self.report(node, f"{_short(qual)} is deprecated: use {shown} or st.Upsample", fix)


# ---------------------------------------------------------------------------------------------
# torch.load
# ---------------------------------------------------------------------------------------------
def _loads_something(call: ast.Call) -> bool:
    """``torch.load(path)`` or ``torch.load(f=path)`` (not a bare ``torch.load()``)."""
    return bool(call.args) or _keyword(call, "f") is not None


# torch APIs whose use shows the code needs at least that torch (the release that added them).
_NEWER_APIS: Tuple[Tuple[str, Tuple[int, int]], ...] = (
    ("torch.accelerator", (2, 6)),  # torch 2.6: the device-generic accelerator module
    ("torch.serialization.safe_globals", (2, 5)),  # torch 2.5
    ("torch.serialization.add_safe_globals", (2, 4)),  # torch 2.4
    ("torch.amp.GradScaler", (2, 3)),  # torch 2.3: device-generic GradScaler
    ("torch.export", (2, 1)),  # torch 2.1
    ("torch.compile", (2, 0)),  # torch 2.0
    ("torch.func", (2, 0)),  # torch 2.0 (functorch merged)
)


def min_torch(ctx: Context) -> Tuple[Optional[Tuple[int, int]], str]:
    """The oldest torch the file can run on: the configured ``min-torch-version`` or, when
    higher, what its use of newer APIs implies; and why (``"torch.accelerator at line 3"``,
    ``"min-torch-version"`` or ``""`` when unknown)."""
    cached = ctx.cache.get("min_torch")
    if cached is not None:
        return cached
    best, why = ctx.options.min_torch, "min-torch-version" if ctx.options.min_torch else ""
    if "torch." in ctx.source or "from torch" in ctx.source:
        for node in walk_nodes(ctx.tree):
            if not isinstance(node, (ast.Attribute, ast.Name)):
                continue
            qual = ctx.qualname(node)
            if qual is None:
                continue
            for api, version in _NEWER_APIS:
                if (qual == api or qual.startswith(api + ".")) and (best is None or version > best):
                    best, why = version, f"{api} at line {node.lineno}"
    ctx.cache["min_torch"] = (best, why)
    return best, why


def torch_at_least(ctx: Context, major: int, minor: int) -> bool:
    """True when every torch the file can run on is at least ``major.minor``."""
    found = min_torch(ctx)[0]
    return found is not None and found >= (major, minor)


# Methods only a module has: a loaded object used with them is a whole pickled module.
_MODULE_METHODS = frozenset(
    {"eval", "train", "parameters", "named_parameters", "modules", "children", "forward"}
    | {"state_dict", "named_modules", "zero_grad", "requires_grad_"}
)


class _Payloads:
    """What the file's ``torch.save`` calls write and how its ``torch.load`` results are used:
    the evidence ST003/ST004 advise from (ST003 never offers ``weights_only=True`` for a file
    that evidently holds a whole module or numpy data)."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.saves: List[Tuple[ast.Call, Optional[str]]] = []  # (save call, what it holds)
        self.bindings: Dict[int, str] = {}  # id(load call) -> name its result is bound to
        self.scope_of: Dict[int, ast.AST] = {}
        self.loads_in_else: Set[int] = set()  # loads in a branch whose sibling maps
        self.call_scope: Dict[int, ast.AST] = {}  # id(call) -> innermost function (or module)
        self._numpy_names: Set[str] = set()
        self._module_names: Set[str] = set()
        self._read(ctx.tree)

    def _read(self, tree: ast.Module) -> None:
        ctx = self.ctx
        self.functions = [n for n in walk_nodes(tree) if isinstance(n, _FUNCTIONS)]
        scopes = [tree, *self.functions]
        for scope in scopes:
            for stmt in _statements_in_order(scope.body):
                if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
                    target, value = stmt.targets[0], stmt.value
                    name = _var_key(target)
                    root = _chain_root(value)
                    if name is not None and isinstance(root, ast.Call):
                        qual = ctx.qualname(root.func) or ""
                        if qual == "torch.load":
                            self.bindings[id(root)] = name
                            self.scope_of[id(root)] = scope
                        elif qual.startswith(("numpy.", "np.")):
                            self._numpy_names.add(name)
                        elif qual.startswith(_NN) and qual[len(_NN) : len(_NN) + 1].isupper():
                            self._module_names.add(name)
                elif isinstance(stmt, ast.If):
                    self._note_mapped_branches(stmt)
        for node in walk_nodes(tree):
            if isinstance(node, ast.Attribute) and node.attr in _MODULE_METHODS:
                name = _var_key(node.value)
                if name is not None:
                    self._module_names.add(name)
        for node in walk_nodes(tree):
            if isinstance(node, ast.Call) and ctx.qualname(node.func) == "torch.save" and node.args:
                self.saves.append((node, self._holds(node.args[0])))
        for scope in scopes:  # outer functions first: the innermost one wins
            for node in walk_nodes(scope):
                if isinstance(node, ast.Call):
                    self.call_scope[id(node)] = scope

    def _note_mapped_branches(self, stmt: ast.If) -> None:
        """``if cuda: torch.load(p) else: torch.load(p, map_location="cpu")``: the CUDA branch
        loads where the tensors were saved, on purpose."""
        branches = [stmt.body, stmt.orelse]
        loads = []
        for branch in branches:
            calls = [
                n
                for s in branch
                for n in walk_nodes(s)
                if isinstance(n, ast.Call) and self.ctx.qualname(n.func) == "torch.load"
            ]
            loads.append(calls)
        mapped = [any(_keyword(c, "map_location") for c in calls) for calls in loads]
        for i, calls in enumerate(loads):
            if mapped[1 - i]:
                self.loads_in_else.update(id(c) for c in calls)

    def _holds(self, obj: ast.AST) -> Optional[str]:
        """``"a whole module"``, ``"numpy data"``, ``"CPU tensors"`` or None (a state dict or
        something the checker cannot tell)."""
        ctx = self.ctx
        if isinstance(obj, ast.Call):
            qual = ctx.qualname(obj.func) or ""
            if qual.startswith(("numpy.", "np.")):
                return "numpy data"
            if isinstance(obj.func, ast.Attribute) and obj.func.attr == "cpu":
                return "CPU tensors"
            return None
        if isinstance(obj, ast.Dict):
            for value in obj.values:
                inner = self._holds(value) if value is not None else None
                if inner == "numpy data":
                    return "numpy scalars"
                if inner == "a whole module":
                    return inner
            return None
        name = _var_key(obj)
        if name in self._numpy_names:
            return "numpy data"
        if name in self._module_names:
            return "a whole module"
        return None

    def load_holds(self, load: ast.Call) -> Optional[Tuple[str, int]]:
        """What the file loaded by ``load`` evidently holds, and the line that shows it."""
        name = self.bindings.get(id(load))
        scope = self.scope_of.get(id(load), self.ctx.tree)
        if name is not None:
            for node in walk_nodes(scope):
                if (
                    isinstance(node, ast.Attribute)
                    and _var_key(node.value) == name
                    and _pos(node) > _pos(load)
                ):
                    if node.attr in _MODULE_METHODS:
                        return "a whole module", node.lineno
                    if node.attr in ("astype", "tobytes"):
                        return "numpy data", node.lineno
                if (
                    isinstance(node, ast.Call)
                    and _var_key(node.func) == name
                    and _pos(node) > _pos(load)
                ):
                    return "a whole module", node.lineno  # called: model(x)
                if isinstance(node, ast.Call) and _pos(node) > _pos(load):
                    qual = self.ctx.qualname(node.func) or ""
                    numpy = qual == "torch.from_numpy" or qual.startswith(("numpy.", "np."))
                    if numpy and any(_var_key(_subscript_root(a)) == name for a in node.args):
                        return "numpy data", node.lineno  # torch.from_numpy(data[3:])
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                    if node.func.attr == "load_state_dict" and any(
                        _var_key(a) == name or _chain_root(a) is load for a in node.args
                    ):
                        return None  # loaded as a state dict
        path = _arg(load, 0, "f")
        candidates = [(held, save) for save, held in self.saves if self._same_file(path, save)]
        kinds = {held for held, _ in candidates}
        if len(kinds) == 1 and kinds <= {"a whole module", "numpy data", "numpy scalars"}:
            return candidates[0][0], candidates[0][1].lineno  # type: ignore[return-value]  # held is one of the strings just checked
        return None

    def _same_file(self, path: Optional[ast.AST], save: ast.Call) -> bool:
        """Whether ``save`` may write the file a load reads from ``path``: the same path
        expression, or a path that is not a literal on either side."""
        target = _arg(save, 1, "f")
        if path is None or target is None:
            return False
        if self.ctx.segment(path) == self.ctx.segment(target):
            # A local name (``path``) means the same file only within one function.
            local = isinstance(path, ast.Name) and self._scope(path) is not self.ctx.tree
            return not local or self._scope(path) is self._scope(save)
        return not (isinstance(path, ast.Constant) and isinstance(target, ast.Constant))

    def _scope(self, node: ast.AST) -> ast.AST:
        """The function whose body holds the call ``node`` is in (by position), or the module."""
        if id(node) in self.call_scope:
            return self.call_scope[id(node)]
        where = _pos(node)
        best: ast.AST = self.ctx.tree
        for scope in self.functions:  # in pre-order: a later match is nested deeper
            if _pos(scope) <= where <= _end_pos(scope):
                best = scope
        return best

    def saves_here(self, load: ast.Call) -> bool:
        """The file itself saves the file ``load`` reads (the same path expression)."""
        path = _arg(load, 0, "f")
        for save, _ in self.saves:
            target = _arg(save, 1, "f")
            if path is not None and target is not None and self._same_file(path, save):
                if self.ctx.segment(path) == self.ctx.segment(target):
                    return True
        return False

    def saved_on_cpu(self, load: ast.Call) -> bool:
        """The file writes what ``load`` reads from CPU tensors (``.cpu()``, numpy data)."""
        path = _arg(load, 0, "f")
        for save, held in self.saves:
            if held in ("CPU tensors", "numpy data") and self._same_file(path, save):
                target = _arg(save, 1, "f")
                if target is not None and self.ctx.segment(target) == self.ctx.segment(path):  # type: ignore[arg-type]  # _same_file is False without a path
                    return True
        return False


def _subscript_root(node: ast.AST) -> ast.AST:
    """``data`` for ``data[3:, :-1]``."""
    while isinstance(node, ast.Subscript):
        node = node.value
    return node


def _chain_root(node: ast.AST) -> ast.AST:
    """``torch.load(p)`` for ``torch.load(p).to(device).eval()``."""
    while (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Call)
    ):
        node = node.func.value
    return node


def payloads(ctx: Context) -> _Payloads:
    found = ctx.cache.get("payloads")
    if found is None:
        found = ctx.cache["payloads"] = _Payloads(ctx)
    return found


# Words in an ``if`` test that say it decides about CUDA.
_CUDA_TESTS = ("cuda", "gpu", "device_count")


def _device_words(ctx: Context) -> Tuple[bool, bool, bool]:
    """(the file uses CUDA, it can run without CUDA, it runs several processes)."""
    cached = ctx.cache.get("device_words")
    if cached is None:
        uses_cuda = cpu_path = distributed = False
        for node in walk_nodes(ctx.tree):
            if isinstance(node, ast.Attribute):
                if node.attr == "cuda":
                    uses_cuda = True
                elif node.attr in ("is_available", "device_count"):
                    cpu_path = True
                elif node.attr in ("local_rank", "world_size", "distributed"):
                    distributed = True
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                if node.value.startswith("cuda"):
                    uses_cuda = True
                elif node.value in ("cpu", "mps") or node.value.startswith("cpu:"):
                    cpu_path = True
            elif isinstance(node, ast.Name) and node.id in ("local_rank", "world_size", "rank"):
                distributed = True
        if any(v.startswith("torch.distributed") for v in ctx.imports.values()):
            distributed = True
        if "torch.distributed" in ctx.source or "DistributedDataParallel" in ctx.source:
            distributed = True
        cached = ctx.cache["device_words"] = (uses_cuda, cpu_path, distributed)
    return cached


def _cuda_guards(ctx: Context) -> List[Tuple[Pos, Pos]]:
    """Extents of the branches that run only with CUDA (``if torch.cuda.is_available():``,
    ``if args.cuda:``)."""
    cached = ctx.cache.get("cuda_guards")
    if cached is None:
        cached = []
        for node in walk_nodes(ctx.tree):
            if isinstance(node, ast.If) and node.body:
                words = [
                    getattr(n, "attr", None) or getattr(n, "id", None) or ""
                    for n in walk_nodes(node.test)
                ]
                negated = isinstance(node.test, ast.UnaryOp)
                if not negated and any(
                    w in str(word).lower() for word in words for w in _CUDA_TESTS
                ):
                    cached.append((_pos(node.body[0]), _end_pos(node.body[-1])))
        ctx.cache["cuda_guards"] = cached
    return cached


def _device_note(ctx: Context, call: ast.Call) -> Optional[str]:
    """Why a ``torch.load`` without ``map_location`` can put tensors on a missing or wrong
    device here, or None where it evidently cannot: the file saved them from the CPU, the
    load runs only with CUDA (a branch whose sibling maps, or under a CUDA test), or the
    script needs CUDA anyway and runs one process."""
    if _keyword(call, "map_location") is not None or _has_star(call) or len(call.args) > 1:
        return None
    if not _loads_something(call):
        return None
    found = payloads(ctx)
    if id(call) in found.loads_in_else or found.saved_on_cpu(call):
        return None
    held = found.load_holds(call)
    if held is not None and held[0].startswith("numpy"):
        return None  # numpy arrays live on the host
    uses_cuda, cpu_path, distributed = _device_words(ctx)
    if not uses_cuda and found.saves_here(call):
        return None  # reloads what this CUDA-free file saved itself (a dataset, a cache)
    if "offload_to_cpu" in ctx.source or "cpu_offload" in ctx.source:
        return None  # FSDP state dicts gathered to the CPU before saving
    where = _pos(call)
    if any(lo <= where <= hi for lo, hi in _cuda_guards(ctx)):
        return None
    if uses_cuda and not cpu_path and not distributed:
        return None  # a CUDA-only single-process script: the saved device is there
    if distributed:
        return "in a multi-process job every rank loads onto the device it was saved from (cuda:0)"
    return "a checkpoint saved on a GPU fails to load on a machine without one"


def _spans(ctx: Context, key: str, nodes: Iterable[ast.AST]) -> List[Tuple[Pos, Pos]]:
    """(start, end) of each node, cached under ``key``."""
    cached = ctx.cache.get(key)
    if cached is None:
        cached = ctx.cache[key] = [(_pos(n), _end_pos(n)) for n in nodes]
    return cached


def _inside(where: Pos, spans: List[Tuple[Pos, Pos]]) -> bool:
    return any(lo <= where <= hi for lo, hi in spans)


def _allow_listed(ctx: Context, call: ast.Call) -> bool:
    """The load runs with an allow-list of the classes the file holds: inside ``with
    torch.serialization.safe_globals([...]):`` or in a file that calls
    ``torch.serialization.add_safe_globals([...])``; a weights-only load accepts those."""
    if "safe_globals" not in ctx.source:
        return False
    qual = ctx.qualname
    withs = _spans(
        ctx,
        "safe_globals_blocks",
        (
            n
            for n in walk_nodes(ctx.tree)
            if isinstance(n, ast.With)
            and any(
                isinstance(i.context_expr, ast.Call)
                and qual(i.context_expr.func) == "torch.serialization.safe_globals"
                for i in n.items
            )
        ),
    )
    if _inside(_pos(call), withs):
        return True
    return any(
        isinstance(n, ast.Call) and qual(n.func) == "torch.serialization.add_safe_globals"
        for n in walk_nodes(ctx.tree)
    )


def _catches_type_error(handler: ast.ExceptHandler) -> bool:
    kinds = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any(isinstance(k, ast.Name) and k.id == "TypeError" for k in kinds)


def _weights_only_fallback(ctx: Context, call: ast.Call) -> bool:
    """``try: torch.load(..., weights_only=w) except TypeError: torch.load(...)``: the
    fallback for a torch whose ``load`` has no ``weights_only`` argument (before 1.13)."""
    if "TypeError" not in ctx.source:
        return False
    handlers = _spans(
        ctx,
        "weights_only_fallbacks",
        (
            h
            for t in walk_nodes(ctx.tree)
            if isinstance(t, ast.Try)
            and any(
                isinstance(n, ast.Call)
                and ctx.qualname(n.func) == "torch.load"
                and _keyword(n, "weights_only") is not None
                for stmt in t.body
                for n in walk_nodes(stmt)
            )
            for h in t.handlers
            if _catches_type_error(h)
        ),
    )
    return _inside(_pos(call), handlers)


class LoadWithoutWeightsOnly(Rule):
    """ST003: ``torch.load`` without ``weights_only`` (one finding per call, safety and device).

    ``torch.load`` unpickles: with ``weights_only=False`` (the default before torch 2.6) a
    checkpoint file can run arbitrary code when loaded. Saying ``weights_only=True`` makes
    the call safe and behave the same on every torch version.

    The minimum torch is the configured ``min-torch-version`` or, when higher, what the
    file's own use of newer APIs needs (``torch.accelerator``: 2.6, ``torch.compile``: 2.0).
    From torch 2.6 ``torch.load`` is weights-only by default: a call without
    ``weights_only`` is then not reported, unless the file evidently holds more than
    weights, which the default now refuses.

    The advice follows what the file evidently holds: a whole module (``torch.save(model,
    path)`` in the same file, or the loaded object used as a module: ``.eval()``, called),
    numpy arrays or numpy scalars (saved from ``np.*`` values). ``weights_only=True`` refuses
    those, so it is not offered there; the finding points to ``st.load(path, allow=[...])``
    (an explicit allow-list, for this call only) or to saving a state_dict instead. A load
    under ``torch.serialization.safe_globals([...])`` (or in a file that calls
    ``add_safe_globals``) has its allow-list: it is advised as a plain load. Quiet for the
    fallback ``except TypeError:`` of a ``try`` whose load passes ``weights_only`` (a torch
    without that argument, before 1.13).

    Where the load lacks ``map_location`` too, the same finding says so (ST004, in preview,
    is that advice alone): a GPU checkpoint fails on a machine without one, and in a
    multi-process job every rank loads onto ``cuda:0``.

    Fix (unsafe, ``--unsafe-fixes``): add ``weights_only=True``. On torch before 2.6 it
    refuses checkpoints that pickle other objects (numpy scalars, argparse Namespaces) which
    loaded before; not offered where the file evidently holds more than weights. There the
    load becomes what ``safetorch run`` makes of it, spelled for plain ``python``:

        model = torch.load(path)  ->  model = st.load(path, map_location="available",
                                          trust_root=os.path.dirname(os.path.abspath(__file__)))

    which rebuilds whole-model pickles of the ``nn.Module`` classes defined under this
    file's directory and of ``torch.nn``, and numpy arrays, and nothing else
    (``map_location="available"`` keeps torch.load's placement, CPU where CUDA is missing;
    ``import os`` and ``import safetorch as st`` are added where missing).

    safetorch: ``st.load`` (weights_only by default, clear error naming the blocked type).
    """

    code = "ST003"

    pitfall_id = "load-without-weights-only"
    name = "load-without-weights-only"
    pitfall = "torch.load unpickles arbitrary objects unless weights_only=True"
    safetorch = "st.load"
    torch_symbols = ("torch.load",)
    fixable = True
    fix_applicability = UNSAFE
    node_types = (ast.Call,)

    def visit(self, node: ast.Call) -> None:
        if self.ctx.qualname(node.func) != "torch.load" or _has_double_star(node):
            return
        if not _loads_something(node) or _weights_only_fallback(self.ctx, node):
            return
        weights_only = _keyword(node, "weights_only")
        floor, why = min_torch(self.ctx)
        new_torch = floor is not None and floor >= (2, 6)
        held = payloads(self.ctx).load_holds(node)
        if held is not None and _allow_listed(self.ctx, node):
            held = None  # its classes are allow-listed: a weights-only load accepts them
        if weights_only is not None:
            if held is not None and _is_const(weights_only.value, True):
                self.report(
                    node, self._refused(held, "weights_only=True"), self._trusted_load(node)
                )
            return
        if new_torch:
            if held is not None:
                since = f"this code needs torch >= 2.6 ({why})"
                self.report(
                    node,
                    self._refused(held, f"the default weights_only=True ({since})"),
                    self._trusted_load(node),
                )
            return
        # With ST004 opt-in, this finding also carries the device advice: one per call.
        device = _device_note(self.ctx, node) if LoadWithoutMapLocation.preview else None
        tail = (
            ""
            if device is None
            else f"; it also lacks map_location: {device} (st.load maps to CPU)"
        )
        if held is not None:
            self.report(
                node,
                "torch.load without weights_only can execute code from the file (the default "
                f"before torch 2.6){tail}; " + self._refused(held, "weights_only=True"),
                self._trusted_load(node),
            )
            return
        edit = _add_keywords(self.ctx, node, "weights_only=True")
        # weights_only=True refuses checkpoints that pickle other objects (numpy scalars,
        # argparse Namespaces) on torch < 2.6: a resume that worked would fail.
        fix = None if edit is None else Fix("add weights_only=True", (edit,), UNSAFE)
        self.report(
            node,
            "torch.load without weights_only can execute code from the file (the default "
            f"before torch 2.6): pass weights_only=True or use st.load{tail}",
            fix,
        )

    def _trusted_load(self, call: ast.Call) -> Optional[Fix]:
        """``st.load(<the same arguments>, trust_root=<this file's directory>)``: what
        ``safetorch run`` does for this call, spelled out so plain ``python`` runs it (a
        whole-model pickle of the project's own classes, torch.nn modules, numpy arrays)."""
        if _has_star(call) or _has_double_star(call) or len(call.args) > 2:
            return None
        if _keyword(call, "pickle_module") is not None or _keyword(call, "trust_root"):
            return None
        names = import_edit(self.ctx, [("os", None), ("safetorch", "st")])
        if names is None:
            return None
        spelled, imports = names
        seg = self.ctx.segment
        parts = [seg(a) for a in call.args]
        parts += [seg(k) for k in call.keywords if k.arg != "weights_only"]
        if _arg(call, 1, "map_location") is None:
            parts.append('map_location="available"')  # torch.load's placement, CPU without CUDA
        os_name = spelled["os"]
        parts.append(f"trust_root={os_name}.path.dirname({os_name}.path.abspath(__file__))")
        text = f"{spelled['safetorch']}.load({', '.join(parts)})"
        edits = list(imports) + [self.ctx.replace(call, text)]
        return Fix("use st.load(..., trust_root=<this file's directory>)", tuple(edits), UNSAFE)

    @staticmethod
    def _refused(held: Tuple[str, int], what: str) -> str:
        kind, line = held
        instead = (
            "save model.state_dict() instead"
            if kind == "a whole module"
            else "save tensors instead (torch.from_numpy)"
        )
        return (
            f"{what} refuses the file, which evidently holds {kind} (line {line}): {instead}, "
            "or load it with st.load(path, allow=[...the classes it holds]) or, for your own "
            "files, st.load(path, trust_root=<the project directory>) (what safetorch run "
            "does); weights_only=False only for a file you trust"
        )


class LoadWithoutMapLocation(Rule):
    """ST004: ``torch.load`` without ``map_location``.

    Without ``map_location`` every tensor goes back to the device it was saved from: loading
    a GPU checkpoint fails on a CPU-only machine, and in multi-GPU jobs every rank piles its
    copy onto ``cuda:0``.

    Quiet where the file evidently never held GPU tensors (it saves that path from
    ``.cpu()`` tensors or numpy data, FSDP CPU offload), where the load runs only with CUDA
    (the CUDA branch of an ``if`` whose other branch maps, or under ``if
    torch.cuda.is_available():``), and in CUDA-only single-process scripts.

    Preview: 54 of 63 findings (86%) were right on the labelled corpus of real repositories
    (``benchmarks/check_corpus``); it cannot see that a downloaded pretrained file or a
    dataset cache holds CPU tensors. In the default set ST003's finding for the same call
    carries this advice.

    Fix (manual): pass ``map_location="cpu"`` (or the rank's device).

    safetorch: ``st.load`` (maps to CPU unless told otherwise).
    """

    code = "ST004"

    pitfall_id = "load-without-map-location"
    name = "load-without-map-location"
    pitfall = "torch.load restores tensors to the device they were saved from"
    safetorch = "st.load"
    torch_symbols = ("torch.load",)
    # Opt-in (54 of 63 findings right on the labelled corpus, benchmarks/check_corpus):
    # ST003 carries the same device advice, so one torch.load call gets one finding.
    preview = True
    node_types = (ast.Call,)

    def visit(self, node: ast.Call) -> None:
        if self.ctx.qualname(node.func) != "torch.load" or _has_double_star(node):
            return
        note = _device_note(self.ctx, node)
        if note is None:
            return
        self.report(
            node,
            f"torch.load without map_location puts tensors back on the device they were "
            f'saved from ({note}): pass map_location="cpu" (or the target device) or use st.load',
        )


# ---------------------------------------------------------------------------------------------
# detach() + in-place
# ---------------------------------------------------------------------------------------------
# Trailing-underscore methods that do not write the tensor's data.
_NOT_DATA_WRITES = frozenset({"requires_grad_", "share_memory_", "detach_", "retain_grad_"})


def _is_detach_call(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "detach"
        and not node.args
        and not node.keywords
    )


def _fresh_copy(ctx: Context, node: ast.AST) -> bool:
    """``x.clone()`` / ``torch.clone(x)``: a new tensor nothing else refers to, so what its
    ``.detach()`` shares memory with is that copy alone (torch's own optimizers write
    ``buf = torch.clone(grad).detach()``)."""
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    return (isinstance(func, ast.Attribute) and func.attr == "clone") or ctx.qualname(
        func
    ) == "torch.clone"


def _inplace_method(node: ast.Call) -> Optional[str]:
    func = node.func
    if isinstance(func, ast.Attribute):
        attr = func.attr
        if attr.endswith("_") and not attr.startswith("_") and attr not in _NOT_DATA_WRITES:
            return attr
    return None


def _bound_names(target: ast.AST) -> Iterator[str]:
    """Names an assignment target binds (``a``, ``a, (b, *c)``)."""
    if isinstance(target, ast.Name):
        yield target.id
    elif isinstance(target, (ast.Tuple, ast.List)):
        for elt in target.elts:
            yield from _bound_names(elt)
    elif isinstance(target, ast.Starred):
        yield from _bound_names(target.value)


# In-place ops whose point is to write *into* the destination: ``p.detach().copy_(new)`` is the
# documented way to overwrite a parameter outside autograd, so a clone would break it.
_WRITE_THROUGH = frozenset({"copy_", "set_"})


class _Detached:
    """A ``name = <expr>.detach()`` binding and what happens to the name afterwards."""

    __slots__ = ("call", "ops", "read_after_write")

    def __init__(self, call: ast.Call) -> None:
        self.call = call
        self.ops: List[Tuple[str, int]] = []  # (operation, line)
        self.read_after_write = False


class DetachThenInPlace(Rule):
    """ST005: the result of ``.detach()`` is modified in place.

    ``x.detach()`` is a new tensor that *shares memory* with ``x``: ``y = x.detach();
    y.add_(1)`` (or ``x.detach().zero_()``, ``y[0] = 0``, ``y += 1``) also changes ``x``,
    and autograd then fails with "one of the variables needed for gradient computation has
    been modified by an inplace operation" -- or, worse, silently computes wrong gradients.

    Fix (unsafe, ``--unsafe-fixes``): ``.detach().clone()``, an independent copy: the
    original tensor is no longer modified, which changes behaviour on purpose. Offered only where the
    modified value is used afterwards and the op is not a write-through idiom. A statement
    whose only effect is the write into ``x`` (``x.detach().zero_()`` on its own line,
    ``y = x.detach(); y.copy_(src)``) would become dead code with a clone, so it is reported
    without a fix: write it as ``with torch.no_grad(): x.zero_()`` if the write is intended.
    The ``.detach()`` of a fresh copy (``torch.clone(g).detach()``) shares memory with nothing
    else and is not reported.

    Preview: neither finding on the labelled corpus of real repositories
    (``benchmarks/check_corpus``) was a bug (0 of 2: a write into ``p.grad`` on purpose, a
    clone's detach, now quiet).

    safetorch: ``st.safe_copy``.
    """

    # Opt-in: 0 of 2 findings right on the labelled corpus (benchmarks/check_corpus).
    preview = True
    code = "ST005"

    pitfall_id = "detach-then-inplace"
    name = "detach-then-inplace"
    pitfall = "detach() shares memory; an in-place op on it changes the original tensor"
    safetorch = "st.safe_copy"
    torch_symbols = ("torch.Tensor.detach",)
    fixable = True
    fix_applicability = UNSAFE
    node_types = (ast.Assign, ast.AugAssign, ast.Call, ast.Expr, ast.Name)

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self._bound: Dict[int, Dict[str, _Detached]] = {}  # scope -> name -> binding
        self._mutated: List[_Detached] = []
        self._direct: List[Tuple[ast.Call, str, int, bool]] = []  # detach, op, line, fixable
        self._not_reads: Set[int] = set()  # Name nodes that are the target of a mutation
        self._discarded: Set[int] = set()  # calls whose value is thrown away

    def _binding(self, node: ast.AST) -> Optional[_Detached]:
        if isinstance(node, ast.Name):
            return self._bound.get(id(self.ctx.scope), {}).get(node.id)
        return None

    def _mutation(self, target: ast.AST, op: str, line: int, value_used: bool) -> None:
        """Record ``op`` applied in place to ``target`` (a name or an ``x.detach()`` call)."""
        if _is_detach_call(target):
            if _fresh_copy(self.ctx, target.func.value):  # type: ignore[attr-defined]  # an x.detach() call (_is_detach_call)
                return
            fixable = value_used and op.strip(".()") not in _WRITE_THROUGH
            self._direct.append((target, op, line, fixable))  # type: ignore[arg-type]  # target is an x.detach() ast.Call here (_is_detach_call)
            return
        binding = self._binding(target)
        if binding is not None:
            if not binding.ops:
                self._mutated.append(binding)
            binding.ops.append((op, line))
            self._not_reads.add(id(target))

    def visit(self, node: ast.AST) -> None:
        if isinstance(node, ast.Name):
            if isinstance(node.ctx, ast.Load) and id(node) not in self._not_reads:
                binding = self._binding(node)
                if binding is not None and binding.ops:
                    binding.read_after_write = True
        elif isinstance(node, ast.Expr):
            self._discarded.add(id(node.value))
        elif isinstance(node, ast.Call):
            method = _inplace_method(node)
            if method is not None:
                used = id(node) not in self._discarded
                self._mutation(node.func.value, f".{method}()", node.lineno, used)  # type: ignore[attr-defined]  # _inplace_method returns a name only for an ast.Attribute call
        elif isinstance(node, ast.AugAssign):
            target = node.target
            base = target.value if isinstance(target, ast.Subscript) else target
            self._mutation(base, "augmented assignment", node.lineno, False)
        else:
            assert isinstance(node, ast.Assign)
            bound = self._bound.setdefault(id(self.ctx.scope), {})
            for assigned in node.targets:
                if isinstance(assigned, ast.Subscript):
                    self._mutation(assigned.value, "item assignment", node.lineno, False)
                if bound:
                    for name in _bound_names(assigned):
                        bound.pop(name, None)
            first = node.targets[0]
            if len(node.targets) == 1 and isinstance(first, ast.Name):
                if _is_detach_call(node.value) and not _fresh_copy(
                    self.ctx,
                    node.value.func.value,  # type: ignore[attr-defined]  # an x.detach() call
                ):
                    bound[first.id] = _Detached(node.value)  # type: ignore[arg-type]  # node.value is an ast.Call here (_is_detach_call)

    def _report(self, detach: ast.Call, op: str, line: int, fixable: bool) -> None:
        source = detach.func.value  # type: ignore[attr-defined]  # detach.func is an ast.Attribute (x.detach)
        x = self.ctx.segment(source)
        head = f"{self.ctx.segment(detach)} shares memory with {x} and is modified in place "
        head += f"({op}, line {line}), which changes {x} too"
        if fixable:
            # Unsafe: the original tensor is no longer written, which is the point but is
            # a change of behaviour.
            fix = Fix("add .clone()", (self.ctx.insert_after(detach, ".clone()"),), UNSAFE)
            self.report(detach, head + ": use .detach().clone() or st.safe_copy", fix)
        else:
            self.report(
                detach,
                head + f": if writing into {x} is intended, write it under torch.no_grad() "
                "without detach(); otherwise use .detach().clone() or st.safe_copy",
            )

    def finish(self) -> None:
        for detach, op, line, fixable in self._direct:
            self._report(detach, op, line, fixable)
        for binding in self._mutated:
            op, line = binding.ops[0]
            fixable = binding.read_after_write and not any(
                o.strip(".()") in _WRITE_THROUGH for o, _ in binding.ops
            )
            self._report(binding.call, op, line, fixable)


# ---------------------------------------------------------------------------------------------
# Wall-clock timing of CUDA code
# ---------------------------------------------------------------------------------------------
_TIMERS = frozenset(
    f"time.{n}"
    for n in ("time", "perf_counter", "monotonic", "time_ns", "perf_counter_ns", "monotonic_ns")
)
_SYNC_FUNCS = frozenset(
    {"torch.cuda.synchronize", "torch.accelerator.synchronize", "torch.cuda.Event.synchronize"}
)
# Methods that wait for the GPU: an explicit synchronize, or a copy of a result to the host.
_SYNC_METHODS = frozenset({"synchronize", "item", "cpu", "tolist", "numpy", "elapsed_time"})
# Calls that never launch GPU work.
_NOT_WORK = frozenset(
    {"print", "len", "range", "str", "int", "float", "format", "isinstance", "enumerate", "zip"}
)


# Methods that launch device work on a model, tensor or optimizer.
_WORK_METHODS = frozenset({"backward", "step", "forward", "cuda", "to", "zero_grad"})
# torch.* calls that launch no kernels (queries, modes, I/O that syncs on its own).
_NOT_COMPUTE = (
    "torch.cuda.",
    "torch.backends.",
    "torch.no_grad",
    "torch.enable_grad",
    "torch.set_grad_enabled",
    "torch.inference_mode",
    "torch.manual_seed",
    "torch.save",
    "torch.load",
    "torch.device",
    "torch.utils.",
    "torch.distributed.",
)


def _is_device_move(node: ast.AST) -> bool:
    """``x.cuda()`` or ``x.to(...)`` (a call)."""
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in ("cuda", "to")
    )


def _is_cuda_marker(node: ast.AST) -> bool:
    """``x.cuda()``, ``torch.cuda.*``, ``"cuda"`` / ``"cuda:0"``."""
    if isinstance(node, ast.Attribute):
        return node.attr == "cuda"
    return (
        isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and (node.value.startswith("cuda"))
    )


def _root_name(node: ast.AST) -> Optional[str]:
    """``model`` for ``model``, ``model.encoder``, ``self.model`` -> ``self.model``."""
    attr = _self_attr(node)
    if attr is not None:
        return "self." + attr
    while isinstance(node, ast.Attribute):
        if _self_attr(node) is not None:
            return "self." + node.attr
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


class _Interval:
    """The events of one function in source order, for ST006's dataflow (one per scope)."""

    __slots__ = ("defs", "uses", "pairs", "work", "syncs", "loops")

    def __init__(self) -> None:
        self.defs: Dict[str, List[Tuple[Pos, ast.Call]]] = {}  # var -> timer readings bound
        self.uses: List[Tuple[str, Pos, ast.Call]] = []  # time.x() - var
        self.pairs: List[Tuple[str, str]] = []  # end_var - start_var
        self.work: List[Pos] = []
        self.syncs: List[Pos] = []
        self.loops: List[Tuple[Pos, Pos]] = []  # (start, end) of each loop body


Pos = Tuple[int, int]


def _pos(node: ast.AST) -> Pos:
    return node.lineno, node.col_offset  # type: ignore[attr-defined]  # ast.AST has no position attributes in typeshed; callers pass stmt/expr nodes


def _end_pos(node: ast.AST) -> Pos:
    return node.end_lineno, node.end_col_offset  # type: ignore[attr-defined]  # ast.AST has no position attributes in typeshed; callers pass stmt/expr nodes


def _var_key(node: ast.AST) -> Optional[str]:
    """``t0`` or ``self.t0``: a variable a clock reading can be kept in."""
    if isinstance(node, ast.Name):
        return node.id
    attr = _self_attr(node)
    return None if attr is None else "self." + attr


def _looks_like_device(node: ast.AST) -> bool:
    """``"cuda:0"``, ``torch.device(...)``, ``device``, ``args.device``, ``local_rank``."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str) and node.value.startswith(("cuda", "cpu", "mps"))
    if isinstance(node, ast.Call):
        func = node.func
        return isinstance(func, ast.Attribute) and func.attr == "device"
    name = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")
    name = name.lower()
    return "device" in name or "gpu" in name or name in ("dev", "rank", "local_rank")


def _is_blocking_copy(node: ast.Call) -> bool:
    """``x.cuda()`` / ``x.to(device)`` without ``non_blocking=True``."""
    func = node.func
    if not isinstance(func, ast.Attribute) or func.attr not in ("cuda", "to"):
        return False
    flag = _keyword(node, "non_blocking")
    if flag is not None:
        return _is_const(flag.value, False)
    if func.attr == "cuda":
        return len(node.args) < 2
    if _keyword(node, "device") is not None:
        return True
    if not node.args or len(node.args) > 2:
        return False
    return _looks_like_device(node.args[0])


def _prints_a_value(node: ast.Call) -> bool:
    """``print(loss)`` / ``print(f"{loss}")``: formatting a tensor copies it to the host."""
    for arg in node.args:
        values = arg.values if isinstance(arg, ast.JoinedStr) else [arg]
        for value in values:
            if isinstance(value, ast.FormattedValue):
                value = value.value
            if not isinstance(value, ast.Constant):
                return True
    return False


class UnsyncedCudaTiming(Rule):
    """ST006: wall-clock timing of CUDA code without ``torch.cuda.synchronize()``.

    CUDA kernels run asynchronously: ``time.time()`` / ``time.perf_counter()`` /
    ``time.monotonic()`` read after launching GPU work measure the launch, not the work.

    The rule follows each interval through the function's dataflow: a reading bound to a
    variable (``t0 = time.time()``) starts an interval, and ``time.time() - t0`` (or
    ``t1 - t0``) ends it. It reports the end reading only when, between the two readings of
    that interval, CUDA work is launched (a call on a model or tensor the code moved to CUDA,
    ``.backward()``, ``optimizer.step()``, ``torch.*`` compute, in a function that uses
    CUDA) and nothing waits for the GPU: ``torch.cuda.synchronize()``, an event's or stream's
    ``.synchronize()``, a host copy (``.item()``, ``.cpu()``, ``.tolist()``, ``.numpy()``,
    ``float(t)``), printing a value, a blocking copy to the device (``x.cuda()``,
    ``x.to(device)`` without ``non_blocking=True``), or a call of a function of the file
    that does one of these itself (one level, ``validate(...)``, ``self.log_step()``). Loops are understood: an interval that spans the
    iteration boundary (``prev = time.time()`` at the end of the body, ``time.time() - prev``
    at the top) is per-iteration timing, correct on average when the loop body syncs
    anywhere (an ETA line in a loop that logs ``loss.item()``), and so is a cumulative reading
    in a loop against a start before it (``time.time() - start_time`` for an ETA); data-loading
    intervals (from the end of one iteration to the top of the next) launch no CUDA work.

    Fix (manual): call ``torch.cuda.synchronize()`` before the second reading, or time with
    CUDA events.

    Preview: 4 of 8 findings (50%) were right on the labelled corpus of real repositories
    (``benchmarks/check_corpus``); the others time whole trainings or exports, whose
    iterations save, validate and log values (they synchronize) out of its sight.

    safetorch: ``st.cuda_timer`` (events, synchronizes once at the end).
    """

    # Opt-in: 4 of 8 findings right on the labelled corpus (benchmarks/check_corpus).
    preview = True
    code = "ST006"

    pitfall_id = "unsynced-cuda-timing"
    name = "unsynced-cuda-timing"
    pitfall = "CUDA is asynchronous; wall-clock readings without synchronize time the launch"
    safetorch = "st.cuda_timer"
    torch_symbols = tuple(sorted(_TIMERS))
    node_types = (
        ast.Call,
        ast.Constant,
        ast.Attribute,
        ast.Assign,
        ast.BinOp,
        ast.For,
        ast.AsyncFor,
        ast.While,
    )

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self._cuda_scopes: Set[int] = set()
        self._any_timer = False
        self._scopes: Dict[int, _Interval] = {}
        self._work_calls: Dict[int, List[Tuple[Pos, ast.Call]]] = {}  # judged in finish()
        self._local_calls: Dict[int, List[Tuple[Pos, str]]] = {}  # f(...) / self.f(...)

    def _events(self) -> _Interval:
        key = id(self.ctx.scope)
        found = self._scopes.get(key)
        if found is None:
            found = self._scopes[key] = _Interval()
        return found

    def _is_timer(self, node: ast.AST) -> bool:
        return isinstance(node, ast.Call) and self.ctx.qualname(node.func) in _TIMERS

    def visit(self, node: ast.AST) -> None:
        if isinstance(node, ast.Call):
            self._visit_call(node)
        elif isinstance(node, ast.Assign):
            if len(node.targets) == 1 and self._is_timer(node.value):
                key = _var_key(node.targets[0])
                if key is not None:
                    events = self._events()
                    events.defs.setdefault(key, []).append((_end_pos(node.value), node.value))  # type: ignore[arg-type]  # node.value of an ast.Assign is an expr, never None
        elif isinstance(node, ast.BinOp):
            if not isinstance(node.op, ast.Sub):
                return
            start = _var_key(node.right)
            if start is None:
                return
            if self._is_timer(node.left):
                self._events().uses.append((start, _end_pos(node.left), node.left))  # type: ignore[arg-type]  # node.left of an ast.BinOp is an expr, never None
            else:
                end = _var_key(node.left)
                if end is not None:
                    self._events().pairs.append((end, start))
        elif isinstance(node, (ast.For, ast.AsyncFor, ast.While)):
            self._events().loops.append((_pos(node.body[0]), _end_pos(node.body[-1])))
        elif _is_cuda_marker(node):
            self._cuda_scopes.add(id(self.ctx.scope))

    def _visit_call(self, node: ast.Call) -> None:
        func = node.func
        qual = self.ctx.qualname(func)
        if qual in _TIMERS:
            self._any_timer = True
            return
        if qual in _SYNC_FUNCS or (isinstance(func, ast.Attribute) and func.attr in _SYNC_METHODS):
            self._events().syncs.append(_end_pos(node))
            return
        if _is_blocking_copy(node):
            # A copy without non_blocking=True waits for the GPU (a host-to-device copy from
            # pageable memory synchronizes the stream before it starts).
            self._events().syncs.append(_end_pos(node))
            return
        callee = _var_key(func)
        if callee is not None and (qual is None or qual == callee):
            self._local_calls.setdefault(id(self.ctx.scope), []).append((_end_pos(node), callee))
        if isinstance(func, ast.Name):
            if func.id == "print" and _prints_a_value(node):
                self._events().syncs.append(_end_pos(node))
                return
            if func.id in ("float", "int", "bool") and node.args:
                if not isinstance(node.args[0], ast.Constant):
                    self._events().syncs.append(_end_pos(node))
                return
            if func.id in _NOT_WORK:
                return
        self._work_calls.setdefault(id(self.ctx.scope), []).append((_end_pos(node), node))

    # -- which calls launch CUDA work --------------------------------------------------------
    def _cuda_names(self) -> Set[str]:
        """Names (and ``self.x``) the file binds to something on CUDA.

        ``model = Net().cuda()``, ``x = x.to(device)`` (in a file that mentions CUDA),
        ``model.cuda()`` / ``model.to(device)`` as a statement.
        """
        names = self.ctx.cache.get("cuda_names")
        if names is None:
            names = set()
            for node in walk_nodes(self.ctx.tree):
                if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                    if any(_is_device_move(n) for n in walk_nodes(node.value)):
                        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                        for target in targets:
                            for sub in walk_nodes(target):
                                root = _root_name(sub)
                                if root is not None and isinstance(sub, (ast.Name, ast.Attribute)):
                                    names.add(root)
                elif isinstance(node, ast.Expr) and _is_device_move(node.value):
                    root = _root_name(node.value.func.value)  # type: ignore[attr-defined]  # _is_device_move accepts only x.to(...)-style ast.Call on an ast.Attribute
                    if root is not None:
                        names.add(root)
            self.ctx.cache["cuda_names"] = names
        return names

    def _launches_cuda_work(self, call: ast.Call, cuda_scope: bool) -> bool:
        func = call.func
        names = self._cuda_names()
        for part in (func, *call.args, *(k.value for k in call.keywords)):
            if _root_name(part) in names:
                return True
        if not cuda_scope:
            return False
        if isinstance(func, ast.Attribute) and func.attr in _WORK_METHODS:
            return True
        qual = self.ctx.qualname(func) or ""
        return qual.startswith("torch.") and not qual.startswith(_NOT_COMPUTE)

    # -- judging ---------------------------------------------------------------------------
    def _syncing_functions(self) -> Set[str]:
        """Functions of this file (``f``, and methods as ``self.f``) whose own body waits for
        the GPU: a call to one is a synchronization point one level up."""
        names: Set[str] = set()
        for node in walk_nodes(self.ctx.tree):
            if not isinstance(node, _FUNCTIONS):
                continue
            events = self._scopes.get(id(node))
            if events is not None and events.syncs:
                params = node.args.posonlyargs + node.args.args
                method = bool(params) and params[0].arg == "self"
                names.add(("self." if method else "") + node.name)
        return names

    def finish(self) -> None:
        if not self._any_timer:
            return
        syncing = self._syncing_functions() if self._local_calls else set()
        for scope, calls in self._local_calls.items():
            events = self._scopes.get(scope)
            for pos, name in calls:
                if name in syncing and events is not None:
                    events.syncs.append(pos)
        for scope, events in self._scopes.items():
            if not events.defs:
                continue
            cuda_scope = scope in self._cuda_scopes
            events.work = [
                pos
                for pos, call in self._work_calls.get(scope, [])
                if self._launches_cuda_work(call, cuda_scope)
            ]
            if not events.work:
                continue
            ends = list(events.uses)
            for end_var, start_var in events.pairs:
                for pos, call in events.defs.get(end_var, []):
                    ends.append((start_var, pos, call))
            reported: Set[int] = set()
            for start_var, pos, call in ends:
                start = self._unsynced_start(events, start_var, pos)
                if start is not None and id(call) not in reported:
                    reported.add(id(call))
                    self.report(
                        call,
                        f"{self.ctx.qualname(call.func)}() ends an interval started at line "
                        f"{start[0]} with CUDA work launched in between and nothing waiting "
                        "for the GPU: it times the kernel launch, not the kernels; call "
                        "torch.cuda.synchronize() first or use st.cuda_timer",
                    )

    def _unsynced_start(self, events: _Interval, var: str, end: Pos) -> Optional[Pos]:
        """Where the interval ending at ``end`` started, when it is unsynchronized CUDA work."""
        defs = [pos for pos, _ in events.defs.get(var, [])]
        # Innermost loop around the end reading whose body rebinds the start after it: the
        # interval wraps around the iteration boundary (per-iteration timing).
        around = [lp for lp in events.loops if lp[0] <= end <= lp[1]]
        for lo, hi in sorted(around, key=lambda lp: lp[0], reverse=True):
            later = [d for d in defs if end < d <= hi]
            if not later:
                continue
            if any(lo <= d < end for d in defs):
                break  # rebound earlier in the same iteration: a straight interval
            start = max(later)
            if any(lo <= s <= hi for s in events.syncs):
                return None  # the loop syncs every iteration: correct on average
            if any(start < w <= hi or lo <= w < end for w in events.work):
                return start
            return None
        before = [d for d in defs if d < end]
        if not before:
            return None
        start = max(before)
        work = [w for w in events.work if start < w < end]
        if not work:
            return None
        # Synchronized when something waits for the GPU after the last work is launched (a
        # copy at the start, as in model(x.cuda()), waits only for what came before it).
        last = max(work)
        if any(last <= s < end for s in events.syncs):
            return None
        for lo, hi in around:
            # Read in a loop against a start before it (a since-start ETA): off by at most
            # the unsynchronized tail of one iteration when the loop body syncs anywhere.
            if start < lo and any(lo <= s <= hi for s in events.syncs):
                return None
        return start


# ---------------------------------------------------------------------------------------------
# argparse positional with default=
# ---------------------------------------------------------------------------------------------
class PositionalWithDefault(Rule):
    """ST007: an argparse positional argument with ``default=`` but no ``nargs="?"``.

    A positional argument is required unless ``nargs`` is ``"?"`` or ``"*"``, whatever its
    ``default``: ``parser.add_argument("configs", default="a.yaml")`` still fails with
    ``error: the following arguments are required: configs`` when it is left out.

    Fix (automatic, safe): add ``nargs="?"``, which makes the argument optional and uses the
    default when it is missing. Every command line that worked before means the same.

    safetorch: none (a plain argparse pitfall, common in training scripts).
    """

    code = "ST007"

    pitfall_id = "positional-with-default"
    name = "positional-with-default"
    pitfall = "a positional argparse argument with default= is still required"
    safetorch = None
    torch_symbols = ()
    fixable = True
    node_types = (ast.Call,)

    def visit(self, node: ast.Call) -> None:
        func = node.func
        if not (isinstance(func, ast.Attribute) and func.attr == "add_argument"):
            return
        if len(node.args) != 1 or _has_double_star(node):
            return
        first = node.args[0]
        if not (isinstance(first, ast.Constant) and isinstance(first.value, str)):
            return
        dest = first.value
        if not dest or dest[0] in "-+" or _keyword(node, "default") is None:
            return
        action = _keyword(node, "action")
        if action is not None and not (
            isinstance(action.value, ast.Constant) and action.value.value == "store"
        ):
            return
        nargs = _keyword(node, "nargs")
        fix = None
        if nargs is None:
            edit = _add_keywords(self.ctx, node, 'nargs="?"')
            fix = None if edit is None else Fix('add nargs="?"', (edit,))
        elif not isinstance(nargs.value, ast.Constant) or nargs.value.value in ("?", "*"):
            return
        self.report(
            node,
            f'positional argument "{dest}" has default= but is still required '
            f'("the following arguments are required: {dest}"): add nargs="?"',
            fix,
        )


# ---------------------------------------------------------------------------------------------
# Layer order: bias before BN, Dropout before BN
# ---------------------------------------------------------------------------------------------
# layer -> index of the positional ``bias`` parameter
_BIASED: Dict[str, int] = {
    **{f"{_NN}Conv{d}d": 7 for d in (1, 2, 3)},
    **{f"{_NN}ConvTranspose{d}d": 7 for d in (1, 2, 3)},
    **{f"{_NN}LazyConv{d}d": 6 for d in (1, 2, 3)},
    **{f"{_NN}LazyConvTranspose{d}d": 6 for d in (1, 2, 3)},
    _NN + "Linear": 2,
    _NN + "LazyLinear": 1,
}
_BATCHNORMS: FrozenSet[str] = frozenset(
    [f"{_NN}BatchNorm{d}d" for d in (1, 2, 3)]
    + [f"{_NN}LazyBatchNorm{d}d" for d in (1, 2, 3)]
    + [_NN + "SyncBatchNorm"]
)
_DROPOUTS: FrozenSet[str] = frozenset(
    [_NN + "Dropout", _NN + "AlphaDropout", _NN + "FeatureAlphaDropout"]
    + [f"{_NN}Dropout{d}d" for d in (1, 2, 3)]
)


def _self_attr(node: ast.AST) -> Optional[str]:
    if (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
    ):
        return node.attr
    return None


_NORM_WORDS = ("BatchNorm", "SyncBatchNorm")
# Sentinels among a layer's followers: the sequence ends there / something we cannot see.
_END = "end of the sequence"
_OPAQUE = "something the checker cannot see"
# List methods that reorder or drop layers: after them a list's order is unknown.
_LIST_SCRAMBLERS = frozenset({"insert", "pop", "remove", "reverse", "sort", "clear"})
_Fn = Union[ast.FunctionDef, ast.AsyncFunctionDef]
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)


class _Layer:
    """One layer constructor call the flow found (``nn.Conv2d(...)``, ``norm_layer(c)``).

    ``direct`` is False when the call was reached through a variable or a helper function
    that returns one layer: it may be used elsewhere too, so a fix there is not offered.
    """

    __slots__ = ("call", "kind", "direct", "fn")

    def __init__(self, call: ast.Call, kind: str, direct: bool, fn: Optional[_Fn]) -> None:
        self.call = call
        self.kind = kind
        self.direct = direct
        self.fn = fn  # the function whose body holds the call (None: module level)


_Item = Union[_Layer, str]


def _item_key(item: _Item) -> object:
    return id(item.call) if isinstance(item, _Layer) else item


def _unique(items: Iterable[_Item]) -> List[_Item]:
    seen: Dict[object, _Item] = {}
    for item in items:
        seen.setdefault(_item_key(item), item)
    return list(seen.values())


def _edge_key(item: _Item) -> object:
    return (id(item.call), item.direct) if isinstance(item, _Layer) else item


def _unique_edges(edges: Iterable[Tuple[_Item, _Item]]) -> List[Tuple[_Item, _Item]]:
    """Each (layer, next item) pair once: the branches of an ``if`` and the two readings of
    a loop body share the edges made before them, which doubled per branch without this
    (nested ``if``s in a long function grew the list exponentially)."""
    seen: Dict[object, Tuple[_Item, _Item]] = {}
    for a, b in edges:
        seen.setdefault((_edge_key(a), _edge_key(b)), (a, b))
    return list(seen.values())


class _Seq:
    """What a list of layers may look like: its possible first and last items, whether it may
    be empty, and every (layer, next item) pair it may contain."""

    __slots__ = ("firsts", "lasts", "edges", "empty")

    def __init__(
        self,
        firsts: Sequence[_Item] = (),
        lasts: Sequence[_Item] = (),
        edges: Sequence[Tuple[_Item, _Item]] = (),
        empty: bool = False,
    ) -> None:
        self.firsts = list(firsts)
        self.lasts = list(lasts)
        self.edges = list(edges)
        self.empty = empty

    @staticmethod
    def one(item: _Item) -> "_Seq":
        return _Seq([item], [item])

    def then(self, other: "_Seq") -> "_Seq":
        """This sequence followed by ``other``."""
        edges = _unique_edges(
            self.edges + other.edges + [(a, b) for a in self.lasts for b in other.firsts]
        )
        firsts = self.firsts + (other.firsts if self.empty else [])
        lasts = other.lasts + (self.lasts if other.empty else [])
        return _Seq(_unique(firsts), _unique(lasts), edges, self.empty and other.empty)

    def either(self, other: "_Seq") -> "_Seq":
        """One of the two (after an ``if``, or a loop that may not run)."""
        return _Seq(
            _unique(self.firsts + other.firsts),
            _unique(self.lasts + other.lasts),
            _unique_edges(self.edges + other.edges),
            self.empty or other.empty,
        )

    def as_indirect(self) -> "_Seq":
        """The same layers, marked as reached through a name (no fix edits them)."""

        def indirect(item: _Item) -> _Item:
            if isinstance(item, _Layer) and item.direct:
                return _Layer(item.call, item.kind, False, item.fn)
            return item

        return _Seq(
            [indirect(i) for i in self.firsts],
            [indirect(i) for i in self.lasts],
            [(indirect(a), indirect(b)) for a, b in self.edges],
            self.empty,
        )


_OPAQUE_SEQ = _Seq([_OPAQUE], [_OPAQUE])
# A name's value while the flow reads a function: (holds a list of layers, its sequence).
_Env = Dict[str, Tuple[bool, _Seq]]


def _merge_envs(base: _Env, *branches: _Env) -> _Env:
    merged: _Env = {}
    for name in set(base).union(*branches):
        values = [b.get(name, base.get(name)) for b in branches]
        known = [v for v in values if v is not None]
        if not known or any(v[0] != known[0][0] for v in known):
            continue  # bound to different kinds of things: forget it
        seq = known[0][1]
        for _, other in known[1:]:
            seq = seq.either(other)
        merged[name] = (known[0][0], seq)
    return merged


def _own_expressions(stmt: ast.stmt) -> List[ast.AST]:
    """The expressions of a statement itself (not of nested blocks, functions, classes)."""
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return []
    own: List[ast.AST] = []
    for name, value in ast.iter_fields(stmt):
        if name in ("body", "orelse", "finalbody", "handlers", "cases"):
            continue
        if isinstance(value, list):
            own.extend(v for v in value if isinstance(v, ast.AST))
        elif isinstance(value, ast.AST):
            own.append(value)
    return own


class _LayerFlow:
    """Which layers a file applies one right after the other, following the layer lists.

    Lists are followed through ``layers = [...]``, ``layers += [...]``, ``.append``,
    ``.extend``, ``if``/``else`` and loops (each branch and iteration counted), helper
    functions that return a list or one layer (``*block(...)``, ``conv3x3(...)``), variables
    holding a layer, and class aliases from parameter defaults (``norm_layer=nn.BatchNorm2d``),
    into ``nn.Sequential(*layers)`` and into the ``self.<a>`` / ``self.<b>`` layers ``forward``
    applies back to back. The result is, for each layer, every item that may follow it.
    """

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.followers: Dict[int, List[_Item]] = {}  # id(layer call) -> what may follow it
        self.layers: Dict[int, _Layer] = {}
        self.parent: Dict[int, ast.AST] = {}  # function or class -> its enclosing scope
        self.functions: List[_Fn] = []
        self.classes: List[ast.ClassDef] = []
        self._returns: Dict[int, Optional[Tuple[bool, _Seq]]] = {}
        self._attrs: Dict[Tuple[int, str], _Seq] = {}  # (class, attr) -> layer(s) it holds
        self._aliases: Dict[Tuple[int, str], Optional[str]] = {}
        self._index_scopes(ctx.tree)
        self._flow_scope(ctx.tree, None)
        for fn in self.functions:
            self._flow_function(fn)
        for cls in self.classes:
            self._forward_edges(cls)

    # -- the file's functions and classes --------------------------------------------------
    def _index_scopes(self, tree: ast.Module) -> None:
        # From the file's pre-order node list (no second traversal): a scope encloses the
        # nodes up to the end of its own subtree.
        enclosing: List[Tuple[ast.AST, int]] = [(tree, 1 << 62)]
        for i, node in enumerate(walk_nodes(tree)):
            while i >= enclosing[-1][1]:
                enclosing.pop()
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                self.parent[id(node)] = enclosing[-1][0]
                if isinstance(node, ast.ClassDef):
                    self.classes.append(node)
                else:
                    self.functions.append(node)
                enclosing.append((node, i + len(walk_nodes(node))))

    def _enclosing(self, fn: Optional[ast.AST]) -> Iterator[ast.AST]:
        """``fn`` and the scopes around it, innermost first (the module last)."""
        while fn is not None:
            yield fn
            fn = self.parent.get(id(fn))
        yield self.ctx.tree

    def _class_of(self, fn: Optional[ast.AST]) -> Optional[ast.ClassDef]:
        for scope in self._enclosing(fn):
            if isinstance(scope, ast.ClassDef):
                return scope
        return None

    def _helper(self, func: ast.AST, fn: Optional[_Fn]) -> Optional[_Fn]:
        """The function of this file that a call's callee names (``block``, ``self._make``)."""
        attr = _self_attr(func)
        if attr is not None:
            cls = self._class_of(fn)
            for stmt in cls.body if cls is not None else ():
                if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) and stmt.name == attr:
                    return stmt
            return None
        if not isinstance(func, ast.Name) or func.id in self.ctx.imports:
            return None
        for scope in self._enclosing(fn):
            for stmt in getattr(scope, "body", ()):
                if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) and (
                    stmt.name == func.id
                ):
                    return stmt
        return None

    # -- what a name or call stands for ----------------------------------------------------
    def kind(self, func: ast.AST, fn: Optional[_Fn]) -> Optional[str]:
        """The torch layer class a call's callee names, through imports and class aliases."""
        qual = self.ctx.qualname(func)
        if qual is not None:
            return qual
        if isinstance(func, ast.Name):
            for scope in self._enclosing(fn):
                key = (id(scope), func.id)
                if key not in self._aliases:
                    self._aliases[key] = self._alias_in(scope, func.id)
                found = self._aliases[key]
                if found is not None:
                    return found or None
        return None

    def _alias_in(self, scope: ast.AST, name: str) -> Optional[str]:
        """``norm_layer`` -> ``torch.nn.BatchNorm2d`` from ``norm_layer=nn.BatchNorm2d`` (a
        parameter default) or ``norm_layer = nn.BatchNorm2d`` in ``scope``; "" when the name
        is bound there to something else, None when it is not bound there."""
        values: List[ast.AST] = []
        args = getattr(scope, "args", None)
        if args is not None:
            positional = [*args.posonlyargs, *args.args]
            defaults: List[Optional[ast.expr]] = [None] * (
                len(positional) - len(args.defaults)
            ) + list(args.defaults)
            pairs = list(zip(positional, defaults)) + list(zip(args.kwonlyargs, args.kw_defaults))
            for arg, default in pairs:
                if arg.arg == name:
                    values.append(default if default is not None else ast.Constant(None))
        body = getattr(scope, "body", [])
        for stmt in _statements_in_order(body):
            if isinstance(stmt, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == name for t in stmt.targets
            ):
                values.append(stmt.value)
        if not values:
            return None
        found: Set[str] = set()
        for value in values:
            if _is_const(value, None):
                continue
            qual = self.ctx.qualname(value)
            if isinstance(value, ast.Call) and (self.ctx.qualname(value.func) or "").endswith(
                "functools.partial"
            ):
                qual = self.ctx.qualname(value.args[0]) if value.args else None
            if qual is None or not qual.startswith(_NN):
                return ""
            found.add(qual)
        return found.pop() if len(found) == 1 else ""

    def _layer_call(self, call: ast.Call, fn: Optional[_Fn], direct: bool) -> Optional[_Layer]:
        kind = self.kind(call.func, fn)
        if kind is None or not kind.startswith(_NN):
            return None
        last = kind.rsplit(".", 1)[1]
        if not last[:1].isupper() or kind == _NN + "Sequential":
            return None
        layer = _Layer(call, kind, direct, fn)
        self.layers.setdefault(id(call), layer)
        return layer

    def item(self, expr: ast.AST, env: _Env, fn: Optional[_Fn]) -> _Seq:
        """The layers one element of a layer list contributes (usually one)."""
        if isinstance(expr, ast.Starred):
            return self.sequence(expr.value, env, fn)
        if isinstance(expr, ast.Call):
            if self.kind(expr.func, fn) == _NN + "Sequential":
                return self._sequential(expr, env, fn)
            layer = self._layer_call(expr, fn, True)
            if layer is not None:
                return _Seq.one(layer)
            helper = self._helper(expr.func, fn)
            returned = None if helper is None else self._flow_function(helper)
            if returned is not None and not returned[0]:
                return returned[1].as_indirect()
            return _OPAQUE_SEQ
        if isinstance(expr, ast.Name):
            bound = env.get(expr.id)
            if bound is not None and not bound[0]:
                return bound[1].as_indirect()
        return _OPAQUE_SEQ

    def sequence(self, expr: ast.AST, env: _Env, fn: Optional[_Fn]) -> _Seq:
        """The layers a list-valued expression holds, in order."""
        if isinstance(expr, (ast.List, ast.Tuple)):
            seq = _Seq(empty=True)
            for elt in expr.elts:
                seq = seq.then(self.item(elt, env, fn))
            return seq
        if isinstance(expr, ast.Name):
            bound = env.get(expr.id)
            return bound[1] if bound is not None and bound[0] else _OPAQUE_SEQ
        if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Add):
            return self.sequence(expr.left, env, fn).then(self.sequence(expr.right, env, fn))
        if isinstance(expr, ast.Call):
            qual = self.ctx.qualname(expr.func) or ""
            name = expr.func.id if isinstance(expr.func, ast.Name) else ""
            if name in ("list", "tuple") or qual == _NN + "ModuleList":
                if not expr.args:
                    return _Seq(empty=True)
                return self.sequence(expr.args[0], env, fn)
            helper = self._helper(expr.func, fn)
            returned = None if helper is None else self._flow_function(helper)
            if returned is not None and returned[0]:
                return returned[1]
        return _OPAQUE_SEQ

    def _value(self, expr: ast.AST, env: _Env, fn: Optional[_Fn]) -> Optional[Tuple[bool, _Seq]]:
        """(is a list, layers) for a value bound to a name or returned; None if neither."""
        if isinstance(expr, (ast.List, ast.Tuple, ast.BinOp)):
            seq = self.sequence(expr, env, fn)
            return None if seq is _OPAQUE_SEQ else (True, seq)
        if isinstance(expr, ast.Name):
            return env.get(expr.id)
        if isinstance(expr, ast.Call):
            name = expr.func.id if isinstance(expr.func, ast.Name) else ""
            if name in ("list", "tuple") or self.ctx.qualname(expr.func) == _NN + "ModuleList":
                return True, self.sequence(expr, env, fn)
            one = self.item(expr, env, fn)
            if one is not _OPAQUE_SEQ:
                return False, one
            seq = self.sequence(expr, env, fn)
            if seq is not _OPAQUE_SEQ:
                return True, seq
        return None

    # -- nn.Sequential and forward ---------------------------------------------------------
    def _sequential(self, call: ast.Call, env: _Env, fn: Optional[_Fn]) -> _Seq:
        """The layers of ``nn.Sequential(...)``; its pairs are recorded (it ends there)."""
        args: List[ast.AST] = list(call.args)
        if len(call.args) == 1 and isinstance(call.args[0], ast.Call):
            inner = call.args[0]
            if (self.ctx.qualname(inner.func) or "").endswith("OrderedDict") and inner.args:
                items = inner.args[0]
                if isinstance(items, (ast.List, ast.Tuple)):
                    args = [
                        e.elts[1]
                        for e in items.elts
                        if isinstance(e, (ast.Tuple, ast.List)) and len(e.elts) == 2
                    ]
        seq = _Seq(empty=True)
        for arg in args:
            seq = seq.then(self.item(arg, env, fn))
        self._record(seq.then(_Seq.one(_END)))
        return seq

    def _record(self, seq: _Seq) -> None:
        for a, b in seq.edges:
            if isinstance(a, _Layer):
                found = self.followers.setdefault(id(a.call), [])
                if all(_item_key(f) != _item_key(b) for f in found):
                    found.append(b)
                known = self.layers.get(id(a.call))
                if known is None or (known.direct and not a.direct):
                    self.layers[id(a.call)] = a  # indirect anywhere: indirect

    def _forward_edges(self, cls: ast.ClassDef) -> None:
        for a_name, b_name in _forward_pairs(cls):
            a = self._attrs.get((id(cls), a_name))
            b = self._attrs.get((id(cls), b_name))
            if a is not None and b is not None:
                self._record(_Seq(a.lasts, a.lasts).then(_Seq(b.firsts, b.firsts)))

    # -- reading one function top to bottom ------------------------------------------------
    def _flow_function(self, fn: _Fn) -> Optional[Tuple[bool, _Seq]]:
        """Read ``fn`` once (memoized); return what it returns, if a layer or a layer list."""
        key = id(fn)
        if key in self._returns:
            return self._returns[key]
        self._returns[key] = None  # recursion guard
        returned = self._flow_scope(fn, fn)
        self._returns[key] = returned
        return returned

    def _flow_scope(self, scope: ast.AST, fn: Optional[_Fn]) -> Optional[Tuple[bool, _Seq]]:
        returns: List[Tuple[bool, _Seq]] = []
        self._flow(getattr(scope, "body", []), {}, fn, returns)
        if not returns or any(r[0] != returns[0][0] for r in returns):
            return None
        seq = returns[0][1]
        for _, other in returns[1:]:
            seq = seq.either(other)
        return returns[0][0], seq

    def _flow(
        self,
        body: Sequence[ast.stmt],
        env: _Env,
        fn: Optional[_Fn],
        returns: List[Tuple[bool, _Seq]],
    ) -> _Env:
        for stmt in body:
            for expr in _own_expressions(stmt):
                for sub in walk_nodes(expr):
                    if isinstance(sub, ast.Call) and self.kind(sub.func, fn) == _NN + "Sequential":
                        self._sequential(sub, env, fn)
            if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and stmt.value is not None:
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                value = self._value(stmt.value, env, fn)
                for target in targets:
                    self._bind(target, value, env, fn)
            elif isinstance(stmt, ast.AugAssign) and isinstance(stmt.target, ast.Name):
                bound = env.get(stmt.target.id)
                if bound is not None and bound[0] and isinstance(stmt.op, ast.Add):
                    env[stmt.target.id] = (True, bound[1].then(self.sequence(stmt.value, env, fn)))
                else:
                    env.pop(stmt.target.id, None)
            elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
                self._list_method(stmt.value, env, fn)
            elif isinstance(stmt, ast.Return) and stmt.value is not None:
                value = self._value(stmt.value, env, fn)
                if value is not None:
                    returns.append(value)
            elif isinstance(stmt, ast.If):
                taken = self._flow(stmt.body, dict(env), fn, returns)
                other = self._flow(stmt.orelse, dict(env), fn, returns)
                env = _merge_envs(env, taken, other)
            elif isinstance(stmt, (ast.For, ast.AsyncFor, ast.While)):
                once = self._flow(stmt.body, dict(env), fn, returns)
                again = self._flow(stmt.body, _merge_envs(env, once), fn, returns)
                env = _merge_envs(env, again)
                env = self._flow(stmt.orelse, env, fn, returns)
            elif isinstance(stmt, (ast.With, ast.AsyncWith)):
                env = self._flow(stmt.body, env, fn, returns)
            elif isinstance(stmt, ast.Try):
                env = self._flow(stmt.body, env, fn, returns)
                env = self._flow(stmt.orelse, env, fn, returns)
                env = self._flow(stmt.finalbody, env, fn, returns)
        return env

    def _bind(
        self, target: ast.AST, value: Optional[Tuple[bool, _Seq]], env: _Env, fn: Optional[_Fn]
    ) -> None:
        if isinstance(target, ast.Name):
            if value is None:
                env.pop(target.id, None)
            else:
                env[target.id] = value
            return
        attr = _self_attr(target)
        cls = self._class_of(fn)
        if attr is not None and cls is not None:
            if value is not None and not value[0]:
                self._attrs[(id(cls), attr)] = value[1]
            else:
                self._attrs.pop((id(cls), attr), None)
        for name in _bound_names(target):
            env.pop(name, None)

    def _list_method(self, call: ast.Call, env: _Env, fn: Optional[_Fn]) -> None:
        func = call.func
        if not (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name)):
            return
        name = func.value.id
        bound = env.get(name)
        if bound is None or not bound[0]:
            return
        if func.attr == "append" and len(call.args) == 1:
            env[name] = (True, bound[1].then(self.item(call.args[0], env, fn)))
        elif func.attr == "extend" and len(call.args) == 1:
            env[name] = (True, bound[1].then(self.sequence(call.args[0], env, fn)))
        elif func.attr in _LIST_SCRAMBLERS:
            env[name] = (True, _OPAQUE_SEQ)


def _forward_pairs(cls: ast.ClassDef) -> List[Tuple[str, str]]:
    """Pairs of ``self.<a>``, ``self.<b>`` layers that ``forward`` applies back to back."""
    forward = next(
        (s for s in cls.body if isinstance(s, ast.FunctionDef) and s.name == "forward"), None
    )
    if forward is None:
        return []
    pairs: List[Tuple[str, str]] = []
    for node in walk_nodes(forward):
        # self.b(self.a(x))
        outer = _layer_called(node)
        if outer is not None and outer[1].args:
            inner = _layer_called(outer[1].args[0])
            if inner is not None:
                pairs.append((inner[0], outer[0]))
        # x = self.a(x) \n x = self.b(x)   (or return self.b(x))
        body = getattr(node, "body", None)
        if isinstance(body, list):
            for first, second in zip(body, body[1:]):
                if not (isinstance(first, ast.Assign) and len(first.targets) == 1):
                    continue
                var = first.targets[0]
                a = _layer_called(first.value)
                b = _layer_called(getattr(second, "value", None))
                if (
                    a is not None
                    and b is not None
                    and isinstance(var, ast.Name)
                    and b[1].args
                    and isinstance(b[1].args[0], ast.Name)
                    and b[1].args[0].id == var.id
                ):
                    pairs.append((a[0], b[0]))
    return pairs


def _layer_called(node: Optional[ast.AST]) -> Optional[Tuple[str, ast.Call]]:
    """``self.layer(arg, ...)`` -> ("layer", call)."""
    if isinstance(node, ast.Call):
        attr = _self_attr(node.func)
        if attr is not None:
            return attr, node
    return None


def layer_flow(ctx: Context) -> Optional[_LayerFlow]:
    """The file's layer flow (shared by ST008 and ST009), or None in a file without
    BatchNorm (nothing either rule looks for can be there)."""
    if "layer_flow" not in ctx.cache:
        relevant = any(word in ctx.source for word in _NORM_WORDS)
        ctx.cache["layer_flow"] = _LayerFlow(ctx) if relevant else None
    flow: Optional[_LayerFlow] = ctx.cache["layer_flow"]
    return flow


def _followed_by_norm(flow: _LayerFlow, kinds: FrozenSet[str]) -> Iterator[Tuple[_Layer, str]]:
    """(layer of one of ``kinds``, the BatchNorm class after it) for every such pair."""
    for key, followers in flow.followers.items():
        layer = flow.layers[key]
        if layer.kind not in kinds:
            continue
        norm = next(
            (f.kind for f in followers if isinstance(f, _Layer) and f.kind in _BATCHNORMS), None
        )
        if norm is not None:
            yield layer, norm


# -- ST008: the bias argument and the code that touches .bias ------------------------------
def _bias_arg(call: ast.Call, index: int) -> Tuple[bool, Optional[ast.expr]]:
    """(known, value) of the bias argument; value None means "not given" (bias=True)."""
    kw = _keyword(call, "bias")
    if kw is not None:
        return True, kw.value
    if _has_star(call) or _has_double_star(call):
        return False, None
    if len(call.args) > index:
        return True, call.args[index]
    return True, None


def _param_default(fn: Optional[_Fn], name: str) -> Optional[ast.expr]:
    """The default of parameter ``name`` of ``fn`` (None: no such parameter or no default)."""
    if fn is None:
        return None
    args = fn.args
    positional = [*args.posonlyargs, *args.args]
    offset = len(positional) - len(args.defaults)
    for i, arg in enumerate(positional):
        if arg.arg == name:
            return args.defaults[i - offset] if i >= offset else None
    for arg, default in zip(args.kwonlyargs, args.kw_defaults):
        if arg.arg == name:
            return default
    return None


def _callers_pass(ctx: Context, fn: _Fn, name: str) -> bool:
    """Whether a call of ``fn`` in this file passes parameter ``name`` as anything but True."""
    positional = [a.arg for a in (*fn.args.posonlyargs, *fn.args.args)]
    index = positional.index(name) if name in positional else None
    if index is not None and positional and positional[0] in ("self", "cls"):
        index -= 1
    for node in walk_nodes(ctx.tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        called = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
        if called != fn.name:
            continue
        if _has_double_star(node) or _has_star(node):
            return True
        kw = _keyword(node, name)
        value = kw.value if kw is not None else None
        if value is None and index is not None and len(node.args) > index:
            value = node.args[index]
        if value is not None and not _is_const(value, True):
            return True
    return False


def _mentions_bias(test: ast.AST) -> bool:
    for sub in walk_nodes(test):
        if isinstance(sub, ast.Attribute) and sub.attr == "bias":
            return True
        if isinstance(sub, ast.Constant) and sub.value == "bias":
            return True
    return False


def _isinstance_kinds(ctx: Context, test: ast.AST) -> Optional[Set[str]]:
    """The classes an ``isinstance(m, (A, B))`` test (possibly inside ``and``) admits."""
    calls = [test]
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        calls = list(test.values)
    for call in calls:
        word = _class_name_test(call)
        if word is not None:
            return {"~" + word}
        if (
            isinstance(call, ast.Call)
            and isinstance(call.func, ast.Name)
            and call.func.id == "isinstance"
            and len(call.args) == 2
        ):
            classes = call.args[1]
            elts = classes.elts if isinstance(classes, ast.Tuple) else [classes]
            kinds: Set[str] = set()
            for elt in elts:
                qual = ctx.qualname(elt)
                if qual is None:
                    return None  # a class defined elsewhere: it may be a conv
                kinds.add(qual)
            return kinds
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


def _bias_write_applies(kinds: Optional[Set[str]], kind: str) -> bool:
    """Whether a ``.bias`` write limited to ``kinds`` (see ``_bias_writes``) can reach a layer
    of class ``kind``."""
    if kinds is None or kind in kinds:
        return True
    short = kind.rsplit(".", 1)[1]
    for k in kinds:
        if k.startswith("~"):
            if k[1:] in short:
                return True
        elif not (k.startswith(_NN) and k[len(_NN) : len(_NN) + 1].isupper()):
            return True  # a class of its own or a private base (_ConvNd): it may be one
    return False


_BiasWrite = Tuple[int, Optional[Set[str]], Optional[ast.AST]]


def _bias_writes(ctx: Context) -> List[_BiasWrite]:
    """Code that uses ``X.bias`` as a tensor without checking it exists: (line, the layer
    classes an enclosing ``isinstance`` test limits it to or None for any layer, the
    module-level function or class it is in or None for module-level code).

    ``m.bias.data.zero_()``, ``m.bias.fill_(0)``, ``nn.init.constant_(m.bias, 0)``,
    ``m.bias[...]`` crash once the layer has ``bias=False`` (``m.bias`` is then None); under
    ``if m.bias is not None:`` (any test that mentions ``bias``) or ``try`` they do not.
    """
    found = ctx.cache.get("bias_writes")
    if found is not None:
        return found
    found = []

    def visit(
        node: ast.AST, guarded: bool, kinds: Optional[Set[str]], owner: Optional[ast.AST]
    ) -> None:
        if isinstance(node, ast.If):
            inner_kinds = _isinstance_kinds(ctx, node.test)
            inner = guarded or _mentions_bias(node.test)
            for child in node.body:
                visit(child, inner, inner_kinds if inner_kinds is not None else kinds, owner)
            for child in node.orelse:
                visit(child, guarded, kinds, owner)
            visit(node.test, guarded, kinds, owner)
            return
        if isinstance(node, ast.IfExp):
            inner = guarded or _mentions_bias(node.test)
            visit(node.body, inner, kinds, owner)
            visit(node.orelse, guarded, kinds, owner)
            return
        if isinstance(node, ast.Try):
            return  # a try around it: the author expected it to fail sometimes
        if not guarded and _uses_bias_tensor(ctx, node):
            found.append((node.lineno, kinds, owner))  # type: ignore[attr-defined]  # _uses_bias_tensor accepts only expression nodes
        for sub in ast.iter_child_nodes(node):
            top = owner
            if owner is None and isinstance(sub, (*_FUNCTIONS, ast.ClassDef)):
                top = sub
            visit(sub, guarded, kinds, top)

    if ".bias" in ctx.source:
        visit(ctx.tree, False, None, None)
    ctx.cache["bias_writes"] = found
    return found


def _reaches(ctx: Context, cls: ast.ClassDef, owner: Optional[ast.AST]) -> bool:
    """Whether code in ``owner`` (a module-level function or class; None: module code) can
    run on the layers of class ``cls``: it is ``cls`` or one of its bases in this file, a
    function ``cls`` names (``self.apply(init_weights)``), or a function applied outside any
    class (``model.apply(weights_init)`` in the training script)."""
    if owner is None:
        return True
    classes = {c.name: c for c in ctx.tree.body if isinstance(c, ast.ClassDef)}
    todo, seen = [cls], set()
    while todo:
        current = todo.pop()
        if current is owner:
            return True
        seen.add(current.name)
        for base in current.bases:
            name = base.id if isinstance(base, ast.Name) else None
            if name in classes and name not in seen:
                todo.append(classes[name])
    if not isinstance(owner, _FUNCTIONS):
        return False
    named = {n.id for n in walk_nodes(cls) if isinstance(n, ast.Name)}
    if owner.name in named:
        return True
    for node in ctx.tree.body:
        if isinstance(node, ast.ClassDef):
            continue
        for sub in walk_nodes(node):
            if isinstance(sub, ast.Name) and sub.id == owner.name and isinstance(sub.ctx, ast.Load):
                return True
    return False


def _is_bias(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "bias" and not _self_attr(node)


def _uses_bias_tensor(ctx: Context, node: ast.AST) -> bool:
    if isinstance(node, (ast.Attribute, ast.Subscript)) and _is_bias(node.value):
        return True
    if isinstance(node, ast.Call) and node.args and _is_bias(node.args[0]):
        return (ctx.qualname(node.func) or "").startswith(_NN + "init.")
    return False


class BiasBeforeBatchNorm(Rule):
    """ST008: a Conv/Linear layer with a bias immediately followed by BatchNorm.

    BatchNorm subtracts the per-channel mean, so the bias of the layer before it cancels
    out: parameters and compute spent on nothing (and weight decay applied to them).

    The rule follows the layers: ``nn.Sequential(a, b, ...)``, lists built with
    ``layers = [...]``, ``layers += [...]``, ``.append(...)``, ``.extend(...)`` (through
    ``if``/``else`` and loops) and splatted into ``nn.Sequential(*layers)``, helper functions
    returning a list or one layer, variables holding a layer, class aliases from parameter
    defaults (``norm_layer=nn.BatchNorm2d``), ``bias=bias`` with a ``True`` default, and
    ``forward`` methods that apply ``self.conv`` then ``self.bn`` directly.

    Fix (unsafe, ``--unsafe-fixes`` only): ``bias=False`` on the Conv/Linear layer. It
    removes a parameter, so existing checkpoints no longer load (``Unexpected key(s) in
    state_dict: "0.bias"``), the random initialisation of later layers changes (one fewer
    draw from the RNG), and an explicit ``bias=True`` is overridden. Offered only where the
    layer is written at that place, is followed by BatchNorm wherever it is used, and no code
    in the file writes ``m.bias`` of such layers without checking ``m.bias is not None``
    (an init loop that zeroes every conv's bias would crash); elsewhere the finding says
    what to change by hand.

    safetorch: ``st.lint_model`` reports the same on a built model at runtime.
    """

    code = "ST008"

    pitfall_id = "bias-before-bn"
    name = "bias-before-bn"
    pitfall = "a bias right before BatchNorm is cancelled by the mean subtraction"
    safetorch = "st.lint_model"
    torch_symbols = ()
    fixable = True
    fix_applicability = UNSAFE

    def finish(self) -> None:
        flow = layer_flow(self.ctx)
        if flow is None:
            return
        for layer, norm in _followed_by_norm(flow, frozenset(_BIASED)):
            self._judge(flow, layer, norm)

    def _judge(self, flow: _LayerFlow, layer: _Layer, norm: str) -> None:
        call, qual = layer.call, layer.kind
        known, value = _bias_arg(call, _BIASED[qual])
        if not known:
            return
        head = f"{_short(qual)} has a bias that the following {_short(norm)} cancels"
        tail = " (st.lint_model finds this at runtime)"
        if isinstance(value, ast.Name) and not _is_const(value, True):
            default = _param_default(layer.fn, value.id)
            if layer.fn is None or not _is_const(default, True):
                return  # bias=use_bias: an expression the rule cannot judge
            if _callers_pass(self.ctx, layer.fn, value.id):
                return
            self.report(
                call,
                f"{head} ({value.id}={value.id}, whose default is True): pass "
                f"{value.id}=False where it is built before BatchNorm{tail}",
            )
            return
        if value is not None and not _is_const(value, True):
            return  # bias=False, or an expression we cannot judge
        why = self._no_fix_reason(flow, layer)
        if why is not None:
            self.report(call, f"{head}: pass bias=False{why}{tail}")
            return
        if value is None:
            edit = _add_keywords(self.ctx, call, "bias=False")
        else:
            edit = self.ctx.replace(value, "False")
        fix = None if edit is None else Fix("set bias=False", (edit,), UNSAFE)
        self.report(call, f"{head}: pass bias=False{tail}", fix)

    def _no_fix_reason(self, flow: _LayerFlow, layer: _Layer) -> Optional[str]:
        """Why ``bias=False`` cannot be written automatically here, or None."""
        cls = flow._class_of(layer.fn)
        for line, kinds, owner in _bias_writes(self.ctx):
            if cls is not None and not _reaches(self.ctx, cls, owner):
                continue
            if _bias_write_applies(kinds, layer.kind):
                return (
                    f", after guarding the code that writes .bias at line {line} with "
                    "`if m.bias is not None:` (with bias=False it would crash)"
                )
        if not flow.layers[id(layer.call)].direct:
            return " where it is built (it is reached through a helper or a variable)"
        followers = flow.followers.get(id(layer.call), [])
        if any(not (isinstance(f, _Layer) and f.kind in _BATCHNORMS) for f in followers):
            return " where it is followed by BatchNorm (elsewhere it is not)"
        return None


class DropoutBeforeBatchNorm(Rule):
    """ST009: Dropout immediately followed by BatchNorm.

    BatchNorm's running statistics are collected on dropped-out activations in training but
    applied to full activations in eval ("variance shift"), so eval accuracy drops. Put
    Dropout after BatchNorm (or after the block). Found wherever ST008 looks: literal
    ``nn.Sequential(...)`` arguments, layer lists built with ``+=``/``.append``/``.extend``
    and splatted into ``nn.Sequential(*layers)``, helper functions returning layer lists
    (``*block(...)``), and ``forward`` methods.

    Fix (manual): swap the two layers.

    safetorch: ``st.lint_model`` reports the same on a built model at runtime.
    """

    code = "ST009"

    pitfall_id = "dropout-before-bn"
    name = "dropout-before-bn"
    pitfall = "Dropout before BatchNorm makes train and eval statistics disagree"
    safetorch = "st.lint_model"
    torch_symbols = ()

    def finish(self) -> None:
        flow = layer_flow(self.ctx)
        if flow is None:
            return
        for layer, norm in _followed_by_norm(flow, _DROPOUTS):
            self.report(
                layer.call,
                f"{_short(layer.kind)} right before {_short(norm)} shifts the statistics "
                "BatchNorm sees between train and eval: put Dropout after BatchNorm "
                "(st.lint_model finds this at runtime)",
            )


# ---------------------------------------------------------------------------------------------
# pin_memory with a custom batch class
# ---------------------------------------------------------------------------------------------
_BASES_TORCH_PINS = ("tuple", "list", "dict", "NamedTuple", "Mapping", "Sequence")


class CustomBatchWithoutPinMemory(Rule):
    """ST010: ``DataLoader(pin_memory=True, collate_fn=f)`` where ``f`` returns a custom class
    without a ``pin_memory`` method.

    The loader pins tensors, tuples, lists, dicts and namedtuples; any other object it leaves
    untouched, unless the object has a ``pin_memory()`` method. The batch is then silently
    not pinned, and ``.to(device, non_blocking=True)`` copies synchronously. Checked when
    ``f`` and the class are defined in the same file.

    Fix (manual): give the class a ``pin_memory()`` method that pins its tensors and returns
    self.

    safetorch: ``st.PinnedBatch`` (a base class with that method); ``st.check_loader`` finds
    unpinned batches at runtime.
    """

    code = "ST010"

    pitfall_id = "batch-not-pinnable"
    name = "batch-not-pinnable"
    pitfall = "pin_memory=True silently skips batch objects without a pin_memory() method"
    safetorch = "st.PinnedBatch"
    torch_symbols = ("torch.utils.data.DataLoader",)
    node_types = (ast.Call, ast.ClassDef, ast.FunctionDef)

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self._classes: Dict[str, ast.ClassDef] = {}
        self._functions: Dict[str, ast.FunctionDef] = {}
        self._loaders: List[Tuple[ast.Call, str]] = []

    def visit(self, node: ast.AST) -> None:
        if isinstance(node, ast.ClassDef):
            self._classes[node.name] = node
        elif isinstance(node, ast.FunctionDef):
            self._functions[node.name] = node
        elif isinstance(node, ast.Call):
            if self.ctx.qualname(node.func) != "torch.utils.data.DataLoader":
                return
            pin = _keyword(node, "pin_memory")
            collate = _keyword(node, "collate_fn")
            if pin is None or collate is None or not _is_const(pin.value, True):
                return
            if isinstance(collate.value, ast.Name):
                self._loaders.append((node, collate.value.id))

    def _pins(self, cls: ast.ClassDef, seen: Set[str]) -> bool:
        """Whether instances of ``cls`` get pinned (a method, or a base torch understands)."""
        for stmt in cls.body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if stmt.name == "pin_memory":
                    return True
            elif isinstance(stmt, ast.Assign):
                if any(isinstance(t, ast.Name) and t.id == "pin_memory" for t in stmt.targets):
                    return True
        for base in cls.bases:
            name = base.attr if isinstance(base, ast.Attribute) else getattr(base, "id", None)
            if name is None or name in _BASES_TORCH_PINS:
                return True
            if name == "object":
                continue
            parent = self._classes.get(name)
            if parent is None or name in seen:
                return True  # defined elsewhere: cannot tell, stay quiet
            seen.add(name)
            if self._pins(parent, seen):
                return True
        return False

    def finish(self) -> None:
        for loader, fn_name in self._loaders:
            fn = self._functions.get(fn_name)
            if fn is None:
                continue
            for node in walk_nodes(fn):
                if not (isinstance(node, ast.Return) and isinstance(node.value, ast.Call)):
                    continue
                func = node.value.func
                cls = self._classes.get(func.id) if isinstance(func, ast.Name) else None
                if cls is not None and not self._pins(cls, {cls.name}):
                    self.report(
                        loader,
                        f"DataLoader(pin_memory=True) with collate_fn={fn_name}, which returns "
                        f"{cls.name} (no pin_memory() method): the batch is silently not "
                        "pinned; subclass st.PinnedBatch (st.check_loader finds this at runtime)",
                    )
                    break


# ---------------------------------------------------------------------------------------------
# Wrapped models, strict=False, DataParallel, SyncBN conversion
# ---------------------------------------------------------------------------------------------
_WRAPPERS = {
    _NN + "DataParallel": "DataParallel",
    _NN + "parallel.DistributedDataParallel": "DistributedDataParallel",
}


# Calls chained on a freshly wrapped model that return the same wrapper.
_CHAINED_ON_MODELS = frozenset({"cuda", "to", "cpu", "float", "half", "double", "train", "eval"})
# What a wrapper made only for its ``module.``-prefixed keys is used for.
_KEY_ONLY_ATTRS = frozenset({"state_dict", "load_state_dict", "module"})


def _statements_in_order(body: Sequence[ast.stmt]) -> Iterator[ast.stmt]:
    """The statements of one scope in source order, entering compound statements but not
    nested functions or classes."""
    for stmt in body:
        yield stmt
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        for name in ("body", "orelse", "finalbody", "handlers", "cases"):
            inner = getattr(stmt, name, None)
            if isinstance(inner, list):
                for item in inner:
                    if isinstance(item, ast.stmt):
                        yield from _statements_in_order([item])
                    elif hasattr(item, "body"):  # except handler, match case
                        yield from _statements_in_order(item.body)


Branch = Tuple[Tuple[int, str], ...]


def _statements_with_branch(
    body: Sequence[ast.stmt], branch: Branch = ()
) -> Iterator[Tuple[ast.stmt, Branch]]:
    """Like ``_statements_in_order``, with the conditional branches each statement is in:
    ``((id(if), "body"), ...)``; a statement under no ``if``/``try``/loop has ``()``."""
    for stmt in body:
        yield stmt, branch
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        conditional = isinstance(stmt, (ast.If, ast.Try, ast.For, ast.AsyncFor, ast.While))
        conditional = conditional or type(stmt).__name__ == "Match"
        for name in ("body", "orelse", "finalbody", "handlers", "cases"):
            inner = getattr(stmt, name, None)
            if not isinstance(inner, list):
                continue
            here = branch + ((id(stmt), name),) if conditional and name != "finalbody" else branch
            for i, item in enumerate(inner):
                if isinstance(item, ast.stmt):
                    yield from _statements_with_branch([item], here)
                elif hasattr(item, "body"):  # except handler, match case: one branch each
                    yield from _statements_with_branch(item.body, here + ((id(item), str(i)),))


def _state_dict_holders(expr: ast.AST) -> Iterator[Tuple[ast.Call, ast.AST]]:
    """``(m.state_dict() call, m)`` for every ``m.state_dict()`` inside ``expr``."""
    for sub in walk_nodes(expr):
        if (
            isinstance(sub, ast.Call)
            and isinstance(sub.func, ast.Attribute)
            and sub.func.attr == "state_dict"
        ):
            yield sub, sub.func.value


class _Scope:
    """What ST011 knows while it reads one scope top to bottom."""

    def __init__(self, node: ast.AST, local_names: Set[str]) -> None:
        self.node = node
        self.local_names = local_names  # names bound here (not declared global)
        # name -> (wrapper class, branch of the wrapping statement, wrapped only sometimes)
        self.wrapped: Dict[str, Tuple[str, Branch, bool]] = {}
        # name -> state_dict() calls of wrapped models its value holds
        self.holds: Dict[str, List[Tuple[ast.Call, str, str, bool]]] = {}


def _bound_here(fn: ast.AST) -> Set[str]:
    """Names a function binds locally (parameters and assignments, minus ``global`` ones)."""
    names: Set[str] = set()
    declared: Set[str] = set()
    args = fn.args  # type: ignore[attr-defined]  # fn is a FunctionDef/AsyncFunctionDef/Lambda node: all have args
    for arg in (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg):
        if arg is not None:
            names.add(arg.arg)
    for stmt in _statements_in_order(fn.body):  # type: ignore[attr-defined]  # fn is a FunctionDef/AsyncFunctionDef node here: both have body
        if isinstance(stmt, ast.Global):
            declared.update(stmt.names)
        elif isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            for target in targets:
                names.update(_bound_names(target))
        elif isinstance(stmt, (ast.For, ast.AsyncFor)):
            names.update(_bound_names(stmt.target))
    return names - declared


def _only_for_its_keys(scope: ast.AST, name: str, after: ast.stmt) -> bool:
    """Whether ``name``, bound at ``after`` to a wrapper, is used only for its state_dict keys
    afterwards in ``scope`` (``model.state_dict()``, ``.load_state_dict``, ``.module``): never
    called, trained or passed on."""
    start = _end_pos(after)
    nodes = walk_nodes(scope)
    stop = (10**9, 0)  # up to the next rebinding of the name
    for node in nodes:
        if isinstance(node, ast.Assign) and _pos(node) > start:
            if any(name in _bound_names(t) for t in node.targets):
                stop = min(stop, _end_pos(node))
    key_uses = 0
    attribute_values: Set[int] = set()
    for node in nodes:
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if node.value.id == name and start < _pos(node) < stop:
                attribute_values.add(id(node.value))
                if node.attr not in _KEY_ONLY_ATTRS:
                    return False
                key_uses += node.attr != "module"
    for node in nodes:
        if (
            isinstance(node, ast.Name)
            and node.id == name
            and isinstance(node.ctx, ast.Load)
            and start < _pos(node) < stop
            and id(node) not in attribute_values
        ):
            return False
    return key_uses > 0


# DataParallel arguments that do not change what the wrapper is made for.
_PLACEMENT_KEYWORDS = frozenset({"device_ids", "output_device"})


def _is_main_guard(test: ast.AST) -> bool:
    """``__name__ == "__main__"``."""
    return (
        isinstance(test, ast.Compare)
        and isinstance(test.left, ast.Name)
        and test.left.id == "__name__"
        and len(test.ops) == 1
        and isinstance(test.ops[0], ast.Eq)
        and _is_const_str(test.comparators[0], "__main__")
    )


def _is_const_str(node: ast.AST, value: str) -> bool:
    return isinstance(node, ast.Constant) and node.value == value


def _runs_on_every_machine(ctx: Context, branch: Branch) -> bool:
    """Whether the branches a statement is in decide nothing about the machine: ``if
    __name__ == "__main__":``, a loop over literal constants, and ``if`` on that loop's
    variable (a test trying both: ``for wrap in [False, True]: if wrap:``)."""
    if not branch:
        return True
    nodes = ctx.cache.get("branch_nodes")
    if nodes is None:
        nodes = ctx.cache["branch_nodes"] = {
            id(n): n for n in walk_nodes(ctx.tree) if isinstance(n, (ast.If, ast.For))
        }
    literal_loop_names: Set[str] = set()
    for node_id, part in branch:
        node = nodes.get(node_id)
        if part != "body":
            return False
        if (
            isinstance(node, ast.For)
            and isinstance(node.target, ast.Name)
            and isinstance(node.iter, (ast.List, ast.Tuple))
            and all(isinstance(e, ast.Constant) for e in node.iter.elts)
        ):
            literal_loop_names.add(node.target.id)
        elif not isinstance(node, ast.If) or not (
            _is_main_guard(node.test)
            or (isinstance(node.test, ast.Name) and node.test.id in literal_loop_names)
        ):
            return False
    return True


def _made_for_its_keys(ctx: Context, stmt: ast.stmt, branch: Branch) -> bool:
    """``model = nn.DataParallel(model)`` made only to give its state_dict the ``module.``
    prefix (a conversion script, a test of prefix handling): DataParallel of the model alone
    (``device_ids=`` aside), not under a condition (a parallelism decision depends on the
    GPUs; ``if __name__ == "__main__":`` and a test's ``for wrap in [False, True]: if wrap:``
    decide nothing), and used afterwards only for its keys."""
    if not isinstance(stmt, ast.Assign) or len(stmt.targets) != 1:
        return False
    target, value = stmt.targets[0], stmt.value
    if not (isinstance(target, ast.Name) and isinstance(value, ast.Call)):
        return False
    if ctx.qualname(value.func) != _NN + "DataParallel" or len(value.args) != 1:
        return False
    if any(kw.arg not in _PLACEMENT_KEYWORDS for kw in value.keywords):
        return False
    if not _runs_on_every_machine(ctx, branch):
        return False
    return _only_for_its_keys(_scope_of(ctx, stmt), target.id, stmt)


def _scope_of(ctx: Context, stmt: ast.stmt) -> ast.AST:
    """The function (or the module) whose body holds ``stmt``."""
    scopes = ctx.cache.get("statement_scopes")
    if scopes is None:
        scopes = {}
        for fn in (
            ctx.tree,
            *(
                n
                for n in walk_nodes(ctx.tree)
                if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
            ),
        ):
            for inner in _statements_in_order(fn.body):
                scopes[id(inner)] = fn
        ctx.cache["statement_scopes"] = scopes
    found: ast.AST = scopes.get(id(stmt), ctx.tree)
    return found


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
    prefix handling: never called, trained or passed on) is not reported.

    Fix (manual): save ``st.unwrap_model(m).state_dict()`` (``m.module.state_dict()`` only
    where ``m`` is always wrapped: it crashes where the wrap is conditional), and change the
    load side too where the project resumes from its own files: ``st.load_state_dict(m,
    sd)`` loads keys with or without the prefix into a wrapped or a bare model.

    safetorch: ``st.unwrap_model``.
    """

    code = "ST011"

    pitfall_id = "state-dict-of-wrapped-model"
    name = "state-dict-of-wrapped-model"
    pitfall = "a DataParallel/DDP state_dict has 'module.'-prefixed keys"
    safetorch = "st.unwrap_model"
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
            n for n in walk_nodes(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
        ]
        self._self_wrapped: Dict[str, Tuple[str, Branch, bool]] = {}
        for scope_node in (tree, *functions):
            for stmt, branch in _statements_with_branch(scope_node.body):
                if isinstance(stmt, ast.Assign):
                    found = self._wrapper(stmt.value)
                    for target in stmt.targets:
                        attr = _self_attr(target)
                        if attr is not None and found is not None:
                            self._self_wrapped[attr] = (found[0], branch, found[1] or bool(branch))
        self._savers = self._saving_functions(functions)
        self._reported: Set[int] = set()
        module = _Scope(tree, set())
        self._read_scope(module, None)  # module level first: its wrapped globals
        for fn in functions:
            self._read_scope(_Scope(fn, _bound_here(fn)), module)

    def _saving_functions(self, functions: Sequence[ast.AST]) -> Dict[str, Tuple[int, str]]:
        """Module functions that ``torch.save`` one of their parameters: name -> (index, param)."""
        savers: Dict[str, Tuple[int, str]] = {}
        for fn in functions:
            params = [a.arg for a in (*fn.args.posonlyargs, *fn.args.args)]  # type: ignore[attr-defined]  # functions holds FunctionDef/AsyncFunctionDef nodes only
            if params and params[0] in ("self", "cls"):
                continue
            for sub in walk_nodes(fn):
                if (
                    isinstance(sub, ast.Call)
                    and sub.args
                    and self.ctx.qualname(sub.func) == "torch.save"
                    and isinstance(sub.args[0], ast.Name)
                    and sub.args[0].id in params
                ):
                    name = fn.name  # type: ignore[attr-defined]  # functions holds FunctionDef/AsyncFunctionDef nodes only
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
        attr = _self_attr(holder)
        return None if attr is None else self._self_wrapped.get(attr)

    def _wrapped_state_dicts(
        self, scope: _Scope, module: Optional[_Scope], expr: ast.AST
    ) -> List[Tuple[ast.Call, str, str, bool]]:
        """The wrapped models' ``state_dict()`` calls whose result ``expr`` holds:
        (call, model as written, wrapper, wrapped only sometimes)."""
        found: List[Tuple[ast.Call, str, str, bool]] = []
        for call, holder in _state_dict_holders(expr):
            wrapped = self._wrapped_holder(scope, module, holder)
            if wrapped is not None:
                found.append((call, self.ctx.segment(holder), wrapped[0], wrapped[2]))
        for sub in walk_nodes(expr):
            if isinstance(sub, ast.Name):
                owner, _ = self._lookup(scope, module, sub.id)
                found.extend(owner.holds.get(sub.id, ()))
        return found

    def _read_scope(self, scope: _Scope, module: Optional[_Scope]) -> None:
        body = scope.node.body  # type: ignore[attr-defined]  # a scope node is a Module/FunctionDef/ClassDef: all have body
        for stmt, branch in _statements_with_branch(body):
            if isinstance(stmt, ast.Assign):
                self._assign(scope, module, stmt, branch)
            for sub in self._calls_of(stmt):
                self._judge_call(scope, module, sub)

    @staticmethod
    def _calls_of(stmt: ast.stmt) -> Iterator[ast.Call]:
        """Calls in the statement itself (not in nested blocks, functions or classes)."""
        for part in _own_expressions(stmt):
            for sub in walk_nodes(part):
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
                    if not _made_for_its_keys(self.ctx, stmt, branch):
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
        local = isinstance(scope.node, _FUNCTIONS) and model.split(".")[0] in scope.local_names
        for node in walk_nodes(scope.node if local else self.ctx.tree):
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
                kw = _keyword(call, param)
                if kw is not None:
                    saved = kw.value
                elif len(call.args) > index and not _has_star(call):
                    saved = call.args[index]
        if saved is None:
            return
        for sd_call, model, wrapper, sometimes in self._wrapped_state_dicts(scope, module, saved):
            if id(sd_call) in self._reported:
                continue
            self._reported.add(id(sd_call))
            if sometimes:
                advice = (
                    f"save st.unwrap_model({model}).state_dict() ({model}.module exists only "
                    "when it is wrapped)"
                )
            else:
                advice = (
                    f"save st.unwrap_model({model}).state_dict() (or {model}.module.state_dict())"
                )
            resume = self._resume_line(scope, model)
            if resume is not None:
                load = (
                    f", and load it at line {resume} with st.load_state_dict({model}, ...), "
                    "which accepts keys with or without the prefix"
                )
            else:
                load = "; st.load_state_dict loads files with or without the prefix"
            self.report(
                sd_call,
                f"{model} is {'sometimes ' if sometimes else ''}wrapped in {wrapper}, so "
                f"{model}.state_dict() keys start with 'module.' and the saved file (line "
                f"{call.lineno}) does not load into the bare model: {advice}{load}",
            )


_LOG_METHODS = frozenset({"info", "warning", "warn", "debug", "error", "log", "write", "print"})


def _filtered_or_own(ctx: Context, scope: ast.AST, name: str, model: ast.AST) -> bool:
    """Whether ``name`` in ``scope`` holds a state_dict whose mismatches the code handles.

    It was built by filtering (a dict comprehension with ``if``, a call such as
    ``intersect_dicts(...)`` or ``filter_...``), it starts as the model's own
    ``state_dict()`` (then updated), or the code reports on it (``len(name)`` or the name in a
    print/log call).
    """
    model_text = ctx.segment(model)
    for node in walk_nodes(scope):
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
                for sub in walk_nodes(node):
                    if isinstance(sub, ast.Name) and sub.id == name:
                        return True
    return False


class DiscardedNonStrictLoad(Rule):
    """ST012: ``model.load_state_dict(sd, strict=False)`` with its result thrown away.

    With ``strict=False`` mismatching keys are not errors: they are only returned, as
    ``missing_keys`` and ``unexpected_keys``. Discarding the result means a checkpoint that
    matches nothing (say, every key prefixed with ``module.``) loads silently and the model
    keeps its random weights.

    Quiet when the result is used, and when the code already handles mismatches: the state
    dict was filtered against the model (a dict comprehension with ``if``,
    ``intersect_dicts(...)``), it is the model's own ``state_dict()`` updated with some
    entries, or the code logs what it loaded (``len(sd)`` in a print or logger call).

    Fix (manual): check the returned keys, or use ``st.load_state_dict``, whose
    ``LoadReport`` says what matched and fails when nothing did.

    Preview: 7 of 9 findings (78%) were right on the labelled corpus of real repositories
    (``benchmarks/check_corpus``); the others were deliberate partial loads (a dict built
    key by key under a prefix test, ``assign=True`` onto meta tensors).

    safetorch: ``st.load_state_dict``.
    """

    # Opt-in: 7 of 9 findings right on the labelled corpus (benchmarks/check_corpus).
    preview = True
    code = "ST012"

    pitfall_id = "discarded-nonstrict-load"
    name = "discarded-nonstrict-load"
    pitfall = "load_state_dict(strict=False) reports mismatches only in its return value"
    safetorch = "st.load_state_dict"
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
        strict = _keyword(call, "strict")
        value = (
            strict.value if strict is not None else (call.args[1] if len(call.args) > 1 else None)
        )
        if not _is_const(value, False):
            return
        loaded = call.args[0] if call.args else getattr(_keyword(call, "state_dict"), "value", None)
        if isinstance(loaded, ast.Name) and _filtered_or_own(
            self.ctx, self.ctx.scope, loaded.id, call.func.value
        ):
            return
        if isinstance(loaded, ast.DictComp) and any(g.ifs for g in loaded.generators):
            return
        self.report(
            call,
            "load_state_dict(..., strict=False) discards the missing/unexpected keys it "
            "returns, so a mismatched checkpoint loads silently: check the result or use "
            "st.load_state_dict (returns a LoadReport)",
        )


class DataParallelUsed(Rule):
    """ST013: ``nn.DataParallel``.

    DataParallel runs one process with a thread per GPU: the GIL, re-broadcasting the model
    every step and gathering every output on ``cuda:0`` make it slower than
    DistributedDataParallel even on a single machine, and ``cuda:0`` runs out of memory
    first. Its state_dict keys are prefixed with ``module.``. Not reported where the wrapper
    is made only for those keys (``nn.DataParallel(model).state_dict()``, or an unconditional
    ``m = nn.DataParallel(model)`` used only for ``m.state_dict()``): a conversion script or a
    test of prefix handling, which never runs it.

    Fix (manual): ``torch.nn.parallel.DistributedDataParallel`` (one process per GPU).

    safetorch: ``st.unwrap_model`` for saving either wrapper's weights.
    """

    code = "ST013"

    pitfall_id = "data-parallel"
    name = "data-parallel"
    pitfall = "nn.DataParallel is slower than DDP and overloads cuda:0"
    safetorch = "st.unwrap_model"
    torch_symbols = (_NN + "DataParallel",)
    node_types = (ast.Call, ast.Attribute)

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self._calls: List[ast.Call] = []
        self._for_keys: Set[int] = set()

    def visit(self, node: ast.AST) -> None:
        if isinstance(node, ast.Attribute):
            # nn.DataParallel(model).state_dict(): made for its prefixed keys, not to run
            if node.attr in _KEY_ONLY_ATTRS and isinstance(node.value, ast.Call):
                self._for_keys.add(id(node.value))
        elif isinstance(node, ast.Call) and self.ctx.qualname(node.func) == _NN + "DataParallel":
            self._calls.append(node)

    def finish(self) -> None:
        if not self._calls:
            return
        scopes = [
            self.ctx.tree,
            *(n for n in walk_nodes(self.ctx.tree) if isinstance(n, _FUNCTIONS)),
        ]
        for scope in scopes:
            for stmt, branch in _statements_with_branch(scope.body):
                if isinstance(stmt, ast.Assign) and _made_for_its_keys(self.ctx, stmt, branch):
                    self._for_keys.add(id(stmt.value))
        for call in self._calls:
            if id(call) in self._for_keys:
                continue
            self.report(
                call,
                "nn.DataParallel is slower than DistributedDataParallel and gathers on cuda:0: "
                "use DistributedDataParallel (st.unwrap_model to save its weights)",
            )


# Names whose presence in a condition says the code is deciding about distributed training.
_DIST_WORDS: Tuple[str, ...] = ("sync_bn", "syncbn", "sync_batchnorm", "distributed", "ddp")
_DIST_WORDS += ("world_size", "rank", "is_initialized", "n_gpu", "ngpu", "num_gpus")
_DIST_WORDS += ("device_count", "gpus")


def _mentions_distributed(test: ast.AST) -> bool:
    for sub in walk_nodes(test):
        word = sub.id if isinstance(sub, ast.Name) else getattr(sub, "attr", None)
        if word is None and isinstance(sub, ast.Constant) and isinstance(sub.value, str):
            word = sub.value
        if isinstance(word, str) and any(w in word.lower() for w in _DIST_WORDS):
            return True
    return False


class ConvertSyncBatchNorm(Rule):
    """ST014: ``nn.SyncBatchNorm.convert_sync_batchnorm`` outside a distributed condition.

    torch's conversion is unconditional. The converted layers raise in training on CPU
    input under a process group with more than one process (gloo: "SyncBatchNorm expected
    input tensor to be on GPU"), and a ``process_group`` given at conversion must be the one
    DDP uses. On torch < 2.0 they also raise without any process group (single-GPU runs, CPU
    tests); torch 2.0 (pytorch/pytorch#89706) falls back to plain BatchNorm there, so the
    message mentions it only when ``[tool.safetorch] min-torch-version`` is below 2.0 or
    unset.

    Quiet when the call is guarded by a distributed condition
    (``if opt.sync_bn and RANK != -1:``, ``if dist.is_initialized():``,
    ``... if args.distributed else model``).

    Fix (manual): ``st.convert_sync_batchnorm``, which follows the process group (a no-op
    without one) and picks a layer that runs on each device.

    safetorch: ``st.convert_sync_batchnorm``.
    """

    code = "ST014"

    pitfall_id = "torch-syncbn-device"
    name = "torch-syncbn-device"
    pitfall = "convert_sync_batchnorm converts even where SyncBatchNorm cannot run"
    safetorch = "st.convert_sync_batchnorm"
    torch_symbols = (_NN + "SyncBatchNorm.convert_sync_batchnorm",)
    node_types = (ast.Call, ast.If, ast.IfExp)

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self._guards: List[Tuple[Pos, Pos]] = []  # extents guarded by a distributed test
        self._calls: List[ast.Call] = []

    def visit(self, node: ast.AST) -> None:
        if isinstance(node, (ast.If, ast.IfExp)):
            if _mentions_distributed(node.test):
                body = node.body if isinstance(node.body, list) else [node.body]
                self._guards.append((_pos(body[0]), _end_pos(body[-1])))
                # if not distributed: ... else: convert(...) is guarded too
                orelse = node.orelse if isinstance(node.orelse, list) else [node.orelse]
                if orelse:
                    self._guards.append((_pos(orelse[0]), _end_pos(orelse[-1])))
        elif isinstance(node, ast.Call):
            if self.ctx.qualname(node.func) == _NN + "SyncBatchNorm.convert_sync_batchnorm":
                self._calls.append(node)

    def finish(self) -> None:
        for call in self._calls:
            if any(lo <= _pos(call) <= hi for lo, hi in self._guards):
                continue
            older = (
                ""
                if torch_at_least(self.ctx, 2, 0)
                else " (and on torch < 2.0 also without a process group)"
            )
            self.report(
                call,
                "nn.SyncBatchNorm.convert_sync_batchnorm converts unconditionally: the "
                "converted layers raise in training on CPU under a gloo process group"
                f"{older}: guard it with the distributed condition or use "
                "st.convert_sync_batchnorm",
            )


# ---------------------------------------------------------------------------------------------
# BatchNorm/InstanceNorm: positional eps; F.dropout without training=
# ---------------------------------------------------------------------------------------------
# layer -> index of the positional ``eps`` parameter
_NORM_EPS: Dict[str, int] = {
    **{f"{_NN}BatchNorm{d}d": 1 for d in (1, 2, 3)},
    **{f"{_NN}InstanceNorm{d}d": 1 for d in (1, 2, 3)},
    _NN + "SyncBatchNorm": 1,
    **{f"{_NN}LazyBatchNorm{d}d": 0 for d in (1, 2, 3)},
    **{f"{_NN}LazyInstanceNorm{d}d": 0 for d in (1, 2, 3)},
}
# A real eps is tiny (1e-5, 1e-3); values from 0.01 up are momentum values (0.1, 0.8, 0.99).
_EPS_LOOKS_LIKE_MOMENTUM = 0.01


class PositionalEpsInNorm(Rule):
    """ST015: a BatchNorm/InstanceNorm layer given a momentum-like value as positional ``eps``.

    The second positional parameter of ``nn.BatchNorm2d`` (and 1d/3d, ``SyncBatchNorm``,
    ``InstanceNorm*d``; the first of the ``Lazy`` variants) is ``eps``, not ``momentum``:
    ``nn.BatchNorm2d(128, 0.8)`` divides by ``sqrt(var + 0.8)`` instead of
    ``sqrt(var + 1e-5)``, which all but switches normalisation off for small activations,
    and leaves momentum at 0.1. Reported when the positional value is a number of 0.01 or
    more (a real eps is 1e-5 .. 1e-3) or a name that says momentum.

    Fix (manual): spell it with a keyword. For values from 0.5 to 1 (Keras's convention, the
    usual origin: Keras ``momentum=0.8`` is torch ``momentum=0.2``) the message leads with
    the torch equivalent ``1 - value``; ``momentum=`` with the value itself if torch's
    momentum was meant, or ``eps=0.8`` to keep today's behaviour on purpose (silences the
    rule).

    safetorch: none (a constructor argument; nothing to wrap).
    """

    code = "ST015"

    pitfall_id = "bn-statistics"
    name = "positional-eps-in-norm"
    pitfall = "the second positional parameter of BatchNorm/InstanceNorm is eps, not momentum"
    safetorch = None
    torch_symbols = ()  # nothing to route: the constructor is right, the call site is not
    node_types = (ast.Call,)

    def visit(self, node: ast.Call) -> None:
        qual = self.ctx.qualname(node.func)
        index = _NORM_EPS.get(qual or "")
        if index is None or len(node.args) <= index or _has_star(node):
            return
        value = node.args[index]
        number = value.value if isinstance(value, ast.Constant) else None
        if isinstance(number, (int, float)) and not isinstance(number, bool):
            if number < _EPS_LOOKS_LIKE_MOMENTUM:
                return
        else:
            word = (_var_key(value) or "").lower()
            if "mom" not in word:
                return
        shown = self.ctx.segment(value)
        head = (
            f"{_short(qual or '')} gets eps={shown}: its positional parameter {index + 1} is "
            "eps, not momentum; "
        )
        if isinstance(number, (int, float)) and 0.5 <= number < 1:
            # 0.8, 0.9, 0.99: Keras's convention (the weight of the old statistics), the
            # usual source of this call; torch's momentum is the weight of the new batch.
            keras = f"{1 - number:.6g}"
            advice = (
                f"if it is Keras's momentum (code ported from Keras), torch's is 1 - it: "
                f"momentum={keras}; if torch's momentum was meant, momentum={shown}"
            )
        else:
            advice = (
                f"write momentum={shown} if momentum was meant (a Keras momentum m is "
                "torch's 1 - m)"
            )
        self.report(value, f"{head}{advice}; eps={shown} keeps today's behaviour")


# F.<name> -> its ``training`` default
_FUNCTIONAL_DROPOUTS: Dict[str, bool] = {
    _F + "dropout": True,
    _F + "dropout1d": True,
    _F + "dropout2d": True,
    _F + "dropout3d": True,
    _F + "alpha_dropout": False,
    _F + "feature_alpha_dropout": False,
}


def _training_branch(node: Union[ast.If, ast.IfExp], owner: str) -> List[ast.AST]:
    """The statements (or expression) of ``node`` that run when ``owner.training`` is true."""

    def is_training(test: ast.AST) -> Optional[bool]:
        if (
            isinstance(test, ast.Attribute)
            and test.attr == "training"
            and isinstance(test.value, ast.Name)
            and test.value.id == owner
        ):
            return True
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            inner = is_training(test.operand)
            return None if inner is None else not inner
        if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
            if any(is_training(v) is True for v in test.values):
                return True
        return None

    positive = is_training(node.test)
    if positive is None:
        return []
    branch = node.body if positive else node.orelse
    return list(branch) if isinstance(branch, list) else [branch]


class FunctionalDropoutWithoutTraining(Rule):
    """ST016: ``F.dropout(x, p)`` inside ``forward`` without ``training=``.

    The functional form does not know whether the module is in train or eval mode:
    ``F.dropout``, ``dropout1d/2d/3d`` default to ``training=True`` and keep dropping in
    ``model.eval()`` (noisy, wrong validation and inference), while ``F.alpha_dropout`` and
    ``F.feature_alpha_dropout`` default to ``training=False`` and never drop at all.
    Reported in a method named ``forward`` when ``training`` is not passed, except for the
    ``training=True`` functions inside ``if self.training:`` (or ``... if self.training else
    ...``), which run only in training mode.

    Fix (unsafe, ``--unsafe-fixes``): add ``training=self.training``, which changes what
    the model computes in eval mode (on purpose). Or use an ``nn.Dropout`` module, which
    follows ``model.train()`` / ``model.eval()``.

    safetorch: none (``nn.Dropout`` is the safe spelling).
    """

    code = "ST016"

    pitfall_id = "functional-dropout-without-training"
    name = "functional-dropout-without-training"
    pitfall = "F.dropout ignores model.eval() unless training=self.training is passed"
    safetorch = None
    torch_symbols = ()  # nothing to route: only the call site knows self.training
    fixable = True
    fix_applicability = UNSAFE
    node_types = (ast.Call,)

    def visit(self, node: ast.Call) -> None:
        qual = self.ctx.qualname(node.func)
        if qual not in _FUNCTIONAL_DROPOUTS:
            return
        scope = self.ctx.scope
        if not (isinstance(scope, ast.FunctionDef) and scope.name == "forward"):
            return
        params = scope.args.posonlyargs + scope.args.args
        if not params or _keyword(node, "training") is not None or len(node.args) > 2:
            return
        if _has_double_star(node) or _has_star(node):
            return
        owner = params[0].arg
        if _FUNCTIONAL_DROPOUTS[qual] and self._in_training_branch(scope, owner, node):
            return  # runs only in training, where training=True is right
        spelled = f"training={owner}.training"
        edit = _add_keywords(self.ctx, node, spelled)
        fix = None if edit is None else Fix(f"add {spelled}", (edit,), UNSAFE)
        if _FUNCTIONAL_DROPOUTS[qual]:
            what = "keeps dropping in eval mode (training defaults to True)"
        else:
            what = "never drops, not even in training (training defaults to False)"
        self.report(
            node,
            f"{_short(qual)} in forward without training= {what}: pass {spelled} "
            "or use an nn.Dropout module",
            fix,
        )

    def _in_training_branch(self, forward: ast.FunctionDef, owner: str, call: ast.Call) -> bool:
        """Whether ``call`` sits in the branch of ``if self.training:`` (or of
        ``... if self.training else ...``) that runs in training mode."""
        key = f"training_branches:{id(forward)}"
        spans = self.ctx.cache.get(key)
        if spans is None:
            spans = []
            for node in walk_nodes(forward):
                if isinstance(node, (ast.If, ast.IfExp)):
                    branch = _training_branch(node, owner)
                    if branch:
                        spans.append((_pos(branch[0]), _end_pos(branch[-1])))
            self.ctx.cache[key] = spans
        where = _pos(call)
        return any(lo <= where <= hi for lo, hi in spans)


# ---------------------------------------------------------------------------------------------
# APIs newer torch removed or changed (the `legacy` patch family, st.legacy)
# ---------------------------------------------------------------------------------------------
_LEGACY_LINALG = {f"torch.{n}" for n in ("solve", "lstsq", "eig", "symeig", "matrix_rank")}


def _literal_bool(node: Optional[ast.AST], default: bool) -> Optional[bool]:
    """The value of a literal True/False argument (``default`` when absent), else None."""
    if node is None:
        return default
    if isinstance(node, ast.Constant) and isinstance(node.value, bool):
        return node.value
    return None


def _arg(call: ast.Call, index: int, name: str) -> Optional[ast.expr]:
    if len(call.args) > index:
        return call.args[index]
    kw = _keyword(call, name)
    return None if kw is None else kw.value


def _plain_call(call: ast.Call, names: Sequence[str]) -> bool:
    """Only positional/keyword arguments among ``names`` (no *args, **kw, out=)."""
    if _has_star(call) or _has_double_star(call) or len(call.args) > len(names):
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

    pitfall_id = "legacy-api"
    name = "removed-linalg-function"
    pitfall = "torch.solve/lstsq/eig/symeig/matrix_rank were removed; torch.linalg differs"
    safetorch = "st.legacy"
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

    def _first_item_fix(self, outer: ast.AST, call: ast.Call, name: str) -> Optional[Fix]:
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
            upper = _literal_bool(_arg(call, 2, "upper"), True)
            if upper is None or not call.args:
                return None
            uplo = '"U"' if upper else '"L"'
            text = self._spell(call, "eigvalsh", [seg(call.args[0]), f"UPLO={uplo}"])
            return None if text is None else Fix(f"use {text}", (self.ctx.replace(outer, text),))
        return None

    def _call_fix(self, call: ast.Call, name: str) -> Optional[Fix]:
        seg = self.ctx.segment
        if name == "symeig" and _plain_call(call, ("input", "eigenvectors", "upper")):
            vectors = _literal_bool(_arg(call, 1, "eigenvectors"), False)
            upper = _literal_bool(_arg(call, 2, "upper"), True)
            if vectors is not True or upper is None or not call.args:
                return None
            uplo = '"U"' if upper else '"L"'
            text = self._spell(call, "eigh", [seg(call.args[0]), f"UPLO={uplo}"])
            return None if text is None else Fix(f"use {text}", (self.ctx.replace(call, text),))
        if name == "matrix_rank" and _plain_call(call, ("input", "tol", "symmetric")):
            if not call.args:
                return None
            tol = _arg(call, 1, "tol")
            symmetric = _literal_bool(_arg(call, 2, "symmetric"), False)
            if symmetric is None:
                return None
            args = [seg(call.args[0])]
            if tol is not None and not _is_const(tol, None):
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
            first = (isinstance(node, ast.Subscript) and _is_const(node.slice, 0)) or (
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


# names of torch._six -> the statement that binds the same object without it
_SIX_REPLACEMENTS: Dict[str, str] = {
    "string_classes": "{name} = (str, bytes)",
    "int_classes": "{name} = int",
    "container_abcs": "import collections.abc as {name}",
    "inf": "from math import inf as {name}",
    "nan": "from math import nan as {name}",
    "queue": "import queue as {name}",
    "PY3": "{name} = True",
    "PY2": "{name} = False",
    "imap": "{name} = map",
    "StringIO": "from io import StringIO as {name}",
    "FileNotFoundError": "{name} = FileNotFoundError",
}


class TorchSixImport(Rule):
    """ST018: ``from torch._six import ...`` (removed in torch 2.0).

    ``torch._six`` was torch's private Python 2/3 compatibility module; old code imported
    ``string_classes``, ``int_classes``, ``container_abcs``, ``inf`` ... from it.

    Fix (automatic, safe): bind the same objects without it, one statement per name (on
    the import's line):

        from torch._six import container_abcs, string_classes
        ->  import collections.abc as container_abcs; string_classes = (str, bytes)

    safetorch: ``st.legacy.six``.
    """

    code = "ST018"

    pitfall_id = "legacy-api"
    name = "torch-six-import"
    pitfall = "torch._six was removed in torch 2.0"
    safetorch = "st.legacy.six"
    torch_symbols = ("torch._six",)
    fixable = True
    node_types = (ast.ImportFrom, ast.Import)

    def visit(self, node: ast.AST) -> None:
        if isinstance(node, ast.Import):
            if any(a.name == "torch._six" for a in node.names):
                self.report(
                    node,
                    "torch._six was removed in torch 2.0: import from the "
                    "standard library instead (see st.legacy.SIX_MODERN)",
                )
            return
        if not isinstance(node, ast.ImportFrom) or node.module != "torch._six" or node.level:
            return
        lines: List[str] = []
        for alias in node.names:
            template = _SIX_REPLACEMENTS.get(alias.name)
            if template is None:
                lines = []
                break
            lines.append(template.format(name=alias.asname or alias.name))
        fix = None
        if lines:
            text = "; ".join(lines)  # one line: the statement's line stays where it was
            fix = Fix("import from the standard library", (self.ctx.replace(node, text),))
        names = ", ".join(a.name for a in node.names)
        self.report(
            node,
            f"torch._six was removed in torch 2.0: bind {names} from the standard library "
            "(st.legacy.six has them)",
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
            for n in walk_nodes(fn)
        ):
            self.fail(f"{fn.name} already uses the name ctx")
            return
        for node in walk_nodes(fn):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                if node is not fn and any(a.arg == me for a in node.args.args):
                    self.fail(f"{fn.name} rebinds {me} in a nested function")
                    return
        up = {id(c): p for p in walk_nodes(fn) for c in ast.iter_child_nodes(p)}
        renames: List[Edit] = []
        for node in walk_nodes(fn):
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
                n.id for n in walk_nodes(forward) if isinstance(n, ast.Name)
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
            else {id(n) for n in walk_nodes(removed) if isinstance(n, ast.Name)}
        )
        for node in walk_nodes(self.ctx.tree):
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
                for n in walk_nodes(self.ctx.tree)
                if isinstance(n, ast.Name) and n.id == target.id and isinstance(n.ctx, ast.Load)
            ]
        elif isinstance(target, ast.Attribute) and _self_attr(target) is not None:
            uses = [
                n
                for n in walk_nodes(self.ctx.tree)
                if isinstance(n, ast.Attribute)
                and _self_attr(n) == target.attr
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

    pitfall_id = "legacy-api"
    name = "legacy-autograd-function"
    pitfall = "autograd.Function with non-static forward raises since torch 1.5"
    safetorch = "st.legacy.legacy_function"
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
    return _keyword(call, "dim") is not None or _keyword(call, "axis") is not None


def _reduces_to_scalar(call: ast.Call) -> Optional[bool]:
    """Whether a loss call or constructor keeps the default reduction (a 0-dim result)."""
    reduction = _keyword(call, "reduction")
    if reduction is not None:
        value = reduction.value
        if isinstance(value, ast.Constant):
            return value.value != "none"
        return None
    reduce = _keyword(call, "reduce")
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
            for stmt in _statements_in_order(body if isinstance(body, list) else []):
                if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
                    target = stmt.targets[0]
                    if isinstance(target, ast.Name):
                        found.setdefault(target.id, []).append((_pos(stmt), stmt.value, False))
                    elif isinstance(target, (ast.Tuple, ast.List)):
                        for i, elt in enumerate(target.elts):
                            if isinstance(elt, ast.Name):
                                item = _Unpacked(stmt.value, i)
                                found.setdefault(elt.id, []).append((_pos(stmt), item, False))
                elif isinstance(stmt, ast.AugAssign) and isinstance(stmt.target, ast.Name):
                    found.setdefault(stmt.target.id, []).append((_pos(stmt), stmt.value, True))
            self._assigns[id(scope)] = found
        return found

    def _self_attr_value(self, attr: str) -> Optional[ast.AST]:
        if self._self_attrs is None:
            self._self_attrs = {}
            for node in walk_nodes(self.ctx.tree):
                if isinstance(node, ast.Assign) and len(node.targets) == 1:
                    name = _self_attr(node.targets[0])
                    if name is not None:
                        self._self_attrs[name] = node.value
        return self._self_attrs.get(attr)

    def functions(self, name: str) -> List[ast.FunctionDef]:
        """The functions and methods of the file called ``name``."""
        if self._functions is None:
            self._functions = {}
            for node in walk_nodes(self.ctx.tree):
                if isinstance(node, ast.FunctionDef):
                    self._functions.setdefault(node.name, []).append(node)
        return self._functions.get(name, [])

    def _call_sites(self, name: str) -> List[ast.Call]:
        if self._calls is None:
            self._calls = {}
            for node in walk_nodes(self.ctx.tree):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                    self._calls.setdefault(node.func.id, []).append(node)
        return self._calls.get(name, [])

    def scope_of(self, node: ast.AST) -> ast.AST:
        """The function (or the module) whose body holds ``node``."""
        up = parents(self.ctx)
        current = up.get(id(node))
        while current is not None and not isinstance(current, (*_FUNCTIONS, ast.Lambda)):
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
            kw = _keyword(call, name)
            if kw is not None:
                arg = kw.value
            if arg is None:
                return None
            results.append(self.decide(arg, _pos(call), self.scope_of(call), depth))
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
                return self._from_callers(where, index, depth)  # type: ignore[arg-type]  # _param_index is None for anything but a FunctionDef
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
        attr = _self_attr(func)
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
            if qual.startswith(_NN) and qual.endswith("Loss"):
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
        keep = _keyword(call, "keepdim")
        if keep is not None and not _is_const(keep.value, False):
            return base if _is_const(keep.value, True) else None
        has_dim = bool(call.args) or _keyword(call, "dim") is not None
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
            keep = _keyword(call, "keepdim")
            if base is None or method in _PAIR_METHODS:
                return None
            if keep is not None:
                return base if _is_const(keep.value, True) else None
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
            for node in walk_nodes(self.ctx.tree):
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
            results.append(self.decide(value.elts[item.index], _pos(ret), fns[0], depth))
        return _all_true(results)

    def _returns(self, name: str, depth: int) -> Optional[bool]:
        """``f(...)`` with ``f`` a function of the file: decided from its return values."""
        fns = self.functions(name)
        if len(fns) != 1 or name in self.ctx.imports:
            return None
        rets = [r.value for r in _own_returns(fns[0])]
        if not rets or any(r is None for r in rets):
            return None
        return _all_true([self.decide(r, _pos(r), fns[0], depth) for r in rets if r is not None])

    def _call(self, call: ast.Call, at: Pos, scope: ast.AST, depth: int) -> Optional[bool]:
        func = call.func
        qual = self.ctx.qualname(func) or ""
        if qual.startswith(_F):
            if qual[len(_F) :] in _FUNCTIONAL_LOSSES:
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
        if qual.startswith(_NN) and qual.endswith("Loss"):
            return None  # the constructor itself
        if isinstance(func, ast.Call):  # nn.MSELoss()(a, b)
            inner = self.ctx.qualname(func.func) or ""
            if inner.startswith(_NN) and inner.endswith("Loss"):
                return _reduces_to_scalar(func)
            return None
        if isinstance(func, ast.Attribute) and not qual:
            attr = func.attr
            if attr in _REDUCTIONS and _self_attr(func) is None:
                positional = len(call.args) - (1 if attr == "norm" else 0)
                if _dim_keyword(call) or positional > 0:
                    return False
                return True
            if attr in _ELEMENTWISE and _self_attr(func) is None:
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


def _numpy_source(node: ast.AST) -> Optional[ast.AST]:
    """``x`` for ``x.numpy()``, ``x.data.numpy()``, ``x.cpu().data.numpy()``,
    ``x.data.cpu().numpy()``: the tensor a ``.numpy()`` array was made from."""
    if not (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "numpy"
        and not node.args
    ):
        return None
    inner: ast.AST = node.func.value
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

    pitfall_id = "legacy-api"
    name = "zero-dim-index"
    pitfall = "loss.data[0] raises on a 0-dim tensor since torch 0.5"
    safetorch = "st.legacy.zero_dim_index"
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
                if self.flow.decide(array_of, _pos(node), self.ctx.scope, 0) is True:
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
            elif self.flow.decide(base, _pos(node), self.ctx.scope, 0) is True:
                self._item_fix(
                    node,
                    base,
                    "x[0] of a 0-dim tensor raises since torch 0.5: use x.item() "
                    "(under safetorch run, st.legacy.zero_dim_index gives the number, as 0.3 did)",
                )
                return
        self._number_index(node)

    def _data_index(self, node: ast.Subscript, data: ast.Attribute) -> bool:
        decided = self.flow.decide(data.value, _pos(node), self.ctx.scope, 0)
        if decided is False:
            return False
        if decided is None:
            root = (_var_key(data.value) or "").lower()
            if isinstance(data.value, ast.Call):
                root = (_var_key(data.value.func) or "").lower()
            if not any(word in root for word in _SCALAR_NAMES + ("criterion",)):
                return False
        self._item_fix(
            node,
            data.value,
            "x.data[0] of a 0-dim tensor raises since torch 0.5: use x.item() "
            "(under safetorch run, st.legacy.zero_dim_index gives the number, as 0.3 did)",
        )
        return True

    def _item_fix(self, node: ast.AST, tensor: ast.AST, message: str) -> None:
        text = f"{self.ctx.segment(tensor)}.item()"
        if not isinstance(tensor, (ast.Name, ast.Attribute, ast.Call, ast.Subscript)):
            text = f"({self.ctx.segment(tensor)}).item()"  # (a + b).data[0]
        fix = Fix(f"use {text}", (self.ctx.replace(node, text),), UNSAFE)
        self.report(node, message, fix)

    def _number_index(self, node: ast.Subscript) -> None:
        """torch 0.3's ``topi[0][0]`` (a Python number then) used as a dict key."""
        flow = self.flow
        at, scope = _pos(node), self.ctx.scope
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
                for n in walk_nodes(scope)
                if isinstance(n, ast.Subscript)
                and isinstance(n.slice, ast.Name)
                and n.slice.id == name
                and _pos(n) > at
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
      class is defined after it) the call becomes ``st.legacy.volatile(x)``, the tensor that
      computes everything from it without a graph.
    - ``volatile=flag`` (``get_batch(..., evaluation=True)``): ``(st.legacy.volatile(x) if
      flag else Variable(x))``.
    - ``type(h) == Variable`` -> ``isinstance(h, torch.Tensor)`` (``!=``: ``not
      isinstance``); True for ``nn.Parameter`` too, where 0.3 and
      ``st.legacy.is_variable_type`` say False.

    safetorch: ``st.legacy.volatile`` (and ``st.legacy.is_variable_type``).
    """

    code = "ST021"

    pitfall_id = "legacy-api"
    name = "volatile-variable"
    pitfall = "Variable(volatile=True) is a no-op since torch 0.4: a graph is built"
    safetorch = "st.legacy.volatile"
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
        volatile = _keyword(node, "volatile")
        value = volatile.value if volatile is not None else None
        if value is None and len(node.args) > 2:
            value = node.args[2]
        if value is None or _is_const(value, False):
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
        if len(call.args) > 2 or _has_star(call) or _has_double_star(call) or not call.args:
            return None
        parts = [self.ctx.segment(a) for a in call.args]
        parts += [self.ctx.segment(k) for k in call.keywords if k.arg != "volatile"]
        return f"{self.ctx.segment(call.func)}({', '.join(parts)})"

    def _fix(self, call: ast.Call, kw: Optional[ast.keyword], value: ast.AST) -> Optional[Fix]:
        plain = self._plain_variable(call)
        if plain is None or kw is None:
            return None
        where = _pos(call)
        if any(lo <= where <= hi for lo, hi in self._wrapped):
            # The rest of this block already goes under no_grad (an earlier finding's fix).
            return Fix("drop volatile=True", (self.ctx.replace(call, plain),), UNSAFE)
        if _is_const(value, True):
            wrap = self._no_grad(call, plain)
            if wrap is not None:
                return wrap
        names = import_edit(self.ctx, [("safetorch", "st")])
        if names is None:
            return None
        spelled, imports = names
        data = self.ctx.segment(call.args[0])
        text = f"{spelled['safetorch']}.legacy.volatile({data})"
        if not _is_const(value, True):
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
        names = import_edit(self.ctx, [("torch", None)])
        if names is None:
            return None
        spelled, imports = names
        wrap = wrap_edits(self.ctx, region, f"with {spelled['torch']}.no_grad()")
        if wrap is None:
            return None
        self._wrapped.append((_pos(region[0]), _end_pos(region[-1])))
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


def _under_no_grad(ctx: Context, stmt: ast.AST) -> bool:
    """Whether ``stmt`` runs inside ``with torch.no_grad():`` (in its own function)."""
    up = parents(ctx)
    current = up.get(id(stmt))
    while current is not None and not isinstance(current, (*_FUNCTIONS, ast.ClassDef)):
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

    pitfall_id = "legacy-api"
    name = "legacy-loss-reduction"
    pitfall = "size_average=/reduce= are deprecated spellings of reduction="
    safetorch = "st.legacy.reduction"
    torch_symbols = ("torch.nn._reduction.legacy_get_string",)
    fixable = True
    node_types = (ast.Call,)

    def visit(self, node: ast.Call) -> None:
        qual = self.ctx.qualname(node.func) or ""
        if not qual.startswith("torch.nn."):
            return
        size_average = _keyword(node, "size_average")
        reduce = _keyword(node, "reduce")
        if size_average is None and reduce is None:
            return
        values = []
        for kw in (size_average, reduce):
            node_value = None if kw is None else kw.value
            if node_value is None or _is_const(node_value, None):
                values.append(True)
            else:
                values.append(_literal_bool(node_value, True))  # type: ignore[arg-type]  # node_value is an ast.expr once None is excluded above
        fix = None
        if None not in values and _keyword(node, "reduction") is None:
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
        items: List[ast.AST] = [*call.args, *call.keywords]
        index = items.index(kw)
        if index == 0:
            return None
        prev = items[index - 1]
        line, col = self.ctx.end(prev)
        end_line, end_col = self.ctx.end(kw)
        return Edit(line, col, end_line, end_col, "")


class SyntaxErrorRule(Rule):
    """ST000: the file does not parse.

    Reported with the parser's message at its position; the other files are still checked.
    Nothing else is reported for this file.

    safetorch: none.
    """

    code = SYNTAX_ERROR_CODE
    name = "syntax-error"
    pitfall = "the file is not valid Python"
    safetorch = None
    torch_symbols = ()


RULES: Tuple[Type[Rule], ...] = (
    DeprecatedUpsampleFunction,
    DeprecatedUpsamplingModule,
    LoadWithoutWeightsOnly,
    LoadWithoutMapLocation,
    DetachThenInPlace,
    UnsyncedCudaTiming,
    PositionalWithDefault,
    BiasBeforeBatchNorm,
    DropoutBeforeBatchNorm,
    CustomBatchWithoutPinMemory,
    StateDictOfWrappedModel,
    DiscardedNonStrictLoad,
    DataParallelUsed,
    ConvertSyncBatchNorm,
    PositionalEpsInNorm,
    FunctionalDropoutWithoutTraining,
    RemovedLinalgFunction,
    TorchSixImport,
    LegacyAutogradFunction,
    ZeroDimIndex,
    VolatileVariable,
    LegacyLossReduction,
)


@dataclass(frozen=True)
class RuleInfo:
    """One row of ``RULE_TABLE``: a rule code, its pitfall and the safetorch function for it.

    Attributes:
        code: The rule code (``"ST003"``).
        name: The rule's name (``"load-without-weights-only"``).
        pitfall: One line: what goes wrong.
        safetorch: The public safetorch function for the pitfall, or None.
        torch_symbols: The torch entry points the pitfall lives in.
        fixable: Whether the rule has automatic fixes (for some of its findings).
        fix_applicability: ``"safe"`` (``--fix``), ``"unsafe"`` (``--unsafe-fixes``) or a
            phrase saying what it depends on.
        pitfall_id: The id of the rule's row in the pitfall table (``safetorch._pitfalls``);
            ``""`` for ST000 (a file that does not parse is not a pitfall).
        preview: An opt-in rule: it runs only when selected by its exact code or ``PREVIEW``.

    >>> RULE_TABLE["ST003"].safetorch
    'st.load'
    >>> RULE_TABLE["ST001"].safetorch_for("torch.nn.functional.upsample_bilinear")
    'st.upsample_bilinear'
    """

    code: str
    name: str
    pitfall: str
    safetorch: Optional[str]
    torch_symbols: Tuple[str, ...]
    fixable: bool
    fix_applicability: str = SAFE
    pitfall_id: str = ""
    preview: bool = False

    def safetorch_for(self, symbol: str) -> Optional[str]:
        """The safetorch function that replaces torch entry point ``symbol`` of this rule."""
        if symbol not in self.torch_symbols:
            return None
        if symbol in _UPSAMPLE_FUNCS:
            return _UPSAMPLE_FUNCS[symbol][1]
        return self.safetorch


_ALL_RULES: Tuple[Type[Rule], ...] = (SyntaxErrorRule, *RULES)

#: code -> the rule's facts: name, pitfall-table row (``pitfall_id``), safetorch function, and
#: the torch entry points it finds (``RULE_TABLE[code].safetorch_for(symbol)`` gives the
#: function for one entry point). Patches and rules meet in ``safetorch._pitfalls``.
RULE_TABLE: Dict[str, RuleInfo] = {
    r.code: RuleInfo(
        r.code,
        r.name,
        r.pitfall,
        r.safetorch,
        r.torch_symbols,
        r.fixable,
        r.fix_applicability,
        r.pitfall_id,
        r.preview,
    )
    for r in _ALL_RULES
}

#: Codes of the opt-in rules (see ``select_rules``).
PREVIEW_RULES: Tuple[str, ...] = tuple(r.code for r in RULES if r.preview)


#: Where the documentation pages live: ``--explain`` prints absolute links into them.
DOCS_URL = "https://github.com/safetorch/safetorch/blob/main/"
_ROLE = re.compile(r":[a-z]+:`([^`]+)`")  # :class:`X` -> X
_LITERAL = re.compile(r"``(.+?)``", re.DOTALL)  # ``x`` -> `x`


def plain_text(doc: str) -> str:
    """A rule docstring as plain text: reST literals and roles become plain backquotes.

    >>> plain_text("Use ``st.load`` (see :func:`st.load`).")
    'Use `st.load` (see `st.load`).'
    """
    return _LITERAL.sub(r"`\1`", _ROLE.sub(r"``\1``", doc))


def docs_link(relative: str) -> str:
    """``docs/nn.md#anchor`` -> the page's absolute address.

    >>> docs_link("docs/check.md#st003")
    'https://github.com/safetorch/safetorch/blob/main/docs/check.md#st003'
    """
    if "://" in relative:
        return relative
    return DOCS_URL + relative.lstrip("/")


def explain_text(code: str) -> str:
    """What ``safetorch check --explain CODE`` prints: the rule's code, name, pitfall row
    (with an absolute documentation link), whether it is a preview rule, and its docstring
    as plain text.

    Raises:
        KeyError: No rule has that code.

    >>> print(explain_text("ST008").splitlines()[1])  # doctest: +ELLIPSIS
    pitfall: bias-before-bn (...), https://github.com/safetorch/safetorch/blob/main/docs/nn.md#...
    """
    import inspect

    from safetorch import _pitfalls

    rule = rule_for(code)
    doc = plain_text(inspect.cleandoc(rule.__doc__ or ""))
    head = f"{rule.code} ({rule.name}): {rule.pitfall}\n"
    if rule.pitfall_id:
        row = _pitfalls.by_id(rule.pitfall_id)
        faces = [f"safetorch: {', '.join(row.functions)}"] if row.functions else []
        faces += [f"patch: st.patch({row.patch!r})"] if row.patch else []
        faces += [f"runtime check: {', '.join(row.findings)}"] if row.findings else []
        head += f"pitfall: {row.id} ({row.title}), {docs_link(row.docs)}\n"
        head += "".join(f"  {face}\n" for face in faces)
    if rule.preview:
        head += f"preview: opt-in, runs only with --select {rule.code} (or PREVIEW)\n"
    return f"{head}\n{doc}\n"


def rule_for(code: str) -> Type[Rule]:
    """The rule class for ``code`` (case-insensitive).

    Raises:
        KeyError: No rule has that code.

    >>> rule_for("st005").name
    'detach-then-inplace'
    """
    code = code.strip().upper()
    for rule in _ALL_RULES:
        if rule.code == code:
            return rule
    raise KeyError(f"unknown rule code {code!r}: expected one of {', '.join(RULE_TABLE)}")


def _as_codes(spec: Union[str, Iterable[str], None]) -> Optional[List[str]]:
    if spec is None:
        return None
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    return [c.strip().upper() for c in items if c.strip()]


def _matches(code: str, prefixes: Sequence[str]) -> bool:
    return any(p == "ALL" or code.startswith(p) for p in prefixes)


def select_rules(
    select: Union[str, Iterable[str], None] = None,
    ignore: Union[str, Iterable[str], None] = None,
) -> Tuple[Tuple[Type[Rule], ...], bool]:
    """The rules ``--select``/``--ignore`` leave on, and whether ST000 is reported.

    Codes match by prefix (``ST00`` selects ST000-ST009), ``ALL`` matches every rule; a
    comma-separated string or a list of codes is accepted. Preview rules (``PREVIEW_RULES``,
    below the default set's precision) run only when their exact code or ``PREVIEW`` is
    selected (``--select ALL,PREVIEW`` runs everything).

    Args:
        select: Codes to run (default: all).
        ignore: Codes to skip (applied after ``select``).

    Returns:
        (rule classes, report syntax errors).

    Raises:
        ValueError: A code or prefix that matches no rule.

    >>> rules, syntax = select_rules("ST003,ST004")
    >>> [r.code for r in rules], syntax
    (['ST003', 'ST004'], False)
    """
    chosen = _as_codes(select) or ["ALL"]
    dropped = _as_codes(ignore) or []
    for code in (*chosen, *dropped):
        if code not in ("ALL", PREVIEW) and not any(c.startswith(code) for c in RULE_TABLE):
            raise ValueError(
                f"unknown rule code {code!r}: expected ALL, a code or a prefix of "
                f"{', '.join(RULE_TABLE)}"
            )

    def on(code: str) -> bool:
        return _matches(code, chosen) and not (dropped and _matches(code, dropped))

    def preview_on(code: str) -> bool:
        # Preview rules (precision below the default set's) run only when named exactly
        # or with PREVIEW, as ruff's preview rules need an explicit opt-in.
        named = code in chosen or PREVIEW in chosen
        return named and not (dropped and _matches(code, dropped))

    chosen_rules = tuple(r for r in RULES if (preview_on if r.preview else on)(r.code))
    return chosen_rules, on(SYNTAX_ERROR_CODE)
