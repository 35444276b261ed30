"""``lint_model``: find (and fix) the BatchNorm / Dropout / bias pitfalls in a model.

Rules (``Finding.rule``):

* ``bias-before-bn``: a Conv/Linear bias feeding straight into BatchNorm is cancelled by
  BN's mean subtraction (wasted parameters and optimizer state). ``fix=True`` removes it and
  folds it into BN's ``running_mean``, so eval outputs stay the same and training outputs do
  not change.
* ``dropout-before-bn``: Dropout upstream of BatchNorm shifts the variance BN sees between
  training (dropout on) and eval (off): the running variance does not match eval inputs.
* ``bn-no-running-stats``: ``track_running_stats=False`` normalizes with each batch's own
  statistics in eval mode too: outputs depend on what else is in the batch.
* ``bn-momentum``: a momentum that makes the running statistics meaningless (``<= 0``: never
  updated; ``>= 0.5``: mostly the last batch, often the Keras convention ``0.99`` where torch
  wants ``0.01``).
* ``bn-batch-of-one``: with ``example_input``, a BatchNorm that sees one sample per batch
  (training raises, or normalizes with one sample's statistics).
* ``torch-syncbn-device``: a ``torch.nn.SyncBatchNorm`` on a device where it raises.

The data flow comes from ``torch.fx`` when the model traces, from forward hooks on a run of
``example_input`` otherwise, and from ``nn.Sequential`` order as a last resort.
"""

from __future__ import annotations

import logging
import math
import warnings
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn

from safetorch import _dist
from safetorch._compat import BatchNormBase as _BatchNorm
from safetorch._compat import ConvNdBase as _ConvNd
from safetorch._compat import DropoutNdBase as _DropoutNd
from safetorch._nest import iter_tensors
from safetorch.findings import Finding
from safetorch.nn import syncbn as _syncbn
from safetorch.nn.batchnorm import eval_mode

__all__: List[str] = ["lint_model"]

_log = logging.getLogger("safetorch")

# Modules through which a Dropout-induced variance shift reaches a later BatchNorm unchanged
# in kind: element-wise activations, weight layers, pooling, reshapes, further dropouts.
_PASS_THROUGH_MODULES: Tuple[type, ...] = (
    nn.ReLU,
    nn.ReLU6,
    nn.LeakyReLU,
    nn.PReLU,
    nn.ELU,
    nn.SELU,
    nn.CELU,
    nn.GELU,
    nn.SiLU,
    nn.Mish,
    nn.Hardswish,
    nn.Hardsigmoid,
    nn.Hardtanh,
    nn.Sigmoid,
    nn.Tanh,
    nn.Softplus,
    nn.Identity,
    nn.Flatten,
    nn.Unflatten,
    _ConvNd,
    nn.Linear,
    nn.modules.pooling._MaxPoolNd,
    nn.modules.pooling._AvgPoolNd,
    nn.modules.pooling._AdaptiveAvgPoolNd,
    nn.modules.pooling._AdaptiveMaxPoolNd,
    _DropoutNd,
)
# torch.fx call_function / call_method targets (by name) that pass a tensor through likewise.
_PASS_THROUGH_FUNCTIONS = frozenset(
    "relu relu_ relu6 leaky_relu elu selu celu gelu silu mish hardswish hardsigmoid hardtanh "
    "sigmoid tanh softplus flatten view reshape contiguous squeeze unsqueeze max_pool1d "
    "max_pool2d max_pool3d avg_pool1d avg_pool2d avg_pool3d adaptive_avg_pool1d "
    "adaptive_avg_pool2d adaptive_avg_pool3d dropout dropout1d dropout2d dropout3d "
    "linear conv1d conv2d conv3d".split()
)
_MAX_HOPS = 8
_LEAF_TYPES: Tuple[type, ...] = (_BatchNorm, _ConvNd, nn.Linear, _DropoutNd, nn.Upsample)


class _Node:
    """One call in the model's data flow: a module call (``path``) or a functional op."""

    __slots__ = ("path", "module", "op", "inputs", "users")

    def __init__(self, path: Optional[str], module: Optional[nn.Module], op: str) -> None:
        self.path = path
        self.module = module
        self.op = op
        self.inputs: List[_Node] = []
        self.users: List[_Node] = []

    def connect(self, inputs: Sequence[_Node]) -> None:
        for node in inputs:
            if node not in self.inputs:
                self.inputs.append(node)
                node.users.append(self)


