"""The mechanism: idempotent, exactly reversible, thread-safe, hooks, never on import."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from typing import Any, Dict, List

import pytest
import torch
import torch.nn.functional as F
import torch.utils.data._utils.pin_memory as torch_pin
import wrapt

import safetorch as st
from safetorch.errors import SafetorchWarning
from safetorch.patching import _registry, _routing
from safetorch.patching._finder import HookLoader, PostImportFinder

NAMES = ["upsample", "load", "state_dict", "index", "pin_memory", "syncbn", "legacy"]
DEFAULT = [n for n in NAMES if n != "legacy"]  # legacy is opt-in for st.patch()


def _touched() -> List[Any]:
    """Every module and class any patch touches."""
    import torch.utils.data.dataloader as dl

    return [
        F,
        torch,
        torch.serialization,
        torch.Tensor,
        torch.nn.Module,
        torch.nn.SyncBatchNorm,
        torch_pin,
        dl._BaseDataLoaderIter,
    ]


def _snapshot() -> List[Dict[str, Any]]:
    return [dict(vars(obj)) for obj in _touched()]


def _same(a: List[Dict[str, Any]], b: List[Dict[str, Any]]) -> bool:
    # Same keys and the very same objects (`is`), not just equal ones.
    return all(x.keys() == y.keys() and all(x[k] is y[k] for k in x) for x, y in zip(a, b))


def test_patches_lists_every_patch_with_targets_and_state() -> None:
    infos = st.patches()
    assert [p.name for p in infos] == NAMES
    assert all(p.available and not p.active and p.targets and p.description for p in infos)
    by_name = {p.name: p for p in infos}
    assert "torch.Tensor.__getitem__" in by_name["index"].targets
    assert by_name["syncbn"].implementation.startswith("st.convert_sync_batchnorm, ")
    st.patch("load")
    assert {p.name for p in st.patches() if p.active} == {"load"}
    assert "[on]" in str(st.patches()[1])


def test_all_patch_unpatch_restores_identity_and_vars() -> None:
    before = _snapshot()
    originals = (F.upsample, torch.load, torch.nn.Module.load_state_dict)
    assert "__getitem__" not in vars(torch.Tensor)  # inherited from TensorBase
    assert st.patch() == DEFAULT
    assert isinstance(F.upsample, wrapt.FunctionWrapper)
    assert "__getitem__" in vars(torch.Tensor)
    assert st.unpatch() == DEFAULT
    assert (F.upsample, torch.load, torch.nn.Module.load_state_dict) == originals
    assert F.upsample is originals[0] and torch.load is originals[1]
    assert "__getitem__" not in vars(torch.Tensor)  # deleted, not set to the original
    classmethod_obj = vars(torch.nn.SyncBatchNorm)["convert_sync_batchnorm"]
    assert isinstance(classmethod_obj, classmethod)
    assert _same(before, _snapshot())


def test_thousand_cycles_leave_vars_identical() -> None:
    before = _snapshot()
    for i in range(1000):
        names = NAMES if i % 2 else [NAMES[i % len(NAMES)]]
        st.patch(*names)
        st.unpatch(*names)
    assert _same(before, _snapshot())
    assert _registry.active_names() == []


def test_patch_twice_wraps_once() -> None:
    st.patch("upsample")
    wrapper = F.upsample
    assert st.patch("upsample") == []  # nothing newly turned on
    st.patch("all")
    assert F.upsample is wrapper
    assert F.upsample.__wrapped__ is not wrapper
    assert not isinstance(F.upsample.__wrapped__, wrapt.FunctionWrapper)


def test_unknown_name_is_refused_naming_the_choices() -> None:
    with pytest.raises(ValueError, match="unknown patch 'upsampel'.*upsample"):
        st.patch("upsampel")
    assert _registry.active_names() == []


def test_comma_separated_names() -> None:
    assert st.patch("load,index") == ["load", "index"]


def test_patched_context_restores_and_nests() -> None:
    original = F.upsample_nearest
    with st.patched("upsample"):
        assert F.upsample_nearest is not original
        with st.patched("upsample", "load"):
            assert _registry.active_names() == ["upsample", "load"]
        assert _registry.active_names() == ["upsample"]
    assert F.upsample_nearest is original
    st.patch("upsample")
    with st.patched("upsample"):
        pass
    assert _registry.is_active("upsample")  # the explicit patch() outlives the context


def test_patched_restores_on_exception() -> None:
    original = torch.load
    with pytest.raises(KeyError), st.patched("load"):
        raise KeyError("x")
    assert torch.load is original


def test_eight_threads_patching_concurrently_end_consistent() -> None:
    before = _snapshot()
    errors: List[BaseException] = []
    barrier = threading.Barrier(8)

    def worker(k: int) -> None:
        try:
            barrier.wait()
            for i in range(150):
                name = NAMES[(k + i) % len(NAMES)]
                if k % 2:
                    with st.patched(name):
                        # held by this context: must be on, whatever the others do
                        assert _registry.is_active(name)
                        x = torch.arange(4)
                        assert int(x[torch.tensor([1])]) == 1
                else:
                    st.patch(name)
                    st.unpatch(name) if i % 3 else st.patch("upsample")
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    # Consistent: every active patch has all its targets wrapped, no inactive one has any.
    for p in _registry.declared():
        applied = {k for k in _registry.iter_applied() if k[0] == p.name}
        assert bool(applied) == _registry.is_active(p.name), p.name
    st.unpatch()
    assert _same(before, _snapshot())


def test_rebound_attribute_is_left_alone_with_a_warning() -> None:
    original = F.upsample
    st.patch("upsample")

    def other(*a: Any, **k: Any) -> Any:
        return None

    F.upsample = other
    try:
        with pytest.warns(SafetorchWarning, match="replaced by another object"):
            st.unpatch("upsample")
        assert F.upsample is other
    finally:
        F.upsample = original


def test_unavailable_implementation_is_refused(monkeypatch) -> None:
    """A patch whose rows name a function this build lacks is listed unavailable, refused."""
    import safetorch.nn

    st.convert_sync_batchnorm  # noqa: B018  # bound in the facade: both places must lose it
    monkeypatch.delattr(safetorch.nn, "convert_sync_batchnorm")
    monkeypatch.delitem(vars(st), "convert_sync_batchnorm")
    info = [p for p in st.patches() if p.name == "syncbn"][0]
    assert not info.available
    with pytest.raises(NotImplementedError, match="st.convert_sync_batchnorm"):
        st.patch("syncbn")
    assert not _registry.is_active("syncbn")
    assert st.patch("upsample") == ["upsample"]  # the others still patch


def test_post_import_hook_patches_a_module_imported_later(tmp_path, monkeypatch) -> None:
    pkg = tmp_path / "st_hook_target_mod.py"
    pkg.write_text("def f(x):\n    return x + 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    calls: List[Any] = []

    def wrapper(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        calls.append(args)
        return wrapped(*args, **kwargs) * 10

    fake = _registry.Patch(
        name="fake_hook", targets=(_registry.Target("st_hook_target_mod", "f", wrapper),)
    )
    _registry.declare(fake)
    try:
        assert "st_hook_target_mod" not in sys.modules
        st.patch("fake_hook")
        assert _registry.pending_modules() == ["st_hook_target_mod"]
        assert any(isinstance(f, PostImportFinder) for f in sys.meta_path)
        import st_hook_target_mod as mod  # type: ignore[import-not-found]

        assert mod.f(1) == 20 and calls == [(1,)]
        assert not isinstance(mod.__loader__, HookLoader)  # real loader restored
        assert _registry.pending_modules() == []
        assert not any(isinstance(f, PostImportFinder) for f in sys.meta_path)
        st.unpatch("fake_hook")
        assert mod.f(1) == 2
        # Unpatching before the import removes the hook: nothing happens at import.
        del sys.modules["st_hook_target_mod"]
        st.patch("fake_hook")
        st.unpatch("fake_hook")
        assert _registry.pending_modules() == []
        import st_hook_target_mod as mod2  # type: ignore[import-not-found]

        assert mod2.f(1) == 2
    finally:
        _registry.disable(["fake_hook"])
        _registry.undeclare("fake_hook")
        sys.modules.pop("st_hook_target_mod", None)


def test_reentry_guard_routes_nested_calls_to_the_original() -> None:
    assert not _routing.nested("x")
    with _routing.reentry("x") as inner:
        assert not inner and _routing.nested("x")
        with _routing.reentry("x") as inner2:
            assert inner2
        assert _routing.nested("x")
    assert not _routing.nested("x")


def test_call_site_and_counts() -> None:
    st.patch("upsample")
    x = torch.ones(1, 1, 2, 2)
    for _ in range(3):
        F.upsample(x, scale_factor=2)  # line of the first call site
    line = sys._getframe().f_lineno - 1
    (entry,) = _registry.report_entries()
    assert entry.count == 3 and entry.kind == "F.upsample -> st.upsample"
    assert entry.first_site == f"{__file__}:{line}"


def test_import_never_patches() -> None:
    code = textwrap.dedent(
        """
        import sys, torch, torch.nn.functional as F
        before = {id(F.upsample), id(torch.load), id(torch.nn.Module.load_state_dict)}
        had = "__getitem__" in vars(torch.Tensor)
        meta = len(sys.meta_path)
        import safetorch, safetorch.patching, safetorch.patching._registry  # every declaration
        after = {id(F.upsample), id(torch.load), id(torch.nn.Module.load_state_dict)}
        assert before == after and not had and "__getitem__" not in vars(torch.Tensor)
        assert len(sys.meta_path) == meta
        assert safetorch.patching._registry.active_names() == []
        print("ok")
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=_env()
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def _env() -> Dict[str, str]:
    import os

    env = dict(os.environ)
    env.pop("SAFETORCH_PATCH", None)
    return env


