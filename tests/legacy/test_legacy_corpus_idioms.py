"""Idioms of the real 2017-2019 scripts measured in ``benchmarks/legacy_corpus`` (issue 34),
re-created in our own words: each run with plain torch (where it fails), under the ``legacy``
patch (what ``safetorch run`` does) and as ``safetorch check --fix`` rewrites it, side by side.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import sysconfig
import textwrap
import warnings
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import pytest
import torch
from _check_project import run_fixed
from hypothesis import given, settings
from hypothesis import strategies as hst

import safetorch as st
from safetorch.check import check_source
from safetorch.errors import PatchWarning
from safetorch.patching import _report

ROOT = str(Path(__file__).resolve().parents[2])

# A Jacobian filled one row per backward pass through the same graph, as 0.2-era tutorials
# wrote it: the first pass keeps the graph for the second.
JACOBIAN = """
    import torch
    from torch.autograd import Variable

    point = Variable(torch.FloatTensor([[1.5, -2.0]]), requires_grad=True)
    out = torch.cat([point[:, :1] ** 2 + 4 * point[:, 1:], point[:, 1:] ** 3 - point[:, :1]], 1)
    rows = []
    out.backward(torch.FloatTensor([[1, 0]]), retain_variables=True)
    rows.append(point.grad.data.clone())
    point.grad.data.zero_()
    out.backward(torch.FloatTensor([[0, 1]]))
    rows.append(point.grad.data.clone())
    jacobian = torch.cat(rows)
"""

EXPECTED = [[3.0, 4.0], [-1.0, 12.0]]  # d(x^2 + 4y, y^3 - x) / d(x, y) at (1.5, -2)


def _exec(source: str) -> Dict[str, Any]:
    namespace: Dict[str, Any] = {}
    exec(compile(textwrap.dedent(source), "<legacy>", "exec"), namespace)
    return namespace


def test_retain_variables_plain_patched_and_fixed() -> None:
    with pytest.raises(TypeError, match="retain_variables"):
        _exec(JACOBIAN)  # plain torch: removed in 0.4
    with st.patched("legacy"):
        patched = _exec(JACOBIAN)["jacobian"]
    fixed_source = textwrap.dedent(JACOBIAN)
    (finding,) = check_source(fixed_source, select=["ST027"])
    assert finding.fix is not None and "retain_graph=" in finding.fix.message
    fixed = run_fixed(fixed_source, ["ST027"])["jacobian"]
    assert patched.tolist() == fixed.tolist() == EXPECTED


@settings(max_examples=20, deadline=None)
@given(hst.booleans(), hst.sampled_from(["method", "function"]))
def test_retain_variables_means_retain_graph(keep: bool, spelling: str) -> None:
    """Under the patch the old keyword does what ``retain_graph`` does with the same value:
    a second pass works after True and raises torch's error after False."""

    def two_passes(**kwargs: bool) -> List[Any]:
        x = torch.tensor([2.0, -1.0], requires_grad=True)
        y = (x.exp() * x).sum()
        results: List[Any] = []
        for _ in range(2):
            try:
                if spelling == "method":
                    y.backward(**kwargs)
                else:
                    torch.autograd.backward([y], **kwargs)
                results.append(x.grad.tolist())
            except RuntimeError as error:
                results.append(type(error))
        return results

    modern = two_passes(retain_graph=keep)
    with st.patched("legacy"):
        legacy = two_passes(retain_variables=keep)
        with pytest.raises(TypeError):  # both names: torch's own error, unchanged
            x = torch.ones(1, requires_grad=True)
            (x * 2).sum().backward(retain_graph=True, retain_variables=True)
    assert legacy == modern


def test_retain_variables_rule_leaves_other_backward_methods_alone() -> None:
    own_api = """
        import torch
        import mylib

        mylib.backward(retain_variables=True)
        class Graph:
            def backward(self, retain_variables=False):
                return retain_variables
        Graph().backward(retain_variables=True)
        torch.ones(1, requires_grad=True).sum().backward(retain_variables=True)
    """
    # another library's function, and a file whose own API takes retain_variables (a fix
    # there could rename the keyword of the project's method): nothing reported
    assert list(check_source(textwrap.dedent(own_api), select=["ST027"])) == []
    both = "import torch\nloss = torch.ones(1, requires_grad=True).sum()\n"
    both += "loss.backward(retain_graph=True, retain_variables=True)\n"
    (finding,) = check_source(both, select=["ST027"])
    assert finding.fix is None  # nothing to rename: torch's own error says what to drop


