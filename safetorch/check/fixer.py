"""Apply the rules' fixes: only the finding's span is rewritten, everything else is kept.

Edits are plain text replacements at positions the parser gave, so formatting and comments
outside (and inside) the span survive. Files are written atomically: a temporary file in the
same directory, then ``os.replace``.

The edit builders the migrating fixes share live here too: ``import_edit`` (bind a module
the fix spells, e.g. ``import safetorch as st``), ``wrap_edits`` (put statements under a
``with`` header, re-indenting only their lines) and ``parents`` / ``enclosing_statement``
(where a node sits in its block). Each returns small edits, so other fixes on the same lines
still apply in the same pass.
"""

from __future__ import annotations

import ast
import difflib
import re
from typing import Dict, Iterable, List, Optional, Sequence, Set, Tuple

from safetorch.check.engine import Context, Diagnostic, Edit, split_lines

__all__ = [
    "apply_fixes",
    "enclosing_statement",
    "import_edit",
    "indent_unit",
    "newline",
    "parents",
    "unified_diff",
    "wrap_edits",
]


def _offsets(lines: List[str]) -> List[int]:
    """Character offset of the start of each line (1-based line -> index line - 1)."""
    starts = [0]
    for text in lines:
        starts.append(starts[-1] + len(text))
    return starts


def _absolute(starts: List[int], edit: Edit) -> Tuple[int, int]:
    last = len(starts) - 1

    def at(line: int, col: int) -> int:
        if line > last:  # a position at the very end of a file without a final newline
            return starts[last] + col
        return starts[line - 1] + col

    return at(edit.line, edit.col), at(edit.end_line, edit.end_col)


def apply_fixes(source: str, diagnostics: Iterable[Diagnostic]) -> Tuple[str, int]:
    """Apply the fixes of ``diagnostics`` to ``source``.

    A fix is applied whole or not at all: one whose edits overlap an already accepted fix is
    left for the next pass (``fix_source`` loops until nothing changes).

    Args:
        source: The text the diagnostics were computed on.
        diagnostics: Findings; those without a fix are skipped.

    Returns:
        (new source, number of fixes applied).

    >>> from safetorch.check.engine import Fix
    >>> d = Diagnostic("m.py", 1, 1, 1, 11, "ST005", "", Fix("", (Edit(1, 10, 1, 10, ".clone()"),)))
    >>> apply_fixes("x.detach()\\n", [d])
    ('x.detach().clone()\\n', 1)
    """
    starts = _offsets(split_lines(source))
    accepted: List[Tuple[int, int, str]] = []
    applied = 0
    for diag in diagnostics:
        if diag.fix is None:
            continue
        spans = [(*_absolute(starts, e), e.content) for e in diag.fix.edits]
        if any(_overlaps(s, accepted) for s in spans):
            continue
        accepted.extend(spans)
        applied += 1
    # Apply back to front so earlier offsets stay valid; insertions at one spot keep order.
    accepted.sort(key=lambda s: (s[0], s[1]))
    out = source
    for begin, end, content in reversed(accepted):
        out = out[:begin] + content + out[end:]
    return out, applied


def _overlaps(span: Tuple[int, int, str], accepted: List[Tuple[int, int, str]]) -> bool:
    begin, end, _ = span
    for b, e, _ in accepted:
        if begin < e and b < end:  # strictly overlapping ranges
            return True
        if begin == end == b == e:  # two insertions at the same spot: order is ambiguous
            return True
    return False


def unified_diff(path: str, before: str, after: str) -> str:
    """A ``diff -u`` of the fix (apply it with ``patch -p0``), as ``ruff --diff`` prints it.

    >>> print(unified_diff("m.py", "a = 1\\n", "a = 2\\n"), end="")
    --- m.py
    +++ m.py
    @@ -1 +1 @@
    -a = 1
    +a = 2
    """
    return "".join(
        difflib.unified_diff(
            before.splitlines(keepends=True),
            after.splitlines(keepends=True),
            fromfile=path,
            tofile=path,
        )
    )


