"""``st.legacy.volatile`` side by side with ``torch.no_grad()``, its modern spelling.

The same operation on a plain tensor under ``torch.no_grad()`` and on a volatile tensor (no
context manager) gives the same values and flags: ``requires_grad``, ``grad_fn is None``,
``is_leaf``, in-place identity (``out is target``), the version counter and memory sharing
where torch shares. Volatile results are no views (``_is_view()``), on purpose: a view refuses
``detach_()`` (see ``_as_volatile``), so that flag is not compared.
"""

from __future__ import annotations

import copy
import math
from typing import Any, Callable, Dict, Tuple

import torch
import torch.nn as nn
from _strategies import shapes
from hypothesis import given, settings
from hypothesis import strategies as hst

from safetorch import _compat, legacy

V = legacy.volatile


@hst.composite
def _pair(draw: Any, max_dims: int = 3) -> Tuple[torch.Tensor, torch.Tensor]:
    """Two float tensors of one shape (dimensions of size 0 included), small finite values."""
    shape = draw(shapes(max_dims=max_dims, max_size=3))
    n = math.prod(shape)
    values = hst.lists(hst.integers(-8, 8).map(float), min_size=n, max_size=n)
    return torch.tensor(draw(values)).reshape(shape), torch.tensor(draw(values)).reshape(shape)


def _flags(t: torch.Tensor) -> Tuple[Any, ...]:
    return t.requires_grad, t.grad_fn is None, t.is_leaf, tuple(t.shape), t.dtype


def _plain(t: torch.Tensor) -> torch.Tensor:
    return t.as_subclass(torch.Tensor).detach()


# --- results -------------------------------------------------------------------------------
_RESULTS: Dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "mul": lambda x, w: x * w,
    "add_sum": lambda x, w: (x + w).sum(),
    "relu": lambda x, w: torch.relu(x),
    "view": lambda x, w: x.view(-1),
    "unsqueeze": lambda x, w: x.unsqueeze(0),
    "detach": lambda x, w: x.detach(),
    "clone": lambda x, w: x.clone(),
    "to_same": lambda x, w: x.to(torch.float32),
}


@settings(max_examples=40)
@given(pair=_pair(), name=hst.sampled_from(sorted(_RESULTS)))
def test_results_are_no_grad_results(pair: Tuple[torch.Tensor, torch.Tensor], name: str) -> None:
    x, wv = pair
    op = _RESULTS[name]
    w = wv.clone().requires_grad_()
    with torch.no_grad():
        expected = op(x, w)
    got = op(V(x), w)
    assert type(got) is legacy.VolatileTensor
    assert _flags(got) == _flags(expected) and torch.equal(_plain(got), expected)
    assert (got.data_ptr() == x.data_ptr()) == (expected.data_ptr() == x.data_ptr())


# --- 1. .data ------------------------------------------------------------------------------
@settings(max_examples=25)
@given(pair=_pair(), requires_grad=hst.booleans())
def test_data_is_plain_datas(pair: Tuple[torch.Tensor, torch.Tensor], requires_grad: bool) -> None:
    x, wv = pair
    w = wv.clone().requires_grad_()
    with torch.no_grad():
        y_plain = (x * w).requires_grad_(requires_grad)
    y_vol = (V(x) * w).requires_grad_(requires_grad)
    outcome = []
    for y in (y_plain, y_vol):
        data = y.data
        shares = data.data_ptr() == y.data_ptr()
        flags = (type(data), _flags(data), data._is_view(), data.detach_() is data, shares)
        data.add_(1)  # .data has its own version counter: y's does not move
        outcome.append((flags, y._version, data._version, _plain(y).tolist()))
    assert outcome[0] == outcome[1]


def _storage_ptr(t: torch.Tensor) -> int:
    """Where ``t``'s storage starts (``untyped_storage`` from torch 2.0, ``storage`` before)."""
    if _compat.HAS_UNTYPED_STORAGE:
        return t.untyped_storage().data_ptr()
    return t.storage().data_ptr()


