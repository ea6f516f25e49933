"""``RopePlan`` / ``RopeBackwardPlan``: rotary position embedding of ``[B, H, S, D]`` tensors.

For pair ``i < R/2`` (``R = rotary_dim``, default ``head_dim``), ``θ = pos · base^(−2i/R)``::

    y[a] = x[a]·cosθ − x[b]·sinθ,   y[b] = x[b]·cosθ + x[a]·sinθ      (forward)
    dx   = the same with sinθ negated (rotation by −θ)                  (backward)

with ``(a, b) = (2i, 2i+1)`` for ``RopePairing.INTERLEAVED`` (GPT-J, the upstream rule) and
``(i, i + R/2)`` for ``RopePairing.HALF_SPLIT`` (NeoX/Llama ``rotate_half``). Features
``R..D-1`` are copied unchanged. ``pos`` is ``positions[s]`` (i64 ``[S]``, shared by every
sequence), ``positions[b, s]`` (i64 ``[B, S]``) or ``s`` when ``positions`` is None.

Contract:

* dtypes f16, bf16, f32 (θ, cos, sin and the rotation in f32 with accurate sincos; the
  inverse frequency rounded once from f64) and f64 (all in f64, ``base`` as f64);
* ``x``/``y`` (``dy``/``dx``) of shape ``[B, H, S, D]``, innermost stride 1, every other
  stride free (q/k views sliced out of a fused qkv tensor work without a copy); ``y`` may
  be ``x`` itself (in place); a ``y`` that partly overlaps ``x`` is rejected;
* ``head_dim`` even, ``rotary_dim`` even and ``<= head_dim``, ``base`` finite and > 0.

Rejections (before any launch): ``InvalidProblem`` for bad extents, odd head/rotary dims,
bad base, shape/positions mismatches, innermost stride != 1, partial overlap, backward
descriptor != forward descriptor; ``Unsupported`` for other element kinds.
Deterministic and bit-stable: each output element is computed by one thread, and every
memory layout (``kernels/rope/``: the widest unit the pointers, strides and rotary dim
allow, picked per call and cached) produces the same bits.

Kernels (:meth:`_RopeBase._kernel_path`), where 16-byte units fit (f16/bf16/f32):

* positions absent: ``rope_table``, reading the angles from a device table of
  ``seq_len · R/2`` f32 (cos, sin) pairs that the plan builds at its first such run (on
  that run's stream, then waited for) and keeps: 8 bytes a pair, 1 MB for S = 2048 and
  R = 128. Taken while the table is at most 4 MB and within ``pref.max_workspace_bytes``;
  a run captured into a CUDA graph before the table exists takes another kernel (nothing
  can be allocated or waited for while capturing). Interleaved x and y that are both
  compact take ``rope_flat`` instead, in memory order (a thread takes the same unit of 2
  consecutive (b, h) planes, one table read for both) with the table read under an L2
  ``evict_last`` policy (:meth:`_RopeBase._flat_fits`);
* small problems (decode): ``rope_tile``, one row of several heads per block, the row's
  angles computed once into shared memory; one tile per block and 32-bit offsets, so only
  where that grid fits CUDA's limits and x and y span fewer than 2^31 16-byte units;
* otherwise the ``ROPE_KERNELS`` layouts (f64 always).
"""

from __future__ import annotations

import functools
import math
import threading
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
from numba import cuda

from .._runtime import SIMULATOR
from ..arrays import TensorMut, TensorRef, as_mut, as_ref, contiguous_strides, flat_span
from ..driver import stream_capturing, stream_synchronize
from ..errors import InvalidProblem
from ..kernels.common import half_flag
from ..kernels.rope import (
    FLAT_PLANES_PER_THREAD,
    ROPE_ANGLES_KERNEL,
    ROPE_ELEMENTS,
    ROPE_FLAT_KERNELS,
    ROPE_KERNELS,
    ROPE_TABLE_KERNELS,
    ROPE_TILE_KERNELS,
    TABLE_PLANES_PER_THREAD,
    TILE_MAX_PAIRS,
    build_rope_flat_kernel,
    build_rope_table_kernel,
)
from ..streams import stream_handle
from ..types import (
    ArchSku,
    AttentionKind,
    BackendKind,
    ElementKind,
    KernelSku,
    MathPrecision,
    OpCategory,
    PlanPreference,
    PrecisionGuarantee,
    RopeAngleSource,
    RopeLayout,
    RopePairing,
)
from .base import LAUNCHED, LayoutMemo, Plan, fail, plan_args
from .rope_general import RopeGeneralPath, _nothing, _positions_args
from .rope_qk import QkPath, qk_eligible
from .rope_sources import (
    _has_extras,
    _plain_sources,
)

__all__ = [
    "ROPE_DEFAULT_BASE",
    "ROPE_ELEMENTS",
    "RopeArgs",
    "RopeBackwardArgs",
    "RopeBackwardDescriptor",
    "RopeBackwardPlan",
    "RopeDescriptor",
    "RopePlan",
]

ROPE_DEFAULT_BASE = 10000.0

# Launch shape: blocks of 256 threads, the row's items along x and consecutive rows along y
# (neighbouring rows are neighbours in memory); grid.y capped at _ROW_BLOCKS blocks so a
# thread walks several rows and its inverse frequencies are amortised; each thread rotates
# _HEADS_PER_THREAD heads per row, amortising one sincos (32 or 8 heads a thread measured
# slower; the sweep: docs/design/rope.md).
_BLOCK = 256
_ROW_BLOCKS = 2048
_HEADS_PER_THREAD = 16
# Small problems (decode: [64, 32, 1, 128] has 64 rows) would get a few thousand threads at
# 16 heads per thread, each walking its heads serially: latency-bound. Heads per thread are
# halved while fewer than about one wave of threads (132 SMs x 1024) exists, down to 4: below
# that a thread repeats loads within its batch (the decode sweep: docs/design/rope.md).
_MIN_THREADS = 1 << 17
_MIN_HEADS_PER_THREAD = 4


