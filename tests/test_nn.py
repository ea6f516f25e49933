"""``baracuda_numba.torch.nn``: the modules against float64 formulas written here and the
modules they replace (torch's, transformers').

The constructor / ``state_dict`` compatibility and the rejections run on the CPU (they
need torch, not a GPU: CI, which has no torch, skips them); everything that launches a
kernel is GPU-only.
"""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import pytest
from conftest import TOLERANCE, torch_or_skip

from baracuda_numba.errors import InvalidProblem, Unsupported
from baracuda_numba.types import ElementKind

E = ElementKind


@pytest.fixture
def torch():
    return pytest.importorskip("torch")


@pytest.fixture
def nn(torch):
    from baracuda_numba.torch import nn as ours

    return ours


def tolerance(dtype: Any, scale: float = 1.0) -> dict[str, float]:
    """``assert_close`` keywords: the dtype's tolerance times the op's conditioning."""
    import torch

    kind = {torch.float32: E.F32, torch.bfloat16: E.BF16, torch.float16: E.F16}[dtype]
    rtol, atol = TOLERANCE[kind]
    return {"rtol": rtol * scale, "atol": atol * scale}


def close(got: Any, want: Any, dtype: Any, scale: float = 1.0, equal_nan: bool = False
          ) -> None:
    import torch

    torch.testing.assert_close(got.double(), want.double(), equal_nan=equal_nan,
                               **tolerance(dtype, scale))


# -- constructors, state_dict, rejections (CPU) --------------------------------------------


def test_rms_norm_state_dict_round_trips_with_torch(torch, nn):
    theirs = torch.nn.RMSNorm(24, eps=1e-5)
    with torch.no_grad():
        theirs.weight.normal_()
    ours = nn.RMSNorm(24, eps=1e-5)
    ours.load_state_dict(theirs.state_dict())
    assert torch.equal(ours.weight, theirs.weight)
    back = torch.nn.RMSNorm(24)
    back.load_state_dict(ours.state_dict())
    assert list(ours.state_dict()) == ["weight"]
    assert ours.normalized_shape == theirs.normalized_shape == (24,)
    assert nn.RMSNorm((4, 6), elementwise_affine=False).weight is None


def test_rms_norm_matches_llama_constructor(torch, nn):
    pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    theirs = LlamaRMSNorm(16, eps=1e-5)
    ours = nn.RMSNorm(16, 1e-5)
    assert ours.variance_epsilon == theirs.variance_epsilon == 1e-5
    ours.load_state_dict(theirs.state_dict())
    gemma = nn.GemmaRMSNorm(16)
    assert gemma.offset == 1.0 and torch.equal(gemma.weight, torch.zeros(16))


def test_layer_norm_state_dict_matches_torch(torch, nn):
    theirs = torch.nn.LayerNorm((3, 8), eps=1e-6)
    ours = nn.LayerNorm((3, 8), eps=1e-6)
    assert list(ours.state_dict()) == list(theirs.state_dict()) == ["weight", "bias"]
    ours.load_state_dict(theirs.state_dict())
    assert list(nn.LayerNorm(8, bias=False).state_dict()) == ["weight"]


def test_swiglu_mlp_has_llamas_parameter_names(torch, nn):
    config = SimpleNamespace(hidden_size=8, intermediate_size=12, hidden_act="silu",
                             mlp_bias=False)
    mlp = nn.SwiGLUMLP(config)
    assert {k: tuple(v.shape) for k, v in mlp.state_dict().items()} == {
        "gate_proj.weight": (12, 8), "up_proj.weight": (12, 8), "down_proj.weight": (8, 12)}
    assert nn.SwiGLUMLP(hidden_size=8, intermediate_size=4, bias=True).up_proj.bias is not None
    gemma = nn.GeGLUMLP(SimpleNamespace(hidden_size=8, intermediate_size=4))
    assert (gemma.gated_op, gemma.approximate) == ("geglu", "tanh")
    with pytest.raises(Unsupported, match="SwiGLUMLP: activation 'relu2'"):
        nn.SwiGLUMLP(hidden_size=8, intermediate_size=4, activation="relu2")


