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
aggregates of the segments before it (phase 0: one pass, no split).

Fast kernels for layouts that collapse to [outer, extent, inner] (see "fast kernels"
below): ``rows_fast`` / ``cols_fast`` for the scalar-state kinds, one compiled kernel per
family of kinds, and ``rows_indexed`` for Cummax/Cummin with indices and record flags.
"""

from __future__ import annotations

import math

import numpy as np
from numba import boolean, cuda, float32, float64, int32, int64, types, uint16, uint32, uint64
from numba.types import float16

from .._runtime import SIMULATOR
from ..launch import Kernel, flat
from ..types import ElementKind, ScanKind
from .common import (
    MAX_RANK,
    bf16_to_f32,
    bitcast,
    f32_to_bf16,
    shfl_down,
    shfl_idx,
    shfl_up,
    shfl_xor,
    to_f16,
    to_f32,
    to_f64,
)

# Threads per block of the rows kernel and elements per thread per tile. Simulator: one
# Python thread per CUDA thread, so 2 warps of 2 items (still exercises every code path).
ROWS_BLOCK = 64 if SIMULATOR else 256
_ITEMS_4B = 2 if SIMULATOR else 8  # 4-byte accumulators: 256 x 8 = 2048-element tiles
_ITEMS_8B = 2 if SIMULATOR else 4  # 8-byte accumulators: 8 KB/16 KB of smem per tile
_UNROLL = 4  # lines kernel: loads in flight per thread per step

# -- storage <-> accumulator -----------------------------------------------------------


@cuda.jit(device=True, inline=True)
def _i32_same(v):
    return int32(v)


@cuda.jit(device=True, inline=True)
def _i64_same(v):
    return int64(v)


#: element kind -> (storage type, accumulator type, widen, narrow). Halves accumulate in f32.
SCAN_STORAGE = {
    ElementKind.F16: (float16, float32, to_f32, to_f16),
    ElementKind.BF16: (uint16, float32, bf16_to_f32, f32_to_bf16),
    ElementKind.F32: (float32, float32, to_f32, to_f32),
    ElementKind.F64: (float64, float64, to_f64, to_f64),
    ElementKind.I32: (int32, int32, _i32_same, _i32_same),
    ElementKind.I64: (int64, int64, _i64_same, _i64_same),
}

FLOAT_ELEMENTS = (ElementKind.F16, ElementKind.BF16, ElementKind.F32, ElementKind.F64)
INT_ELEMENTS = (ElementKind.I32, ElementKind.I64)


# -- the combine operations ------------------------------------------------------------

#: Op codes (a kernel argument; the branch on it is uniform across the grid). Forward codes
#: are the ScanKind values plus the two record-flag pre-passes of the extremum backward.
CODE_CUMSUM = int(ScanKind.CUMSUM)
CODE_CUMPROD = int(ScanKind.CUMPROD)
CODE_CUMMAX = int(ScanKind.CUMMAX)
CODE_CUMMIN = int(ScanKind.CUMMIN)
CODE_LOG_CUMSUM_EXP = int(ScanKind.LOG_CUMSUM_EXP)
CODE_CUMMAX_RECORD_FLAG = 5
CODE_CUMMIN_RECORD_FLAG = 6
#: Backward codes: CODE_CUMPROD, CODE_LOG_CUMSUM_EXP, and this one for Cummax and Cummin.
CODE_EXTREMUM_BACKWARD = 2


class ScanOp:
    """Compile-time description of one direction (forward or backward) at one element
    kind: the device functions and constants the kernel factories capture."""

    def __init__(self, name: str, element: ElementKind, backward: bool) -> None:
        storage, acc, widen, narrow = SCAN_STORAGE[element]
        self.name = name
        self.element = element
        self.storage = storage
        self.acc = acc
        self.aux = acc if backward else int64
        self.widen = widen
        self.narrow = narrow
        self.n_in = 3 if backward else 1
        self.halo = backward
        self.with_index = not backward
        ops = _backward_ops(acc) if backward else _forward_ops(acc)
        self.identity, self.lift, self.combine, self.emit = ops
        self.items = _ITEMS_8B if acc.bitwidth == 64 else _ITEMS_4B
        # smem slot j lives at j + j // pad: a thread reading ITEMS consecutive slots
        # and a warp reading 32 consecutive slots are both free of bank conflicts
        self.pad = 16 if acc.bitwidth == 64 else 32
        self.idx_pad = 16


def _constants(acc: types.Type):
    dtype = np.dtype(str(acc))
    if dtype.kind == "f":
        return dtype.type(0), dtype.type(1), dtype.type(-np.inf), dtype.type(np.inf)
    info = np.iinfo(dtype)
    return dtype.type(0), dtype.type(1), dtype.type(info.min), dtype.type(info.max)


def _make_logaddexp(acc: types.Type):
    """log(exp(x) + exp(y)) with -inf the identity (never exp(-inf - -inf)), +inf
    absorbing and NaN propagating."""
    _, _, lowest, highest = _constants(acc)

    @cuda.jit(device=True, inline=True)
    def logaddexp(x, y):
        if x != x or y != y:
            return acc(x + y)
        hi = x if x >= y else y
        lo = y if x >= y else x
        if lo == lowest or hi == highest:
            return hi
        return acc(hi + math.log1p(math.exp(lo - hi)))

    return logaddexp


def _forward_ops(acc: types.Type):
    """Forward kinds; state (value, index). Cummax/Cummin: NaN dominates; ties go to the
    later index (torch.cummax), the record-flag pre-passes too, whose ``emit`` writes 1
    where the element is the running winner (a record) and 0 elsewhere.
    LogCumsumExp: logaddexp with -inf as the identity (never exp(-inf - -inf)) and +inf
    absorbing."""
    zero, one, lowest, highest = _constants(acc)
    no_index = int64(-1)

    @cuda.jit(device=True, inline=True)
    def identity(code):
        if code == CODE_CUMSUM:
            return (zero, no_index)
        if code == CODE_CUMPROD:
            return (one, no_index)
        if code == CODE_CUMMAX or code == CODE_CUMMAX_RECORD_FLAG or \
                code == CODE_LOG_CUMSUM_EXP:
            return (lowest, no_index)
        return (highest, no_index)

    @cuda.jit(device=True, inline=True)
    def lift(v0, v1, v2, v2n, has_next, pos, code):
        return (v0, int64(pos))

    logaddexp = _make_logaddexp(acc)

    @cuda.jit(device=True, inline=True)
    def combine(a, b, code):
        if code == CODE_CUMSUM:
            return (acc(a[0] + b[0]), b[1])
        if code == CODE_CUMPROD:
            return (acc(a[0] * b[0]), b[1])
        if code == CODE_LOG_CUMSUM_EXP:
            return (logaddexp(a[0], b[0]), b[1])
        # the record-flag pre-passes follow the same rule: a record is where the index
        # output changes, so the gradient goes where torch's does
        if b[0] != b[0]:  # a later NaN wins (torch: the index of the last NaN)
            return b
        if a[0] != a[0]:
            return a
        if code == CODE_CUMMAX or code == CODE_CUMMAX_RECORD_FLAG:
            return b if b[0] >= a[0] else a
        return b if b[0] <= a[0] else a

    @cuda.jit(device=True, inline=True)
    def emit(excl, incl, v0, v1, v2, v2n, has_next, pos, code):
        if code >= CODE_CUMMAX_RECORD_FLAG:
            return (one if incl[1] == pos else zero), int64(0)
        return incl[0], incl[1]

    return identity, lift, combine, emit


def _backward_ops(acc: types.Type):
    """Backward recurrences ``q -> m (q + dy)``, ``dx = w (dy + B_excl)`` (state (A, B),
    see the module docstring). Inputs: v0 = dy, v1 = x (the record flag for the extremum
    backward), v2 = y, v2n = y at the forward-previous position (valid if ``has_next``)."""
    zero, one, neg_inf, _ = _constants(acc)

    @cuda.jit(device=True, inline=True)
    def identity(code):
        return (one, zero)

    @cuda.jit(device=True, inline=True)
    def lift(v0, v1, v2, v2n, has_next, pos, code):
        if code == CODE_CUMPROD:
            return (v1, acc(v1 * v0))
        if code == CODE_LOG_CUMSUM_EXP:
            if not has_next or v2n == neg_inf:
                return (zero, zero)
            m = acc(math.exp(v2n - v2))
            if m == zero:
                return (zero, zero)
            return (m, acc(m * v0))
        if v1 != zero:  # a record: the running sum stops here
            return (zero, zero)
        return (one, v0)

    @cuda.jit(device=True, inline=True)
    def combine(a, b, code):
        # A zero multiplier cuts the chain exactly: what lies beyond a record (or beyond
        # a +inf in log space) does not reach earlier positions, even if it is NaN.
        # Cumprod keeps IEEE products (0 * inf = NaN, as the true gradient has).
        if b[0] == zero and code != CODE_CUMPROD:
            return (zero, b[1])
        return (acc(b[0] * a[0]), acc(b[0] * a[1] + b[1]))

    @cuda.jit(device=True, inline=True)
    def emit(excl, incl, v0, v1, v2, v2n, has_next, pos, code):
        if code == CODE_CUMPROD:
            weight = v2n if has_next else one
            return acc(weight * (v0 + excl[1])), int64(0)
        if code == CODE_LOG_CUMSUM_EXP:
            if v1 == neg_inf:
                return zero, int64(0)
            return acc(math.exp(v1 - v2) * (v0 + excl[1])), int64(0)
        if v1 != zero:
            return acc(v0 + excl[1]), int64(0)
        return zero, int64(0)

    return identity, lift, combine, emit


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
    widen, narrow = op.widen, op.narrow

    def scan_rows(in0, in1, in2, out0, out_idx, ws_a, ws_b, lines, extent, seg_len, nseg,
                  phase, outer_shape, st0, st1, st2, st_out, st_idx, ax0, ax1, ax2, ax_out,
                  ax_idx, reverse, write_index, code):
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
                for m in range(items):
                    j = tid + m * nthreads
                    s = base + j
                    if s < extent:
                        pos = extent - 1 - s if reverse else s
                        slot = j + j // pad
                        if s < s_end:
                            t0[slot] = widen(in0[b0 + pos * ax0])
                            if n_in >= 2:
                                t1[slot] = widen(in1[b1 + pos * ax1])
                        if n_in >= 3:
                            t2[slot] = widen(in2[b2 + pos * ax2])
                if halo and tid == 0:
                    s = base + tile
                    if s < extent:
                        pos = extent - 1 - s if reverse else s
                        t2[tile + tile // pad] = widen(in2[b2 + pos * ax2])
                cuda.syncthreads()
                first = tid * items
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
                # warp-level inclusive scan of the per-thread aggregates
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
                    for m in range(items):
                        j = tid + m * nthreads
                        s = base + j
                        if s < s_end:
                            pos = extent - 1 - s if reverse else s
                            out0[bo + pos * ax_out] = narrow(t0[j + j // pad])
                            if with_index:
                                if write_index:
                                    out_idx[bi + pos * ax_idx] = tix[j + j // idx_pad]
                carry = total
                cuda.syncthreads()
                base += tile
            if phase == 1 and tid == 0:
                ws_a[item] = carry[0]
                ws_b[item] = carry[1]
            item += cuda.gridDim.x

    scan_rows.__qualname__ = f"scan_rows_{op.name}_{op.element.name}"  # own cache index
    return scan_rows


def _make_lines(op: ScanOp):
    """The lines kernel for ``op`` (see the module docstring)."""
    acc, aux = op.acc, op.aux
    n_in = op.n_in
    halo = op.halo
    with_index = op.with_index
    zero = _constants(acc)[0]
    identity, lift, combine, emit = op.identity, op.lift, op.combine, op.emit
    widen, narrow = op.widen, op.narrow
    unroll = _UNROLL

    @cuda.jit(device=True, inline=True)
    def fetch(in0, in1, in2, b0, b1, b2, ax0, ax1, ax2, s, extent, reverse):
        pos = extent - 1 - s if reverse else s
        v0 = widen(in0[b0 + pos * ax0])
        v1 = widen(in1[b1 + pos * ax1]) if n_in >= 2 else zero
        v2 = widen(in2[b2 + pos * ax2]) if n_in >= 3 else zero
        v2n = zero
        if halo:
            if s + 1 < extent:
                v2n = widen(in2[b2 + (pos - 1 if reverse else pos + 1) * ax2])
        return v0, v1, v2, v2n, pos

    def scan_lines(in0, in1, in2, out0, out_idx, ws_a, ws_b, lines, extent, seg_len, nseg,
                   phase, outer_shape, st0, st1, st2, st_out, st_idx, ax0, ax1, ax2, ax_out,
                   ax_idx, reverse, write_index, code, chunk_len):
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
                    s = c_begin
                    while s + unroll <= c_end:
                        for u in range(unroll):
                            v0, v1, v2, v2n, pos = fetch(in0, in1, in2, b0, b1, b2, ax0, ax1,
                                                         ax2, s + u, extent, reverse)
                            l0[u] = v0
                            l1[u] = v1
                            l2[u] = v2
                            l2n[u] = v2n
                            lpos[u] = pos
                        for u in range(unroll):
                            element = lift(l0[u], l1[u], l2[u], l2n[u], s + u + 1 < extent,
                                           lpos[u], code)
                            agg = combine(agg, element, code)
                        s += unroll
                    while s < c_end:
                        v0, v1, v2, v2n, pos = fetch(in0, in1, in2, b0, b1, b2, ax0, ax1, ax2,
                                                     s, extent, reverse)
                        element = lift(v0, v1, v2, v2n, s + 1 < extent, pos, code)
                        agg = combine(agg, element, code)
                        s += 1
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
                                                         ax2, s + u, extent, reverse)
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
                            out0[bo + lpos[u] * ax_out] = narrow(value)
                            if with_index:
                                if write_index:
                                    out_idx[bi + lpos[u] * ax_idx] = index
                            run = inc
                    s += steps
            item += cuda.gridDim.x

    scan_lines.__qualname__ = f"scan_lines_{op.name}_{op.element.name}"
    return scan_lines


# -- fast kernels for the common layout ----------------------------------------------------
#
# Scalar-state forward scans (Cumsum, Cumprod, LogCumsumExp, and Cummax/Cummin values) of
# operands whose lines sit at a uniform pitch: the plan collapses the tensor to
# [outer, extent, inner] for x and y (inner axes contiguous). Arrays are 'C' 1-D views
# indexed with uint64 (no stride multiply, no negative-index wraparound), and where the
# pointers and strides allow it every access moves an 8-byte word of ``8 // itemsize``
# elements through a second uint64 view of the same bytes.
#
# rows_fast (inner = 1): one warp per (line, segment). A tile is 32 lanes x WORDS words; lane
# ``l`` holds elements ``k*32*V + l*V + j`` (j < V) of group ``k`` in registers:
#
#     words --unpack--> V values --serial scan--> warp shfl_up scan of the lane totals
#         --> + carry + exclusive lane prefix --> pack --> words     (no smem, no barrier)
#
# cols_fast (inner >= 32): a block of 32 lanes x CHUNKS rows of threads covers 32*V columns;
# each thread scans ROWS consecutive rows of its V columns in registers, chunk totals are
# combined through shared memory (double-buffered: one barrier per tile). 2-byte elements
# (but LogCumsumExp) keep the rows as packed words across the barrier (reduce, exchange,
# rescan):
#
#     ROWS words --reduce per column--> chunk totals --smem--> prefix
#         --> rescan the words from the prefix --> cvt pairs --> words
#
# Both split few long lines into segments over warps/blocks in two phases like the generic
# kernels (phase 1: segment aggregates to ``ws``; phase 2: prefix of the earlier segments,
# combined in a fixed order, so results are deterministic).

_WORD_BYTES = 8
#: rows_fast: uint64 words per lane per tile (loads in flight per thread)
FAST_WORDS = 2 if SIMULATOR else 4
#: rows_fast threads per block (independent warps)
FAST_ROWS_BLOCK = 32 if SIMULATOR else 128
#: cols_fast: chunks per block (threadIdx.y) and rows per thread per tile
FAST_COLS_CHUNKS = 2 if SIMULATOR else 8
_FAST_COLS_VALUES = 4 if SIMULATOR else 16  # values per thread per tile (rows x V)
#: fused Cummax/Cummin backward on the GPU: (rows words per lane, cols values per thread)
#: and chunks per cols block: blocked rows of 4 words (one warp scan per tile each way),
#: 16 cols values (fewer leave the chunk loops dominant). Measurements: docs/design/scan.md.
_EXTREMUM_BACKWARD_SIZES = (4, 16)
_EXTREMUM_COLS_CHUNKS = FAST_COLS_CHUNKS
#: family -> (rows_fast words, cols_fast values per thread by element size: 8, 4, 2
#: bytes) on the GPU: fewer for the families with large combines, whose unrolled loops
#: otherwise stay loops and put the per-thread values in local memory (PTX of compute 9.0
#: checked for ld.local/st.local). 2-byte elements of the packed cols body (every family
#: but lse) take 8 rows (32 values): twice the bytes in flight per thread of 4 rows
#: under the same register cap (docs/design/scan.md).
_FAST_COLS_BY_SIZE = (16, 16, 32)
_FAST_SIZES = {"sum": (FAST_WORDS, _FAST_COLS_BY_SIZE), "prod": (FAST_WORDS, _FAST_COLS_BY_SIZE),
               "lse": (4, (8, 8, 8)), "extremum": (FAST_WORDS, _FAST_COLS_BY_SIZE)}

@cuda.jit(device=True, inline=True)
def _f16_from_bits(bits):
    return bitcast(uint16(bits), float16)


@cuda.jit(device=True, inline=True)
def _f16_to_bits(value):
    return uint64(bitcast(value, uint16))


@cuda.jit(device=True, inline=True)
def _u16_from_bits(bits):
    return uint16(bits)


@cuda.jit(device=True, inline=True)
def _u16_to_bits(value):
    return uint64(value)


@cuda.jit(device=True, inline=True)
def _f32_from_bits(bits):
    return bitcast(uint32(bits), float32)


@cuda.jit(device=True, inline=True)
def _f32_to_bits(value):
    return uint64(bitcast(value, uint32))


@cuda.jit(device=True, inline=True)
def _i32_from_bits(bits):
    return bitcast(uint32(bits), int32)


@cuda.jit(device=True, inline=True)
def _i32_to_bits(value):
    return uint64(bitcast(value, uint32))


@cuda.jit(device=True, inline=True)
def _f64_from_bits(bits):
    return bitcast(uint64(bits), float64)


@cuda.jit(device=True, inline=True)
def _f64_to_bits(value):
    return bitcast(value, uint64)


@cuda.jit(device=True, inline=True)
def _i64_from_bits(bits):
    return bitcast(uint64(bits), int64)


@cuda.jit(device=True, inline=True)
def _i64_to_bits(value):
    return bitcast(value, uint64)


#: element kind -> (storage from its zero-extended bits, storage to bits)
_WORD_BITS = {
    ElementKind.F16: (_f16_from_bits, _f16_to_bits),
    ElementKind.BF16: (_u16_from_bits, _u16_to_bits),
    ElementKind.F32: (_f32_from_bits, _f32_to_bits),
    ElementKind.F64: (_f64_from_bits, _f64_to_bits),
    ElementKind.I32: (_i32_from_bits, _i32_to_bits),
    ElementKind.I64: (_i64_from_bits, _i64_to_bits),
}

#: Forward kinds the fast kernels serve (scalar state: no index output, no flag pre-pass),
#: by family: one compiled kernel per family keeps the per-element code small (a runtime
#: kind switch with every combine inlined left the per-thread values in local memory).
FAST_FAMILY = {CODE_CUMSUM: "sum", CODE_CUMPROD: "prod", CODE_LOG_CUMSUM_EXP: "lse",
               CODE_CUMMAX: "extremum", CODE_CUMMIN: "extremum"}
#: family -> element kinds with fast kernels (the rest use the generic kernels)
FAST_ELEMENTS = {"sum": FLOAT_ELEMENTS + INT_ELEMENTS, "prod": FLOAT_ELEMENTS,
                 "lse": FLOAT_ELEMENTS, "extremum": FLOAT_ELEMENTS + INT_ELEMENTS}


def _scalar_forward_ops(acc: types.Type, family: str):
    """identity / combine of one family of forward kinds on the value alone: the same
    arithmetic and the same NaN, tie (later wins, which decides the sign of a zero) and
    -inf rules as ``_forward_ops``. Only the extremum family reads ``code`` (max or min)."""
    zero, one, lowest, highest = _constants(acc)
    logaddexp = _make_logaddexp(acc)

    if family == "sum":

        @cuda.jit(device=True, inline=True)
        def identity(code):
            return zero

        @cuda.jit(device=True, inline=True)
        def combine(a, b, code):
            return acc(a + b)

    elif family == "prod":

        @cuda.jit(device=True, inline=True)
        def identity(code):
            return one

        @cuda.jit(device=True, inline=True)
        def combine(a, b, code):
            return acc(a * b)

    elif family == "lse":

        @cuda.jit(device=True, inline=True)
        def identity(code):
            return lowest

        @cuda.jit(device=True, inline=True)
        def combine(a, b, code):
            return logaddexp(a, b)

    else:

        @cuda.jit(device=True, inline=True)
        def identity(code):
            return lowest if code == CODE_CUMMAX else highest

        @cuda.jit(device=True, inline=True)
        def combine(a, b, code):
            if b != b:
                return b
            if a != a:
                return a
            if code == CODE_CUMMAX:
                return b if b >= a else a
            return b if b <= a else a

    return identity, combine


class FastFormat:
    """Compile-time constants of the fast kernels at one element kind."""

    def __init__(self, element: ElementKind, family: str) -> None:
        storage, acc, widen, narrow = SCAN_STORAGE[element]
        self.element = element
        self.family = family
        self.storage = storage
        self.acc = acc
        self.widen = widen
        self.narrow = narrow
        self.per_word = _WORD_BYTES // np.dtype(str(storage)).itemsize
        self.from_bits, self.to_bits = _WORD_BITS[element]
        self.identity, self.combine = _scalar_forward_ops(acc, family)


def _word_codecs(fmt: FastFormat):
    """unpack(word, j) -> accumulator value of element j; pack_one(value, j) -> its bits
    in place j of a word."""
    per_word = fmt.per_word
    bits = 64 // per_word
    mask = uint64((1 << bits) - 1) if bits < 64 else uint64(0xFFFFFFFFFFFFFFFF)
    widen, narrow, from_bits, to_bits = fmt.widen, fmt.narrow, fmt.from_bits, fmt.to_bits

    @cuda.jit(device=True, inline=True)
    def unpack(word, j):
        return widen(from_bits((word >> uint64(bits * j)) & mask))

    @cuda.jit(device=True, inline=True)
    def pack_one(value, j):
        return to_bits(narrow(value)) << uint64(bits * j)

    @cuda.jit(device=True, inline=True)
    def store_word(yw, y, index, word):
        yw[uint64(index)] = word
        if SIMULATOR:
            # The simulator copies each argument in and back out: y's copy-back (it comes
            # after yw) would undo the word store, so mirror the word's elements into y.
            for j in range(per_word):
                y[uint64(index * per_word + j)] = from_bits((word >> uint64(bits * j)) & mask)

    return unpack, pack_one, store_word


if SIMULATOR:

    def _make_pair_pack(element: ElementKind):
        narrow, to_bits = SCAN_STORAGE[element][3], _WORD_BITS[element][1]

        @cuda.jit(device=True)
        def pack_pair(high, low):
            return (to_bits(narrow(high)) << uint64(16)) | to_bits(narrow(low))

        return pack_pair

else:
    from llvmlite import ir
    from numba.cuda.extending import intrinsic

    def _make_pair_pack(element: ElementKind):
        op = "cvt.rn.bf16x2.f32" if element is ElementKind.BF16 else "cvt.rn.f16x2.f32"

        @intrinsic
        def pack_pair(typingctx, high, low):
            """Bits of (high, low) rounded to 2-byte floats, ``high`` in bits 16-31: one
            ``cvt.rn.{bf16,f16}x2.f32`` (sm_80+; round to nearest even, NaN stays NaN)."""

            def codegen(context, builder, signature, args):
                fnty = ir.FunctionType(ir.IntType(32), [ir.FloatType(), ir.FloatType()])
                bits = builder.call(ir.InlineAsm(fnty, f"{op} $0, $1, $2;", "=r,f,f"), args)
                return builder.zext(bits, ir.IntType(64))

            return uint64(float32, float32), codegen

        return pack_pair


def _make_pack_values(fmt: FastFormat):
    """pack_values(vals, first) -> the word of 2-byte floats ``vals[first:first + 4]``
    (element j in place j), converted in pairs (``_make_pair_pack``): 2 instructions per
    word instead of a rounding sequence per element (bf16 cols_fast was compute-bound
    with it: SM 78%, memory 50%, Nsight Compute, [64, 1e6] axis 0)."""
    pack_pair = _make_pair_pack(fmt.element)

    @cuda.jit(device=True, inline=True)
    def pack_values(vals, first):
        return pack_pair(vals[first + 1], vals[first]) | \
            (pack_pair(vals[first + 3], vals[first + 2]) << uint64(32))

    return pack_values


def _make_warp_helpers(fmt: FastFormat):
    identity, combine = fmt.identity, fmt.combine

    @cuda.jit(device=True, inline=True)
    def warp_total(value, lane, code):
        """combine(lane 0, lane 1, ..., lane 31) in lane order, on every lane (a fixed
        tree: deterministic)."""
        delta = 1
        while delta < 32:
            other = shfl_down(value, delta)
            if lane + delta < 32:
                value = combine(value, other, code)
            delta *= 2
        return shfl_idx(value, 0)

    @cuda.jit(device=True, inline=True)
    def segments_prefix(ws, first, count, lane, code):
        """combine(ws[first], ..., ws[first + count - 1]) in order, on every lane."""
        per_lane = (count + 31) // 32
        lo = min(count, lane * per_lane)
        hi = min(count, lo + per_lane)
        value = identity(code)
        for g in range(lo, hi):
            value = combine(value, ws[uint64(first + g)], code)
        return warp_total(value, lane, code)

    return warp_total, segments_prefix


def _make_rows_fast(fmt: FastFormat, words: int):
    """The rows_fast kernel (see above) with ``words`` uint64 words per lane per tile.

    Striped (default): lane ``l`` holds word ``k*32 + l`` of the tile for k < words
    (coalesced loads, one warp scan per word group). Blocked (the LogCumsumExp family,
    whose combine costs ~50 instructions): lane ``l`` holds words ``l*words + k``, a run of
    ``words*V`` consecutive elements, so one warp scan serves the whole run (f32 [4096²]:
    10 logaddexp per 2 elements striped)."""
    acc = fmt.acc
    per_word = fmt.per_word
    per_lane = words * per_word
    tile = 32 * per_lane
    blocked = fmt.family == "lse"
    scan_groups = 1 if blocked else words  # groups of consecutive elements per lane
    group = per_lane // scan_groups
    # phase 1 reduces a lane's values before the lanes: only in scan order when each lane
    # holds one run, or when the operation commutes (not for Cummax/Cummin ties)
    reduce_groups = scan_groups if fmt.family == "extremum" else 1
    reduce_size = per_lane // reduce_groups
    identity, combine, widen, narrow = fmt.identity, fmt.combine, fmt.widen, fmt.narrow
    unpack, pack_one, store_word = _word_codecs(fmt)
    warp_total, segments_prefix = _make_warp_helpers(fmt)

    def scan_rows_fast(x, xw, yw, y, ws, lines, extent, x_pitch, y_pitch, seg_len, nseg,
                       phase, reverse, vec, code):
        vals = cuda.local.array(per_lane, acc)
        lane = int64(cuda.threadIdx.x % 32)
        warps = int64(cuda.blockDim.x // 32)
        item = int64(cuda.blockIdx.x) * warps + int64(cuda.threadIdx.x // 32)
        step = int64(cuda.gridDim.x) * warps
        extent_words = extent // per_word
        while item < lines * nseg:
            line = item // nseg
            seg = item - line * nseg
            xb = line * x_pitch
            yb = line * y_pitch
            s_begin = seg * seg_len
            s_end = min(extent, s_begin + seg_len)
            carry = identity(code)
            if phase == 2:
                carry = segments_prefix(ws, line * nseg, seg, lane, code)
            base = s_begin
            while base < s_end:
                full = vec and base + tile <= s_end
                if full:
                    for k in range(words):
                        sw = base // per_word + (lane * words + k if blocked else k * 32 + lane)
                        if reverse:
                            w = xw[uint64(xb // per_word + extent_words - 1 - sw)]
                        else:
                            w = xw[uint64(xb // per_word + sw)]
                        for j in range(per_word):
                            vals[k * per_word + j] = unpack(w, per_word - 1 - j if reverse
                                                            else j)
                else:
                    for k in range(words):
                        for j in range(per_word):
                            s = base + (lane * words + k if blocked else k * 32 + lane) \
                                * per_word + j
                            v = identity(code)
                            if s < s_end:
                                pos = extent - 1 - s if reverse else s
                                v = widen(x[uint64(xb + pos)])
                            vals[k * per_word + j] = v
                if phase == 1:
                    for r in range(reduce_groups):
                        agg = vals[r * reduce_size]
                        for i in range(1, reduce_size):
                            agg = combine(agg, vals[r * reduce_size + i], code)
                        carry = combine(carry, warp_total(agg, lane, code), code)
                else:
                    for g in range(scan_groups):
                        run = vals[g * group]
                        for i in range(1, group):
                            run = combine(run, vals[g * group + i], code)
                            vals[g * group + i] = run
                        inc = run
                        delta = 1
                        while delta < 32:
                            other = shfl_up(inc, delta)
                            if lane >= delta:
                                inc = combine(other, inc, code)
                            delta *= 2
                        excl = shfl_up(inc, 1)
                        prefix = carry
                        if lane > 0:
                            prefix = combine(carry, excl, code)
                        for i in range(group):
                            vals[g * group + i] = combine(prefix, vals[g * group + i], code)
                        carry = combine(carry, shfl_idx(inc, 31), code)
                    if full:
                        for k in range(words):
                            sw = base // per_word + (lane * words + k if blocked
                                                     else k * 32 + lane)
                            w = uint64(0)
                            for j in range(per_word):
                                w |= pack_one(vals[k * per_word + j],
                                              per_word - 1 - j if reverse else j)
                            if reverse:
                                store_word(yw, y, yb // per_word + extent_words - 1 - sw, w)
                            else:
                                store_word(yw, y, yb // per_word + sw, w)
                    else:
                        for k in range(words):
                            for j in range(per_word):
                                s = base + (lane * words + k if blocked else k * 32 + lane) \
                                    * per_word + j
                                if s < s_end:
                                    pos = extent - 1 - s if reverse else s
                                    y[uint64(yb + pos)] = narrow(vals[k * per_word + j])
                base += tile
            if phase == 1 and lane == 0:
                ws[uint64(item)] = carry
            item += step

    scan_rows_fast.__qualname__ = f"scan_rows_fast_{fmt.family}_{fmt.element.name}_{words}"
    return scan_rows_fast


@cuda.jit(device=True, inline=True)
def _cols_item(item, nseg, groups, width, lane, per_word, inner, vec, seg_len, extent):
    """Work item ``item`` of the column kernels (segment-fastest, then column group, then
    outer index): its segment, outer index, this lane's first column and how many of its
    ``per_word`` columns exist, whether they can move as one word, and the segment's
    ``[s_begin, s_end)`` along the scan axis."""
    seg = item % nseg
    rest = item // nseg
    group = rest % groups
    o = rest // groups
    col = group * width + lane * per_word
    ncols = min(per_word, inner - col)
    wide = vec and ncols == per_word
    s_begin = seg * seg_len
    s_end = min(extent, s_begin + seg_len)
    return seg, o, col, ncols, wide, s_begin, s_end


def _make_cols_steps(fmt: FastFormat):
    """Device functions shared by the column kernels (``_make_cols_fast`` and
    ``_make_cols_fast_packed``), each over the ``per_word`` columns of a lane:

    * ``carry_in``: ``carry`` <- identity, then (phase 2) the aggregates of the earlier
      segments of these columns from ``ws``, combined in segment order;
    * ``exchange``: write this chunk's total ``total[at0:at0 + per_word]`` to
      ``part[parity][chunk][j][lane]`` (lane-contiguous, free of bank conflicts), barrier,
      then ``prefix`` <- ``carry`` + the totals of the earlier chunks and ``carry`` <-
      ``carry`` + every chunk's total (the carry into the next tile);
    * ``carry_out``: (phase 1) this segment's aggregate to ``ws``, segment-major.

    Runtime loops outside, unrolled loops over j inside: every local array index is a
    constant after unrolling (registers, not local memory)."""
    per_word = fmt.per_word
    identity, combine = fmt.identity, fmt.combine

    @cuda.jit(device=True, inline=True)
    def carry_in(carry, ws, phase, seg, lines, o, inner, col, ncols, code):
        for j in range(per_word):
            carry[j] = identity(code)
        if phase == 2:
            # ws is segment-major ([segment][line]): coalesced across lanes
            for g in range(seg):
                at = g * lines + o * inner + col
                for j in range(per_word):
                    if j < ncols:
                        carry[j] = combine(carry[j], ws[uint64(at + j)], code)

    @cuda.jit(device=True, inline=True)
    def exchange(part, total, at0, prefix, carry, parity, chunk, chunks, width, lane, code):
        slot = (parity * chunks + chunk) * width + lane
        for j in range(per_word):
            part[slot + j * 32] = total[at0 + j]
        cuda.syncthreads()
        for j in range(per_word):
            prefix[j] = carry[j]
        for c in range(chunk):
            at = (parity * chunks + c) * width + lane
            for j in range(per_word):
                prefix[j] = combine(prefix[j], part[at + j * 32], code)
        for j in range(per_word):
            carry[j] = prefix[j]
        for c in range(chunk, chunks):
            at = (parity * chunks + c) * width + lane
            for j in range(per_word):
                carry[j] = combine(carry[j], part[at + j * 32], code)

    @cuda.jit(device=True, inline=True)
    def carry_out(ws, carry, phase, chunk, seg, lines, o, inner, col, ncols):
        if phase == 1 and chunk == 0:
            for j in range(per_word):
                if j < ncols:
                    ws[uint64(seg * lines + o * inner + col + j)] = carry[j]

    return carry_in, exchange, carry_out


def _make_cols_fast(fmt: FastFormat, rows: int, chunks_max: int):
    """The cols_fast kernel (see above): ``rows`` rows per thread per tile, up to
    ``chunks_max`` chunks (blockDim.y) per block."""
    acc = fmt.acc
    per_word = fmt.per_word
    width = 32 * per_word  # columns per block
    identity, combine, widen, narrow = fmt.identity, fmt.combine, fmt.widen, fmt.narrow
    unpack, pack_one, store_word = _word_codecs(fmt)
    carry_in, exchange, carry_out = _make_cols_steps(fmt)
    part_slots = 2 * chunks_max * width
    values = rows * per_word

    def scan_cols_fast(x, xw, yw, y, ws, outer, extent, inner, x_outer, x_step, y_outer,
                       y_step, seg_len, nseg, phase, reverse, vec, code):
        part = cuda.shared.array(part_slots, acc)
        vals = cuda.local.array(values, acc)
        carry = cuda.local.array(per_word, acc)
        prefix = cuda.local.array(per_word, acc)
        lane = int64(cuda.threadIdx.x)
        chunk = int64(cuda.threadIdx.y)
        chunks = int64(cuda.blockDim.y)
        tile_rows = chunks * rows
        groups = (inner + width - 1) // width
        lines = outer * inner
        parity = int64(0)
        item = int64(cuda.blockIdx.x)
        while item < outer * groups * nseg:
            seg, o, col, ncols, wide, s_begin, s_end = _cols_item(
                item, nseg, groups, width, lane, per_word, inner, vec, seg_len, extent)
            xb = o * x_outer + col
            yb = o * y_outer + col
            carry_in(carry, ws, phase, seg, lines, o, inner, col, ncols, code)
            base = s_begin
            while base < s_end:
                r0 = base + chunk * rows
                for r in range(rows):
                    s = r0 + r
                    pos = extent - 1 - s if reverse else s
                    if wide and s < s_end:
                        w = xw[uint64((xb + pos * x_step) // per_word)]
                        for j in range(per_word):
                            vals[r * per_word + j] = unpack(w, j)
                    else:
                        for j in range(per_word):
                            v = identity(code)
                            if s < s_end and j < ncols:
                                v = widen(x[uint64(xb + pos * x_step + j)])
                            vals[r * per_word + j] = v
                for r in range(1, rows):
                    for j in range(per_word):
                        vals[r * per_word + j] = combine(vals[(r - 1) * per_word + j],
                                                         vals[r * per_word + j], code)
                exchange(part, vals, (rows - 1) * per_word, prefix, carry, parity, chunk,
                         chunks, width, lane, code)
                if phase != 1:
                    for r in range(rows):
                        for j in range(per_word):
                            vals[r * per_word + j] = combine(prefix[j], vals[r * per_word + j],
                                                             code)
                if phase != 1:
                    for r in range(rows):
                        s = r0 + r
                        pos = extent - 1 - s if reverse else s
                        if wide and s < s_end:
                            w = uint64(0)
                            for j in range(per_word):
                                w |= pack_one(vals[r * per_word + j], j)
                            store_word(yw, y, (yb + pos * y_step) // per_word, w)
                        elif s < s_end:
                            for j in range(per_word):
                                if j < ncols:
                                    y[uint64(yb + pos * y_step + j)] = narrow(
                                        vals[r * per_word + j])
                parity = 1 - parity
                base += tile_rows
            carry_out(ws, carry, phase, chunk, seg, lines, o, inner, col, ncols)
            item += cuda.gridDim.x

    scan_cols_fast.__qualname__ = f"scan_cols_fast_{fmt.family}_{fmt.element.name}_{rows}"
    return scan_cols_fast


def _make_cols_fast_packed(fmt: FastFormat, rows: int, chunks_max: int):
    """cols_fast for 2-byte elements: ``_make_cols_fast``'s contract and tiles, but a
    thread keeps its ``rows`` words *packed* (2 registers per row whatever V) from the
    load to the store instead of holding ``rows x V`` f32 values across the barrier: it
    reduces them column by column into its chunk total, the chunk totals are combined
    through shared memory, then it rescans the same words from its prefix,
    ``y[r] = (...((prefix + x[0]) + x[1]) ...) + x[r]``, and packs the results in pairs
    (``_make_pack_values``). f32 accumulation, one rounding per output, as before.

    The unpacked body took 137 registers for bf16 at 4 rows (capped at 64: 32 bytes in
    flight per thread, 41% of copy on [64, 1e6] axis 0); this one holds 8 rows (64 bytes)
    under the same cap. Wider elements keep ``_make_cols_fast`` (no gain packed), and so
    does LogCumsumExp, whose ~50-instruction combine is better off independent
    (``prefix + scanned[r]``) than in the rescan's dependent chain (docs/design/scan.md)."""
    acc = fmt.acc
    per_word = fmt.per_word
    bits = 64 // per_word
    width = 32 * per_word  # columns per block
    identity, combine, narrow, to_bits = fmt.identity, fmt.combine, fmt.narrow, fmt.to_bits
    unpack, _, store_word = _word_codecs(fmt)
    pack_values = _make_pack_values(fmt)
    carry_in, exchange, carry_out = _make_cols_steps(fmt)
    part_slots = 2 * chunks_max * width

    def scan_cols_fast(x, xw, yw, y, ws, outer, extent, inner, x_outer, x_step, y_outer,
                       y_step, seg_len, nseg, phase, reverse, vec, code):
        part = cuda.shared.array(part_slots, acc)
        words = cuda.local.array(rows, uint64)
        carry = cuda.local.array(per_word, acc)
        run = cuda.local.array(per_word, acc)
        lane = int64(cuda.threadIdx.x)
        chunk = int64(cuda.threadIdx.y)
        chunks = int64(cuda.blockDim.y)
        tile_rows = chunks * rows
        groups = (inner + width - 1) // width
        lines = outer * inner
        parity = int64(0)
        item = int64(cuda.blockIdx.x)
        while item < outer * groups * nseg:
            seg, o, col, ncols, wide, s_begin, s_end = _cols_item(
                item, nseg, groups, width, lane, per_word, inner, vec, seg_len, extent)
            xb = o * x_outer + col
            yb = o * y_outer + col
            carry_in(carry, ws, phase, seg, lines, o, inner, col, ncols, code)
            base = s_begin
            while base < s_end:
                r0 = base + chunk * rows
                # rows past the segment end load nothing and are skipped below; columns
                # past ``inner`` (j >= ncols) carry zero bits and are never stored
                for r in range(rows):
                    s = r0 + r
                    pos = extent - 1 - s if reverse else s
                    w = uint64(0)
                    if wide and s < s_end:
                        w = xw[uint64((xb + pos * x_step) // per_word)]
                    elif s < s_end:
                        for j in range(per_word):
                            if j < ncols:
                                w |= to_bits(x[uint64(xb + pos * x_step + j)]) << \
                                    uint64(bits * j)
                    words[r] = w
                for j in range(per_word):
                    run[j] = identity(code)
                valid = min(rows, s_end - r0)  # rows of this thread in the segment
                for r in range(rows):
                    if r < valid:
                        for j in range(per_word):
                            run[j] = combine(run[j], unpack(words[r], j), code)
                # run <- carry + the earlier chunks' totals: this thread's prefix
                exchange(part, run, 0, run, carry, parity, chunk, chunks, width, lane, code)
                if phase != 1:
                    for r in range(rows):
                        s = r0 + r
                        pos = extent - 1 - s if reverse else s
                        for j in range(per_word):
                            run[j] = combine(run[j], unpack(words[r], j), code)
                        if wide and s < s_end:
                            store_word(yw, y, (yb + pos * y_step) // per_word,
                                       pack_values(run, 0))
                        elif s < s_end:
                            for j in range(per_word):
                                if j < ncols:
                                    y[uint64(yb + pos * y_step + j)] = narrow(run[j])
                parity = 1 - parity
                base += tile_rows
            carry_out(ws, carry, phase, chunk, seg, lines, o, inner, col, ncols)
            item += cuda.gridDim.x

    scan_cols_fast.__qualname__ = f"scan_cols_fast_packed_{fmt.family}_{fmt.element.name}_{rows}"
    return scan_cols_fast


def _c_flat(array_type: types.Type) -> types.Array:
    return types.Array(array_type, 1, "C")


#: Register cap (64: 4 blocks of 256 threads per SM) of cols_fast for 2- and 4-byte
#: elements and of the indexed rows kernel for 2-byte ones. Uncapped, cols_fast took 137
#: registers for bf16 (one block per SM) and 96 for f32, the indexed kernel 95 for bf16;
#: capped, ptxas spills 36-80 bytes (loop invariants), and every capped kernel is faster
#: than uncapped or at 80 registers; f32 indexed is not capped (no gain). The packed
#: 2-byte cols body (96 registers uncapped, 84 bytes spilled at 64) and the indexed kernel
#: with staged indices (98 / 76) keep the cap too. Measurements: docs/design/scan.md.
_MAX_REGISTERS = 64


def _cap(fmt: FastFormat, max_registers: int | None, min_per_word: int) -> int | None:
    """The register cap: ``max_registers`` if given (0: none), else ``_MAX_REGISTERS``
    for elements of at least ``min_per_word`` per 8-byte word."""
    if max_registers is not None:
        return max_registers or None
    return _MAX_REGISTERS if fmt.per_word >= min_per_word else None


class FastKernels:
    """rows_fast and cols_fast of one family of forward kinds at one element kind."""

    def __init__(self, element: ElementKind, family: str, words: int | None = None,
                 col_values: int | None = None, register: bool = True,
                 cols_max_registers: int | None = None) -> None:
        fmt = FastFormat(element, family)
        words = words or (FAST_WORDS if SIMULATOR else _FAST_SIZES[family][0])
        col_values = col_values or (_FAST_COLS_VALUES if SIMULATOR else
                                    _FAST_SIZES[family][1][fmt.per_word.bit_length() - 1])
        self.format = fmt
        self.per_word = fmt.per_word
        self.words = words
        self.tile = 32 * words * fmt.per_word
        self.col_rows = max(2, col_values // fmt.per_word)
        self.acc_bytes = fmt.acc.bitwidth // 8
        arrays = (_c_flat(fmt.storage), _c_flat(uint64), _c_flat(uint64),
                  _c_flat(fmt.storage), _c_flat(fmt.acc))
        tag = f"{element.name},{family}"
        # the tile is in the names: the cubin cache is keyed by name, so a tuning variant
        # named like the default would load the default's cubin
        self.rows = Kernel(f"scan_rows_fast[{tag},{words}]", _make_rows_fast(fmt, words),
                           arrays + (int64,) * 7 + (boolean, boolean, int64),
                           register=register)
        self.cols = Kernel(f"scan_cols_fast[{tag},{self.col_rows}]",
                           (_make_cols_fast_packed if fmt.per_word == 4 and family != "lse"
                            else _make_cols_fast)(fmt, self.col_rows, FAST_COLS_CHUNKS),
                           arrays + (int64,) * 10 + (boolean, boolean, int64),
                           register=register, max_registers=_cap(fmt, cols_max_registers, 2))


def _indexed_ops(acc: types.Type):
    """identity / combine of Cummax/Cummin with the winner's position, and of their
    record-flag pre-passes: ``_forward_ops`` restricted to these four
    codes (the same NaN and tie rules), so the kernel stays small."""
    _, _, lowest, highest = _constants(acc)
    no_index = int64(-1)

    @cuda.jit(device=True, inline=True)
    def identity(code):
        if code == CODE_CUMMAX or code == CODE_CUMMAX_RECORD_FLAG:
            return (lowest, no_index)
        return (highest, no_index)

    @cuda.jit(device=True, inline=True)
    def combine(a, b, code):
        # the record-flag pre-passes follow the same rule: a record is where the index
        # output changes, so the gradient goes where torch's does
        if b[0] != b[0]:  # a later NaN wins (torch: the index of the last NaN)
            return b
        if a[0] != a[0]:
            return a
        if code == CODE_CUMMAX or code == CODE_CUMMAX_RECORD_FLAG:
            return b if b[0] >= a[0] else a
        return b if b[0] <= a[0] else a

    return identity, combine


if SIMULATOR:

    @cuda.jit(device=True)
    def _warp_barrier():
        """The simulator runs one warp per block where this is used."""
        cuda.syncthreads()

else:

    @cuda.jit(device=True, inline=True)
    def _warp_barrier():
        cuda.syncwarp()


#: Indexed rows kernel: words per lane per tile. One on the GPU: with 2 or 4 the word loop
#: stays a loop and the (value, position) pairs go to local memory (PTX, compute 9.0).
_INDEXED_WORDS = 2 if SIMULATOR else 1
#: Codes of the indexed rows kernel: Cummax/Cummin with an index output, and the record
#: flags of their backward (a 1 where the element is the running winner, else 0).
INDEXED_CODES = (CODE_CUMMAX, CODE_CUMMIN, CODE_CUMMAX_RECORD_FLAG, CODE_CUMMIN_RECORD_FLAG)


def _make_rows_indexed(fmt: FastFormat, words: int):
    """rows_fast for the (value, position) state of Cummax/Cummin (striped tiles; the
    combine is not commutative, so phase 1 reduces each word group in scan order).

    Full tiles of 2-byte elements write their int64 indices through shared memory (one
    slice per warp): a lane's 4 consecutive indices stored directly are 4 stores of 8
    bytes at a 32-byte stride across the warp, each touching 32 sectors in part (L2
    throughput 79% vs DRAM 33% for bf16 [4096²], Nsight Compute); staged, each store
    instruction writes 256 consecutive bytes. One padding slot per 16 indices keeps the
    staging free of bank conflicts (8-byte accesses, both orders). Staging pays for
    2-byte elements only; f32 (2 per lane, 16-byte stride) is slower staged, so 4-byte
    elements store directly (docs/design/scan.md)."""
    acc = fmt.acc
    per_word = fmt.per_word
    per_lane = words * per_word
    tile = 32 * per_lane
    stage_indices = per_word == 4
    warp_slots = tile + tile // 16
    stage_slots = (FAST_ROWS_BLOCK // 32) * warp_slots if stage_indices else 1
    zero, one, _, _ = _constants(acc)
    identity, combine = _indexed_ops(acc)
    widen, narrow = fmt.widen, fmt.narrow
    unpack, pack_one, store_word = _word_codecs(fmt)

    @cuda.jit(device=True, inline=True)
    def shfl_pair_up(state, delta):
        return (shfl_up(state[0], delta), shfl_up(state[1], delta))

    @cuda.jit(device=True, inline=True)
    def warp_total(state, lane, code):
        delta = 1
        while delta < 32:
            other = (shfl_down(state[0], delta), shfl_down(state[1], delta))
            if lane + delta < 32:
                state = combine(state, other, code)
            delta *= 2
        return (shfl_idx(state[0], 0), shfl_idx(state[1], 0))

    def scan_rows_indexed(x, xw, yw, y, out_idx, ws_a, ws_b, lines, extent, x_pitch,
                          y_pitch, i_pitch, seg_len, nseg, phase, reverse, vec, write_index,
                          code):
        vals = cuda.local.array(per_lane, acc)
        idxs = cuda.local.array(per_lane, int64)
        stage = cuda.shared.array(stage_slots, int64)
        lane = int64(cuda.threadIdx.x % 32)
        warps = int64(cuda.blockDim.x // 32)
        item = int64(cuda.blockIdx.x) * warps + int64(cuda.threadIdx.x // 32)
        step = int64(cuda.gridDim.x) * warps
        slice_at = int64(cuda.threadIdx.x // 32) * warp_slots
        extent_words = extent // per_word
        flags = code >= CODE_CUMMAX_RECORD_FLAG
        while item < lines * nseg:
            line = item // nseg
            seg = item - line * nseg
            xb = line * x_pitch
            yb = line * y_pitch
            ib = line * i_pitch
            s_begin = seg * seg_len
            s_end = min(extent, s_begin + seg_len)
            carry = identity(code)
            if phase == 2:
                # combine(ws[first], ..., ws[first + seg - 1]) in order, on every lane
                first = line * nseg
                per = (seg + 31) // 32
                lo = min(seg, lane * per)
                hi = min(seg, lo + per)
                part = identity(code)
                for g in range(lo, hi):
                    part = combine(part, (ws_a[uint64(first + g)], ws_b[uint64(first + g)]),
                                   code)
                carry = warp_total(part, lane, code)
            base = s_begin
            while base < s_end:
                full = vec and base + tile <= s_end
                for k in range(words):
                    sw = base // per_word + k * 32 + lane
                    w = uint64(0)
                    if full:
                        if reverse:
                            w = xw[uint64(xb // per_word + extent_words - 1 - sw)]
                        else:
                            w = xw[uint64(xb // per_word + sw)]
                    for j in range(per_word):
                        s = sw * per_word + j
                        pos = extent - 1 - s if reverse else s
                        v = identity(code)[0]
                        p = int64(-1)
                        if full:
                            v = unpack(w, per_word - 1 - j if reverse else j)
                            p = pos
                        elif s < s_end:
                            v = widen(x[uint64(xb + pos)])
                            p = pos
                        vals[k * per_word + j] = v
                        idxs[k * per_word + j] = p
                for k in range(words):
                    run = (vals[k * per_word], idxs[k * per_word])
                    for j in range(1, per_word):
                        run = combine(run, (vals[k * per_word + j], idxs[k * per_word + j]),
                                      code)
                        vals[k * per_word + j] = run[0]
                        idxs[k * per_word + j] = run[1]
                    if phase == 1:
                        carry = combine(carry, warp_total(run, lane, code), code)
                    else:
                        inc = run
                        delta = 1
                        while delta < 32:
                            other = shfl_pair_up(inc, delta)
                            if lane >= delta:
                                inc = combine(other, inc, code)
                            delta *= 2
                        excl = shfl_pair_up(inc, 1)
                        prefix = carry
                        if lane > 0:
                            prefix = combine(carry, excl, code)
                        for j in range(per_word):
                            state = combine(prefix, (vals[k * per_word + j],
                                                     idxs[k * per_word + j]), code)
                            value = state[0]
                            if flags:
                                s = (base // per_word + k * 32 + lane) * per_word + j
                                pos = extent - 1 - s if reverse else s
                                value = one if state[1] == pos else zero
                            vals[k * per_word + j] = value
                            idxs[k * per_word + j] = state[1]
                        carry = combine(carry, (shfl_idx(inc[0], 31), shfl_idx(inc[1], 31)),
                                        code)
                if phase != 1:
                    staged = stage_indices and full and write_index
                    for k in range(words):
                        sw = base // per_word + k * 32 + lane
                        if full:
                            w = uint64(0)
                            for j in range(per_word):
                                w |= pack_one(vals[k * per_word + j],
                                              per_word - 1 - j if reverse else j)
                            if reverse:
                                store_word(yw, y, yb // per_word + extent_words - 1 - sw, w)
                            else:
                                store_word(yw, y, yb // per_word + sw, w)
                        for j in range(per_word):
                            s = sw * per_word + j
                            if staged:
                                # offset in the tile's span of memory (ascending positions)
                                at = (k * 32 + lane) * per_word + j
                                if reverse:
                                    at = tile - 1 - at
                                stage[slice_at + at + at // 16] = idxs[k * per_word + j]
                            elif s < s_end:
                                pos = extent - 1 - s if reverse else s
                                if not full:
                                    y[uint64(yb + pos)] = narrow(vals[k * per_word + j])
                                if write_index:
                                    out_idx[uint64(ib + pos)] = idxs[k * per_word + j]
                    if staged:
                        _warp_barrier()
                        first = extent - base - tile if reverse else base
                        for m in range(per_lane):
                            at = m * 32 + lane
                            out_idx[uint64(ib + first + at)] = stage[slice_at + at + at // 16]
                        _warp_barrier()  # the slice is rewritten by the next tile
                base += tile
            if phase == 1 and lane == 0:
                ws_a[uint64(item)] = carry[0]
                ws_b[uint64(item)] = carry[1]
            item += step

    scan_rows_indexed.__qualname__ = f"scan_rows_indexed_{fmt.element.name}_{words}"
    return scan_rows_indexed


class IndexedKernels:
    """rows_fast with the winner's position: Cummax/Cummin with indices and the record
    flags of their backward, at one element kind."""

    def __init__(self, element: ElementKind, words: int = _INDEXED_WORDS,
                 register: bool = True, max_registers: int | None = None) -> None:
        fmt = FastFormat(element, "extremum")
        self.per_word = fmt.per_word
        self.tile = 32 * words * fmt.per_word
        arrays = (_c_flat(fmt.storage), _c_flat(uint64), _c_flat(uint64),
                  _c_flat(fmt.storage), _c_flat(int64), _c_flat(fmt.acc), _c_flat(int64))
        self.rows = Kernel(f"scan_rows_indexed[{element.name},{words}]",
                           _make_rows_indexed(fmt, words),
                           arrays + (int64,) * 8 + (boolean, boolean, boolean, int64),
                           register=register, max_registers=_cap(fmt, max_registers, 4))


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
    zero, one, _, _ = _constants(acc)
    identity, combine, widen, narrow = fmt.identity, fmt.combine, fmt.widen, fmt.narrow
    beats, seg_combine = _extremum_backward_ops(acc)
    unpack, pack_one, store_word = _word_codecs(fmt)
    warp_total, segments_prefix = _make_warp_helpers(fmt)

    def scan_rows_extremum_backward(x, xw, dy, dyw, dxw, dx, ws_x, ws_h, ws_t, ws_p, lines,
                                    extent, x_pitch, dy_pitch, dx_pitch, seg_len, nseg,
                                    phase, reverse, vec, code):
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
                for k in range(words):
                    sw = base // per_word + (lane * words + k if blocked else k * 32 + lane)
                    if full:
                        at = xb // per_word + (extent_words - 1 - sw if reverse else sw)
                        w = xw[uint64(at)]
                        for j in range(per_word):
                            xv[k * per_word + j] = unpack(w, per_word - 1 - j if reverse
                                                          else j)
                        if phase != 1:
                            at = gb // per_word + (extent_words - 1 - sw if reverse else sw)
                            w = dyw[uint64(at)]
                            for j in range(per_word):
                                gv[k * per_word + j] = unpack(w, per_word - 1 - j if reverse
                                                              else j)
                    else:
                        for j in range(per_word):
                            s = sw * per_word + j
                            v = identity(code)
                            g = zero
                            if s < s_end:
                                pos = extent - 1 - s if reverse else s
                                v = widen(x[uint64(xb + pos)])
                                if phase != 1:
                                    g = widen(dy[uint64(gb + pos)])
                            xv[k * per_word + j] = v
                            gv[k * per_word + j] = g
                if phase == 1:
                    # runs in scan order (not commutative on signed zeros, NaN payloads)
                    for r in range(groups):
                        agg = xv[r * run_len]
                        for i in range(1, run_len):
                            agg = combine(agg, xv[r * run_len + i], code)
                        carry = combine(carry, warp_total(agg, lane, code), code)
                else:
                    # record flags: the running winner value before each element
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
                    # reversed segmented sum of dy, 0 entering the tile's end
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
                                dx[uint64(ob + pos)] = narrow(open_sum)
                        else:
                            head = open_sum
                        open_s = tile_last
                        open_sum = tile_last_value
                    for k in range(words):
                        sw = base // per_word + (lane * words + k if blocked else k * 32 + lane)
                        if full:
                            w = uint64(0)
                            for j in range(per_word):
                                w |= pack_one(gv[k * per_word + j],
                                              per_word - 1 - j if reverse else j)
                            at = ob // per_word + (extent_words - 1 - sw if reverse else sw)
                            store_word(dxw, dx, at, w)
                        else:
                            for j in range(per_word):
                                s = sw * per_word + j
                                if s < s_end:
                                    pos = extent - 1 - s if reverse else s
                                    dx[uint64(ob + pos)] = narrow(gv[k * per_word + j])
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
                dx[uint64(ob + pos)] = narrow(open_sum)
            item += step

    layout = "blocked" if blocked else "striped"
    scan_rows_extremum_backward.__qualname__ = \
        f"scan_rows_extremum_backward_{fmt.element.name}_{words}_{layout}"
    return scan_rows_extremum_backward


def _make_cols_extremum_backward(fmt: FastFormat, rows: int, chunks_max: int):
    """Fused Cummax/Cummin backward along an outer axis (cols_fast's blocks: 32 lanes of
    V columns x ``chunks`` rows of threads, ``rows`` rows per thread per tile). Per tile
    two exchanges through shared memory: the chunks' x aggregates (the running winner
    before each chunk), then per chunk its head sum, its last record (row within the
    tile, -1: none) and that record's sum up to the chunk's end."""
    acc = fmt.acc
    per_word = fmt.per_word
    width = 32 * per_word
    zero, one, _, _ = _constants(acc)
    identity, combine, widen, narrow = fmt.identity, fmt.combine, fmt.widen, fmt.narrow
    beats, _ = _extremum_backward_ops(acc)
    unpack, pack_one, store_word = _word_codecs(fmt)
    part_slots = chunks_max * width
    part_x_slots = 2 * part_slots
    values = rows * per_word

    def scan_cols_extremum_backward(x, xw, dy, dyw, dxw, dx, ws_x, ws_h, ws_t, ws_p, outer,
                                    extent, inner, x_outer, x_step, dy_outer, dy_step,
                                    dx_outer, dx_step, seg_len, nseg, phase, reverse, vec,
                                    code):
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
        lane = int64(cuda.threadIdx.x)
        chunk = int64(cuda.threadIdx.y)
        chunks = int64(cuda.blockDim.y)
        tile_rows = chunks * rows
        groups = (inner + width - 1) // width
        lines = outer * inner
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
                for r in range(rows):
                    s = r0 + r
                    pos = extent - 1 - s if reverse else s
                    if wide and s < s_end:
                        w = xw[uint64((xb + pos * x_step) // per_word)]
                        for j in range(per_word):
                            xv[r * per_word + j] = unpack(w, j)
                        if phase != 1:
                            w = dyw[uint64((gb + pos * dy_step) // per_word)]
                            for j in range(per_word):
                                gv[r * per_word + j] = unpack(w, j)
                    else:
                        for j in range(per_word):
                            v = identity(code)
                            g = zero
                            if s < s_end and j < ncols:
                                v = widen(x[uint64(xb + pos * x_step + j)])
                                if phase != 1:
                                    g = widen(dy[uint64(gb + pos * dy_step + j)])
                            xv[r * per_word + j] = v
                            gv[r * per_word + j] = g
                # chunk x aggregates -> the running winner before each chunk
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
                parity = 1 - parity
                if phase != 1:
                    # record flags, then the chunk's reversed segmented sum (0 entering
                    # the chunk's end)
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
                    slot = chunk * width + lane
                    for j in range(per_word):
                        part_b[slot + j * 32] = q[j]
                        part_l[slot + j * 32] = last_v[j]
                        part_r[slot + j * 32] = last_r[j]
                    cuda.syncthreads()
                    # right to left over the chunks: what enters each chunk's end, the
                    # tile's head and its last record with that record's sum
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
                    for j in range(per_word):
                        open_sum[j] = acc(open_sum[j] + q[j])
                        if tile_r[j] >= 0:
                            if open_s[j] >= 0:
                                # the open record's run ends here (its element was stored
                                # by an earlier tile: ordered by the barriers since)
                                if chunk == 0 and j < ncols:
                                    pos = extent - 1 - open_s[j] if reverse else open_s[j]
                                    dx[uint64(ob + pos * dx_step + j)] = narrow(open_sum[j])
                            else:
                                head[j] = open_sum[j]
                            open_s[j] = base + tile_r[j]
                            open_sum[j] = tile_v[j]
                    for r in range(rows):
                        s = r0 + r
                        pos = extent - 1 - s if reverse else s
                        if wide and s < s_end:
                            w = uint64(0)
                            for j in range(per_word):
                                w |= pack_one(gv[r * per_word + j], j)
                            store_word(dxw, dx, (ob + pos * dx_step) // per_word, w)
                        elif s < s_end:
                            for j in range(per_word):
                                if j < ncols:
                                    dx[uint64(ob + pos * dx_step + j)] = narrow(
                                        gv[r * per_word + j])
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
                            dx[uint64(ob + pos * dx_step + j)] = narrow(open_sum[j])
            item += cuda.gridDim.x

    scan_cols_extremum_backward.__qualname__ = \
        f"scan_cols_extremum_backward_{fmt.element.name}_{rows}"
    return scan_cols_extremum_backward


def _make_extremum_backward_fixup(fmt: FastFormat):
    """Phase 3 of a split, one thread per (line, segment): for a segment with a record,
    the sum of its last record's run: its partial sum plus the heads of the following
    segments up to and including the first one with a record (in segment order:
    deterministic)."""
    narrow = fmt.narrow

    def scan_extremum_backward_fixup(dx, ws_h, ws_t, ws_p, lines, nseg, line_stride,
                                     seg_stride, inner, dx_outer, dx_step, extent, reverse):
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
                dx[uint64(o * dx_outer + (line - o * inner) + pos * dx_step)] = narrow(total)
            entry += int64(cuda.gridDim.x) * cuda.blockDim.x

    scan_extremum_backward_fixup.__qualname__ = \
        f"scan_extremum_backward_fixup_{fmt.element.name}"
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
        tag = element.name
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
                             _c_flat(int64)) + (int64,) * 8 + (boolean,),
                            register=register, grid_stride=True)


# -- the table ----------------------------------------------------------------------------

_TUPLE8 = types.UniTuple(int64, 8)

#: Forward kinds -> element kinds they support.
SCAN_FORWARD_ELEMENTS = {
    ScanKind.CUMSUM: FLOAT_ELEMENTS + INT_ELEMENTS,
    ScanKind.CUMPROD: FLOAT_ELEMENTS + INT_ELEMENTS,
    ScanKind.CUMMAX: FLOAT_ELEMENTS + INT_ELEMENTS,
    ScanKind.CUMMIN: FLOAT_ELEMENTS + INT_ELEMENTS,
    ScanKind.LOG_CUMSUM_EXP: FLOAT_ELEMENTS,
}
#: Backward kinds -> element kinds (gradients are floating point).
SCAN_BACKWARD_ELEMENTS = {kind: FLOAT_ELEMENTS for kind in ScanKind}


class ScanKernels:
    """The rows and lines kernels of one direction at one element kind."""

    def __init__(self, backward: bool, element: ElementKind) -> None:
        name = "scan_backward" if backward else "scan"
        op = ScanOp(name, element, backward)
        self.op = op
        common = (flat(op.storage), flat(op.storage), flat(op.storage), flat(op.storage),
                  flat(int64), flat(op.acc), flat(op.aux), int64, int64, int64, int64, int64,
                  _TUPLE8, _TUPLE8, _TUPLE8, _TUPLE8, _TUPLE8, _TUPLE8, int64, int64, int64,
                  int64, int64, boolean, boolean, int64)
        self.rows = Kernel(f"{name}_rows[{element.name}]", _make_rows(op), common)
        self.lines = Kernel(f"{name}_lines[{element.name}]", _make_lines(op),
                            common + (int64,))
        self.items = op.items
        self.state_bytes = (op.acc.bitwidth + op.aux.bitwidth) // 8
        self.acc_bytes = op.acc.bitwidth // 8


#: (backward?, element kind) -> kernels; forward at every element kind any kind supports.
SCAN_KERNELS: dict[tuple[bool, ElementKind], ScanKernels] = {
    (False, e): ScanKernels(False, e) for e in FLOAT_ELEMENTS + INT_ELEMENTS
} | {(True, e): ScanKernels(True, e) for e in FLOAT_ELEMENTS}

#: (family, element kind) -> fast kernels (forward, scalar-state kinds, uniform pitch).
FAST_KERNELS: dict[tuple[str, ElementKind], FastKernels] = {
    (family, e): FastKernels(e, family) for family, elements in FAST_ELEMENTS.items()
    for e in elements
}
#: element kind -> the indexed rows kernel (Cummax/Cummin with indices, record flags).
INDEXED_KERNELS: dict[ElementKind, IndexedKernels] = {
    e: IndexedKernels(e) for e in FLOAT_ELEMENTS + INT_ELEMENTS
}
#: element kind -> the fused Cummax/Cummin backward (uniform-pitch layouts).
EXTREMUM_BACKWARD_KERNELS: dict[ElementKind, ExtremumBackwardKernels] = {
    e: ExtremumBackwardKernels(e) for e in SCAN_BACKWARD_ELEMENTS[ScanKind.CUMMAX]
}
