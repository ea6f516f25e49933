"""Fractional max pool: the general forward gather and backward gather (any strides,
64-bit offsets)."""

from __future__ import annotations

from numba import cuda, float32, int64, uint64

from .placement import (
    PLACEMENT_BARACUDA,
    WINDOWS_BF16,
    _takes_over,
    baracuda_window_start,
    candidate_outputs,
    clamp_sample,
)

# -- kernels ---------------------------------------------------------------------------------


def _make_forward(load, torch_start):
    """Forward kernel for one storage kind: ``load(raw, bf16)`` widens storage to the
    compare type."""

    @cuda.jit(device=True, inline=True)
    def window_start(o, out, extent, window, alpha, placement):
        if placement == PLACEMENT_BARACUDA:
            return baracuda_window_start(o, out, extent, window, alpha)
        return torch_start(o, out, extent, window, alpha)

    def fractional_max_pool_fw(x, y, indices, samples, dims, x_strides, y_strides,
                               idx_strides, sample_strides, windows, rows_per_thread):
        """dims = (N, C, D_in, H_in, W_in, D_out, H_out, W_out); *_strides = (n, c, d, h, w,
        ...); sample_strides = (n, c, axis, axis_d, axis_h, axis_w, ...) (axis_d < 0: no
        depth sample); windows = (kd, kh, kw, placement, ..., windows[WINDOWS_BF16] = the
        half kernels' bf16 flag, ...).

        Thread (x, y) owns output column ``ow = x`` of ``rows_per_thread`` consecutive
        output rows (row = (plane, od, oh) flattened), walked incrementally so that the
        per-plane and per-depth work (samples, column start, depth start) is done once."""
        channels = dims[1]
        d_in, h_in, w_in = dims[2], dims[3], dims[4]
        d_out, h_out, w_out = dims[5], dims[6], dims[7]
        kd, kh, kw, placement = windows[0], windows[1], windows[2], windows[3]
        bf16 = windows[WINDOWS_BF16] != 0
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
                    best = load(best_raw, bf16)
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
                                value = load(raw0, bf16)
                                if _takes_over(best, value):
                                    best, best_raw = value, raw0
                                    best_d, best_h, best_w = dd, dh, dw
                                value = load(raw1, bf16)
                                if dw + 1 < kw and _takes_over(best, value):
                                    best, best_raw = value, raw1
                                    best_d, best_h, best_w = dd, dh, dw + 1
                                value = load(raw2, bf16)
                                if dw + 2 < kw and _takes_over(best, value):
                                    best, best_raw = value, raw2
                                    best_d, best_h, best_w = dd, dh, dw + 2
                                value = load(raw3, bf16)
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
    """Backward kernel for one storage kind: sums ``load(dy, bf16)`` in ``zero``'s type."""

    def fractional_max_pool_bw(dy, indices, dx, dims, dy_strides, idx_strides, dx_strides,
                               windows, rows_per_thread):
        """Same dims/strides/windows layout as the forward. Thread (x, y) owns input column
        ``w = x`` of ``rows_per_thread`` consecutive input rows (plane, d, h)."""
        channels = dims[1]
        d_in, h_in, w_in = dims[2], dims[3], dims[4]
        d_out, h_out, w_out = dims[5], dims[6], dims[7]
        kd, kh, kw, placement = windows[0], windows[1], windows[2], windows[3]
        bf16 = windows[WINDOWS_BF16] != 0
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
                                dy_step = dy_strides[4]
                                if k0 == target:
                                    total += load(dy[uint64(dy_base + ow * dy_step)], bf16)
                                if ow + 1 < ow_end and k1 == target:
                                    total += load(dy[uint64(dy_base + o1 * dy_step)], bf16)
                                if ow + 2 < ow_end and k2 == target:
                                    total += load(dy[uint64(dy_base + o2 * dy_step)], bf16)
                                if ow + 3 < ow_end and k3 == target:
                                    total += load(dy[uint64(dy_base + o3 * dy_step)], bf16)
                                ow += 4
                    dx_at = dx_col + d * dx_strides[2] + h * dx_strides[3]
                    dx[uint64(dx_at)] = store(total, bf16)
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
