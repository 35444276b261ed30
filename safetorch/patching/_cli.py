"""``safetorch run``, ``safetorch install-hook``, ``safetorch uninstall-hook``.

The arguments are defined in :func:`safetorch._cli.add_run_parsers` (``--help`` never imports
torch); these are the handlers. Expected failures end in one line on stderr naming the value
and the fix. ``run`` exits as ``python`` does (2 for a script that cannot be opened, 1 for a
directory without ``__main__.py`` or a module that cannot be found, the program's own status
otherwise), and 2 for bad safetorch options; it prints its report at exit only when a patch
changed a call or globals were allowed (``-v``: always, ``--no-report``: never). The hook
commands exit 2 for a bad ``--dir``, 1 when the file cannot be written or removed.
"""

from __future__ import annotations

import argparse
import atexit
import importlib.util
import os
import sys
from typing import Sequence

from safetorch._cli import add_run_parsers, say_error
from safetorch.patching import _activation, _runner
from safetorch.patching._allow import allowed_globals, parse_allow_list

__all__: list = []


def _require_torch() -> None:
    """These commands patch torch: without it they fail in the one line every command gives
    (``safetorch._cli.main`` turns the error into it). Found, not imported: the patches go on
    when the program imports torch (``_activation``)."""
    if importlib.util.find_spec("torch") is None:
        raise ModuleNotFoundError("No module named 'torch'", name="torch")


def _fail(command: str, message: str, status: int = 2) -> int:
    say_error(f"safetorch {command}", message)
    return status


def _report_at_exit(names: Sequence[str], verbose: bool) -> None:
    """The end-of-run report, when there is something to say: a call a patch changed, or
    globals allowed for loads (what a reader of the log must know); ``-v``: always."""
    report = sys.modules.get("safetorch.patching._report")  # None: torch never imported
    changed = report is not None and report.anything_changed()
    if verbose or changed or allowed_globals():
        _runner.print_report(names)


def _run(args: argparse.Namespace) -> int:
    _require_torch()
    argv = list(args.argv)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        kind = "MODULE" if args.module else "SCRIPT"
        return _fail("run", f"missing {kind}; usage: safetorch run [OPTIONS] [-m] {kind} [ARGS...]")
    try:
        names = _activation.resolve_names(args.patch or ["all"], default_all=True)
        off = _activation.resolve_names(args.no_patch or [], default_all=False)
        names = [n for n in names if n not in off]
        allow = parse_allow_list(args.allow or [])
    except ValueError as exc:
        return _fail("run", str(exc))
    if args.trust:
        try:
            _runner.trust_for_run(args.trust)
        except Exception as exc:  # CheckpointError (a missing file, not a regular file), ...
            return _fail("run", f"--trust: {exc}")
    problem = _runner.check_target(argv[0], module=args.module)
    if problem is not None:
        message, status = problem
        return _fail("run", message, status)
    if not args.no_report:
        # Registered before the program runs (atexit is last-in, first-out): the report comes
        # after the program's own exit handlers, as _runner.run's own registration would.
        atexit.register(_report_at_exit, names, bool(args.verbose))
    return _runner.run(
        argv[0], argv[1:], module=args.module, patches=names, report=False, allow=allow
    )


def _check_dir(command: str, directory: str) -> int:
    if not os.path.exists(directory):
        return _fail(
            command,
            f"--dir {directory!r} does not exist; pass an existing site-packages directory "
            "(default: this interpreter's)",
        )
    if not os.path.isdir(directory):
        return _fail(
            command, f"--dir {directory!r} is not a directory; pass a site-packages directory"
        )
    return 0


def _hook_command(args: argparse.Namespace, install: bool) -> int:
    """``install-hook`` / ``uninstall-hook``: write or remove the .pth file in ``--dir``."""
    from safetorch.patching import _hook  # sysconfig and the atomic writer: not on run's path

    command = "install-hook" if install else "uninstall-hook"
    if install:
        _require_torch()
    directory = args.dir or _hook.default_dir()
    bad = _check_dir(command, directory)
    if bad:
        return bad
    target = os.path.join(directory, _hook.PTH_NAME)
    try:
        path = _hook.install(directory) if install else _hook.uninstall(directory)
    except OSError as exc:
        reason = exc.strerror or exc
        if install:
            message = (
                f"cannot write {target!r}: {reason}; pass a writable site-packages directory "
                "with --dir"
            )
        else:
            message = f"cannot remove {target!r}: {reason}"
        return _fail(command, message, 1)
    if install:
        print(f"installed {path}: SAFETORCH_PATCH=all python script.py now runs with patches on")
    else:
        print(f"removed {path}" if path else f"no safetorch hook installed in {directory}")
    return 0


def _install(args: argparse.Namespace) -> int:
    return _hook_command(args, install=True)


def _uninstall(args: argparse.Namespace) -> int:
    return _hook_command(args, install=False)


def add_parsers(subparsers: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    """Register ``run``, ``install-hook`` and ``uninstall-hook`` (defined, torch-free, in
    :func:`safetorch._cli.add_run_parsers`)."""
    add_run_parsers(subparsers)
