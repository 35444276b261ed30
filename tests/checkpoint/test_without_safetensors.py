"""Without the optional ``safetensors`` extra: every .safetensors path says how to install it.

The README promises the extra is optional. Here its absence is simulated (``sys.modules`` entries
set to None make ``import safetensors`` raise ImportError); the `noextras` row of
tools/compat.sh runs the same tests where the package is really not installed. Files are
written byte by byte (the format is an 8-byte header length, a JSON header, the data), so no
test here needs the package.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

import safetorch as st
from safetorch._cli import main
from safetorch.errors import CheckpointError

INSTALL = "pip install 'safetorch[safetensors]'"


@pytest.fixture
def no_safetensors(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [m for m in sys.modules if m == "safetensors" or m.startswith("safetensors.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "safetensors", None)
    monkeypatch.setitem(sys.modules, "safetensors.torch", None)


def _safetensors_file(path: Path) -> Path:
    header = b'{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}'
    path.write_bytes(len(header).to_bytes(8, "little") + header + b"\x00\x00\x80\x3f")
    return path


def _one_line_naming_the_extra(exc: BaseException) -> None:
    message = str(exc)
    assert INSTALL in message, message
    assert "\n" not in message, message


def test_loading_a_safetensors_file_names_the_extra(no_safetensors, tmp_path):
    path = _safetensors_file(tmp_path / "model.safetensors")
    with pytest.raises(CheckpointError) as info:
        st.load(path)
    _one_line_naming_the_extra(info.value)


def test_loading_a_sharded_safetensors_index_names_the_extra(no_safetensors, tmp_path):
    _safetensors_file(tmp_path / "model-00001-of-00001.safetensors")
    index = {"metadata": {}, "weight_map": {"w": "model-00001-of-00001.safetensors"}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    model = torch.nn.Module()
    model.register_parameter("w", torch.nn.Parameter(torch.zeros(1)))
    with pytest.raises(CheckpointError) as info:
        st.load_state_dict(model, tmp_path)
    _one_line_naming_the_extra(info.value)


def test_cli_convert_to_safetensors_is_one_line_naming_the_extra(no_safetensors, tmp_path, capsys):
    src = tmp_path / "a.pt"
    torch.save({"w": torch.ones(2)}, src)
    assert main(["ckpt", "convert", str(src), str(tmp_path / "m.safetensors")]) != 0
    err = capsys.readouterr().err.strip()
    assert INSTALL in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "m.safetensors").exists()


def test_cli_inspect_of_a_safetensors_file_is_one_line_naming_the_extra(
    no_safetensors, tmp_path, capsys
):
    path = _safetensors_file(tmp_path / "model.safetensors")
    assert main(["ckpt", "inspect", str(path)]) != 0
    err = capsys.readouterr().err.strip()
    assert INSTALL in err and len(err.splitlines()) == 1, err


def test_torch_files_still_load_and_save_without_it(no_safetensors, tmp_path):
    path = tmp_path / "a.pt"
    st.save({"w": torch.ones(2)}, path)
    assert torch.equal(st.load(path)["w"], torch.ones(2))