# --- 2. copy.deepcopy ----------------------------------------------------------------------
@settings(max_examples=25)
@given(pair=_pair(), requires_grad=hst.booleans(), with_grad=hst.booleans())
def test_deepcopy_is_plain_deepcopy(
    pair: Tuple[torch.Tensor, torch.Tensor], requires_grad: bool, with_grad: bool
) -> None:
    x, g = pair
    plain = x.clone().requires_grad_(requires_grad)
    vol = V(x.clone()).requires_grad_(requires_grad)
    if with_grad:
        plain.grad, vol.grad = g.clone(), g.clone()
    outcome = []
    with torch.no_grad():
        plain_head = plain[:1] if plain.dim() else plain
    for t, head in ((plain, plain_head), (vol, vol[:1] if vol.dim() else vol)):
        twin, twin_head, again = copy.deepcopy((t, head, t))
        fresh = t.numel() == 0 or twin.data_ptr() != t.data_ptr()
        same_storage = _storage_ptr(twin_head) == _storage_ptr(twin)
        grad = None if twin.grad is None else (twin.grad is not t.grad, twin.grad.tolist())
        flags = (_flags(twin), _plain(twin).tolist(), grad)
        outcome.append((flags, again is twin, fresh, same_storage))
    assert outcome[0] == outcome[1]
    twin = copy.deepcopy(vol)
    assert type(twin) is legacy.VolatileTensor  # and still volatile: records nothing
    assert not (twin * torch.ones_like(g, requires_grad=True)).requires_grad


# --- 3. nn.Parameter -----------------------------------------------------------------------
@settings(max_examples=25)
@given(pair=_pair(), requires_grad=hst.booleans())
def test_parameter_is_a_parameter_of_a_no_grad_tensor(
    pair: Tuple[torch.Tensor, torch.Tensor], requires_grad: bool
) -> None:
    x, target = pair
    w = torch.full_like(x, 2.0, requires_grad=True)
    with torch.no_grad():
        source_plain = x * w
    source_vol = V(x) * w
    outcome = []
    for source in (source_plain, source_vol):
        p = nn.Parameter(source, requires_grad=requires_grad)
        state = (type(p), _flags(p), p.data_ptr() == source.data_ptr())
        if requires_grad:
            ((p - target) ** 2).sum().backward()
            torch.optim.SGD([p], lr=0.25).step()
        state += (None if p.grad is None else p.grad.tolist(), p.tolist(), (p * w).requires_grad)
        outcome.append(state)
    assert outcome[0] == outcome[1]
    assert outcome[1][0] is nn.Parameter


