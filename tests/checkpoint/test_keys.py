"""Property tests for canonical keys and key matching (hypothesis)."""

from __future__ import annotations

import collections

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as hs

import safetorch as st
from safetorch.checkpoint.keys import WRAPPER_SEGMENTS

_SEGMENT = hs.from_regex(r"[a-z][a-z0-9_]{0,6}", fullmatch=True).filter(
    lambda s: s not in WRAPPER_SEGMENTS
)
_KEYS = hs.lists(
    hs.lists(_SEGMENT, min_size=1, max_size=4).map(".".join), min_size=1, max_size=12, unique=True
)


def _wrap(key: str, draw_positions, segments) -> str:
    parts = key.split(".")
    for pos, seg in zip(draw_positions, segments):
        parts.insert(pos % (len(parts) + 1), seg)
    return ".".join(parts)


@settings(max_examples=60)
@given(keys=_KEYS, data=hs.data())
def test_canonical_key_drops_wrappers_anywhere(keys, data):
    for key in keys:
        segs = data.draw(hs.lists(hs.sampled_from(WRAPPER_SEGMENTS), max_size=3))
        pos = data.draw(hs.lists(hs.integers(0, 8), min_size=len(segs), max_size=len(segs)))
        assert st.canonical_key(_wrap(key, pos, segs)) == key


@settings(max_examples=60)
@given(keys=_KEYS, data=hs.data())
def test_match_keys_recovers_any_wrapping(keys, data):
    # One wrapping per side, applied to every key (as a wrapper does), plus maybe a prefix.
    def draw_wrapping():
        segs = data.draw(hs.lists(hs.sampled_from(WRAPPER_SEGMENTS), max_size=2))
        return segs

    src_segs, tgt_segs = draw_wrapping(), draw_wrapping()
    src_prefix = data.draw(hs.sampled_from(["", "model."]))  # known prefixes only
    src = {src_prefix + ".".join([*src_segs, k]): k for k in keys}
    tgt = {".".join([*tgt_segs, k]): k for k in keys}
    match = st.match_keys(src, tgt)
    assert not match.unmatched_source and not match.unmatched_target, match
    for s, t in match.mapping.items():
        assert src[s] == tgt[t]


def test_timm_and_torch_helpers_miss_what_we_match():
    """torch strips one leading prefix, timm module. then _orig_mod.: _orig_mod.module. fails."""
    from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present

    sd = collections.OrderedDict({"_orig_mod.module.fc.weight": torch.zeros(1)})
    torch_try = collections.OrderedDict(sd)
    consume_prefix_in_state_dict_if_present(torch_try, "module.")
    assert list(torch_try) == ["_orig_mod.module.fc.weight"]
    assert list(st.strip_wrapper_prefixes(sd)) == ["fc.weight"]


def test_strip_wrapper_prefixes_refuses_collisions():
    sd = {"module.fc.weight": torch.zeros(1), "fc.weight": torch.ones(1)}
    with pytest.raises(st.CheckpointError, match="'module.fc.weight' and 'fc.weight'"):
        st.strip_wrapper_prefixes(sd)


def test_exact_keys_win_and_partial_prefix():
    # a Lightning module with a loss buffer outside `model.`: model.* is stripped, loss kept
    m = st.match_keys(["model.a.w", "model.b.w", "loss.w"], ["a.w", "b.w"])
    assert m.mapping == {"model.a.w": "a.w", "model.b.w": "b.w"}
    assert m.unmatched_source == ["loss.w"] and m.unmatched_target == []
    assert st.match_keys(["a", "b"], ["a", "b"]).rule == "exact"


def test_real_module_path_needs_explicit_prefix():
    """features.1. is a module path, not a wrapper: never stripped by itself; the hint says how."""
    m = st.match_keys(["features.0.w", "features.1.w", "classifier.w"], ["0.w", "1.w"])
    assert m.mapping == {} and m.unmatched_target == ["0.w", "1.w"]
    assert m.hint is not None and "prefix='features.'" in m.hint
    m = st.match_keys(
        ["features.0.w", "features.1.w", "classifier.w"], ["0.w", "1.w"], prefix="features."
    )
    assert m.mapping == {"features.0.w": "0.w", "features.1.w": "1.w"}
    assert m.ignored == ["classifier.w"] and m.unmatched_source == []
    assert "took checkpoint keys under 'features.'" in m.rule


