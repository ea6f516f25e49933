"""Probe (GPU): the forward word-access row kernel of ``ReducePlan`` at [4096, 4096] along
the rows, and the benchmark's order effect (the first case timed on fresh inputs).

``python scripts/probe_reduce_rows.py [part ...]``, parts:

* ``geometry``: Sum of f32 / bf16 [4096, 4096] axis 1 with the row geometry's words per
  lane overridden (lanes 32 .. 256 per row), with and without the one-wave split, against
  ``torch.sum`` and a ``copy_`` of the same bytes;
* ``rows``: Sum, Max, Norm2, Var, Argmax of f32 / bf16 rows ([4096, 4096], [256, 1e6],
  [1e6, 64] axis 1) as the plans choose them, against torch (commit f23faa7 ran it once
  per ``BARACUDA_REDUCE_PAIR`` = 1 / 2: 8- or 16-byte loads in the forward row loop);
* ``grads``: Mean / Max / Var / Std gradients of [256, 1e6] along rows, timed and
  compared with ``torch.autograd``;
* ``caps``: the gradient row kernel at register caps (Prod / Norm2 / LogSumExp 64, Max /
  Var 80) against the uncapped one, on [4096, 4096], [256, 1e6] and [1e6, 64] along rows;
* ``cols``: the column register-resident gradient (Max / Var / Std of [4096, 4096] along
  axis 0) with other strips: 32-byte strips in 1024-thread blocks (the plan's), 16-byte
  strips in 512-thread blocks at 64 registers (two resident per SM) or 80 (one), 8-byte
  strips in 256-thread blocks (four per SM); f32 Max also through the tie count;
* ``ties``: the Max gradients of bf16 / f32 [256, 1e6] axis 1, bf16 [256, 1e6] axis 0,
  [1e6, 64] axis 0 and [4096, 4096] axis 0 and the Var gradient of bf16 [1e6, 64] axis 0,
  each run twice with a workspace, for a profiler: ``ncu --cache-control none
  --clock-control none --metrics gpu__time_duration.sum -k regex:reduce_backward python3
  scripts/probe_reduce_rows.py ties`` gives each pass's time (first pass, tie merge,
  rewrite); ``PROBE_CASES`` (``KIND:RxC:axis:dtype,...``; MAX / MIN / VAR / STD) replaces
  the cases;
* ``sync``: the Var / Std gradients of f32 / bf16 [256, 1e6] axis 1 (and
  ``PROBE_SHAPES``) through the row-sync kernel (batches per item, grid) against the plan
  without it (statistic pass + split gradient), timed alternately, each checked against
  ``torch.autograd`` and for repeatable bits;
* ``strips``: the column register-resident gradients (Max / Min / Var / Std of f32 / bf16
  ``PROBE_SHAPES``, default [4096, 4096] and [256, 1e6], along axis 0) as before the wider
  strips (32-byte strips in 1024-thread blocks, no 128-byte f16/bf16 strips) and now (the
  shared-memory stash kernel, 128-byte f16/bf16 strips in small blocks), Max / Min also
  through the tie count, timed alternately, each checked against ``torch.autograd`` and
  for repeatable bits (``PROBE_DTYPES`` limits the dtypes);
* ``order``: Sum, Mean, Sum again (one kernel: Mean is Sum divided by n) on inputs
  allocated just before, for the shapes whose first benchmark row looked slow.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import torch
from bench import Context
from bench_reduce import _workspace

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
    ws = _workspace(torch, plan) if with_ws else None
    return ctx.time_gpu(lambda i: plan.run(ReduceArgs(xs[i], y), workspace=ws), sets=sets,
                        warmup=5, iters=40)


def geometry(ctx: Context) -> None:
    """``PROBE_SHAPES`` (default ``4096x4096``), ``PROBE_PER_LANE`` (words per lane aimed
    at, default ``64,32,16,8,4``) and ``PROBE_TARGETS`` (blocks the split aims at, default
    ``528,1056,2112``) select the variants."""
    shapes = [tuple(int(n) for n in item.split("x"))
              for item in os.environ.get("PROBE_SHAPES", "4096x4096").split(",")]
    per_lanes = [int(n) for n in os.environ.get("PROBE_PER_LANE", "64,32,16,8,4").split(",")]
    targets = [int(n) for n in os.environ.get("PROBE_TARGETS", "528,1056,2112").split(",")]
    defaults = (plans._VEC_WORDS_PER_LANE, plans._VEC_WARP_ROW_WORDS, plans._VEC_TARGET_BLOCKS)
    # PROBE_WARP_ROW_WORDS: rows of at least this many words keep >= 32 lanes (a larger
    # value lets long rows take fewer lanes)
    warp_row_words = int(os.environ.get("PROBE_WARP_ROW_WORDS", defaults[1]))
    for shape in shapes:
        out_shape = (shape[0], 1)
        for name, element in ELEMENTS.items():
            dtype = getattr(torch, name)
            xs, sets = _inputs(ctx, shape, dtype)
            dst = [torch.empty_like(x) for x in xs]
            copy_us = ctx.time_gpu(lambda i, d=dst, s=xs: d[i].copy_(s[i]), sets=sets,
                                   warmup=5, iters=40)
            dst = None
            torch_us = ctx.time_gpu(lambda i, s=xs: s[i].sum(1, keepdim=True), sets=sets,
                                    warmup=5, iters=40)
            print(f"{name} {list(shape)}: copy_ of the same bytes {copy_us:.2f} us (moves "
                  f"2x), torch.sum {torch_us:.2f} us", flush=True)
            width = plans.VECTOR[element].width
            for per_lane in per_lanes:
                for target in targets:
                    plans._VEC_WORDS_PER_LANE = per_lane
                    plans._VEC_TARGET_BLOCKS = target
                    plans._VEC_WARP_ROW_WORDS = warp_row_words
                    for with_ws in (False, True):
                        if target != defaults[2] and not with_ws:
                            continue
                        plan = ReducePlan.select(ReduceDescriptor(ReduceKind.SUM, shape, 1,
                                                                  element))
                        g = plans._rows_vec_geometry(shape[0], shape[1], width,
                                                     plan._max_splits if with_ws else 1)
                        us = _time_plan(ctx, plan, xs, sets, out_shape, with_ws)
                        print(f"  {name} per_lane {per_lane:4d} target {target:5d} ws "
                              f"{with_ws:d}: lanes {g.lanes:3d} splits {g.splits:2d} groups "
                              f"{g.groups} ({shape[1] // width} words/row) {us:8.2f} us",
                              flush=True)
            plans._VEC_WORDS_PER_LANE, plans._VEC_WARP_ROW_WORDS, \
                plans._VEC_TARGET_BLOCKS = defaults
            xs = None
            torch.cuda.empty_cache()


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
                    ws = _workspace(torch, plan)
                    us = ctx.time_gpu(lambda i, p=plan, y=y, w=ws, s=xs:
                                      p.run(ArgReduceArgs(s[i], y), workspace=w),
                                      sets=sets, warmup=5, iters=40)
                else:
                    plan = ReducePlan.select(ReduceDescriptor(kind, shape, 1, element))
                    us = _time_plan(ctx, plan, xs, sets, out_shape, True)
                    _check(plan, kind, xs[0], out_shape)
                theirs = ctx.time_gpu(lambda i, f=fn, s=xs: f(s[i]), sets=sets, warmup=5,
                                      iters=40)
                moved = shape[0] * shape[1] * dtype.itemsize
                print(f"  {name} {kind.name:6s} {list(shape)} axis 1: {us:8.2f} us "
                      f"({moved / us / 1e3 / ctx.copy_gbps * 100:5.1f}% copy) torch "
                      f"{theirs:8.2f} ({theirs / us:.2f}x)", flush=True)
            xs = None
            torch.cuda.empty_cache()


def _check(plan: Any, kind: ReduceKind, x: Any, out_shape: tuple[int, ...]) -> None:
    """Sum / Max against float64 torch (Sum: within 1e-5 of the sum of |x|)."""
    if kind not in (ReduceKind.SUM, ReduceKind.MAX):
        return
    y = torch.full(out_shape, float("nan"), device="cuda", dtype=x.dtype)
    ws = _workspace(torch, plan)
    plan.run(ReduceArgs(x, y), workspace=ws)
    x64 = x.double()
    if kind is ReduceKind.MAX:
        assert torch.equal(y, x.amax(1, keepdim=True)), "Max differs from torch"
        return
    scale = x64.abs().sum(1, keepdim=True)
    err = ((y.double() - x64.sum(1, keepdim=True)).abs() / scale).max().item()
    rounding = 2.0 ** -8 if x.dtype == torch.bfloat16 else 1e-5
    assert err < rounding, f"Sum error {err}"


def grads(ctx: Context) -> None:
    """Mean / Max / Var / Std gradients of f32 and bf16 [256, 1e6] along rows (Var / Std:
    the statistic pass is the forward kernel in state mode, then the split gradient;
    commit d735545 added ``PROBE_OLD_SPLIT=1`` for its A/B)."""
    from baracuda_numba.plans.reduce import (
        ReduceBackwardArgs,
        ReduceBackwardDescriptor,
        ReduceBackwardPlan,
    )

    shape = (256, 1_000_000)
    for name, element in ELEMENTS.items():
        dtype = getattr(torch, name)
        x = (torch.rand(shape, device="cuda") * 4 - 2).to(dtype)
        dx = torch.empty_like(x)
        for kind, fn in ((ReduceKind.MEAN, lambda t: t.mean(1, keepdim=True)),
                         (ReduceKind.MAX, lambda t: t.amax(1, keepdim=True)),
                         (ReduceKind.VAR, lambda t: t.var(1, keepdim=True)),
                         (ReduceKind.STD, lambda t: t.std(1, keepdim=True))):
            xg = x.detach().requires_grad_(True)
            out = fn(xg)
            dy = torch.rand_like(out) * 2 - 1
            saved = kind is not ReduceKind.MEAN
            plan = ReduceBackwardPlan.select(ReduceBackwardDescriptor(kind, shape, 1, element))
            ws = _workspace(torch, plan)
            args = ReduceBackwardArgs(dy, dx, x if saved else None,
                                      out.detach() if saved else None)
            us = ctx.time_gpu(lambda i, p=plan, a=args, w=ws: p.run(a, workspace=w),
                              warmup=5, iters=20)
            (expect,) = torch.autograd.grad(out, xg, dy)
            err = ((dx.double() - expect.double()).abs().max()
                   / expect.double().abs().max()).item()
            moved = (2 if saved else 1) * x.numel() * x.element_size()  # as the bench
            print(f"  {name} {kind.name} backward {list(shape)} axis 1: {us:8.2f} us "
                  f"({moved / us / 1e3 / ctx.copy_gbps * 100:5.1f}% copy), max rel err vs "
                  f"autograd {err:.1e}", flush=True)
            out = xg = None
        x = dx = None
        torch.cuda.empty_cache()


def caps(ctx: Context) -> None:
    """The gradient row kernel (``reduce_backward_rows_vec``) at register caps: Prod /
    Norm2 / LogSumExp uncapped use 77-80 registers (3 resident 256-thread blocks per SM),
    64 without spilling (4); Max / Var 106-127 (2), 80 with spills. Each variant is timed
    on the same buffers and compared bit for bit with the uncapped kernel's dx."""
    from baracuda_numba.kernels import reduce as kernels
    from baracuda_numba.launch import Kernel

    table = kernels.REDUCE_BACKWARD_ROWS_VEC_KERNELS
    variants = {ReduceKind.PROD: (lambda t: t.prod(1, keepdim=True), (None, 64)),
                ReduceKind.NORM2: (lambda t: t.norm(dim=1, keepdim=True), (None, 64)),
                ReduceKind.LOG_SUM_EXP: (lambda t: t.logsumexp(1, keepdim=True), (None, 64)),
                ReduceKind.MAX: (lambda t: t.amax(1, keepdim=True), (None, 80)),
                ReduceKind.VAR: (lambda t: t.var(1, keepdim=True), (None, 80))}
    for name, element in ELEMENTS.items():
        dtype = getattr(torch, name)
        for shape in ((4096, 4096), (256, 1_000_000), (1_000_000, 64)):
            x = (torch.rand(shape, device="cuda") * 4 - 2).to(dtype)
            dx = torch.empty_like(x)
            for kind, (fn, cap_list) in variants.items():
                out = fn(x.float()).to(dtype)
                dy = torch.rand_like(out) * 2 - 1
                original = table[(kind, element)]
                figures, first = [], None
                for cap in cap_list:
                    if cap is not None:
                        table[(kind, element)] = Kernel(f"{original.name}@{cap}",
                                                        original.py_func, original.signature,
                                                        register=False, max_registers=cap)
                    try:
                        plan, ws, args = _gradient(kind, shape, 1, element, dy, dx, x, out)
                        us = ctx.time_gpu(lambda i, p=plan, a=args, w=ws: p.run(a, workspace=w),
                                          warmup=5, iters=20)
                    finally:
                        table[(kind, element)] = original
                    bits = dx.view(torch.int16 if dx.element_size() == 2 else torch.int32)
                    same = "" if first is None else \
                        (" same bits" if torch.equal(bits, first) else " BITS DIFFER")
                    first = bits.clone() if first is None else first
                    moved = 2 * x.numel() * x.element_size()
                    figures.append(f"cap {cap}: {us:8.2f} us "
                                   f"({moved / us / 1e3 / ctx.copy_gbps * 100:4.1f}%){same}")
                print(f"  {name} {kind.name:11s} backward {list(shape)} axis 1: "
                      + ", ".join(figures), flush=True)
            x = dx = None
            torch.cuda.empty_cache()


