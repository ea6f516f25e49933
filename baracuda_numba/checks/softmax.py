"""baracuda-check cases for SoftmaxPlan / SoftmaxBackwardPlan: kind x dtype x direction
over short rows, rows split in parts, and columns (axis 0), against NumPy float64.

Error measure: ``max |got - ref| / (max |ref| + 1)``; tolerance ``rtol`` of ``TOLERANCE``
for the element kind times ``sqrt(n)`` (the row sum's conditioning) times 8 (the
log-softmax subtracts terms up to ``|x'| + log n``, inputs in [-4, 4]).
"""

from __future__ import annotations

import math

import numpy as np

from ..kernels.softmax import SOFTMAX_ELEMENTS
from ..plans.softmax import (
    SoftmaxArgs,
    SoftmaxBackwardArgs,
    SoftmaxBackwardDescriptor,
    SoftmaxBackwardPlan,
    SoftmaxDescriptor,
    SoftmaxForce,
    SoftmaxPlan,
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
from ..types import SoftmaxKind
from . import CheckCase

_SIM_PROBLEMS = (((4, 33), 1, None), ((3, 40), 1, SoftmaxForce(part_elements=16)),
                 ((24, 5), 0, None))
_GPU_PROBLEMS = (((512, 4096), 1, None), ((16, 70000), 1, None), ((4096, 256), 0, None))


def _forward(x: np.ndarray, axis: int, log: bool) -> np.ndarray:
    m = np.max(x, axis=axis, keepdims=True)
    e = np.exp(x - m)
    s = np.sum(e, axis=axis, keepdims=True)
    return (x - m) - np.log(s) if log else e / s


def _backward(dy: np.ndarray, y: np.ndarray, axis: int, log: bool) -> np.ndarray:
    if log:
        return dy - np.exp(y) * np.sum(dy, axis=axis, keepdims=True)
    return y * (dy - np.sum(dy * y, axis=axis, keepdims=True))


def _case(shape, axis, force, kind, element, backward):
    def run() -> tuple[float, float]:
        rng = np.random.default_rng()
        log = kind is SoftmaxKind.LOG_SOFTMAX
        x_host = random_values(shape, element, rng, -4.0, 4.0)
        x = from_storage(x_host, element)
        out = to_device(poisoned(shape, element))
        if backward:
            y_host = to_storage(_forward(x, axis, log), element)
            dy_host = random_values(shape, element, rng, -1.0, 1.0)
            plan = SoftmaxBackwardPlan.select(SoftmaxBackwardDescriptor(shape, axis, kind,
                                                                        element), force=force)
            args = SoftmaxBackwardArgs(to_device(dy_host), to_device(y_host), out)
            expected = _backward(from_storage(dy_host, element), from_storage(y_host, element),
                                 axis, log)
        else:
            plan = SoftmaxPlan.select(SoftmaxDescriptor(shape, axis, kind, element),
                                      force=force)
            args = SoftmaxArgs(to_device(x_host), out)
            expected = _forward(x, axis, log)
        workspace = (to_device(np.zeros(plan.workspace_size, np.uint8))
                     if plan.workspace_size else None)
        plan.run(args, workspace=workspace)
        got = from_storage(to_host(out), element)
        if np.isnan(got).any():
            return float("inf"), 0.0
        error = float(np.max(np.abs(got - expected))) / (float(np.max(np.abs(expected))) + 1)
        return error, TOLERANCE[element][0] * math.sqrt(shape[axis]) * 8

    return run


def cases(simulator: bool) -> list[CheckCase]:
    out = []
    for shape, axis, force in (_SIM_PROBLEMS if simulator else _GPU_PROBLEMS):
        for element in SOFTMAX_ELEMENTS:
            for kind in (SoftmaxKind.SOFTMAX, SoftmaxKind.LOG_SOFTMAX):
                for backward in (False, True):
                    plan = "SoftmaxBackwardPlan" if backward else "SoftmaxPlan"
                    label = f"{shape} axis {axis}" + (
                        f" parts of {force.part_elements}" if force else "")
                    out.append(CheckCase("softmax", plan, element.name,
                                         f"{kind.name.lower()} {label}",
                                         _case(shape, axis, force, kind, element, backward)))
    return out
