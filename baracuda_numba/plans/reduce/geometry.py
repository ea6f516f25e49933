"""The work split of the reductions: what each plan checks on the descriptor, the kernels'
geometry (lanes, slots, splits, grids) as pure functions of the problem, and the
workspace each layout needs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..._runtime import SIMULATOR
from ...errors import InvalidProblem, Unsupported
from ...kernels.reduce import (
    CHUNK,
    ELEMENTS,
    FLOAT_ELEMENTS,
    FORWARD_KERNEL_KIND,
    FORWARD_KINDS,
    GRAD_KERNEL_KIND,
    HOLD_WORDS,
    KIND_OPS,
    LONG_SHORT_KINDS,
    REDUCE_BACKWARD_COLS_STASH_KERNELS,
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
    SYNC_BLOCK,
    VEC_LOADS,
    VECTOR,
    tie_mask_iters,
)
from ...types import ElementKind, MathPrecision, PrecisionGuarantee, ReduceKind
from ..base import Plan, fail, product

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

#: Launch geometry. Block of 256 threads: the kernels' shared arrays hold 256 slots. The
#: simulator runs one Python thread per CUDA thread, so it gets 64-thread blocks.
BLOCK = 64 if SIMULATOR else 256
#: Blocks that fill the GPU (8 resident 256-thread blocks on each of 132 SMs); fewer output
#: groups than this split the axis.
TARGET_BLOCKS = 4 if SIMULATOR else 1056
# Each thread of a split still walks at least this many elements (4 chunks of 8 loads).
_MIN_PER_THREAD = 4 if SIMULATOR else 32
# Row layout: aim for this many elements per lane (at least 4 lanes per row, so a warp
# load still covers >= 16 contiguous bytes of a row and L1 serves the rest of the sector).
_PER_LANE = 16
_MIN_ROW_LANES = 4
#: Grid cap: each block then loops over several output groups (4 waves of 8 resident
#: blocks on 132 SMs), so short rows do not pay one block launch per 256 threads of work.
MAX_GRID_X = 2 if SIMULATOR else 132 * 8 * 4
#: Grid cap of the forward's short-row path where it parks the next group's rows
#: (``kernels.reduce.PARK_MIN_LANES``): one wave of resident blocks (4 per SM at the word
#: kernels' 64 registers) that walk their groups.
#: (Measurements: docs/design/reduce.md, "Measured constants".)
SHORT_GRID_X = 2 if SIMULATOR else 132 * 4
# Merge of split states: each lane merges about this many states before the lanes combine.
_STATES_PER_LANE = 4


#: Word-access kernels (8-byte words, ``kernels.reduce.VECTOR``, capped at 64 registers: 4
#: resident 256-thread blocks per SM): fewer row groups than one wave of blocks (132 SMs x
#: 4) split the axis into at most that many blocks, so the splits run in one wave.
#: (Measurements: docs/design/reduce.md, "Measured constants".)
VEC_TARGET_BLOCKS = 4 if SIMULATOR else 132 * 4
_VEC_MIN_BATCHES = 1 if SIMULATOR else 4
# Row words per lane aimed at (8 batches), before more lanes (up to the block) share a row;
# rows of >= _VEC_WARP_ROW_WORDS words get at least a warp (one row per warp, no split for
# [4096, 4096] f32 or bf16).
_VEC_WORDS_PER_LANE = VEC_LOADS * 8
_VEC_WARP_ROW_WORDS = 512
# The light kinds' forward (one operation per element) with enough rows to fill the GPU
# unsplit: twice the words per lane and no warp minimum (more rows in flight per block;
# rows of 784-1568 words, a ResNet pool, measured faster: docs/design/reduce.md).
_VEC_LIGHT_WORDS_PER_LANE = VEC_LOADS * 16

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
#: The kinds that read x (Prod / Norm2 / LogSumExp) take the broadcast for rows longer
#: than BROADCAST_MIN_X_ROW_BYTES and columns of BROADCAST_X_COL_BYTES-byte elements
#: (the defaults of ReduceBackwardPlan's ``broadcast_min_x_row_bytes`` /
#: ``broadcast_x_col_bytes``), same rounds against the word and register-resident
#: kernels. (Measurements: docs/design/reduce.md, "Measured constants".)
BROADCAST_MIN_X_ROW_BYTES = 2048 * 8
BROADCAST_X_COL_BYTES = (2,)

#: The hold gradient's parts of a row (``sync_layout``): SYNC_BATCHES batches of
#: VEC_LOADS words a thread of SYNC_BLOCK (a hold chunk is two parts).
SYNC_BATCHES = 1 if SIMULATOR else 2
# the hold kernels cut rows into the same chunks (their partials are the same sums)
assert SYNC_BATCHES * VEC_LOADS == HOLD_WORDS
#: The long Var/Std rows take the hold kernel (x read once:
#: ``reduce_backward_rows_hold_stash``) where the device holds this many rows' chunks at
#: once (resident blocks / chunks a row); a row's first chunks wait for its last, so the
#: fewer rows in flight, the longer the waits.
#: (Measurements: docs/design/reduce.md, "Measured constants".)
HOLD_ROWS_IN_FLIGHT = 4
#: The same for the Max/Min gradient of long rows (its tie count summed the same way),
#: whose other way is the tie count after dx (x read once, dx written, then the tied
#: rows rewritten), which measured faster than the hold kernel below this.
HOLD_TIES_ROWS_IN_FLIGHT = 8


def sync_layout(out_numel: int, extent: int, width: int) -> tuple[int, int]:
    """``(parts, workspace bytes)`` of the hold gradient: rows of ``extent // width`` words
    cut into ``parts`` parts of SYNC_BATCHES * SYNC_BLOCK * VEC_LOADS words (a hold chunk
    is two); the workspace holds the ticket, then one published partial per part (int64,
    all zeroed before each launch)."""
    words = max(extent // width, 1)
    chunk = SYNC_BATCHES * SYNC_BLOCK * VEC_LOADS
    parts = -(-words // chunk)
    return parts, 8 * (1 + out_numel * parts)


def split_aim(groups: int, target: int) -> int:
    """The blocks a split of ``groups`` line groups aims at: ``target`` where the groups
    fill less than half of VEC_TARGET_BLOCKS (they split anyway), else VEC_TARGET_BLOCKS
    (at most one wave, as the kernels with a statistic to merge)."""
    return target if VEC_TARGET_BLOCKS // groups > 1 else VEC_TARGET_BLOCKS


def _pow2_at_least(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


#: Row lengths in words that the store-only gradient gives 8 lanes (``rows_vec_geometry``).
_STORE_ONLY_WORDS = range(128, 2049)
_STORE_ONLY_ROWS = 4096


@dataclass(frozen=True, slots=True)
class _Geometry:
    lanes: int
    row_layout: bool
    splits: int
    chunk_len: int  # elements per split (word kernels: words per split)
    groups: int


def rows_vec_geometry(out_numel: int, extent: int, width: int, max_splits: int,
                      store_only: bool = False, warp_rows: bool = False, target: int = 0,
                      min_batches: int = 0, light: bool = False) -> _Geometry:
    """Lanes per row and splits for the word-access row kernels: a row of ``extent //
    width`` words gets about _VEC_WORDS_PER_LANE words per lane (short rows: one batch per
    lane, at least 4 lanes = a 32-byte sector per row and load), split only when there are
    too few row groups; a split is a whole number of batches. ``store_only`` (the Sum/Mean
    gradient, which writes rows and reads one dy value each) of f32: 8 lanes for rows of
    _STORE_ONLY_WORDS words when there are at least _STORE_ONLY_ROWS rows, unsplit.
    2-byte elements keep the shared geometry (measured even).

    ``warp_rows`` (the forward kernel of f16/bf16 for the kinds with little work per
    element; see ``takes_warp_rows``): long rows that split anyway, at least a block of
    them, get a warp each (8 rows per block) and more splits, instead of up to a block per
    row.

    ``light`` (the forward kernel of the kinds with one operation per merge,
    _LONG_SHORT_KINDS): where
    the row groups at _VEC_LIGHT_WORDS_PER_LANE words per lane still fill
    VEC_TARGET_BLOCKS (no split either way), rows take those fewer lanes.

    ``target`` / ``min_batches`` (0: VEC_TARGET_BLOCKS / _VEC_MIN_BATCHES): the blocks a
    split aims at and the batches each split keeps at least (``split_aim``)."""
    target = target or VEC_TARGET_BLOCKS
    min_batches = min_batches or _VEC_MIN_BATCHES
    words = max(extent // width, 1)
    if store_only and width == 2 and words in _STORE_ONLY_WORDS \
            and out_numel >= _STORE_ONLY_ROWS:
        return _Geometry(8, True, 1, words + 1, -(-out_numel // (BLOCK // 8)))
    lanes = _pow2_at_least(-(-words // _VEC_WORDS_PER_LANE))
    if words >= _VEC_WARP_ROW_WORDS:
        lanes = max(lanes, 32)
    fewest = min(_pow2_at_least(words), _MIN_ROW_LANES)
    lanes = min(BLOCK, max(lanes, fewest))
    if light:
        narrow = min(BLOCK, max(_pow2_at_least(-(-words // _VEC_LIGHT_WORDS_PER_LANE)),
                                fewest))
        if narrow < lanes and -(-out_numel // (BLOCK // narrow)) >= VEC_TARGET_BLOCKS:
            lanes = narrow
    if warp_rows and lanes > 32 and max_splits > 1 and out_numel >= BLOCK \
            and -(-out_numel // (BLOCK // 32)) < VEC_TARGET_BLOCKS:
        lanes = 32
    groups = max(1, -(-out_numel // (BLOCK // lanes)))
    batch = lanes * VEC_LOADS
    splits = 1
    if groups < VEC_TARGET_BLOCKS and max_splits > 1:
        splits = min(max(1, split_aim(groups, target) // groups),
                     max(1, words // (batch * min_batches)), max_splits)
    chunk = -(-words // splits)
    chunk = -(-chunk // batch) * batch if splits > 1 else words + 1
    splits = max(1, -(-words // chunk))
    return _Geometry(lanes, True, splits, chunk, groups)


#: Forward kernel kinds with more work per element than a compare or an add: they keep the
#: shared row geometry (``rows_vec_geometry``'s ``warp_rows`` measured slower for them).
_HEAVY_KINDS = (ReduceKind.VAR, ReduceKind.STD, ReduceKind.LOG_SUM_EXP)


def takes_warp_rows(element: ElementKind, kernel_kind: Any) -> bool:
    """Whether the forward row kernel of ``kernel_kind`` takes ``rows_vec_geometry``'s
    ``warp_rows``: 2-byte elements, every kind but Var / Std (Welford) and LogSumExp."""
    return element.byte_width == 2 and kernel_kind not in _HEAVY_KINDS


def short_rows_geometry(out_numel: int, extent: int, width: int, out_shape: tuple[int,...],
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
    the row's stores without the loop; it precedes ``rows_vec_geometry``'s 8-lane f32
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
                or lanes > BLOCK:
            return None
    groups = max(1, -(-out_numel // (BLOCK // lanes)))
    return _Geometry(lanes, True, 1, 0, groups)


def _fused_rows_vec_geometry(out_numel: int, extent: int, width: int) -> _Geometry:
    """The fused Max/Min/Var/Std gradient reads each row twice (statistic, then dx): one
    batch of words per lane (up to a row per block) keeps a block's rows small enough for
    the second read to hit L1/L2."""
    words = max(extent // width, 1)
    lanes = min(BLOCK, max(_pow2_at_least(-(-words // VEC_LOADS)), _MIN_ROW_LANES))
    groups = max(1, -(-out_numel // (BLOCK // lanes)))
    return _Geometry(lanes, True, 1, words + 1, groups)


def reg_lanes(extent: int, width: int) -> int:
    """Lanes per row of the register-resident gradient (a power of two, at least 4: a
    32-byte sector per row and load): about _REG_SHORT_WORDS words per lane while the row
    fits in a warp that way, else up to VEC_LOADS; 0 when the row does not fit in one
    block."""
    words = extent // width
    per_lane = _REG_SHORT_WORDS if words <= 32 * _REG_SHORT_WORDS else VEC_LOADS
    lanes = max(_pow2_at_least(-(-words // per_lane)), _MIN_ROW_LANES)
    return lanes if lanes <= BLOCK else 0


#: The gradients without a statistic that read x (``STREAM_GRAD_KINDS``: Prod, Norm2,
#: LogSumExp) take the register-resident row kernel (every load of a row in flight, then
#: every store) where a row spans at least REG_STREAM_MIN_LANES lanes; shorter rows keep
#: the word row kernel's short-row path.
#: (Measurements: docs/design/reduce.md, "Measured constants".)
REG_STREAM_MIN_LANES = 32
#: The word-kernel gradients without a statistic (Sum, Mean, Prod, Norm2, LogSumExp)
#: whose lines split anyway (``split_aim``): the blocks a split aims at and the batches
#: a split keeps at least. Nothing merges their splits, so they split until a thread has
#: one batch: every load of a thread in flight, then every store, and more blocks to
#: overlap one block's stores with another's loads.
#: (Measurements: docs/design/reduce.md, "Measured constants".)
STREAM_TARGET_BLOCKS = 8 * VEC_TARGET_BLOCKS
STREAM_MIN_BATCHES = 1
#: The blocks and batches of the column tie count's first pass (``_tie_cols_geometry``).
#: (Measurements: docs/design/reduce.md, "Measured constants".)
_TIE_COLS_TARGET = 4 * VEC_TARGET_BLOCKS
_TIE_COLS_MIN_BATCHES = 1


def cols_reg_layout(extent: int, width: int,
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
            and BLOCK // (slots // 2) <= extent:
        slots //= 2
    return slots


#: Blocks (one per SM) that the forward column kernel's lanes must reach without a split
#: for ``cols_vec_geometry``'s ``lanes_first``.
_LANES_FIRST_BLOCKS = VEC_TARGET_BLOCKS // 4
#: Columns taller than this split instead: narrow slots (a 32-byte sector of each row a
#: block) lose a quarter of the bandwidth on tall columns ([65536, 4096] along axis 0),
#: where the merge launch is cheap against the pass over the input.
_LANES_FIRST_MAX_EXTENT = 8192


def takes_lanes_first(kernel_kind: Any, element: ElementKind) -> bool:
    """Whether the forward word columns take ``cols_vec_geometry``'s ``lanes_first``:
    every kind but the LogSumExp of 2-byte elements, whose lane combine (an exp per merge,
    for each of a word's 4 elements) outweighs the split it saves."""
    return kernel_kind is not ReduceKind.LOG_SUM_EXP or element.byte_width > 2


def cols_vec_geometry(out_numel: int, extent: int, width: int, max_splits: int,
                      lanes_first: bool = False, target: int = 0,
                      min_batches: int = 0) -> _Geometry:
    """Slots (words of outputs) and lanes for the word-access column kernels:
    consecutive threads own consecutive words of outputs, the remaining threads of the
    block walk the axis with them; split the axis when there are too few groups (or, when
    it may not split, give the block fewer slots and more lanes). ``lanes_first`` (the
    forward): fewer slots and more lanes instead of a split wherever that alone gives at
    least _LANES_FIRST_BLOCKS blocks, which saves the merge launch and the workspace
    round trip. Few columns ([1e6, 64]) keep whole rows per block and split.

    ``target`` / ``min_batches`` (0: VEC_TARGET_BLOCKS / _VEC_MIN_BATCHES): the blocks a
    split aims at and the batches each split keeps at least (``split_aim``)."""
    target = target or VEC_TARGET_BLOCKS
    min_batches = min_batches or _VEC_MIN_BATCHES
    out_words = max(out_numel // width, 1)
    slots = min(BLOCK, _pow2_at_least(out_words))
    unsplit = max_splits <= 1
    if unsplit or lanes_first:
        fewer = _unsplit_col_slots(slots, out_words, extent, 4, VEC_TARGET_BLOCKS)
        if not unsplit and fewer < slots and -(-out_words // fewer) >= _LANES_FIRST_BLOCKS \
                and extent <= _LANES_FIRST_MAX_EXTENT:
            unsplit = True
        if unsplit:
            slots = fewer
    lanes = BLOCK // slots
    groups = -(-out_words // slots)
    batch = lanes * CHUNK
    splits = 1
    if groups < VEC_TARGET_BLOCKS and not unsplit:
        splits = min(max(1, split_aim(groups, target) // groups),
                     max(1, extent // (batch * min_batches)), max_splits)
    chunk = -(-max(extent, 1) // splits)
    chunk = -(-chunk // batch) * batch if splits > 1 else max(extent, 1)
    splits = max(1, -(-max(extent, 1) // chunk))
    return _Geometry(lanes, False, splits, chunk, groups)


def generic_geometry(out_numel: int, extent: int, row_layout: bool, max_splits: int,
                     min_row_lanes: int = _MIN_ROW_LANES) -> _Geometry:
    """Lanes per output, layout and axis splits for a reduction of ``out_numel`` rows."""
    if row_layout:
        lanes = min(BLOCK, max(_pow2_at_least(-(-extent // _PER_LANE)),
                               min(min_row_lanes, _pow2_at_least(extent))))
    else:
        slots = min(BLOCK, _pow2_at_least(max(out_numel, 1)))
        if max_splits <= 1:
            slots = _unsplit_col_slots(slots, out_numel, extent, 8, TARGET_BLOCKS)
        lanes = BLOCK // slots
    slots = BLOCK // lanes
    groups = max(1, -(-out_numel // slots))
    splits = 1
    if groups < TARGET_BLOCKS and max_splits > 1:
        splits = min(-(-TARGET_BLOCKS // groups), max(1, extent // (lanes * _MIN_PER_THREAD)),
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
    rows = rows_vec_geometry(out_numel, extent, width, max_splits)
    cols = _tie_cols_geometry(out_numel, extent, width)
    return max(rows.splits * out_numel + masks(rows, out_numel),
               out_numel + masks(cols, max(out_numel // width, 1)))


def _tie_cols_geometry(out_numel: int, extent: int, width: int) -> _Geometry:
    """The column tie count's first pass: its counts meet through atomics, so its splits
    are not bounded by a merge, only by the masks' workspace (``_tie_slots``)."""
    return cols_vec_geometry(out_numel, extent, width, 1 << 16, target=_TIE_COLS_TARGET,
                             min_batches=_TIE_COLS_MIN_BATCHES)


def _state_bytes(kind: Any, element: ElementKind, out_numel: int, splits: int) -> tuple[int, int]:
    """(accumulator bytes, total bytes) of ``splits`` partial states per output."""
    ops = KIND_OPS[kind]
    acc_bytes = ops.n_acc * splits * out_numel * ELEMENTS[element].acc.bitwidth // 8
    acc_bytes = -(-acc_bytes // 8) * 8
    k_bytes = splits * out_numel * 8 if ops.uses_k else 0
    return acc_bytes, acc_bytes + k_bytes


def max_workspace(kind: Any, element: ElementKind, out_numel: int, extent: int,
                  limit: int) -> tuple[int, int]:
    """(most splits any layout uses, bytes) under ``limit`` splits."""
    splits = max(generic_geometry(out_numel, extent, row, limit).splits for row in (True, False))
    if element in VECTOR:
        width = VECTOR[element].width
        splits = max(splits, rows_vec_geometry(out_numel, extent, width, limit).splits,
                     rows_vec_geometry(out_numel, extent, width, limit,
                                       warp_rows=True).splits,
                     cols_vec_geometry(out_numel, extent, width, limit).splits)
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


def problem_layout(shape: tuple[int,...], axis: int, strides: list[tuple[int,...]],
                   row_layout: bool, max_splits: int, element: ElementKind | None = None,
                   kernel_kind: Any = None, x_ptr: int = 0, lanes_first: bool = False) -> _Problem:
    """The layout of a reduction pass over ``x`` (``lanes_first``: the forward's word
    columns, see ``cols_vec_geometry``; the gradients' statistic pass keeps the split
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
        geometry = short_rows_geometry(out_numel, extent, width, out_shape, out_strides[0],
                                       shift, kernel_kind in _LONG_SHORT_KINDS)
        if geometry is None:
            geometry = rows_vec_geometry(out_numel, extent, width, max_splits,
                                         warp_rows=takes_warp_rows(element, kernel_kind),
                                         light=kernel_kind in _LONG_SHORT_KINDS)
        return _Problem(out_shape, out_strides, geometry, axis, ROWS, shift)
    if access == COLS:
        geometry = cols_vec_geometry(out_numel, extent, VECTOR[element].width, max_splits,
                                     lanes_first)
        return _Problem(out_shape, out_strides, geometry, axis, COLS)
    geometry = generic_geometry(out_numel, extent, row_layout, max_splits)
    return _Problem(out_shape, out_strides, geometry, axis)


