"""Probe (issue 6, RoPE f32 and decode): copy kernels in several access patterns against
torch's copy_ on 537 MB of f32, f32 RoPE prototypes in those patterns, and decode-shape
prototypes that split the device time into launch floor, memory and math. H100 results
(2026-11-22) are in docs/notes/rope.md ("Session 5").

    python scripts/probe_rope_f32.py [copy|rope|decode|all]   # ncu: see the notes

Scratch code: contiguous [8, 32, 2048, 128] / [64, 32, 1, 128] f32 with D = R = 128 and
base 10^4 only; not part of the package or its tests.
"""

from __future__ import annotations

import statistics
import sys
import time

import numpy as np
import torch
from llvmlite import ir
from numba import cuda, float32, int64, types, uint32, uint64
from numba.cuda.extending import intrinsic

from baracuda_numba.kernels.rope import rope_inv_freq, rope_sincos32, rotate_pair
from baracuda_numba.launch import Kernel
from baracuda_numba.plans.rope import RopeArgs, RopeDescriptor, RopePlan
from baracuda_numba.types import ElementKind, RopePairing

_accurate = rope_sincos32

U4 = types.UniTuple(uint32, 4)


def make_ld(op):
    @intrinsic
    def ld(typingctx, array, index):
        def codegen(context, builder, sig, args):
            ary = context.make_array(sig.args[0])(context, builder, args[0])
            idx = context.cast(builder, args[1], sig.args[1], types.int64)
            ptr = builder.gep(ary.data, [idx])
            addr = builder.ptrtoint(ptr, ir.IntType(64))
            i32 = ir.IntType(32)
            fnty = ir.FunctionType(ir.LiteralStructType([i32] * 4), [ir.IntType(64)])
            asm = ir.InlineAsm(fnty, op + " {$0, $1, $2, $3}, [$4];", "=r,=r,=r,=r,l",
                               side_effect=True)
            res = builder.call(asm, [addr])
            return context.make_tuple(builder, U4, [builder.extract_value(res, i)
                                                    for i in range(4)])
        return U4(array, index), codegen
    return ld


def make_st(op):
    @intrinsic
    def st(typingctx, array, index, value):
        def codegen(context, builder, sig, args):
            ary = context.make_array(sig.args[0])(context, builder, args[0])
            idx = context.cast(builder, args[1], sig.args[1], types.int64)
            ptr = builder.gep(ary.data, [idx])
            addr = builder.ptrtoint(ptr, ir.IntType(64))
            i32 = ir.IntType(32)
            vals = [builder.extract_value(args[2], i) for i in range(4)]
            fnty = ir.FunctionType(ir.VoidType(), [ir.IntType(64)] + [i32] * 4)
            asm = ir.InlineAsm(fnty, op + " [$0], {$1, $2, $3, $4};", "l,r,r,r,r",
                               side_effect=True)
            builder.call(asm, [addr] + vals)
            return context.get_dummy_value()
        return types.void(array, index, value), codegen
    return st


LD = {"plain": make_ld("ld.global.v4.u32"), "nc": make_ld("ld.global.nc.v4.u32"),
      "cs": make_ld("ld.global.cs.v4.u32")}
ST = {"plain": make_st("st.global.v4.u32"), "cs": make_st("st.global.cs.v4.u32")}

A32 = types.Array(uint32, 1, "C")
F32A = types.Array(float32, 1, "C")
I64A = types.Array(int64, 1, "C")


def sig(n):
    return (A32, A32, types.UniTuple(int64, n))


def flat_copy(k, ld, st):
    """thread: k 16-byte units at (block*k + j)*256 + t; all loads, then all stores."""
    def kern(x, y, p):
        t = int64(cuda.threadIdx.x)
        base = int64(cuda.blockIdx.x) * (256 * k) + t
        if k == 1:
            a = ld(x, base * 4)
            st(y, base * 4, a)
        elif k == 2:
            a = ld(x, base * 4)
            b = ld(x, (base + 256) * 4)
            st(y, base * 4, a)
            st(y, (base + 256) * 4, b)
        else:
            a = ld(x, base * 4)
            b = ld(x, (base + 256) * 4)
            c = ld(x, (base + 512) * 4)
            d = ld(x, (base + 768) * 4)
            st(y, base * 4, a)
            st(y, (base + 256) * 4, b)
            st(y, (base + 512) * 4, c)
            st(y, (base + 768) * 4, d)
    return kern


