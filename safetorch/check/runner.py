"""Check sources and files: the public API of ``safetorch check`` and its file walking."""

from __future__ import annotations

import ast
import contextlib
import gc
import io
import os
import sys
import tokenize
import warnings
from dataclasses import dataclass, field
from typing import Iterable, Iterator, List, Optional, Sequence, Tuple, Type, Union

from safetorch._atomic import atomic_write_text
from safetorch.check.engine import SYNTAX_ERROR_CODE, Diagnostic, Rule, analyze
from safetorch.check.fixer import apply_fixes
from safetorch.check.rules import select_rules

__all__ = [
    "DEFAULT_EXCLUDES",
    "FileResult",
    "check_file",
    "check_paths",
    "check_source",
    "fix_source",
    "iter_python_files",
]

#: Directory names never descended into when walking a directory.
DEFAULT_EXCLUDES = frozenset(
    {
        ".git",
        ".hg",
        ".svn",
        ".venv",
        "venv",
        ".tox",
        ".nox",
        ".eggs",
        "build",
        "dist",
        "__pycache__",
        ".mypy_cache",
        ".pytest_cache",
        ".ruff_cache",
        "node_modules",
        "site-packages",
    }
)
_MAX_FIX_PASSES = 8
Codes = Union[str, Iterable[str], None]


def _select(select: Codes, ignore: Codes) -> Tuple[Tuple[Type[Rule], ...], bool]:
    return select_rules(select, ignore)


def check_source(
    source: str,
    path: str = "<string>",
    select: Codes = None,
    ignore: Codes = None,
) -> List[Diagnostic]:
    """Check Python source text.

    Args:
        source: The code.
        path: The name findings are reported under.
        select: Rule codes or prefixes to run (``"ST003,ST004"`` or a list); default all.
        ignore: Rule codes or prefixes to skip.

    Returns:
        The findings not suppressed by ``# noqa``, sorted by position.

    Raises:
        ValueError: An unknown rule code in ``select`` or ``ignore``.

    >>> src = "import torch\\nsd = torch.load('ckpt.pt', map_location='cpu')\\n"
    >>> [str(d) for d in check_source(src, "train.py")]
    ['train.py:2:6: ST003 torch.load without weights_only can execute code from the file: pass weights_only=True or use st.load']
    """
    rules, syntax = _select(select, ignore)
    return analyze(source, path, rules, keep_syntax_errors=syntax)


def _fix(
    source: str, path: str, rules: Sequence[Type[Rule]], syntax: bool
) -> Tuple[str, List[Diagnostic], int]:
    """Fix until nothing changes; return (source, remaining findings, fixes applied)."""
    applied_total = 0
    found = analyze(source, path, rules, keep_syntax_errors=syntax)
    for _ in range(_MAX_FIX_PASSES):
        fixed, applied = apply_fixes(source, found)
        if not applied or fixed == source:
            break
        try:
            ast.parse(fixed)
        except (SyntaxError, ValueError):  # never hand back a file that no longer parses
            break
        source, applied_total = fixed, applied_total + applied
        found = analyze(source, path, rules, keep_syntax_errors=syntax)
    return source, found, applied_total


def fix_source(
    source: str,
    path: str = "<string>",
    select: Codes = None,
    ignore: Codes = None,
) -> str:
    """Apply every automatic fix to ``source`` and return the fixed text.

    Only the span of each finding changes; running it again changes nothing.

    Args:
        source: The code.
        path: The name used in messages.
        select: Rule codes or prefixes whose fixes to apply; default all.
        ignore: Rule codes or prefixes to leave alone.

    Returns:
        The fixed source (``source`` itself when nothing is fixable).

    Raises:
        ValueError: An unknown rule code in ``select`` or ``ignore``.

    >>> print(fix_source("import torch.nn.functional as F\\ny = F.upsample_bilinear(x, scale_factor=2)\\n"))
    import torch.nn.functional as F
    y = F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=True)
    <BLANKLINE>
    """
    rules, syntax = _select(select, ignore)
    return _fix(source, path, rules, syntax)[0]


def iter_python_files(
    paths: Iterable[str], excludes: Iterable[str] = DEFAULT_EXCLUDES
) -> Iterator[str]:
    """The ``.py`` files under ``paths``, in a stable order.

    Files named explicitly are always yielded; directories are walked, skipping the names in
    ``excludes`` (and ``*.egg-info``).

    Args:
        paths: Files and directories.
        excludes: Directory names to skip while walking.

    Raises:
        FileNotFoundError: A path that does not exist.

    >>> import os, tempfile
    >>> d = tempfile.mkdtemp(); os.makedirs(os.path.join(d, ".venv"))
    >>> for name in ("a.py", os.path.join(".venv", "b.py")):
    ...     open(os.path.join(d, name), "w").close()
    >>> [os.path.basename(p) for p in iter_python_files([d])]
    ['a.py']
    """
    skip = frozenset(excludes)
    for path in paths:
        if os.path.isdir(path):
            for root, dirs, files in os.walk(path):
                dirs[:] = sorted(d for d in dirs if d not in skip and not d.endswith(".egg-info"))
                for name in sorted(files):
                    if name.endswith(".py"):
                        yield os.path.join(root, name)
        elif os.path.isfile(path):
            yield path
        else:
            raise FileNotFoundError(f"no such file or directory: {path!r}")


