"""The pitfall table resolves: every function, patch, rule and finding it names exists; and
every face (runtime findings, conversion warnings, doctor, the docs sections the rows link)
names only what its row names.

Each runtime finding id is proved by behaviour: the smallest model, loader or setting that
makes ``st.lint_model`` / ``st.check_loader`` emit it (``FINDING_TRIGGERS``).
"""

from __future__ import annotations

import ast
import dataclasses
import io
import os
import re
import subprocess
import sys
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, NamedTuple, Set, Tuple

import pytest
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

import safetorch as st
from safetorch import _device, _doctor, _pitfalls
from safetorch.check import rules
from safetorch.patching import _registry

ROOT = Path(__file__).resolve().parents[2]
ROWS = _pitfalls.PITFALLS


def test_ids_are_unique():
    ids = [row.id for row in ROWS]
    assert len(ids) == len(set(ids))


def _resolve(name: str) -> object:
    assert name.startswith("st."), name
    head, _, rest = name[3:].partition(".")
    if rest:  # plumbing: reached through its subpackage, not exported
        assert head in dir(st), name
        obj = getattr(st, head)
        for part in rest.split("."):
            obj = getattr(obj, part)
        return obj
    # the safe function itself (exported or a documented st.<name>) or a subpackage (st.legacy)
    assert head in st.__all__ or head in st._HOME or head in st._SUBMODULES, name
    return getattr(st, head)


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_row_resolves(row):
    assert row.functions or row.no_function, f"{row.id}: no function and no reason"
    for name in row.functions:
        _resolve(name)
    if row.patch is None:
        assert row.no_patch, f"{row.id}: no patch and no reason"
    else:
        assert row.patch in {p.name for p in _registry.declared()}, row.patch
    if not row.rules:
        assert row.no_rule, f"{row.id}: no rule and no reason"
    codes = {r.code for r in rules.RULES}
    for code in row.rules:
        assert code in codes, code
    for finding in row.findings:  # each is emitted: proved by test_finding_is_emitted
        assert finding in FINDING_TRIGGERS, f"{row.id}: no trigger for finding {finding!r}"


def test_every_rule_refers_to_its_row_by_id():
    for rule in rules.RULES:
        row = _pitfalls.by_id(rule.pitfall_id)
        assert rule.code in row.rules, (rule.code, row.id)
        assert rules.RULE_TABLE[rule.code].pitfall_id == row.id
        if rule.safetorch is not None:  # the function it points to exists (flat names too)
            obj = st
            for part in rule.safetorch[3:].split("."):
                obj = getattr(obj, part)
    assert sorted(c for row in ROWS for c in row.rules) == sorted(r.code for r in rules.RULES)


def test_every_patch_refers_to_its_rows_by_id():
    for patch in _registry.declared():
        assert patch.pitfalls and patch.pitfalls == _pitfalls.for_patch(patch.name), patch.name
    for info in st.patches():
        assert info.pitfalls == _pitfalls.for_patch(info.name)
        for pitfall_id in info.pitfalls:
            assert _pitfalls.by_id(pitfall_id).patch == info.name


def _finding_ids_in_source() -> Set[str]:
    """The string ids of every ``Finding("<id>", ...)`` call in the package (not safetorch
    check's own findings): the ids no behaviour test can enumerate are the ones a new check
    adds without a row."""
    ids = set()
    for path in (ROOT / "safetorch").rglob("*.py"):
        if path.parent.name == "check":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Finding":
                first = node.args[0] if node.args else None
                assert isinstance(first, ast.Constant), f"{path}: Finding id not a literal"
                ids.add(first.value)
    return ids


def test_every_runtime_finding_id_belongs_to_one_row():
    listed = [f for row in ROWS for f in row.findings]
    assert len(listed) == len(set(listed)), "a finding id is listed by two rows"
    assert _finding_ids_in_source() <= set(listed), "a Finding id that no row lists"
    assert set(FINDING_TRIGGERS) == set(listed), "a trigger for a finding no row lists"
    for finding_id in listed:
        assert (
            st.findings.Finding(finding_id, "x", "m").pitfall
            == _pitfalls.for_finding(finding_id).id
        )


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_one_id_per_pitfall(row):
    """A check that exists as a rule and as a runtime finding has one id in both; a pitfall
    with one rule names that rule; a pitfall with one finding and no other face uses its id."""
    names = {rules.rule_for(code).name for code in row.rules}
    if len(row.rules) == 1 and not row.findings:
        assert names == {row.id}, (row.id, names)
    if len(row.findings) == 1 and len(row.rules) <= 1:  # e.g. bias-before-bn: ST008 and lint
        assert set(row.findings) | names == {row.id}, (row.id, names, row.findings)
    for other in ROWS:  # no rule name or finding id is another row's id
        if other is not row:
            assert other.id not in names and other.id not in row.findings


