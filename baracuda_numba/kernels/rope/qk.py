"""RoPE of q and k together from cos/sin tables, 16-byte units: ``rope_qk``.

The same rotation as ``kernels/rope.py`` (``rotate_pair``: one product and one fma per
output in f32, one rounding to the storage type), for the shape LLM attention calls it
with: q ``[B, Hq, S, D]`` and k ``[B, Hk, S, D]`` (any outer strides: HF's ``[B, S, H, D]``
storage, slices of a fused qkv tensor) rotated by one angle per (row = (b, s), pair) that
is read from the caller's cos/sin tables (HF's gathered ``[B, S, D]``, or a cache
``[S_max, D]`` indexed by position), never computed::

    backward = rotation by -θ (sin negated): the runtime ``inverse`` field
    pairing  = the runtime ``half_split`` field; f16 / bf16 = the runtime ``bf16`` field

Work layout: thread ``g`` = (row, head group, item), item fastest::

    item   = a 16-byte unit (interleaved: w/2 pairs) or a unit from each half
             (half-split: w pairs), w = 16 bytes / element size
    group  = heads_per_thread consecutive heads of q (groups [0, q_groups)) or of k
    per thread: every x load of its heads issued (QK_HEAD_BATCH at a time, all before any
    store), then the item's cos and sin, one 16-byte load each (the same table unit for
    every head of the row: read once per thread, L1-shared by the row's threads), then
    rotate and store

The table's unit for item ``j`` is unit ``j`` of the table row: half-split pairs
``w·j .. w·j+w-1`` sit at those columns (HF's ``cat(freqs, freqs)`` or a half-width
table), interleaved pairs ``w/2·j ..`` at the even columns of that unit (a width-D
``repeat_interleave`` table). Offsets are 32-bit unit counts (the plan takes the kernel
only where every array spans fewer than 2^31 units and strides are non-negative); the
only divisions are three 32-bit ones per thread (a shift for the item where the items
of a row are a power of two). A last, partial batch of heads loads its last head again
(an L1 hit; no predicated loads) and stores only the heads it has.
"""

from __future__ import annotations

import functools

from numba import cuda, float32, int64, types, uint32, uint64

from ...launch import Kernel, LazyTable
from ...types import ElementKind
from ..common import load16, store16
from .angles import load_index
from .units import (
    ROPE_UNIT_CODECS,
    _rotate_half4,
    _rotate_half8,
    _rotate_interleaved4,
    _rotate_interleaved8,
    unit_token,
)

#: Heads whose loads are in flight together per thread (two 16-byte loads each for
#: half-split): 8 loads of 16 bytes per thread before the first store.
QK_HEAD_BATCH = 4

#: Named fields of ``rope_qk``'s int64 parameter tuple; offsets and strides count 16-byte
#: units (``cs_*``: the cos/sin tables' batch, sequence and position strides).
ROPE_QK_PARAMS = ("threads", "items", "items_log", "groups", "q_groups", "heads_per_thread",
                  "q_heads", "k_heads", "seq_len", "partner", "q_b", "q_h", "q_s", "qo_b",
                  "qo_h", "qo_s", "k_b", "k_h", "k_s", "ko_b", "ko_h", "ko_s", "cs_b", "cs_s",
                  "cs_pos", "has_positions", "pos_wide", "pos_b", "pos_s", "inverse",
                  "half_split", "bf16")

#: pairing -> half-split?
ROPE_QK_PAIRINGS = {"interleaved": False, "half_split": True}


