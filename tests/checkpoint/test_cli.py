"""`safetorch ckpt inspect|convert`."""

from __future__ import annotations

import collections
import io
import json
import os

import pytest
import torch

import safetorch as st
from safetorch import _compat
from safetorch._cli import main
from safetorch.checkpoint import _cli_convert, _cli_progress
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
    monkeypatch.setattr(_cli_progress, "PROGRESS_MIN_BYTES", threshold)
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
        flat, dropped = _cli_convert._for_safetensors(sd)
    assert info["tensor_count"] == 7 and info["tensor_bytes"] == 4 * (6 + 3 + 3 * 4) + 8
    assert dropped == [] and torch.equal(flat["b"], base[3:])
    ptrs = {k: v.data_ptr() for k, v in flat.items()}
    assert ptrs["a"] == base.data_ptr() and ptrs["b"] != base.data_ptr() + 12  # b was cloned


# --- inspect --keys, diff, fit, every state dict, known prefixes ------------------------------
@pytest.fixture
def lightning_like(tmp_path):
    net = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.BatchNorm1d(3))
    sd = {f"model.{k}": v for k, v in net.state_dict().items()}
    path = tmp_path / "lit.pt"
    torch.save({"state_dict": sd, "state_dict_ema": net.state_dict(), "epoch": 1}, path)
    (tmp_path / "fit_models.py").write_text(
        "import torch\n"
        "def build():\n"
        "    return torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.BatchNorm1d(3))\n"
        "def wider():\n"
        "    return torch.nn.Sequential(torch.nn.Linear(2, 4), torch.nn.BatchNorm1d(4))\n"
    )
    return path, net


def test_inspect_names_every_state_dict_and_lightning_prefix(lightning_like, capsys):
    path, _ = lightning_like
    assert main(["ckpt", "inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert "other state dicts: state_dict_ema (7 entries; key='state_dict_ema')" in out
    assert "wrapper prefixes: model. (Lightning's model attribute)" in out
    assert main(["ckpt", "inspect", str(path), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["state_dicts"] == {"state_dict": 7, "state_dict_ema": 7}


def test_inspect_keys_with_glob(dp_checkpoint, capsys):
    assert main(["ckpt", "inspect", str(dp_checkpoint), "--keys", "*.weight", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["schema_version"] == 1 and document["command"] == "inspect"
    rows = document["keys"]
    assert rows and all(r["key"].endswith(".weight") for r in rows)
    first = rows[0]
    assert first["key"].startswith("module.") and first["wrappers"] == ["module."]
    assert first["canonical"] == first["key"][len("module.") :]
    assert first["bytes"] == 4 * torch.Size(first["shape"]).numel()
    assert main(["ckpt", "inspect", str(dp_checkpoint), "--keys"]) == 0
    text = capsys.readouterr().out
    assert "wrapper: module." in text and "float32" in text


def test_diff_after_wrapper_normalisation(lightning_like, tmp_path, capsys):
    path, net = lightning_like
    torch.save(torch.nn.DataParallel(net).state_dict(), tmp_path / "dp.pt")
    assert main(["ckpt", "diff", str(path), str(tmp_path / "dp.pt")]) == 0
    assert "identical: 7 equal" in capsys.readouterr().out
    changed = collections.OrderedDict(net.state_dict())
    changed["0.bias"] = changed["0.bias"] + 0.25
    changed["1.weight"] = changed["1.weight"].double()
    del changed["1.bias"]
    changed["extra"] = torch.zeros(1)
    torch.save(changed, tmp_path / "b.pt")
    assert main(["ckpt", "diff", str(tmp_path / "dp.pt"), str(tmp_path / "b.pt"), "--json"]) == 1
    r = json.loads(capsys.readouterr().out)
    assert r["only_in_a"] == ["module.1.bias"] and r["only_in_b"] == ["extra"]
    assert r["dtype_changed"] == [["1.weight", "float32", "float64"]]
    assert r["value_changed"][0][0] == "0.bias" and abs(r["value_changed"][0][1] - 0.25) < 1e-6


def test_fit_says_what_load_state_dict_would_do(lightning_like, capsys, monkeypatch):
    path, _ = lightning_like
    monkeypatch.syspath_prepend(str(path.parent))
    assert main(["ckpt", "fit", str(path), "--model", "fit_models:build"]) == 0
    out = capsys.readouterr().out
    assert "fits:" in out and "stripped leading 'model.'" in out
    assert main(["ckpt", "fit", str(path), "--model", "fit_models:wider", "--json"]) == 1
    r = json.loads(capsys.readouterr().out)
    assert not r["ok"] and ["0.weight", [3, 2], [4, 2]] in r["mismatched"]


def test_fit_leaves_the_model_untouched(dp_checkpoint):
    from safetorch.checkpoint.cli import fit_checkpoint  # the public face of _cli_fit

    model = torch.nn.Sequential(torch.nn.Linear(2, 3))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    fit_checkpoint(str(dp_checkpoint), model)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_convert_key_writes_only_that_state_dict(lightning_like, tmp_path):
    path, net = lightning_like
    assert (
        main(["ckpt", "convert", str(path), str(tmp_path / "ema.pt"), "--key", "state_dict_ema"])
        == 0
    )
    assert sorted(st.load(tmp_path / "ema.pt")) == sorted(net.state_dict())


def test_save_into_missing_directory_names_target_not_temp_file(tmp_path):
    target = tmp_path / "no" / "such" / "ckpt.pt"
    with pytest.raises(FileNotFoundError) as info:
        st.save_checkpoint({"a": torch.ones(1)}, target)
    message = str(info.value)
    assert str(target) in message and str(tmp_path / "no") in message
    assert ".tmp" not in message and ".ckpt.pt." not in message
