"""ScanPlan / ScanBackwardPlan against NumPy float64 references (and torch on a GPU).

Error bounds: the output rounding of ``TOLERANCE[element]`` plus the classical bound of
the accumulation, ``2 * n * u_acc * scale``, where ``scale`` is the same reference taken
over absolute values (sum of |terms|), ``n`` the scan extent and ``u_acc`` the unit
roundoff of the accumulator (f32 for halves). Cummax/Cummin values and indices are exact.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import EDGE_LENGTHS, FLOAT_ELEMENTS, SIMULATOR, torch_or_skip

from baracuda_numba.errors import BufferTooSmall, InvalidProblem, Unsupported, WorkspaceTooSmall
from baracuda_numba.kernels.scan import FAST_ELEMENTS, FAST_FAMILY
from baracuda_numba.plans.scan import (
    ScanArgs,
    ScanBackwardArgs,
    ScanBackwardDescriptor,
    ScanBackwardPlan,
    ScanDescriptor,
    ScanPlan,
)
from baracuda_numba.testing import (
    TOLERANCE,
    assert_within,
    from_storage,
    poisoned,
    random_values,
    to_storage,
)
from baracuda_numba.types import ElementKind, PlanPreference, ScanKind

INT_ELEMENTS = (ElementKind.I32, ElementKind.I64)
KINDS = tuple(ScanKind)
EXTREMA = (ScanKind.CUMMAX, ScanKind.CUMMIN)

# -- NumPy references ------------------------------------------------------------------


def _lines(values: np.ndarray, axis: int, reverse: bool) -> np.ndarray:
    """View with the scan axis last, in scan order."""
    moved = np.moveaxis(values, axis, -1)
    return moved[..., ::-1] if reverse else moved


def _unlines(values: np.ndarray, axis: int, reverse: bool) -> np.ndarray:
    return np.moveaxis(values[..., ::-1] if reverse else values, -1, axis)


def _running_winner(x: np.ndarray, is_max: bool, later_wins: bool) -> np.ndarray:
    """Scan index of the running winner at each step (NaN dominates; ties to the later
    or to the first occurrence)."""
    index = np.zeros(x.shape, dtype=np.int64)
    value = x[..., 0].copy()
    current = np.zeros(x.shape[:-1], dtype=np.int64)
    for s in range(x.shape[-1]):
        v = x[..., s]
        nan_v, nan_acc = np.isnan(v), np.isnan(value)
        with np.errstate(invalid="ignore"):
            if later_wins:
                better = (v >= value) if is_max else (v <= value)
                take = nan_v | (~nan_acc & better)
            else:
                better = (v > value) if is_max else (v < value)
                take = (nan_v & ~nan_acc) | (~nan_acc & ~nan_v & better)
        if s == 0:
            take = np.ones_like(take)
        value = np.where(take, v, value)
        current = np.where(take, s, current)
        index[..., s] = current
    return index


def reference_forward(kind: ScanKind, x: np.ndarray, axis: int, reverse: bool):
    """(y, indices or None, scale) in float64 (int64 for integers, wrapping)."""
    lines = _lines(x, axis, reverse)
    n = lines.shape[-1]
    indices = None
    if kind is ScanKind.CUMSUM:
        y, scale = np.cumsum(lines, -1), np.cumsum(np.abs(lines), -1)
    elif kind is ScanKind.CUMPROD:
        with np.errstate(over="ignore", invalid="ignore"):
            y = np.cumprod(lines, -1)
        scale = np.nan_to_num(np.abs(y), posinf=0)
    elif kind in EXTREMA:
        winner = _running_winner(lines, kind is ScanKind.CUMMAX, later_wins=True)
        y = np.take_along_axis(lines, winner, -1)
        indices = (n - 1 - winner) if reverse else winner
        scale = np.zeros_like(y, dtype=np.float64)
    else:
        with np.errstate(invalid="ignore"):
            y = np.logaddexp.accumulate(lines, -1) if n else lines.copy()
        # each logaddexp step is relative to |y| + 1 (log1p/exp of an O(1) argument)
        scale = np.abs(np.nan_to_num(y, posinf=0, neginf=0)) + 1
    out_indices = None if indices is None else _unlines(indices, axis, reverse)
    return _unlines(y, axis, reverse), out_indices, _unlines(scale, axis, reverse)


def reference_backward(kind: ScanKind, x, y, dy, axis: int, reverse: bool):
    """(dx, scale) in float64, from the definitions (O(n^2), small n only). ``y`` is the
    saved forward output as passed to the plan."""
    lx, ly, ldy = (_lines(a, axis, reverse) if a is not None else None for a in (x, y, dy))
    n = ldy.shape[-1]
    dx = np.zeros(ldy.shape)
    scale = np.zeros(ldy.shape)
    if kind is ScanKind.CUMSUM:
        dx = np.cumsum(ldy[..., ::-1], -1)[..., ::-1]
        scale = np.cumsum(np.abs(ldy[..., ::-1]), -1)[..., ::-1]
    elif kind is ScanKind.CUMPROD:
        for j in range(n):
            others = lx.copy()
            others[..., j] = 1
            partial = np.cumprod(others, -1)
            dx[..., j] = np.sum((ldy * partial)[..., j:], -1)
            scale[..., j] = np.sum(np.abs(ldy * partial)[..., j:], -1)
    elif kind is ScanKind.LOG_CUMSUM_EXP:
        for j in range(n):
            with np.errstate(invalid="ignore", over="ignore"):
                weight = np.exp(lx[..., j:j + 1] - ly[..., j:])
            weight = np.where(np.isneginf(lx[..., j:j + 1]), 0.0, weight)
            dx[..., j] = np.sum(ldy[..., j:] * weight, -1)
            scale[..., j] = np.sum(np.abs(ldy[..., j:]) * weight, -1)
    else:
        # dx[j] = sum of dy[i] over the i whose running winner is j
        winner = _running_winner(lx, kind is ScanKind.CUMMAX, later_wins=True)  # torch
        lines = np.arange(winner.size // max(n, 1)).reshape(winner.shape[:-1] + (1,)) * n
        flat_dx, flat_scale = dx.reshape(-1), scale.reshape(-1)
        np.add.at(flat_dx, (winner + lines).ravel(), ldy.ravel())
        np.add.at(flat_scale, (winner + lines).ravel(), np.abs(ldy).ravel())
    return _unlines(dx, axis, reverse), _unlines(scale, axis, reverse)


def check_close(got: np.ndarray, expected: np.ndarray, scale: np.ndarray,
                element: ElementKind, extent: int, what: str) -> None:
    """NaN and inf positions must match exactly; finite values within the bound of the
    module docstring."""
    expected = np.asarray(expected, dtype=np.float64)
    rtol, atol = TOLERANCE[element]
    u_acc = 2.0 ** -53 if element is ElementKind.F64 else 2.0 ** -24
    if element in INT_ELEMENTS:
        u_acc = 0.0
    bound = atol + rtol * np.abs(expected) + 2 * max(extent, 1) * u_acc * scale
    assert_within(got, expected, bound, what)


def rounded(values: np.ndarray, element: ElementKind) -> np.ndarray:
    """float64 values rounded to ``element`` (overflow to inf, as the device rounds)."""
    with np.errstate(over="ignore"):
        return from_storage(to_storage(values, element), element)


def distinct_inputs(shape, element, rng) -> np.ndarray:
    """Random values with no ties along the last axis (torch's autograd sends a tied
    winner's gradient to the last occurrence, the seed's rule to the first)."""
    pool = np.unique(from_storage(to_storage(rng.uniform(-4, 4, 1 << 16), element), element))
    lines = [rng.choice(pool, shape[-1], replace=False) for _ in range(int(np.prod(shape[:-1])))]
    return to_storage(np.array(lines).reshape(shape), element)


# -- running the plans -----------------------------------------------------------------


def device(host: np.ndarray):
    """The array the plans read: in the simulator the NumPy array itself (so strided and
    broadcast views keep their strides), on a GPU a torch tensor with the same strides."""
    if SIMULATOR:
        return host
    torch = torch_or_skip()
    if host.dtype == np.uint16:  # bf16 storage
        base = torch.from_numpy(np.ascontiguousarray(host).view(np.int16)).cuda()
        return base.view(torch.bfloat16)
    if host.strides and 0 in host.strides:
        contiguous = torch.from_numpy(np.array(host[_base_index(host)])).cuda()
        return contiguous.expand(host.shape) if contiguous.dim() == host.ndim else contiguous
    return torch.from_numpy(np.ascontiguousarray(host)).cuda()


def _base_index(host: np.ndarray):
    return tuple(slice(0, 1) if s == 0 else slice(None) for s in host.strides)


def host(array) -> np.ndarray:
    if isinstance(array, np.ndarray):
        return array.copy()
    torch = torch_or_skip()
    if array.dtype == torch.bfloat16:
        return array.view(torch.int16).cpu().numpy().view(np.uint16)
    return array.detach().cpu().numpy()


def inputs(shape, element, rng, kind=None, low=-2.0, high=2.0):
    values = random_values(shape, element, rng, low, high)
    if kind is ScanKind.CUMPROD and element.is_float:
        # products of n factors stay O(1): factors near +-1
        values = to_storage(rng.choice([-1, 1], size=shape) * rng.uniform(0.8, 1.25, shape),
                            element)
    if kind is ScanKind.CUMPROD and not element.is_float:
        values = rng.integers(-3, 4, size=shape).astype(element.storage_dtype)
        if SIMULATOR:
            # the simulator runs NumPy scalars, which warn on overflow (an error): factors
            # of magnitude 2 rare enough that no line of these tests leaves int32 (a
            # 33-element line of [-3, 3] factors can; the GPU tests wrap, and
            # test_integer_wraparound covers the wrap)
            values = rng.choice([-2, -1, 0, 1, 2], size=shape,
                                p=[0.02, 0.43, 0.1, 0.43, 0.02]).astype(element.storage_dtype)
    return values


def spaced(values: np.ndarray, step: int = 2):
    """A device array equal to ``values`` whose last axis has stride ``step`` elements
    (not collapsible: the generic kernels)."""
    shape = values.shape[:-1] + (values.shape[-1] * step,)
    if SIMULATOR:
        view = np.zeros(shape, values.dtype)[..., ::step]
        view[...] = values
        return view
    view = device(np.zeros(shape, values.dtype))[..., ::step]
    view.copy_(device(values))
    return view


def misaligned(values: np.ndarray):
    """A C-contiguous device array equal to ``values`` starting one element past an 8-byte
    boundary (the fast kernels then load and store element by element)."""
    buffer = np.zeros(values.size + 1, values.dtype)
    if SIMULATOR:
        view = buffer[1:].reshape(values.shape)
        view[...] = values
        return view
    view = device(buffer)[1:].view(values.shape)
    view.copy_(device(values))
    return view


def used_fast(plan) -> bool:
    """Whether the plan's layouts went to a fast kernel (rows_fast, cols_fast, the
    indexed rows kernel or the fused Cummax/Cummin backward)."""
    return bool(plan.paths_taken & {"fast", "indexed", "extremum_backward"})


def used_fused_backward(plan) -> bool:
    """Whether the fused Cummax/Cummin backward ran (rather than the record-flag
    pre-pass and the generic backward kernel)."""
    return "extremum_backward" in plan.paths_taken


def _no_workspace(workspace):
    """The preference of a run without a workspace (``run`` requires the one ``select``
    sized: upstream's contract), None for a run with one."""
    return None if workspace else PlanPreference(max_workspace_bytes=0)


def run_forward(kind, x_host, axis, reverse, element, with_indices=False, workspace=False,
                place=None):
    shape = x_host.shape
    place = place or device
    plan = ScanPlan.select(ScanDescriptor(kind, shape, axis, reverse, element=element),
                           _no_workspace(workspace))
    y = place(poisoned(shape, element))
    indices = device(poisoned(shape, ElementKind.I64)) if with_indices else None
    ws = None
    if workspace and plan.workspace_size:
        ws = device(np.zeros(plan.workspace_size, dtype=np.uint8))
    plan.run(ScanArgs(place(x_host), y, indices), workspace=ws)
    return plan, host(y), (host(indices) if with_indices else None)


def check_forward(kind, x_host, axis, reverse, element, with_indices=False, workspace=False,
                  place=None):
    plan, y, indices = run_forward(kind, x_host, axis, reverse, element, with_indices,
                                   workspace, place)
    x = from_storage(x_host, element)
    expected, expected_indices, scale = reference_forward(kind, x, axis, reverse)
    if element in INT_ELEMENTS:
        expected = expected.astype(np.int64).astype(element.storage_dtype).astype(np.int64)
    elif element is not ElementKind.F64:
        # the kernel rounds each output once; compare with the rounded reference
        expected = rounded(expected, element)
    check_close(from_storage(y, element), expected, scale, element, x.shape[axis],
                f"{kind.name} {element.name} {x.shape} axis={axis} reverse={reverse}")
    if with_indices:
        np.testing.assert_array_equal(indices, expected_indices)
    return plan


_NEEDS_Y = (ScanKind.CUMPROD, ScanKind.LOG_CUMSUM_EXP)


def run_backward(kind, dy_host, x_host, y_host, axis, reverse, element, workspace=False,
                 place=None):
    """(plan, dx); ``place`` (default ``device``) makes x, dy and dx (``misaligned``, or
    ``spaced`` for dy alone when given as ``("dy", spaced)``)."""
    shape = dy_host.shape
    plan = ScanBackwardPlan.select(ScanBackwardDescriptor(kind, shape, axis, reverse,
                                                          element=element),
                                   _no_workspace(workspace))
    place_dy = place[1] if isinstance(place, tuple) else place or device
    place = device if isinstance(place, tuple) else place or device
    dx = place(poisoned(shape, element))
    ws = None
    if workspace and plan.workspace_size:
        ws = device(np.zeros(plan.workspace_size, dtype=np.uint8))
    saved_x = place(x_host) if kind is not ScanKind.CUMSUM else None
    saved_y = device(y_host) if kind in _NEEDS_Y else None
    plan.run(ScanBackwardArgs(place_dy(dy_host), dx, saved_x, saved_y), workspace=ws)
    return plan, host(dx)


def check_backward(kind, shape, axis, reverse, element, rng, x_host=None, workspace=False,
                   place=None, dy_host=None):
    """Run the backward and compare with the NumPy reference; returns the plan."""
    if x_host is None:
        x_host = inputs(shape, element, rng, kind)
    if dy_host is None:
        dy_host = random_values(shape, element, rng)
    y_host = None
    if kind in _NEEDS_Y:
        _, y_host, _ = run_forward(kind, x_host, axis, reverse, element)
    plan, dx = run_backward(kind, dy_host, x_host, y_host, axis, reverse, element, workspace,
                            place)
    x, dy = (from_storage(a, element) for a in (x_host, dy_host))
    y = from_storage(y_host, element) if y_host is not None else None
    expected, scale = reference_backward(kind, x, y, dy, axis, reverse)
    if element is not ElementKind.F64:
        expected = rounded(expected, element)
    n = shape[axis]
    if kind is ScanKind.LOG_CUMSUM_EXP:
        # y is the saved half-precision output: exp(x - y) carries its rounding
        scale = scale * (1 + TOLERANCE[element][0] / 2.0 ** -24 / max(n, 1))
    check_close(from_storage(dx, element), expected, scale, element, n + 2,
                f"{kind.name} backward {element.name} {shape} axis={axis} reverse={reverse}")
    return plan


# -- simulator-sized tests (also run on the GPU) ---------------------------------------

ROWS_SHAPE = ((1, 150), 1)  # contiguous scan axis, two tiles: the rows kernel
LINES_SHAPE = ((33, 5), 0)  # outer scan axis: the lines kernel, 4 chunks per line


@pytest.mark.parametrize("element", FLOAT_ELEMENTS + INT_ELEMENTS, ids=lambda e: e.name)
@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.name)
def test_forward_lines(kind, element, rng):
    if kind is ScanKind.LOG_CUMSUM_EXP and element in INT_ELEMENTS:
        pytest.skip("LogCumsumExp is float-only")
    shape, axis = LINES_SHAPE
    for reverse in (False, True):
        check_forward(kind, inputs(shape, element, rng, kind), axis, reverse, element,
                      with_indices=kind in EXTREMA)


