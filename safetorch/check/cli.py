"""``safetorch check [PATH...]``: report (and with ``--fix`` repair) PyTorch pitfalls in code.

ruff's conventions: ``.`` when no path is given; what ``.gitignore`` ignores is skipped while
walking (``--no-respect-gitignore``: not), files named explicitly are checked all the same;
``All checks passed!`` when nothing is found; ``-q`` prints the findings and nothing else.

Exit status: 0 when no findings remain, 1 when some do, 2 on a usage error (bad option,
unknown rule code, missing path, bad ``[tool.safetorch]``) or an unreadable file, with a
one-line message on stderr. Imports nothing but the standard library and
``safetorch.check``: never torch.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter
from typing import Any, Dict, List, Optional, Sequence

__all__ = ["add_parsers", "run_check", "format_github", "format_sarif"]

_EPILOG = """\
exit status: 0 no findings remain, 1 findings remain, 2 usage error or unreadable input,
130 interrupted.
PATH defaults to the current directory; directories are walked skipping what .gitignore
and .git/info/exclude ignore (--no-respect-gitignore: not); files named are always checked.
--fix applies safe fixes only (they keep behaviour and checkpoint compatibility);
--unsafe-fixes also applies those that change behaviour. Configure in pyproject.toml
[tool.safetorch]: select, ignore, per-file-ignores, extend-exclude, min-torch-version,
respect-gitignore. suppress one line with `# noqa` or `# noqa: ST003`; explain a rule with
--explain ST003.
"""
_FORMATS = ("text", "concise", "json", "github", "sarif")
_TEXT_FORMATS = ("text", "concise")
_SUCCESS = "All checks passed!"
_INFO_URI = "https://github.com/safetorch/safetorch"


def add_parsers(subparsers: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    """Register ``safetorch check`` (its handler is ``run_check``).

    >>> import argparse
    >>> parser = argparse.ArgumentParser(prog="safetorch")
    >>> add_parsers(parser.add_subparsers())
    >>> parser.parse_args(["check", "src", "--select", "ST001"]).select
    'ST001'
    """
    p = subparsers.add_parser(
        "check",
        help="static checker with autofix for PyTorch pitfalls (never imports torch)",
        description="Find (and with --fix rewrite) PyTorch pitfalls that safetorch knows.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "paths",
        nargs="*",
        metavar="PATH",
        help="files or directories to check (default: .); - for stdin",
    )
    p.add_argument("--select", metavar="CODES", help="comma-separated codes or prefixes to run")
    p.add_argument("--ignore", metavar="CODES", help="comma-separated codes or prefixes to skip")
    p.add_argument("--fix", action="store_true", help="apply safe fixes in place")
    p.add_argument(
        "--unsafe-fixes",
        action="store_true",
        help="with --fix or --diff, also apply fixes that change behaviour",
    )
    p.add_argument(
        "--diff", action="store_true", help="print the fixes as a unified diff; write nothing"
    )
    p.add_argument(
        "--output-format",
        "--format",
        dest="output_format",
        choices=_FORMATS,
        default="text",
        help="text (path:line:col: CODE message, and a summary), concise (the same lines, as "
        "ruff's concise), json, github (workflow annotations), sarif",
    )
    p.add_argument(
        "--json",
        dest="output_format",
        action="store_const",
        const="json",
        help="same as --output-format json",
    )
    p.add_argument("--statistics", action="store_true", help="print counts per rule instead")
    p.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="print the findings and nothing else (no summary, no success line, no warnings)",
    )
    p.add_argument(
        "--show-fixes",
        action="store_true",
        help="mark findings with a fix ([*] safe, [-] with --unsafe-fixes); with --fix or "
        "--diff, list what was fixed per file and rule",
    )
    gitignore = p.add_mutually_exclusive_group()
    gitignore.add_argument(
        "--respect-gitignore",
        dest="respect_gitignore",
        action="store_const",
        const=True,
        default=None,
        help="skip files .gitignore and .git/info/exclude ignore while walking (the default)",
    )
    gitignore.add_argument(
        "--no-respect-gitignore",
        dest="respect_gitignore",
        action="store_const",
        const=False,
        help="check ignored files too",
    )
    p.add_argument("--exit-zero", action="store_true", help="exit 0 even when findings remain")
    p.add_argument("--explain", metavar="CODE", help="print what a rule checks and exit")
    p.add_argument("--list-rules", action="store_true", help="list every rule and exit")
    p.add_argument(
        "--stdin-filename", metavar="NAME", help="the name to report stdin (PATH -) under"
    )
    p.add_argument(
        "--config", metavar="FILE", help="pyproject.toml to read (default: the nearest one)"
    )
    p.add_argument("--isolated", action="store_true", help="ignore every configuration file")
    p.add_argument(
        "--min-torch-version",
        metavar="X.Y",
        help="oldest torch the code supports (overrides [tool.safetorch])",
    )
    p.add_argument(
        "--force-exclude",
        action="store_true",
        help="apply extend-exclude to files named explicitly (for pre-commit)",
    )
    p.add_argument(
        "-j", "--jobs", type=int, default=1, metavar="N", help="worker processes (default 1)"
    )
    p.set_defaults(func=run_check, check_parser=p, _parser=p)


def _usage_error(message: str) -> int:
    print(f"safetorch check: error: {message}", file=sys.stderr)
    return 2


def _warn(args: argparse.Namespace, message: str) -> None:
    if not args.quiet:
        print(f"safetorch check: warning: {message}", file=sys.stderr)


def _settings(args: argparse.Namespace) -> Any:
    """The run's Settings: --config, else the nearest pyproject.toml with [tool.safetorch]."""
    from dataclasses import replace

    from safetorch.check.config import (
        Settings,
        find_config_and_warnings,
        load_settings,
        parse_version,
    )

    passed: List[str] = []
    if args.isolated:
        settings = Settings()
    else:
        config = args.config
        if config is None:
            start = args.stdin_filename if args.paths == ["-"] and args.stdin_filename else None
            start = start or (args.paths[0] if args.paths and args.paths[0] != "-" else ".")
            config, passed = find_config_and_warnings(start)
        elif not os.path.isfile(config):
            raise FileNotFoundError(f"no such config file: {config!r}")
        settings = load_settings(config)
    for warning in [*passed, *settings.warnings]:
        _warn(args, warning)
    if args.min_torch_version:
        settings = replace(settings, min_torch=parse_version(args.min_torch_version))
    return settings


