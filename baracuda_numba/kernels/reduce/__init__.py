"""Single-axis reductions, their gradients and arg-reductions.

Every forward reduction folds the ``extent`` elements of one output position ("row") into
a state of four registers ``(a, b, c, k)`` (three of the accumulator type, one int64) and
finalises it:

==========  ===========================================  ============================
kind        state and step ``s <- step(s, v)``           final
==========  ===========================================  ============================
Sum/Mean    ``a += v``                                   ``a`` / ``a / extent``
Prod        ``a *= v``                                   ``a``
Max/Min     ``a = nan_max(a, v)`` (NaN propagates)       ``a``
Norm2       ``a += v*v`` (f32 for halves: no overflow)   ``sqrt(a)``
LogSumExp   online ``(m, s)``: ``s = s e^(m-v') +...``  ``m + log s`` (-inf/+inf safe)
Var/Std     Welford ``(mean, m2, n)``, Chan merge        ``m2 / max(n - corr, 0)``
Argmax/min  ``(best value, first index)``, NaN = best    index (int64)
ties        ``k += (v == y)`` (Max/Min gradient)         count
==========  ===========================================  ============================

Accumulators: f32 for f16/bf16/f32, f64 for f64, int64 for i32/i64 (i32 results wrap).

Forward kernels: f16 and bf16 share one ``half`` kernel (uint16 storage, a runtime bf16
flag); Min runs the Max kernel on flipped values (float sign bit, integer bitwise NOT) and
flips the result back, Std runs the Var kernel with a square root: ``flags``, the last
argument, holds both bits (``forward_flags``; ``forward_key`` names the kernel).

Work layout (one generic kernel body; the kind's ``step``/``merge``/``final`` come from a
per-kind table and are compiled in, not branched on)::

    block = 256 threads = P output slots x L lanes (L a power of two)
      row layout    (reduce axis has stride 1): lane = tid % L  -> lanes read consecutive
                     elements of one row; L <= 32 reduces with warp shuffles only
      column layout (reduce axis strided):      slot = tid % P  -> consecutive threads own
                     consecutive outputs and walk the axis together (coalesced)
    grid.x -> groups of P outputs (grid-stride), grid.y -> S splits of the axis

Each thread keeps CHUNK = 8 loads in flight per iteration, then folds them (``chunk``;
Welford folds the chunk exactly and merges it with one division). Lanes combine by warp
shuffles (xor tree), then a shared-memory tree across warps/lanes. With S > 1 each split
writes its partial state to the workspace and a second launch of the same kernel (``mode``
2/3) merges the S states per output in split order: deterministic, no atomics.

Modes: 0 reduce into ``y``; 1 write partial states to the workspace; 2 merge partial
states into ``y``; 3 merge partial states into workspace slot 0 (gradient statistics).

The gradient kernel uses the same layout (no cross-lane step): every output position
loads ``dy`` (and ``y``/a statistic) once, then writes its ``extent`` elements of ``dx``.
The Max/Min (tie count) and Var/Std (mean) gradients of lines that fit in one block's
registers read ``x`` once: the register-resident kernels load the line as 8-byte words
into registers, reduce the statistic across the lanes (fixed order), then write ``dx``
from the registers (rows: ``reduce_backward_rows_reg``; strips of columns:
``reduce_backward_cols_reg``, 1024-thread blocks)::

    rows    lane l of a row holds words l, l + L,..., (<= 8 per lane, L <= 256 lanes)
    columns thread t holds column word t % C of rows t // C + u * (1024 / C), u < 16

The gradients without a statistic (Sum / Mean, Prod, Norm2, LogSumExp) of a contiguous,
16-byte aligned dx take ``reduce_backward_broadcast`` where the plans choose it: threads
numbered along dx's 16-byte units as an elementwise kernel's, each unit's line found by
one division (rows) or kept per thread by a grid stride of whole rows (columns).

Longer Max/Min lines take the tie count after dx (split word rows, column word kernel,
with a workspace): pass 1 writes dx as if every count were 1 (away from the ties dx is
``c - c`` for every count), each split counts its ties and records them in 64-bit masks
(a bit per element); the TIES merge sums the counts; pass 2 (the same kernel) rewrites
only the lines whose count is not 1: the tied words from the masks without reading x
(``_tied_word_rewriter``), or the whole line for a NaN extreme (no tie).
"""

from __future__ import annotations

