"""``safetorch run`` behaves as ``python SCRIPT``; the legacy example; install-hook."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest

from safetorch._cli import main as cli_main
from safetorch.patching import _hook, _registry, _runner

ROOT = Path(__file__).resolve().parents[2]
LEGACY = ROOT / "examples" / "legacy"
SAFETORCH = [sys.executable, "-m", "safetorch"]

PROBE = textwrap.dedent(
    """
    import json, sys
    print(json.dumps({"argv": sys.argv, "path0": sys.path[0], "file": __file__,
                      "name": __name__, "main_file": sys.modules["__main__"].__file__}))
    if len(sys.argv) > 1 and sys.argv[1] == "exit":
        sys.exit(int(sys.argv[2]))
    if len(sys.argv) > 1 and sys.argv[1] == "message":
        sys.exit("bad things")
    if len(sys.argv) > 1 and sys.argv[1] == "raise":
        def inner():
            raise ValueError("boom")
        inner()
    """
)


def _env(**extra: str) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAFETORCH_")}
    env.update(extra)
    return env


@pytest.fixture
def in_process(monkeypatch) -> Iterator[List[Any]]:
    """Run the runner in this process: argv/path/env restored, atexit handlers captured."""
    registered: List[Any] = []
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setitem(sys.modules, "__main__", sys.modules["__main__"])
    # absent during the test, restored after it: set then deleted, monkeypatch records each
    # as it was, so what the runner sets (the patch list, run-scoped trust) is undone
    for name in ("SAFETORCH_PATCH", "SAFETORCH_TRUST", "SAFETORCH_ALLOW"):
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    monkeypatch.setattr(_runner.atexit, "register", lambda *a: registered.append(a))
    yield registered


@pytest.fixture
def probe(tmp_path) -> Path:
    sub = tmp_path / "sub"
    sub.mkdir()
    path = sub / "probe.py"
    path.write_text(PROBE)
    return path


def _python(script: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    rel = os.path.relpath(script, cwd)
    return subprocess.run(
        [sys.executable, rel, *args], cwd=cwd, capture_output=True, text=True, timeout=60
    )


def test_argv_path_file_and_name_as_python(in_process, probe, capfd, monkeypatch) -> None:
    cwd = probe.parent.parent
    expected = json.loads(_python(probe, "a", "--b", cwd=cwd).stdout)
    monkeypatch.chdir(cwd)
    assert _runner.run("sub/probe.py", ["a", "--b"], report=False) == 0
    got = json.loads(capfd.readouterr().out)
    assert got == expected
    assert os.environ["SAFETORCH_PATCH"] == ",".join(p.name for p in _registry.declared())


@pytest.mark.parametrize("args, code", [(["exit", "3"], 3), (["exit", "0"], 0)])
def test_exit_status_propagates(in_process, probe, args, code) -> None:
    with pytest.raises(SystemExit) as info:
        _runner.run(str(probe), args, report=False)
    assert info.value.code == code == _python(probe, *args, cwd=probe.parent).returncode


def test_exit_message_as_python(in_process, probe) -> None:
    with pytest.raises(SystemExit) as info:
        _runner.run(str(probe), ["message"], report=False)
    assert info.value.code == "bad things"


def test_uncaught_exception_traceback_as_python(in_process, probe, capfd, monkeypatch) -> None:
    # The runner prints through sys.excepthook, as python does. A fresh python has the
    # default hook; this process may not (torch >= 2.2's init_process_group installs a
    # "[rank0]:" prefixer for good), so compare with the hook the subprocess has.
    monkeypatch.setattr(sys, "excepthook", sys.__excepthook__)
    expected = _python(probe, "raise", cwd=probe.parent)
    assert _runner.run(str(probe), ["raise"], report=False) == expected.returncode == 1
    err = capfd.readouterr().err
    assert err.replace(str(probe), "probe.py") == expected.stderr.replace(str(probe), "probe.py")
    assert "_runner.py" not in err and "runpy" not in err


def test_uncaught_exception_goes_through_sys_excepthook(in_process, probe, monkeypatch) -> None:
    seen: List[Any] = []
    monkeypatch.setattr(sys, "excepthook", lambda *info: seen.append(info))
    assert _runner.run(str(probe), ["raise"], report=False) == 1
    ((kind, exc, tb),) = seen
    assert kind is ValueError and str(exc) == "boom"
    assert tb.tb_frame.f_code.co_filename == str(probe)  # runner frames removed


def test_keyboard_interrupt_ends_by_sigint(in_process, tmp_path, monkeypatch, capfd) -> None:
    script = tmp_path / "kb.py"
    script.write_text("raise KeyboardInterrupt\n")
    died: List[bool] = []
    monkeypatch.setattr(_runner, "_die_by_sigint", lambda: died.append(True))
    _runner.run(str(script), [], report=False)
    assert died == [True] and "KeyboardInterrupt" in capfd.readouterr().err


def test_run_module_as_python_m(in_process, tmp_path, monkeypatch, capfd) -> None:
    pkg = tmp_path / "probepkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "tool.py").write_text(PROBE)
    expected = subprocess.run(
        [sys.executable, "-m", "probepkg.tool", "x"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    monkeypatch.chdir(tmp_path)
    assert _runner.run("probepkg.tool", ["x"], module=True, report=False) == 0
    assert json.loads(capfd.readouterr().out) == json.loads(expected.stdout)


def test_names_bound_at_import_are_the_wrappers(in_process, tmp_path, capfd) -> None:
    script = tmp_path / "bound.py"
    script.write_text(
        "from torch.nn.functional import upsample_bilinear\n"
        "print(hasattr(upsample_bilinear, '__wrapped__'))\n"
    )
    _runner.run(str(script), [], patches=["upsample"], report=False)
    assert capfd.readouterr().out.strip() == "True"


def test_report_registered_and_formatted(in_process, tmp_path) -> None:
    script = tmp_path / "up.py"
    script.write_text(
        "import torch, torch.nn.functional as F\nF.upsample(torch.ones(1, 1, 2, 2), scale_factor=2)\n"
    )
    _runner.run(str(script), [], patches=["upsample", "load"])
    ((fn, names),) = in_process
    text = _runner.format_report(names)
    assert "patches on: upsample, load" in text
    assert "1 x F.upsample -> st.upsample" in text and f"{script}:2" in text
    assert "load        no call changed" in text or "load      no call changed" in text


def test_cli_usage_errors(capsys) -> None:
    assert cli_main(["run"]) == 2
    assert cli_main(["run", "--patch", "nope", "x.py"]) == 2
    assert "unknown patch 'nope'" in capsys.readouterr().err


# --- subprocesses: the real command ---------------------------------------------------------
# Each needs a fresh interpreter that imports torch (seconds on a busy 2-core machine): they
# are started together, once, and each test waits for its own.
WORKERS_SCRIPT = textwrap.dedent(
    """
    import torch, torch.nn.functional as F
    from torch.utils.data import DataLoader, Dataset

    class D(Dataset):
        def __len__(self):
            return 2
        def __getitem__(self, i):
            return torch.tensor(hasattr(F.upsample, "__wrapped__"))

    if __name__ == "__main__":
        loader = DataLoader(D(), batch_size=2, num_workers=1, multiprocessing_context="spawn")
        it = iter(loader)
        print("workers patched:", bool(next(it).all()))
        # Shut the worker down now, not at interpreter exit: a worker killed during shutdown
        # can leave its queue's semaphore to the resource tracker, which then warns on stderr
        # ("leaked semaphore objects") in a run or two out of ten on a loaded machine.
        del it
    """
)
HOOK_CODE = (
    "import site, sys; site.addsitedir(sys.argv[1]); "
    "import torch.nn.functional as F; print(hasattr(F.upsample, '__wrapped__'))"
)


class _Procs:
    def __init__(self, tmp: Path) -> None:
        (tmp / "workers.py").write_text(WORKERS_SCRIPT)
        self.hook_dir = tmp / "site"
        self.hook_dir.mkdir()
        self.pth = _hook.install(str(self.hook_dir))
        self._procs: Dict[str, subprocess.Popen] = {}
        self._done: Dict[str, subprocess.CompletedProcess] = {}
        self._start("fixed", [sys.executable, str(LEGACY / "train_fixed.py")], _env())
        self._start("legacy", [*SAFETORCH, "run", str(LEGACY / "train_legacy.py")], _env())
        workers = [*SAFETORCH, "run", "--no-report", "--patch", "upsample", str(tmp / "workers.py")]
        self._start("workers", workers, _env())
        hook_cmd = [sys.executable, "-c", HOOK_CODE, str(self.hook_dir)]
        self._start("hook_on", hook_cmd, _env(SAFETORCH_PATCH="upsample,load"))

    def _start(self, key: str, cmd: List[str], env: Dict[str, str]) -> None:
        self._procs[key] = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )

    def result(self, key: str) -> subprocess.CompletedProcess:
        if key not in self._done:
            proc = self._procs[key]
            out, err = proc.communicate(timeout=240)
            self._done[key] = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
        return self._done[key]

    def close(self) -> None:
        for proc in self._procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.communicate()


@pytest.fixture(scope="module")
def procs(tmp_path_factory) -> Iterator[_Procs]:
    p = _Procs(tmp_path_factory.mktemp("run"))
    try:
        yield p
    finally:
        p.close()


@pytest.mark.slow
def test_legacy_example_matches_hand_fixed_and_reports_each_fix(procs) -> None:
    fixed, legacy = procs.result("fixed"), procs.result("legacy")
    assert fixed.returncode == 0, fixed.stderr
    assert legacy.returncode == 0, legacy.stderr
    assert legacy.stdout == fixed.stdout
    report = legacy.stderr
    for fix in (
        "F.upsample_bilinear -> st.upsample_bilinear",
        "torch.load -> st.load",
        "load_state_dict: dropped wrapper segment(s) 'module.'",
        "DataLoader(pin_memory=True) without accelerator",
        "convert_sync_batchnorm -> st.convert_sync_batchnorm",
    ):
        assert fix in report, (fix, report)
    assert "first at examples/legacy/train_legacy.py:" in report
    assert "Warning" not in report  # no deprecation or pin_memory warning left


@pytest.mark.slow
def test_spawn_dataloader_workers_are_patched(procs) -> None:
    out = procs.result("workers")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "workers patched: True"
    # On a loaded machine torch's DataLoader may terminate a worker that has not exited within
    # its join timeout, and Python's resource tracker then warns about the worker queue's
    # semaphore at shutdown (~1 run of this file in 12 under its concurrent subprocesses; 0 in
    # 16 isolated runs each of plain python and safetorch run). That warning is about torch's
    # worker shutdown, not about the patches; anything else on stderr fails the test.
    lines = [line for line in out.stderr.splitlines() if "resource_tracker" not in line]
    assert lines == [], out.stderr


def test_spawn_command_line_gets_the_bootstrap() -> None:
    import multiprocessing.spawn as spawn

    original = spawn.get_command_line
    with _runner._SpawnBootstrap():
        cmd = spawn.get_command_line(tracker_fd=3, pipe_handle=4)
    assert spawn.get_command_line is original
    prog = cmd[cmd.index("-c") + 1]
    assert prog.startswith("import safetorch.patching._boot; from multiprocessing.spawn")


@pytest.mark.slow
def test_install_hook_activates_by_environment(procs) -> None:
    on = procs.result("hook_on")
    assert on.stdout.strip() == "True", on.stderr
    # Without the variable the hook line does nothing: safetorch is not even imported.
    off = subprocess.run(
        [
            sys.executable,
            "-c",
            "import site, sys; site.addsitedir(sys.argv[1]); print('safetorch' in sys.modules)",
            str(procs.hook_dir),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=_env(),
    )
    assert off.stdout.strip() == "False", off.stderr
    assert _hook.install(str(procs.hook_dir)) == procs.pth  # idempotent
    assert _hook.uninstall(str(procs.hook_dir)) == procs.pth
    assert _hook.uninstall(str(procs.hook_dir)) is None
    assert not Path(procs.pth).exists()


def test_boot_ignores_a_bad_value(monkeypatch, capsys) -> None:
    import importlib

    monkeypatch.delenv("SAFETORCH_PATCH", raising=False)
    import safetorch.patching._boot as boot

    monkeypatch.setenv("SAFETORCH_PATCH", "nonsense")
    importlib.reload(boot)
    assert "SAFETORCH_PATCH='nonsense' ignored" in capsys.readouterr().err
    assert _registry.active_names() == []


def test_install_hook_cli(tmp_path, capsys) -> None:
    assert cli_main(["install-hook", "--dir", str(tmp_path)]) == 0
    assert (tmp_path / _hook.PTH_NAME).read_text() == _hook.PTH_LINE
    assert cli_main(["uninstall-hook", "--dir", str(tmp_path)]) == 0
    assert "removed" in capsys.readouterr().out
