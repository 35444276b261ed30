"""The ``safetorch`` command: doctor, ckpt, check, run (each area registers its subcommands).

Only the chosen area is imported: ``safetorch check``, ``--version`` and ``--help`` never
import torch (the areas that need it load it when their subcommand runs). Usage errors are
one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Dict, List, NoReturn, Optional, Tuple

__all__ = ["main", "build_parser", "COMMANDS"]

#: subcommand -> (module whose ``add_parsers`` registers it, its one-line help). The help is
#: repeated here so that ``safetorch --help`` lists every command without importing torch; a
#: test checks it against what each module registers.
COMMANDS: Dict[str, Tuple[str, str]] = {
    "doctor": (
        "safetorch._doctor",
        "versions, devices, torch feature flags and dispatch decisions",
    ),
    "ckpt": (
        "safetorch.checkpoint.cli",
        "inspect, convert, diff, fit or verify checkpoints (weights-only)",
    ),
    "check": (
        "safetorch.check.cli",
        "static checker with autofix for PyTorch pitfalls (never imports torch)",
    ),
    "run": (
        "safetorch.patching.cli",
        "run a script (or -m module) as python would, with monkeypatches on",
    ),
    "install-hook": (
        "safetorch.patching.cli",
        "write a .pth file: SAFETORCH_PATCH=... activates patches",
    ),
    "uninstall-hook": ("safetorch.patching.cli", "remove the .pth file install-hook wrote"),
}


class _UsageError(Exception):
    """A bad command line; ``main`` prints the one-line message and returns 2."""


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (``safetorch check: error: ...``), no usage."""

    def error(self, message: str) -> NoReturn:
        raise _UsageError(f"{self.prog}: error: {message}")


def _version() -> str:
    from safetorch import __version__

    return f"safetorch {__version__}"


def _top_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="safetorch",
        description="Safe wrappers, monkeypatch mode and a static checker for PyTorch pitfalls.",
    )
    parser.add_argument("--version", action="version", version=_version())
    return parser


def build_parser(commands: Optional[List[str]] = None) -> argparse.ArgumentParser:
    """The ``safetorch`` argument parser with the areas of ``commands`` (default: all).

    Building it imports those areas (the full parser imports torch).
    """
    parser = _top_parser()
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    modules: List[str] = []
    for name in commands or list(COMMANDS):
        module = COMMANDS[name][0]
        if module not in modules:
            modules.append(module)
    for module in modules:
        importlib.import_module(module).add_parsers(sub)
    return parser


def _help_parser() -> argparse.ArgumentParser:
    """The top-level parser for ``--help``: commands listed from the table, nothing imported."""
    parser = _top_parser()
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_, text) in COMMANDS.items():
        sub.add_parser(name, help=text, add_help=False)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    """Run the ``safetorch`` command line; returns the exit status.

    >>> from safetorch._cli import main
    >>> main(["--version"])  # doctest: +ELLIPSIS
    safetorch ...
    0
    """
    args_list = sys.argv[1:] if argv is None else list(argv)
    try:
        return _main(args_list)
    except _UsageError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    except BrokenPipeError:
        # The reader went away (`safetorch doctor | head`): end quietly, as Python's docs
        # advise, pointing stdout at devnull so the interpreter's final flush cannot fail.
        import os

        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1


def _main(argv: List[str]) -> int:
    if not argv:
        _help_parser().print_help(sys.stderr)
        return 2
    first = argv[0]
    if first == "--version":
        print(_version())
        return 0
    if first in ("-h", "--help"):
        _help_parser().print_help()
        return 0
    if first.startswith("-"):
        raise _UsageError(f"safetorch: error: unrecognized option {first!r} (see safetorch --help)")
    if first not in COMMANDS:
        raise _UsageError(
            f"safetorch: error: unknown command {first!r} (choose from {', '.join(COMMANDS)})"
        )
    parser = build_parser([first])
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help of a subcommand
        return int(exc.code or 0) if not isinstance(exc.code, str) else 2
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help(sys.stderr)
        return 2
    return int(func(args) or 0)
