"""Host overhead (issue 3): µs of host time per ``plan.run`` at a tiny shape.

A loop of 10,000 calls timed by wall clock, then one synchronise; next to one PyTorch op,
a bare Numba-dispatcher launch of an empty kernel, and the same plan through the Numba
dispatcher path. Also: ``select`` time in a fresh process, cold (empty Numba cache) and
warm (kernel in Numba's on-disk cache).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

from numba import cuda

from baracuda_numba import ElementKind, WriteSliceArgs, WriteSliceDescriptor, WriteSlicePlan
from baracuda_numba.launch import set_launch_mode


@cuda.jit
def _empty(a, b):
    pass


def _plans(torch):
    """(name, tiny plan runner factory) for every plan family available."""
    out = []
    box = WriteSlicePlan.select(WriteSliceDescriptor((4, 8, 16), (4, 2, 8),
                                                     ((0, 4), (3, 5), (4, 12)), ElementKind.F16))

    def write_slice(dest, source):
        return lambda: box.run(WriteSliceArgs(dest, source))

    out.append(("WriteSlicePlan (kernel path, 2 arrays)", (4, 8, 16), (4, 2, 8), write_slice))
    return out


def _breakdown(ctx) -> None:
    """Where a WriteSlice run's host time goes (torch tensors, kernel path)."""
    from baracuda_numba.arrays import as_mut, as_ref
    from baracuda_numba.driver import libcuda
    from baracuda_numba.streams import stream_handle

    torch = ctx.torch
    dest = torch.randn(4, 8, 16, device="cuda").half()
    source = torch.randn(4, 2, 8, device="cuda").half()
    plan = WriteSlicePlan.select(WriteSliceDescriptor((4, 8, 16), (4, 2, 8),
                                                      ((0, 4), (3, 5), (4, 12)), ElementKind.F16))
    args = WriteSliceArgs(dest, source)
    plan.run(args)
    bound = next(iter(plan._launches.values()))
    ptr_d, ptr_s = dest.data_ptr(), source.data_ptr()
    kernel = bound._kernel
    fn = libcuda().cuLaunchKernel
    current = torch.cuda.current_stream()
    rows = [
        ("  breakdown: torch tensor attribute reads (is_cuda, dtype, data_ptr, shape, stride)",
         lambda: (dest.is_cuda, dest.dtype, dest.data_ptr(), dest.shape, dest.stride())),
        ("  breakdown: as_ref(torch tensor)", lambda: as_ref(source, "P", "x", ElementKind.F16,
                                                            (4, 2, 8))),
        ("  breakdown: as_mut(torch tensor)", lambda: as_mut(dest, "P", "x", ElementKind.F16,
                                                            (4, 8, 16))),
        ("  breakdown: plan.can_implement(args)", lambda: plan.can_implement(args)),
        ("  breakdown: WriteSliceArgs(dest, source)", lambda: WriteSliceArgs(dest, source)),
        ("  breakdown: stream_handle(torch stream)",
         lambda: stream_handle(current)),
        ("  breakdown: bound launch (pointers + cuLaunchKernel)", lambda: bound(0, ptr_d, ptr_s)),
        ("  breakdown: bare ctypes cuLaunchKernel", lambda: fn(
            kernel._function, 1, 1, 1, 32, 1, 1, 0, 0, bound._pointers_address, None)),
        ("  breakdown: plan.run(args)", lambda: plan.run(args)),
    ]
    for label, fn_ in rows:
        ctx.row(label, "f16", ctx.time_host(fn_, calls=5000))


SELECT_SNIPPET = r"""
import time
t0 = time.perf_counter()
from baracuda_numba import ElementKind, WriteSliceArgs, WriteSliceDescriptor, WriteSlicePlan
from numba import cuda
cuda.current_context()  # CUDA context creation is the process's cost, not select's
t1 = time.perf_counter()
WriteSlicePlan.select(WriteSliceDescriptor((4, 8, 16), (4, 2, 8), ((0, 4), (3, 5), (4, 12)),
                                           ElementKind.F16))
t2 = time.perf_counter()
print(f"{(t1 - t0) * 1e3:.1f} {(t2 - t1) * 1e3:.1f}")
"""


def bench(ctx) -> None:
    torch = ctx.torch
    x = torch.randn(64, device="cuda")
    ctx.row("one PyTorch op (x.add_(1.0)), torch tensor", "f32", ctx.time_host(lambda: x.add_(1.0)))
    a = torch.empty(16, device="cuda", dtype=torch.float16)
    b = torch.empty(16, device="cuda", dtype=torch.float16)
    _empty[1, 32](a, b)
    ctx.row("bare Numba dispatcher launch, empty kernel, 2 torch tensors", "f16",
            ctx.time_host(lambda: _empty[1, 32](a, b), calls=2000))
    try:
        import cupy as cp
    except ImportError:
        cp = None
    if cp is not None:
        ca, cb = cp.empty(16, cp.float16), cp.empty(16, cp.float16)
        _empty[1, 32](ca, cb)
        ctx.row("bare Numba dispatcher launch, empty kernel, 2 CuPy arrays", "f16",
                ctx.time_host(lambda: _empty[1, 32](ca, cb), calls=2000))
    for name, dest_shape, source_shape, factory in _plans(torch):
        dest = torch.randn(*dest_shape, device="cuda").half()
        source = torch.randn(*source_shape, device="cuda").half()
        ctx.row(f"{name}, torch tensors", "f16", ctx.time_host(factory(dest, source)))
        if cp is not None:
            cdest = cp.asarray(dest)
            csource = cp.asarray(source)
            ctx.row(f"{name}, CuPy arrays", "f16", ctx.time_host(factory(cdest, csource)))
        set_launch_mode("dispatcher")
        ctx.row(f"{name}, torch tensors, Numba dispatcher path", "f16",
                ctx.time_host(factory(dest, source), calls=2000))
        set_launch_mode("direct")
    _breakdown(ctx)
    with tempfile.TemporaryDirectory() as cache_dir:
        env = dict(os.environ, NUMBA_CACHE_DIR=cache_dir)
        for label in ("cold (empty Numba cache)", "warm (Numba disk cache)"):
            out = subprocess.run([sys.executable, "-c", SELECT_SNIPPET], env=env,
                                 capture_output=True, text=True, check=True).stdout.split()
            ctx.notes.append(f"fresh process, WriteSlicePlan.select {label}: import and "
                             f"context {out[0]} ms, select {out[1]} ms (compiles or loads "
                             "the 2- and 16-byte row kernels)")
    ctx.notes.append("host rows: µs per call, best of 3 loops of 10,000 calls (2,000 for the "
                     "dispatcher rows), wall clock then one synchronise; the µs column is "
                     "host time, not device time.")