def _gradient(kind: ReduceKind, shape: tuple[int, ...], axis: int, element: ElementKind,
              dy: Any, dx: Any, x: Any, out: Any) -> tuple[Any, Any, Any]:
    """``(plan, workspace, args)``: a ``ReduceBackwardPlan`` selected under the probe's
    current overrides, its workspace and the args writing ``dx``, poisoned with NaN."""
    from baracuda_numba.plans.reduce import (
        ReduceBackwardArgs,
        ReduceBackwardDescriptor,
        ReduceBackwardPlan,
    )

    plan = ReduceBackwardPlan.select(ReduceBackwardDescriptor(kind, shape, axis, element))
    dx.fill_(float("nan"))
    return plan, _workspace(torch, plan), ReduceBackwardArgs(dy, dx, x, out)


def _column_grads(shapes: list[tuple[int, ...]], fns: dict[ReduceKind, Any]) -> Any:
    """For each shape, dtype (``PROBE_DTYPES``, default both) and kind of ``fns`` (torch
    reductions along axis 0): ``(shape, name, element, x, dx, moved, kind, out, dy,
    expect)``, with random inputs, the saved output and ``torch.autograd``'s dx in
    float64; ``moved`` = the bytes the benchmark counts."""
    for shape in shapes:
        for name, element in ELEMENTS.items():
            if name not in os.environ.get("PROBE_DTYPES", "float32,bfloat16"):
                continue
            dtype = getattr(torch, name)
            x = (torch.rand(shape, device="cuda") * 4 - 2).to(dtype)
            dx = torch.empty_like(x)
            moved = 2 * x.numel() * x.element_size()
            for kind, fn in fns.items():
                xg = x.detach().requires_grad_(True)
                out = fn(xg)
                dy = torch.rand_like(out) * 2 - 1
                (expect,) = torch.autograd.grad(out, xg, dy)
                yield shape, name, element, x, dx, moved, kind, out.detach(), dy, expect.double()
            x = dx = None
            torch.cuda.empty_cache()


