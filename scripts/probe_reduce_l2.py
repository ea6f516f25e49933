"""Probe (GPU): how much of a reduce gradient's time depends on what ran before it.

The benchmark times this package's call and torch's alternately, so each of our calls
starts with whatever torch's call left in L2 (dirty lines to write back, or x itself).
This probe times our call after four different predecessors, in one process:

* ``torch``: torch's autograd of the same op (the benchmark's order);
* ``alone``: our own previous call (nothing in between);
* ``clean``: a read-only pass over 256 MB (``buf.sum()``): L2 holds clean lines only;
* ``dirty``: a 64 MB ``fill_``: L2 full of someone else's dirty lines.

With reference rows for the same bytes: ``copy_`` of x into a second tensor and
``fill_`` of dx, in the same four orders. ``PROBE_CASES=KIND:SHAPE:AXIS:DTYPE,...``;
``PROBE_NCU=1`` runs each case's plan three times and nothing else (for ncu).

    python scripts/probe_reduce_l2.py [rounds]
"""

from __future__ import annotations

import os
import sys

import torch
from bench import Context, measure_copy_gbps
from bench_reduce import FORWARD

from baracuda_numba.plans.reduce import (
    ReduceBackwardArgs,
    ReduceBackwardDescriptor,
    ReduceBackwardPlan,
)
from baracuda_numba.types import ElementKind, ReduceKind

DEFAULT = ("MAX:4096x4096:1:bfloat16,VAR:4096x4096:1:bfloat16,MEAN:4096x4096:1:bfloat16,"
           "SUM:4096x4096:1:bfloat16,MAX:1000000x64:1:bfloat16,VAR:1000000x64:1:bfloat16")


def _case(text: str) -> tuple:
    kind, shape, axis, name = text.split(":")
    shape = tuple(int(n) for n in shape.split("x"))
    axis = int(axis)
    dtype = getattr(torch, name)
    x = (torch.rand(shape, device="cuda") * 4 - 2).to(dtype)
    xg = x.detach().requires_grad_(True)
    out = FORWARD[ReduceKind[kind]](xg, axis)  # the benchmark's torch op
    dy = torch.rand_like(out) * 2 - 1
    y = out.detach()
    element = {"float32": ElementKind.F32, "bfloat16": ElementKind.BF16}[name]
    plan = ReduceBackwardPlan.select(ReduceBackwardDescriptor(ReduceKind[kind], shape, axis,
                                                              element))
    ws = torch.empty(max(plan.workspace_size, 1), device="cuda", dtype=torch.uint8)
    dx = torch.empty_like(x)
    saved = kind not in ("SUM", "MEAN")
    args = ReduceBackwardArgs(dy, dx, x if saved else None, y if saved else None)
    moved = (2 if saved else 1) * x.numel() * x.element_size() + 2 * y.numel() * y.element_size()
    return (lambda i: plan.run(args, workspace=ws),
            lambda i: torch.autograd.grad(out, xg, dy, retain_graph=True), x, dx, moved)


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    cases = os.environ.get("PROBE_CASES", DEFAULT).split(",")
    if os.environ.get("PROBE_NCU"):
        for text in cases:
            ours = _case(text)[0]
            for _ in range(3):
                ours(0)
            torch.cuda.synchronize()
        return
    ctx = Context("reduce", torch)
    copy = measure_copy_gbps(torch)
    print(f"copy {copy:.0f} GB/s, {torch.cuda.get_device_name()}", flush=True)
    big = torch.empty(1 << 26, device="cuda", dtype=torch.float32).uniform_()  # 256 MB
    scratch = torch.empty(1 << 24, device="cuda", dtype=torch.float32)  # 64 MB
    others = {"alone": None, "clean": lambda i: big.sum(), "dirty": lambda i: scratch.fill_(1.0)}
    for text in cases:
        ours, theirs, x, dx, moved = _case(text)
        x2 = torch.empty_like(x)
        refs = {"ours": ours, "copy_": lambda i, a=x2, b=x: a.copy_(b),
                "fill_": lambda i, d=dx: d.fill_(0.5)}
        ref_bytes = {"ours": moved, "copy_": 2 * x.numel() * x.element_size(),
                     "fill_": dx.numel() * dx.element_size()}
        for _ in range(rounds):
            cells = []
            for name, fn in refs.items():
                row = []
                for label, other in {"torch": theirs, **others}.items():
                    fns = [fn] if other is None else [fn, other]
                    us = ctx.time_gpu_many(fns, warmup=3, iters=20)[0]
                    row.append(f"{label} {us:.2f} ({ref_bytes[name] / us / 1e3 / copy:.0%})")
                cells.append(f"{name}: " + ", ".join(row))
            print(f"{text}\n  " + "\n  ".join(cells), flush=True)
        del ours, theirs, x, dx, x2, refs
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
