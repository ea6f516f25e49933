"""Compile every registered kernel signature for this GPU in parallel processes and fill
the cubin cache (``~/.cache/baracuda_numba`` or ``$BARACUDA_CACHE_DIR``), so later
processes ``select`` plans in milliseconds. ``python scripts/precompile.py [-j N]``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import sys
import time


def _prepare_share(worker: int, workers: int) -> int:
    from baracuda_numba.launch import registered_kernels

    kernels = registered_kernels()
    for index, kernel in enumerate(kernels):
        if index % workers == worker:
            kernel.prepare()
    return len(kernels[worker::workers])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-j", "--jobs", type=int, default=min(16, os.cpu_count() or 1))
    jobs = parser.parse_args().jobs
    start = time.perf_counter()
    with concurrent.futures.ProcessPoolExecutor(jobs) as pool:
        counts = list(pool.map(_prepare_share, range(jobs), [jobs] * jobs))
    print(f"precompile: {sum(counts)} kernels in {time.perf_counter() - start:.1f} s "
          f"with {jobs} processes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
