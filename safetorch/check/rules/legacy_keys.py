"""Keys of an older torch release in a checkpoint (ST024): a strict ``load_state_dict`` of a
file the project does not write into a model with InstanceNorm layers, which a checkpoint of
torch < 0.4 gave running stats they no longer have; the ``legacy`` patch's pitfall (under
``safetorch run`` such a load goes through ``st.load_state_dict``, which drops them)."""

from __future__ import annotations

import ast
from typing import Optional

from safetorch.check.engine import UNSAFE, Fix
from safetorch.check.fixer import import_edit, parents
from safetorch.check.rules import _load_flow as flow
from safetorch.check.rules._base import Rule
from safetorch.check.rules._helpers import (
    call_arg,
    find_keyword,
    has_double_star,
    has_star,
    not_a_module,
)

__all__ = ["LegacyStateDictKeys"]

_INSTANCE_NORMS = ("InstanceNorm1d", "InstanceNorm2d", "InstanceNorm3d")
_FACTS_KEY = "ST024-instance-norms"


def _untracked_instance_norms(tree: ast.Module, relpath: str) -> bool:
    """The file builds an ``nn.InstanceNorm*d`` without ``track_running_stats=True`` (the
    5th positional argument)."""
    ctx = flow._resolver(relpath, tree)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        qual = ctx.qualname(node.func) or ""
        if not (qual.startswith("torch.nn.") and qual.endswith(_INSTANCE_NORMS)):
            continue
        track = call_arg(node, 4, "track_running_stats")
        if track is None or (isinstance(track, ast.Constant) and not track.value):
            return True
    return False


class LegacyStateDictKeys(Rule):
    """ST024: a strict ``model.load_state_dict(torch.load(path))`` of a file from elsewhere
    into a model with InstanceNorm layers (keys of torch < 0.4).

    Before torch 0.4 InstanceNorm tracked running statistics and its checkpoints hold
    ``running_mean``/``running_var``; since 0.4 it has them only with
    ``track_running_stats=True``, and torch's strict ``load_state_dict`` refuses such a
    checkpoint ("Unexpected running stats buffer(s)"; published fast-neural-style weights
    are the known case). Reported where the project builds an ``nn.InstanceNorm*d``
    without ``track_running_stats=True``, the result of the load is not used, and no file of
    the project writes the loaded path (a file the project writes was written by a torch
    that has the modern keys); quiet where the code edits the loaded dict first (``del
    state[k]``: it removes the keys by hand).

    Fix (unsafe, ``--unsafe-fixes``): ``st.load_state_dict(model, path)``, the one
    implementation ``safetorch run`` routes such a load to: keys an older torch wrote
    are dropped, renamed or defaulted by each module's version and reported; the file is
    loaded weights-only (a file that needs more is refused with the reason).

        model.load_state_dict(torch.load(path))  ->  st.load_state_dict(model, path)

    safetorch: ``st.load_state_dict``.
    """

    code = "ST024"

    preview = True  # new in issue 34: under 5 held-out findings or below 97% (docs/check.md)

    name = "legacy-state-dict-keys"
    uses = "st.load_state_dict"
    torch_symbols = ("torch.nn.Module.load_state_dict",)
    fixable = True
    fix_applicability = UNSAFE
    node_types = (ast.Call,)

    def visit(self, node: ast.Call) -> None:
        func = node.func
        if not (isinstance(func, ast.Attribute) and func.attr == "load_state_dict"):
            return
        if not_a_module(self.ctx.segment(func.value)):
            return  # an optimizer's or a scheduler's state: no module keys, no module to load
        if len(node.args) != 1 or has_star(node) or has_double_star(node):
            return
        strict = find_keyword(node, "strict")
        if strict is not None and not (
            isinstance(strict.value, ast.Constant) and strict.value.value is True
        ):
            return
        if any(k.arg not in ("strict",) for k in node.keywords):
            return
        statement = parents(self.ctx).get(id(node))
        if not isinstance(statement, ast.Expr):
            return  # the result is used: st.load_state_dict returns a report instead
        load = self._load_of(node.args[0], node)
        if load is None or flow.candidates(self.ctx, load):
            return
        if not self._has_untracked_instance_norm():
            return
        self.report(
            node,
            "a checkpoint of torch < 0.4 holds InstanceNorm running_mean/running_var that "
            "this model's InstanceNorm (track_running_stats=False) lacks, and a strict "
            "load_state_dict refuses it: st.load_state_dict(model, path) drops those keys and "
            "reports them (what safetorch run does with such a load)",
            self._fix(node, load),
        )

    def _has_untracked_instance_norm(self) -> bool:
        if "InstanceNorm" in self.ctx.source and _untracked_instance_norms(
            self.ctx.tree, self.ctx.path
        ):
            return True
        facts = self.ctx.project_facts(_FACTS_KEY, _untracked_instance_norms)
        return any(facts.values())

    def _load_of(self, arg: ast.expr, call: ast.Call) -> Optional[ast.Call]:
        """The ``torch.load(...)`` the argument is: the call itself, or the value of a name
        bound to one in the same scope and not edited before ``call``."""
        if isinstance(arg, ast.Call):
            return arg if self.ctx.qualname(arg.func) == "torch.load" else None
        if not isinstance(arg, ast.Name):
            return None
        bound: Optional[ast.Call] = None
        for n in self.ctx.walk(self.ctx.scope):
            if (n.lineno if hasattr(n, "lineno") else 0) >= call.lineno:
                continue
            if isinstance(n, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == arg.id for t in n.targets
            ):
                value = n.value
                is_load = isinstance(value, ast.Call) and (
                    self.ctx.qualname(value.func) == "torch.load"
                )
                bound = value if is_load and isinstance(value, ast.Call) else None
                if not is_load:
                    return None
            if isinstance(n, ast.Subscript) and isinstance(n.value, ast.Name):
                if n.value.id == arg.id and isinstance(n.ctx, (ast.Del, ast.Store)):
                    return None  # del state[k]: the code edits the keys itself
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute):
                owner = n.func.value
                if (
                    isinstance(owner, ast.Name)
                    and owner.id == arg.id
                    and n.func.attr
                    in (
                        "pop",
                        "update",
                        "popitem",
                        "clear",
                    )
                ):
                    return None
        return bound

    def _fix(self, node: ast.Call, load: ast.Call) -> Optional[Fix]:
        names = import_edit(self.ctx, [("safetorch", "st")])
        if names is None:
            return None
        spelled, imports = names
        func = node.func
        assert isinstance(func, ast.Attribute)
        source = node.args[0]
        text = self.ctx.segment(source)
        path = call_arg(load, 0, "f")
        only_path = path is not None and all(
            k.arg in ("map_location", "weights_only", "f") for k in load.keywords
        )
        if source is load and only_path and len(load.args) <= 2 and path is not None:
            text = self.ctx.segment(path)  # st.load_state_dict reads the file weights-only
        model = self.ctx.segment(func.value)
        new = f"{spelled['safetorch']}.load_state_dict({model}, {text})"
        return Fix(f"use {new}", (*imports, self.ctx.replace(node, new)), UNSAFE)
