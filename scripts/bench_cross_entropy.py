"""Benchmark section ``cross_entropy``: loss + gradient over bf16 ``[N, V]`` logits
(``baracuda_numba``) against torch eager ``F.cross_entropy`` + backward, ``torch.compile``
(default mode, compiled before timing) and Liger-Kernel's ``LigerCrossEntropyFunction``;
and the fused linear cross-entropy on Llama-3-8B's head against ``F.linear`` +
``F.cross_entropy`` and Liger's ``LigerFusedLinearCrossEntropyFunction``.

Rows:

* ``fused, grad in place``: ``ops.cross_entropy(x, t, grad_out=x)``, loss and gradient
  in one launch written over the logits (the peers' in-place mode);
* ``autograd``: ``bt.cross_entropy(x, t).backward()`` (forward reads once, the backward
  kernel reads the logits and the saved lse and writes a new gradient);
* the same bytes for every row: two reads and one write of the logits.

Peak extra memory (over the inputs) goes to the notes, as % of the logits' size. The
in-place row feeds each iteration the previous gradient (finite, non-zero values; the
kernel's work does not depend on them).
"""

from __future__ import annotations

import os
from typing import Any

SHAPES = ((8192, 128256), (16384, 32768), (4096, 152064), (4096, 256000))
FLCE_SHAPE = (8192, 4096, 128256)  # tokens, hidden, vocab: Llama-3-8B's head


def _note(ctx: Any, text: str) -> None:
    ctx.notes.append(text)
    print(f"  note: {text}", flush=True)


def _first(out: Any) -> Any:
    return out[0] if isinstance(out, (tuple, list)) else out


def _liger_ce() -> Any:
    try:
        from liger_kernel.ops.cross_entropy import LigerCrossEntropyFunction
    except ImportError:
        return None
    return lambda x, t: _first(LigerCrossEntropyFunction.apply(x, t, None))


def _liger_flce() -> Any:
    try:
        from liger_kernel.ops.fused_linear_cross_entropy import (
            LigerFusedLinearCrossEntropyFunction,
        )
    except ImportError:
        return None
    return lambda h, w, t: _first(LigerFusedLinearCrossEntropyFunction.apply(h, w, t))


def _peak_extra(torch: Any, fn: Any) -> int:
    """Bytes allocated at peak by ``fn()`` over what was allocated before it."""
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before


def bench(ctx: Any) -> None:
    torch = ctx.torch
    shapes = SHAPES[:1] if os.environ.get("CE_BENCH_QUICK") else SHAPES
    for shape in shapes:
        _cross_entropy(ctx, torch, shape)
        torch.cuda.empty_cache()
    _fused_linear(ctx, torch)


