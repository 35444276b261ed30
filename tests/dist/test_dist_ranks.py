"""tests/dist/_ranks.py: a rank that stops making progress fails the run, a slow one does not."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))

pytestmark = [pytest.mark.dist]


def _run_ranks(tmp_path, body: str, stall_s: float) -> "subprocess.CompletedProcess[str]":
    script = textwrap.dedent(
        """
        import sys, time
        sys.path.insert(0, {here!r})
        from _ranks import run_ranks, step

        def fn(rank):
        {body}

        run_ranks(fn, {tmp!r}, stall_s={stall_s}, preload=())
        """
    ).format(here=HERE, tmp=str(tmp_path), stall_s=stall_s, body=textwrap.indent(body, "    "))
    return subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )


def test_a_rank_that_stops_is_named_with_its_last_step_and_stack(tmp_path):
    body = """
step("setup done")
if rank == 1:
    time.sleep(600)  # the stand-in for a teardown that never returns
"""
    out = _run_ranks(tmp_path, body, stall_s=3)
    assert out.returncode != 0
    assert "ranks [1] hung" in out.stderr, out.stderr
    assert "rank 1 made no progress for 3 s after step 'setup done'" in out.stderr
    assert "in fn" in out.stderr  # its stack, from faulthandler


def test_slow_ranks_that_keep_reporting_pass(tmp_path):
    # 8 steps 1 s apart: 8 s in all, past the stall limit, never 5 s without a step
    body = """
for i in range(8):
    time.sleep(1.0)
    step(f"step {i}")
"""
    out = _run_ranks(tmp_path, body, stall_s=5)
    assert out.returncode == 0, out.stderr