def _graph_from_fx(model: nn.Module) -> List[_Node]:
    import torch.fx

    class Tracer(torch.fx.Tracer):
        # Layers the rules look at stay single nodes even when defined outside torch.nn
        # (st.SyncBatchNorm, BN subclasses, custom convs): fx would trace into them.
        def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
            return isinstance(m, _LEAF_TYPES) or super().is_leaf_module(m, qualname)

    with warnings.catch_warnings():  # tracing warnings are not the user's concern here
        warnings.simplefilter("ignore")
        graph = Tracer().trace(model)
    nodes: Dict[Any, _Node] = {}
    for fx_node in graph.nodes:
        if fx_node.op == "call_module":
            node = _Node(fx_node.target, model.get_submodule(fx_node.target), "call_module")
        else:
            name = getattr(fx_node.target, "__name__", str(fx_node.target))
            node = _Node(None, None, name if fx_node.op.startswith("call_") else fx_node.op)
        node.connect([nodes[n] for n in fx_node.all_input_nodes])
        nodes[fx_node] = node
    return list(nodes.values())


def _tensors_in(value: Any) -> List[torch.Tensor]:
    # The inputs and outputs of module calls, through every container safetorch knows.
    return list(iter_tensors(value))


def _run_with_hooks(
    model: nn.Module, args: Tuple[Any, ...], kwargs: Dict[str, Any]
) -> Tuple[List[_Node], Dict[str, Tuple[int, ...]], Optional[BaseException]]:
    """Run ``model`` once (eval mode, no grad): the module-call graph, each leaf's input shape
    and the exception the run raised (shapes up to the failing layer are kept)."""
    nodes: List[_Node] = []
    producer: Dict[int, _Node] = {}
    alive: List[torch.Tensor] = []  # keeps tensors alive so their ids are not reused
    shapes: Dict[str, Tuple[int, ...]] = {}

    def pre_hook(inputs: Any, path: str) -> None:
        tensors = _tensors_in(inputs)
        if tensors:
            shapes.setdefault(path, tuple(tensors[0].shape))

    def hook(module: nn.Module, inputs: Any, output: Any, path: str) -> None:
        node = _Node(path, module, "call_module")
        node.connect([producer[id(t)] for t in _tensors_in(inputs) if id(t) in producer])
        for t in _tensors_in(output):
            producer[id(t)] = node
            alive.append(t)
        nodes.append(node)

    handles = []
    for path, module in model.named_modules():
        if not module._modules:
            handles.append(module.register_forward_pre_hook(lambda m, i, p=path: pre_hook(i, p)))
            handles.append(module.register_forward_hook(lambda m, i, o, p=path: hook(m, i, o, p)))
    error: Optional[BaseException] = None
    try:
        with eval_mode(model), torch.no_grad():
            model(*args, **kwargs)
    except Exception as exc:  # re-raised by lint_model unless a finding explains it
        error = exc
    finally:
        for handle in handles:
            handle.remove()
    return nodes, shapes, error


def _graph_from_sequential(model: nn.Module) -> List[_Node]:
    nodes: Dict[str, _Node] = {}

    def node_for(path: str, module: nn.Module, first: bool) -> _Node:
        while isinstance(module, nn.Sequential) and len(module):
            index = 0 if first else len(module) - 1
            path = f"{path}.{index}" if path else str(index)
            module = module[index]
        if path not in nodes:
            nodes[path] = _Node(path, module, "call_module")
        return nodes[path]

    for path, module in model.named_modules():
        if isinstance(module, nn.Sequential):
            children = list(module.named_children())
            for (name_a, a), (name_b, b) in zip(children, children[1:]):
                node_a = node_for(f"{path}.{name_a}" if path else name_a, a, first=False)
                node_b = node_for(f"{path}.{name_b}" if path else name_b, b, first=True)
                node_b.connect([node_a])
    return list(nodes.values())


def _as_call(example_input: Any) -> Tuple[Tuple[Any, ...], Dict[str, Any]]:
    if isinstance(example_input, dict):
        return (), dict(example_input)
    if isinstance(example_input, (tuple, list)):
        return tuple(example_input), {}
    return (example_input,), {}


def _calls_per_path(nodes: List[_Node]) -> Dict[str, int]:
    counts: Dict[str, int] = {}
    for node in nodes:
        if node.path is not None:
            counts[node.path] = counts.get(node.path, 0) + 1
    return counts


