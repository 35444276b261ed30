"""``Finding``: one problem found by a model or loader check (``lint_model``, ``check_loader``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

__all__ = ["Finding"]


@dataclass(frozen=True)
class Finding:
    """One problem found by a runtime check.

    Attributes:
        rule: Stable finding id, e.g. ``"bias-before-bn"``; ``pitfall`` names the pitfall-table
            row it belongs to (the same id where the pitfall has one finding).
        where: What the finding is about: a module path (``"backbone.conv1"``) or ``"loader"``.
        message: What is wrong and why it matters, with the numbers involved.
        fix: The suggested fix, as code or a short instruction; ``None`` if there is none.

    >>> from safetorch import Finding
    >>> f = Finding("bias-before-bn", "features.0", "Conv2d bias is cancelled by BatchNorm", "bias=False")
    >>> print(f)
    features.0: [bias-before-bn] Conv2d bias is cancelled by BatchNorm (fix: bias=False)
    """

    rule: str
    where: str
    message: str
    fix: Optional[str] = None

    @property
    def pitfall(self) -> str:
        """The id of this finding's row in the pitfall table (``safetorch._pitfalls``).

        >>> from safetorch.findings import Finding
        >>> Finding("bn-momentum", "bn", "momentum=0.9 looks like 1 - momentum").pitfall
        'bn-statistics'
        """
        from safetorch import _pitfalls

        return _pitfalls.for_finding(self.rule).id

    def __str__(self) -> str:
        tail = f" (fix: {self.fix})" if self.fix else ""
        return f"{self.where}: [{self.rule}] {self.message}{tail}"
