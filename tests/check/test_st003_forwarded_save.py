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
    # A checkpoint dict, not a strict module load: st.load, weights-only on every torch.
    assert result.after is not None and "st.load(args.resume" in result.after


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


# --- red team (issue 33): ways a wrapper's callers escaped the follow ----------------------
def _weights_only_fix(root: Path) -> bool:
    """ST003 makes train.py's load weights-only without an allow-list: weights_only=True, or
    st.load where torch's own weights-only unpickler may refuse plain data."""
    result = check_file(str(root / "train.py"), select=["ST003"], fix=True, unsafe_fixes=True)
    after = result.after or ""
    return "weights_only=True" in after or ("st.load(" in after and "allow=" not in after)


CALLERS = """
    import argparse
    import functools
    import torch
    {imports}

    def main(args):
        model = torch.nn.Linear(2, 2)
        {plain}
        {namespace}

    def resume(path):
        return torch.load(path, map_location="cpu")["model"]
"""

SAVE_ON_MASTER = """
    import torch

    def save_on_master(*args, **kwargs):
        torch.save(*args, **kwargs)
"""


@pytest.mark.parametrize(
    "helpers, imports, namespace",
    [
        (  # a named parameter before *args: the object is the caller's second argument
            """
            import torch

            def save_if(flag, *args, **kwargs):
                if flag:
                    torch.save(*args, **kwargs)
            """,
            "from helpers import save_if",
            'save_if(True, {"model": model.state_dict(), "args": args}, "ckpt.pth")',
        ),
        (  # imported under another name
            SAVE_ON_MASTER,
            "from helpers import save_on_master, save_on_master as persist",
            'persist({"model": model.state_dict(), "args": args}, "ckpt.pth")',
        ),
        (  # bound by functools.partial
            SAVE_ON_MASTER,
            "from helpers import save_on_master",
            'functools.partial(save_on_master, {"model": model.state_dict(), "args": args})("c.pth")',
        ),
        (  # the wrapper rebuilds its *args before forwarding them
            """
            import argparse
            import torch

            CONFIG = argparse.Namespace(lr=0.1)

            def save_on_master(*args, **kwargs):
                args = ({"model": args[0], "config": CONFIG},) + args[1:]
                torch.save(*args, **kwargs)
            """,
            "from helpers import save_on_master",
            "pass",
        ),
    ],
    ids=["param-before-args", "import-alias", "partial", "rebuilt-args"],
)
def test_no_weights_only_fix_where_a_wrapper_may_save_a_namespace(
    tmp_path: Path, helpers: str, imports: str, namespace: str
) -> None:
    plain = (
        'save_if(True, {"model": model.state_dict()}, "w.pth")'
        if "save_if" in imports
        else 'save_on_master({"model": model.state_dict()}, "w.pth")'
    )
    train = CALLERS.format(imports=imports, plain=plain, namespace=namespace)
    write_project(tmp_path, {"helpers.py": helpers, "train.py": train})
    assert not _weights_only_fix(tmp_path)
