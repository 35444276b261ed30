"""Wall-clock timing of CUDA work without a synchronize (ST006): ``st.cuda_timer``'s pitfall."""

from __future__ import annotations

import ast
from typing import Dict, FrozenSet, List, Optional, Set, Tuple

from safetorch.check.engine import Context
from safetorch.check.rules._base import Rule
from safetorch.check.rules._cpu_values import cpu_made, cpu_names
from safetorch.check.rules._helpers import (
    FUNCTION_DEFS,
    Pos,
    call_name,
    end_of,
    find_keyword,
    is_const,
    self_attr,
    start_of,
    var_key,
)
from safetorch.check.rules._sync_calls import (
    PREDICATES,
    SYNC_METHODS,
    SYNC_NAMES,
    Distributions,
    compares_reduction,
    legacy_scalar,
    made_by,
    model_class,
    reads_first,
    syncing_definitions,
)

_TIMERS = frozenset(
    f"time.{n}"
    for n in ("time", "perf_counter", "monotonic", "time_ns", "perf_counter_ns", "monotonic_ns")
)


_SYNC_FUNCS = frozenset(
    {"torch.cuda.synchronize", "torch.accelerator.synchronize", "torch.cuda.Event.synchronize"}
    # A result whose size depends on the data is read back to the host to size the output.
    | {"torch.nonzero", "torch.unique", "torch.masked_select", "torch.argwhere"}
    # torch.save copies every tensor to the host; numpy conversions copy to the host.
    | {"torch.save", "numpy.array", "numpy.asarray", "torch.distributed.barrier"}
)


# Receivers whose ``.step()`` runs an optimizer (the main work of a training step); any other
# ``.step()`` (an environment's, a scheduler's, a progress bar's) launches no main work.
_OPTIMIZER_WORDS = ("optim", "opt", "scaler", "solver")


# Calls that never launch GPU work.
_NOT_WORK = frozenset(
    {"print", "len", "range", "str", "int", "float", "format", "isinstance", "enumerate", "zip"}
)


# Methods that launch device work on a model, tensor or optimizer.
_WORK_METHODS = frozenset({"backward", "step", "forward", "cuda", "to", "zero_grad"})


# Methods that run a model (a forward): the main work of an interval. Any other method of a
# name bound to something on CUDA (``x.squeeze()``, ``model.eval()``) is work, but not the
# main work (a model called directly, ``model(x)``, is).
# (Not ``generate``: a library's generation loop reads a stop condition back every token.)
_FORWARD_METHODS = frozenset({"forward", "predict", "inference", "encode", "decode", "sample"})


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

# What one event of a scope is, once calls are judged.
_SYNC, _WORK, _MAJOR = "sync", "work", "major"

# Wrappers whose forward is their first argument's: a whole model unpickled and then wrapped
# still runs the unpickled class.
_WRAPPERS = frozenset({"DataParallel", "DistributedDataParallel"})

# Packages whose factories make models of their own classes, never the project's.
_LIBRARIES = (
    "torch.",
    "torchvision.",
    "timm.",
    "transformers.",
    "diffusers.",
    "huggingface_hub.",
    "open_clip.",
    "segmentation_models_pytorch.",
)

# Methods that move or cast a model (``net.cuda()``): never a factory, whatever the project
# defines under the same name.
_MOVES = frozenset({"cuda", "to", "cpu", "eval", "train", "half", "float", "double", "type"})


