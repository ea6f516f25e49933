"""ReducePlan / ReduceBackwardPlan / ArgReducePlan against NumPy float64 (and, on the GPU,
torch forward and torch.autograd): every kind x element, layouts, NaN/inf/ties, empty
axes, correction, determinism, and every documented rejection."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import EDGE_LENGTHS, FLOAT_ELEMENTS, SIMULATOR, torch_or_skip

from baracuda_numba.errors import InvalidProblem, Unsupported, WorkspaceTooSmall
from baracuda_numba.kernels.reduce import (
    CHUNK,
    GRAD_KERNEL_KIND,
    HOLD_POLL_SLOTS,
    HOLD_STASH_BYTES,
    LSE_PART,
    REDUCE_BACKWARD_COLS_STASH_KERNELS,
    REDUCE_BACKWARD_ROWS_HOLD_STASH_KERNELS,
    REG_COL_STRIP_WORDS,
    REG_COLS_STASH_BYTES,
    SYNC_BLOCK,
    VEC_LOADS,
    tie_mask_iters,
)
from baracuda_numba.plans.reduce import (
    REDUCE_ELEMENTS,
    REDUCE_KINDS,
    ArgReduceArgs,
    ArgReduceDescriptor,
    ArgReducePlan,
    ReduceArgs,
    ReduceBackwardArgs,
    ReduceBackwardDescriptor,
    ReduceBackwardPlan,
    ReduceDescriptor,
    ReducePlan,
)
from baracuda_numba.plans.reduce.geometry import (
    BROADCAST_MIN_X_ROW_BYTES,
    HOLD_ROWS_IN_FLIGHT,
    HOLD_TIES_ROWS_IN_FLIGHT,
    REG_STREAM_MIN_LANES,
    STREAM_MIN_BATCHES,
    STREAM_TARGET_BLOCKS,
    SYNC_BATCHES,
    VEC_TARGET_BLOCKS,
    cols_reg_layout,
    cols_vec_geometry,
    reg_lanes,
    rows_vec_geometry,
    split_aim,
    sync_layout,
)
from baracuda_numba.testing import (
    SUBNORMAL_SPACING,
    TOLERANCE,
    assert_within,
    from_storage,
    poisoned,
    random_values,
    to_device,
    to_host,
    to_storage,
)
from baracuda_numba.types import ElementKind, PlanPreference, ReduceKind

K = ReduceKind
E = ElementKind
#: A plan selected for runs without a workspace (``run`` requires the one ``select``
#: sized: upstream's contract): the single-pass paths.
NO_WORKSPACE = PlanPreference(max_workspace_bytes=0)
INT_ELEMENTS = (E.I32, E.I64)
# The simulator treats IEEE specials like NumPy scalars do (RuntimeWarning on inf - inf,
# 0/0, overflow); the GPU produces them silently. Tests that feed specials ignore them.
IEEE_SPECIALS = pytest.mark.filterwarnings("ignore::RuntimeWarning")

# -- NumPy float64 references -------------------------------------------------------------


def reference(kind: ReduceKind, x: np.ndarray, axis: int, correction: int = 1) -> np.ndarray:
    """Forward reference in float64, keepdim."""
    x = x.astype(np.float64)
    with np.errstate(all="ignore"):
        if kind is K.SUM:
            return x.sum(axis=axis, keepdims=True)
        if kind is K.MEAN:
            n = x.shape[axis]
            return x.sum(axis=axis, keepdims=True) / n if n else \
                np.full(x.sum(axis=axis, keepdims=True).shape, np.nan)
        if kind is K.PROD:
            return x.prod(axis=axis, keepdims=True)
        if kind is K.MAX:
            return x.max(axis=axis, keepdims=True)  # NumPy propagates NaN
        if kind is K.MIN:
            return x.min(axis=axis, keepdims=True)
        if kind is K.NORM2:
            return np.sqrt((x * x).sum(axis=axis, keepdims=True))
        if kind is K.LOG_SUM_EXP:
            m = x.max(axis=axis, keepdims=True) if x.shape[axis] else \
                np.full(x.sum(axis=axis, keepdims=True).shape, -np.inf)
            finite_m = np.where(np.isfinite(m), m, 0.0)
            s = np.exp(x - finite_m).sum(axis=axis, keepdims=True)
            out = finite_m + np.log(s)
            out = np.where(m == np.inf, np.inf, out)
            out = np.where(m == -np.inf, -np.inf, out)
            return np.where(np.isnan(x).any(axis=axis, keepdims=True), np.nan, out)
        if kind in (K.VAR, K.STD):
            n = x.shape[axis]
            mean = x.sum(axis=axis, keepdims=True) / n if n else np.nan
            m2 = ((x - mean) ** 2).sum(axis=axis, keepdims=True)
            var = m2 / max(n - correction, 0)
            return var if kind is K.VAR else np.sqrt(var)
    raise AssertionError(kind)


def arg_reference(kind: ReduceKind, x: np.ndarray, axis: int) -> np.ndarray:
    """First index of the max/min; the first NaN wins (torch)."""
    x = x.astype(np.float64)
    pick = np.argmax if kind is K.ARGMAX else np.argmin  # first occurrence; NaN first
    return np.expand_dims(pick(x, axis=axis), axis).astype(np.int64)


def backward_reference(kind: ReduceKind, dy: np.ndarray, x: np.ndarray, y: np.ndarray,
                       axis: int, correction: int = 1) -> np.ndarray:
    """dx in float64 (y is the saved forward output, as stored)."""
    n = x.shape[axis]
    dy = np.broadcast_to(dy, x.shape)
    y = np.broadcast_to(y, x.shape)
    with np.errstate(all="ignore"):
        if kind is K.SUM:
            return dy.copy()
        if kind is K.MEAN:
            return dy / n
        if kind in (K.MAX, K.MIN):
            mask = x == y
            count = np.broadcast_to(mask.sum(axis=axis, keepdims=True), x.shape)
            return dy / count * mask
        if kind is K.PROD:  # torch: exact where the line holds zeros
            zero = x == 0
            zeros = np.broadcast_to(zero.sum(axis=axis, keepdims=True), x.shape)
            others = np.broadcast_to(np.where(zero, 1.0, x).prod(axis=axis, keepdims=True),
                                     x.shape)
            exact = np.where(zero & (zeros == 1), dy * others, dy * 0.0)
            return np.where(zeros == 0, dy * y / x, exact)
        if kind is K.NORM2:
            return np.where(y == 0, 0.0, dy / y) * x
        if kind is K.LOG_SUM_EXP:
            return dy * np.exp(x - y)
        mean = x.mean(axis=axis, keepdims=True)
        coef = 2.0 / (n - correction) if n != correction else np.inf
        if kind is K.VAR:
            return dy * coef * (x - mean)
        if kind is K.STD:
            return np.where(y == 0, 0.0, dy / (2 * y)) * coef * (x - mean)
    raise AssertionError(kind)


# -- helpers -----------------------------------------------------------------------------


def acc_rtol(element: ElementKind) -> float:
    return TOLERANCE[E.F64 if element is E.F64 else E.F32][0]


def check_forward(got: np.ndarray, expected: np.ndarray, kind: ReduceKind,
                  element: ElementKind, x64: np.ndarray, axis: int, what: str) -> None:
    """|got - expected| <= rtol(element) |expected| (one output rounding) + accumulation
    error rtol(accumulator) * sqrt(n) * scale, scale = the kind's magnitude (sum |x| for a
    sum...). Max/Min are exact. NaN and +-inf positions must agree exactly."""
    got = np.asarray(got, dtype=np.float64)
    n = max(x64.shape[axis], 1)
    with np.errstate(all="ignore"):
        absx = np.abs(np.where(np.isfinite(x64), x64, 0.0))
        scale = {
            K.SUM: absx.sum(axis=axis, keepdims=True),
            K.MEAN: absx.mean(axis=axis, keepdims=True) if x64.shape[axis] else 0.0,
            K.NORM2: np.abs(expected), K.PROD: np.abs(expected) * n,
            K.LOG_SUM_EXP: absx.max(axis=axis, keepdims=True, initial=0.0) + 1.0,
            K.VAR: (absx ** 2).sum(axis=axis, keepdims=True) / max(n - 1, 1),
            K.STD: np.sqrt((absx ** 2).sum(axis=axis, keepdims=True) / max(n - 1, 1)),
        }.get(kind, 0.0)
    rtol = TOLERANCE[element][0] if element not in INT_ELEMENTS else 0.0
    tol = rtol * np.abs(expected) + acc_rtol(element) * math.sqrt(n) * scale
    assert_specials_and_values(got, expected, tol, what)


def assert_specials_and_values(got: np.ndarray, expected: np.ndarray, tol: np.ndarray,
                               what: str) -> None:
    assert_within(got, expected, tol, what)


def inputs_for(kind: ReduceKind, shape: tuple[int, ...], element: ElementKind,
               rng: np.random.Generator) -> np.ndarray:
    """Fresh inputs that keep the kind well conditioned (Prod: factors e^u, u uniform in
    +-0.02, so that the product of thousands stays in f16 range)."""
    if kind is K.PROD and element not in INT_ELEMENTS:
        return to_storage(np.exp(rng.uniform(-0.02, 0.02, size=shape)), element)
    if kind is K.PROD:
        return rng.integers(-3, 4, size=shape).astype(element.storage_dtype)
    return random_values(shape, element, rng)


def run_forward(kind: ReduceKind, x_host: np.ndarray, axis: int, element: ElementKind,
                correction: int = 1, workspace: bool = True, x_dev=None, y_dev=None):
    desc = ReduceDescriptor(kind, x_host.shape, axis, element, correction)
    plan = ReducePlan.select(desc, None if workspace else NO_WORKSPACE)
    y = y_dev if y_dev is not None else to_device(poisoned(desc.output_shape(), element))
    ws = None
    if workspace and plan.workspace_size:
        ws = to_device(np.zeros(plan.workspace_size, np.uint8))
    plan.run(ReduceArgs(x_dev if x_dev is not None else to_device(x_host), y), workspace=ws)
    return from_storage(host(y), element), plan


def host(array):
    """Host copy of a device array (NumPy views stand for themselves in the simulator)."""
    return np.array(array) if isinstance(array, np.ndarray) else to_host(array)


# -- forward -----------------------------------------------------------------------------

SHAPES = [((EDGE_LENGTHS[0],), 0), ((3, EDGE_LENGTHS[2]), 1), ((EDGE_LENGTHS[1] + 1, 3), 0),
          ((2, EDGE_LENGTHS[3], 3), 1)]
if not SIMULATOR:
    SHAPES += [((5, n), 1) for n in EDGE_LENGTHS] + [((n, 7), 0) for n in EDGE_LENGTHS] + \
        [((3, 100_000), 1), ((100_000, 3), 0), ((70_000,), 0), ((4, 9000, 5), 1)]
SIM_SHAPES = SHAPES[:2] if SIMULATOR else SHAPES


@pytest.mark.parametrize("element", FLOAT_ELEMENTS, ids=lambda e: e.name)
@pytest.mark.parametrize("kind", REDUCE_KINDS, ids=lambda k: k.name)
@pytest.mark.parametrize("shape,axis", SIM_SHAPES, ids=str)
def test_forward_matches_numpy(kind, element, shape, axis, rng):
    x = inputs_for(kind, shape, element, rng)
    got, _ = run_forward(kind, x, axis, element)
    x64 = from_storage(x, element)
    check_forward(got, reference(kind, x64, axis), kind, element, x64, axis,
                  f"{kind.name} {element.name} {shape} axis {axis}")


@pytest.mark.parametrize("element", INT_ELEMENTS, ids=lambda e: e.name)
@pytest.mark.parametrize("kind", [K.SUM, K.PROD, K.MAX, K.MIN], ids=lambda k: k.name)
def test_integer_forward_is_exact(kind, element, rng):
    """Integer reductions accumulate in int64 and store in the element's width (an int32
    result wraps, two's complement): a product of 37 factors in [-3, 3] without a zero
    (about one row in 300) leaves the int32 range."""
    shape, axis = (4, 37), 1
    x = inputs_for(kind, shape, element, rng)
    got, plan = run_forward(kind, x, axis, element)
    expected = {K.SUM: np.sum, K.PROD: np.prod, K.MAX: np.max, K.MIN: np.min}[kind](
        x.astype(np.int64), axis=axis, keepdims=True).astype(element.storage_dtype)
    np.testing.assert_array_equal(got, expected)
    assert plan.precision_guarantee.accumulator is E.I64


@pytest.mark.parametrize("element", INT_ELEMENTS, ids=lambda e: e.name)
def test_integer_min_max_extremes(element):
    """Min runs the Max kernel on bitwise-NOT values: exact at the type's extremes (the
    int64 minimum has no negation), with and without a split of the axis."""
    info = np.iinfo(element.storage_dtype)
    rows = np.array([[info.min, 0, info.max, -1], [info.max, info.max, info.max, info.max],
                     [info.min, info.min, info.min, info.min], [5, info.min + 1, -3, 7]],
                    element.storage_dtype)
    long = np.repeat(rows, 4096, axis=1)  # long enough to split
    for x in (rows, long):
        for kind, op in ((K.MAX, np.max), (K.MIN, np.min)):
            got, _ = run_forward(kind, x, 1, element)
            np.testing.assert_array_equal(got, op(x, axis=1, keepdims=True))


@IEEE_SPECIALS
@pytest.mark.parametrize("element", [E.F16, E.BF16, E.F32, E.F64], ids=lambda e: e.name)
def test_min_of_flipped_values(element):
    """Min as the flipped Max: NaN wins, signed zeros and infinities keep their order."""
    rows = np.array([[0.0, -0.0, 1.0, 2.0], [np.nan, -np.inf, 1.0, -5.0],
                     [np.inf, np.inf, np.inf, np.inf], [-np.inf, 3.0, np.nan, -np.inf],
                     [2.5, -1.5, 0.25, -1.5]])
    x = to_storage(rows, element)
    x64 = from_storage(x, element)
    for kind, op in ((K.MAX, np.max), (K.MIN, np.min)):
        got, _ = run_forward(kind, x, 1, element)
        np.testing.assert_array_equal(got, op(x64, axis=1, keepdims=True), kind.name)


def test_int32_sum_wraps_like_int32(rng):
    x = np.full((2, 3), 2**30, dtype=np.int32)
    x[1] = rng.integers(-5, 5, size=3)
    got, _ = run_forward(K.SUM, x, 1, E.I32)
    assert got[0, 0] == np.int32(np.int64(3 * 2**30) - 2**32)  # wraps
    assert got[1, 0] == int(x[1].astype(np.int64).sum())


@pytest.mark.parametrize("element", FLOAT_ELEMENTS + INT_ELEMENTS, ids=lambda e: e.name)
@pytest.mark.parametrize("kind", [K.ARGMAX, K.ARGMIN], ids=lambda k: k.name)
def test_arg_reduce_first_occurrence(kind, element, rng):
    shape, axis = (3, 33) if SIMULATOR else (5, 1000), 1
    # few distinct values: plenty of ties
    x = to_storage(rng.integers(-2, 3, size=shape), element)
    desc = ArgReduceDescriptor(kind, shape, axis, element)
    plan = ArgReducePlan.select(desc, NO_WORKSPACE)
    y = to_device(poisoned(desc.output_shape(), E.I64))
    plan.run(ArgReduceArgs(to_device(x), y))
    np.testing.assert_array_equal(to_host(y), arg_reference(kind, from_storage(x, element), axis))


@IEEE_SPECIALS
@pytest.mark.parametrize("kind", [K.ARGMAX, K.ARGMIN], ids=lambda k: k.name)
def test_arg_reduce_nan_is_the_extreme(kind):
    x = np.array([[1.0, np.nan, 5.0, np.nan], [np.inf, 2.0, -np.inf, 2.0],
                  [-np.inf, -np.inf, -np.inf, -np.inf]], dtype=np.float32)
    desc = ArgReduceDescriptor(kind, x.shape, 1, E.F32)
    y = to_device(poisoned((3, 1), E.I64))
    ArgReducePlan.select(desc, NO_WORKSPACE).run(ArgReduceArgs(to_device(x), y))
    expected = [[1], [0], [0]] if kind is K.ARGMAX else [[1], [2], [0]]
    np.testing.assert_array_equal(to_host(y), expected)


@IEEE_SPECIALS
@pytest.mark.parametrize("element", [E.F32, E.BF16], ids=lambda e: e.name)
def test_nan_and_inf_semantics(element):
    rows = np.array([
        [1.0, np.nan, 3.0, -1.0],           # NaN propagates through max/min/sum/lse
        [-np.inf, -np.inf, -np.inf, -np.inf],  # lse -inf
        [np.inf, 1.0, 2.0, -np.inf],        # lse +inf, max inf, min -inf, sum NaN
        [np.inf, np.inf, 0.5, 0.25],        # lse +inf (inf == max branch)
        [-np.inf, 2.0, -np.inf, 1.0],       # lse of the finite part
    ])
    x = to_storage(rows, element)
    x64 = from_storage(x, element)
    for kind in REDUCE_KINDS:
        got, _ = run_forward(kind, x, 1, element)
        check_forward(got, reference(kind, x64, 1), kind, element, x64, 1,
                      f"{kind.name} specials")


def test_norm2_half_does_not_overflow(rng):
    # squares of 300 overflow f16 (65504); the f32 accumulator does not
    x = to_storage(rng.uniform(250, 300, size=(2, 40)), E.F16)
    got, _ = run_forward(K.NORM2, x, 1, E.F16)
    x64 = from_storage(x, E.F16)
    assert np.all(np.isfinite(got))
    check_forward(got, reference(K.NORM2, x64, 1), K.NORM2, E.F16, x64, 1, "norm2 f16")


def test_half_sum_accumulates_in_f32():
    # 2048 + 63 ones: an f16 accumulator sticks at 2048 (spacing 2, ties to even); the f32
    # accumulator reaches 2111, which the f16 output rounds to 2112
    x = np.ones((1, 64), dtype=np.float16)
    x[0, 0] = 2048
    got, _ = run_forward(K.SUM, x, 1, E.F16)
    assert got[0, 0] == 2112


@IEEE_SPECIALS
@pytest.mark.parametrize("correction", [0, 1, 2, 3])
@pytest.mark.parametrize("kind", [K.VAR, K.STD], ids=lambda k: k.name)
def test_var_std_correction(kind, correction, rng):
    x = random_values((4, 2), E.F32, rng)
    x[3] = 0.5  # constant row: m2 = 0, so n <= correction gives NaN there, inf elsewhere
    got, _ = run_forward(kind, x, 1, E.F32, correction=correction)
    x64 = from_storage(x, E.F32)
    expected = reference(kind, x64, 1, correction)
    if correction >= 2:
        assert np.all(np.isinf(got[:3])) and np.isnan(got[3, 0])
    check_forward(got, expected, kind, E.F32, x64, 1, f"{kind.name} correction {correction}")


@IEEE_SPECIALS
@pytest.mark.parametrize("kind", [k for k in REDUCE_KINDS if k not in (K.MAX, K.MIN)],
                         ids=lambda k: k.name)
def test_empty_axis(kind):
    x = np.zeros((3, 0), dtype=np.float32)
    got, _ = run_forward(kind, x, 1, E.F32)
    expected = {K.SUM: 0.0, K.PROD: 1.0, K.MEAN: np.nan, K.LOG_SUM_EXP: -np.inf,
                K.NORM2: 0.0, K.VAR: np.nan, K.STD: np.nan}[kind]
    np.testing.assert_array_equal(got, np.full((3, 1), expected))


def test_empty_tensor_is_a_no_op():
    desc = ReduceDescriptor(K.SUM, (0, 5), 1, E.F32)
    plan = ReducePlan.select(desc, NO_WORKSPACE)
    y = to_device(np.zeros((0, 1), np.float32))
    plan.run(ReduceArgs(to_device(np.zeros((0, 5), np.float32)), y))
    assert to_host(y).shape == (0, 1)


@pytest.mark.simulator  # NumPy views stand in for device arrays; the GPU variant uses torch
@pytest.mark.parametrize("kind", [K.SUM, K.MAX, K.VAR, K.LOG_SUM_EXP], ids=lambda k: k.name)
def test_strided_and_broadcast_operands(kind, rng):
    base = random_values((6, 2, 40), E.F32, rng)
    x = base[::2, 1, ::3]  # (3, 14), strides (160, 3) elements
    x64 = x.astype(np.float64)
    for axis, out in ((1, poisoned((3, 4), E.F32)[:, 1:2]),      # strides (4, 1)
                      (0, poisoned((2, 28), E.F32)[1:2, ::2])):  # strides (28, 2)
        run_forward(kind, np.ascontiguousarray(x), axis, E.F32, x_dev=x, y_dev=out)
        check_forward(from_storage(out, E.F32), reference(kind, x64, axis), kind, E.F32, x64,
                      axis, f"strided {kind.name} axis {axis}")
    row = random_values((1, 9), E.F32, rng)
    x_b = np.broadcast_to(row, (4, 9))  # stride 0 on axis 0
    for axis in (0, 1):
        got, _ = run_forward(kind, np.ascontiguousarray(x_b), axis, E.F32, x_dev=x_b)
        xb64 = x_b.astype(np.float64)
        check_forward(got, reference(kind, xb64, axis), kind, E.F32, xb64, axis,
                      f"broadcast {kind.name} axis {axis}")


@pytest.mark.gpu
@pytest.mark.parametrize("kind", [K.SUM, K.MAX, K.VAR, K.LOG_SUM_EXP], ids=lambda k: k.name)
def test_gpu_strided_and_broadcast_operands(kind):
    torch = torch_or_skip()
    base = torch.rand(600, 2, 4000, device="cuda") * 4 - 2
    x = base[::2, 1, ::3]  # (300, 1334), strides (8000, 3)
    x64 = x.double().cpu().numpy()
    for axis in (0, 1):
        out_base = torch.full((2,) + tuple(1 if d == axis else s for d, s in
                                           enumerate(x.shape)), float("nan"), device="cuda")
        out = out_base[1]
        out = out.transpose(0, 1).contiguous().transpose(0, 1) if axis == 1 else out
        desc = ReduceDescriptor(kind, tuple(x.shape), axis, E.F32)
        plan = ReducePlan.select(desc)
        plan.run(ReduceArgs(x, out), workspace=torch.empty(plan.workspace_size,
                                                           device="cuda", dtype=torch.uint8))
        check_forward(out.double().cpu().numpy(), reference(kind, x64, axis), kind, E.F32,
                      x64, axis, f"strided {kind.name} axis {axis}")
    row = torch.rand(1, 5000, device="cuda")
    xb = row.expand(700, 5000)
    xb64 = xb.double().cpu().numpy()
    for axis in (0, 1):
        desc = ReduceDescriptor(kind, (700, 5000), axis, E.F32)
        plan = ReducePlan.select(desc)
        out = torch.full(desc.output_shape(), float("nan"), device="cuda")
        plan.run(ReduceArgs(xb, out), workspace=torch.empty(plan.workspace_size,
                                                            device="cuda", dtype=torch.uint8))
        check_forward(out.double().cpu().numpy(), reference(kind, xb64, axis), kind, E.F32,
                      xb64, axis, f"broadcast {kind.name} axis {axis}")


def test_rank_1_and_rank_8(rng):
    shape8 = (2, 1, 3, 1, 2, 3, 1, 5)
    x = random_values(shape8, E.F32, rng)
    for axis in (0, 2, 5, 7):
        got, _ = run_forward(K.SUM, x, axis, E.F32)
        check_forward(got, reference(K.SUM, x.astype(np.float64), axis), K.SUM, E.F32,
                      x.astype(np.float64), axis, f"rank 8 axis {axis}")
    x1 = random_values((EDGE_LENGTHS[2],), E.F32, rng)
    got, _ = run_forward(K.MEAN, x1, 0, E.F32)
    check_forward(got, reference(K.MEAN, x1.astype(np.float64), 0), K.MEAN, E.F32,
                  x1.astype(np.float64), 0, "rank 1")


@IEEE_SPECIALS  # Std of one element with correction 1 is 0/0 = NaN
def test_axis_length_one(rng):
    x = random_values((5, 1, 3), E.F32, rng)
    for kind in (K.SUM, K.STD, K.LOG_SUM_EXP):
        got, _ = run_forward(kind, x, 1, E.F32)
        x64 = x.astype(np.float64)
        check_forward(got, reference(kind, x64, 1), kind, E.F32, x64, 1, kind.name)


def test_split_and_single_pass_agree_and_are_deterministic(rng):
    shape = (EDGE_LENGTHS[1] * 9,) if SIMULATOR else (3_000_000,)
    x = random_values(shape, E.F32, rng)
    plan = ReducePlan.select(ReduceDescriptor(K.SUM, shape, 0, E.F32))
    assert plan.workspace_size > 0  # one long row splits
    split1, _ = run_forward(K.SUM, x, 0, E.F32)
    split2, _ = run_forward(K.SUM, x, 0, E.F32)
    single, _ = run_forward(K.SUM, x, 0, E.F32, workspace=False)
    assert split1.tobytes() == split2.tobytes()
    x64 = x.astype(np.float64)
    for got in (split1, single):
        check_forward(got, reference(K.SUM, x64, 0), K.SUM, E.F32, x64, 0, "split/single")
    limited = ReducePlan.select(ReduceDescriptor(K.SUM, shape, 0, E.F32),
                                PlanPreference(max_workspace_bytes=0))
    assert limited.workspace_size == 0


def test_unsplit_column_geometry():
    """A column layout that may not split the axis (no workspace) trades slots for lanes
    along the axis instead of running in a handful of blocks: the grid grows towards the
    one-wave target, each block keeps a 32-byte run of every row (4 words / 8 elements),
    and there are no more lanes than rows."""
    from baracuda_numba.plans.reduce.geometry import (
        BLOCK,
        TARGET_BLOCKS,
        VEC_TARGET_BLOCKS,
        cols_vec_geometry,
        generic_geometry,
        takes_lanes_first,
    )

    def check(got, split, units, extent, min_slots, target):
        slots = BLOCK // got.lanes
        assert got.splits == 1 and got.groups == -(-units // slots)
        assert got.lanes >= split.lanes and (got.lanes == split.lanes or got.lanes <= extent)
        assert slots >= min(min_slots, BLOCK // split.lanes)
        assert got.groups <= max(target, split.groups)
        # one halving more would break a rule
        assert slots // 2 < min_slots or -(-units // (slots // 2)) > target \
            or BLOCK // (slots // 2) > extent

    for out_numel, extent in ((4096, 4096), (64, 37), (200_000, 3), (64, 1_000_000)):
        for width in (2, 4):
            check(cols_vec_geometry(out_numel, extent, width, 1),
                  cols_vec_geometry(out_numel, extent, width, 1 << 16), out_numel // width,
                  extent, 4, VEC_TARGET_BLOCKS)
        check(generic_geometry(out_numel, extent, False, 1),
              generic_geometry(out_numel, extent, False, 1 << 16), out_numel, extent, 8,
              TARGET_BLOCKS)
    assert cols_vec_geometry(64, 37, 2, 1).lanes > cols_vec_geometry(64, 37, 2, 1 << 16).lanes
    assert generic_geometry(64, 37, False, 1).lanes > generic_geometry(64, 37, False, 1 << 16).lanes
    if not SIMULATOR:  # f32 [4096, 4096] along axis 0 ran in 8 blocks of one lane per word
        assert cols_vec_geometry(4096, 4096, 2, 1).groups == 512
        # the forward's lanes first: [4096, 4096] unsplit with a workspace too, [1e6, 64]
        # (64 columns) keeps whole rows per block and splits
        assert cols_vec_geometry(4096, 4096, 2, 1 << 16, True) \
            == cols_vec_geometry(4096, 4096, 2, 1)
        for width in (2, 4):
            assert cols_vec_geometry(64, 10**6, width, 1 << 16, True) \
                == cols_vec_geometry(64, 10**6, width, 1 << 16)
    lanes_first = cols_vec_geometry(64, 37, 2, 1 << 16, True)
    assert lanes_first.splits == 1 and lanes_first.lanes > 1
    assert takes_lanes_first(K.SUM, E.BF16) and takes_lanes_first(K.LOG_SUM_EXP, E.F32)
    assert not takes_lanes_first(K.LOG_SUM_EXP, E.BF16)
    assert not takes_lanes_first(K.LOG_SUM_EXP, E.F16)


@pytest.mark.parametrize("element", [E.F32, E.BF16, E.F64], ids=lambda e: e.name)
def test_unsplit_columns(element, rng):
    """Columns without a workspace (more lanes per block, combined in shared memory): every
    forward kind (also with a workspace: lanes first), Argmax, and the Var / Std / Max
    gradients (fused statistic) of [37, 64] along axis 0 against NumPy."""
    shape = (37, 64)
    for kind in REDUCE_KINDS:
        x = inputs_for(kind, shape, element, rng)
        x64 = from_storage(x, element)
        for workspace in (False, True):  # with one: the forward's lanes first
            got, _ = run_forward(kind, x, 0, element, workspace=workspace)
            check_forward(got, reference(kind, x64, 0), kind, element, x64, 0,
                          f"{kind.name} {element.name} unsplit columns {workspace}")
    x = to_storage(rng.integers(-3, 4, size=shape) * 0.5, element)
    plan = ArgReducePlan.select(ArgReduceDescriptor(K.ARGMAX, shape, 0, element), NO_WORKSPACE)
    y = to_device(poisoned((1, 64), E.I64))
    plan.run(ArgReduceArgs(to_device(x), y))
    np.testing.assert_array_equal(host(y), arg_reference(K.ARGMAX, from_storage(x, element), 0))
    for kind in (K.VAR, K.STD, K.MAX):
        y = saved_output(kind, x, 0, element)
        dy = random_values(y.shape, element, rng)
        expected = backward_reference(kind, from_storage(dy, element), from_storage(x, element),
                                      from_storage(y, element), 0)
        got = run_backward(kind, x, y, dy, 0, element, workspace=False)
        check_backward(got, expected, element, f"{kind.name} {element.name} unsplit columns")


# -- backward ----------------------------------------------------------------------------


def run_backward(kind, x_host, y_host, dy_host, axis, element, correction=1, dx_dev=None,
                 dy_dev=None, x_dev=None, workspace=True):
    desc = ReduceBackwardDescriptor(kind, x_host.shape, axis, element, correction)
    plan = ReduceBackwardPlan.select(desc, None if workspace else NO_WORKSPACE)
    dx = dx_dev if dx_dev is not None else to_device(poisoned(x_host.shape, element))
    ws = to_device(np.zeros(plan.workspace_size, np.uint8)) \
        if plan.workspace_size and workspace else None
    saved = kind not in (K.SUM, K.MEAN)
    plan.run(ReduceBackwardArgs(dy_dev if dy_dev is not None else to_device(dy_host), dx,
                                (x_dev if x_dev is not None else to_device(x_host))
                                if saved else None,
                                to_device(y_host) if saved else None), workspace=ws)
    return from_storage(host(dx), element)


def saved_output(kind, x_host, axis, element, correction=1):
    """The forward output as the caller saves it (rounded to the element type)."""
    x64 = from_storage(x_host, element)
    return to_storage(reference(kind, x64, axis, correction), element)


def check_backward(got, expected, element, what):
    """Two roundings of the element type (x - y or the coefficient, then dx), f32/f64
    arithmetic error relative to the row's largest gradient, and the subnormal spacing."""
    expected = np.asarray(expected, dtype=np.float64)
    finite = np.abs(expected[np.isfinite(expected)])
    magnitude = finite.max() if finite.size else 0.0
    tol = TOLERANCE[element][0] * 2 * np.abs(expected) + acc_rtol(element) * 8 * magnitude \
        + SUBNORMAL_SPACING[element]
    assert_specials_and_values(got, expected, tol, what)


