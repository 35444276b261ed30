"""Patch ``upsample``: torch's deprecated ``F.upsample*`` -> the st.upsample family.

Silent (no deprecation warning) and bit-identical: the st functions are torch's own
``F.interpolate`` with the exact arguments each deprecated function implies.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Tuple

from safetorch.patching._registry import Patch, Target, declare
from safetorch.patching._routing import LazyModule, WrapperFn, route

__all__: list = []

_impl: Any = LazyModule("safetorch.nn.upsampling")  # at the first patched call


def _route(name: str) -> WrapperFn:
    impl: Optional[Callable[..., Any]] = None

    def body(wrapped: Any, instance: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
        nonlocal impl
        if impl is None:
            impl = getattr(_impl, name)
        return impl(*args, **kwargs)

    return route(
        "upsample",
        body,
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
