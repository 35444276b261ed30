"""ST012: a non-strict load whose keys a helper of the same file compares with the model's
first is not a finding; a helper that only takes the same arguments still is."""

from __future__ import annotations

import textwrap

import pytest

from safetorch.check import check_source

HELPERS = """
import torch


def report_keys(net, weights):
    wanted = set(net.state_dict().keys())
    given = set(weights.keys())
    print("missing", len(wanted - given), "unused", len(given - wanted))
    assert wanted & given, "nothing matched"


def only_prints(net, weights):
    print(type(net).__name__, len(weights))


def compares_other_things(net, weights):
    names = set(weights)
    return names - {"step", "epoch"}
"""


def _codes(body: str) -> list:
    source = HELPERS + textwrap.dedent(body)
    return [d.code for d in check_source(source, "sample.py", select=["ST012"])]


def test_key_checker_called_with_the_model_and_the_dict_is_quiet() -> None:
    assert (
        _codes(
            """
        def restore(model, path):
            sd = torch.load(path, map_location="cpu", weights_only=True)
            report_keys(model, sd)
            model.load_state_dict(sd, strict=False)
        """
        )
        == []
    )


def test_argument_order_follows_the_helper_signature() -> None:
    # helper(weights, net): the dict goes first; matched by position, not by name
    source = """
        def check(weights, net):
            extra = set(weights) - set(net.state_dict())
            print(sorted(extra))

        def restore(model, sd):
            check(sd, model)
            model.load_state_dict(sd, strict=False)
        """
    assert _codes(source) == []


@pytest.mark.parametrize(
    "call",
    [
        "only_prints(model, sd)",  # looks at neither key set
        "compares_other_things(model, sd)",  # compares, but not with the model's keys
        "report_keys(other, sd)",  # another model's keys
        "report_keys(model, backup)",  # another dict's keys
        "report_keys(net=model, weights=sd)",  # keywords: not resolved, stays reported
    ],
)
def test_helpers_that_do_not_compare_these_keys_leave_the_finding(call: str) -> None:
    assert _codes(
        f"""
        def restore(model, other, sd, backup):
            {call}
            model.load_state_dict(sd, strict=False)
        """
    ) == ["ST012"]


def test_an_unknown_function_is_not_taken_as_a_checker() -> None:
    assert _codes(
        """
        from somewhere import check_keys

        def restore(model, sd):
            check_keys(model, sd)
            model.load_state_dict(sd, strict=False)
        """
    ) == ["ST012"]


# --- red team: helpers and call sites that only look like a key check ----------------------
REPORTING = (
    "def look(net, weights):\n"
    "    extra = set(weights) - set(net.state_dict())\n    assert not extra, extra\n"
)


@pytest.mark.parametrize(
    "helper, body",
    [
        (  # the difference is computed and dropped
            "def look(net, weights):\n    set(weights.keys()) - set(net.state_dict().keys())\n",
            "look(model, sd)\nmodel.load_state_dict(sd, strict=False)",
        ),
        (  # the result is returned and the caller ignores it
            "def look(net, weights):\n    missing = set(net.state_dict()) - set(weights)\n"
            "    return not missing\n",
            "look(model, sd)\nmodel.load_state_dict(sd, strict=False)",
        ),
        (  # a count, not the keys: a prefixed checkpoint has the same length
            "def look(net, weights):\n    if len(weights) - len(net.state_dict()) != 0:\n"
            "        print('different sizes')\n",
            "look(model, sd)\nmodel.load_state_dict(sd, strict=False)",
        ),
        (  # values, not keys
            "def look(net, weights):\n    own = net.state_dict()\n"
            "    for k in own:\n        print((weights[k] - own[k]).abs().max())\n",
            "look(model, sd)\nmodel.load_state_dict(sd, strict=False)",
        ),
        (  # the dict is rebuilt after the check
            REPORTING,
            "look(model, sd)\nsd = {'module.' + k: v for k, v in sd.items()}\n"
            "model.load_state_dict(sd, strict=False)",
        ),
        (  # checked after the load
            REPORTING,
            "model.load_state_dict(sd, strict=False)\nlook(model, sd)",
        ),
        (  # a local function of the same name shadows the checker
            REPORTING,
            "def look(a, b):\n    pass\nlook(model, sd)\nmodel.load_state_dict(sd, strict=False)",
        ),
    ],
    ids=["dropped", "return-ignored", "count", "values", "rebound", "after", "shadowed"],
)
def test_what_only_looks_like_a_key_check_stays_reported(helper: str, body: str) -> None:
    source = "import torch\n\n" + helper + "\n\ndef restore(model, sd):\n"
    source += textwrap.indent(body, "    ") + "\n"
    assert [d.code for d in check_source(source, "s.py", select=["ST012"])] == ["ST012"]


def test_a_checker_that_asserts_on_the_difference_is_quiet() -> None:
    source = "import torch\n\n" + REPORTING
    source += "\n\ndef restore(model, sd):\n    look(model, sd)\n"
    source += "    model.load_state_dict(sd, strict=False)\n"
    assert check_source(source, "s.py", select=["ST012"]) == []


# --- a reference the helper compares against may be another model's ---------------------------
_DEFAULTED = """
def check_keys(net, weights, ref=None):
    ref = ref if ref is not None else net.state_dict()
    missing = set(ref) - set(weights)
    assert not missing, missing
"""


def test_a_reference_passed_in_place_of_the_models_keys_leaves_the_finding() -> None:
    # The helper falls back to the model's keys only when no reference is given: here the
    # teacher's are, so the student's own keys are never compared.
    assert _codes(
        _DEFAULTED
        + """
def load(model, teacher, sd):
    check_keys(model, sd, teacher.state_dict())
    model.load_state_dict(sd, strict=False)
"""
    ) == ["ST012"]


def test_the_models_keys_by_default_are_a_key_check() -> None:
    assert (
        _codes(
            _DEFAULTED
            + """
def load(model, sd):
    check_keys(model, sd)
    model.load_state_dict(sd, strict=False)
"""
        )
        == []
    )
