"""``[tool.safetorch]`` in ``pyproject.toml``: the checker's project settings.

Read with ``tomllib`` (Python 3.11+) or ``tomli`` when installed (``pip install
safetorch[toml]`` on 3.9/3.10); without either the file is ignored with a one-line warning.
Standard library only otherwise, like the rest of ``safetorch.check``.

Keys (ruff's names)::

    [tool.safetorch]
    select = ["ST"]                 # codes or prefixes to run (default: all)
    ignore = ["ST013"]              # codes or prefixes to skip
    extend-exclude = ["legacy/", "gen_*.py"]   # paths skipped while walking
    min-torch-version = "2.1"       # oldest torch the code supports (default: from
                                    # [project] dependencies "torch>=X", else unknown)
    respect-gitignore = true        # skip what .gitignore ignores (the default)

    [tool.safetorch.per-file-ignores]
    "tests/*" = ["ST003", "ST004"]

Those are the only tables read. A ``[tool.*]`` table whose name is close to ``safetorch``
(``[tool.safetorc]``, ``[tool.safe-torch]``, ``[tool.safetorch-check]``: it starts with
``safetorch`` or differs from it by a letter or two) is a typo that would skip the settings
silently: it is named in a warning.
"""

from __future__ import annotations

import difflib
import fnmatch
import os
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from safetorch.check.engine import parse_codes

__all__ = [
    "ConfigError",
    "Settings",
    "find_config",
    "find_config_and_warnings",
    "load_settings",
    "parse_version",
]

_KEYS = frozenset(
    {
        "select",
        "ignore",
        "per-file-ignores",
        "extend-exclude",
        "min-torch-version",
        "respect-gitignore",
    }
)
_TABLE = "safetorch"
# `[tool.NAME]` / `[tool.NAME.sub]` / `[[tool.NAME]]` headers, and `tool.NAME.x = ...` dotted keys.
_TOOL_TABLE = re.compile(r"^\s*\[{1,2}\s*tool\.\s*\"?([A-Za-z0-9_-]+)", re.MULTILINE)
_TORCH_REQ = re.compile(r"^\s*torch\s*(?:\[[^\]]*\])?\s*(?P<spec>[^;]*)")
_LOWER_BOUND = re.compile(r"(>=|==|~=|>)\s*(\d+)(?:\.(\d+))?")


class ConfigError(ValueError):
    """``[tool.safetorch]`` holds something the checker cannot use (exit status 2)."""


@dataclass(frozen=True)
class Settings:
    """The checker's settings for one run.

    Attributes:
        root: Directory that relative patterns are matched from (the config file's).
        path: The ``pyproject.toml`` read, or None.
        select: Codes or prefixes to run (None: all).
        ignore: Codes or prefixes to skip.
        per_file_ignores: ``(glob, codes)`` pairs.
        extend_exclude: Globs of paths skipped while walking directories.
        min_torch: Oldest supported torch as ``(major, minor)``, or None when unknown.
        respect_gitignore: ``respect-gitignore`` (None: not set; the command's default is on).

    >>> s = Settings(per_file_ignores=(("tests/*", ("ST003",)),))
    >>> s.ignores_for("tests/test_a.py"), s.ignores_for("src/a.py")
    (('ST003',), ())
    """

    root: str = "."
    path: Optional[str] = None
    select: Optional[Tuple[str, ...]] = None
    ignore: Tuple[str, ...] = ()
    per_file_ignores: Tuple[Tuple[str, Tuple[str, ...]], ...] = ()
    extend_exclude: Tuple[str, ...] = ()
    min_torch: Optional[Tuple[int, int]] = None
    respect_gitignore: Optional[bool] = None
    warnings: Tuple[str, ...] = field(default=(), compare=False)

    def _relative(self, path: str) -> str:
        try:
            rel = os.path.relpath(os.path.abspath(path), os.path.abspath(self.root))
        except ValueError:  # another drive on Windows
            rel = path
        return rel.replace(os.sep, "/")

    def ignores_for(self, path: str) -> Tuple[str, ...]:
        """The codes ``per-file-ignores`` turns off for ``path``."""
        if not self.per_file_ignores:
            return ()
        rel = self._relative(path)
        base = os.path.basename(path)
        codes: List[str] = []
        for pattern, pattern_codes in self.per_file_ignores:
            if _matches(rel, base, pattern):
                codes.extend(pattern_codes)
        return tuple(codes)

    def excluded(self, path: str) -> bool:
        """Whether ``extend-exclude`` matches ``path`` (a file or a directory)."""
        if not self.extend_exclude:
            return False
        rel = self._relative(path)
        base = os.path.basename(os.path.normpath(path))
        return any(_matches(rel, base, p.rstrip("/")) for p in self.extend_exclude)


