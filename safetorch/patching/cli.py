"""``safetorch run``, ``safetorch install-hook``, ``safetorch uninstall-hook``.

Expected failures end in one line on stderr naming the value and the fix. ``run`` exits as
``python`` does (2 for a script that cannot be opened, 1 for a directory without
``__main__.py`` or a module that cannot be found, the program's own status otherwise), and
2 for bad safetorch options; the hook commands exit 2 for a bad ``--dir``, 1 when the file
cannot be written or removed.
"""

from __future__ import annotations

import argparse
import os
import sys

from safetorch.patching.allow import parse_allow_list

__all__: list = []

# "module.Name" or "package.module.Outer.Inner": what --allow accepts.


def _fail(command: str, message: str, status: int = 2) -> int:
    sys.stderr.write(f"safetorch {command}: {message}\n")
    return status


def _run(args: argparse.Namespace) -> int:
    from safetorch.patching import registry, runner

    argv = list(args.argv)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        kind = "MODULE" if args.module else "SCRIPT"
        return _fail("run", f"missing {kind}; usage: safetorch run [OPTIONS] [-m] {kind} [ARGS...]")
    try:
        names = registry.resolve_names(args.patch or ["all"], default_all=True)
        off = registry.resolve_names(args.no_patch or [], default_all=False)
        names = [n for n in names if n not in off]
        allow = parse_allow_list(args.allow or [])
    except ValueError as exc:
        return _fail("run", str(exc))
    problem = runner.check_target(argv[0], module=args.module)
    if problem is not None:
        message, status = problem
        return _fail("run", message, status)
    return runner.run(
        argv[0], argv[1:], module=args.module, patches=names, report=not args.no_report, allow=allow
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
    from safetorch.patching import hook

    command = "install-hook" if install else "uninstall-hook"
    directory = args.dir or hook.default_dir()
    bad = _check_dir(command, directory)
    if bad:
        return bad
    target = os.path.join(directory, hook.PTH_NAME)
    try:
        path = hook.install(directory) if install else hook.uninstall(directory)
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
        action="append",
        default=None,
        metavar="NAMES",
        help="patch names (repeatable, or comma-separated), or 'all' (default); see st.patches()",
    )
    run.add_argument(
        "--allow",
        action="append",
        default=None,
        metavar="MODULE.NAME",
        help="a global that checkpoints loaded through torch.load may reference (repeatable; "
        "also SAFETORCH_ALLOW=a.B,c.D); only for files you trust to contain it",
    )
    run.add_argument(
        "--no-patch",
        action="append",
        default=None,
        metavar="NAMES",
        help="patch names to leave off (repeatable, or comma-separated), e.g. "
        "--no-patch legacy to run legacy-API calls as this torch does",
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
