"""Fractional max pool: the storage table and every compiled kernel of the family.

Kernels are keyed by *storage kind*: ``"F32"``, ``"F64"`` and ``"HALF"`` (one kernel for
f16 and bf16: uint16 storage, the bf16 flag in ``windows[WINDOWS_BF16]``; the plan maps
an element with :func:`kernel_kind`). f64 has only the general kernels: no benchmark row
justified fast f64 variants, and the general ones give identical results (max pooling and
the ascending-order f64 gather are exact per layout)."""

from __future__ import annotations

from numba import float32, float64, int64, types, uint16

from ...launch import Kernel, LazyTable, flat
from ...types import ElementKind
from ..common import f32_to_half, half_to_f32
from .fast import (
    FAST_WINDOWS,
    _make_backward_fast,
    _make_forward_fast,
    _make_forward_rows32,
    _make_window_max,
)
from .generic import _make_backward, _make_forward
from .placement import _same, torch_window_start_f32, torch_window_start_f64
from .tiled import _make_backward_listed

# -- the storage table ----------------------------------------------------------------------

_TUPLE8 = types.UniTuple(int64, 8)


def _dense(storage):
    """A flat, unit-stride device view (``flat`` with C layout: the kernels never need the
    array's byte stride, which saves a register and a multiply per access)."""
    return types.Array(storage, 1, "C")


#: storage kind -> (storage type, widen to compare/accumulate type ``load(raw, bf16)``,
#: narrow back ``store(value, bf16)``, zero of the accumulate type, PyTorch placement
#: arithmetic).
FRACTIONAL_MAX_POOL_TABLE = {
    "HALF": (uint16, half_to_f32, f32_to_half, float32(0.0), torch_window_start_f32),
    "F32": (float32, _same, _same, float32(0.0), torch_window_start_f32),
    "F64": (float64, _same, _same, float64(0.0), torch_window_start_f64),
}

#: The element kinds the family serves.
FRACTIONAL_MAX_POOL_ELEMENTS = (ElementKind.F16, ElementKind.BF16, ElementKind.F32,
                                ElementKind.F64)

#: Storage kinds with fast kernels (contiguous, 32-bit offsets); f64 runs the general ones.
FAST_KINDS = ("HALF", "F32")


def kernel_kind(element: ElementKind) -> str:
    """The storage kind (table key) of ``element``: ``"HALF"`` for f16 and bf16."""
    return "HALF" if element in (ElementKind.F16, ElementKind.BF16) else element.name


def _signature(storage):
    return (_dense(storage), _dense(storage), _dense(int64), flat(float32), _TUPLE8, _TUPLE8,
            _TUPLE8, _TUPLE8, _TUPLE8, _TUPLE8, int64)


def _backward_signature(storage):
    return (_dense(storage), _dense(int64), _dense(storage), _TUPLE8, _TUPLE8, _TUPLE8, _TUPLE8,
            _TUPLE8, int64)


def _spec(kind: str) -> tuple:
    """(storage, load, store, zero, torch_start) of storage kind ``kind``."""
    return FRACTIONAL_MAX_POOL_TABLE[kind]


FRACTIONAL_MAX_POOL_FW_KERNELS = LazyTable(
    FRACTIONAL_MAX_POOL_TABLE,
    lambda kind: Kernel(f"fractional_max_pool_fw[{kind}]",
                        _make_forward(_spec(kind)[1], _spec(kind)[4]),
                        _signature(_spec(kind)[0]), grid_stride=True))

FRACTIONAL_MAX_POOL_BW_KERNELS = LazyTable(
    FRACTIONAL_MAX_POOL_TABLE,
    lambda kind: Kernel(f"fractional_max_pool_bw[{kind}]",
                        _make_backward(*_spec(kind)[1:4]),
                        _backward_signature(_spec(kind)[0]), grid_stride=True))


def _fast_signature(storage):
    return (_dense(storage), _dense(storage), _dense(int64), flat(float32), _TUPLE8, _TUPLE8,
            _TUPLE8, _TUPLE8, _TUPLE8, int64)


def _fast_backward_signature(storage):
    return (_dense(storage), _dense(int64), _dense(storage), _TUPLE8, _TUPLE8, _TUPLE8,
            _TUPLE8, int64)


def _window_name(window):
    return "x".join(map(str, window))


#: storage kind -> the fast forward for any window (runtime loops over the window).
FRACTIONAL_MAX_POOL_FW_FAST_KERNELS = LazyTable(
    FAST_KINDS,
    lambda kind: Kernel(f"fractional_max_pool_fw_fast[{kind}]",
                        _make_forward_fast(_spec(kind)[1], _spec(kind)[4],
                                           _make_window_max(_spec(kind)[1]), kind == "HALF"),
                        _fast_signature(_spec(kind)[0]), grid_stride=True))


def _forward_rows(kind: str, window: tuple[int, int, int]) -> Kernel:
    storage, load, _store, _zero, torch_start = _spec(kind)
    return Kernel(f"fractional_max_pool_fw_rows32[{kind},{_window_name(window)}]",
                  _make_forward_rows32(load, torch_start, storage, window, kind == "HALF"),
                  _fast_signature(storage), grid_stride=True)


#: (storage kind, window in FAST_WINDOWS) -> the row-caching forward (32-bit offsets).
FRACTIONAL_MAX_POOL_FW_ROWS_KERNELS = LazyTable(
    [(kind, window) for kind in FAST_KINDS for window in FAST_WINDOWS],
    lambda key: _forward_rows(*key))

FRACTIONAL_MAX_POOL_BW_FAST_KERNELS = LazyTable(
    FAST_KINDS,
    lambda kind: Kernel(f"fractional_max_pool_bw_fast[{kind}]",
                        _make_backward_fast(*_spec(kind)[1:4]),
                        _fast_backward_signature(_spec(kind)[0]), grid_stride=True))


def _tiled_backward_signature(storage):
    return (_dense(storage), _dense(int64), _dense(storage), _TUPLE8, _TUPLE8, _TUPLE8,
            _TUPLE8, _TUPLE8)


#: The listed kernel's dynamic shared memory limit: sm_90 allows 227 KiB per block, of
#: which its static tables take 5.4 KiB (ptxas: 5520 bytes); kept a little below.
BW_LISTED_MAX_DYNAMIC = 220 * 1024

#: storage kind -> the listed tiled backward (see ``_make_backward_listed``; f32 sums kept
#: in the u32 mask slots).
FRACTIONAL_MAX_POOL_BW_LISTED_KERNELS = LazyTable(
    FAST_KINDS,
    lambda kind: Kernel(
        f"fractional_max_pool_bw_listed[{kind}]",
        _make_backward_listed(_spec(kind)[1], _spec(kind)[2], _spec(kind)[0], kind == "HALF"),
        _tiled_backward_signature(_spec(kind)[0]), grid_stride=True))
