"""WriteSlice: ``dest[s_0:e_0, ..., s_{N-1}:e_{N-1}] = source`` (assign, bit-exact).

The window is walked as rows: every axis but the innermost is an "outer" axis, unravelled
once per row; the innermost axis is the row, copied by consecutive threads::

    grid.y -> rows (outer index, unravelled once)     grid.x -> units of one row
    dest[base + outer_off_d + i * inner_stride_d] = source[outer_off_s + i * inner_stride_s]

Elements are moved as opaque storage units. The plan first merges axes that are
contiguous in both tensors (longer rows, fewer outer axes), then widens the unit (up to
16 bytes) whenever the row length, pointers and outer strides allow it, so contiguous
rows move as 16-byte accesses whatever the element type. Each thread keeps
``UNITS_IN_FLIGHT`` independent loads in flight before storing.
"""

from __future__ import annotations

from numba import complex128, cuda, int64, types, uint8, uint16, uint32, uint64

from ..launch import Kernel, flat
from .common import strided_offset2


def write_slice_rows(dest, source, rows, row_len, outer_shape, dest_outer_strides,
                     source_outer_strides, dest_inner_stride, source_inner_stride,
                     dest_base):
    """Copy ``rows`` rows of ``row_len`` units; grid-stride over both grid axes."""
    first = cuda.threadIdx.x + cuda.blockIdx.x * cuda.blockDim.x
    step = int64(cuda.gridDim.x * cuda.blockDim.x)
    row = int64(cuda.blockIdx.y)
    while row < rows:
        dest_row, source_row = strided_offset2(row, outer_shape, dest_outer_strides,
                                               source_outer_strides)
        dest_row += dest_base
        i = int64(first)
        while i + 3 * step < row_len:  # UNITS_IN_FLIGHT = 4 independent loads, then stores
            a = source[source_row + i * source_inner_stride]
            b = source[source_row + (i + step) * source_inner_stride]
            c = source[source_row + (i + 2 * step) * source_inner_stride]
            d = source[source_row + (i + 3 * step) * source_inner_stride]
            dest[dest_row + i * dest_inner_stride] = a
            dest[dest_row + (i + step) * dest_inner_stride] = b
            dest[dest_row + (i + 2 * step) * dest_inner_stride] = c
            dest[dest_row + (i + 3 * step) * dest_inner_stride] = d
            i += 4 * step
        while i < row_len:
            dest[dest_row + i * dest_inner_stride] = source[source_row + i * source_inner_stride]
            i += step
        row += cuda.gridDim.y


UNITS_IN_FLIGHT = 4
_TUPLE8 = types.UniTuple(int64, 8)

#: Storage unit width in bytes -> Numba type moved per access.
WRITE_SLICE_UNITS = {1: uint8, 2: uint16, 4: uint32, 8: uint64, 16: complex128}

WRITE_SLICE_KERNELS = {
    width: Kernel(
        f"write_slice_rows[{width}B]",
        write_slice_rows,
        (flat(unit), flat(unit), int64, int64, _TUPLE8, _TUPLE8, _TUPLE8, int64, int64, int64),
        grid_stride=True,
    )
    for width, unit in WRITE_SLICE_UNITS.items()
}
