"""Functional API (framework-agnostic path): Numba device arrays in, Numba arrays out,
results equal to the plans' and to NumPy references; the plan cache is reused."""

from __future__ import annotations

import numpy as np
import pytest

from baracuda_numba import ops
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
