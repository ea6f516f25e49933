"""Benchmark section ``fractional_max_pool``: forward and backward, 2-D and 3-D, f32/bf16,
against torch.nn.functional.fractional_max_pool{2,3}d (forward, given samples) and
aten's fractional_max_pool{2,3}d_backward (atomics; includes zeroing grad_input).

Bytes counted as the minimum traffic: forward x + y + indices (i64), backward
dy + indices + dx. The plain rows use the default (fast, contiguous) kernels.
``FMP_TUNE=1`` adds the looped fast forward window walk, other run lengths, the tiled
backward's other shared-memory budgets and block size, the leader-scatter backward, the
general (any-stride, 64-bit, gather-backward) kernels on the same arrays, and the zero fill
alone.
"""

from __future__ import annotations

import os

import numpy as np

from baracuda_numba.plans import fractional_max_pool as fmp
from baracuda_numba.types import ElementKind

# (label, input shape, windows, output shape)
CASES = [
    ("2d [32,64,128,128]->91x91 k3", (32, 64, 128, 128), (3, 3), (91, 91)),
    ("3d [8,32,32,64,64]->22x45x45 k3", (8, 32, 32, 64, 64), (3, 3, 3), (22, 45, 45)),
]
DTYPES = ("float32", "bfloat16")


def _plan(shape_in, windows, shape_out, element, placement):
    batch, channels = shape_in[:2]
    if len(shape_in) == 4:
        desc = fmp.FractionalMaxPool2dDescriptor.new(batch, channels, *shape_in[2:], *windows,
                                                     *shape_out, element)
        made = (fmp.FractionalMaxPool2dPlan.select(desc.with_placement(placement)),
                fmp.FractionalMaxPool2dFwArgs, fmp.FractionalMaxPool2dBwArgs)
    else:
        desc = fmp.FractionalMaxPool3dDescriptor.new(batch, channels, *shape_in[2:], *windows,
                                                     *shape_out, element)
        made = (fmp.FractionalMaxPool3dPlan.select(desc.with_placement(placement)),
                fmp.FractionalMaxPool3dFwArgs, fmp.FractionalMaxPool3dBwArgs)
    return made


