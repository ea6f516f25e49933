"""RoPE: rotate feature pairs of every ``[B, H, S, D]`` row by ``θ = pos · base^(−2i/R)``.

For pair ``i < R/2`` (``R`` = rotary_dim, default ``D``) with members ``(a, b)``::

    forward  (RopePlan):          a' = a·cosθ − b·sinθ     b' = b·cosθ + a·sinθ
    backward (RopeBackwardPlan):  rotation by −θ (sinθ negated); no saved tensors

``INTERLEAVED`` pairs are ``(2i, 2i+1)`` (GPT-J), ``HALF_SPLIT`` pairs ``(i, i + R/2)``
(NeoX ``rotate_half``). Features ``R..D-1`` are copied bit for bit. ``pos`` is
``positions[b, s]`` (stride 0 over ``b`` for a shared ``[S]`` table) or ``s``.

Precision: for f16/bf16/f32 the inverse frequency ``2^(−(2i/R)·log2 base)`` is evaluated in
f64 (``log2 base`` from the host) and rounded once to f32, ``θ = f32(pos) ⊗ inv_freq`` is
one f32 multiply, and cos/sin are libdevice's accurate ``sincosf`` (full range reduction,
so positions of 10^6 stay accurate); the rotation is one product and one fma per output in
f32, rounded once to the storage type. f64 does all of it in f64.

Work layout (one thread = one *item* of one row, for a run of heads)::

    block (x, y) = (items of a row, consecutive rows)     grid-stride on both axes
    grid.x * block.x -> (head group, item)   item = 1..4 pairs, or a unit to copy
    per thread:  inv_freq once per item; per row: pos and one sincos per pair, then
                 heads_per_thread heads, HEAD_BATCH of them loaded before any is stored
                 (memory-level parallelism; also makes in place safe: every element is
                 read and written by the same thread)

Layouts (``ROPE_LAYOUTS``: elements per memory unit, pairs per item):

* ``pairs``: element accesses, any pairing, any alignment: the general path;
* ``interleaved`` / ``interleaved4``: one unit of 2 / 4 elements holds 1 / 2 pairs
  (u32 / u64 for f16 and bf16, u64 for f32);
* ``half_split`` / ``half_split4``: an item is a unit from each half, ``[w·j, w·j+w)`` and
  the same plus ``R/2``: 2 / 4 pairs, one access each.

The unit layouts need unit-aligned pointers and outer strides and a rotary dim (and copied
tail) that units tile; the plan picks the widest that fits. Units are reinterpreted in
registers: f16 by a bit-cast intrinsic plus the hardware ``cvt``, bf16 by shifts (the RNE
narrowing of ``common.f32_to_bf16``), f32 by bit casts.
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32, float64, int64, types, uint16, uint32, uint64
from numba.types import float16

from .._runtime import SIMULATOR
from ..launch import Kernel
from ..types import ElementKind
from .common import bf16_to_f32, bitcast, f32_to_bf16

#: Heads a thread loads before storing any (memory-level parallelism; registers bound it:
#: see docs/notes/rope.md for the sweep).
HEAD_BATCH = 8

# -- bit casts and accurate trig (simulator: NumPy views and the math module) -----------


@cuda.jit(device=True, inline=True)
def _bits_as_f32(bits):
    return bitcast(uint32(bits), float32)


@cuda.jit(device=True, inline=True)
def _f32_as_bits(value):
    return bitcast(float32(value), uint32)


@cuda.jit(device=True, inline=True)
def f16_from_bits(bits):
    """The float16 stored in the low 16 bits of integer ``bits`` (f16 -> f32 is then the
    hardware ``cvt``)."""
    return bitcast(uint16(bits & 0xFFFF), float16)


@cuda.jit(device=True, inline=True)
def f16_to_bits(value):
    """uint32 holding the 16 storage bits of float16 ``value``."""
    return uint32(bitcast(float16(value), uint16))


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
    def _pack_bf16x2(low, high):
        return uint32(f32_to_bf16(low)) | (uint32(f32_to_bf16(high)) << uint32(16))

else:
    from llvmlite import ir
    from numba.cuda import libdevice
    from numba.cuda.extending import intrinsic

    @intrinsic
    def _cvt_bf16x2(typingctx, high, low):
        """``cvt.rn.bf16x2.f32``: both values rounded to nearest even in one instruction
        (sm_80+), ``high`` in the upper half. The software narrowing of
        ``common.f32_to_bf16`` is 6 integer instructions per value plus a NaN test; with it,
        bf16 half_split4 needed 132 registers at 8 heads per batch (ptxas, sm_90). Same
        results except NaN, which comes out as the canonical quiet NaN."""

        def codegen(context, builder, signature, args):
            fnty = ir.FunctionType(ir.IntType(32), [ir.FloatType(), ir.FloatType()])
            asm = ir.InlineAsm(fnty, "cvt.rn.bf16x2.f32 $0, $1, $2;", "=r,f,f")
            return builder.call(asm, args)

        return uint32(float32, float32), codegen

    @cuda.jit(device=True, inline=True)
    def _pack_bf16x2(low, high):
        return _cvt_bf16x2(float32(high), float32(low))

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


# -- per element kind: how a unit of two elements is unpacked and packed -----------------


@cuda.jit(device=True, inline=True)
def _unpack_f16x2(unit):
    return (float32(f16_from_bits(unit & uint32(0xFFFF))),
            float32(f16_from_bits(unit >> uint32(16))))


@cuda.jit(device=True, inline=True)
def _pack_f16x2(low, high):
    # float16(f32) is cvt.rn.f16.f32: round to nearest even, overflow to inf, NaN kept
    return f16_to_bits(float16(low)) | (f16_to_bits(float16(high)) << uint32(16))


@cuda.jit(device=True, inline=True)
def _unpack_bf16x2(unit):
    return (bf16_to_f32(uint16(unit & uint32(0xFFFF))),
            bf16_to_f32(uint16(unit >> uint32(16))))


@cuda.jit(device=True, inline=True)
def _unpack_f16x4(unit):
    low, high = uint32(unit & uint64(0xFFFFFFFF)), uint32(unit >> uint64(32))
    a0, a1 = _unpack_f16x2(low)
    a2, a3 = _unpack_f16x2(high)
    return a0, a1, a2, a3


@cuda.jit(device=True, inline=True)
def _pack_f16x4(a0, a1, a2, a3):
    return uint64(_pack_f16x2(a0, a1)) | (uint64(_pack_f16x2(a2, a3)) << uint64(32))


@cuda.jit(device=True, inline=True)
def _unpack_bf16x4(unit):
    low, high = uint32(unit & uint64(0xFFFFFFFF)), uint32(unit >> uint64(32))
    a0, a1 = _unpack_bf16x2(low)
    a2, a3 = _unpack_bf16x2(high)
    return a0, a1, a2, a3


@cuda.jit(device=True, inline=True)
def _pack_bf16x4(a0, a1, a2, a3):
    return uint64(_pack_bf16x2(a0, a1)) | (uint64(_pack_bf16x2(a2, a3)) << uint64(32))


@cuda.jit(device=True, inline=True)
def _unpack_f32x2(unit):
    return (_bits_as_f32(uint32(unit & uint64(0xFFFFFFFF))),
            _bits_as_f32(uint32(unit >> uint64(32))))


@cuda.jit(device=True, inline=True)
def _pack_f32x2(low, high):
    return uint64(_f32_as_bits(low)) | (uint64(_f32_as_bits(high)) << uint64(32))


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
def rope_inv_freq(pair, rotary_dim, log2_base):
    """``base^(−2·pair/R) = 2^(−(2·pair/R)·log2(base))`` in f64, with ``log2(base)`` from the
    host: relative error about 1e-15, far below the f32 rounding that follows (exp2 is the
    cheaper libdevice routine; it runs once per thread and item)."""
    return _exp2_64(-(float64(2 * pair) / float64(rotary_dim)) * log2_base)


@cuda.jit(device=True, inline=True)
def rope_sincos32(pos, inv_freq, inverse):
    """(sin, cos) of ``θ = f32(pos) ⊗ f32(inv_freq)``; sin negated for the backward."""
    sin_t, cos_t = _sincos32(float32(pos) * float32(inv_freq))
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


# -- the kernel skeleton, specialised per element kind and layout ------------------------

#: layout -> (elements per memory unit, pairs per item); see the module docstring.
ROPE_LAYOUTS = {
    "pairs": (1, 1),
    "interleaved": (2, 1),
    "half_split": (2, 2),
    "interleaved4": (4, 2),
    "half_split4": (4, 4),
}

#: Named fields of the kernel's int64 parameter tuple (one tuple: fewer launch arguments
#: to pack per call).
ROPE_PARAMS = ("rows", "seq_len", "num_heads", "heads_per_thread", "items_per_row",
               "rot_items", "pair_step", "partner", "copy_offset", "x_b", "x_h", "x_s",
               "y_b", "y_h", "y_s", "pos_b", "pos_s", "has_positions", "rotary_dim",
               "inverse")


def _make_rope_kernel(layout: str, storage, unpack, pack, to_compute, from_compute, sincos,
                      batch: int):
    """Kernel body for one ``ROPE_LAYOUTS`` entry.

    ``pairs``: arrays of elements; ``to_compute``/``from_compute`` convert one element.
    Unit layouts: arrays of 2- or 4-element units; ``unpack``/``pack`` convert one unit.
    ``storage`` is the array's Numba type (registers hold a batch of heads in it).
    """
    width, pairs_per_item = ROPE_LAYOUTS[layout]
    compute_type = float64 if sincos is rope_sincos64 else float32
    two_units = layout.startswith("half_split")  # an item reads a unit from each half
    copy_step = 2 if width == 1 else 1  # a copied item is 2 elements or 1 unit

    # load(array, offset, partner, first, second, k): the item's unit(s) -> slot k
    # rotate_store(array, offset, partner, first, second, sins, coss)
    # Indices are cast to uint64: Numba then skips the negative-index wrap-around code.
    if width == 1:

        @cuda.jit(device=True, inline=True)
        def rotate_store(array, offset, partner, first, second, sins, coss):
            ya, yb = rotate_pair(to_compute(first), to_compute(second), sins[0], coss[0])
            array[uint64(offset)] = from_compute(ya)
            array[uint64(offset + partner)] = from_compute(yb)

    elif layout == "interleaved":

        @cuda.jit(device=True, inline=True)
        def rotate_store(array, offset, partner, first, second, sins, coss):
            a, b = unpack(first)
            ya, yb = rotate_pair(a, b, sins[0], coss[0])
            array[uint64(offset)] = pack(ya, yb)

    elif layout == "half_split":

        @cuda.jit(device=True, inline=True)
        def rotate_store(array, offset, partner, first, second, sins, coss):
            a0, a1 = unpack(first)
            b0, b1 = unpack(second)
            ya0, yb0 = rotate_pair(a0, b0, sins[0], coss[0])
            ya1, yb1 = rotate_pair(a1, b1, sins[1], coss[1])
            array[uint64(offset)] = pack(ya0, ya1)
            array[uint64(offset + partner)] = pack(yb0, yb1)

    elif layout == "interleaved4":

        @cuda.jit(device=True, inline=True)
        def rotate_store(array, offset, partner, first, second, sins, coss):
            a0, b0, a1, b1 = unpack(first)
            ya0, yb0 = rotate_pair(a0, b0, sins[0], coss[0])
            ya1, yb1 = rotate_pair(a1, b1, sins[1], coss[1])
            array[uint64(offset)] = pack(ya0, yb0, ya1, yb1)

    else:  # half_split4

        @cuda.jit(device=True, inline=True)
        def rotate_store(array, offset, partner, first, second, sins, coss):
            a0, a1, a2, a3 = unpack(first)
            b0, b1, b2, b3 = unpack(second)
            ya0, yb0 = rotate_pair(a0, b0, sins[0], coss[0])
            ya1, yb1 = rotate_pair(a1, b1, sins[1], coss[1])
            ya2, yb2 = rotate_pair(a2, b2, sins[2], coss[2])
            ya3, yb3 = rotate_pair(a3, b3, sins[3], coss[3])
            array[uint64(offset)] = pack(ya0, ya1, ya2, ya3)
            array[uint64(offset + partner)] = pack(yb0, yb1, yb2, yb3)

    second_member = width == 1 or two_units  # does an item read a second element/unit?

    @cuda.jit(device=True, inline=True)
    def load(array, offset, partner, first, second, k):
        first[k] = array[uint64(offset)]
        if second_member:
            second[k] = array[uint64(offset + partner)]

    @cuda.jit(device=True, inline=True)
    def copy_load(array, offset, first, second, k):
        first[k] = array[uint64(offset)]
        if width == 1:
            second[k] = array[uint64(offset + 1)]

    @cuda.jit(device=True, inline=True)
    def copy_store(array, offset, first, second):
        array[uint64(offset)] = first
        if width == 1:
            array[uint64(offset + 1)] = second

    # `batch` loads in flight before any store. The batch lives in a local array
    # (constant-trip loops: unrolled and kept in registers by NVVM) so that each helper is
    # inlined once: Numba inlines at the IR level and hand-unrolled bodies cost minutes of
    # compile time. A last, partial batch repeats the last head: the same thread loads all
    # of a batch before storing any, so the repeat rewrites the same value.

    @cuda.jit(device=True, inline=True)
    def rotate_heads(x, y, x_offset, y_offset, x_head, y_head, heads, partner, sins, coss):
        first = cuda.local.array(batch, storage)
        second = cuda.local.array(batch, storage)
        last = heads - 1
        h = int64(0)
        while h < heads:
            for k in range(batch):
                load(x, x_offset + min(h + k, last) * x_head, partner, first, second, k)
            for k in range(batch):
                rotate_store(y, y_offset + min(h + k, last) * y_head, partner, first[k],
                             second[k], sins, coss)
            h += batch

    @cuda.jit(device=True, inline=True)
    def copy_heads(x, y, x_offset, y_offset, x_head, y_head, heads):
        first = cuda.local.array(batch, storage)
        second = cuda.local.array(batch, storage)
        last = heads - 1
        h = int64(0)
        while h < heads:
            for k in range(batch):
                copy_load(x, x_offset + min(h + k, last) * x_head, first, second, k)
            for k in range(batch):
                copy_store(y, y_offset + min(h + k, last) * y_head, first[k], second[k])
            h += batch

    def rope_rows(x, y, positions, params, log2_base):
        """Items along x (grid-stride), rows (b, s) along y, block.y consecutive rows per
        block (grid-stride); ``params`` holds the ``ROPE_PARAMS`` fields."""
        (rows, seq_len, num_heads, heads_per_thread, items_per_row, rot_items, pair_step,
         partner, copy_offset, x_b, x_h, x_s, y_b, y_h, y_s, pos_b, pos_s, has_positions,
         rotary_dim, inverse) = params
        groups = (num_heads + heads_per_thread - 1) // heads_per_thread
        work = items_per_row * groups
        row_first = int64(cuda.threadIdx.y) + int64(cuda.blockIdx.y) * int64(cuda.blockDim.y)
        row_step = int64(cuda.blockDim.y) * int64(cuda.gridDim.y)
        r = int64(cuda.threadIdx.x) + int64(cuda.blockIdx.x) * int64(cuda.blockDim.x)
        r_step = int64(cuda.blockDim.x) * int64(cuda.gridDim.x)
        invs = cuda.local.array(pairs_per_item, float64)
        sins = cuda.local.array(pairs_per_item, compute_type)
        coss = cuda.local.array(pairs_per_item, compute_type)
        while r < work:
            group = r // items_per_row
            item = r - group * items_per_row
            head0 = group * heads_per_thread
            heads = min(num_heads - head0, heads_per_thread)
            row = row_first
            if item < rot_items:
                offset = item * pair_step
                for p in range(pairs_per_item):
                    invs[p] = rope_inv_freq(item * pairs_per_item + p, rotary_dim, log2_base)
                while row < rows:
                    b = row // seq_len
                    s = row - b * seq_len
                    pos = positions[uint64(b * pos_b + s * pos_s)] if has_positions else s
                    for p in range(pairs_per_item):
                        sins[p], coss[p] = sincos(pos, invs[p], inverse)
                    rotate_heads(x, y, b * x_b + s * x_s + head0 * x_h + offset,
                                 b * y_b + s * y_s + head0 * y_h + offset, x_h, y_h, heads,
                                 partner, sins, coss)
                    row += row_step
            else:
                offset = copy_offset + (item - rot_items) * copy_step
                while row < rows:
                    b = row // seq_len
                    s = row - b * seq_len
                    copy_heads(x, y, b * x_b + s * x_s + head0 * x_h + offset,
                               b * y_b + s * y_s + head0 * y_h + offset, x_h, y_h, heads)
                    row += row_step
            r += r_step

    return rope_rows


# -- the table ------------------------------------------------------------------------------

#: element kind -> (element storage type, to_compute, from_compute, sincos,
#:                  {unit width: (unit storage type, unpack, pack)})
ROPE_TABLE = {
    ElementKind.F16: (float16, _f16_load, _f16_store, rope_sincos32,
                      {2: (uint32, _unpack_f16x2, _pack_f16x2),
                       4: (uint64, _unpack_f16x4, _pack_f16x4)}),
    ElementKind.BF16: (uint16, bf16_to_f32, f32_to_bf16, rope_sincos32,
                       {2: (uint32, _unpack_bf16x2, _pack_bf16x2),
                        4: (uint64, _unpack_bf16x4, _pack_bf16x4)}),
    ElementKind.F32: (float32, _f32_load, _f32_load, rope_sincos32,
                      {2: (uint64, _unpack_f32x2, _pack_f32x2)}),
    ElementKind.F64: (float64, _f64_load, _f64_load, rope_sincos64, {}),
}

ROPE_ELEMENTS = tuple(ROPE_TABLE)


def _flat_c(storage: types.Type) -> types.Array:
    # "C" rather than launch.flat's "A": the element stride is then a constant, which saves a
    # 64-bit multiply per access (the arrays are flat views of contiguous memory anyway).
    return types.Array(storage, 1, "C")


def _signature(storage: types.Type) -> tuple[types.Type, ...]:
    return (_flat_c(storage), _flat_c(storage), _flat_c(int64),
            types.UniTuple(int64, len(ROPE_PARAMS)), float64)


#: Batches other than HEAD_BATCH, from the sweep in ``scripts/bench_rope.py`` (H100,
#: [8,32,2048,128] forward, 16 heads per thread, 2048 row blocks, 2026-11-22): f16/bf16
#: interleaved4 95.9/95.6 µs at 16 vs 98.1/98.3 at 8; bf16 half_split4 97.7 at 4 vs 97.3
#: at 8 (with the hardware bf16x2 narrowing: 132 registers at 8 before it).
ROPE_BATCH = {(ElementKind.F16, "interleaved4"): 16, (ElementKind.BF16, "interleaved4"): 16,
              (ElementKind.BF16, "half_split4"): 4}


def build_rope_kernel(element: ElementKind, layout: str, batch: int = 0,
                      register: bool = True) -> Kernel:
    """The kernel of table entry ``element`` for ``layout`` (``batch``: heads per batch, 0
    for the table's choice; benchmarks build unregistered variants)."""
    default = ROPE_BATCH.get((element, layout), HEAD_BATCH)
    batch = batch or default
    storage, to_c, from_c, sincos, units = ROPE_TABLE[element]
    width = ROPE_LAYOUTS[layout][0]
    unit, unpack, pack = (storage, None, None) if width == 1 else units[width]
    body = _make_rope_kernel(layout, unit, unpack, pack, to_c, from_c, sincos, batch)
    suffix = "" if batch == default else f",batch{batch}"
    return Kernel(f"rope_rows[{element.name},{layout}{suffix}]", body, _signature(unit),
                  grid_stride=True, register=register)


def _build() -> dict[tuple[ElementKind, str], Kernel]:
    return {(element, layout): build_rope_kernel(element, layout)
            for element, entry in ROPE_TABLE.items() for layout, (width, _) in
            ROPE_LAYOUTS.items() if width == 1 or width in entry[4]}


#: (element kind, layout) -> Kernel, for every layout the element kind has units for.
ROPE_KERNELS = _build()
