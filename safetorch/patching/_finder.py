"""Post-import hooks: run a callback right after a module that someone waits for is imported.

A patch target whose module is not in ``sys.modules`` yet waits for its import. wrapt's
``when_imported`` hooks cannot be deregistered, so ``unpatch`` could not undo them; this
``sys.meta_path`` finder is ours and is present only while something waits. It asks the other
finders for the module's spec and wraps the loader, which puts the real loader back before the
module's code runs and calls ``imported(name)`` after it ran.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
from types import ModuleType
from typing import Any, Callable, List, Optional, Sequence

__all__: List[str] = []  # private: the public API is in safetorch.patching


class HookLoader(importlib.abc.Loader):
    """Delegates to the real loader, then reports the import to the finder's callback."""

    def __init__(self, loader: Any, fullname: str, imported: Callable[[str], None]) -> None:
        self._loader = loader
        self._fullname = fullname
        self._imported = imported

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Optional[ModuleType]:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        # Put the real loader back first: code in the module (and importlib.resources)
        # must see the loader it would have seen without us.
        module.__loader__ = self._loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        self._imported(self._fullname)


class PostImportFinder(importlib.abc.MetaPathFinder):
    """A ``sys.meta_path`` entry for the modules ``waiting(name)`` is true of.

    ``imported(name)`` is called after such a module's code ran. :meth:`install` and
    :meth:`remove` add and remove the entry (callers hold their own lock).
    """

    def __init__(self, waiting: Callable[[str], bool], imported: Callable[[str], None]) -> None:
        self._waiting = waiting
        self._imported = imported
        self._busy = threading.local()

    def find_spec(
        self, fullname: str, path: Optional[Sequence[str]], target: Optional[ModuleType] = None
    ) -> Optional[importlib.machinery.ModuleSpec]:
        if not self._waiting(fullname) or getattr(self._busy, "on", False):
            return None
        self._busy.on = True
        try:
            for finder in list(sys.meta_path):
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
            else:
                return None
        finally:
            self._busy.on = False
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec  # namespace package or legacy loader: nothing to attach to
        spec.loader = HookLoader(loader, fullname, self._imported)
        return spec

    def install(self) -> None:
        if self not in sys.meta_path:
            sys.meta_path.insert(0, self)

    def remove(self) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)

    @property
    def installed(self) -> bool:
        return self in sys.meta_path
