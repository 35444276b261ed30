"""ST003's ``weights_only=True`` fix follows the project's save flow, and ST004 fires only
where a GPU checkpoint can meet a machine or a rank without that device (issue 33 items 3
and 4, issue 34's weights_only point).

Each test writes a small project into ``tmp_path`` (a ``setup.py`` marks its root) in our
own words; the test of an offered fix runs the project's save and the fixed load under torch.
"""

from __future__ import annotations

import re
import runpy
import sys
import textwrap
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

import pytest
from _check_project import TORCH_LOAD_WARNS
from _fixture_run import expected_codes

from safetorch.check import check_source, project
from safetorch.check.config import Settings
from safetorch.check.engine import Diagnostic
from safetorch.check.rules import RULE_TABLE
from safetorch.check.runner import FileResult, check_file, check_paths

torch = pytest.importorskip("torch")
_EXPECT = re.compile(r"# expect: ([A-Z0-9 ]+)")


@pytest.fixture(autouse=True)
def _fresh_projects(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    # Scripts of the project run from its root and import its modules (model.py).
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "model", raising=False)
    project.clear()
    yield
    project.clear()


def _write(root: Path, files: Dict[str, str]) -> None:
    (root / "setup.py").write_text("")
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip())


def _findings(
    root: Path, name: str, code: str, settings: Optional[Settings] = None
) -> List[Diagnostic]:
    results = check_paths([str(root)], select=[code], settings=settings)
    return [d for r in results if r.path.endswith(name) for d in r.diagnostics if d.code == code]


MODEL = """
    import torch.nn as nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(3, 2)

        def forward(self, x):
            return self.fc(x)
"""


# -- ST003: the weights_only fix --------------------------------------------------------------
def test_whole_module_saved_in_another_file_gets_no_fix(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {
            "model.py": MODEL,
            "export.py": """
                import torch
                from model import Net

                def export(path):
                    net = Net()
                    torch.save(net, path)  # the whole pickled module

                export("net.pt")
            """,
            "train.py": """
                import sys
                import torch

                net = torch.load(sys.argv[1])
                print(type(net).__name__)
            """,
        },
    )
    (finding,) = _findings(tmp_path, "train.py", "ST003")
    assert finding.fix is None
    assert "export.py:6 may write it with an instance of a class (`net = Net()`)" in finding.message
    # The fix would have broken the load: a weights-only load refuses the pickled module.
    runpy.run_path(str(tmp_path / "export.py"))
    with pytest.raises(Exception, match="[Ww]eights only load failed"):
        torch.load(tmp_path / "net.pt", weights_only=True)


def test_namespace_saved_inside_a_checkpoint_is_allowed_by_name(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {
            "model.py": MODEL,
            "prepare.py": """
                import argparse
                import torch
                from model import Net

                parser = argparse.ArgumentParser()
                parser.add_argument("--lr", type=float, default=0.1)
                args = parser.parse_args([])
                net = Net()
                torch.save({"args": args, "weights": net.state_dict()}, "start.pt")
            """,
            "train.py": """
                import torch
                from model import Net

                start = torch.load("start.pt")
                net = Net()
                net.load_state_dict(start["weights"])
            """,
        },
    )
    (finding,) = _findings(tmp_path, "train.py", "ST003")
    assert finding.fix is not None  # issue 34.3: allow= exactly the writer's Namespace
    assert "an argparse Namespace" in finding.message and "prepare.py:9" in finding.message
    runpy.run_path(str(tmp_path / "prepare.py"))
    with pytest.raises(Exception, match="[Ww]eights only load failed"):
        torch.load(tmp_path / "start.pt", weights_only=True)  # what weights_only=True did
    result = check_file(str(tmp_path / "train.py"), select=["ST003"], fix=True, unsafe_fixes=True)
    assert result.after is not None and 'allow=["argparse.Namespace"]' in result.after
    (tmp_path / "train_fixed.py").write_text(result.after)
    assert runpy.run_path(str(tmp_path / "train_fixed.py"))["start"]["args"].lr == 0.1


