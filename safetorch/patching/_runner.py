"""``safetorch run``: run a script or module exactly as ``python`` would, with patches on.

What "exactly" covers, and how:

* ``sys.argv`` is ``[SCRIPT, *ARGS]`` (``-m``: the module's file, as ``python -m``);
  ``sys.path[0]`` is the script's real directory (``-m``: the working directory);
  ``__name__ == "__main__"``, ``__file__`` is absolute (as CPython >= 3.9), ``__loader__`` a
  SourceFileLoader, and the script's module *is* ``sys.modules["__main__"]`` (pickling and
  multiprocessing find classes defined in it). A script file is compiled and executed the
  way CPython's ``pymain_run_file`` does it: ``runpy.run_path`` would set ``sys.argv[0]`` to
  the path it is given, so argv[0] and ``__file__`` could not both match ``python``.
  Directories and zip files with a ``__main__.py`` go through ``runpy.run_path``, ``-m``
  through ``runpy.run_module``.
* Patches go on when the program imports torch, before that ``import`` statement returns
  (at once when torch is already imported), so even names it binds at import
  (``from torch.nn.functional import upsample``) are the wrappers; a program that never
  imports torch never pays for torch or the patches (``_activation``).
* Exit status: ``SystemExit`` propagates untouched; an uncaught exception prints the same
  traceback ``python`` prints (runner, runpy, safetorch and wrapt frames removed, through
  ``sys.excepthook``) and exits 1; a script that cannot be opened exits 2 and a directory
  without ``__main__.py`` or a missing module 1, with python's one-line message and no
  report; an uncaught ``KeyboardInterrupt`` ends the process by SIGINT, as CPython does.
* Child processes: ``SAFETORCH_PATCH`` is exported, ``fork`` children inherit the patched
  interpreter, and ``spawn`` children (multiprocessing, DataLoader workers,
  torch.multiprocessing.spawn) run ``import safetorch.patching._boot`` before
  ``spawn_main`` through a wrapper on ``multiprocessing.spawn.get_command_line``.
  ``forkserver`` children are patched only when the .pth hook is installed
  (``safetorch install-hook``). Calls in child processes are not in the report.
* The report goes to stderr from an ``atexit`` handler registered before the program runs,
  so it comes after the program's own atexit handlers and after non-daemon threads end.
* Trust by provenance: the patched ``torch.save`` records the hash of each file a
  weights-only load would refuse (a whole model, numpy arrays), so the program's own
  ``torch.save(model, p)`` ... ``torch.load(p)`` loads; ``--trust FILE`` trusts a file from
  elsewhere for this run only (its hash in ``SAFETORCH_TRUST``, which children inherit).
"""

from __future__ import annotations

import atexit
import builtins
import importlib.machinery
import importlib.util
import multiprocessing.spawn
import os
import runpy
import signal
import sys
import zipfile
from types import ModuleType, TracebackType
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, TextIO, Tuple

import wrapt

from safetorch.patching import _activation
from safetorch.patching._allow import ALLOW_ENV, allowed_globals

if TYPE_CHECKING:
    from safetorch.patching._report import ReportEntry

__all__: List[str] = []

ENV_VAR = "SAFETORCH_PATCH"
_BOOT = "import safetorch.patching._boot; "
_HERE = os.path.abspath(__file__)
_RUNPY = os.path.abspath(runpy.__file__)
# runpy's own "cannot find/run this module" error (an ImportError subclass); an ImportError
# raised by the module's code is not one.
_RUNPY_ERROR: Any = getattr(runpy, "_Error", ())


def _short(site: str) -> str:
    """A call site relative to the working directory when it lies below it."""
    path, sep, line = site.rpartition(":")
    if not sep or not os.path.isabs(path):
        return site
    rel = os.path.relpath(path)
    return f"{rel}:{line}" if not rel.startswith("..") else site


