"""Exact resume: ``st.save_state`` / ``st.load_state``.

One call saves everything a run needs to continue bit-identically: objects with
``state_dict``/``load_state_dict`` (models, optimizers, schedulers, ``GradScaler``), plain
values (returned as extras) and the RNG state of every process (python ``random``, numpy when
it is imported, torch CPU and every CUDA device), captured per rank.

Two layouts, chosen by what is being saved, both built on torch's own machinery:

* **one file** (plain, DataParallel or DDP models; no process group, or one where every rank
  holds full tensors): rank 0 writes a ``torch.save`` file atomically (temp file, fsync,
  rename) and every rank waits for it; models are saved unwrapped, so the file loads into a
  plain model too.
* **a DCP directory** (a process group and a sharded model: FSDP/FSDP2/DTensor parameters):
  ``torch.distributed.checkpoint`` with ``get_state_dict``/``set_state_dict``, each rank writing
  its own shards (no gather to rank 0), into a temporary directory that rank 0 renames into
  place once every rank has finished. It loads on any number of ranks, and on one process into
  a plain model.

Loading is weights-only in both layouts: the file through :func:`safetorch.load`; DCP's
``.metadata`` through the restricted unpickler and DCP's byte entries through ``st.load``
(DCP's default planner would ``torch.load`` them with ``weights_only=False``).

What a file holds is untrusted: its structure and every rank's RNG state are validated (type,
size, range; :mod:`safetorch.checkpoint._rng`) before anything is applied, and the objects and
the RNG are then restored all or nothing (each object is snapshotted before it is loaded and
put back if a later step fails). Every failure is a ``CheckpointError`` naming the path.
"""

from __future__ import annotations

import copy
import io
import itertools
import logging
import os
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

import torch
from torch import nn

from safetorch import _atomic
from safetorch.checkpoint import _conversions, _dcp, _dcp_load
from safetorch.checkpoint._bytes import tensor_bytes
from safetorch.checkpoint._formats import STATE_FORMAT

# capture_rng / restore_rng live in safetorch.checkpoint._rng and stay importable from here.
from safetorch.checkpoint._rng import RNGState, apply_rng, capture_rng, check_rng_table
from safetorch.checkpoint._rng import restore_rng as restore_rng
from safetorch.checkpoint.loading import load
from safetorch.checkpoint.model_state import load_state_dict
from safetorch.checkpoint.saving import _unwrapped, save_checkpoint
from safetorch.errors import CheckpointError, CheckpointFileNotFoundError, CheckpointMismatchError

__all__ = ["save_state", "load_state"]

_log = logging.getLogger("safetorch")

_RESERVED = ("__safetorch__", "rng", "extras")


# --- process groups ----------------------------------------------------------------------------
def _dist() -> Any:
    from safetorch import _dist as plain

    return torch.distributed if plain.initialized() else None


def _rank() -> int:
    dist = _dist()
    return dist.get_rank() if dist is not None else 0


def _world_size() -> int:
    dist = _dist()
    return dist.get_world_size() if dist is not None else 1


def _barrier() -> None:
    dist = _dist()
    if dist is not None:
        dist.barrier()


_gathers = itertools.count()


def _all_gather(value: Any) -> List[Any]:
    """Every rank's plain-data ``value``, in rank order, through the process group's store.

    Not ``all_gather_object``: a gloo collective leaves work objects whose teardown can hang
    the process after ``destroy_process_group()`` (see safetorch/_dist.py); the store needs no
    tensor and no worker thread. Values are plain data, read back by an unpickler that refuses
    every global.
    """
    dist = _dist()
    if dist is None:
        return [value]
    from safetorch import _compat
    from safetorch import _dist as plain

    store = _compat.default_store()
    key = f"safetorch/gather/{next(_gathers)}/{{}}"
    store.set(key.format(dist.get_rank()), plain._dumps(value))  # type: ignore[arg-type]  # bytes: Store.set takes them (its stub says str)
    return [plain._loads(store.get(key.format(r))) for r in range(dist.get_world_size())]


# --- what is being saved -----------------------------------------------------------------------
def _is_stateful(obj: Any) -> bool:
    return callable(getattr(obj, "state_dict", None)) and callable(
        getattr(obj, "load_state_dict", None)
    )