def _cross_entropy(ctx: Any, torch: Any, shape: tuple[int, int]) -> None:
    import torch.nn.functional as F

    import baracuda_numba.torch as bt
    from baracuda_numba import ops

    n, v = shape
    logits_bytes = n * v * 2
    moved = 3 * logits_bytes
    x = (torch.randn(shape, device="cuda") * 2).to(torch.bfloat16).requires_grad_()
    t = torch.randint(0, v, (n,), device="cuda")
    t[::17] = -100
    work = x.detach().clone()

    def eager(x):
        return F.cross_entropy(x, t)

    # CE_BENCH_LEAN: only what the targets name (ours in place, torch eager,
    # Liger), no torch.compile build or autograd row: a short GPU window.
    lean = bool(os.environ.get("CE_BENCH_LEAN"))
    liger = _liger_ce()

    def step(fn: Any) -> Any:
        def call(i: int) -> None:
            x.grad = None
            fn(x).backward()
        return call

    fns = {"fused, grad in place": lambda i: ops.cross_entropy(work, t, grad_out=work),
           "torch": step(eager)}
    if not lean:
        fns["autograd"] = step(lambda x: bt.cross_entropy(x, t))
        fns["torch.compile"] = step(torch.compile(eager))
    if liger is not None:  # Liger writes its gradient over its input: its own copy
        x_liger = x.detach().clone().requires_grad_()

        def liger_step(i: int) -> None:
            x_liger.grad = None
            liger(x_liger, t).backward()

        fns["liger"] = liger_step
    name = f"cross_entropy fwd+bwd {list(shape)}"
    working = {}
    for label, fn in fns.items():
        try:
            fn(0)
            fn(0)
            working[label] = fn
        except Exception as exc:  # noqa: BLE001 - record and keep going
            _note(ctx, f"{name}: {label} failed: {type(exc).__name__}: {exc}"[:300])
    labels = list(working)
    times = dict(zip(labels, ctx.time_gpu_many([working[k] for k in labels], warmup=2,
                                               iters=10)))
    peers = {k: us for k, us in times.items() if k not in ("fused, grad in place", "autograd")}
    others = ", ".join(f"{k} {us:.0f} µs" for k, us in peers.items())
    for label in ("fused, grad in place", "autograd"):
        if label in times:
            ctx.row(f"{name} {label}", "bf16", times[label], moved,
                    peers.get("torch"), others)
            row = ctx.rows[-1]
            print(f"  {row['case']}: {row['us']:.0f} µs ({row['pct_copy'] or 0:.0f} % of "
                  f"copy); {others}", flush=True)
    extra = _peak_extra(torch, lambda: ops.cross_entropy(work, t, grad_out=work))
    _note(ctx, f"{name}: fused in place peak extra memory {extra / 2**20:.2f} MiB = "
               f"{100 * extra / logits_bytes:.3f} % of the logits")
    if lean:
        return
    x.grad = None
    extra = _peak_extra(torch, lambda: bt.cross_entropy(x, t, inplace_backward=False)
                        .backward())
    _note(ctx, f"{name}: autograd peak extra {extra / 2**20:.0f} MiB (the new gradient "
               "included)")
    x.grad = None
    extra = _peak_extra(torch, lambda: eager(x).backward())
    _note(ctx, f"{name}: torch eager peak extra {extra / 2**20:.0f} MiB")


def _fused_linear(ctx: Any, torch: Any) -> None:
    import torch.nn.functional as F

    import baracuda_numba.torch as bt

    n, h, v = FLCE_SHAPE
    hidden = (torch.randn(n, h, device="cuda") / 4).to(torch.bfloat16).requires_grad_()
    weight = (torch.randn(v, h, device="cuda") / 64).to(torch.bfloat16).requires_grad_()
    t = torch.randint(0, v, (n,), device="cuda")
    t[::17] = -100

    def eager(hd, w):
        return F.cross_entropy(F.linear(hd, w), t)

    fns = {"ours": lambda hd, w: bt.fused_linear_cross_entropy(hd, w, t), "torch": eager}
    liger = _liger_flce()
    if liger is not None:
        fns["liger"] = lambda hd, w: liger(hd, w, t)
    name = f"fused_linear_cross_entropy fwd+bwd hidden {[n, h]} weight {[v, h]}"

    def step(fn: Any) -> Any:
        def call(i: int) -> None:
            hidden.grad = None
            weight.grad = None
            fn(hidden, weight).backward()
        return call

    working = {}
    for label, fn in fns.items():
        try:
            step(fn)(0)
            working[label] = step(fn)
        except Exception as exc:  # noqa: BLE001
            _note(ctx, f"{name}: {label} failed: {type(exc).__name__}: {exc}"[:300])
    labels = list(working)
    times = dict(zip(labels, ctx.time_gpu_many([working[k] for k in labels], warmup=1,
                                               iters=5)))
    others = ", ".join(f"{k} {us:.0f} µs" for k, us in times.items() if k != "ours")
    if "ours" in times:
        ctx.row(name, "bf16", times["ours"], None, times.get("torch"), others)
        print(f"  {name}: {times['ours']:.0f} µs; {others}", flush=True)
    for label in labels:
        hidden.grad = None
        weight.grad = None
        torch.cuda.empty_cache()
        extra = _peak_extra(torch, lambda fn=working[label]: fn(0))
        _note(ctx, f"{name}: {label} peak extra memory {extra / 2**30:.2f} GiB (grads "
                   "included)")
