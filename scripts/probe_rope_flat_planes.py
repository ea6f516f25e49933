"""Probe (GPU): ``rope_flat`` at [8, 32, 2048, 128] interleaved, f32 and bf16, forward,
timed alternately with torch.compile of the eager formula (and torch's ``copy_``).

    python scripts/probe_rope_flat_planes.py [blocks] [policies]

``blocks``: the plan's ``rope_flat`` with 1, 2 or 4 (b, h) planes a thread
(``flat_planes_per_thread``) and blocks of 128-1024 threads (``plans.rope._FLAT_BLOCK``
replaced while each plan binds), and probe kernels that take 2 or 4 units a thread a block
apart (each its own table read) instead of planes. ``policies``: probe kernels with 2
planes a thread and blocks of 256 (the plan's f32 choice) whose x loads, table loads and y
stores carry cache policies (``.cs``, ``.lu``, ``.nc``, L2 ``evict_first`` /
``evict_last``, x too). Every probe kernel's output is checked against the plan's or
torch.compile's. The probe kernels read a (cos, sin) table built by torch (f32 products,
not the plan's f64-rounded inv_freq: timing only).
"""

from __future__ import annotations

import sys

import torch
from bench import Context, measure_copy_gbps
from bench_rope import EAGER, LARGE, tables
from llvmlite import ir
from numba import cuda, float32, types, uint32, uint64
from numba.core.extending import intrinsic

from baracuda_numba.kernels import common
from baracuda_numba.kernels import rope as kernels
from baracuda_numba.kernels.common import element_address
from baracuda_numba.plans import rope as plans
from baracuda_numba.plans.rope import RopeArgs, RopeDescriptor, RopePlan
from baracuda_numba.types import ElementKind, RopePairing

ELEMENTS = (("float32", ElementKind.F32), ("bfloat16", ElementKind.BF16))


def _store_asm(text: str):  # noqa: ANN202 - a Numba intrinsic like kernels.rope.store16
    @intrinsic
    def store(typingctx, array, index, words):
        def codegen(context, builder, signature, args):
            address = element_address(context, builder, signature.args[0], args[0],
                                      signature.args[1], args[1])
            values = [context.cast(builder, builder.extract_value(args[2], i),
                                   signature.args[2][i], uint32) for i in range(4)]
            fnty = ir.FunctionType(ir.VoidType(), [ir.IntType(64)] + [ir.IntType(32)] * 4)
            asm = ir.InlineAsm(fnty, text, "l,r,r,r,r", side_effect=True)
            builder.call(asm, [address] + values)
            return context.get_dummy_value()

        return types.void(array, index, words), codegen

    return store


_POLICY = "{ .reg .b64 p; createpolicy.fractional.L2::evict_first.b64 p, 1.0; "
LOADS = {
    "ld": kernels.load16,
    "ld.cs": common._load16_asm("ld.global.cs.v4.u32 {$0, $1, $2, $3}, [$4];"),
    "ld.lu": common._load16_asm("ld.global.lu.v4.u32 {$0, $1, $2, $3}, [$4];"),
    "ld.ef": common._load16_asm(_POLICY + "ld.global.L2::cache_hint.v4.u32 "
                                 "{$0, $1, $2, $3}, [$4], p; }"),
    "ld.nc": common._load16_asm("ld.global.nc.v4.u32 {$0, $1, $2, $3}, [$4];"),
    "last": kernels.load16_last,
}
STORES = {"st": kernels.store16,
          "st.cs": _store_asm("st.global.cs.v4.u32 [$0], {$1, $2, $3, $4};"),
          "st.ef": _store_asm(_POLICY + "st.global.L2::cache_hint.v4.u32 [$0], "
                              "{$1, $2, $3, $4}, p; }")}
POLICIES = [("ld", "last", "st"), ("ld.cs", "last", "st"), ("ld.ef", "last", "st"),
            ("ld.lu", "last", "st"), ("ld.nc", "last", "st"), ("ld", "last", "st.cs"),
            ("ld", "last", "st.ef"), ("ld.cs", "last", "st.cs"), ("ld.ef", "last", "st.ef"),
            ("ld", "ld", "st"), ("ld.nc", "ld.nc", "st"), ("last", "last", "st"),
            ("last", "last", "st.cs"), ("last", "last", "st.ef")]