def flat_copy8():
    def kern(x, y, p):
        i = int64(cuda.blockIdx.x) * 256 + int64(cuda.threadIdx.x)
        y[uint64(i)] = x[uint64(i)]
    return kern


def heads_copy(hpt, ld, st):
    """block (32 units, 8 rows) of one head chunk; thread loops hpt heads (1 MB apart),
    4 heads loaded before any store."""
    def kern(x, y, p):
        seq, x_h, x_b, _heads = p[0], p[1], p[2], p[3]
        t = int64(cuda.threadIdx.x)
        unit = t & 31
        row = int64(cuda.blockIdx.y) * 8 + (t >> 5)
        b = row // seq
        s = row - b * seq
        h0 = int64(cuda.blockIdx.x) * hpt
        off = (b * x_b + h0 * x_h + s * 32 + unit) * 4
        h = 0
        while h < hpt:
            a0 = ld(x, off + (h + 0) * x_h * 4)
            a1 = ld(x, off + (h + 1) * x_h * 4)
            a2 = ld(x, off + (h + 2) * x_h * 4)
            a3 = ld(x, off + (h + 3) * x_h * 4)
            st(y, off + (h + 0) * x_h * 4, a0)
            st(y, off + (h + 1) * x_h * 4, a1)
            st(y, off + (h + 2) * x_h * 4, a2)
            st(y, off + (h + 3) * x_h * 4, a3)
            h += 4
    return kern


# -- RoPE f32 prototypes (contiguous [B,H,S,D], D = R = 128, pos = s or positions[b,s]) ----


@intrinsic
def _as_f32(typingctx, bits):
    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], ir.FloatType())
    return float32(uint32), codegen


@intrinsic
def _as_u32(typingctx, value):
    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], ir.IntType(32))
    return uint32(float32), codegen


@cuda.jit(device=True, inline=True)
def _sincos_fast(pos, inv, inverse):
    theta = float32(pos) * float32(inv)
    return cuda.libdevice.fast_sinf(theta), cuda.libdevice.fast_cosf(theta)


@cuda.jit(device=True, inline=True)
def _sincos_none(pos, inv, inverse):
    return float32(pos) * float32(inv) * float32(1e-30), float32(1.0)


def flat_rope(half, upt, ld, st, table, trig="accurate"):
    """thread: upt items of rows (b,h,s) (block*upt + j)*RB + t//IPR, item t % IPR;
    per-item sincos (no amortisation over heads). interleaved item = 16 B (2 pairs);
    half-split item = 16 B from each half (4 pairs)."""
    ipr = 16 if half else 32
    rb = 256 // ipr
    npairs = 4 if half else 2
    rope_sincos32 = {"accurate": _accurate, "fast": _sincos_fast, "none": _sincos_none}[trig]

    def kern(x, y, positions, inv_table, p):
        seq, heads, rows, pos_b, pos_s, has_pos, inverse = (p[0], p[1], p[2], p[3], p[4],
                                                            p[5], p[6])
        freq_exponent = -2.0 * 13.287712379549449 / 128
        t = int64(cuda.threadIdx.x)
        item = t % ipr
        invs = cuda.local.array(npairs, float32)
        for q in range(npairs):
            if table:
                invs[q] = inv_table[uint64(item * npairs + q)]
            else:
                invs[q] = float32(rope_inv_freq(item * npairs + q, freq_exponent))
        row0 = int64(cuda.blockIdx.x) * (rb * upt) + t // ipr
        for j in range(upt):
            row = row0 + j * rb
            if row < rows:
                bh = row // seq
                s = row - bh * seq
                b = bh // heads
                if has_pos:
                    pos = positions[uint64(b * pos_b + s * pos_s)]
                else:
                    pos = s
                off = (row * 32 + item) * 4
                if half:
                    u = ld(x, off)
                    v = ld(x, off + 64)
                    s0, c0 = rope_sincos32(pos, invs[0], inverse)
                    s1, c1 = rope_sincos32(pos, invs[1], inverse)
                    s2, c2 = rope_sincos32(pos, invs[2], inverse)
                    s3, c3 = rope_sincos32(pos, invs[3], inverse)
                    a0, b0 = rotate_pair(_as_f32(u[0]), _as_f32(v[0]), s0, c0)
                    a1, b1 = rotate_pair(_as_f32(u[1]), _as_f32(v[1]), s1, c1)
                    a2, b2 = rotate_pair(_as_f32(u[2]), _as_f32(v[2]), s2, c2)
                    a3, b3 = rotate_pair(_as_f32(u[3]), _as_f32(v[3]), s3, c3)
                    st(y, off, (_as_u32(a0), _as_u32(a1), _as_u32(a2), _as_u32(a3)))
                    st(y, off + 64, (_as_u32(b0), _as_u32(b1), _as_u32(b2), _as_u32(b3)))
                else:
                    u = ld(x, off)
                    s0, c0 = rope_sincos32(pos, invs[0], inverse)
                    s1, c1 = rope_sincos32(pos, invs[1], inverse)
                    a0, b0 = rotate_pair(_as_f32(u[0]), _as_f32(u[1]), s0, c0)
                    a1, b1 = rotate_pair(_as_f32(u[2]), _as_f32(u[3]), s1, c1)
                    st(y, off, (_as_u32(a0), _as_u32(b0), _as_u32(a1), _as_u32(b1)))
    return kern


