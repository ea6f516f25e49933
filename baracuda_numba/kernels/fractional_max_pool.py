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

from numba import cuda, float32, float64, int64, types, uint16, uint64
from numba.types import float16

from ..launch import Kernel, flat
from ..types import ElementKind
from .common import bf16_to_f32, f32_to_bf16

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
