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
