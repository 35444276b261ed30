"""``safetorch ckpt inspect|convert``: look inside a checkpoint, or rewrite it, safely."""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
from typing import IO, Any, Callable, Dict, Iterator, List, Mapping, Optional, Tuple

import torch

from safetorch import _compat
from safetorch.checkpoint import _unpickler
from safetorch.checkpoint.io import (
    _ZIP_MAGIC,
    _torch_internals_quiet,
    _unwrapped,
    atomic_write,
    load,
)
from safetorch.checkpoint.keys import _wrapper_segments_in, find_state_dict, is_state_dict
from safetorch.errors import CheckpointError

__all__ = ["add_parsers", "inspect_checkpoint", "convert_checkpoint"]

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
    with open(path, "rb") as fh:
        head = fh.read(9)
    if path.endswith(".safetensors") or (len(head) == 9 and head[8:9] == b"{"):
        return "safetensors"
    return "zip" if head.startswith(_ZIP_MAGIC) else "legacy"


def inspect_checkpoint(path: str) -> Dict[str, Any]:
    """Describe a checkpoint without executing anything outside the weights-only allow-list.

    Args:
        path: the checkpoint file.

    Returns:
        A JSON-ready dict: format, size, container keys, state-dict key, tensor count, total
        bytes, dtypes, wrapper prefixes and unsafe globals (when there are any, nothing is
        loaded and only those are reported).

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
    try:
        state_dict, key = find_state_dict(obj)
        info["state_dict_key"] = key
        info["state_dict_tensors"] = len(state_dict)
        info["wrapper_prefixes"] = [s + "." for s in _wrapper_segments_in(state_dict)]
    except CheckpointError as exc:
        info["state_dict_key"] = None
        info["state_dict_note"] = str(exc)
        info["wrapper_prefixes"] = []
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
            f"({info.get('state_dict_tensors', 0)} entries)\n"
        )
    elif info.get("state_dict_note"):
        out.write(f"state dict: {info['state_dict_note']}\n")
    out.write(f"tensors: {info['tensor_count']}, {_human(info['tensor_bytes'])}\n")
    out.write(
        "dtypes: " + (", ".join(f"{k} ({v})" for k, v in info["dtypes"].items()) or "-") + "\n"
    )
    out.write("wrapper prefixes: " + (", ".join(info["wrapper_prefixes"]) or "none") + "\n")
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
) -> Dict[str, Any]:
    """Rewrite a checkpoint atomically, stripping wrapper prefixes and/or as safetensors.

    Args:
        src: input checkpoint (loaded weights-only).
        dst: output path, replaced atomically.
        strip: ``"auto"`` drops wrapper segments (``module.``, ``_orig_mod.``, ...) from every
            state dict; ``"none"`` keeps keys; any other value ending in ``.`` is also stripped
            as a leading prefix (e.g. ``"model."``).
        to: ``"torch"`` or ``"safetensors"``; default from ``dst``'s extension.
        key: container key of the state dict (safetensors output only).
        progress_stream: where a progress bar goes (default stderr); drawn only if it is a TTY
            and ``src`` is larger than 256 MB.

    Returns:
        A summary dict (``format``, ``tensors``, ``dropped`` non-tensor keys).

    >>> import os, tempfile, torch, safetorch as st
    >>> d = tempfile.mkdtemp(); src = os.path.join(d, "dp.pt"); dst = os.path.join(d, "plain.pt")
    >>> torch.save(torch.nn.DataParallel(torch.nn.Linear(2, 2)).state_dict(), src)
    >>> _ = convert_checkpoint(src, dst)
    >>> sorted(st.load(dst))
    ['bias', 'weight']
    """
    stream = sys.stderr if progress_stream is None else progress_stream
    size = os.path.getsize(src) if os.path.exists(src) else 0
    show = bool(getattr(stream, "isatty", lambda: False)()) and size > PROGRESS_MIN_BYTES
    fmt = to or ("safetensors" if dst.endswith(".safetensors") else "torch")
    if fmt not in ("torch", "safetensors"):
        raise ValueError(f"--to {fmt!r}; expected 'torch' or 'safetensors'")
    if strip != "auto" and strip != "none" and not strip.endswith("."):
        raise ValueError(f"--strip {strip!r}; expected 'auto', 'none' or a prefix ending in '.'")
    obj = load(src)
    if strip != "none":
        obj = _unwrapped(obj)
    if strip not in ("auto", "none"):
        obj = _strip_leading_prefix(obj, strip)
    tensors = list(_iter_tensors(obj))
    progress = _Progress(sum(map(_nbytes, tensors)), stream, show)
    summary: Dict[str, Any] = {"format": fmt, "tensors": len(tensors), "dropped": []}
    if fmt == "safetensors":
        try:
            import safetensors.torch as st_torch
        except ImportError:
            raise CheckpointError(
                "--to safetensors needs the safetensors package: "
                "pip install 'safetorch[safetensors]'"
            ) from None
        state_dict, _ = find_state_dict(obj, key)
        flat, dropped = _for_safetensors(state_dict)
        summary["dropped"] = dropped
        summary["tensors"] = len(flat)
        atomic_write(dst, lambda tmp: st_torch.save_file(flat, tmp))
        progress.advance(progress.total, "written")
    else:

        def write(tmp: str) -> None:
            with open(tmp, "wb") as fh, _torch_internals_quiet():
                torch.save(obj, _CountingWriter(fh, progress))  # type: ignore[arg-type]

        atomic_write(dst, write)
    progress.close()
    return summary


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


def _cmd_inspect(args: argparse.Namespace) -> int:
    try:
        info = inspect_checkpoint(args.path)
    except CheckpointError as exc:
        sys.stderr.write(f"safetorch ckpt inspect: {exc}\n")
        return 2
    if args.json:
        sys.stdout.write(json.dumps(info, indent=2) + "\n")
    else:
        _print_info(info, sys.stdout)
    return 1 if info["unsafe_globals"] else 0


def _cmd_convert(args: argparse.Namespace) -> int:
    try:
        summary = convert_checkpoint(args.src, args.dst, strip=args.strip, to=args.to, key=args.key)
    except (CheckpointError, ValueError) as exc:
        sys.stderr.write(f"safetorch ckpt convert: {exc}\n")
        return 2
    line = f"wrote {args.dst} ({summary['format']}, {summary['tensors']} tensors)"
    if summary["dropped"]:
        line += f"; dropped non-tensor entries: {', '.join(summary['dropped'])}"
    sys.stdout.write(line + "\n")
    return 0


def add_parsers(subparsers: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    """Register ``safetorch ckpt inspect`` and ``safetorch ckpt convert``."""
    ckpt = subparsers.add_parser("ckpt", help="inspect or convert checkpoints (weights-only)")
    sub = ckpt.add_subparsers(dest="ckpt_command", metavar="ACTION")

    def _usage(_args: argparse.Namespace) -> int:
        ckpt.print_help(sys.stderr)
        return 2

    ckpt.set_defaults(func=_usage)

    inspect = sub.add_parser(
        "inspect", help="container keys, tensors, dtypes, prefixes, unsafe globals"
    )
    inspect.add_argument("path")
    inspect.add_argument("--json", action="store_true", help="machine-readable output")
    inspect.set_defaults(func=_cmd_inspect)

    convert = sub.add_parser("convert", help="rewrite atomically, stripping wrapper prefixes")
    convert.add_argument("src", metavar="IN")
    convert.add_argument("dst", metavar="OUT")
    convert.add_argument(
        "--strip",
        default="auto",
        help="'auto' (wrapper segments such as module., _orig_mod.), 'none', or a leading "
        "prefix ending in '.' (e.g. model.)",
    )
    convert.add_argument("--to", choices=("torch", "safetensors"), default=None)
    convert.add_argument("--key", default=None, help="container key of the state dict")
    convert.set_defaults(func=_cmd_convert)
