"""A/B of two package trees through the public torch API (``baracuda_numba.torch``), for
changes that touch many kernels at once (issue 51's kind and pairing merges): every case
is timed in both trees, one subprocess per side and round, on the same inputs (seeded),
and each output's checksum is compared across the trees.

    python scripts/api_ab.py --base BASE_ROOT --new NEW_ROOT [--only TEXT] [--rounds 2]
    python scripts/api_ab.py --base BASE_ROOT --new NEW_ROOT --precompile   # compile first

``BASE_ROOT`` / ``NEW_ROOT`` hold a ``baracuda_numba/`` folder (``git archive REV | tar x
-C DIR``). Compile both trees before timing (``--precompile``, in parallel processes): a
kernel compiled on first use inside the timed loop would dominate a side. Times are CUDA
events over back-to-back calls (host time included where a call is host-bound), median of
5 rounds of 20; forward+backward rows time ``torch.autograd.grad`` of the op. The kernels
columns are the device time of a call's kernels (torch.profiler over 10 calls): host
overhead, noisy from process to process, left out.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

WORKER = r'''
import json, sys, torch
import baracuda_numba.torch as bt
only = sys.argv[1]
F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16
NAMES = {F32: "f32", BF16: "bf16", F16: "f16"}
cases = []

def case(name, make):
    if only in name:
        cases.append((name, make))

def rnd(shape, dt):
    torch.manual_seed(hash(shape) % 1000)
    return torch.randn(shape, device="cuda").to(dt)

def grad_of(fn, x):
    x = x.requires_grad_(True)
    dy = torch.randn_like(fn(x))
    return (lambda t: torch.autograd.grad(fn(t), t, dy)[0]), (x,)

ROWS = (((4096, 4096), 1), ((4096, 4096), 0), ((256, 1000000), 1), ((1000000, 64), 1),
        ((1000000, 64), 0))
for dt in (F32, BF16, F16):  # f16 on the first two shapes: it shares bf16's kernels
    n = NAMES[dt]
    for shape, dim in (ROWS if dt != F16 else ROWS[:2]):
        for op in ("amax", "amin", "argmax", "argmin", "var", "std", "sum", "logsumexp"):
            case(f"{op} {n} {list(shape)} dim {dim}", lambda op=op, s=shape, d=dim, dt=dt: (
                lambda x: getattr(bt, op)(x, dim=d), (rnd(s, dt),)))
        for op in ("var", "std", "mean", "norm", "logsumexp", "amax"):
            case(f"{op} fwd+bwd {n} {list(shape)} dim {dim}", lambda op=op, s=shape, d=dim,
                 dt=dt: grad_of(lambda t: getattr(bt, op)(t, dim=d), rnd(s, dt)))
    case(f"mean (-2, -1) {n} [128, 256, 56, 56]", lambda dt=dt: (
        lambda x: bt.mean(x, dim=(-2, -1)), (rnd((128, 256, 56, 56), dt),)))
    for shape, dim in (((4096, 4096), 1), ((4096, 4096), 0), ((256, 128256), 1),
                       ((64, 1000000), 1))[:(4 if dt != F16 else 2)]:
        for op in ("cumsum", "cumprod"):
            case(f"{op} {n} {list(shape)} dim {dim}", lambda op=op, s=shape, d=dim, dt=dt: (
                lambda x: getattr(bt, op)(x, dim=d), (rnd(s, dt),)))
        case(f"cumsum fwd+bwd {n} {list(shape)} dim {dim}", lambda s=shape, d=dim, dt=dt:
             grad_of(lambda t: bt.cumsum(t, dim=d), rnd(s, dt)))
case("argmax bf16 [8192, 128256] dim 1", lambda: (lambda x: bt.argmax(x, dim=1),
                                                  (rnd((8192, 128256), BF16),)))

def rope(shape, dt, pairing, qk, grad):
    b, h, s, d = shape
    pos = torch.arange(s, device="cuda") if s > 1 else torch.randint(0, 4096, (b, 1), device="cuda")
    if not qk:
        fn = lambda t: bt.rope(t, positions=pos, base=500000.0, pairing=pairing)
        return grad_of(fn, rnd(shape, dt)) if grad else (fn, (rnd(shape, dt),))
    q, k = rnd((b, s, h, d), dt), rnd((b, s, max(1, h // 4), d), dt)
    inv = 1.0 / (500000.0 ** (torch.arange(0, d, 2, device="cuda") / d))
    freqs = pos.expand(b, s).float()[..., None] * inv if s > 1 else pos.float()[..., None] * inv
    emb = (torch.cat((freqs, freqs), -1) if pairing == "half_split"
           else freqs.repeat_interleave(2, -1))
    cos, sin = emb.cos().to(dt), emb.sin().to(dt)
    return (lambda a, c: bt.rope(a, k=c, cos=cos, sin=sin, pairing=pairing, layout="BSHD"),
            (q, k))

for dt in (F32, BF16, F16):
    for pairing in ("half_split", "interleaved"):
        for shape in ((8, 32, 2048, 128), (64, 32, 1, 128)):
            for qk in (False, True):
                for grad in ((False, True) if shape[2] > 1 and not qk else (False,)):
                    what = ("q+k " if qk else "") + ("fwd+bwd " if grad else "")
                    case(f"rope {what}{NAMES[dt]} {pairing} {list(shape)}",
                         lambda s=shape, dt=dt, p=pairing, qk=qk, g=grad: rope(s, dt, p, qk, g))

def pool(dims, shape, out, dt, grad):
    torch.manual_seed(7)
    samples = torch.rand(shape[0], shape[1], dims, device="cuda").to(dt)
    fn = getattr(bt, f"fractional_max_pool{dims}d")
    call = lambda t: fn(t, 3, output_size=out, _random_samples=samples)
    return grad_of(call, rnd(shape, dt)) if grad else (call, (rnd(shape, dt),))

for dt in (F32, BF16, F16):
    for dims, shape, out in ((2, (32, 64, 128, 128), (91, 91)),
                             (3, (8, 32, 32, 64, 64), (22, 45, 45))):
        for grad in (False, True):
            case(f"fmp{dims}d {'fwd+bwd ' if grad else ''}{NAMES[dt]} {list(shape)}",
                 lambda d=dims, s=shape, o=out, dt=dt, g=grad: pool(d, s, o, dt, g))

for dt in (F32, BF16):  # normalization: weight and bias loads (issue 54)
    for shape in ((8192, 4096), (16384, 3584)):
        d = shape[1]
        case(f"rms_norm {NAMES[dt]} {list(shape)}", lambda s=shape, d=d, dt=dt: (
            lambda x, w: bt.rms_norm(x, d, w, 1e-6), (rnd(s, dt), rnd((d,), dt))))
        case(f"layer_norm {NAMES[dt]} {list(shape)}", lambda s=shape, d=d, dt=dt: (
            lambda x, w, b: bt.layer_norm(x, d, w, b), (rnd(s, dt), rnd((d,), dt),
                                                        rnd((d,), dt))))

def timed(fn, n=20, rounds=5):
    fn(); torch.cuda.synchronize()
    times = []
    for _ in range(rounds):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(n):
            fn()
        b.record(); b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / n)
    return sorted(times)[len(times) // 2]

def kernel_time(fn, n=10):
    """Device time of ``fn``'s kernels per call (µs; profiler): host overhead excluded."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
    return sum(e.self_device_time_total for e in prof.key_averages()) / n

