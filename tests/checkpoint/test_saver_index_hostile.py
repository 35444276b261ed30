"""A hostile ``checkpoints.json`` (a downloaded CheckpointSaver directory): every name it holds is
resolved inside the directory, pruning deletes only what the saver writes, and the index is read
through the checkpoint reader (issue "Trust a checkpoint for where it came from", item 6)."""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path
from typing import Any, Dict, Tuple

import pytest
import torch

import safetorch as st
from safetorch.errors import CheckpointError


@pytest.fixture
def run(tmp_path: Path) -> Tuple[Path, Path]:
    """(the saver directory, a sentinel file outside it)."""
    outside = tmp_path / "outside"
    outside.mkdir()
    sentinel = outside / "sentinel.txt"
    sentinel.write_text("precious")
    directory = tmp_path / "run"
    directory.mkdir()
    return directory, sentinel


def _index(directory: Path, files: Any, **extra: Any) -> None:
    states = [{"epoch": i, "metric": 1.0, "file": f} for i, f in enumerate(files)]
    body: Dict[str, Any] = {"mode": "min", "last": states[-1] if states else None, "best": None}
    body.update(states=states, **extra)
    (directory / "checkpoints.json").write_text(json.dumps(body))


def _save_one(directory: Path) -> None:
    saver = st.CheckpointSaver(directory, max_history=1, top_k=0)
    saver.save_state(epoch=99, metric=None, model=torch.nn.Linear(1, 1))


def _refused(directory: Path, *words: str) -> str:
    """The saver refuses the index with one clear CheckpointError: it names the index, says
    what is wrong (``words``) and the way out; nothing is written or deleted."""
    before = sorted(os.listdir(directory))
    with pytest.raises(CheckpointError) as info:
        _save_one(directory)
    text = str(info.value)
    assert str(directory / "checkpoints.json") in text
    assert "Delete it" in text and "fresh index" in text
    for word in words:
        assert word in text, text
    assert sorted(os.listdir(directory)) == before
    return text


def test_an_absolute_path_in_the_index_is_refused_not_deleted(run: Tuple[Path, Path]) -> None:
    directory, sentinel = run
    _index(directory, [str(sentinel.parent)])
    _refused(directory, "absolute path")
    assert sentinel.read_text() == "precious"


def test_a_dotdot_path_in_the_index_is_refused_not_deleted(run: Tuple[Path, Path]) -> None:
    directory, sentinel = run
    _index(directory, ["../outside"])
    _refused(directory, "'..'")
    assert sentinel.read_text() == "precious"


def test_a_state_name_that_is_a_symlink_out_of_the_directory_is_refused(
    run: Tuple[Path, Path],
) -> None:
    directory, sentinel = run
    (directory / "state-000000.pt").symlink_to(sentinel.parent, target_is_directory=True)
    _index(directory, ["state-000000.pt"])
    _refused(directory, "symlink", "outside")
    assert sentinel.read_text() == "precious"
    assert (directory / "state-000000.pt").is_symlink()


def test_a_file_the_saver_did_not_name_is_never_pruned(run: Tuple[Path, Path]) -> None:
    directory, sentinel = run
    (directory / "precious.pt").write_bytes(b"user data")
    _index(directory, ["precious.pt"])
    _refused(directory, "'precious.pt'", "state-<epoch>.pt")
    assert (directory / "precious.pt").read_bytes() == b"user data"


def test_a_subdirectory_the_saver_did_not_name_is_never_rmtreed(run: Tuple[Path, Path]) -> None:
    directory, _ = run
    (directory / "data").mkdir()
    (directory / "data" / "x.bin").write_bytes(b"x")
    _index(directory, ["data"])
    _refused(directory, "'data'")
    assert (directory / "data" / "x.bin").exists()


def test_a_state_named_directory_that_is_not_a_dcp_checkpoint_is_left(
    run: Tuple[Path, Path], caplog: pytest.LogCaptureFixture
) -> None:
    directory, _ = run
    odd = directory / "state-000000.pt"
    (odd / "nested").mkdir(parents=True)
    (odd / "nested" / "keep.txt").write_text("keep")
    _index(directory, ["state-000000.pt"])
    with caplog.at_level(logging.WARNING, logger="safetorch"):
        _save_one(directory)
    assert (odd / "nested" / "keep.txt").read_text() == "keep"
    assert "left" in caplog.text and "state-000000.pt" in caplog.text
    assert (directory / "state-000099.pt").is_file()


def test_a_state_named_symlink_inside_is_left_and_its_target_kept(run: Tuple[Path, Path]) -> None:
    directory, _ = run
    (directory / "mine.pt").write_bytes(b"mine")
    (directory / "state-000000.pt").symlink_to("mine.pt")
    _index(directory, ["state-000000.pt"])
    _save_one(directory)  # the link resolves inside: pruning runs, and never follows it
    assert (directory / "state-000000.pt").is_symlink()
    assert (directory / "mine.pt").read_bytes() == b"mine"


