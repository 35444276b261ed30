"""Every ``safetorch._compat`` flag agrees with the torch release its comment names.

Run on each torch of the compatibility matrix (``make test-compat``): on torch X, flag F must be
True iff X >= since(F). A disagreement means the flag's detection or its documented release is
wrong. ``pytest -s tests/compat`` prints the detected flags.
"""

from __future__ import annotations

import io
import pathlib
import pickle
import re
import warnings
from fractions import Fraction
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as _st
from packaging.version import Version

from safetorch import _compat

INSTALLED = Version(".".join(map(str, _compat.TORCH_RELEASE)))
RELEASE_FLAGS = sorted(f.name for f in _compat.flags() if f.since != "-")


def _flag(name: str) -> _compat.Flag:
    return next(f for f in _compat.flags() if f.name == name)


def _reported_flags() -> dict:
    """``{name: value}`` of the flags ``safetorch doctor`` reports."""
    from safetorch import _doctor

    return {f["name"]: f["value"] for f in _doctor.collect()["flags"]}


def test_detected_flags_are_what_doctor_reports(
    record_property: pytest.RecordProperty, simulate_torch: Any
) -> None:
    """``safetorch doctor`` (and ``_compat.flags()``) report every flag with the value the
    library branches on, also while a test simulates an older torch. ``pytest -s`` prints the
    table (and ``--junitxml`` records it) for the compatibility matrix."""
    assert _reported_flags() == {name: getattr(_compat, name) for name in _compat._FLAGS}
    rows = [f"torch {_compat.TORCH_VERSION} (release {INSTALLED})"]
    for f in _compat.flags():
        expected = "-" if f.since == "-" else str(INSTALLED >= Version(f.since))
        rows.append(f"  {f.name:32} {f.value!s:5} since {f.since:5} expected {expected:5}")
        record_property(f.name, f.value)
    print("\n".join(rows))
    flipped = {"LOAD_HAS_MMAP": not _compat.LOAD_HAS_MMAP}
    with simulate_torch(**flipped):
        assert _compat.LOAD_HAS_MMAP is flipped["LOAD_HAS_MMAP"]
        assert _reported_flags()["LOAD_HAS_MMAP"] is flipped["LOAD_HAS_MMAP"]
    assert _reported_flags()["LOAD_HAS_MMAP"] is not flipped["LOAD_HAS_MMAP"]


def test_every_flag_is_declared_once() -> None:
    """Each module-level boolean flag is declared by ``_flag`` under its own name, and each
    declaration is bound: the release, PR and detection method live in that one call."""
    bools = {
        name: value
        for name, value in vars(_compat).items()
        if name.isupper() and not name.startswith("_") and isinstance(value, bool)
    }
    assert set(bools) == set(_compat._FLAGS)
    for name, flag in _compat._FLAGS.items():
        assert flag.name == name and flag.value is bools[name], name
    source = pathlib.Path(_compat.__file__).read_text(encoding="utf-8")
    for name in bools:
        # declared once: the name is assigned once, and only from _flag("NAME", ...)
        assert (
            source.count(f'\n{name}: bool = _flag(\n    "{name}",')
            + source.count(f'\n{name}: bool = _flag("{name}",')
            == 1
        ), name
        assigned = re.findall(rf"^{name}\b\s*[:=]", source, re.MULTILINE)
        assert len(assigned) == 1, f"{name} is assigned more than once"


def test_every_flag_is_read_by_the_library() -> None:
    """A flag nothing in safetorch reads is dead weight (tests use their own conditions).

    Its declaration names it twice (``NAME: bool = _flag("NAME", ...)``); a read is any other
    mention, in a module or in ``_compat``'s own binders.
    """
    root = pathlib.Path(_compat.__file__).parent
    text = "".join(p.read_text(encoding="utf-8") for p in root.rglob("*.py"))
    unread = [name for name in _compat._FLAGS if len(re.findall(rf"\b{name}\b", text)) <= 2]
    assert unread == []


@pytest.mark.parametrize("name", sorted(_compat._FLAGS))
def test_since_is_a_release(name: str) -> None:
    flag = _compat._FLAGS[name]
    since = flag.since
    assert since == "-" or Version(since).release, f"{name}: since={since!r} is not a release"
    assert flag.detected_by and flag.source, f"{name}: no detection method or source"


@pytest.mark.parametrize("name", RELEASE_FLAGS)
def test_flag_matches_its_release(name: str) -> None:
    f = _flag(name)
    expected = INSTALLED >= Version(f.since)
    assert f.value is expected, (
        f"{name} is {f.value} on torch {_compat.TORCH_VERSION}, but its comment says it "
        f"arrived in torch {f.since} (detected by {f.detected_by}): expected {expected}"
    )


def test_weights_only_default_matches_torch_load(monkeypatch: pytest.MonkeyPatch) -> None:
    """Behaviour probe: torch.load's default refuses a non-tensor global iff the flag is set."""
    monkeypatch.delenv("TORCH_FORCE_WEIGHTS_ONLY_LOAD", raising=False)
    monkeypatch.delenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", raising=False)
    buf = io.BytesIO()
    torch.save({"x": Fraction(1, 3)}, buf)
    buf.seek(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # 2.4/2.5 warn that the default will change
        try:
            torch.load(buf)
            refused = False
        except pickle.UnpicklingError:
            refused = True
    assert refused is _compat.LOAD_WEIGHTS_ONLY_DEFAULT_TRUE


def test_syncbn_fallback_matches_behaviour() -> None:
    """Behaviour probe: SyncBatchNorm on a CPU tensor without a process group."""
    assert not (torch.distributed.is_available() and torch.distributed.is_initialized())
    bn = torch.nn.SyncBatchNorm(3).eval()
    x = torch.randn(4, 3)
    try:
        out = bn(x)
    except ValueError as exc:
        assert not _compat.SYNCBN_FALLS_BACK_WITHOUT_PG, f"flag set but torch raised: {exc}"
        assert "GPU" in str(exc)
    else:
        assert _compat.SYNCBN_FALLS_BACK_WITHOUT_PG, "flag unset but torch fell back"
        torch.testing.assert_close(
            out,
            torch.nn.functional.batch_norm(x, bn.running_mean, bn.running_var, bn.weight, bn.bias),
        )


@given(
    release=_st.lists(_st.integers(0, 300), min_size=1, max_size=4),
    epoch=_st.sampled_from(["", "1!"]),
    prefix=_st.sampled_from(["", "v", "V", " "]),
    tag=_st.sampled_from(
        ["", "a0", "b2", "rc1", ".dev20240601", ".post1", "rc1.dev3", ".post2.dev1"]
    ),
    local=_st.sampled_from(["", "+cpu", "+cu121", "+git1a2b3c", "+rocm6.2"]),
)
def test_release_of_is_packagings_release(
    release: list, epoch: str, prefix: str, tag: str, local: str
) -> None:
    """TORCH_RELEASE is parsed without importing packaging: the same tuple on every form a
    torch build's version takes (nightlies, release candidates, local build labels)."""
    text = f"{prefix}{epoch}{'.'.join(map(str, release))}{tag}{local}"
    assert _compat.release_of(text) == Version(text).release


@pytest.mark.parametrize("text", ["", "nightly", "+cpu", ".2.0"])
def test_release_of_refuses_what_is_not_a_version(text: str) -> None:
    with pytest.raises(ValueError, match="not a PEP 440 version"):
        _compat.release_of(text)
    with pytest.raises(ValueError):
        Version(text)  # packaging refuses them too
