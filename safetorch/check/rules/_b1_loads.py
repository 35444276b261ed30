"""Where a project loads its own checkpoints, and whether into a wrapped model (ST011).

Saving ``model.state_dict()`` from a DataParallel/DDP wrapper writes ``module.``-prefixed
keys. Whether that is a pitfall depends on the project's own loaders: a project whose every
loader loads into a wrapped model, or strips the prefix itself, has the wrapped form as its
checkpoint format. :func:`file_loads` reads one file's syntax tree (no other context: it runs
on every file of the project) and says where it loads a ``torch.load``-ed state dict into a
model, into what, and whether the file handles the prefix.
"""

from __future__ import annotations

import ast
from typing import Dict, Iterator, List, NamedTuple, Optional, Sequence, Set, Tuple

from safetorch.check.rules._helpers import FUNCTION_DEFS, bound_names, call_name
from safetorch.check.rules._wrapped import Branch, is_main_guard, statements_with_branch

# A receiver whose name says it is not the model.
_NOT_MODELS = ("optim", "sched", "scaler")
# Calls that remove or test a key prefix.
_PREFIX_CALLS = frozenset({"replace", "startswith", "removeprefix", "sub", "lstrip", "split"})
_PREFIX_CALLS |= frozenset({"match", "strip", "partition", "find"})
# torch's own helper for it, and safetorch's loader (keys with or without the prefix).
_PREFIX_HELPERS = frozenset({"consume_prefix_in_state_dict_if_present", "load_state_dict"})


class Load(NamedTuple):
    """One ``m.load_state_dict(<from torch.load>)`` call.

    Attributes:
        line: Where it is.
        model: The model as written (``model``, ``self.net``).
        wrapped: ``"always"``, ``"sometimes"`` or ``"no"``: the model there.
        keys: String keys the loaded value is read under (``ckpt["state_dict"]``).
        strips: Whether the function (or module) holding the load handles the prefix.
        through: Functions the loaded value passes through (``convert_state_dict(sd)``).
    """

    line: int
    model: str
    wrapped: str
    keys: Tuple[str, ...]
    strips: bool
    through: Tuple[str, ...]


class FileLoads(NamedTuple):
    """What :func:`file_loads` finds in one file: its loads, and the names of its
    functions that handle the prefix (``def convert_state_dict(sd): ... k[7:] ...``)."""

    loads: Tuple[Load, ...]
    stripping_functions: Tuple[str, ...]


def is_wrapper_call(node: Optional[ast.AST]) -> bool:
    """``DataParallel(m)``, ``DistributedDataParallel(m)``, ``DDP(m)``, ``smart_DDP(m)``,
    seen through ``.cuda()``/``.to(...)`` chained on it.

    >>> is_wrapper_call(ast.parse("nn.DataParallel(m).cuda()", mode="eval").body)
    True
    """
    while (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in ("cuda", "to", "cpu", "float", "half", "train", "eval")
    ):
        node = node.func.value
    if not isinstance(node, ast.Call):
        return False
    name = call_name(node.func)
    return "DataParallel" in name or "DDP" in name


def _wrap_state(value: ast.AST, branch: Branch) -> Optional[str]:
    if isinstance(value, ast.IfExp):
        if is_wrapper_call(value.body) or is_wrapper_call(value.orelse):
            return "sometimes"
        return None
    if is_wrapper_call(value):
        return "sometimes" if branch else "always"
    return None


def _text(node: ast.AST) -> Optional[str]:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        return node.value.id + "." + node.attr
    return None


def _string_keys(node: ast.AST) -> Set[str]:
    return {
        sub.slice.value
        for sub in ast.walk(node)
        if isinstance(sub, ast.Subscript)
        and isinstance(sub.slice, ast.Constant)
        and isinstance(sub.slice.value, str)
    }


def _calls_torch_load(node: ast.AST) -> bool:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call):
            func = sub.func
            if isinstance(func, ast.Attribute) and func.attr == "load":
                return True  # torch.load(...), st.load(...)
    return False


def _own_statements(body: Sequence[ast.stmt]) -> Iterator[Tuple[ast.stmt, Branch]]:
    """The statements of a scope with their branches, ``if __name__ == "__main__":`` not
    counted as one (it decides nothing about the machine: a model wrapped there is wrapped
    whenever the script runs)."""
    guards = {id(s) for s in body if isinstance(s, ast.If) and is_main_guard(s.test)}
    for stmt, branch in statements_with_branch(body):
        if not isinstance(stmt, (*FUNCTION_DEFS, ast.ClassDef)):
            yield stmt, tuple(b for b in branch if not (b[0] in guards and b[1] == "body"))


