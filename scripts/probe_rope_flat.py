"""Probe (GPU, issue 6): lean flat ``rope_table`` variants for contiguous interleaved x / y
against the plan's ``rope_table`` and torch.compile, and torch.compile of the formula
with the angles computed from the positions.

    python scripts/probe_rope_flat.py [flat] [formula] [float16] [rounds]

``flat``: [8, 32, 2048, 128] interleaved, f32 and bf16 (and f16 with ``float16``), forward:
the plan's ``rope_flat`` and ``rope_table`` (two planes per thread), probe kernels with one
16-byte unit per thread and one table read per unit (no loop, 32-bit offsets) without and
with L2 eviction hints (the table ``evict_last``; x ``evict_last`` or y ``evict_first``),
and torch.compile with precomputed cos/sin, all into the same outputs, timed alternately
call by call (``Context.time_gpu_many``); each output checked against torch.compile's.
``formula``: torch.compile of the whole formula (inv_freq, θ = pos · inv_freq, cos, sin,
the rotation) at the decode shape with positions [B, 1] and at the large shape without
positions (pos = s), against the plans and torch.compile with precomputed cos/sin.
Scratch code, not part of the package or its tests.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
from bench import Context, measure_copy_gbps
from bench_rope import DECODE, DTYPES, EAGER, LARGE, formula, tables
from llvmlite import ir
from numba import cuda, int64, types, uint32, uint64
from numba.cuda.extending import intrinsic

from baracuda_numba.kernels.common import f32_from_bits
from baracuda_numba.kernels.rope import (
    _address,
    _flat_c,
    _pack16_bf16,
    _pack16_f16,
    _pack16_f32,
    _rotate_interleaved4,
    _rotate_interleaved8,
    _unpack16_bf16,
    _unpack16_f16,
    _unpack16_f32,
    load16,
    load16_last,
    store16,
)
from baracuda_numba.launch import Kernel
from baracuda_numba.plans.rope import RopeArgs, RopeDescriptor, RopePlan
from baracuda_numba.types import RopePairing

BLOCK = 256


@intrinsic
def store16_first(typingctx, array, index, words):
    """``store16`` with an L2 ``evict_first`` policy (probe only)."""
    def codegen(context, builder, sig, args):
        word = ir.IntType(32)
        values = [context.cast(builder, builder.extract_value(args[2], i), sig.args[2][i],
                               uint32) for i in range(4)]
        fnty = ir.FunctionType(ir.VoidType(), [ir.IntType(64)] + [word] * 4)
        asm = ir.InlineAsm(fnty, "{ .reg .b64 p; createpolicy.fractional.L2::evict_first.b64 "
                           "p, 1.0; st.global.L2::cache_hint.v4.u32 [$0], {$1, $2, $3, $4}, "
                           "p; }", "l,r,r,r,r", side_effect=True)
        address = _address(context, builder, sig.args[0], args[0], sig.args[1], args[1])
        builder.call(asm, [address] + values)
        return context.get_dummy_value()
    return types.void(array, index, words), codegen


#: variant -> (table load, x load, y store)
HINTS = {"plain": (load16, load16, store16),
         "table evict_last": (load16_last, load16, store16),
         "table and x evict_last": (load16_last, load16_last, store16),
         "table evict_last, y evict_first": (load16_last, load16, store16_first)}


def _make_flat(pairs: int, unpack: Any, pack: Any, rotate: Any, hints: tuple[Any, ...],
               label: str) -> Any:
    table_load, x_load, y_store = hints

    def rope_flat(x, y, table, params):
        """Unit u = (row, item) of a contiguous [B, H, S, D] tensor; s = row % S; table
        word of the item's first pair: 2 (s R/2 + item pairs)."""
        units, items_log, seq_len = params
        u = uint32(cuda.blockIdx.x) * uint32(BLOCK) + uint32(cuda.threadIdx.x)
        sins = cuda.local.array(pairs, types.float32)
        coss = cuda.local.array(pairs, types.float32)
        if u < units:
            v = x_load(x, uint64(u) * uint64(4))
            row = u >> uint32(items_log)
            item = u & uint32((1 << items_log) - 1)
            s = row % uint32(seq_len)
            word = uint32(2) * (s * uint32(pairs << items_log) + item * uint32(pairs))
            for j in range(pairs // 2):
                t = table_load(table, uint64(word + uint32(4 * j)))
                coss[2 * j] = f32_from_bits(t[0])
                sins[2 * j] = f32_from_bits(t[1])
                coss[2 * j + 1] = f32_from_bits(t[2])
                sins[2 * j + 1] = f32_from_bits(t[3])
            y_store(y, uint64(u) * uint64(4), pack(rotate(unpack(v), sins, coss)))

    words = _flat_c(uint32)
    return Kernel(f"rope_flat_probe[{pairs},{label}]", rope_flat,
                  (words, words, words, types.UniTuple(int64, 3)), register=False)


FLAT = {(name, label): _make_flat(pairs, unpack, pack, rotate, hints, label)
        for name, pairs, unpack, pack, rotate in (
            ("float32", 2, _unpack16_f32, _pack16_f32, _rotate_interleaved4),
            ("bfloat16", 4, _unpack16_bf16, _pack16_bf16, _rotate_interleaved8),
            ("float16", 4, _unpack16_f16, _pack16_f16, _rotate_interleaved8))
        for label, hints in HINTS.items()}


def flat(ctx: Context, compiled: dict, rounds: int) -> None:
    seq, dim = LARGE[2], LARGE[3]
    cos, sin = tables(torch, torch.arange(seq, device="cuda"), dim)  # [S, D/2]
    table = torch.stack((cos, sin), -1).contiguous()  # [S, D/2, (cos, sin)]
    for name, element in DTYPES:
        if name != "float16" or "float16" in sys.argv:
            _flat_row(ctx, name, element, compiled[RopePairing.INTERLEAVED], cos, sin, table,
                      rounds)


def _flat_row(ctx: Context, name: str, element: Any, fn: Any, cos: Any, sin: Any, table: Any,
              rounds: int) -> None:
    """Every variant reads the same x sets and writes the same y sets (where y lies moves
    these rows by a few per cent)."""
    stream = torch.cuda.current_stream().cuda_stream
    dtype = getattr(torch, name)
    sets = 2
    xs = [torch.randn(LARGE, device="cuda", dtype=dtype) for _ in range(sets)]
    ys = [torch.empty_like(x) for x in xs]
    desc = RopeDescriptor(*LARGE, element=element, pairing=RopePairing.INTERLEAVED)
    flat_plan, planes_plan = RopePlan.select(desc), RopePlan.select(desc)
    planes_plan.table_flat = False
    fns = {"plan (rope_flat)": lambda i: flat_plan.run(RopeArgs(xs[i], ys[i])),
           "plan (rope_table)": lambda i: planes_plan.run(RopeArgs(xs[i], ys[i]))}
    units = xs[0].numel() * xs[0].element_size() // 16
    items = LARGE[3] * xs[0].element_size() // 16
    grid = -(-units // BLOCK)
    for label in HINTS:
        def run(i: int, k: Any = FLAT[(name, label)]) -> None:
            k.launch(grid, BLOCK, stream, ((xs[i].data_ptr(), units * 4),
                                           (ys[i].data_ptr(), units * 4),
                                           (table.data_ptr(), table.numel()),
                                           (units, items.bit_length() - 1, LARGE[2])))
        fns[f"flat, {label}"] = run
    fns["torch.compile"] = lambda i: fn(xs[i], cos, sin)
    want = [fn(x, cos, sin).float() for x in xs]
    for label, f in fns.items():
        f(0)
        f(1)
        torch.cuda.synchronize()
        if label != "torch.compile":
            err = max(float((y.float() - w).abs().max()) for y, w in zip(ys, want))
            print(f"  {name} {label}: max |diff| vs torch.compile {err:.3g}", flush=True)
    moved = 2 * xs[0].numel() * xs[0].element_size()
    for _ in range(rounds):
        times = ctx.time_gpu_many(list(fns.values()), sets=sets, iters=100)
        print(f"flat {name} interleaved fwd µs: " + ", ".join(
            f"{label} {us:.2f} ({moved / us / 1e3 / ctx.copy_gbps:.1%})" for label, us in
            zip(fns, times)), flush=True)


def formulas(ctx: Context, rounds: int) -> None:
    positions = torch.randint(0, 4096, (DECODE[0], DECODE[2]), device="cuda")
    for shape, pos, names in ((DECODE, positions, [n for n, _ in DTYPES]),
                              (LARGE, None, ["float32", "bfloat16"])):
        for name, element in DTYPES:
            if name in names:
                for pairing in RopePairing:
                    _formula_row(ctx, shape, pos, name, element, pairing, rounds)


def _formula_row(ctx: Context, shape: tuple[int, ...], pos: Any, name: str, element: Any,
                 pairing: Any, rounds: int) -> None:
    sets = 8 if shape == DECODE else 2
    dtype = getattr(torch, name)
    xs = [torch.randn(shape, device="cuda", dtype=dtype) for _ in range(sets)]
    ys = [torch.empty_like(x) for x in xs]
    plan = RopePlan.select(RopeDescriptor(*shape, element=element, pairing=pairing))
    whole = torch.compile(formula(pairing))
    cos, sin = tables(torch, pos if pos is not None
                      else torch.arange(shape[2], device="cuda"), shape[3])
    if pos is not None:
        cos, sin = cos[:, None], sin[:, None]
    eager = torch.compile(EAGER[pairing])
    fns = [lambda i: plan.run(RopeArgs(xs[i], ys[i], pos)), lambda i: whole(xs[i], pos),
           lambda i: eager(xs[i], cos, sin)]
    for f in fns:
        f(0)
    torch.cuda.synchronize()
    err = float((whole(xs[0], pos).float() - ys[0].float()).abs().max())
    line = []
    for _ in range(rounds):
        ours, theirs, tabled = ctx.time_gpu_many(fns, sets=sets, iters=100)
        line.append(f"plan {ours:.2f}, torch.compile formula {theirs:.2f} "
                    f"({theirs / ours:.2f}x), torch.compile with tables "
                    f"{tabled:.2f} ({tabled / ours:.2f}x)")
    print(f"formula {list(shape)} {name} {pairing.name.lower()} fwd (max |diff| "
          f"{err:.3g}): " + "; ".join(line), flush=True)


def main() -> None:
    parts = [p for p in sys.argv[1:] if not p.isdigit() and p != "float16"] or ["flat",
                                                                                 "formula"]
    rounds = next((int(p) for p in sys.argv[1:] if p.isdigit()), 2)
    ctx = Context("rope", torch)
    ctx.copy_gbps = measure_copy_gbps(torch)
    print(f"copy {ctx.copy_gbps:.0f} GB/s, {torch.cuda.get_device_name()}", flush=True)
    if "flat" in parts:
        flat(ctx, {p: torch.compile(fn) for p, fn in EAGER.items()}, rounds)
    if "formula" in parts:
        formulas(ctx, rounds)


if __name__ == "__main__":
    main()
