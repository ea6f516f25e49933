"""Gradient kernels of any layout: the generic gradient (``_make_backward``), the
broadcast of the gradients without a statistic in dx's memory order, and the exact Prod
gradient of lines that hold zeros.
"""


import inspect
from collections.abc import Callable
from typing import Any

import numpy as np
from numba import cuda, int64, types, uint16, uint64

from ..._runtime import SIMULATOR
from ...types import ElementKind, ReduceKind
from ..common import div_f64, load16_words, shfl_xor, store16_words
from .forward import _lane_reducer
from .ops import ELEMENTS, GRAD_OPS, SHARED_SLOTS, TIES, _grad_fns, _offsets4
from .words import VECTOR

# -- what every gradient kernel shares: its kind's formulas and its ``flags`` -------------
# Every gradient kernel takes ``flags`` last: bit 0 (FLAG_BF16) picks bf16 in a kernel that
# serves f16 and bf16 (element token ``half``), bit 1 (FLAG_STD) Std in the Var kernel,
# bit 2 (FLAG_LINE_BLOCKS) the Prod fix-up's block per line.

#: ``flags`` bit of a half kernel's bf16 body (its f16 body where clear).
FLAG_BF16 = 1
#: ``flags`` bit of Std in the Var kernel: the coefficient ``dy / (2 y) * param`` (0 where
#: y == 0) instead of ``dy * param``, y read; the per-element ``c * (x - mean)`` and the
#: mean are the same, so only the per-output coefficient looks at the flag.
FLAG_STD = 2
#: ``flags`` bit of the Prod fix-up: a block per line (long lines), else a warp per 32.
FLAG_LINE_BLOCKS = 4
#: The most warps of a fix-up block (its shared slots).
MAX_LINE_WARPS = 32


def grad_flags(kind: ReduceKind, element: ElementKind) -> int:
    """The ``flags`` argument of the gradient kernels for ``kind`` of ``element``."""
    return (FLAG_BF16 if element is ElementKind.BF16 else 0) | \
        (FLAG_STD if kind is ReduceKind.STD else 0)


def _grad_parts(kind: ReduceKind, element: ElementKind) -> tuple[Any, Any, bool, bool]:
    """``(coefficient, element_fn, reads_y, y_by_flag)`` of the gradient kernel of ``kind``
    (a kernel kind: Var serves Std) for ``element``: ``coefficient(g, y, mean, count,
    param, flags)`` is the per-output coefficient, ``element_fn`` the per-element formula
    (``_grad_fns``); ``y_by_flag``: y is read only where ``flags`` has FLAG_STD."""
    if kind is not ReduceKind.VAR:
        base, element_fn = _grad_fns(kind, element)

        @cuda.jit(device=True, inline=True)
        def coefficient(g, yv, mean, count, param, flags):
            return base(g, yv, mean, count, param)

        return coefficient, element_fn, GRAD_OPS[kind].reads_y, False
    var_coefficient, element_fn = _grad_fns(ReduceKind.VAR, element)
    std_coefficient = _grad_fns(ReduceKind.STD, element)[0]
    assert element_fn is _grad_fns(ReduceKind.STD, element)[1]

    @cuda.jit(device=True, inline=True)
    def var_std_coefficient(g, yv, mean, count, param, flags):
        if flags & FLAG_STD:
            return std_coefficient(g, yv, mean, count, param)
        return var_coefficient(g, yv, mean, count, param)

    return var_std_coefficient, element_fn, True, True


# -- f16 and bf16 in one kernel ---------------------------------------------------------
# A half gradient kernel holds the f16 and the bf16 body, each the kernel of its element as
# it was (its loops and per-element code unchanged), and runs one by ``flags & FLAG_BF16``
# (uniform over the launch). Its f16/bf16 arrays are uint16; the f16 body sees them as
# float16 (``as_f16``, no instruction).

