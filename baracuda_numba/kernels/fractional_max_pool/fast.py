"""Fractional max pool: the fast forward and leader-scatter backward kernels of contiguous
arrays with 32-bit offsets (magic-number division, row-caching window walks)."""

from __future__ import annotations

import math

from numba import cuda, float32, float64, int64, uint32, uint64

from .placement import PLACEMENT_BARACUDA, WINDOWS_BF16, candidate_outputs, clamp_sample

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
# load); the operands must be uint32 values themselves, and a window row is indexed as
# ``uint64(first) + row_offset`` so its columns become the loads' immediates (about a
# third fewer instructions than a 64-bit walk).


@cuda.jit(device=True, inline=True)
def _next_depth(od, plane, d_out, new_plane):
    """(od, plane) after the last output row of depth ``od``, and whether a new plane (its
    samples) starts."""
    od += 1
    if od == d_out:
        od = 0
        plane += 1
        new_plane = True
    return od, plane, new_plane


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


#: Windows (kd, kh, kw) with a row-caching forward (``_make_forward_rows32``; 2-D runs with
#: kd = 1): the windows of the benchmark rows (docs/BENCHMARKS.md); other windows (2x2
#: included) take ``fractional_max_pool_fw_fast``'s runtime loops.
FAST_WINDOWS = ((1, 3, 3), (3, 3, 3))


def _make_window_max(load):
    """Device function ``(x, first, kd, kh, kw, hw_in, w_in, bf16) -> (raw, offset)`` of the
    first maximum (first NaN) of the window whose first element is ``x[first]``, walking
    it in row-major order with runtime loops."""

    @cuda.jit(device=True, inline=True)
    def window_max_loops(x, first, kd, kh, kw, hw_in, w_in, bf16):
        # uint32 loop-carried offsets: 32-bit adds and one wide multiply per address
        # (a 64-bit expression here costs ~3x the instructions).
        best_at = first
        best_raw = x[first]
        best = load(best_raw, bf16)
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
                    value = load(raw, bf16)
                    if _takes_over_fast(best, value):
                        best, best_raw, best_at = value, raw, at
                    at = uint32(at + 1)
                row_at = uint32(row_at + w_in)
                dh += 1
            depth_at = uint32(depth_at + hw_in)
            dd += 1
        return best_raw, best_at

    return window_max_loops


def _make_forward_fast(load, torch_start, window_max, half=False):
    """Fast forward kernel for one storage kind (contiguous, 32-bit offsets) and one
    ``_make_window_max`` window walker. ``half``: the walk runs in one copy per value of
    the bf16 flag, its conversion fixed (a copy of the whole body instead took 78 instead
    of 64 registers)."""
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
        bf16 = windows[WINDOWS_BF16] != 0
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
                    if half and bf16:
                        best_raw, best_at = window_max(x, first, kd, kh, kw, hw_in, w_in, True)
                    else:
                        best_raw, best_at = window_max(x, first, kd, kh, kw, hw_in, w_in,
                                                       False)
                    out_at = uint32(y_plane + od * out_hw + oh * w_out)
                    y[out_at] = best_raw
                    indices[out_at] = int64(best_at)
                    row += 1
                    oh += 1
                    if oh == h_out:
                        oh = 0
                        new_depth = True
                        od, plane, new_plane = _next_depth(od, plane, d_out, new_plane)
                group += group_step
            ow += int64(cuda.gridDim.x) * cuda.blockDim.x

    return fractional_max_pool_fw_fast