STATE_DICTS = {
    "model.py": MODEL,
    "train.py": """
        import torch
        from model import Net

        def save_checkpoint(state, path):
            torch.save(state, path)

        net = Net()
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        for epoch in range(2):
            loss = net(torch.ones(1, 3)).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
            save_checkpoint(
                {"model": net.state_dict(), "optimizer": opt.state_dict(), "epoch": epoch + 1},
                "runs/last.pth",
            )
        torch.save(net.state_dict(), "runs/weights.pth")
    """,
    "evaluate.py": """
        import torch
        from model import Net

        checkpoint = torch.load("runs/last.pth", map_location="cpu")
        net = Net()
        net.load_state_dict(checkpoint["model"])
        epoch = checkpoint["epoch"]
        weights = torch.load("runs/weights.pth", map_location="cpu")
    """,
}


def _weights_only_reads_floats() -> bool:
    """torch 1.13's weights-only unpickler has no BINFLOAT (a float such as an optimizer's
    ``lr`` is refused as "Unsupported operand 71"); torch 2.0's reads it."""
    import io

    buffer = io.BytesIO()
    torch.save({"lr": 0.1}, buffer)
    buffer.seek(0)
    try:
        torch.load(buffer, weights_only=True)
    except Exception:
        return False
    return True


def _fix_and_run(root: Path, settings: Optional[Settings]) -> Tuple[List[Diagnostic], str]:
    """ST003's findings in evaluate.py and its fixed text, after running the project's own save
    and then the fixed load (which must give back the same tensors)."""
    findings = [
        d
        for r in check_paths([str(root)], select=["ST003"], settings=settings)
        if r.path.endswith("evaluate.py")
        for d in r.diagnostics
    ]
    result = check_file(
        str(root / "evaluate.py"), select=["ST003"], fix=True, unsafe_fixes=True, settings=settings
    )
    assert result.after is not None
    (root / "runs").mkdir()
    saved = runpy.run_path(str(root / "train.py"))
    (root / "evaluate_fixed.py").write_text(result.after)
    loaded = runpy.run_path(str(root / "evaluate_fixed.py"))
    assert loaded["epoch"] == 2
    for key, value in saved["net"].state_dict().items():
        assert torch.equal(loaded["net"].state_dict()[key], value)
        assert torch.equal(loaded["weights"][key], value)
    return findings, result.after


def test_project_that_saves_only_state_dicts_gets_st_load_where_its_torch_is_unknown(
    tmp_path: Path,
) -> None:
    # torch 1.13's weights-only unpickler has no BINFLOAT: weights_only=True there refuses the
    # optimizer state dict's float lr. With the oldest torch unknown the fix is st.load, which
    # is weights-only too and reads the file on every torch (this test runs on each row).
    _write(tmp_path, STATE_DICTS)
    findings, after = _fix_and_run(tmp_path, None)
    assert [d.line for d in findings] == [4, 8]
    assert all(d.fix is not None and "st.load" in d.fix.message for d in findings)
    assert "a float on 1.13" in findings[0].message
    assert after.count("st.load(") == 2 and "weights_only" not in after
    assert "import safetorch as st" in after


def test_a_declared_torch_2_still_gets_st_load(tmp_path: Path) -> None:
    # torch 2.1's weights-only unpickler refuses plain data 2.13's reads (a torch.device, a
    # set, complex, bytes): a floor of 2.0 does not make weights_only=True safe before 2.6.
    _write(tmp_path, STATE_DICTS)
    findings, after = _fix_and_run(tmp_path, Settings(min_torch=(2, 0)))
    assert [d.line for d in findings] == [4, 8]
    assert all(d.fix is not None and "st.load" in d.fix.message for d in findings)
    assert after.count("st.load(") == 2 and "weights_only" not in after


