"""Synchronized BatchNorm that works on every torch.distributed backend, and safe conversion to it.

Pitfalls handled here:

* ``nn.SyncBatchNorm`` only runs on CUDA-like devices: on CPU under gloo its training forward
  raises ``ValueError: SyncBatchNorm expected input tensor to be on GPU ...``.
  :class:`SyncBatchNorm` is a portable implementation (one ``all_reduce`` forward, one
  backward) that runs on any device and backend.
* ``nn.SyncBatchNorm.convert_sync_batchnorm`` converts unconditionally (also in a single
  process, where it only costs), and flattens every ``_BatchNorm`` subclass into plain SyncBN,
  silently dropping a subclass's own ``forward`` (frozen BN, BN+activation).
  :func:`convert_sync_batchnorm` converts only when there is something to synchronize, picks
  the class that runs on the layer's device, skips such subclasses with a warning (or converts
  them through :func:`register_sync_batchnorm_converter`), and
  :func:`revert_sync_batchnorm` goes back for CPU inference and export.

* A graph of torch's ``nn.SyncBatchNorm`` owns its process group (``ctx`` keeps it), so the
  group outlives ``destroy_process_group()`` and dies wherever the graph is freed, with the GIL
  held; on gloo that can deadlock. :class:`SyncBatchNorm`'s graphs keep only a weak reference,
  and the tensors of its collectives stay alive past gloo's worker thread (issue 27, see
  :func:`_group_ref` and :func:`_all_reduce`).

torch < 2.0 (before pytorch/pytorch#89706) also made ``nn.SyncBatchNorm`` fail without a
process group and on any non-CUDA input even in eval mode; the branch is bound at import from
``_compat.SYNCBN_FALLS_BACK_WITHOUT_PG``.
"""

from __future__ import annotations

import collections
import logging
import os
import warnings
import weakref
from typing import Any, Callable, Dict, FrozenSet, List, Optional, Tuple, Type, TypeVar

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from safetorch import _compat, _dist
from safetorch._compat import BatchNormBase as _BatchNorm
from safetorch._stack import user_stacklevel
from safetorch._types import SyncBNPolicy, unquoted
from safetorch.errors import DistributedWarning, SafetorchWarning

__all__: List[str] = [
    "SyncBatchNorm",
    "convert_sync_batchnorm",
    "revert_sync_batchnorm",
    "register_sync_batchnorm_converter",
    "unregister_sync_batchnorm_converter",
]

_log = logging.getLogger("safetorch")

# Captured once: monkeypatch mode routes nn.SyncBatchNorm.convert_sync_batchnorm here, and
# nothing below may call back into a patched torch entry point.
_batch_norm = F.batch_norm
_TorchSyncBatchNorm = nn.SyncBatchNorm

_POLICIES = ("auto", "torch", "portable")
# Attribute under which a converted layer remembers the BatchNorm class it came from.
_ORIGINAL_CLASS_ATTR = "_safetorch_bn_class"
_PLAIN_BN: Tuple[Type[_BatchNorm], ...] = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)


# --- torch's SyncBatchNorm: where it runs (version-dependent, bound at import) ------------------
_torch_syncbn_devices: FrozenSet[str] = frozenset()
torch_syncbn_problem: Callable[[str, bool], Optional[str]]


def _problem_since_2_0(device_type: str, distributed: bool) -> Optional[str]:
    # torch >= 2.0: plain batch_norm without a process group, device check only when syncing.
    if device_type in _torch_syncbn_devices or not distributed:
        return None
    return (
        f"torch.nn.SyncBatchNorm raises ValueError in training on {device_type!r} tensors "
        f"under an initialized process group (it supports {sorted(_torch_syncbn_devices)})"
    )


def _problem_before_2_0(device_type: str, distributed: bool) -> Optional[str]:
    # torch < 2.0: the CUDA check comes first in every forward, eval included, and training
    # calls get_world_size(), which raises without a default process group.
    if device_type != "cuda":
        return (
            f"torch.nn.SyncBatchNorm raises ValueError on {device_type!r} tensors in every "
            "forward, eval mode included (torch < 2.0)"
        )
    if not distributed:
        return (
            "torch.nn.SyncBatchNorm raises RuntimeError in training without an initialized "
            "process group (torch < 2.0)"
        )
    return None


