"""ST000 on a file that uses syntax newer than the Python running the checker: the finding
says the file was not checked and why, not that the code is broken; a Python 2 file and a
really broken f-string keep the plain syntax error."""

from __future__ import annotations

import pytest

from safetorch.check import check_source
from safetorch.check._newer_syntax import parses as _parses

NEWER = {
    "nested_quotes": 'd = {"k": 1}\nprint(f"{d["k"]}")\n',
    "type_params": "def first[T](xs: list[T]) -> T:\n    return xs[0]\n",
    "type_alias": "type Pair = tuple[int, int]\n",
}


@pytest.mark.parametrize("name", sorted(NEWER))
def test_newer_syntax_is_not_called_broken(name: str) -> None:
    found = [d for d in check_source(NEWER[name], "new.py") if d.code == "ST000"]
    if _parses(NEWER[name]):
        assert found == []  # this Python reads it: checked like any file
    else:
        assert len(found) == 1
        assert "the file was not checked" in found[0].message
        assert "Python 3.12" in found[0].message


@pytest.mark.parametrize(
    "source",
    [
        'print "hello"\n',  # Python 2
        "x = 1\nprint(f'{x!z}')\n",  # an f-string that no Python accepts
        "def f(:\n    pass\n",
    ],
)
def test_broken_code_keeps_the_plain_syntax_error(source: str) -> None:
    found = [d for d in check_source(source, "old.py") if d.code == "ST000"]
    assert len(found) == 1
    assert "not checked" not in found[0].message


@pytest.mark.skipif(
    _parses('a = 1\nx = f"{a # the value\n}"\n'), reason="this Python parses 3.12 f-strings"
)
@pytest.mark.parametrize(
    "message",
    [
        "unterminated string literal (detected at line 2)",  # Python 3.10 and 3.11
        "EOL while scanning string literal",  # Python 3.9
        "f-string expression part cannot include '#'",
    ],
)
def test_every_python_s_wording_of_the_f_string_error_is_verified(message: str) -> None:
    from safetorch.check._newer_syntax import newer_syntax

    source = 'a = 1\nx = f"{a # the value\n}"\n'
    assert newer_syntax(source, 2, message) is not None
    assert newer_syntax('x = f"{a\n', 1, message) is None  # broken on every Python
