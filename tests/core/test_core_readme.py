"""The README's examples run: every ```python block with `>>>` is a doctest, in order."""

from __future__ import annotations

import doctest
import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_doctest_text(path: Path = README) -> str:
    blocks = re.findall(r"```python\n(.*?)```", path.read_text(encoding="utf-8"), flags=re.S)
    return "\n\n".join(b for b in blocks if ">>>" in b)


def test_readme_examples_pass() -> None:
    text = readme_doctest_text()
    parser = doctest.DocTestParser()
    test = parser.get_doctest(text, {}, "README.md", str(README), 0)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    result = runner.run(test)
    assert result.attempted > 10
    assert result.failed == 0, "a README example failed (output above)"
