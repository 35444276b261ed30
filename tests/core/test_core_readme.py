"""The examples of the README and of every page under docs/ run, and their names and links hold.

In each docs page, every ```python block with `>>>` is a doctest (run in order, one namespace
per file); every other ```python block is executed as a script, in order within its `## `
section (one namespace per section), in a temporary working directory. The README promises
more: each of its ```python blocks runs on its own (a fresh namespace each), and so does each
```sh block of its Quickstart, in an empty directory, with the installed `safetorch` command.
"""

from __future__ import annotations

import doctest
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
# The project's home: README links are absolute so that they work on a package index too.
REPO = "https://github.com/safetorch/safetorch"
_BLOCK = re.compile(r"```python\n(.*?)```", flags=re.S)
_SH_BLOCK = re.compile(r"```sh\n(.*?)```", flags=re.S)
# `st.<name>` or `st.<area>.<name>` in prose or code (not `best.pt`, not `x.st.y`).
_ST_NAME = re.compile(r"(?<![\w.])st\.([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)")


def _name(page: Path) -> str:
    return str(page.relative_to(ROOT))


def _chunks(page: Path) -> List[str]:
    return re.split(r"\n(?=## )", page.read_text(encoding="utf-8"))


def _sections() -> List[Tuple[str, List[str]]]:
    out = []
    for page in PAGES:
        for chunk in _chunks(page):
            title = f"{_name(page)}: " + chunk.splitlines()[0].lstrip("# ").strip()
            scripts = [b for b in _BLOCK.findall(chunk) if ">>>" not in b]
            if page == README:  # each README block on its own
                out += [(f"{title}#{i}", [b]) for i, b in enumerate(scripts)]
            elif scripts:
                out.append((title, scripts))
    return out


def _readme_shell_blocks() -> List[str]:
    quickstart = [c for c in _chunks(README) if c.startswith("## Quickstart")]
    assert len(quickstart) == 1
    return _SH_BLOCK.findall(quickstart[0])


def test_docs_pages_exist_and_are_linked_from_the_readme() -> None:
    text = README.read_text(encoding="utf-8")
    assert len(PAGES) > 5
    for page in PAGES[1:]:
        assert f"({REPO}/blob/main/{_name(page)})" in text, f"README does not link {_name(page)}"
    assert len(text.splitlines()) <= 250


def test_readme_links_are_absolute() -> None:
    """A package index shows the README without the repository: a relative link is dead there."""
    targets = re.findall(r"\]\(([^)]*)\)", README.read_text(encoding="utf-8"))
    assert targets
    relative = [t for t in targets if not t.startswith("https://")]
    assert relative == [], relative


def test_readme_installs_for_users_first() -> None:
    text = README.read_text(encoding="utf-8")
    install = text.index("## Install")
    assert text.index("pip install safetorch", install) < text.index("git clone")
    first_sh = _SH_BLOCK.search(text, install)
    assert first_sh is not None
    # torch pinned before safetorch, from an index that is not the multi-GB CUDA default
    assert re.match(r"pip install torch==[\d.]+ --index-url \S+/cpu\n", first_sh.group(1))
    assert "pip install --no-deps safetorch" in text  # the checker without torch
    assert "make test" in text and ".ci/run" in text  # the developer's (and CI's) command
    assert "make test" in (ROOT / ".ci" / "run").read_text(encoding="utf-8")


def test_every_st_name_the_docs_teach_is_listed_and_resolves() -> None:
    """Each ``st.<name>`` of the README and docs/ is in ``dir(st)`` (so type checkers and IDEs
    know it) and resolves; ``st.<area>.<name>`` resolves through the subpackage. Conversely,
    ``dir(st)`` lists no plumbing the docs do not teach (``_HOME`` beyond ``__all__``)."""
    import safetorch as st

    listed = set(dir(st))
    taught = set()
    for page in PAGES:
        for dotted in _ST_NAME.findall(page.read_text(encoding="utf-8")):
            head, *rest = dotted.split(".")
            assert head in listed, f"{_name(page)}: st.{dotted}: {head!r} is not in dir(st)"
            obj = getattr(st, head)
            for part in rest:
                assert hasattr(obj, part), f"{_name(page)}: st.{dotted} does not resolve"
                obj = getattr(obj, part)
            taught.add(head)
    plumbing = set(st._HOME) - set(st.__all__)
    assert plumbing <= taught, f"listed by dir(st) but taught nowhere: {plumbing - taught}"


def test_doctests_pass() -> None:
    attempted = 0
    for page in PAGES:
        blocks = [b for b in _BLOCK.findall(page.read_text(encoding="utf-8")) if ">>>" in b]
        if not blocks:
            continue
        test = doctest.DocTestParser().get_doctest(
            "\n\n".join(blocks), {}, _name(page), str(page), 0
        )
        runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
        result = runner.run(test)
        attempted += result.attempted
        assert result.failed == 0, f"an example in {_name(page)} failed (output above)"
    assert attempted > 10


@pytest.mark.parametrize("title,scripts", _sections(), ids=[t for t, _ in _sections()])
def test_scripts_run(title: str, scripts: List[str], tmp_path: Path, capsys: Any) -> None:
    import safetorch as st

    cwd = os.getcwd()
    os.chdir(tmp_path)
    namespace: Dict[str, Any] = {"__name__": "__readme__"}
    try:
        with warnings.catch_warnings():
            # examples may show a SafetorchWarning on purpose; everything else stays an error
            warnings.simplefilter("ignore", st.SafetorchWarning)
            for i, code in enumerate(scripts):
                exec(compile(code, f"{title}#{i}", "exec"), namespace)
    finally:
        os.chdir(cwd)
        st.unpatch()


@pytest.mark.parametrize("block", _readme_shell_blocks(), ids=lambda b: b.split()[0])
def test_readme_shell_blocks_run(block: str, tmp_path: Path) -> None:
    """Each shell block of the Quickstart runs in an empty directory; a command may exit 1
    (``safetorch check`` reporting findings) but none fails to start or raises."""
    bindir = Path(sys.executable).parent
    if not (bindir / "safetorch").exists():
        pytest.skip("no `safetorch` command next to this python (not pip-installed)")
    env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}"}
    out = subprocess.run(
        ["bash", "-c", block], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    text = out.stdout + out.stderr
    for sign in ("Traceback", "command not found", "No such file", "error:"):
        assert sign not in text, text
    assert out.returncode in (0, 1), text
