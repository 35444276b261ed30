"""Writing layouts: DCP directories and sharded safetensors (``safetorch ckpt convert``,
``st.save_state``'s DCP form), and a DCP directory read whole into one object.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Mapping

import torch

from safetorch import _compat
from safetorch._atomic import atomic_write, atomic_write_dir, atomic_write_text
from safetorch.checkpoint import _reader
from safetorch.checkpoint._dcp import nest_flat_keys
from safetorch.checkpoint._dcp_load import DCPDirectory, _single_process_quiet
from safetorch.checkpoint._resolve import SAFETENSORS_INDEX

__all__: List[str] = []  # private module: used by st.save_state and the CLI


# --- conversions (safetorch ckpt convert / inspect) --------------------------------------------
def dcp_to_object(directory: str) -> Any:
    """The whole content of a DCP directory as the nested object it was saved from.

    Tensors are allocated on the CPU and filled through safetorch's reader; byte entries are
    rebuilt by the restricted unpickler. The nesting comes from DCP's own ``planner_data``
    (flattened key -> original path, checked against DCP's flattening) where it is present,
    else from the first key segment.
    """
    dcp_dir = DCPDirectory(directory, directory)
    flat = dcp_dir.read(list(dcp_dir.metadata.state_dict_metadata))
    return nest_flat_keys(flat, dcp_dir.paths())


def save_dcp(obj: Mapping[str, Any], directory: str) -> None:
    """Write ``obj`` as a DCP directory on one process, atomically (``_atomic``'s directory
    writer: a temp sibling, then a rename over ``directory``, which it replaces)."""
    atomic_write_dir(directory, lambda tmp: dcp_save(obj, tmp))


def dcp_save(obj: Mapping[str, Any], directory: str) -> None:
    """``torch.distributed.checkpoint.save`` of ``obj`` into ``directory`` (no atomicity: the
    caller writes into a temp directory), with or without a process group, without DCP's
    single-process and torch-internal warnings."""
    import torch.distributed.checkpoint as dcp

    from safetorch import _dist

    with _single_process_quiet():
        if _compat.DCP_HAS_SAVE_LOAD:
            dcp.save(dict(obj), checkpoint_id=directory)
        else:
            dcp.save_state_dict(
                dict(obj),
                storage_writer=dcp.FileSystemWriter(directory),
                no_dist=not _dist.initialized(),
            )


def parse_size(text: str) -> int:
    """``"5GB"``, ``"500MB"``, ``"1024"`` -> bytes (decimal units, as transformers)."""
    units = {"KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "KB": 10**3, "MB": 10**6, "GB": 10**9}
    t = text.strip().upper().replace(" ", "")
    factor, number = 1, t[:-1] if t.endswith("B") else t
    for unit, scale in units.items():  # the 3-letter units first: "MIB" also ends in "IB"
        if t.endswith(unit):
            factor, number = scale, t[: -len(unit)]
            break
    try:
        value = float(number) * factor
    except ValueError:
        raise ValueError(
            f"size {text!r}; expected e.g. '5GB', '500MB' or a number of bytes"
        ) from None
    if value <= 0:
        raise ValueError(f"size {text!r} must be positive")
    return int(value)


def save_sharded_safetensors(
    state_dict: Mapping[str, torch.Tensor], directory: str, max_shard_bytes: int
) -> Dict[str, Any]:
    """Write ``model-0000i-of-0000n.safetensors`` shards and ``model.safetensors.index.json``.

    Shards are filled in key order up to ``max_shard_bytes`` (a larger tensor gets a shard of
    its own), each written atomically; the index is written last.
    """
    st_torch = _reader.safetensors_package().torch
    shards: List[Dict[str, torch.Tensor]] = [{}]
    size = 0
    for key, tensor in state_dict.items():
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][key] = tensor.contiguous()
        size += nbytes
    os.makedirs(directory, exist_ok=True)
    n = len(shards)
    weight_map: Dict[str, str] = {}
    total = 0
    for i, shard in enumerate(shards, 1):
        name = f"model-{i:05d}-of-{n:05d}.safetensors"

        def write(tmp: str, shard: Dict[str, torch.Tensor] = shard) -> None:
            st_torch.save_file(shard, tmp, metadata={"format": "pt"})

        atomic_write(os.path.join(directory, name), write)
        for key, tensor in shard.items():
            weight_map[key] = name
            total += tensor.numel() * tensor.element_size()
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    text = json.dumps(index, indent=2, sort_keys=True)
    atomic_write_text(os.path.join(directory, SAFETENSORS_INDEX), text)
    return {"shards": n, "tensors": len(weight_map), "total_bytes": total}
