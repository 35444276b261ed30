"""When eval mode is much worse than train mode: BatchNorm running statistics.

In eval mode BatchNorm normalizes with its running statistics instead of the batch's. When
those are stale (weights changed after the last update: SWA, fine-tuning with frozen BN,
loaded from elsewhere), never updated (``num_batches_tracked == 0``), computed with Dropout
active upstream, or corrupted (NaN/Inf), eval outputs are far off while train-mode outputs
look fine. :func:`bn_report` shows the statistics, :func:`recalibrate_bn` recomputes them, and
:func:`eval_mode` evaluates without flattening each submodule's own train/eval flag.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Tuple

import torch
import torch.nn as nn

from safetorch._compat import BatchNormBase as _BatchNorm

__all__: List[str] = ["recalibrate_bn", "eval_mode", "bn_report", "BNLayerStats"]


@contextlib.contextmanager
def eval_mode(model: nn.Module) -> Iterator[nn.Module]:
    """Put ``model`` in eval mode, then restore each submodule's own training flag.

    ``model.train()`` after ``model.eval()`` sets *every* submodule to training, which undoes
    deliberate choices such as frozen BatchNorm layers kept in eval mode; this restores each
    flag as it was, also when the block raises.

    Args:
        model: The module.

    Returns:
        A context manager yielding ``model``.

    >>> import torch.nn as nn, safetorch as st
    >>> model = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
    >>> _ = model[1].eval()  # a frozen BN inside a training model
    >>> with st.eval_mode(model):
    ...     model.training
    False
    >>> model.training, model[1].training
    (True, False)
    """
    flags = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        yield model
    finally:
        for module, training in flags:
            module.training = training


def _default_forward(model: nn.Module, batch: Any) -> Any:
    if isinstance(batch, torch.Tensor):
        return model(batch)
    if isinstance(batch, (list, tuple)) and batch and isinstance(batch[0], torch.Tensor):
        return model(batch[0])  # (inputs, targets, ...) as torch.optim.swa_utils.update_bn
    if isinstance(batch, dict):
        raise TypeError(
            f"recalibrate_bn cannot tell which entry of a dict batch is the model input "
            f"(keys: {sorted(map(str, batch))}); pass forward_fn, e.g. "
            "forward_fn=lambda model, batch: model(batch['image'])"
        )
    raise TypeError(
        f"recalibrate_bn got a batch of type {type(batch).__name__}; expected a Tensor or a "
        "(inputs, ...) tuple/list; pass forward_fn=lambda model, batch: ... for other batches"
    )


def recalibrate_bn(
    model: nn.Module,
    loader: Iterable[Any],
    *,
    num_batches: Optional[int] = None,
    forward_fn: Optional[Callable[[nn.Module, Any], Any]] = None,
) -> int:
    """Recompute every BatchNorm layer's running statistics from ``loader``.

    Like ``torch.optim.swa_utils.update_bn``: the running statistics are reset and rebuilt
    with cumulative averaging (``momentum=None``), one equally weighted update per batch, under
    ``torch.no_grad()``. Differences: only the BatchNorm layers are put in training mode (all
    other modules run in eval mode, so Dropout is off and the statistics are those eval mode
    will see); every module's training flag and every layer's momentum are restored
    afterwards, not flattened to the model's top-level flag; if the loader yields no batch or
    a forward raises, the previous statistics are restored.

    Args:
        model: The model; its BatchNorm layers with ``track_running_stats`` are recalibrated.
        loader: Any iterable of batches (a DataLoader).
        num_batches: Use at most this many batches; ``None`` for the whole loader.
        forward_fn: ``forward_fn(model, batch)`` runs one batch (move it to the device, pick
            the input out of a dict, ...). Default: ``model(batch)`` for a tensor,
            ``model(batch[0])`` for a tuple/list.

    Returns:
        The number of batches used (0 when the model has no layer to recalibrate).

    Raises:
        ValueError: ``num_batches`` is not positive, or the loader yielded no batch.
        TypeError: A batch the default ``forward_fn`` cannot handle (e.g. a dict).

    >>> import torch, torch.nn as nn, safetorch as st
    >>> model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    >>> loader = [(torch.randn(8, 3), torch.zeros(8)) for _ in range(5)]
    >>> st.recalibrate_bn(model, loader)
    5
    >>> int(model[1].num_batches_tracked)
    5
    """
    if num_batches is not None and num_batches <= 0:
        raise ValueError(f"num_batches must be a positive int or None, got {num_batches!r}")
    layers = [m for m in model.modules() if isinstance(m, _BatchNorm) and m.track_running_stats]
    if not layers:
        return 0
    run = forward_fn if forward_fn is not None else _default_forward
    flags = [(module, module.training) for module in model.modules()]
    saved = [(layer, layer.momentum, _buffers_of(layer)) for layer in layers]
    used = 0
    ok = False
    try:
        model.eval()
        for layer in layers:
            layer.reset_running_stats()
            layer.momentum = None  # cumulative average over the batches
            layer.train()
        with torch.no_grad():
            for batch in loader:
                if num_batches is not None and used >= num_batches:
                    break
                run(model, batch)
                used += 1
        if used == 0:
            raise ValueError(
                "recalibrate_bn: the loader yielded no batch; the running statistics were "
                "left unchanged"
            )
        ok = True
    finally:
        for module, training in flags:
            module.training = training
        for layer, momentum, buffers in saved:
            layer.momentum = momentum
            if not ok:
                _restore_buffers(layer, buffers)
    return used


def _buffers_of(layer: _BatchNorm) -> Dict[str, torch.Tensor]:
    names = ("running_mean", "running_var", "num_batches_tracked")
    return {n: getattr(layer, n).clone() for n in names if getattr(layer, n) is not None}


def _restore_buffers(layer: _BatchNorm, buffers: Dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        for name, value in buffers.items():
            getattr(layer, name).copy_(value)


@dataclass(frozen=True)
class BNLayerStats:
    """Running statistics of one BatchNorm layer, as :func:`bn_report` lists them.

    Attributes:
        path: Module path (``"layer1.0.bn1"``).
        kind: Class name.
        training: The layer's training flag.
        num_batches_tracked: Updates seen; 0 means the statistics are still the defaults.
        momentum: The layer's momentum (``None``: cumulative average).
        mean_min, mean_max: Range of ``running_mean`` (NaN when not tracked).
        var_min, var_max: Range of ``running_var`` (NaN when not tracked).
        nonfinite: Number of NaN/Inf values in ``running_mean`` and ``running_var``.
        problems: Short descriptions of what looks wrong (empty when nothing does).

    >>> import torch.nn as nn, safetorch as st
    >>> st.bn_report(nn.BatchNorm1d(2))[0].problems
    ('never updated (num_batches_tracked=0): running stats are the defaults mean=0, var=1',)
    """

    path: str
    kind: str
    training: bool
    num_batches_tracked: Optional[int]
    momentum: Optional[float]
    mean_min: float
    mean_max: float
    var_min: float
    var_max: float
    nonfinite: int
    problems: Tuple[str, ...]

    def __str__(self) -> str:
        tracked = "-" if self.num_batches_tracked is None else str(self.num_batches_tracked)
        text = (
            f"{self.path or '<root>'} ({self.kind}): batches={tracked} "
            f"mean=[{self.mean_min:.4g}, {self.mean_max:.4g}] "
            f"var=[{self.var_min:.4g}, {self.var_max:.4g}] nonfinite={self.nonfinite}"
        )
        return text + "".join(f"\n  ! {p}" for p in self.problems)


def _range(t: Optional[torch.Tensor]) -> Tuple[float, float, int]:
    if t is None or t.numel() == 0:
        return math.nan, math.nan, 0
    t = t.detach().float()
    finite = torch.isfinite(t)
    bad = int((~finite).sum())
    values = t[finite]
    if values.numel() == 0:
        return math.nan, math.nan, bad
    return float(values.min()), float(values.max()), bad


def bn_report(model: nn.Module) -> List[BNLayerStats]:
    """Per-BatchNorm-layer running statistics, with what looks stale or broken.

    Flags layers never updated (``num_batches_tracked == 0``), NaN/Inf in the running
    statistics, a zero or negative running variance, and layers without running statistics
    (eval mode then normalizes with each batch's own statistics).

    Args:
        model: The model (or a single BatchNorm layer).

    Returns:
        One :class:`BNLayerStats` per BatchNorm layer, in ``named_modules()`` order;
        ``print("\\n".join(map(str, report)))`` shows them.

    >>> import torch, torch.nn as nn, safetorch as st
    >>> model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    >>> _ = model(torch.randn(8, 3))
    >>> [(r.path, r.num_batches_tracked, r.problems) for r in st.bn_report(model)]
    [('1', 1, ())]
    """
    rows: List[BNLayerStats] = []
    for path, module in model.named_modules():
        if not isinstance(module, _BatchNorm):
            continue
        mean_min, mean_max, bad_mean = _range(module.running_mean)
        var_min, var_max, bad_var = _range(module.running_var)
        tracked = (
            int(module.num_batches_tracked) if module.num_batches_tracked is not None else None
        )
        problems: List[str] = []
        if module.running_mean is None:
            problems.append(
                "no running stats (track_running_stats=False): eval mode uses batch statistics"
            )
        elif tracked == 0:
            problems.append(
                "never updated (num_batches_tracked=0): running stats are the defaults "
                "mean=0, var=1"
            )
        if bad_mean or bad_var:
            problems.append(f"{bad_mean + bad_var} NaN/Inf value(s) in the running stats")
        if not math.isnan(var_min) and var_min <= 0:
            problems.append(f"running_var min {var_min:.3g} <= 0: eval divides by ~sqrt(eps)")
        rows.append(
            BNLayerStats(
                path=path,
                kind=type(module).__name__,
                training=module.training,
                num_batches_tracked=tracked,
                momentum=module.momentum,
                mean_min=mean_min,
                mean_max=mean_max,
                var_min=var_min,
                var_max=var_max,
                nonfinite=bad_mean + bad_var,
                problems=tuple(problems),
            )
        )
    return rows
