"""Host overhead (issues 3 and 8): µs of host time per ``plan.run`` at a tiny shape, for
every plan, with torch tensors and CuPy arrays; next to one PyTorch op, a bare
Numba-dispatcher launch of an empty kernel, the Numba-dispatcher path of our own plans,
and the functional / ``torch.library`` layers. Also ``select`` time in a fresh process,
cold (empty Numba cache) and warm (kernel in Numba's on-disk cache).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time

from numba import cuda

import baracuda_numba as bn
from baracuda_numba.launch import BoundLaunch, set_launch_mode


@cuda.jit
def _empty(a, b):
    pass


ROUNDS = 5  # host rows are measured round-robin, best round kept (see _measure_rows)
_pending: list[tuple[str, str, object, int, bool]] = []
#: Rows that time a non-default launch path (A/B against the default): CSV results only.
TUNING_LABELS = ("Numba dispatcher path", "one pointer per parameter", "bare ctypes")


def host_row(ctx, label: str, dtype: str, fn, calls: int = 10000) -> None:
    """Queue a host-time row; :func:`_measure_rows` measures every queued row together."""
    _pending.append((label, dtype, fn, calls, any(t in label for t in TUNING_LABELS)))


def _measure_rows(ctx) -> dict[str, float]:
    """Measure the queued rows together with ``ctx.time_host_many`` (round-robin, best of
    ROUNDS); the note keeps the issue's method, one loop of ``calls`` calls by wall clock,
    then one synchronise."""
    torch = ctx.torch
    best = ctx.time_host_many({label: fn for label, _, fn, _, _ in _pending}, rounds=ROUNDS)
    for label, dtype, fn, calls, tuning in _pending:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        loop = (time.perf_counter() - t0) / calls * 1e6
        ctx.row(label, dtype, best[label], note=f"{calls}-call loop: {loop:.1f} µs/call",
                tuning=tuning)
    _pending.clear()
    return best


def _cases(torch):
    """(label, runner factory(make_array) -> zero-arg callable) for every plan."""
    E = bn.ElementKind
    f32 = E.F32
    cases = []

    ws = bn.WriteSlicePlan.select(bn.WriteSliceDescriptor((4, 8, 16), (4, 2, 8),
                                                          ((0, 4), (3, 5), (4, 12)), f32))

    def write_slice(arr):
        dest, source = arr((4, 8, 16)), arr((4, 2, 8))
        return lambda: ws.run(bn.WriteSliceArgs(dest, source))

    cases.append(("WriteSlicePlan (kernel path; dest, source)", write_slice))

    # runs without a workspace (the host path timed here): plans that need none
    plain = bn.PlanPreference(max_workspace_bytes=0)
    scan = bn.ScanPlan.select(bn.ScanDescriptor(bn.ScanKind.CUMSUM, (4, 64), 1, element=f32),
                              plain)

    def scan_fw(arr):
        x, y = arr((4, 64)), arr((4, 64))
        return lambda: scan.run(bn.ScanArgs(x, y))

    cases.append(("ScanPlan cumsum (x, y)", scan_fw))
    scan_bw = bn.ScanBackwardPlan.select(bn.ScanBackwardDescriptor(
        bn.ScanKind.CUMPROD, (4, 64), 1, element=f32), plain)

    def scan_back(arr):
        dy, dx, x, y = (arr((4, 64)) for _ in range(4))
        return lambda: scan_bw.run(bn.ScanBackwardArgs(dy, dx, x, y))

    cases.append(("ScanBackwardPlan cumprod (dy, dx, x, y)", scan_back))
    red = bn.ReducePlan.select(bn.ReduceDescriptor(bn.ReduceKind.SUM, (4, 64), 1, f32), plain)

    def reduce_fw(arr):
        x, y = arr((4, 64)), arr((4, 1))
        return lambda: red.run(bn.ReduceArgs(x, y))

    cases.append(("ReducePlan sum (x, y)", reduce_fw))
    red_bw = bn.ReduceBackwardPlan.select(bn.ReduceBackwardDescriptor(
        bn.ReduceKind.VAR, (4, 64), 1, f32), plain)

    def reduce_back(arr):
        dy, dx, x, y = arr((4, 1)), arr((4, 64)), arr((4, 64)), arr((4, 1))
        return lambda: red_bw.run(bn.ReduceBackwardArgs(dy, dx, x, y))

    cases.append(("ReduceBackwardPlan var (dy, dx, x, y)", reduce_back))
    rope = bn.RopePlan.select(bn.RopeDescriptor(64, 32, 1, 128, element=f32))

    def rope_fw(arr):
        x, y = arr((64, 32, 1, 128)), arr((64, 32, 1, 128))
        positions = arr((1,), "int64")
        return lambda: rope.run(bn.RopeArgs(x, y, positions))

    cases.append(("RopePlan decode [64,32,1,128] (x, y, positions)", rope_fw))
    fmp = bn.FractionalMaxPool2dPlan.select(bn.FractionalMaxPool2dDescriptor.new(
        2, 3, 9, 9, 2, 2, 5, 5, f32))

    def fmp_fw(arr):
        x, y = arr((2, 3, 9, 9)), arr((2, 3, 5, 5))
        indices, samples = arr((2, 3, 5, 5), "int64"), arr((2, 3, 2))
        return lambda: fmp.run_fw(bn.FractionalMaxPool2dFwArgs(x, y, indices, samples))

    cases.append(("FractionalMaxPool2dPlan fw (x, y, indices, samples)", fmp_fw))
    norm = bn.RMSNormPlan.select(bn.RMSNormDescriptor((64, 4096), (4096,), f32, 1e-6, True))

    def norm_fw(arr):
        x, y, rstd, w = arr((64, 4096)), arr((64, 4096)), arr((64, 1)), arr((4096,))
        return lambda: norm.run(bn.RMSNormArgs(x, y, rstd, w))

    cases.append(("RMSNormPlan [64,4096] (x, y, rstd, weight)", norm_fw))
    norm_bw = bn.RMSNormBackwardPlan.select(bn.RMSNormBackwardDescriptor(
        (64, 4096), (4096,), f32, True))

    def norm_back(arr):
        dy, x, dx = arr((64, 4096)), arr((64, 4096)), arr((64, 4096))
        rstd, w, dw = arr((64, 1)), arr((4096,)), arr((4096,))
        workspace = arr((norm_bw.workspace_size,), "uint8")
        return lambda: norm_bw.run(bn.RMSNormBackwardArgs(dy, x, rstd, dx, w, dw),
                                   workspace=workspace)

    cases.append(("RMSNormBackwardPlan [64,4096] (dy, x, rstd, dx, weight, dweight, "
                  "workspace)", norm_back))
    return cases


SELECT_SNIPPET = r"""
import time
t0 = time.perf_counter()
import baracuda_numba as bn
from numba import cuda
cuda.current_context()  # CUDA context creation is the process's cost, not select's
t1 = time.perf_counter()
bn.WriteSlicePlan, bn.WriteSliceDescriptor  # the plan module's import (lazy attribute)
t2 = time.perf_counter()
bn.WriteSlicePlan.select(bn.WriteSliceDescriptor((4, 8, 16), (4, 2, 8),
                                                 ((0, 4), (3, 5), (4, 12)), bn.ElementKind.F16))
