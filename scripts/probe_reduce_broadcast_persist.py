"""Probe (GPU): the Mean gradient along rows (a store-only broadcast) as a persistent grid:
resident blocks (blocks a SM x threads a block), a grid stride over dx's 16-byte units, U
units an iteration, with (pf1) or without (pf0) the next iteration's dy loaded before this
iteration's stores; against the plan's one-shot ``reduce_backward_broadcast`` and torch's
``fill_`` in the same rounds, bits compared with the plan's.

    PYTHONPATH=scripts python scripts/probe_reduce_broadcast_persist.py [rounds]

H200, 2026-11-29 (docs/notes/reduce.md, thirty-third pass): no variant beat the plan.
"""
from __future__ import annotations

import functools
import sys

import torch
from bench import Context, measure_copy_gbps
from numba import cuda, int64, uint64
from probe_reduce_broadcast import _coefficient, _same_bits

from baracuda_numba import ReduceBackwardArgs, ReduceBackwardDescriptor, ReduceBackwardPlan
from baracuda_numba.kernels.common import div_f64, store16_words
from baracuda_numba.kernels.reduce import ELEMENTS, VECTOR
from baracuda_numba.types import ElementKind, ReduceKind


@functools.cache
def make(element, U, prefetch):
    vec = VECTOR[element]
    ACC, pack = ELEMENTS[element].acc, vec.pack
    W = vec.width
    coef = _coefficient(element, ReduceKind.MEAN)

    @cuda.jit(device=True, inline=True)
    def word_of(dy, u, line_units, inverse, param, values):
        o = div_f64(u, line_units, inverse)
        c = coef(dy, o, param)
        for e in range(W):
            values[e] = c
        return pack(values)

    @cuda.jit
    def kernel(dy, dxq, units, line_units, inverse, param):
        T = int64(cuda.gridDim.x) * int64(cuda.blockDim.x)
        u = int64(cuda.blockIdx.x) * int64(cuda.blockDim.x) + int64(cuda.threadIdx.x)
        values = cuda.local.array(W, ACC)
        words = cuda.local.array(U, uint64)
        nxt = cuda.local.array(U, uint64)
        if prefetch:
            for k in range(U):
                v = u + k * T
                if v < units:
                    words[k] = word_of(dy, v, line_units, inverse, param, values)
        while u < units:
            if prefetch:
                for k in range(U):
                    v = u + (U + k) * T
                    if v < units:
                        nxt[k] = word_of(dy, v, line_units, inverse, param, values)
            else:
                for k in range(U):
                    v = u + k * T
                    if v < units:
                        words[k] = word_of(dy, v, line_units, inverse, param, values)
            for k in range(U):
                v = u + k * T
                if v < units:
                    store16_words(dxq, uint64(v * 4), words[k], words[k])
            if prefetch:
                for k in range(U):
                    words[k] = nxt[k]
            u += U * T

    return kernel


CASES = [("bfloat16", (1_000_000, 64)), ("float32", (1_000_000, 64)),
         ("bfloat16", (4096, 4096)), ("float32", (4096, 4096)),
         ("bfloat16", (256, 1_000_000))]


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    ctx = Context("persist", torch)
    ctx.copy_gbps = measure_copy_gbps(torch)
    print(f"copy {ctx.copy_gbps:.0f} GB/s, {torch.cuda.get_device_name()}", flush=True)
    variants = [(bps, blk, U, pf) for bps in (4, 8, 16) for blk in (128, 256)
                for U in (1, 2) for pf in (0, 1) if bps * blk <= 2048]
    for dtype_name, shape in CASES:
        dtype = getattr(torch, dtype_name)
        element = ElementKind.BF16 if dtype_name == "bfloat16" else ElementKind.F32
        nbytes = shape[0] * shape[1] * dtype.itemsize
        sets = 2
        dys = [torch.randn((shape[0], 1), device="cuda").to(dtype) for _ in range(sets)]
        dxs = [torch.empty(shape, device="cuda", dtype=dtype) for _ in range(sets)]
        plan = ReduceBackwardPlan.select(ReduceBackwardDescriptor(ReduceKind.MEAN, shape, 1,
                                                                  element))
        refs = []
        for i in range(sets):
            plan.run(ReduceBackwardArgs(dys[i], dxs[i]))
            refs.append(dxs[i].clone())
        fns = [lambda i, plan=plan, dys=dys, dxs=dxs: plan.run(ReduceBackwardArgs(dys[i],
                                                                                  dxs[i])),
               lambda i, dxs=dxs: dxs[i].fill_(1.5)]
        names = ["plan Mean", "torch fill_"]
        if dtype_name == "bfloat16":
            dyv = [cuda.as_cuda_array(d.view(torch.int16).view(-1)).view("u2") for d in dys]
        else:
            dyv = [cuda.as_cuda_array(d.view(-1)) for d in dys]
        views = [cuda.as_cuda_array(d.view(torch.int32).view(-1)) for d in dxs]
        units = nbytes // 16
        line = shape[1] * dtype.itemsize // 16
        for bps, blk, U, pf in variants:
            kernel = make(element, U, bool(pf))
            grid = min(132 * bps, -(-units // blk))
            bound = kernel[grid, blk]
            args = (units, line, 1.0 / line, float(shape[1]))

            def run(i, bound=bound, args=args, dyv=dyv, views=views):
                bound(dyv[i], views[i], *args)

            same = _same_bits(run, dxs, refs)
            fns.append(run)
            names.append(f"persist {bps}x{blk} U{U} pf{pf}{'' if same else ' BITS DIFFER'}")
        label = f"{dtype_name} {list(shape)} axis 1"
        for r in range(rounds):
            times = ctx.time_gpu_many(fns, sets=sets)
            for name, us in zip(names, times):
                print(f"{label} r{r}: {name}: {us:.2f} us "
                      f"({(nbytes + shape[0] * dtype.itemsize) / us / 1e3 / ctx.copy_gbps:.0%})",
                      flush=True)
        del dys, dxs, views, dyv
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
