"""Re-created PyTorch 0.2/0.3-era scripts, run in child processes on the installed torch.

For each script of ``scripts/manifest.json`` (faithful re-creations, in our own words, of the
idioms of public examples of that era; see each script's docstring):

* plain ``python`` fails on the legacy copy, with the error the manifest names;
* ``python -m safetorch run`` completes with finite results that match the hand-modernised
  copy on the first iterations (where the manifest says an idiom cannot be shimmed, it fails
  with that error instead);
* (a test of its own, a strict xfail naming the rule gap where the manifest gives
  ``fixed_xfail``) the copy ``safetorch check --fix --unsafe-fixes --select ALL,PREVIEW``
  wrote (the preview rules' fixes too) leaves nothing fixable behind, runs with plain ``python`` (no
  ``safetorch run``) and matches the modernised copy too;
  the files of the manifest's ``setup`` steps (they stand in for what the original
  downloaded) are out of the checked project, as a download is;
  where one script loads a whole-model or numpy file another one saved (ST003 has no fix
  there; a save and load in one file become ``st.save`` and ``st.load``) a
  weights-only-by-default torch refuses that load under plain ``python``, and the copy
  matches under ``safetorch run``.

Each step runs in a fresh process with ``OMP_NUM_THREADS=1`` (bit-identical reductions in
both copies) and in the working directory the earlier steps wrote to.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, NamedTuple, Sequence

import pytest

from safetorch._cli import main as safetorch_main
from safetorch._compat import LOAD_WEIGHTS_ONLY_DEFAULT_TRUE
from safetorch.check import check_paths

SCRIPTS = Path(__file__).parent / "scripts"
MANIFEST: List[Dict[str, Any]] = json.loads((SCRIPTS / "manifest.json").read_text())["scripts"]
FIRST = 3  # iterations whose losses must match the modernised copy closely
EVERY_RULE = ["ALL", "PREVIEW"]  # the preview rules' fixes too (ST019, ST020, ...)

pytestmark = pytest.mark.slow

# Where a script saves a whole model or numpy data and the same file loads it back, ST003's
# fix makes the save st.save and the load st.load, which plain python runs (save_reload, and
# main.py of word_language_model). These scripts load such a file in another script than the
# one that saved it (word_language_model: generate.py): ST003 has no fix for that load (no
# save in its file writes it), it stays a plain torch.load, which a weights-only-by-default
# torch refuses under plain python; safetorch run, whose patched torch.save records the files
# it writes, still runs the fixed copy.
LOADED_ELSEWHERE = {
    "char_rnn_classification",  # train.py saves, predict.py loads
    "super_resolution",  # main.py saves, super_resolve.py loads
    "time_sequence_prediction",  # generate_sine_wave.py saves numpy data, train.py loads
    "word_language_model",  # main.py saves and loads (fixed), generate.py loads
}


class Outcome(NamedTuple):
    code: int
    stderr: str
    results: List[Dict[str, Any]]


def _env() -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAFETORCH_")}
    env.update(OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    return env


def _copy(name: str, flavour: str, target: Path) -> Path:
    """A copy of ``<name>/<flavour>`` (legacy or modern) at ``target``, to run in."""
    shutil.copytree(SCRIPTS / name / flavour, target)
    return target


def _run(workdir: Path, steps: Sequence[Sequence[str]], shim: bool = False) -> Outcome:
    results: List[Dict[str, Any]] = []
    for step in steps:
        cmd = [sys.executable, *(["-m", "safetorch", "run", "--no-report"] if shim else []), *step]
        proc = subprocess.run(
            cmd, cwd=workdir, env=_env(), capture_output=True, text=True, timeout=600
        )
        if proc.returncode:
            return Outcome(proc.returncode, proc.stderr, results)
        results += [
            json.loads(line[len("RESULT ") :])
            for line in proc.stdout.splitlines()
            if line.startswith("RESULT ")
        ]
    return Outcome(0, "", results)


def _numbers(value: Any) -> List[float]:
    if isinstance(value, bool):
        return []
    if isinstance(value, (int, float)):
        return [float(value)]
    if isinstance(value, list):
        return [x for item in value for x in _numbers(item)]
    if isinstance(value, dict):
        return [x for item in value.values() for x in _numbers(item)]
    return []


def _assert_matches(got: Outcome, modern: Outcome, what: str) -> None:
    assert got.code == 0, f"{what} failed:\n{got.stderr[-3000:]}"
    assert len(got.results) == len(modern.results) > 0, what
    for mine, theirs in zip(got.results, modern.results):
        assert mine.keys() == theirs.keys(), what
        assert all(math.isfinite(x) for x in _numbers(mine)), (what, mine)
        for key in mine:
            a, b = mine[key], theirs[key]
            if key == "losses":  # the first iterations: as close as one float op
                first_a, first_b = _numbers(a[:FIRST]), _numbers(b[:FIRST])
                assert first_a == pytest.approx(first_b, rel=1e-5, abs=1e-7), (what, key)
                a, b = a[FIRST:], b[FIRST:]
            numbers_a, numbers_b = _numbers(a), _numbers(b)
            assert numbers_a == pytest.approx(numbers_b, rel=1e-3, abs=1e-5), (what, key)
            if not numbers_a:  # words, translations, predictions
                assert a == b, (what, key)


def _modern(entry: Dict[str, Any], tmp_path: Path) -> Outcome:
    modern = _run(_copy(entry["name"], "modern", tmp_path / "modern"), entry["steps"])
    assert modern.code == 0, f"the modernised copy failed:\n{modern.stderr[-3000:]}"
    return modern


@pytest.mark.parametrize("entry", MANIFEST, ids=[e["name"] for e in MANIFEST])
def test_legacy_script(entry: Dict[str, Any], tmp_path: Path) -> None:
    """Plain python fails with the torch API change; safetorch run matches the modern copy."""
    name, steps = entry["name"], entry["steps"]
    modern = _modern(entry, tmp_path)

    plain = _run(_copy(name, "legacy", tmp_path / "plain"), steps)
    assert plain.code != 0, plain.stderr[-3000:]
    if "Weights only load failed" not in entry["plain_error"] or LOAD_WEIGHTS_ONLY_DEFAULT_TRUE:
        # a torch whose torch.load is weights-only by default stops there; an older one gets
        # further and fails on the script's next legacy idiom
        assert entry["plain_error"] in plain.stderr, plain.stderr[-3000:]

    shimmed = _run(_copy(name, "legacy", tmp_path / "run"), steps, shim=True)
    if entry["run_completes"]:
        _assert_matches(shimmed, modern, "safetorch run")
    else:
        assert shimmed.code != 0 and entry["run_error"] in shimmed.stderr, shimmed.stderr[-3000:]


def _fixed_params() -> List[Any]:
    # Where the fixed copy fails today the manifest names the rule gap: the test is a strict
    # xfail, which turns into a failure (to remove the mark) once the fixer closes the gap.
    return [
        pytest.param(
            e,
            id=e["name"],
            marks=[pytest.mark.xfail(strict=True, reason=e["fixed_xfail"])]
            if "fixed_xfail" in e
            else [],
        )
        for e in MANIFEST
    ]


@pytest.mark.parametrize("entry", _fixed_params())
def test_legacy_script_fixed(
    entry: Dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The copy ``safetorch check --fix --unsafe-fixes`` wrote runs with plain python and
    matches the modern copy."""
    name, steps = entry["name"], entry["steps"]
    modern = _modern(entry, tmp_path)
    fixed_dir = _copy(name, "legacy", tmp_path / "fixed")
    # the setup steps stand in for what the original downloaded (data, a published
    # checkpoint): they are not the user's project, so the fixer does not see them
    aside = tmp_path / "setup"
    aside.mkdir()
    setup = [step[0] for step in steps[: entry.get("setup", 0)]]
    for script in setup:
        (fixed_dir / script).rename(aside / script)
    argv = ["check", "--fix", "--unsafe-fixes", "--isolated", "--exit-zero"]
    assert safetorch_main([*argv, "--select", "ALL,PREVIEW", str(fixed_dir)]) == 0
    capsys.readouterr()
    left = [d for r in check_paths([str(fixed_dir)], select=EVERY_RULE) for d in r.diagnostics]
    for script in setup:
        (aside / script).rename(fixed_dir / script)
    assert [str(d) for d in left if d.fix is not None] == []
    unfixed = [d for d in left if d.code == "ST003" and "evidently holds" in d.message]
    assert bool(unfixed) == (name in LOADED_ELSEWHERE), [str(d) for d in unfixed]
    if unfixed and LOAD_WEIGHTS_ONLY_DEFAULT_TRUE:
        plain_fixed = _run(fixed_dir, steps)
        assert plain_fixed.code != 0, [str(d) for d in unfixed]
        assert "Weights only load failed" in plain_fixed.stderr, plain_fixed.stderr[-3000:]
        fixed = _run(fixed_dir, steps, shim=True)
        _assert_matches(fixed, modern, "the --fix'ed copy under safetorch run")
    else:
        _assert_matches(_run(fixed_dir, steps), modern, "the --fix'ed copy under plain python")


