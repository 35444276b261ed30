"""The examples of the README and of every page under docs/ run, and their names and links hold.

In each docs page, every ```python block with `>>>` is a doctest (run in order, one namespace
per file); every other ```python block is executed as a script, in order within its `## `
section (one namespace per section), in a temporary working directory. The README promises
more: each of its ```python blocks runs on its own (a fresh namespace each), and so does each
```sh block of its Quickstart, in an empty directory, with the installed `safetorch` command.
The blocks are found and run by tests/_docs_blocks.py, which test_wheel_docs.py also runs with
the python of a clean venv holding only the built wheel and CPU torch.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import List

import pytest
from _docs_blocks import (
    SH_BLOCK,
    doctest_pages,
    page_name,
    pages,
    printed_examples,
    readme_shell_blocks,
    run_doctests,
    run_printed_example,
    run_scripts,
    run_shell_block,
    sections,
    shell_block_failure,
)

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PAGES = pages(ROOT)
# The project's home: README links are absolute so that they work on a package index too.
REPO = "https://github.com/safetorch/safetorch"
# `st.<name>` or `st.<area>.<name>` in prose or code (not `best.pt`, not `x.st.y`).
_ST_NAME = re.compile(r"(?<![\w.])st\.([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)")


def _name(page: Path) -> str:
    return page_name(ROOT, page)


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
    first_sh = SH_BLOCK.search(text, install)
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


def test_doctests_pass(tmp_path: Path) -> None:
    attempted = 0
    for name, text in doctest_pages(ROOT):
        cwd = tmp_path / name.replace("/", "_")  # an example that writes a file writes it here
        cwd.mkdir()
        tried, failed, report = run_doctests(name, text, cwd)
        attempted += tried
        assert failed == 0, f"an example in {name} failed:\n{report}"
    assert attempted > 10


@pytest.mark.parametrize("title,scripts", sections(ROOT), ids=[t for t, _ in sections(ROOT)])
def test_scripts_run(title: str, scripts: List[str], tmp_path: Path) -> None:
    run_scripts(title, scripts, tmp_path)


@pytest.mark.parametrize("block", readme_shell_blocks(ROOT), ids=lambda b: b.split()[0])
def test_readme_shell_blocks_run(block: str, tmp_path: Path) -> None:
    """Each shell block of the Quickstart runs in an empty directory; a command may exit 1
    (``safetorch check`` reporting findings) but none fails to start or raises."""
    bindir = Path(sys.executable).parent
    if not (bindir / "safetorch").exists():
        pytest.skip("no `safetorch` command next to this python (not pip-installed)")
    returncode, text = run_shell_block(block, tmp_path, bindir)
    failure = shell_block_failure(returncode, text)
    assert failure is None, f"{failure}:\n{text}"


@pytest.mark.parametrize("name,code,expected", printed_examples(ROOT))
def test_printed_examples_print_what_the_docs_show(
    name: str, code: str, expected: str, tmp_path: Path
) -> None:
    assert run_printed_example(name, code, tmp_path) == expected
