"""ReduceBackwardPlan: the gradient's validation, kernel choice and launch (statistic pass,
tie count after dx, register-resident and hold kernels, the Prod zero fix-up).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..._runtime import SIMULATOR
from ...arrays import TensorMut, TensorRef, as_mut, as_ref, flat_span
from ...driver import memset_d8_async
from ...errors import InvalidProblem
from ...kernels.common import pad8
from ...kernels.reduce import (
    BROADCAST_UNITS,
    FLAG_LINE_BLOCKS,
    GRAD_KERNEL_KIND,
    HOLD_POLL_SLOTS,
    HOLD_STASH_BYTES,
    REDUCE_BACKWARD_BROADCAST_KERNELS,
    REDUCE_BACKWARD_COLS_REWRITE_KERNELS,
    REDUCE_BACKWARD_COLS_STASH_KERNELS,
    REDUCE_BACKWARD_COLS_STRIP_KERNELS,
    REDUCE_BACKWARD_COLS_VEC_KERNELS,
    REDUCE_BACKWARD_KERNELS,
    REDUCE_BACKWARD_PROD_ZEROS_KERNELS,
    REDUCE_BACKWARD_ROWS_HOLD_STASH_KERNELS,
    REDUCE_BACKWARD_ROWS_REG_KERNELS,
    REDUCE_BACKWARD_ROWS_VEC_KERNELS,
    REDUCE_KERNELS,
    REG_COLS_STASH_BYTES,
    STREAM_GRAD_KINDS,
    SYNC_BLOCK,
    TIES,
    VECTOR,
    grad_flags,
)
from ...launch import Kernel
from ...streams import stream_handle
from ...types import (
    ArchSku,
    BackendKind,
    ElementKind,
    KernelSku,
    OpCategory,
    PlanPreference,
    ReduceKind,
)
from ..base import LAUNCHED, LayoutMemo, Plan, fail, product
from .forward import (
    _CACHE_LIMIT,
    MEAN_STAT,
    ReduceBackwardArgs,
    ReduceBackwardDescriptor,
    _bind_merge,
    _bind_reduce,
    _ReduceLaunch,
)
from .geometry import (
    _BROADCAST_BLOCK,
    _BROADCAST_COL_BLOCK,
    _BROADCAST_MIN_COL_BYTES,
    _MIN_ROW_LANES,
    _STORE_ONLY_SHORT,
    BLOCK,
    BROADCAST,
    BROADCAST_MIN_X_ROW_BYTES,
    BROADCAST_X_COL_BYTES,
    COLS,
    GENERIC,
    HOLD_ROWS_IN_FLIGHT,
    HOLD_TIES_ROWS_IN_FLIGHT,
    MAX_GRID_X,
    REDUCE_BACKWARD_ELEMENTS,
    REDUCE_KINDS,
    REG,
    REG_COLS,
    REG_STREAM_MIN_LANES,
    ROWS,
    STREAM_MIN_BATCHES,
    STREAM_TARGET_BLOCKS,
    SYNC,
    VEC_TARGET_BLOCKS,
    _check_common,
    _check_correction,
    _collapse,
    _fused_rows_vec_geometry,
    _Geometry,
    _guarantee,
    _stash_fits,
    _tie_cols_geometry,
    _tie_slots,
    _word_access,
    cols_reg_layout,
    cols_vec_geometry,
    generic_geometry,
    max_workspace,
    problem_layout,
    reg_lanes,
    rows_vec_geometry,
    short_rows_geometry,
    sync_layout,
)

# ---------------------------------------------------------------------------------------
# The gradient


#: Blocks of the column tie count's rewrite pass (two in the simulator: each block walks
#: every other split there, so the tests take the GPU's split step, not only its loop). Half
#: a wave of blocks. (Measurements: docs/design/reduce.md, "Measured constants".)
#: Lines at least this long take the Prod fix-up's block per line (FLAG_LINE_BLOCKS).
_LINE_BLOCK_MIN_EXTENT = 1024
_TIE_REWRITE_BLOCKS = 2 if SIMULATOR else VEC_TARGET_BLOCKS // 2


@dataclass(frozen=True)
class _TieCount:
    """The Max/Min gradient's tie count taken after dx (ROWS and COLS word layouts with a
    workspace): the gradient's first pass (mode 2) writes dx with every count taken as 1
    and counts the ties; ``rewrite`` (the gradient in mode 3) rewrites the lines whose
    count is not 1. ROWS: the first pass writes each split's count and ``merge`` (fast
    launcher) sums them into workspace slots ``[0, out_numel)``. COLS (``merge`` None):
    the first pass adds its counts into those slots, ``zero_bytes`` zeroed before it."""

    merge: Any
    rewrite: Any
    zero_bytes: int = 0


@dataclass(frozen=True)
class _SyncLaunch:
    """The hold gradient (SYNC): its bound launch (``fast``: stream and pointers) and the
    bytes of workspace it uses (the ticket, then the chunk partials), zeroed before each
    launch."""

    fast: Any
    ctl_bytes: int


def _gradient_runner(launch: tuple[Any, Any]) -> Any:
    """``runner(stream, dy_ptr, dx_ptr, x_ptr, y_ptr, ws_ptr)`` (0 for an absent x, y or
    workspace): the statistic pass if the layout has one, then the gradient launch with
    its pointers."""
    stat, (access, gradient) = launch
    bound = gradient.fast
    if isinstance(stat, _TieCount):
        merge, rewrite, zero_bytes = stat.merge, stat.rewrite, stat.zero_bytes
        if access == ROWS:
            def ties(handle: int, dy_ptr: int, dx_ptr: int, x_ptr: int,
                     y_ptr: int, ws_ptr: int) -> None:
                pointers = (dy_ptr, x_ptr, x_ptr & ~7, y_ptr, dx_ptr, dx_ptr & ~7, 0, ws_ptr)
                bound(handle, *pointers)
                merge(handle, 0, 0, 0, ws_ptr, 0)
                rewrite(handle, *pointers)
            return ties

        def col_ties(handle: int, dy_ptr: int, dx_ptr: int, x_ptr: int,
                     y_ptr: int, ws_ptr: int) -> None:
            pointers = (dy_ptr, x_ptr, y_ptr, dx_ptr, dx_ptr, 0, ws_ptr)
            memset_d8_async(ws_ptr, 0, zero_bytes, handle)
            bound(handle, *pointers)
            rewrite(handle, *pointers)
        return col_ties
    if access == SYNC:
        ctl_bytes = gradient.ctl_bytes

        def sync(handle: int, dy_ptr: int, dx_ptr: int, x_ptr: int,
                 y_ptr: int, ws_ptr: int) -> None:
            memset_d8_async(ws_ptr, 0, ctl_bytes, handle)
            bound(handle, dy_ptr, x_ptr, y_ptr, dx_ptr, dx_ptr, ws_ptr, ws_ptr + 8)
        return sync
    if stat is None:  # one launch: its argument list, as one small function per access
        if access == BROADCAST:
            def broadcast(handle: int, dy_ptr: int, dx_ptr: int, x_ptr: int,
                          y_ptr: int, ws_ptr: int) -> None:
                bound(handle, dy_ptr, y_ptr, x_ptr, dx_ptr)
            return broadcast
        if access == ROWS:
            def rows(handle: int, dy_ptr: int, dx_ptr: int, x_ptr: int,
                     y_ptr: int, ws_ptr: int) -> None:
                bound(handle, dy_ptr, x_ptr, x_ptr & ~7, y_ptr, dx_ptr, dx_ptr & ~7, 0, 0)
            return rows
        if access in (REG, REG_COLS):
            def reg(handle: int, dy_ptr: int, dx_ptr: int, x_ptr: int,
                    y_ptr: int, ws_ptr: int) -> None:
                bound(handle, dy_ptr, x_ptr, y_ptr, dx_ptr, dx_ptr)
            return reg

    def runner(handle: int, dy_ptr: int, dx_ptr: int, x_ptr: int,
               y_ptr: int, ws_ptr: int) -> None:
        stat_acc = stat_k = 0
        if stat is not None:
            stat_acc, stat_k = stat(handle, x_ptr, 0, ws_ptr, y_ptr)
        if access == ROWS:  # elements and the same bytes as words (x and dx share a phase)
            bound(handle, dy_ptr, x_ptr, x_ptr & ~7, y_ptr, dx_ptr, dx_ptr & ~7, stat_acc,
                  stat_k)
        elif access in (REG, REG_COLS):  # x as words, dx as elements and words (aligned)
            bound(handle, dy_ptr, x_ptr, y_ptr, dx_ptr, dx_ptr)
        elif access == COLS:  # x as (aligned) words, dx as elements and words
            bound(handle, dy_ptr, x_ptr, y_ptr, dx_ptr, dx_ptr, stat_acc, stat_k)
        else:
            bound(handle, dy_ptr, x_ptr, y_ptr, dx_ptr, stat_acc, stat_k)

    return runner


def _with_zero_fixup(runner: Any, fixup: Any) -> Any:
    """``runner`` followed by the Prod gradient's fix-up of the lines whose product is 0."""
    def prod_runner(handle: int, dy_ptr: int, dx_ptr: int, x_ptr: int,
                    y_ptr: int, ws_ptr: int) -> None:
        runner(handle, dy_ptr, dx_ptr, x_ptr, y_ptr, ws_ptr)
        fixup(handle, dy_ptr, x_ptr, y_ptr, dx_ptr)
    return prod_runner


