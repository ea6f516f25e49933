"""Fractional max pooling, 2-D and 3-D (2-D runs as 3-D with one depth slice).

Forward, for every output cell ``o = (n, c, od, oh, ow)``::

    start_a(o_a) = window start on axis a (see below), window k_a
    y[o]       = max over the window x[n, c, sd:sd+kd, sh:sh+kh, sw:sw+kw]
    indices[o] = ((n*C + c)*D_in + d)*H_in*W_in + h*W_in + w   of that maximum

The max walks the window in row-major order: ties go to the first element, and the
first NaN met wins (NaN propagates). f16/bf16 compare in f32 (exact), f32/f64 natively.
``indices`` are linear offsets into the *logical* (row-major) input tensor, whatever
the strides of ``x`` (upstream's convention; PyTorch stores per-plane offsets instead).

Backward (gather; no atomics, every ``dx`` element written)::

    dx[i] = sum of dy[o] over outputs o whose window contains i and indices[o] == i

Window starts are monotone in the output index and, for a sample in [0, 1), lie within a
band around ``base(o) = o * (in - k) // (out - 1)`` that does not depend on the sample.
So on each axis the outputs whose window *may* contain coordinate ``c`` form a
contiguous range computed in closed form with integers (``candidate_outputs``), and the
backward needs neither the samples nor a search. Candidates whose window does not
contain ``i`` never saved ``i`` and do not match. The sum runs over ``(od, oh, ow)`` in
ascending order, in f32 for f16/bf16 (f64 for f64): deterministic and bit-stable. An
index that does not point into its own output's window is never matched (ignored).

Window placement, per axis with ``max_start = in - k`` (both clamp to ``[0, max_start]``;
samples are first clamped into ``[0, 1)``, NaN -> 0, as the ABI requires uniforms there):

* BARACUDA (upstream's formula, evaluated exactly): ``out == 1``:
  ``floor(alpha * max_start)``; otherwise ``floor(o * max_start / (out - 1) + alpha)``.
  Exact rational arithmetic: ``o * max_start = q*(out-1) + r``, and the fractional part
  adds one iff ``alpha * (out-1) >= (out-1) - r``, decided by the sign of one f64 FMA
  (exact: alpha has 24 significant bits).
* TORCH (``torch.nn.functional.fractional_max_pool{2,3}d`` on CUDA, given the same
  samples): ``step = (in - k) / (out - 1)``, ``start = int((o + alpha) * step) -
  int(alpha * step)``, last output at ``max_start``; computed in f32 (f64 for f64 inputs).

Work decomposition (both kernels, no shared memory, no barriers): thread ``(x, y)`` owns
one column (``ow`` in the forward, ``w`` in the backward) of a run of ``rows_per_thread``
consecutive rows, a row being ``(plane, depth, height)`` flattened. The run is walked
incrementally, so per-plane work (samples, the column's window start or candidate range)
and per-depth work is done once per run, not per element. Both grid axes are strided, so
any grid covers any problem. Window rows are read four columns per pass and candidate
indices four at a time: independent loads in flight instead of a dependent chain.
"""

from __future__ import annotations

import math

from numba import cuda, float32, float64, int64, types, uint16, uint32, uint64
from numba.types import float16

from ..launch import Kernel, flat
from ..types import ElementKind
from .common import bf16_to_f32, bitcast, f32_to_bf16

PLACEMENT_BARACUDA = 0
PLACEMENT_TORCH = 1

_BELOW_ONE = 0.99999994  # the largest f32 below 1


# -- window placement ------------------------------------------------------------------


@cuda.jit(device=True, inline=True)
def clamp_sample(alpha):
    """The sample clamped into [0, 1) (NaN -> 0), so every placement stays inside the
    backward's candidate ranges."""
    if not (alpha >= float32(0.0)):
        return float32(0.0)
    if alpha >= float32(1.0):
        return float32(_BELOW_ONE)
    return alpha


@cuda.jit(device=True, inline=True)
def baracuda_window_start(o, out, extent, window, alpha):
    """min(floor(o*max_start/(out-1) + alpha), max_start) exactly, alpha in [0, 1)
    (out == 1: floor(alpha*max_start))."""
    max_start = extent - window
    if max_start <= 0:
        return int64(0)
    a = float64(alpha)
    if out <= 1:
        span = float64(max_start)
        t = float64(math.floor(a * span))
        # a*span may round up onto an integer; the FMA gives the exact residual's sign.
        if cuda.fma(a, span, -t) < 0.0:
            t -= 1.0
        return int64(t)
    last = out - 1
    p = o * max_start
    q = p // last  # exact (and a 32-bit division when the operands fit, LLVM's bypass)
    r = p - q * last
    # floor(r/last + alpha) is 1 iff alpha*last >= last - r (exact sign via one FMA).
    if cuda.fma(a, float64(last), -float64(last - r)) >= 0.0:
        q += 1
    return min(q, max_start)


@cuda.jit(device=True, inline=True)
def torch_window_start_f32(o, out, extent, window, alpha):
    """PyTorch's CUDA ``get_interval`` with float accumulation (f16/bf16/f32 inputs)."""
    max_start = extent - window
    if o >= out - 1:
        return max_start
    sample = float32(alpha)
    step = float32(max_start) / float32(out - 1)
    start = int64(float32(float32(o) + sample) * step) - int64(sample * step)
    return max(int64(0), min(start, max_start))


@cuda.jit(device=True, inline=True)
def torch_window_start_f64(o, out, extent, window, alpha):
    """PyTorch's CUDA ``get_interval`` with double accumulation (f64 inputs)."""
    max_start = extent - window
    if o >= out - 1:
        return max_start
    sample = float64(alpha)
    step = float64(max_start) / float64(out - 1)
    start = int64((float64(o) + sample) * step) - int64(sample * step)
    return max(int64(0), min(start, max_start))


