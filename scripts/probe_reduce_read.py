"""Probe (GPU): what a read-only pass over [4096, 4096] costs, and which access order of
a row Sum gets closest to it (the forward bf16 Sum / Mean of [4096, 4096] along axis 1
are the two forward rows at 0.98-0.99x torch).

``python scripts/probe_reduce_read.py [read] [short] [write] [write_cols]``;
``PROBE_DTYPES`` (default ``bfloat16,float32``).

``read``: variants, each timed interleaved with the others on rotated inputs
(``bench.Context``):

* ``flat8`` / ``flat16``: every word of the tensor read once, grid-stride, 4 loads of 8
  (16) bytes in flight per thread, one integer sum per thread (the read floor);
* ``warp``: a warp per row, every word of the row in flight at once (``ROW_LOADS`` per
  batch), f32 sums;
* ``block{R}``: a 256-thread block per ``R`` consecutive rows read in copy order (thread
  ``t`` loads words ``t + u * 256`` of the block's span), each thread's sums per row,
  then a warp shuffle and a shared-memory combine per row;
* ``l{lanes}[t][c]``: ``lanes`` (128 / 256) lanes per row, the whole row in flight, the
  warps meeting after one barrier or (``t``) in the plan's tree, (``c``) capped at 64
  registers;
* the plan (``ReducePlan`` Sum) and ``torch.sum``.

Each variant's sums are checked against ``torch.sum`` in float64.

``short``: the forward plans of ``PROBE_KINDS`` (default SUM, MAX, PROD, NORM2; the
first version of this part also ran VAR, LOG_SUM_EXP, ARGMAX, and SHORT_LOADS words per
lane first) on rows of ``PROBE_SHAPES`` (default [4096, 4096], [65536, 256], [16384,
1024], [8192, 2048], [4096, 8192]) along axis 1, with the row loop (``generic``:
``plans._LONG_SHORT_KINDS`` empty) and the longer short rows (``short``), timed
interleaved with ``torch``.

``write``: what writing ``PROBE_SHAPES`` (default [4096, 4096], [65536, 256], [16384,
1024]) costs (the store-only Sum / Mean gradients along axis 1): every word written once,
grid-stride (8 / 16-byte stores), a warp or a block per row storing one broadcast word,
the plans' Sum / Mean gradients without and with the short rows (``_STORE_ONLY_SHORT``),
and torch's ``fill_``. ``write_cols``: the same gradients along axis 0 of [4096, 4096]
with the column split aimed at ``PROBE_TARGETS`` blocks.
"""

from __future__ import annotations

import os
import sys

import torch
from bench import Context, measure_copy_gbps
from bench_reduce import _workspace
from numba import cuda, float32, uint32, uint64

from baracuda_numba.kernels.common import f32_from_bits, load16, store16
from baracuda_numba.plans.reduce import ReduceArgs, ReduceDescriptor, ReducePlan
from baracuda_numba.types import ElementKind, ReduceKind

ROWS, COLS = 4096, 4096
THREADS = 256
WARPS = THREADS // 32


@cuda.jit(device=True, inline=True)
def _word_sum(w, bf16):
    """f32 sum of the elements of 8-byte word ``w`` (4 bf16 or 2 f32)."""
    lo = uint32(w & uint64(0xFFFFFFFF))
    hi = uint32(w >> uint64(32))
    if bf16:
        return ((f32_from_bits(lo << uint32(16)) + f32_from_bits(lo & uint32(0xFFFF0000)))
                + (f32_from_bits(hi << uint32(16)) + f32_from_bits(hi & uint32(0xFFFF0000))))
    return f32_from_bits(lo) + f32_from_bits(hi)


@cuda.jit(device=True, inline=True)
def _warp_sum(v):
    for d in (16, 8, 4, 2, 1):
        v += cuda.shfl_xor_sync(0xFFFFFFFF, v, d)
    return v


@cuda.jit
def flat8(xv, out):
    n = xv.size
    t = cuda.grid(1)
    step = cuda.gridsize(1)
    acc = uint64(0)
    while t + 3 * step < n:
        a = xv[t]
        b = xv[t + step]
        c = xv[t + 2 * step]
        d = xv[t + 3 * step]
        acc += a ^ b ^ c ^ d
        t += 4 * step
    while t < n:
        acc += xv[t]
        t += step
    out[cuda.grid(1)] = acc


