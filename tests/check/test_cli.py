"""``safetorch check`` on the command line: output formats, exit codes, --fix, --diff, -j."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path
from typing import List, Tuple

import pytest

from safetorch import _atomic
from safetorch._cli import main

LEGACY = """\
import torch
import torch.nn.functional as F

y = F.upsample(x, scale_factor=2)
sd = torch.load("a.pt")
torch.save(y, "./a.pt")  # what the file holds: a tensor (ST003's fix is offered)
"""
CLEAN = "import torch\nsd = torch.load('a.pt', map_location='cpu', weights_only=True)\n"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> Tuple[int, str, str]:
    code = main(["check", *argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def legacy(tmp_path: Path) -> Path:
    path = tmp_path / "legacy.py"
    path.write_text(LEGACY)
    return path


def test_text_output_and_exit_1(capsys: pytest.CaptureFixture[str], legacy: Path) -> None:
    code, out, err = run(capsys, str(legacy))
    assert code == 1
    lines = out.splitlines()
    assert [re.match(r".+:(\d+):(\d+): (ST\d{3}) ", ln).groups() for ln in lines] == [  # type: ignore[union-attr]
        ("4", "5", "ST001"),
        ("5", "6", "ST003"),  # ST004 is quiet: the file saves it from CPU tensors
    ]
    assert all(ln.startswith(f"{legacy}:") for ln in lines)
    assert "found 2 finding(s) (1 fixable with --fix, 1 more with --unsafe-fixes)" in err


def test_clean_file_exits_0(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "ok.py").write_text(CLEAN)
    assert run(capsys, str(tmp_path)) == (0, "", "All checks passed!\n")  # as ruff


def test_exit_zero(capsys: pytest.CaptureFixture[str], legacy: Path) -> None:
    code, out, _ = run(capsys, "--exit-zero", str(legacy))
    assert code == 0 and out.count("\n") == 2


def test_json_output(capsys: pytest.CaptureFixture[str], legacy: Path) -> None:
    code, out, _ = run(capsys, "--format", "json", str(legacy))
    assert code == 1
    data = json.loads(out)
    assert [d["code"] for d in data] == ["ST001", "ST003"]
    for d in data:
        assert set(d) == {"path", "line", "col", "end_line", "end_col", "code", "message", "fix"}
    assert data[0]["fix"]["edits"] == [
        {"line": 4, "col": 7, "end_line": 4, "end_col": 15, "content": "interpolate"}
    ]
    assert data[1]["fix"]["applicability"] == "unsafe"


def test_select_and_ignore(capsys: pytest.CaptureFixture[str], legacy: Path) -> None:
    _, out, _ = run(capsys, "--select", "ST003,ST004", "--ignore", "ST004", str(legacy))
    assert [ln.split(": ")[1].split()[0] for ln in out.splitlines()] == ["ST003"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--select", "XX9"], "unknown rule code 'XX9'"),
        (["--ignore", "ST9"], "unknown rule code 'ST9'"),
        (["does/not/exist.py"], "no such file or directory"),
        (["--fix", "--diff"], "exclude each other"),
        (["-j", "0"], "-j must be at least 1"),
        (["--explain", "ST999"], "unknown rule code 'ST999'"),
    ],
)
def test_usage_errors_exit_2(
    capsys: pytest.CaptureFixture[str], legacy: Path, argv: List[str], message: str
) -> None:
    paths = [] if argv == ["--explain", "ST999"] or "does/not" in argv[0] else [str(legacy)]
    code, out, err = run(capsys, *argv, *paths)
    assert code == 2 and out == ""
    assert message in err
    assert err.startswith("safetorch check: error: ") and err.count("\n") == 1  # one line


def test_argparse_errors_exit_2(capsys: pytest.CaptureFixture[str], legacy: Path) -> None:
    assert main(["check", "--format", "xml", str(legacy)]) == 2
    err = capsys.readouterr().err
    assert "invalid choice" in err and err.count("\n") == 1


def test_explain(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--explain", "ST005")
    assert code == 0
    assert out.startswith("ST005 (detach-then-inplace):")
    assert "st.safe_copy" in out and "Fix (unsafe" in out


def test_diff_prints_and_writes_nothing(capsys: pytest.CaptureFixture[str], legacy: Path) -> None:
    before = legacy.read_bytes()
    code, out, _ = run(capsys, "--diff", str(legacy))
    assert code == 1
    assert legacy.read_bytes() == before
    assert out.startswith(f"--- {legacy}\n+++ {legacy}\n")
    changed = [ln for ln in out.splitlines()[2:] if ln[:1] in "+-"]
    assert changed == [
        "-y = F.upsample(x, scale_factor=2)",
        "+y = F.interpolate(x, scale_factor=2)",
    ]
    # Not a strict module load: torch's own weights-only unpickler refuses plain data on some
    # torch before 2.6 (a float on 1.13, a torch.device on 2.1), so the fix is st.load ...
    _, out, _ = run(capsys, "--diff", "--unsafe-fixes", str(legacy))
    assert '+sd = st.load("a.pt", map_location="available")' in out.splitlines()
    assert "+import safetorch as st" in out.splitlines()
    # ... also with torch 2.0 declared; from 2.6 torch.load is weights-only: no finding.
    config = legacy.parent / "pyproject.toml"
    config.write_text('[tool.safetorch]\nmin-torch-version = "2.0"\n')
    _, out, _ = run(capsys, "--diff", "--unsafe-fixes", str(legacy))
    assert '+sd = st.load("a.pt", map_location="available")' in out.splitlines()
    config.write_text('[tool.safetorch]\nmin-torch-version = "2.6"\n')
    _, out, _ = run(capsys, "--diff", "--unsafe-fixes", "--select", "ST003", str(legacy))
    assert out == ""
    assert legacy.read_bytes() == before


def test_no_write_without_fix(capsys: pytest.CaptureFixture[str], legacy: Path) -> None:
    before = legacy.stat().st_mtime_ns, legacy.read_bytes()
    run(capsys, str(legacy))
    assert (legacy.stat().st_mtime_ns, legacy.read_bytes()) == before


def test_fix_writes_and_is_idempotent(capsys: pytest.CaptureFixture[str], legacy: Path) -> None:
    legacy.chmod(0o640)
    code, out, err = run(capsys, "--fix", str(legacy))
    # Plain --fix: only the safe upsample fix; ST003's needs --unsafe-fixes (min torch unknown).
    assert code == 1
    assert [ln.split(": ")[1].split()[0] for ln in out.splitlines()] == ["ST003"]
    assert "fixed 1 finding(s), found 1 finding(s) (1 more with --unsafe-fixes)" in err
    assert legacy.read_text() == LEGACY.replace("F.upsample(", "F.interpolate(")
    code, out, err = run(capsys, "--fix", "--unsafe-fixes", str(legacy))
    assert code == 0 and out == ""  # ST004 is quiet: the file saves it from CPU tensors
    assert "fixed 1 finding(s)" in err and "--unsafe-fixes" not in err
    fixed = legacy.read_text()
    assert fixed == LEGACY.replace("F.upsample(", "F.interpolate(").replace(
        'torch.load("a.pt")', 'st.load("a.pt", map_location="available")'
    ).replace("as F\n", "as F\nimport safetorch as st\n")
    assert stat.S_IMODE(legacy.stat().st_mode) == 0o640
    assert [p.name for p in legacy.parent.iterdir()] == ["legacy.py"]  # no temp file left
    code, _, err = run(capsys, "--fix", "--unsafe-fixes", str(legacy))
    assert legacy.read_text() == fixed and "fixed" not in err
    assert run(capsys, "--fix", "--ignore", "ST004", str(legacy))[0] == 0


@pytest.mark.parametrize(
    "encoded",
    [
        "# é\nx = net(a)\ny = x.detach().add_(1)\nx.sum().backward()\n".encode("utf-8-sig"),
        "# -*- coding: latin-1 -*-\n# é\nx = net(a)\ny = x.detach().add_(1)\nx.sum().backward()\n".encode(
            "latin-1"
        ),
        b"# crlf\r\nx = net(a)\r\ny = x.detach().add_(1)\r\nx.sum().backward()\r\n",
    ],
    ids=["bom", "latin-1", "crlf"],
)
def test_fix_keeps_encoding_and_newlines(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, encoded: bytes
) -> None:
    path = tmp_path / "m.py"
    path.write_bytes(encoded)
    assert run(capsys, "--select", "ST005", "--fix", str(path))[0] == 1  # an unsafe fix
    assert path.read_bytes() == encoded
    assert run(capsys, "--select", "ST005", "--fix", "--unsafe-fixes", str(path))[0] == 0
    assert path.read_bytes() == encoded.replace(b"detach()", b"detach().clone()")


def test_failed_write_leaves_original(
    capsys: pytest.CaptureFixture[str], legacy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def boom(src: str, dst: str) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(_atomic.os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        main(["check", "--fix", str(legacy)])
    assert legacy.read_text() == LEGACY
    assert [p.name for p in legacy.parent.iterdir()] == ["legacy.py"]


def test_syntax_error_reported_and_run_goes_on(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    (tmp_path / "a_bad.py").write_text("def f(:\n")
    (tmp_path / "b_legacy.py").write_text(LEGACY)
    (tmp_path / "c_latin1.py").write_bytes(b"x = '\xe9'\n")  # not UTF-8, no coding line
    code, out, _ = run(capsys, str(tmp_path))
    assert code == 1
    found = [(Path(ln.split(":")[0]).name, ln.split(": ")[1].split()[0]) for ln in out.splitlines()]
    assert found == [
        ("a_bad.py", "ST000"),
        ("b_legacy.py", "ST001"),
        ("b_legacy.py", "ST003"),
        ("c_latin1.py", "ST000"),
    ]


def test_directory_walk_skips_default_excludes(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    for sub in (".git", ".venv", "build", "dist", "__pycache__", "pkg.egg-info", "src/pkg"):
        (tmp_path / sub).mkdir(parents=True)
        (tmp_path / sub / "m.py").write_text(LEGACY)
    (tmp_path / "src" / "pkg" / "notes.txt").write_text(LEGACY)
    _, out, _ = run(capsys, str(tmp_path))
    assert {ln.split(":")[0] for ln in out.splitlines()} == {str(tmp_path / "src" / "pkg" / "m.py")}
    # A file named explicitly is checked even inside an excluded directory.
    code, out, _ = run(capsys, str(tmp_path / "build" / "m.py"))
    assert code == 1 and out


def test_noqa_suppresses(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "m.py"
    path.write_text("import torch\nsd = torch.load('a.pt')  # noqa: ST003, ST004\nx = 1  # noqa\n")
    assert run(capsys, "--select", "ST003,ST004", str(path))[0] == 0


def test_parallel_jobs_match_serial(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    for i in range(6):
        (tmp_path / f"m{i}.py").write_text(LEGACY if i % 2 else CLEAN)
    serial = run(capsys, str(tmp_path))
    parallel = run(capsys, "-j", "2", str(tmp_path))
    assert serial == parallel and serial[0] == 1
    assert run(capsys, "-j", "2", "--fix", str(tmp_path))[0] == 1
    assert all("upsample(" not in p.read_text() for p in tmp_path.glob("*.py"))


def test_console_entry_point(tmp_path: Path, legacy: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    out = subprocess.run(
        [sys.executable, "-m", "safetorch", "check", "--select", "ST001", str(legacy)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert out.returncode == 1, out.stderr
    assert out.stdout.startswith(f"{legacy}:4:5: ST001 F.upsample is deprecated")
