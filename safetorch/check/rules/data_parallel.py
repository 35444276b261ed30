"""``nn.DataParallel`` (ST013)."""

from __future__ import annotations

import ast
import os
from typing import Dict, List, Set, Tuple

from safetorch.check.engine import Context
from safetorch.check.rules._b1_guards import DIST_WORDS, GPU_WORDS, guarded_before, mentions
from safetorch.check.rules._base import Rule
from safetorch.check.rules._helpers import (
    FUNCTION_DEFS,
    NN,
    bound_names,
    call_name,
    own_expressions,
    start_of,
)
from safetorch.check.rules._wrapped import (
    KEY_ONLY_ATTRS,
    Branch,
    made_for_its_keys,
    statements_with_branch,
)

#: Words in a callee's name that say it builds a multi-process wrapper.
_DDP_CALLEES: Tuple[str, ...] = ("distributeddataparallel", "ddp", "fsdp", "fully_shard")
_DDP_CALLEES += ("fullyshardeddataparallel",)
#: Directories under ``tests/`` that hold the tests' input, not tests.
_TEST_INPUT_DIRS = frozenset({"fixtures", "testdata", "test_data", "samples"})
#: What a wrapper is used for when something trains through it.
_TRAINING_ATTRS = frozenset({"train", "parameters", "named_parameters"})


def builds_ddp(node: ast.AST) -> bool:
    """Whether code under ``node`` builds a multi-process wrapper: a call named like
    ``DistributedDataParallel``, ``DDP``, ``smart_DDP``, ``FSDP`` or ``fully_shard``.

    >>> builds_ddp(ast.parse("model = DDP(model, device_ids=[rank])"))
    True
    >>> builds_ddp(ast.parse("model = nn.DataParallel(model)"))
    False
    """
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call):
            name = call_name(sub.func).lower()
            if any(word in name for word in _DDP_CALLEES):
                return True
    return False


def is_test_path(relpath: str) -> bool:
    """Whether a file (relative to its project's root) is a test: ``test_*.py``,
    ``*_test.py``, ``conftest.py`` or anything under a ``tests/`` or ``test/`` directory,
    except under a ``fixtures/`` or ``testdata/`` directory there (the tests' input: a
    linter's sample code is checked as the user's code it stands for).

    >>> is_test_path("tests/test_ckpt.py"), is_test_path("test/utils.py")
    (True, True)
    >>> is_test_path("train.py"), is_test_path("tests/check/fixtures/train.py")
    (False, False)
    """
    parts = relpath.replace(os.sep, "/").split("/")
    name = parts[-1]
    if name == "conftest.py" or name.startswith("test_") or name.endswith("_test.py"):
        return True
    for i, part in enumerate(parts[:-1]):
        if part in ("tests", "test"):
            return not any(p in _TEST_INPUT_DIRS for p in parts[i + 1 : -1])
    return False


def _project_builds_ddp(tree: ast.Module, relpath: str) -> bool:
    return builds_ddp(tree)


def _trains(ctx: Context) -> bool:
    """Whether the file runs a backward pass or an optimizer step anywhere."""
    found = ctx.cache.get("ST013-trains")
    if found is None:
        found = any(
            isinstance(n, ast.Call)
            and isinstance(n.func, ast.Attribute)
            and n.func.attr in ("backward", "step", "zero_grad")
            for n in ctx.walk(ctx.tree)
        )
        ctx.cache["ST013-trains"] = found
    return bool(found)


