"""ST012 (stop 55): a discarded non-strict load is reported on evidence that the state dict
may not match: it is read from a file or passed in; not when a live model made it (a twin's
``state_dict()``, the module's own buffers), when it is not torch's ``load_state_dict``
(another framework's loader, extra keywords), when it is the fallback of a strict load
whose error the code read, or when the code compares and reports the keys itself. Each
quiet case sits beside the look-alike that stays reported."""

from __future__ import annotations

import textwrap
from typing import List

import pytest

from safetorch.check import check_source


def _codes(source: str) -> List[str]:
    return [d.code for d in check_source(textwrap.dedent(source), "s.py", select=["ST012"])]


QUIET = {
    "a-twin's-state": """
        import torch

        def convert(train_model, deploy_model):
            deploy_model.load_state_dict(train_model.state_dict(), strict=False)
    """,
    "own-buffers": """
        import torch

        def all_reduce_norm(module):
            states = norm_states(module)
            states = all_reduce(states, op="mean")
            module.load_state_dict(states, strict=False)
    """,
    "another-framework": """
        import megengine as mge

        def build_and_load(model, weight_file):
            weights = mge.load(weight_file)
            model.load_state_dict(weights, strict=False)
    """,
    "keys-from-the-model": """
        import logging

        def load_ckpt(model, ckpt):
            own = model.state_dict()
            chosen = {}
            for key, value in own.items():
                if key not in ckpt:
                    logging.warning("%s missing", key)
                    continue
                chosen[key] = ckpt[key]
            model.load_state_dict(chosen, strict=False)
    """,
    "not-torch's-method": """
        import torch

        def merge(model, path):
            ckpt = torch.load(path)
            model.load_state_dict(ckpt, precision=torch.float32, strict=False)
    """,
    "fallback-after-reading-the-error": """
        import torch

        def restore(model, path):
            sd = torch.load(path)
            try:
                model.load_state_dict(sd)
            except RuntimeError as e:
                if "normalize.mean" not in str(e):
                    raise
                model.load_state_dict(sd, strict=False)
    """,
    "keys-compared-after-and-printed": """
        import torch

        def restore(model, path):
            sd = torch.load(path)["model"]
            model.load_state_dict(sd, strict=False)
            missing = set(model.state_dict().keys()) - set(sd.keys())
            for k in missing:
                print("missing from the checkpoint:", k)
    """,
}

REPORTED = {
    "a-file's-state": """
        import torch

        def convert(deploy_model, path):
            deploy_model.load_state_dict(torch.load(path), strict=False)
    """,
    "passed-in (the seed)": """
        def restore(model, sd):
            model.load_state_dict(sd, strict=False)
    """,
    "torch's-loader": """
        import torch

        def build_and_load(model, weight_file):
            weights = torch.load(weight_file)
            model.load_state_dict(weights, strict=False)
    """,
    "keys-from-the-file": """
        import torch

        def load_ckpt(model, path):
            ckpt = torch.load(path)
            chosen = {}
            for key, value in ckpt.items():
                chosen[key.replace("module.", "")] = value
            model.load_state_dict(chosen, strict=False)
    """,
    "a-file-merged-into-a-twin's-state": """
        import torch

        def convert(train_model, deploy_model, path):
            sd = dict(train_model.state_dict())
            sd.update(torch.load(path))
            deploy_model.load_state_dict(sd, strict=False)
    """,
    "the-project's-loader": """
        def restore(model, path):
            ckpt = load_checkpoint(path)
            model.load_state_dict(ckpt["state_dict"], strict=False)
    """,
    "fallback-that-never-reads-the-error": """
        import torch

        def restore(model, path):
            sd = torch.load(path)
            try:
                model.load_state_dict(sd)
            except RuntimeError:
                model.load_state_dict(sd, strict=False)
    """,
}


@pytest.mark.parametrize("source", list(QUIET.values()), ids=list(QUIET))
def test_no_evidence_of_a_mismatch_is_quiet(source: str) -> None:
    assert _codes(source) == []


@pytest.mark.parametrize("source", list(REPORTED.values()), ids=list(REPORTED))
def test_the_look_alike_stays_reported(source: str) -> None:
    assert _codes(source) == ["ST012"]


# --- red team (stop 55): the evidence rules' edges ---------------------------------------------
def test_a_long_chain_of_names_is_followed_without_recursion() -> None:
    chain = "".join(f"    a{i + 1} = a{i}\n" for i in range(400))
    source = (
        "import torch\n\ndef restore(model, p):\n    a0 = torch.load(p)\n"
        + chain
        + "    model.load_state_dict(a400, strict=False)\n"
    )
    assert [d.code for d in check_source(source, "s.py", select=["ST012"])] == ["ST012"]


RED_TEAM_REPORTED = {
    "the-project's-load-helper": """
        from utils import load

        def restore(model, p):
            model.load_state_dict(load(p), strict=False)
    """,
    "a-module-from-a-file": """
        import torch

        def restore(model, p):
            model.load_state_dict(torch.load(p).state_dict(), strict=False)
    """,
    "a-scripted-module-from-a-file": """
        import torch

        def restore(model, p):
            ckpt = torch.jit.load(p)
            model.load_state_dict(ckpt.state_dict(), strict=False)
    """,
    "a-fallback-to-another-file": """
        import torch

        def restore(model, p, q):
            try:
                model.load_state_dict(torch.load(p))
            except RuntimeError as e:
                print(e)
                model.load_state_dict(torch.load(q), strict=False)
    """,
    "a-fallback-for-a-missing-file": """
        import torch

        def restore(model, p, sd):
            try:
                model.load_state_dict(sd)
            except FileNotFoundError as e:
                print("missing", e)
                model.load_state_dict(sd, strict=False)
    """,
    "a-try-that-was-not-strict": """
        import torch

        def restore(model, p, cfg):
            sd = torch.load(p)
            try:
                model.load_state_dict(sd, strict=cfg.strict)
            except RuntimeError as e:
                print(e)
                model.load_state_dict(sd, strict=False)
    """,
}


@pytest.mark.parametrize("source", list(RED_TEAM_REPORTED.values()), ids=list(RED_TEAM_REPORTED))
def test_red_team_look_alikes_stay_reported(source: str) -> None:
    assert _codes(source) == ["ST012"]
