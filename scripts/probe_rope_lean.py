"""Probe (GPU): the decode tile kernel with a lean parameter block.

``scripts/probe_rope_paths.py ladder`` found that a decode-sized copy kernel given
``rope_tile``'s parameter block (3 Numba arrays of 7 slots each, 19 int64, an f64: about
300 bytes) takes 0.1 µs longer than with a small one. This probe builds ``rope_tile``'s
body with raw addresses (u64) in place of the arrays and int32 fields (about 90 bytes),
loads and stores through inline PTX at those addresses, and times it against the plan's
``rope_tile``, torch.compile (cos / sin gathered at the positions outside the call) and a
copy of the same bytes, alternately, at the decode shape with positions; the lean kernel's
output must equal the plan's bit for bit:

    PYTHONPATH=.:scripts python scripts/probe_rope_lean.py [rounds]
"""

from __future__ import annotations

import sys

import torch
from bench import Context, measure_copy_gbps
from bench_rope import DECODE, DTYPES, EAGER, tables
from llvmlite import ir
from numba import cuda, float32, float64, int32, int64, types, uint32, uint64
from numba.cuda.extending import intrinsic

from baracuda_numba.arrays import as_mut, as_ref
from baracuda_numba.kernels import rope as kr
from baracuda_numba.plans.rope import (
    RopeArgs,
    RopeDescriptor,
    RopePlan,
    _positions_args,
    _unit_views,
)
from baracuda_numba.types import RopePairing

WORDS4 = types.UniTuple(uint32, 4)
FIELDS = 15  # int32 parameter fields
TILE_PAIRS = kr.TILE_MAX_PAIRS


@intrinsic
def ld16(typingctx, address):
    """``ld.global.v4.u32`` at a raw address."""

    def codegen(context, builder, signature, args):
        word = ir.IntType(32)
        fnty = ir.FunctionType(ir.LiteralStructType([word] * 4), [ir.IntType(64)])
        asm = ir.InlineAsm(fnty, "ld.global.v4.u32 {$0, $1, $2, $3}, [$4];",
                           "=r,=r,=r,=r,l", side_effect=True)
        loaded = builder.call(asm, [args[0]])
        return context.make_tuple(builder, WORDS4,
                                  [builder.extract_value(loaded, i) for i in range(4)])

    return WORDS4(address), codegen


@intrinsic
def st16(typingctx, address, words):
    """``st.global.v4.u32`` of four 32-bit words at a raw address."""

    def codegen(context, builder, signature, args):
        values = [context.cast(builder, builder.extract_value(args[1], i),
                               signature.args[1][i], types.uint32) for i in range(4)]
        word = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [ir.IntType(64)] + [word] * 4)
        asm = ir.InlineAsm(fnty, "st.global.v4.u32 [$0], {$1, $2, $3, $4};", "l,r,r,r,r",
                           side_effect=True)
        builder.call(asm, [args[0]] + values)
        return context.get_dummy_value()

    return types.void(address, words), codegen


@intrinsic
def ld64(typingctx, address):
    """``ld.global.s64`` at a raw address."""

    def codegen(context, builder, signature, args):
        fnty = ir.FunctionType(ir.IntType(64), [ir.IntType(64)])
        asm = ir.InlineAsm(fnty, "ld.global.s64 $0, [$1];", "=l,l", side_effect=True)
        return builder.call(asm, [args[0]])

    return int64(address), codegen


def make_lean(half: bool, elements: int, unpack, pack):  # noqa: ANN001, ANN201
    pairs = elements if half else elements // 2
    if half:
        rotate = kr._rotate_half8 if elements == 8 else kr._rotate_half4
    else:
        rotate = kr._rotate_interleaved8 if elements == 8 else kr._rotate_interleaved4

    def rope_lean(x_addr, y_addr, pos_addr, params, freq_exponent):
        (num_heads, heads_per_block, rot_items, partner, copy_offset, x_b, x_h, x_s, y_b,
         y_h, y_s, pos_b, pos_s, flags, rotary_dim) = params
        has_positions = (flags & 1) != 0
        inverse = (flags & 2) != 0
        shared_sin = cuda.shared.array(TILE_PAIRS, float32)
        shared_cos = cuda.shared.array(TILE_PAIRS, float32)
        sins = cuda.local.array(pairs, float32)
        coss = cuda.local.array(pairs, float32)
        item = int32(cuda.threadIdx.x)
        thread = int32(cuda.threadIdx.y) * int32(cuda.blockDim.x) + item
        threads = int32(cuda.blockDim.x) * int32(cuda.blockDim.y)
        half_rotary = rotary_dim // 2
        rotating = item < rot_items
        unit = item if rotating else copy_offset + item - rot_items
        unit_partner = partner if rotating else 0
        s = int32(cuda.blockIdx.x)
        b = int32(cuda.blockIdx.y)
        h = int32(cuda.blockIdx.z) * heads_per_block + int32(cuda.threadIdx.y)
        active = h < num_heads
        h = min(h, num_heads - 1)
        x_unit = b * x_b + h * x_h + s * x_s + unit
        first = ld16(x_addr + uint64(x_unit) * uint64(16))
        second = ld16(x_addr + uint64(x_unit + unit_partner) * uint64(16)) if half else first
        y_unit = b * y_b + h * y_h + s * y_s + unit
        if thread < half_rotary:
            pos = ld64(pos_addr + uint64(b * pos_b + s * pos_s) * uint64(8)) \
                if has_positions else int64(s)
            pair = thread
            while pair < half_rotary:
                sin_t, cos_t = kr.rope_sincos32(pos, kr.rope_inv_freq(int64(pair),
                                                                      freq_exponent), inverse)
                shared_sin[pair] = sin_t
                shared_cos[pair] = cos_t
                pair += threads
        cuda.syncthreads()
        if active and rotating:
            for k in range(pairs):
                sins[k] = shared_sin[item * pairs + k]
                coss[k] = shared_cos[item * pairs + k]
            if half:
                ya, yb = rotate(unpack(first), unpack(second), sins, coss)
                st16(y_addr + uint64(y_unit) * uint64(16), pack(ya))
                st16(y_addr + uint64(y_unit + partner) * uint64(16), pack(yb))
            else:
                st16(y_addr + uint64(y_unit) * uint64(16), pack(rotate(unpack(first), sins,
                                                                       coss)))
        elif active:
            st16(y_addr + uint64(y_unit) * uint64(16), first)

    return rope_lean


