"""The q+k path of ``RopePlan`` / ``RopeBackwardPlan`` (``kernels/rope_qk.py``).

A run with ``num_kv_heads`` > 0 and cos/sin tables (``COS_SIN_GATHERED`` or
``COS_SIN_CACHE``) takes ``rope_qk`` where the arrays allow 16-byte units
(:func:`qk_fits`): f16/bf16/f32, ``rotary_dim = head_dim`` in whole units (half-split:
each half), tables of the tensors' dtype with unit-stride columns (interleaved: width
``head_dim``, the ``repeat_interleave`` form), every pointer 16-byte aligned, every outer
stride a whole number of units and non-negative, every span below 2^31 units, no
``cu_seqlens`` and no ``inv_freq``. Anything else runs the general ``rope_rows`` launch,
which gives the same bits.

Host path: the checks of the general path depend only on the arrays' layout keys (shape,
strides, dtype, pointer mod 16) and on whether each output is its input, so a
:class:`~baracuda_numba.plans.base.LayoutMemo` over (x, y, k, k_out, cos, sin,
positions) replays the launch chosen for a layout (either kernel) without them; the
disjointness of (x, y) and (k, k_out) is re-tested per call. ``BARACUDA_DEBUG`` runs
every call through the checks (they read device values).
"""

from __future__ import annotations

from operator import attrgetter
from typing import Any

from ..arrays import flat_span
from ..debug import debug_enabled
from ..kernels.common import half_flag
from ..kernels.rope.qk import QK_HEAD_BATCH, ROPE_QK_KERNELS
from ..streams import stream_handle
from ..types import ElementKind, RopeAngleSource
from .base import LAUNCHED, LayoutMemo
from .rope_sources import _TABLE_TYPESTRS

#: Threads a ``rope_qk`` block (80 registers a thread for half-split: 6 blocks an SM).
_QK_BLOCK = 128
#: Heads per thread are halved (from ``QK_HEAD_BATCH``, down to 1) while a launch would
#: have fewer threads than this (decode: more, shorter threads instead of a few long ones).
_QK_MIN_THREADS = 1 << 16
_QK_ELEMENTS = (ElementKind.F16, ElementKind.BF16, ElementKind.F32)
_QK_ANGLES = (RopeAngleSource.COS_SIN_GATHERED, RopeAngleSource.COS_SIN_CACHE)


def qk_eligible(desc: Any) -> bool:
    """Whether the descriptor can ever take ``rope_qk`` (the rest depends on the arrays)."""
    rotary = desc.head_dim if desc.rotary_dim is None else desc.rotary_dim
    return (desc.num_kv_heads > 0 and desc.angles in _QK_ANGLES
            and desc.element in _QK_ELEMENTS and rotary == desc.head_dim)


def qk_heads_per_thread(rows: int, groups_of: Any, items: int) -> int:
    """``QK_HEAD_BATCH`` heads per thread, halved (down to 1) while the launch would have
    fewer than ``_QK_MIN_THREADS`` threads; ``groups_of(per_thread)`` counts head groups."""
    per_thread = QK_HEAD_BATCH
    while per_thread > 1 and rows * groups_of(per_thread) * items < _QK_MIN_THREADS:
        per_thread //= 2
    return per_thread


def qk_fits(half: bool, itemsize: int, tensors: list, cos: Any, sin: Any,
            table: tuple[int, ...]) -> bool:
    """Whether ``rope_qk`` takes these views: ``tensors`` = [(x, y, shape), (k, k_out,
    shape)] as [B, H, S, D]; ``table`` = (kind, batch, sequence, position, column) strides
    of the cos/sin views (``ROPE_SOURCES``' ``cs_*``)."""
    width = 16 // itemsize
    dim = tensors[0][2][3]
    if dim % (2 * width if half else width) or _TABLE_TYPESTRS.get(cos.typestr) is None:
        return False
    if _TABLE_TYPESTRS[cos.typestr].byte_width != itemsize or cos.itemsize != itemsize:
        return False
    kind, cs_b, cs_s, cs_pos, column = table[:5]
    if cos.strides[-1] != 1 or column != (1 if half else 2):
        return False
    views = [v for x, y, _ in tensors for v in (x, y)]
    pointers = 0
    for view in (*views, cos, sin):
        pointers |= view.ptr
        if flat_span(view.shape, view.strides) >= width << 31:
            return False
    strides = [st for view in views for st in view.strides[:3]] + [cs_b, cs_s, cs_pos]
    return pointers % 16 == 0 and all(st >= 0 and st % width == 0 for st in strides)


