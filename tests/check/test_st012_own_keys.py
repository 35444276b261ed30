"""ST012 sees two more ways code handles a non-strict load's keys (issue 33, stop 57, found on
the eleventh to fourteenth batches' findings, retired into development for ST012): a state dict
built key by key from the model's own ``state_dict()`` (every key the model has is filled, from
the file or from the model), and an ``assert`` that compares the model's own keys with what it
is about to load. Each idiom is written here in our own words; each quiet case sits beside the
look-alike that stays reported, and the torch run below shows why the first is no pitfall."""

from __future__ import annotations

import textwrap
from typing import List

import pytest

from safetorch.check import check_source


def _lines(source: str) -> List[int]:
    found = check_source(textwrap.dedent(source), "load.py", select=["ST012"])
    return [d.line for d in found if d.code == "ST012"]


FILLED = """
    import torch

    def restore(model, path):
        saved = torch.load(path, map_location="cpu")["model"]
        own = model.module.state_dict() if hasattr(model, "module") else model.state_dict()
        merged = {}
        for key, value in own.items():
            try:
                merged[key] = saved[key]
            except KeyError:
                merged[key] = value
        model.load_state_dict(merged, strict=False)
"""

# The look-alike: the loop runs over the file's keys, not the model's.
FROM_THE_FILE = FILLED.replace("for key, value in own.items():", "for key, value in saved.items():")

# A loop over the model's keys that writes another dict than the one loaded.
OTHER_DICT = FILLED.replace(
    "model.load_state_dict(merged, strict=False)", "model.load_state_dict(saved, strict=False)"
)

DIRECT = """
    import torch

    def restore(net, path):
        saved = torch.load(path)
        state = {}
        for key in net.state_dict():
            state[key] = saved[key]
        net.load_state_dict(state, strict=False)
"""

ASSERTED = """
    import os
    import torch

    def load_shards(model, folder):
        model_keys = sorted(model.state_dict().keys())
        shard_keys = sorted(f[:-3] for f in os.listdir(folder) if f.endswith(".pt"))
        for mine, theirs in zip(model_keys, shard_keys):
            assert mine == theirs, f"{mine} != {theirs}"
        for name in shard_keys:
            model.load_state_dict(torch.load(os.path.join(folder, name + ".pt")), strict=False)
"""

# The look-alike: the assert compares the shard names with each other, not with the model.
ASSERTED_ELSEWHERE = ASSERTED.replace(
    "for mine, theirs in zip(model_keys, shard_keys):",
    "for mine, theirs in zip(shard_keys, shard_keys):",
)

RAISED = """
    import torch

    def restore(model, path):
        names = set(model.state_dict())
        sd = torch.load(path)
        if names != set(sd):
            raise KeyError("checkpoint does not match the model")
        model.load_state_dict(sd, strict=False)
"""


@pytest.mark.parametrize("source", [FILLED, DIRECT, ASSERTED, RAISED])
def test_keys_handled_from_the_models_side_is_quiet(source: str) -> None:
    assert _lines(source) == []


@pytest.mark.parametrize("source", [FROM_THE_FILE, OTHER_DICT, ASSERTED_ELSEWHERE])
def test_the_look_alike_stays_reported(source: str) -> None:
    assert len(_lines(source)) == 1


def test_a_dict_filled_from_the_models_keys_misses_none_in_torch(tmp_path) -> None:
    # Side by side with torch: the file lacks a key and has one the model does not. The quiet
    # idiom, run as written, loads every key of the model (the missing one keeps the model's
    # value) and nothing else; the file's own dict, loaded non-strictly, silently misses one.
    torch = pytest.importorskip("torch")
    path = tmp_path / "ckpt.pt"
    torch.save({"model": {"weight": torch.ones(2, 2), "extra": torch.zeros(1)}}, path)
    namespace: dict = {}
    exec(textwrap.dedent(FILLED), namespace)
    model = torch.nn.Linear(2, 2)
    bias = model.bias.detach().clone()
    namespace["restore"](model, str(path))
    assert torch.equal(model.weight, torch.ones(2, 2)) and torch.equal(model.bias, bias)
    saved = torch.load(path, weights_only=True)["model"]
    silent = torch.nn.Linear(2, 2).load_state_dict(saved, strict=False)
    assert silent.missing_keys == ["bias"] and silent.unexpected_keys == ["extra"]


GUARDED = """
    import torch

    def restore(net, path, log):
        loaded = torch.load(path)["net"]
        own = net.state_dict()
        kept = {}
        for k, v in loaded.items():
            if k not in own or v.shape != own[k].shape:
                log("skip " + k)
                continue
            kept[k] = v
        net.load_state_dict(kept, strict=False)
"""

# The look-alike: the guard skips keys by their own name, never looking at the model's.
GUARDED_BY_NAME = GUARDED.replace(
    "if k not in own or v.shape != own[k].shape:", "if k.startswith('fc.'):"
)

TWIN = """
    import numpy as np
    import torch

    meta = np.load("keypoints.npz", allow_pickle=True)["meta"].item()
    joints = meta["num_joints"]
    train_model = torch.nn.Linear(joints, joints)
    eval_model = torch.nn.Linear(joints, joints)
    eval_model.load_state_dict(train_model.state_dict(), strict=False)
"""

# The look-alike: the module whose state dict is copied was itself read from a file.
TWIN_FROM_A_FILE = TWIN.replace(
    "train_model = torch.nn.Linear(joints, joints)", 'train_model = torch.load("whole.pt")'
)


@pytest.mark.parametrize("source", [GUARDED, TWIN], ids=["guarded", "twin"])
def test_guarded_by_the_models_keys_or_a_live_twin_is_quiet(source: str) -> None:
    assert _lines(source) == []


@pytest.mark.parametrize(
    "source", [GUARDED_BY_NAME, TWIN_FROM_A_FILE], ids=["guarded-by-name", "twin-from-a-file"]
)
def test_their_look_alikes_stay_reported(source: str) -> None:
    assert len(_lines(source)) == 1
