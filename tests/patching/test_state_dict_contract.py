"""torch's contract in patch mode: what the patched entry points return and raise reads as
torch's own, so code (and PyTorch's own tests) that match torch's text keep working.

The load_state_dict cases restate, in our own words, what PyTorch's test/nn/test_load_state_dict.py
checks (results printed as ``_IncompatibleKeys``, errors with torch's message), each run plain
and under the patch and compared.
"""

from __future__ import annotations

import collections
import inspect
import warnings
from typing import Any, Callable, Iterator, Tuple

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import safetorch as st
from safetorch.checkpoint.report import PatchedLoadReport

_swap = getattr(torch.__future__, "set_swap_module_params_on_conversion", None)


@pytest.fixture(
    params=[False, True] if _swap is not None else [False],
    ids=["copy", "swap"] if _swap is not None else ["copy"],
)
def swap(request: Any) -> Iterator[bool]:
    """torch runs its load_state_dict tests with and without swapping module parameters."""
    if _swap is None:
        yield False
        return
    before = torch.__future__.get_swap_module_params_on_conversion()
    _swap(request.param)
    try:
        yield request.param
    finally:
        _swap(before)


def _outcome(call: Callable[[], Any]) -> Tuple[str, Any]:
    """("ok", result) or ("raised", exception) of one call, warnings recorded, not raised."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", st.CheckpointWarning)
        try:
            return "ok", call()
        except RuntimeError as exc:
            return "raised", exc


def _side_by_side(make: Callable[[], nn.Module], sd: Any, **kwargs: Any) -> Tuple[Any, Any]:
    plain = _outcome(lambda: make().load_state_dict(sd, **kwargs))
    with st.patched("state_dict"):
        patched = _outcome(lambda: make().load_state_dict(sd, **kwargs))
    assert plain[0] == patched[0], (plain, patched)
    if plain[0] == "raised":
        # torch's message first, then safetorch's guidance; still a RuntimeError (and ours)
        assert str(patched[1]).startswith(str(plain[1])), (str(plain[1]), str(patched[1]))
        assert isinstance(patched[1], RuntimeError)
    else:
        assert str(patched[1]) == str(plain[1]) and repr(patched[1]) == repr(plain[1])
        assert patched[1] == plain[1] and plain[1] == patched[1]
        assert tuple(patched[1]) == tuple(plain[1])
    return plain[1], patched[1]


def _net() -> nn.Module:
    """The network torch's test builds: a shared Linear, BatchNorm, a nested block, a None."""
    torch.manual_seed(0)
    shared = nn.Linear(5, 5)
    block = nn.Module()
    block.conv1 = nn.Conv2d(3, 3, 3, bias=True)
    block.conv2 = nn.Conv2d(3, 3, 3, bias=False)
    net = nn.Module()
    net.linear1 = shared
    net.linear2 = shared
    net.bn = nn.BatchNorm2d(2)
    net.block = block
    net.add_module("empty", None)
    return net


def test_unexpected_keys_print_and_raise_as_in_torch(swap) -> None:
    for extra in ("extra", "extra.param"):
        sd = _net().state_dict()
        sd[extra] = torch.ones(5)
        plain, patched = _side_by_side(_net, sd)
        assert f'Unexpected key(s) in state_dict: "{extra}"' in str(patched)
        assert isinstance(patched, st.CheckpointMismatchError)
        plain, patched = _side_by_side(_net, sd, strict=False)
        assert patched.unexpected_keys == [extra] and patched.missing_keys == []
        assert "Incompatible" in str(patched)


def test_missing_and_unexpected_together(swap) -> None:
    sd = _net().state_dict()
    del sd["linear1.weight"]
    sd["extra.param"] = torch.ones(5)
    plain, patched = _side_by_side(_net, sd)
    assert "Missing key(s) in state_dict: " in str(patched)
    plain, patched = _side_by_side(_net, sd, strict=False)
    assert patched.missing_keys == ["linear1.weight"]
    assert patched.unexpected_keys == ["extra.param"]


def test_wrapper_prefix_loads_and_prints_like_a_clean_torch_load(swap) -> None:
    sd = collections.OrderedDict((f"module.{k}", v) for k, v in _net().state_dict().items())
    with st.patched("state_dict"):
        net = _net()
        result = net.load_state_dict(sd)
    assert isinstance(result, PatchedLoadReport) and isinstance(result, st.LoadReport)
    assert len(result.missing_keys) == 0 and len(result.unexpected_keys) == 0
    assert "Incompatible" not in str(result)
    assert str(result) == repr(result) == "<All keys matched successfully>"
    assert result == nn.Linear(1, 1).load_state_dict(nn.Linear(1, 1).state_dict())
    assert "LoadReport:" in result.describe() and "'module.'" in result.describe()


