"""``FractionalMaxPool2dPlan`` / ``FractionalMaxPool3dPlan``: fractional max pooling with
saved indices, and a deterministic gather backward.

Forward (``run_fw``): ``y[n,c,o] = max x[n,c, window(o)]`` and ``indices[n,c,o]`` = the
argmax as an i64 linear offset into the whole *logical* input (row-major
``[N, C, (D,) H, W]``, including the ``n``/``c`` offset, whatever the strides of ``x``;
PyTorch stores per-plane offsets instead). Ties go to the first element in row-major
window order; a NaN in the window wins (the first NaN). f16/bf16 compare in f32 (exact),
f32/f64 in their own precision.

Window placement (per ``(n, c)`` and axis, caller-supplied f32 samples ``alpha`` in
``random_samples[n, c, axis]``, axes ``(h, w)`` / ``(d, h, w)``; the plan keeps no RNG
state and ``seed`` is stored but unused):

* ``FractionalPlacement.BARACUDA`` (default, upstream's formula):
  ``start = clamp(floor(o*(in-k)/(out-1) + alpha), 0, in-k)``, ``out == 1``:
  ``clamp(floor(alpha*(in-k)), 0, in-k)``. Evaluated *exactly* (upstream evaluates it in
  f32, which differs by one at rare near-integer positions and beyond 2^24).
* ``FractionalPlacement.TORCH``: ``torch.nn.functional.fractional_max_pool{2,3}d`` on CUDA
  given the same samples (torch orders its 2-D samples ``(w, h)``; ours stay ``(h, w)``):
  ``start = int((o + alpha)*step) - int(alpha*step)``, ``step = (in-k)/(out-1)`` in f32
  (f64 for f64), last output at ``in-k``; clamped into the input.
* Samples outside ``[0, 1)`` are clamped into it (NaN -> 0) before either formula (torch
  would read out of bounds there).

Backward (``run_bw``): ``dx[i] = sum dy[o]`` over outputs whose saved index is ``i``,
computed without atomics: deterministic, bit-stable, f32 accumulation for f16/bf16, summed
in ascending output order. Every element of ``dx`` is written, so the caller need not
zero ``dx`` (upstream requires a zeroed ``dx``). Contiguous f16/bf16/f32 arrays take the
fast path: for BARACUDA placement with at most 32 candidate outputs per input element,
tiles of input rows whose elements collect the outputs that chose them as bits of an
integer mask in shared memory, then only the chosen elements, listed, sum them in
ascending output order, the tile in up to ``plan.listed_bytes`` of dynamic shared memory
(``plan.tiled_backward``, the default); otherwise the plan zeroes ``dx`` on the stream
and the first output of each group that saved ``i`` writes the sum (leader scatter).
Other layouts, and f64, run a gather per input element. All give bit-identical results.
Each input element looks only at the outputs whose window can contain it for any sample
in ``[0, 1)`` (a closed-form range per axis: the backward needs no samples), so indices
are validated for free: an index that does not point into its own output's window (the
forward never writes one) is ignored, not scattered.

Performance: row-major contiguous f16/bf16/f32 arrays below 2^31 elements take fast
kernels (32-bit offsets, magic-number division, row maxima cached across a thread's rows
for 3x3 / 3x3x3 windows, tiled or leader-scatter backward); other layouts and f64 run the
general 64-bit kernels (2-3x slower; identical results). f16 and bf16 share each kernel
(a runtime flag). Figures per case: docs/design/fractional_max_pool.md.

Arrays: any strides (non-negative) for ``x``, ``y``, ``indices``, ``dy``, ``dx`` and
``random_samples``; outputs must not overlap any other argument.

Rejected before any launch: element not in {F16, BF16, F32, F64} (``Unsupported``);
spatial extents or windows < 1, window larger than the input, negative batch/channels
(``InvalidProblem``); extents >= 2^31 (``Unsupported``); wrong shapes, dtypes (indices
must be int64, samples f32), overlapping outputs (``InvalidProblem``). ``batch == 0`` or
``channels == 0`` is an empty problem: nothing is launched.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._runtime import SIMULATOR
from ..arrays import TensorRef, as_mut, as_ref, flat_span
from ..driver import memset_d8_async
from ..errors import InvalidProblem, Unsupported
from ..kernels.common import half_flag, pad8
from ..kernels.fractional_max_pool import (
    BW_LISTED_MAX_DYNAMIC,
    BW_MASK_BITS,
    BW_TABLE_D,
    BW_TABLE_H,
    BW_TABLE_W,
    CANDIDATE_COUNT_SHIFT,
    FAST_KINDS,
    FAST_WINDOWS,
    FRACTIONAL_MAX_POOL_BW_FAST_KERNELS,
    FRACTIONAL_MAX_POOL_BW_KERNELS,
    FRACTIONAL_MAX_POOL_BW_LISTED_KERNELS,
    FRACTIONAL_MAX_POOL_ELEMENTS,
    FRACTIONAL_MAX_POOL_FW_FAST_KERNELS,
    FRACTIONAL_MAX_POOL_FW_KERNELS,
    FRACTIONAL_MAX_POOL_FW_ROWS_KERNELS,
    PLACEMENT_BARACUDA,
    WINDOWS_BF16,
    kernel_kind,
    magic_divisor,
)
from ..streams import stream_handle
from ..types import (
    ArchSku,
    BackendKind,
    ElementKind,
    KernelSku,
    MathPrecision,
    OpCategory,
    PlanPreference,
    PoolKind,
    PrecisionGuarantee,
)
from .base import LAUNCHED, LayoutMemo, Plan, fail, plan_args

__all__ = [
    "FRACTIONAL_MAX_POOL_ELEMENTS",
    "FractionalMaxPool2dBwArgs",
    "FractionalMaxPool2dDescriptor",
    "FractionalMaxPool2dFwArgs",
    "FractionalMaxPool2dPlan",
    "FractionalMaxPool3dBwArgs",
    "FractionalMaxPool3dDescriptor",
    "FractionalMaxPool3dFwArgs",
    "FractionalMaxPool3dPlan",
    "FractionalPlacement",
]

_MAX_EXTENT = (1 << 31) - 1  # placement arithmetic keeps o * (in - k) below 2^62

# Threads per block: x along the innermost (w) axis, y over rows; each thread walks
# _ROWS_PER_THREAD consecutive rows so that per-plane work (samples, column window) is done
# once per run. 128 x 8: the fastest of the shapes tried (256 x 4/8/16, 512 x 8), for both
# dtypes and ranks. The simulator runs one Python thread per CUDA thread: tiny blocks there.
_THREADS = 16 if SIMULATOR else 128
_ROWS_PER_THREAD = 2 if SIMULATOR else 8
# The row-caching fast forwards reset their cache once per run: 16 rows, the best overall
# of 4 / 8 / 16 / 32 (docs/design/fractional_max_pool.md).
_CACHED_ROWS_PER_THREAD = 2 if SIMULATOR else 16
_MAX_GRID_Y = 65535
_FAST_LIMIT = 1 << 31  # the fast kernels' offsets and magic-division numerators stay below
# Tiled backward: threads per block (one block per dx tile; measured, see the plan's
# defaults), and the longest d/h axis whose tiling the host plans.
_TILE_THREADS = 32 if SIMULATOR else 512
# Forward walk for the FAST_WINDOWS: row maxima cached across a thread's rows with 32-bit
# offsets (docs/design/fractional_max_pool.md); "looped" for the other windows.
_ROW_WALK = "rows32"
# Listed tiled backward (f16/bf16/f32): dynamic shared memory per block for its masks,
# list and staged dy; the plan picks the tile that stages the fewest outputs within it.
# 64 KiB at 512 threads: 3 blocks per SM, enough to hide one block's staging latency behind
# another's sums (bigger tiles stage fewer halo outputs but leave 1-2 blocks per SM and
# lose).
_LISTED_BYTES = 64 * 1024
_TILE_AXIS_LIMIT = 1 << 20
_MAX_GRID_X = (1 << 31) - 1


def candidate_ranges(extent: int, window: int, out: int,
                      placement: int) -> tuple[np.ndarray, np.ndarray]:
    """Host mirror of ``kernels.fractional_max_pool.candidate_outputs`` for every coordinate
    of one axis: ``(first, end)`` arrays (tested equal to the device function)."""
    max_start = extent - window
    last = out - 1
    coords = np.arange(extent, dtype=np.int64)
    if max_start <= 0 or last <= 0:
        return np.zeros(extent, dtype=np.int64), np.full(extent, out, dtype=np.int64)

    def count_base_at_most(value: np.ndarray, count: int) -> np.ndarray:
        return np.where(value < 0, 0,
                        np.minimum(count, ((value + 1) * last + max_start - 1) // max_start))

    if placement == PLACEMENT_BARACUDA:
        return count_base_at_most(coords - window - 1, out), count_base_at_most(coords, out)
    slack = 1 + (max_start >> 20)
    end = count_base_at_most(coords + max_start // last + 1 + slack, out)
    below = coords - window - 1 - slack
    first = np.where(below >= 0, np.maximum(0, count_base_at_most(below, out + 1) - 1), 0)
    return first, end


def staged_outputs(ranges: tuple[np.ndarray, np.ndarray], tile: int) -> tuple[int, int]:
    """(sum, max) over the tiles of length ``tile`` of one axis of the number of outputs
    whose window may meet the tile (the candidate ranges are monotone in the coordinate)."""
    first, end = ranges
    starts = np.arange(0, first.size, tile)
    counts = end[np.minimum(starts + tile, first.size) - 1] - first[starts]
    return int(counts.sum()), int(counts.max())


def _choose_tiles(d_in: int, h_in: int, w_in: int, w_out: int,
                  ranges_d: tuple[np.ndarray, np.ndarray],
                  ranges_h: tuple[np.ndarray, np.ndarray], tile_cap: int,
                  stage_cap: int, max_depths: int = 64,
                  max_rows: int | None = None,
                  shared: tuple[int, int, int] | None = None) -> tuple[int, int] | None:
    """(tile_d, tile_h) of the tiled backward (tiles of whole rows: tile_d * tile_h * w_in
    <= tile_cap, tile_d <= max_depths, tile_h <= max_rows, at most stage_cap staged
    outputs per tile and, given ``shared = (bytes per tile element, bytes per staged
    output, budget)``, within that many bytes) that stages the fewest outputs in all (each
    output is staged by every tile its window may meet), then the fewest tiles; None if no
    tile fits."""
    tile_rows = tile_cap // w_in
    best = None
    for tile_d in range(1, min(d_in, tile_rows, max_depths) + 1):
        sum_d, max_d = staged_outputs(ranges_d, tile_d)
        tile_h = min(h_in, tile_rows // tile_d, max_rows or h_in)
        while tile_h >= 1:
            sum_h, max_h = staged_outputs(ranges_h, tile_h)
            staged = max_d * max_h * w_out
            if staged <= stage_cap and (shared is None or tile_d * tile_h * w_in * shared[0]
                                        + staged * shared[1] <= shared[2]):
                break
            tile_h = tile_h - 1 if tile_h < 64 else tile_h * 7 // 8
        if tile_h < 1:
            continue
        if shared is not None:  # the same tile count with the smallest tiles: less
            # shared memory per block, more blocks per SM (if they still fit)
            even_d, even_h = -(-d_in // -(-d_in // tile_d)), -(-h_in // -(-h_in // tile_h))
            even_sum_d, even_max_d = staged_outputs(ranges_d, even_d)
            even_sum_h, even_max_h = staged_outputs(ranges_h, even_h)
            staged = even_max_d * even_max_h * w_out
            if staged <= stage_cap and (even_d * even_h * w_in * shared[0]
                                        + staged * shared[1] <= shared[2]):
                tile_d, tile_h, sum_d, sum_h = even_d, even_h, even_sum_d, even_sum_h
        tiles = -(-d_in // tile_d) * -(-h_in // tile_h)
        score = (sum_d * sum_h * w_out, tiles)
        if best is None or score < best[0]:
            best = (score, tile_d, tile_h)
    return None if best is None else (best[1], best[2])


def _row_major(view: TensorRef) -> bool:
    """Whether ``view`` is row-major contiguous (size-1 axes may have any stride)."""
    expected = 1
    for extent, stride in zip(reversed(view.shape), reversed(view.strides)):
        if extent != 1 and stride != expected:
            return False
        expected *= extent
    return True


def _fast_layout(*views: TensorRef) -> bool:
    """The fast kernels' precondition on the arrays: row-major, < 2^31 elements each."""
    for view in views:
        count = 1
        for extent in view.shape:
            count *= extent
        if count >= _FAST_LIMIT or not _row_major(view):
            return False
    return True


