"""Batches that ``pin_memory=True`` silently skips (ST010): the ``pin_memory`` patch's pitfall."""

from __future__ import annotations

import ast
from typing import Dict, List, Set, Tuple

from safetorch.check.engine import Context
from safetorch.check.rules._base import Rule
from safetorch.check.rules._helpers import find_keyword, is_const

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

    name = "batch-not-pinnable"
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
            pin = find_keyword(node, "pin_memory")
            collate = find_keyword(node, "collate_fn")
            if pin is None or collate is None or not is_const(pin.value, True):
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
            for node in self.ctx.walk(fn):
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
