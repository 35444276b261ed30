"""RNG state for exact resume: captured as plain data, validated completely before it is applied.

:func:`capture_rng` turns this process's RNG states (python ``random``, numpy when imported,
torch CPU, every CUDA device once CUDA is initialized) into ints, tuples and bytes, which
weights-only loading rebuilds and which travel between ranks without pickling any object.

A state read back from a file is untrusted input: numpy's legacy ``set_state`` takes ``pos``
unchecked (an out-of-range ``pos`` makes the next ``np.random`` call read outside the key
array, or crash), ``random.setstate`` accepts other versions and out-of-range words, and a
torch state that is not bytes can allocate gigabytes. :func:`check_rng` therefore checks every
part for type, size and range (and then loads it into a throwaway generator, so whatever the
library itself rejects is found too) before anything is applied, and :func:`restore_rng`
applies all parts or none.
"""

from __future__ import annotations

import logging
import random
import sys
from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Tuple

import torch

from safetorch.checkpoint._bytes import tensor_bytes
from safetorch.errors import CheckpointError

__all__ = ["capture_rng", "check_rng", "check_rng_table", "restore_rng", "RNGState"]

_log = logging.getLogger("safetorch")

_MT_N = 624  # words in a Mersenne Twister state (python random and numpy MT19937)
_PY_VERSION = 3  # random.getstate()[0] on every supported python
_NP_KEY_BYTES = _MT_N * 4  # numpy MT19937 key: 624 uint32, saved little-endian
PARTS = ("python", "numpy", "torch", "cuda")
_torch_state_bytes: Optional[int] = None


def torch_state_bytes() -> int:
    """The size of ``torch.get_rng_state()`` on this torch (computed once)."""
    global _torch_state_bytes
    if _torch_state_bytes is None:
        _torch_state_bytes = int(torch.get_rng_state().numel())
    return _torch_state_bytes


def _byte_tensor(data: bytes) -> torch.Tensor:
    """A uint8 tensor over a copy of ``data`` (validated bytes only: never an int)."""
    if not isinstance(data, bytes):
        raise TypeError(f"expected bytes, got {type(data).__name__}")
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _show(value: Any, limit: int = 80) -> str:
    """A short description of a bad value for an error message (never the whole value)."""
    if isinstance(value, (bytes, bytearray, list, tuple, dict)):
        return f"a {type(value).__name__} of length {len(value)}"
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({type(value).__name__})"


class RNGState(NamedTuple):
    """A validated RNG state, each part ready to apply (``None``: absent or skipped here)."""

    python: Optional[Tuple[int, Tuple[int, ...], Optional[float]]]
    numpy: Optional[Tuple[str, bytes, int, int, float]]
    torch: Optional[bytes]
    cuda: Optional[List[bytes]]


def capture_rng() -> Dict[str, Any]:
    """This process's RNG states as plain data (ints, tuples, bytes): weights-only loading
    rebuilds it, and it travels between ranks without pickling any object.

    >>> from safetorch.checkpoint._rng import capture_rng
    >>> {"python", "torch"} <= set(capture_rng())
    True
    """
    state: Dict[str, Any] = {
        "python": random.getstate(),
        "torch": tensor_bytes(torch.get_rng_state()),
    }
    np = sys.modules.get("numpy")
    if np is not None:
        name, keys, pos, has_gauss, cached = np.random.get_state()
        state["numpy"] = (name, keys.astype("<u4").tobytes(), pos, has_gauss, float(cached))
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = [tensor_bytes(s) for s in torch.cuda.get_rng_state_all()]
    return state


# --- validation --------------------------------------------------------------------------------
def _fail(where: str, part: str, got: Any, expected: str) -> CheckpointError:
    return CheckpointError(
        f"{where}: bad {part} RNG state: got {_show(got)}, expected {expected}; the file is "
        "corrupt or was not written by st.save_state (nothing was restored)"
    )


def _sequence(value: Any, length: int) -> bool:
    return isinstance(value, (tuple, list)) and len(value) == length


