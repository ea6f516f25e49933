"""A/B of the reduce benchmark rows whose kernel issue 51 changed: two package roots (each
holding a ``baracuda_numba/`` folder), one subprocess per side, the same rows and input
sizes as ``scripts/bench_reduce.py``; prints old µs / new µs / ratio and each side's
share of the copy ceiling measured in the same process.

    python scripts/reduce_ab.py --base .base --new .            # GPU
    python scripts/reduce_ab.py --base .base --new . --dry-run  # the rows, no GPU

Rows (the kernels that served them before):

- [1e6, 64] axis 1 gradients that took two rows a thread (``reduce_backward_rows_reg_pair``,
  dropped: one row a thread, or the word rows for Prod / Norm2 / LogSumExp).
- bf16 Max / Min gradients along axis 1 (``reduce_backward_rows_reg`` lost its 48-register
  cap for f16 / bf16 Max).
- bf16 [256, 1e6] axis 1 Var / Std (the register-only hold kernel, dropped: the hold
  kernel with its shared-memory stash).

Each side compiles only the kernels of these rows (its plans' ``select``, then one warm-up
run); the rows' inputs are built once per shape. ``--rounds 2`` runs the sides
base, new, base, new (each a fresh process).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

#: (kind, dtype, shape, axis) of the changed rows, labelled as bench_reduce.py labels them.
ROWS = [
    *[(kind, "float32", (1_000_000, 64), 1)
      for kind in ("MAX", "MIN", "VAR", "STD", "PROD", "NORM2", "LOG_SUM_EXP")],
    ("MAX", "bfloat16", (1_000_000, 64), 1),
    ("MIN", "bfloat16", (1_000_000, 64), 1),
    ("MAX", "bfloat16", (4096, 4096), 1),
    ("MIN", "bfloat16", (4096, 4096), 1),
    ("VAR", "bfloat16", (256, 1_000_000), 1),
    ("STD", "bfloat16", (256, 1_000_000), 1),
]


def label(row: tuple) -> str:
    kind, dtype, shape, axis = row
    return f"{kind} backward {list(shape)} axis {axis} {dtype}"


WORKER = r'''
import json, statistics, sys, time
import torch
from baracuda_numba.plans.reduce import (ReduceBackwardArgs, ReduceBackwardDescriptor,
                                         ReduceBackwardPlan)
from baracuda_numba.types import ElementKind, ReduceKind

rows = json.loads(sys.argv[1])
iters = int(sys.argv[2])
FN = {
    "MAX": lambda t, a: t.amax(a, keepdim=True),
    "MIN": lambda t, a: t.amin(a, keepdim=True),
    "PROD": lambda t, a: t.prod(a, keepdim=True),
    "NORM2": lambda t, a: t.norm(dim=a, keepdim=True),
    "LOG_SUM_EXP": lambda t, a: t.logsumexp(a, keepdim=True),
    "VAR": lambda t, a: t.var(a, keepdim=True),
    "STD": lambda t, a: t.std(a, keepdim=True),
}
ELEMENT = {"float32": ElementKind.F32, "bfloat16": ElementKind.BF16}


def copy_gbps():
    src = torch.empty(1 << 28, device="cuda", dtype=torch.uint8).random_(0, 255)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    times = []
    for _ in range(20):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); dst.copy_(src); b.record(); b.synchronize()
        times.append(a.elapsed_time(b) * 1e-3)
    return 2 * src.numel() / statistics.median(times) / 1e9


started = time.perf_counter()
out = {"copy_gbps": copy_gbps(), "rows": {}}
inputs = {}
for kind, dtype, shape, axis in rows:
    key = (dtype, tuple(shape))
    if key not in inputs:
        inputs.clear()
        torch.cuda.empty_cache()
        inputs[key] = (torch.rand(shape, device="cuda", dtype=torch.float32) * 4 - 2).to(
            getattr(torch, dtype))
    x = inputs[key]
    xg = x.detach().requires_grad_(True)
    o = FN[kind](xg, axis)
    dy = torch.rand_like(o) * 2 - 1
    y = o.detach()
    o = xg = None
    dx = torch.empty_like(x)
    plan = ReduceBackwardPlan.select(ReduceBackwardDescriptor(
        ReduceKind[kind], tuple(shape), axis, ELEMENT[dtype]))
    ws = torch.empty(max(plan.workspace_size, 1), device="cuda", dtype=torch.uint8)
    args = ReduceBackwardArgs(dy, dx, x, y)
    t0 = time.perf_counter()
    plan.run(args, workspace=ws)  # compiles (or loads) this row's kernels
    torch.cuda.synchronize()
    compile_s = time.perf_counter() - t0
    for _ in range(3):
        plan.run(args, workspace=ws)
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); plan.run(args, workspace=ws); b.record(); b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    # the public accessors; the base side may be a package from before they existed
    launches = plan.bound_launches() if hasattr(plan, "bound_launches") else plan._launches
    stat, (access, bound) = next(iter(launches.values()))
    kernel = getattr(getattr(bound, "kernel", getattr(bound, "_kernel", None)), "name", "")
    nbytes = 2 * x.numel() * x.element_size() + 2 * y.numel() * y.element_size()
    out["rows"][f"{kind}|{dtype}|{shape[0]}x{shape[1]}|{axis}"] = {
        "us": statistics.median(times), "bytes": nbytes, "choice": plan.choice,
        "kernel": kernel, "compile_s": compile_s}
    print(f"  {kind} {dtype} {shape} axis {axis}: {statistics.median(times):.1f} us "
          f"({plan.choice} {kernel}; first run {compile_s:.1f} s)", file=sys.stderr,
          flush=True)
out["seconds"] = time.perf_counter() - started
print(json.dumps(out))
'''


def run_side(root: str, rows: list, iters: int, name: str) -> dict:
    """One process with ``root`` first on the path: the timings of ``rows``."""
    root = os.path.abspath(root)
    if not os.path.isdir(os.path.join(root, "baracuda_numba")):
        sys.exit(f"reduce_ab: {root} holds no baracuda_numba/ folder")
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    print(f"[{name}] {root}", file=sys.stderr, flush=True)
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", WORKER, json.dumps(rows), str(iters)],
                          env=env, cwd=root, stdout=subprocess.PIPE, text=True, check=True)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"[{name}] {time.perf_counter() - started:.0f} s in all, copy "
          f"{result['copy_gbps']:.0f} GB/s", file=sys.stderr, flush=True)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="package root of the old code")
    parser.add_argument("--new", required=True, help="package root of the new code")
    parser.add_argument("--iters", type=int, default=50, help="timed runs a row (median)")
    parser.add_argument("--rounds", type=int, default=1, help="base/new process pairs")
    parser.add_argument("--only", default="", help="comma-separated kinds or dtypes")
    parser.add_argument("--dry-run", action="store_true", help="list the rows and exit")
    opts = parser.parse_args()
    wanted = [w for w in opts.only.split(",") if w]
    rows = [r for r in ROWS if not wanted or r[0] in wanted or r[1] in wanted]
    # the rows grouped by input, so each side builds each input once
    rows.sort(key=lambda r: (r[1], r[2]))
    if opts.dry_run:
        for row in rows:
            print(label(row))
        print(f"{len(rows)} rows; sides: {os.path.abspath(opts.base)} -> "
              f"{os.path.abspath(opts.new)}")
        return 0
    payload = [[k, d, list(s), a] for k, d, s, a in rows]
    results: dict[str, list[dict]] = {"base": [], "new": []}
    for _ in range(opts.rounds):
        for name, root in (("base", opts.base), ("new", opts.new)):
            results[name].append(run_side(root, payload, opts.iters, name))
    print("\n| row | old µs | new µs | new / old | old % copy | new % copy | new path |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for kind, dtype, shape, axis in rows:
        key = f"{kind}|{dtype}|{shape[0]}x{shape[1]}|{axis}"
        old = [r["rows"][key] for r in results["base"]]
        new = [r["rows"][key] for r in results["new"]]
        old_us = min(r["us"] for r in old)
        new_us = min(r["us"] for r in new)
        copy = [r["copy_gbps"] for r in results["base"]], [r["copy_gbps"] for r in results["new"]]
        pct = [100 * row["bytes"] / (row["us"] * 1e-6) / 1e9 / c
               for row, c in ((old[0], copy[0][0]), (new[0], copy[1][0]))]
        print(f"| {label((kind, dtype, shape, axis))} | {old_us:.1f} | {new_us:.1f} | "
              f"{new_us / old_us:.3f} | {pct[0]:.0f} | {pct[1]:.0f} | "
              f"{new[0]['choice']} {new[0]['kernel']} |")
    for name in ("base", "new"):
        print(f"{name}: copy ceiling " + ", ".join(f"{r['copy_gbps']:.0f}" for r in results[name])
              + " GB/s; process seconds " + ", ".join(f"{r['seconds']:.0f}" for r in results[name]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