ROWS_CASES = [(k, ElementKind.F32) for k in KINDS] + [
    (ScanKind.CUMSUM, ElementKind.F16), (ScanKind.CUMMAX, ElementKind.BF16),
    (ScanKind.LOG_CUMSUM_EXP, ElementKind.F64), (ScanKind.CUMPROD, ElementKind.I32),
    (ScanKind.CUMMIN, ElementKind.I64)]


@pytest.mark.parametrize("kind,element", ROWS_CASES, ids=lambda v: getattr(v, "name", v))
def test_forward_rows(kind, element, rng):
    # the generic rows kernel: an input with stride 2 along the scan axis does not collapse
    shape, axis = ROWS_SHAPE
    reverse = bool(rng.integers(0, 2))
    plan = check_forward(kind, inputs(shape, element, rng, kind), axis, reverse, element,
                         with_indices=kind in EXTREMA, place=spaced)
    assert not used_fast(plan)


# (shape, axis): rows_fast with two full simulator tiles and a partial one at every
# element width, and cols_fast with a partial column word for 2-byte types
FAST_ROWS_SHAPE = ((2, 264), 1)
FAST_COLS_SHAPES = (((3, 9, 40), 1), ((9, 70), 0))


FAST_CASES = [(kind, element) for kind in KINDS for element in FLOAT_ELEMENTS + INT_ELEMENTS
              if element in FAST_ELEMENTS[FAST_FAMILY[int(kind)]]]