@_compat.register_binder
def _bind_torch_syncbn() -> None:
    global _torch_syncbn_devices, torch_syncbn_problem
    if _compat.SYNCBN_FALLS_BACK_WITHOUT_PG:
        extra = _compat.privateuse1_backend_name()
        _torch_syncbn_devices = frozenset({"cuda", "hpu", "xpu"} | ({extra} if extra else set()))
        torch_syncbn_problem = _problem_since_2_0
    else:
        _torch_syncbn_devices = frozenset({"cuda"})
        torch_syncbn_problem = _problem_before_2_0


# --- the portable synchronized batch norm ----------------------------------------------------
def _acc_dtype(device: torch.device) -> torch.dtype:
    # float64 accumulators for the reduced statistics; MPS has no float64.
    return torch.float32 if device.type == "mps" else torch.float64


def _group_ref(group: Any) -> "Optional[weakref.ReferenceType[Any]]":
    """What ``ctx`` keeps of the process group: a weak reference, or None for the default group.

    An autograd graph must not own a process group. The graph of an output lives as long as the
    output (its ``grad_fn`` keeps ``ctx``, backward or not), so a group held by ``ctx`` outlives
    ``destroy_process_group()`` and dies wherever the last tensor of that graph is freed: inside
    a tensor deallocation, with the GIL held, where ``~ProcessGroupGloo`` joins its worker
    threads. A worker that needs the GIL then never finishes and the process hangs (issue 27:
    Python 3.9, torch 2.6.0, a single-rank gloo test). torch's own ``nn.SyncBatchNorm`` stores
    the group itself (``self.process_group = process_group`` in
    ``torch/nn/modules/_functions.py``, read in backward and never released; read in torch
    2.13.0), so its graphs have this hazard. Every torch.distributed process group is a pybind11
    object, and pybind11 gives every bound class weak-reference support (its ``keep_alive``
    relies on it; checked on torch 2.6.0 and 2.13.0, no version test needed); the group
    stays alive while torch.distributed has it registered (the default group and every
    ``new_group`` are held by ``distributed_c10d``'s world state until
    ``destroy_process_group``), so the reference is alive exactly while the group may be used.
    """
    return None if group is None else weakref.ref(group)


def _resolve_group(ref: "Optional[weakref.ReferenceType[Any]]") -> Any:
    """The group a forward synchronized over, for its backward (None: the default group)."""
    if ref is None:
        return None
    group = ref()
    if group is None:
        raise RuntimeError(
            "SyncBatchNorm backward: the process group its forward synchronized over was "
            "destroyed (torch.distributed.destroy_process_group) before backward; run "
            "backward before destroying the group"
        )
    return group


# The tensors of the last few collectives, kept alive from Python: see _all_reduce.
_recent_collective_tensors: "collections.deque[torch.Tensor]" = collections.deque(maxlen=8)


def _all_reduce(tensor: torch.Tensor, group: Any) -> None:
    """``dist.all_reduce(tensor, group=group)``, then keep ``tensor`` alive for a while.

    gloo's worker thread drops its reference to a finished collective (and the tensors in it)
    only after the caller has been woken. If the caller's Python tensor is gone by then, the
    worker frees that Python object and needs the GIL for it; a ``destroy_process_group()``
    in that window joins the worker with the GIL held, and the process hangs. Seen on Python
    3.9 with torch 2.6.0 with torch alone: ``all_reduce(t); del t; destroy_process_group()``
    hung 3 of 3 processes in the first round; keeping ``t`` alive, 0 hangs in 20 rounds (not
    seen on Python 3.11 with torch 2.13.0). Holding the last few (small) statistics tensors
    here means the worker never frees a Python object; they are freed on this thread when
    later calls push them out.
    """
    dist.all_reduce(tensor, group=group)
    _recent_collective_tensors.append(tensor)


