"""Benchmark section ``reduce``: every forward kind, Argmax/Argmin and every gradient, f32
and bf16, on [4096, 4096], [256, 1_000_000] and [1_000_000, 64], reducing the last and
the first axis, against torch (forward: the same op with keepdim; gradient:
``torch.autograd.grad`` of that op).

Bytes counted: forward = x read + y written; gradient = the tensors read (dy, and the
saved x and y where the formula needs them) + dx written. ``ROWS`` limits the run.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from baracuda_numba.plans.reduce import (
    ArgReduceArgs,
    ArgReduceDescriptor,
    ArgReducePlan,
    ReduceArgs,
    ReduceBackwardArgs,
    ReduceBackwardDescriptor,
    ReduceBackwardPlan,
    ReduceDescriptor,
    ReducePlan,
)
from baracuda_numba.types import ElementKind, ReduceKind

K = ReduceKind
SHAPES = [((4096, 4096), 1), ((4096, 4096), 0), ((256, 1_000_000), 1), ((256, 1_000_000), 0),
          ((1_000_000, 64), 1), ((1_000_000, 64), 0)]
FORWARD = {
    K.SUM: lambda t, a: t.sum(a, keepdim=True),
    K.MEAN: lambda t, a: t.mean(a, keepdim=True),
    K.MAX: lambda t, a: t.amax(a, keepdim=True),
    K.MIN: lambda t, a: t.amin(a, keepdim=True),
    K.PROD: lambda t, a: t.prod(a, keepdim=True),
    K.NORM2: lambda t, a: t.norm(dim=a, keepdim=True),
    K.LOG_SUM_EXP: lambda t, a: t.logsumexp(a, keepdim=True),
    K.VAR: lambda t, a: t.var(a, keepdim=True),
    K.STD: lambda t, a: t.std(a, keepdim=True),
}
ARG = {K.ARGMAX: lambda t, a: t.argmax(a, keepdim=True),
       K.ARGMIN: lambda t, a: t.argmin(a, keepdim=True)}


def _workspace(torch: Any, plan: Any) -> Any:
    return torch.empty(max(plan.workspace_size, 1), device="cuda", dtype=torch.uint8)


def _compile_everything() -> None:
    """Select one plan per kernel so every kernel is compiled before timing starts."""
    for element in (ElementKind.F32, ElementKind.BF16):
        for kind in FORWARD:
            ReducePlan.select(ReduceDescriptor(kind, (2, 3), 1, element))
            ReduceBackwardPlan.select(ReduceBackwardDescriptor(kind, (2, 3), 1, element))
        for kind in ARG:
            ArgReducePlan.select(ArgReduceDescriptor(kind, (2, 3), 1, element))


def bench(ctx: Any) -> None:
    torch = ctx.torch
    only = os.environ.get("REDUCE_BENCH_ONLY", "")  # e.g. "float32" or "SUM,MAX"
    # REDUCE_BENCH_SHAPES="4096x4096:1,1000000x64:0" limits the shapes and axes;
    # REDUCE_BENCH_PASSES="backward" (or "forward") limits the rows to one direction.
    shapes = os.environ.get("REDUCE_BENCH_SHAPES", "")
    passes = os.environ.get("REDUCE_BENCH_PASSES", "forward,backward")
    wanted = {(tuple(int(n) for n in item.split(":")[0].split("x")), int(item.split(":")[1]))
              for item in shapes.split(",") if item}
    # REDUCE_BENCH_WAIT_FOR=FILE: compile first, then wait until FILE exists (other work on
    # the GPU, such as the test suite, has finished) and re-measure the copy ceiling.
    wait_for = os.environ.get("REDUCE_BENCH_WAIT_FOR")
    # A subset run leaves each kernel to compile in its rows' untimed warm-up (compiling
    # every kernel first costs minutes on a fresh machine before the first row).
    if wait_for or not (only or shapes):
        started = time.perf_counter()
        _compile_everything()
        print(f"[reduce] kernels compiled in {time.perf_counter() - started:.1f}s",
              file=sys.stderr, flush=True)
    if wait_for:
        while not os.path.exists(wait_for):
            time.sleep(0.5)
        from bench import measure_copy_gbps

        ctx.copy_gbps = measure_copy_gbps(torch)
        print(f"[reduce] copy ceiling re-measured: {ctx.copy_gbps:.0f} GB/s", file=sys.stderr,
              flush=True)
    for dtype_name, element in (("float32", ElementKind.F32), ("bfloat16", ElementKind.BF16)):
        if only and dtype_name not in only and not any(k.name in only for k in FORWARD):
            continue
        dtype = getattr(torch, dtype_name)
        for shape, axis in SHAPES:
            if wanted and (shape, axis) not in wanted:
                continue
            started = time.perf_counter()
            numel = shape[0] * shape[1]
            nbytes = numel * element.byte_width
            sets = ctx.sets_for(nbytes)
            xs = [(torch.rand(shape, device="cuda", dtype=torch.float32) * 4 - 2).to(dtype)
                  for _ in range(sets)]
            out_shape = tuple(1 if d == axis else s for d, s in enumerate(shape))
            out_bytes = nbytes // shape[axis]
            label = f"{list(shape)} axis {axis}"
            for kind, fn in FORWARD.items():
                if only and kind.name not in only and dtype_name not in only \
                        or "forward" not in passes:
                    continue
                plan = ReducePlan.select(ReduceDescriptor(kind, shape, axis, element))
                y = torch.empty(out_shape, device="cuda", dtype=dtype)
                ws = _workspace(torch, plan)
                ours, theirs = ctx.time_gpu_many(
                    [lambda i, p=plan, y=y, w=ws, xs=xs: p.run(ReduceArgs(xs[i], y), workspace=w),
                     lambda i, f=fn, xs=xs, a=axis: f(xs[i], a)], sets=sets, warmup=3, iters=20)
                ctx.row(f"{kind.name} {label}", dtype_name, ours, nbytes + out_bytes, theirs)
            for kind, fn in ARG.items():
                if only and kind.name not in only and dtype_name not in only \
                        or "forward" not in passes:
                    continue
                arg = ArgReducePlan.select(ArgReduceDescriptor(kind, shape, axis, element))
                idx = torch.empty(out_shape, device="cuda", dtype=torch.int64)
                ws = _workspace(torch, arg)
                ours, theirs = ctx.time_gpu_many(
                    [lambda i, p=arg, y=idx, w=ws, xs=xs: p.run(ArgReduceArgs(xs[i], y),
                                                                workspace=w),
                     lambda i, f=fn, xs=xs, a=axis: f(xs[i], a)], sets=sets, warmup=3, iters=20)
                ctx.row(f"{kind.name} {label}", dtype_name, ours,
                        nbytes + out_bytes // element.byte_width * 8, theirs)
            x = xs[0]
            dx = torch.empty_like(x)
            for kind, fn in FORWARD.items():
                if only and kind.name not in only and dtype_name not in only \
                        or "backward" not in passes:
                    continue
                xg = x.detach().requires_grad_(True)
                out = fn(xg, axis)
                dy = torch.rand_like(out) * 2 - 1
                y = out.detach()
                plan = ReduceBackwardPlan.select(ReduceBackwardDescriptor(kind, shape, axis,
                                                                          element))
                ws = _workspace(torch, plan)
                saved = kind not in (K.SUM, K.MEAN)
                args = ReduceBackwardArgs(dy, dx, x if saved else None, y if saved else None)
                ours, theirs = ctx.time_gpu_many(
                    [lambda i, p=plan, a=args, w=ws: p.run(a, workspace=w),
                     lambda i, o=out, xg=xg, g=dy: torch.autograd.grad(o, xg, g,
                                                                       retain_graph=True)],
                    warmup=3, iters=20)
                moved = 2 * nbytes + 2 * out_bytes if saved else nbytes + out_bytes
                ctx.row(f"{kind.name} backward {label}", dtype_name, ours, moved, theirs)
                out = xg = None
            xs = x = dx = None
            torch.cuda.empty_cache()
            print(f"[reduce] {dtype_name} {label}: {time.perf_counter() - started:.1f}s",
                  file=sys.stderr, flush=True)
            for row in ctx.rows[-20:]:
                print(f"  {row['case']:40s} {row['us']:9.1f} us  {row['pct_copy'] or 0:5.0f}% "
                      f"torch {row['torch_us'] or 0:9.1f} us", file=sys.stderr, flush=True)
    x = torch.rand((4096, 4096), device="cuda")
    y = torch.empty((4096, 1), device="cuda")
    plan = ReducePlan.select(ReduceDescriptor(K.SUM, (4096, 4096), 1, ElementKind.F32))
    ws = _workspace(torch, plan)
    host_us = ctx.time_host(lambda: plan.run(ReduceArgs(x, y), workspace=ws), calls=2000)
    torch_host_us = ctx.time_host(lambda: torch.sum(x, 1, keepdim=True), calls=2000)
    ctx.notes.append(f"Host time per ReducePlan.run (Sum [4096, 4096] f32, torch tensors): "
                     f"{host_us:.1f} µs (torch.sum: {torch_host_us:.1f} µs).")
    ctx.notes.append("Forward bytes = x read + y written; gradient bytes = dx written + dy "
                     "read (+ the saved x and y for every kind but Sum/Mean). The Var/Std "
                     "gradients read x once where each line fits in one block's registers "
                     "([4096, 4096] both axes, [256, 1e6] axis 0, [1e6, 64] axis 1) and, "
                     "where the resident blocks hold four rows' chunks in their registers "
                     "and shared memory ([256, 1e6] axis 1: the hold kernel, f32 with its "
                     "shared-memory stash), else twice (mean, then "
                     "gradient: [1e6, 64] axis 0). The Max/Min gradients read "
                     "x once: from registers, through the hold kernel (with its stash) "
                     "where the resident blocks hold eight rows' chunks in their registers "
                     "([256, 1e6] axis 1 bf16), or (other "
                     "split rows, long columns, f32 columns of at most 1024 rows) dx is "
                     "written with every tie count taken as 1 while each split counts its "
                     "ties and "
                     "records them in bit masks, then only the tied words of lines with "
                     "several ties are rewritten, from the masks. The byte count counts x "
                     "once, as the issue's target does.")
    ctx.notes.append("torch's Sum gradient is dy.expand(...): a view, no memory written, so "
                     "its time is autograd's host overhead; this plan writes dx.")
    ctx.notes.append("Workspace passed (split reductions); torch times its own kernels "
                     "(torch.autograd.grad for gradients). Each row times this package's call "
                     "and torch's alternately, iteration by iteration (Context.time_gpu_many), "
                     "on the same inputs.")
