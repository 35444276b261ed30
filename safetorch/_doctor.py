"""``safetorch doctor``: the environment, every _compat flag and every dispatch decision."""

from __future__ import annotations

import argparse
import json
import platform
import sys
from typing import Any, Dict, List

from safetorch import _pitfalls  # standard library only: doctor's import stays light

__all__ = ["collect", "add_parsers"]


def _version_of(dist: str) -> str:
    try:
        from importlib.metadata import version

        return version(dist)
    except Exception:  # not installed, or metadata missing
        return "not installed"


def _numpy_version() -> str:
    """numpy's version where ``import numpy`` works (torch has tried it already), else why
    not: optional, torch does not require it and safetorch reads tensors without it."""
    try:
        import numpy
    except ImportError:
        return "not importable (optional: only checkpoints holding numpy arrays need it)"
    return str(numpy.__version__)


def _cuda_info() -> Dict[str, Any]:
    import torch

    info: Dict[str, Any] = {
        "cuda_build": torch.version.cuda,
        "hip_build": getattr(torch.version, "hip", None),
        "cuda_available": torch.cuda.is_available(),
        "cudnn": None,
        "nccl": None,
        "devices": [],
    }
    try:
        if torch.backends.cudnn.is_available():
            info["cudnn"] = torch.backends.cudnn.version()
    except Exception as exc:  # broken CUDA install: report, do not crash the doctor
        info["cudnn"] = f"error: {exc}"
    try:
        if torch.cuda.is_available():
            info["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
            info["devices"] = [
                {"index": i, "name": torch.cuda.get_device_name(i)}
                for i in range(torch.cuda.device_count())
            ]
    except Exception as exc:
        info["nccl"] = f"error: {exc}"
    mps = getattr(torch.backends, "mps", None)
    info["mps_available"] = bool(mps is not None and mps.is_available())
    return info


def _distributed_info() -> Dict[str, Any]:
    import torch.distributed as dist

    if not dist.is_available():
        return {"available": False}
    backends = {}
    for name, probe in (
        ("gloo", "is_gloo_available"),
        ("nccl", "is_nccl_available"),
        ("mpi", "is_mpi_available"),
        ("ucc", "is_ucc_available"),
        ("xccl", "is_xccl_available"),
    ):
        fn = getattr(dist, probe, None)
        backends[name] = bool(fn()) if fn is not None else False
    return {"available": True, "initialized": dist.is_initialized(), "backends": backends}


def _decisions() -> List[Dict[str, str]]:
    from safetorch import _compat, _device

    out = [
        {
            "decision": "index check mode",
            "path": _device.get_mode(),
            "why": "SAFETORCH_INDEX_CHECK / st.set_index_check (default auto)",
        }
    ]
    for dev in ("cpu", "cuda", "mps", "xpu", "meta"):
        checked = _device.needs_index_check(dev)
        out.append(
            {
                "decision": f"index on {dev}",
                "path": "pre-check, then torch" if checked else "torch directly",
                "why": _device.index_check_reason(dev),
            }
        )
    out.append(
        {
            "decision": "accelerator detection",
            "path": "torch.accelerator" if _compat.HAS_ACCELERATOR else "torch.cuda",
            "why": "torch.accelerator exists (2.6+)"
            if _compat.HAS_ACCELERATOR
            else "no torch.accelerator before 2.6",
        }
    )
    out.append(
        {
            "decision": "pin memory",
            "path": "pin" if _device.accelerator_available() else "no-op",
            "why": "an accelerator is present"
            if _device.accelerator_available()
            else "no accelerator: pinning would raise, so it is skipped",
        }
    )
    return out


def collect() -> Dict[str, Any]:
    """Everything ``safetorch doctor`` reports, as a JSON-serialisable dict.

    >>> from safetorch._doctor import collect
    >>> sorted(collect())[:3]
    ['cuda', 'decisions', 'distributed']
    """
    import torch

    import safetorch
    from safetorch import _compat

    return {
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "safetorch": safetorch.__version__,
            "packaging": _version_of("packaging"),
            "wrapt": _version_of("wrapt"),
            "safetensors": _version_of("safetensors"),
            "numpy": _numpy_version(),
        },
        "platform": platform.platform(),
        "cuda": _cuda_info(),
        "distributed": _distributed_info(),
        "flags": [f._asdict() for f in _compat.flags()],
        "decisions": _decisions(),
    }


