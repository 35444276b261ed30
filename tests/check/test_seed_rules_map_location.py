"""ST004 (``torch.load`` without ``map_location``) in the default set, issue 33: a finding
needs evidence in the project's own code that the loaded file holds CUDA tensors (a save of
a module's tensors from a file that uses CUDA) and that the loading script also runs without
CUDA or in several processes. Each idiom is written here in our own words."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Dict, Iterator, List

import pytest

from safetorch.check import project
from safetorch.check.rules import RULE_TABLE
from safetorch.check.runner import check_paths


@pytest.fixture(autouse=True)
def _fresh_projects() -> Iterator[None]:
    project.clear()
    yield
    project.clear()


def _lines(root: Path, files: Dict[str, str], name: str) -> List[int]:
    """Lines of ST004's findings (a preview rule: selected) in ``name`` of a project of ``files``."""
    (root / "setup.py").write_text("")
    for rel, text in files.items():
        (root / rel).write_text(textwrap.dedent(text).lstrip())
    results = check_paths([str(root)], ["ST004"])
    return [
        d.line for r in results if r.path.endswith(name) for d in r.diagnostics if d.code == "ST004"
    ]


TRAIN = """
    import torch
    from model import Net

    net = Net().cuda()
    torch.save({"model": net.state_dict()}, "runs/last.pth")
"""


def test_st004_is_preview_below_the_bar() -> None:
    # Held-out 68.8% (55/80, the seventeenth batch) after its third rewrite: below the 97% bar, so preview (docs/check.md).
    assert RULE_TABLE["ST004"].preview


@pytest.mark.parametrize(
    "loader",
    [
        # a CPU fallback
        """
        import torch
        device = "cuda" if torch.cuda.is_available() else "cpu"
        state = torch.load("runs/last.pth")
        """,
        # a --cuda switch
        """
        import argparse, torch
        parser = argparse.ArgumentParser()
        parser.add_argument("--cuda", action="store_true")
        state = torch.load("runs/last.pth")
        """,
        # ranks, each on its own device
        """
        import torch
        import torch.distributed as dist
        dist.init_process_group("nccl")
        torch.cuda.set_device(dist.get_rank())
        state = torch.load("runs/last.pth")
        """,
    ],
)
def test_cuda_written_file_read_off_cuda_is_reported(tmp_path: Path, loader: str) -> None:
    found = _lines(tmp_path, {"train.py": TRAIN, "demo.py": loader}, "demo.py")
    assert len(found) == 1


def test_a_script_resuming_what_it_saves(tmp_path: Path) -> None:
    script = """
    import torch
    from model import Net

    def main(args):
        device = torch.device("cuda" if args.cuda else "cpu")
        net = Net().to(device)
        state = {"net": net.state_dict(), "epoch": 3}
        if args.resume:
            net.load_state_dict(torch.load(args.resume)["net"])
        torch.save(state, "ckpt/%s.pth" % args.name)
    """
    assert _lines(tmp_path, {"main.py": script}, "main.py") == [9]


@pytest.mark.parametrize(
    "files",
    [
        # the project never writes the file: a download or a published checkpoint
        {
            "demo.py": """
            import torch
            device = "cuda" if torch.cuda.is_available() else "cpu"
            state = torch.load("weights/released.pth")
            """
        },
        # a data cache: loaded if it exists, else built and saved (CPU tensors)
        {
            "lm.py": """
            import os, torch
            from corpus import Corpus
            device = "cuda" if torch.cuda.is_available() else "cpu"
            fn = "corpus.cache"
            if os.path.exists(fn):
                corpus = torch.load(fn)
            else:
                corpus = Corpus("data/")
                torch.save(corpus, fn)
            model = torch.nn.Linear(2, 2).to(device)
            torch.save(model.state_dict(), "model.pth")
            """
        },
        # a CUDA-only single-process script: the saving device is there
        {
            "train.py": TRAIN,
            "eval.py": """
            import torch
            from model import Net
            net = Net().cuda()
            net.load_state_dict(torch.load("runs/last.pth")["model"])
            """,
        },
        # a library module that shows no CPU path and no ranks: its callers decide
        {
            "train.py": TRAIN,
            "ckpt.py": """
            import torch

            def restore(path):
                return torch.load(path)
            """,
        },
        # an object's own device attribute is no command-line switch to the CPU
        {
            "train.py": TRAIN,
            "serve.py": """
            import torch

            class Server:
                def load(self):
                    self.model.to(self.device)
                    return torch.load("runs/last.pth")
            """,
        },
        # a helper that saves what it is given, in a file that never names CUDA
        {
            "io_utils.py": """
            import torch

            def save_state(state, path):
                torch.save(state, path)
            """,
            "demo.py": """
            import torch
            device = "cuda" if torch.cuda.is_available() else "cpu"
            state = torch.load(args.checkpoint)
            """,
        },
    ],
)
def test_no_evidence_of_the_pitfall_is_quiet(tmp_path: Path, files: Dict[str, str]) -> None:
    name = [n for n in files if n != "train.py"][-1]
    assert _lines(tmp_path, files, name) == []


