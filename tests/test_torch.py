"""PyTorch integration (GPU): gradcheck in f64 for every differentiable op, parity with
torch's own ops in f32/bf16, torch.compile without graph breaks, CUDA-graph capture,
CuPy in -> CuPy out, and a tiny model that trains like its pure-PyTorch twin."""

from __future__ import annotations

import math

import pytest
from conftest import SIMULATOR, cupy_or_skip

pytestmark = pytest.mark.gpu

if not SIMULATOR:
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F  # noqa: N812

    import baracuda_numba.torch as bt
    from baracuda_numba import ops


def _x(*shape, dtype=None, low=-2.0, high=2.0):
    dtype = dtype or torch.float64
    return (torch.rand(*shape, device="cuda", dtype=torch.float64) * (high - low) + low).to(
        dtype).requires_grad_()


def _torch_rope(x, positions, base, pairing):
    d = x.shape[-1]
    inv = base ** (-torch.arange(0, d, 2, device=x.device, dtype=torch.float64) / d)
    pos = positions.to(torch.float64) if positions is not None else torch.arange(
        x.shape[2], device=x.device, dtype=torch.float64)
    theta = pos[:, None] * inv[None, :]
    cos, sin = theta.cos().to(x.dtype), theta.sin().to(x.dtype)
    if pairing == "interleaved":
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).flatten(-2)
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


GRADCHECKS = {
    "cumsum": lambda x: bt.cumsum(x, 1),
    "cumsum_reverse": lambda x: bt.cumsum(x, 0, reverse=True),
    "cumprod": lambda x: bt.cumprod(x, 1),
    "logcumsumexp": lambda x: bt.logcumsumexp(x, 1),
    "cummax": lambda x: bt.cummax(x, 1)[0],
    "cummin": lambda x: bt.cummin(x, 0)[0],
    "sum": lambda x: bt.sum(x, 1),
    "mean": lambda x: bt.mean(x, 0, keepdim=True),
    "amax": lambda x: bt.amax(x, 1),
    "amin": lambda x: bt.amin(x, 0),
    "prod": lambda x: bt.prod(x, 1),
    "norm": lambda x: bt.norm(x, 1),
    "logsumexp": lambda x: bt.logsumexp(x, 1),
    "var": lambda x: bt.var(x, 1, correction=1),
    "std": lambda x: bt.std(x, 0, correction=0),
}


@pytest.mark.parametrize("name", sorted(GRADCHECKS))
def test_gradcheck_f64(name):
    x = _x(4, 7)
    assert torch.autograd.gradcheck(GRADCHECKS[name], (x,), eps=1e-6, atol=1e-7)


@pytest.mark.parametrize("pairing", ["interleaved", "half_split"])
def test_gradcheck_rope(pairing):
    x = _x(2, 3, 5, 8)
    positions = torch.randint(0, 1000, (5,), device="cuda")
    assert torch.autograd.gradcheck(lambda t: bt.rope(t, positions=positions, pairing=pairing),
                                    (x,), eps=1e-6, atol=1e-7)


@pytest.mark.parametrize("dims", [2, 3])
def test_gradcheck_fractional_max_pool(dims):
    shape = (2, 3) + (7,) * dims
    x = _x(*shape)
    samples = torch.rand(2, 3, dims, device="cuda", dtype=torch.float64)
    fn = bt.fractional_max_pool2d if dims == 2 else bt.fractional_max_pool3d
    assert torch.autograd.gradcheck(lambda t: fn(t, 2, (4,) * dims, _random_samples=samples),
                                    (x,), eps=1e-6, atol=1e-7)