class DataParallelUsed(Rule):
    """ST013: ``nn.DataParallel``.

    DataParallel runs one process with a thread per GPU: the GIL, re-broadcasting the model
    every step and gathering every output on ``cuda:0`` make it slower than
    DistributedDataParallel even on a single machine, and ``cuda:0`` runs out of memory
    first. Its state_dict keys are prefixed with ``module.``.

    Not reported where DataParallel is used on purpose:

    - for its keys: ``nn.DataParallel(model).state_dict()``, an unconditional
      ``m = nn.DataParallel(model)`` used only for ``m.state_dict()`` (a conversion
      script), or a model wrapped to load the project's ``module.``-prefixed checkpoints
      (``m.load_state_dict(...)`` after the wrap, in a file that never trains, the wrap not
      decided by the number of GPUs);
    - in tests (``test_*.py``, ``*_test.py``, ``conftest.py``, files under ``tests/`` or
      ``test/``): a test of prefix handling or of the wrapper itself;
    - as the single-process fallback beside a DDP path: the wrap is on a branch of a
      distributed condition (``if args.distributed: ... DDP ... else: DataParallel``,
      ``if RANK == -1 and n_gpu > 1:``, or after ``if args.distributed: return DDP(m)``)
      and the function, the file or the project builds DistributedDataParallel.

    - where no GPU can be: the ``else:`` of ``if torch.cuda.is_available():`` (or under
      ``if not torch.cuda.is_available():``), a pass-through wrapper kept so that
      ``model.module`` works on the CPU too.

    Fix (manual): ``torch.nn.parallel.DistributedDataParallel`` (one process per GPU).

    safetorch: ``st.unwrap_model`` for saving either wrapper's weights.
    """

    code = "ST013"

    preview = True  # below 97% on the held-out corpus half (docs/check.md)

    name = "data-parallel"
    uses = "st.unwrap_model"
    torch_symbols = (NN + "DataParallel",)
    node_types = (ast.Call, ast.Attribute)

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self._calls: List[Tuple[ast.Call, ast.AST]] = []  # (call, its scope)
        self._for_keys: Set[int] = set()

    def visit(self, node: ast.AST) -> None:
        if isinstance(node, ast.Attribute):
            # nn.DataParallel(model).state_dict(): made for its prefixed keys, not to run
            if node.attr in KEY_ONLY_ATTRS and isinstance(node.value, ast.Call):
                self._for_keys.add(id(node.value))
        elif isinstance(node, ast.Call) and self.ctx.qualname(node.func) == NN + "DataParallel":
            self._calls.append((node, self.ctx.scope))

    def finish(self) -> None:
        if not self._calls:
            return
        if is_test_path(self.ctx.project.relpath(self.ctx.path)):
            return
        scopes = [
            self.ctx.tree,
            *(n for n in self.ctx.walk(self.ctx.tree) if isinstance(n, FUNCTION_DEFS)),
        ]
        # id(DataParallel call) -> (its statement, the branch it is on, the scope)
        placed: Dict[int, Tuple[ast.stmt, Branch, ast.AST]] = {}
        scope: ast.AST
        calls = {id(c) for c, _ in self._calls}
        for scope in scopes:
            for stmt, branch in statements_with_branch(scope.body):
                if isinstance(stmt, ast.Assign) and made_for_its_keys(self.ctx, stmt, branch):
                    self._for_keys.add(id(stmt.value))
                if isinstance(stmt, (*FUNCTION_DEFS, ast.ClassDef)):
                    continue
                for part in own_expressions(stmt):
                    for sub in self.ctx.walk(part):
                        if id(sub) in calls:
                            placed[id(sub)] = (stmt, branch, scope)
        for call, _ in self._calls:
            if id(call) in self._for_keys:
                continue
            where = placed.get(id(call))
            if where is not None:
                stmt, branch, scope = where
                if self._fallback_beside_ddp(call, branch, scope):
                    continue
                if self._without_cuda(branch):
                    continue
                if self._wrapped_to_load(stmt, branch, scope):
                    continue
            self.report(
                call,
                "nn.DataParallel is slower than DistributedDataParallel and gathers on cuda:0: "
                "use DistributedDataParallel (st.unwrap_model to save its weights)",
            )

    # -- the single-process fallback ---------------------------------------------------------
    def _fallback_beside_ddp(self, call: ast.Call, branch: Branch, scope: ast.AST) -> bool:
        """On a branch of a distributed condition, with DDP built in the function, the file
        or the project."""
        nodes = self._branch_nodes()
        tests = [getattr(nodes.get(if_id), "test", None) for if_id, _ in branch]
        decided = any(t is not None and mentions(self.ctx, t, DIST_WORDS) for t in tests)
        decided = decided or any(
            isinstance(n, ast.IfExp)
            and mentions(self.ctx, n.test, DIST_WORDS)
            and any(s is call for s in self.ctx.walk(n))
            for n in self.ctx.walk(scope)
        )
        body = getattr(scope, "body", None)
        if not decided and isinstance(body, list):
            decided = guarded_before(self.ctx, body, start_of(call))
        if not decided:
            return False
        if builds_ddp(scope) or builds_ddp(self.ctx.tree):
            return True
        return any(self.ctx.project_facts("ST013-builds-ddp", _project_builds_ddp).values())

    def _without_cuda(self, branch: Branch) -> bool:
        """On the branch taken without CUDA: ``else:`` of ``if torch.cuda.is_available():``,
        or the body of ``if not torch.cuda.is_available():``."""
        nodes = self._branch_nodes()
        for if_id, part in branch:
            test = getattr(nodes.get(if_id), "test", None)
            negated = isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not)
            if isinstance(test, ast.UnaryOp) and negated:
                test = test.operand
            if not (
                isinstance(test, ast.Call)
                and self.ctx.qualname(test.func) == "torch.cuda.is_available"
            ):
                continue
            if part == ("body" if negated else "orelse"):
                return True
        return False

    def _branch_nodes(self) -> Dict[int, ast.AST]:
        nodes = self.ctx.cache.get("ST013-branch-nodes")
        if nodes is None:
            nodes = self.ctx.cache["ST013-branch-nodes"] = {
                id(n): n for n in self.ctx.walk(self.ctx.tree) if isinstance(n, ast.If)
            }
        found: Dict[int, ast.AST] = nodes
        return found

    # -- wrapped to load module.-prefixed weights --------------------------------------------
    def _wrapped_to_load(self, stmt: ast.stmt, branch: Branch, scope: ast.AST) -> bool:
        """``m = DataParallel(model)`` then ``m.load_state_dict(...)``, in a file that
        never trains, the wrap not decided by the number of GPUs."""
        if not isinstance(stmt, ast.Assign) or len(stmt.targets) != 1:
            return False
        names = list(bound_names(stmt.targets[0]))
        if len(names) != 1 or _trains(self.ctx):
            return False
        nodes = self._branch_nodes()
        for if_id, _ in branch:
            test = getattr(nodes.get(if_id), "test", None)
            if test is not None and mentions(self.ctx, test, GPU_WORDS):
                return False  # a parallelism decision
        name = names[0]
        after = start_of(stmt)
        loads = False
        for node in self.ctx.walk(scope):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == name
                and start_of(node) > after
            ):
                if node.attr in _TRAINING_ATTRS:
                    return False
                loads = loads or node.attr == "load_state_dict"
        return loads
