"""Benchmark section ``scan``: ScanPlan / ScanBackwardPlan against torch (issue 4 targets).

Shapes: [4096, 4096] and [64, 1_000_000], scanned along the last axis and along axis 0,
f32 and bf16. Forward rows compare with ``torch.cumsum/logcumsumexp/cummax/...``;
backward rows with ``torch.autograd.grad`` through the same op (graph built once, only
the backward timed). Bytes counted: each tensor the op must read or write once (Cummax
with indices: + 8 bytes per element).

``python scripts/bench_scan.py --precompile`` compiles the generic scan kernels in
parallel worker processes (``scripts/precompile.py --only scan`` compiles all of them,
the fast kernels included). ``SCAN_BENCH=quick`` runs the target cases and tuning runs
only; ``SCAN_BENCH=extremum_backward`` the Cummax/Cummin backward cases
(``extremum_backward_tuning``: with the fused kernel's tile variants);
``SCAN_BENCH=two_byte`` the cases of the 2-byte paths (packed cols kernel, staged indices).
"""

from __future__ import annotations

import os
import sys
from typing import Any

from baracuda_numba.plans.scan import (
    ScanArgs,
    ScanBackwardArgs,
    ScanBackwardDescriptor,
    ScanBackwardPlan,
    ScanDescriptor,
    ScanPlan,
)
from baracuda_numba.types import ElementKind, PlanPreference, ScanKind

SQUARE = (4096, 4096)
WIDE = (64, 1_000_000)
SAMPLING = (256, 128256)  # top-p sampling's cumsum over a Llama 3 vocabulary


def _torch_op(torch: Any, kind: ScanKind, x: Any, axis: int) -> Any:
    if kind is ScanKind.CUMSUM:
        return torch.cumsum(x, axis)
    if kind is ScanKind.CUMPROD:
        return torch.cumprod(x, axis)
    if kind is ScanKind.CUMMAX:
        return torch.cummax(x, axis)
    if kind is ScanKind.CUMMIN:
        return torch.cummin(x, axis)
    return torch.logcumsumexp(x, axis)


def _values(result: Any) -> Any:
    return result[0] if isinstance(result, tuple) else result  # cummax: (values, indices)


def _forward(ctx: Any, kind: ScanKind, shape: tuple[int, ...], axis: int, dtype_name: str,
             element: ElementKind, indices: bool = True, workspace: bool = True,
             note: str = "", fast_words: int | None = None,
             indexed_cap: int | None = None, chained: bool | None = None) -> None:
    torch = ctx.torch
    dtype = getattr(torch, dtype_name)
    numel = shape[0] * shape[1]
    item = torch.tensor([], dtype=dtype).element_size()
    sets = ctx.sets_for(2 * numel * item)
    xs = [torch.randn(shape, device="cuda").to(dtype) for _ in range(sets)]
    if kind is ScanKind.CUMPROD:
        xs = [(1 + 0.01 * x.float()).to(dtype) for x in xs]
    ys = [torch.empty_like(x) for x in xs]
    with_indices = indices and kind in (ScanKind.CUMMAX, ScanKind.CUMMIN)
    index_out = [torch.empty(shape, dtype=torch.int64, device="cuda") for _ in xs] \
        if with_indices else [None] * sets
    plan = ScanPlan.select(ScanDescriptor(kind, shape, axis, element=element),
                           None if workspace else PlanPreference(max_workspace_bytes=0))
    if fast_words or chained is not None:  # tuning: another tile, or the other split
        from baracuda_numba.kernels.scan import FAST_FAMILY, FastKernels

        plan.use_kernels(fast=FastKernels(element, FAST_FAMILY[int(kind)], fast_words,
                                          register=False, chained=chained))
    if indexed_cap is not None:  # tuning: the indexed kernel's register cap (0: none)
        from baracuda_numba.kernels.scan import IndexedKernels

        plan.use_kernels(indexed=IndexedKernels(element, register=False,
                                                max_registers=indexed_cap))
    ws = None
    if workspace and plan.workspace_size:
        ws = torch.empty(plan.workspace_size, dtype=torch.uint8, device="cuda")
    args = [ScanArgs(x, y, i) for x, y, i in zip(xs, ys, index_out)]
    ours = ctx.time_gpu(lambda i: plan.run(args[i], workspace=ws), sets)
    theirs = ctx.time_gpu(lambda i: _torch_op(torch, kind, xs[i], axis), sets)
    moved = 2 * numel * item + (8 * numel if with_indices else 0)
    label = f"{kind.name.lower()} fw {list(shape)} axis={axis}"
    if with_indices:
        label += " +indices"
    ctx.row(label, dtype_name, ours, moved, theirs, note,
            tuning=bool(fast_words) or indexed_cap is not None or chained is not None)


