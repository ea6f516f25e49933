"""baracuda-check cases for CrossEntropyLossPlan / CrossEntropyLossBackwardPlan: dtype x
path (one block per row / split rows) x direction, with label smoothing and ignored rows,
against NumPy float64.

Error measure: ``max |got - ref| / max|ref|`` over the loss, lse and gradient; tolerance
the element kind's rtol plus f32 sums of ``V`` terms (``4 sqrt(V)`` f32 roundings).
"""

from __future__ import annotations

import math

import numpy as np

from ..plans.cross_entropy import (
    CrossEntropyLossArgs,
    CrossEntropyLossBackwardArgs,
    CrossEntropyLossBackwardDescriptor,
    CrossEntropyLossBackwardPlan,
    CrossEntropyLossDescriptor,
    CrossEntropyLossPlan,
)
from ..testing import TOLERANCE, from_storage, poisoned, random_values, to_device, to_host
from ..types import ElementKind, LossReduction
from . import CheckCase

_SMOOTHING = 0.1
_GPU_SHAPES = ((257, 32000), (4, 1 << 17))
_SIM_SHAPES = ((3, 37),)


def _expected(x: np.ndarray, target: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
    """Mean loss, lse and gradient of the mean loss (ignore_index -100, smoothing)."""
    n, v = x.shape
    lse = np.log(np.exp(x - x.max(1, keepdims=True)).sum(1)) + x.max(1)
    logp = x - lse[:, None]
    keep = target >= 0
    rows = np.zeros(n)
    grad = np.exp(logp) - _SMOOTHING / v
    for i in np.flatnonzero(keep):
        rows[i] = -(1 - _SMOOTHING) * logp[i, target[i]] - _SMOOTHING * logp[i].mean()
        grad[i, target[i]] -= 1 - _SMOOTHING
    grad[~keep] = 0.0
    return rows.sum() / keep.sum(), lse, grad / keep.sum()


def _case(element: ElementKind, shape: tuple[int, int], split: int | None, backward: bool):
    def run() -> tuple[float, float]:
        rng = np.random.default_rng()
        n, v = shape
        x = random_values(shape, element, rng, -4.0, 4.0)
        target = rng.integers(0, v, n)
        target[::3] = -100
        options = {"label_smoothing": _SMOOTHING}
        fwd = CrossEntropyLossPlan.select(CrossEntropyLossDescriptor(
            n, v, LossReduction.MEAN, element, compute_grad=not backward, **options),
            split=split)
        out, lse = to_device(poisoned((1,), ElementKind.F32)), to_device(
            poisoned((n,), ElementKind.F32))
        grad = to_device(poisoned(shape, element))
        x_dev, t_dev = to_device(x), to_device(target)
        ws = to_device(np.zeros(max(fwd.workspace_size // 4, 1), np.float32))
        fwd.run(CrossEntropyLossArgs(x_dev, t_dev, out, lse, None,
                                     None if backward else grad), workspace=ws)
        if backward:
            bwd = CrossEntropyLossBackwardPlan.select(CrossEntropyLossBackwardDescriptor(
                n, v, LossReduction.MEAN, element, **options), split=split)
            bwd.run(CrossEntropyLossBackwardArgs(x_dev, t_dev, lse,
                                                 to_device(np.ones(1, np.float32)), grad),
                    workspace=ws)
        loss_ref, lse_ref, grad_ref = _expected(from_storage(x, element), target)
        got_grad = from_storage(to_host(grad), element)
        errors = [abs(float(to_host(out)[0]) - loss_ref) / abs(loss_ref),
                  float(np.max(np.abs(to_host(lse) - lse_ref)) / np.max(np.abs(lse_ref))),
                  float(np.max(np.abs(got_grad - grad_ref)) / np.max(np.abs(grad_ref)))]
        error = max(errors) if all(math.isfinite(e) for e in errors) else math.inf
        accumulator = 4 * math.sqrt(v) * TOLERANCE[ElementKind.F32][0]
        return error, TOLERANCE[element][0] + accumulator

    return run


def cases(simulator: bool) -> list[CheckCase]:
    shapes = _SIM_SHAPES if simulator else _GPU_SHAPES
    elements = (ElementKind.BF16, ElementKind.F32) if simulator else (
        ElementKind.F16, ElementKind.BF16, ElementKind.F32, ElementKind.F64)
    out = []
    for element in elements:
        for shape in shapes:
            for split in (None, 3):
                for backward in (False, True):
                    plan = "CrossEntropyLossBackwardPlan" if backward else \
                        "CrossEntropyLossPlan"
                    label = f"{shape} mean smoothing" + (f" split={split}" if split else "")
                    out.append(CheckCase("cross_entropy", plan, element.name, label,
                                         _case(element, shape, split, backward)))
    return out
