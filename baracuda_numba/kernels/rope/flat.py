"""RoPE: the angle table over compact interleaved tensors (``rope_flat``)."""

from __future__ import annotations

import functools

from numba import cuda, float32, int64, types, uint32, uint64

from ...launch import Kernel, LazyTable
from ...types import ElementKind
from ..common import (
    load16,
    load16_last,
    store16,
)
from .rows import _flat_c
from .tables import _make_unit_rotation, _table_angles
from .units import ROPE_UNIT_CODECS, unit_token

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
                    "half_rotary", "in_place", "inverse", "plane_log", "planes", "bf16")

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
         inverse, plane_log, planes, bf16) = params
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
                    store_item(y, uint64(u), 0, unit, unit, sins, coss, bf16)
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
    """The ``rope_flat`` kernel of ``ROPE_UNIT_CODECS[element]`` (``planes_per_thread``: 0
    for ``FLAT_PLANES_PER_THREAD``'s; benchmarks build other variants); f16 and bf16 get
    the same kernel."""
    default = FLAT_PLANES_PER_THREAD[element]
    return _build_rope_flat_kernel(unit_token(element), planes_per_thread or default,
                                   register)


@functools.cache
def _build_rope_flat_kernel(token: str, per_thread: int, register: bool) -> Kernel:
    element = ElementKind.F16 if token == "HALF" else ElementKind[token]
    default = FLAT_PLANES_PER_THREAD[element]
    _, unpack, pack, elements = ROPE_UNIT_CODECS[element]
    words = _flat_c(uint32)
    suffix = "" if per_thread == default else f",planes{per_thread}"
    return Kernel(f"rope_flat[{token}{suffix}]",
                  _make_rope_flat_kernel(elements, unpack, pack, per_thread,
                                         FLAT_X_EVICT_LAST[element]),
                  (words, words, words, types.UniTuple(int64, len(ROPE_FLAT_PARAMS))),
                  register=register)


#: element kind -> ``rope_flat`` kernel (interleaved pairing).
ROPE_FLAT_KERNELS = LazyTable(ROPE_UNIT_CODECS, build_rope_flat_kernel)
