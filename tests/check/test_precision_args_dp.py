"""ST007, ST011, ST012, ST013, ST014 on evidence of the pitfall, not on the idiom (issue 33).

- ST007: only a usable default on the only positional of a parser (``nargs="?"`` changes no
  working command line there), and the fixed parser is run;
- ST013: not in tests, not for a model wrapped only to load ``module.`` keys, not as the
  single-process fallback beside a DDP path (in the function, the file or the project);
- ST014: an ``assert`` or an early exit on a distributed condition guards like an ``if``;
- ST011: decided from the project's own loaders, and the message says what is true;
- ST012: deliberate partial loads and keys compared elsewhere are quiet.
"""

from __future__ import annotations

import argparse
import textwrap
from pathlib import Path
from typing import Dict, Iterator, List

import pytest
import torch.nn as nn

from safetorch.check import check_source, fix_source
from safetorch.check import project as project_module
from safetorch.check.engine import Diagnostic
from safetorch.check.runner import check_paths

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(autouse=True)
def _fresh_projects() -> Iterator[None]:
    project_module.clear()
    yield
    project_module.clear()


def found(source: str, code: str, path: str = "<string>") -> List[Diagnostic]:
    diags = check_source(textwrap.dedent(source), path, select=[code])
    return [d for d in diags if d.code == code]


def write_project(root: Path, files: Dict[str, str]) -> None:
    (root / "setup.py").write_text("")
    for name, text in files.items():
        target = root / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(textwrap.dedent(text))


def project_findings(root: Path, code: str) -> Dict[str, List[Diagnostic]]:
    out: Dict[str, List[Diagnostic]] = {}
    for result in check_paths([str(root)], [code]):
        rel = Path(result.path).relative_to(root).as_posix()
        out[rel] = [d for d in result.diagnostics if d.code == code]
    return out


# -- ST007 -------------------------------------------------------------------------------------
def test_st007_usable_default_on_the_only_positional_is_fixed_and_the_parser_runs() -> None:
    source = textwrap.dedent(
        """
        import argparse

        parser = argparse.ArgumentParser()
        parser.add_argument("config", default="configs/base.yaml")
        parser.add_argument("--epochs", type=int, default=3)
        """
    )
    (diag,) = found(source, "ST007")
    assert 'default="configs/base.yaml"' in diag.message and 'nargs="?"' in diag.message
    fixed = fix_source(source, select=["ST007"])
    assert 'nargs="?"' in fixed
    scope: Dict[str, argparse.ArgumentParser] = {}
    exec(compile(fixed, "<fixed>", "exec"), scope)
    parser = scope["parser"]
    assert parser.parse_args([]).config == "configs/base.yaml"  # was a usage error
    for line in (["x.yaml"], ["x.yaml", "--epochs", "1"], ["--epochs", "1", "x.yaml"]):
        assert parser.parse_args(line).config == "x.yaml"  # working lines mean the same


@pytest.mark.parametrize(
    "argument",
    [
        'parser.add_argument("model_name", type=str, default=None)',
        'parser.add_argument("data", default="")',
        'parser.add_argument("data", default="none")',
        'parser.add_argument("files", nargs="+", default=["a"])',
        'parser.add_argument("mode", default="fast", choices=["train", "eval"])',
        'parser.add_argument("data", default=some_call())',
    ],
)
def test_st007_default_the_script_cannot_use_is_quiet(argument: str) -> None:
    assert (
        found(f"import argparse\nparser = argparse.ArgumentParser()\n{argument}\n", "ST007") == []
    )


@pytest.mark.parametrize(
    "rest",
    [
        'parser.add_argument("dst")',  # a required positional after it
        'parser.add_argument("extra", nargs="*")',
        "parser.add_subparsers()",  # a subcommand after it
        "add_model_args(parser)",  # other code may add positionals
    ],
)
def test_st007_a_second_positional_keeps_it_quiet(rest: str) -> None:
    source = f"""
    import argparse
    parser = argparse.ArgumentParser()
    parser.add_argument("src", default="a.txt")
    {rest}
    """
    assert found(source, "ST007") == []