# --- 4. in-place ops -----------------------------------------------------------------------
def _iadd(t: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
    t += o
    return t


def _setitem(t: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
    t[...] = o
    return t


_IN_PLACE: Dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "add_": lambda t, o: t.add_(o),
    "mul_": lambda t, o: t.mul_(o),
    "copy_": lambda t, o: t.copy_(o),
    "iadd": _iadd,
    "setitem": _setitem,
    "add_out": lambda t, o: torch.add(o, 1, out=t),
    "clamp_min_keyword": lambda t, o: t.clamp_(min=o),
    "mul_out_self": lambda t, o: torch.mul(t, o, out=t),
}
_TARGETS = {
    "tensor": lambda t: t,
    "parameter": lambda t: nn.Parameter(t),
    "volatile": V,
}


@settings(max_examples=60)
@given(
    pair=_pair(),
    name=hst.sampled_from(sorted(_IN_PLACE)),
    target_kind=hst.sampled_from(sorted(_TARGETS)),
)
def test_in_place_ops_return_their_target_as_under_no_grad(
    pair: Tuple[torch.Tensor, torch.Tensor], name: str, target_kind: str
) -> None:
    base, operand = pair
    op = _IN_PLACE[name]
    # torch.no_grad(): a plain target (a Parameter stays one) and a plain operand; volatile:
    # the volatile target is a volatile tensor, else the operand is volatile.
    plain_target = (nn.Parameter if target_kind == "parameter" else torch.clone)(base.clone())
    with torch.no_grad():
        plain_out = op(plain_target, operand.clone())
    vol_target = _TARGETS[target_kind](base.clone())
    vol_operand = operand.clone() if target_kind == "volatile" else V(operand.clone())
    vol_out = op(vol_target, vol_operand)
    assert plain_out is plain_target and vol_out is vol_target
    assert type(vol_target) is {"tensor": torch.Tensor, "parameter": nn.Parameter}.get(
        target_kind, legacy.VolatileTensor
    )
    assert _flags(vol_target) == _flags(plain_target)
    assert vol_target._version == plain_target._version
    assert torch.equal(_plain(vol_target), _plain(plain_target))


def test_an_out_tuple_and_an_unchanged_to_return_the_arguments_as_under_no_grad() -> None:
    x = torch.rand(2, 3)
    with torch.no_grad():
        values, indices = torch.empty(2), torch.empty(2, dtype=torch.long)
        expected = torch.max(x, 1, out=(values, indices))
    assert expected.values is values and expected.indices is indices
    values, indices = torch.empty(2), torch.empty(2, dtype=torch.long)
    got = torch.max(V(x), 1, out=(values, indices))
    assert got.values is values and got.indices is indices
    assert type(values) is torch.Tensor and torch.equal(values, expected.values)
    w = torch.ones(2, 3)
    assert w.to(V(x)) is w and w.type_as(V(x)) is w  # nothing to change: w itself
    assert type(w.to(V(x.double()))) is legacy.VolatileTensor  # a new tensor computed from it


@settings(max_examples=25, deadline=None)
@given(_pair(max_dims=2), hst.floats(0.0, 1.0))
def test_clearing_volatile_lets_a_no_graph_target_enter_a_loss_as_under_no_grad(
    pair: Tuple[torch.Tensor, torch.Tensor], gamma: float
) -> None:
    # The DDPG/DQN idiom of 0.3: next_q = critic(Variable(s2, volatile=True)); then
    # next_q.volatile = False; target = r + gamma * next_q; loss(q, target).backward().
    state, reward = pair

    def critic_and_q() -> Tuple[nn.Linear, torch.Tensor]:
        torch.manual_seed(0)
        critic = nn.Linear(1, 1)
        return critic, critic(state.reshape(-1, 1)).reshape(state.shape)

    critic_a, q_a = critic_and_q()
    with torch.no_grad():
        modern_next = critic_a(state.reshape(-1, 1) * 0.5).reshape(state.shape)
    ((q_a - (reward + gamma * modern_next)) ** 2).sum().backward()

    critic_b, q_b = critic_and_q()
    legacy_next = critic_b(V(state.reshape(-1, 1) * 0.5)).reshape(state.shape)
    assert legacy_next.volatile
    legacy_next.volatile = False
    assert type(legacy_next) is torch.Tensor and _flags(legacy_next) == _flags(modern_next)
    loss = ((q_b - (reward + gamma * legacy_next)) ** 2).sum()
    assert loss.grad_fn is not None
    loss.backward()
    for a, b in zip(critic_a.parameters(), critic_b.parameters()):
        assert torch.equal(a.grad, b.grad)


def test_volatile_flag_takes_only_a_bool_and_true_keeps_it_volatile() -> None:
    v = V(torch.ones(2))
    v.volatile = True
    assert type(v) is legacy.VolatileTensor and v.volatile
    try:
        v.volatile = 0  # type: ignore[assignment]
    except TypeError as e:
        assert "volatile must be a bool" in str(e)
    else:
        raise AssertionError("volatile = 0 was accepted")
    assert (V(torch.ones(2)) * 2).volatile  # still infectious until cleared
