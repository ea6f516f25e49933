"""baracuda-check cases for ScanPlan / ScanBackwardPlan: every kind x element kind x
(forward, backward) on a last-axis and an outer-axis shape, forward and reverse
(contiguous: the fast rows/cols kernels where the kind and element have one, the fused
rows/cols kernels for the Cummax/Cummin backward, else the generic ones).

Each case compares with a NumPy float64 reference; the error is the largest
``|got - ref| / bound`` with the bound of ``tests/test_scan.py`` (output rounding of
``TOLERANCE`` plus ``2 n u_acc`` times the sum of |terms|), so a case passes at <= 1.
"""

from __future__ import annotations

import numpy as np

from .._runtime import SIMULATOR
from ..kernels.scan import SCAN_BACKWARD_ELEMENTS, SCAN_FORWARD_ELEMENTS
from ..plans.scan import (
    ScanArgs,
    ScanBackwardArgs,
    ScanBackwardDescriptor,
    ScanBackwardPlan,
    ScanDescriptor,
    ScanPlan,
)
from ..testing import (
    TOLERANCE,
    from_storage,
    poisoned,
    random_values,
    to_device,
    to_host,
    to_storage,
)
from ..types import ElementKind, ScanKind
from . import CheckCase

# (shape, axis, reverse): last axis, outer axis, few long lines (split when a workspace
# is given; here the unsplit path). Backward references are O(n^2): shorter.
_GPU_SHAPES = [((64, 1000), 1, False), ((1000, 64), 0, True), ((3, 20000), 1, True)]
_GPU_BACKWARD_SHAPES = [((64, 300), 1, False), ((300, 64), 0, True), ((3, 2000), 1, True)]
_SIM_SHAPES = [((1, 100), 1, False), ((12, 3), 0, True)]


def _lines(a: np.ndarray, axis: int, reverse: bool) -> np.ndarray:
    moved = np.moveaxis(a, axis, -1)
    return moved[..., ::-1] if reverse else moved


def _unlines(a: np.ndarray, axis: int, reverse: bool) -> np.ndarray:
    return np.moveaxis(a[..., ::-1] if reverse else a, -1, axis)


def _winner(x: np.ndarray, is_max: bool, first: bool) -> np.ndarray:
    """Scan index of the running winner (NaN dominates; ties: first or last occurrence)."""
    out = np.zeros(x.shape, dtype=np.int64)
    value, current = x[..., 0].copy(), np.zeros(x.shape[:-1], dtype=np.int64)
    for s in range(x.shape[-1]):
        v = x[..., s]
        with np.errstate(invalid="ignore"):
            if first:
                better = (v > value) if is_max else (v < value)
            else:
                better = (v >= value) if is_max else (v <= value)
        take = (np.isnan(v) & (~np.isnan(value) | (not first))) | (~np.isnan(value) & better)
        if s == 0:
            take = np.ones_like(take)
        value, current = np.where(take, v, value), np.where(take, s, current)
        out[..., s] = current
    return out