def test_manifest_names_every_script_directory() -> None:
    dirs = {p.name for p in SCRIPTS.iterdir() if p.is_dir() and not p.name.startswith("__")}
    assert dirs == {e["name"] for e in MANIFEST}
    for entry in MANIFEST:
        for flavour in ("legacy", "modern"):
            for step in entry["steps"]:
                assert (SCRIPTS / entry["name"] / flavour / step[0]).is_file(), (entry, flavour)


def test_volatile_tensor_ops_match_no_grad_and_restore_grad_mode() -> None:
    """VolatileTensor's fast __torch_function__ (the word language model's generate loop
    runs every op through it) computes what ``torch.no_grad()`` computes and leaves grad
    mode as it found it, also when the op raises."""
    import torch

    import safetorch as st

    torch.manual_seed(0)
    lstm, x = torch.nn.LSTM(4, 3), torch.randn(2, 1, 4)
    with torch.no_grad():
        want, (h, c) = lstm(x)
    got, (gh, gc) = lstm(st.legacy.volatile(x))
    assert type(got) is st.legacy.VolatileTensor and not got.requires_grad
    torch.testing.assert_close(got.as_subclass(torch.Tensor), want, rtol=0, atol=0)
    assert type(gh) is st.legacy.VolatileTensor and type(got.size()) is torch.Size
    assert torch.is_grad_enabled()
    with pytest.raises(RuntimeError):
        st.legacy.volatile(torch.ones(2)) @ torch.ones(3)
    assert torch.is_grad_enabled()
    with torch.no_grad():
        st.legacy.volatile(torch.ones(2)) + 1
        assert not torch.is_grad_enabled()