# The predicted word of a tiny n-gram model, looked up as torch 0.1 code did: max along the
# class dim kept it then, so the index of the best class was pred[0][0].
NGRAM_LOOKUP = """
    import torch
    from torch.autograd import Variable

    idx_to_word = {0: "winter", 1: "brow", 2: "field", 3: "beauty"}
    scores = Variable(torch.FloatTensor([[0.25, -1.0, 2.5, 0.75]]))
    log_prob = torch.nn.functional.log_softmax(scores, 1)
    _, predict_label = torch.max(log_prob, 1)
    predict_word = idx_to_word[predict_label.data[0][0]]
"""


def test_first_index_of_max_along_a_dim_plain_patched_and_fixed() -> None:
    with pytest.raises(IndexError):
        _exec(NGRAM_LOOKUP)  # plain torch: predict_label is 1-D, [0] is 0-dim, [0][0] raises
    with st.patched("legacy"), pytest.warns(PatchWarning):
        patched = _exec(NGRAM_LOOKUP)["predict_word"]
    source = textwrap.dedent(NGRAM_LOOKUP)
    (finding,) = check_source(source, select=["ST020"])
    assert finding.fix is not None
    assert "predict_label.data.flatten()[0].item()" in finding.fix.message
    assert patched == run_fixed(source, ["ST020"])["predict_word"] == "field"


@settings(max_examples=25, deadline=None)
@given(
    hst.lists(
        hst.lists(hst.floats(-5, 5, allow_nan=False), min_size=3, max_size=3),
        min_size=1,
        max_size=4,
    ),
    hst.booleans(),
)
def test_flatten_first_is_what_either_era_read(rows: List[List[float]], three_d: bool) -> None:
    """``pred.flatten()[0]`` is ``pred[0][0]`` of torch 0.1's kept dim ((N, 1) for a 2-D
    input) and of 0.2-0.3's dropped one ((N, L) for a 3-D input)."""
    scores = torch.tensor(rows)
    if three_d:
        scores = scores.unsqueeze(2).expand(-1, -1, 2)
    kept = scores.max(1, keepdim=True)[1]  # torch 0.1's shape
    dropped = scores.max(1)[1]  # 0.2's and today's
    # a number then: [0][0] of (N, 1) under 0.1 for a 2-D input, of (N, L) under 0.2-0.3 for
    # a 3-D one ((N, 1, L)[0][0] under 0.1 was a row, never a dict key)
    old = dropped[0][0] if three_d else kept[0][0]
    assert dropped.flatten()[0].item() == old.item()


# --- a BCELoss target of the input's size in another shape ----------------------------------
# Element by element, in order, as torch 0.2-1.6 computed it (THNN's BCECriterion walked both
# tensors' elements; a weight was first expanded to the target's shape): the reference,
# written out from the formula rather than through the shim's own reshape.
def _bce_in_order(
    x: torch.Tensor, t: torch.Tensor, w: Optional[torch.Tensor], reduction: str
) -> torch.Tensor:
    flat_t = t.reshape(-1)
    per = -(
        flat_t * torch.clamp(torch.log(x.reshape(-1)), min=-100)
        + (1 - flat_t) * torch.clamp(torch.log(1 - x.reshape(-1)), min=-100)
    )
    if w is not None:
        per = per * w.expand(torch.broadcast_shapes(t.shape, w.shape)).reshape(-1)
    if reduction == "none":
        return per.reshape(x.shape)
    return per.sum() if reduction == "sum" else per.mean()


def _arrangements(n: int, m: int) -> List[Tuple[int, ...]]:
    """Shapes of ``n * m`` elements, as loss inputs and targets come."""
    shapes = [(n * m,), (n * m, 1), (1, n * m), (n, m), (m, n), (n, m, 1), (n, 1, m)]
    return [*shapes, ()] if n * m == 1 else shapes


def _raised(fn: Any) -> Any:
    try:
        return fn()
    except (ValueError, RuntimeError) as error:
        return error


