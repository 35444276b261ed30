"""`safetorch ckpt inspect|convert`."""

from __future__ import annotations

import io
import json
import os

import pytest
import torch

import safetorch as st
from safetorch import _compat
from safetorch._cli import main
from safetorch.checkpoint import cli as ckpt_cli


class _Evil:
    def __reduce__(self):
        return os.system, ("echo pwned",)


@pytest.fixture
def dp_checkpoint(tmp_path):
    net = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.BatchNorm1d(3))
    path = tmp_path / "dp.pt"
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    torch.save(
        {"state_dict": torch.nn.DataParallel(net).state_dict(), "optimizer": opt.state_dict()},
        path,
    )
    return path


def test_inspect_text_and_json(dp_checkpoint, capsys):
    assert main(["ckpt", "inspect", str(dp_checkpoint)]) == 0
    text = capsys.readouterr().out
    assert "container keys: state_dict, optimizer" in text
    assert "wrapper prefixes: module." in text and "unsafe globals: none" in text
    assert "dtypes: float32 (6), int64 (1)" in text
    assert main(["ckpt", "inspect", str(dp_checkpoint), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["tensor_count"] == 7 and info["state_dict_key"] == "state_dict"
    assert info["tensor_bytes"] == 4 * (6 + 3 + 3 * 4) + 8


def test_inspect_lists_unsafe_globals_without_running_them(tmp_path, capsys):
    path = tmp_path / "evil.pt"
    torch.save({"x": _Evil(), "y": eval}, path)
    assert main(["ckpt", "inspect", str(path)]) == 1
    out = capsys.readouterr().out
    assert "unsafe globals: posix.system, builtins.eval" in out
    assert "pwned" not in out


def test_inspect_corrupt_file(tmp_path, capsys):
    path = tmp_path / "bad.pt"
    path.write_bytes(b"PK\x03\x04garbage")
    assert main(["ckpt", "inspect", str(path)]) == 2
    assert "truncated or corrupt" in capsys.readouterr().err


def test_convert_strips_prefixes(dp_checkpoint, tmp_path, capsys):
    out = tmp_path / "plain.pt"
    assert main(["ckpt", "convert", str(dp_checkpoint), str(out)]) == 0
    ckpt = st.load(out)
    assert sorted(ckpt["state_dict"])[0] == "0.bias" and "optimizer" in ckpt
    assert "wrote" in capsys.readouterr().out
    net = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.BatchNorm1d(3))
    assert net.load_state_dict(ckpt["state_dict"])  # torch's own loader now accepts it


def test_convert_to_safetensors(dp_checkpoint, tmp_path):
    pytest.importorskip("safetensors")
    out = tmp_path / "m.safetensors"
    assert main(["ckpt", "convert", str(dp_checkpoint), str(out), "--to", "safetensors"]) == 0
    sd = st.load(out)
    assert "0.weight" in sd and all(isinstance(v, torch.Tensor) for v in sd.values())


def test_convert_strip_none_and_explicit_prefix(tmp_path):
    src = tmp_path / "lit.pt"
    torch.save({"state_dict": {"model.module.fc.weight": torch.ones(1)}}, src)
    ckpt_cli.convert_checkpoint(str(src), str(tmp_path / "a.pt"), strip="none")
    assert list(st.load(tmp_path / "a.pt")["state_dict"]) == ["model.module.fc.weight"]
    ckpt_cli.convert_checkpoint(str(src), str(tmp_path / "b.pt"), strip="model.")
    assert list(st.load(tmp_path / "b.pt")["state_dict"]) == ["fc.weight"]


class _FakeTTY(io.StringIO):
    def isatty(self):
        return True


@pytest.mark.parametrize(
    "tty,threshold,drawn", [(True, 0, True), (False, 0, False), (True, 10**9, False)]
)
def test_progress_only_on_tty_for_large_files(
    dp_checkpoint, tmp_path, monkeypatch, tty, threshold, drawn
):
    monkeypatch.setattr(ckpt_cli, "PROGRESS_MIN_BYTES", threshold)
    stream = _FakeTTY() if tty else io.StringIO()
    ckpt_cli.convert_checkpoint(str(dp_checkpoint), str(tmp_path / "o.pt"), progress_stream=stream)
    assert ("100.0%" in stream.getvalue()) is drawn


# torch < 2.0 has no Tensor.untyped_storage(); simulated on newer torch, Tensor.storage() warns.
@pytest.mark.filterwarnings("ignore:TypedStorage is deprecated:UserWarning")
@pytest.mark.parametrize("untyped", [True, False], ids=["untyped_storage", "torch_1.13_storage"])
def test_storage_accounting_on_every_torch(dp_checkpoint, simulate_torch, untyped):
    """inspect counts each shared storage once and convert clones aliased tensors, whichever of
    Tensor.untyped_storage() (2.0+) / Tensor.storage() (1.13) the installed torch has."""
    if untyped and not _compat.HAS_UNTYPED_STORAGE:
        pytest.skip("Tensor.untyped_storage() needs torch 2.0")
    base = torch.arange(6.0)
    sd = {"a": base[:3], "b": base[3:], "c": torch.ones(2, dtype=torch.float64)}
    with simulate_torch(HAS_UNTYPED_STORAGE=untyped and _compat.HAS_UNTYPED_STORAGE):
        info = ckpt_cli.inspect_checkpoint(str(dp_checkpoint))
        flat, dropped = ckpt_cli._for_safetensors(sd)
    assert info["tensor_count"] == 7 and info["tensor_bytes"] == 4 * (6 + 3 + 3 * 4) + 8
    assert dropped == [] and torch.equal(flat["b"], base[3:])
    ptrs = {k: v.data_ptr() for k, v in flat.items()}
    assert ptrs["a"] == base.data_ptr() and ptrs["b"] != base.data_ptr() + 12  # b was cloned