def test_suffixed_unexpected_keys(swap) -> None:
    class Holder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1 = nn.Linear(5, 10)

    for bad in ("fc1.bad_suffix", "fc1.weight.bad_suffix"):
        sd = Holder().state_dict()
        sd[bad] = torch.randn(5, 10)
        if (
            bad == "fc1.weight.bad_suffix"
            and _outcome(lambda sd=sd: Holder().load_state_dict(sd))[0] == "ok"
        ):
            # torch releases that split a key at its first dot (2.1 here) take
            # "weight.bad_suffix" for "weight" and load silently; safetorch reports every
            # unexpected key on every torch: stricter, never looser
            with st.patched("state_dict"), pytest.raises(st.CheckpointMismatchError) as info:
                Holder().load_state_dict(sd)
            assert "Unexpected key(s) in state_dict" in str(info.value) and bad in str(info.value)
            continue
        plain, patched = _side_by_side(Holder, sd)
        assert "Unexpected key" in str(patched)
        plain, patched = _side_by_side(Holder, sd, strict=False)
        assert bad in patched.unexpected_keys


def test_partial_dict_with_an_unknown_key_loads_what_matches(swap) -> None:
    ref = _net()
    sd = {
        "linear1.weight": torch.ones(5, 5),
        "block.conv1.bias": torch.arange(1, 4, dtype=ref.block.conv1.bias.dtype),
        "bn.running_mean": torch.randn(2),
        "nonexistent_key": torch.rand(3),
    }
    before = ref.state_dict()
    with st.patched("state_dict"):
        with pytest.warns(st.CheckpointWarning, match="unloaded"):
            ref.load_state_dict(sd, strict=False)
    for k, v in ref.state_dict().items():
        assert torch.equal(v, sd[k] if k in sd else before[k]), k


def test_size_mismatch_on_torchs_path_raises_as_in_torch(swap) -> None:
    sd = _net().state_dict()
    sd["bn.running_mean"] = torch.rand(14, 4)
    for strict in (True, False):
        plain, patched = _side_by_side(_net, sd, strict=strict)
        assert "size mismatch for bn.running_mean" in str(patched)


def test_refused_mismatch_uses_torchs_size_mismatch_line() -> None:
    sd = collections.OrderedDict((f"module.{k}", v) for k, v in _net().state_dict().items())
    sd["module.bn.weight"] = torch.ones(3)
    with st.patched("state_dict"):
        with pytest.raises(st.CheckpointMismatchError) as info:
            _net().load_state_dict(sd)
    text = str(info.value)
    assert text.startswith("Error(s) in loading state_dict for Module:\n\tsize mismatch for ")
    assert (
        "size mismatch for bn.weight: copying a param with shape torch.Size([3]) from "
        "checkpoint, the shape in current model is torch.Size([2])." in text
    )
    assert "\nsafetorch: nothing was loaded" in text


def test_a_refusal_that_is_not_about_keys_starts_with_torchs_text() -> None:
    ambiguous = {
        "module.weight": torch.zeros(2, 2),
        "_orig_mod.weight": torch.zeros(2, 2),
        "bias": torch.zeros(2),
    }
    with pytest.raises(RuntimeError) as plain:
        nn.Linear(2, 2).load_state_dict(ambiguous)
    with st.patched("state_dict"):
        with pytest.raises(st.CheckpointError) as patched:
            nn.Linear(2, 2).load_state_dict(ambiguous)
    assert str(patched.value).startswith(str(plain.value))
    assert "safetorch: ambiguous key mapping" in str(patched.value)


# --- strict=False that leaves parameters unloaded --------------------------------------------
def _whole_and_backbone() -> Tuple[nn.Module, nn.Module]:
    backbone = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))
    return nn.Sequential(backbone, nn.Linear(4, 2)), backbone


def test_non_strict_load_of_nothing_warns_with_the_hint() -> None:
    whole, backbone = _whole_and_backbone()
    with pytest.warns(st.CheckpointWarning) as caught:
        report = st.load_state_dict(backbone, whole.state_dict(), strict=False)
    assert report.loaded == [] and "prefix='0.'" in (report.hint or "")
    (w,) = caught
    message = str(w.message)
    assert "left 4 of 4 parameters of Sequential unloaded" in message
    assert report.summary() in message and "prefix='0.'" in message
    assert w.filename == __file__  # the user's line


