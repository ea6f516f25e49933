"""Workloads: real model shapes through the public API, as users call it.

Every row calls ``baracuda_numba.torch`` (or ``baracuda_numba.ops``) exactly as a user
would: no plans, no hand-passed workspaces. Shapes come from public model configurations
(Llama-3-8B / -70B, Qwen2.5-7B, Mistral-7B, Gemma-2-9B); each row is named by the model and
the place in it. Columns: ours, torch eager, torch.compile (default mode, compiled before
timing) and % of the copy bandwidth for the bytes the op must move. Rows whose device
time is a few µs (decode) are timed as wall-clock per call in a loop, host included.
A row whose op the package does not have yet is skipped with a note.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Model:
    name: str
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    rope_theta: float


MODELS = {
    m.name: m for m in (
        Model("Llama-3-8B", 4096, 32, 8, 128, 14336, 128256, 500000.0),
        Model("Llama-3-70B", 8192, 64, 8, 128, 28672, 128256, 500000.0),
        Model("Qwen2.5-7B", 3584, 28, 4, 128, 18944, 152064, 1000000.0),
        Model("Mistral-7B", 4096, 32, 8, 128, 14336, 32768, 1000000.0),
        Model("Gemma-2-9B", 3584, 16, 8, 256, 14336, 256000, 10000.0),
    )
}


def _compiled(torch: Any, fn: Callable[..., Any]) -> Callable[..., Any] | None:
    """``torch.compile(fn)`` (default mode), or None where it does not compile."""
    try:
        return torch.compile(fn)
    except Exception:  # noqa: BLE001
        return None


def _time(ctx: Any, fns: dict[str, Callable[[int], Any]], sets: int, decode: bool,
          args_for: Callable[[int], tuple]) -> dict[str, float]:
    """µs per call of each entry: device time (interleaved CUDA events) or, for decode
    rows, wall clock per call in a loop."""
    calls = {name: (lambda i, f=f: f(*args_for(i))) for name, f in fns.items()}
    if decode:
        return ctx.time_host_many({name: (lambda c=c: c(0)) for name, c in calls.items()})
    names = list(calls)
    figures = ctx.time_gpu_many([calls[n] for n in names], sets=sets, iters=30)
    return dict(zip(names, figures))


def _row(ctx: Any, case: str, dtype: str, moved: int | None, ours: Callable[..., Any],
         eager: Callable[..., Any], inputs: Callable[[int], tuple], sets: int = 1,
         decode: bool = False) -> None:
    torch = ctx.torch
    fns = {"ours": ours, "eager": eager}
    compiled = _compiled(torch, eager)
    if compiled is not None:
        try:
            compiled(*inputs(0))  # compile before timing
            torch.cuda.synchronize()
            fns["compile"] = compiled
        except Exception as error:  # noqa: BLE001
            ctx.notes.append(f"{case}: torch.compile failed ({type(error).__name__})")
    ours(*inputs(0))  # the package's first call (compiles or loads its kernel)
    torch.cuda.synchronize()
    got = _time(ctx, fns, sets, decode, inputs)
    compile_us = got.get("compile")
    note = "wall clock per call" if decode else ""
    if compile_us is not None:
        note = (note + "; " if note else "") + \
            f"torch.compile {compile_us:.2f} µs ({compile_us / got['ours']:.2f}x)"
    ctx.row(case, dtype, got["ours"], None if decode else moved, got["eager"], note)
    print(f"  {case} | {dtype} | ours {got['ours']:.2f} | eager {got['eager']:.2f} | {note}",
          flush=True)  # a run cut short still shows its rows


def _fwd_bwd(ctx: Any, case: str, dtype: str, moved: int, ours: Callable[..., Any],
             eager: Callable[..., Any], x: Any) -> None:
    """Forward + backward of a one-input op: ``torch.autograd.grad`` of its output against
    a fixed random cotangent (no gradient accumulation on either side)."""
    torch = ctx.torch
    x = x.detach().requires_grad_(True)
    dy = torch.randn_like(eager(x).float()).to(eager(x).dtype)

    def both(fn: Callable[..., Any]) -> Callable[..., Any]:
        return lambda t: torch.autograd.grad(fn(t), t, dy)[0]

    _row(ctx, case + ", forward+backward", dtype, moved, both(ours), both(eager),
         lambda i: (x,))


def _sampling_cumsum(ctx: Any, bt: Any, m: Model, batch: int) -> None:
    torch = ctx.torch
    probs = [torch.rand(batch, m.vocab, device="cuda") for _ in range(4)]
    _row(ctx, f"{m.name} top-p sampling cumsum, batch {batch}", "float32",
         2 * probs[0].numel() * 4, lambda x: bt.cumsum(x, -1), lambda x: torch.cumsum(x, -1),
         lambda i: (probs[i],), sets=4, decode=batch == 1)


def _lm_head_stats(ctx: Any, bt: Any, m: Model, tokens: int) -> None:
    torch = ctx.torch
    logits = torch.randn(tokens, m.vocab, device="cuda", dtype=torch.bfloat16)
    moved = logits.numel() * 2
    case = f"{m.name} LM-head logsumexp, {tokens // 1024}k tokens"
    _row(ctx, case, "bfloat16", moved, lambda x: bt.logsumexp(x, -1),
         lambda x: torch.logsumexp(x, -1), lambda i: (logits,))
    _fwd_bwd(ctx, case, "bfloat16", 3 * moved, lambda x: bt.logsumexp(x, -1),
             lambda x: torch.logsumexp(x, -1), logits)
    _row(ctx, f"{m.name} LM-head argmax (greedy), {tokens // 1024}k tokens", "bfloat16", moved,
         lambda x: bt.argmax(x, -1), lambda x: torch.argmax(x, -1), lambda i: (logits,))


def _activation_stats(ctx: Any, bt: Any, m: Model, dtype: Any) -> None:
    torch = ctx.torch
    name = str(dtype).removeprefix("torch.")
    act = torch.randn(16384, m.hidden, device="cuda", dtype=dtype)
    moved = act.numel() * act.element_size()
    _row(ctx, f"{m.name} activation column mean [16k, 4k] axis 0", name, moved,
         lambda x: bt.mean(x, 0), lambda x: torch.mean(x, 0), lambda i: (act,))
    _row(ctx, f"{m.name} activation column var [16k, 4k] axis 0", name, moved,
         lambda x: bt.var(x, 0), lambda x: torch.var(x, 0), lambda i: (act,))
    _row(ctx, f"{m.name} row sum [16k, 4k] last axis", name, moved,
         lambda x: bt.sum(x, -1), lambda x: torch.sum(x, -1), lambda i: (act,))


def _multi_axis(ctx: Any, bt: Any) -> None:
    """Reductions over several axes at once: a ResNet-style global average pool of an NCHW
    activation (mean over (-2, -1)) and a bias gradient (sum over (0, 1) of [B, S, D])."""
    torch = ctx.torch
    for dtype in (torch.float32, torch.bfloat16):
        name = str(dtype).removeprefix("torch.")
        act = torch.randn(128, 256, 56, 56, device="cuda", dtype=dtype)
        _row(ctx, "ResNet global average pool, mean over (-2, -1) of [128, 256, 56, 56]", name,
             act.numel() * act.element_size(), lambda x: bt.mean(x, (-2, -1)),
             lambda x: torch.mean(x, (-2, -1)), lambda i, a=act: (a,))
        del act
        m = MODELS["Llama-3-8B"]
        grad = torch.randn(16, 4096, m.hidden, device="cuda", dtype=dtype)
        _row(ctx, f"{m.name} bias gradient, sum over (0, 1) of [16, 4096, {m.hidden}]", name,
             grad.numel() * grad.element_size(), lambda x: bt.sum(x, (0, 1)),
             lambda x: torch.sum(x, (0, 1)), lambda i, g=grad: (g,))
        del grad
        torch.cuda.empty_cache()


def _reductions(ctx: Any, bt: Any) -> None:
    m = MODELS["Llama-3-8B"]
    for batch in (1, 256):
        _sampling_cumsum(ctx, bt, m, batch)
    _lm_head_stats(ctx, bt, m, 8192)
    for dtype in (ctx.torch.float32, ctx.torch.bfloat16):
        _activation_stats(ctx, bt, m, dtype)


def _rotary_tables(torch: Any, m: Model, seq: int, dtype: Any) -> tuple[Any, Any]:
    inv_freq = 1.0 / (m.rope_theta ** (torch.arange(0, m.head_dim, 2, device="cuda",
                                                     dtype=torch.float32) / m.head_dim))
    freqs = torch.outer(torch.arange(seq, device="cuda", dtype=torch.float32), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _hf_rope(q, cos, sin):
    half = q.shape[-1] // 2
    rotated = q.new_empty(q.shape)
    rotated[..., :half] = -q[..., half:]
    rotated[..., half:] = q[..., :half]
    return q * cos + rotated * sin


def _rope_prefill(ctx: Any, bt: Any, m: Model, seq: int) -> None:
    torch = ctx.torch
    dtype = torch.bfloat16
    # HF layout: q is [B, S, H, D], viewed as [B, H, S, D]
    q = torch.randn(1, seq, m.heads, m.head_dim, device="cuda", dtype=dtype)
    positions = torch.arange(seq, device="cuda")
    cos, sin = _rotary_tables(torch, m, seq, dtype)
    cos4, sin4 = cos[None, None], sin[None, None]
    moved = 2 * q.numel() * 2

    def ours(x):
        return bt.rope(x.transpose(1, 2), positions=positions, base=m.rope_theta,
                       pairing="half_split")

    def eager(x):
        return _hf_rope(x.transpose(1, 2), cos4, sin4)

    case = f"{m.name} q RoPE, prefill {seq} (HF [B,S,H,D] viewed as [B,H,S,D])"
    _row(ctx, case, "bfloat16", moved, ours, eager, lambda i: (q,))
    _fwd_bwd(ctx, case, "bfloat16", 2 * moved, ours, eager, q)


def _hf_qk(q, k, cos, sin):
    """HF's apply_rotary_pos_emb on [B, S, H, D] tensors with gathered cos/sin [B, S, D]."""
    cos, sin = cos.unsqueeze(2), sin.unsqueeze(2)
    return _hf_rope(q, cos, sin), _hf_rope(k, cos, sin)