def _make_backward_fast(load, store, zero):
    """Fast (leader-scatter) backward kernel for one storage kind; ``dx`` must be zeroed
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
        bf16 = windows[WINDOWS_BF16] != 0
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
                                            total += load(dy[other], bf16)
                                        other = uint32(other + 1)
                                    o_h += 1
                                o_d += 1
                            if leader:
                                dx[uint32(target)] = store(total, bf16)
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
    def absorb(fresh, cache_raw, cache_at, first, shift, hw_in, w_in, bf16):
        """Row maxima of the loaded rows into their cache slots."""
        for dd in range(win_d):
            for j in range(win_h):
                if shift >= uint32(win_h - j):
                    base = (dd * win_h + j) * win_w
                    best_raw = fresh[base]
                    best = load(best_raw, bf16)
                    best_k = uint32(0)
                    for k in range(1, win_w):
                        value = load(fresh[base + k], bf16)
                        if _takes_over_fast(best, value):
                            best, best_raw, best_k = value, fresh[base + k], uint32(k)
                    cache_at[dd * win_h + j] = uint32(first + uint32(dd) * hw_in
                                                      + uint32(j) * w_in + best_k)
                    cache_raw[dd * win_h + j] = best_raw

    @cuda.jit(device=True, inline=True)
    def combine(cache_raw, cache_at, bf16):
        """The window's first max (first NaN) from its row maxima, in row order."""
        best_raw = cache_raw[0]
        best = load(best_raw, bf16)
        best_at = cache_at[0]
        for q in range(1, slots):
            value = load(cache_raw[q], bf16)
            if _takes_over_fast(best, value):
                best, best_raw, best_at = value, cache_raw[q], cache_at[q]
        return best_raw, best_at

    return slide, load_rows, absorb, combine


def _make_forward_rows32(load, torch_start, storage, window, half=False):
    """Fast forward kernel for one storage kind and one compile-time window (kd, kh, kw)
    in FAST_WINDOWS that keeps *row maxima* in registers across a thread's run of rows.

    The max over a window equals the max over its rows' maxima combined in row order with
    the same rule (each row max is that row's first max / first NaN; a later row takes
    over only if strictly greater, or NaN while the running max is not), so ties and NaN
    keep their row-major meaning. Consecutive output rows ``oh`` of one column share
    ``kh - (sh' - sh)`` window rows: those row maxima (value + offset, per depth of the
    window) slide down the register cache and only the rows that entered the window are
    loaded (2-D k3 at alpha 1.39: ~4.8 loads per output instead of 9). The cache is reset
    at every new depth or plane. The slide and the loads are unrolled (constant slots),
    with the row count ``shift`` uniform across a warp (a warp shares its rows). Every
    offset, counter and window start is a uint32 value (uint32 operands throughout, so
    LLVM keeps the adds 32-bit and each address is one wide multiply). ``half``: the body
    runs in one inlined copy per value of the bf16 flag, its conversions fixed."""
    win_d, win_h, win_w = window
    slots = win_d * win_h
    fresh_size = slots * win_w
    slide, load_rows, absorb, combine = _make_row_cache(load, storage, window)
    plane_setup = _make_plane_setup(torch_start)

    @cuda.jit(device=True, inline=True)
    def window_start(o, baracuda, max_start, last, threshold, multiplier, shift, out, extent,
                     window_size, alpha):
        if baracuda:
            return baracuda_start32(o, max_start, last, threshold, multiplier, shift)
        return uint32(torch_start(int64(o), out, extent, window_size, alpha))

    @cuda.jit(device=True, inline=True)
    def _forward_rows32_body(x, y, indices, samples, dims, sample_strides, windows, multipliers,
                             shifts, rows_per_thread, bf16):
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
                    absorb(fresh, cache_raw, cache_at, first, shift, hw_in, w_in, bf16)
                    best_raw, best_at = combine(cache_raw, cache_at, bf16)
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

    def fractional_max_pool_fw_rows32(x, y, indices, samples, dims, sample_strides, windows,
                                      multipliers, shifts, rows_per_thread):
        """As ``fractional_max_pool_fw_fast``; ``windows[:3]`` equals ``window``."""
        # One copy of the body per flag value, its conversions fixed (see
        # ``placement.WINDOWS_BF16``).
        if half and windows[WINDOWS_BF16] != 0:
            _forward_rows32_body(x, y, indices, samples, dims, sample_strides, windows, multipliers,
                                 shifts, rows_per_thread, True)
        else:
            _forward_rows32_body(x, y, indices, samples, dims, sample_strides, windows, multipliers,
                                 shifts, rows_per_thread, False)

    return fractional_max_pool_fw_rows32