# -- issue 33, second pass (fourth corpus batch): strong evidence only -------------------------

SAVER = """
    import torch
    from model import Net

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    net = Net().to(device)
    torch.save(net.state_dict(), "weights/net_final.pth")
"""


@pytest.mark.parametrize(
    "loader",
    [
        # a switch between CUDA and the CPU, read in the loading script
        """
        import argparse, torch
        from model import Net
        parser = argparse.ArgumentParser()
        parser.add_argument("--no-cuda", action="store_true")
        args = parser.parse_args()
        net = Net()
        if not args.no_cuda:
            net = net.cuda()
        net.load_state_dict(torch.load("weights/net_final.pth"))
        """,
        # a --device option whose help names the CPU
        """
        import argparse, torch
        parser = argparse.ArgumentParser()
        parser.add_argument("--device", default="cuda:0", help="cuda:N or cpu")
        args = parser.parse_args()
        state = torch.load("weights/net_final.pth")
        """,
        # a device chosen by a test, the load inside a function
        """
        import torch

        def restore():
            dev = "cuda" if torch.cuda.is_available() else "cpu"
            return torch.load("weights/net_final.pth")
        """,
    ],
)
def test_strong_cpu_path_still_reported(tmp_path: Path, loader: str) -> None:
    found = _lines(tmp_path, {"train.py": SAVER, "infer.py": loader}, "infer.py")
    assert len(found) == 1


@pytest.mark.parametrize(
    "loader",
    [
        # --gpus / --ngpu choose which or how many GPUs: no CPU path
        """
        import argparse, torch
        parser = argparse.ArgumentParser()
        parser.add_argument("--gpus", type=int, nargs="+", default=[0, 1])
        parser.add_argument("--ngpu", type=int, default=1)
        args = parser.parse_args()
        state = torch.load("weights/net_final.pth")
        """,
        # map_location="cpu" on another load and x.to("cpu") move data; they choose no device
        """
        import torch
        other = torch.load("weights/other.pth", map_location="cpu")
        state = torch.load("weights/net_final.pth")
        host = state["w"].to("cpu")
        """,
        # the script needs CUDA: it stops without it
        """
        import torch
        if not torch.cuda.is_available():
            raise SystemExit("this demo needs a GPU")
        state = torch.load("weights/net_final.pth")
        """,
        """
        import torch
        assert torch.cuda.is_available(), "GPU required"
        state = torch.load("weights/net_final.pth")
        """,
        # the load's function moves to CUDA whatever is tested: a CUDA-only path
        """
        import argparse, torch
        from model import Net
        parser = argparse.ArgumentParser()
        parser.add_argument("--cpu", action="store_true")

        def evaluate(args):
            net = Net()
            net.load_state_dict(torch.load("weights/net_final.pth"))
            net.cuda()
        """,
        # a CUDA-only device constant at module level
        """
        import torch
        DEVICE = "cuda"
        use_cuda = True
        state = torch.load("weights/net_final.pth")
        """,
        # ranks, but the load is kept to the main process (its own device, cuda:0)
        """
        import torch
        import torch.distributed as dist
        dist.init_process_group("nccl")
        if dist.get_rank() == 0:
            state = torch.load("weights/net_final.pth")
        """,
        # importing torch.distributed is no multi-process run (a library's helpers)
        """
        import torch
        import torch.distributed as dist

        def world():
            return dist.get_world_size() if dist.is_initialized() else 1

        state = torch.load("weights/net_final.pth")
        """,
    ],
)
def test_weak_evidence_is_quiet(tmp_path: Path, loader: str) -> None:
    assert _lines(tmp_path, {"train.py": SAVER, "infer.py": loader}, "infer.py") == []


