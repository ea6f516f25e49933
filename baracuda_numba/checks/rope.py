"""baracuda-check cases for RopePlan / RopeBackwardPlan: pairing x dtype x direction x
positions (none / per sequence) x rotary dim (full / partial), against NumPy float64.

Error measure: ``max |got - ref| / max(1, max|x|)`` (a rotation's error is relative to the
pair norm); tolerance ``rtol + atol`` of ``TOLERANCE`` for the element kind, times
``1 + max|θ|`` for f64 (its θ carries the ~1e-15 relative error of the f64 inverse
frequency, ``exp2`` of a product with the host's ``log2 base``). The reference θ is exact
(float64). Also: q and k in one run (GQA, BSHD, an ``inv_freq`` vector, int32 positions),
and ``RopeKvCacheAppendPlan`` against ``RopePlan`` plus the cache placement (bit for bit:
tolerance 0).
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
from ..plans.rope_kv_cache import (
    RopeKvCacheAppendArgs,
    RopeKvCacheAppendDescriptor,
    RopeKvCacheAppendPlan,
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
from ..types import ElementKind, RopeAngleSource, RopeLayout, RopePairing
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
    """float64 RoPE of ``x`` [B, H, S, D] (θ exact; ``element`` unused); also returns
    max |θ|."""
    batch, _, seq, _ = x.shape
    inv_freq = np.float64(base) ** (-(2.0 * np.arange(rotary_dim // 2)) / rotary_dim)
    pos = np.broadcast_to(np.arange(seq) if positions is None else positions, (batch, seq))
    theta = pos[:, :, None].astype(np.float64) * inv_freq
    cos, sin = np.cos(theta), np.sin(theta)
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
    qk_shape = (2, 4, 3, 16) if simulator else (4, 32, 257, 128)
    cache_shape = (2, 4, 2, 2, 16) if simulator else (16, 32, 8, 17, 128)
    for pairing in RopePairing:
        for element in (ElementKind.BF16, ElementKind.F32):
            out.append(CheckCase("rope", "RopePlan", element.name,
                                 f"q+k BSHD inv_freq int32 {pairing.name.lower()}",
                                 _qk_case(qk_shape, element, pairing)))
        out.append(CheckCase("rope", "RopeKvCacheAppendPlan", "F16",
                             f"{cache_shape} contiguous {pairing.name.lower()}",
                             _cache_case(cache_shape, pairing)))
    return out


def _rotate(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, pairing: RopePairing) -> np.ndarray:
    """[B, H, S, D] rotated by per-(b, s) ``cos``/``sin`` [B, S, D/2] (float64)."""
    dim = x.shape[-1]
    half = pairing is RopePairing.HALF_SPLIT
    first, second = ((slice(0, dim // 2), slice(dim // 2, dim)) if half
                     else (slice(0, dim, 2), slice(1, dim, 2)))
    y = x.copy()
    a, b = x[..., first], x[..., second]
    y[..., first] = a * cos[:, None] - b * sin[:, None]
    y[..., second] = b * cos[:, None] + a * sin[:, None]
    return y


def _qk_case(shape, element, pairing):
    def run() -> tuple[float, float]:
        rng = np.random.default_rng()
        batch, heads, seq, dim = shape
        kv = heads // 4
        inv = (500000.0 ** (-np.arange(0, dim, 2) / dim)).astype(np.float32)
        positions = rng.integers(0, 1 << 20, size=(batch, seq)).astype(np.int32)
        q_host = random_values((batch, seq, heads, dim), element, rng)
        k_host = random_values((batch, seq, kv, dim), element, rng)
        q_out = to_device(poisoned(q_host.shape, element))
        k_out = to_device(poisoned(k_host.shape, element))
        RopePlan.select(RopeDescriptor(batch, heads, seq, dim, element=element,
                                       pairing=pairing, num_kv_heads=kv,
                                       layout=RopeLayout.BSHD,
                                       angles=RopeAngleSource.INV_FREQ)).run(
            RopeArgs(to_device(q_host), q_out, to_device(positions), k=to_device(k_host),
                     k_out=k_out, inv_freq=to_device(inv)))
        theta = positions[..., None].astype(np.float64) * inv.astype(np.float64)
        error = 0.0
        for out, source in ((q_out, q_host), (k_out, k_host)):
            x64 = from_storage(source, element).transpose(0, 2, 1, 3)
            want = _rotate(x64, np.cos(theta), np.sin(theta), pairing)
            if element is ElementKind.BF16:
                want = from_storage(to_storage(want, element), element)
            got = from_storage(to_host(out), element).transpose(0, 2, 1, 3)
            if np.isnan(got).any():
                return float("inf"), 0.0
            error = max(error, float(np.max(np.abs(got - want)))
                        / max(1.0, float(np.max(np.abs(x64)))))
        rtol, atol = TOLERANCE[element]
        return error, rtol + atol

    return run


def _cache_case(shape, pairing):
    def run() -> tuple[float, float]:
        rng = np.random.default_rng()
        batch, heads, kv, length, dim = shape
        element = ElementKind.F16
        max_len = 4 * length + 3
        q, k, v = (random_values((batch, h, length, dim), element, rng)
                   for h in (heads, kv, kv))
        caches = [random_values((batch, kv, max_len, dim), element, rng) for _ in range(2)]
        offsets = rng.integers(0, max_len - length + 1, size=batch).astype(np.int64)
        q_out = to_device(poisoned(q.shape, element))
        k_cache, v_cache = (to_device(c) for c in caches)
        RopeKvCacheAppendPlan.select(RopeKvCacheAppendDescriptor(
            batch, heads, kv, length, dim, max_cache_len=max_len, element=element,
            pairing=pairing)).run(RopeKvCacheAppendArgs(
                to_device(q), q_out, to_device(k), to_device(v), k_cache, v_cache,
                cache_offsets=to_device(offsets)))
        positions = to_device(offsets[:, None] + np.arange(length))
        rotated = []
        for x in (q, k):
            y = to_device(poisoned(x.shape, element))
            RopePlan.select(RopeDescriptor(*x.shape, element=element, pairing=pairing)).run(
                RopeArgs(to_device(x), y, positions))
            rotated.append(to_host(y))
        k_want, v_want = (c.copy() for c in caches)
        for b, at in enumerate(offsets):
            k_want[b, :, at:at + length] = rotated[1][b]
            v_want[b, :, at:at + length] = v[b]
        same = (np.array_equal(to_host(q_out).view(np.uint16), rotated[0].view(np.uint16))
                and np.array_equal(to_host(k_cache).view(np.uint16), k_want.view(np.uint16))
                and np.array_equal(to_host(v_cache).view(np.uint16), v_want.view(np.uint16)))
        return (0.0 if same else 1.0), 0.0

    return run
