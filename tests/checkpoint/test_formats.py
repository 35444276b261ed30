"""The one format sniffer: st.load, `safetorch ckpt inspect` and the scanner agree on it."""

from __future__ import annotations

import io
import tarfile

import pytest
import torch

import safetorch as st
from safetorch.checkpoint import _formats
from safetorch.checkpoint._cli_source import _format_of


def _zip(tmp_path):
    path = tmp_path / "a.pt"
    torch.save({"w": torch.ones(2)}, path)
    return path


def _legacy(tmp_path):
    path = tmp_path / "b.pt"
    torch.save({"w": torch.ones(2)}, path, _use_new_zipfile_serialization=False)
    return path


def _tar(tmp_path):
    path = tmp_path / "c.tar"
    inner = tmp_path / "pickle"
    inner.write_bytes(b"x")
    with tarfile.open(path, "w") as tar:
        tar.add(inner, arcname="pickle")
    return path


def _safetensors(tmp_path):
    header = b'{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}'
    path = tmp_path / "d.bin"  # not named .safetensors: the bytes decide
    path.write_bytes(len(header).to_bytes(8, "little") + header + b"\x00\x00\x80\x3f")
    return path


@pytest.mark.parametrize(
    "make,kind",
    [(_zip, "zip"), (_legacy, "legacy"), (_tar, "tar"), (_safetensors, "safetensors")],
)
def test_sniff_path_and_file_object_agree(tmp_path, make, kind):
    path = make(tmp_path)
    assert _formats.sniff(path) == kind == _formats.sniff(str(path))
    with open(path, "rb") as fh:
        fh.seek(0)
        assert _formats.sniff(fh) == kind
        assert fh.tell() == 0  # the position is restored
    # ckpt inspect names the same format (tar reads as legacy there, as before)
    assert _format_of(str(path)) == (kind if kind != "tar" else "legacy")


def test_sniff_edge_cases():
    assert _formats.sniff(io.BytesIO(b"")) == "empty"
    assert _formats.sniff("x.safetensors") == "safetensors"  # decided by the name
    # a '{' at byte 8 with an absurd header length is not safetensors
    assert _formats.sniff(io.BytesIO((10**12).to_bytes(8, "little") + b"{")) == "legacy"


def test_st_load_follows_the_sniffer(tmp_path):
    with pytest.raises(st.CheckpointError, match="legacy tar format"):
        st.load(_tar(tmp_path))
    assert torch.equal(st.load(_legacy(tmp_path))["w"], torch.ones(2))
    path = tmp_path / "junk.pt"
    path.write_bytes(b"hello world, not a checkpoint")
    with pytest.raises(st.CheckpointError, match="not a PyTorch checkpoint"):
        st.load(path)
