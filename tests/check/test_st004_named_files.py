"""ST004 (issue 33, stop 58; found on its thirteenth- to sixteenth-batch findings, retired into
development before their reasons were read): evidence that the loaded file holds CUDA
tensors must be about that file. Quiet for a file this run saved just before in the same
function (on the device it runs on), a state dict moved to the CPU key by key before its
save, a scheduler's or grad scaler's state (numbers), and a load that names a file no CUDA
save of the project names (a published download beside the project's own numbered
checkpoints). Each quiet case sits beside the look-alike that stays reported; the idioms are
written here in our own words."""

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


CPU_FALLBACK = 'device = torch.device("cuda" if torch.cuda.is_available() else "cpu")\n'


def _lines(root: Path, files: dict, name: str) -> List[int]:
    (root / "setup.py").write_text("")
    for file, text in files.items():
        (root / file).write_text(textwrap.dedent(text).lstrip())
    return [
        d.line
        for r in check_paths([str(root)], ["ST004"])
        if r.path.endswith(name)
        for d in r.diagnostics
    ]


TRAIN_THEN_TEST = """
    import torch

    DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


    def run(model, epochs):
        model = model.to(DEVICE)
        for epoch in range(epochs):
            torch.save(model.state_dict(), "best.pt")
        {load}
"""


def test_a_file_saved_just_before_by_the_same_function_is_quiet(tmp_path: Path) -> None:
    script = TRAIN_THEN_TEST.format(load='model.load_state_dict(torch.load("best.pt"))')
    assert _lines(tmp_path, {"run.py": script}, "run.py") == []


def test_a_resume_before_the_save_stays_reported(tmp_path: Path) -> None:
    script = """
        import torch

        DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


        def run(model, epochs):
            model = model.to(DEVICE)
            model.load_state_dict(torch.load("best.pt"))
            for epoch in range(epochs):
                torch.save(model.state_dict(), "best.pt")
    """
    assert _lines(tmp_path, {"run.py": script}, "run.py") == [8]


CUDA_TRAIN = """
    import torch
    from nets import Net

    net = Net().cuda()
    sd = net.state_dict()
    {move}
    torch.save(sd, "out/decoder_{{:d}}.pth".format(3))
"""
DEMO = "import torch\n" + CPU_FALLBACK + 'sd = torch.load("out/decoder_3.pth")\n'


def test_a_state_dict_moved_to_the_cpu_key_by_key_is_quiet(tmp_path: Path) -> None:
    move = "for k in sd.keys():\n        sd[k] = sd[k].to(torch.device('cpu'))"
    files = {"train.py": CUDA_TRAIN.format(move=move), "demo.py": DEMO}
    assert _lines(tmp_path, files, "demo.py") == []
    move = "for k in list(sd):\n        sd[k] = sd[k].cpu()"
    project.clear()
    (tmp_path / "train.py").unlink()
    files = {"train.py": CUDA_TRAIN.format(move=move), "demo.py": DEMO}
    assert _lines(tmp_path, files, "demo.py") == []


def test_a_state_dict_saved_from_the_gpu_stays_reported(tmp_path: Path) -> None:
    move = "for k in sd.keys():\n        print(k, sd[k].shape)"
    files = {"train.py": CUDA_TRAIN.format(move=move), "demo.py": DEMO}
    assert _lines(tmp_path, files, "demo.py") == [3]


@pytest.mark.parametrize(
    ("saved", "reported"),
    [("scheduler.state_dict()", False), ("scaler.state_dict()", False), ("net.state_dict()", True)],
)
def test_a_scheduler_state_holds_no_tensors(tmp_path: Path, saved: str, reported: bool) -> None:
    train = f"""
        import torch

        net = torch.nn.Linear(2, 2).cuda()
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        scheduler = torch.optim.lr_scheduler.StepLR(opt, 1)
        scaler = torch.cuda.amp.GradScaler()
        torch.save({saved}, "state.pt")
    """
    demo = "import torch\n" + CPU_FALLBACK + 'state = torch.load("state.pt")\n'
    lines = _lines(tmp_path, {"train.py": train, "demo.py": demo}, "demo.py")
    assert lines == ([3] if reported else [])


NUMBERED = """
    import torch

    net = torch.nn.Linear(2, 2).cuda()
    for epoch in range(3):
        torch.save(net.state_dict(), f"runs/epoch_{epoch}.pth")
"""


@pytest.mark.parametrize(
    "load",
    [
        'torch.load(f"{root}/speaker_embedding.pth")',
        'torch.load(weights_path("speaker_embedding.pth", root))',
        'torch.load("assets/speaker_embedding.pth")',
    ],
    ids=["f-string", "path-helper", "literal"],
)
def test_a_named_file_no_cuda_save_names_is_quiet(tmp_path: Path, load: str) -> None:
    demo = (
        "import torch\nfrom paths import weights_path\n" + CPU_FALLBACK + 'root = "w"\n'
        f"emb = {load}\n"
    )
    files = {"train.py": NUMBERED, "demo.py": demo}
    assert _lines(tmp_path, files, "demo.py") == []


