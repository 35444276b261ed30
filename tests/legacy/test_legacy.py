"""st.legacy against the documented behaviour of the torch releases that had each API.

Sources read: torch 1.x ``torch/_torch_docs.py`` (solve: "(solution, LU)", batches broadcast;
eig: "(n x 2)" rows, packed conjugate-pair eigenvectors, empty tensor without eigenvectors;
lstsq: "max(m, n) x k", residual rows, QR details), 1.x symeig docs (upper triangle by
default, eigenvectors only on request), ATen ``LinearAlgebra.cpp`` ``_matrix_rank_helper``
(svd, or ``symeig(eigenvectors=false)`` -> abs; default tol ``eps * max(m, n) * S.max()``,
``S > tol``), torch 1.5 ``torch/_six.py``, and the 0.4 warning "invalid index of a 0-dim
tensor ... Use tensor.item()" (0.4 returned the 0-dim tensor itself; 0.3's ``loss.data[0]``
was the Python number of a one-element tensor).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from _fixture_run import run_fixture

from safetorch import legacy
from safetorch.errors import PatchWarning

D = torch.float64
FIXTURES = Path(__file__).parents[1] / "check" / "fixtures"


def _rand(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, dtype=D, generator=torch.Generator().manual_seed(sum(shape)))


def test_solve_broadcasts_batches_and_returns_getrf_lu() -> None:
    A = _rand(2, 1, 4, 4) + 4 * torch.eye(4, dtype=D)
    B = _rand(3, 4, 2)
    X, LU = legacy.solve(B, A)
    assert X.shape == (2, 3, 4, 2) and LU.shape == (2, 3, 4, 4)
    torch.testing.assert_close(A @ X, B.expand(2, 3, 4, 2))
    torch.testing.assert_close(LU, torch.linalg.lu_factor(A.expand(2, 3, 4, 4)).LU)
    torch.testing.assert_close(X, torch.linalg.solve(A, B))  # the modern spelling, swapped


def test_solve_docs_example_and_singular() -> None:
    A = torch.tensor(
        [
            [6.80, -2.11, 5.66, 5.97, 8.23],
            [-6.05, -3.30, 5.36, -4.44, 1.08],
            [-0.45, 2.58, -2.70, 0.27, 9.04],
            [8.32, 2.71, 4.35, -7.17, 2.14],
            [-9.67, -5.14, -7.26, 6.08, -6.87],
        ]
    ).t()
    B = torch.tensor(
        [
            [4.02, 6.19, -8.22, -7.57, -3.03],
            [-1.56, 4.00, -8.67, 1.75, 2.86],
            [9.81, -4.09, -4.57, -8.61, 8.99],
        ]
    ).t()
    X, _ = legacy.solve(B, A)
    assert torch.dist(B, A @ X) < 1e-4
    with pytest.raises(RuntimeError, match="singular"):
        legacy.solve(B[:2], torch.zeros(2, 2))
    with pytest.raises(RuntimeError, match="2 dimensions"):
        legacy.solve(torch.ones(2), torch.eye(2))


def test_symeig_reads_upper_triangle_by_default_and_lower_with_upper_false() -> None:
    M = torch.tensor([[2.0, 1.0], [5.0, 3.0]], dtype=D)  # triangles disagree
    upper = torch.tensor([[2.0, 1.0], [1.0, 3.0]], dtype=D)
    lower = torch.tensor([[2.0, 5.0], [5.0, 3.0]], dtype=D)
    values, vectors = legacy.symeig(M)
    torch.testing.assert_close(values, torch.linalg.eigvalsh(upper))
    assert vectors.numel() == 0  # eigenvectors=False: an empty tensor
    values, vectors = legacy.symeig(M, eigenvectors=True, upper=False)
    torch.testing.assert_close(values, torch.linalg.eigvalsh(lower))
    torch.testing.assert_close(vectors @ torch.diag(values) @ vectors.t(), lower)
    batch = _rand(3, 4, 4)
    assert bool((legacy.symeig(batch).eigenvalues.diff(dim=-1) >= 0).all())  # ascending


def test_eig_packs_real_and_complex_eigenpairs_as_torch_1x() -> None:
    rot = torch.tensor([[0.0, -2.0, 0.0], [2.0, 0.0, 0.0], [0.0, 0.0, 3.0]], dtype=D)
    M = rot + 0.1 * _rand(3, 3)
    values, packed = legacy.eig(M, eigenvectors=True)
    assert values.shape == (3, 2) and values.dtype == D and packed.dtype == D
    j = 0
    while j < 3:
        lam = complex(values[j, 0], values[j, 1])
        if values[j, 1] == 0:
            vecs = [(lam, packed[:, j].to(torch.complex128))]
            j += 1
        else:  # the docs: v[:, j] + i v[:, j+1] and its conjugate for eigenvalue j + 1
            assert values[j, 1] > 0 and values[j + 1, 1] == -values[j, 1]
            vecs = [
                (lam, packed[:, j] + 1j * packed[:, j + 1]),
                (lam.conjugate(), packed[:, j] - 1j * packed[:, j + 1]),
            ]
            j += 2
        for eigval, v in vecs:
            torch.testing.assert_close(M.to(torch.complex128) @ v, eigval * v)
            torch.testing.assert_close(torch.linalg.vector_norm(v), torch.tensor(1.0, dtype=D))
    assert legacy.eig(M).eigenvectors.numel() == 0
    with pytest.raises(RuntimeError, match="2-D"):
        legacy.eig(_rand(2, 3, 3))


def test_lstsq_overdetermined_returns_residual_rows() -> None:
    A, B = _rand(6, 3), _rand(6, 2)
    solution, QR = legacy.lstsq(B, A)
    assert solution.shape == (6, 2)
    torch.testing.assert_close(solution[:3], torch.linalg.lstsq(A, B).solution)
    rss = (A @ solution[:3] - B).pow(2).sum(0)
    torch.testing.assert_close(solution[3:].pow(2).sum(0), rss)
    torch.testing.assert_close(QR, torch.geqrf(A).a)


def test_lstsq_underdetermined_is_least_norm_and_vector_b() -> None:
    A, B = _rand(2, 4), _rand(2, 3)
    solution, _ = legacy.lstsq(B, A)
    assert solution.shape == (4, 3)
    torch.testing.assert_close(solution, torch.linalg.pinv(A) @ B)
    column = legacy.lstsq(B[:, 0], A).solution
    torch.testing.assert_close(column, solution[:, :1])


def test_lstsq_rank_deficient_as_gels() -> None:
    exact = torch.tensor([[1.0, 0.0], [0.0, 0.0], [0.0, 0.0]], dtype=D)
    with pytest.raises(RuntimeError, match="2-th diagonal element"):
        legacy.lstsq(torch.ones(3, 1, dtype=D), exact)
    # Numerically deficient: no error, the same (huge) answer as LAPACK gels itself.
    A = torch.tensor([[1.0, 2.0], [2.0, 4.0], [3.0, 6.0]], dtype=D)
    B = torch.ones(3, 1, dtype=D)
    gels = torch.linalg.lstsq(A, B, driver="gels").solution
    torch.testing.assert_close(legacy.lstsq(B, A).solution[:2], gels, rtol=1e-6, atol=0)


def test_matrix_rank_default_tol_explicit_tol_and_symmetric_upper() -> None:
    low = _rand(5, 2) @ _rand(2, 5)
    assert legacy.matrix_rank(low).item() == 2 and legacy.matrix_rank(low).dtype == torch.int64
    S = torch.linalg.svdvals(low)
    assert legacy.matrix_rank(low, tol=float(S[0]) - 1e-9).item() == 1
    M = torch.tensor([[1.0, 0.0], [9.0, 0.0]], dtype=D)  # upper triangle: diag(1, 0)
    assert legacy.matrix_rank(M, symmetric=True).item() == 1
    assert torch.linalg.matrix_rank(M, hermitian=True).item() == 2  # reads the lower one
    with pytest.raises(RuntimeError, match="2-D"):
        legacy.matrix_rank(torch.ones(3))


def test_six_has_the_python3_values_of_torch_1x() -> None:
    import collections.abc
    import math

    six = legacy.six
    assert six.string_classes == (str, bytes) and six.int_classes is int
    assert six.container_abcs is collections.abc and six.inf == math.inf
    assert six.PY3 and not six.PY2 and six.istuple((1,))

    class Meta(type):
        pass

    class Base:
        pass

    C = type("C", (six.with_metaclass(Meta, Base),), {})
    assert type(C) is Meta and issubclass(C, Base)


class _LegacyCube(torch.autograd.Function):
    def __init__(self, scale: float) -> None:
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.save_for_backward(x)
        self.note = "set in forward"
        return self.scale * x**3

    def backward(self, g: torch.Tensor) -> torch.Tensor:
        (x,) = self.saved_tensors
        assert self.note == "set in forward" and self.needs_input_grad == (True,)
        return g * 3 * self.scale * x**2


class _ModernCube(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.save_for_backward(x)
        ctx.scale = scale
        return scale * x**3

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> Any:
        (x,) = ctx.saved_tensors
        return g * 3 * ctx.scale * x**2, None


def test_legacy_function_gradients_identical_to_new_style() -> None:
    x1 = _rand(5).requires_grad_()
    x2 = x1.detach().clone().requires_grad_()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        fn = _LegacyCube(2.0)
    y1 = legacy.legacy_function(fn, x1)
    y2 = _ModernCube.apply(x2, 2.0)
    assert torch.equal(y1, y2)
    y1.sum().backward()
    y2.sum().backward()
    assert torch.equal(x1.grad, x2.grad)
    with pytest.raises(TypeError, match="apply"):
        legacy.legacy_function(_ModernCube, x1)


def test_volatile_is_infectious_no_graph() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
    v = legacy.volatile(torch.ones(2, 3))
    out = model(v)
    assert out.grad_fn is None and not out.requires_grad and out.volatile
    torch.testing.assert_close(out.as_subclass(torch.Tensor), model(torch.ones(2, 3)).detach())


def test_volatile_results_detach_in_place_as_no_grad_results_do() -> None:
    """An RNN language model's evaluation: the hidden state computed from volatile batches is
    repackaged with ``hidden.detach_()``. Computed under ``torch.no_grad()`` it is no view and
    ``detach_()`` works; a volatile result must be the same (it was an alias view, which
    torch refuses to detach in place)."""
    torch.manual_seed(0)
    emb, rnn = torch.nn.Embedding(10, 3), torch.nn.GRU(3, 4)
    tokens = torch.tensor([[1], [2], [3]])
    with torch.no_grad():
        out_ref, hidden_ref = rnn(emb(tokens))
    hidden_ref.detach_()  # plain torch, no_grad: allowed
    out, hidden = rnn(emb(legacy.volatile(tokens)))
    assert not hidden._is_view() and not out._is_view()
    hidden.detach_()
    assert hidden.volatile and hidden.grad_fn is None
    assert torch.equal(hidden.as_subclass(torch.Tensor), hidden_ref)
    assert torch.equal(out.as_subclass(torch.Tensor), out_ref)
    wrapped = legacy.volatile(tokens)
    wrapped.detach_()  # the wrapper itself is no view either, and shares the memory
    tokens.add_(1)
    assert torch.equal(wrapped.as_subclass(torch.Tensor), tokens)
    values, indices = torch.max(legacy.volatile(torch.rand(2, 5)), 1)  # a return type keeps
    assert values.volatile and indices.volatile  # its fields, each volatile


def test_zero_dim_index_is_the_number_or_keeps_the_graph_with_a_warning_at_the_caller() -> None:
    loss = torch.tensor(1.5, requires_grad=True) * 2
    with pytest.warns(PatchWarning, match=r"item\(\)") as caught:
        value = legacy.zero_dim_index(loss, 0)  # requires grad: 0.3's Variable[0], a tensor
    assert caught[0].filename == __file__
    assert value.dim() == 0 and value.item() == 3.0 and value.grad_fn is not None
    with pytest.warns(PatchWarning, match=r"Python number") as caught:
        number = legacy.zero_dim_index(loss.detach(), -1)  # 0.3's Tensor[0]: the number
    assert caught[0].filename == __file__ and type(number) is float and number == 3.0
    assert legacy.zero_dim_index(torch.arange(3), 1).item() == 1
    with pytest.raises(IndexError):
        legacy.zero_dim_index(torch.tensor(1.0), 1)  # only [0] / [-1] were ever accepted


@pytest.mark.parametrize(
    "size_average, reduce, expected",
    [(None, None, "mean"), (False, None, "sum"), (True, False, "none"), (False, False, "none")],
)
def test_reduction_matches_torch_legacy_get_string(
    size_average: Any, reduce: Any, expected: str
) -> None:
    assert legacy.reduction(size_average, reduce) == expected
    torch_says = torch.nn._reduction.legacy_get_string(size_average, reduce, emit_warning=False)
    assert torch_says == expected


@pytest.mark.parametrize("out_name", ["legacy_api.out.py", "legacy_api.safe.out.py"])
def test_fixed_fixture_computes_what_the_shim_computes(out_name: str) -> None:
    shim = run_fixture(FIXTURES / "legacy_api.in.py", patched=True)
    # The safe-fixed file keeps the calls only unsafe fixes rewrite: those still need the shim.
    fixed = run_fixture(FIXTURES / out_name, patched=out_name.endswith(".safe.out.py"))
    for name in ("x", "x2", "ev", "ev_low", "e", "V", "r", "r_tol", "mse", "l1", "nll"):
        a, b = shim[name], fixed[name]
        if isinstance(a, torch.Tensor):
            torch.testing.assert_close(a.as_subclass(torch.Tensor), b, msg=name)
        else:
            assert getattr(a, "reduction", a) == getattr(b, "reduction", b), name
    assert shim["is_map"] is fixed["is_map"] is True
    if out_name == "legacy_api.out.py":  # unsafe fixes: same values, other types/shapes
        assert float(shim["total"]) == fixed["total"]
        torch.testing.assert_close(shim["sol"][:2], fixed["sol"])  # square A: no residual rows
        assert shim["r_sym"].item() == fixed["r_sym"].item()