def _backward(ctx: Any, kind: ScanKind, shape: tuple[int, ...], axis: int, dtype_name: str,
              element: ElementKind, fused: dict[str, Any] | bool | None = None,
              note: str = "vs torch autograd") -> None:
    """``fused`` (Cummax/Cummin): ``ExtremumBackwardKernels`` keyword arguments for a
    tuning run of the fused backward, or False for the record-flag pre-pass and the
    generic kernels."""
    torch = ctx.torch
    dtype = getattr(torch, dtype_name)
    numel = shape[0] * shape[1]
    item = torch.tensor([], dtype=dtype).element_size()
    tensors = {ScanKind.CUMSUM: 2, ScanKind.CUMPROD: 4, ScanKind.LOG_CUMSUM_EXP: 4}.get(kind, 3)
    sets = ctx.sets_for(tensors * numel * item)
    xs, ys, dys, dxs, graphs = [], [], [], [], []
    for _ in range(sets):
        x = torch.randn(shape, device="cuda").to(dtype)
        if kind is ScanKind.CUMPROD:
            x = (1 + 0.01 * x.float()).to(dtype)
        x.requires_grad_()
        y = _values(_torch_op(torch, kind, x, axis))
        xs.append(x)
        graphs.append(y)
        ys.append(y.detach())
        dys.append(torch.randn(shape, device="cuda").to(dtype))
        dxs.append(torch.empty(shape, device="cuda", dtype=dtype))
    plan = ScanBackwardPlan.select(ScanBackwardDescriptor(kind, shape, axis, element=element))
    if fused is False:
        plan.use_kernels(extremum_backward=None)
    elif fused:
        from baracuda_numba.kernels.scan import ExtremumBackwardKernels

        plan.use_kernels(extremum_backward=ExtremumBackwardKernels(element, register=False,
                                                                   **fused))
    ws = torch.empty(max(plan.workspace_size, 1), dtype=torch.uint8, device="cuda")
    args = [ScanBackwardArgs(dy, dx, x.detach(), y) for dy, dx, x, y in zip(dys, dxs, xs, ys)]
    ours = ctx.time_gpu(lambda i: plan.run(args[i], workspace=ws), sets)
    theirs = ctx.time_gpu(lambda i: torch.autograd.grad(graphs[i], xs[i], dys[i],
                                                        retain_graph=True), sets)
    ctx.row(f"{kind.name.lower()} bw {list(shape)} axis={axis}", dtype_name, ours,
            tensors * numel * item, theirs, note, tuning=fused is not None)


def _variant(ctx: Any, shape: tuple[int, ...], axis: int, dtype_name: str = "float32",
             element: ElementKind = ElementKind.F32, words: int | None = None,
             col_values: int | None = None, cols_cap: int | None = None,
             **geometry: int) -> None:
    """Cumsum with the plan's launch geometry (or the fast kernels' tile: ``words`` per
    lane of rows_fast, ``col_values`` per thread of cols_fast) overridden: tuning data."""
    from baracuda_numba.kernels.scan import FastKernels

    torch = ctx.torch
    dtype = getattr(torch, dtype_name)
    numel = shape[0] * shape[1]
    item = torch.tensor([], dtype=dtype).element_size()
    sets = ctx.sets_for(2 * item * numel)
    xs = [torch.randn(shape, device="cuda").to(dtype) for _ in range(sets)]
    ys = [torch.empty_like(x) for x in xs]
    plan = ScanPlan.select(ScanDescriptor(ScanKind.CUMSUM, shape, axis, element=element))
    if words or col_values or cols_cap is not None:
        plan.use_kernels(fast=FastKernels(element, "arith", words, col_values, register=False,
                                          cols_max_registers=cols_cap))
    plan.use_kernels(**geometry)
    ws = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    args = [ScanArgs(x, y) for x, y in zip(xs, ys)]
    ours = ctx.time_gpu(lambda i: plan.run(args[i], workspace=ws), sets)
    settings = dict(geometry, words=words, col_values=col_values, cols_cap=cols_cap)
    ctx.row(f"cumsum fw {list(shape)} axis={axis} variant", dtype_name, ours,
            2 * item * numel, None,
            ", ".join(f"{k}={v}" for k, v in settings.items() if v is not None), tuning=True)


