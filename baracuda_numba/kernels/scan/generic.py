"""Scan: the generic ``rows`` and ``lines`` kernels (any strides, any kind; see the
package docstring)."""

from __future__ import annotations

from numba import cuda, int64

from ..common import (
    MAX_RANK,
    shfl_up,
)
from .ops import _UNROLL, CODE_BF16, ROWS_BLOCK, ScanOp, _constants

# -- kernels -----------------------------------------------------------------------------


@cuda.jit(device=True, inline=True)
def _line_offsets(line, outer_shape, st0, st1, st2, st_out, st_idx):
    """Offsets of line ``line`` (row-major over ``outer_shape``, the shape without the
    scan axis) in the five operands: one unravel for all."""
    o0 = int64(0)
    o1 = int64(0)
    o2 = int64(0)
    oo = int64(0)
    oi = int64(0)
    rest = int64(line)
    for axis in range(MAX_RANK - 1, -1, -1):
        extent = outer_shape[axis]
        if extent != 1:
            coord = rest % extent
            rest //= extent
            o0 += coord * st0[axis]
            o1 += coord * st1[axis]
            o2 += coord * st2[axis]
            oo += coord * st_out[axis]
            oi += coord * st_idx[axis]
    return o0, o1, o2, oo, oi


def _rows_tiles(op: ScanOp):
    """``load_tile`` / ``store_tile`` of the rows kernel: the block's tile of each input
    (and the one-element halo of the third) from global memory into shared memory,
    coalesced, widened; the outputs (and indices) of the tile back, narrowed."""
    items = op.items
    pad, idx_pad = op.pad, op.idx_pad
    n_in = op.n_in
    halo = op.halo
    with_index = op.with_index
    widen, narrow = op.widen, op.narrow

    @cuda.jit(device=True, inline=True)
    def load_tile(in0, in1, in2, t0, t1, t2, b0, b1, b2, ax0, ax1, ax2, base, s_end, extent,
                  tile, tid, nthreads, reverse, bf16):
        for m in range(items):
            j = tid + m * nthreads
            s = base + j
            if s < extent:
                pos = extent - 1 - s if reverse else s
                slot = j + j // pad
                if s < s_end:
                    t0[slot] = widen(in0[b0 + pos * ax0], bf16)
                    if n_in >= 2:
                        t1[slot] = widen(in1[b1 + pos * ax1], bf16)
                if n_in >= 3:
                    t2[slot] = widen(in2[b2 + pos * ax2], bf16)
        if halo and tid == 0:
            s = base + tile
            if s < extent:
                pos = extent - 1 - s if reverse else s
                t2[tile + tile // pad] = widen(in2[b2 + pos * ax2], bf16)

    @cuda.jit(device=True, inline=True)
    def store_tile(out0, out_idx, t0, tix, bo, bi, ax_out, ax_idx, base, s_end, extent, tid,
                   nthreads, reverse, write_index, bf16):
        for m in range(items):
            j = tid + m * nthreads
            s = base + j
            if s < s_end:
                pos = extent - 1 - s if reverse else s
                out0[bo + pos * ax_out] = narrow(t0[j + j // pad], bf16)
                if with_index:
                    if write_index:
                        out_idx[bi + pos * ax_idx] = tix[j + j // idx_pad]

    return load_tile, store_tile


def _rows_scans(op: ScanOp):
    """``thread_total`` and ``warp_scan`` of the rows kernel for ``op``."""
    pad, items = op.pad, op.items
    n_in = op.n_in
    halo = op.halo
    zero = _constants(op.acc)[0]
    identity, lift, combine = op.identity, op.lift, op.combine

    @cuda.jit(device=True, inline=True)
    def thread_total(t0, t1, t2, first, base, s_end, extent, reverse, code):
        """The combined elements of this thread's ``items`` tile slots from ``first``."""
        agg = identity(code)
        for k in range(items):
            j = first + k
            s = base + j
            if s < s_end:
                slot = j + j // pad
                nslot = j + 1 + (j + 1) // pad
                pos = extent - 1 - s if reverse else s
                v1 = t1[slot] if n_in >= 2 else zero
                v2 = t2[slot] if n_in >= 3 else zero
                v2n = t2[nslot] if halo else zero
                element = lift(t0[slot], v1, v2, v2n, s + 1 < extent, pos, code)
                agg = combine(agg, element, code)
        return agg

    @cuda.jit(device=True, inline=True)
    def warp_scan(agg, lane, code):
        """The warp's inclusive and exclusive scans of the threads' aggregates."""
        inc = agg
        delta = 1
        while delta < 32:
            other = (shfl_up(inc[0], delta), shfl_up(inc[1], delta))
            if lane >= delta:
                inc = combine(other, inc, code)
            delta *= 2
        excl = (shfl_up(inc[0], 1), shfl_up(inc[1], 1))
        if lane == 0:
            excl = identity(code)
        return inc, excl

    return thread_total, warp_scan


def _make_rows(op: ScanOp):
    """The rows kernel for ``op`` (see the module docstring)."""
    acc, aux = op.acc, op.aux
    items = op.items
    pad, idx_pad = op.pad, op.idx_pad
    tile_max = ROWS_BLOCK * items
    tile_slots = tile_max + 1 + (tile_max + 1) // pad
    n_in = op.n_in
    halo = op.halo
    with_index = op.with_index
    slots1 = tile_slots if n_in >= 2 else 1
    slots2 = tile_slots if n_in >= 3 else 1
    idx_slots = tile_max + tile_max // idx_pad if with_index else 1
    warps_max = ROWS_BLOCK // 32
    zero = _constants(acc)[0]
    identity, lift, combine, emit = op.identity, op.lift, op.combine, op.emit
    load_tile, store_tile = _rows_tiles(op)
    thread_total, warp_scan = _rows_scans(op)

    def scan_rows(in0, in1, in2, out0, out_idx, ws_a, ws_b, lines, extent, seg_len, nseg,
                  phase, outer_shape, st0, st1, st2, st_out, st_idx, ax0, ax1, ax2, ax_out,
                  ax_idx, reverse, write_index, code):
        bf16 = code >= CODE_BF16  # a half kernel's bf16 flag rides on the code
        code = code & (CODE_BF16 - 1)
        t0 = cuda.shared.array(tile_slots, acc)
        t1 = cuda.shared.array(slots1, acc)
        t2 = cuda.shared.array(slots2, acc)
        tix = cuda.shared.array(idx_slots, int64)
        warp_a = cuda.shared.array(warps_max, acc)
        warp_b = cuda.shared.array(warps_max, aux)
        tid = cuda.threadIdx.x
        nthreads = cuda.blockDim.x
        lane = tid % 32
        warp = tid // 32
        nwarps = nthreads // 32
        tile = int64(nthreads * items)
        item = int64(cuda.blockIdx.x)
        while item < lines * nseg:
            line = item // nseg
            seg = item - line * nseg
            b0, b1, b2, bo, bi = _line_offsets(line, outer_shape, st0, st1, st2, st_out,
                                               st_idx)
            s_begin = seg * seg_len
            s_end = min(extent, s_begin + seg_len)
            carry = identity(code)
            if phase == 2:
                for g in range(seg):
                    stored = (ws_a[line * nseg + g], ws_b[line * nseg + g])
                    carry = combine(carry, stored, code)
            base = s_begin
            while base < s_end:
                load_tile(in0, in1, in2, t0, t1, t2, b0, b1, b2, ax0, ax1, ax2, base, s_end,
                          extent, tile, tid, nthreads, reverse, bf16)
                cuda.syncthreads()
                first = tid * items
                agg = thread_total(t0, t1, t2, first, base, s_end, extent, reverse, code)
                inc, excl = warp_scan(agg, lane, code)
                if lane == 31:
                    warp_a[warp] = inc[0]
                    warp_b[warp] = inc[1]
                cuda.syncthreads()
                prefix = carry
                total = carry
                for w in range(nwarps):
                    warp_total = (warp_a[w], warp_b[w])
                    if w < warp:
                        prefix = combine(prefix, warp_total, code)
                    total = combine(total, warp_total, code)
                prefix = combine(prefix, excl, code)
                if phase != 1:
                    run = prefix
                    for k in range(items):
                        j = first + k
                        s = base + j
                        if s < s_end:
                            slot = j + j // pad
                            nslot = j + 1 + (j + 1) // pad
                            pos = extent - 1 - s if reverse else s
                            v0 = t0[slot]
                            v1 = t1[slot] if n_in >= 2 else zero
                            v2 = t2[slot] if n_in >= 3 else zero
                            v2n = t2[nslot] if halo else zero
                            has_next = s + 1 < extent
                            element = lift(v0, v1, v2, v2n, has_next, pos, code)
                            inc = combine(run, element, code)
                            value, index = emit(run, inc, v0, v1, v2, v2n, has_next, pos, code)
                            t0[slot] = value
                            if with_index:
                                tix[j + j // idx_pad] = index
                            run = inc
                    cuda.syncthreads()
                    store_tile(out0, out_idx, t0, tix, bo, bi, ax_out, ax_idx, base, s_end,
                               extent, tid, nthreads, reverse, write_index, bf16)
                carry = total
                cuda.syncthreads()
                base += tile
            if phase == 1 and tid == 0:
                ws_a[item] = carry[0]
                ws_b[item] = carry[1]
            item += cuda.gridDim.x

    scan_rows.__qualname__ = f"scan_rows_{op.name}_{op.token}"  # own cache index
    return scan_rows


def _lines_steps(op: ScanOp):
    """``fetch`` and ``chunk_total`` of the lines kernel for ``op``."""
    n_in = op.n_in
    halo = op.halo
    zero = _constants(op.acc)[0]
    lift, combine = op.lift, op.combine
    widen = op.widen
    unroll = _UNROLL

    @cuda.jit(device=True, inline=True)
    def fetch(in0, in1, in2, b0, b1, b2, ax0, ax1, ax2, s, extent, reverse, bf16):
        pos = extent - 1 - s if reverse else s
        v0 = widen(in0[b0 + pos * ax0], bf16)
        v1 = widen(in1[b1 + pos * ax1], bf16) if n_in >= 2 else zero
        v2 = widen(in2[b2 + pos * ax2], bf16) if n_in >= 3 else zero
        v2n = zero
        if halo:
            if s + 1 < extent:
                v2n = widen(in2[b2 + (pos - 1 if reverse else pos + 1) * ax2], bf16)
        return v0, v1, v2, v2n, pos

    @cuda.jit(device=True, inline=True)
    def chunk_total(in0, in1, in2, b0, b1, b2, ax0, ax1, ax2, s, c_end, extent, reverse, code,
                    l0, l1, l2, l2n, lpos, agg, bf16):
        """``agg`` combined with the elements ``s`` .. ``c_end`` of a line, ``unroll``
        loads in flight."""
        while s + unroll <= c_end:
            for u in range(unroll):
                v0, v1, v2, v2n, pos = fetch(in0, in1, in2, b0, b1, b2, ax0, ax1, ax2, s + u,
                                             extent, reverse, bf16)
                l0[u] = v0
                l1[u] = v1
                l2[u] = v2
                l2n[u] = v2n
                lpos[u] = pos
            for u in range(unroll):
                element = lift(l0[u], l1[u], l2[u], l2n[u], s + u + 1 < extent, lpos[u],
                               code)
                agg = combine(agg, element, code)
            s += unroll
        while s < c_end:
            v0, v1, v2, v2n, pos = fetch(in0, in1, in2, b0, b1, b2, ax0, ax1, ax2, s, extent,
                                         reverse, bf16)
            element = lift(v0, v1, v2, v2n, s + 1 < extent, pos, code)
            agg = combine(agg, element, code)
            s += 1
        return agg

    return fetch, chunk_total


def _make_lines(op: ScanOp):
    """The lines kernel for ``op`` (see the module docstring)."""
    acc, aux = op.acc, op.aux
    with_index = op.with_index
    identity, lift, combine, emit = op.identity, op.lift, op.combine, op.emit
    narrow = op.narrow
    unroll = _UNROLL

    fetch, chunk_total = _lines_steps(op)

    def scan_lines(in0, in1, in2, out0, out_idx, ws_a, ws_b, lines, extent, seg_len, nseg,
                   phase, outer_shape, st0, st1, st2, st_out, st_idx, ax0, ax1, ax2, ax_out,
                   ax_idx, reverse, write_index, code, chunk_len):
        bf16 = code >= CODE_BF16  # a half kernel's bf16 flag rides on the code
        code = code & (CODE_BF16 - 1)
        part_a = cuda.shared.array(1024, acc)
        part_b = cuda.shared.array(1024, aux)
        l0 = cuda.local.array(unroll, acc)
        l1 = cuda.local.array(unroll, acc)
        l2 = cuda.local.array(unroll, acc)
        l2n = cuda.local.array(unroll, acc)
        lpos = cuda.local.array(unroll, int64)
        tx = cuda.threadIdx.x
        ty = cuda.threadIdx.y
        nx = cuda.blockDim.x
        ny = cuda.blockDim.y
        groups = (lines + nx - 1) // nx
        item = int64(cuda.blockIdx.x)
        while item < groups * nseg:
            group = item // nseg
            seg = item - group * nseg
            line = group * nx + tx
            active = line < lines
            b0, b1, b2, bo, bi = _line_offsets(line, outer_shape, st0, st1, st2, st_out,
                                               st_idx)
            seg_begin = seg * seg_len
            seg_end = min(extent, seg_begin + seg_len)
            c_begin = min(seg_end, seg_begin + ty * chunk_len)
            c_end = min(seg_end, c_begin + chunk_len)
            prefix = identity(code)
            if phase == 2 and active:
                for g in range(seg):
                    stored = (ws_a[line * nseg + g], ws_b[line * nseg + g])
                    prefix = combine(prefix, stored, code)
            if ny > 1 or phase == 1:
                agg = identity(code)
                if active:
                    agg = chunk_total(in0, in1, in2, b0, b1, b2, ax0, ax1, ax2, c_begin, c_end,
                                      extent, reverse, code, l0, l1, l2, l2n, lpos, agg, bf16)
                part_a[ty * nx + tx] = agg[0]
                part_b[ty * nx + tx] = agg[1]
                cuda.syncthreads()
                for c in range(ty):
                    partial = (part_a[c * nx + tx], part_b[c * nx + tx])
                    prefix = combine(prefix, partial, code)
                if phase == 1 and ty == 0 and active:
                    total = identity(code)
                    for c in range(ny):
                        partial = (part_a[c * nx + tx], part_b[c * nx + tx])
                        total = combine(total, partial, code)
                    ws_a[line * nseg + seg] = total[0]
                    ws_b[line * nseg + seg] = total[1]
                cuda.syncthreads()
            if phase != 1 and active:
                run = prefix
                s = c_begin
                while s < c_end:
                    steps = min(unroll, c_end - s)
                    for u in range(unroll):
                        if u < steps:
                            v0, v1, v2, v2n, pos = fetch(in0, in1, in2, b0, b1, b2, ax0, ax1,
                                                         ax2, s + u, extent, reverse, bf16)
                            l0[u] = v0
                            l1[u] = v1
                            l2[u] = v2
                            l2n[u] = v2n
                            lpos[u] = pos
                    for u in range(unroll):
                        if u < steps:
                            has_next = s + u + 1 < extent
                            element = lift(l0[u], l1[u], l2[u], l2n[u], has_next, lpos[u],
                                           code)
                            inc = combine(run, element, code)
                            value, index = emit(run, inc, l0[u], l1[u], l2[u], l2n[u],
                                                has_next, lpos[u], code)
                            out0[bo + lpos[u] * ax_out] = narrow(value, bf16)
                            if with_index:
                                if write_index:
                                    out_idx[bi + lpos[u] * ax_idx] = index
                            run = inc
                    s += steps
            item += cuda.gridDim.x

    scan_lines.__qualname__ = f"scan_lines_{op.name}_{op.token}"
    return scan_lines
