"""Text from files, made safe to print: the one escaping every ``safetorch`` command applies.

A checkpoint's key names, metadata values and file names are the file author's text. Printed
raw, ``"\\x1b[2J"`` clears the user's terminal, ``"\\r"`` overwrites the start of the line (a
``values differ: w`` line made to read ``identical``), ``"\\x07"`` rings the bell, and
``"\\u202e"`` (RIGHT-TO-LEFT OVERRIDE) shows ``exe.pt`` for ``tp.exe``. :func:`escape` replaces
every character that could act on a terminal instead of showing as itself with the escape
``repr()`` writes for it (``\\x1b``, ``\\r``, ``\\u202e``): the characters ``str.isprintable``
calls non-printable, which are

* ``Cc``: the C0 controls (``\\x00``-``\\x1f``: ESC, CR, BEL, BS, ...), DEL and the C1 controls
  (``\\x80``-``\\x9f``, including the one-byte CSI ``\\x9b``);
* ``Cf``: format characters: the bidi embeddings, overrides and isolates (U+202A-U+202E,
  U+2066-U+2069), the marks U+200E/U+200F/U+061C, zero-width joiners and spaces, U+FEFF;
* ``Zl``/``Zp`` (U+2028/U+2029, line breaks to some terminals) and spaces other than
  U+0020 (which can pad a name to look like another);
* ``Cs``: lone surrogates, which ``os.fsdecode`` makes of undecodable bytes in a file name
  (printed raw they raise ``UnicodeEncodeError``); ``Co``/``Cn``: private and unassigned
  code points.

Letters, digits, punctuation and symbols of every script are kept, so names in any language
read as they are. Backslashes are kept too: the escaped form is for reading, not reversible
(``--json`` output is exact: ``json.dumps`` escapes every control character itself).

>>> escape("w\\x1b[31m\\r\\x07\\u202e.pt")
'w\\\\x1b[31m\\\\r\\\\x07\\\\u202e.pt'
>>> escape("layer.0.weight"), escape("poids_ñ_权重")
('layer.0.weight', 'poids_ñ_权重')
"""

from __future__ import annotations

from typing import Any

__all__ = ["escape", "escape_all"]


def escape(text: Any, keep: str = "") -> str:
    """``text`` (``str()`` of it) with every non-printable character written as ``repr()``
    writes it; the characters in ``keep`` (e.g. ``"\\n"`` for a multi-line report we wrote)
    pass through.

    >>> escape("a\\tb\\nc", keep="\\n")
    'a\\\\tb\\nc'
    >>> escape(3)
    '3'
    """
    text = text if isinstance(text, str) else str(text)
    if text.isprintable():  # the common case: one C-level scan, no copy
        return text
    return "".join(
        c if c.isprintable() or c in keep else repr(c)[1:-1].replace("\\\\", "\\") for c in text
    )


def escape_all(value: Any) -> Any:
    """``value`` with :func:`escape` applied to every string in it (dict keys too), through
    dicts, lists and tuples; other values as they are.

    >>> escape_all({"k\\x1b": ["v\\r", 1, None]})
    {'k\\\\x1b': ['v\\\\r', 1, None]}
    """
    if isinstance(value, str):
        return escape(value)
    if isinstance(value, dict):
        return {escape_all(k): escape_all(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(escape_all(v) for v in value)
    return value