def _is_sharded(model: nn.Module) -> bool:
    """Parameters that are DTensors (FSDP2, tensor parallel) or an FSDP1 wrapper."""
    if type(model).__name__ == "FullyShardedDataParallel":
        return True
    for p in model.parameters():
        if type(p).__name__ == "DTensor" or type(getattr(p, "data", None)).__name__ == "DTensor":
            return True
    return False


def _check_names(objects: Mapping[str, Any]) -> None:
    for name in objects:
        if name in _RESERVED or "." in name:
            raise ValueError(
                f"save_state/load_state: {name!r} cannot name an object (reserved names: "
                f"{_RESERVED}; names cannot contain '.'); rename it, e.g. {name.strip('_')}_"
            )


def _model_of(optimizer: Any, models: Mapping[str, nn.Module]) -> nn.Module:
    params = {id(p) for group in optimizer.param_groups for p in group["params"]}
    for model in models.values():
        if any(id(p) in params for p in model.parameters()):
            return model
    raise CheckpointError(
        "save_state/load_state: an optimizer's parameters belong to none of the models passed; "
        "pass the model it optimizes too (e.g. save_state(path, model=model, optimizer=opt))"
    )


# --- saving ------------------------------------------------------------------------------------
def save_state(path: Any, /, **objects: Any) -> str:
    """Save everything a run needs to resume exactly, atomically, on one process or many.

    Args:
        path: the checkpoint path: a file (plain/DataParallel/DDP models) or, for a sharded
            model under a process group, a DCP directory.
        **objects: ``name=object``: objects with ``state_dict``/``load_state_dict`` (models,
            optimizers, schedulers, GradScaler) are saved through their state dicts; anything
            else (``epoch=3``, ``best=0.91``) is saved as a plain value and returned by
            :func:`load_state`. The RNG states of every rank are captured automatically.

    Returns:
        The absolute path written (the same on every rank).

    Raises:
        ValueError: a reserved object name (``rng``, ``extras``).
        OSError: the checkpoint cannot be written (a previous checkpoint stays intact).

    >>> import os, tempfile, torch, safetorch as st
    >>> model = torch.nn.Linear(2, 2); opt = torch.optim.SGD(model.parameters(), lr=0.1)
    >>> path = st.save_state(os.path.join(tempfile.mkdtemp(), "state.pt"),
    ...                      model=model, optimizer=opt, epoch=3)
    >>> st.load_state(path, model=model, optimizer=opt)
    {'epoch': 3}
    """
    _check_names(objects)
    models = {k: v for k, v in objects.items() if isinstance(v, nn.Module)}
    rng = {str(r): s for r, s in enumerate(_all_gather(capture_rng()))}
    if _dist() is not None and any(_is_sharded(m) for m in models.values()):
        return _save_dcp(os.path.abspath(os.fspath(path)), objects, models, rng)

    states: Dict[str, Any] = {}
    extras: Dict[str, Any] = {}
    for name, obj in objects.items():
        if isinstance(obj, nn.Module):
            states[name] = _unwrapped(obj)
        elif _is_stateful(obj):
            states[name] = obj.state_dict()
        else:
            extras[name] = obj
    payload = {
        "__safetorch__": STATE_FORMAT,
        "objects": states,
        "extras": extras,
        "rng": rng,
        "world_size": _world_size(),
    }
    return save_checkpoint(payload, path)


def _save_dcp(
    path: str, objects: Mapping[str, Any], models: Mapping[str, nn.Module], rng: Dict[str, Any]
) -> str:
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    state: Dict[str, Any] = {}
    extras: Dict[str, Any] = {}
    for name, obj in objects.items():
        if isinstance(obj, nn.Module):
            state[name] = get_model_state_dict(obj)
        elif isinstance(obj, torch.optim.Optimizer):
            state[name] = get_optimizer_state_dict(_model_of(obj, models), obj)
        elif _is_stateful(obj):
            state[name] = _as_bytes_tensor(obj.state_dict())
        else:
            extras[name] = obj
    # RNG and extras travel as one weights-only torch.save blob (identical on every rank,
    # so DCP keeps one copy), read back with st.load.
    state["__safetorch__"] = _as_bytes_tensor(
        {"format": STATE_FORMAT, "rng": rng, "extras": extras, "world_size": _world_size()}
    )
    _atomic.require_parent(path)
    from safetorch import _dist as plain

    # Every rank writes its shards into one temp directory (rank 0 names it), then rank 0
    # swaps it in: safetorch._atomic's directory replacement, as save_dcp on one process.
    tmp = plain.broadcast_from_rank0(_atomic.temp_sibling(path))
    _conversions.dcp_save(state, tmp)
    _barrier()  # every rank's shards are written and DCP's .metadata is last
    if _rank() == 0:
        _atomic.replace_dir(tmp, path)
    _barrier()
    return path


