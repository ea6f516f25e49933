"""Compile kernels ahead of time, in parallel processes, into the cubin cache.

For container images and job prologues: after ``warmup`` (or the command below) every
chosen kernel loads from the cache (``$BARACUDA_CACHE_DIR``, else
``~/.cache/baracuda_numba``) in about a millisecond, so no first call waits for a compile.

``python -m baracuda_numba.precompile [--only scan,reduce] [--dtypes bf16,f32] [-j N]``
(``baracuda-check --precompile-only`` does the same for the families it checks). Kernels
already in the cache are skipped; a progress bar (tqdm if installed, else a counter on
stderr) shows the count and an estimate of the time left.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["Progress", "main", "select_kernels", "warmup"]

#: The byte width that kernels moving raw units use for each element kind.
_WIDTH = {"f16": "2b", "bf16": "2b", "f32": "4b", "f64": "8b", "i32": "4b", "i64": "8b",
          "u8": "1b", "i8": "1b"}


def _dtype_tokens(dtypes: Iterable[Any]) -> set[str]:
    tokens = set()
    for dtype in dtypes:
        name = str(getattr(dtype, "name", dtype)).lower()
        if name not in _WIDTH:
            raise ValueError(f"warmup: dtypes entry {dtype!r} must be one of "
                             f"{', '.join(sorted(_WIDTH))}")
        tokens |= {name, _WIDTH[name]}
        if name in ("f16", "bf16"):
            tokens.add("half")  # one kernel serves both
    return tokens


def select_kernels(ops: Sequence[str] | None = None,
                   dtypes: Sequence[Any] | None = None) -> list[Any]:
    """The registered kernels of the families ``ops`` (kernel modules: ``"scan"``,
    ``"reduce"``, ...; None: all) for the element kinds ``dtypes`` (``"bf16"``,
    ``ElementKind.F32``, ...; None: all; kernels whose name carries no element always
    count). Unknown names raise ``ValueError``."""
    from .launch import kernel_dtype, kernel_family, registered_kernels

    ops = [ops] if isinstance(ops, str) else ops
    dtypes = [dtypes] if isinstance(dtypes, str) else dtypes
    kernels = registered_kernels()
    if ops is not None:
        known = {kernel_family(k) for k in kernels}
        unknown = sorted(set(ops) - known)
        if unknown:
            raise ValueError(f"warmup: ops {unknown} are not kernel families; known: "
                             f"{', '.join(sorted(known))}")
        kernels = [k for k in kernels if kernel_family(k) in ops]
    if dtypes is not None:
        tokens = _dtype_tokens(dtypes)
        kernels = [k for k in kernels if kernel_dtype(k) in tokens or kernel_dtype(k) is None]
    return kernels


def warmup(ops: Sequence[str] | None = None, dtypes: Sequence[Any] | None = None,
           jobs: int | None = None, *, progress: bool = True) -> int:
    """Compile the kernels :func:`select_kernels` picks that the cache does not hold yet,
    in ``jobs`` spawned processes (default: one per CPU, at most 16; ``jobs=1``: in this
    process, which then also holds them loaded). Returns how many were compiled. A no-op
    in the simulator. Without a usable cache folder the kernels load in this process."""
    from . import cubin_cache
    from ._runtime import SIMULATOR

    kernels = select_kernels(ops, dtypes)
    if SIMULATOR:
        return 0
    from numba import cuda

    from .launch import cubin_path

    cc = cuda.get_current_device().compute_capability
    paths = [cubin_path(k, cc) for k in kernels]
    missing = [k for k, path in zip(kernels, paths)
               if path is None or cubin_cache.read_entry(path) is None]
    if not missing:
        return 0
    jobs = max(1, min(jobs or min(16, os.cpu_count() or 1), len(missing)))
    bar = Progress(len(missing), enabled=progress)
    try:
        if jobs == 1 or cubin_cache.cache_dir() is None:
            for kernel in missing:
                kernel.load()
                bar.update()
        else:
            _in_processes([k.name for k in missing], jobs, bar)
    finally:
        bar.close()
    return len(missing)


def _in_processes(names: list[str], jobs: int, bar: Progress) -> None:
    import concurrent.futures
    import multiprocessing

    context = multiprocessing.get_context("spawn")  # never fork a process holding CUDA
    with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=context,
                                                initializer=_quiet_worker) as pool:
        futures = [pool.submit(_load_by_name, name) for name in names]
        for future in concurrent.futures.as_completed(futures):
            future.result()
            bar.update()


def _quiet_worker() -> None:
    """Workers leave the per-kernel compile notice out: the progress bar says it all."""
    import logging

    logging.getLogger("baracuda_numba").setLevel(logging.WARNING)


def _load_by_name(name: str) -> None:
    """In a worker process: compile (or find) one kernel and write it to the cache."""
    from .launch import registered_kernels

    by_name = {k.name: k for k in registered_kernels()}
    by_name[name].load()


class Progress:
    """The progress of :func:`warmup` over ``total`` kernels (``update()`` per kernel
    done, ``close()`` at the end): tqdm when installed, else one ``precompile: 12/180
    kernels, 23 s, about 41 s left`` line on stderr at most every two seconds (and at the
    end); nothing shown unless ``enabled``."""

    def __init__(self, total: int, enabled: bool = True) -> None:
        self.total = total
        self.done = 0
        self.enabled = enabled
        self._start = self._shown = time.perf_counter()
        self._tqdm = None
        if enabled:
            try:
                from tqdm import tqdm
            except ImportError:
                tqdm = None
            if tqdm is not None:
                self._tqdm = tqdm(total=total, desc="precompile", unit="kernel")

    def update(self) -> None:
        self.done += 1
        if self._tqdm is not None:
            self._tqdm.update()
            return
        now = time.perf_counter()
        if self.enabled and (now - self._shown >= 2.0 or self.done == self.total):
            self._shown = now
            elapsed = now - self._start
            left = elapsed / self.done * (self.total - self.done)
            print(f"precompile: {self.done}/{self.total} kernels, {elapsed:.0f} s, "
                  f"about {left:.0f} s left", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._tqdm is not None:
            self._tqdm.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m baracuda_numba.precompile",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated kernel families (scan,reduce,...)")
    parser.add_argument("--dtypes", help="comma-separated element kinds (bf16,f32,...)")
    parser.add_argument("-j", "--jobs", type=int, default=None,
                        help="compile processes (default: one per CPU, at most 16)")
    options = parser.parse_args(argv)
    from ._detect import use_simulator_without_gpu

    if use_simulator_without_gpu():
        print("precompile: no GPU found; nothing to compile (the simulator compiles "
              "nothing)", file=sys.stderr)
        return 0
    start = time.perf_counter()
    try:
        compiled = warmup(options.only.split(",") if options.only else None,
                          options.dtypes.split(",") if options.dtypes else None,
                          options.jobs)
    except ValueError as error:
        parser.error(str(error))
    print(f"precompile: {compiled} kernels compiled in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
