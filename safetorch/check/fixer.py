"""Apply the rules' fixes: only the finding's span is rewritten, everything else is kept.

Edits are plain text replacements at positions the parser gave, so formatting and comments
outside (and inside) the span survive. Files are written atomically: a temporary file in the
same directory, then ``os.replace``.
"""

from __future__ import annotations

import difflib
from typing import Iterable, List, Tuple

from safetorch.check.engine import Diagnostic, Edit, split_lines

__all__ = ["apply_fixes", "unified_diff"]


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