def test_a_fifo_index_is_refused_without_blocking(run: Tuple[Path, Path]) -> None:
    directory, _ = run
    fifo = directory / "checkpoints.json"
    os.mkfifo(fifo)
    outcome: Dict[str, BaseException] = {}

    def construct() -> None:
        try:
            st.CheckpointSaver(directory)
        except BaseException as exc:  # noqa: BLE001 - the outcome is the test
            outcome["exc"] = exc

    thread = threading.Thread(target=construct, daemon=True)
    thread.start()
    thread.join(timeout=20)
    blocked = thread.is_alive()
    if blocked:  # unblock the reader (old code: a plain open() waits for a writer)
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(timeout=5)
    assert not blocked, "reading a FIFO index blocked"
    exc = outcome["exc"]
    assert isinstance(exc, CheckpointError)
    assert "FIFO" in str(exc) and "Delete it" in str(exc) and str(fifo) in str(exc)


def test_a_directory_index_is_refused_clearly(run: Tuple[Path, Path]) -> None:
    directory, _ = run
    (directory / "checkpoints.json").mkdir()
    with pytest.raises(CheckpointError) as info:
        st.CheckpointSaver(directory)
    assert "a directory, not a regular file" in str(info.value)
    assert "Delete it" in str(info.value)


def test_a_deeply_nested_index_is_one_checkpoint_error(run: Tuple[Path, Path]) -> None:
    directory, _ = run
    (directory / "checkpoints.json").write_text("[" * 200_000 + "]" * 200_000)
    with pytest.raises(CheckpointError) as info:
        st.CheckpointSaver(directory)
    assert not isinstance(info.value, RecursionError)
    assert "nests deeper" in str(info.value) and "Delete it" in str(info.value)


def test_a_moderately_deep_value_is_refused_before_any_write(run: Tuple[Path, Path]) -> None:
    directory, _ = run
    deep: Any = 0
    for _ in range(200):
        deep = [deep]
    _index(directory, [], extra=deep)
    _refused(directory, "nests deeper")


def test_an_index_symlinked_out_of_the_directory_is_refused(run: Tuple[Path, Path]) -> None:
    directory, sentinel = run
    (directory / "checkpoints.json").symlink_to(sentinel)
    with pytest.raises(CheckpointError) as info:
        st.CheckpointSaver(directory)
    assert "outside" in str(info.value) and "Delete it" in str(info.value)
    assert sentinel.read_text() == "precious"


def test_an_oversized_index_is_refused_unread(run: Tuple[Path, Path]) -> None:
    directory, _ = run
    with open(directory / "checkpoints.json", "wb") as fh:
        fh.write(b"{}")
        fh.truncate(17 << 20)  # sparse: 17 MiB of nothing past the object
    with pytest.raises(CheckpointError) as info:
        st.CheckpointSaver(directory)
    assert "bytes, more than" in str(info.value)


@pytest.mark.parametrize(
    "body",
    [
        [],
        {"mode": "min", "states": {"file": "state-000000.pt"}},
        {"mode": "min", "states": [{"epoch": 0, "metric": 1.0, "file": 5}]},
        {"mode": "min", "states": [{"epoch": "0", "metric": 1.0, "file": "state-000000.pt"}]},
        {"mode": "min", "last": "state-000000.pt", "best": None},
        {"mode": "min", "best": {"epoch": 0, "metric": 1.0, "file": "../x.pt"}},
    ],
    ids=["list", "states-dict", "file-int", "epoch-str", "last-str", "best-dotdot"],
)
def test_a_malformed_index_is_one_checkpoint_error(run: Tuple[Path, Path], body: Any) -> None:
    directory, _ = run
    (directory / "checkpoints.json").write_text(json.dumps(body))
    _refused(directory)


def test_resume_refuses_a_state_symlinked_out_of_the_directory(run: Tuple[Path, Path]) -> None:
    directory, sentinel = run
    elsewhere = sentinel.parent / "state.pt"
    st.save_state(elsewhere, model=torch.nn.Linear(1, 1), epoch=7)
    (directory / "state-000007.pt").symlink_to(elsewhere)
    with pytest.raises(CheckpointError) as info:
        st.CheckpointSaver(directory).resume(model=torch.nn.Linear(1, 1))
    assert "outside the checkpoint directory" in str(info.value)


def test_the_way_out_works_and_own_files_are_still_pruned(run: Tuple[Path, Path]) -> None:
    directory, sentinel = run
    _index(directory, ["../outside"])
    _refused(directory)
    (directory / "checkpoints.json").unlink()  # what the error says to do
    saver = st.CheckpointSaver(directory, max_history=1, top_k=0)
    model = torch.nn.Linear(1, 1)
    for epoch in range(3):
        saver.save_state(epoch=epoch, model=model)
    assert sorted(os.listdir(directory)) == [
        ".checkpoints.json.lock",  # the index's lock (kept: see saver._exclusive_lock)
        "checkpoints.json",
        "state-000002.pt",
    ]
    # a DCP state directory (what save_state writes for a sharded model) is pruned whole
    dcp = directory / "state-000003.pt"
    dcp.mkdir()
    (dcp / ".metadata").write_bytes(b"m")
    (dcp / "__0_0.distcp").write_bytes(b"d")
    index = json.loads((directory / "checkpoints.json").read_text())
    index["states"].insert(0, {"epoch": 1, "metric": None, "file": "state-000003.pt"})
    (directory / "checkpoints.json").write_text(json.dumps(index))
    st.CheckpointSaver(directory, max_history=1, top_k=0).save_state(epoch=4, model=model)
    assert not dcp.exists()
    assert sentinel.read_text() == "precious"
