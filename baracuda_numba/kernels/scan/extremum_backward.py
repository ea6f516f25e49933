"""Scan: the fused Cummax/Cummin backward (rows, cols and the fix-up pass of a split)."""

from __future__ import annotations

from numba import boolean, cuda, int32, int64, types, uint64

from ..._runtime import SIMULATOR
from ...launch import Kernel
from ...types import ElementKind
from ..common import (
    shfl_down,
    shfl_idx,
    shfl_up,
    shfl_xor,
)
from .fast import (
    _EXTREMUM_BACKWARD_SIZES,
    _EXTREMUM_COLS_CHUNKS,
    _FAST_COLS_VALUES,
    FAST_COLS_CHUNKS,
    FAST_WORDS,
    FastFormat,
    _c_flat,
    _cap,
    _cols_block,
    _cols_item,
    _make_warp_helpers,
    _word_codecs,
)
from .ops import CODE_BF16, CODE_CUMMAX, _constants

# -- Cummax/Cummin backward, fused ---------------------------------------------------------
#
# dx[j] = sum of dy[i] over the run of positions i whose running winner (the index output's
# rule: the last of equal winners) is j: nonzero only at *records*, where a record is the
# line's first element or an element that beats or ties the running winner before it (a NaN
# is always a record: torch's index is the last NaN). A record test needs only the running
# winner's *value*, so the forward part is the extremum family's value scan; the gradient is
# the reversed segmented sum T(i) = 0 at a record, else dy[i] + T(i + 1), with
# dx = dy + T(i + 1) at a record (state (A, B), A in {0, 1}: a zero A cuts the chain
# exactly, so a NaN in dy beyond a record reaches no earlier record). One pass over x, dy
# and dx (3 tensor passes):
#
#     tile t (scan order):  x --value scan + carry--> record flags
#                           dy --reversed segmented scan, 0 entering the tile end--> dx
#
# The last record of a tile has a run that may continue into later tiles: its element is
# stored with the tile's partial value and rewritten once the run closes (a later tile
# with a record, or the segment's end), by the thread that stored it (rows: the same lane,
# so program order orders the two stores) or after a barrier (cols). Few long lines are
# split into segments: phase 1 writes each segment's x aggregate; phase 2 starts from the
# combination of the earlier ones and writes per segment its head (the dy sum before its
# first record, or of the whole segment), its last record's scan index (-1: none) and
# that record's partial sum; a fix-up pass then adds the heads that follow each last
# record, in segment order (deterministic).


def _extremum_backward_ops(acc: types.Type):
    """beats(v, p, code): whether ``v`` is a record after the running winner value ``p``
    (the index output's rule: ties and NaNs go to the later position); seg_combine(right,
    left): the segmented-sum state of the positions ``left`` then ``right`` (``left``
    earlier in scan order, applied last)."""
    zero = _constants(acc)[0]

    @cuda.jit(device=True, inline=True)
    def beats(v, p, code):
        if v != v:  # every NaN: torch's index is the last NaN
            return True
        if p != p:
            return False
        if code == CODE_CUMMAX:
            return v >= p  # ties: the later index, as torch's
        return v <= p

    @cuda.jit(device=True, inline=True)
    def seg_combine(right, left):
        if left[0] == zero:  # a record in ``left``: nothing from ``right`` passes it
            return (zero, left[1])
        return (right[0], acc(right[1] + left[1]))

    return beats, seg_combine


