"""The docs hold for what a user installs: the wheel, in a clean venv, with only CPU torch.

The wheel is built from a copy of the package source (nothing is written into the checkout),
installed with ``--no-deps --no-index`` into a new venv, and given exactly the distributions
its own ``Requires-Dist`` needs, closed over theirs (torch, packaging, wrapt and what torch
requires; no numpy, no safetensors, no test tools): each is linked into the clean venv's
site-packages from this environment's, the same files ``pip install`` would have put there,
without a package index. Then, with that venv's python, in isolated mode (no PYTHONPATH, no
source tree on the path), tests/_docs_blocks.py runs every README and docs/ python block and
the README's Quickstart shell blocks; the installed ``safetorch`` command is exercised on the
CLI the docs teach, and every ``safetorch ... --option`` a docs shell block shows is checked
against that command's ``--help``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from importlib import metadata
from pathlib import Path
from typing import Any, Dict, List, Set, Tuple

import pytest
from _docs_blocks import cli_uses

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
BLOCKS_SCRIPT = ROOT / "tests" / "_docs_blocks.py"
# what a wheel build reads (the sdist's MANIFEST.in only shapes the sdist)
BUILD_INPUTS = ["pyproject.toml", "README.md", "LICENSE"]


def _requirements_closure(requires: List[str]) -> Dict[str, metadata.Distribution]:
    """Every distribution ``requires`` needs without extras, found in this environment."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    found: Dict[str, metadata.Distribution] = {}
    todo = list(requires)
    while todo:
        requirement = Requirement(todo.pop())
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue
        key = canonicalize_name(requirement.name)
        if key in found:
            continue
        try:
            dist = metadata.distribution(requirement.name)
        except metadata.PackageNotFoundError:
            pytest.skip(f"{requirement.name} (required by the wheel's dependencies) not installed")
        found[key] = dist
        todo += dist.requires or []
    return found


def _link_distribution(dist: metadata.Distribution, site: Path) -> None:
    """Link each top-level entry ``dist`` installed into site-packages into ``site``."""
    if dist.files is None:
        pytest.skip(f"{dist.metadata['Name']} has no RECORD: its files are unknown")
    tops: Set[str] = set()
    for file in dist.files:
        top = file.parts[0]
        if top != ".." and not top.endswith(".pth") and top != "__pycache__":
            tops.add(top)
    for top in sorted(tops):
        target, link = Path(str(dist.locate_file(top))), site / top
        if target.exists() and not link.exists():  # a shared namespace directory: once
            link.symlink_to(target, target_is_directory=target.is_dir())


def _pip_installs_into_another_python() -> bool:
    """pip 22.3 added ``--python`` (install into another interpreter's environment)."""
    from packaging.version import Version

    try:
        return Version(metadata.version("pip")) >= Version("22.3")
    except metadata.PackageNotFoundError:
        return False


def _unmet_build_requirements() -> List[str]:
    """The pyproject's ``[build-system] requires`` this environment does not satisfy.

    ``--no-build-isolation`` builds with whatever backend is installed here, and an old one fails
    for reasons that hide the cause (setuptools 58 reads no ``[project]`` table and has no
    ``bdist_wheel``), so the fixture names what is missing instead.
    """
    from packaging.requirements import Requirement

    if sys.version_info >= (3, 11):
        import tomllib as toml
    else:  # pytest itself requires tomli, tomllib's backport, before Python 3.11
        import tomli as toml
    with open(ROOT / "pyproject.toml", "rb") as file:
        requires = toml.load(file)["build-system"]["requires"]
    unmet = []
    for text in requires:
        requirement = Requirement(text)
        try:
            have = metadata.version(requirement.name)
        except metadata.PackageNotFoundError:
            unmet.append(f"{text} (not installed)")
            continue
        if not requirement.specifier.contains(have, prereleases=True):
            unmet.append(f"{text} (installed: {have})")
    return unmet


