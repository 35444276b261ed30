"""Patch ``upsample``: torch's deprecated ``F.upsample*`` -> the st.upsample family.

Silent (no deprecation warning) and bit-identical: the st functions are torch's own
``F.interpolate`` with the exact arguments each deprecated function implies.
"""

from __future__ import annotations

from safetorch.patching import registry

__all__: list = []

from safetorch.nn import upsampling as _impl  # noqa: E402


def _route(name: str) -> registry.WrapperFn:
    impl = getattr(_impl, name)
    return registry.route(
        "upsample",
        lambda wrapped, instance, args, kwargs: impl(*args, **kwargs),
        kind=f"F.{name} -> st.{name}",
        detail="F.interpolate with the same arguments, no warning",
        scoped=False,  # st.upsample* call F.interpolate, never the patched F.upsample*
    )


PATCH = registry.declare(
    registry.Patch(
        name="upsample",
        description="deprecated F.upsample* -> st.upsample*: same output, no warning",
        targets=tuple(
            registry.Target("torch.nn.functional", n, _route(n))
            for n in ("upsample", "upsample_nearest", "upsample_bilinear")
        ),
        pitfalls=("deprecated-upsample",),
        implementation=("safetorch.nn.upsampling", "upsample"),
    )
)
