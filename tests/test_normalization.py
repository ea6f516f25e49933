"""RMSNormPlan / LayerNormPlan and their backwards against NumPy float64 references.

Bounds come from the dtype's unit roundoff (``TOLERANCE``) times the op's conditioning:
an output rounded once (``rtol·|y|``) plus, for sums, ``rtol·Σ|terms|``.
"""

from __future__ import annotations

import types

import numpy as np
import pytest
from conftest import FLOAT_ELEMENTS, TOLERANCE, torch_or_skip

from baracuda_numba.errors import InvalidProblem, Unsupported, WorkspaceTooSmall
from baracuda_numba.plans.normalization import (
    LayerNormArgs,
    LayerNormBackwardArgs,
    LayerNormBackwardDescriptor,
    LayerNormBackwardPlan,
    LayerNormDescriptor,
    LayerNormPlan,
    RMSNormArgs,
    RMSNormBackwardArgs,
    RMSNormBackwardDescriptor,
    RMSNormBackwardPlan,
    RMSNormDescriptor,
    RMSNormPlan,
    choose_launch,
)
from baracuda_numba.testing import (
    SUBNORMAL_SPACING,
    assert_within,
    from_storage,
    poisoned,
    random_values,
    to_device,
    to_host,
    to_storage,
)
from baracuda_numba.types import ElementKind

F32 = ElementKind.F32
STATS = {ElementKind.F64: ElementKind.F64}
_MACHINE_EPS = {ElementKind.F16: 2.0 ** -10, ElementKind.BF16: 2.0 ** -7,
                ElementKind.F32: 2.0 ** -23, ElementKind.F64: 2.0 ** -52}


# -- NumPy float64 references --------------------------------------------------------------

def reference_forward(layer, x, residual, element, weight, bias, eps, offset, k):
    """(y, h, rstd, mean, |terms| of y) in float64; h rounded to ``element`` once."""
    h = x if residual is None else from_storage(to_storage(x + residual, element), element)
    axes = tuple(range(h.ndim - k, h.ndim))
    mean = h.mean(axis=axes, keepdims=True) if layer else np.zeros_like(h[..., :1])
    if layer:
        variance = ((h - mean) ** 2).mean(axis=axes, keepdims=True)
    else:
        variance = (h * h).mean(axis=axes, keepdims=True)
    rstd = 1.0 / np.sqrt(variance + eps)
    y = (h - mean) * rstd
    if weight is not None:
        y = y * (offset + weight)
    if bias is not None:
        y = y + bias
    return y, h, rstd, mean


def y_scale(h, mean, rstd, weight=None, offset=0.0, bias=None):
    """The size of y's terms: (|h| + |mean| + mean(|h|)) · rstd · |offset + w| + |b|.
    LayerNorm's h − mean cancels, so y's error scales with |h|, not with |y|; and the
    computed mean carries the rounding of its sum, which scales with the row's mean |h|,
    not with |mean| (RMSNorm, whose ``mean`` is 0, has no such term)."""
    axes = tuple(d for d in range(h.ndim) if np.shape(mean)[d] == 1 and h.shape[d] > 1)
    row_abs = np.abs(h).mean(axis=axes, keepdims=True) * (np.asarray(mean) != 0)
    scale = (np.abs(h) + np.abs(mean) + row_abs) * rstd
    if weight is not None:
        scale = scale * np.abs(offset + weight)
    return scale + (np.abs(bias) if bias is not None else 0.0)


def y_bound(element, scale):
    """Bound on y's error: two roundings of ``element`` relative to y's terms, and one
    subnormal step (an f16 y below 6e-5 is rounded to a multiple of 2^-24)."""
    return 2 * TOLERANCE[element][0] * scale + SUBNORMAL_SPACING[element]


def reference_backward(layer, dy, h, rstd, mean, weight, offset, dh, k):
    """(dx, dweight, dbias, dx bound terms, dweight terms) in float64."""
    axes = tuple(range(h.ndim - k, h.ndim))
    n = int(np.prod(h.shape[h.ndim - k:]))
    normed = (h - mean) * rstd
    g = dy * (offset + weight) if weight is not None else dy
    mean_g = g.mean(axis=axes, keepdims=True) if layer else 0.0
    mean_gx = (g * normed).mean(axis=axes, keepdims=True)
    dx = rstd * (g - mean_g - normed * mean_gx)
    terms = rstd * (np.abs(g) + np.abs(g).sum(axis=axes, keepdims=True) / n * (1 + layer)
                    + np.abs(normed) * np.abs(g * normed).sum(axis=axes, keepdims=True) / n)
    if dh is not None:
        dx = dx + dh
        terms = terms + np.abs(dh)
    lead = tuple(range(h.ndim - k))
    return (dx, (dy * normed).sum(axis=lead), dy.sum(axis=lead), terms,
            np.abs(dy * normed).sum(axis=lead), np.abs(dy).sum(axis=lead))


# -- running the plans ------------------------------------------------------------------------

