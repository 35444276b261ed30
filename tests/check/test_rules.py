"""Rules: alias resolution, positions, the rule table, --select/--ignore, no torch import."""

from __future__ import annotations

import ast
import re
import textwrap
from pathlib import Path
from typing import List

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hst

from safetorch.check import (
    RULE_TABLE,
    check_source,
    explain,
    fix_source,
    rule_for,
    select_rules,
)

REPO = Path(__file__).resolve().parents[2]
PUBLIC_SAFETORCH_NAMES = {
    "st.upsample",
    "st.upsample_nearest",
    "st.upsample_bilinear",
    "st.Upsample",
    "st.load",
    "st.load_state_dict",
    "st.unwrap_model",
    "st.safe_copy",
    "st.cuda_timer",
    "st.convert_sync_batchnorm",
    "st.PinnedBatch",
    "st.lint_model",
    "st.check_loader",
    "st.legacy",
    "st.legacy.six",
    "st.legacy.legacy_function",
    "st.legacy.zero_dim_index",
    "st.legacy.volatile",
    "st.legacy.reduction",
    "st.legacy.solve",
    "st.legacy.lstsq",
    "st.legacy.eig",
    "st.legacy.symeig",
    "st.legacy.matrix_rank",
    "st.legacy.div",
    "st.legacy.div_",
    "st.legacy.view",
    "st.legacy.binary_cross_entropy",
}


def codes(source: str, **kw: object) -> List[str]:
    return [d.code for d in check_source(textwrap.dedent(source), **kw)]  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "imports, call",
    [
        ("import torch.nn.functional as F", "F.upsample(x, scale_factor=2)"),
        ("from torch.nn import functional as Fn", "Fn.upsample(x, scale_factor=2)"),
        ("from torch.nn.functional import upsample", "upsample(x, scale_factor=2)"),
        ("import torch as T", "T.nn.functional.upsample(x, scale_factor=2)"),
        ("import torch", "torch.nn.functional.upsample(x, scale_factor=2)"),
        ("import torch.nn", "torch.nn.functional.upsample(x, scale_factor=2)"),
        ("from torch import nn", "nn.functional.upsample(x, scale_factor=2)"),
        (
            "try:\n    import torch.nn.functional as F\nexcept ImportError:\n    F = None",
            "F.upsample(x)",
        ),
    ],
)
def test_import_aliases_resolve(imports: str, call: str) -> None:
    assert codes(f"{imports}\ny = {call}\n") == ["ST001"]


def test_function_local_import_resolves() -> None:
    src = """
    def f(x):
        import torch.nn.functional as G
        return G.upsample_nearest(x, scale_factor=2)
    """
    assert codes(src) == ["ST001"]


@pytest.mark.parametrize(
    "source",
    [
        "F.upsample(x)\n",  # F never imported: not torch's
        "from mylib import F\nF.upsample(x)\n",
        "import numpy as torch\ntorch.load('a')\n",
        "def load(p): ...\nload('a.pt')\n",
        "import pickle\npickle.load(open('a', 'rb'))\n",
        "from torch import nn\nnn.Upsample(scale_factor=2)\n",
        "import torch.nn.functional as F\nF.interpolate(x, scale_factor=2)\n",
    ],
)
def test_unrelated_names_are_not_flagged(source: str) -> None:
    assert codes(source, select="ALL,PREVIEW") == []


def test_positions_are_one_based_characters() -> None:
    src = 'import torch\ns = "éé"; sd = torch.load("a.pt", map_location="cpu")\n'
    src += "net.load_state_dict(sd)\n"  # a strict module load: weights_only=True is the fix
    (d,) = check_source(src, "m.py")
    line = src.splitlines()[1]
    assert (d.line, d.col) == (2, line.index("torch.load") + 1)
    assert (d.end_line, d.end_col) == (2, len(line) + 1)
    fixed = fix_source(src, unsafe_fixes=True)
    assert (
        fixed.splitlines()[1]
        == 's = "éé"; sd = torch.load("a.pt", map_location="cpu", weights_only=True)'
    )


def test_fix_keeps_crlf_line_endings() -> None:
    save = "net.load_state_dict(sd)\r\n"  # a strict module load: weights_only=True is the fix
    src = 'import torch\r\nsd = torch.load(\r\n    "a.pt", map_location="cpu"\r\n)\r\n' + save
    fixed = fix_source(src, unsafe_fixes=True)
    assert (
        fixed
        == 'import torch\r\nsd = torch.load(\r\n    "a.pt", map_location="cpu", weights_only=True\r\n)\r\n'
        + save
    )


def test_form_feed_does_not_shift_lines() -> None:
    # str.splitlines() would split at \x0c; the tokenizer does not.
    src = "import torch\n# page\x0cbreak\nx = net(a)\ny = x.detach().zero_()\nx.sum().backward()\n"
    assert fix_source(src, select="ST005", unsafe_fixes=True) == src.replace(
        "detach()", "detach().clone()"
    )


def test_text_format_is_flake8_style() -> None:
    (d,) = check_source("import torch\ntorch.load('a', map_location='cpu')\n", "pkg/m.py")
    assert re.fullmatch(r"pkg/m\.py:2:1: ST003 .+", str(d))


