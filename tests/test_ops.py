"""Functional API (framework-agnostic path): Numba device arrays in, Numba arrays out,
results equal to the plans' and to NumPy references; the plan cache is reused."""

from __future__ import annotations

import numpy as np
import pytest

from baracuda_numba import ops
from baracuda_numba.errors import InvalidProblem
from baracuda_numba.testing import TOLERANCE, assert_close, random_values, to_device, to_host
from baracuda_numba.types import ElementKind, ReduceKind, ScanKind

F32 = ElementKind.F32
RTOL, ATOL = TOLERANCE[F32]


def test_write_slice_and_cache_reuse(rng):
    dest_host = random_values((4, 6), F32, rng)
    source_host = random_values((2, 3), F32, rng)
    dest = to_device(dest_host)
    ops.clear_plan_cache()
    assert ops.write_slice(dest, to_device(source_host), (1, 2)) is dest
    ops.write_slice(dest, to_device(source_host), (1, 2))
    assert ops.cache_info()["plans"] == 1
    expected = dest_host.copy()
    expected[1:3, 2:5] = source_host
    np.testing.assert_array_equal(to_host(dest), expected)


@pytest.mark.parametrize("dim", [0, -1])
def test_scans(dim, rng):
    x_host = random_values((3, 5), F32, rng, 0.5, 1.5)
    x = to_device(x_host)
    ref = x_host.astype(np.float64)
    assert_close(to_host(ops.cumsum(x, dim)), np.cumsum(ref, axis=dim), 4 * RTOL, ATOL,
                 "cumsum")
    assert_close(to_host(ops.cumprod(x, dim)), np.cumprod(ref, axis=dim), 8 * RTOL, ATOL,
                 "cumprod")
    assert_close(to_host(ops.logcumsumexp(x, dim)),
                 np.log(np.cumsum(np.exp(ref), axis=dim)), 8 * RTOL, ATOL, "logcumsumexp")
    values, indices = ops.cummax(x, dim)
    assert_close(to_host(values), np.maximum.accumulate(ref, axis=dim), 0, 0, "cummax")
    assert to_host(indices).dtype == np.int64
    dy_host = random_values((3, 5), F32, rng)
    dx = ops.scan_backward(ScanKind.CUMSUM, to_device(dy_host), dim)
    expected = np.flip(np.cumsum(np.flip(dy_host.astype(np.float64), dim), dim), dim)
    assert_close(to_host(dx), expected, 4 * RTOL, ATOL, "cumsum backward")


@pytest.mark.parametrize("keepdim", [False, True])
def test_reductions(keepdim, rng):
    x_host = random_values((4, 6), F32, rng)
    x = to_device(x_host)
    ref = x_host.astype(np.float64)
    checks = [
        (ops.sum, np.sum), (ops.mean, np.mean), (ops.amax, np.max), (ops.amin, np.min),
        (ops.norm, lambda a, axis, keepdims: np.sqrt(np.sum(a * a, axis=axis,
                                                            keepdims=keepdims))),
        (ops.logsumexp, lambda a, axis, keepdims: np.log(np.sum(np.exp(a), axis=axis,
                                                                keepdims=keepdims))),
    ]
    for fn, reference in checks:
        got = to_host(fn(x, 1, keepdim=keepdim))
        assert_close(got, reference(ref, axis=1, keepdims=keepdim), 8 * RTOL, 8 * ATOL,
                     fn.__name__)
    got = to_host(ops.var(x, 0, correction=0, keepdim=keepdim))
    assert_close(got, np.var(ref, axis=0, keepdims=keepdim), 16 * RTOL, 16 * ATOL, "var")
    arg = to_host(ops.argmax(x, 1, keepdim=keepdim))
    np.testing.assert_array_equal(arg, np.argmax(ref, axis=1).reshape(arg.shape))
    dy = to_device(np.ones((4, 1), np.float32))
    dx = to_host(ops.reduce_backward(ReduceKind.MEAN, dy, (4, 6), 1))
    assert_close(dx, np.full((4, 6), 1 / 6), RTOL, ATOL, "mean backward")


def test_rope_round_trip(rng):
    x_host = random_values((1, 2, 3, 8), F32, rng)
    x = to_device(x_host)
    for pairing in ("interleaved", "half_split"):
        y = ops.rope(x, pairing=pairing)
        back = ops.rope_backward(y, pairing=pairing)
        assert_close(to_host(back), x_host, 8 * RTOL, 8 * ATOL, f"rope {pairing}")


