"""RoPE: the device pieces every kernel shares: accurate trig, element loads, angles,
and where positions, angles and destination rows come from."""

from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32, float64, int32, int64, uint32, uint64
from numba.types import float16

from ..._runtime import SIMULATOR
from ...types import ElementKind
from ..common import (
    bf16_to_f32,
    bitcast,
    f16_from_bits,
    f32_from_bits,
)

#: Heads a thread loads before storing any (memory-level parallelism; registers bound it:
#: see docs/design/rope.md for the sweep).
HEAD_BATCH = 8

# -- accurate trig (simulator: the math module) -------------------------------------------


if SIMULATOR:

    @cuda.jit(device=True, inline=True)
    def _sincos32(theta):
        return np.float32(math.sin(theta)), np.float32(math.cos(theta))

    @cuda.jit(device=True, inline=True)
    def _sincos64(theta):
        return math.sin(theta), math.cos(theta)

    @cuda.jit(device=True, inline=True)
    def _exp2_64(value):
        return math.pow(2.0, value)

    @cuda.jit(device=True, inline=True)
    def _rint64(value):
        return np.rint(value)

else:
    from numba.cuda import libdevice

    @cuda.jit(device=True, inline=True)
    def _sincos32(theta):
        # __nv_sincosf: the accurate libdevice routine (Payne-Hanek for large |θ|), not the
        # __sinf/__cosf intrinsics upstream uses.
        return libdevice.sincosf(theta)

    @cuda.jit(device=True, inline=True)
    def _sincos64(theta):
        return libdevice.sincos(theta)

    @cuda.jit(device=True, inline=True)
    def _exp2_64(value):
        return libdevice.exp2(value)

    @cuda.jit(device=True, inline=True)
    def _rint64(value):
        return libdevice.rint(value)


# -- per element kind: how a unit of two elements is unpacked and packed -----------------


@cuda.jit(device=True, inline=True)
def _f16_load(value):
    return float32(value)


@cuda.jit(device=True, inline=True)
def _f16_store(value):
    return float16(value)


@cuda.jit(device=True, inline=True)
def _f32_load(value):
    return float32(value)


@cuda.jit(device=True, inline=True)
def _f64_load(value):
    return float64(value)


# -- angles -------------------------------------------------------------------------------


@cuda.jit(device=True, inline=True)
def rope_inv_freq(pair, freq_exponent):
    """``base^(−2·pair/R) = 2^(pair · freq_exponent)`` in f64, with ``freq_exponent =
    −2·log2(base)/R`` from the host (the plan): relative error about 1e-15. One multiply
    and libdevice's ``exp2`` (an f64 division here measured slower at decode shapes)."""
    return _exp2_64(float64(pair) * freq_exponent)


#: 2π as an f64 head and tail (Cody–Waite): ``TWO_PI_HI + TWO_PI_LO`` = 2π to ~1e-32.
TWO_PI_HI = 6.283185307179586
TWO_PI_LO = 2.4492935982947064e-16
INV_TWO_PI = 0.15915494309189535


@cuda.jit(device=True, inline=True)
def reduce_angle(pos, inv_freq):
    """``θ = pos · inv_freq`` reduced to ``[−π, π]`` in f64, rounded once to f32.

    ``θ`` is one f64 product (relative error 2^-53: 1e-10 absolute at θ = 10^6), the turn
    count ``k = rint(θ / 2π)`` and ``θ − k·2π`` a two-step Cody–Waite reduction with fused
    multiply-adds (each step exact up to one rounding of a value below 2π), so the f32
    angle handed to ``sincosf`` is within half an ulp of π of the true one at any
    position below 2^40. A handful of f64 operations per (row, pair), amortised over the
    heads a thread rotates; the f32 alternative (θ rounded in f32 before sincos) was off
    by 0.03 at position 10^6."""
    theta = float64(pos) * float64(inv_freq)
    turns = _rint64(theta * INV_TWO_PI)
    reduced = cuda.fma(-turns, TWO_PI_HI, theta)
    return float32(cuda.fma(-turns, TWO_PI_LO, reduced))


@cuda.jit(device=True, inline=True)
def rope_sincos32(pos, inv_freq, inverse):
    """(sin, cos) in f32 of ``θ = pos · inv_freq`` (:func:`reduce_angle`); sin negated for
    the backward."""
    sin_t, cos_t = _sincos32(reduce_angle(pos, inv_freq))
    if inverse:
        sin_t = -sin_t
    return sin_t, cos_t


