"""SoftmaxPlan / SoftmaxBackwardPlan against NumPy float64 (simulator and GPU) and torch
(GPU): every axis, ranks 1..8, rows at warp and group edges, split rows and columns,
strided views, NaN / +-inf rows, bit-identical reruns, every rejection."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import EDGE_LENGTHS, FLOAT_ELEMENTS, SIMULATOR, torch_or_skip

from baracuda_numba.errors import BufferTooSmall, InvalidProblem, Unsupported, WorkspaceTooSmall
from baracuda_numba.kernels.softmax import (
    HELD,
    MAX_PART,
    MAX_REGISTER_UNITS,
    STREAM_ITEMS,
    STREAM_PART,
    STREAM_THREADS,
    UNITS,
)
from baracuda_numba.plans.softmax import (
    DeviceLimits,
    SoftmaxArgs,
    SoftmaxBackwardArgs,
    SoftmaxBackwardDescriptor,
    SoftmaxBackwardPlan,
    SoftmaxDescriptor,
    SoftmaxForce,
    SoftmaxPlan,
    choose_kernel,
)
from baracuda_numba.testing import (
    TOLERANCE,
    assert_within,
    from_storage,
    poisoned,
    random_values,
    to_device,
    to_host,
    to_storage,
)
from baracuda_numba.types import ElementKind, SoftmaxKind

SOFTMAX, LOG = SoftmaxKind.SOFTMAX, SoftmaxKind.LOG_SOFTMAX
# The simulator treats IEEE specials like NumPy scalars do (RuntimeWarning on inf - inf,
# exp(nan)): tests feeding them ignore the warning, the GPU raises nothing.
IEEE_SPECIALS = pytest.mark.filterwarnings("ignore::RuntimeWarning")
KINDS = (SOFTMAX, LOG)
F32 = ElementKind.F32

# -- references (float64) ----------------------------------------------------------------


def ref_forward(x: np.ndarray, axis: int, kind: SoftmaxKind, scale: float = 1.0) -> np.ndarray:
    """torch's semantics: NaN / +inf anywhere in a row, or a row of all -inf, -> NaN row."""
    v = np.asarray(x, dtype=np.float64) * scale
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        m = np.max(v, axis=axis, keepdims=True)
        e = np.exp(v - m)
        s = np.sum(e, axis=axis, keepdims=True)
        return (v - m) - np.log(s) if kind is LOG else e / s