def _rope_qk(ctx: Any, bt: Any, m: Model, batch: int, seq: int) -> None:
    """q and k together in HF's layout (``[B, S, H, D]``, cos/sin gathered per token), as
    a patched attention calls it: decode (seq 1, wall clock per call) or prefill."""
    torch = ctx.torch
    dtype = torch.bfloat16
    q = torch.randn(batch, seq, m.heads, m.head_dim, device="cuda", dtype=dtype)
    k = torch.randn(batch, seq, m.kv_heads, m.head_dim, device="cuda", dtype=dtype)
    positions = torch.randint(0, 4096, (batch, seq), device="cuda") if seq == 1 else \
        torch.arange(seq, device="cuda").expand(batch, seq)
    inv = 1.0 / (m.rope_theta ** (torch.arange(0, m.head_dim, 2, device="cuda",
                                               dtype=torch.float32) / m.head_dim))
    freqs = positions.float()[..., None] * inv
    emb = torch.cat((freqs, freqs), -1)
    cos, sin = emb.cos().to(dtype), emb.sin().to(dtype)
    moved = 2 * (q.numel() + k.numel()) * 2
    where = f"decode batch {batch}" if seq == 1 else f"prefill {seq}"
    _row(ctx, f"{m.name} q+k RoPE, {where} (HF layout, cos/sin [B,S,D])", "bfloat16",
         moved, lambda a, b: bt.rope(a, k=b, cos=cos, sin=sin, pairing="half_split",
                                     layout="BSHD"),
         lambda a, b: _hf_qk(a, b, cos, sin), lambda i: (q, k), decode=seq == 1)