def _dx_words(view: tuple[int, int]) -> tuple[int, int]:
    """The word view of ``dx``. The simulator copies every kernel array in and back out on
    its own, so a second writable view of ``dx`` would write stale data back over the
    first: there the kernels store words through ``dx`` (``VectorSpec.store_word``) and
    get an empty word view."""
    return (0, 0) if SIMULATOR else view


class ReduceBackwardPlan(Plan):
    """See the module docstring."""

    name = "ReduceBackwardPlan"

    @classmethod
    def select(cls, desc: ReduceBackwardDescriptor,
               pref: PlanPreference | None = None) -> ReduceBackwardPlan:
        _check_common(cls, desc.kind, REDUCE_KINDS, desc.input_shape, desc.reduce_axis,
                      desc.element, REDUCE_BACKWARD_ELEMENTS)
        _check_correction(cls, desc.correction)
        extent = desc.input_shape[desc.reduce_axis]
        if extent == 0 and desc.kind in (ReduceKind.MAX, ReduceKind.MIN):
            fail(cls.name, InvalidProblem, "input_shape",
                 f"[{desc.reduce_axis}] = 0: {desc.kind.name} of an empty axis is undefined")
        return cls(desc, pref)

    def __init__(self, desc: ReduceBackwardDescriptor, pref: PlanPreference | None) -> None:
        kind = desc.kind
        shape = desc.input_shape
        self._shape = shape
        self._axis = desc.reduce_axis
        self._extent = extent = shape[desc.reduce_axis]
        self._out_shape = desc.dy_shape()
        self._out_numel = product(self._out_shape)
        self._numel = product(shape)
        grad_kind = GRAD_KERNEL_KIND.get(kind, kind)
        self._kernel = REDUCE_BACKWARD_KERNELS[(grad_kind, desc.element)]
        self._needs_saved = kind not in (ReduceKind.SUM, ReduceKind.MEAN)
        if kind is ReduceKind.MEAN:
            self._param = float(extent)
        elif kind in (ReduceKind.VAR, ReduceKind.STD):
            dof = extent - desc.correction
            self._param = 2.0 / dof if dof else float("inf")
        else:
            self._param = 1.0
        #: the gradient kernels' last argument (bf16 of a half kernel, Std of Var's)
        self._flags = grad_flags(kind, desc.element)
        self._stat_kind = {ReduceKind.MAX: TIES, ReduceKind.MIN: TIES,
                           ReduceKind.VAR: MEAN_STAT, ReduceKind.STD: MEAN_STAT}.get(kind)
        # without a statistic nothing merges the splits of the word kernels' lines
        self._stream_split = {"target": STREAM_TARGET_BLOCKS,
                              "min_batches": STREAM_MIN_BATCHES} \
            if self._stat_kind is None else {}
        self._launches: dict[Any, tuple[_ReduceLaunch | None, Any]] = {}
        # (dy, dx, x, y, workspace) layout key -> gradient runner (run fast path)
        self._memo = LayoutMemo(5)
        workspace = 0
        self._max_splits = 1
        if self._stat_kind is not None and self._numel:
            self._stat_kernel = REDUCE_KERNELS[(self._stat_kind, desc.element)]
            limit = 1 << 30
            if pref is not None and pref.max_workspace_bytes is not None:
                limit = 1
                while limit < 65535 and max_workspace(self._stat_kind, desc.element,
                                                      self._out_numel, extent, limit * 2)[1] \
                        <= pref.max_workspace_bytes:
                    limit *= 2
            self._max_splits, workspace = max_workspace(self._stat_kind, desc.element,
                                                        self._out_numel, extent, limit)
            if pref is not None and pref.max_workspace_bytes is not None \
                    and workspace > pref.max_workspace_bytes:
                # no room for the statistic pass: the fused single-pass gradient
                self._max_splits, workspace = 1, 0
        # the tie count after dx (Max/Min word layouts): split counts and tie masks
        self._tie_slots = 0
        if self._stat_kind is TIES and self._numel and desc.element in VECTOR:
            slots = _tie_slots(self._out_numel, extent, VECTOR[desc.element].width,
                               self._max_splits)
            if pref is None or pref.max_workspace_bytes is None \
                    or slots * 8 <= pref.max_workspace_bytes:
                self._tie_slots = slots
                workspace = max(workspace, slots * 8)
        # the hold kernel of long Var/Std and Max/Min rows (its ticket and chunk partials)
        self._sync: tuple[int, int] | None = None
        #: the hold kernel (x read once): None = where the device holds
        #: HOLD_ROWS_IN_FLIGHT (Max/Min: HOLD_TIES_ROWS_IN_FLIGHT) rows' chunks at once,
        #: True = where it holds twice a row's chunks (the least that cannot deadlock),
        #: False = never
        self.row_hold: bool | None = None
        #: the gradients without a statistic: the broadcast kernel where it applies
        #: (``_bind_broadcast``); set before the first ``run``
        self.broadcast = True
        #: the broadcast's rules for the kinds that read x (``_bind_broadcast``): rows
        #: longer than this many bytes, columns of these element widths; set before the
        #: first ``run`` (a test sets them to take it everywhere)
        self.broadcast_min_x_row_bytes = BROADCAST_MIN_X_ROW_BYTES
        self.broadcast_x_col_bytes: tuple[int, ...] = BROADCAST_X_COL_BYTES
        #: the register-resident row gradient (REG) where a row fits a block; False =
        #: never (the hold and word kernels take those rows); set before the first ``run``
        self.register_rows = True
        if self._stat_kind is not None and self._numel and desc.element in VECTOR:
            layout = sync_layout(self._out_numel, extent, VECTOR[desc.element].width)
            if pref is None or pref.max_workspace_bytes is None \
                    or layout[1] <= pref.max_workspace_bytes:
                self._sync = layout
                workspace = max(workspace, layout[1])
        sku = KernelSku(OpCategory.REDUCTION, int(kind), desc.element, None, None, None,
                        ArchSku.SM80, BackendKind.BESPOKE, _guarantee(desc.element))
        super().__init__(desc, sku, pref, workspace)
        #: Prod: the exact gradient of lines holding zeros (``_bind_prod_zeros``)
        self._zero_fixup = REDUCE_BACKWARD_PROD_ZEROS_KERNELS[(kind, desc.element)] \
            if kind is ReduceKind.PROD and self._numel else None
        self._zero_fixups: dict[Any, Any] = {}
        #: the layout of the last run's gradient launch (GENERIC, ROWS, COLS, REG,
        #: REG_COLS, SYNC or BROADCAST; None before the first run): what tests and
        #: benchmarks read, never set
        self.choice: str | None = None
        if self._numel:
            self._kernel.prepare()
            if self._stat_kind is not None:
                self._stat_kernel.prepare()
            if self._zero_fixup is not None:
                self._zero_fixup.prepare()

    def can_implement(self, args: ReduceBackwardArgs) -> tuple[TensorRef, TensorMut,
                                                               TensorRef | None,
                                                               TensorRef | None]:
        """Views of ``dy``, ``dx``, ``x``, ``y``; x and y must be given unless Sum/Mean."""
        element = self.descriptor.element
        dy = as_ref(args.dy, self.name, "dy", element, self._out_shape)
        dx = as_mut(args.dx, self.name, "dx", element, self._shape)
        x = y = None
        if self._needs_saved:
            kind = self.descriptor.kind.name
            if args.x is None:
                fail(self.name, InvalidProblem, "x", f"is None; the {kind} gradient needs "
                     "the saved forward input")
            if args.y is None:
                fail(self.name, InvalidProblem, "y", f"is None; the {kind} gradient needs "
                     "the saved forward output")
            x = as_ref(args.x, self.name, "x", element, self._shape)
            y = as_ref(args.y, self.name, "y", element, self._out_shape)
        return dy, dx, x, y

    def run(self, args: ReduceBackwardArgs, stream: Any = None, workspace: Any = None) -> None:
        """Write ``args.dx`` on ``stream`` (no host sync). ``workspace``: a contiguous
        buffer of at least ``workspace_size`` bytes where that is not 0 (else
        ``WorkspaceTooSmall(needed, got)`` before anything is launched).

        Torch or CuPy arrays of a layout seen before (the workspace's too) skip the array
        checks (``LayoutMemo``)."""
        if self._needs_saved:  # as can_implement
            memo_key = self._memo.launch(stream, None, args.dy, args.dx, args.x, args.y,
                                         workspace)
        else:
            memo_key = self._memo.launch(stream, None, args.dy, args.dx, None, None, workspace)
        if memo_key is LAUNCHED:
            return
        ws_ptr = self.check_workspace(workspace)  # WorkspaceTooSmall before anything runs
        dy, dx, x, y = self.can_implement(args)
        handle = stream_handle(stream)
        if self._numel == 0:
            return
        key = (dy.strides, dx.strides, x.strides if x is not None else None,
               y.strides if y is not None else None, ws_ptr != 0, dx.ptr & 15,
               x.ptr & 15 if x is not None else 0)
        launch = self._launches.get(key)
        if launch is None:
            launch = self._bind(dy, dx, x, y, ws_ptr != 0)
            if len(self._launches) >= _CACHE_LIMIT:
                self._launches.clear()
                self._zero_fixups.clear()
            self._launches[key] = launch
            if self._zero_fixup is not None:
                assert x is not None and y is not None
                self._zero_fixups[key] = self._bind_prod_zeros(dy, dx, x, y)
        self.choice = launch[1][0]
        runner = _gradient_runner(launch)
        if self._zero_fixup is not None:
            runner = _with_zero_fixup(runner, self._zero_fixups[key])
        self._memo.store(memo_key, runner, (0, 0, 0, 0, 0))
        runner(handle, dy.ptr, dx.ptr, x.ptr if x is not None else 0,
               y.ptr if y is not None else 0, ws_ptr)

    @property
    def hold_layout(self) -> tuple[int, int] | None:
        """``(parts of a row, workspace bytes)`` of the hold gradient (SYNC:
        ``geometry.sync_layout``), or None where this plan has no hold layout (no
        statistic, not a word element, or no room in ``max_workspace_bytes``)."""
        return self._sync

    def bound_launches(self) -> dict[Any, tuple[Any, tuple[str, Any]]]:
        """The launches bound so far (a copy), keyed by layout ``(dy, dx, x, y strides,
        with workspace, dx.ptr & 15, x.ptr & 15)``: ``(statistic launch or tie count or
        None, (access, gradient launch))``, the gradient a
        :class:`~baracuda_numba.launch.BoundLaunch` (SYNC: its ``fast`` call and
        workspace bytes). What tests and benchmarks read; ``choice`` is the last one's
        access."""
        return dict(self._launches)

    def bind_choice(self, args: ReduceBackwardArgs, with_workspace: bool = False) -> str:
        """The access (GENERIC, ROWS, COLS, REG, REG_COLS, SYNC or BROADCAST) that ``run``
        would take for ``args`` (and a workspace or not), binding its launches but
        launching nothing and caching nothing."""
        dy, dx, x, y = self.can_implement(args)
        return self._bind(dy, dx, x, y, with_workspace)[1][0]

    def _bind(self, dy: TensorRef, dx: TensorMut, x: TensorRef | None, y: TensorRef | None,
              with_workspace: bool) -> tuple[_ReduceLaunch | None, Any]:
        """The launches for a layout: for Max/Min/Var/Std either the fused gradient (the
        kernel reduces each row's statistic itself: no workspace, or enough rows to fill
        the GPU without splitting the axis) or the statistic pass into the workspace
        followed by the (split) gradient."""
        axis = self._axis
        extent = self._extent
        element = self.descriptor.element
        row_layout = dx.strides[axis] == 1 and extent > 1
        zeros = (0,) * len(self._shape)
        strides = [dx.strides, x.strides if x is not None else zeros,
                   y.strides if y is not None else zeros, dy.strides]
        out_shape, out_strides = _collapse(self._shape, axis, strides)
        if self._stat_kind is None and self.broadcast and element in VECTOR \
                and len(out_shape) <= 1:
            broadcast = self._bind_broadcast(dy, dx, x, y, out_strides)
            if broadcast is not None:
                return None, (BROADCAST, broadcast)
        access = GENERIC
        if x is None or (x.strides == dx.strides and (x.ptr - dx.ptr) % 8 == 0):
            pointers = (dx.ptr,) if x is None else (dx.ptr, x.ptr)
            access = _word_access(element, None, extent, row_layout, out_shape, out_strides,
                                  dx.strides[axis], pointers)
            if access == COLS and self._stat_kind is not None:
                width = VECTOR[element].width
                out_words = self._out_numel // width
                cols_reg = cols_reg_layout(extent, width, out_words=out_words)
                if cols_reg is not None and (cols_reg[3] or _stash_fits(
                        self.descriptor.kind, element)):
                    log2_cw, block, stash, strip = cols_reg
                    return None, (REG_COLS, self._bind_reg(dy, dx, y, out_strides, log2_cw,
                                                           block, dx.strides[axis], stash,
                                                           strip))
                if not with_workspace:
                    access = GENERIC  # the column word kernel needs the workspace
        stream = self.descriptor.kind in STREAM_GRAD_KINDS
        if access == ROWS and (self._stat_kind is not None or stream):
            width = VECTOR[element].width
            lanes = reg_lanes(extent, width) if self.register_rows else 0
            whole_words = dx.ptr % 8 == 0 and extent % width == 0 and len(out_shape) <= 1 \
                and all(s % width == 0 for s in out_strides[0])
            if stream and lanes < REG_STREAM_MIN_LANES:
                lanes = 0
            if lanes and whole_words:
                return None, (REG, self._bind_reg(dy, dx, y, out_strides,
                                                  lanes.bit_length() - 1, BLOCK, None))
            if whole_words and with_workspace and self._sync is not None:
                sync = self._bind_sync(dy, dx, y, out_strides)
                if sync is not None:
                    return None, (SYNC, sync)
        shift = (dx.ptr & 7) // element.byte_width  # dx's (and x's) elements past a word
        if access == ROWS:
            width = VECTOR[element].width
            geometry = None
            if self._stat_kind is None:  # the kernel's short-row path (chunk_len 0)
                geometry = short_rows_geometry(self._out_numel, extent, width, out_shape,
                                               out_strides[0], shift,
                                               _STORE_ONLY_SHORT and not self._needs_saved)
            if geometry is None:
                geometry = rows_vec_geometry(self._out_numel, extent, width, 1 << 16,
                                             store_only=not self._needs_saved,
                                             **self._stream_split)
        elif access == COLS:
            geometry = cols_vec_geometry(self._out_numel, extent, VECTOR[element].width,
                                         1 << 16, **self._stream_split)
        else:
            # stores: at least one full 32-byte sector of a row per warp instruction.
            # (Measurements: docs/design/reduce.md, "Measured constants".)
            min_lanes = max(_MIN_ROW_LANES, 32 // element.byte_width)
            geometry = generic_geometry(self._out_numel, extent, row_layout, 1 << 16, min_lanes)
        stat: _ReduceLaunch | _TieCount | None = None
        mode = 0  # of the gradient kernel: 1 fused statistic, 2 tie count after dx
        if self._stat_kind is not None:
            assert x is not None and y is not None
            if access != COLS and (not with_workspace or geometry.splits == 1):
                mode = 1
                geometry = (_fused_rows_vec_geometry(self._out_numel, extent,
                                                     VECTOR[element].width) if access == ROWS
                            else generic_geometry(self._out_numel, extent, row_layout, 1,
                                                  min_lanes))
            elif self._stat_kind is TIES and access in (ROWS, COLS) and self._tie_slots:
                mode = 2
                width = VECTOR[element].width
                geometry = rows_vec_geometry(self._out_numel, extent, width,
                                             self._max_splits) if access == ROWS \
                    else _tie_cols_geometry(self._out_numel, extent, width)
            else:
                stat_problem = problem_layout(self._shape, axis, [x.strides, y.strides, y.strides],
                                              x.strides[axis] == 1, self._max_splits, element,
                                              self._stat_kind, x.ptr)
                stat = _bind_reduce(self._stat_kernel, self._stat_kind, element, x, None, y,
                                    stat_problem, extent, self._out_numel, True, 0.0,
                                    final=False)
        return self._bind_gradient(dy, dx, x, y, access, geometry, mode, stat, shift,
                                   out_shape, out_strides)

    def _bind_gradient(self, dy: TensorRef, dx: TensorMut, x: TensorRef | None,
                       y: TensorRef | None, access: str, geometry: _Geometry, mode: int,
                       stat: _ReduceLaunch | _TieCount | None, shift: int,
                       out_shape: tuple[int, ...], out_strides: list[tuple[int, ...]]
                       ) -> tuple[_ReduceLaunch | _TieCount | None, Any]:
        """The gradient kernel's launch of ``_bind`` once the access, geometry and mode
        (0 plain, 1 fused statistic, 2 tie count after dx) are chosen, with the launch
        of its statistic (``stat``, or the tie count's second pass)."""
        axis = self._axis
        extent = self._extent
        element = self.descriptor.element
        n_stat = (self._out_numel, 0, self._tie_slots)[mode]  # workspace slots used
        grid = (min(geometry.groups, MAX_GRID_X), geometry.splits)
        dy_view = (0, flat_span(dy.shape, dy.strides))
        x_view = (0, flat_span(x.shape, x.strides) if x is not None else 0)
        y_view = (0, flat_span(y.shape, y.strides) if y is not None else 0)
        dx_view = (0, flat_span(dx.shape, dx.strides))
        stat_views = ((0, n_stat if self._stat_kind is MEAN_STAT else 0),
                      (0, n_stat if self._stat_kind is TIES else 0))
        grad_kind = GRAD_KERNEL_KIND.get(self.descriptor.kind, self.descriptor.kind)
        if access == ROWS:
            words = (0, (dx_view[1] + shift) * element.byte_width // 8)
            x_words = (0, words[1] if x is not None else 0)
            words = _dx_words(words)
            dx_s, x_s, y_s, dy_s = [pad8(s, 0) for s in out_strides]
            args = (dy_view, x_view, x_words, y_view, dx_view, words, *stat_views,
                    self._out_numel, extent, pad8(out_shape, 1), dy_s, x_s, y_s, dx_s,
                    geometry.lanes, geometry.chunk_len, self._param, mode, shift, self._flags)
            kernel = REDUCE_BACKWARD_ROWS_VEC_KERNELS[(grad_kind, element)]
            if mode == 2:
                stat = self._tie_count(kernel, grid, args, geometry.splits)
            return stat, (ROWS, kernel.bind(grid, BLOCK, args))
        if access == COLS:
            width = VECTOR[element].width
            words = (0, dx_view[1] * element.byte_width // 8)
            args = (dy_view, (0, words[1] if x is not None else 0), y_view, dx_view,
                    _dx_words(words), *stat_views, self._out_numel, extent,
                    dx.strides[axis] // width, out_strides[3][0],
                    out_strides[2][0] if y is not None else 0, geometry.lanes,
                    geometry.chunk_len, self._param, mode, self._flags)
            kernel = REDUCE_BACKWARD_COLS_VEC_KERNELS[(grad_kind, element)]
            if mode == 2:
                stat = self._col_tie_count(
                    REDUCE_BACKWARD_COLS_REWRITE_KERNELS[(grad_kind, element)], grid, args,
                    geometry.splits)
            return stat, (COLS, kernel.bind(grid, BLOCK, args))
        gradient = self._kernel.bind(
            grid, BLOCK,
            (dy_view, x_view, y_view, dx_view, *stat_views, self._out_numel, extent,
             x.strides[axis] if x is not None else 0, dx.strides[axis], pad8(out_shape, 1),
             *[pad8(s, 0) for s in (out_strides[3], out_strides[1], out_strides[2],
                                    out_strides[0])],
             geometry.lanes, int(geometry.row_layout), geometry.chunk_len, self._param,
             mode, self._flags))
        return stat, (GENERIC, gradient)

    def _bind_prod_zeros(self, dy: TensorRef, dx: TensorMut, x: TensorRef,
                         y: TensorRef) -> Any:
        """The Prod fix-up's launch (``kernels.reduce.reduce_backward_prod_zeros``, fast
        launcher: stream, dy, x, y, dx), in any layout: a warp per 32 lines, or a block
        per line for lines of at least _LINE_BLOCK_MIN_EXTENT elements (there the check of
        ``y`` costs one block per line, little beside the gradient pass's reads)."""
        axis = self._axis
        out_shape, out_strides = _collapse(self._shape, axis, [dx.strides, x.strides,
                                                               y.strides, dy.strides])
        dx_s, x_s, y_s, dy_s = [pad8(s, 0) for s in out_strides]
        flags = self._flags
        if self._extent >= _LINE_BLOCK_MIN_EXTENT:
            flags |= FLAG_LINE_BLOCKS
            grid = min(self._out_numel, MAX_GRID_X)
        else:
            grid = min(-(-self._out_numel // BLOCK), MAX_GRID_X)  # 32 lines a warp
        views = [(0, flat_span(a.shape, a.strides)) for a in (dy, x, y, dx)]
        assert self._zero_fixup is not None
        return self._zero_fixup.bind(grid, BLOCK, (
            *views, self._out_numel, self._extent, x.strides[axis], dx.strides[axis],
            pad8(out_shape, 1), dy_s, x_s, y_s, dx_s, flags)).fast

    def _bind_broadcast(self, dy: TensorRef, dx: TensorMut, x: TensorRef | None,
                        y: TensorRef | None, out_strides: list[tuple[int,...]]) -> Any:
        """The broadcast kernel's launch (gradients without a statistic) for a C-contiguous,
        16-byte aligned ``dx`` (and ``x``, where read) whose units (16 bytes, K elements)
        each lie in one line: rows (the reduced axis last, its extent a multiple of K) or
        columns (nothing before the reduced axis; the trailing axes a multiple of K
        elements, at least _BROADCAST_MIN_COL_BYTES). The caller has collapsed the output
        positions to at most one dim (``_collapse``: ``out_strides`` [dx, x, y, dy]), so
        dy and y each step by one stride. None otherwise."""
        if dx.ptr % 16 or not dx.is_contiguous():
            return None
        if x is not None and (x.ptr % 16 or not x.is_contiguous()):
            return None
        element = self.descriptor.element
        shape, axis, extent = self._shape, self._axis, self._extent
        per_unit = 16 // element.byte_width
        inner = product(shape[axis + 1:])
        units = self._numel // per_unit
        kernel = REDUCE_BACKWARD_BROADCAST_KERNELS[
            (GRAD_KERNEL_KIND.get(self.descriptor.kind, self.descriptor.kind), element)]
        words = (0, self._numel * element.byte_width // 4)
        arrays = ((0, flat_span(dy.shape, dy.strides)),
                  (0, flat_span(y.shape, y.strides) if y is not None else 0),
                  words if x is not None else (0, 0), words)
        dy_stride, y_stride = (out_strides[3][0], out_strides[2][0]) if out_strides[0] \
            else (0, 0)
        if inner == 1:
            if extent % per_unit or (x is not None and extent * element.byte_width
                                     <= self.broadcast_min_x_row_bytes):
                return None
            line_units = extent // per_unit
            blocks = -(-units // (_BROADCAST_BLOCK * BROADCAST_UNITS))
            return kernel.bind(blocks, _BROADCAST_BLOCK,
                               (*arrays, units, line_units, 1.0 / line_units, 0, dy_stride,
                                y_stride, self._param, self._flags))
        if product(shape[:axis]) != 1 or inner % per_unit \
                or inner * element.byte_width < _BROADCAST_MIN_COL_BYTES \
                or (x is not None and element.byte_width not in self.broadcast_x_col_bytes):
            return None
        line_units = inner // per_unit
        # one wave: 8 blocks of 256 a SM where 1056 were launched but only 6 resident (34
        # registers, before the cap) left a third of a wave as a tail.
        # (Measurements: docs/design/reduce.md, "Measured constants".)
        wave = kernel.resident_blocks(_BROADCAST_COL_BLOCK) * _BROADCAST_COL_BLOCK
        threads = max(wave // line_units, 1) * line_units
        return kernel.bind(-(-threads // _BROADCAST_COL_BLOCK), _BROADCAST_COL_BLOCK,
                           (*arrays, units, line_units, 1.0 / line_units, threads,
                            dy_stride, y_stride, self._param, self._flags))

    def _tie_count(self, kernel: Any, grid: tuple[int, int], args: tuple[Any,...],
                   splits: int) -> _TieCount:
        """The tie count after dx of word rows: the merge of the ``splits`` tie counts per
        output and the rewrite pass (``args`` of the first pass with its mode, ``fused``,
        the third to last, = 3)."""
        rewrite = list(args)
        rewrite[-3] = 3
        out_numel = self._out_numel
        empty = (0, 0)
        zeros = pad8((), 0)
        common = (empty, empty, empty, (0, splits * out_numel), empty, out_numel,
                  self._extent, 0, pad8((out_numel,), 1), zeros, zeros, zeros, 1, 0, splits,
                  0)
        merge = _bind_merge(self._stat_kernel, common, out_numel, splits, False, 0.0)
        return _TieCount(merge.fast, kernel.bind(grid, BLOCK, tuple(rewrite)).fast)

    def _col_tie_count(self, kernel: Any, grid: tuple[int, int], args: tuple[Any,...],
                       splits: int) -> _TieCount:
        """The tie count after dx of the column word kernel: the first pass adds its counts
        up itself (no merge launch; its ``out_numel`` count slots zeroed before it), and the
        rewrite pass (``kernel``, the rewrite kernel, with the first pass's ``args`` and
        the mode, the second to last, = 3) takes about _TIE_REWRITE_BLOCKS blocks whatever the first
        pass's ``splits`` (its blocks loop over them)."""
        grid_y = max(1, min(splits, _TIE_REWRITE_BLOCKS // grid[0]))
        rewrite = kernel.bind((grid[0], grid_y), BLOCK, (*args[:-2], 3, args[-1]))
        return _TieCount(None, rewrite.fast, self._out_numel * 8)

    def _word_arrays(self, dy: TensorRef, dx: TensorMut, y: TensorRef | None,
                     out_strides: list[tuple[int,...]]) -> tuple[tuple[Any,...], int, int,
                                                                   int]:
        """The leading array arguments ``(dy, xv, y, dx, dxv)`` of the register-resident
        and hold gradients (x and dx in the same layout: x's words span dx's), and
        the output strides of dx, y and dy (one collapsed output dim at most)."""
        element = self.descriptor.element
        assert y is not None
        dx_view = (0, flat_span(dx.shape, dx.strides))
        words = (0, -(-dx_view[1] * element.byte_width // 8))
        dx_s, _, y_s, dy_s = [s[0] if s else 0 for s in out_strides]
        arrays = ((0, flat_span(dy.shape, dy.strides)), words,
                  (0, flat_span(y.shape, y.strides)), dx_view, _dx_words(words))
        return arrays, dx_s, y_s, dy_s

    def hold_kernel(self, grad_kind: ReduceKind, element: ElementKind,
                     parts: int) -> tuple[Kernel, int] | None:
        """``(kernel, grid)`` of the hold kernel for rows of ``parts`` parts, or None where
        it does not fit. Its chunks (two parts: registers and a shared-memory stash) wait
        for the rest of their row, so a row's chunks must all be resident: at most 1 /
        HOLD_ROWS_IN_FLIGHT (Max/Min: HOLD_TIES_ROWS_IN_FLIGHT) of the resident blocks,
        or half when forced (``row_hold``); one-chunk rows never wait. A thread reads at
        most HOLD_POLL_SLOTS of a row's part totals: ``parts`` <= HOLD_POLL_SLOTS *
        SYNC_BLOCK (512; the rules above allow far fewer on a device of 132 SMs unless
        ``row_hold`` forces the kernel)."""
        if self.row_hold is False or parts > HOLD_POLL_SLOTS * SYNC_BLOCK:
            return None
        in_flight = 2 if self.row_hold else HOLD_TIES_ROWS_IN_FLIGHT \
            if self._stat_kind is TIES else HOLD_ROWS_IN_FLIGHT
        kernel = REDUCE_BACKWARD_ROWS_HOLD_STASH_KERNELS[(grad_kind, element)].prepare()
        kernel.allow_dynamic_shared(HOLD_STASH_BYTES)
        resident = kernel.resident_blocks(SYNC_BLOCK, HOLD_STASH_BYTES)
        chunks = -(-parts // 2)
        if resident and (chunks == 1 or in_flight * chunks <= resident):
            return kernel, min(self._out_numel * chunks, resident)
        return None

    def _bind_sync(self, dy: TensorRef, dx: TensorMut, y: TensorRef | None,
                   out_strides: list[tuple[int,...]]) -> _SyncLaunch | None:
        """The gradient of word-aligned rows longer than the register-resident kernel's
        (at most one collapsed output dim, x and dx in the same layout) through the
        workspace: the hold kernel where the device holds enough rows' chunks at once,
        else None."""
        element = self.descriptor.element
        assert self._sync is not None
        parts, workspace = self._sync
        grad_kind = GRAD_KERNEL_KIND.get(self.descriptor.kind, self.descriptor.kind)
        hold = self.hold_kernel(grad_kind, element, parts)
        if hold is None:
            return None
        arrays, dx_s, y_s, dy_s = self._word_arrays(dy, dx, y, out_strides)
        kernel, grid = hold
        # cooperative: every block resident at once, whatever else runs on the device (a
        # share too small for the grid fails the launch, never hangs)
        bound = kernel.bind(grid, SYNC_BLOCK, (
            *arrays, (0, 1), (0, self._out_numel * parts), self._out_numel, self._extent,
            dx_s // VECTOR[element].width, dy_s, y_s, parts, self._param, self._flags),
            HOLD_STASH_BYTES,
            cooperative=True)
        return _SyncLaunch(bound.fast, workspace)

    def _bind_reg(self, dy: TensorRef, dx: TensorMut, y: TensorRef | None,
                  out_strides: list[tuple[int,...]], log2_lanes: int, block: int,
                  axis_stride: int | None, stash: bool = False,
                  strip: bool = False) -> Any:
        """The register-resident gradient in ``block``-thread blocks: rows (``axis_stride``
        None: at most one collapsed output dim, word aligned, extent a whole number of
        words, x and dx in the same layout) of ``2**log2_lanes`` lanes each, or strips of
        ``2**log2_lanes`` column words (COLS layouts, ``axis_stride`` = the axis stride of x
        and dx; ``stash``: the kernel that parks most rows in shared memory; ``strip``: the
        256-byte strips' kernel)."""
        element = self.descriptor.element
        width = VECTOR[element].width
        grad_kind = GRAD_KERNEL_KIND.get(self.descriptor.kind, self.descriptor.kind)
        shared = 0
        if axis_stride is None:
            groups = -(-self._out_numel // (block >> log2_lanes))
            kernel = REDUCE_BACKWARD_ROWS_REG_KERNELS[(grad_kind, element)]
        else:
            table = REDUCE_BACKWARD_COLS_STASH_KERNELS if stash else \
                REDUCE_BACKWARD_COLS_STRIP_KERNELS
            kernel = table[(grad_kind, element)]
            groups = -(-self._out_numel // (width << log2_lanes))
            if stash:
                shared = REG_COLS_STASH_BYTES
                kernel.allow_dynamic_shared(shared)
        arrays, dx_s, y_s, dy_s = self._word_arrays(dy, dx, y, out_strides)
        stride_words = (dx_s if axis_stride is None else axis_stride) // width
        return kernel.bind(min(groups, MAX_GRID_X), block, (
            *arrays, self._out_numel, self._extent, stride_words, dy_s, y_s, log2_lanes,
            self._param, self._flags), shared)
