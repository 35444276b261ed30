"""The ``safetorch`` command follows ruff's and pip's conventions (issue 24): ``--help`` never
imports torch, a missing torch / Ctrl-C / a bad flag is one line (never a traceback), colour only
on a terminal, exit codes documented for every subcommand, ``run`` quiet when nothing changed."""

from __future__ import annotations

import argparse
import io
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Dict, Iterator, List, Tuple

import pytest

from safetorch import _cli
from safetorch._cli import COMMANDS, build_parser, main, paint

REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 180

# A child whose `import torch` fails as it does where torch is not installed.
NO_TORCH = textwrap.dedent(
    """
    import sys
    class _NoTorch:
        def find_spec(self, name, path=None, target=None):
            if name == "torch" or name.startswith("torch."):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
    sys.meta_path.insert(0, _NoTorch())
    """
)


def _python(code: str, *args: str, cwd: Path = REPO, env: Dict[str, str] = {}):  # noqa: B006
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(REPO), **env},
        check=False,
    )


def _leaves(parser: argparse.ArgumentParser) -> Iterator[Tuple[List[str], argparse.ArgumentParser]]:
    """Every command and subcommand parser, with its words (``["ckpt", "diff"]``)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                words = sub.prog.split()[1:]
                yield words, sub
                yield from _leaves(sub)


ALL = [words for words, _ in _leaves(build_parser())]


def test_every_help_works_without_torch() -> None:
    """--help of every command and subcommand, in a process where torch cannot be imported:
    the definitions and their registrars import nothing heavy."""
    code = NO_TORCH + textwrap.dedent(
        f"""
        from safetorch._cli import main
        for words in {ALL!r}:
            try:
                status = main([*words, "--help"])
            except SystemExit as exc:
                status = exc.code
            assert status == 0, (words, status)
        assert "torch" not in sys.modules
        print("ok")
        """
    )
    done = _python(code)
    assert done.returncode == 0 and done.stdout.rstrip().endswith("ok"), done.stderr
    assert "Traceback" not in done.stderr


def test_help_does_not_import_torch_where_torch_is_installed() -> None:
    done = _python(
        "import sys\nfrom safetorch._cli import main\n"
        "for words in (['ckpt', 'convert'], ['run'], ['install-hook'], ['doctor'], ['check']):\n"
        "    assert main([*words, '--help']) == 0\n"
        "print('torch' in sys.modules)\n"
    )
    assert done.returncode == 0 and done.stdout.rstrip().endswith("False"), done.stderr


@pytest.mark.parametrize(
    "argv",
    [
        ["doctor"],
        ["install-hook"],
        ["ckpt", "inspect", "x.pt"],
        ["ckpt", "convert", "a.pt", "b.pt"],
        ["run", "prog.py"],
    ],
    ids=" ".join,
)
def test_missing_torch_is_one_line_naming_the_fix(argv: List[str], tmp_path: Path) -> None:
    (tmp_path / "prog.py").write_text("print('hi')\n")
    done = _python(
        NO_TORCH + "from safetorch._cli import main\nraise SystemExit(main(sys.argv[1:]))\n",
        *argv,
        cwd=tmp_path,
    )
    assert done.returncode == 2 and done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    prog = " ".join(["safetorch", *argv[: 2 if argv[0] == "ckpt" else 1]])
    assert lines[0].startswith(prog + ": needs torch"), lines[0]
    assert "pip install torch" in lines[0]


def test_every_subcommand_documents_its_exit_status_and_positionals() -> None:
    for words, parser in _leaves(build_parser()):
        text = parser.format_help()
        assert "exit status" in text, words
        for action in parser._get_positional_actions():
            if isinstance(action, argparse._SubParsersAction):
                continue
            assert action.help, f"{' '.join(words)}: positional {action.dest} has no help"


@pytest.mark.parametrize("words", [w for w in ALL if w != ["ckpt"]], ids=" ".join)
def test_bad_flag_is_one_line_naming_the_subcommand_and_its_usage(
    words: List[str], capsys: pytest.CaptureFixture[str]
) -> None:
    positionals = {"inspect": 1, "verify": 1, "fit": 1, "convert": 2, "diff": 2}
    argv = [*words, "--no-such-flag", *["x.pt"] * positionals.get(words[-1], 0)]
    if words == ["run"]:
        argv = ["run", "--no-such-flag", "prog.py"]
    if words == ["completion"]:
        argv = ["completion", "--no-such-flag", "bash"]
    if words == ["ckpt", "fit"]:
        argv += ["--model", "m:f"]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "Traceback" not in err
    prog = "safetorch " + " ".join(words)
    assert err.startswith(f"{prog}: error: ") and "--no-such-flag" in err, err
    assert f"(usage: {prog} [OPTIONS]" in err and f"see {prog} --help" in err


def test_flags_are_not_abbreviated(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`--key` is not a prefix of `--keys` to argparse (it once listed keys matching 'model')."""
    assert main(["ckpt", "diff", "a", "b", "--js"]) == 2
    assert "unrecognized arguments: --js" in capsys.readouterr().err


