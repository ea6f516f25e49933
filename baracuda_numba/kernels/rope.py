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

* ``interleaved_16B`` / ``half_split_16B`` (``rope_units``, f16/bf16/f32): 16-byte units
  (``ld/st.global.v4``), threads numbered along (row, item) in memory order instead of the
  2-D block above, a few heads per thread (one for decode-sized problems).

Two more kernels use the same 16-byte units, items and rotation (so the same bits):

* ``rope_table`` (positions absent): the plan's f32 ``(cos, sin)`` table of every
  ``(s, pair)``, built once by ``rope_angles``; one thread per item of one or two (b, h)
  planes, in memory order, reading its angles from the table (L2): no trig at all;
* ``rope_tile`` (decode-sized problems): a block takes one row (b, s) of several heads; the
  row's R/2 angles are computed once into shared memory by the first R/2 threads while
  every thread's unit load is in flight.

The unit layouts need unit-aligned pointers and outer strides and a rotary dim (and copied
tail) that units tile; the plan picks the widest that fits (and ``rope_units`` only where it
measured faster: see ``plans/rope.py``). Units are reinterpreted in
registers by ``common``'s word helpers (``pack_*`` / ``unpack_*``): f16 by a bit-cast
intrinsic plus the hardware ``cvt``, bf16 by shifts and ``cvt.rn.bf16x2.f32``, f32 by bit
casts.
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32, float64, int32, int64, types, uint16, uint32, uint64
from numba.types import float16