def heads_rope(half, hpt, ld, st):
    """block = 256/IPR rows x IPR items of one head chunk (16-byte units); thread: hpt heads
    (4 loaded before stores); one sincos per pair per thread (amortised over hpt heads)."""
    ipr = 16 if half else 32
    rb = 256 // ipr
    npairs = 4 if half else 2

    def kern(x, y, positions, inv_table, p):
        seq, heads, _rows, pos_b, pos_s, has_pos, inverse, x_h = (p[0], p[1], p[2], p[3],
                                                                  p[4], p[5], p[6], p[7])
        freq_exponent = -2.0 * 13.287712379549449 / 128
        t = int64(cuda.threadIdx.x)
        item = t % ipr
        row = int64(cuda.blockIdx.y) * rb + t // ipr  # row over (b, s)
        b = row // seq
        s = row - b * seq
        pos = positions[uint64(b * pos_b + s * pos_s)] if has_pos else s
        sins = cuda.local.array(npairs, float32)
        coss = cuda.local.array(npairs, float32)
        for q in range(npairs):
            inv = rope_inv_freq(item * npairs + q, freq_exponent)
            sins[q], coss[q] = rope_sincos32(pos, inv, inverse)
        h0 = int64(cuda.blockIdx.x) * hpt
        off = ((b * heads + h0) * x_h + s * 32 + item) * 4
        hs = x_h * 4
        h = 0
        while h < hpt:
            if half:
                u0 = ld(x, off + (h + 0) * hs)
                v0 = ld(x, off + (h + 0) * hs + 64)
                u1 = ld(x, off + (h + 1) * hs)
                v1 = ld(x, off + (h + 1) * hs + 64)
                u2 = ld(x, off + (h + 2) * hs)
                v2 = ld(x, off + (h + 2) * hs + 64)
                u3 = ld(x, off + (h + 3) * hs)
                v3 = ld(x, off + (h + 3) * hs + 64)
                for k in range(4):
                    if k == 0:
                        u, v = u0, v0
                    elif k == 1:
                        u, v = u1, v1
                    elif k == 2:
                        u, v = u2, v2
                    else:
                        u, v = u3, v3
                    a0, b0 = rotate_pair(_as_f32(u[0]), _as_f32(v[0]), sins[0], coss[0])
                    a1, b1 = rotate_pair(_as_f32(u[1]), _as_f32(v[1]), sins[1], coss[1])
                    a2, b2 = rotate_pair(_as_f32(u[2]), _as_f32(v[2]), sins[2], coss[2])
                    a3, b3 = rotate_pair(_as_f32(u[3]), _as_f32(v[3]), sins[3], coss[3])
                    st(y, off + (h + k) * hs,
                       (_as_u32(a0), _as_u32(a1), _as_u32(a2), _as_u32(a3)))
                    st(y, off + (h + k) * hs + 64,
                       (_as_u32(b0), _as_u32(b1), _as_u32(b2), _as_u32(b3)))
            else:
                u0 = ld(x, off + (h + 0) * hs)
                u1 = ld(x, off + (h + 1) * hs)
                u2 = ld(x, off + (h + 2) * hs)
                u3 = ld(x, off + (h + 3) * hs)
                u4 = ld(x, off + (h + 4) * hs)
                u5 = ld(x, off + (h + 5) * hs)
                u6 = ld(x, off + (h + 6) * hs)
                u7 = ld(x, off + (h + 7) * hs)
                for k in range(8):
                    if k == 0:
                        u = u0
                    elif k == 1:
                        u = u1
                    elif k == 2:
                        u = u2
                    elif k == 3:
                        u = u3
                    elif k == 4:
                        u = u4
                    elif k == 5:
                        u = u5
                    elif k == 6:
                        u = u6
                    else:
                        u = u7
                    a0, b0 = rotate_pair(_as_f32(u[0]), _as_f32(u[1]), sins[0], coss[0])
                    a1, b1 = rotate_pair(_as_f32(u[2]), _as_f32(u[3]), sins[1], coss[1])
                    st(y, off + (h + k) * hs,
                       (_as_u32(a0), _as_u32(b0), _as_u32(a1), _as_u32(b1)))
            h += 4 if half else 8
    return kern