def _rope(ctx: Any, bt: Any) -> None:
    for model, seq in (("Llama-3-8B", 8192), ("Llama-3-70B", 4096)):
        _rope_prefill(ctx, bt, MODELS[model], seq)
    for model, batch, seq in (("Llama-3-8B", 1, 8192), ("Qwen2.5-7B", 1, 32768),
                              ("Mistral-7B", 1, 1), ("Qwen2.5-7B", 256, 1),
                              ("Llama-3-70B", 64, 1)):
        _rope_qk(ctx, bt, MODELS[model], batch, seq)


def _kv_append(ctx: Any, bt: Any) -> None:
    torch = ctx.torch
    m = MODELS["Llama-3-8B"]
    cache = torch.randn(64, m.kv_heads, 4096, m.head_dim, device="cuda", dtype=torch.bfloat16)
    step = torch.randn(64, m.kv_heads, 1, m.head_dim, device="cuda", dtype=torch.bfloat16)
    pos = 1234

    def eager(c, s):
        c[:, :, pos:pos + 1] = s
        return c

    _row(ctx, f"{m.name} decode KV append, batch 64 into [64, 8, 4096, 128]", "bfloat16",
         None, lambda c, s: bt.write_slice_(c, s, (0, 0, pos, 0)), eager,
         lambda i: (cache, step), decode=True)


