"""The rules' documentation, generated from the rule classes (docstring) and their rows.

``--explain CODE``, ``--list-rules`` and the rules table of ``docs/check.md`` are all made here,
as ruff makes its rule documentation from the rules' docstrings: nothing is written twice.
"""

from __future__ import annotations

import inspect
from typing import List, Sequence, Type

from safetorch import _pitfalls
from safetorch.check.rules._base import Rule, plain_text, summary

__all__ = ["explain", "fix_kind", "functions", "list_lines", "markdown_reference", "markdown_table"]


def fix_kind(rule: Type[Rule]) -> str:
    """``"safe"``, ``"unsafe"``, a phrase saying what it depends on, or ``"manual"``."""
    return rule.fix_applicability if rule.fixable else "manual"


def functions(rule: Type[Rule]) -> List[str]:
    """The safetorch functions the rule points to: one per torch entry point where they
    differ (ST001), else its ``safetorch`` function; empty for none."""
    if rule.functions_by_symbol:
        return list(dict.fromkeys(rule.functions_by_symbol.values()))
    return [rule.safetorch] if rule.safetorch else []


def explain(rule: Type[Rule]) -> str:
    """What ``safetorch check --explain CODE`` prints: the rule's code, name and pitfall, its
    row (with an absolute documentation link and the row's faces), whether it is a preview
    rule, and its docstring as plain text."""
    doc = plain_text(inspect.cleandoc(rule.__doc__ or ""))
    head = f"{rule.code} ({rule.name}): {rule.pitfall}\n"
    if rule.has_row:
        row = _pitfalls.by_id(rule.pitfall_id)
        faces = [f"safetorch: {', '.join(row.functions)}"] if row.functions else []
        faces += [f"patch: st.patch({row.patch!r})"] if row.patch else []
        faces += [f"runtime check: {', '.join(row.findings)}"] if row.findings else []
        head += f"pitfall: {row.id} ({row.title}), {rule.docs}\n"
        head += "".join(f"  {face}\n" for face in faces)
    if rule.preview:
        head += f"preview: opt-in, runs only with --select {rule.code} (or PREVIEW)\n"
    return f"{head}\n{doc}\n"


def list_lines(rules: Sequence[Type[Rule]]) -> List[str]:
    """``--list-rules`` as text: per rule its code, name, fix kind and safetorch function,
    what it finds, and its pitfall id."""
    lines: List[str] = []
    for rule in rules:
        target = rule.safetorch or "-"
        lines.append(f"{rule.code}  {rule.name:<38} fix: {fix_kind(rule):<12} safetorch: {target}")
        lines.append(f"       {summary(rule.__doc__)}")
        if rule.has_row:
            lines.append(f"       pitfall: {rule.pitfall_id}")
    return lines


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def markdown_table(rules: Sequence[Type[Rule]]) -> str:
    """The rules table of ``docs/check.md``: code, name, what the rule finds (its docstring's
    first paragraph), its fix, its safetorch function(s) and its pitfall id."""
    lines = [
        "| Code | Name | Finds | Fix | safetorch function | pitfall |",
        "|---|---|---|---|---|---|",
    ]
    for rule in rules:
        finds = ("**preview**: " if rule.preview else "") + summary(rule.__doc__)
        fix = fix_kind(rule) if rule.fixable else "-"
        names = ", ".join(f"`{f}`" for f in functions(rule)) or "-"
        pitfall = f"`{rule.pitfall_id}`" if rule.has_row else "-"
        cells = [rule.code, f"`{rule.name}`", _cell(finds), _cell(fix), names, pitfall]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def markdown_reference(rules: Sequence[Type[Rule]]) -> str:
    """One section per rule for ``docs/check.md``: what it finds, its facts and its docstring
    (the text ``--explain`` prints), as markdown."""
    parts: List[str] = []
    for rule in rules:
        doc = plain_text(inspect.cleandoc(rule.__doc__ or "")).split("\n\n", 1)
        facts = [f"fix: {fix_kind(rule)}"]
        names = ", ".join(f"`{f}`" for f in functions(rule))
        facts.append(f"safetorch: {names or '-'}")
        if rule.has_row:
            facts.append(f"pitfall: [`{rule.pitfall_id}`]({rule.docs})")
        if rule.preview:
            facts.append("**preview** (opt-in)")
        section = [
            f"#### {rule.code} `{rule.name}`",
            "",
            summary(rule.__doc__),
            "",
            "; ".join(facts),
        ]
        if len(doc) > 1:
            section += ["", doc[1].rstrip()]
        parts.append("\n".join(section))
    return "\n\n".join(parts)
