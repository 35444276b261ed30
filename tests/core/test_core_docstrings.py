"""Every docstring example of every safetorch module runs, and passes (issue 25).

``doctest`` over each module, its classes, functions and methods: an example that no longer
matches what the code does fails here, whether or not the name is public.
"""

from __future__ import annotations

import doctest
import importlib
import pkgutil
import warnings

import pytest

import safetorch

_SKIP = {"safetorch.__main__"}  # runs the CLI on import


def _modules():
    names = ["safetorch"]
    for info in pkgutil.walk_packages(safetorch.__path__, "safetorch."):
        if info.name not in _SKIP and not info.name.endswith(".__main__"):
            names.append(info.name)
    return sorted(names)


MODULES = _modules()


# torch's own loader warns about its TypedStorage use on some 2.x releases (2.1.2), once per
# process: whether an example calling torch.load sees it depends on which test ran first
@pytest.mark.filterwarnings("ignore:TypedStorage is deprecated:UserWarning")
@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_pass(name, tmp_path, monkeypatch):
    module = importlib.import_module(name)
    tests = doctest.DocTestFinder(exclude_empty=True).find(module, name)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    monkeypatch.chdir(tmp_path)  # examples that write files write them here
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", safetorch.SafetorchWarning)
            for test in tests:
                runner.run(test)
    finally:
        safetorch.unpatch()
    assert runner.failures == 0, f"{runner.failures} docstring example(s) of {name} failed"


def test_most_modules_have_examples():
    """The examples are many (not a handful that happen to run)."""
    count = 0
    for name in MODULES:
        for test in doctest.DocTestFinder(exclude_empty=True).find(importlib.import_module(name)):
            count += len(test.examples)
    assert count >= 300, count