if SIMULATOR:

    def as_f16(array: Any) -> Any:
        """uint16 ``array`` seen as float16 (the same memory)."""
        return array.view(np.float16)

else:
    from numba.core.extending import intrinsic

    @intrinsic
    def as_f16(typingctx: Any, array: Any) -> Any:
        """uint16 ``array`` seen as float16 (the same memory): its data pointer cast, no
        instruction."""
        result = array.copy(dtype=types.float16)

        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            source = context.make_array(signature.args[0])(context, builder, args[0])
            view = context.make_array(signature.return_type)(context, builder)
            for field in view._datamodel._fields:
                value = getattr(source, field)
                setattr(view, field, builder.bitcast(value, view.data.type)
                        if field == "data" else value)
            return view._getvalue()

        return result(array), codegen


def _device_body(function: Callable[..., None]) -> Any:
    """A kernel body as a device function inlined into the half kernel (Numba IR, as every
    device function of the family)."""
    return cuda.jit(device=True, inline=True)(function)


def _half_kernel(f16_kernel: Callable[..., None], bf16_kernel: Callable[..., None],
                 f16_signature: tuple[types.Type, ...]) -> Callable[..., None]:
    """One kernel running ``bf16_kernel`` where ``flags & FLAG_BF16`` (``flags`` its last
    argument), else ``f16_kernel`` with the float16 arrays of ``f16_signature`` seen from
    uint16 (``as_f16``)."""
    names = list(inspect.signature(bf16_kernel).parameters)
    assert names == list(inspect.signature(f16_kernel).parameters) and names[-1] == "flags"
    f16_args = [f"as_f16({name})" if isinstance(t, types.Array) and t.dtype == types.float16
                else name for name, t in zip(names, f16_signature, strict=True)]
    name = bf16_kernel.__name__
    namespace = {"__name__": __name__, "FLAG_BF16": FLAG_BF16, "as_f16": as_f16,
                 "bf16_body": _device_body(bf16_kernel), "f16_body": _device_body(f16_kernel)}
    exec(f"def {name}({', '.join(names)}):\n"  # noqa: S102 - a fixed template
         f"    if flags & FLAG_BF16:\n"
         f"        bf16_body({', '.join(names)})\n"
         f"    else:\n"
         f"        f16_body({', '.join(f16_args)})\n", namespace)
    return namespace[name]


def _half_signature(signature: tuple[types.Type, ...]) -> tuple[types.Type, ...]:
    """``signature`` with its float16 arrays as uint16 (bf16's storage)."""
    return tuple(t.copy(dtype=uint16) if isinstance(t, types.Array)
                 and t.dtype == types.float16 else t for t in signature)


