"""``safetorch ckpt fit``: what ``st.load_state_dict`` would do with a model, nothing loaded."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
import warnings
from typing import (
    Any,
    Dict,
    Iterable,
    Iterator,
    Optional,
)

import torch

from safetorch._cli import paint
from safetorch._text import escape
from safetorch.checkpoint import _layouts, _resolve
from safetorch.checkpoint._cli_source import (
    _BadInput,
    _readable_source,
    _saver_source,
    allow_list,
    write_json,
)
from safetorch.checkpoint.loading import load
from safetorch.checkpoint.model_state import load_state_dict


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
    path: str,
    model: torch.nn.Module,
    *,
    key: Optional[str] = None,
    prefix: Optional[str] = None,
    allow: Iterable[str] = (),
) -> Any:
    """What ``st.load_state_dict(model, path)`` would do, without loading into ``model``.

    The load runs with ``strict=False`` into a copy of ``model`` on the ``meta`` device (no
    memory for its weights, and ``model`` is untouched), through the very function a real
    load uses; ``report.ok`` says whether a strict load would succeed.

    Args:
        path: the checkpoint: a file (a ``save_state`` file too), a ``CheckpointSaver``, DCP
            or library directory, a shard index.
        model: the model the checkpoint is meant for.
        key: the container key of the state dict (as for ``st.load_state_dict``).
        prefix: take a sub-module's keys (as for ``st.load_state_dict``, where supported).
        allow: globals allowed as for ``st.load(allow=)`` (``--allow``; files only: the other
            layouts hold no pickled globals a model load reads).

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

    if not isinstance(model, torch.nn.Module):
        raise TypeError(
            f"fit_checkpoint(model=...) expects an nn.Module, got {type(model).__name__}"
        )
    import copy

    shadow = copy.deepcopy(model).to("meta")
    kwargs: Dict[str, Any] = {"strict": False, "key": key}
    if prefix is not None:
        kwargs["prefix"] = prefix
    with warnings.catch_warnings():
        # torch says each copy into a meta parameter is a no-op: that is the point here.
        warnings.filterwarnings("ignore", message=".*copying from a non-meta parameter")
        # The load is strict=False on purpose: what it left unloaded is the report itself.
        warnings.filterwarnings("ignore", message=r"load_state_dict\(strict=False\) left")
        path = _saver_source(path) or path
        layout = _resolve.resolve(path)
        if not isinstance(layout, _layouts.FileLayout):
            return load_state_dict(shadow, path, **kwargs)  # matched on its meta view
        return load_state_dict(shadow, load(layout.path, allow=list(allow)), **kwargs)


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


def _cmd_fit(args: argparse.Namespace) -> int:
    _readable_source(args.path)
    allow = allow_list(args.allow)
    try:
        model = _model_from(args.model)
    except ValueError:
        raise
    except Exception as exc:  # the user's factory failed: their error, in one line
        raise _BadInput(
            f"--model {args.model!r}: building the model raised {type(exc).__name__}: {exc}"
        ) from None
    report = fit_checkpoint(args.path, model, key=args.key, prefix=args.prefix, allow=allow)
    if args.json:
        write_json("fit", _report_json(report))
    else:
        sys.stdout.write(escape(report, keep="\n") + "\n")
        verdict = (
            paint("fits", "green", sys.stdout) + ": st.load_state_dict(model, path) loads every key"
            if report.ok
            else (
                paint("does not fit", "red", sys.stdout) + ": a strict st.load_state_dict would "
                f"refuse; strict=False would load {len(report.loaded)} keys"
            )
        )
        sys.stdout.write(verdict + "\n")
    return 0 if report.ok else 1
