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

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .._runtime import SIMULATOR
from ..arrays import TensorMut, TensorRef, as_mut, as_ref, flat_span
from ..driver import memset_d8_async
from ..errors import InvalidProblem, Unsupported
from ..kernels.common import pad8
from ..kernels.reduce import (
    BROADCAST_UNITS,
    CHUNK,
    ELEMENTS,
    FLOAT_ELEMENTS,
    FORWARD_KERNEL_KIND,
    FORWARD_KINDS,
    GRAD_KERNEL_KIND,
    HOLD_POLL_SLOTS,
    HOLD_STASH_BYTES,
    HOLD_WORDS,
    KIND_OPS,
    LONG_SHORT_KINDS,
    PARK_MIN_LANES,
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
    REG_COL_STRIP_HELD,
    REG_COL_STRIP_WORDS,
    REG_COL_WIDE_PAIRS,
    REG_COL_WORDS,
    REG_COLS_BLOCK,
    REG_COLS_STASH_BYTES,
    REG_COLS_STRIP_BLOCK,
    REG_COLS_WIDE_BLOCK,
    SHORT_LOADS,
    STREAM_GRAD_KINDS,
    SYNC_BLOCK,
    TIES,
    VEC_LOADS,
    VECTOR,
    tie_mask_iters,
)
from ..launch import Kernel
from ..streams import stream_handle
from ..types import (
    ArchSku,
    BackendKind,
    ElementKind,
    KernelSku,
    MathPrecision,
    OpCategory,
    PlanPreference,
    PrecisionGuarantee,
    ReduceKind,
)
from .base import LAUNCHED, LayoutMemo, Plan, fail, plan_args, product

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

#: The value reductions of ReducePlan / ReduceBackwardPlan.
REDUCE_KINDS = (ReduceKind.SUM, ReduceKind.MEAN, ReduceKind.MAX, ReduceKind.MIN,
                ReduceKind.PROD, ReduceKind.NORM2, ReduceKind.LOG_SUM_EXP, ReduceKind.VAR,
                ReduceKind.STD)
ARG_REDUCE_KINDS = (ReduceKind.ARGMAX, ReduceKind.ARGMIN)
_INTEGER_KINDS = (ReduceKind.SUM, ReduceKind.PROD, ReduceKind.MAX, ReduceKind.MIN,
                  ReduceKind.ARGMAX, ReduceKind.ARGMIN)


def _elements_for(kind: ReduceKind) -> tuple[ElementKind,...]:
    kernel_kind = FORWARD_KERNEL_KIND.get(kind, kind)
    return tuple(e for e, kinds in FORWARD_KINDS.items() if kernel_kind in kinds
                 and (kind in _INTEGER_KINDS or e in FLOAT_ELEMENTS))


#: Element kinds per forward kind, from the kernel table.
REDUCE_ELEMENTS: dict[ReduceKind, tuple[ElementKind,...]] = {
    kind: _elements_for(kind) for kind in REDUCE_KINDS + ARG_REDUCE_KINDS}
#: Gradients exist for the float kinds.
REDUCE_BACKWARD_ELEMENTS = FLOAT_ELEMENTS

# Launch geometry. Block of 256 threads: the kernels' shared arrays hold 256 slots. The
# simulator runs one Python thread per CUDA thread, so it gets 64-thread blocks.
_BLOCK = 64 if SIMULATOR else 256
# Blocks that fill the GPU (8 resident 256-thread blocks on each of 132 SMs); fewer output
# groups than this split the axis.
_TARGET_BLOCKS = 4 if SIMULATOR else 1056
# Each thread of a split still walks at least this many elements (4 chunks of 8 loads).
_MIN_PER_THREAD = 4 if SIMULATOR else 32
# Row layout: aim for this many elements per lane (at least 4 lanes per row, so a warp
# load still covers >= 16 contiguous bytes of a row and L1 serves the rest of the sector).
_PER_LANE = 16
_MIN_ROW_LANES = 4
# Grid cap: each block then loops over several output groups (4 waves of 8 resident
# blocks on 132 SMs), so short rows do not pay one block launch per 256 threads of work.
_MAX_GRID_X = 2 if SIMULATOR else 132 * 8 * 4
#: Grid cap of the forward's short-row path where it parks the next group's rows
#: (``kernels.reduce.PARK_MIN_LANES``): one wave of resident blocks (4 per SM at the word
#: kernels' 64 registers) that walk their groups.
#: (Measurements: docs/design/reduce.md, "Measured constants".)
_SHORT_GRID_X = 2 if SIMULATOR else 132 * 4
# Merge of split states: each lane merges about this many states before the lanes combine.
_STATES_PER_LANE = 4


# Word-access kernels (8-byte words, ``kernels.reduce.VECTOR``, capped at 64 registers: 4
# resident 256-thread blocks per SM): fewer row groups than one wave of blocks (132 SMs x
# 4) split the axis into at most that many blocks, so the splits run in one wave.
# (Measurements: docs/design/reduce.md, "Measured constants".)
_VEC_TARGET_BLOCKS = 4 if SIMULATOR else 132 * 4
_VEC_MIN_BATCHES = 1 if SIMULATOR else 4
# Row words per lane aimed at (8 batches), before more lanes (up to the block) share a row;
# rows of >= _VEC_WARP_ROW_WORDS words get at least a warp (one row per warp, no split for
# [4096, 4096] f32 or bf16).
_VEC_WORDS_PER_LANE = VEC_LOADS * 8
_VEC_WARP_ROW_WORDS = 512

# Register-resident gradient: words per lane of rows that fit in a warp.
# (Measurements: docs/design/reduce.md, "Measured constants".)
_REG_SHORT_WORDS = 4
#: The forward kinds whose short rows include rows of lanes x VEC_LOADS words (a module
#: name, so a probe can set it to () for the row loop).
_LONG_SHORT_KINDS = LONG_SHORT_KINDS
#: Whether the store-only gradient (Sum / Mean) takes them too.
_STORE_ONLY_SHORT = True

#: How a layout is read: the generic strided kernels, or word access along contiguous
#: rows (reduce axis stride 1) or contiguous outputs (column layout); REG / REG_COLS: the
#: Max/Min/Var/Std gradient of word-aligned rows / strips of columns held in registers (x
#: read once).
GENERIC, ROWS, COLS, REG, REG_COLS = "generic", "rows", "cols", "reg", "reg_cols"
#: SYNC: the Var/Std and Max/Min gradients of word-aligned rows longer than the
#: register-resident kernel's in one launch, in chunks that meet through the workspace
#: (``kernels.reduce.reduce_backward_rows_hold_stash``).
SYNC = "sync"
#: BROADCAST: the gradients without a statistic of a C-contiguous, 16-byte aligned dx in
#: 16-byte units in dx's memory order (``kernels.reduce.reduce_backward_broadcast``).
BROADCAST = "broadcast"

# The broadcast's blocks: rows one-shot, BROADCAST_UNITS units a thread; columns one wave
# of resident blocks (its threads rounded down to whole rows of units) walking dx.
# (Measurements: docs/design/reduce.md, "Measured constants".)
_BROADCAST_BLOCK = 64 if SIMULATOR else 128
_BROADCAST_COL_BLOCK = 64 if SIMULATOR else 256
_BROADCAST_MIN_COL_BYTES = 1024
# The kinds that read x (Prod / Norm2 / LogSumExp), same rounds against the word and
# register-resident kernels.
# (Measurements: docs/design/reduce.md, "Measured constants".)
_BROADCAST_MIN_X_ROW_BYTES = 2048 * 8
_BROADCAST_X_COL_BYTES = (2,)

# The hold gradient's parts of a row (``_sync_layout``): _SYNC_BATCHES batches of
# VEC_LOADS words a thread of SYNC_BLOCK (a hold chunk is two parts).
_SYNC_BATCHES = 1 if SIMULATOR else 2
# the hold kernels cut rows into the same chunks (their partials are the same sums)
assert _SYNC_BATCHES * VEC_LOADS == HOLD_WORDS
#: The long Var/Std rows take the hold kernel (x read once:
#: ``reduce_backward_rows_hold_stash``) where the device holds this many rows' chunks at
#: once (resident blocks / chunks a row); a row's first chunks wait for its last, so the
#: fewer rows in flight, the longer the waits.
#: (Measurements: docs/design/reduce.md, "Measured constants".)
_HOLD_ROWS_IN_FLIGHT = 4
#: The same for the Max/Min gradient of long rows (its tie count summed the same way),
#: whose other way is the tie count after dx (x read once, dx written, then the tied
#: rows rewritten), which measured faster than the hold kernel below this.
_HOLD_TIES_ROWS_IN_FLIGHT = 8