def test_weights_only_refused_before_torch_2_is_what_st_load_reads(tmp_path: Path) -> None:
    # Side by side, the same file through both: st.load reads it on every torch; torch's own
    # weights-only load reads it exactly where its unpickler knows BINFLOAT.
    import safetorch as st

    path = tmp_path / "opt.pt"
    net = torch.nn.Linear(2, 2)
    torch.save({"opt": torch.optim.SGD(net.parameters(), lr=0.1).state_dict()}, path)
    assert st.load(path)["opt"]["param_groups"][0]["lr"] == 0.1
    if _weights_only_reads_floats():
        assert torch.load(path, weights_only=True)["opt"]["param_groups"][0]["lr"] == 0.1
    else:
        with pytest.raises(Exception, match="(?i)weights.only|unsupported"):
            torch.load(path, weights_only=True)


def test_no_fix_when_the_project_is_not_read_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _write(tmp_path, STATE_DICTS)
    monkeypatch.setattr(project, "MAX_FILES", 1)
    findings = _findings(tmp_path, "evaluate.py", "ST003")
    assert findings and all(d.fix is None for d in findings)
    assert "too big to read whole" in findings[0].message


@TORCH_LOAD_WARNS
def test_file_the_project_never_writes(tmp_path: Path) -> None:
    # A downloaded file: contents unknown, unless it goes straight into a strict
    # module.load_state_dict (which itself accepts nothing but tensors).
    _write(
        tmp_path,
        {
            "model.py": MODEL,
            "zoo.py": """
                import torch
                from urllib.request import urlretrieve
                from model import Net

                def pretrained(url, path):
                    urlretrieve(url, path)
                    net = Net()
                    net.load_state_dict(torch.load(path))
                    return net

                def loose(url, path):
                    urlretrieve(url, path)
                    net = Net()
                    net.load_state_dict(torch.load(path), strict=False)
                    return net

                def anything(url, path):
                    urlretrieve(url, path)
                    return torch.load(path)
            """,
        },
    )
    strict, loose, anything = _findings(tmp_path, "zoo.py", "ST003")
    assert strict.fix is not None
    assert loose.fix is None and anything.fix is None
    assert "downloaded or pretrained file" in anything.message
    # The fixed strict load reads a state dict file as the unfixed one did.
    net = runpy.run_path(str(tmp_path / "model.py"))["Net"]()
    torch.save(net.state_dict(), tmp_path / "w.pt")
    again = runpy.run_path(str(tmp_path / "model.py"))["Net"]()
    again.load_state_dict(torch.load(tmp_path / "w.pt", weights_only=True))
    assert torch.equal(again.fc.weight, net.fc.weight)


def test_get_extra_state_withholds_the_fix(tmp_path: Path) -> None:
    files = dict(STATE_DICTS)
    files["extra.py"] = """
        import torch.nn as nn

        class Tagged(nn.Module):
            def get_extra_state(self):
                return {"tag": object()}
    """
    _write(tmp_path, files)
    findings = _findings(tmp_path, "evaluate.py", "ST003")
    assert findings and all(d.fix is None for d in findings)
    assert "get_extra_state" in findings[0].message


# -- ST004: map_location ----------------------------------------------------------------------
@pytest.mark.parametrize("seed", ["load.py", "load_device.py"])
def test_map_location_rule_finds_its_seed_when_selected(seed: str) -> None:
    # ST004 fires on evidence (tests/check/test_seed_rules_map_location.py); held-out 68.8%
    # after the rewrite keeps it preview (docs/check.md).
    assert RULE_TABLE["ST004"].preview
    path = Path(__file__).parent / "fixtures" / seed
    source = path.read_text()
    want = [n for n, c in expected_codes(source, _EXPECT) if c == "ST004"]
    assert want
    found = check_source(source, str(path), select=["ST004"])
    assert [d.line for d in found if d.code == "ST004"] == want


