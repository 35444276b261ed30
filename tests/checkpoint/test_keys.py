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
    src_prefix = data.draw(hs.sampled_from(["", "model.", "net."]))
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
