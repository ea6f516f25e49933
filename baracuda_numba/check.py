"""``baracuda-check``: run every registered plan x dtype x shape case against NumPy float64.

On a machine without a GPU the cases run in the Numba CUDA simulator with small shapes
(and the first line says so); on a GPU the first line names the device. Prints one row
per case (plan, dtype, shape, max error, tolerance, PASS/FAIL, time) and a summary;
exits 1 if any case fails. On a GPU it first compiles the kernels the cases need that the
cache lacks, in parallel processes with a progress bar; ``--precompile-only`` stops there
(for container images and job prologues).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback

from ._detect import use_simulator_without_gpu


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="baracuda-check", description=__doc__.splitlines()[0])
    parser.add_argument("--plans", nargs="*", default=None,
                        help="families (write_slice, scan, ...) or plan names to run")
    parser.add_argument("--dtypes", nargs="*", default=None, help="element kinds, e.g. F32 BF16")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    parser.add_argument("--list", action="store_true", help="list the cases and exit")
    parser.add_argument("--jobs", type=int, default=None,
                        help="processes compiling uncached kernels first (GPU; 1: compile "
                             "lazily in this process)")
    parser.add_argument("--precompile-only", action="store_true",
                        help="compile the kernels of the chosen families into the cache "
                             "(GPU; a progress bar with the time left) and exit")
    options = parser.parse_args(argv)

    simulator = use_simulator_without_gpu()
    from .checks import all_cases, families  # imports Numba, after the choice above

    if simulator:
        print("baracuda-check: no GPU found; running in the Numba CUDA simulator "
              "(NUMBA_ENABLE_CUDASIM=1) with small shapes", flush=True)
    else:
        from numba import cuda

        device = cuda.get_current_device()
        name = device.name.decode() if isinstance(device.name, bytes) else device.name
        major, minor = device.compute_capability
        print(f"baracuda-check: on {name} (cc {major}.{minor})", flush=True)

    wanted = set(options.plans or [])
    known = set(families())
    cases = all_cases(simulator, sorted(wanted & known) or None)
    if wanted - known:
        cases = [c for c in cases if c.family in wanted or c.plan in wanted]
    if options.dtypes:
        dtypes = {d.upper() for d in options.dtypes}
        cases = [c for c in cases if c.dtype in dtypes]
    if options.precompile_only:
        return _precompile_only(simulator, cases, options.jobs)
    if options.list:
        for case in cases:
            print(f"{case.plan:28s} {case.dtype:10s} {case.shape}")
        return 0

    started = time.perf_counter()
    if not simulator and options.jobs != 1:
        # Cold cache: compile every kernel the chosen families use in parallel processes
        # first (one by one, the first case of each kernel would compile it serially).
        from .launch import precompile

        compiled = precompile(_kernel_families(cases), options.jobs)
        if compiled:
            print(f"baracuda-check: compiled {compiled} kernels in "
                  f"{time.perf_counter() - started:.1f} s (cached for later runs)", flush=True)
    results = []
    failures = 0
    header = f"{'plan':26s} {'dtype':10s} {'max err':>10s} {'tol':>9s} {'':4s} {'ms':>8s}  shape"
    print(header)
    for index, case in enumerate(cases, 1):
        t0 = time.perf_counter()
        error_text = None
        try:
            max_error, tolerance = case.run()
            passed = max_error <= tolerance
        except Exception as exc:  # a crash is a failure, reported with its cause
            max_error, tolerance, passed = float("inf"), 0.0, False
            error_text = f"{type(exc).__name__}: {exc}"
        elapsed_ms = (time.perf_counter() - t0) * 1e3
        failures += not passed
        status = "PASS" if passed else "FAIL"
        print(f"{case.plan:26s} {case.dtype:10s} {max_error:10.3g} {tolerance:9.2g} {status:4s} "
              f"{elapsed_ms:8.1f}  {case.shape}  [{index}/{len(cases)}]", flush=True)
        if error_text:
            print(f"    {error_text}")
            if "--verbose" in sys.argv:
                traceback.print_exc()
        results.append({"family": case.family, "plan": case.plan, "dtype": case.dtype,
                        "shape": case.shape, "max_error": max_error, "tolerance": tolerance,
                        "passed": passed, "ms": elapsed_ms, "error": error_text})
    total = time.perf_counter() - started
    print(f"baracuda-check: {len(cases) - failures} passed, {failures} failed "
          f"({len(cases)} cases, {total:.1f} s)")
    if options.json:
        with open(options.json, "w") as handle:
            json.dump({"simulator": simulator, "results": results}, handle, indent=1)
    return 1 if failures else 0


def _kernel_families(cases: list) -> list[str]:
    """The kernel modules the cases' families use (a family without kernels of its own,
    if any, is left out rather than rejected)."""
    from .launch import kernel_family, registered_kernels

    known = {kernel_family(k) for k in registered_kernels()}
    return sorted({c.family for c in cases} & known)


def _precompile_only(simulator: bool, cases: list, jobs: int | None) -> int:
    if simulator:
        print("baracuda-check: --precompile-only needs a GPU (the simulator compiles "
              "nothing)")
        return 0
    from .precompile import warmup

    started = time.perf_counter()
    compiled = warmup(_kernel_families(cases), jobs=jobs)
    print(f"baracuda-check: compiled {compiled} kernels in "
          f"{time.perf_counter() - started:.1f} s (cached for later runs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
