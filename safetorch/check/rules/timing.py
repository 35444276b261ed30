"""Wall-clock timing of CUDA work without a synchronize (ST006): ``st.cuda_timer``'s pitfall."""

from __future__ import annotations

import ast
from typing import Dict, List, Optional, Set, Tuple

from safetorch.check.engine import Context
from safetorch.check.rules._base import Rule
from safetorch.check.rules._helpers import (
    FUNCTION_DEFS,
    Pos,
    end_of,
    find_keyword,
    is_const,
    self_attr,
    start_of,
    var_key,
)

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


def _moved_to_device(node: ast.AST) -> Optional[ast.expr]:
    """``x`` for ``x.cuda()`` or ``x.to(...)`` (a call), else None."""
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in ("cuda", "to")
    ):
        return node.func.value
    return None


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
    attr = self_attr(node)
    if attr is not None:
        return "self." + attr
    while isinstance(node, ast.Attribute):
        if self_attr(node) is not None:
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
    flag = find_keyword(node, "non_blocking")
    if flag is not None:
        return is_const(flag.value, False)
    if func.attr == "cuda":
        return len(node.args) < 2
    if find_keyword(node, "device") is not None:
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

    name = "unsynced-cuda-timing"
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

    def _timer(self, node: ast.AST) -> Optional[ast.Call]:
        """``node`` when it reads a clock (``time.time()``), else None."""
        if isinstance(node, ast.Call) and self.ctx.qualname(node.func) in _TIMERS:
            return node
        return None

    def visit(self, node: ast.AST) -> None:
        if isinstance(node, ast.Call):
            self._visit_call(node)
        elif isinstance(node, ast.Assign):
            timer = self._timer(node.value) if len(node.targets) == 1 else None
            if timer is not None:
                key = var_key(node.targets[0])
                if key is not None:
                    events = self._events()
                    events.defs.setdefault(key, []).append((end_of(timer), timer))
        elif isinstance(node, ast.BinOp):
            if not isinstance(node.op, ast.Sub):
                return
            start = var_key(node.right)
            if start is None:
                return
            timer = self._timer(node.left)
            if timer is not None:
                self._events().uses.append((start, end_of(timer), timer))
            else:
                end = var_key(node.left)
                if end is not None:
                    self._events().pairs.append((end, start))
        elif isinstance(node, (ast.For, ast.AsyncFor, ast.While)):
            self._events().loops.append((start_of(node.body[0]), end_of(node.body[-1])))
        elif _is_cuda_marker(node):
            self._cuda_scopes.add(id(self.ctx.scope))

    def _visit_call(self, node: ast.Call) -> None:
        func = node.func
        qual = self.ctx.qualname(func)
        if qual in _TIMERS:
            self._any_timer = True
            return
        if qual in _SYNC_FUNCS or (isinstance(func, ast.Attribute) and func.attr in _SYNC_METHODS):
            self._events().syncs.append(end_of(node))
            return
        if _is_blocking_copy(node):
            # A copy without non_blocking=True waits for the GPU (a host-to-device copy from
            # pageable memory synchronizes the stream before it starts).
            self._events().syncs.append(end_of(node))
            return
        callee = var_key(func)
        if callee is not None and (qual is None or qual == callee):
            self._local_calls.setdefault(id(self.ctx.scope), []).append((end_of(node), callee))
        if isinstance(func, ast.Name):
            if func.id == "print" and _prints_a_value(node):
                self._events().syncs.append(end_of(node))
                return
            if func.id in ("float", "int", "bool") and node.args:
                if not isinstance(node.args[0], ast.Constant):
                    self._events().syncs.append(end_of(node))
                return
            if func.id in _NOT_WORK:
                return
        self._work_calls.setdefault(id(self.ctx.scope), []).append((end_of(node), node))

    # -- which calls launch CUDA work --------------------------------------------------------
    def _cuda_names(self) -> Set[str]:
        """Names (and ``self.x``) the file binds to something on CUDA.

        ``model = Net().cuda()``, ``x = x.to(device)`` (in a file that mentions CUDA),
        ``model.cuda()`` / ``model.to(device)`` as a statement.
        """
        names = self.ctx.cache.get("cuda_names")
        if names is None:
            names = set()
            for node in self.ctx.walk(self.ctx.tree):
                if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                    if any(_moved_to_device(n) is not None for n in self.ctx.walk(node.value)):
                        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                        for target in targets:
                            for sub in self.ctx.walk(target):
                                root = _root_name(sub)
                                if root is not None and isinstance(sub, (ast.Name, ast.Attribute)):
                                    names.add(root)
                elif isinstance(node, ast.Expr):
                    moved = _moved_to_device(node.value)
                    root = None if moved is None else _root_name(moved)
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
        for node in self.ctx.walk(self.ctx.tree):
            if not isinstance(node, FUNCTION_DEFS):
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
