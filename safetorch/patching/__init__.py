"""Monkeypatch mode: route legacy torch entry points to safetorch's implementations.

``st.patch()`` wraps torch's entry points (``F.upsample``, ``torch.load``,
``Module.load_state_dict``, ``Tensor.__getitem__``, DataLoader pinning,
``SyncBatchNorm.convert_sync_batchnorm``) so that legacy code runs the same safe function a
user would call directly (``st.upsample``, ``st.load``, ...). Nothing is patched on import.
Each patch is a short declaration in this package; :mod:`safetorch.patching._registry` holds
the mechanism. What a patch does, the functions it routes to and the pitfalls it routes are
read from its rows of the pitfall table (``safetorch._pitfalls``).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator, List, Tuple

from safetorch._types import PatchName, unquoted
from safetorch.patching._activation import OPT_IN

if TYPE_CHECKING:
    from types import ModuleType

__all__ = ["patch", "unpatch", "patched", "patches"]

# Named or "all" only: no-name st.patch()/st.patched() leave these off (safetorch run turns
# them on). `legacy` changes what legacy code computes, so a library user asks for it.
_OPT_IN = frozenset(OPT_IN)


def _reg() -> "ModuleType":
    """The patch registry, every patch declared (imports torch: this package itself does not,
    so that ``safetorch run`` starts a program that never imports torch without it)."""
    from safetorch.patching import _registry as registry

    return registry


def _default_names(names: Tuple[PatchName, ...]) -> List[str]:
    """What ``names`` resolve to, where no name means every patch but the opt-in ones."""
    if any(names):
        return _reg().resolve_names(names, default_all=True)
    return [n for n in _reg().resolve_names((), default_all=True) if n not in _OPT_IN]


@unquoted
def patch(*names: PatchName) -> List[str]:
    """Turn patches on: route legacy torch entry points to safetorch's implementations.

    Idempotent (a patch already on stays wrapped once) and thread-safe. Targets in modules
    that are not imported yet are wrapped when they are imported.

    Args:
        *names: Patch names (see :func:`patches`), comma-separated strings allowed;
            ``"all"`` means every patch; no name at all means every patch but ``legacy``
            (which changes what legacy code computes: name it, or use ``"all"``).

    Returns:
        The names this call turned on (those already on are not listed).

    Raises:
        ValueError: An unknown name.
        NotImplementedError: The safetorch implementation a patch routes to is missing.

    >>> import torch.nn.functional as F, safetorch as st
    >>> st.patch("upsample")
    ['upsample']
    >>> F.upsample.__wrapped__ is not F.upsample
    True
    >>> st.unpatch("upsample")
    ['upsample']
    """
    return _reg().enable(_default_names(names))


@unquoted
def unpatch(*names: PatchName) -> List[str]:
    """Turn patches off and restore every touched attribute exactly.

    After it, each patched attribute ``is`` torch's original object again and attributes
    that were inherited (``Tensor.__getitem__``) are deleted, so ``vars()`` of every touched
    module and class equals its state before :func:`patch`. A patch that an open
    :func:`patched` context holds (in this or another thread) stays on until that context
    exits.

    Args:
        *names: Patch names; ``"all"`` or no name at all means every patch.

    Returns:
        The names this call turned off (not those still held by a context).

    Raises:
        ValueError: An unknown name.

    >>> import torch, safetorch as st
    >>> original = torch.load
    >>> _ = st.patch("load"); _ = st.unpatch("load")
    >>> torch.load is original
    True
    """
    return _reg().disable(_reg().resolve_names(names, default_all=True))


@contextlib.contextmanager
@unquoted
def patched(*names: PatchName) -> Iterator[None]:
    """Context manager: patches on inside the block, back to their previous state after.

    Contexts nest and may be used from several threads at once: a patch stays on while any
    context (or an explicit :func:`patch`) holds it.

    Args:
        *names: Patch names; ``"all"`` means every patch, no name every patch but
            ``legacy``.

    Raises:
        ValueError: An unknown name.
        NotImplementedError: The safetorch implementation a patch routes to is missing.

    >>> import torch, torch.nn.functional as F, safetorch as st
    >>> with st.patched("upsample"):
    ...     F.upsample_bilinear(torch.ones(1, 1, 2, 2), scale_factor=2).shape
    torch.Size([1, 1, 4, 4])
    >>> hasattr(F.upsample_bilinear, "__wrapped__")
    False
    """
    resolved = _default_names(names)
    _reg().hold(resolved)
    try:
        yield
    finally:
        _reg().release(resolved)


@dataclass(frozen=True)
class PatchInfo:
    """One patch as :func:`patches` lists it.

    Attributes:
        name: The name to pass to :func:`patch`.
        targets: Dotted paths of the torch attributes it wraps.
        description: What it is for: its pitfall-table rows' titles and functions.
        implementation: The public safetorch functions it routes to: its rows' functions
            (``st.<name>``, comma-separated).
        pitfalls: Ids of the pitfall-table rows it routes (``safetorch._pitfalls``).
        active: Whether it is on now.
        available: Whether its safetorch implementation exists in this build.

    >>> import safetorch as st
    >>> info = st.patches()[0]
    >>> info.name, info.active
    ('upsample', False)
    """

    name: str
    targets: Tuple[str, ...]
    description: str
    implementation: str
    active: bool
    available: bool
    pitfalls: Tuple[str, ...] = ()

    def __str__(self) -> str:
        state = "on" if self.active else ("off" if self.available else "unavailable")
        return (
            f"{self.name} [{state}]: {self.description} ({', '.join(self.targets)}; "
            f"pitfalls: {', '.join(self.pitfalls)})"
        )


def patches() -> List[PatchInfo]:
    """List every patch: name, targets, what it does, the function it routes to, on/off.

    Returns:
        One :class:`PatchInfo` per patch, in the order ``"all"`` applies them.

    >>> import safetorch as st
    >>> [p.name for p in st.patches()]
    ['upsample', 'load', 'state_dict', 'index', 'pin_memory', 'syncbn', 'legacy']
    """
    return [
        PatchInfo(
            name=p.name,
            targets=tuple(t.qualname for t in p.targets),
            description=p.description,
            implementation=", ".join(p.functions),
            active=_reg().is_active(p.name),
            available=p.available(),
            pitfalls=p.pitfalls,
        )
        for p in _reg().declared()
    ]