class _SyncBatchNormFunction(torch.autograd.Function):
    """Batch norm over the union of every rank's batch: one all_reduce forward, one backward.

    ``ctx`` holds only a weak reference to the process group (:func:`_group_ref`): freeing a
    graph, with or without backward, never destroys a process group.
    """

    @staticmethod
    def forward(
        ctx: Any,
        input: torch.Tensor,
        weight: Optional[torch.Tensor],
        bias: Optional[torch.Tensor],
        running_mean: Optional[torch.Tensor],
        running_var: Optional[torch.Tensor],
        eps: float,
        momentum: float,
        group: Any,
    ) -> torch.Tensor:
        channels = input.size(1)
        dims = [0, *range(2, input.dim())]
        shape = [1, channels] + [1] * (input.dim() - 2)
        acc = _acc_dtype(input.device)
        compute = input.dtype if input.dtype in (torch.float32, torch.float64) else torch.float32
        x = input.to(compute)
        local_count = input.numel() // channels

        # Per-rank (sum, sum of squares) computed from the rank's own mean and centred M2, in
        # float64: a raw float32 sum of squares cancels catastrophically when |mean| >> std.
        stats = torch.zeros(2 * channels + 1, dtype=acc, device=input.device)
        if local_count > 0:
            var_l, mean_l = torch.var_mean(x, dim=dims, unbiased=False)
            mean_l = mean_l.to(acc)
            stats[:channels] = mean_l * local_count
            stats[channels : 2 * channels] = (var_l.to(acc) + mean_l * mean_l) * local_count
            stats[-1] = local_count
        _all_reduce(stats, group)
        count = int(stats[-1].item())
        if count <= 1:
            # Every rank sees the same global count, so every rank raises: no rank is left
            # waiting in a collective.
            raise ValueError(
                f"Expected more than 1 value per channel when training, got {count} across "
                f"the process group (input size {tuple(input.shape)} on this rank); use "
                "larger per-rank batches or eval mode"
            )
        mean = stats[:channels] / count
        var = (stats[channels : 2 * channels] / count - mean * mean).clamp_(min=0)
        invstd = torch.rsqrt(var + eps)

        if running_mean is not None:
            running_mean.mul_(1 - momentum).add_(mean.to(running_mean.dtype), alpha=momentum)
        if running_var is not None:
            unbiased = var * (count / (count - 1))
            running_var.mul_(1 - momentum).add_(unbiased.to(running_var.dtype), alpha=momentum)

        mean_c = mean.to(compute).view(shape)
        scale = invstd if weight is None else invstd * weight.to(acc)
        out = (x - mean_c) * scale.to(compute).view(shape)
        if bias is not None:
            out = out + bias.to(compute).view(shape)

        ctx.save_for_backward(input, weight, mean, invstd)
        ctx.group_ref = _group_ref(group)  # never the group itself (see _group_ref)
        ctx.count = count
        return out.to(input.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_output: torch.Tensor) -> Tuple[Optional[torch.Tensor], ...]:
        input, weight, mean, invstd = ctx.saved_tensors
        channels = input.size(1)
        dims = [0, *range(2, input.dim())]
        shape = [1, channels] + [1] * (input.dim() - 2)
        acc = mean.dtype
        compute = input.dtype if input.dtype in (torch.float32, torch.float64) else torch.float32
        xmu = input.to(compute) - mean.to(compute).view(shape)
        dy = grad_output.to(compute)
        sum_dy = dy.sum(dim=dims).to(acc)
        sum_dy_xmu = (dy * xmu).sum(dim=dims).to(acc)

        grad_input = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            # Input gradients need the global sums; weight/bias gradients stay per rank (as
            # torch's SyncBatchNorm): DDP's gradient all_reduce combines them.
            sums = torch.cat([sum_dy, sum_dy_xmu])
            _all_reduce(sums, _resolve_group(ctx.group_ref))
            mean_dy = sums[:channels] / ctx.count
            mean_dy_xmu = sums[channels:] / ctx.count
            scale = invstd if weight is None else invstd * weight.to(acc)
            grad_input = (
                (
                    dy
                    - mean_dy.to(compute).view(shape)
                    - xmu * (invstd * invstd * mean_dy_xmu).to(compute).view(shape)
                )
                * scale.to(compute).view(shape)
            ).to(input.dtype)
        if weight is not None and ctx.needs_input_grad[1]:
            grad_weight = (sum_dy_xmu * invstd).to(weight.dtype)
        if ctx.needs_input_grad[2]:
            grad_bias = sum_dy.to(input.dtype if weight is None else weight.dtype)
        return grad_input, grad_weight, grad_bias, None, None, None, None, None


