"""A/B probe (GPU) of the reduce gradients: this checkout's ``baracuda_numba`` against
another revision imported as ``baracuda_old`` (see ``probe_rope_ab.py`` for the copy),
in one process, timed alternately with torch as a reference; the two must write the same
bits.

    git archive REV baracuda_numba | tar -x -C ab && mv ab/baracuda_numba ab/baracuda_old
    PYTHONPATH=ab:$PYTHONPATH AB_CASES=VAR:256x1000000:1:bfloat16,... \\
        python scripts/probe_reduce_ab.py [rounds]

A case is ``KIND:SHAPE:AXIS:DTYPE[:hold|:sync|:fwd]`` (``plan.row_hold`` True / False in
both; ``fwd``: the forward ``ReducePlan`` instead, timed beside torch's reduction).
``AB_UNIFORM=1`` draws x as the benchmark does (uniform in [-2, 2), rounded to the dtype:
many ties in bf16) instead of a normal distribution. ``AB_SET=MODULE.NAME=VALUE,...`` sets
constants of the new package first (e.g. ``plans.reduce._TIE_REWRITE_BLOCKS=264``;
booleans as 1 / 0); ``AB_PLAN=ATTR=VALUE,...`` sets attributes of each new plan (e.g.
``reg_rows_pair=0``; an attribute whose default is None, an automatic choice, takes 1 / 0
or ``none``). ``AB_REVERSE=1`` sets up and times the old package first.
``AB_EXTRA=NAME,...`` times more packages (importable names, e.g. copies in ``ab/``) beside
the two, their bits compared with the new package's. ``AB_NO_COLS_REG=1`` keeps the new
package's gradients off the column register-resident kernels (the column word kernel
takes those columns, the tie count after dx for Max/Min).
"""

from __future__ import annotations

import importlib
import os
import sys

import torch
from bench import Context, measure_copy_gbps

import baracuda_numba
from baracuda_numba._frameworks import element_of
from baracuda_numba.plans.reduce import REDUCE_KINDS

PACKAGES = {"new": baracuda_numba, "old": importlib.import_module("baracuda_old")}
if os.environ.get("AB_REVERSE"):  # time (and allocate for) the old package first
    PACKAGES = dict(reversed(PACKAGES.items()))
# more variants, timed beside the two (importable package names, comma separated)
for _name in filter(None, os.environ.get("AB_EXTRA", "").split(",")):
    PACKAGES[_name] = importlib.import_module(_name)


def _setting(current: object, text: str) -> object:
    """``text`` as the type of ``current``: booleans from 1/0, true/false, yes/no (also
    for a current None, an automatic choice; "none" keeps it)."""
    if current is None and text.lower() == "none":
        return None
    if isinstance(current, bool) or current is None:
        if text.lower() not in ("1", "0", "true", "false", "yes", "no"):
            raise ValueError(f"AB_SET: {text!r} is not a boolean")
        return text.lower() in ("1", "true", "yes")
    return type(current)(text)


