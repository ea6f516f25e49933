"""PyTorch integration: ``torch.library`` custom ops with fake (meta) kernels and autograd.

Every op here is registered as ``baracuda::<name>``, so ``torch.compile`` treats it as one
opaque node (no graph break), and its ``register_fake`` gives shapes to the tracer. The
CUDA implementation calls :mod:`baracuda_numba.ops`, which launches on torch's current
stream and allocates with torch's caching allocator, so the ops can be captured in CUDA
graphs. Backward formulas are the backward plans, fed with the tensors the seeds say
they need.

In eager mode the public functions skip the ``torch.library`` dispatcher (its host cost
per call is a multiple of a launch) and go through an equivalent
``torch.autograd.Function``; under ``torch.compile`` they call the custom ops.

One module per op family (``torch/<family>.py``); what they share is in
``torch/_core.py``. Importing this package imports torch; ``import baracuda_numba``
alone does not.
"""

from __future__ import annotations

from . import nn  # noqa: F401  (bt.nn; not in __all__: a star import must keep torch.nn)
from .cross_entropy import cross_entropy, fused_linear_cross_entropy
from .fractional_max_pool import fractional_max_pool2d, fractional_max_pool3d
from .gated_activation import geglu, glu, reglu, swiglu
from .normalization import layer_norm, rms_norm
from .reduce import amax, amin, argmax, argmin, logsumexp, mean, norm, prod, std, sum, var
from .rope import rope
from .scan import cummax, cummin, cumprod, cumsum, logcumsumexp
from .softmax import log_softmax, softmax
from .write_slice import write_slice_

__all__ = [
    "log_softmax", "softmax",
    "amax", "amin", "argmax", "argmin", "cross_entropy", "cummax", "cummin", "cumprod", "cumsum",
    "fractional_max_pool2d", "fractional_max_pool3d", "fused_linear_cross_entropy",
    "geglu", "glu", "reglu", "swiglu",
    "layer_norm", "logcumsumexp", "logsumexp",
    "mean", "norm", "prod", "rms_norm", "rope", "std", "sum", "var", "write_slice_",
]
