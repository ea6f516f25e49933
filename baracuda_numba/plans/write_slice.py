"""``WriteSlicePlan``: ``dest[s_0:e_0, ..., s_{N-1}:e_{N-1}] = source`` in place.

Assign semantics (never accumulates), rank 1..8, every byte-aligned element kind (1, 2,
4, 8 or 16 bytes) plus nibble-packed S4/U4 (two elements per byte; the innermost range
and dest extent must be even, so no byte is shared between window and outside). BIN is
``Unsupported``. Bit-exact and deterministic.

Paths, chosen per call from the arrays' strides (the descriptor fixes the rest at select):

1. whole dest, or a window whose axes after the first are full (one contiguous chunk),
   with both arrays contiguous: one ``cuMemcpyDtoDAsync``;
2. anything else, including strided ``dest``/``source`` (any non-negative strides;
   ``dest`` must not overlap itself): the row kernel of ``kernels/write_slice.py``,
   moving 16-, 8-, 4- or 2-byte units when alignment allows, after merging axes that are
   contiguous in both tensors.

A window with one partial axis (the decode-step KV append, the prefill write) can also go
through one ``cuMemcpy2DAsync``; it is used only with
``PlanPreference(prefer_backend=BackendKind.DRIVER_COPY)``, because it reaches about half
the copy bandwidth on a large (prefill) write where the row kernel reaches the copy
ceiling (docs/design/write_slice.md).

Arrays: ``dest``/``source`` are arrays of the descriptor's shape (S4/U4: their ``uint8``
storage, innermost extent halved), or flat 1-D contiguous buffers holding at least that
many elements (``BufferTooSmall`` otherwise).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..arrays import (
    TensorMut,
    TensorRef,
    as_mut,
    as_ref,
    contiguous_strides,
    flat_span,
)
from ..driver import memcpy_2d_async, memcpy_dtod_async
from ..errors import InvalidProblem, Unsupported
from ..kernels.common import pad8
from ..kernels.write_slice import UNITS_IN_FLIGHT, WRITE_SLICE_KERNELS
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
    ShapeLayoutKind,
)
from .base import LAUNCHED, LayoutMemo, Plan, fail, plan_args, product

__all__ = ["WRITE_SLICE_ELEMENTS", "WriteSliceArgs", "WriteSliceDescriptor", "WriteSlicePlan"]

#: Every element kind WriteSlice moves (all but BIN).
WRITE_SLICE_ELEMENTS = tuple(e for e in ElementKind if e is not ElementKind.BIN)

_MAX_PITCH = (1 << 31) - 1  # cuMemcpy2D pitch/width limit on current GPUs
_BLOCK = 256


@dataclass(frozen=True, slots=True)
class WriteSliceDescriptor:
    """``ranges[d] = (start, end)`` with ``0 <= start <= end <= dest_shape[d]`` and
    ``source_shape[d] == end - start``; shapes count elements (nibbles for S4/U4)."""

    dest_shape: tuple[int, ...]
    source_shape: tuple[int, ...]
    ranges: tuple[tuple[int, int], ...]
    element: ElementKind

    def __post_init__(self) -> None:
        object.__setattr__(self, "dest_shape", tuple(self.dest_shape))
        object.__setattr__(self, "source_shape", tuple(self.source_shape))
        object.__setattr__(self, "ranges", tuple(tuple(r) for r in self.ranges))


@plan_args
class WriteSliceArgs:
    """``dest`` is written in the window only; ``source`` is read once."""

    dest: Any
    source: Any


class WriteSlicePlan(Plan):
    """See the module docstring."""

    name = "WriteSlicePlan"

    @classmethod
    def select(cls, desc: WriteSliceDescriptor,
               pref: PlanPreference | None = None) -> WriteSlicePlan:
        rank = len(desc.dest_shape)
        cls.check_rank(desc.dest_shape, "dest_shape")
        if len(desc.source_shape) != rank or len(desc.ranges) != rank:
            fail(cls.name, InvalidProblem, "source_shape/ranges",
                 f"have ranks {len(desc.source_shape)}/{len(desc.ranges)}; both must equal "
                 f"rank(dest_shape) = {rank}")
        for axis in range(rank):
            start, end = desc.ranges[axis]
            if not (0 <= start <= end <= desc.dest_shape[axis]):
                fail(cls.name, InvalidProblem, f"ranges[{axis}]",
                     f"= ({start}, {end}) must satisfy 0 <= start <= end <= "
                     f"dest_shape[{axis}] = {desc.dest_shape[axis]}")
            if desc.source_shape[axis] != end - start:
                fail(cls.name, InvalidProblem, f"source_shape[{axis}]",
                     f"= {desc.source_shape[axis]} must equal ranges[{axis}] length "
                     f"{end} - {start} = {end - start}")
        cls.check_element(desc.element, WRITE_SLICE_ELEMENTS)
        if desc.element.is_subbyte:
            start, end = desc.ranges[-1]
            if start % 2 or end % 2:
                fail(cls.name, Unsupported, f"ranges[{rank - 1}]",
                     f"= ({start}, {end}) must have even start and end for "
                     f"{desc.element.name} (two elements share a byte)")
            if desc.dest_shape[-1] % 2:
                fail(cls.name, Unsupported, f"dest_shape[{rank - 1}]",
                     f"= {desc.dest_shape[-1]} must be even for {desc.element.name}")
        return cls(desc, pref)

    def __init__(self, desc: WriteSliceDescriptor, pref: PlanPreference | None) -> None:
        nibble = desc.element.is_subbyte
        self._unit = desc.element.byte_width

        def storage(shape: tuple[int, ...]) -> tuple[int, ...]:
            return shape[:-1] + (shape[-1] // 2,) if nibble else shape

        self._dest_shape = storage(desc.dest_shape)
        self._source_shape = storage(desc.source_shape)
        self._starts = storage(tuple(r[0] for r in desc.ranges))
        self._dest_contiguous = contiguous_strides(self._dest_shape)
        self._source_contiguous = contiguous_strides(self._source_shape)
        self._source_numel = product(self._source_shape)
        self._copy = self._driver_copy_layout(
            allow_2d=pref is not None and pref.prefer_backend is BackendKind.DRIVER_COPY)
        backend = BackendKind.DRIVER_COPY if self._copy is not None else BackendKind.BESPOKE
        guarantee = PrecisionGuarantee(MathPrecision.F32, ElementKind.F32,
                                       bit_stable_on_same_hardware=True, deterministic=True)
        sku = KernelSku(OpCategory.SHAPE_LAYOUT, int(ShapeLayoutKind.WRITE_SLICE),
                        desc.element, None, None, None, ArchSku.SM80, backend, guarantee)
        super().__init__(desc, sku, pref)
        self.force_kernel = False  # benchmarks/tests: take the kernel path even if contiguous
        self._launches: dict[tuple[Any, ...], BoundLaunch] = {}
        self._memo = LayoutMemo(2)  # (dest, source) layout key -> launch (run fast path)
        if self._source_numel and self._copy is None:
            # The natural unit covers every layout; a wider unit (chosen at run time from
            # the pointers' alignment) is loaded on its first use, once per process, so
            # select loads one module (a driver-copy plan loads none).
            WRITE_SLICE_KERNELS[self._unit].prepare()

    def _driver_copy_layout(self, allow_2d: bool) -> tuple[int, int, int, int, int] | None:
        """(dest offset bytes, row bytes, rows, dest pitch, source pitch) when the window is
        one contiguous run of a contiguous dest (or, with ``allow_2d``, rows of one run at a
        fixed pitch); else None."""
        dest, source, starts, unit = self._dest_shape, self._source_shape, self._starts, self._unit
        partial = [a for a in range(len(dest)) if source[a] != dest[a]]
        if len(partial) > 1 or self._source_numel == 0:
            return None
        axis = partial[0] if partial else 0
        inner = product(dest[axis + 1:]) * unit
        offset = starts[axis] * inner
        if axis == 0 or all(extent == 1 for extent in dest[:axis]):
            return (offset, self._source_numel * unit, 1, 0, 0)
        if not allow_2d:
            return None
        row = source[axis] * inner
        pitch = dest[axis] * inner
        if pitch > _MAX_PITCH:
            return None
        return (offset, row, product(dest[:axis]), pitch, row)

    def can_implement(self, args: WriteSliceArgs) -> tuple[TensorMut, TensorRef]:
        """Views of ``dest`` and ``source`` after checking dtype, shape, writability and
        non-overlap of ``dest``."""
        element = self.descriptor.element
        dest = as_mut(args.dest, self.name, "dest", element, self._dest_shape)
        source = as_ref(args.source, self.name, "source", element, self._source_shape)
        return dest, source

    def run(self, args: WriteSliceArgs, stream: Any = None, workspace: Any = None) -> None:
        """Write ``source`` into the window of ``dest`` on ``stream`` (no host sync).

        Fast path for torch tensors and CuPy arrays: every check of ``can_implement``
        depends only on the layout key (``LayoutMemo``), so a layout seen before goes
        straight to its launch."""
        memo_key = self._memo.launch(stream, self.force_kernel, args.dest, args.source)
        if memo_key is LAUNCHED:
            return
        dest, source = self.can_implement(args)
        handle = stream_handle(stream)
        if self._source_numel == 0:
            return
        launch = self._launcher(dest, source)
        self._memo.store(memo_key, launch, (0, 0))
        launch(handle, dest.ptr, source.ptr)

    def bound_launch(self, args: WriteSliceArgs) -> BoundLaunch:
        """The row kernel's launch bound for the layout of ``args`` (checked as ``run``
        checks them), even where ``run`` takes a driver copy: host benchmarks time its
        parts."""
        dest, source = self.can_implement(args)
        return self._bind_rows(dest, source)

    def _launcher(self, dest: TensorMut, source: TensorRef) -> Callable[[int, int, int], None]:
        """``launch(stream, dest_ptr, source_ptr)`` for this layout: a driver copy when the
        window is contiguous runs of contiguous tensors, else the row kernel."""
        copy = self._copy
        if (copy is not None and not self.force_kernel
                and dest.strides == self._dest_contiguous
                and source.strides == self._source_contiguous):
            offset, row_bytes, rows, dest_pitch, source_pitch = copy
            if rows == 1:
                return lambda handle, dest_ptr, source_ptr: memcpy_dtod_async(
                    dest_ptr + offset, source_ptr, row_bytes, handle)
            return lambda handle, dest_ptr, source_ptr: memcpy_2d_async(
                dest_ptr + offset, dest_pitch, source_ptr, source_pitch, row_bytes, rows,
                handle)
        key = (dest.strides, source.strides, dest.ptr % 16, source.ptr % 16)
        bound = self._launches.get(key)
        if bound is None:
            if len(self._launches) >= 64:
                self._launches.clear()
            bound = self._launches[key] = self._bind_rows(dest, source)
        return bound.fast

    def _bind_rows(self, dest: TensorRef, source: TensorRef) -> BoundLaunch:
        """The row-kernel launch for this layout: merge axes contiguous in both tensors,
        widen the moved unit as far as alignment allows, size the grid."""
        unit = self._unit
        dest_base = sum(s * st for s, st in zip(self._starts, dest.strides))
        shape, dest_strides, source_strides = _merge_axes(self._source_shape, dest.strides,
                                                          source.strides)
        row_len = shape[-1]
        dest_inner, source_inner = dest_strides[-1], source_strides[-1]
        dest_outer, source_outer = list(dest_strides[:-1]), list(source_strides[:-1])
        outer_shape = shape[:-1]
        if (dest_inner == 1 or row_len == 1) and (source_inner == 1 or row_len == 1):
            # Widen the moved unit while every byte offset stays a multiple of it.
            outer_bytes = [s * unit for e, s in zip(outer_shape, dest_outer) if e > 1]
            outer_bytes += [s * unit for e, s in zip(outer_shape, source_outer) if e > 1]
            for width in (16, 8, 4, 2):
                if width <= unit:
                    break
                if ((row_len * unit) % width == 0
                        and (dest.ptr + dest_base * unit) % width == 0
                        and source.ptr % width == 0
                        and all(b % width == 0 for b in outer_bytes)):
                    factor = width // unit
                    row_len //= factor
                    dest_base //= factor
                    dest_outer = [s // factor for s in dest_outer]
                    source_outer = [s // factor for s in source_outer]
                    dest_inner = source_inner = 1
                    unit = width
                    break
        rows = product(outer_shape)
        block = min(_BLOCK, max(32, 1 << max(row_len - 1, 1).bit_length()))
        grid_x = max(1, min(-(-row_len // (block * UNITS_IN_FLIGHT)), 1024))
        grid_y = min(rows, 65535)
        dest_extent = (flat_span(self._dest_shape, dest.strides) * self._unit) // unit
        source_extent = (flat_span(self._source_shape, source.strides) * self._unit) // unit
        return WRITE_SLICE_KERNELS[unit].bind(
            (grid_x, grid_y), block,
            ((0, dest_extent), (0, source_extent), rows, row_len, pad8(outer_shape, 1),
             pad8(tuple(dest_outer), 0), pad8(tuple(source_outer), 0), dest_inner,
             source_inner, dest_base),
        )


def _merge_axes(shape: tuple[int, ...], strides_a: tuple[int, ...],
                strides_b: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    """Drop extent-1 axes and merge neighbours that are contiguous in both tensors
    (``stride[i] == stride[i+1] * shape[i+1]``): the same elements, fewer axes."""
    axes = [(e, a, b) for e, a, b in zip(shape, strides_a, strides_b) if e != 1]
    if not axes:
        return (1,), (1,), (1,)
    merged = [axes[-1]]
    for extent, a, b in reversed(axes[:-1]):
        inner_extent, inner_a, inner_b = merged[-1]
        if a == inner_a * inner_extent and b == inner_b * inner_extent:
            merged[-1] = (extent * inner_extent, inner_a, inner_b)
        else:
            merged.append((extent, a, b))
    merged.reverse()
    return (tuple(m[0] for m in merged), tuple(m[1] for m in merged),
            tuple(m[2] for m in merged))