from .._runtime import SIMULATOR
from ..launch import Kernel
from ..types import ElementKind
from .common import (
    bf16_to_f32,
    bitcast,
    div_mod,
    f16_from_bits,
    f32_from_bits,
    f32_to_bf16,
    f32_to_bits,
    load16,
    load16_last,
    pack_bf16x2,
    pack_bf16x4,
    pack_f16x2,
    pack_f16x4,
    pack_f32x2,
    store16,
    unpack_bf16x2,
    unpack_bf16x4,
    unpack_f16x2,
    unpack_f16x4,
    unpack_f32x2,
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

#: Named fields of ``rope_rows``' second int64 tuple: positions int64 (``pos_wide``) or
#: int32 words, ``pos_plus_s`` (positions are per-sequence starts), ``cu_count`` sequences
#: of packed tokens (0: none), the angle source (``ANGLES_*``), the cos/sin tables' kind and
#: strides (batch, sequence, position, pair column), and an optional destination row index
#: per (b, s) (``dest``, int32/int64: ``y`` row (``has_dest`` 1; 2: ``y_k`` row)
#: ``+= dest[b·dest_b + s·dest_s] · y_dest``;
#: the row is skipped unless ``0 <= dest[..] + s·dest_plus_s < dest_limit``, as upstream's
#: ``KvCacheAppendPlan`` skips targets outside the cache); ``k_heads`` heads of k (0: none)
#: rotated in the same launch, with k's outer strides.
ROPE_SOURCES = ("pos_wide", "pos_plus_s", "cu_count", "cu_wide", "angle_source", "cs_kind",
                "cs_b", "cs_s", "cs_pos", "cs_col", "has_dest", "dest_wide", "dest_b",
                "dest_s", "y_dest", "dest_plus_s", "dest_limit", "k_heads", "xk_b", "xk_h",
                "xk_s", "yk_b", "yk_h", "yk_s")


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

    def rope_rows(x, y, positions, cu_seqlens, inv_freq, cos_table, sin_table, dest, x_k,
                  y_k, params, sources, freq_exponent):
        """Items along x (grid-stride), rows (b, s) along y, block.y consecutive rows per
        block (grid-stride); ``params`` holds the ``ROPE_PARAMS`` fields, ``sources`` the
        ``ROPE_SOURCES`` ones (where positions, angles and destination rows come from, and
        k: head groups past q's rotate ``x_k`` into ``y_k`` with the same angles)."""
        (rows, seq_len, num_heads, heads_per_thread, items_per_row, rot_items, pair_step,
         partner, copy_offset, x_b, x_h, x_s, y_b, y_h, y_s, pos_b, pos_s, has_positions,
         rotary_dim, inverse) = params
        (pos_wide, pos_plus_s, cu_count, cu_wide, angle_source, cs_kind, cs_b, cs_s, cs_pos,
         cs_col, has_dest, dest_wide, dest_b, dest_s, y_dest, dest_plus_s, dest_limit,
         k_heads, xk_b, xk_h, xk_s, yk_b, yk_h, yk_s) = sources
        q_groups = (num_heads + heads_per_thread - 1) // heads_per_thread
        groups = q_groups + (k_heads + heads_per_thread - 1) // heads_per_thread
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
            is_k = group >= q_groups
            if is_k:  # a group of k's heads: k's arrays and strides
                head0 = (group - q_groups) * heads_per_thread
                heads = min(k_heads - head0, heads_per_thread)
                in_b, in_h, in_s, out_b, out_h, out_s = xk_b, xk_h, xk_s, yk_b, yk_h, yk_s
            else:
                head0 = group * heads_per_thread
                heads = min(num_heads - head0, heads_per_thread)
                in_b, in_h, in_s, out_b, out_h, out_s = x_b, x_h, x_s, y_b, y_h, y_s
            source = x_k if is_k else x
            target = y_k if is_k else y
            rotating = item < rot_items
            if rotating:
                offset = item * pair_step
                for p in range(pairs_per_item):
                    pair = item * pairs_per_item + p
                    if angle_source == ANGLES_INV_FREQ:
                        invs[p] = float64(inv_freq[uint64(pair)])
                    else:
                        invs[p] = rope_inv_freq(pair, freq_exponent)
            else:
                offset = copy_offset + (item - rot_items) * copy_step
            row = row_first
            while row < rows:
                b = row // seq_len
                s = row - b * seq_len
                y_row = b * out_b + s * out_s
                inside = True
                # the index places y's rows (has_dest 1) or k's (2, k fused with q)
                if has_dest == (2 if is_k else 1):  # outside [0, dest_limit): skipped
                    slot = load_index(dest, b * dest_b + s * dest_s, dest_wide)
                    y_row += slot * y_dest
                    at = slot + s * dest_plus_s
                    inside = at >= 0 and at < dest_limit
                x_row = b * in_b + s * in_s + head0 * in_h + offset
                y_row += head0 * out_h + offset
                if inside and rotating:
                    pos = row_position(positions, cu_seqlens, b, s, pos_b, pos_s,
                                       has_positions, pos_wide, pos_plus_s, cu_count, cu_wide)
                    if angle_source == ANGLES_TABLE:
                        table_row = b * cs_b + s * cs_s + pos * cs_pos
                        for p in range(pairs_per_item):
                            column = table_row + (item * pairs_per_item + p) * cs_col
                            coss[p] = compute_type(load_real(cos_table, column, cs_kind))
                            sin_t = compute_type(load_real(sin_table, column, cs_kind))
                            sins[p] = -sin_t if inverse else sin_t
                    else:
                        for p in range(pairs_per_item):
                            sins[p], coss[p] = sincos(pos, invs[p], inverse)
                    rotate_heads(source, target, x_row, y_row, in_h, out_h, heads, partner,
                                 sins, coss)
                elif inside:
                    copy_heads(source, target, x_row, y_row, in_h, out_h, heads)
                row += row_step
            r += r_step

    return rope_rows


# -- the table ------------------------------------------------------------------------------

#: element kind -> (element storage type, to_compute, from_compute, sincos,
#:                  {unit width: (unit storage type, unpack, pack)})
ROPE_TABLE = {
    ElementKind.F16: (float16, _f16_load, _f16_store, rope_sincos32,
                      {2: (uint32, unpack_f16x2, pack_f16x2),
                       4: (uint64, unpack_f16x4, pack_f16x4)}),
    ElementKind.BF16: (uint16, bf16_to_f32, f32_to_bf16, rope_sincos32,
                       {2: (uint32, unpack_bf16x2, pack_bf16x2),
                        4: (uint64, unpack_bf16x4, pack_bf16x4)}),
    ElementKind.F32: (float32, _f32_load, _f32_load, rope_sincos32,
                      {2: (uint64, unpack_f32x2, pack_f32x2)}),
    ElementKind.F64: (float64, _f64_load, _f64_load, rope_sincos64, {}),
}

ROPE_ELEMENTS = tuple(ROPE_TABLE)


def _flat_c(storage: types.Type) -> types.Array:
    # "C" rather than launch.flat's "A": the element stride is then a constant, which saves a
    # 64-bit multiply per access (the arrays are flat views of contiguous memory anyway).
    return types.Array(storage, 1, "C")


def _signature(storage: types.Type) -> tuple[types.Type, ...]:
    words, halves = _flat_c(uint32), _flat_c(uint16)
    return (_flat_c(storage), _flat_c(storage), words, words, _flat_c(float32), halves,
            halves, words, _flat_c(storage), _flat_c(storage),
            types.UniTuple(int64, len(ROPE_PARAMS)),
            types.UniTuple(int64, len(ROPE_SOURCES)), float64)


#: Batches other than HEAD_BATCH, from the benchmark's sweep: 16 for the 4-element
#: interleaved units (more loads in flight), 4 for bf16 half_split4 (registers); figures
#: in docs/design/rope.md.
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


# -- 16-byte units, one thread per (row, item) ---------------------------------------------
#
# ``rope_units``: every access is one 16-byte ``ld/st.global.v4`` (4 f32 or 8 f16/bf16
# elements); an *item* is one unit (interleaved: 2 or 4 pairs) or a unit from each half
# (half-split: 4 or 8 pairs). Threads are numbered along (row = (b, s), item) in memory
# order, so a block covers 256 consecutive units of each of its heads (4 KB: contiguous in a
# contiguous tensor), and each thread walks a few heads (``heads_per_thread``, a launch
# parameter: 1 for decode-sized problems, where the one head's load is issued before the
# angles are computed so the trig overlaps it). No grid-stride in practice: the grid covers
# the problem (the loops only serve grids that do not).


@cuda.jit(device=True, inline=True)
def _unpack16_f32(unit):
    return (f32_from_bits(unit[0]), f32_from_bits(unit[1]), f32_from_bits(unit[2]),
            f32_from_bits(unit[3]))


@cuda.jit(device=True, inline=True)
def _pack16_f32(values):
    return (f32_to_bits(values[0]), f32_to_bits(values[1]), f32_to_bits(values[2]),
            f32_to_bits(values[3]))


@cuda.jit(device=True, inline=True)
def _unpack16_f16(unit):
    a0, a1 = unpack_f16x2(unit[0])
    a2, a3 = unpack_f16x2(unit[1])
    a4, a5 = unpack_f16x2(unit[2])
    a6, a7 = unpack_f16x2(unit[3])
    return a0, a1, a2, a3, a4, a5, a6, a7


@cuda.jit(device=True, inline=True)
def _pack16_f16(values):
    return (pack_f16x2(values[0], values[1]), pack_f16x2(values[2], values[3]),
            pack_f16x2(values[4], values[5]), pack_f16x2(values[6], values[7]))


@cuda.jit(device=True, inline=True)
def _unpack16_bf16(unit):
    a0, a1 = unpack_bf16x2(unit[0])
    a2, a3 = unpack_bf16x2(unit[1])
    a4, a5 = unpack_bf16x2(unit[2])
    a6, a7 = unpack_bf16x2(unit[3])
    return a0, a1, a2, a3, a4, a5, a6, a7


@cuda.jit(device=True, inline=True)
def _pack16_bf16(values):
    return (pack_bf16x2(values[0], values[1]), pack_bf16x2(values[2], values[3]),
            pack_bf16x2(values[4], values[5]), pack_bf16x2(values[6], values[7]))


@cuda.jit(device=True, inline=True)
def _rotate_interleaved4(v, sins, coss):
    a0, b0 = rotate_pair(v[0], v[1], sins[0], coss[0])
    a1, b1 = rotate_pair(v[2], v[3], sins[1], coss[1])
    return a0, b0, a1, b1


@cuda.jit(device=True, inline=True)
def _rotate_interleaved8(v, sins, coss):
    a0, b0 = rotate_pair(v[0], v[1], sins[0], coss[0])
    a1, b1 = rotate_pair(v[2], v[3], sins[1], coss[1])
    a2, b2 = rotate_pair(v[4], v[5], sins[2], coss[2])
    a3, b3 = rotate_pair(v[6], v[7], sins[3], coss[3])
    return a0, b0, a1, b1, a2, b2, a3, b3


@cuda.jit(device=True, inline=True)
def _rotate_half4(a, b, sins, coss):
    a0, b0 = rotate_pair(a[0], b[0], sins[0], coss[0])
    a1, b1 = rotate_pair(a[1], b[1], sins[1], coss[1])
    a2, b2 = rotate_pair(a[2], b[2], sins[2], coss[2])
    a3, b3 = rotate_pair(a[3], b[3], sins[3], coss[3])
    return (a0, a1, a2, a3), (b0, b1, b2, b3)


@cuda.jit(device=True, inline=True)
def _rotate_half8(a, b, sins, coss):
    a0, b0 = rotate_pair(a[0], b[0], sins[0], coss[0])
    a1, b1 = rotate_pair(a[1], b[1], sins[1], coss[1])
    a2, b2 = rotate_pair(a[2], b[2], sins[2], coss[2])
    a3, b3 = rotate_pair(a[3], b[3], sins[3], coss[3])
    a4, b4 = rotate_pair(a[4], b[4], sins[4], coss[4])
    a5, b5 = rotate_pair(a[5], b[5], sins[5], coss[5])
    a6, b6 = rotate_pair(a[6], b[6], sins[6], coss[6])
    a7, b7 = rotate_pair(a[7], b[7], sins[7], coss[7])
    return (a0, a1, a2, a3, a4, a5, a6, a7), (b0, b1, b2, b3, b4, b5, b6, b7)


#: Named fields of ``rope_units``' int64 parameter tuple; offsets and strides count 16-byte
#: units.
ROPE_UNIT_PARAMS = ("rows", "seq_len", "num_heads", "heads_per_thread", "head_groups",
                    "items_per_row", "rot_items", "partner", "copy_offset", "x_b", "x_h",
                    "x_s", "y_b", "y_h", "y_s", "pos_b", "pos_s", "has_positions",
                    "rotary_dim", "inverse")

#: layout -> half-split pairing?  (the 16-byte unit layouts of ``rope_units``)
ROPE_UNIT_LAYOUTS = {"interleaved_16B": False, "half_split_16B": True}

#: Heads loaded before any is stored in ``rope_units`` (full batches; the rest one by one),
#: per layout: 4 loads in flight per thread either way. Registers (ptxas sm_90): half-split
#: f32 at a batch of 4 needed 164 (one 256-thread block per SM) and spilled under a cap of 80.
UNIT_HEAD_BATCH = {"interleaved_16B": 4, "half_split_16B": 2}


def _make_rope_units_kernel(half: bool, elements: int, unpack, pack, batch: int):
    """``rope_units`` body for 16-byte units of ``elements`` elements."""
    pairs = elements if half else elements // 2

    if half:
        rotate = _rotate_half8 if elements == 8 else _rotate_half4

        @cuda.jit(device=True, inline=True)
        def load_item(x, unit, partner, firsts, seconds, k):
            first = load16(x, uint64(unit * 4))
            second = load16(x, uint64((unit + partner) * 4))
            for w in range(4):
                firsts[k, w] = first[w]
                seconds[k, w] = second[w]

        @cuda.jit(device=True, inline=True)
        def store_item(y, unit, partner, firsts, seconds, k, sins, coss):
            ya, yb = rotate(unpack((firsts[k, 0], firsts[k, 1], firsts[k, 2], firsts[k, 3])),
                            unpack((seconds[k, 0], seconds[k, 1], seconds[k, 2],
                                    seconds[k, 3])), sins, coss)
            store16(y, uint64(unit * 4), pack(ya))
            store16(y, uint64((unit + partner) * 4), pack(yb))

    else:
        rotate = _rotate_interleaved8 if elements == 8 else _rotate_interleaved4

        @cuda.jit(device=True, inline=True)
        def load_item(x, unit, partner, firsts, seconds, k):
            first = load16(x, uint64(unit * 4))
            for w in range(4):
                firsts[k, w] = first[w]

        @cuda.jit(device=True, inline=True)
        def store_item(y, unit, partner, firsts, seconds, k, sins, coss):
            values = unpack((firsts[k, 0], firsts[k, 1], firsts[k, 2], firsts[k, 3]))
            store16(y, uint64(unit * 4), pack(rotate(values, sins, coss)))

    @cuda.jit(device=True, inline=True)
    def copy_load(x, unit, firsts, k):
        first = load16(x, uint64(unit * 4))
        for w in range(4):
            firsts[k, w] = first[w]

    @cuda.jit(device=True, inline=True)
    def copy_store(y, unit, firsts, k):
        store16(y, uint64(unit * 4), (firsts[k, 0], firsts[k, 1], firsts[k, 2], firsts[k, 3]))

    @cuda.jit(device=True, inline=True)
    def rotate_heads(x, y, x_unit, y_unit, x_h, y_h, heads, partner, pos, item,
                     freq_exponent, inverse, sins, coss, firsts, seconds):
        h = int64(0)
        single = heads < batch
        if single:  # its load is in flight while the angles are computed
            load_item(x, x_unit, partner, firsts, seconds, 0)
        for p in range(pairs):
            sins[p], coss[p] = rope_sincos32(
                pos, rope_inv_freq(item * pairs + p, freq_exponent), inverse)
        if single:
            store_item(y, y_unit, partner, firsts, seconds, 0, sins, coss)
            h = 1
        while heads - h >= batch:
            for k in range(batch):
                load_item(x, x_unit + (h + k) * x_h, partner, firsts, seconds, k)
            for k in range(batch):
                store_item(y, y_unit + (h + k) * y_h, partner, firsts, seconds, k, sins, coss)
            h += batch
        while h < heads:
            load_item(x, x_unit + h * x_h, partner, firsts, seconds, 0)
            store_item(y, y_unit + h * y_h, partner, firsts, seconds, 0, sins, coss)
            h += 1

    @cuda.jit(device=True, inline=True)
    def copy_heads(x, y, x_unit, y_unit, x_h, y_h, heads, firsts):
        h = int64(0)
        while heads - h >= batch:
            for k in range(batch):
                copy_load(x, x_unit + (h + k) * x_h, firsts, k)
            for k in range(batch):
                copy_store(y, y_unit + (h + k) * y_h, firsts, k)
            h += batch
        while h < heads:
            copy_load(x, x_unit + h * x_h, firsts, 0)
            copy_store(y, y_unit + h * y_h, firsts, 0)
            h += 1

    def rope_units(x, y, positions, params, freq_exponent):
        """Threads along (row, item) over x (grid-stride), head groups over y (grid-stride);
        ``params`` holds the ``ROPE_UNIT_PARAMS`` fields; x and y are uint32 views."""
        (rows, seq_len, num_heads, heads_per_thread, groups, items_per_row, rot_items,
         partner, copy_offset, x_b, x_h, x_s, y_b, y_h, y_s, pos_b, pos_s, has_positions,
         rotary_dim, inverse) = params
        work = rows * items_per_row
        g = int64(cuda.threadIdx.x) + int64(cuda.blockIdx.x) * int64(cuda.blockDim.x)
        g_step = int64(cuda.blockDim.x) * int64(cuda.gridDim.x)
        sins = cuda.local.array(pairs, float32)
        coss = cuda.local.array(pairs, float32)
        firsts = cuda.local.array((batch, 4), uint32)
        seconds = cuda.local.array((batch, 4), uint32)
        while g < work:
            row, item = div_mod(g, items_per_row)
            b, s = div_mod(row, seq_len)
            x_row = b * x_b + s * x_s
            y_row = b * y_b + s * y_s
            group = int64(cuda.blockIdx.y)
            while group < groups:
                head0 = group * heads_per_thread
                heads = min(num_heads - head0, heads_per_thread)
                if item < rot_items:
                    pos = positions[uint64(b * pos_b + s * pos_s)] if has_positions else s
                    rotate_heads(x, y, x_row + head0 * x_h + item, y_row + head0 * y_h + item,
                                 x_h, y_h, heads, partner, pos, item, freq_exponent, inverse,
                                 sins, coss, firsts, seconds)
                else:
                    unit = copy_offset + item - rot_items
                    copy_heads(x, y, x_row + head0 * x_h + unit, y_row + head0 * y_h + unit,
                               x_h, y_h, heads, firsts)
                group += int64(cuda.gridDim.y)
            g += g_step

    return rope_units


#: element kind -> (unpack, pack, elements per 16-byte unit)
ROPE_UNIT_TABLE = {
    ElementKind.F16: (_unpack16_f16, _pack16_f16, 8),
    ElementKind.BF16: (_unpack16_bf16, _pack16_bf16, 8),
    ElementKind.F32: (_unpack16_f32, _pack16_f32, 4),
}


def build_rope_units_kernel(element: ElementKind, layout: str, register: bool = True,
                            max_registers: int | None = None) -> Kernel:
    """The ``rope_units`` kernel of ``ROPE_UNIT_TABLE[element]`` for ``layout``
    (benchmarks build unregistered variants with a register cap)."""
    unpack, pack, elements = ROPE_UNIT_TABLE[element]
    body = _make_rope_units_kernel(ROPE_UNIT_LAYOUTS[layout], elements, unpack, pack,
                                   UNIT_HEAD_BATCH[layout])
    words = _flat_c(uint32)
    signature = (words, words, _flat_c(int64), types.UniTuple(int64, len(ROPE_UNIT_PARAMS)),
                 float64)
    suffix = f",regs{max_registers}" if max_registers else ""
    return Kernel(f"rope_units[{element.name},{layout}{suffix}]", body, signature,
                  grid_stride=True, register=register, max_registers=max_registers)


ROPE_KERNELS.update({(element, layout): build_rope_units_kernel(element, layout)
                     for element in ROPE_UNIT_TABLE for layout in ROPE_UNIT_LAYOUTS})


# -- 16-byte units with the angles precomputed: ``rope_table`` -----------------------------
#
# With ``positions`` absent, θ depends only on (s, pair): the plan keeps one f32 table of
# ``(cos, sin)`` per (s, pair) for its descriptor (``rope_angles`` builds it once, with the
# same ``rope_inv_freq`` / ``rope_sincos32`` as every other kernel, so the bits are the
# same), and ``rope_table`` streams x in memory order, one 16-byte unit per thread, reading
# the unit's angles from that table (L2-resident: 8 bytes per pair). No trig and no
# division by runtime extents besides one 32-bit ``div_mod`` per thread.
#
#     grid.x * block.x -> (s, item) of one (b, h) plane    (memory order: 4 KB per block)
#     grid.y           -> (b, h) planes                     (grid-stride)
#
# The backward negates the table's sin (exact, so the same bits as computing it negated).

#: Named fields of ``rope_table``'s int64 parameter tuple; offsets and strides count 16-byte
#: units.
ROPE_TABLE_PARAMS = ("plane_units", "items_per_row", "rot_items", "partner", "copy_offset",
                     "num_heads", "planes", "x_b", "x_h", "x_s", "y_b", "y_h", "y_s",
                     "half_rotary", "inverse")


@cuda.jit(device=True, inline=True)
def _unit_offset32(b, h, s, unit, stride_b, stride_h, stride_s):
    """``b·stride_b + h·stride_h + s·stride_s + unit`` in 32-bit arithmetic (the caller
    guarantees every offset of the launch is below 2^31 units); 64-bit on return."""
    return int64(int32(b * stride_b + h * stride_h + s * stride_s + unit))


def _make_unit_rotation(half: bool, elements: int, unpack, pack):
    """``(pairs per item, load_item, store_item)`` for 16-byte units of ``elements``
    elements: ``load_item(x, x_unit, partner)`` returns the item's unit(s) (a unit from
    each half for half-split; interleaved returns its one unit twice) and
    ``store_item(y, y_unit, partner, first, second, sins, coss)`` rotates and stores them.
    A thread reads and writes the same units, so in place is safe."""
    pairs = elements if half else elements // 2
    if half:
        rotate = _rotate_half8 if elements == 8 else _rotate_half4

        @cuda.jit(device=True, inline=True)
        def load_item(x, x_unit, partner):
            return load16(x, uint64(x_unit * 4)), load16(x, uint64((x_unit + partner) * 4))

        @cuda.jit(device=True, inline=True)
        def store_item(y, y_unit, partner, first, second, sins, coss):
            ya, yb = rotate(unpack(first), unpack(second), sins, coss)
            store16(y, uint64(y_unit * 4), pack(ya))
            store16(y, uint64((y_unit + partner) * 4), pack(yb))

    else:
        rotate = _rotate_interleaved8 if elements == 8 else _rotate_interleaved4

        @cuda.jit(device=True, inline=True)
        def load_item(x, x_unit, partner):
            unit = load16(x, uint64(x_unit * 4))
            return unit, unit

        @cuda.jit(device=True, inline=True)
        def store_item(y, y_unit, partner, first, second, sins, coss):
            store16(y, uint64(y_unit * 4), pack(rotate(unpack(first), sins, coss)))

    return pairs, load_item, store_item


def _table_angles(pairs: int, evict_last: bool = False):
    """``table_angles(table, pair_word, sins, coss, inverse)``: the (sin, cos) of ``pairs``
    consecutive pairs from the angle table, one 16-byte load per two pairs from word
    ``pair_word`` on (16-byte aligned), with ``evict_last`` kept in L2 ahead of the
    streamed tensors; sin negated for the backward."""
    load = load16_last if evict_last else load16

    @cuda.jit(device=True, inline=True)
    def table_angles(table, pair_word, sins, coss, inverse):
        for k in range(pairs // 2):
            words = load(table, uint64(pair_word + 4 * k))
            coss[2 * k] = f32_from_bits(words[0])
            coss[2 * k + 1] = f32_from_bits(words[2])
            sin0 = f32_from_bits(words[1])
            sin1 = f32_from_bits(words[3])
            sins[2 * k] = -sin0 if inverse else sin0
            sins[2 * k + 1] = -sin1 if inverse else sin1

    return table_angles


def _make_rope_table_kernel(half: bool, elements: int, unpack, pack, planes_per_thread: int):
    """``rope_table`` body for 16-byte units of ``elements`` elements, ``planes_per_thread``
    (b, h) planes per thread (their loads in flight together, one table read for all)."""
    pairs, load_item, store_item = _make_unit_rotation(half, elements, unpack, pack)
    per_thread = planes_per_thread
    table_angles = _table_angles(pairs)

    def rope_table(x, y, table, params):
        """One 16-byte unit (or a unit from each half) of ``planes_per_thread`` planes per
        thread: ``(s, item)`` along x, groups of (b, h) planes along y, both grid-stride;
        ``table`` holds (cos, sin) f32 bits per ``(s, pair)``; ``params`` holds the
        ``ROPE_TABLE_PARAMS`` fields. A last, partial group repeats its last plane (this
        thread reads it before storing anything, so in place stays safe)."""
        (plane_units, items_per_row, rot_items, partner, copy_offset, num_heads, planes, x_b,
         x_h, x_s, y_b, y_h, y_s, half_rotary, inverse) = params
        groups = (planes + per_thread - 1) // per_thread
        g = int64(cuda.threadIdx.x) + int64(cuda.blockIdx.x) * int64(cuda.blockDim.x)
        g_step = int64(cuda.blockDim.x) * int64(cuda.gridDim.x)
        sins = cuda.local.array(pairs, float32)
        coss = cuda.local.array(pairs, float32)
        firsts = cuda.local.array((per_thread, 4), uint32)
        seconds = cuda.local.array((per_thread, 4), uint32)
        y_units = cuda.local.array(per_thread, int64)
        while g < plane_units:
            s, item = div_mod(g, items_per_row)
            group = int64(cuda.blockIdx.y)
            # Two straight paths, each issuing all its loads before it uses any: a value
            # loaded in one branch and merged after it would be waited for at the merge
            # (measured slower: docs/design/rope.md).
            if item < rot_items:
                while group < groups:
                    for k in range(per_thread):
                        b, h = div_mod(min(group * per_thread + k, planes - 1), num_heads)
                        y_units[k] = b * y_b + h * y_h + s * y_s + item
                        first, second = load_item(x, b * x_b + h * x_h + s * x_s + item,
                                                  partner)
                        for w in range(4):
                            firsts[k, w] = first[w]
                            seconds[k, w] = second[w]
                    table_angles(table, 2 * (s * half_rotary + item * pairs), sins, coss,
                                 inverse)
                    for k in range(per_thread):
                        store_item(y, y_units[k], partner,
                                   (firsts[k, 0], firsts[k, 1], firsts[k, 2], firsts[k, 3]),
                                   (seconds[k, 0], seconds[k, 1], seconds[k, 2], seconds[k, 3]),
                                   sins, coss)
                    group += int64(cuda.gridDim.y)
            else:
                unit = copy_offset + item - rot_items
                while group < groups:
                    for k in range(per_thread):
                        b, h = div_mod(min(group * per_thread + k, planes - 1), num_heads)
                        y_units[k] = b * y_b + h * y_h + s * y_s + unit
                        first = load16(x, uint64((b * x_b + h * x_h + s * x_s + unit) * 4))
                        for w in range(4):
                            firsts[k, w] = first[w]
                    for k in range(per_thread):
                        store16(y, uint64(y_units[k] * 4),
                                (firsts[k, 0], firsts[k, 1], firsts[k, 2], firsts[k, 3]))
                    group += int64(cuda.gridDim.y)
            g += g_step

    return rope_table


def rope_angles(table, params, freq_exponent):
    """The (cos, sin) table of ``rope_table``: ``table[2t], table[2t+1]`` = cos, sin of
    ``θ = s · inv_freq(p)`` for ``t = s · R/2 + p`` (grid-stride); ``params`` = (seq_len,
    R/2, R)."""
    seq_len, half_rotary, rotary_dim = params
    t = int64(cuda.threadIdx.x) + int64(cuda.blockIdx.x) * int64(cuda.blockDim.x)
    step = int64(cuda.blockDim.x) * int64(cuda.gridDim.x)
    while t < seq_len * half_rotary:
        s, pair = div_mod(t, half_rotary)
        sin_t, cos_t = rope_sincos32(s, rope_inv_freq(pair, freq_exponent), 0)
        table[uint64(2 * t)] = cos_t
        table[uint64(2 * t + 1)] = sin_t
        t += step


#: The angle table's builder (f32 cos/sin of every (s, pair) of a descriptor).
ROPE_ANGLES_KERNEL = Kernel("rope_angles", rope_angles,
                            (_flat_c(float32), types.UniTuple(int64, 3), float64),
                            grid_stride=True)


#: (b, h) planes per ``rope_table`` thread, per layout: interleaved threads load one unit
#: per plane, so two planes keep as many loads in flight as a half-split item (the sweep
#: of 1/2/4 planes: docs/design/rope.md).
TABLE_PLANES_PER_THREAD = {"interleaved_16B": 2, "half_split_16B": 1}


def build_rope_table_kernel(element: ElementKind, layout: str, planes_per_thread: int = 0,
                            register: bool = True) -> Kernel:
    """The ``rope_table`` kernel of ``ROPE_UNIT_TABLE[element]`` for ``layout``
    (``planes_per_thread``: 0 for the table's choice; benchmarks build other variants)."""
    default = TABLE_PLANES_PER_THREAD[layout]
    per_thread = planes_per_thread or default
    unpack, pack, elements = ROPE_UNIT_TABLE[element]
    body = _make_rope_table_kernel(ROPE_UNIT_LAYOUTS[layout], elements, unpack, pack,
                                   per_thread)
    words = _flat_c(uint32)
    suffix = "" if per_thread == default else f",planes{per_thread}"
    return Kernel(f"rope_table[{element.name},{layout}{suffix}]", body,
                  (words, words, words, types.UniTuple(int64, len(ROPE_TABLE_PARAMS))),
                  grid_stride=True, register=register)


#: (element kind, 16-byte layout) -> ``rope_table`` kernel.
ROPE_TABLE_KERNELS = {(element, layout): build_rope_table_kernel(element, layout)
                      for element in ROPE_UNIT_TABLE for layout in ROPE_UNIT_LAYOUTS}


# -- the angle table over compact interleaved tensors: ``rope_flat`` ----------------------
#
# Where x and y are both compact [B, H, S, D] (rows of units one after another), an
# interleaved unit needs no (b, h, s) walk: thread u takes unit u in memory order, reads
# its pairs' (cos, sin) from the table (L2, loaded with an evict_last policy as Triton's
# eviction_policy="evict_last"; f32 loads x so too, FLAT_X_EVICT_LAST) and stores the unit;
# 32-bit unit indices (the plan takes it below 2^32 units) and no loop (the grid covers
# the units). The L2 hint is what makes it faster than ``rope_table`` on the same table;
# on ``rope_table`` (half-split) the hint measured slower for f16/bf16, so that kernel
# keeps plain loads (figures: docs/design/rope.md).
ROPE_FLAT_PARAMS = ("threads", "items_per_row", "items_log", "rot_items", "seq_len",
                    "half_rotary", "in_place", "inverse", "plane_log", "planes")

#: (b, h) planes per ``rope_flat`` thread, per element kind (the registered kernels'; a
#: plan's ``flat_planes_per_thread`` picks another variant): two units' loads in flight
#: per thread and one table read for both (the benchmark's 1 / 2 / 4 planes rows:
#: docs/design/rope.md; see also ``plans.rope._FLAT_BLOCK``).
FLAT_PLANES_PER_THREAD = {ElementKind.F16: 2, ElementKind.BF16: 2, ElementKind.F32: 2}

#: Whether ``rope_flat`` loads x with the L2 ``evict_last`` policy too (as Triton's
#: kernel for torch.compile does), per element kind: it helped f32 only (up to the copy
#: floor), not f16/bf16 (docs/design/rope.md).
FLAT_X_EVICT_LAST = {ElementKind.F16: False, ElementKind.BF16: False, ElementKind.F32: True}


def _make_rope_flat_kernel(elements: int, unpack, pack, planes_per_thread: int,
                           x_evict_last: bool = False):
    """``rope_flat`` body for 16-byte units of ``elements`` interleaved elements,
    ``planes_per_thread`` (b, h) planes per thread, x loaded with the L2 ``evict_last``
    policy where ``x_evict_last``."""
    pairs, _, store_item = _make_unit_rotation(False, elements, unpack, pack)
    table_angles = _table_angles(pairs, evict_last=True)
    load_x = load16_last if x_evict_last else load16
    per_thread = planes_per_thread

    def rope_flat(x, y, table, params):
        """Thread ``g < threads`` = (plane group ``g // plane_units``, unit ``w`` of a
        plane), ``plane_units = seq_len · items_per_row`` (shifts where ``plane_log`` and
        ``items_log`` >= 0): ``s = w // items_per_row``, ``item = w % items_per_row``; the
        thread takes unit ``w`` of ``planes_per_thread`` consecutive (b, h) planes (a
        last, partial group repeats its last plane: every load precedes every store, so
        in place stays safe), all loads in flight at once, one table read for all. A
        rotated item (``item < rot_items``) reads its pairs' (cos, sin) at table word
        ``2 (s · half_rotary + item · pairs)``; a copied one is copied unless in place."""
        (threads, items_per_row, items_log, rot_items, seq_len, half_rotary, in_place,
         inverse, plane_log, planes) = params
        sins = cuda.local.array(pairs, float32)
        coss = cuda.local.array(pairs, float32)
        units = cuda.local.array((per_thread, 4), uint32)
        g = uint32(uint32(cuda.blockIdx.x) * uint32(cuda.blockDim.x) + uint32(cuda.threadIdx.x))
        if g < uint32(threads):
            plane_units = uint32(seq_len) * uint32(items_per_row)
            if plane_log >= 0:
                group = uint32(g >> uint32(plane_log))
                w = uint32(g & (plane_units - uint32(1)))
            else:
                group = uint32(g // plane_units)
                w = uint32(g - group * plane_units)
            if items_log >= 0:
                s = uint32(w >> uint32(items_log))
                item = uint32(w & uint32(items_per_row - 1))
            else:
                s = uint32(w // uint32(items_per_row))
                item = uint32(w - s * uint32(items_per_row))
            plane0 = group * uint32(per_thread)
            last = uint32(planes - 1)
            # Two straight paths, each issuing all its loads before it uses any (as
            # rope_table's).
            if item < uint32(rot_items):
                for k in range(per_thread):
                    u = min(plane0 + uint32(k), last) * plane_units + w
                    unit = load_x(x, uint64(u) * uint64(4))
                    for j in range(4):
                        units[k, j] = unit[j]
                table_angles(table, uint32(2) * (s * uint32(half_rotary)
                                                 + item * uint32(pairs)),
                             sins, coss, inverse)
                for k in range(per_thread):
                    u = min(plane0 + uint32(k), last) * plane_units + w
                    unit = (units[k, 0], units[k, 1], units[k, 2], units[k, 3])
                    store_item(y, uint64(u), 0, unit, unit, sins, coss)
            elif not in_place:
                for k in range(per_thread):
                    u = min(plane0 + uint32(k), last) * plane_units + w
                    unit = load_x(x, uint64(u) * uint64(4))
                    for j in range(4):
                        units[k, j] = unit[j]
                for k in range(per_thread):
                    u = min(plane0 + uint32(k), last) * plane_units + w
                    store16(y, uint64(u) * uint64(4),
                            (units[k, 0], units[k, 1], units[k, 2], units[k, 3]))

    return rope_flat


def build_rope_flat_kernel(element: ElementKind, planes_per_thread: int = 0,
                           register: bool = True) -> Kernel:
    """The ``rope_flat`` kernel of ``ROPE_UNIT_TABLE[element]`` (``planes_per_thread``: 0
    for ``FLAT_PLANES_PER_THREAD``'s; benchmarks build other variants)."""
    default = FLAT_PLANES_PER_THREAD[element]
    per_thread = planes_per_thread or default
    unpack, pack, elements = ROPE_UNIT_TABLE[element]
    words = _flat_c(uint32)
    suffix = "" if per_thread == default else f",planes{per_thread}"
    return Kernel(f"rope_flat[{element.name}{suffix}]",
                  _make_rope_flat_kernel(elements, unpack, pack, per_thread,
                                         FLAT_X_EVICT_LAST[element]),
                  (words, words, words, types.UniTuple(int64, len(ROPE_FLAT_PARAMS))),
                  register=register)


#: element kind -> ``rope_flat`` kernel (interleaved pairing).
ROPE_FLAT_KERNELS = {element: build_rope_flat_kernel(element) for element in ROPE_UNIT_TABLE}


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
# only where the grid covers the problem and the arrays span fewer than 2^31 units.

#: Pairs of one row a ``rope_tile`` block can hold (R <= 1024): 4 KB of shared memory.
TILE_MAX_PAIRS = 512

#: Named fields of ``rope_tile``'s int64 parameter tuple; offsets and strides count 16-byte
#: units.
ROPE_TILE_PARAMS = ("num_heads", "heads_per_block", "rot_items", "partner", "copy_offset",
                    "x_b", "x_h", "x_s", "y_b", "y_h", "y_s", "pos_b", "pos_s",
                    "has_positions", "rotary_dim", "inverse")


def _make_rope_tile_kernel(half: bool, elements: int, unpack, pack):
    """``rope_tile`` body for 16-byte units of ``elements`` elements."""
    pairs, load_item, store_item = _make_unit_rotation(half, elements, unpack, pack)

    def rope_tile(x, y, positions, params, freq_exponent):
        """Block = (items of one row, heads); grid = (s, b, head groups), one tile per
        block: the plan takes this kernel only where the grid covers the problem and every
        unit offset is below 2^31. ``params`` holds the ``ROPE_TILE_PARAMS`` fields.

        Decode-sized launches have about one block per SM, so the instructions each thread
        runs before its load, and the chain behind the barrier, are the kernel's time. So
        no loop test comes before the load, and the offsets are 32-bit (grid-stride loops
        and 64-bit offsets measured slower at decode: docs/design/rope.md)."""
        (num_heads, heads_per_block, rot_items, partner, copy_offset, x_b, x_h, x_s, y_b,
         y_h, y_s, pos_b, pos_s, has_positions, rotary_dim, inverse) = params
        shared_sin = cuda.shared.array(TILE_MAX_PAIRS, float32)
        shared_cos = cuda.shared.array(TILE_MAX_PAIRS, float32)
        sins = cuda.local.array(pairs, float32)
        coss = cuda.local.array(pairs, float32)
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
        first, second = load_item(x, _unit_offset32(b, h, s, unit, x_b, x_h, x_s),
                                  unit_partner)
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
            for k in range(pairs):
                sins[k] = shared_sin[item * pairs + k]
                coss[k] = shared_cos[item * pairs + k]
            store_item(y, y_unit, partner, first, second, sins, coss)
        elif active:
            store16(y, uint64(y_unit * 4), first)

    return rope_tile


def build_rope_tile_kernel(element: ElementKind, layout: str) -> Kernel:
    """The ``rope_tile`` kernel of ``ROPE_UNIT_TABLE[element]`` for ``layout``."""
    unpack, pack, elements = ROPE_UNIT_TABLE[element]
    body = _make_rope_tile_kernel(ROPE_UNIT_LAYOUTS[layout], elements, unpack, pack)
    words = _flat_c(uint32)
    return Kernel(f"rope_tile[{element.name},{layout}]", body,
                  (words, words, _flat_c(int64), types.UniTuple(int64, len(ROPE_TILE_PARAMS)),
                   float64))


#: (element kind, 16-byte layout) -> ``rope_tile`` kernel.
ROPE_TILE_KERNELS = {(element, layout): build_rope_tile_kernel(element, layout)
                     for element in ROPE_UNIT_TABLE for layout in ROPE_UNIT_LAYOUTS}