RSIG = (A32, A32, I64A, F32A, types.UniTuple(int64, 8))


def empty_kernel(x, y, p):
    pass


def time_back_to_back(fn, iters=20, warm=3):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(5):
        s = torch.cuda.Event(enable_timing=True)
        e = torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(iters):
            fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) * 1e3 / iters)
    return min(times), statistics.median(times)


def time_spin(fn, iters=60, warm=5):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    times = []
    s = torch.cuda.Event(enable_timing=True)
    e = torch.cuda.Event(enable_timing=True)
    for _ in range(iters):
        torch.cuda._sleep(1_000_000)
        s.record()
        fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) * 1e3)
    return statistics.median(times)


def main():
    which = sys.argv[1] if len(sys.argv) > 1 else "all"
    t0 = time.time()
    shape = (8, 32, 2048, 128)
    n = 8 * 32 * 2048 * 128
    x = torch.randn(shape, device="cuda", dtype=torch.float32)
    y = torch.empty_like(x)
    moved = 2 * n * 4
    xp, yp = x.data_ptr(), y.data_ptr()
    res = {}

    def report(name, us):
        lo, med = us
        print(f"{name:40s} min {lo:8.2f} med {med:8.2f} µs  {moved / lo / 1e3:7.0f} GB/s",
              flush=True)
        res[name] = lo

    if which in ("all", "copy"):
        report("torch copy_", time_back_to_back(lambda: y.copy_(x)))
        report("torch mul(x,1)", time_back_to_back(lambda: torch.mul(x, 1.0, out=y)))
        units = n // 4
        k8 = Kernel("flat8", flat_copy8(), (types.Array(uint64, 1, "C"),) * 2
                    + (types.UniTuple(int64, 1),), register=False)
        b = k8.bind(n // 2 // 256, 256, ((0, n // 2), (0, n // 2), (0,)))
        report("copy flat 8B k=1", time_back_to_back(lambda: b(0, xp, yp)))
        for k in (1, 2, 4):
            for ldn, stn in (("plain", "plain"), ("nc", "cs"), ("cs", "cs")):
                if k != 2 and (ldn, stn) not in (("plain", "plain"), ("nc", "cs")):
                    continue
                kern = Kernel(f"flat{k}{ldn}{stn}", flat_copy(k, LD[ldn], ST[stn]), sig(1),
                              register=False)
                bb = kern.bind(units // (256 * k), 256, ((0, n), (0, n), (0,)))
                report(f"copy flat 16B k={k} {ldn}/{stn}",
                       time_back_to_back(lambda bb=bb: bb(0, xp, yp)))
        for hpt in (4, 8, 16, 32):
            for ldn, stn in (("plain", "plain"), ("nc", "cs")):
                kern = Kernel(f"heads{hpt}{ldn}", heads_copy(hpt, LD[ldn], ST[stn]), sig(4),
                              register=False)
                params = (2048, 2048 * 32, 32 * 2048 * 32, 32)
                bb = kern.bind((32 // hpt, 8 * 2048 // 8), 256, ((0, n), (0, n), params))
                report(f"copy heads 16B hpt={hpt} {ldn}/{stn}",
                       time_back_to_back(lambda bb=bb: bb(0, xp, yp)))
        print(f"[{time.time() - t0:.0f}s]", flush=True)

    if which in ("all", "rope"):
        # reference: the current plan
        ref = {}
        for pairing in RopePairing:
            plan = RopePlan.select(RopeDescriptor(*shape, element=ElementKind.F32,
                                                  pairing=pairing))
            args = RopeArgs(x, y)
            report(f"plan {pairing.name}", time_back_to_back(lambda p=plan, a=args: p.run(a)))
            torch.cuda.synchronize()
            ref[pairing] = y.clone()
        dummy_pos = torch.zeros(1, dtype=torch.int64, device="cuda")
        inv = (10000.0 ** (-(2.0 * np.arange(64)) / 128)).astype(np.float32)
        inv_t = torch.from_numpy(inv).cuda()
        rows = 8 * 32 * 2048
        for half in (False, True):
            pairing = RopePairing.HALF_SPLIT if half else RopePairing.INTERLEAVED
            ipr = 16 if half else 32
            for upt in (2, 4):
                for ldn, stn in (("plain", "plain"),):
                    for table in (False, True):
                        kern = Kernel(f"flatrope{half}{upt}{ldn}{table}",
                                      flat_rope(half, upt, LD[ldn], ST[stn], table), RSIG,
                                      register=False)
                        params = (2048, 32, rows, 0, 0, 0, 0, 0)
                        rb = 256 // ipr
                        bb = kern.bind(-(-rows // (rb * upt)), 256,
                                       ((0, n), (0, n), (0, 1), (0, 64), params))
                        y.zero_()
                        name = f"flat rope {pairing.name} upt={upt} {ldn}/{stn} table={table}"
                        report(name, time_back_to_back(
                            lambda bb=bb: bb(0, xp, yp, dummy_pos.data_ptr(), inv_t.data_ptr())))
                        print("   equal to plan:", bool(torch.equal(y, ref[pairing])), flush=True)
            for hpt in (8,):
                for ldn, stn in (("plain", "plain"),):
                    kern = Kernel(f"headsrope{half}{hpt}{ldn}", heads_rope(half, hpt, LD[ldn],
                                  ST[stn]), RSIG, register=False)
                    params = (2048, 32, rows, 0, 0, 0, 0, 2048 * 32)
                    rb = 256 // ipr
                    bb = kern.bind((32 // hpt, 8 * 2048 // rb), 256,
                                   ((0, n), (0, n), (0, 1), (0, 64), params))
                    y.zero_()
                    name = f"heads rope {pairing.name} hpt={hpt} {ldn}/{stn}"
                    report(name, time_back_to_back(
                        lambda bb=bb: bb(0, xp, yp, dummy_pos.data_ptr(), inv_t.data_ptr())))
                    print("   equal to plan:", bool(torch.equal(y, ref[pairing])), flush=True)
        print(f"[{time.time() - t0:.0f}s]", flush=True)

    if which in ("all", "decode"):
        del x, y
        torch.cuda.empty_cache()
        dshape = (64, 32, 1, 128)
        dn = 64 * 32 * 128
        positions = torch.randint(0, 4096, (64, 1), device="cuda")
        xs = [torch.randn(dshape, device="cuda") for _ in range(8)]
        ys = [torch.empty_like(v) for v in xs]
        ek = Kernel("empty", empty_kernel, sig(1), register=False)
        eb = ek.bind(1, 32, ((0, 1), (0, 1), (0,)))
        print(f"decode empty kernel {time_spin(lambda: eb(0, xs[0].data_ptr(), 0)):.2f}")
        print(f"decode torch mul    {time_spin(lambda: torch.mul(xs[0], 2.0, out=ys[0])):.2f}")
        inv = (10000.0 ** (-(2.0 * np.arange(64)) / 128)).astype(np.float32)
        inv_t = torch.from_numpy(inv).cuda()
        ck = Kernel("dcopy", flat_copy(1, LD["plain"], ST["plain"]), sig(1), register=False)
        cb = ck.bind(dn // 4 // 256, 256, ((0, dn), (0, dn), (0,)))
        print(f"decode copy 16B     "
              f"{time_spin(lambda: cb(0, xs[0].data_ptr(), ys[0].data_ptr())):.2f}")
        for trig in ("fast", "none"):
            kern = Kernel(f"dflat{trig}", flat_rope(False, 1, LD["plain"], ST["plain"], True,
                                                    trig), RSIG, register=False)
            bb = kern.bind(256, 256, ((0, dn), (0, dn), (0, 64), (0, 64),
                                      (1, 32, 2048, 1, 1, 1, 0, 0)))
            us = time_spin(lambda bb=bb: bb(0, xs[0].data_ptr(), ys[0].data_ptr(),
                                           positions.data_ptr(), inv_t.data_ptr()))
            print(f"decode flat INTERLEAVED table trig={trig} {us:.2f}", flush=True)
        for half in (False, True):
            pairing = RopePairing.HALF_SPLIT if half else RopePairing.INTERLEAVED
            plan = RopePlan.select(RopeDescriptor(*dshape, element=ElementKind.F32,
                                                  pairing=pairing))
            args = RopeArgs(xs[0], ys[0], positions)
            print(f"decode plan {pairing.name} {time_spin(lambda p=plan, a=args: p.run(a)):.2f}")
            torch.cuda.synchronize()
            ref = ys[0].clone()
            ipr = 16 if half else 32
            rows = 64 * 32
            for upt in (1, 2):
                for table in (False, True):
                    kern = Kernel(f"dflat{half}{upt}{table}",
                                  flat_rope(half, upt, LD["plain"], ST["plain"], table), RSIG,
                                  register=False)
                    params = (1, 32, rows, 1, 1, 1, 0, 0)
                    rb = 256 // ipr
                    bb = kern.bind(-(-rows // (rb * upt)), 256,
                                   ((0, dn), (0, dn), (0, 64), (0, 64), params))
                    ys[0].zero_()
                    us = time_spin(lambda bb=bb: bb(0, xs[0].data_ptr(), ys[0].data_ptr(),
                                                   positions.data_ptr(), inv_t.data_ptr()))
                    torch.cuda.synchronize()
                    print(f"decode flat {pairing.name} upt={upt} table={table} {us:.2f} "
                          f"equal {bool(torch.equal(ys[0], ref))}", flush=True)
        print(f"[{time.time() - t0:.0f}s]", flush=True)


def ncu_mode():
    dshape = (64, 32, 1, 128)
    dn = 64 * 32 * 128
    positions = torch.randint(0, 4096, (64, 1), device="cuda")
    x = torch.randn(dshape, device="cuda")
    y = torch.empty_like(x)
    inv = (10000.0 ** (-(2.0 * np.arange(64)) / 128)).astype(np.float32)
    inv_t = torch.from_numpy(inv).cuda()
    plan = RopePlan.select(RopeDescriptor(*dshape, element=ElementKind.F32))
    plan.run(RopeArgs(x, y, positions))
    for table in (False, True):
        kern = Kernel(f"dflat{table}", flat_rope(False, 1, LD["plain"], ST["plain"], table),
                      RSIG, register=False)
        bb = kern.bind(256, 256, ((0, dn), (0, dn), (0, 64), (0, 64),
                                  (1, 32, 2048, 1, 1, 1, 0, 0)))
        bb(0, x.data_ptr(), y.data_ptr(), positions.data_ptr(), inv_t.data_ptr())
    torch.cuda.synchronize()


if __name__ == "__main__":
    if sys.argv[1:] == ["ncu"]:
        ncu_mode()
    else:
        main()
