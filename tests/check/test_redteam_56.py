"""Red team of stop 56's ST004/ST006 changes (issue 33): each case the red team found, in our
own words, beside what must stay quiet."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path
from typing import Iterator, List

import pytest

from safetorch.check import check_source, project
from safetorch.check.rules._cpu_values import cpu_names
from safetorch.check.rules._sync_calls import syncing_definitions
from safetorch.check.runner import check_paths


@pytest.fixture(autouse=True)
def _fresh_projects() -> Iterator[None]:
    project.clear()
    yield
    project.clear()


def _project(root: Path, files: dict, select: str, name: str) -> List[int]:
    (root / "setup.py").write_text("")
    for path, text in files.items():
        (root / path).write_text(textwrap.dedent(text).lstrip())
    return [
        d.line
        for r in check_paths([str(root)], [select])
        if r.path.endswith(name)
        for d in r.diagnostics
    ]


TRAIN = """
    import torch

    net = torch.nn.Linear(2, 2).cuda()
    torch.save(net.state_dict(), "w.pt")
"""


def test_ranks_still_load_a_file_this_run_saved_onto_its_device(tmp_path: Path) -> None:
    # The run wrote the file, so no CPU-only machine reads it; but every rank loads it onto
    # the device it was saved from: the multi-process half of ST004 stays.
    ddp = """
        import torch
        import torch.distributed as dist
        import torch.multiprocessing as mp

        def save_best(model):
            path = "best.ckpt"
            torch.save(model.state_dict(), path)
            return path

        def worker(rank, world):
            dist.init_process_group("nccl", rank=rank, world_size=world)
            torch.cuda.set_device(rank)
            model = torch.nn.Linear(4, 2).to(rank)
            ckpt = save_best(model)
            model.load_state_dict(torch.load(ckpt))

        if __name__ == "__main__":
            mp.spawn(worker, args=(2,), nprocs=2)
    """
    assert _project(tmp_path, {"train.py": TRAIN, "ddp.py": ddp}, "ST004", "ddp.py") == [15]


@pytest.mark.parametrize(
    "helper",
    [
        # returned before the save runs (a skip flag): an earlier run's file
        """
        def fit(model, skip):
            path = "w.pt"
            if skip:
                return path
            torch.save(model.state_dict(), path)
            return path
        """,
        # saved only when missing: an earlier run's file otherwise
        """
        def fit(model, skip):
            path = "w.pt"
            if not os.path.exists(path):
                torch.save(model.state_dict(), path)
            return path
        """,
    ],
)
def test_a_returned_path_the_run_may_not_have_saved_is_no_proof(
    tmp_path: Path, helper: str
) -> None:
    script = (
        "import os\nimport torch\n\ndevice = 'cuda' if torch.cuda.is_available() else 'cpu'\n"
        + textwrap.dedent(helper)
        + "\nstate = torch.load(fit(torch.nn.Linear(2, 2).to(device), False))\n"
    )
    lines = script.splitlines()
    load = next(i for i, ln in enumerate(lines) if ln.startswith("state =")) + 1
    assert _project(tmp_path, {"train.py": TRAIN, "fit.py": script}, "ST004", "fit.py") == [load]


@pytest.mark.parametrize(
    "entry",
    [
        'device = "cuda"\n    device = "cpu"',  # rebound below: not a CUDA-only entry
        "torch.set_default_tensor_type(pick(args))",  # an expression may pick either
    ],
)
def test_the_main_guard_pins_cuda_only_by_a_literal_cuda_default(
    tmp_path: Path, entry: str
) -> None:
    script = (
        "import torch\n\n\ndef pick(args):\n    return 'torch.FloatTensor'\n\n\n"
        "def main():\n    dev = 'cuda' if torch.cuda.is_available() else 'cpu'\n"
        "    return dev, torch.load('w.pt')\n\n\nif __name__ == '__main__':\n"
        f"    args = None\n    {entry}\n    main()\n"
    )
    assert _project(tmp_path, {"train.py": TRAIN, "demo.py": script}, "ST004", "demo.py") == [10]


def test_a_chain_of_methods_waits_through_its_whole_length() -> None:
    methods = "".join(
        f"    def m{i}(self, x):\n        return self.m{i + 1}(x)\n" for i in range(300)
    )
    src = (
        "class Deep:\n    def forward(self, x):\n        return self.m0(x)\n"
        + methods
        + "    def m300(self, x):\n        return x.item()\n"
    )
    found, _reaches, _defined = syncing_definitions(ast.parse(src), "deep.py")
    assert "Deep" in found and "Deep.m0" in found and "Deep.m300" in found


def test_shape_arithmetic_in_a_forward_is_no_wait() -> None:
    src = (
        "import math\n\nclass Attn:\n    def forward(self, x):\n"
        "        side = int(math.sqrt(x.shape[1]))\n        print(x.shape)\n"
        "        return x.view(-1, side, side)\n"
    )
    found, _reaches, _defined = syncing_definitions(ast.parse(src), "attn.py")
    assert "Attn" not in found


def test_a_copy_to_the_host_is_no_gpu_copy_and_helpers_keep_nothing_on_the_cpu() -> None:
    src = """
    def f(loss, cpu_device):
        host = loss.to(torch.device("cpu"))
        other = loss.to(cpu_device)
        x = to_var(torch.randn(3))
        y = x * 2
        return host, other, y
    """
    found = cpu_names(ast.parse(textwrap.dedent(src)).body[0])
    assert "loss" not in found and "x" not in found and "y" not in found


def test_a_factory_tensor_under_a_cuda_default_is_no_cpu_tensor() -> None:
    src = """
    import time
    import torch

    torch.set_default_device("cuda")

    def bench(x):
        x_gpu = x.cuda()
        z = torch.randn(256, 256).requires_grad_()
        t0 = time.time()
        (z * 2).sum().backward()
        return x_gpu, time.time() - t0
    """
    assert [d.line for d in check_source(textwrap.dedent(src), "m.py", select=["ST006"])] == [12]


def test_a_library_factory_is_not_the_project_s(tmp_path: Path) -> None:
    nets = """
        class Detector:
            def forward(self, x):
                return x[x > 0].cpu()

        def load(path):
            return Detector()
    """
    bench = """
        import time
        import torch

        model = torch.hub.load("org/repo", "net").cuda()

        def run(x):
            t0 = time.time()
            y = model(x)
            return y, time.time() - t0
    """
    assert _project(tmp_path, {"nets.py": nets, "bench.py": bench}, "ST006", "bench.py") == [9]


def test_a_sum_of_a_thousand_terms_does_not_stop_the_run() -> None:
    terms = " + ".join(f"a{i}" for i in range(1000))
    src = f"import time\nimport torch\nt0 = time.time()\ntotal = {terms}\n"
    assert check_source(src, "m.py", select=["ST006"]) == []
