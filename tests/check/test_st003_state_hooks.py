"""ST003's weights-only fix where a module's state dict may hold more than tensors (stop 55):
a class that registers a state-dict hook or loads its own state (torch2trt's ``TRTModule``
keeps its engine as a ``bytearray``, which the weights-only unpickler of torch 2.1 refuses),
or a project that imports such a package. The strict-``load_state_dict`` shortcut
("a strict module load takes tensors only") does not hold there, so the fix is ``st.load``,
which reads the file on every supported torch; the fixed code is run."""

from __future__ import annotations

import pickle
import runpy
from pathlib import Path
from typing import Iterator, List

import pytest
from _check_project import (
    TORCH_LOAD_WARNS,
    fixed_text,
    fresh_project,
    project_findings,
    write_project,
)

from safetorch.check.config import Settings
from safetorch.check.engine import Diagnostic

torch = pytest.importorskip("torch")

UNSET = Settings()

ENGINE = """
    import torch


    class EngineModule(torch.nn.Module):
        # Keeps a serialized engine (bytes) in its state dict, as torch2trt's TRTModule does.
        def __init__(self, engine=b""):
            super().__init__()
            self.engine = bytearray(engine)
            self._register_state_dict_hook(EngineModule._on_state_dict)

        def _on_state_dict(self, state_dict, prefix, local_metadata):
            state_dict[prefix + "engine"] = bytearray(self.engine)

        def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing,
                                  unexpected, errors):
            self.engine = state_dict[prefix + "engine"]
"""

DEMO = """
    import torch
    from engine import EngineModule

    torch.save(EngineModule(b"plan").state_dict(), "trt.pth")
    model = EngineModule()
    model.load_state_dict(torch.load("trt.pth"))
    engine = bytes(model.engine)
"""


@pytest.fixture(autouse=True)
def _fresh_projects(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    yield from fresh_project(tmp_path, monkeypatch, ("engine",))


def _st003(root: Path, name: str) -> List[Diagnostic]:
    return project_findings(root, "ST003", UNSET)[name]


def _fixed(root: Path, name: str) -> str:
    return fixed_text(root, name, "ST003", UNSET)


def test_a_module_with_a_state_dict_hook_gets_st_load_and_the_fixed_demo_runs(
    tmp_path: Path,
) -> None:
    write_project(tmp_path, {"engine.py": ENGINE, "demo.py": DEMO})
    (finding,) = _st003(tmp_path, "demo.py")
    assert "engine.py:" in finding.message
    after = _fixed(tmp_path, "demo.py")
    assert "st.load(" in after and "weights_only=True" not in after
    (tmp_path / "fixed_demo.py").write_text(after)
    assert runpy.run_path(str(tmp_path / "fixed_demo.py"))["engine"] == b"plan"


@TORCH_LOAD_WARNS
def test_st_load_reads_the_bytearray_state_dict_that_the_fix_now_loads(tmp_path: Path) -> None:
    # Side by side with the raw loader the fix used to add: st.load reads the engine on every
    # torch row; torch 2.1's weights-only unpickler refuses the bytearray (2.6+ read it).
    import safetorch as st

    write_project(tmp_path, {"engine.py": ENGINE})
    from engine import EngineModule

    path = tmp_path / "trt.pth"
    torch.save(EngineModule(b"plan").state_dict(), path)
    ours = st.load(path)
    assert ours["engine"] == bytearray(b"plan")
    try:
        raw = torch.load(path, weights_only=True)
    except pickle.UnpicklingError:  # torch 2.1.2 refuses it (checked); 2.6.0, 2.13.0 read it
        raw = None
    assert raw is None or raw["engine"] == ours["engine"]


@pytest.mark.parametrize(
    "engine",
    [
        "class M(torch.nn.Module):\n    def _load_from_state_dict(self, *a):\n        pass\n",
        "class M(torch.nn.Module):\n    def set_extra_state(self, s):\n        pass\n",
        "m = torch.nn.Linear(2, 2)\nm._register_state_dict_hook(lambda *a: None)\n",
        "m = torch.nn.Linear(2, 2)\nm.register_state_dict_pre_hook(lambda *a: None)\n",
        "m = torch.nn.Linear(2, 2)\nm.register_load_state_dict_post_hook(lambda *a: None)\n",
        "m = torch.nn.Linear(2, 2)\nm._register_load_state_dict_pre_hook(lambda *a: None)\n",
        "class M(torch.nn.Module):\n    if True:\n        def _load_from_state_dict(self, *a):\n"
        "            pass\n",
        "class M(torch.nn.Module):\n    async def set_extra_state(self, s):\n        pass\n",
        "from torch2trt import TRTModule\n",
        "import torch_tensorrt.fx\n",
    ],
)
def test_each_way_a_state_dict_takes_objects_voids_the_strict_module_shortcut(
    tmp_path: Path, engine: str
) -> None:
    write_project(
        tmp_path,
        {
            "engine.py": "import torch\n" + engine,
            "demo.py": """
                import torch

                model = torch.nn.Linear(2, 2)
                torch.save(model.state_dict(), "m.pth")
                model.load_state_dict(torch.load("m.pth"))
            """,
        },
    )
    (finding,) = _st003(tmp_path, "demo.py")
    assert "engine.py:" in finding.message
    assert "st.load(" in _fixed(tmp_path, "demo.py")


def test_a_plain_project_keeps_the_weights_only_fix(tmp_path: Path) -> None:
    # The control: no hook, no extra state, no torch2trt: the strict load takes tensors only.
    write_project(
        tmp_path,
        {
            "demo.py": """
                import torch

                model = torch.nn.Linear(2, 2)
                torch.save(model.state_dict(), "m.pth")
                model.load_state_dict(torch.load("m.pth"))
            """,
        },
    )
    (finding,) = _st003(tmp_path, "demo.py")
    after = _fixed(tmp_path, "demo.py")
    assert "weights_only=True" in after and "st.load(" not in after
