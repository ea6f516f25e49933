"""Scan: the table of kernels, every (direction, kind, element) the family compiles. F16
and BF16 entries hold the same ``HALF`` kernels (built once)."""

from __future__ import annotations

import functools

from numba import boolean, int64, types

from ...launch import Kernel, LazyTable, flat
from ...types import ElementKind, ScanKind
from .extremum_backward import ExtremumBackwardKernels
from .fast import FAST_ELEMENTS, FastKernels
from .generic import _make_lines, _make_rows
from .indexed import IndexedKernels
from .ops import FLOAT_ELEMENTS, INT_ELEMENTS, ScanOp, element_token, token_element

# -- the table ----------------------------------------------------------------------------

_TUPLE8 = types.UniTuple(int64, 8)

#: Forward kinds -> element kinds they support.
SCAN_FORWARD_ELEMENTS = {
    ScanKind.CUMSUM: FLOAT_ELEMENTS + INT_ELEMENTS,
    ScanKind.CUMPROD: FLOAT_ELEMENTS + INT_ELEMENTS,
    ScanKind.CUMMAX: FLOAT_ELEMENTS + INT_ELEMENTS,
    ScanKind.CUMMIN: FLOAT_ELEMENTS + INT_ELEMENTS,
    ScanKind.LOG_CUMSUM_EXP: FLOAT_ELEMENTS,
}
#: Backward kinds -> element kinds (gradients are floating point).
SCAN_BACKWARD_ELEMENTS = {kind: FLOAT_ELEMENTS for kind in ScanKind}


class ScanKernels:
    """The rows and lines kernels of one direction at one element kind (f16 and bf16: one
    ``HALF`` pair, the bf16 flag in the launch's ``code``: ``ops.with_bf16``)."""

    def __init__(self, backward: bool, element: ElementKind) -> None:
        name = "scan_backward" if backward else "scan"
        op = ScanOp(name, element, backward)
        self.op = op
        common = (flat(op.storage), flat(op.storage), flat(op.storage), flat(op.storage),
                  flat(int64), flat(op.acc), flat(op.aux), int64, int64, int64, int64, int64,
                  _TUPLE8, _TUPLE8, _TUPLE8, _TUPLE8, _TUPLE8, _TUPLE8, int64, int64, int64,
                  int64, int64, boolean, boolean, int64)
        self.rows = Kernel(f"{name}_rows[{op.token}]", _make_rows(op), common)
        self.lines = Kernel(f"{name}_lines[{op.token}]", _make_lines(op),
                            common + (int64,))
        self.items = op.items
        self.state_bytes = (op.acc.bitwidth + op.aux.bitwidth) // 8
        self.acc_bytes = op.acc.bitwidth // 8




@functools.cache
def _by_token(build, token: str, *args):
    """``build(element, *args)`` once per element token: f16 and bf16 share it."""
    return build(token_element(token), *args)


def _scan_kernels(element: ElementKind, backward: bool) -> ScanKernels:
    return ScanKernels(backward, element)


#: (backward?, element kind) -> kernels; forward at every element kind any kind supports.
SCAN_KERNELS: dict[tuple[bool, ElementKind], ScanKernels] = LazyTable(
    [(False, e) for e in FLOAT_ELEMENTS + INT_ELEMENTS] + [(True, e) for e in FLOAT_ELEMENTS],
    lambda key: _by_token(_scan_kernels, element_token(key[1]), key[0]))

#: (family, element kind) -> fast kernels (forward, scalar-state kinds, uniform pitch).
FAST_KERNELS: dict[tuple[str, ElementKind], FastKernels] = LazyTable(
    [(family, e) for family, elements in FAST_ELEMENTS.items() for e in elements],
    lambda key: _by_token(FastKernels, element_token(key[1]), key[0]))
#: element kind -> the indexed rows kernel (Cummax/Cummin with indices, record flags).
INDEXED_KERNELS: dict[ElementKind, IndexedKernels] = LazyTable(
    FLOAT_ELEMENTS + INT_ELEMENTS, lambda e: _by_token(IndexedKernels, element_token(e)))
#: element kind -> the fused Cummax/Cummin backward (uniform-pitch layouts).
EXTREMUM_BACKWARD_KERNELS: dict[ElementKind, ExtremumBackwardKernels] = LazyTable(
    SCAN_BACKWARD_ELEMENTS[ScanKind.CUMMAX],
    lambda e: _by_token(ExtremumBackwardKernels, element_token(e)))
