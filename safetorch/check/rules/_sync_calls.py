"""What project code may wait for the GPU when a timed interval calls it (ST006's project facts).

``syncing_definitions`` is the per-file gather for ``Context.project_facts``: the module-level
functions and classes of a file, and each class's methods as ``Class.method``, whose code may
synchronize (a host copy, a data-dependent op, a tested predicate), following a class's calls
of its own methods (``self.get_losses()`` ... ``self.get_assignments()``) to any depth.
"""

from __future__ import annotations

import ast
from typing import Dict, FrozenSet, List, Optional, Set, Tuple

from safetorch.check.rules._helpers import call_name, self_attr

# Methods that wait for the GPU: an explicit synchronize, a copy of a result to the host, an op
# whose output size depends on the data (nonzero, unique: the count is read back), a logger
# that turns a tensor into a number (``writer.add_scalar``), a barrier between processes.
SYNC_METHODS = frozenset(
    {"synchronize", "item", "cpu", "tolist", "numpy", "elapsed_time"}
    | {"nonzero", "unique", "masked_select", "argwhere"}
    | {"add_scalar", "add_scalars", "barrier", "wait_for_everyone"}
)


# Functions of any module that read their result back to the host: non-maximum suppression
# returns a data-dependent number of boxes (torchvision's and the detection repositories' own).
SYNC_NAMES = frozenset({"nms", "batched_nms", "soft_nms"})


# Tensor predicates whose result, tested by ``if``/``while``/``assert``, is read by the host.
PREDICATES = frozenset({"any", "all", "isnan", "isinf", "isfinite", "equal", "allclose"})


# Tensor reductions whose value, compared and tested (``if torch.norm(r) <= tol:``), the host
# reads: the comparison is a tensor turned into a Python bool.
_REDUCTIONS = frozenset(
    {"norm", "sum", "mean", "max", "min", "abs", "amax", "amin", "prod", "std", "var", "dist"}
)
# Roots whose reductions are host values already (numpy arrays, Python numbers).
_HOST_ROOTS = frozenset({"np", "numpy", "math", "statistics", "random", "pd", "pandas"})


def compares_reduction(test: ast.AST) -> bool:
    """``test`` (of an ``if``/``while``/``assert``) compares a tensor reduction: ``torch.norm(r)
    <= tol``, ``x.abs().max() > eps``; not ``np.abs(a).max() > 1``, not ``max(a, b) > c``.

    >>> compares_reduction(ast.parse("torch.norm(r) <= tol").body[0].value)
    True
    >>> compares_reduction(ast.parse("np.abs(a).max() > 1 or len(x) > 2").body[0].value)
    False
    >>> compares_reduction(ast.parse("torch.tensor(losses).mean() < best").body[0].value)
    False
    """
    for sub in ast.walk(test):
        if not isinstance(sub, ast.Compare):
            continue
        for side in (sub.left, *sub.comparators):
            if not (
                isinstance(side, ast.Call)
                and isinstance(side.func, ast.Attribute)
                and side.func.attr in _REDUCTIONS
            ):
                continue
            root: ast.AST = side.func.value
            host = False
            while isinstance(root, (ast.Attribute, ast.Call, ast.Subscript)):
                host |= _host_value(root)  # torch.tensor(losses).mean(): made on the host
                root = root.func if isinstance(root, ast.Call) else root.value
            if not (host or (isinstance(root, ast.Name) and root.id in _HOST_ROOTS)):
                return True
    return False


