"""``safetorch ckpt`` against hostile inputs (issue 21): planted modules in the working
directory, expanded views under a memory cap, and every failure as one line on stderr with
exit status 1 or 2 (130 when interrupted), never a traceback, never a hang."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import List

import pytest
import torch

from safetorch._cli import main
from safetorch.checkpoint import _cli_fit, _cli_inspect

TIMEOUT = 120  # seconds a child may take (torch's import included)


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}


def _runner(tmp_path: Path) -> Path:
    """A launcher like the ``safetorch`` console script: sys.path[0] is its own folder, the
    working directory is not on sys.path (as `python -m` or `-c` would put it)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / "safetorch_cli.py"
    script.write_text("import sys\nfrom safetorch._cli import main\nsys.exit(main())\n")
    return script


def _cap_memory() -> None:  # in the child, before exec: 6 GB of address space
    # (a CUDA build of torch maps ~3 GB of libraries at import; the expanded views ask 16 GB)
    resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))


def _run(args: List[str], cwd: Path, runner: Path, capped: bool = False):
    return subprocess.run(
        [sys.executable, str(runner), "ckpt", *args],
        cwd=cwd,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        preexec_fn=_cap_memory if capped else None,
    )


def _one_line(err: str, command: str) -> str:
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"safetorch ckpt {command}: "), lines[0]
    return lines[0]


# --- (a) fit never lets the working directory shadow installed packages ---------------------
def test_fit_ignores_planted_modules_and_finds_the_users_own(tmp_path: Path) -> None:
    pytest.importorskip("safetensors")  # the user's model imports it
    work = tmp_path / "downloaded_checkpoint"
    work.mkdir()
    marker = tmp_path / "PWNED"
    for planted in ("safetensors", "numpy", "torch", "typing_extensions"):
        (work / f"{planted}.py").write_text(
            f"open({str(marker)!r}, 'a').write({planted!r} + '\\n')\n"
        )
    (work / "layers.py").write_text("import torch\nWIDTH = 2\n")  # a sibling the model imports
    (work / "my_model.py").write_text(
        textwrap.dedent(
            """
            import numpy, safetensors, torch
            import layers

            def build():
                import layers as again  # a lazy sibling import inside the factory
                return torch.nn.Linear(again.WIDTH, layers.WIDTH)
            """
        )
    )
    torch.save(torch.nn.Linear(2, 2).state_dict(), work / "model.pt")
    out = _run(["fit", "model.pt", "--model", "my_model:build"], work, _runner(tmp_path))
    assert not marker.exists(), marker.read_text()
    assert out.returncode == 0, out.stderr
    assert "fits: st.load_state_dict(model, path) loads every key" in out.stdout