# -- edit builders for fixes that migrate code ------------------------------------------------
def parents(ctx: Context) -> Dict[int, ast.AST]:
    """``id(node) -> its parent node`` for the file ``ctx`` checks (built once, on demand).

    >>> ctx = Context("m.py", "x = f(1)\\n")
    >>> call = ctx.tree.body[0].value
    >>> type(parents(ctx)[id(call)]).__name__
    'Assign'
    """
    found = ctx.cache.get("parents")
    if found is None:
        found = {}
        for node in ctx.walk(ctx.tree):
            for child in ast.iter_child_nodes(node):
                found[id(child)] = node
        ctx.cache["parents"] = found
    return found


_BLOCK_FIELDS = ("body", "orelse", "finalbody")


def enclosing_statement(
    ctx: Context, node: ast.AST
) -> Optional[Tuple[ast.stmt, ast.AST, List[ast.stmt]]]:
    """The statement ``node`` is part of, the node that holds it, and the block (statement
    list) it is in; None when ``node`` is not inside a statement.

    >>> ctx = Context("m.py", "for i in r:\\n    y = f(i)\\n")
    >>> stmt, owner, block = enclosing_statement(ctx, ctx.tree.body[0].body[0].value)
    >>> type(stmt).__name__, type(owner).__name__, len(block)
    ('Assign', 'For', 1)
    """
    up = parents(ctx)
    current: Optional[ast.AST] = node
    while current is not None:
        owner = up.get(id(current))
        if owner is None:
            return None
        if isinstance(current, ast.stmt):
            for field in (*_BLOCK_FIELDS, "handlers"):
                block = getattr(owner, field, None)
                if isinstance(block, list) and any(s is current for s in block):
                    return current, owner, block
            if isinstance(owner, ast.ExceptHandler) and any(s is current for s in owner.body):
                return current, owner, owner.body
        current = owner
    return None


def _bound_anywhere(ctx: Context, name: str) -> bool:
    """Whether the file binds ``name`` itself (assignment, parameter, def, class, import)."""
    for node in ctx.walk(ctx.tree):
        if isinstance(node, ast.Name) and node.id == name and not isinstance(node.ctx, ast.Load):
            return True
        if isinstance(node, ast.arg) and node.arg == name:
            return True
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if node.name == name:
                return True
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            if any((a.asname or a.name.split(".")[0]) == name for a in node.names):
                return True
    return False


def _star_imports(ctx: Context) -> bool:
    """Whether the file has a ``from m import *`` (it may bind any name)."""
    return any(
        isinstance(node, ast.ImportFrom) and any(a.name == "*" for a in node.names)
        for node in ctx.walk(ctx.tree)
    )


def _header_lines(ctx: Context) -> int:
    """How many of the file's first two lines are a shebang or an encoding declaration, which
    must stay first (PEP 263: the encoding line is read on line 1 or 2 only)."""
    count = 0
    for i, text in enumerate(ctx.lines[:2]):
        if (i == 0 and text.startswith("#!")) or _CODING.match(text):
            count = i + 1
        elif not text.strip().startswith("#"):
            break
    return count


_CODING = re.compile(r"^[ \t\f]*#.*?coding[:=][ \t]*[-\w.]+")


def newline(ctx: Context) -> str:
    """The file's line ending (its first line's), for the lines a fix adds."""
    first = ctx.lines[0] if ctx.lines else "\n"
    return "\r\n" if first.endswith("\r\n") else ("\r" if first.endswith("\r") else "\n")


_STDLIB = frozenset({"os", "math", "sys"})


def import_edit(
    ctx: Context, modules: Sequence[Tuple[str, Optional[str]]]
) -> Optional[Tuple[Dict[str, str], List[Edit]]]:
    """How to spell each of ``modules`` (``(module, alias)``) in the file, and the edits
    that import those the file does not import yet: standard-library modules after the
    docstring and ``__future__`` imports, the others after the file's leading imports.

    Returns None where a name the import would bind is already bound to something else.

    >>> ctx = Context("m.py", "import torch\\nx = 1\\n")
    >>> ctx.add_imports(ctx.tree.body[0])
    >>> names, edits = import_edit(ctx, [("torch", None), ("safetorch", "st")])
    >>> names, [e.content for e in edits]
    ({'torch': 'torch', 'safetorch': 'st'}, ['import safetorch as st\\n'])
    """
    names: Dict[str, str] = {}
    groups: Dict[bool, List[str]] = {True: [], False: []}  # standard library or not
    for module, alias in modules:
        spelled = ctx.spell(module)
        if spelled is not None:
            names[module] = spelled
            continue
        name = alias or module.split(".")[0]
        if name in ctx.imports or _bound_anywhere(ctx, name):
            return None
        if alias and _star_imports(ctx):
            return None  # ``from m import *`` may bind the alias (a module's own ``st``)
        names[module] = name if alias else module
        text = f"import {module} as {alias}" if alias else f"import {module}"
        groups[module in _STDLIB].append(text)
    edits = [_import_lines(ctx, lines, stdlib) for stdlib, lines in groups.items() if lines]
    return names, edits


