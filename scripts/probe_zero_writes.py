"""Probe (GPU): do writes of all-zero bytes run faster than writes of random bytes?

Times ``torch`` copies of 1 GB (random source against zero source) and the f32 Var
gradient of [512, 5e5] held in registers (``reduce_backward_rows_hold``) with random x
(dx random), x constant per row (dx +0: all-zero bytes) and random x with dy = 0 (dx a
mix of +0 and -0), alternately (``Context.time_gpu_many``).

    python scripts/probe_zero_writes.py
"""

from __future__ import annotations

import torch
from bench import Context, measure_copy_gbps

from baracuda_numba.plans.reduce import (
    ReduceBackwardArgs,
    ReduceBackwardDescriptor,
    ReduceBackwardPlan,
)
from baracuda_numba.types import ElementKind, ReduceKind


def main() -> None:
    ctx = Context("reduce", torch)
    ctx.copy_gbps = measure_copy_gbps(torch)
    print(f"copy {ctx.copy_gbps:.0f} GB/s, {torch.cuda.get_device_name()}", flush=True)
    n = 1 << 28
    random = torch.randn(n, device="cuda")
    zeros = torch.zeros(n, device="cuda")
    out = torch.empty(n, device="cuda")
    copies = [lambda i: out.copy_(random), lambda i: out.copy_(zeros)]
    for _ in range(2):
        times = ctx.time_gpu_many(copies, iters=20)
        print("copy 1 GB µs, random / zero source: "
              + " / ".join(f"{t:.1f} ({2 * 4 * n / t / 1e3:.0f} GB/s)" for t in times),
              flush=True)
    shape = (512, 500_000)
    desc = ReduceBackwardDescriptor(ReduceKind.VAR, shape, 1, ElementKind.F32, 1)
    cases = {"random x": (torch.randn(shape, device="cuda"), 1.0),
             "constant rows (dx +0)": (torch.ones(shape, device="cuda"), 1.0),
             "dy = 0 (dx +-0)": (torch.randn(shape, device="cuda"), 0.0)}
    runs = []
    for name, (x, scale) in cases.items():
        y = x.var(1, keepdim=True)
        dy = torch.rand_like(y) * scale + (0.5 if scale else 0.0)
        plan = ReduceBackwardPlan.select(desc)
        ws = torch.empty(plan.workspace_size, device="cuda", dtype=torch.uint8)
        dx = torch.empty_like(x)
        args = ReduceBackwardArgs(dy, dx, x, y)
        plan.run(args, workspace=ws)
        torch.cuda.synchronize()
        access, launch = next(iter(plan._launches.values()))[1]
        zero = int((dx.view(torch.int32) == 0).sum())
        print(f"{name}: access {access} hold {getattr(launch, 'hold', False)}, "
              f"all-zero words {zero / dx.numel():.1%}", flush=True)
        runs.append(lambda i, p=plan, a=args, w=ws: p.run(a, workspace=w))
    for _ in range(2):
        times = ctx.time_gpu_many(runs, iters=20)
        print("f32 Var gradient [512, 5e5] µs: " + "; ".join(
            f"{name} {t:.1f}" for name, t in zip(cases, times)), flush=True)


if __name__ == "__main__":
    main()
