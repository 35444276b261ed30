"""Fork after OpenMP (ST023): a ``multiprocessing.Process`` forked after torch ran parallel
ops in the parent, whose child's first parallel op can hang; the ``legacy`` patch's pitfall
(``safetorch run`` gives fork children one intra-op thread)."""

from __future__ import annotations

import ast
from typing import List, Optional

from safetorch.check.engine import UNSAFE, Edit, Fix
from safetorch.check.fixer import newline
from safetorch.check.rules._base import Rule
from safetorch.check.rules._helpers import FUNCTION_DEFS, find_keyword, own_nodes, start_of

__all__ = ["ForkAfterOpenMP"]

_PROCESS = frozenset({"multiprocessing.Process", "torch.multiprocessing.Process"})
# torch calls that run no parallel region (seeding, settings, process plumbing).
_NOT_OPS = (
    "torch.multiprocessing.",
    "torch.manual_seed",
    "torch.set_",
    "torch.get_",
    "torch.device",
    "torch.cuda.",
    "torch.backends.",
)
# Calls that choose how children start: a file that calls one is not left to fork by default.
_START_METHOD = ("set_start_method", "get_context", "set_forkserver_preload")


class ForkAfterOpenMP(Rule):
    """ST023: ``mp.Process(target=train)`` started after torch ran ops in the parent (Hogwild).

    On Linux ``multiprocessing`` (and ``torch.multiprocessing``) starts children with
    ``fork``. A child forked after the parent ran an OpenMP parallel region (building and
    initialising a model, a forward pass) inherits a thread pool whose threads do not exist
    in it: with GNU libgomp its first parallel op can hang forever. torch's own DataLoader
    workers call ``torch.set_num_threads(1)`` first, and ``safetorch run`` does the same in
    every fork child. Reported for a ``Process`` whose ``target`` is a function of the file
    that runs torch code, created where the parent has already called torch (or built a
    model) before it, in a file that does not choose a start method
    (``set_start_method``, ``get_context``) and whose target does not set the thread count.

    Fix (unsafe, ``--unsafe-fixes``): ``torch.set_num_threads(1)`` as the target's first
    statement: what ``safetorch run`` does, so the fixed script computes what it computed
    under the shim. A ``spawn`` context is not the fix: it re-imports the main module in
    every child (a script without ``if __name__ == "__main__":`` runs again), pickles the
    target and its arguments (a lambda or a local function fails) and gives the child fresh
    globals and RNG state instead of the parent's, which changes results; one thread changes
    only how fast each child computes (several children already share the cores).

        def train(rank, model):            def train(rank, model):
            ...                       ->       torch.set_num_threads(1)
                                               ...

    safetorch: ``st.legacy`` (its patch gives fork children one thread; the fix calls torch's own
    ``torch.set_num_threads``, as the patch does).
    """

    code = "ST023"

    preview = True  # new in issue 34: under 5 held-out findings or below 97% (docs/check.md)

    name = "fork-after-openmp"
    uses = "st.legacy"
    torch_symbols = ("torch.multiprocessing.Process",)
    fixable = True
    fix_applicability = UNSAFE
    node_types = (ast.Call,)

    def visit(self, node: ast.Call) -> None:
        if self.ctx.qualname(node.func) not in _PROCESS:
            return
        if any(word in self.ctx.source for word in _START_METHOD):
            return
        target = find_keyword(node, "target")
        if target is None or not isinstance(target.value, ast.Name):
            return
        functions = [
            n
            for n in self.ctx.walk(self.ctx.tree)
            if isinstance(n, FUNCTION_DEFS) and n.name == target.value.id
        ]
        if len(functions) != 1:
            return
        fn = functions[0]
        if not self._runs_torch(fn) or self._sets_threads(fn):
            return
        if not self._torch_before(node):
            return
        self.report(
            node,
            f"a child forked after torch ran ops in this process can hang in its first "
            f"parallel op (fork after OpenMP): call torch.set_num_threads(1) first in "
            f"{fn.name}() (what torch's DataLoader workers do, and safetorch run's st.legacy "
            "shim for fork children)",
            self._fix(fn),
        )

    def _runs_torch(self, fn: ast.AST) -> bool:
        """The target runs torch code: a torch call, a backward/step, a model call."""
        for n in self.ctx.walk(fn):
            if isinstance(n, ast.Call):
                if (self.ctx.qualname(n.func) or "").startswith("torch."):
                    return True
                if isinstance(n.func, ast.Attribute) and n.func.attr in ("backward", "step"):
                    return True
        return False

    def _sets_threads(self, fn: ast.AST) -> bool:
        return any(
            isinstance(n, ast.Call) and self.ctx.qualname(n.func) == "torch.set_num_threads"
            for n in self.ctx.walk(fn)
        )

    def _torch_before(self, call: ast.Call) -> bool:
        """The parent ran torch before creating the child: in the function around the call
        (or the module), a torch call or a model built (``Net()``) before it."""
        scope: ast.AST = self.ctx.scope
        if not isinstance(scope, (*FUNCTION_DEFS, ast.Module)):
            scope = self.ctx.tree
        at = start_of(call)
        for n in own_nodes(scope):  # not the bodies of functions defined there
            if not isinstance(n, ast.Call) or start_of(n) >= at:
                continue
            qual = self.ctx.qualname(n.func) or ""
            if qual.startswith("torch.") and not qual.startswith(_NOT_OPS):
                return True
            if isinstance(n.func, ast.Name) and n.func.id[:1].isupper() and not qual:
                return True  # a model class of the project: its constructor runs torch init
            if isinstance(n.func, ast.Attribute) and n.func.attr == "share_memory":
                return True
        return False

    def _fix(self, fn: ast.AST) -> Optional[Fix]:
        body: List[ast.stmt] = getattr(fn, "body", [])
        if not body:
            return None
        first = body[0]
        if (
            isinstance(first, ast.Expr)
            and isinstance(first.value, ast.Constant)
            and isinstance(first.value.value, str)
        ):
            if len(body) == 1:
                return None
            first = body[1]  # after the docstring
        spelled = self.ctx.spell("torch.set_num_threads")
        if spelled is None or first.lineno == getattr(fn, "lineno", 0):
            return None  # torch is not reachable by name here, or a one-line def
        line = first.lineno
        indent = self.ctx.lines[line - 1][: first.col_offset]
        if indent.strip():
            return None
        text = f"{indent}{spelled}(1){newline(self.ctx)}"
        edit = Edit(line, 0, line, 0, text)
        return Fix(f"call {spelled}(1) first in the child", (edit,), UNSAFE)
