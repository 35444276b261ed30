"""The other files of the project a checked file belongs to.

Some pitfalls are decided by code in another file: whether a checkpoint the project loads was
written by the project itself and holds only tensors, whether an init helper writes a bias,
whether every loader loads into a wrapped model. A rule asks :meth:`Project.facts` with a
``gather`` function that reads one file's syntax tree; the answer for every file of the
project is computed once per process and shared by every file checked in it.

The project of a file is the nearest directory above it holding ``pyproject.toml``,
``setup.py``, ``setup.cfg`` or ``.git``; without one, the directory named on the command
line the file was found under; without that, the file's own directory. A path that is not
a file on disk (stdin, a string in a test) is a project of that one file.

>>> import ast, os, tempfile
>>> d = tempfile.mkdtemp()
>>> for name, text in (("setup.py", ""), ("init.py", "m.bias.data.zero_()\\n"), ("train.py", "")):
...     with open(os.path.join(d, name), "w") as f:
...         _ = f.write(text)
>>> def writes_bias(tree, path):
...     return any(isinstance(n, ast.Attribute) and n.attr == "bias" for n in ast.walk(tree))
>>> p = Project.of(os.path.join(d, "train.py"))
>>> sorted(p.facts("writes-bias", writes_bias).items())
[('init.py', True), ('setup.py', False), ('train.py', False)]
"""

from __future__ import annotations

import ast
import os
import threading
from typing import Callable, Dict, Iterator, List, Optional, Tuple, TypeVar, Union

__all__ = ["MARKERS", "MAX_FILES", "Project", "parse"]

T = TypeVar("T")

#: Files whose directory is a project's root.
MARKERS = ("pyproject.toml", "setup.py", "setup.cfg", ".git")
#: A project with more Python files than this is read only this far (``complete`` is False).
MAX_FILES = 5000
_SKIP_DIRS = frozenset(
    {".git", ".hg", ".svn", ".tox", ".nox", ".venv", "venv", "env", "node_modules", "build"}
    | {"dist", "site-packages", "__pycache__", ".eggs", ".mypy_cache", ".pytest_cache"}
)
_PROJECTS: Dict[str, "Project"] = {}
_PARSING = threading.Lock()


def parse(source: Union[str, bytes], filename: str = "<unknown>") -> ast.Module:
    """``ast.parse(source, filename)``, one call at a time in this process.

    CPython 3.11 and 3.12 keep the counter that checks the depth of the tree being built in
    one per-interpreter place; two threads parsing at once can raise ``SystemError: AST
    constructor recursion depth mismatch`` (python/cpython#106905). Every parse of the checker
    goes through here, so ``check_source`` may be called from threads; parsing holds the GIL
    anyway, so the lock costs no parallelism.

    >>> type(parse("x = 1\\n", "a.py")).__name__
    'Module'
    """
    with _PARSING:
        return ast.parse(source, filename=filename)


def find_root(path: str, hint: Optional[str] = None) -> Optional[str]:
    """The project root of the file ``path`` (see the module docstring); None off disk.

    >>> find_root("<string>") is None
    True
    """
    full = os.path.abspath(path)
    if not os.path.isfile(full):
        return None
    here = os.path.dirname(full)
    while True:
        if any(os.path.exists(os.path.join(here, m)) for m in MARKERS):
            return here
        parent = os.path.dirname(here)
        if parent == here:
            break
        here = parent
    if hint is not None and os.path.isdir(hint):
        return os.path.abspath(hint)
    return os.path.dirname(full)


class Project:
    """The Python files under one root, parsed on first use, with facts gathered from them.

    Attributes:
        root: The project's directory (None for a project of one file off disk).

    ``complete`` is False when the project has more than ``MAX_FILES`` files and only the
    first were read; a rule that needs every file to prove something safe must then not.
    """

    def __init__(self, root: Optional[str]) -> None:
        self.root = root
        self._complete = True
        self._paths: Optional[List[str]] = None
        self._trees: Dict[str, Optional[ast.Module]] = {}
        self._facts: Dict[str, Dict[str, object]] = {}

    @classmethod
    def of(cls, path: str, hint: Optional[str] = None) -> "Project":
        """The (shared) project of the file ``path``; ``hint`` is the directory it was named
        under on the command line."""
        root = find_root(path, hint)
        if root is None:
            return cls(None)
        found = _PROJECTS.get(root)
        if found is None:
            found = _PROJECTS[root] = cls(root)
        return found

    @property
    def complete(self) -> bool:
        """False when the project has more than ``MAX_FILES`` Python files (only the first
        were read)."""
        self.paths()
        return self._complete

    def relpath(self, path: str) -> str:
        """``path`` relative to the root (as :meth:`facts` keys name files)."""
        if self.root is None:
            return path
        return os.path.relpath(os.path.abspath(path), self.root)

    def paths(self) -> List[str]:
        """Every ``.py`` file of the project, relative to the root, sorted."""
        if self._paths is None:
            self._paths = [] if self.root is None else self._walk(self.root)
        return self._paths

    def _walk(self, root: str) -> List[str]:
        found: List[str] = []
        for here, dirs, files in os.walk(root):
            dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS and not d.endswith(".egg-info"))
            for name in sorted(files):
                if name.endswith(".py"):
                    if len(found) >= MAX_FILES:
                        self._complete = False
                        return found
                    found.append(os.path.relpath(os.path.join(here, name), root))
        return found

    def trees(self) -> Iterator[Tuple[str, ast.Module]]:
        """(relative path, syntax tree) of every file that parses."""
        assert self.root is not None or not self.paths()
        for rel in self.paths():
            if rel not in self._trees:
                self._trees[rel] = _parse(os.path.join(self.root or "", rel))
            tree = self._trees[rel]
            if tree is not None:
                yield rel, tree

    def facts(self, key: str, gather: Callable[[ast.Module, str], T]) -> Dict[str, T]:
        """``gather(tree, relative path)`` for every file of the project, computed once per
        ``key``; files that do not parse are left out."""
        found = self._facts.get(key)
        if found is None:
            found = self._facts[key] = {rel: gather(tree, rel) for rel, tree in self.trees()}
        return found  # type: ignore[return-value]  # one gather per key, so one T per key


def _parse(path: str) -> Optional[ast.Module]:
    try:
        with open(path, "rb") as f:
            data = f.read()
        return parse(data, path)
    except (OSError, SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def clear() -> None:
    """Forget every project read in this process (for tests and long-lived processes)."""
    _PROJECTS.clear()
