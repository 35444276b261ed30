"""ST003's unsafe fix is offered only where the project shows what the file holds (issue 33,
stop 56; found on the corpus's thirteenth batch, where two fixes broke a load): not where a
class's own ``load_state_dict`` takes its dict (a trainer keeping a whole module in it: st.load
refuses that file as torch's weights-only load does), and not for a file of a fixed name that
no save of the project names (the only saves write a pattern: the file comes from elsewhere).
Each case sits beside its control; the idioms are written here in our own words."""

from __future__ import annotations

import pickle
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

AGENT = """
    import torch


    class Temperature(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.value = torch.nn.Parameter(torch.zeros(()))


    class Agent:
        def __init__(self):
            self.policy = torch.nn.Linear(2, 2)
            self.temperature = Temperature()

        def state_dict(self):
            return {"policy": self.policy.state_dict(), "temperature": self.temperature}

        def load_state_dict(self, state):
            self.policy.load_state_dict(state["policy"])
            self.temperature = state["temperature"]
"""

RESUME = """
    import torch
    from agent import Agent

    agent = Agent()
    torch.save(agent.state_dict(), "agent.pt")
    agent.load_state_dict(torch.load("agent.pt"))
    restored = float(agent.temperature.value)
"""


@pytest.fixture(autouse=True)
def _fresh_projects(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    yield from fresh_project(tmp_path, monkeypatch, ("agent",))


def _st003(root: Path, name: str) -> List[Diagnostic]:
    return project_findings(root, "ST003", UNSET)[name]


def _fixed(root: Path, name: str) -> str:
    return fixed_text(root, name, "ST003", UNSET)


@TORCH_LOAD_WARNS
def test_a_class_that_loads_its_own_dict_gets_no_fix_and_st_load_would_refuse_it(
    tmp_path: Path,
) -> None:
    import safetorch as st

    write_project(tmp_path, {"agent.py": AGENT, "resume.py": RESUME})
    (finding,) = _st003(tmp_path, "resume.py")
    assert finding.fix is None
    assert "own load_state_dict" in finding.message
    # Side by side: the file holds a whole module (a full load reads it back as one); both
    # weights-only loads refuse it, so an st.load fix would break the load.
    torch.save(
        {"policy": torch.nn.Linear(2, 2).state_dict(), "temperature": torch.nn.Identity()},
        tmp_path / "agent.pt",
    )
    full = torch.load(tmp_path / "agent.pt", weights_only=False)
    assert isinstance(full["temperature"], torch.nn.Module)
    with pytest.raises(st.UnsafeCheckpointError, match="Identity"):
        st.load(tmp_path / "agent.pt")
    with pytest.raises(pickle.UnpicklingError):
        torch.load(tmp_path / "agent.pt", weights_only=True)


def test_a_plain_module_project_keeps_its_fix(tmp_path: Path) -> None:
    write_project(
        tmp_path,
        {
            "resume.py": """
                import torch

                net = torch.nn.Linear(2, 2)
                torch.save(net.state_dict(), "net.pt")
                net.load_state_dict(torch.load("net.pt"))
            """
        },
    )
    (finding,) = _st003(tmp_path, "resume.py")
    assert finding.fix is not None


LOGGER = """
    import os
    import torch


    def save_checkpoint(model, folder, epoch):
        name = "{:03d}.pth".format(epoch)
        torch.save(model.state_dict(), os.path.join(folder, name))
"""


def test_a_file_of_a_fixed_name_no_save_names_gets_no_fix(tmp_path: Path) -> None:
    write_project(
        tmp_path,
        {
            "logger.py": LOGGER,
            "demo.py": """
                import torch

                net = torch.load("weights/released_best.pth").to("cpu")
            """,
        },
    )
    (finding,) = _st003(tmp_path, "demo.py")
    assert finding.fix is None
    assert "no save of the project names released_best.pth" in finding.message
    assert "st.load" not in _fixed(tmp_path, "demo.py")


def test_a_helper_that_writes_the_path_it_is_given_still_names_any_file(tmp_path: Path) -> None:
    write_project(
        tmp_path,
        {
            "logger.py": """
                import torch


                def save_checkpoint(state, path):
                    torch.save(state, path)
            """,
            "demo.py": """
                import torch
                from logger import save_checkpoint

                net = torch.nn.Linear(2, 2)
                save_checkpoint(net.state_dict(), "weights/released_best.pth")
                state = torch.load("weights/released_best.pth")
            """,
        },
    )
    (finding,) = _st003(tmp_path, "demo.py")
    assert finding.fix is not None


@TORCH_LOAD_WARNS
@pytest.mark.parametrize(
    "use", ["torch.load(path).state_dict()", "torch.load(path).to('cpu').eval()"]
)
def test_a_module_method_on_the_loaded_object_itself_gets_no_fix(tmp_path: Path, use: str) -> None:
    # Found at stop 57 (the fourteenth batch): ``torch.load(path).state_dict()`` in a model's
    # weight-import helper; weights_only=True refused the whole pickled module it reads.
    write_project(
        tmp_path,
        {
            "net.py": f"""
                import torch


                def import_weights(model, path):
                    return {use}
            """
        },
    )
    (finding,) = _st003(tmp_path, "net.py")
    assert finding.fix is None
    assert "whole module" in finding.message
    # Side by side: the file such code reads is a whole module; a full load reads it, both
    # weights-only loads refuse it, so the fix would have broken the load.
    import safetorch as st

    torch.save(torch.nn.Linear(2, 2), tmp_path / "whole.pt")
    assert isinstance(torch.load(tmp_path / "whole.pt", weights_only=False), torch.nn.Module)
    with pytest.raises(pickle.UnpicklingError):
        torch.load(tmp_path / "whole.pt", weights_only=True)
    with pytest.raises(st.UnsafeCheckpointError, match="Linear"):
        st.load(tmp_path / "whole.pt")


def test_a_module_method_on_a_different_load_keeps_the_fix(tmp_path: Path) -> None:
    write_project(
        tmp_path,
        {
            "net.py": """
                import torch


                def import_weights(model, path, other):
                    model.load_state_dict(torch.load(path))
                    return torch.load(other).state_dict()
            """
        },
    )
    first, second = sorted(_st003(tmp_path, "net.py"), key=lambda d: d.line)
    assert first.fix is not None and second.fix is None