class FractionalPlacement(enum.Enum):
    """Where the windows go (see the module docstring)."""

    BARACUDA = 0
    TORCH = 1


def _check_extent(plan: str, name: str, value: Any, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        fail(plan, InvalidProblem, name, f"= {value!r} must be an int >= {minimum}")
    if value > _MAX_EXTENT:
        fail(plan, Unsupported, name, f"= {value} must be < 2^31")


@dataclass(frozen=True, slots=True)
class FractionalMaxPool2dDescriptor:
    """x ``[batch, channels, h_in, w_in]`` -> y ``[batch, channels, h_out, w_out]`` with a
    ``window_h x window_w`` window (``1 <= window <= in`` per axis)."""

    batch: int
    channels: int
    h_in: int
    w_in: int
    window_h: int
    window_w: int
    h_out: int
    w_out: int
    element: ElementKind
    seed: int = 0
    placement: FractionalPlacement = FractionalPlacement.BARACUDA

    @classmethod
    def new(cls, batch: int, channels: int, h_in: int, w_in: int, window_h: int,
            window_w: int, h_out: int, w_out: int,
            element: ElementKind) -> FractionalMaxPool2dDescriptor:
        """Upstream's constructor: ``seed = 0``, BARACUDA placement."""
        return cls(batch, channels, h_in, w_in, window_h, window_w, h_out, w_out, element)

    def with_seed(self, seed: int) -> FractionalMaxPool2dDescriptor:
        """A copy with ``seed`` (stored, unused: the caller supplies the samples)."""
        return dataclasses.replace(self, seed=seed)

    def with_placement(self, placement: FractionalPlacement) -> FractionalMaxPool2dDescriptor:
        return dataclasses.replace(self, placement=placement)

    @property
    def input_shape(self) -> tuple[int, ...]:
        return (self.batch, self.channels, self.h_in, self.w_in)

    @property
    def output_shape(self) -> tuple[int, ...]:
        return (self.batch, self.channels, self.h_out, self.w_out)

    def _axes(self) -> tuple[tuple[str, int, int, int], ...]:
        return (("h", self.h_in, self.window_h, self.h_out),
                ("w", self.w_in, self.window_w, self.w_out))


@dataclass(frozen=True, slots=True)
class FractionalMaxPool3dDescriptor:
    """x ``[batch, channels, d_in, h_in, w_in]`` -> y ``[batch, channels, d_out, h_out,
    w_out]`` with a ``window_d x window_h x window_w`` window."""

    batch: int
    channels: int
    d_in: int
    h_in: int
    w_in: int
    window_d: int
    window_h: int
    window_w: int
    d_out: int
    h_out: int
    w_out: int
    element: ElementKind
    seed: int = 0
    placement: FractionalPlacement = FractionalPlacement.BARACUDA

    @classmethod
    def new(cls, batch: int, channels: int, d_in: int, h_in: int, w_in: int, window_d: int,
            window_h: int, window_w: int, d_out: int, h_out: int, w_out: int,
            element: ElementKind) -> FractionalMaxPool3dDescriptor:
        """Upstream's constructor: ``seed = 0``, BARACUDA placement."""
        return cls(batch, channels, d_in, h_in, w_in, window_d, window_h, window_w, d_out,
                   h_out, w_out, element)

    def with_seed(self, seed: int) -> FractionalMaxPool3dDescriptor:
        """A copy with ``seed`` (stored, unused: the caller supplies the samples)."""
        return dataclasses.replace(self, seed=seed)

    def with_placement(self, placement: FractionalPlacement) -> FractionalMaxPool3dDescriptor:
        return dataclasses.replace(self, placement=placement)

    @property
    def input_shape(self) -> tuple[int, ...]:
        return (self.batch, self.channels, self.d_in, self.h_in, self.w_in)

    @property
    def output_shape(self) -> tuple[int, ...]:
        return (self.batch, self.channels, self.d_out, self.h_out, self.w_out)

    def _axes(self) -> tuple[tuple[str, int, int, int], ...]:
        return (("d", self.d_in, self.window_d, self.d_out),
                ("h", self.h_in, self.window_h, self.h_out),
                ("w", self.w_in, self.window_w, self.w_out))


@plan_args
class FractionalMaxPool2dFwArgs:
    """``x`` read; ``y`` and ``indices`` (int64) written; ``random_samples`` f32
    ``[N, C, 2]`` (h, w)."""

    x: Any
    y: Any
    indices: Any
    random_samples: Any


@plan_args
class FractionalMaxPool2dBwArgs:
    """``dy`` and the forward's ``indices`` read; every element of ``dx`` written."""

    dy: Any
    indices: Any
    dx: Any


@plan_args
class FractionalMaxPool3dFwArgs:
    """As the 2-D args, ``random_samples`` f32 ``[N, C, 3]`` (d, h, w)."""

    x: Any
    y: Any
    indices: Any
    random_samples: Any


@plan_args
class FractionalMaxPool3dBwArgs:
    """As the 2-D args."""

    dy: Any
    indices: Any
    dx: Any


def _span_bytes(view: TensorRef) -> tuple[int, int]:
    return view.ptr, view.ptr + flat_span(view.shape, view.strides) * view.itemsize


def _zeroing_first(launch: Callable[[int, int, int, int], None],
                   zero_bytes: int) -> Callable[[int, int, int, int], None]:
    """``launch`` of the leader scatter (see the kernel module): zero ``zero_bytes`` of dx
    first, then each chosen element is written once, by the first output that chose it."""

    def zero_then_launch(handle: int, dy_ptr: int, indices_ptr: int, dx_ptr: int) -> None:
        memset_d8_async(dx_ptr, 0, zero_bytes, handle)
        launch(handle, dy_ptr, indices_ptr, dx_ptr)

    return zero_then_launch


def _spans(*views: TensorRef) -> tuple[int, ...]:
    return tuple(flat_span(v.shape, v.strides) * v.itemsize for v in views)


# Index pairs (in run_fw's (x, y, indices, samples) and run_bw's (dy, indices, dx) order)
# that _check_disjoint requires to be disjoint: every output against every later argument.
_FW_DISJOINT = ((1, 2), (1, 0), (1, 3), (2, 0), (2, 3))
_BW_DISJOINT = ((2, 0), (2, 1))


def _check_disjoint(plan: str, outputs: dict[str, TensorRef], others: dict[str, TensorRef]) -> None:
    """No output's memory range may meet another argument's (a read racing a write)."""
    named = list(outputs.items()) + list(others.items())
    for i, (out_name, out_view) in enumerate(outputs.items()):
        lo, hi = _span_bytes(out_view)
        if lo == hi:
            continue
        for name, view in named[i + 1:]:
            other_lo, other_hi = _span_bytes(view)
            if other_lo < hi and lo < other_hi:
                fail(plan, InvalidProblem, out_name, f"overlaps {name} in memory; outputs "
                     "must not share memory with any other argument")


class _FractionalMaxPoolPlan(Plan):
    """Shared by the 2-D and 3-D plans (2-D runs as 3-D with one depth slice)."""

    name = "FractionalMaxPoolPlan"
    _rank = 2
    _pool_kind = PoolKind.FRACTIONAL_MAX_POOL2D
    #: The tuning attributes that tests and benchmarks may change (see ``__init__``).
    TUNING = frozenset({"fast", "forward_walk", "rows_per_thread", "threads",
                         "tiled_backward", "tile_elems", "tile_threads", "listed_bytes"})

    def __setattr__(self, name: str, value: Any) -> None:
        """Setting a tuning attribute forgets the memoised launches, so the next ``run``
        takes the checked path with the new value (the memo keys hold layouts only)."""
        object.__setattr__(self, name, value)
        if name in self.TUNING:
            self._memo_fw.clear()
            self._memo_bw.clear()

    @classmethod
    def select(cls, desc: Any, pref: PlanPreference | None = None) -> _FractionalMaxPoolPlan:
        cls.check_element(desc.element, FRACTIONAL_MAX_POOL_ELEMENTS)
        for field in ("batch", "channels"):
            _check_extent(cls.name, field, getattr(desc, field), 0)
        for axis, extent, window, out in desc._axes():
            _check_extent(cls.name, f"{axis}_in", extent, 1)
            _check_extent(cls.name, f"window_{axis}", window, 1)
            _check_extent(cls.name, f"{axis}_out", out, 1)
            if window > extent:
                fail(cls.name, InvalidProblem, f"window_{axis}",
                     f"= {window} must be <= {axis}_in = {extent} (the window must fit in "
                     "the input)")
        if not isinstance(desc.placement, FractionalPlacement):
            fail(cls.name, InvalidProblem, "placement",
                 f"= {desc.placement!r} is not a FractionalPlacement")
        if not isinstance(desc.seed, int) or not 0 <= desc.seed < (1 << 64):
            fail(cls.name, InvalidProblem, "seed", f"= {desc.seed!r} must be a u64")
        return cls(desc, pref)

    def __init__(self, desc: Any, pref: PlanPreference | None) -> None:
        element = desc.element
        precision = {ElementKind.F16: MathPrecision.F16, ElementKind.BF16: MathPrecision.BF16,
                     ElementKind.F32: MathPrecision.F32, ElementKind.F64: MathPrecision.F64}
        accumulator = ElementKind.F64 if element is ElementKind.F64 else ElementKind.F32
        # Forward and gather backward are both free of atomics and fixed-order.
        guarantee = PrecisionGuarantee(precision[element], accumulator,
                                       bit_stable_on_same_hardware=True, deterministic=True)
        sku = KernelSku(OpCategory.POOLING, int(self._pool_kind), element, ElementKind.I64,
                        None, None, ArchSku.SM80, BackendKind.BESPOKE, guarantee)
        super().__init__(desc, sku, pref)
        axes = desc._axes()
        if len(axes) == 2:
            axes = (("d", 1, 1, 1),) + axes
        (_, self._d_in, self._kd, self._d_out), (_, self._h_in, self._kh, self._h_out), \
            (_, self._w_in, self._kw, self._w_out) = axes
        self._input_shape = desc.input_shape
        self._output_shape = desc.output_shape
        self._samples_shape = (desc.batch, desc.channels, self._rank)
        self._planes = desc.batch * desc.channels
        self._dims = (desc.batch, desc.channels, self._d_in, self._h_in, self._w_in,
                      self._d_out, self._h_out, self._w_out)
        self._placement = desc.placement.value
        windows = [self._kd, self._kh, self._kw, self._placement, 0, 0, 0, 0]
        windows[WINDOWS_BF16] = half_flag(element)  # the half kernels' runtime flag
        self._windows = tuple(windows)
        self._bound: dict[tuple[Any, ...], Any] = {}  # launches bound per layout
        # layout key -> checked launch (run fast path): (x, y, indices, samples) forward,
        # (dy, indices, dx) backward
        self._memo_fw = LayoutMemo(4, _FW_DISJOINT)
        self._memo_bw = LayoutMemo(3, _BW_DISJOINT)
        # tests/benchmarks may change these two (rows_per_thread None: per kernel default)
        self.rows_per_thread: int | None = None
        self.threads = _THREADS
        kind = kernel_kind(element)  # "HALF" for f16 and bf16
        self._fw_kernel = FRACTIONAL_MAX_POOL_FW_KERNELS[kind]
        self._bw_kernel = FRACTIONAL_MAX_POOL_BW_KERNELS[kind]
        window = (self._kd, self._kh, self._kw)
        # the fast kernels (f16/bf16/f32; f64 runs the general ones, identical results):
        # the forward walks, the leader scatter and the listed tiled backward (f32 sums in
        # the u32 mask slots)
        self._has_fast = kind in FAST_KINDS
        self._fw_fast_kernels: dict[str, Any] = {}
        self._bw_fast_kernel = self._bw_tiled_kernel = None
        if self._has_fast:
            self._fw_fast_kernels["looped"] = FRACTIONAL_MAX_POOL_FW_FAST_KERNELS[kind]
            if window in FAST_WINDOWS:
                self._fw_fast_kernels["rows32"] = FRACTIONAL_MAX_POOL_FW_ROWS_KERNELS[
                    kind, window]
            self._bw_fast_kernel = FRACTIONAL_MAX_POOL_BW_FAST_KERNELS[kind]
            self._bw_tiled_kernel = FRACTIONAL_MAX_POOL_BW_LISTED_KERNELS[kind]
        # Tests and benchmarks may change these (every value is tested): the fast forward's
        # window walk ("rows32": row maxima cached across a thread's rows, 32-bit offsets,
        # for the FAST_WINDOWS; "looped": runtime loops over the window), the fast backward
        # (tiled where it applies, else the leader scatter over a zeroed dx), the tiled
        # backward's largest tile (elements; None: the shared-memory capacity), the listed
        # kernel's dynamic shared memory (``listed_bytes``) and the threads per block. Each
        # default is the fastest measured (docs/design/fractional_max_pool.md): "rows32",
        # the tiled backward, 512 threads.
        self.forward_walk = _ROW_WALK if "rows32" in self._fw_fast_kernels else "looped"
        self.tiled_backward = True
        self.tile_elems: int | None = None
        self.listed_bytes = _LISTED_BYTES
        self.tile_threads = _TILE_THREADS
        self._tiles: dict[tuple[Any, ...], tuple[int, int, int, int] | None] = {}
        # The fast kernels divide by magic numbers: every numerator (o * (in - k),
        # (coord + 1) * (out - 1) + in - k) must stay below 2^31.
        self.fast = all(extent * (out + 1) < _FAST_LIMIT for _, extent, _, out in axes)
        lasts = [magic_divisor(out - 1) for _, _, _, out in axes]
        spans = [magic_divisor(extent - window) for _, extent, window, _ in axes]
        rows = [magic_divisor(self._w_in), magic_divisor(self._h_in * self._w_in)]
        self._fw_magic = (tuple(m for m, _ in lasts) + (0,) * 5,
                          tuple(s for _, s in lasts) + (0,) * 5)
        self._bw_magic = (tuple(m for m, _ in spans + rows) + (0, 0, 0),
                          tuple(s for _, s in spans + rows) + (0, 0, 0))
        if self._planes:
            self._fw_kernel.prepare()
            self._bw_kernel.prepare()
            if self.fast and self._has_fast:
                self._fw_fast_kernel.prepare()
                if self.tile_shape() is not None:
                    self._bw_tiled_kernel.prepare()
                    self._bw_tiled_kernel.allow_dynamic_shared(BW_LISTED_MAX_DYNAMIC)
                else:
                    self._bw_fast_kernel.prepare()

    @property
    def _fw_fast_kernel(self) -> Any:
        return self._fw_fast_kernels[self.forward_walk]

    @property
    def listed_backward(self) -> bool:
        """Whether the element has the listed tiled backward (f16/bf16/f32; f64 runs the
        general gather)."""
        return self._has_fast

    @property
    def forward_walks(self) -> tuple[str, ...]:
        """The values ``forward_walk`` may take for this window ("looped", and for the
        FAST_WINDOWS "rows32"; none for f64, which has no fast kernels)."""
        return tuple(self._fw_fast_kernels)

    @property
    def forward_kernel_name(self) -> str:
        """The name of the fast forward kernel ``forward_walk`` selects (f64: the general
        forward's)."""
        if not self._has_fast:
            return self._fw_kernel.name
        return self._fw_fast_kernel.name

    @property
    def axes(self) -> tuple[tuple[int, int, int], ...]:
        """(input extent, window, output extent) along d, h and w (2-D: d is (1, 1, 1))."""
        return ((self._d_in, self._kd, self._d_out), (self._h_in, self._kh, self._h_out),
                (self._w_in, self._kw, self._w_out))

    @property
    def paths_taken(self) -> frozenset[str]:
        """The kernels of the layouts run so far: "fw-fast" / "fw-general" and
        "bw-fast" / "bw-general" (fast: contiguous arrays, 32-bit offsets)."""
        return frozenset(f"{key[0]}-{'fast' if key[1] else 'general'}" for key in self._bound)

    @property
    def memos(self) -> tuple[LayoutMemo, LayoutMemo]:
        """The repeated-call memos of ``run_fw`` and ``run_bw`` (torch / CuPy layouts)."""
        return self._memo_fw, self._memo_bw

    @property
    def memoised_layouts(self) -> tuple[int, int]:
        """How many argument layouts the forward and the backward memo hold."""
        return self._memo_fw.layout_count, self._memo_bw.layout_count

    def tile_shape(self) -> tuple[int, int, int, int] | None:
        """(tile_d, tile_h, reach_h, reach_w) of the tiled backward, or None where it does
        not apply (then the leader scatter runs, or for f64 the gather): BARACUDA
        placement, a candidate box of at most BW_MASK_BITS outputs, whole rows fitting the
        tile."""
        if (not self.tiled_backward or self._placement != PLACEMENT_BARACUDA
                or not self.listed_backward):
            return None
        limit = self.tile_elems
        key = (limit, self.listed_bytes)
        if key not in self._tiles:
            # u32 mask per element; u32 list entry + dy per staged output
            budget = min(self.listed_bytes, BW_LISTED_MAX_DYNAMIC)
            item = self.descriptor.element.storage_bits // 8
            shared = (4, 4 + item, budget)
            tile_cap, stage_cap = budget // 4, budget // (4 + item)
            if limit is not None:
                tile_cap = min(tile_cap, limit)
            choice = None
            if (max(self._d_in, self._h_in) <= _TILE_AXIS_LIMIT
                    and self._w_in <= min(tile_cap, BW_TABLE_W)
                    and max(self._d_out, self._h_out, self._w_out) < 1 << CANDIDATE_COUNT_SHIFT):
                ranges = [candidate_ranges(extent, window, out, self._placement)
                          for extent, window, out in self.axes]
                reach = [int((end - first).max()) for first, end in ranges]
                if reach[0] * reach[1] * reach[2] <= BW_MASK_BITS:
                    tiles = _choose_tiles(self._d_in, self._h_in, self._w_in, self._w_out,
                                          ranges[0], ranges[1], tile_cap, stage_cap,
                                          BW_TABLE_D, BW_TABLE_H, shared)
                    if tiles is not None:
                        choice = tiles + (reach[1], reach[2])
            self._tiles[key] = choice
        return self._tiles[key]

    def _staged_max(self, extent: int, window: int, out: int, tile: int) -> int:
        """The most outputs of one axis whose window may meet a tile of ``tile`` coordinates
        (the staged rows / depths per tile)."""
        return staged_outputs(candidate_ranges(extent, window, out, self._placement), tile)[1]

    def _run_length(self, cached: bool = False) -> int:
        """Rows per thread: the override, else the row-caching forwards' or the others'."""
        if self.rows_per_thread is not None:
            return self.rows_per_thread
        return _CACHED_ROWS_PER_THREAD if cached else _ROWS_PER_THREAD

    def _launch_shape(self, rows: int, cols: int,
                      run: int) -> tuple[tuple[int, int], tuple[int, int]]:
        """(grid, block): x covers the ``cols`` columns, y the ``rows`` rows in runs of
        ``run`` rows (grid-strided beyond 65535 blocks)."""
        block_x = min(32 if not SIMULATOR else 8, 1 << max(cols - 1, 0).bit_length())
        block_y = max(1, self.threads // block_x)
        groups = -(-rows // run)
        grid = (-(-cols // block_x), max(1, min(-(-groups // block_y), _MAX_GRID_Y)))
        return grid, (block_x, block_y)

    def _samples(self, samples: Any) -> TensorRef:
        return as_ref(samples, self.name, "random_samples", ElementKind.F32,
                      self._samples_shape)

    def _sample_strides(self, view: TensorRef) -> tuple[int, ...]:
        axis_d = 0 if self._rank == 3 else -1
        axis_h, axis_w = (1, 2) if self._rank == 3 else (0, 1)
        return (view.strides[0], view.strides[1], view.strides[2], axis_d, axis_h, axis_w,
                0, 0)

    def _strides5(self, view: TensorRef) -> tuple[int, ...]:
        strides = view.strides
        if self._rank == 2:
            strides = strides[:2] + (0,) + strides[2:]
        return pad8(tuple(strides[::-1]), 0)[::-1]  # right-pad to 8

    # -- forward ---------------------------------------------------------------------------

    def can_implement_fw(self, args: Any) -> tuple[TensorRef, ...]:
        """Views of x, y, indices, random_samples after every check on the arrays."""
        element = self.descriptor.element
        x = as_ref(args.x, self.name, "x", element, self._input_shape)
        y = as_mut(args.y, self.name, "y", element, self._output_shape)
        indices = as_mut(args.indices, self.name, "indices", ElementKind.I64,
                         self._output_shape)
        samples = self._samples(args.random_samples)
        _check_disjoint(self.name, {"y": y, "indices": indices},
                        {"x": x, "random_samples": samples})
        return x, y, indices, samples

    def run_fw(self, args: Any, stream: Any = None, workspace: Any = None) -> None:
        """Write ``y`` and ``indices`` on ``stream`` (no host sync).

        Torch or CuPy arrays of a layout seen before skip the array checks (``LayoutMemo``; the
        no-overlap checks still run per call)."""
        memo_key = self._memo_fw.launch(stream, None, args.x, args.y, args.indices,
                                        args.random_samples) if workspace is None else None
        if memo_key is LAUNCHED:
            return
        x, y, indices, samples = self.can_implement_fw(args)
        handle = stream_handle(stream)
        self.check_workspace(workspace)
        if self._planes == 0:
            return
        fast = self.fast and self._has_fast and _fast_layout(x, y, indices)
        key = ("fw", fast, self.forward_walk, self.rows_per_thread, x.strides, y.strides,
               indices.strides, samples.strides)
        bound = self._bound.get(key)
        if bound is None:
            bound = self._bind_fw(fast, x, y, indices, samples)
            if len(self._bound) >= 64:
                self._bound.clear()
            self._bound[key] = bound
        self._memo_fw.store(memo_key, bound, _spans(x, y, indices, samples))
        bound(handle, x.ptr, y.ptr, indices.ptr, samples.ptr)

    def _bind_fw(self, fast: bool, x: TensorRef, y: TensorRef, indices: TensorRef,
                 samples: TensorRef) -> Any:
        """The forward launch for one layout; only pointers change per call."""
        run = self._run_length(fast and self.forward_walk == "rows32")
        grid, block = self._launch_shape(self._planes * self._d_out * self._h_out, self._w_out,
                                         run)
        arrays = ((0, flat_span(x.shape, x.strides)), (0, flat_span(y.shape, y.strides)),
                  (0, flat_span(indices.shape, indices.strides)),
                  (0, flat_span(samples.shape, samples.strides)))
        if fast:
            return self._fw_fast_kernel.bind(
                grid, block, arrays + (self._dims, self._sample_strides(samples),
                                       self._windows, *self._fw_magic, run))
        return self._fw_kernel.bind(
            grid, block, arrays + (self._dims, self._strides5(x), self._strides5(y),
                                   self._strides5(indices), self._sample_strides(samples),
                                   self._windows, run))

    # -- backward --------------------------------------------------------------------------

    def can_implement_bw(self, args: Any) -> tuple[TensorRef, ...]:
        """Views of dy, indices, dx, random_samples after every check on the arrays."""
        element = self.descriptor.element
        dy = as_ref(args.dy, self.name, "dy", element, self._output_shape)
        indices = as_ref(args.indices, self.name, "indices", ElementKind.I64,
                         self._output_shape)
        dx = as_mut(args.dx, self.name, "dx", element, self._input_shape)
        _check_disjoint(self.name, {"dx": dx}, {"dy": dy, "indices": indices})
        return dy, indices, dx

    def run_bw(self, args: Any, stream: Any = None, workspace: Any = None) -> None:
        """Write every element of ``dx`` on ``stream`` (no host sync, no zeroing needed).

        Torch or CuPy arrays of a layout seen before skip the array checks (``LayoutMemo``; the
        no-overlap checks still run per call)."""
        memo_key = self._memo_bw.launch(stream, None, args.dy, args.indices, args.dx) \
            if workspace is None else None
        if memo_key is LAUNCHED:
            return
        dy, indices, dx = self.can_implement_bw(args)
        handle = stream_handle(stream)
        self.check_workspace(workspace)
        if self._planes == 0:
            return
        fast = self.fast and self._has_fast and _fast_layout(dy, indices, dx)
        key = ("bw", fast, self.tiled_backward, self.tile_elems, self.tile_threads,
               self.listed_bytes, self.rows_per_thread, dy.strides, indices.strides,
               dx.strides)
        found = self._bound.get(key)
        if found is None:
            found = self._bind_bw(fast, dy, indices, dx)
            if len(self._bound) >= 64:
                self._bound.clear()
            self._bound[key] = found
        bound, zero_bytes = found
        launch = _zeroing_first(bound.fast, zero_bytes) if zero_bytes else bound.fast
        self._memo_bw.store(memo_key, launch, _spans(dy, indices, dx))
        launch(handle, dy.ptr, indices.ptr, dx.ptr)

    def _bind_bw(self, fast: bool, dy: TensorRef, indices: TensorRef,
                 dx: TensorRef) -> tuple[Any, int]:
        """(backward launch for one layout, bytes of dx to zero first)."""
        dx_span = flat_span(dx.shape, dx.strides)
        arrays = ((0, flat_span(dy.shape, dy.strides)),
                  (0, flat_span(indices.shape, indices.strides)), (0, dx_span))
        tiles = self.tile_shape() if fast else None
        if tiles is not None:
            tile_d, tile_h, reach_h, reach_w = tiles
            tiles_d, tiles_h = -(-self._d_in // tile_d), -(-self._h_in // tile_h)
            total = self._planes * tiles_d * tiles_h
            magic = [magic_divisor(extent - window) for extent, window in
                     ((self._d_in, self._kd), (self._h_in, self._kh), (self._w_in, self._kw))]
            magic += [magic_divisor(self._w_in), magic_divisor(self._h_in * self._w_in),
                      magic_divisor(self._w_out)]
            # masks, list, staged dy in dynamic shared memory
            slots = tile_d * tile_h * self._w_in
            staged = (self._staged_max(self._d_in, self._kd, self._d_out, tile_d)
                      * self._staged_max(self._h_in, self._kh, self._h_out, tile_h)
                      * self._w_out)
            item = self.descriptor.element.storage_bits // 8
            shared_bytes = 4 * (slots + staged) + item * staged
            windows = self._windows[:4] + (slots, (slots + staged) * 4 // item) \
                + self._windows[6:]
            # the opt-in is needed as soon as dynamic + static (5.5 KiB of tables) shared
            # memory exceeds 48 KiB, so every listed kernel gets the full limit
            self._bw_tiled_kernel.allow_dynamic_shared(BW_LISTED_MAX_DYNAMIC)
            return self._bw_tiled_kernel.bind(
                min(total, _MAX_GRID_X), self.tile_threads,
                arrays + (self._dims, windows, tuple(m for m, _ in magic) + (0, 0),
                          tuple(sh for _, sh in magic) + (0, 0),
                          (tile_d, tile_h, tiles_d, tiles_h, total, reach_h, reach_w, 0)),
                shared_bytes=shared_bytes), 0
        run = self._run_length()
        if fast:
            grid, block = self._launch_shape(self._planes * self._d_out * self._h_out,
                                             self._w_out, run)
            return self._bw_fast_kernel.bind(
                grid, block, arrays + (self._dims, self._windows, *self._bw_magic,
                                       run)), dx_span * dx.itemsize
        grid, block = self._launch_shape(self._planes * self._d_in * self._h_in, self._w_in,
                                         run)
        return self._bw_kernel.bind(
            grid, block, arrays + (self._dims, self._strides5(dy), self._strides5(indices),
                                   self._strides5(dx), self._windows, run)), 0

    # -- the Plan protocol -------------------------------------------------------------------

    def can_implement(self, args: Any) -> tuple[TensorRef, ...]:
        """Forward or backward checks, by the type of ``args``."""
        if hasattr(args, "x"):
            return self.can_implement_fw(args)
        return self.can_implement_bw(args)

    def run(self, args: Any, stream: Any = None, workspace: Any = None) -> None:
        """``run_fw`` for forward args, ``run_bw`` for backward args."""
        if hasattr(args, "x"):
            self.run_fw(args, stream, workspace)
        else:
            self.run_bw(args, stream, workspace)


class FractionalMaxPool2dPlan(_FractionalMaxPoolPlan):
    """2-D fractional max pool; see the module docstring."""

    name = "FractionalMaxPool2dPlan"
    _rank = 2
    _pool_kind = PoolKind.FRACTIONAL_MAX_POOL2D

    @classmethod
    def select(cls, desc: FractionalMaxPool2dDescriptor,
               pref: PlanPreference | None = None) -> FractionalMaxPool2dPlan:
        if not isinstance(desc, FractionalMaxPool2dDescriptor):
            fail(cls.name, InvalidProblem, "desc",
                 f"is a {type(desc).__name__}, not a FractionalMaxPool2dDescriptor")
        return super().select(desc, pref)  # type: ignore[return-value]


class FractionalMaxPool3dPlan(_FractionalMaxPoolPlan):
    """3-D fractional max pool; see the module docstring."""

    name = "FractionalMaxPool3dPlan"
    _rank = 3
    _pool_kind = PoolKind.FRACTIONAL_MAX_POOL3D

    @classmethod
    def select(cls, desc: FractionalMaxPool3dDescriptor,
               pref: PlanPreference | None = None) -> FractionalMaxPool3dPlan:
        if not isinstance(desc, FractionalMaxPool3dDescriptor):
            fail(cls.name, InvalidProblem, "desc",
                 f"is a {type(desc).__name__}, not a FractionalMaxPool3dDescriptor")
        return super().select(desc, pref)  # type: ignore[return-value]