if SIMULATOR:
    # The simulator runs one Python thread per CUDA thread (CI time): every kind at F32 and
    # every element kind (word width: 1, 2 or 4 elements per word) at some kind. The GPU
    # runs the whole grid.
    FAST_CASES = [c for c in FAST_CASES if c[1] is ElementKind.F32 or c in (
        (ScanKind.CUMSUM, ElementKind.F16), (ScanKind.CUMSUM, ElementKind.I64),
        (ScanKind.CUMMAX, ElementKind.BF16), (ScanKind.CUMMIN, ElementKind.I32),
        (ScanKind.CUMPROD, ElementKind.F64), (ScanKind.LOG_CUMSUM_EXP, ElementKind.BF16))]


def reverses(index: int) -> tuple[bool, ...]:
    """Both directions on a GPU; in the simulator one, alternating with ``index``."""
    return (bool(index % 2),) if SIMULATOR else (False, True)


@pytest.mark.parametrize("kind,element", FAST_CASES, ids=lambda v: getattr(v, "name", v))
def test_forward_fast_kernels(kind, element, rng):
    # values only (Cummax/Cummin without indices): rows_fast and cols_fast
    for index, (shape, axis) in enumerate((FAST_ROWS_SHAPE,) + FAST_COLS_SHAPES):
        x = inputs(shape, element, rng, kind)
        for reverse in reverses(index + int(kind)):
            workspace = bool(rng.integers(0, 2))
            plan = check_forward(kind, x, axis, reverse, element, workspace=workspace)
            assert used_fast(plan)


@pytest.mark.parametrize("element", (ElementKind.BF16, ElementKind.F32, ElementKind.F16),
                         ids=lambda e: e.name)
def test_fast_kernels_odd_unaligned_split(element, rng):
    # odd extents (a partial last word), misaligned pointers (element-wise path), the
    # two-phase split, and a layout that does not collapse (generic kernels)
    shapes = (((1, 131), 1), ((3, 131), 1), ((2, 520), 1), ((5, 3, 37), 1))
    if SIMULATOR:  # (2, 520): the split of 2-byte elements (test_forward_fast_kernels
        # splits the wider ones)
        shapes = (((2, 131), 1), ((5, 3, 37), 1)) + (
            (((2, 520), 1),) if element is not ElementKind.F32 else ())
    for index, (shape, axis) in enumerate(shapes):
        x = inputs(shape, element, rng)
        for reverse in reverses(index):
            plan = check_forward(ScanKind.CUMSUM, x, axis, reverse, element, workspace=True)
            assert used_fast(plan)
            plan = check_forward(ScanKind.CUMMAX, x, axis, reverse, element,
                                 place=misaligned)
            assert used_fast(plan)
    x = inputs((3, 2, 140), element, rng)
    swapped = np.swapaxes(x, 0, 1)  # outer axes out of order: no uniform pitch
    if SIMULATOR:
        plan = check_forward(ScanKind.LOG_CUMSUM_EXP, swapped, 2, True, element)
        assert not used_fast(plan)


def test_use_kernels_runs_a_variant_and_forgets_the_bound_launches(rng):
    """``use_kernels`` (benchmark sweeps): an unregistered fast-kernel variant and a
    geometry override run and give the table kernels' bits; unknown geometry fields and
    every bound launch are dropped."""
    from baracuda_numba.kernels.scan import FastKernels

    element = ElementKind.F32
    x = inputs((4, 70), element, rng)
    plan = ScanPlan.select(ScanDescriptor(ScanKind.CUMSUM, x.shape, 1, element=element),
                           PlanPreference(max_workspace_bytes=0))
    expected = device(poisoned(x.shape, element))
    plan.run(ScanArgs(device(x), expected))
    assert plan.paths_taken == {"fast"}
    plan.use_kernels(fast=FastKernels(element, "arith", words=1, register=False),
                     fast_rows_nseg=1)
    assert plan.paths_taken == frozenset()
    y = device(poisoned(x.shape, element))
    plan.run(ScanArgs(device(x), y))
    assert plan.paths_taken == {"fast"}
    np.testing.assert_array_equal(host(y), host(expected))
    with pytest.raises(AttributeError, match="no_such_field"):
        plan.use_kernels(no_such_field=1)


def assert_same_bits(got: np.ndarray, expected: np.ndarray, what: str) -> None:
    """Bit equality (NaN payloads and signed zeros included); on failure the first
    mismatching indices and their values."""
    unsigned = np.dtype(f"u{got.dtype.itemsize}")
    differ = np.argwhere(got.view(unsigned) != expected.view(unsigned))
    if differ.size:
        first = [tuple(int(i) for i in index) for index in differ[:5]]
        raise AssertionError(f"{what}: {len(differ)} elements differ; first {first}: got "
                             f"{[got[i] for i in first]}, expected {[expected[i] for i in first]}")


def run_split(plan, x_host, element, repeats=1):
    """y of ``repeats`` runs of ``plan``, each with its workspace poisoned (0xFF bytes:
    were the chained split's words not cleared, every flag would read READY with a NaN
    aggregate and the ticket would be past the last segment)."""
    ys = []
    for _ in range(repeats):
        y = device(poisoned(x_host.shape, element))
        workspace = device(np.full(plan.workspace_size, 0xFF, np.uint8))
        plan.run(ScanArgs(device(x_host), y), workspace=workspace)
        ys.append(host(y))
    return ys