PARITY = [
    ("cumsum", lambda x: bt.cumsum(x, -1), lambda x: torch.cumsum(x, -1)),
    ("cumprod", lambda x: bt.cumprod(x, 0), lambda x: torch.cumprod(x, 0)),
    ("logcumsumexp", lambda x: bt.logcumsumexp(x, -1), lambda x: torch.logcumsumexp(x, -1)),
    ("cummax", lambda x: bt.cummax(x, -1)[0], lambda x: torch.cummax(x, -1)[0]),
    ("sum", lambda x: bt.sum(x, -1), lambda x: x.sum(-1)),
    ("mean", lambda x: bt.mean(x, 0), lambda x: x.mean(0)),
    ("amax", lambda x: bt.amax(x, -1), lambda x: x.amax(-1)),
    ("logsumexp", lambda x: bt.logsumexp(x, -1), lambda x: torch.logsumexp(x, -1)),
    ("var", lambda x: bt.var(x, -1), lambda x: x.var(-1)),
    ("std", lambda x: bt.std(x, 0), lambda x: x.std(0)),
    ("norm", lambda x: bt.norm(x, -1), lambda x: torch.linalg.vector_norm(x, dim=-1)),
]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("name,ours,theirs", PARITY, ids=[p[0] for p in PARITY])
def test_matches_torch(name, ours, theirs, dtype):
    """Outputs and gradients vs torch computed in f64 from the same (rounded) inputs;
    ours must be at least as close as torch's own low-precision result, within tolerance."""
    tdtype = getattr(torch, dtype)
    low = 0.5 if name == "cumprod" else -2.0
    x = _x(64, 96, dtype=tdtype, low=low, high=1.5 if name == "cumprod" else 2.0)
    x64 = x.detach().to(torch.float64).requires_grad_()
    y, y64 = ours(x), theirs(x64)
    grad = torch.randn_like(y64)
    (gx,) = torch.autograd.grad(y, x, grad.to(tdtype))
    (gx64,) = torch.autograd.grad(y64, x64, grad)
    tol = {torch.float32: 1e-5, torch.bfloat16: 2e-2}[tdtype]
    scale = y64.abs().max().clamp_min(1.0)
    assert (y.to(torch.float64) - y64).abs().max() <= tol * scale, name
    # amax's gradient splits ties equally on purpose (JAX's rule; torch's amax too, but
    # ties among bf16 inputs rounded from f64 differ from the f64 twin's). cummax sends
    # it to the returned index, as torch. bf16 inputs are full of ties, so compare amax's
    # gradient only in f32 (random f32 values do not tie).
    if name != "amax" or tdtype == torch.float32:
        gscale = gx64.abs().max().clamp_min(1.0)
        assert (gx.to(torch.float64) - gx64).abs().max() <= 4 * tol * gscale, name


def test_rope_matches_reference_and_grad():
    """f32 vs an f64 reference: theta = pos * inv_freq is rounded to f32 (as the issue
    prescribes), an angle error of about pos * 6e-8, so positions stay below 2048 here
    (tests/test_rope.py models that rounding exactly for positions up to 1e6)."""
    x = _x(2, 4, 16, 32, dtype=torch.float32)
    positions = torch.randint(0, 2048, (16,), device="cuda")
    for pairing in ("interleaved", "half_split"):
        x64 = x.detach().double().requires_grad_()
        y = bt.rope(x, positions=positions, pairing=pairing)
        y64 = _torch_rope(x64, positions, 10000.0, pairing)
        # |x| <= 2 and |g| <~ 4: 2048 * 6e-8 rad * 4 = 5e-4 worst case
        assert (y.double() - y64).abs().max() < 5e-4
        g = torch.randn_like(y)
        (gx,) = torch.autograd.grad(y, x, g)
        (gx64,) = torch.autograd.grad(y64, x64, g.double())
        assert (gx.double() - gx64).abs().max() < 5e-3


def _three_ops(x, q):
    a = bt.cumsum(x, -1)
    b = bt.logsumexp(a, -1, keepdim=True)
    return bt.rope(q) * b.mean(), a - b


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch._dynamo.explain's own
def test_torch_compile_has_no_graph_breaks():
    x = torch.randn(8, 64, device="cuda")
    q = torch.randn(2, 4, 8, 16, device="cuda")
    explanation = torch._dynamo.explain(_three_ops)(x, q)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    compiled = torch.compile(_three_ops, fullgraph=True)
    for got, expected in zip(compiled(x, q), _three_ops(x, q)):
        torch.testing.assert_close(got, expected)


def test_cuda_graph_capture_of_functional_ops():
    x = torch.randn(16, 128, device="cuda")
    q = torch.randn(2, 4, 8, 16, device="cuda")
    _three_ops(x, q)  # warm up: plans selected and kernels compiled outside capture
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        out = _three_ops(x, q)
    for _ in range(2):
        x.normal_()
        q.normal_()
        graph.replay()
        torch.cuda.synchronize()
        for got, expected in zip(out, _three_ops(x, q)):
            torch.testing.assert_close(got, expected)