def test_cross_entropy_loss_constructor_and_rejections(torch, nn):
    weight = torch.rand(5)
    loss = nn.CrossEntropyLoss(weight, ignore_index=2, label_smoothing=0.1, z_loss=1e-4)
    assert list(loss.state_dict()) == list(torch.nn.CrossEntropyLoss(weight).state_dict())
    with pytest.warns(UserWarning, match="size_average and reduce"):  # as torch's
        assert nn.CrossEntropyLoss(size_average=False).reduction == "sum"
    with pytest.raises(InvalidProblem, match="CrossEntropyLoss: reduction = 'avg'"):
        nn.CrossEntropyLoss(reduction="avg")
    with pytest.raises(InvalidProblem, match="FusedLinearCrossEntropyLoss: reduction"):
        nn.FusedLinearCrossEntropyLoss(reduction="batchmean")
    with pytest.raises(Unsupported, match="class-index targets"):
        loss(torch.randn(3, 5), torch.rand(3, 5))


def test_rotary_rejects_other_layouts(torch, nn):
    q = torch.randn(1, 2, 3, 4)
    with pytest.raises(Unsupported, match="unsqueeze_dim = 0"):
        nn.apply_rotary_pos_emb(q, q, q[0], q[0], unsqueeze_dim=0)


# -- the kernels (GPU) ---------------------------------------------------------------------


def gpu() -> Any:
    return torch_or_skip()


def rms_reference(x, weight, eps, offset=0.0):
    x = x.double()
    y = x * (x.pow(2).mean(-1, keepdim=True) + eps).rsqrt()
    return y if weight is None else y * (offset + weight.double())


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("offset", [0.0, 1.0])
def test_gpu_rms_norm_forward_backward(dtype, offset):
    torch = gpu()
    from baracuda_numba.torch import nn

    dtype = getattr(torch, dtype)
    hidden = 1000  # odd and over a block of 256 threads x 1 element
    module = nn.RMSNorm(hidden, eps=1e-6, offset=offset).cuda().to(dtype)
    with torch.no_grad():
        module.weight.normal_()
    x = torch.randn(3, 7, hidden, device="cuda", dtype=dtype, requires_grad=True)
    y = module(x)
    assert y.dtype == dtype
    x64 = x.detach().double().requires_grad_()
    w64 = module.weight.detach().double().requires_grad_()
    want = rms_reference(x64, w64, 1e-6, offset)
    close(y, want, dtype)
    dy = torch.randn_like(y)
    y.backward(dy)
    want.backward(dy.double())
    close(x.grad, x64.grad, dtype, scale=4)
    # dweight sums 21 rows of products: conditioning sqrt(21)
    close(module.weight.grad, w64.grad, dtype, scale=4 * math.sqrt(21))


@pytest.mark.gpu
def test_gpu_rms_norm_residual_and_eps_none():
    torch = gpu()
    from baracuda_numba.torch import nn

    module = nn.RMSNorm(64, eps=None).cuda()
    theirs = torch.nn.RMSNorm(64).cuda()
    x = torch.randn(5, 64, device="cuda")
    r = torch.randn(5, 64, device="cuda")
    y, h = module(x, r)
    torch.testing.assert_close(h, x + r)
    close(y, theirs(x + r), torch.float32, scale=4)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_gpu_layer_norm_matches_torch(dtype):
    torch = gpu()
    from baracuda_numba.torch import nn

    dtype = getattr(torch, dtype)
    ours = nn.LayerNorm(257).cuda().to(dtype)
    theirs = torch.nn.LayerNorm(257).cuda().double()
    with torch.no_grad():
        ours.weight.normal_()
        ours.bias.normal_()
    theirs.load_state_dict(ours.state_dict())
    x = torch.randn(9, 257, device="cuda", dtype=dtype, requires_grad=True)
    x64 = x.detach().double().requires_grad_()
    y, want = ours(x), theirs(x64)
    close(y, want, dtype)
    dy = torch.randn_like(y)
    y.backward(dy)
    want.backward(dy.double())
    close(x.grad, x64.grad, dtype, scale=4)
    close(ours.weight.grad, theirs.weight.grad, dtype, scale=12)  # 9 rows: sqrt(9) x 4
    close(ours.bias.grad, theirs.bias.grad, dtype, scale=12)


