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
"""

from __future__ import annotations

import io
import itertools
import os
import random
import sys
from typing import Any, Dict, List, Mapping, Optional, Tuple

import torch
from torch import nn

from safetorch import _atomic
from safetorch.checkpoint import layouts
from safetorch.errors import CheckpointError, CheckpointFileNotFoundError

__all__ = ["save_state", "load_state"]

STATE_FORMAT = "safetorch.state/1"
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


# --- RNG -------------------------------------------------------------------------------------
def _bytes(t: torch.Tensor) -> bytes:
    return bytes(t.cpu().numpy().tobytes())


def _byte_tensor(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def capture_rng() -> Dict[str, Any]:
    """This process's RNG states as plain data (ints, tuples, bytes): weights-only loading
    rebuilds it, and it travels between ranks without pickling any object."""
    state: Dict[str, Any] = {"python": random.getstate(), "torch": _bytes(torch.get_rng_state())}
    np = sys.modules.get("numpy")
    if np is not None:
        name, keys, pos, has_gauss, cached = np.random.get_state()
        state["numpy"] = (name, keys.astype("<u4").tobytes(), pos, has_gauss, float(cached))
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = [_bytes(s) for s in torch.cuda.get_rng_state_all()]
    return state


def restore_rng(state: Mapping[str, Any]) -> None:
    """Restore what :func:`capture_rng` captured (parts this process cannot use are skipped)."""
    if "python" in state:
        version, internal, gauss = state["python"]
        random.setstate((version, tuple(internal), gauss))
    if "torch" in state:
        torch.set_rng_state(_byte_tensor(state["torch"]))
    np = sys.modules.get("numpy")
    if np is not None and "numpy" in state:
        name, keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((name, np.frombuffer(keys, dtype="<u4"), pos, has_gauss, cached))
    if "cuda" in state and torch.cuda.is_available():
        saved = [_byte_tensor(b) for b in state["cuda"]]
        if len(saved) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(saved)


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
    from safetorch.checkpoint.saving import _unwrapped, save_checkpoint

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
    import torch.distributed.checkpoint as dcp
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
    if hasattr(dcp, "save"):  # torch 2.2+
        dcp.save(state, checkpoint_id=tmp)
    else:
        dcp.save_state_dict(state, storage_writer=dcp.FileSystemWriter(tmp))
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
    from safetorch.checkpoint.io import load

    return load(io.BytesIO(t.numpy().tobytes()))


# --- loading -----------------------------------------------------------------------------------
def load_state(path: Any, /, **objects: Any) -> Dict[str, Any]:
    """Restore what :func:`save_state` saved into the objects given; return the plain values.

    Models load through :func:`safetorch.load_state_dict` (wrapper-aware, strict); other
    objects through their own ``load_state_dict``. The RNG state this rank saved is restored
    (on more ranks than were saved, the extra ranks keep theirs). Loading is weights-only.

    Args:
        path: what :func:`save_state` returned (a file or a DCP directory).
        **objects: the same names as at saving; objects not given are skipped.

    Returns:
        The plain values saved (``{"epoch": 3}``).

    Raises:
        CheckpointError: the file is not a ``save_state`` checkpoint, or an object name is not
            in it (the error lists the names it holds).

    >>> import os, tempfile, torch, safetorch as st
    >>> path = os.path.join(tempfile.mkdtemp(), "state.pt")
    >>> _ = st.save_state(path, model=torch.nn.Linear(2, 2), epoch=7, best=0.25)
    >>> st.load_state(path, model=torch.nn.Linear(2, 2))
    {'epoch': 7, 'best': 0.25}
    """
    _check_names(objects)
    p = os.fsdecode(os.fspath(path))
    if os.path.isdir(p) and os.path.exists(os.path.join(p, layouts.DCP_METADATA)):
        return _load_dcp(p, objects)
    if not os.path.exists(p):
        raise CheckpointFileNotFoundError(f"state checkpoint {p!r} does not exist")
    from safetorch.checkpoint.io import load, load_state_dict

    saved = load(p)
    if not isinstance(saved, Mapping) or saved.get("__safetorch__") != STATE_FORMAT:
        raise CheckpointError(
            f"{p!r} is not a st.save_state checkpoint (no {STATE_FORMAT!r} marker); load a "
            "plain checkpoint with st.load or st.load_state_dict"
        )
    held = saved["objects"]
    for name, obj in objects.items():
        if name not in held:
            raise CheckpointError(
                f"{p!r} holds no state for {name!r}; it holds {sorted(held)} and the values "
                f"{sorted(saved['extras'])}"
            )
        if isinstance(obj, nn.Module):
            load_state_dict(obj, held[name])
        else:
            obj.load_state_dict(held[name])
    _restore_rank_rng(saved["rng"])
    return dict(saved["extras"])


def _restore_rank_rng(rng: Mapping[str, Any]) -> None:
    mine = rng.get(str(_rank()))
    if mine is not None:
        restore_rng(mine)


def _safe_planner() -> Any:
    """A DefaultLoadPlanner whose byte entries load weights-only (st.load) rather than through
    DCP's own ``torch.load(weights_only=False)``."""
    from torch.distributed.checkpoint import DefaultLoadPlanner

    class SafeLoadPlanner(DefaultLoadPlanner):
        def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
            from safetorch.checkpoint.io import load

            obj = load(value)  # weights-only; refuses anything else
            clean = io.BytesIO()
            torch.save(obj, clean)  # what DCP's own path then unpickles is benign
            clean.seek(0)
            super().load_bytes(read_item, clean)

    return SafeLoadPlanner()