def test_a_buffer_filled_in_memory_is_no_file(tmp_path: Path) -> None:
    # Each rank serializes its state into bytes and reads back its own: its devices.
    script = """
    import io, torch
    import torch.distributed as dist

    def roundtrip(model):
        dist.init_process_group("nccl")
        model = model.cuda()
        buf = io.BytesIO()
        torch.save(model.state_dict(), buf)
        buf.seek(0)
        return torch.load(buf)
    """
    assert _lines(tmp_path, {"state.py": script}, "state.py") == []


PER_RANK = """
    import os, torch
    import torch.distributed as dist

    def main(args, bank):
        dist.init_process_group("nccl")
        {device}
        path = os.path.join(args.out, "bank" + str(args.rank) + ".pth")
        if os.path.isfile(path):
            bank = torch.load(path)["bank"]
        bank = bank.to(device)
        torch.save({"bank": bank}, path)
"""


def test_a_file_each_rank_saves_for_itself_is_quiet_across_ranks(tmp_path: Path) -> None:
    # Every rank reloads the file it wrote from its own device: the ranks never meet on cuda:0.
    script = PER_RANK.replace("{device}", 'device = torch.device("cuda", args.local_rank)')
    assert _lines(tmp_path, {"pretrain.py": script}, "pretrain.py") == []
    # The same script naming one file for all ranks is reported, and so is a name that only
    # contains the word (a ranking, not the rank).
    shared = script.replace('"bank" + str(args.rank) + ".pth"', '"bank.pth"')
    assert _lines(tmp_path, {"pretrain.py": shared}, "pretrain.py") == [9]
    ranking = script.replace('"bank" + str(args.rank) + ".pth"', "args.ranking_file")
    assert _lines(tmp_path, {"pretrain.py": ranking}, "pretrain.py") == [9]
    shard = script.replace('"bank" + str(args.rank) + ".pth"', 'f"bank{dist.get_rank()}.pth"')
    assert _lines(tmp_path, {"pretrain.py": shard}, "pretrain.py") == []


def test_a_per_rank_file_in_a_script_with_a_cpu_path_is_still_reported(tmp_path: Path) -> None:
    # The rank in the name settles the ranks, not a run on a machine without CUDA.
    choice = 'device = "cuda" if torch.cuda.is_available() else "cpu"'
    script = PER_RANK.replace("{device}", choice)
    assert _lines(tmp_path, {"pretrain.py": script}, "pretrain.py") == [9]


def test_another_programs_checkpoint_is_no_evidence(tmp_path: Path) -> None:
    # examples/gan saves from CUDA; examples/mnist loads a file of its own (never saved here).
    (tmp_path / "examples" / "gan").mkdir(parents=True)
    (tmp_path / "examples" / "mnist").mkdir(parents=True)
    files = {
        "examples/gan/train.py": SAVER,
        "examples/mnist/resume.py": """
        import torch
        device = "cuda" if torch.cuda.is_available() else "cpu"
        state = torch.load("weights/net_final.pth")
        """,
    }
    assert _lines(tmp_path, files, "resume.py") == []
    # The same loader next to the saver is reported.
    files["examples/gan/resume.py"] = files.pop("examples/mnist/resume.py")
    project.clear()
    assert len(_lines(tmp_path, files, "gan/resume.py")) == 1


def test_a_cuda_only_helper_elsewhere_in_the_script_is_quiet(tmp_path: Path) -> None:
    # The script seeds CUDA when it can, but its training function moves the model to CUDA
    # whatever is tested: it does not run without CUDA.
    loader = """
    import torch
    from model import Net

    if torch.cuda.is_available():
        torch.cuda.manual_seed(0)

    def train(net):
        net.cuda()

    def resume():
        return torch.load("weights/net_final.pth")
    """
    assert _lines(tmp_path, {"train.py": SAVER, "resume.py": loader}, "resume.py") == []


@pytest.mark.parametrize(
    "loader",
    [
        # a place to copy results to is no device the script runs on
        """
        import torch
        cpu_device = torch.device("cpu")
        state = torch.load("weights/net_final.pth")
        """,
        # the script exits where CUDA is missing
        """
        import sys, torch
        if torch.cuda.is_available():
            dev = torch.device("cuda")
        else:
            sys.exit("no GPU")
        state = torch.load("weights/net_final.pth")
        """,
    ],
)
def test_no_cpu_run_is_quiet(tmp_path: Path, loader: str) -> None:
    assert _lines(tmp_path, {"train.py": SAVER, "infer.py": loader}, "infer.py") == []