SIGNATURE = (uint64, uint64, uint64, types.UniTuple(int32, FIELDS), float64)


def _row(ctx, compiled, stream, positions, xs, name, element, pairing, rounds) -> None:  # noqa: ANN001
    """Time the tile kernel, the lean kernel, torch.compile and copy_ for one row."""
    batch, heads, seq, dim = DECODE
    unpack, pack, elements = kr.ROPE_UNIT_TABLE[element]
    ys = [torch.empty_like(x) for x in xs]
    lean_ys = [torch.empty_like(x) for x in xs]
    copies = [torch.empty_like(x) for x in xs]
    half = pairing is RopePairing.HALF_SPLIT
    kernel = cuda.jit(SIGNATURE)(make_lean(half, elements, unpack, pack))
    plan = RopePlan.select(RopeDescriptor(*DECODE, element=element, pairing=pairing))
    x_ref, y_ref = as_ref(xs[0], plan.name, "x"), as_mut(ys[0], plan.name, "y")
    width, _layout, rot_items, items, partner = plan._unit_items(x_ref, y_ref)
    per_block = plan._tile_heads_per_block(items)
    _extent, pos_b, pos_s, has_pos = _positions_args(as_ref(positions, plan.name,
                                                            "positions"))
    _xw, _yw, x_strides, y_strides = _unit_views(x_ref, y_ref, width)
    params = tuple(int(v) for v in (
        (heads, per_block, rot_items, partner, plan._rotary // width) + x_strides
        + y_strides + (pos_b, pos_s, int(has_pos) | 2 * int(plan._inverse), plan._rotary)))
    launch = kernel[(seq, batch, -(-heads // per_block)), (items, per_block), stream]
    pos_ptr = positions.data_ptr()
    cos, sin = tables(torch, positions, dim)
    cos, sin = cos[:, None], sin[:, None]
    fn = compiled[pairing]
    args = [RopeArgs(x, y, positions) for x, y in zip(xs, ys)]
    fns = [lambda i: plan.run(args[i]),
           lambda i: launch(xs[i].data_ptr(), lean_ys[i].data_ptr(), pos_ptr, params,
                            plan._freq_exponent),
           lambda i: fn(xs[i], cos, sin),
           lambda i: copies[i].copy_(xs[i])]
    for f in fns:
        f(0)
    torch.cuda.synchronize()
    same = torch.equal(ys[0].view(torch.uint8), lean_ys[0].view(torch.uint8))
    line = []
    for _ in range(rounds):
        times = ctx.time_gpu_many(fns, sets=len(xs), iters=200)
        line.append(" ".join(f"{label} {us:.2f}" for label, us in zip(
            ("tile", "lean", "torch.compile", "copy_"), times)))
    print(f"decode {name} {pairing.name.lower()} (bits {'equal' if same else 'DIFFER'}): "
          + "; ".join(line), flush=True)


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    ctx = Context("rope", torch)
    ctx.copy_gbps = measure_copy_gbps(torch)
    print(f"copy {ctx.copy_gbps:.0f} GB/s, {torch.cuda.get_device_name()}", flush=True)
    compiled = {pairing: torch.compile(fn) for pairing, fn in EAGER.items()}
    stream = cuda.external_stream(torch.cuda.current_stream().cuda_stream)
    positions = torch.randint(0, 4096, (DECODE[0], DECODE[2]), device="cuda")
    for name, element in DTYPES:
        xs = [torch.randn(DECODE, device="cuda", dtype=getattr(torch, name))
              for _ in range(8)]
        for pairing in RopePairing:
            _row(ctx, compiled, stream, positions, xs, name, element, pairing, rounds)


if __name__ == "__main__":
    main()
