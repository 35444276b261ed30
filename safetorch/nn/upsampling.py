"""Upsampling without the deprecated entry points: everything goes through ``F.interpolate``.

``F.upsample``, ``F.upsample_nearest`` and ``F.upsample_bilinear`` are deprecated (they warn on
every call) and are thin calls of ``F.interpolate`` with fixed arguments. The functions here
make exactly the same ``F.interpolate`` call, so outputs and gradients are bit-identical, and
they warn about nothing.

The one trap worth remembering: ``upsample_bilinear`` means ``align_corners=True``, while
``upsample(..., mode="bilinear")`` (and ``Upsample(mode="bilinear")``) defaults to
``align_corners=False``. Each function here keeps its own torch meaning.

``F.interpolate`` is captured at import: monkeypatch mode routes ``F.upsample*`` to these
functions, and a call through a patched torch entry point must never come back to itself.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Union

import torch
import torch.nn as nn
import torch.nn.functional as F

from safetorch._types import UpsampleMode, unquoted

__all__: List[str] = [
    "upsample",
    "upsample_nearest",
    "upsample_bilinear",
    "Upsample",
    "UpsamplingNearest2d",
    "UpsamplingBilinear2d",
]

# Captured once: patched torch entry points (F.upsample -> st.upsample) must not recurse.
_interpolate = F.interpolate

_Size = Optional[Union[int, Sequence[int]]]
_Scale = Optional[Union[float, Sequence[float]]]


@unquoted
def upsample(
    input: torch.Tensor,
    size: _Size = None,
    scale_factor: _Scale = None,
    mode: UpsampleMode = "nearest",
    align_corners: Optional[bool] = None,
) -> torch.Tensor:
    """Upsample ``input``: torch's deprecated ``F.upsample``, without the deprecation warning.

    Exactly ``F.interpolate(input, size, scale_factor, mode, align_corners)``, as
    ``F.upsample`` is. ``mode="bilinear"`` keeps torch's default ``align_corners=False``
    (unlike :func:`upsample_bilinear`).

    Args:
        input: A 3-D, 4-D or 5-D tensor ``(N, C, [D, [H,]] W)``.
        size: Output spatial size (int or one int per spatial dimension).
        scale_factor: Multiplier for the spatial size (float or one per spatial dimension).
        mode: ``"nearest"``, ``"linear"``, ``"bilinear"``, ``"bicubic"``, ``"trilinear"``,
            ``"area"`` or ``"nearest-exact"``.
        align_corners: As ``F.interpolate``; only for the linear modes and ``"bicubic"``.

    Returns:
        The upsampled tensor, bit-identical to ``F.upsample``'s.

    Raises:
        ValueError: As ``F.interpolate`` (both or neither of ``size``/``scale_factor``, a
            mode that does not fit the input's dimensionality, ...).

    >>> import torch, safetorch as st
    >>> st.upsample(torch.tensor([[[1.0, 2.0]]]), scale_factor=2)
    tensor([[[1., 1., 2., 2.]]])
    """
    return _interpolate(input, size, scale_factor, mode, align_corners)


def upsample_nearest(
    input: torch.Tensor, size: _Size = None, scale_factor: _Scale = None
) -> torch.Tensor:
    """Nearest-neighbour upsampling: torch's deprecated ``F.upsample_nearest``, without the warning.

    Exactly ``F.interpolate(input, size, scale_factor, mode="nearest")``.

    Args:
        input: A 3-D, 4-D or 5-D tensor.
        size: Output spatial size.
        scale_factor: Multiplier for the spatial size.

    Returns:
        The upsampled tensor, bit-identical to ``F.upsample_nearest``'s.

    Raises:
        ValueError: As ``F.interpolate``.

    >>> import torch, safetorch as st
    >>> st.upsample_nearest(torch.arange(4.0).view(1, 1, 2, 2), size=3).shape
    torch.Size([1, 1, 3, 3])
    """
    return _interpolate(input, size, scale_factor, mode="nearest")


def upsample_bilinear(
    input: torch.Tensor, size: _Size = None, scale_factor: _Scale = None
) -> torch.Tensor:
    """Bilinear upsampling with ``align_corners=True``: torch's deprecated ``F.upsample_bilinear``.

    Exactly ``F.interpolate(input, size, scale_factor, mode="bilinear", align_corners=True)``.
    Note ``align_corners=True``: this is *not* ``upsample(x, mode="bilinear")``, whose default
    is ``align_corners=False``; both keep torch's meaning.

    Args:
        input: A 4-D tensor ``(N, C, H, W)``.
        size: Output spatial size.
        scale_factor: Multiplier for the spatial size.

    Returns:
        The upsampled tensor, bit-identical to ``F.upsample_bilinear``'s.

    Raises:
        ValueError: As ``F.interpolate`` (e.g. a 3-D or 5-D input).

    >>> import torch, safetorch as st
    >>> st.upsample_bilinear(torch.tensor([[[[0.0, 3.0]]]]), size=(1, 4))
    tensor([[[[0., 1., 2., 3.]]]])
    """
    return _interpolate(input, size, scale_factor, mode="bilinear", align_corners=True)


class Upsample(nn.Upsample):
    """Drop-in ``nn.Upsample`` whose forward is the captured ``F.interpolate``.

    Same constructor, ``repr``, (empty) ``state_dict`` and output as ``torch.nn.Upsample``,
    and an instance of it, so code that tests ``isinstance(m, nn.Upsample)`` keeps working.

    Args:
        size: Output spatial size.
        scale_factor: Multiplier for the spatial size.
        mode: Interpolation mode, as ``nn.Upsample``.
        align_corners: As ``nn.Upsample`` (``False`` when ``None`` for the linear modes).
        recompute_scale_factor: As ``nn.Upsample``.

    Raises:
        ValueError: In forward, as ``F.interpolate``.

    >>> import torch, safetorch as st
    >>> m = st.Upsample(scale_factor=2, mode="bilinear")
    >>> isinstance(m, torch.nn.Upsample)
    True
    >>> repr(m) == repr(torch.nn.Upsample(scale_factor=2, mode="bilinear"))
    True
    >>> m(torch.tensor([[[[0.0, 4.0]]]]))
    tensor([[[[0., 1., 3., 4.],
              [0., 1., 3., 4.]]]])
    """

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """Upsample ``input`` exactly as ``nn.Upsample.forward`` does."""
        return _interpolate(
            input,
            self.size,
            self.scale_factor,
            self.mode,
            self.align_corners,
            recompute_scale_factor=self.recompute_scale_factor,
        )


class UpsamplingNearest2d(Upsample, nn.UpsamplingNearest2d):
    """Drop-in ``nn.UpsamplingNearest2d`` (2-D nearest-neighbour upsampling).

    An instance of both ``nn.UpsamplingNearest2d`` and ``nn.Upsample``; same constructor,
    ``repr`` and output.

    Args:
        size: Output spatial size ``(H, W)`` or an int.
        scale_factor: Multiplier for the spatial size.

    Raises:
        ValueError: In forward, as ``F.interpolate``.

    >>> import torch, safetorch as st
    >>> st.UpsamplingNearest2d(scale_factor=2)(torch.ones(1, 1, 2, 2)).shape
    torch.Size([1, 1, 4, 4])
    """

    def __init__(self, size: _Size = None, scale_factor: _Scale = None) -> None:
        # Skip nn.UpsamplingNearest2d.__init__ in the MRO: it would call Upsample.__init__
        # with its own signature; nn.Upsample.__init__ is what it ends up calling anyway.
        nn.Upsample.__init__(self, size, scale_factor, mode="nearest")  # type: ignore[arg-type]  # torch's stub is narrower than the values it accepts (int or tuple)


class UpsamplingBilinear2d(Upsample, nn.UpsamplingBilinear2d):
    """Drop-in ``nn.UpsamplingBilinear2d`` (2-D bilinear upsampling, ``align_corners=True``).

    An instance of both ``nn.UpsamplingBilinear2d`` and ``nn.Upsample``; same constructor,
    ``repr`` and output.

    Args:
        size: Output spatial size ``(H, W)`` or an int.
        scale_factor: Multiplier for the spatial size.

    Raises:
        ValueError: In forward, as ``F.interpolate``.

    >>> import torch, safetorch as st
    >>> st.UpsamplingBilinear2d(size=(1, 4))(torch.tensor([[[[0.0, 3.0]]]]))
    tensor([[[[0., 1., 2., 3.]]]])
    """

    def __init__(self, size: _Size = None, scale_factor: _Scale = None) -> None:
        nn.Upsample.__init__(
            self,
            size,  # type: ignore[arg-type]  # torch's stub is narrower than the values it accepts (int or tuple)
            scale_factor,  # type: ignore[arg-type]  # torch's stub is narrower than the values it accepts (float or tuple)
            mode="bilinear",
            align_corners=True,
        )
