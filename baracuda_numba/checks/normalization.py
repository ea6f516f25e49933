"""baracuda-check cases for RMSNormPlan / LayerNormPlan (forward: y against float64)."""

from __future__ import annotations

import numpy as np

from ..plans.normalization import (
    NORM_ELEMENTS,
    LayerNormArgs,
    LayerNormDescriptor,
    LayerNormPlan,
    RMSNormArgs,
    RMSNormDescriptor,
    RMSNormPlan,
)
from ..testing import TOLERANCE, from_storage, poisoned, random_values, to_device, to_host
from ..types import ElementKind
from . import CheckCase

_GPU_SHAPES = [(64, 4096), (7, 1000), (3, 65536)]
_SIM_SHAPES = [(3, 33)]


def _case(layer: bool, element: ElementKind, shape: tuple[int, int]):
    def run() -> tuple[float, float]:
        rng = np.random.default_rng()
        n = shape[-1]
        x = random_values(shape, element, rng)
        w = random_values((n,), element, rng)
        stats = ElementKind.F64 if element is ElementKind.F64 else ElementKind.F32
        y = to_device(poisoned(shape, element))
        rstd = to_device(poisoned((shape[0], 1), stats))
        mean = to_device(poisoned((shape[0], 1), stats))
        xv, wv = from_storage(x, element), from_storage(w, element)
        if layer:
            plan = LayerNormPlan.select(LayerNormDescriptor(shape, (n,), element,
                                                            has_weight=True))
            plan.run(LayerNormArgs(to_device(x), y, mean, rstd, to_device(w)))
            mean = xv.mean(-1, keepdims=True)
            rstd_v = 1 / np.sqrt(((xv - mean) ** 2).mean(-1, keepdims=True) + 1e-5)
            expected = (xv - mean) * rstd_v * wv
            size = (np.abs(xv) + np.abs(mean)) * rstd_v * np.abs(wv)
        else:
            plan = RMSNormPlan.select(RMSNormDescriptor(shape, (n,), element, 1e-6,
                                                        has_weight=True))
            plan.run(RMSNormArgs(to_device(x), y, rstd, to_device(w)))
            rstd_v = 1 / np.sqrt((xv ** 2).mean(-1, keepdims=True) + 1e-6)
            expected = xv * rstd_v * wv
            size = np.abs(expected)
        got = from_storage(to_host(y), element)
        if np.isnan(got).any():
            return float("inf"), 0.0
        rtol = TOLERANCE[element][0]
        # one rounding of y, and LayerNorm's h − mean: error relative to the terms' size
        scale = size + rtol
        return float(np.max(np.abs(got - expected) / scale)), 2 * rtol

    return run


def cases(simulator: bool) -> list[CheckCase]:
    shapes = _SIM_SHAPES if simulator else _GPU_SHAPES
    return [CheckCase("normalization", "LayerNormPlan" if layer else "RMSNormPlan", element.name,
                      f"{list(shape)} last axis", _case(layer, element, shape))
            for layer in (False, True) for element in NORM_ELEMENTS for shape in shapes]
