"""GPU probe: does where dx lies against x move a reduce gradient (and torch ``copy_``)?

Each case writes dx at several offsets (0 to 64 MB) inside one large buffer, checks the
bits against the first offset, and times the plan against torch's ``copy_`` of the same
bytes, alternately (``bench.Context.time_gpu_many``). x is drawn as the benchmark draws it
(uniform in [-2, 2), rounded to the dtype).

    PYTHONPATH=.:scripts python scripts/probe_reduce_placement.py
"""

from __future__ import annotations

import torch
from bench import Context, measure_copy_gbps
from bench_reduce import FORWARD

from baracuda_numba._frameworks import element_of
from baracuda_numba.plans.reduce import (
    ReduceBackwardArgs,
    ReduceBackwardDescriptor,
    ReduceBackwardPlan,
)
from baracuda_numba.types import ReduceKind

CASES = ((ReduceKind.MIN, (2000000, 32), torch.float32),
         (ReduceKind.PROD, (4096, 4096), torch.bfloat16),
         (ReduceKind.MAX, (4096, 4096), torch.float32))
OFFSETS_KB = (0, 4, 64, 256, 512, 1024, 2048, 3072, 4096, 8192, 16384, 40960, 65536)


def probe(ctx: Context, kind: ReduceKind, shape: tuple[int, int], dtype: torch.dtype) -> None:
    xs = [(torch.rand(shape, device="cuda") * 4 - 2).to(dtype) for _ in range(2)]
    ys = [FORWARD[kind](x, 0) for x in xs]
    dys = [torch.randn_like(y) for y in ys]
    nbytes = xs[0].numel() * xs[0].element_size()
    gap = 8 << 20  # between the two input sets' dx
    big = torch.empty(2 * (nbytes + gap) + (64 << 20), device="cuda", dtype=torch.uint8)
    plan = ReduceBackwardPlan.select(
        ReduceBackwardDescriptor(kind, shape, 0, element_of(xs[0]), 1))
    ws = torch.empty(max(plan.workspace_size, 1), device="cuda", dtype=torch.uint8)
    first = None
    for off_kb in OFFSETS_KB:
        start = off_kb * 1024
        dxs = [big[start + k * (nbytes + gap):][:nbytes].view(dtype).view(shape)
               for k in range(2)]
        args = [ReduceBackwardArgs(dys[k], dxs[k], xs[k], ys[k]) for k in range(2)]
        dxs[0].fill_(float("nan"))
        plan.run(args[0], workspace=ws)
        torch.cuda.synchronize()
        if first is None:
            first = dxs[0].clone()
        same = torch.equal(first.view(torch.uint8), dxs[0].view(torch.uint8))
        plan_us, copy_us = ctx.time_gpu_many(
            [lambda i, a=args: plan.run(a[i], workspace=ws),
             lambda i, d=dxs: d[i].copy_(xs[i])], sets=2, iters=30)

        def share(us: float) -> str:
            return f"{2 * nbytes / us / 1e3 / ctx.copy_gbps:.0%}"

        print(f"{kind.name} {shape} {dtype} dx at +{off_kb} KB: plan {plan_us:.1f} "
              f"({share(plan_us)}), copy_ {copy_us:.1f} ({share(copy_us)})"
              f"{'' if same else ' BITS DIFFER'}", flush=True)


def main() -> None:
    ctx = Context("reduce", torch)
    ctx.copy_gbps = measure_copy_gbps(torch)
    print(f"copy {ctx.copy_gbps:.0f} GB/s, {torch.cuda.get_device_name()}", flush=True)
    for case in CASES:
        probe(ctx, *case)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