def test_fractional_max_pool(rng):
    x_host = random_values((1, 2, 5, 5), F32, rng)
    samples = to_device(rng.uniform(0, 1, (1, 2, 2)).astype(np.float32))
    y, indices = ops.fractional_max_pool2d(to_device(x_host), 2, (3, 3), samples)
    flat = x_host.reshape(-1)
    np.testing.assert_array_equal(to_host(y), flat[to_host(indices)])
    dx = to_host(ops.fractional_max_pool2d_backward(to_device(np.ones((1, 2, 3, 3),
                                                                      np.float32)),
                                                    indices, (1, 2, 5, 5), 2))
    expected = np.zeros(flat.size)
    np.add.at(expected, to_host(indices).reshape(-1), 1.0)
    np.testing.assert_array_equal(dx.reshape(-1), expected)


def test_bad_dim_rejected(rng):
    with pytest.raises(ValueError, match="dim = 2 is out of range"):
        ops.cumsum(to_device(random_values((3, 4), F32, rng)), 2)


@pytest.mark.parametrize("shape", [(), (1,), (4, 1), (1, 1, 1), (3, 0, 2), (2, 3, 4), (5,)])
def test_torch_allocator_template_matches_torch_empty(shape):
    """The functional layer allocates torch outputs of a new shape with
    ``torch.empty_like(template)``: same shape, strides, dtype and device as
    ``torch.empty(shape)``, and the template itself holds at most one element (runs with
    CPU tensors, so wherever torch is installed)."""
    torch = pytest.importorskip("torch")
    from baracuda_numba._frameworks import allocator

    like = torch.zeros(7, 9, dtype=torch.float32)
    for element, dtype in ((ElementKind.BF16, torch.bfloat16), (ElementKind.I64, torch.int64)):
        alloc = allocator(like, shape, element)
        out, reference = alloc(like), torch.empty(shape, dtype=dtype)
        assert (out.shape, out.stride(), out.dtype, out.device) == (
            reference.shape, reference.stride(), reference.dtype, reference.device)
        assert alloc(like).data_ptr() != out.data_ptr() or out.numel() == 0  # fresh each call
        assert alloc.template.untyped_storage().nbytes() <= dtype.itemsize


# -- several axes at once (torch's ``dim`` tuples, None, ()) --------------------------------

_MULTI_CASES = [  # shape, dim, whether the axes collapse into one view (no copy)
    ((2, 3, 4, 5), (-2, -1), True),   # mean(-2, -1) of NCHW
    ((3, 4, 5), (0, 1), True),        # sum((0, 1)) of [B, S, D]
    ((3, 4, 5), (0, 2), False),       # apart: permuted copy
    ((3, 4, 5), None, True),          # every axis
    ((3, 4, 5), (), True),            # torch: () means every axis
    ((3, 1, 5), (1,), True),          # an extent-1 axis
    ((4, 1, 5), (0, 2), True),        # only an extent-1 axis between: one view
]


def _np_reduce(name, a, axis, keepdims, correction=1):
    if name == "var":
        return np.var(a, axis=axis, keepdims=keepdims, ddof=correction)
    if name == "std":
        return np.std(a, axis=axis, keepdims=keepdims, ddof=correction)
    if name == "norm":
        return np.sqrt(np.sum(a * a, axis=axis, keepdims=keepdims))
    if name == "logsumexp":
        return np.log(np.sum(np.exp(a), axis=axis, keepdims=keepdims))
    return {"sum": np.sum, "mean": np.mean, "amax": np.max, "amin": np.min}[name](
        a, axis=axis, keepdims=keepdims)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # var of one element: 0 / 0 = NaN
