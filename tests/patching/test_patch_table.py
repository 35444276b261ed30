"""The pitfall table is the only source of the patch face: names, descriptions, functions,
the st.<name> functions and rule codes the patch modules and their messages name."""

from __future__ import annotations

import io
import re
import sys
import warnings
from pathlib import Path
from typing import Iterable, List, Tuple

import pytest
import torch
import torch.nn.functional as F
import torch.utils.data._utils.pin_memory as torch_pin
from torch import nn

import safetorch as st
import safetorch.patching
from safetorch import _pitfalls
from safetorch.patching import _registry

ROOT = Path(__file__).parents[2]
PATCHING = ROOT / "safetorch" / "patching"
# An `st.<name>` (or `st.<area>.<name>`) as code, docs and messages write it.
_ST_NAME = re.compile(r"(?<![\w.])st\.([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)")
_CODE = re.compile(r"\bST(\d{3})\b(?:\s*[-\u2013]\s*ST(\d{3})\b)?")
_PATCH_API = {f"st.{n}" for n in safetorch.patching.__all__}  # the face itself


def _rows(name: str) -> List[_pitfalls.Pitfall]:
    return [_pitfalls.by_id(i) for i in _pitfalls.for_patch(name)]


def _functions(rows: Iterable[_pitfalls.Pitfall]) -> List[str]:
    return [f for row in rows for f in row.functions]


def _uncovered(text: str, functions: List[str]) -> List[str]:
    """The st.<name>s in ``text`` that are neither a row function nor inside one (a name
    of the ``st.legacy`` module is covered by ``st.legacy``), nor the patch API."""
    out = []
    for match in _ST_NAME.finditer(text):
        parts = ["st", *match.group(1).split(".")]
        prefixes = {".".join(parts[:i]) for i in range(2, len(parts) + 1)}
        if not prefixes & (set(functions) | _PATCH_API):
            out.append(match.group(0))
    return out


def _codes(text: str) -> List[str]:
    """Every STxxx code ``text`` names; a range ``ST017-ST022`` names each code in it."""
    out = []
    for first, last in _CODE.findall(text):
        out += [f"ST{n:03d}" for n in range(int(first), int(last or first) + 1)]
    return out


def _declaration_modules() -> List[Tuple[str, object]]:
    out = []
    for path in sorted(PATCHING.glob("*.py")):
        module = sys.modules.get(f"safetorch.patching.{path.stem}")
        if module is not None and isinstance(getattr(module, "PATCH", None), _registry.Patch):
            assert path.stem.startswith("_"), f"{path.name}: a private module (underscored)"
            out.append((path.stem[1:], module))  # the patch's name: the module's, unprefixed
    return out


def test_the_declared_patches_are_the_table_s() -> None:
    declared = [p.name for p in _registry.declared()]
    table = {row.patch for row in _pitfalls.PITFALLS if row.patch is not None}
    assert set(declared) == table
    assert sorted(name for name, _ in _declaration_modules()) == sorted(declared)
    for p in _registry.declared():
        assert p.pitfalls and p.rows, p.name


def test_patches_lists_what_the_rows_say() -> None:
    for info in st.patches():
        rows = _rows(info.name)
        assert info.pitfalls == tuple(row.id for row in rows)
        assert info.implementation == ", ".join(dict.fromkeys(_functions(rows)))
        for row in rows:
            assert row.title in info.description
        assert not _uncovered(info.description, _functions(rows)), info.name


@pytest.mark.parametrize("stem", [name for name, _ in _declaration_modules()])
def test_a_declaration_names_only_its_rows_functions(stem: str) -> None:
    """Code, docstrings, comments and message templates of a patch module."""
    module = sys.modules[f"safetorch.patching._{stem}"]
    patch = module.PATCH  # type: ignore[attr-defined]
    text = (PATCHING / f"_{stem}.py").read_text(encoding="utf-8")
    assert not _uncovered(text, _functions(patch.rows)), stem
    # The patch name the module records under is its own.
    names = set(re.findall(r"""record\(\s*["']([a-z_]+)["']""", text))
    names |= set(re.findall(r"""route\(\s*["']([a-z_]+)["']""", text))
    assert names <= {patch.name}, (stem, names)


def test_rule_codes_named_in_the_legacy_and_patch_modules_are_their_rows() -> None:
    legacy_rows = [row for row in _pitfalls.PITFALLS if "st.legacy" in row.functions]
    text = (ROOT / "safetorch" / "legacy.py").read_text(encoding="utf-8")
    allowed = {c for row in legacy_rows for c in row.rules}
    assert _codes(text) and set(_codes(text)) <= allowed, sorted(set(_codes(text)) - allowed)
    declarations = dict(_declaration_modules())
    patch_rules = {c for row in _pitfalls.PITFALLS if row.patch for c in row.rules}
    for path in sorted(PATCHING.glob("*.py")):
        module = declarations.get(path.stem)
        rows = module.PATCH.rows if module is not None else None  # type: ignore[attr-defined]
        allowed = {c for row in rows for c in row.rules} if rows is not None else patch_rules
        codes = set(_codes(path.read_text(encoding="utf-8")))
        assert codes <= allowed, (path.name, sorted(codes - allowed))


def test_the_checks_catch_what_they_look_for() -> None:
    assert _codes("safetorch check (ST017-ST024) and ST003") == [
        *(f"ST0{n}" for n in range(17, 25)),
        "ST003",
    ]
    assert _uncovered("st.legacy.solve, st.pin, st.patch()", ["st.legacy"]) == ["st.pin"]


def test_docs_patch_table_routes_to_row_functions() -> None:
    text = (ROOT / "docs" / "patching.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| `([a-z_]+)` \| [^|]+ \| ([^|]+) \|", text, flags=re.M)
    assert {name for name, _ in rows} == {p.name for p in _registry.declared()}
    for name, routes in rows:
        assert not _uncovered(routes, _functions(_rows(name))), (name, routes)


def test_runtime_messages_name_only_their_rows_functions(monkeypatch) -> None:
    """One changed call per patch (checks forced on the CPU for index); every report line
    names its own patch and only functions of that patch's rows."""
    torch.manual_seed(0)
    buf = io.BytesIO()
    torch.save({"w": torch.ones(2)}, buf)
    wrapped = {f"module.{k}": v for k, v in nn.Linear(2, 2).state_dict().items()}
    previous = st.set_index_check("always")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            st.patch("all")
            F.upsample(torch.ones(1, 1, 2, 2), scale_factor=2)
            torch.load(io.BytesIO(buf.getvalue()))
            nn.Linear(2, 2).load_state_dict(wrapped)
            x = torch.arange(6.0)
            x[torch.tensor([1])], x.index_select(0, torch.tensor([2]))
            torch.gather(x, 0, torch.tensor([3]))
            torch_pin.pin_memory({"a": [1]})
            nn.SyncBatchNorm.convert_sync_batchnorm(nn.Sequential(nn.BatchNorm1d(2)))
            torch.solve(torch.ones(2, 1), torch.eye(2))  # type: ignore[attr-defined]
            torch.tensor(2.0)[0]
            nn.MSELoss(size_average=False)
    finally:
        st.set_index_check(previous)
        st.unpatch()
    entries = _registry.report_entries()
    assert {e.patch for e in entries} == {p.name for p in _registry.declared()}
    for e in entries:
        functions = _functions(_rows(e.patch))
        assert not _uncovered(f"{e.kind} {e.detail}", functions), e