def run_forward(layer, element, x, normalized, weight=None, bias=None, residual=None,
                eps=None, offset=0.0, weight_element=None, block=None, y_view=None,
                kernel=None):
    """Run the forward plan on host storage arrays; returns host (y, h, rstd, mean)."""
    shape = x.shape
    k = len(normalized)
    stats_shape = shape[:len(shape) - k] + (1,) * k
    stats = STATS.get(element, F32)
    if layer:
        desc = LayerNormDescriptor(shape, normalized, element, 1e-5 if eps is None else eps,
                                   weight is not None, bias is not None, weight_element,
                                   residual is not None)
        plan = LayerNormPlan.select(desc, block=block, kernel=kernel)
    else:
        desc = RMSNormDescriptor(shape, normalized, element, eps, weight is not None,
                                 weight_element, residual is not None, offset)
        plan = RMSNormPlan.select(desc, block=block, kernel=kernel)
    y = to_device(poisoned(shape, element)) if y_view is None else y_view
    h = to_device(poisoned(shape, element)) if residual is not None else None
    rstd, mean = to_device(poisoned(stats_shape, stats)), to_device(poisoned(stats_shape,
                                                                             stats))
    dev = [None if a is None else to_device(a) for a in (x, weight, bias, residual)]
    if layer:
        plan.run(LayerNormArgs(dev[0], y, mean, rstd, dev[1], dev[2], dev[3], h))
    else:
        plan.run(RMSNormArgs(dev[0], y, rstd, dev[1], dev[3], h))
    return (to_host(y), None if h is None else to_host(h), to_host(rstd),
            to_host(mean) if layer else None)


def run_backward(layer, element, dy, x, rstd, mean, normalized, weight=None, has_bias=False,
                 dh=None, offset=0.0, weight_element=None, block=None, kernel=None,
                 weight_grad=True):
    shape = x.shape
    wk = weight_element or element
    if layer:
        plan = LayerNormBackwardPlan.select(LayerNormBackwardDescriptor(
            shape, normalized, element, weight is not None, has_bias, weight_element,
            dh is not None, weight_grad), block=block, kernel=kernel)
    else:
        plan = RMSNormBackwardPlan.select(RMSNormBackwardDescriptor(
            shape, normalized, element, weight is not None, weight_element, dh is not None,
            offset, weight_grad), block=block, kernel=kernel)
    dx = to_device(poisoned(shape, element))
    dw = to_device(poisoned(normalized, wk)) if weight is not None and weight_grad else None
    db = to_device(poisoned(normalized, wk)) if has_bias else None
    workspace = to_device(np.zeros(max(plan.workspace_size, 1), np.uint8))
    dev = [None if a is None else to_device(a) for a in (dy, x, rstd, mean, weight, dh)]
    if layer:
        plan.run(LayerNormBackwardArgs(dev[0], dev[1], dev[3], dev[2], dx, dev[4], dw, db,
                                       dev[5]), workspace=workspace)
    else:
        plan.run(RMSNormBackwardArgs(dev[0], dev[1], dev[2], dx, dev[4], dw, dev[5]),
                 workspace=workspace)
    return (to_host(dx), None if dw is None else to_host(dw),
            None if db is None else to_host(db), plan)


def _values(shape, element, rng, low=-2.0, high=2.0):
    stored = random_values(shape, element, rng, low, high)
    return stored, from_storage(stored, element)


# -- the dispatch (CPU) --------------------------------------------------------------------

def test_choose_launch_chunks_depend_on_the_problem_only():
    for rows, n in ((1, 1), (7, 64), (8192, 4096), (4096, 16384), (3, 65536), (1 << 20, 64)):
        choices = [choose_launch(rows, n, True, block) for block in (None, 1024)]
        assert len({(c.rows_per_chunk, c.chunks) for c in choices}) == 1
        choice = choices[0]
        assert choice.chunks * choice.rows_per_chunk >= rows
        assert (choice.chunks - 1) * choice.rows_per_chunk < rows
        assert 2 * choice.chunks * n <= max(1 << 24, 2 * n)
        assert choice.block % 32 == 0 and choice.block * 64 >= n
    assert choose_launch(0, 5, True).chunks == 0
    # the register kernels: bf16 rows of 16-byte units (8 elements)
    forward = choose_launch(8192, 4096, False, vec=8)
    assert (forward.kernel, forward.units) == ("rows_vec", 512)
    assert forward.block * 8 >= forward.units  # at most VEC_MAX_UNITS units a thread
    # rows in pairs without a residual (half the blocks), one at a time with it
    assert (forward.rows_at_once, forward.grid) == (2, 4096)
    assert choose_launch(8191, 4096, False, vec=8).grid == 4096
    assert choose_launch(8192, 4096, False, vec=8, residual=True).rows_at_once == 1
    assert choose_launch(8192, 4096, False, vec=8, pair=False).grid == 8192
    assert choose_launch(8192, 4096, False, vec=8, kernel="rows").rows_at_once == 1
    backward = choose_launch(8192, 16384, True, vec=8)
    assert backward.kernel == "rows_vec" and backward.block * 4 >= backward.units
    assert choose_launch(8192, 65536, True, vec=8).kernel == "rows"  # shared sums too big
    assert choose_launch(8, 4100, False, vec=8).kernel == "rows"  # not whole units
    assert choose_launch(8, 4096, False, vec=8, kernel="rows").kernel == "rows"
    with pytest.raises(ValueError):
        choose_launch(8, 4100, False, vec=8, kernel="rows_vec")
    with pytest.raises(ValueError):
        choose_launch(4, 65536, True, 512)  # 128 columns a thread: too many
    with pytest.raises(ValueError):
        choose_launch(4, 64, False, 48)


# -- forward and backward against the references -------------------------------------------

