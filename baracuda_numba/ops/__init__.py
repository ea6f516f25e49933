"""Functional API: one-line calls over cached plans, for torch, CuPy and Numba arrays.

Each function builds (on a cache miss only) the descriptor from its arguments, takes the
plan from a bounded, thread-safe cache keyed by the call's static facts, allocates
outputs with the input's own framework on the input's device, and runs on that
framework's current stream unless ``stream=`` is given. Repeated calls with the same
shapes pay only the plan's ``run`` plus an output allocation.

Conventions follow PyTorch: ``dim`` may be negative; reductions take ``keepdim`` and
``dim`` as one axis, several (a tuple or list) or None (every axis);
``cummax``/``cummin`` return ``(values, indices)``; ``var``/``std`` take ``correction``.
Backward functions take the forward's saved tensors as the seeds define them.

One module per op family (``ops/<family>.py``); what they share is in ``ops/_core.py``.
"""

from __future__ import annotations

from ._core import cache_info, clear_plan_cache, plan_for
from .cross_entropy import cross_entropy, cross_entropy_backward
from .fractional_max_pool import (
    fractional_max_pool2d,
    fractional_max_pool2d_backward,
    fractional_max_pool3d,
    fractional_max_pool3d_backward,
)
from .gated_activation import (
    geglu,
    geglu_backward,
    glu,
    glu_backward,
    reglu,
    reglu_backward,
    swiglu,
    swiglu_backward,
)
from .normalization import layer_norm, layer_norm_backward, rms_norm, rms_norm_backward
from .reduce import (
    AxisLayout,
    amax,
    amin,
    argmax,
    argmin,
    axis_layout,
    logsumexp,
    mean,
    norm,
    prod,
    reduce_axes,
    reduce_backward,
    std,
    sum,
    var,
)
from .rope import rope, rope_backward, rope_cache_write
from .scan import cummax, cummin, cumprod, cumsum, logcumsumexp, scan_backward
from .softmax import log_softmax, softmax, softmax_backward
from .write_slice import write_slice

__all__ = [
    "log_softmax", "softmax", "softmax_backward",
    "AxisLayout", "amax", "amin", "argmax", "argmin", "axis_layout", "cache_info",
    "clear_plan_cache", "cross_entropy", "cross_entropy_backward",
    "cummax", "cummin", "cumprod", "cumsum", "fractional_max_pool2d",
    "fractional_max_pool2d_backward", "fractional_max_pool3d", "fractional_max_pool3d_backward",
    "geglu", "geglu_backward", "glu", "glu_backward", "reglu", "reglu_backward", "swiglu",
    "swiglu_backward",
    "layer_norm", "layer_norm_backward", "logcumsumexp", "logsumexp", "mean", "norm",
    "plan_for", "prod", "reduce_axes", "reduce_backward", "rms_norm", "rms_norm_backward",
    "rope", "rope_backward", "rope_cache_write", "scan_backward", "std", "sum", "var",
    "write_slice",
]
