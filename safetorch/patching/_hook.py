"""``safetorch install-hook`` / ``uninstall-hook``: opt-in activation through the environment.

The hook is one ``.pth`` file in site-packages. ``site`` executes its single ``import`` line
at every interpreter start; the line does nothing unless ``SAFETORCH_PATCH`` is set, and then
imports :mod:`safetorch.patching._boot`, which patches what the variable names
(``SAFETORCH_PATCH=all python train.py``). ``SAFETORCH_REPORT=1`` adds the report at exit.
"""

from __future__ import annotations

import os
import sysconfig
from typing import List, Optional

from safetorch._atomic import atomic_write_text

__all__: List[str] = []

PTH_NAME = "safetorch-patch.pth"
PTH_LINE = (
    "import os, importlib.util; "
    "os.environ.get('SAFETORCH_PATCH') and importlib.util.find_spec('safetorch') "
    "and __import__('safetorch.patching._boot')\n"
)


def default_dir() -> str:
    """site-packages of the running interpreter (the venv's, inside a venv)."""
    return sysconfig.get_paths()["purelib"]


def install(directory: Optional[str] = None) -> str:
    """Write the .pth file (atomically, as every safetorch file; idempotent). Returns its path."""
    path = os.path.join(directory or default_dir(), PTH_NAME)
    atomic_write_text(path, PTH_LINE)
    return path


def uninstall(directory: Optional[str] = None) -> Optional[str]:
    """Remove the .pth file. Returns its path, or None if it was not installed."""
    path = os.path.join(directory or default_dir(), PTH_NAME)
    try:
        os.remove(path)
    except FileNotFoundError:
        return None
    return path