def test_non_strict_warning_once_per_call_site() -> None:
    whole, backbone = _whole_and_backbone()
    sd = whole.state_dict()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        for _ in range(3):
            st.load_state_dict(backbone, sd, strict=False)
        st.load_state_dict(backbone, sd, strict=False)  # another line: warned again
    assert [type(w.message) for w in caught] == [st.CheckpointWarning] * 2
    assert caught[0].lineno != caught[1].lineno


def test_non_strict_warning_under_the_patch_points_at_the_caller() -> None:
    whole, backbone = _whole_and_backbone()
    sd = whole.state_dict()
    with st.patched("state_dict"):
        with pytest.warns(st.CheckpointWarning, match="hint: .*prefix='0.'") as caught:
            result = backbone.load_state_dict(sd, strict=False)
    assert caught[0].filename == __file__
    assert "Incompatible" in str(result)


def test_no_warning_for_buffers_or_a_complete_non_strict_load() -> None:
    sd = nn.BatchNorm1d(3).state_dict()
    del sd["running_mean"]  # a buffer: torch lets buffers go missing without a word
    full = nn.Linear(2, 2).state_dict()
    full["extra"] = torch.zeros(1)  # unexpected only: every parameter loaded
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert st.load_state_dict(nn.BatchNorm1d(3), sd, strict=False).missing == ["running_mean"]
        assert st.load_state_dict(nn.Linear(2, 2), full, strict=False).unexpected == ["extra"]


def test_shape_mismatch_skipped_by_strict_false_warns() -> None:
    sd = nn.Linear(3, 2).state_dict()
    with pytest.warns(st.CheckpointWarning, match=r"left 1 of 2 parameters .*\(weight\)"):
        report = st.load_state_dict(nn.Linear(4, 2), sd, strict=False)
    assert [m[0] for m in report.mismatched] == ["weight"]


# --- the other patched entry points ---------------------------------------------------------
def _error_of(call: Callable[[], Any]) -> BaseException:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's deprecation warning before its error
        try:
            call()
        except Exception as exc:  # noqa: BLE001 - compared below, whatever torch raises
            return exc
    raise AssertionError("expected an error")


@pytest.mark.parametrize(
    "call",
    [
        lambda: F.upsample(torch.zeros(1, 1, 2)),  # neither size nor scale_factor
        lambda: F.upsample(torch.zeros(1, 1, 2), size=4, scale_factor=2),
        lambda: F.upsample(torch.zeros(1, 1, 2), size=4, mode="bilinear"),  # 3-D input
        lambda: F.upsample_nearest(torch.zeros(1, 1, 2), size=4, bogus=1),
        lambda: F.upsample_bilinear(torch.zeros(1, 1, 2), size=4),
        lambda: F.upsample_bilinear(),
    ],
    ids=["no-size", "both", "bilinear-3d", "bad-kwarg", "bilinear-of-3d", "no-input"],
)
def test_upsample_errors_are_torchs(call: Callable[[], Any]) -> None:
    plain = _error_of(call)
    with st.patched("upsample"):
        patched = _error_of(call)
    assert type(patched) is type(plain) and str(patched) == str(plain)


def test_convert_sync_batchnorm_refuses_what_torch_refuses() -> None:
    convert = nn.SyncBatchNorm.convert_sync_batchnorm
    for call in (
        lambda: convert(),
        lambda: convert(nn.BatchNorm2d(2), None, None),
        lambda: convert(nn.BatchNorm2d(2), group=None),
    ):
        plain = _error_of(call)
        with st.patched("syncbn"):
            patched = _error_of(call)
        assert type(patched) is type(plain) is TypeError and str(patched) == str(plain)
    with st.patched("syncbn"):  # torch's own keywords route, and so does st's policy=
        bn = nn.BatchNorm2d(2)
        assert nn.SyncBatchNorm.convert_sync_batchnorm(module=bn, process_group=None) is bn
        converted = nn.SyncBatchNorm.convert_sync_batchnorm(bn, policy="portable")
        assert isinstance(converted, st.SyncBatchNorm)


def test_pin_memory_keeps_torchs_parameter_names() -> None:
    from torch.utils.data._utils import pin_memory as pin_module

    params = list(inspect.signature(pin_module.pin_memory).parameters)
    batch = {"x": torch.zeros(2)}
    plain = _error_of(lambda: pin_module.pin_memory(obj=batch))
    with st.patched("pin_memory"):
        out = pin_module.pin_memory(**{params[0]: batch})  # torch's keyword name routes
        patched = _error_of(lambda: pin_module.pin_memory(obj=batch))
    assert torch.equal(out["x"], batch["x"])
    assert type(patched) is type(plain) is TypeError and str(patched) == str(plain)