@pytest.fixture(scope="module")
def clean_venv(tmp_path_factory: Any) -> Dict[str, Any]:
    if not _pip_installs_into_another_python():
        pytest.skip("this environment's pip is missing or older than 22.3 (no --python)")
    unmet = _unmet_build_requirements()
    if unmet:  # the wheel is built offline, without build isolation: the backend must be here
        pytest.skip(f"the wheel's build backend is not installed here: needs {', '.join(unmet)}")
    work = tmp_path_factory.mktemp("wheel-docs")
    src = work / "src"
    src.mkdir()
    for name in BUILD_INPUTS:
        shutil.copy2(ROOT / name, src / name)
    shutil.copytree(
        ROOT / "safetorch", src / "safetorch", ignore=shutil.ignore_patterns("__pycache__")
    )
    wheels = work / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation"]
        + ["--check-build-dependencies", "--no-index", "--wheel-dir", str(wheels), str(src)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = wheels.glob("safetorch-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        (meta,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        text = archive.read(meta).decode()
    requires = re.findall(r"^Requires-Dist: (.+)$", text, flags=re.M)

    venv = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / ("Scripts" if os.name == "nt" else "bin") / "python"
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    assert site != Path(sysconfig.get_paths()["purelib"])
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet"]
        + ["--no-deps", "--no-index", str(wheel)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    provided = _requirements_closure(requires)
    for dist in provided.values():
        _link_distribution(dist, site)
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP")
    }
    env["PATH"] = f"{python.parent}{os.pathsep}{env.get('PATH', '')}"
    return {
        "work": work,
        "python": python,
        "site": site,
        "provided": sorted(provided),
        "env": env,
    }


@pytest.fixture(scope="module")
def docs_results(clean_venv: Dict[str, Any]) -> Dict[str, Any]:
    runs = clean_venv["work"] / "runs"
    runs.mkdir()
    out = clean_venv["work"] / "results.json"
    done = subprocess.run(
        [str(clean_venv["python"]), "-I", str(BLOCKS_SCRIPT)]
        + ["--root", str(ROOT), "--work", str(runs), "--out", str(out)],
        cwd=runs,
        env=clean_venv["env"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    results: Dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
    return results


def _safetorch(clean_venv: Dict[str, Any], *args: str, cwd: Path) -> Tuple[int, str, str]:
    """``(returncode, stdout, stderr)`` of the clean venv's ``safetorch`` command. Without
    numpy, torch itself warns "Failed to initialize NumPy" on stderr when a command imports it."""
    command = clean_venv["python"].parent / "safetorch"
    done = subprocess.run(
        [str(command), *args],
        cwd=cwd,
        env=clean_venv["env"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    return done.returncode, done.stdout, done.stderr


def test_the_clean_venv_holds_only_the_wheel_and_what_it_requires(
    clean_venv: Dict[str, Any], docs_results: Dict[str, Any]
) -> None:
    provided = set(clean_venv["provided"])
    assert {"torch", "packaging", "wrapt"} <= provided
    assert not provided & {"numpy", "safetensors", "pytest", "hypothesis", "ruff", "mypy"}
    site = clean_venv["site"]
    # safetorch is the wheel's copy, in the clean venv, not the checkout (an editable install)
    assert Path(docs_results["safetorch"]).resolve().is_relative_to(site.resolve())
    assert not (site / "safetorch" / "py.typed").is_symlink()
    assert (site / "safetorch" / "py.typed").is_file()
    assert Path(docs_results["python"]) == clean_venv["python"]
    assert docs_results["numpy_imported"] is False
    blocked = subprocess.run(
        [str(clean_venv["python"]), "-I", "-c", "import numpy"],
        env=clean_venv["env"],
        capture_output=True,
    )
    assert blocked.returncode != 0


def test_every_doctest_of_the_docs_passes_from_the_wheel(docs_results: Dict[str, Any]) -> None:
    doctests = docs_results["doctests"]
    assert sum(d["attempted"] for d in doctests.values()) > 10
    failed = {name: d["report"] for name, d in doctests.items() if d["failed"]}
    assert failed == {}, "\n".join(failed.values())


def test_every_python_block_of_the_docs_runs_from_the_wheel(
    docs_results: Dict[str, Any],
) -> None:
    scripts = docs_results["scripts"]
    assert len(scripts) > 5
    failed = {title: tb for title, tb in scripts.items() if tb is not None}
    assert failed == {}, "\n\n".join(f"{t}:\n{tb}" for t, tb in failed.items())


def test_every_printed_example_of_the_docs_prints_what_they_show(
    docs_results: Dict[str, Any],
) -> None:
    printed = docs_results["printed"]
    assert len(printed) >= 1  # the README's first example and its LoadReport
    wrong = [p for p in printed if p["printed"] != p["expected"]]
    assert wrong == [], "\n\n".join(
        f"{p['page']}: the docs show\n{p['expected']}\nit printed\n{p['printed']}" for p in wrong
    )


def test_the_readme_quickstart_shell_blocks_run_from_the_wheel(
    docs_results: Dict[str, Any],
) -> None:
    shell = docs_results["shell"]
    assert len(shell) >= 3
    failed = [f"{r['failure']}:\n{r['block']}\n---\n{r['output']}" for r in shell if r["failure"]]
    assert failed == [], "\n\n".join(failed)


def test_every_safetorch_option_the_docs_show_exists_in_the_installed_command(
    clean_venv: Dict[str, Any],
) -> None:
    uses = cli_uses(ROOT)
    assert len(uses) > 15
    helps: Dict[Tuple[str, ...], str] = {}
    missing = []
    for page, command, options in uses:
        key = tuple(command[1:])
        if key not in helps:
            returncode, text, err = _safetorch(clean_venv, *key, "--help", cwd=clean_venv["work"])
            assert returncode == 0, f"{page}: `{' '.join(command)} --help` failed:\n{text}{err}"
            helps[key] = text
        missing += [f"{page}: {' '.join(command)} {o}" for o in options if o not in helps[key]]
    assert missing == []


def test_the_installed_command_speaks_the_documented_cli(
    clean_venv: Dict[str, Any], tmp_path: Path
) -> None:
    returncode, text, _ = _safetorch(clean_venv, "check", "--help", cwd=tmp_path)
    assert returncode == 0
    for option in ("--no-respect-gitignore", "-q", "--show-fixes", "--output-format"):
        assert option in text
    assert "concise" in text
    (tmp_path / "clean.py").write_text("import torch\nx = torch.ones(2)\n", encoding="utf-8")
    returncode, text, err = _safetorch(clean_venv, "check", "clean.py", cwd=tmp_path)
    assert (returncode, text, err) == (0, "", "All checks passed!\n")  # as ruff: on stderr

    make = "import torch; torch.save({'fc.weight': torch.ones(2, 2), 'fc.bias': torch.ones(2)}, 'a.pt')"
    subprocess.run(
        [str(clean_venv["python"]), "-I", "-c", make],
        cwd=tmp_path,
        env=clean_venv["env"],
        check=True,
        capture_output=True,
    )
    inspect = ["ckpt", "inspect", "--keys", "fc.w*", "a.pt", "--output-format", "json"]
    returncode, text, err = _safetorch(clean_venv, *inspect, cwd=tmp_path)
    assert returncode == 0, text + err
    report = json.loads(text)  # stdout is the JSON document alone
    assert report["schema_version"] >= 1
    assert "fc.weight" in text and "fc.bias" not in text
    diff = ["ckpt", "diff", "a.pt", "a.pt", "--atol", "0", "--output-format", "json"]
    returncode, text, err = _safetorch(clean_venv, *diff, cwd=tmp_path)
    assert returncode == 0, text + err
    assert json.loads(text)["schema_version"] >= 1
