"""Compile every registered kernel signature for this GPU in parallel processes and fill
the cubin cache (``~/.cache/baracuda_numba`` or ``$BARACUDA_CACHE_DIR``), so later
processes ``select`` plans in milliseconds.
``python scripts/precompile.py [-j N] [--only scan,reduce]`` (kernels already in the cache
are skipped; ``baracuda-check`` does the same before running its cases).
"""

from __future__ import annotations

import argparse
import sys
import time


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-j", "--jobs", type=int, default=None)
    parser.add_argument("--only", help="comma-separated kernel modules (scan,reduce,...)")
    options = parser.parse_args()
    from baracuda_numba.launch import precompile

    start = time.perf_counter()
    families = options.only.split(",") if options.only else None
    compiled = precompile(families, options.jobs)
    print(f"precompile: {compiled} kernels compiled in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
