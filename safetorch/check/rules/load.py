"""``torch.load`` without ``weights_only`` or ``map_location`` (ST003, ST004): the ``load``
patch's pitfalls.
"""

from __future__ import annotations

import ast
import posixpath
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from safetorch.check.engine import UNSAFE, Context, Edit, Fix, Positioned
from safetorch.check.fixer import import_edit
from safetorch.check.rules import _load_fix, _map_location
from safetorch.check.rules import _load_flow as flow
from safetorch.check.rules._base import Rule
from safetorch.check.rules._helpers import (
    Pos,
    add_keywords,
    call_arg,
    end_of,
    find_keyword,
    has_double_star,
    has_star,
    is_const,
    min_torch,
    not_a_module,
    self_attr,
    start_of,
)
from safetorch.check.rules._payloads import (
    _REFUSED,
    _ST_LOAD_KEYWORDS,
    _loads_something,
    payloads,
)

_CUDA_TESTS = ("cuda", "gpu", "device_count")


def _device_words(ctx: Context) -> Tuple[bool, bool, bool]:
    """(the file uses CUDA, it can run without CUDA, it runs several processes)."""
    cached = ctx.cache.get("device_words")
    if cached is None:
        uses_cuda = cpu_path = distributed = False
        for node in ctx.walk(ctx.tree):
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
        for node in ctx.walk(ctx.tree):
            if isinstance(node, ast.If) and node.body:
                words = [
                    getattr(n, "attr", None) or getattr(n, "id", None) or ""
                    for n in ctx.walk(node.test)
                ]
                negated = isinstance(node.test, ast.UnaryOp)
                if not negated and any(
                    w in str(word).lower() for word in words for w in _CUDA_TESTS
                ):
                    cached.append((start_of(node.body[0]), end_of(node.body[-1])))
        ctx.cache["cuda_guards"] = cached
    return cached


def _device_note(ctx: Context, call: ast.Call, words: bool = True) -> Optional[str]:
    """Why a ``torch.load`` without ``map_location`` can put tensors on a missing or wrong
    device here, or None where it evidently cannot: the file saved them from the CPU, the
    load runs only with CUDA (a branch whose sibling maps, or under a CUDA test), or (with
    ``words``, a quick look at the file's words) the script needs CUDA anyway and runs one
    process; ST004 judges that last part by ``_map_location.runs_off_cuda`` instead."""
    if find_keyword(call, "map_location") is not None or has_star(call) or len(call.args) > 1:
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
    if _in_tests(ctx):
        return None  # a test loads what it wrote itself, on the devices it has
    if _saved_on_cpu(ctx, call) or _pretrained_file(ctx, call):
        return None
    if "offload_to_cpu" in ctx.source or "cpu_offload" in ctx.source:
        return None  # FSDP state dicts gathered to the CPU before saving
    where = start_of(call)
    if any(lo <= where <= hi for lo, hi in _cuda_guards(ctx)):
        return None
    if words and uses_cuda and not cpu_path and not distributed:
        return None  # a CUDA-only single-process script: the saved device is there
    if distributed:
        return "in a multi-process job every rank loads onto the device it was saved from (cuda:0)"
    return "a checkpoint saved on a GPU fails to load on a machine without one"


def _in_tests(ctx: Context) -> bool:
    """The checked file is a test module (see ``_load_flow.is_test_file``)."""
    found = ctx.cache.get("ST004-test-file")
    if found is None:
        rel = ctx.project.relpath(ctx.path)
        found = ctx.cache["ST004-test-file"] = flow.is_test_file(rel, ctx.tree)
    return bool(found)


def _saved_on_cpu(ctx: Context, call: ast.Call) -> bool:
    """The project writes the loaded file only from CPU tensors: every save of this file
    whose path can be the loaded one writes ``.cpu()`` tensors, a module moved to the CPU,
    numpy data or numbers (at least one such save), where the load names its file by a
    literal (end) or on the command line (``args.model``); else every save of another file
    whose path has the same known literal end (``"_best.pth"``, ``"cache.pt"``)."""
    shape = flow.load_shape(ctx, call)
    if shape is None:
        return False
    here = ctx.project.relpath(ctx.path)
    found = flow.candidates(ctx, call)
    named = shape.exact is not None or bool(shape.suffix.strip("./"))
    mine = [s for s in found if s.path == here]
    if mine and (named or _command_line_path(call_arg(call, 0, "f"))):
        # A script whose every checkpoint is written from the CPU, loading one named on its
        # command line (or by the same literal end), loads its own kind.
        return all(s.cpu for s in mine)
    if not named:
        return False  # a path of unknown shape: it may be any file
    same = [s for s in found if s.shape.exact is not None or s.shape.suffix.strip("./")]
    return bool(same) and all(s.cpu for s in same)