def _sync_layout(out_numel: int, extent: int, width: int) -> tuple[int, int]:
    """``(parts, workspace bytes)`` of the hold gradient: rows of ``extent // width`` words
    cut into ``parts`` parts of _SYNC_BATCHES * SYNC_BLOCK * VEC_LOADS words (a hold chunk
    is two); the workspace holds the ticket, then one published partial per part (int64,
    all zeroed before each launch)."""
    words = max(extent // width, 1)
    chunk = _SYNC_BATCHES * SYNC_BLOCK * VEC_LOADS
    parts = -(-words // chunk)
    return parts, 8 * (1 + out_numel * parts)


def _split_aim(groups: int, target: int) -> int:
    """The blocks a split of ``groups`` line groups aims at: ``target`` where the groups
    fill less than half of _VEC_TARGET_BLOCKS (they split anyway), else _VEC_TARGET_BLOCKS
    (at most one wave, as the kernels with a statistic to merge)."""
    return target if _VEC_TARGET_BLOCKS // groups > 1 else _VEC_TARGET_BLOCKS


def _pow2_at_least(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


#: Row lengths in words that the store-only gradient gives 8 lanes (``_rows_vec_geometry``).
_STORE_ONLY_WORDS = range(128, 2049)
_STORE_ONLY_ROWS = 4096


@dataclass(frozen=True, slots=True)
class _Geometry:
    lanes: int
    row_layout: bool
    splits: int
    chunk_len: int  # elements per split (word kernels: words per split)
    groups: int


def _rows_vec_geometry(out_numel: int, extent: int, width: int, max_splits: int,
                       store_only: bool = False, warp_rows: bool = False, target: int = 0,
                       min_batches: int = 0) -> _Geometry:
    """Lanes per row and splits for the word-access row kernels: a row of ``extent //
    width`` words gets about _VEC_WORDS_PER_LANE words per lane (short rows: one batch per
    lane, at least 4 lanes = a 32-byte sector per row and load), split only when there are
    too few row groups; a split is a whole number of batches. ``store_only`` (the Sum/Mean
    gradient, which writes rows and reads one dy value each) of f32: 8 lanes for rows of
    _STORE_ONLY_WORDS words when there are at least _STORE_ONLY_ROWS rows, unsplit.
    2-byte elements keep the shared geometry (measured even).

    ``warp_rows`` (the forward kernel of f16/bf16 for the kinds with little work per
    element; see ``_warp_rows``): long rows that split anyway, at least a block of them, get a warp
    each (8 rows per block) and more splits, instead of up to a block per row.

    ``target`` / ``min_batches`` (0: _VEC_TARGET_BLOCKS / _VEC_MIN_BATCHES): the blocks a
    split aims at and the batches each split keeps at least (``_split_aim``)."""
    target = target or _VEC_TARGET_BLOCKS
    min_batches = min_batches or _VEC_MIN_BATCHES
    words = max(extent // width, 1)
    if store_only and width == 2 and words in _STORE_ONLY_WORDS \
            and out_numel >= _STORE_ONLY_ROWS:
        return _Geometry(8, True, 1, words + 1, -(-out_numel // (_BLOCK // 8)))
    lanes = _pow2_at_least(-(-words // _VEC_WORDS_PER_LANE))
    if words >= _VEC_WARP_ROW_WORDS:
        lanes = max(lanes, 32)
    lanes = min(_BLOCK, max(lanes, min(_pow2_at_least(words), _MIN_ROW_LANES)))
    if warp_rows and lanes > 32 and max_splits > 1 and out_numel >= _BLOCK \
            and -(-out_numel // (_BLOCK // 32)) < _VEC_TARGET_BLOCKS:
        lanes = 32
    groups = max(1, -(-out_numel // (_BLOCK // lanes)))
    batch = lanes * VEC_LOADS
    splits = 1
    if groups < _VEC_TARGET_BLOCKS and max_splits > 1:
        splits = min(max(1, _split_aim(groups, target) // groups),
                     max(1, words // (batch * min_batches)), max_splits)
    chunk = -(-words // splits)
    chunk = -(-chunk // batch) * batch if splits > 1 else words + 1
    splits = max(1, -(-words // chunk))
    return _Geometry(lanes, True, splits, chunk, groups)


#: Forward kernel kinds with more work per element than a compare or an add: they keep the
#: shared row geometry (``_rows_vec_geometry``'s ``warp_rows`` measured slower for them).
_HEAVY_KINDS = (ReduceKind.VAR, ReduceKind.STD, ReduceKind.LOG_SUM_EXP)


def _warp_rows(element: ElementKind, kernel_kind: Any) -> bool:
    """Whether the forward row kernel of ``kernel_kind`` takes ``_rows_vec_geometry``'s
    ``warp_rows``: 2-byte elements, every kind but Var / Std (Welford) and LogSumExp."""
    return element.byte_width == 2 and kernel_kind not in _HEAVY_KINDS


def _short_rows_geometry(out_numel: int, extent: int, width: int, out_shape: tuple[int,...],
                         x_out_strides: tuple[int,...], shift: int,
                         longer: bool = False) -> _Geometry | None:
    """The short-row path of ``reduce_rows_vec`` (``chunk_len`` 0): rows of exactly
    ``lanes * SHORT_LOADS`` words with lanes 4 or 8 (f32 rows of 32 or 64 elements, f16/bf16
    of 64 or 128), word aligned (``shift`` 0, row stride a whole number of words), over one
    collapsed output dim; never split. These are the rows the generic geometry gives at
    most one batch per lane (4 lanes, <= VEC_LOADS words each), i.e. its one-word-at-a-time
    remainder path.

    ``longer`` (the forward kernels of ``kernels.reduce.LONG_SHORT_KINDS`` and the
    store-only Sum / Mean gradient) also takes rows of ``lanes * VEC_LOADS`` words, lanes a
    power of two from 4 to a block (64 to 2048 words): the whole row in flight at once,
    where the row loop gives a warp the row in batches of VEC_LOADS words (the gradient:
    the row's stores without the loop; it precedes ``_rows_vec_geometry``'s 8-lane f32
    rule for these rows). None where it does not
    apply."""
    if shift or extent % width or len(out_shape) != 1 or x_out_strides[0] < 0 \
            or x_out_strides[0] % width:
        return None
    words = extent // width
    lanes = words // SHORT_LOADS
    if words % SHORT_LOADS or lanes & (lanes - 1) or lanes < _MIN_ROW_LANES \
            or lanes > 2 * _MIN_ROW_LANES:
        lanes = words // VEC_LOADS
        if not longer or words % VEC_LOADS or lanes & (lanes - 1) or lanes < _MIN_ROW_LANES \
                or lanes > _BLOCK:
            return None
    groups = max(1, -(-out_numel // (_BLOCK // lanes)))
    return _Geometry(lanes, True, 1, 0, groups)


def _fused_rows_vec_geometry(out_numel: int, extent: int, width: int) -> _Geometry:
    """The fused Max/Min/Var/Std gradient reads each row twice (statistic, then dx): one
    batch of words per lane (up to a row per block) keeps a block's rows small enough for
    the second read to hit L1/L2."""
    words = max(extent // width, 1)
    lanes = min(_BLOCK, max(_pow2_at_least(-(-words // VEC_LOADS)), _MIN_ROW_LANES))
    groups = max(1, -(-out_numel // (_BLOCK // lanes)))
    return _Geometry(lanes, True, 1, words + 1, groups)


def _reg_lanes(extent: int, width: int) -> int:
    """Lanes per row of the register-resident gradient (a power of two, at least 4: a
    32-byte sector per row and load): about _REG_SHORT_WORDS words per lane while the row
    fits in a warp that way, else up to VEC_LOADS; 0 when the row does not fit in one
    block."""
    words = extent // width
    per_lane = _REG_SHORT_WORDS if words <= 32 * _REG_SHORT_WORDS else VEC_LOADS
    lanes = max(_pow2_at_least(-(-words // per_lane)), _MIN_ROW_LANES)
    return lanes if lanes <= _BLOCK else 0


#: The gradients without a statistic that read x (``STREAM_GRAD_KINDS``: Prod, Norm2,
#: LogSumExp) take the register-resident row kernel (every load of a row in flight, then
#: every store) where a row spans at least _REG_STREAM_MIN_LANES lanes; shorter rows keep
#: the word row kernel's short-row path.
#: (Measurements: docs/design/reduce.md, "Measured constants".)
_REG_STREAM_MIN_LANES = 32
#: The word-kernel gradients without a statistic (Sum, Mean, Prod, Norm2, LogSumExp)
#: whose lines split anyway (``_split_aim``): the blocks a split aims at and the batches
#: a split keeps at least. Nothing merges their splits, so they split until a thread has
#: one batch: every load of a thread in flight, then every store, and more blocks to
#: overlap one block's stores with another's loads.
#: (Measurements: docs/design/reduce.md, "Measured constants".)
_STREAM_TARGET_BLOCKS = 8 * _VEC_TARGET_BLOCKS
_STREAM_MIN_BATCHES = 1
#: The blocks and batches of the column tie count's first pass (``_tie_cols_geometry``).
#: (Measurements: docs/design/reduce.md, "Measured constants".)
_TIE_COLS_TARGET = 4 * _VEC_TARGET_BLOCKS
_TIE_COLS_MIN_BATCHES = 1


def _cols_reg_layout(extent: int, width: int,
                     out_words: int = 0) -> tuple[int, int, bool, bool] | None:
    """(log2 of the column words per block, block threads, stash, strip) of the column
    register-resident gradient, or None where it does not apply (those columns keep the
    tie count after dx or the statistic pass).

    Columns that fill the largest block of the strip kernel (REG_COLS_STRIP_BLOCK
    threads: 129-256 rows on the GPU, REG_COL_STRIP_HELD rows a thread) take it (``strip``
    True) where there are ``out_words`` >= REG_COL_STRIP_WORDS output words: 256-byte
    strips. Columns whose strip of REG_COL_WORDS rows a thread fills a REG_COLS_BLOCK-thread
    block (at least 4 words, 32 bytes per row, at least 8 rows a thread on average) take
    the stash kernel (``stash`` True) where its REG_COL_STASH more rows a thread, in
    shared memory, widen the strip: 32-byte strips of 4096 rows become 64-byte ones."""
    if out_words >= REG_COL_STRIP_WORDS and _COLS_STRIP:
        lanes = REG_COLS_STRIP_BLOCK // REG_COL_STRIP_WORDS
        if lanes // 2 * REG_COL_STRIP_HELD < extent <= lanes * REG_COL_STRIP_HELD:
            return REG_COL_STRIP_WORDS.bit_length() - 1, REG_COLS_STRIP_BLOCK, False, True
    row_lanes = _pow2_at_least(-(-extent // REG_COL_WORDS))
    cw = min(REG_COLS_BLOCK // row_lanes, 32 // width)
    # f16/bf16 strips of up to 128 bytes too (64 pairs) where the block stays small
    cw = max(cw, min(REG_COLS_WIDE_BLOCK // row_lanes, 16, REG_COL_WIDE_PAIRS // width))
    block = max(cw * row_lanes, 32)
    if cw < 4 or extent < 8 * (block // cw) or block != REG_COLS_BLOCK or not _COLS_STASH:
        return None
    row_lanes = _pow2_at_least(-(-extent // (REG_COL_WORDS + REG_COL_STASH)))
    wide = min(REG_COLS_BLOCK // row_lanes, 32 // width)
    if wide > cw:
        return wide.bit_length() - 1, wide * row_lanes, True, False
    return None


#: Whether the column register-resident gradient takes the stash kernel where it widens
#: the strip, and the strip kernel where it applies (the probe's A/B switches).
_COLS_STASH = True
_COLS_STRIP = True


def _stash_fits(kind: ReduceKind, element: ElementKind) -> bool:
    """Whether the current device gives a block of the stash kernel its shared memory
    (sm_80 / sm_90 do; sm_86 / sm_89, 99 KiB per block, do not)."""
    kernel = REDUCE_BACKWARD_COLS_STASH_KERNELS[(GRAD_KERNEL_KIND.get(kind, kind), element)]
    return kernel.dynamic_shared_limit() >= REG_COLS_STASH_BYTES


def _unsplit_col_slots(slots: int, units: int, extent: int, min_slots: int,
                       target: int) -> int:
    """Slots of a column block that may not split the axis (no workspace): halved (its
    lanes along the axis doubled) while the grid of ``units / slots`` blocks stays within
    ``target``, the slots at least ``min_slots`` (a 32-byte run of each row) and the lanes
    at most ``extent``. (Without it a wide column reduction ran in a handful of blocks,
    several times slower: docs/design/reduce.md, "Measured constants".)"""
    while slots > min_slots and -(-units // (slots // 2)) <= target \
            and _BLOCK // (slots // 2) <= extent:
        slots //= 2
    return slots


#: Blocks (one per SM) that the forward column kernel's lanes must reach without a split
#: for ``_cols_vec_geometry``'s ``lanes_first``.
_LANES_FIRST_BLOCKS = _VEC_TARGET_BLOCKS // 4


def _lanes_first(kernel_kind: Any, element: ElementKind) -> bool:
    """Whether the forward word columns take ``_cols_vec_geometry``'s ``lanes_first``:
    every kind but the LogSumExp of 2-byte elements, whose lane combine (an exp per merge,
    for each of a word's 4 elements) outweighs the split it saves."""
    return kernel_kind is not ReduceKind.LOG_SUM_EXP or element.byte_width > 2


def _cols_vec_geometry(out_numel: int, extent: int, width: int, max_splits: int,
                       lanes_first: bool = False, target: int = 0,
                       min_batches: int = 0) -> _Geometry:
    """Slots (words of outputs) and lanes for the word-access column kernels:
    consecutive threads own consecutive words of outputs, the remaining threads of the
    block walk the axis with them; split the axis when there are too few groups (or, when
    it may not split, give the block fewer slots and more lanes). ``lanes_first`` (the
    forward): fewer slots and more lanes instead of a split wherever that alone gives at
    least _LANES_FIRST_BLOCKS blocks, which saves the merge launch and the workspace
    round trip. Few columns ([1e6, 64]) keep whole rows per block and split.

    ``target`` / ``min_batches`` (0: _VEC_TARGET_BLOCKS / _VEC_MIN_BATCHES): the blocks a
    split aims at and the batches each split keeps at least (``_split_aim``)."""
    target = target or _VEC_TARGET_BLOCKS
    min_batches = min_batches or _VEC_MIN_BATCHES
    out_words = max(out_numel // width, 1)
    slots = min(_BLOCK, _pow2_at_least(out_words))
    unsplit = max_splits <= 1
    if unsplit or lanes_first:
        fewer = _unsplit_col_slots(slots, out_words, extent, 4, _VEC_TARGET_BLOCKS)
        if not unsplit and fewer < slots and -(-out_words // fewer) >= _LANES_FIRST_BLOCKS:
            unsplit = True
        if unsplit:
            slots = fewer
    lanes = _BLOCK // slots
    groups = -(-out_words // slots)
    batch = lanes * CHUNK
    splits = 1
    if groups < _VEC_TARGET_BLOCKS and not unsplit:
        splits = min(max(1, _split_aim(groups, target) // groups),
                     max(1, extent // (batch * min_batches)), max_splits)
    chunk = -(-max(extent, 1) // splits)
    chunk = -(-chunk // batch) * batch if splits > 1 else max(extent, 1)
    splits = max(1, -(-max(extent, 1) // chunk))
    return _Geometry(lanes, False, splits, chunk, groups)


def _geometry(out_numel: int, extent: int, row_layout: bool, max_splits: int,
              min_row_lanes: int = _MIN_ROW_LANES) -> _Geometry:
    """Lanes per output, layout and axis splits for a reduction of ``out_numel`` rows."""
    if row_layout:
        lanes = min(_BLOCK, max(_pow2_at_least(-(-extent // _PER_LANE)),
                                min(min_row_lanes, _pow2_at_least(extent))))
    else:
        slots = min(_BLOCK, _pow2_at_least(max(out_numel, 1)))
        if max_splits <= 1:
            slots = _unsplit_col_slots(slots, out_numel, extent, 8, _TARGET_BLOCKS)
        lanes = _BLOCK // slots
    slots = _BLOCK // lanes
    groups = max(1, -(-out_numel // slots))
    splits = 1
    if groups < _TARGET_BLOCKS and max_splits > 1:
        splits = min(-(-_TARGET_BLOCKS // groups), max(1, extent // (lanes * _MIN_PER_THREAD)),
                     max_splits)
    chunk_len = max(1, -(-extent // splits))
    splits = max(1, -(-extent // chunk_len))
    return _Geometry(lanes, row_layout, splits, chunk_len, groups)


def _tie_slots(out_numel: int, extent: int, width: int, max_splits: int) -> int:
    """int64 workspace slots of the Max/Min gradient's tie count after dx: ``splits *
    out_numel`` split counts, then one 64-bit tie mask (a bit per element) per lane and
    ``tie_mask_iters(width)`` word-loop iterations of each split
    (``kernels.reduce.reduce_backward_rows_vec``); the larger of the row and the column
    word geometries. The column kernel adds its counts into the first ``out_numel``
    slots only (integer atomics), and its masks follow them."""
    def masks(geometry: _Geometry, lines: int) -> int:
        batches = -(-geometry.chunk_len // (VEC_LOADS * geometry.lanes))
        return geometry.splits * lines * -(-batches // tie_mask_iters(width)) * geometry.lanes
    rows = _rows_vec_geometry(out_numel, extent, width, max_splits)
    cols = _tie_cols_geometry(out_numel, extent, width)
    return max(rows.splits * out_numel + masks(rows, out_numel),
               out_numel + masks(cols, max(out_numel // width, 1)))


def _tie_cols_geometry(out_numel: int, extent: int, width: int) -> _Geometry:
    """The column tie count's first pass: its counts meet through atomics, so its splits
    are not bounded by a merge, only by the masks' workspace (``_tie_slots``)."""
    return _cols_vec_geometry(out_numel, extent, width, 1 << 16, target=_TIE_COLS_TARGET,
                              min_batches=_TIE_COLS_MIN_BATCHES)


def _state_bytes(kind: Any, element: ElementKind, out_numel: int, splits: int) -> tuple[int, int]:
    """(accumulator bytes, total bytes) of ``splits`` partial states per output."""
    ops = KIND_OPS[kind]
    acc_bytes = ops.n_acc * splits * out_numel * ELEMENTS[element].acc.bitwidth // 8
    acc_bytes = -(-acc_bytes // 8) * 8
    k_bytes = splits * out_numel * 8 if ops.uses_k else 0
    return acc_bytes, acc_bytes + k_bytes


def _max_workspace(kind: Any, element: ElementKind, out_numel: int, extent: int,
                   limit: int) -> tuple[int, int]:
    """(most splits any layout uses, bytes) under ``limit`` splits."""
    splits = max(_geometry(out_numel, extent, row, limit).splits for row in (True, False))
    if element in VECTOR:
        width = VECTOR[element].width
        splits = max(splits, _rows_vec_geometry(out_numel, extent, width, limit).splits,
                     _rows_vec_geometry(out_numel, extent, width, limit,
                                        warp_rows=True).splits,
                     _cols_vec_geometry(out_numel, extent, width, limit).splits)
    return splits, _state_bytes(kind, element, out_numel, splits)[1]


def _collapse(shape: tuple[int,...], axis: int,
              strides: list[tuple[int,...]]) -> tuple[tuple[int,...], list[tuple[int,...]]]:
    """Output dims (the axis removed, size-1 dims dropped, and a dim merged into its
    outer neighbour wherever every operand has ``stride[outer] == stride[d] * shape[d]``:
    the output position then unravels over fewer dims) and each operand's strides."""
    out_shape: list[int] = []
    out_strides: list[list[int]] = [[] for _ in strides]
    previous = None
    for d in range(len(shape)):
        if d == axis or shape[d] == 1:
            continue
        if previous is not None and all(s[previous] == s[d] * shape[d] for s in strides):
            out_shape[-1] *= shape[d]
            for i, s in enumerate(strides):
                out_strides[i][-1] = s[d]
        else:
            out_shape.append(shape[d])
            for i, s in enumerate(strides):
                out_strides[i].append(s[d])
        previous = d
    return tuple(out_shape), [tuple(s) for s in out_strides]


def _guarantee(element: ElementKind) -> PrecisionGuarantee:
    acc = ELEMENTS[element].acc.bitwidth
    if element in (ElementKind.I32, ElementKind.I64):
        return PrecisionGuarantee(MathPrecision.INT64, ElementKind.I64, True, True)
    if acc == 64:
        return PrecisionGuarantee(MathPrecision.F64, ElementKind.F64, True, True)
    return PrecisionGuarantee(MathPrecision.F32, ElementKind.F32, True, True)


def _check_common(plan: type[Plan], kind: Any, kinds: tuple[ReduceKind,...],
                  shape: tuple[int,...], axis: Any, element: Any,
                  elements: dict[ReduceKind, tuple[ElementKind,...]]
                  | tuple[ElementKind,...]) -> None:
    """Descriptor checks shared by the three plans (kind, rank, axis, element)."""
    name = plan.name
    if not isinstance(kind, ReduceKind):
        fail(name, InvalidProblem, "kind", f"= {kind!r} is not a ReduceKind")
    if kind not in kinds:
        fail(name, Unsupported, "kind", f"= {kind.name} is not supported (supported: "
             f"{', '.join(k.name for k in kinds)})")
    plan.check_rank(shape, "input_shape")
    if not isinstance(axis, int) or isinstance(axis, bool) or not 0 <= axis < len(shape):
        fail(name, InvalidProblem, "reduce_axis",
             f"= {axis!r} must be an int with 0 <= reduce_axis < rank = {len(shape)}")
    plan.check_element(element, elements[kind] if isinstance(elements, dict) else elements)


def _check_correction(plan: type[Plan], correction: Any) -> None:
    """``correction``: a finite int or float (torch takes both), never a bool."""
    if not isinstance(correction, (int, float)) or isinstance(correction, bool) \
            or not math.isfinite(correction):
        fail(plan.name, InvalidProblem, "correction",
             f"= {correction!r} must be a finite int or float")


@dataclass(frozen=True, slots=True)
class _Problem:
    """Concrete per-call layout: collapsed output shape, strides and the geometry."""

    out_shape: tuple[int,...]
    strides: list[tuple[int,...]]
    geometry: _Geometry
    axis: int
    access: str = GENERIC
    shift: int = 0  # elements between the word-aligned base and x (ROWS)


# ---------------------------------------------------------------------------------------
# Descriptors and args


@dataclass(frozen=True, slots=True)
class ReduceDescriptor:
    """``y = kind(x)`` over ``input_shape[reduce_axis]``; ``correction`` (Var/Std only) is
    subtracted from the count in the divisor (1 = sample variance, 0 = population)."""

    kind: ReduceKind
    input_shape: tuple[int,...]
    reduce_axis: int
    element: ElementKind
    correction: float = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "input_shape", tuple(self.input_shape))

    def output_shape(self) -> tuple[int,...]:
        """The keepdim output shape: ``input_shape`` with the axis set to 1."""
        return _keepdim(self.input_shape, self.reduce_axis)


@plan_args
class ReduceArgs:
    """``x`` of ``input_shape``, ``y`` of ``output_shape()`` (written)."""

    x: Any
    y: Any


@dataclass(frozen=True, slots=True)
class ReduceBackwardDescriptor:
    """Gradient of the ``kind`` reduction of ``input_shape`` over ``reduce_axis``."""

    kind: ReduceKind
    input_shape: tuple[int,...]
    reduce_axis: int
    element: ElementKind
    correction: float = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "input_shape", tuple(self.input_shape))

    def dy_shape(self) -> tuple[int,...]:
        """The keepdim shape of ``dy`` and the saved ``y``."""
        return _keepdim(self.input_shape, self.reduce_axis)


@plan_args
class ReduceBackwardArgs:
    """``dy`` (keepdim), ``dx`` (input shape, written); saved ``x`` (input shape) and
    ``y`` (keepdim) are required by every kind but Sum and Mean (which ignore them)."""

    dy: Any
    dx: Any
    x: Any = None
    y: Any = None


@dataclass(frozen=True, slots=True)
class ArgReduceDescriptor:
    """Index (int64) of the first maximum (ARGMAX) or minimum (ARGMIN) along the axis."""

    kind: ReduceKind
    input_shape: tuple[int,...]
    reduce_axis: int
    element: ElementKind

    def __post_init__(self) -> None:
        object.__setattr__(self, "input_shape", tuple(self.input_shape))

    def output_shape(self) -> tuple[int,...]:
        return _keepdim(self.input_shape, self.reduce_axis)


@plan_args
class ArgReduceArgs:
    """``x`` of ``input_shape``, ``y`` int64 of ``output_shape()`` (written)."""

    x: Any
    y: Any


def _keepdim(shape: tuple[int,...], axis: int) -> tuple[int,...]:
    return shape[:axis] + (1,) + shape[axis + 1:]


# ---------------------------------------------------------------------------------------
# The forward engine shared by ReducePlan and ArgReducePlan


class _ForwardPlan(Plan):
    """Reduction of ``x`` into ``y`` with the kernel of ``kernel_kind``."""

    _out_element: ElementKind | None = None  # None: the input element

    def _setup(self, desc: Any, pref: PlanPreference | None, kernel_kind: Any,
               param: float) -> None:
        shape = desc.input_shape
        self._shape = shape
        self._axis = desc.reduce_axis
        self._extent = shape[desc.reduce_axis]
        self._out_shape = _keepdim(shape, desc.reduce_axis)
        self._out_numel = product(self._out_shape)
        self._kernel = REDUCE_KERNELS[(kernel_kind, desc.element)]
        self._kernel_kind = kernel_kind
        self._lanes_first = _lanes_first(kernel_kind, desc.element)
        self._param = param
        limit = 1 << 30
        if pref is not None and pref.max_workspace_bytes is not None:
            limit = 1
            while limit < 65535 and _max_workspace(kernel_kind, desc.element, self._out_numel,
                                                   self._extent, limit * 2)[1] \
                    <= pref.max_workspace_bytes:
                limit *= 2
        self._max_splits, workspace = _max_workspace(kernel_kind, desc.element,
                                                     self._out_numel, self._extent, limit)
        if self._max_splits <= 1:
            workspace = 0
        self._max_splits = max(1, self._max_splits)
        sku = KernelSku(OpCategory.REDUCTION, int(desc.kind), desc.element,
                        self._out_element, None, None, ArchSku.SM80, BackendKind.BESPOKE,
                        _guarantee(desc.element))
        super().__init__(desc, sku, pref, workspace)
        self._launches: dict[Any, _ReduceLaunch] = {}
        self._memo = LayoutMemo(2)  # (x, y) layout key -> launch (run fast path)
        if self._out_numel:
            self._kernel.prepare()

    def _views(self, args: Any) -> tuple[TensorRef, TensorMut]:
        element = self.descriptor.element
        x = as_ref(args.x, self.name, "x", element, self._shape)
        y = as_mut(args.y, self.name, "y", self._out_element or element, self._out_shape)
        return x, y

    def layout_launch(self, args: Any) -> Callable[..., None] | None:
        """``launch(stream_handle, x_ptr, y_ptr)``: see :meth:`Plan.layout_launch`."""
        hit = self._memo.lookup((args.x, args.y))[1]
        return None if hit is None else hit[0]

    def run(self, args: Any, stream: Any = None, workspace: Any = None) -> None:
        """Reduce ``args.x`` into ``args.y`` on ``stream`` (no host sync). ``workspace``: a
        contiguous buffer of at least ``workspace_size`` bytes where that is not 0 (else
        ``WorkspaceTooSmall(needed, got)`` before anything is launched).

        Torch or CuPy arrays of a layout seen before (and no workspace) skip the array checks
        (``LayoutMemo``)."""
        ws_ptr = self.check_workspace(workspace)  # WorkspaceTooSmall before anything runs
        memo_key = self._memo.launch(stream, None, args.x, args.y) if ws_ptr == 0 else None
        if memo_key is LAUNCHED:
            return
        x, y = self.can_implement(args)
        handle = stream_handle(stream)
        if self._out_numel == 0:
            return
        with_workspace = ws_ptr != 0
        key = (x.strides, y.strides, with_workspace, x.ptr & 7)
        launch = self._launches.get(key)
        if launch is None:
            problem = _problem(self._shape, self._axis, [x.strides, y.strides],
                               x.strides[self._axis] == 1,
                               self._max_splits if with_workspace else 1,
                               self.descriptor.element, self._kernel_kind, x.ptr,
                               lanes_first=self._lanes_first)
            launch = _bind_reduce(self._kernel, self._kernel_kind, self.descriptor.element, x,
                                  y, None, problem, self._extent, self._out_numel,
                                  with_workspace, self._param, final=True)
            if len(self._launches) >= _CACHE_LIMIT:
                self._launches.clear()
            self._launches[key] = launch
        if not with_workspace:
            self._memo.store(memo_key, launch.without_workspace(), (0, 0))
        launch(handle, x.ptr, y.ptr, ws_ptr, 0)


def _word_access(element: ElementKind, kernel_kind: Any, extent: int, row_layout: bool,
                 out_shape: tuple[int,...], strides: list[tuple[int,...]], axis_stride: int,
                 pointers: tuple[int,...]) -> str:
    """ROWS, COLS or GENERIC for operands whose first stride list and pointer are the one
    read with words (x, or x and dx with the same strides for a gradient). ROWS: the
    reduce axis is contiguous and rows hold >= 4 words (any pointer phase: each row peels
    its unaligned head). COLS: the outputs collapse to one contiguous dim whose extent is a
    whole number of words, the axis stride is too, and every word pointer is aligned."""
    if element not in VECTOR or (kernel_kind is not None
                                 and (kernel_kind, element) not in REDUCE_ROWS_VEC_KERNELS):
        return GENERIC
    width = VECTOR[element].width
    size = element.byte_width
    if any(p % size for p in pointers):
        return GENERIC
    if row_layout:
        return ROWS if extent >= 4 * width else GENERIC
    if len(out_shape) == 1 and strides[0][0] == 1 and out_shape[0] % width == 0 \
            and axis_stride % width == 0 and all(p % 8 == 0 for p in pointers):
        return COLS
    return GENERIC


def _problem(shape: tuple[int,...], axis: int, strides: list[tuple[int,...]],
             row_layout: bool, max_splits: int, element: ElementKind | None = None,
             kernel_kind: Any = None, x_ptr: int = 0, lanes_first: bool = False) -> _Problem:
    """The layout of a reduction pass over ``x`` (``lanes_first``: the forward's word
    columns, see ``_cols_vec_geometry``; the gradients' statistic pass keeps the split
    chunks its gradient walks)."""
    extent = shape[axis]
    out_shape, out_strides = _collapse(shape, axis, strides)
    out_numel = product(out_shape)
    row_layout = row_layout and extent > 1
    access = GENERIC
    if element is not None and extent > 0:
        access = _word_access(element, kernel_kind, extent, row_layout, out_shape,
                              out_strides, strides[0][axis], (x_ptr,))
    if access == ROWS:
        width = VECTOR[element].width
        shift = (x_ptr & 7) // element.byte_width
        geometry = _short_rows_geometry(out_numel, extent, width, out_shape, out_strides[0],
                                        shift, kernel_kind in _LONG_SHORT_KINDS)
        if geometry is None:
            geometry = _rows_vec_geometry(out_numel, extent, width, max_splits,
                                          warp_rows=_warp_rows(element, kernel_kind))
        return _Problem(out_shape, out_strides, geometry, axis, ROWS, shift)
    if access == COLS:
        geometry = _cols_vec_geometry(out_numel, extent, VECTOR[element].width, max_splits,
                                      lanes_first)
        return _Problem(out_shape, out_strides, geometry, axis, COLS)
    geometry = _geometry(out_numel, extent, row_layout, max_splits)
    return _Problem(out_shape, out_strides, geometry, axis)


@dataclass(frozen=True, slots=True)
class _ReduceLaunch:
    """Bound launches (their ``fast`` launchers) of one reduction layout; pointers are
    passed per call."""

    launches: tuple[Any,...]
    acc_bytes: int
    uses_acc: bool
    uses_k: bool
    access: str = GENERIC

    def __call__(self, stream: int, x_ptr: int, y_ptr: int, ws_ptr: int,
                 aux_ptr: int) -> tuple[int, int]:
        acc_ptr = ws_ptr if ws_ptr and self.uses_acc else 0
        k_ptr = ws_ptr + self.acc_bytes if ws_ptr and self.uses_k else 0
        first = self.launches[0]
        if self.access == ROWS:  # the elements, and the same bytes as words
            first(stream, x_ptr, x_ptr & ~7, y_ptr, acc_ptr, k_ptr, aux_ptr)
        else:  # COLS: x is the (aligned) word view
            first(stream, x_ptr, y_ptr, acc_ptr, k_ptr, aux_ptr)
        for bound in self.launches[1:]:  # the merge of split states
            bound(stream, x_ptr, y_ptr, acc_ptr, k_ptr, aux_ptr)
        return acc_ptr, k_ptr

    def without_workspace(self) -> Callable[[int, int, int], None]:
        """``launch(stream, x_ptr, y_ptr)``: this call with no workspace and no ``aux``,
        as one small function (the memo path of ``run``)."""
        first = self.launches[0]
        if len(self.launches) > 1:
            def launch(stream: int, x_ptr: int, y_ptr: int) -> None:
                self(stream, x_ptr, y_ptr, 0, 0)
        elif self.access == ROWS:
            def launch(stream: int, x_ptr: int, y_ptr: int) -> None:
                first(stream, x_ptr, x_ptr & ~7, y_ptr, 0, 0, 0)
        else:
            def launch(stream: int, x_ptr: int, y_ptr: int) -> None:
                first(stream, x_ptr, y_ptr, 0, 0, 0)
        return launch


def _bind_reduce(kernel: Any, kernel_kind: Any, element: ElementKind, x: TensorRef,
                 y: TensorRef | None, aux: TensorRef | None, problem: _Problem, extent: int,
                 out_numel: int, with_workspace: bool, param: float,
                 final: bool) -> _ReduceLaunch:
    """The reduction launch (and the merge of split states) for this layout. ``final``:
    write ``y``; else leave each output's merged state in workspace slot 0."""
    geometry = problem.geometry
    splits = geometry.splits
    acc_bytes, _ = _state_bytes(kernel_kind, element, out_numel, splits)
    ops = KIND_OPS[kernel_kind]
    acc_view = (0, ops.n_acc * splits * out_numel if with_workspace else 0)
    k_view = (0, splits * out_numel if with_workspace and ops.uses_k else 0)
    x_view = (0, flat_span(x.shape, x.strides))
    y_view = (0, flat_span(y.shape, y.strides) if y is not None else 0)
    aux_view = (0, flat_span(aux.shape, aux.strides) if aux is not None else 0)
    out_shape = pad8(problem.out_shape, 1)
    strides = [pad8(s, 0) for s in problem.strides] + [pad8((), 0)] * 3
    x_strides, y_strides, aux_strides = strides[0], strides[1], strides[2]
    common = (x_view, y_view, acc_view, k_view, aux_view, out_numel, extent,
              x.strides[problem.axis], out_shape, x_strides, y_strides, aux_strides,
              geometry.lanes, int(geometry.row_layout), splits, geometry.chunk_len)
    mode = 0 if splits == 1 and final else 1
    parked = problem.access == ROWS and geometry.chunk_len == 0 \
        and kernel_kind in LONG_SHORT_KINDS and geometry.lanes >= PARK_MIN_LANES
    grid = (min(geometry.groups, _SHORT_GRID_X if parked else _MAX_GRID_X), splits)
    if problem.access == ROWS:
        x_words = (0, (flat_span(x.shape, x.strides) + problem.shift) * element.byte_width // 8)
        table = REDUCE_ROWS_PARK_KERNELS if parked else REDUCE_ROWS_VEC_KERNELS
        first = table[(kernel_kind, element)].bind(grid, _BLOCK, (
            x_view, x_words, y_view, acc_view, k_view, aux_view, out_numel, extent, out_shape,
            x_strides, y_strides, aux_strides, geometry.lanes, splits, geometry.chunk_len,
            mode, param, problem.shift))
    elif problem.access == COLS:
        width = VECTOR[element].width
        x_words = (0, flat_span(x.shape, x.strides) * element.byte_width // 8)
        first = REDUCE_COLS_VEC_KERNELS[(kernel_kind, element)].bind(grid, _BLOCK, (
            x_words, y_view, acc_view, k_view, aux_view, out_numel, extent,
            x.strides[problem.axis] // width, problem.strides[1][0],
            problem.strides[2][0] if aux is not None else 0, geometry.lanes, splits,
            geometry.chunk_len, mode, param))
    else:
        first = kernel.bind(grid, _BLOCK, common + (mode, param))
    launches = [first]
    if splits > 1:
        launches.append(_bind_merge(kernel, common, out_numel, splits, final, param))
    return _ReduceLaunch(tuple(b.fast for b in launches), acc_bytes, ops.n_acc > 0, ops.uses_k,
                         problem.access)


def _bind_merge(kernel: Any, common: tuple[Any,...], out_numel: int, splits: int,
                final: bool, param: float) -> Any:
    """The launch of ``kernel`` that merges the ``splits`` partial states of each output
    (mode 2: into ``y``; 3, not ``final``: into workspace slot 0); ``common`` as the
    reduction's arguments."""
    lanes = min(_BLOCK, _pow2_at_least(-(-splits // _STATES_PER_LANE)))
    slots = _BLOCK // lanes
    merge_args = list(common)
    merge_args[12:14] = [lanes, 0]
    return kernel.bind(min(-(-out_numel // slots), _MAX_GRID_X), _BLOCK,
                       tuple(merge_args) + (2 if final else 3, param))


_CACHE_LIMIT = 64
#: The statistic pass of the Var/Std gradients (split or column word layouts, with a
#: workspace): the Sum kernel's per-output sum, which the gradient divides by the extent
#: for the mean. It replaced the Welford kernel, which also reduces the squared deviations
#: the gradient never reads.
#: (Measurements: docs/design/reduce.md, "Measured constants".)
MEAN_STAT = ReduceKind.SUM


class ReducePlan(_ForwardPlan):
    """See the module docstring."""

    name = "ReducePlan"

    @classmethod
    def select(cls, desc: ReduceDescriptor, pref: PlanPreference | None = None) -> ReducePlan:
        _check_common(cls, desc.kind, REDUCE_KINDS, desc.input_shape, desc.reduce_axis,
                      desc.element, REDUCE_ELEMENTS)
        _check_correction(cls, desc.correction)
        extent = desc.input_shape[desc.reduce_axis]
        if extent == 0 and desc.kind in (ReduceKind.MAX, ReduceKind.MIN):
            fail(cls.name, InvalidProblem, "input_shape",
                 f"[{desc.reduce_axis}] = 0: {desc.kind.name} of an empty axis is undefined")
        return cls(desc, pref)

    def __init__(self, desc: ReduceDescriptor, pref: PlanPreference | None) -> None:
        kind = desc.kind
        extent = desc.input_shape[desc.reduce_axis]
        if kind is ReduceKind.MEAN:
            param = float(extent)
        elif kind in (ReduceKind.VAR, ReduceKind.STD):
            param = float(desc.correction)
        else:
            param = 1.0
        self._setup(desc, pref, FORWARD_KERNEL_KIND.get(kind, kind), param)

    def can_implement(self, args: ReduceArgs) -> tuple[TensorRef, TensorMut]:
        """Views of ``x`` and ``y`` after dtype, shape and writability checks."""
        return self._views(args)


class ArgReducePlan(_ForwardPlan):
    """Argmax/Argmin: int64 index of the first extreme; NaN is the extreme (torch)."""

    name = "ArgReducePlan"
    _out_element = ElementKind.I64

    @classmethod
    def select(cls, desc: ArgReduceDescriptor,
               pref: PlanPreference | None = None) -> ArgReducePlan:
        _check_common(cls, desc.kind, ARG_REDUCE_KINDS, desc.input_shape,
                      desc.reduce_axis, desc.element, REDUCE_ELEMENTS)
        if desc.input_shape[desc.reduce_axis] == 0:
            fail(cls.name, InvalidProblem, "input_shape",
                 f"[{desc.reduce_axis}] = 0: {desc.kind.name} of an empty axis is undefined")
        return cls(desc, pref)

    def __init__(self, desc: ArgReduceDescriptor, pref: PlanPreference | None) -> None:
        self._setup(desc, pref, desc.kind, 0.0)

    def can_implement(self, args: ArgReduceArgs) -> tuple[TensorRef, TensorMut]:
        """Views of ``x`` and ``y`` (int64) after dtype, shape and writability checks."""
        return self._views(args)


# ---------------------------------------------------------------------------------------
# The gradient


#: Blocks of the column tie count's rewrite pass (two in the simulator: each block walks
#: every other split there, so the tests take the GPU's split step, not only its loop). Half
#: a wave of blocks. (Measurements: docs/design/reduce.md, "Measured constants".)
_TIE_REWRITE_BLOCKS = 2 if SIMULATOR else _VEC_TARGET_BLOCKS // 2


@dataclass(frozen=True)
class _TieCount:
    """The Max/Min gradient's tie count taken after dx (ROWS and COLS word layouts with a
    workspace): the gradient's first pass (mode 2) writes dx with every count taken as 1
    and counts the ties; ``rewrite`` (the gradient in mode 3) rewrites the lines whose
    count is not 1. ROWS: the first pass writes each split's count and ``merge`` (fast
    launcher) sums them into workspace slots ``[0, out_numel)``. COLS (``merge`` None):
    the first pass adds its counts into those slots, ``zero_bytes`` zeroed before it."""

    merge: Any
    rewrite: Any
    zero_bytes: int = 0


@dataclass(frozen=True)
class _SyncLaunch:
    """The hold gradient (SYNC): its bound launch (``fast``: stream and pointers) and the
    bytes of workspace it uses (the ticket, then the chunk partials), zeroed before each
    launch."""

    fast: Any
    ctl_bytes: int


def _gradient_runner(launch: tuple[Any, Any], ws_ptr: int) -> Any:
    """``runner(stream, dy_ptr, dx_ptr, x_ptr, y_ptr)`` (0 for an absent x or y): the
    statistic pass if the layout has one, then the gradient launch with its pointers."""
    stat, (access, gradient) = launch
    bound = gradient.fast
    if isinstance(stat, _TieCount):
        merge, rewrite, zero_bytes = stat.merge, stat.rewrite, stat.zero_bytes
        if access == ROWS:
            def ties(handle: int, dy_ptr: int, dx_ptr: int, x_ptr: int, y_ptr: int) -> None:
                pointers = (dy_ptr, x_ptr, x_ptr & ~7, y_ptr, dx_ptr, dx_ptr & ~7, 0, ws_ptr)
                bound(handle, *pointers)
                merge(handle, 0, 0, 0, ws_ptr, 0)
                rewrite(handle, *pointers)
            return ties

        def col_ties(handle: int, dy_ptr: int, dx_ptr: int, x_ptr: int, y_ptr: int) -> None:
            pointers = (dy_ptr, x_ptr, y_ptr, dx_ptr, dx_ptr, 0, ws_ptr)
            memset_d8_async(ws_ptr, 0, zero_bytes, handle)
            bound(handle, *pointers)
            rewrite(handle, *pointers)
        return col_ties
    if access == SYNC:
        ctl_bytes = gradient.ctl_bytes

        def sync(handle: int, dy_ptr: int, dx_ptr: int, x_ptr: int, y_ptr: int) -> None:
            memset_d8_async(ws_ptr, 0, ctl_bytes, handle)
            bound(handle, dy_ptr, x_ptr, y_ptr, dx_ptr, dx_ptr, ws_ptr, ws_ptr + 8)
        return sync
    if stat is None:  # one launch: its argument list, as one small function per access
        if access == BROADCAST:
            def broadcast(handle: int, dy_ptr: int, dx_ptr: int, x_ptr: int,
                          y_ptr: int) -> None:
                bound(handle, dy_ptr, y_ptr, x_ptr, dx_ptr)
            return broadcast
        if access == ROWS:
            def rows(handle: int, dy_ptr: int, dx_ptr: int, x_ptr: int, y_ptr: int) -> None:
                bound(handle, dy_ptr, x_ptr, x_ptr & ~7, y_ptr, dx_ptr, dx_ptr & ~7, 0, 0)
            return rows
        if access in (REG, REG_COLS):
            def reg(handle: int, dy_ptr: int, dx_ptr: int, x_ptr: int, y_ptr: int) -> None:
                bound(handle, dy_ptr, x_ptr, y_ptr, dx_ptr, dx_ptr)
            return reg

    def runner(handle: int, dy_ptr: int, dx_ptr: int, x_ptr: int, y_ptr: int) -> None:
        stat_acc = stat_k = 0
        if stat is not None:
            stat_acc, stat_k = stat(handle, x_ptr, 0, ws_ptr, y_ptr)
        if access == ROWS:  # elements and the same bytes as words (x and dx share a phase)
            bound(handle, dy_ptr, x_ptr, x_ptr & ~7, y_ptr, dx_ptr, dx_ptr & ~7, stat_acc,
                  stat_k)
        elif access in (REG, REG_COLS):  # x as words, dx as elements and words (aligned)
            bound(handle, dy_ptr, x_ptr, y_ptr, dx_ptr, dx_ptr)
        elif access == COLS:  # x as (aligned) words, dx as elements and words
            bound(handle, dy_ptr, x_ptr, y_ptr, dx_ptr, dx_ptr, stat_acc, stat_k)
        else:
            bound(handle, dy_ptr, x_ptr, y_ptr, dx_ptr, stat_acc, stat_k)

    return runner


def _with_zero_fixup(runner: Any, fixup: Any) -> Any:
    """``runner`` followed by the Prod gradient's fix-up of the lines whose product is 0."""
    def prod_runner(handle: int, dy_ptr: int, dx_ptr: int, x_ptr: int, y_ptr: int) -> None:
        runner(handle, dy_ptr, dx_ptr, x_ptr, y_ptr)
        fixup(handle, dy_ptr, x_ptr, y_ptr, dx_ptr)
    return prod_runner


def _dx_words(view: tuple[int, int]) -> tuple[int, int]:
    """The word view of ``dx``. The simulator copies every kernel array in and back out on
    its own, so a second writable view of ``dx`` would write stale data back over the
    first: there the kernels store words through ``dx`` (``VectorSpec.store_word``) and
    get an empty word view."""
    return (0, 0) if SIMULATOR else view


class ReduceBackwardPlan(Plan):
    """See the module docstring."""

    name = "ReduceBackwardPlan"

    @classmethod
    def select(cls, desc: ReduceBackwardDescriptor,
               pref: PlanPreference | None = None) -> ReduceBackwardPlan:
        _check_common(cls, desc.kind, REDUCE_KINDS, desc.input_shape, desc.reduce_axis,
                      desc.element, REDUCE_BACKWARD_ELEMENTS)
        _check_correction(cls, desc.correction)
        extent = desc.input_shape[desc.reduce_axis]
        if extent == 0 and desc.kind in (ReduceKind.MAX, ReduceKind.MIN):
            fail(cls.name, InvalidProblem, "input_shape",
                 f"[{desc.reduce_axis}] = 0: {desc.kind.name} of an empty axis is undefined")
        return cls(desc, pref)

    def __init__(self, desc: ReduceBackwardDescriptor, pref: PlanPreference | None) -> None:
        kind = desc.kind
        shape = desc.input_shape
        self._shape = shape
        self._axis = desc.reduce_axis
        self._extent = extent = shape[desc.reduce_axis]
        self._out_shape = desc.dy_shape()
        self._out_numel = product(self._out_shape)
        self._numel = product(shape)
        grad_kind = GRAD_KERNEL_KIND.get(kind, kind)
        self._kernel = REDUCE_BACKWARD_KERNELS[(grad_kind, desc.element)]
        self._needs_saved = kind not in (ReduceKind.SUM, ReduceKind.MEAN)
        if kind is ReduceKind.MEAN:
            self._param = float(extent)
        elif kind in (ReduceKind.VAR, ReduceKind.STD):
            dof = extent - desc.correction
            self._param = 2.0 / dof if dof else float("inf")
        else:
            self._param = 1.0
        self._stat_kind = {ReduceKind.MAX: TIES, ReduceKind.MIN: TIES,
                           ReduceKind.VAR: MEAN_STAT, ReduceKind.STD: MEAN_STAT}.get(kind)
        # without a statistic nothing merges the splits of the word kernels' lines
        self._stream_split = {"target": _STREAM_TARGET_BLOCKS,
                              "min_batches": _STREAM_MIN_BATCHES} \
            if self._stat_kind is None else {}
        self._launches: dict[Any, tuple[_ReduceLaunch | None, Any]] = {}
        # (dy, dx, x, y) layout key -> gradient runner (run fast path)
        self._memo = LayoutMemo(4)
        workspace = 0
        self._max_splits = 1
        if self._stat_kind is not None and self._numel:
            self._stat_kernel = REDUCE_KERNELS[(self._stat_kind, desc.element)]
            limit = 1 << 30
            if pref is not None and pref.max_workspace_bytes is not None:
                limit = 1
                while limit < 65535 and _max_workspace(self._stat_kind, desc.element,
                                                       self._out_numel, extent, limit * 2)[1] \
                        <= pref.max_workspace_bytes:
                    limit *= 2
            self._max_splits, workspace = _max_workspace(self._stat_kind, desc.element,
                                                         self._out_numel, extent, limit)
            if pref is not None and pref.max_workspace_bytes is not None \
                    and workspace > pref.max_workspace_bytes:
                # no room for the statistic pass: the fused single-pass gradient
                self._max_splits, workspace = 1, 0
        # the tie count after dx (Max/Min word layouts): split counts and tie masks
        self._tie_slots = 0
        if self._stat_kind is TIES and self._numel and desc.element in VECTOR:
            slots = _tie_slots(self._out_numel, extent, VECTOR[desc.element].width,
                               self._max_splits)
            if pref is None or pref.max_workspace_bytes is None \
                    or slots * 8 <= pref.max_workspace_bytes:
                self._tie_slots = slots
                workspace = max(workspace, slots * 8)
        # the hold kernel of long Var/Std and Max/Min rows (its ticket and chunk partials)
        self._sync: tuple[int, int] | None = None
        #: the hold kernel (x read once): None = where the device holds
        #: _HOLD_ROWS_IN_FLIGHT (Max/Min: _HOLD_TIES_ROWS_IN_FLIGHT) rows' chunks at once,
        #: True = where it holds twice a row's chunks (the least that cannot deadlock),
        #: False = never
        self.row_hold: bool | None = None
        #: the gradients without a statistic: the broadcast kernel where it applies
        #: (``_bind_broadcast``); set before the first ``run``
        self.broadcast = True
        if self._stat_kind is not None and self._numel and desc.element in VECTOR:
            layout = _sync_layout(self._out_numel, extent, VECTOR[desc.element].width)
            if pref is None or pref.max_workspace_bytes is None \
                    or layout[1] <= pref.max_workspace_bytes:
                self._sync = layout
                workspace = max(workspace, layout[1])
        sku = KernelSku(OpCategory.REDUCTION, int(kind), desc.element, None, None, None,
                        ArchSku.SM80, BackendKind.BESPOKE, _guarantee(desc.element))
        super().__init__(desc, sku, pref, workspace)
        #: Prod: the exact gradient of lines holding zeros (``_bind_prod_zeros``)
        self._zero_fixup = REDUCE_BACKWARD_PROD_ZEROS_KERNELS[desc.element] \
            if kind is ReduceKind.PROD and self._numel else None
        self._zero_fixups: dict[Any, Any] = {}
        #: the layout of the last run's gradient launch (GENERIC, ROWS, COLS, REG,
        #: REG_COLS, SYNC or BROADCAST; None before the first run): what tests and
        #: benchmarks read, never set
        self.choice: str | None = None
        if self._numel:
            self._kernel.prepare()
            if self._stat_kind is not None:
                self._stat_kernel.prepare()
            if self._zero_fixup is not None:
                self._zero_fixup.prepare()

    def can_implement(self, args: ReduceBackwardArgs) -> tuple[TensorRef, TensorMut,
                                                               TensorRef | None,
                                                               TensorRef | None]:
        """Views of ``dy``, ``dx``, ``x``, ``y``; x and y must be given unless Sum/Mean."""
        element = self.descriptor.element
        dy = as_ref(args.dy, self.name, "dy", element, self._out_shape)
        dx = as_mut(args.dx, self.name, "dx", element, self._shape)
        x = y = None
        if self._needs_saved:
            kind = self.descriptor.kind.name
            if args.x is None:
                fail(self.name, InvalidProblem, "x", f"is None; the {kind} gradient needs "
                     "the saved forward input")
            if args.y is None:
                fail(self.name, InvalidProblem, "y", f"is None; the {kind} gradient needs "
                     "the saved forward output")
            x = as_ref(args.x, self.name, "x", element, self._shape)
            y = as_ref(args.y, self.name, "y", element, self._out_shape)
        return dy, dx, x, y

    def run(self, args: ReduceBackwardArgs, stream: Any = None, workspace: Any = None) -> None:
        """Write ``args.dx`` on ``stream`` (no host sync). ``workspace``: a contiguous
        buffer of at least ``workspace_size`` bytes where that is not 0 (else
        ``WorkspaceTooSmall(needed, got)`` before anything is launched).

        Torch or CuPy arrays of a layout seen before (and no workspace) skip the array checks
        (``LayoutMemo``)."""
        ws_ptr = self.check_workspace(workspace)  # WorkspaceTooSmall before anything runs
        if ws_ptr:
            memo_key = None
        elif self._needs_saved:  # as can_implement
            memo_key = self._memo.launch(stream, None, args.dy, args.dx, args.x, args.y)
        else:
            memo_key = self._memo.launch(stream, None, args.dy, args.dx, None, None)
        if memo_key is LAUNCHED:
            return
        dy, dx, x, y = self.can_implement(args)
        handle = stream_handle(stream)
        if self._numel == 0:
            return
        key = (dy.strides, dx.strides, x.strides if x is not None else None,
               y.strides if y is not None else None, ws_ptr != 0, dx.ptr & 15,
               x.ptr & 15 if x is not None else 0)
        launch = self._launches.get(key)
        if launch is None:
            launch = self._bind(dy, dx, x, y, ws_ptr != 0)
            if len(self._launches) >= _CACHE_LIMIT:
                self._launches.clear()
                self._zero_fixups.clear()
            self._launches[key] = launch
            if self._zero_fixup is not None:
                assert x is not None and y is not None
                self._zero_fixups[key] = self._bind_prod_zeros(dy, dx, x, y)
        self.choice = launch[1][0]
        runner = _gradient_runner(launch, ws_ptr)
        if self._zero_fixup is not None:
            runner = _with_zero_fixup(runner, self._zero_fixups[key])
        if ws_ptr == 0:
            self._memo.store(memo_key, runner, (0, 0, 0, 0))
        runner(handle, dy.ptr, dx.ptr, x.ptr if x is not None else 0,
               y.ptr if y is not None else 0)

    def _bind(self, dy: TensorRef, dx: TensorMut, x: TensorRef | None, y: TensorRef | None,
              with_workspace: bool) -> tuple[_ReduceLaunch | None, Any]:
        """The launches for a layout: for Max/Min/Var/Std either the fused gradient (the
        kernel reduces each row's statistic itself: no workspace, or enough rows to fill
        the GPU without splitting the axis) or the statistic pass into the workspace
        followed by the (split) gradient."""
        axis = self._axis
        extent = self._extent
        element = self.descriptor.element
        row_layout = dx.strides[axis] == 1 and extent > 1
        zeros = (0,) * len(self._shape)
        strides = [dx.strides, x.strides if x is not None else zeros,
                   y.strides if y is not None else zeros, dy.strides]
        out_shape, out_strides = _collapse(self._shape, axis, strides)
        if self._stat_kind is None and self.broadcast and element in VECTOR \
                and len(out_shape) <= 1:
            broadcast = self._bind_broadcast(dy, dx, x, y, out_strides)
            if broadcast is not None:
                return None, (BROADCAST, broadcast)
        access = GENERIC
        if x is None or (x.strides == dx.strides and (x.ptr - dx.ptr) % 8 == 0):
            pointers = (dx.ptr,) if x is None else (dx.ptr, x.ptr)
            access = _word_access(element, None, extent, row_layout, out_shape, out_strides,
                                  dx.strides[axis], pointers)
            if access == COLS and self._stat_kind is not None:
                width = VECTOR[element].width
                out_words = self._out_numel // width
                cols_reg = _cols_reg_layout(extent, width, out_words=out_words)
                if cols_reg is not None and (cols_reg[3] or _stash_fits(
                        self.descriptor.kind, element)):
                    log2_cw, block, stash, strip = cols_reg
                    return None, (REG_COLS, self._bind_reg(dy, dx, y, out_strides, log2_cw,
                                                           block, dx.strides[axis], stash,
                                                           strip))
                if not with_workspace:
                    access = GENERIC  # the column word kernel needs the workspace
        stream = self.descriptor.kind in STREAM_GRAD_KINDS
        if access == ROWS and (self._stat_kind is not None or stream):
            width = VECTOR[element].width
            lanes = _reg_lanes(extent, width)
            whole_words = dx.ptr % 8 == 0 and extent % width == 0 and len(out_shape) <= 1 \
                and all(s % width == 0 for s in out_strides[0])
            if stream and lanes < _REG_STREAM_MIN_LANES:
                lanes = 0
            if lanes and whole_words:
                return None, (REG, self._bind_reg(dy, dx, y, out_strides,
                                                  lanes.bit_length() - 1, _BLOCK, None))
            if whole_words and with_workspace and self._sync is not None:
                sync = self._bind_sync(dy, dx, y, out_strides)
                if sync is not None:
                    return None, (SYNC, sync)
        shift = (dx.ptr & 7) // element.byte_width  # dx's (and x's) elements past a word
        if access == ROWS:
            width = VECTOR[element].width
            geometry = None
            if self._stat_kind is None:  # the kernel's short-row path (chunk_len 0)
                geometry = _short_rows_geometry(self._out_numel, extent, width, out_shape,
                                                out_strides[0], shift,
                                                _STORE_ONLY_SHORT and not self._needs_saved)
            if geometry is None:
                geometry = _rows_vec_geometry(self._out_numel, extent, width, 1 << 16,
                                              store_only=not self._needs_saved,
                                              **self._stream_split)
        elif access == COLS:
            geometry = _cols_vec_geometry(self._out_numel, extent, VECTOR[element].width,
                                          1 << 16, **self._stream_split)
        else:
            # stores: at least one full 32-byte sector of a row per warp instruction.
            # (Measurements: docs/design/reduce.md, "Measured constants".)
            min_lanes = max(_MIN_ROW_LANES, 32 // element.byte_width)
            geometry = _geometry(self._out_numel, extent, row_layout, 1 << 16, min_lanes)
        stat: _ReduceLaunch | _TieCount | None = None
        mode = 0  # of the gradient kernel: 1 fused statistic, 2 tie count after dx
        if self._stat_kind is not None:
            assert x is not None and y is not None
            if access != COLS and (not with_workspace or geometry.splits == 1):
                mode = 1
                geometry = (_fused_rows_vec_geometry(self._out_numel, extent,
                                                     VECTOR[element].width) if access == ROWS
                            else _geometry(self._out_numel, extent, row_layout, 1, min_lanes))
            elif self._stat_kind is TIES and access in (ROWS, COLS) and self._tie_slots:
                mode = 2
                width = VECTOR[element].width
                geometry = _rows_vec_geometry(self._out_numel, extent, width,
                                              self._max_splits) if access == ROWS \
                    else _tie_cols_geometry(self._out_numel, extent, width)
            else:
                stat_problem = _problem(self._shape, axis, [x.strides, y.strides, y.strides],
                                        x.strides[axis] == 1, self._max_splits, element,
                                        self._stat_kind, x.ptr)
                stat = _bind_reduce(self._stat_kernel, self._stat_kind, element, x, None, y,
                                    stat_problem, extent, self._out_numel, True, 0.0,
                                    final=False)
        n_stat = (self._out_numel, 0, self._tie_slots)[mode]  # workspace slots used
        grid = (min(geometry.groups, _MAX_GRID_X), geometry.splits)
        dy_view = (0, flat_span(dy.shape, dy.strides))
        x_view = (0, flat_span(x.shape, x.strides) if x is not None else 0)
        y_view = (0, flat_span(y.shape, y.strides) if y is not None else 0)
        dx_view = (0, flat_span(dx.shape, dx.strides))
        stat_views = ((0, n_stat if self._stat_kind is MEAN_STAT else 0),
                      (0, n_stat if self._stat_kind is TIES else 0))
        grad_kind = GRAD_KERNEL_KIND.get(self.descriptor.kind, self.descriptor.kind)
        if access == ROWS:
            words = (0, (dx_view[1] + shift) * element.byte_width // 8)
            x_words = (0, words[1] if x is not None else 0)
            words = _dx_words(words)
            dx_s, x_s, y_s, dy_s = [pad8(s, 0) for s in out_strides]
            args = (dy_view, x_view, x_words, y_view, dx_view, words, *stat_views,
                    self._out_numel, extent, pad8(out_shape, 1), dy_s, x_s, y_s, dx_s,
                    geometry.lanes, geometry.chunk_len, self._param, mode, shift)
            kernel = REDUCE_BACKWARD_ROWS_VEC_KERNELS[(grad_kind, element)]
            if mode == 2:
                stat = self._tie_count(kernel, grid, args, geometry.splits)
            return stat, (ROWS, kernel.bind(grid, _BLOCK, args))
        if access == COLS:
            width = VECTOR[element].width
            words = (0, dx_view[1] * element.byte_width // 8)
            args = (dy_view, (0, words[1] if x is not None else 0), y_view, dx_view,
                    _dx_words(words), *stat_views, self._out_numel, extent,
                    dx.strides[axis] // width, out_strides[3][0],
                    out_strides[2][0] if y is not None else 0, geometry.lanes,
                    geometry.chunk_len, self._param, mode)
            kernel = REDUCE_BACKWARD_COLS_VEC_KERNELS[(grad_kind, element)]
            if mode == 2:
                stat = self._col_tie_count(
                    REDUCE_BACKWARD_COLS_REWRITE_KERNELS[(grad_kind, element)], grid, args,
                    geometry.splits)
            return stat, (COLS, kernel.bind(grid, _BLOCK, args))
        gradient = self._kernel.bind(
            grid, _BLOCK,
            (dy_view, x_view, y_view, dx_view, *stat_views, self._out_numel, extent,
             x.strides[axis] if x is not None else 0, dx.strides[axis], pad8(out_shape, 1),
             *[pad8(s, 0) for s in (out_strides[3], out_strides[1], out_strides[2],
                                    out_strides[0])],
             geometry.lanes, int(geometry.row_layout), geometry.chunk_len, self._param,
             mode))
        return stat, (GENERIC, gradient)

    def _bind_prod_zeros(self, dy: TensorRef, dx: TensorMut, x: TensorRef,
                         y: TensorRef) -> Any:
        """The Prod fix-up's launch (``kernels.reduce.reduce_backward_prod_zeros``, fast
        launcher: stream, dy, x, y, dx): a warp per 32 lines, in any layout."""
        axis = self._axis
        out_shape, out_strides = _collapse(self._shape, axis, [dx.strides, x.strides,
                                                               y.strides, dy.strides])
        dx_s, x_s, y_s, dy_s = [pad8(s, 0) for s in out_strides]
        warps = _BLOCK // 32
        grid = min(-(-self._out_numel // (32 * warps)), _MAX_GRID_X)
        views = [(0, flat_span(a.shape, a.strides)) for a in (dy, x, y, dx)]
        assert self._zero_fixup is not None
        return self._zero_fixup.bind(grid, _BLOCK, (
            *views, self._out_numel, self._extent, x.strides[axis], dx.strides[axis],
            pad8(out_shape, 1), dy_s, x_s, y_s, dx_s)).fast

    def _bind_broadcast(self, dy: TensorRef, dx: TensorMut, x: TensorRef | None,
                        y: TensorRef | None, out_strides: list[tuple[int,...]]) -> Any:
        """The broadcast kernel's launch (gradients without a statistic) for a C-contiguous,
        16-byte aligned ``dx`` (and ``x``, where read) whose units (16 bytes, K elements)
        each lie in one line: rows (the reduced axis last, its extent a multiple of K) or
        columns (nothing before the reduced axis; the trailing axes a multiple of K
        elements, at least _BROADCAST_MIN_COL_BYTES). The caller has collapsed the output
        positions to at most one dim (``_collapse``: ``out_strides`` [dx, x, y, dy]), so
        dy and y each step by one stride. None otherwise."""
        if dx.ptr % 16 or not dx.is_contiguous():
            return None
        if x is not None and (x.ptr % 16 or not x.is_contiguous()):
            return None
        element = self.descriptor.element
        shape, axis, extent = self._shape, self._axis, self._extent
        per_unit = 16 // element.byte_width
        inner = product(shape[axis + 1:])
        units = self._numel // per_unit
        kernel = REDUCE_BACKWARD_BROADCAST_KERNELS[
            (GRAD_KERNEL_KIND.get(self.descriptor.kind, self.descriptor.kind), element)]
        words = (0, self._numel * element.byte_width // 4)
        arrays = ((0, flat_span(dy.shape, dy.strides)),
                  (0, flat_span(y.shape, y.strides) if y is not None else 0),
                  words if x is not None else (0, 0), words)
        dy_stride, y_stride = (out_strides[3][0], out_strides[2][0]) if out_strides[0] \
            else (0, 0)
        if inner == 1:
            if extent % per_unit or (x is not None and extent * element.byte_width
                                     <= _BROADCAST_MIN_X_ROW_BYTES):
                return None
            line_units = extent // per_unit
            blocks = -(-units // (_BROADCAST_BLOCK * BROADCAST_UNITS))
            return kernel.bind(blocks, _BROADCAST_BLOCK,
                               (*arrays, units, line_units, 1.0 / line_units, 0, dy_stride,
                                y_stride, self._param))
        if product(shape[:axis]) != 1 or inner % per_unit \
                or inner * element.byte_width < _BROADCAST_MIN_COL_BYTES \
                or (x is not None and element.byte_width not in _BROADCAST_X_COL_BYTES):
            return None
        line_units = inner // per_unit
        # one wave: 8 blocks of 256 a SM where 1056 were launched but only 6 resident (34
        # registers, before the cap) left a third of a wave as a tail.
        # (Measurements: docs/design/reduce.md, "Measured constants".)
        wave = kernel.resident_blocks(_BROADCAST_COL_BLOCK) * _BROADCAST_COL_BLOCK
        threads = max(wave // line_units, 1) * line_units
        return kernel.bind(-(-threads // _BROADCAST_COL_BLOCK), _BROADCAST_COL_BLOCK,
                           (*arrays, units, line_units, 1.0 / line_units, threads,
                            dy_stride, y_stride, self._param))

    def _tie_count(self, kernel: Any, grid: tuple[int, int], args: tuple[Any,...],
                   splits: int) -> _TieCount:
        """The tie count after dx of word rows: the merge of the ``splits`` tie counts per
        output and the rewrite pass (``args`` of the first pass with its mode, ``fused``,
        the second to last, = 3)."""
        rewrite = list(args)
        rewrite[-2] = 3
        out_numel = self._out_numel
        empty = (0, 0)
        zeros = pad8((), 0)
        common = (empty, empty, empty, (0, splits * out_numel), empty, out_numel,
                  self._extent, 0, pad8((out_numel,), 1), zeros, zeros, zeros, 1, 0, splits,
                  0)
        merge = _bind_merge(self._stat_kernel, common, out_numel, splits, False, 0.0)
        return _TieCount(merge.fast, kernel.bind(grid, _BLOCK, tuple(rewrite)).fast)

    def _col_tie_count(self, kernel: Any, grid: tuple[int, int], args: tuple[Any,...],
                       splits: int) -> _TieCount:
        """The tie count after dx of the column word kernel: the first pass adds its counts
        up itself (no merge launch; its ``out_numel`` count slots zeroed before it), and the
        rewrite pass (``kernel``, the rewrite kernel, with the first pass's ``args`` and
        the mode, the last, = 3) takes about _TIE_REWRITE_BLOCKS blocks whatever the first
        pass's ``splits`` (its blocks loop over them)."""
        grid_y = max(1, min(splits, _TIE_REWRITE_BLOCKS // grid[0]))
        rewrite = kernel.bind((grid[0], grid_y), _BLOCK, (*args[:-1], 3))
        return _TieCount(None, rewrite.fast, self._out_numel * 8)

    def _word_arrays(self, dy: TensorRef, dx: TensorMut, y: TensorRef | None,
                     out_strides: list[tuple[int,...]]) -> tuple[tuple[Any,...], int, int,
                                                                   int]:
        """The leading array arguments ``(dy, xv, y, dx, dxv)`` of the register-resident
        and hold gradients (x and dx in the same layout: x's words span dx's), and
        the output strides of dx, y and dy (one collapsed output dim at most)."""
        element = self.descriptor.element
        assert y is not None
        dx_view = (0, flat_span(dx.shape, dx.strides))
        words = (0, -(-dx_view[1] * element.byte_width // 8))
        dx_s, _, y_s, dy_s = [s[0] if s else 0 for s in out_strides]
        arrays = ((0, flat_span(dy.shape, dy.strides)), words,
                  (0, flat_span(y.shape, y.strides)), dx_view, _dx_words(words))
        return arrays, dx_s, y_s, dy_s

    def _hold_kernel(self, grad_kind: ReduceKind, element: ElementKind,
                     parts: int) -> tuple[Kernel, int] | None:
        """``(kernel, grid)`` of the hold kernel for rows of ``parts`` parts, or None where
        it does not fit. Its chunks (two parts: registers and a shared-memory stash) wait
        for the rest of their row, so a row's chunks must all be resident: at most 1 /
        _HOLD_ROWS_IN_FLIGHT (Max/Min: _HOLD_TIES_ROWS_IN_FLIGHT) of the resident blocks,
        or half when forced (``row_hold``); one-chunk rows never wait. A thread reads at
        most HOLD_POLL_SLOTS of a row's part totals: ``parts`` <= HOLD_POLL_SLOTS *
        SYNC_BLOCK (512; the rules above allow far fewer on a device of 132 SMs unless
        ``row_hold`` forces the kernel)."""
        if self.row_hold is False or parts > HOLD_POLL_SLOTS * SYNC_BLOCK:
            return None
        in_flight = 2 if self.row_hold else _HOLD_TIES_ROWS_IN_FLIGHT \
            if self._stat_kind is TIES else _HOLD_ROWS_IN_FLIGHT
        kernel = REDUCE_BACKWARD_ROWS_HOLD_STASH_KERNELS[(grad_kind, element)].prepare()
        kernel.allow_dynamic_shared(HOLD_STASH_BYTES)
        resident = kernel.resident_blocks(SYNC_BLOCK, HOLD_STASH_BYTES)
        chunks = -(-parts // 2)
        if resident and (chunks == 1 or in_flight * chunks <= resident):
            return kernel, min(self._out_numel * chunks, resident)
        return None

    def _bind_sync(self, dy: TensorRef, dx: TensorMut, y: TensorRef | None,
                   out_strides: list[tuple[int,...]]) -> _SyncLaunch | None:
        """The gradient of word-aligned rows longer than the register-resident kernel's
        (at most one collapsed output dim, x and dx in the same layout) through the
        workspace: the hold kernel where the device holds enough rows' chunks at once,
        else None."""
        element = self.descriptor.element
        assert self._sync is not None
        parts, workspace = self._sync
        grad_kind = GRAD_KERNEL_KIND.get(self.descriptor.kind, self.descriptor.kind)
        hold = self._hold_kernel(grad_kind, element, parts)
        if hold is None:
            return None
        arrays, dx_s, y_s, dy_s = self._word_arrays(dy, dx, y, out_strides)
        kernel, grid = hold
        # cooperative: every block resident at once, whatever else runs on the device (a
        # share too small for the grid fails the launch, never hangs)
        bound = kernel.bind(grid, SYNC_BLOCK, (
            *arrays, (0, 1), (0, self._out_numel * parts), self._out_numel, self._extent,
            dx_s // VECTOR[element].width, dy_s, y_s, parts, self._param), HOLD_STASH_BYTES,
            cooperative=True)
        return _SyncLaunch(bound.fast, workspace)

    def _bind_reg(self, dy: TensorRef, dx: TensorMut, y: TensorRef | None,
                  out_strides: list[tuple[int,...]], log2_lanes: int, block: int,
                  axis_stride: int | None, stash: bool = False,
                  strip: bool = False) -> Any:
        """The register-resident gradient in ``block``-thread blocks: rows (``axis_stride``
        None: at most one collapsed output dim, word aligned, extent a whole number of
        words, x and dx in the same layout) of ``2**log2_lanes`` lanes each, or strips of
        ``2**log2_lanes`` column words (COLS layouts, ``axis_stride`` = the axis stride of x
        and dx; ``stash``: the kernel that parks most rows in shared memory; ``strip``: the
        256-byte strips' kernel)."""
        element = self.descriptor.element
        width = VECTOR[element].width
        grad_kind = GRAD_KERNEL_KIND.get(self.descriptor.kind, self.descriptor.kind)
        shared = 0
        if axis_stride is None:
            groups = -(-self._out_numel // (block >> log2_lanes))
            kernel = REDUCE_BACKWARD_ROWS_REG_KERNELS[(grad_kind, element)]
        else:
            table = REDUCE_BACKWARD_COLS_STASH_KERNELS if stash else \
                REDUCE_BACKWARD_COLS_STRIP_KERNELS
            kernel = table[(grad_kind, element)]
            groups = -(-self._out_numel // (width << log2_lanes))
            if stash:
                shared = REG_COLS_STASH_BYTES
                kernel.allow_dynamic_shared(shared)
        arrays, dx_s, y_s, dy_s = self._word_arrays(dy, dx, y, out_strides)
        stride_words = (dx_s if axis_stride is None else axis_stride) // width
        return kernel.bind(min(groups, _MAX_GRID_X), block, (
            *arrays, self._out_numel, self._extent, stride_words, dy_s, y_s, log2_lanes,
            self._param), shared)
