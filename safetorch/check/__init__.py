"""``safetorch check``: a static checker, with autofix, for the PyTorch pitfalls safetorch knows.

Pure stdlib (``ast``): importing this package never imports torch. Every rule points to, or
rewrites into, the public safetorch function for its pitfall; ``RULE_TABLE`` maps each rule
code to that pitfall and function.

>>> from safetorch.check import check_source
>>> src = "import torch.nn.functional as F\\ny = F.upsample(x, scale_factor=2)\\n"
>>> [d.code for d in check_source(src)]
['ST001']
"""

from safetorch.check.engine import Diagnostic, Edit, Fix, Rule
from safetorch.check.rules import RULE_TABLE, RULES, RuleInfo, rule_for, select_rules
from safetorch.check.runner import (
    DEFAULT_EXCLUDES,
    FileResult,
    check_file,
    check_paths,
    check_source,
    fix_source,
    iter_python_files,
)

__all__ = [
    "DEFAULT_EXCLUDES",
    "Diagnostic",
    "Edit",
    "FileResult",
    "Fix",
    "RULES",
    "RULE_TABLE",
    "Rule",
    "RuleInfo",
    "check_file",
    "check_paths",
    "check_source",
    "explain",
    "fix_source",
    "iter_python_files",
    "rule_for",
    "select_rules",
]


def explain(code: str) -> str:
    """The explanation of a rule: its code, name, pitfall row (with an absolute documentation
    link), safetorch function, whether it is a preview rule, and its docstring as plain text.

    Args:
        code: A rule code such as ``"ST005"`` (case-insensitive).

    Returns:
        The text ``safetorch check --explain CODE`` prints.

    Raises:
        KeyError: No rule has that code.

    >>> print(explain("ST003").splitlines()[0])  # doctest: +ELLIPSIS
    ST003 (load-without-weights-only): ...
    >>> print(explain("ST008").splitlines()[1])  # doctest: +ELLIPSIS
    pitfall: bias-before-bn (...), https://github.com/safetorch/safetorch/blob/main/docs/nn.md#...
    """
    from safetorch.check import rules

    return rules.explain_text(code)
