"""The ``Literal`` types of safetorch's modes and names, shared by the modules that take them.

A type checker then refuses ``CheckpointSaver(mode="maximum")`` or ``st.patch("nonexistent")``
before the code runs (the functions still validate at run time, with a message naming the
choices). A test checks each alias against the values its module accepts, so the two cannot
drift. Standard library only.
"""

from __future__ import annotations

import inspect
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


def unquoted(obj: F) -> F:
    """``obj`` with its signature's annotations evaluated, so that ``help()`` and
    ``inspect.signature`` show ``mode: Literal['min', 'max'] = 'min'`` rather than the string
    ``'SaverMode'`` that ``from __future__ import annotations`` leaves. A class gets its own
    ``__init__`` unquoted (what ``help(cls)`` and ``inspect.signature(cls)`` read). Each
    annotation is evaluated on its own, in the function's module: one that cannot be evaluated
    there (a name only a type checker sees, ``X | None`` before Python 3.10) stays a string and
    the others are still shown unquoted. Idempotent; ``safetorch.<name>`` applies it to every
    public function and class on first access.

    >>> @unquoted
    ... def f(mode: "SaverMode" = "min", n: "Undefined" = 0) -> "int": ...
    >>> str(inspect.signature(f))
    "(mode: Literal['min', 'max'] = 'min', n: 'Undefined' = 0) -> int"
    """
    func: Any = obj
    if inspect.isclass(obj):
        func = obj.__dict__.get("__init__")
    if not inspect.isfunction(func):  # a builtin, a C type, a class without its own __init__
        return obj
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError):
        return obj
    namespace: Dict[str, Any] = inspect.unwrap(func).__globals__

    def evaluate(annotation: Any) -> Any:
        for _ in range(2):  # `-> "'X'"`: a string annotation of a quoted name
            if not isinstance(annotation, str):
                break
            try:
                annotation = eval(annotation, namespace)  # noqa: S307 - our own, in our module
            except Exception:
                break
        return annotation

    target: Any = func  # a function takes a __signature__; the stubs do not say so
    target.__signature__ = signature.replace(
        parameters=[
            p.replace(annotation=evaluate(p.annotation)) for p in signature.parameters.values()
        ],
        return_annotation=evaluate(signature.return_annotation),
    )
    return obj