def _anchor(heading: str) -> str:
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def test_readme_table_is_generated_from_the_table():
    assert _pitfalls.markdown_table() in (ROOT / "README.md").read_text(encoding="utf-8")


def test_table_module_is_standard_library_only():
    code = "import sys, safetorch._pitfalls; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_docs_tables_name_pitfalls_by_id():
    """docs/check.md's rule table and docs/patching.md's patch table carry each row's
    pitfall id, the same as the rule's pitfall_id and the patch's pitfalls."""
    check = (ROOT / "docs" / "check.md").read_text(encoding="utf-8")
    seen = set()
    for code, last in re.findall(r"^\| (ST\d{3}) \|.*\| ([^|]+) \|$", check, flags=re.M):
        expected = "-" if code == "ST000" else f"`{rules.RULE_TABLE[code].pitfall_id}`"
        assert last.strip() == expected, code
        seen.add(code)
    assert seen == set(rules.RULE_TABLE)
    patching = (ROOT / "docs" / "patching.md").read_text(encoding="utf-8")
    rows = dict(re.findall(r"^\| `([a-z_]+)` \|.*\| ([^|]+) \|$", patching, flags=re.M))
    for patch in _registry.declared():
        if patch.name in rows:
            assert rows[patch.name].strip() == ", ".join(f"`{p}`" for p in patch.pitfalls)


# -- runtime findings, proved by behaviour ------------------------------------------------------
# For each finding id of the table: the function that emits it (a function of its row) and the
# smallest input that makes it emit that finding, with the other findings the input also gets.


@dataclasses.dataclass
class _Unpinnable:  # torch's pin_memory passes a dataclass through unpinned
    x: torch.Tensor


class _Sized(Dataset):  # not a TensorDataset: workers could help
    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.zeros(2)


def _loader(n: int = 8, **kwargs: Any) -> DataLoader:
    return DataLoader(TensorDataset(torch.zeros(n, 2)), batch_size=4, **kwargs)


def _lint(model: nn.Module, example: Any = None) -> Callable[[], List[st.Finding]]:
    return lambda: st.lint_model(model, example)


def _check(loader: DataLoader, model: Any = None, batch: Any = None) -> Callable[[], Any]:
    return lambda: st.check_loader(loader, model, batch=batch)


_seq, _bn = nn.Sequential, nn.BatchNorm1d


class Trigger(NamedTuple):
    emitter: str  # the function that reports the finding: one of its row's functions
    setting: str  # what the machine must look like (applied by the `setting` fixture)
    cases: Dict[str, Tuple[Callable[[], Callable[[], List[st.Finding]]], List[str]]]
    # case id -> (build the call, the other findings that call also reports)


FINDING_TRIGGERS: Dict[str, Trigger] = {
    "bias-before-bn": Trigger(
        "st.lint_model", "", {"conv-bn": (lambda: _lint(_seq(nn.Conv2d(3, 4, 1), _bn(4))), [])}
    ),
    "dropout-before-bn": Trigger(
        "st.lint_model", "", {"dropout-bn": (lambda: _lint(_seq(nn.Dropout(0.5), _bn(4))), [])}
    ),
    "bn-no-running-stats": Trigger(
        "st.lint_model", "", {"no-stats": (lambda: _lint(_bn(4, track_running_stats=False)), [])}
    ),
    "bn-momentum": Trigger(
        "st.lint_model",
        "",
        {
            "keras-momentum": (lambda: _lint(_bn(4, momentum=0.9)), []),
            "zero-momentum": (lambda: _lint(_bn(4, momentum=0.0)), []),
        },
    ),
    "bn-batch-of-one": Trigger(
        "st.lint_model", "", {"batch-of-one": (lambda: _lint(_bn(4), torch.zeros(1, 4)), [])}
    ),
    "torch-syncbn-device": Trigger(
        "st.lint_model",
        "one_rank_gloo",  # torch >= 2.0's raises on CPU only when there is a group to sync
        {"cpu-under-gloo": (lambda: _lint(nn.SyncBatchNorm(4)), [])},
    ),
    "partial-last-batch": Trigger(
        "st.check_loader", "", {"10-by-4": (lambda: _check(_loader(10)), [])}
    ),
    "last-batch-size-1-batchnorm": Trigger(
        "st.check_loader",
        "",
        {"9-by-4-bn": (lambda: _check(_loader(9), _bn(2)), ["partial-last-batch"])},
    ),
    "pin-memory-no-accelerator": Trigger(
        "st.check_loader",
        "no_accelerator",
        {"pin-on-cpu": (lambda: _check(_loader(pin_memory=True)), [])},
    ),
    "batch-not-pinnable": Trigger(
        "st.check_loader",
        "accelerator",
        {
            "collate": (
                lambda: _check(_loader(pin_memory=True, collate_fn=st.collate(_Unpinnable))),
                [],
            ),
            "batch": (
                lambda: _check(_loader(pin_memory=True), batch=[_Unpinnable(torch.zeros(1))]),
                [],
            ),
        },
    ),
    "num-workers-0": Trigger(
        "st.check_loader",
        "four_cpus",
        {"64-samples": (lambda: _check(DataLoader(_Sized(), batch_size=4)), [])},
    ),
}


