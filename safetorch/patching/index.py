"""Patch ``index``: tensor indexing checked before the kernel on devices that need it.

Targets ``Tensor.__getitem__``, ``Tensor.index_select``, ``Tensor.gather``,
``torch.index_select`` and ``torch.gather``. Where the device policy says the kernel checks
bounds itself (CPU, meta) the wrapper calls torch's original at once and does nothing else;
elsewhere (CUDA, ROCm, MPS, ...) the call goes to ``st.checked_index`` / ``st.index_select``
/ ``st.gather``, which raise an ``IndexError`` *before* a device-side assert can kill the
CUDA context.

The st functions call torch's originals, captured when safetorch.tensor was imported (before
any patch); any other indexing they do re-enters these wrappers, which then see
``registry.nested("index")`` and go straight to torch.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Dict, Optional, Tuple

import torch

from safetorch import _device
from safetorch.patching import registry

__all__: list = []

_tensor = importlib.import_module("safetorch.tensor")
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


# Set by the ``legacy`` patch while it is on: called with (x, args) when torch's indexing (or
# st.checked_index) raised IndexError; returns the legacy result (x[0] / x[-1] of a 0-dim
# tensor of any class: a subclass's __torch_function__ re-enters this wrapper) or _UNHANDLED.
# The IndexError path is the only place it is read, so indexing that succeeds pays nothing for
# it (a `try` costs nothing in CPython >= 3.11 until something raises).
_UNHANDLED = object()
on_index_error: Optional[Callable[[Any, Tuple[Any, ...]], Any]] = None


def _after_index_error(instance: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
    """Called from an ``except IndexError`` block: the legacy result, or the error re-raised."""
    hook = on_index_error
    if hook is None or kwargs:
        raise  # the IndexError being handled by the caller
    result = hook(instance, args)
    if result is _UNHANDLED:
        raise
    return result


def _torch_getitem(wrapped: Any, instance: Any, args: Tuple[Any, ...], kwargs: Dict) -> Any:
    try:
        return wrapped(*args, **kwargs)
    except IndexError:
        return _after_index_error(instance, args, kwargs)


def _getitem(wrapped: Any, instance: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
    # The one wrapper of Tensor.__getitem__, shared by the `index` and `legacy` patches (either
    # may have installed it, see _hand_over): bounds checks run only while `index` is on.
    if not _index_check_needed(instance):  # e.g. CPU: its kernels raise by themselves
        if args and type(args[0]) is not int and _may_warn(args[0]):
            # torch's C++ warning would name this frame: re-attribute it to the caller.
            return registry.call_attributing_warnings(wrapped, *args, **kwargs)
        try:
            return wrapped(*args, **kwargs)
        except IndexError:
            return _after_index_error(instance, args, kwargs)
    if registry.nested(_NAME) or kwargs or len(args) != 1 or not registry.is_active(_NAME):
        return _torch_getitem(wrapped, instance, args, kwargs)
    if registry.compiling():  # a checked index syncs the host: not inside a graph
        return wrapped(*args, **kwargs)
    registry.record(_NAME, f"x[index] -> st.checked_index ({instance.device.type})")
    try:
        with registry.reentry(_NAME):
            return registry.call_attributing_warnings(_tensor.checked_index, instance, args[0])
    except IndexError:  # checked before the kernel: the legacy x[0] of a 0-dim tensor too
        return _after_index_error(instance, args, kwargs)


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


def _select_like(op: str, label: str, extra: Tuple[str, ...]) -> Any:
    def wrapper(wrapped: Any, instance: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
        x = instance if instance is not None else (args[0] if args else kwargs.get("input"))
        if not isinstance(x, _Tensor) or not _index_check_needed(x) or registry.nested(_NAME):
            return wrapped(*args, **kwargs)  # e.g. CPU kernels raise by themselves
        device = x.device
        if registry.compiling():
            return wrapped(*args, **kwargs)
        bound = _bind(instance, args, kwargs, extra)
        if bound is None:
            return wrapped(*args, **kwargs)
        x, dim, index, rest = bound
        registry.record(_NAME, f"{label} -> st.{op} ({device.type})")
        with registry.reentry(_NAME):
            return registry.call_attributing_warnings(getattr(_tensor, op), x, dim, index, **rest)

    return wrapper


GETITEM = registry.Target("torch", "Tensor.__getitem__", _getitem, attribute_warnings=False)


def _hand_over(to: str) -> None:
    """Leave the shared ``__getitem__`` wrapper in place, owned by patch ``to`` when it is on.

    Both ``index`` and ``legacy`` declare :data:`GETITEM`; the registry applies a wrapper
    once, so the second patch to turn on finds it installed and records nothing. When the
    owner turns off while the other is still on, its record moves to the other patch before
    the registry restores the owner's targets: the wrapper stays, and is restored exactly
    when the last of the two turns off.
    """
    mine = next((k for k in registry._applied if k[1:] == (GETITEM.module, GETITEM.path)), None)
    if mine is None or not registry.is_active(to):
        return
    registry._applied[(to, GETITEM.module, GETITEM.path)] = registry._applied.pop(mine)


PATCH = registry.declare(
    registry.Patch(
        name=_NAME,
        description=(
            "x[i], index_select, gather checked before the kernel where the device needs it "
            "(CUDA, ROCm, MPS, ...); CPU calls torch at once"
        ),
        targets=(
            GETITEM,
            *(
                registry.Target(
                    "torch", path, _select_like(op, label, extra), attribute_warnings=False
                )
                for path, op, label, extra in (
                    ("Tensor.index_select", "index_select", "x.index_select", ()),
                    ("Tensor.gather", "gather", "x.gather", ("sparse_grad",)),
                    ("index_select", "index_select", "torch.index_select", ()),
                    ("gather", "gather", "torch.gather", ("sparse_grad",)),
                )
            ),
        ),
        pitfalls=("cuda-index-assert",),
        implementation=("safetorch.tensor", "checked_index"),
        on_disable=lambda: _hand_over("legacy"),
    )
)