def format_report(names: Sequence[str]) -> str:
    """The end-of-run report: per patch, the calls it changed, then each kind of change with
    its count and first call site (one call may make several changes)."""
    # Read from the registry only when it was imported: a program that never imported torch
    # had nothing patched, and its report must not import torch at exit.
    registry = sys.modules.get("safetorch.patching._registry")
    entries = registry.report_entries() if registry is not None else []
    lines = [f"safetorch run: patches on: {', '.join(names) or 'none'}"]
    if registry is None and _activation.waiting():
        lines.append("  the program never imported torch: nothing was patched")
    allowed = allowed_globals()
    if allowed:
        lines.append(f"  allowed globals (--allow / {ALLOW_ENV}): {', '.join(allowed)}")
    by_patch: Dict[str, List[ReportEntry]] = {}
    for e in entries:
        by_patch.setdefault(e.patch, []).append(e)
    width = max([len(n) for n in names] + [4])
    for name in names:
        found = by_patch.get(name)
        if not found:
            lines.append(f"  {name:<{width}}  no call changed")
            continue
        calls = sys.modules["safetorch.patching._report"].call_count(name)
        changes = sum(e.count for e in found)
        head = f"  {name:<{width}}  {calls} call{'s' if calls != 1 else ''} changed"
        if changes != calls:
            head += f" ({changes} changes)"
        lines.append(head)
        for e in found:
            detail = f" ({e.detail})" if e.detail else ""
            lines.append(f"  {'':<{width}}    {e.count:>5} x {e.kind}{detail}")
            lines.append(f"  {'':<{width}}            first at {_short(e.first_site)}")
    return "\n".join(lines)


def print_report(names: Sequence[str], stream: Optional[TextIO] = None) -> None:
    """Write the run report of the patches ``names`` (:func:`format_report`) to ``stream``
    (stderr by default), as ``safetorch run`` does at exit; a closed stream is ignored."""
    out = stream or sys.stderr
    try:
        out.write(format_report(names) + "\n")
        out.flush()
    except (OSError, ValueError):  # stderr closed by the program
        pass


def _with_boot(wrapped: Any, instance: Any, args: Tuple[Any, ...], kwargs: Dict) -> Any:
    cmd = list(wrapped(*args, **kwargs))
    if "-c" in cmd:
        i = cmd.index("-c") + 1
        if i < len(cmd) and _BOOT not in cmd[i]:
            cmd[i] = _BOOT + cmd[i]
    return cmd


class _SpawnBootstrap:
    """Wraps ``multiprocessing.spawn.get_command_line`` for the duration of a run."""

    def __enter__(self) -> None:
        spawn = multiprocessing.spawn
        self._original = vars(spawn)["get_command_line"]
        spawn.get_command_line = wrapt.FunctionWrapper(self._original, _with_boot)

    def __exit__(self, *exc: object) -> None:
        multiprocessing.spawn.get_command_line = self._original


def _is_zip(path: str) -> bool:
    return os.path.isfile(path) and zipfile.is_zipfile(path)


_SAFETORCH_DIR = os.path.dirname(os.path.dirname(_HERE)) + os.sep
_WRAPT_DIR = os.path.dirname(os.path.abspath(wrapt.__file__)) + os.sep


def _internal(tb: TracebackType) -> bool:
    filename = os.path.abspath(tb.tb_frame.f_code.co_filename)
    return filename.startswith((_SAFETORCH_DIR, _WRAPT_DIR)) or filename == _RUNPY


def _user_traceback(tb: Optional[TracebackType]) -> Optional[TracebackType]:
    """The traceback without runner, runpy, safetorch and wrapt frames, so it reads as
    ``python``'s: the patched call's line in user code is followed by torch's own frames.
    If every frame is internal (a bug in safetorch), the traceback is kept whole."""
    kept = []
    node = tb
    while node is not None:
        if not _internal(node):
            kept.append(node)
        node = node.tb_next
    if not kept:
        return tb
    for a, b in zip(kept, kept[1:]):
        a.tb_next = b
    kept[-1].tb_next = None
    return kept[0]


def _clean_chain(exc: BaseException) -> None:
    seen = set()
    todo: List[Optional[BaseException]] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        e.__traceback__ = _user_traceback(e.__traceback__)
        todo += [e.__cause__, e.__context__]


def check_target(target: str, *, module: bool = False) -> Optional[Tuple[str, int]]:
    """``(message, exit status)`` when ``python`` would refuse to start ``target``, else None.

    The statuses are python's: 2 for a script that cannot be opened, 1 for a directory or
    zip file without ``__main__`` and for a module that cannot be found.
    """
    if module:
        try:
            spec = importlib.util.find_spec(target)
        except (ImportError, ValueError) as exc:
            return f"{exc}; check the module name and sys.path (the working directory)", 1
        if spec is None:
            return f"No module named {target}; check the module name and sys.path", 1
        return None
    abspath = os.path.abspath(target)
    if os.path.isdir(target):
        if not os.path.exists(os.path.join(target, "__main__.py")):
            return f"can't find '__main__' module in {target!r}; pass a script in it", 1
        return None
    try:
        with open(abspath, "rb"):
            pass
    except OSError as exc:
        return f"can't open file {abspath!r}: [Errno {exc.errno}] {exc.strerror}", 2
    return None


