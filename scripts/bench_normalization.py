"""Benchmark section ``norm``: RMSNorm / LayerNorm (``baracuda_numba.torch``) against torch
eager, ``torch.compile`` (default mode) and Liger-Kernel, bf16, with and without the
fused residual add, forward and forward+backward.

Bytes counted: forward reads x (and the residual) and writes y (and h); the backward
reads dy and the normalized input (and dh) and writes dx (weights and statistics are
negligible). Forward+backward runs with the weights requiring grad and, "dx only", frozen
(``torch.autograd.grad`` wrt the activations: no weight gradient on either side). % of
the copy ceiling measured in the same run. Inputs rotate past L2.
``torch.compile`` is compiled with ``dynamic=True`` (once for the three shapes) before
timing; the torch column is the fastest of the others, the note lists each.

Host time: µs of host work per call at HOST_SHAPE (too small for the GPU to matter), for
RMSNorm and LayerNorm through ``baracuda_numba.torch`` against torch eager, forward (no
grad) and forward+backward, plus the functional layer and one plan ``run`` alone
(where the time goes). ``NORM_BENCH_PROFILE=1`` also prints cProfile's top functions of
our forward+backward call.
"""

from __future__ import annotations

import os
from typing import Any

SHAPES = ((8192, 4096), (16384, 8192), (4096, 16384))
HOST_SHAPE = (64, 4096)
EPS = 1e-6


def _note(ctx: Any, text: str) -> None:
    ctx.notes.append(text)
    print(f"  note: {text}", flush=True)


def _liger(layer: bool, residual: bool) -> Any:
    """Liger's function for this case, or None when the wheel lacks it."""
    try:
        if layer:
            from liger_kernel.ops.layer_norm import LigerLayerNormFunction

            if residual:
                return None
            return lambda x, r, w, b: LigerLayerNormFunction.apply(x, w, b, EPS)
        if residual:
            from liger_kernel.ops.fused_add_rms_norm import LigerFusedAddRMSNormFunction

            return lambda x, r, w, b: LigerFusedAddRMSNormFunction.apply(x, r, w, EPS)
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction

        return lambda x, r, w, b: LigerRMSNormFunction.apply(x, w, EPS)
    except ImportError:
        return None


def _functions(torch: Any, layer: bool, residual: bool) -> dict[str, Any]:
    import torch.nn.functional as F

    import baracuda_numba.torch as bt

    def eager(x, r, w, b):
        h = x + r if residual else x
        y = (F.layer_norm(h, (h.shape[-1],), w, b, EPS) if layer
             else F.rms_norm(h, (h.shape[-1],), w, EPS))
        return (y, h) if residual else y

    def ours(x, r, w, b):
        if layer:
            return bt.layer_norm(x, x.shape[-1], w, b, EPS, residual=r if residual else None)
        return bt.rms_norm(x, x.shape[-1], w, EPS, residual=r if residual else None)

    # dynamic shapes: one compile serves the three shapes (the GPU script's time budget)
    found = {"ours": ours, "torch": eager, "torch.compile": torch.compile(eager, dynamic=True)}
    liger = _liger(layer, residual)
    if liger is not None:
        found["liger"] = liger
    return found


