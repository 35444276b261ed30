"""The ``Literal`` aliases of safetorch/_types.py match what each function accepts at run time,
a type checker refuses a bad mode or patch name, and ``help()`` shows the types unquoted."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
import typing
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import safetorch as st
from safetorch import _device, _types
from safetorch.nn import syncbn
from safetorch.patching import _registry

ROOT = Path(__file__).resolve().parents[2]


def _values(alias: object) -> set:
    return set(typing.get_args(alias))


def test_aliases_match_the_values_accepted_at_run_time(tmp_path: Path) -> None:
    assert _values(_types.IndexCheckMode) == set(_device._MODES)
    assert _values(_types.SyncBNPolicy) == set(syncbn._POLICIES)
    assert _values(_types.PatchName) == {"all", *_registry.resolve_names((), default_all=True)}
    for mode in typing.get_args(_types.SaverMode):
        st.CheckpointSaver(tmp_path / mode, mode=mode)
    with pytest.raises(ValueError, match="mode='maximum'"):
        st.CheckpointSaver(tmp_path / "x", mode="maximum")  # type: ignore[arg-type]


@pytest.mark.parametrize("mode", typing.get_args(_types.UpsampleMode))
def test_every_upsample_mode_is_one_interpolate_takes(mode: str) -> None:
    dims = {"linear": 1, "trilinear": 3}.get(mode, 2)
    x = torch.ones((1, 1) + (2,) * dims)
    assert torch.equal(
        st.upsample(x, scale_factor=2, mode=mode), F.interpolate(x, scale_factor=2, mode=mode)
    )


@pytest.mark.parametrize(
    "func, shown",
    [
        (st.CheckpointSaver, "mode: Literal['min', 'max'] = 'min'"),
        (st.set_index_check, "(mode: Literal['auto', 'always', 'never']) -> Literal["),
        (st.convert_sync_batchnorm, "policy: Literal['auto', 'torch', 'portable'] = 'auto'"),
        (st.upsample, "mode: Literal['nearest', 'linear', "),
        (st.patch, "(*names: Literal['all', 'upsample', "),
        (st.unpatch, "(*names: Literal['all', "),
        (st.patched, "(*names: Literal['all', "),
    ],
)
def test_signatures_render_unquoted(func: object, shown: str) -> None:
    text = str(inspect.signature(func))  # what help() prints
    assert shown in text, text
    assert "'SaverMode'" not in text and "'str'" not in text and "'PatchName'" not in text


def _has_signature(obj: object) -> bool:
    try:
        inspect.signature(obj)  # type: ignore[arg-type]
    except (TypeError, ValueError):  # an exception class of C's: help() shows no signature
        return False
    return True


def _public_callables() -> list:
    names = sorted(n for n in dir(st) if not n.startswith("_"))
    found = [n for n in names if callable(getattr(st, n)) and _has_signature(getattr(st, n))]
    assert len(found) > 40
    return found


@pytest.mark.parametrize("name", _public_callables())
def test_every_public_signature_renders_unquoted(name: str) -> None:
    """What ``help(st.<name>)`` prints: no annotation left as the string the source wrote."""
    text = str(inspect.signature(getattr(st, name)))
    assert ": '" not in text and "-> '" not in text, f"st.{name}{text}"


def test_unquoted_keeps_what_cannot_be_evaluated_and_is_idempotent() -> None:
    def f(a: "int", b: "NotDefinedAnywhere" = 0) -> "Tuple[int, 'int']": ...  # noqa: F821

    once = str(inspect.signature(_types.unquoted(f)))
    assert once == str(inspect.signature(_types.unquoted(f)))
    assert once.startswith("(a: int, b: 'NotDefinedAnywhere' = 0)"), once

    class C:
        def __init__(self, mode: "_types.SaverMode") -> None: ...

    assert str(inspect.signature(_types.unquoted(C))) == "(mode: Literal['min', 'max']) -> None"


@pytest.mark.slow
def test_mypy_refuses_a_bad_mode_and_a_bad_patch_name(tmp_path: Path) -> None:
    pytest.importorskip("mypy", reason="mypy is a dev dependency")
    snippet = tmp_path / "use.py"
    snippet.write_text(
        "import safetorch as st\n"
        "st.CheckpointSaver('d', mode='maximum')\n"
        "st.patch('nonexistent')\n"
        "st.set_index_check('sometimes')\n"
        "st.CheckpointSaver('d', mode='max')\n"
        "st.patch('load', 'index')\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-incremental", "--follow-imports=silent", str(snippet)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "MYPYPATH": str(ROOT)},
        timeout=900,
    )
    errors = [line for line in done.stdout.splitlines() if ": error:" in line]
    assert [line.split(":")[1] for line in errors] == ["2", "3", "4"], done.stdout
