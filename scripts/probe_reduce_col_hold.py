"""A/B probe (GPU) of the column gradients with x read once
(``reduce_backward_cols_hold``: a strip of columns cut into parts along the rows, the
parts meeting through the workspace) against the plan's other column kernels
(``plan.col_hold = False``), timed alternately (``Context.time_gpu_many``, input sets
rotated past L2), Max/Var/Std along axis 0, f32 and bf16, over strip widths and blocks;
the hold kernel's reruns are compared bit for bit and against the other kernel.

    [COL_HOLD_SHAPES=4096x4096,...] [COL_HOLD_VARIANTS=16x256,8x256,...] \\
        python scripts/probe_reduce_col_hold.py [rounds]
"""

from __future__ import annotations

import os
import sys

import torch
from bench import Context, measure_copy_gbps

import baracuda_numba.plans.reduce as plans_reduce
from baracuda_numba.driver import function_registers
from baracuda_numba.kernels.reduce import REDUCE_BACKWARD_COLS_HOLD_KERNELS
from baracuda_numba.plans.reduce import (
    ReduceBackwardArgs,
    ReduceBackwardDescriptor,
    ReduceBackwardPlan,
)
from baracuda_numba.types import ElementKind, ReduceKind

SHAPES = ((4096, 4096), (256, 1_000_000), (8192, 2048))
if os.environ.get("COL_HOLD_SHAPES"):
    SHAPES = tuple(tuple(int(n) for n in shape.split("x"))
                   for shape in os.environ["COL_HOLD_SHAPES"].split(","))
VARIANTS = tuple(tuple(int(n) for n in v.split("x")) for v in os.environ.get(
    "COL_HOLD_VARIANTS", "16x256,8x256,32x256,16x512").split(","))
KINDS = tuple(ReduceKind[k] for k in os.environ.get("COL_HOLD_KINDS", "VAR,STD,MAX").split(","))


def _saved(kind: ReduceKind, x: torch.Tensor) -> torch.Tensor:
    if kind is ReduceKind.MAX:
        return x.amax(0, keepdim=True)
    return x.var(0, keepdim=True) if kind is ReduceKind.VAR else x.std(0, keepdim=True)


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    ctx = Context("reduce", torch)
    ctx.copy_gbps = measure_copy_gbps(torch)
    print(f"copy {ctx.copy_gbps:.0f} GB/s, {torch.cuda.get_device_name()}", flush=True)
    for (kind, element), kernel in REDUCE_BACKWARD_COLS_HOLD_KERNELS.items():
        if element in (ElementKind.F32, ElementKind.BF16) and kind in KINDS:
            kernel.prepare()
            print(f"{kernel.name}: {function_registers(kernel._function)} registers, "
                  f"resident blocks {kernel.resident_blocks(256)} (256) "
                  f"{kernel.resident_blocks(512)} (512)", flush=True)
    for shape in SHAPES:
        for name in ("float32", "bfloat16"):
            element = {"float32": ElementKind.F32, "bfloat16": ElementKind.BF16}[name]
            dtype = getattr(torch, name)
            nbytes = shape[0] * shape[1] * dtype.itemsize
            sets = max(1, min(6, -(-(256 << 20) // nbytes)))
            xs = [torch.randn(shape, device="cuda", dtype=dtype) for _ in range(sets)]
            dxs = [torch.empty_like(xs[0]) for _ in range(sets)]
            for kind in KINDS:
                ys = [_saved(kind, x) for x in xs]
                dys = [torch.randn_like(ys[0]) for _ in range(sets)]
                desc = ReduceBackwardDescriptor(kind, shape, 0, element, 1)
                runs, labels, outs = [], [], []
                for variant in ((0, 0),) + VARIANTS:
                    cw, block = variant
                    if cw:
                        plans_reduce._COL_HOLD_STRIP_WORDS = cw
                        plans_reduce._COL_HOLD_BLOCK = block
                    plan = ReduceBackwardPlan.select(desc)
                    plan.col_hold = bool(cw)
                    ws = torch.zeros(max(plan.workspace_size, 1), device="cuda",
                                     dtype=torch.uint8)
                    dxs[0].fill_(float("nan"))
                    args = [ReduceBackwardArgs(dy, dx, x, y)
                            for dy, dx, x, y in zip(dys, dxs, xs, ys)]
                    plan.run(args[0], workspace=ws)
                    torch.cuda.synchronize()
                    access, launch = next(iter(plan._launches.values()))[1]
                    if cw and access != "sync":
                        print(f"  {variant}: not taken ({access}, {plan._col_hold})")
                        continue
                    first = dxs[0].clone()
                    if cw:  # a rerun: the same bits
                        dxs[0].fill_(float("nan"))
                        plan.run(args[0], workspace=ws)
                        torch.cuda.synchronize()
                        if not torch.equal(first.view(torch.uint8), dxs[0].view(torch.uint8)):
                            print(f"  {variant}: RERUN DIFFERS", flush=True)
                    outs.append(first)
                    labels.append(f"{cw}x{block}" if cw else f"base({access})")
                    runs.append(lambda i, p=plan, a=args, w=ws: p.run(a[i], workspace=w))
                base = outs[0].double()
                scale = base.abs().max().item() or 1.0
                diffs = [(o.double() - base).abs().max().item() / scale for o in outs[1:]]
                moved = (2 * xs[0].numel() + 2 * ys[0].numel()) * xs[0].element_size()
                for _ in range(rounds):
                    times = ctx.time_gpu_many(runs, sets=sets, iters=20)
                    text = ", ".join(f"{lab} {us:.1f} ({moved / us / 1e3 / ctx.copy_gbps:.0%})"
                                     for lab, us in zip(labels, times))
                    print(f"{kind.name} {list(shape)} ax0 {name}: {text}", flush=True)
                print(f"    max |diff| / max |base|: {[f'{d:.1e}' for d in diffs]}", flush=True)
            del xs, dxs
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