@pytest.mark.gpu
@pytest.mark.parametrize("activation", ["silu", "gelu_pytorch_tanh", "gelu"])
def test_gpu_gated_mlp_matches_the_formula(activation):
    torch = gpu()
    import torch.nn.functional as F

    from baracuda_numba.torch import nn

    mlp = nn.SwiGLUMLP(hidden_size=64, intermediate_size=200, activation=activation).cuda()
    x = torch.randn(4, 9, 64, device="cuda", requires_grad=True)
    y = mlp(x)
    act = {"silu": F.silu, "gelu": F.gelu,
           "gelu_pytorch_tanh": lambda t: F.gelu(t, approximate="tanh")}[activation]
    params = {k: v.detach().double().requires_grad_() for k, v in mlp.named_parameters()}
    x64 = x.detach().double().requires_grad_()
    want = F.linear(act(F.linear(x64, params["gate_proj.weight"]))
                    * F.linear(x64, params["up_proj.weight"]), params["down_proj.weight"])
    # three f32 matmuls over 64-200 terms: sqrt(200) x a few roundings
    scale = 4 * math.sqrt(200)
    close(y, want, torch.float32, scale)
    y.sum().backward()
    want.sum().backward()
    close(x.grad, x64.grad, torch.float32, scale)
    for name, p in mlp.named_parameters():
        close(p.grad, params[name].grad, torch.float32, scale * math.sqrt(36))


def rotate_half(t):
    import torch

    half = t.shape[-1] // 2
    return torch.cat((-t[..., half:], t[..., :half]), dim=-1)


@pytest.mark.gpu
@pytest.mark.parametrize("unsqueeze_dim", [1, 2])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_gpu_apply_rotary_pos_emb_matches_transformers_formula(dtype, unsqueeze_dim):
    """transformers' formula (q·cos + rotate_half(q)·sin, GQA 8/2 heads) in float64, with
    cos/sin built as its rotary embedding builds them (f32, halves repeated)."""
    torch = gpu()
    from baracuda_numba.torch import nn

    dtype = getattr(torch, dtype)
    batch, seq, dim = 2, 37, 64
    positions = torch.arange(seq, device="cuda").expand(batch, seq) + 1000
    inv_freq = 1.0 / (500000.0 ** (torch.arange(0, dim, 2, device="cuda").float() / dim))
    freqs = positions[..., None].float() * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    shape_q = (batch, 8, seq, dim) if unsqueeze_dim == 1 else (batch, seq, 8, dim)
    shape_k = (batch, 2, seq, dim) if unsqueeze_dim == 1 else (batch, seq, 2, dim)
    q = torch.randn(shape_q, device="cuda", dtype=dtype, requires_grad=True)
    k = torch.randn(shape_k, device="cuda", dtype=dtype, requires_grad=True)
    q_out, k_out = nn.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)
    c, s = cos.double().unsqueeze(unsqueeze_dim), sin.double().unsqueeze(unsqueeze_dim)
    q64, k64 = (t.detach().double().requires_grad_() for t in (q, k))
    want_q = q64 * c + rotate_half(q64) * s
    want_k = k64 * c + rotate_half(k64) * s
    close(q_out, want_q, dtype, scale=2)
    close(k_out, want_k, dtype, scale=2)
    (q_out.float().sum() + 2 * k_out.float().sum()).backward()
    (want_q.sum() + 2 * want_k.sum()).backward()
    close(q.grad, q64.grad, dtype, scale=2)
    close(k.grad, k64.grad, dtype, scale=4)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(11, 50), (50,), (3, 50, 2, 5)], ids=["2d", "1d", "4d"])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_gpu_cross_entropy_loss_matches_torch(shape, reduction):
    torch = gpu()
    from baracuda_numba.torch import nn

    classes = 50
    logits = torch.randn(shape, device="cuda", dtype=torch.float64) * 3
    target_shape = (shape[0],) + shape[2:] if len(shape) > 1 else ()
    target = torch.randint(0, classes, target_shape, device="cuda")
    if target.dim():
        target.view(-1)[::4] = 7  # ignored
    weight = torch.rand(classes, device="cuda", dtype=torch.float64) + 0.5
    options = dict(ignore_index=7, reduction=reduction, label_smoothing=0.1)
    x = logits.float().requires_grad_()
    x64 = logits.clone().requires_grad_()
    got = nn.CrossEntropyLoss(weight.float(), **options)(x, target)
    want = torch.nn.CrossEntropyLoss(weight, **options)(x64, target)
    assert got.shape == want.shape
    # f32 logsumexp over 50 classes, and sums over up to 100 rows: sqrt(100) x 4; the
    # mean over no counted target (a 1-d input whose target is ignored) is NaN in both
    close(got, want, torch.float32, scale=40, equal_nan=reduction == "mean")
    got.sum().backward()
    want.sum().backward()
    close(x.grad, x64.grad, torch.float32, scale=40)


