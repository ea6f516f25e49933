"""Where the hold kernel's time goes (GPU): globaltimer stamps of every chunk of
``reduce_backward_rows_hold`` / ``_stash`` (start, total published, row total seen,
stored, block, SM), from a copy of the package with ``docs/notes/reduce_hold_trace.patch``
applied, imported as ``bn_diag`` (the stamps go to the workspace past the partials, which
this script allocates larger):

    mkdir -p ab && git archive HEAD baracuda_numba | tar -x -C ab
    (cd ab && patch -p1 < ../docs/notes/reduce_hold_trace.patch && mv baracuda_numba bn_diag)
    PYTHONPATH=ab:$PYTHONPATH [CASES=VAR:256x1000000:float32,...] \\
        python scripts/probe_reduce_hold_trace.py

Prints per case: each chunk's load / wait / store times, their shares of the blocks'
time, the first rows' start and completion times, the gaps between row completions, and
how many blocks load, wait and store over the launch (the reduce notes, thirty-fourth
pass).
"""

from __future__ import annotations

import os

import bn_diag.plans.reduce as diag_plans
import bn_diag.types as diag_types
import numpy as np
import torch
from bn_diag._frameworks import element_of

SAVED = {"VAR": lambda x: x.var(1, keepdim=True), "STD": lambda x: x.std(1, keepdim=True),
         "MAX": lambda x: x.amax(1, keepdim=True)}


def _us(ns: np.ndarray | float) -> float:
    return float(ns) / 1e3


def report(stamps: np.ndarray, rows: int, row_bytes: int) -> None:
    """Print the phases of ``stamps`` (one line of 6 per chunk, in ticket order)."""
    t0 = stamps[:, 0].min()
    start, published, done, stored = (stamps[:, i] - t0 for i in range(4))
    span = stored.max()
    blocks = len(np.unique(stamps[:, 4]))
    load, wait, store = published - start, done - published, stored - done
    busy = blocks * span
    print(f"    trace span {_us(span):.1f} us, chunks {len(stamps)}, blocks {blocks}")
    for name, part in (("load", load), ("wait", wait), ("store", store)):
        print(f"    {name}: median {_us(np.median(part)):.2f} us, p90 "
              f"{_us(np.percentile(part, 90)):.2f}, max {_us(part.max()):.2f}; "
              f"{part.sum() / busy:.1%} of the blocks' time")
    per_row = len(stamps) // rows
    cut = [slice(r * per_row, (r + 1) * per_row) for r in range(rows)]
    row_done = np.array([done[c].min() for c in cut])
    print("    rows 0-23, us: first start, last start, last published, row done")
    for r in range(min(rows, 24)):
        c = cut[r]
        print(f"      row {r:3d}: {_us(start[c].min()):7.2f} {_us(start[c].max()):7.2f} "
              f"{_us(published[c].max()):7.2f} {_us(row_done[r]):7.2f}")
    gaps = np.diff(np.sort(row_done)) / 1e3
    print(f"    gaps between row completions, us: median {np.median(gaps):.2f}, p90 "
          f"{np.percentile(gaps, 90):.2f}, max {gaps.max():.2f} (a row's bytes at "
          f"4.2 TB/s: {2 * row_bytes / 4.2e6:.2f})")
    moments = np.linspace(0, span, 41)[1:-1]
    for name, begin, end in (("loading", start, published), ("waiting", published, done),
                             ("storing", done, stored)):
        counts = [int(((begin <= t) & (end > t)).sum()) for t in moments]
        print(f"    blocks {name} at 1/40 steps of the span: {counts}")


def main() -> None:
    for case in os.environ.get("CASES", "VAR:256x1000000:float32").split(","):
        kind, shape_text, dtype = case.split(":")
        shape = tuple(int(v) for v in shape_text.split("x"))
        x = torch.randn(shape, device="cuda", dtype=getattr(torch, dtype))
        y = SAVED[kind](x)
        dy = torch.randn_like(y)
        desc = diag_plans.ReduceBackwardDescriptor(
            diag_types.ReduceKind[kind], shape, 1,
            diag_types.ElementKind[element_of(x).name], 1)
        plan = diag_plans.ReduceBackwardPlan.select(desc)
        parts, rows = plan._sync[0], shape[0]
        trace_at, trace_bytes = 8 * (1 + rows * parts), 6 * rows * parts * 8
        ws = torch.zeros(plan.workspace_size + trace_bytes, device="cuda", dtype=torch.uint8)
        args = diag_plans.ReduceBackwardArgs(dy, torch.empty_like(x), x, y)
        for _ in range(5):
            plan.run(args, workspace=ws)
        torch.cuda.synchronize()
        launch = next(iter(plan._launches.values()))[1][1]
        print(f"{case}: hold {getattr(launch, 'hold', None)}, stash "
              f"{getattr(launch, 'stash', None)}, parts {parts}", flush=True)
        for _ in range(2):
            begin = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            begin.record()
            plan.run(args, workspace=ws)
            end.record()
            torch.cuda.synchronize()
            print(f"  launch {begin.elapsed_time(end) * 1e3:.1f} us (events)")
            stamps = ws[trace_at:trace_at + trace_bytes].view(torch.int64).view(-1, 6)
            stamps = stamps.cpu().numpy()
            report(stamps[stamps[:, 3] > 0], rows, shape[1] * x.element_size())


if __name__ == "__main__":
    main()
