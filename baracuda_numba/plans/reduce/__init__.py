"""Single-axis reductions: ``ReducePlan``, ``ReduceBackwardPlan``, ``ArgReducePlan``.

``y = reduce(x, axis)`` with keepdim output (``y.shape`` = input shape with the axis set
to 1), for Sum, Mean, Max, Min, Prod, Norm2, LogSumExp, Var and Std; ``ArgReducePlan``
gives the int64 index of the first maximum/minimum (NaN counts as the extreme, as
torch). The gradient plan writes ``dx`` for every kind from ``dy`` (keepdim) and the saved
``x``/``y``:

==========  ================================================================
Sum / Mean  ``dx = dy`` / ``dy / n``
Max / Min   ``dx = dy / count * (x == y)``: split equally across ties (torch amax, JAX);
            a NaN maximum (no position equals it) gives NaN, as torch
Prod        ``dx = dy * y / x``; lines with ``y == 0`` are then rewritten exactly
            (torch): one zero gets ``dy * prod(others)`` there and 0 elsewhere, two or
            more zeros 0 everywhere (one fix-up kernel for every layout)
Norm2       ``dx = dy * x / y``, 0 where ``y == 0`` (torch)
LogSumExp   ``dx = dy * exp(x - y)``
Var         ``dx = dy * 2 (x - mean) / (n - correction)`` (torch: inf/NaN at n == corr)
Std         ``dx = dy / (2 y) * 2 (x - mean) / (n - correction)``, 0 where ``y == 0``
==========  ================================================================

Semantics: Max/Min propagate NaN; LogSumExp of an all -inf row is -inf and +inf rows
give +inf; Norm2 accumulates squares in f32 for f16/bf16 (no overflow); Var/Std use
Welford/Chan in the accumulator type and divide by ``max(n - correction, 0)`` (inf or
NaN when that is 0, as torch; never 0 as upstream); an empty axis gives Sum 0, Prod 1,
Mean NaN, LogSumExp -inf, Norm2 0, Var/Std NaN, and Max/Min/Argmax/Argmin are
``InvalidProblem``. Accumulators: f32 for f16/bf16/f32, f64 for f64, int64 for i32/i64
(i32 results wrap like int32 arithmetic).

Layout: any rank 1..8, any axis, any non-negative strides on every operand (outputs must
not overlap themselves); empty tensors are a no-op.

Gradient layouts: the gradients without a statistic (Sum, Mean, Prod, Norm2, LogSumExp)
of a C-contiguous, 16-byte aligned ``dx`` (and ``x``) run in ``dx``'s memory order with
16-byte accesses where each 16-byte unit lies in one line (Sum / Mean: rows whose length
is a multiple of 16 bytes, and columns of at least 1 KiB with nothing before the axis;
Prod / Norm2 / LogSumExp: rows longer than 2048 words, and such columns of f16 / bf16);
everything else runs the word, register-resident or generic kernels below.

Workspace (upstream's contract): a reduction with few outputs splits the axis across
blocks and merges the partial states in a second launch (deterministic, no atomics);
``select`` sizes ``workspace_size`` for what the largest split needs within
``PlanPreference.max_workspace_bytes`` (None: unlimited), and ``run`` with a missing or
smaller workspace raises ``WorkspaceTooSmall(needed, got)`` before anything is launched;
``max_workspace_bytes=0`` selects the single-pass paths (one block per output group, the
fused statistics below) and ``workspace_size`` 0. The Max,
Min, Var and Std gradients need a per-output statistic (tie count / mean): where each
line fits in one block's registers (word-aligned rows of up to 2048 words, or strips of
at least 4 column words over at most 4096 rows) a register-resident kernel reads ``x``
once (statistic and dx from the same registers; the mean is ``sum / n`` there, so a row
with an inf gives torch's ``x - inf`` rather than the Welford mean's NaN); otherwise, with
enough rows to fill the GPU or with ``workspace=None``, the gradient kernel reduces it
itself (the row is re-read from cache); otherwise, for Max/Min, the gradient is written
first as if every line had exactly one tie while each split counts its ties into the
workspace, and a last pass rewrites only the lines whose count is not 1 (x is read once
unless lines tie or have a NaN maximum); for Var/Std a statistic pass writes the mean to
the workspace (few long lines: 3 passes over memory).
"""

from __future__ import annotations

from .backward import ReduceBackwardPlan
from .forward import (
    ArgReduceArgs,
    ArgReduceDescriptor,
    ArgReducePlan,
    ReduceArgs,
    ReduceBackwardArgs,
    ReduceBackwardDescriptor,
    ReduceDescriptor,
    ReducePlan,
)
from .geometry import (
    ARG_REDUCE_KINDS,
    REDUCE_BACKWARD_ELEMENTS,
    REDUCE_ELEMENTS,
    REDUCE_KINDS,
)

__all__ = [
    "ARG_REDUCE_KINDS",
    "REDUCE_BACKWARD_ELEMENTS",
    "REDUCE_ELEMENTS",
    "REDUCE_KINDS",
    "ArgReduceArgs",
    "ArgReduceDescriptor",
    "ArgReducePlan",
    "ReduceArgs",
    "ReduceBackwardArgs",
    "ReduceBackwardDescriptor",
    "ReduceBackwardPlan",
    "ReduceDescriptor",
    "ReducePlan",
]