class SyncBatchNorm(_BatchNorm):
    """Synchronized BatchNorm for any torch.distributed backend (gloo on CPU included).

    Same constructor, parameters, buffers and ``state_dict`` as ``torch.nn.SyncBatchNorm``,
    same semantics. It is a ``_BatchNorm`` but deliberately not an ``nn.SyncBatchNorm``
    subclass: DDP refuses ``nn.SyncBatchNorm`` layers in CPU modules. Semantics: in training
    under a process group of more than one rank, mean and variance are those of the union of
    all ranks' batches, from one ``all_reduce`` of per-channel (sum, sum of squares, count);
    the backward all_reduces the two gradient sums. Running statistics use the unbiased global variance, ``momentum=None``
    means cumulative averaging, eval mode uses the running statistics, per-rank batch sizes
    may differ and a rank may hold an empty batch. Without a process group (or with one rank)
    it is plain BatchNorm. Weight and bias gradients are this rank's share, as with torch's
    SyncBatchNorm: DDP's gradient all_reduce completes them.

    Every rank of the group must call forward (and backward) the same number of times.

    Args:
        num_features: Number of channels ``C`` of an ``(N, C, ...)`` input.
        eps: Added to the variance for numerical stability.
        momentum: Weight of the new batch in the running statistics; ``None`` for a
            cumulative average.
        affine: Learnable per-channel weight and bias.
        track_running_stats: Keep running statistics (else batch statistics in eval too).
        process_group: Group to synchronize over; ``None`` for the whole world.
        device: Device of the parameters and buffers.
        dtype: dtype of the parameters and buffers.

    Raises:
        ValueError: In forward, for an input with fewer than 2 dimensions, or in training
            with at most one value per channel across the group.

    >>> import torch, safetorch as st
    >>> bn = st.SyncBatchNorm(3)  # no process group: plain BatchNorm
    >>> bn(torch.randn(4, 3, 5)).shape
    torch.Size([4, 3, 5])
    """

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: Optional[float] = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        process_group: Any = None,
        device: Any = None,
        dtype: Any = None,
        **kwargs: Any,
    ) -> None:
        # **kwargs: constructor options of newer torch (e.g. ``bias=`` in 2.13), passed on.
        super().__init__(
            num_features,
            eps,
            momentum,
            affine,
            track_running_stats,
            device=device,
            dtype=dtype,
            **kwargs,
        )
        self.process_group = process_group

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """Normalize ``input`` with statistics synchronized across the process group."""
        if input.dim() < 2:
            raise ValueError(
                f"SyncBatchNorm expected at least 2D input (N, C, ...), got {input.dim()}D "
                f"input of size {tuple(input.shape)}"
            )
        if input.size(1) == 0:
            raise ValueError(
                f"SyncBatchNorm number of input channels should be non-zero, got input of "
                f"size {tuple(input.shape)}"
            )
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:  # cumulative moving average
                factor = 1.0 / float(self.num_batches_tracked.item())
        bn_training = self.training or (self.running_mean is None and self.running_var is None)
        track = not self.training or self.track_running_stats
        running_mean = self.running_mean if track else None
        running_var = self.running_var if track else None

        if bn_training and self.training and _dist.initialized():
            group = self.process_group if self.process_group else dist.group.WORLD
            if dist.get_world_size(group) > 1:
                return _SyncBatchNormFunction.apply(
                    input,
                    self.weight,
                    self.bias,
                    running_mean,
                    running_var,
                    self.eps,
                    factor,
                    group,
                )
        return _batch_norm(
            input,
            running_mean,
            running_var,
            self.weight,
            self.bias,
            bn_training,
            factor,
            self.eps,
        )


# --- conversion ------------------------------------------------------------------------------
_SYNC_CLASSES: Tuple[Type[_BatchNorm], ...] = (_TorchSyncBatchNorm, SyncBatchNorm)
Converter = Callable[[_BatchNorm, Any, Type[_BatchNorm]], nn.Module]
_converters: Dict[type, Converter] = {}
_C = TypeVar("_C", bound=Converter)


