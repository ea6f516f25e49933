"""``SoftmaxPlan`` / ``SoftmaxBackwardPlan``: softmax and log-softmax along one axis.

Forward ``y = softmax(scale * x)`` or ``log_softmax(scale * x)`` along ``softmax_axis``;
backward from the saved output ``y`` (probabilities, or log-probabilities)::

    Softmax     dx = scale * y * (dy - sum(dy * y))
    LogSoftmax  dx = scale * (dy - exp(y) * sum(dy))

Rank 1..8, any axis, any strides (outputs must not overlap themselves), F16 / BF16 / F32 /
F64 (f32 accumulation, f64 for F64). ``GumbelSoftmax`` and ``Sparsemax`` are
``Unsupported``. A row of all -inf, or holding a NaN or +inf, gives NaN everywhere, as
torch does. Deterministic and bit-stable: every row is cut into parts fixed by the
problem, and part statistics are folded in part order.

Which kernel runs is :func:`choose_kernel`, a pure function of the problem and the
layout; ``plan.choice`` is its answer for contiguous arrays, :meth:`choice_for` for
others. ``select(..., force=SoftmaxForce(...))`` forces the layout or a shorter part
(tests and benchmarks). Rows cut into several parts need a workspace of
``plan.workspace_size`` bytes, sized by ``select`` for any layout (``run`` raises
``WorkspaceTooSmall`` before any launch when it is short); ``workspace_size_for(strides)``
is 0 for layouts that need none, where ``run`` ignores the workspace.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .._runtime import SIMULATOR
from ..arrays import TensorRef, as_mut, as_ref, contiguous_strides, flat_span
from ..errors import InvalidProblem, Unsupported
from ..kernels.common import pad8
from ..kernels.softmax import (
    HELD,
    MAX_LANES,
    MODE_FINISH,
    MODE_FULL,
    MODE_MERGE,
    MODE_STATS,
    SOFTMAX_ELEMENTS,
    SOFTMAX_KERNELS,
    SOFTMAX_LAYOUTS,
    SOFTMAX_UNITS,
    STREAM_ITEMS,
    STREAM_PART,
    STREAM_THREADS,
    UNITS,
    row_held,
    row_units,
)
from ..launch import BoundLaunch
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
    SoftmaxKind,
)
from .base import Plan, fail, plan_args, product

__all__ = [
    "SOFTMAX_KINDS", "DeviceLimits", "KernelChoice", "SoftmaxArgs", "SoftmaxBackwardArgs",
    "SoftmaxBackwardDescriptor", "SoftmaxBackwardPlan", "SoftmaxDescriptor", "SoftmaxForce",
    "SoftmaxPlan", "choose_kernel", "device_limits",
]

#: The kinds these plans run (GumbelSoftmax and Sparsemax are reserved: Unsupported).
SOFTMAX_KINDS = (SoftmaxKind.SOFTMAX, SoftmaxKind.LOG_SOFTMAX)

#: Threads a column launch aims for before cutting columns into parts: about two full
#: waves of a large GPU (132 SMs x 2048 threads), fixed so results do not depend on it.
_COLUMN_THREADS = 1 << 19
#: Shortest column part: the per-part statistic and its fold cost about this many elements.
_MIN_COLUMN_PART = 64
_MAX_GRID_Y = 65535  # CUDA's grid.y limit (column parts)
_MAX_BLOCKS = 1 << 20  # row launches grid-stride past this many blocks


@dataclass(frozen=True, slots=True)
class SoftmaxDescriptor:
    """Softmax of ``kind`` along ``softmax_axis`` of an ``input_shape`` tensor of
    ``element``; ``scale`` (temperature) multiplies ``x`` before the exponent."""

    input_shape: tuple[int, ...]
    softmax_axis: int
    kind: SoftmaxKind
    element: ElementKind
    scale: float = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "input_shape", tuple(self.input_shape))


@dataclass(frozen=True, slots=True)
class SoftmaxBackwardDescriptor:
    """The backward of :class:`SoftmaxDescriptor` (same fields; ``scale`` as forward)."""

    input_shape: tuple[int, ...]
    softmax_axis: int
    kind: SoftmaxKind
    element: ElementKind
    scale: float = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "input_shape", tuple(self.input_shape))


@plan_args
class SoftmaxArgs:
    """``x`` is read, ``y`` (same shape) written."""

    x: Any
    y: Any


@plan_args
class SoftmaxBackwardArgs:
    """``dy`` and the saved forward output ``y`` are read, ``dx`` written."""

    dy: Any
    y: Any
    dx: Any


# -- dispatch --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DeviceLimits:
    """What dispatch reads of the device: block size for short rows and columns, and
    the L2 bytes a batch of split rows may fill between its two launches."""

    threads: int
    l2_bytes: int


@functools.cache
def device_limits() -> DeviceLimits:
    """The current device's limits (the simulator: 32-thread blocks, a nominal L2)."""
    if SIMULATOR:
        return DeviceLimits(32, 1 << 20)
    from numba import cuda

    device = cuda.get_current_device()
    return DeviceLimits(256, int(getattr(device, "L2_CACHE_SIZE", 0) or (40 << 20)))


