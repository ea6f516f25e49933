"""RoPE: the per-element kernel skeleton (``rope``), specialised per element kind and
layout, and its table."""

from __future__ import annotations

import functools

from numba import cuda, float32, float64, int64, types, uint16, uint32, uint64

from ...launch import Kernel, LazyTable
from ...types import ElementKind
from ..common import (
    f32_to_half,
    half_to_f32,
    is_half,
    pack_f32x2,
    pack_half2,
    pack_half4,
    unpack_f32x2,
    unpack_half2,
    unpack_half4,
)
from .angles import (
    ANGLES_INV_FREQ,
    ANGLES_TABLE,
    HEAD_BATCH,
    _f32_load,
    _f64_load,
    load_index,
    load_real,
    rope_inv_freq,
    rope_sincos32,
    rope_sincos64,
    rotate_pair,
    row_position,
)

# -- the kernel skeleton, specialised per element kind and layout ------------------------

#: layout -> (elements per memory unit, pairs per item); see the module docstring.
ROPE_LAYOUTS = {
    "pairs": (1, 1),
    "interleaved": (2, 1),
    "half_split": (2, 2),
    "interleaved4": (4, 2),
    "half_split4": (4, 4),
}

#: Layouts served by one kernel body, the pairing a runtime field (``half_split``): the
#: 2-element units (their batches and registers per block are the same; the 4-element
#: ones differ in batch, ``ROPE_BATCH``). An item of the merged body reads its unit and
#: the one ``partner`` units on (the plan's partner is 0 for interleaved: the same unit
#: again, an L1 hit), so no load sits under a branch.
_MERGED_LAYOUTS = {"interleaved": "units2", "half_split": "units2"}

#: Named fields of the kernel's int64 parameter tuple (one tuple: fewer launch arguments
#: to pack per call).
ROPE_PARAMS = ("rows", "seq_len", "num_heads", "heads_per_thread", "items_per_row",
               "rot_items", "pair_step", "partner", "copy_offset", "x_b", "x_h", "x_s",
               "y_b", "y_h", "y_s", "pos_b", "pos_s", "has_positions", "rotary_dim",
               "inverse", "bf16", "half_split")

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


def _rotate_store(layout: str, unpack, pack, to_compute, from_compute):
    """``rotate_store(array, offset, partner, first, second, sins, coss, bf16, half_split)``
    of one ``ROPE_LAYOUTS`` entry (or the merged ``units2``): rotate the item's element
    pair(s) or unit(s) held in ``first`` / ``second`` and store them at ``offset`` (and
    ``offset + partner``); the conversions take the launch's ``bf16`` flag
    (``ROPE_TABLE``), ``units2`` the pairing from ``half_split``."""
    if layout == "units2":
        interleaved = _rotate_store("interleaved", unpack, pack, to_compute, from_compute)
        half_split = _rotate_store("half_split", unpack, pack, to_compute, from_compute)

        @cuda.jit(device=True, inline=True)
        def rotate_either(array, offset, partner, first, second, sins, coss, bf16, split):
            if split:
                half_split(array, offset, partner, first, second, sins, coss, bf16, split)
            else:
                interleaved(array, offset, partner, first, second, sins, coss, bf16, split)

        return rotate_either
    width, _ = ROPE_LAYOUTS[layout]
    # Indices are cast to uint64: Numba then skips the negative-index wrap-around code.
    if width == 1:

        @cuda.jit(device=True, inline=True)
        def rotate_store(array, offset, partner, first, second, sins, coss, bf16, split):
            ya, yb = rotate_pair(to_compute(first, bf16), to_compute(second, bf16), sins[0],
                                 coss[0])
            array[uint64(offset)] = from_compute(ya, bf16)
            array[uint64(offset + partner)] = from_compute(yb, bf16)

    elif layout == "interleaved":

        @cuda.jit(device=True, inline=True)
        def rotate_store(array, offset, partner, first, second, sins, coss, bf16, split):
            a, b = unpack(first, bf16)
            ya, yb = rotate_pair(a, b, sins[0], coss[0])
            array[uint64(offset)] = pack(ya, yb, bf16)

    elif layout == "half_split":

        @cuda.jit(device=True, inline=True)
        def rotate_store(array, offset, partner, first, second, sins, coss, bf16, split):
            a0, a1 = unpack(first, bf16)
            b0, b1 = unpack(second, bf16)
            ya0, yb0 = rotate_pair(a0, b0, sins[0], coss[0])
            ya1, yb1 = rotate_pair(a1, b1, sins[1], coss[1])
            array[uint64(offset)] = pack(ya0, ya1, bf16)
            array[uint64(offset + partner)] = pack(yb0, yb1, bf16)

    elif layout == "interleaved4":

        @cuda.jit(device=True, inline=True)
        def rotate_store(array, offset, partner, first, second, sins, coss, bf16, split):
            a0, b0, a1, b1 = unpack(first, bf16)
            ya0, yb0 = rotate_pair(a0, b0, sins[0], coss[0])
            ya1, yb1 = rotate_pair(a1, b1, sins[1], coss[1])
            array[uint64(offset)] = pack(ya0, yb0, ya1, yb1, bf16)

    else:  # half_split4

        @cuda.jit(device=True, inline=True)
        def rotate_store(array, offset, partner, first, second, sins, coss, bf16, split):
            a0, a1, a2, a3 = unpack(first, bf16)
            b0, b1, b2, b3 = unpack(second, bf16)
            ya0, yb0 = rotate_pair(a0, b0, sins[0], coss[0])
            ya1, yb1 = rotate_pair(a1, b1, sins[1], coss[1])
            ya2, yb2 = rotate_pair(a2, b2, sins[2], coss[2])
            ya3, yb3 = rotate_pair(a3, b3, sins[3], coss[3])
            array[uint64(offset)] = pack(ya0, ya1, ya2, ya3, bf16)
            array[uint64(offset + partner)] = pack(yb0, yb1, yb2, yb3, bf16)

    return rotate_store