from .backward import (
    BROADCAST_UNITS,
    FLAG_BF16,
    FLAG_LINE_BLOCKS,
    FLAG_STD,
    grad_flags,
)
from .backward_cols import (
    REG_COL_STRIP_HELD,
    REG_COL_STRIP_WORDS,
    REG_COL_WIDE_PAIRS,
    REG_COL_WORDS,
    REG_COLS_BLOCK,
    REG_COLS_STRIP_BLOCK,
    REG_COLS_WIDE_BLOCK,
)
from .backward_rows import (
    HOLD_POLL_SLOTS,
    HOLD_STASH_BYTES,
    HOLD_WORDS,
    SYNC_BLOCK,
)
from .forward import LONG_SHORT_KINDS, PARK_MIN_LANES, SHORT_LOADS
from .ops import (
    CHUNK,
    ELEMENTS,
    FLOAT_ELEMENTS,
    FORWARD_KERNEL_KIND,
    FORWARD_KINDS,
    FORWARD_VARIANT_OF,
    HALF,
    KIND_OPS,
    LSE_PART,
    TIES,
    forward_flags,
    forward_key,
)
from .tables import (
    GRAD_KERNEL_KIND,
    REDUCE_BACKWARD_BROADCAST_KERNELS,
    REDUCE_BACKWARD_COLS_REWRITE_KERNELS,
    REDUCE_BACKWARD_COLS_STASH_KERNELS,
    REDUCE_BACKWARD_COLS_STRIP_KERNELS,
    REDUCE_BACKWARD_COLS_VEC_KERNELS,
    REDUCE_BACKWARD_KERNELS,
    REDUCE_BACKWARD_PROD_ZEROS_KERNELS,
    REDUCE_BACKWARD_ROWS_HOLD_STASH_KERNELS,
    REDUCE_BACKWARD_ROWS_REG_KERNELS,
    REDUCE_BACKWARD_ROWS_VEC_KERNELS,
    REDUCE_COLS_VEC_KERNELS,
    REDUCE_KERNELS,
    REDUCE_ROWS_PARK_KERNELS,
    REDUCE_ROWS_VEC_KERNELS,
    REG_COL_STASH,
    REG_COLS_STASH_BYTES,
    STREAM_GRAD_KINDS,
)
from .words import VEC_LOADS, VECTOR, tie_mask_iters

__all__ = [
    "BROADCAST_UNITS",
    "CHUNK",
    "ELEMENTS",
    "FLAG_BF16",
    "FLAG_STD",
    "FLOAT_ELEMENTS",
    "FORWARD_KERNEL_KIND",
    "FORWARD_KINDS",
    "FORWARD_VARIANT_OF",
    "forward_flags",
    "forward_key",
    "GRAD_KERNEL_KIND",
    "FLAG_LINE_BLOCKS",
    "grad_flags",
    "HALF",
    "HOLD_POLL_SLOTS",
    "HOLD_STASH_BYTES",
    "HOLD_WORDS",
    "KIND_OPS",
    "LONG_SHORT_KINDS",
    "LSE_PART",
    "PARK_MIN_LANES",
    "REDUCE_BACKWARD_BROADCAST_KERNELS",
    "REDUCE_BACKWARD_COLS_REWRITE_KERNELS",
    "REDUCE_BACKWARD_COLS_STASH_KERNELS",
    "REDUCE_BACKWARD_COLS_STRIP_KERNELS",
    "REDUCE_BACKWARD_COLS_VEC_KERNELS",
    "REDUCE_BACKWARD_KERNELS",
    "REDUCE_BACKWARD_PROD_ZEROS_KERNELS",
    "REDUCE_BACKWARD_ROWS_HOLD_STASH_KERNELS",
    "REDUCE_BACKWARD_ROWS_REG_KERNELS",
    "REDUCE_BACKWARD_ROWS_VEC_KERNELS",
    "REDUCE_COLS_VEC_KERNELS",
    "REDUCE_KERNELS",
    "REDUCE_ROWS_PARK_KERNELS",
    "REDUCE_ROWS_VEC_KERNELS",
    "REG_COL_STASH",
    "REG_COL_STRIP_HELD",
    "REG_COL_STRIP_WORDS",
    "REG_COL_WIDE_PAIRS",
    "REG_COL_WORDS",
    "REG_COLS_BLOCK",
    "REG_COLS_STASH_BYTES",
    "REG_COLS_STRIP_BLOCK",
    "REG_COLS_WIDE_BLOCK",
    "SHORT_LOADS",
    "STREAM_GRAD_KINDS",
    "SYNC_BLOCK",
    "tie_mask_iters",
    "TIES",
    "VEC_LOADS",
    "VECTOR",
]
