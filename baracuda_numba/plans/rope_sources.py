"""Side arrays of the RoPE plans' general path (``plans/rope.py``, ``plans/rope_kv_cache.py``):
index and table views, their kernel extents, and the ``BARACUDA_DEBUG`` checks of
device-resident offsets."""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import cuda

from .._runtime import SIMULATOR
from ..arrays import as_ref, flat_span
from ..errors import InvalidProblem
from ..kernels.rope import ANGLES_BASE
from ..types import ElementKind
from .base import fail

#: The kernel's units of (cu_seqlens, inv_freq, cos, sin, dest): 32-bit words (4), f32
#: elements (0), 16-bit halves (2).
_SIDE_UNITS = (4, 0, 2, 2, 4)

#: cos/sin typestrs -> element kind (bf16: torch's "<V2", or uint16 storage).
_TABLE_TYPESTRS = {"<f2": ElementKind.F16, "<V2": ElementKind.BF16, "<u2": ElementKind.BF16,
                   "<f4": ElementKind.F32, "<f8": ElementKind.F64}


def _has_extras(args: Any) -> bool:
    """Whether a run passes anything beyond x, y and positions (the general path)."""
    for field_name in type(args).__slots__[3:]:
        if getattr(args, field_name) is not None:
            return True
    return False


def _plain_sources() -> tuple[int, ...]:
    """``ROPE_SOURCES`` for base angles, int64 positions and no destination index."""
    return (1, 0, 0, 0, ANGLES_BASE) + (0,) * 19


def _wide(view: Any) -> int:
    """1 for an int64 index array (or none), 0 for int32."""
    return 0 if view is not None and view.typestr == "<i4" else 1


def _words(view: Any, unit_bytes: int) -> int:
    """Extent of a side array in the kernel's units: 32-bit words (``unit_bytes`` 4), f32
    elements (0) or 16-bit halves (2)."""
    span = flat_span(view.shape, view.strides) if view.shape else 1
    if unit_bytes == 0:
        return span
    return span * view.itemsize // unit_bytes


def _index_view(name: str, arg: str, array: Any, *shapes: tuple[int, ...]) -> Any:
    """A view of an int32 / int64 index array whose shape is one of ``shapes``."""
    view = as_ref(array, name, arg)
    if view.typestr not in ("<i4", "<i8"):
        fail(name, InvalidProblem, arg, f"has dtype {view.typestr}; it must be int32 or int64")
    if view.shape not in shapes:
        fail(name, InvalidProblem, arg, f"has shape {view.shape}; it must be "
             + " or ".join(str(shape) for shape in shapes))
    return view


def _host_values(view: Any) -> np.ndarray:
    """The elements of a device index/array view, copied to the host (debug checks only:
    synchronises the device)."""
    from ..launch import _device_view

    dtype = np.dtype(view.typestr)
    span = flat_span(view.shape, view.strides)
    if not SIMULATOR:
        cuda.synchronize()
    flat = _device_view(view.ptr, span, dtype)
    flat = np.asarray(flat if SIMULATOR else flat.copy_to_host())
    return np.lib.stride_tricks.as_strided(
        flat, view.shape, tuple(st * dtype.itemsize for st in view.strides)).copy()


def _debug_check_range(name: str, arg: str, view: Any, low: int, high: int,
                       plus_s: bool = False) -> None:
    """``BARACUDA_DEBUG``: every value of ``view`` (plus its sequence index where
    ``plus_s``) lies in ``[low, high)``."""
    if view is None or view.numel == 0:
        return
    values = _host_values(view).astype(np.int64)
    if plus_s:
        values = values[..., None] + np.arange(plus_s)
    bad = (values < low) | (values >= high)
    if bad.any():
        index = tuple(int(i) for i in np.argwhere(bad)[0])
        fail(name, InvalidProblem, arg, f"holds {int(values[index])} at {index}; it must lie "
             f"in [{low}, {high}) (BARACUDA_DEBUG check)")


def _debug_check_offsets(name: str, cu: Any, tokens: int) -> None:
    """``BARACUDA_DEBUG``: ``cu_seqlens`` starts at 0, never decreases and ends at T."""
    values = _host_values(cu).astype(np.int64)
    if values[0] != 0 or values[-1] != tokens or (np.diff(values) < 0).any():
        fail(name, InvalidProblem, "cu_seqlens", f"= {values.tolist()[:8]}... must start at 0, "
             f"not decrease and end at T = {tokens} (BARACUDA_DEBUG check)")


def _check_overlap(name: str, x: Any, y: Any, in_name: str, out_name: str,
                   itemsize: int) -> None:
    """A y that is not x itself (same pointer and strides) must not overlap x."""
    if x.numel == 0 or (x.ptr == y.ptr and x.strides == y.strides):
        return
    x_end = x.ptr + flat_span(x.shape, x.strides) * itemsize
    y_end = y.ptr + flat_span(y.shape, y.strides) * itemsize
    if x.ptr < y_end and y.ptr < x_end:
        fail(name, InvalidProblem, out_name, f"overlaps {in_name} without being the same "
             "view (in place needs the same pointer and strides)")