def _command_line_path(path: Optional[ast.expr]) -> bool:
    """``args.model``, ``opt.checkpoint``: a path chosen on the command line."""
    return (
        isinstance(path, ast.Attribute)
        and isinstance(path.value, ast.Name)
        and path.value.id in ("args", "opt", "opts", "options", "flags", "FLAGS")
    )


# Words naming a published pretrained weights file (an ImageNet backbone, converted caffe
# weights): those are saved from CPU tensors (torchvision's and the model zoos' files are).
_PRETRAINED_WORDS = ("pretrain", "imagenet", "caffe", "basenet", "backbone")


def _pretrained_file(ctx: Context, call: ast.Call) -> bool:
    """The load reads a published pretrained file, by its name: the path expression, the
    literal a ``self.x``/local name is set to, or the ``default=``/``help=`` of the argparse
    option ``args.x`` names a pretrained or ImageNet backbone file."""
    path = call_arg(call, 0, "f")
    if path is None:
        return False
    words = [ctx.segment(path)]
    for node in ctx.walk(path):
        if isinstance(node, ast.Attribute):
            words.extend(_option_words(ctx, node.attr))
            words.extend(_attribute_literals(ctx, node.attr))
    return any(w in word.lower() for word in words for w in _PRETRAINED_WORDS)


def _option_words(ctx: Context, name: str) -> List[str]:
    """The ``default=`` and ``help=`` strings of the argparse option ``--name``."""
    options = ctx.cache.get("ST004-options")
    if options is None:
        options = ctx.cache["ST004-options"] = {}
        for node in ctx.walk(ctx.tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_argument"
            ):
                texts = [
                    k.value.value
                    for k in node.keywords
                    if k.arg in ("default", "help")
                    and isinstance(k.value, ast.Constant)
                    and isinstance(k.value.value, str)
                ]
                for flag in node.args:
                    if isinstance(flag, ast.Constant) and isinstance(flag.value, str):
                        key = flag.value.lstrip("-").replace("-", "_")
                        options.setdefault(key, []).extend(texts)
    return list(options.get(name, []))


def _attribute_literals(ctx: Context, name: str) -> List[str]:
    """The string literals ``self.name`` (or ``x.name``) is set to in this file."""
    found = ctx.cache.get("ST004-attribute-literals")
    if found is None:
        found = ctx.cache["ST004-attribute-literals"] = {}
        for node in ctx.walk(ctx.tree):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
                if isinstance(node.value.value, str):
                    for target in node.targets:
                        if isinstance(target, ast.Attribute):
                            found.setdefault(target.attr, []).append(node.value.value)
    return list(found.get(name, []))


def _spans(ctx: Context, key: str, nodes: Iterable[Positioned]) -> List[Tuple[Pos, Pos]]:
    """(start, end) of each node, cached under ``key``."""
    cached = ctx.cache.get(key)
    if cached is None:
        cached = ctx.cache[key] = [(start_of(n), end_of(n)) for n in nodes]
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
            for n in ctx.walk(ctx.tree)
            if isinstance(n, ast.With)
            and any(
                isinstance(i.context_expr, ast.Call)
                and qual(i.context_expr.func) == "torch.serialization.safe_globals"
                for i in n.items
            )
        ),
    )
    if _inside(start_of(call), withs):
        return True
    return any(
        isinstance(n, ast.Call) and qual(n.func) == "torch.serialization.add_safe_globals"
        for n in ctx.walk(ctx.tree)
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
            for t in ctx.walk(ctx.tree)
            if isinstance(t, ast.Try)
            and any(
                isinstance(n, ast.Call)
                and ctx.qualname(n.func) == "torch.load"
                and find_keyword(n, "weights_only") is not None
                for stmt in t.body
                for n in ctx.walk(stmt)
            )
            for h in t.handlers
            if _catches_type_error(h)
        ),
    )
    return _inside(start_of(call), handlers)


