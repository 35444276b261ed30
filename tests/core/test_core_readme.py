"""The README's examples run.

Every ```python block with `>>>` is a doctest (run in order, one namespace); every other
```python block is executed as a script, in order within its `## ` section (one namespace per
section), in a temporary working directory.
"""

from __future__ import annotations

import doctest
import os
import re
import warnings
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"
_BLOCK = re.compile(r"```python\n(.*?)```", flags=re.S)


def _sections() -> List[Tuple[str, List[str]]]:
    text = README.read_text(encoding="utf-8")
    out = []
    for chunk in re.split(r"\n(?=## )", text):
        title = chunk.splitlines()[0].lstrip("# ").strip()
        scripts = [b for b in _BLOCK.findall(chunk) if ">>>" not in b]
        if scripts:
            out.append((title, scripts))
    return out


def test_readme_doctests_pass() -> None:
    text = "\n\n".join(b for b in _BLOCK.findall(README.read_text(encoding="utf-8")) if ">>>" in b)
    test = doctest.DocTestParser().get_doctest(text, {}, "README.md", str(README), 0)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    result = runner.run(test)
    assert result.attempted > 10
    assert result.failed == 0, "a README example failed (output above)"


@pytest.mark.parametrize("title,scripts", _sections(), ids=[t for t, _ in _sections()])
def test_readme_scripts_run(title: str, scripts: List[str], tmp_path: Path, capsys: Any) -> None:
    import safetorch as st

    cwd = os.getcwd()
    os.chdir(tmp_path)
    namespace: Dict[str, Any] = {"__name__": "__readme__"}
    try:
        with warnings.catch_warnings():
            # examples may show a SafetorchWarning on purpose; everything else stays an error
            warnings.simplefilter("ignore", st.SafetorchWarning)
            for i, code in enumerate(scripts):
                exec(compile(code, f"README.md[{title}#{i}]", "exec"), namespace)
    finally:
        os.chdir(cwd)
        st.unpatch()
