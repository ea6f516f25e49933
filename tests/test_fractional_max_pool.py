"""FractionalMaxPool2dPlan / FractionalMaxPool3dPlan against plain NumPy float64 references
(and, on the GPU, against torch.nn.functional.fractional_max_pool{2,3}d and autograd)."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from conftest import FLOAT_ELEMENTS, SIMULATOR, TOLERANCE, torch_or_skip

from baracuda_numba.errors import InvalidProblem, Unsupported
from baracuda_numba.plans.fractional_max_pool import (
    FractionalMaxPool2dBwArgs,
    FractionalMaxPool2dDescriptor,
    FractionalMaxPool2dFwArgs,
    FractionalMaxPool2dPlan,
    FractionalMaxPool3dBwArgs,
    FractionalMaxPool3dDescriptor,
    FractionalMaxPool3dFwArgs,
    FractionalMaxPool3dPlan,
    FractionalPlacement,
)
from baracuda_numba.testing import (
    from_storage,
    poisoned,
    random_values,
    to_device,
    to_host,
    to_storage,
)
from baracuda_numba.types import ElementKind

BARACUDA = FractionalPlacement.BARACUDA
TORCH = FractionalPlacement.TORCH

# -- NumPy references ------------------------------------------------------------------------


def ref_starts(out: int, extent: int, window: int, alpha: float,
               placement: FractionalPlacement, element: ElementKind) -> list[int]:
    """Window starts on one axis, exactly as the docs define them."""
    alpha = float(np.float32(alpha))
    if not alpha >= 0.0:
        alpha = 0.0
    if alpha >= 1.0:
        alpha = float(np.nextafter(np.float32(1.0), np.float32(0.0)))
    max_start = extent - window
    if placement is BARACUDA:
        if max_start <= 0:
            return [0] * out
        if out == 1:
            return [math.floor(Fraction(alpha) * max_start)]
        return [min(math.floor(Fraction(o * max_start, out - 1) + Fraction(alpha)), max_start)
                for o in range(out)]
    acc = np.float64 if element is ElementKind.F64 else np.float32
    starts = []
    for o in range(out):
        if o >= out - 1:
            starts.append(max_start)
            continue
        step = acc(max_start) / acc(out - 1)
        sample = acc(alpha)
        start = int(acc(acc(o) + sample) * step) - int(sample * step)
        starts.append(max(0, min(start, max_start)))
    return starts


def ref_forward(x64: np.ndarray, windows: tuple[int, ...], out_shape: tuple[int, ...],
                samples: np.ndarray, placement: FractionalPlacement,
                element: ElementKind) -> tuple[np.ndarray, np.ndarray]:
    """(flat index into x of each output's max, indices) for NCHW / NCDHW ``x64``: first
    maximum in row-major window order, first NaN wins."""
    batch, channels = x64.shape[:2]
    spatial_in = x64.shape[2:]
    plane = int(np.prod(spatial_in))
    chosen = np.zeros((batch, channels) + out_shape, dtype=np.int64)
    for n in range(batch):
        for c in range(channels):
            starts = [ref_starts(out_shape[a], spatial_in[a], windows[a], samples[n, c, a],
                                 placement, element) for a in range(len(out_shape))]
            for o in np.ndindex(*out_shape):
                box = tuple(slice(starts[a][o[a]], starts[a][o[a]] + windows[a])
                            for a in range(len(o)))
                values = x64[(n, c) + box].ravel()
                coords = np.stack(np.meshgrid(*[np.arange(s.start, s.stop) for s in box],
                                              indexing="ij"), -1).reshape(-1, len(o))
                nan = np.flatnonzero(np.isnan(values))
                pick = nan[0] if nan.size else int(np.argmax(values))  # argmax: first max
                local = int(np.ravel_multi_index(tuple(coords[pick]), spatial_in))
                chosen[(n, c) + o] = (n * channels + c) * plane + local
    return chosen


def ref_backward(dy64: np.ndarray, indices: np.ndarray, in_shape: tuple[int, ...]) -> np.ndarray:
    """Scatter-add reference: dx[i] = sum of dy[o] with indices[o] == i."""
    dx = np.zeros(int(np.prod(in_shape)), dtype=np.float64)
    np.add.at(dx, indices.ravel(), dy64.ravel())
    return dx.reshape(in_shape)


# -- helpers ---------------------------------------------------------------------------------


def make_plan(shape_in, windows, shape_out, element, placement=BARACUDA):
    batch, channels = shape_in[:2]
    if len(shape_in) == 4:
        desc = FractionalMaxPool2dDescriptor.new(batch, channels, *shape_in[2:], *windows,
                                                 *shape_out, element)
        plan = FractionalMaxPool2dPlan.select(desc.with_placement(placement))
        return plan, FractionalMaxPool2dFwArgs, FractionalMaxPool2dBwArgs
    desc = FractionalMaxPool3dDescriptor.new(batch, channels, *shape_in[2:], *windows,
                                             *shape_out, element)
    plan = FractionalMaxPool3dPlan.select(desc.with_placement(placement))
    return plan, FractionalMaxPool3dFwArgs, FractionalMaxPool3dBwArgs


PATH_NAMES = ("fast", "fast-tiles", "fast-alt", "general")


def set_path(plan, path):
    """``fast``: the plan's default fast kernels (the row-caching forward for the
    FAST_WINDOWS, else the looped window; the listed tiled backward where its mask fits,
    else the leader scatter; f64 has no fast kernels: the general ones on every path,
    which must give the same results); ``fast-tiles``: the
    tiled backward with tiles of two rows (many tiles per plane, candidate boxes
    straddling tiles); ``fast-alt``: the looped forward window and the leader-scatter
    backward; ``general``: the any-stride 64-bit kernels (gather backward), forced on
    contiguous arrays. The tiled backward applies where the candidate box fits its mask
    (else the leader scatter runs: test_tile_choice_respects_the_shared_memory)."""
    assert plan.fast  # every test shape qualifies for the fast kernels
    if path == "fast-tiles":
        plan.tile_elems = 2 * plan.axes[2][0]
    elif path == "fast-alt":
        plan.forward_walk = "looped"
        plan.tiled_backward = False
    elif path == "general":
        plan.fast = False
    return plan


def transposed_device(host: np.ndarray):
    """A device view of ``host`` with its last two axes swapped (non-contiguous)."""
    if SIMULATOR:
        return to_device(host).transpose((0, 1, 3, 2))
    torch = torch_or_skip()
    return torch.from_numpy(host).cuda().transpose(2, 3)


def samples_for(rng, batch, channels, rank):
    return rng.random((batch, channels, rank), dtype=np.float32)


def run_and_check(rng, shape_in, windows, shape_out, element, placement=BARACUDA,
                  x_host=None, samples=None, rows_per_thread=None, path="fast"):
    """Forward + backward on fresh inputs against the references; returns the device
    arrays (for further checks). ``rows_per_thread`` overrides the plan's run length (3
    makes runs straddle depth and plane boundaries); ``path`` picks the kernels (see
    ``set_path``)."""
    plan, fw_args, bw_args = make_plan(shape_in, windows, shape_out, element, placement)
    set_path(plan, path)
    if rows_per_thread is not None:
        plan.rows_per_thread = rows_per_thread
    batch, channels = shape_in[:2]
    full_out = (batch, channels) + tuple(shape_out)
    if x_host is None:
        x_host = random_values(shape_in, element, rng)
    if samples is None:
        samples = samples_for(rng, batch, channels, len(shape_out))
    x, s = to_device(x_host), to_device(samples)
    y, idx = to_device(poisoned(full_out, element)), to_device(poisoned(full_out, ElementKind.I64))
    plan.run_fw(fw_args(x, y, idx, s))
    x64 = from_storage(x_host, element)
    expected_idx = ref_forward(x64, windows, tuple(shape_out), samples, placement, element)
    got_idx = to_host(idx)
    np.testing.assert_array_equal(got_idx, expected_idx, err_msg="indices")
    got_y = to_host(y)
    # y is x at the saved index, bit for bit
    np.testing.assert_array_equal(got_y.view(np.uint8),
                                  x_host.reshape(-1)[expected_idx].view(np.uint8),
                                  err_msg="y")
    dy_host = random_values(full_out, element, rng)
    dx = to_device(poisoned(shape_in, element))  # never zeroed: the plan writes every element
    plan.run_bw(bw_args(to_device(dy_host), idx, dx))
    expected_dx = ref_backward(from_storage(dy_host, element), expected_idx, shape_in)
    rtol, atol = TOLERANCE[element]
    got_dx = from_storage(to_host(dx), element)
    # Each dx is a sum of at most prod(ceil(k/stride)) dy values: a few roundings.
    np.testing.assert_allclose(got_dx, expected_dx, rtol=2 * rtol, atol=2 * atol,
                               err_msg="dx")
    return plan, x, y, idx, dx


SIM_CASES = [
    ((1, 2, 7, 9), (2, 3), (5, 5)),
    ((2, 1, 5, 6, 7), (2, 2, 3), (3, 4, 3)),
    ((1, 1, 3, 70), (2, 3), (2, 47)),  # wider than the simulator's grid: x grid-stride
    ((1, 1, 6, 13), (2, 6), (3, 5)),  # window rows longer than one 4-wide pass
    ((1, 1, 5, 6), (2, 2), (9, 11)),  # more outputs than start positions: long ranges
    ((1, 2, 8, 9), (3, 3), (5, 6)),  # the row-caching fast windows (kernels.FAST_WINDOWS)
    ((1, 1, 5, 6, 7), (3, 3, 3), (3, 4, 4)),
]
GPU_CASES = SIM_CASES + [
    ((2, 3, 33, 257), (3, 3), (23, 181)),
    ((2, 2, 31, 32), (2, 2), (30, 31)),
    ((1, 3, 9, 17, 33), (3, 2, 3), (5, 11, 21)),
    ((1, 2, 300, 40), (3, 2), (1, 39)),  # out == 1 on one axis; tiles over columns
]


PATHS = pytest.mark.parametrize("path", PATH_NAMES)


@PATHS
@pytest.mark.parametrize("rows", (None, 3), ids=("rows-default", "rows-3"))
@pytest.mark.parametrize("element", FLOAT_ELEMENTS, ids=lambda e: e.name)
@pytest.mark.parametrize("case", SIM_CASES if SIMULATOR else GPU_CASES,
                         ids=lambda c: "x".join(map(str, c[0])))
def test_forward_backward_match_reference(rng, element, case, rows, path):
    run_and_check(rng, *case, element, rows_per_thread=rows, path=path)


@PATHS
@pytest.mark.parametrize("rows", (None, 3), ids=("rows-default", "rows-3"))
@pytest.mark.parametrize("element", (ElementKind.F32, ElementKind.F64), ids=lambda e: e.name)
@pytest.mark.parametrize("case", SIM_CASES[:2] if SIMULATOR else GPU_CASES,
                         ids=lambda c: "x".join(map(str, c[0])))
def test_torch_placement_matches_reference(rng, element, case, rows, path):
    run_and_check(rng, *case, element, placement=TORCH, rows_per_thread=rows, path=path)


@PATHS
@pytest.mark.parametrize("rows", (None, 3), ids=("rows-default", "rows-3"))
@pytest.mark.parametrize("element", (ElementKind.F32, ElementKind.BF16), ids=lambda e: e.name)
def test_ties_nan_and_inf(rng, element, rows, path):
    shape_in, windows, shape_out = (1, 2, 8, 9), (3, 2), (5, 6)
    # few distinct values: many ties; sprinkle NaN and +-inf
    values = rng.integers(-2, 3, size=shape_in).astype(np.float64)
    flat = values.reshape(-1)
    flat[rng.choice(flat.size, 6, replace=False)] = np.nan
    flat[rng.choice(flat.size, 6, replace=False)] = np.inf
    flat[rng.choice(flat.size, 6, replace=False)] = -np.inf
    run_and_check(rng, shape_in, windows, shape_out, element,
                  x_host=to_storage(values, element), rows_per_thread=rows, path=path)


@PATHS
def test_all_equal_and_all_minus_inf_pick_the_first(rng, path):
    shape_in, windows, shape_out = (1, 1, 5, 5), (2, 3), (3, 2)
    for fill in (1.5, -np.inf):
        run_and_check(rng, shape_in, windows, shape_out, ElementKind.F32,
                      x_host=np.full(shape_in, fill, dtype=np.float32), path=path)


@PATHS
def test_window_equal_to_input_and_out_one(rng, path):
    # one window: all; then max_start = 0 with out > 1
    run_and_check(rng, (1, 2, 4, 5), (4, 5), (1, 1), ElementKind.F32, path=path)
    run_and_check(rng, (1, 1, 4, 6), (4, 2), (3, 1), ElementKind.F64, path=path)
    run_and_check(rng, (1, 2, 3, 9, 7), (2, 3, 3), (1, 4, 1), ElementKind.F32, path=path)


@PATHS
def test_samples_at_the_edges(rng, path):
    """0, the largest f32 below 1, and out-of-range samples (clamped into [0, 1))."""
    shape_in, windows, shape_out = (1, 4, 9, 11), (2, 3), (6, 5)
    samples = np.array([[[0.0, np.nextafter(np.float32(1), np.float32(0))],
                         [1.0, 7.5], [-3.0, np.nan], [0.5, 0.25]]], dtype=np.float32)
    run_and_check(rng, shape_in, windows, shape_out, ElementKind.F32, samples=samples,
                  path=path)


def test_magic_division_is_exact(rng):
    """The fast kernels' multiply-shift division equals ``//`` for every numerator below
    2^31 (checked at the edges: 0, multiples of the divisor and their neighbours, 2^31-1)
    and the product stays below 2^63."""
    from baracuda_numba.kernels.fractional_max_pool import magic_divisor

    limit = (1 << 31) - 1
    divisors = list(range(1, 300)) + [int(v) for v in rng.integers(300, limit, 300)] + [
        limit, limit - 1, 1 << 30, (1 << 30) + 1, 46341, 65535, 65536, 65537]
    for divisor in divisors:
        multiplier, shift = magic_divisor(divisor)
        assert 0 < multiplier < (1 << 32)
        values = {0, 1, limit, limit - 1, int(rng.integers(0, limit))}
        for q in (1, 2, 3, limit // divisor, limit // divisor - 1,
                  int(rng.integers(0, limit // divisor + 1))):
            values.update(v for v in (q * divisor - 1, q * divisor, q * divisor + 1)
                          if 0 <= v <= limit)
        for value in values:
            assert value * multiplier < (1 << 63)
            assert (value * multiplier) >> shift == value // divisor, (divisor, value)


@pytest.mark.simulator
def test_fast_start_equals_the_general_start(rng):
    """baracuda_threshold + baracuda_start_fast (the fast kernels' placement) equal
    baracuda_window_start, and candidate_outputs_fast equals candidate_outputs (the device
    helpers run in a one-thread simulator kernel: cuda.fma exists only inside kernels)."""
    from numba import cuda

    from baracuda_numba.kernels.fractional_max_pool import (
        baracuda_start_fast,
        baracuda_threshold,
        baracuda_window_start,
        candidate_outputs,
        candidate_outputs_fast,
        magic_divisor,
    )

    @cuda.jit
    def compare(cases, alphas, points, got):
        for i in range(cases.shape[0]):
            extent, window, out = cases[i, 0], cases[i, 1], cases[i, 2]
            max_start = extent - window
            threshold = baracuda_threshold(alphas[i], max_start, out - 1)
            for j in range(points.shape[1]):
                o = points[i, j] % out
                fast = baracuda_start_fast(o, max_start, out - 1, threshold, cases[i, 3],
                                           cases[i, 4])
                got[i, j, 0] = fast - baracuda_window_start(o, out, extent, window,
                                                            alphas[i])
                coord = points[i, j] % extent
                first, end = candidate_outputs_fast(coord, extent, window, out, 0,
                                                    cases[i, 5], cases[i, 6])
                first_ref, end_ref = candidate_outputs(coord, extent, window, out, 0)
                got[i, j, 1] = abs(first - first_ref) + abs(end - end_ref)

    rows = []
    for trial in range(200):
        extent = int(rng.integers(1, 2_000_000 if trial % 10 == 0 else 60))
        window = int(rng.integers(1, min(extent, 6) + 1))
        out = int(rng.integers(1, min(2 * (extent - window + 1) + 2, 40)))
        if trial % 10 == 1:
            out = int(rng.integers(1, ((1 << 31) - 1) // (extent + 1)))
        rows.append((extent, window, out) + magic_divisor(out - 1)
                    + magic_divisor(extent - window))
    cases = np.array(rows, dtype=np.int64)
    alphas = np.array([rng.choice([rng.random(), 0.0, 0.99999994, 0.5]) for _ in rows],
                      dtype=np.float32)
    points = rng.integers(0, 1 << 40, size=(len(rows), 6))
    points[:, :3] = [0, 1, -1]  # first, second and last output / coordinate
    points[:, 2] = cases[:, 2] - 1
    points[:, 3] = cases[:, 0] - 1
    got = np.full((len(rows), 6, 2), -1, dtype=np.int64)
    compare[1, 1](cases, alphas, points, got)
    assert (got == 0).all(), cases[np.flatnonzero((got != 0).any(axis=(1, 2)))]


@pytest.mark.parametrize("case", SIM_CASES[:2] + SIM_CASES[-2:],
                         ids=lambda c: "x".join(map(str, c[0])))
def test_fast_and_general_backward_are_bit_identical(rng, case):
    """The leader-scatter backward sums the same (output, index) pairs in the same order as
    the gather: bit-identical dx, foreign indices included."""
    element = ElementKind.BF16
    shape_in, windows, shape_out = case
    _, _, bw_args = make_plan(shape_in, windows, shape_out, element)
    _, _, _, idx, _ = run_and_check(rng, shape_in, windows, shape_out, element)
    full_out = shape_in[:2] + shape_out
    bad = to_host(idx).copy().reshape(-1)
    bad[0] = 10**12
    bad[-1] = -1
    bad[1] = int(np.prod(shape_in)) - 1  # far from output 1's window
    for indices in (idx, to_device(bad.reshape(full_out))):
        dy = to_device(random_values(full_out, element, rng))
        results = []
        for path in PATH_NAMES:
            plan = set_path(make_plan(shape_in, windows, shape_out, element)[0], path)
            dx = to_device(poisoned(shape_in, element))
            plan.run_bw(bw_args(dy, indices, dx))
            results.append(to_host(dx))
        for other in results[1:]:
            np.testing.assert_array_equal(results[0].view(np.uint16), other.view(np.uint16))


def test_fast_window_kernels_are_selected():
    """Windows in FAST_WINDOWS get their row-caching forward, others the looped one; f16
    and bf16 share the HALF kernels; f64 has only the general forward."""
    from baracuda_numba.kernels.fractional_max_pool import FAST_WINDOWS

    assert (1, 2, 2) not in FAST_WINDOWS  # no benchmark row: the looped window
    for element in (ElementKind.F16, ElementKind.BF16):
        plan = make_plan((1, 1, 6, 6), (3, 3), (2, 2), element)[0]
        assert plan.forward_kernel_name == "fractional_max_pool_fw_rows32[HALF,1x3x3]"
    plan = make_plan((1, 1, 6, 6), (3, 3), (2, 2), ElementKind.F64)[0]
    assert plan.forward_walks == ()
    assert plan.forward_kernel_name == "fractional_max_pool_fw[F64]"
    for window in FAST_WINDOWS + ((1, 2, 2), (1, 2, 3), (2, 2, 2)):
        shape_in = (1, 1) + tuple(k + 3 for k in window)
        if window[0] == 1:
            plan = make_plan(shape_in[:2] + shape_in[3:], window[1:], (2, 2),
                             ElementKind.F32)[0]
        else:
            plan = make_plan(shape_in, window, (2, 2, 2), ElementKind.F32)[0]
        if window in FAST_WINDOWS:
            name = "x".join(map(str, window))
            assert plan.forward_walks == ("looped", "rows32")
            assert plan.forward_kernel_name == f"fractional_max_pool_fw_rows32[F32,{name}]"
            plan.forward_walk = "looped"
        else:
            assert plan.forward_walks == ("looped",)
        assert plan.forward_kernel_name == "fractional_max_pool_fw_fast[F32]"


def test_changing_a_tuning_attribute_forgets_the_memoised_launches():
    """The layout memos key layouts only: setting any tuning attribute clears both, so
    the next ``run`` re-binds with the new value; other attributes leave them."""
    plan = make_plan((1, 2, 9, 9), (2, 2), (5, 5), ElementKind.F32)[0]
    assert plan.TUNING <= set(vars(plan))  # every tuning attribute exists
    for name in sorted(plan.TUNING):
        for memo in plan.memos:  # as a torch call of a new layout would
            memo.store("key", lambda *arrays: None, ())
        plan.other = 1
        assert plan.memoised_layouts == (1, 1)
        setattr(plan, name, getattr(plan, name))
        assert plan.memoised_layouts == (0, 0), name


def test_contiguous_arrays_take_the_fast_path(rng):
    """Row-major arrays launch the fast kernels (the general ones are not bound)."""
    element = ElementKind.F32
    plan, fw_args, bw_args = make_plan((1, 2, 7, 9), (2, 3), (5, 5), element)
    x = to_device(random_values((1, 2, 7, 9), element, rng))
    y = to_device(poisoned((1, 2, 5, 5), element))
    idx = to_device(poisoned((1, 2, 5, 5), ElementKind.I64))
    plan.run_fw(fw_args(x, y, idx, to_device(samples_for(rng, 1, 2, 2))))
    plan.run_bw(bw_args(y, idx, to_device(poisoned((1, 2, 7, 9), element))))
    assert plan.paths_taken == {"fw-fast", "bw-fast"}
    # f64 has no fast kernels: contiguous f64 arrays run the general ones
    element = ElementKind.F64
    plan, fw_args, bw_args = make_plan((1, 2, 7, 9), (2, 3), (5, 5), element)
    assert plan.fast and not plan.listed_backward and plan.tile_shape() is None
    x = to_device(random_values((1, 2, 7, 9), element, rng))
    y = to_device(poisoned((1, 2, 5, 5), element))
    idx = to_device(poisoned((1, 2, 5, 5), ElementKind.I64))
    plan.run_fw(fw_args(x, y, idx, to_device(samples_for(rng, 1, 2, 2))))
    plan.run_bw(bw_args(y, idx, to_device(poisoned((1, 2, 7, 9), element))))
    assert plan.paths_taken == {"fw-general", "bw-general"}


@pytest.mark.parametrize("rows", (None, 3), ids=("rows-default", "rows-3"))
def test_strided_arrays_and_untouched_memory(rng, rows):
    element = ElementKind.F32
    shape_in, windows, shape_out = (2, 2, 6, 7), (2, 3), (4, 3)
    plan, fw_args, bw_args = make_plan(shape_in, windows, shape_out, element)
    if rows is not None:
        plan.rows_per_thread = rows
    big_x = random_values((2, 3, 12, 7), element, rng)
    x_host = big_x[:, 1:, ::2, :]  # strided view: channel offset, every other row
    samples_big = rng.random((2, 2, 4), dtype=np.float32)
    samples = samples_big[:, :, ::2]
    y_full = poisoned((2, 2, 4, 6), element)
    idx_full = poisoned((2, 2, 4, 3, 2), ElementKind.I64)
    y_dev, idx_dev = to_device(y_full), to_device(idx_full)
    y, idx = y_dev[:, :, :, ::2], idx_dev[:, :, :, :, 1]
    plan.run_fw(fw_args(to_device(big_x)[:, 1:, ::2, :], y, idx, to_device(samples_big)[:, :, ::2]))
    expected_idx = ref_forward(from_storage(np.ascontiguousarray(x_host), element), windows,
                               shape_out, samples, BARACUDA, element)
    got_idx_full = to_host(idx_dev)
    np.testing.assert_array_equal(got_idx_full[..., 1], expected_idx)
    assert (got_idx_full[..., 0] == -1).all(), "indices written outside the view"
    got_y_full = to_host(y_dev)
    np.testing.assert_array_equal(got_y_full[:, :, :, ::2],
                                  np.ascontiguousarray(x_host).reshape(-1)[expected_idx])
    assert np.isnan(got_y_full[:, :, :, 1::2]).all(), "y written outside the view"
    # backward: transposed dy, dx a strided view of a poisoned buffer
    dy_host = random_values((2, 2, 3, 4), element, rng)
    dy_view = transposed_device(dy_host)
    dx_full = to_device(poisoned((2, 2, 6, 14), element))
    plan.run_bw(bw_args(dy_view, idx, dx_full[:, :, :, 1::2]))
    expected_dx = ref_backward(dy_host.transpose(0, 1, 3, 2).astype(np.float64), expected_idx,
                               shape_in)
    got = to_host(dx_full)
    np.testing.assert_allclose(got[:, :, :, 1::2], expected_dx, rtol=2e-6, atol=2e-6)
    assert np.isnan(got[:, :, :, ::2]).all(), "dx written outside the view"


def test_broadcast_input(rng):
    """x broadcast over channels (stride 0): every channel pools the same plane."""
    element = ElementKind.F32
    plane = random_values((1, 1, 6, 6), element, rng)
    x_host = np.broadcast_to(plane, (1, 3, 6, 6))
    samples = samples_for(rng, 1, 3, 2)
    plan, fw_args, _ = make_plan((1, 3, 6, 6), (2, 2), (4, 4), element)
    y = to_device(poisoned((1, 3, 4, 4), element))
    idx = to_device(poisoned((1, 3, 4, 4), ElementKind.I64))
    if SIMULATOR:
        x_arg = np.broadcast_to(plane, (1, 3, 6, 6))  # the simulator takes host arrays
    else:
        torch = torch_or_skip()
        x_arg = torch.from_numpy(plane).cuda().expand(1, 3, 6, 6)
    plan.run_fw(fw_args(x_arg, y, idx, to_device(samples)))
    expected_idx = ref_forward(np.ascontiguousarray(x_host).astype(np.float64), (2, 2),
                               (4, 4), samples, BARACUDA, element)
    np.testing.assert_array_equal(to_host(idx), expected_idx)


def test_backward_is_deterministic_and_ignores_foreign_indices(rng):
    element = ElementKind.BF16
    shape_in, windows, shape_out = (1, 2, 7, 8), (3, 3), (5, 6)
    plan, _, bw_args = make_plan(shape_in, windows, shape_out, element)
    _, _, _, idx, dx = run_and_check(rng, shape_in, windows, shape_out, element)
    dy = to_device(random_values((1, 2) + shape_out, element, rng))
    first = to_device(poisoned(shape_in, element))
    second = to_device(poisoned(shape_in, element))
    plan.run_bw(bw_args(dy, idx, first))
    plan.run_bw(bw_args(dy, idx, second))
    np.testing.assert_array_equal(to_host(first), to_host(second))
    # indices that point outside their own window (or outside the tensor) contribute nothing
    bad = to_host(idx).copy()
    bad[0, 0, 0, 0] = 10**12
    bad[0, 1, 4, 5] = -1
    bad[0, 0, 0, 1] = 7 * 8 - 1  # last element of plane 0, far from output (0, 1)'s window
    dx_bad = to_device(poisoned(shape_in, element))
    dy_host = to_host(dy)
    plan.run_bw(bw_args(dy, to_device(bad), dx_bad))
    keep = np.ones(bad.shape, dtype=bool)
    keep[0, 0, 0, 0] = keep[0, 1, 4, 5] = keep[0, 0, 0, 1] = False
    expected = ref_backward(np.where(keep, from_storage(dy_host, element), 0.0),
                            np.where(keep, bad, 0), shape_in)
    np.testing.assert_allclose(from_storage(to_host(dx_bad), element), expected,
                               rtol=2 * TOLERANCE[element][0], atol=2 * TOLERANCE[element][1])


def _empty(shape, dtype):
    """An empty array with row-major strides (NumPy gives empty arrays zero strides, which
    the shared overlap check in arrays.py rejects for outputs)."""
    if SIMULATOR:
        base = np.zeros(1, dtype=dtype)
        itemsize = base.itemsize
        strides = tuple(int(np.prod(shape[i + 1:])) * itemsize for i in range(len(shape)))
        return np.lib.stride_tricks.as_strided(base, shape, strides)
    torch = torch_or_skip()
    return torch.empty(shape, dtype=getattr(torch, np.dtype(dtype).name), device="cuda")


def test_empty_batch_is_a_no_op(rng):
    plan, fw_args, bw_args = make_plan((0, 3, 5, 5), (2, 2), (3, 3), ElementKind.F32)
    x = _empty((0, 3, 5, 5), np.float32)
    y = _empty((0, 3, 3, 3), np.float32)
    idx = _empty((0, 3, 3, 3), np.int64)
    plan.run_fw(fw_args(x, y, idx, _empty((0, 3, 2), np.float32)))
    plan.run_bw(bw_args(y, idx, x))


def test_descriptor_api():
    desc = FractionalMaxPool2dDescriptor.new(2, 3, 10, 10, 2, 2, 7, 7, ElementKind.F16)
    assert desc.seed == 0 and desc.placement is BARACUDA
    seeded = desc.with_seed(42)
    assert seeded.seed == 42 and desc.seed == 0
    plan = FractionalMaxPool2dPlan.select(seeded)
    assert plan.precision_guarantee.deterministic
    assert plan.precision_guarantee.bit_stable_on_same_hardware
    assert plan.precision_guarantee.accumulator is ElementKind.F32
    assert plan.workspace_size == 0
    desc3 = FractionalMaxPool3dDescriptor.new(1, 1, 4, 4, 4, 2, 2, 2, 3, 3, 3, ElementKind.F64)
    assert FractionalMaxPool3dPlan.select(desc3.with_seed(7)).sku.element is ElementKind.F64


@pytest.mark.simulator
def testcandidate_ranges_cover_every_window(rng):
    """The backward's sample-free candidate range of every input coordinate contains every
    output whose window (for the sample drawn) covers it, for both placements (the device
    helper runs as Python in the simulator)."""
    from baracuda_numba.kernels.fractional_max_pool import candidate_outputs

    for trial in range(300):
        extent = int(rng.integers(1, 2_000_000 if trial % 10 == 0 else 60))
        window = int(rng.integers(1, min(extent, 6) + 1))
        out = int(rng.integers(1, min(2 * (extent - window + 1) + 2, 40)))
        alpha = float(np.float32(rng.choice([rng.random(), 0.0, 0.99999994])))
        for placement, code in ((BARACUDA, 0), (TORCH, 1)):
            for element in (ElementKind.F32, ElementKind.F64):
                starts = ref_starts(out, extent, window, alpha, placement, element)
                assert all(a <= b for a, b in zip(starts, starts[1:])), "starts not monotone"
                for o, start in enumerate(starts):
                    for coord in {start, start + window // 2, start + window - 1}:
                        first, end = candidate_outputs(coord, extent, window, out, code)
                        assert first <= o < end, (placement, extent, window, out, alpha, o)



@pytest.mark.simulator
def test_hostcandidate_ranges_equal_the_device_ranges(rng):
    """The plan sizes the tiled backward's shared memory from a host mirror of
    ``candidate_outputs``: it must give the same ranges (device helper run as Python)."""
    from baracuda_numba.kernels.fractional_max_pool import candidate_outputs
    from baracuda_numba.plans.fractional_max_pool import candidate_ranges

    for trial in range(120):
        extent = int(rng.integers(1, 3_000_000 if trial % 10 == 0 else 80))
        window = int(rng.integers(1, min(extent, 6) + 1))
        out = int(rng.integers(1, min(2 * (extent - window + 1) + 2, 60)))
        for code in (0, 1):
            first, end = candidate_ranges(extent, window, out, code)
            coords = {0, extent - 1} | {int(c) for c in rng.integers(0, extent, 30)}
            for coord in coords:
                assert (int(first[coord]), int(end[coord])) == tuple(
                    candidate_outputs(coord, extent, window, out, code)), (
                    extent, window, out, code, coord)


def test_tile_choice_respects_the_shared_memory(rng):
    """Every tile the plan picks holds at most its mask and staged-output capacities, and
    every element's candidate box fits the mask; TORCH placement, boxes over 32 outputs
    and tiles below one row fall back to the leader scatter (f64: no tiled kernel)."""
    from baracuda_numba.kernels.fractional_max_pool import BW_MASK_BITS
    from baracuda_numba.plans.fractional_max_pool import candidate_ranges, staged_outputs

    cases = [((32, 64, 128, 128), (3, 3), (91, 91)), ((8, 32, 32, 64, 64), (3, 3, 3),
                                                      (22, 45, 45)),
             ((1, 1, 5, 6), (2, 2), (9, 11)), ((2, 3, 33, 257), (3, 3), (23, 181)),
             ((1, 1, 40, 30, 20), (2, 5, 3), (39, 11, 17))]
    for shape_in, windows, shape_out in cases:
        for element in (ElementKind.BF16, ElementKind.F32, ElementKind.F64):
            for placement in (BARACUDA, TORCH):
                plan = make_plan(shape_in, windows, shape_out, element, placement)[0]
                assert plan.tiled_backward  # the default where it applies
                assert plan.listed_backward == (element is not ElementKind.F64)
                if element is ElementKind.F64:  # the general gather
                    assert plan.tile_shape() is None
                    continue
                ranges = [candidate_ranges(extent, window, out, placement.value)
                          for extent, window, out in plan.axes]
                reach = [int((end - first).max()) for first, end in ranges]
                if placement is TORCH or np.prod(reach) > BW_MASK_BITS:
                    # the tiled kernel: BARACUDA only, one mask bit per candidate output
                    assert placement is TORCH or shape_out in ((9, 11), (39, 11, 17))
                    assert plan.tile_shape() is None
                    continue
                tile_d, tile_h, reach_h, reach_w = plan.tile_shape()
                assert (reach_h, reach_w) == tuple(reach[1:])
                _, max_d = staged_outputs(ranges[0], tile_d)
                _, max_h = staged_outputs(ranges[1], tile_h)
                w_in, _, w_out = plan.axes[2]
                slots, staged = tile_d * tile_h * w_in, max_d * max_h * w_out
                # u32 mask per slot, u32 list entry + dy per output
                item = element.storage_bits // 8
                assert 4 * slots + (4 + item) * staged <= plan.listed_bytes
                plan.tile_elems = plan.axes[2][0] - 1
                assert plan.tile_shape() is None
    # rows wider than the shared column table of candidate ranges take the leader scatter
    from baracuda_numba.kernels.fractional_max_pool import BW_TABLE_W
    wide = make_plan((1, 1, 8, BW_TABLE_W + 1), (2, 2), (5, 700), ElementKind.BF16)[0]
    assert wide.tile_shape() is None
    wide = make_plan((1, 1, 8, BW_TABLE_W), (2, 2), (5, 700), ElementKind.BF16)[0]
    assert wide.tile_shape() is not None


@pytest.mark.parametrize("case", [SIM_CASES[1], SIM_CASES[5]],
                         ids=lambda c: "x".join(map(str, c[0])))
def test_tiled_backward_is_deterministic_across_tilings(rng, case):
    """Two runs bit-identical, and the same bits for every tiling (one tile per plane, two
    rows, one row per tile), the listed tiled kernels (half for bf16, f32), the leader
    scatter and the gather: the sums never depend on which block or thread computes them
    (nor on the order of the listed kernel's list)."""
    shape_in, windows, shape_out = case
    for element, bits in ((ElementKind.BF16, np.uint16), (ElementKind.F32, np.uint32)):
        _, _, _, idx, _ = run_and_check(rng, shape_in, windows, shape_out, element)
        dy = to_device(random_values(shape_in[:2] + shape_out, element, rng))
        results = []
        for tile_rows, tiled, fast in ((None, True, True), (None, True, True),
                                       (2, True, True), (1, True, True),
                                       (None, False, True), (None, True, False)):
            plan, _, bw_args = make_plan(shape_in, windows, shape_out, element)
            plan.tiled_backward = tiled
            plan.fast = fast
            if tile_rows is not None:
                plan.tile_elems = tile_rows * plan.axes[2][0]
            assert (plan.tile_shape() is not None) == tiled
            dx = to_device(poisoned(shape_in, element))
            plan.run_bw(bw_args(dy, idx, dx))
            results.append(to_host(dx))
        for other in results[1:]:
            np.testing.assert_array_equal(results[0].view(bits), other.view(bits))

@pytest.mark.gpu
@pytest.mark.parametrize("case", [((1, 2, 128, 128), (3, 3), (91, 91)),
                                  ((1, 2, 32, 64, 64), (3, 3, 3), (22, 45, 45))],
                         ids=("2d", "3d"))
def test_listed_backward_with_large_tiles(rng, case):
    """The listed tiled backward with tiles in more than 48 KiB of shared memory (dynamic
    + static: 2-D at 48 KiB has 45 KiB of dynamic shared memory, over the limit only with
    the static tables; larger budgets): the same bits as the gather and the leader scatter
    on the benchmark's plane shapes."""
    shape_in, windows, shape_out = case
    element = ElementKind.F32
    full_out = shape_in[:2] + shape_out
    plan, fw_args, _ = make_plan(shape_in, windows, shape_out, element)
    idx = to_device(poisoned(full_out, ElementKind.I64))  # the forward's saved indices
    plan.run_fw(fw_args(to_device(random_values(shape_in, element, rng)),
                        to_device(poisoned(full_out, element)), idx,
                        to_device(samples_for(rng, *shape_in[:2], len(shape_out)))))
    dy = to_device(random_values(full_out, element, rng))
    results = []
    for path, budget in (("general", 0), ("listed", 44), ("listed", 48), ("listed", 64),
                         ("listed", 160), ("scatter", 0)):
        plan, _, bw_args = make_plan(shape_in, windows, shape_out, element)
        plan.fast = path != "general"
        plan.tiled_backward = path == "listed"
        if budget:
            plan.listed_bytes = budget * 1024
        assert (plan.tile_shape() is not None) == (path == "listed")
        dx = to_device(poisoned(shape_in, element))
        plan.run_bw(bw_args(dy, idx, dx))
        results.append(to_host(dx))
    for other in results[1:]:
        np.testing.assert_array_equal(results[0].view(np.uint32), other.view(np.uint32))


# -- rejections: each raises before anything is written -----------------------------------


@pytest.mark.parametrize("change, error", [
    (dict(window_h=8), InvalidProblem),  # window larger than input
    (dict(h_in=0), InvalidProblem),
    (dict(w_out=0), InvalidProblem),
    (dict(window_w=0), InvalidProblem),
    (dict(batch=-1), InvalidProblem),
    (dict(h_in=1 << 31, window_h=1), Unsupported),
    (dict(element=ElementKind.I32), Unsupported),
    (dict(placement="torch"), InvalidProblem),
])
def test_select_rejects(change, error):
    base = dict(batch=1, channels=2, h_in=7, w_in=7, window_h=2, window_w=2, h_out=4,
                w_out=4, element=ElementKind.F32)
    base.update(change)
    with pytest.raises(error, match="FractionalMaxPool2dPlan: "):
        FractionalMaxPool2dPlan.select(FractionalMaxPool2dDescriptor(**base))


def test_select_rejects_3d_window_too_large():
    desc = FractionalMaxPool3dDescriptor.new(1, 1, 3, 8, 8, 4, 2, 2, 2, 4, 4, ElementKind.F32)
    with pytest.raises(InvalidProblem, match="FractionalMaxPool3dPlan: window_d"):
        FractionalMaxPool3dPlan.select(desc)


def test_run_rejects_bad_arrays_before_writing(rng):
    element = ElementKind.F32
    plan, fw_args, bw_args = make_plan((1, 2, 7, 7), (2, 2), (4, 4), element)
    x = to_device(random_values((1, 2, 7, 7), element, rng))
    s = to_device(samples_for(rng, 1, 2, 2))
    y = to_device(poisoned((1, 2, 4, 4), element))
    idx = to_device(poisoned((1, 2, 4, 4), ElementKind.I64))
    bad = [
        (fw_args(x, y, idx, to_device(samples_for(rng, 1, 2, 3))), "random_samples"),
        (fw_args(x, y, idx, to_device(np.zeros((1, 2, 2)))), "random_samples"),  # f64
        (fw_args(x, y, to_device(np.zeros((1, 2, 4, 4), np.int32)), s), "indices"),
        (fw_args(to_device(np.zeros((1, 2, 7, 7), np.float16)), y, idx, s), "x"),
        (fw_args(x, to_device(poisoned((1, 2, 4, 5), element)), idx, s), "y"),
        (fw_args(x, y, y, s), "indices"),  # f32 array as indices
    ]
    for args, arg in bad:
        with pytest.raises(InvalidProblem, match=f"FractionalMaxPool2dPlan: {arg} "):
            plan.run_fw(args)
    assert np.isnan(to_host(y)).all() and (to_host(idx) == -1).all()
    dx = to_device(poisoned((1, 2, 7, 7), element))
    with pytest.raises(InvalidProblem, match="FractionalMaxPool2dPlan: indices "):
        plan.run_bw(bw_args(y, to_device(np.zeros((1, 2, 4, 4), np.float64)), dx))
    with pytest.raises(InvalidProblem, match="FractionalMaxPool2dPlan: dx "):
        plan.run_bw(bw_args(y, idx, to_device(poisoned((1, 2, 7, 7), ElementKind.F64))))
    assert np.isnan(to_host(dx)).all()


def test_run_rejects_overlapping_outputs(rng):
    element = ElementKind.F32
    plan, fw_args, bw_args = make_plan((1, 1, 6, 6), (2, 2), (3, 3), element)
    buffer = to_device(poisoned((1, 1, 6, 6), element))
    y = to_device(poisoned((1, 1, 3, 3), element))
    idx = to_device(poisoned((1, 1, 3, 3), ElementKind.I64))
    s = to_device(samples_for(rng, 1, 1, 2))
    with pytest.raises(InvalidProblem, match="FractionalMaxPool2dPlan: y overlaps x"):
        plan.run_fw(fw_args(buffer, buffer[:, :, :3, :3], idx, s))
    with pytest.raises(InvalidProblem, match="FractionalMaxPool2dPlan: dx overlaps dy"):
        plan.run_bw(bw_args(buffer[:, :, :3, :3], idx, buffer))
    assert np.isnan(to_host(buffer)).all() and np.isnan(to_host(y)).all()


# -- GPU: against PyTorch ---------------------------------------------------------------------

_TORCH_CASES = [
    ((4, 8, 50, 47), (3, 2), (33, 31)),
    ((2, 4, 12, 20, 17), (2, 3, 2), (7, 13, 9)),
]


@pytest.mark.gpu
@pytest.mark.parametrize("element", FLOAT_ELEMENTS, ids=lambda e: e.name)
@pytest.mark.parametrize("case", _TORCH_CASES, ids=lambda c: "x".join(map(str, c[0])))
def test_torch_placement_matches_pytorch(element, case):
    torch = torch_or_skip()
    import torch.nn.functional as F

    shape_in, windows, shape_out = case
    dtype = {ElementKind.F16: torch.float16, ElementKind.BF16: torch.bfloat16,
             ElementKind.F32: torch.float32, ElementKind.F64: torch.float64}[element]
    batch, channels = shape_in[:2]
    rank = len(shape_out)
    x = torch.randn(shape_in, device="cuda", dtype=dtype, requires_grad=True)
    # torch's samples are in x's dtype; use values that f32 holds exactly
    torch_samples = torch.rand(batch, channels, rank, device="cuda", dtype=dtype)
    ours_samples = torch_samples.float()
    if rank == 2:
        ours_samples = ours_samples.flip(-1)  # torch orders 2-D samples (w, h)
        y_ref, idx_ref = F.fractional_max_pool2d(x, windows, output_size=shape_out,
                                                 return_indices=True,
                                                 _random_samples=torch_samples)
    else:
        y_ref, idx_ref = F.fractional_max_pool3d(x, windows, output_size=shape_out,
                                                 return_indices=True,
                                                 _random_samples=torch_samples)
    plan, fw_args, bw_args = make_plan(shape_in, windows, shape_out, element, TORCH)
    y = torch.full_like(y_ref, float("nan"))
    idx = torch.full_like(idx_ref, -1)
    plan.run_fw(fw_args(x, y, idx, ours_samples.contiguous()))
    plane = int(np.prod(shape_in[2:]))
    offsets = torch.arange(batch * channels, device="cuda").reshape(
        (batch, channels) + (1,) * rank) * plane
    assert torch.equal(idx - offsets, idx_ref)  # no NaN in x: torch's last-NaN rule is moot
    assert torch.equal(y, y_ref)
    dy = torch.randn_like(y_ref)
    (dx_ref,) = torch.autograd.grad(y_ref, x, dy)
    dx = torch.full_like(dx_ref, float("nan"))
    plan.run_bw(bw_args(dy, idx, dx))
    rtol, atol = TOLERANCE[element]
    # torch accumulates half gradients in the half type (atomics); ours in f32
    scale = 4 if element in (ElementKind.F16, ElementKind.BF16) else 2
    torch.testing.assert_close(dx.double(), dx_ref.double(), rtol=scale * rtol,
                               atol=scale * atol)


@pytest.mark.gpu
def test_direct_and_dispatcher_launches_agree(rng):
    from baracuda_numba.launch import launch_mode, set_launch_mode

    mode = launch_mode()
    try:
        set_launch_mode("dispatcher")
        run_and_check(rng, (2, 3, 20, 21), (3, 3), (13, 14), ElementKind.BF16)
    finally:
        set_launch_mode(mode)


@pytest.mark.gpu
def test_more_than_2_pow_31_elements():
    torch = torch_or_skip()
    element = ElementKind.F16
    shape_in, windows, shape_out = (1, 2, 32768, 32769), (2, 2), (16384, 16385)
    plan, fw_args, bw_args = make_plan(shape_in, windows, shape_out, element)
    x = torch.randn(shape_in, device="cuda", dtype=torch.float16)
    assert x.numel() > 2**31
    samples = torch.rand(1, 2, 2, device="cuda")
    y = torch.empty((1, 2) + shape_out, device="cuda", dtype=torch.float16)
    idx = torch.empty(y.shape, device="cuda", dtype=torch.int64)
    plan.run_fw(fw_args(x, y, idx, samples))
    assert torch.equal(x.view(-1)[idx.view(-1)], y.view(-1))
    # each saved index lies in its own output's window (plane 1 sits past 2^31)
    plane = 32768 * 32769
    local = idx[0, 1] - plane
    rows, cols = local // 32769, local % 32769
    starts_h = torch.tensor(ref_starts(16384, 32768, 2, samples[0, 1, 0].item(), BARACUDA,
                                       element), device="cuda")
    starts_w = torch.tensor(ref_starts(16385, 32769, 2, samples[0, 1, 1].item(), BARACUDA,
                                       element), device="cuda")
    assert ((rows - starts_h[:, None]) >= 0).all() and ((rows - starts_h[:, None]) < 2).all()
    assert ((cols - starts_w[None, :]) >= 0).all() and ((cols - starts_w[None, :]) < 2).all()
    del x
    dy = torch.randn_like(y)
    dx = torch.empty(shape_in, device="cuda", dtype=torch.float16)
    plan.run_bw(bw_args(dy, idx, dx))
    ref = torch.zeros(dx.numel(), device="cuda", dtype=torch.float32)
    ref.index_add_(0, idx.view(-1), dy.view(-1).float())
    torch.testing.assert_close(dx.view(-1).float(), ref.half().float(), rtol=1e-3, atol=1e-3)


@pytest.mark.gpu
def test_torch_fast_path_with_fresh_tensors_and_aliasing():
    """After the first run a torch layout goes through the plan's LayoutMemo (no array
    checks): fresh tensors of that layout must give the gather result, and an output
    aliasing an input must still be rejected before any launch."""
    torch = torch_or_skip()
    shape_in, windows, shape_out = (2, 3, 20, 21), (3, 3), (13, 14)
    plan, fw_args, bw_args = make_plan(shape_in, windows, shape_out, ElementKind.F32)
    x = torch.randn(shape_in, device="cuda")
    samples = torch.rand(2, 3, 2, device="cuda")
    dy = torch.randn((2, 3) + shape_out, device="cuda")
    results = []
    for _ in range(3):  # the first call takes the checked path, the others the memo
        y = torch.full((2, 3) + shape_out, float("nan"), device="cuda")
        idx = torch.full(y.shape, -1, device="cuda", dtype=torch.int64)
        dx = torch.full(shape_in, float("nan"), device="cuda")
        x_copy, samples_copy, dy_copy = x.clone(), samples.clone(), dy.clone()
        plan.run_fw(fw_args(x_copy, y, idx, samples_copy))
        plan.run_bw(bw_args(dy_copy, idx, dx))
        assert torch.equal(x.reshape(-1)[idx.reshape(-1)], y.reshape(-1))  # flat indices
        results.append((y, idx, dx))
    for y, idx, dx in results[1:]:
        assert torch.equal(y, results[0][0])
        assert torch.equal(idx, results[0][1])
        assert torch.equal(dx, results[0][2])
    n_in = 2 * 3 * 20 * 21
    n_out = 2 * 3 * 13 * 14
    buffer = torch.randn(n_in + n_out + 64, device="cuda")
    x = buffer[:n_in].view(shape_in)
    y = buffer[n_in:n_in + n_out].view((2, 3) + shape_out)
    idx = torch.empty(y.shape, device="cuda", dtype=torch.int64)
    plan.run_fw(fw_args(x, y, idx, samples))  # a memo entry for this layout
    aliasing = buffer[4:4 + n_out].view((2, 3) + shape_out)  # same layout key, inside x
    before = buffer.clone()
    with pytest.raises(InvalidProblem, match="overlaps"):
        plan.run_fw(fw_args(x, aliasing, idx, samples))
    torch.cuda.synchronize()
    assert torch.equal(buffer, before)
