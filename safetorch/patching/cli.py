"""``safetorch run``, ``safetorch install-hook``, ``safetorch uninstall-hook``."""

from __future__ import annotations

import argparse
import sys

__all__: list = []


def _run(args: argparse.Namespace) -> int:
    from safetorch.patching import runner

    argv = list(args.argv)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        kind = "MODULE" if args.module else "SCRIPT"
        sys.stderr.write(f"safetorch run: missing {kind}; usage: safetorch run [-m] {kind} ...\n")
        return 2
    try:
        names = [args.patch] if args.patch else ["all"]
        from safetorch.patching import registry

        registry.resolve_names(names, default_all=True)
    except ValueError as exc:
        sys.stderr.write(f"safetorch run: {exc}\n")
        return 2
    return runner.run(
        argv[0], argv[1:], module=args.module, patches=names, report=not args.no_report
    )


def _install(args: argparse.Namespace) -> int:
    from safetorch.patching import hook

    path = hook.install(args.dir)
    print(f"installed {path}: SAFETORCH_PATCH=all python script.py now runs with patches on")
    return 0


def _uninstall(args: argparse.Namespace) -> int:
    from safetorch.patching import hook

    path = hook.uninstall(args.dir)
    print(f"removed {path}" if path else "no safetorch hook installed")
    return 0


def add_parsers(subparsers: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    """Register ``run``, ``install-hook`` and ``uninstall-hook``."""
    run = subparsers.add_parser(
        "run",
        help="run a script (or -m module) as python would, with monkeypatches on",
        description=(
            "Run SCRIPT [ARGS...] (or -m MODULE [ARGS...]) exactly as python would, with "
            "safetorch's patches on from the start; print what they changed to stderr at exit."
        ),
    )
    run.add_argument(
        "--patch",
        default="all",
        metavar="NAMES",
        help="comma-separated patch names, or 'all' (default); see st.patches()",
    )
    run.add_argument("--no-report", action="store_true", help="do not print the report")
    run.add_argument(
        "-m", dest="module", action="store_true", help="run a library module as a script"
    )
    run.add_argument("argv", nargs=argparse.REMAINDER, metavar="SCRIPT|MODULE [ARGS...]")
    run.set_defaults(func=_run)

    for name, func, text in (
        ("install-hook", _install, "write a .pth file: SAFETORCH_PATCH=... activates patches"),
        ("uninstall-hook", _uninstall, "remove the .pth file install-hook wrote"),
    ):
        p = subparsers.add_parser(name, help=text, description=text)
        p.add_argument("--dir", default=None, help="site-packages directory (default: this venv)")
        p.set_defaults(func=func)
