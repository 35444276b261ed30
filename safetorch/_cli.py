"""The ``safetorch`` command: doctor, ckpt, check, run (each area registers its subcommands)."""

from __future__ import annotations

import argparse
import sys
from typing import List, Optional

__all__ = ["main", "build_parser"]


def build_parser() -> argparse.ArgumentParser:
    """The full ``safetorch`` argument parser."""
    from safetorch import _doctor
    from safetorch.check import cli as check_cli
    from safetorch.checkpoint import cli as ckpt_cli
    from safetorch.patching import cli as patch_cli

    parser = argparse.ArgumentParser(
        prog="safetorch",
        description="Safe wrappers, monkeypatch mode and a static checker for PyTorch pitfalls.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    _doctor.add_parsers(sub)
    ckpt_cli.add_parsers(sub)
    check_cli.add_parsers(sub)
    patch_cli.add_parsers(sub)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    """Run the ``safetorch`` command line; returns the exit status.

    >>> from safetorch._cli import main
    >>> main(["doctor", "--json"]) == 0  # doctest: +SKIP
    True
    """
    parser = build_parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help(sys.stderr)
        return 2
    return int(func(args) or 0)
