"""``safetorch ckpt inspect`` (and ``inspect --keys``): what a checkpoint or layout holds."""

from __future__ import annotations

import argparse
import collections
import fnmatch
import os
import sys
from typing import (
    IO,
    Any,
    Dict,
    Iterable,
    List,
    Mapping,
    Optional,
    Tuple,
)

import torch

from safetorch._cli import paint
from safetorch._nest import iter_tensors
from safetorch._text import escape_all
from safetorch.checkpoint import _cli_source, _dcp_load, _resolve, _scan, _torchfile, _unpickler
from safetorch.checkpoint._cli_progress import _bytes_under, _human
from safetorch.checkpoint._cli_source import (
    _as_state_dict,
    _dtype_name,
    _emit,
    _format_of,
    _is_layout,
    _load_file,
    _nbytes,
    _readable_file,
    _readable_source,
    _state_info,
    allow_list,
    model_view,
    read_source,
    state_parts,
)
from safetorch.checkpoint._formats import STATE_FORMAT
from safetorch.checkpoint._resolve import saver_checkpoint
from safetorch.checkpoint.keys import (
    _wrapper_segments_in,
    canonical_key,
    find_state_dict,
    is_state_dict,
    known_prefixes,
    state_dict_keys,
)
from safetorch.checkpoint.loading import load
from safetorch.errors import CheckpointError


def inspect_checkpoint(
    path: str, *, allow: Iterable[str] = (), key: Optional[str] = None
) -> Dict[str, Any]:
    """Describe a checkpoint without executing anything outside the weights-only allow-list.

    Args:
        path: the checkpoint file.
        allow: globals allowed as for ``st.load(allow=)`` (``--allow``).
        key: the container key (object name in a ``save_state`` file) of the state dict to
            describe, as ``st.load_state_dict(key=)``.

    Returns:
        A JSON-ready dict: format, size, container keys, every state dict the container holds
        (``state_dicts``: key -> entries, EMA copies included), the one ``st.load_state_dict``
        picks (``state_dict_key``), tensor count, total bytes, dtypes, known prefixes
        (``wrapper_prefixes``: wrapper segments such as ``module.`` and Lightning's ``model.``),
        ``save_state`` (objects, values, RNG ranks of a ``st.save_state`` file, else ``None``)
        and unsafe globals (when there are any, nothing is loaded and only those are reported).

    Raises:
        CheckpointError: the file is missing, empty, truncated or not a checkpoint, or ``key``
            is not a state dict in it.

    >>> import os, tempfile, torch
    >>> path = os.path.join(tempfile.mkdtemp(), "m.pt")
    >>> torch.save({"state_dict": torch.nn.DataParallel(torch.nn.Linear(2, 2)).state_dict()}, path)
    >>> info = inspect_checkpoint(path)
    >>> info["tensor_count"], info["wrapper_prefixes"], info["unsafe_globals"]
    (2, ['module.'], [])
    """
    allow = list(allow)
    info: Dict[str, Any] = {"path": path}
    if not os.path.exists(path):
        load(path)  # raises the not-found error
    info["file_bytes"] = os.path.getsize(path)
    info["format"] = _format_of(path) if info["file_bytes"] else "empty"
    unsafe: List[str] = []
    if info["format"] in ("zip", "legacy"):
        names, _ = _scan.scan_globals(path)
        extra = _unpickler.resolve_allowed((*_unpickler.DEFAULT_EXTRA_ALLOWED, *allow))
        unsafe = _unpickler.unsafe_globals(names, extra)
    info["unsafe_globals"] = unsafe
    if allow:
        info["allowed_globals"] = allow
    if unsafe:
        return info
    obj = _meta_view(path) if info["format"] == "zip" else None
    if obj is None:
        obj = _load_file(path, allow, None)
    parts = state_parts(obj)
    info["save_state"] = _state_info(parts) if parts is not None else None
    info["container_keys"] = (
        [str(k) for k in obj] if isinstance(obj, Mapping) and not is_state_dict(obj) else None
    )
    view = model_view(obj)
    holders = state_dict_keys(view)
    info["state_dicts"] = {k: len(_as_state_dict(view[k])) for k in holders}
    if key is not None:
        find_state_dict(view, key)  # CheckpointError naming the keys there
    try:
        state_dict, picked = find_state_dict(view, key)
        info["state_dict_key"] = picked
        info["state_dict_tensors"] = len(state_dict)
        info["wrapper_prefixes"] = known_prefixes(state_dict)
    except CheckpointError as exc:
        info["state_dict_key"] = None
        info["state_dict_note"] = str(exc)
        info["wrapper_prefixes"] = sorted(
            {p for k in holders for p in known_prefixes(_as_state_dict(view[k]))}
        )
    seen = set()
    count, total = 0, 0
    dtypes: Dict[str, int] = collections.Counter()
    for t in iter_tensors(obj):
        count += 1
        dtypes[str(t.dtype).replace("torch.", "")] += 1
        storage = _cli_source._storage_of(t)
        # a meta view's storages have no data pointer: told apart by the storage itself
        ptr = storage._cdata if t.device.type == "meta" else storage.data_ptr()
        ident = (ptr, storage.nbytes(), str(t.device))
        if ident not in seen:  # tensors sharing a storage count once
            seen.add(ident)
            total += storage.nbytes()
    info["tensor_count"] = count
    info["tensor_bytes"] = total
    info["dtypes"] = dict(sorted(dtypes.items()))
    return info


