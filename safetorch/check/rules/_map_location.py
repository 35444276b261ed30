"""The evidence ST004 (``torch.load`` without ``map_location``) reports from: the loaded file
can hold CUDA tensors, and the loading script also runs without CUDA or in several processes.

The pitfall is a load that puts tensors back on a device that is not there (a GPU checkpoint
on a CPU-only machine) or on the wrong one (every rank of a multi-process job onto
``cuda:0``). Both halves must show in the project's own code:

- *CUDA tensors in the file*: a save of the same program (the loading file's directory, or
  one inside the other) that may write the loaded path (by its shape,
  :func:`_load_flow.candidates`) saves what is not evidently on the CPU, in a file that puts
  things on CUDA (``.cuda()``, ``"cuda"``, ``torch.cuda``, ``torch.accelerator``). The save
  is in the loading file itself (a script that resumes what it saved) or names its file (a
  literal, a literal end such as ``"_best.pth"``); a generic helper that saves to a path it
  is given, in a file that never names CUDA, is no evidence, nor is an in-memory buffer.
- *a script that runs without CUDA, or in several processes*: the loading file chooses a
  device that includes the CPU (``torch.cuda.is_available()`` not asserted, a ``"cpu"``
  device chosen by a test, a ``--cuda`` / ``--no-cuda`` / ``--cpu`` option, ``args.cuda``
  read) and no statement of it moves to CUDA whatever is tested; or it starts or joins
  ranks (``init_process_group``, DDP, ``local_rank``, ``mp.spawn``) and the load is not
  kept to the main process.

Standard library only, like the rest of ``safetorch.check``.

>>> import ast
>>> mentions_cuda(ast.parse("model = Net().cuda()"), "train.py")
True
>>> mentions_cuda(ast.parse("model = Net()"), "train.py")
False
"""

from __future__ import annotations

import ast
import posixpath
import re
from typing import Dict, FrozenSet, List, Optional, Set, Tuple

from safetorch.check.engine import Context
from safetorch.check.fixer import parents as parent_map
from safetorch.check.rules import _load_flow as flow
from safetorch.check.rules._helpers import call_arg, call_name, module_files, self_attr
from safetorch.check.rules._wrapped import is_main_guard

__all__ = ["RANKS", "cuda_save", "device_saves", "mentions_cuda", "runs_off_cuda"]

# Names of command-line switches and variables that choose between CUDA and the CPU (not
# ``gpus`` / ``ngpu`` / ``gpu_ids``, which choose how many or which GPUs, nor ``device``, which
# an option may set to a GPU only).
_SWITCHES = frozenset({"cuda", "no_cuda", "use_cuda", "use_gpu", "cpu", "accel", "no_accel"})
# Option strings that choose between CUDA and the CPU (``--cuda``, ``--no-cuda``, ``--cpu``);
# ``--device`` only where its default, help or choices name the CPU.
_DEVICE_OPTIONS = frozenset(
    {"--cuda", "--no-cuda", "--no_cuda", "--cpu", "--use-cuda", "--use_cuda", "--use-gpu"}
    | {"--use_gpu", "--accel", "--no-accel", "--no_accel"}
)
# Attributes and names that say the script starts or joins several processes itself (not a
# ``rank`` or ``world_size`` alone, nor an import of ``torch.distributed``: a library's
# helpers use those in single-process runs too).
_RANKS = frozenset({"local_rank", "init_process_group", "DistributedDataParallel"})
# Calls that start one process per device.
_SPAWNS = frozenset({"spawn", "start_processes", "Parallel"})
# Words of a test that keeps a load to one process (``if rank == 0:``, ``if is_main_process():``).
_MAIN_PROCESS = ("rank", "main_process", "is_master", "is_main")


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


def _numbers_only(owner: str) -> bool:
    """``scheduler``, ``lr_scheduler``, ``grad_scaler``: an object whose ``state_dict()``
    holds numbers, not tensors (an LR scheduler, a GradScaler); by whole words of its name,
    not ``upscaler``."""
    words = owner.lower().split(".")[-1].split("_")
    return any(w.startswith("sched") or w.endswith("scheduler") or w == "scaler" for w in words)


