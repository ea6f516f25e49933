"""Probe (GPU): the store-only Sum / Mean gradient as a flat broadcast over a contiguous dx
(threads numbered along dx's memory, a thread's units a block apart, as torch's
elementwise kernels), against the plans' gradients and torch's ``fill_`` of the same bytes
in the same rounds.

    PYTHONPATH=scripts python scripts/probe_reduce_broadcast.py [rounds]

dx of shape (outer, extent, inner) in C order; unit ``u`` (8 or 16 bytes, ``K`` elements)
lies in slab ``o = u // (extent * inner / K)``; rows (inner = 1, extent % K = 0) give every
element of a unit ``dy[o]``, columns (inner % K = 0) give element ``j`` ``dy[o, n0 + j]``
with ``n0 = (u % (inner / K)) * K``. The divisions are an f64 multiply by the host's
reciprocal, corrected by one step. Each variant's dx is compared with the plan's.
"""

from __future__ import annotations

import functools
import os
import sys

import torch
from bench import Context, measure_copy_gbps
from numba import cuda, int64, uint32, uint64

from baracuda_numba import ReduceBackwardArgs, ReduceBackwardDescriptor, ReduceBackwardPlan
from baracuda_numba.kernels.common import div_f64, store16
from baracuda_numba.kernels.reduce import ELEMENTS, VECTOR, _grad_fns
from baracuda_numba.types import ElementKind, ReduceKind


def _coefficient(element: ElementKind, kind: ReduceKind):
    """``coef(dy, i, param)``: the gradient's value for ``dy[i]`` (Sum / Mean)."""
    spec = ELEMENTS[element]
    ACC, load = spec.acc, spec.load
    coefficient, element_fn = _grad_fns(kind, element)

    @cuda.jit(device=True, inline=True)
    def coef(dy, i, param):
        g = load(dy, i)
        return ACC(element_fn(ACC(coefficient(g, g, g, int64(0), param)), g, g, g))

    return coef


@functools.cache
def make(element: ElementKind, kind: ReduceKind, unit_bytes: int, per_thread: int,
         cols: bool):
    vec = VECTOR[element]
    ACC, pack = ELEMENTS[element].acc, vec.pack
    W = vec.width  # elements per 8-byte word
    WORDS = unit_bytes // 8
    K = W * WORDS
    U = per_thread

    coef = _coefficient(element, kind)

    @cuda.jit
    def kernel(dy, dxw, units, slab_units, inv_slab, row_units, inv_row, dy_so, dy_sn,
               param):
        block = int64(cuda.blockDim.x)
        first = int64(cuda.blockIdx.x) * block * U + int64(cuda.threadIdx.x)
        words = cuda.local.array((U, 2), uint64)
        values = cuda.local.array(4, ACC)
        for k in range(U):
            u = first + k * block
            if u < units:
                o = div_f64(u, slab_units, inv_slab)
                if cols:
                    r = u - o * slab_units
                    n0 = (r - div_f64(r, row_units, inv_row) * row_units) * K
                    at = o * dy_so + n0 * dy_sn
                    for h in range(WORDS):
                        for e in range(W):
                            values[e] = coef(dy, at + (h * W + e) * dy_sn, param)
                        words[k, h] = pack(values)
                else:
                    c = coef(dy, o * dy_so, param)
                    for e in range(W):
                        values[e] = c
                    w = pack(values)
                    for h in range(WORDS):
                        words[k, h] = w
        for k in range(U):
            u = first + k * block
            if u < units:
                if WORDS == 2:
                    store16(dxw, uint64(u * 4), (uint32(words[k, 0] & uint64(0xFFFFFFFF)),
                                                 uint32(words[k, 0] >> uint64(32)),
                                                 uint32(words[k, 1] & uint64(0xFFFFFFFF)),
                                                 uint32(words[k, 1] >> uint64(32))))
                else:
                    dxw[uint64(u)] = int64(words[k, 0])

    return kernel