# (shape, segments): rows_fast splits with a partial last segment (simulator tiles: 128
# f32 and 256 bf16 elements); Cumsum f32 also with 40 segments (2 prefix entries a lane).
# GPU: a default split of 195 segments a line too, every chained run repeated 4 times
# (a race between a segment and the ones it waits for would show as differing bits).
CHAINED_SHAPES = (((2, 677), 5),) if SIMULATOR else (((2, 677), 5), ((5, 100_003), None))


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.name)
def test_chained_split_matches_two_launches(kind, rng):
    """rows_fast's chained split (one launch, f32 accumulators: F32 and BF16 here; the
    default for BF16, a tuning variant for F32) gives the two-launch split's bits in both
    directions; F64 keeps the two launches, right."""
    from baracuda_numba.kernels.scan import FastKernels

    family = FAST_FAMILY[int(kind)]
    cases = CHAINED_SHAPES + ((((1, 40 * 128), 40),) if kind is ScanKind.CUMSUM and
                              SIMULATOR else ())
    for element in (ElementKind.F32, ElementKind.BF16):
        for shape, nseg in cases:
            if nseg == 40 and element is not ElementKind.F32:
                continue
            x = inputs(shape, element, rng, kind)
            for reverse in (False, True):
                desc = ScanDescriptor(kind, shape, 1, reverse, element=element)
                chained, two = ScanPlan.select(desc), ScanPlan.select(desc)
                for plan, one in ((chained, True), (two, False)):
                    plan.use_kernels(fast=FastKernels(element, family, chained=one,
                                                      register=False))
                for plan in (chained, two) if nseg else ():
                    plan.use_kernels(fast_rows_nseg=nseg)
                expected = run_split(two, x, element)[0]
                runs = run_split(chained, x, element, 1 if SIMULATOR else 4)
                assert chained.chained_split and not two.chained_split
                for count, y in enumerate(runs):
                    assert_same_bits(y, expected, f"{kind.name} {element.name} {shape} "
                                     f"nseg={nseg} reverse={reverse} chained run {count}")
    element = ElementKind.F64
    x = inputs((2, 677), element, rng, kind)
    plan = ScanPlan.select(ScanDescriptor(kind, x.shape, 1, True, element=element))
    plan.use_kernels(fast_rows_nseg=5)
    (y,) = run_split(plan, x, element)
    assert plan.workspace_size and plan.paths_taken == {"fast"} and not plan.chained_split
    expected, _, scale = reference_forward(kind, x, 1, True)
    check_close(y, expected, scale, element, x.shape[1], f"{kind.name} F64 split")


@pytest.mark.parametrize("element", (ElementKind.BF16, ElementKind.F16), ids=lambda e: e.name)
def test_fast_cols_2byte_special_values(element, rng):
    # the packed cols body of 2-byte elements (words kept packed, rescanned, converted in
    # pairs): rounding ties, NaN, +inf, overflow on the final rounding, along an outer
    # axis; a partial column word (inner 40 = 32 + 8 columns of a 128-column block) and
    # a short extent (GPU: 8 rows per thread, 5 chunks); misaligned: element by element
    extent = 9 if SIMULATOR else 40
    half_ulp = 2.0 ** -8 if element is ElementKind.BF16 else 2.0 ** -11
    values = np.round(rng.uniform(-3, 3, (extent, 40)) * 4) / 4
    values[:, 0] = half_ulp  # 1 + k/2 ulp: every odd k a tie (to even)
    values[0, 0] = 1.0
    values[3, 1] = np.nan
    values[4, 2] = np.inf
    values[:, 38] = half_ulp * np.arange(extent)  # in the partial word
    if not SIMULATOR:  # the simulator's NumPy arithmetic warns on overflow (an error)
        if element is ElementKind.BF16:
            # (2^127 - 2^119) + 2^127: finite in f32, halfway between the largest bf16
            # and 2^128: rounds to inf (ties to even); back to finite after -2^127
            values[:3, 3] = (2.0 ** 127 - 2.0 ** 119, 2.0 ** 127, -2.0 ** 127)
        else:
            # 65519 rounds to 65504, 65520 to inf; 80000 (f32) to inf
            values[:4, 3] = (65504.0, 15.0, 1.0, 14480.0)
    x = to_storage(values, element)
    for index, kind in enumerate((ScanKind.CUMSUM, ScanKind.CUMMAX)):
        for reverse in reverses(index):
            plan = check_forward(kind, x, 0, reverse, element)
            assert used_fast(plan)
    plan = check_forward(ScanKind.CUMSUM, x, 0, False, element, place=misaligned)
    assert used_fast(plan)


@pytest.mark.parametrize("element", (ElementKind.BF16, ElementKind.F16) if not SIMULATOR
                         else (ElementKind.BF16,), ids=lambda e: e.name)
def test_fast_indexed_staged_indices(element, rng):
    # full tiles of 2-byte elements stage their int64 indices through shared memory
    # (simulator tile: 32 lanes x 2 words x 4 = 256 elements; GPU: 128): one full tile and
    # a partial one, both directions, NaN (last NaN's index), ties (last index), +-inf;
    # two lines (simulator: one warp each, in turn; GPU: neighbouring warps of a block)
    n = 260
    special = np.array([1.0, 3.0, 3.0, np.nan, 5.0, np.nan, -np.inf, 7.0, np.inf, 2.0])
    values = np.round(rng.uniform(-3, 3, (2, n)) * 4) / 4
    values[0, 100:110] = special
    values[1, 200:210] = special[::-1]
    x = to_storage(values, element)
    for index, kind in enumerate(EXTREMA):
        for reverse in reverses(index):
            plan = check_forward(kind, x, 1, reverse, element, with_indices=True)
            assert used_fast(plan)


@pytest.mark.parametrize("element", FLOAT_ELEMENTS, ids=lambda e: e.name)
@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.name)
def test_backward_lines(kind, element, rng):
    shape, axis = LINES_SHAPE
    for reverse in (False, True):
        check_backward(kind, shape, axis, reverse, element, rng)


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.name)
def test_backward_rows(kind, rng):
    # Cummax/Cummin with a strided dy: the record-flag pre-pass (indexed rows kernel: x
    # and dx collapse) and the generic rows backward, not the fused kernel
    shape, axis = ROWS_SHAPE
    place = ("dy", spaced) if kind in EXTREMA else None
    plan = check_backward(kind, shape, axis, bool(rng.integers(0, 2)), ElementKind.F32, rng,
                          place=place)
    assert not used_fused_backward(plan)


@pytest.mark.parametrize("length", EDGE_LENGTHS)
def test_lengths_around_warp_edges(length, rng):
    # rank 1 along its only axis (rows kernel from 64 on, lines kernel below)
    check_forward(ScanKind.CUMSUM, inputs((length,), ElementKind.F32, rng), 0, False,
                  ElementKind.F32)
    check_forward(ScanKind.CUMMAX, inputs((3, length), ElementKind.BF16, rng), 1, True,
                  ElementKind.BF16, with_indices=True)