def _trigger_cases() -> List[Any]:
    return [
        pytest.param(finding, trigger, case, id=f"{finding}-{name}")
        for finding, trigger in FINDING_TRIGGERS.items()
        for name, case in trigger.cases.items()
    ]


@pytest.fixture
def setting(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Callable[[str], None]:
    def apply(name: str) -> None:
        if name == "one_rank_gloo":
            request.getfixturevalue("one_rank_gloo")
        elif name in ("accelerator", "no_accelerator"):
            present = name == "accelerator"
            monkeypatch.setattr(_device, "_accelerator_impl", lambda: present)
        elif name == "four_cpus":
            monkeypatch.setattr(os, "cpu_count", lambda: 4)
        else:
            assert name == "", name

    return apply


@pytest.mark.parametrize("finding,trigger,case", _trigger_cases())
def test_finding_is_emitted(
    finding: str, trigger: Trigger, case: Any, setting: Callable[[str], None]
) -> None:
    """The trigger makes its emitter report exactly that finding (and the listed others);
    the finding belongs to its row, whose functions include the emitter, and its message and
    fix name only what that row names."""
    build, others = case
    setting(trigger.setting)
    found = build()()
    assert sorted(f.rule for f in found) == sorted([*others, finding]), found
    row = _pitfalls.for_finding(finding)
    assert finding in row.findings
    assert _resolve(trigger.emitter) in _objects(row.functions), (trigger.emitter, row.id)
    for f in found:
        assert f.pitfall == _pitfalls.for_finding(f.rule).id
        _check_face(f"{f.message} {f.fix or ''}", [_pitfalls.for_finding(f.rule)], f.rule)


# -- faces name only what their rows name --------------------------------------------------------
# `st.<name>` or `st.<area>.<name>` (not `best.pt`, not `x.st.y`), as tests/core/test_core_readme.py
_ST_NAME = re.compile(r"(?<![\w.])st\.([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)")
_RULE_CODE = re.compile(r"\bST\d{3}\b")
# How a text names a patch family: st.patch("x"), st.patched("x"), SAFETORCH_PATCH=x,y
_PATCH_NAME = re.compile(r"""(?:patch(?:ed)?\(\s*["']|SAFETORCH_PATCH=)([a-z_]+(?:,[a-z_]+)*)""")


def _objects(names: Iterable[str]) -> List[object]:
    return [_resolve(n) for n in names]


def _pitfall_functions() -> Dict[int, Set[str]]:
    """id(object) of every row's function -> the ids of the rows that list it."""
    out: Dict[int, Set[str]] = {}
    for row in ROWS:
        for obj in _objects(row.functions):
            out.setdefault(id(obj), set()).add(row.id)
    return out


def _check_face(text: str, face_rows: List[_pitfalls.Pitfall], face: str) -> None:
    """``text`` is a face of ``face_rows``: every ``st.<name>`` in it resolves, and one that is
    a pitfall's function (``st.recalibrate_bn`` is ``st.nn.recalibrate_bn``) is, or lies
    inside (``st.legacy.six``), a function of those rows; every rule code and patch name it
    mentions is theirs."""
    allowed = {id(obj) for obj in _objects(f for row in face_rows for f in row.functions)}
    functions = _pitfall_functions()
    ids = [row.id for row in face_rows]
    for dotted in _ST_NAME.findall(text):
        obj: Any = st
        chain = []
        for part in dotted.split("."):
            assert hasattr(obj, part), f"{face}: st.{dotted} does not resolve"
            obj = getattr(obj, part)
            chain.append(id(obj))
        if any(c in allowed for c in chain):
            continue
        owners = set().union(*(functions.get(c, ()) for c in chain))  # st.legacy.six: legacy's
        assert not owners, f"{face} (rows {ids}) names st.{dotted}, a function of {owners}"
    codes = {c for row in face_rows for c in row.rules}
    for code in _RULE_CODE.findall(text):
        assert code in codes, f"{face} (rows {ids}) names {code}, not theirs"
    patches = {row.patch for row in face_rows}
    for spelled in _PATCH_NAME.findall(text):
        for name in spelled.split(","):
            assert name in patches, f"{face} (rows {ids}) names patch {name!r}, not theirs"


def test_face_check_can_fail() -> None:
    row = _pitfalls.by_id("dropout-before-bn")
    for text in ("use st.load", "st.legacy.six", "st.no_such_name", "ST003", 'st.patch("load")'):
        with pytest.raises(AssertionError):
            _check_face(text, [row], "example")
    _check_face("st.lint_model, ST009, st.eval_mode", [row], "example")  # eval_mode: plumbing


class _OwnForward(nn.BatchNorm2d):  # converted only through a registered converter
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x)


