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

from safetorch.check.engine import SAFE, SYNTAX_ERROR_CODE, UNSAFE, Context, Edit, Fix, Rule
from safetorch.check.engine import walk as walk_nodes

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


class LoadWithoutWeightsOnly(Rule):
    """ST003: ``torch.load`` without ``weights_only``.

    ``torch.load`` unpickles: with ``weights_only=False`` (the default before torch 2.6) a
    checkpoint file can run arbitrary code when loaded. Saying ``weights_only=True`` makes
    the call safe and behave the same on every torch version.

    Fix (automatic): add ``weights_only=True``. Safe where ``[tool.safetorch]
    min-torch-version`` is 2.6 or later (it is torch's default there); unsafe (only with
    ``--unsafe-fixes``) otherwise, because on older torch it refuses checkpoints that pickle
    other objects (numpy scalars, argparse Namespaces) which loaded before.

    safetorch: ``st.load`` (weights_only by default, clear error naming the blocked type).
    """

    code = "ST003"

    pitfall_id = "load-without-weights-only"
    name = "load-without-weights-only"
    pitfall = "torch.load unpickles arbitrary objects unless weights_only=True"
    safetorch = "st.load"
    torch_symbols = ("torch.load",)
    fixable = True
    fix_applicability = "safe if min-torch-version >= 2.6, else unsafe"
    node_types = (ast.Call,)

    def visit(self, node: ast.Call) -> None:
        if self.ctx.qualname(node.func) != "torch.load" or _has_double_star(node):
            return
        if _keyword(node, "weights_only") is not None or not _loads_something(node):
            return
        edit = _add_keywords(self.ctx, node, "weights_only=True")
        # From torch 2.6 weights_only=True is the default: saying so changes nothing. Before,
        # it refuses checkpoints that pickle other objects (numpy scalars, argparse
        # Namespaces): a resume that worked would fail.
        applicability = SAFE if self.ctx.options.torch_at_least(2, 6) else UNSAFE
        fix = None if edit is None else Fix("add weights_only=True", (edit,), applicability)
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

    pitfall_id = "load-without-map-location"
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

    Fix (unsafe, ``--unsafe-fixes``): ``.detach().clone()``, an independent copy: the
    original tensor is no longer modified, which changes behaviour on purpose. Offered only where the
    modified value is used afterwards and the op is not a write-through idiom. A statement
    whose only effect is the write into ``x`` (``x.detach().zero_()`` on its own line,
    ``y = x.detach(); y.copy_(src)``) would become dead code with a clone, so it is reported
    without a fix: write it as ``with torch.no_grad(): x.zero_()`` if the write is intended.

    safetorch: ``st.safe_copy``.
    """

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
                if _is_detach_call(node.value):
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
    ``float(t)``) or printing a value. Loops are understood: an interval that spans the
    iteration boundary (``prev = time.time()`` at the end of the body, ``time.time() - prev``
    at the top) is per-iteration timing, correct on average when the loop body syncs
    anywhere (an ETA line in a loop that logs ``loss.item()``); data-loading intervals (from
    the end of one iteration to the top of the next) launch no CUDA work.

    Fix (manual): call ``torch.cuda.synchronize()`` before the second reading, or time with
    CUDA events.

    safetorch: ``st.cuda_timer`` (events, synchronizes once at the end).
    """

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
    def finish(self) -> None:
        if not self._any_timer:
            return
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
        if any(start < s < end for s in events.syncs):
            return None
        if any(start < w < end for w in events.work):
            return start
        return None


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


