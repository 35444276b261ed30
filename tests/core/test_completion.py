"""``safetorch completion bash|zsh|fish``: scripts generated from the parser, that complete."""

from __future__ import annotations

import contextlib
import io
import shutil
import subprocess
from pathlib import Path
from typing import List, Tuple

import pytest

from safetorch._cli import build_parser, main
from safetorch._completion import command_specs, completion_script


def _run(*argv: str) -> Tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def _bash_complete(script: Path, words: List[str]) -> List[str]:
    """What bash's completion function offers for ``words`` (the last one being completed)."""
    array = " ".join(f"'{w}'" for w in words)
    done = subprocess.run(
        [
            "bash",
            "-c",
            f"source '{script}'; COMP_WORDS=({array}); COMP_CWORD={len(words) - 1}; "
            'cd "$(mktemp -d)"; _safetorch; printf "%s\\n" "${COMPREPLY[@]}"',
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return [line for line in done.stdout.splitlines() if line]


@pytest.fixture(scope="module")
def bash_script(tmp_path_factory: pytest.TempPathFactory) -> Path:
    code, out, _ = _run("completion", "bash")
    assert code == 0
    path = tmp_path_factory.mktemp("completion") / "safetorch.bash"
    path.write_text(out)
    return path


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed")
@pytest.mark.parametrize(
    "words, expected",
    [
        (["safetorch", "c"], ["ckpt", "check", "completion"]),
        (["safetorch", "ckpt", "in"], ["inspect"]),
        (["safetorch", "ckpt", "diff", "--a"], ["--atol", "--allow"]),
        (["safetorch", "ckpt", "convert", "--to", ""], ["torch", "safetensors", "dcp"]),
        (["safetorch", "check", "--output-format", "c"], ["concise"]),
        (["safetorch", "check", "--no-"], ["--no-respect-gitignore"]),
        (["safetorch", "completion", ""], []),  # SHELL has choices, not files: see below
    ],
)
def test_bash_completes_commands_options_and_choices(
    bash_script: Path, words: List[str], expected: List[str]
) -> None:
    offered = _bash_complete(bash_script, words)
    assert set(expected) <= set(offered), offered


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed")
def test_bash_script_parses(bash_script: Path) -> None:
    assert subprocess.run(["bash", "-n", str(bash_script)], timeout=60).returncode == 0


def test_every_option_of_the_parser_is_in_every_script() -> None:
    parser = build_parser()
    specs = command_specs(parser)
    options = {flag for spec in specs.values() for flag in spec.options}
    assert {"--atol", "--no-progress", "--show-fixes", "--quiet", "--patch"} <= options
    for shell in ("bash", "zsh", "fish"):
        script = completion_script(shell, parser)
        missing = [f for f in options if (f if shell != "fish" else f.lstrip("-")) not in script]
        assert missing == [], (shell, missing)


@pytest.mark.parametrize("shell", ["zsh", "fish"])
def test_other_shells_parse_where_installed(shell: str, tmp_path: Path) -> None:
    code, out, _ = _run("completion", shell)
    assert code == 0 and "safetorch" in out
    if shutil.which(shell) is None:
        assert out.count("st_path=" if shell == "zsh" else "complete -c safetorch") > 10
        return  # the syntax check needs the shell
    path = tmp_path / f"safetorch.{shell}"
    path.write_text(out)
    assert subprocess.run([shell, "-n", str(path)], timeout=60).returncode == 0


@pytest.mark.parametrize("argv", [["completion"], ["completion", "tcsh"], ["completion", "--x"]])
def test_bad_shell_is_a_usage_error(argv: List[str]) -> None:
    code, out, err = _run(*argv)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "usage: safetorch completion [OPTIONS] SHELL" in err


def test_completion_help_says_how_to_install() -> None:
    code, out, _ = _run("completion", "--help")
    assert code == 0 and "bash-completion/completions/safetorch" in out
