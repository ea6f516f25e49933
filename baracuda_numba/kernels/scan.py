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
*record* is a position where the running winner changes under the first-occurrence rule;
its 0/1 flag is written to ``dx`` by a forward pre-pass (``*_first_flag`` kinds), which the
backward kernel then reads and overwrites position by position. Cumsum backward is the
forward Cumsum of ``dy`` with the direction flipped.

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
"""

from __future__ import annotations

import math

import numpy as np
from numba import boolean, cuda, float32, float64, int32, int64, types, uint16
from numba.types import float16

from .._runtime import SIMULATOR
from ..launch import Kernel, flat
from ..types import ElementKind, ScanKind
from .common import MAX_RANK, bf16_to_f32, f32_to_bf16, shfl_up

# Threads per block of the rows kernel and elements per thread per tile. Simulator: one
# Python thread per CUDA thread, so 2 warps of 2 items (still exercises every code path).
ROWS_BLOCK = 64 if SIMULATOR else 256
_ITEMS_4B = 2 if SIMULATOR else 8  # 4-byte accumulators: 256 x 8 = 2048-element tiles
_ITEMS_8B = 2 if SIMULATOR else 4  # 8-byte accumulators: 8 KB/16 KB of smem per tile
_UNROLL = 4  # lines kernel: loads in flight per thread per step

# -- storage <-> accumulator -----------------------------------------------------------


@cuda.jit(device=True, inline=True)
def _f16_widen(v):
    return float32(v)


@cuda.jit(device=True, inline=True)
def _f16_narrow(v):
    return float16(v)


@cuda.jit(device=True, inline=True)
def _f32_same(v):
    return float32(v)


@cuda.jit(device=True, inline=True)
def _f64_same(v):
    return float64(v)


@cuda.jit(device=True, inline=True)
def _i32_same(v):
    return int32(v)


@cuda.jit(device=True, inline=True)
def _i64_same(v):
    return int64(v)


#: element kind -> (storage type, accumulator type, widen, narrow). Halves accumulate in f32.
SCAN_STORAGE = {
    ElementKind.F16: (float16, float32, _f16_widen, _f16_narrow),
    ElementKind.BF16: (uint16, float32, bf16_to_f32, f32_to_bf16),
    ElementKind.F32: (float32, float32, _f32_same, _f32_same),
    ElementKind.F64: (float64, float64, _f64_same, _f64_same),
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
CODE_CUMMAX_FIRST_FLAG = 5
CODE_CUMMIN_FIRST_FLAG = 6
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


def _forward_ops(acc: types.Type):
    """Forward kinds; state (value, index). Cummax/Cummin: NaN dominates; ties go to the
    later index (torch.cummax), or for the first-flag pre-passes to the earlier one, whose
    ``emit`` writes 1 where the element is the running winner (a record) and 0 elsewhere.
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
        if code == CODE_CUMMAX or code == CODE_CUMMAX_FIRST_FLAG or \
                code == CODE_LOG_CUMSUM_EXP:
            return (lowest, no_index)
        return (highest, no_index)

    @cuda.jit(device=True, inline=True)
    def lift(v0, v1, v2, v2n, has_next, pos, code):
        return (v0, int64(pos))

    @cuda.jit(device=True, inline=True)
    def logaddexp(x, y):
        if x != x or y != y:
            return acc(x + y)
        hi = x if x >= y else y
        lo = y if x >= y else x
        if lo == lowest or hi == highest:
            return hi
        return acc(hi + math.log1p(math.exp(lo - hi)))

    @cuda.jit(device=True, inline=True)
    def combine(a, b, code):
        if code == CODE_CUMSUM:
            return (acc(a[0] + b[0]), b[1])
        if code == CODE_CUMPROD:
            return (acc(a[0] * b[0]), b[1])
        if code == CODE_LOG_CUMSUM_EXP:
            return (logaddexp(a[0], b[0]), b[1])
        if code >= CODE_CUMMAX_FIRST_FLAG:
            if a[1] < 0:  # the identity: the first element is always a record
                return b
            if a[0] != a[0]:  # the first NaN stays the winner
                return a
            if b[0] != b[0]:
                return b
            if code == CODE_CUMMAX_FIRST_FLAG:
                return b if b[0] > a[0] else a
            return b if b[0] < a[0] else a
        if b[0] != b[0]:  # a later NaN wins (torch: the index of the last NaN)
            return b
        if a[0] != a[0]:
            return a
        if code == CODE_CUMMAX:
            return b if b[0] >= a[0] else a
        return b if b[0] <= a[0] else a

    @cuda.jit(device=True, inline=True)
    def emit(excl, incl, v0, v1, v2, v2n, has_next, pos, code):
        if code >= CODE_CUMMAX_FIRST_FLAG:
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