def _meta_view(path: str) -> Any:
    """The checkpoint's structure with its tensors on ``meta`` (nothing read but the pickle and
    the zip directory, every storage checked against its record), or ``None`` where the file
    needs ``st.load`` (legacy format, compressed records, other tensor kinds, allowed
    globals): ``inspect`` then costs the pickle, not the file's size."""

    found = _torchfile.TorchFile.open(path)
    if found is None:
        return None
    found.close()
    return found.view


_PREFIX_NOTES = {"model.": "Lightning's model attribute", "module.": "DataParallel/DDP"}
_PREFIX_NOTES.update({"_orig_mod.": "torch.compile", "_fsdp_wrapped_module.": "FSDP"})
_PREFIX_NOTES["_checkpoint_wrapped_module."] = "activation checkpointing"


def _print_info(info: Dict[str, Any], out: IO[str]) -> None:
    out.write(f"path: {info['path']} ({info['format']}, {_human(info['file_bytes'])})\n")
    if info.get("allowed_globals"):
        out.write("allowed globals (--allow / SAFETORCH_ALLOW): ")
        out.write(", ".join(info["allowed_globals"]) + "\n")
    if info["unsafe_globals"]:
        out.write(paint("unsafe globals: " + ", ".join(info["unsafe_globals"]), "red", out) + "\n")
        out.write(
            "not loaded: it would run code outside the weights-only allow-list (if you trust "
            "the file: --allow " + " --allow ".join(info["unsafe_globals"]) + ")\n"
        )
        return
    state = info.get("save_state")
    if state:
        out.write(
            f"st.save_state checkpoint: objects {', '.join(state['objects']) or '-'}; values "
            f"{', '.join(state['values']) or '-'}; RNG of {state['rng_ranks']} rank(s) "
            "(st.load_state / CheckpointSaver.resume restore it)\n"
        )
    if info.get("container_keys") is not None:
        out.write("container keys: " + ", ".join(info["container_keys"]) + "\n")
    if info.get("state_dict_key") is not None or "state_dict_tensors" in info:
        out.write(
            f"state dict: {info['state_dict_key'] or '(top level)'} "
            f"({info.get('state_dict_tensors', 0)} entries; st.load_state_dict loads it)\n"
        )
    elif info.get("state_dict_note"):
        out.write(f"state dict: {info['state_dict_note']}\n")
    others = {k: n for k, n in info.get("state_dicts", {}).items() if k != info["state_dict_key"]}
    if others:
        out.write(
            "other state dicts: "
            + ", ".join(f"{k} ({n} entries; key='{k}')" for k, n in others.items())
            + "\n"
        )
    out.write(f"tensors: {info['tensor_count']}, {_human(info['tensor_bytes'])}\n")
    out.write(
        "dtypes: " + (", ".join(f"{k} ({v})" for k, v in info["dtypes"].items()) or "-") + "\n"
    )
    prefixes = [
        f"{p} ({_PREFIX_NOTES[p]})" if p in _PREFIX_NOTES else p for p in info["wrapper_prefixes"]
    ]
    out.write("wrapper prefixes: " + (", ".join(prefixes) or "none") + "\n")
    out.write("unsafe globals: none\n")


