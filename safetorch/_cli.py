"""The ``safetorch`` command: doctor, ckpt, check, run, trust, install-hook, uninstall-hook,
completion.

Conventions (those of ruff and pip):

* ``--help`` of every command and subcommand is built without importing torch: the argument
  definitions of ``ckpt``, ``run`` and the hooks live here, those of ``check`` and ``doctor``
  in their own torch-free modules; a command's implementation is imported only when it runs
  (:class:`_Lazy`).
* A usage error (unknown command, bad flag or value) is one line on stderr that names the
  subcommand and its short usage; exit status 2.
* A missing dependency (torch) is one line naming what needs it and how to install it, exit 2;
  Ctrl-C is one line, exit 130 (every file is written atomically: nothing partial is left).
* Colour only on a terminal, never when ``NO_COLOR`` is set (``FORCE_COLOR`` forces it).

Exit status of every command: 0 success, 1 findings or failed work (what each command's
``--help`` names), 2 usage error, bad input or a missing dependency, 130 interrupted.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import IO, Any, Callable, Dict, List, NoReturn, Optional, Tuple

from safetorch._text import escape  # stdlib only: --help stays torch-free

__all__ = ["main", "build_parser", "COMMANDS", "paint"]

#: subcommand -> ("module:function" that registers it, its one-line help). The help is
#: repeated here so that ``safetorch --help`` lists every command without importing any area;
#: a test checks it against what each registrar registers. Every registrar is torch-free.
COMMANDS: Dict[str, Tuple[str, str]] = {
    "doctor": (
        "safetorch._doctor:add_parsers",
        "versions, devices, torch feature flags and dispatch decisions",
    ),
    "ckpt": (
        "safetorch._cli:add_ckpt_parsers",
        "inspect, convert, diff, fit or verify checkpoints (weights-only)",
    ),
    "check": (
        "safetorch.check.cli:add_parsers",
        "static checker with autofix for PyTorch pitfalls (never imports torch)",
    ),
    "run": (
        "safetorch._cli:add_run_parsers",
        "run a script (or -m module) as python would, with monkeypatches on",
    ),
    "trust": (
        "safetorch._cli:add_trust_parsers",
        "trust checkpoint files you vouch for: st.load then loads them fully",
    ),
    "install-hook": (
        "safetorch._cli:add_run_parsers",
        "write a .pth file: SAFETORCH_PATCH=... activates patches",
    ),
    "uninstall-hook": ("safetorch._cli:add_run_parsers", "remove the .pth file install-hook wrote"),
    "completion": (
        "safetorch._cli:add_completion_parsers",
        "print a shell completion script (bash, zsh, fish)",
    ),
}

_INTERRUPTED = 130
_TORCH_URL = "https://pytorch.org/get-started/locally/"


# --- colour --------------------------------------------------------------------------------
_STYLES = {"bold": "1", "red": "31", "green": "32", "yellow": "33", "cyan": "36"}


def colour_enabled(stream: Any) -> bool:
    """Whether to colour ``stream``: a terminal, ``NO_COLOR`` unset, ``TERM`` not ``dumb``;
    ``FORCE_COLOR`` (non-empty) colours any stream (https://no-color.org, force-color.org)."""
    if os.environ.get("NO_COLOR"):
        return False
    if os.environ.get("FORCE_COLOR"):
        return True
    if os.environ.get("TERM") == "dumb":
        return False
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty()) if callable(isatty) else False
    except (OSError, ValueError):  # a closed stream
        return False


def paint(text: str, style: str, stream: Any = None) -> str:
    """``text`` in ``style`` (``"red"``, ``"bold red"``, ...) when ``stream`` (default stdout)
    is coloured (:func:`colour_enabled`), else ``text`` unchanged.

    >>> paint("identical", "green", stream=None) in ("identical", "\\x1b[32midentical\\x1b[0m")
    True
    """
    if not text or not colour_enabled(sys.stdout if stream is None else stream):
        return text
    codes = ";".join(_STYLES[s] for s in style.split())
    return f"\x1b[{codes}m{text}\x1b[0m"


