"""Scan: per-element storage, the combine operations of every kind (forward and
backward) and the tile sizes of the generic kernels (see the package docstring)."""

from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32, float64, int32, int64, types, uint16

from ..._runtime import SIMULATOR
from ...types import ElementKind, ScanKind
from ..common import (
    f32_to_half,
    half_to_f32,
    is_half,
    to_f32,
    to_f64,
)

# Threads per block of the rows kernel and elements per thread per tile. Simulator: one
# Python thread per CUDA thread, so 2 warps of 2 items (still exercises every code path).
ROWS_BLOCK = 64 if SIMULATOR else 256
_ITEMS_4B = 2 if SIMULATOR else 8  # 4-byte accumulators: 256 x 8 = 2048-element tiles
_ITEMS_8B = 2 if SIMULATOR else 4  # 8-byte accumulators: 8 KB/16 KB of smem per tile
_UNROLL = 4  # lines kernel: loads in flight per thread per step

# -- storage <-> accumulator -----------------------------------------------------------


@cuda.jit(device=True, inline=True)
def _i32_same(v, bf16):
    return int32(v)


@cuda.jit(device=True, inline=True)
def _i64_same(v, bf16):
    return int64(v)


@cuda.jit(device=True, inline=True)
def _f32_same(v, bf16):
    return to_f32(v)


@cuda.jit(device=True, inline=True)
def _f64_same(v, bf16):
    return to_f64(v)


#: element kind -> (storage type, accumulator type, widen, narrow); ``widen(v, bf16)`` /
#: ``narrow(v, bf16)`` take the launch's bf16 flag. f16 and bf16 share one ``HALF`` kernel
#: (uint16 storage, f32 accumulators) whose flag picks the conversion.
SCAN_STORAGE = {
    ElementKind.F16: (uint16, float32, half_to_f32, f32_to_half),
    ElementKind.BF16: (uint16, float32, half_to_f32, f32_to_half),
    ElementKind.F32: (float32, float32, _f32_same, _f32_same),
    ElementKind.F64: (float64, float64, _f64_same, _f64_same),
    ElementKind.I32: (int32, int32, _i32_same, _i32_same),
    ElementKind.I64: (int64, int64, _i64_same, _i64_same),
}


def element_token(element: ElementKind) -> str:
    """The element token of a scan kernel's name: ``HALF`` for f16 and bf16 (one kernel)."""
    return "HALF" if is_half(element) else element.name


def token_element(token: str) -> ElementKind:
    """The element kind a kernel of name token ``token`` is built for (f16 for ``HALF``)."""
    return ElementKind.F16 if token == "HALF" else ElementKind[token]

FLOAT_ELEMENTS = (ElementKind.F16, ElementKind.BF16, ElementKind.F32, ElementKind.F64)
INT_ELEMENTS = (ElementKind.I32, ElementKind.I64)


# -- the combine operations ------------------------------------------------------------

#: Op codes (a kernel argument; the branch on it is uniform across the grid). Forward codes
#: are the ScanKind values plus the two record-flag pre-passes of the extremum backward.
CODE_CUMSUM = int(ScanKind.CUMSUM)
CODE_CUMPROD = int(ScanKind.CUMPROD)
CODE_CUMMAX = int(ScanKind.CUMMAX)
CODE_CUMMIN = int(ScanKind.CUMMIN)
CODE_LOG_CUMSUM_EXP = int(ScanKind.LOG_CUMSUM_EXP)
CODE_CUMMAX_RECORD_FLAG = 5
CODE_CUMMIN_RECORD_FLAG = 6
#: Backward codes: CODE_CUMPROD, CODE_LOG_CUMSUM_EXP, and this one for Cummax and Cummin.
CODE_EXTREMUM_BACKWARD = 2
#: Added to the code of a half kernel's launch for bf16 data (f16: not added); every kernel
#: with a ``code`` argument splits it at entry (``code >= CODE_BF16``, then the low bits).
CODE_BF16 = 16


def with_bf16(code: int, element: ElementKind) -> int:
    """The ``code`` argument of a launch at ``element``: ``CODE_BF16`` added for bf16."""
    return code + CODE_BF16 if element is ElementKind.BF16 else code


class ScanOp:
    """Compile-time description of one direction (forward or backward) at one element
    kind: the device functions and constants the kernel factories capture."""

    def __init__(self, name: str, element: ElementKind, backward: bool) -> None:
        storage, acc, widen, narrow = SCAN_STORAGE[element]
        self.name = name
        self.element = element
        self.token = element_token(element)
        self.storage = storage
        self.acc = acc
        self.aux = acc if backward else int64
        self.widen = widen
        self.narrow = narrow
        self.n_in = 3 if backward else 1
        self.halo = backward
        self.with_index = not backward
        ops = _backward_ops(acc) if backward else _forward_ops(acc)
        self.identity, self.lift, self.combine, self.emit = ops
        self.items = _ITEMS_8B if acc.bitwidth == 64 else _ITEMS_4B
        # smem slot j lives at j + j // pad: a thread reading ITEMS consecutive slots
        # and a warp reading 32 consecutive slots are both free of bank conflicts
        self.pad = 16 if acc.bitwidth == 64 else 32
        self.idx_pad = 16