#: Row paths: ``registers`` and ``stream`` move 16-byte units (``rows_registers``,
#: ``rows_stream``), ``elements`` any layout (``rows``).
ROW_PATHS = ("registers", "stream", "elements")


@dataclass(frozen=True, slots=True)
class SoftmaxForce:
    """Forced choices (tests, benchmarks): ``layout`` ``"rows"`` or ``"cols"`` whatever
    the strides; ``part_elements`` caps a row part (the row / column is split); ``path``
    one of ``ROW_PATHS`` for rows (a unit path only where the rows allow 16-byte units)."""

    layout: str | None = None
    part_elements: int | None = None
    path: str | None = None


@dataclass(frozen=True, slots=True)
class KernelChoice:
    """One launch plan: ``layout`` (``rows``/``cols``), ``lanes`` per row part (rows),
    ``threads`` per block, ``parts`` per row of ``part_len`` elements, rows per STATS +
    FINISH batch (``batch_rows``; all rows when ``parts == 1``), and ``path`` of rows
    (``ROW_PATHS``; columns: ``elements``)."""

    layout: str
    lanes: int
    threads: int
    parts: int
    part_len: int
    batch_rows: int
    path: str = "elements"

    @property
    def split(self) -> bool:
        return self.parts > 1

    @property
    def vec(self) -> bool:
        """Rows move as 16-byte units."""
        return self.path != "elements"

    @property
    def kernel(self) -> str:
        """The ``SOFTMAX_LAYOUTS`` key of the kernel this choice runs."""
        return f"rows_{self.path}" if self.vec else self.layout


def _next_pow2(value: int) -> int:
    return 1 << max(0, (value - 1).bit_length())


