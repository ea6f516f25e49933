"""Fractional max pool: the listed tiled backward kernel (candidate masks per tile element
in shared memory, the chosen elements listed)."""

from __future__ import annotations

from numba import cuda, float32, int64, uint32

from ..common import bitcast
from .fast import fast_div
from .placement import WINDOWS_BF16


@cuda.jit(device=True, inline=True)
def candidates_baracuda(coord, extent, window, out, multiplier, shift):
    """``candidate_outputs_fast`` for the BARACUDA placement only (no general fallback
    compiled in)."""
    max_start = extent - window
    last = out - 1
    if max_start <= 0 or last <= 0:
        return int64(0), out
    first = int64(0)
    below = coord - window - 1
    if below >= 0:
        first = min(out, fast_div((below + 1) * last + max_start - 1, multiplier, shift))
    end = min(out, fast_div((coord + 1) * last + max_start - 1, multiplier, shift))
    return first, end


#: Packed candidate range of one coordinate in the tiled backward's tables:
#: ``first | count << CANDIDATE_COUNT_SHIFT`` (first < 2^24, count <= 255: the plan checks).
CANDIDATE_COUNT_SHIFT = 24
_FIRST_MASK = (1 << CANDIDATE_COUNT_SHIFT) - 1


@cuda.jit(device=True, inline=True)
def _fill_candidates(table, coord0, count, extent, window, out, multiplier, shift):
    """``table[j]`` = packed candidate range of coordinate ``coord0 + j``, j < count (the
    block's threads share the work; the caller synchronises)."""
    j = int64(cuda.threadIdx.x)
    while j < count:
        first, end = candidates_baracuda(coord0 + j, extent, window, out, multiplier, shift)
        table[j] = uint32(first | ((end - first) << CANDIDATE_COUNT_SHIFT))
        j += cuda.blockDim.x


@cuda.jit(device=True, inline=True)
def _candidate_offset(packed, coord):
    """(coord - first) of a packed candidate range as uint32, and whether coord is in it
    (no wraparound below ``first``: the result is then 0 and out of the range)."""
    first = packed & _FIRST_MASK
    rel = uint32(coord - min(first, coord))
    return rel, (coord >= first) & (rel < (packed >> CANDIDATE_COUNT_SHIFT))


@cuda.jit(device=True, inline=True)
def _pop_lowest_bit(mask):
    """(index of the lowest set bit, mask without it) of a non-zero uint32 mask."""
    below = uint32(mask - uint32(1))
    return uint32(cuda.popc(uint32(mask ^ below)) - 1), uint32(mask & below)


@cuda.jit(device=True, inline=True)
def _tiled_sizes(dims, multipliers, shifts, tiles):
    """The 32-bit sizes and the magic divisors the tiled backward kernel uses per tile:
    (h_in * w_in, h_out * w_out, d_out * h_out * w_out, w_in, w_out, then the multiplier
    and shift of w_in, h_in * w_in and w_out), then the tile count and the reach along h
    and w."""
    h_in, w_in = dims[3], dims[4]
    d_out, h_out, w_out = dims[5], dims[6], dims[7]
    hw_in = uint32(h_in * w_in)
    out_hw = uint32(h_out * w_out)
    out_plane = uint32(d_out * out_hw)
    return (hw_in, out_hw, out_plane, uint32(w_in), uint32(w_out), multipliers[3],
            shifts[3], multipliers[4], shifts[4], multipliers[5], shifts[5], tiles[4],
            tiles[5], tiles[6])


@cuda.jit(device=True, inline=True)
def _zero_slots(words, count, tid, threads):
    """words[0:count] = 0, the block's threads striding."""
    j = tid
    while j < count:
        words[j] = uint32(0)
        j = uint32(j + threads)


