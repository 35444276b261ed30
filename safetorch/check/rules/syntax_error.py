"""ST000: a file that does not parse (reported by the engine; not a pitfall)."""

from __future__ import annotations

from safetorch.check.engine import SYNTAX_ERROR_CODE
from safetorch.check.rules._base import Rule


class SyntaxErrorRule(Rule):
    """ST000: the file does not parse.

    Reported with the parser's message at its position; the other files are still checked.
    Nothing else is reported for this file. Where the error is evidently syntax newer than
    the Python running the checker (Python 3.12's f-strings that reuse their quotes inside,
    type parameters ``def f[T]`` / ``type X = ...``), the message says the file was not
    checked and to run the checker with a newer Python, rather than calling the code broken.

    safetorch: none.
    """

    code = SYNTAX_ERROR_CODE
    name = "syntax-error"
    has_row = False  # a file that does not parse is not a pitfall
    pitfall = "the file is not valid Python"
    torch_symbols = ()