def test_st007_quiet_where_nargs_would_rebind_working_command_lines() -> None:
    # Why a second positional keeps it quiet: argparse binds "a --flag v b" differently
    # once the first positional is optional (b becomes an unrecognized argument).
    def parser(nargs: object) -> argparse.ArgumentParser:
        p = argparse.ArgumentParser(exit_on_error=False)
        p.add_argument("src")
        p.add_argument("dst", default="d", **({} if nargs is None else {"nargs": nargs}))
        p.add_argument("--flag")
        return p

    line = ["a", "--flag", "v", "b"]
    assert parser(None).parse_args(line).dst == "b"
    _, extra = parser("?").parse_known_args(line)
    assert extra == ["b"]
    source = """
    import argparse
    parser = argparse.ArgumentParser()
    parser.add_argument("src")
    parser.add_argument("dst", default="d")
    """
    assert found(source, "ST007") == []


def test_st007_parents_and_groups() -> None:
    source = """
    import argparse
    base = argparse.ArgumentParser(add_help=False)
    child = argparse.ArgumentParser(parents=[base])
    child.add_argument("data", default="data/")
    solo = argparse.ArgumentParser()
    group = solo.add_argument_group("io")
    group.add_argument("out", default="out/")
    group.add_argument("more")
    """
    assert found(source, "ST007") == []
    source = """
    import argparse
    def main():
        solo = argparse.ArgumentParser()
        group = solo.add_argument_group("io")
        group.add_argument("out", default="out/")
        return solo.parse_args()
    """
    assert [d.line for d in found(source, "ST007")] == [6]


# -- ST013 -------------------------------------------------------------------------------------
TRAIN_DP = """
import torch
import torch.nn as nn

def train(model, loader, opt):
    if torch.cuda.device_count() > 1:
        model = nn.DataParallel(model)
    for x in loader:
        model(x).sum().backward()
        opt.step()
"""


def test_st013_not_in_tests_but_in_their_input_fixtures(tmp_path: Path) -> None:
    names = ["tests/helpers.py", "test/common.py", "test_wrap.py", "wrap_test.py", "conftest.py"]
    write_project(
        tmp_path,
        {
            **{name: TRAIN_DP for name in names},
            "train.py": TRAIN_DP,
            "tests/fixtures/t.py": TRAIN_DP,
        },
    )
    got = project_findings(tmp_path, "ST013")
    assert [d.line for d in got["train.py"]] == [7]
    assert [d.line for d in got["tests/fixtures/t.py"]] == [7]
    assert all(got[name] == [] for name in names)


def test_st013_wrapped_only_to_load_module_keys_is_quiet() -> None:
    inference = """
    import torch
    import torch.nn as nn

    def predict(net, path, x):
        if torch.cuda.is_available():
            net = nn.DataParallel(net).cuda()
        net.load_state_dict(torch.load(path, weights_only=True))
        net.eval()
        return net(x)
    """
    inference = textwrap.dedent(inference)
    assert found(inference, "ST013") == []
    # Training through the wrapper, or a wrap decided by the GPU count: reported.
    trains = inference + "\ndef step(net, loss):\n    loss.backward()\n"
    assert [d.line for d in found(trains, "ST013")] == [7]
    by_count = inference.replace("torch.cuda.is_available()", "torch.cuda.device_count() > 1")
    assert [d.line for d in found(by_count, "ST013")] == [7]


@pytest.mark.parametrize(
    "branch",
    [
        "if torch.cuda.is_available():\n    net = nn.DataParallel(net).cuda()\n"
        "else:\n    net = nn.DataParallel(net)\n",
        "if not torch.cuda.is_available():\n    net = nn.DataParallel(net)\n"
        "else:\n    net = nn.DataParallel(net).cuda()\n",
    ],
)
def test_st013_the_branch_without_cuda_is_a_pass_through(branch: str) -> None:
    # Without GPUs DataParallel only passes through (kept so net.module works on the CPU):
    # nothing to move to DDP there; the CUDA branch of the same test stays a finding.
    source = "import torch\nimport torch.nn as nn\n\ndef train(net, loss):\n"
    source += textwrap.indent(branch, "    ") + "    loss.backward()\n    return net\n"
    cuda_line = 6 if branch.startswith("if torch") else 8
    assert [d.line for d in found(source, "ST013")] == [cuda_line]
    # A test on something else (the GPU count) decides parallelism: both branches reported.
    by_count = source.replace("torch.cuda.is_available()", "torch.cuda.device_count() > 1")
    assert [d.line for d in found(by_count, "ST013")] == [6, 8]