@cuda.jit(device=True, inline=True)
def _fill_tile_tables(h_table, d_table, deltas, h0, h1, d0, d1, dims, windows, multipliers,
                      shifts, reach_h, reach_w, staged_h, w_out32, tid):
    """The candidate tables of the tile's rows [h0, h1) and depths [d0, d1), and
    ``deltas``: mask bit (dd, dh, dw) -> staged offset from the element's first candidate."""
    _fill_candidates(h_table, h0, h1 - h0, dims[3], windows[1], dims[6], multipliers[1],
                     shifts[1])
    _fill_candidates(d_table, d0, d1 - d0, dims[2], windows[0], dims[5], multipliers[0],
                     shifts[0])
    if tid < BW_MASK_BITS:
        bit_w = tid % reach_w
        bit_h = (tid // reach_w) % reach_h
        bit_d = tid // (reach_w * reach_h)
        deltas[tid] = uint32((bit_d * staged_h + bit_h) * w_out32 + bit_w)


def _listed_steps(load, store):
    """Phases 2 and 3 of ``_make_backward_listed``: ``sum_listed`` sums, for each listed
    element, its chosen dy in ascending output order (f32, from +0.0) and keeps the sum's
    bits in its mask slot; ``write_tile`` writes the tile's slots to dx, whole rows,
    coalesced (an unchosen element's slot is 0 = +0.0)."""

    @cuda.jit(device=True, inline=True)
    def sum_listed(words, stage, listed_count, list_at, stage_from, deltas, d_table, h_table,
                   w_table, od_lo, oh_lo, staged_h, depth_elems, w_in32, w_out32, tid,
                   threads, bf16):
        listed = listed_count[0]
        k = tid
        while k < listed:
            packed = words[uint32(list_at + k)]
            dl = uint32(packed >> uint32(18))
            hl = uint32((packed >> uint32(10)) & uint32(0xFF))
            w = uint32(packed & uint32(0x3FF))
            slot = uint32(dl * depth_elems + hl * w_in32 + w)
            chosen = words[slot]
            base = uint32(stage_from + uint32(
                uint32(uint32((d_table[dl] & _FIRST_MASK) - od_lo) * staged_h
                       + (h_table[hl] & _FIRST_MASK) - oh_lo) * w_out32
                + (w_table[w] & _FIRST_MASK)))
            total = float32(0.0)
            while chosen != 0:
                bit, chosen = _pop_lowest_bit(chosen)
                total += load(stage[uint32(base + deltas[bit])], bf16)
            words[slot] = bitcast(total, uint32)
            k = uint32(k + threads)

    @cuda.jit(device=True, inline=True)
    def write_tile(dx, words, tile_origin, tile_rows, tile_depths, depth_elems, hw_in, w_in32,
                   tid, threads, bf16):
        run = uint32(tile_rows * w_in32)  # valid elements per tile depth
        dl = uint32(0)
        while dl < tile_depths:
            dst = uint32(tile_origin + dl * hw_in)
            from_at = uint32(dl * depth_elems)
            j = tid
            while j < run:
                dx[uint32(dst + j)] = store(bitcast(words[uint32(from_at + j)], float32), bf16)
                j = uint32(j + threads)
            dl = uint32(dl + 1)

    return sum_listed, write_tile


@cuda.jit(device=True, inline=True)
def _mark_range(dy, indices, words, stage, listed_count, windows, staged_total, out_base,
                out_hw, row_len, od_lo, oh_lo, tile_origin, tile_span, hw_in, w_in32,
                depth_elems, tile_rows, w_table, h_table, d_table, reach_h, reach_w, m_wout,
                s_wout, w_out32, m_row, s_row, m_depth, s_depth):
    """Phase 1 of ``_make_backward_listed``, two outputs a pass: stage dy and mark each
    output's choice in its element's mask, listing the elements it marks first. The staged
    box's ``staged_total`` outputs (``n_od`` output depths x ``row_len``, from
    ``out_base``) as one range s = dd * row_len + r, (dd, r) advanced by ``threads``
    without dividing: every load of a pass is independent."""
    # (at most 30 arguments: Python passes more as *args, which Numba cannot inline)
    list_at = uint32(windows[4])
    stage_from = uint32(windows[5])
    tid = uint32(cuda.threadIdx.x)
    threads = uint32(cuda.blockDim.x)
    row_div = max(row_len, uint32(1))  # an empty box has no pass
    step_dd = uint32(threads // row_div)
    step_r = uint32(threads - step_dd * row_div)
    s = tid
    dd = uint32(s // row_div)
    r = uint32(s - dd * row_div)
    while s < staged_total:
        at0 = uint32(out_base + dd * out_hw + r)
        s1 = uint32(s + threads)
        dd1, r1 = _advance(dd, r, step_dd, step_r, row_len)
        at1 = at0 if s1 >= staged_total else uint32(out_base + dd1 * out_hw + r1)
        target0 = indices[at0]
        target1 = indices[at1]
        raw0 = dy[at0]
        raw1 = dy[at1]
        stage[uint32(stage_from + s)] = raw0
        _mark_listed(words, listed_count, list_at, target0, r, uint32(od_lo + dd),
                     oh_lo, tile_origin, tile_span, hw_in, w_in32, depth_elems,
                     tile_rows, w_table, h_table, d_table, reach_h, reach_w,
                     m_wout, s_wout, w_out32, m_row, s_row, m_depth, s_depth)
        if s1 < staged_total:
            stage[uint32(stage_from + s1)] = raw1
            _mark_listed(words, listed_count, list_at, target1, r1,
                         uint32(od_lo + dd1), oh_lo, tile_origin, tile_span, hw_in,
                         w_in32, depth_elems, tile_rows, w_table, h_table, d_table,
                         reach_h, reach_w, m_wout, s_wout, w_out32, m_row, s_row,
                         m_depth, s_depth)
        s = uint32(s1 + threads)
        dd, r = _advance(dd1, r1, step_dd, step_r, row_len)


def _make_backward_listed(load, store, storage, half=False):
    """Tiled backward kernel for one storage kind (f32 sums: f16/bf16/f32): no float
    atomics, no pre-zeroed dx, every dx element written once with a coalesced store.

    A block owns a dx *tile* of one plane: input depths [d0, d1) x rows [h0, h1) x all
    columns. The outputs whose window may contain a tile element (the tile's sample-free
    candidate box: whole output rows, contiguous per output depth) are staged, dy into
    shared memory; each element ``i`` of the tile gets a 32-bit mask of the candidate
    outputs of ``i`` that chose it::

        bit(o) = ((od - od_first(i)) * reach_h + (oh - oh_first(i))) * reach_w + ow - ow_first(i)

    (``reach_a`` = the most candidates one coordinate has on axis ``a``; the plan uses
    this kernel only for the BARACUDA placement and ``reach_d * reach_h * reach_w <= 32``).

    1. Zero the masks, fill shared tables of the packed candidate range of every column
       and of the tile's rows and depths; walk the staged box as one range, two
       independent index and dy loads per pass: each staged output o whose saved index i
       lies in the tile and that is a candidate of i (else the index is foreign and
       ignored) sets its bit with an integer ``atomic_or`` (commutative: the masks do not
       depend on the order); the output that turns a mask from 0 to non-zero appends the
       element's packed tile coordinates to a list (``atomic_add`` on a shared counter:
       the list's order varies, its content does not).
    2. Each thread takes list entries, sums dy over the entry's bits in ascending bit =
       output order (f32, from +0.0: the gather's sum) and writes the sum's bits over the
       entry's mask. Only chosen elements are visited (~10% in 3-D), so all lanes work.
    3. Write the whole tile to dx, coalesced, reading each slot as f32 (an unchosen
       element's mask is 0 = +0.0, the gather's empty sum).

    Same (o, i) pairs, same order and accumulate type as the gather: bit-identical to it,
    deterministic. All per-element arithmetic is 32-bit (the plan requires offsets below
    2^31 on this path).

    Dynamic shared memory (sized by the plan, above 48 KiB where it helps; ``words`` = u32
    view, ``stage`` = storage view of the same bytes): masks at [0, tile slots), list at
    [list_at, list_at + staged cap), staged dy from ``stage_from`` (storage units)."""
    sum_listed, write_tile = _listed_steps(load, store)

    def fractional_max_pool_bw_listed(dy, indices, dx, dims, windows, multipliers, shifts, tiles):
        """multipliers/shifts: magic divisors of (ms_d, ms_h, ms_w, w_in, h_in*w_in, w_out,
        ...); tiles = (tile_d, tile_h, tiles_d, tiles_h, total_tiles, reach_h, reach_w,
        ...); windows = (kd, kh, kw, placement, list_at, stage_from, bf16 flag, 0). dy,
        indices, dx row-major contiguous; one block per tile (grid-strided)."""
        words = cuda.shared.array(0, uint32)
        stage = cuda.shared.array(0, storage)
        listed_count = cuda.shared.array(1, uint32)
        w_table = cuda.shared.array(BW_TABLE_W, uint32)
        h_table = cuda.shared.array(BW_TABLE_H, uint32)
        d_table = cuda.shared.array(BW_TABLE_D, uint32)
        deltas = cuda.shared.array(BW_MASK_BITS, uint32)
        bf16 = windows[WINDOWS_BF16] != 0
        list_at = uint32(windows[4])
        stage_from = uint32(windows[5])
        (hw_in, out_hw, out_plane, w_in32, w_out32, m_row, s_row, m_depth, s_depth, m_wout,
         s_wout, total_tiles, reach_h, reach_w) = _tiled_sizes(dims, multipliers, shifts, tiles)
        tid = uint32(cuda.threadIdx.x)
        threads = uint32(cuda.blockDim.x)
        _fill_candidates(w_table, int64(0), dims[4], dims[4], windows[2], dims[7],
                         multipliers[2], shifts[2])
        tile = int64(cuda.blockIdx.x)
        while tile < total_tiles:
            (plane, d0, d1, h0, h1, od_lo, od_hi, oh_lo, staged_h, row_len, tile_origin,
             tile_rows, tile_depths, tile_span, depth_elems) = _tile_box(
                tile, tiles, dims, windows, multipliers, shifts)
            _zero_slots(words, tile_depths * depth_elems, tid, threads)
            if tid == 0:
                listed_count[0] = uint32(0)
            _fill_tile_tables(h_table, d_table, deltas, h0, h1, d0, d1, dims, windows,
                              multipliers, shifts, reach_h, reach_w, staged_h, w_out32, tid)
            cuda.syncthreads()
            # 1. stage dy, mark each choice in its element's mask, list new elements
            _mark_range(dy, indices, words, stage, listed_count, windows,
                        uint32(uint32(od_hi - od_lo) * row_len),
                        uint32(plane * out_plane + od_lo * out_hw + oh_lo * dims[7]), out_hw,
                        row_len, od_lo, oh_lo, tile_origin, tile_span, hw_in, w_in32,
                        depth_elems, tile_rows, w_table, h_table, d_table, reach_h, reach_w,
                        m_wout, s_wout, w_out32, m_row, s_row, m_depth, s_depth)
            cuda.syncthreads()
            # 2. each listed element: sum its chosen dy in ascending output order, keep
            #    the f32 sum's bits in its mask slot
            #    (one copy per flag value, its conversion fixed: phase 1 converts nothing;
            #    two copies of the whole body cost 13 more registers, 3 -> 2 blocks per SM)
            if half and bf16:
                sum_listed(words, stage, listed_count, list_at, stage_from, deltas, d_table,
                           h_table, w_table, od_lo, oh_lo, staged_h, depth_elems, w_in32,
                           w_out32, tid, threads, True)
            else:
                sum_listed(words, stage, listed_count, list_at, stage_from, deltas, d_table,
                           h_table, w_table, od_lo, oh_lo, staged_h, depth_elems, w_in32,
                           w_out32, tid, threads, False)
            cuda.syncthreads()
            # 3. write the tile: whole rows, coalesced
            if half and bf16:
                write_tile(dx, words, tile_origin, tile_rows, tile_depths, depth_elems, hw_in,
                           w_in32, tid, threads, True)
            else:
                write_tile(dx, words, tile_origin, tile_rows, tile_depths, depth_elems, hw_in,
                           w_in32, tid, threads, False)
            cuda.syncthreads()
            tile += cuda.gridDim.x

    return fractional_max_pool_bw_listed


@cuda.jit(device=True, inline=True)
def _advance(dd, r, step_dd, step_r, row_len):
    """(dd, r) of position dd * row_len + r advanced by step_dd * row_len + step_r
    (step_r < row_len): no division."""
    dd = uint32(dd + step_dd)
    r = uint32(r + step_r)
    if r >= row_len:
        r = uint32(r - row_len)
        dd = uint32(dd + 1)
    return dd, r


@cuda.jit(device=True, inline=True)
def _choice_bit(target, staged, od, oh_lo, tile_origin, tile_span, hw_in, w_in,
                depth_elems, tile_rows, w_table, h_table, d_table, reach_h, reach_w,
                m_wout, s_wout, w_out, m_row, s_row, m_depth, s_depth):
    """(mask slot, bit, packed tile coordinates ``d << 18 | h << 10 | w``) of staged output
    ``(od, oh_lo + staged // w_out, staged % w_out)``'s choice ``target``; bit 0 (no
    choice) unless the saved index lies in the tile (``tile_span`` elements from
    ``tile_origin``: depths of ``hw_in``, rows of ``w_in``, ``tile_rows`` rows per depth)
    and the output is one of its candidates (else the index is foreign: ignored). 32-bit
    arithmetic only."""
    slot = uint32(0)
    bit_mask = uint32(0)
    packed = uint32(0)
    local64 = target - int64(tile_origin)
    if local64 >= 0 and local64 < int64(tile_span):
        local = uint32(local64)
        d_rel = uint32(0)
        if local >= hw_in:
            d_rel = uint32(fast_div(local, m_depth, s_depth))
        rem = uint32(local - d_rel * hw_in)
        h_rel = uint32(fast_div(rem, m_row, s_row))
        if h_rel < tile_rows:
            w = uint32(rem - h_rel * w_in)
            oh_rel = uint32(fast_div(staged, m_wout, s_wout))
            ow = uint32(staged - oh_rel * w_out)
            rel_w, in_w = _candidate_offset(w_table[w], ow)
            rel_h, in_h = _candidate_offset(h_table[h_rel], uint32(oh_lo + oh_rel))
            rel_d, in_d = _candidate_offset(d_table[d_rel], uint32(od))
            if in_w and in_h and in_d:
                bit = uint32((rel_d * reach_h + rel_h) * reach_w + rel_w)
                slot = uint32(d_rel * depth_elems + rem)
                bit_mask = uint32(uint32(1) << bit)
                packed = uint32((d_rel << uint32(18)) | (h_rel << uint32(10)) | w)
    return slot, bit_mask, packed


@cuda.jit(device=True, inline=True)
def _tile_box(tile, tiles, dims, windows, multipliers, shifts):
    """Geometry of dx tile ``tile`` of the tiled backward kernel: its plane, input depths
    ``[d0, d1)`` and rows ``[h0, h1)`` (all columns), the staged output box (depths
    ``[od_lo, od_hi)``, rows from ``oh_lo``: ``staged_h`` rows, ``row_len`` outputs per
    output depth), the tile's flat input origin and span, its rows and depths, and the
    mask slots per tile depth (``tile_h * w_in``). 32-bit where the kernels need it."""
    d_in, h_in, w_in = dims[2], dims[3], dims[4]
    d_out, h_out, w_out = dims[5], dims[6], dims[7]
    kd, kh = windows[0], windows[1]
    tile_d, tile_h, tiles_d, tiles_h = tiles[0], tiles[1], tiles[2], tiles[3]
    m_d, m_h = multipliers[0], multipliers[1]
    s_d, s_h = shifts[0], shifts[1]
    hw_in = uint32(h_in * w_in)
    w_in32 = uint32(w_in)
    rest = int64(uint32(tile) // uint32(tiles_h))
    h0 = (tile - rest * tiles_h) * tile_h
    plane = int64(uint32(rest) // uint32(tiles_d))
    d0 = (rest - plane * tiles_d) * tile_d
    d1 = min(d0 + tile_d, d_in)
    h1 = min(h0 + tile_h, h_in)
    od_lo, _ = candidates_baracuda(d0, d_in, kd, d_out, m_d, s_d)
    _, od_hi = candidates_baracuda(d1 - 1, d_in, kd, d_out, m_d, s_d)
    oh_lo, _ = candidates_baracuda(h0, h_in, kh, h_out, m_h, s_h)
    _, oh_hi = candidates_baracuda(h1 - 1, h_in, kh, h_out, m_h, s_h)
    staged_h = uint32(oh_hi - oh_lo)
    row_len = uint32(staged_h * uint32(w_out))  # staged outputs per output depth
    plane_in = uint32(plane * uint32(d_in * hw_in))
    tile_origin = uint32(plane_in + d0 * hw_in + h0 * w_in)
    tile_rows = uint32(h1 - h0)
    tile_depths = uint32(d1 - d0)
    tile_span = uint32((tile_depths - 1) * hw_in + tile_rows * w_in32)
    depth_elems = uint32(tile_h * w_in32)  # mask slots per tile depth
    return (plane, d0, d1, h0, h1, od_lo, od_hi, oh_lo, staged_h, row_len, tile_origin,
            tile_rows, tile_depths, tile_span, depth_elems)


@cuda.jit(device=True, inline=True)
def _mark_listed(words, listed_count, list_at, target, staged, od, oh_lo, tile_origin,
                 tile_span, hw_in, w_in, depth_elems, tile_rows, w_table, h_table, d_table,
                 reach_h, reach_w, m_wout, s_wout, w_out, m_row, s_row, m_depth, s_depth):
    """Set the bit of a staged output's choice (``_choice_bit``) in its element's mask
    (integer OR: the masks do not depend on the order of the calls) and append the
    element's packed coordinates to the tile's list of chosen elements when its mask was
    empty (the set of listed elements does not depend on the order, only their positions
    do)."""
    slot, bit_mask, packed = _choice_bit(target, staged, od, oh_lo, tile_origin, tile_span,
                                         hw_in, w_in, depth_elems, tile_rows, w_table,
                                         h_table, d_table, reach_h, reach_w, m_wout, s_wout,
                                         w_out, m_row, s_row, m_depth, s_depth)
    if bit_mask != 0:
        if cuda.atomic.or_(words, slot, bit_mask) == 0:
            at = cuda.atomic.add(listed_count, 0, uint32(1))
            words[uint32(list_at + at)] = packed


#: The masks hold one bit per candidate output of an element.
BW_MASK_BITS = 32
#: Entries of the tiled backward's candidate tables: input columns (the whole row), tile
#: rows and tile depths (the plan falls back to the leader scatter beyond them).
BW_TABLE_W = 1024
BW_TABLE_H = 256
BW_TABLE_D = 64