# (layer, shape, normalized, weight, bias, residual, offset, dh): every option combination
# appears at least once; hidden sizes 1, 7, 33 and 2-3 normalized axes.
_CASES = [
    (False, (3, 33), (33,), True, False, False, 0.0, False),
    (False, (2, 7), (7,), True, False, True, 1.0, True),
    (False, (4, 1), (1,), False, False, False, 0.0, False),
    (False, (2, 3, 4, 3), (4, 3), True, False, True, 0.0, False),
    (True, (3, 33), (33,), True, True, False, 0.0, False),
    (True, (2, 7), (7,), True, True, True, 0.0, True),
    (True, (2, 2, 3, 5), (2, 3, 5), False, False, True, 0.0, True),
    (True, (3, 40), (40,), True, False, False, 0.0, False),
    (True, (2, 9), (9,), False, True, False, 0.0, False),
]


def _check_case(case, element, weight_element, rng, block=None):
    layer, shape, normalized, has_w, has_b, has_r, offset, has_dh = case
    k = len(normalized)
    rtol = TOLERANCE[element][0]
    wk = weight_element or element
    x, xv = _values(shape, element, rng)
    r, rv = _values(shape, element, rng) if has_r else (None, None)
    w, wv = _values(normalized, wk, rng) if has_w else (None, None)
    b, bv = _values(normalized, wk, rng) if has_b else (None, None)
    eps = 1e-5 if layer else None
    ref_eps = 1e-5 if layer else _MACHINE_EPS[element]
    y, h, rstd, mean = run_forward(layer, element, x, normalized, w, b, r, eps, offset,
                                   weight_element, block)
    ey, eh, erstd, emean = reference_forward(layer, xv, rv, element, wv, bv, ref_eps, offset,
                                             k)
    stats_rtol = TOLERANCE[STATS.get(element, F32)][0] * 4
    if has_r:
        assert np.array_equal(h.view(np.uint8), to_storage(eh, element).view(np.uint8))
    assert_within(rstd, erstd, stats_rtol * np.abs(erstd) * 4, "rstd")
    if layer:
        assert_within(mean, emean, stats_rtol * np.abs(xv if rv is None else eh).max() + 0,
                      "mean")
    magnitude = y_scale(eh, emean, erstd, wv, offset, bv)
    assert_within(from_storage(y, element), ey, y_bound(element, magnitude), "y")
    dy, dyv = _values(shape, element, rng)
    dh, dhv = _values(shape, element, rng) if has_dh else (None, None)
    stored_h = h if has_r else x
    dx, dw, db, _ = run_backward(layer, element, dy, stored_h, rstd, mean if layer else None,
                                 normalized, w, has_b, dh, offset, weight_element, block)
    rstd_v = rstd.astype(np.float64)
    mean_v = mean.astype(np.float64) if layer else 0.0
    edx, edw, edb, terms, dw_terms, db_terms = reference_backward(
        layer, dyv, from_storage(stored_h, element), rstd_v, mean_v, wv, offset, dhv, k)
    assert_within(from_storage(dx, element), edx, 4 * rtol * (terms + 1e-3), "dx")
    weight_rtol = max(TOLERANCE[wk][0], TOLERANCE[STATS.get(element, F32)][0])
    if has_w:
        assert_within(from_storage(dw, wk), edw, 4 * weight_rtol * (dw_terms + 1e-3), "dw")
    if has_b:
        assert_within(from_storage(db, wk), edb, 4 * weight_rtol * (db_terms + 1e-3), "db")
    return dw, db


@pytest.mark.parametrize("case", _CASES)
def test_forward_backward_f32(case, rng):
    _check_case(case, F32, None, rng)


@pytest.mark.parametrize("element", FLOAT_ELEMENTS)
@pytest.mark.parametrize("case", [_CASES[1], _CASES[5]])
def test_forward_backward_elements(case, element, rng):
    _check_case(case, element, None, rng)


@pytest.mark.parametrize("element", [ElementKind.BF16, ElementKind.F16, ElementKind.F64])
def test_f32_weights(element, rng):
    _check_case(_CASES[4], element, F32, rng)


@pytest.mark.parametrize("element", [ElementKind.F16, ElementKind.BF16, F32])
@pytest.mark.parametrize("layer", [False, True])
def test_register_kernel_and_generic_agree(element, layer, rng):
    """The register kernel (two units for thread 0: 33 units in 32 threads) and the
    generic kernel on the same inputs, both against the reference; a misaligned view
    falls back to the generic kernel."""
    vec = 16 // element.byte_width
    n = 33 * vec
    shape, normalized = (2, n), (n,)
    x, xv = _values(shape, element, rng)
    r, rv = _values(shape, element, rng)
    w, wv = _values(normalized, F32, rng)
    plan = (LayerNormPlan if layer else RMSNormPlan).select(
        LayerNormDescriptor(shape, normalized, element, 1e-5, True, False, F32, True) if layer
        else RMSNormDescriptor(shape, normalized, element, 1e-5, True, F32, True, 1.0))
    assert plan.choice.kernel == "rows_vec" and plan.choice.units == 33
    expected, eh, erstd, emean = reference_forward(layer, xv, rv, element, wv, None, 1e-5,
                                                   0.0 if layer else 1.0, 1)
    rtol = TOLERANCE[element][0]
    bound = y_bound(element, y_scale(eh, emean, erstd, wv, 0.0 if layer else 1.0))
    dy, dyv = _values(shape, element, rng)
    dh, dhv = _values(shape, element, rng)
    offset = 0.0 if layer else 1.0
    for kernel in ("rows_vec", "rows"):
        y, h, rstd, mean = run_forward(layer, element, x, normalized, w, None, r, 1e-5,
                                       offset, F32, kernel=kernel)
        assert np.array_equal(h.view(np.uint8), to_storage(eh, element).view(np.uint8))
        assert_within(from_storage(y, element), expected, bound, kernel)
        dx, dw, _, plan = run_backward(layer, element, dy, h, rstd, mean if layer else None,
                                       normalized, w, False, dh, offset, F32, kernel=kernel)
        assert plan.choice.kernel == kernel
        edx, edw, _, terms, dw_terms, _ = reference_backward(
            layer, dyv, eh, rstd.astype(np.float64), mean.astype(np.float64) if layer else 0.0,
            wv, offset, dhv, 1)
        assert_within(from_storage(dx, element), edx, 4 * rtol * (terms + 1e-3), f"dx {kernel}")
        assert_within(dw, edw, 4 * TOLERANCE[F32][0] * (dw_terms + 1e-3), f"dw {kernel}")
    wide = to_device(np.concatenate([x, x[:, :1]], axis=1))  # rows start 2-4 bytes apart
    y_dev = to_device(poisoned(shape, element))
    stats = [to_device(poisoned((2, 1), F32)) for _ in range(2)]
    plain = (LayerNormPlan if layer else RMSNormPlan).select(
        LayerNormDescriptor(shape, normalized, element, 1e-5) if layer
        else RMSNormDescriptor(shape, normalized, element, 1e-5))
    view = wide[:, 1:]
    if layer:
        plain.run(LayerNormArgs(view, y_dev, *stats))
    else:
        plain.run(RMSNormArgs(view, y_dev, stats[0]))
    shifted = np.concatenate([x[:, 1:], x[:, :1]], axis=1)
    expected, sh, srstd, smean = reference_forward(layer, from_storage(shifted, element), None,
                                                   element, None, None, 1e-5, 0.0, 1)
    assert_within(from_storage(to_host(y_dev), element), expected,
                  y_bound(element, y_scale(sh, smean, srstd)), "misaligned")