@cuda.jit(device=True, inline=True)
def rope_sincos64(pos, inv_freq, inverse):
    """(sin, cos) of ``θ = f64(pos) · inv_freq`` in f64; sin negated for the backward."""
    sin_t, cos_t = _sincos64(float64(pos) * inv_freq)
    if inverse:
        sin_t = -sin_t
    return sin_t, cos_t


@cuda.jit(device=True, inline=True)
def rotate_pair(a, b, sin_t, cos_t):
    """``(a·cos − b·sin, b·cos + a·sin)`` as one product and one fma each: the grouping is
    fixed, so every layout rounds identically (left alone, NVVM contracts differently per
    kernel and the element and unit paths then differ by an ulp)."""
    return cuda.fma(a, cos_t, -(b * sin_t)), cuda.fma(b, cos_t, a * sin_t)


# -- where positions, angles and destination rows come from (``rope_rows``) --------------

#: ``ROPE_SOURCES.angle_source``: θ from ``base`` (``exp2``), from an ``inv_freq`` vector,
#: or cos/sin read from tables.
ANGLES_BASE, ANGLES_INV_FREQ, ANGLES_TABLE = 0, 1, 2

#: ``ROPE_SOURCES.cs_kind``: the cos/sin tables' element type, read from 16-bit words.
TABLE_KINDS = {ElementKind.F16: 0, ElementKind.BF16: 1, ElementKind.F32: 2,
               ElementKind.F64: 3}


@cuda.jit(device=True, inline=True)
def load_index(words, index, wide):
    """Element ``index`` of an int64 (``wide``) or int32 array seen as 32-bit words."""
    if wide:
        low = uint64(words[uint64(2 * index)])
        return int64(low | (uint64(words[uint64(2 * index + 1)]) << uint64(32)))
    return int64(int32(words[uint64(index)]))


@cuda.jit(device=True, inline=True)
def load_real(halves, index, kind):
    """Element ``index`` of an f16 / bf16 / f32 / f64 array (``TABLE_KINDS``) seen as
    16-bit words, in f64 (exact for every kind): one signature serves every table type."""
    if kind == 0:
        return float64(float32(f16_from_bits(halves[uint64(index)])))
    if kind == 1:
        return float64(bf16_to_f32(halves[uint64(index)]))
    if kind == 2:
        word = uint64(2 * index)
        return float64(f32_from_bits(uint32(halves[word])
                                     | (uint32(halves[word + 1]) << uint32(16))))
    word = uint64(4 * index)
    bits = (uint64(halves[word]) | (uint64(halves[word + 1]) << uint64(16))
            | (uint64(halves[word + 2]) << uint64(32)) | (uint64(halves[word + 3]) << uint64(48)))
    return bitcast(bits, float64)


@cuda.jit(device=True, inline=True)
def find_sequence(cu_seqlens, count, wide, token):
    """The sequence ``i < count`` with ``cu_seqlens[i] <= token`` (the last such: binary
    search over the increasing offsets)."""
    low = int64(0)
    high = count - 1
    while low < high:
        middle = (low + high + 1) // 2
        if load_index(cu_seqlens, middle, wide) <= token:
            low = middle
        else:
            high = middle - 1
    return low


@cuda.jit(device=True, inline=True)
def row_position(positions, cu_seqlens, b, s, pos_b, pos_s, has_positions, pos_wide,
                 pos_plus_s, cu_count, cu_wide):
    """The position of row (b, s): with ``cu_seqlens`` (packed ``[T, H, D]``, b = 0, s = the
    token) ``s − cu[i]`` plus ``positions[i]`` (per-sequence offsets) if given; else
    ``positions[b, s]`` (plus ``s`` where ``pos_plus_s``: per-sequence starts) or ``s``."""
    if cu_count > 0:
        sequence = find_sequence(cu_seqlens, cu_count, cu_wide, s)
        pos = s - load_index(cu_seqlens, sequence, cu_wide)
        if has_positions:
            pos += load_index(positions, sequence * pos_s, pos_wide)
        return pos
    if has_positions:
        pos = load_index(positions, b * pos_b + s * pos_s, pos_wide)
        if pos_plus_s:
            pos += s
        return pos
    return s
