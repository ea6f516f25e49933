"""Shared by the test suite and ``baracuda-check``: the tolerance table, storage
conversions (bf16 round-to-nearest-even in NumPy), poisoning and comparisons.

Tolerances are per element kind and come from the kind's unit roundoff, scaled by the
op's conditioning at the call site (``scale``); never from what makes a test pass.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import cuda

from .types import ElementKind

__all__ = [
    "SUBNORMAL_SPACING",
    "TOLERANCE",
    "assert_close",
    "assert_within",
    "bf16_bits_to_f32",
    "f32_to_bf16_bits",
    "from_storage",
    "max_relative_error",
    "poisoned",
    "random_values",
    "to_device",
    "to_host",
    "to_storage",
]

#: (rtol, atol) per element kind for ops with O(1) conditioning; callers scale by the op's
#: conditioning (e.g. sqrt(extent) for a sum).
TOLERANCE: dict[ElementKind, tuple[float, float]] = {
    # unit roundoff 2^-11 = 4.9e-4 for one rounding of the f32 result to f16, x2 margin
    ElementKind.F16: (1e-3, 1e-3),
    # unit roundoff 2^-8 = 3.9e-3 for one rounding to bf16, x2 margin
    ElementKind.BF16: (8e-3, 8e-3),
    # f32 unit roundoff 6e-8; a few roundings in f32 arithmetic stay under 1e-6
    ElementKind.F32: (1e-6, 1e-6),
    ElementKind.F32_STRICT: (1e-6, 1e-6),
    # f64 unit roundoff 1.1e-16, a few roundings
    ElementKind.F64: (1e-12, 1e-12),
    # integer results are exact
    ElementKind.I32: (0.0, 0.0),
    ElementKind.I64: (0.0, 0.0),
}

#: Spacing of each float kind's subnormals: a result that small is rounded to a multiple of
#: it, so one rounding there costs up to this much absolute error whatever the relative bound.
SUBNORMAL_SPACING: dict[ElementKind, float] = {
    ElementKind.F16: 2.0 ** -24,
    ElementKind.BF16: 2.0 ** -133,
    ElementKind.F32: 2.0 ** -149,
    ElementKind.F32_STRICT: 2.0 ** -149,
    ElementKind.F64: 0.0,
}


def f32_to_bf16_bits(values: Any) -> np.ndarray:
    """bf16 storage (uint16) of ``values``: round to nearest even, NaN kept quiet."""
    f = np.ascontiguousarray(values, dtype=np.float32)
    bits = f.view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    nan_bits = (((bits >> 16) & 0x8000) | 0x7FC0).astype(np.uint16)
    return np.where(np.isnan(f), nan_bits, rounded)


def bf16_bits_to_f32(bits: Any) -> np.ndarray:
    """f32 values of bf16 storage ``bits``."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def to_storage(values: Any, element: ElementKind) -> np.ndarray:
    """Host array in ``element``'s storage dtype (rounded as the device would)."""
    if element is ElementKind.BF16:
        return f32_to_bf16_bits(np.asarray(values, dtype=np.float64).astype(np.float32))
    return np.asarray(values).astype(element.storage_dtype)


def from_storage(stored: Any, element: ElementKind) -> np.ndarray:
    """float64 (or int64 for integer kinds) values of a storage array."""
    stored = np.asarray(stored)
    if element is ElementKind.BF16:
        return bf16_bits_to_f32(stored).astype(np.float64)
    if element in (ElementKind.I32, ElementKind.I64, ElementKind.U32, ElementKind.S8,
                   ElementKind.U8):
        return stored.astype(np.int64)
    return stored.astype(np.float64)


