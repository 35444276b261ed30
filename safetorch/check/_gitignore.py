"""``.gitignore`` matching for ``safetorch check`` (standard library only, git not needed).

The rules are git's (gitignore(5)), as ruff applies them while walking: inside a git work tree
(a directory with a ``.git`` entry above or at the path), the patterns of ``.git/info/exclude``
and of every ``.gitignore`` from the work tree's root down to the file apply; a deeper file's
patterns override a shallower one's, and within a file the last matching pattern wins (``!``
re-includes). A pattern with a ``/`` before its end is relative to its file's directory,
otherwise it matches a name at any depth; a trailing ``/`` matches directories only; ``*``,
``?`` and ``[...]`` never match ``/``; ``**`` spans directories. An ignored directory is not
entered, so nothing below it can be re-included (as git). Outside a work tree nothing is
ignored. Not read: the global excludes file (``core.excludesFile``) and ``.ignore`` files.
"""

from __future__ import annotations

import os
import re
from typing import Dict, List, Optional, Pattern, Tuple

__all__: List[str] = []

# (regex on the path relative to the pattern's directory, negated, directories only)
_Rule = Tuple[Pattern[str], bool, bool]
# (the directory the patterns are relative to, its rules)
_RuleSet = Tuple[str, List[_Rule]]


def _translate(pattern: str) -> str:
    """The regex of one gitignore glob (no leading or trailing ``/``).

    >>> bool(re.fullmatch(_translate("a/**/b"), "a/x/y/b")), bool(re.fullmatch(_translate("*.py"), "d/x.py"))
    (True, False)
    """
    out: List[str] = []
    i, n = 0, len(pattern)
    while i < n:
        if pattern.startswith("**/", i) and (i == 0 or pattern[i - 1] == "/"):
            out.append("(?:.*/)?")
            i += 3
            continue
        if pattern.startswith("/**", i) and i + 3 == n:
            out.append("/.*")
            i += 3
            continue
        c = pattern[i]
        if c == "*":
            while i + 1 < n and pattern[i + 1] == "*":  # other runs of * are one *
                i += 1
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            end = pattern.find("]", i + 2 if pattern[i + 1 : i + 2] in ("!", "^", "]") else i + 1)
            if end < 0:
                out.append(re.escape(c))
            else:
                body = pattern[i + 1 : end]
                if body[:1] in ("!", "^"):
                    body = "^" + body[1:]
                out.append("(?!/)[" + body.replace("\\", "\\\\") + "]")
                i = end
        elif c == "\\" and i + 1 < n:
            i += 1
            out.append(re.escape(pattern[i]))
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


def parse(text: str) -> List[_Rule]:
    """The rules of one ``.gitignore`` file's text.

    >>> [(r.pattern, neg, d) for r, neg, d in parse("# build output\\nbuild/\\n!keep.py\\n")]
    [('(?:.*/)?build', False, True), ('(?:.*/)?keep\\\\.py', True, False)]
    """
    rules: List[_Rule] = []
    for raw in text.splitlines():
        line = raw.rstrip("\r")
        if not line or line.startswith("#"):
            continue
        # Trailing spaces are dropped unless escaped with a backslash.
        stripped = line.rstrip(" ")
        if stripped.endswith("\\") and len(stripped) < len(line):
            stripped += " "
        line = stripped
        negated = line.startswith("!")
        if negated:
            line = line[1:]
        elif line.startswith("\\!") or line.startswith("\\#"):
            line = line[1:]
        dir_only = line.endswith("/")
        line = line.rstrip("/")
        if not line:
            continue
        anchored = "/" in line
        body = _translate(line.lstrip("/"))
        regex = body if anchored else "(?:.*/)?" + body
        try:
            rules.append((re.compile(regex, re.DOTALL), negated, dir_only))
        except re.error:  # a malformed class: git ignores the pattern too
            continue
    return rules


def _read_rules(path: str) -> List[_Rule]:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return parse(handle.read())
    except OSError:
        return []


def work_tree_root(path: str) -> Optional[str]:
    """The nearest directory at or above ``path`` holding a ``.git`` entry, or ``None``."""
    here = os.path.abspath(path)
    if not os.path.isdir(here):
        here = os.path.dirname(here)
    while True:
        if os.path.exists(os.path.join(here, ".git")):
            return here
        parent = os.path.dirname(here)
        if parent == here:
            return None
        here = parent


class Matcher:
    """Answers "is this path ignored?" while a directory tree is walked top-down.

    ``enter(directory)`` reads the directory's ``.gitignore`` (once); ``ignored(path,
    is_dir)`` decides from every pattern that applies there. Outside a git work tree it
    ignores nothing.
    """

    def __init__(self) -> None:
        self._chains: Dict[str, List[_RuleSet]] = {}

    def _chain(self, directory: str) -> List[_RuleSet]:
        """The rule sets that apply inside ``directory`` (absolute), shallowest first."""
        found = self._chains.get(directory)
        if found is not None:
            return found
        root = work_tree_root(directory)
        if root is None:
            chain: List[_RuleSet] = []
        elif directory == root:
            chain = [(root, _read_rules(os.path.join(root, ".git", "info", "exclude")))]
            chain.append((root, _read_rules(os.path.join(root, ".gitignore"))))
        else:
            chain = list(self._chain(os.path.dirname(directory)))
            chain.append((directory, _read_rules(os.path.join(directory, ".gitignore"))))
        chain = [(base, rules) for base, rules in chain if rules]
        self._chains[directory] = chain
        return chain

    def ignored(self, path: str, is_dir: bool) -> bool:
        """Whether ``path`` itself matches (its parent directories are not looked at)."""
        path = os.path.abspath(path)
        verdict = False
        for base, rules in self._chain(os.path.dirname(path)):
            rel = os.path.relpath(path, base).replace(os.sep, "/")
            for regex, negated, dir_only in rules:
                if dir_only and not is_dir:
                    continue
                if regex.fullmatch(rel):
                    verdict = not negated
        return verdict

    def ignored_anywhere(self, path: str) -> bool:
        """Whether ``path`` or a directory above it (up to its work tree's root) is ignored:
        for paths named on the command line with ``--force-exclude``."""
        path = os.path.abspath(path)
        root = work_tree_root(path)
        if root is None:
            return False
        here = path
        while here != root and len(here) > len(root):
            if self.ignored(here, os.path.isdir(here)):
                return True
            here = os.path.dirname(here)
        return False