def test_syntax_error_is_reported_with_position() -> None:
    (d,) = check_source("x = 1\ndef f(:\n    pass\n", "bad.py")
    assert (d.code, d.line) == ("ST000", 2)
    assert d.message.startswith("syntax error")


def test_null_byte_is_a_syntax_error_not_a_crash() -> None:
    assert codes("x = 1\x00\n") == ["ST000"]


def test_detach_rebinding_stops_tracking() -> None:
    src = """
    def f(x):
        y = x.detach()
        y = y * 2
        y.add_(1)
    """
    assert codes(src, select="ALL,PREVIEW") == []


def test_detach_tracking_is_per_scope() -> None:
    src = """
    def f(x):
        y = x.detach()
        return y

    def g(y):
        y.add_(1)
    """
    assert codes(src, select="ALL,PREVIEW") == []


def test_timing_without_cuda_in_file_is_not_flagged() -> None:
    src = """
    import time
    t0 = time.time()
    work()
    t1 = time.time()
    """
    assert codes(src, select="ALL,PREVIEW") == []


def test_bias_rule_skips_unknown_bias_expressions() -> None:
    src = """
    import torch.nn as nn
    use_bias = False
    nn.Sequential(nn.Conv2d(3, 8, 3, bias=use_bias), nn.BatchNorm2d(8))
    nn.Sequential(nn.Conv2d(3, 8, 3, **kw), nn.BatchNorm2d(8))
    nn.Sequential(nn.Conv2d(*args), nn.BatchNorm2d(8))
    """
    assert codes(src, select="ALL,PREVIEW") == []


def test_pin_memory_rule_trusts_classes_it_cannot_see() -> None:
    src = """
    from torch.utils.data import DataLoader
    from mylib import ExternalBatch

    class Local(ExternalBatch):
        pass

    def collate(samples):
        return Local(samples)

    DataLoader([], pin_memory=True, collate_fn=collate)
    DataLoader([], pin_memory=False, collate_fn=collate)
    """
    assert codes(src, select="ALL,PREVIEW") == []


def test_state_dict_rule_needs_the_wrapper() -> None:
    src = """
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    def train(model, bare):
        bare = bare.cpu()
        model = DDP(model)
        torch.save(model.module.state_dict(), "a.pt")
        torch.save(bare.state_dict(), "b.pt")
        model = model.module
        torch.save(model.state_dict(), "c.pt")
    """
    assert codes(src, select="ALL,PREVIEW") == []


def test_public_safetorch_names_resolve() -> None:
    import functools

    import safetorch as st

    for name in PUBLIC_SAFETORCH_NAMES:
        assert functools.reduce(getattr, name.split(".")[1:], st) is not None, name


def test_rule_docstrings_say_their_code_fix_and_function() -> None:
    """Each rule's facts and docstring agree: the docstring starts with its code and says the
    kind of fix the rule offers (registration against the pitfall table: test_registry.py)."""
    for code, info in RULE_TABLE.items():
        assert re.fullmatch(r"ST\d{3}", code)
        assert info.pitfall and info.name and info.summary
        assert info.safetorch is None or info.safetorch in PUBLIC_SAFETORCH_NAMES
        rule = rule_for(code)
        assert (rule.__doc__ or "").startswith(f"{code}: "), code
        assert info.fixable == rule.fixable
        for symbol in info.torch_symbols:
            assert info.safetorch_for(symbol) in PUBLIC_SAFETORCH_NAMES, (code, symbol)
        assert info.safetorch_for("torch.not_a_symbol") is None
        doc = rule.__doc__ or ""
        assert "safetorch: " in doc, code
        if code != "ST000":
            if not rule.fixable:
                assert "Fix (manual)" in doc, code
            elif rule.fix_applicability == "unsafe":
                assert "Fix (unsafe" in doc, code
            elif rule.fix_applicability == "safe":
                assert "Fix (automatic, safe)" in doc, code
            else:  # depends on the project: the docstring says on what
                assert "Fix (automatic)" in doc and "unsafe" in doc, code
        assert info.fix_applicability == rule.fix_applicability


def test_messages_name_the_safetorch_function() -> None:
    fixtures = Path(__file__).parent / "fixtures"
    seen = set()
    for path in fixtures.rglob("*.py"):
        for d in check_source(path.read_text(), str(path), select=["ALL", "PREVIEW"]):
            seen.add(d.code)
            expected = RULE_TABLE[d.code].safetorch
            if expected is not None:
                assert expected in d.message, d
    assert seen == set(RULE_TABLE)  # every rule is exercised by some fixture


@pytest.mark.parametrize("code", list(RULE_TABLE))
def test_explain_prints_the_docstring(code: str) -> None:
    text = explain(code.lower())
    assert text.startswith(f"{code} (")
    from safetorch.check.rules import plain_text

    first_doc_line = (rule_for(code).__doc__ or "").splitlines()[0]
    assert plain_text(first_doc_line) in text  # as plain text: no reST markup
    assert "``" not in text and ":func:" not in text
    assert "https://" in text or not rule_for(code).pitfall_id  # absolute docs links


