"""``safetorch ckpt inspect|convert|diff|verify|fit``: look inside, rewrite, compare, check, try.

Every command reads every layout the library writes or loads, the same way (:func:`read_source`):
a ``torch.save`` or ``.safetensors`` file, a :func:`safetorch.save_state` file (its models are
found where ``st.load_state_dict`` finds them: in its ``objects``), a ``CheckpointSaver``
directory (the checkpoint ``resume()`` restores, or ``save()``'s ``last.pt``), a DCP
directory, a shard index, a transformers/accelerate directory. Every file is read through
:func:`safetorch.load` (weights-only; ``--allow`` and ``SAFETORCH_ALLOW`` are its ``allow=``),
never plain pickle.

Text from files (keys, metadata, paths) is printed through :func:`safetorch._text.escape`
(``--json``: ``json.dumps`` escapes it). Expected failures end in one line on stderr naming the
value and the fix; exit status 2 for bad input (missing or unreadable paths, directories, bad
options, corrupt files), 1 for findings (unsafe globals, differences, a checkpoint that does not
fit) or failed work, 130 when interrupted, 0 otherwise. The argument definitions live in
:mod:`safetorch._cli` (``--help`` never imports torch); :func:`run_command` runs one.

One module per command: ``_cli_inspect``, ``_cli_convert``, ``_cli_diff``, ``_cli_fit`` (verify is
:mod:`safetorch.checkpoint.verify`, its command here); what they share is in ``_cli_source``
(reading any layout, path checks, the failure guard) and ``_cli_progress`` (the progress bar).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Callable, Dict

from safetorch._text import escape
from safetorch.checkpoint._cli_convert import _cmd_convert, convert_checkpoint
from safetorch.checkpoint._cli_diff import _cmd_diff, diff_checkpoints
from safetorch.checkpoint._cli_fit import _cmd_fit, fit_checkpoint
from safetorch.checkpoint._cli_inspect import _cmd_inspect, inspect_checkpoint, list_keys
from safetorch.checkpoint._cli_source import (
    _BadInput,
    _guarded,
    _readable_file,
    allow_list,
    read_source,
    write_json,
)
from safetorch.checkpoint.verify import verify_checkpoint

__all__ = [
    "add_parsers",
    "run_command",
    "read_source",
    "inspect_checkpoint",
    "convert_checkpoint",
    "list_keys",
    "diff_checkpoints",
    "fit_checkpoint",
]


def _cmd_verify(args: argparse.Namespace) -> int:
    allow_list(args.allow)  # validated as everywhere; verify unpickles nothing
    if not os.path.isdir(args.path):  # a directory (a CheckpointSaver's too): every file in it
        _readable_file(args.path)
    report = verify_checkpoint(args.path)
    if report.format == "directory" and not report.files:
        raise _BadInput(f"{args.path!r}: {report.problems[0]}; pass a checkpoint file or directory")
    if args.json:
        write_json("verify", report.to_json())
    else:
        for problem in report.problems:
            sys.stdout.write(escape(f"{args.path}: {problem}") + "\n")
        sys.stdout.write(escape(report.summary()) + "\n")
    return 0 if report.ok else 1


_COMMANDS: Dict[str, Callable[[argparse.Namespace], int]] = {
    "inspect": _guarded("inspect", _cmd_inspect),
    "convert": _guarded("convert", _cmd_convert),
    "diff": _guarded("diff", _cmd_diff),
    "verify": _guarded("verify", _cmd_verify),
    "fit": _guarded("fit", _cmd_fit),
}


def run_command(args: argparse.Namespace) -> int:
    """Run the ``safetorch ckpt`` action ``args.ckpt_command`` (parsed by
    :func:`safetorch._cli.add_ckpt_parsers`); returns the exit status."""
    return _COMMANDS[args.ckpt_command](args)


def add_parsers(subparsers: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    """Register ``safetorch ckpt inspect|convert|diff|verify|fit`` (defined, torch-free, in
    :func:`safetorch._cli.add_ckpt_parsers`)."""
    from safetorch._cli import add_ckpt_parsers

    add_ckpt_parsers(subparsers)
