"""Gradient kernels of strided (column) lines: word access (``_make_backward_cols_vec``)
and strips of columns held in registers (``_make_backward_cols_reg``).
"""


from collections.abc import Callable
from typing import Any

from numba import cuda, int64, uint32, uint64

from ..._runtime import SIMULATOR
from ...types import ElementKind, ReduceKind
from ..common import shfl_idx, shfl_xor
from .backward import FLAG_STD, _grad_parts
from .ops import ELEMENTS, GRAD_OPS, _grad_checked, _grad_fns
from .ties import REWRITE_MASKS_COLS, _col_mask_layout, _col_tied_rewriter, _tie_words
from .words import _MAX_WIDTH, VEC_LOADS, VECTOR, tie_mask_iters


def _cols_vec_steps(kind: ReduceKind, element: ElementKind) -> Any:
    """``word_coefficients`` of ``reduce_backward_cols_vec``."""
    ops = GRAD_OPS[kind]
    spec = ELEMENTS[element]
    vec = VECTOR[element]
    ACC = spec.acc
    load = spec.load
    pack = vec.pack
    W, LOG_W = vec.width, vec.log_width
    coefficient, _, READS_Y, Y_BY_FLAG = _grad_parts(kind, element)
    STAT_MEAN, STAT_TIES = ops.stat == "mean", ops.stat == "ties"
    TIE_MASKS = STAT_TIES and vec.eq_mask is not None  # as in _make_backward_cols_vec

    @cuda.jit(device=True, inline=True)
    def word_coefficients(dy, y, stat_acc, stat_k, ow, dy_stride, y_stride, extent, param,
                          mode, masks, cfs, ys, means, ties, results, valid, sparse, yw, cw,
                          zw, flags):
        """The W coefficients (``cfs``), extremes (``ys``) and means of output word ``ow``
        and, for the tie masks, their packed words; returns ``(valid, sparse, yw, cw,
        zw)``: ``valid`` False for a word the rewrite pass leaves as the first pass wrote
        it, ``sparse`` where it rewrites only the tied words."""
        rewrite = False
        sparse = STAT_TIES and mode == 3
        reads_y = READS_Y and (not Y_BY_FLAG or (flags & FLAG_STD) != 0)
        for e in range(W):
            o = (ow << LOG_W) + e
            g = load(dy, o * dy_stride)
            yv = load(y, o * y_stride) if reads_y else g
            mean = g
            count = int64(0)
            if STAT_MEAN:
                mean = stat_acc[uint64(o)] / ACC(extent)  # the statistic pass's sum
            if STAT_TIES:
                count = int64(1) if mode == 2 else stat_k[uint64(o)]
                rewrite = rewrite or count != 1
                sparse = sparse and count != 0  # a NaN extreme: every word
                ties[e] = 0
            cfs[e] = ACC(coefficient(g, yv, mean, count, param, flags))
            ys[e] = yv
            means[e] = mean
        if TIE_MASKS and masks:
            yw = pack(ys)
            cw = pack(cfs)
            for e in range(W):
                results[e] = cfs[e] - cfs[e]
            zw = pack(results)
        if STAT_TIES and mode == 3 and not rewrite:
            valid = False  # written by the first pass
        return valid, sparse, yw, cw, zw


    return word_coefficients