@settings(max_examples=60, deadline=None)
@given(
    hst.integers(1, 4),
    hst.integers(1, 3),
    hst.data(),
    hst.sampled_from(["mean", "sum", "none"]),
    hst.sampled_from(["none", "one", "target", "last", "input", "other size"]),
    hst.booleans(),
)
def test_bce_target_of_another_shape_pairs_in_order_as_before(
    n: int, m: int, data: Any, reduction: str, weighting: str, module: bool
) -> None:
    """Plain torch and the patch side by side: the same shape is torch's own result; another
    shape of the same size raised and now gives the in-order result (loss and gradient);
    another size, or a weight that does not fit, is torch's own error."""
    shape_x = data.draw(hst.sampled_from(_arrangements(n, m)), "input")
    shape_t = data.draw(hst.sampled_from(_arrangements(n, m) + [(n * m + 1, 1)]), "target")
    gen = torch.Generator().manual_seed(n * 7 + m)
    x = (torch.rand(shape_x, generator=gen) * 0.9 + 0.05).requires_grad_()
    t = torch.randint(0, 2, shape_t, generator=gen).float()
    w = {
        "none": None,
        "one": torch.tensor([1.5]),
        "target": torch.rand(shape_t, generator=gen) + 0.5,
        "last": torch.rand(shape_t[-1:], generator=gen) + 0.5,
        "input": torch.rand(shape_x, generator=gen) + 0.5,
        "other size": torch.rand(3, 5, generator=gen),
    }[weighting]

    def loss() -> torch.Tensor:
        if module:
            return torch.nn.BCELoss(weight=w, reduction=reduction)(x, t)
        return torch.nn.functional.binary_cross_entropy(x, t, w, reduction=reduction)

    plain = _raised(loss)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PatchWarning)
        with st.patched("legacy"):
            patched = _raised(loss)
    if not isinstance(plain, Exception):
        assert torch.equal(patched, plain)  # same shapes (and a fitting weight): torch's own
        return
    reference = _raised(lambda: _bce_in_order(x, t, w, reduction))
    in_order = t.numel() == x.numel() and not isinstance(reference, Exception)
    if w is not None and in_order:
        in_order = torch.broadcast_shapes(t.shape, w.shape).numel() == x.numel()
    if not in_order:  # another size, or a weight 0.2-1.6 could not pair: torch's error
        assert type(patched) is type(plain) and str(patched) == str(plain)
        return
    assert isinstance(plain, ValueError) and "target size" in str(plain)
    torch.testing.assert_close(patched, reference)
    assert patched.shape == reference.shape  # reduction="none": the input's shape
    (grad,) = torch.autograd.grad(patched.sum(), x)
    (expected,) = torch.autograd.grad(reference.sum(), x)
    torch.testing.assert_close(grad, expected)


def test_bce_shim_is_for_project_code_warns_once_per_line_and_is_reported() -> None:
    x = torch.full((3,), 0.25)
    t = torch.ones(3, 1)
    lib_file = os.path.join(sysconfig.get_paths()["purelib"], "_st_fake_gan_lib.py")
    library = compile("result = torch.nn.BCELoss()(x, t)", lib_file, "exec")
    _report.reset_counts()
    with st.patched("legacy"):
        with pytest.raises(ValueError, match="target size"):
            exec(library, {"torch": torch, "x": x, "t": t})  # an installed library: torch's
        with pytest.warns(PatchWarning, match="view_as") as caught:
            for _ in range(3):
                loss = torch.nn.BCELoss()(x, t)  # one line, three calls: one warning
        kinds = [e.kind for e in _report.entries() if "view_as" in e.kind]
    assert len([w for w in caught if issubclass(w.category, PatchWarning)]) == 1
    assert loss.item() == pytest.approx(-math.log(0.25))
    assert len(kinds) == 1 and "test_legacy_corpus_idioms.py" in kinds[0], kinds
    _report.reset_counts()


