"""Probe (GPU): how close the f32 Sum / Prod forwards of [256, 1e6] along axis 0 (the two
forward rows where the plan trails torch by 0.1-0.3 % in the benchmark) are to the rate
at which the GPU reads 1 GB at all.

Times, alternately (``Context.time_gpu_many``): the plan's Sum and Prod along axis 0,
torch's, and three reductions that read the same 1 GB with no column structure at all
(torch's ``x.sum()`` and ``x.amax()`` over everything, the plan's Sum of x flattened to
rank 1). The fastest of those is the read ceiling the two rows are measured against:

    PYTHONPATH=.:scripts python scripts/probe_read_ceiling.py [rounds]
"""

from __future__ import annotations

import sys

import torch
from bench import Context, measure_copy_gbps

from baracuda_numba.plans.reduce import ReduceArgs, ReduceDescriptor, ReducePlan
from baracuda_numba.types import ElementKind, ReduceKind

SHAPE = (256, 1_000_000)


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    ctx = Context("reduce", torch)
    ctx.copy_gbps = measure_copy_gbps(torch)
    print(f"copy {ctx.copy_gbps:.0f} GB/s, {torch.cuda.get_device_name()}", flush=True)
    x = torch.rand(SHAPE, device="cuda") + 0.5  # Prod stays finite over 256 rows
    flat = x.view(-1)
    fns, labels = [], []
    for kind, torch_fn in ((ReduceKind.SUM, lambda: torch.sum(x, 0, keepdim=True)),
                           (ReduceKind.PROD, lambda: torch.prod(x, 0, keepdim=True))):
        plan = ReducePlan.select(ReduceDescriptor(kind, SHAPE, 0, ElementKind.F32))
        y = torch.empty((1, SHAPE[1]), device="cuda")
        workspace = torch.empty(max(plan.workspace_size, 1), device="cuda", dtype=torch.uint8)
        args = ReduceArgs(x, y)
        fns += [lambda _i, p=plan, a=args, w=workspace: p.run(a, workspace=w),
                lambda _i, f=torch_fn: f()]
        labels += [f"plan {kind.name} axis 0", f"torch {kind.name.lower()} axis 0"]
    whole = ReducePlan.select(ReduceDescriptor(ReduceKind.SUM, (flat.numel(),), 0,
                                               ElementKind.F32))
    whole_y = torch.empty(1, device="cuda")
    whole_ws = torch.empty(max(whole.workspace_size, 1), device="cuda", dtype=torch.uint8)
    whole_args = ReduceArgs(flat, whole_y)
    fns += [lambda _i: whole.run(whole_args, workspace=whole_ws), lambda _i: x.sum(),
            lambda _i: x.amax()]
    labels += ["plan Sum of x flattened", "torch x.sum()", "torch x.amax()"]
    nbytes = x.numel() * x.element_size()
    for _ in range(rounds):
        times = ctx.time_gpu_many(fns, warmup=3, iters=30)
        print(", ".join(f"{label} {us:.2f} µs ({nbytes / us / 1e3:.0f} GB/s)"
                        for label, us in zip(labels, times)), flush=True)


if __name__ == "__main__":
    main()