def _holds_module_tensors(
    value: ast.AST, moved: Set[str], bound: Dict[str, List[ast.expr]], depth: int
) -> bool:
    """``value`` is or contains a module's tensors: a ``state_dict()`` (or ``parameters()``,
    a ``.cuda()`` value), a name the file moves to a device, or a name the file binds to one
    of those (``state = {"model": net.state_dict()}``, two levels)."""
    numbers = {
        id(n)
        for sub in ast.walk(value)
        if isinstance(sub, ast.Call)
        and isinstance(sub.func, ast.Attribute)
        and sub.func.attr == "state_dict"
        and _numbers_only(ast.unparse(sub.func.value))
        for n in ast.walk(sub)
    }  # a scheduler's or a grad scaler's state: numbers, no tensors
    for sub in ast.walk(value):
        if id(sub) in numbers:
            continue
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


def _related(here: str, there: str) -> bool:
    """Two files of one program: the same directory, or one's directory inside the other's
    (``tools/train.py`` and ``demo.py`` at the root; not ``examples/gan/`` and
    ``examples/mnist/``, two programs that share nothing but the repository)."""
    a, b = posixpath.dirname(here), posixpath.dirname(there)
    return a == b or not a or not b or a.startswith(b + "/") or b.startswith(a + "/")


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
    same = _same_function_saves(ctx, call, shape)
    if same:
        found = same  # the save of the very path it loads (a cache: load if it exists)
    named_load = shape.exact is not None or bool(shape.suffix.strip("./"))
    base = _file_name(call, shape)
    if base is not None:
        # The load names its file: only a save that names the same file writes it.
        found = [s for s in found if _names(s.shape, base)]
    for save in sorted(found, key=lambda s: (s.path != here, s.path, s.line)):
        if save.cpu or not cuda_files.get(save.path):
            continue
        if not _related(here, save.path):
            continue  # another program of the repository (another example's checkpoints)
        if save.line not in device.get(save.path, frozenset()):
            continue  # a cache of data, not a module's tensors
        named_save = save.shape.exact is not None or bool(save.shape.suffix.strip("./"))
        if save.path == here and (named_save or not named_load):
            return save  # the script resumes what it saves
        if named_save:
            return save  # a file of this name is written from CUDA
    return None


def _file_name(call: ast.Call, shape: flow.Shape) -> Optional[str]:
    """The file name the load reads, where its path names one: the last part of its known
    end (``f"{base}/en_default_se.pth"``), or a literal file name given to the call that
    builds the path (``get_model_path("autoregressive.pth", models_dir)``); None for a
    pattern (``f"{epoch}.pth"``: only an extension known)."""
    whole = shape.exact is not None or "/" in shape.suffix  # a part after a "/" is a name
    tail = (shape.exact or shape.suffix).rsplit("/", 1)[-1] if whole else ""
    if tail and "." in tail and tail.split(".", 1)[0]:
        return tail
    path = call.args[0] if call.args else None
    if isinstance(path, ast.Call) and not shape.suffix:
        for arg in path.args:
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                name = arg.value.rsplit("/", 1)[-1]
                if "." in name and name.split(".", 1)[0] and name.rsplit(".", 1)[-1] in _EXTS:
                    return name
    return None


# Extensions of torch files (what a literal file name given to a path helper ends with).
_EXTS = frozenset({"pt", "pth", "bin", "ckpt", "tar", "pkl", "model", "weights"})


def _names(save: flow.Shape, base: str) -> bool:
    """A save of this shape may write a file named ``base``: its literal end names it
    (``os.path.join(d, "best.pth")``), or its end is wholly unknown (a helper's ``path``
    parameter); not a pattern whose literal end is only an extension (``f"{epoch}.pth"``:
    files of the project's own naming, not the one the load names)."""
    if save.exact is not None:
        return save.exact.rsplit("/", 1)[-1] == base
    tail = save.suffix.rsplit("/", 1)[-1]
    head = "" if "/" in save.suffix else save.prefix.rsplit("/", 1)[-1]
    if head or (tail and "." in tail and tail.split(".", 1)[0]):
        return base.startswith(head) and base.endswith(tail)  # f"out/decoder_{i}.pth"
    return not save.suffix.strip("./")


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


