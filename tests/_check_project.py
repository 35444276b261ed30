"""A tiny project in a temporary directory, checked as ``safetorch check DIR`` checks one: the
shared helpers of the cross-file tests in tests/check (issue 34), and :func:`run_fixed`, which
runs what a rule's fix made of a snippet."""

from __future__ import annotations

import sys
import textwrap
import warnings
from pathlib import Path
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence

import pytest

from safetorch.check import fix_source, project
from safetorch.check.config import Settings
from safetorch.check.engine import Diagnostic
from safetorch.check.runner import check_file, check_paths

# A test that runs fixed code calling torch.load(..., weights_only=True) carries this mark:
# torch 2.0/2.1's own weights-only unpickler reads TypedStorage.dtype and warns (st.load hides
# it; tests/checkpoint/test_load.py's ``torch_load_warns`` is the same mark for its tests).
TORCH_LOAD_WARNS = pytest.mark.filterwarnings("ignore:TypedStorage is deprecated:UserWarning")


def run_fixed(source: str, select: Sequence[str]) -> Dict[str, Any]:
    """The globals of ``source`` after the unsafe fixes of ``select``, run with plain torch
    (asserts that some fix was made)."""
    after = fix_source(source, select=list(select), unsafe_fixes=True)
    assert after != source, "expected a fix"
    namespace: Dict[str, Any] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exec(compile(after, "<fixed>", "exec"), namespace)
    return namespace


def write_project(root: Path, files: Dict[str, str]) -> None:
    """``files`` (relative path -> text, dedented) under ``root``, with ``setup.py`` marking
    the root."""
    (root / "setup.py").write_text("")
    for name, text in files.items():
        target = root / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(textwrap.dedent(text).lstrip())


def project_findings(
    root: Path, code: str, settings: Optional[Settings] = None
) -> Dict[str, List[Diagnostic]]:
    """relative path -> the findings of rule ``code`` in that file of the project."""
    found: Dict[str, List[Diagnostic]] = {}
    for result in check_paths([str(root)], [code], settings=settings):
        rel = Path(result.path).relative_to(root).as_posix()
        found[rel] = [d for d in result.diagnostics if d.code == code]
    return found


def fixed_text(root: Path, name: str, code: str, settings: Optional[Settings] = None) -> str:
    """What ``--fix --unsafe-fixes --select code`` makes of the project file ``name`` ("" when
    nothing is fixed)."""
    result = check_file(
        str(root / name), select=[code], fix=True, unsafe_fixes=True, settings=settings
    )
    return result.after or ""


def fresh_project(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, modules: Iterable[str]
) -> Iterator[None]:
    """Run from the project's root with it importable, ``modules`` not yet imported, and no
    project remembered from another test (the body of an autouse fixture)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in modules:
        monkeypatch.delitem(sys.modules, name, raising=False)
    project.clear()
    yield
    project.clear()
    for name in modules:  # what the test imported from its project (monkeypatch restores
        sys.modules.pop(name, None)  # what was there before)


def timed_call_lines(root: Path, nets: str, cls: str) -> List[int]:
    """ST006's lines in a project whose ``bench.py`` times one call of ``cls`` (defined in
    ``nets.py``, text ``nets``) moved to CUDA, with nothing else in the interval: line 11 is
    the end reading."""
    project.clear()
    (root / "setup.py").write_text("")
    (root / "nets.py").write_text(nets)
    (root / "bench.py").write_text(
        f"import time\nimport torch\nfrom nets import {cls}\n\nnet = {cls}().cuda()\n\n\n"
        "def bench(x):\n    t0 = time.time()\n    y = net(x)\n    return time.time() - t0\n"
    )
    found = [
        d.line
        for r in check_paths([str(root)], ["ST006"])
        if r.path.endswith("bench.py")
        for d in r.diagnostics
    ]
    project.clear()
    return found