def _make_backward(kind: ReduceKind, element: ElementKind) -> Callable[..., None]:
    ops = GRAD_OPS[kind]
    spec = ELEMENTS[element]
    ACC = spec.acc
    load, store = spec.load, spec.store
    coefficient, element_fn, READS_Y, Y_BY_FLAG = _grad_parts(kind, element)
    READS_X = ops.reads_x
    STAT_MEAN, STAT_TIES = ops.stat == "mean", ops.stat == "ties"
    HAS_STAT = ops.stat is not None
    # fused: the mean as the Sum reducer's sum over the extent; Welford's squared
    # deviations are never read.
    # (Measurements: docs/design/reduce.md, "Measured constants".)
    stat_reduce = _lane_reducer(TIES if STAT_TIES else ReduceKind.SUM, element)

    def reduce_backward(dy, x, y, dx, stat_acc, stat_k, out_numel, extent, x_axis_stride,
                        dx_axis_stride, out_shape, dy_strides, x_strides, y_strides,
                        dx_strides, lanes, row_layout, chunk_len, param, fused, flags):
        """dx over the rows of ``out_numel`` outputs. The statistic (mean / tie count) is
        ``stat_acc[o] / extent`` (a sum) / ``stat_k[o]``, or with ``fused`` (one split
        only) reduced here first by the lanes of the row, which then re-read their elements
        (cache-warm)."""
        tid = cuda.threadIdx.x
        block = cuda.blockDim.x
        slots = block // lanes
        if row_layout:
            lane = tid % lanes
            slot = tid // lanes
        else:
            lane = tid // slots
            slot = tid % slots
        begin = int64(cuda.blockIdx.y) * chunk_len
        end = min(extent, begin + chunk_len)
        span = int64(lanes)
        x_span = span * x_axis_stride
        dx_span = span * dx_axis_stride
        sa = cuda.shared.array(SHARED_SLOTS, ACC)
        sb = cuda.shared.array(SHARED_SLOTS, ACC)
        sk = cuda.shared.array(SHARED_SLOTS, int64)
        reads_y = READS_Y and (not Y_BY_FLAG or (flags & FLAG_STD) != 0)
        group = int64(cuda.blockIdx.x)
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
                if fused:
                    a, b, c, k = stat_reduce(x, x_off, x_axis_stride, yv, valid, begin, end,
                                             tid, lane, lanes, slots, row_layout, sa, sb, sk)
                    if lane == 0:
                        sa[slot] = a
                        sk[slot] = k
                    cuda.syncthreads()
                    mean = sa[slot] / ACC(extent) if STAT_MEAN else sa[slot]
                    count = sk[slot]
                    cuda.syncthreads()  # sa/sk are free for the next group
                elif valid:
                    if STAT_MEAN:
                        mean = stat_acc[o] / ACC(extent)  # the statistic pass's sum
                    else:
                        count = stat_k[o]
            if valid:
                cf = ACC(coefficient(g, yv, mean, count, param, flags))
                i = begin + lane
                x_at = x_off + i * x_axis_stride
                dx_at = dx_off + i * dx_axis_stride
                while i + 3 * span < end:
                    if READS_X:
                        v0 = load(x, x_at)
                        v1 = load(x, x_at + x_span)
                        v2 = load(x, x_at + 2 * x_span)
                        v3 = load(x, x_at + 3 * x_span)
                    else:
                        v0 = v1 = v2 = v3 = cf
                    dx[uint64(dx_at)] = store(element_fn(cf, v0, yv, mean))
                    dx[uint64(dx_at + dx_span)] = store(element_fn(cf, v1, yv, mean))
                    dx[uint64(dx_at + 2 * dx_span)] = store(element_fn(cf, v2, yv, mean))
                    dx[uint64(dx_at + 3 * dx_span)] = store(element_fn(cf, v3, yv, mean))
                    i += 4 * span
                    x_at += 4 * x_span
                    dx_at += 4 * dx_span
                while i < end:
                    v = load(x, x_at) if READS_X else cf
                    dx[uint64(dx_at)] = store(element_fn(cf, v, yv, mean))
                    i += span
                    x_at += x_span
                    dx_at += dx_span
            group += cuda.gridDim.x

    return reduce_backward


# -- the gradients without a statistic over a contiguous dx, in dx's memory order ---------
# dx = element(coefficient(dy, y), x) with dy and y repeated along the axis, written (and x
# read) in 16-byte units (K elements) in dx's memory order, threads numbered along the
# units as torch's elementwise kernels number them.

#: 16-byte units per thread of the broadcast's rows, a block apart.
BROADCAST_UNITS = 2
#: 16-byte units of x in flight per thread of the broadcast's columns (kinds that read x).
BROADCAST_COL_LOADS = 4