def _forward_ref(kind: ScanKind, lines: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(y, scale) along the last axis, float64."""
    if kind is ScanKind.CUMSUM:
        return np.cumsum(lines, -1), np.cumsum(np.abs(lines), -1)
    if kind is ScanKind.CUMPROD:
        y = np.cumprod(lines, -1)
        return y, np.abs(y)
    if kind in (ScanKind.CUMMAX, ScanKind.CUMMIN):
        y = np.take_along_axis(lines, _winner(lines, kind is ScanKind.CUMMAX, False), -1)
        return y, np.zeros_like(y)
    y = np.logaddexp.accumulate(lines, -1)
    return y, np.abs(y) + 1


def _backward_ref(kind: ScanKind, x: np.ndarray, y: np.ndarray,
                  dy: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(dx, scale) along the last axis from the definitions (a reverse scan of the
    per-position terms)."""
    n = dy.shape[-1]
    if kind is ScanKind.CUMSUM:
        rev = np.cumsum(dy[..., ::-1], -1)[..., ::-1]
        return rev, np.cumsum(np.abs(dy[..., ::-1]), -1)[..., ::-1]
    dx, scale = np.zeros(dy.shape), np.zeros(dy.shape)
    if kind in (ScanKind.CUMMAX, ScanKind.CUMMIN):
        winner = _winner(x, kind is ScanKind.CUMMAX, False)  # the returned index (torch)
        for j in range(n):
            hit = winner == j
            dx[..., j] = np.where(hit, dy, 0).sum(-1)
            scale[..., j] = np.where(hit, np.abs(dy), 0).sum(-1)
        return dx, scale
    for j in range(n):
        if kind is ScanKind.CUMPROD:
            others = x.copy()
            others[..., j] = 1
            terms = (dy * np.cumprod(others, -1))[..., j:]
        else:
            terms = dy[..., j:] * np.exp(x[..., j:j + 1] - y[..., j:])
        dx[..., j] = terms.sum(-1)
        scale[..., j] = np.abs(terms).sum(-1)
    return dx, scale


def _inputs(kind: ScanKind, shape, element: ElementKind, rng) -> np.ndarray:
    if kind is ScanKind.CUMPROD:
        if element.is_float:
            # Magnitudes near 1, spread so the log of a product over the longest line has
            # a standard deviation of about 1.7: products stay far from overflow (where a
            # different but equally valid rounding order could overflow a step earlier).
            spread = min(0.25, 3.0 / float(np.sqrt(max(shape))))
            magnitudes = rng.uniform(1.0 - spread, 1.0 + spread, shape)
            return to_storage(rng.choice([-1, 1], size=shape) * magnitudes, element)
        return rng.integers(-3, 4, size=shape).astype(element.storage_dtype)
    return random_values(shape, element, rng)


def _error(got: np.ndarray, expected: np.ndarray, scale: np.ndarray, element: ElementKind,
           extent: int) -> float:
    """max |got - expected| / bound; inf if NaN/inf positions differ."""
    if element in (ElementKind.I32, ElementKind.I64):
        return float(np.count_nonzero(got != expected))
    rtol, atol = TOLERANCE[element]
    u_acc = 2.0 ** -53 if element is ElementKind.F64 else 2.0 ** -24
    if element is not ElementKind.F64:
        with np.errstate(over="ignore"):  # rounds to inf where the device does
            expected = from_storage(to_storage(expected, element), element)
    bound = atol + rtol * np.abs(expected) + 2 * extent * u_acc * scale
    if not np.array_equal(np.isnan(got), np.isnan(expected)):
        return float("inf")
    finite = np.isfinite(expected)
    if not np.array_equal(got[~finite], expected[~finite]):
        return float("inf")
    return float(np.max(np.abs(got[finite] - expected[finite]) / bound[finite], initial=0.0))


def _workspace(plan):
    """The workspace ``run`` requires (None where the plan needs none)."""
    return to_device(np.zeros(plan.workspace_size, np.uint8)) if plan.workspace_size else None


def _forward_case(kind: ScanKind, element: ElementKind, shape, axis: int, reverse: bool):
    def run() -> tuple[float, float]:
        rng = np.random.default_rng()
        x_host = _inputs(kind, shape, element, rng)
        plan = ScanPlan.select(ScanDescriptor(kind, shape, axis, reverse, element=element))
        y = to_device(poisoned(shape, element))
        plan.run(ScanArgs(to_device(x_host), y), workspace=_workspace(plan))
        got = from_storage(to_host(y), element)
        x = from_storage(x_host, element)
        ref, scale = _forward_ref(kind, _lines(x, axis, reverse))
        if element in (ElementKind.I32, ElementKind.I64):  # wraps like the device
            ref = ref.astype(np.int64).astype(element.storage_dtype).astype(np.int64)
        return _error(got, _unlines(ref, axis, reverse), _unlines(scale, axis, reverse),
                      element, shape[axis]), 1.0

    return run


def _backward_case(kind: ScanKind, element: ElementKind, shape, axis: int, reverse: bool):
    def run() -> tuple[float, float]:
        rng = np.random.default_rng()
        x_host = _inputs(kind, shape, element, rng)
        dy_host = random_values(shape, element, rng)
        forward = ScanPlan.select(ScanDescriptor(kind, shape, axis, reverse, element=element))
        y_dev = to_device(poisoned(shape, element))
        x_dev = to_device(x_host)
        forward.run(ScanArgs(x_dev, y_dev), workspace=_workspace(forward))
        plan = ScanBackwardPlan.select(ScanBackwardDescriptor(kind, shape, axis, reverse,
                                                              element=element))
        dx = to_device(poisoned(shape, element))
        plan.run(ScanBackwardArgs(to_device(dy_host), dx, x_dev, y_dev),
                 workspace=_workspace(plan))
        got = from_storage(to_host(dx), element)
        x, y, dy = (from_storage(a, element) for a in (x_host, to_host(y_dev), dy_host))
        ref, scale = _backward_ref(kind, *(_lines(a, axis, reverse) for a in (x, y, dy)))
        if kind is ScanKind.LOG_CUMSUM_EXP and element is not ElementKind.F64:
            scale = scale * (1 + TOLERANCE[element][0] / 2.0 ** -24 / shape[axis])
        return _error(got, _unlines(ref, axis, reverse), _unlines(scale, axis, reverse),
                      element, shape[axis] + 2), 1.0

    return run


def cases(simulator: bool) -> list[CheckCase]:
    sim = simulator or SIMULATOR
    shapes = _SIM_SHAPES if sim else _GPU_SHAPES
    backward_shapes = _SIM_SHAPES if sim else _GPU_BACKWARD_SHAPES
    out = []
    for kind, elements in SCAN_FORWARD_ELEMENTS.items():
        for element in elements:
            for shape, axis, reverse in shapes:
                label = f"{kind.name} {shape} axis={axis}" + (" reverse" if reverse else "")
                out.append(CheckCase("scan", "ScanPlan", element.name, label,
                                     _forward_case(kind, element, shape, axis, reverse)))
    for kind, elements in SCAN_BACKWARD_ELEMENTS.items():
        for element in elements:
            for shape, axis, reverse in backward_shapes:
                label = f"{kind.name} {shape} axis={axis}" + (" reverse" if reverse else "")
                out.append(CheckCase("scan", "ScanBackwardPlan", element.name, label,
                                     _backward_case(kind, element, shape, axis, reverse)))
    return out
