"""``safetorch doctor``: the environment, every _compat flag and every dispatch decision."""

from __future__ import annotations

import argparse
import json
import platform
import sys
from typing import Any, Dict, List

__all__ = ["collect", "add_parsers"]


def _version_of(dist: str) -> str:
    try:
        from importlib.metadata import version

        return version(dist)
    except Exception:  # not installed, or metadata missing
        return "not installed"


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
            "path": _device.get_index_check(),
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
        },
        "platform": platform.platform(),
        "cuda": _cuda_info(),
        "distributed": _distributed_info(),
        "flags": [f._asdict() for f in _compat.flags()],
        "decisions": _decisions(),
    }


def _print_text(report: Dict[str, Any]) -> None:
    w = sys.stdout.write
    w("safetorch doctor\n\nversions\n")
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
    if args.json:
        json.dump(report, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    else:
        _print_text(report)
    return 0


def add_parsers(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``safetorch doctor``."""
    p = subparsers.add_parser(
        "doctor", help="versions, devices, torch feature flags and dispatch decisions"
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_run)