def test_syncbn_conversion_warnings_name_only_their_row(monkeypatch: pytest.MonkeyPatch) -> None:
    row = _pitfalls.by_id("torch-syncbn-device")
    assert _resolve("st.convert_sync_batchnorm") in _objects(row.functions)
    with pytest.warns(st.SafetorchWarning) as skipped:
        st.convert_sync_batchnorm(nn.Sequential(_OwnForward(2)), policy="portable")
    monkeypatch.setenv("WORLD_SIZE", "2")  # launched as one of two ranks, no process group
    with pytest.warns(st.SafetorchWarning) as launched:
        st.convert_sync_batchnorm(nn.Sequential(nn.BatchNorm2d(2)))
    for caught in (skipped, launched):
        assert len(caught) == 1
        _check_face(str(caught[0].message), [row], "convert_sync_batchnorm warning")


def _doctor_report() -> Tuple[Dict[str, Any], str]:
    report = _doctor.collect()
    report["patch_mode"] = _doctor._patch_mode()
    report["problems"] = _doctor._problems(report)
    report["verdict"] = _doctor.verdict(report)
    out = io.StringIO()
    with redirect_stdout(out):
        _doctor._print_text(report)
    return report, out.getvalue()


def test_doctor_names_patches_and_pitfalls_from_the_rows() -> None:
    report, text = _doctor_report()
    listed = {p["name"]: tuple(p["pitfalls"]) for p in report["patch_mode"]["patches"]}
    # every declared patch, each with the rows naming it: none that no row names, none missing
    assert set(listed) == {p.name for p in _registry.declared()}
    assert {row.patch for row in ROWS if row.patch} == set(listed)
    assert all(listed.values()), [name for name, pitfalls in listed.items() if not pitfalls]
    printed = dict(re.findall(r"^  patch (\w+) +\w+ +pitfalls: (.*)$", text, flags=re.M))
    assert printed == {n: ", ".join(p) for n, p in listed.items()}
    _check_face(text, list(ROWS), "safetorch doctor")  # every st.<name> and code it names


def _sections(page: Path) -> Dict[str, str]:
    """GitHub anchor of each heading -> the section's text (up to the next heading of its
    level or above)."""
    lines = page.read_text(encoding="utf-8").splitlines()
    heads = []
    fenced = False
    for i, line in enumerate(lines):
        fenced ^= line.startswith("```")
        match = None if fenced else re.match(r"^(#+) (.*)$", line)
        if match:
            heads.append((i, len(match.group(1)), _anchor(match.group(2))))
    out = {}
    for k, (i, level, anchor) in enumerate(heads):
        end = next((j for j, lv, _ in heads[k + 1 :] if lv <= level), len(lines))
        out.setdefault(anchor, "\n".join(lines[i:end]))
    return out


_LINKED = sorted({row.docs for row in ROWS})


@pytest.mark.parametrize("docs", _LINKED)
def test_docs_section_names_only_its_rows(docs: str) -> None:
    """The section a row links names only what the rows linking it name. In a table, a line
    about one rule code (docs/check.md's rule table) is the face of that code's row only."""
    page, _, anchor = docs.partition("#")
    sections = _sections(ROOT / page)
    assert anchor in sections, f"{docs}: no heading with that anchor in {sorted(sections)}"
    rows = [row for row in ROWS if row.docs == docs]
    prose = []
    for line in sections[anchor].splitlines():
        codes = {c for c in _RULE_CODE.findall(line) if any(c in r.rules for r in ROWS)}
        if line.startswith("|") and len(codes) == 1:
            _check_face(line, [_pitfalls.for_rule(codes.pop())], f"{docs} table line")
        elif not (line.startswith("|") and _RULE_CODE.search(line)):  # ST000: no row
            prose.append(line)
    _check_face("\n".join(prose), rows, docs)