GPU_TRAINED = """
    import torch
    from model import Net

    device = "cuda" if torch.cuda.is_available() else "cpu"
    net = Net().to(device)
    torch.save(net.state_dict(), "best.pth")
"""


def test_gpu_checkpoint_loaded_by_a_script_that_runs_without_cuda(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {
            "model.py": MODEL,
            "train.py": GPU_TRAINED,
            "demo.py": """
                import torch
                from model import Net

                device = "cuda" if torch.cuda.is_available() else "cpu"
                net = Net().to(device)
                net.load_state_dict(torch.load("best.pth"))
            """,
        },
    )
    (finding,) = _findings(tmp_path, "demo.py", "ST004")
    assert "fails to load on a machine without one" in finding.message


def test_every_rank_loading_onto_the_saving_device(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {
            "model.py": MODEL,
            "train.py": GPU_TRAINED,
            "ddp.py": """
                import torch
                import torch.distributed as dist
                from model import Net

                dist.init_process_group("nccl")
                rank = dist.get_rank()
                net = Net().cuda(rank)
                net.load_state_dict(torch.load("best.pth"))
            """,
        },
    )
    (finding,) = _findings(tmp_path, "ddp.py", "ST004")
    assert "every rank" in finding.message


def test_checkpoint_saved_from_the_cpu_is_quiet(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {
            "model.py": MODEL,
            "style.py": """
                import torch
                from model import Net

                def train(args):
                    device = torch.device("cuda" if args.cuda else "cpu")
                    net = Net().to(device)
                    net.eval().cpu()
                    torch.save(net.state_dict(), args.out)

                def stylize(args):
                    device = torch.device("cuda" if args.cuda else "cpu")
                    net = Net()
                    net.load_state_dict(torch.load(args.model))
                    net.to(device)
            """,
            "cache.py": """
                import os
                import torch

                class Digits:
                    cache = "digits.pt"

                    def __init__(self, root):
                        path = os.path.join(root, self.cache)
                        if not os.path.exists(path):
                            with open(path, "wb") as f:
                                torch.save(torch.zeros(4, 4), f)
                        self.data = torch.load(path)
            """,
        },
    )
    assert _findings(tmp_path, "style.py", "ST004") == []
    assert _findings(tmp_path, "cache.py", "ST004") == []


def test_pretrained_backbone_and_tests_are_quiet(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {
            "model.py": MODEL,
            "train.py": GPU_TRAINED
            + """
    import argparse
    parser = argparse.ArgumentParser()
    parser.add_argument("--base", default="vgg_reduced.pth", help="ImageNet-pretrained base")
    args = parser.parse_args()
    net.load_state_dict(torch.load(args.base))
""",
            "tests/test_roundtrip.py": """
                import torch
                from model import Net

                def test_roundtrip(tmp_path):
                    net = Net().to("cuda" if torch.cuda.is_available() else "cpu")
                    torch.save(net.state_dict(), tmp_path / "n.pt")
                    assert torch.load(tmp_path / "n.pt").keys() == net.state_dict().keys()
            """,
        },
    )
    assert _findings(tmp_path, "train.py", "ST004") == []
    assert _findings(tmp_path, "test_roundtrip.py", "ST004") == []


def _evaluate_on_torch_2(root: Path) -> Tuple[Diagnostic, FileResult]:
    """ST003's one finding in evaluate.py of a project that declares torch >= 2.0, and the
    file with the unsafe fix."""
    torch_2 = Settings(min_torch=(2, 0))
    result = check_file(
        str(root / "evaluate.py"), select=["ST003"], fix=True, unsafe_fixes=True, settings=torch_2
    )
    (finding,) = _findings(root, "evaluate.py", "ST003", torch_2)
    return finding, result


