"""The evidence ST004 (``torch.load`` without ``map_location``) reports from: the loaded file
can hold CUDA tensors, and the loading script also runs without CUDA or in several processes.

The pitfall is a load that puts tensors back on a device that is not there (a GPU checkpoint
on a CPU-only machine) or on the wrong one (every rank of a multi-process job onto
``cuda:0``). Both halves must show in the project's own code:

- *CUDA tensors in the file*: a save of the project that may write the loaded path (by its
  shape, :func:`_load_flow.candidates`) saves what is not evidently on the CPU, in a file
  that puts things on CUDA (``.cuda()``, ``"cuda"``, ``torch.cuda``, ``torch.accelerator``).
  The save is in the loading file itself (a script that resumes what it saved) or names its
  file (a literal, a literal end such as ``"_best.pth"``); a generic helper that saves to
  a path it is given, in a file that never names CUDA, is no evidence.
- *a script that runs without CUDA, or in several processes*: the loading file has a CPU
  path (``torch.cuda.is_available()``, a ``"cpu"`` device, a ``--cuda`` / ``--no-cuda`` /
  ``--cpu`` option, ``args.cuda`` tested) or runs ranks (``torch.distributed``,
  ``local_rank``, DDP).

Standard library only, like the rest of ``safetorch.check``.

>>> import ast
>>> mentions_cuda(ast.parse("model = Net().cuda()"), "train.py")
True
>>> mentions_cuda(ast.parse("model = Net()"), "train.py")
False
"""

from __future__ import annotations

import ast
from typing import Dict, FrozenSet, List, Optional, Set, Tuple

from safetorch.check.engine import Context
from safetorch.check.rules import _load_flow as flow

__all__ = ["RANKS", "cuda_save", "device_saves", "mentions_cuda", "runs_off_cuda"]

# Names of command-line switches and variables that choose between CUDA and the CPU.
_SWITCHES = frozenset(
    {"cuda", "no_cuda", "use_cuda", "use_gpu", "cpu", "gpu", "ngpu", "gpus", "gpu_ids"}
    | {"device", "accel", "no_accel"}
)
# Option strings that choose the device (``--cuda``, ``--no-cuda``, ``--cpu``).
_DEVICE_OPTIONS = frozenset(
    {"--cuda", "--no-cuda", "--no_cuda", "--cpu", "--gpu", "--use-cuda", "--use_cuda"}
    | {"--use-gpu", "--use_gpu", "--device", "--accel", "--no-accel", "--ngpu", "--gpus"}
)
# Attributes and names that say the script runs in several processes.
_RANKS = frozenset({"local_rank", "world_size", "rank", "init_process_group", "spawn"})


#: What :func:`runs_off_cuda` says of a file that runs ranks.
RANKS = "several processes"
_RANKS_WHY = RANKS