@pytest.mark.parametrize("shape,dim,collapses", _MULTI_CASES, ids=str)
def test_multi_axis_reductions(shape, dim, collapses, rng):
    """Every kind torch reduces over several axes, against NumPy float64, keepdim or not;
    the layout (one view, or the permuted copy) from ``ops.axis_layout``."""
    x_host = random_values(shape, F32, rng)
    x = to_device(x_host)
    ref = x_host.astype(np.float64)
    axes = ops.reduce_axes(dim, len(shape), "test")
    layout = ops.axis_layout(shape, tuple(s // 4 for s in x_host.strides), axes)
    assert (layout.perm is None) == collapses
    np_axis = tuple(axes)
    for name in ("sum", "mean", "amax", "amin", "norm", "logsumexp", "var", "std"):
        for keepdim in (False, True):
            kwargs = {"correction": 1.5} if name in ("var", "std") else {}
            got = to_host(getattr(ops, name)(x, dim, keepdim=keepdim, **kwargs))
            expected = _np_reduce(name, ref, np_axis, keepdim, 1.5)
            assert got.shape == expected.shape, (name, keepdim)
            assert_close(got, expected, 16 * RTOL, 16 * ATOL, f"{name} {dim}")


@pytest.mark.parametrize("shape,dim,collapses", _MULTI_CASES[:3] + _MULTI_CASES[6:], ids=str)
def test_multi_axis_backward(shape, dim, collapses, rng):
    """``reduce_backward`` over several axes (a view, or the permuted copy and a permuted
    ``dx``) against float64: Sum, Mean, Var (correction 0) and Prod-free kinds."""
    x_host = random_values(shape, F32, rng)
    ref = x_host.astype(np.float64)
    axes = ops.reduce_axes(dim, len(shape), "test")
    keep = tuple(1 if d in axes else n for d, n in enumerate(shape))
    dy_host = random_values(keep, F32, rng)
    n = int(np.prod([shape[d] for d in axes]))
    x = to_device(x_host)
    for kind, expected in (
            (ReduceKind.SUM, np.broadcast_to(dy_host, shape)),
            (ReduceKind.MEAN, np.broadcast_to(dy_host, shape) / n),
            (ReduceKind.VAR, dy_host * 2 * (ref - ref.mean(axis=axes, keepdims=True)) / n)):
        y = ops.var(x, dim, correction=0, keepdim=True) if kind is ReduceKind.VAR else None
        dx = ops.reduce_backward(kind, to_device(dy_host), shape, dim,
                                 x=x if y is not None else None, y=y, correction=0)
        assert_close(np.ascontiguousarray(to_host(dx)), expected, 16 * RTOL, 16 * ATOL,
                     f"{kind.name} backward {dim}")


def test_multi_axis_arg_and_rejections(rng):
    """argmax / argmin with dim None: the flat index, as torch (a transposed input too);
    a repeated axis, a tuple for prod and a bad dim type are rejected."""
    x_host = random_values((3, 4, 5), F32, rng)
    x = to_device(x_host)
    assert int(to_host(ops.argmax(x))) == int(np.argmax(x_host))
    assert to_host(ops.argmin(x, keepdim=True)).shape == (1, 1, 1)
    assert int(to_host(ops.argmin(x))) == int(np.argmin(x_host))
    with pytest.raises(InvalidProblem, match="more than once"):
        ops.sum(x, (0, -3))
    with pytest.raises(InvalidProblem, match="torch.prod"):
        ops.prod(x, (0, 1))
    with pytest.raises(InvalidProblem, match="must be an int"):
        ops.amax(x, (0, 1.0))


def test_axis_layout_is_one_launch_where_axes_collapse():
    """The pure layout rule, without launching: adjacent reduced axes with merging
    strides become one axis of a view; apart or unmergeable, a permuted copy."""
    nchw = (64, 256, 56, 56)
    strides = (256 * 56 * 56, 56 * 56, 56, 1)
    assert ops.axis_layout(nchw, strides, (2, 3)) == ops.AxisLayout(
        None, (64, 256, 3136), 2, (64, 256, 1, 1))
    assert ops.axis_layout((8, 4096, 4096), (4096 * 4096, 4096, 1), (0, 1)) == \
        ops.AxisLayout(None, (32768, 4096), 0, (1, 1, 4096))
    # H and W transposed: the run does not merge, so a copy in (kept, reduced) order
    transposed = ops.axis_layout(nchw, (256 * 56 * 56, 56 * 56, 1, 56), (2, 3))
    assert transposed.perm == (0, 1, 2, 3) and transposed.shape == (64 * 256, 3136)
    assert ops.axis_layout((3, 4, 5), (20, 5, 1), (0, 2)).perm == (1, 0, 2)
    assert ops.reduce_axes((), 3, "sum") == (0, 1, 2) == ops.reduce_axes(None, 3, "sum")
    assert ops.reduce_axes(-1, 0, "sum") == ()