def _head_batches(layout: str, storage, batch: int, rotate_store):
    """``rotate_heads`` / ``copy_heads`` of one ``ROPE_LAYOUTS`` entry: ``batch`` heads' items
    loaded (into registers of the ``storage`` type), then rotated and stored (or copied)."""
    width, _ = ROPE_LAYOUTS.get(layout, (2, 2))
    # an item reads a unit from each half (units2: always, the same one for interleaved)
    two_units = layout.startswith("half_split") or layout == "units2"
    second_member = width == 1 or two_units  # does an item read a second element/unit?

    # load(array, offset, partner, first, second, k): the item's unit(s) -> slot k

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
    def rotate_heads(x, y, x_offset, y_offset, x_head, y_head, heads, partner, sins, coss,
                     bf16, split):
        first = cuda.local.array(batch, storage)
        second = cuda.local.array(batch, storage)
        last = heads - 1
        h = int64(0)
        while h < heads:
            for k in range(batch):
                load(x, x_offset + min(h + k, last) * x_head, partner, first, second, k)
            for k in range(batch):
                rotate_store(y, y_offset + min(h + k, last) * y_head, partner, first[k],
                             second[k], sins, coss, bf16, split)
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

    return rotate_heads, copy_heads


def _angle_steps(merged: bool, pairs_per_item: int, compute_type, sincos):
    """Device functions ``(item_inv_freqs, item_angles)``: the inverse frequencies and
    the sines and cosines of one item's pairs (``merged``: units2, whose pairs per item
    come from the runtime ``half_split`` field, 1 interleaved or 2 half-split)."""
    if merged:  # the pairs of an item (1 interleaved, 2 half-split) from the runtime field

        @cuda.jit(device=True, inline=True)
        def item_inv_freqs(invs, item, half_split, inv_freq, angle_source, freq_exponent):
            pairs = 2 if half_split else 1
            for p in range(pairs_per_item):
                if p < pairs:
                    pair = item * pairs + p
                    if angle_source == ANGLES_INV_FREQ:
                        invs[p] = float64(inv_freq[uint64(pair)])
                    else:
                        invs[p] = rope_inv_freq(pair, freq_exponent)

        @cuda.jit(device=True, inline=True)
        def item_angles(sins, coss, invs, item, half_split, pos, table_row, cos_table,
                        sin_table, cs_kind, cs_col, angle_source, inverse):
            pairs = 2 if half_split else 1
            for p in range(pairs_per_item):
                if p < pairs:
                    if angle_source == ANGLES_TABLE:
                        column = table_row + (item * pairs + p) * cs_col
                        coss[p] = compute_type(load_real(cos_table, column, cs_kind))
                        sin_t = compute_type(load_real(sin_table, column, cs_kind))
                        sins[p] = -sin_t if inverse else sin_t
                    else:
                        sins[p], coss[p] = sincos(pos, invs[p], inverse)

    else:

        @cuda.jit(device=True, inline=True)
        def item_inv_freqs(invs, item, half_split, inv_freq, angle_source, freq_exponent):
            for p in range(pairs_per_item):
                pair = item * pairs_per_item + p
                if angle_source == ANGLES_INV_FREQ:
                    invs[p] = float64(inv_freq[uint64(pair)])
                else:
                    invs[p] = rope_inv_freq(pair, freq_exponent)

        @cuda.jit(device=True, inline=True)
        def item_angles(sins, coss, invs, item, half_split, pos, table_row, cos_table,
                        sin_table, cs_kind, cs_col, angle_source, inverse):
            if angle_source == ANGLES_TABLE:
                for p in range(pairs_per_item):
                    column = table_row + (item * pairs_per_item + p) * cs_col
                    coss[p] = compute_type(load_real(cos_table, column, cs_kind))
                    sin_t = compute_type(load_real(sin_table, column, cs_kind))
                    sins[p] = -sin_t if inverse else sin_t
            else:
                for p in range(pairs_per_item):
                    sins[p], coss[p] = sincos(pos, invs[p], inverse)

    return item_inv_freqs, item_angles


