"""Patch ``upsample``: torch's deprecated ``F.upsample*`` -> the st.upsample family.

Silent (no deprecation warning) and bit-identical: the st functions are torch's own
``F.interpolate`` with the exact arguments each deprecated function implies.
"""

from __future__ import annotations

from safetorch.nn import upsampling as _impl
from safetorch.patching._registry import Patch, Target, declare
from safetorch.patching._routing import WrapperFn, route

__all__: list = []


def _route(name: str) -> WrapperFn:
    impl = getattr(_impl, name)
    return route(
        "upsample",
        lambda wrapped, instance, args, kwargs: impl(*args, **kwargs),
        kind=f"F.{name} -> st.{name}",
        detail="F.interpolate with the same arguments, no warning",
        scoped=False,  # st.upsample* call F.interpolate, never the patched F.upsample*
    )


PATCH = declare(
    Patch(
        name="upsample",
        targets=tuple(
            Target("torch.nn.functional", n, _route(n))
            for n in ("upsample", "upsample_nearest", "upsample_bilinear")
        ),
    )
)