def _weights_only_blocker(ctx: Context, call: ast.Call) -> Optional[Tuple[str, bool]]:
    """Why ``weights_only=True`` may change what ``call`` loads, and whether a save shows it
    (True) or the contents are only unknown (False); None where the project's flow shows the
    file holds only what a weights-only load accepts: every save of the project whose path
    can be the loaded one writes tensors, state dicts, numbers or containers of those (and
    at least one does), or the result goes straight into a strict ``module.load_state_dict``
    (which raises on anything but tensors, so a load that works holds only those)."""
    ctx.project.paths()  # reads the file list, which decides ``complete``
    if not ctx.project.complete:
        return "the project is too big to read whole", False
    if flow.defines_extra_state(ctx):
        return "the project defines get_extra_state (a state dict may then hold any object)", False
    if _strict_state_dict_use(ctx, call):
        return None  # a strict module load accepts only tensors, whichever save wrote it
    external = _pretrained_file(ctx, call) or _downloaded(ctx, call)
    found = [] if external else flow.candidates(ctx, call)
    shape = flow.load_shape(ctx, call)
    named = shape is not None and (shape.exact is not None or bool(shape.suffix.strip("./")))
    for save in sorted(found, key=lambda s: not s.held or not s.held.startswith(flow.EVIDENT)):
        if save.held is not None:
            # Evidence only where the load names its file; else any save may be the one.
            evident = named and save.held.startswith(flow.EVIDENT)
            return f"{save.path}:{save.line} may write it with {save.held}", evident
    if found and shape is not None and shape.exact is not None:
        base = posixpath.basename(shape.exact)
        if base and not any(_names_file(s.shape, base) for s in found):
            # The saves that may write it match by a wildcard only (``f"{epoch}.pth"``): the
            # file the load names may come from elsewhere (a download, a renamed copy).
            return f"no save of the project names {base}, so what it holds is unknown", False
    if found:
        return None
    if external:
        return "a downloaded or pretrained file, whose contents are unknown", False
    return "the project never writes this file, so what it holds is unknown", False


def _names_file(shape: flow.Shape, base: str) -> bool:
    """The save's path (``shape``) may be the file named ``base``: its literal, or its literal
    end, ends with that whole file name (``save_dir + "best.pth"`` names ``best.pth``), or
    nothing of it is known (a helper's ``path`` parameter, written wherever its callers say).
    Not a path made from a pattern whose literal end is another name or only an extension
    (``f"{epoch:02d}_{step:06d}.pth"``): a file of a fixed name comes from elsewhere."""
    if shape.exact is None and not shape.suffix:
        return True
    literal = shape.exact if shape.exact is not None else shape.suffix
    return posixpath.basename(literal) == base


# Calls that fetch a file from elsewhere: a load in the same function reads a download.
_DOWNLOADS = ("urlretrieve", "urlopen", "download", "hf_hub_download", "gdown", "wget")


def _downloaded(ctx: Context, call: ast.Call) -> bool:
    """The function around the load downloads (``urlretrieve``, ``download_url``, ...)."""
    scope = payloads(ctx)._scope(call)
    for node in ctx.walk(scope):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
            if self_attr(func) is not None:
                continue  # self.download(): the project's own method (it writes a cache)
            if any(word in name.lower() for word in _DOWNLOADS):
                return True
    return False


def _strict_state_dict_use(ctx: Context, call: ast.Call) -> bool:
    """The loaded object goes only into strict ``module.load_state_dict(...)`` calls: directly
    (``model.load_state_dict(torch.load(p))``) or through a name used for nothing else. A
    strict module load raises on any value that is not a tensor, so the file that loaded
    holds only what a weights-only load accepts."""
    return _strict_loaders(ctx, call) is not None


def _strict_loaders(ctx: Context, call: ast.Call) -> Optional[List[ast.Call]]:
    """The strict ``module.load_state_dict(...)`` calls the loaded object goes into (see
    :func:`_strict_state_dict_use`), or None where it goes anywhere else too."""
    uses = _state_dict_uses(ctx)
    if id(call) in uses:
        return [uses[id(call)]]
    found = payloads(ctx)
    name = found.bindings.get(id(call))
    if name is None or "." in name:
        return None
    scope = found.scope_of.get(id(call), ctx.tree)
    reads = [
        n
        for n in ctx.walk(scope)
        if isinstance(n, ast.Name)
        and n.id == name
        and isinstance(n.ctx, ast.Load)
        and start_of(n) > start_of(call)
    ]
    stores = [
        n for n in ctx.walk(scope) if isinstance(n, ast.Name) and n.id == name and n not in reads
    ]
    if reads and len(stores) == 1 and all(id(n) in uses for n in reads):
        return [uses[id(n)] for n in reads]
    return None