t3 = time.perf_counter()
bn.ScanPlan, bn.ScanDescriptor
t4 = time.perf_counter()
bn.ScanPlan.select(bn.ScanDescriptor(bn.ScanKind.CUMSUM, (64, 4096), 1,
                                     element=bn.ElementKind.BF16))
t5 = time.perf_counter()
print(" ".join(f"{(b - a) * 1e3:.1f}" for a, b in ((t0, t1), (t1, t2), (t2, t3), (t3, t4),
                                                   (t4, t5))))
"""


def bench(ctx) -> None:
    torch = ctx.torch
    x = torch.randn(64, device="cuda")
    host_row(ctx, "one PyTorch op (x.add_(1.0)), torch tensor", "f32", lambda: x.add_(1.0))
    a = torch.empty(16, device="cuda", dtype=torch.float16)
    b = torch.empty(16, device="cuda", dtype=torch.float16)
    _empty[1, 32](a, b)
    host_row(ctx, "bare Numba dispatcher launch, empty kernel, 2 torch tensors", "f16",
             lambda: _empty[1, 32](a, b), calls=2000)
    try:
        import cupy as cp
    except ImportError:
        cp = None
    if cp is not None:
        ca, cb = cp.empty(16, cp.float16), cp.empty(16, cp.float16)
        _empty[1, 32](ca, cb)
        host_row(ctx, "bare Numba dispatcher launch, empty kernel, 2 CuPy arrays", "f16",
                 lambda: _empty[1, 32](ca, cb), calls=2000)

    def torch_array(shape, dtype="float32"):
        return torch.rand(*shape, device="cuda").to(getattr(torch, dtype))

    for label, factory in _cases(torch):
        host_row(ctx, f"{label}, torch tensors", "f32", factory(torch_array))
        if cp is not None:
            host_row(ctx, f"{label}, CuPy arrays", "f32",
                     factory(lambda shape, dtype="float32": cp.asarray(torch_array(shape,
                                                                                   dtype))))
    label, factory = _cases(torch)[1]
    run = factory(torch_array)

    def dispatched():
        set_launch_mode("dispatcher")
        run()
        set_launch_mode("direct")

    host_row(ctx, f"{label}, torch tensors, Numba dispatcher path", "f32", dispatched,
             calls=2000)
    _functional(ctx, torch)
    device_row = _breakdown(ctx, torch)
    best = _measure_rows(ctx)
    ctx.notes.append("functional / plan.run host ratio: cumsum "
                     f"{best[FUNCTIONAL_LABEL] / best[PLAN_LABEL]:.2f}, sum "
                     f"{best[REDUCE_FUNCTIONAL_LABEL] / best[REDUCE_PLAN_LABEL]:.2f}")
    device_row()
    with tempfile.TemporaryDirectory() as cache_dir:
        env = dict(os.environ, NUMBA_CACHE_DIR=cache_dir, BARACUDA_CACHE_DIR=cache_dir)
        for label in ("cold (empty caches)", "warm (cubin cache filled by the cold run)"):
            out = subprocess.run([sys.executable, "-c", SELECT_SNIPPET], env=env,
                                 capture_output=True, text=True, check=True).stdout.split()
            ctx.notes.append(f"fresh process, {label}: import baracuda_numba + CUDA context "
                             f"{out[0]} ms; import of the WriteSlice plan module {out[1]} ms, "
                             f"WriteSlicePlan.select {out[2]} ms (loads the natural-width row "
                             f"kernel); import of the scan plan module {out[3]} ms, "
                             f"ScanPlan.select (bf16 cumsum) {out[4]} ms")
    ctx.notes.append("host rows: the µs column is host time per call: the median over 20 "
                     f"bursts of 100 calls (each started on an idle GPU), best of {ROUNDS} "
                     "rounds in which every row is measured in turn (the machine's CPU "
                     "speed drifts, so rows are interleaved); the note has the issue's "
                     "method, one plain loop (wall clock, then one synchronise), which "
                     "becomes device-bound when the kernel is longer on the GPU than the "
                     "call on the host.")
    from baracuda_numba import driver

    ctx.notes.append("torch tensors and CuPy arrays take the plans' memo path after the "
                     "first call (checks cached per layout key: shape, strides, dtype, "
                     "pointer mod 16; aliasing checks per call), and from the second "
                     "call on the memo's hot layout (torch: one TensorGuards call; CuPy: "
                     "inline attribute tests); launches go through "
                     f"the '{driver.launcher()[0]}' binding of cuLaunchKernel "
                     "(driver.launcher).")


PLAN_LABEL = "cumsum: ScanPlan.run with preallocated y (torch)"
FUNCTIONAL_LABEL = "cumsum: ops.cumsum(x, 1) (allocates y, current stream)"
REDUCE_PLAN_LABEL = "sum: ReducePlan.run with preallocated y (torch)"
REDUCE_FUNCTIONAL_LABEL = "sum: ops.sum(x, 1, keepdim=True) (allocates y, current stream)"


def _functional(ctx, torch) -> None:
    from baracuda_numba import ops

    x = torch.rand(4, 64, device="cuda")
    plain = bn.PlanPreference(max_workspace_bytes=0)  # runs without a workspace
    scan = bn.ScanPlan.select(bn.ScanDescriptor(bn.ScanKind.CUMSUM, (4, 64), 1,
                                                element=bn.ElementKind.F32), plain)
    y = torch.empty_like(x)
    host_row(ctx, PLAN_LABEL, "f32", lambda: scan.run(bn.ScanArgs(x, y)))
    host_row(ctx, FUNCTIONAL_LABEL, "f32", lambda: ops.cumsum(x, 1))
    try:
        import baracuda_numba.torch as bt

        host_row(ctx, "cumsum: baracuda_numba.torch.cumsum (torch.library custom op)", "f32",
                 lambda: bt.cumsum(x, 1), calls=3000)
    except Exception as exc:  # noqa: BLE001 - report, don't fail the benchmark
        ctx.notes.append(f"torch custom op not measured: {exc}")
    host_row(ctx, "cumsum: torch.cumsum(x, 1)", "f32", lambda: torch.cumsum(x, 1))
    red = bn.ReducePlan.select(bn.ReduceDescriptor(bn.ReduceKind.SUM, (4, 64), 1,
                                                   bn.ElementKind.F32), plain)
    y1 = torch.empty(4, 1, device="cuda")
    host_row(ctx, REDUCE_PLAN_LABEL, "f32", lambda: red.run(bn.ReduceArgs(x, y1)))
    host_row(ctx, REDUCE_FUNCTIONAL_LABEL, "f32", lambda: ops.sum(x, 1, keepdim=True))
    host_row(ctx, "sum: torch.sum(x, 1, keepdim=True)", "f32",
             lambda: torch.sum(x, 1, keepdim=True))


def _breakdown(ctx, torch):
    """Where a WriteSlice run's host time goes (torch tensors, kernel path)."""
    from baracuda_numba.arrays import as_mut, as_ref, layout_signature
    from baracuda_numba.driver import libcuda
    from baracuda_numba.streams import stream_handle

    E = bn.ElementKind
    dest = torch.randn(4, 8, 16, device="cuda").half()
    source = torch.randn(4, 2, 8, device="cuda").half()
    plan = bn.WriteSlicePlan.select(bn.WriteSliceDescriptor((4, 8, 16), (4, 2, 8),
                                                            ((0, 4), (3, 5), (4, 12)), E.F16))
    args = bn.WriteSliceArgs(dest, source)
    plan.run(args)
    bound = plan.bound_launch(args)
    ptr_d, ptr_s = dest.data_ptr(), source.data_ptr()
    kernel = bound.kernel
    per_param = BoundLaunch(kernel, bound.grid, bound.block, bound.args, 0, packed=False)
    launch = libcuda().cuLaunchKernel
    current = torch.cuda.current_stream()
    rows = [
        ("  breakdown: torch tensor attribute reads (is_cuda, dtype, data_ptr, shape, stride)",
         lambda: (dest.is_cuda, dest.dtype, dest.data_ptr(), dest.shape, dest.stride())),
        ("  breakdown: as_ref(torch tensor)",
         lambda: as_ref(source, "P", "x", E.F16, (4, 2, 8))),
        ("  breakdown: as_mut(torch tensor)",
         lambda: as_mut(dest, "P", "x", E.F16, (4, 8, 16))),
        ("  breakdown: plan.can_implement(args)", lambda: plan.can_implement(args)),
        ("  breakdown: WriteSliceArgs(dest, source)", lambda: bn.WriteSliceArgs(dest, source)),
        ("  breakdown: stream_handle(torch stream)", lambda: stream_handle(current)),
        ("  breakdown: bound launch, one parameter buffer (default)",
         lambda: bound(0, ptr_d, ptr_s)),
        ("  breakdown: bound launch, one pointer per parameter",
         lambda: per_param(0, ptr_d, ptr_s)),
        ("  breakdown: bare ctypes cuLaunchKernel with the parameter buffer",
         lambda: launch(kernel.function, 1, 1, 1, 32, 1, 1, 0, 0, None, bound.extra)),
        ("  breakdown: layout_signature((dest, source)) (memo key)",
         lambda: layout_signature((dest, source))),
        ("  breakdown: plan.run(args)", lambda: plan.run(args)),
    ]
    for label, fn in rows:
        host_row(ctx, label, "f16", fn, calls=5000)
    return lambda: ctx.row("  device time of that WriteSlice kernel (CUDA events)", "f16",
                           ctx.time_gpu(lambda i: plan.run(args)))
