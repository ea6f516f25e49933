"""Probe (GPU): the Sum gradient against both ways PyTorch's autograd delivers it.

``torch.autograd.grad(out, x, dy)`` (the benchmark's torch column) returns ``SumBackward``'s
``dy.expand(x.shape)``: a view, no kernel. ``out.backward(dy)`` on a leaf ``x`` stores the
gradient in ``x.grad``, and autograd's ``AccumulateGrad`` clones a gradient whose strides
differ from ``x``'s (``clone_obey_contract``): the expanded view is written out as a
contiguous tensor. This times ``ReduceBackwardPlan.run`` (dx written), the view and the
leaf's ``backward`` (``x.grad`` reset to None before each call, as a training step's
``zero_grad(set_to_none=True)`` does) alternately, on the benchmark's shapes, and checks
that ``x.grad`` equals the plan's dx:

    PYTHONPATH=.:scripts python scripts/probe_reduce_sum_backward.py [rounds]
"""

from __future__ import annotations

import sys

import torch
from bench import Context, measure_copy_gbps

from baracuda_numba.plans.reduce import (
    ReduceBackwardArgs,
    ReduceBackwardDescriptor,
    ReduceBackwardPlan,
)
from baracuda_numba.types import ElementKind, ReduceKind

SHAPES = (((4096, 4096), 1), ((4096, 4096), 0), ((256, 1_000_000), 1),
          ((256, 1_000_000), 0), ((1_000_000, 64), 1), ((1_000_000, 64), 0))
DTYPES = {"float32": ElementKind.F32, "bfloat16": ElementKind.BF16}


def _row(ctx: Context, shape: tuple[int, int], axis: int, name: str, rounds: int) -> None:
    dtype = getattr(torch, name)
    x = torch.rand(shape, device="cuda", dtype=dtype)
    leaf = x.detach().requires_grad_(True)
    out = leaf.sum(axis, keepdim=True)
    dy = torch.rand_like(out) * 2 - 1
    dx = torch.empty_like(x)
    plan = ReduceBackwardPlan.select(ReduceBackwardDescriptor(ReduceKind.SUM, shape, axis,
                                                              DTYPES[name]))
    args = ReduceBackwardArgs(dy, dx)
    workspace = torch.empty(max(plan.workspace_size, 1), device="cuda", dtype=torch.uint8)

    def backward(_i: int) -> None:
        leaf.grad = None
        out.backward(dy, retain_graph=True)

    fns = [lambda _i: plan.run(args, workspace=workspace),
           lambda _i: torch.autograd.grad(out, leaf, dy, retain_graph=True),
           backward]
    for fn in fns:
        fn(0)
    torch.cuda.synchronize()
    same = torch.equal(leaf.grad, dx) and leaf.grad.is_contiguous()
    line = []
    for _ in range(rounds):
        ours, view, leaf_us = ctx.time_gpu_many(fns, warmup=3, iters=20)
        line.append(f"plan {ours:.2f} / autograd.grad (view) {view:.2f} / "
                    f"backward into x.grad {leaf_us:.2f} ({leaf_us / ours:.2f}x)")
    print(f"SUM backward {list(shape)} axis {axis} {name} (x.grad "
          f"{'equals dx' if same else 'DIFFERS'}): " + "; ".join(line), flush=True)


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    ctx = Context("reduce", torch)
    ctx.copy_gbps = measure_copy_gbps(torch)
    print(f"copy {ctx.copy_gbps:.0f} GB/s, {torch.cuda.get_device_name()}", flush=True)
    for name in DTYPES:
        for shape, axis in SHAPES:
            _row(ctx, shape, axis, name, rounds)
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