def _cpu_device_literal(node: ast.Constant, parents: Dict[int, ast.AST]) -> bool:
    """A ``"cpu"`` literal that chooses the device the script runs on: a branch of a
    conditional expression, a side of a comparison, ``torch.device("cpu")``, a value bound to
    a device name (``device = "cpu"``); not ``map_location="cpu"`` or ``x.to("cpu")``, which
    move data to the host and say nothing of where the script runs."""
    parent = parents.get(id(node))
    if isinstance(parent, (ast.IfExp, ast.Compare)):
        return True
    if isinstance(parent, ast.Call):
        func = parent.func
        if not (isinstance(func, ast.Attribute) and func.attr == "device" and node in parent.args):
            return False
        parent = parents.get(id(parent))  # torch.device("cpu"): where it goes
        if isinstance(parent, (ast.IfExp, ast.Compare)):
            return True
    if isinstance(parent, (ast.Assign, ast.AnnAssign)):
        targets = parent.targets if isinstance(parent, ast.Assign) else [parent.target]
        names = [ast.unparse(t).lower() for t in targets]
        # ``device = "cpu"``; not ``cpu_device = torch.device("cpu")``, a place to copy
        # results to in a script that runs on CUDA
        return any("dev" in n and "cpu" not in n for n in names)
    return False


def _device_option(node: ast.Call) -> Optional[str]:
    """The option string of an ``add_argument`` that chooses between CUDA and the CPU."""
    func = node.func
    if not (isinstance(func, ast.Attribute) and func.attr == "add_argument"):
        return None
    flags = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    for flag in flags:
        if flag in _DEVICE_OPTIONS:
            return flag
        if flag == "--device":
            texts = [ast.unparse(k.value) for k in node.keywords]
            if any("cpu" in t.lower() for t in texts):
                return flag
    return None


def _requires_cuda(node: ast.AST, parents: Dict[int, ast.AST]) -> bool:
    """``torch.cuda.is_available()`` asserted, or tested only to stop the script
    (``if not torch.cuda.is_available(): raise ...``): the script needs CUDA."""
    up = parents.get(id(node))
    while up is not None and not isinstance(up, (ast.stmt)):
        up = parents.get(id(up))
    if isinstance(up, ast.Assert):
        return True
    if isinstance(up, ast.If):
        # ``if not available: raise``, or ``if available: ... else: sys.exit(...)``
        branch = up.body if isinstance(up.test, ast.UnaryOp) else up.orelse
        return any(
            isinstance(s, ast.Raise)
            or (isinstance(s, ast.Expr) and "exit" in ast.unparse(s.value).split("(")[0])
            for s in branch
        )
    return False


def _one_device_per_process(ctx: Context) -> bool:
    """The file gives each process a device of its own (``torch.cuda.set_device``,
    ``device_ids=``, ``local_rank`` / ``LOCAL_RANK``, ``mp.spawn``, ``model.cuda(rank)``,
    ``torch.device(f"cuda:{rank}")``): a process group without
    that (``model.cuda(); DistributedDataParallel(model)``, one process per node using all
    of its GPUs) loads each node's copy onto that node's ``cuda:0``, where its model is."""
    found = ctx.cache.get("ST004-per-device")
    if found is None:
        found = False
        for node in ctx.walk(ctx.tree):
            if isinstance(node, ast.Attribute) and node.attr in ("set_device", "local_rank"):
                found = True
            elif isinstance(node, ast.Name) and node.id == "local_rank":
                found = True
            elif isinstance(node, ast.Constant) and node.value == "LOCAL_RANK":
                found = True
            elif isinstance(node, ast.Call) and call_name(node.func) in _SPAWNS:
                found = True
            elif isinstance(node, ast.Call) and call_name(node.func) in _DDP_NAMES:
                # DDP(model, device_ids=[rank]); DataParallel's device_ids are one process's
                found = any(k.arg in ("device_ids", "output_device") for k in node.keywords)
            elif (
                isinstance(node, ast.Call)
                and call_name(node.func) in ("cuda", "to", "device")
                and any(_RANK_WORD.search(ctx.segment(a)) for a in node.args)
            ):
                found = True  # model.cuda(rank), x.to(rank), torch.device(f"cuda:{rank}")
            if found:
                break
        ctx.cache["ST004-per-device"] = found
    return bool(found)


# A rank as a word of an expression (``rank``, ``args.local_rank``; not ``reranker_device``).
_RANK_WORD = re.compile(r"(?<![A-Za-z0-9_])(?:local_)?rank(?![A-Za-z0-9])", re.IGNORECASE)
_DDP_NAMES = frozenset({"DistributedDataParallel", "DDP"})


def _switch_name(flag: str) -> str:
    """The attribute an option string sets: ``--use-cuda`` -> ``use_cuda``."""
    return flag.lstrip("-").replace("-", "_")