def _moved_to_device(node: ast.AST) -> Optional[ast.expr]:
    """``x`` for ``x.cuda()`` or ``x.to(device)`` (a call naming a device; not a dtype
    conversion such as ``x.to(torch.float16)``), else None."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
        return None
    if node.func.attr == "cuda":
        return node.func.value
    if node.func.attr == "to":
        device = find_keyword(node, "device")
        if device is not None or (node.args and _looks_like_device(node.args[0])):
            return node.func.value
    return None


def _is_cpu(node: ast.AST) -> bool:
    """``"cpu"`` or ``torch.device("cpu")``."""
    if isinstance(node, ast.Call) and call_name(node.func) == "device" and node.args:
        node = node.args[0]
    return isinstance(node, ast.Constant) and node.value == "cpu"


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

    __slots__ = ("defs", "uses", "pairs", "syncs", "calls", "local", "loops", "events", "data")

    def __init__(self) -> None:
        self.defs: Dict[str, List[Tuple[Pos, ast.Call]]] = {}  # var -> timer readings bound
        self.uses: List[Tuple[str, Pos, ast.Call]] = []  # time.x() - var
        self.pairs: List[Tuple[str, str]] = []  # end_var - start_var
        self.syncs: List[Pos] = []  # what waits for the GPU by itself
        self.calls: List[Tuple[Pos, ast.Call]] = []  # calls that may launch work
        self.local: Dict[int, str] = {}  # id(call) -> f / self.f: a function of the file
        self.loops: List[Tuple[Pos, Pos]] = []  # (start, end) of each loop body
        self.events: List[Tuple[Pos, str]] = []  # judged: (position, _SYNC / _WORK / _MAJOR)
        self.data: Set[str] = set()  # names bound from a ``.data`` (``loss = crit(o, t).data``)


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
    """``x.cuda()`` / ``x.to(device)`` / ``x.to("cpu")`` without ``non_blocking=True``."""
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


def _formats_a_value(values: List[ast.expr]) -> bool:
    """Whether formatting ``values`` reads one that is not a literal: formatting a tensor
    (``print(loss)``, ``f"{loss:.3f}"``, ``"%.3f" % loss``) copies it to the host."""
    for value in values:
        if isinstance(value, ast.JoinedStr):
            if _formats_a_value(
                [v.value for v in value.values if isinstance(v, ast.FormattedValue)]
            ):
                return True
        elif isinstance(value, ast.Starred):
            return True
        elif not isinstance(value, ast.Constant):
            return True
    return False


def _string_format(node: ast.AST) -> bool:
    """``"..." % value`` / ``"...".format(value)`` / ``f"{value}"`` with a non-literal value."""
    if isinstance(node, ast.JoinedStr):
        return _formats_a_value([node])
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
        left = node.left
        if isinstance(left, ast.Constant) and isinstance(left.value, str):
            right = node.right
            values = right.elts if isinstance(right, ast.Tuple) else [right]
            return _formats_a_value(list(values))
        return False
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        base = node.func.value
        if node.func.attr == "format" and isinstance(base, ast.Constant):
            return isinstance(base.value, str) and (
                _formats_a_value(node.args) or bool(node.keywords)
            )
    return False


def _optimizer_like(node: ast.AST) -> bool:
    """``optimizer`` / ``self.opt_g`` / ``scaler``: an object whose ``.step()`` updates the
    parameters (``scaler.step(optimizer)`` too)."""
    name = (_root_name(node) or "").lower().split(".")[-1]
    return any(word in name for word in _OPTIMIZER_WORDS) and "sched" not in name


def _scheduler_like(node: ast.AST) -> bool:
    """``scheduler`` / ``self.lr_sched``: an object whose ``.step()`` sets a learning rate."""
    name = (_root_name(node) or "").lower()
    return "sched" in name or "lr" in name.split(".")[-1]


class UnsyncedCudaTiming(Rule):
    """ST006: wall-clock timing of CUDA code without ``torch.cuda.synchronize()``.

    CUDA kernels run asynchronously: ``time.time()`` / ``time.perf_counter()`` /
    ``time.monotonic()`` read after launching GPU work measure the launch, not the work.

    The rule follows each interval through the function's dataflow: a reading bound to a
    variable (``t0 = time.time()``) starts an interval, and ``time.time() - t0`` (or
    ``t1 - t0``) ends it when the elapsed time is reported (not only compared with a
    deadline, ``if time.time() - t0 > limit:``). It reports the end reading only on strong
    evidence: the interval's main work is launched (a forward of a model the code moved to
    CUDA with ``.cuda()`` or ``.to(device)``, not to a device bound only to the CPU;
    ``.backward()`` or an optimizer's ``.step()``
    in a function that uses CUDA), and nothing in the interval after that first main work
    waits for the GPU. Tensor arithmetic alone, an environment's or a scheduler's
    ``step()``, a library's ``generate()`` and calls of code outside the project are no
    evidence. These wait: ``torch.cuda.synchronize()`` (or a name bound to it,
    ``sync = torch.cuda.synchronize``), an event's or stream's ``.synchronize()``, a host
    copy (``.item()``, ``.cpu()``, ``.tolist()``, ``.numpy()``, ``float(t)``, ``int(t)``,
    ``x.to("cpu")``, ``np.asarray(t)``, ``torch.save``, ``loss.data[0]`` on the old torch
    that spelling supports (also in two steps: ``loss = crit(o, t).data`` ...
    ``loss[0]``), ``writer.add_scalar``), an op whose output size depends on the data
    (``nonzero``, ``unique``, non-maximum suppression), a tensor predicate tested by
    ``if``/``assert`` or a tensor reduction compared there (``if torch.norm(r) <= tol:``),
    building a ``torch.distributions`` distribution from values that may be on the GPU (it
    validates its arguments, reading them back, unless ``validate_args=False`` or the file
    turns validation off with a literal ``False``; not one without argument constraints,
    ``Independent``, ``TransformedDistribution``, nor a transform or a constraint; a project
    class derived from one that validates or whose ``__init__`` builds one too), a barrier,
    printing or formatting a value (``f"{loss:.3f}"``,
    ``"%.3f" % loss``), a blocking copy to the device (``x.cuda()``, ``x.to(device)``
    without ``non_blocking=True``), a call of a function of the file that does any of these
    anywhere (``validate(...)``, ``self.log_step()``), and a call of the project's own code
    that may (a function of another module, an instance of a project class whose
    ``forward`` reads back, through its own methods to any depth: a loss that indexes by a
    boolean mask or takes Python's ``max(t.sum(), 1)``, a head whose label assignment reads
    a count, a post-processing step that copies to the host; a method of such an instance,
    ``self.decoder.suppress(boxes)``), torch's ``LBFGS.step``, which reads the closure's
    loss back, or a model whose class the file never names (unpickled whole,
    ``net = torch.load(path)``; made by a factory or a registry of the project,
    ``build_model(cfg)``, ``MODELS[name](...)``; passed in, ``self.model = model``) in a
    project one of whose model classes' ``forward`` reads back: the class the file never
    names may be that one.

    A backward of CPU tensors is no CUDA work, whatever else the function runs on the GPU: a
    name copied to the GPU under another name (``x_cuda = x.cuda()``: ``x`` stays on the
    CPU), a factory's tensor made without a device (``torch.randn(n)``; not in a file that
    sets a default device), and what torch's functions or a module the function builds
    compute from such names alone (``out = layer(x)``, ``torch.exp(-z)``; not a helper such as
    ``to_var(x)``, which may move it). Converting or printing a tensor's metadata
    (``int(x.shape[0])``, ``print(x.shape)``) in project code is no wait.

    A copy before the main work (``model(x.cuda())``) waits only for what came before, so
    it does not silence the interval. Loops are understood: a loop inside the interval that
    launches main work and waits waits every iteration (an epoch timed around a loop that
    logs ``loss.item()``); an interval that spans the iteration boundary
    (``prev = time.time()`` at the end of the body, ``time.time() - prev`` at the top) is
    per-iteration timing, correct on average when the loop body syncs anywhere, and so is a
    cumulative reading in a loop against a start before it (``time.time() - start_time`` for
    an ETA); data-loading intervals (from the end of one iteration to the top of the next)
    launch no CUDA work.

    Fix (manual): call ``torch.cuda.synchronize()`` before the second reading, or time with
    CUDA events.

    safetorch: ``st.cuda_timer`` (events, synchronizes once at the end).
    """

    code = "ST006"

    # Rewritten for issue 33 (work left running, nothing waiting); held-out 72.7% (8/11)
    # after the rewrite: below the 97% bar (docs/check.md). Tightened again on the grown
    # development half (nothing in the interval may wait, the project's code followed, the
    # time reported); preview until the held-out half measures it at the bar.
    preview = True

    name = "unsynced-cuda-timing"
    torch_symbols = tuple(sorted(_TIMERS))
    node_types = (
        ast.Call,
        ast.Constant,
        ast.Attribute,
        ast.Assign,
        ast.AugAssign,
        ast.BinOp,
        ast.JoinedStr,
        ast.For,
        ast.AsyncFor,
        ast.While,
        ast.If,
        ast.Assert,
        ast.Subscript,
        ast.Compare,
    )

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self._cuda_scopes: Set[int] = set()
        self._any_timer = False
        self._scopes: Dict[int, _Interval] = {}
        self._scope_nodes: Dict[int, ast.AST] = {}
        self._compared: Set[int] = set()  # elapsed times only compared (a timeout), not reported

    def _events(self) -> _Interval:
        key = id(self.ctx.scope)
        found = self._scopes.get(key)
        if found is None:
            found = self._scopes[key] = _Interval()
            self._scope_nodes[key] = self.ctx.scope
        return found

    def _timer(self, node: ast.AST) -> Optional[ast.Call]:
        """``node`` when it reads a clock (``time.time()``), else None."""
        if isinstance(node, ast.Call) and self.ctx.qualname(node.func) in _TIMERS:
            return node
        return None

    def _distributions(self) -> Distributions:
        """How the file names ``torch.distributions`` (read once per file)."""
        found = self.ctx.cache.get("st006_distributions")
        if found is None:
            found = self.ctx.cache["st006_distributions"] = Distributions(self.ctx.tree)
        return found

    def _sync_aliases(self) -> Set[str]:
        """Names the file binds to a synchronize function without calling it
        (``sync = torch.cuda.synchronize``, ``sync = getattr(torch, dev).synchronize``)."""
        names = self.ctx.cache.get("st006_sync_aliases")
        if names is None:
            names = set()
            if "synchronize" in self.ctx.source:
                for node in self.ctx.walk(self.ctx.tree):
                    if not isinstance(node, ast.Assign) or len(node.targets) != 1:
                        continue
                    value = node.value
                    if (
                        isinstance(value, ast.Attribute) and value.attr == "synchronize"
                    ) or self.ctx.qualname(value) in _SYNC_FUNCS:
                        key = var_key(node.targets[0])
                        if key is not None:
                            names.add(key)
            self.ctx.cache["st006_sync_aliases"] = names
        return names

    def visit(self, node: ast.AST) -> None:
        if isinstance(node, ast.Call):
            self._visit_call(node)
        elif isinstance(node, ast.Assign):
            self._note_data(node.targets, node.value, False)
            timer = self._timer(node.value) if len(node.targets) == 1 else None
            if timer is not None:
                key = var_key(node.targets[0])
                if key is not None:
                    events = self._events()
                    events.defs.setdefault(key, []).append((end_of(timer), timer))
        elif isinstance(node, ast.AugAssign):
            self._note_data([node.target], node.value, True)
        elif isinstance(node, ast.BinOp):
            if _string_format(node):
                self._events().syncs.append(end_of(node))
                return
            if not isinstance(node.op, ast.Sub) or id(node) in self._compared:
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
        elif isinstance(node, ast.JoinedStr):
            if _string_format(node):
                self._events().syncs.append(end_of(node))
        elif isinstance(node, (ast.For, ast.AsyncFor, ast.While)):
            self._events().loops.append((start_of(node.body[0]), end_of(node.body[-1])))
            if isinstance(node, ast.While):
                self._tested(node.test)
        elif isinstance(node, ast.If):
            self._tested(node.test)
        elif isinstance(node, ast.Assert):
            self._tested(node.test)
        elif isinstance(node, ast.Subscript):
            if legacy_scalar(node) or self._legacy_scalar_of_data(node):
                self._events().syncs.append(end_of(node))
        elif isinstance(node, ast.Compare):
            # ``time.time() - t0 > limit``: a deadline, not a reported time
            for side in (node.left, *node.comparators):
                if isinstance(side, ast.BinOp):
                    self._compared.add(id(side))
        elif _is_cuda_marker(node):
            self._cuda_scopes.add(id(self.ctx.scope))

    def _note_data(self, targets: List[ast.expr], value: ast.expr, augmented: bool) -> None:
        """Names holding a loss's ``.data`` (``loss = crit(o, t).data``; ``total += loss * n``):
        what code of the 0.3 era indexes with ``[0]`` for a number. A name rebound to anything
        else no longer holds one; a value passed through a call (a model) is not one."""
        data = self._events().data
        names = [t.id for t in targets if isinstance(t, ast.Name)]
        try:
            holds = self._data_value(value, data)
        except RecursionError:  # a sum of hundreds of terms: no legacy loss.data in it
            holds = False
        if holds:
            data.update(names)
        elif not augmented:
            data.difference_update(names)

    def _data_value(self, value: ast.expr, data: Set[str]) -> bool:
        """``f(...).data``, or arithmetic of such values, names holding them and numbers."""
        if isinstance(value, ast.Attribute) and value.attr == "data":
            return isinstance(value.value, ast.Call)
        if isinstance(value, ast.Name):
            return value.id in data
        if isinstance(value, ast.BinOp):
            sides = (value.left, value.right)
            return any(self._data_value(v, data) for v in sides) and all(
                self._data_value(v, data) or self._number_like(v) for v in sides
            )
        if isinstance(value, ast.UnaryOp):
            return self._data_value(value.operand, data)
        return False

    @staticmethod
    def _number_like(value: ast.expr) -> bool:
        """A number or a name/attribute/``len(...)`` a number is usually in (``n``, ``args.bs``)."""
        if isinstance(value, ast.Constant):
            return isinstance(value.value, (int, float))
        if isinstance(value, ast.Call):
            return isinstance(value.func, ast.Name) and value.func.id in ("len", "float", "int")
        return isinstance(value, (ast.Name, ast.Attribute))

    def _legacy_scalar_of_data(self, node: ast.Subscript) -> bool:
        """``total[0]`` of a name bound from a ``.data``: ``loss.data[0]`` spelled in two steps,
        a Python number (read from the device) on the torch that code supports."""
        value = node.value
        return isinstance(value, ast.Name) and value.id in self._events().data and reads_first(node)

    def _tested(self, test: ast.expr) -> None:
        """A tensor predicate tested by ``if``/``while``/``assert`` (``if torch.isnan(loss)
        .any():``) is turned into a Python bool: the host waits for its value."""
        if compares_reduction(test):  # ``while torch.norm(r) > tol:``
            self._events().syncs.append(end_of(test))
            return
        for sub in self.ctx.walk(test):
            if isinstance(sub, ast.Call):
                func = sub.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                if name in PREDICATES:
                    self._events().syncs.append(end_of(test))
                    return

    def _visit_call(self, node: ast.Call) -> None:
        func = node.func
        qual = self.ctx.qualname(func)
        if qual in _TIMERS:
            self._any_timer = True
            return
        events = self._events()
        if (
            qual in _SYNC_FUNCS
            or (isinstance(func, ast.Attribute) and func.attr in SYNC_METHODS)
            or var_key(func) in self._sync_aliases()
            or _string_format(node)
            or call_name(func) in SYNC_NAMES
            or (isinstance(func, ast.Name) and func.id in SYNC_METHODS)
        ):
            events.syncs.append(end_of(node))
            return
        if self._distributions().builds(node):
            # torch.distributions validates the arguments it is built from: the host waits.
            events.syncs.append(end_of(node))
            return
        if _is_blocking_copy(node):
            # A copy without non_blocking=True waits for the GPU: torch synchronizes the
            # stream after a blocking copy between host and device (memcpy_and_sync).
            events.syncs.append(end_of(node))
            return
        callee = var_key(func)
        if callee is not None and (qual is None or qual == callee):
            events.local[id(node)] = callee
        if isinstance(func, ast.Name):
            if func.id == "print" and _formats_a_value(node.args):
                events.syncs.append(end_of(node))
                return
            if func.id in ("float", "int", "bool") and node.args:
                if not isinstance(node.args[0], ast.Constant):
                    events.syncs.append(end_of(node))
                return
            if func.id in _NOT_WORK:
                return
        events.calls.append((end_of(node), node))

    # -- code of the project that synchronizes -------------------------------------------------
    def _project_syncs(self) -> FrozenSet[str]:
        """Names of the project's module-level functions and classes, and of its classes'
        methods as ``Class.method``, that may wait for the GPU."""
        found = self.ctx.cache.get("st006_project_syncs")
        if found is None:
            facts = self.ctx.project_facts("ST006-syncing", syncing_definitions).values()
            syncing = {n for names, _, _ in facts for n in names}
            reaches = [r for _, per_file, _ in facts for r in per_file]
            for _ in range(6):  # a loss calling a matcher calling NMS: a few levels deep
                more = {name for name, calls in reaches if calls & syncing} - syncing
                if not more:
                    break
                syncing |= more
            found = frozenset(syncing)
            self.ctx.cache["st006_project_syncs"] = found
            defined = {n for _, _, names in facts for n in names}
            self.ctx.cache["st006_project_defined"] = frozenset(defined)
        return found

    def _project_defined(self) -> FrozenSet[str]:
        """The names of the project's functions: module-level ones and methods (no class)."""
        self._project_syncs()
        found: FrozenSet[str] = self.ctx.cache["st006_project_defined"]
        return found

    def _bound_calls(self) -> Dict[str, Set[str]]:
        """name / ``self.x`` -> the names of what the file calls to make it
        (``criterion = MultiBoxLoss(...)`` gives ``criterion`` -> ``MultiBoxLoss``)."""
        found = self.ctx.cache.get("st006_bound_calls")
        if found is None:
            found = {}
            for node in self.ctx.walk(self.ctx.tree):
                if isinstance(node, ast.Assign) and len(node.targets) == 1:
                    key = var_key(node.targets[0])
                    made = made_by(node.value)
                    if key is not None and made[:1].isupper():  # a class's instance
                        found.setdefault(key, set()).add(made)
            self.ctx.cache["st006_bound_calls"] = found
        return found

    def _unnamed_models(self) -> Set[str]:
        """Names (and ``self.x``) the file binds to a model whose class it never names: one
        unpickled by ``torch.load`` or made by a factory of the project (``build_model(cfg)``,
        ``self.exp.get_model()``, ``registry[cfg.type](...)``), directly or through a move or
        a wrapper (``net = torch.load(path)["model"].cuda()``, ``net = nn.DataParallel(net)``),
        or an attribute bound to a parameter (``self.distiller = distiller``: passed in)."""
        found = self.ctx.cache.get("st006_unnamed_models")
        if found is None:
            passed_in: Dict[int, str] = {}  # id(assignment) -> self.x bound to a parameter
            for fn in self.ctx.walk(self.ctx.tree):
                if not isinstance(fn, FUNCTION_DEFS):
                    continue
                params = {a.arg for a in (*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs)}
                for node in self.ctx.walk(fn):
                    if isinstance(node, ast.Assign) and len(node.targets) == 1:
                        key = var_key(node.targets[0])
                        value = node.value
                        if key and key.startswith("self.") and isinstance(value, ast.Name):
                            if value.id in params and value.id != "self":
                                passed_in[id(node)] = key
            found = set(passed_in.values())
            bindings = [
                (var_key(node.targets[0]), node.value, id(node) in passed_in)
                for node in self.ctx.walk(self.ctx.tree)
                if isinstance(node, ast.Assign) and len(node.targets) == 1
            ]
            for _ in range(4):  # a load, then a move, then a wrapper: a few steps at most
                more = {
                    key
                    for key, value, _ in bindings
                    if key is not None and key not in found and self._unnamed(value, found)
                }
                if not more:
                    break
                found |= more
            # A name also bound to something else (model = Small().cuda()) may not be one.
            found -= {
                k
                for k, v, param in bindings
                if k in found and not param and not self._unnamed(v, found)
            }
            self.ctx.cache["st006_unnamed_models"] = found
        return found

    def _unnamed(self, value: ast.AST, loaded: Set[str]) -> bool:
        """``value`` is what ``torch.load`` or a factory of the project (a function or method
        the project defines, not a class, whatever its case; a registry's entry called) returned,
        or a name in ``loaded``, seen through subscripts, method calls (``.cuda()``,
        ``.float()``) and the parallel wrappers."""
        defined = self._project_defined()
        while True:
            if isinstance(value, ast.Call):
                func = value.func
                if self.ctx.qualname(func) == "torch.load" or isinstance(func, ast.Subscript):
                    return True
                name = call_name(func)
                if name in _WRAPPERS and value.args:
                    value = value.args[0]
                    continue
                library = (self.ctx.qualname(func) or "").startswith(_LIBRARIES)
                if name not in _MOVES and name in defined and not library:
                    return True  # not torch.hub.load, timm.create_model: the project's
                if isinstance(func, ast.Attribute):
                    value = func.value
                else:
                    return False
            elif isinstance(value, ast.Subscript):
                value = value.value
            else:
                return var_key(value) in loaded

    def _callee_syncs(self, call: ast.Call) -> bool:
        """``call`` runs code that may wait for the GPU: torch's ``LBFGS.step``, which reads
        the closure's loss back every evaluation; a function or class (its ``forward``, a
        loss) of the project's modules, by the name it is imported or defined under, a name
        the file binds to an instance of one, or a method of such an instance
        (``self.util.non_max_suppression(...)``, ``quantizer.quantize()``). A model whose
        class the file never names (unpickled whole, or made by a factory of the project) may
        be any of the project's: it may wait when the ``forward`` of a model class of the
        project does (a detector's head assigning labels or suppressing boxes; not a loss's,
        not a transform's ``__call__``)."""
        func = call.func
        bound = self._bound_calls()
        if isinstance(func, ast.Attribute) and func.attr == "step":
            if "LBFGS" in bound.get(var_key(func.value) or "", ()):
                return True
        names = self._project_syncs()
        if not names:
            return False
        if var_key(func) in self._unnamed_models() and any(
            n.endswith(".forward") and model_class(n.split(".")[0]) for n in names
        ):
            return True
        called = {call_name(func)} if isinstance(func, ast.Name) else set()
        if isinstance(func, ast.Name):
            called.add(self.ctx.imports.get(func.id, func.id).split(".")[-1])
        qual = self.ctx.qualname(func)
        if qual is not None and not qual.startswith("torch."):
            called.add(qual.split(".")[-1])
        key = var_key(func)
        if key is not None:
            called |= bound.get(key, set())
        if isinstance(func, ast.Attribute):
            owner = var_key(func.value)
            for made in bound.get(owner or "", ()):
                called.add(f"{made}.{func.attr}")
        return bool(called & names)

    # -- which calls launch CUDA work --------------------------------------------------------
    def _cuda_names(self) -> Set[str]:
        """Names (and ``self.x``) the file binds to something on CUDA.

        ``model = Net().cuda()``, ``x = x.to(device)`` (in a file that mentions CUDA),
        ``model.cuda()`` / ``model.to(device)`` as a statement.
        """
        names = self.ctx.cache.get("cuda_names")
        if names is None:
            names = set()
            cpu = self._cpu_devices()
            for node in self.ctx.walk(self.ctx.tree):
                if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                    if any(
                        _moved_to_device(n) is not None and not self._to_cpu(n, cpu)
                        for n in self.ctx.walk(node.value)
                    ):
                        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                        for target in targets:
                            for sub in self.ctx.walk(target):
                                root = _root_name(sub)
                                if root is not None and isinstance(sub, (ast.Name, ast.Attribute)):
                                    names.add(root)
                elif isinstance(node, ast.Expr):
                    moved = _moved_to_device(node.value)
                    if moved is not None and self._to_cpu(node.value, cpu):
                        moved = None
                    root = None if moved is None else _root_name(moved)
                    if root is not None:
                        names.add(root)
            self.ctx.cache["cuda_names"] = names
        return names

    def _cpu_devices(self) -> Set[str]:
        """Names (and ``self.x``) the file binds only to the CPU (``device = "cpu"``,
        ``device = torch.device("cpu")``): a move to one of them puts nothing on CUDA."""
        bound: Dict[str, List[ast.expr]] = {}
        for node in self.ctx.walk(self.ctx.tree):
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                key = var_key(node.targets[0])
                if key is not None:
                    bound.setdefault(key, []).append(node.value)
        return {k for k, values in bound.items() if all(_is_cpu(v) for v in values)}

    def _to_cpu(self, node: ast.AST, cpu: Set[str]) -> bool:
        """``x.to(device)`` where ``device`` is bound only to the CPU, or ``x.to("cpu")``."""
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            return False
        if node.func.attr != "to":
            return False
        target = find_keyword(node, "device")
        device = target.value if target is not None else (node.args[0] if node.args else None)
        if device is None:
            return False
        return _is_cpu(device) or var_key(device) in cpu

    def _work_kind(
        self, call: ast.Call, cuda_scope: bool, cpu: FrozenSet[str] = frozenset()
    ) -> Optional[str]:
        """``_MAJOR`` for a model's forward, ``.backward()`` or an optimizer's step,
        ``_WORK`` for other CUDA work (tensor arithmetic, bookkeeping), None for no work.
        ``cpu``: the scope's names that hold CPU tensors (``cpu_names``): their backward is
        no CUDA work."""
        func = call.func
        names = self._cuda_names()
        method = func.attr if isinstance(func, ast.Attribute) else None
        if method == "backward" and cuda_scope:
            receiver = func.value if isinstance(func, ast.Attribute) else func
            return None if cpu and cpu_made(receiver, set(cpu)) else _MAJOR
        if method == "step" and cuda_scope and isinstance(func, ast.Attribute):
            if _optimizer_like(func.value):
                return _MAJOR
            # An environment's, a scheduler's or a progress bar's step: work only when the
            # receiver is on CUDA (judged below).
            if _scheduler_like(func.value) or _root_name(func.value) not in names:
                return None
        if _root_name(func) in names:
            # model(x), self.net(x), model.generate(x): a forward; x.squeeze(): arithmetic
            forward = var_key(func) is not None or method in _FORWARD_METHODS
            return _MAJOR if forward else _WORK
        if any(_root_name(a) in names for a in (*call.args, *(k.value for k in call.keywords))):
            return _WORK
        if not cuda_scope:
            return None
        if method in _WORK_METHODS:
            return _WORK
        qual = self.ctx.qualname(func) or ""
        if qual.startswith("torch.") and not qual.startswith(_NOT_COMPUTE):
            return _WORK
        return None

    # -- judging ---------------------------------------------------------------------------
    def _functions(self) -> Dict[str, List[int]]:
        """The file's functions by the name a call reaches them with (``f``, methods as
        ``self.f``): name -> scope ids."""
        found: Dict[str, List[int]] = {}
        for node in self.ctx.walk(self.ctx.tree):
            if isinstance(node, FUNCTION_DEFS):
                params = node.args.posonlyargs + node.args.args
                method = bool(params) and params[0].arg == "self"
                found.setdefault(("self." if method else "") + node.name, []).append(id(node))
        return found

    def _cpu_names(self, scope: int) -> FrozenSet[str]:
        """The names of the scope ``scope`` (an id) that hold CPU tensors (once per scope)."""
        key = f"st006_cpu_{scope}"
        found = self.ctx.cache.get(key)
        if found is None:
            node = self._scope_nodes.get(scope)
            source = self.ctx.source
            # A default device set anywhere (torch.set_default_device("cuda"), a CUDA default
            # tensor type, ``with torch.device("cuda"):``) puts a factory's tensors there.
            default = "set_default_" in source or "torch.device(" in source and "with " in source
            found = frozenset(cpu_names(node)) if node is not None and not default else frozenset()
            self.ctx.cache[key] = found
        return found

    def _judge(self, scope: int, events: _Interval, summaries: Dict[str, str]) -> None:
        """Fill ``events.events``: each sync, and each call's work, in source order; a call
        of a function of the file counts as what that function's last CUDA interaction is."""
        cuda_scope = scope in self._cuda_scopes
        cpu = self._cpu_names(scope)
        judged = [(pos, _SYNC) for pos in events.syncs]
        for pos, call in events.calls:
            name = events.local.get(id(call))
            kind = summaries.get(name) if name is not None else None
            if kind is None and self._callee_syncs(call):
                kind = _SYNC  # code of the project that waits for the GPU (a loss that reads back)
                if var_key(call.func) in self._unnamed_models() or (
                    self._work_kind(call, cuda_scope) == _MAJOR
                ):
                    # A forward that waits inside (a head assigning labels): main work, then
                    # a wait for it, in that order.
                    judged.append((pos, _MAJOR))
                    pos = (pos[0], pos[1] + 1)
            if kind is None:
                kind = self._work_kind(call, cuda_scope, cpu)
            if kind is not None:
                judged.append((pos, kind))
        judged.sort()
        events.events = judged

    @staticmethod
    def _summary(events: _Interval) -> Optional[str]:
        """What a call of a function with these events amounts to: ``_SYNC`` when anything in
        it waits for the GPU (the work launched before the call is then waited for), else
        ``_MAJOR`` / ``_WORK`` for the work it leaves running."""
        kinds = {k for _, k in events.events}
        if _SYNC in kinds:
            return _SYNC
        if _MAJOR in kinds:
            return _MAJOR
        return _WORK if kinds else None

    def _summarize(self) -> None:
        """Judge every scope, following calls of the file's own functions to a fixed point."""
        functions = self._functions() if any(e.local for e in self._scopes.values()) else {}
        summaries: Dict[str, str] = {}
        rank = {_SYNC: 2, _MAJOR: 1, _WORK: 0}
        for _ in range(4):  # calls nest a few levels deep at most; each round goes one deeper
            for scope, events in self._scopes.items():
                self._judge(scope, events, summaries)
            updated: Dict[str, str] = {}
            for name, scopes in functions.items():
                kinds = [self._summary(self._scopes[s]) for s in scopes if s in self._scopes]
                known = [k for k in kinds if k is not None]
                if known:
                    # A name defined twice (a method of two classes) syncs if one of them does:
                    # the rule reports only what it is sure of.
                    updated[name] = max(known, key=rank.__getitem__)
            if updated == summaries:
                break
            summaries = updated

    def finish(self) -> None:
        if not self._any_timer:
            return
        self._summarize()
        for events in self._scopes.values():
            if not events.defs or not any(k != _SYNC for _, k in events.events):
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
                        "for the GPU after it: it times the kernel launch, not the kernels; "
                        "call torch.cuda.synchronize() first or use st.cuda_timer",
                    )

    def _unsynced_start(self, events: _Interval, var: str, end: Pos) -> Optional[Pos]:
        """Where the interval ending at ``end`` started, when it is unsynchronized CUDA work."""
        defs = [pos for pos, _ in events.defs.get(var, [])]
        syncs = [p for p, k in events.events if k == _SYNC]
        work = [(p, k) for p, k in events.events if k != _SYNC]
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
            if any(lo <= s <= hi for s in syncs):
                return None  # the loop syncs every iteration: correct on average
            if any(start < w <= hi or lo <= w < end for w, k in work if k == _MAJOR):
                return start
            return None
        before = [d for d in defs if d < end]
        if not before:
            return None
        start = max(before)
        inside = [(w, k) for w, k in work if start < w < end]
        if not inside:
            return None
        majors = [w for w, k in inside if k == _MAJOR]
        if not majors:
            # Only tensor arithmetic or calls of code elsewhere: no evidence that the main work
            # of the interval (a forward, a backward, a step) is untimed.
            return None
        # Anything that waits for the GPU after the first main work (a host copy, a print of a
        # value, a loss of the project that reads back, a helper that logs) synchronizes the
        # interval: the rule reports only an interval nothing in which waits.
        if any(majors[0] < s < end for s in syncs):
            return None
        # A loop in the interval that both launches main work and waits waits every iteration.
        for lo, hi in events.loops:
            if start < lo and hi < end and any(lo <= s <= hi for s in syncs):
                if any(lo <= w <= hi for w in majors):
                    return None
        for lo, hi in around:
            # Read in a loop against a start before it (a since-start ETA): off by at most
            # the unsynchronized tail of one iteration when the loop body syncs anywhere.
            if start < lo and any(lo <= s <= hi for s in syncs):
                return None
        return start
