"""ST004 (stop 55): a CUDA switch that cannot be off is no CPU path, and a save whose tensors
are moved to the CPU in the same expression holds CPU tensors; each quiet case beside the
look-alike that stays reported (red team: a switch the file rebinds is no pin)."""

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
    from model import Net

    net = Net().cuda()
    torch.save({"model": net.state_dict()}, "runs/last.pth")
"""


def _lines(root: Path, demo: str, train: str = TRAIN) -> List[int]:
    (root / "setup.py").write_text("")
    (root / "train.py").write_text(textwrap.dedent(train).lstrip())
    (root / "demo.py").write_text(textwrap.dedent(demo).lstrip())
    return [
        d.line
        for r in check_paths([str(root)], ["ST004"])
        if r.path.endswith("demo.py")
        for d in r.diagnostics
    ]


QUIET = {
    "--cuda-cannot-be-off": """
        import argparse, torch
        parser = argparse.ArgumentParser()
        parser.add_argument("--cuda", action="store_true", default=True)
        args = parser.parse_args()
        if args.cuda:
            torch.ones(1).cuda()
        state = torch.load("runs/last.pth")
    """,
    "use_cuda-hard-coded": """
        import torch
        use_cuda = True
        if use_cuda:
            torch.ones(1).cuda()
        state = torch.load("runs/last.pth")
    """,
}

REPORTED = {
    "--cuda-off-by-default": """
        import argparse, torch
        parser = argparse.ArgumentParser()
        parser.add_argument("--cuda", action="store_true")
        args = parser.parse_args()
        state = torch.load("runs/last.pth")
    """,
    "--cuda-reassigned": """
        import argparse, torch
        parser = argparse.ArgumentParser()
        parser.add_argument("--cuda", action="store_true", default=True)
        args = parser.parse_args()
        args.cuda = torch.cuda.device_count() > 0
        if args.cuda:
            torch.ones(1).cuda()
        state = torch.load("runs/last.pth")
    """,
    "use_cuda-rebound-from-args": """
        import torch
        use_cuda = True
        use_cuda = args.gpu_ok
        if use_cuda:
            torch.ones(1).cuda()
        state = torch.load("runs/last.pth")
    """,
    "use_cuda-by-walrus": """
        import torch
        use_cuda = True
        if (use_cuda := probe()):
            torch.ones(1).cuda()
        state = torch.load("runs/last.pth")
    """,
    "a-config-field's-default": """
        import torch
        class Config:
            use_cuda = True
        cfg = load_config()
        if cfg.use_cuda:
            torch.ones(1).cuda()
        state = torch.load("runs/last.pth")
    """,
}


@pytest.mark.parametrize("demo", list(QUIET.values()), ids=list(QUIET))
def test_a_switch_that_cannot_be_off_is_no_cpu_path(tmp_path: Path, demo: str) -> None:
    assert _lines(tmp_path, demo) == []


@pytest.mark.parametrize("demo", list(REPORTED.values()), ids=list(REPORTED))
def test_a_switch_the_file_may_turn_off_stays_reported(tmp_path: Path, demo: str) -> None:
    assert len(_lines(tmp_path, demo)) == 1


CPU_DEMO = """
    import torch
    device = "cuda" if torch.cuda.is_available() else "cpu"
    state = torch.load("runs/last.pth")
"""


@pytest.mark.parametrize(
    "chain, reported",
    [
        ("net.cpu().state_dict()", False),
        ("net.cuda().cpu().state_dict()", False),
        ('net.to("cpu").state_dict()', False),
        ("net.cpu().cuda().state_dict()", True),
        ("net.state_dict()", True),
    ],
)
def test_a_save_moved_to_the_cpu_in_the_same_expression(
    tmp_path: Path, chain: str, reported: bool
) -> None:
    train = f"""
        import torch
        from model import Net

        net = Net().cuda()
        torch.save({chain}, "runs/last.pth")
    """
    assert bool(_lines(tmp_path, CPU_DEMO, train)) is reported
