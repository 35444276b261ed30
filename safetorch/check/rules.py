"""The rules of ``safetorch check``: one small class per pitfall, its docstring is its ``--explain``.

Each rule names (or rewrites into) the public safetorch function for its pitfall.
``RULE_TABLE`` maps every code to that pitfall and function, and to the torch entry points
it lives in, so monkeypatch mode can pair each patch with its rule.
"""

from __future__ import annotations

import ast
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

from safetorch.check.engine import SYNTAX_ERROR_CODE, Context, Edit, Fix, Rule

__all__ = ["RULES", "RULE_TABLE", "RuleInfo", "SyntaxErrorRule", "rule_for", "select_rules"]

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
    last = max(items, key=lambda n: (n.end_lineno, n.end_col_offset))  # type: ignore[attr-defined]
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

    Fix (automatic): rename to ``F.interpolate`` and add exactly the arguments that keep the
    result identical: ``mode="nearest"`` for ``upsample_nearest``,
    ``mode="bilinear", align_corners=True`` for ``upsample_bilinear``.

        F.upsample_bilinear(x, scale_factor=2)
        ->  F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=True)

    safetorch: ``st.upsample``, ``st.upsample_nearest``, ``st.upsample_bilinear``.
    """

    code = "ST001"
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

    Fix (automatic): ``nn.Upsample(...)`` with the equivalent mode and align_corners:

        nn.UpsamplingBilinear2d(scale_factor=2)
        ->  nn.Upsample(scale_factor=2, mode="bilinear", align_corners=True)

    safetorch: ``st.Upsample``.
    """

    code = "ST002"
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


class LoadWithoutWeightsOnly(Rule):
    """ST003: ``torch.load`` without ``weights_only``.

    ``torch.load`` unpickles: with ``weights_only=False`` (the default before torch 2.6) a
    checkpoint file can run arbitrary code when loaded. Saying ``weights_only=True`` makes
    the call safe and behave the same on every torch version.

    Fix (automatic): add ``weights_only=True``.

    safetorch: ``st.load`` (weights_only by default, clear error naming the blocked type).
    """

    code = "ST003"
    name = "load-without-weights-only"
    pitfall = "torch.load unpickles arbitrary objects unless weights_only=True"
    safetorch = "st.load"
    torch_symbols = ("torch.load",)
    fixable = True
    node_types = (ast.Call,)

    def visit(self, node: ast.Call) -> None:
        if self.ctx.qualname(node.func) != "torch.load" or _has_double_star(node):
            return
        if _keyword(node, "weights_only") is not None or not _loads_something(node):
            return
        edit = _add_keywords(self.ctx, node, "weights_only=True")
        fix = None if edit is None else Fix("add weights_only=True", (edit,))
        self.report(
            node,
            "torch.load without weights_only can execute code from the file: "
            "pass weights_only=True or use st.load",
            fix,
        )