def register_sync_batchnorm_converter(cls: type, converter: Optional[Converter] = None) -> Any:
    """Register how :func:`convert_sync_batchnorm` converts a BatchNorm subclass.

    Without a registered converter, a subclass of ``_BatchNorm`` that defines its own
    ``forward`` (frozen BN, BN+activation, ...) is left as it is, with a
    :class:`~safetorch.SafetorchWarning`. The converter is found through the class's MRO, so
    registering a base class covers its subclasses. Usable as a decorator.

    Args:
        cls: The module class (usually a ``_BatchNorm`` subclass).
        converter: ``converter(module, process_group, sync_class) -> nn.Module``, where
            ``sync_class`` is the SyncBatchNorm class chosen for the layer's device
            (``torch.nn.SyncBatchNorm`` or :class:`SyncBatchNorm`). ``None``: return a
            decorator.

    Returns:
        The converter (or a decorator that registers and returns it).

    Raises:
        TypeError: ``cls`` is not a class or ``converter`` is not callable.

    >>> import torch.nn as nn, safetorch as st
    >>> class BNReLU(nn.BatchNorm2d):
    ...     def forward(self, x):
    ...         return super().forward(x).relu()
    >>> @st.register_sync_batchnorm_converter(BNReLU)
    ... def _(m, group, sync_class):
    ...     sync = st.convert_sync_batchnorm(nn.BatchNorm2d(m.num_features), group, policy="portable")
    ...     return nn.Sequential(sync, nn.ReLU())
    >>> st.unregister_sync_batchnorm_converter(BNReLU)
    """
    if not isinstance(cls, type):
        raise TypeError(f"cls must be a class, got {cls!r}")

    def register(fn: _C) -> _C:
        if not callable(fn):
            raise TypeError(f"converter must be callable, got {fn!r}")
        _converters[cls] = fn
        return fn

    return register if converter is None else register(converter)


def unregister_sync_batchnorm_converter(cls: type) -> None:
    """Remove the converter registered for ``cls`` (no error if there is none).

    Args:
        cls: The class passed to :func:`register_sync_batchnorm_converter`.

    >>> import torch.nn as nn, safetorch as st
    >>> st.unregister_sync_batchnorm_converter(nn.BatchNorm2d)
    """
    _converters.pop(cls, None)


def _find_converter(cls: type) -> Optional[Converter]:
    for klass in cls.__mro__:
        if klass in _converters:
            return _converters[klass]
    return None


def _has_own_forward(cls: type) -> bool:
    for klass in cls.__mro__:
        if klass is _BatchNorm:
            return False
        if "forward" in klass.__dict__:
            return True
    return False


def _device_type(module: nn.Module) -> str:
    for tensor in (*module.parameters(recurse=False), *module.buffers(recurse=False)):
        return tensor.device.type
    return "cpu"


def _sync_class_for(module: nn.Module, policy: str) -> Type[_BatchNorm]:
    if policy == "torch":
        return _TorchSyncBatchNorm
    if policy == "portable":
        return SyncBatchNorm
    return _TorchSyncBatchNorm if _device_type(module) in _torch_syncbn_devices else SyncBatchNorm


_templates: Dict[type, nn.Module] = {}


def _template(cls: Type[_BatchNorm]) -> nn.Module:
    """One constructor-made instance per class (meta device, nothing allocated)."""
    if cls not in _templates:
        _templates[cls] = cls(1, device="meta")
    return _templates[cls]


def _transplant(
    source: _BatchNorm, target_cls: Type[_BatchNorm], process_group: Any, original: Any
) -> _BatchNorm:
    """A ``target_cls`` layer sharing ``source``'s parameters, buffers, mode and hooks."""
    new = target_cls.__new__(target_cls)
    # No constructor call: it would allocate parameters only to drop them, and an original
    # subclass's constructor may take other arguments. The state is the source's (parameters
    # are the same objects, so optimizers, requires_grad and DDP keep seeing them), plus
    # whatever the target's constructor sets that the source lacks (``process_group``).
    nn.Module.__init__(new)
    for key, value in source.__dict__.items():
        if key in ("_parameters", "_buffers", "_modules", "_non_persistent_buffers_set"):
            new.__dict__[key] = value.copy()
        elif "hook" in key or key not in new.__dict__ or key == "training":
            # Hook dicts are shared so handles registered before the conversion still remove
            # them; user attributes (qconfig, ...) and the training flag carry over.
            new.__dict__[key] = value
    new.__dict__.pop(_ORIGINAL_CLASS_ATTR, None)
    if target_cls in _PLAIN_BN or target_cls in _SYNC_CLASSES:
        for key, value in _template(target_cls).__dict__.items():
            new.__dict__.setdefault(key, value)
    if target_cls in _SYNC_CLASSES:
        new.process_group = process_group
        new.__dict__[_ORIGINAL_CLASS_ATTR] = original
    else:
        new.__dict__.pop("process_group", None)
    return new


