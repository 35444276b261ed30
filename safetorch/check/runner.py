"""Check sources and files: the public API of ``safetorch check`` and its file walking."""

from __future__ import annotations

import contextlib
import gc
import io
import os
import sys
import tokenize
import warnings
from collections import Counter
from dataclasses import dataclass, field
from typing import Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Type, Union

from safetorch._atomic import atomic_write_text
from safetorch.check import _gitignore
from safetorch.check.config import Settings
from safetorch.check.engine import (
    SYNTAX_ERROR_CODE,
    Diagnostic,
    Options,
    Rule,
    analyze,
    parse_codes,
)
from safetorch.check.fixer import apply_fixes
from safetorch.check.project import parse
from safetorch.check.rules import select_rules

__all__ = [
    "DEFAULT_EXCLUDES",
    "FileResult",
    "check_file",
    "check_paths",
    "check_source",
    "check_text",
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


_DEFAULT_SETTINGS = Settings()
_SELECTED: Dict[
    Tuple[Optional[Tuple[str, ...]], Tuple[str, ...]], Tuple[Tuple[Type[Rule], ...], bool]
] = {}


def _select(
    select: Codes, ignore: Codes, settings: Optional[Settings] = None, path: Optional[str] = None
) -> Tuple[Tuple[Type[Rule], ...], bool]:
    """The rules for one file: ``select`` (else the configured one), every ignore that applies."""
    settings = settings or _DEFAULT_SETTINGS
    chosen = parse_codes(select)
    if chosen is None:
        chosen = settings.select
    dropped = (*settings.ignore, *(parse_codes(ignore) or ()))
    if path is not None:
        dropped += settings.ignores_for(path)
    key = (chosen, dropped)
    found = _SELECTED.get(key)
    if found is None:
        found = _SELECTED[key] = select_rules(chosen, dropped or None)
    return found


def _options(settings: Optional[Settings], project_root: Optional[str] = None) -> Options:
    return Options(
        min_torch=None if settings is None else settings.min_torch, project_root=project_root
    )


def check_source(
    source: str,
    path: str = "<string>",
    select: Codes = None,
    ignore: Codes = None,
    *,
    settings: Optional[Settings] = None,
) -> List[Diagnostic]:
    """Check Python source text.

    Args:
        source: The code.
        path: The name findings are reported under.
        select: Rule codes or prefixes to run (``"ST003,ST004"`` or a list); default all.
        ignore: Rule codes or prefixes to skip.
        settings: Project settings (``[tool.safetorch]``): per-file ignores for ``path`` and
            the minimum torch version some rules depend on.

    Returns:
        The findings not suppressed by ``# noqa``, sorted by position.

    Raises:
        ValueError: An unknown rule code in ``select`` or ``ignore``.

    >>> src = "import torch\\nsd = torch.load('ckpt.pt', map_location='cpu')\\n"
    >>> [d.code for d in check_source(src, "train.py")]
    ['ST003']
    """
    rules, syntax = _select(select, ignore, settings, path)
    return analyze(source, path, rules, keep_syntax_errors=syntax, options=_options(settings))


def _fix(
    source: str,
    path: str,
    rules: Sequence[Type[Rule]],
    syntax: bool,
    options: Options,
    unsafe_fixes: bool,
) -> Tuple[str, List[Diagnostic], int, Dict[str, int]]:
    """Fix until nothing changes; return (source, remaining findings, fixes applied, findings
    gone per code: what ``--show-fixes`` lists)."""
    applied_total = 0

    def run(text: str) -> List[Diagnostic]:
        return analyze(text, path, rules, keep_syntax_errors=syntax, options=options)

    found = first = run(source)
    for _ in range(_MAX_FIX_PASSES):
        allowed = [d for d in found if d.fix is not None and (unsafe_fixes or d.fix.safe)]
        fixed, applied = apply_fixes(source, allowed)
        if not applied or fixed == source:
            break
        try:
            parse(fixed)
        except (SyntaxError, ValueError):  # never hand back a file that no longer parses
            break
        source, applied_total = fixed, applied_total + applied
        found = run(source)
    gone = Counter(d.code for d in first) - Counter(d.code for d in found)
    return source, found, applied_total, dict(sorted(gone.items()))


def fix_source(
    source: str,
    path: str = "<string>",
    select: Codes = None,
    ignore: Codes = None,
    *,
    unsafe_fixes: bool = False,
    settings: Optional[Settings] = None,
) -> str:
    """Apply the automatic fixes to ``source`` and return the fixed text.

    Safe fixes only (they keep behaviour and checkpoint compatibility), unless
    ``unsafe_fixes``. Only the span of each finding changes; running it again changes nothing.

    Args:
        source: The code.
        path: The name used in messages.
        select: Rule codes or prefixes whose fixes to apply; default all.
        ignore: Rule codes or prefixes to leave alone.
        unsafe_fixes: Also apply the fixes that change behaviour (``--unsafe-fixes``).
        settings: Project settings (``[tool.safetorch]``).

    Returns:
        The fixed source (``source`` itself when nothing is fixable).

    Raises:
        ValueError: An unknown rule code in ``select`` or ``ignore``.

    >>> print(fix_source("import torch.nn.functional as F\\ny = F.upsample_bilinear(x, scale_factor=2)\\n"))
    import torch.nn.functional as F
    y = F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=True)
    <BLANKLINE>
    """
    rules, syntax = _select(select, ignore, settings, path)
    return _fix(source, path, rules, syntax, _options(settings), unsafe_fixes)[0]


def iter_python_files(
    paths: Iterable[str],
    excludes: Iterable[str] = DEFAULT_EXCLUDES,
    settings: Optional[Settings] = None,
    force_exclude: bool = False,
    respect_gitignore: bool = False,
) -> Iterator[str]:
    """The ``.py`` files under ``paths``, in a stable order.

    Files named explicitly are always yielded; directories are walked, skipping the names in
    ``excludes`` (and ``*.egg-info``), and with ``respect_gitignore`` what ``.gitignore``
    files and ``.git/info/exclude`` ignore (:mod:`safetorch.check._gitignore`).

    Args:
        paths: Files and directories.
        excludes: Directory names to skip while walking.
        settings: Its ``extend-exclude`` patterns are skipped while walking too.
        force_exclude: Apply ``extend-exclude`` (and with ``respect_gitignore``, the ignore
            files) to paths named explicitly as well (for pre-commit, which names every file).
        respect_gitignore: Skip what git ignores while walking (``safetorch check`` does by
            default; ``--no-respect-gitignore``).

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
    excluded = settings.excluded if settings is not None and settings.extend_exclude else None
    git = _gitignore.Matcher() if respect_gitignore else None
    for path in paths:
        if force_exclude and git is not None and git.ignored_anywhere(path):
            continue
        if os.path.isdir(path):
            named_excluded = excluded is not None and excluded(path)
            if force_exclude and named_excluded:
                continue
            # A directory named on the command line is checked even when it is excluded (as
            # ruff does without --force-exclude); exclusions still apply inside other paths.
            inner = None if named_excluded else excluded
            for root, dirs, files in os.walk(path):
                dirs[:] = sorted(
                    d
                    for d in dirs
                    if d not in skip
                    and not d.endswith(".egg-info")
                    and not (inner is not None and inner(os.path.join(root, d)))
                    and not (git is not None and git.ignored(os.path.join(root, d), True))
                )
                for name in sorted(files):
                    if name.endswith(".py"):
                        full = os.path.join(root, name)
                        if (inner is None or not inner(full)) and not (
                            git is not None and git.ignored(full, False)
                        ):
                            yield full
        elif os.path.isfile(path):
            if not (force_exclude and excluded is not None and excluded(path)):
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
        error: Why the file could not be read (then nothing else is set).
        fixed_codes: Findings the fixes removed, per rule code (only when fixing).
    """

    path: str
    diagnostics: List[Diagnostic] = field(default_factory=list)
    fixed: int = 0
    before: Optional[str] = None
    after: Optional[str] = None
    error: Optional[str] = None
    fixed_codes: Dict[str, int] = field(default_factory=dict)


def check_file(
    path: str,
    select: Codes = None,
    ignore: Codes = None,
    fix: bool = False,
    write: bool = False,
    *,
    unsafe_fixes: bool = False,
    settings: Optional[Settings] = None,
    project_root: Optional[str] = None,
) -> FileResult:
    """Check one file; with ``fix`` compute its fixed text, with ``write`` also save it.

    A file that cannot be decoded is reported as ST000, like a syntax error (Python reports
    it as one); a file that cannot be read at all sets ``FileResult.error``.

    Args:
        path: The file.
        select: Rule codes or prefixes to run.
        ignore: Rule codes or prefixes to skip.
        fix: Apply the automatic fixes (in memory).
        write: Write the fixed text back (atomically); needs ``fix``.
        unsafe_fixes: Also apply the fixes that change behaviour.
        settings: Project settings (``[tool.safetorch]``).
        project_root: The directory named on the command line the file was found under
            (the project's root where nothing marks one; see :mod:`safetorch.check.project`).

    Returns:
        A ``FileResult``.

    >>> import pathlib, tempfile
    >>> p = pathlib.Path(tempfile.mkdtemp(), "m.py")
    >>> src = "def step(model, x):\\n    h = model(x)\\n    d = h.detach()\\n    d.add_(1)\\n"
    >>> _ = p.write_text(src + "    h.sum().backward()\\n    return d\\n")
    >>> r = check_file(str(p), ["ST005"], fix=True, write=True); (r.fixed, len(r.diagnostics))
    (0, 1)
    >>> r = check_file(str(p), ["ST005"], fix=True, write=True, unsafe_fixes=True)
    >>> r.fixed, p.read_text().splitlines()[2]
    (1, '    d = h.detach().clone()')
    """
    with _gc_paused():
        return _check_file(path, select, ignore, fix, write, unsafe_fixes, settings, project_root)


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


def _check_file(
    path: str,
    select: Codes,
    ignore: Codes,
    fix: bool,
    write: bool,
    unsafe_fixes: bool,
    settings: Optional[Settings],
    project_root: Optional[str] = None,
) -> FileResult:
    rules, syntax = _select(select, ignore, settings, path)
    try:
        source, encoding = _read(path)
    except OSError as exc:
        return FileResult(path, error=f"cannot read {path}: {exc.strerror or exc}")
    except (UnicodeDecodeError, SyntaxError) as exc:
        diag = Diagnostic(path, 1, 1, 1, 1, SYNTAX_ERROR_CODE, f"cannot decode file: {exc}")
        return FileResult(path, [diag] if syntax else [])
    return _check_text(
        source, path, rules, syntax, fix, unsafe_fixes, settings, encoding, write, project_root
    )


def _check_text(
    source: str,
    path: str,
    rules: Sequence[Type[Rule]],
    syntax: bool,
    fix: bool,
    unsafe_fixes: bool,
    settings: Optional[Settings],
    encoding: str = "utf-8",
    write: bool = False,
    project_root: Optional[str] = None,
) -> FileResult:
    options = _options(settings, project_root)
    if not fix:
        found = analyze(source, path, rules, keep_syntax_errors=syntax, options=options)
        return FileResult(path, found)
    fixed, remaining, count, gone = _fix(source, path, rules, syntax, options, unsafe_fixes)
    if write and fixed != source:
        atomic_write_text(path, fixed, encoding=encoding)
    return FileResult(path, remaining, count, source, fixed, fixed_codes=gone if count else {})


def check_text(
    source: str,
    path: str = "-",
    select: Codes = None,
    ignore: Codes = None,
    fix: bool = False,
    *,
    unsafe_fixes: bool = False,
    settings: Optional[Settings] = None,
) -> FileResult:
    """Check source text (stdin) as the file ``path``; with ``fix`` compute the fixed text.

    >>> src = "import torch\\nnet.load_state_dict(torch.load('a', map_location='cpu'))\\n"
    >>> r = check_text(src, "m.py", fix=True)
    >>> r.fixed, [d.code for d in r.diagnostics], r.diagnostics[0].fix.applicability
    (0, ['ST003'], 'unsafe')
    """
    rules, syntax = _select(select, ignore, settings, path)
    with _gc_paused():
        return _check_text(source, path, rules, syntax, fix, unsafe_fixes, settings)


_Job = Tuple[str, Codes, Codes, bool, bool, bool, Optional[Settings], Optional[str]]


def _check_file_job(args: _Job) -> FileResult:
    path, select, ignore, fix, write, unsafe_fixes, settings, root = args
    return check_file(
        path,
        select,
        ignore,
        fix,
        write,
        unsafe_fixes=unsafe_fixes,
        settings=settings,
        project_root=root,
    )


def check_paths(
    paths: Iterable[str],
    select: Codes = None,
    ignore: Codes = None,
    jobs: int = 1,
    fix: bool = False,
    write: bool = False,
    *,
    unsafe_fixes: bool = False,
    settings: Optional[Settings] = None,
    force_exclude: bool = False,
    respect_gitignore: bool = False,
) -> List[FileResult]:
    """Check every ``.py`` file under ``paths``, in ``jobs`` processes.

    Args:
        paths: Files and directories (directories are walked with ``DEFAULT_EXCLUDES``).
        select: Rule codes or prefixes to run.
        ignore: Rule codes or prefixes to skip.
        jobs: Worker processes (1: check in this process).
        fix: Apply the automatic fixes (in memory).
        write: Write fixed files back atomically (needs ``fix``).
        unsafe_fixes: Also apply the fixes that change behaviour.
        settings: Project settings (``[tool.safetorch]``): select, ignore, per-file-ignores,
            extend-exclude, minimum torch version.
        force_exclude: Apply ``extend-exclude`` to files named explicitly too.
        respect_gitignore: Skip what ``.gitignore`` ignores (:func:`iter_python_files`).

    Returns:
        One ``FileResult`` per file, in walking order.

    Raises:
        FileNotFoundError: A path that does not exist.
        ValueError: An unknown rule code.

    >>> import pathlib, tempfile
    >>> d = tempfile.mkdtemp()
    >>> _ = pathlib.Path(d, "m.py").write_text("import torch\\ntorch.load('x.pt')\\n")
    >>> [d.code for r in check_paths([d]) for d in r.diagnostics]
    ['ST003']
    >>> [d.code for r in check_paths([d], ["ST004"]) for d in r.diagnostics]  # only ST004 runs
    []
    """
    select, ignore = parse_codes(select), parse_codes(ignore)  # once, not once per file
    _select(select, ignore, settings)  # fail on a bad code before starting workers
    for _pattern, codes in settings.per_file_ignores if settings else ():
        select_rules(None, codes)
    job_args: List[_Job] = []
    for top in paths:
        # The directory a file was found under is its project where nothing else marks one.
        root = top if os.path.isdir(top) else None
        for p in iter_python_files(
            [top],
            settings=settings,
            force_exclude=force_exclude,
            respect_gitignore=respect_gitignore,
        ):
            job_args.append((p, select, ignore, fix, write, unsafe_fixes, settings, root))
    files = [a[0] for a in job_args]
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
