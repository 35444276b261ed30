"""``safetorch ckpt convert``: rewrite a checkpoint atomically (torch, safetensors, shards, DCP)."""

from __future__ import annotations

import argparse
import collections
import json
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

from safetorch._atomic import atomic_write, atomic_write_dir
from safetorch._cli import paint
from safetorch._nest import iter_named_tensors, iter_tensors
from safetorch._text import escape, escape_all
from safetorch.checkpoint import _bytes, _cli_source, _conversions, _reader
from safetorch.checkpoint._cli_progress import (
    _bytes_under,
    _CountingWriter,
    _human,
    _make_progress,
    _Progress,
    _watching,
)
from safetorch.checkpoint._cli_source import (
    _BadInput,
    _carried_keys,
    _nbytes,
    _read_source,
    _readable_source,
    _size_of,
    _storage_bytes,
    _writable_target,
    allow_list,
    model_view,
    write_json,
)
from safetorch.checkpoint.keys import (
    _leading_prefixes,
    find_state_dict,
    is_state_dict,
)
from safetorch.checkpoint.loading import _torch_internals_quiet
from safetorch.checkpoint.saving import _unwrapped
from safetorch.errors import CheckpointError


def _for_safetensors(state_dict: Mapping[str, Any]) -> Tuple[Dict[str, torch.Tensor], List[str]]:
    """Contiguous tensors, shared storages cloned (safetensors refuses aliasing)."""
    out: Dict[str, torch.Tensor] = {}
    dropped: List[str] = []
    seen = set()
    for k, v in state_dict.items():
        if not isinstance(v, torch.Tensor):
            dropped.append(k)
            continue
        ptr = (_cli_source._storage_of(v).data_ptr(), v.device) if v.numel() else None
        if ptr is not None and ptr in seen:
            v = v.clone()
        elif ptr is not None:
            seen.add(ptr)
        out[k] = v.contiguous()
    return out, dropped


# A tensor is written in pieces of this size, so the progress bar moves within large ones.
_WRITE_CHUNK = 16 * 1024 * 1024


