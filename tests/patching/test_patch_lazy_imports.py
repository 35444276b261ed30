"""Turning every patch on imports no implementation a program has not called yet (the
checkpoint loader, safetorch.nn, safetorch.data): ``safetorch run`` starts faster, and the
first patched call imports what it routes to and behaves as before."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from safetorch import _compat

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


# The index patch imports safetorch.tensor (its checks, and the custom ops that registering
# costs ~4 ms) on the first call it routes, not when it goes on: a CPU program never pays.
FIRST_CALL = """
import sys

import torch

print("tensor at start:", "safetorch.tensor" in sys.modules)
x = torch.arange(3)
try:
    x[torch.tensor([5])]  # the first indexing of the program: routed (the policy is forced)
except IndexError as exc:
    print("raised:", type(exc).__module__, type(exc).__name__)
print("tensor after:", "safetorch.tensor" in sys.modules)
from safetorch import _index_parse

print("originals:", _index_parse._getitem is torch.Tensor.__getitem__.__wrapped__)
"""

COMPILED_FIRST = """
import sys

import torch

import safetorch as st

x = torch.arange(10) * 10
first = torch.compile(lambda i: x[i] + 1, backend="eager", fullgraph=True)
print("compiled first:", first(torch.tensor([1, 2])).tolist())
try:
    x[torch.tensor([50])]
except IndexError as exc:
    print("eager raised:", type(exc).__name__)
{bind}
checked = torch.compile(lambda i: st.checked_index(x, i) * 2, backend="eager", fullgraph={full})
print("checked in a graph:", checked(torch.tensor([3])).tolist())
try:
    checked(torch.tensor([30]))
except IndexError as exc:
    print("graph raised:", type(exc).__name__)
"""


def _safetorch_run(script: str, tmp_path: Path) -> subprocess.CompletedProcess:
    (tmp_path / "script.py").write_text(script)
    env = {
        "PYTHONPATH": str(ROOT),
        "PATH": "/usr/bin:/bin",
        "OMP_NUM_THREADS": "1",
        "SAFETORCH_INDEX_CHECK": "always",  # CPU indexing routed, as on CUDA
    }
    proc = subprocess.run(
        [sys.executable, "-m", "safetorch", "run", "-v", "script.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def test_the_index_patch_checks_the_first_call_it_routes(tmp_path: Path) -> None:
    proc = _safetorch_run(FIRST_CALL, tmp_path)
    assert proc.stdout.splitlines() == [
        "tensor at start: False",  # lazy: not imported when the patch went on
        "raised: safetorch.errors IndexOutOfBoundsError",  # and yet the first call is checked
        "tensor after: True",
        "originals: True",  # the st function calls torch's original, not the wrapper
    ]
    assert "x[index] -> st.checked_index (cpu)" in proc.stderr
    assert "first at script.py:9" in proc.stderr


@pytest.mark.skipif(not _compat.HAS_COMPILE, reason="torch.compile needs torch 2.0")
def test_the_index_patch_imported_lazily_works_with_torch_compile(tmp_path: Path) -> None:
    # the first indexing happens in a compiled graph; the custom ops are registered when
    # safetorch.tensor is first imported, outside dynamo's tracing, and serve later graphs.
    # Without torch.library.custom_op (torch < 2.4) the check before the kernel runs at a graph
    # break, so the checked graph is not a full graph, and it raises all the same
    # (tests/core/test_core_compile.py, the same guard); dynamo 2.1 also reads `st.<name>` from
    # the module's __dict__ (variables/builtin.py call_getattr), where PEP 562 has not bound a
    # name before its first eager use, so the script uses it once eagerly, as that file does.
    if _compat.HAS_CUSTOM_OP:
        script = COMPILED_FIRST.format(bind="", full=True)
    else:
        script = COMPILED_FIRST.format(bind="st.checked_index  # bound (PEP 562)", full=False)
    proc = _safetorch_run(script, tmp_path)
    assert proc.stdout.splitlines() == [
        "compiled first: [11, 21]",
        "eager raised: IndexOutOfBoundsError",
        "checked in a graph: [60]",
        "graph raised: IndexOutOfBoundsError",
    ]
    assert "x[index] -> st.checked_index (cpu)" in proc.stderr


# A program's own torch.save / torch.load(weights_only=False) and a DataLoader that does not
# pin (super_resolution, issue 34) import only what they route to: the writer and the ledger,
# MapToAvailable; never st.load's scanner, reader and verifier, the key helpers or st.data.
SAVE_AND_FULL_LOAD = """
import sys

import torch
from torch.utils.data import DataLoader, TensorDataset

from safetorch.patching import _registry

_registry.enable(_registry.resolve_names([], default_all=True))


def loaded():
    return sorted(m for m in sys.modules if m.startswith(("safetorch.checkpoint", "safetorch.data")))


print(sum(len(b) for (b,) in DataLoader(TensorDataset(torch.ones(4, 1)), batch_size=2)), loaded())
torch.save(torch.nn.Linear(2, 2), "m.pt")  # a whole model: hashed into the ledger
print(loaded())
print(type(torch.load("m.pt", weights_only=False)).__name__, loaded())
print(type(torch.load("m.pt")).__name__, "safetorch.checkpoint.loading" in sys.modules)
"""


def test_save_and_full_load_import_only_what_they_use(tmp_path: Path) -> None:
    env_home = tmp_path / "state"
    code = f"import os; os.environ['XDG_STATE_HOME'] = {str(env_home)!r}\n" + SAVE_AND_FULL_LOAD
    out = _run(code, tmp_path).splitlines()
    writer = [
        "safetorch.checkpoint",
        "safetorch.checkpoint._common",
        "safetorch.checkpoint._formats",
        "safetorch.checkpoint._provenance",
        "safetorch.checkpoint._unpickler",
        "safetorch.checkpoint.saving",
    ]
    assert out[0] == "4 []"  # no pinning asked for: safetorch.data is not imported
    assert out[1] == str(writer)
    assert out[2] == f"Linear {writer}"  # a full load needs MapToAvailable only
    assert out[3] == "Linear True"  # trusted by provenance through st.load, which imports it


def test_the_checkpoint_helpers_moved_to_common_are_the_same_objects() -> None:
    from safetorch.checkpoint import _common, loading, saving

    assert loading.MapToAvailable is _common.MapToAvailable
    assert loading._torch_internals_quiet is _common._torch_internals_quiet
    assert loading._first_line is _common._first_line
    assert saving._torch_internals_quiet is _common._torch_internals_quiet
    import safetorch as st

    assert st.checkpoint.MapToAvailable is _common.MapToAvailable
