"""Fractional max pooling, 2-D and 3-D (2-D runs as 3-D with one depth slice).

Forward, for every output cell ``o = (n, c, od, oh, ow)``::

    start_a(o_a) = window start on axis a (see below), window k_a
    y[o]       = max over the window x[n, c, sd:sd+kd, sh:sh+kh, sw:sw+kw]
    indices[o] = ((n*C + c)*D_in + d)*H_in*W_in + h*W_in + w   of that maximum

The max walks the window in row-major order: ties go to the first element, and the
first NaN met wins (NaN propagates). f16/bf16 compare in f32 (exact), f32/f64 natively.
``indices`` are linear offsets into the *logical* (row-major) input tensor, whatever
the strides of ``x`` (upstream's convention; PyTorch stores per-plane offsets instead).

Backward (gather; no atomics, every ``dx`` element written)::

    dx[i] = sum of dy[o] over outputs o whose window contains i and indices[o] == i

Window starts are monotone in the output index and, for a sample in [0, 1), lie within a
band around ``base(o) = o * (in - k) // (out - 1)`` that does not depend on the sample.
So on each axis the outputs whose window *may* contain coordinate ``c`` form a
contiguous range computed in closed form with integers (``candidate_outputs``), and the
backward needs neither the samples nor a search. Candidates whose window does not
contain ``i`` never saved ``i`` and do not match. The sum runs over ``(od, oh, ow)`` in
ascending order, in f32 for f16/bf16 (f64 for f64): deterministic and bit-stable. An
index that does not point into its own output's window is never matched (ignored).

Window placement, per axis with ``max_start = in - k`` (both clamp to ``[0, max_start]``;
samples are first clamped into ``[0, 1)``, NaN -> 0, as the ABI requires uniforms there):

* BARACUDA (upstream's formula, evaluated exactly): ``out == 1``:
  ``floor(alpha * max_start)``; otherwise ``floor(o * max_start / (out - 1) + alpha)``.
  Exact rational arithmetic: ``o * max_start = q*(out-1) + r``, and the fractional part
  adds one iff ``alpha * (out-1) >= (out-1) - r``, decided by the sign of one f64 FMA
  (exact: alpha has 24 significant bits).
* TORCH (``torch.nn.functional.fractional_max_pool{2,3}d`` on CUDA, given the same
  samples): ``step = (in - k) / (out - 1)``, ``start = int((o + alpha) * step) -
  int(alpha * step)``, last output at ``max_start``; computed in f32 (f64 for f64 inputs).

Work decomposition (both kernels, no shared memory, no barriers): thread ``(x, y)`` owns
one column (``ow`` in the forward, ``w`` in the backward) of a run of ``rows_per_thread``
consecutive rows, a row being ``(plane, depth, height)`` flattened. The run is walked
incrementally, so per-plane work (samples, the column's window start or candidate range)
and per-depth work is done once per run, not per element. Both grid axes are strided, so
any grid covers any problem. Window rows are read four columns per pass and candidate
indices four at a time: independent loads in flight instead of a dependent chain.

Kernels are per storage kind: f32, f64, and one "half" kernel for f16 and bf16 (uint16
storage, a runtime bf16 flag in ``windows[WINDOWS_BF16]``). f64 runs the general kernels
only (identical results; no benchmark row justified fast f64 variants).

Modules: ``placement`` (window starts, candidate outputs, element conversions), ``generic``
(any strides), ``fast`` (contiguous, 32-bit offsets), ``tiled`` (the listed tiled
backward) and ``table`` (every compiled kernel); this package re-exports their public
names.
"""

from __future__ import annotations

from .fast import (
    FAST_WINDOWS,
    baracuda_start32,
    baracuda_start_fast,
    baracuda_threshold,
    candidate_outputs_fast,
    fast_div,
    magic_divisor,
)
from .placement import (
    PLACEMENT_BARACUDA,
    PLACEMENT_TORCH,
    WINDOWS_BF16,
    baracuda_window_start,
    candidate_outputs,
    clamp_sample,
    count_base_at_most,
    torch_window_start_f32,
    torch_window_start_f64,
)
from .table import (
    BW_LISTED_MAX_DYNAMIC,
    FAST_KINDS,
    FRACTIONAL_MAX_POOL_BW_FAST_KERNELS,
    FRACTIONAL_MAX_POOL_BW_KERNELS,
    FRACTIONAL_MAX_POOL_BW_LISTED_KERNELS,
    FRACTIONAL_MAX_POOL_ELEMENTS,
    FRACTIONAL_MAX_POOL_FW_FAST_KERNELS,
    FRACTIONAL_MAX_POOL_FW_KERNELS,
    FRACTIONAL_MAX_POOL_FW_ROWS_KERNELS,
    FRACTIONAL_MAX_POOL_TABLE,
    kernel_kind,
)
from .tiled import (
    BW_MASK_BITS,
    BW_TABLE_D,
    BW_TABLE_H,
    BW_TABLE_W,
    CANDIDATE_COUNT_SHIFT,
    candidates_baracuda,
)

__all__ = [
    "BW_LISTED_MAX_DYNAMIC", "BW_MASK_BITS", "BW_TABLE_D", "BW_TABLE_H", "BW_TABLE_W",
    "CANDIDATE_COUNT_SHIFT", "FAST_KINDS", "FAST_WINDOWS",
    "FRACTIONAL_MAX_POOL_BW_FAST_KERNELS", "FRACTIONAL_MAX_POOL_BW_KERNELS",
    "FRACTIONAL_MAX_POOL_BW_LISTED_KERNELS", "FRACTIONAL_MAX_POOL_ELEMENTS",
    "FRACTIONAL_MAX_POOL_FW_FAST_KERNELS",
    "FRACTIONAL_MAX_POOL_FW_KERNELS", "FRACTIONAL_MAX_POOL_FW_ROWS_KERNELS",
    "FRACTIONAL_MAX_POOL_TABLE", "PLACEMENT_BARACUDA", "PLACEMENT_TORCH", "WINDOWS_BF16",
    "baracuda_start32",
    "baracuda_start_fast", "baracuda_threshold", "baracuda_window_start", "candidate_outputs",
    "candidate_outputs_fast", "candidates_baracuda", "clamp_sample", "count_base_at_most",
    "fast_div", "kernel_kind", "magic_divisor", "torch_window_start_f32",
    "torch_window_start_f64",
]