def _rows_extremum_tiles(fmt: FastFormat, words: int, blocked: bool):
    """``load_tile`` / ``store_tile`` of ``_make_rows_extremum_backward``: a tile's x (and,
    but in phase 1, dy) into the lane's ``xv`` / ``gv`` in scan order, words where the
    tile is whole, elements at the segment's end; ``gv`` (dx) back the same way."""
    per_word = fmt.per_word
    zero, _, _, _ = _constants(fmt.acc)
    identity, widen, narrow = fmt.identity, fmt.widen, fmt.narrow
    unpack, pack_one, store_word = _word_codecs(fmt)

    @cuda.jit(device=True, inline=True)
    def load_tile(x, xw, dy, dyw, xv, gv, base, s_end, full, lane, xb, gb, extent,
                  extent_words, phase, reverse, code, bf16):
        for k in range(words):
            sw = base // per_word + (lane * words + k if blocked else k * 32 + lane)
            if full:
                at = xb // per_word + (extent_words - 1 - sw if reverse else sw)
                w = xw[uint64(at)]
                for j in range(per_word):
                    xv[k * per_word + j] = unpack(w, per_word - 1 - j if reverse
                                                  else j, bf16)
                if phase != 1:
                    at = gb // per_word + (extent_words - 1 - sw if reverse else sw)
                    w = dyw[uint64(at)]
                    for j in range(per_word):
                        gv[k * per_word + j] = unpack(w, per_word - 1 - j if reverse
                                                      else j, bf16)
            else:
                for j in range(per_word):
                    s = sw * per_word + j
                    v = identity(code)
                    g = zero
                    if s < s_end:
                        pos = extent - 1 - s if reverse else s
                        v = widen(x[uint64(xb + pos)], bf16)
                        if phase != 1:
                            g = widen(dy[uint64(gb + pos)], bf16)
                    xv[k * per_word + j] = v
                    gv[k * per_word + j] = g

    @cuda.jit(device=True, inline=True)
    def store_tile(dx, dxw, gv, base, s_end, full, lane, ob, extent, extent_words, reverse, bf16):
        for k in range(words):
            sw = base // per_word + (lane * words + k if blocked else k * 32 + lane)
            if full:
                w = uint64(0)
                for j in range(per_word):
                    w |= pack_one(gv[k * per_word + j],
                                  per_word - 1 - j if reverse else j, bf16)
                at = ob // per_word + (extent_words - 1 - sw if reverse else sw)
                store_word(dxw, dx, at, w)
            else:
                for j in range(per_word):
                    s = sw * per_word + j
                    if s < s_end:
                        pos = extent - 1 - s if reverse else s
                        dx[uint64(ob + pos)] = narrow(gv[k * per_word + j], bf16)

    return load_tile, store_tile


def _rows_extremum_scans(fmt: FastFormat, words: int, blocked: bool):
    """The warp scans of ``_make_rows_extremum_backward`` over a tile, run by run:
    ``flag_records`` turns ``xv`` into record flags (1 or 0) from the running winner
    ``carry`` (returned advanced past the tile); ``sum_runs`` turns ``gv`` into dx, the
    reversed segmented sum of dy with 0 entering the tile's end, and returns the sum
    leaving the tile's start, this lane's last record in the tile (-1: none) and its sum."""
    acc = fmt.acc
    per_lane = words * fmt.per_word
    groups = 1 if blocked else words  # runs of consecutive elements per lane
    run_len = per_lane // groups
    zero, one, _, _ = _constants(acc)
    combine = fmt.combine
    beats, seg_combine = _extremum_backward_ops(acc)

    @cuda.jit(device=True, inline=True)
    def flag_records(xv, carry, base, s_end, lane, code):
        for r in range(groups):
            agg = xv[r * run_len]
            for i in range(1, run_len):
                agg = combine(agg, xv[r * run_len + i], code)
            inc = agg
            delta = 1
            while delta < 32:
                other = shfl_up(inc, delta)
                if lane >= delta:
                    inc = combine(other, inc, code)
                delta *= 2
            excl = shfl_up(inc, 1)
            p = carry
            if lane > 0:
                p = combine(carry, excl, code)
            first = base + (r * 32 + lane) * run_len
            for i in range(run_len):
                v = xv[r * run_len + i]
                s = first + i
                record = s < s_end and (s == 0 or beats(v, p, code))
                xv[r * run_len + i] = one if record else zero
                p = combine(p, v, code)
            carry = combine(carry, shfl_idx(inc, 31), code)
        return carry

    @cuda.jit(device=True, inline=True)
    def sum_runs(xv, gv, base, lane):
        q_right = zero
        last_s = int64(-1)  # this lane's last record in the tile
        last_value = zero
        for rr in range(groups):
            r = groups - 1 - rr
            a = one
            b = zero
            for ii in range(run_len):
                i = r * run_len + run_len - 1 - ii
                if xv[i] != zero:
                    a = zero
                    b = zero
                else:
                    b = acc(b + gv[i])
            state = (a, b)
            delta = 1
            while delta < 32:
                other = (shfl_down(state[0], delta), shfl_down(state[1], delta))
                if lane + delta < 32:
                    state = seg_combine(other, state)
                delta *= 2
            excl_a = shfl_down(state[0], 1)
            excl_b = shfl_down(state[1], 1)
            q = q_right
            if lane < 31:
                q = excl_b if excl_a == zero else acc(q_right + excl_b)
            first = base + (r * 32 + lane) * run_len
            for ii in range(run_len):
                i = r * run_len + run_len - 1 - ii
                g = gv[i]
                if xv[i] != zero:
                    g = acc(g + q)
                    if last_s < 0:
                        last_s = first + run_len - 1 - ii
                        last_value = g
                    q = zero
                else:
                    q = acc(g + q)
                    g = zero
                gv[i] = g
            q_right = shfl_idx(q, 0)
        return q_right, last_s, last_value

    return flag_records, sum_runs