def _write_safetensors(
    tensors: Mapping[str, torch.Tensor], fh: IO[bytes], progress: _Progress
) -> None:
    """Stream ``tensors`` (contiguous, unaliased: :func:`_for_safetensors`) to ``fh`` in the
    safetensors format: an 8-byte little-endian header length, the JSON header (padded with
    spaces to 8 bytes, ``__metadata__`` ``{"format": "pt"}`` as ``safetensors.torch`` writes
    it), then each tensor's bytes in header order; the safetensors library reads it back. Unlike ``safetensors.torch.save_file``, no second copy of
    every tensor is held in memory, and ``progress`` moves as the bytes are written."""
    header: Dict[str, Any] = {}
    offset = 0
    for key, t in tensors.items():
        code = _reader.safetensors_codes().get(t.dtype)
        if code is None or t.layout != torch.strided:
            raise CheckpointError(
                f"--to safetensors: {key!r} is a {t.dtype} tensor ({t.layout}), which a "
                "safetensors file cannot hold; write it with --to torch"
            )
        n = _nbytes(t)
        header[key] = {"dtype": code, "shape": list(t.shape), "data_offsets": [offset, offset + n]}
        offset += n
    header["__metadata__"] = {"format": "pt"}
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    fh.write(len(text).to_bytes(8, "little"))
    fh.write(text)
    for t in tensors.values():
        data = _bytes.writable_view(t.detach().cpu().contiguous())
        for start in range(0, len(data), _WRITE_CHUNK):
            piece = data[start : start + _WRITE_CHUNK]
            fh.write(piece)
            progress.advance(len(piece))


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
    allow: Iterable[str] = (),
    show_progress: bool = True,
) -> Dict[str, Any]:
    """Rewrite a checkpoint atomically: strip wrapper prefixes, change format or layout.

    The source is any layout :func:`read_source` reads (a torch.save or ``.safetensors`` file,
    a ``st.save_state`` file, a ``CheckpointSaver`` directory, a DCP directory, a shard index or
    library directory); the output is one torch file, one ``.safetensors`` file, a directory of
    safetensors shards with ``model.safetensors.index.json`` (``max_shard_size``), or a DCP
    directory (``to="dcp"``). ``torch`` and ``dcp`` output keep the whole checkpoint (a
    ``save_state`` file stays one); safetensors holds the tensors of one state dict, and what
    it leaves behind is listed in ``dropped``.

    Args:
        src: input checkpoint (loaded weights-only).
        dst: output path, replaced atomically.
        strip: ``"auto"`` drops wrapper segments (``module.``, ``_orig_mod.``, ...) from every
            state dict; ``"none"`` keeps keys; any other value ending in ``.`` is also stripped
            as a leading prefix (e.g. ``"model."``).
        to: ``"torch"``, ``"safetensors"`` or ``"dcp"``; default ``"safetensors"`` when
            ``dst`` ends in ``.safetensors`` or ``max_shard_size`` is given, else ``"torch"``.
        key: container key (object name in a ``save_state`` file) of the state dict to write
            (only that state dict is written); needed for safetensors output when the
            container holds several.
        progress_stream: where a progress bar goes (default stderr); drawn only if it is a TTY
            and ``src`` is larger than 256 MiB, while reading and while writing.
        show_progress: ``False`` never draws it (``--no-progress``).
        max_shard_size: safetensors output (implied; ``to="torch"``/``"dcp"`` refuse it): write shards of at most this size
            (``"5GB"``, ``"500MB"``) into the directory ``dst``, plus the index.
        max_bytes: safetensors and DCP store every tensor contiguously, so an expanded or
            overlapping view (``torch.zeros(1).expand(2**32)``: a 4-byte storage) or a storage
            shared by many entries is written out in full. The tensor data written may take at
            most this many bytes; by default twice the bytes of the source's tensor storages
            plus 64 MiB (so tied weights convert, and a small file cannot ask for gigabytes).
            ``torch`` output keeps views as they are and needs no limit.
        allow: globals allowed as for ``st.load(allow=)`` (``--allow``).

    Returns:
        A summary dict: ``format``, ``tensors``, ``key`` (the state dict written, for
        safetensors or ``key=``) and ``dropped``: what the output does not carry over (container
        keys such as ``optimizer`` or ``epoch``, a ``save_state`` file's ``rng``, and non-tensor
        state-dict entries as ``<key>.<entry>``).

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
    >>> summary = convert_checkpoint(src, os.path.join(d, "m.pt"), key=None)
    >>> summary["dropped"]
    []
    """
    sharded = max_shard_size is not None
    fmt = to or ("safetensors" if sharded or dst.endswith(".safetensors") else "torch")
    if fmt not in ("torch", "safetensors", "dcp"):
        raise ValueError(f"--to {fmt!r}; expected 'torch', 'safetensors' or 'dcp'")
    if max_shard_size is not None and fmt != "safetensors":
        raise ValueError(
            f"--max-shard-size with --to {fmt}: shards are safetensors files; drop --to {fmt} "
            "(or pass --to safetensors)"
        )
    if strip != "auto" and strip != "none" and not strip.endswith("."):
        raise ValueError(f"--strip {strip!r}; expected 'auto', 'none' or a prefix ending in '.'")
    progress = _make_progress(progress_stream, _size_of(src), show_progress)
    try:
        summary = _convert(
            src, dst, fmt, strip, key, max_shard_size, max_bytes, list(allow), progress
        )
    except BaseException:
        progress.close(False)  # the bar is erased: the one-line error is all that is left
        raise
    progress.close(True)
    return summary