def ref_backward(dy: np.ndarray, y: np.ndarray, axis: int, kind: SoftmaxKind,
                 scale: float = 1.0) -> np.ndarray:
    dy = np.asarray(dy, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if kind is LOG:
        return scale * (dy - np.exp(y) * np.sum(dy, axis=axis, keepdims=True))
    return scale * y * (dy - np.sum(dy * y, axis=axis, keepdims=True))


def _tiny(element: ElementKind) -> float:
    """Absolute error of one rounding near zero: the smallest subnormal step."""
    return float(np.finfo(np.float16 if element is ElementKind.F16 else np.float32)
                 .smallest_subnormal) if element is not ElementKind.F64 else 1e-300


def _acc_roundoff(element: ElementKind) -> float:
    """A few roundings of the accumulator (f32 unit roundoff 6e-8; f64 1.1e-16)."""
    return TOLERANCE[ElementKind.F64 if element is ElementKind.F64 else ElementKind.F32][0]


def forward_bound(x: np.ndarray, expected: np.ndarray, axis: int, kind: SoftmaxKind,
                  element: ElementKind, scale: float) -> np.ndarray:
    """One rounding of the output (``TOLERANCE``) plus the accumulator's error in the
    row sum, sqrt(n) roundings; log-softmax: absolute, also relative to the terms
    ``|x' - m| + log s`` it subtracts."""
    rtol, _ = TOLERANCE[element]
    u = _acc_roundoff(element)
    n = max(x.shape[axis], 1)
    if kind is LOG:
        v = np.abs(np.asarray(x, dtype=np.float64) * scale)
        with np.errstate(invalid="ignore"):
            terms = 2 * np.max(v, axis=axis, keepdims=True) + math.log(n) + math.sqrt(n)
        return rtol * np.abs(expected) + u * terms + _tiny(element)
    return (rtol + u * math.sqrt(n)) * np.abs(expected) + _tiny(element)


def backward_bound(dy: np.ndarray, y: np.ndarray, axis: int, kind: SoftmaxKind,
                   element: ElementKind, scale: float) -> np.ndarray:
    """One rounding of the output relative to the magnitudes dx is a difference of, plus
    the accumulator's sqrt(n) roundings in the row sum."""
    rtol, _ = TOLERANCE[element]
    u = _acc_roundoff(element)
    dy = np.abs(np.asarray(dy, dtype=np.float64))
    y = np.asarray(y, dtype=np.float64)
    n = max(dy.shape[axis], 1)
    if kind is LOG:
        total = np.exp(y) * np.sum(dy, axis=axis, keepdims=True)
    else:
        total = np.abs(y) * np.sum(dy * np.abs(y), axis=axis, keepdims=True)
    magnitude = (dy if kind is LOG else np.abs(y) * dy) + total
    return abs(scale) * (rtol * magnitude + u * math.sqrt(n) * total) + _tiny(element)


# -- runners ----------------------------------------------------------------------------------


def _workspace(plan):
    return to_device(np.zeros(plan.workspace_size, np.uint8)) if plan.workspace_size else None


def run_forward(x_host: np.ndarray, axis: int, kind: SoftmaxKind, element: ElementKind,
                scale: float = 1.0, force: SoftmaxForce | None = None,
                x_device=None) -> np.ndarray:
    """``y`` (storage) of the plan on a poisoned output."""
    shape = x_host.shape
    plan = SoftmaxPlan.select(SoftmaxDescriptor(shape, axis, kind, element, scale), force=force)
    y = to_device(poisoned(shape, element))
    x = to_device(x_host) if x_device is None else x_device
    plan.run(SoftmaxArgs(x, y), workspace=_workspace(plan))
    return to_host(y)


def run_backward(dy_host: np.ndarray, y_host: np.ndarray, axis: int, kind: SoftmaxKind,
                 element: ElementKind, scale: float = 1.0,
                 force: SoftmaxForce | None = None) -> np.ndarray:
    shape = dy_host.shape
    plan = SoftmaxBackwardPlan.select(SoftmaxBackwardDescriptor(shape, axis, kind, element,
                                                                scale), force=force)
    dx = to_device(poisoned(shape, element))
    plan.run(SoftmaxBackwardArgs(to_device(dy_host), to_device(y_host), dx),
             workspace=_workspace(plan))
    return to_host(dx)


def check_forward(shape: tuple[int, ...], axis: int, kind: SoftmaxKind, element: ElementKind,
                  rng: np.random.Generator, scale: float = 1.0,
                  force: SoftmaxForce | None = None, x: np.ndarray | None = None) -> None:
    x = random_values(shape, element, rng, -4.0, 4.0) if x is None else x
    got = from_storage(run_forward(x, axis, kind, element, scale, force), element)
    values = from_storage(x, element)
    expected = ref_forward(values, axis, kind, scale)
    assert_within(got, expected, forward_bound(values, expected, axis, kind, element, scale),
                  f"{kind.name} {element.name} {shape} axis {axis} {force}")


def check_backward(shape: tuple[int, ...], axis: int, kind: SoftmaxKind, element: ElementKind,
                   rng: np.random.Generator, scale: float = 1.0,
                   force: SoftmaxForce | None = None) -> None:
    x = from_storage(random_values(shape, element, rng, -4.0, 4.0), element)
    y = to_storage(ref_forward(x, axis, kind), element)
    dy = random_values(shape, element, rng, -1.0, 1.0)
    got = from_storage(run_backward(dy, y, axis, kind, element, scale, force), element)
    dy64, y64 = from_storage(dy, element), from_storage(y, element)
    expected = ref_backward(dy64, y64, axis, kind, scale)
    assert_within(got, expected, backward_bound(dy64, y64, axis, kind, element, scale),
                  f"{kind.name} backward {element.name} {shape} axis {axis} {force}")


def kinds_elements() -> list[tuple[SoftmaxKind, ElementKind]]:
    """Every kind at f32 and every element at one kind in the simulator; the full grid on
    the GPU."""
    if SIMULATOR:
        return [(k, F32) for k in KINDS] + [(k, e) for k, e in
                                            zip((SOFTMAX, LOG, SOFTMAX), FLOAT_ELEMENTS)
                                            if e is not F32]
    return [(k, e) for k in KINDS for e in FLOAT_ELEMENTS]


# -- dispatch (CPU, no launch) ---------------------------------------------------------------

GPU_LIMITS = DeviceLimits(256, 50 << 20)


def test_dispatch_short_rows_share_a_block():
    choice = choose_kernel(33, 1000, 1, True, 2, GPU_LIMITS)
    lanes = 1 << (-(-33 // HELD[False]) - 1).bit_length()
    assert (choice.layout, choice.lanes, choice.threads, choice.parts) == ("rows", lanes, 256, 1)
    assert choose_kernel(33, 1000, 1, True, 2, GPU_LIMITS, held=HELD[True]).lanes == (
        1 << (-(-33 // HELD[True]) - 1).bit_length())
    assert choose_kernel(2, 10, 1, True, 2, GPU_LIMITS).lanes == 1


def test_dispatch_medium_rows_one_block_each():
    choice = choose_kernel(4096, 8192, 1, True, 2, GPU_LIMITS)
    assert (choice.lanes, choice.threads, choice.parts) == (4096 // HELD[False], 256, 1)
    for backward in (False, True):
        choice = choose_kernel(MAX_PART[backward], 10, 1, True, 4, GPU_LIMITS,
                               held=HELD[backward])
        assert (choice.lanes, choice.parts) == (1024, 1)
    assert choose_kernel(32768, 10, 1, True, 4, GPU_LIMITS, held=HELD[True]).parts == (
        32768 // MAX_PART[True])
    # a forced part that is not a whole number of units falls back to elements
    odd = choose_kernel(32768, 10, 1, True, 2, GPU_LIMITS, SoftmaxForce(part_elements=1001),
                        unit=8)
    assert odd.path == "elements" and odd.lanes * HELD[False] >= odd.part_len


def test_dispatch_unit_rows_in_registers():
    """16-byte units: short rows share a block (sub-warp groups), longer rows are one
    block of as many lanes as hold ``UNITS`` units each, up to 1024 lanes."""
    short = choose_kernel(1024, 1000, 1, True, 2, GPU_LIMITS, unit=8)
    assert (short.path, short.lanes, short.threads, short.parts) == ("registers", 32, 256, 1)
    assert choose_kernel(64, 1000, 1, True, 4, GPU_LIMITS, unit=4).lanes == 4
    row = choose_kernel(4096, 8192, 1, True, 2, GPU_LIMITS, unit=8)
    assert (row.path, row.lanes, row.threads, row.kernel) == (
        "registers", 4096 // 8 // UNITS[False], 4096 // 8 // UNITS[False], "rows_registers")
    for backward, unit in ((False, 8), (False, 4), (True, 8), (True, 4)):
        longest = MAX_REGISTER_UNITS[backward] * unit
        fits = choose_kernel(longest, 10, 1, True, 4, GPU_LIMITS, unit=unit,
                             units=UNITS[backward])
        assert (fits.path, fits.lanes, fits.parts) == ("registers", 1024, 1)
        over = choose_kernel(longest + unit, STREAM_ITEMS, 1, True, 4, GPU_LIMITS, unit=unit,
                             units=UNITS[backward])
        assert (over.path, over.parts, over.threads) == ("stream", 1, STREAM_THREADS)
    # rows that are not a whole number of units take the element kernel
    assert choose_kernel(4100, 10, 1, True, 2, GPU_LIMITS, unit=8).path == "elements"


def test_dispatch_long_rows_stream_then_split_by_problem():
    choice = choose_kernel(262144, 256, 1, True, 2, GPU_LIMITS, unit=8)
    assert (choice.path, choice.parts, choice.part_len) == ("stream", 1, 262144)
    assert choice.batch_rows == 256  # one launch
    longer = choose_kernel(3 * STREAM_PART + 8, STREAM_ITEMS, 1, True, 2, GPU_LIMITS, unit=8)
    assert longer.path == "stream" and longer.parts == 4
    assert longer.part_len % 8 == 0 and longer.part_len <= STREAM_PART
    assert (longer.parts - 1) * longer.part_len < 3 * STREAM_PART + 8 <= (
        longer.parts * longer.part_len)
    # half of L2 per batch of STATS + FINISH; the split does not depend on the device
    assert longer.batch_rows * (3 * STREAM_PART + 8) * 2 <= (50 << 20) // 2
    other = choose_kernel(3 * STREAM_PART + 8, STREAM_ITEMS, 1, True, 2,
                          DeviceLimits(128, 8 << 20), unit=8)
    assert (other.parts, other.part_len) == (longer.parts, longer.part_len)
    # few rows: cut into about STREAM_ITEMS parts, none shorter than a block's chunk
    chunk = STREAM_THREADS * UNITS[False] * 8
    few = choose_kernel(1 << 17, 64, 1, True, 2, GPU_LIMITS, unit=8)
    assert few.path == "stream" and few.parts == min(STREAM_ITEMS // 64, (1 << 17) // chunk)
    assert few.part_len >= chunk or few.parts == 1
    assert choose_kernel(chunk + 8, 2, 1, True, 2, GPU_LIMITS, unit=8,
                         units=UNITS[False]).parts == 1
    # forced paths and parts
    forced = choose_kernel(64, 3, 1, True, 4, GPU_LIMITS, SoftmaxForce(path="stream"), unit=4)
    assert (forced.path, forced.parts) == ("stream", 1)
    forced = choose_kernel(64, 3, 1, True, 4, GPU_LIMITS, SoftmaxForce(part_elements=8),
                           unit=4)
    assert (forced.path, forced.parts, forced.part_len) == ("stream", 8, 8)
    assert choose_kernel(64, 3, 1, True, 4, GPU_LIMITS, SoftmaxForce(path="elements"),
                         unit=4).path == "elements"


def test_dispatch_long_rows_split_by_problem():
    """The element kernel (unaligned or strided rows) splits rows past a group's
    registers."""
    choice = choose_kernel(262144, 256, 1, True, 2, GPU_LIMITS)
    assert choice.parts == 262144 // MAX_PART[False] and choice.part_len == MAX_PART[False]
    # half of L2 per batch of STATS + FINISH
    assert choice.batch_rows * 262144 * 2 <= (50 << 20) // 2
    # the split does not depend on the device
    other = choose_kernel(262144, 256, 1, True, 2, DeviceLimits(128, 8 << 20))
    assert (other.parts, other.part_len) == (choice.parts, choice.part_len)


def test_dispatch_columns():
    choice = choose_kernel(32768, 4096, 4096, True, 2, GPU_LIMITS)
    assert choice.layout == "cols" and choice.parts > 1
    assert choice.parts * choice.part_len >= 32768 > (choice.parts - 1) * choice.part_len
    # a strided axis without a unit-stride neighbour reads rows
    assert choose_kernel(64, 10, 3, False, 4, GPU_LIMITS).layout == "rows"
    forced = choose_kernel(64, 10, 1, True, 4, GPU_LIMITS, SoftmaxForce("cols", 16))
    assert (forced.layout, forced.parts, forced.part_len) == ("cols", 4, 16)


def test_plan_exposes_choice_and_sku():
    plan = SoftmaxPlan.select(SoftmaxDescriptor((4, 1024), 1, LOG, ElementKind.BF16))
    assert plan.choice.layout == "rows" and plan.workspace_size_for((1024, 1)) == 0
    assert plan.choice.vec and not plan.choice_for((1024, 1), aligned=False).vec
    assert plan.sku.op == int(LOG) and plan.precision_guarantee.deterministic
    split = SoftmaxPlan.select(SoftmaxDescriptor((3, 40), 1, SOFTMAX, F32),
                               force=SoftmaxForce(part_elements=8))
    assert split.choice.parts == 5 and split.workspace_size >= 3 * 5 * 2 * 4
    cols = SoftmaxPlan.select(SoftmaxDescriptor((40, 3), 0, SOFTMAX, F32))
    assert cols.choice.layout == "cols"


# -- forward / backward against float64 --------------------------------------------------------


@pytest.mark.parametrize("kind,element", kinds_elements())
@pytest.mark.parametrize("extent", (1, 2) + EDGE_LENGTHS)
def test_forward_rows(kind, element, extent, rng):
    check_forward((3, extent), 1, kind, element, rng, scale=1.0 if extent % 2 else 0.5)


@pytest.mark.parametrize("kind,element", kinds_elements())
@pytest.mark.parametrize("extent", (1, 2, 33))
def test_backward_rows(kind, element, extent, rng):
    check_backward((3, extent), 1, kind, element, rng, scale=1.0 if extent % 2 else 0.5)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("extent,path", (
    ((HELD[True] * 32, "elements"), (HELD[True] * 32 + 1, None), (4 * UNITS[False] * 32 + 4, None),
     (STREAM_THREADS * 4 * UNITS[False] + 12, "stream"),
     (STREAM_THREADS * 4 * UNITS[False] * 2 + 32, "stream")) if SIMULATOR else
    ((HELD[False] * 32 + 1, None), (MAX_PART[True] - 1, None), (MAX_PART[True] + 1, None),
     (MAX_PART[False] - 1, None), (MAX_PART[False], "elements"),
     (MAX_PART[False] + 1, None), (MAX_REGISTER_UNITS[True] * 4, None),
     (MAX_REGISTER_UNITS[True] * 4 + 4, None), (MAX_REGISTER_UNITS[False] * 4, None),
     (MAX_REGISTER_UNITS[False] * 4 + 4, None))))
def test_group_edges(kind, extent, path, rng):
    """Past 32 lanes a group is several warps (shared-memory exchange); past MAX_PART the
    element rows split, past MAX_REGISTER_UNITS the unit rows stream (f32: 4 a unit);
    the stream's last chunk is partial, and two rows of two chunks stream in two parts."""
    force = SoftmaxForce(path=path) if path else None
    if extent == STREAM_THREADS * 4 * UNITS[False] * 2 + 32:
        assert SoftmaxPlan.select(SoftmaxDescriptor((2, extent), 1, kind, F32),
                                  force=force).choice.parts == 2
    check_forward((2, extent), 1, kind, F32, rng, force=force)
    check_backward((2, extent), 1, kind, F32, rng, force=force)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("layout,part", [("rows", 8), ("rows", 1), ("cols", 7), ("cols", 1)])
def test_split_parts(kind, layout, part, rng):
    """Rows and columns cut into parts (STATS + FINISH through the workspace)."""
    force = SoftmaxForce(layout, part)
    check_forward((4, 37), 1, kind, F32, rng, force=force)
    check_backward((4, 37), 1, kind, F32, rng, force=force)
    if layout == "rows":  # 16-byte units, parts of whole units
        force = SoftmaxForce(layout, 8 * part)
        assert SoftmaxPlan.select(SoftmaxDescriptor((3, 64), 1, kind, F32),
                                  force=force).choice.vec
        check_forward((3, 64), 1, kind, F32, rng, force=force)
        check_backward((3, 64), 1, kind, F32, rng, force=force)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("axis", (0, 1, 2))
def test_every_axis_rank3(kind, axis, rng):
    check_forward((5, 6, 7), axis, kind, F32, rng, scale=0.7)
    check_backward((5, 6, 7), axis, kind, F32, rng, scale=0.7)


@pytest.mark.parametrize("kind", KINDS)
def test_rank1_and_rank8(kind, rng):
    check_forward((9,), 0, kind, F32, rng)
    check_backward((9,), 0, kind, F32, rng)
    shape = (2, 1, 2, 1, 3, 1, 2, 5)
    for axis in (0, 4, 7):
        check_forward(shape, axis, kind, F32, rng)
    check_backward(shape, 7, kind, F32, rng)


@pytest.mark.parametrize("kind", KINDS)
def test_strided_views(kind, rng):
    """A transposed input (the axis strided, the column kernel) and a sliced one (rows
    with a row stride), written into a strided output."""
    base = random_values((12, 10), F32, rng)
    x = to_device(base)
    for view, host, axis in ((x.T, base.T, 1), (x[::2, 1:8], base[::2, 1:8], 1),
                             (x[1:, ::3], base[1:, ::3], 0)):
        y_full = to_device(poisoned((host.shape[0], 2 * host.shape[1]), F32))
        y = y_full[:, ::2]
        plan = SoftmaxPlan.select(SoftmaxDescriptor(host.shape, axis, kind, F32))
        plan.run(SoftmaxArgs(view, y), workspace=_workspace(plan))
        got = to_host(y_full)
        expected = ref_forward(host, axis, kind)
        assert_within(got[:, ::2], expected, forward_bound(host, expected, axis, kind, F32, 1.0),
                      f"{kind.name} strided {host.shape} axis {axis}")
        assert np.isnan(got[:, 1::2]).all(), "wrote outside the strided output"


@pytest.mark.parametrize("kind", KINDS)
def test_unit_rows_need_one_row_stride(kind, rng):
    """Aligned rows of stride 1 move as 16-byte units when the other axes merge into one
    row stride (a sliced batch of rows), else as elements."""
    base = random_values((2, 3, 16), F32, rng)
    x = to_device(base)
    for rows, path in ((slice(None), "registers"), (slice(0, 2), "elements")):
        index = (slice(None), rows, slice(0, 8))
        host = base[index]
        plan = SoftmaxPlan.select(SoftmaxDescriptor(host.shape, 2, kind, F32))
        assert plan.choice_for(tuple(s // 4 for s in host.strides)).path == path
        y_full = to_device(poisoned(base.shape, F32))
        plan.run(SoftmaxArgs(x[index], y_full[index]), workspace=_workspace(plan))
        got = to_host(y_full)
        expected = ref_forward(host, 2, kind)
        outside = np.ones(base.shape, bool)
        outside[index] = False
        assert np.isnan(got[outside]).all(), "wrote outside the view"
        assert_within(got[index], expected, forward_bound(host, expected, 2, kind, F32, 1.0),
                      f"{kind.name} {path} rows of a {host.strides} view")


@IEEE_SPECIALS
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("force", [None, SoftmaxForce("rows", 4), SoftmaxForce(path="stream"),
                                   SoftmaxForce(path="elements"), SoftmaxForce("rows", 3),
                                   SoftmaxForce("cols", 3)])
def test_nan_inf_rows(kind, force, rng):
    """Rows with NaN, +inf, -inf, all -inf, an all -inf part: NaN where torch gives NaN
    (rows of 8 f32: two 16-byte units, so every row path)."""
    inf, nan = np.inf, np.nan
    x = np.array([[0.5, nan, 1.0, 2.0, -1.0, 0.0, 3.0, 0.25],
                  [0.5, inf, 1.0, 2.0, -1.0, 0.0, 3.0, 0.25],
                  [inf, inf, 1.0, 2.0, -1.0, 0.0, 3.0, 0.25],
                  [-inf, -inf, -inf, -inf, 2.0, -1.0, 0.0, 3.0],
                  [-inf] * 8,
                  [1.0, -inf, 1.0, 2.0, -1.0, -inf, 3.0, -inf],
                  [0.0] * 8], dtype=np.float32)
    check_forward(x.shape, 1, kind, F32, rng, force=force, x=x)
    check_forward(x.T.shape, 0, kind, F32, rng, force=force, x=np.ascontiguousarray(x.T))


def test_bit_identical_reruns(rng):
    for extent, forces in ((45, (None, SoftmaxForce("rows", 8), SoftmaxForce("cols", 8))),
                           (48, (None, SoftmaxForce(path="stream"), SoftmaxForce("rows", 8)))):
        x = random_values((6, extent), F32, rng)
        for force in forces:
            first = run_forward(x, 1, SOFTMAX, F32, force=force)
            again = run_forward(x, 1, SOFTMAX, F32, force=force)
            assert np.array_equal(first.view(np.uint32), again.view(np.uint32))
    # the part split is fixed by the problem: the same bits whatever the grid
    plan = SoftmaxPlan.select(SoftmaxDescriptor((6, 45), 1, SOFTMAX, F32))
    assert plan.choice == plan.choice_for((45, 1))


def test_empty():
    for shape, axis in (((0, 5), 1), ((4, 0), 1), ((0,), 0)):
        plan = SoftmaxPlan.select(SoftmaxDescriptor(shape, axis, SOFTMAX, F32))
        y = to_device(np.zeros(shape, np.float32))
        plan.run(SoftmaxArgs(to_device(np.zeros(shape, np.float32)), y))


def test_functional_api(rng):
    """``ops.softmax / log_softmax / softmax_backward`` allocate the output (and the
    workspace when the layout needs it) with the input's framework."""
    from baracuda_numba import ops

    x = random_values((3, 40), F32, rng)
    for fn, kind in ((ops.softmax, SOFTMAX), (ops.log_softmax, LOG)):
        for dim in (-1, 0):
            y = to_host(fn(to_device(x), dim))
            expected = ref_forward(x, dim % 2, kind)
            assert_within(y, expected, forward_bound(x, expected, dim % 2, kind, F32, 1.0),
                          f"ops {kind.name} dim {dim}")
        y = ref_forward(x, 1, kind).astype(np.float32)
        dy = random_values((3, 40), F32, rng)
        dx = to_host(ops.softmax_backward(to_device(dy), to_device(y), 1, log=kind is LOG))
        assert_within(dx, ref_backward(dy, y, 1, kind),
                      backward_bound(dy, y, 1, kind, F32, 1.0), f"ops {kind.name} backward")
    with pytest.raises(InvalidProblem, match="softmax: dim = 2"):
        ops.softmax(to_device(x), 2)


# -- rejections -------------------------------------------------------------------------------


@pytest.mark.parametrize("desc,error", [
    (SoftmaxDescriptor((4, 5), 2, SOFTMAX, F32), InvalidProblem),
    (SoftmaxDescriptor((4, 5), -1, SOFTMAX, F32), InvalidProblem),
    (SoftmaxDescriptor((4, 5), 1, SoftmaxKind.GUMBEL_SOFTMAX, F32), Unsupported),
    (SoftmaxDescriptor((4, 5), 1, SoftmaxKind.SPARSEMAX, F32), Unsupported),
    (SoftmaxDescriptor((4, 5), 1, SOFTMAX, ElementKind.I32), Unsupported),
    (SoftmaxDescriptor((4, 5), 1, SOFTMAX, F32, float("nan")), InvalidProblem),
    (SoftmaxDescriptor((1,) * 9, 1, SOFTMAX, F32), Unsupported),
    (SoftmaxDescriptor((4, -1), 1, SOFTMAX, F32), InvalidProblem),
])
def test_select_rejects(desc, error):
    with pytest.raises(error, match="^SoftmaxPlan: "):
        SoftmaxPlan.select(desc)


def test_run_rejects_before_launch():
    x = to_device(np.zeros((4, 5), np.float32))
    plan = SoftmaxPlan.select(SoftmaxDescriptor((4, 5), 1, SOFTMAX, F32))
    for bad in (SoftmaxArgs(x, to_device(poisoned((4, 6), F32))),
                SoftmaxArgs(x, to_device(poisoned((4, 5), ElementKind.F64))),
                SoftmaxArgs(to_device(np.zeros((5, 4), np.float32)),
                            to_device(poisoned((4, 5), F32)))):
        with pytest.raises(InvalidProblem, match="^SoftmaxPlan: "):
            plan.run(bad)
        assert np.isnan(to_host(bad.y)).all()
    back = SoftmaxBackwardPlan.select(SoftmaxBackwardDescriptor((4, 5), 1, LOG, F32))
    dx = to_device(poisoned((4, 5), F32))
    for args, error in ((SoftmaxBackwardArgs(x, to_device(np.zeros((4, 4), np.float32)), dx),
                         InvalidProblem),
                        (SoftmaxBackwardArgs(x, x, to_device(poisoned((5, 4), F32))),
                         InvalidProblem),
                        (SoftmaxBackwardArgs(to_device(np.zeros((4,), np.float32)), x, dx),
                         BufferTooSmall)):
        with pytest.raises(error, match="^SoftmaxBackwardPlan: "):
            back.run(args)
    assert np.isnan(to_host(dx)).all()


def test_workspace_too_small():
    plan = SoftmaxPlan.select(SoftmaxDescriptor((3, 40), 1, SOFTMAX, F32),
                              force=SoftmaxForce(part_elements=8))
    y = to_device(poisoned((3, 40), F32))
    x = to_device(np.zeros((3, 40), np.float32))
    for workspace in (None, to_device(np.zeros(plan.workspace_size - 1, np.uint8))):
        with pytest.raises(WorkspaceTooSmall):
            plan.run(SoftmaxArgs(x, y), workspace=workspace)
    assert np.isnan(to_host(y)).all()
    with pytest.raises(InvalidProblem, match="force.layout"):
        SoftmaxPlan.select(SoftmaxDescriptor((3, 40), 1, SOFTMAX, F32),
                           force=SoftmaxForce("diagonal"))


# -- GPU: torch forward and autograd, the big shapes --------------------------------------------

def _torch_check(torch, shape, dim, kind, dtype):
    """Forward against torch in float64 on the same (rounded) input, then the gradient
    through torch.autograd: ours from our rounded output, the reference exact."""
    import baracuda_numba.torch as bt

    element = {torch.float16: ElementKind.F16, torch.bfloat16: ElementKind.BF16,
               torch.float32: F32, torch.float64: ElementKind.F64}[dtype]
    rtol, u, n = TOLERANCE[element][0], _acc_roundoff(element), shape[dim]
    x = (torch.randn(shape, device="cuda", dtype=dtype) * 3).requires_grad_()
    x64 = x.detach().double().requires_grad_()
    fn, ref_fn = (bt.log_softmax, torch.log_softmax) if kind is LOG else (bt.softmax,
                                                                          torch.softmax)
    y, ref = fn(x, dim), ref_fn(x64, dim)
    if kind is LOG:
        terms = 2 * float(x64.detach().abs().max()) + math.log(n) + math.sqrt(n)
        torch.testing.assert_close(y.double(), ref.detach(), rtol=rtol, atol=u * terms)
    else:
        torch.testing.assert_close(y.double(), ref.detach(), rtol=rtol + u * math.sqrt(n),
                                   atol=1e-30)
    dy = torch.randn_like(y)
    (dx,) = torch.autograd.grad(y, x, dy)
    (dref,) = torch.autograd.grad(ref, x64, dy.double())
    dy64, p = dy.double().abs(), ref.detach()
    if kind is LOG:
        total = p.exp() * dy64.sum(dim, keepdim=True)
        # our y is rounded: exp(y) carries its relative error (1 + |y|) rtol
        bound = 3 * rtol * (dy64 + total * (1 + p.abs())) + u * math.sqrt(n) * total
    else:
        total = p * (dy64 * p).sum(dim, keepdim=True)
        bound = 3 * rtol * (p * dy64 + 2 * total) + u * math.sqrt(n) * total
    bad = (dx.double() - dref).abs() > bound + 1e-30
    assert not bad.any(), f"{int(bad.sum())} gradient elements off, first at {bad.nonzero()[:4]}"


@pytest.mark.gpu
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", ("bfloat16", "float32"))
@pytest.mark.parametrize("shape,dim", [((64, 1 << 17), 1), ((4, 1_100_000), 1),
                                       ((33, 4096), -1), ((32768, 64), 0), ((7, 3, 1025), 1)])
def test_gpu_against_torch(kind, dtype, shape, dim):
    torch = torch_or_skip()
    _torch_check(torch, shape, dim, kind, getattr(torch, dtype))


@pytest.mark.gpu
def test_gpu_torch_compile_and_dtype():
    """The custom ops under torch.compile (no graph break), and ``dtype=`` as torch."""
    torch = torch_or_skip()
    import baracuda_numba.torch as bt

    x = torch.randn(64, 1000, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    compiled = torch.compile(lambda t: bt.log_softmax(t, -1, dtype=torch.float32).sum(),
                             fullgraph=True)
    loss = compiled(x)
    (grad,) = torch.autograd.grad(loss, x)
    ref = torch.log_softmax(x.float(), -1).sum()
    (grad_ref,) = torch.autograd.grad(ref, x)
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-2)
    torch.testing.assert_close(grad.float(), grad_ref.float(), rtol=2e-2, atol=2e-2)
    assert bt.softmax(x, 1, dtype=torch.float32).dtype == torch.float32


@pytest.mark.gpu
@pytest.mark.parametrize("kind", KINDS)
def test_gpu_all_elements(kind, rng):
    torch_or_skip()
    for element in FLOAT_ELEMENTS:
        for shape, axis in (((300, 1000), 1), ((1000, 300), 0), ((8, 70000), 1)):
            check_forward(shape, axis, kind, element, rng)
            check_backward(shape, axis, kind, element, rng)


@pytest.mark.gpu
def test_gpu_over_2_31_elements():
    """One bf16 tensor of more than 2^31 elements (64-bit offsets)."""
    torch = torch_or_skip()
    import baracuda_numba.torch as bt

    rows, n = (1 << 31) // 4096 + 3, 4096
    x = torch.randn(rows, n, device="cuda", dtype=torch.bfloat16)
    y = bt.softmax(x, -1)
    for r in (0, rows // 2, rows - 1):
        torch.testing.assert_close(y[r].float(), torch.softmax(x[r].float(), -1),
                                   rtol=8e-3 * 8, atol=1e-6)
    del y
    torch.cuda.empty_cache()
