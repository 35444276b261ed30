"""safetorch ckpt inspect/convert on layouts: DCP directory <-> one file, safetensors shards."""

from __future__ import annotations

import contextlib
import io
import json
import os

import pytest
import torch

import safetorch as st
from safetorch import _compat
from safetorch._cli import main

pytest.importorskip("safetensors")


def _run(*argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def dp_file(tmp_path):
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Linear(30, 40), torch.nn.BatchNorm1d(40), torch.nn.Linear(40, 5)
    )
    path = tmp_path / "dp.pt"
    torch.save({"state_dict": torch.nn.DataParallel(net).state_dict(), "epoch": 4}, path)
    return path, net


def _equal(a, b):
    return list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.skipif(
    not _compat.HAS_DCP, reason="torch.distributed.checkpoint is public from torch 2.0"
)
def test_file_to_dcp_and_back_round_trips(tmp_path, dp_file):
    path, net = dp_file
    code, out, err = _run(
        "ckpt", "convert", str(path), str(tmp_path / "dcp"), "--to", "dcp", "--strip", "none"
    )
    assert code == 0, err
    assert {".metadata"} <= set(os.listdir(tmp_path / "dcp"))
    code, out, err = _run("ckpt", "inspect", str(tmp_path / "dcp"))
    assert code == 0, err
    assert "DCP directory" in out and "DCP shard" in out and "module. (DataParallel/DDP)" in out
    code, out, err = _run(
        "ckpt", "convert", str(tmp_path / "dcp"), str(tmp_path / "back.pt"), "--strip", "none"
    )
    assert code == 0, err
    original, back = st.load(path), st.load(tmp_path / "back.pt")
    assert back["epoch"] == 4 and _equal(original["state_dict"], back["state_dict"])
    model = torch.nn.Sequential(
        torch.nn.Linear(30, 40), torch.nn.BatchNorm1d(40), torch.nn.Linear(40, 5)
    )
    assert st.load_state_dict(model, tmp_path / "dcp").ok
    assert _equal(model.state_dict(), net.state_dict())


def test_file_to_safetensors_shards_with_index(tmp_path, dp_file):
    path, net = dp_file
    code, out, err = _run(
        "ckpt",
        "convert",
        str(path),
        str(tmp_path / "shards"),
        "--to",
        "safetensors",
        "--max-shard-size",
        "4KB",
        "--json",
    )
    assert code == 0, err
    summary = json.loads(out)
    assert summary["shards"] >= 2
    index = json.loads((tmp_path / "shards" / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(net.state_dict())  # wrapper segments stripped
    code, out, err = _run("ckpt", "inspect", str(tmp_path / "shards"), "--json")
    info = json.loads(out)
    assert info["layout"] == "sharded index" and info["state_dict_tensors"] == len(
        index["weight_map"]
    )
    roles = {f["file"]: f["role"] for f in info["files"]}
    assert roles["model.safetensors.index.json"].startswith("model weights")
    model = torch.nn.Sequential(
        torch.nn.Linear(30, 40), torch.nn.BatchNorm1d(40), torch.nn.Linear(40, 5)
    )
    assert st.load_state_dict(model, tmp_path / "shards").ok
    assert _equal(model.state_dict(), net.state_dict())


@pytest.mark.skipif(
    not _compat.HAS_DCP, reason="torch.distributed.checkpoint is public from torch 2.0"
)
def test_directory_outputs_refuse_existing_paths_and_bad_sizes(tmp_path, dp_file):
    path, _ = dp_file
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    code, _, err = _run("ckpt", "convert", str(path), str(tmp_path / "full"), "--to", "dcp")
    assert code == 2 and "exists" in err and err.count("\n") == 1
    code, _, err = _run(
        "ckpt",
        "convert",
        str(path),
        str(tmp_path / "s"),
        "--to",
        "safetensors",
        "--max-shard-size",
        "lots",
    )
    assert code == 2 and "size" in err and "Traceback" not in err
    code, _, err = _run(
        "ckpt",
        "convert",
        str(path),
        str(tmp_path / "o"),
        "--max-shard-size",
        "1GB",
        "--to",
        "torch",
    )
    assert code == 2 and "--to safetensors" in err  # alone, --max-shard-size implies it


def test_inspect_a_library_directory_names_the_model_file(tmp_path, dp_file):
    path, _ = dp_file
    run = tmp_path / "checkpoint-10"
    run.mkdir()
    os.replace(path, run / "pytorch_model.bin")
    torch.save({"state": {}}, run / "optimizer.pt")
    code, out, err = _run("ckpt", "inspect", str(run))
    assert code == 0, err
    assert "pytorch_model.bin" in out and "model weights (st.load_state_dict reads this)" in out
    assert "optimizer" in out
