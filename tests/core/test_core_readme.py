"""The examples of the README and of every page under docs/ run.

In each file, every ```python block with `>>>` is a doctest (run in order, one namespace per
file); every other ```python block is executed as a script, in order within its `## ` section
(one namespace per section), in a temporary working directory.
"""

from __future__ import annotations

import doctest
import os
import re
import warnings
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
_BLOCK = re.compile(r"```python\n(.*?)```", flags=re.S)


def _name(page: Path) -> str:
    return str(page.relative_to(ROOT))


def _sections() -> List[Tuple[str, List[str]]]:
    out = []
    for page in PAGES:
        for chunk in re.split(r"\n(?=## )", page.read_text(encoding="utf-8")):
            title = f"{_name(page)}: " + chunk.splitlines()[0].lstrip("# ").strip()
            scripts = [b for b in _BLOCK.findall(chunk) if ">>>" not in b]
            if scripts:
                out.append((title, scripts))
    return out


def test_docs_pages_exist_and_are_linked_from_the_readme() -> None:
    text = README.read_text(encoding="utf-8")
    assert len(PAGES) > 5
    for page in PAGES[1:]:
        assert f"({_name(page)})" in text, f"README does not link {_name(page)}"
    assert len(text.splitlines()) <= 250


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
