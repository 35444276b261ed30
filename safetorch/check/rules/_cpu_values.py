"""Local names a function binds to CPU tensors, on evidence (ST006: a backward of one is no
CUDA work, whatever else the function runs on the GPU)."""

from __future__ import annotations

import ast
from typing import Dict, FrozenSet, List, Optional, Set

from safetorch.check.rules._helpers import FUNCTION_DEFS, call_name

# torch functions that make a new tensor, on the CPU unless given a device.
_FACTORIES = frozenset(
    {"randn", "rand", "randint", "randperm", "zeros", "ones", "empty", "full", "arange"}
    | {"linspace", "logspace", "eye", "tensor", "as_tensor", "from_numpy", "exp", "log"}
)
# Wrappers that scatter their inputs to the GPUs.
_WRAPPERS = frozenset({"DataParallel", "DistributedDataParallel"})
# Methods and attributes that put a tensor on (or name) a GPU.
_TO_GPU = frozenset({"cuda", "to", "type", "device", "pin_memory"})


def _local_nodes(scope: ast.AST) -> List[ast.AST]:
    """The nodes of ``scope``'s own body, not those of functions or classes nested in it."""
    out: List[ast.AST] = []
    todo = list(ast.iter_child_nodes(scope))
    while todo:
        node = todo.pop()
        out.append(node)
        if not isinstance(node, (*FUNCTION_DEFS, ast.ClassDef, ast.Lambda)):
            todo.extend(ast.iter_child_nodes(node))
    return out


def _gpu_marked(value: ast.AST) -> bool:
    """``value`` names or moves to a device: ``.cuda()``, ``.to(...)``, ``.type(...)``, a
    ``device=`` keyword, any ``cuda`` attribute (``torch.cuda.FloatTensor``)."""
    for sub in ast.walk(value):
        if isinstance(sub, ast.Attribute) and sub.attr in _TO_GPU:
            return True
        if isinstance(sub, ast.keyword) and sub.arg == "device":
            return True
    return False


def _names_gpu(call: ast.Call) -> bool:
    """``x.to(device)`` / ``x.to("cuda")`` / ``x.type(torch.cuda.FloatTensor)``: an argument
    names the GPU or a device (not a dtype, ``x.to(torch.float16)``, nor the CPU)."""
    found = False
    for arg in (*call.args, *(k.value for k in call.keywords)):
        for sub in ast.walk(arg):
            text = (
                sub.value
                if isinstance(sub, ast.Constant) and isinstance(sub.value, str)
                else sub.attr
                if isinstance(sub, ast.Attribute)
                else sub.id
                if isinstance(sub, ast.Name)
                else ""
            )
            if "cpu" in text.lower():
                return False  # x.to(torch.device("cpu")), x.to(cpu_device): a copy to the host
            if any(w in text.lower() for w in ("cuda", "gpu", "device")):
                found = True
    return found


def _moved_root(value: ast.AST) -> Optional[str]:
    """``x`` for ``x.cuda()``, ``x.data.type(torch.cuda.FloatTensor)``,
    ``Variable(x.data.cuda(), requires_grad=True)``: the name a copy to the GPU is made of."""
    for sub in ast.walk(value):
        if (
            isinstance(sub, ast.Call)
            and isinstance(sub.func, ast.Attribute)
            and sub.func.attr in ("cuda", "to", "type")
            and (sub.func.attr == "cuda" or _names_gpu(sub))
        ):
            base = sub.func.value
            while isinstance(base, ast.Attribute) and base.attr in ("data", "detach"):
                base = base.value
            while isinstance(base, ast.Call) and isinstance(base.func, ast.Attribute):
                base = base.func.value  # x.detach().cuda()
            if isinstance(base, ast.Name):
                return base.id
    return None


def _callee_root(func: ast.AST) -> Optional[ast.AST]:
    """The node a call's function hangs from: ``torch`` for ``torch.exp``, ``w`` for
    ``w.sum``, the inner call for ``torch.randn(3).float``."""
    while isinstance(func, ast.Attribute):
        func = func.value
    return func