BACKWARD_SHAPES = [((3, EDGE_LENGTHS[2]), 1), ((EDGE_LENGTHS[1], 3), 0)]
if not SIMULATOR:
    BACKWARD_SHAPES += [((7, 3000), 1), ((3000, 7), 0), ((2, 999, 5), 1), ((40_000,), 0)]


@pytest.mark.parametrize("element", FLOAT_ELEMENTS, ids=lambda e: e.name)
@pytest.mark.parametrize("kind", REDUCE_KINDS, ids=lambda k: k.name)
@pytest.mark.parametrize("shape,axis", BACKWARD_SHAPES[:1] if SIMULATOR else BACKWARD_SHAPES,
                         ids=str)
def test_backward_matches_numpy(kind, element, shape, axis, rng):
    x = inputs_for(kind, shape, element, rng)
    if kind in (K.MAX, K.MIN):  # few distinct values: ties split the gradient
        x = to_storage(rng.integers(-3, 4, size=shape) * 0.5, element)
    y = saved_output(kind, x, axis, element)
    dy_shape = tuple(1 if d == axis else s for d, s in enumerate(shape))
    dy = random_values(dy_shape, element, rng)
    got = run_backward(kind, x, y, dy, axis, element)
    expected = backward_reference(kind, from_storage(dy, element), from_storage(x, element),
                                  from_storage(y, element), axis)
    check_backward(got, expected, element, f"{kind.name} backward {element.name} {shape}")


@pytest.mark.parametrize("kind", [K.MAX, K.MIN, K.VAR, K.STD], ids=lambda k: k.name)
def test_backward_statistic_paths_agree(kind, rng):
    """Few long rows: the statistic pass + split gradient (workspace) and the fused
    single-pass gradient (workspace=None) give the same dx."""
    # odd extent: the word rows kernel, not the register-resident one (whole words only)
    shape = (EDGE_LENGTHS[1] * 6 + 1,) if SIMULATOR else (2_000_001,)
    x = to_storage(rng.integers(-3, 4, size=shape) * 0.5, E.F32) if kind in (K.MAX, K.MIN) \
        else random_values(shape, E.F32, rng)
    y = saved_output(kind, x, 0, E.F32)
    dy = random_values((1,), E.F32, rng)
    plan = ReduceBackwardPlan.select(ReduceBackwardDescriptor(kind, shape, 0, E.F32))
    assert plan.workspace_size > 0
    expected = backward_reference(kind, dy.astype(np.float64), x.astype(np.float64),
                                  y.astype(np.float64), 0)
    for workspace in (True, False):
        got = run_backward(kind, x, y, dy, 0, E.F32, workspace=workspace)
        check_backward(got, expected, E.F32, f"{kind.name} workspace={workspace}")


def test_max_backward_splits_ties_equally():
    x = np.array([[1.0, 3.0, 3.0, 2.0, 3.0], [5.0, 1.0, 1.0, 1.0, 1.0]], dtype=np.float32)
    y = np.array([[3.0], [5.0]], dtype=np.float32)
    dy = np.array([[3.0], [2.0]], dtype=np.float32)
    got = run_backward(K.MAX, x, y, dy, 1, E.F32)
    np.testing.assert_array_equal(got, [[0, 1, 1, 0, 1], [2, 0, 0, 0, 0]])
    got = run_backward(K.MIN, x, np.array([[1.0], [1.0]], np.float32), dy, 1, E.F32)
    np.testing.assert_array_equal(got, [[3, 0, 0, 0, 0], [0, 0.5, 0.5, 0.5, 0.5]])


@IEEE_SPECIALS
@pytest.mark.parametrize("correction", [0, 1, 2])
def test_var_backward_correction(correction, rng):
    """Var / Std gradients with every correction against float64, to a tolerance that
    includes the conditioning of ``x - mean``: its rounding error (of x and of the f32
    mean, ~eps (|x| + |mean|)) is relative to |x - mean|, large where a row's values are
    close (two values of a row of 2 a few ulp apart), in dx and in the saved Std alike."""
    x = random_values((3, 2), E.F32, rng)
    x64 = x.astype(np.float64)
    mean = x64.mean(axis=1, keepdims=True)
    spread = np.abs(x64 - mean)
    amplification = (np.abs(x64) + np.abs(mean)) / np.maximum(spread, np.finfo(np.float64).tiny)
    # the saved Std carries its row's worst amplification; dx its own and the Std's
    amplification = amplification + amplification.max(axis=1, keepdims=True)
    for kind in (K.VAR, K.STD):
        y = saved_output(kind, x, 1, E.F32, correction)
        dy = random_values((3, 1), E.F32, rng)
        got = run_backward(kind, x, y, dy, 1, E.F32, correction)
        expected = backward_reference(kind, dy.astype(np.float64), x64,
                                      y.astype(np.float64), 1, correction)
        conditioned = 4 * acc_rtol(E.F32) * amplification * np.abs(expected)
        finite = np.abs(expected[np.isfinite(expected)])
        magnitude = finite.max() if finite.size else 0.0
        tol = TOLERANCE[E.F32][0] * 2 * np.abs(expected) + acc_rtol(E.F32) * 8 * magnitude \
            + SUBNORMAL_SPACING[E.F32] + np.nan_to_num(conditioned, posinf=np.inf)
        assert_specials_and_values(got, expected, tol, f"{kind.name} correction {correction}")


