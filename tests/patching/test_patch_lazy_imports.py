"""Turning every patch on imports no implementation a program has not called yet (the
checkpoint loader, safetorch.nn, safetorch.data): ``safetorch run`` starts faster, and the
first patched call imports what it routes to and behaves as before."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

HEAVY = ("safetorch.checkpoint", "safetorch.nn", "safetorch.data")


def _run(code: str, tmp_path: Path) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_every_patch_on_imports_no_implementation_yet(tmp_path: Path) -> None:
    out = _run(
        f"""
        import sys, warnings
        import torch
        import torch.nn.functional as F
        from safetorch.patching import _registry
        on = _registry.enable(_registry.resolve_names([], default_all=True))
        print(sorted(on))
        print([m for m in {HEAVY!r} if m in sys.modules])
        # the first patched calls import what they route to, and route as before
        torch.save({{"w": torch.ones(2)}}, "w.pt")
        print(type(torch.load("w.pt")).__name__, "safetorch.checkpoint" in sys.modules)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # the patched F.upsample warns no deprecation
            y = F.upsample(torch.ones(1, 1, 2, 2), scale_factor=2)
        print(tuple(y.shape), "safetorch.nn.upsampling" in sys.modules)
        """,
        tmp_path,
    )
    names, before, load, upsample = out.splitlines()
    assert "load" in names and "upsample" in names and "syncbn" in names
    assert before == "[]"
    assert load == "dict True"
    assert upsample == "(1, 1, 4, 4) True"


def test_a_patch_whose_imported_module_lacks_its_function_is_still_refused(
    tmp_path: Path,
) -> None:
    # the cheap check reads the facade's table; a module already imported must have the name
    out = _run(
        """
        import safetorch as st, safetorch.nn
        del safetorch.nn.convert_sync_batchnorm
        info = [p for p in st.patches() if p.name == "syncbn"][0]
        print(info.available)
        """,
        tmp_path,
    )
    assert out.strip() == "False"
