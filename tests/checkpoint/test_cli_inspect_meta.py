"""``ckpt inspect`` of a torch.save file reads its pickle and zip directory, not its tensor
data (issue 24.6): memory stays flat with the file's size."""

from __future__ import annotations

import pytest
import torch

from safetorch.checkpoint import _cli_inspect as cli


def _checkpoint(path):
    net = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.BatchNorm1d(4))
    tied = torch.nn.Linear(4, 4)
    torch.save(
        {
            "state_dict": torch.nn.DataParallel(net).state_dict(),
            "ema": {"a": tied.weight, "b": tied.weight, "c": tied.bias.half()},
            "epoch": 3,
        },
        path,
    )


def test_inspect_of_a_file_never_reads_tensor_data(tmp_path, monkeypatch):
    path = tmp_path / "m.pt"
    _checkpoint(path)
    if cli._meta_view(str(path)) is None:  # torch 1.13: no meta storages; inspect loads it
        pytest.skip("the meta view needs meta-device storages (torch >= 2.0)")
    full = dict(cli.inspect_checkpoint(str(path)))  # side by side: the meta view vs a full load
    monkeypatch.setattr(cli, "_meta_view", lambda p: None)
    loaded = cli.inspect_checkpoint(str(path))
    assert full == loaded
    assert full["tensor_count"] == 10 and full["dtypes"] == {"float16": 1, "float32": 8, "int64": 1}
    monkeypatch.undo()

    def no_full_load(*args, **kwargs):
        raise AssertionError("inspect loaded the whole file")

    monkeypatch.setattr(cli, "_load_file", no_full_load)
    assert cli.inspect_checkpoint(str(path)) == full


def test_inspect_meta_view_refuses_a_storage_longer_than_its_record(tmp_path, ckpt_dirs):
    _dirs = ckpt_dirs
    path = tmp_path / "short.pt"
    torch.save({"w": torch.arange(64.0)}, path)
    assert _dirs.truncate_storage_record(str(path))
    with pytest.raises(cli.CheckpointError, match="claims 256 bytes"):
        cli.inspect_checkpoint(str(path))
