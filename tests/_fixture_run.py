"""Helpers shared by the fixture tests (``from _fixture_run import ...``): the ``# expect:``
annotations of a fixture, and a fixture executed with or without the ``legacy`` patch.

``tests/conftest.py`` puts this folder on ``sys.path``.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import safetorch as st

__all__ = ["expected_codes", "run_fixture"]


def expected_codes(source: str, pattern: "re.Pattern[str]") -> List[Tuple[int, str]]:
    """``(line, code)`` for every code of every ``# expect:`` comment ``pattern`` matches
    (its group 1 holds the space-separated codes), sorted."""
    found = []
    for number, line in enumerate(source.splitlines(), start=1):
        match = pattern.search(line)
        if match:
            found.extend((number, code) for code in match.group(1).split())
    return sorted(found)


def run_fixture(path: Path, patched: bool, workdir: Optional[Path] = None) -> Dict[str, Any]:
    """Execute the fixture ``path`` as a script (``__name__ == "fixture"``; with ``workdir``,
    ``__file__`` names the file there, so what it writes beside itself lands in ``workdir``),
    under ``st.patched("legacy")`` when ``patched``, warnings silenced; its globals."""
    scope: Dict[str, Any] = {"__name__": "fixture"}
    if workdir is not None:
        scope["__file__"] = str(workdir / path.name)
    code = compile(path.read_text(), str(path), "exec")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if patched:
            with st.patched("legacy"):
                exec(code, scope)
        else:
            exec(code, scope)
    return scope