@cuda.jit
def flat16(xw, out):
    n = xw.size // 4
    t = cuda.grid(1)
    step = cuda.gridsize(1)
    acc = uint32(0)
    while t + 3 * step < n:
        a = load16(xw, uint64(t * 4))
        b = load16(xw, uint64((t + step) * 4))
        c = load16(xw, uint64((t + 2 * step) * 4))
        d = load16(xw, uint64((t + 3 * step) * 4))
        acc += a[0] ^ b[1] ^ c[2] ^ d[3] ^ a[3] ^ b[2] ^ c[1] ^ d[0]
        t += 4 * step
    out[cuda.grid(1)] = uint64(acc)


def _warp_kernel(row_words: int, bf16: bool, loads: int):
    per_lane = row_words // 32

    @cuda.jit
    def warp(xv, y):
        row = cuda.blockIdx.x * (cuda.blockDim.x // 32) + cuda.threadIdx.x // 32
        lane = cuda.threadIdx.x % 32
        if row >= y.size:
            return
        base = uint64(row) * uint64(row_words) + uint64(lane)
        words = cuda.local.array(loads, uint64)
        s = float32(0)
        for b in range(per_lane // loads):
            for u in range(loads):
                words[u] = xv[base + uint64((b * loads + u) * 32)]
            for u in range(loads):
                s += _word_sum(words[u], bf16)
        s = _warp_sum(s)
        if lane == 0:
            y[row] = s

    return warp


def _block_kernel(row_words: int, bf16: bool, rows: int):
    """``rows`` rows per block in copy order; ``row_words`` a multiple of THREADS."""
    loads = rows * row_words // THREADS
    per_row = row_words // THREADS

    @cuda.jit
    def block(xv, y):
        t = cuda.threadIdx.x
        base = uint64(cuda.blockIdx.x) * uint64(rows * row_words) + uint64(t)
        words = cuda.local.array(loads, uint64)
        for u in range(loads):
            words[u] = xv[base + uint64(u * THREADS)]
        sums = cuda.local.array(rows, float32)
        for r in range(rows):
            s = float32(0)
            for u in range(per_row):
                s += _word_sum(words[r * per_row + u], bf16)
            sums[r] = _warp_sum(s)
        shared = cuda.shared.array((WARPS, rows), float32)
        if t % 32 == 0:
            for r in range(rows):
                shared[t // 32, r] = sums[r]
        cuda.syncthreads()
        if t < rows:
            s = float32(0)
            for w in range(WARPS):
                s += shared[w, t]
            y[cuda.blockIdx.x * rows + t] = s

    return block


def _lanes_kernel(row_words: int, bf16: bool, lanes: int, tree: bool, cap: bool):
    """``lanes`` lanes per row (a power of two, 32 to THREADS), every word of the row in
    flight at once; the warps of a row meet in shared memory after one barrier (lane 0
    adds them in warp order) or, with ``tree``, in a halving tree with a barrier per level
    (the plan's ``_lane_combiner``); ``cap``: 64 registers, as the plan's kernels."""
    per_lane = row_words // lanes
    slots = THREADS // lanes
    groups = lanes // 32

    def lanes_rows(xv, y):
        t = cuda.threadIdx.x
        lane = t % lanes
        row = cuda.blockIdx.x * slots + t // lanes
        base = uint64(row) * uint64(row_words) + uint64(lane)
        words = cuda.local.array(per_lane, uint64)
        for u in range(per_lane):
            words[u] = xv[base + uint64(u * lanes)]
        s = float32(0)
        for u in range(per_lane):
            s += _word_sum(words[u], bf16)
        s = _warp_sum(s)
        shared = cuda.shared.array(THREADS, float32)
        if groups > 1:
            shared[t] = s
            cuda.syncthreads()
            if tree:
                half = groups // 2
                while half >= 1:
                    if lane % 32 == 0 and lane // 32 < half:
                        s += shared[t + half * 32]
                        shared[t] = s
                    cuda.syncthreads()
                    half //= 2
            elif lane == 0:
                for g in range(1, groups):
                    s += shared[t + g * 32]
        if lane == 0:
            y[row] = s

    return cuda.jit(max_registers=64)(lanes_rows) if cap else cuda.jit(lanes_rows)


def _report(ctx: Context, what: str, variants: dict, nbytes: int, sets: int = 1,
            reps: int = 2, iters: int = 60) -> None:
    """Time ``variants`` (label -> fn(i)) interleaved ``reps`` times and print µs and % of
    the copy bandwidth for ``nbytes`` moved."""
    labels = list(variants)
    for rep in range(reps):
        times = ctx.time_gpu_many([variants[k] for k in labels], sets=sets, iters=iters)
        print(f"{what} rep {rep}: " + ", ".join(
            f"{k} {t:.2f} ({nbytes / t / 1e3 / ctx.copy_gbps * 100:.0f}%)"
            for k, t in zip(labels, times)), flush=True)


def _variants(name: str, ctx: Context) -> None:
    dtype = getattr(torch, name)
    bf16 = dtype == torch.bfloat16
    nbytes = ROWS * COLS * dtype.itemsize
    row_words = COLS * dtype.itemsize // 8
    sets = ctx.sets_for(nbytes)
    xs = [(torch.rand((ROWS, COLS), device="cuda") * 4 - 2).to(dtype) for _ in range(sets)]
    xv = [cuda.as_cuda_array(x.view(torch.int64).view(-1)).view("u8") for x in xs]
    xw = [cuda.as_cuda_array(x.view(torch.int32).view(-1)).view("u4") for x in xs]
    grid = 132 * 8
    out = cuda.device_array(grid * THREADS, "u8")
    y32 = torch.empty(ROWS, device="cuda", dtype=torch.float32)
    y32n = cuda.as_cuda_array(y32)
    ref = xs[0].double().sum(1)
    variants = {
        "flat8": lambda i: flat8[grid, THREADS](xv[i], out),
        "flat16": lambda i: flat16[grid, THREADS](xw[i], out),
    }
    for loads in (8, 16, 32):
        if row_words // 32 % loads == 0:
            k = _warp_kernel(row_words, bf16, loads)
            variants[f"warp{loads}"] = lambda i, k=k: k[ROWS // 8, THREADS](xv[i], y32n)
    for rows in (1, 2, 4):
        if rows * row_words // THREADS <= 32:
            k = _block_kernel(row_words, bf16, rows)
            variants[f"block{rows}"] = lambda i, k=k, r=rows: k[ROWS // r, THREADS](xv[i], y32n)
    for lanes in (128, 256):
        for tree in (False, True):
            for cap in (False, True):
                if row_words % lanes == 0 and row_words // lanes <= 16:
                    k = _lanes_kernel(row_words, bf16, lanes, tree, cap)
                    variants[f"l{lanes}{'t' if tree else ''}{'c' if cap else ''}"] = (
                        lambda i, k=k, r=THREADS // lanes: k[ROWS // r, THREADS](xv[i], y32n))
    for label, fn in variants.items():
        if label.startswith(("warp", "block", "l")):
            y32.fill_(float("nan"))
            fn(0)
            torch.cuda.synchronize()
            err = (y32.double() - ref).abs().max().item()
            print(f"  check {label}: max err {err:.3g}", flush=True)
            assert err < 1e-2, label
    element = ElementKind.BF16 if bf16 else ElementKind.F32
    plan = ReducePlan.select(ReduceDescriptor(ReduceKind.SUM, (ROWS, COLS), 1, element))
    variants["plan"] = _runner(plan, ReduceArgs, xs,
                               torch.empty((ROWS, 1), device="cuda", dtype=dtype))
    variants["torch"] = lambda i: torch.sum(xs[i], 1, keepdim=True)
    _report(ctx, name, variants, nbytes, sets)


@cuda.jit
def wflat8(out, value):
    n = out.size
    t = cuda.grid(1)
    step = cuda.gridsize(1)
    while t < n:
        out[t] = value
        t += step


@cuda.jit
def wflat16(out, value):
    n = out.size // 4
    t = cuda.grid(1)
    step = cuda.gridsize(1)
    w = uint32(value)
    while t < n:
        store16(out, uint64(t * 4), (w, w, w, w))
        t += step


def _write_row_kernel(row_words: int, lanes: int):
    per_lane = row_words // lanes

    @cuda.jit
    def wrow(out, dy):
        rows_per_block = cuda.blockDim.x // lanes
        row = cuda.blockIdx.x * rows_per_block + cuda.threadIdx.x // lanes
        lane = cuda.threadIdx.x % lanes
        if row >= dy.size:
            return
        w = uint64(dy[row])
        base = uint64(row) * uint64(row_words) + uint64(lane)
        for u in range(per_lane):
            out[base + uint64(u * lanes)] = w

    return wrow


def _store_only(kind: ReduceKind, element: ElementKind, axis: int, dy, dx):
    """``fn(i)`` running the Sum / Mean gradient plan of ``dx``'s shape along ``axis``
    (selected and bound now, under the probe's current settings), checked once."""
    from baracuda_numba.plans.reduce import (
        ReduceBackwardArgs,
        ReduceBackwardDescriptor,
        ReduceBackwardPlan,
    )

    shape = tuple(dx.shape)
    plan = ReduceBackwardPlan.select(ReduceBackwardDescriptor(kind, shape, axis, element))
    ws = _workspace(torch, plan)
    dx.fill_(float("nan"))
    plan.run(ReduceBackwardArgs(dy, dx), workspace=ws)  # binds under these settings
    expect = dy.float() / (shape[axis] if kind is ReduceKind.MEAN else 1)
    assert torch.equal(dx.float(), expect.expand(shape).to(dx.dtype).float()), kind
    return lambda i: plan.run(ReduceBackwardArgs(dy, dx), workspace=ws)


def _write_one(ctx: Context, name: str, shape: tuple[int, int]) -> None:
    from baracuda_numba.plans import reduce as plans

    rows, cols = shape
    dtype = getattr(torch, name)
    element = ElementKind.BF16 if dtype == torch.bfloat16 else ElementKind.F32
    nbytes = rows * cols * dtype.itemsize
    row_words = cols * dtype.itemsize // 8
    dx = torch.empty(shape, device="cuda", dtype=dtype)
    dv = cuda.as_cuda_array(dx.view(torch.int64).view(-1)).view("u8")
    dw = cuda.as_cuda_array(dx.view(torch.int32).view(-1)).view("u4")
    dyw = cuda.as_cuda_array(torch.arange(rows, device="cuda", dtype=torch.int64)).view("u8")
    grid = 132 * 8
    variants = {
        "flat8": lambda i: wflat8[grid, THREADS](dv, uint64(7)),
        "flat16": lambda i: wflat16[grid, THREADS](dw, uint64(7)),
    }
    for lanes in (32, 128, 256):
        if row_words % lanes == 0 and THREADS % lanes == 0:
            k = _write_row_kernel(row_words, lanes)
            variants[f"row{lanes}"] = lambda i, k=k, r=THREADS // lanes: k[
                rows // r, THREADS](dv, dyw)
    dy = torch.rand((rows, 1), device="cuda", dtype=dtype)
    for kind in (ReduceKind.SUM, ReduceKind.MEAN):
        for short in (False, True):
            plans._STORE_ONLY_SHORT = short
            variants[f"{kind.name}{'_short' if short else ''}"] = _store_only(kind, element,
                                                                             1, dy, dx)
    plans._STORE_ONLY_SHORT = True
    variants["fill_"] = lambda i: dx.fill_(1.5)
    _report(ctx, f"{name} {list(shape)} write", variants, nbytes)


def _write_cols(ctx: Context, name: str) -> None:
    """The store-only gradients along axis 0 of [4096, 4096] with the column splits aimed
    at ``PROBE_TARGETS`` blocks (default 4224, 2112, 1056, 528; one batch per split)."""
    from baracuda_numba.plans import reduce as plans

    shape = (ROWS, COLS)
    dtype = getattr(torch, name)
    element = ElementKind.BF16 if dtype == torch.bfloat16 else ElementKind.F32
    nbytes = ROWS * COLS * dtype.itemsize
    dx = torch.empty(shape, device="cuda", dtype=dtype)
    dy = torch.rand((1, COLS), device="cuda", dtype=dtype)
    variants = {}
    default = plans._STREAM_TARGET_BLOCKS
    for target in (int(t) for t in os.environ.get("PROBE_TARGETS",
                                                  "4224,2112,1056,528").split(",")):
        plans._STREAM_TARGET_BLOCKS = target
        for kind in (ReduceKind.SUM, ReduceKind.MEAN):
            variants[f"{kind.name}@{target}"] = _store_only(kind, element, 0, dy, dx)
    plans._STREAM_TARGET_BLOCKS = default
    variants["fill_"] = lambda i: dx.fill_(1.5)
    _report(ctx, f"{name} {list(shape)} axis 0 write", variants, nbytes)


def _write(ctx: Context) -> None:
    shapes = [tuple(int(n) for n in item.split("x")) for item in os.environ.get(
        "PROBE_SHAPES", "4096x4096,65536x256,16384x1024").split(",")]
    for name in os.environ.get("PROBE_DTYPES", "bfloat16,float32").split(","):
        for shape in shapes:
            _write_one(ctx, name, shape)


def _runner(plan, args_type, xs, y):
    ws = _workspace(torch, plan)
    return lambda i: plan.run(args_type(xs[i], y), workspace=ws)


def _short(ctx: Context) -> None:
    from baracuda_numba.plans import reduce as plans
    from baracuda_numba.plans.reduce import (
        ArgReduceArgs,
        ArgReduceDescriptor,
        ArgReducePlan,
    )

    shapes = [tuple(int(n) for n in item.split("x")) for item in os.environ.get(
        "PROBE_SHAPES", "4096x4096,65536x256,16384x1024,8192x2048,4096x8192").split(",")]
    kinds = [ReduceKind[k] for k in os.environ.get(
        "PROBE_KINDS", "SUM,MAX,PROD,NORM2").split(",")]
    orders = {"generic": (), "short": plans.LONG_SHORT_KINDS}
    torch_fns = {ReduceKind.SUM: torch.sum, ReduceKind.MAX: torch.amax,
                 ReduceKind.PROD: torch.prod, ReduceKind.MIN: torch.amin,
                 ReduceKind.NORM2: lambda x, a, keepdim: torch.linalg.vector_norm(
                     x, dim=a, keepdim=keepdim),
                 ReduceKind.VAR: torch.var, ReduceKind.LOG_SUM_EXP: torch.logsumexp,
                 ReduceKind.ARGMAX: torch.argmax}
    for name in os.environ.get("PROBE_DTYPES", "bfloat16,float32").split(","):
        dtype = getattr(torch, name)
        element = ElementKind.BF16 if dtype == torch.bfloat16 else ElementKind.F32
        for shape in shapes:
            nbytes = shape[0] * shape[1] * dtype.itemsize
            sets = ctx.sets_for(nbytes)
            xs = [(torch.rand(shape, device="cuda") * 4 - 2).to(dtype) for _ in range(sets)]
            for kind in kinds:
                variants = {}
                arg = kind is ReduceKind.ARGMAX
                expect = torch_fns[kind](xs[0].float() if not arg else xs[0], 1, keepdim=True)
                for label, order in orders.items():
                    plans._LONG_SHORT_KINDS = order
                    if arg:
                        plan = ArgReducePlan.select(ArgReduceDescriptor(kind, shape, 1, element))
                        y = torch.empty((shape[0], 1), device="cuda", dtype=torch.int64)
                        fn = _runner(plan, ArgReduceArgs, xs, y)
                    else:
                        plan = ReducePlan.select(ReduceDescriptor(kind, shape, 1, element))
                        y = torch.empty((shape[0], 1), device="cuda", dtype=dtype)
                        fn = _runner(plan, ReduceArgs, xs, y)
                    fn(0)  # binds the launch under this order
                    torch.cuda.synchronize()
                    if arg:
                        assert torch.equal(y, expect), (label, kind)
                    else:
                        err = ((y.double() - expect.double()).abs()
                               / (expect.double().abs() + 1)).max().item()
                        assert err < 2e-2, (label, kind, err)
                    variants[label] = fn
                plans._LONG_SHORT_KINDS = orders["short"]
                variants["torch"] = lambda i, f=torch_fns[kind], xs=xs: f(xs[i], 1,
                                                                           keepdim=True)
                _report(ctx, f"{kind.name} {list(shape)} {name}", variants, nbytes, sets,
                        reps=1, iters=40)
            xs = None
            torch.cuda.empty_cache()


def main() -> None:
    ctx = Context("probe", torch)
    ctx.copy_gbps = measure_copy_gbps(torch)
    print(torch.cuda.get_device_name(), f"copy {ctx.copy_gbps:.0f} GB/s", flush=True)
    parts = sys.argv[1:] or ["read"]
    if "read" in parts:
        for name in os.environ.get("PROBE_DTYPES", "bfloat16,float32").split(","):
            _variants(name, ctx)
    if "short" in parts:
        _short(ctx)
    if "write" in parts:
        _write(ctx)
    if "write_cols" in parts:
        for name in os.environ.get("PROBE_DTYPES", "bfloat16,float32").split(","):
            _write_cols(ctx, name)


if __name__ == "__main__":
    main()
