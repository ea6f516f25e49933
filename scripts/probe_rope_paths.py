"""A/B probe of RoPE's kernel paths on the GPU (issue 6): ``rope_table`` (positions absent,
the plan's cos/sin table), ``rope_tile`` (angles shared by a block through shared memory)
and the ``ROPE_KERNELS`` rows kernels, against torch.compile, in one process.

    python scripts/probe_rope_paths.py [check] [large] [positions] [decode] [diag] [floor]
                                       [params] [ladder]
    ncu -k regex:rope_tile --launch-skip 3 --launch-count 1 python scripts/probe_rope_paths.py ncu

``check`` compares every path bit for bit on a few shapes (in place too); ``large`` /
``positions``: [8, 32, 2048, 128] without / with positions by path; ``decode``: the tile
kernel by heads per block against the rows kernels; ``diag``: the tile kernel with its
angle helpers replaced by constants; ``floor``: Numba copies, carveouts and rope_units
heads per thread at the decode shape; ``params``: parameter-block size and block shape
of a copy; ``ladder``: decode copies that add the tile kernel's grid, rotation and
parameter block one at a time, then the tile kernel launched bound and through ``run``.
Device µs: medians of CUDA-event-timed single calls behind a GPU spin, as in
``scripts/bench.py``. Results: docs/notes/rope.md, sessions 11 and 12 (the session-12
tile variants, ``skeleton``, are in commit 65f0165; the loop-free 32-bit ``rope_table``
variant, ``table32``, in 6c14f69).
"""

from __future__ import annotations

import sys
import types

import torch
from bench import Context, measure_copy_gbps
from bench_rope import DECODE, DTYPES, EAGER, LARGE, tables
from numba import cuda, float32, int64, uint32, uint64
from numba import types as numba_types

from baracuda_numba.arrays import as_mut
from baracuda_numba.driver import function_registers
from baracuda_numba.kernels.rope import (
    ROPE_TABLE_KERNELS,
    ROPE_TILE_KERNELS,
    _flat_c,
    _pack16_f16,
    _rotate_interleaved8,
    _unpack16_f16,
    load16,
    store16,
)
from baracuda_numba.launch import Kernel
from baracuda_numba.plans.rope import (
    RopeArgs,
    RopeBackwardArgs,
    RopeBackwardDescriptor,
    RopeBackwardPlan,
    RopeDescriptor,
    RopePlan,
)
from baracuda_numba.types import ElementKind, RopePairing

PATHS = {"rows": dict(tile=False, angle_table=False), "tile": dict(tile=True, angle_table=False),
         "table": dict(angle_table=True), "pairs": dict(force_pairs=True)}


# Numba 16-byte copies of a decode-sized f32 tensor (the floor a RoPE kernel is held to):
# plain, with a shared-memory write, with a barrier, and with extra parameters.


def copy_flat(x, y, n):
    g = int64(cuda.threadIdx.x) + int64(cuda.blockIdx.x) * int64(cuda.blockDim.x)
    if g < n:
        store16(y, uint64(g * 4), load16(x, uint64(g * 4)))


def copy_smem(x, y, n):
    scratch = cuda.shared.array(1024, float32)
    g = int64(cuda.threadIdx.x) + int64(cuda.blockIdx.x) * int64(cuda.blockDim.x)
    v = load16(x, uint64(min(g, n - 1) * 4))
    scratch[cuda.threadIdx.x] = float32(g)
    if g < n:
        if scratch[cuda.threadIdx.x] < -1.0:
            v = (uint32(0), uint32(0), uint32(0), uint32(0))
        store16(y, uint64(g * 4), v)