def run_check(args: argparse.Namespace) -> int:
    """Handler of ``safetorch check``; returns the exit status.

    >>> import argparse
    >>> parser = argparse.ArgumentParser(prog="safetorch")
    >>> add_parsers(parser.add_subparsers())
    >>> run_check(parser.parse_args(["check", "--explain", "ST007"]))  # doctest: +ELLIPSIS
    ST007 (positional-with-default): ...
    0
    """
    from safetorch.check import explain
    from safetorch.check.config import ConfigError
    from safetorch.check.fixer import unified_diff
    from safetorch.check.runner import FileResult, check_paths, check_text

    if args.explain:
        try:
            sys.stdout.write(explain(args.explain))
        except KeyError as exc:
            return _usage_error(str(exc.args[0]))
        return 0
    if args.list_rules:
        _list_rules(args.output_format)
        return 0
    if not args.paths:
        args.paths = ["."]  # as ruff: the current directory
    if args.fix and args.diff:
        return _usage_error("--fix and --diff exclude each other")
    if args.jobs < 1:
        return _usage_error(f"-j must be at least 1, got {args.jobs}")
    stdin = "-" in args.paths
    if stdin and len(args.paths) > 1:
        return _usage_error("- (stdin) cannot be combined with other paths")
    try:
        settings = _settings(args)
        fixing = args.fix or args.diff
        respect = args.respect_gitignore
        if respect is None:
            respect = settings.respect_gitignore is not False
        if stdin:
            name = args.stdin_filename or "-"
            results = [
                check_text(
                    sys.stdin.read(),
                    name,
                    args.select,
                    args.ignore,
                    fix=fixing,
                    unsafe_fixes=args.unsafe_fixes,
                    settings=settings,
                )
            ]
        else:
            results = check_paths(
                args.paths,
                select=args.select,
                ignore=args.ignore,
                jobs=args.jobs,
                fix=fixing,
                write=args.fix,
                unsafe_fixes=args.unsafe_fixes,
                settings=settings,
                force_exclude=args.force_exclude,
                respect_gitignore=respect,
            )
    except (ValueError, FileNotFoundError, ConfigError) as exc:
        return _usage_error(str(exc))

    unreadable = [r.error for r in results if r.error]
    diagnostics = [d for r in results for d in r.diagnostics]
    fixed = sum(r.fixed for r in results)
    if args.diff:
        for r in results:
            if r.before is not None and r.after is not None and r.before != r.after:
                sys.stdout.write(unified_diff(r.path, r.before, r.after))
        # What --fix would leave is not what is there now: report every current finding.
        remaining = bool(fixed or diagnostics)
    elif stdin and args.fix:
        # As ruff: the fixed code goes to stdout, the findings left to stderr.
        result: FileResult = results[0]
        sys.stdout.write(result.after if result.after is not None else "")
        for d in diagnostics:
            print(d, file=sys.stderr)
        remaining = bool(diagnostics)
    else:
        remaining = bool(diagnostics)
        _emit(args.output_format, diagnostics, args.statistics, args.show_fixes)
    quiet = args.quiet or not (args.output_format in _TEXT_FORMATS or args.diff)
    if args.show_fixes and (args.fix or args.diff) and not args.quiet:
        _show_fixes(results, diff=args.diff)
    if not quiet:
        _summary(diagnostics, fixed, args.fix or args.diff, args.unsafe_fixes, diff=args.diff)
        if not diagnostics and not unreadable:
            print(_SUCCESS, file=sys.stderr)
    for message in unreadable:
        print(f"safetorch check: error: {message}", file=sys.stderr)
    if unreadable:
        return 2
    return 0 if args.exit_zero or not remaining else 1