@pytest.mark.parametrize("element", [ElementKind.BF16, F32])
@pytest.mark.parametrize("layer", [False, True])
def test_row_pairs_match_single_rows(element, layer, rng):
    """The forward register kernel's row pairs (no residual; 5 rows: two pairs and a row
    alone, over a grid-stride loop in the simulator) give the bits of one row a block,
    and both the reference."""
    vec = 16 // element.byte_width
    n = 33 * vec
    shape, normalized = (5, n), (n,)
    x, xv = _values(shape, element, rng)
    w, wv = _values(normalized, F32, rng)
    b, bv = _values(normalized, F32, rng)
    offset = 0.0 if layer else 1.0
    results = []
    for pair in (None, False):
        if layer:
            plan = LayerNormPlan.select(LayerNormDescriptor(shape, normalized, element, 1e-5,
                                                            True, True, F32), pair=pair)
        else:
            plan = RMSNormPlan.select(RMSNormDescriptor(shape, normalized, element, 1e-5,
                                                        True, F32, False, offset), pair=pair)
        assert plan.choice.rows_at_once == (1 if pair is False else 2)
        y, rstd, mean = (to_device(poisoned(s, e)) for s, e in (
            (shape, element), ((5, 1), F32), ((5, 1), F32)))
        if layer:
            plan.run(LayerNormArgs(to_device(x), y, mean, rstd, to_device(w), to_device(b)))
        else:
            plan.run(RMSNormArgs(to_device(x), y, rstd, to_device(w)))
        results.append([to_host(a) for a in (y, rstd, mean)])
    for single, paired in zip(results[1], results[0][:2 + layer]):
        assert np.array_equal(single.view(np.uint8), paired.view(np.uint8))
    expected, eh, erstd, emean = reference_forward(layer, xv, None, element, wv,
                                                   bv if layer else None, 1e-5, offset, 1)
    bound = y_bound(element, y_scale(eh, emean, erstd, wv, offset, bv if layer else None))
    assert_within(from_storage(results[0][0], element), expected, bound, "pairs")


def test_weight_gradients_bit_identical_across_blocks_and_reruns(rng):
    """dw/db of the same inputs at blocks of 32, 64 and 96 threads and a rerun: the same
    bits (the row chunks and each column's order are fixed by the problem)."""
    shape, normalized = (9, 40), (40,)
    x, dy, w = (random_values(s, F32, rng) for s in (shape, shape, normalized))
    _, _, rstd, mean = run_forward(True, F32, x, normalized, w, w)
    results = [run_backward(True, F32, dy, x, rstd, mean, normalized, w, True, block=block)
               for block in (32, 64, 96, 96)]
    assert results[0][3].choice.chunks > 1
    for _dx, dw, db, _ in results[1:]:
        assert np.array_equal(dw.view(np.uint32), results[0][1].view(np.uint32))
        assert np.array_equal(db.view(np.uint32), results[0][2].view(np.uint32))
    assert np.array_equal(results[2][0].view(np.uint32), results[3][0].view(np.uint32))