def _cols_word_walk(kind: ReduceKind, element: ElementKind) -> Any:
    """``walk_words`` of ``reduce_backward_cols_vec``: the word loop of the kinds that
    read x."""
    ops = GRAD_OPS[kind]
    vec = VECTOR[element]
    unpack, pack, store_word = vec.unpack, vec.pack, vec.store_word
    W = vec.width
    element_fn = _grad_fns(kind, element)[1]
    # a word's elements by the fast formula, checked without a branch; the exact one for
    # the elements of a word where the check fails (Prod: 1 / x outside the normal range)
    checked = _grad_checked(kind, element)
    CHECKED = checked is not None
    fast_fn, fast_holds, exact_fn = checked or (None,) * 3
    STAT_TIES = ops.stat == "ties"
    MASK_ITERS = tie_mask_iters(W)
    ELEMENT_BITS = uint64(sum(1 << b for b in range(0, 64, W)))  # element 0 of each word
    # f16/bf16 ties from equality masks of the packed words (TieWords; bf16 on sm_90): dx
    # by one select a word, the tie bits only for the (rare) words with a tie
    TIE_MASKS = STAT_TIES and vec.eq_mask is not None
    ties_w = _tie_words(element) if TIE_MASKS else None
    tie_mask, tie_select = (ties_w.mask, ties_w.select) if TIE_MASKS else (None,) * 2
    FIELD = 64 // W  # bits per element of an equality mask
    # The mean's gradient walks each chunk from its end: the statistic pass (the same
    # chunks, walked forwards by blocks that all run at once) read those rows last, so the
    # first re-reads of x can still hit L2.
    # (Measurements: docs/design/reduce.md, "Measured constants".)
    BACKWARDS = ops.stat == "mean"

    @cuda.jit(device=True, inline=True)
    def word_gradient(word, cfs, ys, means, values, results, tied, first_bit):
        """The dx word of x word ``word`` by the element formula; ``tied`` with bit
        ``first_bit + e`` set where element e ties (Max/Min)."""
        unpack(word, values, 0)
        holds = True
        for e in range(W):
            if CHECKED:
                results[e] = fast_fn(cfs[e], values[e], ys[e], means[e])
                holds = holds & fast_holds(values[e])
            else:
                results[e] = element_fn(cfs[e], values[e], ys[e], means[e])
            if STAT_TIES and values[e] == ys[e]:
                tied |= uint32(1 << (first_bit + e))
        if CHECKED:
            if not holds:
                for e in range(W):
                    if not fast_holds(values[e]):
                        results[e] = exact_fn(cfs[e], values[e], ys[e], means[e])
        return pack(results), tied

    @cuda.jit(device=True, inline=True)
    def walk_words(xv, dx, dxv, stat_k, words, values, results, cfs, ys, means, ties, yw, cw,
                   zw, masks, i, at, begin, end, span, word_span, mask_at, mask_span, mode):
        """This lane's rows ``i, i + span, ...`` of its chunk ``[begin, end)`` (the mean's
        from the last down), VEC_LOADS word loads in flight, then their stores; ``mode``
        2 records the ties in the masks (at ``mask_at + g * mask_span``) and adds them to
        ``ties``."""
        it = int64(0)
        mask = uint64(0)
        step = VEC_LOADS * span
        at_step = VEC_LOADS * word_span
        if BACKWARDS and i < end:  # from this lane's last batch down
            last = (end - 1 - i) // step
            i += last * step
            at += last * at_step
            step = -step
            at_step = -at_step
        while i >= begin and i < end:
            for u in range(VEC_LOADS):
                if i + u * span < end:
                    words[u] = xv[uint64(at + u * word_span)]
            tied = uint32(0)  # bit u * W + e: element e of word u ties
            for u in range(VEC_LOADS):
                if TIE_MASKS and masks and i + u * span < end:
                    m = tie_mask(words[u], yw)
                    store_word(dx, dxv, at + u * word_span, tie_select(m, cw, zw), 0)
                    if m != 0:  # rare: the word's tie bits
                        for e in range(W):
                            if (m >> uint64(e * FIELD)) & uint64(1) != 0:
                                tied |= uint32(1 << (u * W + e))
                elif i + u * span < end:
                    w, tied = word_gradient(words[u], cfs, ys, means, values, results, tied,
                                            u * W)
                    store_word(dx, dxv, at + u * word_span, w, 0)
            i += step
            at += at_step
            if STAT_TIES:
                mask |= uint64(tied) << uint64(it % MASK_ITERS * (VEC_LOADS * W))
            it += 1
            if STAT_TIES and mode == 2 and (it % MASK_ITERS == 0 or i >= end):
                stat_k[uint64(mask_at + (it - 1) // MASK_ITERS * mask_span)] = int64(mask)
                for e in range(W):  # bits e, e + W,...: column e of the word
                    ties[e] += int64(cuda.popc(mask & (ELEMENT_BITS << uint64(e))))
                mask = uint64(0)

    return walk_words


def _make_backward_cols_vec(kind: ReduceKind, element: ElementKind,
                            rewrite_pass: bool = False) -> Callable[..., None]:
    """The column word gradient kernel; for Max/Min (the tie count after dx) either its
    modes 0 and 2 or, with ``rewrite_pass``, its mode 3 alone (whatever ``mode`` says), so
    that the first pass does not hold the rewrite's registers. (``ptxas`` alone gives the
    first pass 70 / 64 registers, bf16 / f32; Numba's build gives it 96 / 124, 2 resident
    blocks per SM, which capped at 64-80 were slower or even: docs/design/reduce.md.)"""
    ops = GRAD_OPS[kind]
    vec = VECTOR[element]
    ACC = ELEMENTS[element].acc
    pack, store_word = vec.pack, vec.store_word
    W, LOG_W = vec.width, vec.log_width
    element_fn = _grad_fns(kind, element)[1]
    READS_X = ops.reads_x
    STAT_TIES = ops.stat == "ties"
    rewrite_tied = _col_tied_rewriter(element, REWRITE_MASKS_COLS)
    mask_groups, mask_at_of = _col_mask_layout(element)
    # f16/bf16 Max/Min take their ties from equality masks of packed words (TieWords)
    tie_usable = _tie_words(element).usable if STAT_TIES and vec.eq_mask is not None \
        else None
    TIE_MASKS = tie_usable is not None
    REWRITE_PASS = rewrite_pass
    word_coefficients = _cols_vec_steps(kind, element)
    walk_words = _cols_word_walk(kind, element)

    def reduce_backward_cols_vec(dy, xv, y, dx, dxv, stat_acc, stat_k, out_numel, extent,
                                 axis_words, dy_stride, y_stride, lanes, chunk_len, param,
                                 mode, flags):
        """The gradient in the column layout with word loads and stores: ``x`` and ``dx``
        are ``extent`` rows of ``out_numel`` contiguous outputs, ``axis_words`` words apart
        (same layout, word aligned); each slot owns the W outputs of one word (W
        coefficients), its lanes walk the axis (the Var/Std gradients from the chunk's
        end down); the statistic comes from ``stat_acc``/``stat_k``. ``mode`` 2 and 3:
        the tie count's two passes. 2 writes dx with every count taken as 1, records the
        ties in the masks (as ``fused`` 2 of ``reduce_backward_rows_vec``) and adds each
        lane's ties to ``stat_k[o]`` (zeroed before; integer atomics, so the total does
        not depend on their order); 3 rewrites the words of the lines whose count is not
        1, in a grid of fewer splits than the first pass's (its blocks loop over the
        splits: most lines need nothing); 0 otherwise. f16/bf16 Max/Min words (bf16 on
        sm_90) take their ties from equality masks (``TieWords``): dx by one select a
        word, the tie bits only for a word with a tie."""
        if STAT_TIES:  # mode 3 in the rewrite kernel only (a constant there)
            mode = 3 if REWRITE_PASS else (2 if mode == 3 else mode)
        tid = cuda.threadIdx.x
        block = cuda.blockDim.x
        slots = block // lanes
        lane = tid // slots
        slot = tid % slots
        split = int64(cuda.blockIdx.y)
        begin = split * chunk_len
        end = min(extent, begin + chunk_len)
        # the axis splits (the grid's y in modes 0-2; mode 3 may take fewer blocks, which
        # loop over the splits)
        n_splits = (extent + chunk_len - 1) // chunk_len
        out_words = out_numel >> LOG_W
        span = int64(lanes)
        word_span = span * axis_words
        cfs = cuda.local.array(W, ACC)
        ys = cuda.local.array(W, ACC)
        means = cuda.local.array(W, ACC)
        ties = cuda.local.array(W, int64)
        words = cuda.local.array(VEC_LOADS, uint64)
        values = cuda.local.array(W, ACC)
        results = cuda.local.array(W, ACC)
        masks = tie_usable() if TIE_MASKS else False
        group = int64(cuda.blockIdx.x)
        while group * slots < out_words:
            ow = group * slots + slot
            valid = ow < out_words
            sparse = False
            yw = cw = zw = uint64(0)  # the words of the W extremes, cfs, cfs - cfs
            if valid:
                valid, sparse, yw, cw, zw = word_coefficients(
                    dy, y, stat_acc, stat_k, ow, dy_stride, y_stride, extent, param, mode,
                    masks, cfs, ys, means, ties, results, valid, sparse, yw, cw, zw, flags)
            if STAT_TIES:
                split = int64(cuda.blockIdx.y)
                if valid and sparse:  # every split this block walks, at once
                    rewrite_tied(dx, dxv, stat_k, out_numel, span, lane, ow, out_words,
                                 chunk_len, extent, axis_words, split,
                                 int64(cuda.gridDim.y), n_splits, cfs, results)
                    valid = False
            while valid:
                if STAT_TIES:  # mode 3 loops over the splits
                    begin = split * chunk_len
                    end = min(extent, begin + chunk_len)
                i = begin + lane
                at = i * axis_words + ow
                # tie masks as in reduce_backward_rows_vec, after the out_numel counts
                # (_col_mask_layout: mask g at mask_at + g * span * out_words)
                mask_at = mask_at_of(out_numel, split, mask_groups(chunk_len, span),
                                     int64(0), span, lane, out_words, ow)
                if READS_X:
                    walk_words(xv, dx, dxv, stat_k, words, values, results, cfs, ys, means,
                               ties, yw, cw, zw, masks, i, at, begin, end, span, word_span,
                               mask_at, span * out_words, mode)
                else:
                    for e in range(W):
                        results[e] = element_fn(cfs[e], cfs[e], ys[e], means[e])
                    w = pack(results)
                    while i < end:
                        store_word(dx, dxv, at, w, 0)
                        i += span
                        at += word_span
                if not STAT_TIES or mode != 3:
                    break
                split += int64(cuda.gridDim.y)
                valid = split < n_splits
            if STAT_TIES and mode == 2:  # this lane's ties, added to the line's count
                for e in range(W):
                    if ow < out_words and ties[e] != 0:
                        cuda.atomic.add(stat_k, (ow << LOG_W) + e, ties[e])
            group += cuda.gridDim.x

    return reduce_backward_cols_vec


#: Rows (words) each thread of the column register-resident gradient holds, and its block:
#: a 1024-thread block holds 4096 rows of a 32-byte strip of columns (128 KB of registers).
REG_COL_WORDS = 16
REG_COLS_BLOCK = 64 if SIMULATOR else 1024
#: (column word, element) pairs of one tile at most: one warp lane per pair in the combine
#: (up to 32), or each thread adding its own pairs' warp partials (up to 64, in blocks of
#: at most REG_COLS_WIDE_BLOCK threads).
_REG_COL_PAIRS = 32
REG_COL_WIDE_PAIRS = 64
REG_COLS_WIDE_BLOCK = 64 if SIMULATOR else 256
#: The 256-byte strips of short columns (``REDUCE_BACKWARD_COLS_STRIP_KERNELS``): the
#: column words of a strip, the rows each thread holds, and the largest block (at most
#: 256 rows on the GPU: 8 row lanes of 32 rows).
REG_COL_STRIP_WORDS = 32
REG_COL_STRIP_HELD = 32
REG_COLS_STRIP_BLOCK = 64 if SIMULATOR else 256


def _cols_reg_steps(kind: ReduceKind, element: ElementKind, stash: int, wide_words: int,
                    held: int) -> tuple[Any, Any, Any, Any]:
    """The steps of ``reduce_backward_cols_reg``: ``(load_words, count_word, grad_word,
    column_totals)``."""
    vec = VECTOR[element]
    ACC = ELEMENTS[element].acc
    unpack, pack, store_word = vec.unpack, vec.pack, vec.store_word
    W = vec.width
    element_fn = _grad_fns(kind, element)[1]
    STAT_TIES = GRAD_OPS[kind].stat == "ties"
    SLOTS = _cols_reg_slots()
    HELD = held
    # strips of up to ``wide_words`` words may hold more than 32 pairs (16-word f16/bf16
    # strips: 64; 32-word f32 strips: 64, f16/bf16: 128)
    WIDE = wide_words * W > _REG_COL_PAIRS

    @cuda.jit(device=True, inline=True)
    def column_totals(totals, partial, parity, cw, cws, pairs, log_pairs, lane, warp, warps):
        """Turn each thread's ``totals`` (its rows of its column word's W columns) into the
        columns' totals over the block: xor shuffles over the row lanes of a warp, then the
        warps' partials from shared memory (buffer ``parity``) added in warp order."""
        buffer = parity * uint32(SLOTS)
        for e in range(W):  # the row lanes of a warp (lane bits >= log_cw)
            total = totals[e]
            width = uint32(16)
            while width >= cws:
                total += shfl_xor(total, width)
                width = uint32(width >> uint32(1))
            if lane < cws:
                partial[uint32(buffer + warp * pairs + cw * uint32(W) + uint32(e))] = total
        cuda.syncthreads()
        if WIDE and pairs > uint32(32):  # wide strips (small blocks): each thread adds
            for e in range(W):  # its own columns' warp partials, in warp order
                total = ACC(0)
                for w in range(warps):
                    total += partial[uint32(buffer + w * pairs + cw * uint32(W)
                                            + uint32(e))]
                totals[e] = total
        else:
            # every warp: lane -> pair lane % pairs, adding warps lane // pairs + k *
            # parts
            pair = lane & (pairs - uint32(1))
            parts = uint32(32) >> log_pairs
            total = ACC(0)
            w = lane >> log_pairs
            while w < warps:
                total += partial[uint32(buffer + w * pairs + pair)]
                w = uint32(w + parts)
            width = uint32(16)
            while width >= pairs:
                total += shfl_xor(total, width)
                width = uint32(width >> uint32(1))
            for e in range(W):  # lane p < pairs holds pair p's total
                totals[e] = shfl_idx(total, cw * uint32(W) + uint32(e))

    @cuda.jit(device=True, inline=True)
    def load_words(xv, words, at, step, first, held):
        """Issue the loads of rows ``first + u`` (u < HELD, below ``held``) into words:
        unpredicated where all HELD are (ptxas then issues them all before their first
        use; predicated, it sank f32 loads to their sums, a few in flight at a time, and
        spilled more, measurably slower: docs/design/reduce.md)."""
        if first + uint32(HELD) <= held:
            for u in range(HELD):
                words[u] = xv[at + uint64(first + uint32(u)) * step]
        else:
            for u in range(HELD):
                if first + uint32(u) < held:
                    words[u] = xv[at + uint64(first + uint32(u)) * step]

    @cuda.jit(device=True, inline=True)
    def count_word(word, values, ys, totals):
        """Add a word's elements (Max/Min: their ties with y) to the column totals."""
        unpack(word, values, 0)
        for e in range(W):
            if STAT_TIES:
                totals[e] += ACC(1) if values[e] == ys[e] else ACC(0)
            else:
                totals[e] += values[e]

    @cuda.jit(device=True, inline=True)
    def grad_word(dx, dxv, at, word, values, results, cfs, ys, means):
        """dx of a word's elements, stored at word ``at``."""
        unpack(word, values, 0)
        for e in range(W):
            results[e] = element_fn(cfs[e], values[e], ys[e], means[e])
        store_word(dx, dxv, at, pack(results), 0)

    return load_words, count_word, grad_word, column_totals


def _cols_reg_slots() -> int:
    """Warp partials of one buffer of ``reduce_backward_cols_reg``'s shared array."""
    return max(REG_COLS_BLOCK // 32 * _REG_COL_PAIRS,  # one buffer of warp partials
               REG_COLS_WIDE_BLOCK // 32 * REG_COL_WIDE_PAIRS,
               REG_COLS_STRIP_BLOCK // 32 * REG_COL_STRIP_WORDS * _MAX_WIDTH)


def _make_backward_cols_reg(kind: ReduceKind, element: ElementKind, stash: int = 0,
                            wide_words: int = 0,
                            held: int = REG_COL_WORDS) -> Callable[..., None]:
    ops = GRAD_OPS[kind]
    spec = ELEMENTS[element]
    vec = VECTOR[element]
    ACC = spec.acc
    load = spec.load
    W, LOG_W = vec.width, vec.log_width
    coefficient, _, READS_Y, Y_BY_FLAG = _grad_parts(kind, element)
    STAT_TIES = ops.stat == "ties"
    PARTIALS = 2 * _cols_reg_slots()
    STASH = stash
    HELD = held
    assert STASH % HELD == 0, "the stash is loaded HELD words at a time"
    load_words, count_word, grad_word, column_totals = _cols_reg_steps(kind, element, stash,
                                                                       wide_words, held)

    def reduce_backward_cols_reg(dy, xv, y, dx, dxv, out_numel, extent, axis_words,
                                 dy_stride, y_stride, log2_cw, param, flags):
        """The Max/Min or Var/Std gradient (statistic as ``reduce_backward_rows_reg``) in
        the column layout: ``x`` and ``dx`` are ``extent`` rows of ``out_numel`` contiguous
        outputs, ``axis_words`` words apart (word aligned). A block owns ``cw = 2**log2_cw``
        consecutive words of outputs (a strip of columns) over every row: thread ``t``
        holds column word ``t % cw`` of rows ``t // cw + u * (block / cw)``, u <
        REG_COL_WORDS, in registers. The column totals meet in xor shuffles within each
        warp, then every warp adds the warps' partials from shared memory in warp order
        (fixed order: deterministic) and broadcasts them by shuffles; a strip of more than
        32 (word, element) pairs (16 f16/bf16 words) has each thread add its own pairs'
        partials instead, in the same order.

        With ``STASH`` > 0 (a multiple of HELD = REG_COL_WORDS) a thread holds rows u <
        STASH + HELD: the first STASH parked in dynamic shared memory (``STASH *
        REG_COLS_BLOCK`` words, slot ``u * REG_COLS_BLOCK + t``: private to the thread,
        no barrier; a compile-time stride keeps the addresses immediate offsets), the
        rest in registers. The stash goes HELD loads at a time (loaded, counted,
        parked), then the register rows are loaded. A block then holds a strip twice as
        wide (64 instead of 32 bytes of each of 4096 rows), which the memory serves
        faster. Without a stash a thread holds HELD rows, every load in flight at once."""
        tid = uint32(cuda.threadIdx.x)
        log_cw = uint32(log2_cw)
        cws = uint32(1) << log_cw
        cw = tid & (cws - uint32(1))
        rl = tid >> log_cw
        row_lanes = uint32(cuda.blockDim.x) >> log_cw
        pairs = cws * uint32(W)
        log_pairs = log_cw + uint32(LOG_W)
        lane = tid & uint32(31)
        warp = tid >> uint32(5)
        warps = uint32(cuda.blockDim.x) >> uint32(5)
        out_words = out_numel >> LOG_W
        rows = uint32(extent)
        mine = uint32(uint32(rows + row_lanes - uint32(1) - rl) // row_lanes) if rl < rows \
            else uint32(0)
        step = uint64(row_lanes) * uint64(axis_words)
        partial = cuda.shared.array(PARTIALS, ACC)
        parked = cuda.shared.array(0, uint64)
        words = cuda.local.array(HELD, uint64)
        values = cuda.local.array(W, ACC)
        results = cuda.local.array(W, ACC)
        totals = cuda.local.array(W, ACC)
        ys = cuda.local.array(W, ACC)
        cfs = cuda.local.array(W, ACC)
        means = cuda.local.array(W, ACC)
        parity = uint32(0)
        reads_y = READS_Y and (not Y_BY_FLAG or (flags & FLAG_STD) != 0)
        group = int64(cuda.blockIdx.x)
        while group * cws < out_words:  # uniform across the block
            ow = group * cws + cw
            valid = ow < out_words
            held = mine if valid else uint32(0)
            at = uint64(rl) * uint64(axis_words) + uint64(ow)
            # the first batch's loads (the whole strip without a stash), then dy and y
            load_words(xv, words, at, step, uint32(0), held)
            for e in range(W):
                o = (ow << LOG_W) + e
                cfs[e] = load(dy, o * dy_stride) if valid else ACC(0)
                ys[e] = load(y, o * y_stride) if reads_y and valid else ACC(0)
                totals[e] = ACC(0)
            for b in range(STASH // HELD):  # the stash, HELD words at a time
                if b > 0:
                    load_words(xv, words, at, step, uint32(b * HELD), held)
                for u in range(HELD):
                    if uint32(b * HELD + u) < held:
                        count_word(words[u], values, ys, totals)
                        parked[uint32((b * HELD + u) * REG_COLS_BLOCK) + tid] = words[u]
            if STASH:
                load_words(xv, words, at, step, uint32(STASH), held)
            for u in range(HELD):
                if uint32(STASH + u) < held:
                    count_word(words[u], values, ys, totals)
            column_totals(totals, partial, parity, cw, cws, pairs, log_pairs, lane, warp,
                          warps)
            parity = uint32(parity ^ uint32(1))
            for e in range(W):
                g = cfs[e]
                mean = g
                count = int64(0)
                if STAT_TIES:
                    count = int64(totals[e])
                else:
                    mean = totals[e] / ACC(extent)
                cfs[e] = ACC(coefficient(g, ys[e], mean, count, param, flags))
                means[e] = mean
            for u in range(HELD):  # the registers first (free for the stash's loads)
                if uint32(STASH + u) < held:
                    grad_word(dx, dxv, at + uint64(STASH + u) * step, words[u], values,
                              results, cfs, ys, means)
            for u in range(STASH):
                if u < held:
                    grad_word(dx, dxv, at + uint64(u) * step,
                              parked[uint32(u * REG_COLS_BLOCK) + tid], values, results, cfs,
                              ys, means)
            group += cuda.gridDim.x

    return reduce_backward_cols_reg


