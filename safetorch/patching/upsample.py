"""Patch ``upsample``: torch's deprecated ``F.upsample*`` -> the st.upsample family.

Silent (no deprecation warning) and bit-identical: the st functions are torch's own
``F.interpolate`` with the exact arguments each deprecated function implies.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Tuple

from safetorch.patching import registry

__all__: list = []

from safetorch.nn import upsampling as _impl  # noqa: E402


def _route(name: str) -> Callable[..., Any]:
    kind = f"F.{name} -> st.{name}"

    def wrapper(wrapped: Any, instance: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
        registry.record("upsample", kind, "F.interpolate with the same arguments, no warning")
        return getattr(_impl, name)(*args, **kwargs)

    return wrapper


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
