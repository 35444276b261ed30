"""``safetorch ckpt diff``: compare the state dicts of two checkpoints after key matching."""

from __future__ import annotations

import argparse
from typing import (
    IO,
    Any,
    Dict,
    Iterable,
    Mapping,
    Optional,
    Tuple,
)

import torch

from safetorch._cli import paint
from safetorch.checkpoint._cli_progress import _human, _make_progress, _Progress
from safetorch.checkpoint._cli_source import (
    _dtype_name,
    _emit,
    _nbytes,
    _readable_source,
    _storage_bytes,
    allow_list,
    model_view,
    read_source,
)
from safetorch.checkpoint.keys import (
    find_state_dict,
    match_keys,
)
from safetorch.errors import CheckpointError


# --- diff --------------------------------------------------------------------------------------
def _pick_state_dict(obj: Any, key: Optional[str]) -> Mapping[str, Any]:
    return find_state_dict(obj, key)[0]


def diff_checkpoints(
    a: str,
    b: str,
    *,
    key: Optional[str] = None,
    progress_stream: Optional[IO[str]] = None,
    allow: Iterable[str] = (),
    atol: float = 0.0,
    rtol: float = 0.0,
    show_progress: bool = True,
) -> Dict[str, Any]:
    """Compare the state dicts of two checkpoints, after wrapper normalisation.

    Keys are matched as :func:`safetorch.match_keys` matches them (``module.``,
    ``_orig_mod.`` ... anywhere, Lightning's ``model.``), so a DataParallel checkpoint and a
    plain one of the same weights are equal.

    Args:
        a: the first checkpoint (any layout :func:`read_source` reads: a file, a
            ``save_state`` file, a ``CheckpointSaver``, DCP or library directory, a shard index).
        b: the second checkpoint.
        key: the container key (object name in a ``save_state`` file) of the state dict in
            both (default: the one ``st.load_state_dict`` would pick).
        progress_stream: where a progress bar goes (default stderr; drawn only on a TTY for
            checkpoints above 256 MiB, while reading and comparing).
        allow: globals allowed as for ``st.load(allow=)`` (``--allow``).
        atol: absolute tolerance; values count as equal where ``|a - b| <= atol + rtol * |b|``
            elementwise, as :func:`torch.isclose` (NaNs in the same places are equal). The
            default 0 and 0 compare exactly.
        rtol: relative tolerance (see ``atol``).
        show_progress: ``False`` never draws the progress bar (``--no-progress``).

    Returns:
        A JSON-ready dict: ``only_in_a``, ``only_in_b``, ``shape_changed`` and
        ``dtype_changed`` (``[key, a, b]``), ``value_changed`` (``[key, max abs diff]``, beyond
        the tolerance), ``within_tolerance`` (``[key, max abs diff]``: different, but within
        ``atol``/``rtol``), ``equal`` (count), ``atol``, ``rtol``, ``rule`` (how keys were
        matched) and ``identical`` (nothing differs beyond the tolerance).

    Raises:
        ValueError: ``atol`` or ``rtol`` is negative or not a finite number.

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
    for name, tol in (("atol", atol), ("rtol", rtol)):
        if not (isinstance(tol, (int, float)) and 0 <= tol < float("inf")):
            raise ValueError(
                f"{name}={tol!r}: expected a finite number >= 0 (e.g. {name}=1e-6); 0 is exact"
            )
    allow = list(allow)

    def state_dict_of(path: str) -> Mapping[str, Any]:
        obj = read_source(
            path, allow=allow, progress_stream=progress_stream, show_progress=show_progress
        )
        return _pick_state_dict(model_view(obj), key)

    sd_a, sd_b = state_dict_of(a), state_dict_of(b)
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
        "within_tolerance": [],
        "equal": 0,
        "atol": float(atol),
        "rtol": float(rtol),
    }
    tensors = [v for v in sd_a.values() if isinstance(v, torch.Tensor)]
    progress = _make_progress(progress_stream, sum(map(_nbytes, tensors)), show_progress)
    progress.start(progress.total, "comparing")
    try:
        _compare(sd_a, sd_b, match.mapping, result, progress)
    except BaseException:
        progress.close(False)
        raise
    progress.finish()
    progress.close(True)
    result["identical"] = not any(
        result[k]
        for k in ("only_in_a", "only_in_b", "shape_changed", "dtype_changed", "value_changed")
    )
    return result


def _compare(
    sd_a: Mapping[str, Any],
    sd_b: Mapping[str, Any],
    mapping: Mapping[str, str],
    result: Dict[str, Any],
    progress: _Progress,
) -> None:
    for ka, kb in mapping.items():
        va, vb = sd_a[ka], sd_b[kb]
        name = kb if ka == kb else f"{kb}"
        if not (isinstance(va, torch.Tensor) and isinstance(vb, torch.Tensor)):
            if _values_equal(va, vb):
                result["equal"] += 1
            else:
                result["value_changed"].append([name, None])
            continue
        progress.advance(_nbytes(va))
        if va.shape != vb.shape:
            result["shape_changed"].append([name, list(va.shape), list(vb.shape)])
            continue
        if va.dtype != vb.dtype:
            result["dtype_changed"].append([name, _dtype_name(va), _dtype_name(vb)])
        va, vb = _comparable(name, va, vb)
        diff = _max_abs_diff(va, vb)
        if diff is None:
            result["equal"] += 1
        elif _within(va, vb, result["atol"], result["rtol"]):
            result["within_tolerance"].append([name, diff])
        else:
            result["value_changed"].append([name, diff])


def _within(a: torch.Tensor, b: torch.Tensor, atol: float, rtol: float) -> bool:
    """Whether ``a`` and ``b`` are elementwise close (:func:`torch.isclose`, NaNs equal) in
    float64 (complex128 for complex; bools only when equal); never with no tolerance."""
    if (atol == 0 and rtol == 0) or a.dtype == torch.bool or b.dtype == torch.bool:
        return False
    wide = torch.complex128 if a.is_complex() or b.is_complex() else torch.float64
    return bool(torch.isclose(a.to(wide), b.to(wide), rtol=rtol, atol=atol, equal_nan=True).all())


# A comparison may touch this many bytes beyond what the two tensors' storages hold (small
# expanded buffers compare as usual).
DIFF_SLACK_BYTES = 64 * 1024 * 1024


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
    close = r["within_tolerance"]
    tolerance = f"atol={r['atol']:g}, rtol={r['rtol']:g}"
    for key, diff in close:
        out.write(f"within tolerance: {key} (max abs diff {diff:.6g}; {tolerance})\n")
    changed = len(r["value_changed"]) + len(r["shape_changed"])
    verdict = "identical" if not close else f"equal within {tolerance}"
    out.write(
        f"{paint(verdict, 'green', out) if r['identical'] else paint('different', 'red', out)}"
        f": {r['equal']} equal, " + (f"{len(close)} within tolerance, " if close else "") + ""
        f"{changed} changed, {len(r['only_in_a'])} only in a, {len(r['only_in_b'])} only in b\n"
    )


def _cmd_diff(args: argparse.Namespace) -> int:
    _readable_source(args.a)
    _readable_source(args.b)
    result = diff_checkpoints(
        args.a,
        args.b,
        key=args.key,
        allow=allow_list(args.allow),
        atol=args.atol,
        rtol=args.rtol,
        show_progress=not args.no_progress,
    )
    _emit(args, result, _print_diff)
    return 0 if result["identical"] else 1