def test_fit_in_process_keeps_installed_packages_first(tmp_path: Path, monkeypatch) -> None:
    site = tmp_path / "site"
    work = tmp_path / "work"
    site.mkdir()
    work.mkdir()
    (site / "st_hostile_pkg.py").write_text("ORIGIN = 'installed'\n")
    (work / "st_hostile_pkg.py").write_text("ORIGIN = 'planted'\n")
    (work / "st_hostile_model.py").write_text(
        "import torch, st_hostile_pkg\n"
        "def build():\n"
        "    assert st_hostile_pkg.ORIGIN == 'installed', st_hostile_pkg.ORIGIN\n"
        "    return torch.nn.Linear(2, 2)\n"
    )
    monkeypatch.chdir(work)
    monkeypatch.setattr(sys, "path", ["", *sys.path, str(site)])  # as `python -m` would
    for name in ("st_hostile_pkg", "st_hostile_model"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    before = list(sys.path)
    model = _cli_fit._model_from("st_hostile_model:build")
    assert isinstance(model, torch.nn.Linear)
    assert sys.modules["st_hostile_pkg"].ORIGIN == "installed"
    assert sys.path == before  # restored


# --- (b) bounded work on expanded views -----------------------------------------------------
@pytest.fixture
def expanded(tmp_path: Path) -> Path:
    d = tmp_path / "exp"
    d.mkdir()
    torch.save({"x": torch.zeros(1).expand(2**32)}, d / "zeros.pt")  # 4-byte storage, 16 GB view
    torch.save({"x": torch.ones(1).expand(2**32)}, d / "ones.pt")
    torch.save({"x": torch.zeros(2**17).as_strided((2**16, 2**16), (1, 1))}, d / "overlap.pt")
    assert (d / "zeros.pt").stat().st_size < 4096
    return d


@pytest.mark.slow
def test_expanded_views_are_bounded_under_a_memory_cap(tmp_path: Path, expanded: Path) -> None:
    pytest.importorskip("safetensors")  # one of the conversions writes .safetensors
    runner = _runner(tmp_path)
    same = _run(["diff", "zeros.pt", "zeros.pt"], expanded, runner, capped=True)
    assert same.returncode == 0 and "identical" in same.stdout, same.stderr
    other = _run(["diff", "zeros.pt", "ones.pt"], expanded, runner, capped=True)
    assert other.returncode == 1 and "values differ: x (max abs diff 1)" in other.stdout
    ovl = _run(["diff", "overlap.pt", "overlap.pt"], expanded, runner, capped=True)
    assert ovl.returncode == 2
    assert "cannot compare 'x'" in _one_line(ovl.stderr, "diff")
    for extra in ([], ["--to", "dcp"]):
        dst = "out.safetensors" if not extra else "out_dcp"
        conv = _run(["convert", "zeros.pt", dst, *extra], expanded, runner, capped=True)
        assert conv.returncode == 2, conv.stderr
        line = _one_line(conv.stderr, "convert")
        assert "'x'" in line and "16.0 GiB" in line and "--max-bytes" in line
        assert not (expanded / dst).exists()
    keep = _run(["convert", "zeros.pt", "views.pt"], expanded, runner, capped=True)
    assert keep.returncode == 0 and (expanded / "views.pt").stat().st_size < 4096


def test_small_expanded_buffers_still_convert(tmp_path: Path, capsys) -> None:
    pytest.importorskip("safetensors")
    src = tmp_path / "buf.pt"
    torch.save({"w": torch.ones(2, 2), "mask": torch.ones(1).expand(1000)}, src)
    assert main(["ckpt", "convert", str(src), str(tmp_path / "o.safetensors")]) == 0
    capsys.readouterr()
    dst = tmp_path / "limited.safetensors"
    argv = ["ckpt", "convert", str(src), str(dst), "--max-bytes", "100"]
    assert main(argv) == 2
    assert "'mask'" in _one_line(capsys.readouterr().err, "convert") and not dst.exists()


# --- (c) one error surface ------------------------------------------------------------------
@pytest.fixture
def hostile(tmp_path: Path) -> Path:
    d = tmp_path / "hostile"
    d.mkdir()
    os.mkfifo(d / "fifo.pt")
    (d / "dcp").mkdir()
    (d / "dcp" / ".metadata").write_bytes(b"\x80\x04garbage that is not a pickle")
    (d / "dcp" / "__0_0.distcp").write_bytes(b"junk")
    (d / "list").mkdir()
    (d / "list" / "model.safetensors.index.json").write_text("[1, 2, 3]")
    os.symlink("loop_b.pt", d / "loop_a.pt")
    os.symlink("loop_a.pt", d / "loop_b.pt")
    (d / "noweights").mkdir()
    (d / "noweights" / "README.md").write_text("nothing here")
    torch.save(torch.nn.Linear(2, 2).state_dict(), d / "ok.pt")
    (d / "hostile_models.py").write_text(
        "import torch\ndef build():\n    return torch.nn.Linear(2, 2)\n"
    )
    return d


FIFO_CASES = [
    ["inspect", "fifo.pt"],
    ["inspect", "fifo.pt", "--keys"],
    ["diff", "fifo.pt", "ok.pt"],
    ["convert", "fifo.pt", "out.pt"],
    ["verify", "fifo.pt"],
    ["fit", "fifo.pt", "--model", "hostile_models:build"],
]


@pytest.mark.parametrize("args", FIFO_CASES, ids=[" ".join(a) for a in FIFO_CASES])
def test_a_fifo_never_hangs(tmp_path: Path, hostile: Path, args: List[str]) -> None:
    out = _run(args, hostile, _runner(tmp_path))  # TimeoutExpired fails the test
    assert out.returncode in (1, 2), (out.returncode, out.stderr)
    assert "FIFO" in _one_line(out.stderr, args[0])


HOSTILE_CASES = [
    ["inspect", "dcp"],
    ["convert", "dcp", "out.pt"],
    ["inspect", "list/model.safetensors.index.json"],
    ["inspect", "list"],
    ["convert", "list/model.safetensors.index.json", "out.pt"],
    ["verify", "list/model.safetensors.index.json"],
    ["inspect", "loop_a.pt"],
    ["diff", "loop_a.pt", "ok.pt"],
    ["convert", "loop_a.pt", "out.pt"],
    ["verify", "loop_a.pt"],
    ["inspect", "noweights"],
    ["convert", "noweights", "out.pt"],
    ["verify", "noweights"],
]


@pytest.mark.parametrize("args", HOSTILE_CASES, ids=[" ".join(a) for a in HOSTILE_CASES])
def test_hostile_inputs_fail_in_one_line(
    hostile: Path, args: List[str], capsys, monkeypatch
) -> None:
    monkeypatch.chdir(hostile)
    status = main(["ckpt", *args])
    err = capsys.readouterr().err
    assert status in (1, 2), (status, err)
    _one_line(err, args[0])


def test_verify_reports_garbage_dcp_metadata_as_a_finding(hostile: Path, capsys) -> None:
    assert main(["ckpt", "verify", str(hostile / "dcp")]) == 1
    captured = capsys.readouterr()
    assert captured.err == "" and "Traceback" not in captured.out
    lines = captured.out.strip().splitlines()
    assert ".metadata: cannot read the DCP metadata" in lines[0]
    assert lines[-1].startswith(f"corrupt: {hostile / 'dcp'}: 1 problem (dcp, ")


def _raiser(exc: BaseException):
    def boom(*args, **kwargs):
        raise exc

    return boom


def _dcp_exception() -> BaseException:
    api = pytest.importorskip("torch.distributed.checkpoint.api")
    exc = api.CheckpointException("load failed", {0: (ValueError("bad"), None)})
    assert not isinstance(exc, Exception)  # a BaseException: `except Exception` misses it
    return exc


@pytest.mark.parametrize(
    "make,status,text",
    [
        (_dcp_exception, 2, "torch.distributed.checkpoint failed"),
        (lambda: RecursionError("maximum recursion depth exceeded"), 2, "nests too deeply"),
        (lambda: KeyboardInterrupt(), 130, "interrupted"),
        (lambda: MemoryError(), 1, "out of memory"),
        (lambda: TypeError("surprise"), 1, "failed with TypeError: surprise"),
    ],
    ids=["CheckpointException", "RecursionError", "KeyboardInterrupt", "MemoryError", "other"],
)
def test_every_exception_is_one_line(
    hostile: Path, make, status: int, text: str, capsys, monkeypatch
) -> None:
    monkeypatch.setattr(_cli_inspect, "inspect_checkpoint", _raiser(make()))
    assert main(["ckpt", "inspect", str(hostile / "ok.pt")]) == status
    assert text in _one_line(capsys.readouterr().err, "inspect")
