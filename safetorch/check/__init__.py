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
    """The explanation of a rule: its code, name, safetorch function and docstring.

    Args:
        code: A rule code such as ``"ST005"`` (case-insensitive).

    Returns:
        The text ``safetorch check --explain CODE`` prints.

    Raises:
        KeyError: No rule has that code.

    >>> print(explain("ST003").splitlines()[0])
    ST003 (load-without-weights-only): torch.load unpickles arbitrary objects unless weights_only=True
    >>> print(explain("ST008").splitlines()[1])
    pitfall: bias-before-bn (A bias right before BatchNorm), docs/nn.md#model-lint-bias-before-bn-dropout-before-bn-meaningless-bn-statistics
    """
    import inspect

    from safetorch import _pitfalls

    rule = rule_for(code)
    doc = inspect.cleandoc(rule.__doc__ or "")
    head = f"{rule.code} ({rule.name}): {rule.pitfall}\n"
    if rule.pitfall_id:
        row = _pitfalls.by_id(rule.pitfall_id)
        faces = [f"safetorch: {', '.join(row.functions)}"] if row.functions else []
        faces += [f"patch: st.patch({row.patch!r})"] if row.patch else []
        faces += [f"runtime check: {', '.join(row.findings)}"] if row.findings else []
        head += f"pitfall: {row.id} ({row.title}), {row.docs}\n"
        head += "".join(f"  {face}\n" for face in faces)
    return f"{head}\n{doc}\n"
