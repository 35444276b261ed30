"""The rule registry and the pitfall table agree, and the check face says only what its row says.

Every ``Rule`` subclass in ``safetorch.check.rules`` is registered, every registered code is in
exactly one row of ``safetorch._pitfalls`` and every row's codes are registered; a rule's
pitfall text, safetorch function and docs link come from its row, and its source names no
safetorch function, rule code or patch that its row does not have. The docs' rules table,
``--explain`` and ``--list-rules`` are generated from the rule classes.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import re
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType
from typing import List, Set, Type

import pytest

from safetorch import _pitfalls
from safetorch.check import check_source, engine, rules
from safetorch.check.rules import _base

ROOT = Path(__file__).resolve().parents[2]
REGISTERED = (rules.SyntaxErrorRule, *rules.RULES)
ROW_RULES = [r for r in REGISTERED if r.has_row]
# st.<name> as written in prose and messages (not ast.Call, first.id, ...).
_ST_NAME = re.compile(r"(?<![\w.])st\.[A-Za-z_][\w.]*")
_CODE = re.compile(r"\bST\d{3}\b")
_PATCH = re.compile(r"``(\w+)`` patch|st\.patch\(\s*['\"](\w+)['\"]|--patch[= ](\w+)")


def _modules() -> List[ModuleType]:
    found = [rules]
    for info in pkgutil.walk_packages(rules.__path__, rules.__name__ + "."):
        if not info.name.endswith(".__main__"):
            found.append(importlib.import_module(info.name))
    return found


def _subclasses(cls: type) -> Set[type]:
    seen: Set[type] = set()
    todo = [cls]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub not in seen:
                seen.add(sub)
                todo.append(sub)
    return seen


def _st_names(text: str) -> Set[str]:
    return {name.rstrip(".") for name in _ST_NAME.findall(text)}


def _covered(name: str, functions: tuple) -> bool:
    return any(name == f or name.startswith(f + ".") for f in functions)


def _patches(text: str) -> Set[str]:
    return {next(g for g in m if g) for m in _PATCH.findall(text)}


def test_every_rule_class_in_the_package_is_registered() -> None:
    modules = _modules()
    names = {m.__name__ for m in modules}
    defined = {
        cls for cls in _subclasses(engine.Rule) if cls.__module__ in names and cls is not _base.Rule
    }
    assert defined == set(REGISTERED)
    assert all(issubclass(r, _base.Rule) for r in REGISTERED)
    codes = [r.code for r in rules.RULES]
    assert codes == sorted(codes) and len(set(codes)) == len(codes)  # listed in code order
    assert list(rules.RULE_TABLE) == [r.code for r in REGISTERED]


def test_every_registered_code_is_in_exactly_one_row() -> None:
    for rule in ROW_RULES:
        rows = [row for row in _pitfalls.PITFALLS if rule.code in row.rules]
        assert len(rows) == 1, (rule.code, [row.id for row in rows])
        assert rule.pitfall_id == rows[0].id == rules.RULE_TABLE[rule.code].pitfall_id
    assert not [row for row in _pitfalls.PITFALLS if rules.SyntaxErrorRule.code in row.rules]


def test_every_row_code_is_registered() -> None:
    for row in _pitfalls.PITFALLS:
        for code in row.rules:
            assert code in rules.RULE_TABLE, (row.id, code)
            assert rules.rule_for(code).pitfall_id == row.id


@pytest.mark.parametrize("rule", ROW_RULES, ids=lambda r: r.code)
def test_pitfall_text_function_and_docs_come_from_the_row(rule: Type[_base.Rule]) -> None:
    row = _pitfalls.for_rule(rule.code)
    info = rules.RULE_TABLE[rule.code]
    assert rule.pitfall == info.pitfall == row.problem
    assert rule.docs == info.docs == _base.docs_link(row.docs)
    if rule.uses == "":
        assert rule.safetorch == (row.functions[0] if row.functions else None)
    if rule.safetorch is not None:
        assert _covered(rule.safetorch, row.functions), (rule.code, rule.safetorch)
    for symbol, function in rule.functions_by_symbol.items():
        assert symbol in rule.torch_symbols
        assert _covered(function, row.functions), (rule.code, function)
        assert info.safetorch_for(symbol) == function
    # Declared nowhere but in the row: the class body sets none of these.
    (cls,) = ast.parse(textwrap.dedent(inspect.getsource(rule))).body
    assert isinstance(cls, ast.ClassDef)
    targets = [t for s in cls.body if isinstance(s, ast.Assign) for t in s.targets]
    targets += [s.target for s in cls.body if isinstance(s, ast.AnnAssign)]
    restated = {t.id for t in targets if isinstance(t, ast.Name)}
    assert not restated & {"pitfall_id", "pitfall", "safetorch", "docs"}, rule.code


def test_a_pick_outside_the_row_fails() -> None:
    assert _base.pick("ST001", "st.upsample_bilinear") == "st.upsample_bilinear"
    with pytest.raises(LookupError, match="ST016"):
        _base.pick("ST016", "st.lint_model")  # ST016's row has no function
    with pytest.raises(LookupError):
        _base.pick("ST003", "st.load_state_dict")


@pytest.mark.parametrize("rule", ROW_RULES, ids=lambda r: r.code)
def test_rule_source_names_only_its_row(rule: Type[_base.Rule]) -> None:
    """Docstring, message templates and fix texts name only the row's functions, the rule's
    own code and the row's patch."""
    row = _pitfalls.for_rule(rule.code)
    source = inspect.getsource(rule)
    strays = {n for n in _st_names(source) if not _covered(n, row.functions)}
    assert not strays, f"{rule.code} names {sorted(strays)}; its row has {row.functions}"
    assert set(_CODE.findall(source)) == {rule.code}
    assert _patches(source) <= ({row.patch} if row.patch else set())


