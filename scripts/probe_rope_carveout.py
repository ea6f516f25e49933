"""Probe (GPU): does the shared-memory carveout of ``rope_tile`` move the decode rows?

The decode launch follows a kernel without shared memory (the benchmark's GPU spin, or a
model's elementwise op); ``rope_tile`` has 4 KB of static shared memory, so the SMs may be
reconfigured between the two. For each dtype and pairing (forward, [64, 32, 1, 128],
positions [64, 1]) it times the plan under the driver's default carveout (-1), 0 (L1
first) and 100 (shared first), each alternating with torch.compile given gathered cos/sin
(``Context.time_gpu_many``), ``rounds`` times.

    python scripts/probe_rope_carveout.py [rounds]
"""

from __future__ import annotations

import sys

import torch
from bench import Context, measure_copy_gbps
from bench_rope import DECODE, DTYPES, EAGER, tables

from baracuda_numba.driver import check, libcuda
from baracuda_numba.plans.rope import RopeArgs, RopeDescriptor, RopePlan
from baracuda_numba.types import RopePairing

CARVEOUT = 9  # CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    ctx = Context("rope", torch)
    ctx.copy_gbps = measure_copy_gbps(torch)
    print(f"copy {ctx.copy_gbps:.0f} GB/s, {torch.cuda.get_device_name()}", flush=True)
    positions = torch.randint(0, 4096, (DECODE[0], DECODE[2]), device="cuda")
    sets = 8
    for name, element in DTYPES:
        dtype = getattr(torch, name)
        xs = [torch.randn(DECODE, device="cuda", dtype=dtype) for _ in range(sets)]
        ys = [torch.empty_like(x) for x in xs]
        cos, sin = tables(torch, positions, DECODE[3])
        cos, sin = cos[:, None], sin[:, None]
        for pairing in RopePairing:
            plan = RopePlan.select(RopeDescriptor(*DECODE, element=element, pairing=pairing))
            args = [RopeArgs(x, y, positions) for x, y in zip(xs, ys)]
            plan.run(args[0])
            layout = plan._unit_items(*plan.can_implement(args[0])[:2])[1]
            function = plan._tile_kernels[layout]._function
            compiled = torch.compile(EAGER[pairing])
            compiled(xs[0], cos, sin)
            line = []
            for _ in range(rounds):
                for carveout in (-1, 0, 100):
                    check(libcuda().cuFuncSetAttribute(function, CARVEOUT, carveout),
                          "cuFuncSetAttribute")
                    ours, theirs = ctx.time_gpu_many(
                        [lambda i, p=plan, a=args: p.run(a[i]),
                         lambda i, f=compiled, x=xs, c=cos, s=sin: f(x[i], c, s)],
                        sets=sets, iters=200)
                    line.append(f"c{carveout} {ours:.2f}/{theirs:.2f}")
            check(libcuda().cuFuncSetAttribute(function, CARVEOUT, -1), "cuFuncSetAttribute")
            print(f"fwd decode {name} {pairing.name.lower()} (ours/torch.compile µs): "
                  + ", ".join(line), flush=True)


if __name__ == "__main__":
    main()