def _load_dcp(path: str, objects: Mapping[str, Any]) -> Dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    metadata = layouts.read_dcp_metadata(path)
    held = {k.split(".", 1)[0] for k in metadata.state_dict_metadata}
    models = {k: v for k, v in objects.items() if isinstance(v, nn.Module)}
    blob_meta = metadata.state_dict_metadata.get("__safetorch__")
    if blob_meta is None:
        raise CheckpointError(f"{path!r} is a DCP directory but not a st.save_state checkpoint")
    state: Dict[str, Any] = {}
    plan: List[Tuple[str, Any, str]] = []
    for name, obj in objects.items():
        if name not in held:
            raise CheckpointError(f"{path!r} holds no state for {name!r}; it holds {sorted(held)}")
        if isinstance(obj, nn.Module):
            state[name] = get_model_state_dict(obj)
            plan.append((name, obj, "model"))
        elif isinstance(obj, torch.optim.Optimizer):
            state[name] = get_optimizer_state_dict(_model_of(obj, models), obj)
            plan.append((name, obj, "optimizer"))
        else:
            size = metadata.state_dict_metadata[name].size
            state[name] = torch.empty(size, dtype=torch.uint8)
            plan.append((name, obj, "blob"))
    state["__safetorch__"] = torch.empty(blob_meta.size, dtype=torch.uint8)
    layouts.dcp_load(state, path, planner=_safe_planner())
    for name, obj, kind in plan:
        if kind == "model":
            set_model_state_dict(obj, state[name])
        elif kind == "optimizer":
            set_optimizer_state_dict(_model_of(obj, models), obj, state[name])
        else:
            obj.load_state_dict(_from_bytes_tensor(state[name]))
    blob = _from_bytes_tensor(state["__safetorch__"])
    _restore_rank_rng(blob["rng"])
    return dict(blob["extras"])


def latest_complete(directory: str, names: List[str]) -> Optional[str]:
    """The newest of ``names`` in ``directory`` that is a complete checkpoint (used by
    CheckpointSaver.resume): a file that opens, or a DCP directory with its .metadata."""
    for name in names:
        p = os.path.join(directory, name)
        if os.path.isdir(p) and os.path.exists(os.path.join(p, layouts.DCP_METADATA)):
            return p
        if os.path.isfile(p) and os.path.getsize(p) > 0:
            return p
    return None
