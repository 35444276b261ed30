"""The rules of ``safetorch check``: one module per pitfall family, and their registry.

Each rule is a small class (``rules/<family>.py``, named like the ``safetorch/patching/``
module of its patch where it has one); its docstring is its ``--explain`` and its row of the
pitfall table (``safetorch._pitfalls``) says what the pitfall is, which safetorch function
implements it and where it is documented (``rules/_base.py``). This module lists the rules in
code order and builds ``RULE_TABLE``, which maps every code to those facts and to the torch
entry points the rule looks for, so monkeypatch mode can pair each patch with its rule.

``python -m safetorch.check.rules`` prints the rules table of ``docs/check.md`` (with
``--reference``: its rule reference).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Optional, Sequence, Tuple, Type, Union

from safetorch.check.engine import SAFE, SYNTAX_ERROR_CODE, parse_codes
from safetorch.check.rules import _docs
from safetorch.check.rules._base import DOCS_URL, Rule, docs_link, plain_text, summary
from safetorch.check.rules._helpers import Pos, min_torch, torch_at_least
from safetorch.check.rules._wrapped import Branch
from safetorch.check.rules.batchnorm import PositionalEpsInNorm
from safetorch.check.rules.cli_args import PositionalWithDefault
from safetorch.check.rules.data_parallel import DataParallelUsed
from safetorch.check.rules.detach import DetachThenInPlace
from safetorch.check.rules.dropout import FunctionalDropoutWithoutTraining
from safetorch.check.rules.fork_threads import ForkAfterOpenMP
from safetorch.check.rules.legacy_0_4 import (
    LegacyLossReduction,
    LegacyRetainVariables,
    VolatileVariable,
    ZeroDimIndex,
    ZeroDimIndexUnproven,
)
from safetorch.check.rules.legacy_1_x import LegacyAutogradFunction, RemovedLinalgFunction
from safetorch.check.rules.legacy_keys import LegacyStateDictKeys
from safetorch.check.rules.legacy_semantics import (
    LegacyBceTargetShape,
    LegacyIntegerDivision,
    ViewOfStridedResult,
)
from safetorch.check.rules.lint import BiasBeforeBatchNorm, DropoutBeforeBatchNorm, layer_flow
from safetorch.check.rules.load import LoadWithoutMapLocation, LoadWithoutWeightsOnly, payloads
from safetorch.check.rules.nonstrict_load import DiscardedNonStrictLoad
from safetorch.check.rules.pin_memory import CustomBatchWithoutPinMemory
from safetorch.check.rules.state_dict import StateDictOfWrappedModel
from safetorch.check.rules.syncbn import ConvertSyncBatchNorm
from safetorch.check.rules.syntax_error import SyntaxErrorRule
from safetorch.check.rules.timing import UnsyncedCudaTiming
from safetorch.check.rules.torch_six import TorchSixImport
from safetorch.check.rules.upsample import DeprecatedUpsampleFunction, DeprecatedUpsamplingModule

__all__ = [
    "DOCS_URL",
    "PREVIEW",
    "PREVIEW_RULES",
    "RULES",
    "RULE_TABLE",
    "Branch",
    "Pos",
    "Rule",
    "RuleInfo",
    "SyntaxErrorRule",
    "docs_link",
    "explain_text",
    "list_rules_text",
    "layer_flow",
    "markdown_reference",
    "markdown_table",
    "min_torch",
    "payloads",
    "plain_text",
    "rule_for",
    "select_rules",
    "torch_at_least",
    # the rules, in code order
    "DeprecatedUpsampleFunction",
    "DeprecatedUpsamplingModule",
    "LoadWithoutWeightsOnly",
    "LoadWithoutMapLocation",
    "DetachThenInPlace",
    "UnsyncedCudaTiming",
    "PositionalWithDefault",
    "BiasBeforeBatchNorm",
    "DropoutBeforeBatchNorm",
    "CustomBatchWithoutPinMemory",
    "StateDictOfWrappedModel",
    "DiscardedNonStrictLoad",
    "DataParallelUsed",
    "ConvertSyncBatchNorm",
    "PositionalEpsInNorm",
    "FunctionalDropoutWithoutTraining",
    "RemovedLinalgFunction",
    "TorchSixImport",
    "LegacyAutogradFunction",
    "ZeroDimIndex",
    "ZeroDimIndexUnproven",
    "VolatileVariable",
    "LegacyLossReduction",
    "ForkAfterOpenMP",
    "LegacyStateDictKeys",
    "LegacyIntegerDivision",
    "ViewOfStridedResult",
    "LegacyRetainVariables",
    "LegacyBceTargetShape",
]

#: The ``--select`` token that turns on every preview rule.
PREVIEW = "PREVIEW"

#: Every rule, in code order (ST000, the syntax error, is not a rule that runs).
RULES: Tuple[Type[Rule], ...] = (
    DeprecatedUpsampleFunction,
    DeprecatedUpsamplingModule,
    LoadWithoutWeightsOnly,
    LoadWithoutMapLocation,
    DetachThenInPlace,
    UnsyncedCudaTiming,
    PositionalWithDefault,
    BiasBeforeBatchNorm,
    DropoutBeforeBatchNorm,
    CustomBatchWithoutPinMemory,
    StateDictOfWrappedModel,
    DiscardedNonStrictLoad,
    DataParallelUsed,
    ConvertSyncBatchNorm,
    PositionalEpsInNorm,
    FunctionalDropoutWithoutTraining,
    RemovedLinalgFunction,
    TorchSixImport,
    LegacyAutogradFunction,
    ZeroDimIndex,
    VolatileVariable,
    LegacyLossReduction,
    ForkAfterOpenMP,
    LegacyStateDictKeys,
    LegacyIntegerDivision,
    ViewOfStridedResult,
    LegacyRetainVariables,
    LegacyBceTargetShape,
    ZeroDimIndexUnproven,
)


@dataclass(frozen=True)
class RuleInfo:
    """One row of ``RULE_TABLE``: a rule code, its pitfall and the safetorch function for it.

    Attributes:
        code: The rule code (``"ST003"``).
        name: The rule's name (``"load-without-weights-only"``).
        pitfall: One line: what goes wrong (its row's ``problem``).
        safetorch: The public safetorch function the rule points to (one of its row's), or
            None.
        torch_symbols: The torch entry points the pitfall lives in.
        fixable: Whether the rule has automatic fixes (for some of its findings).
        fix_applicability: ``"safe"`` (``--fix``), ``"unsafe"`` (``--unsafe-fixes``) or a
            phrase saying what it depends on.
        pitfall_id: The id of the rule's row in the pitfall table (``safetorch._pitfalls``);
            ``""`` for ST000 (a file that does not parse is not a pitfall).
        preview: An opt-in rule: it runs only when selected by its exact code or ``PREVIEW``.
        summary: What the rule finds (the first paragraph of its docstring, plain text).
        docs: The absolute link to its row's documentation (``""`` for ST000).
        functions_by_symbol: ``(torch entry point, safetorch function)`` pairs where the
            function differs per entry point (ST001).

    >>> RULE_TABLE["ST003"].safetorch
    'st.load'
    >>> RULE_TABLE["ST001"].safetorch_for("torch.nn.functional.upsample_bilinear")
    'st.upsample_bilinear'
    """

    code: str
    name: str
    pitfall: str
    safetorch: Optional[str]
    torch_symbols: Tuple[str, ...]
    fixable: bool
    fix_applicability: str = SAFE
    pitfall_id: str = ""
    preview: bool = False
    summary: str = ""
    docs: str = ""
    functions_by_symbol: Tuple[Tuple[str, str], ...] = ()

    def safetorch_for(self, symbol: str) -> Optional[str]:
        """The safetorch function that replaces torch entry point ``symbol`` of this rule."""
        if symbol not in self.torch_symbols:
            return None
        return dict(self.functions_by_symbol).get(symbol, self.safetorch)

    @classmethod
    def of(cls, rule: Type[Rule]) -> RuleInfo:
        """The facts of one rule class."""
        return cls(
            rule.code,
            rule.name,
            rule.pitfall,
            rule.safetorch,
            rule.torch_symbols,
            rule.fixable,
            rule.fix_applicability,
            rule.pitfall_id,
            rule.preview,
            summary(rule.__doc__),
            rule.docs,
            tuple(rule.functions_by_symbol.items()),
        )


_ALL_RULES: Tuple[Type[Rule], ...] = (SyntaxErrorRule, *RULES)

#: code -> the rule's facts: name, pitfall-table row (``pitfall_id``), safetorch function, and
#: the torch entry points it finds (``RULE_TABLE[code].safetorch_for(symbol)`` gives the
#: function for one entry point). Patches and rules meet in ``safetorch._pitfalls``.
RULE_TABLE = {rule.code: RuleInfo.of(rule) for rule in _ALL_RULES}

#: Codes of the opt-in rules (see ``select_rules``).
PREVIEW_RULES: Tuple[str, ...] = tuple(r.code for r in RULES if r.preview)


def explain_text(code: str) -> str:
    """What ``safetorch check --explain CODE`` prints: the rule's code, name, pitfall row
    (with an absolute documentation link), whether it is a preview rule, and its docstring
    as plain text.

    Raises:
        KeyError: No rule has that code.

    >>> print(explain_text("ST008").splitlines()[1])  # doctest: +ELLIPSIS
    pitfall: bias-before-bn (...), https://github.com/safetorch/safetorch/blob/main/docs/nn.md#...
    """
    return _docs.explain(rule_for(code))


def list_rules_text() -> str:
    """What ``safetorch check --list-rules`` prints (one rule per three lines)."""
    return "".join(line + "\n" for line in _docs.list_lines(_ALL_RULES))


def markdown_table() -> str:
    """The rules table of ``docs/check.md``, generated from the rule classes and their rows.

    >>> markdown_table().splitlines()[0]
    '| Code | Name | Finds | Fix | safetorch function | pitfall |'
    """
    return _docs.markdown_table(_ALL_RULES)


def markdown_reference() -> str:
    """The rule reference of ``docs/check.md``: one section per rule, from its docstring."""
    return _docs.markdown_reference(_ALL_RULES)


def rule_for(code: str) -> Type[Rule]:
    """The rule class for ``code`` (case-insensitive).

    Raises:
        KeyError: No rule has that code.

    >>> rule_for("st005").name
    'detach-then-inplace'
    """
    code = code.strip().upper()
    for rule in _ALL_RULES:
        if rule.code == code:
            return rule
    raise KeyError(f"unknown rule code {code!r}: expected one of {', '.join(RULE_TABLE)}")


def _matches(code: str, prefixes: Sequence[str]) -> bool:
    return any(p == "ALL" or code.startswith(p) for p in prefixes)


def select_rules(
    select: Union[str, Iterable[str], None] = None,
    ignore: Union[str, Iterable[str], None] = None,
) -> Tuple[Tuple[Type[Rule], ...], bool]:
    """The rules ``--select``/``--ignore`` leave on, and whether ST000 is reported.

    Codes match by prefix (``ST00`` selects ST000-ST009), ``ALL`` matches every rule; a
    comma-separated string or a list of codes is accepted. Preview rules (``PREVIEW_RULES``,
    below the default set's precision) run only when their exact code or ``PREVIEW`` is
    selected (``--select ALL,PREVIEW`` runs everything).

    Args:
        select: Codes to run (default: all).
        ignore: Codes to skip (applied after ``select``).

    Returns:
        (rule classes, report syntax errors).

    Raises:
        ValueError: A code or prefix that matches no rule.

    >>> rules, syntax = select_rules("ST003,ST004")
    >>> [r.code for r in rules], syntax
    (['ST003', 'ST004'], False)
    """
    chosen = parse_codes(select) or ("ALL",)
    dropped = parse_codes(ignore) or ()
    for code in (*chosen, *dropped):
        if code not in ("ALL", PREVIEW) and not any(c.startswith(code) for c in RULE_TABLE):
            raise ValueError(
                f"unknown rule code {code!r}: expected ALL, a code or a prefix of "
                f"{', '.join(RULE_TABLE)}"
            )

    def on(code: str) -> bool:
        return _matches(code, chosen) and not (dropped and _matches(code, dropped))

    def preview_on(code: str) -> bool:
        # Preview rules (precision below the default set's) run only when named exactly
        # or with PREVIEW, as ruff's preview rules need an explicit opt-in.
        named = code in chosen or PREVIEW in chosen
        return named and not (dropped and _matches(code, dropped))

    chosen_rules = tuple(r for r in RULES if (preview_on if r.preview else on)(r.code))
    return chosen_rules, on(SYNTAX_ERROR_CODE)