def _walk_replace(
    root: nn.Module, replace: Callable[[str, nn.Module], Optional[nn.Module]]
) -> nn.Module:
    """Replace every submodule for which ``replace`` returns a module; shared modules once."""
    done: Dict[int, nn.Module] = {}
    top = replace("", root)
    if top is not None:
        return top
    stack: List[Tuple[str, nn.Module]] = [("", root)]
    seen = {id(root)}
    while stack:
        prefix, parent = stack.pop()
        for name, child in list(parent._modules.items()):
            if child is None:
                continue
            path = f"{prefix}.{name}" if prefix else name
            if id(child) in done:
                parent._modules[name] = done[id(child)]
                continue
            new = replace(path, child)
            if new is not None:
                done[id(child)] = new
                parent._modules[name] = new
            elif id(child) not in seen:
                seen.add(id(child))
                stack.append((path, child))
    return root


def _no_sync_reason(process_group: Any) -> Optional[str]:
    if not dist.is_available():
        return "torch.distributed is not available in this torch build"
    if not dist.is_initialized():
        return "no process group is initialized (torch.distributed.init_process_group)"
    world = dist.get_world_size(process_group if process_group is not None else dist.group.WORLD)
    if world <= 1:
        return f"the process group has world size {world}: there is nothing to synchronize"
    return None


def _launcher_environment() -> Optional[str]:
    """The launcher variables that say this process is one of several ranks, or None.

    torchrun, ``torch.distributed.launch``, SLURM wrappers and Lightning set ``WORLD_SIZE``
    (with ``RANK`` / ``LOCAL_RANK``) before the script runs; a world size above 1 means the
    process is meant to join a process group. Returns e.g. ``"WORLD_SIZE=2, RANK=0"``.
    """
    raw = os.environ.get("WORLD_SIZE")
    if raw is None:
        return None
    try:
        world = int(raw)
    except ValueError:
        return None
    if world <= 1:
        return None
    seen = [f"WORLD_SIZE={world}"]
    seen += [f"{k}={os.environ[k]}" for k in ("RANK", "LOCAL_RANK") if k in os.environ]
    return ", ".join(seen)


def _warn_launched_without_group(reason: str) -> None:
    """Warn when the environment says distributed but there is no process group to follow."""
    launched = _launcher_environment()
    if launched is None:
        return  # single-process use: returning the model unchanged is the intended result
    warnings.warn(
        f"convert_sync_batchnorm: the environment says this is a distributed run ({launched}) "
        f"but {reason}, so the BatchNorm layers were left as plain BatchNorm and each rank "
        "will normalize with its own batch statistics. Call "
        "torch.distributed.init_process_group(...) before convert_sync_batchnorm, or pass "
        'policy="portable" to convert now (st.SyncBatchNorm synchronizes once a process '
        "group exists)",
        DistributedWarning,
        stacklevel=user_stacklevel(),
    )