@pytest.mark.parametrize(
    "load",
    ['torch.load(f"runs/epoch_{args_epoch}.pth")', "torch.load(path)"],
    ids=["the-same-pattern", "unknown-path"],
)
def test_a_load_the_numbered_saves_may_write_stays_reported(tmp_path: Path, load: str) -> None:
    demo = "import torch, sys\n" + CPU_FALLBACK + "args_epoch = path = sys.argv[1]\n"
    demo += f"state = {load}\n"
    files = {"train.py": NUMBERED, "demo.py": demo}
    assert _lines(tmp_path, files, "demo.py") == [4]


def test_a_named_file_a_cuda_save_names_stays_reported(tmp_path: Path) -> None:
    train = NUMBERED + '    torch.save(net.state_dict(), "assets/speaker_embedding.pth")\n'
    demo = "import torch\n" + CPU_FALLBACK + 'emb = torch.load("assets/speaker_embedding.pth")\n'
    files = {"train.py": train, "demo.py": demo}
    assert _lines(tmp_path, files, "demo.py") == [3]


def test_a_file_saved_just_before_still_counts_for_several_processes(tmp_path: Path) -> None:
    # Every rank loads what rank 0 saved onto rank 0's GPU: this run wrote the file, but
    # not from each rank's own device (the DDP tutorial's checkpoint round trip).
    script = """
        import argparse
        import torch
        import torch.distributed as dist

        parser = argparse.ArgumentParser()
        parser.add_argument("--local_rank", type=int, default=0)
        args = parser.parse_args()


        def run(model):
            dist.init_process_group("nccl")
            torch.cuda.set_device(args.local_rank)
            model = model.cuda()
            if args.local_rank == 0:
                torch.save(model.state_dict(), "ddp.pt")
            dist.barrier()
            model.load_state_dict(torch.load("ddp.pt"))
    """
    assert _lines(tmp_path, {"run.py": script}, "run.py") == [17]


def test_st024_leaves_an_optimizer_load_alone(tmp_path: Path) -> None:
    # Found at stop 58 (the seventeenth batch): ST024's fix turned
    # ``optimizer.load_state_dict(torch.load(p))`` into ``st.load_state_dict(optimizer, p)``,
    # which takes modules only (TypeError on every file). An optimizer's state has no
    # InstanceNorm keys: no finding, no fix.
    from safetorch.check import check_source

    source = (
        "import torch\n"
        "net = torch.nn.InstanceNorm2d(3)\n"
        "opt = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)\n"
        "net.load_state_dict(torch.load('net.pth'))\n"
        "opt.load_state_dict(torch.load('opt.pth'))\n"
        "optimizer_center = opt\n"
        "optimizer_center.load_state_dict(torch.load('oc.pth'))\n"
    )
    found = check_source(source, str(tmp_path / "train.py"), select=["ST024"])
    assert [d.line for d in found] == [4]
    import safetorch as st

    opt = torch_optimizer()
    with pytest.raises(TypeError, match="Module"):
        st.load_state_dict(opt, str(tmp_path / "missing.pth"))


def torch_optimizer():  # the object the broken fix passed to st.load_state_dict
    torch = pytest.importorskip("torch")
    return torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)


@pytest.mark.parametrize(
    ("train", "load"),
    [
        (  # an upscaler is a module, not a grad scaler
            "upscaler = torch.nn.Linear(2, 2).cuda()\ntorch.save(upscaler.state_dict(), 'up.pt')\n",
            "torch.load('up.pt')",
        ),
        (  # a loop over another dict moves none of the model's tensors
            "sd = torch.nn.Linear(2, 2).cuda().state_dict()\nextra = {'a': torch.zeros(1)}\n"
            "for k in extra:\n    sd[k] = extra[k].cpu()\ntorch.save(sd, 'sd.pt')\n",
            "torch.load('sd.pt')",
        ),
        (  # f"{name}_model.pth" may be gen_model.pth: the known end is part of a name
            "torch.save(torch.nn.Linear(2, 2).cuda().state_dict(), 'gen_model.pth')\n",
            "torch.load(f'{name}_model.pth')",
        ),
    ],
    ids=["upscaler", "another-dict", "partial-name"],
)
def test_look_alikes_of_the_quiet_cases_stay_reported(
    tmp_path: Path, train: str, load: str
) -> None:
    demo = "import torch, sys\n" + CPU_FALLBACK + "name = sys.argv[1]\n" + f"state = {load}\n"
    files = {"train.py": "import torch\n" + train, "demo.py": demo}
    assert _lines(tmp_path, files, "demo.py") == [4]