def cols(ctx: Context) -> None:
    """``PROBE_COLS`` (default ``2:1024:64,1:512:64,1:512:80,0:256:64``): variants
    ``log2 column words:block:register cap`` of the column register-resident gradient,
    each timed on the same buffers and compared with ``torch.autograd``; ``PROBE_SHAPES``
    (default ``4096x4096``) the shapes, reduced along axis 0."""

    variants = [tuple(int(n) for n in item.split(":"))
                for item in os.environ.get("PROBE_COLS",
                                           "2:1024:64,1:512:64,1:512:80,0:256:64").split(",")]
    shapes = [tuple(int(n) for n in item.split("x"))
              for item in os.environ.get("PROBE_SHAPES", "4096x4096").split(",")]
    axis = 0
    layout, small, ties = plans._cols_reg_layout, plans.REG_COLS_SMALL_BLOCK, \
        plans._TIES_OVER_REG_COLS
    fns = {ReduceKind.MAX: lambda t: t.amax(0, keepdim=True),
           ReduceKind.VAR: lambda t: t.var(0, keepdim=True),
           ReduceKind.STD: lambda t: t.std(0, keepdim=True)}
    for shape, name, element, x, dx, moved, kind, out, dy, expect in _column_grads(shapes, fns):
        runs = [("plan", None)] + [(f"{v[0]}:{v[1]}:{v[2]}", v) for v in variants]
        figures = []
        for label, v in runs:
            try:
                if v is not None:
                    plans._cols_reg_layout = lambda e, w, v=v, **k: (v[0], v[1], False, False)
                    plans.REG_COLS_SMALL_BLOCK = v[1] if v[2] == 80 else 0
                    plans._TIES_OVER_REG_COLS = ()
                plan, ws, args = _gradient(kind, shape, axis, element, dy, dx, x, out)
                us = ctx.time_gpu(lambda i, p=plan, a=args, w=ws: p.run(a, workspace=w),
                                  warmup=5, iters=40)
            finally:
                plans._cols_reg_layout, plans.REG_COLS_SMALL_BLOCK = layout, small
                plans._TIES_OVER_REG_COLS = ties
            err = ((dx.double() - expect).abs().max() / expect.abs().max()).item()
            pct = moved / us / 1e3 / ctx.copy_gbps * 100
            figures.append(f"{label} {us:7.2f} us ({pct:4.1f}%, err {err:.0e})")
        print(f"  {name} {kind.name} backward {list(shape)} axis 0: " + ", ".join(figures),
              flush=True)


