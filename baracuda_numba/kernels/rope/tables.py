"""RoPE: 16-byte units with the angles precomputed (``rope_table``, ``rope_angles``)."""

from __future__ import annotations

import functools

from numba import cuda, float32, float64, int32, int64, types, uint32, uint64

from ...launch import Kernel, LazyTable
from ...types import ElementKind
from ..common import (
    div_mod,
    f32_from_bits,
    load16,
    load16_last,
    store16,
)
from .angles import rope_inv_freq, rope_sincos32
from .rows import _flat_c
from .units import (
    ROPE_UNIT_CODECS,
    ROPE_UNIT_LAYOUTS,
    _rotate_half4,
    _rotate_half8,
    _rotate_interleaved4,
    _rotate_interleaved8,
    unit_token,
)

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
                     "half_rotary", "inverse", "bf16")


@cuda.jit(device=True, inline=True)
def _unit_offset32(b, h, s, unit, stride_b, stride_h, stride_s):
    """``b·stride_b + h·stride_h + s·stride_s + unit`` in 32-bit arithmetic (the caller
    guarantees every offset of the launch is below 2^31 units); 64-bit on return."""
    return int64(int32(b * stride_b + h * stride_h + s * stride_s + unit))


def _make_unit_rotation(half: bool, elements: int, unpack, pack):
    """``(pairs per item, load_item, store_item)`` for 16-byte units of ``elements``
    elements: ``load_item(x, x_unit, partner)`` returns the item's unit(s) (a unit from
    each half for half-split; interleaved returns its one unit twice) and
    ``store_item(y, y_unit, partner, first, second, sins, coss, bf16)`` rotates and stores
    them (``unpack`` / ``pack`` of ``ROPE_UNIT_CODECS``, given the launch's ``bf16`` flag).
    A thread reads and writes the same units, so in place is safe."""
    pairs = elements if half else elements // 2
    if half:
        rotate = _rotate_half8 if elements == 8 else _rotate_half4

        @cuda.jit(device=True, inline=True)
        def load_item(x, x_unit, partner):
            return load16(x, uint64(x_unit * 4)), load16(x, uint64((x_unit + partner) * 4))

        @cuda.jit(device=True, inline=True)
        def store_item(y, y_unit, partner, first, second, sins, coss, bf16):
            ya, yb = rotate(unpack(first, bf16), unpack(second, bf16), sins, coss)
            store16(y, uint64(y_unit * 4), pack(ya, bf16))
            store16(y, uint64((y_unit + partner) * 4), pack(yb, bf16))

    else:
        rotate = _rotate_interleaved8 if elements == 8 else _rotate_interleaved4

        @cuda.jit(device=True, inline=True)
        def load_item(x, x_unit, partner):
            unit = load16(x, uint64(x_unit * 4))
            return unit, unit

        @cuda.jit(device=True, inline=True)
        def store_item(y, y_unit, partner, first, second, sins, coss, bf16):
            store16(y, uint64(y_unit * 4), pack(rotate(unpack(first, bf16), sins, coss), bf16))

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
         x_h, x_s, y_b, y_h, y_s, half_rotary, inverse, bf16) = params
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
                                   sins, coss, bf16)
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
    """The ``rope_table`` kernel of ``ROPE_UNIT_CODECS[element]`` for ``layout``
    (``planes_per_thread``: 0 for the table's choice; benchmarks build other variants);
    f16 and bf16 get the same kernel."""
    default = TABLE_PLANES_PER_THREAD[layout]
    return _build_rope_table_kernel(unit_token(element), layout,
                                    planes_per_thread or default, register)


@functools.cache
def _build_rope_table_kernel(token: str, layout: str, per_thread: int,
                             register: bool) -> Kernel:
    default = TABLE_PLANES_PER_THREAD[layout]
    element = ElementKind.F16 if token == "HALF" else ElementKind[token]
    _, unpack, pack, elements = ROPE_UNIT_CODECS[element]
    body = _make_rope_table_kernel(ROPE_UNIT_LAYOUTS[layout], elements, unpack, pack,
                                   per_thread)
    words = _flat_c(uint32)
    suffix = "" if per_thread == default else f",planes{per_thread}"
    return Kernel(f"rope_table[{token},{layout}{suffix}]", body,
                  (words, words, words, types.UniTuple(int64, len(ROPE_TABLE_PARAMS))),
                  grid_stride=True, register=register)


#: (element kind, 16-byte layout) -> ``rope_table`` kernel.
ROPE_TABLE_KERNELS = LazyTable(
    [(element, layout) for element in ROPE_UNIT_CODECS for layout in ROPE_UNIT_LAYOUTS],
    lambda key: build_rope_table_kernel(*key))