def _make_backward_broadcast(kind: ReduceKind, element: ElementKind) -> Callable[..., None]:
    ops = GRAD_OPS[kind]
    spec, vec = ELEMENTS[element], VECTOR[element]
    ACC, load, pack, unpack = spec.acc, spec.load, vec.pack, vec.unpack
    coefficient, element_fn, READS_Y = _grad_parts(kind, element)[:3]
    READS_X = ops.reads_x
    W = vec.width  # elements per 8-byte word; a unit is 2 words
    K = 2 * W
    U = BROADCAST_UNITS
    L = BROADCAST_COL_LOADS if READS_X else 1
    SLOTS = max(K, U * W)  # per element values: a column unit's K, or W per row unit

    @cuda.jit(device=True, inline=True)
    def line_values(dy, y, dy_off, y_off, param, flags):
        """(coefficient, y) of one output position."""
        g = load(dy, dy_off)
        yv = load(y, y_off) if READS_Y else g
        return ACC(coefficient(g, yv, g, int64(0), param, flags)), yv, g

    @cuda.jit(device=True, inline=True)
    def gradient_word(w, values, results, cfs, yvs, gs, base):
        """The dx word of x word ``w`` whose elements take cfs/yvs/gs[base + e]."""
        unpack(w, values, 0)
        for e in range(W):
            results[e] = element_fn(cfs[base + e], values[e], yvs[base + e], gs[base + e])
        return pack(results)

    def reduce_backward_broadcast(dy, y, xq, dxq, units, line_units, inverse, stride,
                                  dy_stride, y_stride, param, flags):
        """``dx = element(coefficient(dy, y), x)`` (Sum / Mean: ``dy / param``) of a
        C-contiguous, 16-byte aligned dx seen as ``dxq`` (uint32, 4 per unit; ``xq``: x,
        the same layout), ``units`` 16-byte units in all.

        Rows (``stride == 0``; the reduced axis is the last, its extent a whole number
        ``line_units`` of units): unit ``u`` lies in row ``o = u // line_units``
        (``div_f64`` with ``inverse = 1 / line_units``) and takes the values of
        ``dy[o * dy_stride]`` and ``y[o * y_stride]``. Block ``b`` takes units ``b * block
        * U + t + k * block`` (``k < U``, t its thread): their loads first, then their
        stores.

        Columns (``stride > 0``; nothing before the reduced axis, the row after it
        ``line_units`` whole units): element ``j`` of unit ``u`` takes the values of
        ``dy[(n0 + j) * dy_stride]`` and ``y[(n0 + j) * y_stride]`` with ``n0 = (u %
        line_units) * K``. ``stride`` (the threads) is a multiple of ``line_units``, so
        thread ``g`` keeps one column unit: its values once, then units ``g, g + stride,
...``, L loads of x in flight."""
        block = int64(cuda.blockDim.x)
        words = cuda.local.array((U, 2), uint64)
        values = cuda.local.array(W, ACC)
        results = cuda.local.array(W, ACC)
        cfs = cuda.local.array(SLOTS, ACC)
        yvs = cuda.local.array(SLOTS, ACC)
        gs = cuda.local.array(SLOTS, ACC)
        if stride == 0:
            first = int64(cuda.blockIdx.x) * block * U + int64(cuda.threadIdx.x)
            for k in range(U):
                u = first + k * block
                if u < units:
                    o = div_f64(u, line_units, inverse)
                    c, yv, g = line_values(dy, y, o * dy_stride, o * y_stride, param, flags)
                    for e in range(W):
                        cfs[k * W + e] = c
                        yvs[k * W + e] = yv
                        gs[k * W + e] = g
                    if READS_X:
                        words[k, 0], words[k, 1] = load16_words(xq, uint64(u * 4))
            for k in range(U):
                u = first + k * block
                if u < units:
                    if READS_X:
                        low = gradient_word(words[k, 0], values, results, cfs, yvs, gs, k * W)
                        high = gradient_word(words[k, 1], values, results, cfs, yvs, gs,
                                             k * W)
                    else:
                        for e in range(W):
                            results[e] = element_fn(cfs[k * W], cfs[k * W], yvs[k * W],
                                                    gs[k * W])
                        low = high = pack(results)
                    store16_words(dxq, uint64(u * 4), low, high)
            return
        g0 = int64(cuda.blockIdx.x) * block + int64(cuda.threadIdx.x)
        if g0 >= stride:
            return
        n0 = (g0 % line_units) * K
        for e in range(K):
            cfs[e], yvs[e], gs[e] = line_values(dy, y, (n0 + e) * dy_stride,
                                                (n0 + e) * y_stride, param, flags)
        if not READS_X:
            for h in range(2):
                for e in range(W):
                    results[e] = element_fn(cfs[h * W + e], cfs[h * W + e], yvs[h * W + e],
                                            gs[h * W + e])
                words[0, h] = pack(results)
        held = cuda.local.array((L, 2), uint64)
        u = g0
        while u < units:
            if READS_X:
                for k in range(L):
                    if u + k * stride < units:
                        held[k, 0], held[k, 1] = load16_words(xq, uint64((u + k * stride) * 4))
            for k in range(L):
                v = u + k * stride
                if v < units:
                    if READS_X:
                        low = gradient_word(held[k, 0], values, results, cfs, yvs, gs, 0)
                        high = gradient_word(held[k, 1], values, results, cfs, yvs, gs, W)
                    else:
                        low, high = words[0, 0], words[0, 1]
                    store16_words(dxq, uint64(v * 4), low, high)
            u += L * stride

    return reduce_backward_broadcast