def test_interrupt_anywhere_is_exit_130_and_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def interrupted(args: argparse.Namespace) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr("safetorch._doctor._run", interrupted)
    assert main(["doctor"]) == 130
    assert capsys.readouterr().err == "safetorch doctor: interrupted\n"
    monkeypatch.setattr(_cli._Lazy, "__call__", lambda self, args: interrupted(args))
    assert main(["ckpt", "verify", "x.pt"]) == 130
    assert capsys.readouterr().err == "safetorch ckpt verify: interrupted\n"


def test_colour_only_on_a_terminal_and_never_with_no_color(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class TTY(io.StringIO):
        def isatty(self) -> bool:
            return True

    for var in ("NO_COLOR", "FORCE_COLOR", "TERM"):
        monkeypatch.delenv(var, raising=False)
    assert paint("ok", "green", TTY()) == "\x1b[32mok\x1b[0m"
    assert paint("ok", "green", io.StringIO()) == "ok"
    monkeypatch.setenv("NO_COLOR", "1")
    assert paint("ok", "green", TTY()) == "ok"
    monkeypatch.delenv("NO_COLOR")
    monkeypatch.setenv("TERM", "dumb")
    assert paint("ok", "green", TTY()) == "ok"
    monkeypatch.setenv("FORCE_COLOR", "1")
    assert paint("ok", "bold red", io.StringIO()) == "\x1b[1;31mok\x1b[0m"


def test_usage_error_is_coloured_on_a_terminal(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("FORCE_COLOR", "1")
    monkeypatch.delenv("NO_COLOR", raising=False)
    assert main(["nosuch"]) == 2
    assert capsys.readouterr().err.startswith("\x1b[1;31msafetorch:\x1b[0m error: unknown")


def test_commands_table_names_torch_free_registrars() -> None:
    for name, (spec, _) in COMMANDS.items():
        module = spec.partition(":")[0]
        assert not module.startswith(("safetorch.checkpoint", "safetorch.patching")), name


# --- safetorch run: the report only when something changed ---------------------------------
def _safetorch_run(tmp_path: Path, code: str, *options: str):
    (tmp_path / "prog.py").write_text(code)
    return subprocess.run(
        [sys.executable, "-m", "safetorch", "run", *options, "prog.py"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)},
        timeout=TIMEOUT,
    )


@pytest.mark.slow
def test_run_reports_only_when_a_call_changed(tmp_path: Path) -> None:
    quiet = _safetorch_run(tmp_path, "print('hello')\n")
    assert quiet.returncode == 0 and quiet.stdout == "hello\n"
    assert quiet.stderr == "", quiet.stderr
    verbose = _safetorch_run(tmp_path, "print('hello')\n", "-v")
    assert "safetorch run: patches on:" in verbose.stderr and "no call changed" in verbose.stderr
    changed = _safetorch_run(
        tmp_path,
        "import torch, torch.nn.functional as F\nF.upsample(torch.ones(1, 1, 2), scale_factor=2)\n",
    )
    assert changed.returncode == 0, changed.stderr
    assert "1 x F.upsample -> st.upsample" in changed.stderr
    never = _safetorch_run(tmp_path, "print('hello')\n", "-v", "--no-report")
    assert never.returncode == 2 and "not allowed with argument" in never.stderr


def test_check_diff_says_would_fix(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "legacy.py"
    source = "import torch.nn.functional as F\ny = F.upsample(x, scale_factor=2)\n"
    path.write_text(source)
    main(["check", "--diff", str(path)])
    err = capsys.readouterr().err
    assert "would fix 1 finding(s)" in err and "fixed" not in err.replace("would fix", "")
    assert path.read_text() == source