def _layouts(dtype):
    """Four torch layouts of one shape (8, 33): contiguous, transposed (dense, so
    ``empty_like`` keeps its strides), a column slice (strided, pointer 12 bytes past an
    aligned one in f32) and a contiguous view one element past an aligned pointer."""
    return {
        "contiguous": torch.randn(8, 33, device="cuda").to(dtype),
        "transposed": torch.randn(33, 8, device="cuda").to(dtype).t(),
        "sliced": torch.randn(8, 40, device="cuda").to(dtype)[:, 3:36],
        "offset": torch.randn(8 * 33 + 1, device="cuda").to(dtype)[1:].view(8, 33),
    }


FAST_CALLS = {
    "cumsum_1": (lambda x: ops.cumsum(x, 1), lambda x: torch.cumsum(x, 1)),
    "cumsum_0_reverse": (lambda x: ops.cumsum(x, 0, reverse=True),
                         lambda x: torch.cumsum(x.flip(0), 0).flip(0)),
    "cummax_1": (lambda x: ops.cummax(x, 1)[0], lambda x: torch.cummax(x, 1)[0]),
    "cummin_0_indices": (lambda x: ops.cummin(x, 0)[1].to(torch.float64),
                         lambda x: torch.cummin(x, 0)[1].to(torch.float64)),
    "sum_1": (lambda x: ops.sum(x, 1), lambda x: x.sum(1)),
    "amax_0_keepdim": (lambda x: ops.amax(x, 0, keepdim=True), lambda x: x.amax(0, True)),
    "var_1": (lambda x: ops.var(x, 1), lambda x: x.var(1)),
}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_functional_layout_launches(dtype):
    """The functional layer's repeated-call path (``ops._core.fast_launch``: the launch kept per
    input layout, no ``run``) gives the checked path's results bit for bit, for four
    layouts of one shape visited in turn (each its own key), with fresh data per call."""
    tdtype = getattr(torch, dtype)
    tol = {torch.float32: 1e-5, torch.bfloat16: 2e-2}[tdtype]
    ops.clear_plan_cache()
    layouts = _layouts(tdtype)
    for name, (ours, theirs) in FAST_CALLS.items():
        for _round in range(3):
            for label, x in layouts.items():
                x.copy_(torch.randn(x.shape, device="cuda").to(tdtype))
                first, again = ours(x), ours(x)
                assert torch.equal(first, again), (name, label)
                # no ties in the f32 index check; bf16 values tie, indices then differ
                if name.endswith("indices") and tdtype != torch.float32:
                    continue
                expected = theirs(x.to(torch.float64))
                scale = expected.abs().max().clamp_min(1.0)
                assert (first.to(torch.float64) - expected).abs().max() <= tol * scale, \
                    (name, label)
    kept = ops.cache_info()["launches"]
    assert len(kept) == len(FAST_CALLS) and all(n == len(layouts) for n in kept), kept


def test_cupy_in_cupy_out():
    cp = cupy_or_skip()
    x = cp.random.standard_normal((6, 9)).astype(cp.float32)
    y = ops.cumsum(x, 1)
    assert isinstance(y, cp.ndarray)
    cp.testing.assert_allclose(y, cp.cumsum(x, 1), rtol=1e-5, atol=1e-5)
    s = ops.logsumexp(x, 0)
    assert isinstance(s, cp.ndarray) and s.shape == (9,)
    values, indices = ops.cummax(x, 0)
    assert isinstance(indices, cp.ndarray) and indices.dtype == cp.int64