def test_select_and_ignore_by_prefix() -> None:
    src = (
        "import torch\ndef train():\n    torch.save(torch.nn.Linear(2, 2).cuda().state_dict(), 'a')\n"
        "device = 'cpu'\ntorch.load('a')\nx = net(a)\nx.detach().zero_()\nx.sum().backward()\n"
    )
    assert codes(src) == ["ST003"]  # ST004, ST005 are preview (below 97%, issue 33)
    assert codes(src, select="ALL,PREVIEW") == ["ST003", "ST004", "ST005"]
    assert codes(src, select="ST003") == ["ST003"]
    assert codes(src, select=["ST003", "ST005"]) == ["ST003", "ST005"]
    assert codes(src, ignore="ST00") == []
    assert codes(src, select="ALL,PREVIEW", ignore="ST004") == ["ST003", "ST005"]
    assert select_rules("ST003")[1] is False  # ST000 not selected
    with pytest.raises(ValueError, match="unknown rule code 'XX1'"):
        select_rules("XX1")


_FIXABLE_LINES = [
    "a = F.upsample(x, scale_factor=2)",
    "b = F.upsample_nearest(x, None, 2)",
    "c = F.upsample_bilinear(x, size=(4, 4))",
    "d = nn.UpsamplingBilinear2d(scale_factor=2)",
    "e = torch.load(path, map_location='cpu')",
    "f = x.detach()\nf.add_(1)",
    "x.detach().mul_(2)",
    "p.add_argument('cfg', default='a.yaml')",
    "s = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8))",
    "t = torch.load(F.upsample(x, scale_factor=2).detach(), map_location='cpu')",
    "u = 1  # noqa",
]
_HEADER = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n"


@settings(max_examples=60)
@given(hst.lists(hst.sampled_from(_FIXABLE_LINES), min_size=1, max_size=8), hst.booleans())
def test_fix_is_idempotent_and_complete(lines: List[str], indent: bool) -> None:
    body = "\n".join(lines) + "\n"
    if indent:
        body = "def f(x, path, p):\n" + textwrap.indent(body, "    ")
    source = _HEADER + body
    every = ["ALL", "PREVIEW"]  # the preview rules' fixes too (ST004, ST005, ST008)
    fixed = fix_source(source, select=every, unsafe_fixes=True)
    ast.parse(fixed)
    assert fix_source(fixed, select=every, unsafe_fixes=True) == fixed
    assert [d for d in check_source(fixed, select=every) if d.fix is not None] == []
    # Plain --fix applies only the safe fixes: every unsafe one is still offered.
    safe = fix_source(source, select=every)
    assert fix_source(safe, select=every) == safe
    left = check_source(safe, select=every)
    assert all(not d.fix.safe for d in left if d.fix is not None)


@pytest.mark.parametrize(
    "body, fixable",
    [
        ("y = x.detach()\ny.add_(1)\nuse(y)", True),
        ("y = x.detach().mul_(2)", True),
        ("x.detach().zero_()", False),  # the write into x is the statement's only effect
        ("x.detach().copy_(new)", False),  # write-through idiom
        ("y = x.detach()\ny.copy_(src)\nuse(y)", False),
        ("y = x.detach()\ny.fill_(0)", False),  # y never read after the write
        ("y = x.detach()\ny[0] = 1\nuse(y)", True),
    ],
)
def test_detach_fix_only_where_a_clone_keeps_the_code_alive(body: str, fixable: bool) -> None:
    # x is a graph's output, read again by the backward after the write (ST005's evidence)
    (d,) = check_source("x = net(a)\n" + body + "\nx.sum().backward()\n", select="ST005")
    assert d.code == "ST005"
    assert (d.fix is not None) is fixable
    if not fixable:
        assert "torch.no_grad()" in d.message


def test_timing_of_non_cuda_work_in_a_cuda_file_is_not_flagged() -> None:
    src = """
    import time
    import torch

    model = torch.nn.Linear(2, 2).cuda()

    def wait_for(store, key, timeout):
        start = time.time()
        store.wait([key])
        if time.time() - start > timeout:
            raise TimeoutError(key)

    def bench(x):
        t0 = time.time()
        model(x)
        return time.time() - t0
    """
    found = check_source(textwrap.dedent(src), select="ST006")
    assert [(d.code, d.line) for d in found] == [("ST006", 16)]


@pytest.mark.parametrize("enabled", [True, False])
def test_check_file_restores_the_gc_state(tmp_path: Path, enabled: bool) -> None:
    import gc

    from safetorch.check import check_file

    path = tmp_path / "m.py"
    path.write_text(
        "import torch\ndef train():\n    torch.save(torch.nn.Linear(2, 2).cuda().state_dict(), 'a')\n"
        "device = 'cpu'\ntorch.load('a')\n"
    )
    was = gc.isenabled()
    try:
        (gc.enable if enabled else gc.disable)()
        assert [d.code for d in check_file(str(path), ["ST003", "ST004"]).diagnostics] == [
            "ST003",
            "ST004",
        ]
        assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()
