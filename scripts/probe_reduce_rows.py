"""Probe (GPU): the forward word-access row kernel of ``ReducePlan`` at [4096, 4096] along
the rows, and the benchmark's order effect (the first case timed on fresh inputs).

``python scripts/probe_reduce_rows.py [part ...]``, parts:

* ``geometry``: Sum of f32 / bf16 [4096, 4096] axis 1 with the row geometry's words per
  lane overridden (lanes 32 .. 256 per row), with and without the one-wave split, against
  ``torch.sum`` and a ``copy_`` of the same bytes;
* ``rows``: Sum, Max, Norm2, Var, Argmax of f32 / bf16 rows ([4096, 4096], [256, 1e6],
  [1e6, 64] axis 1) as the plans choose them, against torch (commit f23faa7 ran it once
  per ``BARACUDA_REDUCE_PAIR`` = 1 / 2: 8- or 16-byte loads in the forward row loop);
* ``order``: Sum, Mean, Sum again (one kernel: Mean is Sum divided by n) on inputs
  allocated just before, for the shapes whose first benchmark row looked slow.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
from bench import Context

from baracuda_numba.plans import reduce as plans
from baracuda_numba.plans.reduce import ReduceArgs, ReduceDescriptor, ReducePlan
from baracuda_numba.types import ElementKind, ReduceKind

ELEMENTS = {"float32": ElementKind.F32, "bfloat16": ElementKind.BF16}


def _inputs(ctx: Context, shape: tuple[int, ...], dtype: Any) -> tuple[list[Any], int]:
    nbytes = shape[0] * shape[1] * dtype.itemsize
    sets = ctx.sets_for(nbytes)
    xs = [(torch.rand(shape, device="cuda") * 4 - 2).to(dtype) for _ in range(sets)]
    return xs, sets


def _time_plan(ctx: Context, plan: Any, xs: list[Any], sets: int, out_shape: tuple[int, ...],
               with_ws: bool) -> float:
    y = torch.empty(out_shape, device="cuda", dtype=xs[0].dtype)
    ws = torch.empty(max(plan.workspace_size, 1), device="cuda", dtype=torch.uint8) \
        if with_ws else None
    return ctx.time_gpu(lambda i: plan.run(ReduceArgs(xs[i], y), workspace=ws), sets=sets,
                        warmup=5, iters=40)


def geometry(ctx: Context) -> None:
    shape, axis = (4096, 4096), 1
    out_shape = (4096, 1)
    defaults = (plans._VEC_WORDS_PER_LANE, plans._VEC_WARP_ROW_WORDS, plans._VEC_TARGET_BLOCKS)
    for name, element in ELEMENTS.items():
        dtype = getattr(torch, name)
        xs, sets = _inputs(ctx, shape, dtype)
        dst = [torch.empty_like(x) for x in xs]
        copy_us = ctx.time_gpu(lambda i, d=dst, s=xs: d[i].copy_(s[i]), sets=sets,
                               warmup=5, iters=40)
        torch_us = ctx.time_gpu(lambda i, s=xs: s[i].sum(1, keepdim=True), sets=sets, warmup=5,
                                iters=40)
        print(f"{name}: copy_ of the same bytes {copy_us:.2f} us (moves 2x), torch.sum "
              f"{torch_us:.2f} us", flush=True)
        for per_lane in (64, 32, 16, 8, 4):
            for target in (defaults[2], 132 * 8, 132 * 16):
                plans._VEC_WORDS_PER_LANE = per_lane
                plans._VEC_TARGET_BLOCKS = target
                for with_ws in (False, True):
                    if target != defaults[2] and not with_ws:
                        continue
                    plan = ReducePlan.select(ReduceDescriptor(ReduceKind.SUM, shape, axis,
                                                              element))
                    words = shape[1] // plans.VECTOR[element].width
                    g = plans._rows_vec_geometry(4096, shape[1], plans.VECTOR[element].width,
                                                 plan._max_splits if with_ws else 1)
                    us = _time_plan(ctx, plan, xs, sets, out_shape, with_ws)
                    print(f"  {name} per_lane {per_lane:3d} target {target:5d} ws {with_ws:d}: "
                          f"lanes {g.lanes:3d} splits {g.splits} groups {g.groups} "
                          f"({words} words/row) {us:7.2f} us", flush=True)
        plans._VEC_WORDS_PER_LANE, plans._VEC_WARP_ROW_WORDS, plans._VEC_TARGET_BLOCKS = \
            defaults


def rows(ctx: Context) -> None:
    from baracuda_numba.plans.reduce import ArgReduceArgs, ArgReduceDescriptor, ArgReducePlan

    torch_ops = {ReduceKind.SUM: lambda t: t.sum(1, keepdim=True),
                 ReduceKind.MAX: lambda t: t.amax(1, keepdim=True),
                 ReduceKind.NORM2: lambda t: t.norm(dim=1, keepdim=True),
                 ReduceKind.VAR: lambda t: t.var(1, keepdim=True),
                 ReduceKind.ARGMAX: lambda t: t.argmax(1, keepdim=True)}
    for name, element in ELEMENTS.items():
        dtype = getattr(torch, name)
        for shape in ((4096, 4096), (256, 1_000_000), (1_000_000, 64)):
            xs, sets = _inputs(ctx, shape, dtype)
            out_shape = (shape[0], 1)
            for kind, fn in torch_ops.items():
                if kind is ReduceKind.ARGMAX:
                    plan = ArgReducePlan.select(ArgReduceDescriptor(kind, shape, 1, element))
                    y = torch.empty(out_shape, device="cuda", dtype=torch.int64)
                    ws = torch.empty(max(plan.workspace_size, 1), device="cuda",
                                     dtype=torch.uint8)
                    us = ctx.time_gpu(lambda i, p=plan, y=y, w=ws, s=xs:
                                      p.run(ArgReduceArgs(s[i], y), workspace=w),
                                      sets=sets, warmup=5, iters=40)
                else:
                    plan = ReducePlan.select(ReduceDescriptor(kind, shape, 1, element))
                    us = _time_plan(ctx, plan, xs, sets, out_shape, True)
                theirs = ctx.time_gpu(lambda i, f=fn, s=xs: f(s[i]), sets=sets, warmup=5,
                                      iters=40)
                moved = shape[0] * shape[1] * dtype.itemsize
                print(f"  {name} {kind.name:6s} {list(shape)} axis 1: {us:8.2f} us "
                      f"({moved / us / 1e3 / ctx.copy_gbps * 100:5.1f}% copy) torch "
                      f"{theirs:8.2f} ({theirs / us:.2f}x)", flush=True)
            xs = None
            torch.cuda.empty_cache()


def order(ctx: Context) -> None:
    for (shape, axis), name in (((256, 1_000_000), 0), "float32"), \
            (((1_000_000, 64), 1), "float32"), (((1_000_000, 64), 1), "bfloat16"):
        dtype = getattr(torch, name)
        element = ELEMENTS[name]
        out_shape = tuple(1 if d == axis else s for d, s in enumerate(shape))
        for attempt in range(2):
            xs, sets = _inputs(ctx, shape, dtype)
            figures = []
            for kind in (ReduceKind.SUM, ReduceKind.MEAN, ReduceKind.SUM):
                plan = ReducePlan.select(ReduceDescriptor(kind, shape, axis, element))
                us = _time_plan(ctx, plan, xs, sets, out_shape, True)
                figures.append(f"{kind.name} {us:.2f}")
            print(f"{name} {list(shape)} axis {axis} fresh inputs #{attempt}: "
                  + ", ".join(figures) + " us", flush=True)
            xs = None
            torch.cuda.empty_cache()


def main(argv: list[str]) -> None:
    parts = argv or ["geometry", "order"]
    from bench import measure_copy_gbps

    ctx = Context("probe", torch)
    ctx.copy_gbps = measure_copy_gbps(torch)
    print(torch.cuda.get_device_name(), f"copy {ctx.copy_gbps:.0f} GB/s", flush=True)
    for part in parts:
        globals()[part](ctx)


if __name__ == "__main__":
    main(sys.argv[1:])
