"""baracuda-check cases for GatedActivationPlan / GatedActivationBackwardPlan: kind x
dtype x input form (one tensor ``[gate | up]``, two tensors) x direction, against NumPy
float64 (the activation's derivative by its closed form).

Error measure: ``max |got - ref| / (1 + max |ref|)``; tolerance ``rtol + atol`` of
``TOLERANCE`` for the element kind, times 8 (inputs in [-2, 2]: the exponent's and erfc's
conditioning, at most 1 + g² = 5, and the two or three products).
"""

from __future__ import annotations

import math

import numpy as np

from ..kernels.gated_activation import GATED_ELEMENTS
from ..plans.gated_activation import (
    GatedActivationArgs,
    GatedActivationBackwardArgs,
    GatedActivationBackwardPlan,
    GatedActivationDescriptor,
    GatedActivationPlan,
)
from ..testing import TOLERANCE, from_storage, poisoned, random_values, to_device, to_host
from ..types import ElementKind, GatedActivationKind
from . import CheckCase

K = GatedActivationKind
_KINDS = ((K.SWIGLU, "none"), (K.GEGLU, "none"), (K.GEGLU, "tanh"), (K.REGLU, "none"),
          (K.GLU, "none"))
_GPU_SHAPE = (257, 1000)
_SIM_SHAPE = (2, 24)
_CONDITIONING = 8.0


def _act_and_slope(kind: K, approximate: str, g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """act(g) and act'(g) in float64."""
    if kind is K.REGLU:
        return np.maximum(g, 0.0), (g > 0).astype(np.float64)
    if kind is K.GEGLU and approximate == "none":
        cdf = 0.5 * np.vectorize(math.erfc)(-g / math.sqrt(2.0))
        return g * cdf, cdf + g * np.exp(-0.5 * g * g) / math.sqrt(2.0 * math.pi)
    if kind is K.GEGLU:
        k = math.sqrt(2.0 / math.pi)
        s = 1.0 / (1.0 + np.exp(-2.0 * k * (g + 0.044715 * g ** 3)))
        return g * s, s + 2.0 * g * s * (1.0 - s) * k * (1.0 + 3 * 0.044715 * g * g)
    s = 1.0 / (1.0 + np.exp(-g))
    if kind is K.GLU:
        return s, s * (1.0 - s)
    return g * s, s * (1.0 + g * (1.0 - s))


def _case(kind: K, approximate: str, element: ElementKind, shape: tuple[int, int],
          one_tensor: bool, backward: bool):
    def run() -> tuple[float, float]:
        rng = np.random.default_rng()
        rows, width = shape
        desc = GatedActivationDescriptor(kind, (rows, 2 * width) if one_tensor else shape,
                                         -1 if one_tensor else None, element,
                                         approximate=approximate)
        first = random_values(shape, element, rng)
        second = random_values(shape, element, rng)
        gate, up = (second, first) if kind is K.GLU else (first, second)
        act, slope = _act_and_slope(kind, approximate, from_storage(gate, element))
        if not backward:
            y = to_device(poisoned(shape, element))
            args = (GatedActivationArgs(to_device(np.concatenate([first, second], -1)), y)
                    if one_tensor else GatedActivationArgs(y=y, gate=to_device(gate),
                                                           up=to_device(up)))
            GatedActivationPlan.select(desc).run(args)
            got = [from_storage(to_host(y), element)]
            expected = [act * from_storage(up, element)]
        else:
            dy = random_values(shape, element, rng)
            grad = from_storage(dy, element)
            plan = GatedActivationBackwardPlan.select(desc)
            if one_tensor:
                dx = to_device(poisoned((rows, 2 * width), element))
                plan.run(GatedActivationBackwardArgs(
                    to_device(dy), to_device(np.concatenate([first, second], -1)), dx))
                halves = np.split(from_storage(to_host(dx), element), 2, axis=-1)
                got = halves[::-1] if kind is K.GLU else halves
            else:
                dgate = to_device(poisoned(shape, element))
                dup = to_device(poisoned(shape, element))
                plan.run(GatedActivationBackwardArgs(to_device(dy), gate=to_device(gate),
                                                     up=to_device(up), dgate=dgate, dup=dup))
                got = [from_storage(to_host(dgate), element),
                       from_storage(to_host(dup), element)]
            expected = [grad * from_storage(up, element) * slope, grad * act]
        error = max(float(np.max(np.abs(g - e))) / (1.0 + float(np.max(np.abs(e))))
                    for g, e in zip(got, expected))
        rtol, atol = TOLERANCE[element]
        return error, _CONDITIONING * (rtol + atol)

    return run


def cases(simulator: bool) -> list[CheckCase]:
    shape = _SIM_SHAPE if simulator else _GPU_SHAPE
    out = []
    for kind, approximate in _KINDS:
        elements = (ElementKind.BF16, ElementKind.F32) if simulator else GATED_ELEMENTS
        for element in elements:
            for one_tensor in (True, False):
                for backward in (False, True):
                    plan = "GatedActivationBackwardPlan" if backward else "GatedActivationPlan"
                    label = (f"{kind.name}{'/tanh' if approximate == 'tanh' else ''} "
                             f"{'[gate|up]' if one_tensor else 'gate, up'} {list(shape)}")
                    out.append(CheckCase("gated_activation", plan, element.name, label,
                                         _case(kind, approximate, element, shape, one_tensor,
                                               backward)))
    return out
