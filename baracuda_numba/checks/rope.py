"""baracuda-check cases for RopePlan / RopeBackwardPlan: pairing x dtype x direction x
positions (none / per sequence) x rotary dim (full / partial), against NumPy float64.

Error measure: ``max |got - ref| / max(1, max|x|)`` (a rotation's error is relative to the
pair norm); tolerance ``rtol + atol`` of ``TOLERANCE`` for the element kind, times
``1 + max|θ|`` for f64 (its θ carries the ~1e-15 relative error of the f64 inverse
frequency, ``exp2`` of a product with the host's ``log2 base``).
"""

from __future__ import annotations

import numpy as np

from ..plans.rope import (
    ROPE_ELEMENTS,
    RopeArgs,
    RopeBackwardArgs,
    RopeBackwardDescriptor,
    RopeBackwardPlan,
    RopeDescriptor,
    RopePlan,
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
from ..types import ElementKind, RopePairing
from . import CheckCase

_GPU_SHAPE = (4, 16, 129, 128)
_SIM_SHAPE = (2, 3, 3, 12)
# Decode-sized problems take ``rope_tile`` with positions and ``rope_table`` without (the
# shapes above: the rows kernels with positions; the table without).
_GPU_DECODE_SHAPE = (64, 32, 1, 128)
_SIM_DECODE_SHAPE = (2, 3, 1, 16)


def rope_reference(x: np.ndarray, positions: np.ndarray | None, base: float, rotary_dim: int,
                   pairing: RopePairing, inverse: bool,
                   element: ElementKind) -> tuple[np.ndarray, float]:
    """float64 RoPE of ``x`` [B, H, S, D] with θ rounded as the kernel's contract says
    (f32 inv_freq and θ for f16/bf16/f32); also returns max |θ|."""
    batch, _, seq, _ = x.shape
    inv_freq = np.float64(base) ** (-(2.0 * np.arange(rotary_dim // 2)) / rotary_dim)
    pos = np.broadcast_to(np.arange(seq) if positions is None else positions, (batch, seq))
    if element is ElementKind.F64:
        theta = pos[:, :, None].astype(np.float64) * inv_freq
        cos, sin = np.cos(theta), np.sin(theta)
    else:
        theta = (pos[:, :, None].astype(np.float32) * inv_freq.astype(np.float32))
        theta = theta.astype(np.float32).astype(np.float64)
        cos = np.cos(theta).astype(np.float32).astype(np.float64)
        sin = np.sin(theta).astype(np.float32).astype(np.float64)
    cos, sin = cos[:, None], (-sin if inverse else sin)[:, None]
    if pairing is RopePairing.INTERLEAVED:
        first, second = slice(0, rotary_dim, 2), slice(1, rotary_dim, 2)
    else:
        first, second = slice(0, rotary_dim // 2), slice(rotary_dim // 2, rotary_dim)
    y = x.copy()
    a, b = x[..., first], x[..., second]
    y[..., first] = a * cos - b * sin
    y[..., second] = b * cos + a * sin
    return y, float(np.max(np.abs(theta), initial=0.0))


def _case(shape, element, pairing, inverse, with_positions, rotary_dim):
    def run() -> tuple[float, float]:
        rng = np.random.default_rng()
        desc = RopeDescriptor(*shape, element=element, pairing=pairing, rotary_dim=rotary_dim)
        x_host = random_values(shape, element, rng)
        positions = (rng.integers(0, 100_000, size=(shape[0], shape[2])).astype(np.int64)
                     if with_positions else None)
        x, y = to_device(x_host), to_device(poisoned(shape, element))
        pos = None if positions is None else to_device(positions)
        if inverse:
            plan = RopeBackwardPlan.select(RopeBackwardDescriptor.of(desc), forward=desc)
            plan.run(RopeBackwardArgs(x, y, pos))
        else:
            RopePlan.select(desc).run(RopeArgs(x, y, pos))
        got = from_storage(to_host(y), element)
        x64 = from_storage(x_host, element)
        expected, max_theta = rope_reference(x64, positions, desc.base,
                                             rotary_dim or shape[3], pairing, inverse, element)
        if element in (ElementKind.F16, ElementKind.BF16):
            expected = from_storage(to_storage(expected, element), element)
        if np.isnan(got).any():
            return float("inf"), 0.0
        error = float(np.max(np.abs(got - expected))) / max(1.0, float(np.max(np.abs(x64))))
        rtol, atol = TOLERANCE[element]
        return error, (rtol + atol) * ((1.0 + max_theta) if element is ElementKind.F64 else 1.0)

    return run


def cases(simulator: bool) -> list[CheckCase]:
    shapes = (_SIM_SHAPE, _SIM_DECODE_SHAPE) if simulator else (_GPU_SHAPE, _GPU_DECODE_SHAPE)
    partial = 8 if simulator else 64
    out = []
    for shape in shapes:
        for element in ROPE_ELEMENTS:
            for pairing in RopePairing:
                for inverse in (False, True):
                    for with_positions in (False, True):
                        for rotary_dim in (None, partial):
                            plan = "RopeBackwardPlan" if inverse else "RopePlan"
                            label = (f"{shape} {pairing.name.lower()} "
                                     f"R={rotary_dim or shape[3]}"
                                     f"{' positions[B,S]' if with_positions else ''}")
                            out.append(CheckCase("rope", plan, element.name, label,
                                                 _case(shape, element, pairing, inverse,
                                                       with_positions, rotary_dim)))
    return out