def checksum(t):
    if isinstance(t, (tuple, list)):
        return sum(checksum(u) for u in t)
    d = t.detach().reshape(-1).double().nan_to_num(12345.0, 54321.0, -54321.0)
    w = torch.arange(d.numel(), device="cuda", dtype=torch.float64).remainder_(7) - 3
    return float((d * w).sum() + d.sum())

out = {}
for name, make in cases:
    try:
        fn, args = make()
        out[name] = [timed(lambda: fn(*args)), checksum(fn(*args)), kernel_time(lambda: fn(*args))]
    except Exception as error:  # a row that fails reports, the others still run
        out[name] = [None, f"{type(error).__name__}: {str(error)[:120]}", None]
    fn = args = None
    torch.cuda.empty_cache()
print("RESULT " + json.dumps(out))
'''


def _env(root: str) -> dict[str, str]:
    """The environment with ``root`` first on PYTHONPATH (the rest kept: site folders)."""
    rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.abspath(root)] + rest))


def run_side(root: str, only: str, timeout: int) -> dict:
    proc = subprocess.run([sys.executable, "-c", WORKER, only], env=_env(root), text=True,
                          capture_output=True, timeout=timeout)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise RuntimeError(f"{root}: no result\n{proc.stderr[-2000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True)
    parser.add_argument("--new", required=True)
    parser.add_argument("--only", default="", help="cases whose name contains this text")
    parser.add_argument("--rounds", type=int, default=1, help="base, new, ... rounds")
    parser.add_argument("--precompile", action="store_true",
                        help="compile reduce, scan, rope and fractional_max_pool in both "
                        "trees first")
    parser.add_argument("--timeout", type=int, default=280, help="seconds per side")
    args = parser.parse_args()
    if args.precompile:
        for root in (args.base, args.new):
            subprocess.run([sys.executable, "-m", "baracuda_numba.precompile", "--only",
                            "reduce,scan,rope,fractional_max_pool"], cwd=root, check=False,
                           env=_env(root))
    sides: dict[str, list[dict]] = {"base": [], "new": []}
    for _ in range(args.rounds):
        for side in ("base", "new"):
            sides[side].append(run_side(getattr(args, side), args.only, args.timeout))
    print("| case | base µs | new µs | new / base | base kernels µs | new kernels µs | "
          "kernels new / base | same result |\n|---|---:|---:|---:|---:|---:|---:|---|")
    for name, (_, base_sum, _) in sides["base"][0].items():
        cells = []
        for column in (0, 2):  # wall time per call, then device time of its kernels
            best = {s: min((r[name][column] for r in runs if r[name][column] is not None),
                           default=None) for s, runs in sides.items()}
            ratio = f"{best['new'] / best['base']:.3f}" if best["base"] and best["new"] else ""
            cells += [f"{v:.1f}" if v else "" for v in best.values()] + [ratio]
        new_sum = sides["new"][0].get(name, [None, None, None])[1]
        same = "yes" if base_sum == new_sum else f"no ({base_sum} / {new_sum})"
        print(f"| {name} | {' | '.join(cells)} | {same} |")


if __name__ == "__main__":
    main()