@pytest.mark.parametrize("layer", [False, True])
@pytest.mark.parametrize("element, n", [(F32, 40), (ElementKind.BF16, 48)])
def test_backward_without_weight_gradient(layer, element, n, rng):
    """``weight_grad=False``: the same dx bits (and db) as with dweight, no dweight (the
    register kernel for bf16 rows of whole units, the generic one for f32 rows of 40), a
    workspace only for db; a dweight given is rejected."""
    shape, normalized = (7, n), (n,)
    x, dy, w = (random_values(s, element, rng) for s in (shape, shape, normalized))
    _, _, rstd, mean = run_forward(layer, element, x, normalized, w, w if layer else None)
    full = run_backward(layer, element, dy, x, rstd, mean, normalized, w, layer)
    light = run_backward(layer, element, dy, x, rstd, mean, normalized, w, layer,
                         weight_grad=False)
    assert light[3].choice.kernel == full[3].choice.kernel
    assert np.array_equal(light[0].view(np.uint8), full[0].view(np.uint8))
    assert light[1] is None
    if layer:
        assert np.array_equal(light[2].view(np.uint8), full[2].view(np.uint8))
    else:
        assert light[3].workspace_size == 0
    plan = light[3]
    dev = to_device(dy)
    with pytest.raises(InvalidProblem, match="dweight"):
        if layer:
            plan.run(LayerNormBackwardArgs(dev, to_device(x), to_device(mean), to_device(rstd),
                                           to_device(poisoned(shape, element)), to_device(w),
                                           to_device(poisoned(normalized, element)),
                                           to_device(poisoned(normalized, element))))
        else:
            plan.run(RMSNormBackwardArgs(dev, to_device(x), to_device(rstd),
                                         to_device(poisoned(shape, element)), to_device(w),
                                         to_device(poisoned(normalized, element))))


# The simulator runs kernels on NumPy scalars: inf·0 and inf - inf warn there.
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_nan_inf_and_zero_rows(rng):
    x = rng.uniform(-2, 2, (4, 8)).astype(np.float32)
    x[0, 3] = np.nan
    x[1, 5] = np.inf
    x[2] = 0.0
    y, _, rstd, _ = run_forward(False, F32, x, (8,))
    with np.errstate(all="ignore"):
        expected, *_ = reference_forward(False, x.astype(np.float64), None, F32, None, None,
                                         _MACHINE_EPS[F32], 0.0, 1)
    assert np.isnan(y[0]).all()  # NaN spreads through the row's sum
    assert np.isnan(y[1, 5]) and (y[1, np.arange(8) != 5] == 0).all()  # rstd = 1/inf = 0
    assert np.array_equal(y[2], np.zeros(8, np.float32))  # 0 · 1/sqrt(eps)
    assert_within(y, expected, 4e-6 * np.abs(np.nan_to_num(expected)) + 1e-7, "rows")


def test_strided_input_and_output(rng):
    base = random_values((3, 4, 20), F32, rng)
    x = base[:, 1:3, ::2]  # outer and inner strides both non-trivial
    y_big = to_device(poisoned((3, 4, 20), F32))
    y_host_full = run_forward(True, F32, np.ascontiguousarray(x), (10,))[0]
    plan = LayerNormPlan.select(LayerNormDescriptor((3, 2, 10), (10,), F32))
    big = to_device(base)
    stats = to_device(poisoned((3, 2, 1), F32)), to_device(poisoned((3, 2, 1), F32))
    plan.run(LayerNormArgs(big[:, 1:3, ::2], y_big[:, 1:3, ::2], *stats))
    got = to_host(y_big)
    assert np.array_equal(got[:, 1:3, ::2], y_host_full)
    untouched = np.ones(got.shape, bool)
    untouched[:, 1:3, ::2] = False
    assert np.isnan(got[untouched]).all()


def test_rank_8(rng):
    shape = (1, 2, 1, 1, 2, 1, 3, 4)
    x, xv = _values(shape, F32, rng)
    y, _, _, _ = run_forward(False, F32, x, (3, 4))
    expected, *_ = reference_forward(False, xv, None, F32, None, None, _MACHINE_EPS[F32],
                                     0.0, 2)
    assert_within(y, expected, 4e-6 * np.abs(expected) + 1e-7, "rank 8")


def test_empty():
    x = np.zeros((0, 5), np.float32)
    y, _, _, _ = run_forward(True, F32, x, (5,))
    assert y.shape == (0, 5)
    w = np.ones(5, np.float32)
    dx, dw, db, _ = run_backward(True, F32, x, x, np.zeros((0, 1), np.float32),
                                 np.zeros((0, 1), np.float32), (5,), w, True)
    assert np.array_equal(dw, np.zeros(5, np.float32))  # a sum over no rows
    assert np.array_equal(db, np.zeros(5, np.float32))


def test_ops_rms_norm_residual_gemma_and_backward(rng):
    """The functional layer: (y, h, rstd) with a residual and offset 1, then
    (dx, dweight) with dh, against the references."""
    from baracuda_numba import ops

    shape, n = (3, 16), 16
    x, xv = _values(shape, F32, rng)
    r, rv = _values(shape, F32, rng)
    w, wv = _values((n,), F32, rng)
    y, h, rstd = ops.rms_norm(to_device(x), n, to_device(w), residual=to_device(r),
                              offset=1.0, return_stats=True)
    ey, eh, erstd, emean = reference_forward(False, xv, rv, F32, wv, None, _MACHINE_EPS[F32],
                                             1.0, 1)
    assert_within(to_host(y), ey, 2e-6 * y_scale(eh, emean, erstd, wv, 1.0), "y")
    dy, dyv = _values(shape, F32, rng)
    dx, dw = ops.rms_norm_backward(to_device(dy), h, rstd, n, to_device(w), dh=to_device(dy),
                                   offset=1.0)
    edx, edw, _, terms, dw_terms, _ = reference_backward(
        False, dyv, to_host(h).astype(np.float64), to_host(rstd).astype(np.float64), 0.0, wv,
        1.0, dyv, 1)
    assert_within(to_host(dx), edx, 4e-6 * (terms + 1e-3), "dx")
    assert_within(to_host(dw), edw, 4e-6 * (dw_terms + 1e-3), "dw")


# -- rejections -----------------------------------------------------------------------------