def say_error(prog: str, message: str, stream: Optional[IO[str]] = None) -> None:
    """``prog: message`` on stderr (one line; the program name in bold on a terminal)."""
    out = sys.stderr if stream is None else stream
    shown = escape(message, keep="\n")  # text from files (paths, keys) never acts on a terminal
    out.write(f"{paint(prog + ':', 'bold red', out)} {shown}\n")


# --- parsers -------------------------------------------------------------------------------
class _UsageError(Exception):
    """A bad command line; ``main`` prints the one-line message and returns 2."""

    def __init__(self, message: str, parser: Optional[argparse.ArgumentParser] = None) -> None:
        super().__init__(message)
        self.parser = parser


class _Parser(argparse.ArgumentParser):
    """argparse with ruff's habits: no abbreviated flags (``--key`` never means ``--keys``),
    and a usage error raised as :class:`_UsageError` for ``main`` to print in one line."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        raise _UsageError(message, self)


def _short_usage(parser: argparse.ArgumentParser) -> str:
    """``safetorch ckpt diff [OPTIONS] A B``: the usage with the options folded (one line)."""
    formatter = parser._get_formatter()
    positionals = []
    for action in parser._get_positional_actions():
        if isinstance(action, argparse._SubParsersAction):
            positionals.append(f"{action.metavar or 'COMMAND'} ...")
        else:
            positionals.append(formatter._format_args(action, action.dest.upper()))
    return " ".join([parser.prog, "[OPTIONS]", *positionals])


class _Lazy:
    """A command handler named ``"module:function"``, imported when the command runs, so that
    building the parser (and ``--help``) imports nothing heavy."""

    def __init__(self, spec: str) -> None:
        self.spec = spec

    def __call__(self, args: argparse.Namespace) -> int:
        module, _, name = self.spec.partition(":")
        handler: Callable[[argparse.Namespace], int] = getattr(
            importlib.import_module(module), name
        )
        return int(handler(args) or 0)


def _registrar(spec: str) -> Callable[[Any], None]:
    module, _, name = spec.partition(":")
    func: Callable[[Any], None] = getattr(importlib.import_module(module), name)
    return func


def _epilog(*lines: str) -> str:
    return "\n".join([*lines, "130 interrupted (Ctrl-C; nothing half-written is left behind)."])


_FORMATTER = argparse.RawDescriptionHelpFormatter


def _add_allow(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--allow",
        action="append",
        default=None,
        metavar="MODULE.NAME",
        help="a global the checkpoint may reference, as st.load(allow=[...]): repeatable or "
        "comma-separated; SAFETORCH_ALLOW=a.B,c.D adds more. Only for files you trust",
    )


def _add_output(p: argparse.ArgumentParser) -> None:
    """``--output-format text|json`` and ``--json`` (its shorthand); :func:`_ckpt_check`
    folds them into ``args.json``."""
    p.add_argument(
        "--output-format",
        choices=("text", "json"),
        default=None,
        help="text (default) or json: one JSON document with a schema_version "
        "(docs/cli.md, 'JSON output')",
    )
    p.add_argument("--json", action="store_true", help="the same as --output-format json")


def _add_no_progress(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress bar (drawn otherwise on a terminal for checkpoints over 256 MiB: "
        "bytes, rate and time left)",
    )


def _tolerance(text: str) -> float:
    """An ``--atol``/``--rtol`` value: a finite number >= 0."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a tolerance; expected a finite number >= 0, e.g. 1e-6 (0: exact)"
        )
    return value


_GLOB_CHARS = frozenset("*?[")