def _state_dict_uses(ctx: Context) -> Dict[int, ast.Call]:
    """id of each expression passed as the state dict of a strict module ``load_state_dict``
    -> that call."""
    cached = ctx.cache.get("ST003-state-dict-uses")
    if cached is None:
        cached = ctx.cache["ST003-state-dict-uses"] = {}
        for node in ctx.walk(ctx.tree):
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "load_state_dict"
            ):
                continue
            if not_a_module(ctx.segment(node.func.value)):
                continue
            strict = find_keyword(node, "strict")
            if strict is not None and not is_const(strict.value, True):
                continue
            if len(node.args) > 1 and not is_const(node.args[1], True):
                continue
            arg = call_arg(node, 0, "state_dict")
            if arg is not None:
                cached[id(arg)] = node
    return cached


def _st_load_takes(call: ast.Call) -> bool:
    """``st.load`` takes the arguments of this ``torch.load`` call (not ``pickle_module=``,
    a ``pickle_load_args`` keyword it lacks, or ``*args``)."""
    return not (
        has_star(call)
        or len(call.args) > 2
        or any(k.arg not in _ST_LOAD_KEYWORDS for k in call.keywords)
    )


_ST_LOAD = "load with st.load (weights-only on every torch)"
_SAVED_LOAD = (
    "save with st.save and load with st.load (safetorch records the whole-model/numpy files it "
    "writes and loads them fully; a file written before needs `safetorch trust FILE` once)"
)


