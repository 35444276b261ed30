"""A momentum-like value passed as BatchNorm/InstanceNorm's positional ``eps`` (ST015)."""

from __future__ import annotations

import ast
from typing import Dict

from safetorch.check.rules._base import Rule
from safetorch.check.rules._helpers import NN, has_star, short_name, var_key

# layer -> index of the positional ``eps`` parameter
_NORM_EPS: Dict[str, int] = {
    **{f"{NN}BatchNorm{d}d": 1 for d in (1, 2, 3)},
    **{f"{NN}InstanceNorm{d}d": 1 for d in (1, 2, 3)},
    NN + "SyncBatchNorm": 1,
    **{f"{NN}LazyBatchNorm{d}d": 0 for d in (1, 2, 3)},
    **{f"{NN}LazyInstanceNorm{d}d": 0 for d in (1, 2, 3)},
}


# A real eps is tiny (1e-5, 1e-3); values from 0.01 up are momentum values (0.1, 0.8, 0.99).
_EPS_LOOKS_LIKE_MOMENTUM = 0.01


class PositionalEpsInNorm(Rule):
    """ST015: a BatchNorm/InstanceNorm layer given a momentum-like value as positional ``eps``.

    The second positional parameter of ``nn.BatchNorm2d`` (and 1d/3d, ``SyncBatchNorm``,
    ``InstanceNorm*d``; the first of the ``Lazy`` variants) is ``eps``, not ``momentum``:
    ``nn.BatchNorm2d(128, 0.8)`` divides by ``sqrt(var + 0.8)`` instead of
    ``sqrt(var + 1e-5)``, which all but switches normalisation off for small activations,
    and leaves momentum at 0.1. Reported when the positional value is a number of 0.01 or
    more (a real eps is 1e-5 .. 1e-3) or a name that says momentum.

    Fix (manual): spell it with a keyword. For values from 0.5 to 1 (Keras's convention, the
    usual origin: Keras ``momentum=0.8`` is torch ``momentum=0.2``) the message leads with
    the torch equivalent ``1 - value``; ``momentum=`` with the value itself if torch's
    momentum was meant, or ``eps=0.8`` to keep today's behaviour on purpose (silences the
    rule).

    safetorch: none (a constructor argument; nothing to wrap).
    """

    code = "ST015"

    name = "positional-eps-in-norm"
    uses = None
    torch_symbols = ()  # nothing to route: the constructor is right, the call site is not
    node_types = (ast.Call,)

    def visit(self, node: ast.Call) -> None:
        qual = self.ctx.qualname(node.func)
        index = _NORM_EPS.get(qual or "")
        if index is None or len(node.args) <= index or has_star(node):
            return
        value = node.args[index]
        number = value.value if isinstance(value, ast.Constant) else None
        if isinstance(number, (int, float)) and not isinstance(number, bool):
            if number < _EPS_LOOKS_LIKE_MOMENTUM:
                return
        else:
            word = (var_key(value) or "").lower()
            if "mom" not in word:
                return
        shown = self.ctx.segment(value)
        head = (
            f"{short_name(qual or '')} gets eps={shown}: its positional parameter {index + 1} is "
            "eps, not momentum; "
        )
        if isinstance(number, (int, float)) and 0.5 <= number < 1:
            # 0.8, 0.9, 0.99: Keras's convention (the weight of the old statistics), the
            # usual source of this call; torch's momentum is the weight of the new batch.
            keras = f"{1 - number:.6g}"
            advice = (
                f"if it is Keras's momentum (code ported from Keras), torch's is 1 - it: "
                f"momentum={keras}; if torch's momentum was meant, momentum={shown}"
            )
        else:
            advice = (
                f"write momentum={shown} if momentum was meant (a Keras momentum m is "
                "torch's 1 - m)"
            )
        self.report(value, f"{head}{advice}; eps={shown} keeps today's behaviour")
