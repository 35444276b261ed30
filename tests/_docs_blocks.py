"""The code blocks of the README and of docs/, found and run one way for every caller.

Standard library only, and runnable as a script: tests/core/test_core_readme.py imports it to
run the blocks in the test venv, and tests/core/test_wheel_docs.py runs it *as a script* with
the python of a clean venv that holds only the built wheel and CPU torch, so that the docs are
proven against what a user installs, not against the source tree::

    python tests/_docs_blocks.py --root . --work /tmp/w --out /tmp/results.json

What runs, per page (README.md, then docs/*.md in name order):

- every ```python block with ``>>>`` is a doctest (one namespace per page, blocks in order);
- every other ```python block is a script: in the README each runs on its own (a fresh
  namespace), in a docs page the blocks of one ``## `` section share a namespace, in order;
  each runs in a fresh empty working directory;
- a python block directly followed by a ```text block prints exactly that text;
- each ```sh block of the README's Quickstart runs with bash in an empty directory, the
  ``safetorch`` command and ``python`` of the running interpreter first on ``PATH``.

Shell blocks elsewhere (installing from an index, cloning, writing into the user's shell
directories) are not run; each ``safetorch <command> --option`` they show is checked against
the installed command's ``--help`` instead (`cli_uses`).
"""

from __future__ import annotations

import argparse
import contextlib
import doctest
import io
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import traceback
import warnings
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

BLOCK = re.compile(r"```python\n(.*?)```", flags=re.S)
# a python block and, right after it, the output it prints
PRINTED = re.compile(r"```python\n(.*?)```\s*```text\n(.*?)```", flags=re.S)
SH_BLOCK = re.compile(r"```sh\n(.*?)```", flags=re.S)
# every shell-like block: sh, bash, console (a `$ ` prompt)
ANY_SHELL_BLOCK = re.compile(r"```(?:sh|bash|console)\n(.*?)```", flags=re.S)
# What a shell block's output may not contain; a command may exit 1 (`safetorch check` reporting
# findings) but none may fail to start or raise.
SHELL_FAILURE_SIGNS = ("Traceback", "command not found", "No such file", "error:")


def pages(root: Path) -> List[Path]:
    """README.md first, then every page of docs/ in name order."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def page_name(root: Path, page: Path) -> str:
    return str(page.relative_to(root))


def chunks(page: Path) -> List[str]:
    """The page split before each ``## `` heading (the first chunk is what precedes it)."""
    return re.split(r"\n(?=## )", page.read_text(encoding="utf-8"))


def sections(root: Path) -> List[Tuple[str, List[str]]]:
    """``(title, scripts)`` for every group of non-doctest python blocks that share a namespace."""
    readme = root / "README.md"
    out: List[Tuple[str, List[str]]] = []
    for page in pages(root):
        for chunk in chunks(page):
            title = f"{page_name(root, page)}: " + chunk.splitlines()[0].lstrip("# ").strip()
            scripts = [b for b in BLOCK.findall(chunk) if ">>>" not in b]
            if page == readme:  # each README block on its own
                out += [(f"{title}#{i}", [b]) for i, b in enumerate(scripts)]
            elif scripts:
                out.append((title, scripts))
    return out


def doctest_pages(root: Path) -> List[Tuple[str, str]]:
    """``(page name, its doctest blocks joined)`` for every page with a ``>>>`` block."""
    out = []
    for page in pages(root):
        blocks = [b for b in BLOCK.findall(page.read_text(encoding="utf-8")) if ">>>" in b]
        if blocks:
            out.append((page_name(root, page), "\n\n".join(blocks)))
    return out


def printed_examples(root: Path) -> List[Tuple[str, str, str]]:
    """``(page name, code, output)`` for each ```python block directly followed by a ```text
    block: the output the docs say that code prints."""
    out = []
    for page in pages(root):
        for code, text in PRINTED.findall(page.read_text(encoding="utf-8")):
            out.append((page_name(root, page), code, text))
    return out