def ties(ctx: Context) -> None:
    from baracuda_numba.plans.reduce import (
        ReduceBackwardArgs,
        ReduceBackwardDescriptor,
        ReduceBackwardPlan,
    )

    cases = [(ReduceKind.MAX, (256, 1_000_000), 1, "bfloat16"),
             (ReduceKind.MAX, (256, 1_000_000), 1, "float32"),
             (ReduceKind.MAX, (256, 1_000_000), 0, "bfloat16"),
             (ReduceKind.MAX, (1_000_000, 64), 0, "bfloat16"),
             (ReduceKind.MAX, (4096, 4096), 0, "bfloat16"),
             (ReduceKind.VAR, (1_000_000, 64), 0, "bfloat16")]
    if os.environ.get("PROBE_CASES"):  # KIND:RxC:axis:dtype,...
        cases = [(ReduceKind[k], tuple(int(n) for n in s.split("x")), int(a), d)
                 for k, s, a, d in (item.split(":")
                                    for item in os.environ["PROBE_CASES"].split(","))]
    for kind, shape, axis, name in cases:
        dtype = getattr(torch, name)
        x = (torch.rand(shape, device="cuda") * 4 - 2).to(dtype)
        stat = {ReduceKind.MAX: x.float().amax, ReduceKind.MIN: x.float().amin,
                ReduceKind.STD: x.float().std}.get(kind, x.float().var)
        out = stat(axis, keepdim=True).to(dtype)
        dy = torch.rand_like(out)
        dx = torch.empty_like(x)
        plan = ReduceBackwardPlan.select(ReduceBackwardDescriptor(kind, shape, axis,
                                                                  ELEMENTS[name]))
        ws = _workspace(torch, plan)
        for _ in range(2):
            plan.run(ReduceBackwardArgs(dy, dx, x, out), workspace=ws)
            torch.cuda.synchronize()
        access = next(iter(plan._launches.values()))[1][0]
        print(f"{kind.name} {list(shape)} axis {axis} {name}: {access}", flush=True)


