"""Rows of the ``rope`` benchmark section for q and k together and the fused KV-cache
append (issue 55); ``bench_rope.bench`` runs them as the parts ``qk`` and ``cache``.

q and k in one call, Llama-3-8B (32 q / 8 kv heads) and -70B (64 / 8) heads, D = 128,
HF's layout (``[B, S, H, D]`` tensors seen as ``[B, H, S, D]``) and HF's gathered cos/sin
``[B, S, D]``: ours (``RopePlan`` with ``num_kv_heads``, one ``run``), against Liger-Kernel's
``LigerRopeFunction`` (forward; backward through its autograd) and torch.compile (default
mode) of HF's ``apply_rotary_pos_emb``, forward and backward (sin negated). Bytes moved:
q and k read and written once (the tables are not counted).

Fused rotate-and-append (``RopeKvCacheAppendPlan``, contiguous ``[B, 8, 4096, 128]``
caches, one offset for every sequence) against ``RopePlan`` (q and k) followed by two
``WriteSlicePlan`` runs (k and v), and against HF's eager path (``apply_rotary_pos_emb``,
then slice assignment into the caches). Bytes moved: q read + written, k and v read and
written into the cache.

Decode rows (one token per sequence) are wall-clock µs per call, every column alike (a
burst of calls timed until the GPU is done: the larger of a call's host and device time),
with the device µs in the note; the larger rows are device µs.
"""

from __future__ import annotations

from typing import Any

from baracuda_numba.plans.rope import (
    RopeArgs,
    RopeBackwardArgs,
    RopeBackwardDescriptor,
    RopeBackwardPlan,
    RopeDescriptor,
    RopePlan,
)
from baracuda_numba.plans.rope_kv_cache import (
    RopeKvCacheAppendArgs,
    RopeKvCacheAppendDescriptor,
    RopeKvCacheAppendPlan,
)
from baracuda_numba.plans.write_slice import WriteSliceArgs, WriteSliceDescriptor, WriteSlicePlan
from baracuda_numba.types import ElementKind, RopeAngleSource, RopePairing

HEAD_DIM = 128
#: (label, batch, tokens per sequence, q heads, kv heads, dtypes)
QK_SHAPES = (("8B prefill 2k", 1, 2048, 32, 8, ("bfloat16", "float16")),
             ("8B prefill 32k", 1, 32768, 32, 8, ("bfloat16",)),
             ("70B prefill 8k", 1, 8192, 64, 8, ("bfloat16",)),
             ("8B decode B=1", 1, 1, 32, 8, ("bfloat16",)),
             ("70B decode B=256", 256, 1, 64, 8, ("bfloat16",)))
#: (label, batch, new tokens, max cache length)
CACHE_SHAPES = (("decode B=64", 64, 1, 4096), ("prefill 2k", 1, 2048, 4096))
ELEMENTS = {"bfloat16": ElementKind.BF16, "float16": ElementKind.F16}


def _rotate_half(torch: Any, x: Any) -> Any:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def hf_apply(q: Any, k: Any, cos: Any, sin: Any) -> tuple[Any, Any]:
    """HF's ``apply_rotary_pos_emb`` (Llama), cos/sin ``[B, S, D]``."""
    import torch

    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return (q * cos + _rotate_half(torch, q) * sin, k * cos + _rotate_half(torch, k) * sin)


