"""safetorch.nn: upsampling, SyncBatchNorm, model lint, BN recalibration, parallel, pointwise."""

from safetorch.nn import batchnorm, lint, parallel, pointwise, syncbn, upsample
from safetorch.nn.batchnorm import *  # noqa: F403
from safetorch.nn.lint import *  # noqa: F403
from safetorch.nn.parallel import *  # noqa: F403
from safetorch.nn.pointwise import *  # noqa: F403
from safetorch.nn.syncbn import *  # noqa: F403
from safetorch.nn.upsample import *  # noqa: F403

__all__ = (
    upsample.__all__
    + syncbn.__all__
    + lint.__all__
    + batchnorm.__all__
    + parallel.__all__
    + pointwise.__all__
)