def _show_fixes(results: Sequence[Any], diff: bool) -> None:
    """ruff's ``--show-fixes`` list on stderr: per file, how many findings of each rule the
    fixes removed (``--diff``: would remove)."""
    from safetorch.check.rules import RULE_TABLE

    fixed = [r for r in results if r.fixed_codes]
    total = sum(n for r in fixed for n in r.fixed_codes.values())
    if not total:
        return
    lines = [f"{'Would fix' if diff else 'Fixed'} {total} finding(s):"]
    for r in fixed:
        lines.append(f"- {r.path}:")
        for code, n in r.fixed_codes.items():
            name = RULE_TABLE[code].name if code in RULE_TABLE else ""
            lines.append(f"    {n} x {code} ({name})" if name else f"    {n} x {code}")
    print("\n".join(lines), file=sys.stderr)


def _emit(fmt: str, diagnostics: Sequence[Any], statistics: bool, marks: bool = False) -> None:
    if statistics:
        _statistics(fmt, diagnostics)
    elif fmt == "json":
        out: List[Any] = [d.to_dict() for d in diagnostics]
        sys.stdout.write(json.dumps(out, indent=2) + "\n")
    elif fmt == "github":
        sys.stdout.write(format_github(diagnostics))
    elif fmt == "sarif":
        sys.stdout.write(json.dumps(format_sarif(diagnostics), indent=2) + "\n")
    else:  # text and concise: ruff's concise lines
        for d in diagnostics:
            print(_painted(d, marks))


def _painted(d: Any, marks: bool = False) -> str:
    """One finding as text: ruff's colours on a terminal (path bold, code red), plain
    otherwise or with ``NO_COLOR`` (the same text either way); ``marks``: ``[*]``/``[-]``
    after the code of a finding with a safe/unsafe fix (``--show-fixes``)."""
    from safetorch._cli import paint

    where = paint(f"{d.path}:{d.line}:{d.col}:", "bold")
    mark = _fix_mark(d.fix) if marks else ""
    return f"{where} {paint(d.code, 'bold red')}{' ' + mark if mark else ''} {d.message}"


def _fix_mark(fix: Any) -> str:
    if fix is None:
        return ""
    return "[*]" if fix.safe else "[-]"


def _statistics(fmt: str, diagnostics: Sequence[Any]) -> None:
    """Counts per rule, most frequent first (``[*]`` safe fix, ``[-]`` unsafe fix)."""
    from safetorch.check.rules import RULE_TABLE

    counts = Counter(d.code for d in diagnostics)
    marks: Dict[str, str] = {}
    for d in diagnostics:
        mark = _fix_mark(d.fix)
        if mark and marks.get(d.code) != "[*]":
            marks[d.code] = mark
    rows = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    if fmt == "json":
        data = [
            {
                "code": code,
                "name": RULE_TABLE[code].name if code in RULE_TABLE else "",
                "count": n,
                "fixable": code in marks,
            }
            for code, n in rows
        ]
        sys.stdout.write(json.dumps(data, indent=2) + "\n")
        return
    width = max((len(str(n)) for _, n in rows), default=1)
    for code, n in rows:
        name = RULE_TABLE[code].name if code in RULE_TABLE else ""
        print(f"{n:>{width}}\t{code}\t{marks.get(code, '   ')}\t{name}")


def _list_rules(fmt: str) -> None:
    """Every rule, from the rule classes and their rows (``rules.list_rules_text``)."""
    from safetorch.check import rules

    if fmt == "json":
        data = [
            {
                "code": r.code,
                "name": r.name,
                "summary": r.summary,
                "pitfall_id": r.pitfall_id,
                "pitfall": r.pitfall,
                "safetorch": r.safetorch,
                "fix": r.fix_applicability if r.fixable else "manual",
                "docs": r.docs,
            }
            for r in rules.RULE_TABLE.values()
        ]
        sys.stdout.write(json.dumps(data, indent=2) + "\n")
        return
    sys.stdout.write(rules.list_rules_text())