def random_values(shape: tuple[int, ...], element: ElementKind, rng: np.random.Generator,
                  low: float = -2.0, high: float = 2.0) -> np.ndarray:
    """Fresh random inputs in storage dtype; exactly representable in ``element``."""
    if element in (ElementKind.I32, ElementKind.I64, ElementKind.U32, ElementKind.S8,
                   ElementKind.U8, ElementKind.BOOL):
        info = np.iinfo(element.storage_dtype) if element is not ElementKind.BOOL else None
        if info is None:
            return rng.integers(0, 2, size=shape).astype(np.bool_)
        return rng.integers(max(info.min, -1000), min(info.max, 1000), size=shape,
                            endpoint=True).astype(element.storage_dtype)
    if element in (ElementKind.COMPLEX32, ElementKind.COMPLEX64):
        return (rng.uniform(low, high, shape) + 1j * rng.uniform(low, high, shape)).astype(
            element.storage_dtype)
    if element.is_float:
        return to_storage(rng.uniform(low, high, size=shape), element)
    # byte-level kinds (fp8, nibbles, bin): random bytes
    return rng.integers(0, 256, size=shape, dtype=np.uint8).astype(element.storage_dtype)


def poisoned(shape: tuple[int, ...], element: ElementKind) -> np.ndarray:
    """A storage array that no kernel writes by accident: NaN for floats, 0xFF bytes else."""
    if element.is_float:
        return to_storage(np.full(shape, np.nan), element)
    out = np.empty(shape, dtype=element.storage_dtype)
    out.view(np.uint8)[...] = 0xFF
    return out


def to_device(host: np.ndarray) -> Any:
    """A Numba device array (the simulator's stand-in when no GPU) holding ``host``."""
    return cuda.to_device(np.ascontiguousarray(host))


def to_host(device: Any) -> np.ndarray:
    """Copy a device array (Numba, CuPy or torch) back to a NumPy array."""
    if hasattr(device, "copy_to_host"):
        return device.copy_to_host()
    if hasattr(device, "get"):
        return device.get()
    return device.detach().cpu().numpy()


def max_relative_error(actual: np.ndarray, expected: np.ndarray, atol: float) -> float:
    """max |a - e| / (|e| + atol/rtol-scale) over finite positions; inf if NaN/inf differ."""
    actual = np.asarray(actual, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    if actual.shape != expected.shape:
        return float("inf")
    if not np.array_equal(np.isnan(actual), np.isnan(expected)):
        return float("inf")
    inf_e = np.isinf(expected)
    if not np.array_equal(inf_e, np.isinf(actual)) or \
            not np.array_equal(actual[inf_e], expected[inf_e]):
        return float("inf")
    finite = np.isfinite(expected)
    if not finite.any():
        return 0.0
    diff = np.abs(actual[finite] - expected[finite])
    return float(np.max(diff / (np.abs(expected[finite]) + max(atol, 1e-300))))


def assert_within(actual: Any, expected: Any, bound: Any, what: str = "") -> None:
    """Assert ``|actual - expected| <= bound`` (scalar or elementwise) at finite positions,
    with NaN and +-inf positions compared separately; on failure show the first
    mismatches."""
    actual = np.asarray(actual, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    bound = np.broadcast_to(np.asarray(bound, dtype=np.float64), actual.shape)
    nan_a, nan_e = np.isnan(actual), np.isnan(expected)
    bad = nan_a != nan_e
    inf_e = np.isinf(expected)
    bad |= inf_e & (actual != expected)
    bad |= np.isinf(actual) & ~inf_e
    finite = ~(nan_a | nan_e | inf_e | np.isinf(actual))
    with np.errstate(invalid="ignore"):
        bad |= finite & (np.abs(actual - expected) > bound)
    if bad.any():
        where = np.argwhere(bad)[:8]
        rows = "\n".join(f"  at {tuple(int(i) for i in idx)}: got {actual[tuple(idx)]!r}, "
                         f"expected {expected[tuple(idx)]!r}, bound {bound[tuple(idx)]!r}"
                         for idx in where)
        raise AssertionError(f"{what}: {int(bad.sum())} of {bad.size} elements differ; "
                             f"first:\n{rows}")


def assert_close(actual: Any, expected: Any, rtol: float, atol: float, what: str = "") -> None:
    """Assert ``|actual - expected| <= atol + rtol*|expected|`` elementwise, with NaN and
    +-inf positions compared separately (see :func:`assert_within`)."""
    expected = np.asarray(expected, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        bound = atol + rtol * np.abs(expected)
    assert_within(actual, expected, bound, f"{what} (rtol={rtol}, atol={atol})")
