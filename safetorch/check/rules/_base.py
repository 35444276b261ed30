"""The base of every rule: the engine's :class:`~safetorch.check.engine.Rule` plus its row.

A rule declares only what it finds: its code and name, the node types it visits, the torch
entry points it looks for, its fix facts, and its docstring (first paragraph: what it finds;
the rest: why it matters, the fix, the safetorch function), which is its documentation.
Everything about the pitfall comes from the rule's row of the pitfall table
(``safetorch._pitfalls.for_rule(code)``), set when the class is created:

- ``pitfall_id``: the row's id;
- ``pitfall``: the row's one-line problem;
- ``docs``: the absolute link to the row's documentation;
- ``safetorch``: the function of the row the rule points to: the row's first, or the one the
  rule picks with ``uses`` (checked to be one of the row's); None when the row has none.

Standard library only, like the rest of ``safetorch.check``.
"""

from __future__ import annotations

import inspect
import re
from typing import ClassVar, Dict, Optional

from safetorch import _pitfalls
from safetorch.check import engine

__all__ = ["DOCS_URL", "Rule", "docs_link", "pick", "plain_text", "summary"]

#: Where the documentation pages live: ``--explain`` prints absolute links into them.
DOCS_URL = _pitfalls.DOCS_BASE
_ROLE = re.compile(r":[a-z]+:`([^`]+)`")  # :class:`X` -> X
_LITERAL = re.compile(r"``(.+?)``", re.DOTALL)  # ``x`` -> `x`
_CODE_PREFIX = re.compile(r"^[A-Z]+\d+:\s*")  # "ST003: " at the start of a docstring


def plain_text(doc: str) -> str:
    """A rule docstring as plain text: reST literals and roles become plain backquotes.

    >>> plain_text("Use ``st.load`` (see :func:`st.load`).")
    'Use `st.load` (see `st.load`).'
    """
    return _LITERAL.sub(r"`\1`", _ROLE.sub(r"``\1``", doc))


def docs_link(relative: str) -> str:
    """``docs/nn.md#anchor`` -> the page's absolute address.

    >>> docs_link("docs/check.md#st003")
    'https://github.com/safetorch/safetorch/blob/main/docs/check.md#st003'
    """
    if "://" in relative:
        return relative
    return DOCS_URL + relative.lstrip("/")


def summary(doc: Optional[str]) -> str:
    """What a rule finds: the first paragraph of its docstring, on one line, as plain text,
    without the leading code.

    >>> summary('''ST007: an argparse positional with ``default=``
    ...     but no ``nargs``.
    ...
    ...     More.''')
    'an argparse positional with `default=` but no `nargs`.'
    """
    first = inspect.cleandoc(doc or "").split("\n\n", 1)[0]
    return _CODE_PREFIX.sub("", plain_text(" ".join(first.split())))


def _covers(function: str, name: str) -> bool:
    """Whether the row function ``function`` is ``name`` or its subpackage (``st.legacy``
    covers ``st.legacy.six``)."""
    return name == function or name.startswith(function + ".")


def pick(code: str, name: str) -> str:
    """``name`` when it is one of the functions of rule ``code``'s row (or under one of its
    subpackages); the way a rule names a particular function of its row.

    Raises:
        LookupError: The row does not list it.

    >>> pick("ST001", "st.upsample_bilinear"), pick("ST018", "st.legacy.six")
    ('st.upsample_bilinear', 'st.legacy.six')
    """
    row = _pitfalls.for_rule(code)
    if any(_covers(function, name) for function in row.functions):
        return name
    raise LookupError(f"{code}: {name} is not a function of pitfall {row.id!r} {row.functions}")


class Rule(engine.Rule):
    """A rule of ``safetorch check``: its pitfall facts are read from its row of the table.

    Subclasses set ``code``, ``name``, ``torch_symbols``, ``fixable``, ``fix_applicability``,
    ``preview``, ``node_types`` and, when the row's first function is not the one to point
    to, ``uses``; never ``pitfall_id``, ``pitfall``, ``docs`` or ``safetorch``.
    """

    #: The function of the row this rule points to: ``""`` for the row's first (None when the
    #: row has none), None for none of them, else one of the row's functions.
    uses: ClassVar[Optional[str]] = ""
    #: Whether the rule has a row in the pitfall table (only ST000 has not).
    has_row: ClassVar[bool] = True
    #: The row's absolute documentation link (``""`` without a row).
    docs: ClassVar[str] = ""
    #: torch entry point -> the function of the row for it, where it is not ``safetorch``.
    functions_by_symbol: ClassVar[Dict[str, str]] = {}

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if not cls.has_row:
            return
        row = _pitfalls.for_rule(cls.code)
        cls.pitfall_id = row.id
        cls.pitfall = row.problem
        cls.docs = docs_link(row.docs)
        if cls.uses == "":
            cls.safetorch = row.functions[0] if row.functions else None
        else:
            cls.safetorch = None if cls.uses is None else pick(cls.code, cls.uses)
        for function in cls.functions_by_symbol.values():
            pick(cls.code, function)