def test_tiny_model_trains_like_pytorch():
    class _Tiny(torch.nn.Module):
        """q/k projections with RoPE, attention-like scores, logsumexp softmax, cumsum pool."""

        def __init__(self, ours: bool) -> None:
            super().__init__()
            self.ours = ours
            self.qk = torch.nn.Linear(16, 32)
            self.out = torch.nn.Linear(8, 1)

        def forward(self, x):  # x [B, S, 16]
            q, k = self.qk(x).view(x.shape[0], x.shape[1], 2, 1, 16).unbind(2)
            q, k = q.transpose(1, 2), k.transpose(1, 2)  # [B, 1, S, 16] strided views
            if self.ours:
                q, k = bt.rope(q.contiguous()), bt.rope(k.contiguous())
            else:
                q, k = (_torch_rope(t.contiguous(), None, 10000.0, "interleaved") for t in (q, k))
            scores = (q @ k.transpose(-1, -2)).squeeze(1) / 4.0  # [B, S, S]
            lse = bt.logsumexp(scores, -1, keepdim=True) if self.ours else torch.logsumexp(
                scores, -1, keepdim=True)
            attn = (scores - lse).exp()
            pooled = bt.cumsum(attn, -1) if self.ours else torch.cumsum(attn, -1)
            return self.out(pooled).mean()

    torch.manual_seed(0)
    ours, twin = _Tiny(True).cuda().double(), _Tiny(False).cuda().double()
    twin.load_state_dict(ours.state_dict())
    opt_a = torch.optim.SGD(ours.parameters(), lr=0.1)
    opt_b = torch.optim.SGD(twin.parameters(), lr=0.1)
    data = torch.randn(4, 8, 16, device="cuda", dtype=torch.float64)
    for _ in range(5):
        losses = []
        for model, opt in ((ours, opt_a), (twin, opt_b)):
            opt.zero_grad()
            loss = (model(data) - 1.0) ** 2
            loss.backward()
            opt.step()
            losses.append(loss.item())
        assert abs(losses[0] - losses[1]) <= 1e-9 * max(1.0, abs(losses[1])), losses
    _ = F


# -- several axes at once, Prod's exact gradient, torch's conventions -----------------------

_MULTI_DIMS = [(-2, -1), (0, 1), (0, 2), (1, 3), None, (), 2, (-1,)]


def _all_axes(x, dim):
    return tuple(range(x.dim())) if dim is None or dim == () else dim


_MULTI_KINDS = {
    "sum": (lambda x, d, k: bt.sum(x, d, k), lambda x, d, k: torch.sum(x, d, k)),
    "mean": (lambda x, d, k: bt.mean(x, d, k), lambda x, d, k: torch.mean(x, d, k)),
    "amax": (lambda x, d, k: bt.amax(x, d, k), lambda x, d, k: torch.amax(x, d, k)),
    "amin": (lambda x, d, k: bt.amin(x, d, k), lambda x, d, k: torch.amin(x, d, k)),
    # (): every axis here; torch's norm and logsumexp are given the axes explicitly, and so
    # are var and std: their forward reduces every axis for (), but their autograd formula
    # (var_backward) takes n as the size of the listed axes, 1 for (), a wrong gradient
    "norm": (lambda x, d, k: bt.norm(x, d, k),
             lambda x, d, k: torch.linalg.vector_norm(x, 2, _all_axes(x, d), k)),
    "logsumexp": (lambda x, d, k: bt.logsumexp(x, d, k),
                  lambda x, d, k: torch.logsumexp(x, _all_axes(x, d), k)),
    "var": (lambda x, d, k: bt.var(x, d, correction=1.5, keepdim=k),
            lambda x, d, k: torch.var(x, _all_axes(x, d), correction=1.5, keepdim=k)),
    "std": (lambda x, d, k: bt.std(x, d, correction=0, keepdim=k),
            lambda x, d, k: torch.std(x, _all_axes(x, d), correction=0, keepdim=k)),
}


