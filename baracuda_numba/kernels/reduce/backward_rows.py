"""Gradient kernels of contiguous rows: word access (``_make_backward_rows_vec``), rows
held in registers (``_make_backward_rows_reg``) and long rows held while their
statistic is published (``_make_backward_rows_hold``).
"""


from collections.abc import Callable
from typing import Any

from numba import cuda, float64, int32, int64, uint32, uint64

from ..._runtime import SIMULATOR
from ...types import ElementKind, ReduceKind
from ..common import (
    MAX_RANK,
    bitcast,
    copy_async8,
    copy_async8_run,
    copy_async_wait,
    load_relaxed,
    opaque,
    shfl_xor,
    wait_ns,
)
from .backward import FLAG_STD, _grad_parts
from .forward import SHORT_LOADS, _lane_combiner, _vec_lane_reducer
from .ops import ELEMENTS, GRAD_OPS, SHARED_SLOTS, TIES, _grad_fns, _offsets4
from .ties import REWRITE_MASKS_ROWS, _tie_words, _tied_word_rewriter
from .words import VEC_LOADS, VECTOR, tie_mask_iters


def _short_rows_gradient(kind: ReduceKind, element: ElementKind) -> Any:
    """The short-row path of ``reduce_backward_rows_vec`` (``chunk_vecs == 0``)."""
    ops = GRAD_OPS[kind]
    spec = ELEMENTS[element]
    vec = VECTOR[element]
    ACC = spec.acc
    load = spec.load
    unpack, pack, store_word = vec.unpack, vec.pack, vec.store_word
    W, LOG_W = vec.width, vec.log_width
    coefficient, element_fn, READS_Y = _grad_parts(kind, element)[:3]
    READS_X = ops.reads_x
    LAST = MAX_RANK - 1

    @cuda.jit(device=True, inline=True)
    def short_rows(dy, xv, y, dx, dxv, out_numel, extent, dy_strides, y_strides, dx_strides,
                   lanes, param, slots, lane, slot, group, words, values, results, flags):
        """The short-row path of the kinds without a statistic (``chunk_vecs == 0``)."""
        row_words = uint64(dx_strides[LAST]) >> uint64(LOG_W)
        # store-only rows (Sum / Mean) may hold VEC_LOADS words per lane
        held = VEC_LOADS if not READS_X and (extent >> LOG_W) == lanes * VEC_LOADS \
            else SHORT_LOADS
        while group * slots < out_numel:  # uniform across the block
            o = group * slots + slot
            if o < out_numel:
                at = uint64(o) * row_words + uint64(lane)
                if READS_X:  # every load of the row in flight at once
                    for u in range(SHORT_LOADS):
                        words[u] = xv[at + uint64(u * lanes)]
                g = load(dy, o * dy_strides[LAST])
                yv = load(y, o * y_strides[LAST]) if READS_Y else g
                cf = ACC(coefficient(g, yv, g, int64(0), param, flags))
                if READS_X:
                    for u in range(SHORT_LOADS):
                        unpack(words[u], values, 0)
                        for e in range(W):
                            results[e] = element_fn(cf, values[e], yv, g)
                        w = pack(results)
                        store_word(dx, dxv, at + uint64(u * lanes), w, 0)
                else:
                    for e in range(W):
                        results[e] = element_fn(cf, cf, yv, g)
                    w = pack(results)
                    for u in range(VEC_LOADS):
                        if u < held:
                            store_word(dx, dxv, at + uint64(u * lanes), w, 0)
            group += cuda.gridDim.x

    return short_rows


def _rows_vec_statistic(kind: ReduceKind, element: ElementKind) -> Any:
    """``row_statistic`` of ``reduce_backward_rows_vec``: a row's mean or tie count."""
    ops = GRAD_OPS[kind]
    ACC = ELEMENTS[element].acc
    STAT_MEAN, STAT_TIES = ops.stat == "mean", ops.stat == "ties"
    stat_reduce = _vec_lane_reducer(TIES if STAT_TIES else ReduceKind.SUM, element)

    @cuda.jit(device=True, inline=True)
    def row_statistic(x, xv, stat_acc, stat_k, o, x_off, shift, yv, valid, extent,
                      chunk_vecs, fused, tid, lane, lanes, slots, slot, sa, sb, sk, mean,
                      count):
        """Row ``o``'s ``(mean, count, valid)``: reduced here (``fused == 1``), 1 (the
        first pass of the tie count after dx) or from the statistic pass; ``valid``
        turns False for a row the rewrite pass leaves as the first pass wrote it."""
        if fused == 1:
            a, b, c, k = stat_reduce(x, xv, x_off, shift, yv, valid, extent, 0, 1,
                                     chunk_vecs, tid, lane, lanes, slots, sa, sb, sk)
            if lane == 0:
                sa[slot] = a
                sk[slot] = k
            cuda.syncthreads()
            mean = sa[slot] / ACC(extent) if STAT_MEAN else sa[slot]
            count = sk[slot]
            cuda.syncthreads()  # sa/sk are free for the next group
        elif STAT_TIES and fused == 2:
            count = int64(1)
        elif valid:
            if STAT_MEAN:
                mean = stat_acc[o] / ACC(extent)  # the statistic pass's sum
            else:
                count = stat_k[o]
                if fused == 3 and count == 1:
                    valid = False  # written by the first pass
        return mean, count, valid

    return row_statistic