def copy_args(x, y, z, n, extra):
    """A barrier between the load and the store; ``z`` and ``extra`` only add parameters
    (a 1-D or 2-D block)."""
    scratch = cuda.shared.array(1024, float32)
    threads = cuda.blockDim.x * cuda.blockDim.y
    t = cuda.threadIdx.y * cuda.blockDim.x + cuda.threadIdx.x
    g = int64(t) + int64(cuda.blockIdx.x) * int64(threads)
    v = load16(x, uint64(min(g, n - 1) * 4))
    scratch[t] = float32(g)
    cuda.syncthreads()
    if g < n:
        if scratch[(t + 1) % threads] < extra[0]:
            v = (uint32(0), uint32(0), uint32(0), uint32(0))
        store16(y, uint64(g * 4), v)


def ladder_grid(x, y, params):
    """A decode tile's copy: grid (s, b, head groups), block (items, heads)."""
    x_b, x_h, x_s, y_b, y_h, y_s, per_block = params
    s = int64(cuda.blockIdx.x)
    b = int64(cuda.blockIdx.y)
    h = int64(cuda.blockIdx.z) * per_block + int64(cuda.threadIdx.y)
    item = int64(cuda.threadIdx.x)
    v = load16(x, uint64((b * x_b + h * x_h + s * x_s + item) * 4))
    store16(y, uint64((b * y_b + h * y_h + s * y_s + item) * 4), v)


@cuda.jit(device=True, inline=True)
def _ladder_rotate_tile(x, y, x_b, x_h, x_s, y_b, y_h, y_s, per_block):
    sins = cuda.local.array(4, float32)
    coss = cuda.local.array(4, float32)
    s = int64(cuda.blockIdx.x)
    b = int64(cuda.blockIdx.y)
    h = int64(cuda.blockIdx.z) * per_block + int64(cuda.threadIdx.y)
    item = int64(cuda.threadIdx.x)
    v = load16(x, uint64((b * x_b + h * x_h + s * x_s + item) * 4))
    for k in range(4):
        sins[k] = float32(0.5) * float32(k)
        coss[k] = float32(0.25)
    store16(y, uint64((b * y_b + h * y_h + s * y_s + item) * 4),
            _pack16_f16(_rotate_interleaved8(_unpack16_f16(v), sins, coss)))


def ladder_rotate(x, y, params):
    """ladder_grid plus the f16 interleaved rotation by constant angles."""
    x_b, x_h, x_s, y_b, y_h, y_s, per_block = params
    _ladder_rotate_tile(x, y, x_b, x_h, x_s, y_b, y_h, y_s, per_block)


def ladder_padded(x, y, z, params, extra):
    """ladder_rotate with the tile kernel's parameter block (3 arrays, 19 int64, 1 f64)."""
    x_b, x_h, x_s, y_b, y_h, y_s, per_block = params[:7]
    _ladder_rotate_tile(x, y, x_b, x_h, x_s, y_b, y_h, y_s, per_block)