def sync(ctx: Context) -> None:
    """``PROBE_SHAPES`` (default ``256x1000000``), ``PROBE_KINDS`` (default ``VAR,STD``).
    Commit 'reduce: Var/Std gradient of long rows in one launch' records the variants
    measured before this part kept only these (Max/Min, register caps, double-buffered
    batches, shorter leads)."""
    from baracuda_numba.plans.reduce import (
        ReduceBackwardArgs,
        ReduceBackwardDescriptor,
        ReduceBackwardPlan,
    )

    shapes = [tuple(int(n) for n in item.split("x"))
              for item in os.environ.get("PROBE_SHAPES", "256x1000000").split(",")]
    kinds = [ReduceKind[k] for k in os.environ.get("PROBE_KINDS", "VAR,STD").split(",")]
    defaults = {"batches": plans._SYNC_BATCHES, "grid": plans._SYNC_GRID}
    variants: list[tuple[str, Any]] = [("old", None)] + [
        (label, {**defaults, **change}) for label, change in (
            ("sync", {}), ("batches 2", {"batches": 2}), ("grid 1056", {"grid": 1056}))]
    torch_fn = {ReduceKind.VAR: lambda t: t.var(1, keepdim=True),
                ReduceKind.STD: lambda t: t.std(1, keepdim=True)}
    for shape in shapes:
        for name, element in ELEMENTS.items():
            dtype = getattr(torch, name)
            x = (torch.rand(shape, device="cuda") * 4 - 2).to(dtype)
            dx = torch.empty_like(x)
            for kind in kinds:
                xg = x.detach().requires_grad_(True)
                out = torch_fn[kind](xg)
                dy = torch.rand_like(out) * 2 - 1
                (expect,) = torch.autograd.grad(out, xg, dy)
                out = out.detach()
                xg = None
                runs, names = [], []
                for label, variant in variants:
                    if variant is not None:
                        plans._SYNC_BATCHES = variant["batches"]
                        plans._SYNC_GRID = variant["grid"]
                    plan = ReduceBackwardPlan.select(
                        ReduceBackwardDescriptor(kind, shape, 1, element))
                    if variant is None:
                        plan._sync = None  # the statistic pass + split gradient
                    ws = _workspace(torch, plan)
                    args = ReduceBackwardArgs(dy, dx, x, out)
                    dx.fill_(float("nan"))
                    plan.run(args, workspace=ws)
                    bits = dx.clone()
                    plan.run(args, workspace=ws)
                    assert torch.equal(bits.view(torch.int16 if dx.element_size() == 2
                                                 else torch.int32),
                                       dx.view(torch.int16 if dx.element_size() == 2
                                               else torch.int32)), f"{label}: not repeatable"
                    err = ((dx.double() - expect.double()).abs().max()
                           / expect.double().abs().max()).item()
                    path = list(plan._launches.values())[0][1][0]
                    plans._SYNC_BATCHES = defaults["batches"]
                    plans._SYNC_GRID = defaults["grid"]
                    runs.append(lambda i, p=plan, a=args, w=ws: p.run(a, workspace=w))
                    names.append(f"{label} ({path}, err {err:.1e})")
                times = ctx.time_gpu_many(runs, warmup=3, iters=15)
                moved = 2 * x.numel() * x.element_size()
                print(f"{name} {kind.name} backward {list(shape)} axis 1:", flush=True)
                for label, us in zip(names, times):
                    print(f"  {label:44s} {us:9.2f} us "
                          f"{moved / us / 1e3 / ctx.copy_gbps * 100:5.1f}% copy", flush=True)
                runs = None
            x = dx = None
            torch.cuda.empty_cache()


