"""GPU probe: what the Max/Min gradient's ties cost along long columns.

For each case (kind, shape, dtype) and each data draw ("bench": uniform in [-2, 2) rounded
to the dtype, as the benchmark draws it; "normal": standard normal), prints the number of
elements equal to their column's extreme, then the plan's device time against Prod's (the
same bytes through the same kernel, no ties), alternately (``bench.Context``).

    PYTHONPATH=.:scripts python scripts/probe_reduce_ties.py           # times
    ncu --clock-control none --csv --page raw --metrics $M \\
        python scripts/probe_reduce_ties.py --once | python scripts/ncu_table.py $M

``--once`` runs each plan twice without timing (for ncu: one launch set per call).
``TIES_CASES=KIND:SHAPE:DTYPE,...`` (e.g. ``MAX:4096x4096:bfloat16``) replaces the
default cases; ``TIES_NO_COLS_REG=1`` keeps the column register-resident kernels out (the
word kernel's tie count after dx takes those columns too, as ``probe_reduce_ab.py``'s
``AB_NO_COLS_REG``).
"""

from __future__ import annotations

import os
import sys

import torch
from bench import Context, measure_copy_gbps
from bench_reduce import FORWARD

from baracuda_numba._frameworks import element_of
from baracuda_numba.plans import reduce as plans_reduce
from baracuda_numba.plans.reduce import (
    ReduceBackwardArgs,
    ReduceBackwardDescriptor,
    ReduceBackwardPlan,
)
from baracuda_numba.types import ReduceKind

CASES = ((ReduceKind.MAX, (1000000, 64), torch.bfloat16),
         (ReduceKind.MAX, (1000000, 64), torch.float32))
DRAWS = ("bench", "normal")


def _cases() -> tuple:
    """``TIES_CASES`` parsed, else ``CASES``."""
    text = os.environ.get("TIES_CASES")
    if not text:
        return CASES
    cases = []
    for case in text.split(","):
        kind, shape, name = case.split(":")
        cases.append((ReduceKind[kind], tuple(int(n) for n in shape.split("x")),
                      getattr(torch, name)))
    return tuple(cases)


def _draw(draw: str, shape: tuple[int, int], dtype: torch.dtype) -> torch.Tensor:
    if draw == "bench":
        return (torch.rand(shape, device="cuda") * 4 - 2).to(dtype)
    return torch.randn(shape, device="cuda").to(dtype)


def _case(kind: ReduceKind, shape: tuple[int, int], xs, dys):
    ys = [FORWARD[kind](x, 0) for x in xs]
    plan = ReduceBackwardPlan.select(
        ReduceBackwardDescriptor(kind, shape, 0, element_of(xs[0]), 1))
    ws = torch.empty(max(plan.workspace_size, 1), device="cuda", dtype=torch.uint8)
    dxs = [torch.empty_like(x) for x in xs]
    args = [ReduceBackwardArgs(dy, dx, x, y) for dy, dx, x, y in zip(dys, dxs, xs, ys)]
    return ys, lambda i: plan.run(args[i], workspace=ws)


def main() -> None:
    once = "--once" in sys.argv
    ctx = Context("reduce", torch)
    if os.environ.get("TIES_NO_COLS_REG"):
        plans_reduce._cols_reg_layout = lambda *args, **kwargs: None
        print("no column register-resident gradient", flush=True)
    if not once:
        ctx.copy_gbps = measure_copy_gbps(torch)
        print(f"copy {ctx.copy_gbps:.0f} GB/s, {torch.cuda.get_device_name()}", flush=True)
    for kind, shape, dtype in _cases():
        for draw in DRAWS:
            xs = [_draw(draw, shape, dtype) for _ in range(2)]
            dys = [torch.rand((1, shape[1]), device="cuda").to(dtype) * 2 - 1 for _ in xs]
            ys, run = _case(kind, shape, xs, dys)
            _, run_prod = _case(ReduceKind.PROD, shape, xs, dys)
            tied = int((xs[0] == ys[0]).sum())
            if once:
                for i in range(2):
                    run(i)
                    run_prod(i)
                torch.cuda.synchronize()
                print(f"{kind.name} {shape} {dtype} {draw}: {tied} tied", flush=True)
                continue
            ours, prod = ctx.time_gpu_many([run, run_prod], sets=2, iters=30)
            nbytes = 2 * xs[0].numel() * xs[0].element_size()
            print(f"{kind.name} {shape} {dtype} {draw}: {tied} tied ({tied / shape[1]:.0f} a "
                  f"column); {ours:.1f} µs ({nbytes / ours / 1e3 / ctx.copy_gbps:.0%}), "
                  f"Prod {prod:.1f} ({nbytes / prod / 1e3 / ctx.copy_gbps:.0%})", flush=True)
            del xs, ys
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
