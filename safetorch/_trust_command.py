"""``safetorch trust FILE...``: the user's explicit word that a checkpoint may load fully.

The arguments are defined in :func:`safetorch._cli.add_trust_parsers`. For each file: read it
once, show its size, SHA-256 and the globals its pickle imports (what a full load may run),
ask on a terminal (``--yes`` for scripts), then record the hash (``st.trust``). Every text
taken from the file is printed escaped.
"""

from __future__ import annotations

import argparse
import sys
from typing import List

from safetorch._cli import say_error
from safetorch._text import escape

__all__: List[str] = []


def _ask(question: str) -> bool:
    sys.stderr.write(question)
    sys.stderr.flush()
    answer = sys.stdin.readline()
    return answer.strip().lower() in ("y", "yes")


def run(args: argparse.Namespace) -> int:
    from safetorch.checkpoint import saving
    from safetorch.errors import CheckpointError

    if not args.files:
        say_error(
            "safetorch trust",
            "missing FILE (usage: safetorch trust [OPTIONS] FILE [FILE ...]; see safetorch "
            "trust --help)",
        )
        return 2
    interactive = sys.stdin.isatty()
    if not args.yes and not args.remove and not interactive:
        say_error(
            "safetorch trust",
            "not a terminal, so nothing can be confirmed; pass --yes to trust "
            + " ".join(escape(f) for f in args.files),
        )
        return 2
    status = 0
    for path in args.files:
        shown = escape(path)
        try:
            if args.remove:
                removed = saving.untrust(path)
                print(f"{shown}: {'no longer trusted' if removed else 'was not trusted'}")
                continue
            seen = saving.inspect_for_trust(path)
        except CheckpointError as exc:
            say_error("safetorch trust", escape(str(exc)))
            status = 1
            continue
        entry, names = seen.entry, seen.globals
        print(f"{shown}: {entry.size} bytes, sha256 {entry.sha256}")
        if names:
            print("  a full load imports these globals and may run their code:")
            for name in names:
                print(f"    {escape(name)}")
            if seen.more:
                print(f"    ... and at least {seen.more} more")
        elif seen.incomplete is None:
            print("  it names no globals")
        if seen.incomplete is not None:
            print(
                f"  WARNING: the list is incomplete: the scan stopped ({escape(seen.incomplete)}); "
                "a full load may import and run more than this"
            )
        if not args.yes and not _ask(f"trust {shown}? [y/N] "):
            print(f"{shown}: not trusted")
            status = max(status, 1)
            continue
        try:
            saving.record_inspected(path, entry)  # the bytes shown, not a second read
        except CheckpointError as exc:
            say_error("safetorch trust", escape(str(exc)))
            status = 1
            continue
        print(f"{shown}: trusted (st.load loads these bytes fully; a changed file is not)")
    return status
