"""A load is a pipeline: each stage once, in order, for every layout; a cold load imports only
what its layout needs.

The stages (docs/design.md): resolve (``_resolve.resolve``) -> open (``Layout.open``: every
file of the layout opened through the one reader) -> read and check (``Layout.meta_view``) ->
match (``keys._remap_state_dict``) -> apply (``Layout.load_into``) -> report (``LoadReport``).
A recorder wraps each stage's entry point and every file the reader opens; one load of each
layout must run the stages in that order with no return to an earlier one, and open no file
once the read stage has begun.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any, Callable, List

import pytest
import torch
from torch import nn

from safetorch import _compat
from safetorch.checkpoint import _conversions, _layouts, _reader, _resolve, model_state
from safetorch.checkpoint.report import LoadReport

ROOT = Path(__file__).resolve().parents[2]
STAGES = ["resolve", "open", "read", "match", "apply", "report"]


def _model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3), nn.Linear(3, 2))


def _dp_state(model: nn.Module) -> dict:
    return nn.DataParallel(model).state_dict()  # keys with DataParallel's "module."


def _file(sd: dict, where: Path) -> Path:
    torch.save({"state_dict": sd, "epoch": 1}, where / "ckpt.pt")
    return where / "ckpt.pt"


def _safetensors_index(sd: dict, where: Path) -> Path:
    pytest.importorskip("safetensors", reason="safetensors shards need the safetensors package")
    _conversions.save_sharded_safetensors(sd, str(where / "shards"), max_shard_bytes=64)
    return where / "shards" / _resolve.SAFETENSORS_INDEX


def _bin_index(sd: dict, where: Path) -> Path:
    names = {}
    directory = where / "bin"
    directory.mkdir()
    for i, key in enumerate(sd):
        name = f"pytorch_model-{i % 2 + 1:05d}-of-00002.bin"
        names[key] = name
    for name in sorted(set(names.values())):
        torch.save({k: sd[k] for k, n in names.items() if n == name}, directory / name)
    (directory / _resolve.BIN_INDEX).write_text(json.dumps({"weight_map": names}))
    return directory / _resolve.BIN_INDEX


def _dcp(sd: dict, where: Path) -> Path:
    """A DCP directory written by torch itself, with what the release offers on one process:
    ``dcp.save(checkpoint_id=)`` (2.3+), before it ``save_state_dict(no_dist=True)``."""
    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DCP's single-process notes, 2.2's deprecation
        if _compat.DCP_HAS_SAVE_LOAD:
            dcp.save(dict(sd), checkpoint_id=str(where / "dcp"))
        else:
            writer = dcp.FileSystemWriter(str(where / "dcp"))
            dcp.save_state_dict(dict(sd), storage_writer=writer, no_dist=True)
    return where / "dcp"


def _library_bin(sd: dict, where: Path) -> Path:
    directory = where / "hf"
    directory.mkdir()
    (directory / "config.json").write_text("{}")
    torch.save(sd, directory / "pytorch_model.bin")
    return directory


def _library_safetensors(sd: dict, where: Path) -> Path:
    safetensors = pytest.importorskip("safetensors.torch", reason="needs safetensors")
    directory = where / "hf_st"
    directory.mkdir()
    (directory / "config.json").write_text("{}")
    safetensors.save_file(sd, str(directory / "model.safetensors"))
    return directory


LAYOUTS = {
    "single file": (_file, "file"),
    "shard index (safetensors)": (_safetensors_index, "sharded index"),
    "shard index (.bin)": (_bin_index, "sharded index"),
    "DCP directory": (_dcp, "DCP directory"),
    "library directory (pytorch_model.bin)": (_library_bin, "file"),
    "library directory (model.safetensors)": (_library_safetensors, "safetensors file"),
}


def _recording(events: List[str], stage: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        events.append(stage)
        return fn(*args, **kwargs)

    return wrapper


def _instrument(monkeypatch: pytest.MonkeyPatch, events: List[str]) -> None:
    from safetorch.checkpoint import _dcp_load

    monkeypatch.setattr(_resolve, "resolve", _recording(events, "resolve", _resolve.resolve))
    classes = (
        _layouts.Layout,
        _layouts.FileLayout,
        _layouts.ShardedIndex,
        _layouts.SafetensorsFile,
        _dcp_load.DCPDirectory,
    )
    for cls in classes:
        for method, stage in (("open", "open"), ("meta_view", "read"), ("load_into", "apply")):
            if method in vars(cls):
                monkeypatch.setattr(cls, method, _recording(events, stage, vars(cls)[method]))
    match = _recording(events, "match", model_state._remap_state_dict)
    monkeypatch.setattr(model_state, "_remap_state_dict", match)
    monkeypatch.setattr(model_state, "LoadReport", _recording(events, "report", LoadReport))
    opened = _recording(events, "file opened", _reader.RegularFile.__init__)
    monkeypatch.setattr(_reader.RegularFile, "__init__", opened)


def _collapse(events: List[str]) -> List[str]:
    out: List[str] = []
    for e in events:
        if e != "file opened" and (not out or out[-1] != e):
            out.append(e)
    return out


_NEEDS_DCP = pytest.mark.skipif(
    not _compat.HAS_DCP, reason="torch.distributed.checkpoint is public from torch 2.0"
)


def _layout_params(*names: str) -> list:
    """The layouts as parameters; the DCP one skips (with its reason) on a torch without DCP."""
    return [pytest.param(n, marks=_NEEDS_DCP) if n == "DCP directory" else n for n in names]


@pytest.mark.parametrize("layout", _layout_params(*LAYOUTS))
def test_a_load_runs_each_stage_once_in_order(
    layout: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import safetorch as st

    source = _model(0)
    write, kind = LAYOUTS[layout]
    path = write(_dp_state(source), tmp_path)
    assert _resolve.resolve(path).kind == kind  # the layout this case means
    events: List[str] = []
    _instrument(monkeypatch, events)
    target = _model(1)
    report = st.load_state_dict(target, path)

    assert report.ok, report
    for name, value in source.state_dict().items():
        assert torch.equal(target.state_dict()[name], value), name
    assert _collapse(events) == STAGES, events
    first_read = events.index("read")
    assert "file opened" not in events[first_read:], (
        f"a file was opened after the read stage began: {events}"
    )


def test_a_refused_strict_load_reports_straight_after_matching(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import safetorch as st

    path = _file(_dp_state(_model(0)), tmp_path)
    events: List[str] = []
    _instrument(monkeypatch, events)
    with pytest.raises(st.CheckpointMismatchError):
        st.load_state_dict(nn.Linear(4, 3), path)
    assert _collapse(events) == ["resolve", "open", "read", "match", "report"], events


# What a cold load of one layout must not import: the saver, resume state, RNG, DCP, the CLI,
# integrity verification, provenance (only for a file weights-only loading refuses), writers.
_NOT_FOR_A_FILE = (
    "safetorch.checkpoint.saver",
    "safetorch.checkpoint.saving",
    "safetorch.checkpoint.state",
    "safetorch.checkpoint._rng",
    "safetorch.checkpoint._dcp",
    "safetorch.checkpoint._dcp_load",
    "safetorch.checkpoint.cli",
    "safetorch.checkpoint.verify",
    "safetorch.checkpoint._provenance",
    "safetorch.checkpoint._conversions",
    "safetorch._atomic",
    "safetorch._dist",
    "torch.distributed.checkpoint",
)


@pytest.mark.parametrize(
    "layout", _layout_params("single file", "shard index (.bin)", "DCP directory")
)
def test_a_cold_load_imports_only_what_its_layout_needs(layout: str, tmp_path: Path) -> None:
    write, _ = LAYOUTS[layout]
    path = write(_dp_state(_model(0)), tmp_path)
    code = (
        "import sys, torch, json\n"
        "torch.manual_seed(1)\n"
        "model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3),"
        " torch.nn.Linear(3, 2))\n"
        "import safetorch as st\n"
        f"assert st.load_state_dict(model, {str(path)!r}).ok\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    imported = set(json.loads(out.stdout))
    needed = {"safetorch.checkpoint._dcp", "safetorch.checkpoint._dcp_load"}
    if layout == "DCP directory":
        needed.add("torch.distributed.checkpoint")
        if not _compat.DCP_HAS_SAVE_LOAD:  # load_state_dict needs no_dist= when no group is up
            needed.add("safetorch._dist")
    unneeded = [m for m in _NOT_FOR_A_FILE if m in imported and m not in needed]
    assert not unneeded, f"a cold load of a {layout} imported {unneeded}"
    if layout == "DCP directory":
        assert needed <= imported  # the check looks where it should


@pytest.mark.parametrize("mmap", [False, True])
def test_st_load_opens_the_file_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mmap: bool
) -> None:
    """The sniff, the zip directory, the scan and torch's reader all read the one file object
    the reader opened; a memory-mapped load maps the path as well (torch's own map)."""
    import builtins

    import safetorch as st

    path = tmp_path / "m.pt"
    torch.save({"w": torch.arange(4.0)}, path)
    opens: List[str] = []
    real_os_open, real_open = os.open, builtins.open

    def os_open(p: Any, *args: Any, **kwargs: Any) -> int:
        opens.append(os.fsdecode(p))
        return real_os_open(p, *args, **kwargs)

    def py_open(p: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(p, (str, bytes, os.PathLike)):
            opens.append(os.fsdecode(p))
        return real_open(p, *args, **kwargs)

    monkeypatch.setattr(os, "open", os_open)
    monkeypatch.setattr(builtins, "open", py_open)
    loaded = st.load(path, mmap=mmap)
    assert torch.equal(loaded["w"], torch.arange(4.0))
    # mmap: torch maps the path too (torch >= 2.1; before, there is no map and one read)
    assert opens.count(str(path)) == (2 if mmap and _compat.LOAD_HAS_MMAP else 1), opens