def _patch_mode() -> Dict[str, Any]:
    """SAFETORCH_PATCH / SAFETORCH_ALLOW / SAFETORCH_REPORT, the .pth hook, active patches."""
    import os

    info: Dict[str, Any] = {
        "SAFETORCH_PATCH": os.environ.get("SAFETORCH_PATCH"),
        "SAFETORCH_ALLOW": os.environ.get("SAFETORCH_ALLOW"),
        "SAFETORCH_REPORT": os.environ.get("SAFETORCH_REPORT"),
    }
    problems: List[str] = []
    try:
        from safetorch.patching import _hook, _registry
    except ImportError as exc:  # wrapt missing
        info["available"] = False
        problems.append(f"monkeypatch mode unavailable: {exc}; pip install 'wrapt>=1.14'")
        info["problems"] = problems
        return info
    info["available"] = True
    pth = os.path.join(_hook.default_dir(), _hook.PTH_NAME)
    info["hook"] = pth if os.path.exists(pth) else None
    info["active"] = _registry.active_names()
    # Every patch family with the pitfall-table rows it routes: read from the table
    # (safetorch._pitfalls), the one source, not restated by the patch declarations.
    info["patches"] = [
        {
            "name": p.name,
            "pitfalls": list(_pitfalls.for_patch(p.name)),
            "active": _registry.is_active(p.name),
        }
        for p in _registry.declared()
    ]
    value = (info["SAFETORCH_PATCH"] or "").strip()
    if value and value.lower() not in ("0", "off", "none", "false"):
        try:
            info["patches_named"] = _registry.resolve_names(value.split(","), default_all=True)
        except (ValueError, TypeError) as exc:
            problems.append(f"SAFETORCH_PATCH={value!r} is ignored: {exc}")
        if info["hook"] is None and not info["active"]:
            problems.append(
                "SAFETORCH_PATCH is set but no hook is installed, so plain `python` ignores it; "
                "run `safetorch install-hook` or start programs with `safetorch run`"
            )
    from safetorch.patching._allow import parse_allow_list

    try:
        info["allowed_globals"] = parse_allow_list([info["SAFETORCH_ALLOW"] or ""])
    except ValueError as exc:
        problems.append(f"SAFETORCH_ALLOW: {exc}")
    info["problems"] = problems
    return info


def _problems(report: Dict[str, Any]) -> List[str]:
    import os

    out = list(report["patch_mode"].get("problems", []))
    index_check = os.environ.get("SAFETORCH_INDEX_CHECK", "auto").strip().lower() or "auto"
    if index_check not in ("auto", "always", "never"):
        out.append(f"SAFETORCH_INDEX_CHECK={index_check!r} is ignored; use auto, always or never")
    return out


def verdict(report: Dict[str, Any]) -> str:
    """The one-line summary ``safetorch doctor`` starts with."""
    problems = report["problems"]
    mode = report["patch_mode"]
    if mode.get("active"):
        patch = "patch mode on in this process (" + ", ".join(mode["active"]) + ")"
    elif mode.get("hook"):
        patch = "patch hook installed" + (
            f" (SAFETORCH_PATCH={mode['SAFETORCH_PATCH']})"
            if mode.get("SAFETORCH_PATCH")
            else ", off until SAFETORCH_PATCH is set"
        )
    else:
        patch = "patch mode off"
    versions = report["versions"]
    accel = "CUDA available" if report["cuda"].get("available") else "no CUDA (CPU only)"
    head = f"torch {versions['torch']}, safetorch {versions['safetorch']}, {accel}, {patch}"
    if not problems:
        return f"ok: {head}"
    return f"{len(problems)} problem{'s' if len(problems) != 1 else ''}: {problems[0]} ({head})"


def _print_text(report: Dict[str, Any]) -> None:
    w = sys.stdout.write
    from safetorch._cli import paint

    style = "yellow" if report["problems"] else "green"
    w(f"safetorch doctor: {paint(report['verdict'], style, sys.stdout)}\n")
    for problem in report["problems"][1:]:
        w(f"  also: {problem}\n")
    w("\npatch mode\n")
    mode = report["patch_mode"]
    for k in ("SAFETORCH_PATCH", "SAFETORCH_ALLOW", "SAFETORCH_REPORT"):
        w(f"  {k:<17} {mode.get(k) if mode.get(k) is not None else '(unset)'}\n")
    if mode.get("available"):
        w(f"  {'hook':<17} {mode['hook'] or 'not installed (safetorch install-hook)'}\n")
        w(f"  {'active here':<17} {', '.join(mode['active']) or 'none'}\n")
        for p in mode.get("patches", []):
            state = "on" if p["active"] else "off"
            w(f"  patch {p['name']:<11} {state:<4} pitfalls: {', '.join(p['pitfalls'])}\n")
    w("\nversions\n")
    for k, v in report["versions"].items():
        w(f"  {k:<12} {v}\n")
    w(f"  {'platform':<12} {report['platform']}\n\naccelerators\n")
    for k, v in report["cuda"].items():
        w(f"  {k:<15} {v}\n")
    w("\ndistributed\n")
    for k, v in report["distributed"].items():
        w(f"  {k:<15} {v}\n")
    w("\ntorch features (_compat flags)\n")
    for f in report["flags"]:
        w(f"  {f['name']:<32} {str(f['value']):<6} since {f['since']:<5} via {f['detected_by']}\n")
    w("\ndispatch decisions\n")
    for d in report["decisions"]:
        w(f"  {d['decision']:<24} -> {d['path']:<22} {d['why']}\n")


def _run(args: argparse.Namespace) -> int:
    report = collect()
    report["patch_mode"] = _patch_mode()
    report["problems"] = _problems(report)
    report["verdict"] = verdict(report)
    report = {"verdict": report["verdict"], **report}
    if args.json:
        json.dump(report, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    else:
        _print_text(report)
    return 1 if report["problems"] else 0


def add_parsers(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``safetorch doctor``."""
    text = "versions, devices, torch feature flags and dispatch decisions"
    p = subparsers.add_parser(
        "doctor",
        help=text,
        description=text,
        epilog="exit status: 0 no problem found, 1 a problem found (the first line names it), "
        "2 torch is not installed; 130 interrupted.",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_run, _parser=p)
