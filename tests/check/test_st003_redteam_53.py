"""Red team of ST003's st.load fix (stop 53): each hostile input in our own words, the fix
applied, and the fixed code run beside the original (the same file through both loaders)."""

from __future__ import annotations

import io
import runpy
import textwrap
from pathlib import Path
from typing import Dict, Iterator, List

import pytest
from _check_project import TORCH_LOAD_WARNS, fresh_project, write_project

from safetorch.check import fix_source
from safetorch.check.config import Settings
from safetorch.check.engine import Diagnostic
from safetorch.check.runner import check_file, check_paths

torch = pytest.importorskip("torch")


@pytest.fixture(autouse=True)
def _fresh_projects(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    yield from fresh_project(tmp_path, monkeypatch, ("helpers", "model"))


UNSET = Settings()  # no [tool.safetorch]: the code's oldest torch is unknown


def _st003(root: Path, name: str, settings: Settings = UNSET) -> List[Diagnostic]:
    return [
        d
        for r in check_paths([str(root)], ["ST003"], settings=settings)
        if r.path.endswith(name)
        for d in r.diagnostics
    ]


def _fixed(root: Path, name: str, settings: Settings = UNSET) -> str:
    result = check_file(
        str(root / name), select=["ST003"], fix=True, unsafe_fixes=True, settings=settings
    )
    return result.after or ""


def _run_fixed(root: Path, name: str, settings: Settings = UNSET) -> Dict[str, object]:
    after = _fixed(root, name, settings)
    assert after, "expected a fix"
    (root / f"fixed_{name}").write_text(after)
    return runpy.run_path(str(root / f"fixed_{name}"))


def test_a_torch_2_floor_with_a_device_in_the_checkpoint_gets_st_load(tmp_path: Path) -> None:
    write_project(
        tmp_path,
        {
            "train.py": """
                import torch

                net = torch.nn.Linear(2, 2)
                state = {"model": net.state_dict(), "device": torch.device("cpu"), "tags": {"a"}}
                torch.save(state, "ck.pt")
                ck = torch.load("ck.pt")
            """,
        },
    )
    after = _fixed(tmp_path, "train.py", Settings(min_torch=(2, 0)))
    assert 'st.load("ck.pt", map_location="available")' in after
    assert "weights_only=True" not in after
    assert _run_fixed(tmp_path, "train.py", Settings(min_torch=(2, 0)))["ck"]["tags"] == {"a"}


@pytest.mark.parametrize(
    "save",
    [
        'torch.save(state, "ck.pt", pickle, 4)',
        'torch.save(state, "ck.pt", **{"pickle_protocol": 4})',
        'functools.partial(torch.save, pickle_protocol=4)(state, "ck.pt")',
    ],
    ids=["positional", "double-star-literal", "partial"],
)
def test_a_protocol_passed_another_way_gets_st_load(tmp_path: Path, save: str) -> None:
    write_project(
        tmp_path,
        {
            "train.py": f"""
                import functools
                import pickle
                import torch

                net = torch.nn.Linear(2, 2)
                state = net.state_dict()
                {save}
            """,
            "evaluate.py": """
                import torch

                net = torch.nn.Linear(2, 2)
                net.load_state_dict(torch.load("ck.pt"))
            """,
        },
    )
    (finding,) = _st003(tmp_path, "evaluate.py")
    assert "pickle_protocol=4" in finding.message
    after = _fixed(tmp_path, "evaluate.py")
    assert "st.load(" in after and "weights_only=True" not in after
    saved = runpy.run_path(str(tmp_path / "train.py"))["net"]
    with pytest.raises(Exception, match="(?i)weights.only|unsupported"):
        torch.load(tmp_path / "ck.pt", weights_only=True)  # what weights_only=True would do
    loaded = _run_fixed(tmp_path, "evaluate.py")["net"]
    assert torch.equal(loaded.weight, saved.weight)


@TORCH_LOAD_WARNS
@pytest.mark.parametrize("protocol", [0, 1])
def test_protocol_0_or_1_gets_no_weights_only_fix(tmp_path: Path, protocol: int) -> None:
    # No weights-only load reads them (torch's nor st.load's): no fix, and the message says why.
    write_project(
        tmp_path,
        {
            "train.py": f"""
                import torch

                net = torch.nn.Linear(2, 2)
                state = {{"model": net.state_dict(), "epoch": 3}}
                torch.save(state, "ck.pt", pickle_protocol={protocol})
            """,
            "evaluate.py": """
                import torch

                ck = torch.load("ck.pt")
            """,
        },
    )
    (finding,) = _st003(tmp_path, "evaluate.py")
    assert finding.fix is None
    assert f"pickle_protocol={protocol}, which no weights-only load reads" in finding.message
    import safetorch as st

    runpy.run_path(str(tmp_path / "train.py"))
    for load in (lambda p: torch.load(p, weights_only=True), st.load):
        with pytest.raises(Exception, match="(?i)weights.only|unsupported|uses|refus"):
            load(tmp_path / "ck.pt")


def test_a_project_class_with_its_own_load_state_dict_is_not_a_module_load(
    tmp_path: Path,
) -> None:
    # An EMA helper's state holds a float: torch 1.13's weights-only unpickler refuses it.
    write_project(
        tmp_path,
        {
            "helpers.py": """
                class EMA:
                    def __init__(self):
                        self.decay = 0.99

                    def state_dict(self):
                        return {"decay": self.decay}

                    def load_state_dict(self, state):
                        self.decay = state["decay"]
            """,
            "train.py": """
                import torch
                from helpers import EMA

                ema = EMA()
                torch.save(ema.state_dict(), "ema.pt")
                ema.load_state_dict(torch.load("ema.pt"))
                decay = ema.decay
            """,
        },
    )
    (finding,) = _st003(tmp_path, "train.py")
    assert "its own load_state_dict (helpers.py:" in finding.message
    assert _run_fixed(tmp_path, "train.py")["decay"] == 0.99


def test_a_star_import_may_bind_st(tmp_path: Path) -> None:
    write_project(
        tmp_path,
        {
            "helpers.py": """
                class _Stats:
                    def report(self):
                        return "ok"

                st = _Stats()
            """,
            "train.py": """
                import torch
                from helpers import *

                torch.save({"w": torch.ones(2), "lr": 0.1}, "ck.pt")
                ck = torch.load("ck.pt")
                said = st.report()
            """,
        },
    )
    after = _fixed(tmp_path, "train.py")
    assert "import safetorch\n" in after and 'safetorch.load("ck.pt"' in after
    found = _run_fixed(tmp_path, "train.py")
    assert found["said"] == "ok" and found["ck"]["lr"] == 0.1


def test_the_import_goes_below_a_shebang_and_an_encoding_line() -> None:
    source = textwrap.dedent(
        """\
        #!/usr/bin/env python
        # -*- coding: latin-1 -*-
        if True:
            import torch
        torch.save({"w": torch.ones(2), "lr": 0.1}, "ck.pt")
        ck = torch.load("ck.pt")
        """
    )
    after = fix_source(source, select=["ST003"], unsafe_fixes=True)
    lines = after.splitlines()
    assert lines[:3] == [
        "#!/usr/bin/env python",
        "# -*- coding: latin-1 -*-",
        "import safetorch as st",
    ]
    compile(after.encode("latin-1"), "f.py", "exec")


@TORCH_LOAD_WARNS
def test_the_same_file_through_both_loaders_on_this_torch() -> None:
    # What the message says of protocols, side by side on the torch that runs the suite.
    import safetorch as st

    for protocol, torch_reads in ((2, True), (4, False)):
        buffer = io.BytesIO()
        torch.save({"w": torch.ones(2)}, buffer, pickle_protocol=protocol)
        assert torch.equal(st.load(io.BytesIO(buffer.getvalue()))["w"], torch.ones(2))
        if torch_reads:
            torch.load(io.BytesIO(buffer.getvalue()), weights_only=True)
        else:
            with pytest.raises(Exception, match="(?i)weights.only|unsupported"):
                torch.load(io.BytesIO(buffer.getvalue()), weights_only=True)


def test_a_partial_of_another_function_is_no_protocol(tmp_path: Path) -> None:
    # partial(step_lr, lr, gamma, step_size, ...) has a fourth positional argument, and
    # partial(torch.save, pickle_protocol=2) keeps the default: neither is a pickle protocol.
    write_project(
        tmp_path,
        {
            "train.py": """
                import functools
                import torch

                def step_lr(lr, gamma, step_size, epoch):
                    return lr * gamma ** (epoch // step_size)

                schedule = functools.partial(step_lr, 0.1, 0.5, 10)
                save = functools.partial(torch.save, pickle_protocol=2)
                net = torch.nn.Linear(2, 2)
                torch.save(net.state_dict(), "w.pt")
                net.load_state_dict(torch.load("w.pt"))
            """,
        },
    )
    (finding,) = _st003(tmp_path, "train.py")
    assert "pickle_protocol" not in finding.message
    assert 'torch.load("w.pt", weights_only=True)' in _fixed(tmp_path, "train.py")
