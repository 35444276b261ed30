"""safetorch._dist.broadcast_from_rank0: rank 0's result on every rank, through the store."""

from __future__ import annotations

import json
import math
import os
import pickle
import subprocess
import sys

import pytest

from safetorch import _dist

HERE = os.path.dirname(os.path.abspath(__file__))


def test_without_process_group_returns_the_value_itself():
    value = {"a": [1, 2]}
    assert _dist.broadcast_from_rank0(value) is value


@pytest.mark.parametrize(
    "value",
    [None, True, 3, -1.5, math.inf, "path", b"\x00", [1, (2, 3)], {"k": {4}}, frozenset({1})],
)
def test_plain_data_round_trips(value):
    assert _dist._loads(_dist._dumps(value)) == value


def test_nan_round_trips():
    assert math.isnan(_dist._loads(_dist._dumps(math.nan)))


@pytest.mark.parametrize("value", [os.getcwd, object(), pickle.PickleError("x")])
def test_anything_that_needs_a_global_is_refused(value):
    with pytest.raises(pickle.UnpicklingError, match="only plain data"):
        _dist._dumps(value)
    # and on the receiving side, whatever the bytes say
    with pytest.raises(pickle.UnpicklingError, match="refusing global"):
        _dist._loads(pickle.dumps(value))


@pytest.mark.dist
@pytest.mark.slow
def test_two_ranks_receive_rank0_result_and_teardown_never_hangs(tmp_path):
    rounds = 5  # five process-group lifetimes, each torn down (model, then process group)
    out = subprocess.run(
        [sys.executable, os.path.join(HERE, "_broadcast_worker.py"), str(tmp_path), str(rounds)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for r in results:
        assert r["rounds"] == rounds and r["ok"], r
    assert [r["refused"] for r in results] == ["TypeError", "RuntimeError"]