def list_keys(
    path: str,
    pattern: str = "*",
    *,
    key: Optional[str] = None,
    allow: Iterable[str] = (),
    show_progress: bool = True,
) -> List[Dict[str, Any]]:
    """Every tensor entry of every state dict in a checkpoint: key, shape, dtype, bytes.

    Args:
        path: the checkpoint (any layout :func:`read_source` reads; loaded weights-only).
        pattern: a glob (``fnmatch``) matched against the key and its canonical form
            (wrapper segments dropped), e.g. ``"*.bn1.*"``.
        key: only the state dict under this container key (object name in a ``save_state``
            file), as ``st.load_state_dict(key=)``.
        allow: globals allowed as for ``st.load(allow=)`` (``--allow``).
        show_progress: ``False`` never draws the progress bar (``--no-progress``).

    Returns:
        One dict per entry, in file order: ``state_dict`` (container key, or object name in a
        ``save_state`` file; ``None`` for the top level), ``key``, ``canonical`` (the key
        without wrapper segments), ``wrappers`` (the wrapper segments in it), ``shape``,
        ``dtype`` and ``bytes`` (``None`` for non-tensors).

    Raises:
        CheckpointError: the file cannot be loaded, or ``key`` is not a state dict in it.

    >>> import os, tempfile, torch
    >>> path = os.path.join(tempfile.mkdtemp(), "m.pt")
    >>> torch.save(torch.nn.DataParallel(torch.nn.Linear(2, 3)).state_dict(), path)
    >>> [(r["key"], r["shape"], r["dtype"], r["bytes"]) for r in list_keys(path, "*weight")]
    [('module.weight', [3, 2], 'float32', 24)]
    """
    view = model_view(read_source(path, allow=allow, show_progress=show_progress))
    holders: List[Tuple[Optional[str], Mapping[str, Any]]]
    if key is not None:
        holders = [(key, find_state_dict(view, key)[0])]
    elif is_state_dict(view):
        holders = [(None, view)]
    else:
        holders = [(k, _as_state_dict(view[k])) for k in state_dict_keys(view)]
    rows: List[Dict[str, Any]] = []
    for holder, sd in holders:
        for name, value in sd.items():
            canon = canonical_key(name)
            if not (fnmatch.fnmatchcase(name, pattern) or fnmatch.fnmatchcase(canon, pattern)):
                continue
            tensor = isinstance(value, torch.Tensor)
            rows.append(
                {
                    "state_dict": holder,
                    "key": name,
                    "canonical": canon,
                    "wrappers": [s + "." for s in _wrapper_segments_in([name])],
                    "shape": list(value.shape) if tensor else None,
                    "dtype": _dtype_name(value) if tensor else type(value).__name__,
                    "bytes": _nbytes(value) if tensor else None,
                }
            )
    return rows


def _print_keys(rows: List[Dict[str, Any]], out: IO[str]) -> None:
    if not rows:
        out.write("no matching keys\n")
        return
    width = min(max(len(r["key"]) for r in rows), 60)
    current: Any = object()
    for r in rows:
        if r["state_dict"] != current:
            current = r["state_dict"]
            out.write(f"[{current if current is not None else 'top level'}]\n")
        shape = "-" if r["shape"] is None else str(r["shape"])
        size = "-" if r["bytes"] is None else _human(r["bytes"])
        note = f"  wrapper: {', '.join(r['wrappers'])}" if r["wrappers"] else ""
        out.write(f"  {r['key']:<{width}}  {shape:<16} {r['dtype']:<9} {size:>9}{note}\n")


def _print_layout(info: Dict[str, Any], out: IO[str]) -> None:
    out.write(f"path: {info['path']} ({info['layout']})\n")
    out.write(f"model weights: {info['model']}\n")
    for f in info["files"]:
        out.write(f"  {f['file']:<40} {_human(f['bytes']):>10}  {f['role']}\n")
    if "state_dict_tensors" in info:
        where = info.get("state_dict_key") or "(top level)"
        out.write(
            f"state dict: {where} ({info['state_dict_tensors']} tensors, "
            f"{_human(info['tensor_bytes'])}; st.load_state_dict loads it)\n"
        )
        others = [k for k in info.get("state_dicts", []) if k != info.get("state_dict_key")]
        if others:
            out.write("other state dicts: " + ", ".join(others) + "\n")
        prefixes = [
            f"{p} ({_PREFIX_NOTES[p]})" if p in _PREFIX_NOTES else p
            for p in info.get("wrapper_prefixes", [])
        ]
        out.write("wrapper prefixes: " + (", ".join(prefixes) or "none") + "\n")
    elif info.get("state_dict_note"):
        out.write(f"state dict: {info['state_dict_note']}\n")