def _bias_before_bn(
    nodes: List[_Node], shapes: Dict[str, Tuple[int, ...]]
) -> List[Tuple[Finding, nn.Module, _BatchNorm]]:
    calls = _calls_per_path(nodes)
    found: List[Tuple[Finding, nn.Module, _BatchNorm]] = []
    for node in nodes:
        bn = node.module
        if not isinstance(bn, _BatchNorm) or len(node.inputs) != 1:
            continue
        producer = node.inputs[0]
        layer = producer.module
        if not isinstance(layer, (_ConvNd, nn.Linear)) or layer.bias is None:
            continue
        # Fix only a one-to-one pair: the layer's output goes nowhere else, neither module is
        # called at another place, and the bias is per BN channel.
        pair_calls = (calls.get(str(producer.path)), calls.get(str(node.path)))
        if producer.users != [node] or pair_calls != (1, 1):
            continue
        if isinstance(layer, _ConvNd):
            if layer.out_channels != bn.num_features:
                continue
        else:
            shape = shapes.get(str(node.path))
            if layer.out_features != bn.num_features or (shape is not None and len(shape) != 2):
                continue  # Linear on (N, L, F) then BatchNorm1d(L): the bias is not per channel
        kind = type(layer).__name__
        finding = Finding(
            "bias-before-bn",
            str(producer.path),
            f"{kind} bias ({layer.bias.numel()} parameters) feeds straight into "
            f"{node.path} ({type(bn).__name__}), whose mean subtraction cancels it",
            f"{kind}(..., bias=False); st.lint_model(model, fix=True) removes it and folds it "
            "into the BatchNorm running_mean",
        )
        found.append((finding, layer, bn))
    return found


def _passes_through(node: _Node) -> bool:
    if len(node.inputs) != 1:
        return False
    if node.module is not None:
        return isinstance(node.module, _PASS_THROUGH_MODULES) and not isinstance(
            node.module, _BatchNorm
        )
    return node.op in _PASS_THROUGH_FUNCTIONS


def _dropout_before_bn(nodes: List[_Node]) -> List[Finding]:
    findings = []
    reported = set()
    for node in nodes:
        drop = node.module
        if not isinstance(drop, _DropoutNd) or drop.p <= 0 or node.path in reported:
            continue
        frontier, seen, hit = list(node.users), set(), None
        for _ in range(_MAX_HOPS):
            following = []
            for user in frontier:
                if id(user) in seen:
                    continue
                seen.add(id(user))
                if isinstance(user.module, _BatchNorm):
                    hit = user
                    break
                if _passes_through(user):
                    following.extend(user.users)
            if hit is not None or not following:
                break
            frontier = following
        if hit is None:
            continue
        reported.add(node.path)
        findings.append(
            Finding(
                "dropout-before-bn",
                str(node.path),
                f"{type(drop).__name__}(p={drop.p}) feeds {hit.path} ({type(hit.module).__name__}):"
                " BN's running variance is learned with dropout on and applied with it off "
                "(variance shift between train and eval)",
                "move Dropout after the last BatchNorm (e.g. just before the classifier), or "
                "st.recalibrate_bn(model, loader) after training (recomputes the statistics "
                "with dropout off)",
            )
        )
    return findings


def _layer_rules(model: nn.Module, shapes: Dict[str, Tuple[int, ...]]) -> List[Finding]:
    findings = []
    for path, module in model.named_modules():
        if not isinstance(module, _BatchNorm):
            continue
        where = path or "<root>"
        kind = type(module).__name__
        if not module.track_running_stats:
            findings.append(
                Finding(
                    "bn-no-running-stats",
                    where,
                    f"{kind} has track_running_stats=False: eval mode normalizes each batch "
                    "with its own statistics, so an output depends on the rest of its batch "
                    "and a batch of one is normalized to the bias",
                    "track_running_stats=True, or GroupNorm/LayerNorm if batch independence "
                    "is wanted",
                )
            )
        momentum = module.momentum
        if module.track_running_stats and momentum is not None:
            if momentum <= 0:
                findings.append(
                    Finding(
                        "bn-momentum",
                        where,
                        f"{kind} momentum={momentum}: the running statistics never move from "
                        "their initial values (mean 0, var 1), so eval mode ignores the data",
                        "momentum=0.1 (torch's default) or momentum=None (cumulative average)",
                    )
                )
            elif momentum >= 0.5:
                keras = f"momentum={1 - momentum:g}" if momentum < 1 else "momentum=0.1"
                findings.append(
                    Finding(
                        "bn-momentum",
                        where,
                        f"{kind} momentum={momentum}: torch's momentum is the weight of the new "
                        "batch, so the running statistics are mostly the last batch's "
                        "(Keras/TF momentum means the opposite: 0.99 there is 0.01 here)",
                        keras,
                    )
                )
        shape = shapes.get(path)
        if shape is not None and len(shape) >= 2 and shape[0] == 1:
            values = math.prod(shape) // max(shape[1], 1)
            consequence = (
                "training raises ValueError (Expected more than 1 value per channel)"
                if values <= 1
                else f"training normalizes with one sample's statistics ({values} values per "
                "channel), unlike the running statistics eval uses"
            )
            findings.append(
                Finding(
                    "bn-batch-of-one",
                    where,
                    f"{kind} sees input of shape {shape} (a batch of one): {consequence}",
                    "train with batches of 2+ (DataLoader(drop_last=True) avoids a last batch "
                    "of one), or keep this layer in eval mode / use GroupNorm",
                )
            )
        if type(module) is nn.SyncBatchNorm:
            device = next(
                (t.device.type for t in (*module.parameters(False), *module.buffers(False))),
                "cpu",
            )
            problem = _syncbn.torch_syncbn_problem(device, _dist.initialized())
            if problem is not None:
                findings.append(
                    Finding(
                        "torch-syncbn-device",
                        where,
                        problem,
                        "st.convert_sync_batchnorm(model) (portable st.SyncBatchNorm where "
                        "torch's does not run), or st.revert_sync_batchnorm(model) for "
                        "single-process inference",
                    )
                )
    return findings