def test_a_save_with_a_newer_pickle_protocol_gets_st_load_even_on_torch_2(tmp_path: Path) -> None:
    # torch's weights-only unpickler refuses protocol 4's FRAME and protocol 3's bytes (torch
    # 2.13 too); st.load reads them. A strict module load does not help: the load itself fails.
    _write(
        tmp_path,
        {
            "model.py": MODEL,
            "train.py": """
                import torch
                from model import Net

                net = Net()
                torch.save(net.state_dict(), "w.pt", pickle_protocol=4)
            """,
            "evaluate.py": """
                import torch
                from model import Net

                net = Net()
                net.load_state_dict(torch.load("w.pt"))
            """,
        },
    )
    finding, result = _evaluate_on_torch_2(tmp_path)
    assert "train.py:5 saves with pickle_protocol=4" in finding.message
    assert result.after is not None and 'st.load("w.pt", map_location="available")' in result.after
    saved = runpy.run_path(str(tmp_path / "train.py"))["net"]
    with pytest.raises(Exception, match="(?i)weights.only|unsupported"):
        torch.load(tmp_path / "w.pt", weights_only=True)  # what weights_only=True would do
    (tmp_path / "evaluate_fixed.py").write_text(result.after)
    loaded = runpy.run_path(str(tmp_path / "evaluate_fixed.py"))["net"]
    for key, value in saved.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value)


def test_a_project_with_its_own_torch_file_writer_gets_st_load(tmp_path: Path) -> None:
    # An incremental saver that pickles with its own Pickler into torch's zip format (protocol
    # 5 there): what the flow sees written by torch.save may be read from its files.
    _write(
        tmp_path,
        {
            "model.py": MODEL,
            "lazy_save.py": """
                import pickle
                import torch

                class IncrementalSaver:
                    def __init__(self, path):
                        self.writer = torch._C.PyTorchFileWriter(str(path))
            """,
            "evaluate.py": """
                import torch
                from model import Net

                net = Net()
                torch.save(net.state_dict(), "w.pt")
                net.load_state_dict(torch.load("w.pt"))
            """,
        },
    )
    finding, result = _evaluate_on_torch_2(tmp_path)
    assert "its own pickler (lazy_save.py:6" in finding.message
    assert result.after is not None and "st.load(" in result.after


def test_st_load_fix_keeps_each_argument_form_and_runs(tmp_path: Path) -> None:
    # A file handle, a positional map_location callable, mmap=, a BytesIO with encoding=, and
    # a script that binds `st` itself (the fix then imports safetorch unaliased).
    source = textwrap.dedent(
        """
        import io
        import time
        import torch
        net = torch.nn.Linear(2, 2)
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        torch.save({"model": net.state_dict(), "opt": opt.state_dict()}, "ckpt.pt")
        st = time.time()
        with open("ckpt.pt", "rb") as f:
            a = torch.load(f)
        b = torch.load("ckpt.pt", lambda storage, loc: storage)
        c = torch.load("ckpt.pt", map_location=torch.device("cpu"), mmap=True)
        with open("ckpt.pt", "rb") as f:
            data = f.read()
        d = torch.load(io.BytesIO(data), encoding="latin1")
        lrs = [x["opt"]["param_groups"][0]["lr"] for x in (a, b, c, d)]
        """
    ).lstrip()
    _write(tmp_path, {"train.py": source})
    result = check_file(str(tmp_path / "train.py"), select=["ST003"], fix=True, unsafe_fixes=True)
    assert result.after is not None
    assert result.after.count("safetorch.load(") == 4 and "import safetorch\n" in result.after
    assert 'safetorch.load("ckpt.pt", lambda storage, loc: storage)' in result.after
    (tmp_path / "train_fixed.py").write_text(result.after)
    fixed = runpy.run_path(str(tmp_path / "train_fixed.py"))
    assert fixed["lrs"] == [0.1] * 4 and isinstance(fixed["st"], float)