def _matches(rel: str, base: str, pattern: str) -> bool:
    pattern = pattern[2:] if pattern.startswith("./") else pattern
    if fnmatch.fnmatchcase(rel, pattern) or fnmatch.fnmatchcase(base, pattern):
        return True
    # A directory pattern also covers everything under it.
    return rel.startswith(pattern.rstrip("/") + "/")


def parse_version(text: str) -> Tuple[int, int]:
    """``"2.1"`` / ``"2.1.0"`` / ``"2"`` -> ``(2, 1)``.

    Raises:
        ConfigError: Not a version.

    >>> parse_version("2.6.0"), parse_version("1")
    ((2, 6), (1, 0))
    """
    match = re.fullmatch(r"\s*(\d+)(?:\.(\d+))?(?:\.\d+)*\s*", str(text))
    if match is None:
        raise ConfigError(f"min-torch-version: expected a version such as '2.1', got {text!r}")
    return int(match.group(1)), int(match.group(2) or 0)


def _torch_floor(dependencies: Any) -> Optional[Tuple[int, int]]:
    """The lower bound of ``torch`` in ``[project] dependencies`` (``torch>=1.13`` -> (1, 13))."""
    if not isinstance(dependencies, list):
        return None
    for dep in dependencies:
        match = _TORCH_REQ.match(dep) if isinstance(dep, str) else None
        if match is None or not dep.strip().lower().startswith("torch"):
            continue
        rest = dep.strip()[len("torch") :]
        if rest[:1] not in ("", " ", "[", ">", "=", "~", "<", "!", ";"):
            continue  # torchvision, torchaudio, ...
        bound = _LOWER_BOUND.search(match.group("spec"))
        if bound:
            return int(bound.group(2)), int(bound.group(3) or 0)
    return None


def _load_toml(path: str) -> Tuple[Optional[Dict[str, Any]], Optional[str]]:
    """(data, warning): the parsed file, or None and why it was skipped."""
    try:
        import tomllib as toml  # Python 3.11+
    except ImportError:
        try:
            import tomli as toml  # type: ignore[no-redef]  # tomli is tomllib's backport: the same module interface
        except ImportError:
            return None, (
                f"{path}: not read (Python < 3.11 needs tomli: pip install 'safetorch[toml]')"
            )
    with open(path, "rb") as handle:
        try:
            return toml.load(handle), None
        except toml.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: invalid TOML: {exc}") from None


def is_near_miss(name: str) -> bool:
    """Whether ``[tool.<name>]`` looks like a mistyped ``[tool.safetorch]``.

    >>> [n for n in ("safetorc", "safe-torch", "safetorch-check", "safety", "torch", "safetorch")
    ...  if is_near_miss(n)]
    ['safetorc', 'safe-torch', 'safetorch-check']
    """
    low = name.lower()
    if low == _TABLE:
        return False
    return low.startswith(_TABLE) or difflib.SequenceMatcher(None, low, _TABLE).ratio() >= 0.8


def _near_miss_warnings(path: str, names: Any) -> List[str]:
    return [
        f"{path}: [tool.{name}] is not a table safetorch reads (did you mean "
        f"[tool.{_TABLE}]?); its settings are ignored. safetorch check reads [tool.{_TABLE}] "
        f"and [tool.{_TABLE}.per-file-ignores]"
        for name in sorted(set(names))
        if is_near_miss(str(name))
    ]