def _strips_prefix(tree: ast.AST) -> bool:
    """Whether the code removes or tests a ``module`` key prefix (``k.replace("module.",
    "")``, ``k[7:]``, ``consume_prefix_in_state_dict_if_present``, ``st.load_state_dict``)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = call_name(node.func)
            if name in _PREFIX_HELPERS and name != "load_state_dict":
                return True
            if name == "load_state_dict" and isinstance(node.func, ast.Attribute):
                owner = node.func.value
                if isinstance(owner, ast.Name) and owner.id in ("st", "safetorch"):
                    return True
            if name in _PREFIX_CALLS and any(
                isinstance(a, ast.Constant)
                and isinstance(a.value, str)
                and a.value.lstrip("^").startswith("module")
                for a in node.args
            ):
                return True
        elif isinstance(node, ast.Compare) and any(
            isinstance(c, ast.Constant) and c.value in ("module", "module.")
            for c in (node.left, *node.comparators)
        ):
            return True
        elif (
            isinstance(node, ast.Subscript)
            and isinstance(node.slice, ast.Slice)
            and isinstance(node.slice.lower, ast.Constant)
            and node.slice.lower.value == 7  # len("module.")
            and node.slice.upper is None
        ):
            return True
    return False


def file_loads(tree: ast.Module, relpath: str = "") -> FileLoads:
    """The loads of ``torch.load``-ed state dicts into models in one file.

    >>> tree = ast.parse('''
    ... def resume(model, path):
    ...     model = nn.DataParallel(model)
    ...     ckpt = torch.load(path)
    ...     model.load_state_dict(ckpt["state_dict"])
    ... ''')
    >>> load = file_loads(tree).loads[0]
    >>> load.wrapped, load.keys, load.strips
    ('always', ('state_dict',), False)
    """
    self_wrapped: Dict[str, str] = {}
    scopes: List[ast.AST] = [tree, *(n for n in ast.walk(tree) if isinstance(n, FUNCTION_DEFS))]
    for scope in scopes:
        for stmt, branch in _own_statements(scope.body):  # type: ignore[attr-defined]  # module or function
            if isinstance(stmt, ast.Assign):
                state = _wrap_state(stmt.value, branch)
                for target in stmt.targets:
                    text = _text(target)
                    if state is not None and text is not None and text.startswith("self."):
                        old = self_wrapped.get(text)
                        self_wrapped[text] = "sometimes" if old not in (None, state) else state
    loads: List[Load] = []
    stripping: List[str] = []
    for scope in scopes:
        strips = _strips_prefix(scope)
        if strips and isinstance(scope, FUNCTION_DEFS):
            stripping.append(scope.name)
        loads.extend(_scope_loads(scope, self_wrapped, strips and scope is not tree))
    return FileLoads(tuple(loads), tuple(stripping))


def _scope_loads(scope: ast.AST, self_wrapped: Dict[str, str], strips: bool) -> Iterator[Load]:
    wrapped: Dict[str, Tuple[str, Branch]] = {}
    loaded: Set[str] = set()  # names holding what torch.load returned (or a part of it)
    keys: Dict[str, Set[str]] = {}
    through: Dict[str, Set[str]] = {}  # name -> functions its value passed through
    for stmt, branch in _own_statements(scope.body):  # type: ignore[attr-defined]  # module or function
        if isinstance(stmt, ast.Assign):
            state = _wrap_state(stmt.value, branch)
            from_load = _calls_torch_load(stmt.value) or any(
                isinstance(n, ast.Name) and n.id in loaded for n in ast.walk(stmt.value)
            )
            for target in stmt.targets:
                for name in bound_names(target):
                    if state is not None:
                        wrapped[name] = (state, branch)
                    elif name in wrapped and branch == wrapped[name][1][: len(branch)]:
                        del wrapped[name]
                    if from_load:
                        loaded.add(name)
                        feeding = [n.id for n in ast.walk(stmt.value) if isinstance(n, ast.Name)]
                        keys[name] = _string_keys(stmt.value).union(
                            *(keys.get(n, ()) for n in feeding)
                        )
                        through[name] = _callees(stmt.value).union(
                            *(through.get(n, ()) for n in feeding)
                        )
        for part in ast.iter_child_nodes(stmt):
            if isinstance(part, ast.stmt):
                continue
            for node in ast.walk(part):
                load = _load_of(node, wrapped, self_wrapped, loaded, keys, through)
                if load is not None:
                    yield load._replace(strips=strips)


def _load_of(
    node: ast.AST,
    wrapped: Dict[str, Tuple[str, Branch]],
    self_wrapped: Dict[str, str],
    loaded: Set[str],
    keys: Dict[str, Set[str]],
    through: Dict[str, Set[str]],
) -> Optional[Load]:
    if not (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "load_state_dict"
        and node.args
    ):
        return None
    receiver = node.func.value
    text = _text(receiver)
    if isinstance(receiver, ast.Attribute) and receiver.attr == "module":
        text, state = _text(receiver.value), "no"  # model.module.load_state_dict(...)
        if text is not None:
            text += ".module"
    elif text is None:
        return None
    elif text.startswith("self."):
        state = self_wrapped.get(text, "no")
    else:
        state = wrapped.get(text, ("no", ()))[0]
    if text is None or any(word in text.lower().rsplit(".", 1)[-1] for word in _NOT_MODELS):
        return None
    arg = node.args[0]
    names = {n.id for n in ast.walk(arg) if isinstance(n, ast.Name)}
    if not (_calls_torch_load(arg) or names & loaded):
        return None  # not a checkpoint file read here (a pretrained download, a copy)
    found = _string_keys(arg).union(*(keys.get(n, ()) for n in names))
    passed = _callees(arg).union(*(through.get(n, ()) for n in names))
    return Load(node.lineno, text, state, tuple(sorted(found)), False, tuple(sorted(passed)))


def _callees(node: ast.AST) -> Set[str]:
    return {call_name(n.func) for n in ast.walk(node) if isinstance(n, ast.Call)} - {""}