def _pinned_switches(ctx: Context) -> Tuple[Set[str], Set[str]]:
    """Switches that choose CUDA whatever the command line says, as (option attributes,
    bare names): an option that turns CUDA on with ``action="store_true"`` and
    ``default=True`` (``--cuda`` can then never be off; ``args.cuda``), unless the file
    assigns that attribute itself (``args.cuda = torch.cuda.device_count() > 0``); a bare
    name the file binds only to ``True`` (``use_cuda = True``, the script as shipped),
    never in a class body (a field's default), a parameter, a loop, a ``with``, an
    ``except``, an import or a ``:=``. Not ``--no-cuda`` / ``--cpu`` (those turn CUDA off)."""
    options: Set[str] = set()
    stored: Set[str] = set()
    bound: Dict[str, List[ast.expr]] = {}
    anything: ast.expr = ast.Constant(None)
    class_bodies = {
        id(s) for n in ctx.walk(ctx.tree) if isinstance(n, ast.ClassDef) for s in n.body
    }
    for node in ctx.walk(ctx.tree):
        if isinstance(node, ast.Call):
            flag = _device_option(node)
            keywords = {k.arg: k.value for k in node.keywords}
            action, default = keywords.get("action"), keywords.get("default")
            if (
                flag is not None
                and "no" not in flag
                and "cpu" not in flag
                and isinstance(action, ast.Constant)
                and action.value == "store_true"
                and isinstance(default, ast.Constant)
                and default.value is True
            ):
                options.add(_switch_name(flag))
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            value = node.value if node.value is not None else anything
            if id(node) in class_bodies or isinstance(node, ast.AugAssign):
                value = anything
            for target in targets:
                for sub in ast.walk(target):
                    if isinstance(sub, ast.Name):
                        bound.setdefault(sub.id, []).append(value)
                    elif isinstance(sub, ast.Attribute) and isinstance(sub.ctx, ast.Store):
                        stored.add(sub.attr)
        elif isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension, ast.withitem)):
            held: Optional[ast.expr] = (
                node.optional_vars if isinstance(node, ast.withitem) else node.target
            )
            for sub in ast.walk(held) if held is not None else ():
                if isinstance(sub, ast.Name):
                    bound.setdefault(sub.id, []).append(anything)
        elif isinstance(node, ast.NamedExpr):
            bound.setdefault(node.target.id, []).append(anything)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.setdefault(node.name, []).append(anything)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                bound.setdefault(alias.asname or alias.name.split(".")[0], []).append(anything)
        elif isinstance(node, ast.arguments):
            for arg in (*node.posonlyargs, *node.args, *node.kwonlyargs):
                bound.setdefault(arg.arg, []).append(anything)  # a caller's value
    names = {
        name
        for name in ("use_cuda", "use_gpu")
        if bound.get(name)
        and all(isinstance(v, ast.Constant) and v.value is True for v in bound[name])
    }
    return options - stored, names


def _evidence(ctx: Context) -> Tuple[Optional[Tuple[int, str]], Optional[Tuple[int, str]]]:
    """(the first CPU path, the first sign of several processes) of the checked file, each
    (line, why) or None."""
    cached = ctx.cache.get("ST004-evidence")
    if cached is not None:
        return cached
    cpu: Optional[Tuple[int, str]] = None
    ranks: Optional[Tuple[int, str]] = None
    parents = parent_map(ctx)
    called = {id(n.func) for n in ctx.walk(ctx.tree) if isinstance(n, ast.Call)}
    pinned_options, pinned_names = _pinned_switches(ctx)
    needs_cuda = False
    for node in ctx.walk(ctx.tree):
        line = getattr(node, "lineno", 0)
        why = None
        rank = False
        if isinstance(node, ast.Attribute):
            if node.attr == "is_available" and "cuda" in ctx.segment(node):
                if _requires_cuda(node, parents):
                    needs_cuda = True
                else:
                    why = f"{ctx.segment(node)} checks for CUDA"
            elif node.attr in _RANKS:
                rank = node.attr == "local_rank" or _one_device_per_process(ctx)
            elif node.attr in _SPAWNS and id(node) in called:
                base = ctx.segment(node.value).lower()
                rank = "mp" in base or "multiprocessing" in base or "idist" in base
            elif id(node) not in called and _is_switch(node) and node.attr not in pinned_options:
                why = f"a device switch, {ctx.segment(node)}"
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if node.value in ("cpu", "mps") or node.value.startswith("cpu:"):
                if _cpu_device_literal(node, parents):
                    why = f'the "{node.value}" device'
            elif node.value == "LOCAL_RANK":
                rank = True
        elif isinstance(node, ast.Call):
            flag = _device_option(node)
            if flag is not None and _switch_name(flag) not in pinned_options:
                why = f"a {flag} option"
        elif isinstance(node, ast.Name) and node.id == "local_rank":
            rank = True
        elif isinstance(node, ast.Name) and _is_switch(node) and node.id not in pinned_names:
            why = f"a device switch, {node.id}"
        if why is not None and (cpu is None or line < cpu[0]):
            cpu = (line, why)
        if rank and (ranks is None or line < ranks[0]):
            ranks = (line, _RANKS_WHY)
    if needs_cuda:
        cpu = None  # the script stops without CUDA
    elif cpu is None:
        cpu = _cpu_only_script(ctx)
    found = ctx.cache["ST004-evidence"] = (cpu, ranks)
    return found


