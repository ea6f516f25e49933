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

``interleaved`` and ``half_split`` are one kernel (``units2``, the pairing the runtime
``half_split`` field); f16 and bf16 share every kernel (``HALF``, the runtime ``bf16``
field of the parameter tuple picks the conversion).

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

Modules: ``angles`` (trig, loads, angle sources), ``rows`` (the per-element kernels),
``units``, ``tables``, ``flat`` and ``tile`` (the 16-byte unit kernels); this package
re-exports their public names.
"""

from __future__ import annotations

from .angles import (
    ANGLES_BASE,
    ANGLES_INV_FREQ,
    ANGLES_TABLE,
    HEAD_BATCH,
    INV_TWO_PI,
    TABLE_KINDS,
    TWO_PI_HI,
    TWO_PI_LO,
    find_sequence,
    load_index,
    load_real,
    reduce_angle,
    rope_inv_freq,
    rope_sincos32,
    rope_sincos64,
    rotate_pair,
    row_position,
)
from .flat import (
    FLAT_PLANES_PER_THREAD,
    FLAT_X_EVICT_LAST,
    ROPE_FLAT_KERNELS,
    ROPE_FLAT_PARAMS,
    build_rope_flat_kernel,
)
from .qk import QK_HEAD_BATCH, ROPE_QK_KERNELS
from .rows import (
    ROPE_BATCH,
    ROPE_ELEMENTS,
    ROPE_KERNELS,
    ROPE_LAYOUTS,
    ROPE_PARAMS,
    ROPE_SOURCES,
    ROPE_TABLE,
    build_rope_kernel,
)
from .tables import (
    ROPE_ANGLES_KERNEL,
    ROPE_TABLE_KERNELS,
    ROPE_TABLE_PARAMS,
    TABLE_PLANES_PER_THREAD,
    build_rope_table_kernel,
    rope_angles,
)
from .tile import ROPE_TILE_KERNELS, ROPE_TILE_PARAMS, TILE_MAX_PAIRS, build_rope_tile_kernel
from .units import (
    ROPE_UNIT_LAYOUTS,
    ROPE_UNIT_PARAMS,
    ROPE_UNIT_TABLE,
    UNIT_HEAD_BATCH,
    build_rope_units_kernel,
)

__all__ = [
    "ANGLES_BASE", "ANGLES_INV_FREQ", "ANGLES_TABLE", "FLAT_PLANES_PER_THREAD",
    "FLAT_X_EVICT_LAST", "HEAD_BATCH", "INV_TWO_PI", "QK_HEAD_BATCH", "ROPE_QK_KERNELS",
    "ROPE_ANGLES_KERNEL", "ROPE_BATCH",
    "ROPE_ELEMENTS", "ROPE_FLAT_KERNELS", "ROPE_FLAT_PARAMS", "ROPE_KERNELS", "ROPE_LAYOUTS",
    "ROPE_PARAMS", "ROPE_SOURCES", "ROPE_TABLE", "ROPE_TABLE_KERNELS", "ROPE_TABLE_PARAMS",
    "ROPE_TILE_KERNELS", "ROPE_TILE_PARAMS", "ROPE_UNIT_LAYOUTS", "ROPE_UNIT_PARAMS",
    "ROPE_UNIT_TABLE", "TABLE_KINDS", "TABLE_PLANES_PER_THREAD", "TILE_MAX_PAIRS", "TWO_PI_HI",
    "TWO_PI_LO", "UNIT_HEAD_BATCH", "build_rope_flat_kernel", "build_rope_kernel",
    "build_rope_table_kernel", "build_rope_tile_kernel", "build_rope_units_kernel",
    "find_sequence", "load_index", "load_real", "reduce_angle", "rope_angles", "rope_inv_freq",
    "rope_sincos32", "rope_sincos64", "rotate_pair", "row_position",
]