@pytest.mark.parametrize("desc, error", [
    (RMSNormDescriptor((4, 8), (4,), F32), InvalidProblem),          # not a suffix
    (RMSNormDescriptor((4, 8), (), F32), InvalidProblem),            # no axis
    (RMSNormDescriptor((4, 8), (8,), ElementKind.I32), Unsupported),
    (RMSNormDescriptor((4, 8), (8,), F32, eps=0.0), InvalidProblem),
    (RMSNormDescriptor((4, 8), (8,), F32, eps=-1e-5), InvalidProblem),
    (RMSNormDescriptor((4, 8), (8,), F32, eps=float("nan")), InvalidProblem),
    (RMSNormDescriptor((4, 8), (8,), F32, offset=1.0), InvalidProblem),  # no weight
    (RMSNormDescriptor((4, 8), (8,), ElementKind.BF16, has_weight=True,
                       weight_element=ElementKind.F16), Unsupported),
    (LayerNormDescriptor((4, 8), (8,), F32, eps=0.0), InvalidProblem),
    (RMSNormDescriptor((1,) * 9, (1,), F32), Unsupported),
])
def test_select_rejects(desc, error):
    plan_cls = LayerNormPlan if isinstance(desc, LayerNormDescriptor) else RMSNormPlan
    with pytest.raises(error, match=plan_cls.name):
        plan_cls.select(desc)


def test_backward_rejects_too_wide_rows():
    with pytest.raises(Unsupported, match="RMSNormBackwardPlan: normalized_shape"):
        RMSNormBackwardPlan.select(RMSNormBackwardDescriptor((2, 70000), (70000,), F32))


def test_run_rejects_before_writing(rng):
    plan = RMSNormPlan.select(RMSNormDescriptor((3, 8), (8,), F32, has_weight=True))
    x = to_device(random_values((3, 8), F32, rng))
    y = to_device(poisoned((3, 8), F32))
    rstd = to_device(poisoned((3, 1), F32))
    bad = [
        RMSNormArgs(x, y, rstd, to_device(np.ones(7, np.float32))),             # weight length
        RMSNormArgs(x, y, rstd, to_device(np.ones(8, np.float64))),             # weight dtype
        RMSNormArgs(x, y, rstd, None),                                          # weight missing
        RMSNormArgs(to_device(np.ones((3, 9), np.float32)), y, rstd,
                    to_device(np.ones(8, np.float32))),                         # x shape
        RMSNormArgs(to_device(np.ones((3, 8), np.float64)), y, rstd,
                    to_device(np.ones(8, np.float32))),                         # x dtype
        RMSNormArgs(x, y, to_device(poisoned((3, 1), ElementKind.F64)),
                    to_device(np.ones(8, np.float32))),                         # rstd dtype
    ]
    for args in bad:
        with pytest.raises(InvalidProblem, match="RMSNormPlan"):
            plan.run(args)
    assert np.isnan(to_host(y)).all() and np.isnan(to_host(rstd)).all()
    layered = LayerNormPlan.select(LayerNormDescriptor((3, 2, 4), (2, 4), F32))
    wide = to_device(random_values((3, 2, 8), F32, rng))  # rows of 4 at a pitch of 8
    y3 = to_device(poisoned((3, 2, 4), F32))
    stats = to_device(poisoned((3, 1, 1), F32)), to_device(poisoned((3, 1, 1), F32))
    with pytest.raises(Unsupported, match="LayerNormPlan: x strides"):
        layered.run(LayerNormArgs(wide[:, :, :4], y3, *stats))
    assert np.isnan(to_host(y3)).all()


def test_in_place_and_partial_overlap(rng):
    """y may be x itself (each element read before its thread writes it); an output
    partly over another argument is rejected before anything is written."""
    x = random_values((3, 16), F32, rng)
    expected, *_ = reference_forward(False, x.astype(np.float64), None, F32, None, None,
                                     _MACHINE_EPS[F32], 0.0, 1)
    for kernel in ("rows_vec", "rows"):
        plan = RMSNormPlan.select(RMSNormDescriptor((3, 16), (16,), F32), kernel=kernel)
        both = to_device(x)
        plan.run(RMSNormArgs(both, both, to_device(poisoned((3, 1), F32))))
        assert_within(to_host(both), expected, 4e-6 * np.abs(expected) + 1e-7, kernel)
    buffer = to_device(np.concatenate([x.ravel(), np.full(16, np.nan, np.float32)]))
    rstd = to_device(poisoned((3, 1), F32))
    with pytest.raises(InvalidProblem, match="RMSNormPlan: y overlaps x"):
        plan.run(RMSNormArgs(buffer[:48].reshape(3, 16), buffer[16:].reshape(3, 16), rstd))
    assert np.isnan(to_host(rstd)).all()
    assert np.array_equal(to_host(buffer)[:48], x.ravel())


def test_backward_workspace_too_small(rng):
    plan = LayerNormBackwardPlan.select(LayerNormBackwardDescriptor((4, 8), (8,), F32,
                                                                    has_weight=True))
    assert plan.workspace_size > 0
    arrays = [to_device(random_values((4, 8), F32, rng)) for _ in range(2)]
    stats = [to_device(np.ones((4, 1), np.float32)) for _ in range(2)]
    dx, dw = to_device(poisoned((4, 8), F32)), to_device(poisoned((8,), F32))
    args = LayerNormBackwardArgs(arrays[0], arrays[1], stats[0], stats[1], dx,
                                 to_device(np.ones(8, np.float32)), dw)
    for workspace in (None, to_device(np.zeros(plan.workspace_size - 1, np.uint8))):
        with pytest.raises(WorkspaceTooSmall):
            plan.run(args, workspace=workspace)
    assert np.isnan(to_host(dx)).all() and np.isnan(to_host(dw)).all()