def _init_layers(cls: ast.ClassDef) -> Dict[str, ast.Call]:
    """``self.<name> = <call>`` assignments in ``__init__``."""
    layers: Dict[str, ast.Call] = {}
    for stmt in cls.body:
        if isinstance(stmt, ast.FunctionDef) and stmt.name == "__init__":
            for node in walk_nodes(stmt):
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
        return cache[key]
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

    Fix (unsafe, ``--unsafe-fixes`` only): ``bias=False`` on the Conv/Linear layer. It
    removes a parameter, so existing checkpoints no longer load (``Unexpected key(s) in
    state_dict: "0.bias"``), the random initialisation of later layers changes (one fewer
    draw from the RNG), and an explicit ``bias=True`` is overridden.

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
            fix = None if edit is None else Fix("set bias=False", (edit,), UNSAFE)
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

    pitfall_id = "dropout-before-bn"
    name = "dropout-before-bn"
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
        self.wrapped: Dict[str, str] = {}  # name -> wrapper class
        # name -> state_dict() calls of wrapped models its value holds
        self.holds: Dict[str, List[Tuple[ast.Call, str, str]]] = {}


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

    Fix (manual): save ``m.module.state_dict()`` (when ``m`` is always wrapped) or
    ``st.unwrap_model(m).state_dict()``; ``st.load_state_dict`` strips the prefix when
    loading such files.

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
        if not self._any_wrapper and self._wrapper(node) is not None:
            self._any_wrapper = True

    def _wrapper(self, value: Optional[ast.AST]) -> Optional[str]:
        if isinstance(value, ast.Call):
            return _WRAPPERS.get(self.ctx.qualname(value.func) or "")
        return None

    def finish(self) -> None:
        if not self._any_wrapper:
            return
        tree = self.ctx.tree
        functions = [
            n for n in walk_nodes(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
        ]
        self._self_wrapped: Dict[str, str] = {}
        for node in walk_nodes(tree):
            if isinstance(node, ast.Assign):
                wrapper = self._wrapper(node.value)
                for target in node.targets:
                    attr = _self_attr(target)
                    if attr is not None and wrapper is not None:
                        self._self_wrapped[attr] = wrapper
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
    ) -> Optional[str]:
        if isinstance(holder, ast.Name):
            owner, _ = self._lookup(scope, module, holder.id)
            return owner.wrapped.get(holder.id)
        attr = _self_attr(holder)
        return None if attr is None else self._self_wrapped.get(attr)

    def _wrapped_state_dicts(
        self, scope: _Scope, module: Optional[_Scope], expr: ast.AST
    ) -> List[Tuple[ast.Call, str, str]]:
        """The wrapped models' ``state_dict()`` calls whose result ``expr`` holds."""
        found: List[Tuple[ast.Call, str, str]] = []
        for call, holder in _state_dict_holders(expr):
            wrapper = self._wrapped_holder(scope, module, holder)
            if wrapper is not None:
                found.append((call, self.ctx.segment(holder), wrapper))
        for sub in walk_nodes(expr):
            if isinstance(sub, ast.Name):
                owner, _ = self._lookup(scope, module, sub.id)
                found.extend(owner.holds.get(sub.id, ()))
        return found

    def _read_scope(self, scope: _Scope, module: Optional[_Scope]) -> None:
        body = scope.node.body  # type: ignore[attr-defined]  # a scope node is a Module/FunctionDef/ClassDef: all have body
        for stmt in _statements_in_order(body):
            if isinstance(stmt, ast.Assign):
                self._assign(scope, module, stmt)
            for sub in self._calls_of(stmt):
                self._judge_call(scope, module, sub)

    @staticmethod
    def _calls_of(stmt: ast.stmt) -> Iterator[ast.Call]:
        """Calls in the statement itself (not in nested blocks, functions or classes)."""
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return
        own: List[ast.AST] = []
        for name, value in ast.iter_fields(stmt):
            if name in ("body", "orelse", "finalbody", "handlers", "cases"):
                continue
            if isinstance(value, list):
                own.extend(v for v in value if isinstance(v, ast.AST))
            elif isinstance(value, ast.AST):
                own.append(value)
        for part in own:
            for sub in walk_nodes(part):
                if isinstance(sub, ast.Call):
                    yield sub

    def _assign(self, scope: _Scope, module: Optional[_Scope], stmt: ast.Assign) -> None:
        wrapper = self._wrapper(stmt.value)
        held = self._wrapped_state_dicts(scope, module, stmt.value)
        for target in stmt.targets:
            if isinstance(target, ast.Name):
                owner, _ = self._lookup(scope, module, target.id)
                if wrapper is not None:
                    owner.wrapped[target.id] = wrapper
                else:  # rebound to something else (e.g. model = model.module)
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
        for sd_call, model, wrapper in self._wrapped_state_dicts(scope, module, saved):
            if id(sd_call) in self._reported:
                continue
            self._reported.add(id(sd_call))
            self.report(
                sd_call,
                f"{model} is wrapped in {wrapper}, so {model}.state_dict() keys start with "
                f"'module.' and the saved file (line {call.lineno}) does not load into the "
                f"bare model: save {model}.module.state_dict() or "
                f"st.unwrap_model({model}).state_dict()",
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

    safetorch: ``st.load_state_dict``.
    """

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
    first. Its state_dict keys are prefixed with ``module.``.

    Fix (manual): ``torch.nn.parallel.DistributedDataParallel`` (one process per GPU).

    safetorch: ``st.unwrap_model`` for saving either wrapper's weights.
    """

    code = "ST013"

    pitfall_id = "data-parallel"
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
                if self.ctx.options.torch_at_least(2, 0)
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

    Fix (manual): spell it with a keyword. ``momentum=`` if momentum was meant (note that
    torch's momentum is ``1 -`` Keras's: Keras ``momentum=0.8`` is torch ``momentum=0.2``),
    or ``eps=0.8`` to keep today's behaviour on purpose (silences the rule).

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
        self.report(
            value,
            f"{_short(qual or '')} gets eps={shown}: its positional parameter "
            f"{index + 1} is eps, not momentum; write momentum={shown} if momentum was meant "
            f"(torch's momentum is 1 - Keras's), or eps={shown} to keep it",
        )


# F.<name> -> its ``training`` default
_FUNCTIONAL_DROPOUTS: Dict[str, bool] = {
    _F + "dropout": True,
    _F + "dropout1d": True,
    _F + "dropout2d": True,
    _F + "dropout3d": True,
    _F + "alpha_dropout": False,
    _F + "feature_alpha_dropout": False,
}


class FunctionalDropoutWithoutTraining(Rule):
    """ST016: ``F.dropout(x, p)`` inside ``forward`` without ``training=``.

    The functional form does not know whether the module is in train or eval mode:
    ``F.dropout``, ``dropout1d/2d/3d`` default to ``training=True`` and keep dropping in
    ``model.eval()`` (noisy, wrong validation and inference), while ``F.alpha_dropout`` and
    ``F.feature_alpha_dropout`` default to ``training=False`` and never drop at all.
    Reported in a method named ``forward`` when ``training`` is not passed.

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


class LegacyAutogradFunction(Rule):
    """ST019: an ``autograd.Function`` with instance ``forward``/``backward`` (legacy style).

    Calling such a Function (``MyFn()(x)``) raises since torch 1.5. The new style declares
    ``@staticmethod def forward(ctx, ...)`` and ``@staticmethod def backward(ctx, ...)``,
    stores state on ``ctx`` and is called as ``MyFn.apply(x)``.

    Fix (manual): rewrite to static methods; ``self`` becomes ``ctx`` and arguments of
    ``__init__`` become extra ``forward`` arguments (with ``None`` gradients).

    safetorch: ``st.legacy.legacy_function`` runs the legacy class unchanged.
    """

    code = "ST019"

    pitfall_id = "legacy-api"
    name = "legacy-autograd-function"
    pitfall = "autograd.Function with non-static forward raises since torch 1.5"
    safetorch = "st.legacy.legacy_function"
    torch_symbols = ("torch.autograd.Function",)
    node_types = (ast.ClassDef,)

    def visit(self, node: ast.ClassDef) -> None:
        if not any(self.ctx.qualname(b) == "torch.autograd.Function" for b in node.bases):
            return
        for item in node.body:
            if isinstance(item, ast.FunctionDef) and item.name == "forward":
                static = any(
                    isinstance(d, ast.Name) and d.id == "staticmethod" for d in item.decorator_list
                )
                if not static:
                    self.report(
                        item,
                        f"{node.name}.forward is an instance method (legacy autograd "
                        "Function, raises since torch 1.5): make forward/backward "
                        f"@staticmethod with ctx and call {node.name}.apply(...) "
                        "(st.legacy.legacy_function runs it unchanged)",
                    )


_SCALAR_NAMES = ("loss", "acc", "correct", "total", "err", "cost")


class ZeroDimIndex(Rule):
    """ST020: ``loss.data[0]``: indexing a 0-dim tensor (IndexError since torch 0.5).

    Up to torch 0.3 a loss was a 1-element tensor and ``loss.data[0]`` its value; since 0.4
    it is 0-dim and ``[0]`` raises. Reported for ``X.data[0]`` where ``X`` is named like a
    scalar (loss, acc, correct, total, err, cost).

    Fix (unsafe, ``--unsafe-fixes``): ``.item()``, which returns a Python number where 0.4
    returned a 0-dim tensor (the value is the same; arithmetic on it no longer builds tensors).

        running_loss += loss.data[0]  ->  running_loss += loss.item()

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

    def visit(self, node: ast.Subscript) -> None:
        data = node.value
        if not (isinstance(data, ast.Attribute) and data.attr == "data"):
            return
        if not (isinstance(node.slice, ast.Constant) and node.slice.value == 0):
            return
        if isinstance(node.ctx, (ast.Store, ast.Del)):
            return
        root = (_var_key(data.value) or "").lower()
        if isinstance(data.value, ast.Call):
            root = (_var_key(data.value.func) or "").lower()
        if not any(word in root for word in _SCALAR_NAMES + ("criterion",)):
            return
        text = f"{self.ctx.segment(data.value)}.item()"
        fix = Fix(f"use {text}", (self.ctx.replace(node, text),), UNSAFE)
        self.report(
            node,
            "x.data[0] of a 0-dim tensor raises since torch 0.5: use x.item() "
            "(st.legacy.zero_dim_index keeps 0.4's tensor)",
            fix,
        )


class VolatileVariable(Rule):
    """ST021: ``Variable(x, volatile=True)``: a no-op since torch 0.4.

    ``volatile=True`` meant "no graph for anything computed from this"; torch 0.4 made it
    a no-op (with a warning), so inference code written that way builds a graph and keeps
    every activation alive. Reported for ``volatile=`` passed to ``Variable``.

    Fix (manual): run the computation inside ``with torch.no_grad():`` and pass the tensor
    itself (``Variable(x)`` is ``x`` since 0.4).

    safetorch: ``st.legacy.volatile``.
    """

    code = "ST021"

    pitfall_id = "legacy-api"
    name = "volatile-variable"
    pitfall = "Variable(volatile=True) is a no-op since torch 0.4: a graph is built"
    safetorch = "st.legacy.volatile"
    torch_symbols = ("torch.autograd.Variable",)
    node_types = (ast.Call,)

    def visit(self, node: ast.Call) -> None:
        qual = self.ctx.qualname(node.func)
        if qual not in ("torch.autograd.Variable", "torch.autograd.variable.Variable"):
            return
        volatile = _keyword(node, "volatile")
        value = volatile.value if volatile is not None else None
        if value is None and len(node.args) > 2:
            value = node.args[2]
        if value is None or _is_const(value, False):
            return
        self.report(
            node,
            "Variable(x, volatile=True) has no effect since torch 0.4 (a graph is built): "
            "compute inside `with torch.no_grad():` and pass x itself (st.legacy.volatile)",
        )


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
    )
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