def _gh_escape(text: str, prop: bool = False) -> str:
    text = text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    if prop:
        text = text.replace(":", "%3A").replace(",", "%2C")
    return text


def format_github(diagnostics: Sequence[Any]) -> str:
    """GitHub Actions workflow commands: one ``::error`` annotation per finding.

    >>> from safetorch.check.engine import Diagnostic
    >>> print(format_github([Diagnostic("a.py", 3, 5, 3, 9, "ST003", "torch.load: unsafe")]), end="")
    ::error title=safetorch (ST003),file=a.py,line=3,col=5,endLine=3,endColumn=9::ST003 torch.load: unsafe
    """
    out = []
    for d in diagnostics:
        props = (
            f"title={_gh_escape(f'safetorch ({d.code})', True)},file={_gh_escape(d.path, True)},"
            f"line={d.line},col={d.col},endLine={d.end_line},endColumn={d.end_col}"
        )
        out.append(f"::error {props}::{_gh_escape(f'{d.code} {d.message}')}\n")
    return "".join(out)


def format_sarif(diagnostics: Sequence[Any]) -> Dict[str, Any]:
    """A SARIF 2.1.0 log (GitHub code scanning): every rule, one result per finding.

    >>> from safetorch.check.engine import Diagnostic
    >>> log = format_sarif([Diagnostic("src/a.py", 3, 5, 3, 9, "ST003", "unsafe load")])
    >>> log["version"], log["runs"][0]["results"][0]["locations"][0]["physicalLocation"]["region"]
    ('2.1.0', {'startLine': 3, 'startColumn': 5, 'endLine': 3, 'endColumn': 9})
    """
    from safetorch import __version__
    from safetorch.check.rules import RULE_TABLE

    codes = list(RULE_TABLE)
    rules = [
        {
            "id": r.code,
            "name": r.name,
            "shortDescription": {"text": r.summary},
            "fullDescription": {"text": r.pitfall},
            "help": {"text": f"safetorch check --explain {r.code}"},
            **({"helpUri": r.docs} if r.docs else {}),
            "properties": {
                "safetorch": r.safetorch,
                "fix": r.fix_applicability,
                "pitfall": r.pitfall_id,
            },
        }
        for r in RULE_TABLE.values()
    ]
    results = []
    for d in diagnostics:
        uri = d.path.replace(os.sep, "/")
        if uri.startswith("./"):
            uri = uri[2:]
        result: Dict[str, Any] = {
            "ruleId": d.code,
            "level": "error",
            "message": {"text": d.message},
            "locations": [
                {
                    "physicalLocation": {
                        "artifactLocation": {"uri": uri},
                        "region": {
                            "startLine": d.line,
                            "startColumn": d.col,
                            "endLine": d.end_line,
                            "endColumn": d.end_col,
                        },
                    }
                }
            ],
        }
        if d.code in RULE_TABLE:
            result["ruleIndex"] = codes.index(d.code)
        results.append(result)
    return {
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "version": "2.1.0",
        "runs": [
            {
                "tool": {
                    "driver": {
                        "name": "safetorch",
                        "version": __version__,
                        "informationUri": _INFO_URI,
                        "rules": rules,
                    }
                },
                "columnKind": "unicodeCodePoints",
                "results": results,
            }
        ],
    }


def _summary(
    diagnostics: Sequence[Any], fixed: int, fixing: bool, unsafe: bool, diff: bool = False
) -> Optional[str]:
    """One line on stderr: what was fixed (``diff``: what --fix would fix), what is left,
    what more each flag would fix."""
    safe = sum(1 for d in diagnostics if d.fix is not None and d.fix.safe)
    more = sum(1 for d in diagnostics if d.fix is not None and not d.fix.safe)
    parts = []
    if fixing and fixed:
        # --diff writes nothing: say what --fix would do, as ruff ("Would fix N errors").
        parts.append(f"{'would fix' if diff else 'fixed'} {fixed} finding(s)")
    if diagnostics:
        hints = []
        if safe and not fixing:
            hints.append(f"{safe} fixable with --fix")
        if more and not unsafe:
            hints.append(f"{more} more with --unsafe-fixes")
        hint = f" ({', '.join(hints)})" if hints else ""
        parts.append(f"found {len(diagnostics)} finding(s){hint}")
    if not parts:
        return None
    line = "safetorch check: " + ", ".join(parts) + "."
    print(line, file=sys.stderr)
    return line
