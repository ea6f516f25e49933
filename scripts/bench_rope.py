"""Benchmark section ``rope``: RopePlan / RopeBackwardPlan against PyTorch.

Large shape [8, 32, 2048, 128] (f16/bf16/f32 x both pairings x forward/backward): bytes
moved = x read once + y written once (the plan's 1 MB cos/sin table, read from L2, is not
counted); % of the copy ceiling measured in the same run;
compared with ``torch.compile`` (default mode) of the eager formula with precomputed
cos/sin tables (the usual model code), and with that formula run eagerly.
Decode shape [64, 32, 1, 128] with positions [64, 1]: device time and host time per
``run`` against the host time of one PyTorch elementwise op (``torch.add(a, a, out=b)``);
the torch column is torch.compile given cos/sin already gathered at the positions, and a
note gives torch.compile of the whole formula (the angles computed from the positions in
the call, as the plans do).
"""

from __future__ import annotations

import os
from typing import Any

from baracuda_numba.plans.rope import (
    RopeArgs,
    RopeBackwardArgs,
    RopeBackwardDescriptor,
    RopeBackwardPlan,
    RopeDescriptor,
    RopePlan,
)
from baracuda_numba.types import ElementKind, RopePairing

LARGE = (8, 32, 2048, 128)
DECODE = (64, 32, 1, 128)
BASE = 10000.0
DTYPES = (("float16", ElementKind.F16), ("bfloat16", ElementKind.BF16),
          ("float32", ElementKind.F32))


def rope_interleaved(x: Any, cos: Any, sin: Any) -> Any:
    import torch

    xf = x.float()
    a, b = xf[..., 0::2], xf[..., 1::2]
    return torch.stack((a * cos - b * sin, b * cos + a * sin), -1).flatten(-2).to(x.dtype)


def rope_half_split(x: Any, cos: Any, sin: Any) -> Any:
    import torch

    xf = x.float()
    half = xf.shape[-1] // 2
    a, b = xf[..., :half], xf[..., half:]
    return torch.cat((a * cos - b * sin, b * cos + a * sin), -1).to(x.dtype)


EAGER = {RopePairing.INTERLEAVED: rope_interleaved, RopePairing.HALF_SPLIT: rope_half_split}