def test_workspace_contract(rng):
    """Upstream's contract: ``run`` without the workspace ``select`` sized (or with a
    smaller one) raises WorkspaceTooSmall(needed, got) before anything is written;
    ``max_workspace_bytes=0`` selects the path without one (the same values)."""
    x = inputs((1, 260), ElementKind.F32, rng)
    desc = ScanDescriptor(ScanKind.CUMSUM, (1, 260), 1, element=ElementKind.F32)
    plan = ScanPlan.select(desc)
    assert plan.workspace_size > 0 or not SIMULATOR  # GPU thresholds are larger
    if plan.workspace_size:
        for workspace in (None, device(np.zeros(plan.workspace_size - 1, np.uint8))):
            y = device(poisoned((1, 260), ElementKind.F32))
            with pytest.raises(WorkspaceTooSmall) as raised:
                plan.run(ScanArgs(device(x), y), workspace=workspace)
            assert raised.value.needed == plan.workspace_size
            np.testing.assert_array_equal(host(y).view(np.uint32),
                                          poisoned((1, 260), ElementKind.F32).view(np.uint32))
    plain = ScanPlan.select(desc, PlanPreference(max_workspace_bytes=0))
    assert plain.workspace_size == 0
    _, y_split, _ = run_forward(ScanKind.CUMSUM, x, 1, False, ElementKind.F32,
                                workspace=True)
    _, y_plain, _ = run_forward(ScanKind.CUMSUM, x, 1, False, ElementKind.F32)
    np.testing.assert_allclose(y_split, y_plain, rtol=1e-5, atol=1e-5)


def test_split_paths_with_workspace(rng):
    # few long lines: the two-phase split over blocks (needs the workspace), rows kernel
    # forward and lines kernel forward and backward
    for shape, axis in (((1, 260), 1), ((70, 2), 0)):
        plan = check_forward(ScanKind.CUMMAX, inputs(shape, ElementKind.F32, rng), axis,
                             False, ElementKind.F32, with_indices=True, workspace=True)
        assert plan.workspace_size > 0 or not SIMULATOR  # GPU thresholds are larger
    check_forward(ScanKind.CUMSUM, inputs((70, 2), ElementKind.F16, rng), 0, True,
                  ElementKind.F16, workspace=True)
    for kind in (ScanKind.LOG_CUMSUM_EXP, ScanKind.CUMMIN):
        check_backward(kind, (70, 2), 0, True, ElementKind.F32, rng, workspace=True)


def test_special_values_extrema(rng):
    # NaN propagates and its index is the last NaN; ties pick the last index; +-inf
    values = np.array([[1.0, 3.0, 3.0, np.nan, 5.0, np.nan, -np.inf, 7.0],
                       [-np.inf, -np.inf, 2.0, 2.0, np.inf, 1.0, np.inf, 0.0],
                       [0.0, -0.0, 0.0, -1.0, -1.0, -1.0, 2.0, 2.0]])
    for element in (ElementKind.F32, ElementKind.F16):
        x = to_storage(values, element)
        for kind in EXTREMA:
            for reverse in (False, True):
                check_forward(kind, x, 1, reverse, element, with_indices=True)
                check_backward(kind, x.shape, 1, reverse, element, rng, x_host=x)
    ints = np.array([[5, 5, 2, 7, 7, -3, 7, 1]], dtype=np.int32)
    for kind in EXTREMA:
        check_forward(kind, ints, 1, False, ElementKind.I32, with_indices=True)


@pytest.mark.parametrize("element", (ElementKind.F32, ElementKind.BF16, ElementKind.F64,
                                     ElementKind.I32), ids=lambda e: e.name)
def test_fast_indexed_extrema(element, rng):
    # Cummax/Cummin with indices (and the backward's record-flag pre-pass) on the indexed
    # rows kernel: NaN, ties, +-inf and signed zeros along rows long enough for it, split
    # or not, aligned or not
    special = np.array([[1.0, 3.0, 3.0, np.nan, 5.0, np.nan, -np.inf, 7.0],
                        [-np.inf, -np.inf, 2.0, 2.0, np.inf, 1.0, np.inf, 0.0],
                        [0.0, -0.0, 0.0, -1.0, -1.0, -1.0, 2.0, 2.0]])
    # simulator: one full f32 tile (64 elements a word group) and a partial one; one line
    # of special values, one of quarters (ties)
    n = 72 if SIMULATOR else 1000
    if element.is_float:
        quarters = np.round(rng.uniform(-3, 3, (2, n)) * 4) / 4
        quarters[1, :8] = special[2]
        quarters[0] = np.resize(special, n)
        candidates = [to_storage(quarters, element)]
        if not SIMULATOR:
            candidates.append(to_storage(np.resize(special, (3, n)), element))
    else:
        candidates = [rng.integers(-3, 4, size=(2, n)).astype(element.storage_dtype)]
    for x in candidates:
        for kind in EXTREMA:
            for reverse in reverses(int(kind)):
                workspace = bool(rng.integers(0, 2))
                plan = check_forward(kind, x, 1, reverse, element, with_indices=True,
                                     workspace=workspace)
                assert used_fast(plan)
        plan = check_forward(ScanKind.CUMMAX, x, 1, True, element, with_indices=True,
                             place=misaligned)
        assert used_fast(plan)


# (shape, axis, kind, reverse, workspace): the fused Cummax/Cummin backward along rows
# (extent >= 64) and columns (inner >= 32). Simulator (f32 rows tile 128, cols tile 2
# chunks x 2 rows): rows split in two segments (f32; one bf16 tile), an odd extent
# (element-wise in reverse), columns split (the fix-up pass: one simulated warp per
# column, the costliest simulator case), columns over three outer indices.
# GPU (f32 rows tile 256, cols 8 chunks x 4 rows): the same with larger extents.
_S = SIMULATOR
FUSED_CASES = (
    ((1, 256) if _S else (3, 5000), 1, ScanKind.CUMMAX, False, True),
    ((1, 131) if _S else (5, 1031), 1, ScanKind.CUMMIN, True, False),
    ((40, 33) if _S else (3000, 40), 0, ScanKind.CUMMAX, True, True),
    ((3, 9, 40) if _S else (3, 400, 70), 1, ScanKind.CUMMIN, False, False),
)


def extremum_lines(shape, axis, element, rng, pattern: str) -> np.ndarray:
    """Contiguous x whose lines (along ``axis``) hold special values and ties
    ("special"), or rise (every element a record) or fall (one record: its run crosses
    every tile and segment)."""
    lines = np.round(rng.uniform(-3, 3, np.moveaxis(np.empty(shape), axis, -1).shape) * 2) / 2
    n = lines.shape[-1]
    if pattern == "special":
        special = [1.0, 3.0, 3.0, np.nan, 5.0, np.nan, -np.inf, 7.0, -np.inf, -np.inf, 2.0,
                   2.0, np.inf, 1.0, np.inf, 0.0, 0.0, -0.0, 0.0, -1.0, -1.0, 2.0, 2.0]
        lines[..., 0, :min(n, 23)] = special[:n]
        lines[..., -1, -3:] = np.nan  # a NaN record near the end of a line
    elif pattern == "rise":
        lines = np.broadcast_to(np.arange(n, dtype=np.float64) / 8, lines.shape).copy()
    elif pattern == "fall":
        lines = np.broadcast_to(-np.arange(n, dtype=np.float64) / 8, lines.shape).copy()
    return to_storage(np.ascontiguousarray(np.moveaxis(lines, -1, axis)), element)


@pytest.mark.parametrize("element", (ElementKind.F32, ElementKind.BF16, ElementKind.F16,
                                     ElementKind.F64), ids=lambda e: e.name)