class QkPath:
    """The q+k runs of one plan: the memoised launch per layout, ``rope_qk`` where it
    fits, else the plan's general launch."""

    def __init__(self, plan: Any) -> None:
        self._plan = plan
        element = plan.descriptor.element
        self._kernels = {pairing: ROPE_QK_KERNELS[kind, pairing]
                         for kind, pairing in ROPE_QK_KERNELS if kind is element}
        for kernel in self._kernels.values():
            kernel.prepare()
        # (x, y, k, k_out, cos, sin, positions) layout key -> launch
        self._memo = LayoutMemo(7, ((0, 1), (2, 3)))
        self._memo_in_place = LayoutMemo(7)
        #: the kernel of the last configured layout: "rope_qk" or "rope_rows" (tests)
        self.last_kernel: str | None = None
        self._fields: Any = None  # the args' fields in slot order (one C call per run)
        self._args_type: Any = None

    def clear(self) -> None:
        self._memo.clear()
        self._memo_in_place.clear()

    def run(self, args: Any, stream: Any) -> bool:
        """Launch q and k for ``args``; False (nothing done) where the general path must
        run the call (``inv_freq`` or ``cu_seqlens`` given)."""
        plan = self._plan
        fields = self._fields
        if fields is None or type(args) is not self._args_type:
            self._args_type = type(args)
            fields = self._fields = attrgetter(*type(args).__slots__)
        x, y, positions, k, k_out, inv_freq, cos, sin, cu_seqlens = fields(args)
        if inv_freq is not None or cu_seqlens is not None:
            return False
        in_place = x is y and k is k_out
        memo = self._memo_in_place if in_place else self._memo
        key = memo.launch(stream, None, x, y, k, k_out, cos, sin, positions)
        if key is LAUNCHED:
            return True
        tensors, arrays, sources = plan._general_views(args)  # every check
        (xv, yv, shape), (kv, kov, k_shape) = tensors
        pos, _, _, cos_v, sin_v, _ = arrays
        launch = self._configure(tensors, arrays, sources)
        if key is not None and not debug_enabled() and (
                in_place or (xv.ptr != yv.ptr and kv.ptr != kov.ptr)):
            spans = tuple(flat_span(v.shape, v.strides) * v.itemsize
                          for v in (xv, yv, kv, kov)) + (0, 0, 0)
            memo.store(key, launch, spans)
        launch(stream_handle(stream), xv.ptr, yv.ptr, kv.ptr, kov.ptr, cos_v.ptr, sin_v.ptr,
               0 if pos is None else pos.ptr)
        return True

    def _configure(self, tensors: list, arrays: tuple, sources: tuple[int, ...]) -> Any:
        """``launch(stream, x, y, k, k_out, cos, sin, positions)`` for these views."""
        plan = self._plan
        (xv, yv, shape), (kv, kov, k_shape) = tensors
        pos, _, _, cos_v, sin_v, _ = arrays
        if not shape[0] * shape[2] * shape[3] or not shape[1] + k_shape[1]:
            self.last_kernel = None
            return _nothing
        half = plan._half_split
        table = sources[5:10]
        if plan.qk_kernel is not False and qk_fits(half, plan._itemsize, tensors, cos_v,
                                                    sin_v, table):
            launch = self._bind(tensors, pos, cos_v, sin_v, table, sources[0])
            if launch is not None:
                self.last_kernel = "rope_qk"
                return launch
        self.last_kernel = "rope_rows"
        general = plan._general_launch(xv, yv, shape, arrays, sources,
                                       k=(kv, kov, k_shape[1], None))

        def launch(stream: int, x: int, y: int, k: int, k_out: int, cos: int, sin: int,
                   positions: int) -> None:
            general(stream, x, y, positions, 0, 0, cos, sin, 0, k, k_out)

        return launch

    def _bind(self, tensors: list, pos: Any, cos: Any, sin: Any, table: tuple[int, ...],
              pos_wide: int) -> Any:
        """The bound ``rope_qk`` launch for views that :func:`qk_fits`; None where its
        threads would not fit 32-bit indices."""
        plan = self._plan
        (xv, yv, shape), (kv, kov, k_shape) = tensors
        batch, q_heads, seq, dim = shape
        k_heads = k_shape[1]
        itemsize = plan._itemsize
        width = 16 // itemsize
        half = plan._half_split
        items = dim // (2 * width) if half else dim // width
        rows = batch * seq

        def groups_of(per_thread: int) -> int:
            return -(-q_heads // per_thread) - (-k_heads // per_thread)

        per_thread = plan.qk_heads_per_thread or qk_heads_per_thread(rows, groups_of, items)
        groups = groups_of(per_thread)
        threads = rows * groups * items
        if threads >= 1 << 31:
            return None
        _, cs_b, cs_s, cs_pos, _ = table
        has_positions = int(pos is not None and cs_pos != 0)
        if cs_pos and pos is None:  # a cache without positions: row s
            cs_s += cs_pos
        pos_b = pos_s = pos_words = 0
        if has_positions:
            pos_b, pos_s = pos.strides if len(pos.shape) == 2 else (0, pos.strides[0])
            pos_words = flat_span(pos.shape, pos.strides) * pos.itemsize // 4
        # (b, h, s) strides in units of q, q_out, k, k_out (the views are [B, H, S, D])
        strides = tuple(st // width for view in (xv, yv, kv, kov) for st in view.strides[:3])
        items_log = items.bit_length() - 1 if items & (items - 1) == 0 else -1
        params = ((threads, items, items_log, groups, -(-q_heads // per_thread), per_thread,
                   q_heads, k_heads, seq, dim // (2 * width) if half else 0)
                  + strides + (cs_b // width, cs_s // width, cs_pos // width,
                                     has_positions, pos_wide, pos_b, pos_s, plan._inverse,
                                     int(half), half_flag(plan.descriptor.element)))
        words = [4 * -(-flat_span(v.shape, v.strides) // width)
                 for v in (xv, yv, kv, kov, cos, sin)]
        kernel = self._kernels["half_split" if half else "interleaved"]
        bound = kernel.bind(-(-threads // _QK_BLOCK), _QK_BLOCK,
                            tuple((0, w) for w in words) + ((0, pos_words), params))
        return getattr(bound, "fast", bound)


def _nothing(*_: Any) -> None:
    """The launch of an empty problem."""