@pytest.mark.gpu
def test_gpu_cross_entropy_z_loss_and_softcap():
    """``+ z · lse²`` per row on the soft-capped logits ``c · tanh(x / c)``."""
    torch = gpu()
    import torch.nn.functional as F

    from baracuda_numba.torch import nn

    x = torch.randn(16, 300, device="cuda", dtype=torch.float64) * 20
    target = torch.randint(0, 300, (16,), device="cuda")
    got = nn.CrossEntropyLoss(z_loss=1e-3, softcap=30.0)(x.float(), target)
    capped = 30.0 * torch.tanh(x / 30.0)
    lse = torch.logsumexp(capped, dim=-1)
    want = (F.cross_entropy(capped, target, reduction="none") + 1e-3 * lse**2).mean()
    close(got, want, torch.float32, scale=40)


@pytest.mark.gpu
@pytest.mark.parametrize("with_bias", [False, True])
def test_gpu_fused_linear_cross_entropy_loss(with_bias):
    """Against F.linear + F.cross_entropy in float64: the loss and the gradients of hidden,
    weight and bias, f32; under bf16 autocast, against the same computed from bf16
    operands."""
    torch = gpu()
    import torch.nn.functional as F

    from baracuda_numba.torch import nn

    tokens, hidden_size, vocab = 2 * 37, 64, 1000
    hidden = torch.randn(2, 37, hidden_size, device="cuda", requires_grad=True)
    weight = (torch.randn(vocab, hidden_size, device="cuda") * 0.1).requires_grad_()
    bias = torch.randn(vocab, device="cuda", requires_grad=True) if with_bias else None
    target = torch.randint(0, vocab, (2, 37), device="cuda")
    target[0, :5] = -100
    loss = nn.FusedLinearCrossEntropyLoss(label_smoothing=0.05)
    got = loss(hidden, weight, target, bias)
    inputs = [t for t in (hidden, weight, bias) if t is not None]
    copies = [t.detach().double().requires_grad_() for t in inputs]
    h64, w64 = copies[0], copies[1]
    b64 = copies[2] if with_bias else None
    want = F.cross_entropy(F.linear(h64.reshape(tokens, -1), w64, b64), target.reshape(-1),
                           label_smoothing=0.05)
    # f32 matmul over 64 terms then logsumexp over 1000 classes: sqrt(1000) x 4
    scale = 4 * math.sqrt(vocab)
    close(got, want, torch.float32, scale)
    got.backward()
    want.backward()
    for mine, theirs in zip(inputs, copies):
        close(mine.grad, theirs.grad, torch.float32, scale)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        got16 = loss(hidden, weight, target, bias)
    h16, w16 = hidden.detach().bfloat16().double(), weight.detach().bfloat16().double()
    b16 = bias.detach().bfloat16().double() if with_bias else None
    want16 = F.cross_entropy(F.linear(h16.reshape(tokens, -1), w16, b16), target.reshape(-1),
                             label_smoothing=0.05)
    # the logits are rounded to bf16 once before the f32 softmax
    close(got16, want16, torch.bfloat16, scale=4)