def _rotation(element: ElementKind):  # noqa: ANN202
    unpack, pack, elements = kernels.ROPE_UNIT_TABLE[element]
    rotate = kernels._rotate_interleaved8 if elements == 8 else kernels._rotate_interleaved4
    return unpack, pack, elements // 2, rotate


def planes_kernel(element: ElementKind, x_load: str, table_load: str, store: str):  # noqa: ANN201
    """2 planes a thread as ``rope_flat``'s, with the given cache policies."""
    unpack, pack, pairs, rotate = _rotation(element)
    load_x, load_table, store_y = LOADS[x_load], LOADS[table_load], STORES[store]

    def kernel(x, y, table, threads, items_log, plane_log, half_rotary, last):
        sins = cuda.local.array(pairs, float32)
        coss = cuda.local.array(pairs, float32)
        held = cuda.local.array((2, 4), uint32)
        g = uint32(cuda.blockIdx.x) * uint32(cuda.blockDim.x) + uint32(cuda.threadIdx.x)
        if g < uint32(threads):
            plane_units = uint32(1) << uint32(plane_log)
            w = g & (plane_units - uint32(1))
            s = w >> uint32(items_log)
            item = w & ((uint32(1) << uint32(items_log)) - uint32(1))
            plane0 = (g >> uint32(plane_log)) * uint32(2)
            for k in range(2):
                u = min(plane0 + uint32(k), uint32(last)) * plane_units + w
                unit = load_x(x, uint64(u) * uint64(4))
                for j in range(4):
                    held[k, j] = unit[j]
            at = uint32(2) * (s * uint32(half_rotary) + item * uint32(pairs))
            for p in range(pairs // 2):
                words = load_table(table, uint64(at + uint32(4 * p)))
                coss[2 * p] = kernels.f32_from_bits(words[0])
                coss[2 * p + 1] = kernels.f32_from_bits(words[2])
                sins[2 * p] = kernels.f32_from_bits(words[1])
                sins[2 * p + 1] = kernels.f32_from_bits(words[3])
            for k in range(2):
                u = min(plane0 + uint32(k), uint32(last)) * plane_units + w
                unit = (held[k, 0], held[k, 1], held[k, 2], held[k, 3])
                store_y(y, uint64(u) * uint64(4), pack(rotate(unpack(unit), sins, coss)))

    return cuda.jit(kernel)


def adjacent_kernel(element: ElementKind, per_thread: int):  # noqa: ANN201
    """``per_thread`` units a thread, a block apart, each its own table read."""
    unpack, pack, pairs, rotate = _rotation(element)
    load_table = LOADS["last"]

    def kernel(x, y, table, units, items_log, seq_len, half_rotary):
        sins = cuda.local.array((per_thread, pairs), float32)
        coss = cuda.local.array((per_thread, pairs), float32)
        held = cuda.local.array((per_thread, 4), uint32)
        step = uint32(cuda.blockDim.x)
        base = uint32(cuda.blockIdx.x) * step * uint32(per_thread) + uint32(cuda.threadIdx.x)
        for k in range(per_thread):
            unit = kernels.load16(x, uint64(min(base + uint32(k) * step, uint32(units - 1)))
                                  * uint64(4))
            for j in range(4):
                held[k, j] = unit[j]
        for k in range(per_thread):
            u = min(base + uint32(k) * step, uint32(units - 1))
            s = (u >> uint32(items_log)) % uint32(seq_len)
            item = u & ((uint32(1) << uint32(items_log)) - uint32(1))
            at = uint32(2) * (s * uint32(half_rotary) + item * uint32(pairs))
            for p in range(pairs // 2):
                words = load_table(table, uint64(at + uint32(4 * p)))
                coss[k, 2 * p] = kernels.f32_from_bits(words[0])
                coss[k, 2 * p + 1] = kernels.f32_from_bits(words[2])
                sins[k, 2 * p] = kernels.f32_from_bits(words[1])
                sins[k, 2 * p + 1] = kernels.f32_from_bits(words[3])
        for k in range(per_thread):
            u = min(base + uint32(k) * step, uint32(units - 1))
            unit = (held[k, 0], held[k, 1], held[k, 2], held[k, 3])
            kernels.store16(y, uint64(u) * uint64(4),
                            pack(rotate(unpack(unit), sins[k], coss[k])))

    return cuda.jit(kernel)


def element_rows(ctx: Context, compiled, name: str, element: ElementKind,  # noqa: ANN001
                 what: list[str]) -> None:
    """Every variant of ``what`` for one element kind, timed alternately (two rounds)."""
    batch, heads, seq, dim = LARGE
    dtype = getattr(torch, name)
    sets = ctx.sets_for(2 * batch * heads * seq * dim * dtype.itemsize)
    xs = [torch.randn(LARGE, device="cuda", dtype=dtype) for _ in range(sets)]
    ys = [torch.empty_like(x) for x in xs]
    args = [RopeArgs(x, y) for x, y in zip(xs, ys)]
    cos, sin = tables(torch, torch.arange(seq, device="cuda"), dim)
    table = torch.empty(seq * dim, device="cuda", dtype=torch.float32)
    table.view(seq, dim // 2, 2)[..., 0] = cos
    table.view(seq, dim // 2, 2)[..., 1] = sin
    words = cuda.as_cuda_array(table.view(torch.int32)).view("u4")
    xw = [cuda.as_cuda_array(x.view(torch.int32).view(-1)).view("u4") for x in xs]
    yw = [cuda.as_cuda_array(y.view(torch.int32).view(-1)).view("u4") for y in ys]
    stream = cuda.external_stream(torch.cuda.current_stream().cuda_stream)
    items = dim * dtype.itemsize // 16
    units = batch * heads * seq * items
    expected = compiled(xs[0], cos, sin).double()
    runs, labels = [], []

    def add(label, run):  # noqa: ANN001
        ys[0].fill_(float("nan"))
        run(0)
        torch.cuda.synchronize()
        error = (ys[0].double() - expected).abs().max().item()
        print(f"  {name} {label}: max |out - torch.compile| {error:.3g}", flush=True)
        runs.append(run)
        labels.append(label)

    if "blocks" in what:
        original = plans._FLAT_BLOCK
        for block in (128, 256, 512, 1024):
            for per_thread in (1, 2, 4):
                if block != 256 and per_thread == 1:
                    continue
                plans._FLAT_BLOCK = {2: block, 4: block}
                try:
                    plan = RopePlan.select(RopeDescriptor(*LARGE, element=element))
                    plan.flat_planes_per_thread = per_thread
                    plan.run(args[0])  # binds its launch with this block
                finally:
                    plans._FLAT_BLOCK = original
                add(f"flat b{block} P{per_thread}", lambda i, p=plan: p.run(args[i]))
        for per_thread in (2, 4):
            for block in (128, 256):
                launch = adjacent_kernel(element, per_thread)[
                    -(-units // (block * per_thread)), block, stream]
                add(f"adjacent b{block} x{per_thread}",
                    lambda i, f=launch: f(xw[i], yw[i], words, units, items.bit_length() - 1,
                                          seq, dim // 2))
    if "policies" in what:
        plane_units = seq * items
        threads = batch * heads // 2 * plane_units
        params = (threads, items.bit_length() - 1, plane_units.bit_length() - 1, dim // 2,
                  batch * heads - 1)
        for policy in POLICIES:
            launch = planes_kernel(element, *policy)[-(-threads // 256), 256, stream]
            add("/".join(policy), lambda i, f=launch: f(xw[i], yw[i], words, *params))
    runs.append(lambda i: compiled(xs[i], cos, sin))
    labels.append("torch.compile")
    runs.append(lambda i: ys[i].copy_(xs[i]))
    labels.append("copy_")
    for _ in range(2):
        times = ctx.time_gpu_many(runs, sets=sets, iters=30)
        print(f"{name}: " + ", ".join(f"{label} {us:.1f}" for label, us in zip(labels, times)),
              flush=True)


def main() -> None:
    what = sys.argv[1:] or ["blocks", "policies"]
    ctx = Context("probe", torch)
    ctx.copy_gbps = measure_copy_gbps(torch)
    print(f"copy {ctx.copy_gbps:.0f} GB/s, {torch.cuda.get_device_name()}", flush=True)
    compiled = torch.compile(EAGER[RopePairing.INTERLEAVED])
    for name, element in ELEMENTS:
        element_rows(ctx, compiled, name, element, what)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