def test_fused_extremum_backward(element, rng):
    # rows and cols kernels, split (workspace) or not, both directions, special values
    # (NaN, ties, +-inf, signed zeros), every element a record or only the first,
    # misaligned pointers (element-wise path). The simulator runs each case once (F16
    # and F64: the rows cases), the GPU every kind, direction and workspace choice.
    patterns = ("special", "rise", "fall")
    cases = FUSED_CASES
    if SIMULATOR and element in (ElementKind.F16, ElementKind.F64):
        cases = cases[1:2]
    if SIMULATOR and element is ElementKind.BF16:
        cases = cases[::2]
    for index, (shape, axis, kind, reverse, workspace) in enumerate(cases):
        variants = [(kind, reverse, workspace)] if SIMULATOR else [
            (k, r, w) for k in EXTREMA for r in (False, True) for w in (False, True)]
        for count, (kind, reverse, workspace) in enumerate(variants):
            pattern = patterns[(index + count) % 3]
            x = extremum_lines(shape, axis, element, rng, pattern)
            plan = check_backward(kind, shape, axis, reverse, element, rng, x_host=x,
                                  workspace=workspace)
            assert used_fused_backward(plan), (shape, axis)
    if element is ElementKind.F32 or not SIMULATOR:
        for shape, axis, *_ in FUSED_CASES[1:3]:
            x = extremum_lines(shape, axis, element, rng, "special")
            plan = check_backward(ScanKind.CUMMAX, shape, axis, True, element, rng,
                                  x_host=x, place=misaligned)
            assert used_fused_backward(plan)


def test_fused_extremum_backward_falls_back(rng):
    # an x whose outer axes are out of order (no uniform pitch) does not collapse: the
    # record-flag pre-pass and the generic backward kernel
    element = ElementKind.F32
    base = extremum_lines((2, 3, 66), 2, element, rng, "special")
    dy = random_values((3, 2, 66), element, rng)
    plan = ScanBackwardPlan.select(ScanBackwardDescriptor(ScanKind.CUMMAX, (3, 2, 66), 2,
                                                          element=element),
                                   _no_workspace(False))
    x = base.swapaxes(0, 1) if SIMULATOR else device(base).swapaxes(0, 1)
    dx = device(poisoned((3, 2, 66), element))
    plan.run(ScanBackwardArgs(device(dy), dx, x))
    assert not used_fused_backward(plan)
    expected, scale = reference_backward(ScanKind.CUMMAX, from_storage(base.swapaxes(0, 1),
                                                                       element),
                                         None, from_storage(dy, element), 2, False)
    check_close(from_storage(host(dx), element), expected, scale, element, 68,
                "CUMMAX backward, outer axes out of order")


def test_special_values_log_cumsum_exp(rng):
    values = np.array([[-np.inf, -np.inf, 0.5, -np.inf, 80.0, -3.0],
                       [-np.inf, -np.inf, -np.inf, -np.inf, -np.inf, 1.0],
                       [1.0, np.inf, 2.0, np.inf, -np.inf, 0.0],
                       [1.0, np.nan, 2.0, 3.0, 4.0, 5.0]])
    for element in (ElementKind.F32, ElementKind.BF16):
        x = to_storage(values, element)
        for reverse in (False, True):
            check_forward(ScanKind.LOG_CUMSUM_EXP, x, 1, reverse, element)
        check_backward(ScanKind.LOG_CUMSUM_EXP, x[:2].shape, 1, False, element, rng,
                       x_host=x[:2])


def test_cumprod_backward_with_zeros(rng):
    values = np.array([[2.0, 0.0, 3.0, -1.5, 0.0, 0.5],
                       [0.0, 1.5, -2.0, 0.75, 1.0, 2.0],
                       [1.25, -0.5, 2.0, 1.0, 0.5, 0.0]])
    for element in (ElementKind.F32, ElementKind.F64, ElementKind.BF16):
        x = to_storage(values, element)
        for reverse in (False, True):
            check_backward(ScanKind.CUMPROD, x.shape, 1, reverse, element, rng, x_host=x)
            check_backward(ScanKind.CUMPROD, x.T.shape, 0, reverse, element, rng,
                           x_host=np.ascontiguousarray(x.T))


def test_integer_wraparound():
    big = np.array([[2**31 - 5, 10, 2**31 - 1, -7]], dtype=np.int64)
    x = big.astype(np.int32) if not SIMULATOR else np.array([[7, -3, 2, 9]], np.int32)
    # the simulator runs NumPy scalars, which warn on overflow; the GPU test wraps
    check_forward(ScanKind.CUMSUM, x, 1, False, ElementKind.I32)
    check_forward(ScanKind.CUMPROD, x, 1, True, ElementKind.I32)
    check_forward(ScanKind.CUMSUM, big if not SIMULATOR else x.astype(np.int64), 1, False,
                  ElementKind.I64)


def test_strided_broadcast_rank1_rank8_axis_len1_empty(rng):
    # a transposed (strided) input and a 0-stride broadcast input
    base = inputs((6, 9), ElementKind.F32, rng)
    check_forward(ScanKind.CUMSUM, base.T, 0, False, ElementKind.F32)
    check_forward(ScanKind.CUMSUM, base[::2, ::3], 1, True, ElementKind.F32)
    row = inputs((1, 7), ElementKind.F32, rng)
    broadcast = np.broadcast_to(row, (5, 7))
    check_forward(ScanKind.CUMSUM, broadcast, 1, False, ElementKind.F32)
    check_forward(ScanKind.CUMMAX, broadcast, 0, False, ElementKind.F32, with_indices=True)
    # rank 1 and rank 8, every axis of a rank-8 shape (lines kernel: short extents)
    check_forward(ScanKind.CUMPROD, inputs((9,), ElementKind.F64, rng, ScanKind.CUMPROD),
                  0, True, ElementKind.F64)
    shape8 = (2, 1, 3, 1, 2, 2, 1, 3)
    x8 = inputs(shape8, ElementKind.F32, rng)
    for axis in range(8):
        check_forward(ScanKind.LOG_CUMSUM_EXP, x8, axis, axis % 2 == 1, ElementKind.F32)
    check_backward(ScanKind.CUMMIN, shape8, 5, False, ElementKind.F32, rng)
    # a scan axis of length 1 is a copy (and its gradient dy)
    check_forward(ScanKind.LOG_CUMSUM_EXP, inputs((4, 1), ElementKind.F16, rng), 1, False,
                  ElementKind.F16)
    check_backward(ScanKind.CUMPROD, (4, 1), 1, False, ElementKind.F32, rng)
    # empty tensors: no launch, nothing written
    for shape in ((0, 5), (5, 0)):
        plan = ScanPlan.select(ScanDescriptor(ScanKind.CUMSUM, shape, 1,
                                              element=ElementKind.F32))
        # NumPy gives empty arrays strides (0, 0), which arrays.py reads as self-overlap;
        # give the empty output row-major strides as torch does
        out = np.lib.stride_tricks.as_strided(np.full(5, np.nan, np.float32), shape,
                                              (4 * max(shape[1], 1), 4))
        plan.run(ScanArgs(device(np.zeros(shape, np.float32)), device(out)))
        assert plan.workspace_size == 0


def test_plan_reports_truthful_sku():
    plan = ScanPlan.select(ScanDescriptor(ScanKind.CUMMAX, (4, 8), 1, element=ElementKind.BF16))
    guarantee = plan.precision_guarantee
    assert guarantee.accumulator is ElementKind.F32
    assert guarantee.deterministic and guarantee.bit_stable_on_same_hardware
    assert plan.sku.op == int(ScanKind.CUMMAX)
    plan64 = ScanBackwardPlan.select(ScanBackwardDescriptor(ScanKind.CUMSUM, (4, 8), 0,
                                                            element=ElementKind.F64))
    assert plan64.precision_guarantee.accumulator is ElementKind.F64


# -- rejections: raised before anything is written --------------------------------------