def _rows_vec_passes(kind: ReduceKind, element: ElementKind) -> Any:
    """``scalar_edge`` and ``word_pass`` of ``reduce_backward_rows_vec``."""
    ops = GRAD_OPS[kind]
    spec = ELEMENTS[element]
    vec = VECTOR[element]
    load, store = spec.load, spec.store
    unpack, pack, store_word = vec.unpack, vec.pack, vec.store_word
    W = vec.width
    element_fn = _grad_fns(kind, element)[1]
    READS_X = ops.reads_x
    STAT_TIES = ops.stat == "ties"
    MASK_ITERS = tie_mask_iters(W)

    @cuda.jit(device=True, inline=True)
    def scalar_edge(x, dx, x_off, dx_off, t, stop, span, cf, yv, mean, sparse, ties):
        """A row's elements ``t, t + span, ...`` below ``stop`` outside its words (head or
        tail), one at a time (with ``sparse``, the tied ones only); ``ties`` plus those
        that tie."""
        while t < stop:
            v = load(x, x_off + t) if READS_X else cf
            tie = STAT_TIES and v == yv
            if not sparse or tie:
                dx[uint64(dx_off + t)] = store(element_fn(cf, v, yv, mean))
            if tie:
                ties += 1
            t += span
        return ties

    @cuda.jit(device=True, inline=True)
    def word_pass(xv, dx, dxv, stat_k, words, values, results, base, j, end, span, cf, yv,
                  mean, shift, mask_at, fused, ties):
        """The words ``j, j + span, ...`` below ``end`` of a row that reads x: VEC_LOADS
        word loads in flight, then their stores; Max/Min record the ties in the masks
        (``fused`` 2: stored at ``mask_at``, counted into the returned ``ties``)."""
        it = int64(0)
        mask = uint64(0)
        while j < end:
            for u in range(VEC_LOADS):
                if j + u * span < end:
                    words[u] = xv[uint64(base + j + u * span)]
            tied = uint32(0)  # bit u * W + e: element e of word u ties
            for u in range(VEC_LOADS):
                if j + u * span < end:
                    unpack(words[u], values, 0)
                    for e in range(W):
                        results[e] = element_fn(cf, values[e], yv, mean)
                        if STAT_TIES and values[e] == yv:
                            tied |= uint32(1 << (u * W + e))
                    w = pack(results)
                    store_word(dx, dxv, base + j + u * span, w, shift)
            j += VEC_LOADS * span
            if STAT_TIES:
                mask |= uint64(tied) << uint64(it % MASK_ITERS * (VEC_LOADS * W))
            it += 1
            if STAT_TIES and fused == 2 and (it % MASK_ITERS == 0 or j >= end):
                stat_k[uint64(mask_at + (it - 1) // MASK_ITERS * span)] = int64(mask)
                ties += int64(cuda.popc(mask))
                mask = uint64(0)
        return ties

    return scalar_edge, word_pass


def _make_backward_rows_vec(kind: ReduceKind, element: ElementKind) -> Callable[..., None]:
    ops = GRAD_OPS[kind]
    spec = ELEMENTS[element]
    vec = VECTOR[element]
    ACC = spec.acc
    load = spec.load
    pack, store_word = vec.pack, vec.store_word
    W, LOG_W, MASK = vec.width, vec.log_width, vec.width - 1
    coefficient, element_fn, READS_Y, Y_BY_FLAG = _grad_parts(kind, element)
    READS_X = ops.reads_x
    STAT_TIES = ops.stat == "ties"
    HAS_STAT = ops.stat is not None
    combine_ties = _lane_combiner(TIES, element)
    rewrite_tied = _tied_word_rewriter(element, REWRITE_MASKS_ROWS)
    MASK_ITERS = tie_mask_iters(W)
    short_rows = _short_rows_gradient(kind, element)
    row_statistic = _rows_vec_statistic(kind, element)

    scalar_edge, word_pass = _rows_vec_passes(kind, element)

    def reduce_backward_rows_vec(dy, x, xv, y, dx, dxv, stat_acc, stat_k, out_numel, extent,
                                 out_shape, dy_strides, x_strides, y_strides, dx_strides,
                                 lanes, chunk_vecs, param, fused, shift, flags):
        """The gradient of contiguous rows with word loads and stores: ``x`` and ``dx``
        have the same strides and the same word phase (``shift`` elements past the
        word-aligned bases of ``xv``/``dxv``), so one word index addresses both. Layout as
        ``reduce_rows_vec``; grid.y splits the rows into ``chunk_vecs`` words (the
        statistic then comes from ``stat_acc``/``stat_k``); ``fused`` (one split) reduces
        it here first.

        ``chunk_vecs == 0`` selects the short-row path of the kinds without a statistic
        (Sum, Mean, Prod, Norm2, LogSumExp; plans: the conditions of ``reduce_rows_vec``'s
        short rows, one split): lane ``l`` of row ``o`` loads x words ``l + u * lanes`` (u <
        SHORT_LOADS) at once, then stores the dx words at the same indices; no head, tail
        or remainder path and one multiply per offset. The store-only gradient (Sum /
        Mean: no x) also takes rows of ``lanes * VEC_LOADS`` words."""
        tid = cuda.threadIdx.x
        block = cuda.blockDim.x
        slots = block // lanes
        lane = tid % lanes
        slot = tid // lanes
        split = int64(cuda.blockIdx.y)
        splits = int64(cuda.gridDim.y)
        span = int64(lanes)
        sa = cuda.shared.array(SHARED_SLOTS, ACC)
        sb = cuda.shared.array(SHARED_SLOTS, ACC)
        sk = cuda.shared.array(SHARED_SLOTS, int64)
        words = cuda.local.array(VEC_LOADS, uint64)
        values = cuda.local.array(W, ACC)
        results = cuda.local.array(W, ACC)
        cfs = cuda.local.array(W, ACC)
        group = int64(cuda.blockIdx.x)
        if not HAS_STAT and chunk_vecs == 0:
            short_rows(dy, xv, y, dx, dxv, out_numel, extent, dy_strides, y_strides,
                       dx_strides, lanes, param, slots, lane, slot, group, words, values,
                       results, flags)
            return
        reads_y = READS_Y and (not Y_BY_FLAG or (flags & FLAG_STD) != 0)
        while group * slots < out_numel:  # uniform across the block
            o = group * slots + slot
            valid = o < out_numel
            dy_off = x_off = y_off = dx_off = int64(0)
            if valid:
                dy_off, x_off, y_off, dx_off = _offsets4(o, out_shape, dy_strides, x_strides,
                                                         y_strides, dx_strides)
            g = load(dy, dy_off) if valid else ACC(0)
            yv = load(y, y_off) if reads_y and valid else g
            mean = g
            count = int64(0)
            if HAS_STAT:
                mean, count, valid = row_statistic(x, xv, stat_acc, stat_k, o, x_off, shift, yv,
                                                   valid, extent, chunk_vecs, fused, tid, lane,
                                                   lanes, slots, slot, sa, sb, sk, mean, count)
            ties = int64(0)
            # rewrite of a row with ties: only the words holding one change (the other
            # positions are c - c for c = dy and for c = dy / count: 0, or NaN for both)
            sparse = STAT_TIES and fused == 3 and count > 1
            if valid:
                cf = ACC(coefficient(g, yv, mean, count, param, flags))
                p0 = dx_off + shift
                head = (W - (p0 & MASK)) & MASK
                if head > extent:
                    head = extent
                nvec = (extent - head) >> LOG_W
                base = (p0 + head) >> LOG_W
                if split == 0:
                    ties = scalar_edge(x, dx, x_off, dx_off, int64(lane), head, span, cf, yv,
                                       mean, sparse, ties)
                begin = split * chunk_vecs
                end = min(nvec, begin + chunk_vecs)
                j = begin + lane
                # tie masks (fused 2 writes them, 3 rewrites the tied words from them):
                # mask g of this lane, at mask_at + g * span, holds bit (r * VEC_LOADS + u)
                # * W + e for element e of word j + ((g * MASK_ITERS + r) * VEC_LOADS + u) *
                # span (the word loop's iteration g * MASK_ITERS + r) when it ties
                batches = (chunk_vecs + VEC_LOADS * span - 1) // (VEC_LOADS * span)
                mask_at = splits * out_numel + (o * splits + split) * (
                    (batches + MASK_ITERS - 1) // MASK_ITERS) * span + lane
                if sparse:
                    for e in range(W):
                        cfs[e] = cf
                    rewrite_tied(dx, dxv, stat_k, mask_at, span, cfs, base + j, span,
                                 (end - j + VEC_LOADS * span - 1) // (VEC_LOADS * span),
                                 results, shift)
                elif READS_X:
                    ties = word_pass(xv, dx, dxv, stat_k, words, values, results, base, j,
                                     end, span, cf, yv, mean, shift, mask_at, fused, ties)
                else:
                    for e in range(W):
                        results[e] = element_fn(cf, cf, yv, mean)
                    w = pack(results)
                    while j < end:
                        store_word(dx, dxv, base + j, w, shift)
                        j += span
                if split == splits - 1:
                    ties = scalar_edge(x, dx, x_off, dx_off, head + (nvec << LOG_W) + lane,
                                       extent, span, cf, yv, mean, sparse, ties)
            if STAT_TIES and fused == 2:  # this split's tie count (uniform across the block)
                ties = combine_ties(ACC(0), ACC(0), ACC(0), ties, tid, lane, lanes, slots, 1,
                                    sa, sb, sk)[3]
                if valid and lane == 0:
                    stat_k[uint64(split * out_numel + o)] = ties
            group += cuda.gridDim.x

    return reduce_backward_rows_vec


# -- the register-resident gradient (Max/Min, Var/Std of rows that fit on chip) ----------
# The statistic needs the whole row before the first dx value: the lanes of a row load its
# words once into registers (at most VEC_LOADS per lane), reduce the statistic (tie count
# or sum -> mean) across the lanes and write dx from the same registers, so x is read from
# memory once (2 passes: x read, dx written) instead of 3 (statistic, then gradient).


def _row_grad_parts(kind: ReduceKind, element: ElementKind) -> tuple[Any,...]:
    """What the register-resident row gradients (``_make_backward_rows_reg`` and its
    pair) take from the kind and element: the accumulator type, dy/y load, word unpack /
    pack / store, elements per word (and its log 2), ``coefficient`` and ``element_fn``,
    whether y is read, whether there is a statistic and whether it is the tie count, and
    the f16/bf16 tie masks (``TieWords``: whether, then splat / mask / count / select /
    usable, None without)."""
    ops = GRAD_OPS[kind]
    spec = ELEMENTS[element]
    vec = VECTOR[element]
    stat_ties = ops.stat == "ties"
    tie_masks = stat_ties and vec.eq_mask is not None
    ties = _tie_words(element) if tie_masks else None
    tie_parts = (ties.splat, ties.mask, ties.count, ties.select, ties.usable) if ties \
        else (None,) * 5
    return (spec.acc, spec.load, vec.unpack, vec.pack, vec.store_word, vec.width,
            vec.log_width, *_grad_parts(kind, element), ops.stat is not None,
            stat_ties, tie_masks, *tie_parts)


def _make_backward_rows_reg(kind: ReduceKind, element: ElementKind) -> Callable[..., None]:
    ops = GRAD_OPS[kind]
    (ACC, load, unpack, pack, store_word, W, LOG_W, coefficient, element_fn, READS_Y, Y_BY_FLAG,
     STAT, STAT_TIES, TIE_MASKS, splat, tie_mask, tie_count, tie_select, tie_usable) = \
        _row_grad_parts(kind, element)
    WARPS = SHARED_SLOTS // 32  # most warps of one block
    PARTIALS = 2 * WARPS  # two buffers: one barrier per group
    # f32 Var/Std: whole rows load unpredicated, where ptxas sank the predicated loads to
    # their adds.
    # (Measurements: docs/design/reduce.md, "Measured constants".)
    WHOLE_LOADS = ops.stat == "mean" and element.byte_width == 4

    def reduce_backward_rows_reg(dy, xv, y, dx, dxv, out_numel, extent, row_words, dy_stride,
                                 y_stride, log2_lanes, param, flags):
        """The Max/Min (tie count: ``count = #(x == y)``) or Var/Std (``mean = sum(x) /
        extent``) gradient of ``out_numel`` word-aligned contiguous rows of ``extent``
        elements (a multiple of W, at most ``lanes * VEC_LOADS`` words), ``row_words`` words
        apart in both ``x`` and ``dx``: ``lanes = 2**log2_lanes`` lanes per row
        (consecutive threads) hold the row's words in registers, lane ``l`` the words ``l +
        u * lanes``; the per-lane totals meet in an xor-shuffle butterfly (every lane gets
        the same value), then, for rows wider than a warp, the warps' totals in shared
        memory in warp order (a fixed order: deterministic). The kinds without a statistic
        (Prod, Norm2, LogSumExp: ``dx = element(coefficient(dy, y), x)``) skip the totals:
        every load of the row in flight at once, then every store."""
        # in-row indices are 32-bit (a row holds at most 256 * VEC_LOADS words) and lanes
        # is a power of two. Registers (ptxas, sm_90): 45-51, 4-5 resident blocks per SM;
        # with 64-bit index math about twice that.
        # (Measurements: docs/design/reduce.md, "Measured constants".)
        tid = uint32(cuda.threadIdx.x)
        log_lanes = uint32(log2_lanes)
        lanes = uint32(1) << log_lanes
        lane = tid & (lanes - uint32(1))
        slot = tid >> log_lanes
        slots = uint32(cuda.blockDim.x) >> log_lanes
        row_warps = lanes >> uint32(5)  # > 1: the row spans several warps
        partial = cuda.shared.array(PARTIALS, ACC)
        words = cuda.local.array(VEC_LOADS, uint64)
        values = cuda.local.array(W, ACC)
        results = cuda.local.array(W, ACC)
        nvec = uint32(extent >> LOG_W)
        # words of the row this lane holds (the same for every row)
        mine = uint32(uint32(nvec + lanes - uint32(1) - lane) >> log_lanes) if lane < nvec \
            else uint32(0)
        parity = uint32(0)
        reads_y = READS_Y and (not Y_BY_FLAG or (flags & FLAG_STD) != 0)
        group = int64(cuda.blockIdx.x)
        while group * slots < out_numel:  # uniform across the block
            o = group * slots + slot
            valid = o < out_numel
            g = load(dy, o * dy_stride) if valid else ACC(0)
            yv = load(y, o * y_stride) if reads_y and valid else g
            at = uint64(o * row_words) + uint64(lane)
            held = mine if valid else uint32(0)
            # every load of the row in flight at once: unpredicated where every row of the
            # block is whole (ptxas sank the predicated loads to their use)
            if WHOLE_LOADS and mine == uint32(VEC_LOADS) and (group + 1) * slots <= out_numel:
                for u in range(VEC_LOADS):
                    words[u] = xv[at + uint64(uint32(u) << log_lanes)]
            else:
                for u in range(VEC_LOADS):
                    if u < held:
                        words[u] = xv[at + uint64(uint32(u) << log_lanes)]
            total = ACC(0)
            masks = False  # the ties from equality masks (f16/bf16; bf16 on sm_90)
            yw = uint64(0)
            if TIE_MASKS:
                masks = tie_usable()
                if masks:
                    yw = splat(yv, results)
                    n = int32(0)
                    for u in range(VEC_LOADS):
                        if u < held:
                            n += tie_count(tie_mask(words[u], yw))
                    total = ACC(n)
            if STAT:
                for u in range(VEC_LOADS):
                    if u < held and not masks:
                        unpack(words[u], values, 0)
                        for e in range(W):
                            if STAT_TIES:
                                total += ACC(1) if values[e] == yv else ACC(0)
                            else:
                                total += values[e]
                width = min(lanes, uint32(32)) >> uint32(1)
                while width >= uint32(1):  # a + b == b + a: both lanes of a pair: one sum
                    total += shfl_xor(total, width)
                    width = uint32(width >> uint32(1))
                if row_warps > uint32(1):
                    if tid & uint32(31) == uint32(0):
                        partial[uint32(parity * uint32(WARPS) + (tid >> uint32(5)))] = total
                    cuda.syncthreads()
                    first = uint32(parity * uint32(WARPS) + slot * row_warps)
                    total = partial[first]
                    for w in range(1, row_warps):
                        total += partial[uint32(first + uint32(w))]
                    parity = uint32(parity ^ uint32(1))
            mean = g
            count = int64(0)
            if STAT_TIES:
                count = int64(total)
            elif STAT:
                mean = total / ACC(extent)
            cf = ACC(coefficient(g, yv, mean, count, param, flags))
            if TIE_MASKS and masks:  # each element cf where it ties, else cf - cf
                cw = splat(cf, results)
                zw = splat(cf - cf, results)
                for u in range(VEC_LOADS):
                    if u < held:
                        store_word(dx, dxv, at + uint64(uint32(u) << log_lanes),
                                   tie_select(tie_mask(words[u], yw), cw, zw), 0)
            for u in range(VEC_LOADS):
                if u < held and not masks:
                    unpack(words[u], values, 0)
                    for e in range(W):
                        results[e] = element_fn(cf, values[e], yv, mean)
                    w = pack(results)
                    store_word(dx, dxv, at + uint64(uint32(u) << log_lanes), w, 0)
            group += cuda.gridDim.x

    return reduce_backward_rows_reg


#: Threads of the hold gradient's blocks (a power of two, at most SHARED_SLOTS).
#: (Measurements: docs/design/reduce.md, "Measured constants".)
SYNC_BLOCK = 64 if SIMULATOR else 256
#: A published chunk partial: the bits of the f64 total, inverted (0 = not yet written; a
#: NaN total is written as the canonical NaN, whose inverse is not 0).
_CANONICAL_NAN_BITS = int64(0x7FF8000000000000)


@cuda.jit(device=True, inline=True)
def _block_total(value, sums, tid, block):
    """The f64 sum of ``value`` over the block (``sums``: one shared f64 per warp), in a
    fixed order, for every thread. The whole block calls it (two block barriers)."""
    width = 16
    while width >= 1:  # xor butterfly: every lane ends with the same sum
        value += shfl_xor(value, width)
        width >>= 1
    if tid & 31 == 0:
        sums[tid >> 5] = value
    cuda.syncthreads()
    total = float64(0)
    for w in range(block >> 5):
        total += sums[w]
    cuda.syncthreads()  # sums is free again
    return total


@cuda.jit(device=True, inline=True)
def _block_totals2(a, b, sums, tid, block):
    """``(_block_total(a), _block_total(b))`` (the same additions in the same order, so
    the same bits) in one pass: two barriers, not four (``sums``: two f64 per warp)."""
    width = 16
    while width >= 1:
        a += shfl_xor(a, width)
        b += shfl_xor(b, width)
        width >>= 1
    warps = block >> 5
    if tid & 31 == 0:
        sums[tid >> 5] = a
        sums[warps + (tid >> 5)] = b
    cuda.syncthreads()
    total_a = float64(0)
    total_b = float64(0)
    for w in range(warps):
        total_a += sums[w]
        total_b += sums[warps + w]
    cuda.syncthreads()  # sums is free again
    return total_a, total_b


@cuda.jit(device=True, inline=True)
def _first_ticket(ctl, shared_t, tid):
    """The block's first work item: thread 0 takes ticket ``ctl[0]`` (an atomic counter,
    zero before the launch) and the block reads it from ``shared_t[0]``."""
    if tid == 0:
        shared_t[0] = cuda.atomic.add(ctl, 0, int64(1))
    cuda.syncthreads()
    return shared_t[0]


@cuda.jit(device=True, inline=True)
def _publish_partial(partials, k, chunk_total, tid):
    """Thread 0 publishes chunk ``k``'s f64 total: its bits inverted, one atomic exchange
    (the value is its own ready flag; a NaN total as the canonical NaN)."""
    if tid == 0:
        if chunk_total != chunk_total:
            bits = _CANONICAL_NAN_BITS
        else:
            bits = bitcast(chunk_total, int64)
        cuda.atomic.exch(partials, k, ~bits)


def _make_row_total(read: Any, slots: int) -> Any:
    """``row_total(partials, row, parts, sums, tid, block)``: the f64 sum of ``row``'s
    ``parts`` published chunk totals, each read by ``read(partials, k)`` until every one is
    published, added in a fixed order (the same for every chunk of the row), for every
    thread. The whole block calls it. ``slots`` 0: a thread reads totals ``tid``, ``tid +
    block``,... (any ``parts``); else exactly ``slots`` of them, unrolled (``parts`` at
    most ``slots * block``: a loop of unknown count was unrolled by the compiler, 32 reads
    a thread, and spilled)."""
    SLOTS = slots

    @cuda.jit(device=True, inline=True)
    def add_partial(partials, k, row_total, published):
        bits = read(partials, k)
        return row_total + bitcast(~bits, float64), published & (bits != 0)

    @cuda.jit(device=True, inline=True)
    def row_total_fn(partials, row, parts, sums, tid, block):
        step = int64(block)
        while True:
            row_total = float64(0)
            published = True
            if SLOTS:
                for i in range(SLOTS):
                    q = int64(tid) + i * step
                    if q < parts:
                        row_total, published = add_partial(partials, row * parts + q,
                                                           row_total, published)
            else:
                q = int64(tid)
                while q < parts:
                    row_total, published = add_partial(partials, row * parts + q,
                                                       row_total, published)
                    q += step
            if cuda.syncthreads_and(int32(published)):
                break
        return _block_total(row_total, sums, tid, block)

    return row_total_fn


#: Chunk totals a thread of the hold kernels reads (a row's parts <= HOLD_POLL_SLOTS *
#: SYNC_BLOCK: the plan's rule).
HOLD_POLL_SLOTS = 2
#: The hold kernels' wait: relaxed loads (``load_relaxed``), HOLD_POLL_SLOTS a thread.
#: (Measurements: docs/design/reduce.md, "Measured constants".)
_row_total_held = _make_row_total(load_relaxed, HOLD_POLL_SLOTS)


def _row_statistic(kind: ReduceKind, element: ElementKind) -> tuple[Any, Any, Any]:
    """``(row_saved, term, row_coefficient)`` of the gradients with a row statistic (a
    sum over the row): Var/Std ``dx = c * (x - mean)``, ``mean = total / extent``, the
    total a sum of x; Max/Min ``dx = (dy / count) * (x == y)``, the total a count of the
    ties ``x == y`` (exact in f64). ``row_saved(dy, y, row, dy_stride, y_stride)`` loads
    the row's ``(dy, y)`` (y is dy where the kind does not read it); ``term(v, yv)`` is
    an element's share of the total, in the element's accumulator; ``row_coefficient(g,
    yv, row_total, extent, param)`` gives the row's ``(c, y, mean)`` from them and the
    row's f64 total (``mean`` 0 for the ties)."""
    ops = GRAD_OPS[kind]
    assert ops.stat in ("mean", "ties")
    spec = ELEMENTS[element]
    ACC = spec.acc
    load = spec.load
    coefficient, _, READS_Y, Y_BY_FLAG = _grad_parts(kind, element)
    TIES_STAT = ops.stat == "ties"

    @cuda.jit(device=True, inline=True)
    def row_saved(dy, y, row, dy_stride, y_stride, flags):
        g = load(dy, row * dy_stride)
        reads_y = READS_Y and (not Y_BY_FLAG or (flags & FLAG_STD) != 0)
        return g, load(y, row * y_stride) if reads_y else g

    @cuda.jit(device=True, inline=True)
    def term(v, yv):
        if TIES_STAT:
            return ACC(1) if v == yv else ACC(0)
        return v

    @cuda.jit(device=True, inline=True)
    def row_coefficient(g, yv, row_total, extent, param, flags):
        if TIES_STAT:
            return ACC(coefficient(g, yv, ACC(0), int64(row_total), param, flags)), yv, \
                ACC(0)
        mean = ACC(row_total / float64(extent))
        return ACC(coefficient(g, yv, mean, int64(0), param, flags)), yv, mean

    return row_saved, term, row_coefficient


#: Words per thread of one part of a hold chunk (registers; the second part is the
#: stash): the part of the plan's layout (``_SYNC_BATCHES`` batches of VEC_LOADS words,
#: plans.reduce, which asserts they match).
HOLD_WORDS = (1 if SIMULATOR else 2) * VEC_LOADS
#: Dynamic shared memory of a ``reduce_backward_rows_hold_stash`` block: HOLD_WORDS more
#: words a thread, copied by ``cp.async`` (no register) with the register loads in
#: flight. (Measurements: docs/design/reduce.md, "Measured constants".)
HOLD_STASH_BYTES = HOLD_WORDS * SYNC_BLOCK * 8


#: Register cap of the hold kernels: four 256-thread blocks per SM.
#: (Measurements: docs/design/reduce.md, "Measured constants".)
HOLD_MAX_REGISTERS = 64
#: The hold kernels' blocks start in HOLD_PHASES phases (by block index), phase k
#: HOLD_PHASE_NS * k late, where the grid takes at least HOLD_PHASE_WAVES tickets a block.
#: A grid started at once loads its first rows together, so they complete together and
#: their blocks take the next rows together (a trace: blocks waited 31-44 % of their
#: time); the phases spread the rows' completions.
#: (Measurements: docs/design/reduce.md, "Measured constants".)
HOLD_PHASES = 4
HOLD_PHASE_NS = 2500
HOLD_PHASE_WAVES = 4


def _hold_chunk_io(kind: ReduceKind, element: ElementKind, stash: int) -> tuple[Any, Any]:
    """``(load_chunk, store_chunk)`` of ``reduce_backward_rows_hold``: a thread's loads of
    its words of a chunk, and its dx stores from them."""
    STASH = stash
    vec = VECTOR[element]
    unpack, pack, store_word = vec.unpack, vec.pack, vec.store_word
    W = vec.width
    element_fn = _grad_fns(kind, element)[1]
    copy_stash = copy_async8_run(STASH, SYNC_BLOCK)

    @cuda.jit(device=True, inline=True)
    def load_chunk(xv, words, parked, slot, at, j, step, left):
        """Issue the thread's loads of its chunk: HOLD_WORDS words into ``words`` and, with
        the stash, STASH more by ``cp.async`` into its ``parked`` slots (``left``: the
        thread's words in the chunk)."""
        # every word of a full chunk: the loads unpredicated. Predicated, ptxas (sm_90,
        # 64 registers) sank f32 loads to their sums, a few in flight at a time.
        # (Measurements: docs/design/reduce.md, "Measured constants".)
        if left > (HOLD_WORDS + STASH - 1) * SYNC_BLOCK:
            copy_stash(parked, slot, xv, at + uint64(j + HOLD_WORDS * step))
            for u in range(HOLD_WORDS):
                words[u] = xv[at + uint64(j + u * step)]
        else:
            for u in range(STASH):
                if int32((HOLD_WORDS + u) * SYNC_BLOCK) < left:
                    copy_async8(parked, u * SYNC_BLOCK + slot, xv,
                                at + uint64(j + (HOLD_WORDS + u) * step))
            for u in range(HOLD_WORDS):  # all in flight at once
                if int32(u * SYNC_BLOCK) < left:
                    words[u] = xv[at + uint64(j + u * step)]

    @cuda.jit(device=True, inline=True)
    def store_chunk(dx, dxv, words, parked, slot, at, j, step, left, cf, yv, mean, values,
                    results):
        """Write dx of the thread's held words (registers, then its stash slots)."""
        for u in range(HOLD_WORDS):
            if int32(u * SYNC_BLOCK) < left:
                unpack(words[u], values, 0)
                for e in range(W):
                    results[e] = element_fn(cf, values[e], yv, mean)
                store_word(dx, dxv, at + uint64(j + u * step), pack(results), 0)
        for u in range(STASH):
            if int32((HOLD_WORDS + u) * SYNC_BLOCK) < left:
                unpack(parked[u * SYNC_BLOCK + slot], values, 0)
                for e in range(W):
                    results[e] = element_fn(cf, values[e], yv, mean)
                store_word(dx, dxv, at + uint64(j + (HOLD_WORDS + u) * step),
                           pack(results), 0)

    return load_chunk, store_chunk


def _make_backward_rows_hold(kind: ReduceKind, element: ElementKind,
                             stash: int) -> Callable[..., None]:
    STASH = stash  # words a thread parks in dynamic shared memory (cp.async): 0 or HOLD_WORDS
    PHASES = 1 if SIMULATOR else HOLD_PHASES
    assert STASH in (0, HOLD_WORDS)
    HALVES = 2 if STASH else 1  # parts (partials) a chunk of this kernel spans
    SUMS = 2 * (SHARED_SLOTS // 32)  # _block_totals2's two f64 a warp
    vec = VECTOR[element]
    ACC = ELEMENTS[element].acc
    unpack = vec.unpack
    W, LOG_W = vec.width, vec.log_width
    row_saved, term, row_coefficient = _row_statistic(kind, element)
    load_chunk, store_chunk = _hold_chunk_io(kind, element, stash)
    # Every kind loads the row's dy (and y) with the chunk, not after the wait (Max/Min
    # need y for their sum anyway).
    # (Measurements: docs/design/reduce.md, "Measured constants".)

    def reduce_backward_rows_hold(dy, xv, y, dx, dxv, ctl, partials, out_numel, extent,
                                  row_words, dy_stride, y_stride, parts, param, flags):
        """The gradient of ``out_numel`` long word-aligned rows, ``row_words`` words apart,
        whose row statistic is a sum over the row (``_row_statistic``): Var/Std ``dx = c *
        (x - mean)`` (``mean = sum(x) / extent``), Max/Min ``dx = (dy / count) * (x == y)``
        (``count`` the row's ties ``x == y``), with x read once. Each row is cut into the
        plan's ``parts`` parts of ``HOLD_WORDS * blockDim`` words; this kernel's chunk is
        ``HALVES`` of them (the second parked in shared memory), numbered row by row and
        handed out in ticket order (``ctl[0]``). A chunk's block loads its words (into
        registers; with the stash the second half by ``cp.async`` into shared memory), sums
        each half's terms, publishes their f64 totals in ``partials`` (one a part), waits
        until its row's ``parts`` totals are all published (relaxed loads, HOLD_POLL_SLOTS a
        thread), adds them in a fixed order and writes its chunk of ``dx`` from registers
        and shared memory. The blocks start in HOLD_PHASES phases, HOLD_PHASE_NS apart,
        where the grid takes HOLD_PHASE_WAVES tickets a block or more.

        A chunk waits for chunks with larger tickets, so the row's other chunks must be
        resident at once. A block takes its next ticket only after its row's total is in
        (while it stores), so a waiting block holds one ticket; with a row's chunks no
        more than the resident blocks, the lowest unfinished ticket's row then always has
        every chunk taken by a running block (the plan takes this kernel only where a
        row's chunks are at most a quarter (Max/Min: an eighth) of the device's resident
        blocks, or half when forced, or a row is one chunk). The plan launches it
        cooperatively (``cuLaunchCooperativeKernel``), so every block of its grid (at most
        the resident blocks) runs at once whatever else shares the device; a grid the
        device cannot hold fails to launch rather than waiting (``plan.row_hold = False``
        takes the statistic pass and the word rows, or Max/Min's tie count after dx).
        ``ctl`` and ``partials`` are zero before the launch; the block is SYNC_BLOCK
        threads (a constant here: the words' offsets are immediates)."""
        tid = cuda.threadIdx.x
        block = SYNC_BLOCK  # the launch's block: the words' offsets are immediates
        shared_t = cuda.shared.array(1, int64)
        sums = cuda.shared.array(SUMS, float64)
        words = cuda.local.array(HOLD_WORDS, uint64)
        values = cuda.local.array(W, ACC)
        results = cuda.local.array(W, ACC)
        parked = cuda.shared.array(0, uint64)
        nvec = extent >> LOG_W
        step = int64(block)
        chunk = step * (HOLD_WORDS + STASH)
        chunks = (parts + (HALVES - 1)) // HALVES  # this kernel's chunks a row
        n = out_numel * chunks
        if tid == 0 and PHASES > 1 and n >= HOLD_PHASE_WAVES * int64(cuda.gridDim.x):
            # phase k of PHASES (by block index) starts k * HOLD_PHASE_NS late
            wait_ns(HOLD_PHASE_NS * ((int64(cuda.blockIdx.x) * PHASES)
                                     // int64(cuda.gridDim.x)))
        t = _first_ticket(ctl, shared_t, tid)
        while t < n:  # uniform across the block
            row = t // chunks
            part = (t - row * chunks) * HALVES  # the part of the first half
            at = uint64(row * row_words)
            j = (t - row * chunks) * chunk + tid
            # The chunk's loops (here, load_chunk, store_chunk) run against a thread's word
            # count: with bounds j + u·step < end (_mean_grad_batches' helpers) the kernel
            # ran slower. (Measurements: docs/design/reduce.md, "Measured constants".)
            count = min(nvec - (j - tid), chunk)  # words of this chunk
            # the thread's words left in it: 32-bit bounds against immediates (64-bit
            # tid + u·step bounds were hoisted out of the loop, 32 registers, and spilled)
            left = int32(count - tid)
            # the thread's first stash slot, hidden from the compiler: the slots' shared
            # addresses then stay an immediate from one register (hoisted out of the
            # ticket loop they were 16 registers for the whole kernel: f32 Var spilled
            # 64 bytes at the 64-register cap, against none now; ptxas -v, sm_90)
            slot = opaque(int32(tid))
            load_chunk(xv, words, parked, slot, at, j, step, left)
            g, yv = row_saved(dy, y, row, dy_stride, y_stride, flags)  # with the chunk
            total = ACC(0)
            for u in range(HOLD_WORDS):
                if int32(u * SYNC_BLOCK) < left:
                    unpack(words[u], values, 0)
                    for e in range(W):
                        total += term(values[e], yv)
            if STASH:
                copy_async_wait()
                second = ACC(0)
                for u in range(STASH):  # the thread's own slots: no barrier
                    if int32((HOLD_WORDS + u) * SYNC_BLOCK) < left:
                        unpack(parked[u * SYNC_BLOCK + slot], values, 0)
                        for e in range(W):
                            second += term(values[e], yv)
                first_total, second_total = _block_totals2(float64(total), float64(second),
                                                           sums, tid, block)
                _publish_partial(partials, row * parts + part, first_total, tid)
                if part + 1 < parts:
                    _publish_partial(partials, row * parts + part + 1, second_total, tid)
            else:
                _publish_partial(partials, row * parts + part,
                                 _block_total(float64(total), sums, tid, block), tid)
            row_total = _row_total_held(partials, row, parts, sums, tid, block)
            # the next ticket, in flight during the stores: taken only now, once this
            # chunk waits for nothing (a ticket taken before the wait would be a chunk
            # that no block starts while its holder waits, perhaps for that very chunk)
            if tid == 0:
                shared_t[0] = cuda.atomic.add(ctl, 0, int64(1))
            cf, yv, mean = row_coefficient(g, yv, row_total, extent, param, flags)
            store_chunk(dx, dxv, words, parked, slot, at, j, step, left, cf, yv, mean, values,
                        results)
            cuda.syncthreads()  # shared_t holds the next ticket
            t = shared_t[0]

    return reduce_backward_rows_hold