class _HostCupy:
    """Stands for a CuPy array over NumPy memory (the simulator's device memory), so that
    the plans' LayoutMemo, which keys torch and CuPy arrays only, runs in the simulator."""

    def __init__(self, array):
        self.array = array
        self.data = types.SimpleNamespace(ptr=array.ctypes.data)
        self.shape, self.strides, self.dtype = array.shape, array.strides, array.dtype
        self.itemsize, self._c_contiguous = array.itemsize, array.flags.c_contiguous
        self.device = types.SimpleNamespace(id=0)  # read where several devices are visible


@pytest.mark.simulator
@pytest.mark.parametrize("kernel", ["rows_vec", "rows"])
def test_layout_memo_matches_the_checked_path(monkeypatch, array_types, rng, kernel):
    """After a checked run, arrays of the same layout take the plans' LayoutMemo (no
    checks: a replay of the recorded launches) and give bit-identical results, forward
    (LayerNorm with residual, weight, bias) and backward (with dh and the workspace);
    overlapping outputs of a memoised layout are still rejected before any launch; in
    place (y is x) is never memoised and still right."""
    array_types(cupy_array=_HostCupy)
    shape, n = (3, 64), (64,)
    fw = LayerNormPlan.select(LayerNormDescriptor(shape, n, F32, 1e-5, True, True, None, True),
                              kernel=kernel)
    bw = LayerNormBackwardPlan.select(LayerNormBackwardDescriptor(
        shape, n, F32, True, True, None, True), kernel=kernel)
    x, r, dy, dh = (random_values(shape, F32, rng) for _ in range(4))
    w, b = random_values(n, F32, rng), random_values(n, F32, rng)
    checked = {"fw": 0, "bw": 0}
    for label, plan in (("fw", fw), ("bw", bw)):
        def counted(args, plan=plan, label=label, check=plan.can_implement):
            checked[label] += 1
            return check(args)
        monkeypatch.setattr(plan, "can_implement", counted)

    def once(wrap):
        y, h, dx = (poisoned(shape, F32) for _ in range(3))
        mean, rstd = poisoned((3, 1), F32), poisoned((3, 1), F32)
        dw, db = poisoned(n, F32), poisoned(n, F32)
        fw.run(LayerNormArgs(*map(wrap, (x, y, mean, rstd, w, b, r, h))))
        bw.run(LayerNormBackwardArgs(*map(wrap, (dy, h, mean, rstd, dx, w, dw, db, dh))),
               workspace=wrap(np.zeros(bw.workspace_size, np.uint8)))
        return y, h, mean, rstd, dx, dw, db

    expected = once(lambda a: a)  # NumPy arrays: never memoised
    runs = [once(_HostCupy) for _ in range(3)]  # the first checks, the others replay
    assert checked == {"fw": 2, "bw": 2}
    for got in runs:
        for e, g in zip(expected, got):
            assert np.array_equal(e.view(np.uint32), g.view(np.uint32))
    # the memoised layout with y over x: rejected, nothing written
    buffer = np.concatenate([x, np.full(shape, np.nan, np.float32)])
    y_over, rstd = buffer[1:4], poisoned((3, 1), F32)
    with pytest.raises(InvalidProblem, match="LayerNormPlan: y overlaps x"):
        fw.run(LayerNormArgs(*map(_HostCupy, (buffer[:3], y_over, poisoned((3, 1), F32),
                                              rstd, w, b, r, poisoned(shape, F32)))))
    assert np.isnan(rstd).all() and np.array_equal(buffer[:3], x)
    # in place (y is x): the checked path each time, the same values
    for _ in range(2):
        both = _HostCupy(x.copy())
        fw.run(LayerNormArgs(both, both, *map(_HostCupy, (
            poisoned((3, 1), F32), poisoned((3, 1), F32), w, b, r, poisoned(shape, F32)))))
        assert np.array_equal(both.array.view(np.uint32), expected[0].view(np.uint32))
    assert checked["fw"] == 5


# -- GPU: torch forward and autograd, big shapes -----------------------------------------------

_TORCH_SHAPES = [(4, 1), (5, 7), (3, 64), (2, 255), (2, 256), (2, 257), (7, 1000),
                 (2, 3, 4096), (3, 65536)]


@pytest.mark.gpu
@pytest.mark.parametrize("layer", [False, True])
@pytest.mark.parametrize("dtype_name, weight_name", [("bfloat16", "bfloat16"),
                                                     ("bfloat16", "float32"),
                                                     ("float16", "float16"),
                                                     ("float32", "float32"),
                                                     ("float64", "float64")])