def _fold_bias(layer: nn.Module, bn: _BatchNorm) -> None:
    """Remove ``layer.bias`` and fold it into ``bn.running_mean``: BN(z + b) == BN'(z)."""
    bias = layer.bias
    assert isinstance(bias, torch.Tensor)
    with torch.no_grad():
        if bn.running_mean is not None:
            bn.running_mean.sub_(bias.detach().to(bn.running_mean.dtype))
    layer.bias = None  # type: ignore[assignment]  # torch's stub types bias as a Tensor; None removes it


def lint_model(model: nn.Module, example_input: Any = None, *, fix: bool = False) -> List[Finding]:
    """Find the BatchNorm, Dropout and bias pitfalls in ``model``.

    See the module docstring for the rules. The data flow comes from ``torch.fx`` when the
    model traces; otherwise from forward hooks during one eval-mode, no-grad run of
    ``example_input`` (module calls only); otherwise from ``nn.Sequential`` order.
    ``example_input`` also gives each layer's input shape (for ``bn-batch-of-one``); that run
    changes no parameter, buffer or training flag.

    Args:
        model: The model to check.
        example_input: A tensor, a tuple of positional arguments or a dict of keyword
            arguments for ``model``; ideally a real training batch.
        fix: Also apply the ``bias-before-bn`` fixes: the bias is removed (set to ``None``)
            and subtracted from BN's ``running_mean``, so eval outputs stay equal up to
            rounding and training outputs do not change. Build the optimizer afterwards; a
            checkpoint saved before the fix has ``bias`` keys the model no longer has.

    Returns:
        The findings (for ``fix=True``, those found before fixing), in model order.

    Raises:
        TypeError: ``model`` is not an ``nn.Module`` (or ``fix`` not a bool).
        Exception: Whatever ``model(example_input)`` raises, unless a ``bn-batch-of-one``
            finding explains it (a BatchNorm without running statistics fails on a batch of
            one even in eval mode).

    >>> import torch.nn as nn, safetorch as st
    >>> model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU())
    >>> [f.rule for f in st.lint_model(model)]
    ['bias-before-bn']
    >>> _ = st.lint_model(model, fix=True)
    >>> model[0].bias is None, st.lint_model(model)
    (True, [])
    """
    if not isinstance(model, nn.Module):
        raise TypeError(
            f"lint_model(model=...) expects a torch.nn.Module, got {type(model).__name__}"
            + (" (a path or name? build the model first)" if isinstance(model, str) else "")
        )
    if not isinstance(fix, bool):
        raise TypeError(f"lint_model(fix=...) expects a bool, got {type(fix).__name__}")
    shapes: Dict[str, Tuple[int, ...]] = {}
    hook_nodes: Optional[List[_Node]] = None
    error: Optional[BaseException] = None
    if example_input is not None:
        args, kwargs = _as_call(example_input)
        hook_nodes, shapes, error = _run_with_hooks(model, args, kwargs)
    try:
        nodes, method = _graph_from_fx(model), "torch.fx"
    except Exception as exc:  # any tracing failure: data-dependent control flow, ...
        _log.debug("lint_model: torch.fx tracing failed (%s: %s)", type(exc).__name__, exc)
        if hook_nodes is not None:
            nodes, method = hook_nodes, "forward hooks"
        else:
            nodes, method = _graph_from_sequential(model), "nn.Sequential order"
    _log.debug("lint_model: data flow from %s", method)

    bias = _bias_before_bn(nodes, shapes)
    findings = [f for f, _, _ in bias] + _dropout_before_bn(nodes) + _layer_rules(model, shapes)
    if error is not None and not any(f.rule == "bn-batch-of-one" for f in findings):
        raise error
    order = {path: i for i, (path, _) in enumerate(model.named_modules())}
    findings.sort(key=lambda f: order.get(f.where, order.get("", 0)))
    if fix:
        for finding, layer, bn in bias:
            _fold_bias(layer, bn)
            _log.info(
                "lint_model: removed %s.bias and folded it into BN running_mean", finding.where
            )
    return findings
