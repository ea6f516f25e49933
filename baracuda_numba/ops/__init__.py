"""Functional API: one-line calls over cached plans, for torch, CuPy and Numba arrays.

Each function builds (on a cache miss only) the descriptor from its arguments, takes the
plan from a bounded, thread-safe cache keyed by the call's static facts, allocates
outputs with the input's own framework on the input's device, and runs on that
framework's current stream unless ``stream=`` is given. Repeated calls with the same
shapes pay only the plan's ``run`` plus an output allocation.

Conventions follow PyTorch: ``dim`` may be negative; reductions take ``keepdim``;
``cummax``/``cummin`` return ``(values, indices)``; ``var``/``std`` take ``correction``.
Backward functions take the forward's saved tensors as the seeds define them.

One module per op family (``ops/<family>.py``); what they share is in ``ops/_core.py``.
"""

from __future__ import annotations

from ._core import cache_info, clear_plan_cache, plan_for
from .fractional_max_pool import (
    fractional_max_pool2d,
    fractional_max_pool2d_backward,
    fractional_max_pool3d,
    fractional_max_pool3d_backward,
)
from .reduce import (
    amax,
    amin,
    argmax,
    argmin,
    logsumexp,
    mean,
    norm,
    prod,
    reduce_backward,
    std,
    sum,
    var,
)
from .rope import rope, rope_backward
from .scan import cummax, cummin, cumprod, cumsum, logcumsumexp, scan_backward
from .write_slice import write_slice

__all__ = [
    "amax", "amin", "argmax", "argmin", "cache_info", "clear_plan_cache", "cummax", "cummin",
    "cumprod", "cumsum", "fractional_max_pool2d", "fractional_max_pool2d_backward",
    "fractional_max_pool3d", "fractional_max_pool3d_backward", "logcumsumexp", "logsumexp",
    "mean", "norm", "plan_for", "prod", "reduce_backward", "rope", "rope_backward",
    "scan_backward", "std", "sum", "var", "write_slice",
]