def _make_rope_kernel(layout: str, storage, unpack, pack, to_compute, from_compute, sincos,
                      batch: int):
    """Kernel body for one ``ROPE_LAYOUTS`` entry.

    ``pairs``: arrays of elements; ``to_compute``/``from_compute`` convert one element.
    Unit layouts: arrays of 2- or 4-element units; ``unpack``/``pack`` convert one unit.
    ``storage`` is the array's Numba type (registers hold a batch of heads in it).
    """
    width, pairs_per_item = ROPE_LAYOUTS.get(layout, (2, 2))  # units2: at most 2 pairs
    merged = layout == "units2"
    compute_type = float64 if sincos is rope_sincos64 else float32
    copy_step = 2 if width == 1 else 1  # a copied item is 2 elements or 1 unit

    rotate_store = _rotate_store(layout, unpack, pack, to_compute, from_compute)

    item_inv_freqs, item_angles = _angle_steps(merged, pairs_per_item, compute_type, sincos)

    rotate_heads, copy_heads = _head_batches(layout, storage, batch, rotate_store)

    def rope_rows(x, y, positions, cu_seqlens, inv_freq, cos_table, sin_table, dest, x_k,
                  y_k, params, sources, freq_exponent):
        """Items along x (grid-stride), rows (b, s) along y, block.y consecutive rows per
        block (grid-stride); ``params`` holds the ``ROPE_PARAMS`` fields, ``sources`` the
        ``ROPE_SOURCES`` ones (where positions, angles and destination rows come from, and
        k: head groups past q's rotate ``x_k`` into ``y_k`` with the same angles)."""
        (rows, seq_len, num_heads, heads_per_thread, items_per_row, rot_items, pair_step,
         partner, copy_offset, x_b, x_h, x_s, y_b, y_h, y_s, pos_b, pos_s, has_positions,
         rotary_dim, inverse, bf16, half_split) = params
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
                item_inv_freqs(invs, item, half_split, inv_freq, angle_source, freq_exponent)
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
                    table_row = b * cs_b + s * cs_s + pos * cs_pos
                    item_angles(sins, coss, invs, item, half_split, pos, table_row, cos_table,
                                sin_table, cs_kind, cs_col, angle_source, inverse)
                    rotate_heads(source, target, x_row, y_row, in_h, out_h, heads, partner,
                                 sins, coss, bf16, half_split)
                elif inside:
                    copy_heads(source, target, x_row, y_row, in_h, out_h, heads)
                row += row_step
            r += r_step

    return rope_rows


# -- the table ------------------------------------------------------------------------------