@unquoted
def convert_sync_batchnorm(
    module: nn.Module, process_group: Any = None, *, policy: SyncBNPolicy = "auto"
) -> nn.Module:
    """Convert BatchNorm layers to synchronized BatchNorm, only where it makes sense.

    Unlike ``nn.SyncBatchNorm.convert_sync_batchnorm``:

    * ``policy="auto"`` returns ``module`` unchanged (and logs why, at debug level) when no
      process group is initialized or its world size is 1; if the environment says the
      process is one of several ranks (``WORLD_SIZE`` > 1, as torchrun sets it) but no
      process group is initialized yet, it also warns with
      :class:`~safetorch.DistributedWarning` (call ``init_process_group`` first, or pass
      ``policy="portable"``);
    * each layer gets the class that runs on its device: ``torch.nn.SyncBatchNorm`` on CUDA
      (and the other devices torch's supports), :class:`SyncBatchNorm` elsewhere (CPU under
      gloo, where torch's raises); an existing ``torch.nn.SyncBatchNorm`` on such a device is
      swapped for :class:`SyncBatchNorm`;
    * parameters are shared, not copied; running stats, ``num_batches_tracked``, the
      training flag, ``requires_grad``, hooks and extra attributes carry over;
    * BatchNorm subclasses with their own ``forward`` are converted through
      :func:`register_sync_batchnorm_converter`, or left alone with a
      :class:`~safetorch.SafetorchWarning` naming them; lazy layers that were never run are
      left alone with a warning too.

    Args:
        module: The model (or a single BatchNorm layer).
        process_group: Group to synchronize over; ``None`` for the whole world.
        policy: ``"auto"`` (as above), ``"torch"`` (always ``torch.nn.SyncBatchNorm``, even
            without a process group) or ``"portable"`` (always :class:`SyncBatchNorm`).

    Returns:
        ``module`` with its layers converted in place, or the new layer when ``module``
        itself is a BatchNorm layer.

    Raises:
        ValueError: ``policy`` is not one of the three.

    >>> import torch.nn as nn, safetorch as st
    >>> model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8))
    >>> st.convert_sync_batchnorm(model) is model  # no process group: unchanged
    True
    >>> type(st.convert_sync_batchnorm(model, policy="portable")[1]).__name__
    'SyncBatchNorm'
    """
    if policy not in _POLICIES:
        raise ValueError(
            f"policy must be one of {', '.join(repr(p) for p in _POLICIES)}, got {policy!r}"
        )
    if policy == "auto":
        reason = _no_sync_reason(process_group)
        if reason is not None:
            _log.debug("convert_sync_batchnorm: %s; module returned unchanged", reason)
            if not _dist.initialized():
                _warn_launched_without_group(reason)
            return module

    skipped: List[str] = []

    def replace(path: str, child: nn.Module) -> Optional[nn.Module]:
        if not isinstance(child, _BatchNorm):
            return None
        cls = type(child)
        converter = _find_converter(cls)
        sync_cls = _sync_class_for(child, policy)
        if converter is not None:
            return converter(child, process_group, sync_cls)
        if isinstance(child, nn.modules.lazy.LazyModuleMixin):
            skipped.append(f"{path or '<root>'} ({cls.__name__}: uninitialized lazy layer)")
            return None
        if cls in _SYNC_CLASSES:
            if cls is sync_cls and (process_group is None or child.process_group is process_group):
                return None
            original = child.__dict__.get(_ORIGINAL_CLASS_ATTR)
            group = process_group if process_group is not None else child.process_group
            return _transplant(child, sync_cls, group, original)
        if _has_own_forward(cls):
            skipped.append(f"{path or '<root>'} ({cls.__name__} defines its own forward)")
            return None
        return _transplant(child, sync_cls, process_group, cls)

    result = _walk_replace(module, replace)
    if skipped:
        warnings.warn(
            "convert_sync_batchnorm left these BatchNorm layers unsynchronized: "
            + "; ".join(skipped)
            + ". Register a converter with st.register_sync_batchnorm_converter(cls, fn) "
            "(or run a forward pass first for lazy layers)",
            SafetorchWarning,
            stacklevel=user_stacklevel(),
        )
    return result


def revert_sync_batchnorm(
    module: nn.Module, default: Type[_BatchNorm] = nn.BatchNorm2d
) -> nn.Module:
    """Turn synchronized BatchNorm layers back into plain BatchNorm (CPU inference, export).

    Layers converted by :func:`convert_sync_batchnorm` become their original class again
    (``BatchNorm1d/2d/3d`` or the subclass they came from); others (made by torch's own
    converter or built directly) become ``default``. Parameters and buffers are shared, the
    training flag, hooks and extra attributes carry over. Subclasses of either SyncBatchNorm
    class are left alone.

    Args:
        module: The model (or a single SyncBatchNorm layer).
        default: Class for layers whose original class is unknown.

    Returns:
        ``module`` with its layers reverted in place, or the new layer when ``module`` itself
        is a SyncBatchNorm layer.

    >>> import torch.nn as nn, safetorch as st
    >>> model = st.convert_sync_batchnorm(nn.Sequential(nn.BatchNorm1d(4)), policy="portable")
    >>> type(st.revert_sync_batchnorm(model)[0]).__name__
    'BatchNorm1d'
    """

    def replace(path: str, child: nn.Module) -> Optional[nn.Module]:
        if type(child) not in _SYNC_CLASSES:
            return None
        original = child.__dict__.get(_ORIGINAL_CLASS_ATTR) or default
        return _transplant(child, original, None, None)  # type: ignore[arg-type]  # original is a BatchNorm class here: the child is a converted layer

    return _walk_replace(module, replace)
