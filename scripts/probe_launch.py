"""Host cost of the ways to call cuLaunchKernel from Python (GPU only; a probe)."""

from __future__ import annotations

import ctypes
import ctypes.util
import time

import torch
from numba import cuda, types

from baracuda_numba.driver import launch_kernel, libcuda
from baracuda_numba.launch import Kernel, flat


def empty(a, b, n):
    i = cuda.grid(1)
    if i < n:
        b[i] = a[i]


def timeit(label, fn, n=20000, reps=5):
    for _ in range(200):
        fn()
    torch.cuda.synchronize()
    best = 1e9
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t0) / n * 1e6)
    print(f"{label:60s} {best:7.2f} us/call", flush=True)
    return best


def main():
    x = torch.zeros(32, device="cuda")
    y = torch.zeros(32, device="cuda")
    stream = torch.cuda.current_stream().cuda_stream
    k = Kernel("probe_empty", empty, (flat(types.float32), flat(types.float32), types.int64),
               register=False)
    k.prepare()
    bound = k.bind(1, 32, ((0, 32), (0, 32), 32))
    func = k._function
    extra = bound._extra
    px, py = x.data_ptr(), y.data_ptr()
    timeit("torch x.add_(1.0)", lambda: x.add_(1.0))
    timeit("bound(stream, px, py)  [current path]", lambda: bound(stream, px, py))
    timeit("driver.launch_kernel (ctypes, argtypes)",
           lambda: launch_kernel(func, (1, 1, 1), (32, 1, 1), 0, stream, None, extra))
    f = libcuda().cuLaunchKernel
    timeit("lib.cuLaunchKernel local (argtypes)",
           lambda: f(func, 1, 1, 1, 32, 1, 1, 0, stream, None, extra))
    name = ctypes.util.find_library("cuda") or "libcuda.so.1"
    raw = ctypes.CDLL(name).cuLaunchKernel
    cf, cs, ce = ctypes.c_void_p(func), ctypes.c_void_p(stream), ctypes.c_void_p(extra)
    timeit("CDLL no argtypes, prebuilt c_void_p",
           lambda: raw(cf, 1, 1, 1, 32, 1, 1, 0, cs, None, ce))
    praw = ctypes.PyDLL(name).cuLaunchKernel
    timeit("PyDLL (GIL held) no argtypes, prebuilt c_void_p",
           lambda: praw(cf, 1, 1, 1, 32, 1, 1, 0, cs, None, ce))
    pa = ctypes.PyDLL(name).cuLaunchKernel
    pa.argtypes = f.argtypes
    timeit("PyDLL (GIL held) with argtypes, ints",
           lambda: pa(func, 1, 1, 1, 32, 1, 1, 0, stream, None, extra))
    try:
        from cuda.bindings import driver as d
        dfun = d.CUfunction(func)
        dstream = d.CUstream(stream)
        timeit("cuda.bindings cuLaunchKernel (extra=int)",
               lambda: d.cuLaunchKernel(dfun, 1, 1, 1, 32, 1, 1, 0, dstream, 0, extra))
        timeit("cuda.bindings cuLaunchKernel (stream int)",
               lambda: d.cuLaunchKernel(dfun, 1, 1, 1, 32, 1, 1, 0, stream, 0, extra))
    except Exception as exc:  # noqa: BLE001
        print("cuda.bindings failed:", repr(exc))
    slots = bound._pointer_slots

    def write():
        slots[0].value = px
        slots[1].value = py

    timeit("two pointer writes (c_uint64.value)", write, n=100000)
    timeit("x.data_ptr(); x.shape; x.stride(); x.dtype; x.is_cuda",
           lambda: (x.data_ptr(), x.shape, x.stride(), x.dtype, x.is_cuda), n=100000)
    # Device time of the empty launch (to see whether loops were device-bound).
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(200000)
    s.record()
    for _ in range(1000):
        bound(stream, px, py)
    e.record()
    torch.cuda.synchronize()
    print(f"device time per empty launch (1000 queued behind a spin): "
          f"{s.elapsed_time(e):.3f} us", flush=True)


if __name__ == "__main__":
    main()
