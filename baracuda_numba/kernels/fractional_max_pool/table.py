"""Fractional max pool: the dtype table and every compiled kernel of the family."""

from __future__ import annotations

from numba import float32, float64, int64, types, uint16
from numba.types import float16

from ...launch import Kernel, LazyTable, flat
from ...types import ElementKind
from ..common import bf16_to_f32, f32_to_bf16
from .fast import (
    FAST_WINDOWS,
    _make_backward_fast,
    _make_forward_fast,
    _make_forward_rows32,
    _make_window_max,
)
from .generic import _make_backward, _make_forward
from .placement import _load_f16, _same, _store_f16, torch_window_start_f32, torch_window_start_f64
from .tiled import _make_backward_listed, _make_backward_tiled

# -- the dtype table -------------------------------------------------------------------------

_TUPLE8 = types.UniTuple(int64, 8)


def _dense(storage):
    """A flat, unit-stride device view (``flat`` with C layout: the kernels never need the
    array's byte stride, which saves a register and a multiply per access)."""
    return types.Array(storage, 1, "C")


#: element -> (storage type, widen to compare/accumulate type, narrow back, zero of the
#: accumulate type, PyTorch placement arithmetic).
FRACTIONAL_MAX_POOL_TABLE = {
    ElementKind.F16: (float16, _load_f16, _store_f16, float32(0.0), torch_window_start_f32),
    ElementKind.BF16: (uint16, bf16_to_f32, f32_to_bf16, float32(0.0), torch_window_start_f32),
    ElementKind.F32: (float32, _same, _same, float32(0.0), torch_window_start_f32),
    ElementKind.F64: (float64, _same, _same, float64(0.0), torch_window_start_f64),
}

FRACTIONAL_MAX_POOL_ELEMENTS = tuple(FRACTIONAL_MAX_POOL_TABLE)


def _signature(storage):
    return (_dense(storage), _dense(storage), _dense(int64), flat(float32), _TUPLE8, _TUPLE8,
            _TUPLE8, _TUPLE8, _TUPLE8, _TUPLE8, int64)


def _backward_signature(storage):
    return (_dense(storage), _dense(int64), _dense(storage), _TUPLE8, _TUPLE8, _TUPLE8, _TUPLE8,
            _TUPLE8, int64)


def _spec(element: ElementKind) -> tuple:
    """(storage, load, store, zero, torch_start) of ``element``."""
    return FRACTIONAL_MAX_POOL_TABLE[element]


FRACTIONAL_MAX_POOL_FW_KERNELS = LazyTable(
    FRACTIONAL_MAX_POOL_TABLE,
    lambda element: Kernel(f"fractional_max_pool_fw[{element.name}]",
                           _make_forward(_spec(element)[1], _spec(element)[4]),
                           _signature(_spec(element)[0]), grid_stride=True))

FRACTIONAL_MAX_POOL_BW_KERNELS = LazyTable(
    FRACTIONAL_MAX_POOL_TABLE,
    lambda element: Kernel(f"fractional_max_pool_bw[{element.name}]",
                           _make_backward(*_spec(element)[1:4]),
                           _backward_signature(_spec(element)[0]), grid_stride=True))


def _fast_signature(storage):
    return (_dense(storage), _dense(storage), _dense(int64), flat(float32), _TUPLE8, _TUPLE8,
            _TUPLE8, _TUPLE8, _TUPLE8, int64)


def _fast_backward_signature(storage):
    return (_dense(storage), _dense(int64), _dense(storage), _TUPLE8, _TUPLE8, _TUPLE8,
            _TUPLE8, int64)


def _window_name(window):
    return "x".join(map(str, window))


#: element -> the fast forward for any window (runtime loops over the window).
FRACTIONAL_MAX_POOL_FW_FAST_KERNELS = LazyTable(
    FRACTIONAL_MAX_POOL_TABLE,
    lambda element: Kernel(f"fractional_max_pool_fw_fast[{element.name}]",
                           _make_forward_fast(_spec(element)[1], _spec(element)[4],
                                              _make_window_max(_spec(element)[1])),
                           _fast_signature(_spec(element)[0]), grid_stride=True))


def _forward_rows(element: ElementKind, window: tuple[int, int, int]) -> Kernel:
    storage, load, _store, _zero, torch_start = _spec(element)
    return Kernel(f"fractional_max_pool_fw_rows32[{element.name},{_window_name(window)}]",
                  _make_forward_rows32(load, torch_start, storage, window),
                  _fast_signature(storage), grid_stride=True)


#: (element, window in FAST_WINDOWS) -> the row-caching forward (32-bit offsets).
FRACTIONAL_MAX_POOL_FW_ROWS_KERNELS = LazyTable(
    [(element, window) for element in FRACTIONAL_MAX_POOL_TABLE for window in FAST_WINDOWS],
    lambda key: _forward_rows(*key))

FRACTIONAL_MAX_POOL_BW_FAST_KERNELS = LazyTable(
    FRACTIONAL_MAX_POOL_TABLE,
    lambda element: Kernel(f"fractional_max_pool_bw_fast[{element.name}]",
                           _make_backward_fast(*_spec(element)[1:4]),
                           _fast_backward_signature(_spec(element)[0]), grid_stride=True))

#: element -> (tile elements, staged outputs) of the static tiled backward's shared memory,
#: below the 48 KiB of static shared memory a block may hold next to the candidate tables
#: (5.5 KiB): a u32 mask per tile element, dy in storage per staged output (16 + 22 KiB).
BW_TILE_CAPS = {ElementKind.F64: (4096, 2816)}


def _tiled_backward_signature(storage):
    return (_dense(storage), _dense(int64), _dense(storage), _TUPLE8, _TUPLE8, _TUPLE8,
            _TUPLE8, _TUPLE8)


#: Elements of the listed tiled backward (f32 sums kept in the u32 mask slots).
BW_LISTED_ELEMENTS = (ElementKind.F16, ElementKind.BF16, ElementKind.F32)


def _backward_tiled(element: ElementKind) -> Kernel:
    storage, load, store, zero, _torch_start = _spec(element)
    return Kernel(f"fractional_max_pool_bw_tiled[{element.name}]",
                  _make_backward_tiled(load, store, zero, storage, *BW_TILE_CAPS[element]),
                  _tiled_backward_signature(storage), grid_stride=True)


#: element -> the static tiled backward (see ``_make_backward_tiled``), for the elements
#: without a listed one (f64: its sums do not fit a u32 mask slot).
FRACTIONAL_MAX_POOL_BW_TILED_KERNELS = LazyTable(list(BW_TILE_CAPS), _backward_tiled)


#: The listed kernel's dynamic shared memory limit: sm_90 allows 227 KiB per block, of
#: which its static tables take 5.4 KiB (ptxas: 5520 bytes); kept a little below.
BW_LISTED_MAX_DYNAMIC = 220 * 1024

#: element -> the listed tiled backward (see ``_make_backward_listed``).
FRACTIONAL_MAX_POOL_BW_LISTED_KERNELS = LazyTable(
    BW_LISTED_ELEMENTS,
    lambda element: Kernel(
        f"fractional_max_pool_bw_listed[{element.name}]",
        _make_backward_listed(_spec(element)[1], _spec(element)[2], _spec(element)[0]),
        _tiled_backward_signature(_spec(element)[0]), grid_stride=True))