def cpu_made(value: ast.AST, cpu: Set[str], modules: FrozenSet[str] = frozenset()) -> bool:
    """``value`` makes a CPU tensor: nothing in it names a device, every name it reads (but
    the functions it calls) holds a CPU tensor, a torch factory it calls gets no device, and
    it calls only torch's functions, methods of CPU tensors and ``modules`` (names the
    function binds to a class's instance: a module given CPU inputs runs on the CPU or
    fails), not a helper that may move what it gets (``to_var(x)``)."""
    if _gpu_marked(value):
        return False
    callees = set()
    for sub in ast.walk(value):
        if isinstance(sub, ast.Call):
            root = _callee_root(sub.func)
            if isinstance(root, ast.Name) and not (
                root.id == "torch" or root.id in modules or root.id in cpu
            ):
                return False  # a helper or a model of unknown kind may move what it gets
            callees.add(id(root))
    reads = False
    for sub in ast.walk(value):
        if isinstance(sub, ast.Name) and sub.id in cpu:
            reads = True  # a CPU tensor, read or called a method of (``w.sum()``)
        elif isinstance(sub, ast.Name) and id(sub) not in callees:
            return False
        elif isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name):
            if id(sub.value) not in callees and sub.value.id not in cpu:
                return False
        elif isinstance(sub, ast.Call) and call_name(sub.func) in _FACTORIES:
            reads = True
    return reads


def cpu_names(scope: ast.AST) -> Set[str]:
    """Local names of the function ``scope`` that hold CPU tensors, on evidence: copied to the
    GPU under another name in the same function and never rebound to a move themselves
    (``x_cuda = x.cuda()``: ``x`` stays on the CPU), or bound only to a torch factory's tensor
    made without a device (``torch.randn(n)``) or to ops and calls of such names alone
    (``y = torch.exp(-x)``, ``out = layer(x)``: a module given CPU inputs runs on the CPU, or
    fails).

    >>> src = '''
    ... def f(x):
    ...     layer = Net()
    ...     out = layer(x)
    ...     x_cuda = x.cuda()
    ...     gpu_out = layer(x_cuda)
    ...     z = torch.randn(3).float()
    ...     w = torch.exp(-z) / 2
    ...     return out, gpu_out, w
    ... '''
    >>> sorted(cpu_names(ast.parse(src).body[0]))
    ['out', 'w', 'x', 'z']
    """
    if not isinstance(scope, FUNCTION_DEFS):
        return set()
    binds: Dict[str, List[Optional[ast.expr]]] = {}
    params = {a.arg for a in (*scope.args.posonlyargs, *scope.args.args, *scope.args.kwonlyargs)}
    copies: Dict[str, Set[str]] = {}  # x -> the names its GPU copies are bound to
    for node in _local_nodes(scope):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    binds.setdefault(target.id, []).append(node.value)
                    moved = _moved_root(node.value)
                    if moved is not None:
                        copies.setdefault(moved, set()).add(target.id)
                else:
                    for sub in ast.walk(target):
                        if isinstance(sub, ast.Name):
                            binds.setdefault(sub.id, []).append(None)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign, ast.For, ast.AsyncFor)):
            for sub in ast.walk(node.target):
                if isinstance(sub, ast.Name):
                    binds.setdefault(sub.id, []).append(None)
        elif isinstance(node, (ast.withitem,)) and node.optional_vars is not None:
            for sub in ast.walk(node.optional_vars):
                if isinstance(sub, ast.Name):
                    binds.setdefault(sub.id, []).append(None)
        elif isinstance(node, ast.NamedExpr):
            binds.setdefault(node.target.id, []).append(None)
    modules = frozenset(
        name
        for name, values in binds.items()
        if values
        and all(
            isinstance(v, ast.Call)
            and call_name(v.func)[:1].isupper()
            and call_name(v.func) not in _WRAPPERS
            for v in values
        )
    )
    cpu = {
        name
        for name, targets in copies.items()
        if name not in targets
        and (name in params or name in binds)
        and all(v is None or not _gpu_marked(v) for v in binds.get(name, []))
        and all(v is not None for v in binds.get(name, []))
    }
    for _ in range(4):  # names made of such names, a few steps deep
        more = {
            name
            for name, values in binds.items()
            if name not in cpu
            and name not in params
            and all(v is not None and cpu_made(v, cpu, modules) for v in values)
        }
        if not more:
            break
        cpu |= more
    return cpu