def _make_rows_extremum_backward(fmt: FastFormat, words: int, blocked: bool = True):
    """Fused Cummax/Cummin backward along contiguous rows: one warp per (line, segment),
    ``words`` uint64 words per lane per tile. Blocked (default): lane ``l`` holds words
    ``l*words + k``, one run of ``words*V`` consecutive elements, so a tile costs one
    warp scan each way; striped (rows_fast's layout): lane ``l`` holds word ``k*32 + l``,
    one warp scan each way per word group."""
    acc = fmt.acc
    per_word = fmt.per_word
    per_lane = words * per_word
    tile = 32 * per_lane
    groups = 1 if blocked else words  # runs of consecutive elements per lane
    run_len = per_lane // groups
    zero, _, _, _ = _constants(acc)
    identity, combine, narrow = fmt.identity, fmt.combine, fmt.narrow
    warp_total, segments_prefix = _make_warp_helpers(fmt)
    load_tile, store_tile = _rows_extremum_tiles(fmt, words, blocked)
    flag_records, sum_runs = _rows_extremum_scans(fmt, words, blocked)

    def scan_rows_extremum_backward(x, xw, dy, dyw, dxw, dx, ws_x, ws_h, ws_t, ws_p, lines,
                                    extent, x_pitch, dy_pitch, dx_pitch, seg_len, nseg,
                                    phase, reverse, vec, code):
        bf16 = code >= CODE_BF16  # a half kernel's bf16 flag rides on the code
        code = code & (CODE_BF16 - 1)
        xv = cuda.local.array(per_lane, acc)  # x, then the record flags (1 or 0)
        gv = cuda.local.array(per_lane, acc)  # dy, then dx
        lane = int64(cuda.threadIdx.x % 32)
        warps = int64(cuda.blockDim.x // 32)
        item = int64(cuda.blockIdx.x) * warps + int64(cuda.threadIdx.x // 32)
        step = int64(cuda.gridDim.x) * warps
        extent_words = extent // per_word
        while item < lines * nseg:
            line = item // nseg
            seg = item - line * nseg
            xb = line * x_pitch
            gb = line * dy_pitch
            ob = line * dx_pitch
            s_begin = seg * seg_len
            s_end = min(extent, s_begin + seg_len)
            carry = identity(code)
            if phase == 2:
                carry = segments_prefix(ws_x, line * nseg, seg, lane, code)
            open_s = int64(-1)  # scan index of the record whose run is still open
            open_sum = zero  # its sum so far (before the first record: the segment head)
            head = zero
            base = s_begin
            while base < s_end:
                full = vec and base + tile <= s_end
                load_tile(x, xw, dy, dyw, xv, gv, base, s_end, full, lane, xb, gb, extent,
                          extent_words, phase, reverse, code, bf16)
                if phase == 1:
                    # runs in scan order (not commutative on signed zeros, NaN payloads)
                    for r in range(groups):
                        agg = xv[r * run_len]
                        for i in range(1, run_len):
                            agg = combine(agg, xv[r * run_len + i], code)
                        carry = combine(carry, warp_total(agg, lane, code), code)
                else:
                    # record flags: the running winner value before each element
                    carry = flag_records(xv, carry, base, s_end, lane, code)
                    # reversed segmented sum of dy, 0 entering the tile's end
                    q_right, last_s, last_value = sum_runs(xv, gv, base, lane)
                    # the tile's last record (largest scan index over the lanes)
                    tile_last = last_s
                    delta = 16
                    while delta >= 1:
                        tile_last = max(tile_last, shfl_xor(tile_last, delta))
                        delta //= 2
                    owner = (tile_last // run_len) % 32 if tile_last >= 0 else 0
                    tile_last_value = shfl_idx(last_value, owner)
                    open_sum = acc(open_sum + q_right)
                    if tile_last >= 0:
                        if open_s >= 0:
                            if lane == (open_s // run_len) % 32:  # the lane that stored it
                                pos = extent - 1 - open_s if reverse else open_s
                                dx[uint64(ob + pos)] = narrow(open_sum, bf16)
                        else:
                            head = open_sum
                        open_s = tile_last
                        open_sum = tile_last_value
                    store_tile(dx, dxw, gv, base, s_end, full, lane, ob, extent, extent_words,
                               reverse, bf16)
                base += tile
            if phase == 1:
                if lane == 0:
                    ws_x[uint64(item)] = carry
            elif phase == 2:
                if lane == 0:
                    ws_h[uint64(item)] = head if open_s >= 0 else open_sum
                    ws_t[uint64(item)] = open_sum if open_s >= 0 else zero
                    ws_p[uint64(item)] = open_s
            elif open_s >= 0 and lane == (open_s // run_len) % 32:
                pos = extent - 1 - open_s if reverse else open_s
                dx[uint64(ob + pos)] = narrow(open_sum, bf16)
            item += step

    layout = "blocked" if blocked else "striped"
    scan_rows_extremum_backward.__qualname__ = \
        f"scan_rows_extremum_backward_{fmt.token}_{words}_{layout}"
    return scan_rows_extremum_backward


def _cols_extremum_tiles(fmt: FastFormat, rows: int):
    """``load_tile`` / ``store_tile`` of ``_make_cols_extremum_backward``: this thread's
    ``rows`` rows of x (and, but in phase 1, dy) into ``xv`` / ``gv`` (row-major, V
    columns a row), words where the columns are whole, elements at the edges; ``gv`` (dx)
    back the same way."""
    per_word = fmt.per_word
    zero, _, _, _ = _constants(fmt.acc)
    identity, widen, narrow = fmt.identity, fmt.widen, fmt.narrow
    unpack, pack_one, store_word = _word_codecs(fmt)

    @cuda.jit(device=True, inline=True)
    def load_tile(x, xw, dy, dyw, xv, gv, r0, s_end, xb, gb, ncols, wide, extent, x_step,
                  dy_step, phase, reverse, code, bf16):
        for r in range(rows):
            s = r0 + r
            pos = extent - 1 - s if reverse else s
            if wide and s < s_end:
                w = xw[uint64((xb + pos * x_step) // per_word)]
                for j in range(per_word):
                    xv[r * per_word + j] = unpack(w, j, bf16)
                if phase != 1:
                    w = dyw[uint64((gb + pos * dy_step) // per_word)]
                    for j in range(per_word):
                        gv[r * per_word + j] = unpack(w, j, bf16)
            else:
                for j in range(per_word):
                    v = identity(code)
                    g = zero
                    if s < s_end and j < ncols:
                        v = widen(x[uint64(xb + pos * x_step + j)], bf16)
                        if phase != 1:
                            g = widen(dy[uint64(gb + pos * dy_step + j)], bf16)
                    xv[r * per_word + j] = v
                    gv[r * per_word + j] = g
    @cuda.jit(device=True, inline=True)
    def store_tile(dx, dxw, gv, r0, s_end, ob, ncols, wide, extent, dx_step, reverse, bf16):
        for r in range(rows):
            s = r0 + r
            pos = extent - 1 - s if reverse else s
            if wide and s < s_end:
                w = uint64(0)
                for j in range(per_word):
                    w |= pack_one(gv[r * per_word + j], j, bf16)
                store_word(dxw, dx, (ob + pos * dx_step) // per_word, w)
            elif s < s_end:
                for j in range(per_word):
                    if j < ncols:
                        dx[uint64(ob + pos * dx_step + j)] = narrow(
                            gv[r * per_word + j], bf16)
    return load_tile, store_tile


def _cols_extremum_chunks(fmt: FastFormat, rows: int):
    """The per-chunk steps of ``_make_cols_extremum_backward``: ``winner_before`` publishes
    this thread's x aggregate (slot ``parity`` of ``part_x``), sets ``prefix`` to the
    running winner before its chunk and advances ``carry`` past the tile; ``sum_chunk``
    flags this thread's records (from ``prefix``) and turns
    ``gv`` into the chunk's reversed segmented sum (0 entering the chunk's end), leaving
    per column the sum leaving its start in ``q`` and its last record's row and sum in
    ``last_r`` / ``last_v``; ``join_chunks`` walks the chunks' published (sum, last row,
    last sum) right to left: what enters each chunk's end (added to this thread's last
    record), the tile's head in ``q`` and its last record in ``tile_r`` / ``tile_v``."""
    acc = fmt.acc
    per_word = fmt.per_word
    zero, one, _, _ = _constants(acc)
    combine = fmt.combine
    beats, _ = _extremum_backward_ops(acc)

    @cuda.jit(device=True, inline=True)
    def winner_before(part_x, xv, prefix, carry, parity, chunk, chunks, width, lane, code):
        for j in range(per_word):
            prefix[j] = xv[j]
        for r in range(1, rows):
            for j in range(per_word):
                prefix[j] = combine(prefix[j], xv[r * per_word + j], code)
        slot = (parity * chunks + chunk) * width + lane
        for j in range(per_word):
            part_x[slot + j * 32] = prefix[j]
        cuda.syncthreads()
        for j in range(per_word):
            prefix[j] = carry[j]
        for c in range(chunk):
            at = (parity * chunks + c) * width + lane
            for j in range(per_word):
                prefix[j] = combine(prefix[j], part_x[at + j * 32], code)
        for c in range(chunks):
            at = (parity * chunks + c) * width + lane
            for j in range(per_word):
                carry[j] = combine(carry[j], part_x[at + j * 32], code)

    @cuda.jit(device=True, inline=True)
    def sum_chunk(xv, gv, prefix, q, last_r, last_v, r0, s_end, ncols, chunk, code):
        for r in range(rows):
            s = r0 + r
            for j in range(per_word):
                v = xv[r * per_word + j]
                record = s < s_end and j < ncols and \
                    (s == 0 or beats(v, prefix[j], code))
                xv[r * per_word + j] = one if record else zero
                prefix[j] = combine(prefix[j], v, code)
        for j in range(per_word):
            q[j] = zero
            last_r[j] = -1
            last_v[j] = zero
        for rr in range(rows):
            r = rows - 1 - rr
            for j in range(per_word):
                g = gv[r * per_word + j]
                if xv[r * per_word + j] != zero:
                    g = acc(g + q[j])
                    if last_r[j] < 0:
                        last_r[j] = int32(chunk * rows + r)
                        last_v[j] = g
                    q[j] = zero
                else:
                    q[j] = acc(g + q[j])
                    g = zero
                gv[r * per_word + j] = g
    @cuda.jit(device=True, inline=True)
    def join_chunks(gv, q, last_r, tile_r, tile_v, part_b, part_l, part_r, chunk, chunks,
                    width, lane):
        for j in range(per_word):
            q[j] = zero  # entering the current chunk c from its right
            tile_r[j] = -1
            tile_v[j] = zero
        for cc in range(chunks):
            c = chunks - 1 - cc
            if c == chunk:
                # this thread's chunk: its last record gets what enters it
                for r in range(rows):
                    for j in range(per_word):
                        if last_r[j] == chunk * rows + r:
                            gv[r * per_word + j] = acc(gv[r * per_word + j]
                                                       + q[j])
            at = c * width + lane
            for j in range(per_word):
                chunk_last = part_r[at + j * 32]
                if chunk_last >= 0:
                    if tile_r[j] < 0:
                        tile_r[j] = chunk_last
                        tile_v[j] = acc(part_l[at + j * 32] + q[j])
                    q[j] = part_b[at + j * 32]
                else:
                    q[j] = acc(q[j] + part_b[at + j * 32])
    return winner_before, sum_chunk, join_chunks


def _make_cols_extremum_backward(fmt: FastFormat, rows: int, chunks_max: int):
    """Fused Cummax/Cummin backward along an outer axis (cols_fast's blocks: 32 lanes of
    V columns x ``chunks`` rows of threads, ``rows`` rows per thread per tile). Per tile
    two exchanges through shared memory: the chunks' x aggregates (the running winner
    before each chunk), then per chunk its head sum, its last record (row within the
    tile, -1: none) and that record's sum up to the chunk's end."""
    acc = fmt.acc
    per_word = fmt.per_word
    width = 32 * per_word
    zero, _, _, _ = _constants(acc)
    identity, combine, narrow = fmt.identity, fmt.combine, fmt.narrow
    load_tile, store_tile = _cols_extremum_tiles(fmt, rows)
    winner_before, sum_chunk, join_chunks = _cols_extremum_chunks(fmt, rows)
    part_slots = chunks_max * width
    part_x_slots = 2 * part_slots
    values = rows * per_word

    def scan_cols_extremum_backward(x, xw, dy, dyw, dxw, dx, ws_x, ws_h, ws_t, ws_p, outer,
                                    extent, inner, x_outer, x_step, dy_outer, dy_step,
                                    dx_outer, dx_step, seg_len, nseg, phase, reverse, vec,
                                    code):
        bf16 = code >= CODE_BF16  # a half kernel's bf16 flag rides on the code
        code = code & (CODE_BF16 - 1)
        part_x = cuda.shared.array(part_x_slots, acc)  # [parity][chunk][j][lane]
        part_b = cuda.shared.array(part_slots, acc)
        part_l = cuda.shared.array(part_slots, acc)
        part_r = cuda.shared.array(part_slots, int32)
        xv = cuda.local.array(values, acc)
        gv = cuda.local.array(values, acc)
        carry = cuda.local.array(per_word, acc)
        prefix = cuda.local.array(per_word, acc)
        q = cuda.local.array(per_word, acc)
        last_r = cuda.local.array(per_word, int32)
        last_v = cuda.local.array(per_word, acc)
        tile_r = cuda.local.array(per_word, int32)
        tile_v = cuda.local.array(per_word, acc)
        open_s = cuda.local.array(per_word, int64)
        open_sum = cuda.local.array(per_word, acc)
        head = cuda.local.array(per_word, acc)
        lane, chunk, chunks, tile_rows, groups, lines = _cols_block(outer, inner, width, rows)
        parity = int64(0)
        item = int64(cuda.blockIdx.x)
        while item < outer * groups * nseg:
            seg, o, col, ncols, wide, s_begin, s_end = _cols_item(
                item, nseg, groups, width, lane, per_word, inner, vec, seg_len, extent)
            xb = o * x_outer + col
            gb = o * dy_outer + col
            ob = o * dx_outer + col
            for j in range(per_word):
                carry[j] = identity(code)
                open_s[j] = -1
                open_sum[j] = zero
                head[j] = zero
            if phase == 2:
                for g in range(seg):
                    at = g * lines + o * inner + col
                    for j in range(per_word):
                        if j < ncols:
                            carry[j] = combine(carry[j], ws_x[uint64(at + j)], code)
            base = s_begin
            while base < s_end:
                r0 = base + chunk * rows
                load_tile(x, xw, dy, dyw, xv, gv, r0, s_end, xb, gb, ncols, wide, extent,
                          x_step, dy_step, phase, reverse, code, bf16)
                # chunk x aggregates -> the running winner before each chunk
                winner_before(part_x, xv, prefix, carry, parity, chunk, chunks, width, lane,
                              code)
                parity = 1 - parity
                if phase != 1:
                    # record flags, then the chunk's reversed segmented sum (0 entering
                    # the chunk's end)
                    sum_chunk(xv, gv, prefix, q, last_r, last_v, r0, s_end, ncols, chunk,
                              code)
                    slot = chunk * width + lane
                    for j in range(per_word):
                        part_b[slot + j * 32] = q[j]
                        part_l[slot + j * 32] = last_v[j]
                        part_r[slot + j * 32] = last_r[j]
                    cuda.syncthreads()
                    # right to left over the chunks: what enters each chunk's end, the
                    # tile's head and its last record with that record's sum
                    join_chunks(gv, q, last_r, tile_r, tile_v, part_b, part_l, part_r, chunk,
                                chunks, width, lane)
                    for j in range(per_word):
                        open_sum[j] = acc(open_sum[j] + q[j])
                        if tile_r[j] >= 0:
                            if open_s[j] >= 0:
                                # the open record's run ends here (its element was stored
                                # by an earlier tile: ordered by the barriers since)
                                if chunk == 0 and j < ncols:
                                    pos = extent - 1 - open_s[j] if reverse else open_s[j]
                                    dx[uint64(ob + pos * dx_step + j)] = narrow(open_sum[j], bf16)
                            else:
                                head[j] = open_sum[j]
                            open_s[j] = base + tile_r[j]
                            open_sum[j] = tile_v[j]
                    store_tile(dx, dxw, gv, r0, s_end, ob, ncols, wide, extent, dx_step,
                               reverse, bf16)
                base += tile_rows
            if chunk == 0:
                for j in range(per_word):
                    if j < ncols:
                        at = uint64(seg * lines + o * inner + col + j)
                        if phase == 1:
                            ws_x[at] = carry[j]
                        elif phase == 2:
                            ws_h[at] = head[j] if open_s[j] >= 0 else open_sum[j]
                            ws_t[at] = open_sum[j] if open_s[j] >= 0 else zero
                            ws_p[at] = open_s[j]
                        elif open_s[j] >= 0:
                            pos = extent - 1 - open_s[j] if reverse else open_s[j]
                            dx[uint64(ob + pos * dx_step + j)] = narrow(open_sum[j], bf16)
            item += cuda.gridDim.x

    scan_cols_extremum_backward.__qualname__ = \
        f"scan_cols_extremum_backward_{fmt.token}_{rows}"
    return scan_cols_extremum_backward


def _make_extremum_backward_fixup(fmt: FastFormat):
    """Phase 3 of a split, one thread per (line, segment): for a segment with a record,
    the sum of its last record's run: its partial sum plus the heads of the following
    segments up to and including the first one with a record (in segment order:
    deterministic)."""
    narrow = fmt.narrow

    def scan_extremum_backward_fixup(dx, ws_h, ws_t, ws_p, lines, nseg, line_stride,
                                     seg_stride, inner, dx_outer, dx_step, extent, reverse,
                                     bf16):
        entry = int64(cuda.blockIdx.x) * cuda.blockDim.x + cuda.threadIdx.x
        while entry < lines * nseg:
            line = entry // nseg
            seg = entry - line * nseg
            at = line * line_stride + seg * seg_stride
            last = ws_p[uint64(at)]
            if last >= 0:
                total = ws_t[uint64(at)]
                g = seg + 1
                while g < nseg:
                    later = line * line_stride + g * seg_stride
                    total += ws_h[uint64(later)]
                    if ws_p[uint64(later)] >= 0:
                        break
                    g += 1
                pos = extent - 1 - last if reverse else last
                o = line // inner
                dx[uint64(o * dx_outer + (line - o * inner) + pos * dx_step)] = narrow(total, bf16)
            entry += int64(cuda.gridDim.x) * cuda.blockDim.x

    scan_extremum_backward_fixup.__qualname__ = \
        f"scan_extremum_backward_fixup_{fmt.token}"
    return scan_extremum_backward_fixup


class ExtremumBackwardKernels:
    """The fused Cummax/Cummin backward at one element kind: rows, cols and the split's
    fix-up pass. Kernel names carry the tile and register cap (the cubin cache is keyed
    by name)."""

    def __init__(self, element: ElementKind, words: int | None = None,
                 col_values: int | None = None, register: bool = True,
                 cols_max_registers: int | None = None, blocked: bool = True,
                 cols_chunks: int | None = None,
                 rows_max_registers: int | None = None) -> None:
        fmt = FastFormat(element, "extremum")
        words = words or (FAST_WORDS if SIMULATOR else _EXTREMUM_BACKWARD_SIZES[0])
        col_values = col_values or (_FAST_COLS_VALUES if SIMULATOR
                                    else _EXTREMUM_BACKWARD_SIZES[1])
        self.per_word = fmt.per_word
        self.tile = 32 * words * fmt.per_word
        self.col_rows = max(2, col_values // fmt.per_word)
        self.cols_chunks = cols_chunks or (FAST_COLS_CHUNKS if SIMULATOR
                                           else _EXTREMUM_COLS_CHUNKS)
        self.acc_bytes = fmt.acc.bitwidth // 8
        arrays = (_c_flat(fmt.storage), _c_flat(uint64), _c_flat(fmt.storage), _c_flat(uint64),
                  _c_flat(uint64), _c_flat(fmt.storage), _c_flat(fmt.acc), _c_flat(fmt.acc),
                  _c_flat(fmt.acc), _c_flat(int64))
        tag = fmt.token
        cols_cap = _cap(fmt, cols_max_registers, 2)
        rows_cap = rows_max_registers or None  # uncapped unless asked (82 registers, f32)
        self.rows = Kernel(f"scan_rows_extremum_backward[{tag},{words}"
                           f"{'' if blocked else ',striped'},{rows_cap}]",
                           _make_rows_extremum_backward(fmt, words, blocked),
                           arrays + (int64,) * 8 + (boolean, boolean, int64),
                           register=register, max_registers=rows_cap)
        self.cols = Kernel(f"scan_cols_extremum_backward[{tag},{self.col_rows}x"
                           f"{self.cols_chunks},{cols_cap}]",
                           _make_cols_extremum_backward(fmt, self.col_rows, self.cols_chunks),
                           arrays + (int64,) * 12 + (boolean, boolean, int64),
                           register=register, max_registers=cols_cap)
        self.fixup = Kernel(f"scan_extremum_backward_fixup[{tag}]",
                            _make_extremum_backward_fixup(fmt),
                            (_c_flat(fmt.storage), _c_flat(fmt.acc), _c_flat(fmt.acc),
                             _c_flat(int64)) + (int64,) * 8 + (boolean, boolean),
                            register=register, grid_stride=True)