def test_prefix_through_wrapper_segments_and_errors():
    m = st.match_keys(["module.features.0.w"], ["0.w"], prefix="features")
    assert m.mapping == {"module.features.0.w": "0.w"}
    with pytest.raises(st.CheckpointError, match="prefix='nope.' matches no checkpoint key"):
        st.match_keys(["features.0.w"], ["0.w"], prefix="nope.")
    with pytest.raises(TypeError, match="prefix must be a str"):
        st.match_keys(["a"], ["a"], prefix=3)  # type: ignore[arg-type]


def test_whole_model_into_backbone_never_takes_the_head():
    """0.1.weight (BN) and 1.weight (head) must not both land on the backbone's 1.weight."""
    backbone = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4))
    whole = torch.nn.Sequential(backbone, torch.nn.Linear(4, 2))
    target = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4))
    _, match = st.remap_state_dict(whole.state_dict(), target)
    assert match.hint is not None and "prefix='0.'" in match.hint
    renamed, match = st.remap_state_dict(whole.state_dict(), target, prefix="0.")
    assert sorted(match.ignored) == ["1.bias", "1.weight"]
    target.load_state_dict(renamed)
    assert torch.equal(target[1].weight, backbone[1].weight)


def test_collision_resolved_by_shape_and_said_so():
    sd = {"module.w": torch.zeros(3), "w": torch.zeros(4)}
    renamed, match = st.remap_state_dict(sd, {"w": torch.ones(3)})
    assert match.mapping == {"module.w": "w"} and match.unmatched_source == ["w"]
    assert "by shape [3]" in match.rule
    assert renamed["w"].shape == (3,)


def test_collision_with_equal_shapes_is_refused():
    sd = {"module.a.w": torch.zeros(3), "_orig_mod.a.w": torch.zeros(3)}
    with pytest.raises(st.CheckpointError, match="shapes do not tell the keys apart"):
        st.remap_state_dict(sd, {"a.w": torch.zeros(3)})


def test_known_prefixes_and_state_dict_keys():
    from safetorch.checkpoint.keys import known_prefixes, state_dict_keys

    assert known_prefixes(["model.fc.w", "model.module.fc.b"]) == ["model.", "module."]
    assert known_prefixes(["fc.w"]) == []
    sd = torch.nn.Linear(1, 1).state_dict()
    assert state_dict_keys({"state_dict": sd, "state_dict_ema": sd, "epoch": 1}) == [
        "state_dict",
        "state_dict_ema",
    ]


def test_remap_state_dict_type_errors():
    with pytest.raises(TypeError, match="state_dict=.*got str"):
        st.remap_state_dict("ckpt.pt", torch.nn.Linear(1, 1))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="target=.*got str"):
        st.remap_state_dict({}, "model")  # type: ignore[arg-type]


def test_load_report_unpacks_like_incompatible_keys():
    model = torch.nn.Linear(2, 2)
    expected = model.load_state_dict(
        {"weight": torch.zeros(2, 2), "x": torch.zeros(1)}, strict=False
    )
    report = st.LoadReport(loaded=["weight"], missing=["bias"], unexpected=["x"])
    missing, unexpected = report
    assert (missing, unexpected) == tuple(expected)
    assert report.missing_keys == expected.missing_keys
    assert report.unexpected_keys == expected.unexpected_keys
    assert report[0] == ["bias"] and report[-1] == ["x"] and len(report) == len(expected)
    assert report._fields == expected._fields
    assert report._asdict() == dict(expected._asdict())
    assert "missing_keys=['bias']" in repr(report)


def test_refused_report_does_not_say_loaded():
    report = st.LoadReport(loaded=["a.w"], missing=["b.w"], refused=True, hint="pass prefix=")
    text = str(report)
    assert "nothing loaded (refused)" in text and "would load: a.w" in text
    assert "\n  loaded:" not in text and "hint: pass prefix=" in text