def _as_bytes_tensor(obj: Any) -> torch.Tensor:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)


def _from_bytes_tensor(t: torch.Tensor) -> Any:
    return load(io.BytesIO(tensor_bytes(t)))


# --- loading -----------------------------------------------------------------------------------
def load_state(path: Any, /, **objects: Any) -> Dict[str, Any]:
    """Restore what :func:`save_state` saved into the objects given; return the plain values.

    Models load through :func:`safetorch.load_state_dict` (wrapper-aware, strict); other
    objects through their own ``load_state_dict``. The RNG state this rank saved is restored
    (on more ranks than were saved, the extra ranks keep theirs). Loading is weights-only.

    All or nothing: the file's structure and every rank's RNG state are validated (type, size,
    range) before anything is applied; each object's current state is snapshotted before it is
    loaded, and if any later step fails the objects already loaded get their snapshots back
    and the RNG is left untouched, so a failed call changes nothing.

    Args:
        path: what :func:`save_state` returned (a file or a DCP directory).
        **objects: the same names as at saving; objects not given are skipped.

    Returns:
        The plain values saved (``{"epoch": 3}``).

    Raises:
        CheckpointError: the file is not a ``save_state`` checkpoint, is malformed (a bad RNG
            state, a missing or mistyped entry), an object name is not in it (the error lists
            the names it holds), or an object rejects its state (``CheckpointMismatchError``
            for a model whose keys or shapes differ). The message names the path; the
            underlying error is chained.

    >>> import os, tempfile, torch, safetorch as st
    >>> path = os.path.join(tempfile.mkdtemp(), "state.pt")
    >>> _ = st.save_state(path, model=torch.nn.Linear(2, 2), epoch=7, best=0.25)
    >>> st.load_state(path, model=torch.nn.Linear(2, 2))
    {'epoch': 7, 'best': 0.25}
    """
    _check_names(objects)
    p = os.fsdecode(os.fspath(path))
    if os.path.isdir(p) and os.path.exists(os.path.join(p, _dcp.DCP_METADATA)):
        return _load_dcp(p, objects)
    if not os.path.exists(p):
        raise CheckpointFileNotFoundError(f"state checkpoint {p!r} does not exist")

    saved = load(p)
    if not isinstance(saved, Mapping) or saved.get("__safetorch__") != STATE_FORMAT:
        raise CheckpointError(
            f"{p!r} is not a st.save_state checkpoint (no {STATE_FORMAT!r} marker); load a "
            "plain checkpoint with st.load or st.load_state_dict"
        )
    held = _entry(p, saved, "objects", "a dict of object name -> state dict")
    extras = _entry(p, saved, "extras", "a dict of value name -> value")
    _check_held(p, held, extras, objects)
    rng = _my_rng(p, saved.get("rng", _MISSING))

    def loader(obj: Any, state: Any) -> Callable[[], Any]:
        if isinstance(obj, nn.Module):
            return lambda: load_state_dict(obj, state)
        return lambda: obj.load_state_dict(state)

    steps = [(name, obj, loader(obj, held[name])) for name, obj in objects.items()]
    _Undo(p).run(steps, rng)
    return dict(extras)


_MISSING = object()


def _entry(where: str, saved: Mapping[str, Any], key: str, expected: str) -> Dict[str, Any]:
    value = saved.get(key, _MISSING)
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        got = "nothing" if value is _MISSING else f"a {type(value).__name__}"
        raise CheckpointError(
            f"{where!r}: bad {key!r} entry: got {got}, expected {expected} (with str keys); "
            "the file is corrupt or was not written by st.save_state"
        )
    return value


def _check_held(
    where: str, held: Mapping[str, Any], extras: Mapping[str, Any], objects: Mapping[str, Any]
) -> None:
    """Every object asked for is in the file, and models and optimizers get a mapping."""
    for name, obj in objects.items():
        if name not in held:
            raise CheckpointError(
                f"{where!r} holds no state for {name!r}; it holds {sorted(held)} and the "
                f"values {sorted(extras)}"
            )
        if isinstance(obj, (nn.Module, torch.optim.Optimizer)) and not isinstance(
            held[name], Mapping
        ):
            raise CheckpointError(
                f"{where!r}: the state saved for {name!r} is a {type(held[name]).__name__}, "
                f"expected a state dict (a mapping) for the {type(obj).__name__} given"
            )