def _describe_saver(path: str, picked: str, why: str) -> Dict[str, Any]:
    """A ``CheckpointSaver`` directory file by file, with the checkpoint it stands for named."""
    files = []
    for name in sorted(os.listdir(path)):
        full = os.path.join(path, name)
        if name.startswith("."):
            continue  # a temp file of an interrupted write
        role = "CheckpointSaver index" if name.endswith(".json") else "checkpoint"
        if os.path.realpath(full) == os.path.realpath(picked):
            role = why
        files.append({"file": name, "bytes": _bytes_under(full), "role": role})
    return {
        "path": path,
        "layout": "CheckpointSaver directory",
        "model": f"{os.path.basename(picked)} in {path!r}",
        "files": files,
    }


def _describe_state_layout(path: str, info: Dict[str, Any]) -> None:
    """A DCP directory written from a ``save_state`` file (``ckpt convert state.pt d --to
    dcp``) keeps the file's structure: find its models in ``objects``, as for the file. The
    marker is read (a bytes entry, through the restricted unpickler) before it is trusted."""
    layout = _resolve.resolve(path)
    if not isinstance(layout, _dcp_load.DCPDirectory):
        return
    view = layout.meta_view()
    if not (isinstance(view, Mapping) and isinstance(view.get("objects"), Mapping)):
        return
    if "__safetorch__" not in layout.metadata.state_dict_metadata:
        return
    if layout.read(["__safetorch__"])["__safetorch__"] != STATE_FORMAT:
        return
    objects = view["objects"]
    info["state_dicts"] = state_dict_keys(objects)
    try:
        sd, key = find_state_dict(objects)
    except CheckpointError as exc:
        info["state_dict_note"] = str(exc)
        return
    del info["state_dict_note"]
    info["state_dict_key"] = key
    info["state_dict_tensors"] = len(sd)
    info["tensor_bytes"] = sum(_nbytes(t) for t in sd.values() if isinstance(t, torch.Tensor))
    info["wrapper_prefixes"] = known_prefixes(sd)


def _inspect_directory(args: argparse.Namespace, allow: List[str]) -> Dict[str, Any]:
    """``inspect`` of a directory or shard index: its files, and the checkpoint it stands for
    (``checkpoint`` when that is one file, ``checkpoint_layout`` when it is a DCP directory)."""
    saver = saver_checkpoint(args.path) if os.path.isdir(args.path) else None
    if saver is not None:
        info = _describe_saver(args.path, *saver)
        picked = saver[0]
        if os.path.isdir(picked):  # a DCP state directory
            info["checkpoint_layout"] = _resolve.describe(picked)
        else:
            info["checkpoint"] = inspect_checkpoint(picked, allow=allow, key=args.key)
        return info
    info = _resolve.describe(args.path)
    if "state_dict_note" in info:
        _describe_state_layout(args.path, info)
    if info["layout"] == "file":  # a directory with one torch.save file: describe it too
        picked = os.path.join(
            args.path, next(f["file"] for f in info["files"] if "model" in f["role"])
        )
        info["checkpoint"] = inspect_checkpoint(picked, allow=allow, key=args.key)
    return info


def _cmd_inspect(args: argparse.Namespace) -> int:
    allow = allow_list(args.allow)
    if args.keys is not None:
        _readable_source(args.path)
        if not _is_layout(args.path):
            info = inspect_checkpoint(args.path, allow=allow)  # refuses unsafe files unloaded
            if info["unsafe_globals"]:
                _emit(args, info, _print_info)
                return 1
        rows = list_keys(
            args.path, args.keys, key=args.key, allow=allow, show_progress=not args.no_progress
        )
        _emit(args, rows, _print_keys)
        return 0
    if _is_layout(args.path) and os.path.exists(args.path):
        _readable_source(args.path)
        info = _inspect_directory(args, allow)
        if args.json:
            _emit(args, info, _print_layout)
        else:  # escaped once, then printed part by part
            _print_layout(shown := escape_all(info), sys.stdout)
            if "checkpoint_layout" in shown:
                _print_layout(shown["checkpoint_layout"], sys.stdout)
            if "checkpoint" in shown:
                _print_info(shown["checkpoint"], sys.stdout)
        return 1 if info.get("checkpoint", {}).get("unsafe_globals") else 0
    _readable_file(args.path)
    info = inspect_checkpoint(args.path, allow=allow, key=args.key)
    _emit(args, info, _print_info)
    return 1 if info["unsafe_globals"] else 0
