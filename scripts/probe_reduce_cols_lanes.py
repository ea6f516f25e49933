"""Probe (GPU): the forward column kernel's lanes along the axis at [256, 1e6] axis 0, and
the store-only rate of torch's ``fill_`` / ``zero_`` against its ``copy_``.

    python scripts/probe_reduce_cols_lanes.py [cols] [store]

``cols``: f32 Sum / Prod / Max and bf16 Sum of [256, 1e6] along axis 0 with 1 (the
plan's geometry: a thread per output word, unsplit), 2, 4 or 8 lanes per output word
walking the axis (``_cols_vec_geometry`` replaced while each plan binds), timed alternately
with torch's reduction, three rounds. ``store``: ``fill_``, ``zero_`` and ``copy_`` of 32,
64, 128 and 512 MB (bytes written / the copy ceiling; copy_ counts read + written).
"""

from __future__ import annotations

import sys

import torch
from bench import Context, measure_copy_gbps

from baracuda_numba.plans import reduce as plans
from baracuda_numba.types import ElementKind, ReduceKind

SHAPE = (256, 1_000_000)
TORCH = {"SUM": lambda x: x.sum(0, keepdim=True), "PROD": lambda x: x.prod(0, keepdim=True),
         "MAX": lambda x: x.amax(0, keepdim=True)}


def _with_lanes(lanes: int):  # noqa: ANN202 - a replacement of _cols_vec_geometry
    original = plans._cols_vec_geometry

    def geometry(out_numel, extent, width, max_splits, lanes_first=False, target=0,
                 min_batches=0):
        if (extent, out_numel) == SHAPE and lanes > 1:
            groups = -(-(out_numel // width) // (plans._BLOCK // lanes))
            return plans._Geometry(lanes, False, 1, extent, groups)
        return original(out_numel, extent, width, max_splits, lanes_first, target, min_batches)

    return geometry


def cols(ctx: Context) -> None:
    original = plans._cols_vec_geometry
    for kind_name, dtype_name in (("SUM", "float32"), ("PROD", "float32"), ("MAX", "float32"),
                                  ("SUM", "bfloat16")):
        dtype = getattr(torch, dtype_name)
        element = ElementKind.F32 if dtype_name == "float32" else ElementKind.BF16
        sets = ctx.sets_for(SHAPE[0] * SHAPE[1] * dtype.itemsize)
        xs = [(torch.rand(SHAPE, device="cuda") * 4 - 2).to(dtype) for _ in range(sets)]
        runs, labels, outs = [], [], []
        for lanes in (1, 2, 4, 8):
            plans._cols_vec_geometry = _with_lanes(lanes)
            try:
                plan = plans.ReducePlan.select(plans.ReduceDescriptor(ReduceKind[kind_name],
                                                                      SHAPE, 0, element))
                ys = [torch.full((1, SHAPE[1]), float("nan"), device="cuda", dtype=dtype)
                      for _ in xs]
                args = [plans.ReduceArgs(x, y) for x, y in zip(xs, ys)]
                plan.run(args[0])  # binds its launch with this geometry
                torch.cuda.synchronize()
            finally:
                plans._cols_vec_geometry = original
            outs.append(ys[0].clone())
            runs.append(lambda i, p=plan, a=args: p.run(a[i]))
            labels.append(f"lanes {lanes}")
        reference = TORCH[kind_name]
        runs.append(lambda i, f=reference, x=xs: f(x[i]))
        labels.append("torch")
        expected = reference(xs[0]).double()
        for out, label in zip(outs, labels):
            error = (out.double() - expected).abs().max().item()
            print(f"  {kind_name} {dtype_name} {label}: max |plan - torch| {error:.3g}",
                  flush=True)
        moved = SHAPE[0] * SHAPE[1] * dtype.itemsize
        for _ in range(3):
            times = ctx.time_gpu_many(runs, sets=sets, iters=30)
            print(f"{kind_name} {dtype_name} {list(SHAPE)} axis 0: " + ", ".join(
                f"{label} {us:.1f} ({moved / us / 1e3 / ctx.copy_gbps:.1%})"
                for label, us in zip(labels, times)), flush=True)
        del xs, runs, outs
        torch.cuda.empty_cache()


def store(ctx: Context) -> None:
    for megabytes in (32, 64, 128, 512):
        nbytes = megabytes << 20
        sets = ctx.sets_for(nbytes)
        bufs = [torch.empty(nbytes // 4, device="cuda") for _ in range(sets)]
        src = [torch.empty(nbytes // 4, device="cuda").uniform_() for _ in range(sets)]
        dst = [torch.empty(nbytes // 4, device="cuda") for _ in range(sets)]
        times = ctx.time_gpu_many([lambda i, b=bufs: b[i].fill_(1.5),
                                   lambda i, b=bufs: b[i].zero_(),
                                   lambda i, d=dst, s=src: d[i].copy_(s[i])],
                                  sets=sets, iters=30)
        print(f"{megabytes} MB: fill_ {times[0]:.2f} µs ({nbytes / times[0] / 1e3:.0f} GB/s "
              f"written, {nbytes / times[0] / 1e3 / ctx.copy_gbps:.0%} of copy), zero_ "
              f"{times[1]:.2f}, copy_ {times[2]:.2f} µs "
              f"({2 * nbytes / times[2] / 1e3 / ctx.copy_gbps:.0%})", flush=True)
        del bufs, src, dst
        torch.cuda.empty_cache()


def main() -> None:
    ctx = Context("probe", torch)
    ctx.copy_gbps = measure_copy_gbps(torch)
    print(f"copy {ctx.copy_gbps:.0f} GB/s, {torch.cuda.get_device_name()}", flush=True)
    what = sys.argv[1:] or ["cols", "store"]
    if "cols" in what:
        cols(ctx)
    if "store" in what:
        store(ctx)


if __name__ == "__main__":
    main()