@pytest.mark.simulator  # NumPy views stand in for device arrays
def test_backward_strided_operands(rng):
    base = random_values((4, 30), E.F32, rng)
    x = base[:, ::3]  # (4, 10), strides (30, 3)
    for kind in (K.SUM, K.LOG_SUM_EXP, K.VAR):
        y = saved_output(kind, np.ascontiguousarray(x), 0, E.F32)
        dy_full = random_values((2, 10), E.F32, rng)
        dy = dy_full[1:2]  # (1, 10)
        dx_base = poisoned((4, 20), E.F32)
        dx = dx_base[:, ::2]
        run_backward(kind, np.ascontiguousarray(x), y, np.ascontiguousarray(dy), 0, E.F32,
                     dx_dev=dx, dy_dev=dy, x_dev=x)
        expected = backward_reference(kind, dy.astype(np.float64), x.astype(np.float64),
                                      y.astype(np.float64), 0)
        check_backward(dx, expected, E.F32, f"strided {kind.name}")
        assert np.all(np.isnan(dx_base[:, 1::2]))  # untouched between the strided columns


def test_backward_rank_8(rng):
    shape = (2, 1, 3, 1, 2, 1, 1, 4)
    x = random_values(shape, E.F32, rng)
    y = saved_output(K.MAX, x, 2, E.F32)
    dy = random_values(y.shape, E.F32, rng)
    got = run_backward(K.MAX, x, y, dy, 2, E.F32)
    check_backward(got, backward_reference(K.MAX, dy.astype(np.float64),
                                           x.astype(np.float64), y.astype(np.float64), 2),
                   E.F32, "rank 8")


# -- word-access paths (8-byte words: kernels.reduce.VECTOR) -------------------------------
# Each layout below selects one path of the plans (asserted): contiguous rows whose starts
# have every word phase (unaligned head, tail), a long row split over blocks (pointer one
# element past a word boundary), contiguous outputs read as words along a strided axis
# (split, with a remainder), and a misaligned column layout that must fall back.

WORD_ELEMENTS = (E.F16, E.BF16, E.F32)


def kinds_elements_layouts(kinds, layouts, elements=WORD_ELEMENTS):
    """``kind, element, layout`` parameters: every combination on the GPU. The simulator
    (CI time) runs each kind x layout at one element kind, rotating with the kind and the
    layout (a Latin square), so every kind x element pair still runs where there are at
    least as many layouts as element kinds, and every element x layout pair where there
    are at least as many kinds."""
    kinds, layouts = list(kinds), list(layouts)
    return [pytest.param(kind, element, layout, id=f"{kind.name}-{element.name}-{layout}")
            for k, kind in enumerate(kinds) for e, element in enumerate(elements)
            for j, layout in enumerate(layouts)
            if not SIMULATOR or (k + j) % len(elements) == e]


def _word_layouts():
    """name -> (base shape, index into the base, reduce axis, expected access)."""
    return {
        "rows_phases": ((3, 47), (slice(None), slice(1, 46)), 1, "rows"),
        "rows_split": ((1401,), slice(1, 1401), 1, "rows"),
        "cols_split": ((300, 8), (slice(None), slice(None)), 0, "cols"),
        "cols_misaligned": ((40, 10), (slice(None), slice(1, 9)), 0, "generic"),
        # 64-element rows: the short-row path (f32: 8 lanes x 4 words, f16/bf16: 4 x 4),
        # more row groups than the simulator's 2 blocks and a partial last group; padded
        # rows (stride 66: word aligned for f32 only) and an unaligned start (every element
        # kind falls back to the generic row loop); see test_short_rows_selection
        "rows_short": ((37, 64), (slice(None), slice(None)), 1, "rows"),
        "rows_short_padded": ((37, 66), (slice(None), slice(0, 64)), 1, "rows"),
        "rows_short_phase": ((37, 66), (slice(None), slice(1, 65)), 1, "rows"),
        # a start 2 elements in: f32 on a word (short-row path), f16/bf16 half a word in
        # (row loop, head peeled)
        "rows_short_word": ((37, 66), (slice(None), slice(2, 66)), 1, "rows"),
    }


def _view_shape(name, base_shape, index):
    return (2, 700) if name == "rows_split" else np.empty(base_shape)[index].shape


def device_view(base: np.ndarray, index, shape, element):
    """``base[index]`` (reshaped to ``shape``) as a strided device view: the NumPy view in
    the simulator, a torch view on the GPU."""
    if SIMULATOR:
        return base[index].reshape(shape)
    torch = torch_or_skip()
    if element is E.BF16:
        tensor = torch.from_numpy(base.view(np.int16)).cuda().view(torch.bfloat16)
    else:
        tensor = torch.from_numpy(base).cuda()
    return tensor[index].reshape(shape)


def storage_of(view, element):
    """The storage values of a device view as NumPy."""
    if SIMULATOR:
        return np.array(view)
    torch = torch_or_skip()
    if element is E.BF16:
        return view.view(torch.int16).cpu().numpy().view(np.uint16)
    return view.cpu().numpy()


def _forward_access(plan):
    return next(iter(plan.bound_launches().values())).access


@pytest.mark.parametrize("kind, element, layout", kinds_elements_layouts(
    REDUCE_KINDS + (K.ARGMAX, K.ARGMIN), _word_layouts()))
def test_word_access_forward(kind, element, layout, rng):
    base_shape, index, axis, access = _word_layouts()[layout]
    shape = _view_shape(layout, base_shape, index)
    base = inputs_for(kind, base_shape, element, rng)
    if kind in (K.ARGMAX, K.ARGMIN):  # ties: first occurrence across heads, words, tails
        base = to_storage(rng.integers(-2, 3, size=base_shape), element)
    x_host = np.ascontiguousarray(base[index].reshape(shape))
    x64 = from_storage(x_host, element)
    x_dev = device_view(base, index, shape, element)
    what = f"{kind.name} {element.name} {layout}"
    for workspace in (True, False):
        if kind in (K.ARGMAX, K.ARGMIN):
            desc = ArgReduceDescriptor(kind, shape, axis, element)
            plan = ArgReducePlan.select(desc, None if workspace else NO_WORKSPACE)
            y = to_device(poisoned(desc.output_shape(), E.I64))
            ws = to_device(np.zeros(max(plan.workspace_size, 1), np.uint8)) \
                if workspace and plan.workspace_size else None
            plan.run(ArgReduceArgs(x_dev, y), workspace=ws)
            np.testing.assert_array_equal(host(y), arg_reference(kind, x64, axis), what)
        else:
            got, plan = run_forward(kind, x_host, axis, element, x_dev=x_dev,
                                    workspace=workspace)
            check_forward(got, reference(kind, x64, axis), kind, element, x64, axis, what)
        assert _forward_access(plan) == access, what


def _short_rows(shape, strides, element, ptr=0):
    """The chunk_len 0 (short-row path) test of the forward row geometry."""
    from baracuda_numba.plans.reduce.geometry import problem_layout

    problem = problem_layout(shape, len(shape) - 1, [strides, strides[:-1] + (1,)], True, 1 << 16,
                             element, K.SUM, ptr)
    return problem.access == "rows" and problem.geometry.chunk_len == 0, problem.geometry


@pytest.mark.parametrize("element", WORD_ELEMENTS, ids=lambda e: e.name)
def test_short_rows_selection(element):
    """Rows of exactly 4 or 8 lanes x SHORT_LOADS words, word aligned, one output dim
    (after collapsing), take the short-row path; everything else keeps the row loop."""
    from baracuda_numba.kernels.reduce import SHORT_LOADS, VECTOR

    width = VECTOR[element].width
    size = element.byte_width
    for lanes in (4, 8):
        n = lanes * SHORT_LOADS * width
        taken, geometry = _short_rows((1000, n), (n, 1), element)
        assert taken and geometry.lanes == lanes and geometry.splits == 1, (lanes, geometry)
        assert _short_rows((7, 3, n), (3 * n, n, 1), element)[0]  # collapses to one dim
        assert _short_rows((1000, n), (n + width, 1), element)[0]  # padded, word aligned
        assert not _short_rows((1000, n), (n + 1, 1), element)[0]  # rows off the word grid
        assert not _short_rows((1000, n), (n, 1), element, ptr=size)[0]  # shifted start
        assert _short_rows((1000, n), (n, 1), element, ptr=8)[0]  # a word in: taken
        assert not _short_rows((7, 3, n), (4 * n, n, 1), element)[0]  # two output dims
        assert not _short_rows((1000, n - width), (n, 1), element)[0]  # not lanes x 4 words
    n = 2 * SHORT_LOADS * width  # 2 lanes: generic
    assert not _short_rows((1000, n), (n, 1), element)[0]


@pytest.mark.parametrize("element", WORD_ELEMENTS, ids=lambda e: e.name)
def test_longer_short_rows_selection(element):
    """The forward of LONG_SHORT_KINDS also takes rows of lanes x VEC_LOADS words, lanes a
    power of two up to a block; the other kinds and the gradients keep 4 or 8 lanes x
    SHORT_LOADS words."""
    from baracuda_numba.kernels.reduce import VEC_LOADS, VECTOR
    from baracuda_numba.plans.reduce.geometry import BLOCK, problem_layout, short_rows_geometry

    width = VECTOR[element].width
    for lanes in (8, BLOCK):
        n = lanes * VEC_LOADS * width
        taken, geometry = _short_rows((50, n), (n, 1), element)
        assert taken and (geometry.lanes, geometry.splits) == (lanes, 1), (lanes, geometry)
        assert short_rows_geometry(50, n, width, (50,), (n,), 0) is None  # gradients
        for kind in (K.VAR, K.LOG_SUM_EXP, K.ARGMAX):
            problem = problem_layout((50, n), 1, [(n, 1), (1, 1)], True, 1 << 16, element, kind)
            assert problem.geometry.chunk_len != 0, kind
    for words in (6 * VEC_LOADS, 2 * BLOCK * VEC_LOADS, BLOCK * VEC_LOADS + 4):
        n = words * width  # 6 lanes: not a power of two; more than a block; not 8 per lane
        assert not _short_rows((50, n), (n, 1), element)[0], words


def _check_rows_every_kind(x, x64, element, what):
    """Every reduce kind along the rows of ``x`` (storage; ``x64`` its float64 values)
    against NumPy, through the word row kernels, bit-identical on a rerun."""
    for kind in REDUCE_KINDS:
        got, plan = run_forward(kind, x, 1, element)
        again, _ = run_forward(kind, x, 1, element)
        check_forward(got, reference(kind, x64, 1), kind, element, x64, 1,
                      f"{kind.name} {what}")
        np.testing.assert_array_equal(got.view(np.uint8), again.view(np.uint8), kind.name)
        assert _forward_access(plan) == "rows"


def _check_arg_rows(x, x64, element):
    """Argmax / Argmin of the rows of ``x`` (storage; ``x64`` its float64 values) against
    NumPy's first occurrence, into poisoned outputs."""
    for kind in (K.ARGMAX, K.ARGMIN):
        desc = ArgReduceDescriptor(kind, x.shape, 1, element)
        plan = ArgReducePlan.select(desc, NO_WORKSPACE)
        y = to_device(poisoned(desc.output_shape(), E.I64))
        plan.run(ArgReduceArgs(to_device(x), y))
        np.testing.assert_array_equal(host(y), arg_reference(kind, x64, 1), kind.name)