# A 1-D GAN in the style of 2017-2018 tutorials, in our own words: the discriminator's
# (N, 1) output squeezed to (N,), its labels built as (N, 1) ones and zeros.
TINY_GAN = """
    import torch
    import torch.nn as nn
    from torch.autograd import Variable

    torch.manual_seed(3)
    batch = 8
    gen = nn.Sequential(nn.Linear(2, 8), nn.Tanh(), nn.Linear(8, 1))
    disc = nn.Sequential(nn.Linear(1, 8), nn.ReLU(), nn.Linear(8, 1), nn.Sigmoid())
    criterion = nn.BCELoss()
    g_opt = torch.optim.SGD(gen.parameters(), lr=0.05)
    d_opt = torch.optim.SGD(disc.parameters(), lr=0.05)
    real_label = Variable(torch.ones(batch, 1))
    fake_label = Variable(torch.zeros(batch, 1))
    for step in range(3):
        real = Variable(torch.randn(batch, 1) * 0.5 + 2.0)
        noise = Variable(torch.randn(batch, 2))
        d_opt.zero_grad()
        d_real = disc(real).squeeze()
        d_fake = disc(gen(noise).detach()).squeeze()
        d_loss = criterion(d_real, real_label) + criterion(d_fake, fake_label)
        d_loss.backward()
        d_opt.step()
        g_opt.zero_grad()
        g_loss = criterion(disc(gen(noise)).squeeze(), real_label)
        g_loss.backward()
        g_opt.step()
        print("step %d  d_loss %.6f  g_loss %.6f" % (step, d_loss.item(), g_loss.item()))
"""


def test_gan_with_squeezed_output_and_column_labels_runs_under_safetorch_run(
    tmp_path: Path,
) -> None:
    script = tmp_path / "tiny_gan.py"
    script.write_text(textwrap.dedent(TINY_GAN))
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAFETORCH_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, env.get("PYTHONPATH")]))

    def run(*prefix: str) -> "subprocess.CompletedProcess[str]":
        return subprocess.run(
            [sys.executable, *prefix, str(script)],
            capture_output=True,
            text=True,
            env=env,
            cwd=tmp_path,
            timeout=300,
        )

    plain = run()
    assert plain.returncode != 0 and "ValueError: Using a target size" in plain.stderr
    shimmed = run("-m", "safetorch", "run")
    assert shimmed.returncode == 0, shimmed.stderr
    lines = [line for line in shimmed.stdout.splitlines() if line.startswith("step")]
    assert len(lines) == 3
    # what the hand-written modern spelling (labels of the output's shape) computes
    modern = textwrap.dedent(TINY_GAN).replace("(batch, 1))", "(batch))")
    by_hand = subprocess.run(
        [sys.executable, "-c", modern], capture_output=True, text=True, env=env, timeout=300
    )
    assert by_hand.returncode == 0, by_hand.stderr
    assert lines == by_hand.stdout.splitlines()
    assert "view_as" in shimmed.stderr  # the warning, and the report's line


def test_gan_labels_fixed_by_st028_run_plain_as_under_safetorch_run(tmp_path: Path) -> None:
    """The same GAN with the generator's score named: ``check --fix --unsafe-fixes`` (ST028)
    reshapes each label to its input, and plain python then prints what ``safetorch run``
    prints for the unedited script."""
    source = textwrap.dedent(TINY_GAN).replace(
        "g_loss = criterion(disc(gen(noise)).squeeze(), real_label)",
        "g_out = disc(gen(noise)).squeeze()\n    g_loss = criterion(g_out, real_label)",
    )
    assert "g_out = " in source
    script = tmp_path / "gan.py"
    script.write_text(source)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAFETORCH_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, env.get("PYTHONPATH")]))

    def run(*args: str) -> "subprocess.CompletedProcess[str]":
        return subprocess.run(
            [sys.executable, *args],
            capture_output=True,
            text=True,
            env=env,
            cwd=tmp_path,
            timeout=300,
        )

    assert "ValueError: Using a target size" in run(str(script)).stderr
    shimmed = run("-m", "safetorch", "run", "--no-report", str(script))
    assert shimmed.returncode == 0, shimmed.stderr
    fix = run(
        "-m",
        "safetorch",
        "check",
        "--isolated",
        "--select",
        "ST028",
        "--fix",
        "--unsafe-fixes",
        "-q",
        "--exit-zero",
        str(script),
    )
    assert fix.returncode == 0, fix.stderr
    assert script.read_text().count(".reshape_as(") == 3
    fixed = run(str(script))
    assert fixed.returncode == 0, fixed.stderr
    steps = [line for line in fixed.stdout.splitlines() if line.startswith("step")]
    assert len(steps) == 3
    assert steps == [line for line in shimmed.stdout.splitlines() if line.startswith("step")]
