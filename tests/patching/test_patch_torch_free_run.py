"""``safetorch run`` turns patches on when the program imports torch, not before: a script
that never imports torch (a data generator of a pipeline) starts as it does under ``python``,
and one that does gets every patch before its ``import`` statement returns (issue 34: the
start-up cost of ``run`` on such a script was 1.48x ``python``)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Dict, List

ROOT = Path(__file__).resolve().parents[2]


def _env(**extra: str) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAFETORCH_")}
    env.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", **extra)
    return env


def _run(args: List[str], tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env=_env(**env),
    )


def _script(tmp_path: Path, code: str) -> str:
    path = tmp_path / "script.py"
    path.write_text(textwrap.dedent(code))
    return str(path)


def test_a_script_that_never_imports_torch_runs_without_it(tmp_path: Path) -> None:
    script = _script(
        tmp_path,
        """
        import json, sys
        print(json.dumps(sorted(m for m in ("torch", "safetorch.patching._registry")
                                if m in sys.modules)))
        """,
    )
    proc = _run(["-m", "safetorch", "run", "-v", script], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
    # the report says why nothing changed, and did not import torch to say it
    assert "the program never imported torch: nothing was patched" in proc.stderr
    assert "upsample    no call changed" in proc.stderr


def test_patches_are_on_before_the_import_statement_returns(tmp_path: Path) -> None:
    script = _script(
        tmp_path,
        """
        import sys
        assert "torch" not in sys.modules
        from torch.nn.functional import upsample  # bound at import: must be the wrapper
        import torch
        print(hasattr(upsample, "__wrapped__"), hasattr(torch.load, "__wrapped__"),
              hasattr(torch.Tensor.__getitem__, "__wrapped__"))
        y = upsample(torch.ones(1, 1, 2, 2), scale_factor=2)
        print(tuple(y.shape))
        """,
    )
    proc = _run(["-m", "safetorch", "run", script], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[:2] == ["True True True", "(1, 1, 4, 4)"]
    assert "1 x F.upsample -> st.upsample" in proc.stderr  # counted in the report


def test_plain_python_sees_torch_unpatched_in_the_same_script(tmp_path: Path) -> None:
    # side by side: the check above can fail (plain python binds torch's own function)
    script = _script(
        tmp_path,
        """
        from torch.nn.functional import upsample
        print(hasattr(upsample, "__wrapped__"))
        """,
    )
    proc = _run([script], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"


def test_a_bad_patch_name_is_refused_before_anything_runs(tmp_path: Path) -> None:
    script = _script(tmp_path, "print('ran')\n")
    proc = _run(["-m", "safetorch", "run", "--patch", "upsampel", script], tmp_path)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert "unknown patch 'upsampel'; expected one of upsample, load," in proc.stderr


def test_the_startup_hook_defers_too(tmp_path: Path) -> None:
    # the .pth hook and spawned children import _boot with SAFETORCH_PATCH set
    code = textwrap.dedent(
        """
        import sys
        import safetorch.patching._boot
        print("torch" in sys.modules)
        import torch
        print(hasattr(torch.load, "__wrapped__"), hasattr(torch.nn.functional.upsample, "__wrapped__"))
        """
    )
    proc = _run(["-c", code], tmp_path, SAFETORCH_PATCH="load")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", "True", "False"]


def test_declaration_order_does_not_depend_on_which_module_is_imported_first(
    tmp_path: Path,
) -> None:
    code = textwrap.dedent(
        """
        import safetorch.patching._index  # a declaration first: it imports the registry
        from safetorch.patching import _activation, _legacy, _registry
        print([p.name for p in _registry.declared()] == list(_activation.ORDER))
        print(_activation.OPT_IN == (_legacy.PATCH.name,))  # the one opt-in patch is legacy
        """
    )
    proc = _run(["-c", code], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["True", "True"]
