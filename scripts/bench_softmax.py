"""Benchmark section ``softmax``: softmax forward and backward (and log-softmax forward),
bf16 and f32, on the issue's shapes (last axis of [8192, 4096], [4096, 32768],
[1024, 128256], [256, 262144]; axis 0 of [32768, 4096]), through the plans, against torch
eager (the speed-up column), ``torch.compile`` (default mode, compiled before timing) and
Liger-Kernel's softmax (last axis; rows over 65536 it refuses), in the note.

Bytes counted: forward = x read + y written; backward = dy and y read + dx written.
``SOFTMAX_BENCH_SHAPES="8192x4096:1,32768x4096:0"`` limits the shapes. ``--sweep`` adds
tuning rows (CSV only): each last-axis row forced through the other row paths
(``SoftmaxForce(path=...)``: registers where the row fits, stream, elements).
"""

from __future__ import annotations

import os
from typing import Any

from baracuda_numba.plans.softmax import (
    SoftmaxArgs,
    SoftmaxBackwardArgs,
    SoftmaxBackwardDescriptor,
    SoftmaxBackwardPlan,
    SoftmaxDescriptor,
    SoftmaxForce,
    SoftmaxPlan,
)
from baracuda_numba.types import ElementKind, SoftmaxKind

SHAPES = [((8192, 4096), 1), ((4096, 32768), 1), ((1024, 128256), 1), ((256, 262144), 1),
          ((32768, 4096), 0)]
ITERS = 10


def _liger(torch: Any, n: int) -> tuple[Any, Any] | None:
    """Liger's forward and backward callables for rows of ``n``, or None (not installed,
    or it refuses the row length)."""
    try:
        from liger_kernel.ops.softmax import _softmax_backward, _softmax_forward
        from liger_kernel.ops.utils import calculate_settings

        block, warps = calculate_settings(n)
    except Exception:  # noqa: BLE001 - missing, or rows over its limit
        return None
    multi = n > block
    return (lambda x: _softmax_forward(x)[0],
            lambda dy, y: _softmax_backward(dy, y, block, warps, multi))


def _softmax_backward_reference(dy: Any, y: Any, dim: int) -> Any:
    return y * (dy - (dy * y).sum(dim, keepdim=True))


def _peers(ours: float, compiled: float, liger: float | None) -> str:
    text = f"compile {compiled:.1f} µs ({compiled / ours:.2f}x)"
    if liger is not None:
        text += f"; liger {liger:.1f} µs ({liger / ours:.2f}x)"
    return text


def _sweep_paths(ctx: Any, select: Any, run: Any, case: str, dtype_name: str, sets: int,
                 moved: int, default: str) -> None:
    """Tuning rows: ``case`` through each row path other than ``default`` that takes it."""
    torch = ctx.torch
    for path in ("registers", "stream", "elements"):
        plan = select(SoftmaxForce(path=path))
        if path == default or plan.choice.path != path:
            continue
        ws = torch.empty(max(plan.workspace_size, 1), device="cuda", dtype=torch.uint8)
        us = ctx.time_gpu(lambda i, p=plan, w=ws: run(p, w, i), sets=sets, warmup=3,
                          iters=ITERS)
        ctx.row(f"{case} path {path}", dtype_name, us, moved,
                note=f"{plan.choice.kernel}, {plan.choice.parts} part(s)", tuning=True)


def bench(ctx: Any) -> None:
    torch = ctx.torch
    wanted = {(tuple(int(n) for n in item.split(":")[0].split("x")), int(item.split(":")[1]))
              for item in os.environ.get("SOFTMAX_BENCH_SHAPES", "").split(",") if item}
    compiled = {SoftmaxKind.SOFTMAX: torch.compile(lambda x, d: torch.softmax(x, d)),
                SoftmaxKind.LOG_SOFTMAX: torch.compile(lambda x, d: torch.log_softmax(x, d)),
                "backward": torch.compile(_softmax_backward_reference)}
    for dtype_name, element in (("bfloat16", ElementKind.BF16), ("float32", ElementKind.F32)):
        for shape, axis in SHAPES:
            if not wanted or (shape, axis) in wanted:
                _shape_rows(ctx, compiled, dtype_name, element, shape, axis)
                torch.cuda.empty_cache()