def _convert(
    src: str,
    dst: str,
    fmt: str,
    strip: str,
    key: Optional[str],
    max_shard_size: Optional[str],
    max_bytes: Optional[int],
    allow: List[str],
    progress: _Progress,
) -> Dict[str, Any]:
    obj = _read_source(src, allow, progress)
    carried = _carried_keys(obj)
    written_key: Optional[str] = None
    if key is not None or fmt == "safetensors":
        state_dict, written_key = find_state_dict(model_view(obj), key)  # names the keys there
        if key is not None:
            obj = state_dict
    dropped = [k for k in carried if k != written_key] if key is not None else []
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
    tensors = list(iter_tensors(obj))
    summary: Dict[str, Any] = {"format": fmt, "tensors": len(tensors), "key": written_key}
    box: List[Optional[str]] = [None]  # the temp path being written, for the progress bar

    def written() -> int:
        return _bytes_under(box[0])

    if fmt == "dcp":
        if not isinstance(obj, Mapping):
            raise CheckpointError(
                f"--to dcp needs a dict checkpoint; {src!r} holds a {type(obj).__name__}"
            )
        _check_output_bytes(src, list(iter_named_tensors(obj)), tensors, max_bytes, "dcp")
        progress.start(sum(map(_nbytes, tensors)), "writing")

        def write_dcp(tmp: str) -> None:
            box[0] = tmp
            with _watching(progress, written):
                _conversions.dcp_save(obj, tmp)

        atomic_write_dir(dst, write_dcp)
    elif fmt == "safetensors":
        try:
            import safetensors.torch as st_torch
        except ImportError:
            raise CheckpointError(
                "--to safetensors needs the safetensors package: "
                "pip install 'safetorch[safetensors]'"
            ) from None
        # The state dict picked above, after --strip (with --key, obj is that state dict).
        state_dict = obj if key is not None else find_state_dict(model_view(obj), written_key)[0]
        written_pairs = [(str(k), v) for k, v in state_dict.items() if isinstance(v, torch.Tensor)]
        _check_output_bytes(src, written_pairs, tensors, max_bytes, "safetensors")
        flat, entries = _for_safetensors(state_dict)
        where = f"{written_key}." if written_key else ""
        dropped = [k for k in carried if k != written_key] + [where + e for e in entries]
        summary["tensors"] = len(flat)
        progress.start(sum(map(_nbytes, flat.values())), "writing")
        if max_shard_size is not None:
            limit = _conversions.parse_size(max_shard_size)

            def write_shards(tmp: str) -> None:
                box[0] = tmp
                with _watching(progress, written):
                    summary.update(_conversions.save_sharded_safetensors(flat, tmp, limit))

            atomic_write_dir(dst, write_shards)
        else:

            def write_file(tmp: str) -> None:
                if sys.byteorder != "little":  # safetensors is little-endian: let it swap
                    st_torch.save_file(flat, tmp, metadata={"format": "pt"})
                    return
                with open(tmp, "wb") as fh:
                    _write_safetensors(flat, fh, progress)

            atomic_write(dst, write_file)
    else:
        progress.start(sum(map(_nbytes, tensors)), "writing")

        def write(tmp: str) -> None:
            with open(tmp, "wb") as fh, _torch_internals_quiet():
                torch.save(obj, _CountingWriter(fh, progress))  # type: ignore[arg-type]  # a file-like writer (write/flush), which torch.save accepts; its stub names IO[bytes]

        atomic_write(dst, write)
    progress.finish()
    summary["dropped"] = dropped
    return summary


# What safetensors/DCP output may take beyond twice the source's storage bytes by default.
OUTPUT_SLACK_BYTES = 64 * 1024 * 1024


def _distinct_storage_bytes(tensors: List[torch.Tensor]) -> int:
    seen = set()
    total = 0
    for t in tensors:
        try:
            storage = _cli_source._storage_of(t)
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
        f"--max-bytes {max(1, -(-need // 2**30))}GiB) to write them anyway, or --to torch, which "
        "keeps views as they are"
    )


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


def _size_option(option: str, value: Optional[str]) -> Optional[int]:
    """``--max-bytes 2GiB`` -> bytes; a bad value names the option, the form and an example."""
    if value is None:
        return None
    try:
        return _conversions.parse_size(value)
    except ValueError:
        raise _BadInput(
            f"{option} {value!r}: expected a positive size such as 5GB, 500MB, 2GiB or a number "
            f"of bytes (e.g. {option} 5GB)"
        ) from None


def _cmd_convert(args: argparse.Namespace) -> int:
    _size_option("--max-shard-size", args.max_shard_size)
    _readable_source(args.src)
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
        max_bytes=_size_option("--max-bytes", args.max_bytes),
        allow=allow_list(args.allow),
        show_progress=not args.no_progress,
    )
    if args.json:
        write_json("convert", {"path": args.dst, **summary})
        return 0
    summary, what = escape_all(summary), f"{summary['tensors']} tensors"
    if summary.get("key"):
        what += f" of {summary['key']!r}"
    line = f"wrote {escape(args.dst)} ({summary['format']}, {what})"
    if summary["dropped"]:
        why = (
            "a safetensors file holds one state dict's tensors; --to torch keeps everything"
            if summary["format"] == "safetensors"
            else f"--key {escape(args.key)} writes only that state dict"
        )
        line += "; " + paint(
            f"not carried over: {', '.join(summary['dropped'])}", "yellow", sys.stdout
        )
        line += f" ({why})"
    sys.stdout.write(line + "\n")
    return 0