def _ignoring_flag(convert):
    """``convert`` of one value or unit, taking (and ignoring) the ``bf16`` flag."""

    @cuda.jit(device=True, inline=True)
    def flagged(value, bf16):
        return convert(value)

    return flagged


@cuda.jit(device=True, inline=True)
def _pack_f32x2_flag(a, b, bf16):
    return pack_f32x2(a, b)


_F32_FLAGGED = _ignoring_flag(_f32_load)
_F64_FLAGGED = _ignoring_flag(_f64_load)

#: element kind -> (element storage type, to_compute, from_compute, sincos,
#:                  {unit width: (unit storage type, unpack, pack)}); every conversion
#: takes the launch's ``bf16`` flag: f16 and bf16 share one ``HALF`` kernel (uint16
#: storage) whose ``bf16`` parameter field picks the conversion.
ROPE_TABLE = {
    ElementKind.F16: (uint16, half_to_f32, f32_to_half, rope_sincos32,
                      {2: (uint32, unpack_half2, pack_half2),
                       4: (uint64, unpack_half4, pack_half4)}),
    ElementKind.BF16: (uint16, half_to_f32, f32_to_half, rope_sincos32,
                       {2: (uint32, unpack_half2, pack_half2),
                        4: (uint64, unpack_half4, pack_half4)}),
    ElementKind.F32: (float32, _F32_FLAGGED, _F32_FLAGGED, rope_sincos32,
                      {2: (uint64, _ignoring_flag(unpack_f32x2), _pack_f32x2_flag)}),
    ElementKind.F64: (float64, _F64_FLAGGED, _F64_FLAGGED, rope_sincos64, {}),
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


#: Batches other than HEAD_BATCH, from the benchmark's sweep, by (element token, layout):
#: 16 for the 4-element interleaved units (more loads in flight); figures in
#: docs/design/rope.md. (bf16 half_split4 took 4 for registers while it had its own
#: kernel; the HALF kernel at 8 takes 126 registers, no spill: two blocks per SM.)
ROPE_BATCH = {("HALF", "interleaved4"): 16}

#: Register caps by (element token, layout): 128 keeps two 256-thread blocks per SM for
#: HALF interleaved4 (130 uncapped; ptxas fits 128 without a spill), as the f16 and bf16
#: kernels had.
_ROWS_MAX_REGISTERS = {("HALF", "interleaved4"): 128}


def _token(element: ElementKind) -> str:
    return "HALF" if is_half(element) else element.name


def build_rope_kernel(element: ElementKind, layout: str, batch: int = 0,
                      register: bool = True) -> Kernel:
    """The kernel of table entry ``element`` for ``layout`` (``batch``: heads per batch, 0
    for the table's choice; benchmarks build unregistered variants); f16 and bf16 get the
    same kernel."""
    token = _token(element)
    default = ROPE_BATCH.get((token, layout), HEAD_BATCH)
    return _build_rope_kernel(token, _MERGED_LAYOUTS.get(layout, layout), batch or default,
                              register)


@functools.cache
def _build_rope_kernel(token: str, layout: str, batch: int, register: bool) -> Kernel:
    default = ROPE_BATCH.get((token, layout), HEAD_BATCH)
    element = ElementKind.F16 if token == "HALF" else ElementKind[token]
    storage, to_c, from_c, sincos, units = ROPE_TABLE[element]
    width = ROPE_LAYOUTS.get(layout, (2, 2))[0]
    unit, unpack, pack = (storage, None, None) if width == 1 else units[width]
    body = _make_rope_kernel(layout, unit, unpack, pack, to_c, from_c, sincos, batch)
    suffix = "" if batch == default else f",batch{batch}"
    return Kernel(f"rope_rows[{token},{layout}{suffix}]", body, _signature(unit),
                  grid_stride=True, register=register,
                  max_registers=_ROWS_MAX_REGISTERS.get((token, layout)))


#: (element kind, layout) -> Kernel, for every layout the element kind has units for.
ROPE_KERNELS = LazyTable(
    [(element, layout) for element, entry in ROPE_TABLE.items()
     for layout, (width, _) in ROPE_LAYOUTS.items() if width == 1 or width in entry[4]],
    lambda key: build_rope_kernel(*key))