def _make_rope_qk_kernel(elements: int, unpack, pack):
    """``rope_qk`` body for 16-byte units of ``elements`` elements, either pairing (the
    ``half_split`` field: ``elements`` pairs an item, the table column of pair p is p;
    interleaved: ``elements / 2`` pairs, column 2p)."""
    batch = QK_HEAD_BATCH
    rotate_half = _rotate_half8 if elements == 8 else _rotate_half4
    rotate_interleaved = _rotate_interleaved8 if elements == 8 else _rotate_interleaved4

    @cuda.jit(device=True, inline=True)
    def unit_at(row_unit, head, stride_h):
        # 32-bit unit offset (the plan bounds every span below 2^31 units), as a word index
        return uint64(uint32(row_unit + uint32(uint32(head) * stride_h))) * uint64(4)

    def rope_qk(q, q_out, k, k_out, cos, sin, positions, params):
        """One thread per (row, head group, item), item fastest; ``params`` holds the
        ``ROPE_QK_PARAMS`` fields; every array is a uint32 view. No grid-stride loop: the
        plan's grid covers ``threads``."""
        (threads, items, items_log, groups, q_groups, heads_per_thread, q_heads, k_heads,
         seq_len, partner, q_b, q_h, q_s, qo_b, qo_h, qo_s, k_b, k_h, k_s, ko_b, ko_h, ko_s,
         cs_b, cs_s, cs_pos, has_positions, pos_wide, pos_b, pos_s, inverse, half_split,
         bf16) = params
        g = uint32(uint32(cuda.blockIdx.x) * uint32(cuda.blockDim.x) + uint32(cuda.threadIdx.x))
        if g >= uint32(threads):
            return
        if items_log >= 0:
            rest = uint32(g >> uint32(items_log))
            item = uint32(g & uint32(items - 1))
        else:
            rest = uint32(g // uint32(items))
            item = uint32(g - rest * uint32(items))
        row = uint32(rest // uint32(groups))
        group = uint32(rest - row * uint32(groups))
        b = uint32(row // uint32(seq_len))
        s = uint32(row - b * uint32(seq_len))
        is_k = group >= uint32(q_groups)
        if is_k:
            head0 = uint32((group - uint32(q_groups)) * uint32(heads_per_thread))
            last = uint32(min(head0 + uint32(heads_per_thread), uint32(k_heads)) - uint32(1))
            source, target = k, k_out
            in_b, in_h, in_s, out_b, out_h, out_s = k_b, k_h, k_s, ko_b, ko_h, ko_s
        else:
            head0 = uint32(group * uint32(heads_per_thread))
            last = uint32(min(head0 + uint32(heads_per_thread), uint32(q_heads)) - uint32(1))
            source, target = q, q_out
            in_b, in_h, in_s, out_b, out_h, out_s = q_b, q_h, q_s, qo_b, qo_h, qo_s
        in_h, out_h = uint32(in_h), uint32(out_h)
        in_row = uint32(b * uint32(in_b) + s * uint32(in_s) + item)  # head 0's unit
        out_row = uint32(b * uint32(out_b) + s * uint32(out_s) + item)
        firsts = cuda.local.array((batch, 4), uint32)
        seconds = cuda.local.array((batch, 4), uint32)
        sins = cuda.local.array(elements, float32)
        coss = cuda.local.array(elements, float32)
        h = head0
        first_batch = True
        while h <= last:
            for j in range(batch):
                at = unit_at(in_row, min(uint32(h + uint32(j)), last), in_h)
                unit = load16(source, at)
                for w in range(4):
                    firsts[j, w] = unit[w]
                if half_split:
                    unit = load16(source, at + uint64(4 * partner))
                    for w in range(4):
                        seconds[j, w] = unit[w]
            if first_batch:  # after the first batch's loads: they are in flight meanwhile
                table_row = uint32(b * uint32(cs_b) + s * uint32(cs_s) + item)
                if has_positions:  # a cache: the row of this token's position
                    pos = load_index(positions, int64(b) * pos_b + int64(s) * pos_s,
                                     pos_wide)
                    table_row = uint32(table_row + uint32(pos) * uint32(cs_pos))
                table_word = uint64(table_row) * uint64(4)
                cos_values = unpack(load16(cos, table_word), bf16)
                sin_values = unpack(load16(sin, table_word), bf16)
                if half_split:
                    for p in range(elements):
                        coss[p] = cos_values[p]
                        sins[p] = -sin_values[p] if inverse else sin_values[p]
                else:
                    for p in range(elements // 2):
                        coss[p] = cos_values[2 * p]
                        sins[p] = -sin_values[2 * p] if inverse else sin_values[2 * p]
                first_batch = False
            for j in range(batch):
                if h + uint32(j) <= last:  # a repeated head is loaded, not stored again
                    at = unit_at(out_row, h + uint32(j), out_h)
                    first = (firsts[j, 0], firsts[j, 1], firsts[j, 2], firsts[j, 3])
                    if half_split:
                        second = (seconds[j, 0], seconds[j, 1], seconds[j, 2], seconds[j, 3])
                        ya, yb = rotate_half(unpack(first, bf16), unpack(second, bf16), sins,
                                             coss)
                        store16(target, at, pack(ya, bf16))
                        store16(target, at + uint64(4 * partner), pack(yb, bf16))
                    else:
                        store16(target, at, pack(rotate_interleaved(unpack(first, bf16), sins,
                                                                    coss), bf16))
            h = uint32(h + uint32(batch))

    return rope_qk


def build_rope_qk_kernel(element: ElementKind, pairing: str) -> Kernel:
    """The ``rope_qk`` kernel of ``ROPE_UNIT_CODECS[element]``: one for both pairings
    (``pairing``, a runtime field) and, for f16 and bf16, one for both."""
    return _build_rope_qk_kernel(unit_token(element))


@functools.cache
def _build_rope_qk_kernel(token: str) -> Kernel:
    element = ElementKind.F16 if token == "HALF" else ElementKind[token]
    _, unpack, pack, elements = ROPE_UNIT_CODECS[element]
    words = types.Array(uint32, 1, "C")
    signature = (words,) * 7 + (types.UniTuple(int64, len(ROPE_QK_PARAMS)),)
    return Kernel(f"rope_qk[{token}]", _make_rope_qk_kernel(elements, unpack, pack),
                  signature)


#: (element kind, pairing) -> ``rope_qk`` kernel: f16, bf16, f32 x two pairings.
ROPE_QK_KERNELS = LazyTable(
    [(element, pairing) for element in ROPE_UNIT_CODECS for pairing in ROPE_QK_PAIRINGS],
    lambda key: build_rope_qk_kernel(*key))