def _check_python(value: Any, where: str) -> Tuple[int, Tuple[int, ...], Optional[float]]:
    form = (
        f"(version {_PY_VERSION}, a tuple of {_MT_N + 1} ints: {_MT_N} words 0 <= w < 2**32 "
        f"and an index 0..{_MT_N}, gauss None or a float), as random.getstate() returns"
    )
    if not _sequence(value, 3):
        raise _fail(where, "python", value, form)
    version, internal, gauss = value
    if not _is_int(version) or version != _PY_VERSION:
        raise _fail(where, "python", version, f"version {_PY_VERSION} in {form}")
    if not _sequence(internal, _MT_N + 1):
        raise _fail(where, "python", internal, form)
    for i, word in enumerate(internal):
        top = _MT_N if i == _MT_N else 2**32 - 1
        if not _is_int(word) or not 0 <= word <= top:
            what = "the index" if i == _MT_N else f"word {i}"
            raise _fail(where, "python", word, f"{what} an int in 0..{top} in {form}")
    if gauss is not None and not isinstance(gauss, float):
        raise _fail(where, "python", gauss, f"gauss None or a float in {form}")
    return (version, tuple(internal), gauss)


def _check_numpy(value: Any, where: str) -> Tuple[str, bytes, int, int, float]:
    form = (
        f"('MT19937', keys: bytes of length {_NP_KEY_BYTES}, pos: an int 0..{_MT_N}, "
        "has_gauss: 0 or 1, cached_gaussian: a float)"
    )
    if not _sequence(value, 5):
        raise _fail(where, "numpy", value, form)
    name, keys, pos, has_gauss, cached = value
    if name != "MT19937" or not isinstance(name, str):
        raise _fail(where, "numpy", name, f"the name 'MT19937' in {form}")
    if not isinstance(keys, bytes) or len(keys) != _NP_KEY_BYTES:
        raise _fail(where, "numpy", keys, f"keys bytes of length {_NP_KEY_BYTES} in {form}")
    if not _is_int(pos) or not 0 <= pos <= _MT_N:
        raise _fail(where, "numpy", pos, f"pos an int 0..{_MT_N} in {form}")
    if not _is_int(has_gauss) or has_gauss not in (0, 1):
        raise _fail(where, "numpy", has_gauss, f"has_gauss 0 or 1 in {form}")
    if not isinstance(cached, float):
        raise _fail(where, "numpy", cached, f"cached_gaussian a float in {form}")
    return (name, keys, pos, has_gauss, cached)


def _check_torch(value: Any, where: str) -> bytes:
    size = torch_state_bytes()
    if not isinstance(value, bytes) or len(value) != size:
        raise _fail(where, "torch CPU", value, f"bytes of length {size} (torch.get_rng_state())")
    return value


def _check_cuda(value: Any, where: str) -> Optional[List[bytes]]:
    form = "a list of bytes, one torch.cuda.get_rng_state() per device"
    if not isinstance(value, list) or not all(isinstance(b, bytes) for b in value):
        raise _fail(where, "cuda", value, form)
    if not torch.cuda.is_available() or len(value) != torch.cuda.device_count():
        return None  # saved on another machine: this process keeps its CUDA states
    size = int(torch.cuda.get_rng_state().numel())
    for i, data in enumerate(value):
        if len(data) != size:
            raise _fail(where, f"cuda:{i}", data, f"bytes of length {size} in {form}")
    return list(value)


def _trial(state: RNGState, where: str) -> None:
    """Load each part into a throwaway generator: what the library rejects is found here,
    before any global generator changes (the checks above rule out what it would not catch)."""
    part = "python"
    try:
        if state.python is not None:
            random.Random().setstate(state.python)
        np = sys.modules.get("numpy")
        if np is not None and state.numpy is not None:
            part = "numpy"
            name, keys, pos, has_gauss, cached = state.numpy
            keys_array = np.frombuffer(keys, dtype="<u4")
            np.random.RandomState().set_state((name, keys_array, pos, has_gauss, cached))
        if state.torch is not None:
            part = "torch CPU"
            torch.Generator().set_state(_byte_tensor(state.torch))
        if state.cuda is not None:
            part = "cuda"
            scratch = torch.Generator(device="cuda")
            for data in state.cuda:
                scratch.set_state(_byte_tensor(data))
    except Exception as exc:
        raise CheckpointError(
            f"{where}: bad {part} RNG state: the generator rejects it ({exc}); nothing was restored"
        ) from exc


