"""Word access of contiguous runs for the reduce kernels: the same bytes as the element
array viewed as uint64 words, one load moving 2 f32 or 4 f16/bf16 elements (a plain
4-byte load per element falls well short of the copy bandwidth; 8-byte words with 8 loads
in flight per thread come close). Unpacking and packing per element kind (``VECTOR``), the
word stores, and the flip of a whole word for Min on Max's kernels.
(Measurements: docs/design/reduce.md, "Measured constants".)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numba import cuda, float32, types, uint16, uint32, uint64

from ..._runtime import SIMULATOR
from ...types import ElementKind, ReduceKind
from ..common import (
    eq_mask_bf16x4,
    eq_mask_f16x4,
    f32_from_bits,
    pack_bf16x4,
    pack_f16x4,
    pack_f32x2,
    unpack_f16x4,
    unpack_f32x2,
)
from .ops import HALF

#: The kernel kind whose runtime variant flips (Min on Max's kernels).
_FLIPPED = ReduceKind.MAX

#: Word loads each thread keeps in flight (8 x 8 bytes).
VEC_LOADS = 8


def tie_mask_iters(width: int) -> int:
    """Word-loop iterations (VEC_LOADS words of ``width`` elements per lane) per 64-bit tie
    mask of the Max/Min gradient's tie count after dx, one bit per element: 4 for f32, 2
    for f16/bf16; 1 in the simulator, whose small geometries give a lane only a few
    iterations per split (every mask boundary is exercised there)."""
    return 1 if SIMULATOR else 64 // (VEC_LOADS * width)


#: Register cap of the forward word kernels: 4 resident 256-thread blocks per SM, which the
#: plans' one-wave split rule assumes (uncapped: 80 registers for Sum, 127 for bf16 Var;
#: capped, ptxas spills 36-200 bytes, outside the load loop for Sum).
VEC_MAX_REGISTERS = 64

@cuda.jit(device=True, inline=True)
def _unpack_f32(w, values, base):
    values[base], values[base + 1] = unpack_f32x2(w)


@cuda.jit(device=True, inline=True)
def _unpack_bf16(w, values, base):
    lo = uint32(w & uint64(0xFFFFFFFF))
    hi = uint32(w >> uint64(32))
    values[base] = f32_from_bits(lo << uint32(16))
    values[base + 1] = f32_from_bits(lo & uint32(0xFFFF0000))
    values[base + 2] = f32_from_bits(hi << uint32(16))
    values[base + 3] = f32_from_bits(hi & uint32(0xFFFF0000))


@cuda.jit(device=True, inline=True)
def _unpack_f16(w, values, base):
    values[base], values[base + 1], values[base + 2], values[base + 3] = unpack_f16x4(w)


@cuda.jit(device=True, inline=True)
def _pack_f32(values):
    return pack_f32x2(values[0], values[1])


@cuda.jit(device=True, inline=True)
def _pack_bf16(values):
    return pack_bf16x4(values[0], values[1], values[2], values[3])


@cuda.jit(device=True, inline=True)
def _pack_f16(values):
    return pack_f16x4(values[0], values[1], values[2], values[3])


def _word_storer(width: int, storage: Any) -> Any:
    """``store_word(dx, dxv, word, w, shift)``: write word ``w`` at word index ``word`` of
    ``dxv`` (element ``word * width - shift`` of ``dx``). The simulator copies each kernel
    array in and out separately, so two views of one buffer would overwrite each other's
    writes: there the word is unpacked into ``dx`` elements instead."""
    if not SIMULATOR:

        @cuda.jit(device=True, inline=True)
        def store_word(dx, dxv, word, w, shift):
            dxv[uint64(word)] = w

        return store_word
    bits = 64 // width
    mask = (1 << bits) - 1
    view = {2: np.float32, 4: None}[width] if storage is not types.float16 else np.float16

    def as_storage(b):
        if view is np.float32:
            return np.uint32(b).view(np.float32)
        if view is np.float16:
            return np.uint16(b).view(np.float16)
        return np.uint16(b)

    @cuda.jit(device=True)
    def sim_store_word(dx, dxv, word, w, shift):
        for e in range(width):
            dx[int(word) * width - int(shift) + e] = as_storage((int(w) >> (e * bits)) & mask)

    return sim_store_word


@dataclass(frozen=True)
class VectorSpec:
    """Word access of an element kind: ``width`` elements per uint64 word, ``unpack(w,
    values, base)`` writes them (accumulator type) to ``values[base:base + width]`` in
    memory order, ``pack(values)`` rounds ``values[0:width]`` to the element kind and packs
    them into a word (bf16 on the GPU: ``cvt.rn.bf16x2.f32`` per pair, NaN canonical)."""

    width: int
    unpack: Any
    pack: Any
    store_word: Any
    eq_mask: Any = None  # f16/bf16: equality mask of two words (kernels.common.eq_mask_*)

    @property
    def log_width(self) -> int:
        return self.width.bit_length() - 1


#: Element kinds with word access (f64/i64 words hold one element: nothing to gain; i32
#: reductions are not a target).
VECTOR: dict[ElementKind, VectorSpec] = {
    ElementKind.F16: VectorSpec(4, _unpack_f16, _pack_f16, _word_storer(4, types.float16),
                                eq_mask_f16x4),
    ElementKind.BF16: VectorSpec(4, _unpack_bf16, _pack_bf16, _word_storer(4, uint16),
                                 eq_mask_bf16x4),
    ElementKind.F32: VectorSpec(2, _unpack_f32, _pack_f32, _word_storer(2, float32)),
}
#: The most elements a word holds (f16 / bf16).
_MAX_WIDTH = max(spec.width for spec in VECTOR.values())


@cuda.jit(device=True, inline=True)
def _unpack_half(w, values, base, bf16):
    if bf16:
        _unpack_bf16(w, values, base)
    else:
        _unpack_f16(w, values, base)


def _word_width(key: Any) -> int:
    """Elements per word of a forward element key with word access (HALF: 4)."""
    return 4 if key == HALF else VECTOR[key].width


#: Sign bits of every element of a word, by elements per word (the flip of a word).
_WORD_SIGNS = {4: 0x8000800080008000, 2: 0x8000000080000000}


def _word_unpacker(kind: Any, key: Any) -> Any:
    """Device function ``unpack(w, values, base, bf16, wsign)``: the word's elements (as
    ``VectorSpec.unpack``), flipped first by ``wsign`` (one XOR of the word) for the kind
    that flips."""
    if key == HALF:
        raw = _unpack_half
    else:
        plain = VECTOR[key].unpack

        @cuda.jit(device=True, inline=True)
        def raw(w, values, base, bf16):
            plain(w, values, base)

    if kind is not _FLIPPED:

        @cuda.jit(device=True, inline=True)
        def unpack(w, values, base, bf16, wsign):
            raw(w, values, base, bf16)

        return unpack

    @cuda.jit(device=True, inline=True)
    def unpack_flipped(w, values, base, bf16, wsign):
        raw(w ^ wsign, values, base, bf16)

    return unpack_flipped



def _word_sign(kind: Any, key: Any) -> Any:
    """Device function ``word_sign(variant)``: the XOR mask of a flipped word (0 where
    nothing flips)."""
    WSIGN = uint64(_WORD_SIGNS[_word_width(key)] if kind is _FLIPPED else 0)

    @cuda.jit(device=True, inline=True)
    def word_sign(variant):
        return WSIGN if variant else uint64(0)

    return word_sign