def _my_rng(where: str, rng: Any) -> Optional[RNGState]:
    """Validate every rank's saved RNG state (so a bad file fails on every rank alike) and
    return this rank's (``None``: this rank was not saved and keeps its own)."""
    if rng is _MISSING:
        raise CheckpointError(
            f"{where!r}: no 'rng' entry; the file is corrupt or was not written by st.save_state"
        )
    return check_rng_table(rng, repr(where)).get(str(_rank()))


def _object_error(where: str, name: str, exc: BaseException) -> CheckpointError:
    message = (
        f"{where!r}: loading the state of {name!r} failed ({type(exc).__name__}: {exc}); "
        "every object given was put back as it was before the call"
    )
    if isinstance(exc, CheckpointMismatchError):
        return CheckpointMismatchError(message, exc.report)
    return CheckpointError(message)


Step = Tuple[str, Any, Callable[[], Any]]


class _Undo:
    """All-or-nothing application of loaded state: each object is snapshotted before it is
    touched; on a failure every snapshot taken is restored (newest first) and the RNG is not
    applied; the RNG goes last, all its parts at once (:func:`~safetorch.checkpoint._rng.apply_rng`).

    ``models`` (the DCP layout) snapshots models and optimizers through DCP's
    ``get_*_state_dict``/``set_*_state_dict``, as DCP loads them.
    """

    def __init__(self, where: str, models: Optional[Mapping[str, nn.Module]] = None) -> None:
        self.where = where
        self.models = models
        self._restores: List[Tuple[str, Callable[[], Any]]] = []
        self._taken: set = set()

    def snapshot(self, name: str, obj: Any) -> None:
        """Remember ``obj``'s current state (once per object)."""
        if id(obj) in self._taken:
            return
        from safetorch.tensor import safe_copy

        try:
            restore = self._snapshot(obj, safe_copy)
        except CheckpointError:
            raise
        except Exception as exc:
            raise CheckpointError(
                f"{self.where!r}: cannot snapshot the current state of {name!r} before loading "
                f"it ({type(exc).__name__}: {exc}); nothing was changed for it"
            ) from exc
        self._taken.add(id(obj))
        self._restores.append((name, restore))

    def _snapshot(self, obj: Any, safe_copy: Callable[[Any], Any]) -> Callable[[], Any]:
        if self.models is not None and isinstance(obj, (nn.Module, torch.optim.Optimizer)):
            from torch.distributed.checkpoint.state_dict import (
                get_model_state_dict,
                get_optimizer_state_dict,
                set_model_state_dict,
                set_optimizer_state_dict,
            )

            if isinstance(obj, nn.Module):
                model_state = safe_copy(get_model_state_dict(obj))
                return lambda: set_model_state_dict(obj, model_state)
            model = _model_of(obj, self.models)
            optim_state = safe_copy(get_optimizer_state_dict(model, obj))
            return lambda: set_optimizer_state_dict(model, obj, optim_state)
        if isinstance(obj, nn.Module):
            module_state = safe_copy(obj.state_dict())
            return lambda: obj.load_state_dict(module_state)
        other_state = copy.deepcopy(obj.state_dict())
        return lambda: obj.load_state_dict(other_state)

    def rollback(self) -> None:
        """Put back every object snapshotted, newest first (failures are logged, not raised:
        the error that caused the rollback is the one the caller sees)."""
        while self._restores:
            name, restore = self._restores.pop()
            try:
                restore()
            except Exception:
                _log.exception(
                    "safetorch: %r: could not put back the previous state of %r", self.where, name
                )

    def run(self, steps: List[Step], rng: Optional[RNGState]) -> None:
        """Apply ``steps`` (snapshotting each object first), then ``rng``; all or nothing."""
        try:
            for name, obj, apply in steps:
                self.snapshot(name, obj)
                try:
                    apply()
                except Exception as exc:
                    raise _object_error(self.where, name, exc) from exc
            if rng is not None:
                apply_rng(rng, repr(self.where))
        except BaseException:
            self.rollback()
            raise


