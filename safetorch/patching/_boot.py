"""Start-up activation: ``import safetorch.patching._boot`` patches what ``SAFETORCH_PATCH`` names.

Imported by the .pth file ``safetorch install-hook`` writes (only when the variable is set)
and by processes that ``safetorch run`` spawns. It must never stop an interpreter from
starting: a bad value is reported on stderr and ignored.
"""

from __future__ import annotations

import atexit
import os
import sys

__all__: list = []


def _activate() -> None:
    names = os.environ.get("SAFETORCH_PATCH", "").strip()
    if not names or names.lower() in ("0", "off", "none", "false"):
        return
    try:
        # Imported here, inside the try, and only when the variable names patches: the .pth
        # hook imports this module at every start-up, and a broken install (no wrapt) must
        # not stop the interpreter. The patches go on when the program imports torch (now,
        # if it already has), so a process that never imports torch never pays for it.
        from safetorch.patching import _activation

        resolved = _activation.resolve_names(names.split(","), default_all=True)
        _activation.enable(resolved)
        if os.environ.get("SAFETORCH_REPORT") == "1":
            from safetorch.patching._runner import print_report

            atexit.register(print_report, resolved)
    except Exception as exc:  # never break interpreter start-up
        sys.stderr.write(f"safetorch: SAFETORCH_PATCH={names!r} ignored: {exc}\n")


_activate()