def test_st013_fallback_beside_ddp_in_the_same_function_is_quiet() -> None:
    source = """
    import torch
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    def wrap(model, args):
        if args.distributed:
            model = DDP(model, device_ids=[args.gpu])
        elif torch.cuda.is_available():
            model = nn.DataParallel(model).cuda()
        return model

    def wrap_early(model, rank):
        if rank != -1:
            return DDP(model)
        return nn.DataParallel(model)
    """
    assert found(source, "ST013") == []
    # No DDP path anywhere: the real finding.
    no_ddp = source.replace("DDP(model, device_ids=[args.gpu])", "model.cuda()")
    no_ddp = no_ddp.replace("return DDP(model)", "return model").replace(
        "from torch.nn.parallel import DistributedDataParallel as DDP", ""
    )
    assert [d.line for d in found(no_ddp, "ST013")] == [10, 16]


def test_st013_fallback_beside_ddp_built_in_another_file(tmp_path: Path) -> None:
    write_project(
        tmp_path,
        {
            "utils/dist.py": """
            from torch.nn.parallel import DistributedDataParallel

            def smart_ddp(model, rank):
                return DistributedDataParallel(model, device_ids=[rank])
            """,
            "train.py": """
            import torch
            import torch.nn as nn
            from utils.dist import smart_ddp

            RANK = -1

            def setup(model):
                if RANK == -1 and torch.cuda.device_count() > 1:
                    model = nn.DataParallel(model)
                return model

            def multi_gpu(model, n_gpu):
                if n_gpu > 1:  # not a distributed decision: DP is how it trains
                    model = nn.DataParallel(model)
                return model
            """,
        },
    )
    got = project_findings(tmp_path, "ST013")
    assert [d.line for d in got["train.py"]] == [15]


# -- ST014 -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "guard",
    [
        "assert args.distributed",
        "assert dist.is_initialized()",
        "assert world_size > 1, 'run with torchrun'",
        "if not args.distributed:\n            return model",
        "if world_size == 1:\n            raise SystemExit('distributed only')",
    ],
)
def test_st014_assert_and_early_exit_guard_like_if(guard: str) -> None:
    source = f"""
    import torch.distributed as dist
    import torch.nn as nn

    def setup(model, args, world_size):
        {guard}
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
        return model
    """
    assert found(source, "ST014") == []


@pytest.mark.parametrize(
    "where",
    [
        "model = nn.SyncBatchNorm.convert_sync_batchnorm(model)\n        assert args.distributed",
        "assert model is not None\n        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)",
        "if args.distributed:\n            print('ddp')\n"
        "        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)",
    ],
)
def test_st014_assert_after_or_unrelated_is_no_guard(where: str) -> None:
    source = f"""
    import torch.nn as nn

    def setup(model, args):
        {where}
        return model
    """
    assert len(found(source, "ST014")) == 1


def test_st014_assert_in_another_function_is_no_guard() -> None:
    source = """
    import torch.nn as nn

    def check(args):
        assert args.distributed

    def setup(model):
        return nn.SyncBatchNorm.convert_sync_batchnorm(model)
    """
    assert len(found(source, "ST014")) == 1


# -- ST011 -------------------------------------------------------------------------------------
SAVES_WRAPPED = """
import torch
import torch.nn as nn

def train(model, path, step):
    model = nn.DataParallel(model)
    for _ in range(3):
        step(model)
    torch.save({"model": model.state_dict()}, path)
"""