@functools.cache
def make_cols(element: ElementKind, kind: ReduceKind, unit_bytes: int, unroll: int):
    """Columns (outer = 1, dy contiguous): threads numbered along dx's units with a grid
    stride ``T`` that is a multiple of the row's units, so thread ``g`` keeps column unit
    ``g % row_units``: its K coefficients once, then stores at g, g + T, ..."""
    vec = VECTOR[element]
    ACC, pack = ELEMENTS[element].acc, vec.pack
    W = vec.width
    WORDS = unit_bytes // 8
    U = unroll

    coef = _coefficient(element, kind)

    @cuda.jit
    def kernel(dy, dxw, units, row_units, stride, param):
        g = int64(cuda.blockIdx.x) * int64(cuda.blockDim.x) + int64(cuda.threadIdx.x)
        if g >= stride:
            return
        j = g % row_units
        words = cuda.local.array(2, uint64)
        values = cuda.local.array(4, ACC)
        for h in range(WORDS):
            for e in range(W):
                values[e] = coef(dy, (j * WORDS + h) * W + e, param)
            words[h] = pack(values)
        lo0 = uint32(words[0] & uint64(0xFFFFFFFF))
        hi0 = uint32(words[0] >> uint64(32))
        lo1 = uint32(words[1] & uint64(0xFFFFFFFF))
        hi1 = uint32(words[1] >> uint64(32))
        u = g
        while u < units:
            for k in range(U):
                v = u + k * stride
                if v < units:
                    if WORDS == 2:
                        store16(dxw, uint64(v * 4), (lo0, hi0, lo1, hi1))
                    else:
                        dxw[uint64(v)] = int64(words[0])
            u += U * stride

    return kernel

CASES = [  # (dtype, shape, axis)
    ("bfloat16", (1_000_000, 64), 1), ("float32", (1_000_000, 64), 1),
    ("bfloat16", (256, 1_000_000), 0), ("bfloat16", (256, 1_000_000), 1),
    ("bfloat16", (1_000_000, 64), 0), ("float32", (1_000_000, 64), 0),
    ("float32", (4096, 4096), 1), ("float32", (4096, 4096), 0),
    ("bfloat16", (4096, 4096), 1), ("bfloat16", (4096, 4096), 0),
    ("float32", (256, 1_000_000), 0), ("float32", (256, 1_000_000), 1),
]
ELEMENT = {"bfloat16": ElementKind.BF16, "float32": ElementKind.F32,
           "float16": ElementKind.F16}


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    only = os.environ.get("PROBE_CASES")
    variants = [(b, u, blk) for b in (8, 16) for u in (1, 2, 4) for blk in (128, 256)]
    if os.environ.get("PROBE_VARIANTS"):
        variants = [tuple(int(v) for v in s.split("x"))
                    for s in os.environ["PROBE_VARIANTS"].split(",")]
    col_variants = [(16, u, b) for u in (1, 4) for b in (4, 8, 16)]
    if os.environ.get("PROBE_COLS"):
        col_variants = [tuple(int(v) for v in s.split("x"))
                        for s in os.environ["PROBE_COLS"].split(",")]
    ctx = Context("broadcast", torch)
    ctx.copy_gbps = measure_copy_gbps(torch)
    print(f"copy {ctx.copy_gbps:.0f} GB/s, {torch.cuda.get_device_name()}", flush=True)
    for case_i, (dtype_name, shape, axis) in enumerate(CASES):
        if only and str(case_i) not in only.split(","):
            continue
        case(ctx, dtype_name, shape, axis, variants, rounds, col_variants)
        torch.cuda.empty_cache()


def _same_bits(run, dxs, refs) -> bool:
    """Run into NaN-filled outputs; whether every output's bits equal the plan's."""
    for i, dx in enumerate(dxs):
        dx.fill_(float("nan"))
        run(i)
    torch.cuda.synchronize()
    bits = torch.int16 if dxs[0].element_size() == 2 else torch.int32
    return all(torch.equal(dx.view(bits), ref.view(bits)) for dx, ref in zip(dxs, refs))