def formula(pairing: RopePairing) -> Any:
    """The whole RoPE formula from the positions (the angles computed in the timed call,
    as the plans do): ``f(x, positions)``, positions [B, S] or None (pos = s)."""
    eager = EAGER[pairing]

    def rope_formula(x: Any, positions: Any) -> Any:
        import torch

        dim = x.shape[-1]
        pairs = torch.arange(dim // 2, device=x.device, dtype=torch.float64)
        inv_freq = (BASE ** (-(2.0 * pairs) / dim)).float()
        if positions is None:
            theta = torch.arange(x.shape[2], device=x.device).float()[:, None] * inv_freq
        else:
            theta = (positions.float()[..., None] * inv_freq)[:, None]
        return eager(x, theta.cos(), theta.sin())

    return rope_formula


def tables(torch: Any, positions: Any, dim: int) -> tuple[Any, Any]:
    """cos/sin [..., D/2] in f32 from an f64-rounded inv_freq (the kernel's convention)."""
    pairs = torch.arange(dim // 2, device="cuda", dtype=torch.float64)
    inv_freq = (BASE ** (-(2.0 * pairs) / dim)).float()
    theta = positions.float()[..., None] * inv_freq
    return theta.cos(), theta.sin()


def _row(ctx: Any, *args: Any) -> None:
    """ctx.row, echoed to stdout (a run cut short still shows the rows measured so far)."""
    ctx.row(*args)
    row = ctx.rows[-1]
    print(f"  {row['case']} {row['dtype']}: {row['us']:.2f} µs, torch {row['torch_us']}, "
          f"{row['note']}", flush=True)


def _note(ctx: Any, text: str) -> None:
    ctx.notes.append(text)
    print(f"  note: {text}", flush=True)


def bench(ctx: Any) -> None:
    import rope_qk_rows  # scripts/: the q+k and KV-cache rows

    torch = ctx.torch
    compiled = {}
    for pairing, fn in EAGER.items():
        try:
            compiled[pairing] = torch.compile(fn)
        except Exception as exc:  # record, keep going
            _note(ctx, f"torch.compile({fn.__name__}) failed: {exc!r}")
    parts = {"large": lambda: _large(ctx, torch, compiled),
             "decode": lambda: _decode(ctx, torch, compiled),
             "host": lambda: _host_breakdown(ctx, torch),
             "tuning": lambda: _tuning(ctx, torch),
             # q and k in one call, and the fused KV-cache append (issue 55)
             "qk": lambda: rope_qk_rows.qk(ctx, _row, _note),
             "cache": lambda: rope_qk_rows.cache(ctx, _row, _note)}
    # e.g. "decode" or "decode,large": those parts, in that order
    only = os.environ.get("ROPE_BENCH_ONLY", "")
    default = [part for part in parts if ctx.sweep or part != "tuning"]
    for part in only.split(",") if only else default:
        parts[part]()


def _time_torch(ctx: Any, fn: Any, xs: list[Any], cos: Any, sin: Any) -> float | None:
    try:
        fn(xs[0], cos, sin)
        return ctx.time_gpu(lambda i: fn(xs[i], cos, sin), sets=len(xs))
    except Exception as exc:
        _note(ctx, f"torch timing failed: {type(exc).__name__}: {str(exc)[:200]}")
        return None


def _time_formula(ctx: Any, pairing: RopePairing, xs: list[Any], positions: Any) -> float | None:
    """Device µs of torch.compile of :func:`formula` (angles from the positions in the
    call), or None if it fails."""
    try:
        fn = ctx.torch.compile(formula(pairing))
        fn(xs[0], positions)
        return ctx.time_gpu(lambda i: fn(xs[i], positions), sets=len(xs))
    except Exception as exc:
        _note(ctx, f"torch.compile of the formula failed: {type(exc).__name__}: "
                   f"{str(exc)[:200]}")
        return None


def _large(ctx: Any, torch: Any, compiled: dict) -> None:
    batch, heads, seq, dim = LARGE
    cos, sin = tables(torch, torch.arange(seq, device="cuda"), dim)  # [S, D/2]
    for name, element in DTYPES:
        dtype = getattr(torch, name)
        itemsize = torch.empty((), dtype=dtype).element_size()
        moved = 2 * batch * heads * seq * dim * itemsize
        sets = ctx.sets_for(moved)
        xs = [torch.randn(LARGE, device="cuda", dtype=dtype) for _ in range(sets)]
        ys = [torch.empty_like(x) for x in xs]
        for pairing in RopePairing:
            desc = RopeDescriptor(*LARGE, element=element, pairing=pairing)
            forward = RopePlan.select(desc)
            backward = RopeBackwardPlan.select(RopeBackwardDescriptor.of(desc), forward=desc)
            fwd_args = [RopeArgs(x, y) for x, y in zip(xs, ys)]
            bwd_args = [RopeBackwardArgs(x, y) for x, y in zip(xs, ys)]
            us_fwd = ctx.time_gpu(lambda i, a=fwd_args, p=forward: p.run(a[i]), sets=sets)
            us_bwd = ctx.time_gpu(lambda i, a=bwd_args, p=backward: p.run(a[i]), sets=sets)
            eager = _time_torch(ctx, EAGER[pairing], xs, cos, sin)
            fused = _time_torch(ctx, compiled[pairing], xs, cos, sin) \
                if pairing in compiled else None
            fused_bwd = _time_torch(ctx, compiled[pairing], xs, cos, -sin) \
                if pairing in compiled else None
            label = pairing.name.lower()
            eager_note = f"eager {eager:.0f} µs" if eager else "eager n/a"
            view = forward.can_implement(fwd_args[0])
            chosen = forward.choice(*view)
            path = chosen.path
            if path == "table" and chosen.flat:
                path = "table (rope_flat)"
            _row(ctx, f"fwd {list(LARGE)} {label}", name, us_fwd, moved, fused,
                    f"vs torch.compile; {eager_note}; kernel {path}")
            _row(ctx, f"bwd {list(LARGE)} {label}", name, us_bwd, moved, fused_bwd,
                    f"vs torch.compile (sin negated); kernel {path}")
        del xs, ys
        torch.cuda.empty_cache()


def _tuning(ctx: Any, torch: Any) -> None:
    """Registers per kernel; large shape, forward: ``rope_flat`` (interleaved) and
    ``rope_table``, each by (b, h) planes per thread, against the rows kernels (no table)."""
    from baracuda_numba.driver import function_registers
    from baracuda_numba.kernels.rope import (
        ROPE_FLAT_KERNELS,
        ROPE_KERNELS,
        ROPE_TABLE_KERNELS,
        ROPE_TILE_KERNELS,
    )

    regs = []
    for kernels in (ROPE_KERNELS, ROPE_TABLE_KERNELS, ROPE_FLAT_KERNELS, ROPE_TILE_KERNELS):
        for kernel in kernels.values():
            function = kernel.function
            if function:
                regs.append(f"{kernel.name}: {function_registers(function)}")
    _note(ctx, "registers per thread: " + ", ".join(regs))
    batch, heads, seq, dim = LARGE
    for name, element in DTYPES:
        dtype = getattr(torch, name)
        moved = 2 * batch * heads * seq * dim * torch.empty((), dtype=dtype).element_size()
        sets = ctx.sets_for(moved)
        xs = [torch.randn(LARGE, device="cuda", dtype=dtype) for _ in range(sets)]
        ys = [torch.empty_like(x) for x in xs]
        args = [RopeArgs(x, y) for x, y in zip(xs, ys)]
        for pairing in RopePairing:
            plan = RopePlan.select(RopeDescriptor(*LARGE, element=element, pairing=pairing))
            results = []
            variants = [(False, None, False), (True, 1, False), (True, 2, False),
                        (True, 4, False)]
            if pairing is RopePairing.INTERLEAVED:
                variants[1:1] = [(True, planes, True) for planes in (1, 2, 4)]
            for table, per_thread, flat in variants:
                plan.angle_table, plan.table_flat = table, flat
                plan.table_planes_per_thread = None if flat else per_thread
                plan.flat_planes_per_thread = per_thread if flat else None
                plan.retune()
                us = ctx.time_gpu(lambda i, p=plan, a=args: p.run(a[i]), sets=sets)
                label = f"rope_flat/planes={per_thread}" if flat \
                    else f"table/planes={per_thread}" if table \
                    else plan.choice(*plan.can_implement(args[0])[:2]).layout
                results.append(f"{label}: {us:.1f}")
            _note(ctx, f"tuning {name} {pairing.name.lower()} fwd µs "
                             f"({moved / 1e6:.0f} MB moved): " + "; ".join(results))
        del xs, ys, args  # noqa: F821
        torch.cuda.empty_cache()


def _host_breakdown(ctx: Any, torch: Any) -> None:
    """Where the host time of one decode-shape run goes."""
    from baracuda_numba.arrays import as_ref

    x = torch.randn(DECODE, device="cuda", dtype=torch.float16)
    y = torch.empty_like(x)
    positions = torch.zeros(DECODE[0], DECODE[2], dtype=torch.int64, device="cuda")
    plan = RopePlan.select(RopeDescriptor(*DECODE, element=ElementKind.F16))
    args = RopeArgs(x, y, positions)
    parts = {
        "as_ref(x)": lambda: as_ref(x, "bench", "x", ElementKind.F16, DECODE),
        "can_implement": lambda: plan.can_implement(args),
        "run": lambda: plan.run(args),
        "torch.add": lambda: torch.add(x, x, out=y),
    }
    _note(ctx, "decode host µs/call: " + "; ".join(
        f"{label} {ctx.time_host(fn, calls=5000):.2f}" for label, fn in parts.items()))


def _decode(ctx: Any, torch: Any, compiled: dict) -> None:
    batch, heads, seq, dim = DECODE
    positions = torch.randint(0, 4096, (batch, seq), device="cuda")
    sets = 8
    a = torch.randn(DECODE, device="cuda", dtype=torch.float16)
    b = torch.empty_like(a)
    host_fns = {"torch.add": lambda: torch.add(a, a, out=b)}
    rows = []
    for name, element in DTYPES:
        dtype = getattr(torch, name)
        itemsize = torch.empty((), dtype=dtype).element_size()
        moved = 2 * batch * heads * seq * dim * itemsize + batch * seq * 8
        xs = [torch.randn(DECODE, device="cuda", dtype=dtype) for _ in range(sets)]
        ys = [torch.empty_like(x) for x in xs]
        cos, sin = tables(torch, positions, dim)  # [B, S, D/2]
        cos, sin = cos[:, None], sin[:, None]
        for pairing in RopePairing:
            desc = RopeDescriptor(*DECODE, element=element, pairing=pairing)
            plan = RopePlan.select(desc)
            args = [RopeArgs(x, y, positions) for x, y in zip(xs, ys)]
            us = ctx.time_gpu(lambda i, a=args, p=plan: p.run(a[i]), sets=sets)
            view = plan.can_implement(args[0])
            sweep = [f"{plan.choice(*view).path} (default)"]
            variants = (("tile/4 heads a block", {"tile_heads_per_block": 4}),
                        ("tile/16 heads a block", {"tile_heads_per_block": 16}),
                        ("rows", {"tile": False})) if ctx.sweep else ()
            for label, attrs in variants:
                for attr, value in attrs.items():
                    setattr(plan, attr, value)
                plan.retune()
                sweep_us = ctx.time_gpu(lambda i, a=args, p=plan: p.run(a[i]), sets=sets)
                if label == "rows":
                    label = plan.choice(*view[:2]).layout
                sweep.append(f"{label}: {sweep_us:.2f}")
                plan.tile, plan.tile_heads_per_block = None, None
            plan.retune()
            if ctx.sweep:
                _note(ctx, f"decode {name} {pairing.name.lower()} device µs (default "
                           f"{us:.2f}): " + ", ".join(sweep))
            label = f"fwd decode {list(DECODE)} pos[B,1] {pairing.name.lower()}"
            host_fns[f"{label} {name}"] = lambda a=args, p=plan: p.run(a[0])
            eager = _time_torch(ctx, EAGER[pairing], xs, cos, sin)
            fused = _time_torch(ctx, compiled[pairing], xs, cos, sin) \
                if pairing in compiled else None
            whole = _time_formula(ctx, pairing, xs, positions)
            note = ""
            if eager is not None:
                note += f"; torch eager {eager:.1f} µs"
            if fused is not None:
                note += "; torch µs column = torch.compile"
            if whole is not None:
                note += f"; torch.compile from the positions {whole:.2f} µs"
            rows.append((label, name, us, moved, fused or eager, note))
            backward = RopeBackwardPlan.select(RopeBackwardDescriptor.of(desc), forward=desc)
            bwd_args = [RopeBackwardArgs(x, y, positions) for x, y in zip(xs, ys)]
            bwd_us = ctx.time_gpu(lambda i, a=bwd_args, p=backward: p.run(a[i]), sets=sets)
            bwd_label = f"bwd decode {list(DECODE)} pos[B,1] {pairing.name.lower()}"
            host_fns[f"{bwd_label} {name}"] = lambda a=bwd_args, p=backward: p.run(a[0])
            fused_bwd = _time_torch(ctx, compiled[pairing], xs, cos, -sin) \
                if pairing in compiled else None
            rows.append((bwd_label, name, bwd_us, moved, fused_bwd,
                         "; torch µs column = torch.compile (sin negated)"))
    host = ctx.time_host_many(host_fns)
    torch_host = host["torch.add"]
    _note(ctx, f"decode: host time of one torch.add(a, a, out=b) on {list(DECODE)} "
                     f"f16: {torch_host:.2f} µs (the 1.5x target: {1.5 * torch_host:.2f} µs), "
                     "measured interleaved with the plans' runs (best of 5 rounds)")
    for label, name, us, moved, reference, note in rows:
        run_host = host[f"{label} {name}"]
        _row(ctx, label, name, us, moved, reference,
                f"host {run_host:.2f} µs/run = {run_host / torch_host:.2f}x torch.add" + note)
