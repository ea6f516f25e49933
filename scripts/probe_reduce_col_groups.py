"""Probe (GPU): the Var / Std gradient of long columns ([1e6, 64] along axis 0) one column
group at a time, the group's x kept in L2 between its mean and its gradient.

The plan reads x twice there (the Sum kernel's mean over all 64 columns, then the
gradient), because the whole x (256 MB f32, 128 MB bf16) cannot stay on chip. But a
column's mean needs only that column: a group of columns 32 bytes wide (8 f32 / 16 bf16
columns; 32 MB of x over 1e6 rows) fits in the H200's 50 MB L2. This kernel (one
cooperative launch, Numba's grid sync) takes the groups in turn: every thread loads its
rows' 32 bytes of the group with an L2 ``evict_last`` policy and adds them up, the block
totals meet in the workspace, one grid sync, every block adds them in block order (the
means), then every thread loads the same rows again (from L2) and writes their dx.
Bytes from DRAM: x once and dx once, as the issue counts them. Timed against the plan
and torch's autograd in alternating calls, and checked against the plan's dx:

    PYTHONPATH=.:scripts python scripts/probe_reduce_col_groups.py [rounds] [std]

(Var only unless ``std`` is given.) Two diagnostics time the first phase alone (the sums,
no grid sync, no gradient): over the 32-byte groups, and over x read whole (the same
kernel on x viewed as rows of 32 bytes, one group); their % of copy counts 2 x's bytes
though they read x once.
"""

from __future__ import annotations

import sys

import numpy as np
import torch
from bench import Context, measure_copy_gbps
from numba import cuda, float32, int64, uint32, uint64

from baracuda_numba.kernels import rope as kr
from baracuda_numba.kernels.common import (
    _load16_asm,
    f32_from_bits,
    load16,
    load16_last,
    shfl_xor,
    store16,
    unpack_bf16x2,
)
from baracuda_numba.plans.reduce import (
    ReduceBackwardArgs,
    ReduceBackwardDescriptor,
    ReduceBackwardPlan,
)
from baracuda_numba.types import ElementKind, ReduceKind

GROUP_WORDS = 8  # 32-bit words of a row a group takes: 32 bytes, one sector
ROWS_A_THREAD = 4  # rows a thread loads before adding (all in flight)
BLOCK = 512
load16_first = _load16_asm("{ .reg .b64 p; createpolicy.fractional.L2::evict_first.b64 p, "
                           "1.0; ld.global.L2::cache_hint.v4.u32 {$0, $1, $2, $3}, [$4], "
                           "p; }")