def case(ctx: Context, dtype_name: str, shape: tuple[int, int], axis: int,
         variants: list[tuple[int, ...]], rounds: int,
         col_variants: list[tuple[int, ...]]) -> None:
    dtype = getattr(torch, dtype_name)
    element = ELEMENT[dtype_name]
    nbytes = shape[0] * shape[1] * dtype.itemsize
    sets = 2
    dy_shape = tuple(1 if a == axis else n for a, n in enumerate(shape))
    dys = [torch.randn(dy_shape, device="cuda").to(dtype) for _ in range(sets)]
    dxs = [torch.empty(shape, device="cuda", dtype=dtype) for _ in range(sets)]
    extent = shape[axis]
    inner = shape[1] if axis == 0 else 1
    cols = inner > 1
    fns, names = [], []
    for kind in (ReduceKind.SUM, ReduceKind.MEAN):
        plan = ReduceBackwardPlan.select(ReduceBackwardDescriptor(kind, shape, axis,
                                                                  element))

        def run(i, plan=plan):
            plan.run(ReduceBackwardArgs(dys[i], dxs[i]))

        fns.append(run)
        names.append(f"plan {kind.name}")
    fns.append(lambda i: dxs[i].fill_(1.5))
    names.append("torch fill_")
    mean_ref = []
    for kind in (ReduceKind.MEAN,):
        plan = ReduceBackwardPlan.select(ReduceBackwardDescriptor(kind, shape, axis,
                                                                  element))
        for i in range(sets):
            plan.run(ReduceBackwardArgs(dys[i], dxs[i]))
            mean_ref.append(dxs[i].clone())
    if dtype_name == "bfloat16":
        dy_views = [cuda.as_cuda_array(d.view(torch.int16).view(-1)).view("u2")
                    for d in dys]
    else:
        dy_views = [cuda.as_cuda_array(d.view(-1)) for d in dys]
    for unit_bytes, per_thread, block in variants:
        k_el = unit_bytes // dtype.itemsize
        if cols or extent % k_el:  # flat columns: 2.3-2.9x slower than the plan (H200)
            continue
        units = nbytes // unit_bytes
        slab_units = extent * inner // k_el
        row_units = max(inner // k_el, 1)
        kernel = make(element, ReduceKind.MEAN, unit_bytes, per_thread, cols)
        blocks = -(-units // (block * per_thread))
        views = [cuda.as_cuda_array((d.view(torch.int32) if unit_bytes == 16
                                     else d.view(torch.int64)).view(-1)) for d in dxs]
        bound = kernel[blocks, block]
        args = (units, slab_units, 1.0 / slab_units, row_units, 1.0 / row_units,
                inner if cols else 1, 1, float(extent))

        def run(i, bound=bound, views=views, args=args):
            bound(dy_views[i], views[i], *args)

        same = _same_bits(run, dxs, mean_ref)
        fns.append(run)
        names.append(f"flat Mean {unit_bytes}B x{per_thread} block {block}"
                     f"{'' if same else ' (BITS DIFFER)'}")
    for unit_bytes, unroll, per_sm in col_variants if cols else ():
        k_el = unit_bytes // dtype.itemsize
        row_units = inner // k_el
        units = nbytes // unit_bytes
        threads = 132 * per_sm * 256
        stride = max(threads // row_units, 1) * row_units
        kernel = make_cols(element, ReduceKind.MEAN, unit_bytes, unroll)
        views = [cuda.as_cuda_array((d.view(torch.int32) if unit_bytes == 16
                                     else d.view(torch.int64)).view(-1)) for d in dxs]
        bound = kernel[-(-stride // 256), 256]

        def run(i, bound=bound, views=views, a=(units, row_units, stride, float(extent))):
            bound(dy_views[i], views[i], *a)

        same = _same_bits(run, dxs, mean_ref)
        fns.append(run)
        names.append(f"cols Mean {unit_bytes}B unroll {unroll} {per_sm} blocks/SM"
                     f"{'' if same else ' (BITS DIFFER)'}")
    label = f"{dtype_name} {list(shape)} axis {axis} ({nbytes / 2**20:.0f} MiB)"
    for r in range(rounds):
        times = ctx.time_gpu_many(fns, sets=sets)
        for name, us in zip(names, times):
            print(f"{label} round {r}: {name}: {us:.2f} us "
                  f"({nbytes / us / 1e3 / ctx.copy_gbps:.0%} of copy)", flush=True)


if __name__ == "__main__":
    main()
