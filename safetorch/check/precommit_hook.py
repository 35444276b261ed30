#!/usr/bin/env python3
"""The pre-commit hook's entry point (``language: script``): ``safetorch check`` from the hook
repository itself, without installing safetorch or torch.

pre-commit runs a ``script`` hook with the system ``python3`` straight from its clone of the
hook repository, with no virtual environment and nothing installed. The checker is standard
library only, so this script puts the clone on ``sys.path`` and runs it: no torch download,
no build step. (A ``language: python`` hook would ``pip install`` the repository and with it
torch, a dependency of the library.)
"""

import os
import sys


def main() -> int:
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))  # <clone>/safetorch/check -> <clone>
    # sys.path[0] is this script's directory; its modules must not shadow anything.
    sys.path[0] = root
    from safetorch._cli import main as cli_main

    return cli_main(["check", *sys.argv[1:]])


if __name__ == "__main__":
    raise SystemExit(main())
