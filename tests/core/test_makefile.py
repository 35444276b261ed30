"""``make demo``/``make test`` take torch from PyTorch's CPU wheel index, unless a wheel of the
pinned version is reachable without one (checked with ``make -n``: nothing is installed)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import List

import pytest

ROOT = Path(__file__).resolve().parents[2]
CPU_INDEX = "https://download.pytorch.org/whl/cpu"

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def _recipe(*overrides: str) -> List[str]:
    """The commands ``make venv`` would run now that pyproject.toml changed (-W): printed only."""
    done = subprocess.run(
        ["make", "-n", "-W", "pyproject.toml", "venv", *overrides],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def _torch_line(lines: List[str]) -> str:
    (line,) = [ln for ln in lines if 'echo "installing ' in ln]
    return line


def test_torch_comes_from_the_cpu_index_unless_a_wheel_is_reachable() -> None:
    line = _torch_line(_recipe())
    assert "index='auto'" in line and f"index='{CPU_INDEX}'" in line
    # the probe asks pip for the pinned wheel without any index: a local wheel wins
    assert '--dry-run --ignore-installed --no-index --no-deps "torch==2.13.0"' in line
    assert '${index:+--index-url "$index"} "torch==2.13.0"' in line


def test_the_index_and_the_wheel_can_be_overridden() -> None:
    assert f"index='{CPU_INDEX}'; if" in _torch_line(_recipe(f"TORCH_INDEX={CPU_INDEX}"))
    assert "index=''; if" in _torch_line(_recipe("TORCH_INDEX="))
    local = _torch_line(_recipe("TORCH=/wheels/torch-2.13.0+cpu.whl", "TORCH_INDEX="))
    assert '"/wheels/torch-2.13.0+cpu.whl"' in local


def test_the_package_install_keeps_the_torch_just_installed() -> None:
    lines = _recipe()
    torch_at = next(i for i, ln in enumerate(lines) if 'echo "installing ' in ln)
    (dev,) = [ln for ln in lines if '-e ".[dev]"' in ln]
    assert lines.index(dev) > torch_at and '"torch==2.13.0"' in dev  # the same pin: no reinstall