def run_printed_example(name: str, code: str, cwd: Path) -> str:
    """What ``code`` prints to stdout, run on its own in ``cwd`` (a fresh namespace)."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        run_scripts(f"{name} (printed example)", [code], cwd)
    return printed.getvalue()


def readme_shell_blocks(root: Path) -> List[str]:
    """The ```sh blocks of the README's Quickstart section (there is exactly one)."""
    quickstart = [c for c in chunks(root / "README.md") if c.startswith("## Quickstart")]
    if len(quickstart) != 1:
        raise ValueError(f"README.md has {len(quickstart)} '## Quickstart' sections, expected 1")
    return SH_BLOCK.findall(quickstart[0])


def cli_uses(root: Path) -> List[Tuple[str, List[str], List[str]]]:
    """``(page name, [command, subcommand...], [--options])`` for each ``safetorch ...`` command
    of every shell block of every page (comments, redirections and pipes cut off)."""
    out = []
    for page in pages(root):
        for block in ANY_SHELL_BLOCK.findall(page.read_text(encoding="utf-8")):
            for line in block.splitlines():
                for part in re.split(r"&&|\|\||;|\|", line.split("  #")[0]):
                    use = _cli_use(part)
                    if use is not None:
                        out.append((page_name(root, page), *use))
    return out


def _cli_use(part: str) -> Optional[Tuple[List[str], List[str]]]:
    """``([command, subcommand...], [--options])`` of one shell command, or None when it is
    not a ``safetorch`` command (or not shell words: a heredoc body line)."""
    try:
        words = shlex.split(part.strip().removeprefix("$ "), comments=True)
    except ValueError:
        return None
    if not words or words[0] != "safetorch":
        return None
    words = [w for w in words if not w.startswith((">", "<"))]
    command = ["safetorch"]
    for word in words[1:]:  # `safetorch ckpt inspect a.pt` -> ckpt inspect
        if word.startswith("-") or not re.fullmatch(r"[a-z][a-z-]*", word):
            break
        command.append(word)
    if command[1:2] == ["run"]:  # what follows the script is the script's
        ends = [i for i, w in enumerate(words) if w.endswith(".py")]
        ends += [i + 1 for i, w in enumerate(words) if w == "-m"]
        words = words[: min(ends)] if ends else words
    options = [w.split("=")[0] for w in words if re.match(r"--?[A-Za-z]", w)]
    return command, options


@contextlib.contextmanager
def _working_directory(cwd: Path) -> Iterator[None]:
    here = os.getcwd()
    os.chdir(cwd)
    try:
        yield
    finally:
        os.chdir(here)


def _warnings_as_in_the_suite() -> None:
    """The suite's filters (pyproject.toml): every warning an error but torch's own deprecation
    noise; a SafetorchWarning an example shows on purpose is ignored."""
    warnings.simplefilter("error")
    warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"torch\..*")
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"torch\..*")
    from safetorch import SafetorchWarning

    warnings.simplefilter("ignore", SafetorchWarning)


def run_doctests(name: str, text: str, cwd: Path) -> Tuple[int, int, str]:
    """``(attempted, failed, report)`` for one page's doctest blocks, one namespace, in
    ``cwd``."""
    test = doctest.DocTestParser().get_doctest(text, {}, name, name, 0)
    report: List[str] = []
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    with _working_directory(cwd):
        result = runner.run(test, out=report.append)
    return result.attempted, result.failed, "".join(report)


def run_scripts(title: str, scripts: List[str], cwd: Path) -> None:
    """Execute one section's scripts in order, in one namespace, in ``cwd``; raises what they
    raise. Patches a block applied are undone afterwards."""
    import safetorch as st

    namespace: Dict[str, Any] = {"__name__": "__readme__"}
    try:
        with _working_directory(cwd), warnings.catch_warnings():
            _warnings_as_in_the_suite()
            for i, code in enumerate(scripts):
                exec(compile(code, f"{title}#{i}", "exec"), namespace)  # noqa: S102 - our docs
    finally:
        st.unpatch()


def run_shell_block(block: str, cwd: Path, bindir: Path) -> Tuple[int, str]:
    """``(returncode, stdout+stderr)`` of one shell block run with bash in ``cwd``."""
    env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}"}
    out = subprocess.run(
        ["bash", "-c", block], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )
    return out.returncode, out.stdout + out.stderr


def shell_block_failure(returncode: int, text: str) -> Optional[str]:
    """Why a shell block's run failed, or None."""
    for sign in SHELL_FAILURE_SIGNS:
        if sign in text:
            return f"output contains {sign!r}"
    if returncode not in (0, 1):
        return f"exit status {returncode}"
    return None


def run_all(root: Path, work: Path) -> Dict[str, Any]:
    """Every block of every page, run with this interpreter; a JSON-able record of each."""
    import safetorch

    results: Dict[str, Any] = {
        "python": sys.executable,
        "safetorch": safetorch.__file__,
        "doctests": {},
        "scripts": {},
        "shell": [],
    }
    for name, text in doctest_pages(root):
        attempted, failed, report = run_doctests(name, text, Path(tempfile.mkdtemp(dir=work)))
        results["doctests"][name] = {"attempted": attempted, "failed": failed, "report": report}
    for title, scripts in sections(root):
        try:
            run_scripts(title, scripts, Path(tempfile.mkdtemp(dir=work)))
            results["scripts"][title] = None
        except BaseException:  # noqa: BLE001 - recorded, the caller asserts
            results["scripts"][title] = traceback.format_exc()
    results["printed"] = []
    for name, code, expected in printed_examples(root):
        try:
            printed = run_printed_example(name, code, Path(tempfile.mkdtemp(dir=work)))
        except BaseException:  # noqa: BLE001 - recorded, the caller asserts
            printed = traceback.format_exc()
        results["printed"].append({"page": name, "expected": expected, "printed": printed})
    bindir = Path(sys.executable).parent
    for block in readme_shell_blocks(root):
        returncode, text = run_shell_block(block, Path(tempfile.mkdtemp(dir=work)), bindir)
        failure = shell_block_failure(returncode, text)
        results["shell"].append({"block": block, "failure": failure, "output": text})
    results["numpy_imported"] = "numpy" in sys.modules
    return results


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, required=True, help="where README.md and docs/ are")
    parser.add_argument("--work", type=Path, required=True, help="a directory for the runs")
    parser.add_argument("--out", type=Path, required=True, help="the JSON record to write")
    args = parser.parse_args(argv)
    results = run_all(args.root.resolve(), args.work.resolve())
    args.out.write_text(json.dumps(results, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
