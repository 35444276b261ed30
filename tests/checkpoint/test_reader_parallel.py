"""Large reads split over torch's threads (``_reader.readinto``): the same bytes, the same
truncation error, in a forked child too; the size threshold is lowered so small files take it."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import pytest
import torch

from safetorch.checkpoint import _reader
from safetorch.errors import CheckpointError


@pytest.fixture
def parallel(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_reader, "PARALLEL_BYTES", 1)
    monkeypatch.setattr(_reader, "PARALLEL_CHUNK", 4096 + 8)  # chunks not aligned to elements
    monkeypatch.setattr(torch, "get_num_threads", lambda: 3)


def test_parallel_read_fills_the_tensor_exactly(tmp_path: Path, parallel: None) -> None:
    data = os.urandom(100_003)
    (tmp_path / "f").write_bytes(b"x" * 7 + data)
    dest = torch.empty(len(data), dtype=torch.uint8)
    version = dest._version
    with _reader.open_regular(tmp_path / "f", "checkpoint") as f:
        f.readinto(dest, 7)
    assert bytes(dest.tolist()) == data
    assert dest._version > version  # bumped, as copy_ would


def test_parallel_read_of_a_truncated_file_raises(tmp_path: Path, parallel: None) -> None:
    (tmp_path / "f").write_bytes(os.urandom(50_000))
    dest = torch.empty(50_000, dtype=torch.uint8)
    with _reader.open_regular(tmp_path / "f", "checkpoint") as f:
        os.truncate(tmp_path / "f", 20_000)  # after the size check: the reads come up short
        with pytest.raises(CheckpointError, match="truncated while it was being read"):
            f.readinto(dest, 0)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork: POSIX only")
def test_parallel_read_in_a_forked_child(tmp_path: Path, parallel: None) -> None:
    data = os.urandom(30_000)
    (tmp_path / "f").write_bytes(data)
    with _reader.open_regular(tmp_path / "f", "checkpoint") as f:
        f.readinto(torch.empty(len(data), dtype=torch.uint8), 0)  # the parent's pool exists
    with warnings.catch_warnings():  # Python >= 3.12 warns on fork with threads alive
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # the child: a pool of its own, not the parent's vanished threads
        ok = False
        try:
            dest = torch.empty(len(data), dtype=torch.uint8)
            with _reader.open_regular(tmp_path / "f", "checkpoint") as f:
                f.readinto(dest, 0)
            ok = bytes(dest.tolist()) == data
        finally:
            os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
