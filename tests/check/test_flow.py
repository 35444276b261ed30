"""Rules that follow values (issue 23): what the messages say at each site."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Dict, List

import pytest

from safetorch.check import check_source, fix_source
from safetorch.check.engine import Diagnostic

FIXTURES = Path(__file__).parent / "fixtures"


def found(source: str, code: str) -> List[Diagnostic]:
    return [d for d in check_source(textwrap.dedent(source), select=[code]) if d.code == code]


def by_line(path: str, code: str) -> Dict[int, Diagnostic]:
    source = (FIXTURES / path).read_text()
    return {d.line: d for d in check_source(source, path, [code]) if d.code == code}


def test_wrapped_advice_follows_the_wrap_and_the_resume() -> None:
    diags = by_line("wrapped_flow.py", "ST011")
    sometimes = diags[30]
    assert "wrapped in DataParallel on some paths only" in sometimes.message
    assert "model.module.state_dict()" not in sometimes.message
    assert "load it at line 27 with st.load_state_dict(model" in sometimes.message
    always = diags[42]
    assert "sometimes" not in always.message and "model.module.state_dict()" in always.message
    assert "st.load_state_dict loads files with or without the prefix" in always.message


def test_bias_fix_is_withheld_where_init_code_writes_the_bias() -> None:
    diags = by_line("bias_init.py", "ST008")
    assert set(diags) == {9, 24}
    assert all(d.fix is None for d in diags.values())
    assert "line 12" in diags[9].message and "if m.bias is not None" in diags[9].message
    assert "line 18" in diags[24].message


def test_bias_from_a_parameter_default_is_a_manual_finding() -> None:
    diags = by_line("layer_flow.py", "ST008")
    assert diags[47].fix is None and "bias=bias, whose default is True" in diags[47].message
    assert diags[14].fix is not None  # written in the list, always before BatchNorm
    assert diags[40].fix is None  # a layer held in a variable may be used elsewhere


def test_bias_fix_only_where_the_layer_is_always_followed_by_batchnorm() -> None:
    src = """
    import torch.nn as nn

    def block(cin, cout, norm=True):
        layers = [nn.Conv2d(cin, cout, 3)]
        if norm:
            layers.append(nn.BatchNorm2d(cout))
        layers.append(nn.ReLU())
        return layers

    net = nn.Sequential(*block(3, 8, norm=False), *block(8, 8))
    """
    (diag,) = found(src, "ST008")
    assert diag.fix is None and "where it is followed by BatchNorm" in diag.message


def test_zero_dim_fix_parenthesizes_an_expression() -> None:
    src = "import torch\nm = (a.mean() + torch.abs(b.sum())).data[0]\n"
    assert fix_source(src, select=["ST020"], unsafe_fixes=True).endswith(
        "m = (a.mean() + torch.abs(b.sum())).item()\n"
    )


def test_load_messages_say_what_the_file_holds() -> None:
    module = by_line("load_module.py", "ST003")
    assert "evidently holds a whole module (line 9)" in module[8].message
    assert "weights_only=True refuses the file" in module[10].message
    # the file saves it (line 7): st.save there and st.load here, never weights_only=True
    for fix in (module[8].fix, module[10].fix):
        assert fix is not None and not fix.safe and fix.message.startswith("save with st.save")
    assert module[11].fix is not None  # loaded as a state dict: weights_only=True is right
    assert module[11].fix.message == "add weights_only=True"
    numpy = by_line("load_numpy.py", "ST003")
    assert "numpy data" in numpy[8].message and "numpy scalars" in numpy[11].message
    assert numpy[8].fix is not None and numpy[11].fix is not None


def test_code_that_needs_torch_2_6_is_weights_only_by_default() -> None:
    (diag,) = by_line("load_new_torch.py", "ST003").values()
    assert "can execute code" not in diag.message
    assert "this code needs torch >= 2.6 (torch.accelerator at line 6)" in diag.message


def test_preview_rules_run_only_when_named(monkeypatch: pytest.MonkeyPatch) -> None:
    from safetorch.check import rules, runner

    monkeypatch.setattr(rules.LoadWithoutMapLocation, "preview", True)
    monkeypatch.setattr(runner, "_SELECTED", {})  # selections are cached per process
    src = (
        "import torch\n"
        "def train():\n"
        "    torch.save(torch.nn.Linear(2, 2).cuda().state_dict(), 'a.pt')\n"
        "device = 'cuda' if torch.cuda.is_available() else 'cpu'\n"
        "sd = torch.load('a.pt')\n"
    )
    (one,) = check_source(src)  # one finding per call, saying both things
    assert one.code == "ST003" and "lacks map_location" in one.message
    assert [d.code for d in check_source(src, select="ST004")] == ["ST004"]
    assert [d.code for d in check_source(src, select="ALL,PREVIEW")] == ["ST003", "ST004"]
    assert [d.code for d in check_source(src, select="ST00")] == ["ST003"]
    assert "preview: opt-in" in rules.explain_text("ST004")


def test_explain_text_is_plain_with_absolute_links() -> None:
    from safetorch.check.rules import RULE_TABLE, explain_text

    for code in RULE_TABLE:
        text = explain_text(code)
        assert "``" not in text and ":class:`" not in text, code
        for line in text.splitlines():
            if line.startswith("pitfall: "):
                assert "https://" in line, code
