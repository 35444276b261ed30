"""The public API: every name exported, documented with a runnable example that passes."""

from __future__ import annotations

import doctest
import inspect
import sys

import pytest

import safetorch as st


def test_every_public_name_is_exported() -> None:
    assert len(st.__all__) == len(set(st.__all__)), "duplicate names in safetorch.__all__"
    for name in st.__all__:
        assert hasattr(st, name), f"safetorch.__all__ lists {name!r} but it is missing"


def _public_objects() -> list:
    return [
        (name, getattr(st, name))
        for name in st.__all__
        if not name.startswith("__")
        and (inspect.isfunction(getattr(st, name)) or inspect.isclass(getattr(st, name)))
    ]


@pytest.mark.parametrize("name,obj", _public_objects(), ids=[n for n, _ in _public_objects()])
def test_public_name_has_docstring_with_runnable_example(name: str, obj: object) -> None:
    doc = inspect.getdoc(obj)
    assert doc, f"st.{name} has no docstring"
    assert ">>>" in doc, f"st.{name}'s docstring has no runnable >>> example"
    finder = doctest.DocTestFinder(recurse=False)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    module = sys.modules[obj.__module__]  # type: ignore[attr-defined]
    for test in finder.find(obj, name, module=module, globs=dict(vars(module))):
        result = runner.run(test)
        assert result.failed == 0, f"st.{name}'s example failed (run pytest --doctest-modules)"


def test_import_never_patches() -> None:
    import subprocess
    import sys

    code = (
        "import torch, torch.nn.functional as F; before = (F.upsample, torch.load, "
        "torch.Tensor.__getitem__, torch.nn.Module.load_state_dict, torch.gather);"
        "import safetorch; after = (F.upsample, torch.load, torch.Tensor.__getitem__,"
        " torch.nn.Module.load_state_dict, torch.gather);"
        "print(all(a is b for a, b in zip(before, after)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"
