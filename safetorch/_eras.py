"""What says a file was written for torch <= 0.3: one pattern for the ``legacy`` patch (which
shims 0.3's results only in such a project) and for the ``safetorch check`` rules that rewrite
0.3's semantics (standard library only: the checker imports no torch)."""

from __future__ import annotations

import re

__all__ = ["ERA_0_3", "marks_0_3"]

#: A ``Variable`` built, named or imported; ``volatile=``.
ERA_0_3 = re.compile(
    rb"\bVariable\s*\(|\bautograd\.Variable\b|\bvolatile\s*="
    rb"|^\s*from\s+torch\.autograd\s+import[^\n]*\bVariable\b",
    re.M,
)


def marks_0_3(source: bytes) -> bool:
    """Whether ``source`` (a file's bytes) shows torch 0.3-era code.

    >>> marks_0_3(b"from torch.autograd import Variable\\n"), marks_0_3(b"x = y / 2\\n")
    (True, False)
    """
    return ERA_0_3.search(source) is not None