def _read(path: str) -> Tuple[str, str]:
    """(text, encoding), honouring a PEP 263 coding line; newlines kept as they are."""
    with open(path, "rb") as handle:
        data = handle.read()
    encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    return data.decode(encoding), encoding  # utf-8-sig strips the BOM (and writes it back)


@dataclass
class FileResult:
    """What checking one file found, and what fixing it did.

    Attributes:
        path: The file.
        diagnostics: Findings left after fixing (all findings when not fixing).
        fixed: Number of fixes applied (or, with ``write=False``, that would be).
        before: The original text (only when fixing).
        after: The fixed text (only when fixing).
    """

    path: str
    diagnostics: List[Diagnostic] = field(default_factory=list)
    fixed: int = 0
    before: Optional[str] = None
    after: Optional[str] = None


def check_file(
    path: str,
    select: Codes = None,
    ignore: Codes = None,
    fix: bool = False,
    write: bool = False,
) -> FileResult:
    """Check one file; with ``fix`` compute its fixed text, with ``write`` also save it.

    A file that cannot be read or decoded is reported as ST000, like a syntax error.

    Args:
        path: The file.
        select: Rule codes or prefixes to run.
        ignore: Rule codes or prefixes to skip.
        fix: Apply the automatic fixes (in memory).
        write: Write the fixed text back (atomically); needs ``fix``.

    Returns:
        A ``FileResult``.

    >>> import pathlib, tempfile
    >>> p = pathlib.Path(tempfile.mkdtemp(), "m.py")
    >>> _ = p.write_text("y = x.detach().add_(1)\\n")
    >>> r = check_file(str(p), fix=True, write=True); (r.fixed, p.read_text())
    (1, 'y = x.detach().clone().add_(1)\\n')
    """
    with _gc_paused():
        return _check_file(path, select, ignore, fix, write)


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while one file is checked.

    Syntax trees are many small objects without reference cycles (freed by reference
    counting), yet their allocation keeps triggering collections: pausing them makes
    checking about a third faster.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _check_file(path: str, select: Codes, ignore: Codes, fix: bool, write: bool) -> FileResult:
    rules, syntax = _select(select, ignore)
    try:
        source, encoding = _read(path)
    except (OSError, UnicodeDecodeError, SyntaxError) as exc:
        diag = Diagnostic(path, 1, 1, 1, 1, SYNTAX_ERROR_CODE, f"cannot read file: {exc}")
        return FileResult(path, [diag] if syntax else [])
    if not fix:
        return FileResult(path, analyze(source, path, rules, keep_syntax_errors=syntax))
    fixed, remaining, count = _fix(source, path, rules, syntax)
    if write and fixed != source:
        atomic_write_text(path, fixed, encoding=encoding)
    return FileResult(path, remaining, count, source, fixed)


def _check_file_job(args: Tuple[str, Codes, Codes, bool, bool]) -> FileResult:
    return check_file(*args)


def check_paths(
    paths: Iterable[str],
    select: Codes = None,
    ignore: Codes = None,
    jobs: int = 1,
    fix: bool = False,
    write: bool = False,
) -> List[FileResult]:
    """Check every ``.py`` file under ``paths``, in ``jobs`` processes.

    Args:
        paths: Files and directories (directories are walked with ``DEFAULT_EXCLUDES``).
        select: Rule codes or prefixes to run.
        ignore: Rule codes or prefixes to skip.
        jobs: Worker processes (1: check in this process).
        fix: Apply the automatic fixes (in memory).
        write: Write fixed files back atomically (needs ``fix``).

    Returns:
        One ``FileResult`` per file, in walking order.

    Raises:
        FileNotFoundError: A path that does not exist.
        ValueError: An unknown rule code.

    >>> import pathlib, tempfile
    >>> d = tempfile.mkdtemp()
    >>> _ = pathlib.Path(d, "m.py").write_text("import torch\\ntorch.load('x.pt')\\n")
    >>> [d.code for r in check_paths([d]) for d in r.diagnostics]
    ['ST003', 'ST004']
    """
    _select(select, ignore)  # fail on a bad code before starting workers
    files = list(iter_python_files(paths))
    job_args = [(p, select, ignore, fix, write) for p in files]
    if jobs <= 1 or len(files) <= 1:
        return [_check_file_job(a) for a in job_args]
    import multiprocessing

    # fork where it is safe and cheap (workers inherit the imported checker); spawn elsewhere.
    method = "fork" if sys.platform.startswith("linux") else "spawn"
    # Chunks amortise the pickling; several per worker keep the load balanced.
    chunksize = max(1, len(files) // (jobs * 4))
    with warnings.catch_warnings():
        # Python 3.12+ warns about fork() in a process with threads (torch may have some);
        # the workers only parse and walk syntax trees and never touch those threads' state.
        warnings.filterwarnings("ignore", message=r".*fork\(\)", category=DeprecationWarning)
        pool = multiprocessing.get_context(method).Pool(min(jobs, len(files)))
    with pool:
        return list(pool.imap(_check_file_job, job_args, chunksize=chunksize))
