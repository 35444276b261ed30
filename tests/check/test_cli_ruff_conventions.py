"""``safetorch check`` with ruff's conventions: ``.gitignore`` respected, ``.`` by default,
``-q``, ``--show-fixes``, the concise format, ``All checks passed!``, and a warning for a
mistyped ``[tool.safetorch]`` table."""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import List, Tuple

import pytest

from safetorch._cli import main
from safetorch.check import _gitignore
from safetorch.check.runner import iter_python_files

ROOT = Path(__file__).resolve().parents[2]
ENTRY_POINT = Path(sys.executable).with_name("safetorch")
FINDING = 'import torch\ntorch.load("x.pt")\n'  # ST003
FIXABLE = "import torch.nn.functional as F\ny = F.upsample_bilinear(x, scale_factor=2)\n"


def _run(*argv: str, cwd: Path) -> Tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    old = os.getcwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(list(argv))
    finally:
        os.chdir(old)
    return code, out.getvalue(), err.getvalue()


def _tree(root: Path, files: dict) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A git work tree (a .git directory is all the matcher looks for) with ignored files."""
    return _tree(
        tmp_path / "repo",
        {
            ".git/info/exclude": "local_*.py\n",
            ".gitignore": "out/\n*.gen.py\n!keep.gen.py\n/top_only.py\n",
            "src/.gitignore": "generated/\nscratch.py\n",
            "src/a.py": FINDING,
            "src/scratch.py": FINDING,
            "src/generated/g.py": FINDING,
            "src/top_only.py": FINDING,  # /top_only.py is anchored to the root: not this one
            "top_only.py": FINDING,
            "out/b.py": FINDING,
            "x.gen.py": FINDING,
            "keep.gen.py": FINDING,
            "local_notes.py": FINDING,
        },
    )


def _walked(root: Path, respect: bool = True) -> List[str]:
    found = iter_python_files([str(root)], respect_gitignore=respect)
    return sorted(os.path.relpath(p, root).replace(os.sep, "/") for p in found)


def test_gitignore_is_respected_while_walking(repo: Path) -> None:
    assert _walked(repo) == ["keep.gen.py", "src/a.py", "src/top_only.py"]
    assert len(_walked(repo, respect=False)) == 9


def test_check_skips_ignored_files_by_default(repo: Path) -> None:
    code, out, err = _run("check", cwd=repo)  # no PATH: the current directory
    assert code == 1
    reported = sorted(line.split(":")[0] for line in out.splitlines())
    assert reported == ["./keep.gen.py", "./src/a.py", "./src/top_only.py"]
    code, out, _ = _run("check", "--no-respect-gitignore", ".", cwd=repo)
    assert code == 1 and len(out.splitlines()) == 9


def test_files_named_explicitly_are_checked_even_when_ignored(repo: Path) -> None:
    code, out, _ = _run("check", "out/b.py", "local_notes.py", cwd=repo)
    assert code == 1 and [line.split(":")[0] for line in out.splitlines()] == [
        "out/b.py",
        "local_notes.py",
    ]
    code, out, _ = _run("check", "--force-exclude", "out/b.py", "src/a.py", cwd=repo)
    assert [line.split(":")[0] for line in out.splitlines()] == ["src/a.py"]  # pre-commit


def test_config_turns_gitignore_off(repo: Path) -> None:
    (repo / "pyproject.toml").write_text("[tool.safetorch]\nrespect-gitignore = false\n")
    assert len(_run("check", cwd=repo)[1].splitlines()) == 9
    assert len(_run("check", "--respect-gitignore", cwd=repo)[1].splitlines()) == 3


def test_bad_gitignore_options(repo: Path) -> None:
    code, _, err = _run("check", "--respect-gitignore", "--no-respect-gitignore", cwd=repo)
    assert code == 2 and "not allowed with argument" in err
    (repo / "pyproject.toml").write_text('[tool.safetorch]\nrespect-gitignore = "no"\n')
    code, out, err = _run("check", cwd=repo)
    assert code == 2 and out == ""
    assert "respect-gitignore must be true or false, got 'no'" in err


def test_outside_a_work_tree_gitignore_means_nothing(tmp_path: Path) -> None:
    plain = _tree(tmp_path / "plain", {".gitignore": "*.py\n", "a.py": FINDING})
    assert _walked(plain) == ["a.py"]


@pytest.mark.skipif(shutil.which("git") is None, reason="git is needed to compare with git")
def test_matching_agrees_with_git_check_ignore(tmp_path: Path) -> None:
    patterns = [
        "*.log",
        "!important.log",
        "/rooted",
        "deep/**/x.py",
        "**/cache",
        "doc/*.txt",
        "a?c.py",
        "[bc]at.py",
        "[!d]og.py",
        "trail/**",
        "esc\\#.py",
        "dir_only/",
        "sp\\ ace.py",
    ]
    paths = [
        "x.log",
        "sub/x.log",
        "important.log",
        "rooted",
        "sub/rooted",
        "deep/x.py",
        "deep/a/b/x.py",
        "cache",
        "a/b/cache",
        "doc/n.txt",
        "doc/sub/n.txt",
        "abc.py",
        "a/c.py",
        "bat.py",
        "cat.py",
        "mat.py",
        "dog.py",
        "fog.py",
        "trail/a/b.py",
        "esc#.py",
        "dir_only",
        "sp ace.py",
    ]
    work = tmp_path / "w"
    work.mkdir()
    subprocess.run(["git", "init", "-q", str(work)], check=True)
    (work / ".gitignore").write_text("\n".join(patterns) + "\n")
    (work / "dir_only").mkdir()
    done = subprocess.run(
        ["git", "-C", str(work), "check-ignore", "--no-index", "--stdin"],
        input="\n".join(paths) + "\n",
        capture_output=True,
        text=True,
    )
    by_git = set(done.stdout.split("\n")) - {""}
    matcher = _gitignore.Matcher()
    ours = {p for p in paths if matcher.ignored(str(work / p), (work / p).is_dir())}
    # git check-ignore decides a path alone, as Matcher.ignored (directories above not walked)
    assert ours == by_git


def test_quiet_prints_the_findings_and_nothing_else(repo: Path) -> None:
    (repo / "pyproject.toml").write_text("[tool.safetorc]\nselect = ['ST003']\n")
    code, out, err = _run("check", "-q", "src/a.py", cwd=repo)
    assert code == 1 and out.startswith("src/a.py:2:1: ST003 ") and err == ""
    _tree(repo, {"clean/ok.py": "x = 1\n"})
    code, out, err = _run("check", "--quiet", cwd=repo / "clean")
    assert code == 0 and out == "" and err == ""  # not even "All checks passed!"


def test_success_line(tmp_path: Path) -> None:
    _tree(tmp_path, {"ok.py": "x = 1\n"})
    code, out, err = _run("check", "ok.py", cwd=tmp_path)
    assert code == 0 and out == "" and err == "All checks passed!\n"
    code, out, err = _run("check", "ok.py", "--output-format", "json", cwd=tmp_path)
    assert code == 0 and out == "[]\n" and err == ""  # machine formats: the document only


def test_concise_format_is_ruffs_line(tmp_path: Path) -> None:
    _tree(tmp_path, {"a.py": FINDING})
    code, out, err = _run("check", "--output-format", "concise", "a.py", cwd=tmp_path)
    assert code == 1 and out.startswith("a.py:2:1: ST003 torch.load") and len(out.splitlines()) == 1
    assert "found 1 finding(s)" in err
    code, _, err = _run("check", "--output-format", "terse", "a.py", cwd=tmp_path)
    assert code == 2 and "invalid choice: 'terse'" in err and "'concise'" in err


def test_show_fixes(tmp_path: Path) -> None:
    _tree(tmp_path, {"f.py": FIXABLE, "g.py": FINDING})
    code, out, _ = _run("check", "--show-fixes", "f.py", "g.py", cwd=tmp_path)
    assert code == 1
    lines = out.splitlines()
    assert (
        lines[0].startswith("f.py:2:5: ST001 [*] ") and " [" not in lines[1].split("ST003")[1][:3]
    )
    code, out, err = _run("check", "--fix", "--show-fixes", "f.py", cwd=tmp_path)
    assert code == 0 and out == ""
    assert "Fixed 1 finding(s):\n- f.py:\n    1 x ST001 (" in err and "All checks passed!" in err
    _tree(tmp_path, {"f.py": FIXABLE})
    code, out, err = _run("check", "--diff", "--show-fixes", "f.py", cwd=tmp_path)
    assert code == 1 and out.startswith("---") and "Would fix 1 finding(s):" in err


def test_mistyped_table_is_named_in_a_warning(tmp_path: Path) -> None:
    _tree(tmp_path, {"a.py": FINDING, "pyproject.toml": '[tool.safetorc]\nignore = ["ST003"]\n'})
    code, out, err = _run("check", "a.py", cwd=tmp_path)
    assert code == 1 and "ST003" in out  # the settings were not applied ...
    assert "warning: " in err and "[tool.safetorc] is not a table safetorch reads" in err
    assert "did you mean [tool.safetorch]?" in err  # ... and the user is told why


@pytest.mark.parametrize(
    "tables, warned",
    [
        ("[tool.safetorch]\n[tool.safetorch-check]\nx = 1\n", ["safetorch-check"]),
        ("[tool.safetorch]\n[tool.safe-torch]\n", ["safe-torch"]),
        ("[tool.safetorch]\n[tool.safety]\n[tool.torch]\n[tool.pytorch]\n", []),
        ("[tool.safetorch.per-file-ignores]\n", []),
    ],
)
def test_which_tables_are_unknown(tmp_path: Path, tables: str, warned: List[str]) -> None:
    _tree(tmp_path, {"ok.py": "x = 1\n", "pyproject.toml": tables})
    code, _, err = _run("check", "ok.py", cwd=tmp_path)
    assert code == 0
    assert [
        w.split("[tool.")[1].split("]")[0] for w in err.splitlines() if "warning" in w
    ] == warned


def test_help_lists_the_conventions() -> None:
    code, out, _ = _run("check", "--help", cwd=ROOT)
    text = " ".join(out.split())
    for option in (
        "-q, --quiet",
        "--show-fixes",
        "--no-respect-gitignore",
        "concise",
        "default: .",
    ):
        assert option in text, option


@pytest.mark.skipif(not ENTRY_POINT.exists(), reason="no safetorch console script next to python")
def test_through_the_entry_point(repo: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}
    done = subprocess.run(
        [str(ENTRY_POINT), "check", "-q", "--output-format", "concise"],
        cwd=repo,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 1 and done.stderr == ""
    assert sorted(line.split(":")[0] for line in done.stdout.splitlines()) == [
        "./keep.gen.py",
        "./src/a.py",
        "./src/top_only.py",
    ]