# The 16-byte unit kernel (``rope_units``): threads numbered along (row, item) in memory
# order, _UNIT_HEADS_PER_THREAD heads each, halved while fewer than _MIN_THREADS threads
# would exist (decode: one head per thread, its load overlapping the angle computation).
# f32 takes it at every size; f16/bf16 only for small interleaved problems, where it
# measured faster than the 8-byte kernels (figures: docs/design/rope.md).
_UNIT_HEADS_PER_THREAD = 8
_UNITS16_MAX_HALF_ELEMENTS = 1 << 22

# ``rope_table`` (positions absent): the plan's (cos, sin) table of every (s, pair), 8 bytes
# a pair, built at the first run that takes it and kept; at most _TABLE_MAX_BYTES (a small
# part of the 50 MB L2, which serves the table's reads) and never more than
# ``pref.max_workspace_bytes``. Taken automatically for _TABLE_ELEMENTS.
_TABLE_MAX_BYTES = 4 << 20
_TABLE_ELEMENTS = (ElementKind.F16, ElementKind.BF16, ElementKind.F32)
_TABLE_BLOCK = 256
# ``rope_flat``: the table over compact interleaved x and y, one unit of each of
# ``FLAT_PLANES_PER_THREAD`` (b, h) planes per thread (``ROPE_FLAT_KERNELS``), fewer than
# 2^32 units; blocks of FLAT_BLOCK[element bytes] threads, the grid covering the units
# (the block and planes sweep: docs/design/rope.md).
#: ``rope_flat``'s threads per block, by element bytes.
FLAT_BLOCK = {2: 64, 4: 64} if SIMULATOR else {2: 128, 4: 256}

# ``rope_tile`` (positions given, or no table): one row of several heads per block, the
# row's angles computed once into shared memory. Taken automatically while one 16-byte unit
# per thread would give fewer than _TILE_MAX_UNITS threads (decode-sized problems), with
# blocks of about _TILE_THREADS threads.
_TILE_MAX_UNITS = 1 << 17
_TILE_THREADS = 256
# Grid extents the table and tile launches use at most (CUDA's grid.y/z limit): the
# defaults of the plans' ``grid_x_limit`` / ``grid_yz_limit``.
_GRID_X_LIMIT = (1 << 31) - 1
_GRID_YZ_LIMIT = 65535