def _outputs(out: Any) -> list[Any]:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _host(ctx: Any, torch: Any) -> None:
    """Host µs per call at HOST_SHAPE (see the module docstring)."""
    import torch.nn.functional as F

    import baracuda_numba.torch as bt
    from baracuda_numba import ops
    from baracuda_numba.plans.normalization import (
        RMSNormArgs,
        RMSNormDescriptor,
        RMSNormPlan,
    )
    from baracuda_numba.types import ElementKind

    rows, n = HOST_SHAPE
    x = torch.randn(HOST_SHAPE, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    # weights as modules hold them (Parameters)
    w = torch.nn.Parameter(torch.randn(n, device="cuda", dtype=torch.bfloat16))
    b = torch.nn.Parameter(torch.randn(n, device="cuda", dtype=torch.bfloat16))
    grad = torch.randn_like(x)
    xd, wd = x.detach(), w.detach()
    y, rstd = ops.rms_norm(xd, n, wd, EPS, return_stats=True)
    plan = RMSNormPlan.select(RMSNormDescriptor(HOST_SHAPE, (n,), ElementKind.BF16, EPS, True))
    calls = {
        "RMSNorm ours": lambda a: bt.rms_norm(a, n, w, EPS),
        "RMSNorm torch": lambda a: F.rms_norm(a, (n,), w, EPS),
        "LayerNorm ours": lambda a: bt.layer_norm(a, n, w, b, EPS),
        "LayerNorm torch": lambda a: F.layer_norm(a, (n,), w, b, EPS),
    }

    def forward(fn: Any) -> Any:
        def call() -> None:
            with torch.no_grad():
                fn(x)
        return call

    def both(fn: Any) -> Any:
        return lambda: fn(x).backward(grad)

    fns = {f"{label} forward": forward(fn) for label, fn in calls.items()}
    fns.update({f"{label} forward+backward": both(fn) for label, fn in calls.items()})
    fns["RMSNorm ops.rms_norm"] = lambda: ops.rms_norm(xd, n, wd, EPS, return_stats=True)
    fns["RMSNorm ops.rms_norm_backward"] = lambda: ops.rms_norm_backward(grad, xd, rstd, n, wd)
    fns["RMSNormPlan.run"] = lambda: plan.run(RMSNormArgs(xd, y, rstd, wd))
    best = ctx.time_host_many(fns)
    for label, us in best.items():
        ctx.row(f"{label} {list(HOST_SHAPE)} host µs/call", "bf16", us)
        print(f"  host {label} {list(HOST_SHAPE)}: {us:.1f} µs/call", flush=True)
    if os.environ.get("NORM_BENCH_PROFILE"):
        import cProfile
        import pstats

        profile = cProfile.Profile()
        profile.enable()
        for _ in range(200):
            fns["RMSNorm ours forward+backward"]()
        profile.disable()
        torch.cuda.synchronize()
        pstats.Stats(profile).sort_stats("tottime").print_stats(25)


def bench(ctx: Any) -> None:
    torch = ctx.torch
    _host(ctx, torch)
    shapes = SHAPES
    if os.environ.get("NORM_BENCH_QUICK"):
        shapes = SHAPES[:1]
    for layer in (False, True):
        for residual in (False, True):
            fns = _functions(torch, layer, residual)
            for shape in shapes:
                _case(ctx, torch, layer, residual, shape, fns)


def _case(ctx: Any, torch: Any, layer: bool, residual: bool, shape: tuple[int, int],
          fns: dict[str, Any]) -> None:
    rows, n = shape
    element = 2
    tensors = rows * n * element
    forward_bytes = tensors * (4 if residual else 2)
    backward_bytes = tensors * (4 if residual else 3)
    sets = ctx.sets_for(forward_bytes)
    xs = [torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True)
          for _ in range(sets)]
    rs = [torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True)
          for _ in range(sets)]
    w = torch.randn(n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    b = torch.randn(n, device="cuda", dtype=torch.bfloat16, requires_grad=True) if layer \
        else None
    grads = [torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(sets)]
    name = f"{'LayerNorm' if layer else 'RMSNorm'}{' +residual' if residual else ''} {list(shape)}"
    working: dict[str, Any] = {}
    for label, fn in fns.items():
        try:
            with torch.no_grad():
                fn(xs[0], rs[0], w, b)
            outs = _outputs(fn(xs[0], rs[0], w, b))
            torch.autograd.backward(outs, [grads[0]] * len(outs))
            working[label] = fn
        except Exception as exc:  # noqa: BLE001 - record and keep going
            _note(ctx, f"{name}: {label} failed: {type(exc).__name__}: {exc}"[:300])
    torch.cuda.synchronize()

    def forward(fn: Any) -> Any:
        def call(i: int) -> None:
            with torch.no_grad():
                fn(xs[i], rs[i], w, b)
        return call

    def both(fn: Any) -> Any:
        def call(i: int) -> None:
            outs = _outputs(fn(xs[i], rs[i], w, b))
            torch.autograd.backward(outs, [grads[i]] * len(outs))
        return call

    # the weights frozen (a fine-tuned or frozen norm): only the activations' gradients,
    # as torch.autograd.grad wrt x; torch then skips dweight, and so do we
    frozen_w, frozen_b = w.detach(), None if b is None else b.detach()

    def activations(fn: Any) -> Any:
        def call(i: int) -> None:
            outs = _outputs(fn(xs[i], rs[i], frozen_w, frozen_b))
            torch.autograd.grad(outs, [xs[i], rs[i]] if residual else [xs[i]],
                                [grads[i]] * len(outs))
        return call

    labels = list(working)
    for mode, maker, moved in (("forward", forward, forward_bytes),
                               ("forward+backward", both, forward_bytes + backward_bytes),
                               ("forward+backward dx only", activations,
                                forward_bytes + backward_bytes)):
        times = ctx.time_gpu_many([maker(working[label]) for label in labels], sets=sets,
                                  warmup=3, iters=15)
        by_label = dict(zip(labels, times))
        if "ours" not in by_label:
            continue
        others = ", ".join(f"{label} {us:.1f} µs" for label, us in by_label.items()
                           if label != "ours")
        ctx.row(f"{name} {mode}", "bf16", by_label["ours"], moved,
                min((us for label, us in by_label.items() if label != "ours"), default=None),
                others)
        row = ctx.rows[-1]
        print(f"  {row['case']}: {row['us']:.1f} µs ({row['pct_copy'] or 0:.0f} % of copy); "
              f"{others}", flush=True)