@IEEE_SPECIALS
@pytest.mark.parametrize("element", WORD_ELEMENTS, ids=lambda e: e.name)
def test_longer_short_rows(element):
    """Every kind and the arg-reductions on rows of 8 lanes and of a block of lanes x
    VEC_LOADS words (the short-row path for LONG_SHORT_KINDS, the row loop for the
    others), with NaN / inf / ties / -0, against NumPy and bit-identical on a rerun."""
    from baracuda_numba.kernels.reduce import LONG_SHORT_KINDS, VEC_LOADS, VECTOR
    from baracuda_numba.plans.reduce.geometry import BLOCK, problem_layout

    width = VECTOR[element].width
    rng = np.random.default_rng(11)
    for lanes in (8, BLOCK):
        n = lanes * VEC_LOADS * width
        # magnitudes near 1: the products of 2048 values stay within f16 range
        rows = rng.choice([-1.0, 1.0], (5, n)) * rng.uniform(0.95, 1.05, (5, n))
        rows[0, n // 3] = np.nan
        rows[1, 7], rows[1, n - 1] = np.inf, -np.inf
        rows[2, :] = -0.0
        rows[3, 5], rows[3, n - 2] = 3.0, 3.0  # ties of the max
        rows[3, 6], rows[3, n - 3] = -3.0, -3.0  # and of the min
        x = to_storage(rows, element)
        x64 = from_storage(x, element)
        _check_rows_every_kind(x, x64, element, f"{lanes} x {VEC_LOADS} words")
        for kind in REDUCE_KINDS:
            kernel_kind = K.SUM if kind is K.MEAN else kind
            problem = problem_layout(x.shape, 1, [(n, 1), (1, 1)], True, 1 << 16, element,
                                     kernel_kind)
            assert (problem.geometry.chunk_len == 0) == (kernel_kind in LONG_SHORT_KINDS)
        _check_arg_rows(x, x64, element)


@pytest.mark.parametrize("element", WORD_ELEMENTS, ids=lambda e: e.name)
def test_short_rows_parked(element, rng, monkeypatch):
    """The short-row path of LONG_SHORT_KINDS with rows of at least PARK_MIN_LANES lanes
    runs the ``reduce_rows_park`` kernels, which park each thread's words of its next row
    (``cp.async``) while the block combines the current one, over a grid capped at
    SHORT_GRID_X blocks: here every block walks several groups and the last group is
    partial (rows of 8 lanes x SHORT_LOADS and x VEC_LOADS words; 4-lane rows keep
    ``reduce_rows_vec``, which loads a row where it reaches it), against NumPy into
    poisoned outputs, bit-identical on a rerun."""
    from baracuda_numba.kernels.reduce import (
        LONG_SHORT_KINDS,
        PARK_MIN_LANES,
        SHORT_LOADS,
        VEC_LOADS,
        VECTOR,
    )
    from baracuda_numba.launch import Kernel
    from baracuda_numba.plans.reduce.geometry import BLOCK, MAX_GRID_X, SHORT_GRID_X, problem_layout

    bound = []  # (kernel family, grid) of every launch bound
    bind = Kernel.bind
    monkeypatch.setattr(Kernel, "bind", lambda self, grid, *rest, **kw: (
        bound.append((self.name.split("[")[0], grid)) or bind(self, grid, *rest, **kw)))
    width = VECTOR[element].width
    for lanes, per_lane in ((PARK_MIN_LANES, SHORT_LOADS), (PARK_MIN_LANES, VEC_LOADS),
                            (4, SHORT_LOADS)):
        n = lanes * per_lane * width
        slots = BLOCK // lanes
        rows = 2 * SHORT_GRID_X * slots + 5  # more groups than blocks, the last partial
        x = to_storage(rng.uniform(0.9, 1.1, (rows, n)) * rng.choice([-1.0, 1.0], (rows, n)),
                       element)
        x64 = from_storage(x, element)
        for kind in LONG_SHORT_KINDS + (K.MEAN,):
            kernel_kind = K.SUM if kind is K.MEAN else kind
            geometry = problem_layout(x.shape, 1, [(n, 1), (1, 1)], True, 1 << 16, element,
                                      kernel_kind).geometry
            assert (geometry.chunk_len, geometry.lanes) == (0, lanes), (kind, geometry)
            assert geometry.groups > SHORT_GRID_X
            bound.clear()
            got, plan = run_forward(kind, x, 1, element)
            parked = lanes >= PARK_MIN_LANES
            name = "reduce_rows_park" if parked else "reduce_rows_vec"
            cap = SHORT_GRID_X if parked else MAX_GRID_X
            assert bound == [(name, (min(geometry.groups, cap), 1))], (kind, lanes, bound)
            again, _ = run_forward(kind, x, 1, element)
            what = f"{kind.name} {rows} rows of {lanes} x {per_lane} words"
            check_forward(got, reference(kind, x64, 1), kind, element, x64, 1, what)
            np.testing.assert_array_equal(got.view(np.uint8), again.view(np.uint8), what)
            assert _forward_access(plan) == "rows"


@IEEE_SPECIALS
@pytest.mark.parametrize("element", WORD_ELEMENTS, ids=lambda e: e.name)
def test_short_rows_specials(element):
    """NaN / inf / ties / -0 through the short-row path (rows of 64 elements), every kind
    and the arg-reductions (first occurrence), bit-identical on a rerun."""
    rows = np.zeros((20, 64))
    rows[0, 13] = np.nan
    rows[1, :] = -np.inf
    rows[2, 5], rows[2, 63] = np.inf, -np.inf
    rows[3, 2], rows[3, 40] = np.inf, np.inf
    rows[4, 0], rows[4, 63] = np.nan, np.nan
    rows[5, :] = -0.0
    rows[6, 10], rows[6, 50] = 3.0, 3.0  # ties
    rows[7:] = np.arange(13 * 64).reshape(13, 64) % 7 - 3.0
    x = to_storage(rows, element)
    x64 = from_storage(x, element)
    assert _short_rows(x.shape, (64, 1), element)[0]
    _check_rows_every_kind(x, x64, element, "short-row specials")
    _check_arg_rows(x, x64, element)


@IEEE_SPECIALS
@pytest.mark.parametrize("element", WORD_ELEMENTS, ids=lambda e: e.name)
def test_word_access_specials(element):
    """NaN / inf through word-loaded rows and columns (rows of 20 elements: words)."""
    rows = np.zeros((4, 20))
    rows[0, 13] = np.nan
    rows[1, :] = -np.inf
    rows[2, 5], rows[2, 17] = np.inf, -np.inf
    rows[3, 2], rows[3, 9] = np.inf, np.inf
    x = to_storage(rows, element)
    x64 = from_storage(x, element)
    for axis in (1, 0):
        source = x if axis == 1 else np.ascontiguousarray(x.T)
        s64 = x64 if axis == 1 else np.ascontiguousarray(x64.T)
        for kind in REDUCE_KINDS:
            got, plan = run_forward(kind, source, axis, element)
            check_forward(got, reference(kind, s64, axis), kind, element, s64, axis,
                          f"{kind.name} specials axis {axis}")
            assert _forward_access(plan) == ("rows" if axis == 1 else "cols")


def _lse_special_rows(length: int, rng: np.random.Generator) -> np.ndarray:
    """Rows for LogSumExp's batch folds: specials in runs of LSE_PART and CHUNK values
    (whole batches of -inf, a +inf or NaN alone in its batch or beside -inf) at offsets
    that put them on and across batch edges, and finite values whose batch maxima differ
    by up to 150 (the merges rescale in both directions)."""
    finite = lambda: rng.uniform(-4.0, 4.0, size=length)  # noqa: E731
    rows = []
    for run in (CHUNK, LSE_PART):
        for offset in (0, 1, run - 1):
            row = finite()
            for start in range(offset, length, 3 * run):  # every third run all -inf
                row[start:start + run] = -np.inf
            rows.append(row)
            spiky = np.full(length, -np.inf)
            spiky[offset::run] = rng.uniform(-60.0, 90.0, size=len(spiky[offset::run]))
            rows.append(spiky)
    for position in (0, CHUNK - 1, CHUNK, LSE_PART, 2 * LSE_PART - 1, length - 1):
        for special in (np.inf, np.nan):
            row = finite()
            row[position] = special
            row[min(position + 1, length - 1)] = -np.inf
            rows.append(row)
    mixed = np.full(length, -np.inf)  # mixed +-inf: +inf
    mixed[LSE_PART + 3] = np.inf
    rows.append(mixed)
    rows.append(np.full(length, -np.inf))  # all -inf: -inf
    last = np.full(length, -np.inf)  # one finite value after all-(-inf) batches
    last[-1] = 2.5
    rows.append(last)
    both = finite()  # NaN and +inf in one row: NaN
    both[3], both[length // 2] = np.inf, np.nan
    rows.append(both)
    steps = finite() + np.repeat(rng.uniform(-75.0, 75.0, size=-(-length // LSE_PART)),
                                 LSE_PART)[:length]
    rows.append(steps)
    while len(rows) % 4:  # whole words of columns: the word column kernel
        rows.append(finite())
    return np.stack(rows)


@IEEE_SPECIALS
@pytest.mark.parametrize("element", FLOAT_ELEMENTS, ids=lambda e: e.name)
def test_log_sum_exp_long_row_batches(element, rng):
    """LogSumExp of long rows whose batches mix -inf, +inf, NaN and finite values at
    batch edges, through the word rows and columns (f16/bf16/f32) and the generic body
    (strided rows; f64 everywhere), against NumPy float64."""
    rows = _lse_special_rows(1024 + 37, rng)
    x = to_storage(rows, element)
    x64 = from_storage(x, element)
    word = element in WORD_ELEMENTS
    strided = np.ascontiguousarray(np.stack([x, x], axis=-1))  # rows of stride 2
    layouts = [(x, x64, 1, "rows" if word else "generic"),
               (np.ascontiguousarray(x.T), np.ascontiguousarray(x64.T), 0,
                "cols" if word else "generic"),
               (strided, np.stack([x64, x64], axis=-1), 1, "generic")]
    for source, s64, axis, access in layouts:
        source_dev = to_device(source)
        if source.ndim == 3:
            source_dev = source_dev[:, :, 0]
            source, s64 = source[:, :, 0], s64[:, :, 0]
        got, plan = run_forward(K.LOG_SUM_EXP, np.ascontiguousarray(source), axis, element,
                                x_dev=source_dev)
        what = f"LOG_SUM_EXP {element.name} {access} axis {axis}"
        check_forward(got, reference(K.LOG_SUM_EXP, s64, axis), K.LOG_SUM_EXP, element, s64,
                      axis, what)
        assert _forward_access(plan) == access, what


@pytest.mark.parametrize("kind, element, layout", kinds_elements_layouts(
    REDUCE_KINDS, ["rows_phases", "rows_split", "cols_split"]))
def test_word_access_backward(kind, element, layout, rng):
    """dx and x share the layout and word phase (dx a view of a poisoned buffer); with the
    workspace (statistic pass, splits) and without (fused statistic / single pass)."""
    base_shape, index, axis, access = _word_layouts()[layout]
    shape = _view_shape(layout, base_shape, index)
    base = inputs_for(kind, base_shape, element, rng)
    if kind in (K.MAX, K.MIN):  # ties split the gradient
        base = to_storage(rng.integers(-3, 4, size=base_shape) * 0.5, element)
    x_host = np.ascontiguousarray(base[index].reshape(shape))
    y = saved_output(kind, x_host, axis, element)
    dy = random_values(y.shape, element, rng)
    expected = backward_reference(kind, from_storage(dy, element), from_storage(x_host, element),
                                  from_storage(y, element), axis)
    for workspace in (True, False):
        dx_base = poisoned(base_shape, element)
        dx = device_view(dx_base, index, shape, element)
        x_dev = device_view(base, index, shape, element)
        desc = ReduceBackwardDescriptor(kind, shape, axis, element)
        plan = ReduceBackwardPlan.select(desc, None if workspace else NO_WORKSPACE)
        ws = to_device(np.zeros(plan.workspace_size, np.uint8)) \
            if plan.workspace_size and workspace else None
        saved = kind not in (K.SUM, K.MEAN)
        plan.run(ReduceBackwardArgs(to_device(dy), dx, x_dev if saved else None,
                                    to_device(y) if saved else None), workspace=ws)
        got = from_storage(storage_of(dx, element), element)
        what = f"{kind.name} backward {element.name} {layout} workspace={workspace}"
        check_backward(got, expected, element, what)
        chosen = plan.choice
        expected_access = access
        if access == "cols" and kind in (K.MAX, K.MIN, K.VAR, K.STD) and not workspace:
            # without a workspace the column word kernel has no statistic: the generic
            # fused kernel runs (300 rows: no register-resident strip, stash or 256-byte)
            expected_access = "generic"
        assert chosen == expected_access, what


_SHORT_LAYOUTS = ("rows_short", "rows_short_padded", "rows_short_phase")


@pytest.mark.parametrize("kind, element, layout", kinds_elements_layouts(
    [K.SUM, K.MEAN, K.PROD, K.NORM2, K.LOG_SUM_EXP], _SHORT_LAYOUTS))
def test_short_rows_backward(kind, element, layout, rng):
    """The gradients without a statistic take the row kernel's short-row path exactly where
    the forward does (64-element rows, word aligned; padded rows stay word aligned for f32
    only; an unaligned start never), into a poisoned buffer whose padding must survive."""
    base_shape, index, axis, _ = _word_layouts()[layout]
    shape = _view_shape(layout, base_shape, index)
    base = inputs_for(kind, base_shape, element, rng)
    x_host = np.ascontiguousarray(base[index].reshape(shape))
    y = saved_output(kind, x_host, axis, element)
    dy = random_values(y.shape, element, rng)
    expected = backward_reference(kind, from_storage(dy, element), from_storage(x_host, element),
                                  from_storage(y, element), axis)
    dx_base = poisoned(base_shape, element)
    dx = device_view(dx_base, index, shape, element)
    plan = ReduceBackwardPlan.select(ReduceBackwardDescriptor(kind, shape, axis, element),
                                     NO_WORKSPACE)
    # the word kernel's short rows (the others: test_broadcast_backward)
    plan.broadcast = False
    saved = kind not in (K.SUM, K.MEAN)
    plan.run(ReduceBackwardArgs(to_device(dy), dx, device_view(base, index, shape, element)
                                if saved else None, to_device(y) if saved else None))
    got = storage_of(dx, element)
    what = f"{kind.name} backward {element.name} {layout}"
    check_backward(from_storage(got, element), expected, element, what)
    written = np.zeros(base_shape, bool)
    written[index] = True
    whole = dx_base if SIMULATOR else storage_of(dx._base, element)
    np.testing.assert_array_equal(whole[~written], poisoned(base_shape, element)[~written])
    access, gradient = next(iter(plan.bound_launches().values()))[1]
    short = layout == "rows_short" or (layout == "rows_short_padded" and element is E.F32)
    assert access == "rows", what
    assert (gradient.args[16] == 0) == short, what  # chunk_vecs 0: the short-row path


@pytest.mark.parametrize("element", WORD_ELEMENTS, ids=lambda e: e.name)
def test_longer_short_rows_backward(element, rng):
    """The store-only gradients (Sum / Mean) take the short-row path on rows of 8 lanes and
    of a block of lanes x VEC_LOADS words too (contiguous and padded rows), into a
    poisoned buffer whose padding must survive; the gradients that read x do not."""
    from baracuda_numba.kernels.reduce import VEC_LOADS, VECTOR
    from baracuda_numba.plans.reduce.geometry import BLOCK

    width = VECTOR[element].width
    for lanes in (8, BLOCK):
        n = lanes * VEC_LOADS * width
        for pad in (0, width):
            base = poisoned((3, n + pad), element)
            for kind in (K.SUM, K.MEAN, K.NORM2):
                x_host = random_values((3, n), element, rng)
                y = saved_output(kind, x_host, 1, element)
                dy = random_values(y.shape, element, rng)
                expected = backward_reference(kind, from_storage(dy, element),
                                              from_storage(x_host, element),
                                              from_storage(y, element), 1)
                dx_base = base.copy()
                dx = device_view(dx_base, (slice(None), slice(0, n)), (3, n), element)
                xs = np.ascontiguousarray(x_host)
                plan = ReduceBackwardPlan.select(ReduceBackwardDescriptor(kind, (3, n), 1,
                                                                          element), NO_WORKSPACE)
                plan.broadcast = False
                saved = kind is K.NORM2
                plan.run(ReduceBackwardArgs(to_device(dy), dx, to_device(xs) if saved else None,
                                            to_device(y) if saved else None))
                what = f"{kind.name} backward {element.name} {lanes} lanes pad {pad}"
                got = from_storage(storage_of(dx, element), element)
                check_backward(got, expected, element, what)
                whole = dx_base if SIMULATOR else storage_of(dx._base, element)
                np.testing.assert_array_equal(whole[:, n:], base[:, n:], what)
                access, gradient = next(iter(plan.bound_launches().values()))[1]
                if kind is K.NORM2:
                    assert access != "rows" or gradient.args[16] != 0, what
                else:
                    assert access == "rows" and gradient.args[16] == 0, what



def _broadcast_layouts():
    """name -> (base shape, index into the base, view shape, reduce axis, broadcast): rows
    (the axis last, 16-byte units), columns (nothing before the axis, rows of at least
    1 KiB), and layouts the broadcast must leave to the word kernels."""
    return {
        "rows": ((6, 64), (slice(None),), (6, 64), 1, True),
        "rows_outer3": ((2, 3, 32), (slice(None),), (2, 3, 32), 2, True),
        "rows_one": ((40,), (slice(None),), (40,), 0, True),
        "cols": ((3, 512), (slice(None),), (3, 512), 0, True),
        "cols_inner2": ((3, 2, 256), (slice(None),), (3, 2, 256), 0, True),
        "cols_middle": ((2, 3, 512), (slice(None),), (2, 3, 512), 1, False),
        "cols_narrow": ((5, 64), (slice(None),), (5, 64), 0, False),
        "rows_padded": ((6, 72), (slice(None), slice(0, 64)), (6, 64), 1, False),
        "rows_offset": ((6 * 64 + 2,), (slice(2, None),), (6, 64), 1, False),
        "rows_odd": ((6, 58), (slice(None),), (6, 58), 1, False),
    }


@IEEE_SPECIALS
@pytest.mark.parametrize("element", WORD_ELEMENTS, ids=lambda e: e.name)
@pytest.mark.parametrize("kind", [K.SUM, K.MEAN, K.PROD, K.NORM2, K.LOG_SUM_EXP],
                         ids=lambda k: k.name)
@pytest.mark.parametrize("layout", list(_broadcast_layouts()))
def test_broadcast_backward(kind, element, layout, rng):
    """The gradients without a statistic in dx's memory order (``reduce_backward_broadcast``)
    exactly where dx (and x, in the same layout) is contiguous and 16-byte aligned and its
    units lie in one line, against NumPy and bit for bit against the word kernels
    (``plan.broadcast = False``), with a strided dy and y (every other element of a
    buffer), into poisoned buffers whose rest must survive. The kinds that read x take
    it here for every row length and element (test_broadcast_selection: the plan's rule)."""
    base_shape, index, shape, axis, broadcast = _broadcast_layouts()[layout]
    saved = kind not in (K.SUM, K.MEAN)
    x_base = inputs_for(kind, base_shape, element, rng)
    x_host = np.ascontiguousarray(x_base[index].reshape(shape))
    if kind is K.PROD and x_host.size > 2:  # a zero (inf / NaN gradient) and a one
        x_host.reshape(-1)[1:3] = to_storage(np.array([0.0, 1.0]), element)
        x_base[index] = x_host.reshape(x_base[index].shape)
    y_host = saved_output(kind, x_host, axis, element)
    dy_shape = y_host.shape
    doubled = dy_shape[:-1] + (2 * dy_shape[-1],)
    dy_base = random_values(doubled, element, rng)
    dy_host = np.ascontiguousarray(dy_base[..., ::2])
    if dy_host.size:  # ties, zeros and specials travel through the coefficient
        dy_host.reshape(-1)[:4] = to_storage(np.array([0.0, -0.0, np.inf, np.nan][:min(
            4, dy_host.size)]), element)
        dy_base[..., ::2] = dy_host
    y_base = poisoned(doubled, element)
    y_base[..., ::2] = y_host
    expected = backward_reference(kind, from_storage(dy_host, element),
                                  from_storage(x_host, element), from_storage(y_host, element),
                                  axis)
    every_other = (Ellipsis, slice(None, None, 2))
    results = []
    for use_broadcast in (True, False):
        dx_base = poisoned(base_shape, element)
        dx = device_view(dx_base, index, shape, element)
        dy = device_view(dy_base, every_other, dy_shape, element)
        x = device_view(x_base, index, shape, element) if saved else None
        y = device_view(y_base, every_other, dy_shape, element) if saved else None
        plan = ReduceBackwardPlan.select(ReduceBackwardDescriptor(kind, shape, axis, element),
                                         NO_WORKSPACE)
        plan.broadcast = use_broadcast
        plan.broadcast_min_x_row_bytes, plan.broadcast_x_col_bytes = 0, (2, 4)
        plan.run(ReduceBackwardArgs(dy, dx, x, y))
        what = f"{kind.name} {element.name} {layout} broadcast={use_broadcast}"
        got = storage_of(dx, element)
        check_backward(from_storage(got, element), expected, element, what)
        written = np.zeros(base_shape, bool)
        written[index] = True
        whole = dx_base if SIMULATOR else storage_of(dx._base, element)
        np.testing.assert_array_equal(whole[~written], poisoned(base_shape, element)[~written],
                                      what)
        access = plan.choice
        assert (access == "broadcast") == (broadcast and use_broadcast), what
        results.append(got)
    np.testing.assert_array_equal(results[0].view(np.uint8), results[1].view(np.uint8))



@pytest.mark.parametrize("kind", [K.SUM, K.PROD, K.NORM2, K.LOG_SUM_EXP], ids=lambda k: k.name)
def test_broadcast_selection(kind):
    """Sum / Mean take the broadcast wherever it applies; the kinds that read x only for
    rows longer than BROADCAST_MIN_X_ROW_BYTES and for columns of 2-byte elements (where
    it measured faster than the word and register-resident kernels). Binding only."""
    limit = BROADCAST_MIN_X_ROW_BYTES
    saved = kind is not K.SUM
    for element in (E.BF16, E.F32):
        row = limit // element.byte_width
        for shape, axis, expected in (((2, row), 1, not saved), ((2, row + 8), 1, True),
                                      ((3, 512), 0, not saved or element is E.BF16)):
            x = to_device(np.zeros(shape, element.storage_dtype))
            y = to_device(np.zeros(tuple(1 if a == axis else n for a, n in enumerate(shape)),
                                   element.storage_dtype))
            plan = ReduceBackwardPlan.select(ReduceBackwardDescriptor(kind, shape, axis,
                                                                      element))
            args = ReduceBackwardArgs(y, to_device(np.zeros(shape, element.storage_dtype)),
                                      x if saved else None, y if saved else None)
            _, dx, x_ref, _ = plan.can_implement(args)
            if dx.ptr % 16 or (saved and x_ref.ptr % 16):
                pytest.skip("host buffers not 16-byte aligned")
            access = plan.bind_choice(args)
            assert (access == "broadcast") == expected, (kind, element, shape, axis)



def test_broadcast_follows_the_alignment_of_x(rng):
    """A plan that bound the broadcast for a 16-byte aligned x re-binds (to the word
    kernels) for an x of the same strides 8 bytes further on, and both gradients are
    right."""
    shape, element = (3, 64), E.F32
    base = inputs_for(K.PROD, (3 * 64 + 2,), element, rng)
    plan = ReduceBackwardPlan.select(ReduceBackwardDescriptor(K.PROD, shape, 1, element),
                                     NO_WORKSPACE)
    plan.broadcast_min_x_row_bytes = 0
    accesses = []
    for start in (0, 2):
        x_host = np.ascontiguousarray(base[start:start + 192].reshape(shape))
        y = saved_output(K.PROD, x_host, 1, element)
        dy = random_values(y.shape, element, rng)
        expected = backward_reference(K.PROD, from_storage(dy, element),
                                      from_storage(x_host, element), from_storage(y, element), 1)
        x = device_view(base, (slice(start, start + 192),), shape, element)
        dx = to_device(poisoned(shape, element))
        plan.run(ReduceBackwardArgs(to_device(dy), dx, x, to_device(y)))
        check_backward(from_storage(host(dx), element), expected, element, f"start {start}")
        key = next(k for k in plan.bound_launches() if k[-1] == (8 if start else 0))
        accesses.append(plan.bound_launches()[key][1][0])
    assert accesses[0] == "broadcast" and accesses[1] != "broadcast", accesses


def test_store_only_rows_geometry():
    """The f32 Sum/Mean gradient (stores only) takes 8 lanes for rows of 128-2048 words
    when there are at least 4096 rows; everything else (2-byte elements included) keeps
    the shared row geometry."""
    from baracuda_numba.plans.reduce.geometry import rows_vec_geometry

    for words in (128, 1000, 2048):
        geometry = rows_vec_geometry(4096, words * 2, 2, 1 << 16, store_only=True)
        assert geometry.lanes == 8 and geometry.splits == 1 and geometry.chunk_len > words, \
            (words, geometry)
    for width, rows, words in ((2, 4096, 127), (2, 4096, 2049), (2, 4095, 1000),
                               (2, 4096, 32), (4, 4096, 128), (4, 4096, 1024)):
        assert rows_vec_geometry(rows, words * width, width, 1 << 16, store_only=True) \
            == rows_vec_geometry(rows, words * width, width, 1 << 16), (width, rows, words)


def test_warp_rows_geometry():
    """The forward of f16/bf16 (not Var/Std/LogSumExp) gives long rows that split anyway, at least a
    block of them, a warp each and more splits; f32, Welford, unsplit (no workspace), few
    rows and rows a warp already covers keep the shared geometry; the plans' workspace
    covers the most splits either geometry takes."""
    from baracuda_numba.plans.reduce.geometry import (
        BLOCK,
        VEC_TARGET_BLOCKS,
        max_workspace,
        rows_vec_geometry,
        takes_warp_rows,
    )

    assert takes_warp_rows(E.BF16, K.SUM) and takes_warp_rows(E.F16, K.MAX)
    assert takes_warp_rows(E.BF16, "ties")  # the Max/Min gradient's statistic pass
    assert not takes_warp_rows(E.F32, K.SUM) and not takes_warp_rows(E.BF16, K.VAR)
    assert not takes_warp_rows(E.F16, K.STD) and not takes_warp_rows(E.BF16, K.LOG_SUM_EXP)
    rows, words = max(BLOCK, 8), 64 * VEC_LOADS * 64  # long rows: more than a warp's worth
    base = rows_vec_geometry(rows, words * 4, 4, 1 << 16)
    warp = rows_vec_geometry(rows, words * 4, 4, 1 << 16, warp_rows=True)
    if base.lanes > 32 and -(-rows // (BLOCK // 32)) < VEC_TARGET_BLOCKS:  # the GPU's
        assert warp.lanes == 32 and warp.splits > base.splits, (base, warp)
        assert warp.splits * warp.chunk_len >= words and warp.chunk_len % (32 * VEC_LOADS) == 0
    else:  # the simulator's 64-thread blocks never take it
        assert warp == base
    for args in ((rows, words * 4, 4, 1), (rows - 1, words * 4, 4, 1 << 16),
                 (rows, 1024 * 4, 4, 1 << 16)):
        assert rows_vec_geometry(*args, warp_rows=True) == rows_vec_geometry(*args), args
    assert max_workspace(K.SUM, E.BF16, rows, words * 4, 1 << 16)[0] >= warp.splits


@pytest.mark.gpu
@pytest.mark.parametrize("element", [E.BF16, E.F16], ids=lambda e: e.name)
@pytest.mark.parametrize("kind", [K.SUM, K.MAX, K.PROD, K.NORM2, K.ARGMAX, K.ARGMIN],
                         ids=lambda k: k.name)
def test_gpu_warp_rows(kind, element, rng):
    """256 long rows of 2-byte elements (the warp-per-row split geometry, 8 splits of a
    row, a row start off 16 bytes) against NumPy, bit-identical on a rerun; Argmax/Argmin
    with ties (first occurrence across splits)."""
    shape = (256, 40000)
    if kind in (K.ARGMAX, K.ARGMIN):
        base = to_storage(rng.integers(-3, 4, size=(256, 40001)), element)
    else:
        base = inputs_for(kind, (256, 40001), element, rng)
    x_host = np.ascontiguousarray(base[:, 1:])
    x64 = from_storage(x_host, element)
    x_dev = device_view(base, (slice(None), slice(1, None)), shape, element)
    what = f"{kind.name} {element.name}"
    if kind in (K.ARGMAX, K.ARGMIN):
        plan = ArgReducePlan.select(ArgReduceDescriptor(kind, shape, 1, element))
        results = []
        for _ in range(2):
            y = to_device(poisoned((256, 1), E.I64))
            ws = to_device(np.zeros(max(plan.workspace_size, 1), np.uint8))
            plan.run(ArgReduceArgs(x_dev, y), workspace=ws)
            results.append(host(y))
        np.testing.assert_array_equal(results[0], arg_reference(kind, x64, 1), what)
        np.testing.assert_array_equal(results[1], results[0], what)
    else:
        got, plan = run_forward(kind, x_host, 1, element, x_dev=x_dev, workspace=True)
        again, _ = run_forward(kind, x_host, 1, element, x_dev=x_dev, workspace=True)
        check_forward(got, reference(kind, x64, 1), kind, element, x64, 1, what)
        np.testing.assert_array_equal(got.view(np.uint8), again.view(np.uint8), what)
    launch = next(iter(plan.bound_launches().values()))
    assert launch.access == "rows" and len(launch.launches) == 2, what  # split + merge


@pytest.mark.gpu
@pytest.mark.parametrize("element", WORD_ELEMENTS, ids=lambda e: e.name)
@pytest.mark.parametrize("kind", [K.SUM, K.MEAN], ids=lambda k: k.name)
def test_gpu_store_only_rows(kind, element, rng):
    """The 8-lane store-only rows (4096 rows of 128-2048 words, a padded row stride, a row
    length off the word grid) against NumPy, into poisoned outputs; the contiguous ones
    also through the broadcast kernel."""
    width = 8 // element.byte_width
    for cols, pitch in ((128 * width, 128 * width), (1000 * width, 1003 * width),
                        (2048 * width, 2048 * width), (1000 * width + 1, 1000 * width + 1)):
        dy = random_values((4096, 1), element, rng)
        x_host = np.zeros((4096, cols), element.storage_dtype)
        expected = backward_reference(kind, from_storage(dy, element), x_host, dy, 1)
        for broadcast in (False, True):
            base = to_device(poisoned((4096, pitch), element))
            dx = base[:, :cols]
            plan = ReduceBackwardPlan.select(ReduceBackwardDescriptor(kind, (4096, cols), 1,
                                                                      element), NO_WORKSPACE)
            plan.broadcast = broadcast
            plan.run(ReduceBackwardArgs(to_device(dy), dx))
            what = f"{kind.name} {element.name} {cols} broadcast={broadcast}"
            got = from_storage(host(base), element)
            check_backward(got[:, :cols], expected, element, what)
            if pitch > cols:  # the padding keeps its poison
                np.testing.assert_array_equal(host(base)[:, cols:], poisoned(
                    (4096, pitch), element)[:, cols:], what)
            access = plan.choice
            assert access == ("broadcast" if broadcast and pitch == cols and cols % (
                16 // element.byte_width) == 0 else "rows"), what


@pytest.mark.gpu
@pytest.mark.parametrize("element", WORD_ELEMENTS, ids=lambda e: e.name)
@pytest.mark.parametrize("kind", [K.VAR, K.STD], ids=lambda k: k.name)
def test_gpu_mean_statistic_columns(kind, element, rng):
    """Columns too long for the register-resident gradient (30001 rows of 64 along axis 0:
    many splits, a short last one): the Sum kernel's statistic pass, then the column word
    gradient walking each chunk from its end, against NumPy and bit-identical on a rerun;
    the values sit off 0 (3 + uniform), so a wrong mean shows."""
    shape = (30001, 64)
    x = to_storage(3.0 + from_storage(random_values(shape, element, rng), element), element)
    y = saved_output(kind, x, 0, element)
    dy = random_values(y.shape, element, rng)
    expected = backward_reference(kind, from_storage(dy, element), from_storage(x, element),
                                  from_storage(y, element), 0)
    plan = ReduceBackwardPlan.select(ReduceBackwardDescriptor(kind, shape, 0, element))
    ws = to_device(np.zeros(plan.workspace_size, np.uint8))
    args = (to_device(dy), to_device(x), to_device(y))
    results = []
    for _ in range(2):
        dx = to_device(poisoned(shape, element))
        plan.run(ReduceBackwardArgs(args[0], dx, args[1], args[2]), workspace=ws)
        results.append(from_storage(host(dx), element))
    what = f"{kind.name} backward {element.name} {shape}"
    check_backward(results[0], expected, element, what)
    np.testing.assert_array_equal(results[1], results[0], what)
    assert plan.choice == "cols", what


# -- register-resident gradient (Max/Min, Var/Std of lines that fit in one block) --------
# Word-aligned rows whose extent is a whole number of words take the kernel that holds the
# row in registers (access "reg"): one warp or less per row, several warps per row, padded
# rows; column layouts whose strip of columns fits in a block take "reg_cols"; the other
# layouts must fall back to the word rows / columns kernels ("rows", "cols").


def _reg_layouts(width: int) -> dict:
    """name -> (base shape, index into the base, reduce axis, expected access with a
    workspace; "cols" falls back to "generic" without one)."""
    warps = 260 * width  # 260 words: 64 lanes, two warps per row in the simulator's block
    every = (slice(None), slice(None))
    layouts = {
        "reg_rows": ((5, 16), every, 1, "reg"),
        "reg_padded": ((3, 20), (slice(None), slice(0, 16)), 1, "reg"),
        "reg_warps": ((2, warps), every, 1, "reg"),
        # 16 words a row: 4 lanes (16 rows a 64-thread block in the simulator), a partial
        # last group
        "reg_pairs": ((70, 16 * width), every, 1, "reg"),
        # 32 words a row: 8 lanes (the gradients without a statistic keep the word rows
        # below a warp of lanes), a partial last group
        "reg_pairs8": ((40, 32 * width), every, 1, "reg"),
        # 8 words a lane (64 lanes in the simulator, 256 on the GPU): f32 Var/Std load
        # whole rows unpredicated
        "reg_whole": ((3, (512 if SIMULATOR else 2048) * width), every, 1, "reg"),
        "odd_extent": ((3, 18), (slice(None), slice(0, 17)), 1, "rows"),
        "row_phase": ((3, 17), (slice(None), slice(0, 16)), 1, "rows"),
        "unaligned": ((3, 17), (slice(None), slice(1, 17)), 1, "rows"),
        "two_out_dims": ((2, 3, 16), (slice(None), slice(0, 2), slice(None)), 2, "rows"),
        # columns: 16 row lanes x 4 column words per 64-thread block (two warps) in the
        # simulator; 128 row lanes x 8 column words per 1024-thread block on the GPU
        "reg_cols": ((160, 16) if SIMULATOR else (1100, 32), every, 0, "reg_cols"),
        "cols_padded": ((160, 24) if SIMULATOR else (1100, 40), (slice(None), slice(0, 16)),
                        0, "reg_cols"),
        # 40 rows: 4 row lanes x 16 (f32) / 8 (f16, bf16) column words: 64 / 32 threads
        "reg_cols_small": ((40, 16), every, 0, "reg_cols"),
        # 128-byte strips of f16/bf16 (64 columns: 4 row lanes x 16 words, each thread
        # adding its own columns' warp partials); 80 columns: a partial second strip
        "reg_cols_wide": ((40, 80), every, 0, "reg_cols"),
        # strips twice as wide through the stash kernel: 16 rows per thread in shared
        # memory, the rest (up to 16) in registers; partial last rows, several strips
        "cols_stash": ((250, 32) if SIMULATOR else (4000, 64), every, 0, "reg_cols"),
        "cols_short": ((6, 16), every, 0, "cols"),  # < 8 rows per thread
        # more rows than the simulator's 64-thread block holds; a 512-thread block (GPU)
        "cols_long": ((300, 8), every, 0, "cols" if SIMULATOR else "reg_cols"),
        # 256-byte strips (32 column words) of 33-64 rows (simulator) / 129-256 (GPU): 2 / 8
        # row lanes of up to 32 rows, partial last lanes, a partial third strip
        "cols_strip": ((40, 272) if SIMULATOR else (200, 272), every, 0, "reg_cols"),
    }
    if not SIMULATOR:  # a row per 256-thread block (8 words per lane), and one word more;
        # 4096 rows x 4 column words per 1024-thread block, and one row more
        layouts["reg_block"] = ((3, 2048 * width), every, 1, "reg")
        layouts["too_long"] = ((3, 2049 * width), every, 1, "rows")
        layouts["cols_block"] = ((4096, 64), every, 0, "reg_cols")
        layouts["cols_4097"] = ((4097, 32), every, 0, "cols")
        # 256 rows: 16 row lanes x 16 (f32) / 8 (f16, bf16) column words = 256 / 128 threads
        layouts["reg_cols_256"] = ((256, 72), every, 0, "reg_cols")
    return layouts


_REG_LAYOUT_NAMES = list(_reg_layouts(2))


#: reg_cols layouts that must (not) take the stash kernel whatever the element.
_STASH_LAYOUTS = {"cols_stash": True, "cols_block": True, "cols_long": False,
                  "reg_cols_small": False, "reg_cols_wide": False, "reg_cols_256": False,
                  "cols_strip": False}
#: reg_cols layouts that take the 256-byte strips' kernel (at least 32 output words; 40
#: rows fill its largest block in the simulator, 256 on the GPU), by elements per word.
_STRIP_LAYOUTS = {"cols_strip": lambda width: True,
                  "reg_cols_256": lambda width: 72 // width >= REG_COL_STRIP_WORDS,
                  "reg_cols_wide": lambda width: SIMULATOR and 80 // width >= REG_COL_STRIP_WORDS}


@IEEE_SPECIALS
@pytest.mark.parametrize("kind, element, layout", kinds_elements_layouts(
    [K.MAX, K.MIN, K.VAR, K.STD], _REG_LAYOUT_NAMES))
def test_register_resident_backward(kind, element, layout, rng):
    """dx against float64 with ties (Max/Min), a NaN line (Max/Min: no position equals the
    saved NaN, so the line is NaN) or an inf (Var/Std: x - inf = -inf as torch) in one line,
    correction 0 on the padded layouts; with and without a workspace (the same kernel for
    "reg*" layouts: bit-identical), bit-identical on a rerun; padding untouched."""
    width = 2 if element is E.F32 else 4
    base_shape, index, axis, access = _reg_layouts(width)[layout]
    correction = 0 if layout in ("reg_padded", "cols_padded") else 1
    first_row = (0,) * (len(base_shape) - 1)
    if kind in (K.MAX, K.MIN):
        base = rng.integers(-3, 4, size=base_shape) * 0.5
        base[first_row + (3,)] = np.nan
    else:
        base = rng.uniform(-2.0, 2.0, size=base_shape)
        # every path's mean is a sum over n: torch's x - inf = -inf (NaN at the inf)
        base[first_row + (5,)] = np.inf
    base = to_storage(base, element)
    shape = np.empty(base_shape)[index].shape
    x_host = np.ascontiguousarray(base[index])
    y = saved_output(kind, x_host, axis, element, correction)
    dy = random_values(y.shape, element, rng)
    expected = backward_reference(kind, from_storage(dy, element), from_storage(x_host, element),
                                  from_storage(y, element), axis, correction)
    results = []
    # the stash kernel's wider strips beat the tie count after dx
    layout_words = shape[1 - axis] // width if len(shape) == 2 else 0
    cols_reg = cols_reg_layout(shape[axis], width, out_words=layout_words) \
        if access == "reg_cols" else None
    stash = cols_reg is not None and cols_reg[2]
    strip = cols_reg is not None and cols_reg[3]
    assert stash == _STASH_LAYOUTS.get(layout, stash), layout
    assert strip == (layout in _STRIP_LAYOUTS and _STRIP_LAYOUTS[layout](width)), layout
    for workspace in (True, False, True):
        dx_base = poisoned(base_shape, element)
        dx = device_view(dx_base, index, shape, element)
        desc = ReduceBackwardDescriptor(kind, shape, axis, element, correction)
        plan = ReduceBackwardPlan.select(desc, None if workspace else NO_WORKSPACE)
        ws = to_device(np.zeros(plan.workspace_size, np.uint8)) \
            if plan.workspace_size and workspace else None
        plan.run(ReduceBackwardArgs(to_device(dy), dx, device_view(base, index, shape, element),
                                    to_device(y)), workspace=ws)
        what = f"{kind.name} backward {element.name} {layout} workspace={workspace}"
        got = storage_of(dx, element)
        check_backward(from_storage(got, element), expected, element, what)
        chosen = plan.choice
        expected_access = "generic" if access == "cols" and not workspace else access
        if access == "reg_cols" and cols_reg is None:  # neither the stash nor the strips:
            expected_access = "cols" if workspace else "generic"  # x read twice
        if layout == "too_long" and workspace:
            expected_access = "sync"  # 3 one-chunk rows: the hold kernel (next section)
        assert chosen == expected_access, what
        if chosen == "reg_cols":
            name = next(iter(plan.bound_launches().values()))[1][1].kernel.name
            assert ("stash" in name) == stash, (what, name)
            assert ("strip" in name) == strip, (what, name)
        results.append(got.tobytes())
        if layout.endswith("padded") and SIMULATOR:  # the padding columns stay poisoned
            assert np.all(np.isnan(from_storage(dx_base[:, 16:], element))), what
    assert results[0] == results[2], f"{kind.name} {layout}: not deterministic"
    if access == "reg" or stash or strip:
        # the same kernel with and without a workspace
        assert results[0] == results[1], f"{kind.name} {layout}: workspace changed dx"


@IEEE_SPECIALS
@pytest.mark.parametrize("layout", ["reg_rows", "reg_padded", "reg_pairs8", "reg_warps"]
                         + ([] if SIMULATOR else ["reg_block", "too_long"]), ids=str)
@pytest.mark.parametrize("element", WORD_ELEMENTS, ids=lambda e: e.name)
@pytest.mark.parametrize("kind", [K.PROD, K.NORM2, K.LOG_SUM_EXP], ids=lambda k: k.name)
def test_register_resident_stream_backward(kind, element, layout, rng):
    """The gradients without a statistic take the register-resident row kernel (every
    load of a row, then every store) where a row spans at least a warp of lanes, and the
    word row kernel otherwise; dx
    against float64 (a zero in the first row: Prod's dy * y / x is NaN there),
    bit-identical on a rerun, padding untouched."""
    width = 2 if element is E.F32 else 4
    base_shape, index, axis, access = _reg_layouts(width)[layout]
    base = rng.uniform(0.9, 1.1, size=base_shape) * rng.choice([-1.0, 1.0], size=base_shape)
    base[(0,) * (len(base_shape) - 1) + (3,)] = 0.0
    base = to_storage(base, element)
    shape = np.empty(base_shape)[index].shape
    x_host = np.ascontiguousarray(base[index])
    y = saved_output(kind, x_host, axis, element)
    dy = random_values(y.shape, element, rng)
    expected = backward_reference(kind, from_storage(dy, element), from_storage(x_host, element),
                                  from_storage(y, element), axis)
    lanes = reg_lanes(shape[axis], width)
    expected_access = "reg" if access == "reg" and lanes >= REG_STREAM_MIN_LANES else "rows"
    assert expected_access == "reg" or layout in ("reg_rows", "reg_padded", "reg_pairs8",
                                                  "too_long")
    results = []
    for _ in range(2):
        dx_base = poisoned(base_shape, element)
        dx = device_view(dx_base, index, shape, element)
        plan = ReduceBackwardPlan.select(ReduceBackwardDescriptor(kind, shape, axis, element),
                                         NO_WORKSPACE)
        plan.run(ReduceBackwardArgs(to_device(dy), dx, device_view(base, index, shape, element),
                                    to_device(y)))
        what = f"{kind.name} backward {element.name} {layout}"
        got = storage_of(dx, element)
        check_backward(from_storage(got, element), expected, element, what)
        launch = next(iter(plan.bound_launches().values()))[1]
        assert launch[0] == expected_access, what
        if layout.endswith("padded") and SIMULATOR:
            assert np.all(np.isnan(from_storage(dx_base[:, 16:], element))), what
        results.append(got.tobytes())
    assert results[0] == results[1], f"{kind.name} {layout}: not deterministic"


@IEEE_SPECIALS
@pytest.mark.parametrize("element", WORD_ELEMENTS, ids=lambda e: e.name)
@pytest.mark.parametrize("kind", [K.MAX, K.MIN], ids=lambda k: k.name)
def test_register_resident_tie_specials(kind, element):
    """Max/Min gradients through the register-resident rows with -0 and +0 tied,
    infinities, a NaN line, subnormal ties (and a subnormal line of both signs) and NaN /
    inf dy, against float64, bit-identical on a rerun."""
    tiny = {E.F16: 2.0 ** -20, E.BF16: 2.0 ** -130, E.F32: 2.0 ** -140}[element]
    rows = np.arange(12 * 64).reshape(12, 64) % 5 - 2.0
    rows[0, :] = -0.0
    rows[0, 7], rows[0, 40] = 0.0, 0.0  # Max +0 ties every -0; Min -0 ties every +0
    rows[1, :] = -np.inf
    rows[2, 5], rows[2, 63], rows[2, 20] = np.inf, -np.inf, np.inf
    rows[3, 9] = np.nan
    rows[4, :] = -1.0
    rows[4, 3], rows[4, 33], rows[5, :] = tiny, tiny, -tiny
    rows[6, :], rows[6, 10] = -tiny, tiny  # subnormals of both signs: no flush to zero
    x = to_storage(rows, element)
    x64 = from_storage(x, element)
    y = saved_output(kind, x, 1, element)
    dy = to_storage(np.array([[1.5], [np.nan], [2.0], [1.0], [np.inf], [-3.0]]
                             + [[0.25]] * 6), element)
    expected = backward_reference(kind, from_storage(dy, element), x64,
                                  from_storage(y, element), 1)
    results = []
    for _ in range(2):
        plan = ReduceBackwardPlan.select(ReduceBackwardDescriptor(kind, x.shape, 1, element),
                                         NO_WORKSPACE)
        dx = to_device(poisoned(x.shape, element))
        plan.run(ReduceBackwardArgs(to_device(dy), dx, to_device(x), to_device(y)))
        assert plan.choice == "reg"
        got = to_host(dx)
        check_backward(from_storage(got, element), expected, element, f"{kind.name} specials")
        results.append(got.tobytes())
    assert results[0] == results[1]


def test_stream_gradient_split_geometry():
    """The gradients without a statistic split lines that split anyway (fewer groups than
    half of VEC_TARGET_BLOCKS) down to STREAM_MIN_BATCHES batches per thread, aiming
    at STREAM_TARGET_BLOCKS blocks; lines with more groups split as the kernels with a
    statistic do."""
    stream_rows = stream_cols = {"target": STREAM_TARGET_BLOCKS,
                                 "min_batches": STREAM_MIN_BATCHES}
    assert split_aim(1, 1 << 20) == 1 << 20
    assert split_aim(VEC_TARGET_BLOCKS - 1, 1 << 20) == VEC_TARGET_BLOCKS
    # one long row, one column word over many rows: a split per batch, up to the target
    long = 1 << 22
    for width in (1, 2, 4):
        row = rows_vec_geometry(1, long * width, width, 1 << 16, **stream_rows)
        base = rows_vec_geometry(1, long * width, width, 1 << 16)
        batch = row.lanes * VEC_LOADS
        assert row.splits == min(STREAM_TARGET_BLOCKS, long // batch) > base.splits
        assert row.chunk_len % batch == 0
        col = cols_vec_geometry(width, long, width, 1 << 16, **stream_cols)
        base = cols_vec_geometry(width, long, width, 1 << 16)
        assert col.splits > base.splits and col.chunk_len % (col.lanes * CHUNK) == 0
        # groups that fill half of VEC_TARGET_BLOCKS or more: as before
        rows = (VEC_TARGET_BLOCKS - 1) * 8  # (GPU) 8 rows of 32 lanes per block
        many = rows_vec_geometry(rows, 1024 * width, width, 1 << 16, **stream_rows)
        assert many == rows_vec_geometry(rows, 1024 * width, width, 1 << 16)


def test_stash_needs_its_shared_memory(monkeypatch, rng):
    """A device whose blocks cannot take the stash's shared memory (sm_86 / sm_89: 99 KiB)
    takes the way of columns without a register-resident kernel (without a workspace the
    generic fused gradient), with the float64 result."""
    shape = (250, 32) if SIMULATOR else (4000, 64)
    x_host = to_storage(rng.uniform(-2.0, 2.0, size=shape), E.F32)
    y = saved_output(K.VAR, x_host, 0, E.F32)
    dy = random_values(y.shape, E.F32, rng)
    expected = backward_reference(K.VAR, dy, x_host, y, 0)
    names = []
    for fits in (True, False):
        if not fits:
            monkeypatch.setattr(REDUCE_BACKWARD_COLS_STASH_KERNELS[(K.VAR, E.F32)],
                                "dynamic_shared_limit", lambda: REG_COLS_STASH_BYTES - 1)
        plan = ReduceBackwardPlan.select(ReduceBackwardDescriptor(K.VAR, shape, 0, E.F32),
                                         NO_WORKSPACE)
        dx = to_device(poisoned(shape, E.F32))
        plan.run(ReduceBackwardArgs(to_device(dy), dx, to_device(x_host), to_device(y)))
        check_backward(to_host(dx), expected, E.F32, f"VAR stash fits={fits}")
        access, bound = next(iter(plan.bound_launches().values()))[1]
        names.append((access, bound.kernel.name))
    assert names == [("reg_cols", "reduce_backward_cols_stash[var,f32]"),
                     ("generic", "reduce_backward[var,f32]")], names


@pytest.mark.gpu
def test_gpu_dynamic_shared_limit():
    """The stash kernel's dynamic shared memory limit is the device's opt-in limit less
    its static shared memory; a larger opt-in is clamped to it instead of failing."""
    kernel = REDUCE_BACKWARD_COLS_STASH_KERNELS[(K.VAR, E.F32)]
    limit = kernel.dynamic_shared_limit()
    assert REG_COLS_STASH_BYTES <= limit < 256 * 1024, limit  # H100 / H200: 227 KiB less 8
    kernel.allow_dynamic_shared(1 << 30)
    assert kernel.dynamic_shared_bytes == limit


# -- the Var/Std and Max/Min gradients of long rows in one launch (access "sync") ---------
# Word-aligned rows too long for the registers, with a workspace: chunks publish their sums
# (Max/Min: tie counts) through the workspace and the gradient chunks wait for their row's
# (the hold kernel: the row's chunks all resident at once).


def _sync_layouts(width: int) -> dict:
    """name -> (base shape, index into the base, shape of the view): rows of 2.5 parts
    (a partial last chunk), padded rows, one row. GPU only: "long_rows" (3 rows of 300
    parts: too long for the hold kernel's rule, the statistic pass or the tie count
    after dx), "many_rows", more rows than the GPU's blocks (the word-row kernels would
    take them a block each, but the hold kernel reads x once) and "stash_rows" (101 parts
    a row, the last partial and alone in the kernel's last chunk)."""
    chunk = SYNC_BATCHES * SYNC_BLOCK * VEC_LOADS * width
    every = (slice(None), slice(None))
    long = chunk * 5 // 2
    layouts = {
        "rows": ((3, long), every, (3, long)),
        "padded": ((3, long + 2 * width), (slice(None), slice(0, long)), (3, long)),
        "one_row": ((1, long), every, (long,)),
    }
    if not SIMULATOR:
        layouts["long_rows"] = ((3, 300 * chunk - width), every, (3, 300 * chunk - width))
        many = VEC_TARGET_BLOCKS + 72
        layouts["many_rows"] = ((many, long), every, (many, long))
        stash = chunk * 201 // 2
        layouts["stash_rows"] = ((3, stash), every, (3, stash))
    return layouts


def _hold_resident(kind, element) -> int:
    """Resident blocks of the hold kernel with its shared memory on this device."""
    return REDUCE_BACKWARD_ROWS_HOLD_STASH_KERNELS[
        (GRAD_KERNEL_KIND.get(kind, kind), element)].resident_blocks(
        SYNC_BLOCK, HOLD_STASH_BYTES)


def _hold_expected(kind, element, parts: int) -> bool:
    """Whether the plan's rule takes the hold kernel (x read once) for rows of ``parts``
    parts (chunks of two) on this device."""
    if parts > HOLD_POLL_SLOTS * SYNC_BLOCK:  # a thread reads at most two part totals
        return False
    in_flight = HOLD_TIES_ROWS_IN_FLIGHT if kind in (K.MAX, K.MIN) else HOLD_ROWS_IN_FLIGHT
    chunks = -(-parts // 2)
    resident = _hold_resident(kind, element)
    return resident > 0 and (chunks == 1 or in_flight * chunks <= resident)


@IEEE_SPECIALS
@pytest.mark.parametrize("kind, element, layout",
                         kinds_elements_layouts([K.VAR, K.STD, K.MAX, K.MIN], _sync_layouts(2)))
def test_row_sync_backward(kind, element, layout, rng):
    """dx against float64 (correction 0 on the padded rows) with an inf in the first row
    (its sum -> mean is inf: x - inf = -inf as torch) and a NaN in the last, Max/Min with
    three tied extremes in the middle row (or the only one); a workspace full of ones
    (zeroed by the plan before each launch); bit-identical on a rerun; the padding
    untouched. Without a workspace the fused statistic is a sum as well, so the inf row is
    the same there. With a workspace the hold kernel where it fits, else (Var/Std) the
    word rows or (Max/Min) the tie count after dx."""
    width = 2 if element is E.F32 else 4
    base_shape, index, shape = _sync_layouts(width)[layout]
    correction = 0 if layout == "padded" else 1
    base = rng.uniform(-2.0, 2.0, size=base_shape)
    specials = base_shape[0] > 1
    if specials:
        base[0, 5] = np.inf
        base[-1, -7] = np.nan
    if kind in (K.MAX, K.MIN):
        base[base_shape[0] // 2, [3, shape[-1] // 2, shape[-1] - 1]] = \
            3.0 if kind is K.MAX else -3.0
    base = to_storage(base, element)
    x_host = np.ascontiguousarray(base[index]).reshape(shape)
    axis = len(shape) - 1
    y = saved_output(kind, x_host, axis, element, correction)
    dy = random_values(y.shape, element, rng)
    expected = backward_reference(kind, from_storage(dy, element), from_storage(x_host, element),
                                  from_storage(y, element), axis, correction)
    ties = kind in (K.MAX, K.MIN)
    parts = sync_layout(shape[0] if len(shape) > 1 else 1, shape[-1], width)[0]
    resident = _hold_resident(kind, element)
    hold = _hold_expected(kind, element, parts)
    results = []
    for workspace in (True, True, False):
        dx_base = poisoned(base_shape, element)
        dx = device_view(dx_base, index, shape, element)
        desc = ReduceBackwardDescriptor(kind, shape, axis, element, correction)
        plan = ReduceBackwardPlan.select(desc, None if workspace else NO_WORKSPACE)
        ws = to_device(np.full(plan.workspace_size, 0xFF, np.uint8)) if workspace else None
        plan.run(ReduceBackwardArgs(to_device(dy), dx, device_view(base, index, shape, element),
                                    to_device(y)), workspace=ws)
        what = f"{kind.name} backward {element.name} {layout} workspace={workspace}"
        got = storage_of(dx, element)
        check_backward(from_storage(got, element), expected, element, what)
        access, launch = next(iter(plan.bound_launches().values()))[1]
        assert (access == "sync") == (workspace and hold), (what, access, parts, resident)
        results.append(got.tobytes())
        if layout == "padded":
            assert np.all(np.isnan(from_storage(storage_of(
                device_view(dx_base, (slice(None), slice(shape[1], None)), (3, 2 * width),
                            element), element), element))), what
    assert results[0] == results[1], f"{kind.name} {layout}: not deterministic"
    # the hold kernel (x read once) where the device holds the chunks of
    # HOLD_ROWS_IN_FLIGHT (Max/Min: HOLD_TIES_ROWS_IN_FLIGHT) rows at once; the other
    # way (row_hold forced the other way, where it can run: twice a row's chunks; the
    # tie count after dx, or the word rows) gives the same bits for Max/Min (the same dy /
    # count) and the float64 result for Var/Std (its own order of the sums)
    assert ReduceBackwardPlan.select(desc).hold_layout[0] == parts
    chunks = -(-parts // 2)
    fits = resident > 0 and (chunks == 1 or 2 * chunks <= resident) \
        and parts <= HOLD_POLL_SLOTS * SYNC_BLOCK
    if fits:
        plan = ReduceBackwardPlan.select(desc)
        plan.row_hold = not hold
        dx = device_view(poisoned(base_shape, element), index, shape, element)
        ws = to_device(np.full(plan.workspace_size, 0xFF, np.uint8))
        plan.run(ReduceBackwardArgs(to_device(dy), dx, device_view(base, index, shape, element),
                                    to_device(y)), workspace=ws)
        access, launch = next(iter(plan.bound_launches().values()))[1]
        assert (access == "sync") is not hold, (what, access)
        got = storage_of(dx, element)
        if ties:
            assert got.tobytes() == results[0], f"{what}: hold != other"
        else:
            check_backward(from_storage(got, element), expected, element, f"{what} (other)")


def _one_chunk_params() -> list:
    """``kind, element, full, two`` of the one-chunk hold test: every combination on the
    GPU; in the simulator partial chunks at f32 and bf16, full chunks at two of them, rows
    of two parts (the chunk's second half in shared memory) at two."""
    params = []
    for kind in (K.VAR, K.STD, K.MAX, K.MIN):
        for element in WORD_ELEMENTS if not SIMULATOR else (E.F32, E.BF16):
            for full in (False, True):
                for two in (False, True):
                    if SIMULATOR and (full or two) and (kind, element, full, two) not in (
                            (K.VAR, E.F32, True, False), (K.MAX, E.BF16, True, False),
                            (K.VAR, E.F32, True, True), (K.MAX, E.BF16, False, True)):
                        continue
                    params.append(pytest.param(kind, element, full, two, id=(
                        f"{kind.name}-{element.name}-{'full' if full else 'partial'}"
                        f"{'-two' if two else ''}")))
    return params


@pytest.mark.parametrize("kind", [K.VAR, K.MAX])
def test_row_hold_backward_poll_slots(kind):
    """The hold kernel's threads read HOLD_POLL_SLOTS of a row's part totals each: rows of
    more than HOLD_POLL_SLOTS * SYNC_BLOCK parts never take it, even forced (``row_hold``:
    ``hold_kernel`` gives None, the plan's sign to take the other way); one-chunk rows
    always fit."""
    plan = ReduceBackwardPlan.select(ReduceBackwardDescriptor(kind, (3, 1024), 1, E.F32))
    plan.row_hold = True
    limit = HOLD_POLL_SLOTS * SYNC_BLOCK
    assert plan.hold_kernel(kind, E.F32, limit + 1) is None
    assert plan.hold_kernel(kind, E.F32, 4 * limit) is None
    for parts in (1, 2):
        kernel, grid = plan.hold_kernel(kind, E.F32, parts)
        assert grid >= 1 and kernel.name.startswith("reduce_backward_rows_hold_stash")


@IEEE_SPECIALS
@pytest.mark.parametrize("kind, element, full, two", _one_chunk_params())
def test_row_hold_backward_one_chunk_rows(kind, element, full, two, rng):
    """Rows of one chunk, partial (a thread's last words past the row: the predicated
    loads) or full (every thread's words in the row: the unpredicated loads), forced
    onto the hold kernel's path (no register-resident rows; for every element: a chunk
    waits only for itself, also in the simulator, whose blocks run one after another),
    against float64, with an inf row, a NaN row, three tied extremes in the middle row
    (Max/Min: dy split three ways) and a workspace of 0xFF bytes; bit-identical on a
    rerun. ``two``: rows of two parts (the chunk's second half through shared memory),
    else one (the shared-memory half empty); the other way (the tie count after dx, or
    the word rows) gives the same bits for Max/Min, the float64 result for Var/Std."""
    width = 2 if element is E.F32 else 4
    chunk = SYNC_BATCHES * SYNC_BLOCK * VEC_LOADS * (2 if two else 1)
    shape = (3, (chunk if full else chunk - SYNC_BLOCK * 5 // 2) * width)
    x_host = rng.uniform(-2.0, 2.0, size=shape)
    x_host[0, 5] = np.inf
    x_host[-1, -7] = np.nan
    x_host[1, [3, shape[1] // 2, -1]] = 3.0 if kind is K.MAX else -3.0
    x_host = to_storage(x_host, element)
    y = saved_output(kind, x_host, 1, element, 1)
    dy = random_values(y.shape, element, rng)
    expected = backward_reference(kind, from_storage(dy, element), from_storage(x_host, element),
                                  from_storage(y, element), 1, 1)
    results = []
    for hold in (True, True, False):
        plan = ReduceBackwardPlan.select(ReduceBackwardDescriptor(kind, shape, 1, element, 1))
        plan.row_hold = hold
        plan.register_rows = False
        assert plan.hold_layout[0] == (2 if two else 1)
        ws = to_device(np.full(plan.workspace_size, 0xFF, np.uint8))
        dx = to_device(poisoned(shape, element))
        plan.run(ReduceBackwardArgs(to_device(dy), dx, to_device(x_host), to_device(y)),
                 workspace=ws)
        access, launch = next(iter(plan.bound_launches().values()))[1]
        assert (access == "sync") == hold, access
        got = to_host(dx)
        check_backward(from_storage(got, element), expected, element,
                       f"{kind.name} backward {element.name} one-chunk rows (hold={hold})")
        results.append(got.tobytes())
    assert results[0] == results[1], "not deterministic"
    if kind in (K.MAX, K.MIN):
        assert results[2] == results[0], "the hold kernel's bits differ from the other way's"


# -- the Max/Min gradient's tie count after dx (split word rows and columns) ---------------
# With a workspace, split rows and the column word kernel write dx as if every line had one
# tie and count the ties (rows: per split, then a merge; columns: atomics into zeroed
# slots); the counts pick the lines to rewrite: lines with one tie (skipped), ties in
# different splits (rewritten), a NaN extreme (no tie: NaN).


def _tie_layouts():
    """name -> (shape, axis): long rows split over blocks (odd length: a tail; too long for
    the register-resident rows on the GPU) and columns too long for the register-resident
    columns, split along the axis."""
    if SIMULATOR:
        return {"rows": ((5, 701), 1), "cols": ((600, 8), 0)}
    return {"rows": ((5, 70001), 1), "cols": ((10000, 8), 0)}


@IEEE_SPECIALS
@pytest.mark.parametrize("layout", ["rows", "cols"], ids=str)
@pytest.mark.parametrize("element", WORD_ELEMENTS, ids=lambda e: e.name)
@pytest.mark.parametrize("kind", [K.MAX, K.MIN], ids=lambda k: k.name)
def test_tie_count_after_dx(kind, element, layout, rng):
    """Line 0: one tie (the first pass's dx stands; its dy is inf, so the other positions
    are NaN as torch's (dy / 1) * 0), line 1: the extreme at both ends (different splits),
    line 2: a NaN (every position NaN); the rest of the lines: random ties (the rewrite of
    the tied words from the tie masks). Against float64, bit-identical to a rerun and equal
    to the single-pass gradient (no workspace; NaN payloads may differ)."""
    shape, axis = _tie_layouts()[layout]
    n = shape[axis]
    lines = np.moveaxis(rng.integers(-40, 40, size=shape) * 0.25, axis, 0)  # view
    sign = 1.0 if kind is K.MAX else -1.0
    lines[:, 0] = rng.permutation(n) * 0.125 * sign
    lines[[0, -1], 1] = 20.0 * sign
    lines[n // 2, 2] = np.nan
    x_host = to_storage(np.moveaxis(lines, 0, axis), element)
    y = saved_output(kind, x_host, axis, element)
    dy = random_values(y.shape, element, rng)
    dy.reshape(-1)[0] = to_storage(np.array([np.inf]), element)[0]
    expected = backward_reference(kind, from_storage(dy, element), from_storage(x_host, element),
                                  from_storage(y, element), axis)
    results = []
    for workspace in (True, True, False):
        plan = ReduceBackwardPlan.select(ReduceBackwardDescriptor(kind, shape, axis, element),
                                         None if workspace else NO_WORKSPACE)
        # poisoned: the plan zeroes what it counts into
        ws = to_device(np.full(plan.workspace_size, 0xA5, np.uint8)) if workspace else None
        dx = to_device(poisoned(shape, element))
        plan.run(ReduceBackwardArgs(to_device(dy), dx, to_device(x_host), to_device(y)),
                 workspace=ws)
        got = to_host(dx)
        what = f"{kind.name} backward {element.name} {layout} workspace={workspace}"
        check_backward(from_storage(got, element), expected, element, what)
        results.append(got.tobytes())
        stat, (access, gradient) = next(iter(plan.bound_launches().values()))
        if workspace:
            assert access == layout and type(stat).__name__ == "_TieCount", what
            assert gradient.grid[1] > 1, f"{what}: not split"
    assert results[0] == results[1], f"{kind.name} {layout}: not deterministic"
    single = [from_storage(np.frombuffer(r, got.dtype), element) for r in results[1:]]
    np.testing.assert_array_equal(single[0], single[1], f"{kind.name} {layout}: single pass")


@IEEE_SPECIALS
@pytest.mark.parametrize("layout", ["rows", "cols"], ids=str)
def test_tie_count_needs_its_workspace(layout, rng):
    """A workspace preference below the tie masks' size keeps the statistic pass (x read
    twice) within it: the same dx as the tie count after dx."""
    shape, axis = _tie_layouts()[layout]
    x_host = to_storage(rng.integers(-40, 40, size=shape) * 0.25, E.F32)
    y = saved_output(K.MAX, x_host, axis, E.F32)
    dy = random_values(y.shape, E.F32, rng)
    desc = ReduceBackwardDescriptor(K.MAX, shape, axis, E.F32)
    full = ReduceBackwardPlan.select(desc)
    limited = ReduceBackwardPlan.select(desc, PlanPreference(
        max_workspace_bytes=full.workspace_size - 1))
    assert 0 < limited.workspace_size < full.workspace_size
    results = []
    for plan in (full, limited):
        dx = to_device(poisoned(shape, E.F32))
        plan.run(ReduceBackwardArgs(to_device(dy), dx, to_device(x_host), to_device(y)),
                 workspace=to_device(np.zeros(plan.workspace_size, np.uint8)))
        results.append(to_host(dx))
    stats = [type(next(iter(p._launches.values()))[0]).__name__ for p in (full, limited)]
    assert stats == ["_TieCount", "_ReduceLaunch"], stats
    expected = backward_reference(K.MAX, dy, x_host, y, axis)
    check_backward(results[1], expected, E.F32, f"MAX {layout} statistic pass")
    np.testing.assert_array_equal(results[0], results[1])


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["rows", "cols"], ids=str)
@pytest.mark.parametrize("element", [E.F32, E.BF16], ids=lambda e: e.name)
def test_gpu_tie_masks_long(element, layout, rng):
    """Lines long enough for several tie masks per lane and split (the bench's geometries):
    [200, 70000 words] rows in 2 splits; columns of 32 words in about 2000 splits
    (``_tie_cols_geometry``: 800000 f32 rows give a lane 6 batches, 4 a mask; 320000 bf16
    rows 3, 2 a mask); random ties in every line. Against float64, bit-identical to a
    rerun."""
    width = 2 if element is E.F32 else 4
    rows = 800000 if element is E.F32 else 320000
    shape, axis = ((200, 35000 * width + 1), 1) if layout == "rows" else ((rows, 32 * width), 0)
    x_host = to_storage(rng.integers(-60, 60, size=shape) * 0.25, element)
    y = saved_output(K.MAX, x_host, axis, element)
    dy = random_values(y.shape, element, rng)
    expected = backward_reference(K.MAX, from_storage(dy, element), from_storage(x_host, element),
                                  from_storage(y, element), axis)
    plan = ReduceBackwardPlan.select(ReduceBackwardDescriptor(K.MAX, shape, axis, element))
    ws = to_device(np.zeros(plan.workspace_size, np.uint8))
    x_dev, y_dev, dy_dev = to_device(x_host), to_device(y), to_device(dy)
    results = []
    for _ in range(2):
        dx = to_device(poisoned(shape, element))
        plan.run(ReduceBackwardArgs(dy_dev, dx, x_dev, y_dev), workspace=ws)
        results.append(to_host(dx))
    check_backward(from_storage(results[0], element), expected, element,
                   f"MAX backward {element.name} {layout} {shape}")
    assert results[0].tobytes() == results[1].tobytes(), "not deterministic"
    stat, (access, gradient) = next(iter(plan.bound_launches().values()))
    assert access == layout and type(stat).__name__ == "_TieCount"
    lanes, chunk = gradient.args[15:17] if layout == "rows" else gradient.args[12:14]
    assert -(-chunk // (VEC_LOADS * lanes)) > tie_mask_iters(width), "one mask per lane and split"


# -- rejections (raised before anything is written) ---------------------------------------


def test_select_rejections():
    with pytest.raises(InvalidProblem, match="ReducePlan: input_shape has rank 0"):
        ReducePlan.select(ReduceDescriptor(K.SUM, (), 0, E.F32))
    with pytest.raises(Unsupported, match="rank 9"):
        ReducePlan.select(ReduceDescriptor(K.SUM, (1,) * 9, 0, E.F32))
    with pytest.raises(InvalidProblem, match="reduce_axis"):
        ReducePlan.select(ReduceDescriptor(K.SUM, (2, 3), 2, E.F32))
    with pytest.raises(InvalidProblem, match="reduce_axis"):
        ReducePlan.select(ReduceDescriptor(K.SUM, (2, 3), -1, E.F32))
    with pytest.raises(Unsupported, match="kind = ANY"):
        ReducePlan.select(ReduceDescriptor(K.ANY, (2, 3), 0, E.F32))
    with pytest.raises(Unsupported, match="element = I32"):
        ReducePlan.select(ReduceDescriptor(K.VAR, (2, 3), 0, E.I32))
    with pytest.raises(Unsupported, match="element = S8"):
        ReducePlan.select(ReduceDescriptor(K.SUM, (2, 3), 0, E.S8))
    for kind in (K.MAX, K.MIN):
        with pytest.raises(InvalidProblem, match="empty axis"):
            ReducePlan.select(ReduceDescriptor(kind, (2, 0), 1, E.F32))
        with pytest.raises(InvalidProblem, match="empty axis"):
            ReduceBackwardPlan.select(ReduceBackwardDescriptor(kind, (2, 0), 1, E.F32))
    for kind in (K.ARGMAX, K.ARGMIN):
        with pytest.raises(InvalidProblem, match="empty axis"):
            ArgReducePlan.select(ArgReduceDescriptor(kind, (0, 2), 0, E.F32))
    with pytest.raises(Unsupported, match="kind = SUM"):
        ArgReducePlan.select(ArgReduceDescriptor(K.SUM, (2, 3), 0, E.F32))
    with pytest.raises(Unsupported, match="element = I32"):
        ReduceBackwardPlan.select(ReduceBackwardDescriptor(K.SUM, (2, 3), 0, E.I32))
    assert REDUCE_ELEMENTS[K.MEAN] == FLOAT_ELEMENTS


def test_run_rejections_write_nothing(rng):
    x = random_values((3, 5), E.F32, rng)
    plan = ReducePlan.select(ReduceDescriptor(K.SUM, (3, 5), 1, E.F32), NO_WORKSPACE)
    y = to_device(poisoned((3, 1), E.F32))
    with pytest.raises(InvalidProblem, match="ReducePlan: y has shape"):
        plan.run(ReduceArgs(to_device(x), to_device(poisoned((3, 2), E.F32))))
    with pytest.raises(InvalidProblem, match="ReducePlan: x has typestr"):
        plan.run(ReduceArgs(to_device(x.astype(np.float64)), y))
    assert np.all(np.isnan(to_host(y)))
    arg = ArgReducePlan.select(ArgReduceDescriptor(K.ARGMAX, (3, 5), 1, E.F32), NO_WORKSPACE)
    with pytest.raises(InvalidProblem, match="ArgReducePlan: y has typestr"):
        arg.run(ArgReduceArgs(to_device(x), y))
    back = ReduceBackwardPlan.select(ReduceBackwardDescriptor(K.MAX, (3, 5), 1, E.F32))
    dx = to_device(poisoned((3, 5), E.F32))
    dy = to_device(random_values((3, 1), E.F32, rng))
    ws = to_device(np.zeros(max(back.workspace_size, 1), np.uint8))
    with pytest.raises(InvalidProblem, match="ReduceBackwardPlan: x is None"):
        back.run(ReduceBackwardArgs(dy, dx), workspace=ws)
    with pytest.raises(InvalidProblem, match="ReduceBackwardPlan: y is None"):
        back.run(ReduceBackwardArgs(dy, dx, to_device(x)), workspace=ws)
    if back.workspace_size:
        with pytest.raises(WorkspaceTooSmall):
            back.run(ReduceBackwardArgs(dy, dx, to_device(x), y),
                     workspace=to_device(np.zeros(back.workspace_size - 1, np.uint8)))
        with pytest.raises(WorkspaceTooSmall):  # missing: before anything is launched
            back.run(ReduceBackwardArgs(dy, dx, to_device(x), y))
    if SIMULATOR:  # a writable self-overlapping output (stride 0)
        overlapping = np.lib.stride_tricks.as_strided(np.zeros(5, np.float32), (3, 5), (0, 4))
        with pytest.raises(InvalidProblem, match="dx strides"):
            back.run(ReduceBackwardArgs(dy, overlapping, to_device(x), y), workspace=ws)
    assert np.all(np.isnan(to_host(dx)))


# -- GPU: torch forward and autograd, > 2^31 elements -------------------------------------

TORCH_FORWARD = {
    K.SUM: lambda t, a: t.sum(a, keepdim=True),
    K.MEAN: lambda t, a: t.mean(a, keepdim=True),
    K.MAX: lambda t, a: t.amax(a, keepdim=True),
    K.MIN: lambda t, a: t.amin(a, keepdim=True),
    K.PROD: lambda t, a: t.prod(a, keepdim=True),
    K.NORM2: lambda t, a: t.norm(dim=a, keepdim=True),
    K.LOG_SUM_EXP: lambda t, a: t.logsumexp(a, keepdim=True),
    K.VAR: lambda t, a: t.var(a, keepdim=True),
    K.STD: lambda t, a: t.std(a, keepdim=True),
}
TORCH_DTYPES = {E.F16: "float16", E.BF16: "bfloat16", E.F32: "float32", E.F64: "float64"}


@pytest.mark.gpu
@pytest.mark.parametrize("element", FLOAT_ELEMENTS, ids=lambda e: e.name)
@pytest.mark.parametrize("kind", REDUCE_KINDS, ids=lambda k: k.name)
@pytest.mark.parametrize("shape,axis", [((64, 3000), 1), ((3000, 64), 0), ((5, 300, 7), 1),
                                        ((200_000,), 0), ((3000, 64), 1)], ids=str)
def test_gpu_forward_and_autograd_match_torch(kind, element, shape, axis):
    torch = torch_or_skip()
    dtype = getattr(torch, TORCH_DTYPES[element])
    # Prod: factors near 1 so that the product of 300 stays inside f16 range (0.8..1.25
    # reached 1.8e5 > 65504 once: inf, correctly, against a float64 reference)
    low, high = (0.9, 1.1) if kind is K.PROD else (-2.0, 2.0)
    if kind is K.PROD:
        shape = tuple(min(s, 300) for s in shape)
    x = (torch.rand(shape, device="cuda", dtype=torch.float64) * (high - low) + low).to(dtype)
    if kind in (K.MAX, K.MIN):
        x = (x * 4).round() / 4  # ties
    x.requires_grad_(True)
    ref = TORCH_FORWARD[kind](x, axis)
    desc = ReduceDescriptor(kind, shape, axis, element)
    plan = ReducePlan.select(desc)
    y = torch.full(desc.output_shape(), float("nan"), device="cuda", dtype=dtype)
    ws = torch.empty(plan.workspace_size, device="cuda", dtype=torch.uint8)
    plan.run(ReduceArgs(x, y), workspace=ws)
    x64 = x.detach().double().cpu().numpy()
    expected64 = reference(kind, x64, axis)
    got = y.double().cpu().numpy()
    check_forward(got, expected64, kind, element, x64, axis, f"{kind.name} vs numpy")
    # torch itself, where it computes in the same precision (its f16/bf16 logsumexp, var,
    # std, norm and prod keep half-precision intermediates, so there it is the less
    # accurate side and the float64 check above is the one that counts)
    if element in (E.F32, E.F64) or kind in (K.SUM, K.MEAN, K.MAX, K.MIN):
        check_forward(got, ref.detach().double().cpu().numpy(), kind, element, x64, axis,
                      f"{kind.name} vs torch")
    dy = torch.rand_like(ref) * 2 - 1
    (ref * dy).sum().backward()
    # math on the same saved tensors in float64 (every element kind) ...
    expected_dx = backward_reference(kind, dy.double().cpu().numpy(), x64,
                                     ref.detach().double().cpu().numpy(), axis)
    bplan = ReduceBackwardPlan.select(ReduceBackwardDescriptor(kind, shape, axis, element))
    dx = torch.full(shape, float("nan"), device="cuda", dtype=dtype)
    bws = torch.empty(bplan.workspace_size, device="cuda", dtype=torch.uint8)
    bplan.run(ReduceBackwardArgs(dy, dx, x, ref.detach()), workspace=bws)
    got_dx = dx.double().cpu().numpy()
    check_backward(got_dx, expected_dx, element, f"{kind.name} backward vs float64")
    # ... and torch.autograd where it computes in the same precision (its f16/bf16 gradients
    # round intermediates such as x - y to half, so they are the less accurate side)
    if element in (E.F32, E.F64):
        check_backward(got_dx, x.grad.double().cpu().numpy(), element,
                       f"{kind.name} backward vs torch.autograd")


@pytest.mark.gpu
@pytest.mark.parametrize("kind", [K.ARGMAX, K.ARGMIN], ids=lambda k: k.name)
def test_gpu_arg_reduce_matches_torch(kind):
    torch = torch_or_skip()
    for shape, axis in [((64, 3000), 1), ((3000, 64), 0), ((300_000,), 0)]:
        x = torch.randint(-50, 50, shape, device="cuda").float()
        x.view(-1)[::997] = float("nan")
        desc = ArgReduceDescriptor(kind, shape, axis, E.F32)
        plan = ArgReducePlan.select(desc)
        y = torch.full(desc.output_shape(), -7, device="cuda", dtype=torch.int64)
        ws = torch.empty(plan.workspace_size, device="cuda", dtype=torch.uint8)
        plan.run(ArgReduceArgs(x, y), workspace=ws)
        fn = torch.argmax if kind is K.ARGMAX else torch.argmin
        assert torch.equal(y, fn(x, dim=axis, keepdim=True))


@pytest.mark.gpu
def test_gpu_more_than_2_31_elements():
    torch = torch_or_skip()
    n = (1 << 31) + 4099
    x = torch.empty(n, device="cuda", dtype=torch.float32).uniform_(-1, 1)
    x[n - 3] = 7.0  # the max lies past 2^31
    for kind in (K.SUM, K.MAX):
        desc = ReduceDescriptor(kind, (n,), 0, E.F32)
        plan = ReducePlan.select(desc)
        y = torch.full((1,), float("nan"), device="cuda", dtype=torch.float32)
        ws = torch.empty(plan.workspace_size, device="cuda", dtype=torch.uint8)
        plan.run(ReduceArgs(x, y), workspace=ws)
        if kind is K.SUM:
            expected = sum(float(c.double().sum()) for c in x.split(1 << 28))
            scale = sum(float(c.double().abs().sum()) for c in x.split(1 << 28))
            assert abs(float(y) - expected) <= 1e-6 * abs(expected) + 1e-6 * scale
        else:
            assert float(y) == 7.0
    arg = ArgReducePlan.select(ArgReduceDescriptor(K.ARGMAX, (n,), 0, E.F32))
    idx = torch.full((1,), -1, device="cuda", dtype=torch.int64)
    arg.run(ArgReduceArgs(x, idx), workspace=torch.empty(arg.workspace_size, device="cuda",
                                                         dtype=torch.uint8))
    assert int(idx) == n - 3
    # the gradient of a sum over > 2^31 elements writes every element
    back = ReduceBackwardPlan.select(ReduceBackwardDescriptor(K.MEAN, (n,), 0, E.F32), NO_WORKSPACE)
    dy = torch.full((1,), 3.0, device="cuda", dtype=torch.float32)
    back.run(ReduceBackwardArgs(dy, x))  # dx = x's memory (x no longer needed)
    assert float(x[n - 1]) == float(torch.tensor(3.0 / n, dtype=torch.float32))
    assert float(x[0]) == float(x[n - 1])
    # the broadcast kernel, rows and columns (units past 2^29, elements past 2^31)
    for shape, axis in (((2, (1 << 30) + 8), 1), (((1 << 21) + 1, 1024), 0)):
        back = ReduceBackwardPlan.select(ReduceBackwardDescriptor(K.MEAN, shape, axis, E.F32),
                                         NO_WORKSPACE)
        dy_shape = tuple(1 if a == axis else s for a, s in enumerate(shape))
        dy = torch.randn(dy_shape, device="cuda", dtype=torch.float32)
        dx = x[:shape[0] * shape[1]].view(shape)
        dx.fill_(float("nan"))
        back.run(ReduceBackwardArgs(dy, dx))
        assert next(iter(back.bound_launches().values()))[1][0] == "broadcast"
        expected = (dy.double() / shape[axis]).float()
        for index in (0, -1):
            got = dx[index][-4:] if axis == 1 else dx[index]
            want = expected[index].expand(4) if axis == 1 else expected[0]
            assert torch.equal(got, want), (shape, index)
        assert not torch.isnan(dx).any(), shape


@pytest.mark.gpu
def test_gpu_col_ties_more_than_2_31_elements():
    """The f32 Max gradient of [2^25 + 1000, 64] along axis 0 (2^31 + 64,000 elements)
    through the column tie count after dx (mask indices past 2^25, words past 2^31):
    column 3's maximum tied in row 5 and in the last row, column 60's in the
    second-to-last row only, the others as drawn; the whole of dx against torch's (x ==
    y) * dy / count."""
    torch = torch_or_skip()
    rows = (1 << 25) + 1000
    x = torch.rand((rows, 64), device="cuda", dtype=torch.float32)
    x[[5, rows - 1], 3] = 2.0
    x[rows - 2, 60] = 3.0
    y = x.amax(0, keepdim=True)
    dy = torch.rand_like(y) + 0.5
    plan = ReduceBackwardPlan.select(ReduceBackwardDescriptor(K.MAX, (rows, 64), 0, E.F32))
    ws = torch.empty(plan.workspace_size, device="cuda", dtype=torch.uint8).fill_(0xA5)
    dx = torch.full_like(x, float("nan"))
    plan.run(ReduceBackwardArgs(dy, dx, x, y), workspace=ws)
    stat, (access, _) = next(iter(plan.bound_launches().values()))
    assert access == "cols" and type(stat).__name__ == "_TieCount"
    tied = x == y
    del x
    count = tied.sum(0, keepdim=True)
    assert int(count[0, 3]) == 2 and int(count[0, 60]) == 1
    expected = torch.where(tied, dy / count, 0.0)
    del tied
    assert torch.equal(dx, expected)


@pytest.mark.gpu
def test_gpu_row_sync_more_than_2_31_elements():
    """The Var gradient of 2 bf16 rows too long for the hold kernel (the statistic pass,
    then the split word rows), 2^31 + 4096 elements in all: spot elements at both ends of
    each row (row 1 lies past 2^31) against float64."""
    torch = torch_or_skip()
    n = (1 << 30) + 2048
    x = torch.empty((2, n), device="cuda", dtype=torch.bfloat16).uniform_(-1, 1)
    x[1, n - 5] = 3.0
    dy = torch.tensor([[2.0], [-1.0]], device="cuda", dtype=torch.bfloat16)
    y = torch.ones((2, 1), device="cuda", dtype=torch.bfloat16)  # not read by Var
    plan = ReduceBackwardPlan.select(ReduceBackwardDescriptor(K.VAR, (2, n), 1, E.BF16))
    ws = torch.empty(plan.workspace_size, device="cuda", dtype=torch.uint8)
    dx = torch.full_like(x, float("nan"))
    plan.run(ReduceBackwardArgs(dy, dx, x, y), workspace=ws)
    assert plan.choice == "rows"
    for r in range(2):
        mean = sum(float(c.double().sum()) for c in x[r].split(1 << 28)) / n
        coef = float(dy[r, 0]) * 2.0 / (n - 1)
        for i in (0, 1, n // 2, n - 5, n - 1):
            expected = coef * (float(x[r, i]) - mean)
            assert abs(float(dx[r, i]) - expected) <= 2.0**-7 * abs(expected) + 1e-3 * abs(coef)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", [K.VAR, K.MAX], ids=lambda k: k.name)
def test_gpu_row_hold_more_than_2_31_elements(kind):
    """The bf16 Var and Max gradients through the hold kernel (126 chunks a row): 524 rows
    of 4,100,096 elements (251 parts, the last partial: chunks of two, twice a row's
    within the 528 blocks an H100 / H200 holds at once), 2^31 + 966,656
    elements in all; rows 0, 1 and 523 (which crosses 2^31) against float64 at both ends
    and the middle, and (Max) at the row's maximum, tied three times in the last row."""
    torch = torch_or_skip()
    rows, n = 524, 4_100_096
    x = torch.empty((rows, n), device="cuda", dtype=torch.bfloat16).uniform_(-1, 1)
    x[rows - 1, [n - 5, n // 3, 7]] = 3.0
    dy = torch.randn((rows, 1), device="cuda", dtype=torch.bfloat16)
    if kind is K.MAX:
        y = x.amax(1, keepdim=True)
    else:
        y = torch.ones((rows, 1), device="cuda", dtype=torch.bfloat16)  # not read by Var
    plan = ReduceBackwardPlan.select(ReduceBackwardDescriptor(kind, (rows, n), 1, E.BF16))
    plan.row_hold = True  # fewer than HOLD_ROWS_IN_FLIGHT rows in flight: forced
    ws = torch.empty(plan.workspace_size, device="cuda", dtype=torch.uint8)
    dx = torch.full_like(x, float("nan"))
    plan.run(ReduceBackwardArgs(dy, dx, x, y), workspace=ws)
    access, launch = next(iter(plan.bound_launches().values()))[1]
    assert access == "sync", (access, plan.hold_layout, _hold_resident(kind, E.BF16))
    for r in (0, 1, rows - 1):
        if kind is K.MAX:
            top = int(x[r].argmax())
            ties = int((x[r] == y[r, 0]).sum())
            coef = float(dy[r, 0]) / ties
            for i in (0, 1, n // 2, n - 5, n - 1, top):
                expected = coef if float(x[r, i]) == float(y[r, 0]) else 0.0
                assert abs(float(dx[r, i]) - expected) <= 2.0**-8 * abs(expected)
            continue
        mean = float(x[r].double().mean())
        coef = float(dy[r, 0]) * 2.0 / (n - 1)
        for i in (0, 1, n // 2, n - 5, n - 1):
            expected = coef * (float(x[r, i]) - mean)
            assert abs(float(dx[r, i]) - expected) <= 2.0**-7 * abs(expected) + 1e-3 * abs(coef)
    if kind is K.MAX:
        assert int((dx[rows - 1] != 0).sum()) == 3
    assert not torch.isnan(dx[-2:]).any()


@pytest.mark.gpu
@pytest.mark.parametrize("kind", [ReduceKind.SUM, ReduceKind.VAR, ReduceKind.MAX],
                         ids=lambda k: k.name)
@pytest.mark.parametrize("axis", [0, 1])
def test_torch_fast_path_matches_the_checked_path(kind, axis):
    """After the first run a torch layout goes through the plan's LayoutMemo (no array
    checks): fresh tensors of the same layout must give bit-identical results, forward and
    gradient; a wrong dtype must still be rejected."""
    torch = torch_or_skip()
    shape = (33, 70)
    out_shape = tuple(1 if a == axis else n for a, n in enumerate(shape))
    element = ElementKind.BF16
    forward = ReducePlan.select(ReduceDescriptor(kind, shape, axis, element), NO_WORKSPACE)
    backward = ReduceBackwardPlan.select(ReduceBackwardDescriptor(kind, shape, axis, element),
                                         NO_WORKSPACE)
    x = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn(out_shape, device="cuda", dtype=torch.bfloat16)
    results = []
    for _ in range(3):  # the first call checks, the others take the memo
        y = torch.full(out_shape, float("nan"), device="cuda", dtype=torch.bfloat16)
        dx = torch.full(shape, float("nan"), device="cuda", dtype=torch.bfloat16)
        x_copy, dy_copy = x.clone(), dy.clone()
        forward.run(ReduceArgs(x_copy, y))
        backward.run(ReduceBackwardArgs(dy_copy, dx, x_copy, y))
        results.append((y, dx))
    for y, dx in results[1:]:
        assert torch.equal(y, results[0][0]) and torch.equal(dx, results[0][1])
    with pytest.raises(InvalidProblem, match="typestr"):
        forward.run(ReduceArgs(x.float(), results[0][0]))


def _prod_zero_layouts():
    """name -> (base shape, index, reduce axis, the layouts the plan may pick)."""
    return {
        "rows": ((6, 64), (slice(None),), 1, ("reg", "rows", "broadcast")),
        "rows_odd": ((6, 37), (slice(None),), 1, ("rows", "generic")),
        "cols": ((40, 8), (slice(None),), 0, ("cols", "broadcast")),
        "middle": ((3, 12, 4), (slice(None),), 1, ("generic", "cols")),
        "strided": ((12, 10), (slice(None), slice(None, None, 2)), 0, ("generic",)),
        # lines of >= 1024 elements: the fix-up's block per line
        "long_rows": ((5, 1100), (slice(None),), 1, ("reg", "rows", "broadcast", "generic")),
        "long_cols": ((1100, 5), (slice(None),), 0, ("cols", "generic")),
    }


@IEEE_SPECIALS
@pytest.mark.parametrize("element", [E.F32, E.BF16] if SIMULATOR else FLOAT_ELEMENTS,
                         ids=lambda e: e.name)
@pytest.mark.parametrize("layout", list(_prod_zero_layouts()))
def test_prod_backward_zeros_exact(layout, element, rng):
    """Prod's gradient where lines hold no, one, two and all zeros (torch: one zero gets
    the product of the others there and 0 elsewhere; two or more 0 everywhere), in each
    layout the plan picks for these shapes (``plan.choice``), with a NaN dy on a zero
    line, against float64; bit-identical on a rerun, padding untouched."""
    base_shape, index, axis, layouts = _prod_zero_layouts()[layout]
    if element is E.F64:  # f64 has no word kernels: every layout takes the generic one
        layouts = ("generic",)
    # long lines draw closer to 1 so that f16's range holds their products
    low, high = (0.8, 1.25) if max(base_shape) < 1024 else (0.98, 1.02)
    base = rng.uniform(low, high, size=base_shape) * rng.choice([-1.0, 1.0], size=base_shape)
    view = base[index]
    lines = np.moveaxis(view, axis, -1).reshape(-1, view.shape[axis])
    lines[1, 3] = 0.0  # one zero
    lines[2, [0, 5]] = -0.0, 0.0  # two
    lines[3, :] = 0.0  # all
    lines[4, -1] = 0.0  # one zero, last
    np.moveaxis(view, axis, -1)[...] = lines.reshape(np.moveaxis(view, axis, -1).shape)
    base[index] = view
    base = to_storage(base, element)
    shape = view.shape
    x_host = np.ascontiguousarray(base[index])
    y = saved_output(K.PROD, x_host, axis, element)
    dy = random_values(y.shape, element, rng)
    dy_lines = np.moveaxis(dy, axis, -1).reshape(-1)
    dy_lines[2] = to_storage(np.array([np.nan]), element)[0]
    np.moveaxis(dy, axis, -1)[...] = dy_lines.reshape(np.moveaxis(dy, axis, -1).shape)
    expected = backward_reference(K.PROD, from_storage(dy, element),
                                  from_storage(x_host, element), from_storage(y, element), axis)
    assert np.isfinite(expected[np.isfinite(from_storage(dy, element)).repeat(
        shape[axis], axis)]).all()
    results = []
    for _ in range(2):
        dx_base = poisoned(base_shape, element)
        dx = device_view(dx_base, index, shape, element)
        plan = ReduceBackwardPlan.select(ReduceBackwardDescriptor(K.PROD, shape, axis, element),
                                         NO_WORKSPACE)
        plan.run(ReduceBackwardArgs(to_device(dy), dx, device_view(base, index, shape, element),
                                    to_device(y)))
        what = f"Prod zeros {element.name} {layout} ({plan.choice})"
        assert plan.choice in layouts, what
        got = storage_of(dx, element)
        check_backward(from_storage(got, element), expected, element, what)
        if SIMULATOR:
            written = np.zeros(base_shape, bool)
            written[index] = True
            np.testing.assert_array_equal(dx_base[~written],
                                          poisoned(base_shape, element)[~written], what)
        results.append(got.tobytes())
    assert results[0] == results[1], f"{layout}: not deterministic"


@pytest.mark.parametrize("plan_kind", ["forward", "arg", "backward"])
def test_workspace_contract(plan_kind, rng):
    """Upstream's contract: ``select`` sizes ``workspace_size`` for the path it chose
    within ``max_workspace_bytes``; ``run`` with no workspace or a smaller one raises
    WorkspaceTooSmall(needed, got) before anything is written; ``max_workspace_bytes=0``
    selects the single-pass path (workspace_size 0), which then runs without one."""
    shape = (1, 4096)  # one long line: the forward splits it
    x = random_values(shape, E.F32, rng)
    if plan_kind == "forward":
        desc, plan_type = ReduceDescriptor(K.SUM, shape, 1, E.F32), ReducePlan
        out_shape, out_element = (1, 1), E.F32
    elif plan_kind == "arg":
        desc, plan_type = ArgReduceDescriptor(K.ARGMAX, shape, 1, E.F32), ArgReducePlan
        out_shape, out_element = (1, 1), E.I64
    else:
        desc, plan_type = ReduceBackwardDescriptor(K.VAR, shape, 1, E.F32), ReduceBackwardPlan
        out_shape, out_element = shape, E.F32

    def args(out):
        if plan_kind == "forward":
            return ReduceArgs(to_device(x), out)
        if plan_kind == "arg":
            return ArgReduceArgs(to_device(x), out)
        y = saved_output(K.VAR, x, 1, E.F32)
        return ReduceBackwardArgs(to_device(random_values((1, 1), E.F32, rng)), out,
                                  to_device(x), to_device(y))

    plan = plan_type.select(desc)
    assert plan.workspace_size > 0
    for workspace in (None, to_device(np.zeros(plan.workspace_size - 1, np.uint8))):
        out = to_device(poisoned(out_shape, out_element))
        with pytest.raises(WorkspaceTooSmall) as raised:
            plan.run(args(out), workspace=workspace)
        assert raised.value.needed == plan.workspace_size
        np.testing.assert_array_equal(host(out).view(np.uint8),
                                      poisoned(out_shape, out_element).view(np.uint8))
    plain = plan_type.select(desc, NO_WORKSPACE)
    assert plain.workspace_size == 0
    out = to_device(poisoned(out_shape, out_element))
    plain.run(args(out))
    assert not np.isnan(host(out).astype(np.float64)).any()
    limited = plan_type.select(desc, PlanPreference(max_workspace_bytes=plan.workspace_size))
    assert 0 < limited.workspace_size <= plan.workspace_size
