"""Patch ``index``: tensor indexing checked before the kernel on devices that need it.

Targets ``Tensor.__getitem__``, ``Tensor.index_select``, ``Tensor.gather``,
``torch.index_select`` and ``torch.gather``. Where the device policy says the kernel checks
bounds itself (CPU, meta) the wrapper calls torch's original at once and does nothing else;
elsewhere (CUDA, ROCm, MPS, ...) the call goes to ``st.checked_index`` / ``st.index_select``
/ ``st.gather``, which raise an ``IndexError`` *before* a device-side assert can kill the
CUDA context.

The st functions call torch's originals, which ``safetorch._index_parse`` captures when it is
imported: this module imports it before any patch goes on. ``safetorch.tensor`` itself (its
checks, the custom ops for ``torch.compile``, the Triton path) is imported on the first call a
wrapper routes to it, never while dynamo traces (each handler tests ``compiling()`` first), so
a program that indexes only where the kernel checks (CPU) never pays for it. Any other
indexing the st functions do re-enters these wrappers, which then see ``nested("index")`` and
go straight to torch. ``Tensor.__getitem__`` is also a target of the ``legacy`` patch: the
registry keeps one wrapper for it, to which each patch contributes its handler (legacy's
around this one, so that it sees the ``IndexError`` of a checked index).
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import torch

from safetorch import (
    _compat,
    _device,
    _index_parse,  # noqa: F401  (captures torch's originals before any patch)
)
from safetorch.patching._attribution import call_attributing_warnings
from safetorch.patching._registry import Patch, Target, declare
from safetorch.patching._report import record
from safetorch.patching._routing import LazyModule, WrapperFn, nested, reentry

__all__: list = []

# Imported on the first routed call (see the module docstring): importing it registers the
# custom ops of safetorch._index_compile, which must not happen while dynamo traces.
_tensor: Any = LazyModule("safetorch.tensor")
_NAME = "index"


_index_check_needed = _device.index_check_needed  # the one device gate


_Tensor = torch.Tensor
_uint8 = torch.uint8


def _may_warn(index: Any) -> bool:
    """Whether torch warns for this index (uint8 masks are deprecated, warned per call)."""
    if type(index) is _Tensor or isinstance(index, _Tensor):
        return index.dtype is _uint8
    if type(index) is tuple or type(index) is list:
        return any(isinstance(i, _Tensor) and i.dtype is _uint8 for i in index)
    return False


def torch_getitem(wrapped: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
    """``wrapped(*args, **kwargs)`` for a ``Tensor.__getitem__`` handler that calls torch.

    torch's C++ warning for a uint8 mask would name the handler's frame: it is re-attributed
    to the caller's line (only for such indices: every other call pays one type test).
    """
    if args and type(args[0]) is not int and _may_warn(args[0]):
        return call_attributing_warnings(wrapped, *args, **kwargs)
    return wrapped(*args, **kwargs)


def _getitem(wrapped: Any, instance: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
    if not _index_check_needed(instance):  # e.g. CPU: its kernels raise by themselves
        return torch_getitem(wrapped, args, kwargs)
    if nested(_NAME) or kwargs or len(args) != 1:
        return wrapped(*args, **kwargs)
    if _compat.compiling():  # a checked index syncs the host: not inside a graph
        return wrapped(*args, **kwargs)
    record(_NAME, f"x[index] -> st.checked_index ({instance.device.type})")
    with reentry(_NAME):
        return call_attributing_warnings(_tensor.checked_index, instance, args[0])


def _bind(
    instance: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any], extra: Tuple[str, ...]
) -> Optional[Tuple[Any, Any, Any, Dict[str, Any]]]:
    """(x, dim, index, extra kwargs) of an index_select/gather call, or None if unusual."""
    if instance is not None:
        args = (instance, *args)
    names = ("input", "dim", "index")
    values = dict(zip(names, args))
    if len(args) > 3:
        return None
    rest = {}
    for k, v in kwargs.items():
        if k in names and k not in values:
            values[k] = v
        elif k in extra:
            rest[k] = v
        else:
            return None  # out=, or a bad call: torch's own behaviour and error
    if len(values) != 3 or not isinstance(values["dim"], int):
        return None  # named dimension (str) or a missing argument
    return values["input"], values["dim"], values["index"], rest


def _select_like(op: str, label: str, extra: Tuple[str, ...]) -> WrapperFn:
    def handler(wrapped: Any, instance: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
        x = instance if instance is not None else (args[0] if args else kwargs.get("input"))
        if not isinstance(x, _Tensor) or not _index_check_needed(x) or nested(_NAME):
            return wrapped(*args, **kwargs)  # e.g. CPU kernels raise by themselves
        device = x.device
        if _compat.compiling():
            return wrapped(*args, **kwargs)
        bound = _bind(instance, args, kwargs, extra)
        if bound is None:
            return wrapped(*args, **kwargs)
        x, dim, index, rest = bound
        record(_NAME, f"{label} -> st.{op} ({device.type})")
        with reentry(_NAME):
            return call_attributing_warnings(getattr(_tensor, op), x, dim, index, **rest)

    return handler


PATCH = declare(
    Patch(
        name=_NAME,
        targets=(
            Target("torch", "Tensor.__getitem__", _getitem, attribute_warnings=False),
            *(
                Target("torch", path, _select_like(op, label, extra), attribute_warnings=False)
                for path, op, label, extra in (
                    ("Tensor.index_select", "index_select", "x.index_select", ()),
                    ("Tensor.gather", "gather", "x.gather", ("sparse_grad",)),
                    ("index_select", "index_select", "torch.index_select", ()),
                    ("gather", "gather", "torch.gather", ("sparse_grad",)),
                )
            ),
        ),
    )
)
