"""The descriptors and arguments of the reductions, and the forward plans (ReducePlan,
ArgReducePlan): validation, kernel choice and launch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ...arrays import TensorMut, TensorRef, as_mut, as_ref, flat_span
from ...errors import InvalidProblem
from ...kernels.common import pad8
from ...kernels.reduce import (
    FORWARD_KERNEL_KIND,
    KIND_OPS,
    LONG_SHORT_KINDS,
    PARK_MIN_LANES,
    REDUCE_COLS_VEC_KERNELS,
    REDUCE_KERNELS,
    REDUCE_ROWS_PARK_KERNELS,
    REDUCE_ROWS_VEC_KERNELS,
    VECTOR,
    forward_flags,
)
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
from ..base import LAUNCHED, LayoutMemo, Plan, fail, plan_args, product
from .geometry import (
    _STATES_PER_LANE,
    ARG_REDUCE_KINDS,
    BLOCK,
    COLS,
    GENERIC,
    MAX_GRID_X,
    REDUCE_ELEMENTS,
    REDUCE_KINDS,
    ROWS,
    SHORT_GRID_X,
    _check_common,
    _check_correction,
    _guarantee,
    _pow2_at_least,
    _Problem,
    _state_bytes,
    max_workspace,
    problem_layout,
    takes_lanes_first,
)

# ---------------------------------------------------------------------------------------
# Descriptors and args


@dataclass(frozen=True, slots=True)
class ReduceDescriptor:
    """``y = kind(x)`` over ``input_shape[reduce_axis]``; ``correction`` (Var/Std only) is
    subtracted from the count in the divisor (1 = sample variance, 0 = population)."""

    kind: ReduceKind
    input_shape: tuple[int,...]
    reduce_axis: int
    element: ElementKind
    correction: float = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "input_shape", tuple(self.input_shape))

    def output_shape(self) -> tuple[int,...]:
        """The keepdim output shape: ``input_shape`` with the axis set to 1."""
        return _keepdim(self.input_shape, self.reduce_axis)


@plan_args
class ReduceArgs:
    """``x`` of ``input_shape``, ``y`` of ``output_shape()`` (written)."""

    x: Any
    y: Any


@dataclass(frozen=True, slots=True)
class ReduceBackwardDescriptor:
    """Gradient of the ``kind`` reduction of ``input_shape`` over ``reduce_axis``."""

    kind: ReduceKind
    input_shape: tuple[int,...]
    reduce_axis: int
    element: ElementKind
    correction: float = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "input_shape", tuple(self.input_shape))

    def dy_shape(self) -> tuple[int,...]:
        """The keepdim shape of ``dy`` and the saved ``y``."""
        return _keepdim(self.input_shape, self.reduce_axis)


@plan_args
class ReduceBackwardArgs:
    """``dy`` (keepdim), ``dx`` (input shape, written); saved ``x`` (input shape) and
    ``y`` (keepdim) are required by every kind but Sum and Mean (which ignore them)."""

    dy: Any
    dx: Any
    x: Any = None
    y: Any = None


@dataclass(frozen=True, slots=True)
class ArgReduceDescriptor:
    """Index (int64) of the first maximum (ARGMAX) or minimum (ARGMIN) along the axis."""

    kind: ReduceKind
    input_shape: tuple[int,...]
    reduce_axis: int
    element: ElementKind

    def __post_init__(self) -> None:
        object.__setattr__(self, "input_shape", tuple(self.input_shape))

    def output_shape(self) -> tuple[int,...]:
        return _keepdim(self.input_shape, self.reduce_axis)


@plan_args
class ArgReduceArgs:
    """``x`` of ``input_shape``, ``y`` int64 of ``output_shape()`` (written)."""

    x: Any
    y: Any


def _keepdim(shape: tuple[int,...], axis: int) -> tuple[int,...]:
    return shape[:axis] + (1,) + shape[axis + 1:]


# ---------------------------------------------------------------------------------------
# The forward engine shared by ReducePlan and ArgReducePlan


class _ForwardPlan(Plan):
    """Reduction of ``x`` into ``y`` with the kernel of ``kernel_kind``."""

    _out_element: ElementKind | None = None  # None: the input element

    def _setup(self, desc: Any, pref: PlanPreference | None, kernel_kind: Any,
               param: float) -> None:
        shape = desc.input_shape
        self._shape = shape
        self._axis = desc.reduce_axis
        self._extent = shape[desc.reduce_axis]
        self._out_shape = _keepdim(shape, desc.reduce_axis)
        self._out_numel = product(self._out_shape)
        self._kernel = REDUCE_KERNELS[(kernel_kind, desc.element)]
        self._kernel_kind = kernel_kind
        self._lanes_first = takes_lanes_first(kernel_kind, desc.element)
        self._param = param
        limit = 1 << 30
        if pref is not None and pref.max_workspace_bytes is not None:
            limit = 1
            while limit < 65535 and max_workspace(kernel_kind, desc.element, self._out_numel,
                                                  self._extent, limit * 2)[1] \
                    <= pref.max_workspace_bytes:
                limit *= 2
        self._max_splits, workspace = max_workspace(kernel_kind, desc.element,
                                                    self._out_numel, self._extent, limit)
        if self._max_splits <= 1:
            workspace = 0
        self._max_splits = max(1, self._max_splits)
        sku = KernelSku(OpCategory.REDUCTION, int(desc.kind), desc.element,
                        self._out_element, None, None, ArchSku.SM80, BackendKind.BESPOKE,
                        _guarantee(desc.element))
        super().__init__(desc, sku, pref, workspace)
        self._launches: dict[Any, _ReduceLaunch] = {}
        # (x, y, workspace) layout key -> launch (run fast path)
        self._memo = LayoutMemo(3)
        if self._out_numel:
            self._kernel.prepare()

    def _views(self, args: Any) -> tuple[TensorRef, TensorMut]:
        element = self.descriptor.element
        x = as_ref(args.x, self.name, "x", element, self._shape)
        y = as_mut(args.y, self.name, "y", self._out_element or element, self._out_shape)
        return x, y

    def bound_launches(self) -> dict[Any, _ReduceLaunch]:
        """The launches bound so far (a copy), keyed by layout ``(x strides, y strides,
        with workspace, x.ptr & 7)``; each value's ``access`` is the layout the kernel
        reads (GENERIC, ROWS or COLS). What tests and benchmarks read."""
        return dict(self._launches)

    def layout_launch(self, args: Any, workspace: Any = None) -> Callable[..., None] | None:
        """``launch(stream_handle, x_ptr, y_ptr, workspace_ptr)``: see
        :meth:`Plan.layout_launch`."""
        hit = self._memo.lookup((args.x, args.y, workspace))[1]
        return None if hit is None else hit[0]

    def run(self, args: Any, stream: Any = None, workspace: Any = None) -> None:
        """Reduce ``args.x`` into ``args.y`` on ``stream`` (no host sync). ``workspace``: a
        contiguous buffer of at least ``workspace_size`` bytes where that is not 0 (else
        ``WorkspaceTooSmall(needed, got)`` before anything is launched).

        Torch or CuPy arrays of a layout seen before (the workspace's too) skip the array
        checks (``LayoutMemo``)."""
        memo_key = self._memo.launch(stream, None, args.x, args.y, workspace)
        if memo_key is LAUNCHED:
            return
        ws_ptr = self.check_workspace(workspace)  # WorkspaceTooSmall before anything runs
        x, y = self.can_implement(args)
        handle = stream_handle(stream)
        if self._out_numel == 0:
            return
        with_workspace = ws_ptr != 0
        key = (x.strides, y.strides, with_workspace, x.ptr & 7)
        launch = self._launches.get(key)
        if launch is None:
            problem = problem_layout(self._shape, self._axis, [x.strides, y.strides],
                                     x.strides[self._axis] == 1,
                                     self._max_splits if with_workspace else 1,
                                     self.descriptor.element, self._kernel_kind, x.ptr,
                                     lanes_first=self._lanes_first)
            launch = _bind_reduce(self._kernel, self._kernel_kind, self.descriptor.element, x,
                                  y, None, problem, self._extent, self._out_numel,
                                  with_workspace, self._param, final=True)
            if len(self._launches) >= _CACHE_LIMIT:
                self._launches.clear()
            self._launches[key] = launch
        self._memo.store(memo_key, launch.memo_launcher(with_workspace), (0, 0, 0))
        launch(handle, x.ptr, y.ptr, ws_ptr, 0)


@dataclass(frozen=True, slots=True)
class _ReduceLaunch:
    """Bound launches (their ``fast`` launchers) of one reduction layout; pointers are
    passed per call."""

    launches: tuple[Any,...]
    acc_bytes: int
    uses_acc: bool
    uses_k: bool
    access: str = GENERIC

    def __call__(self, stream: int, x_ptr: int, y_ptr: int, ws_ptr: int,
                 aux_ptr: int) -> tuple[int, int]:
        acc_ptr = ws_ptr if ws_ptr and self.uses_acc else 0
        k_ptr = ws_ptr + self.acc_bytes if ws_ptr and self.uses_k else 0
        first = self.launches[0]
        if self.access == ROWS:  # the elements, and the same bytes as words
            first(stream, x_ptr, x_ptr & ~7, y_ptr, acc_ptr, k_ptr, aux_ptr)
        else:  # COLS: x is the (aligned) word view
            first(stream, x_ptr, y_ptr, acc_ptr, k_ptr, aux_ptr)
        for bound in self.launches[1:]:  # the merge of split states
            bound(stream, x_ptr, y_ptr, acc_ptr, k_ptr, aux_ptr)
        return acc_ptr, k_ptr

    def memo_launcher(self, with_workspace: bool) -> Callable[[int, int, int, int], None]:
        """``launch(stream, x_ptr, y_ptr, ws_ptr)``: this call with no ``aux``, as one
        small function (the memo path of ``run``); ``ws_ptr`` is ignored where the layout
        was bound without a workspace."""
        first = self.launches[0]
        if with_workspace or len(self.launches) > 1:
            def launch(stream: int, x_ptr: int, y_ptr: int, ws_ptr: int) -> None:
                self(stream, x_ptr, y_ptr, ws_ptr if with_workspace else 0, 0)
        elif self.access == ROWS:
            def launch(stream: int, x_ptr: int, y_ptr: int, ws_ptr: int) -> None:
                first(stream, x_ptr, x_ptr & ~7, y_ptr, 0, 0, 0)
        else:
            def launch(stream: int, x_ptr: int, y_ptr: int, ws_ptr: int) -> None:
                first(stream, x_ptr, y_ptr, 0, 0, 0)
        return launch


def _bind_reduce(kernel: Any, kernel_kind: Any, element: ElementKind, x: TensorRef,
                 y: TensorRef | None, aux: TensorRef | None, problem: _Problem, extent: int,
                 out_numel: int, with_workspace: bool, param: float,
                 final: bool) -> _ReduceLaunch:
    """The reduction launch (and the merge of split states) for this layout. ``final``:
    write ``y``; else leave each output's merged state in workspace slot 0."""
    geometry = problem.geometry
    splits = geometry.splits
    acc_bytes, _ = _state_bytes(kernel_kind, element, out_numel, splits)
    ops = KIND_OPS[kernel_kind]
    acc_view = (0, ops.n_acc * splits * out_numel if with_workspace else 0)
    k_view = (0, splits * out_numel if with_workspace and ops.uses_k else 0)
    x_view = (0, flat_span(x.shape, x.strides))
    y_view = (0, flat_span(y.shape, y.strides) if y is not None else 0)
    aux_view = (0, flat_span(aux.shape, aux.strides) if aux is not None else 0)
    out_shape = pad8(problem.out_shape, 1)
    strides = [pad8(s, 0) for s in problem.strides] + [pad8((), 0)] * 3
    x_strides, y_strides, aux_strides = strides[0], strides[1], strides[2]
    common = (x_view, y_view, acc_view, k_view, aux_view, out_numel, extent,
              x.strides[problem.axis], out_shape, x_strides, y_strides, aux_strides,
              geometry.lanes, int(geometry.row_layout), splits, geometry.chunk_len)
    mode = 0 if splits == 1 and final else 1
    flags = forward_flags(kernel_kind, element)  # the bf16 flag and the variant
    parked = problem.access == ROWS and geometry.chunk_len == 0 \
        and kernel_kind in LONG_SHORT_KINDS and geometry.lanes >= PARK_MIN_LANES
    grid = (min(geometry.groups, SHORT_GRID_X if parked else MAX_GRID_X), splits)
    if problem.access == ROWS:
        x_words = (0, (flat_span(x.shape, x.strides) + problem.shift) * element.byte_width // 8)
        table = REDUCE_ROWS_PARK_KERNELS if parked else REDUCE_ROWS_VEC_KERNELS
        first = table[(kernel_kind, element)].bind(grid, BLOCK, (
            x_view, x_words, y_view, acc_view, k_view, aux_view, out_numel, extent, out_shape,
            x_strides, y_strides, aux_strides, geometry.lanes, splits, geometry.chunk_len,
            mode, param, problem.shift, flags))
    elif problem.access == COLS:
        width = VECTOR[element].width
        x_words = (0, flat_span(x.shape, x.strides) * element.byte_width // 8)
        first = REDUCE_COLS_VEC_KERNELS[(kernel_kind, element)].bind(grid, BLOCK, (
            x_words, y_view, acc_view, k_view, aux_view, out_numel, extent,
            x.strides[problem.axis] // width, problem.strides[1][0],
            problem.strides[2][0] if aux is not None else 0, geometry.lanes, splits,
            geometry.chunk_len, mode, param, flags))
    else:
        first = kernel.bind(grid, BLOCK, common + (mode, param, flags))
    launches = [first]
    if splits > 1:
        launches.append(_bind_merge(kernel, common, out_numel, splits, final, param, flags))
    return _ReduceLaunch(tuple(b.fast for b in launches), acc_bytes, ops.n_acc > 0, ops.uses_k,
                         problem.access)


def _bind_merge(kernel: Any, common: tuple[Any,...], out_numel: int, splits: int,
                final: bool, param: float, flags: int = 0) -> Any:
    """The launch of ``kernel`` that merges the ``splits`` partial states of each output
    (mode 2: into ``y``; 3, not ``final``: into workspace slot 0); ``common`` as the
    reduction's arguments, ``flags`` its ``forward_flags`` (0: no bf16 output, no
    variant, as the merge into the workspace needs)."""
    lanes = min(BLOCK, _pow2_at_least(-(-splits // _STATES_PER_LANE)))
    slots = BLOCK // lanes
    merge_args = list(common)
    merge_args[12:14] = [lanes, 0]
    return kernel.bind(min(-(-out_numel // slots), MAX_GRID_X), BLOCK,
                       tuple(merge_args) + (2 if final else 3, param, flags))


_CACHE_LIMIT = 64
#: The statistic pass of the Var/Std gradients (split or column word layouts, with a
#: workspace): the Sum kernel's per-output sum, which the gradient divides by the extent
#: for the mean. It replaced the Welford kernel, which also reduces the squared deviations
#: the gradient never reads.
#: (Measurements: docs/design/reduce.md, "Measured constants".)
MEAN_STAT = ReduceKind.SUM


class ReducePlan(_ForwardPlan):
    """See the module docstring."""

    name = "ReducePlan"

    @classmethod
    def select(cls, desc: ReduceDescriptor, pref: PlanPreference | None = None) -> ReducePlan:
        _check_common(cls, desc.kind, REDUCE_KINDS, desc.input_shape, desc.reduce_axis,
                      desc.element, REDUCE_ELEMENTS)
        _check_correction(cls, desc.correction)
        extent = desc.input_shape[desc.reduce_axis]
        if extent == 0 and desc.kind in (ReduceKind.MAX, ReduceKind.MIN):
            fail(cls.name, InvalidProblem, "input_shape",
                 f"[{desc.reduce_axis}] = 0: {desc.kind.name} of an empty axis is undefined")
        return cls(desc, pref)

    def __init__(self, desc: ReduceDescriptor, pref: PlanPreference | None) -> None:
        kind = desc.kind
        extent = desc.input_shape[desc.reduce_axis]
        if kind is ReduceKind.MEAN:
            param = float(extent)
        elif kind in (ReduceKind.VAR, ReduceKind.STD):
            param = float(desc.correction)
        else:
            param = 1.0
        self._setup(desc, pref, FORWARD_KERNEL_KIND.get(kind, kind), param)

    def can_implement(self, args: ReduceArgs) -> tuple[TensorRef, TensorMut]:
        """Views of ``x`` and ``y`` after dtype, shape and writability checks."""
        return self._views(args)


class ArgReducePlan(_ForwardPlan):
    """Argmax/Argmin: int64 index of the first extreme; NaN is the extreme (torch)."""

    name = "ArgReducePlan"
    _out_element = ElementKind.I64

    @classmethod
    def select(cls, desc: ArgReduceDescriptor,
               pref: PlanPreference | None = None) -> ArgReducePlan:
        _check_common(cls, desc.kind, ARG_REDUCE_KINDS, desc.input_shape,
                      desc.reduce_axis, desc.element, REDUCE_ELEMENTS)
        if desc.input_shape[desc.reduce_axis] == 0:
            fail(cls.name, InvalidProblem, "input_shape",
                 f"[{desc.reduce_axis}] = 0: {desc.kind.name} of an empty axis is undefined")
        return cls(desc, pref)

    def __init__(self, desc: ArgReduceDescriptor, pref: PlanPreference | None) -> None:
        self._setup(desc, pref, desc.kind, 0.0)

    def can_implement(self, args: ArgReduceArgs) -> tuple[TensorRef, TensorMut]:
        """Views of ``x`` and ``y`` (int64) after dtype, shape and writability checks."""
        return self._views(args)


