"""Deprecated upsampling entry points (ST001, ST002): the ``upsample`` patch's pitfall."""

from __future__ import annotations

import ast
from typing import Dict, Tuple

from safetorch.check.engine import Fix
from safetorch.check.rules._base import Rule, pick
from safetorch.check.rules._helpers import (
    FUNCTIONAL,
    NN,
    add_keywords,
    find_keyword,
    rename_call,
    short_name,
)

# deprecated name -> (extra keyword arguments that make F.interpolate / nn.Upsample identical,
#                     safetorch function)
_UPSAMPLE_FUNCS: Dict[str, Tuple[str, str]] = {
    FUNCTIONAL + "upsample": ("", pick("ST001", "st.upsample")),
    FUNCTIONAL + "upsample_nearest": ('mode="nearest"', pick("ST001", "st.upsample_nearest")),
    FUNCTIONAL + "upsample_bilinear": (
        'mode="bilinear", align_corners=True',
        pick("ST001", "st.upsample_bilinear"),
    ),
}


_UPSAMPLE_MODULES: Dict[str, str] = {
    NN + "UpsamplingNearest2d": 'mode="nearest"',
    NN + "UpsamplingBilinear2d": 'mode="bilinear", align_corners=True',
}


class DeprecatedUpsampleFunction(Rule):
    """ST001: deprecated ``F.upsample``, ``F.upsample_nearest``, ``F.upsample_bilinear``.

    These functions warn on every call and are thin aliases of ``F.interpolate``;
    ``upsample_bilinear`` silently uses ``align_corners=True``, which ``interpolate``'s
    default (``False``) does not, so a naive rename shifts every output pixel.

    Fix (automatic, safe): rename to ``F.interpolate`` and add exactly the arguments that keep the
    result identical: ``mode="nearest"`` for ``upsample_nearest``,
    ``mode="bilinear", align_corners=True`` for ``upsample_bilinear``.

        F.upsample_bilinear(x, scale_factor=2)
        ->  F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=True)

    safetorch: ``st.upsample``, ``st.upsample_nearest``, ``st.upsample_bilinear``.
    """

    code = "ST001"

    name = "deprecated-upsample-function"
    torch_symbols = tuple(_UPSAMPLE_FUNCS)
    functions_by_symbol = {symbol: function for symbol, (_, function) in _UPSAMPLE_FUNCS.items()}
    fixable = True
    node_types = (ast.Call,)

    def visit(self, node: ast.Call) -> None:
        qual = self.ctx.qualname(node.func)
        if qual not in _UPSAMPLE_FUNCS:
            return
        extra, st_name = _UPSAMPLE_FUNCS[qual]
        shown = "F.interpolate(..." + (", " + extra if extra else "") + ")"
        fix = None
        if not (extra and find_keyword(node, "mode")) and node.args:
            edits = [rename_call(self.ctx, node, FUNCTIONAL + "interpolate")]
            if extra:
                edits.append(add_keywords(self.ctx, node, extra))
            if all(e is not None for e in edits):
                fix = Fix(f"replace with {shown}", tuple(e for e in edits if e is not None))
        self.report(
            node,
            f"{short_name(qual)} is deprecated: use {shown} (identical result) or {st_name}",
            fix,
        )


class DeprecatedUpsamplingModule(Rule):
    """ST002: deprecated ``nn.UpsamplingNearest2d`` / ``nn.UpsamplingBilinear2d``.

    Both are deprecated subclasses of ``nn.Upsample``; ``UpsamplingBilinear2d`` hard-codes
    ``align_corners=True``, unlike ``nn.Upsample(mode="bilinear")``.

    Fix (automatic, safe): ``nn.Upsample(...)`` with the equivalent mode and align_corners:

        nn.UpsamplingBilinear2d(scale_factor=2)
        ->  nn.Upsample(scale_factor=2, mode="bilinear", align_corners=True)

    safetorch: ``st.Upsample``.
    """

    code = "ST002"

    name = "deprecated-upsampling-module"
    uses = "st.Upsample"
    torch_symbols = tuple(_UPSAMPLE_MODULES)
    fixable = True
    node_types = (ast.Call,)

    def visit(self, node: ast.Call) -> None:
        qual = self.ctx.qualname(node.func)
        if qual not in _UPSAMPLE_MODULES:
            return
        extra = _UPSAMPLE_MODULES[qual]
        shown = f"nn.Upsample(..., {extra})"
        fix = None
        if not find_keyword(node, "mode"):
            rename = rename_call(self.ctx, node, NN + "Upsample")
            add = add_keywords(self.ctx, node, extra)
            if rename is not None and add is not None:
                fix = Fix(f"replace with {shown}", (rename, add))
        self.report(node, f"{short_name(qual)} is deprecated: use {shown} or st.Upsample", fix)