def _unit_rows(extent: int, rows: int, unit: int, units: int, input_bytes: int,
               limits: DeviceLimits, force: SoftmaxForce) -> KernelChoice | None:
    """The 16-byte-unit row kernels' choice, or None when the rows cannot take them (or
    ``force`` asks for elements, or for parts that are not whole units)."""
    cap = force.part_elements
    if (not unit or extent % unit or (cap is not None and cap % unit)
            or force.path == "elements"):
        return None
    n_units = extent // unit
    fits = n_units <= units * MAX_LANES and (cap is None or cap >= extent)
    if force.path == "registers" and not fits:
        return None
    if fits and force.path != "stream":
        # a group of lanes a row, each lane holding at most ``units`` units; short rows
        # share a block (several groups a warp), longer ones are a block each
        lanes = _next_pow2(-(-n_units // units))
        threads = lanes if lanes > 32 else max(limits.threads, lanes)
        return KernelChoice("rows", lanes, threads, 1, extent, rows, "registers")
    part_units = -(-min(cap or STREAM_PART, extent) // unit)
    parts = -(-n_units // part_units)
    if cap is None and rows * parts < STREAM_ITEMS:  # few rows: parts of a chunk or more
        parts = max(parts, min(-(-STREAM_ITEMS // rows), n_units // (STREAM_THREADS * units)))
    part_units = -(-n_units // parts)
    parts = -(-n_units // part_units)
    batch_rows = rows
    if parts > 1:  # STATS + FINISH per batch of rows filling half of L2
        batch_rows = max(1, min(rows, (limits.l2_bytes // 2) // (extent * input_bytes)))
    return KernelChoice("rows", STREAM_THREADS, STREAM_THREADS, parts, part_units * unit,
                        batch_rows, "stream")


def choose_kernel(extent: int, rows: int, axis_stride: int, other_unit_stride: bool,
                  input_bytes: int, limits: DeviceLimits,
                  force: SoftmaxForce | None = None, unit: int = 0,
                  held: int = HELD[False], units: int = UNITS[False]) -> KernelChoice:
    """The kernel for ``rows`` rows of ``extent`` elements: the row kernels when the axis
    has stride 1 (or one element), the column kernel when another axis has stride 1
    (consecutive threads then read consecutive elements), else rows. ``input_bytes``:
    bytes read per element (both inputs); a split row's batches fill half of L2, leaving
    room for the outputs streaming through. ``unit``: elements per 16-byte unit when
    the rows can move as 16-byte units (aligned, stride 1, one row stride; 0 otherwise):
    ``rows_registers`` then takes rows of at most ``units`` (``kernels.softmax.row_units``)
    units a lane of a 1024-lane block, ``rows_stream`` longer ones (parts of at most
    ``STREAM_PART``). ``held``: elements a lane of the element row kernel holds
    (``kernels.softmax.row_held``: fewer for the backward and for f64)."""
    force = force or SoftmaxForce()
    layout = force.layout
    if layout is None:
        layout = "cols" if axis_stride != 1 and extent > 1 and other_unit_stride else "rows"
    rows = max(rows, 1)
    extent = max(extent, 1)
    if layout == "rows":
        found = _unit_rows(extent, rows, unit, units, input_bytes, limits, force)
        if found is not None:
            return found
        longest = min(force.part_elements or held * MAX_LANES, held * MAX_LANES)
        parts = -(-extent // longest)
        part_len = -(-extent // parts)
        lanes = _next_pow2(-(-part_len // held))
        threads = max(lanes, limits.threads)
    else:
        lanes, threads = 1, limits.threads
        if force.part_elements:
            parts = -(-extent // force.part_elements)
        else:
            parts = max(1, min(-(-_COLUMN_THREADS // rows), extent // _MIN_COLUMN_PART))
        part_len = -(-extent // min(parts, _MAX_GRID_Y))
        parts = -(-extent // part_len)
    batch_rows = rows
    # Column batches that fit in L2 hold too few threads (rows x parts) to keep memory
    # busy, and their MERGE folds serially: columns run each mode over every row once.
    if parts > 1 and layout == "rows":
        batch_rows = max(1, min(rows, (limits.l2_bytes // 2) // (extent * input_bytes)))
    return KernelChoice(layout, lanes, threads, parts, part_len, batch_rows)


def _row_stride(shape: tuple[int, ...], strides: tuple[int, ...], axis: int) -> int | None:
    """The one stride of rows (elements) when the axes other than ``axis`` merge into one
    (row ``r`` at ``r * stride``), else None."""
    dims = sorted((d for d in range(len(shape)) if d != axis and shape[d] > 1),
                  key=lambda d: -strides[d])
    for outer, inner in zip(dims, dims[1:]):
        if strides[outer] != strides[inner] * shape[inner]:
            return None
    return strides[dims[-1]] if dims else 0


# -- plans ------------------------------------------------------------------------------------


class _SoftmaxBase(Plan):
    """Shared select checks, dispatch and launch of both directions."""

    _backward = False

    @classmethod
    def _check(cls, desc: Any, force: SoftmaxForce | None) -> None:
        if not isinstance(desc.kind, SoftmaxKind):
            fail(cls.name, InvalidProblem, "kind", f"= {desc.kind!r} is not a SoftmaxKind")
        if desc.kind not in SOFTMAX_KINDS:
            fail(cls.name, Unsupported, "kind",
                 f"= {desc.kind.name} is not supported (supported: SOFTMAX, LOG_SOFTMAX)")
        cls.check_rank(desc.input_shape, "input_shape")
        rank = len(desc.input_shape)
        axis = desc.softmax_axis
        if not isinstance(axis, int) or isinstance(axis, bool) or not 0 <= axis < rank:
            fail(cls.name, InvalidProblem, "softmax_axis",
                 f"= {axis!r} must be an int in [0, {rank})")
        cls.check_element(desc.element, tuple(SOFTMAX_ELEMENTS))
        if not isinstance(desc.scale, (int, float)) or not math.isfinite(desc.scale):
            fail(cls.name, InvalidProblem, "scale", f"= {desc.scale!r} must be a finite number")
        if force is not None:
            if force.layout not in (None, "rows", "cols"):
                fail(cls.name, InvalidProblem, "force.layout",
                     f"= {force.layout!r} must be None, 'rows' or 'cols'")
            if force.part_elements is not None and (not isinstance(force.part_elements, int)
                                                    or force.part_elements < 1):
                fail(cls.name, InvalidProblem, "force.part_elements",
                     f"= {force.part_elements!r} must be a positive int")
            if force.path not in (None, *ROW_PATHS):
                fail(cls.name, InvalidProblem, "force.path",
                     f"= {force.path!r} must be None or one of {ROW_PATHS}")

    def __init__(self, desc: Any, pref: PlanPreference | None,
                 force: SoftmaxForce | None) -> None:
        shape, axis = desc.input_shape, desc.softmax_axis
        self._force = force
        self.descriptor = desc
        self._extent = shape[axis]
        self._numel = product(shape)
        self._rows = product(shape[:axis] + shape[axis + 1:])
        self._acc_bytes = 8 if desc.element is ElementKind.F64 else 4
        self._input_bytes = desc.element.byte_width * (2 if self._backward else 1)
        self._held = row_held(desc.element, self._backward)
        self._units = row_units(desc.element, self._backward)
        self._unit = SOFTMAX_UNITS[desc.element][2]
        self._kernels = {layout: SOFTMAX_KERNELS[(layout, desc.element, self._backward)]
                         for layout in SOFTMAX_LAYOUTS}
        limits = device_limits()
        contiguous = contiguous_strides(shape)
        self.choice = self.choice_for(contiguous)
        # the workspace covers whichever layout a call's strides pick
        force = force or SoftmaxForce()
        parts = max(choose_kernel(self._extent, self._rows, 1, True, self._input_bytes,
                                  limits, SoftmaxForce(layout, force.part_elements, force.path),
                                  unit, self._held, self._units).parts
                    for layout in ("rows", "cols") for unit in (0, self._unit))
        workspace = self._rows * parts * 2 * self._acc_bytes if parts > 1 else 0
        guarantee = PrecisionGuarantee(
            MathPrecision.F64 if desc.element is ElementKind.F64 else MathPrecision.F32,
            ElementKind.F64 if desc.element is ElementKind.F64 else ElementKind.F32,
            bit_stable_on_same_hardware=True, deterministic=True)
        sku = KernelSku(OpCategory.SOFTMAX, int(desc.kind), desc.element, None,
                        self.choice.layout, None, ArchSku.SM80, BackendKind.BESPOKE, guarantee)
        super().__init__(desc, sku, pref, workspace)
        self._launches: dict[Any, Callable[..., None]] = {}
        if self._numel:
            self._kernels[self.choice.kernel].prepare()

    def choice_for(self, strides: tuple[int, ...], aligned: bool = True) -> KernelChoice:
        """The kernel choice for a first input of these strides (elements); ``aligned``:
        every array has these strides and a 16-byte aligned pointer."""
        axis = self.descriptor.softmax_axis
        shape = self.descriptor.input_shape
        unit_stride = any(s == 1 for d, (e, s) in enumerate(zip(shape, strides))
                          if d != axis and e > 1)
        row_stride = _row_stride(shape, strides, axis)
        itemsize = self.descriptor.element.byte_width
        dense = (aligned and (strides[axis] == 1 or self._extent == 1)
                 and row_stride is not None and (row_stride * itemsize) % 16 == 0)
        return choose_kernel(self._extent, self._rows, strides[axis], unit_stride,
                             self._input_bytes, device_limits(), self._force,
                             self._unit if dense else 0, self._held, self._units)

    def workspace_size_for(self, strides: tuple[int, ...], aligned: bool = False) -> int:
        """Bytes of workspace a first input of these strides needs: 0 when its choice
        does not split rows, else ``workspace_size`` (which covers every layout). The
        element kernels split every row the unit kernels split, so the answer without
        alignment holds for every pointer."""
        return self.workspace_size if self.choice_for(strides, aligned).split else 0

    def _launcher(self, views: tuple[TensorRef, ...]) -> Callable[..., None]:
        """``launch(stream, *pointers, workspace)`` for the layout of ``views`` (first the
        inputs ``a``, ``b``, then the output), cached per layout."""
        key = tuple((v.strides, v.ptr % 16) for v in views)
        found = self._launches.get(key)
        if found is None:
            if len(self._launches) >= 64:
                self._launches.clear()
            found = self._launches[key] = self._bind(views)
        return found

    def _unit_args(self, views: tuple[TensorRef, ...], choice: KernelChoice) -> tuple[Any, ...]:
        """The unit kernels' arguments before the row range: word views of ``views``, the
        workspace, and after the range the units a row and a part, lanes and row strides
        in words."""
        desc = self.descriptor
        words = tuple((0, max(flat_span(v.shape, v.strides) * v.itemsize // 4, 1))
                      for v in views)
        row_stride = _row_stride(desc.input_shape, views[0].strides, desc.softmax_axis) or 0
        row_words = row_stride * views[0].itemsize // 4
        return words, (self._extent // self._unit, choice.parts, choice.part_len // self._unit,
                       choice.lanes, row_words, row_words, row_words)

    def _element_args(self, views: tuple[TensorRef, ...], choice: KernelChoice
                      ) -> tuple[Any, ...]:
        """The element kernels' arrays, and their arguments after the row range."""
        desc = self.descriptor
        axis = desc.softmax_axis
        # rows in the order of the first input's strides (largest first): consecutive
        # rows are then neighbours in memory where any layout allows it
        others = [d for d in range(len(desc.input_shape)) if d != axis]
        others.sort(key=lambda d: -views[0].strides[d])
        shape8 = pad8(tuple(desc.input_shape[d] for d in others), 1)
        strides8 = [pad8(tuple(v.strides[d] for d in others), 0) for v in views]
        extents = tuple((0, max(flat_span(v.shape, v.strides), 1)) for v in views)
        return extents, (self._extent, choice.parts, choice.part_len, choice.lanes, shape8,
                         *strides8, *(v.strides[axis] for v in views))

    def _grid(self, choice: KernelChoice, rows: int, mode: int) -> Any:
        if choice.layout == "cols":
            return (-(-rows // choice.threads), 1 if mode == MODE_MERGE else choice.parts)
        groups = choice.threads // choice.lanes
        return min(-(-rows * choice.parts // groups), _MAX_BLOCKS)

    def _bind(self, views: tuple[TensorRef, ...]) -> Callable[..., None]:
        desc = self.descriptor
        strides = views[0].strides
        aligned = all(v.strides == strides and v.ptr % 16 == 0 for v in views)
        choice = self.choice_for(strides, aligned)
        kernel = self._kernels[choice.kernel].prepare()
        arrays, shape_args = (self._unit_args if choice.vec else self._element_args)(views,
                                                                                    choice)
        ws_extent = (0, max(self.workspace_size // self._acc_bytes, 1))
        log = int(desc.kind is SoftmaxKind.LOG_SOFTMAX)
        rows, parts = self._rows, choice.parts
        bounds: list[BoundLaunch] = []
        modes = (MODE_FULL,) if parts == 1 else (MODE_STATS, MODE_FINISH)
        if parts > 1 and choice.layout == "cols":
            modes = (MODE_STATS, MODE_MERGE, MODE_FINISH)
        for begin in range(0, rows, choice.batch_rows):
            end = min(rows, begin + choice.batch_rows)
            for mode in modes:
                args = (*arrays, ws_extent, begin, end, *shape_args, mode, log,
                        float(desc.scale))
                bounds.append(kernel.bind(self._grid(choice, end - begin, mode),
                                          choice.threads, args))
        calls = tuple(b.fast for b in bounds)

        def launch(stream: int, a: int, b: int, out: int, workspace: int) -> None:
            for call in calls:
                call(stream, a, b, out, workspace)

        return launch

    def _go(self, views: tuple[TensorRef, ...], stream: Any, workspace: Any) -> None:
        workspace_ptr = 0
        strides = views[0].strides
        if self.workspace_size_for(strides, all(v.strides == strides and v.ptr % 16 == 0
                                                for v in views)):
            workspace_ptr = self.check_workspace(workspace)
        handle = stream_handle(stream)
        if self._numel == 0:
            return
        self._launcher(views)(handle, *(v.ptr for v in views), workspace_ptr)


class SoftmaxPlan(_SoftmaxBase):
    """See the module docstring."""

    name = "SoftmaxPlan"

    @classmethod
    def select(cls, desc: SoftmaxDescriptor, pref: PlanPreference | None = None, *,
               force: SoftmaxForce | None = None) -> SoftmaxPlan:
        cls._check(desc, force)
        return cls(desc, pref, force)

    def can_implement(self, args: SoftmaxArgs) -> tuple[TensorRef, TensorRef]:
        """Views of ``x`` and ``y`` after dtype, shape and writability checks."""
        desc = self.descriptor
        x = as_ref(args.x, self.name, "x", desc.element, desc.input_shape)
        y = as_mut(args.y, self.name, "y", desc.element, desc.input_shape)
        return x, y

    def run(self, args: SoftmaxArgs, stream: Any = None, workspace: Any = None) -> None:
        """Write ``y`` on ``stream`` (no host sync)."""
        x, y = self.can_implement(args)
        self._go((x, x, y), stream, workspace)


class SoftmaxBackwardPlan(_SoftmaxBase):
    """See the module docstring."""

    name = "SoftmaxBackwardPlan"
    _backward = True

    @classmethod
    def select(cls, desc: SoftmaxBackwardDescriptor, pref: PlanPreference | None = None, *,
               force: SoftmaxForce | None = None) -> SoftmaxBackwardPlan:
        cls._check(desc, force)
        return cls(desc, pref, force)

    def can_implement(self, args: SoftmaxBackwardArgs
                      ) -> tuple[TensorRef, TensorRef, TensorRef]:
        """Views of ``dy``, ``y`` and ``dx`` after dtype, shape and writability checks."""
        desc = self.descriptor
        dy = as_ref(args.dy, self.name, "dy", desc.element, desc.input_shape)
        y = as_ref(args.y, self.name, "y", desc.element, desc.input_shape)
        dx = as_mut(args.dx, self.name, "dx", desc.element, desc.input_shape)
        return dy, y, dx

    def run(self, args: SoftmaxBackwardArgs, stream: Any = None, workspace: Any = None) -> None:
        """Write ``dx`` on ``stream`` (no host sync)."""
        dy, y, dx = self.can_implement(args)
        self._go((dy, y, dx), stream, workspace)