def _unit_heads_per_thread(threads_per_head: int, heads: int) -> int:
    """_UNIT_HEADS_PER_THREAD heads per thread, fewer (down to 1) while the launch would
    have fewer than _MIN_THREADS threads."""
    per_thread = min(heads, _UNIT_HEADS_PER_THREAD) or 1
    while per_thread > 1 and threads_per_head * -(-heads // per_thread) < _MIN_THREADS:
        per_thread //= 2
    return per_thread


def _heads_per_thread(rows: int, heads: int, dim: int) -> int:
    """16 heads per thread, fewer (not below 4) while the launch would have fewer than
    _MIN_THREADS threads (a row has about dim / 8 items in the unit layouts)."""
    per_thread = min(heads, _HEADS_PER_THREAD) or 1
    while (per_thread > _MIN_HEADS_PER_THREAD
           and max(dim // 8, 1) * rows * -(-heads // per_thread) < _MIN_THREADS):
        per_thread //= 2
    return per_thread


@dataclass(frozen=True, slots=True)
class RopeDescriptor:
    """``[B, H, S, D]`` extents, rotary ``base``, element kind, pair layout and the number of
    rotated features ``rotary_dim`` (None: all of ``head_dim``).

    ``num_kv_heads`` > 0: the run also rotates ``k`` (``[B, num_kv_heads, S, D]``; it must
    divide ``num_heads``, GQA). ``layout``: the axis order of x/y (and k): ``BHSD``,
    ``BSHD``, or ``THD`` (packed ``[T, H, D]``, ``seq_len = T``, ``batch_size`` = the
    sequences of ``cu_seqlens`` or 1). ``angles``: where θ comes from
    (:class:`~baracuda_numba.types.RopeAngleSource`; the arrays are run arguments)."""

    batch_size: int
    num_heads: int
    seq_len: int
    head_dim: int
    base: float = field(default=ROPE_DEFAULT_BASE, kw_only=True)
    element: ElementKind = field(kw_only=True)
    pairing: RopePairing = field(default=RopePairing.INTERLEAVED, kw_only=True)
    rotary_dim: int | None = field(default=None, kw_only=True)
    num_kv_heads: int = field(default=0, kw_only=True)
    layout: RopeLayout = field(default=RopeLayout.BHSD, kw_only=True)
    angles: RopeAngleSource = field(default=RopeAngleSource.BASE, kw_only=True)


@dataclass(frozen=True, slots=True)
class RopeBackwardDescriptor:
    """Same fields as :class:`RopeDescriptor`; they must match the forward call."""

    batch_size: int
    num_heads: int
    seq_len: int
    head_dim: int
    base: float = field(default=ROPE_DEFAULT_BASE, kw_only=True)
    element: ElementKind = field(kw_only=True)
    pairing: RopePairing = field(default=RopePairing.INTERLEAVED, kw_only=True)
    rotary_dim: int | None = field(default=None, kw_only=True)
    num_kv_heads: int = field(default=0, kw_only=True)
    layout: RopeLayout = field(default=RopeLayout.BHSD, kw_only=True)
    angles: RopeAngleSource = field(default=RopeAngleSource.BASE, kw_only=True)

    @classmethod
    def of(cls, forward: RopeDescriptor) -> RopeBackwardDescriptor:
        """The backward descriptor matching ``forward``."""
        return cls(**{f.name: getattr(forward, f.name) for f in fields(forward)})


@plan_args
class RopeArgs:
    """``x`` is read, ``y`` written (may be ``x``); ``positions`` i64/i32 ``[S]``/``[B, S]``
    (``THD``: ``[T]``, or per-sequence offsets ``[B]`` with ``cu_seqlens``); ``k``/``k_out``
    when ``num_kv_heads`` > 0; ``inv_freq`` f32 ``[R/2]`` or ``cos``/``sin`` as the
    descriptor's ``angles`` says; ``cu_seqlens`` i32/i64 ``[B + 1]`` (``THD``)."""

    x: Any
    y: Any
    positions: Any = None
    k: Any = None
    k_out: Any = None
    inv_freq: Any = None
    cos: Any = None
    sin: Any = None
    cu_seqlens: Any = None


@plan_args
class RopeBackwardArgs:
    """``dy`` is read, ``dx`` written (may be ``dy``); ``dk``/``dk_out`` and the rest as in
    the forward's ``k``/``k_out``."""

    dy: Any
    dx: Any
    positions: Any = None
    dk: Any = None
    dk_out: Any = None
    inv_freq: Any = None
    cos: Any = None
    sin: Any = None
    cu_seqlens: Any = None


@dataclass(frozen=True, slots=True)
class RopeChoice:
    """What :meth:`RopePlan.choice` reports of a call's kernel.

    ``path``: "table" (``rope_table`` / ``rope_flat``), "tile" (``rope_tile``) or "rows"
    (a ``ROPE_KERNELS`` layout); ``layout`` / ``width``: the widest ``ROPE_KERNELS`` layout
    the arrays allow and its elements per memory unit; ``flat``: a table call over these
    arrays takes ``rope_flat``; ``tile_heads_per_block``: heads per ``rope_tile`` block
    (tile path only)."""

    path: str
    layout: str
    width: int
    flat: bool
    tile_heads_per_block: int | None


class _RopeBase(RopeGeneralPath, Plan):
    """Validation and launch shared by the forward and backward plans."""

    _inverse = 0
    _in_name = "x"
    _out_name = "y"

    @classmethod
    def _check(cls, desc: Any) -> None:
        extents = ("batch_size", "num_heads", "seq_len", "head_dim")
        for name in extents:
            value = getattr(desc, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                fail(cls.name, InvalidProblem, f"desc.{name}",
                     f"= {value!r} must be a non-negative int")
        cls.check_element(desc.element, ROPE_ELEMENTS)
        if desc.head_dim % 2:
            fail(cls.name, InvalidProblem, "desc.head_dim",
                 f"= {desc.head_dim} must be even (features are rotated in pairs)")
        base = desc.base
        if (not isinstance(base, (int, float)) or isinstance(base, bool)
                or not math.isfinite(base) or base <= 0):
            fail(cls.name, InvalidProblem, "desc.base", f"= {base!r} must be finite and > 0")
        if not isinstance(desc.pairing, RopePairing):
            fail(cls.name, InvalidProblem, "desc.pairing",
                 f"= {desc.pairing!r} is not a RopePairing")
        rotary = desc.rotary_dim
        if rotary is not None:
            if not isinstance(rotary, int) or isinstance(rotary, bool):
                fail(cls.name, InvalidProblem, "desc.rotary_dim", f"= {rotary!r} must be an int")
            if rotary < 0 or rotary % 2 or rotary > desc.head_dim:
                fail(cls.name, InvalidProblem, "desc.rotary_dim",
                     f"= {rotary} must be even and 0 <= rotary_dim <= head_dim = "
                     f"{desc.head_dim}")
        kv = desc.num_kv_heads
        if not isinstance(kv, int) or isinstance(kv, bool) or kv < 0:
            fail(cls.name, InvalidProblem, "desc.num_kv_heads",
                 f"= {kv!r} must be a non-negative int")
        if kv and desc.num_heads % kv:
            fail(cls.name, InvalidProblem, "desc.num_kv_heads",
                 f"= {kv} must divide num_heads = {desc.num_heads} (grouped-query heads)")
        if not isinstance(desc.layout, RopeLayout):
            fail(cls.name, InvalidProblem, "desc.layout", f"= {desc.layout!r} is not a RopeLayout")
        if not isinstance(desc.angles, RopeAngleSource):
            fail(cls.name, InvalidProblem, "desc.angles",
                 f"= {desc.angles!r} is not a RopeAngleSource")
        if desc.layout is RopeLayout.THD and desc.batch_size < 1 and desc.seq_len:
            fail(cls.name, InvalidProblem, "desc.batch_size",
                 f"= {desc.batch_size} must count the packed sequences (>= 1) for THD")

    def __init__(self, desc: Any, pref: PlanPreference | None) -> None:
        element = desc.element
        f64 = element is ElementKind.F64
        guarantee = PrecisionGuarantee(MathPrecision.F64 if f64 else MathPrecision.F32,
                                       ElementKind.F64 if f64 else ElementKind.F32,
                                       bit_stable_on_same_hardware=True, deterministic=True)
        sku = KernelSku(OpCategory.ATTENTION, int(AttentionKind.ROPE), element, None,
                        desc.pairing.name.lower(), None, ArchSku.SM80, BackendKind.BESPOKE,
                        guarantee)
        super().__init__(desc, sku, pref)
        batch, heads, seq, dim = desc.batch_size, desc.num_heads, desc.seq_len, desc.head_dim
        #: the run takes the general path (:meth:`_run_general`): k, another layout or
        #: another angle source than ``base``
        self._general = (desc.num_kv_heads > 0 or desc.layout is not RopeLayout.BHSD
                         or desc.angles is not RopeAngleSource.BASE)
        if desc.layout is RopeLayout.THD:
            batch = 1  # the kernels see [1, H, T, D]; batch_size counts cu_seqlens' sequences
        self._general_launches: dict[tuple, Any] = {}
        rotary = dim if desc.rotary_dim is None else desc.rotary_dim
        self._shape = (batch, heads, seq, dim)
        self._rotary = rotary
        self._empty = batch * heads * seq * dim == 0
        self._half_split = desc.pairing is RopePairing.HALF_SPLIT
        self._rows = batch * seq
        #: benchmarks may change these (call ``retune()`` after changing them)
        self.heads_per_thread = _heads_per_thread(batch * seq, heads, dim)
        self.row_blocks = _ROW_BLOCKS
        self.force_pairs = False  # tests: take the element path even when units would do
        #: grid extents the table and tile launches use at most; tests lower them to make
        #: the table kernel's grid-stride loops run and to check that the tile, which has
        #: no such loop, is then not taken
        self.grid_x_limit = _GRID_X_LIMIT
        self.grid_yz_limit = _GRID_YZ_LIMIT
        #: 16-byte unit kernel: None = automatic (f32; small interleaved f16/bf16)
        self.units16: bool | None = None
        #: heads per thread of the 16-byte unit kernel (None: from the problem size)
        self.unit_heads_per_thread: int | None = None
        #: ``rope_table`` when positions are absent: None = automatic (_TABLE_ELEMENTS, a
        #: table of at most _TABLE_MAX_BYTES and ``pref.max_workspace_bytes``), True =
        #: always (where 16-byte units fit), False = never
        self.angle_table: bool | None = None
        #: ``rope_tile``: None = automatic (small problems), True = always (where it
        #: fits), False = never
        self.tile: bool | None = None
        #: (b, h) planes per ``rope_table`` thread (None: ``TABLE_PLANES_PER_THREAD``)
        self.table_planes_per_thread: int | None = None
        #: ``rope_flat`` for the table path where it fits (compact interleaved x and y):
        #: None or True = yes, False = never (``rope_table`` instead)
        self.table_flat: bool | None = None
        #: (b, h) planes per ``rope_flat`` thread (None: ``FLAT_PLANES_PER_THREAD``)
        self.flat_planes_per_thread: int | None = None
        #: heads per ``rope_tile`` block (None: about _TILE_THREADS threads a block)
        self.tile_heads_per_block: int | None = None
        #: ``rope_qk`` for q and k with cos/sin tables (``plans/rope_qk.py``): None =
        #: where the arrays allow it, False = never (call ``retune()`` after changing)
        self.qk_kernel: bool | None = None
        #: heads per ``rope_qk`` thread (None: from the problem size)
        self.qk_heads_per_thread: int | None = None
        #: the q+k path (None: the descriptor never takes ``rope_qk``)
        self.qk_path = QkPath(self) if qk_eligible(desc) else None
        self._table: Any = None  # the (cos, sin) table, built at first use
        # one build per plan: a second table would free the first under a cached launch
        self._table_lock = threading.Lock()
        self._table_ptr = 0
        self._table_bytes = seq * (rotary // 2) * 8
        limit = self._pref.max_workspace_bytes
        self._table_limit = _TABLE_MAX_BYTES if limit is None else min(limit,
                                                                        _TABLE_MAX_BYTES)
        self._spans: dict[tuple[int, ...], int] = {}
        self._launches: dict[tuple, Any] = {}
        # layout key (torch, CuPy) of (x, y, positions) -> launch (run fast path): y must
        # not overlap x, or be x itself (the in-place memo, for ``y is x``)
        self._memo = LayoutMemo(3, ((0, 1),))
        self._memo_in_place = LayoutMemo(3)
        self._itemsize = element.byte_width
        # θ's exponent step: inv_freq(pair) = 2^(pair · (−2·log2(base) / R)), evaluated in
        # f64 by the kernels (``rope_inv_freq``)
        self._freq_exponent = -2.0 * math.log2(desc.base) / rotary if rotary else 0.0
        # only this element's entries of the tables (each built on its first lookup)
        self._kernels = {layout: ROPE_KERNELS[kind, layout] for kind, layout in ROPE_KERNELS
                         if kind is element}
        self._table_kernels = {layout: ROPE_TABLE_KERNELS[kind, layout]
                               for kind, layout in ROPE_TABLE_KERNELS if kind is element}
        self._tile_kernels = {layout: ROPE_TILE_KERNELS[kind, layout]
                              for kind, layout in ROPE_TILE_KERNELS if kind is element}
        self._flat_kernel = None if self._half_split else ROPE_FLAT_KERNELS.get(element)
        if not self._empty:
            for kernel in (*self._kernels.values(), *self._table_kernels.values(),
                           *self._tile_kernels.values(), *filter(None, [self._flat_kernel])):
                kernel.prepare()
            if self._table_kernels:
                ROPE_ANGLES_KERNEL.prepare()

    def can_implement(self, args: Any) -> tuple[TensorRef, TensorMut, TensorRef | None]:
        """Views of the input, the output and the positions after every array check."""
        name = self.name
        element = self.descriptor.element
        source, dest, positions = self._unpack_args(args)
        shape = self._shape
        x = as_ref(source, name, self._in_name, element, shape)
        y = as_mut(dest, name, self._out_name, element, shape)
        if shape[3] > 1 and not self._empty:  # an empty view's strides mean nothing
            if x.strides[3] != 1:
                fail(name, InvalidProblem, f"{self._in_name}.strides[3]",
                     f"= {x.strides[3]} must be 1 (pairs are read along the feature axis)")
            if y.strides[3] != 1:
                fail(name, InvalidProblem, f"{self._out_name}.strides[3]",
                     f"= {y.strides[3]} must be 1 (pairs are written along the feature axis)")
        if (x.ptr != y.ptr or x.strides != y.strides) and not self._empty:
            x_end = x.ptr + self._span(x.strides)
            y_end = y.ptr + self._span(y.strides)
            if x.ptr < y_end and y.ptr < x_end:
                fail(name, InvalidProblem, self._out_name,
                     f"overlaps {self._in_name} without being the same view (in place needs "
                     "the same pointer and strides)")
        pos = None
        if positions is not None:
            pos = as_ref(positions, name, "positions")
            if pos.typestr not in ("<i4", "<i8"):
                fail(name, InvalidProblem, "positions",
                     f"has dtype {pos.typestr}; it must be int32 or int64")
            if pos.shape != (shape[2],) and pos.shape != (shape[0], shape[2]):
                fail(name, InvalidProblem, "positions",
                     f"has shape {pos.shape}; it must be [S] = ({shape[2]},) or [B, S] = "
                     f"({shape[0]}, {shape[2]})")
        return x, y, pos

    def retune(self) -> None:
        """Forget cached launch configurations (after changing the tuning attributes)."""
        self._launches.clear()
        self._memo.clear()
        self._memo_in_place.clear()
        if self.qk_path is not None:
            self.qk_path.clear()

    def _span(self, strides: tuple[int, ...]) -> int:
        """Bytes from the first to one past the last element of a view with ``strides``."""
        span = self._spans.get(strides)
        if span is None:
            span = flat_span(self._shape, strides) * self._itemsize
            if len(self._spans) > 64:
                self._spans.clear()
            self._spans[strides] = span
        return span

    def run(self, args: Any, stream: Any = None, workspace: Any = None) -> None:
        """Rotate on ``stream`` (no host synchronisation).

        Fast path for torch tensors and CuPy arrays: the checks of ``can_implement``
        depend only on the arrays' layout key
        (:func:`~baracuda_numba.arrays.layout_signature`) and on whether y is x (in place),
        so a layout seen before skips them (``LayoutMemo``); the test that a distinct y
        does not overlap x runs per call. In place through two views of one address
        takes the checked path every time.
        """
        if self._general or _has_extras(args):
            if self.qk_path is None or not self.qk_path.run(args, stream):
                self._run_general(args, stream)
            return
        source, dest, positions = self._unpack_args(args)
        in_place = source is dest
        memo = self._memo_in_place if in_place else self._memo
        memo_key = memo.launch(stream, self.force_pairs, source, dest, positions)
        if memo_key is LAUNCHED:
            return
        x, y, pos = self.can_implement(args)
        if pos is not None and pos.typestr == "<i4":
            self._run_general(args, stream)
            return
        handle = stream_handle(stream)
        if self._empty:
            return
        x_ptr, y_ptr = x.ptr, y.ptr
        if pos is None:
            key = (x.strides, y.strides, (x_ptr | y_ptr) & 15, x_ptr == y_ptr, None)
        else:
            key = (x.strides, y.strides, (x_ptr | y_ptr) & 15, x_ptr == y_ptr, pos.strides,
                   len(pos.shape))
        launch = self._launches.get(key)
        cacheable = True
        if launch is None:
            launch, cacheable = self._configure(x, y, pos, handle)
            launch = getattr(launch, "fast", launch)  # a BoundLaunch: its generated launcher
            if len(self._launches) > 64:
                self._launches.clear()
            if cacheable:
                self._launches[key] = launch
        if cacheable and in_place == (x_ptr == y_ptr):  # (one address in two views: not
            # memoised; nor a launch chosen while the table could not be built)
            memo.store(memo_key, _nothing if launch is None else launch,
                       (self._span(x.strides), self._span(y.strides), 0))
        if launch is not None:  # None: in place with nothing to rotate
            launch(handle, x_ptr, y_ptr, 0 if pos is None else pos.ptr)

    def _units16_width(self, x: TensorRef, y: TensorMut) -> int:
        """Elements per 16-byte unit if the arrays allow 16-byte units (aligned pointers,
        outer strides, rotary dim, its halves and the copied tail in whole units), else 0."""
        if self.force_pairs or not self._table_kernels:
            return 0
        rotary, dim = self._rotary, self._shape[3]
        width = 16 // self._itemsize
        outer = 0
        for stride in x.strides[:3] + y.strides[:3]:
            outer |= stride
        if ((x.ptr | y.ptr) % 16 == 0 and outer % width == 0 and (dim - rotary) % width == 0
                and rotary % (2 * width if self._half_split else width) == 0):
            return width
        return 0

    def _layout(self, x: TensorRef, y: TensorMut, units16_ok: bool = True) -> tuple[str, int]:
        """The widest ``ROPE_KERNELS`` layout the arrays allow: (layout name, elements per
        memory unit); ``rope_units`` only where ``units16_ok``."""
        kernels = self._kernels
        rotary, dim = self._rotary, self._shape[3]
        half = self._half_split
        pointers = x.ptr | y.ptr
        outer = 0
        for stride in x.strides[:3] + y.strides[:3]:
            outer |= stride
        if not self.force_pairs:
            units16 = self.units16
            if units16 is None:
                units16 = (self.descriptor.element is ElementKind.F32
                           or (not half
                               and math.prod(self._shape) <= _UNITS16_MAX_HALF_ELEMENTS))
            width = self._units16_width(x, y)
            if units16 and width and units16_ok:
                return ("half_split_16B" if half else "interleaved_16B"), width
            for width in (4, 2):
                layout = ("half_split" if half else "interleaved") + ("4" if width == 4 else "")
                if (layout in kernels and pointers % (width * self._itemsize) == 0
                        and outer % width == 0 and (dim - rotary) % width == 0
                        and rotary % (2 * width if half else width) == 0):
                    return layout, width
        return "pairs", 1

    @property
    def built_angle_table(self) -> Any:
        """The plan's (cos, sin) table on the device (f32, ``2 * seq_len * rotary_dim / 2``
        values, (cos, sin) per (s, pair)) once a run has built it, else None."""
        return self._table

    def choice(self, x: TensorRef, y: TensorMut, positions: Any = None) -> RopeChoice:
        """The kernel a call with these array views (``arrays.as_ref`` / ``as_mut`` of x
        and y; ``positions`` given or None) takes, from their layout and the plan's tuning
        attributes: a pure function, nothing is launched."""
        path = self._kernel_path(x, y, positions)
        layout, width = self._layout(x, y)
        heads = (self._tile_heads_per_block(self._unit_items(x, y)[3]) if path == "tile"
                 else None)
        return RopeChoice(path, layout, width, self._flat_fits(x, y), heads)

    def _kernel_path(self, x: TensorRef, y: TensorMut, pos: TensorRef | None) -> str:
        """Which kernel family a call takes: ``"table"``, ``"tile"`` or ``"rows"`` (the
        ``ROPE_KERNELS`` layout of :meth:`_layout`)."""
        width = self._units16_width(x, y)
        if not width or self._rotary == 0:
            return "rows"
        if pos is None:
            table = self.angle_table
            if table is None:
                table = (self.descriptor.element in _TABLE_ELEMENTS
                         and self._table_bytes <= self._table_limit)
            if table:
                return "table"
        tile = self.tile
        if tile is None:
            batch, heads, seq, dim = self._shape
            tile = batch * heads * seq * (dim // width) < _TILE_MAX_UNITS
        if (tile and self._rotary // 2 <= TILE_MAX_PAIRS
                and self._items16(width, False) <= 1024 and self._tile_fits(x, y)):
            return "tile"
        return "rows"

    def _tile_fits(self, x: TensorRef, y: TensorMut) -> bool:
        """Whether ``rope_tile``'s one-tile-per-block grid covers the problem and its 32-bit
        unit offsets reach every element of x and y."""
        batch, heads, seq, dim = self._shape
        width, _, _, items, _ = self._unit_items(x, y)
        return (seq <= self.grid_x_limit and batch <= self.grid_yz_limit
                and -(-heads // self._tile_heads_per_block(items)) <= self.grid_yz_limit
                and max(flat_span(x.shape, x.strides), flat_span(y.shape, y.strides))
                < width << 31)

    def _tile_heads_per_block(self, items: int) -> int:
        """Heads per ``rope_tile`` block of ``items`` threads a row (at most 1024 in all)."""
        per_block = self.tile_heads_per_block or max(1, _TILE_THREADS // items)
        return max(1, min(per_block, self._shape[1], 1024 // items))

    def _items16(self, width: int, in_place: bool) -> int:
        """16-byte items of a row: rotated ones (a unit from each half for half-split),
        then the copied tail's units unless in place."""
        rotary, dim = self._rotary, self._shape[3]
        rot_items = rotary // (2 * width) if self._half_split else rotary // width
        return rot_items if in_place else rot_items + (dim - rotary) // width

    def _configure(self, x: TensorRef, y: TensorMut, pos: TensorRef | None,
                   stream: int) -> tuple[Any, bool]:
        """(The bound launch for one layout of the arrays, or None when there is nothing
        to do; whether it may be cached). A call that wants the angle table while
        ``stream`` is being captured (the table cannot be allocated and built then) takes
        another kernel and is not cached."""
        path = self._kernel_path(x, y, pos)
        if path == "table":
            table = self._angle_table(stream)
            if table:
                return self._configure_table(x, y, table), True
            return self._configure_rows(x, y, pos), False
        if path == "tile":
            return self._configure_tile(x, y, pos), True
        return self._configure_rows(x, y, pos), True

    def _angle_table(self, stream: int) -> int:
        """Device pointer of the plan's (cos, sin) table, built on ``stream`` at the first
        call (and waited for, so runs on other streams may read it); 0 while ``stream`` is
        being captured into a graph and the table does not exist yet."""
        if self._table is not None:
            return self._table_ptr
        if stream_capturing(stream):
            return 0
        with self._table_lock:
            if self._table is None:
                batch, heads, seq, dim = self._shape
                half = self._rotary // 2
                table = cuda.device_array(2 * seq * half, dtype=np.float32)
                pointer = as_ref(table, self.name, "angle table").ptr
                blocks = min(-(-(seq * half) // _TABLE_BLOCK), 65535)
                ROPE_ANGLES_KERNEL.launch(blocks, _TABLE_BLOCK, stream,
                                          ((pointer, 2 * seq * half),
                                           (seq, half, self._rotary), self._freq_exponent))
                stream_synchronize(stream)
                self._table_ptr = pointer
                self._table = table
        return self._table_ptr

    def _configure_rows(self, x: TensorRef, y: TensorMut, pos: TensorRef | None) -> Any:
        """The bound launch of a ``ROPE_KERNELS`` kernel (kernel, launch shape and every
        argument but the pointers) for one layout of the arrays (cached per strides /
        alignment / in-place / positions layout); None when there is nothing to do. The
        returned launch takes ``(stream, x, y, positions)``."""
        layout, width = self._layout(x, y)
        kernel = self._kernels[layout]
        if layout.endswith("_16B"):
            return self._configure_units16(kernel, x, y, pos)
        pos_extent, pos_b, pos_s, has_pos = _positions_args(pos)
        sources = _plain_sources()
        bound = self._bind_rows(x, y, self._shape, layout, width,
                                (2 * pos_extent, pos_b, pos_s, has_pos), sources, ())
        if bound is None:
            return None
        launch = bound.taking(("a0", "a1", "a2") + ("0",) * 7, 3)
        if launch is None:  # the dispatcher path (simulator)
            def launch(stream: int, x_ptr: int, y_ptr: int, pos_ptr: int) -> None:
                bound(stream, x_ptr, y_ptr, pos_ptr, *(0,) * 7)
        return launch

    def _bind_rows(self, x: TensorRef, y: TensorMut, shape: tuple[int, int, int, int],
                   layout: str, width: int, pos_args: tuple[int, int, int, int],
                   sources: tuple[int, ...], extents: tuple[int, ...],
                   y_span: int | None = None,
                   k: tuple[Any, Any, int, int | None] | None = None) -> Any:
        """``rope_rows`` of ``layout`` bound for x, y of logical ``shape`` [B, H, S, D];
        ``pos_args`` = (positions extent in 32-bit words, batch stride, sequence stride,
        present); ``sources`` the ``ROPE_SOURCES`` tuple with ``y_dest`` in elements;
        ``extents`` those of (cu_seqlens words, inv_freq, cos halves, sin halves, dest
        words); ``k``: (x_k, y_k, heads, y_k's span or None) rotated in the same launch.
        It takes ``(stream, x,
        y, positions, cu_seqlens, inv_freq, cos, sin, dest, x_k, y_k)``; None when in place
        with nothing to rotate."""
        batch, heads, seq, dim = shape
        rotary = self._rotary
        in_place = x.ptr == y.ptr and x.strides == y.strides
        if k is not None:
            in_place = in_place and k[0].ptr == k[1].ptr and k[0].strides == k[1].strides
        kernel = self._kernels[layout]
        if width == 1:
            items, rot_items, copy_offset = dim // 2, rotary // 2, rotary
            pair_step, partner = (1, rotary // 2) if self._half_split else (2, 1)
        elif self._half_split:  # an item: a unit from each half
            rot_items = partner = rotary // (2 * width)
            items = rot_items + (dim - rotary) // width
            copy_offset, pair_step = rotary // width, 1
        else:  # an item: one unit of width / 2 pairs
            items, rot_items, copy_offset = dim // width, rotary // width, rotary // width
            pair_step, partner = 1, 0
        if in_place:
            items = rot_items  # the copied features are already there
            if items == 0:
                return None
        rows = batch * seq
        hpt = self.heads_per_thread
        k_heads = 0 if k is None else k[2]
        work = items * (-(-heads // hpt) - (-k_heads // hpt))
        block_x = min(_BLOCK, max(32, 1 << (items - 1).bit_length()))
        block_y = max(1, min(_BLOCK // block_x, rows))
        grid = (min(-(-work // block_x), 65535),
                min(-(-rows // block_y), self.row_blocks, 65535))
        pos_words, pos_b, pos_s, has_pos = pos_args
        x_extent = -(-flat_span(x.shape, x.strides) // width)
        y_extent = -(-(y_span or flat_span(y.shape, y.strides)) // width)
        xs = tuple(stride // width for stride in x.strides[:3])
        ys = tuple(stride // width for stride in y.strides[:3])
        params = ((rows, seq, heads, hpt, items, rot_items, pair_step, partner,
                   copy_offset) + xs + ys + (pos_b, pos_s, has_pos, rotary, self._inverse,
                                             half_flag(self.descriptor.element),
                                             int(self._half_split)))
        k_extents, k_strides = (0, 0), (0,) * 6
        if k is not None:
            k_extents = (-(-flat_span(k[0].shape, k[0].strides) // width),
                         -(-(k[3] or flat_span(k[1].shape, k[1].strides)) // width))
            k_strides = tuple(stride // width for a in k[:2] for stride in a.strides[:3])
        sources = (sources[:14] + (sources[14] // width,) + sources[15:17] + (k_heads,)
                   + k_strides)
        cu_words, inv_extent, cos_halves, sin_halves, dest_words = extents or (0,) * 5
        return kernel.bind(grid, (block_x, block_y),
                           ((0, x_extent), (0, y_extent), (0, pos_words), (0, cu_words),
                            (0, inv_extent), (0, cos_halves), (0, sin_halves),
                            (0, dest_words), (0, k_extents[0]), (0, k_extents[1]), params,
                            sources, self._freq_exponent))

    def _configure_units16(self, kernel: Any, x: TensorRef, y: TensorMut,
                           pos: TensorRef | None) -> Any:
        """Bound launch of ``rope_units``: threads along (row, item) in memory order, head
        groups along grid.y."""
        batch, heads, seq, dim = self._shape
        rotary = self._rotary
        width, _, rot_items, items, partner = self._unit_items(x, y)
        copy_offset = rotary // width
        if items == 0:
            return None  # in place with nothing to rotate
        threads_per_head = self._rows * items
        hpt = self.unit_heads_per_thread or _unit_heads_per_thread(threads_per_head, heads)
        grid = (min(-(-threads_per_head // _BLOCK), (1 << 31) - 1),
                min(-(-heads // hpt), 65535))
        pos_extent, pos_b, pos_s, has_pos = _positions_args(pos)
        x_words, y_words, xs, ys = _unit_views(x, y, width)
        params = ((self._rows, seq, heads, hpt, -(-heads // hpt), items, rot_items, partner,
                   copy_offset)
                  + xs + ys + (pos_b, pos_s, has_pos, rotary, self._inverse,
                               half_flag(self.descriptor.element)))
        return kernel.bind(grid, _BLOCK, ((0, x_words), (0, y_words), (0, pos_extent), params,
                                          self._freq_exponent))

    def _unit_items(self, x: TensorRef, y: TensorMut) -> tuple[int, str, int, int, int]:
        """For the 16-byte unit kernels: (elements a unit, layout, rotated items a row,
        items a row, partner offset in units); in place skips the copied tail."""
        width = self._units16_width(x, y)
        in_place = x.ptr == y.ptr and x.strides == y.strides
        rot_items = self._items16(width, True)
        if self._half_split:
            return width, "half_split_16B", rot_items, self._items16(width, in_place), rot_items
        return width, "interleaved_16B", rot_items, self._items16(width, in_place), 0

    def _flat_fits(self, x: TensorRef, y: TensorMut) -> bool:
        """Whether ``rope_flat`` takes this table call: interleaved, x and y both compact
        (their units in the order of the whole tensor's), fewer than 2^32 units (32-bit
        unit indices; its threads are at most its units) and a grid that covers them."""
        if self._flat_kernel is None or self.table_flat is False:
            return False
        compact = contiguous_strides(self._shape)
        units = math.prod(self._shape) * self._itemsize // 16
        threads = self._flat_threads(self._flat_planes())
        return (x.strides == compact and y.strides == compact and units < 1 << 32
                and -(-threads // FLAT_BLOCK[self._itemsize]) <= self.grid_x_limit)

    def _flat_planes(self) -> int:
        """(b, h) planes per ``rope_flat`` thread."""
        return self.flat_planes_per_thread or FLAT_PLANES_PER_THREAD[self.descriptor.element]

    def _flat_threads(self, per_thread: int) -> int:
        """Threads of a ``rope_flat`` launch: one per 16-byte unit of ``per_thread`` planes
        (a last, partial group of planes counts whole)."""
        batch, heads, seq, dim = self._shape
        plane_units = seq * dim * self._itemsize // 16
        return -(-(batch * heads) // per_thread) * plane_units

    def _configure_table(self, x: TensorRef, y: TensorMut, table: int) -> Any:
        """Launch of ``rope_table``: one 16-byte item per thread along each (b, h) plane's
        (s, item), planes along grid.y; the table's pointer is fixed in the launch, which
        takes ``(stream, x, y, positions)`` like the others. Compact interleaved x and y
        take ``rope_flat`` instead (:meth:`_flat_fits`): a unit of each of
        ``_flat_planes()`` planes per thread."""
        batch, heads, seq, dim = self._shape
        width, layout, rot_items, items, partner = self._unit_items(x, y)
        x_words, y_words, xs, ys = _unit_views(x, y, width)
        if self._flat_fits(x, y):
            per_thread = self._flat_planes()
            threads = self._flat_threads(per_thread)
            row_items = dim // width
            params = (threads, row_items, _log2_or_minus1(row_items), rot_items, seq,
                      self._rotary // 2, int(x.ptr == y.ptr), self._inverse,
                      _log2_or_minus1(seq * row_items), batch * heads,
                      half_flag(self.descriptor.element))
            block = FLAT_BLOCK[self._itemsize]
            kernel, grid = self._flat_kernel, -(-threads // block)
            if per_thread != FLAT_PLANES_PER_THREAD[self.descriptor.element]:
                kernel = _flat_variant(self.descriptor.element, per_thread)
        else:
            plane_units = seq * items
            per_thread = TABLE_PLANES_PER_THREAD[layout] \
                if self.table_planes_per_thread is None else self.table_planes_per_thread
            grid = (min(-(-plane_units // _TABLE_BLOCK), self.grid_x_limit),
                    min(-(-(batch * heads) // per_thread), self.grid_yz_limit))
            params = ((plane_units, items, rot_items, partner, self._rotary // width, heads,
                       batch * heads) + xs + ys
                      + (self._rotary // 2, self._inverse, half_flag(self.descriptor.element)))
            kernel, block = self._table_kernels[layout], _TABLE_BLOCK
            if per_thread != TABLE_PLANES_PER_THREAD[layout]:  # a benchmark's variant
                kernel = _table_variant(self.descriptor.element, layout, per_thread)
        bound = kernel.bind(grid, block, ((0, x_words), (0, y_words),
                                          (0, self._table_bytes // 4), params))
        launch = bound.taking(("a0", "a1", str(table)), 3)
        if launch is None:  # the dispatcher path (simulator)
            def launch(stream: int, x_ptr: int, y_ptr: int, _positions: int) -> None:
                bound(stream, x_ptr, y_ptr, table)
        return launch

    def _configure_tile(self, x: TensorRef, y: TensorMut, pos: TensorRef | None) -> Any:
        """Launch of ``rope_tile``: a block = (the row's items, heads_per_block heads),
        grid = (s, b, head groups), one tile per block (``_tile_fits``)."""
        batch, heads, seq, dim = self._shape
        width, layout, rot_items, items, partner = self._unit_items(x, y)
        per_block = self._tile_heads_per_block(items)
        pos_extent, pos_b, pos_s, has_pos = _positions_args(pos)
        x_words, y_words, xs, ys = _unit_views(x, y, width)
        params = ((heads, per_block, rot_items, partner, self._rotary // width) + xs + ys
                  + (pos_b, pos_s, has_pos, self._rotary, self._inverse,
                     int(self._half_split), half_flag(self.descriptor.element)))
        return self._tile_kernels[layout].bind(
            (seq, batch, -(-heads // per_block)), (items, per_block),
            ((0, x_words), (0, y_words), (0, pos_extent), params, self._freq_exponent))


def _unit_views(x: TensorRef, y: TensorMut, width: int) -> tuple[int, int, tuple[int, ...],
                                                               tuple[int, ...]]:
    """What the 16-byte unit kernels take of x and y (``width`` elements a unit): their
    extents in 32-bit words and their outer strides (b, h, s) in units."""
    return (4 * -(-flat_span(x.shape, x.strides) // width),
            4 * -(-flat_span(y.shape, y.strides) // width),
            tuple(stride // width for stride in x.strides[:3]),
            tuple(stride // width for stride in y.strides[:3]))


def _log2_or_minus1(n: int) -> int:
    """log2 of ``n`` where it is a power of two, else -1 (the kernels' shift-or-divide)."""
    return n.bit_length() - 1 if n & (n - 1) == 0 else -1


@functools.cache
def _flat_variant(element: ElementKind, per_thread: int) -> Any:
    """An unregistered ``rope_flat`` kernel with another number of planes per thread."""
    return build_rope_flat_kernel(element, per_thread, register=False).prepare()


@functools.cache
def _table_variant(element: ElementKind, layout: str, per_thread: int) -> Any:
    """An unregistered ``rope_table`` kernel with another number of planes per thread."""
    return build_rope_table_kernel(element, layout, per_thread, register=False).prepare()


class RopePlan(_RopeBase):
    """Forward rotation; see the module docstring."""

    name = "RopePlan"

    @staticmethod
    def _unpack_args(args: RopeArgs) -> tuple[Any, Any, Any]:
        return args.x, args.y, args.positions

    @classmethod
    def select(cls, desc: RopeDescriptor, pref: PlanPreference | None = None) -> RopePlan:
        if not isinstance(desc, RopeDescriptor):
            fail(cls.name, InvalidProblem, "desc", f"is a {type(desc).__name__}, not a "
                 "RopeDescriptor")
        cls._check(desc)
        return cls(desc, pref)


class RopeBackwardPlan(_RopeBase):
    """Backward (rotation by −θ); no saved tensors. ``forward``, if given, must describe the
    same problem."""

    name = "RopeBackwardPlan"
    _inverse = 1
    _in_name = "dy"
    _out_name = "dx"

    @staticmethod
    def _unpack_args(args: RopeBackwardArgs) -> tuple[Any, Any, Any]:
        return args.dy, args.dx, args.positions

    @classmethod
    def select(cls, desc: RopeBackwardDescriptor, pref: PlanPreference | None = None, *,
               forward: RopeDescriptor | None = None) -> RopeBackwardPlan:
        if not isinstance(desc, RopeBackwardDescriptor):
            fail(cls.name, InvalidProblem, "desc", f"is a {type(desc).__name__}, not a "
                 "RopeBackwardDescriptor")
        cls._check(desc)
        if forward is not None:
            for f in fields(RopeDescriptor):
                mine, theirs = getattr(desc, f.name), getattr(forward, f.name)
                if mine != theirs:
                    fail(cls.name, InvalidProblem, f"desc.{f.name}",
                         f"= {mine!r} must match the forward descriptor's {theirs!r}")
        return cls(desc, pref)
