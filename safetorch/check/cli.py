"""``safetorch check PATH...``: report (and with ``--fix`` repair) PyTorch pitfalls in code.

Exit status: 0 when no findings remain, 1 when some do, 2 on a usage error (bad option,
unknown rule code, missing path).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, List

__all__ = ["add_parsers", "run_check"]

_EPILOG = """\
exit status: 0 no findings remain, 1 findings remain, 2 usage error.
suppress one line with `# noqa` or `# noqa: ST003`; explain a rule with --explain ST003.
"""


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
        help="static checker with autofix for PyTorch pitfalls",
        description="Find (and with --fix rewrite) PyTorch pitfalls that safetorch knows.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("paths", nargs="*", metavar="PATH", help="files or directories to check")
    p.add_argument("--select", metavar="CODES", help="comma-separated codes or prefixes to run")
    p.add_argument("--ignore", metavar="CODES", help="comma-separated codes or prefixes to skip")
    p.add_argument("--fix", action="store_true", help="apply automatic fixes in place")
    p.add_argument(
        "--diff", action="store_true", help="print the fixes as a unified diff; write nothing"
    )
    p.add_argument("--format", choices=("text", "json"), default="text", help="output format")
    p.add_argument("--exit-zero", action="store_true", help="exit 0 even when findings remain")
    p.add_argument("--explain", metavar="CODE", help="print what a rule checks and exit")
    p.add_argument(
        "-j", "--jobs", type=int, default=1, metavar="N", help="worker processes (default 1)"
    )
    p.set_defaults(func=run_check, check_parser=p)


def _usage_error(args: argparse.Namespace, message: str) -> int:
    parser = getattr(args, "check_parser", None)
    if parser is not None:
        parser.print_usage(sys.stderr)
        prog = parser.prog
    else:
        prog = "safetorch check"
    print(f"{prog}: error: {message}", file=sys.stderr)
    return 2


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
    from safetorch.check.fixer import unified_diff
    from safetorch.check.rules import select_rules
    from safetorch.check.runner import check_paths

    if args.explain:
        try:
            sys.stdout.write(explain(args.explain))
        except KeyError as exc:
            return _usage_error(args, str(exc.args[0]))
        return 0
    if not args.paths:
        return _usage_error(args, "no PATH given (or use --explain CODE)")
    if args.fix and args.diff:
        return _usage_error(args, "--fix and --diff exclude each other")
    if args.jobs < 1:
        return _usage_error(args, f"-j must be at least 1, got {args.jobs}")
    try:
        select_rules(args.select, args.ignore)
        results = check_paths(
            args.paths,
            select=args.select,
            ignore=args.ignore,
            jobs=args.jobs,
            fix=args.fix or args.diff,
            write=args.fix,
        )
    except (ValueError, FileNotFoundError) as exc:
        return _usage_error(args, str(exc))

    diagnostics = [d for r in results for d in r.diagnostics]
    fixed = sum(r.fixed for r in results)
    if args.diff:
        for r in results:
            if r.before is not None and r.after is not None and r.before != r.after:
                sys.stdout.write(unified_diff(r.path, r.before, r.after))
        # What --fix would leave is not what is there now: report every current finding.
        remaining = bool(fixed or diagnostics)
    else:
        remaining = bool(diagnostics)
        if args.format == "json":
            out: List[Any] = [d.to_dict() for d in diagnostics]
            sys.stdout.write(json.dumps(out, indent=2) + "\n")
        else:
            for d in diagnostics:
                print(d)
        _summary(len(diagnostics), fixed, args.fix, sum(d.fix is not None for d in diagnostics))
    return 0 if args.exit_zero or not remaining else 1


def _summary(found: int, fixed: int, fixing: bool, fixable: int) -> None:
    parts = []
    if fixing and fixed:
        parts.append(f"fixed {fixed} finding(s)")
    if found:
        hint = f" ({fixable} fixable with --fix)" if fixable and not fixing else ""
        parts.append(f"found {found} finding(s){hint}")
    if parts:
        print("safetorch check: " + ", ".join(parts) + ".", file=sys.stderr)