class LoadWithoutWeightsOnly(Rule):
    """ST003: ``torch.load`` without ``weights_only``.

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
    those, so it is not offered there; the finding points to saving a state_dict (or tensors)
    instead, or to saving with ``st.save`` and loading with ``st.load`` (safetorch records
    the files it writes and loads them fully), or, for a file written before, to
    ``safetorch trust FILE`` once and then ``st.load``; ``weights_only=False`` only for a
    file you trust. A load under ``torch.serialization.safe_globals([...])`` (or in a file
    that calls ``add_safe_globals``) has its allow-list: it is advised as a plain load. Quiet
    for the fallback ``except TypeError:`` of a ``try`` whose load passes ``weights_only`` (a
    torch without that argument, before 1.13).

    Fix (unsafe, ``--unsafe-fixes``): add ``weights_only=True``, only where the project's
    save/load flow shows the file holds nothing a weights-only load refuses (every file of
    the project is read: ``ctx.project_facts``): every ``torch.save`` of the project whose
    path can be the loaded one (the same literal, or literal ends that agree; a path the
    checker cannot read can be any) writes tensors, ``state_dict()`` results, numbers,
    strings or containers of those (a saved value that is a parameter is followed to the
    calls that pass it), and at least one does; or the loaded object goes straight into a
    strict ``module.load_state_dict`` (which raises on anything but tensors, so a load that
    works holds only those: also for a downloaded or pretrained file). Not offered where a
    save writes a whole module, an instance of a class, an argparse Namespace
    (``vars(args)`` too: argparse values can be ``Path`` objects or anything a ``type=``
    returns), an optimizer object, numpy data or a value the checker cannot tell (see
    below for the Namespace and numpy migrations); for a
    file the project never writes (a download, a user-supplied pretrained file: its
    contents are unknown), nor for a file of a fixed name that no save of the project names
    (the saves that may write it write a pattern, ``f"{epoch:03d}.pth"``: the file comes
    from elsewhere; a helper's save to the path it is given names any file); where the
    project defines ``get_extra_state`` (a state dict may
    then hold any object); where the project is too big to read whole. The message then says
    why (which save, what it may write).

    Where torch's own weights-only unpickler may still refuse such a file, the fix is
    ``st.load(<the same arguments>)`` instead (weights-only too, and it reads the file on
    every torch; ``import safetorch as st`` added, or ``import safetorch`` where the file
    binds ``st`` or has a star import; ``map_location="available"`` where the load passed
    none): unless the load goes straight into a strict module ``load_state_dict`` (and
    nothing in the project lets a strict load take more than tensors: no class with its own
    ``load_state_dict``, ``_load_from_state_dict`` or ``set_extra_state``, no state-dict hook
    registered, no import of torch2trt or torch_tensorrt, whose ``TRTModule`` keeps its
    engine as a ``bytearray``; where a class of the project has its own ``load_state_dict``,
    what it takes may be any object, a whole module kept in a trainer's dict that ``st.load``
    refuses too, so there is no fix), the file may hold plain data
    some torch before 2.6 refuses weights-only (a float on 1.13; a ``torch.device``, a
    ``set``, ``complex`` or ``bytes`` on 2.1); a save of that path passes a
    ``pickle_protocol`` other than 2 (by keyword, positionally, in a ``**{...}`` literal or
    through ``functools.partial``: protocol 3's bytes and 4's frames are refused by every
    torch; protocols 0 and 1 by every weights-only load, st.load's too, so those get no
    fix); or the project writes torch files with its own pickler (``PyTorchFileWriter``).

    Where the file evidently holds more than weights, ``weights_only=True`` refuses it on
    every torch, and the load is migrated the way PyTorch recommends where the project shows
    how (``rules/_load_fix.py``):

    - a whole module saved and loaded in this file, the loaded name built before the load
      (``model = Net()``) and no other load of the project reading that file unless it can
      take a state dict too: both sides become a state dict (one fix); where the saves are
      in other files, each save of a module built there (``torch.save(model, path)`` with
      ``model = Net()``) is reported at the save with its half of the fix, and each load
      gets its half, only when every load of that path in the project can take it::

        torch.save(model, path)   ->  torch.save(model.state_dict(), path)
        model = torch.load(path)  ->  model.load_state_dict(torch.load(path, weights_only=True))

    - a file whose every writer in the project saves tensors plus an argparse Namespace
      (every ``add_argument`` of the project with a plain ``type=`` and a literal default)
      or numpy arrays and scalars: ``st.load(path, map_location="available", allow=[...])``
      naming exactly those classes (``st.load`` is weights-only with ``allow=`` on every
      torch; ``torch.serialization.safe_globals`` exists from torch 2.4 only).

    Otherwise, where a ``torch.save`` of this file that writes a whole module
    or numpy data is the evidence, the fix saves with ``st.save`` and loads with ``st.load``
    instead (one fix, ``import safetorch as st`` added where missing):

        torch.save(model, path)   ->  st.save(model, path)
        model = torch.load(path)  ->  model = st.load(path, map_location="available")

    ``st.save`` is ``torch.save`` and records the file it writes; ``st.load`` then loads it
    fully. Every save of the file that writes the same path becomes ``st.save``: the same
    expression (a local name within one function), ``open(path, "wb")`` or the handle of a
    ``with open(path, ...) as f:``. The load keeps its arguments, less ``weights_only``;
    ``map_location="available"`` keeps torch.load's placement (CPU where CUDA is missing)
    where it passed none. It is unsafe: a file the script did not write with ``st.save``
    (one from an earlier run, or another script's) needs ``safetorch trust FILE`` once.
    No fix where only the use of the loaded object is the evidence (``.eval()``: a file
    saved elsewhere, which another script's fix may not reach), where a save writes it to
    another path expression, or where the save or the load passes ``pickle_module`` (a file
    ``st.save`` does not record) or ``*args``/``**kwargs``. A load left unchanged says why
    (``no automatic fix: ...``).

    safetorch: ``st.load`` (weights_only by default, clear error naming the blocked type).
    """

    code = "ST003"

    name = "load-without-weights-only"
    torch_symbols = ("torch.load",)
    fixable = True
    fix_applicability = UNSAFE
    node_types = (ast.Call,)

    def visit(self, node: ast.Call) -> None:
        qual = self.ctx.qualname(node.func)
        if qual == "torch.save":
            self._module_save(node)
            return
        if qual != "torch.load" or has_double_star(node):
            return
        if not _loads_something(node) or _weights_only_fallback(self.ctx, node):
            return
        weights_only = find_keyword(node, "weights_only")
        floor, why = min_torch(self.ctx)
        new_torch = floor is not None and floor >= (2, 6)
        held = payloads(self.ctx).load_holds(node)
        if held is not None and _allow_listed(self.ctx, node):
            held = None  # its classes are allow-listed: a weights-only load accepts them
        if weights_only is not None:
            if held is not None and is_const(weights_only.value, True):
                self._report_held(node, held, self._refused(held, "weights_only=True"))
            return
        if new_torch:
            if held is not None:
                since = f"this code needs torch >= 2.6 ({why})"
                self._report_held(
                    node, held, self._refused(held, f"the default weights_only=True ({since})")
                )
            return
        # With the map_location rule in preview, this finding also carries the device advice:
        # one finding per call.
        device = _device_note(self.ctx, node) if LoadWithoutMapLocation.preview else None
        tail = (
            ""
            if device is None
            else f"; it also lacks map_location: {device} (st.load maps to CPU)"
        )
        if held is not None:
            self._report_held(
                node,
                held,
                "torch.load without weights_only can execute code from the file (the default "
                f"before torch 2.6){tail}; " + self._refused(held, "weights_only=True"),
            )
            return
        # weights_only=True refuses checkpoints that pickle other objects (whole modules,
        # argparse Namespaces, numpy scalars): offered only where the project's flow shows
        # the file holds nothing else.
        blocker = _weights_only_blocker(self.ctx, node)
        # What the flow shows loads weights-only may still hold what torch's own weights-only
        # unpickler refuses on the torch the code runs on: st.load reads it on every torch.
        older = (
            None
            if blocker is not None
            else _load_fix.older_unpickler(self.ctx, node, _strict_loaders(self.ctx, node))
        )
        edit = (
            None
            if blocker is not None or older is not None
            else add_keywords(self.ctx, node, "weights_only=True")
        )
        fix = None if edit is None else Fix("add weights_only=True", (edit,), UNSAFE)
        if older is not None and older[1]:
            fix = self._st_load(node, (), _ST_LOAD)
        external = _pretrained_file(self.ctx, node) or _downloaded(self.ctx, node)
        allow = (
            None
            if blocker is None or not blocker[1]
            else _load_fix.writers_allow(self.ctx, node, external)
        )
        if allow is not None:
            fix = _load_fix.allow_list_fix(self.ctx, node, allow)
        elif blocker is not None and blocker[1]:
            fix = _load_fix.cross_file_load_fix(self.ctx, node)[0]  # its saves get theirs
        head = (
            "torch.load without weights_only can execute code from the file (the default "
            "before torch 2.6)"
        )
        if blocker is None and older is not None and not older[1]:
            advice = f"weights_only=True {older[0]}"
        elif blocker is None and older is not None:
            advice = f"use st.load, weights-only on every torch; weights_only=True {older[0]}"
            if fix is None:
                advice += f" (no automatic fix: {self._no_st_load(node)})"
        elif blocker is None:
            advice = "pass weights_only=True or use st.load"
        elif fix is not None and allow is None:
            advice = (
                f"weights_only=True refuses the file: {blocker[0]}; load a state dict into the "
                "model built here (the save writes model.state_dict() in its own fix)"
            )
        elif allow is not None and fix is not None:
            advice = (
                f"weights_only=True refuses the file: {blocker[0]}; load it with st.load and "
                f"allow= exactly those data classes ({', '.join(allow)})"
            )
        elif blocker[1]:
            advice = (
                f"weights_only=True may refuse the file: {blocker[0]}; save state_dicts or "
                "tensors there, or save with st.save and load with st.load (safetorch records "
                "the files it writes and loads them fully)"
            )
        else:
            advice = (
                "pass weights_only=True if the file holds only tensors and state dicts, or use "
                f"st.load (no automatic fix: {blocker[0]})"
            )
        self.report(node, f"{head}: {advice}{tail}", fix)

    def _report_held(self, node: ast.Call, held: Tuple[str, int], message: str) -> None:
        """Report a load of a file that evidently holds ``held``, with the migration PyTorch
        recommends where it applies (:meth:`_migrated`), else st.save/st.load."""
        external = _pretrained_file(self.ctx, node) or _downloaded(self.ctx, node)
        saves = payloads(self.ctx).saves_of(node)
        fix, why = _load_fix.migrate(self.ctx, node, held[0], saves, external)
        if fix is None:
            fix = self._saved_load(node)
        if fix is None and why:
            message += f" (no automatic fix: {why})"
        self.report(node, message, fix)

    def _module_save(self, node: ast.Call) -> None:
        """The save side of a whole-module pair across files (``_load_fix.module_save_fix``):
        reported only where every load of the file it writes takes a state dict in its fix."""
        found = _load_fix.module_save_fix(self.ctx, node)
        if found is None:
            return
        fix, where = found
        self.report(
            node,
            "torch.save of a whole module: a weights-only load (torch's default since 2.6, "
            f"st.load's always) refuses the file, and the load at {where} builds the model "
            "itself: save model.state_dict() and load it with load_state_dict (its own fix)",
            fix,
        )

    def _saved_load(self, call: ast.Call) -> Optional[Fix]:
        """``st.save`` for the saves of this file that write the path ``call`` loads, and
        ``st.load(<the same arguments>)`` for the load: safetorch records the whole-model and
        numpy files it writes and loads those bytes fully. None unless one of those saves is
        the evidence (it writes a whole module or numpy data), or where a call passes
        ``pickle_module`` (st.save does not record that file) or ``*args``/``**kwargs``."""
        found = payloads(self.ctx).saves_of(call)
        if not any(held in _REFUSED for _, held in found):
            return None  # no save here writes it: the evidence is how the result is used
        saves = [save for save, _ in found]
        for save in saves:
            if has_star(save) or has_double_star(save) or len(save.args) > 2:
                return None
            if find_keyword(save, "pickle_module") is not None:
                return None
        return self._st_load(call, saves, _SAVED_LOAD)

    @staticmethod
    def _no_st_load(call: ast.Call) -> str:
        """Why :meth:`_st_load` gives no fix for ``call``."""
        if not _st_load_takes(call):
            return "the call passes what st.load does not take"
        return "the file binds both st and safetorch to something else"

    def _st_load(self, call: ast.Call, saves: Sequence[ast.Call], message: str) -> Optional[Fix]:
        """``st.load(<the arguments of call>)``, and ``st.save`` for ``saves``; None where the
        load passes what st.load does not take (``pickle_module``, ``*args``)."""
        if not _st_load_takes(call):
            return None
        # ``import safetorch`` where the file binds ``st`` to something else.
        names = import_edit(self.ctx, [("safetorch", "st")]) or import_edit(
            self.ctx, [("safetorch", None)]
        )
        if names is None:
            return None
        spelled, imports = names
        st = spelled["safetorch"]
        edits: List[Edit] = list(imports)
        for save in saves:
            if self.ctx.qualname(save.func) == "torch.save":
                edits.append(self.ctx.replace(save.func, f"{st}.save"))
        seg = self.ctx.segment
        parts = [seg(a) for a in call.args]
        parts += [seg(k) for k in call.keywords if k.arg != "weights_only"]
        if call_arg(call, 1, "map_location") is None:
            parts.append('map_location="available"')  # torch.load's placement, CPU without CUDA
        edits.append(self.ctx.replace(call, f"{st}.load({', '.join(parts)})"))
        return Fix(message, tuple(edits), UNSAFE)

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
            "or save it with st.save and load it with st.load (safetorch records the files it "
            "writes and loads them fully), or for a file from before: safetorch trust FILE "
            "once, then st.load; weights_only=False only for a file you trust"
        )