def ladder(ctx: Context) -> None:
    """Decode f16 interleaved: from a 1-D copy to the tile kernel, one step at a time,
    every launch bound directly (no plan.run) but the last."""
    batch, heads, seq, dim = DECODE
    units = batch * heads * seq * dim // 8
    sets = 8
    positions = torch.randint(0, 4096, (batch, seq), device="cuda")
    xs = [torch.randn(DECODE, device="cuda", dtype=torch.float16) for _ in range(sets)]
    ys = [torch.empty_like(x) for x in xs]
    stream = torch.cuda.current_stream().cuda_stream
    words = _flat_c(uint32)
    per_block, items = 16, dim // 8
    params = (heads * items, items, items, heads * items, items, items, per_block)
    grid3 = (seq, batch, heads // per_block)
    bounds = {"flat 256": _bound_copy(copy_flat, units)}
    for fn in (ladder_grid, ladder_rotate):
        kernel = Kernel(fn.__name__, fn, (words, words, numba_types.UniTuple(int64, 7)),
                        register=False)
        bounds[fn.__name__] = kernel.bind(grid3, (items, per_block),
                                          ((0, 4 * units), (0, 4 * units), params))
    kernel = Kernel("ladder_padded", ladder_padded,
                    (words, words, _flat_c(int64), numba_types.UniTuple(int64, 19),
                     numba_types.float64), register=False)
    padded = kernel.bind(grid3, (items, per_block),
                         ((0, 4 * units), (0, 4 * units), (0, 64), params + (0,) * 12, 0.5))
    pos_ptr = positions.data_ptr()
    bounds["ladder_padded"] = lambda st, xp, yp, b=padded, pp=pos_ptr: b(st, xp, yp, pp)
    plan = RopePlan.select(RopeDescriptor(*DECODE, element=ElementKind.F16))
    configure(plan, "tile")
    tile_bound = plan._configure_tile(*plan_refs(plan, xs[0], ys[0], positions))
    bounds["tile (bound)"] = lambda st, xp, yp, b=tile_bound, pp=pos_ptr: b(st, xp, yp, pp)
    line = []
    for _ in range(2):
        for label, bound in bounds.items():
            us = ctx.time_gpu(lambda i, b=bound: b(stream, xs[i].data_ptr(), ys[i].data_ptr()),
                              sets=sets, iters=300)
            line.append(f"{label} {us:.2f}")
        args = [RopeArgs(x, y, positions) for x, y in zip(xs, ys)]
        us = ctx.time_gpu(lambda i, a=args: plan.run(a[i]), sets=sets, iters=300)
        line.append(f"tile (plan.run) {us:.2f}")
        us = ctx.time_gpu(lambda i: torch.mul(xs[i], 1.0, out=ys[i]), sets=sets, iters=300)
        line.append(f"torch.mul {us:.2f}")
    print("ladder f16 interleaved decode: " + "; ".join(line), flush=True)


def plan_refs(plan, x, y, positions):
    """The plan's TensorRef views of torch tensors (as ``run`` makes them)."""
    from baracuda_numba.arrays import as_ref

    return (as_ref(x, plan.name, "x"), as_mut(y, plan.name, "y"),
            as_ref(positions, plan.name, "positions"))


def _bound_copy(fn, units: int, block=256, extra: int = 0):
    """``launch(stream, x, y)`` of one of the copies over ``units`` 16-byte units."""
    words = _flat_c(uint32)
    if fn is copy_args:
        signature = (words, words, words, int64, numba_types.UniTuple(int64, extra))
        args = ((0, 4 * units), (0, 4 * units), (0, 0), units, (-1,) * extra)
    else:
        signature, args = (words, words, int64), ((0, 4 * units), (0, 4 * units), units)
    bound = Kernel(f"{fn.__name__}{extra or ''}", fn, signature, register=False).bind(
        -(-units // 256), block, args)
    if fn is copy_args:
        return lambda stream, x, y: bound(stream, x, y, 0)
    return bound


def configure(plan, path: str, **extra) -> None:
    plan.tile, plan.angle_table, plan.force_pairs = None, None, False
    for name, value in {**PATHS[path], **extra}.items():
        setattr(plan, name, value)
    plan.retune()


def check() -> None:
    torch.manual_seed(0)
    shapes = [(3, 13, 37, 144, None), (3, 13, 37, 144, 64), (64, 32, 1, 128, None),
              (2, 32, 300, 128, None), (1, 3, 5, 8, None)]
    bad = 0
    for batch, heads, seq, dim, rotary in shapes:
        shape = (batch, heads, seq, dim)
        for name, element in DTYPES:
            dtype = getattr(torch, name)
            for pairing in RopePairing:
                desc = RopeDescriptor(*shape, element=element, pairing=pairing,
                                      rotary_dim=rotary)
                for inverse in (False, True):
                    for with_pos in (False, True):
                        x = torch.randn(shape, device="cuda", dtype=dtype)
                        pos = (torch.randint(0, 1_000_000, (batch, seq), device="cuda")
                               if with_pos else None)
                        outs = {}
                        for path in PATHS:
                            if path == "table" and with_pos:
                                continue
                            plan = (RopeBackwardPlan.select(RopeBackwardDescriptor.of(desc))
                                    if inverse else RopePlan.select(desc))
                            configure(plan, path)
                            y = torch.full_like(x, float("nan"))
                            args = (RopeBackwardArgs if inverse else RopeArgs)(x, y, pos)
                            xv, yv = as_mut(x, "p", "x"), as_mut(y, "p", "y")
                            want = "rows" if path == "pairs" else path
                            got_path = plan._kernel_path(xv, yv, pos)
                            if got_path != want and not (path == "tile" and got_path == "rows"):
                                print("PATH?", shape, name, pairing, path, got_path)
                            plan.run(args)
                            # in place too
                            z = x.clone()
                            plan.run((RopeBackwardArgs if inverse else RopeArgs)(z, z, pos))
                            torch.cuda.synchronize()
                            outs[path] = y
                            ints = torch.int16 if y.element_size() == 2 else torch.int32
                            if not torch.equal(z.view(ints), y.view(ints)):
                                print("IN-PLACE MISMATCH", shape, name, pairing, path)
                                bad += 1
                        ref = outs["pairs"]
                        for path, y in outs.items():
                            ints = torch.int16 if y.element_size() == 2 else torch.int32
                            if not torch.equal(y.view(ints), ref.view(ints)):
                                diff = (y.float() - ref.float()).abs().max().item()
                                print("MISMATCH", shape, rotary, name, pairing.name, inverse,
                                      with_pos, path, diff)
                                bad += 1
    print(f"check: {bad} mismatches", flush=True)


def registers() -> None:
    regs = []
    for kernels in (ROPE_TABLE_KERNELS, ROPE_TILE_KERNELS):
        for kernel in kernels.values():
            regs.append(f"{kernel.name}: {function_registers(kernel.prepare()._function)}")
    print("registers: " + ", ".join(regs), flush=True)


def large(ctx: Context, compiled: dict, with_positions: bool = False) -> None:
    batch, heads, seq, dim = LARGE
    positions = (torch.randint(0, 4096, (batch, seq), device="cuda") if with_positions
                 else None)
    cos, sin = tables(torch, torch.arange(seq, device="cuda") if positions is None
                      else positions, dim)
    if positions is not None:
        cos, sin = cos[:, None], sin[:, None]
    for name, element in DTYPES:
        dtype = getattr(torch, name)
        moved = 2 * batch * heads * seq * dim * torch.empty((), dtype=dtype).element_size()
        sets = ctx.sets_for(moved)
        xs = [torch.randn(LARGE, device="cuda", dtype=dtype) for _ in range(sets)]
        ys = [torch.empty_like(x) for x in xs]
        for pairing in RopePairing:
            desc = RopeDescriptor(*LARGE, element=element, pairing=pairing)
            line = []
            for inverse in (False, True):
                plan = (RopeBackwardPlan.select(RopeBackwardDescriptor.of(desc)) if inverse
                        else RopePlan.select(desc))
                cls = RopeBackwardArgs if inverse else RopeArgs
                args = [cls(x, y, positions) for x, y in zip(xs, ys)]
                paths = (["rows", "tile"] + [("tile", 4), ("tile", 16)] if with_positions
                         else ["rows", "table"])
                for path in paths:
                    extra = {}
                    if isinstance(path, tuple):
                        path, hpb = path
                        extra = {"tile_heads_per_block": hpb}
                    configure(plan, path, **extra)
                    us = ctx.time_gpu(lambda i, a=args, p=plan: p.run(a[i]), sets=sets)
                    label = path + (f"/hpb{extra['tile_heads_per_block']}" if extra else "")
                    line.append(f"{'bwd' if inverse else 'fwd'} {label} {us:.1f} "
                                f"({100 * moved / us / 1e3 / ctx.copy_gbps:.0f}%)")
                fn = compiled[pairing]
                s = -sin if inverse else sin
                fn(xs[0], cos, s)
                us = ctx.time_gpu(lambda i, f=fn, s=s, xs=xs: f(xs[i], cos, s), sets=sets)
                line.append(f"{'bwd' if inverse else 'fwd'} torch.compile {us:.1f}")
            print(f"large{' pos' if with_positions else ''} {name} {pairing.name.lower()}: "
                  + "; ".join(line), flush=True)
        del xs, ys
        torch.cuda.empty_cache()


def _decode_inputs(dtype, positions, sets: int) -> tuple[list, list, object, object]:
    """Input and output sets of the decode shape, and the cos/sin tables torch.compile
    is given for ``positions`` [B, 1]."""
    xs = [torch.randn(DECODE, device="cuda", dtype=dtype) for _ in range(sets)]
    ys = [torch.empty_like(x) for x in xs]
    cos, sin = tables(torch, positions, DECODE[3])
    return xs, ys, cos[:, None], sin[:, None]


def decode(ctx: Context, compiled: dict) -> None:
    batch, heads, seq, dim = DECODE
    positions = torch.randint(0, 4096, (batch, seq), device="cuda")
    sets = 8
    for name, element in DTYPES:
        xs, ys, cos, sin = _decode_inputs(getattr(torch, name), positions, sets)
        for pairing in RopePairing:
            desc = RopeDescriptor(*DECODE, element=element, pairing=pairing)
            plan = RopePlan.select(desc)
            args = [RopeArgs(x, y, positions) for x, y in zip(xs, ys)]
            line = []
            for _ in range(2):
                for path, hpb in (("rows", None), ("tile", None), ("tile", 4), ("tile", 16),
                                  ("tile", 32)):
                    configure(plan, path, tile_heads_per_block=hpb)
                    us = ctx.time_gpu(lambda i, a=args, p=plan: p.run(a[i]), sets=sets,
                                      iters=200)
                    line.append(f"{path}{'' if hpb is None else f'/hpb{hpb}'} {us:.2f}")
                fn = compiled[pairing]
                fn(xs[0], cos, sin)
                us = ctx.time_gpu(lambda i, f=fn, xs=xs, c=cos, s=sin: f(xs[i], c, s), sets=sets,
                                  iters=200)
                line.append(f"torch.compile {us:.2f}")
                us = ctx.time_gpu(lambda i, xs=xs, ys=ys: torch.mul(xs[i], 1.0, out=ys[i]),
                                  sets=sets, iters=200)
                line.append(f"torch.mul {us:.2f}")
            print(f"decode {name} {pairing.name.lower()}: " + "; ".join(line), flush=True)


def _patched_tile(element, layout, **globals_):
    """rope_tile with some of its device helpers replaced (diagnostics: what costs)."""
    from baracuda_numba.kernels import rope as kr
    from baracuda_numba.launch import Kernel

    unpack, pack, elements = kr.ROPE_UNIT_TABLE[element]
    body = kr._make_rope_tile_kernel(kr.ROPE_UNIT_LAYOUTS[layout], elements, unpack, pack)
    patched = types.FunctionType(body.__code__, {**body.__globals__, **globals_},
                                 body.__name__, body.__defaults__, body.__closure__)
    tile = kr.ROPE_TILE_KERNELS[(element, layout)]
    return Kernel(tile.name + "/diag" + ",".join(globals_), patched, tile.signature,
                  register=False).prepare()


def diag(ctx: Context) -> None:
    from numba import float64

    @cuda.jit(device=True, inline=True)
    def cheap_inv_freq(pair, freq_exponent):
        return float64(pair) * 0.001 + 0.5

    @cuda.jit(device=True, inline=True)
    def no_trig(pos, inv_freq, inverse):
        t = float32(pos) * float32(inv_freq) * float32(1e-9)
        return t, float32(1.0) - t

    batch, heads, seq, dim = DECODE
    positions = torch.randint(0, 4096, (batch, seq), device="cuda")
    sets = 8
    for name, element in DTYPES[::2]:
        dtype = getattr(torch, name)
        xs = [torch.randn(DECODE, device="cuda", dtype=dtype) for _ in range(sets)]
        ys = [torch.empty_like(x) for x in xs]
        for pairing in RopePairing:
            plan = RopePlan.select(RopeDescriptor(*DECODE, element=element, pairing=pairing))
            layout = "half_split_16B" if pairing is RopePairing.HALF_SPLIT else "interleaved_16B"
            default = plan._tile_kernels[layout]
            variants = {"tile": default,
                        "noexp2": _patched_tile(element, layout, rope_inv_freq=cheap_inv_freq),
                        "notrig": _patched_tile(element, layout, rope_sincos32=no_trig),
                        "neither": _patched_tile(element, layout, rope_inv_freq=cheap_inv_freq,
                                                 rope_sincos32=no_trig)}
            line = []
            for label, kernel in variants.items():
                plan._tile_kernels[layout] = kernel
                for with_pos in (True, False):
                    configure(plan, "tile")
                    args = [RopeArgs(x, y, positions if with_pos else None)
                            for x, y in zip(xs, ys)]
                    us = ctx.time_gpu(lambda i, a=args, p=plan: p.run(a[i]), sets=sets,
                                      iters=200)
                    line.append(f"{label}{'' if with_pos else '/nopos'} {us:.2f}")
            plan._tile_kernels[layout] = default
            print(f"diag decode {name} {pairing.name.lower()}: " + "; ".join(line), flush=True)


def floor(ctx: Context, compiled: dict) -> None:
    """Decode: what shared memory and a barrier cost (Numba copies), the tile kernel with
    each carveout preference, rope_units by heads per thread, against torch.mul and
    torch.compile."""
    from baracuda_numba.driver import libcuda

    batch, heads, seq, dim = DECODE
    n = batch * heads * seq * dim // 4  # f32 16-byte units
    sets = 8
    xs = [torch.randn(DECODE, device="cuda") for _ in range(sets)]
    ys = [torch.empty_like(x) for x in xs]
    stream = torch.cuda.current_stream().cuda_stream
    line = []
    for fn, label in ((copy_flat, "plain"), (copy_smem, "shared memory"),
                      (copy_args, "barrier")):
        bound = _bound_copy(fn, n, extra=1)
        us = ctx.time_gpu(lambda i, b=bound: b(stream, xs[i].data_ptr(), ys[i].data_ptr()),
                          sets=sets, iters=200)
        line.append(f"{label} {us:.2f}")
    us = ctx.time_gpu(lambda i: torch.mul(xs[i], 1.0, out=ys[i]), sets=sets, iters=200)
    line.append(f"torch.mul {us:.2f}")
    print("floor f32 decode copies: " + "; ".join(line), flush=True)
    positions = torch.randint(0, 4096, (batch, seq), device="cuda")
    for name, element in DTYPES:
        xs, ys, cos, sin = _decode_inputs(getattr(torch, name), positions, sets)
        for pairing in RopePairing:
            plan = RopePlan.select(RopeDescriptor(*DECODE, element=element, pairing=pairing))
            args = [RopeArgs(x, y, positions) for x, y in zip(xs, ys)]
            layout = "half_split_16B" if pairing is RopePairing.HALF_SPLIT else "interleaved_16B"
            default = plan._tile_kernels[layout]
            line = []

            def timed(label, plan=plan, args=args, line=line):
                us = ctx.time_gpu(lambda i: plan.run(args[i]), sets=sets, iters=200)
                line.append(f"{label} {us:.2f}")

            configure(plan, "tile")
            timed("tile")
            for carveout in (0, 50, 100):
                libcuda().cuFuncSetAttribute(default._function, 9, carveout)
                configure(plan, "tile")
                timed(f"tile/carveout{carveout}")
            libcuda().cuFuncSetAttribute(default._function, 9, -1)
            for hpt in (1, 2, 4):
                configure(plan, "rows", unit_heads_per_thread=hpt, units16=True)
                timed(f"units/hpt{hpt}")
            plan.units16 = None
            fn = compiled[pairing]
            fn(xs[0], cos, sin)
            us = ctx.time_gpu(lambda i, f=fn, xs=xs, c=cos, s=sin: f(xs[i], c, s), sets=sets,
                              iters=200)
            line.append(f"torch.compile {us:.2f}")
            print(f"floor {name} {pairing.name.lower()}: " + "; ".join(line), flush=True)


def params(ctx: Context) -> None:
    """Decode-sized 16-byte copy: does the kernel's parameter block size cost launch time?
    (Numba passes 7 slots per array; the tile kernel has 41 slots.)"""
    batch, heads, seq, dim = DECODE
    n = batch * heads * seq * dim // 4
    sets = 8
    xs = [torch.randn(DECODE, device="cuda") for _ in range(sets)]
    ys = [torch.empty_like(x) for x in xs]
    stream = torch.cuda.current_stream().cuda_stream
    line = []
    for _ in range(2):
        for count in (1, 8, 20, 40, 80):
            for block in ((256, 1), (32, 8)):
                bound = _bound_copy(copy_args, n, block, count)
                us = ctx.time_gpu(lambda i, b=bound: b(stream, xs[i].data_ptr(),
                                                      ys[i].data_ptr()),
                                  sets=sets, iters=200)
                line.append(f"{count} ints {block}: {us:.2f}")
        us = ctx.time_gpu(lambda i: torch.mul(xs[i], 1.0, out=ys[i]), sets=sets, iters=200)
        line.append(f"torch.mul {us:.2f}")
    print("params: " + "; ".join(line), flush=True)


def ncu_run() -> None:
    """Six launches each of the decode tile kernel (f32 interleaved), a Numba 16-byte copy
    with a barrier and torch.compile's kernel, for ``ncu`` (filter one kernel name per ncu
    run: ``-k regex:rope_tile --launch-skip 3 --launch-count 1``)."""
    batch, heads, seq, dim = DECODE
    positions = torch.randint(0, 4096, (batch, seq), device="cuda")
    x = torch.randn(DECODE, device="cuda")
    y = torch.empty_like(x)
    cos, sin = tables(torch, positions, dim)
    cos, sin = cos[:, None], sin[:, None]
    plan = RopePlan.select(RopeDescriptor(*DECODE, element=ElementKind.F32))
    configure(plan, "tile")
    fn = torch.compile(EAGER[RopePairing.INTERLEAVED])
    bound = _bound_copy(copy_args, x.numel() // 4, extra=1)
    stream = torch.cuda.current_stream().cuda_stream
    for _ in range(6):
        plan.run(RopeArgs(x, y, positions))
        fn(x, cos, sin)
        bound(stream, x.data_ptr(), y.data_ptr())
    torch.cuda.synchronize()


def main() -> None:
    parts = sys.argv[1:] or ["check", "decode", "positions"]
    if parts == ["ncu"]:
        ncu_run()
        return
    if "check" in parts:
        check()
    registers()
    ctx = Context("rope", torch)
    ctx.copy_gbps = measure_copy_gbps(torch)
    print(f"copy {ctx.copy_gbps:.0f} GB/s, {torch.cuda.get_device_name()}", flush=True)
    compiled = {pairing: torch.compile(fn) for pairing, fn in EAGER.items()}
    if "decode" in parts:
        decode(ctx, compiled)
    if "diag" in parts:
        diag(ctx)
    if "ladder" in parts:
        ladder(ctx)
    if "floor" in parts:
        floor(ctx, compiled)
    if "params" in parts:
        params(ctx)
    if "large" in parts:
        large(ctx, compiled)
    if "positions" in parts:
        large(ctx, compiled, with_positions=True)



if __name__ == "__main__":
    main()