def _ckpt_check(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """What argparse cannot say of a ``ckpt`` command line: ``--json`` against
    ``--output-format``, and ``inspect --keys FILE`` (the optional GLOB took the path)."""
    if args.output_format == "text" and args.json:
        parser.error("--json means --output-format json; pass one of them, not both")
    args.json = args.json or args.output_format == "json"
    if getattr(args, "ckpt_command", None) != "inspect" or args.path is not None:
        return
    if args.keys is None or args.keys == "*":
        parser.error("the following arguments are required: PATH")
    if any(c in _GLOB_CHARS for c in args.keys) and not os.path.exists(args.keys):
        parser.error(
            f"--keys {args.keys!r} and no PATH: pass the checkpoint too, e.g. "
            f"safetorch ckpt inspect --keys {args.keys!r} model.pt"
        )
    args.path, args.keys = args.keys, "*"  # `inspect --keys FILE`: every key of FILE


def _leaf(
    sub: "argparse._SubParsersAction[argparse.ArgumentParser]",
    name: str,
    text: str,
    handler: str,
    epilog: str,
    description: Optional[str] = None,
) -> argparse.ArgumentParser:
    p = sub.add_parser(
        name, help=text, description=description or text, epilog=epilog, formatter_class=_FORMATTER
    )
    p.set_defaults(func=_Lazy(handler), _parser=p)
    if handler == _CKPT:
        p.set_defaults(_check=_ckpt_check)
    return p


_CKPT = "safetorch.checkpoint.cli:run_command"
_CKPT_SOURCES = (
    "A checkpoint is any layout safetorch writes or loads: a torch.save or .safetensors file,\n"
    "a st.save_state file (--key names its objects), a CheckpointSaver directory (the state\n"
    "resume() restores, or save()'s last.pt), a DCP directory, a shard index (*.index.json) or\n"
    "a transformers/accelerate directory. --allow and SAFETORCH_ALLOW are st.load's allow=."
)


def add_ckpt_parsers(subparsers: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    """Register ``safetorch ckpt inspect|convert|diff|verify|fit`` (nothing imported)."""
    ckpt = subparsers.add_parser(
        "ckpt",
        help=COMMANDS["ckpt"][1],
        description="Look inside, rewrite, compare, check or try checkpoints, weights-only.\n\n"
        + _CKPT_SOURCES,
        epilog="exit status: see each action's --help; 2 for a bad command line.",
        formatter_class=_FORMATTER,
    )
    ckpt.set_defaults(func=_Lazy("safetorch._cli:_ckpt_usage"), _parser=ckpt)
    sub = ckpt.add_subparsers(
        dest="ckpt_command", metavar="ACTION", help="what to do (each has its own --help)"
    )
    source = "the checkpoint: a file, a directory or a shard index (see safetorch ckpt --help)"

    inspect = _leaf(
        sub,
        "inspect",
        "container keys, state dicts, tensors, dtypes, prefixes, unsafe globals; a directory "
        "or shard index file by file",
        _CKPT,
        _epilog(
            "exit status: 0 described, 1 unsafe globals found (nothing was loaded),",
            "2 bad input (missing, unreadable or corrupt checkpoint, unknown --key).",
        ),
    )
    inspect.add_argument("path", metavar="PATH", nargs="?", help=source)
    inspect.add_argument(
        "--keys",
        nargs="?",
        const="*",
        default=None,
        metavar="GLOB",
        help="list every entry (key, shape, dtype, bytes), optionally only keys matching GLOB "
        "(before or after PATH: --keys model.pt lists every key of model.pt)",
    )
    inspect.add_argument(
        "--key",
        default=None,
        help="container key (or st.save_state object name) of the state dict to describe",
    )
    _add_output(inspect)
    _add_no_progress(inspect)
    _add_allow(inspect)

    convert = _leaf(
        sub,
        "convert",
        "rewrite atomically: strip wrapper prefixes; torch, safetensors (shards), DCP",
        _CKPT,
        _epilog(
            "What OUT cannot hold is named ('not carried over', and 'dropped' in --json): a",
            "safetensors file holds one state dict's tensors, so the optimizer, the epoch or a",
            "st.save_state file's RNG stay behind (--to torch keeps everything).",
            "exit status: 0 written, 1 failed work (e.g. disk full), 2 bad input.",
        ),
    )
    convert.add_argument("src", metavar="IN", help="the checkpoint to read (any layout)")
    convert.add_argument(
        "dst",
        metavar="OUT",
        help="the path to write (replaced atomically): a file, or a directory for --to dcp "
        "and --max-shard-size",
    )
    convert.add_argument(
        "--strip",
        default="auto",
        help="'auto' (wrapper segments such as module., _orig_mod.), 'none', or a leading "
        "prefix ending in '.' (e.g. model.)",
    )
    convert.add_argument(
        "--to",
        choices=("torch", "safetensors", "dcp"),
        default=None,
        help="output format (default from OUT's extension); dcp writes a DCP directory",
    )
    convert.add_argument(
        "--max-shard-size",
        default=None,
        metavar="SIZE",
        help="safetensors shards of at most SIZE (e.g. 5GB) in the directory OUT, with "
        "model.safetensors.index.json (implies --to safetensors)",
    )
    convert.add_argument(
        "--max-bytes",
        default=None,
        metavar="SIZE",
        help="with --to safetensors/dcp: the most tensor data to write (views are written in "
        "full); default 2x the source's storage bytes + 64 MiB",
    )
    convert.add_argument(
        "--key",
        default=None,
        help="container key (or st.save_state object name) of the state dict to write (only "
        "that one)",
    )
    _add_output(convert)
    _add_no_progress(convert)
    _add_allow(convert)

    diff = _leaf(
        sub,
        "diff",
        "keys only in one, shape/dtype changes, value differences (max abs diff)",
        _CKPT,
        _epilog("exit status: 0 identical, 1 different, 2 bad input."),
    )
    diff.add_argument("a", metavar="A", help="the first checkpoint (any layout)")
    diff.add_argument("b", metavar="B", help="the second checkpoint (any layout)")
    diff.add_argument(
        "--key",
        default=None,
        help="container key (or st.save_state object name) of the state dict in both",
    )
    for name, what in (("atol", "absolute"), ("rtol", "relative")):
        diff.add_argument(
            f"--{name}",
            type=_tolerance,
            default=0.0,
            metavar="TOL",
            help=f"{what} tolerance: values are equal where |a - b| <= atol + rtol * |b| "
            "(torch.isclose; default 0: exact); exit 0 when every difference is within it",
        )
    _add_output(diff)
    _add_no_progress(diff)
    _add_allow(diff)

    verify = _leaf(
        sub,
        "verify",
        "integrity torch does not check: every zip record's CRC-32, safetensors offsets; a "
        "directory or shard index file by file (exit 1 on a problem)",
        _CKPT,
        _epilog("exit status: 0 intact, 1 a problem found, 2 bad input."),
    )
    verify.add_argument("path", metavar="PATH", help=source)
    _add_output(verify)
    _add_allow(verify)

    fit = _leaf(
        sub,
        "fit",
        "what st.load_state_dict would do with a model, without loading it",
        _CKPT,
        _epilog(
            "exit status: 0 every key fits, 1 a strict load would refuse, 2 bad input or a",
            "--model that cannot be built.",
        ),
    )
    fit.add_argument("path", metavar="PATH", help=source)
    fit.add_argument(
        "--model",
        required=True,
        metavar="MODULE:FACTORY",
        help="the model: an importable factory called without arguments, or a module instance",
    )
    fit.add_argument(
        "--key", default=None, help="container key (or st.save_state object name) of the state dict"
    )
    fit.add_argument(
        "--prefix", default=None, help="take the keys under this module path (e.g. features.)"
    )
    _add_output(fit)
    _add_allow(fit)


def _ckpt_usage(args: argparse.Namespace) -> int:
    args._parser.print_help(sys.stderr)
    return 2


def add_run_parsers(subparsers: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    """Register ``run``, ``install-hook`` and ``uninstall-hook`` (nothing imported)."""
    run = _leaf(
        subparsers,
        "run",
        COMMANDS["run"][1],
        "safetorch.patching._cli:_run",
        _epilog(
            "The report of what the patches changed goes to stderr at exit, only when a call",
            "was changed or globals were allowed (-v: always; --no-report: never).",
            "exit status: the program's own, as python's (2: SCRIPT cannot be opened or a bad",
            "safetorch option; 1: a directory without __main__.py, a missing -m module, or an",
            "uncaught exception).",
        ),
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
        "--trust",
        action="append",
        default=None,
        metavar="FILE",
        help="a checkpoint file to trust for this run, as it is now (repeatable): torch.load "
        "loads it fully (a whole model, numpy arrays); `safetorch trust FILE` makes it lasting",
    )
    run.add_argument(
        "--no-patch",
        action="append",
        default=None,
        metavar="NAMES",
        help="patch names to leave off (repeatable, or comma-separated), e.g. "
        "--no-patch legacy to run legacy-API calls as this torch does",
    )
    report = run.add_mutually_exclusive_group()
    report.add_argument("--no-report", action="store_true", help="never print the report")
    report.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="print the report even when no call was changed",
    )
    run.add_argument(
        "-m", dest="module", action="store_true", help="run a library module as a script"
    )
    run.add_argument(
        "argv",
        nargs=argparse.REMAINDER,
        metavar="SCRIPT|MODULE [ARGS...]",
        help="the program and its arguments, as after `python` (or `python -m` with -m)",
    )

    for name, handler in (("install-hook", "_install"), ("uninstall-hook", "_uninstall")):
        p = _leaf(
            subparsers,
            name,
            COMMANDS[name][1],
            f"safetorch.patching._cli:{handler}",
            _epilog("exit status: 0 done, 1 the file cannot be written or removed, 2 a bad --dir."),
        )
        p.add_argument("--dir", default=None, help="site-packages directory (default: this venv)")


def add_trust_parsers(subparsers: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    """Register ``trust`` (nothing imported)."""
    p = _leaf(
        subparsers,
        "trust",
        COMMANDS["trust"][1],
        "safetorch._trust_command:run",
        _epilog(
            "Each FILE is read once; its size and SHA-256 go into your private ledger",
            "($XDG_STATE_HOME/safetorch, no paths stored). A changed file is untrusted again.",
            "Files safetorch writes (st.save, st.save_checkpoint, CheckpointSaver, torch.save",
            "under safetorch run) are recorded by themselves: this is for files from before.",
            "exit status: 0 trusted (or removed), 1 a file could not be read or trusted, 2 a",
            "usage error or no confirmation (not a terminal and no --yes).",
        ),
        description=(
            "Show the globals each checkpoint FILE would import when loaded fully, ask for "
            "confirmation, and record its hash: st.load and the patched torch.load then load "
            "it as torch.load(weights_only=False) would. Nothing from the file runs here."
        ),
    )
    p.add_argument("files", nargs="*", metavar="FILE", help="checkpoint files to trust")
    p.add_argument("-y", "--yes", action="store_true", help="trust without asking (scripts)")
    p.add_argument(
        "--remove", action="store_true", help="take the trust back (the file as it is now)"
    )


def add_completion_parsers(
    subparsers: "argparse._SubParsersAction[argparse.ArgumentParser]",
) -> None:
    """Register ``completion`` (nothing imported)."""
    p = _leaf(
        subparsers,
        "completion",
        COMMANDS["completion"][1],
        "safetorch._completion:run",
        _epilog(
            "Generated from the argument parser: every command, action and option. Install:",
            "  safetorch completion bash > ~/.local/share/bash-completion/completions/safetorch",
            '  safetorch completion zsh > "${fpath[1]}/_safetorch"',
            "  safetorch completion fish > ~/.config/fish/completions/safetorch.fish",
            "exit status: 0 printed, 2 an unknown SHELL.",
        ),
    )
    p.add_argument(
        "shell", metavar="SHELL", choices=("bash", "zsh", "fish"), help="bash, zsh or fish"
    )


_COMMAND_HELP = "what to run (each has its own --help)"


def _top_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="safetorch",
        description="Safe wrappers, monkeypatch mode and a static checker for PyTorch pitfalls.",
        epilog="exit status: 0 success, 1 findings or failed work, 2 usage error, bad input or "
        "a missing package, 130 interrupted; each command's --help says more.",
    )
    parser.add_argument("--version", action="version", version=_version())
    return parser


def _version() -> str:
    from safetorch import __version__

    return f"safetorch {__version__}"


def build_parser(commands: Optional[List[str]] = None) -> argparse.ArgumentParser:
    """The ``safetorch`` argument parser with the commands ``commands`` (default: all).

    Building it imports no area's implementation, and never torch.
    """
    parser = _top_parser()
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", help=_COMMAND_HELP)
    registrars: List[str] = []
    for name in commands or list(COMMANDS):
        spec = COMMANDS[name][0]
        if spec not in registrars:
            registrars.append(spec)
    for spec in registrars:
        _registrar(spec)(sub)
    return parser


def _help_parser() -> argparse.ArgumentParser:
    """The top-level parser for ``--help``: commands listed from the table, nothing imported."""
    parser = _top_parser()
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", help=_COMMAND_HELP)
    for name, (_, text) in COMMANDS.items():
        sub.add_parser(name, help=text, add_help=False)
    return parser


# --- running -------------------------------------------------------------------------------
def _missing_package(exc: ModuleNotFoundError) -> Optional[str]:
    """The top-level package a failed import wanted, unless it is safetorch itself (a bug of
    ours must keep its traceback)."""
    name = (exc.name or "").split(".")[0]
    return name if name and name != "safetorch" else None


def _install_hint(package: str) -> str:
    if package == "torch":
        return f"pip install torch (CPU or CUDA build: {_TORCH_URL})"
    return f"pip install {package}"


_CKPT_ACTIONS = ("inspect", "convert", "diff", "verify", "fit")


def _prog_of(argv: List[str]) -> str:
    """``safetorch ckpt convert``: the command a message is about, from the command line."""
    words = ["safetorch"]
    if argv and argv[0] in COMMANDS:
        words.append(argv[0])
        if argv[0] == "ckpt" and len(argv) > 1 and argv[1] in _CKPT_ACTIONS:
            words.append(argv[1])
    return " ".join(words)


def main(argv: Optional[List[str]] = None) -> int:
    """Run the ``safetorch`` command line; returns the exit status.

    >>> from safetorch._cli import main
    >>> main(["--version"])  # doctest: +ELLIPSIS
    safetorch ...
    0
    """
    args_list = sys.argv[1:] if argv is None else list(argv)
    prog = _prog_of(args_list)
    try:
        return _main(args_list)
    except _UsageError as exc:
        message = str(exc)
        if exc.parser is not None:
            usage = _short_usage(exc.parser)
            message = f"error: {message} (usage: {usage}; see {exc.parser.prog} --help)"
            say_error(exc.parser.prog, message)
        else:
            say_error("safetorch", message)
        return 2
    except ModuleNotFoundError as exc:
        package = _missing_package(exc)
        if package is None:
            raise
        also = "; `safetorch check` works without it" if package == "torch" else ""
        say_error(
            prog,
            f"needs {package}, which this Python ({sys.executable}) cannot import; install it: "
            f"{_install_hint(package)}{also}",
        )
        return 2
    except KeyboardInterrupt:
        say_error(prog, "interrupted")
        return _INTERRUPTED
    except BrokenPipeError:
        # The reader went away (`safetorch doctor | head`): end quietly, as Python's docs
        # advise, pointing stdout at devnull so the interpreter's final flush cannot fail.
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
        raise _UsageError(f"error: unrecognized option {first!r} (see safetorch --help)")
    if first not in COMMANDS:
        raise _UsageError(f"error: unknown command {first!r} (choose from {', '.join(COMMANDS)})")
    parser = build_parser([first])
    try:
        args, extra = parser.parse_known_args(argv)
    except SystemExit as exc:  # --help of a subcommand
        return int(exc.code or 0) if not isinstance(exc.code, str) else 2
    leaf: argparse.ArgumentParser = getattr(args, "_parser", parser)
    if extra:  # named by the subcommand that did not know them (argparse says "safetorch")
        leaf.error(f"unrecognized arguments: {' '.join(extra)}")
    check = getattr(args, "_check", None)
    if check is not None:  # what argparse cannot check by itself; a usage error as its own
        check(args, leaf)
    func = getattr(args, "func", None)
    if func is None:
        leaf.print_help(sys.stderr)
        return 2
    return int(func(args) or 0)
