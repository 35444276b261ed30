"""Loads hostile whole-model pickles in a process of its own, each face side by side.

Usage: ``python _trust_child.py SPEC.json RESULT.json``. The spec names the project root (put
first on ``sys.path``, as ``safetorch run`` does), other ``sys.path`` entries, and the cases:
``name``, ``path``, ``marker`` and ``safe_globals`` (``"module:attr"`` names for torch's
``safe_globals``). For each case and face the result records ``loaded`` or the exception's type
and first line, and whether the marker exists after that face. Faces, in order (every case
through one face before the next; the process fingerprint is taken after safetorch's faces):

``st.load(trust_root=)``, ``patched torch.load`` (``SAFETORCH_TRUST_ROOT``), ``torch
weights_only`` and ``torch safe_globals`` (torch's own loader with the case's classes allowed).
"""

from __future__ import annotations

import functools
import importlib
import json
import os
import sys
from typing import Any, Callable, Dict, List


def _outcome(run: Callable[[], Any]) -> str:
    try:
        run()
    except Exception as exc:  # every failure is an outcome to report
        text = str(exc).strip().splitlines()
        return f"{type(exc).__name__}: {text[0] if text else ''}"[:400]
    return "loaded"


def _objects(names: List[str]) -> List[Any]:
    out = []
    for name in names:
        module, attr = name.split(":")
        out.append(getattr(importlib.import_module(module), attr))
    return out


def main(spec_path: str, result_path: str) -> None:
    with open(spec_path) as fh:
        spec = json.load(fh)
    sys.path[:0] = [spec["root"]]
    sys.path.extend(spec["path"])
    import torch

    import safetorch as st

    def fingerprint() -> Dict[str, str]:
        import numpy as np

        model = importlib.import_module(spec["model_module"])
        return {
            "Net attributes": repr(sorted(vars(model.Net))),
            "float64": repr((np.dtype("f8").str, np.dtype("f8").itemsize, np.dtype("f8").names)),
            "_rebuild_tensor_v2": repr(torch._utils._rebuild_tensor_v2.__defaults__),
            "safe_globals": repr(
                sorted(map(repr, getattr(torch.serialization, "get_safe_globals", list)()))
            ),
        }

    before = fingerprint()
    results: Dict[str, Any] = {case["name"]: {} for case in spec["cases"]}
    root = spec["root"]

    def patched_load(path: str) -> Any:
        os.environ["SAFETORCH_TRUST_ROOT"] = root
        try:
            with st.patched("load"):
                return torch.load(path)
        finally:
            del os.environ["SAFETORCH_TRUST_ROOT"]

    def with_safe_globals(path: str, names: List[str]) -> Any:
        with torch.serialization.safe_globals(_objects(names)):
            return torch.load(path, weights_only=True)

    faces: Dict[str, Callable[[Dict[str, Any]], Any]] = {
        "st.load(trust_root=)": lambda case: st.load(case["path"], trust_root=root),
        "patched torch.load": lambda case: patched_load(case["path"]),
        "torch weights_only": lambda case: torch.load(case["path"], weights_only=True),
        "torch safe_globals": lambda case: with_safe_globals(case["path"], case["safe_globals"]),
    }
    if not hasattr(torch.serialization, "safe_globals"):  # torch < 2.5: no such face
        del faces["torch safe_globals"]
    for face, run in faces.items():  # every case through safetorch first, then through torch
        for case in spec["cases"]:
            outcome = _outcome(functools.partial(run, case))
            results[case["name"]][face] = {
                "outcome": outcome,
                "marker": os.path.exists(case["marker"]),
            }
        if face == "patched torch.load":
            after = fingerprint()
            results["__fingerprint__"] = [k for k in before if before[k] != after[k]]
            results["__imported__"] = sorted(m for m in sys.modules if m.startswith("sttrust_"))
    with open(result_path, "w") as fh:
        json.dump(results, fh)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