@pytest.mark.parametrize("shape", _TORCH_SHAPES)
def test_torch_matches_functional(layer, dtype_name, weight_name, shape):
    torch = torch_or_skip()
    import torch.nn.functional as F

    import baracuda_numba.torch as bt

    dtype, wdtype = getattr(torch, dtype_name), getattr(torch, weight_name)
    n = shape[-1]
    x = torch.randn(shape, device="cuda", dtype=dtype, requires_grad=True)
    w = torch.randn(n, device="cuda", dtype=wdtype, requires_grad=True)
    b = torch.randn(n, device="cuda", dtype=wdtype, requires_grad=True)
    dy = torch.randn(shape, device="cuda", dtype=dtype)
    # the reference differentiates float64 leaves: its gradients stay float64 (through
    # x.double() they would come back rounded to x's dtype)
    xd, wd, bd = (t.detach().double().requires_grad_() for t in (x, w, b))
    if layer:
        ours = bt.layer_norm(x, (n,), w, b)
        theirs = F.layer_norm(xd, (n,), wd, bd)
        params, leaves = (x, w, b), (xd, wd, bd)
    else:
        ours = bt.rms_norm(x, (n,), w)
        eps = torch.finfo(dtype).eps
        theirs = F.rms_norm(xd, (n,), wd, eps)
        params, leaves = (x, w), (xd, wd)
    got = torch.autograd.grad(ours, params, dy)
    want = torch.autograd.grad(theirs, leaves, dy.double())
    rtol = {torch.bfloat16: 1.6e-2, torch.float16: 2e-3, torch.float32: 1e-5,
            torch.float64: 1e-12}[dtype]
    scale = max(1.0, n ** 0.5 / 8)
    torch.testing.assert_close(ours.double(), theirs, rtol=rtol, atol=4 * rtol)
    for g, h in zip(got, want):
        bound = rtol * scale * (h.abs().max().item() if g.dim() == 1 else 8)
        torch.testing.assert_close(g.double(), h, rtol=rtol * scale, atol=bound)


@pytest.mark.gpu
@pytest.mark.parametrize("layer", [False, True])
def test_torch_residual_gemma_and_compile(layer):
    torch = torch_or_skip()

    import baracuda_numba.torch as bt

    x = torch.randn(64, 512, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    r = torch.randn(64, 512, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(512, device="cuda", dtype=torch.float32, requires_grad=True)

    def ours(x, r, w):
        if layer:
            return bt.layer_norm(x, 512, w, None, 1e-5, residual=r)
        return bt.rms_norm(x, 512, w, 1e-6, residual=r, offset=1.0)

    def theirs(x, r, w):
        h = (x + r).to(torch.bfloat16).double()
        if layer:
            y = torch.nn.functional.layer_norm(h, (512,), w.double(), None, 1e-5)
        else:
            y = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * (1.0 + w.double())
        return y, h

    dy, dh = torch.randn_like(x), torch.randn_like(x)
    for fn in (ours, torch.compile(ours)):
        y, h = fn(x, r, w)
        ey, eh = theirs(x, r, w)
        torch.testing.assert_close(h.double(), eh, rtol=0, atol=0)
        torch.testing.assert_close(y.double(), ey, rtol=1.6e-2, atol=6e-2)
        got = torch.autograd.grad((y, h), (x, r, w), (dy, dh))
        leaves = tuple(t.detach().double().requires_grad_() for t in (x, r, w))
        want = torch.autograd.grad(theirs(*leaves), leaves, (dy.double(), dh.double()))
        for g, e in zip(got, want):
            torch.testing.assert_close(g.double(), e, rtol=3e-2, atol=3e-2 * e.abs().max())
    # eager with one output in the loss: the other's gradient reaches backward as None
    for used, grad in ((0, dy), (1, dh)):
        got = torch.autograd.grad(ours(x, r, w)[used], (x, r, w), grad, allow_unused=True)
        leaves = tuple(t.detach().double().requires_grad_() for t in (x, r, w))
        want = torch.autograd.grad(theirs(*leaves)[used], leaves, grad.double(),
                                   allow_unused=True)
        for g, e in zip(got, want):
            e = torch.zeros_like(leaves[0][0]) if e is None else e
            g = torch.zeros_like(e) if g is None else g.double()
            torch.testing.assert_close(g, e.expand_as(g), rtol=3e-2,
                                       atol=3e-2 * e.abs().max() + 1e-6)


@pytest.mark.gpu
def test_gpu_big_rows_and_determinism():
    torch = torch_or_skip()

    from baracuda_numba import ops

    x = torch.randn(1 << 17, 64, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(64, device="cuda", dtype=torch.float32)
    y, rstd = ops.rms_norm(x, 64, w, 1e-6, return_stats=True)
    expected = torch.nn.functional.rms_norm(x.float(), (64,), w, 1e-6)
    torch.testing.assert_close(y.float(), expected, rtol=1.6e-2, atol=3e-2)
    dy = torch.randn_like(x)
    first = ops.rms_norm_backward(dy, x, rstd, 64, w)
    for _ in range(3):
        again = ops.rms_norm_backward(dy, x, rstd, 64, w)
        assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])
    # launch configurations: the plan's block override leaves dw's bits unchanged
    from baracuda_numba.plans.normalization import RMSNormBackwardDescriptor as D
    from baracuda_numba.plans.normalization import RMSNormBackwardPlan as P
    for block in (32, 64, 512):
        plan = P.select(D(tuple(x.shape), (64,), ElementKind.BF16, True, F32), block=block)
        dx = torch.empty_like(x)
        dw = torch.empty_like(w)
        ws = torch.empty(plan.workspace_size, dtype=torch.uint8, device="cuda")
        plan.run(RMSNormBackwardArgs(dy, x, rstd, dx, w, dw), workspace=ws)
        assert torch.equal(dw, first[1])


@pytest.mark.gpu
def test_gpu_over_2_31_elements():
    torch = torch_or_skip()

    from baracuda_numba import ops

    rows, n = (1 << 31) // 4096 + 3, 4096
    x = torch.randn(rows, n, device="cuda", dtype=torch.bfloat16)
    y = ops.rms_norm(x, n)
    tail = x[-2:].float()
    expected = tail * torch.rsqrt(tail.pow(2).mean(-1, keepdim=True) + 2.0 ** -7)
    torch.testing.assert_close(y[-2:].float(), expected, rtol=1.6e-2, atol=3e-2)