def _bench_one(ctx, label, shape_in, windows, shape_out, dtype_name, tune,
               tune_bw_only=False) -> None:
    torch = ctx.torch
    functional = torch.nn.functional
    rank = len(shape_out)
    batch, channels = shape_in[:2]
    full_out = (batch, channels) + shape_out
    pool = functional.fractional_max_pool2d if rank == 2 else functional.fractional_max_pool3d
    pool_bw = torch.ops.aten.fractional_max_pool2d_backward if rank == 2 else \
        torch.ops.aten.fractional_max_pool3d_backward
    dtype = getattr(torch, dtype_name)
    element = ElementKind.from_dtype(dtype_name)
    item = torch.tensor([], dtype=dtype).element_size()
    n_in, n_out = int(np.prod(shape_in)), int(np.prod(full_out))
    fw_bytes = n_in * item + n_out * item + n_out * 8
    bw_bytes = n_out * item + n_out * 8 + n_in * item
    sets = ctx.sets_for(fw_bytes)
    xs = [torch.randn(shape_in, device="cuda", dtype=dtype) for _ in range(sets)]
    dys = [torch.randn(full_out, device="cuda", dtype=dtype) for _ in range(sets)]
    torch_samples = torch.rand(batch, channels, rank, device="cuda", dtype=dtype)
    ours_torch_order = torch_samples.float()
    if rank == 2:
        ours_torch_order = ours_torch_order.flip(-1).contiguous()  # torch: (w, h)
    samples = torch.rand(batch, channels, rank, device="cuda")
    y = torch.empty(full_out, device="cuda", dtype=dtype)
    idx = torch.empty(full_out, device="cuda", dtype=torch.int64)
    dx = torch.empty(shape_in, device="cuda", dtype=dtype)

    def torch_fw(i):
        return pool(xs[i], windows, output_size=shape_out, return_indices=True,
                    _random_samples=torch_samples)

    y_ref, idx_ref = torch_fw(0)
    torch_fw_us = ctx.time_gpu(torch_fw, sets)
    torch_bw_us = ctx.time_gpu(lambda i: pool_bw(dys[i], xs[i], windows, shape_out, idx_ref),
                               sets)

    # BARACUDA placement (the default)
    plan, fw_args, bw_args = _plan(shape_in, windows, shape_out, element,
                                   fmp.FractionalPlacement.BARACUDA)
    fw = [fw_args(x, y, idx, samples) for x in xs]
    us = ctx.time_gpu(lambda i: plan.run_fw(fw[i]), sets)
    ctx.row(f"{label} fw", dtype_name, us, fw_bytes, torch_fw_us, f"{plan.forward_walk} walk")
    bw = [bw_args(dy, idx, dx) for dy in dys]
    us = ctx.time_gpu(lambda i: plan.run_bw(bw[i]), sets)
    ctx.row(f"{label} bw", dtype_name, us, bw_bytes, torch_bw_us, _bw_note(plan))

    # TORCH placement: the same windows as torch (checked before timing)
    plan_t, _, _ = _plan(shape_in, windows, shape_out, element, fmp.FractionalPlacement.TORCH)
    fw_t = [fw_args(x, y, idx, ours_torch_order) for x in xs]
    plan_t.run_fw(fw_t[0])
    plane = int(np.prod(shape_in[2:]))
    offsets = torch.arange(batch * channels, device="cuda").reshape(
        (batch, channels) + (1,) * rank) * plane
    same = torch.equal(y, y_ref) and torch.equal(idx - offsets, idx_ref)
    us = ctx.time_gpu(lambda i: plan_t.run_fw(fw_t[i]), sets)
    ctx.row(f"{label} fw TORCH placement", dtype_name, us, fw_bytes, torch_fw_us,
            "matches torch" if same else "MISMATCH vs torch")
    plan_t.run_fw(fw_t[0])  # indices of xs[0] again (timing rotated the inputs)
    plan_t.run_bw(bw[0])
    dx_ref = pool_bw(dys[0], xs[0], windows, shape_out, idx_ref)
    # torch sums half gradients in the half type (atomics), ours in f32: allow a few of
    # the half type's roundings (the same bound as tests/test_fractional_max_pool.py)
    tol = {"float32": 2e-6, "bfloat16": 3.2e-2}[dtype_name]
    close = torch.allclose(dx.float(), dx_ref.float(), rtol=tol, atol=tol)
    us = ctx.time_gpu(lambda i: plan_t.run_bw(bw[i]), sets)
    ctx.row(f"{label} bw TORCH placement", dtype_name, us, bw_bytes, torch_bw_us,
            "matches torch" if close else "MISMATCH vs torch")

    if tune_bw_only and plan.tile_shape() is not None:
        _tune_tiled_backward(ctx, plan, bw, sets, label, dtype_name, bw_bytes, torch_bw_us)
    if tune:  # variants of the same computation, for the notes
        default_walk = plan.forward_walk
        for walk in ("rows32", "looped"):
            if walk == default_walk or walk not in plan.forward_walks:
                continue
            plan.forward_walk = walk
            us = ctx.time_gpu(lambda i: plan.run_fw(fw[i]), sets)
            ctx.row(f"{label} fw {walk} window", dtype_name, us, fw_bytes, torch_fw_us,
                    "tuning", tuning=True)
        plan.forward_walk = default_walk
        for rows in (8, 32):
            plan.rows_per_thread = rows
            us = ctx.time_gpu(lambda i: plan.run_fw(fw[i]), sets)
            ctx.row(f"{label} fw {default_walk} {rows} rows/thread", dtype_name, us, fw_bytes,
                    torch_fw_us, "tuning", tuning=True)
        plan.rows_per_thread = None
        if plan.tile_shape() is not None:
            _tune_tiled_backward(ctx, plan, bw, sets, label, dtype_name, bw_bytes,
                                 torch_bw_us)
            plan.tiled_backward = False
            us = ctx.time_gpu(lambda i: plan.run_bw(bw[i]), sets)
            ctx.row(f"{label} bw leader scatter", dtype_name, us, bw_bytes, torch_bw_us,
                    "tuning; " + _bw_note(plan), tuning=True)
            plan.tiled_backward = True
        plan.fast = False
        us = ctx.time_gpu(lambda i: plan.run_fw(fw[i]), sets)
        ctx.row(f"{label} fw general kernel", dtype_name, us, fw_bytes, torch_fw_us,
                "any strides, 64-bit", tuning=True)
        us = ctx.time_gpu(lambda i: plan.run_bw(bw[i]), sets)
        ctx.row(f"{label} bw general kernel", dtype_name, us, bw_bytes, torch_bw_us,
                "gather, any strides, 64-bit", tuning=True)
        plan.fast = True
        us = ctx.time_gpu(lambda i: dx.zero_(), sets)
        ctx.row(f"{label} dx zero fill alone (torch)", dtype_name, us, n_in * item, None,
                "part of the leader-scatter bw", tuning=True)


