"""Whether code runs only under a distributed condition (ST013, ST014).

A condition is distributed when it names the decision: ``args.distributed``, ``RANK != -1``,
``dist.is_initialized()``, ``world_size > 1``. It guards a call whether it is the test of an
``if`` (or a conditional expression) around the call, an ``assert`` before it in the same
function, or an early exit before it (``if not args.distributed: return model``).
"""

from __future__ import annotations

import ast
from typing import Iterator, List, Sequence, Tuple

from safetorch.check.engine import Context
from safetorch.check.rules._helpers import Pos, end_of, start_of

#: Words that name the decision to train in several processes.
DIST_WORDS: Tuple[str, ...] = ("sync_bn", "syncbn", "sync_batchnorm", "distributed", "ddp")
DIST_WORDS += ("world_size", "rank", "is_initialized", "dist_url", "dist_backend")
#: Words that name the number of GPUs (a decision about parallelism, not processes).
GPU_WORDS: Tuple[str, ...] = ("n_gpu", "ngpu", "num_gpus", "num_gpu", "device_count", "gpus")
GPU_WORDS += ("mgpus", "multi_gpu", "multigpu")

_BLOCKS = ("body", "orelse", "finalbody")


def mentions(ctx: Context, test: ast.AST, words: Sequence[str]) -> bool:
    """Whether a name, attribute or string in ``test`` contains one of ``words``.

    >>> ctx = Context("m.py", "args.distributed and x\\n")
    >>> mentions(ctx, ctx.tree.body[0], DIST_WORDS), mentions(ctx, ctx.tree.body[0], GPU_WORDS)
    (True, False)
    """
    for sub in ctx.walk(test):
        word = sub.id if isinstance(sub, ast.Name) else getattr(sub, "attr", None)
        if word is None and isinstance(sub, ast.Constant) and isinstance(sub.value, str):
            word = sub.value
        if isinstance(word, str) and any(w in word.lower() for w in words):
            return True
    return False


def _exits(body: Sequence[ast.stmt]) -> bool:
    """Whether a block ends by leaving the function (``return``, ``raise``, ``sys.exit()``)."""
    if not body:
        return False
    last = body[-1]
    if isinstance(last, (ast.Return, ast.Raise)):
        return True
    if isinstance(last, ast.Expr) and isinstance(last.value, ast.Call):
        func = last.value.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        return name in ("exit", "_exit", "error")  # sys.exit(), parser.error()
    return False


def _contains(stmt: ast.stmt, at: Pos) -> bool:
    return start_of(stmt) <= at < end_of(stmt)


def preceding_statements(scope_body: Sequence[ast.stmt], at: Pos) -> Iterator[ast.stmt]:
    """The statements that run before the code at ``at`` on every path to it: those before
    it in its own block and in each enclosing block of the scope (not nested functions)."""
    body: Sequence[ast.stmt] = scope_body
    while True:
        inner: List[ast.stmt] = []
        for stmt in body:
            if _contains(stmt, at):
                if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    return
                for name in _BLOCKS:
                    block = getattr(stmt, name, None)
                    if isinstance(block, list) and any(_contains(s, at) for s in block):
                        inner = block
                for handler in getattr(stmt, "handlers", []):
                    if any(_contains(s, at) for s in handler.body):
                        inner = handler.body
                break
            yield stmt
        if not inner:
            return
        body = inner


def guarded_before(ctx: Context, scope_body: Sequence[ast.stmt], at: Pos) -> bool:
    """Whether an ``assert`` of a distributed condition, or an early exit on one
    (``if not args.distributed: return``), runs before ``at`` in the same scope.

    >>> src = "def f(m, args):\\n    assert args.distributed\\n    return convert(m)\\n"
    >>> ctx = Context("m.py", src)
    >>> fn = ctx.tree.body[0]
    >>> guarded_before(ctx, fn.body, (3, 11))
    True
    """
    for stmt in preceding_statements(scope_body, at):
        if isinstance(stmt, ast.Assert) and mentions(ctx, stmt.test, DIST_WORDS):
            return True
        if (
            isinstance(stmt, ast.If)
            and mentions(ctx, stmt.test, DIST_WORDS)
            and (_exits(stmt.body) or _exits(stmt.orelse))
        ):
            return True
    return False