def check_rng(state: Any, where: str = "RNG state") -> RNGState:
    """Validate one process's RNG state (as :func:`capture_rng` returns it) without applying it.

    Args:
        state: a mapping of part name (``python``, ``numpy``, ``torch``, ``cuda``) to that
            part's state; absent parts, and names this version does not know, are skipped.
        where: what the state came from, for error messages (a checkpoint path).

    Returns:
        The validated parts; ``cuda`` is ``None`` where this process cannot use it (no CUDA, or
        another device count), as it is then skipped.

    Raises:
        CheckpointError: a part has the wrong type, size or range (the message names it, the
            value and the expected form).

    >>> from safetorch.checkpoint._rng import capture_rng, check_rng
    >>> check_rng(capture_rng()).torch is not None
    True
    >>> try:
    ...     check_rng({"numpy": ("MT19937", bytes(2496), 10**6, 0, 0.0)})
    ... except RuntimeError as e:
    ...     print(str(e)[:60])
    RNG state: bad numpy RNG state: got 1000000, expected pos an
    """
    if not isinstance(state, Mapping):
        raise CheckpointError(
            f"{where}: bad RNG state: got {_show(state)}, expected a mapping with some of the "
            f"parts {PARTS}"
        )
    checked = RNGState(
        python=_check_python(state["python"], where) if "python" in state else None,
        numpy=_check_numpy(state["numpy"], where) if "numpy" in state else None,
        torch=_check_torch(state["torch"], where) if "torch" in state else None,
        cuda=_check_cuda(state["cuda"], where) if "cuda" in state else None,
    )
    _trial(checked, where)
    return checked


def check_rng_table(rng: Any, where: str) -> Dict[str, RNGState]:
    """Validate a checkpoint's ``rng`` entry: a mapping of rank (``"0"``, ``"1"``, ...) to that
    rank's state. Every rank's state is checked, so a bad file fails on every rank alike.

    Raises:
        CheckpointError: the table or one rank's state is malformed.
    """
    if not isinstance(rng, Mapping):
        raise CheckpointError(
            f"{where}: bad 'rng' entry: got {_show(rng)}, expected a mapping of rank "
            "('0', '1', ...) to that rank's RNG state"
        )
    table: Dict[str, RNGState] = {}
    for rank, state in rng.items():
        if not (isinstance(rank, str) and rank.isascii() and rank.isdigit()):
            raise CheckpointError(
                f"{where}: bad 'rng' entry: the key {_show(rank)} is not a rank ('0', '1', ...)"
            )
        table[rank] = check_rng(state, f"{where} (rank {rank})")
    return table


# --- applying ----------------------------------------------------------------------------------
def _apply(state: RNGState) -> None:
    if state.python is not None:
        random.setstate(state.python)
    np = sys.modules.get("numpy")
    if np is not None and state.numpy is not None:
        name, keys, pos, has_gauss, cached = state.numpy
        np.random.set_state((name, np.frombuffer(keys, dtype="<u4"), pos, has_gauss, cached))
    if state.torch is not None:
        torch.set_rng_state(_byte_tensor(state.torch))
    if state.cuda is not None:
        torch.cuda.set_rng_state_all([_byte_tensor(b) for b in state.cuda])


def apply_rng(state: RNGState, where: str = "RNG state") -> None:
    """Apply a validated state, all parts or none: if one part fails, the parts already set
    get back what they held before, and a CheckpointError is raised."""
    before = capture_rng()
    if state.cuda is not None and "cuda" not in before:  # CUDA not initialized yet
        before["cuda"] = [tensor_bytes(s) for s in torch.cuda.get_rng_state_all()]
    previous = RNGState(
        python=before["python"],
        numpy=before.get("numpy"),
        torch=before["torch"],
        cuda=before.get("cuda") if state.cuda is not None else None,
    )
    try:
        _apply(state)
    except Exception as exc:
        try:
            _apply(previous)
        except Exception:  # pragma: no cover - restoring what the process just held
            _log.exception("safetorch: restoring the previous RNG state failed")
        raise CheckpointError(
            f"{where}: restoring the RNG state failed ({exc}); the previous state is back"
        ) from exc


def restore_rng(state: Any, where: str = "RNG state") -> None:
    """Restore what :func:`capture_rng` captured (parts this process cannot use are skipped).

    The state is validated completely first (:func:`check_rng`) and applied all-or-nothing.

    Raises:
        CheckpointError: the state is malformed (nothing is changed).
    """
    apply_rng(check_rng(state, where), where)