@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("dim", _MULTI_DIMS, ids=str)
@pytest.mark.parametrize("name", sorted(_MULTI_KINDS))
def test_multi_axis_matches_torch(name, dim, keepdim):
    """Every kind over axis sets (adjacent, apart, all, (), negative, keepdim), forward and
    backward against torch in f64, on a contiguous and a transposed input."""
    ours, theirs = _MULTI_KINDS[name]
    for transpose in (False, True):
        base = _x(3, 4, 5, 6)
        x = base.transpose(1, 2) if transpose else base
        y, expected = ours(x, dim, keepdim), theirs(x, dim, keepdim)
        assert y.shape == expected.shape, (name, dim, keepdim)
        torch.testing.assert_close(y, expected, rtol=1e-10, atol=1e-12)
        grad = torch.randn_like(expected)
        (gx,) = torch.autograd.grad(y, base, grad)
        (gx_ref,) = torch.autograd.grad(expected, base, grad)
        torch.testing.assert_close(gx, gx_ref, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("dtype", ["float64", "float32", "bfloat16"])
@pytest.mark.parametrize("shape,dim", [((6, 64), 1), ((64, 6), 0), ((6, 37), 1),
                                       ((8, 5000), 1), ((5000, 16), 0), ((3000, 512), 0),
                                       ((512, 3000), 1), ((6, 40000), 1)], ids=str)
def test_prod_gradient_with_zeros_matches_torch(shape, dim, dtype):
    """Prod's gradient where lines hold no, one, two and only zeros equals
    torch.autograd's, in the layouts the plan picks for these shapes (rows, columns,
    register-resident, broadcast, split)."""
    tdtype = getattr(torch, dtype)
    # factors near 1: the products of 40000 stay far from f32's underflow
    x = (torch.rand(*shape, device="cuda", dtype=torch.float64) * 0.06 + 0.97)
    x = x * torch.where(torch.rand_like(x) < 0.5, -1.0, 1.0)
    lines = x.movedim(dim, -1)
    lines[1, 3] = 0.0
    lines[2, 0], lines[2, 5] = 0.0, -0.0
    lines[3, :] = 0.0
    lines[4, -1] = 0.0
    x = x.to(tdtype).requires_grad_()
    x64 = x.detach().double().requires_grad_()
    grad = torch.randn(*[1 if d == dim else n for d, n in enumerate(shape)], device="cuda",
                       dtype=torch.float64)
    (gx,) = torch.autograd.grad(bt.prod(x, dim, keepdim=True), x, grad.to(tdtype))
    (gx64,) = torch.autograd.grad(torch.prod(x64, dim, keepdim=True), x64, grad)
    assert torch.isfinite(gx).all()
    # a product of n factors: n roundings of the accumulator (f32 for f32 / bf16), then
    # y and dx each rounded once to the dtype
    n = shape[dim]
    unit = {torch.float64: 2.0 ** -53, torch.float32: 2.0 ** -24, torch.bfloat16: 2.0 ** -8}
    tol = n * (unit[torch.float64] if tdtype == torch.float64 else unit[torch.float32]) \
        + 3 * unit[tdtype]
    torch.testing.assert_close(gx.double(), gx64, rtol=tol, atol=tol * gx64.abs().max())


def _multi_ops(x):
    return (bt.mean(x, (-2, -1), keepdim=True) + bt.sum(x, (0, 1)).sum()
            + bt.var(x, None) + bt.amax(x, (0, 2)).sum())


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch._dynamo.explain's own
def test_torch_compile_multi_axis_has_no_graph_breaks():
    x = torch.randn(2, 3, 4, 5, device="cuda", requires_grad=True)
    explanation = torch._dynamo.explain(_multi_ops)(x)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    compiled = torch.compile(_multi_ops, fullgraph=True)
    got, expected = compiled(x), _multi_ops(x)
    torch.testing.assert_close(got, expected)
    (g1,) = torch.autograd.grad(got.sum(), x)
    (g2,) = torch.autograd.grad(expected.sum(), x)
    torch.testing.assert_close(g1, g2)


def test_torch_conventions():
    """int32 / bool / uint8 sums are int64 (torch's promotion), ``dtype=``, 0-d tensors,
    argmax / argmin with dim None (the flat index), a float correction."""
    for dtype in (torch.int32, torch.bool, torch.uint8):
        x = torch.randint(0, 2, (4, 5), device="cuda").to(dtype)
        y = bt.sum(x, 1)
        assert y.dtype == torch.int64 and torch.equal(y, torch.sum(x, 1))
    x = torch.randn(4, 5, device="cuda")
    assert bt.sum(x, 1, dtype=torch.float64).dtype == torch.float64
    scalar = torch.tensor(3.0, device="cuda")
    for fn in (bt.sum, bt.mean, bt.amax):
        assert fn(scalar).shape == () and fn(scalar).item() == 3.0
        assert fn(scalar, 0).shape == ()
    t = torch.randn(3, 4, 5, device="cuda").transpose(0, 2)
    assert bt.argmax(t).item() == torch.argmax(t).item()
    assert bt.argmin(t, keepdim=True).shape == torch.argmin(t, keepdim=True).shape
    torch.testing.assert_close(bt.var(x, 1, correction=0.5),
                               torch.var(x, 1, correction=0.5))
    ints = torch.randint(-3, 4, (4, 5), device="cuda", dtype=torch.int32)
    assert torch.equal(bt.cumsum(ints, 1), torch.cumsum(ints, 1))  # int64, as torch
    assert bt.cumsum(x, 1, dtype=torch.float64).dtype == torch.float64
    assert bt.cumsum(scalar, 0).shape == () and bt.cummax(scalar, 0)[1].item() == 0


def test_cummax_gradient_goes_to_the_returned_index():
    """Ties (and NaNs) send the gradient where torch's does: the index cummax returns
    (the last of equal winners)."""
    x = torch.tensor([[1.0, 3.0, 3.0, 2.0, 3.0, float("nan"), 1.0, float("nan")],
                      [2.0, 2.0, 2.0, 1.0, 0.0, -0.0, 5.0, 5.0]], device="cuda",
                     requires_grad=True)
    for ours, theirs in ((bt.cummax, torch.cummax), (bt.cummin, torch.cummin)):
        values, indices = ours(x, 1)
        values_ref, indices_ref = theirs(x, 1)
        assert torch.equal(indices, indices_ref)
        grad = torch.arange(1.0, 17.0, device="cuda").reshape(2, 8)
        (gx,) = torch.autograd.grad(values, x, grad)
        (gx_ref,) = torch.autograd.grad(values_ref, x, grad)
        torch.testing.assert_close(gx, gx_ref)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64"])
@pytest.mark.parametrize("dims", [2, 3])
def test_fractional_max_pool_matches_torch(dims, dtype):
    """``bt.fractional_max_pool2d/3d`` equal ``F.fractional_max_pool2d/3d`` given the same
    ``_random_samples`` (torch's dtype and axis order): values, per-plane indices and the
    gradient, with ``output_size`` and ``output_ratio``, batched and unbatched."""
    tdtype = getattr(torch, dtype)
    ours = bt.fractional_max_pool2d if dims == 2 else bt.fractional_max_pool3d
    theirs = F.fractional_max_pool2d if dims == 2 else F.fractional_max_pool3d
    spatial = (13, 11) if dims == 2 else (9, 8, 7)
    for batched in (True, False):
        shape = ((2, 3) if batched else (3,)) + spatial
        x = torch.randn(*shape, device="cuda").to(tdtype).requires_grad_()
        samples = torch.rand(2 if batched else 1, 3, dims, device="cuda", dtype=tdtype)
        for kwargs in ({"output_size": (5,) * dims}, {"output_ratio": (0.5,) * dims}):
            y, idx = ours(x, 2, return_indices=True, _random_samples=samples, **kwargs)
            y_ref, idx_ref = theirs(x, 2, return_indices=True, _random_samples=samples,
                                    **kwargs)
            torch.testing.assert_close(y, y_ref, rtol=0, atol=0)
            assert torch.equal(idx, idx_ref), (batched, kwargs)
            grad = torch.randn_like(y)
            (gx,) = torch.autograd.grad(y, x, grad)
            # where windows overlap torch adds in the input's dtype (atomics: several
            # roundings); here in f32 (f64) with one rounding. So the reference is the exact
            # sum: float64 scatter-add of the gradient at the (equal) indices.
            planes = x.shape[:-dims].numel()
            exact = torch.zeros(planes, math.prod(spatial), dtype=torch.float64,
                                device="cuda")
            exact.scatter_add_(1, idx_ref.reshape(planes, -1),
                               grad.double().reshape(planes, -1))
            # one rounding to the dtype, plus the accumulator's roundings over the at most
            # 2^dims windows that share an element
            unit = {torch.bfloat16: 2.0 ** -8, torch.float32: 2.0 ** -24,
                    torch.float64: 2.0 ** -53}[tdtype]
            acc = 2.0 ** -53 if tdtype == torch.float64 else 2.0 ** -24
            torch.testing.assert_close(gx.double(), exact.reshape(x.shape), rtol=2 * unit,
                                       atol=2 ** dims * acc * float(grad.abs().max()))
            assert ours(x, 2, _random_samples=samples, **kwargs).shape == y.shape


def test_fractional_max_pool_rejects_samples_it_cannot_mean():
    x = torch.randn(2, 3, 9, 9, device="cuda")
    for samples in (torch.rand(2, 3, 2, device="cuda", dtype=torch.float64),  # dtype
                    torch.rand(2, 3, 3, device="cuda"),  # shape
                    torch.rand(3, 2, 2, device="cuda")):  # axis order
        with pytest.raises(ValueError, match="_random_samples"):
            bt.fractional_max_pool2d(x, 2, (4, 4), _random_samples=samples)
    with pytest.raises(ValueError, match="output_size or output_ratio"):
        bt.fractional_max_pool2d(x, 2)
