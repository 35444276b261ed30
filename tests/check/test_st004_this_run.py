"""ST004 (issue 33, stop 56): a path a function of the file saved to and returned was written
by this run, from its own devices; a script whose entry makes every tensor on CUDA has no CPU
path. Each quiet case sits beside the look-alike that stays reported; the idioms are written
here in our own words."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Iterator, List

import pytest

from safetorch.check import project
from safetorch.check.runner import check_paths


@pytest.fixture(autouse=True)
def _fresh_projects() -> Iterator[None]:
    project.clear()
    yield
    project.clear()


TRAIN = """
import torch

net = torch.nn.Linear(2, 2).cuda()
torch.save(net.state_dict(), "w.pt")
"""


def _lines(root: Path, script: str) -> List[int]:
    (root / "setup.py").write_text("")
    (root / "train.py").write_text(TRAIN)
    (root / "fit.py").write_text(textwrap.dedent(script).lstrip())
    return [
        d.line
        for r in check_paths([str(root)], ["ST004"])
        if r.path.endswith("fit.py")
        for d in r.diagnostics
    ]


_TRAINER = """
    import torch

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")


    class Trainer:
        def __init__(self, model):
            self.model = model.to(device)

        def _fit(self, epochs):
            best = None
            for epoch in range(epochs):
                best = f"ckpt/epoch{epoch}.pt"
                torch.save(self.model.state_dict(), best)
            return best

        def _last(self):
            torch.save(self.model.state_dict(), "ckpt/last.pt")
            return "ckpt/last.pt"

        def run(self):
            path = self._fit(3)
            self.model.load_state_dict(torch.load(path))
            other = self._last()
            self.model.load_state_dict(torch.load(other))
"""


def test_a_path_this_run_saved_to_and_returned_is_quiet(tmp_path: Path) -> None:
    # _fit saves to the name it returns; _last returns a literal it also saved to, but not
    # through a name: only the first is proven to be this run's file.
    lines = textwrap.dedent(_TRAINER).lstrip().splitlines()
    second = next(i for i, ln in enumerate(lines) if "torch.load(other)" in ln) + 1
    assert _lines(tmp_path, _TRAINER) == [second]


def test_the_same_load_of_a_path_from_elsewhere_is_reported(tmp_path: Path) -> None:
    script = _TRAINER.replace("path = self._fit(3)", "path = self.resume_path")
    lines = textwrap.dedent(script).lstrip().splitlines()
    first = next(i for i, ln in enumerate(lines) if "torch.load(path)" in ln) + 1
    assert first in _lines(tmp_path, script)


_ENTRY = """
    import torch

    def main():
        dev = "cuda" if torch.cuda.is_available() else "cpu"
        state = torch.load("w.pt")
        return dev, state

    if __name__ == "__main__":
        DEFAULT
        main()
"""


def test_a_script_whose_entry_makes_every_tensor_on_cuda_has_no_cpu_path(tmp_path: Path) -> None:
    script = _ENTRY.replace("DEFAULT", 'torch.set_default_tensor_type("torch.cuda.FloatTensor")')
    assert _lines(tmp_path, script) == []


def test_the_same_script_without_the_cuda_default_is_reported(tmp_path: Path) -> None:
    script = _ENTRY.replace("DEFAULT", "torch.manual_seed(0)")
    assert _lines(tmp_path, script) == [5]


def test_a_cuda_default_under_a_test_is_no_pin(tmp_path: Path) -> None:
    script = _ENTRY.replace(
        "DEFAULT",
        'if torch.cuda.is_available(): torch.set_default_tensor_type("torch.cuda.FloatTensor")',
    )
    assert _lines(tmp_path, script) == [5]
