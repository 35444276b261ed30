"""safetorch.nn: upsampling, SyncBatchNorm, model lint, BN recalibration, parallel, pointwise.

Module names differ from the public names they define (``upsampling`` defines ``upsample``),
so ``safetorch.nn.<module>`` never gets shadowed by a function of the same name.
"""

from safetorch.nn import batchnorm, lint, parallel, pointwise, syncbn, upsampling
from safetorch.nn.batchnorm import *  # noqa: F403
from safetorch.nn.lint import *  # noqa: F403
from safetorch.nn.parallel import *  # noqa: F403
from safetorch.nn.pointwise import *  # noqa: F403
from safetorch.nn.syncbn import *  # noqa: F403
from safetorch.nn.upsampling import *  # noqa: F403

__all__ = (
    upsampling.__all__
    + syncbn.__all__
    + lint.__all__
    + batchnorm.__all__
    + parallel.__all__
    + pointwise.__all__
)