def _guarded(ctx: Any, fn: Any, *args: Any, **kwargs: Any) -> None:
    """Run one case; a failure becomes a note instead of losing the whole table."""
    try:
        fn(ctx, *args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - report and go on
        ctx.notes.append(f"FAILED {fn.__name__}{args[:4]}: {type(exc).__name__}: {exc}")
    ctx.torch.cuda.empty_cache()


def _quick(ctx: Any) -> None:
    """``SCAN_BENCH=quick``: the issue's target cases and the fast kernels' tuning runs."""
    pairs = (("float32", ElementKind.F32), ("bfloat16", ElementKind.BF16))
    for dtype_name, element in pairs:
        for shape, axis in ((SQUARE, 1), (SQUARE, 0), (WIDE, 1), (WIDE, 0)):
            _guarded(ctx, _forward, ScanKind.CUMSUM, shape, axis, dtype_name, element)
        for axis in (1, 0):
            _guarded(ctx, _forward, ScanKind.LOG_CUMSUM_EXP, SQUARE, axis, dtype_name,
                     element)
        _guarded(ctx, _forward, ScanKind.CUMMAX, SQUARE, 1, dtype_name, element)
        _guarded(ctx, _forward, ScanKind.CUMMAX, WIDE, 1, dtype_name, element)
        _guarded(ctx, _backward, ScanKind.CUMMIN, SQUARE, 1, dtype_name, element)
        _guarded(ctx, _backward, ScanKind.CUMSUM, SQUARE, 1, dtype_name, element)
    _guarded(ctx, _forward, ScanKind.LOG_CUMSUM_EXP, WIDE, 1, "float32", ElementKind.F32)
    _guarded(ctx, _forward, ScanKind.CUMPROD, SQUARE, 1, "float32", ElementKind.F32)
    for dtype_name, element in pairs:
        for words in (8,):
            _guarded(ctx, _forward, ScanKind.LOG_CUMSUM_EXP, SQUARE, 1, dtype_name, element,
                     fast_words=words, note=f"words={words}")
        for nseg in (4, 16):
            _guarded(ctx, _variant, SQUARE, 0, dtype_name, element, fast_cols_nseg=nseg)
        for nseg in (128, 512):
            _guarded(ctx, _variant, WIDE, 1, dtype_name, element, fast_rows_nseg=nseg)
    ctx.torch.cuda.synchronize()


def _extremum_backward_cases(ctx: Any, tuning: bool = True) -> None:
    """Cummax/Cummin backward (the fused kernel) on the target shapes and the previous
    path (record-flag pre-pass + generic backward) for reference; ``tuning``: the fused
    kernel with other tiles."""
    pairs = (("float32", ElementKind.F32), ("bfloat16", ElementKind.BF16))
    for dtype_name, element in pairs:
        for kind in (ScanKind.CUMMAX, ScanKind.CUMMIN):
            for shape, axis in ((SQUARE, 1), (SQUARE, 0), (WIDE, 1)):
                _guarded(ctx, _backward, kind, shape, axis, dtype_name, element)
    if not tuning:
        return
    for dtype_name, element in pairs:
        for shape, axis in ((SQUARE, 1), (SQUARE, 0), (WIDE, 1)):
            _guarded(ctx, _backward, ScanKind.CUMMAX, shape, axis, dtype_name, element,
                     fused=False, note="previous path: flag pre-pass + generic backward")
    for fused, note in (({"words": 2}, "fused rows words=2"),
                        ({"blocked": False}, "fused rows words=4 striped")):
        _guarded(ctx, _backward, ScanKind.CUMMAX, SQUARE, 1, "float32", ElementKind.F32,
                 fused=fused, note=note)
    for fused, note in (({"col_values": 4}, "fused cols values=4"),
                        ({"col_values": 16}, "fused cols values=16"),
                        ({"cols_max_registers": 0}, "fused cols values=8, no register cap")):
        _guarded(ctx, _backward, ScanKind.CUMMAX, SQUARE, 0, "float32", ElementKind.F32,
                 fused=fused, note=note)


def _two_byte_cases(ctx: Any) -> None:
    """``SCAN_BENCH=two_byte``: the cases of the packed 2-byte cols kernel (Cumsum,
    Cumprod, Cummax values, LogCumsumExp and the Cumsum backward along axis 0) and of the
    indexed rows kernel's staged indices (Cummax/Cummin with indices along the last
    axis), with f32 for reference."""
    triples = (("float32", ElementKind.F32), ("bfloat16", ElementKind.BF16),
               ("float16", ElementKind.F16))
    for dtype_name, element in triples:
        for shape in (SQUARE, WIDE):
            _guarded(ctx, _forward, ScanKind.CUMSUM, shape, 0, dtype_name, element)
    for kind in (ScanKind.CUMPROD, ScanKind.LOG_CUMSUM_EXP):
        _guarded(ctx, _forward, kind, SQUARE, 0, "bfloat16", ElementKind.BF16)
    _guarded(ctx, _forward, ScanKind.CUMMAX, SQUARE, 0, "bfloat16", ElementKind.BF16,
             indices=False, note="values only (torch computes indices regardless)")
    for dtype_name, element in triples[:2]:
        _guarded(ctx, _backward, ScanKind.CUMSUM, SQUARE, 0, dtype_name, element)
    for dtype_name, element in triples:
        _guarded(ctx, _forward, ScanKind.CUMMAX, SQUARE, 1, dtype_name, element)
    _guarded(ctx, _forward, ScanKind.CUMMIN, SQUARE, 1, "bfloat16", ElementKind.BF16)
    _guarded(ctx, _forward, ScanKind.CUMMAX, WIDE, 1, "bfloat16", ElementKind.BF16)
    for shape in (SQUARE, WIDE):
        _guarded(ctx, _variant, shape, 0, "bfloat16", ElementKind.BF16, cols_cap=0)
    for nseg in (8, 32):  # the default splits bf16 [4096²] axis 0 in 16 segments
        _guarded(ctx, _variant, SQUARE, 0, "bfloat16", ElementKind.BF16, fast_cols_nseg=nseg)
    _guarded(ctx, _forward, ScanKind.CUMMAX, SQUARE, 1, "bfloat16", ElementKind.BF16,
             indexed_cap=0, note="indexed_cap=0 (no register cap)")
    ctx.torch.cuda.synchronize()


def bench(ctx: Any) -> None:
    if os.environ.get("SCAN_BENCH") == "quick":
        _quick(ctx)
        return
    if os.environ.get("SCAN_BENCH") == "two_byte":
        _two_byte_cases(ctx)
        return
    if os.environ.get("SCAN_BENCH", "").startswith("extremum_backward"):
        _extremum_backward_cases(ctx, os.environ["SCAN_BENCH"].endswith("tuning"))
        return
    pairs = (("float32", ElementKind.F32), ("bfloat16", ElementKind.BF16))
    for dtype_name, element in pairs:
        for shape, axis in ((SQUARE, 1), (SQUARE, 0), (WIDE, 1), (WIDE, 0)):
            _guarded(ctx, _forward, ScanKind.CUMSUM, shape, axis, dtype_name, element)
    for shape, axis in ((WIDE, 1), (SQUARE, 0)):
        _guarded(ctx, _forward, ScanKind.CUMSUM, shape, axis, "float32", ElementKind.F32,
                 workspace=False, note="no workspace: unsplit lines")
    for dtype_name, element in pairs:
        for axis in (1, 0):
            _guarded(ctx, _forward, ScanKind.LOG_CUMSUM_EXP, SQUARE, axis, dtype_name,
                     element)
            _guarded(ctx, _forward, ScanKind.CUMMAX, SQUARE, axis, dtype_name, element)
    _guarded(ctx, _forward, ScanKind.CUMMAX, SQUARE, 1, "float32", ElementKind.F32,
             indices=False, note="values only (torch computes indices regardless)")
    _guarded(ctx, _forward, ScanKind.CUMPROD, SQUARE, 1, "float32", ElementKind.F32)
    _guarded(ctx, _forward, ScanKind.CUMMIN, SQUARE, 0, "float32", ElementKind.F32)
    _guarded(ctx, _forward, ScanKind.LOG_CUMSUM_EXP, WIDE, 1, "float32", ElementKind.F32)
    for dtype_name, element in pairs:
        _guarded(ctx, _forward, ScanKind.CUMMAX, WIDE, 1, dtype_name, element)
    for dtype_name, element in pairs:
        for kind in (ScanKind.CUMSUM, ScanKind.CUMPROD, ScanKind.LOG_CUMSUM_EXP):
            for axis in (1, 0):
                _guarded(ctx, _backward, kind, SQUARE, axis, dtype_name, element)
    _extremum_backward_cases(ctx, tuning=ctx.sweep)
    if ctx.sweep:  # tuning rows (CSV results only)
        _sweep(ctx, pairs)
    ctx.torch.cuda.synchronize()
    ctx.notes.append("Targets (issue 4): cumsum last axis >= 2x torch and >= 50% of copy; "
                     "axis 0 >= 10x torch; logcumsumexp and cummax >= 2x torch; every "
                     "backward at least as fast as torch autograd.")


def _sweep(ctx: Any, pairs: Any) -> None:
    """``--sweep``: the fast kernels' segments and the register caps, off their defaults;
    rows_fast's split the other way than its default (two launches for the 16-bit
    elements, one chained launch for F32)."""
    for dtype_name, element in pairs:
        other = {2: False, 4: True}.get(element.byte_width) \
            if element is not ElementKind.F64 else None
        for shape in (WIDE, SAMPLING) if other is not None else ():
            _guarded(ctx, _forward, ScanKind.CUMSUM, shape, 1, dtype_name, element,
                     chained=other, note=f"split {'chained' if other else 'in two launches'}")
        for nseg in (64, 512):
            _guarded(ctx, _variant, WIDE, 1, dtype_name, element, fast_rows_nseg=nseg)
        for nseg in (4, 16):
            _guarded(ctx, _variant, SQUARE, 0, dtype_name, element, fast_cols_nseg=nseg)
    # register caps (cols_cap / indexed_cap, 0: none; the defaults are 64 for cols_fast
    # at 2- and 4-byte elements and for the indexed kernel at 2-byte ones)
    for shape in (SQUARE, WIDE):
        for dtype_name, element in pairs:
            _guarded(ctx, _variant, shape, 0, dtype_name, element, cols_cap=0)
    _guarded(ctx, _forward, ScanKind.CUMMAX, SQUARE, 1, "bfloat16", ElementKind.BF16,
             indexed_cap=0, note="indexed_cap=0 (no register cap)")
    _guarded(ctx, _forward, ScanKind.CUMMAX, SQUARE, 1, "float32", ElementKind.F32,
             indexed_cap=56, note="indexed_cap=56")


def _prepare(key: tuple[bool, str, str]) -> str:
    from baracuda_numba.kernels.scan import SCAN_KERNELS

    backward, element, algorithm = key
    kernels = SCAN_KERNELS[(backward, ElementKind[element])]
    getattr(kernels, algorithm).load()
    return f"{'backward' if backward else 'forward'} {algorithm} {element}"


def precompile(workers: int = 16) -> None:
    """Compile every scan kernel into Numba's disk cache, in parallel processes."""
    import multiprocessing
    import time
    from concurrent.futures import ProcessPoolExecutor

    from baracuda_numba.kernels.scan import SCAN_KERNELS

    keys = [(b, e.name, a) for (b, e) in SCAN_KERNELS for a in ("rows", "lines")]
    start = time.perf_counter()
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(workers, mp_context=context) as pool:
        for done in pool.map(_prepare, keys):
            print(f"compiled {done} ({time.perf_counter() - start:.0f} s)", flush=True)


if __name__ == "__main__":
    if "--precompile" in sys.argv:
        precompile()
