"""What patched loads allow: ``safetorch run --allow`` / ``SAFETORCH_ALLOW`` globals (data
classes only: the allow-list never admits a callable that can run code)."""

from __future__ import annotations

import os
import re
from typing import List, Tuple

__all__: List[str] = []  # private: the public API is in safetorch.patching

ALLOW_ENV = "SAFETORCH_ALLOW"


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
