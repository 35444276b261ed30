"""safetorch: drop-in safe wrappers for PyTorch's well-known pitfalls, without the slowdown.

Use it as ``import safetorch as st``. Importing never patches anything; monkeypatch mode is
opt-in (``st.patch()`` / ``safetorch run``).
"""

from safetorch import checkpoint, data, device, errors, findings, nn, patching, tensor, timing
from safetorch._device import accelerator_available, get_index_check, set_index_check
from safetorch.checkpoint import *  # noqa: F403
from safetorch.data import *  # noqa: F403
from safetorch.device import *  # noqa: F403
from safetorch.errors import (
    CheckpointError,
    CheckpointFileNotFoundError,
    CheckpointMismatchError,
    DeviceMismatchError,
    IndexOutOfBoundsError,
    SafetorchError,
    SafetorchWarning,
    UnsafeCheckpointError,
)
from safetorch.findings import Finding
from safetorch.nn import *  # noqa: F403
from safetorch.patching import *  # noqa: F403
from safetorch.tensor import *  # noqa: F403
from safetorch.timing import *  # noqa: F403

__version__ = "0.1.0.dev0"

__all__ = [
    "__version__",
    "accelerator_available",
    "get_index_check",
    "set_index_check",
    "Finding",
    *errors.__all__,
    *tensor.__all__,
    *device.__all__,
    *checkpoint.__all__,
    *nn.__all__,
    *data.__all__,
    *timing.__all__,
    *patching.__all__,
]