def find_config_and_warnings(start: str) -> Tuple[Optional[str], List[str]]:
    """The nearest ``pyproject.toml`` with a ``[tool.safetorch]`` table, from ``start`` up,
    and a warning for each mistyped table (:func:`is_near_miss`) in the files passed on the way
    (a file with only ``[tool.safetorc]`` is skipped, as it would be silently).

    A cheap text test picks candidates, so directories without the table cost one read.
    """
    here = os.path.abspath(start)
    if not os.path.isdir(here):
        here = os.path.dirname(here)
    warnings: List[str] = []
    while True:
        candidate = os.path.join(here, "pyproject.toml")
        if os.path.isfile(candidate):
            try:
                with open(candidate, encoding="utf-8", errors="replace") as handle:
                    names = _TOOL_TABLE.findall(handle.read())
            except OSError:
                names = []
            if _TABLE in names:
                return candidate, warnings  # load_settings warns about the file it reads
            warnings += _near_miss_warnings(candidate, names)
        parent = os.path.dirname(here)
        if parent == here:
            return None, warnings
        here = parent


def find_config(start: str) -> Optional[str]:
    """The nearest ``pyproject.toml`` with a ``[tool.safetorch]`` table, from ``start`` up
    (:func:`find_config_and_warnings` without the warnings)."""
    return find_config_and_warnings(start)[0]


def _codes(table: Dict[str, Any], key: str, path: str) -> Tuple[str, ...]:
    value = table.get(key, [])
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{path}: [tool.safetorch] {key} must be a list of rule codes")
    return parse_codes(value) or ()


def load_settings(config: Optional[str]) -> Settings:
    """Read ``[tool.safetorch]`` from ``config`` (a pyproject.toml path) into ``Settings``.

    Args:
        config: The file, or None for the defaults.

    Raises:
        ConfigError: Unknown keys or values of the wrong type.

    >>> import pathlib, tempfile
    >>> p = pathlib.Path(tempfile.mkdtemp(), "pyproject.toml")
    >>> _ = p.write_text('[project]\\ndependencies = ["torch>=2.1"]\\n[tool.safetorch]\\nignore = ["ST013"]\\n')
    >>> s = load_settings(str(p)); (s.ignore, s.min_torch)
    (('ST013',), (2, 1))
    """
    if config is None:
        return Settings()
    data, warning = _load_toml(config)
    root = os.path.dirname(os.path.abspath(config))
    if data is None:
        return Settings(root=root, warnings=(warning,) if warning else ())
    tool = data.get("tool", {})
    near_misses = tuple(_near_miss_warnings(config, tool if isinstance(tool, dict) else ()))
    table = tool.get("safetorch", {}) if isinstance(tool, dict) else {}
    if not isinstance(table, dict):
        raise ConfigError(f"{config}: [tool.safetorch] must be a table")
    unknown = sorted(set(table) - _KEYS)
    if unknown:
        raise ConfigError(
            f"{config}: unknown key(s) in [tool.safetorch]: {', '.join(unknown)} "
            f"(expected {', '.join(sorted(_KEYS))})"
        )
    select = _codes(table, "select", config) if "select" in table else None
    per_file = table.get("per-file-ignores", {})
    if not isinstance(per_file, dict):
        raise ConfigError(f"{config}: [tool.safetorch] per-file-ignores must be a table")
    pairs = tuple(
        (str(pattern), _codes({"codes": codes}, "codes", config))
        for pattern, codes in per_file.items()
    )
    exclude = table.get("extend-exclude", [])
    if not isinstance(exclude, list) or not all(isinstance(e, str) for e in exclude):
        raise ConfigError(f"{config}: [tool.safetorch] extend-exclude must be a list of paths")
    if "min-torch-version" in table:
        min_torch: Optional[Tuple[int, int]] = parse_version(table["min-torch-version"])
    else:
        min_torch = _torch_floor(data.get("project", {}).get("dependencies"))
    respect = table.get("respect-gitignore")
    if respect is not None and not isinstance(respect, bool):
        raise ConfigError(
            f"{config}: [tool.safetorch] respect-gitignore must be true or false, got {respect!r}"
        )
    return Settings(
        root=root,
        path=config,
        select=select,
        ignore=_codes(table, "ignore", config),
        per_file_ignores=pairs,
        extend_exclude=tuple(exclude),
        min_torch=min_torch,
        respect_gitignore=respect,
        warnings=near_misses,
    )