# -- the exact Prod gradient of lines that hold zeros --------------------------------------


def _make_prod_zero_fixup(element: ElementKind) -> Callable[..., None]:
    spec = ELEMENTS[element]
    ACC = spec.acc
    load, store = spec.load, spec.store

    @cuda.jit(device=True, inline=True)
    def line_state(x, x_off, x_axis_stride, extent, first, step):
        """(zeros, product of the nonzeros) of elements ``first, first + step,...`` of a
        line: four chains, four loads in flight, multiplied in a fixed order."""
        zeros = int64(0)
        p0 = p1 = p2 = p3 = ACC(1)
        i = first
        while i + 3 * step < extent:
            v0 = load(x, x_off + i * x_axis_stride)
            v1 = load(x, x_off + (i + step) * x_axis_stride)
            v2 = load(x, x_off + (i + 2 * step) * x_axis_stride)
            v3 = load(x, x_off + (i + 3 * step) * x_axis_stride)
            zeros += int64(v0 == 0) + int64(v1 == 0) + int64(v2 == 0) + int64(v3 == 0)
            p0 *= ACC(1) if v0 == 0 else v0
            p1 *= ACC(1) if v1 == 0 else v1
            p2 *= ACC(1) if v2 == 0 else v2
            p3 *= ACC(1) if v3 == 0 else v3
            i += 4 * step
        while i < extent:
            v0 = load(x, x_off + i * x_axis_stride)
            if v0 == 0:
                zeros += 1
            else:
                p0 *= v0
            i += step
        return zeros, (p0 * p1) * (p2 * p3)

    @cuda.jit(device=True, inline=True)
    def write_line(dy, x, dx, dy_off, x_off, dx_off, extent, x_axis_stride, dx_axis_stride,
                   zeros, others, first, step):
        """torch's gradient of a line with ``zeros`` zeros (none: nothing written)."""
        if zeros > 0:
            g = load(dy, dy_off)
            at_zero = g * others if zeros == 1 else g * ACC(0)
            elsewhere = g * ACC(0)
            i = first
            while i < extent:
                v = load(x, x_off + i * x_axis_stride)
                dx[uint64(dx_off + i * dx_axis_stride)] = store(at_zero if v == 0 else elsewhere)
                i += step

    def reduce_backward_prod_zeros(dy, x, y, dx, out_numel, extent, x_axis_stride,
                                   dx_axis_stride, out_shape, dy_strides, x_strides,
                                   y_strides, dx_strides, flags):
        """Rewrite the Prod gradient of every line whose saved product ``y`` is 0 after
        any layout's ``dy * y / x`` pass: with ``z`` zeros in the line, z == 1 gives
        ``dy * prod(nonzeros)`` at the zero and ``dy * 0`` elsewhere, z >= 2 ``dy * 0``
        everywhere (torch); z == 0 (an underflowed product) keeps ``dy * y / x``.

        Short lines (``flags`` without FLAG_LINE_BLOCKS): a warp takes 32 lines, lane l
        loads line l's ``y``, and the warp moves on at once unless one of them is 0 (one
        load and five shuffles per 32 lines); each zero line is then walked by the whole
        warp. Long lines (FLAG_LINE_BLOCKS): a block per line, walked by all its threads
        (the products of long lines often underflow to 0, so every line may need the
        walk). Counts and products combine by an xor tree per warp, then over the warps
        in order: deterministic."""
        lane = cuda.threadIdx.x % 32
        warps = cuda.blockDim.x // 32
        if flags & FLAG_LINE_BLOCKS:
            zs = cuda.shared.array(MAX_LINE_WARPS, int64)
            ps = cuda.shared.array(MAX_LINE_WARPS, ACC)
            first = int64(cuda.threadIdx.x)
            step = int64(cuda.blockDim.x)
            line = int64(cuda.blockIdx.x)
            while line < out_numel:  # uniform across the block
                dy_off, x_off, y_off, dx_off = _offsets4(line, out_shape, dy_strides,
                                                         x_strides, y_strides, dx_strides)
                if load(y, y_off) == 0:  # one address for the block: uniform
                    zeros, others = line_state(x, x_off, x_axis_stride, extent, first, step)
                    for shift in (16, 8, 4, 2, 1):
                        zeros += shfl_xor(zeros, shift)
                        others *= shfl_xor(others, shift)
                    if lane == 0:
                        zs[cuda.threadIdx.x // 32] = zeros
                        ps[cuda.threadIdx.x // 32] = others
                    cuda.syncthreads()
                    zeros = zs[0]
                    others = ps[0]
                    for w in range(1, warps):
                        zeros += zs[w]
                        others *= ps[w]
                    cuda.syncthreads()  # every thread has read the slots of this line
                    write_line(dy, x, dx, dy_off, x_off, dx_off, extent, x_axis_stride,
                               dx_axis_stride, zeros, others, first, step)
                line += cuda.gridDim.x
            return
        group = int64(cuda.blockIdx.x) * warps + cuda.threadIdx.x // 32
        while group * 32 < out_numel:  # uniform across the warp
            mine = group * 32 + lane
            zero_lanes = int64(0)
            if mine < out_numel:
                _, _, y_off, _ = _offsets4(mine, out_shape, dy_strides, x_strides,
                                           y_strides, dx_strides)
                if load(y, y_off) == 0:
                    zero_lanes = int64(1) << lane
            for shift in (16, 8, 4, 2, 1):
                zero_lanes |= shfl_xor(zero_lanes, shift)
            # zero_lanes: the same on every lane
            for j in range(32 if zero_lanes != 0 else 0):
                if (zero_lanes >> j) & 1 == 0:
                    continue
                line = group * 32 + j
                dy_off, x_off, _, dx_off = _offsets4(line, out_shape, dy_strides, x_strides,
                                                     y_strides, dx_strides)
                zeros, others = line_state(x, x_off, x_axis_stride, extent, int64(lane),
                                           int64(32))
                for shift in (16, 8, 4, 2, 1):
                    zeros += shfl_xor(zeros, shift)
                    others *= shfl_xor(others, shift)
                write_line(dy, x, dx, dy_off, x_off, dx_off, extent, x_axis_stride,
                           dx_axis_stride, zeros, others, int64(lane), int64(32))
            group += int64(cuda.gridDim.x) * warps

    return reduce_backward_prod_zeros