class LoadWithoutMapLocation(Rule):
    """ST004: ``torch.load`` without ``map_location``.

    Without ``map_location`` every tensor goes back to the device it was saved from: loading
    a GPU checkpoint fails on a CPU-only machine, and in multi-GPU jobs every rank piles its
    copy onto ``cuda:0``.

    Fix (manual): pass ``map_location="cpu"`` (or the rank's device).

    safetorch: ``st.load`` (maps to CPU unless told otherwise).
    """

    code = "ST004"
    name = "load-without-map-location"
    pitfall = "torch.load restores tensors to the device they were saved from"
    safetorch = "st.load"
    torch_symbols = ("torch.load",)
    node_types = (ast.Call,)

    def visit(self, node: ast.Call) -> None:
        if self.ctx.qualname(node.func) != "torch.load" or _has_double_star(node):
            return
        if _keyword(node, "map_location") is not None or _has_star(node):
            return
        if len(node.args) > 1 or not _loads_something(node):
            return
        self.report(
            node,
            "torch.load without map_location puts tensors back on the device they were "
            'saved from: pass map_location="cpu" (or the target device) or use st.load',
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

    Fix (automatic): ``.detach().clone()``, an independent copy -- offered only where the
    modified value is used afterwards and the op is not a write-through idiom. A statement
    whose only effect is the write into ``x`` (``x.detach().zero_()`` on its own line,
    ``y = x.detach(); y.copy_(src)``) would become dead code with a clone, so it is reported
    without a fix: write it as ``with torch.no_grad(): x.zero_()`` if the write is intended.

    safetorch: ``st.safe_copy``.
    """

    code = "ST005"
    name = "detach-then-inplace"
    pitfall = "detach() shares memory; an in-place op on it changes the original tensor"
    safetorch = "st.safe_copy"
    torch_symbols = ("torch.Tensor.detach",)
    fixable = True
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
            fixable = value_used and op.strip(".()") not in _WRITE_THROUGH
            self._direct.append((target, op, line, fixable))  # type: ignore[arg-type]
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
                self._mutation(node.func.value, f".{method}()", node.lineno, used)  # type: ignore[attr-defined]
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
                if _is_detach_call(node.value):
                    bound[first.id] = _Detached(node.value)  # type: ignore[arg-type]

    def _report(self, detach: ast.Call, op: str, line: int, fixable: bool) -> None:
        source = detach.func.value  # type: ignore[attr-defined]
        x = self.ctx.segment(source)
        head = f"{self.ctx.segment(detach)} shares memory with {x} and is modified in place "
        head += f"({op}, line {line}), which changes {x} too"
        if fixable:
            fix = Fix("add .clone()", (self.ctx.insert_after(detach, ".clone()"),))
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
            return "self." + node.attr  # type: ignore[attr-defined]
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


class UnsyncedCudaTiming(Rule):
    """ST006: wall-clock timing of CUDA code without ``torch.cuda.synchronize()``.

    CUDA kernels run asynchronously: ``time.time()`` / ``time.perf_counter()`` /
    ``time.monotonic()`` read after launching GPU work measure the launch, not the work.
    The rule fires on the second of two readings in one function when code runs between the
    readings, nothing between them waits for the GPU (``torch.cuda.synchronize()``,
    ``.synchronize()``, or a host copy such as ``.item()``), and that code uses CUDA: the
    function mentions CUDA (``.cuda()``, ``torch.cuda``, ``"cuda:0"``), or a call between the
    readings uses a name the file assigns from such an expression
    (``model = Net().cuda()`` ... ``model(x)``).

    Fix (manual): call ``torch.cuda.synchronize()`` before the second reading, or time with
    CUDA events.

    safetorch: ``st.cuda_timer`` (events, synchronizes once at the end).
    """

    code = "ST006"
    name = "unsynced-cuda-timing"
    pitfall = "CUDA is asynchronous; wall-clock readings without synchronize time the launch"
    safetorch = "st.cuda_timer"
    torch_symbols = tuple(sorted(_TIMERS))
    node_types = (ast.Call, ast.Constant, ast.Attribute)

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self._cuda_scopes: Set[int] = set()
        self._any_timer = False
        # scope -> [(kind, node)], kind in "timer", "sync", "work", in source order
        self._events: Dict[int, List[Tuple[str, ast.Call]]] = {}

    def visit(self, node: ast.AST) -> None:
        if not isinstance(node, ast.Call):
            if _is_cuda_marker(node):
                self._cuda_scopes.add(id(self.ctx.scope))
            return
        func = node.func
        qual = self.ctx.qualname(func)
        if qual in _TIMERS:
            kind = "timer"
            self._any_timer = True
        elif qual in _SYNC_FUNCS or (
            isinstance(func, ast.Attribute) and func.attr in _SYNC_METHODS
        ):
            kind = "sync"
        elif isinstance(func, ast.Name) and func.id in _NOT_WORK:
            return
        else:
            kind = "work"
        self._events.setdefault(id(self.ctx.scope), []).append((kind, node))

    def _cuda_names(self) -> Set[str]:
        """Names (and ``self.x``) the file assigns from an expression that mentions CUDA."""
        names = self.ctx.cache.get("cuda_names")
        if names is None:
            names = set()
            for node in ast.walk(self.ctx.tree):
                if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                    if any(_is_cuda_marker(n) for n in ast.walk(node.value)):
                        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                        names.update(filter(None, (_root_name(t) for t in targets)))
            self.ctx.cache["cuda_names"] = names
        return names  # type: ignore[no-any-return]

    def _uses_cuda_name(self, calls: List[ast.Call]) -> bool:
        names = self._cuda_names()
        if not names:
            return False
        for call in calls:
            for part in (call.func, *call.args, *(k.value for k in call.keywords)):
                if _root_name(part) in names:
                    return True
        return False

    def finish(self) -> None:
        if not self._any_timer:
            return
        for scope, events in self._events.items():
            previous: Optional[ast.Call] = None
            work: List[ast.Call] = []
            synced = False
            for kind, node in events:
                if kind == "timer":
                    if (
                        previous is not None
                        and work
                        and not synced
                        and (scope in self._cuda_scopes or self._uses_cuda_name(work))
                    ):
                        self.report(
                            node,
                            f"{self.ctx.qualname(node.func)}() reads the clock after CUDA work "
                            "with no torch.cuda.synchronize() since the reading at line "
                            f"{previous.lineno}: it times the kernel launch, not the kernels; "
                            "synchronize first or use st.cuda_timer",
                        )
                    previous, work, synced = node, [], False
                elif kind == "sync":
                    synced = True
                else:
                    work.append(node)


# ---------------------------------------------------------------------------------------------
# argparse positional with default=
# ---------------------------------------------------------------------------------------------
class PositionalWithDefault(Rule):
    """ST007: an argparse positional argument with ``default=`` but no ``nargs="?"``.

    A positional argument is required unless ``nargs`` is ``"?"`` or ``"*"``, whatever its
    ``default``: ``parser.add_argument("configs", default="a.yaml")`` still fails with
    ``error: the following arguments are required: configs`` when it is left out.

    Fix (automatic): add ``nargs="?"``, which makes the argument optional and uses the
    default when it is missing.

    safetorch: none (a plain argparse pitfall, common in training scripts).
    """

    code = "ST007"
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
Pair = Tuple[ast.Call, ast.Call]


def _sequential_items(ctx: Context, call: ast.Call) -> List[ast.AST]:
    """The layers of ``nn.Sequential(a, b, ...)`` or ``nn.Sequential(OrderedDict([...]))``."""
    if len(call.args) == 1 and isinstance(call.args[0], ast.Call):
        inner = call.args[0]
        name = ctx.qualname(inner.func) or ""
        if name.endswith("OrderedDict") and inner.args:
            items = inner.args[0]
            if isinstance(items, (ast.List, ast.Tuple)):
                return [
                    e.elts[1]
                    for e in items.elts
                    if isinstance(e, (ast.Tuple, ast.List)) and len(e.elts) == 2
                ]
    return list(call.args)


def _self_attr(node: ast.AST) -> Optional[str]:
    if (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
    ):
        return node.attr
    return None


def _layer_called(node: Optional[ast.AST]) -> Optional[Tuple[str, ast.Call]]:
    """``self.layer(arg, ...)`` -> ("layer", call)."""
    if isinstance(node, ast.Call):
        attr = _self_attr(node.func)
        if attr is not None:
            return attr, node
    return None


def _forward_pairs(cls: ast.ClassDef) -> List[Tuple[str, str]]:
    """Pairs of ``self.<a>``, ``self.<b>`` layers that ``forward`` applies back to back."""
    forward = next(
        (s for s in cls.body if isinstance(s, ast.FunctionDef) and s.name == "forward"), None
    )
    if forward is None:
        return []
    pairs: List[Tuple[str, str]] = []
    for node in ast.walk(forward):
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


def _init_layers(cls: ast.ClassDef) -> Dict[str, ast.Call]:
    """``self.<name> = <call>`` assignments in ``__init__``."""
    layers: Dict[str, ast.Call] = {}
    for stmt in cls.body:
        if isinstance(stmt, ast.FunctionDef) and stmt.name == "__init__":
            for node in ast.walk(stmt):
                if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
                    for target in node.targets:
                        attr = _self_attr(target)
                        if attr is not None:
                            layers[attr] = node.value
    return layers


def adjacent_layers(ctx: Context, node: ast.AST) -> List[Pair]:
    """Constructor calls of layers applied one right after the other.

    From ``nn.Sequential(...)`` (``node`` a call) or from a module class whose ``forward``
    applies ``self.a`` then ``self.b`` directly (``node`` a class). Shared by ST008 and ST009
    through ``ctx.cache``.
    """
    cache = ctx.cache.setdefault("adjacent_layers", {})
    key = id(node)
    if key in cache:
        return cache[key]  # type: ignore[no-any-return]
    pairs: List[Pair] = []
    if isinstance(node, ast.Call):
        if ctx.qualname(node.func) == _NN + "Sequential":
            items = _sequential_items(ctx, node)
            for a, b in zip(items, items[1:]):
                if isinstance(a, ast.Call) and isinstance(b, ast.Call):
                    pairs.append((a, b))
    elif isinstance(node, ast.ClassDef):
        names = _forward_pairs(node)
        if names:
            layers = _init_layers(node)
            for a_name, b_name in names:
                if a_name in layers and b_name in layers:
                    pairs.append((layers[a_name], layers[b_name]))
    cache[key] = pairs
    return pairs


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


class BiasBeforeBatchNorm(Rule):
    """ST008: a Conv/Linear layer with a bias immediately followed by BatchNorm.

    BatchNorm subtracts the per-channel mean, so the bias of the layer before it cancels
    out: parameters and compute spent on nothing (and weight decay applied to them). Found
    in ``nn.Sequential(...)`` and in ``forward`` methods that apply ``self.conv`` then
    ``self.bn`` directly.

    Fix (automatic): ``bias=False`` on the Conv/Linear layer.

    safetorch: ``st.lint_model`` reports the same on a built model at runtime.
    """

    code = "ST008"
    name = "bias-before-batchnorm"
    pitfall = "a bias right before BatchNorm is cancelled by the mean subtraction"
    safetorch = "st.lint_model"
    torch_symbols = ()
    fixable = True
    node_types = (ast.Call, ast.ClassDef)

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self._reported: Set[int] = set()

    def visit(self, node: ast.AST) -> None:
        for layer, after in adjacent_layers(self.ctx, node):
            qual = self.ctx.qualname(layer.func)
            bn = self.ctx.qualname(after.func)
            if qual not in _BIASED or bn not in _BATCHNORMS or id(layer) in self._reported:
                continue
            known, value = _bias_arg(layer, _BIASED[qual])
            if not known:
                continue
            if value is not None and not _is_const(value, True):
                continue  # bias=False, or an expression we cannot judge
            self._reported.add(id(layer))
            if value is None:
                edit = _add_keywords(self.ctx, layer, "bias=False")
            else:
                edit = self.ctx.replace(value, "False")
            fix = None if edit is None else Fix("set bias=False", (edit,))
            self.report(
                layer,
                f"{_short(qual)} has a bias that the following {_short(bn or '')} cancels: "
                "pass bias=False (st.lint_model finds this at runtime)",
                fix,
            )


class DropoutBeforeBatchNorm(Rule):
    """ST009: Dropout immediately followed by BatchNorm.

    BatchNorm's running statistics are collected on dropped-out activations in training but
    applied to full activations in eval ("variance shift"), so eval accuracy drops. Put
    Dropout after BatchNorm (or after the block).

    Fix (manual): swap the two layers.

    safetorch: ``st.lint_model`` reports the same on a built model at runtime.
    """

    code = "ST009"
    name = "dropout-before-batchnorm"
    pitfall = "Dropout before BatchNorm makes train and eval statistics disagree"
    safetorch = "st.lint_model"
    torch_symbols = ()
    node_types = (ast.Call, ast.ClassDef)

    def visit(self, node: ast.AST) -> None:
        for layer, after in adjacent_layers(self.ctx, node):
            qual = self.ctx.qualname(layer.func)
            bn = self.ctx.qualname(after.func)
            if qual in _DROPOUTS and bn in _BATCHNORMS:
                self.report(
                    layer,
                    f"{_short(qual)} right before {_short(bn or '')} shifts the statistics "
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
    name = "custom-batch-without-pin-memory"
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
            for node in ast.walk(fn):
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


def _holder_key(ctx: Context, node: ast.AST) -> Optional[Tuple[object, ...]]:
    """A key for ``name`` (per scope) or ``self.attr`` (per file) holding a model."""
    if isinstance(node, ast.Name):
        return ("name", id(ctx.scope), node.id)
    attr = _self_attr(node)
    if attr is not None:
        return ("self", attr)
    return None


class StateDictOfWrappedModel(Rule):
    """ST011: ``torch.save(m.state_dict(), ...)`` where ``m`` is a DataParallel/DDP wrapper.

    The wrapper's state_dict keys all start with ``module.``, so the file does not load into
    the bare model (``Missing key(s) in state_dict: "conv.weight" ... Unexpected key(s):
    "module.conv.weight"``).

    Fix (manual): save ``m.module.state_dict()`` (when ``m`` is always wrapped) or
    ``st.unwrap_model(m).state_dict()``; ``st.load_state_dict`` strips the prefix when
    loading such files.

    safetorch: ``st.unwrap_model``.
    """

    code = "ST011"
    name = "state-dict-of-wrapped-model"
    pitfall = "a DataParallel/DDP state_dict has 'module.'-prefixed keys"
    safetorch = "st.unwrap_model"
    torch_symbols = ("torch.save",)
    node_types = (ast.Assign, ast.Call)

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self._wrapped: Dict[Tuple[object, ...], str] = {}

    def visit(self, node: ast.AST) -> None:
        if isinstance(node, ast.Assign):
            value = node.value
            wrapper = None
            if isinstance(value, ast.Call):
                wrapper = _WRAPPERS.get(self.ctx.qualname(value.func) or "")
            for target in node.targets:
                key = _holder_key(self.ctx, target)
                if key is None:
                    continue
                if wrapper is not None:
                    self._wrapped[key] = wrapper
                else:  # rebound to something else (e.g. model = model.module)
                    self._wrapped.pop(key, None)
            return
        assert isinstance(node, ast.Call)
        if not node.args or self.ctx.qualname(node.func) != "torch.save":
            return
        for sub in ast.walk(node.args[0]):
            if not (
                isinstance(sub, ast.Call)
                and isinstance(sub.func, ast.Attribute)
                and sub.func.attr == "state_dict"
            ):
                continue
            holder = sub.func.value
            key = _holder_key(self.ctx, holder)
            wrapper = None if key is None else self._wrapped.get(key)
            if wrapper is not None:
                m = self.ctx.segment(holder)
                self.report(
                    sub,
                    f"{m} is wrapped in {wrapper}, so {m}.state_dict() keys start with "
                    f"'module.': save {m}.module.state_dict() or "
                    f"st.unwrap_model({m}).state_dict()",
                )


class DiscardedNonStrictLoad(Rule):
    """ST012: ``model.load_state_dict(sd, strict=False)`` with its result thrown away.

    With ``strict=False`` mismatching keys are not errors: they are only returned, as
    ``missing_keys`` and ``unexpected_keys``. Discarding the result means a checkpoint that
    matches nothing (say, every key prefixed with ``module.``) loads silently and the model
    keeps its random weights.

    Fix (manual): check the returned keys, or use ``st.load_state_dict``, whose
    ``LoadReport`` says what matched and fails when nothing did.

    safetorch: ``st.load_state_dict``.
    """

    code = "ST012"
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
        if _is_const(value, False):
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
    first. Its state_dict keys are prefixed with ``module.``.

    Fix (manual): ``torch.nn.parallel.DistributedDataParallel`` (one process per GPU).

    safetorch: ``st.unwrap_model`` for saving either wrapper's weights.
    """

    code = "ST013"
    name = "data-parallel"
    pitfall = "nn.DataParallel is slower than DDP and overloads cuda:0"
    safetorch = "st.unwrap_model"
    torch_symbols = (_NN + "DataParallel",)
    node_types = (ast.Call,)

    def visit(self, node: ast.Call) -> None:
        if self.ctx.qualname(node.func) == _NN + "DataParallel":
            self.report(
                node,
                "nn.DataParallel is slower than DistributedDataParallel and gathers on cuda:0: "
                "use DistributedDataParallel (st.unwrap_model to save its weights)",
            )


class ConvertSyncBatchNorm(Rule):
    """ST014: ``nn.SyncBatchNorm.convert_sync_batchnorm``.

    The conversion is unconditional: the converted model fails in its first training forward
    pass without an initialised process group (single-GPU runs, CPU tests), and a
    ``process_group`` given at conversion time must match the one DDP uses.

    Fix (manual): ``st.convert_sync_batchnorm``, which follows the process group (a no-op
    without one).

    safetorch: ``st.convert_sync_batchnorm``.
    """

    code = "ST014"
    name = "convert-sync-batchnorm"
    pitfall = "convert_sync_batchnorm converts even when no process group can sync"
    safetorch = "st.convert_sync_batchnorm"
    torch_symbols = (_NN + "SyncBatchNorm.convert_sync_batchnorm",)
    node_types = (ast.Call,)

    def visit(self, node: ast.Call) -> None:
        if self.ctx.qualname(node.func) == _NN + "SyncBatchNorm.convert_sync_batchnorm":
            self.report(
                node,
                "nn.SyncBatchNorm.convert_sync_batchnorm converts even without a process "
                "group (the model then fails in training): use st.convert_sync_batchnorm",
            )


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
        fixable: Whether ``--fix`` can rewrite (some of) its findings.

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

    def safetorch_for(self, symbol: str) -> Optional[str]:
        """The safetorch function that replaces torch entry point ``symbol`` of this rule."""
        if symbol not in self.torch_symbols:
            return None
        if symbol in _UPSAMPLE_FUNCS:
            return _UPSAMPLE_FUNCS[symbol][1]
        return self.safetorch


_ALL_RULES: Tuple[Type[Rule], ...] = (SyntaxErrorRule, *RULES)

#: code -> pitfall -> safetorch function (and the torch entry points monkeypatch mode routes;
#: ``RULE_TABLE[code].safetorch_for(symbol)`` gives the function for one entry point).
RULE_TABLE: Dict[str, RuleInfo] = {
    r.code: RuleInfo(r.code, r.name, r.pitfall, r.safetorch, r.torch_symbols, r.fixable)
    for r in _ALL_RULES
}


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
    comma-separated string or a list of codes is accepted.

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
        if code != "ALL" and not any(c.startswith(code) for c in RULE_TABLE):
            raise ValueError(
                f"unknown rule code {code!r}: expected ALL, a code or a prefix of "
                f"{', '.join(RULE_TABLE)}"
            )

    def on(code: str) -> bool:
        return _matches(code, chosen) and not (dropped and _matches(code, dropped))

    return tuple(r for r in RULES if on(r.code)), on(SYNTAX_ERROR_CODE)
