"""The ``Literal`` types of safetorch's modes and names, shared by the modules that take them.

A type checker then refuses ``CheckpointSaver(mode="maximum")`` or ``st.patch("nonexistent")``
before the code runs (the functions still validate at run time, with a message naming the
choices). A test checks each alias against the values its module accepts, so the two cannot
drift. Standard library only.
"""

from __future__ import annotations

import inspect
import typing
from typing import Any, Callable, Dict, Literal, TypeVar

__all__ = [
    "IndexCheckMode",
    "PatchName",
    "SaverMode",
    "SyncBNPolicy",
    "UpsampleMode",
    "unquoted",
]

#: ``CheckpointSaver(mode=...)``: lower metric is better (``"min"``, a loss) or higher (``"max"``).
SaverMode = Literal["min", "max"]

#: ``st.set_index_check(mode)``: where index bounds are checked before an indexing kernel.
IndexCheckMode = Literal["auto", "always", "never"]

#: ``st.convert_sync_batchnorm(policy=...)``.
SyncBNPolicy = Literal["auto", "torch", "portable"]

#: ``st.upsample(mode=...)``: the modes of ``F.interpolate``.
UpsampleMode = Literal[
    "nearest", "linear", "bilinear", "bicubic", "trilinear", "area", "nearest-exact"
]

#: ``st.patch(*names)`` / ``st.unpatch`` / ``st.patched``: a patch family, or ``"all"``.
PatchName = Literal[
    "all", "upsample", "load", "state_dict", "index", "pin_memory", "syncbn", "legacy"
]

F = TypeVar("F", bound=Callable[..., Any])


def unquoted(func: F) -> F:
    """``func`` with its signature's annotations evaluated, so that ``help()`` and
    ``inspect.signature`` show ``mode: Literal['min', 'max'] = 'min'`` rather than the string
    ``'SaverMode'`` that ``from __future__ import annotations`` leaves. Evaluated once, at
    definition; an annotation that cannot be evaluated there stays a string.

    >>> @unquoted
    ... def f(mode: "SaverMode" = "min") -> "int": ...
    >>> str(inspect.signature(f))
    "(mode: Literal['min', 'max'] = 'min') -> int"
    """
    try:
        hints: Dict[str, Any] = typing.get_type_hints(func)
    except Exception:  # a name only a type checker sees (TYPE_CHECKING): leave them as they are
        return func
    hints = {k: None if v is type(None) else v for k, v in hints.items()}  # `-> None`, as written
    signature = inspect.signature(func)
    parameters = [
        p.replace(annotation=hints.get(name, p.annotation))
        for name, p in signature.parameters.items()
    ]
    func.__signature__ = signature.replace(  # type: ignore[attr-defined]  # read by inspect
        parameters=parameters,
        return_annotation=hints.get("return", signature.return_annotation),
    )
    return func