class LoadWithoutMapLocation(Rule):
    """ST004: ``torch.load`` without ``map_location``.

    Without ``map_location`` every tensor goes back to the device it was saved from: loading
    a GPU checkpoint fails on a CPU-only machine, and in multi-GPU jobs every rank piles its
    copy onto ``cuda:0``.

    It fires on evidence of both halves of the pitfall in the project's own code
    (``_map_location``). The file holds CUDA tensors: a save of the same program (the
    loading file's directory, or one inside the other) that may write the loaded path (by its
    shape) saves a module's tensors (a ``state_dict()``, a model the file moves with
    ``.cuda()`` / ``.to(device)``, a dict bound to one) in a file that puts things on CUDA;
    the save is in the loading script itself or names its file (a literal, a literal end such
    as ``"_best.pth"``). And the loading script also runs without CUDA: a device choice that
    includes the CPU (``torch.cuda.is_available()`` neither asserted nor tested only to stop
    without CUDA, a ``"cpu"`` device chosen by a test or bound to a device name, not
    ``cpu_device = torch.device("cpu")``, a ``--cuda`` / ``--no-cuda`` / ``--cpu`` option,
    ``args.cuda`` read; not ``--gpus`` / ``--ngpu``, nor ``map_location="cpu"`` or
    ``.to("cpu")`` elsewhere, nor a switch that cannot be off: ``--cuda`` with
    ``action="store_true"`` and ``default=True``, ``use_cuda`` bound only to ``True``),
    with no statement of the file that moves to CUDA whatever
    is tested (``model.cuda()``, ``DEVICE = "cuda"``,
    ``torch.set_default_tensor_type("torch.cuda.FloatTensor")``, also under a test of a
    value's type, ``if isinstance(m, nn.BatchNorm2d): mask = mask.cuda()``, or under the
    ``if __name__ == "__main__":`` entry); a script (``if __name__ ==
    "__main__":``) that never puts anything on a GPU (neither it nor a project module it
    imports names CUDA) runs on the CPU too; or in
    several processes it starts or joins (``init_process_group``, DDP, ``local_rank``,
    ``mp.spawn``), each on a device of its own (``set_device``, ``device_ids=``,
    ``local_rank``, ``mp.spawn``, ``model.cuda(rank)``; not one process per node using all
    its GPUs, which loads onto that node's ``cuda:0``, where its model is), with the load not
    kept to the main process (``if rank == 0:``): every
    rank loads onto the device the file was saved from; not a file whose path names the rank
    (``"queue" + str(args.rank) + ".pth"``), which each rank saved itself from its own device.

    Quiet without that evidence: a file the project never writes (a download, a published
    pretrained file), another program's checkpoint (``examples/gan/`` saving, ``examples/
    mnist/`` loading), a data cache (``torch.save(corpus, fn)``), an in-memory buffer
    (``io.BytesIO``) the process filled itself, a path a function of the file has just saved
    to and returns (``best = self._fit()`` ... ``torch.load(best)``, ``_fit`` ending
    ``return path`` with every ``path = ...`` followed by its ``torch.save``: this run wrote
    it, from its own devices; the ranks of a multi-process run still each load it onto the
    device it was saved from), a generic helper's save to a path it is given
    in a file that never names CUDA, a library module that shows no CPU path or ranks (an
    import of ``torch.distributed`` is none), a CUDA-only single-process script. Quiet too
    where the file evidently holds CPU tensors (``.cpu()`` tensors, a module moved to the
    CPU before its ``state_dict()`` is saved, also in the same expression:
    ``torch.save(net.cpu().state_dict(), path)``, numpy data), the path or its option names a
    pretrained or ImageNet backbone, FSDP CPU offload, the load runs only with CUDA (the CUDA
    branch of an ``if`` whose other branch maps, or under ``if torch.cuda.is_available():``),
    or in a test module (a test loads what it wrote itself, on the devices it has).

    On the development half of the labelled corpus (``benchmarks/check_corpus``, nine
    batches): 93 of 95 findings right.

    Fix (manual): pass ``map_location="cpu"`` (or the rank's device).

    safetorch: ``st.load`` (maps to CPU unless told otherwise).
    """

    code = "ST004"

    # Rewritten for issue 33 (evidence of CUDA tensors in the file and of a CPU/multi-process
    # run); held-out 61.0% (25/41) after that rewrite; 68.8% (55/80) on the seventeenth batch
    # after the third (stop 58): below the 97% bar (docs/check.md).
    # Tightened again on the grown development half (a device choice that includes the CPU,
    # ranks the script starts, the same program's save); preview until the held-out half
    # measures it at the bar.
    preview = True

    name = "load-without-map-location"
    torch_symbols = ("torch.load",)
    node_types = (ast.Call,)

    def visit(self, node: ast.Call) -> None:
        if self.ctx.qualname(node.func) != "torch.load" or has_double_star(node):
            return
        if _device_note(self.ctx, node, words=False) is None:
            return  # evidently CPU tensors, a CUDA-only branch, a test, a pretrained file
        if _map_location.loads_from_memory(self.ctx, node):
            return  # an in-memory buffer this process filled: its devices are this process's
        save = _map_location.cuda_save(self.ctx, node)
        if save is None:
            return
        off = _map_location.runs_off_cuda(self.ctx, node)
        if off is None:
            return
        line, why = off
        head = (
            "torch.load without map_location puts tensors back on the device they were saved "
            f"from, and {save.path}:{save.line} writes this file from CUDA tensors: "
        )
        if why == _map_location.RANKS:
            head += (
                f"this script runs in several processes (line {line}), and every rank loads "
                "onto the device it was saved from (cuda:0): pass map_location set to the "
                "rank's device"
            )
        else:
            head += (
                f"this script also runs without CUDA ({why}, line {line}), where a checkpoint "
                'saved on a GPU fails to load on a machine without one: pass map_location="cpu"'
                " (or the target device)"
            )
        self.report(node, head + " or use st.load")
