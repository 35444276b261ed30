"""The Python 3 values of ``torch._six``'s names and their modern spelling (torch-free).

One table for the ``legacy`` patch's report and ``st.legacy.six`` (``safetorch.legacy``) and
for the checker's ST018 messages (``safetorch.check``, which imports no torch).

>>> SIX_MODERN["string_classes"], SIX_MODERN["inf"]
('(str, bytes)', 'math.inf')
"""

from __future__ import annotations

from typing import Dict

__all__ = ["SIX_MODERN"]

# torch 1.5 lists the most names; 1.13 kept inf, nan, string_classes, PY37 and with_metaclass.
SIX_MODERN: Dict[str, str] = {
    "PY2": "False",
    "PY3": "True",
    "PY37": "sys.version_info >= (3, 7)",
    "inf": "math.inf",
    "nan": "math.nan",
    "string_classes": "(str, bytes)",
    "int_classes": "int",
    "container_abcs": "collections.abc",
    "FileNotFoundError": "FileNotFoundError",
    "queue": "queue",
    "builtins": "builtins",
    "with_metaclass": "class C(Base, metaclass=Meta)",
    "imap": "map",
    "exec_": "exec",
    "raise_from": "raise value from from_value",
    "get_function_from_type": "getattr(cls, name, None)",
    "StringIO": "io.StringIO",
    "istuple": "isinstance(obj, tuple)",
    "bind_method": "types.MethodType(fn, obj)",
}