# Words of a name, attribute, keyword or string that may put work on a GPU (``.to(device)``,
# ``Trainer(accelerator="gpu")``, ``set_default_tensor_type("torch.cuda.FloatTensor")``).
_GPU_WORDS = re.compile(
    r"(?<![a-z])(?:cuda|gpus?|devices?|accelerators?|mps|xpu|tpu|lightning|trainer|tensor_type)"
    r"(?![a-z])"
)
# Modules a CPU-only script may import besides the project's own: none puts work on a GPU by
# itself (an import of anything else, or one the checker cannot resolve, is no evidence).
_NEUTRAL_MODULES = frozenset(
    {"__future__", "torch", "torchvision", "numpy", "PIL", "cv2", "onnx", "onnxruntime"}
    | {"argparse", "os", "sys", "json", "math", "time", "random", "re", "collections"}
    | {"itertools", "functools", "pathlib", "glob", "shutil", "logging", "pickle", "copy"}
    | {"typing", "dataclasses", "warnings", "io", "csv", "datetime", "tqdm", "yaml", "scipy"}
    | {"matplotlib", "struct", "string", "textwrap", "operator", "abc", "enum", "contextlib"}
    | {"tempfile", "hashlib", "zipfile", "pandas", "h5py", "imageio", "skimage"}
)

Imports = Tuple[Tuple[int, str, Tuple[str, ...]], ...]