def _resident(bound: Any) -> int:
    """Resident blocks per SM of a bound launch (``PROBE_CARVEOUT``: set the shared-memory
    carveout preference, percent, first)."""
    import ctypes

    from baracuda_numba.driver import libcuda

    function = bound._kernel._function
    carveout = os.environ.get("PROBE_CARVEOUT")
    if carveout is not None:
        libcuda().cuFuncSetAttribute(function, 9, int(carveout))
    count = ctypes.c_int()
    occupancy = libcuda().cuOccupancyMaxActiveBlocksPerMultiprocessor
    occupancy.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_void_p, ctypes.c_int,
                          ctypes.c_size_t]
    occupancy(ctypes.byref(count), function, bound._block[0], bound._shared)
    return count.value


def strips(ctx: Context) -> None:

    shapes = [tuple(int(n) for n in item.split("x"))
              for item in os.environ.get("PROBE_SHAPES", "4096x4096,256x1000000").split(",")]
    fns = {ReduceKind.MAX: lambda t: t.amax(0, keepdim=True),
           ReduceKind.MIN: lambda t: t.amin(0, keepdim=True),
           ReduceKind.VAR: lambda t: t.var(0, keepdim=True),
           ReduceKind.STD: lambda t: t.std(0, keepdim=True)}
    ties, wide = plans._TIES_OVER_REG_COLS, plans.REG_COLS_WIDE_BLOCK
    bits = {2: torch.int16, 4: torch.int32}
    for shape, name, element, x, dx, moved, kind, out, dy, expect in _column_grads(shapes, fns):
        variants = [("before", False, ties), ("now", True, ties)]
        if kind in (ReduceKind.MAX, ReduceKind.MIN):
            variants.append(("tie count", True, (ElementKind.F32, ElementKind.BF16)))
        runs, names = [], []
        for label, on, over in variants:
            plans._COLS_STASH, plans._TIES_OVER_REG_COLS = on, over
            plans.REG_COLS_WIDE_BLOCK = wide if on else 0
            try:
                plan, ws, args = _gradient(kind, shape, 0, element, dy, dx, x, out)
                plan.run(args, workspace=ws)
                first = dx.clone()
                plan.run(args, workspace=ws)
            finally:
                plans._COLS_STASH, plans._TIES_OVER_REG_COLS = True, ties
                plans.REG_COLS_WIDE_BLOCK = wide
            view = bits[dx.element_size()]
            assert torch.equal(first.view(view), dx.view(view)), f"{label}: not repeatable"
            err = ((dx.double() - expect).abs().max() / expect.abs().max()).item()
            access, bound = list(plan._launches.values())[0][1]
            kernel = bound._kernel.name if access == "reg_cols" else access
            if access == "reg_cols":
                kernel += f", {_resident(bound)}/SM"
            runs.append(lambda i, p=plan, a=args, w=ws: p.run(a, workspace=w))
            names.append(f"{label} ({kernel}, err {err:.1e})")
        times = ctx.time_gpu_many(runs, warmup=5, iters=40 if x.numel() < 1e8 else 10)
        print(f"{name} {kind.name} backward {list(shape)} axis 0:", flush=True)
        for label, us in zip(names, times):
            print(f"  {label:64s} {us:8.2f} us "
                  f"{moved / us / 1e3 / ctx.copy_gbps * 100:5.1f}% copy", flush=True)
        runs = None


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
    if os.environ.get("PROBE_OLD_ROWS"):  # A/B: the row geometry before warp_rows
        original = plans._rows_vec_geometry
        plans._rows_vec_geometry = lambda *a, warp_rows=False, **k: original(*a, **k)
        print("row geometry without warp_rows", flush=True)
    from bench import measure_copy_gbps

    ctx = Context("probe", torch)
    ctx.copy_gbps = measure_copy_gbps(torch)
    print(torch.cuda.get_device_name(), f"copy {ctx.copy_gbps:.0f} GB/s", flush=True)
    for part in parts:
        globals()[part](ctx)


if __name__ == "__main__":
    main(sys.argv[1:])
