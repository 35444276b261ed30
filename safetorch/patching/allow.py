"""What patched loads allow: ``safetorch run --allow`` / ``SAFETORCH_ALLOW`` globals, and the
project trust root ``SAFETORCH_TRUST_ROOT`` (``safetorch run`` sets it to the script's
directory)."""

from __future__ import annotations

import os
import re
from typing import List, Optional, Tuple

__all__: List[str] = []  # private: the public API is in safetorch.patching

ALLOW_ENV = "SAFETORCH_ALLOW"
TRUST_ENV = "SAFETORCH_TRUST_ROOT"


def allowed_globals() -> Tuple[str, ...]:
    """Globals the ``load`` patch allows in weights-only loads: ``safetorch run --allow``.

    ``safetorch run --allow mypkg.Config`` (repeatable) and the environment variable
    ``SAFETORCH_ALLOW=mypkg.Config,other.Name`` (comma-separated; child processes inherit
    it) name ``"module.Name"`` globals that a checkpoint loaded through the patched
    ``torch.load`` may reference, as ``st.load(..., allow=[...])`` does for one call.

    Returns:
        The names, in order, without duplicates (empty when nothing is configured).
    """
    raw = os.environ.get(ALLOW_ENV, "")
    return tuple(dict.fromkeys(p.strip() for p in raw.split(",") if p.strip()))


def trust_root() -> Optional[str]:
    """The directory whose whole-model pickles patched loads rebuild (``st.load(trust_root=)``).

    ``safetorch run SCRIPT`` sets ``SAFETORCH_TRUST_ROOT`` to the script's real directory
    (``-m``: the working directory) unless it is already set; child processes inherit it. Set
    it yourself to widen the root (``SAFETORCH_TRUST_ROOT=$PWD``, the repository), or to an
    empty value to switch the rule off.

    Returns:
        The directory, or None when the variable is unset, empty or not a directory.
    """
    raw = os.environ.get(TRUST_ENV, "")
    return raw if raw and os.path.isdir(raw) else None


_GLOBAL_NAME = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)+$")


def parse_allow_list(values: List[str]) -> List[str]:
    """``--allow`` values (repeatable, comma-separated) as a list of ``MODULE.NAME`` globals.

    Raises:
        ValueError: a part is not a dotted global name; the message shows the expected form.

    >>> parse_allow_list(["mypkg.Config, other.Name", "x.Y"])
    ['mypkg.Config', 'other.Name', 'x.Y']
    """
    out: List[str] = []
    for value in values:
        for part in value.split(","):
            part = part.strip()
            if not part:
                continue
            if not _GLOBAL_NAME.match(part):
                raise ValueError(
                    f"--allow {part!r} is not a global name; expected MODULE.NAME such as "
                    "mypkg.config.TrainConfig (the name the refusal message lists)"
                )
            out.append(part)
    return out