# inductor suggests TF32 once per process when a graph has f32 matmuls (these tests
# compare with f32 eager, so they keep full-precision matmuls)
@pytest.mark.filterwarnings("ignore:TensorFloat32 tensor cores:UserWarning")
@pytest.mark.gpu
def test_gpu_modules_compile_without_graph_breaks():
    """A block of the modules compiles as one graph (``fullgraph=True`` raises on a break)
    and computes what it computes eagerly."""
    torch = gpu()
    from baracuda_numba.torch import nn

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = nn.RMSNorm(64)
            self.mlp = nn.SwiGLUMLP(hidden_size=64, intermediate_size=128)
            self.post = nn.LayerNorm(64)
            self.loss = nn.CrossEntropyLoss(z_loss=1e-4)

        def forward(self, x, cos, sin, target):
            q, k = nn.apply_rotary_pos_emb(x.view(2, 5, 4, 16).transpose(1, 2),
                                           x.view(2, 5, 4, 16).transpose(1, 2), cos, sin)
            h = self.post(self.mlp(self.norm(x)) + q.transpose(1, 2).reshape(2, 5, 64) + k.sum())
            return self.loss(h.reshape(10, 64), target)

    block = Block().cuda()
    x = torch.randn(2, 5, 64, device="cuda", requires_grad=True)
    angles = torch.rand(2, 5, 8, device="cuda")
    cos, sin = torch.cat((angles, angles), -1).cos(), torch.cat((angles, angles), -1).sin()
    target = torch.randint(0, 64, (10,), device="cuda")
    want = block(x, cos, sin, target)
    (want_grad,) = torch.autograd.grad(want, x)
    compiled = torch.compile(block, fullgraph=True)
    got = compiled(x, cos, sin, target)
    (got_grad,) = torch.autograd.grad(got, x)
    close(got, want, torch.float32, scale=16)
    close(got_grad, want_grad, torch.float32, scale=16)


def test_eager_function_applies_without_binding_the_signature(torch, monkeypatch):
    """The eager twins' base class: forward + setup_context give the same values and
    gradients as ``torch.autograd.Function``, without an ``inspect.signature`` per call,
    and torch.func transforms still take ``Function.apply``'s own path (CPU tensors)."""
    import inspect

    from baracuda_numba.torch._core import EagerFunction

    seen = []

    class Scale(EagerFunction):
        @staticmethod
        def forward(x, factor):
            return x * factor

        @staticmethod
        def setup_context(ctx, inputs, output):
            seen.append(len(inputs))
            ctx.factor = inputs[1]

        @staticmethod
        def backward(ctx, grad):
            return grad * ctx.factor, None

    x = torch.randn(5, dtype=torch.float64, requires_grad=True)
    with monkeypatch.context() as patch:
        patch.setattr(inspect, "signature", lambda *a, **k: pytest.fail("signature bound"))
        y = Scale.apply(x, 3.0)
        (dx,) = torch.autograd.grad(y.sum(), x)
    torch.testing.assert_close(y, x.detach() * 3.0)
    torch.testing.assert_close(dx, torch.full_like(x, 3.0))
    assert seen == [2]
    grad = torch.func.grad(lambda t: Scale.apply(t, 2.0).sum())(torch.randn(4))
    torch.testing.assert_close(grad, torch.full((4,), 2.0))
