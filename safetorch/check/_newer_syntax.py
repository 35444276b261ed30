"""Whether a syntax error is Python 3.12 syntax the running Python cannot read (ST000's
message): f-strings of PEP 701 (quotes reused inside, a backslash or a comment in the braces)
and type parameters of PEP 695 (``def f[T]``, ``class C[T]``, ``type X = ...``).

Decided by feature detection (what the running parser accepts), never by a version check, and
verified on the code itself: an f-string is taken for PEP 701 only when a scanner that follows
PEP 701's grammar closes it and every expression in its braces parses; a type-parameter line
only when the file parses, at that line, with the parameters left out. Code that no Python
parses keeps its plain syntax error.

Standard library only, like the rest of ``safetorch.check``.

>>> bool(NEWER_FSTRINGS) == (not parses('f"{d["k"]}"'))
True
"""

from __future__ import annotations

import re
from typing import Optional, Tuple

from safetorch.check.project import parse

__all__ = ["NEWER_FSTRINGS", "NEWER_TYPE_PARAMS", "newer_syntax", "parses"]


def parses(source: str) -> bool:
    """Whether the running Python parses ``source``."""
    try:
        parse(source)
    except (SyntaxError, ValueError):
        return False
    return True


#: The running Python cannot read PEP 701 f-strings / PEP 695 type parameters.
NEWER_FSTRINGS = not parses('f"{d["k"]}"')
NEWER_TYPE_PARAMS = not parses("def f[T](x: T) -> T: return x\ntype P = int")

_FSTRING_START = re.compile(r"(?<![\w'\"])[rR]?[fF][rR]?(\"\"\"|'''|\"|')")
_TYPE_PARAMS = (
    re.compile(r"^(\s*(?:async\s+)?def\s+\w+\s*)\[[^\]]*\](\s*\()"),
    re.compile(r"^(\s*class\s+\w+\s*)\[[^\]]*\]"),
    re.compile(r"^(\s*)type\s+(\w+)\s*(?:\[[^\]]*\])?\s*(=)"),
)


def _skip_string(text: str, i: int) -> Optional[int]:
    """The index after the string literal starting at quote ``text[i]`` (None: unclosed)."""
    quote = text[i : i + 3] if text[i : i + 3] in ('"""', "'''") else text[i]
    j = i + len(quote)
    while j < len(text):
        if text[j] == "\\":
            j += 2
            continue
        if text.startswith(quote, j):
            return j + len(quote)
        if len(quote) == 1 and text[j] == "\n":
            return None
        j += 1
    return None


def _field(text: str, k: int) -> Optional[Tuple[str, int]]:
    """(expression, index after the closing ``}``) of the replacement field whose expression
    starts at ``k``: brackets, nested strings of any quote and a format spec followed."""
    depth, start = 0, k
    while k < len(text):
        ch = text[k]
        if ch in "'\"":
            end = _skip_string(text, k)
            if end is None:
                return None
            k = end
            continue
        if ch == "#":
            newline = text.find("\n", k)
            if newline < 0:
                return None
            k = newline
            continue
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            if depth == 0:
                break
            depth -= 1
        elif depth == 0 and ch == "!" and text[k + 1 : k + 2] != "=":
            break
        elif depth == 0 and ch == ":":
            break
        k += 1
    if k >= len(text):
        return None
    expr = text[start:k]
    nested = 0
    while k < len(text):  # the conversion and format spec, up to the matching brace
        ch = text[k]
        if ch == "{":
            nested += 1
        elif ch == "}":
            if nested == 0:
                return expr, k + 1
            nested -= 1
        k += 1
    return None


def _fstring_312(text: str, i: int, quote: str) -> Tuple[Optional[int], bool]:
    """Scan the f-string whose quote starts at ``i`` by PEP 701's grammar: (index after it or
    None where it does not close or an expression does not parse, whether it needs 3.12)."""
    j, newer = i + len(quote), False
    while j < len(text):
        if text.startswith(quote, j):
            return j + len(quote), newer
        ch = text[j]
        if ch == "\\":
            j += 2
        elif ch == "{" and text[j + 1 : j + 2] == "{":
            j += 2
        elif ch == "{":
            found = _field(text, j + 1)
            if found is None:
                return None, False
            expr, j = found
            body = expr.strip()
            body = body[:-1] if body.endswith("=") and not body.endswith("==") else body
            if not body or not parses("(" + body + "\n)"):
                return None, False
            if quote[0] in expr or "\\" in expr or "#" in expr or "\n" in expr:
                newer = True
        elif ch == "}" and text[j + 1 : j + 2] == "}":
            j += 2
        elif ch == "}" or (len(quote) == 1 and ch == "\n"):
            return None, False
        else:
            j += 1
    return None, False


def _newer_fstring(source: str, lineno: int) -> bool:
    """An f-string starting on line ``lineno`` is well-formed PEP 701 syntax that needs it."""
    lines = source.splitlines(keepends=True)
    if not 0 < lineno <= len(lines):
        return False
    offset = sum(len(line) for line in lines[: lineno - 1])
    found = False
    for match in _FSTRING_START.finditer(lines[lineno - 1]):
        end, newer = _fstring_312(source, offset + match.start(1), match.group(1))
        if end is None:
            return False  # an f-string on the line that no Python reads
        found = found or newer
    return found


def _without_type_params(source: str, lineno: int) -> Optional[int]:
    """The line of the first syntax error once the type parameters of line ``lineno`` are left
    out (0 where the file then parses); None where the line has none."""
    lines = source.splitlines(keepends=True)
    if not 0 < lineno <= len(lines):
        return None
    line = lines[lineno - 1]
    for pattern in _TYPE_PARAMS:
        if pattern.search(line):
            lines[lineno - 1] = pattern.sub(
                lambda m: "".join(g for g in m.groups() if g is not None), line, count=1
            )
            try:
                parse("".join(lines))
            except SyntaxError as exc:
                return exc.lineno or 0
            return 0
    return None


_STRING_ERRORS = (
    "f-string",
    "unterminated string literal",
    "unterminated triple-quoted string literal",
    "EOL while scanning string literal",
    "EOF while scanning triple-quoted string literal",
)


def newer_syntax(source: str, lineno: int, msg: str) -> Optional[str]:
    """What Python 3.12 syntax the error at ``lineno`` is, verified on the code; None for code
    no Python parses (or a Python that reads 3.12 syntax)."""
    # Python 3.9 words an unterminated string "EOL while scanning string literal" (3.10+
    # "unterminated string literal"): the f-string with a comment inside stops there.
    fstring = msg.startswith(_STRING_ERRORS)
    if NEWER_FSTRINGS and fstring and _newer_fstring(source, lineno):
        return "an f-string reusing its quotes, or with a backslash or a comment, inside"
    if NEWER_TYPE_PARAMS:
        after = _without_type_params(source, lineno)
        if after is not None and after != lineno:
            return "type parameters (def f[T], class C[T], type X = ...)"
    return None