def _select_raises(exc, **overrides):
    fields = dict(kind=ScanKind.CUMSUM, input_shape=(4, 6), scan_axis=1, reverse=False,
                  element=ElementKind.F32)
    fields.update(overrides)
    with pytest.raises(exc) as info:
        ScanPlan.select(ScanDescriptor(**fields))
    assert str(info.value).startswith("ScanPlan: ")
    with pytest.raises(exc):
        ScanBackwardPlan.select(ScanBackwardDescriptor(**fields))


def test_descriptor_rejections():
    _select_raises(Unsupported, input_shape=(1,) * 9, scan_axis=0)
    _select_raises(InvalidProblem, scan_axis=2)
    _select_raises(InvalidProblem, scan_axis=-1)
    _select_raises(InvalidProblem, input_shape=(4, -6))
    _select_raises(InvalidProblem, input_shape=())
    _select_raises(Unsupported, kind=ScanKind.LOG_CUMSUM_EXP, element=ElementKind.I32)
    _select_raises(Unsupported, element=ElementKind.U8)
    with pytest.raises(Unsupported):  # integer gradients do not exist
        ScanBackwardPlan.select(ScanBackwardDescriptor(ScanKind.CUMSUM, (4, 6), 1,
                                                       element=ElementKind.I32))


def test_argument_rejections_write_nothing(rng):
    shape = (4, 6)
    element = ElementKind.F32
    x = inputs(shape, element, rng)
    plan = ScanPlan.select(ScanDescriptor(ScanKind.CUMMAX, shape, 1, element=element))
    y = device(poisoned(shape, element))
    cases = [
        (InvalidProblem, ScanArgs(device(x.astype(np.float64)), y)),  # dtype mismatch
        (InvalidProblem, ScanArgs(device(x[:, :5]), y)),  # shape mismatch
        (BufferTooSmall, ScanArgs(device(x.reshape(-1)[:20].copy()), y)),  # flat, too small
        (InvalidProblem, ScanArgs(device(x), y, device(poisoned(shape, ElementKind.I32)))),
    ]
    for exc, args in cases:
        with pytest.raises(exc):
            plan.run(args)
    with pytest.raises(InvalidProblem):  # indices only for Cummax/Cummin
        ScanPlan.select(ScanDescriptor(ScanKind.CUMSUM, shape, 1, element=element)).run(
            ScanArgs(device(x), y, device(poisoned(shape, ElementKind.I64))))
    assert np.isnan(host(y)).all()
    for kind, missing in ((ScanKind.CUMPROD, "x"), (ScanKind.CUMPROD, "y"),
                          (ScanKind.CUMMAX, "x"), (ScanKind.LOG_CUMSUM_EXP, "y")):
        bplan = ScanBackwardPlan.select(ScanBackwardDescriptor(kind, shape, 1,
                                                               element=element))
        dx = device(poisoned(shape, element))
        saved = {"x": device(x), "y": device(x)}
        saved[missing] = None
        with pytest.raises(InvalidProblem, match=f"ScanBackwardPlan: {missing} "):
            bplan.run(ScanBackwardArgs(device(x), dx, saved["x"], saved["y"]))
        assert np.isnan(host(dx)).all()
    # dx overlapping a saved input
    bplan = ScanBackwardPlan.select(ScanBackwardDescriptor(ScanKind.CUMMAX, shape, 1,
                                                           element=element))
    shared = device(x.copy())
    with pytest.raises(InvalidProblem, match="overlap"):
        bplan.run(ScanBackwardArgs(device(x), shared, shared))


# -- GPU only: torch forward and autograd, large shapes -----------------------------------

def _torch_forward(torch, kind, x, axis, reverse):
    if reverse:
        x = x.flip(axis)
    indices = None
    if kind is ScanKind.CUMSUM:
        y = torch.cumsum(x, axis, dtype=x.dtype)
    elif kind is ScanKind.CUMPROD:
        y = torch.cumprod(x, axis, dtype=x.dtype)
    elif kind is ScanKind.CUMMAX:
        y, indices = torch.cummax(x, axis)
    elif kind is ScanKind.CUMMIN:
        y, indices = torch.cummin(x, axis)
    else:
        y = torch.logcumsumexp(x, axis)
    if reverse:
        y = y.flip(axis)
        if indices is not None:
            indices = (x.shape[axis] - 1 - indices).flip(axis)
    return y, indices


GPU_SHAPES = [((64, 1000), 1), ((1000, 64), 0), ((7, 4099), 1), ((3, 300, 5), 1),
              ((2, 70000), 1), ((20000, 3), 0)]


@pytest.mark.gpu
@pytest.mark.parametrize("element", FLOAT_ELEMENTS + INT_ELEMENTS, ids=lambda e: e.name)
@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.name)
def test_gpu_forward_against_torch(kind, element, rng):
    torch = torch_or_skip()
    if kind is ScanKind.LOG_CUMSUM_EXP and element in INT_ELEMENTS:
        pytest.skip("LogCumsumExp is float-only")
    for shape, axis in GPU_SHAPES:
        reverse = bool(rng.integers(0, 2))
        x_host = inputs(shape, element, rng, kind)
        if kind in EXTREMA and element.is_float:
            x_host = to_storage(np.round(from_storage(x_host, element) * 4) / 4, element)
        if kind is ScanKind.CUMPROD and element.is_float:
            # factors +-(1 +- 2^-7): products of 70000 stay far inside every range (near
            # the overflow threshold a parallel and a sequential product may differ by
            # finite vs inf, both right to rounding)
            x_host = to_storage(rng.choice([-1, 1], size=shape) * (
                1 + rng.choice([-1, 0, 1], size=shape) / 128), element)
        for workspace in (False, True):
            _, y, indices = run_forward(kind, x_host, axis, reverse, element,
                                        with_indices=kind in EXTREMA, workspace=workspace)
            expected, expected_indices = _torch_forward(torch, kind, device(x_host), axis,
                                                        reverse)
            what = f"{kind.name} {element.name} {shape} axis={axis} reverse={reverse}"
            if element in INT_ELEMENTS or kind in EXTREMA:
                np.testing.assert_array_equal(from_storage(y, element),
                                              from_storage(host(expected), element), what)
            else:
                x = from_storage(x_host, element)
                ref, _, scale = reference_forward(kind, x, axis, reverse)
                # torch rounds too: allow our bound around the float64 reference for both
                check_close(from_storage(y, element), rounded(ref, element), scale, element,
                            shape[axis], what)
                # torch itself, for the record: its half kernels round the running value
                # to half at every step, so it gets the bound of a half accumulator
                torch_scale = scale * 4
                torch_got = from_storage(host(expected), element)
                torch_ref = rounded(ref, element)
                if element in (ElementKind.F16, ElementKind.BF16):
                    torch_scale = scale * TOLERANCE[element][0] / 2.0 ** -24
                    # ... and overflows early near the top of the range (Cumprod)
                    near_max = np.abs(ref) > 0.25 * float(np.finfo(np.float16).max) \
                        if element is ElementKind.F16 else np.zeros(ref.shape, bool)
                    torch_got = np.where(near_max, 0.0, torch_got)
                    torch_ref = np.where(near_max, 0.0, torch_ref)
                check_close(torch_got, torch_ref, torch_scale, element, shape[axis],
                            "torch " + what)
            if indices is not None:
                np.testing.assert_array_equal(indices, host(expected_indices),
                                              "indices " + what)


