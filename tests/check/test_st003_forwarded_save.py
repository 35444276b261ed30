"""ST003 follows a save wrapper that forwards ``*args`` to ``torch.save`` (DeiT/DETR's
``save_on_master``): ``weights_only=True`` is offered only when what its callers pass holds
weights, because torch refuses the file otherwise (shown side by side below)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Iterator

import pytest
from _check_project import fresh_project, project_findings, write_project

from safetorch.check.runner import check_file

torch = pytest.importorskip("torch")


@pytest.fixture(autouse=True)
def _fresh_projects(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    yield from fresh_project(tmp_path, monkeypatch, ("helpers",))


HELPERS = """
    import torch

    def save_on_master(*args, **kwargs):
        if True:  # the main process only, in the real thing
            torch.save(*args, **kwargs)
"""

TRAIN = """
    import argparse
    import torch
    import helpers

    def main(args):
        model = torch.nn.Linear(2, 2)
        helpers.save_on_master({{"model": model.state_dict(){extra}}}, "checkpoint.pth")
        torch.save(model.state_dict(), "weights.pth")  # weights only: not the only writer
        if args.resume:
            checkpoint = torch.load(args.resume, map_location="cpu")
            model.load_state_dict(checkpoint["model"])

    if __name__ == "__main__":
        parser = argparse.ArgumentParser()
        parser.add_argument("--resume", default="")
        main(parser.parse_args())
"""


def _fix_offered(root: Path) -> bool:
    (finding,) = project_findings(root, "ST003")["train.py"]
    return finding.fix is not None


def test_no_weights_only_fix_where_a_caller_saves_the_namespace(tmp_path: Path) -> None:
    write_project(
        tmp_path, {"helpers.py": HELPERS, "train.py": TRAIN.format(extra=', "args": args')}
    )
    assert not _fix_offered(tmp_path)
    # why: torch itself refuses such a file with weights_only=True
    torch.save({"model": {}, "args": argparse.Namespace(lr=0.1)}, tmp_path / "ns.pth")
    with pytest.raises(Exception, match="(?i)weights.only|unpickl|global"):
        torch.load(tmp_path / "ns.pth", weights_only=True)


def test_weights_only_fix_where_every_caller_saves_weights(tmp_path: Path) -> None:
    write_project(tmp_path, {"helpers.py": HELPERS, "train.py": TRAIN.format(extra=', "epoch": 3')})
    assert _fix_offered(tmp_path)
    result = check_file(str(tmp_path / "train.py"), select=["ST003"], fix=True, unsafe_fixes=True)
    assert result.after is not None and "weights_only=True" in result.after


def test_no_fix_where_the_wrapper_is_never_called(tmp_path: Path) -> None:
    train = TRAIN.format(extra="").replace("helpers.save_on_master", "print")
    write_project(tmp_path, {"helpers.py": HELPERS, "train.py": train})
    assert not _fix_offered(tmp_path)


def test_no_fix_where_starred_values_are_not_the_functions_own(tmp_path: Path) -> None:
    helpers = """
        import torch

        PAIR = ({"step": 1}, "checkpoint.pth")

        def save_pair():
            torch.save(*PAIR)
    """
    train = TRAIN.format(extra="").replace("helpers.save_on_master", "print")
    write_project(tmp_path, {"helpers.py": helpers, "train.py": train})
    assert not _fix_offered(tmp_path)