def test_wrapped_keys_are_what_a_wrapped_load_needs() -> None:
    # The facts behind ST011: the wrapped format loads into a wrapper, not into a bare model.
    sd = nn.DataParallel(nn.Linear(2, 2)).state_dict()
    assert sorted(sd) == ["module.bias", "module.weight"]
    nn.DataParallel(nn.Linear(2, 2)).load_state_dict(sd)
    with pytest.raises(RuntimeError, match="Missing key"):
        nn.Linear(2, 2).load_state_dict(sd)
    result = nn.Linear(2, 2).load_state_dict(sd, strict=False)
    assert result.missing_keys == ["weight", "bias"]  # a strict=False loader loads nothing


def test_st011_quiet_where_every_loader_loads_into_a_wrapper(tmp_path: Path) -> None:
    write_project(
        tmp_path,
        {
            "train.py": SAVES_WRAPPED,
            "evaluate.py": """
            import torch
            import torch.nn as nn

            def evaluate(model, path):
                model = nn.DataParallel(model)
                ckpt = torch.load(path, weights_only=True)
                model.load_state_dict(ckpt["model"], strict=False)
            """,
        },
    )
    assert project_findings(tmp_path, "ST011")["train.py"] == []


@pytest.mark.parametrize("guard", ['if __name__ == "__main__":', "if args.evaluate:"])
def test_st011_a_loader_under_the_main_guard_wraps_always(tmp_path: Path, guard: str) -> None:
    # The script's main block runs whenever the script does: a model wrapped there is always
    # wrapped, so the project's format (wrapped keys) loads. A test on an option is a branch:
    # the model is wrapped only sometimes there, and the finding stays.
    evaluate = f"""
    import argparse
    import torch
    import torch.nn as nn

    args = argparse.ArgumentParser().parse_args()
    {guard}
        model = nn.DataParallel(nn.Linear(2, 2))
        ckpt = torch.load(args.path, weights_only=True)
        model.load_state_dict(ckpt["model"])
    """
    write_project(tmp_path, {"train.py": SAVES_WRAPPED, "evaluate.py": evaluate})
    found = project_findings(tmp_path, "ST011")["train.py"]
    assert len(found) == (0 if "__main__" in guard else 1)


def test_st011_a_save_that_unwraps_when_wrapped_is_quiet() -> None:
    # The bare side of `m.module.state_dict() if wrapped else m.state_dict()` runs only for a
    # model that is not wrapped: the file holds bare keys either way.
    source = """
    import torch
    import torch.nn as nn

    def train(model, path, n_gpu):
        if n_gpu > 1:
            model = nn.DataParallel(model)
        state = model.module.state_dict() if hasattr(model, "module") else model.state_dict()
        torch.save(state, path)
    """
    assert found(source, "ST011") == []
    # Both sides the wrapped model's own keys: the finding stays.
    both = source.replace("model.module.state_dict() if", "model.state_dict() if")
    assert [d.line for d in found(both, "ST011")] == [8, 8]


def test_st011_quiet_where_the_loader_strips_the_prefix_in_another_file(tmp_path: Path) -> None:
    write_project(
        tmp_path,
        {
            "train.py": SAVES_WRAPPED,
            "utils.py": """
            def strip_module(sd):
                return {k.replace("module.", "", 1): v for k, v in sd.items()}
            """,
            "demo.py": """
            import torch
            from utils import strip_module

            def demo(model, path):
                sd = strip_module(torch.load(path, weights_only=True)["model"])
                model.load_state_dict(sd)
            """,
        },
    )
    assert project_findings(tmp_path, "ST011")["train.py"] == []


def test_st011_reports_the_unwrapped_loader_it_found(tmp_path: Path) -> None:
    write_project(
        tmp_path,
        {
            "train.py": SAVES_WRAPPED,
            "demo.py": """
            import torch

            def demo(model, path):
                ckpt = torch.load(path, weights_only=True)
                model.load_state_dict(ckpt["model"])
            """,
        },
    )
    (diag,) = project_findings(tmp_path, "ST011")["train.py"]
    assert diag.line == 9
    assert "saved from the DataParallel wrapper" in diag.message
    assert "all start with 'module.'" in diag.message
    assert "loads it into an unwrapped model (`model` at demo.py:6)" in diag.message
    assert "sometimes" not in diag.message and "st.unwrap_model(model)" in diag.message


