"""``safetorch check`` without torch, as a pre-commit hook, with [tool.safetorch], in CI formats."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import List, Tuple

import pytest

from safetorch._cli import COMMANDS, build_parser, main
from safetorch.check import check_source, fix_source
from safetorch.check.config import ConfigError, Settings, load_settings

REPO = Path(__file__).resolve().parents[2]
LEGACY = (
    "import torch\nimport torch.nn.functional as F\ny = F.upsample(x)\nsd = torch.load('a.pt')\n"
    # what a.pt holds: a tensor, saved from the CPU (ST003's fix is offered, ST004 is quiet)
    "torch.save(y, './a.pt')\n"
)

# Make `import torch` fail, then run what follows: a machine without torch.
_NO_TORCH = textwrap.dedent(
    """
    import sys
    class _NoTorch:
        def find_spec(self, name, path=None, target=None):
            if name == "torch" or name.startswith("torch."):
                raise ImportError("torch is not installed (blocked by the test)")
    sys.meta_path.insert(0, _NoTorch())
    try:
        import torch
    except ImportError:
        pass
    else:
        raise SystemExit("torch was importable")
    """
)


def _python(code: str, *args: str, cwd: Path = REPO) -> "subprocess.CompletedProcess[str]":
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-c", _NO_TORCH + textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=cwd,
        check=False,
    )


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> Tuple[int, str, str]:
    code = main(["check", *argv])
    out, err = capsys.readouterr()
    return code, out, err


# -- torch-free ------------------------------------------------------------------------------
def test_checker_runs_where_torch_cannot_be_imported(tmp_path: Path) -> None:
    path = tmp_path / "m.py"
    path.write_text(LEGACY)
    out = _python(
        """
        import runpy
        import safetorch.check as c
        assert [d.code for d in c.check_source(open(sys.argv[1]).read())] == [
            "ST001", "ST003"]
        from safetorch._cli import main
        assert main(["--version"]) == 0
        assert main(["--help"]) == 0
        assert main(["check", "--list-rules"]) == 0
        assert main(["check", sys.argv[1]]) == 1
        sys.argv = ["safetorch", "check", "--select", "ST001", sys.argv[1]]
        try:
            runpy.run_module("safetorch", run_name="__main__")   # python -m safetorch check
        except SystemExit as exc:
            assert exc.code == 1, exc.code
        assert "torch" not in sys.modules
        print("no torch")
        """,
        str(path),
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.rstrip().endswith("no torch")
    assert f"{path}:3:5: ST001" in out.stdout


def test_import_safetorch_stays_eager_on_first_use() -> None:
    out = subprocess.run(
        [sys.executable, "-c", "import sys, safetorch as st; a = 'torch' in sys.modules; "
         "st.load; print(a, 'torch' in sys.modules, 'load' in st.__all__)"],
        capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert out.stdout.split() == ["False", "True", "True"], out.stderr


def test_precommit_hook_runs_from_a_clone_without_site_packages(tmp_path: Path) -> None:
    hooks = (REPO / ".pre-commit-hooks.yaml").read_text()
    entries = set(re.findall(r"^\s*entry:\s*(\S+)", hooks, re.MULTILINE))
    assert entries == {"safetorch/check/precommit_hook.py"}
    assert "language: script" in hooks
    # pre-commit clones the repository and runs the entry from there: copy the package only.
    clone = tmp_path / "clone"
    shutil.copytree(REPO / "safetorch", clone / "safetorch", ignore=shutil.ignore_patterns("*.pyc"))
    hook = clone / "safetorch" / "check" / "precommit_hook.py"
    assert (REPO / "safetorch/check/precommit_hook.py").stat().st_mode & stat.S_IXUSR
    project = tmp_path / "project"
    project.mkdir()
    (project / "pyproject.toml").write_text("[tool.safetorch]\nignore = ['ST004']\n")
    (project / "a.py").write_text(LEGACY)
    (project / "ok.py").write_text("x = 1\n")
    # -S: no site-packages at all, so neither safetorch nor torch is installed.
    out = subprocess.run(
        [sys.executable, "-S", str(hook), "--force-exclude", "a.py", "ok.py"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=project,
        check=False,
    )
    assert out.returncode == 1, out.stderr
    codes = [ln.split()[1] for ln in out.stdout.splitlines()]
    if sys.version_info >= (3, 11):
        assert codes == ["ST001", "ST003"]  # ST004 ignored by the project's pyproject.toml
    else:  # no tomllib, and -S hides tomli: the configuration is ignored, with a warning
        assert codes == ["ST001", "ST003"]  # ST004: nothing shows the file holds CUDA tensors
        assert "tomli" in out.stderr
    fixed = subprocess.run(
        [sys.executable, "-S", str(hook), "--fix", "a.py"],
        capture_output=True, text=True, timeout=120, cwd=project, check=False,
    )  # fmt: skip
    assert fixed.returncode == 1  # ST003's fix is unsafe: reported, not applied
    assert "F.interpolate(x)" in (project / "a.py").read_text()
    assert "weights_only" not in (project / "a.py").read_text()


# -- top-level CLI ---------------------------------------------------------------------------
def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    import safetorch

    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"safetorch {safetorch.__version__}\n"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["nosuch"], "unknown command 'nosuch'"),
        (["--bogus"], "unrecognized option '--bogus'"),
        (["check", "--bogus", "x.py"], "unrecognized arguments: --bogus"),
    ],
)
def test_bad_usage_is_one_line(
    capsys: pytest.CaptureFixture[str], argv: List[str], message: str
) -> None:
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and message in err and err.count("\n") == 1 and "Traceback" not in err


def test_help_lists_what_every_area_registers(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    text = capsys.readouterr().out
    full = build_parser()
    registered = {}
    for action in full._subparsers._group_actions:  # type: ignore[union-attr]
        for choice in action._choices_actions:  # type: ignore[attr-defined]
            registered[choice.dest] = choice.help
    assert registered == {name: help_ for name, (_, help_) in COMMANDS.items()}
    for name in COMMANDS:
        assert name in text


# -- configuration ---------------------------------------------------------------------------
def _project(tmp_path: Path, config: str) -> Path:
    (tmp_path / "pyproject.toml").write_text(textwrap.dedent(config))
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.py").write_text(LEGACY)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "t.py").write_text(LEGACY)
    (tmp_path / "legacy").mkdir()
    (tmp_path / "legacy" / "old.py").write_text(LEGACY)
    return tmp_path


def _found(out: str, root: Path) -> List[Tuple[str, str]]:
    return [
        (os.path.relpath(ln.split(":")[0], root).replace(os.sep, "/"), ln.split()[1])
        for ln in out.splitlines()
    ]


def test_pyproject_select_ignore_per_file_exclude(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    root = _project(
        tmp_path,
        """
        [tool.safetorch]
        select = ["ST00"]
        ignore = ["ST004"]
        extend-exclude = ["legacy"]
        [tool.safetorch.per-file-ignores]
        "tests/*" = ["ST003"]
        """,
    )
    code, out, _ = run(capsys, str(root))
    assert code == 1
    assert _found(out, root) == [
        ("src/a.py", "ST001"),
        ("src/a.py", "ST003"),
        ("tests/t.py", "ST001"),
    ]
    # A file named explicitly is checked, unless --force-exclude.
    assert run(capsys, str(root / "legacy" / "old.py"))[0] == 1
    assert run(capsys, "--force-exclude", str(root / "legacy" / "old.py"))[0] == 0
    # --select replaces the configured select; --ignore adds to the configured ignore.
    _, out, _ = run(capsys, "--select", "ST004", str(root / "src"))
    assert out == ""
    _, out, _ = run(capsys, "--ignore", "ST001", str(root / "src"))
    assert _found(out, root) == [("src/a.py", "ST003")]
    _, out, _ = run(capsys, "--isolated", str(root / "src"))
    # ST004 is quiet: nothing shows the file holds CUDA tensors.
    assert [c for _, c in _found(out, root)] == ["ST001", "ST003"]


def test_min_torch_version_2_6_makes_the_default_load_safe(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # From torch 2.6 torch.load is weights-only by default: nothing to report or fix.
    src = "import torch\nsd = torch.load('a.pt', map_location='cpu')\n"
    old = Settings(min_torch=(2, 1))
    new = Settings(min_torch=(2, 6))
    assert [d.code for d in check_source(src, settings=old)] == ["ST003"]
    assert fix_source(src, settings=old) == src  # unsafe before 2.6
    assert check_source(src, settings=new) == []
    (tmp_path / "pyproject.toml").write_text(
        '[project]\ndependencies = ["torchvision>=0.1", "torch >= 2.6"]\n[tool.safetorch]\n'
    )
    assert load_settings(str(tmp_path / "pyproject.toml")).min_torch == (2, 6)
    path = tmp_path / "m.py"
    path.write_text(src)
    code, out, _ = run(capsys, str(path))
    assert code == 0 and "ST003" not in out


def test_syncbn_message_follows_the_minimum_torch() -> None:
    src = "import torch.nn as nn\nm = nn.SyncBatchNorm.convert_sync_batchnorm(m)\n"
    (old,) = check_source(src, select=["ST014"])
    (new,) = check_source(src, select=["ST014"], settings=Settings(min_torch=(2, 1)))
    assert "torch < 2.0" in old.message and "torch < 2.0" not in new.message
    assert "fails in training" not in old.message


@pytest.mark.parametrize(
    "config, message",
    [
        ("[tool.safetorch]\nselekt = ['ST001']\n", "unknown key(s) in [tool.safetorch]: selekt"),
        ("[tool.safetorch]\nignore = 3\n", "ignore must be a list"),
        ("[tool.safetorch]\nmin-torch-version = 'new'\n", "min-torch-version"),
        ("[tool.safetorch]\nselect = [\n", "invalid TOML"),
        ("[tool.safetorch]\nselect = ['XX1']\n", "unknown rule code 'XX1'"),
    ],
)
def test_bad_config_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, config: str, message: str
) -> None:
    (tmp_path / "pyproject.toml").write_text(config)
    (tmp_path / "m.py").write_text("x = 1\n")
    code, _, err = run(capsys, str(tmp_path / "m.py"))
    assert code == 2 and message in err and err.count("\n") == 1


def test_load_settings_rejects_unknown_keys(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text("[tool.safetorch]\nfix = true\n")
    with pytest.raises(ConfigError, match="unknown key"):
        load_settings(str(tmp_path / "pyproject.toml"))


# -- inputs and outputs ----------------------------------------------------------------------
def test_stdin_with_stdin_filename(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import io

    monkeypatch.setattr(sys, "stdin", io.StringIO(LEGACY))
    code, out, _ = run(capsys, "--isolated", "--stdin-filename", "pkg/m.py", "-")
    assert code == 1 and out.startswith("pkg/m.py:3:5: ST001 ")
    monkeypatch.setattr(sys, "stdin", io.StringIO(LEGACY))
    code, out, err = run(capsys, "--isolated", "--fix", "-")
    assert out == LEGACY.replace("F.upsample(", "F.interpolate(")  # fixed code on stdout
    assert "-:4:6: ST003" in err and code == 1


def test_unreadable_file_exits_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "ok.py").write_text(LEGACY)
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        # root reads every file; /proc/self/mem is a file that open() accepts and read() refuses
        target = Path("/proc/self/mem")
        if not target.is_file():
            pytest.skip("running as root without /proc/self/mem: no unreadable file to make")
    else:
        target = tmp_path / "secret.py"
        target.write_text("x = 1\n")
        target.chmod(0)
    code, out, err = run(capsys, "--isolated", str(tmp_path / "ok.py"), str(target))
    assert code == 2
    assert "ST001" in out  # the other files are still reported
    assert f"safetorch check: error: cannot read {target}" in err
    assert err.count("cannot read") == 1


def test_github_and_sarif_formats(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "m.py"
    path.write_text(LEGACY)
    code, out, err = run(capsys, "--isolated", "--output-format", "github", str(path))
    assert code == 1 and err == ""
    first = out.splitlines()[0]
    assert first.startswith(f"::error title=safetorch (ST001),file={path},line=3,col=5,")
    assert "::ST001 F.upsample is deprecated" in first
    code, out, _ = run(capsys, "--isolated", "--output-format", "sarif", str(path))
    log = json.loads(out)
    run0 = log["runs"][0]
    assert log["version"] == "2.1.0" and run0["tool"]["driver"]["name"] == "safetorch"
    assert [r["ruleId"] for r in run0["results"]] == ["ST001", "ST003"]
    rules = run0["tool"]["driver"]["rules"]
    for result in run0["results"]:
        assert rules[result["ruleIndex"]]["id"] == result["ruleId"]
    code, out, _ = run(capsys, "--isolated", "--json", str(path))
    data = json.loads(out)
    assert [d["fix"] and d["fix"]["applicability"] for d in data] == ["safe", "unsafe"]


def test_statistics_and_list_rules(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "m.py"
    path.write_text(LEGACY + "sd2 = torch.load('./a.pt')\n")
    code, out, _ = run(capsys, "--isolated", "--statistics", str(path))
    assert code == 1
    assert [ln.split("\t") for ln in out.splitlines()] == [
        ["2", "ST003", "[-]", "load-without-weights-only"],
        ["1", "ST001", "[*]", "deprecated-upsample-function"],
    ]
    code, out, _ = run(capsys, "--list-rules")
    assert code == 0
    assert re.search(r"^ST008 +bias-before-bn +fix: unsafe ", out, re.MULTILINE)
    assert re.search(r"^ST015 +positional-eps-in-norm +fix: manual ", out, re.MULTILINE)