def _import_lines(ctx: Context, lines: List[str], stdlib: bool) -> Edit:
    nl = newline(ctx)
    text = "".join(line + nl for line in lines)
    anchor: Optional[ast.stmt] = None
    for i, stmt in enumerate(ctx.tree.body):
        docstring = (
            i == 0
            and isinstance(stmt, ast.Expr)
            and isinstance(stmt.value, ast.Constant)
            and isinstance(stmt.value.value, str)
        )
        future = isinstance(stmt, ast.ImportFrom) and stmt.module == "__future__"
        if docstring or future or (not stdlib and isinstance(stmt, (ast.Import, ast.ImportFrom))):
            anchor = stmt
        else:
            break
    if anchor is None:
        first = _header_lines(ctx) + 1  # after a shebang and an encoding line
        return Edit(first, 0, first, 0, text)
    end_line, end_col = ctx.end(anchor)
    if end_line >= len(ctx.lines) and not ctx.lines[-1].endswith(("\n", "\r")):
        return Edit(end_line, end_col, end_line, end_col, nl + text.rstrip("\r\n"))
    return Edit(end_line + 1, 0, end_line + 1, 0, text)


def _string_lines(ctx: Context, first: int, last: int) -> Set[int]:
    """Lines in ``first..last`` that start inside a multi-line string (not to be indented)."""
    inside: Set[int] = set()
    for node in ctx.walk(ctx.tree):
        if isinstance(node, (ast.Constant, ast.JoinedStr)) and node.end_lineno is not None:
            if node.end_lineno > node.lineno and node.lineno <= last and node.end_lineno >= first:
                inside.update(range(node.lineno + 1, node.end_lineno + 1))
    return inside


def indent_unit(ctx: Context) -> str:
    """One level of the file's indentation (its first indented line's; 4 spaces by default).

    >>> indent_unit(Context("m.py", "def f():\\n  return 1\\n"))
    '  '
    """
    for text in ctx.lines:
        stripped = text.lstrip(" \t")
        if stripped.strip() and not stripped.startswith("#") and len(stripped) < len(text):
            return text[: len(text) - len(stripped)]
    return "    "


def wrap_edits(ctx: Context, stmts: Sequence[ast.stmt], header: str) -> Optional[List[Edit]]:
    """Edits that put ``stmts`` (consecutive statements of one block) under ``header:``.

    The header goes on its own line where the first statement starts; every line of the
    statements gets one more level of indentation, except blank lines and lines that start
    inside a multi-line string. None where the first statement does not start its line
    (``if c: x``, ``a; x``).

    >>> ctx = Context("m.py", "def f():\\n    y = g()\\n    return y\\n")
    >>> body = ctx.tree.body[0].body
    >>> from safetorch.check.fixer import apply_fixes
    >>> from safetorch.check.engine import Fix
    >>> d = Diagnostic("m.py", 2, 5, 2, 5, "X", "", Fix("", tuple(wrap_edits(ctx, body, "with w"))))
    >>> print(apply_fixes(ctx.source, [d])[0], end="")
    def f():
        with w:
            y = g()
            return y
    """
    if not stmts:
        return None
    first_line, first_col = ctx.start(stmts[0])
    prefix = ctx.lines[first_line - 1][:first_col]
    if prefix.strip():
        return None
    last_line = ctx.end(stmts[-1])[0]
    unit = indent_unit(ctx)
    if "\t" in prefix and "\t" not in unit:
        unit = "\t"
    nl = newline(ctx)
    edits = [Edit(first_line, first_col, first_line, first_col, f"{header}:{nl}{prefix}{unit}")]
    skip = _string_lines(ctx, first_line, last_line)
    for line in range(first_line + 1, last_line + 1):
        if line in skip or not ctx.lines[line - 1].strip():
            continue
        edits.append(Edit(line, 0, line, 0, unit))
    return edits