@pytest.mark.gpu
@pytest.mark.parametrize("element", FLOAT_ELEMENTS, ids=lambda e: e.name)
@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.name)
def test_gpu_backward_against_autograd(kind, element, rng):
    torch = torch_or_skip()
    for shape, axis in [((16, 300), 1), ((300, 16), 0), ((2, 1500), 1)]:
        reverse = bool(rng.integers(0, 2))
        x_host = inputs(shape, element, rng, kind)
        if kind is ScanKind.CUMPROD:
            # factors +-(1 +- 2^-7): products of 1500 stay inside the f16 range (factors in
            # [0.8, 1.25] can overflow it, and the saved f16 y is then inf)
            x_host = to_storage(rng.choice([-1, 1], size=shape) * (
                1 + rng.choice([-1, 0, 1], size=shape) / 128), element)
        if kind in EXTREMA:
            x_host = np.moveaxis(distinct_inputs(np.moveaxis(np.empty(shape), axis, -1).shape,
                                                 element, rng), -1, axis)
        dy_host = random_values(shape, element, rng)
        _, y_host, _ = run_forward(kind, x_host, axis, reverse, element)
        _, dx = run_backward(kind, dy_host, x_host, y_host, axis, reverse, element)
        x_t = device(x_host).double().requires_grad_()
        y_t, _ = _torch_forward(torch, kind, x_t, axis, reverse)
        y_t.backward(device(dy_host).double())
        expected = x_t.grad.cpu().numpy()  # float64 autograd (extrema: inputs without ties)
        x, y, dy = (from_storage(a, element) for a in (x_host, y_host, dy_host))
        _, scale = reference_backward(kind, x, y, dy, axis, reverse)
        if kind is ScanKind.LOG_CUMSUM_EXP and element in (ElementKind.F16, ElementKind.BF16):
            scale = scale * (1 + TOLERANCE[element][0] / 2.0 ** -24 / shape[axis])
        check_close(from_storage(dx, element), rounded(expected, element), scale, element,
                    shape[axis] + 2, f"{kind.name} backward {element.name} {shape}")


@pytest.mark.gpu
@pytest.mark.parametrize("element", FLOAT_ELEMENTS, ids=lambda e: e.name)
def test_gpu_fused_extremum_backward_against_autograd(element, rng):
    # the fused kernel (rows and cols, split through the workspace or not) against
    # float64 torch autograd on inputs without ties, and bit-identical across runs
    torch = torch_or_skip()
    for shape, axis in (((64, 1000), 1), ((1000, 96), 0), ((2, 1500), 1), ((1500, 64), 0)):
        for kind in EXTREMA:
            reverse = bool(rng.integers(0, 2))
            x_host = np.moveaxis(distinct_inputs(np.moveaxis(np.empty(shape), axis, -1).shape,
                                                 element, rng), -1, axis)
            x_host = np.ascontiguousarray(x_host)
            dy_host = random_values(shape, element, rng)
            x_t = device(x_host).double().requires_grad_()
            y_t, _ = _torch_forward(torch, kind, x_t, axis, reverse)
            y_t.backward(device(dy_host).double())
            expected = x_t.grad.cpu().numpy()
            _, scale = reference_backward(kind, from_storage(x_host, element), None,
                                          from_storage(dy_host, element), axis, reverse)
            for workspace in (False, True):
                runs = [run_backward(kind, dy_host, x_host, None, axis, reverse, element,
                                     workspace) for _ in range(2)]
                assert used_fused_backward(runs[0][0])
                what = f"{kind.name} backward {element.name} {shape} axis={axis} " \
                    f"reverse={reverse} workspace={workspace}"
                np.testing.assert_array_equal(runs[0][1].view(np.uint8),
                                              runs[1][1].view(np.uint8), what)
                check_close(from_storage(runs[0][1], element), rounded(expected, element),
                            scale, element, shape[axis] + 2, what)


@pytest.mark.gpu
def test_gpu_more_than_2_pow_31_elements():
    torch = torch_or_skip()
    # f16 values in {-1, 0, 1}: every partial sum is an exact small integer in f32, so the
    # result equals torch's f32 cumsum rounded to f16 exactly.
    for shape, axis in (((4, (1 << 29) + 3), 0), (((1 << 21) + 1, 1024), 1)):
        x = torch.randint(-1, 2, shape, device="cuda", dtype=torch.int8).half()
        plan = ScanPlan.select(ScanDescriptor(ScanKind.CUMSUM, shape, axis,
                                              element=ElementKind.F16))
        y = torch.full_like(x, float("nan"))
        plan.run(ScanArgs(x, y))
        expected = torch.cumsum(x.float(), axis).half()
        assert torch.equal(y, expected), shape
        del x, y, expected
        torch.cuda.empty_cache()


@pytest.mark.gpu
@pytest.mark.parametrize("kind", [ScanKind.CUMSUM, ScanKind.CUMPROD, ScanKind.CUMMAX,
                                  ScanKind.LOG_CUMSUM_EXP], ids=lambda k: k.name)
@pytest.mark.parametrize("axis", [0, 1])
def test_torch_memo_matches_the_checked_path(kind, axis):
    """After the first run a torch layout goes through the plans' LayoutMemo (no array
    checks, a replay of the recorded launches): fresh tensors of the same layout give
    bit-identical results, forward (with indices for Cummax) and backward; overlapping
    operands with a memoised layout are still rejected before any launch; in place (one
    address for two operands) is never memoised and still right."""
    torch = torch_or_skip()
    shape = (37, 70)
    forward = ScanPlan.select(ScanDescriptor(kind, shape, axis, element=ElementKind.BF16))
    backward = ScanBackwardPlan.select(ScanBackwardDescriptor(kind, shape, axis,
                                                              element=ElementKind.BF16))
    x = (1 + 0.01 * torch.randn(shape, device="cuda")).to(torch.bfloat16)
    dy = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    with_indices = kind is ScanKind.CUMMAX
    results = []
    for _ in range(3):  # the first call checks, the others take the memo
        y = torch.full(shape, float("nan"), device="cuda", dtype=torch.bfloat16)
        dx = torch.full(shape, float("nan"), device="cuda", dtype=torch.bfloat16)
        indices = torch.full(shape, -1, device="cuda", dtype=torch.int64) \
            if with_indices else None
        x_copy, dy_copy = x.clone(), dy.clone()
        forward.run(ScanArgs(x_copy, y, indices))
        backward.run(ScanBackwardArgs(dy_copy, dx, x_copy, y))
        results.append((y, dx, indices))
    assert forward.memoised_layouts == 1 and backward.memoised_layouts == 1
    for y, dx, indices in results[1:]:
        assert torch.equal(y, results[0][0]) and torch.equal(dx, results[0][1])
        if with_indices:
            assert torch.equal(indices, results[0][2])
    # the same layout keys with overlapping operands: rejected, nothing written
    buffer = torch.zeros(2 * x.numel(), device="cuda", dtype=torch.bfloat16)
    y_over = buffer[:x.numel()].view(shape)
    dx_over = torch.full(shape, 7.0, device="cuda", dtype=torch.bfloat16)
    if with_indices:
        wide = torch.zeros(x.numel(), device="cuda", dtype=torch.int64)
        with pytest.raises(InvalidProblem, match="indices"):
            forward.run(ScanArgs(x, wide.view(torch.bfloat16)[:x.numel()].view(shape),
                                 wide.view(shape)))
    if kind is ScanKind.CUMSUM:  # no saved tensors; dx may alias dy (not memoised)
        in_place = dy.clone()
        backward.run(ScanBackwardArgs(in_place, in_place))
        assert torch.equal(in_place, results[0][1])
    else:  # x overlapping dx
        with pytest.raises(InvalidProblem, match="dx"):
            backward.run(ScanBackwardArgs(dy, dx_over, dx_over, y_over))
        assert torch.equal(dx_over, torch.full_like(dx_over, 7.0))
    # in place forward (y is x): not memoised, same values as the checked path
    z = x.clone()
    forward.run(ScanArgs(z, z))
    assert torch.equal(z, results[0][0])