def _norm_rows(ctx: Any, bt: Any, m: Model, tokens: int) -> None:
    torch = ctx.torch
    x = torch.randn(tokens, m.hidden, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(m.hidden, device="cuda", dtype=torch.bfloat16)

    def ours(t):
        return bt.rms_norm(t, (m.hidden,), w, 1e-5)

    def eager(t):
        return torch.nn.functional.rms_norm(t, (m.hidden,), w, 1e-5)

    case = f"{m.name} RMSNorm, {tokens} tokens"
    _row(ctx, case, "bfloat16", 2 * x.numel() * 2, ours, eager, lambda i: (x,))
    # forward + backward reads x twice and dy once, writes y and dx
    _fwd_bwd(ctx, case, "bfloat16", 5 * x.numel() * 2, ours, eager, x)


def _softmax_rows(ctx: Any, bt: Any, m: Model, tokens: int) -> None:
    torch = ctx.torch
    scores = torch.randn(tokens, 4096, device="cuda", dtype=torch.bfloat16)
    case = f"{m.name} softmax over 4k keys, {tokens} rows"
    _row(ctx, case, "bfloat16", 2 * scores.numel() * 2, lambda t: bt.softmax(t, -1),
         lambda t: torch.softmax(t, -1), lambda i: (scores,))
    # backward reads y and dy, writes dx
    _fwd_bwd(ctx, case, "bfloat16", 5 * scores.numel() * 2, lambda t: bt.softmax(t, -1),
             lambda t: torch.softmax(t, -1), scores)


def _swiglu_rows(ctx: Any, bt: Any, m: Model, tokens: int) -> None:
    torch = ctx.torch
    gate = torch.randn(tokens, m.intermediate, device="cuda", dtype=torch.bfloat16)
    up = torch.randn_like(gate)
    _row(ctx, f"{m.name} SwiGLU, {tokens} tokens", "bfloat16", 3 * gate.numel() * 2,
         lambda g, u: bt.swiglu(g, u), lambda g, u: torch.nn.functional.silu(g) * u,
         lambda i: (gate, up))


def _cross_entropy_rows(ctx: Any, bt: Any, m: Model, tokens: int) -> None:
    torch = ctx.torch
    logits = torch.randn(tokens, m.vocab, device="cuda", dtype=torch.bfloat16)
    target = torch.randint(0, m.vocab, (tokens,), device="cuda")
    case = f"{m.name} cross-entropy loss, {tokens} tokens"
    _row(ctx, case, "bfloat16", logits.numel() * 2, lambda t, y: bt.cross_entropy(t, y),
         lambda t, y: torch.nn.functional.cross_entropy(t, y), lambda i: (logits, target))
    # forward + backward: the logits read twice (loss, then gradient) and the gradient
    # written
    _fwd_bwd(ctx, case, "bfloat16", 3 * logits.numel() * 2,
             lambda t: bt.cross_entropy(t, target),
             lambda t: torch.nn.functional.cross_entropy(t, target), logits)


_NEW_FAMILIES = (("rms_norm", _norm_rows), ("softmax", _softmax_rows),
                 ("swiglu", _swiglu_rows), ("cross_entropy", _cross_entropy_rows))


def _new_families(ctx: Any, bt: Any) -> None:
    m = MODELS["Llama-3-8B"]
    for name, rows in _NEW_FAMILIES:
        if hasattr(bt, name):
            rows(ctx, bt, m, 8192)
            ctx.torch.cuda.empty_cache()
        else:
            ctx.notes.append(f"{name} rows skipped: no baracuda_numba.torch.{name} yet")
    _norm_rows(ctx, bt, MODELS["Qwen2.5-7B"], 16384)
    for model in ("Qwen2.5-7B", "Gemma-2-9B"):
        _cross_entropy_rows(ctx, bt, MODELS[model], 4096)
        ctx.torch.cuda.empty_cache()


def bench(ctx: Any) -> None:
    import os

    import baracuda_numba.torch as bt

    sections = (_reductions, _multi_axis, _rope, _kv_append, _new_families)
    wanted = os.environ.get("WORKLOADS_SECTIONS")  # e.g. "_multi_axis,_rope": a subset
    if wanted:
        sections = tuple(s for s in sections if s.__name__ in wanted.split(","))
    for section in sections:
        try:
            section(ctx, bt)
        except Exception as error:  # noqa: BLE001 - one broken section must not hide the rest
            ctx.notes.append(f"{section.__name__} failed: {type(error).__name__}: {error}")
        ctx.torch.cuda.empty_cache()
    ctx.notes.append("torch µs is torch eager; the torch.compile figure and its ratio to "
                     "ours are in the note column.")
