"""A/B probe (GPU) of the hold kernel's chunk (``reduce_backward_rows_hold``) with part of
it parked in dynamic shared memory (``stash`` words a thread, HOLD_WORDS at a time) against
the plan's row-sync kernel: Var/Std gradients of long rows along axis 1, f32 and bf16,
timed alternately with input sets rotated past L2. Each stash variant's bits are compared
with the row-sync kernel cutting its rows into the same chunks (the same sums in the same
order).

    [HOLD_SHAPES=256x1000000,...] [HOLD_STASHES=0,16,32] [HOLD_DTYPES=float32,...] \\
        python scripts/probe_reduce_hold_stash.py [rounds]
"""

from __future__ import annotations

import os
import sys

import torch
from bench import Context, measure_copy_gbps

import baracuda_numba.plans.reduce as plans_reduce
from baracuda_numba.driver import function_registers
from baracuda_numba.kernels.reduce import (
    HOLD_MAX_REGISTERS,
    HOLD_WORDS,
    SYNC_BLOCK,
    VEC_LOADS,
    _make_backward_rows_hold,
    _sync_backward_signature,
)
from baracuda_numba.launch import Kernel
from baracuda_numba.plans.reduce import (
    ReduceBackwardArgs,
    ReduceBackwardDescriptor,
    ReduceBackwardPlan,
)
from baracuda_numba.types import ElementKind, ReduceKind

SHAPES = tuple(tuple(int(n) for n in shape.split("x")) for shape in os.environ.get(
    "HOLD_SHAPES", "256x1000000").split(","))
STASHES = tuple(int(s) for s in os.environ.get("HOLD_STASHES", "0,8,16,24").split(","))
DEFAULT_BATCHES = plans_reduce._SYNC_BATCHES


def _hold_table(stash: int) -> dict:
    from numba import float64
    return {(kind, element): Kernel(
        f"reduce_backward_rows_hold_stash{stash}[{kind.name.lower()},{element.name.lower()}]",
        _make_backward_rows_hold(kind, element, stash),
        _sync_backward_signature(element)[:-3] + (float64,), max_registers=HOLD_MAX_REGISTERS)
        for kind in (ReduceKind.VAR, ReduceKind.STD)
        for element in (ElementKind.F32, ElementKind.BF16, ElementKind.F16)}


def _plan(desc, hold: bool, stash: int, tables: dict) -> ReduceBackwardPlan:
    plans_reduce.HOLD_STASH = stash
    plans_reduce._SYNC_BATCHES = (HOLD_WORDS + stash) // VEC_LOADS if stash >= 0 \
        else DEFAULT_BATCHES
    plans_reduce.REDUCE_BACKWARD_ROWS_HOLD_KERNELS = tables[max(stash, 0)]
    plan = ReduceBackwardPlan.select(desc)
    plan.row_hold = hold
    return plan


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    ctx = Context("reduce", torch)
    ctx.copy_gbps = measure_copy_gbps(torch)
    print(f"copy {ctx.copy_gbps:.0f} GB/s, {torch.cuda.get_device_name()}", flush=True)
    tables = {stash: _hold_table(stash) for stash in STASHES}
    for stash, table in tables.items():
        for kernel in table.values():
            kernel.prepare()
            shared = stash * SYNC_BLOCK * 8
            if shared:
                kernel.allow_dynamic_shared(shared)
            print(f"{kernel.name}: {function_registers(kernel._function)} registers, "
                  f"{kernel.resident_blocks(SYNC_BLOCK, shared)} resident blocks", flush=True)
    for shape in SHAPES:
        for name in os.environ.get("HOLD_DTYPES", "float32,bfloat16").split(","):
            element = {"float32": ElementKind.F32, "bfloat16": ElementKind.BF16,
                       "float16": ElementKind.F16}[name]
            dtype = getattr(torch, name)
            x = torch.randn(shape, device="cuda", dtype=dtype)
            dx = torch.empty_like(x)
            for kind in (ReduceKind.VAR, ReduceKind.STD):
                y = x.var(1, keepdim=True) if kind is ReduceKind.VAR else x.std(1, keepdim=True)
                dy = torch.randn_like(y)
                args = ReduceBackwardArgs(dy, dx, x, y)
                desc = ReduceBackwardDescriptor(kind, shape, 1, element, 1)
                runs, labels, notes = [], [], []
                for stash in (-1,) + STASHES:  # -1: the plan's row-sync kernel
                    plan = _plan(desc, stash >= 0, stash, tables)
                    ws = torch.empty(plan.workspace_size, device="cuda", dtype=torch.uint8)
                    dx.fill_(float("nan"))
                    plan.run(args, workspace=ws)
                    torch.cuda.synchronize()
                    launch = next(iter(plan._launches.values()))[1][1]
                    if launch.hold != (stash >= 0):
                        notes.append(f"stash {stash}: hold not taken")
                        continue
                    if stash >= 0:  # the row-sync kernel on the same chunks: the same bits
                        held = dx.clone()
                        same = _plan(desc, False, stash, tables)
                        ws2 = torch.empty(same.workspace_size, device="cuda", dtype=torch.uint8)
                        dx.fill_(float("nan"))
                        same.run(args, workspace=ws2)
                        torch.cuda.synchronize()
                        equal = torch.equal(held.view(torch.uint8), dx.view(torch.uint8))
                        notes.append(f"stash {stash}: bits {'equal' if equal else 'DIFFER'}")
                    runs.append(lambda i, p=plan, a=args, w=ws: p.run(a, workspace=w))
                    labels.append("sync" if stash < 0 else f"hold+{stash}")
                plans_reduce._SYNC_BATCHES = DEFAULT_BATCHES
                moved = (2 * x.numel() + 2 * y.numel()) * x.element_size()
                for _ in range(rounds):
                    times = ctx.time_gpu_many(runs, iters=20)
                    text = ", ".join(f"{lab} {us:.1f} ({moved / us / 1e3 / ctx.copy_gbps:.0%})"
                                     for lab, us in zip(labels, times))
                    print(f"{kind.name} {list(shape)} {name}: {text}", flush=True)
                print(f"    {'; '.join(notes)}", flush=True)


if __name__ == "__main__":
    main()
