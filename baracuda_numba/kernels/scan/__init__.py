"""Scan: inclusive prefix scans along one axis, forward and backward.

Forward, with ``s`` the scan index (``pos = s``, or ``extent - 1 - s`` when reversed)::

    Cumsum        y[s] = x[0] + ... + x[s]
    Cumprod       y[s] = x[0] * ... * x[s]
    Cummax        y[s] = max(x[0..s]), NaN once a NaN is seen; index = last j <= s where
                  x[j] equals y[s] (torch.cummax's tie choice: later index wins)
    Cummin        the same with min
    LogCumsumExp  y[s] = log(exp(x[0]) + ... + exp(x[s])), -inf for an all -inf prefix

Every scan is one associative ``combine`` over a per-element state (a 2-tuple
``(acc, aux)``), so one kernel body per algorithm serves every kind: the kind supplies
``identity``, ``lift`` (inputs at one position -> state), ``combine(earlier, later, code)`` and
``emit`` (exclusive/inclusive state -> output value and index).

Backward (the scan runs in the opposite direction, ``u`` = backward scan index). The three
non-trivial gradients are one affine recurrence ``q -> m[u] * (q + dy[u])`` (state
``(A, B)``, the composed map ``q -> A q + B``) with ``dx[u] = w[u] * (dy[u] + B_excl[u])``:

    Cumprod       m = x[u],                 w = y[prev]  (1 at the first position)
    LogCumsumExp  m = exp(y[prev] - y[u]),  w = exp(x[u] - y[u])  (0 where x = -inf)
    Cummax/min    m = 0 at a record, else 1; w = 1 at a record, else 0

``prev`` is the forward-previous position (the next one in backward order: a one-element
halo). For Cumprod this is the exact gradient with zeros in ``x`` (no division); for
LogCumsumExp every exponent is <= 0 (``y`` is non-decreasing), so nothing overflows. A
*record* is a position where the running winner's index changes (torch's rule: the last of
equal winners, every NaN); its 0/1 flag is written to ``dx`` by a forward pre-pass
(``*_RECORD_FLAG`` codes), which the backward kernel then reads and overwrites position by
position. Cumsum backward is the forward Cumsum of ``dy`` with the direction flipped.

Algorithms (both handle any strides; the plan picks by layout):

``rows``  (scan axis contiguous) one block per line, looping over tiles of
          ``blockDim * ITEMS`` elements with a carried prefix::

              global --coalesced--> smem tile --thread-serial reduce of ITEMS-->
              warp shfl_up scan --> warp totals in smem --> rescan --> smem --> global

``lines`` (outer scan axis) one thread per line, consecutive threads on consecutive
          lines (coalesced); ``blockDim.y`` threads split each line into chunks whose
          aggregates are combined through shared memory (reduce, then rescan).

Both can also split a line into ``nseg`` segments over blocks: phase 1 writes each
segment's aggregate to a workspace, phase 2 starts each segment from the combined
aggregates of the segments before it (phase 0: one pass, no split). ``rows_fast`` at f32
accumulators does both in one launch (``PHASE_CHAINED``: segments in ticket order, each
publishing its aggregate, then waiting for the earlier ones'; sketch in ``fast.py``).

Fast kernels for layouts that collapse to [outer, extent, inner] (sketch in
``fast.py``): ``rows_fast`` / ``cols_fast`` for the scalar-state kinds, one compiled kernel per
family of kinds, and ``rows_indexed`` for Cummax/Cummin with indices and record flags.

f16 and bf16 share one ``HALF`` kernel per body (uint16 storage, f32 accumulators): the
plan adds ``CODE_BF16`` to the ``code`` of a bf16 launch (``ops.with_bf16``; the fix-up
pass takes a ``bf16`` argument) and every kernel splits it off at entry.

Modules: ``ops`` (storage, the combine operations), ``generic`` (rows, lines), ``fast``
(rows_fast, cols_fast), ``indexed``, ``extremum_backward`` and ``table`` (every compiled
kernel); this package re-exports their public names.
"""

from __future__ import annotations

from .extremum_backward import ExtremumBackwardKernels
from .fast import (
    FAST_COLS_CHUNKS,
    FAST_ELEMENTS,
    FAST_FAMILY,
    FAST_ROWS_BLOCK,
    FAST_WORDS,
    PHASE_CHAINED,
    FastFormat,
    FastKernels,
)
from .indexed import INDEXED_CODES, IndexedKernels
from .ops import (
    CODE_BF16,
    CODE_CUMMAX,
    CODE_CUMMAX_RECORD_FLAG,
    CODE_CUMMIN,
    CODE_CUMMIN_RECORD_FLAG,
    CODE_CUMPROD,
    CODE_CUMSUM,
    CODE_EXTREMUM_BACKWARD,
    CODE_LOG_CUMSUM_EXP,
    FLOAT_ELEMENTS,
    INT_ELEMENTS,
    ROWS_BLOCK,
    SCAN_STORAGE,
    ScanOp,
    with_bf16,
)
from .table import (
    EXTREMUM_BACKWARD_KERNELS,
    FAST_KERNELS,
    INDEXED_KERNELS,
    SCAN_BACKWARD_ELEMENTS,
    SCAN_FORWARD_ELEMENTS,
    SCAN_KERNELS,
    ScanKernels,
)

__all__ = [
    "CODE_BF16", "CODE_CUMMAX", "CODE_CUMMAX_RECORD_FLAG", "CODE_CUMMIN", "CODE_CUMMIN_RECORD_FLAG",
    "CODE_CUMPROD", "CODE_CUMSUM", "CODE_EXTREMUM_BACKWARD", "CODE_LOG_CUMSUM_EXP",
    "EXTREMUM_BACKWARD_KERNELS", "ExtremumBackwardKernels", "FAST_COLS_CHUNKS",
    "FAST_ELEMENTS", "FAST_FAMILY", "FAST_KERNELS", "FAST_ROWS_BLOCK", "FAST_WORDS",
    "FLOAT_ELEMENTS", "FastFormat", "FastKernels", "INDEXED_CODES", "INDEXED_KERNELS",
    "INT_ELEMENTS", "IndexedKernels", "PHASE_CHAINED", "ROWS_BLOCK", "SCAN_BACKWARD_ELEMENTS",
    "SCAN_FORWARD_ELEMENTS", "SCAN_KERNELS", "SCAN_STORAGE", "ScanKernels", "ScanOp",
    "with_bf16",
]
