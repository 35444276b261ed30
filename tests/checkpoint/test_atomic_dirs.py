"""safetorch._atomic beyond single files: directory swaps (DCP), and every writer routed there."""

from __future__ import annotations

import os
from typing import Any, List

import pytest
import torch

from safetorch import _atomic, _compat
from safetorch.checkpoint import _conversions
from safetorch.patching import _hook


def _make_dir(path: Any, **files: str) -> str:
    os.mkdir(path)
    for name, text in files.items():
        with open(os.path.join(path, name), "w", encoding="utf-8") as fh:
            fh.write(text)
    return str(path)


posix_only = pytest.mark.skipif(os.name != "posix", reason="directories are fsynced on POSIX")


@pytest.fixture
def fsynced(monkeypatch: pytest.MonkeyPatch) -> List[str]:
    seen: List[str] = []
    real = _atomic._fsync_path
    monkeypatch.setattr(_atomic, "_fsync_path", lambda p: seen.append(p) or real(p))
    return seen


@posix_only
@pytest.mark.parametrize("existing", [None, "dir", "file"])
def test_replace_dir_swaps_in_the_new_directory(tmp_path, existing, fsynced) -> None:
    target = tmp_path / "ckpt"
    if existing == "dir":
        _make_dir(target, old="previous checkpoint")
    elif existing == "file":
        target.write_text("a previous single-file checkpoint")
    tmp = _make_dir(_atomic.temp_sibling(target), new="x")
    assert _atomic.replace_dir(tmp, target) == str(target)
    assert os.listdir(target) == ["new"]
    assert os.listdir(tmp_path) == ["ckpt"]  # no temp or aside copy left
    # the new files and the directories were fsynced before the rename, the parent after
    assert os.path.join(tmp, "new") in fsynced and fsynced[-1] == str(tmp_path)


def test_replace_dir_puts_the_previous_one_back_when_the_swap_fails(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = _make_dir(tmp_path / "ckpt", old="previous")
    tmp = _make_dir(_atomic.temp_sibling(target), new="x")
    real = os.replace

    def replace(src: str, dst: str) -> None:
        if src == tmp:
            raise OSError("disk full")
        real(src, dst)

    monkeypatch.setattr(_atomic.os, "replace", replace)
    with pytest.raises(OSError, match="disk full"):
        _atomic.replace_dir(tmp, target)
    assert os.listdir(target) == ["old"]


def test_atomic_write_dir_leaves_nothing_on_failure(tmp_path) -> None:
    target = _make_dir(tmp_path / "out", keep="me")

    def write(tmp: str) -> None:
        _make_dir(os.path.join(tmp, "half"))
        raise RuntimeError("writer died")

    with pytest.raises(RuntimeError, match="writer died"):
        _atomic.atomic_write_dir(target, write)
    assert os.listdir(tmp_path) == ["out"] and os.listdir(target) == ["keep"]


def test_directory_writers_name_the_missing_parent(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match=r"directory .*missing does not exist"):
        _atomic.atomic_write_dir(tmp_path / "missing" / "out", lambda tmp: None)
    assert os.listdir(tmp_path) == []


@pytest.mark.skipif(
    not _compat.HAS_DCP, reason="torch.distributed.checkpoint is public from torch 2.0"
)
def test_save_dcp_replaces_a_previous_directory(tmp_path) -> None:
    # The two directory swaps (save_dcp, save_state's DCP path) agreed on nothing but the
    # rename; both now replace an existing checkpoint, as every file writer does.
    target = str(tmp_path / "dcp")
    _conversions.save_dcp({"w": torch.zeros(2)}, target)
    _conversions.save_dcp({"w": torch.ones(2)}, target)
    assert torch.equal(_conversions.dcp_to_object(target)["w"], torch.ones(2))
    assert os.listdir(tmp_path) == ["dcp"]


@posix_only
def test_install_hook_writes_through_the_atomic_writer(tmp_path, fsynced) -> None:
    path = _hook.install(str(tmp_path))
    assert path == str(tmp_path / _hook.PTH_NAME)
    assert os.path.basename(fsynced[0]).startswith(f".{_hook.PTH_NAME}.")  # the temp file
    assert fsynced[1:] == [str(tmp_path)]  # then its directory, after the rename
    mask = os.umask(0)
    os.umask(mask)
    assert os.stat(path).st_mode & 0o777 == 0o666 & ~mask
    assert os.listdir(tmp_path) == [_hook.PTH_NAME]