def _constants(acc: types.Type):
    dtype = np.dtype(str(acc))
    if dtype.kind == "f":
        return dtype.type(0), dtype.type(1), dtype.type(-np.inf), dtype.type(np.inf)
    info = np.iinfo(dtype)
    return dtype.type(0), dtype.type(1), dtype.type(info.min), dtype.type(info.max)


def _make_logaddexp(acc: types.Type):
    """log(exp(x) + exp(y)) with -inf the identity (never exp(-inf - -inf)), +inf
    absorbing and NaN propagating."""
    _, _, lowest, highest = _constants(acc)

    @cuda.jit(device=True, inline=True)
    def logaddexp(x, y):
        if x != x or y != y:
            return acc(x + y)
        hi = x if x >= y else y
        lo = y if x >= y else x
        if lo == lowest or hi == highest:
            return hi
        return acc(hi + math.log1p(math.exp(lo - hi)))

    return logaddexp


def _forward_ops(acc: types.Type):
    """Forward kinds; state (value, index). Cummax/Cummin: NaN dominates; ties go to the
    later index (torch.cummax), the record-flag pre-passes too, whose ``emit`` writes 1
    where the element is the running winner (a record) and 0 elsewhere.
    LogCumsumExp: logaddexp with -inf as the identity (never exp(-inf - -inf)) and +inf
    absorbing."""
    zero, one, lowest, highest = _constants(acc)
    no_index = int64(-1)

    @cuda.jit(device=True, inline=True)
    def identity(code):
        if code == CODE_CUMSUM:
            return (zero, no_index)
        if code == CODE_CUMPROD:
            return (one, no_index)
        if code == CODE_CUMMAX or code == CODE_CUMMAX_RECORD_FLAG or \
                code == CODE_LOG_CUMSUM_EXP:
            return (lowest, no_index)
        return (highest, no_index)

    @cuda.jit(device=True, inline=True)
    def lift(v0, v1, v2, v2n, has_next, pos, code):
        return (v0, int64(pos))

    logaddexp = _make_logaddexp(acc)

    @cuda.jit(device=True, inline=True)
    def combine(a, b, code):
        if code == CODE_CUMSUM:
            return (acc(a[0] + b[0]), b[1])
        if code == CODE_CUMPROD:
            return (acc(a[0] * b[0]), b[1])
        if code == CODE_LOG_CUMSUM_EXP:
            return (logaddexp(a[0], b[0]), b[1])
        # the record-flag pre-passes follow the same rule: a record is where the index
        # output changes, so the gradient goes where torch's does
        if b[0] != b[0]:  # a later NaN wins (torch: the index of the last NaN)
            return b
        if a[0] != a[0]:
            return a
        if code == CODE_CUMMAX or code == CODE_CUMMAX_RECORD_FLAG:
            return b if b[0] >= a[0] else a
        return b if b[0] <= a[0] else a

    @cuda.jit(device=True, inline=True)
    def emit(excl, incl, v0, v1, v2, v2n, has_next, pos, code):
        if code >= CODE_CUMMAX_RECORD_FLAG:
            return (one if incl[1] == pos else zero), int64(0)
        return incl[0], incl[1]

    return identity, lift, combine, emit


def _backward_ops(acc: types.Type):
    """Backward recurrences ``q -> m (q + dy)``, ``dx = w (dy + B_excl)`` (state (A, B),
    see the module docstring). Inputs: v0 = dy, v1 = x (the record flag for the extremum
    backward), v2 = y, v2n = y at the forward-previous position (valid if ``has_next``)."""
    zero, one, neg_inf, _ = _constants(acc)

    @cuda.jit(device=True, inline=True)
    def identity(code):
        return (one, zero)

    @cuda.jit(device=True, inline=True)
    def lift(v0, v1, v2, v2n, has_next, pos, code):
        if code == CODE_CUMPROD:
            return (v1, acc(v1 * v0))
        if code == CODE_LOG_CUMSUM_EXP:
            if not has_next or v2n == neg_inf:
                return (zero, zero)
            m = acc(math.exp(v2n - v2))
            if m == zero:
                return (zero, zero)
            return (m, acc(m * v0))
        if v1 != zero:  # a record: the running sum stops here
            return (zero, zero)
        return (one, v0)

    @cuda.jit(device=True, inline=True)
    def combine(a, b, code):
        # A zero multiplier cuts the chain exactly: what lies beyond a record (or beyond
        # a +inf in log space) does not reach earlier positions, even if it is NaN.
        # Cumprod keeps IEEE products (0 * inf = NaN, as the true gradient has).
        if b[0] == zero and code != CODE_CUMPROD:
            return (zero, b[1])
        return (acc(b[0] * a[0]), acc(b[0] * a[1] + b[1]))

    @cuda.jit(device=True, inline=True)
    def emit(excl, incl, v0, v1, v2, v2n, has_next, pos, code):
        if code == CODE_CUMPROD:
            weight = v2n if has_next else one
            return acc(weight * (v0 + excl[1])), int64(0)
        if code == CODE_LOG_CUMSUM_EXP:
            if v1 == neg_inf:
                return zero, int64(0)
            return acc(math.exp(v1 - v2) * (v0 + excl[1])), int64(0)
        if v1 != zero:
            return acc(v0 + excl[1]), int64(0)
        return zero, int64(0)

    return identity, lift, combine, emit