def _run_file(path: str) -> None:
    """Execute a script file as ``python path`` does (see the module docstring)."""
    abspath = os.path.abspath(path)
    with open(abspath, "rb") as fh:
        source = fh.read()  # bytes: compile() honours a PEP 263 encoding cookie
    code = compile(source, abspath, "exec", dont_inherit=True)
    main = ModuleType("__main__")
    main.__dict__.update(
        __file__=abspath,
        __cached__=None,
        __loader__=importlib.machinery.SourceFileLoader("__main__", abspath),
        __spec__=None,
        __package__=None,
        __builtins__=builtins,
    )
    sys.modules["__main__"] = main
    exec(code, main.__dict__)


def _raise_deferred_index_errors() -> None:
    """The end of the script is a synchronising point safetorch controls: an out-of-range
    index that ``mode="deferred"`` recorded and nothing raised is the script's error, named
    by its line, as ``st.raise_deferred()`` would raise it (one host sync per device)."""
    tensor = sys.modules.get("safetorch.tensor")
    if tensor is not None:
        tensor.raise_deferred()


def _excepthook(exc: BaseException) -> None:
    # The traceback object must be the exception's own: the default hook prints
    # exc.__traceback__ whatever it is passed. Chained exceptions are cleaned too.
    _clean_chain(exc)
    sys.excepthook(type(exc), exc, exc.__traceback__)


def _die_by_sigint() -> None:
    # CPython exits an uncaught KeyboardInterrupt by re-raising SIGINT (bpo-1054041), after
    # running atexit handlers; the parent then sees "killed by SIGINT", not exit status 1.
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGINT)


def run(
    target: str,
    args: Sequence[str],
    *,
    module: bool = False,
    patches: Sequence[str] = ("all",),
    report: bool = True,
    allow: Sequence[str] = (),
    trust: Sequence[str] = (),
) -> int:
    """Run ``target`` (a script path, or a module name with ``module=True``) under patches.

    ``allow`` names globals (``"module.Name"``) that checkpoints loaded through the patched
    ``torch.load`` may reference; they are added to ``SAFETORCH_ALLOW``, which child
    processes inherit. ``trust`` names checkpoint files to trust for this run (the hash of
    each as it is now goes into ``SAFETORCH_TRUST``; a file changed later is not trusted);
    like ``SAFETORCH_PATCH`` it stays set until the process ends, so the program's threads,
    atexit handlers and children load alike. Returns the exit status for an uncaught
    exception (1); ``SystemExit`` propagates.
    """
    names = _activation.resolve_names(patches, default_all=True)
    if allow:
        merged = (*allowed_globals(), *allow)
        os.environ[ALLOW_ENV] = ",".join(dict.fromkeys(merged))
    if trust:
        trust_for_run(trust)
    return _run_patched(target, args, module=module, names=names, report=report)


def trust_for_run(paths: Sequence[str]) -> None:
    """Trust the checkpoint files ``paths``, as they are now, for this process and its children
    (``st.checkpoint.saving.trust_for_run``).

    Raises:
        CheckpointError: a file is missing or not a regular file (nothing is trusted then).
    """
    from safetorch.checkpoint import saving  # torch: only when --trust is given

    saving.trust_for_run(paths)


def _run_patched(
    target: str, args: Sequence[str], *, module: bool, names: Sequence[str], report: bool
) -> int:
    # Now when torch is imported, else when the program imports it (_activation).
    _activation.enable(names)
    counts = sys.modules.get("safetorch.patching._report")
    if counts is not None:
        counts.reset_counts()
    os.environ[ENV_VAR] = ",".join(names)
    if report:
        atexit.register(print_report, names)
    if module:
        sys.argv = [target, *args]  # runpy replaces argv[0] with the module's file
        sys.path[0] = os.getcwd()
    else:
        sys.argv = [target, *args]
        sys.path[0] = os.path.dirname(os.path.realpath(target))
    try:
        with _SpawnBootstrap():
            if module:
                try:
                    runpy.run_module(target, run_name="__main__", alter_sys=True)
                except _RUNPY_ERROR as exc:  # python -m: "python: No module named x", status 1
                    sys.stderr.write(f"safetorch run: {exc}\n")
                    return 1
            elif os.path.isdir(target) or not target.endswith((".py", ".pyw")) and _is_zip(target):
                runpy.run_path(target, run_name="__main__")
            else:
                _run_file(target)
        _raise_deferred_index_errors()
    except SystemExit:
        raise
    except KeyboardInterrupt as exc:
        _excepthook(exc)
        _die_by_sigint()
        return 130  # not reached
    except BaseException as exc:
        _excepthook(exc)
        return 1
    return 0
