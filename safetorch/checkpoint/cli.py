"""``safetorch ckpt inspect|convert|diff|verify|fit``: look inside, rewrite, compare, check, try.

Every file is read through :func:`safetorch.load` (weights-only), never plain pickle.
Expected failures end in one line on stderr naming the value and the fix; exit status 2 for
bad input (missing or unreadable paths, directories, bad options, corrupt files), 1 for
findings (unsafe globals, differences, a checkpoint that does not fit) or failed work, 0
otherwise.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import errno
import fnmatch
import importlib
import inspect as _inspect
import json
import os
import stat
import sys
import warnings
from typing import IO, Any, Callable, Dict, Iterator, List, Mapping, Optional, Tuple, Type

import torch

from safetorch import _compat
from safetorch._atomic import atomic_write
from safetorch.checkpoint import _unpickler, formats, layouts, reader
from safetorch.checkpoint.keys import (
    _leading_prefixes,
    _wrapper_segments_in,
    canonical_key,
    find_state_dict,
    is_state_dict,
    known_prefixes,
    match_keys,
    state_dict_keys,
)
from safetorch.checkpoint.loading import _torch_internals_quiet, load
from safetorch.checkpoint.saving import _unwrapped
from safetorch.errors import CheckpointError, UnsafeCheckpointError

__all__ = [
    "add_parsers",
    "inspect_checkpoint",
    "convert_checkpoint",
    "list_keys",
    "diff_checkpoints",
    "fit_checkpoint",
]
# verify_checkpoint lives in safetorch.checkpoint.verify (``safetorch ckpt verify``).

# Show a progress bar only for files at least this large (and only on a terminal).
PROGRESS_MIN_BYTES = 256 * 1024 * 1024


def _iter_tensors(obj: Any, depth: int = 0) -> Iterator[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield obj
    elif depth > 20:
        return
    elif isinstance(obj, Mapping):
        for v in obj.values():
            yield from _iter_tensors(v, depth + 1)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _iter_tensors(v, depth + 1)


_storage_of: Callable[[torch.Tensor], Any]


@_compat.register_binder
def _bind() -> None:
    global _storage_of
    # Tensor.untyped_storage() is torch 2.0+; 1.13's Tensor.storage() (a TypedStorage) has the
    # same data_ptr()/nbytes(), and warns about TypedStorage only from 2.0 on.
    _storage_of = (
        torch.Tensor.untyped_storage if _compat.HAS_UNTYPED_STORAGE else torch.Tensor.storage
    )


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _format_of(path: str) -> str:
    kind = formats.sniff(path)  # the one sniffer st.load uses
    return kind if kind in ("safetensors", "zip") else "legacy"


def inspect_checkpoint(path: str) -> Dict[str, Any]:
    """Describe a checkpoint without executing anything outside the weights-only allow-list.

    Args:
        path: the checkpoint file.

    Returns:
        A JSON-ready dict: format, size, container keys, every state dict the container holds
        (``state_dicts``: key -> entries, EMA copies included), the one ``st.load_state_dict``
        picks (``state_dict_key``), tensor count, total bytes, dtypes, known prefixes
        (``wrapper_prefixes``: wrapper segments such as ``module.`` and Lightning's ``model.``)
        and unsafe globals (when there are any, nothing is loaded and only those are reported).

    Raises:
        CheckpointError: the file is missing, empty, truncated or not a checkpoint.

    >>> import os, tempfile, torch
    >>> path = os.path.join(tempfile.mkdtemp(), "m.pt")
    >>> torch.save({"state_dict": torch.nn.DataParallel(torch.nn.Linear(2, 2)).state_dict()}, path)
    >>> info = inspect_checkpoint(path)
    >>> info["tensor_count"], info["wrapper_prefixes"], info["unsafe_globals"]
    (2, ['module.'], [])
    """
    info: Dict[str, Any] = {"path": path}
    if not os.path.exists(path):
        load(path)  # raises the not-found error
    info["file_bytes"] = os.path.getsize(path)
    info["format"] = _format_of(path) if info["file_bytes"] else "empty"
    unsafe: List[str] = []
    if info["format"] in ("zip", "legacy"):
        names, _ = _unpickler.scan_globals(path)
        extra = _unpickler.resolve_allowed(_unpickler.DEFAULT_EXTRA_ALLOWED)
        unsafe = _unpickler.unsafe_globals(names, extra)
    info["unsafe_globals"] = unsafe
    if unsafe:
        return info
    obj = load(path)
    info["container_keys"] = (
        [str(k) for k in obj] if isinstance(obj, Mapping) and not is_state_dict(obj) else None
    )
    holders = state_dict_keys(obj)
    info["state_dicts"] = {k: len(_as_state_dict(obj[k])) for k in holders}
    try:
        state_dict, key = find_state_dict(obj)
        info["state_dict_key"] = key
        info["state_dict_tensors"] = len(state_dict)
        info["wrapper_prefixes"] = known_prefixes(state_dict)
    except CheckpointError as exc:
        info["state_dict_key"] = None
        info["state_dict_note"] = str(exc)
        info["wrapper_prefixes"] = sorted(
            {p for k in holders for p in known_prefixes(_as_state_dict(obj[k]))}
        )
    seen = set()
    count, total = 0, 0
    dtypes: Dict[str, int] = collections.Counter()
    for t in _iter_tensors(obj):
        count += 1
        dtypes[str(t.dtype).replace("torch.", "")] += 1
        storage = _storage_of(t)
        ident = (storage.data_ptr(), storage.nbytes(), str(t.device))
        if ident not in seen:  # tensors sharing a storage count once
            seen.add(ident)
            total += storage.nbytes()
    info["tensor_count"] = count
    info["tensor_bytes"] = total
    info["dtypes"] = dict(sorted(dtypes.items()))
    return info


def _human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} GB"


def _as_state_dict(value: Any) -> Mapping[str, Any]:
    return value.state_dict() if isinstance(value, torch.nn.Module) else value


_PREFIX_NOTES = {"model.": "Lightning's model attribute", "module.": "DataParallel/DDP"}
_PREFIX_NOTES.update({"_orig_mod.": "torch.compile", "_fsdp_wrapped_module.": "FSDP"})
_PREFIX_NOTES["_checkpoint_wrapped_module."] = "activation checkpointing"


def _print_info(info: Dict[str, Any], out: IO[str]) -> None:
    out.write(f"path: {info['path']} ({info['format']}, {_human(info['file_bytes'])})\n")
    if info["unsafe_globals"]:
        out.write("unsafe globals: " + ", ".join(info["unsafe_globals"]) + "\n")
        out.write("not loaded: it would run code outside the weights-only allow-list\n")
        return
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
            + ", ".join(f"{k} ({n} entries; key={k!r})" for k, n in others.items())
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


class _Progress:
    """A one-line progress bar on a TTY stream (nothing otherwise)."""

    def __init__(self, total: int, stream: IO[str], enabled: bool) -> None:
        self.total, self.stream, self.enabled, self.done = max(total, 1), stream, enabled, 0

    def advance(self, n: int, label: str = "") -> None:
        self.done = min(self.done + n, self.total)
        if self.enabled:
            frac = self.done / self.total
            bar = "#" * int(frac * 30)
            self.stream.write(
                f"\r{label:<8} [{bar:<30}] {frac:6.1%} {_human(self.done)}/{_human(self.total)}"
            )
            self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\n")
            self.stream.flush()


class _CountingWriter:
    def __init__(self, fh: IO[bytes], progress: _Progress) -> None:
        self.fh, self.progress = fh, progress

    def write(self, data: Any) -> int:
        n = self.fh.write(data)
        self.progress.advance(len(memoryview(data).cast("B")), "writing")
        return n

    def flush(self) -> None:
        self.fh.flush()


def _for_safetensors(state_dict: Mapping[str, Any]) -> Tuple[Dict[str, torch.Tensor], List[str]]:
    """Contiguous tensors, shared storages cloned (safetensors refuses aliasing)."""
    out: Dict[str, torch.Tensor] = {}
    dropped: List[str] = []
    seen = set()
    for k, v in state_dict.items():
        if not isinstance(v, torch.Tensor):
            dropped.append(k)
            continue
        ptr = (_storage_of(v).data_ptr(), v.device) if v.numel() else None
        if ptr is not None and ptr in seen:
            v = v.clone()
        elif ptr is not None:
            seen.add(ptr)
        out[k] = v.contiguous()
    return out, dropped


def convert_checkpoint(
    src: str,
    dst: str,
    *,
    strip: str = "auto",
    to: Optional[str] = None,
    key: Optional[str] = None,
    progress_stream: Optional[IO[str]] = None,
    max_shard_size: Optional[str] = None,
    max_bytes: Optional[int] = None,
) -> Dict[str, Any]:
    """Rewrite a checkpoint atomically: strip wrapper prefixes, change format or layout.

    The source is a torch.save file, a ``.safetensors`` file, a DCP directory or a shard
    index / library directory; the output is one torch file, one ``.safetensors`` file, a
    directory of safetensors shards with ``model.safetensors.index.json``
    (``max_shard_size``), or a DCP directory (``to="dcp"``).

    Args:
        src: input checkpoint (loaded weights-only).
        dst: output path, replaced atomically.
        strip: ``"auto"`` drops wrapper segments (``module.``, ``_orig_mod.``, ...) from every
            state dict; ``"none"`` keeps keys; any other value ending in ``.`` is also stripped
            as a leading prefix (e.g. ``"model."``).
        to: ``"torch"``, ``"safetensors"`` or ``"dcp"``; default from ``dst``'s extension.
        key: container key of the state dict to write (only that state dict is written);
            needed for safetensors output when the container holds several.
        progress_stream: where a progress bar goes (default stderr); drawn only if it is a TTY
            and ``src`` is larger than 256 MB.
        max_shard_size: with ``to="safetensors"``: write shards of at most this size
            (``"5GB"``, ``"500MB"``) into the directory ``dst``, plus the index.
        max_bytes: safetensors and DCP store every tensor contiguously, so an expanded or
            overlapping view (``torch.zeros(1).expand(2**32)``: a 4-byte storage) or a storage
            shared by many entries is written out in full. The tensor data written may take at
            most this many bytes; by default twice the bytes of the source's tensor storages
            plus 64 MiB (so tied weights convert, and a small file cannot ask for gigabytes).
            ``torch`` output keeps views as they are and needs no limit.

    Returns:
        A summary dict (``format``, ``tensors``, ``dropped`` non-tensor keys).

    Raises:
        CheckpointError: ``src`` cannot be loaded, ``key`` is not a state dict in it, or the
            safetensors/DCP output would exceed ``max_bytes`` (naming the largest tensor).
        ValueError: a bad ``to`` or ``strip``, or a ``strip`` prefix that matches no key.

    >>> import os, tempfile, torch, safetorch as st
    >>> d = tempfile.mkdtemp(); src = os.path.join(d, "dp.pt"); dst = os.path.join(d, "plain.pt")
    >>> torch.save(torch.nn.DataParallel(torch.nn.Linear(2, 2)).state_dict(), src)
    >>> _ = convert_checkpoint(src, dst)
    >>> sorted(st.load(dst))
    ['bias', 'weight']
    """
    stream = sys.stderr if progress_stream is None else progress_stream
    size = _size_of(src)
    show = bool(getattr(stream, "isatty", lambda: False)()) and size > PROGRESS_MIN_BYTES
    fmt = to or ("safetensors" if dst.endswith(".safetensors") else "torch")
    if fmt not in ("torch", "safetensors", "dcp"):
        raise ValueError(f"--to {fmt!r}; expected 'torch', 'safetensors' or 'dcp'")
    if max_shard_size is not None and fmt != "safetensors":
        raise ValueError("--max-shard-size writes safetensors shards; add --to safetensors")
    if strip != "auto" and strip != "none" and not strip.endswith("."):
        raise ValueError(f"--strip {strip!r}; expected 'auto', 'none' or a prefix ending in '.'")
    obj = _read_source(src)
    if key is not None:
        state_dict, _ = find_state_dict(obj, key)  # CheckpointError naming the keys there
        obj = state_dict
    if strip != "none":
        obj = _unwrapped(obj)
    if strip not in ("auto", "none"):
        if not any(k.startswith(strip) for sd in _state_dicts_in(obj) for k in sd):
            keys = [k for sd in _state_dicts_in(obj) for k in sd]
            raise ValueError(
                f"--strip {strip!r} matches no key; the keys' leading prefixes are "
                f"{_leading_prefixes(keys, 6) or 'none'}"
            )
        obj = _strip_leading_prefix(obj, strip)
    tensors = list(_iter_tensors(obj))
    progress = _Progress(sum(map(_nbytes, tensors)), stream, show)
    summary: Dict[str, Any] = {"format": fmt, "tensors": len(tensors), "dropped": []}
    if fmt == "dcp":
        if not isinstance(obj, Mapping):
            raise CheckpointError(
                f"--to dcp needs a dict checkpoint; {src!r} holds a {type(obj).__name__}"
            )
        _check_output_bytes(src, list(_named_tensors(obj)), tensors, max_bytes, "dcp")
        layouts.save_dcp(obj, dst)
        progress.advance(progress.total, "written")
    elif fmt == "safetensors":
        try:
            import safetensors.torch as st_torch
        except ImportError:
            raise CheckpointError(
                "--to safetensors needs the safetensors package: "
                "pip install 'safetorch[safetensors]'"
            ) from None
        state_dict, _ = find_state_dict(obj, key)
        written = [(str(k), v) for k, v in state_dict.items() if isinstance(v, torch.Tensor)]
        _check_output_bytes(src, written, tensors, max_bytes, "safetensors")
        flat, dropped = _for_safetensors(state_dict)
        summary["dropped"] = dropped
        summary["tensors"] = len(flat)
        if max_shard_size is not None:
            summary.update(
                layouts.save_sharded_safetensors(flat, dst, layouts.parse_size(max_shard_size))
            )
        else:
            atomic_write(dst, lambda tmp: st_torch.save_file(flat, tmp))
        progress.advance(progress.total, "written")
    else:

        def write(tmp: str) -> None:
            with open(tmp, "wb") as fh, _torch_internals_quiet():
                torch.save(obj, _CountingWriter(fh, progress))  # type: ignore[arg-type]  # a file-like writer (write/flush), which torch.save accepts; its stub names IO[bytes]

        atomic_write(dst, write)
    progress.close()
    return summary


# What safetensors/DCP output may take beyond twice the source's storage bytes by default.
OUTPUT_SLACK_BYTES = 64 * 1024 * 1024


def _distinct_storage_bytes(tensors: List[torch.Tensor]) -> int:
    seen = set()
    total = 0
    for t in tensors:
        try:
            storage = _storage_of(t)
            ident = (storage.data_ptr(), storage.nbytes(), str(t.device))
        except (RuntimeError, NotImplementedError):
            total += _nbytes(t)
            continue
        if ident not in seen:  # tensors sharing a storage count once
            seen.add(ident)
            total += storage.nbytes()
    return total


def _check_output_bytes(
    src: str,
    written: List[Tuple[str, torch.Tensor]],
    source: List[torch.Tensor],
    max_bytes: Optional[int],
    fmt: str,
) -> None:
    """Refuse, before anything is materialised, an output whose contiguous tensor data would
    exceed ``max_bytes`` (default: 2x the source's storage bytes + 64 MiB)."""
    need = sum(_nbytes(t) for _, t in written)
    have = _distinct_storage_bytes(source)
    limit = max_bytes if max_bytes is not None else 2 * have + OUTPUT_SLACK_BYTES
    if need <= limit:
        return
    where, t = max(written, key=lambda kt: _nbytes(kt[1]) - _storage_bytes(kt[1]))
    rule = (
        f"--max-bytes {_human(max_bytes)}"
        if max_bytes is not None
        else f"the default limit, 2x the {_human(have)} of tensor storage in the source "
        f"+ {_human(OUTPUT_SLACK_BYTES)}"
    )
    raise CheckpointError(
        f"--to {fmt} would write {_human(need)} of contiguous tensor data from {src!r}, over "
        f"{rule}; the largest is {where!r} (shape {list(t.shape)}, stride {list(t.stride())}, "
        f"{_human(_nbytes(t))} contiguous from a {_human(_storage_bytes(t))} storage). The file "
        "holds expanded or shared views; pass --max-bytes SIZE (e.g. "
        f"--max-bytes {max(1, -(-need // 10**9))}GB) to write them anyway, or --to torch, which "
        "keeps views as they are"
    )


def _named_tensors(obj: Any, prefix: str = "", depth: int = 0) -> Iterator[Tuple[str, Any]]:
    """``(dotted key, tensor)`` for every tensor in ``obj`` (as :func:`_iter_tensors`)."""
    if isinstance(obj, torch.Tensor):
        yield prefix, obj
    elif depth > 20:
        return
    elif isinstance(obj, Mapping):
        for k, v in obj.items():
            yield from _named_tensors(v, f"{prefix}.{k}" if prefix else str(k), depth + 1)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from _named_tensors(v, f"{prefix}.{i}" if prefix else str(i), depth + 1)


def _size_of(path: str) -> int:
    if os.path.isdir(path):
        return sum(
            os.path.getsize(os.path.join(path, n))
            for n in os.listdir(path)
            if os.path.isfile(os.path.join(path, n))
        )
    return os.path.getsize(path) if os.path.exists(path) else 0


def _read_source(src: str) -> Any:
    """The whole checkpoint at ``src``: a file (st.load), a DCP directory, a shard index."""
    layout = layouts.resolve(src)
    if layout is None or isinstance(layout, layouts.FileLayout):
        return load(src if layout is None else layout.path)
    if isinstance(layout, layouts.DCPDirectory):
        return layouts.dcp_to_object(layout.path)
    view = layout.meta_view()
    out: Dict[str, Any] = {}
    layout.load_into(torch.nn.Module(), [(k, k) for k in view], lambda batch: out.update(batch))
    return {k: out[k] for k in view}


def _state_dicts_in(obj: Any) -> List[Mapping[str, Any]]:
    if is_state_dict(obj):
        return [obj]
    if isinstance(obj, Mapping):
        return [v for v in obj.values() if is_state_dict(v)]
    return []


def _strip_leading_prefix(obj: Any, prefix: str) -> Any:
    if is_state_dict(obj):
        out = collections.OrderedDict(
            (k[len(prefix) :] if k.startswith(prefix) else k, v) for k, v in obj.items()
        )
        if len(out) != len(obj):
            raise CheckpointError(f"stripping {prefix!r} makes keys collide")
        return out
    if isinstance(obj, Mapping):
        return {k: _strip_leading_prefix(v, prefix) for k, v in obj.items()}
    return obj


# --- inspect --keys ----------------------------------------------------------------------------
def _dtype_name(t: torch.Tensor) -> str:
    return str(t.dtype).replace("torch.", "")


def list_keys(path: str, pattern: str = "*") -> List[Dict[str, Any]]:
    """Every tensor entry of every state dict in a checkpoint: key, shape, dtype, bytes.

    Args:
        path: the checkpoint file (loaded weights-only).
        pattern: a glob (``fnmatch``) matched against the key and its canonical form
            (wrapper segments dropped), e.g. ``"*.bn1.*"``.

    Returns:
        One dict per entry, in file order: ``state_dict`` (container key, ``None`` for the top
        level), ``key``, ``canonical`` (the key without wrapper segments), ``wrappers`` (the
        wrapper segments in it), ``shape``, ``dtype`` and ``bytes`` (``None`` for non-tensors).

    Raises:
        CheckpointError: the file cannot be loaded.

    >>> import os, tempfile, torch
    >>> path = os.path.join(tempfile.mkdtemp(), "m.pt")
    >>> torch.save(torch.nn.DataParallel(torch.nn.Linear(2, 3)).state_dict(), path)
    >>> [(r["key"], r["shape"], r["dtype"], r["bytes"]) for r in list_keys(path, "*weight")]
    [('module.weight', [3, 2], 'float32', 24)]
    """
    obj = load(path)
    holders: List[Tuple[Optional[str], Mapping[str, Any]]]
    if is_state_dict(obj):
        holders = [(None, obj)]
    else:
        holders = [(k, _as_state_dict(obj[k])) for k in state_dict_keys(obj)]
    rows: List[Dict[str, Any]] = []
    for holder, sd in holders:
        for key, value in sd.items():
            canon = canonical_key(key)
            if not (fnmatch.fnmatchcase(key, pattern) or fnmatch.fnmatchcase(canon, pattern)):
                continue
            tensor = isinstance(value, torch.Tensor)
            rows.append(
                {
                    "state_dict": holder,
                    "key": key,
                    "canonical": canon,
                    "wrappers": [s + "." for s in _wrapper_segments_in([key])],
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


# --- diff --------------------------------------------------------------------------------------
def _pick_state_dict(obj: Any, key: Optional[str]) -> Mapping[str, Any]:
    state_dict, _ = find_state_dict(obj, key)
    return state_dict


def diff_checkpoints(
    a: str,
    b: str,
    *,
    key: Optional[str] = None,
    progress_stream: Optional[IO[str]] = None,
) -> Dict[str, Any]:
    """Compare the state dicts of two checkpoints, after wrapper normalisation.

    Keys are matched as :func:`safetorch.match_keys` matches them (``module.``,
    ``_orig_mod.`` ... anywhere, Lightning's ``model.``), so a DataParallel checkpoint and a
    plain one of the same weights are equal.

    Args:
        a: the first checkpoint file.
        b: the second checkpoint file.
        key: the container key of the state dict in both (default: the one
            ``st.load_state_dict`` would pick).
        progress_stream: where a progress bar goes (default stderr; drawn only on a TTY for
            checkpoints above 256 MB).

    Returns:
        A JSON-ready dict: ``only_in_a``, ``only_in_b``, ``shape_changed`` and
        ``dtype_changed`` (``[key, a, b]``), ``value_changed`` (``[key, max abs diff]``),
        ``equal`` (count), ``rule`` (how keys were matched) and ``identical``.

    Raises:
        CheckpointError: a file cannot be loaded or holds no (or several) state dicts.

    >>> import os, tempfile, torch
    >>> d = tempfile.mkdtemp(); net = torch.nn.Linear(2, 2)
    >>> with torch.no_grad():
    ...     _ = net.bias.zero_()
    >>> torch.save(torch.nn.DataParallel(net).state_dict(), os.path.join(d, "a.pt"))
    >>> with torch.no_grad():
    ...     _ = net.bias.fill_(0.5)
    >>> torch.save(net.state_dict(), os.path.join(d, "b.pt"))
    >>> r = diff_checkpoints(os.path.join(d, "a.pt"), os.path.join(d, "b.pt"))
    >>> r["value_changed"], r["equal"], r["only_in_a"]
    ([['bias', 0.5]], 1, [])
    """
    sd_a = _pick_state_dict(load(a), key)
    sd_b = _pick_state_dict(load(b), key)
    match = match_keys(
        sd_a.keys(),
        sd_b.keys(),
        source_shapes={k: _shape(v) for k, v in sd_a.items()},
        target_shapes={k: _shape(v) for k, v in sd_b.items()},
    )
    result: Dict[str, Any] = {
        "a": a,
        "b": b,
        "rule": match.rule,
        "only_in_a": list(match.unmatched_source),
        "only_in_b": list(match.unmatched_target),
        "shape_changed": [],
        "dtype_changed": [],
        "value_changed": [],
        "equal": 0,
    }
    stream = sys.stderr if progress_stream is None else progress_stream
    tensors = [v for v in sd_a.values() if isinstance(v, torch.Tensor)]
    total = sum(map(_nbytes, tensors))
    show = bool(getattr(stream, "isatty", lambda: False)()) and total > PROGRESS_MIN_BYTES
    progress = _Progress(total, stream, show)
    for ka, kb in match.mapping.items():
        va, vb = sd_a[ka], sd_b[kb]
        name = kb if ka == kb else f"{kb}"
        if not (isinstance(va, torch.Tensor) and isinstance(vb, torch.Tensor)):
            if _values_equal(va, vb):
                result["equal"] += 1
            else:
                result["value_changed"].append([name, None])
            continue
        progress.advance(_nbytes(va), "diff")
        if va.shape != vb.shape:
            result["shape_changed"].append([name, list(va.shape), list(vb.shape)])
            continue
        if va.dtype != vb.dtype:
            result["dtype_changed"].append([name, _dtype_name(va), _dtype_name(vb)])
        va, vb = _comparable(name, va, vb)
        diff = _max_abs_diff(va, vb)
        if diff is None:
            result["equal"] += 1
        else:
            result["value_changed"].append([name, diff])
    progress.close()
    result["identical"] = not any(
        result[k]
        for k in ("only_in_a", "only_in_b", "shape_changed", "dtype_changed", "value_changed")
    )
    return result


# A comparison may touch this many bytes beyond what the two tensors' storages hold (small
# expanded buffers compare as usual).
DIFF_SLACK_BYTES = 64 * 1024 * 1024


def _storage_bytes(t: torch.Tensor) -> int:
    try:
        return int(_storage_of(t).nbytes())
    except (RuntimeError, NotImplementedError):  # a tensor without storage (meta, sparse, ...)
        return _nbytes(t)


def _comparable(key: str, a: torch.Tensor, b: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """``a`` and ``b`` with the dimensions both broadcast (stride 0) narrowed to one element,
    which compares the same; a CheckpointError when what is left would still touch more bytes
    than their storages hold (an expanded or overlapping view: ``torch.zeros(1).expand(2**32)``
    is a 4-byte storage whose elementwise comparison would take 16 GB)."""
    if a.layout != torch.strided or b.layout != torch.strided:
        return a, b
    for d in range(a.dim()):
        if a.size(d) > 1 and a.stride(d) == 0 and b.stride(d) == 0:
            a, b = a.narrow(d, 0, 1), b.narrow(d, 0, 1)
    need = a.numel() * max(a.element_size(), b.element_size(), 8)  # compared in float64
    have = _storage_bytes(a) + _storage_bytes(b)
    if need > 8 * have + DIFF_SLACK_BYTES:
        which = a if _nbytes(a) > _storage_bytes(a) else b
        raise CheckpointError(
            f"cannot compare {key!r}: it is a view of shape {list(which.shape)} with stride "
            f"{list(which.stride())} over a storage of {_human(_storage_bytes(which))}; an "
            f"elementwise comparison would take {_human(need)} (views are compared only up to "
            f"8x their storage bytes + {_human(DIFF_SLACK_BYTES)}); the checkpoint holds an "
            "expanded or overlapping tensor"
        )
    return a, b


def _shape(value: Any) -> Optional[Tuple[int, ...]]:
    return tuple(value.shape) if isinstance(value, torch.Tensor) else None


def _values_equal(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:  # objects without a truthful ==: treat as changed
        return False


def _max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> Optional[float]:
    """None when equal (NaNs in the same places count as equal), else the max abs diff."""
    if a.dtype == b.dtype and torch.equal(a, b):
        return None
    if a.is_complex() or b.is_complex():
        da, db = a.to(torch.complex128), b.to(torch.complex128)
    elif a.dtype == torch.bool and b.dtype == torch.bool:
        return float((a != b).sum().item() > 0)
    else:
        da, db = a.to(torch.float64), b.to(torch.float64)
    both_nan = torch.isnan(da) & torch.isnan(db)
    delta = (da - db).abs().masked_fill(both_nan, 0)
    if delta.numel() == 0:
        return None
    m = delta.max().item()
    if m != m:  # NaN on one side only
        return float("nan")
    return None if m == 0 else float(m)


def _print_diff(r: Dict[str, Any], out: IO[str]) -> None:
    out.write(f"a: {r['a']}\nb: {r['b']}\n")
    if r["rule"] != "exact":
        out.write(f"keys matched: {r['rule']}\n")
    for label, name in (("only in a", "only_in_a"), ("only in b", "only_in_b")):
        if r[name]:
            out.write(f"{label} ({len(r[name])}): {', '.join(r[name])}\n")
    for key, sa, sb in r["shape_changed"]:
        out.write(f"shape changed: {key} {sa} -> {sb}\n")
    for key, da, db in r["dtype_changed"]:
        out.write(f"dtype changed: {key} {da} -> {db}\n")
    for key, diff in r["value_changed"]:
        out.write(f"values differ: {key}" + (f" (max abs diff {diff:.6g})" if diff else "") + "\n")
    changed = len(r["value_changed"]) + len(r["shape_changed"])
    out.write(
        f"{'identical' if r['identical'] else 'different'}: {r['equal']} equal, "
        f"{changed} changed, {len(r['only_in_a'])} only in a, {len(r['only_in_b'])} only in b\n"
    )


# --- fit ---------------------------------------------------------------------------------------
def _is_cwd_entry(entry: Any, cwd: str) -> bool:
    if not isinstance(entry, str):
        return False
    if entry in ("", "."):
        return True
    try:
        return os.path.realpath(entry) == cwd
    except (OSError, ValueError):
        return False


@contextlib.contextmanager
def _cwd_searched_last() -> Iterator[None]:
    """While the user's ``--model`` module is imported, the working directory is searched after
    every installed package, never before: a ``safetensors.py``, ``torch.py`` or ``numpy.py``
    shipped in a downloaded checkpoint directory cannot shadow the real package when ``fit`` is
    run there, while the user's own module (and its siblings) in that directory are still found.
    Entries the import adds to ``sys.path`` are kept; the interpreter's own are restored."""
    cwd = os.path.realpath(os.getcwd())
    saved = list(sys.path)
    sys.path[:] = [p for p in saved if not _is_cwd_entry(p, cwd)] + [cwd]
    try:
        yield
    finally:
        before = set(saved)
        sys.path[:] = [p for p in sys.path if p not in before and p != cwd] + saved


def _model_from(spec: str) -> torch.nn.Module:
    """The model ``module:factory`` names (a callable is called without arguments)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(
            f"--model {spec!r}: expected MODULE:FACTORY, e.g. torchvision.models:resnet18 or "
            "mypkg.model:build (a callable without required arguments, or an nn.Module)"
        )
    with _cwd_searched_last():  # the factory may import its siblings lazily: keep it around
        return _build_model(spec, module_name, attr)


def _build_model(spec: str, module_name: str, attr: str) -> torch.nn.Module:
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"--model {spec!r}: cannot import {module_name!r} ({exc})") from None
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"--model {spec!r}: {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if isinstance(obj, torch.nn.Module):
        return obj
    if not callable(obj):
        raise ValueError(f"--model {spec!r}: {attr!r} is a {type(obj).__name__}, not a factory")
    model = obj()
    if not isinstance(model, torch.nn.Module):
        raise ValueError(
            f"--model {spec!r}: {attr}() returned a {type(model).__name__}, not an nn.Module"
        )
    return model


def fit_checkpoint(
    path: str, model: torch.nn.Module, *, key: Optional[str] = None, prefix: Optional[str] = None
) -> Any:
    """What ``st.load_state_dict(model, path)`` would do, without loading into ``model``.

    The load runs with ``strict=False`` into a copy of ``model`` on the ``meta`` device (no
    memory for its weights, and ``model`` is untouched), through the very function a real
    load uses; ``report.ok`` says whether a strict load would succeed.

    Args:
        path: the checkpoint file.
        model: the model the checkpoint is meant for.
        key: the container key of the state dict (as for ``st.load_state_dict``).
        prefix: take a sub-module's keys (as for ``st.load_state_dict``, where supported).

    Returns:
        The :class:`~safetorch.LoadReport`.

    Raises:
        CheckpointError: the file cannot be loaded, holds no (or several) state dicts, or the
            key mapping is ambiguous.
        TypeError: ``model`` is not an ``nn.Module``.

    >>> import os, tempfile, torch
    >>> path = os.path.join(tempfile.mkdtemp(), "m.pt")
    >>> torch.save(torch.nn.DataParallel(torch.nn.Linear(2, 2)).state_dict(), path)
    >>> report = fit_checkpoint(path, torch.nn.Linear(2, 3))
    >>> report.ok, report.mismatched[0]
    (False, ('weight', (2, 2), (3, 2)))
    """
    from safetorch.checkpoint import model_state as _io

    if not isinstance(model, torch.nn.Module):
        raise TypeError(
            f"fit_checkpoint(model=...) expects an nn.Module, got {type(model).__name__}"
        )
    import copy

    shadow = copy.deepcopy(model).to("meta")
    kwargs: Dict[str, Any] = {"strict": False, "key": key}
    if prefix is not None:
        if "prefix" not in _inspect.signature(_io.load_state_dict).parameters:
            raise ValueError("--prefix needs st.load_state_dict(prefix=), not in this build")
        kwargs["prefix"] = prefix
    with warnings.catch_warnings():
        # torch says each copy into a meta parameter is a no-op: that is the point here.
        warnings.filterwarnings("ignore", message=".*copying from a non-meta parameter")
        return _io.load_state_dict(shadow, load(path), **kwargs)


def _report_json(report: Any) -> Dict[str, Any]:
    return {
        "ok": report.ok,
        "rule": report.rule,
        "source_key": report.source_key,
        "loaded": report.loaded,
        "missing": report.missing,
        "unexpected": report.unexpected,
        "mismatched": [[k, list(a), list(b)] for k, a, b in report.mismatched],
        "n_averaged": report.n_averaged,
        "hint": getattr(report, "hint", None),
        "other_state_dicts": getattr(report, "other_state_dicts", []),
    }


# --- commands ----------------------------------------------------------------------------------
class _BadInput(Exception):
    """An expected failure: one line on stderr and this exit status."""

    def __init__(self, message: str, status: int = 2) -> None:
        super().__init__(message)
        self.status = status


def _readable_file(path: str, what: str = "checkpoint") -> None:
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _BadInput(f"{path!r} is a symlink loop; pass the path of a {what} file") from None
        mode = None
    if mode is not None and not stat.S_ISREG(mode) and not stat.S_ISDIR(mode):
        raise _BadInput(
            f"{path!r} is {reader.file_kind(mode)}, not a regular file; a {what} is read only from a "
            "regular file (copy it to one first)"
        )
    if not os.path.exists(path):
        parent = os.path.dirname(os.path.abspath(path))
        where = "" if os.path.isdir(parent) else f" (directory {parent} does not exist either)"
        raise _BadInput(f"no such file: {path!r}{where}; pass the path of a {what} file")
    if os.path.isdir(path):
        raise _BadInput(
            f"{path!r} is a directory; pass a {what} file inside it "
            "(e.g. .../model.pt; a torch.distributed.checkpoint directory loads with DCP)"
        )
    if not os.access(path, os.R_OK):
        raise _BadInput(f"cannot read {path!r}: permission denied")


def _writable_target(path: str) -> None:
    if os.path.isdir(path):
        raise _BadInput(
            f"OUT {path!r} is a directory; pass a file path, e.g. {os.path.join(path, 'model.pt')}"
        )
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise _BadInput(
            f"cannot write {path!r}: directory {parent} does not exist; create it first"
        )


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= 2000 else text[:2000] + " ..."


def _dcp_exception() -> Tuple[Type[BaseException], ...]:
    """torch.distributed.checkpoint's CheckpointException: a BaseException, not an Exception
    (imported lazily: it is absent from builds without torch.distributed)."""
    try:
        from torch.distributed.checkpoint.api import CheckpointException
    except Exception:  # no torch.distributed, or an old torch without the module
        return ()
    return (CheckpointException,)


def _dcp_failures(exc: BaseException) -> str:
    """A CheckpointException's per-rank causes, without the tracebacks its str() holds."""
    failures = getattr(exc, "failures", None)
    if not isinstance(failures, Mapping) or not failures:
        return _one_line(exc).split(" Traceback ")[0]
    parts = []
    for rank, failure in list(failures.items())[:4]:
        cause = failure[0] if isinstance(failure, tuple) and failure else failure
        parts.append(f"rank {rank}: {type(cause).__name__}: {_one_line(cause)}")
    more = f" (and {len(failures) - 4} more ranks)" if len(failures) > 4 else ""
    return "; ".join(parts) + more


def _guarded(command: str, body: Callable[[argparse.Namespace], int]) -> Callable[..., int]:
    """Run a command; every failure ends in one line on stderr (never a traceback): exit 2 for
    bad input, 1 for failed work, 130 when interrupted."""

    def say(text: str) -> None:
        sys.stderr.write(f"safetorch ckpt {command}: {text}\n")

    def run(args: argparse.Namespace) -> int:
        dcp_errors = _dcp_exception()
        try:
            return body(args)
        except _BadInput as exc:
            say(str(exc))
            return exc.status
        except UnsafeCheckpointError as exc:
            say(str(exc).splitlines()[0])
            return 1
        except (CheckpointError, ValueError) as exc:
            say(_one_line(exc))
            return 2
        except BrokenPipeError:
            raise  # `safetorch ckpt inspect ... | head`: the top-level command ends quietly
        except KeyboardInterrupt:
            say("interrupted")
            return 130
        except RecursionError:
            say("the checkpoint nests too deeply to be processed (RecursionError); it is malformed")
            return 2
        except MemoryError:
            say("out of memory (the checkpoint asks for more memory than this machine has)")
            return 1
        except OSError as exc:  # e.g. disk full while writing
            say(_one_line(exc))
            return 1
        except dcp_errors as exc:  # a BaseException: not caught by `except Exception`
            say(f"torch.distributed.checkpoint failed: {_dcp_failures(exc)}")
            return 2
        except Exception as exc:  # anything else: still one line, with what it was
            say(f"failed with {type(exc).__name__}: {_one_line(exc)}")
            return 1

    return run


def _is_layout(path: str) -> bool:
    return os.path.isdir(path) or path.endswith(".index.json")


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


def _cmd_inspect(args: argparse.Namespace) -> int:
    if _is_layout(args.path) and os.path.exists(args.path) and args.keys is None:
        info = layouts.describe(args.path)
        if info["layout"] == "file":  # a directory with one torch.save file: describe it too
            picked = os.path.join(
                args.path, next(f["file"] for f in info["files"] if "model" in f["role"])
            )
            info["checkpoint"] = inspect_checkpoint(picked)
        if args.json:
            sys.stdout.write(json.dumps(info, indent=2) + "\n")
        else:
            _print_layout(info, sys.stdout)
            if "checkpoint" in info:
                _print_info(info["checkpoint"], sys.stdout)
        return 1 if info.get("checkpoint", {}).get("unsafe_globals") else 0
    _readable_file(args.path)
    if args.keys is not None:
        info = inspect_checkpoint(args.path)  # refuses unsafe files before loading them
        if info["unsafe_globals"]:
            if args.json:
                sys.stdout.write(json.dumps(info, indent=2) + "\n")
            else:
                _print_info(info, sys.stdout)
            return 1
        rows = list_keys(args.path, args.keys)
        if args.json:
            sys.stdout.write(json.dumps(rows, indent=2) + "\n")
        else:
            _print_keys(rows, sys.stdout)
        return 0
    info = inspect_checkpoint(args.path)
    if args.json:
        sys.stdout.write(json.dumps(info, indent=2) + "\n")
    else:
        _print_info(info, sys.stdout)
    return 1 if info["unsafe_globals"] else 0


def _cmd_convert(args: argparse.Namespace) -> int:
    if not (_is_layout(args.src) and os.path.exists(args.src)):
        _readable_file(args.src)
    if os.path.abspath(args.src) == os.path.abspath(args.dst):
        raise _BadInput(f"IN and OUT are the same path ({args.src!r}); write to a new path")
    if args.to == "dcp" or args.max_shard_size is not None:  # OUT is a directory
        if os.path.exists(args.dst) and (not os.path.isdir(args.dst) or os.listdir(args.dst)):
            raise _BadInput(
                f"OUT {args.dst!r} exists; a {'DCP' if args.to == 'dcp' else 'shard'} directory "
                "is written to a new path"
            )
        parent = os.path.dirname(os.path.abspath(args.dst))
        if not os.path.isdir(parent):
            raise _BadInput(f"cannot write {args.dst!r}: directory {parent} does not exist")
    else:
        _writable_target(args.dst)
    summary = convert_checkpoint(
        args.src,
        args.dst,
        strip=args.strip,
        to=args.to,
        key=args.key,
        max_shard_size=args.max_shard_size,
        max_bytes=None if args.max_bytes is None else layouts.parse_size(args.max_bytes),
    )
    if args.json:
        sys.stdout.write(json.dumps({"path": args.dst, **summary}, indent=2) + "\n")
        return 0
    line = f"wrote {args.dst} ({summary['format']}, {summary['tensors']} tensors)"
    if summary["dropped"]:
        line += f"; dropped non-tensor entries: {', '.join(summary['dropped'])}"
    sys.stdout.write(line + "\n")
    return 0


def _cmd_diff(args: argparse.Namespace) -> int:
    _readable_file(args.a)
    _readable_file(args.b)
    result = diff_checkpoints(args.a, args.b, key=args.key)
    if args.json:
        sys.stdout.write(json.dumps(result, indent=2) + "\n")
    else:
        _print_diff(result, sys.stdout)
    return 0 if result["identical"] else 1


def _cmd_fit(args: argparse.Namespace) -> int:
    _readable_file(args.path)
    try:
        model = _model_from(args.model)
    except ValueError:
        raise
    except Exception as exc:  # the user's factory failed: their error, in one line
        raise _BadInput(
            f"--model {args.model!r}: building the model raised {type(exc).__name__}: {exc}"
        ) from None
    report = fit_checkpoint(args.path, model, key=args.key, prefix=args.prefix)
    if args.json:
        sys.stdout.write(json.dumps(_report_json(report), indent=2) + "\n")
    else:
        sys.stdout.write(f"{report}\n")
        verdict = (
            "fits: st.load_state_dict(model, path) loads every key"
            if report.ok
            else (
                "does not fit: a strict st.load_state_dict would refuse; strict=False would load "
                f"{len(report.loaded)} keys"
            )
        )
        sys.stdout.write(verdict + "\n")
    return 0 if report.ok else 1


def _cmd_verify(args: argparse.Namespace) -> int:
    from safetorch.checkpoint.verify import verify_checkpoint

    if not os.path.isdir(args.path):
        _readable_file(args.path)
    report = verify_checkpoint(args.path)
    if report.format == "directory" and not report.files:
        raise _BadInput(f"{args.path!r}: {report.problems[0]}; pass a checkpoint file or directory")
    if args.json:
        sys.stdout.write(json.dumps(report.to_json(), indent=2) + "\n")
    else:
        for problem in report.problems:
            sys.stdout.write(f"{args.path}: {problem}\n")
        sys.stdout.write(report.summary() + "\n")
    return 0 if report.ok else 1


def add_parsers(subparsers: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    """Register ``safetorch ckpt inspect|convert|diff|verify|fit``."""
    ckpt = subparsers.add_parser(
        "ckpt", help="inspect, convert, diff, fit or verify checkpoints (weights-only)"
    )
    sub = ckpt.add_subparsers(dest="ckpt_command", metavar="ACTION")

    def _usage(_args: argparse.Namespace) -> int:
        ckpt.print_help(sys.stderr)
        return 2

    ckpt.set_defaults(func=_usage)

    inspect = sub.add_parser(
        "inspect",
        help="container keys, state dicts, tensors, dtypes, prefixes, unsafe globals; a "
        "directory or shard index file by file",
    )
    inspect.add_argument("path")
    inspect.add_argument(
        "--keys",
        nargs="?",
        const="*",
        default=None,
        metavar="GLOB",
        help="list every entry (key, shape, dtype, bytes), optionally only keys matching GLOB",
    )
    inspect.add_argument("--json", action="store_true", help="machine-readable output")
    inspect.set_defaults(func=_guarded("inspect", _cmd_inspect))

    convert = sub.add_parser(
        "convert",
        help="rewrite atomically: strip wrapper prefixes; torch, safetensors (shards), DCP",
    )
    convert.add_argument("src", metavar="IN")
    convert.add_argument("dst", metavar="OUT")
    convert.add_argument(
        "--strip",
        default="auto",
        help="'auto' (wrapper segments such as module., _orig_mod.), 'none', or a leading "
        "prefix ending in '.' (e.g. model.)",
    )
    convert.add_argument(
        "--to",
        choices=("torch", "safetensors", "dcp"),
        default=None,
        help="output format (default from OUT's extension); dcp writes a DCP directory",
    )
    convert.add_argument(
        "--max-shard-size",
        default=None,
        metavar="SIZE",
        help="with --to safetensors: shards of at most SIZE (e.g. 5GB) in the directory OUT, "
        "with model.safetensors.index.json",
    )
    convert.add_argument(
        "--max-bytes",
        default=None,
        metavar="SIZE",
        help="with --to safetensors/dcp: the most tensor data to write (views are written in "
        "full); default 2x the source's storage bytes + 64 MiB",
    )
    convert.add_argument(
        "--key", default=None, help="container key of the state dict to write (only that one)"
    )
    convert.add_argument("--json", action="store_true", help="machine-readable summary")
    convert.set_defaults(func=_guarded("convert", _cmd_convert))

    diff = sub.add_parser(
        "diff", help="keys only in one, shape/dtype changes, value differences (max abs diff)"
    )
    diff.add_argument("a", metavar="A")
    diff.add_argument("b", metavar="B")
    diff.add_argument("--key", default=None, help="container key of the state dict in both")
    diff.add_argument("--json", action="store_true", help="machine-readable output")
    diff.set_defaults(func=_guarded("diff", _cmd_diff))

    verify = sub.add_parser(
        "verify",
        help="integrity torch does not check: every zip record's CRC-32, safetensors offsets; "
        "a directory or shard index file by file (exit 1 on a problem)",
    )
    verify.add_argument("path")
    verify.add_argument("--json", action="store_true", help="machine-readable output")
    verify.set_defaults(func=_guarded("verify", _cmd_verify))

    fit = sub.add_parser(
        "fit", help="what st.load_state_dict would do with a model, without loading it"
    )
    fit.add_argument("path")
    fit.add_argument(
        "--model",
        required=True,
        metavar="MODULE:FACTORY",
        help="the model: an importable factory called without arguments, or a module instance",
    )
    fit.add_argument("--key", default=None, help="container key of the state dict")
    fit.add_argument(
        "--prefix", default=None, help="take the keys under this module path (e.g. features.)"
    )
    fit.add_argument("--json", action="store_true", help="machine-readable output")
    fit.set_defaults(func=_guarded("fit", _cmd_fit))
