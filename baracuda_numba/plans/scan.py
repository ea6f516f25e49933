"""``ScanPlan`` / ``ScanBackwardPlan``: inclusive prefix scans along one axis.

Kinds (``ScanKind``): Cumsum, Cumprod, Cummax, Cummin, LogCumsumExp; ``reverse=True``
scans from the end. Rank 1..8, any axis, any non-negative input strides (0-stride
broadcast included); outputs must not overlap themselves. Empty tensors are a no-op.

Element kinds: F16, BF16, F32, F64 for every kind, plus I32 and I64 (wrapping arithmetic,
as torch with ``dtype=`` the input's) for Cumsum, Cumprod, Cummax and Cummin. Halves
accumulate in f32 end to end and round once per output.

Semantics decided here (issue 4): Cummax/Cummin propagate NaN; the optional ``indices``
output (int64) holds torch.cummax's index choice (the last index among equal winners,
the last NaN once a NaN is seen); LogCumsumExp of an all -inf prefix is -inf and +inf
absorbs. Backward: Cumsum is a reversed Cumsum of ``dy``; Cumprod is the exact gradient
with zeros in ``x`` (no division by ``x``); LogCumsumExp is computed with exponents <= 0
(``dx = 0`` where ``x = -inf``); Cummax/Cummin send each ``dy[i]`` to the index the
forward returns at ``i`` (the last of equal winners, the last NaN: torch's autograd).

Saved tensors for ``ScanBackwardArgs``: Cumsum none; Cumprod ``x`` and ``y``;
Cummax/Cummin ``x``; LogCumsumExp ``x`` and ``y``. ``dx`` must not overlap ``dy``, ``x``
or ``y``. A missing saved tensor is ``InvalidProblem``.

Kernels (``kernels/scan/``). When ``x`` and ``y`` (and ``indices``) collapse to
[outer, extent, inner] with contiguous inner axes and a uniform outer pitch (any
C-contiguous tensor, for instance): *rows_fast* (inner = 1, extent >= 64: one warp per
line, 8-byte word accesses when pointers and pitches allow) or *cols_fast* (inner >= 32:
32 x V columns per block, rows in registers) for Cumsum, Cumprod, LogCumsumExp and
Cummax/Cummin values (and the Cumsum gradient); the *indexed* rows kernel for
Cummax/Cummin with ``indices``; the *fused* Cummax/Cummin backward (rows or cols, when
``x``, ``dy`` and ``dx`` all collapse: one pass over the three; else a record-flag
pre-pass, on the indexed kernel where ``x`` and ``dx`` collapse, and the generic backward
kernel). Otherwise the generic kernels: *rows* when the output's scan axis is
contiguous (block-level tile scan), else *lines* (one thread per line, consecutive
threads on the output's smallest-stride outer axis). Problems with few, long lines are
split over warps or blocks in two phases through a workspace of ``workspace_size``
bytes, which ``run`` then requires (``WorkspaceTooSmall`` before any launch otherwise;
``PlanPreference(max_workspace_bytes=0)`` selects the unsplit path, the same result up
to the order of the f32/f64 additions). rows_fast at f32 accumulators (F16, BF16, F32)
runs its split as one chained launch after zeroing part of the workspace
(``chained_split``), bit-identical to the two phases. Results are
deterministic and bit-stable for a given layout, alignment and workspace choice.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .._runtime import SIMULATOR
from ..arrays import TensorRef, as_mut, as_ref, flat_span
from ..driver import memset_d8_async
from ..errors import InvalidProblem
from ..kernels.common import pad8
from ..kernels.scan import (
    CODE_CUMMAX_RECORD_FLAG,
    CODE_CUMMIN_RECORD_FLAG,
    CODE_CUMSUM,
    CODE_EXTREMUM_BACKWARD,
    EXTREMUM_BACKWARD_KERNELS,
    FAST_COLS_CHUNKS,
    FAST_FAMILY,
    FAST_KERNELS,
    FAST_ROWS_BLOCK,
    INDEXED_CODES,
    INDEXED_KERNELS,
    PHASE_CHAINED,
    ROWS_BLOCK,
    SCAN_BACKWARD_ELEMENTS,
    SCAN_FORWARD_ELEMENTS,
    SCAN_KERNELS,
    ExtremumBackwardKernels,
    FastKernels,
    ScanKernels,
    with_bf16,
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
    PrecisionGuarantee,
    ScanKind,
)
from .base import LAUNCHED, LayoutMemo, Plan, fail, plan_args, product, replay_launcher

__all__ = [
    "ScanArgs",
    "ScanBackwardArgs",
    "ScanBackwardDescriptor",
    "ScanBackwardPlan",
    "ScanDescriptor",
    "ScanPlan",
]

# Work sizing: a large GPU holds about 132 SMs x 2048 threads = 270K resident threads.
_TARGET_THREADS = 1 << 18  # lines kernel: split lines into chunks until this many threads
_TARGET_BLOCKS = 2048  # rows kernel: split few long lines until this many blocks
_MIN_CHUNK = 16  # lines kernel: elements per thread chunk at least this
# lines kernel threads per block: 1024 ran out of registers (CUDA_ERROR_LAUNCH_OUT_OF_
# RESOURCES); 256 always launches (255 registers x 256 = 65K)
_LINES_BLOCK = 256
_MAX_GRID = 1 << 20
_ROWS_MIN_EXTENT = 64  # shorter contiguous lines go to the lines kernel
_SIM_GRID = 2  # simulator: every kernel loops over its work with a grid-stride loop
# Fast kernels (uniform-pitch layouts). rows_fast: one warp per (line, segment); lines are
# split into segments (two phases, 3 passes over the data instead of 2) only when there
# are fewer lines than this, until about _FAST_TARGET_WARPS warps (more warps pay on few
# long lines; a split of many lines only adds a pass: docs/design/scan.md).
_FAST_SPLIT_LINES = 2048
_FAST_TARGET_WARPS = 16384
# cols_fast: blocks of 32 x FAST_COLS_CHUNKS threads; split until about this many blocks
# (more segments lose to the extra pass: docs/design/scan.md).
_FAST_TARGET_BLOCKS = 512
_FAST_MIN_INNER = 32  # cols_fast needs at least one warp-row of columns


@dataclass(frozen=True, slots=True)
class ScanDescriptor:
    """Scan ``kind`` along ``scan_axis`` of a tensor of ``input_shape``; ``reverse`` scans
    from the end. ``element`` is keyword-only."""

    kind: ScanKind
    input_shape: tuple[int, ...]
    scan_axis: int
    reverse: bool = False
    element: ElementKind = field(kw_only=True)

    def __post_init__(self) -> None:
        object.__setattr__(self, "input_shape", tuple(self.input_shape))


@dataclass(frozen=True, slots=True)
class ScanBackwardDescriptor:
    """The backward of the forward scan with the same fields."""

    kind: ScanKind
    input_shape: tuple[int, ...]
    scan_axis: int
    reverse: bool = False
    element: ElementKind = field(kw_only=True)

    def __post_init__(self) -> None:
        object.__setattr__(self, "input_shape", tuple(self.input_shape))


@plan_args
class ScanArgs:
    """``x`` is read, ``y`` written; ``indices`` (int64, Cummax/Cummin only) optional."""

    x: Any
    y: Any
    indices: Any = None


@plan_args
class ScanBackwardArgs:
    """``dy`` is read, ``dx`` written; ``x``/``y`` are the saved forward input/output."""

    dy: Any
    dx: Any
    x: Any = None
    y: Any = None


_NEEDS_X = (ScanKind.CUMPROD, ScanKind.CUMMAX, ScanKind.CUMMIN, ScanKind.LOG_CUMSUM_EXP)
_NEEDS_Y = (ScanKind.CUMPROD, ScanKind.LOG_CUMSUM_EXP)


class _Geometry:
    """Descriptor-only launch sizing: lines, extent, and the segment splits of each
    kernel with the workspace they need."""

    def __init__(self, shape: tuple[int, ...], axis: int, kernels: ScanKernels,
                 max_workspace: int | None, element: ElementKind) -> None:
        self.element = element
        self.shape = shape
        self.axis = axis
        self.extent = shape[axis]
        self.outer_shape = shape[:axis] + shape[axis + 1:]
        self.lines = product(self.outer_shape)
        self.numel = self.lines * self.extent
        lines, extent = self.lines, self.extent
        # rows kernel: one block per line; few long lines are split into segments
        tile = ROWS_BLOCK * kernels.items
        rows_nseg = 1
        if lines and lines < _TARGET_BLOCKS and extent >= 8 * tile:
            rows_nseg = min(-(-_TARGET_BLOCKS // lines), extent // (4 * tile))
        # lines kernel: a block is (lanes x chunks); a line is split into up to 32 chunks
        if SIMULATOR:
            lanes = 8 if lines >= 8 else max(1, lines)
            chunks = max(1, min(4, extent // 4))
        elif lines >= _TARGET_THREADS // 2:
            lanes, chunks = _LINES_BLOCK, 1
        else:
            lanes = 32
            chunks = max(1, min(_LINES_BLOCK // lanes, -(-_TARGET_THREADS // max(lines, 1)),
                                extent // _MIN_CHUNK))
        lines_nseg = 1
        if lines and lines * chunks < _TARGET_THREADS // 4 and extent >= 64 * chunks * 4:
            lines_nseg = min(-(-_TARGET_THREADS // (lines * chunks)),
                             extent // (64 * chunks))
        if SIMULATOR and lines and extent >= 2 * tile:
            rows_nseg = 2  # exercise the two-phase paths on tiny shapes
        if SIMULATOR and lines and extent >= 64:
            lines_nseg = 2
        self.lanes, self.chunks = lanes, chunks
        self.ext_rows_nseg = self.ext_cols_nseg = 1  # set by extremum_backward
        self.rows_nseg, self.lines_nseg = max(1, rows_nseg), max(1, lines_nseg)
        self.acc_bytes = kernels.acc_bytes

        def workspace(nseg: int) -> int:
            return 0 if nseg == 1 else self._workspace_layout(lines * nseg)[2]

        if max_workspace is not None:
            if workspace(self.rows_nseg) > max_workspace:
                self.rows_nseg = 1
            if workspace(self.lines_nseg) > max_workspace:
                self.lines_nseg = 1
        self.workspace_size = max(workspace(self.rows_nseg), workspace(self.lines_nseg))
        self._fast_geometry(max_workspace)

    def _fast_geometry(self, max_workspace: int | None) -> None:
        """Segments of the fast kernels (they depend on the shape only: a layout that
        collapses to [outer, extent, inner] has these extents whatever its strides)."""
        shape, axis, extent = self.shape, self.axis, self.extent
        self.inner = product(shape[axis + 1:])
        self.outer = product(shape[:axis])
        fast = FAST_KERNELS.get(("arith", self.element))  # every family: the same tiles
        self.fast_rows_nseg = self.fast_cols_nseg = 1
        self.fast_chunks = FAST_COLS_CHUNKS
        if fast is None or not self.numel:
            return
        lines = self.lines
        if self.inner == 1:
            tile = fast.tile
            if lines < _FAST_SPLIT_LINES and extent >= 4 * tile:
                self.fast_rows_nseg = min(-(-_FAST_TARGET_WARPS // lines), extent // (2 * tile))
            if SIMULATOR and extent >= 2 * tile:
                self.fast_rows_nseg = 2
        elif self.inner >= _FAST_MIN_INNER:
            rows = fast.col_rows
            self.fast_chunks = max(1, min(FAST_COLS_CHUNKS, -(-extent // rows)))
            tile_rows = self.fast_chunks * rows
            blocks = self.outer * -(-self.inner // (32 * fast.per_word))
            if blocks < _FAST_TARGET_BLOCKS and extent >= 4 * tile_rows:
                self.fast_cols_nseg = min(-(-_FAST_TARGET_BLOCKS // blocks),
                                          extent // (2 * tile_rows))
            if SIMULATOR and extent >= 2 * tile_rows:
                self.fast_cols_nseg = 2
        rows_need = self.fast_rows_workspace(self.fast_rows_nseg)
        if max_workspace is not None and rows_need > max_workspace:
            self.fast_rows_nseg, rows_need = 1, 0
        cols_need = self.fast_workspace(self.fast_cols_nseg)
        if max_workspace is not None and cols_need > max_workspace:
            self.fast_cols_nseg, cols_need = 1, 0
        self.workspace_size = max(self.workspace_size, rows_need, cols_need)

    def extremum_backward(self, kernels: ExtremumBackwardKernels,
                          max_workspace: int | None) -> None:
        """Segments of the fused Cummax/Cummin backward (rows_fast's and cols_fast's
        splits; its cols tile has its own rows per thread) and the workspace they need:
        per (line, segment) the x aggregate, the head and tail sums (accumulators) and
        the last record's scan index (int64)."""
        self.ext_rows_nseg = self.fast_rows_nseg
        self.ext_cols_nseg = self.fast_cols_nseg
        self.ext_chunks = max(1, min(kernels.cols_chunks, -(-self.extent // kernels.col_rows)))
        for attr in ("ext_rows_nseg", "ext_cols_nseg"):
            need = self.extremum_workspace(getattr(self, attr))[-1]
            if max_workspace is not None and need > max_workspace:
                setattr(self, attr, 1)
        self.workspace_size = max(self.workspace_size,
                                  self.extremum_workspace(self.ext_rows_nseg)[-1],
                                  self.extremum_workspace(self.ext_cols_nseg)[-1])

    def extremum_workspace(self, nseg: int) -> tuple[int, int, int, int, int]:
        """(offsets of ws_x, ws_h, ws_t, ws_p, total bytes) for ``nseg`` segments per
        line (all 0 for 1 segment: no split, no workspace)."""
        if nseg == 1:
            return 0, 0, 0, 0, 0
        entries = self.lines * nseg
        a_bytes = (entries * self.acc_bytes + 15) // 16 * 16
        return 0, a_bytes, 2 * a_bytes, 3 * a_bytes, 3 * a_bytes + 8 * entries

    @staticmethod
    def chain_bytes(entries: int) -> int:
        """Bytes of the chained split's words: the ticket, then one per segment."""
        return 8 * (1 + entries)

    def fast_rows_workspace(self, nseg: int) -> int:
        """Bytes of a rows_fast / indexed split in ``nseg`` segments: the aggregates and
        the indexed kernel's int64 positions, or the chained split's words (no more)."""
        if nseg == 1:
            return 0
        entries = self.lines * nseg
        return max(self._workspace_layout(entries)[2], self.chain_bytes(entries))

    def split_workspace(self) -> int:
        """Bytes every kernel's split needs at the current segment counts (``use_kernels``
        may have changed them)."""
        generic = [0 if nseg == 1 else self._workspace_layout(self.lines * nseg)[2]
                   for nseg in (self.rows_nseg, self.lines_nseg)]
        return max(*generic, self.fast_rows_workspace(self.fast_rows_nseg),
                   self.fast_workspace(self.fast_cols_nseg),
                   self.extremum_workspace(self.ext_rows_nseg)[-1],
                   self.extremum_workspace(self.ext_cols_nseg)[-1])

    def fast_workspace(self, nseg: int) -> int:
        """Bytes of the fast kernels' segment aggregates (one accumulator each)."""
        return 0 if nseg == 1 else (self.lines * nseg * self.acc_bytes + 15) // 16 * 16

    def fast_segments(self, nseg: int, granule: int) -> tuple[int, int]:
        """(segment length rounded up to ``granule``, number of segments)."""
        per_segment = -(-self.extent // nseg)
        seg_len = -(-per_segment // granule) * granule
        return seg_len, max(1, -(-self.extent // seg_len))

    def _workspace_layout(self, entries: int) -> tuple[int, int, int]:
        """(offset of ws_a, offset of ws_b, total bytes) for ``entries`` states: the
        accumulators, then 8 bytes per entry for the second half of the state (an int64
        index forward, an accumulator backward)."""
        a_bytes = (entries * self.acc_bytes + 15) // 16 * 16
        return 0, a_bytes, a_bytes + 8 * entries


def _sku(kind: ScanKind, element: ElementKind) -> KernelSku:
    if element is ElementKind.F64:
        math_precision, accumulator = MathPrecision.F64, ElementKind.F64
    elif element in (ElementKind.I32, ElementKind.I64):
        math_precision, accumulator = MathPrecision.INT64, element
    else:
        math_precision, accumulator = MathPrecision.F32, ElementKind.F32
    guarantee = PrecisionGuarantee(math_precision, accumulator,
                                   bit_stable_on_same_hardware=True, deterministic=True)
    return KernelSku(OpCategory.SCAN, int(kind), element, None, None, None, ArchSku.SM80,
                     BackendKind.BESPOKE, guarantee)


def _span(view: TensorRef) -> int:
    """Bytes from the first to past the last element of ``view``."""
    return flat_span(view.shape, view.strides) * view.itemsize


def _overlaps(a: TensorRef, b: TensorRef) -> bool:
    """Whether the byte ranges spanned by two views intersect."""
    span_a, span_b = _span(a), _span(b)
    if span_a == 0 or span_b == 0:
        return False
    return a.ptr < b.ptr + span_b and b.ptr < a.ptr + span_a


#: ``[(bound launch, its pointer arguments), ...]``: the launches of one pass, in order
_Calls = list[tuple[Any, tuple[int, ...]]]
# Index pairs that the checks require to be disjoint (LayoutMemo re-checks them per call),
# in run's (x, y, indices) and the backward's (dy, dx, x, y) order.
_FW_DISJOINT = ((2, 1), (2, 0))
_BW_DISJOINT = ((1, 0), (1, 2), (1, 3))
_CUMSUM_BW_DISJOINT = ((1, 2), (1, 3))


def _launch(stream: int, calls: _Calls) -> None:
    for bound, pointers in calls:
        bound(stream, *pointers)


def _zero_bytes(nbytes: int) -> Callable[[int, int], None]:
    """``zero(stream, pointer)``: clear ``nbytes`` at ``pointer`` on ``stream`` (a call of
    a pass, like a bound launch)."""

    def zero(stream: int, pointer: int) -> None:
        memset_d8_async(pointer, 0, nbytes, stream)

    return zero


def _collapse(shape: tuple[int, ...], axis: int, view_strides: tuple[tuple[int, ...], ...]
              ) -> list[tuple[int, int]] | None:
    """Per view, ``(outer_stride, axis_stride)`` of the layout [outer, extent, inner] when
    the axes after ``axis`` are contiguous (row-major, innermost stride 1) and the axes
    before it collapse to one axis of uniform stride; None if some view does not."""
    inner_axes = [a for a in range(axis + 1, len(shape)) if shape[a] != 1]
    outer_axes = [a for a in range(axis) if shape[a] != 1]
    out = []
    for strides in view_strides:
        expect = 1
        for a in reversed(inner_axes):
            if strides[a] != expect:
                return None
            expect *= shape[a]
        outer_stride = 0
        if outer_axes:
            outer_stride = strides[outer_axes[-1]]
            expect = outer_stride * shape[outer_axes[-1]]
            for a in reversed(outer_axes[:-1]):
                if strides[a] != expect:
                    return None
                expect *= shape[a]
        out.append((outer_stride, strides[axis] if shape[axis] != 1 else 0))
    return out


#: ``use_kernels``: leave this kernel set as it is.
_KEEP = object()


class _ScanLauncher(Plan):
    """What the two plans share: descriptor checks, geometry and the launch."""

    _elements: dict[ScanKind, tuple[ElementKind, ...]] = {}

    @classmethod
    def _check(cls, desc: Any) -> None:
        if not isinstance(desc.kind, ScanKind):
            fail(cls.name, InvalidProblem, "kind", f"= {desc.kind!r} is not a ScanKind")
        cls.check_rank(desc.input_shape, "input_shape")
        rank = len(desc.input_shape)
        axis = desc.scan_axis
        if not isinstance(axis, int) or not 0 <= axis < rank:
            fail(cls.name, InvalidProblem, "scan_axis",
                 f"= {axis!r} must be in 0..{rank - 1} for rank {rank}")
        cls.check_element(desc.element, cls._elements[desc.kind])

    def _setup(self, desc: Any, pref: PlanPreference | None, backward: bool) -> None:
        element = desc.element
        self._forward = SCAN_KERNELS[(False, element)]
        self._backward = SCAN_KERNELS[(True, element)] if backward else None
        main = self._backward if backward and desc.kind is not ScanKind.CUMSUM \
            else self._forward
        self._main = main
        max_ws = (pref or PlanPreference()).max_workspace_bytes
        self._geometry = _Geometry(desc.input_shape, desc.scan_axis, main, max_ws, element)
        # the fast kernels serve the forward kinds and the Cumsum gradient (a reversed Cumsum)
        fast_code = int(desc.kind) if not backward or desc.kind is ScanKind.CUMSUM else -1
        self._fast_code = fast_code
        self._fast = FAST_KERNELS.get((FAST_FAMILY.get(fast_code, ""), element))
        # Cummax/Cummin with indices, and the record flags of their backward
        extremum = desc.kind in (ScanKind.CUMMAX, ScanKind.CUMMIN)
        self._indexed = INDEXED_KERNELS.get(element) if extremum else None
        # the fused Cummax/Cummin backward (uniform-pitch layouts)
        self._extremum_backward = EXTREMUM_BACKWARD_KERNELS.get(element) \
            if extremum and backward else None
        if self._extremum_backward is not None:
            self._geometry.extremum_backward(self._extremum_backward, max_ws)
        super().__init__(desc, _sku(desc.kind, element), pref, self._geometry.workspace_size)
        self._bound: dict[Any, tuple[Any, ...]] = {}
        # (x, y, indices, workspace) forward, (dy, dx, x, y, workspace) backward
        self._memo = LayoutMemo(5, _CUMSUM_BW_DISJOINT if desc.kind is ScanKind.CUMSUM
                                else _BW_DISJOINT) if backward \
            else LayoutMemo(4, _FW_DISJOINT)
        self._saved = (desc.kind in _NEEDS_X, desc.kind in _NEEDS_Y)  # backward's x, y
        if self._geometry.numel:
            for kernels in {id(k): k for k in (self._forward, self._backward) if k}.values():
                kernels.rows.prepare()
                kernels.lines.prepare()
            if self._fast is not None:
                self._fast.rows.prepare()
                self._fast.cols.prepare()
            if self._indexed is not None:
                self._indexed.rows.prepare()
            if self._extremum_backward is not None:
                for kernel in (self._extremum_backward.rows, self._extremum_backward.cols,
                               self._extremum_backward.fixup):
                    kernel.prepare()

    @property
    def paths_taken(self) -> frozenset[str]:
        """The kernel paths of the layouts run so far: ``"generic"`` (rows / lines),
        ``"fast"`` (rows_fast / cols_fast), ``"indexed"`` (the indexed rows kernel) and
        ``"extremum_backward"`` (the fused Cummax/Cummin backward)."""
        return frozenset(key[0] if isinstance(key[0], str) else "generic"
                         for key, found in self._bound.items() if found[0])

    @property
    def chained_split(self) -> bool:
        """Whether a layout run so far split its lines in one chained launch (rows_fast at
        f32 accumulators) rather than in two."""
        return any(key[0] == "fast" and found[1] is not None
                   for key, found in self._bound.items())

    @property
    def memoised_layouts(self) -> int:
        """How many argument layouts the repeated-call memo holds."""
        return self._memo.layout_count

    def use_kernels(self, *, fast: Any = _KEEP, indexed: Any = _KEEP,
                    extremum_backward: Any = _KEEP, **geometry: int) -> None:
        """Tuning (benchmark sweeps): run kernel variants in place of the table's
        (``FastKernels``, ``IndexedKernels``, ``ExtremumBackwardKernels`` built with
        ``register=False``; ``extremum_backward=None``: the record-flag pre-pass and the
        generic kernels) and override launch-geometry fields by name (``_Geometry``'s
        attributes, e.g. ``rows_block``). ``workspace_size`` grows to what the segment
        counts then need; the bound launches and the memo are dropped."""
        if fast is not _KEEP:
            self._fast = fast
        if indexed is not _KEEP:
            self._indexed = indexed
        if extremum_backward is not _KEEP:
            self._extremum_backward = extremum_backward
            if extremum_backward is not None:
                self._geometry.extremum_backward(extremum_backward, None)
        for name, value in geometry.items():
            if not hasattr(self._geometry, name):
                raise AttributeError(f"{self.name}.use_kernels: no geometry field {name!r}")
            setattr(self._geometry, name, value)
        geo = self._geometry
        geo.workspace_size = max(geo.workspace_size, geo.split_workspace())
        self._workspace_size = geo.workspace_size
        self._bound.clear()
        self._memo.clear()

    def _remember(self, key: Any, calls: _Calls, views: tuple[TensorRef | None, ...],
                  workspace: int | None) -> None:
        """Store the replay of ``calls`` under the memo ``key`` (None: not memoised); the
        workspace pointer comes last (0: none used), its parts addressed from it."""
        if key is None:
            return
        pointers = tuple(0 if v is None else v.ptr for v in views) + (workspace or 0,)
        launch = replay_launcher(calls, pointers, (len(views), self._workspace_size))
        if launch is not None:
            self._memo.store(key, launch,
                             tuple(0 if v is None else _span(v) for v in views) + (0,))

    @property
    def workspace_size(self) -> int:
        """Bytes of scratch the split path for few long lines needs, sized by ``select``
        within ``PlanPreference.max_workspace_bytes`` (0: never split); ``run`` requires
        a workspace of at least this size."""
        return self._workspace_size

    def _workspace_ptr(self, workspace: Any) -> int | None:
        """The workspace pointer, or None where the plan needs none (``workspace_size``
        0: ``max_workspace_bytes=0`` asks for that path). A missing or smaller workspace
        raises ``WorkspaceTooSmall(needed, got)`` before anything is launched."""
        if self._workspace_size == 0:
            return None
        return self.check_workspace(workspace)

    def _calls(self, kernels: ScanKernels, code: int, reverse: bool,
               ins: tuple[TensorRef, ...], out: TensorRef, indices: TensorRef | None,
               workspace: int | None) -> _Calls:
        """The launches of one scan pass, ``[(bound launch, its pointers), ...]`` in order,
        from bound launches cached per layout: per call only pointers move."""
        if self._fast is not None and code == self._fast_code and indices is None \
                and len(ins) == 1:
            calls = self._fast_calls(code, reverse, ins[0], out, workspace)
            if calls:
                return calls
        if self._indexed is not None and code in INDEXED_CODES and len(ins) == 1 \
                and (indices is not None or code not in FAST_FAMILY):
            calls = self._indexed_calls(code, reverse, ins[0], out, indices, workspace)
            if calls:
                return calls
        operands = list(ins) + [ins[-1]] * (3 - len(ins)) + [out]
        key = (id(kernels), code, reverse, tuple(v.strides for v in operands),
               None if indices is None else indices.strides, workspace is None)
        cache = self._bound
        found = cache.get(key)
        if found is None:
            found = self._bind(kernels, code, reverse, operands, indices, workspace is not None)
            if len(cache) >= 64:
                cache.clear()
            cache[key] = found
        launches, offset_a, offset_b = found
        ws_a = workspace + offset_a if workspace is not None and offset_a >= 0 else 0
        ws_b = workspace + offset_b if workspace is not None and offset_b >= 0 else 0
        pointers = (operands[0].ptr, operands[1].ptr, operands[2].ptr, out.ptr,
                    0 if indices is None else indices.ptr, ws_a, ws_b)
        return [(bound, pointers) for bound in launches]

    def _fast_calls(self, code: int, reverse: bool, x: TensorRef, y: TensorRef,
                    workspace: int | None) -> _Calls:
        """rows_fast or cols_fast if the layout collapses to [outer, extent, inner] (inner
        axes contiguous) for ``x`` and ``y``; an empty list otherwise."""
        fast = self._fast
        assert fast is not None
        aligned = x.ptr % 8 == 0 and y.ptr % 8 == 0
        key = ("fast", code, reverse, x.strides, y.strides, aligned, workspace is None)
        cache = self._bound
        found = cache.get(key)
        if found is None:
            found = self._bind_fast(fast, code, reverse, x, y, aligned, workspace is not None)
            if len(cache) >= 64:
                cache.clear()
            cache[key] = found
        launches, zero_chain, rows = found
        ws = workspace if workspace is not None else 0
        # rows_fast takes the workspace twice: its aggregates (two launches) or its chained
        # split's words (one launch), the unused view of extent 0
        pointers = (x.ptr, x.ptr, y.ptr, y.ptr, ws) + ((ws,) if rows else ())
        calls = [(bound, pointers) for bound in launches]
        if zero_chain is not None:
            calls.insert(0, (zero_chain, (ws,)))
        return calls

    def _indexed_calls(self, code: int, reverse: bool, x: TensorRef, y: TensorRef,
                       indices: TensorRef | None, workspace: int | None) -> _Calls:
        """The indexed rows kernel if x, y (and indices) are rows of a uniform pitch; an
        empty list otherwise."""
        aligned = x.ptr % 8 == 0 and y.ptr % 8 == 0
        key = ("indexed", code, reverse, x.strides, y.strides,
               None if indices is None else indices.strides, aligned, workspace is None)
        cache = self._bound
        found = cache.get(key)
        if found is None:
            found = self._bind_indexed(code, reverse, x, y, indices, aligned,
                                       workspace is not None)
            if len(cache) >= 64:
                cache.clear()
            cache[key] = found
        launches, offset_a, offset_b = found
        ws_a = workspace + offset_a if workspace is not None and offset_a >= 0 else 0
        ws_b = workspace + offset_b if workspace is not None and offset_b >= 0 else 0
        pointers = (x.ptr, x.ptr, y.ptr, y.ptr, 0 if indices is None else indices.ptr, ws_a,
                    ws_b)
        return [(bound, pointers) for bound in launches]

    def _extremum_backward_calls(self, reverse: bool, x: TensorRef, dy: TensorRef,
                                 dx: TensorRef, workspace: int | None) -> _Calls:
        """The fused Cummax/Cummin backward if x, dy and dx collapse to [outer, extent,
        inner] (rows: inner = 1; cols: inner >= 32); an empty list otherwise."""
        aligned = x.ptr % 8 == 0 and dy.ptr % 8 == 0 and dx.ptr % 8 == 0
        key = ("extremum_backward", reverse, x.strides, dy.strides, dx.strides, aligned,
               workspace is None)
        cache = self._bound
        found = cache.get(key)
        if found is None:
            found = self._bind_extremum_backward(reverse, x, dy, dx, aligned,
                                                 workspace is not None)
            if len(cache) >= 64:
                cache.clear()
            cache[key] = found
        launches, offsets = found
        ws = (0, 0, 0, 0) if workspace is None else tuple(workspace + o for o in offsets)
        main = (x.ptr, x.ptr, dy.ptr, dy.ptr, dx.ptr, dx.ptr) + ws
        fixup = (dx.ptr,) + ws[1:]
        return [(bound, fixup if is_fixup else main) for bound, is_fixup in launches]

    def _bind_extremum_backward(self, reverse: bool, x: TensorRef, dy: TensorRef,
                                dx: TensorRef, aligned: bool, with_workspace: bool
                                ) -> tuple[list[tuple[Any, bool]], tuple[int, ...]]:
        geo = self._geometry
        kernels = self._extremum_backward
        assert kernels is not None
        views = (x, dy, dx)
        layout = _collapse(geo.shape, geo.axis, tuple(v.strides for v in views))
        if layout is None:
            return [], ()
        per_word = kernels.per_word
        extent, inner = geo.extent, geo.inner
        (x_outer, x_step), (g_outer, g_step), (o_outer, o_step) = layout

        def span(view: TensorRef) -> tuple[tuple[int, int], tuple[int, int]]:
            elements = flat_span(geo.shape, view.strides)
            return (0, elements), (0, elements * view.itemsize // 8)

        (x_flat, x_words), (g_flat, g_words), (o_flat, o_words) = (span(v) for v in views)
        if inner == 1 and extent >= _ROWS_MIN_EXTENT and x_step == g_step == o_step == 1:
            vec = aligned and all(p % per_word == 0 for p in (x_outer, g_outer, o_outer)) \
                and (not reverse or extent % per_word == 0)
            nseg = geo.ext_rows_nseg if with_workspace else 1
            seg_len, nseg = geo.fast_segments(nseg, kernels.tile)
            geometry = [geo.lines, extent, x_outer, g_outer, o_outer, seg_len, nseg]
            warps = FAST_ROWS_BLOCK // 32
            grid = min(-(-geo.lines * nseg // warps), _SIM_GRID if SIMULATOR else _MAX_GRID)
            kernel, block = kernels.rows, FAST_ROWS_BLOCK
            ws_strides = (nseg, 1)  # [line][segment]
        elif inner >= _FAST_MIN_INNER:
            vec = aligned and all(v % per_word == 0 for v in (x_outer, x_step, g_outer,
                                                                g_step, o_outer, o_step))
            nseg = geo.ext_cols_nseg if with_workspace else 1
            chunks = geo.ext_chunks
            seg_len, nseg = geo.fast_segments(nseg, chunks * kernels.col_rows)
            geometry = [geo.outer, extent, inner, x_outer, x_step, g_outer, g_step, o_outer,
                        o_step, seg_len, nseg]
            work = geo.outer * -(-inner // (32 * per_word)) * nseg
            grid = min(work, _SIM_GRID if SIMULATOR else _MAX_GRID)
            kernel, block = kernels.cols, (32, chunks)
            ws_strides = (1, geo.lines)  # [segment][line]
        else:
            return [], ()
        entries = geo.lines * nseg if nseg > 1 else 0
        offsets = geo.extremum_workspace(nseg)[:4]
        ws = [(0, entries)] * 4
        code = with_bf16(int(self.descriptor.kind), self.descriptor.element)
        launches = []
        for phase in ((1, 2) if nseg > 1 else (0,)):
            args = (x_flat, x_words, g_flat, g_words, o_words, o_flat, *ws, *geometry, phase,
                    reverse, vec, code)
            launches.append((kernel.bind(grid, block, args), False))
        if nseg > 1:
            fix_grid = min(-(-entries // 256), _SIM_GRID if SIMULATOR else _MAX_GRID)
            args = (o_flat, *ws[1:], geo.lines, nseg, *ws_strides, inner, o_outer, o_step,
                    extent, reverse, self.descriptor.element is ElementKind.BF16)
            launches.append((kernels.fixup.bind(fix_grid, 256, args), True))
        return launches, offsets

    def _bind_indexed(self, code: int, reverse: bool, x: TensorRef, y: TensorRef,
                      indices: TensorRef | None, aligned: bool, with_workspace: bool
                      ) -> tuple[list[Any], int, int]:
        geo = self._geometry
        kernels = self._indexed
        assert kernels is not None
        views = (x, y) if indices is None else (x, y, indices)
        layout = _collapse(geo.shape, geo.axis, tuple(v.strides for v in views))
        extent = geo.extent
        if layout is None or geo.inner != 1 or extent < _ROWS_MIN_EXTENT or \
                any(step != 1 for _, step in layout):
            return [], -1, -1
        pitches = [outer for outer, _ in layout] + [0]
        per_word = kernels.per_word
        vec = aligned and pitches[0] % per_word == 0 and pitches[1] % per_word == 0 and \
            (not reverse or extent % per_word == 0)
        nseg = geo.fast_rows_nseg if with_workspace else 1
        seg_len, nseg = geo.fast_segments(nseg, kernels.tile)
        offset_a = offset_b = -1
        entries = 0
        if nseg > 1:
            offset_a, offset_b, _ = geo._workspace_layout(geo.lines * nseg)
            entries = geo.lines * nseg

        def span(view: TensorRef | None) -> tuple[tuple[int, int], tuple[int, int]]:
            if view is None:
                return (0, 0), (0, 0)
            elements = flat_span(geo.shape, view.strides)
            return (0, elements), (0, elements * view.itemsize // 8)

        (x_flat, x_words), (y_flat, y_words) = span(x), span(y)
        args = [x_flat, x_words, y_words, y_flat, span(indices)[0], (0, entries),
                (0, entries), geo.lines, extent, pitches[0], pitches[1], pitches[2],
                seg_len, nseg, 0, reverse, vec, indices is not None,
                with_bf16(code, self.descriptor.element)]
        warps = FAST_ROWS_BLOCK // 32
        grid = min(-(-geo.lines * nseg // warps), _SIM_GRID if SIMULATOR else _MAX_GRID)
        launches = []
        for phase in ((1, 2) if nseg > 1 else (0,)):
            args[14] = phase
            launches.append(kernels.rows.bind(grid, FAST_ROWS_BLOCK, tuple(args)))
        return launches, offset_a, offset_b

    def _bind_fast(self, fast: FastKernels, code: int, reverse: bool, x: TensorRef,
                   y: TensorRef, aligned: bool, with_workspace: bool
                   ) -> tuple[list[Any], Callable[[int, int], None] | None, bool]:
        """Bound launches of the fast kernel for one layout (an empty list: not eligible),
        the chained split's ``zero(stream, workspace_ptr)`` that must run before them (None:
        not chained), and whether the kernel is rows_fast."""
        geo = self._geometry
        layout = _collapse(geo.shape, geo.axis, (x.strides, y.strides))
        if layout is None:
            return [], None, False
        (x_outer, x_step), (y_outer, y_step) = layout
        per_word = fast.per_word
        extent, inner = geo.extent, geo.inner

        def span(view: TensorRef) -> tuple[tuple[int, int], tuple[int, int]]:
            elements = flat_span(geo.shape, view.strides)
            return (0, elements), (0, elements * view.itemsize // 8)

        (x_flat, x_words), (y_flat, y_words) = span(x), span(y)
        if inner == 1 and extent >= _ROWS_MIN_EXTENT and x_step == 1 and y_step == 1:
            vec = aligned and x_outer % per_word == 0 and y_outer % per_word == 0 and \
                (not reverse or extent % per_word == 0)
            nseg = geo.fast_rows_nseg if with_workspace else 1
            seg_len, nseg = geo.fast_segments(nseg, fast.tile)
            entries = geo.lines * nseg if nseg > 1 else 0
            chained = fast.chained and nseg > 1
            # one view of the workspace in use, the other of extent 0 (the simulator copies
            # views back: two overlapping ones would undo each other's stores)
            ws = (0, 0 if chained else entries)
            chain = (0, 1 + entries if chained else 0)
            args = [x_flat, x_words, y_words, y_flat, ws, chain, geo.lines, extent, x_outer,
                    y_outer, seg_len, nseg, 0, reverse, vec,
                    with_bf16(code, self.descriptor.element)]
            warps = FAST_ROWS_BLOCK // 32
            grid = min(-(-geo.lines * nseg // warps), _SIM_GRID if SIMULATOR else _MAX_GRID)
            if chained:
                args[12] = PHASE_CHAINED
                return [fast.rows.bind(grid, FAST_ROWS_BLOCK, tuple(args))], \
                    _zero_bytes(geo.chain_bytes(entries)), True
            kernel, block, phase_at = fast.rows, FAST_ROWS_BLOCK, 12
        elif inner >= _FAST_MIN_INNER:
            vec = aligned and all(v % per_word == 0 for v in (x_outer, x_step, y_outer,
                                                                y_step))
            nseg = geo.fast_cols_nseg if with_workspace else 1
            chunks = geo.fast_chunks
            seg_len, nseg = geo.fast_segments(nseg, chunks * fast.col_rows)
            ws = (0, geo.lines * nseg if nseg > 1 else 0)
            args = [x_flat, x_words, y_words, y_flat, ws, geo.outer, extent, inner, x_outer,
                    x_step, y_outer, y_step, seg_len, nseg, 0, reverse, vec,
                    with_bf16(code, self.descriptor.element)]
            work = geo.outer * -(-inner // (32 * per_word)) * nseg
            grid = min(work, _SIM_GRID if SIMULATOR else _MAX_GRID)
            kernel, block, phase_at = fast.cols, (32, chunks), 14
        else:
            return [], None, False
        launches = []
        for phase in ((1, 2) if nseg > 1 else (0,)):
            args[phase_at] = phase
            launches.append(kernel.bind(grid, block, tuple(args)))
        return launches, None, kernel is fast.rows

    def _bind(self, kernels: ScanKernels, code: int, reverse: bool,
              operands: list[TensorRef], indices: TensorRef | None,
              with_workspace: bool) -> tuple[list[Any], int, int]:
        """Kernel choice, geometry and every argument but the pointers for one layout."""
        geo = self._geometry
        axis = geo.axis
        shape = geo.shape
        in0, in1, in2, out = operands
        # Outer axes ordered by the output's stride, largest first, so consecutive lines
        # (consecutive threads of the lines kernel) are neighbours in the output.
        outer_axes = [a for a in range(len(shape)) if a != axis]
        outer_axes.sort(key=lambda a: -out.strides[a])
        outer_shape = pad8(tuple(shape[a] for a in outer_axes), 1)

        def outer(view: TensorRef | None) -> tuple[int, ...]:
            if view is None:
                return (0,) * 8
            return pad8(tuple(view.strides[a] for a in outer_axes), 0)

        def flat(view: TensorRef | None) -> tuple[int, int]:
            if view is None:
                return (0, 0)
            return (0, flat_span(shape, view.strides))

        use_rows = geo.extent >= _ROWS_MIN_EXTENT and out.strides[axis] == 1
        kernel = kernels.rows if use_rows else kernels.lines
        nseg = geo.rows_nseg if use_rows else geo.lines_nseg
        if not with_workspace:
            nseg = 1
        seg_len = -(-geo.extent // nseg)
        offset_a = offset_b = -1
        if nseg > 1:
            offset_a, offset_b, _ = geo._workspace_layout(geo.lines * nseg)
            entries = geo.lines * nseg
            ws_a = ws_b = (0, entries)
        else:
            ws_a = ws_b = (0, 0)
        args = [flat(in0), flat(in1), flat(in2), flat(out), flat(indices), ws_a, ws_b,
                geo.lines, geo.extent, seg_len, nseg, 0, outer_shape, outer(in0),
                outer(in1), outer(in2), outer(out), outer(indices), in0.strides[axis],
                in1.strides[axis], in2.strides[axis], out.strides[axis],
                indices.strides[axis] if indices is not None else 0, reverse,
                indices is not None, with_bf16(code, self.descriptor.element)]
        if use_rows:
            block: int | tuple[int, int] = ROWS_BLOCK
            work = geo.lines * nseg
        else:
            block = (geo.lanes, geo.chunks)
            work = -(-geo.lines // geo.lanes) * nseg
            args.append(-(-seg_len // geo.chunks))
        grid = min(work, _SIM_GRID if SIMULATOR else _MAX_GRID)
        launches = []
        for phase in ((1, 2) if nseg > 1 else (0,)):
            args[11] = phase
            launches.append(kernel.bind(grid, block, tuple(args)))
        return launches, offset_a, offset_b


class ScanPlan(_ScanLauncher):
    """See the module docstring."""

    name = "ScanPlan"
    _elements = SCAN_FORWARD_ELEMENTS

    @classmethod
    def select(cls, desc: ScanDescriptor, pref: PlanPreference | None = None) -> ScanPlan:
        cls._check(desc)
        return cls(desc, pref)

    def __init__(self, desc: ScanDescriptor, pref: PlanPreference | None) -> None:
        self._setup(desc, pref, backward=False)

    def can_implement(self, args: ScanArgs) -> tuple[TensorRef, TensorRef, TensorRef | None]:
        """Views of ``x``, ``y`` and ``indices`` after checking dtype, shape and layout."""
        desc = self.descriptor
        shape = desc.input_shape
        x = as_ref(args.x, self.name, "x", desc.element, shape)
        y = as_mut(args.y, self.name, "y", desc.element, shape)
        indices = None
        if args.indices is not None:
            if desc.kind not in (ScanKind.CUMMAX, ScanKind.CUMMIN):
                fail(self.name, InvalidProblem, "indices",
                     f"is only produced by Cummax/Cummin, not {desc.kind.name}")
            indices = as_mut(args.indices, self.name, "indices", ElementKind.I64, shape)
            if _overlaps(indices, y) or _overlaps(indices, x):
                fail(self.name, InvalidProblem, "indices", "must not overlap x or y")
        return x, y, indices

    def layout_launch(self, args: ScanArgs, workspace: Any = None
                      ) -> Callable[..., None] | None:
        """``launch(stream_handle, x_ptr, y_ptr, indices_ptr, workspace_ptr)``: see
        :meth:`Plan.layout_launch`."""
        hit = self._memo.lookup((args.x, args.y, args.indices, workspace))[1]
        return None if hit is None else hit[0]

    def run(self, args: ScanArgs, stream: Any = None, workspace: Any = None) -> None:
        """Write the scan of ``x`` to ``y`` (and ``indices``) on ``stream``; no host sync.

        Torch or CuPy arrays of a layout seen before (the workspace's too) skip the array
        checks (``LayoutMemo``; the no-overlap checks of ``indices`` still run per call)."""
        memo_key = self._memo.launch(stream, None, args.x, args.y, args.indices, workspace)
        if memo_key is LAUNCHED:
            return
        x, y, indices = self.can_implement(args)
        handle = stream_handle(stream)
        ws = self._workspace_ptr(workspace)
        if self._geometry.numel == 0:
            return
        desc = self.descriptor
        calls = self._calls(self._forward, int(desc.kind), desc.reverse, (x,), y, indices, ws)
        self._remember(memo_key, calls, (x, y, indices), ws)
        _launch(handle, calls)


class ScanBackwardPlan(_ScanLauncher):
    """See the module docstring."""

    name = "ScanBackwardPlan"
    _elements = SCAN_BACKWARD_ELEMENTS

    @classmethod
    def select(cls, desc: ScanBackwardDescriptor,
               pref: PlanPreference | None = None) -> ScanBackwardPlan:
        cls._check(desc)
        return cls(desc, pref)

    def __init__(self, desc: ScanBackwardDescriptor, pref: PlanPreference | None) -> None:
        self._setup(desc, pref, backward=True)

    def can_implement(self, args: ScanBackwardArgs
                      ) -> tuple[TensorRef, TensorRef, TensorRef | None, TensorRef | None]:
        """Views of ``dy``, ``dx``, ``x``, ``y``; the saved tensors the kind needs must be
        given (InvalidProblem naming the missing one)."""
        desc = self.descriptor
        shape, element, kind = desc.input_shape, desc.element, desc.kind
        dy = as_ref(args.dy, self.name, "dy", element, shape)
        dx = as_mut(args.dx, self.name, "dx", element, shape)
        x = y = None
        if kind in _NEEDS_X:
            if args.x is None:
                fail(self.name, InvalidProblem, "x",
                     f"(the saved forward input) is required for {kind.name} backward")
            x = as_ref(args.x, self.name, "x", element, shape)
        if kind in _NEEDS_Y:
            if args.y is None:
                fail(self.name, InvalidProblem, "y",
                     f"(the saved forward output) is required for {kind.name} backward")
            y = as_ref(args.y, self.name, "y", element, shape)
        for arg, view in (("dy", dy), ("x", x), ("y", y)):
            if view is not None and (arg != "dy" or kind is not ScanKind.CUMSUM) \
                    and _overlaps(dx, view):
                fail(self.name, InvalidProblem, "dx", f"must not overlap {arg}")
        return dy, dx, x, y

    def run(self, args: ScanBackwardArgs, stream: Any = None, workspace: Any = None) -> None:
        """Write the gradient of the forward scan to ``dx`` on ``stream``; no host sync.

        Torch or CuPy arrays of a layout seen before (the workspace's too) skip the array
        checks (``LayoutMemo``; the no-overlap checks of ``dx`` still run per call)."""
        needs_x, needs_y = self._saved
        memo_key = self._memo.launch(stream, None, args.dy, args.dx,
                                     args.x if needs_x else None,
                                     args.y if needs_y else None, workspace)
        if memo_key is LAUNCHED:
            return
        dy, dx, x, y = self.can_implement(args)
        handle = stream_handle(stream)
        ws = self._workspace_ptr(workspace)
        if self._geometry.numel == 0:
            return
        calls = self._backward_calls(dy, dx, x, y, ws)
        self._remember(memo_key, calls, (dy, dx, x, y), ws)
        _launch(handle, calls)

    def _backward_calls(self, dy: TensorRef, dx: TensorRef, x: TensorRef | None,
                        y: TensorRef | None, ws: int | None) -> _Calls:
        desc = self.descriptor
        kind = desc.kind
        backward_reverse = not desc.reverse
        if kind is ScanKind.CUMSUM:
            return self._calls(self._forward, CODE_CUMSUM, backward_reverse, (dy,), dx, None,
                               ws)
        assert self._backward is not None and x is not None
        if kind in (ScanKind.CUMMAX, ScanKind.CUMMIN):
            if self._extremum_backward is not None:
                calls = self._extremum_backward_calls(desc.reverse, x, dy, dx, ws)
                if calls:
                    return calls
            # other layouts: a pre-pass writes dx <- 1 at records of the forward scan
            # (where the index output changes), else 0
            flag = CODE_CUMMAX_RECORD_FLAG if kind is ScanKind.CUMMAX \
                else CODE_CUMMIN_RECORD_FLAG
            return (self._calls(self._forward, flag, desc.reverse, (x,), dx, None, ws)
                    + self._calls(self._backward, CODE_EXTREMUM_BACKWARD, backward_reverse,
                                  (dy, dx, dx), dx, None, ws))
        assert y is not None
        return self._calls(self._backward, int(kind), backward_reverse, (dy, x, y), dx, None,
                           ws)
