"""Compile every registered kernel signature for this GPU in parallel processes and fill
the cubin cache (``~/.cache/baracuda_numba`` or ``$BARACUDA_CACHE_DIR``), so later
processes ``select`` plans in milliseconds.
``python scripts/precompile.py [-j N] [--only scan,reduce]``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import sys
import time


def _selected(only: str | None) -> list:
    from baracuda_numba.launch import registered_kernels

    kernels = registered_kernels()
    if only:
        families = only.split(",")
        kernels = [k for k in kernels
                   if (k.py_func.__module__ or "").rsplit(".", 1)[-1] in families]
    return kernels


def _prepare_share(worker: int, workers: int, only: str | None) -> int:
    kernels = _selected(only)
    for index, kernel in enumerate(kernels):
        if index % workers == worker:
            kernel.prepare()
    return len(kernels[worker::workers])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-j", "--jobs", type=int, default=min(16, os.cpu_count() or 1))
    parser.add_argument("--only", help="comma-separated kernel modules (scan,reduce,...)")
    options = parser.parse_args()
    jobs, only = options.jobs, options.only
    start = time.perf_counter()
    with concurrent.futures.ProcessPoolExecutor(jobs) as pool:
        counts = list(pool.map(_prepare_share, range(jobs), [jobs] * jobs, [only] * jobs))
    print(f"precompile: {sum(counts)} kernels in {time.perf_counter() - start:.1f} s "
          f"with {jobs} processes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
