"""Where the host time of a memo-hit ``run`` goes, piece by piece (GPU only; a probe).

Times (best of 5 loops of 20,000 calls, then one synchronise) the pieces of
``WriteSlicePlan.run`` and ``ReducePlan.run`` with torch tensors, and variants of the
launch wrapper around ``cuda.bindings.driver.cuLaunchKernel``.
"""

from __future__ import annotations

import ctypes
import threading

import torch
from probe_launch import timeit  # scripts/ is on sys.path when run as a script

import baracuda_numba as bn
import baracuda_numba.ops as ops
from baracuda_numba.arrays import layout_signature
from baracuda_numba.streams import stream_handle


def main():
    E = bn.ElementKind
    x = torch.zeros(32, device="cuda")
    timeit("torch x.add_(1.0)", lambda: x.add_(1.0))
    desc = bn.WriteSliceDescriptor((4, 8, 16), (4, 2, 8), ((0, 4), (3, 5), (4, 12)), E.F32)
    ws = bn.WriteSlicePlan.select(desc, bn.PlanPreference())
    ws.force_kernel = True
    dest = torch.zeros((4, 8, 16), device="cuda")
    source = torch.zeros((4, 2, 8), device="cuda")
    args = bn.WriteSliceArgs(dest, source)
    ws.run(args)
    timeit("WriteSlicePlan.run(args) (kernel path)", lambda: ws.run(args))
    timeit("WriteSliceArgs(dest, source)", lambda: bn.WriteSliceArgs(dest, source))
    timeit("layout_signature((dest, source))", lambda: layout_signature((dest, source)))
    timeit("stream_handle(None)", lambda: stream_handle(None))
    sig = layout_signature((dest, source))
    timeit("hash((signature key, False))", lambda: hash((sig[0], False)))
    timeit("memo lookup (LayoutMemo.lookup)", lambda: ws._memo.lookup((dest, source), False))
    timeit("WriteSlicePlan.run(args) again", lambda: ws.run(args))
    timeit("x.add_(1.0) again", lambda: x.add_(1.0))
    launch = next(iter(ws._memo._entries.values()))[0]
    pd, ps = dest.data_ptr(), source.data_ptr()
    timeit("memo launch(0, pd, ps)", lambda: launch(0, pd, ps))
    bound = launch if not hasattr(launch, "__closure__") or launch.__closure__ is None \
        else None
    bound = next(iter(ws._launches.values()))
    timeit("BoundLaunch(0, pd, ps)", lambda: bound(0, pd, ps))
    fast = bound.fast
    timeit("BoundLaunch.fast(0, pd, ps)", lambda: fast(0, pd, ps))
    from cuda.bindings import driver as d

    call = d.cuLaunchKernel
    fn = d.CUfunction(bound._kernel._function)
    (gx, gy, gz), (bx, by, bz) = bound._grid, bound._block
    sh, extra = bound._shared, bound._extra
    timeit("bindings cuLaunchKernel only", lambda: call(fn, gx, gy, gz, bx, by, bz, sh, 0, 0,
                                                         extra))
    stream_obj = d.CUstream(0)
    timeit("bindings cuLaunchKernel, stream as a CUstream object",
           lambda: call(fn, gx, gy, gz, bx, by, bz, sh, stream_obj, 0, extra))
    timeit("bindings cuLaunchKernel, kernelParams None",
           lambda: call(fn, gx, gy, gz, bx, by, bz, sh, 0, None, extra))
    timeit("d.CUstream(0) construction", lambda: d.CUstream(0))
    try:
        from cupy.cuda import driver as cupy_driver
    except ImportError:
        cupy_driver = None
    if cupy_driver is not None:  # CuPy's Cython wrapper: typed intptr_t arguments
        raw_fn = int(fn)
        launch_kernel = cupy_driver.launchKernel
        timeit("cupy.cuda.driver.launchKernel (typed Cython wrapper)",
               lambda: launch_kernel(raw_fn, gx, gy, gz, bx, by, bz, sh, 0, 0, extra))
    slots = bound._pointer_slots
    lock = threading.Lock()

    def v_nolock(stream, a, b):
        slots[0].value = a
        slots[1].value = b
        code = call(fn, gx, gy, gz, bx, by, bz, sh, stream, 0, extra)[0]
        if code:
            raise RuntimeError(code)

    timeit("closure: slots + call, no lock", lambda: v_nolock(0, pd, ps))

    def v_lock(stream, a, b):
        with lock:
            slots[0].value = a
            slots[1].value = b
            code = call(fn, gx, gy, gz, bx, by, bz, sh, stream, 0, extra)[0]
        if code:
            raise RuntimeError(code)

    timeit("closure: lock + slots + call", lambda: v_lock(0, pd, ps))
    buf = bound._keepalive[0]
    view = memoryview(buf).cast("B").cast("Q")
    offsets = [ctypes.addressof(s) - ctypes.addressof(buf) for s in slots]
    i0, i1 = offsets[0] // 8, offsets[1] // 8
    acquire, release = lock.acquire, lock.release

    def v_view(stream, a, b):
        acquire()
        view[i0] = a
        view[i1] = b
        code = call(fn, gx, gy, gz, bx, by, bz, sh, stream, 0, extra)[0]
        release()
        if code:
            raise RuntimeError(code)

    timeit("closure: acquire + memoryview + call + release", lambda: v_view(0, pd, ps))
    success = d.CUresult.CUDA_SUCCESS

    def v_view_is(stream, a, b):
        acquire()
        view[i0] = a
        view[i1] = b
        code = call(fn, gx, gy, gz, bx, by, bz, sh, stream, 0, extra)[0]
        release()
        if code is not success:
            raise RuntimeError(code)

    timeit("closure: as above, 'is not success'", lambda: v_view_is(0, pd, ps))
    timeit("lock acquire+release", lambda: (acquire(), release()))
    timeit("two memoryview writes", lambda: (view.__setitem__(i0, pd),
                                             view.__setitem__(i1, ps)))
    s0, s1 = slots

    def w():
        s0.value = pd
        s1.value = ps

    timeit("two c_uint64.value writes", w)
    timeit("dest.data_ptr()", dest.data_ptr)
    timeit("dest.shape", lambda: dest.shape)
    timeit("dest.stride()", dest.stride)
    timeit("dest.is_cuda", lambda: dest.is_cuda)
    timeit("dest.dtype", lambda: dest.dtype)
    timeit("type(dest) is Tensor", lambda: type(dest) is torch.Tensor)
    # the reduce plan (2 arrays, LayoutMemo)
    rdesc = bn.ReduceDescriptor(bn.ReduceKind.SUM, (4, 64), 1, E.F32)
    red = bn.ReducePlan.select(rdesc)
    rx, ry = torch.zeros((4, 64), device="cuda"), torch.zeros((4, 1), device="cuda")
    rargs = bn.ReduceArgs(rx, ry)
    red.run(rargs)
    timeit("ReducePlan.run(args) sum", lambda: red.run(rargs))
    timeit("ops.sum(rx, 1, keepdim=True)", lambda: ops.sum(rx, 1, keepdim=True))
    timeit("torch.sum(rx, 1, keepdim=True)", lambda: torch.sum(rx, 1, keepdim=True))
    timeit("torch.empty((4, 1), dtype, device)",
           lambda: torch.empty((4, 1), dtype=torch.float32, device=rx.device))
    timeit("torch.empty(4, 1, dtype, device)",
           lambda: torch.empty(4, 1, dtype=torch.float32, device=rx.device))
    timeit("torch.empty_like(rx)", lambda: torch.empty_like(rx))
    raw = torch._C._cuda_getCurrentRawStream
    timeit("torch._C._cuda_getCurrentRawStream(0)", lambda: raw(0))
    timeit("torch.cuda.current_stream().cuda_stream",
           lambda: torch.cuda.current_stream().cuda_stream)
    # device throughput of back-to-back empty-ish launches (is the loop device-bound?)
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(2_000_000)
    s.record()
    for _ in range(1000):
        bound(0, pd, ps)
    e.record()
    torch.cuda.synchronize()
    print(f"device time per WriteSlice launch, 1000 queued behind a spin: "
          f"{s.elapsed_time(e):.3f} us", flush=True)
    torch.cuda._sleep(2_000_000)
    s.record()
    for _ in range(1000):
        x.add_(1.0)
    e.record()
    torch.cuda.synchronize()
    print(f"device time per x.add_, 1000 queued behind a spin: {s.elapsed_time(e):.3f} us",
          flush=True)


if __name__ == "__main__":
    main()
