"""Probe (GPU): the rate of a pure write of a [4096, 4096] bf16 gradient (32 MB), the
store-only Sum / Mean gradient's bytes, by store width and per-thread work, against
torch's ``fill_`` and the plans' Sum / Mean gradients in the same rounds.

    PYTHONPATH=scripts python scripts/probe_store_width.py [rounds]
"""

from __future__ import annotations

import sys

import torch
from bench import Context, measure_copy_gbps
from numba import cuda, uint32, uint64

from baracuda_numba import ReduceBackwardArgs, ReduceBackwardDescriptor, ReduceBackwardPlan
from baracuda_numba.kernels.common import store16
from baracuda_numba.types import ElementKind, ReduceKind

ROWS = COLS = 4096


def _store8(per_thread: int):
    @cuda.jit
    def kernel(out, value):
        """out[t + u * threads] = value (8-byte words), u < per_thread."""
        t = uint64(cuda.blockIdx.x) * uint64(cuda.blockDim.x) + uint64(cuda.threadIdx.x)
        threads = uint64(cuda.gridDim.x) * uint64(cuda.blockDim.x)
        for u in range(per_thread):
            out[t + uint64(u) * threads] = value

    return kernel


def _store16(per_thread: int):
    @cuda.jit
    def kernel(out, value):
        """16-byte units (st.global.v4.u32) of ``value`` twice, u < per_thread."""
        t = uint64(cuda.blockIdx.x) * uint64(cuda.blockDim.x) + uint64(cuda.threadIdx.x)
        threads = uint64(cuda.gridDim.x) * uint64(cuda.blockDim.x)
        lo = uint32(value & uint64(0xFFFFFFFF))
        hi = uint32(value >> uint64(32))
        for u in range(per_thread):
            store16(out, (t + uint64(u) * threads) * uint64(4), (lo, hi, lo, hi))

    return kernel


def _row_broadcast(per_thread: int):
    @cuda.jit
    def kernel(out, dyh, row_words_log2):
        """The Sum gradient along rows as a plain store: word w of dx holds four copies of
        the bf16 bits of dy[w >> row_words_log2]."""
        t = uint64(cuda.blockIdx.x) * uint64(cuda.blockDim.x) + uint64(cuda.threadIdx.x)
        threads = uint64(cuda.gridDim.x) * uint64(cuda.blockDim.x)
        for u in range(per_thread):
            w = t + uint64(u) * threads
            out[w] = (uint64(dyh[w >> uint64(row_words_log2)]) & uint64(0xFFFF)) \
                * uint64(0x0001000100010001)

    return kernel


def _col_copy(per_thread: int):
    @cuda.jit
    def kernel(out, dyw, row_words):
        """The Sum gradient along columns as a plain store: word w of dx is word w % row_words
        of dy."""
        t = uint64(cuda.blockIdx.x) * uint64(cuda.blockDim.x) + uint64(cuda.threadIdx.x)
        threads = uint64(cuda.gridDim.x) * uint64(cuda.blockDim.x)
        for u in range(per_thread):
            w = t + uint64(u) * threads
            out[w] = dyw[w % uint64(row_words)]

    return kernel


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    ctx = Context("store", torch)
    ctx.copy_gbps = measure_copy_gbps(torch)
    print(f"copy {ctx.copy_gbps:.0f} GB/s, {torch.cuda.get_device_name()}", flush=True)
    nbytes = ROWS * COLS * 2
    outs = [torch.empty(ROWS, COLS, dtype=torch.bfloat16, device="cuda") for _ in range(2)]
    dys = {axis: [torch.randn(*(1 if a == axis else n for a, n in enumerate((ROWS, COLS))),
                              dtype=torch.bfloat16, device="cuda") for _ in range(2)]
           for axis in (0, 1)}
    fns, names = [], []
    for kind in (ReduceKind.SUM, ReduceKind.MEAN):
        for axis in (0, 1):
            plan = ReduceBackwardPlan.select(ReduceBackwardDescriptor(
                kind, (ROWS, COLS), axis, ElementKind.BF16))

            def run(i, plan=plan, axis=axis):
                plan.run(ReduceBackwardArgs(dys[axis][i], outs[i]))

            fns.append(run)
            names.append(f"{kind.name} grad axis {axis}")
    fns.append(lambda i: outs[i].fill_(1.5))
    names.append("torch fill_")
    words8 = [o.view(torch.int64).view(-1) for o in outs]
    words4 = [o.view(torch.int32).view(-1) for o in outs]
    value = 0x3FC03FC03FC03FC0
    for per_thread in (1, 2, 4, 8):
        for width, make, views in ((8, _store8, words8), (16, _store16, words4)):
            kernel = make(per_thread)
            units = nbytes // width
            blocks = units // (256 * per_thread)
            cuda_views = [cuda.as_cuda_array(v) for v in views]
            bound = kernel[blocks, 256]

            def run(i, bound=bound, cuda_views=cuda_views):
                bound(cuda_views[i], value)

            run(0)
            fns.append(run)
            names.append(f"{width}-byte stores, {per_thread} a thread")
    dyh = [cuda.as_cuda_array(d.view(torch.int16).view(-1)) for d in dys[1]]
    dyw = [cuda.as_cuda_array(d.view(torch.int64).view(-1)) for d in dys[0]]
    row_words = COLS // 4
    for per_thread in (1, 2, 4):
        units = nbytes // 8
        blocks = units // (256 * per_thread)
        cuda_views = [cuda.as_cuda_array(v) for v in words8]
        rows_k = _row_broadcast(per_thread)[blocks, 256]
        cols_k = _col_copy(per_thread)[blocks, 256]

        def run_rows(i, k=rows_k, cuda_views=cuda_views):
            k(cuda_views[i], dyh[i], row_words.bit_length() - 1)

        def run_cols(i, k=cols_k, cuda_views=cuda_views):
            k(cuda_views[i], dyw[i], row_words)

        for run, name in ((run_rows, "rows"), (run_cols, "cols")):
            run(0)
            fns.append(run)
            names.append(f"plain Sum grad {name}, {per_thread} a thread")
    for r in range(rounds):
        times = ctx.time_gpu_many(fns, sets=2)
        for name, us in zip(names, times):
            print(f"round {r}: {name}: {us:.2f} us ({nbytes / us / 1e3 / ctx.copy_gbps:.0%}"
                  " of copy)", flush=True)


if __name__ == "__main__":
    main()