def _saved(kind: str, x: torch.Tensor, axis: int) -> torch.Tensor:
    if kind == "NORM2":
        return x.norm(dim=axis, keepdim=True)
    if kind == "LOG_SUM_EXP":
        return x.logsumexp(axis, keepdim=True)
    return getattr(x, {"MAX": "amax", "MIN": "amin"}.get(kind, kind.lower()))(axis, keepdim=True)


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    ctx = Context("reduce", torch)
    ctx.copy_gbps = measure_copy_gbps(torch)
    print(f"copy {ctx.copy_gbps:.0f} GB/s, {torch.cuda.get_device_name()}", flush=True)
    for setting in filter(None, os.environ.get("AB_SET", "").split(",")):
        target, value = setting.split("=")
        module, name = target.rsplit(".", 1)
        module = importlib.import_module(f"baracuda_numba.{module}")
        setattr(module, name, _setting(getattr(module, name), value))
        print(f"  new: {target} = {value}", flush=True)
    if os.environ.get("AB_NO_COLS_REG"):
        plans = importlib.import_module("baracuda_numba.plans.reduce")
        plans._cols_reg_layout = lambda *args, **kwargs: None
        print("  new: no column register-resident gradient", flush=True)
    for case in os.environ.get("AB_CASES", "VAR:256x1000000:1:bfloat16").split(","):
        fields = case.split(":")
        kind, shape, axis, name = fields[0], tuple(int(n) for n in fields[1].split("x")), \
            int(fields[2]), fields[3]
        hold = {"hold": True, "sync": False}.get(fields[4]) if len(fields) > 4 else None
        forward = fields[4:] == ["fwd"]
        dtype = getattr(torch, name)
        if os.environ.get("AB_UNIFORM"):
            x = (torch.rand(shape, device="cuda") * 4 - 2).to(dtype)
        else:
            x = torch.randn(shape, device="cuda", dtype=dtype)
        y = _saved(kind, x, axis)
        if forward and kind not in {k.name for k in REDUCE_KINDS}:
            print(f"{case}: not a ReducePlan kind", flush=True)
            continue
        if forward:
            _forward_case(ctx, case, kind, x, y, axis, rounds)
            continue
        dy = torch.randn_like(y)
        runs, outs = [], []
        for label, package in PACKAGES.items():
            plans = importlib.import_module(f"{package.__name__}.plans.reduce")
            types = importlib.import_module(f"{package.__name__}.types")
            # each package's own enum members (the copy's enums are other classes)
            desc = plans.ReduceBackwardDescriptor(types.ReduceKind[kind], shape, axis,
                                                  types.ElementKind[element_of(x).name], 1)
            plan = plans.ReduceBackwardPlan.select(desc)
            plan.row_hold = hold
            if package is baracuda_numba:
                for setting in filter(None, os.environ.get("AB_PLAN", "").split(",")):
                    attr, value = setting.split("=")
                    setattr(plan, attr, _setting(getattr(plan, attr), value))
            ws = torch.empty(plan.workspace_size, device="cuda", dtype=torch.uint8)
            dx = torch.full_like(x, float("nan"))
            args = plans.ReduceBackwardArgs(dy, dx, x, y)
            plan.run(args, workspace=ws)
            torch.cuda.synchronize()
            launch = next(iter(plan._launches.values()))[1]
            print(f"  {label}: access {launch[0]}, hold {getattr(launch[1], 'hold', None)}",
                  flush=True)
            outs.append(dx)
            runs.append(lambda i, p=plan, a=args, w=ws: p.run(a, workspace=w))
        same = torch.equal(outs[0].view(torch.uint8), outs[1].view(torch.uint8))
        if not same:
            diff = (outs[0].double() - outs[1].double()).abs().max().item()
            print(f"  max |new - old| {diff:.3g} (max |old| "
                  f"{outs[1].double().abs().max().item():.3g})", flush=True)
        mine = outs[list(PACKAGES).index("new")]
        for label, out in list(zip(PACKAGES, outs))[2:]:
            equal = torch.equal(mine.view(torch.uint8), out.view(torch.uint8))
            print(f"  {label}: bits {'equal to' if equal else 'DIFFER from'} new", flush=True)
        moved = (2 * x.numel() + 2 * y.numel()) * x.element_size()
        for _ in range(rounds):
            times = ctx.time_gpu_many(runs, iters=20)
            text = ", ".join(f"{label} {us:.1f} ({moved / us / 1e3 / ctx.copy_gbps:.0%})"
                             for label, us in zip(PACKAGES, times))
            print(f"{case} (bits {'equal' if same else 'DIFFER'}): {text}", flush=True)
        del x, y, dy, outs, runs
        torch.cuda.empty_cache()


def _forward_case(ctx: Context, case: str, kind: str, x: torch.Tensor, y: torch.Tensor,
                  axis: int, rounds: int) -> None:
    """Time the forward plans of both packages and torch's reduction (``y``, torch's
    result), alternately; the two plans must write the same bits."""
    runs, outs = [], []
    for package in PACKAGES.values():
        plans = importlib.import_module(f"{package.__name__}.plans.reduce")
        types = importlib.import_module(f"{package.__name__}.types")
        desc = plans.ReduceDescriptor(types.ReduceKind[kind], tuple(x.shape), axis,
                                      types.ElementKind[element_of(x).name])
        plan = plans.ReducePlan.select(desc)
        ws = torch.empty(max(plan.workspace_size, 1), device="cuda", dtype=torch.uint8)
        out = torch.full_like(y, float("nan"))
        args = plans.ReduceArgs(x, out)
        plan.run(args, workspace=ws)
        outs.append(out)
        runs.append(lambda i, p=plan, a=args, w=ws: p.run(a, workspace=w))
    runs.append(lambda i: _saved(kind, x, axis))
    torch.cuda.synchronize()
    same = torch.equal(outs[0].view(torch.uint8), outs[1].view(torch.uint8))
    error = (outs[0].double() - y.double()).abs().max().item()
    moved = (x.numel() + y.numel()) * x.element_size()
    for _ in range(rounds):
        times = ctx.time_gpu_many(runs, iters=20)
        text = ", ".join(f"{label} {us:.1f} ({moved / us / 1e3 / ctx.copy_gbps:.0%})"
                         for label, us in zip([*PACKAGES, "torch"], times))
        print(f"{case} (bits {'equal' if same else 'DIFFER'}, max |new - torch| {error:.2g}):"
              f" {text}", flush=True)


if __name__ == "__main__":
    main()