@pytest.mark.parametrize(
    "module",
    [m for m in _modules() if not m.__name__.rsplit(".", 1)[1].startswith("_")],
    ids=lambda m: m.__name__.rsplit(".", 1)[1],
)
def test_family_module_names_only_its_rows(module: ModuleType) -> None:
    """A family module's helpers (outside the rule classes too) say what its rows say."""
    own = [r for r in ROW_RULES if r.__module__ == module.__name__]
    if module is rules or not own:
        return
    rows = {_pitfalls.for_rule(r.code) for r in own}
    functions = tuple(f for row in rows for f in row.functions)
    source = inspect.getsource(module)
    assert {n for n in _st_names(source) if not _covered(n, functions)} == set()
    assert set(_CODE.findall(source)) <= {r.code for r in own}
    assert _patches(source) <= {row.patch for row in rows if row.patch}


def _printed(*args: str) -> str:
    command = [sys.executable, "-m", "safetorch.check.rules", *args]
    return subprocess.run(command, cwd=ROOT, check=True, capture_output=True, text=True).stdout


def test_docs_table_and_reference_are_generated_from_the_rules() -> None:
    page = (ROOT / "docs" / "check.md").read_text(encoding="utf-8")
    table, reference = rules.markdown_table(), rules.markdown_reference()
    assert table in page and reference in page
    for rule in REGISTERED:
        assert f"| {rule.code} | `{rule.name}` | {_base.summary(rule.__doc__)}" in table.replace(
            "**preview**: ", ""
        )
        assert f"#### {rule.code} `{rule.name}`" in reference
    assert _printed() == table + "\n"
    assert _printed("--reference") == reference + "\n"


def test_explain_and_list_rules_come_from_the_classes() -> None:
    listing = rules.list_rules_text()
    for rule in REGISTERED:
        text = rules.explain_text(rule.code)
        assert text.startswith(f"{rule.code} ({rule.name}): {rule.pitfall}\n")
        assert _base.plain_text(inspect.cleandoc(rule.__doc__ or "")) in text
        assert rule.docs in text
        assert f"       {_base.summary(rule.__doc__)}\n" in listing
        assert rules.RULE_TABLE[rule.code].summary == _base.summary(rule.__doc__)


def test_the_rules_package_imports_no_torch() -> None:
    names = [m.__name__ for m in _modules()]
    code = f"import sys, importlib\nfor n in {names!r}: importlib.import_module(n)\n"
    code += "assert 'torch' not in sys.modules, 'torch imported'\n"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_files_checked_in_threads_give_the_sequential_findings() -> None:
    """walk() reads the checked file's own index (no module state): threads do not mix."""
    fixtures = sorted((Path(__file__).parent / "fixtures").rglob("*.py"))
    sources = [(str(p), p.read_text(encoding="utf-8")) for p in fixtures]

    def check(item: tuple) -> list:
        path, source = item
        return check_source(source, path, select=["ALL", "PREVIEW"])

    sequential = [check(item) for item in sources]
    with ThreadPoolExecutor(max_workers=4) as pool:
        threaded = list(pool.map(check, sources * 2))
    assert threaded == sequential * 2
    assert not hasattr(engine, "_subtrees")


def test_threads_parse_one_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """CPython 3.11/3.12 share the AST builder's depth counter between threads (#106905): a
    parse in a thread beside another raises SystemError unless the checker serialises them."""
    import threading
    import time

    from safetorch.check import project

    inside, most, guard = [0], [0], threading.Lock()
    real = ast.parse

    def counting(*args: object, **kwargs: object) -> ast.Module:
        with guard:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        time.sleep(0.002)  # the window in which a second thread would enter
        try:
            return real(*args, **kwargs)  # type: ignore[arg-type]
        finally:
            with guard:
                inside[0] -= 1

    monkeypatch.setattr(project.ast, "parse", counting)
    sources = [f"import torch\nimport torch._six\nx{i} = torch.load('a.pt')\n" for i in range(16)]
    with ThreadPoolExecutor(max_workers=4) as pool:
        found = list(pool.map(lambda s: check_source(s, select=["ST018", "ST003"]), sources))
    assert all(any(d.code == "ST018" for d in f) for f in found)
    assert most[0] == 1
    # and no parse in the checker goes around project.parse
    for path in (ROOT / "safetorch" / "check").rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        calls = [
            n
            for n in ast.walk(tree)
            if isinstance(n, ast.Call) and ast.unparse(n.func) in {"ast.parse", "compile"}
        ]
        allowed = path.name == "project.py" and len(calls) == 1
        assert not calls or allowed, (path, [ast.unparse(c) for c in calls])


def test_code_lists_are_parsed_by_one_function() -> None:
    assert engine.parse_codes(" st003, ST004,,") == ("ST003", "ST004")
    assert engine.parse_codes("ST003 ST004") == ("ST003", "ST004")  # as in # noqa: ST003 ST004
    assert engine.parse_codes(["st0 ", ""]) == ("ST0",)
    assert engine.parse_codes(None) is None
    src = "import torch\nx = torch.load('a')  # noqa: st004, ST003\n"
    assert check_source(src, select=["ST003", "ST004"]) == []
    # Nothing else in the checker splits or normalises a code list itself.
    for path in (ROOT / "safetorch" / "check").rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        assert 'split(",")' not in text, path
        assert "c.strip().upper()" not in text and "v.strip().upper()" not in text, path
