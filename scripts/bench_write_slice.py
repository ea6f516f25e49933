"""WriteSlice benchmarks: decode-step KV append and prefill write, vs torch ``copy_``.

Bytes moved = 2 x source bytes (read source, write the window of dest).
"""

from __future__ import annotations

from baracuda_numba import (
    BackendKind,
    ElementKind,
    PlanPreference,
    WriteSliceArgs,
    WriteSliceDescriptor,
    WriteSlicePlan,
)

DRIVER_2D = PlanPreference(prefer_backend=BackendKind.DRIVER_COPY)

DTYPES = ("float16", "bfloat16", "float32")


def _decode(ctx, dtype_name: str) -> None:
    torch = ctx.torch
    dtype = getattr(torch, dtype_name)
    element = ElementKind.from_dtype(dtype)
    # Decode append: one position of a [8, 32, 4096, 128] cache.
    cache = torch.randn(8, 32, 4096, 128, device="cuda").to(dtype)
    steps = [torch.randn(8, 32, 1, 128, device="cuda").to(dtype) for _ in range(4)]
    pos = 1234
    desc = WriteSliceDescriptor(
        (8, 32, 4096, 128), (8, 32, 1, 128), ((0, 8), (0, 32), (pos, pos + 1), (0, 128)),
        element)
    plan = WriteSlicePlan.select(desc)
    plan_2d = WriteSlicePlan.select(desc, DRIVER_2D)
    args = [WriteSliceArgs(cache, s) for s in steps]
    moved = 2 * steps[0].numel() * steps[0].element_size()
    ours = ctx.time_gpu(lambda i: plan.run(args[i]), sets=4)
    theirs = ctx.time_gpu(lambda i: cache[:, :, pos:pos + 1].copy_(steps[i]), sets=4)
    ctx.row("decode append [8,32,4096,128] pos 1234 (row kernel)", dtype_name, ours, moved,
            theirs)
    ours_2d = ctx.time_gpu(lambda i: plan_2d.run(args[i]), sets=4)
    ctx.row("decode append, cuMemcpy2D (prefer DRIVER_COPY)", dtype_name, ours_2d, moved,
            theirs)
    host_ours = ctx.time_host(lambda: plan.run(WriteSliceArgs(cache, steps[0])))
    host_torch = ctx.time_host(lambda: cache[:, :, pos:pos + 1].copy_(steps[0]))
    ctx.row("decode append: host µs per call (plan.run incl. args vs torch slice+copy_)",
            dtype_name, host_ours, None, host_torch)


def _prefill(ctx, dtype_name: str) -> None:
    torch = ctx.torch
    dtype = getattr(torch, dtype_name)
    element = ElementKind.from_dtype(dtype)
    # Prefill: rows 0:1024 of a [64, 32, 4096, 128] cache.
    dest = torch.empty(64, 32, 4096, 128, device="cuda", dtype=dtype)
    dest.view(torch.int16 if dtype.itemsize == 2 else torch.int32).random_(-1000, 1000)
    source = torch.randn(64, 32, 1024, 128, device="cuda").to(dtype)
    desc = WriteSliceDescriptor(
        (64, 32, 4096, 128), (64, 32, 1024, 128), ((0, 64), (0, 32), (0, 1024), (0, 128)),
        element)
    plan = WriteSlicePlan.select(desc)
    plan_2d = WriteSlicePlan.select(desc, DRIVER_2D)
    moved = 2 * source.numel() * source.element_size()
    arg = WriteSliceArgs(dest, source)
    theirs = ctx.time_gpu(lambda i: dest[:, :, 0:1024].copy_(source), iters=20)
    ours = ctx.time_gpu(lambda i: plan.run(arg), iters=20)
    ctx.row("prefill [64,32,4096,128] rows 0:1024 (row kernel)", dtype_name, ours, moved,
            theirs)
    ours_2d = ctx.time_gpu(lambda i: plan_2d.run(arg), iters=20)
    ctx.row("prefill, cuMemcpy2D (prefer DRIVER_COPY)", dtype_name, ours_2d, moved, theirs)


def bench(ctx) -> None:
    for dtype_name in DTYPES:
        _decode(ctx, dtype_name)
        _prefill(ctx, dtype_name)
        ctx.torch.cuda.empty_cache()
    ctx.notes.append("decode/prefill device times are medians of CUDA-event-timed single "
                     "calls; the decode cache is 1-2 GiB so the window is never L2-resident "
                     "across the 4 rotated sources.")