def test_handlers_of_several_patches_share_one_wrapper_in_declaration_order() -> None:
    """Three patches on one attribute: one wrapper, each later-declared handler around the
    earlier ones whatever the patching order, the original back exactly with the last."""
    import types

    mod = types.ModuleType("st_shared_target_mod")
    mod.f = lambda x: x  # type: ignore[attr-defined]
    original = mod.f  # type: ignore[attr-defined]
    sys.modules[mod.__name__] = mod

    def tagged(tag: str) -> Any:
        def handler(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
            return f"{tag}({wrapped(*args, **kwargs)})"

        return handler

    names = ["fake_a", "fake_b", "fake_c"]
    for n in names:
        _registry.declare(_registry.Patch(n, (_registry.Target(mod.__name__, "f", tagged(n)),)))
    try:
        for order in (names, names[::-1], ["fake_b", "fake_c", "fake_a"]):
            st.patch(order[0])
            wrapper = mod.f  # type: ignore[attr-defined]
            for n in order[1:]:
                st.patch(n)
            assert mod.f is wrapper and mod.f.__wrapped__ is original  # type: ignore[attr-defined]
            assert mod.f(1) == "fake_c(fake_b(fake_a(1)))"  # type: ignore[attr-defined]
            st.unpatch("fake_b")
            assert mod.f is wrapper and mod.f(1) == "fake_c(fake_a(1))"  # type: ignore[attr-defined]
            st.unpatch("fake_c")
            assert mod.f(1) == "fake_a(1)"  # type: ignore[attr-defined]
            st.unpatch("fake_a")
            assert mod.f is original and "f" in vars(mod)  # type: ignore[attr-defined]
    finally:
        _registry.disable(names)
        for n in names:
            _registry.undeclare(n)
        sys.modules.pop(mod.__name__, None)