def make_kernel(bf16: bool, second_load):  # noqa: ANN001, ANN201
    per_word = 2 if bf16 else 1
    columns = GROUP_WORDS * per_word
    sums_shape = (BLOCK // 32, columns)
    unit_values = columns // 2  # values of one 16-byte unit
    pack16 = kr._pack16_bf16 if bf16 else kr._pack16_f32
    words_shape = (ROWS_A_THREAD, GROUP_WORDS)

    @cuda.jit(device=True, inline=True)
    def values(words, k, out):
        for w in range(GROUP_WORDS):
            if bf16:
                lo, hi = unpack_bf16x2(words[k, w])
                out[2 * w] = lo
                out[2 * w + 1] = hi
            else:
                out[w] = f32_from_bits(words[k, w])

    @cuda.jit(device=True, inline=True)
    def load_rows(x, words, first_row, step, rows, row_words, g, policy_last):
        for k in range(ROWS_A_THREAD):
            row = first_row + k * step
            if row < rows:
                base = uint64(row * row_words + g * GROUP_WORDS)
                if policy_last:
                    a = load16_last(x, base)
                    b = load16_last(x, base + 4)
                else:
                    a = second_load(x, base)
                    b = second_load(x, base + 4)
                for w in range(4):
                    words[k, w] = a[w]
                    words[k, 4 + w] = b[w]

    def col_groups(x, dy, y, dx, partials, rows, row_words, scale, std, sums_only):
        grid = cuda.cg.this_grid()
        tid = cuda.threadIdx.x
        blocks = int64(cuda.gridDim.x)
        threads = blocks * cuda.blockDim.x
        gtid = int64(cuda.blockIdx.x) * cuda.blockDim.x + tid
        warp_sums = cuda.shared.array(sums_shape, float32)
        mean_s = cuda.shared.array(columns, float32)
        coef_s = cuda.shared.array(columns, float32)
        acc = cuda.local.array(columns, float32)
        vals = cuda.local.array(columns, float32)
        words = cuda.local.array(words_shape, uint32)
        groups = row_words // GROUP_WORDS
        for g in range(groups):
            for c in range(columns):
                acc[c] = float32(0)
            first = gtid
            while first < rows:
                load_rows(x, words, first, threads, rows, row_words, g, True)
                for k in range(ROWS_A_THREAD):
                    if first + k * threads < rows:
                        values(words, k, vals)
                        for c in range(columns):
                            acc[c] += vals[c]
                first += ROWS_A_THREAD * threads
            for c in range(columns):
                v = acc[c]
                for delta in (16, 8, 4, 2, 1):
                    v += shfl_xor(v, delta)
                if tid % 32 == 0:
                    warp_sums[tid // 32, c] = v
            cuda.syncthreads()
            if tid < columns:
                total = float32(0)
                for w in range(cuda.blockDim.x // 32):
                    total += warp_sums[w, tid]
                partials[(g * blocks + cuda.blockIdx.x) * columns + tid] = total
            if sums_only:  # diagnostics: the first phase's reads alone
                continue
            grid.sync()
            if tid < columns:
                total = float32(0)
                for b in range(blocks):
                    total += partials[(g * blocks + b) * columns + tid]
                mean_s[tid] = total / float32(rows)
                col = g * columns + tid
                coef_s[tid] = dy[col] * scale / (y[col] if std else float32(1))
            cuda.syncthreads()
            first = gtid
            while first < rows:
                load_rows(x, words, first, threads, rows, row_words, g, False)
                for k in range(ROWS_A_THREAD):
                    row = first + k * threads
                    if row < rows:
                        values(words, k, vals)
                        for c in range(columns):
                            vals[c] = coef_s[c] * (vals[c] - mean_s[c])
                        base = uint64(row * row_words + g * GROUP_WORDS)
                        for half in range(2):  # the row's two 16-byte units
                            store16(dx, base + 4 * half,
                                    pack16(vals[half * unit_values:(half + 1) * unit_values]))
                first += ROWS_A_THREAD * threads

    return cuda.jit(col_groups), columns


def _words(t: torch.Tensor):  # noqa: ANN202
    return cuda.as_cuda_array(t.view(torch.int32).reshape(-1)).view(np.uint32)


def run_case(ctx: Context, name: str, kind: ReduceKind, rounds: int) -> None:
    dtype = getattr(torch, name)
    shape, axis, correction = (1_000_000, 64), 0, 1
    element = ElementKind.BF16 if name == "bfloat16" else ElementKind.F32
    x = torch.randn(shape, device="cuda", dtype=dtype)
    xg = x.detach().requires_grad_(True)
    std = kind is ReduceKind.STD
    out = (xg.std if std else xg.var)(axis, keepdim=True, correction=correction)
    dy = torch.rand_like(out) * 2 - 1
    y = out.detach()
    plan = ReduceBackwardPlan.select(ReduceBackwardDescriptor(kind, shape, axis, element))
    workspace = torch.empty(max(plan.workspace_size, 1), device="cuda", dtype=torch.uint8)
    dx_plan = torch.empty_like(x)
    args = ReduceBackwardArgs(dy, dx_plan, x, y)
    rows = shape[0]
    scale = (1.0 if std else 2.0) / (rows - correction)
    dy32 = dy.float().reshape(-1)
    y32 = y.float().reshape(-1)
    row_words = shape[1] * x.element_size() // 4
    variants = {}
    stream = cuda.external_stream(torch.cuda.current_stream().cuda_stream)
    for label, second in (("L2 again", load16), ("L2 again evict_last", load16_last),
                          ("L2 again evict_first", load16_first)):
        kernel, columns = make_kernel(name == "bfloat16", second)
        dx = torch.empty_like(x)
        xw, dxw = _words(x), _words(dx)
        dyd, yd = cuda.as_cuda_array(dy32), cuda.as_cuda_array(y32)
        sig_args = (xw, dyd, yd, dxw)
        first_grid = 132  # one block an SM is always resident
        partials = cuda.device_array(row_words // GROUP_WORDS * first_grid * columns,
                                     np.float32)
        kernel[first_grid, BLOCK](*sig_args, partials, rows, row_words, np.float32(scale),
                                  std, False)
        cuda.synchronize()
        compiled = next(iter(kernel.overloads.values()))
        blocks = compiled.max_cooperative_grid_blocks(BLOCK)
        partials = cuda.device_array(row_words // GROUP_WORDS * blocks * columns, np.float32)
        try:
            regs = compiled.regs_per_thread
        except AttributeError:
            regs = "?"

        def launch(_i: int, k=kernel, a=sig_args, p=partials, b=blocks) -> None:
            k[b, BLOCK, stream](*a, p, rows, row_words, np.float32(scale), std, False)

        variants[label] = (launch, dx, blocks, regs)
        if label == "L2 again":  # the sums' reads alone: the groups, and x read whole
            def strided(_i: int, k=kernel, a=sig_args, p=partials, b=blocks) -> None:
                k[b, BLOCK, stream](*a, p, rows, row_words, np.float32(scale), std, True)

            def whole(_i: int, k=kernel, a=sig_args, p=partials, b=blocks) -> None:
                k[b, BLOCK, stream](*a, p, rows * row_words // GROUP_WORDS, GROUP_WORDS,
                                    np.float32(scale), std, True)

            diagnostics = [strided, whole]
    fns = [lambda _i: plan.run(args, workspace=workspace),
           lambda _i: torch.autograd.grad(out, xg, dy, retain_graph=True)]
    fns += [v[0] for v in variants.values()]
    fns += diagnostics
    for fn in fns:
        fn(0)
    torch.cuda.synchronize()
    (ref,) = torch.autograd.grad(out, xg, dy, retain_graph=True)
    ref64 = ref.double()
    scale_ref = ref64.abs().max().item()
    checks = []
    for label, (_f, dx, blocks, regs) in variants.items():
        diff = (dx.double() - ref64).abs().max().item() / scale_ref
        plan_diff = (dx.double() - dx_plan.double()).abs().max().item() / scale_ref
        checks.append(f"{label}: grid {blocks} x {BLOCK}, regs {regs}, max |dx - torch| / "
                      f"max |dx| {diff:.1e}, against the plan {plan_diff:.1e}")
    plan_err = (dx_plan.double() - ref64).abs().max().item() / scale_ref
    print(f"{kind.name} [1e6, 64] axis 0 {name}: plan vs torch {plan_err:.1e}; "
          + "; ".join(checks), flush=True)
    moved = 2 * x.numel() * x.element_size()
    labels = ["plan", "torch autograd", *variants, "sums only, 32-byte groups",
              "sums only, x read whole"]
    for _ in range(rounds):
        times = ctx.time_gpu_many(fns, warmup=3, iters=20)
        print("  " + ", ".join(f"{label} {us:.1f} µs ({moved / us / 1e3 / ctx.copy_gbps:.0%})"
                               for label, us in zip(labels, times)), flush=True)


def main() -> None:
    rounds = next((int(a) for a in sys.argv[1:] if a.isdigit()), 2)
    kinds = (ReduceKind.VAR, ReduceKind.STD) if "std" in sys.argv[1:] else (ReduceKind.VAR,)
    ctx = Context("reduce", torch)
    ctx.copy_gbps = measure_copy_gbps(torch)
    props = torch.cuda.get_device_properties(0)
    print(f"copy {ctx.copy_gbps:.0f} GB/s, {props.name}, L2 {props.L2_cache_size >> 20} MB",
          flush=True)
    for name in ("float32", "bfloat16"):
        for kind in kinds:
            run_case(ctx, name, kind, rounds)


if __name__ == "__main__":
    main()
