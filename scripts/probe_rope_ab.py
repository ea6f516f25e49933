"""A/B probe (GPU) of the RoPE plans: this checkout's ``baracuda_numba`` against another
revision of the package, imported under another name, in one process.

    git archive REV baracuda_numba | tar -x -C ab && mv ab/baracuda_numba ab/baracuda_old
    PYTHONPATH=ab:$PYTHONPATH python scripts/probe_rope_ab.py [decode] [large] [placement]
                                                              [rounds]

(the package imports itself only relatively, so the copy runs as ``baracuda_old``; its
kernels compile from their own source files, so neither revision's cubins or Numba cache
entries serve the other). ``decode``: [64, 32, 1, 128] with positions [64, 1], every dtype
and pairing, forward and backward; ``large``: [8, 32, 2048, 128] without positions, f16 /
bf16 / f32 interleaved and bf16 / f32 half-split; old and new write the same outputs; each
row times old, new and torch.compile (precomputed cos/sin, sin negated for the backward)
alternately, call by call (``Context.time_gpu_many``), ``rounds`` times (default 2), and
checks that old and new give the same bits. ``placement``: the forward of the large shape
into outputs at different places (see its docstring).
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

import torch
from bench import Context, measure_copy_gbps
from bench_rope import DECODE, DTYPES, EAGER, LARGE, tables

import baracuda_numba

PACKAGES = {"new": baracuda_numba, "old": importlib.import_module("baracuda_old")}
CACHE = 4096  # positions of the decode rows' cos/sin caches (positions drawn below it)


def gather_formula(pairing: Any) -> Any:
    """The eager formula with cos/sin caches [CACHE, D/2] gathered at the positions [B, S]
    inside the call (``cos_cached[position_ids]``, as older HF Llama code does)."""
    eager = EAGER[pairing]

    def rope_gathered(x: Any, cos_cache: Any, sin_cache: Any, positions: Any) -> Any:
        return eager(x, cos_cache[positions][:, None], sin_cache[positions][:, None])

    return rope_gathered


def _plans(package: Any, desc_fields: tuple[int, ...], element_name: str, pairing_name: str,
           inverse: bool) -> Any:
    rope = importlib.import_module(f"{package.__name__}.plans.rope")
    types = importlib.import_module(f"{package.__name__}.types")
    desc = rope.RopeDescriptor(*desc_fields, element=types.ElementKind[element_name],
                               pairing=types.RopePairing[pairing_name])
    if inverse:
        return (rope.RopeBackwardPlan.select(rope.RopeBackwardDescriptor.of(desc), forward=desc),
                rope.RopeBackwardArgs)
    return rope.RopePlan.select(desc), rope.RopeArgs


def _row(ctx: Context, shape: tuple[int, ...], positions: Any, name: str, element: Any,
         pairing: Any, inverse: bool, compiled: dict, rounds: int, sets: int) -> None:
    dtype = getattr(torch, name)
    xs = [torch.randn(shape, device="cuda", dtype=dtype) for _ in range(sets)]
    ys = [torch.empty_like(x) for x in xs]  # shared: where y lies moves a row by 1-3 %
    fns = []
    for package in PACKAGES.values():
        plan, args_type = _plans(package, shape, element.name, pairing.name, inverse)
        args = [args_type(x, y, positions) for x, y in zip(xs, ys)]
        fns.append(lambda i, p=plan, a=args: p.run(a[i]))
    cos, sin = tables(torch, positions if positions is not None
                      else torch.arange(shape[2], device="cuda"), shape[3])
    if positions is not None:
        cos, sin = cos[:, None], sin[:, None]
    sin = -sin if inverse else sin
    fn = compiled[pairing]
    fns.append(lambda i: fn(xs[i], cos, sin))
    labels = [*PACKAGES, "torch.compile"]
    if positions is not None:  # the caches gathered at the positions inside the call
        cos_cache, sin_cache = tables(torch, torch.arange(CACHE, device="cuda"), shape[3])
        sin_cache = -sin_cache if inverse else sin_cache
        gathered = compiled[pairing, "gather"]
        fns.append(lambda i: gathered(xs[i], cos_cache, sin_cache, positions))
        labels.append("torch.compile gather in the call")
        # the floor: a copy of the same bytes (into a buffer of its own)
        copies = [torch.empty_like(x) for x in xs]
        fns.append(lambda i: copies[i].copy_(xs[i]))
        labels.append("copy_")
    outputs = []
    for f in fns:
        f(0)
        outputs.append(ys[0].clone())
    torch.cuda.synchronize()
    same = torch.equal(outputs[0].view(torch.uint8), outputs[1].view(torch.uint8))
    line = []
    for _ in range(rounds):
        times = ctx.time_gpu_many(fns, sets=sets, iters=200)
        line.append(" ".join(f"{label} {us:.2f}" for label, us in zip(labels, times)))
    print(f"{'bwd' if inverse else 'fwd'} {list(shape)} {name} {pairing.name.lower()} "
          f"(bits {'equal' if same else 'DIFFER'}): " + "; ".join(line), flush=True)


def placement(ctx: Context, compiled: dict, rounds: int) -> None:
    """The forward of [8, 32, 2048, 128] (f32 / bf16 interleaved, f32 half-split) into
    output sets allocated at different places (before x, right after x, after a 64 MB
    spacer, and per call from torch's caching allocator as torch.compile's own output is)
    and torch.compile, timed alternately: how much a row depends on where y lies."""
    from baracuda_numba.types import ElementKind, RopePairing

    for name, element, pairing in (("float32", ElementKind.F32, RopePairing.INTERLEAVED),
                                   ("float32", ElementKind.F32, RopePairing.HALF_SPLIT),
                                   ("bfloat16", ElementKind.BF16, RopePairing.INTERLEAVED)):
        _placement_row(ctx, name, element, pairing, compiled[pairing], rounds)


def _placement_row(ctx: Context, name: str, element: Any, pairing: Any, fn: Any,
                   rounds: int) -> None:
    from baracuda_numba.plans.rope import RopeArgs, RopeDescriptor, RopePlan

    sets = 2
    dtype = getattr(torch, name)
    before = [torch.empty(LARGE, device="cuda", dtype=dtype) for _ in range(sets)]
    xs = [torch.randn(LARGE, device="cuda", dtype=dtype) for _ in range(sets)]
    after = [torch.empty(LARGE, device="cuda", dtype=dtype) for _ in range(sets)]
    spacer = torch.empty(16 << 20, device="cuda")
    spaced = [torch.empty(LARGE, device="cuda", dtype=dtype) for _ in range(sets)]
    plan = RopePlan.select(RopeDescriptor(*LARGE, element=element, pairing=pairing))
    fns = [lambda i, ys=ys: plan.run(RopeArgs(xs[i], ys[i])) for ys in (before, after, spaced)]
    fns.append(lambda i: plan.run(RopeArgs(xs[i], torch.empty_like(xs[i]))))
    cos, sin = tables(torch, torch.arange(LARGE[2], device="cuda"), LARGE[3])
    fns.append(lambda i: fn(xs[i], cos, sin))
    for _ in range(rounds):
        times = ctx.time_gpu_many(fns, sets=sets, iters=100)
        print(f"placement {name} {pairing.name.lower()} fwd: " + ", ".join(
            f"{label} {us:.2f}" for label, us in zip(
                ("y before x", "y after x", "y after a spacer",
                 "y per call from the allocator", "torch.compile"), times)), flush=True)
    del spacer


def main() -> None:
    parts = [p for p in sys.argv[1:] if not p.isdigit()] or ["decode"]
    rounds = next((int(p) for p in sys.argv[1:] if p.isdigit()), 2)
    from baracuda_numba.types import RopePairing

    ctx = Context("rope", torch)
    ctx.copy_gbps = measure_copy_gbps(torch)
    print(f"copy {ctx.copy_gbps:.0f} GB/s, {torch.cuda.get_device_name()}", flush=True)
    compiled = {pairing: torch.compile(fn) for pairing, fn in EAGER.items()}
    compiled.update({(pairing, "gather"): torch.compile(gather_formula(pairing))
                     for pairing in EAGER})
    if "decode" in parts:
        positions = torch.randint(0, CACHE, (DECODE[0], DECODE[2]), device="cuda")
        for name, element in DTYPES:
            for pairing in RopePairing:
                for inverse in (False, True):
                    _row(ctx, DECODE, positions, name, element, pairing, inverse, compiled,
                         rounds, 8)
    if "placement" in parts:
        placement(ctx, compiled, rounds)
    if "large" in parts:
        for name, element in DTYPES:
            for pairing in RopePairing:
                if pairing is RopePairing.INTERLEAVED or name != "float16":
                    for inverse in (False, True):
                        _row(ctx, LARGE, None, name, element, pairing, inverse, compiled,
                             rounds, 2)


if __name__ == "__main__":
    main()