def gpu_facts(tree: ast.Module, path: str) -> Tuple[bool, Imports]:
    """(whether a file's own words may put work on a GPU, its imports as (level, module,
    names)): a gather function for ``project_facts``. A ``sys.path`` change counts as the
    former (its imports cannot be followed), and so does ``.to(0)``."""
    gpu = False
    imports: List[Tuple[int, str, Tuple[str, ...]]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imports.extend((0, a.name, ()) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            imports.append((node.level, node.module or "", tuple(a.name for a in node.names)))
        elif not gpu:
            word = ""
            if isinstance(node, ast.Name):
                word = node.id
            elif isinstance(node, ast.Attribute):
                word = node.attr
                gpu = word == "path" and isinstance(node.value, ast.Name) and node.value.id == "sys"
            elif isinstance(node, ast.keyword):
                word = node.arg or ""
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                word = node.value
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                gpu = node.func.attr == "to" and any(
                    isinstance(a, ast.Constant) and type(a.value) is int for a in node.args
                )
            gpu = gpu or bool(_GPU_WORDS.search(word.lower()))
    return gpu, tuple(imports)


def _project_imports(here: str, imports: Imports, files: Set[str]) -> Optional[List[str]]:
    """The project files ``imports`` (of the file ``here``) reach, looked up from the project
    root and from the file's directory; None where one is neither the project's nor a module
    known to put nothing on a GPU."""
    folder = posixpath.dirname(here)
    found: List[str] = []
    for level, module, names in imports:
        dotted = [module] + [f"{module}.{n}".strip(".") for n in names]
        hits = [f for d in dotted for f in module_files(folder, d, level) if f in files]
        if hits:
            found.extend(hits)
        elif level or module.split(".")[0] not in _NEUTRAL_MODULES:
            return None
    return found


def _cpu_only_script(ctx: Context) -> Optional[Tuple[int, str]]:
    """(line, why) for a script (``if __name__ == "__main__":``) that puts nothing on a GPU:
    neither it nor a project module it imports (transitively) has a word that may (``cuda``,
    ``gpu``, ``device``, ``accelerator``, ``Trainer``, ``.to(0)``), and every module it
    imports is the project's or one known to put nothing on a GPU. None otherwise (a library
    module, a script that may use a GPU, imports the checker cannot follow)."""
    guard = next(
        (s for s in ctx.tree.body if isinstance(s, ast.If) and is_main_guard(s.test)), None
    )
    if guard is None or not ctx.project.complete:
        return None
    facts = ctx.project_facts("ST004-gpu-facts", gpu_facts)
    files = set(facts)
    todo, seen = [ctx.project.relpath(ctx.path)], set()
    while todo:
        here = todo.pop()
        if here in seen:
            continue
        seen.add(here)
        gpu, imports = facts.get(here, (True, ()))
        reached = _project_imports(here, imports, files)
        if gpu or reached is None or len(seen) > 50:
            return None
        todo.extend(reached)
    return guard.lineno, "a script that never puts anything on a GPU"


def runs_off_cuda(ctx: Context, call: Optional[ast.Call] = None) -> Optional[Tuple[int, str]]:
    """(line, why) where the checked file shows that the load ``call`` also runs without
    CUDA or in several processes; None for a file that shows neither (a CUDA-only script, a
    library).

    A CPU path is a CUDA test the script goes on from (``torch.cuda.is_available()``, not
    asserted nor tested only to stop), a ``"cpu"`` device it may choose (``device = "cpu"``,
    a branch of a test; not ``cpu_device``, where results are copied), or a switch between CUDA and
    the CPU (``--cuda``, ``--no-cuda``, ``--cpu``, ``args.cuda``; not ``--gpus`` or
    ``--ngpu``); it is no path where a statement of the file moves to CUDA whatever is
    tested (``model.cuda()``, ``DEVICE = "cuda"``). Several processes: the
    script starts or joins them (``init_process_group``, DDP, ``local_rank``,
    ``mp.spawn``), and the load is not kept to one of them (``if rank == 0:``). A file this
    run wrote and returned (:func:`written_by_this_run`), or that the same function saved
    just before (:func:`saved_before`), voids the CPU path, not the ranks: every rank still
    loads it onto the device it was saved from."""
    cpu, ranks = _evidence(ctx)
    if call is not None:
        if cpu is not None and cuda_only_around(ctx, call) is not None:
            cpu = None
        if cpu is not None and (written_by_this_run(ctx, call) or saved_before(ctx, call)):
            cpu = None  # this run's file, from its own devices: no CPU-only reload of it
        if ranks is not None and (main_process_only(ctx, call) or per_rank_file(ctx, call)):
            ranks = None
    found = [e for e in (cpu, ranks) if e is not None]
    return min(found) if found else None


def _type_test(test: ast.expr) -> bool:
    """``isinstance(m, nn.BatchNorm2d)``: a test of a layer's type (a class of ``nn``, not a
    parallel wrapper), which decides nothing about the machine the statement under it runs
    on (``isinstance(gpu, int)`` may be the CPU switch itself)."""
    if not (
        isinstance(test, ast.Call)
        and isinstance(test.func, ast.Name)
        and test.func.id == "isinstance"
        and len(test.args) == 2
    ):
        return False
    kinds = test.args[1].elts if isinstance(test.args[1], ast.Tuple) else [test.args[1]]
    texts = [ast.unparse(k) for k in kinds]
    layer = [t.startswith(("nn.", "torch.nn.")) and "Parallel" not in t for t in texts]
    return bool(layer) and all(layer)


def _cuda_default(call: ast.AST) -> bool:
    """``torch.set_default_tensor_type("torch.cuda.FloatTensor")`` (or the type itself),
    ``torch.set_default_device("cuda")``: every new tensor is made on CUDA."""
    if not isinstance(call, ast.Call) or not call.args:
        return False
    name = call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", "")
    if name not in ("set_default_tensor_type", "set_default_device"):
        return False
    first = call.args[0]
    if isinstance(first, ast.Constant):
        return isinstance(first.value, str) and first.value.startswith(("cuda", "torch.cuda."))
    # torch.cuda.FloatTensor itself, not an expression that may pick either device
    return isinstance(first, ast.Attribute) and ast.unparse(first).startswith("torch.cuda.")


def _move_statements(body: List[ast.stmt]) -> List[ast.AST]:
    """The statements of ``body`` run whatever the machine (not inside an ``if``, a loop's
    ``else``, a ``try`` handler, a nested function or class), an ``if`` on a value's type
    aside (``for m in model.modules(): if isinstance(m, nn.BatchNorm2d): mask.cuda()``),
    and a CUDA default tensor type set at the top of the ``__main__`` guard."""
    out: List[ast.AST] = []
    for stmt in body:
        if isinstance(stmt, ast.If):
            if _type_test(stmt.test):
                out.extend(_move_statements(stmt.body))
            elif is_main_guard(stmt.test):
                # The script's entry: a CUDA default tensor type set there, at its top level,
                # makes every run a CUDA run (a move there may be undone below it).
                out.extend(
                    s for s in stmt.body if isinstance(s, ast.Expr) and _cuda_default(s.value)
                )
            continue
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        if isinstance(stmt, (ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith)):
            out.extend(_move_statements(stmt.body))
        elif isinstance(stmt, ast.Try):
            out.extend(_move_statements(stmt.body))
        else:
            out.append(stmt)
    return out


def _unconditional_cuda(stmt: ast.AST) -> bool:
    """``x = x.cuda()`` / ``model.cuda()`` / ``device = torch.device("cuda")`` /
    ``DEVICE = "cuda"`` / ``torch.set_default_tensor_type("torch.cuda.FloatTensor")``: a
    move to CUDA (or a CUDA-only device or default) no test guards."""
    if isinstance(stmt, ast.Expr):
        value: Optional[ast.AST] = stmt.value
    elif isinstance(stmt, (ast.Assign, ast.AnnAssign)):
        value = stmt.value
    else:
        return False
    if value is None:
        return False
    for node in ast.walk(value):
        if isinstance(node, (ast.IfExp, ast.BoolOp, ast.Lambda)):
            return False  # chosen by a test: ``x.cuda() if cuda else x``
    if isinstance(stmt, ast.Expr):
        call = stmt.value
        return _cuda_default(call) or (
            isinstance(call, ast.Call)
            and isinstance(call.func, ast.Attribute)
            and call.func.attr == "cuda"
        )
    for node in ast.walk(value):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr == "cuda" and not node.args:
                return True
            if node.func.attr == "device" and node.args:
                first = node.args[0]
                if isinstance(first, ast.Constant) and str(first.value).startswith("cuda"):
                    return True
    return (
        isinstance(value, ast.Constant)
        and isinstance(value.value, str)
        and value.value.startswith("cuda")
        and isinstance(stmt, ast.Assign)
        and any("dev" in ast.unparse(t).lower() for t in stmt.targets)
    )


def cuda_only_around(ctx: Context, call: ast.Call) -> Optional[int]:
    """The line of a move to CUDA that runs whatever is tested, at module level or in a
    function of the file of the load ``call`` (``model = Net().cuda()``, ``net.cuda()``,
    ``DEVICE = "cuda"``): that script cannot run without CUDA, so a CPU fallback test
    elsewhere in it is not its path."""
    bodies = [ctx.tree.body] + [
        n.body for n in ctx.walk(ctx.tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
    ]
    for body in bodies:
        for stmt in _move_statements(body):
            if _unconditional_cuda(stmt):
                return getattr(stmt, "lineno", 0)
    return None


def main_process_only(ctx: Context, call: ast.Call) -> bool:
    """The load runs in one process of a multi-process job: it is under an ``if`` testing the
    rank (``if rank == 0:``, ``if args.local_rank in [-1, 0]:``, ``if is_main_process():``)."""
    parents = parent_map(ctx)
    up = parents.get(id(call))
    while up is not None:
        if isinstance(up, ast.If):
            test = ctx.segment(up.test).lower()
            if any(w in test for w in _MAIN_PROCESS) and not isinstance(up.test, ast.UnaryOp):
                return True
        up = parents.get(id(up))
    return False


def _path_values(ctx: Context, call: ast.Call) -> List[ast.AST]:
    """The loaded path expression, or the values its name is assigned in the load's scope."""
    path = (
        call.args[0] if call.args else next((k.value for k in call.keywords if k.arg == "f"), None)
    )
    if path is None:
        return []
    file = flow.file_of(ctx)
    values: List[ast.AST] = [path]
    if isinstance(path, ast.Name):
        values = list(file.assigned(file.scope_of(call)).get(path.id, [])) or values
    return values


def _save_target(stmt: ast.stmt) -> Optional[str]:
    """``path`` for a statement ``torch.save(obj, path)`` (or ``f=path``), else None."""
    call = stmt.value if isinstance(stmt, ast.Expr) else None
    if not (isinstance(call, ast.Call) and call_name(call.func) == "save"):
        return None
    target = call_arg(call, 1, "f")
    return target.id if isinstance(target, ast.Name) else None


def _saved_and_returned(fn: ast.AST) -> bool:
    """``fn`` returns a name that holds only ``None`` or a path it has just saved to: the
    function ends with ``return path``, it returns nowhere else, and each binding of ``path``
    to anything but ``None`` is followed at once by ``torch.save(obj, path)`` (``path =
    f"...{acc}"`` then the save, under a "best so far" test). Not a path returned before its
    save, or saved only when the file is missing (``if not os.path.exists(path):``): that
    file may be an earlier run's."""
    body = getattr(fn, "body", [])
    last = body[-1] if body else None
    if not (isinstance(last, ast.Return) and isinstance(last.value, ast.Name)):
        return False
    name = last.value.id
    for node in ast.walk(fn):
        if isinstance(node, ast.Return) and node is not last:
            return False
        for field in ("body", "orelse", "finalbody"):
            block = getattr(node, field, None)
            if not isinstance(block, list):
                continue
            for i, stmt in enumerate(block):
                if not isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                    continue
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                if not any(isinstance(t, ast.Name) and t.id == name for t in targets):
                    continue
                if isinstance(stmt.value, ast.Constant) and stmt.value.value is None:
                    continue
                following = block[i + 1] if i + 1 < len(block) else None
                if following is None or _save_target(following) != name:
                    return False
    return True


def written_by_this_run(ctx: Context, call: ast.Call) -> bool:
    """The loaded path is what a function of the file returned after saving to it
    (``best = self._train(...)`` ... ``torch.load(best)``, ``_train`` ending ``torch.save(
    state, path); return path``): the file was written by this process, from its own
    devices, so it loads back onto devices this process has."""
    defs: Optional[Dict[str, List[ast.AST]]] = ctx.cache.get("ST004-defs-by-name")
    if defs is None:  # the file's functions by name, once per file
        defs = {}
        for node in ctx.walk(ctx.tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                defs.setdefault(node.name, []).append(node)
        ctx.cache["ST004-defs-by-name"] = defs
    for value in _path_values(ctx, call):
        if not isinstance(value, ast.Call):
            continue
        func = value.func
        name = func.id if isinstance(func, ast.Name) else self_attr(func)
        found = defs.get(name or "", [])
        if found and all(_saved_and_returned(fn) for fn in found):
            return True
    return False


def saved_before(ctx: Context, call: ast.Call) -> bool:
    """The function around the load saved this very path (the same text) before it: a
    script that trains, saves its best model, then tests it (``torch.save(model, f)`` in
    the epoch loop, ``model = torch.load(f)`` after it). This run wrote the file, from its
    own devices; a load before the save (a resume) reads a file of an earlier run."""
    shape = flow.load_shape(ctx, call)
    if shape is None:
        return False
    same = _same_function_saves(ctx, call, shape)
    return bool(same) and all(s.line < call.lineno for s in same)


def _same_function_saves(ctx: Context, call: ast.Call, shape: flow.Shape) -> List[flow.Save]:
    """The saves of the very path ``call`` loads (the same text) in the function around it."""
    here = ctx.project.relpath(ctx.path)
    function = getattr(flow.file_of(ctx).scope_of(call), "name", "")
    return [
        s
        for s in flow.candidates(ctx, call)
        if s.path == here and s.shape.text == shape.text and s.function == function
    ]


def per_rank_file(ctx: Context, call: ast.Call) -> bool:
    """The loaded path names the rank (``"queue" + str(args.rank) + ".pth"``,
    ``f"shard{dist.get_rank()}.pt"``; not ``args.ranking_file``): each process
    loads the file it saved itself, from its own device, so the ranks do not meet on one
    device."""
    for value in _path_values(ctx, call):
        for node in ast.walk(value):
            name = (
                node.id
                if isinstance(node, ast.Name)
                else node.attr
                if isinstance(node, ast.Attribute)
                else ""
            )
            if "rank" in name.lower().split("_"):  # rank, local_rank, get_rank; not ranking
                return True
    return False


def loads_from_memory(ctx: Context, call: ast.Call) -> bool:
    """The load reads an in-memory buffer (``io.BytesIO``) the process filled itself, not a
    file: the devices it was saved from are this process's."""
    values = _path_values(ctx, call)
    return any(
        isinstance(v, ast.Call)
        and (ctx.segment(v.func).endswith("BytesIO") or ctx.qualname(v.func) == "io.BytesIO")
        for v in values
    )