def test_a_device_bound_to_the_cpu_is_a_cpu_path(tmp_path: Path) -> None:
    loader = """
    import torch
    device = torch.device("cpu")
    state = torch.load("weights/net_final.pth")
    """
    assert len(_lines(tmp_path, {"train.py": SAVER, "infer.py": loader}, "infer.py")) == 1


# -- issue 33, eighth batch: a script that never puts anything on a GPU runs on the CPU ------

_EXPORT = """
    import torch
    from model import Net

    if __name__ == "__main__":
        net = Net()
        net.load_state_dict(torch.load("runs/last.pth")["model"])
        torch.onnx.export(net, torch.randn(1, 3), "net.onnx")
"""


def test_a_cpu_only_script_loading_a_cuda_checkpoint_is_reported(tmp_path: Path) -> None:
    # Neither the export script nor the model module it imports names CUDA: it runs on the
    # CPU wherever it runs, and the training script writes the file from CUDA tensors.
    files = {"train.py": TRAIN, "model.py": "import torch\nNet = torch.nn.Linear\n"}
    assert _lines(tmp_path, {**files, "export.py": _EXPORT}, "export.py") == [6]


@pytest.mark.parametrize(
    "files",
    [
        # the model module it imports moves to CUDA: the script may well run there
        {"model.py": "import torch\n\ndef Net():\n    return torch.nn.Linear(3, 3).cuda()\n"},
        # not a script: a library module's function, whose caller decides the device
        {
            "model.py": "import torch\nNet = torch.nn.Linear\n",
            "export.py": _EXPORT.replace('if __name__ == "__main__":', "def export():"),
        },
    ],
)
def test_a_script_that_may_use_cuda_or_a_library_is_quiet(
    tmp_path: Path, files: Dict[str, str]
) -> None:
    project_files = {"train.py": TRAIN, "export.py": _EXPORT, **files}
    assert _lines(tmp_path, project_files, "export.py") == []


# -- issue 33, ninth batch: what a CUDA-only script and one process per node look like -------

_PRUNE = """
    import argparse
    import torch
    import torch.nn as nn

    parser = argparse.ArgumentParser()
    parser.add_argument("--no-cuda", action="store_true")
    args = parser.parse_args()
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8))
    model.load_state_dict(torch.load("runs/last.pth")["model"])
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            mask = m.weight.data.abs().gt(0.1).float().cuda()
"""


def test_a_move_to_cuda_under_a_type_test_makes_the_script_cuda_only(tmp_path: Path) -> None:
    # `if isinstance(m, nn.BatchNorm2d):` decides nothing about the machine: the mask moves to
    # CUDA whenever the script runs, so its --no-cuda switch is no CPU path.
    assert _lines(tmp_path, {"train.py": TRAIN, "prune.py": _PRUNE}, "prune.py") == []
    # The same move under the switch's own test is a choice: the CPU path stays, reported.
    chosen = _PRUNE.replace("if isinstance(m, nn.BatchNorm2d):", "if not args.no_cuda:")
    assert _lines(tmp_path, {"train.py": TRAIN, "prune.py": chosen}, "prune.py") == [9]


_PER_NODE = """
    import torch
    import torch.distributed as dist
    import torch.nn as nn

    dist.init_process_group("nccl")
    model = nn.Linear(3, 3)
    model.cuda()
    model = nn.parallel.DistributedDataParallel(model)
    state = torch.load("runs/last.pth")
"""


def test_one_process_per_node_loads_where_its_model_is(tmp_path: Path) -> None:
    # No device per process (no set_device, device_ids, local_rank or spawn): each node's one
    # process uses all its GPUs from cuda:0, where the checkpoint's tensors go back to.
    assert _lines(tmp_path, {"train.py": TRAIN, "eval.py": _PER_NODE}, "eval.py") == []
    pinned = _PER_NODE.replace("model.cuda()", "torch.cuda.set_device(0)\n    model.cuda()")
    assert _lines(tmp_path, {"train.py": TRAIN, "eval.py": pinned}, "eval.py") == [10]
