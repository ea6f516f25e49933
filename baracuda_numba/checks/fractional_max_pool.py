"""baracuda-check cases for FractionalMaxPool2dPlan / FractionalMaxPool3dPlan: 2-D and 3-D
x every element kind x forward / backward x both placements (TORCH on the 2-D shape)."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from ..plans.fractional_max_pool import (
    FRACTIONAL_MAX_POOL_ELEMENTS,
    FractionalMaxPool2dBwArgs,
    FractionalMaxPool2dDescriptor,
    FractionalMaxPool2dFwArgs,
    FractionalMaxPool2dPlan,
    FractionalMaxPool3dBwArgs,
    FractionalMaxPool3dDescriptor,
    FractionalMaxPool3dFwArgs,
    FractionalMaxPool3dPlan,
    FractionalPlacement,
)
from ..testing import (
    TOLERANCE,
    from_storage,
    max_relative_error,
    poisoned,
    random_values,
    to_device,
    to_host,
)
from ..types import ElementKind
from . import CheckCase

# (input shape, windows, output shape)
_GPU_SHAPES = [
    ((4, 6, 64, 61), (3, 3), (45, 43)),
    ((2, 3, 17, 33, 30), (2, 3, 2), (11, 23, 21)),
]
_SIM_SHAPES = [
    ((1, 2, 7, 9), (2, 3), (4, 5)),
    ((1, 2, 4, 5, 6), (2, 2, 3), (3, 3, 3)),
]


def _starts(out: int, extent: int, window: int, alpha: float,
            placement: FractionalPlacement, element: ElementKind) -> np.ndarray:
    """Window starts of one axis (exact rationals for BARACUDA; torch's float steps)."""
    max_start = extent - window
    alpha = min(max(float(alpha), 0.0), float(np.nextafter(np.float32(1), np.float32(0))))
    if placement is FractionalPlacement.BARACUDA:
        if max_start <= 0:
            return np.zeros(out, dtype=np.int64)
        if out == 1:
            return np.array([math.floor(Fraction(alpha) * max_start)], dtype=np.int64)
        return np.array([min(math.floor(Fraction(o * max_start, out - 1) + Fraction(alpha)),
                             max_start) for o in range(out)], dtype=np.int64)
    acc = np.float64 if element is ElementKind.F64 else np.float32
    step = acc(max_start) / acc(max(out - 1, 1))
    sample = acc(alpha)
    starts = [max_start if o >= out - 1 else
              max(0, min(int(acc(acc(o) + sample) * step) - int(sample * step), max_start))
              for o in range(out)]
    return np.array(starts, dtype=np.int64)


def reference_indices(x64: np.ndarray, windows: tuple[int, ...], out_shape: tuple[int, ...],
                      samples: np.ndarray, placement: FractionalPlacement,
                      element: ElementKind) -> np.ndarray:
    """Saved indices: first max in row-major window order, the first NaN wins."""
    batch, channels = x64.shape[:2]
    spatial = x64.shape[2:]
    rank = len(spatial)
    # per (n, c, axis): starts[n, c][axis] -> array over that axis' outputs
    coords = []
    for axis in range(rank):
        starts = np.stack([np.stack([_starts(out_shape[axis], spatial[axis], windows[axis],
                                             samples[n, c, axis], placement, element)
                                     for c in range(channels)]) for n in range(batch)])
        # broadcast to [N, C, *out, *window] along this axis
        shape_out = [1] * rank
        shape_out[axis] = out_shape[axis]
        shape_win = [1] * rank
        shape_win[axis] = windows[axis]
        coords.append(starts.reshape((batch, channels) + tuple(shape_out) + (1,) * rank)
                      + np.arange(windows[axis]).reshape((1, 1) + (1,) * rank
                                                         + tuple(shape_win)))
    n_idx = np.arange(batch).reshape((batch,) + (1,) * (2 * rank + 1))
    c_idx = np.arange(channels).reshape((1, channels) + (1,) * (2 * rank))
    coords = np.broadcast_arrays(n_idx, c_idx, *coords)
    flat_shape = (batch, channels) + tuple(out_shape) + (-1,)
    values = x64[tuple(coords)].reshape(flat_shape)
    linear = np.ravel_multi_index(tuple(coords), x64.shape).reshape(flat_shape)
    nan = np.isnan(values)
    pick = np.where(nan.any(-1), nan.argmax(-1), np.argmax(np.where(nan, -np.inf, values), -1))
    return np.take_along_axis(linear, pick[..., None], -1)[..., 0]


def _plan(shape_in, windows, shape_out, element, placement):
    batch, channels = shape_in[:2]
    if len(shape_in) == 4:
        desc = FractionalMaxPool2dDescriptor.new(batch, channels, *shape_in[2:], *windows,
                                                 *shape_out, element)
        return (FractionalMaxPool2dPlan.select(desc.with_placement(placement)),
                FractionalMaxPool2dFwArgs, FractionalMaxPool2dBwArgs)
    desc = FractionalMaxPool3dDescriptor.new(batch, channels, *shape_in[2:], *windows,
                                             *shape_out, element)
    return (FractionalMaxPool3dPlan.select(desc.with_placement(placement)),
            FractionalMaxPool3dFwArgs, FractionalMaxPool3dBwArgs)


def _case(element: ElementKind, shape_in, windows, shape_out, placement, backward: bool):
    def run() -> tuple[float, float]:
        rng = np.random.default_rng()
        plan, fw_args, bw_args = _plan(shape_in, windows, shape_out, element, placement)
        full_out = tuple(shape_in[:2]) + tuple(shape_out)
        x_host = random_values(shape_in, element, rng)
        samples = rng.random(tuple(shape_in[:2]) + (len(shape_out),), dtype=np.float32)
        y = to_device(poisoned(full_out, element))
        idx = to_device(poisoned(full_out, ElementKind.I64))
        plan.run_fw(fw_args(to_device(x_host), y, idx, to_device(samples)))
        expected = reference_indices(from_storage(x_host, element), windows, shape_out,
                                     samples, placement, element)
        got_idx = to_host(idx)
        if not backward:
            wrong = np.count_nonzero(got_idx != expected)
            got_y = to_host(y).view(np.uint8)
            wrong += np.count_nonzero(got_y != x_host.reshape(-1)[expected].view(np.uint8))
            return float(wrong), 0.0
        dy_host = random_values(full_out, element, rng)
        dx = to_device(poisoned(shape_in, element))
        plan.run_bw(bw_args(to_device(dy_host), idx, dx))
        ref = np.zeros(int(np.prod(shape_in)))
        np.add.at(ref, expected.ravel(), from_storage(dy_host, element).ravel())
        rtol, atol = TOLERANCE[element]
        error = max_relative_error(from_storage(to_host(dx), element), ref.reshape(shape_in),
                                   atol / rtol)
        # a sum of a few dy values, rounded once (f32 accumulation for halves)
        return error, 2 * rtol

    return run


def cases(simulator: bool) -> list[CheckCase]:
    shapes = _SIM_SHAPES if simulator else _GPU_SHAPES
    out = []
    for element in FRACTIONAL_MAX_POOL_ELEMENTS:
        for shape_in, windows, shape_out in shapes:
            plan = "FractionalMaxPool2dPlan" if len(shape_in) == 4 else "FractionalMaxPool3dPlan"
            placements = [FractionalPlacement.BARACUDA]
            if len(shape_in) == 4:
                placements.append(FractionalPlacement.TORCH)
            for placement in placements:
                for backward in (False, True):
                    label = (f"{shape_in} k={windows} -> {shape_out} {placement.name} "
                             f"{'bw' if backward else 'fw'}")
                    out.append(CheckCase("fractional_max_pool", plan, element.name, label,
                                         _case(element, shape_in, windows, shape_out,
                                               placement, backward)))
    return out
