"""Softmax and log-softmax along one axis, forward and backward.

Forward, with ``x' = scale * x`` along the axis of length ``n`` ("a row")::

    m = max_j x'_j           s = sum_j exp(x'_j - m)
    softmax:     y_i = exp(x'_i - m) / s
    log_softmax: y_i = (x'_i - m) - log s

Backward, from the saved output ``y`` (probabilities, or log-probabilities)::

    softmax:     dx_i = scale * y_i * (dy_i - sum_j dy_j y_j)
    log_softmax: dx_i = scale * (dy_i - exp(y_i) * sum_j dy_j)

The max propagates NaN (one ``max.NaN``), and NaN / +inf enter the sum, so a row with a NaN
or a +inf, and a row of all -inf (``-inf - -inf``), comes out NaN everywhere, as torch's.
f16 / bf16 / f32 accumulate in f32, f64 in f64.

Three kernel bodies, ``backward`` a compile-time argument of each factory (the forward
passes ``x`` as both inputs ``a`` and ``b``; the backward ``dy`` and ``y``)::

    rows_registers  (aligned rows of stride 1, a whole number of 16-byte units, at most
            MAX_REGISTER_UNITS): a group of L lanes (a power of two) a row, lane l holding
            the raw units l, l + L, ... (at most UNITS) in registers. One online (m, s)
            pair a lane, combined by warp shuffles, plus one shared-memory exchange
            across warps when L > 32 (then the block is one row)::

                block of 256 = 8 rows x 32 lanes      block of L = 1 row (L = 64..1024)
                load -> (m, s) -> xor butterfly -> [warp pairs in shared, 1 barrier]
                     -> y = exp(x' - m) / s from the held units -> 16-byte stores

    rows_stream  (the same rows, longer): a block of STREAM_THREADS per row part; pass 1
            folds UNITS units a thread at a time into a running (m, s), one block
            exchange, pass 2 reads the part again last unit first (the lines most
            recently read, so likeliest in L2) and writes it.
    rows    (any other layout, elements): a group of L lanes holds HELD elements a lane
            of a row part (separate max and sum reductions).
    columns (the axis strided, another axis contiguous): consecutive threads take
            consecutive rows (coalesced) and walk their part of the axis with an online
            max-and-sum (COLUMN_UNROLL loads in flight), then read it again to write.

Combining ``(m1, s1)`` and ``(m2, s2)`` gives ``m = max(m1, m2)``, ``s = s1 exp(m1 - m) +
s2 exp(m2 - m)`` (a side with ``m = -inf`` adds 0), in a fixed tree order.

A row too long for one launch's part (above ``STREAM_PART`` elements for the unit
kernels, a group's registers for the element kernel) or a column cut for parallelism is
split into ``parts`` fixed by the problem alone. ``mode`` says what one launch does:

    0  FULL    one part per row: reduce, then write out
    1  STATS   write each part's statistic (m, s) / (sum) to the workspace
    2  FINISH  fold the row's part statistics in part order, then write out its part
    3  MERGE   (columns) fold each row's part statistics into its first slot, which
               FINISH then reads: O(parts) per row instead of O(parts^2)

so results are deterministic and the same whatever the grid. The plan issues STATS then
FINISH on batches of rows whose bytes fit in L2, so FINISH reads its input from L2.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from numba import cuda, float32, float64, int64, types, uint16, uint32, uint64

from .._runtime import SIMULATOR
from ..launch import Kernel, LazyTable, flat
from ..types import ElementKind
from .common import (
    bitcast,
    div_mod,
    load16,
    load_bf16,
    load_f16,
    load_same,
    max_nan_f32,
    nan_max,
    shfl_xor,
    store16,
    store_bf16,
    strided_offset,
    strided_offset2,
    to_f16,
    to_f32,
    to_f64,
)
from .rope import ROPE_UNIT_TABLE

if SIMULATOR:

    @cuda.jit(device=True)
    def fast_exp_f32(value):
        """e^value in f32 (the simulator's stand-in for ``ex2.approx.ftz``)."""
        return np.float32(np.exp(np.float32(value)))

else:
    from numba.cuda import libdevice as _libdevice

    @cuda.jit(device=True, inline=True)
    def fast_exp_f32(value):
        """e^value as ``ex2.approx.ftz(value * log2 e)`` (libdevice ``fast_expf``): one
        multiply and one MUFU.EX2 where ``expf`` takes ~8 instructions; relative error ~2
        ulp + |value| 2^-23, results below 2^-126 flush to 0. For values rounded to 16
        bits afterwards, where that error is far below the rounding."""
        return _libdevice.fast_expf(float32(value))

#: Elements a lane holds in registers, by direction (``backward``): 16 x (forward) or 8
#: dy and 8 y (backward) registers fit, with the addressing and the reductions, under the
#: 64-register cap that 1024-thread blocks need (``ROW_REGISTERS``) without spilling
#: (twice as many spill: see docs/design/softmax.md). f64 holds half as many (two
#: registers each): :func:`row_held`.
HELD = {False: 16, True: 8}
#: Lanes of the largest group: one 1024-thread block (the CUDA limit).
MAX_LANES = 1024
#: Elements of the longest row part one group holds, by direction (f32 accumulation).
MAX_PART = {backward: held * MAX_LANES for backward, held in HELD.items()}
#: 16-byte units a lane of the unit row kernels holds per input, by direction: the raw
#: words, unpacked on each use (16-bit elements take half a register each). 4 units (64
#: bytes) forward, 2 + 2 backward: 16 words of data under the 64-register cap, and 64 KB in
#: flight an SM at 1024 resident threads.
UNITS = {False: 4, True: 2}
#: Units of the longest row the register kernel holds (one 1024-lane block), by direction
#: (f32 accumulation; f64: :func:`row_units`).
MAX_REGISTER_UNITS = {backward: units * 1024 for backward, units in UNITS.items()}
#: Threads of a ``rows_stream`` block (one row part a block): two blocks an SM at the
#: 64-register cap, so one block's loads overlap the other's reduction barrier (the
#: simulator: two warps, which still cross the shared-memory exchange).
STREAM_THREADS = 64 if SIMULATOR else 512
#: Longest row part of ``rows_stream`` (elements): rows up to this length are one part (one
#: launch); longer rows split into parts of at most this (STATS + FINISH), so a few rows
#: still fill the GPU.
STREAM_PART = 1 << 20
#: Row parts ``rows_stream`` aims for when rows are few: rows are cut into parts (of at
#: least one chunk, ``STREAM_THREADS * UNITS`` units) until there are about this many,
#: two blocks an SM of a large GPU; fixed so results do not depend on the device.
STREAM_ITEMS = 256
#: Register cap of the row kernels: 65536 registers / 1024 threads.
ROW_REGISTERS = 64
#: Rows a column thread loads before folding them (loads in flight per thread): 8 keep
#: the forward under 64 registers; 16 need twice the registers for no more bytes in
#: flight an SM.
COLUMN_UNROLL = 8


def row_held(element: ElementKind, backward: bool) -> int:
    """Elements a lane of the row kernel holds for ``element`` and direction."""
    return HELD[backward] // (2 if element is ElementKind.F64 else 1)


def row_units(element: ElementKind, backward: bool) -> int:
    """16-byte units per input a lane of the unit row kernels holds: ``UNITS``, and one
    for f64 (whose values and exponentials take twice the registers: two units spill)."""
    return 1 if element is ElementKind.F64 else UNITS[backward]


MODE_FULL = 0
MODE_STATS = 1
MODE_FINISH = 2
MODE_MERGE = 3

_INF = float("inf")
_TUPLE8 = types.UniTuple(int64, 8)


@cuda.jit(device=True, inline=True)
def _exp(value):
    return math.exp(value)


@dataclass(frozen=True)
class SoftmaxElement:
    """How one element kind is stored, loaded, accumulated and maxed."""

    storage: types.Type
    acc: types.Type
    load: Any
    store: Any
    max: Any
    #: e^x of the per-element terms: ``fast_exp_f32`` where the output is rounded to 16
    #: bits (issue-bound otherwise: two exponentials an element), else libdevice's.
    exp: Any


#: The element table: every kernel, signature and supported-dtype message derives from it.
SOFTMAX_ELEMENTS: dict[ElementKind, SoftmaxElement] = {
    ElementKind.F16: SoftmaxElement(types.float16, float32, load_f16, to_f16, max_nan_f32,
                                    fast_exp_f32),
    ElementKind.BF16: SoftmaxElement(uint16, float32, load_bf16, store_bf16, max_nan_f32,
                                     fast_exp_f32),
    ElementKind.F32: SoftmaxElement(float32, float32, load_same, to_f32, max_nan_f32,
                                    _exp),
    ElementKind.F64: SoftmaxElement(float64, float64, load_same, to_f64, nan_max, _exp),
}


@cuda.jit(device=True, inline=True)
def _unpack16_f64(unit):
    low = uint64(unit[0]) | (uint64(unit[1]) << uint64(32))
    high = uint64(unit[2]) | (uint64(unit[3]) << uint64(32))
    return bitcast(low, float64), bitcast(high, float64)


@cuda.jit(device=True, inline=True)
def _pack16_f64(values):
    low = bitcast(float64(values[0]), uint64)
    high = bitcast(float64(values[1]), uint64)
    return (uint32(low & uint64(0xFFFFFFFF)), uint32(low >> uint64(32)),
            uint32(high & uint64(0xFFFFFFFF)), uint32(high >> uint64(32)))


#: element kind -> (unpack, pack, elements per 16-byte unit) of the unit row kernels.
SOFTMAX_UNITS = {**ROPE_UNIT_TABLE, ElementKind.F64: (_unpack16_f64, _pack16_f64, 2)}


# -- shared pieces --------------------------------------------------------------------------


def _group_reducer(combine: Any) -> Any:
    """``reduce(value, lanes, shared)``: ``combine`` of ``value`` over the ``lanes`` lanes
    of the caller's group (a power of two; groups of more than 32 lanes are whole warps
    of one block, combined through ``shared``, 32 slots). Every lane gets the same bits
    (an xor butterfly, then every lane folds the warps in order). Block-uniform: every
    thread of the block calls it together."""

    @cuda.jit(device=True, inline=True)
    def reduce(value, lanes, shared):
        width = lanes if lanes < 32 else 32
        offset = width >> 1
        while offset > 0:
            value = combine(value, shfl_xor(value, offset))
            offset >>= 1
        if lanes > 32:
            tid = cuda.threadIdx.x
            cuda.syncthreads()  # the previous use of ``shared`` is over
            if tid % 32 == 0:
                shared[tid // 32] = value
            cuda.syncthreads()
            first = (tid // lanes) * (lanes // 32)
            value = shared[first]
            for w in range(1, lanes // 32):
                value = combine(value, shared[first + w])
        return value

    return reduce


@cuda.jit(device=True, inline=True)
def _add(a, b):
    return a + b


def _fold_parts(acc: types.Type, maximum: Any, backward: bool) -> Any:
    """``fold(ws, row, parts) -> (m, s)``: the row's part statistics folded in part order
    (forward: ``M = max m_p``, ``S = sum s_p exp(m_p - M)``; backward: the plain sum)."""

    @cuda.jit(device=True, inline=True)
    def fold(ws, row, parts):
        base = row * parts * 2
        if backward:
            total = acc(0)
            for p in range(parts):
                total += ws[base + 2 * p]
            return acc(0), total
        m = acc(-_INF)
        for p in range(parts):
            m = maximum(m, ws[base + 2 * p])
        s = acc(0)
        for p in range(parts):
            mp = ws[base + 2 * p]
            if mp != acc(-_INF):  # an all -inf part adds nothing (its s is 0)
                s += ws[base + 2 * p + 1] * math.exp(mp - m)
        return m, s

    return fold


def _finisher(element: ElementKind, backward: bool) -> Any:
    """``(factor, finish)``: ``factor(s, log)`` once per row (forward: ``1 / s``, or ``log
    s`` for log-softmax; backward: ``s``), then ``finish(va, vb, m, r, log, scale)``, the
    output element from the held inputs (forward: ``va`` = scaled x; backward: ``va`` =
    dy, ``vb`` = y), the row max ``m`` and the factor ``r``."""
    acc, exp = SOFTMAX_ELEMENTS[element].acc, SOFTMAX_ELEMENTS[element].exp

    @cuda.jit(device=True, inline=True)
    def factor(s, log):
        if backward:
            return s
        if not log:
            return acc(1) / s
        if s > acc(0):
            return math.log(s)
        return acc(-_INF) if s == acc(0) else s  # log 0, log NaN

    @cuda.jit(device=True, inline=True)
    def finish(va, vb, m, r, log, scale):
        if backward:
            if log:
                return scale * (va - exp(vb) * r)
            return scale * vb * (va - r)
        if log:
            return (va - m) - r
        return exp(va - m) * r

    return factor, finish


# -- rows -------------------------------------------------------------------------------------


def _elem_pieces(element: ElementKind, backward: bool) -> Any:
    """Device helpers of the element row path (any axis stride), which holds ``held``
    accumulator values a lane (padding: -inf forward, 0 backward, which add nothing):
    ``(load, local_max, local_sum, write)``."""
    spec = SOFTMAX_ELEMENTS[element]
    acc, load_one, store, maximum, exp = spec.acc, spec.load, spec.store, spec.max, spec.exp
    held = row_held(element, backward)
    pad = acc(0) if backward else acc(-_INF)
    _, finish = _finisher(element, backward)

    @cuda.jit(device=True, inline=True)
    def load(held_a, held_b, a, b, a0, b0, a_step, b_step, valid, scale):
        for u in range(held):
            va = pad
            vb = acc(0)
            if u < valid:
                va = load_one(a, a0 + u * a_step)
                if backward:
                    vb = load_one(b, b0 + u * b_step)
                else:
                    va *= scale
            held_a[u] = va
            held_b[u] = vb

    @cuda.jit(device=True, inline=True)
    def local_max(held_a, valid, scale):
        m = held_a[0]
        for u in range(1, held):
            m = maximum(m, held_a[u])
        return m

    @cuda.jit(device=True, inline=True)
    def local_sum(held_a, held_b, valid, shift, scale, log):
        s = acc(0)
        for u in range(held):
            if not backward:
                s += exp(held_a[u] - shift)
            elif log:
                s += held_a[u]
            else:
                s += held_a[u] * held_b[u]
        return s

    @cuda.jit(device=True, inline=True)
    def write(held_a, held_b, out, o0, o_step, valid, m, r, log, scale):
        for u in range(held):
            if u < valid:
                out[o0 + u * o_step] = store(finish(held_a[u], held_b[u], m, r, log, scale))

    return load, local_max, local_sum, write


def _part_body(element: ElementKind, backward: bool) -> Any:
    """``body(...)``: load one row part into the caller's holding arrays, reduce it (or
    fold the workspace), write its statistic or its output."""
    spec = SOFTMAX_ELEMENTS[element]
    acc, maximum = spec.acc, spec.max
    group_max = _group_reducer(maximum)
    group_sum = _group_reducer(_add)
    fold = _fold_parts(acc, maximum, backward)
    factor, _ = _finisher(element, backward)
    load, local_max, local_sum, write = _elem_pieces(element, backward)

    @cuda.jit(device=True, inline=True)
    def out_start(row, shape, out_strides, out_axis, start, lane, lanes):
        out_off = strided_offset(row, shape, out_strides)
        return out_off + (start + lane) * out_axis, lanes * out_axis

    @cuda.jit(device=True, inline=True)
    def body(hold_a, hold_b, a, b, out, a0, b0, a_step, b_step, valid, count, active, item,
             row, start, lane, lanes, shape, out_strides, out_axis, ws, parts, shared, mode,
             log, scale):
        # the output address: forward before the loads (the shape and strides are then
        # dead while the row is held), backward after them (fewer registers, by ptxas)
        o0, o_step = int64(0), int64(0)
        if not backward:
            o0, o_step = out_start(row, shape, out_strides, out_axis, start, lane, lanes)
        load(hold_a, hold_b, a, b, a0, b0, a_step, b_step, valid, scale)
        m = acc(0)
        s = acc(0)
        if mode != MODE_FINISH:
            if not backward:
                m = group_max(local_max(hold_a, valid, scale), lanes, shared)
            # an all -inf part (or an idle group) sums against 0 rather than -inf
            shift = m if m != acc(-_INF) else acc(0)
            s = group_sum(local_sum(hold_a, hold_b, valid, shift, scale, log), lanes, shared)
            if not backward and m == acc(-_INF):
                s = acc(0)  # an all -inf part: exp(-inf - -inf) is NaN, its sum is 0
        if mode == MODE_STATS:
            if active and lane == 0:
                ws[item * 2] = s if backward else m
                ws[item * 2 + 1] = s
            return
        if mode == MODE_FINISH and active:
            m, s = fold(ws, row, parts)
        if backward:
            o0, o_step = out_start(row, shape, out_strides, out_axis, start, lane, lanes)
        r = factor(s, log) if count > 0 else acc(0)  # idle groups: no 1 / 0
        write(hold_a, hold_b, out, o0, o_step, valid, m, r, log, scale)

    return body


def _make_rows(element: ElementKind, backward: bool) -> Any:
    """The element row kernel (any layout with the axis of stride 1 or strided without a
    unit-stride neighbour): ``HELD`` accumulator values a lane."""
    acc = SOFTMAX_ELEMENTS[element].acc
    held = row_held(element, backward)
    body = _part_body(element, backward)

    def softmax_rows(a, b, out, ws, row_begin, row_end, n, parts, part_len, lanes, shape,
                     a_strides, b_strides, out_strides, a_axis, b_axis, out_axis, mode, log,
                     scale):
        """Row parts ``[row_begin * parts, row_end * parts)``, one per group of ``lanes``
        lanes; grid-stride over groups of parts (block-uniform trip count)."""
        shared = cuda.shared.array(32, acc)
        tid = cuda.threadIdx.x
        groups = cuda.blockDim.x // lanes
        lane = tid % lanes
        first = row_begin * parts
        last = row_end * parts
        base = first + int64(cuda.blockIdx.x) * groups
        while base < last:
            item = base + tid // lanes
            active = item < last
            row = item // parts
            part = item - row * parts
            start = part * part_len
            count = n - start if n - start < part_len else part_len
            if not active:
                count = 0
            a_off, b_off = strided_offset2(row, shape, a_strides, b_strides)
            # slots this lane holds: every ``lanes``-th element of the part, below
            # ``count``; one number, so no per-slot index stays live
            valid = (count - lane + lanes - 1) // lanes if count > lane else 0
            body(cuda.local.array(held, acc), cuda.local.array(held, acc), a, b, out,
                 a_off + (start + lane) * a_axis, b_off + (start + lane) * b_axis,
                 lanes * a_axis, lanes * b_axis, valid, count, active, item, row, start, lane,
                 lanes, shape, out_strides, out_axis, ws, parts, shared, mode, log, scale)
            base += int64(cuda.gridDim.x) * groups

    return softmax_rows


# -- rows in 16-byte units -------------------------------------------------------------------


def _pair_combine(acc: types.Type, maximum: Any, backward: bool) -> Any:
    """``combine(m1, s1, m2, s2) -> (m, s)``: two partial statistics merged (forward:
    ``m = max``, ``s = s1 exp(m1 - m) + s2 exp(m2 - m)``, a side with ``m = -inf`` (nothing
    yet, or all -inf) adding 0; backward: the sums added): a thread's running
    statistic."""

    @cuda.jit(device=True, inline=True)
    def combine(m1, s1, m2, s2):
        if backward:
            return m1, s1 + s2
        m = maximum(m1, m2)
        f1 = math.exp(m1 - m) if m1 != acc(-_INF) else acc(0)
        f2 = math.exp(m2 - m) if m2 != acc(-_INF) else acc(0)
        return m, s1 * f1 + s2 * f2

    return combine


def _pair_reducer(acc: types.Type, maximum: Any, backward: bool) -> Any:
    """``reduce(m, s, lanes, shared, parity)``: the ``(m, s)`` of a group of ``lanes``
    lanes (a power of two) from each lane's own (``s`` relative to its ``m``). In a warp:
    the max by an xor butterfly, each lane's ``s`` rescaled to it (one exponential), the
    sum by an xor butterfly. Past 32 lanes (the block must be the group) each warp's
    pair goes through ``shared`` (``2 x 2 x 32`` values, one barrier) and every warp
    reduces those the same way. Max and sum are symmetric, so every lane gets the same
    bits in a fixed order. ``parity`` alternates the half of ``shared`` between
    consecutive calls, so no barrier is needed before the writes. Backward: the sums
    alone. Block-uniform: every thread of the block calls it together."""

    @cuda.jit(device=True, inline=True)
    def warp_reduce(m, s, width):
        if not backward:
            offset = width >> 1
            top = m
            while offset > 0:
                top = maximum(top, shfl_xor(top, offset))
                offset >>= 1
            # a lane with nothing (or only -inf) adds 0; NaN and +inf - +inf give NaN
            s = s * math.exp(m - top) if m != acc(-_INF) else acc(0)
            m = top
        offset = width >> 1
        while offset > 0:
            s += shfl_xor(s, offset)
            offset >>= 1
        return m, s

    @cuda.jit(device=True, inline=True)
    def reduce(m, s, lanes, shared, parity):
        m, s = warp_reduce(m, s, lanes if lanes < 32 else 32)
        if lanes <= 32:
            return m, s
        tid = cuda.threadIdx.x
        half = parity * 64
        if tid % 32 == 0:
            shared[half + tid // 32] = m
            shared[half + 32 + tid // 32] = s
        cuda.syncthreads()
        warps = lanes >> 5
        # lane j takes warp j mod warps (a power of two): every group of ``warps`` lanes
        # reduces the same values in the same order
        slot = (tid & 31) & (warps - 1)
        return warp_reduce(shared[half + slot], shared[half + 32 + slot], warps)

    return reduce


def _unit_pieces(element: ElementKind, backward: bool) -> Any:
    """Device helpers of the 16-byte-unit rows, which hold the raw units (uint32 words,
    two 16-bit elements a register) and unpack them on each use; a lane's units are
    ``first + w * step`` (words) for ``w < valid`` (``valid`` may exceed ``UNITS``):
    ``(load, stats, write)``."""
    spec = SOFTMAX_ELEMENTS[element]
    acc, maximum, exp = spec.acc, spec.max, spec.exp
    unpack16, pack16, per_unit = SOFTMAX_UNITS[element]
    units = row_units(element, backward)
    _, finish = _finisher(element, backward)

    @cuda.jit(device=True, inline=True)
    def unit(words, w):
        return unpack16((words[4 * w], words[4 * w + 1], words[4 * w + 2], words[4 * w + 3]))

    @cuda.jit(device=True, inline=True)
    def load(words, array, first, step, valid):
        for w in range(units):
            if w < valid:
                loaded = load16(array, first + w * step)
                for j in range(4):
                    words[4 * w + j] = loaded[j]

    @cuda.jit(device=True, inline=True)
    def stats(words_a, words_b, valid, scale, log):
        """``(m, s)`` of the held units: forward the max of ``x'`` and the sum of
        ``exp(x' - m)`` (0 when ``m = -inf``), backward ``(0, sum dy y)`` or ``(0, sum
        dy)``."""
        m = acc(-_INF)
        s = acc(0)
        if not backward:
            for w in range(units):
                if w < valid:
                    va = unit(words_a, w)
                    for k in range(per_unit):
                        m = maximum(m, acc(va[k]) * scale)
            if m == acc(-_INF):
                return m, s
        for w in range(units):
            if w < valid:
                va = unit(words_a, w)
                vb = unit(words_b, w) if backward else va
                for k in range(per_unit):
                    if not backward:
                        s += exp(acc(va[k]) * scale - m)
                    elif log:
                        s += acc(va[k])
                    else:
                        s += acc(va[k]) * acc(vb[k])
        return m, s

    @cuda.jit(device=True, inline=True)
    def write(words_a, words_b, out, first, step, valid, m, r, log, scale, result):
        for w in range(units):
            if w < valid:
                va = unit(words_a, w)
                vb = unit(words_b, w) if backward else va
                for k in range(per_unit):
                    x = acc(va[k]) if backward else acc(va[k]) * scale
                    result[k] = finish(x, acc(vb[k]), m, r, log, scale)
                store16(out, first + w * step, pack16(result))

    return load, stats, write


def _make_units(element: ElementKind, backward: bool, stream: bool) -> Any:
    """The 16-byte-unit row kernel: ``stream`` (compile time) reads each row part twice
    (``STREAM_THREADS`` threads a part), else holds it in registers (a group of ``lanes``
    lanes a row)."""
    spec = SOFTMAX_ELEMENTS[element]
    acc, maximum = spec.acc, spec.max
    per_unit = SOFTMAX_UNITS[element][2]
    units = row_units(element, backward)
    combine = _pair_combine(acc, maximum, backward)
    reduce = _pair_reducer(acc, maximum, backward)
    fold = _fold_parts(acc, maximum, backward)
    factor, _ = _finisher(element, backward)
    load, stats, write = _unit_pieces(element, backward)
    held_words = 4 * units
    threads = STREAM_THREADS  # a compile-time block size: divisions by it are shifts
    chunk = STREAM_THREADS * units
    b_words = held_words if backward else 1

    def softmax_registers(a, b, out, ws, row_begin, row_end, n_units, parts, part_units,
                          lanes, a_row, b_row, out_row, mode, log, scale):
        """Rows ``[row_begin, row_end)``, one per group of ``lanes`` lanes; lane ``l``
        holds units ``l, l + lanes, ...`` (at most ``UNITS``) of its row. Grid-stride
        over groups of rows (block-uniform trip count); ``a_row``, ``b_row``, ``out_row``:
        row strides in words."""
        shared = cuda.shared.array(128, acc)
        words_a = cuda.local.array(held_words, uint32)
        words_b = cuda.local.array(b_words, uint32)
        result = cuda.local.array(per_unit, acc)
        tid = cuda.threadIdx.x
        groups = cuda.blockDim.x // lanes
        lane = tid % lanes
        group = tid // lanes
        # units this lane holds of a row (n_units <= MAX_REGISTER_UNITS: 32-bit math)
        lane_units = int64(uint32(n_units - lane + lanes - 1) // uint32(lanes))
        base = row_begin + int64(cuda.blockIdx.x) * groups
        parity = 0
        while base < row_end:
            row = base + group
            valid = lane_units if row < row_end else 0
            load(words_a, a, row * a_row + lane * 4, lanes * 4, valid)
            if backward:
                load(words_b, b, row * b_row + lane * 4, lanes * 4, valid)
            m, s = stats(words_a, words_b, valid, scale, log)
            m, s = reduce(m, s, lanes, shared, parity)
            r = factor(s, log) if valid > 0 else acc(0)  # idle lanes: no 1 / 0
            write(words_a, words_b, out, row * out_row + lane * 4, lanes * 4, valid, m, r,
                  log, scale, result)
            base += int64(cuda.gridDim.x) * groups
            parity ^= 1

    def softmax_stream(a, b, out, ws, row_begin, row_end, n_units, parts, part_units, lanes,
                       a_row, b_row, out_row, mode, log, scale):
        """Row parts ``[row_begin * parts, row_end * parts)``, one per block (grid-stride):
        thread ``t`` folds units ``t, t + T, ...`` of the part into a running ``(m, s)``
        (``UNITS`` loads in flight), the block reduces it, then the part is read again
        (last chunk first: the lines most recently read, likeliest in L2) and written.
        ``mode`` as the element kernel (STATS / FINISH for rows cut into parts); the block
        has ``STREAM_THREADS`` threads."""
        shared = cuda.shared.array(128, acc)
        words_a = cuda.local.array(held_words, uint32)
        words_b = cuda.local.array(b_words, uint32)
        result = cuda.local.array(per_unit, acc)
        tid = cuda.threadIdx.x
        item = row_begin * parts + int64(cuda.blockIdx.x)
        parity = 0
        while item < row_end * parts:
            row, part = div_mod(item, parts)
            start = part * part_units
            count = n_units - start if n_units - start < part_units else part_units
            a0 = row * a_row + start * 4
            b0 = row * b_row + start * 4
            m = acc(-_INF)
            s = acc(0)
            if mode != MODE_FINISH:
                j0 = int64(0)
                while j0 < count:
                    valid = (count - j0 - tid + threads - 1) // threads if count - j0 > tid else 0
                    load(words_a, a, a0 + (j0 + tid) * 4, threads * 4, valid)
                    if backward:
                        load(words_b, b, b0 + (j0 + tid) * 4, threads * 4, valid)
                    mc, sc = stats(words_a, words_b, valid, scale, log)
                    m, s = combine(m, s, mc, sc)
                    j0 += chunk
                m, s = reduce(m, s, threads, shared, parity)
                parity ^= 1
            if mode == MODE_STATS:
                if tid == 0:
                    ws[item * 2] = s if backward else m
                    ws[item * 2 + 1] = s
            else:
                if mode == MODE_FINISH:
                    m, s = fold(ws, row, parts)
                r = factor(s, log)
                o0 = row * out_row + start * 4
                j0 = (count - 1) // chunk * chunk  # the last chunk first
                while j0 >= 0:
                    valid = (count - j0 - tid + threads - 1) // threads if count - j0 > tid else 0
                    own = (j0 + tid) * 4
                    load(words_a, a, a0 + own, threads * 4, valid)
                    if backward:
                        load(words_b, b, b0 + own, threads * 4, valid)
                    write(words_a, words_b, out, o0 + own, threads * 4, valid, m, r, log,
                          scale, result)
                    j0 -= chunk
            item += int64(cuda.gridDim.x)

    return softmax_stream if stream else softmax_registers


# -- columns -------------------------------------------------------------------------------


def _make_cols(element: ElementKind, backward: bool) -> Any:
    spec = SOFTMAX_ELEMENTS[element]
    acc, load, store, maximum, exp = spec.acc, spec.load, spec.store, spec.max, spec.exp
    fold = _fold_parts(acc, maximum, backward)
    factor, finish = _finisher(element, backward)

    def softmax_cols(a, b, out, ws, row_begin, row_end, n, parts, part_len, lanes, shape,
                     a_strides, b_strides, out_strides, a_axis, b_axis, out_axis, mode, log,
                     scale):
        """Thread ``t`` of block ``(x, p)`` takes row ``row_begin + x * blockDim + t`` and
        part ``p`` of its axis (``lanes`` is unused)."""
        row = row_begin + int64(cuda.blockIdx.x) * cuda.blockDim.x + cuda.threadIdx.x
        part = int64(cuda.blockIdx.y)
        if row >= row_end:
            return
        base = row * parts * 2
        if mode == MODE_MERGE:
            m, s = fold(ws, row, parts)
            ws[base] = m
            ws[base + 1] = s
            return
        start = part * part_len
        stop = start + part_len if start + part_len < n else n
        a_off, b_off = strided_offset2(row, shape, a_strides, b_strides)
        a_off += start * a_axis
        b_off += start * b_axis
        m = acc(-_INF)
        s = acc(0)
        if mode != MODE_FINISH:
            loaded = cuda.local.array(COLUMN_UNROLL, acc)  # registers (unrolled)
            for i0 in range(0, stop - start, COLUMN_UNROLL):
                for k in range(COLUMN_UNROLL):  # the loads first: COLUMN_UNROLL in flight
                    va = acc(-_INF) if not backward else acc(0)
                    if i0 + k < stop - start:
                        va = load(a, a_off + (i0 + k) * a_axis)
                        if backward and not log:
                            va *= load(b, b_off + (i0 + k) * b_axis)
                    loaded[k] = va
                for k in range(COLUMN_UNROLL):
                    va = loaded[k]
                    if backward:
                        s += va
                    else:
                        va *= scale
                        if va > m:  # a new max (rare): rescale the sum
                            s = s * math.exp(m - va) + math.exp(va - va)
                            m = va
                        elif va != acc(-_INF):  # NaN, and +inf after +inf, give a NaN sum
                            s += exp(va - m)
        if mode == MODE_STATS:
            item = row * parts + part
            ws[item * 2] = s if backward else m
            ws[item * 2 + 1] = s
            return
        if mode == MODE_FINISH:  # merged into the row's first slot
            m = ws[base]
            s = ws[base + 1]
        out_off = strided_offset(row, shape, out_strides) + start * out_axis
        r = factor(s, log)
        held_a = cuda.local.array(COLUMN_UNROLL, acc)
        held_b = cuda.local.array(COLUMN_UNROLL, acc)
        for i0 in range(0, stop - start, COLUMN_UNROLL):
            for k in range(COLUMN_UNROLL):  # the loads first: COLUMN_UNROLL in flight
                if i0 + k < stop - start:
                    held_a[k] = load(a, a_off + (i0 + k) * a_axis)
                    held_b[k] = load(b, b_off + (i0 + k) * b_axis) if backward else acc(0)
            for k in range(COLUMN_UNROLL):
                if i0 + k < stop - start:
                    va = held_a[k] if backward else held_a[k] * scale
                    out[out_off + (i0 + k) * out_axis] = store(
                        finish(va, held_b[k], m, r, log, scale))

    return softmax_cols


# -- the table ------------------------------------------------------------------------------


def _signature(element: ElementKind, layout: str) -> tuple[types.Type, ...]:
    spec = SOFTMAX_ELEMENTS[element]
    if layout in UNIT_LAYOUTS:
        words = flat(uint32)
        return (words, words, words, flat(spec.acc), *(int64,) * 10, int64, spec.acc)
    storage = flat(spec.storage)
    return (storage, storage, storage, flat(spec.acc), int64, int64, int64, int64, int64, int64,
            _TUPLE8, _TUPLE8, _TUPLE8, _TUPLE8, int64, int64, int64, int64, int64, spec.acc)


#: The 16-byte-unit row kernels (arrays as uint32 words; aligned rows of stride 1 whose
#: other axes merge into one row stride): ``rows_registers`` holds a row in registers,
#: ``rows_stream`` reads a row part twice.
UNIT_LAYOUTS = {"rows_registers": functools.partial(_make_units, stream=False),
                "rows_stream": functools.partial(_make_units, stream=True)}
#: Layouts -> kernel factory: ``rows`` (elements, any layout the others do not take),
#: ``cols`` (axis strided, another axis of stride 1), and the unit row kernels.
SOFTMAX_LAYOUTS = {"rows": _make_rows, "cols": _make_cols, **UNIT_LAYOUTS}

#: ``(layout, element, backward) -> Kernel``: 4 layouts x 4 elements x 2 directions.
SOFTMAX_KERNELS: dict[tuple[str, ElementKind, bool], Kernel] = LazyTable(
    [(layout, element, backward) for layout in SOFTMAX_LAYOUTS for element in SOFTMAX_ELEMENTS
     for backward in (False, True)],
    lambda key: Kernel(f"softmax_{key[0]}{'_backward' if key[2] else ''}[{key[1].name}]",
                       SOFTMAX_LAYOUTS[key[0]](key[1], key[2]), _signature(key[1], key[0]),
                       max_registers=ROW_REGISTERS if key[0] != "cols" else None))
