"""A/B probe (GPU) of the Var/Std and Max/Min gradients of long rows: the chunks held in
registers (``reduce_backward_rows_hold``, x read once) against the other way
(``plan.row_hold = False``: the row-sync kernel that reads x twice for Var/Std, the tie
count after dx for Max/Min), timed alternately (``Context.time_gpu_many``) on [256, 1e6]
and other long-row shapes along axis 1, f32 and bf16, with the bits of the three compared
and the hold kernel's registers and resident blocks printed. ``HOLD_FORCE=1`` forces the
hold kernel (``plan.row_hold = True``) where the plan's rule would not take it. The hold
kernel runs twice: with its shared-memory stash (``plan.hold_stash = True``: chunks of two
row-sync chunks) and without (registers only).

    [HOLD_SHAPES=256x1000000,...] [HOLD_DTYPES=float32,bfloat16,float16] \
        [HOLD_KINDS=VAR,STD,MAX,MIN] [HOLD_FORCE=1] python scripts/probe_reduce_hold.py [rounds]
"""

from __future__ import annotations

import os
import sys
import time

import torch
from bench import Context, measure_copy_gbps

from baracuda_numba._frameworks import element_of
from baracuda_numba.driver import function_registers
from baracuda_numba.kernels.reduce import REDUCE_BACKWARD_ROWS_HOLD_KERNELS, SYNC_BLOCK
from baracuda_numba.plans.reduce import (
    ReduceBackwardArgs,
    ReduceBackwardDescriptor,
    ReduceBackwardPlan,
)
from baracuda_numba.types import ElementKind, ReduceKind

KINDS = tuple(ReduceKind[name] for name in os.environ.get("HOLD_KINDS", "VAR,STD").split(","))
SAVED = {ReduceKind.VAR: "var", ReduceKind.STD: "std", ReduceKind.MAX: "amax",
         ReduceKind.MIN: "amin"}
FORCE = True if os.environ.get("HOLD_FORCE") == "1" else None
SHAPES = ((256, 1_000_000), (64, 4_000_000), (1024, 250_000), (132, 1_048_576))
if os.environ.get("HOLD_SHAPES"):  # e.g. "256x1000000,64x4000000"
    SHAPES = tuple(tuple(int(n) for n in shape.split("x"))
                   for shape in os.environ["HOLD_SHAPES"].split(","))


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    ctx = Context("reduce", torch)
    ctx.copy_gbps = measure_copy_gbps(torch)
    print(f"copy {ctx.copy_gbps:.0f} GB/s, {torch.cuda.get_device_name()}", flush=True)
    for (_, element), kernel in REDUCE_BACKWARD_ROWS_HOLD_KERNELS.items():
        if element in (ElementKind.F32, ElementKind.BF16):
            kernel.prepare()
            print(f"{kernel.name}: {function_registers(kernel._function)} registers, "
                  f"{kernel.resident_blocks(SYNC_BLOCK)} resident blocks", flush=True)
    for shape in SHAPES:
        for name in os.environ.get("HOLD_DTYPES", "float32,bfloat16").split(","):
            x = torch.randn(shape, device="cuda", dtype=getattr(torch, name))
            element = element_of(x)
            for kind in KINDS:
                y = getattr(x, SAVED[kind])(1, keepdim=True)
                dy = torch.randn_like(y)
                desc = ReduceBackwardDescriptor(kind, shape, 1, element, 1)
                plans, outs = [], []
                for hold, stash in ((FORCE, True), (FORCE, False), (False, None)):
                    plan = ReduceBackwardPlan.select(desc)
                    plan.row_hold = hold
                    plan.hold_stash = stash
                    ws = torch.empty(plan.workspace_size, device="cuda", dtype=torch.uint8)
                    dx = torch.full_like(x, float("nan"))
                    args = ReduceBackwardArgs(dy, dx, x, y)
                    began = time.perf_counter()
                    plan.run(args, workspace=ws)
                    torch.cuda.synchronize()
                    print(f"  {kind.name} {list(shape)} {name} hold={hold} stash={stash}: first "
                          f"{time.perf_counter() - began:.3f} s", flush=True)
                    plans.append(lambda i, p=plan, a=args, w=ws: p.run(a, workspace=w))
                    outs.append(dx)
                    access, launch = next(iter(plan._launches.values()))[1]
                    print(f"    access {access}, hold {getattr(launch, 'hold', False)}, "
                          f"stash {getattr(launch, 'stash', False)}", flush=True)
                torch.cuda.synchronize()
                same = all(torch.equal(outs[0].view(torch.uint8), out.view(torch.uint8))
                           for out in outs[1:])
                moved = (x.numel() * 2 + y.numel() * 2) * x.element_size()
                line = []
                for _ in range(rounds):
                    times = ctx.time_gpu_many(plans, iters=20)
                    line.append(" ".join(
                        f"{label} {us:.1f} ({moved / us / 1e3 / ctx.copy_gbps:.0%})"
                        for label, us in zip(("stash", "hold", "other"), times)))
                print(f"{kind.name} backward {list(shape)} {name} (bits "
                      f"{'equal' if same else 'DIFFER'}): " + "; ".join(line), flush=True)


if __name__ == "__main__":
    main()
