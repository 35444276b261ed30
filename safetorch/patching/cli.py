"""Placeholder CLI registration: filled in by its issue."""

import argparse


def add_parsers(subparsers: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    """Register this area's ``safetorch`` subcommands (each sets ``func`` to its handler)."""
