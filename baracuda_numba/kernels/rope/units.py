"""RoPE: 16-byte units, one thread per (row, item) (``rope_units``)."""

from __future__ import annotations

import functools

from numba import cuda, float32, float64, int64, types, uint32, uint64

from ...launch import Kernel
from ...types import ElementKind
from ..common import (
    div_mod,
    f32_from_bits,
    f32_to_bits,
    is_half,
    load16,
    pack_bf16x2,
    pack_f16x2,
    pack_half2,
    store16,
    unpack_bf16x2,
    unpack_f16x2,
    unpack_half2,
)
from .angles import rope_inv_freq, rope_sincos32, rotate_pair
from .rows import ROPE_KERNELS, _flat_c

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
def _unpack16_half(unit, bf16):
    a0, a1 = unpack_half2(unit[0], bf16)
    a2, a3 = unpack_half2(unit[1], bf16)
    a4, a5 = unpack_half2(unit[2], bf16)
    a6, a7 = unpack_half2(unit[3], bf16)
    return a0, a1, a2, a3, a4, a5, a6, a7


@cuda.jit(device=True, inline=True)
def _pack16_half(values, bf16):
    return (pack_half2(values[0], values[1], bf16), pack_half2(values[2], values[3], bf16),
            pack_half2(values[4], values[5], bf16), pack_half2(values[6], values[7], bf16))


@cuda.jit(device=True, inline=True)
def _unpack16_f32_flag(unit, bf16):
    return _unpack16_f32(unit)


@cuda.jit(device=True, inline=True)
def _pack16_f32_flag(values, bf16):
    return _pack16_f32(values)


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
                    "rotary_dim", "inverse", "bf16")

#: layout -> half-split pairing?  (the 16-byte unit layouts of ``rope_units``)
ROPE_UNIT_LAYOUTS = {"interleaved_16B": False, "half_split_16B": True}

#: Heads loaded before any is stored in ``rope_units`` (full batches; the rest one by one),
#: per layout: 4 loads in flight per thread either way. Registers (ptxas sm_90): half-split
#: f32 at a batch of 4 needed 164 (one 256-thread block per SM) and spilled under a cap of 80.
UNIT_HEAD_BATCH = {"interleaved_16B": 4, "half_split_16B": 2}


def _make_rope_units_kernel(half: bool, elements: int, unpack, pack, batch: int):
    """``rope_units`` body for 16-byte units of ``elements`` elements (``unpack`` /
    ``pack`` of ``ROPE_UNIT_CODECS``, given the launch's ``bf16`` flag)."""
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
        def store_item(y, unit, partner, firsts, seconds, k, sins, coss, bf16):
            ya, yb = rotate(unpack((firsts[k, 0], firsts[k, 1], firsts[k, 2], firsts[k, 3]),
                                   bf16),
                            unpack((seconds[k, 0], seconds[k, 1], seconds[k, 2],
                                    seconds[k, 3]), bf16), sins, coss)
            store16(y, uint64(unit * 4), pack(ya, bf16))
            store16(y, uint64((unit + partner) * 4), pack(yb, bf16))

    else:
        rotate = _rotate_interleaved8 if elements == 8 else _rotate_interleaved4

        @cuda.jit(device=True, inline=True)
        def load_item(x, unit, partner, firsts, seconds, k):
            first = load16(x, uint64(unit * 4))
            for w in range(4):
                firsts[k, w] = first[w]

        @cuda.jit(device=True, inline=True)
        def store_item(y, unit, partner, firsts, seconds, k, sins, coss, bf16):
            values = unpack((firsts[k, 0], firsts[k, 1], firsts[k, 2], firsts[k, 3]), bf16)
            store16(y, uint64(unit * 4), pack(rotate(values, sins, coss), bf16))

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
                     freq_exponent, inverse, sins, coss, firsts, seconds, bf16):
        h = int64(0)
        single = heads < batch
        if single:  # its load is in flight while the angles are computed
            load_item(x, x_unit, partner, firsts, seconds, 0)
        for p in range(pairs):
            sins[p], coss[p] = rope_sincos32(
                pos, rope_inv_freq(item * pairs + p, freq_exponent), inverse)
        if single:
            store_item(y, y_unit, partner, firsts, seconds, 0, sins, coss, bf16)
            h = 1
        while heads - h >= batch:
            for k in range(batch):
                load_item(x, x_unit + (h + k) * x_h, partner, firsts, seconds, k)
            for k in range(batch):
                store_item(y, y_unit + (h + k) * y_h, partner, firsts, seconds, k, sins, coss,
                           bf16)
            h += batch
        while h < heads:
            load_item(x, x_unit + h * x_h, partner, firsts, seconds, 0)
            store_item(y, y_unit + h * y_h, partner, firsts, seconds, 0, sins, coss, bf16)
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
         rotary_dim, inverse, bf16) = params
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
                                 sins, coss, firsts, seconds, bf16)
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

#: The rope unit kernels' codecs: element kind -> (name token, ``unpack(unit, bf16)``,
#: ``pack(values, bf16)``, elements per 16-byte unit). f16 and bf16 share one ``HALF``
#: kernel whose ``bf16`` parameter field (uniform over the launch) picks the conversion.
ROPE_UNIT_CODECS = {
    ElementKind.F16: ("HALF", _unpack16_half, _pack16_half, 8),
    ElementKind.BF16: ("HALF", _unpack16_half, _pack16_half, 8),
    ElementKind.F32: ("F32", _unpack16_f32_flag, _pack16_f32_flag, 4),
}


def unit_token(element: ElementKind) -> str:
    """The element token of the unit kernels' names: ``HALF`` for f16 and bf16."""
    return "HALF" if is_half(element) else element.name


def build_rope_units_kernel(element: ElementKind, layout: str, register: bool = True,
                            max_registers: int | None = None) -> Kernel:
    """The ``rope_units`` kernel of ``ROPE_UNIT_CODECS[element]`` for ``layout``
    (benchmarks build unregistered variants with a register cap); f16 and bf16 get the
    same kernel."""
    return _build_rope_units_kernel(unit_token(element), layout, register, max_registers)


@functools.cache
def _build_rope_units_kernel(token: str, layout: str, register: bool,
                             max_registers: int | None) -> Kernel:
    element = ElementKind.F16 if token == "HALF" else ElementKind[token]
    _, unpack, pack, elements = ROPE_UNIT_CODECS[element]
    body = _make_rope_units_kernel(ROPE_UNIT_LAYOUTS[layout], elements, unpack, pack,
                                   UNIT_HEAD_BATCH[layout])
    words = _flat_c(uint32)
    signature = (words, words, _flat_c(int64), types.UniTuple(int64, len(ROPE_UNIT_PARAMS)),
                 float64)
    suffix = f",regs{max_registers}" if max_registers else ""
    return Kernel(f"rope_units[{token},{layout}{suffix}]", body, signature,
                  grid_stride=True, register=register, max_registers=max_registers)


ROPE_KERNELS.extend([(element, layout) for element in ROPE_UNIT_TABLE
                     for layout in ROPE_UNIT_LAYOUTS], lambda key: build_rope_units_kernel(*key))