@cuda.jit(device=True, inline=True)
def count_base_at_most(value, count, max_start, last):
    """#{o in [0, count): o*max_start // last <= value}, max_start, last > 0."""
    if value < 0:
        return int64(0)
    return min(count, ((value + 1) * last + max_start - 1) // max_start)


@cuda.jit(device=True, inline=True)
def candidate_outputs(coord, extent, window, out, placement):
    """[first, end) of the outputs whose window may contain input ``coord`` for *any*
    sample in [0, 1): a superset of the true range, found without the samples.

    BARACUDA: start(o) is base(o) or base(o) + 1 (clamped), base(o) = o*max_start //
    (out-1), so the candidates are c - k <= base(o) <= c. TORCH: start(o) lies in
    [base(o) - floor(step) - 1, base(o + 1) + 1] (step = max_start/(out-1)), widened by
    ``slack`` for f32 rounding of large extents."""
    max_start = extent - window
    last = out - 1
    if max_start <= 0 or last <= 0:
        return int64(0), out
    if placement == PLACEMENT_BARACUDA:
        first = count_base_at_most(coord - window - 1, out, max_start, last)
        end = count_base_at_most(coord, out, max_start, last)
        return first, end
    slack = 1 + (max_start >> 20)
    end = count_base_at_most(coord + max_start // last + 1 + slack, out, max_start, last)
    below = coord - window - 1 - slack  # outputs with base(o + 1) <= below cannot reach
    first = int64(0)
    if below >= 0:
        first = max(int64(0), count_base_at_most(below, out + 1, max_start, last) - 1)
    return first, end


@cuda.jit(device=True, inline=True)
def _takes_over(best, value):
    """Whether ``value`` replaces the running max ``best``: strictly greater (ties keep the
    first), or NaN while ``best`` is not (the first NaN sticks)."""
    return best == best and (value > best or value != value)


# -- element conversions -----------------------------------------------------------------


@cuda.jit(device=True, inline=True)
def _load_f16(value):
    return float32(value)


@cuda.jit(device=True, inline=True)
def _store_f16(value):
    return float16(value)


@cuda.jit(device=True, inline=True)
def _same(value):
    return value


# -- kernels ---------------------------------------------------------------------------------


def _make_forward(load, torch_start):
    """Forward kernel for one element kind: ``load`` widens storage to the compare type."""

    @cuda.jit(device=True, inline=True)
    def window_start(o, out, extent, window, alpha, placement):
        if placement == PLACEMENT_BARACUDA:
            return baracuda_window_start(o, out, extent, window, alpha)
        return torch_start(o, out, extent, window, alpha)

    def fractional_max_pool_fw(x, y, indices, samples, dims, x_strides, y_strides,
                               idx_strides, sample_strides, windows, rows_per_thread):
        """dims = (N, C, D_in, H_in, W_in, D_out, H_out, W_out); *_strides = (n, c, d, h, w,
        ...); sample_strides = (n, c, axis, axis_d, axis_h, axis_w, ...) (axis_d < 0: no
        depth sample); windows = (kd, kh, kw, placement, ...).

        Thread (x, y) owns output column ``ow = x`` of ``rows_per_thread`` consecutive
        output rows (row = (plane, od, oh) flattened), walked incrementally so that the
        per-plane and per-depth work (samples, column start, depth start) is done once."""
        channels = dims[1]
        d_in, h_in, w_in = dims[2], dims[3], dims[4]
        d_out, h_out, w_out = dims[5], dims[6], dims[7]
        kd, kh, kw, placement = windows[0], windows[1], windows[2], windows[3]
        hw_in = h_in * w_in
        plane_size = d_in * hw_in
        total_rows = dims[0] * channels * d_out * h_out
        group_step = int64(cuda.gridDim.y) * cuda.blockDim.y
        ow = int64(cuda.blockIdx.x) * cuda.blockDim.x + cuda.threadIdx.x
        while ow < w_out:
            group = int64(cuda.blockIdx.y) * cuda.blockDim.y + cuda.threadIdx.y
            while group * rows_per_thread < total_rows:
                row = group * rows_per_thread
                row_end = min(row + rows_per_thread, total_rows)
                oh = row % h_out
                rest = row // h_out
                od = rest % d_out
                plane = rest // d_out
                new_plane = True
                new_depth = True
                alpha_d = alpha_h = alpha_w = float32(0.0)
                sd = x_col = y_col = idx_col = lin_col = int64(0)
                while row < row_end:
                    if new_plane:
                        n = plane // channels
                        c = plane - n * channels
                        sample_base = n * sample_strides[0] + c * sample_strides[1]
                        if sample_strides[3] >= 0:
                            alpha_d = clamp_sample(samples[sample_base + sample_strides[3]
                                                           * sample_strides[2]])
                        alpha_h = clamp_sample(samples[sample_base + sample_strides[4]
                                                       * sample_strides[2]])
                        alpha_w = clamp_sample(samples[sample_base + sample_strides[5]
                                                       * sample_strides[2]])
                        sw = window_start(ow, w_out, w_in, kw, alpha_w, placement)
                        x_col = n * x_strides[0] + c * x_strides[1] + sw * x_strides[4]
                        y_col = n * y_strides[0] + c * y_strides[1] + ow * y_strides[4]
                        idx_col = n * idx_strides[0] + c * idx_strides[1] + ow * idx_strides[4]
                        lin_col = plane * plane_size + sw
                        new_plane = False
                    if new_depth:
                        sd = window_start(od, d_out, d_in, kd, alpha_d, placement)
                        new_depth = False
                    sh = window_start(oh, h_out, h_in, kh, alpha_h, placement)
                    first = x_col + sd * x_strides[2] + sh * x_strides[3]
                    best_raw = x[uint64(first)]
                    best = load(best_raw)
                    best_d = int64(0)
                    best_h = int64(0)
                    best_w = int64(0)
                    for dd in range(kd):
                        for dh in range(kh):
                            base = first + dd * x_strides[2] + dh * x_strides[3]
                            dw = int64(0)
                            while dw < kw:
                                # Four independent loads per pass (past the window's end they
                                # re-read its last column and are not compared).
                                last = kw - 1
                                raw0 = x[uint64(base + dw * x_strides[4])]
                                raw1 = x[uint64(base + min(dw + 1, last) * x_strides[4])]
                                raw2 = x[uint64(base + min(dw + 2, last) * x_strides[4])]
                                raw3 = x[uint64(base + min(dw + 3, last) * x_strides[4])]
                                value = load(raw0)
                                if _takes_over(best, value):
                                    best, best_raw = value, raw0
                                    best_d, best_h, best_w = dd, dh, dw
                                value = load(raw1)
                                if dw + 1 < kw and _takes_over(best, value):
                                    best, best_raw = value, raw1
                                    best_d, best_h, best_w = dd, dh, dw + 1
                                value = load(raw2)
                                if dw + 2 < kw and _takes_over(best, value):
                                    best, best_raw = value, raw2
                                    best_d, best_h, best_w = dd, dh, dw + 2
                                value = load(raw3)
                                if dw + 3 < kw and _takes_over(best, value):
                                    best, best_raw = value, raw3
                                    best_d, best_h, best_w = dd, dh, dw + 3
                                dw += 4
                    y[uint64(y_col + od * y_strides[2] + oh * y_strides[3])] = best_raw
                    indices[uint64(idx_col + od * idx_strides[2] + oh * idx_strides[3])] = (
                        lin_col + (sd + best_d) * hw_in + (sh + best_h) * w_in + best_w)
                    row += 1
                    oh += 1
                    if oh == h_out:
                        oh = 0
                        od += 1
                        new_depth = True
                        if od == d_out:
                            od = 0
                            plane += 1
                            new_plane = True
                group += group_step
            ow += int64(cuda.gridDim.x) * cuda.blockDim.x

    return fractional_max_pool_fw


def _make_backward(load, store, zero):
    """Backward kernel for one element kind: sums ``load(dy)`` in ``zero``'s type."""

    def fractional_max_pool_bw(dy, indices, dx, dims, dy_strides, idx_strides, dx_strides,
                               windows, rows_per_thread):
        """Same dims/strides/windows layout as the forward. Thread (x, y) owns input column
        ``w = x`` of ``rows_per_thread`` consecutive input rows (plane, d, h)."""
        channels = dims[1]
        d_in, h_in, w_in = dims[2], dims[3], dims[4]
        d_out, h_out, w_out = dims[5], dims[6], dims[7]
        kd, kh, kw, placement = windows[0], windows[1], windows[2], windows[3]
        plane_size = d_in * h_in * w_in
        total_rows = dims[0] * channels * d_in * h_in
        group_step = int64(cuda.gridDim.y) * cuda.blockDim.y
        w = int64(cuda.blockIdx.x) * cuda.blockDim.x + cuda.threadIdx.x
        while w < w_in:
            ow_first, ow_end = candidate_outputs(w, w_in, kw, w_out, placement)
            group = int64(cuda.blockIdx.y) * cuda.blockDim.y + cuda.threadIdx.y
            while group * rows_per_thread < total_rows:
                row = group * rows_per_thread
                row_end = min(row + rows_per_thread, total_rows)
                h = row % h_in
                rest = row // h_in
                d = rest % d_in
                plane = rest // d_in
                new_plane = True
                new_depth = True
                dy_plane = idx_plane = dx_col = target_col = od_first = od_end = int64(0)
                while row < row_end:
                    if new_plane:
                        n = plane // channels
                        c = plane - n * channels
                        dy_plane = n * dy_strides[0] + c * dy_strides[1]
                        idx_plane = n * idx_strides[0] + c * idx_strides[1]
                        dx_col = n * dx_strides[0] + c * dx_strides[1] + w * dx_strides[4]
                        target_col = plane * plane_size + w
                        new_plane = False
                    if new_depth:
                        od_first, od_end = candidate_outputs(d, d_in, kd, d_out, placement)
                        new_depth = False
                    oh_first, oh_end = candidate_outputs(h, h_in, kh, h_out, placement)
                    target = target_col + (d * h_in + h) * w_in
                    total = zero
                    for od in range(od_first, od_end):
                        for oh in range(oh_first, oh_end):
                            idx_base = idx_plane + od * idx_strides[2] + oh * idx_strides[3]
                            dy_base = dy_plane + od * dy_strides[2] + oh * dy_strides[3]
                            ow = ow_first
                            while ow < ow_end:
                                # Four independent index loads per pass (clamped to the range;
                                # repeats are not summed), in ascending ow: a fixed order.
                                last = ow_end - 1
                                o1 = min(ow + 1, last)
                                o2 = min(ow + 2, last)
                                o3 = min(ow + 3, last)
                                k0 = indices[uint64(idx_base + ow * idx_strides[4])]
                                k1 = indices[uint64(idx_base + o1 * idx_strides[4])]
                                k2 = indices[uint64(idx_base + o2 * idx_strides[4])]
                                k3 = indices[uint64(idx_base + o3 * idx_strides[4])]
                                if k0 == target:
                                    total += load(dy[uint64(dy_base + ow * dy_strides[4])])
                                if ow + 1 < ow_end and k1 == target:
                                    total += load(dy[uint64(dy_base + o1 * dy_strides[4])])
                                if ow + 2 < ow_end and k2 == target:
                                    total += load(dy[uint64(dy_base + o2 * dy_strides[4])])
                                if ow + 3 < ow_end and k3 == target:
                                    total += load(dy[uint64(dy_base + o3 * dy_strides[4])])
                                ow += 4
                    dx[uint64(dx_col + d * dx_strides[2] + h * dx_strides[3])] = store(total)
                    row += 1
                    h += 1
                    if h == h_in:
                        h = 0
                        d += 1
                        new_depth = True
                        if d == d_in:
                            d = 0
                            plane += 1
                            new_plane = True
                group += group_step
            w += int64(cuda.gridDim.x) * cuda.blockDim.x

    return fractional_max_pool_bw


# -- fast path: contiguous arrays, every offset below 2^31 ---------------------------------
#
# The general kernels above spend ~600 instructions per output on 64-bit strided index
# arithmetic and 64-bit divisions (Nsight Compute: instruction-bound, 5-9% of DRAM
# bandwidth). For the usual layout (x, y, indices, dy, dx row-major contiguous, each with
# fewer than 2^31 elements, and every ``out * (in + 1) < 2^31``) the fast kernels below use
# flat offsets that fit in 32 bits (wrapped in ``uint32(...)`` so LLVM narrows the adds and
# multiplies, and unsigned so array indexing needs no wraparound check), and divide by
# multiply-high with host-computed magic numbers (``magic_divisor``) instead of division.
# Window starts per row cost one magic division and one integer compare (the per-plane
# threshold ``baracuda_threshold`` replaces the per-row f64 FMA).
#
# The fast backward is a *leader scatter* instead of the gather: one thread per output o
# with saved index i finds (with the same sample-free candidate ranges) every output o'
# whose window may contain i; the first of those (row-major) whose saved index is i sums
# dy over all of them in ascending order and writes dx[i]; the others write nothing, and dx
# is zeroed first (one memset). The set of (o, i) pairs summed and the summation order are
# exactly the gather's, so the result is bit-identical to it, deterministic, atomic-free,
# and ignores foreign indices the same way. It does ~2x (2-D) to ~3x (3-D) fewer index
# checks than the gather, which visits every input element.
#
# The default fast backward where it applies (BARACUDA placement, at most 32 candidate
# outputs per input element) is *tiled* (``_make_backward_tiled``): a block owns a tile of
# whole input rows, stages dy of the outputs that may reach it in shared memory and
# records, per tile element, which of its candidate outputs chose it as a bit of a 32-bit
# mask (integer ``atomic_or``: order-independent); each element then sums the chosen dy in
# ascending bit = output order and writes dx. No per-output search, no zero fill,
# coalesced dx stores, 32-bit arithmetic, and again bit-identical to the gather; it
# issues 1.6x fewer instructions than the leader scatter (whose 64-bit setup and divergent
# candidate loop wait on each index load) and runs about 2x faster (docs/design/
# fractional_max_pool.md). The leader scatter remains for the other cases.
#
# The default fast forward for the FAST_WINDOWS caches row maxima across a thread's run of
# rows (``_make_forward_rows32``): only the window rows that enter are loaded (2-D k3 at
# alpha 1.39: ~4.8 loads per output instead of 9), with every offset and counter uint32.
# Wrapping 64-bit expressions in ``uint32(...)`` is not enough: LLVM turns the
# zext(trunc(x)) of an index back into ``x & 0xffffffff`` with 64-bit adds (6 SASS per
# load in ``_make_forward_rows``); the operands must be uint32 values themselves, and a
# window row is indexed as ``uint64(first) + row_offset`` so its columns become the loads'
# immediates (about a third fewer instructions than the 64-bit walk).


def magic_divisor(divisor: int) -> tuple[int, int]:
    """Host: ``(multiplier, shift)`` with ``(v * multiplier) >> shift == v // divisor`` for
    every ``0 <= v < 2^31`` (Granlund-Montgomery with N = 31: multiplier =
    ceil(2^(31+l) / divisor), l = ceil(log2 divisor), so multiplier < 2^32 and the product
    fits in 63 bits). ``(0, 0)`` for a divisor < 1 (never divided by)."""
    if divisor < 1:
        return 0, 0
    shift = 31 + (divisor - 1).bit_length()
    return -(-(1 << shift) // divisor), shift


@cuda.jit(device=True, inline=True)
def fast_div(value, multiplier, shift):
    """value // divisor for 0 <= value < 2^31 (``magic_divisor(divisor)``): a 32x32->64
    multiply and a shift instead of a ~20-instruction division."""
    return (int64(uint32(value)) * int64(uint32(multiplier))) >> shift


@cuda.jit(device=True, inline=True)
def baracuda_threshold(alpha, max_start, last):
    """Per (plane, axis) constant of the BARACUDA placement: for out > 1 (``last > 0``)
    ``last - floor(alpha * last)`` (exact), so that ``start(o) = min(q + (r >= threshold),
    max_start)`` with ``q, r = divmod(o * max_start, last)``: the fractional part
    ``r/last + alpha`` reaches 1 iff ``alpha*last >= last - r`` iff ``r >= threshold``.
    For out == 1 the start itself, ``floor(alpha * max_start)``."""
    span = last
    if last <= 0:
        span = max(max_start, int64(0))
    a = float64(alpha)
    s = float64(span)
    t = float64(math.floor(a * s))
    # a*s may round up onto an integer; the FMA gives the exact residual's sign.
    if cuda.fma(a, s, -t) < 0.0:
        t -= 1.0
    if last <= 0:
        return int64(t)
    return last - int64(t)


@cuda.jit(device=True, inline=True)
def _takes_over_fast(best, value):
    """``_takes_over`` without branches: ``value <= best`` is false iff value > best or
    either is NaN, and a NaN ``best`` never yields."""
    return (best == best) & (not (value <= best))


@cuda.jit(device=True, inline=True)
def baracuda_start_fast(o, max_start, last, threshold, multiplier, shift):
    """BARACUDA window start of output ``o`` from the plane's ``baracuda_threshold``
    (``o * max_start < 2^31``; ``multiplier, shift`` = magic of ``last``)."""
    if last <= 0:
        return threshold
    p = o * max_start
    q = fast_div(p, multiplier, shift)
    if p - q * last >= threshold:
        q += 1
    return min(q, max_start)


@cuda.jit(device=True, inline=True)
def baracuda_start32(o, max_start, last, threshold, multiplier, shift):
    """``baracuda_start_fast`` on uint32 operands only (LLVM then emits 32-bit adds and
    one wide multiply per address instead of 64-bit adds and masks)."""
    if last == 0:
        return threshold
    p = uint32(o * max_start)
    q = uint32(fast_div(p, multiplier, shift))
    if uint32(p - uint32(q * last)) >= threshold:
        q = uint32(q + uint32(1))
    return min(q, max_start)


def _make_plane_setup(torch_start):
    """Device function ``(plane, samples, dims, sample_strides, windows, ow, multiplier_w,
    shift_w) -> (alpha_d, alpha_h, thr_d, thr_h, sw)`` of the fast forwards: a plane's
    clamped d/h samples, their BARACUDA thresholds (0 for TORCH placement) and the window
    start ``sw`` (uint32) of output column ``ow``."""

    @cuda.jit(device=True, inline=True)
    def plane_setup(plane, samples, dims, sample_strides, windows, ow, multiplier_w, shift_w):
        channels = dims[1]
        n = int64(uint32(plane) // uint32(channels))
        c = plane - n * channels
        sample_base = n * sample_strides[0] + c * sample_strides[1]
        alpha_d = float32(0.0)
        if sample_strides[3] >= 0:
            alpha_d = clamp_sample(samples[sample_base + sample_strides[3] * sample_strides[2]])
        alpha_h = clamp_sample(samples[sample_base + sample_strides[4] * sample_strides[2]])
        alpha_w = clamp_sample(samples[sample_base + sample_strides[5] * sample_strides[2]])
        w_in, w_out, kw = dims[4], dims[7], windows[2]
        thr_d = thr_h = uint32(0)
        if windows[3] == PLACEMENT_BARACUDA:
            thr_d = uint32(baracuda_threshold(alpha_d, dims[2] - windows[0], dims[5] - 1))
            thr_h = uint32(baracuda_threshold(alpha_h, dims[3] - windows[1], dims[6] - 1))
            sw = baracuda_start32(
                uint32(ow), uint32(w_in - kw), uint32(w_out - 1),
                uint32(baracuda_threshold(alpha_w, w_in - kw, w_out - 1)), multiplier_w,
                shift_w)
        else:
            sw = uint32(torch_start(ow, w_out, w_in, kw, alpha_w))
        return alpha_d, alpha_h, thr_d, thr_h, sw

    return plane_setup


@cuda.jit(device=True, inline=True)
def candidate_outputs_fast(coord, extent, window, out, placement, multiplier, shift):
    """``candidate_outputs`` with magic division by ``max_start`` (BARACUDA; numerators
    below ``extent * (out + 1) < 2^31``); TORCH placement uses the general function."""
    if placement != PLACEMENT_BARACUDA:
        return candidate_outputs(coord, extent, window, out, placement)
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


#: Windows (kd, kh, kw) with a fully unrolled fast forward (2-D runs with kd = 1): every
#: load of the window is issued before the first compare. With runtime loops each window
#: row waited for its loads before the next row's were issued (about 1.6x slower in 2-D).
FAST_WINDOWS = ((1, 2, 2), (1, 3, 3), (3, 3, 3))


def _make_window_max(load, storage, window):
    """Device function ``(x, first, kd, kh, kw, hw_in, w_in) -> (raw, offset)`` of the
    first maximum (first NaN) of the window whose first element is ``x[first]``, walking
    it in row-major order; fully unrolled for a compile-time ``window`` (kd, kh, kw),
    runtime loops for ``None``."""
    if window is None:

        @cuda.jit(device=True, inline=True)
        def window_max_loops(x, first, kd, kh, kw, hw_in, w_in):
            # uint32 loop-carried offsets: 32-bit adds and one wide multiply per address
            # (a 64-bit expression here costs ~3x the instructions).
            best_at = first
            best_raw = x[first]
            best = load(best_raw)
            depth_at = first
            dd = int64(0)
            while dd < kd:
                row_at = depth_at
                dh = int64(0)
                while dh < kh:
                    at = row_at
                    row_stop = uint32(row_at + kw)
                    while at < row_stop:
                        raw = x[at]
                        value = load(raw)
                        if _takes_over_fast(best, value):
                            best, best_raw, best_at = value, raw, at
                        at = uint32(at + 1)
                    row_at = uint32(row_at + w_in)
                    dh += 1
                depth_at = uint32(depth_at + hw_in)
                dd += 1
            return best_raw, best_at

        return window_max_loops

    window_d, window_h, window_w = window
    size = window_d * window_h * window_w
    plane_size = window_h * window_w

    @cuda.jit(device=True, inline=True)
    def window_max_unrolled(x, first, kd, kh, kw, hw_in, w_in):
        raws = cuda.local.array(size, storage)  # registers once the loops are unrolled
        for j in range(size):
            raws[j] = x[uint32(first + (j // plane_size) * hw_in
                               + ((j // window_w) % window_h) * w_in + j % window_w)]
        best_raw = raws[0]
        best = load(best_raw)
        best_at = first
        for j in range(1, size):
            value = load(raws[j])
            if _takes_over_fast(best, value):
                best, best_raw = value, raws[j]
                best_at = uint32(first + (j // plane_size) * hw_in
                                 + ((j // window_w) % window_h) * w_in + j % window_w)
        return best_raw, best_at

    return window_max_unrolled


def _make_forward_fast(load, torch_start, window_max):
    """Fast forward kernel for one element kind (contiguous, 32-bit offsets) and one
    ``_make_window_max`` window walker."""
    plane_setup = _make_plane_setup(torch_start)

    def fractional_max_pool_fw_fast(x, y, indices, samples, dims, sample_strides, windows,
                                    multipliers, shifts, rows_per_thread):
        """As ``fractional_max_pool_fw`` for row-major contiguous x, y, indices (so the
        saved index is the flat offset into x). multipliers/shifts: magic divisors of
        (last_d, last_h, last_w, ...)."""
        channels = dims[1]
        d_in, h_in, w_in = dims[2], dims[3], dims[4]
        d_out, h_out, w_out = dims[5], dims[6], dims[7]
        kd, kh, kw, placement = windows[0], windows[1], windows[2], windows[3]
        hw_in = h_in * w_in
        plane_size = d_in * hw_in
        out_hw = h_out * w_out
        out_plane = d_out * out_hw
        total_rows = dims[0] * channels * d_out * h_out
        ms_d, ms_h = d_in - kd, h_in - kh
        last_d, last_h = d_out - 1, h_out - 1
        baracuda = placement == PLACEMENT_BARACUDA
        group_step = int64(cuda.gridDim.y) * cuda.blockDim.y
        ow = int64(cuda.blockIdx.x) * cuda.blockDim.x + cuda.threadIdx.x
        while ow < w_out:
            group = int64(cuda.blockIdx.y) * cuda.blockDim.y + cuda.threadIdx.y
            while group * rows_per_thread < total_rows:
                row = group * rows_per_thread
                row_end = min(row + rows_per_thread, total_rows)
                rest = int64(uint32(row) // uint32(h_out))
                oh = row - rest * h_out
                plane = int64(uint32(rest) // uint32(d_out))
                od = rest - plane * d_out
                new_plane = True
                new_depth = True
                alpha_d = alpha_h = float32(0.0)
                thr_d = thr_h = sd = x_col = y_plane = int64(0)
                while row < row_end:
                    if new_plane:
                        alpha_d, alpha_h, thr_d, thr_h, sw = plane_setup(
                            plane, samples, dims, sample_strides, windows, ow, multipliers[2],
                            shifts[2])
                        x_col = plane * plane_size + sw
                        y_plane = plane * out_plane + ow
                        new_plane = False
                    if new_depth:
                        if baracuda:
                            sd = baracuda_start_fast(od, ms_d, last_d, thr_d, multipliers[0],
                                                     shifts[0])
                        else:
                            sd = torch_start(od, d_out, d_in, kd, alpha_d)
                        new_depth = False
                    if baracuda:
                        sh = baracuda_start_fast(oh, ms_h, last_h, thr_h, multipliers[1],
                                                 shifts[1])
                    else:
                        sh = torch_start(oh, h_out, h_in, kh, alpha_h)
                    first = uint32(x_col + sd * hw_in + sh * w_in)
                    best_raw, best_at = window_max(x, first, kd, kh, kw, hw_in, w_in)
                    out_at = uint32(y_plane + od * out_hw + oh * w_out)
                    y[out_at] = best_raw
                    indices[out_at] = int64(best_at)
                    row += 1
                    oh += 1
                    if oh == h_out:
                        oh = 0
                        od += 1
                        new_depth = True
                        if od == d_out:
                            od = 0
                            plane += 1
                            new_plane = True
                group += group_step
            ow += int64(cuda.gridDim.x) * cuda.blockDim.x

    return fractional_max_pool_fw_fast


def _make_backward_fast(load, store, zero):
    """Fast (leader-scatter) backward kernel for one element kind; ``dx`` must be zeroed
    first (the plan does it).

    Candidates are checked one load at a time. More loads in flight (4 clamped candidate
    loads per pass, the next row's index one row ahead; 71-92 registers) were slower: the
    clamped repeats add load instructions and the registers cost occupancy
    (docs/design/fractional_max_pool.md)."""

    def fractional_max_pool_bw_fast(dy, indices, dx, dims, windows, multipliers, shifts,
                                    rows_per_thread):
        """Thread (x, y) owns output column ``ow = x`` of a run of output rows, as the
        forward. multipliers/shifts: magic divisors of (ms_d, ms_h, ms_w, w_in, h_in*w_in,
        ...). dy, indices, dx row-major contiguous."""
        channels = dims[1]
        d_in, h_in, w_in = dims[2], dims[3], dims[4]
        d_out, h_out, w_out = dims[5], dims[6], dims[7]
        kd, kh, kw, placement = windows[0], windows[1], windows[2], windows[3]
        hw_in = h_in * w_in
        plane_size = d_in * hw_in
        out_hw = h_out * w_out
        out_plane = d_out * out_hw
        total_rows = dims[0] * channels * d_out * h_out
        group_step = int64(cuda.gridDim.y) * cuda.blockDim.y
        ow = int64(cuda.blockIdx.x) * cuda.blockDim.x + cuda.threadIdx.x
        while ow < w_out:
            group = int64(cuda.blockIdx.y) * cuda.blockDim.y + cuda.threadIdx.y
            while group * rows_per_thread < total_rows:
                row = group * rows_per_thread
                row_end = min(row + rows_per_thread, total_rows)
                rest = int64(uint32(row) // uint32(h_out))
                oh = row - rest * h_out
                plane = int64(uint32(rest) // uint32(d_out))
                od = rest - plane * d_out
                while row < row_end:
                    plane_in = plane * plane_size
                    plane_out = plane * out_plane
                    me = uint32(plane_out + od * out_hw + oh * w_out + ow)
                    target = indices[me]
                    local = target - plane_in
                    if local >= 0 and local < plane_size:
                        d = int64(0)
                        rem = local
                        if d_in > 1:
                            d = fast_div(local, multipliers[4], shifts[4])
                            rem = local - d * hw_in
                        h = fast_div(rem, multipliers[3], shifts[3])
                        w = rem - h * w_in
                        ow_first, ow_end = candidate_outputs_fast(
                            w, w_in, kw, w_out, placement, multipliers[2], shifts[2])
                        oh_first, oh_end = candidate_outputs_fast(
                            h, h_in, kh, h_out, placement, multipliers[1], shifts[1])
                        od_first, od_end = candidate_outputs_fast(
                            d, d_in, kd, d_out, placement, multipliers[0], shifts[0])
                        # An index outside its own output's candidate window is ignored
                        # (the gather never matches it either).
                        if (ow_first <= ow and ow < ow_end and oh_first <= oh
                                and oh < oh_end and od_first <= od and od < od_end):
                            total = zero
                            leader = True
                            o_d = od_first
                            while leader and o_d < od_end:
                                o_h = oh_first
                                while leader and o_h < oh_end:
                                    other = uint32(plane_out + o_d * out_hw + o_h * w_out
                                                   + ow_first)
                                    stop = uint32(other + (ow_end - ow_first))
                                    while other < stop:
                                        if indices[other] == target:
                                            if other < me:  # an earlier output leads
                                                leader = False
                                                break
                                            total += load(dy[other])
                                        other = uint32(other + 1)
                                    o_h += 1
                                o_d += 1
                            if leader:
                                dx[uint32(target)] = store(total)
                    row += 1
                    oh += 1
                    if oh == h_out:
                        oh = 0
                        od += 1
                        if od == d_out:
                            od = 0
                            plane += 1
                group += group_step
            ow += int64(cuda.gridDim.x) * cuda.blockDim.x

    return fractional_max_pool_bw_fast


def _make_row_cache(load, storage, window):
    """Device helpers of the row-caching forwards for one compile-time window (kd, kh, kw):
    a cache of ``kd * kh`` row maxima (raw value + offset; slot ``dd * kh + j`` holds window
    row j of window depth dd), slid by the change of the window start and refilled from
    freshly loaded rows. Constant indices only, so the arrays live in registers."""
    win_d, win_h, win_w = window
    slots = win_d * win_h

    @cuda.jit(device=True, inline=True)
    def slide(cache_raw, cache_at, shift):
        """Move the rows that stay in the window down by ``shift`` slots (0 < shift < kh)."""
        for j in range(win_h):
            for m in range(1, win_h):
                if j + m < win_h and shift == m:
                    for dd in range(win_d):
                        cache_raw[dd * win_h + j] = cache_raw[dd * win_h + j + m]
                        cache_at[dd * win_h + j] = cache_at[dd * win_h + j + m]

    @cuda.jit(device=True, inline=True)
    def load_rows(x, fresh, first, shift, hw_in, w_in):
        """Load the last ``shift`` window rows (of every window depth) of the window whose
        first element is ``x[first]``."""
        for dd in range(win_d):
            for j in range(win_h):
                if j >= win_h - shift:
                    for k in range(win_w):
                        fresh[(dd * win_h + j) * win_w + k] = x[uint32(
                            first + dd * hw_in + j * w_in + k)]

    @cuda.jit(device=True, inline=True)
    def absorb(fresh, cache_raw, cache_at, first, shift, hw_in, w_in):
        """Row maxima of the loaded rows into their cache slots."""
        for dd in range(win_d):
            for j in range(win_h):
                if j >= win_h - shift:
                    base = (dd * win_h + j) * win_w
                    row_at = uint32(first + dd * hw_in + j * w_in)
                    best_raw = fresh[base]
                    best = load(best_raw)
                    best_at = row_at
                    for k in range(1, win_w):
                        value = load(fresh[base + k])
                        if _takes_over_fast(best, value):
                            best, best_raw = value, fresh[base + k]
                            best_at = uint32(row_at + k)
                    cache_raw[dd * win_h + j] = best_raw
                    cache_at[dd * win_h + j] = best_at

    @cuda.jit(device=True, inline=True)
    def combine(cache_raw, cache_at):
        """The window's first max (first NaN) from its row maxima, in row order."""
        best_raw = cache_raw[0]
        best = load(best_raw)
        best_at = cache_at[0]
        for q in range(1, slots):
            value = load(cache_raw[q])
            if _takes_over_fast(best, value):
                best, best_raw, best_at = value, cache_raw[q], cache_at[q]
        return best_raw, best_at

    return slide, load_rows, absorb, combine


def _make_forward_rows(load, torch_start, storage, window):
    """Fast forward kernel for one element kind and one compile-time window (kd, kh, kw)
    in FAST_WINDOWS that keeps *row maxima* in registers across a thread's run of rows.

    The max over a window equals the max over its rows' maxima combined in row order with
    the same rule (each row max is that row's first max / first NaN; a later row takes
    over only if strictly greater, or NaN while the running max is not), so ties and NaN
    keep their row-major meaning. Consecutive output rows ``oh`` of one column share
    ``kh - (sh' - sh)`` window rows: those row maxima (value + offset, per depth of the
    window) slide down the register cache and only the rows that entered the window are
    loaded (2-D k3 at alpha 1.39: ~4.8 loads per output instead of 9). The cache is reset
    at every new depth or plane. The slide and the loads are unrolled (constant slots),
    with the row count ``shift`` uniform across a warp (a warp shares its rows). 16 rows
    per thread (docs/design/fractional_max_pool.md has the comparison with the unrolled
    window)."""
    win_d, win_h, win_w = window
    slots = win_d * win_h
    fresh_size = slots * win_w
    slide, load_rows, absorb, combine = _make_row_cache(load, storage, window)

    def fractional_max_pool_fw_rows(x, y, indices, samples, dims, sample_strides, windows,
                                    multipliers, shifts, rows_per_thread):
        """As ``fractional_max_pool_fw_fast``; ``windows[:3]`` equals ``window``."""
        channels = dims[1]
        d_in, h_in, w_in = dims[2], dims[3], dims[4]
        d_out, h_out, w_out = dims[5], dims[6], dims[7]
        kd, kh, kw, placement = windows[0], windows[1], windows[2], windows[3]
        hw_in = h_in * w_in
        plane_size = d_in * hw_in
        out_hw = h_out * w_out
        out_plane = d_out * out_hw
        total_rows = dims[0] * channels * d_out * h_out
        ms_d, ms_h, ms_w = d_in - kd, h_in - kh, w_in - kw
        last_d, last_h, last_w = d_out - 1, h_out - 1, w_out - 1
        baracuda = placement == PLACEMENT_BARACUDA
        group_step = int64(cuda.gridDim.y) * cuda.blockDim.y
        cache_raw = cuda.local.array(slots, storage)  # registers: constant indices only
        cache_at = cuda.local.array(slots, uint32)
        fresh = cuda.local.array(fresh_size, storage)
        ow = int64(cuda.blockIdx.x) * cuda.blockDim.x + cuda.threadIdx.x
        while ow < w_out:
            group = int64(cuda.blockIdx.y) * cuda.blockDim.y + cuda.threadIdx.y
            while group * rows_per_thread < total_rows:
                row = group * rows_per_thread
                row_end = min(row + rows_per_thread, total_rows)
                rest = int64(uint32(row) // uint32(h_out))
                oh = row - rest * h_out
                plane = int64(uint32(rest) // uint32(d_out))
                od = rest - plane * d_out
                new_plane = True
                new_depth = True
                alpha_d = alpha_h = float32(0.0)
                thr_d = thr_h = sd = x_col = y_plane = int64(0)
                cached_sh = int64(-1)  # window start of the cached rows; -1: none
                while row < row_end:
                    if new_plane:
                        n = int64(uint32(plane) // uint32(channels))
                        c = plane - n * channels
                        sample_base = n * sample_strides[0] + c * sample_strides[1]
                        if sample_strides[3] >= 0:
                            alpha_d = clamp_sample(samples[sample_base + sample_strides[3]
                                                           * sample_strides[2]])
                        alpha_h = clamp_sample(samples[sample_base + sample_strides[4]
                                                       * sample_strides[2]])
                        alpha_w = clamp_sample(samples[sample_base + sample_strides[5]
                                                       * sample_strides[2]])
                        if baracuda:
                            thr_d = baracuda_threshold(alpha_d, ms_d, last_d)
                            thr_h = baracuda_threshold(alpha_h, ms_h, last_h)
                            sw = baracuda_start_fast(
                                ow, ms_w, last_w, baracuda_threshold(alpha_w, ms_w, last_w),
                                multipliers[2], shifts[2])
                        else:
                            sw = torch_start(ow, w_out, w_in, kw, alpha_w)
                        x_col = plane * plane_size + sw
                        y_plane = plane * out_plane + ow
                        new_plane = False
                        cached_sh = -1
                    if new_depth:
                        if baracuda:
                            sd = baracuda_start_fast(od, ms_d, last_d, thr_d, multipliers[0],
                                                     shifts[0])
                        else:
                            sd = torch_start(od, d_out, d_in, kd, alpha_d)
                        new_depth = False
                        cached_sh = -1
                    if baracuda:
                        sh = baracuda_start_fast(oh, ms_h, last_h, thr_h, multipliers[1],
                                                 shifts[1])
                    else:
                        sh = torch_start(oh, h_out, h_in, kh, alpha_h)
                    shift = int64(win_h)
                    if cached_sh >= 0 and sh >= cached_sh:  # (starts never decrease)
                        shift = min(sh - cached_sh, shift)
                    cached_sh = sh
                    slide(cache_raw, cache_at, shift)
                    first = uint32(x_col + sd * hw_in + sh * w_in)
                    load_rows(x, fresh, first, shift, hw_in, w_in)  # before any compare
                    absorb(fresh, cache_raw, cache_at, first, shift, hw_in, w_in)
                    best_raw, best_at = combine(cache_raw, cache_at)
                    out_at = uint32(y_plane + od * out_hw + oh * w_out)
                    y[out_at] = best_raw
                    indices[out_at] = int64(best_at)
                    row += 1
                    oh += 1
                    if oh == h_out:
                        oh = 0
                        od += 1
                        new_depth = True
                        if od == d_out:
                            od = 0
                            plane += 1
                            new_plane = True
                group += group_step
            ow += int64(cuda.gridDim.x) * cuda.blockDim.x

    return fractional_max_pool_fw_rows



def _make_forward_rows32(load, torch_start, storage, window):
    """``_make_forward_rows`` with every offset, counter and window start a uint32 value
    (uint32 operands throughout, so LLVM keeps the adds 32-bit and each address is one
    wide multiply; the int64 version spent ~6 instructions per load on 64-bit adds and
    masks, Nsight Compute / SASS)."""
    win_d, win_h, win_w = window
    slots = win_d * win_h
    fresh_size = slots * win_w
    slide, _, _, combine = _make_row_cache(load, storage, window)
    plane_setup = _make_plane_setup(torch_start)

    @cuda.jit(device=True, inline=True)
    def load_rows(x, fresh, first, shift, hw_in, w_in):
        """Load the last ``shift`` window rows (of every window depth)."""
        for dd in range(win_d):
            for j in range(win_h):
                if shift >= uint32(win_h - j):
                    # uint64(first) + a loop-invariant uint64 row offset: one wide multiply
                    # per row and the column in the load's immediate (a uint32 sum here is
                    # widened back by LLVM into 64-bit adds and masks, 6 SASS per load)
                    row_at = uint64(first) + (uint64(dd) * uint64(hw_in)
                                              + uint64(j) * uint64(w_in))
                    for k in range(win_w):
                        fresh[(dd * win_h + j) * win_w + k] = x[row_at + uint64(k)]

    @cuda.jit(device=True, inline=True)
    def absorb(fresh, cache_raw, cache_at, first, shift, hw_in, w_in):
        """Row maxima of the loaded rows into their cache slots."""
        for dd in range(win_d):
            for j in range(win_h):
                if shift >= uint32(win_h - j):
                    base = (dd * win_h + j) * win_w
                    best_raw = fresh[base]
                    best = load(best_raw)
                    best_k = uint32(0)
                    for k in range(1, win_w):
                        value = load(fresh[base + k])
                        if _takes_over_fast(best, value):
                            best, best_raw, best_k = value, fresh[base + k], uint32(k)
                    cache_at[dd * win_h + j] = uint32(first + uint32(dd) * hw_in
                                                      + uint32(j) * w_in + best_k)
                    cache_raw[dd * win_h + j] = best_raw

    @cuda.jit(device=True, inline=True)
    def window_start(o, baracuda, max_start, last, threshold, multiplier, shift, out, extent,
                     window_size, alpha):
        if baracuda:
            return baracuda_start32(o, max_start, last, threshold, multiplier, shift)
        return uint32(torch_start(int64(o), out, extent, window_size, alpha))

    def fractional_max_pool_fw_rows32(x, y, indices, samples, dims, sample_strides, windows,
                                      multipliers, shifts, rows_per_thread):
        """As ``fractional_max_pool_fw_fast``; ``windows[:3]`` equals ``window``."""
        d_in, h_in, w_in = uint32(dims[2]), uint32(dims[3]), uint32(dims[4])
        d_out, h_out, w_out = uint32(dims[5]), uint32(dims[6]), uint32(dims[7])
        kd, kh = windows[0], windows[1]
        hw_in = uint32(h_in * w_in)
        plane_size = uint32(d_in * hw_in)
        out_hw = uint32(h_out * w_out)
        out_plane = uint32(d_out * out_hw)
        total_rows = uint32(dims[0] * dims[1] * dims[5] * dims[6])
        ms_d, ms_h = uint32(dims[2] - kd), uint32(dims[3] - kh)
        last_d, last_h = uint32(dims[5] - 1), uint32(dims[6] - 1)
        baracuda = windows[3] == PLACEMENT_BARACUDA
        run = uint32(rows_per_thread)
        group_step = uint32(cuda.gridDim.y * cuda.blockDim.y)
        cache_raw = cuda.local.array(slots, storage)  # registers: constant indices only
        cache_at = cuda.local.array(slots, uint32)
        fresh = cuda.local.array(fresh_size, storage)
        ow = uint32(cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x)
        while ow < w_out:
            group = uint32(cuda.blockIdx.y * cuda.blockDim.y + cuda.threadIdx.y)
            while int64(group) * run < total_rows:
                row = uint32(group * run)
                row_end = uint32(min(int64(row) + run, int64(total_rows)))
                rest = uint32(row // h_out)
                oh = uint32(row - uint32(rest * h_out))
                plane = uint32(rest // d_out)
                od = uint32(rest - uint32(plane * d_out))
                new_plane = True
                new_depth = True
                cached = False
                alpha_d = alpha_h = float32(0.0)
                thr_d = thr_h = sd = x_col = y_plane = cached_sh = uint32(0)
                while row < row_end:
                    if new_plane:
                        alpha_d, alpha_h, thr_d, thr_h, sw = plane_setup(
                            int64(plane), samples, dims, sample_strides, windows, int64(ow),
                            multipliers[2], shifts[2])
                        x_col = uint32(uint32(plane * plane_size) + sw)
                        y_plane = uint32(uint32(plane * out_plane) + ow)
                        new_plane = False
                        cached = False
                    if new_depth:
                        sd = window_start(od, baracuda, ms_d, last_d, thr_d, multipliers[0],
                                          shifts[0], dims[5], dims[2], kd, alpha_d)
                        new_depth = False
                        cached = False
                    sh = window_start(oh, baracuda, ms_h, last_h, thr_h, multipliers[1],
                                      shifts[1], dims[6], dims[3], kh, alpha_h)
                    shift = uint32(win_h)
                    if cached and sh >= cached_sh:  # (starts never decrease)
                        shift = min(uint32(sh - cached_sh), shift)
                    cached_sh = sh
                    cached = True
                    slide(cache_raw, cache_at, shift)
                    first = uint32(x_col + uint32(sd * hw_in) + uint32(sh * w_in))
                    load_rows(x, fresh, first, shift, hw_in, w_in)  # before any compare
                    absorb(fresh, cache_raw, cache_at, first, shift, hw_in, w_in)
                    best_raw, best_at = combine(cache_raw, cache_at)
                    out_at = uint32(y_plane + uint32(od * out_hw) + uint32(oh * w_out))
                    y[out_at] = best_raw
                    indices[out_at] = int64(best_at)
                    row = uint32(row + uint32(1))
                    oh = uint32(oh + uint32(1))
                    if oh == h_out:
                        oh = uint32(0)
                        od = uint32(od + uint32(1))
                        new_depth = True
                        if od == d_out:
                            od = uint32(0)
                            plane = uint32(plane + uint32(1))
                            new_plane = True
                group = uint32(group + group_step)
            ow = uint32(ow + uint32(cuda.gridDim.x * cuda.blockDim.x))

    return fractional_max_pool_fw_rows32


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
def _first_choice_offset(rem, dl, d_table, h_table, w_table, od_lo, oh_lo, staged_h, w_in,
                         w_out, m_row, s_row):
    """Staged offset of the first candidate output of the tile element at depth ``dl``,
    offset ``rem`` in that depth (row ``rem // w_in``, column ``rem % w_in``)."""
    hl = uint32(fast_div(rem, m_row, s_row))
    w = uint32(rem - hl * w_in)
    return uint32(uint32(uint32((d_table[dl] & _FIRST_MASK) - od_lo) * staged_h
                         + (h_table[hl] & _FIRST_MASK) - oh_lo) * w_out
                  + (w_table[w] & _FIRST_MASK))


@cuda.jit(device=True, inline=True)
def _sum_choices_fused(masks, dy_stage, deltas, d_table, h_table, w_table, dx, tile_origin,
                       tile_slots, depth_elems, run, hw_in, od_lo, oh_lo, staged_h, w_in,
                       w_out, m_row, s_row, load, store, zero):
    """Phase 2 of the tiled backward as one loop per thread over its mask slots
    ``e = tid, tid + threads, ...`` (slot ``e`` = depth ``e // depth_elems``, offset
    ``rem``; offsets from ``run`` on are rows past the tile's end: never chosen, never
    stored). Each step either adds the dy of the current element's lowest remaining bit
    or, once no bit is left, stores the element and loads the next mask: the same sums
    in the same order as the per-element loop."""
    threads = uint32(cuda.blockDim.x)
    e = uint32(cuda.threadIdx.x)
    rem = e
    dl = uint32(0)
    while rem >= depth_elems:
        rem = uint32(rem - depth_elems)
        dl = uint32(dl + 1)
    chosen = uint32(0)
    base = uint32(0)
    total = zero
    if e < tile_slots:
        chosen = masks[e]
        if chosen != 0:
            base = _first_choice_offset(rem, dl, d_table, h_table, w_table, od_lo, oh_lo,
                                        staged_h, w_in, w_out, m_row, s_row)
    while e < tile_slots:
        if chosen != 0:
            bit, chosen = _pop_lowest_bit(chosen)
            total += load(dy_stage[uint32(base + deltas[bit])])
        else:
            if rem < run:
                dx[uint32(tile_origin + dl * hw_in + rem)] = store(total)
            total = zero
            e = uint32(e + threads)
            rem = uint32(rem + threads)
            while rem >= depth_elems:
                rem = uint32(rem - depth_elems)
                dl = uint32(dl + 1)
            if e < tile_slots:
                chosen = masks[e]
                if chosen != 0:
                    base = _first_choice_offset(rem, dl, d_table, h_table, w_table, od_lo,
                                                oh_lo, staged_h, w_in, w_out, m_row, s_row)


def _make_backward_tiled(load, store, zero, storage, tile_cap, stage_cap, fused):
    """Tiled backward kernel for one element kind: no float atomics, no pre-zeroed dx,
    every dx element written once with a coalesced store.

    A block owns a dx *tile* of one plane: input depths [d0, d1) x rows [h0, h1) x all
    columns (at most ``tile_cap`` elements). The outputs whose window may contain a tile
    element (the tile's sample-free candidate box: whole output rows, contiguous per
    output depth, at most ``stage_cap``) are staged, dy into shared memory; each element
    ``i`` of the tile gets a 32-bit mask in shared memory of the candidate outputs of
    ``i`` that chose it::

        bit(o) = ((od - od_first(i)) * reach_h + (oh - oh_first(i))) * reach_w + ow - ow_first(i)

    (``reach_a`` = the most candidates one coordinate has on axis ``a``; the plan uses
    this kernel only for the BARACUDA placement and ``reach_d * reach_h * reach_w <= 32``).
    1. Zero the masks and fill shared tables of the packed candidate range of every
       column and of the tile's rows and depths; each staged output o whose saved index i
       lies in the tile and that is a candidate of i (else the index is foreign and
       ignored) sets its bit with an integer ``atomic_or``: OR is commutative, so the
       masks do not depend on the order of the calls.
    2. Each tile element sums dy over the set bits of its mask in ascending bit order,
       which is ascending (od, oh, ow) order, in the accumulate type, and writes dx (0
       where no output chose it). A bit's staged offset relative to the element's first
       candidate is a per-tile table. ``fused``: each thread walks its elements and
       their bits in one loop (an element with no bit left is stored and the thread moves
       on while others still sum), instead of one element per pass with the pass as long
       as its lane with the most bits: local maxima are chosen by up to ~10 outputs in 3-D,
       and a warp then waited on a few lanes.
    Same (o, i) pairs, same order and same accumulate type as the gather: bit-identical
    to it, deterministic. All per-element arithmetic is 32-bit (the plan requires
    offsets below 2^31 on this path): Nsight Compute showed the previous 64-bit version
    issue-bound at ~330 instructions per staged output and element."""

    def fractional_max_pool_bw_tiled(dy, indices, dx, dims, windows, multipliers, shifts,
                                     tiles):
        """multipliers/shifts: magic divisors of (ms_d, ms_h, ms_w, w_in, h_in*w_in, w_out,
        ...); tiles = (tile_d, tile_h, tiles_d, tiles_h, total_tiles, reach_h, reach_w,
        ...). dy, indices, dx row-major contiguous; one block per tile (grid-strided)."""
        masks = cuda.shared.array(tile_cap, uint32)
        dy_stage = cuda.shared.array(stage_cap, storage)
        w_table = cuda.shared.array(BW_TABLE_W, uint32)
        h_table = cuda.shared.array(BW_TABLE_H, uint32)
        d_table = cuda.shared.array(BW_TABLE_D, uint32)
        deltas = cuda.shared.array(BW_MASK_BITS, uint32)
        d_in, h_in, w_in = dims[2], dims[3], dims[4]
        d_out, h_out, w_out = dims[5], dims[6], dims[7]
        kd, kh, kw = windows[0], windows[1], windows[2]
        hw_in = uint32(h_in * w_in)
        out_hw = uint32(h_out * w_out)
        out_plane = uint32(d_out * out_hw)
        w_in32 = uint32(w_in)
        w_out32 = uint32(w_out)
        total_tiles = tiles[4]
        reach_h, reach_w = tiles[5], tiles[6]
        m_d, m_h, m_w = multipliers[0], multipliers[1], multipliers[2]
        s_d, s_h, s_w = shifts[0], shifts[1], shifts[2]
        m_row, s_row = multipliers[3], shifts[3]
        m_depth, s_depth = multipliers[4], shifts[4]
        m_wout, s_wout = multipliers[5], shifts[5]
        tid = uint32(cuda.threadIdx.x)
        threads = uint32(cuda.blockDim.x)
        _fill_candidates(w_table, int64(0), w_in, w_in, kw, w_out, m_w, s_w)
        tile = int64(cuda.blockIdx.x)
        while tile < total_tiles:
            (plane, d0, d1, h0, h1, od_lo, od_hi, oh_lo, staged_h, row_len, tile_origin,
             tile_rows, tile_depths, tile_span, depth_elems) = _tile_box(
                tile, tiles, dims, windows, multipliers, shifts)
            j = tid
            while j < tile_depths * depth_elems:
                masks[j] = uint32(0)
                j = uint32(j + threads)
            _fill_candidates(h_table, h0, h1 - h0, h_in, kh, h_out, m_h, s_h)
            _fill_candidates(d_table, d0, d1 - d0, d_in, kd, d_out, m_d, s_d)
            if tid < BW_MASK_BITS:  # bit (dd, dh, dw) -> staged offset from the first
                bit_w = tid % reach_w
                bit_h = (tid // reach_w) % reach_h
                bit_d = tid // (reach_w * reach_h)
                deltas[tid] = uint32((bit_d * staged_h + bit_h) * w_out32 + bit_w)
            cuda.syncthreads()
            # 1. stage dy, mark each choice in its element's mask
            stage_at = uint32(0)
            o_d = od_lo
            while o_d < od_hi:
                src = uint32(plane * out_plane + o_d * out_hw + oh_lo * w_out)
                s = tid
                while s < row_len:  # two independent index and dy loads per pass
                    s1 = uint32(s + threads)
                    at1 = uint32(src + min(s1, uint32(row_len - 1)))
                    target0 = indices[uint32(src + s)]
                    target1 = indices[at1]
                    raw0 = dy[uint32(src + s)]
                    raw1 = dy[at1]
                    dy_stage[uint32(stage_at + s)] = raw0
                    _mark_choice(masks, target0, s, o_d, oh_lo, tile_origin, tile_span,
                                 hw_in, w_in32, depth_elems, tile_rows, w_table, h_table,
                                 d_table, reach_h, reach_w, m_wout, s_wout, w_out32,
                                 m_row, s_row, m_depth, s_depth)
                    if s1 < row_len:
                        dy_stage[uint32(stage_at + s1)] = raw1
                        _mark_choice(masks, target1, s1, o_d, oh_lo, tile_origin,
                                     tile_span, hw_in, w_in32, depth_elems, tile_rows,
                                     w_table, h_table, d_table, reach_h, reach_w, m_wout,
                                     s_wout, w_out32, m_row, s_row, m_depth, s_depth)
                    s = uint32(s + 2 * threads)
                stage_at = uint32(stage_at + row_len)
                o_d += 1
            cuda.syncthreads()
            # 2. sum the chosen dy of every element in ascending output order; write dx
            run = uint32(tile_rows * w_in32)  # valid elements per tile depth
            if fused:
                _sum_choices_fused(masks, dy_stage, deltas, d_table, h_table, w_table, dx,
                                   tile_origin, uint32(tile_depths * depth_elems),
                                   depth_elems, run, hw_in, od_lo, oh_lo, staged_h,
                                   w_in32, w_out32, m_row, s_row, load, store, zero)
            else:
                dl = uint32(0)
                while dl < tile_depths:
                    dst = uint32(tile_origin + dl * hw_in)
                    from_at = uint32(dl * depth_elems)
                    j = tid
                    while j < run:
                        chosen = masks[uint32(from_at + j)]
                        total = zero
                        if chosen != 0:
                            base = _first_choice_offset(j, dl, d_table, h_table, w_table,
                                                        od_lo, oh_lo, staged_h, w_in32,
                                                        w_out32, m_row, s_row)
                            while chosen != 0:
                                bit, chosen = _pop_lowest_bit(chosen)
                                total += load(dy_stage[uint32(base + deltas[bit])])
                        dx[uint32(dst + j)] = store(total)
                        j = uint32(j + threads)
                    dl = uint32(dl + 1)
            cuda.syncthreads()
            tile += cuda.gridDim.x

    return fractional_max_pool_bw_tiled


def _make_backward_listed(load, store, storage, loads):
    """Tiled backward with a list of chosen elements (f16/bf16/f32: f32 sums), tiles in
    dynamic shared memory (sized by the plan, above 48 KiB where it helps).

    Same tiles, staging, masks and candidate tables as ``_make_backward_tiled``, but
    phase 2 visits only the elements some output chose: when an output's mark turns its
    element's mask from 0 to non-zero, the element's packed tile coordinates are appended
    to a list (an integer ``atomic_add`` on a shared counter; the list's order varies, its
    content does not). Then each thread takes list entries, sums dy over the entry's bits
    in ascending bit = output order (f32, from +0.0: the gather's sum) and writes the
    sum's bits over the entry's mask; a last pass writes the whole tile to dx, coalesced,
    reading each slot as f32 (an unchosen element's mask is 0 = +0.0, the gather's empty
    sum). Bit-identical to the gather. The per-element phase 2 of the other tiled kernel
    runs a warp as long as its lane with the most bits while ~3 of 32 lanes have any in
    3-D (~10% of the elements are chosen); here all lanes hold chosen elements.

    Phase 1 walks the tile's staged box as one range, ``loads`` (2 or 4) independent
    index and dy loads per pass (the static kernel's loop per output depth waits for one
    round trip per depth: ~10 in sequence for a 3-D tile).

    Dynamic shared memory (``words`` = u32 view, ``stage`` = storage view of the same
    bytes): masks at [0, tile slots), list at [list_at, list_at + staged cap),
    staged dy from ``stage_from`` (storage units)."""

    def fractional_max_pool_bw_listed(dy, indices, dx, dims, windows, multipliers, shifts,
                                      tiles):
        """As ``fractional_max_pool_bw_tiled``; windows = (kd, kh, kw, placement, list_at,
        stage_from, 0, 0)."""
        words = cuda.shared.array(0, uint32)
        stage = cuda.shared.array(0, storage)
        listed_count = cuda.shared.array(1, uint32)
        w_table = cuda.shared.array(BW_TABLE_W, uint32)
        h_table = cuda.shared.array(BW_TABLE_H, uint32)
        d_table = cuda.shared.array(BW_TABLE_D, uint32)
        deltas = cuda.shared.array(BW_MASK_BITS, uint32)
        d_in, h_in, w_in = dims[2], dims[3], dims[4]
        d_out, h_out, w_out = dims[5], dims[6], dims[7]
        kd, kh, kw = windows[0], windows[1], windows[2]
        list_at = uint32(windows[4])
        stage_from = uint32(windows[5])
        hw_in = uint32(h_in * w_in)
        out_hw = uint32(h_out * w_out)
        out_plane = uint32(d_out * out_hw)
        w_in32 = uint32(w_in)
        w_out32 = uint32(w_out)
        total_tiles = tiles[4]
        reach_h, reach_w = tiles[5], tiles[6]
        m_d, m_h, m_w = multipliers[0], multipliers[1], multipliers[2]
        s_d, s_h, s_w = shifts[0], shifts[1], shifts[2]
        m_row, s_row = multipliers[3], shifts[3]
        m_depth, s_depth = multipliers[4], shifts[4]
        m_wout, s_wout = multipliers[5], shifts[5]
        tid = uint32(cuda.threadIdx.x)
        threads = uint32(cuda.blockDim.x)
        _fill_candidates(w_table, int64(0), w_in, w_in, kw, w_out, m_w, s_w)
        tile = int64(cuda.blockIdx.x)
        while tile < total_tiles:
            (plane, d0, d1, h0, h1, od_lo, od_hi, oh_lo, staged_h, row_len, tile_origin,
             tile_rows, tile_depths, tile_span, depth_elems) = _tile_box(
                tile, tiles, dims, windows, multipliers, shifts)
            j = tid
            while j < tile_depths * depth_elems:
                words[j] = uint32(0)
                j = uint32(j + threads)
            if tid == 0:
                listed_count[0] = uint32(0)
            _fill_candidates(h_table, h0, h1 - h0, h_in, kh, h_out, m_h, s_h)
            _fill_candidates(d_table, d0, d1 - d0, d_in, kd, d_out, m_d, s_d)
            if tid < BW_MASK_BITS:  # bit (dd, dh, dw) -> staged offset from the first
                bit_w = tid % reach_w
                bit_h = (tid // reach_w) % reach_h
                bit_d = tid // (reach_w * reach_h)
                deltas[tid] = uint32((bit_d * staged_h + bit_h) * w_out32 + bit_w)
            cuda.syncthreads()
            # 1. stage dy, mark each choice in its element's mask, list new elements. The
            #    staged box (n_od output depths x row_len outputs) is walked as one range
            #    s = dd * row_len + r, ``loads`` outputs per pass, (dd, r) advanced by
            #    ``threads`` without dividing: every load of a pass is independent.
            staged_total = uint32(uint32(od_hi - od_lo) * row_len)
            out_base = uint32(plane * out_plane + od_lo * out_hw + oh_lo * w_out)
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
                if loads == 4:
                    s2 = uint32(s1 + threads)
                    dd2, r2 = _advance(dd1, r1, step_dd, step_r, row_len)
                    s3 = uint32(s2 + threads)
                    dd3, r3 = _advance(dd2, r2, step_dd, step_r, row_len)
                    at2 = at0 if s2 >= staged_total else uint32(out_base + dd2 * out_hw + r2)
                    at3 = at0 if s3 >= staged_total else uint32(out_base + dd3 * out_hw + r3)
                    target2 = indices[at2]
                    target3 = indices[at3]
                    raw2 = dy[at2]
                    raw3 = dy[at3]
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
                if loads == 4:
                    if s2 < staged_total:
                        stage[uint32(stage_from + s2)] = raw2
                        _mark_listed(words, listed_count, list_at, target2, r2,
                                     uint32(od_lo + dd2), oh_lo, tile_origin, tile_span,
                                     hw_in, w_in32, depth_elems, tile_rows, w_table, h_table,
                                     d_table, reach_h, reach_w, m_wout, s_wout, w_out32,
                                     m_row, s_row, m_depth, s_depth)
                    if s3 < staged_total:
                        stage[uint32(stage_from + s3)] = raw3
                        _mark_listed(words, listed_count, list_at, target3, r3,
                                     uint32(od_lo + dd3), oh_lo, tile_origin, tile_span,
                                     hw_in, w_in32, depth_elems, tile_rows, w_table, h_table,
                                     d_table, reach_h, reach_w, m_wout, s_wout, w_out32,
                                     m_row, s_row, m_depth, s_depth)
                    s = uint32(s3 + threads)
                    dd, r = _advance(dd3, r3, step_dd, step_r, row_len)
                else:
                    s = uint32(s1 + threads)
                    dd, r = _advance(dd1, r1, step_dd, step_r, row_len)
            cuda.syncthreads()
            # 2. each listed element: sum its chosen dy in ascending output order, keep
            #    the f32 sum's bits in its mask slot
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
                    total += load(stage[uint32(base + deltas[bit])])
                words[slot] = bitcast(total, uint32)
                k = uint32(k + threads)
            cuda.syncthreads()
            # 3. write the tile: whole rows, coalesced
            run = uint32(tile_rows * w_in32)  # valid elements per tile depth
            dl = uint32(0)
            while dl < tile_depths:
                dst = uint32(tile_origin + dl * hw_in)
                from_at = uint32(dl * depth_elems)
                j = tid
                while j < run:
                    dx[uint32(dst + j)] = store(bitcast(words[uint32(from_at + j)], float32))
                    j = uint32(j + threads)
                dl = uint32(dl + 1)
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
    """Geometry of dx tile ``tile`` of the tiled backward kernels: its plane, input depths
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
def _mark_choice(masks, target, staged, od, oh_lo, tile_origin, tile_span, hw_in, w_in,
                 depth_elems, tile_rows, w_table, h_table, d_table, reach_h, reach_w,
                 m_wout, s_wout, w_out, m_row, s_row, m_depth, s_depth):
    """Set the bit of a staged output's choice (``_choice_bit``) in its element's mask.
    Integer OR: the masks do not depend on the order of the calls."""
    slot, bit_mask, _ = _choice_bit(target, staged, od, oh_lo, tile_origin, tile_span,
                                    hw_in, w_in, depth_elems, tile_rows, w_table, h_table,
                                    d_table, reach_h, reach_w, m_wout, s_wout, w_out, m_row,
                                    s_row, m_depth, s_depth)
    if bit_mask != 0:
        cuda.atomic.or_(masks, slot, bit_mask)


@cuda.jit(device=True, inline=True)
def _mark_listed(words, listed_count, list_at, target, staged, od, oh_lo, tile_origin,
                 tile_span, hw_in, w_in, depth_elems, tile_rows, w_table, h_table, d_table,
                 reach_h, reach_w, m_wout, s_wout, w_out, m_row, s_row, m_depth, s_depth):
    """``_mark_choice`` that also appends the element's packed coordinates to the tile's
    list of chosen elements when its mask was empty (integer atomics: the set of listed
    elements does not depend on the order, only their positions do)."""
    slot, bit_mask, packed = _choice_bit(target, staged, od, oh_lo, tile_origin, tile_span,
                                         hw_in, w_in, depth_elems, tile_rows, w_table,
                                         h_table, d_table, reach_h, reach_w, m_wout, s_wout,
                                         w_out, m_row, s_row, m_depth, s_depth)
    if bit_mask != 0:
        if cuda.atomic.or_(words, slot, bit_mask) == 0:
            at = cuda.atomic.add(listed_count, 0, uint32(1))
            words[uint32(list_at + at)] = packed


# -- the dtype table -------------------------------------------------------------------------

_TUPLE8 = types.UniTuple(int64, 8)


def _dense(storage):
    """A flat, unit-stride device view (``flat`` with C layout: the kernels never need the
    array's byte stride, which saves a register and a multiply per access)."""
    return types.Array(storage, 1, "C")


#: element -> (storage type, widen to compare/accumulate type, narrow back, zero of the
#: accumulate type, PyTorch placement arithmetic).
FRACTIONAL_MAX_POOL_TABLE = {
    ElementKind.F16: (float16, _load_f16, _store_f16, float32(0.0), torch_window_start_f32),
    ElementKind.BF16: (uint16, bf16_to_f32, f32_to_bf16, float32(0.0), torch_window_start_f32),
    ElementKind.F32: (float32, _same, _same, float32(0.0), torch_window_start_f32),
    ElementKind.F64: (float64, _same, _same, float64(0.0), torch_window_start_f64),
}

FRACTIONAL_MAX_POOL_ELEMENTS = tuple(FRACTIONAL_MAX_POOL_TABLE)


def _signature(storage):
    return (_dense(storage), _dense(storage), _dense(int64), flat(float32), _TUPLE8, _TUPLE8,
            _TUPLE8, _TUPLE8, _TUPLE8, _TUPLE8, int64)


def _backward_signature(storage):
    return (_dense(storage), _dense(int64), _dense(storage), _TUPLE8, _TUPLE8, _TUPLE8, _TUPLE8,
            _TUPLE8, int64)


FRACTIONAL_MAX_POOL_FW_KERNELS = {
    element: Kernel(f"fractional_max_pool_fw[{element.name}]",
                    _make_forward(load, torch_start),
                    _signature(storage), grid_stride=True)
    for element, (storage, load, _store, _zero, torch_start)
    in FRACTIONAL_MAX_POOL_TABLE.items()
}

FRACTIONAL_MAX_POOL_BW_KERNELS = {
    element: Kernel(f"fractional_max_pool_bw[{element.name}]",
                    _make_backward(load, store, zero),
                    _backward_signature(storage), grid_stride=True)
    for element, (storage, load, store, zero, _torch_start)
    in FRACTIONAL_MAX_POOL_TABLE.items()
}


def _fast_signature(storage):
    return (_dense(storage), _dense(storage), _dense(int64), flat(float32), _TUPLE8, _TUPLE8,
            _TUPLE8, _TUPLE8, _TUPLE8, int64)


def _fast_backward_signature(storage):
    return (_dense(storage), _dense(int64), _dense(storage), _TUPLE8, _TUPLE8, _TUPLE8,
            _TUPLE8, int64)


def _window_name(window):
    return "any" if window is None else "x".join(map(str, window))


#: (element, window (kd, kh, kw) in FAST_WINDOWS, or None for any window) -> kernel with
#: the window walked by ``_make_window_max`` (unrolled, or looped for None).
FRACTIONAL_MAX_POOL_FW_FAST_KERNELS = {
    (element, window): Kernel(
        f"fractional_max_pool_fw_fast[{element.name},{_window_name(window)}]",
        _make_forward_fast(load, torch_start, _make_window_max(load, storage, window)),
        _fast_signature(storage), grid_stride=True)
    for element, (storage, load, _store, _zero, torch_start)
    in FRACTIONAL_MAX_POOL_TABLE.items()
    for window in (None,) + FAST_WINDOWS
}

#: (walk, element, window in FAST_WINDOWS) -> the row-caching forward: walk "rows32" (32-bit
#: offsets, the default for these windows) or "rows" (64-bit offsets).
FRACTIONAL_MAX_POOL_FW_ROWS_KERNELS = {
    (walk, element, window): Kernel(
        f"fractional_max_pool_fw_{walk}[{element.name},{_window_name(window)}]",
        make(load, torch_start, storage, window), _fast_signature(storage), grid_stride=True)
    for walk, make in (("rows", _make_forward_rows), ("rows32", _make_forward_rows32))
    for element, (storage, load, _store, _zero, torch_start)
    in FRACTIONAL_MAX_POOL_TABLE.items()
    for window in FAST_WINDOWS
}

FRACTIONAL_MAX_POOL_BW_FAST_KERNELS = {
    element: Kernel(f"fractional_max_pool_bw_fast[{element.name}]",
                    _make_backward_fast(load, store, zero),
                    _fast_backward_signature(storage), grid_stride=True)
    for element, (storage, load, store, zero, _torch_start)
    in FRACTIONAL_MAX_POOL_TABLE.items()
}

#: element -> (tile elements, staged outputs) of the tiled backward's shared memory, below
#: the 48 KiB of static shared memory a block may hold next to the candidate tables
#: (5.5 KiB): a u32 mask per tile element, dy in storage per staged output (f16/bf16:
#: 24 + 14 KiB; f32: 20 + 20 KiB; f64: 16 + 22 KiB).
BW_TILE_CAPS = {
    ElementKind.F16: (6144, 7168),
    ElementKind.BF16: (6144, 7168),
    ElementKind.F32: (5120, 5120),
    ElementKind.F64: (4096, 2816),
}

#: The masks hold one bit per candidate output of an element.
BW_MASK_BITS = 32
#: Entries of the tiled backward's candidate tables: input columns (the whole row), tile
#: rows and tile depths (the plan falls back to the leader scatter beyond them).
BW_TABLE_W = 1024
BW_TABLE_H = 256
BW_TABLE_D = 64


def _tiled_backward_signature(storage):
    return (_dense(storage), _dense(int64), _dense(storage), _TUPLE8, _TUPLE8, _TUPLE8,
            _TUPLE8, _TUPLE8)


#: (element, fused phase 2) -> the tiled backward (see ``_make_backward_tiled``).
FRACTIONAL_MAX_POOL_BW_TILED_KERNELS = {
    (element, fused): Kernel(
        f"fractional_max_pool_bw_tiled[{element.name}{',fused' if fused else ''}]",
        _make_backward_tiled(load, store, zero, storage, *BW_TILE_CAPS[element], fused),
        _tiled_backward_signature(storage), grid_stride=True)
    for element, (storage, load, store, zero, _torch_start)
    in FRACTIONAL_MAX_POOL_TABLE.items()
    for fused in (False, True)
}


#: Elements of the listed tiled backward (f32 sums kept in the u32 mask slots).
BW_LISTED_ELEMENTS = (ElementKind.F16, ElementKind.BF16, ElementKind.F32)
#: The listed kernel's dynamic shared memory limit: sm_90 allows 227 KiB per block, of
#: which its static tables take 5.4 KiB (ptxas: 5520 bytes); kept a little below.
BW_LISTED_MAX_DYNAMIC = 220 * 1024

#: Independent loads per pass of the listed kernel's staging loop.
BW_LISTED_LOADS = (2, 4)

#: (element, loads per pass) -> the listed tiled backward (see ``_make_backward_listed``).
FRACTIONAL_MAX_POOL_BW_LISTED_KERNELS = {
    (element, loads): Kernel(
        f"fractional_max_pool_bw_listed[{element.name},{loads}]",
        _make_backward_listed(FRACTIONAL_MAX_POOL_TABLE[element][1],
                              FRACTIONAL_MAX_POOL_TABLE[element][2],
                              FRACTIONAL_MAX_POOL_TABLE[element][0], loads),
        _tiled_backward_signature(FRACTIONAL_MAX_POOL_TABLE[element][0]), grid_stride=True)
    for element in BW_LISTED_ELEMENTS
    for loads in BW_LISTED_LOADS
}