def _shape_rows(ctx: Any, compiled: dict[Any, Any], dtype_name: str, element: ElementKind,
                shape: tuple[int, int], axis: int) -> None:
    torch = ctx.torch
    dtype = getattr(torch, dtype_name)
    nbytes = shape[0] * shape[1] * element.byte_width
    sets = ctx.sets_for(nbytes)
    xs = [(torch.randn(shape, device="cuda", dtype=torch.float32) * 3).to(dtype)
          for _ in range(sets)]
    y = torch.empty_like(xs[0])
    label = f"{list(shape)} axis {axis}"
    liger = _liger(torch, shape[1]) if axis == 1 else None
    for kind, eager in ((SoftmaxKind.SOFTMAX, torch.softmax),
                        (SoftmaxKind.LOG_SOFTMAX, torch.log_softmax)):
        plan = SoftmaxPlan.select(SoftmaxDescriptor(shape, axis, kind, element))
        ws = torch.empty(max(plan.workspace_size, 1), device="cuda", dtype=torch.uint8)
        fns = [lambda i, p=plan, w=ws: p.run(SoftmaxArgs(xs[i], y), workspace=w),
               lambda i, f=eager: f(xs[i], axis),
               lambda i, f=compiled[kind]: f(xs[i], axis)]
        if liger is not None and kind is SoftmaxKind.SOFTMAX:
            fns.append(lambda i, f=liger[0]: f(xs[i]))
        for fn in fns[2:]:
            fn(0)  # compile before timing
        times = ctx.time_gpu_many(fns, sets=sets, warmup=3, iters=ITERS)
        c = plan.choice
        if ctx.sweep and axis == 1 and kind is SoftmaxKind.SOFTMAX:
            _sweep_paths(ctx, lambda force, k=kind: SoftmaxPlan.select(
                SoftmaxDescriptor(shape, axis, k, element), force=force),
                lambda p, w, i: p.run(SoftmaxArgs(xs[i], y), workspace=w),
                f"{kind.name.lower()} {label}", dtype_name, sets, 2 * nbytes, c.path)
        ctx.row(f"{kind.name.lower()} {label}", dtype_name, times[0], 2 * nbytes, times[1],
                f"{c.kernel}, {c.parts} part(s); "
                + _peers(times[0], times[2], times[3] if len(times) > 3 else None))
    # the softmax backward from its saved output
    ys = [torch.softmax(x.float(), axis).to(dtype) for x in xs]
    dys = [torch.randn(shape, device="cuda", dtype=dtype) for _ in range(sets)]
    dx = torch.empty_like(xs[0])
    plan = SoftmaxBackwardPlan.select(SoftmaxBackwardDescriptor(shape, axis,
                                                                SoftmaxKind.SOFTMAX, element))
    ws = torch.empty(max(plan.workspace_size, 1), device="cuda", dtype=torch.uint8)
    aten = torch.ops.aten._softmax_backward_data
    fns = [lambda i: plan.run(SoftmaxBackwardArgs(dys[i], ys[i], dx), workspace=ws),
           lambda i: aten(dys[i], ys[i], axis, dtype),
           lambda i: compiled["backward"](dys[i], ys[i], axis)]
    if liger is not None:
        fns.append(lambda i: liger[1](dys[i], ys[i]))
    for fn in fns[2:]:
        fn(0)
    times = ctx.time_gpu_many(fns, sets=sets, warmup=3, iters=ITERS)
    if ctx.sweep and axis == 1:
        _sweep_paths(ctx, lambda force: SoftmaxBackwardPlan.select(
            SoftmaxBackwardDescriptor(shape, axis, SoftmaxKind.SOFTMAX, element), force=force),
            lambda p, w, i: p.run(SoftmaxBackwardArgs(dys[i], ys[i], dx), workspace=w),
            f"softmax backward {label}", dtype_name, sets, 3 * nbytes, plan.choice.path)
    ctx.row(f"softmax backward {label}", dtype_name, times[0], 3 * nbytes, times[1],
            f"{plan.choice.kernel}, {plan.choice.parts} part(s); "
            + _peers(times[0], times[2], times[3] if len(times) > 3 else None))