def _tune_tiled_backward(ctx, plan, bw, sets, label, dtype_name, bw_bytes, torch_bw_us):
    """The tiled backward's variants: the listed kernel's dynamic shared-memory budgets
    (``FMP_LISTED_KIB``) and block sizes (all bit-identical: each variant's dx is checked
    against the default's here)."""
    torch = ctx.torch
    fields = ("listed_bytes", "tile_threads")
    defaults = tuple(getattr(plan, name) for name in fields)
    plan.run_bw(bw[0])
    bits = torch.int16 if bw[0].dx.element_size() == 2 else torch.int32
    expected = bw[0].dx.clone().view(bits)
    budgets = ([int(kib) * 1024 for kib in
                os.environ.get("FMP_LISTED_KIB", "48,56,64,72").split(",")]
               if plan.listed_backward else [defaults[0]])
    variants = [(budget, threads) for budget in budgets for threads in (256, 512)]
    for variant in variants:
        if variant == defaults:
            continue
        for name, value in zip(fields, variant):
            setattr(plan, name, value)
        bw[0].dx.fill_(float("nan"))
        plan.run_bw(bw[0])
        same = torch.equal(bw[0].dx.view(bits), expected)
        us = ctx.time_gpu(lambda i: plan.run_bw(bw[i]), sets)
        ctx.row(f"{label} bw variant", dtype_name, us, bw_bytes, torch_bw_us,
                "tuning; " + _bw_note(plan) + ("" if same else "; BITS DIFFER"), tuning=True)
    for name, value in zip(fields, defaults):
        setattr(plan, name, value)


def _bw_note(plan) -> str:
    tiles = plan.tile_shape()
    if tiles is None:
        return "deterministic; leader scatter, zero fill included"
    if plan.listed_backward:
        sums = f"listed sums in {plan.listed_bytes // 1024} KiB"
    else:
        sums = "per-element sums"
    return (f"deterministic; tiled {tiles[0]}x{tiles[1]} rows, {sums}, {plan.tile_threads} "
            "threads, no zero fill")


def bench(ctx) -> None:
    # tuning rows (written to the CSV results only) under --sweep or FMP_TUNE=1
    tune = getattr(ctx, "sweep", False) or os.environ.get("FMP_TUNE") == "1"
    # FMP_TUNE=bw: only the tiled backward's variants (and the plain rows)
    tune_bw_only = os.environ.get("FMP_TUNE") == "bw"
    for label, shape_in, windows, shape_out in CASES:
        for dtype_name in DTYPES:
            _bench_one(ctx, label, shape_in, windows, shape_out, dtype_name, tune,
                       tune_bw_only)
            ctx.torch.cuda.empty_cache()
    torch = ctx.torch

    # host overhead of one small call (validation + launch)
    plan, fw_args, _ = _plan((1, 1, 8, 8), (2, 2), (5, 5), ElementKind.F32,
                             fmp.FractionalPlacement.BARACUDA)
    x = torch.randn(1, 1, 8, 8, device="cuda")
    args = fw_args(x, torch.empty(1, 1, 5, 5, device="cuda"),
                   torch.empty(1, 1, 5, 5, device="cuda", dtype=torch.int64),
                   torch.rand(1, 1, 2, device="cuda"))
    host_us = ctx.time_host(lambda: plan.run_fw(args), calls=2000)
    ctx.notes.append(f"host time of one small run_fw call (checks + launch): {host_us:.1f} µs")
    ctx.notes.append("bytes: fw = x + y + i64 indices, bw = dy + i64 indices + dx; torch bw "
                     "is aten's atomic scatter including its zero fill of grad_input")
    ctx.notes.append("TORCH placement rows: the same windows as torch (checked before "
                     "timing); a bf16 \"MISMATCH\" is torch summing half gradients in the half "
                     "type with atomics against ours in f32, beyond the bench's loose check (the "
                     "GPU tests compare both with the exact float64 sum at torch's indices)")


def profile_once() -> None:
    """One forward and one backward launch (for ``ncu``): the 2-D bf16 case, or
    ``FMP_PROFILE="<case index>,<dtype>"`` (e.g. ``1,float32``: the 3-D f32 case)."""
    import torch

    case, dtype_name = os.environ.get("FMP_PROFILE", "0,bfloat16").split(",")
    shape_in, windows, shape_out = CASES[int(case)][1:]
    dtype = getattr(torch, dtype_name)
    plan, fw_args, bw_args = _plan(shape_in, windows, shape_out,
                                   ElementKind.from_dtype(dtype_name),
                                   fmp.FractionalPlacement.BARACUDA)
    full_out = shape_in[:2] + shape_out
    x = torch.randn(shape_in, device="cuda", dtype=dtype)
    y = torch.empty(full_out, device="cuda", dtype=dtype)
    idx = torch.empty(full_out, device="cuda", dtype=torch.int64)
    rank = len(shape_out)
    plan.run_fw(fw_args(x, y, idx, torch.rand(shape_in[0], shape_in[1], rank, device="cuda")))
    plan.run_bw(bw_args(torch.randn_like(y), idx, torch.empty_like(x)))
    torch.cuda.synchronize()


if __name__ == "__main__":
    profile_once()
