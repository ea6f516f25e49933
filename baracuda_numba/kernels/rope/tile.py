"""RoPE: 16-byte units, the angles shared by a block (``rope_tile``)."""

from __future__ import annotations

import functools

from numba import cuda, float32, float64, int64, types, uint32, uint64

from ...launch import Kernel, LazyTable
from ...types import ElementKind
from ..common import (
    load16,
    store16,
)
from .angles import rope_inv_freq, rope_sincos32
from .rows import _flat_c
from .tables import _make_unit_rotation, _unit_offset32
from .units import ROPE_UNIT_CODECS, ROPE_UNIT_LAYOUTS, unit_token

# -- 16-byte units, the angles shared by a block: ``rope_tile`` ---------------------------
#
# With ``positions`` given, θ depends on (b, s, pair): a block takes one row (b, s) of
# ``heads_per_block`` heads, its threads first load their unit(s), then the first R/2 threads
# compute the row's angles once into shared memory (one ``exp2`` and one ``sincos`` each),
# and after one barrier every thread rotates its unit with them. For small problems
# (decode: [64, 32, 1, 128]) the trig runs once per (row, pair) per block instead of once
# per thread, and no thread divides by a runtime extent.
#
#     block (x, y) = (items of a row, heads)     grid (x, y, z) = (s, b, head groups)
#
# One tile per block, no grid-stride loop, 32-bit unit offsets: the plan takes the kernel
# only where the grid covers the problem and the arrays span fewer than 2^31 units. The
# pairing is a runtime field (``half_split``): every thread loads its unit and the one
# ``partner`` units on (the plan's partner is 0 for interleaved: the same unit again, an L1
# hit), so no load sits under a branch.

#: Pairs of one row a ``rope_tile`` block can hold (R <= 1024): 4 KB of shared memory.
TILE_MAX_PAIRS = 512

#: Named fields of ``rope_tile``'s int64 parameter tuple; offsets and strides count 16-byte
#: units.
ROPE_TILE_PARAMS = ("num_heads", "heads_per_block", "rot_items", "partner", "copy_offset",
                    "x_b", "x_h", "x_s", "y_b", "y_h", "y_s", "pos_b", "pos_s",
                    "has_positions", "rotary_dim", "inverse", "half_split", "bf16")


def _make_rope_tile_kernel(elements: int, unpack, pack):
    """``rope_tile`` body for 16-byte units of ``elements`` elements, either pairing."""
    _, _, store_half = _make_unit_rotation(True, elements, unpack, pack)
    _, _, store_interleaved = _make_unit_rotation(False, elements, unpack, pack)

    def rope_tile(x, y, positions, params, freq_exponent):
        """Block = (items of one row, heads); grid = (s, b, head groups), one tile per
        block: the plan takes this kernel only where the grid covers the problem and every
        unit offset is below 2^31. ``params`` holds the ``ROPE_TILE_PARAMS`` fields.

        Decode-sized launches have about one block per SM, so the instructions each thread
        runs before its load, and the chain behind the barrier, are the kernel's time. So
        no loop test comes before the load, and the offsets are 32-bit (grid-stride loops
        and 64-bit offsets measured slower at decode: docs/design/rope.md)."""
        (num_heads, heads_per_block, rot_items, partner, copy_offset, x_b, x_h, x_s, y_b,
         y_h, y_s, pos_b, pos_s, has_positions, rotary_dim, inverse, half_split,
         bf16) = params
        shared_sin = cuda.shared.array(TILE_MAX_PAIRS, float32)
        shared_cos = cuda.shared.array(TILE_MAX_PAIRS, float32)
        sins = cuda.local.array(elements, float32)
        coss = cuda.local.array(elements, float32)
        pairs = elements if half_split else elements // 2
        item = int64(cuda.threadIdx.x)
        thread = int64(cuda.threadIdx.y) * int64(cuda.blockDim.x) + item
        threads = int64(cuda.blockDim.x) * int64(cuda.blockDim.y)
        half_rotary = rotary_dim // 2
        rotating = item < rot_items
        # a copied item is one unit past the rotary dim (its "partner" is itself)
        unit = item if rotating else copy_offset + item - rot_items
        unit_partner = partner if rotating else 0
        s = int64(cuda.blockIdx.x)
        b = int64(cuda.blockIdx.y)
        h = int64(cuda.blockIdx.z) * heads_per_block + int64(cuda.threadIdx.y)
        active = h < num_heads
        h = min(h, num_heads - 1)  # a thread past the last head stores nothing
        # Every thread loads before the angles are computed, without a branch: a value
        # loaded under a branch is waited for where the branches merge.
        x_unit = _unit_offset32(b, h, s, unit, x_b, x_h, x_s)
        first = load16(x, uint64(x_unit * 4))
        second = load16(x, uint64((x_unit + unit_partner) * 4))
        y_unit = _unit_offset32(b, h, s, unit, y_b, y_h, y_s)
        if thread < half_rotary:
            pos = positions[uint64(b * pos_b + s * pos_s)] if has_positions else s
            pair = thread
            while pair < half_rotary:
                sin_t, cos_t = rope_sincos32(pos, rope_inv_freq(pair, freq_exponent), inverse)
                shared_sin[pair] = sin_t
                shared_cos[pair] = cos_t
                pair += threads
        cuda.syncthreads()
        if active and rotating:
            for k in range(elements):
                if k < pairs:
                    sins[k] = shared_sin[item * pairs + k]
                    coss[k] = shared_cos[item * pairs + k]
            if half_split:
                store_half(y, y_unit, partner, first, second, sins, coss, bf16)
            else:
                store_interleaved(y, y_unit, partner, first, second, sins, coss, bf16)
        elif active:
            store16(y, uint64(y_unit * 4), first)

    return rope_tile


def build_rope_tile_kernel(element: ElementKind, layout: str) -> Kernel:
    """The ``rope_tile`` kernel of ``ROPE_UNIT_CODECS[element]``: one for both pairings
    (``layout``, a runtime field) and, for f16 and bf16, one for both."""
    return _build_rope_tile_kernel(unit_token(element))


@functools.cache
def _build_rope_tile_kernel(token: str) -> Kernel:
    element = ElementKind.F16 if token == "HALF" else ElementKind[token]
    _, unpack, pack, elements = ROPE_UNIT_CODECS[element]
    body = _make_rope_tile_kernel(elements, unpack, pack)
    words = _flat_c(uint32)
    return Kernel(f"rope_tile[{token}]", body,
                  (words, words, _flat_c(int64), types.UniTuple(int64, len(ROPE_TILE_PARAMS)),
                   float64))


#: (element kind, 16-byte layout) -> ``rope_tile`` kernel.
ROPE_TILE_KERNELS = LazyTable(
    [(element, layout) for element in ROPE_UNIT_CODECS for layout in ROPE_UNIT_LAYOUTS],
    lambda key: build_rope_tile_kernel(*key))