def test_st011_always_wrapped_with_no_loader_says_it_is_always_wrapped() -> None:
    (diag,) = found(SAVES_WRAPPED, "ST011")
    assert "sometimes" not in diag.message and "some paths" not in diag.message
    assert "do not load into the bare model" in diag.message


def test_st011_sometimes_wrapped_stays_a_finding_with_a_loader_like_it(tmp_path: Path) -> None:
    # Saved wrapped on a GPU machine, loaded into the bare model on a CPU one: the same
    # conditional wrap on the load side does not make the format consistent.
    write_project(
        tmp_path,
        {
            "main.py": """
            import torch
            import torch.nn as nn

            def run(net, path, resume):
                if torch.cuda.is_available():
                    net = nn.DataParallel(net)
                if resume:
                    ckpt = torch.load(path, weights_only=True)
                    net.load_state_dict(ckpt["net"])
                torch.save({"net": net.state_dict()}, path)
            """
        },
    )
    (diag,) = project_findings(tmp_path, "ST011")["main.py"]
    assert "on some paths only" in diag.message
    assert "a model wrapped only sometimes (`net` at main.py:10)" in diag.message


# -- ST012 -------------------------------------------------------------------------------------
def test_st012_finds_the_seed() -> None:
    source = (FIXTURES / "strict.py").read_text()
    found = check_source(source, "strict.py", select=["ST012"])
    assert [d.line for d in found if d.code == "ST012"] == [5, 6, 7, 11]


def test_st012_deliberate_partial_loads_are_quiet() -> None:
    source = """
    import torch

    def from_prefix(module, ckpt, prefix):
        local = {}
        for key in ckpt["model"]:
            if key.startswith(prefix):
                local[key[len(prefix):]] = ckpt["model"][key]
        module.load_state_dict(local, strict=False)

    def onto_meta(model, sharded):
        model.load_state_dict(sharded, strict=False, assign=True)

    def compared(model, sd):
        missing = [k for k in model.state_dict() if k not in sd]
        model.load_state_dict(sd, strict=False)
        return missing

    def compared_by_set(model, sd):
        own = model.state_dict()
        extra = set(sd) - set(own)
        model.load_state_dict(sd, strict=False)
        return extra

    def kept(model, sd):
        result = model.load_state_dict(sd, strict=False)
        print(result.missing_keys)
    """
    assert found(source, "ST012") == []


@pytest.mark.parametrize(
    "rename",
    [
        "sd[k[len(prefix):]] = sd.pop(k)",
        "sd[k[len(prefix):]] = sd[k]\n            del sd[k]",
    ],
)
def test_st012_a_prefix_renamed_in_place_keeps_every_key_and_stays_a_finding(rename: str) -> None:
    # The loop runs over the dict it writes and the value is read from it: keys are renamed,
    # none dropped, so nothing chose what loads (a compiled model's "_orig_mod." prefix).
    source = f"""
    import torch

    def restore(model, path, prefix="_orig_mod."):
        sd = torch.load(path, weights_only=True)["model"]
        for k in list(sd.keys()):
            if k.startswith(prefix):
                {rename}
        model.load_state_dict(sd, strict=False)
    """
    load_line = (
        textwrap.dedent(source).splitlines().index("    model.load_state_dict(sd, strict=False)")
    )
    assert [d.line for d in found(source, "ST012")] == [load_line + 1]
    # Built into another dict under the same test: only the chosen keys load (quiet).
    chosen = source.replace("sd = torch.load", "ckpt = torch.load").replace(
        "for k in list(sd.keys()):", "sd = {}\n        for k in list(ckpt.keys()):"
    )
    chosen = chosen.replace("sd.pop(k)", "ckpt[k]").replace("= sd[k]", "= ckpt[k]")
    chosen = chosen.replace("del sd[k]", "pass")
    assert found(chosen, "ST012") == []


def test_st012_renamed_key_by_key_without_a_test_is_still_a_finding() -> None:
    source = """
    import torch

    def rename(model, path):
        ckpt = torch.load(path, weights_only=True)
        sd = {}
        for k, v in ckpt.items():
            sd[k.replace("backbone.", "")] = v
        model.load_state_dict(sd, strict=False)
    """
    assert [d.line for d in found(source, "ST012")] == [9]