def _dotted(node: ast.AST) -> str:
    """``a.b.C`` for a chain of attributes on a name, else ""."""
    parts: List[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return ""
    parts.append(node.id)
    return ".".join(reversed(parts))


class Distributions:
    """How a file names ``torch.distributions``: the module under its aliases (``import
    torch.distributions as D``, ``from torch import distributions as pyd``) and the classes it
    imports from it (``from torch.distributions import Normal``). Building a distribution
    validates its arguments by default (torch >= 1.8; ``validate_args=False`` or
    ``Distribution.set_default_validate_args(False)`` turn it off): ``if not valid.all()`` reads
    a tensor back, so the host waits for the GPU.

    >>> d = Distributions(ast.parse("from torch import distributions as pyd\\n"))
    >>> [d.builds(ast.parse(s).body[0].value) for s in ("pyd.Normal(m, s)",
    ...     "pyd.Normal(m, s, validate_args=False)", "pyd.kl_divergence(p, q)")]
    [True, False, False]
    """

    def __init__(self, tree: ast.AST) -> None:
        modules = {"torch.distributions"}
        classes: Set[str] = set()
        self.off = False
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("torch.distributions") and alias.asname:
                        modules.add(alias.asname)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    if not full.startswith("torch.distributions"):
                        continue
                    bound = alias.asname or alias.name
                    (classes if alias.name[:1].isupper() else modules).add(bound)
            elif isinstance(node, ast.Call) and call_name(node.func) == "set_default_validate_args":
                # Distribution.set_default_validate_args(False): only a literal False
                self.off |= bool(node.args) and _false(node.args[0])
            elif isinstance(node, ast.Assign) and _false(node.value):
                # Distribution._validate_args = False
                self.off |= any(
                    isinstance(t, ast.Attribute) and t.attr == "_validate_args"
                    for t in node.targets
                )
        self.modules = frozenset(modules)
        self.classes = frozenset(classes)

    def _class_name(self, node: ast.AST) -> str:
        """The class ``node`` names in ``torch.distributions`` (``Normal`` for ``D.Normal``,
        for ``Normal`` imported from it, ``TransformedDistribution`` for
        ``pyd.transformed_distribution.TransformedDistribution``), "" for anything else (a
        transform, a constraint, another module's name)."""
        dotted = _dotted(node)
        last = dotted.rsplit(".", 1)[-1]
        if not last[:1].isupper() or last.endswith("Transform"):
            return ""
        if dotted == last:
            return last if last in self.classes else ""
        prefix = dotted[: -len(last) - 1]
        if "transforms" in prefix.split(".") or "constraints" in prefix.split("."):
            return ""
        ours = any(prefix == m or prefix.startswith(m + ".") for m in self.modules)
        return last if ours else ""

    def names_class(self, node: ast.AST) -> bool:
        """``node`` names a class of ``torch.distributions``; not a transform's or a
        constraint's."""
        return bool(self._class_name(node))

    def validates(self, node: ast.AST) -> bool:
        """``node`` names a distribution class whose constructor checks argument constraints
        (not one without any: ``Independent``, ``TransformedDistribution``,
        ``MixtureSameFamily``, the base classes), with validation on in the file."""
        name = "" if self.off else self._class_name(node)
        return bool(name) and name not in _NO_ARG_CONSTRAINTS

    def builds(self, node: ast.AST) -> bool:
        """``node`` builds a distribution that validates arguments that may be on the GPU
        (not ``Normal(0.0, 0.1)``, not ``validate_args=False``)."""
        if not isinstance(node, ast.Call) or not self.validates(node.func):
            return False
        if any(k.arg == "validate_args" and _false(k.value) for k in node.keywords):
            return False
        values = [*node.args, *(k.value for k in node.keywords if k.arg != "validate_args")]
        return any(not _host_value(v) for v in values)


# Distribution classes with no argument constraints to check when built.
_NO_ARG_CONSTRAINTS = frozenset(
    {"Distribution", "ExponentialFamily", "Independent", "TransformedDistribution"}
    | {"MixtureSameFamily"}
)
# torch factories whose result is on the CPU unless given a device.
_HOST_FACTORIES = frozenset({"zeros", "ones", "tensor", "full", "eye", "arange", "as_tensor"})


def _false(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value is False


def _host_value(node: ast.AST) -> bool:
    """A number (``0.1``, ``-1``) or a torch factory's tensor made without a device
    (``torch.zeros(4)``): a value on the host, whose validation waits for no GPU work."""
    if isinstance(node, ast.UnaryOp):
        node = node.operand
    if isinstance(node, ast.Constant):
        return isinstance(node.value, (int, float))
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in _HOST_FACTORIES
        and _dotted(node.func.value) == "torch"
        and not any(k.arg == "device" for k in node.keywords)
    )


def reads_first(node: ast.Subscript) -> bool:
    """``x[0]`` read (not assigned to)."""
    index = node.slice
    return (
        isinstance(node.ctx, ast.Load)
        and isinstance(index, ast.Constant)
        and type(index.value) is int
        and index.value == 0
    )


def legacy_scalar(node: ast.Subscript) -> bool:
    """``loss.data[0]``: a Python number on the torch (before 0.4) that code written this way
    supports, read from the device."""
    value = node.value
    return isinstance(value, ast.Attribute) and value.attr == "data" and reads_first(node)


_COMPARISONS = frozenset({"gt", "lt", "ge", "le", "eq", "ne"})


def _masks(node: ast.AST) -> Set[str]:
    """Names ``node``'s code binds to a comparison's result, or to a value made from one
    (``pos = conf > 0``, ``idx = pos.unsqueeze(2).expand_as(x)``): boolean masks."""
    binds = [
        (t.id, n.value)
        for n in ast.walk(node)
        if isinstance(n, ast.Assign)
        for t in n.targets
        if isinstance(t, ast.Name)
    ]
    found: Set[str] = set()
    for _ in range(3):
        for name, value in binds:
            for sub in ast.walk(value):
                if (
                    isinstance(sub, ast.Compare)
                    or (isinstance(sub, ast.Name) and sub.id in found)
                    or (isinstance(sub, ast.Attribute) and sub.attr in _COMPARISONS)
                ):
                    found.add(name)
                    break
    return found


# Reads of a tensor's metadata, or of plain Python numbers: no wait for the GPU.
_METADATA_ATTRS = frozenset({"shape", "ndim", "dtype", "device", "is_cuda", "requires_grad"})
_METADATA_CALLS = frozenset({"len", "size", "dim", "numel", "sqrt", "ceil", "floor", "log2"})


def _metadata(value: ast.AST) -> bool:
    """``value`` reads only a tensor's metadata or Python numbers (``x.shape[0]``,
    ``int(math.sqrt(n))``, ``print(x.shape)``, ``f"{x.size(1)}"``), whatever else it names:
    converting or printing it does not wait for the GPU."""
    found = False
    for sub in ast.walk(value):
        if isinstance(sub, ast.Attribute) and sub.attr in _METADATA_ATTRS:
            found = True
        elif isinstance(sub, ast.Call) and call_name(sub.func) in _METADATA_CALLS:
            found = True
        elif isinstance(sub, ast.Call):
            return False  # some other call: its result may be a tensor
    return found


def _body_syncs(node: ast.AST, masks: Set[str], dists: Optional[Distributions] = None) -> bool:
    """Whether the code under ``node`` has something that waits for the GPU (a host copy, a
    synchronize, a data-dependent op, printing or converting a value, a boolean-mask index,
    Python's ``max``/``min`` of a tensor, a tested tensor predicate or compared reduction, a
    distribution built with its arguments validated): a call of it inside a timed interval may
    synchronize. ``masks``: names bound to boolean masks (``_masks``); ``dists``: how the file
    names ``torch.distributions``."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call):
            func = sub.func
            name = call_name(func)
            if dists is not None and dists.builds(sub):
                return True
            if isinstance(func, ast.Attribute) and func.attr in SYNC_METHODS:
                return True
            if name in SYNC_NAMES or (isinstance(func, ast.Name) and name in SYNC_METHODS):
                return True
            if isinstance(func, ast.Name) and func.id in ("print", "float", "int", "bool"):
                if any(not isinstance(a, ast.Constant) and not _metadata(a) for a in sub.args):
                    return True
            if isinstance(func, ast.Name) and func.id in ("max", "min") and len(sub.args) > 1:
                if any(isinstance(a, ast.Call) for a in sub.args):
                    return True  # max(t.sum(), 1): a comparison the host reads
            if name in ("nonzero", "unique", "masked_select", "argwhere", "save"):
                return True
        elif isinstance(sub, ast.Subscript):
            index = sub.slice
            if legacy_scalar(sub) or isinstance(index, ast.Compare):
                return True
            if isinstance(index, ast.Name) and index.id in masks:
                return True
        elif isinstance(sub, (ast.If, ast.While, ast.Assert)):
            if compares_reduction(sub.test):
                return True
            for part in ast.walk(sub.test):
                if isinstance(part, ast.Call) and call_name(part.func) in PREDICATES:
                    return True
    return False


def _methods(node: ast.ClassDef) -> Dict[str, ast.AST]:
    """A class body's methods by name (those under an ``if`` of the body too)."""
    found: Dict[str, ast.AST] = {}
    todo: List[ast.stmt] = list(node.body)
    while todo:
        stmt = todo.pop(0)
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found.setdefault(stmt.name, stmt)
        elif isinstance(stmt, ast.If):
            todo.extend(stmt.body + stmt.orelse)
    return found


def model_class(name: str) -> bool:
    """A class name that may be a model's (not a loss's or a criterion's)."""
    lowered = name.lower()
    return name[:1].isupper() and "loss" not in lowered and "criterion" not in lowered


def made_by(value: ast.AST) -> str:
    """The name of what builds ``value``: ``Net`` for ``Net(...)``, ``Net(...).cuda()``,
    ``Net(...).to(device).eval()``; "" for anything else."""
    while (
        isinstance(value, ast.Call)
        and isinstance(value.func, ast.Attribute)
        and isinstance(value.func.value, ast.Call)
    ):
        value = value.func.value
    return call_name(value.func) if isinstance(value, ast.Call) else ""


def _instance_attrs(node: ast.AST) -> Dict[str, str]:
    """``self.x`` attribute -> the class a class body binds it to an instance of."""
    attrs: Dict[str, str] = {}
    if isinstance(node, ast.ClassDef):
        for sub in ast.walk(node):
            if isinstance(sub, ast.Assign) and len(sub.targets) == 1:
                attr = self_attr(sub.targets[0])
                made = made_by(sub.value)
                if attr is not None and made[:1].isupper():
                    attrs[attr] = made
    return attrs


def _calls_into(
    node: ast.AST, parts: List[ast.AST], attrs: Optional[Dict[str, str]] = None
) -> FrozenSet[str]:
    """Names of the project code a call of ``node`` reaches from ``parts`` (what it runs):
    functions called by a bare name, the classes whose instances it calls through a ``self``
    attribute its class binds (``self.head = Head()`` ... ``self.head(x)``), and the methods
    it calls on such an instance, as ``Class.method`` (``self.util.nms(...)``)."""
    attrs = _instance_attrs(node) if attrs is None else attrs
    found: Set[str] = set()
    for part in parts:
        for sub in ast.walk(part):
            if isinstance(sub, ast.Call):
                func = sub.func
                if isinstance(func, ast.Name):
                    found.add(func.id)
                attr = self_attr(func)
                if attr is not None and attr in attrs:
                    found.add(attrs[attr])
                if isinstance(func, ast.Attribute):
                    owner = self_attr(func.value)
                    if owner is not None and owner in attrs:
                        found.add(f"{attrs[owner]}.{func.attr}")
    return frozenset(found)


def syncing_definitions(
    tree: ast.Module, path: str
) -> Tuple[FrozenSet[str], Tuple[Tuple[str, FrozenSet[str]], ...], FrozenSet[str]]:
    """(the module-level functions and classes of a file, and the methods of its classes as
    ``Class.method``, whose code may wait for the GPU when called, a class by its
    ``forward`` / ``__call__``; for the others, the project code each reaches; the names of
    the functions the file defines, at module level or as methods, whatever their case): a gather function for
    ``project_facts``, joined over the project by ``UnsyncedCudaTiming._project_syncs``.

    >>> src = (
    ...     "class Head:\\n"
    ...     "    def forward(self, x):\\n        return self.loss(x)\\n"
    ...     "    def loss(self, x):\\n        return self.assign(x)\\n"
    ...     "    def assign(self, x):\\n        return int(x[0])\\n"
    ...     "    def shape(self, x):\\n        return x.shape\\n"
    ... )
    >>> found, reaches, defined = syncing_definitions(ast.parse(src), "m.py")
    >>> sorted(found)
    ['Head', 'Head.assign', 'Head.forward', 'Head.loss']
    >>> sorted(defined)
    ['assign', 'forward', 'loss', 'shape']
    """
    found: Set[str] = set()
    reaches: List[Tuple[str, FrozenSet[str]]] = []
    defined: Set[str] = set()
    dists = Distributions(tree)
    for node in tree.body:
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        masks = _masks(node)  # of the whole class: a method passes its mask to another
        if not isinstance(node, ast.ClassDef):
            defined.add(node.name)
            if _body_syncs(node, masks, dists):
                found.add(node.name)
            else:
                reaches.append((node.name, _calls_into(node, [node])))
            continue
        _class_facts(node, masks, found, reaches, defined, dists)
    return frozenset(found), tuple(reaches), frozenset(defined)


def _class_facts(
    node: ast.ClassDef,
    masks: Set[str],
    found: Set[str],
    reaches: List[Tuple[str, FrozenSet[str]]],
    defined: Set[str],
    dists: Optional[Distributions] = None,
) -> None:
    """Add a class's facts to ``found`` / ``reaches`` / ``defined``, in time linear in its
    methods and their calls of each other: each method's body is read once, and waiting is
    passed back along the calls (a method waits when one it calls on ``self`` does)."""
    methods = _methods(node)
    attrs = _instance_attrs(node)
    calls: Dict[str, Set[str]] = {}
    callers: Dict[str, Set[str]] = {name: set() for name in methods}
    for name, method in methods.items():
        calls[name] = set()
        for sub in ast.walk(method):
            if isinstance(sub, ast.Call):
                callee = self_attr(sub.func)
                if callee is not None and callee in methods and callee != "__init__":
                    calls[name].add(callee)
                    callers[callee].add(name)
    direct = {name for name, method in methods.items() if _body_syncs(method, masks, dists)}
    if dists is not None and (
        any(dists.validates(base) for base in node.bases)
        or (any(dists.names_class(base) for base in node.bases) and "__init__" in direct)
    ):
        found.add(node.name)  # a distribution of the project's: building it validates
    waiting = list(direct)
    syncing: Set[str] = set()
    while waiting:  # back along the calls: whoever calls a method that waits, waits
        name = waiting.pop()
        if name in syncing:
            continue
        syncing.add(name)
        waiting.extend(callers[name] - syncing)
    entry = [n for n in ("forward", "__call__") if n in methods]
    if any(n in syncing for n in entry):
        found.add(node.name)
    else:
        # What a call of the class runs: its entry methods and the methods they reach.
        runs: Set[str] = set()
        todo: List[str] = list(entry)
        while todo:
            name = todo.pop()
            if name not in runs:
                runs.add(name)
                todo.extend(calls[name])
        parts = [methods[name] for name in runs]
        reaches.append((node.name, _calls_into(node, parts, attrs)))
    for name, method in methods.items():
        if name.startswith("__") and name != "__call__":
            continue
        defined.add(name)
        key = f"{node.name}.{name}"
        if name in syncing:
            found.add(key)
        else:
            # What it reaches itself, and its own methods by name: the project's joining
            # passes waiting back through them.
            own = {f"{node.name}.{callee}" for callee in calls[name]}
            reaches.append((key, _calls_into(node, [method], attrs) | own))
