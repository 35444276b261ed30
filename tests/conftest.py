"""Shared fixtures: simulated older torch, index-check mode, hypothesis profile, one-rank
process groups, and the opt-in per-test deadline (``SAFETORCH_TEST_DEADLINE``)."""

from __future__ import annotations

import contextlib
import faulthandler
import gc
import os
import signal
import subprocess
import sys
import threading
import weakref
from pathlib import Path
from typing import IO, Any, Callable, ContextManager, Generator, Iterator, Optional

import pytest
from hypothesis import HealthCheck, settings

from safetorch import _compat, _device

# The shared hypothesis strategies (tests/_strategies.py): --import-mode=importlib puts no test
# folder on sys.path, so test files import them as `from _strategies import ...` through this.
if str(Path(__file__).parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).parent))

# Shared CI machines are noisy: no per-example deadline. Property tests that must reach a
# number of examples set max_examples themselves.
settings.register_profile(
    "safetorch",
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=os.environ.get("SAFETORCH_HYPOTHESIS_RANDOM") is None,
)
settings.load_profile("safetorch")


@pytest.fixture(autouse=True)
def _private_trust_ledger(tmp_path_factory: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test has its own trust ledger (``XDG_STATE_HOME``): nothing is written to the
    user's own, no test sees what another trusted, and no run-scoped trust leaks in."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path_factory.mktemp("state")))
    monkeypatch.delenv("SAFETORCH_TRUST", raising=False)


@pytest.fixture
def simulate_torch() -> Callable[..., ContextManager[None]]:
    """Simulate an older torch: ``with simulate_torch(LOAD_HAS_MMAP=False): ...``.

    Sets the given ``_compat`` flags and re-selects every module's import-time branch; both
    are restored on exit.
    """
    return _compat.override


@pytest.fixture
def index_check_always() -> Iterator[None]:
    """Run the device-check path (the CUDA path) on CPU tensors."""
    previous = _device.set_mode("always")
    try:
        yield
    finally:
        _device.set_mode(previous)


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


requires_cuda = pytest.mark.skipif(not _cuda_available(), reason="needs a CUDA device")


# --- one-rank process groups in the pytest process -------------------------------------------
@contextlib.contextmanager
def one_rank_process_group(backend: str, rendezvous: Path) -> Iterator[None]:
    """A default process group of one rank, torn down so that nothing outlives it.

    Meant for a fixture: the test's locals (tensors, autograd graphs, modules) are freed when
    the test returns, before the fixture's teardown; ``gc.collect()`` frees any cycle that
    still holds one, and only then is the group destroyed, so its last reference goes in
    ``destroy_process_group()`` and never inside a tensor deallocation (issue 27: a graph
    that owned a destroyed gloo group deadlocked in ``~ProcessGroupGloo``). A passing test
    that leaves something holding the group fails its teardown. Also restores
    ``sys.excepthook``, which torch >= 2.2's ``init_process_group`` replaces.
    """
    import torch.distributed as dist

    saved_excepthook = sys.excepthook
    failure_before = getattr(sys, "last_value", None)  # pytest sets it when a test fails
    dist.init_process_group(backend, init_method=f"file://{rendezvous}", rank=0, world_size=1)
    group = weakref.ref(dist.group.WORLD)
    try:
        yield
    finally:
        gc.collect()
        dist.destroy_process_group()
        gc.collect()
        sys.excepthook = saved_excepthook
    if group() is not None and getattr(sys, "last_value", None) is failure_before:
        pytest.fail(
            f"the {backend} process group is still referenced after destroy_process_group(): "
            f"{[type(r).__name__ for r in gc.get_referrers(group())]} hold it; drop every "
            "tensor, graph and module that holds it before the teardown"
        )


@pytest.fixture
def one_rank_gloo(tmp_path: Path) -> Iterator[None]:
    """A single-rank gloo default process group for one test (``dist.group.WORLD``)."""
    with one_rank_process_group("gloo", tmp_path / "rdv"):
        yield


@pytest.fixture
def one_rank_nccl(tmp_path: Path) -> Iterator[None]:
    """A single-rank NCCL default process group for one test (``dist.group.WORLD``)."""
    with one_rank_process_group("nccl", tmp_path / "rdv"):
        yield


# --- opt-in per-test deadline: SAFETORCH_TEST_DEADLINE=<seconds> -----------------------------
# Off unless the variable is set (tools/compat.sh sets it for every row; `make test` does not).
# Two layers, because a hang that holds the GIL (a destructor joining a thread) never runs any
# Python again:
# * at the deadline, SIGALRM raises pytest's failure in the main thread, naming the test; this
#   works whenever the test is still running Python or waits interruptibly (sleep, a child
#   process, a lock), and the run goes on with the next test;
# * a watchdog process (it needs no GIL of ours) still seeing the test after the deadline plus
#   a grace period writes the test's node id to stderr and sends SIGABRT; faulthandler then
#   dumps every thread's stack and the run ends with a failing status.
_WATCHDOG = r"""
import os, select, signal, sys, time
pid, out = int(sys.argv[1]), os.fdopen(int(sys.argv[2]), "w")
armed = None
buf = b""
while True:
    wait = None if armed is None else max(0.0, armed[0] - time.monotonic())
    ready, _, _ = select.select([0], [], [], wait)
    if not ready:
        out.write("\n\nsafetorch test deadline: %s is still running after %s s "
                  "(SAFETORCH_TEST_DEADLINE plus grace) and does not return to Python (a "
                  "hang holding the GIL?): SIGABRT to pytest (pid %d), faulthandler dumps "
                  "every thread\n\n" % (armed[1], armed[2], pid))
        out.flush()
        os.kill(pid, signal.SIGABRT)
        for _ in range(100):  # while pytest is still our parent (never a reused pid)
            if os.getppid() != pid:
                sys.exit(0)
            time.sleep(0.1)
        os.kill(pid, signal.SIGKILL)
        sys.exit(0)
    data = os.read(0, 65536)
    if not data:
        sys.exit(0)
    buf += data
    while b"\n" in buf:
        line, buf = buf.split(b"\n", 1)
        parts = line.decode().split(" ", 2)
        if parts[0] == "exit":
            sys.exit(0)
        armed = None if parts[0] == "disarm" else (
            time.monotonic() + float(parts[1]), parts[2], parts[1])
"""


class _Deadline:
    """The per-test deadline plugin (registered by :func:`pytest_configure` when enabled)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.grace = max(30.0, seconds / 2)
        self.stderr: IO[str] = os.fdopen(os.dup(sys.__stderr__.fileno()), "w")  # past capture
        if not faulthandler.is_enabled():
            faulthandler.enable(file=self.stderr, all_threads=True)
        self.watchdog = subprocess.Popen(
            [sys.executable, "-c", _WATCHDOG, str(os.getpid()), str(self.stderr.fileno())],
            stdin=subprocess.PIPE,
            pass_fds=(self.stderr.fileno(),),
        )
        self.nodeid: Optional[str] = None

    def _send(self, line: str) -> None:
        assert self.watchdog.stdin is not None
        self.watchdog.stdin.write(line.encode() + b"\n")
        self.watchdog.stdin.flush()

    def _expired(self, signum: int, frame: Any) -> None:
        faulthandler.dump_traceback(file=self.stderr, all_threads=True)
        pytest.fail(
            f"{self.nodeid} exceeded the test deadline (SAFETORCH_TEST_DEADLINE="
            f"{self.seconds:g} s); every thread's stack is on stderr",
            pytrace=True,
        )

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Generator[None, None, None]:
        self.nodeid = item.nodeid
        use_alarm = threading.current_thread() is threading.main_thread()
        previous: Any = None
        if use_alarm:
            previous = signal.signal(signal.SIGALRM, self._expired)
            signal.setitimer(signal.ITIMER_REAL, self.seconds)
        self._send(f"arm {self.seconds + self.grace:g} {item.nodeid}")
        try:
            yield
        finally:
            if use_alarm:
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, previous)
            self._send("disarm")

    def pytest_unconfigure(self) -> None:
        # "exit", not only EOF: a process forked by a test (os.fork, multiprocessing's fork
        # start) inherits the pipe's write end, and one still alive would keep EOF away.
        try:
            self._send("exit")
        except (BrokenPipeError, ValueError):
            pass  # already gone
        if self.watchdog.stdin is not None:
            self.watchdog.stdin.close()
        try:
            self.watchdog.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.watchdog.kill()
            self.watchdog.wait()


def _deadline_seconds() -> Optional[float]:
    raw = os.environ.get("SAFETORCH_TEST_DEADLINE", "").strip()
    if not raw:
        return None
    try:
        seconds = float(raw)
    except ValueError:
        raise pytest.UsageError(
            f"SAFETORCH_TEST_DEADLINE must be a number of seconds, got {raw!r}"
        ) from None
    return seconds if seconds > 0 else None


def pytest_configure(config: pytest.Config) -> None:
    seconds = _deadline_seconds()
    if seconds is not None and hasattr(signal, "SIGALRM"):  # POSIX only
        config.pluginmanager.register(_Deadline(seconds), "safetorch-test-deadline")