def _tables(torch: Any, batch: int, seq: int, dtype: Any, offset: int = 0) -> tuple[Any, Any]:
    positions = torch.arange(offset, offset + seq, device="cuda")[None].expand(batch, seq)
    inv_freq = 500000.0 ** (-torch.arange(0, HEAD_DIM, 2, device="cuda").double() / HEAD_DIM)
    freqs = positions.double()[..., None] * inv_freq
    emb = torch.cat((freqs, freqs), -1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _liger() -> tuple[Any, Any]:
    try:
        from liger_kernel.ops.rope import LigerRopeFunction
    except Exception:  # not installed: the column stays empty
        return None, None

    def forward(q: Any, k: Any, cos: Any, sin: Any) -> Any:
        return LigerRopeFunction.apply(q, k, cos, sin)

    try:
        from liger_kernel.ops.rope import rope_backward
    except Exception:
        rope_backward = None
    return forward, rope_backward


def qk(ctx: Any, row: Any, note: Any) -> None:
    torch = ctx.torch
    liger = _liger()
    if liger[0] is None:
        note(ctx, "liger-kernel not importable: no Liger column")
    hf_compiled = torch.compile(hf_apply)
    for label, batch, seq, hq, hk, dtypes in QK_SHAPES:
        for name in dtypes:
            _qk_case(ctx, row, note, liger, hf_compiled, label, (batch, seq, hq, hk), name)
            torch.cuda.empty_cache()


def _qk_case(ctx: Any, row: Any, note: Any, liger: tuple[Any, Any], hf_compiled: Any,
             label: str, shape: tuple[int, int, int, int], name: str) -> None:
    torch = ctx.torch
    batch, seq, hq, hk = shape
    dtype, element = getattr(torch, name), ELEMENTS[name]
    itemsize = torch.empty((), dtype=dtype).element_size()
    moved = 2 * batch * seq * (hq + hk) * HEAD_DIM * itemsize
    sets = ctx.sets_for(moved)
    # HF's layout: [B, S, H, D] storage seen as [B, H, S, D]
    qs = [torch.randn(batch, seq, hq, HEAD_DIM, device="cuda", dtype=dtype).transpose(1, 2)
          for _ in range(sets)]
    ks = [torch.randn(batch, seq, hk, HEAD_DIM, device="cuda", dtype=dtype).transpose(1, 2)
          for _ in range(sets)]
    q_outs = [torch.empty_like(q) for q in qs]
    k_outs = [torch.empty_like(k) for k in ks]
    cos, sin = _tables(torch, batch, seq, dtype)
    desc = RopeDescriptor(batch, hq, seq, HEAD_DIM, element=element,
                          pairing=RopePairing.HALF_SPLIT, num_kv_heads=hk,
                          angles=RopeAngleSource.COS_SIN_GATHERED)
    fwd = RopePlan.select(desc)
    rows = RopePlan.select(desc)  # the general rope_rows launch, for comparison
    rows.qk_kernel = False
    bwd = RopeBackwardPlan.select(RopeBackwardDescriptor.of(desc), forward=desc)
    fwd_args = [RopeArgs(qs[i], q_outs[i], None, ks[i], k_outs[i], cos=cos, sin=sin)
                for i in range(sets)]
    bwd_args = [RopeBackwardArgs(qs[i], q_outs[i], None, ks[i], k_outs[i], cos=cos, sin=sin)
                for i in range(sets)]
    neg_sin = -sin
    fns = [lambda i: fwd.run(fwd_args[i]), lambda i: bwd.run(bwd_args[i]),
           lambda i: hf_compiled(qs[i], ks[i], cos, sin),
           lambda i: hf_compiled(qs[i], ks[i], cos, neg_sin)]
    fns.append(lambda i: rows.run(fwd_args[i]))
    liger_fwd, liger_bwd = liger
    if liger_fwd is not None:
        fns.append(lambda i: liger_fwd(qs[i], ks[i], cos, sin))
        if liger_bwd is not None:
            fns.append(lambda i: liger_bwd(qs[i], ks[i], cos, sin))
    try:
        for fn in fns[2:4] + fns[5:]:
            fn(0)
        times = ctx.time_gpu_many(fns, sets=sets, iters=30)
    except Exception as exc:  # a peer failing keeps our rows
        note(ctx, f"qk {label} {name}: peers failed ({type(exc).__name__}: "
                  f"{str(exc)[:160]}); ours alone")
        times = ctx.time_gpu_many(fns[:2], sets=sets, iters=30) + [None] * 3
    ours_f, ours_b, comp_f, comp_b, rows_f = times[:5]
    lig_f = times[5] if len(times) > 5 else None
    lig_b = times[6] if len(times) > 6 else None
    dims = f"[{batch}, {seq}, {hq}/{hk}, {HEAD_DIM}]"
    method = ""
    if seq == 1:  # decode: wall-clock per call (what a decode step waits for)
        device = (f"; device µs: ours {ours_f:.2f} / {ours_b:.2f}, torch.compile {comp_f:.2f}"
                  f" / {comp_b:.2f}" + (f", Liger {lig_f:.2f} / {lig_b:.2f}"
                                        if lig_f and lig_b else ""))
        calls = dict(zip(("ours_f", "ours_b", "comp_f", "comp_b", "rows_f"), fns[:5]))
        if liger_fwd is not None:
            calls["lig_f"] = fns[5]
            if liger_bwd is not None:
                calls["lig_b"] = fns[6]
        wall = ctx.time_host_many({key: (lambda fn=fn: fn(0)) for key, fn in calls.items()},
                                  wall=True)
        ours_f, ours_b, comp_f, comp_b = (wall[key] for key in ("ours_f", "ours_b", "comp_f",
                                                                 "comp_b"))
        rows_f, lig_f, lig_b = wall["rows_f"], wall.get("lig_f"), wall.get("lig_b")
        method = "wall-clock µs per call (all columns)" + device + "; "
    lig = f"; Liger {lig_f:.2f} µs ({lig_f / ours_f:.2f}x)" if lig_f else "; Liger n/a"
    general = f"; rope_rows {rows_f:.2f} µs ({rows_f / ours_f:.2f}x)" if rows_f else ""
    row(ctx, f"q+k fwd {label} {dims} cos/sin [B,S,D]", name, ours_f, moved, comp_f,
        method + "torch column = torch.compile(HF apply_rotary_pos_emb)" + lig + general
        + f"; kernel {fwd.qk_path.last_kernel}")
    lig = (f"; Liger backward {lig_b:.2f} µs ({lig_b / ours_b:.2f}x)" if lig_b
           else "; Liger backward n/a")
    row(ctx, f"q+k bwd {label} {dims} cos/sin [B,S,D]", name, ours_b, moved, comp_b,
        method + "torch column = torch.compile(HF formula, sin negated)" + lig)


def cache(ctx: Any, row: Any, note: Any) -> None:
    for label, batch, length, max_len in CACHE_SHAPES:
        _cache_case(ctx, row, label, batch, length, max_len)
        ctx.torch.cuda.empty_cache()


def _cache_case(ctx: Any, row: Any, label: str, batch: int, length: int,
                max_len: int) -> None:
    torch = ctx.torch
    dtype, element, hq, hk = torch.bfloat16, ElementKind.BF16, 32, 8
    at = max_len // 2
    q = torch.randn(batch, hq, length, HEAD_DIM, device="cuda", dtype=dtype)
    k = torch.randn(batch, hk, length, HEAD_DIM, device="cuda", dtype=dtype)
    v = torch.randn_like(k)
    q_out, k_rot = torch.empty_like(q), torch.empty_like(k)
    k_cache = torch.zeros(batch, hk, max_len, HEAD_DIM, device="cuda", dtype=dtype)
    v_cache = torch.zeros_like(k_cache)
    offsets = torch.full((batch,), at, device="cuda", dtype=torch.int64)
    positions = offsets[:, None] + torch.arange(length, device="cuda")
    fused = RopeKvCacheAppendPlan.select(RopeKvCacheAppendDescriptor(
        batch, hq, hk, length, HEAD_DIM, max_cache_len=max_len, element=element,
        pairing=RopePairing.HALF_SPLIT))
    fused_args = RopeKvCacheAppendArgs(q, q_out, k, v, k_cache, v_cache, cache_offsets=offsets)
    rope = RopePlan.select(RopeDescriptor(batch, hq, length, HEAD_DIM, element=element,
                                          pairing=RopePairing.HALF_SPLIT, num_kv_heads=hk))
    rope_args = RopeArgs(q, q_out, positions, k, k_rot)
    window = WriteSlicePlan.select(WriteSliceDescriptor(
        (batch, hk, max_len, HEAD_DIM), (batch, hk, length, HEAD_DIM),
        ((0, batch), (0, hk), (at, at + length), (0, HEAD_DIM)), element=element))
    cos, sin = _tables(torch, batch, length, dtype, at)

    def two_plans(_: int) -> None:
        rope.run(rope_args)
        window.run(WriteSliceArgs(k_cache, k_rot))
        window.run(WriteSliceArgs(v_cache, v))

    def hf_eager(_: int) -> None:
        _, k_r = hf_apply(q, k, cos, sin)
        k_cache[:, :, at:at + length] = k_r
        v_cache[:, :, at:at + length] = v

    calls = [lambda i: fused.run(fused_args), two_plans, hf_eager]
    times = ctx.time_gpu_many(calls, iters=30)
    method = ""
    if length == 1:  # decode: wall-clock per call (what a decode step waits for)
        method = (f"wall-clock µs per call (all columns); device µs: fused {times[0]:.2f}, "
                  f"two plans {times[1]:.2f}, HF eager {times[2]:.2f}; ")
        wall = ctx.time_host_many({str(j): (lambda fn=fn: fn(0)) for j, fn in enumerate(calls)},
                                  wall=True)
        times = [wall[str(j)] for j in range(len(calls))]
    moved = 2 * (q.numel() + 2 * k.numel()) * q.element_size()
    row(ctx, f"rope+cache append {label} [{batch}, 32/8, {length}, 128] -> "
             f"[{batch}, 8, {max_len}, 128]", "bfloat16", times[0], moved, times[2],
        method + "torch column = HF eager (rotate, slice assignment); RopePlan + 2 "
        f"WriteSlicePlan {times[1]:.2f} µs ({times[1] / times[0]:.2f}x)")
