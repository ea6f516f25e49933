"""baracuda-check cases for WriteSlicePlan: every element kind x each path."""

from __future__ import annotations

import numpy as np

from ..plans.write_slice import (
    WRITE_SLICE_ELEMENTS,
    WriteSliceArgs,
    WriteSliceDescriptor,
    WriteSlicePlan,
)
from ..testing import poisoned, random_values, to_device, to_host
from ..types import ElementKind
from . import CheckCase

# (dest_shape, ranges, force_kernel): whole dest, contiguous chunk, one partial axis
# (2-D copy), an interior box (kernel), and the kernel forced on a chunk.
_GPU_SHAPES = [
    ((4, 33, 64), ((0, 4), (0, 33), (0, 64)), False),
    ((6, 33, 64), ((2, 5), (0, 33), (0, 64)), False),
    ((8, 4, 40, 32), ((0, 8), (0, 4), (17, 18), (0, 32)), False),
    ((5, 7, 258), ((1, 4), (2, 7), (6, 250)), False),
    ((6, 33, 64), ((2, 5), (0, 33), (0, 64)), True),
]
_SIM_SHAPES = [
    ((2, 3, 4), ((0, 2), (0, 3), (0, 4)), False),
    ((4, 3, 4), ((1, 3), (0, 3), (0, 4)), False),
    ((2, 5, 4), ((0, 2), (3, 4), (0, 4)), False),
    ((3, 4, 6), ((1, 3), (1, 3), (2, 6)), False),
]


def _case(element: ElementKind, dest_shape: tuple[int, ...], ranges: tuple[tuple[int, int], ...],
          force_kernel: bool):
    def run() -> tuple[float, float]:
        rng = np.random.default_rng()
        source_shape = tuple(e - s for s, e in ranges)

        def storage(shape: tuple[int, ...]) -> tuple[int, ...]:
            return shape[:-1] + (shape[-1] // 2,) if element.is_subbyte else shape

        dest_host = random_values(storage(dest_shape), element, rng)
        source_host = random_values(storage(source_shape), element, rng)
        plan = WriteSlicePlan.select(WriteSliceDescriptor(dest_shape, source_shape, ranges,
                                                          element))
        plan.force_kernel = force_kernel
        dest = to_device(dest_host)
        plan.run(WriteSliceArgs(dest, to_device(source_host)))
        expected = dest_host.copy()
        window = tuple(slice(s, e) for s, e in ranges)
        if element.is_subbyte:
            window = window[:-1] + (slice(ranges[-1][0] // 2, ranges[-1][1] // 2),)
        expected[window] = source_host
        got = to_host(dest)
        mismatches = np.count_nonzero(got.view(np.uint8) != expected.view(np.uint8))
        return float(mismatches), 0.0

    return run


def cases(simulator: bool) -> list[CheckCase]:
    shapes = _SIM_SHAPES if simulator else _GPU_SHAPES
    elements = WRITE_SLICE_ELEMENTS if not simulator else (
        ElementKind.F16, ElementKind.BF16, ElementKind.F32, ElementKind.COMPLEX64,
        ElementKind.S4, ElementKind.BOOL)
    out = []
    for element in elements:
        for dest_shape, ranges, force in shapes:
            label = f"{dest_shape} <- {ranges}" + (" kernel" if force else "")
            out.append(CheckCase("write_slice", "WriteSlicePlan", element.name, label,
                                 _case(element, dest_shape, ranges, force)))
    _ = poisoned  # dest keeps its random contents outside the window: that is the check
    return out