def mentions_cuda(tree: ast.Module, path: str) -> bool:
    """Whether a file puts things on a GPU: ``.cuda``, a ``"cuda..."`` literal,
    ``torch.accelerator``, an ``Accelerator`` (a gather function for ``project_facts``)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in ("cuda", "accelerator"):
            return True
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if node.value.startswith("cuda"):
                return True
        if isinstance(node, ast.Name) and node.id == "Accelerator":
            return True
    return False


def _moved(tree: ast.Module) -> Set[str]:
    """The names (``model``, ``self.net``) a file moves to a device or builds there:
    ``x = Net().cuda()``, ``x = x.to(device)``, ``x.cuda()`` as a statement."""
    found: Set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            if any(_is_move(n) for n in ast.walk(node.value)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    for sub in ast.walk(target):
                        if isinstance(sub, (ast.Name, ast.Attribute)):
                            found.add(ast.unparse(sub))
        elif isinstance(node, ast.Expr) and _is_move(node.value):
            receiver = node.value.func.value  # type: ignore[attr-defined]  # _is_move checked a method call
            while isinstance(receiver, ast.Call) and isinstance(receiver.func, ast.Attribute):
                receiver = receiver.func.value
            found.add(ast.unparse(receiver))
    return found


def _is_move(node: ast.AST) -> bool:
    """``x.cuda()`` / ``x.to(...)`` (a call)."""
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in ("cuda", "to")
    )


def device_saves(tree: ast.Module, path: str) -> FrozenSet[int]:
    """Lines of the file's saves whose value holds a module's tensors: a ``state_dict()``,
    ``parameters()``, a name the file moves to a device, a ``.cuda()`` value, or a parameter
    of the function around the save (a checkpoint helper, given a state dict); only in a file
    that names CUDA (a gather function for ``project_facts``). A dataset or vocabulary cache
    (``torch.save(corpus, fn)``) is not one."""
    if not mentions_cuda(tree, path):
        return frozenset()
    moved = _moved(tree)
    bound = _bindings(tree)
    saves = flow.gather_saves(tree, path)
    lines = {s.line for s in saves if s.params}
    at = {s.line for s in saves}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and node.lineno in at and node.args):
            continue
        func = node.func
        if (func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")) != "save":
            continue
        if _holds_module_tensors(node.args[0], moved, bound, 0):
            lines.add(node.lineno)
    return frozenset(lines)


# Calls whose result is a module's tensors.
_MODULE_TENSORS = ("state_dict", "parameters", "named_parameters", "cuda")


def _holds_module_tensors(
    value: ast.AST, moved: Set[str], bound: Dict[str, List[ast.expr]], depth: int
) -> bool:
    """``value`` is or contains a module's tensors: a ``state_dict()`` (or ``parameters()``,
    a ``.cuda()`` value), a name the file moves to a device, or a name the file binds to one
    of those (``state = {"model": net.state_dict()}``, two levels)."""
    for sub in ast.walk(value):
        if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute):
            if sub.func.attr in _MODULE_TENSORS:
                return True
        if isinstance(sub, (ast.Name, ast.Attribute)) and ast.unparse(sub) in moved:
            return True
        if isinstance(sub, ast.Name) and depth < 2:
            for v in bound.get(sub.id, []):
                if _holds_module_tensors(v, moved, bound, depth + 1):
                    return True
    return False


def _bindings(tree: ast.Module) -> Dict[str, List[ast.expr]]:
    """name -> every value the file assigns to it (any scope; ``d[k] = v`` binds ``d``)."""
    found: Dict[str, List[ast.expr]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                while isinstance(target, ast.Subscript):
                    target = target.value
                if isinstance(target, ast.Name):
                    found.setdefault(target.id, []).append(node.value)
    return found


def cuda_save(ctx: Context, call: ast.Call) -> Optional[flow.Save]:
    """The save of the project that evidently writes the file ``call`` loads from CUDA
    tensors, or None."""
    here = ctx.project.relpath(ctx.path)
    cuda_files = ctx.project_facts("ST004-cuda-files", mentions_cuda)
    device = ctx.project_facts("ST004-device-saves", device_saves)
    shape = flow.load_shape(ctx, call)
    if shape is None:
        return None
    found = flow.candidates(ctx, call)
    function = getattr(flow.file_of(ctx).scope_of(call), "name", "")
    same = [
        s for s in found if s.path == here and s.shape.text == shape.text and s.function == function
    ]
    if same:
        found = same  # the save of the very path it loads (a cache: load if it exists)
    named_load = shape.exact is not None or bool(shape.suffix.strip("./"))
    for save in sorted(found, key=lambda s: (s.path != here, s.path, s.line)):
        if save.cpu or not cuda_files.get(save.path):
            continue
        if save.line not in device.get(save.path, frozenset()):
            continue  # a cache of data, not a module's tensors
        named_save = save.shape.exact is not None or bool(save.shape.suffix.strip("./"))
        if save.path == here and (named_save or not named_load):
            return save  # the script resumes what it saves
        if named_save:
            return save  # a file of this name is written from CUDA
    return None


# Names of the object a script's options live on (``args.cuda``, ``opt.device``).
_OPTIONS = frozenset({"args", "opt", "opts", "options", "cfg", "config", "flags", "FLAGS"})


def _is_switch(node: ast.AST) -> bool:
    """``args.cuda`` / ``opt.no_cuda`` / ``use_gpu`` read (not called): a device switch of
    the command line (not ``self.device``, which any object may have)."""
    if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
        value = node.value
        return (
            node.attr in _SWITCHES
            and isinstance(value, ast.Name)
            and (value.id in _OPTIONS or value.id.endswith("args"))
        )
    return isinstance(node, ast.Name) and node.id in ("use_cuda", "use_gpu", "no_cuda")


def runs_off_cuda(ctx: Context) -> Optional[Tuple[int, str]]:
    """(line, why) where the checked file shows it also runs without CUDA or in several
    processes; None for a file that shows neither (a CUDA-only script, a library)."""
    cached = ctx.cache.get("ST004-off-cuda", False)
    if cached is not False:
        return cached
    found: Optional[Tuple[int, str]] = None
    called = {id(n.func) for n in ctx.walk(ctx.tree) if isinstance(n, ast.Call)}
    for node in ctx.walk(ctx.tree):
        line = getattr(node, "lineno", 0)
        why = None
        if isinstance(node, ast.Attribute):
            if node.attr in ("is_available", "device_count"):
                why = f"{ctx.segment(node)} checks for CUDA"
            elif node.attr in _RANKS or node.attr == "DistributedDataParallel":
                why = _RANKS_WHY
            elif id(node) not in called and _is_switch(node):
                why = f"a device switch, {ctx.segment(node)}"
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if node.value in ("cpu", "mps") or node.value.startswith("cpu:"):
                why = f'the "{node.value}" device'
            elif node.value in _DEVICE_OPTIONS:
                why = f"a {node.value} option"
        elif isinstance(node, ast.Name) and node.id in ("local_rank", "world_size"):
            why = _RANKS_WHY
        elif isinstance(node, ast.Name) and _is_switch(node):
            why = f"a device switch, {node.id}"
        if why is not None and (found is None or line < found[0]):
            found = (line, why)
    if found is None and any(v.startswith("torch.distributed") for v in ctx.imports.values()):
        found = (1, _RANKS_WHY)
    ctx.cache["ST004-off-cuda"] = found
    return found