def _blob_size(path: str, name: str, entry: Any) -> Any:
    """The size of a byte-tensor entry (an object's or the RNG/extras blob) from DCP metadata:
    a 1-D uint8 tensor, as :func:`_as_bytes_tensor` saves it."""
    size = getattr(entry, "size", None)
    dtype = getattr(getattr(entry, "properties", None), "dtype", torch.uint8)
    if not isinstance(size, tuple) or len(size) != 1 or dtype != torch.uint8:
        raise CheckpointError(
            f"{path!r}: the DCP entry {name!r} is {type(entry).__name__} of size {size!r:.60} "
            f"and dtype {dtype!r:.30}, expected a 1-D uint8 tensor (st.save_state's bytes)"
        )
    return size


def _load_dcp(path: str, objects: Mapping[str, Any]) -> Dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    metadata = _dcp.read_dcp_metadata(path)
    entries = getattr(metadata, "state_dict_metadata", None)
    if not isinstance(entries, Mapping):
        raise CheckpointError(f"{path!r}: the DCP metadata holds no state_dict_metadata mapping")
    held = {k.split(".", 1)[0] for k in entries if isinstance(k, str)}
    models = {k: v for k, v in objects.items() if isinstance(v, nn.Module)}
    blob_meta = entries.get("__safetorch__")
    if blob_meta is None:
        raise CheckpointError(f"{path!r} is a DCP directory but not a st.save_state checkpoint")
    for name in objects:
        if name not in held:
            raise CheckpointError(f"{path!r} holds no state for {name!r}; it holds {sorted(held)}")
    state: Dict[str, Any] = {}
    plan: List[Tuple[str, Any, str]] = []
    for name, obj in objects.items():
        if isinstance(obj, nn.Module):
            plan.append((name, obj, "model"))
        elif isinstance(obj, torch.optim.Optimizer):
            plan.append((name, obj, "optimizer"))
        else:
            if name not in entries:
                raise CheckpointError(
                    f"{path!r}: {name!r} is saved as several entries, expected the one byte "
                    f"entry st.save_state writes for a {type(obj).__name__}"
                )
            state[name] = torch.empty(_blob_size(path, name, entries[name]), dtype=torch.uint8)
            plan.append((name, obj, "blob"))
    state["__safetorch__"] = torch.empty(
        _blob_size(path, "__safetorch__", blob_meta), dtype=torch.uint8
    )
    # DCP loads models and optimizers in place, into their own tensors: snapshot everything
    # first, so that a failure anywhere below puts every object back.
    undo = _Undo(path, models)
    for name, obj, _ in plan:
        undo.snapshot(name, obj)
    try:
        for name, obj, kind in plan:
            if kind == "model":
                state[name] = get_model_state_dict(obj)
            elif kind == "optimizer":
                state[name] = get_optimizer_state_dict(_model_of(obj, models), obj)
        _dcp_load.dcp_load(state, path, planner=_dcp_load.safe_planner())
        blob = _decode(path, "__safetorch__", state["__safetorch__"])
        if not isinstance(blob, Mapping) or blob.get("format") != STATE_FORMAT:
            raise CheckpointError(
                f"{path!r}: the '__safetorch__' entry is not st.save_state's record (no "
                f"{STATE_FORMAT!r} format)"
            )
        extras = _entry(path, blob, "extras", "a dict of value name -> value")
        rng = _my_rng(path, blob.get("rng", _MISSING))
        decoded = {n: _decode(path, n, state[n]) for n, _, kind in plan if kind == "blob"}
    except BaseException:
        undo.rollback()
        raise

    def step(name: str, obj: Any, kind: str) -> Callable[[], Any]:
        if kind == "model":
            return lambda: set_model_state_dict(obj, state[name])
        if kind == "optimizer":
            return lambda: set_optimizer_state_dict(_model_of(obj, models), obj, state[name])
        return lambda: obj.load_state_dict(decoded[name])

    undo.run([(name, obj, step(name, obj, kind)) for name, obj, kind in plan], rng)
    return dict(extras)


def _decode(path: str, name: str, t: torch.Tensor) -> Any:
    try:
        return _from_bytes_tensor(t)
    except Exception as exc:
        raise CheckpointError(
            f"{path!r}: cannot read the DCP byte entry {name!r} ({type(exc).__name__}: {exc})"
        ) from exc
