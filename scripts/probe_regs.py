"""GPU probe: the registers and local memory (spills, stack) of kernels as the GPU runs
them, against what ``ptxas`` run alone on the same PTX reports.

Numba's build of a kernel (compile, then link: what ``Kernel.prepare`` loads) can give
other register counts than a ``ptxas`` of the same PTX (``scripts/probe_sass.py``, which
needs no GPU), which the driver's JIT of the PTX alone matches: the column Max gradient
took 96 / 124 registers (bf16 / f32) on the H100 against 70 / 64 from ``ptxas
-arch=sm_90`` (2026-11-28; docs/notes/reduce.md, twenty-seventh pass). Resident blocks
per SM follow the former.

    PYTHONPATH=. python scripts/probe_regs.py [TABLE ...] [KIND:ELEMENT ...]

``TABLE``: ``kernels.reduce`` tables (default every ``REDUCE_*`` table); ``KIND:ELEMENT``
pairs pick keys (default every key). Prints one line per kernel: its cap, the loaded
function's registers (``cuFuncGetAttribute``), local bytes per thread, resident 256-thread
blocks per SM at no dynamic shared memory, and ptxas's registers and spill bytes
(``ptxas`` on PATH; ``-`` where there is none).
"""

from __future__ import annotations

import pathlib
import shutil
import sys
import tempfile

from cuda.bindings import driver as cudrv
from numba import cuda
from probe_sass import ptxas_build

import baracuda_numba.kernels.reduce as reduce_kernels
from baracuda_numba.driver import function_registers, max_active_blocks
from baracuda_numba.launch import Kernel
from baracuda_numba.types import ElementKind, ReduceKind


def _local_bytes(function: int) -> int:
    """Local memory per thread of a loaded function (spills and stack)."""
    err, value = cudrv.cuFuncGetAttribute(
        cudrv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, function)
    if int(err):
        raise RuntimeError(f"cuFuncGetAttribute(LOCAL_SIZE_BYTES): {err}")
    return int(value)


def _ptxas(kernel: Kernel, cc: tuple[int, int]) -> str:
    """ptxas's register and spill report for the kernel's PTX at its cap (whole program;
    ``probe_sass.ptxas_build``), or ``-`` without a ptxas."""
    if shutil.which("ptxas") is None:
        return "-"
    with tempfile.TemporaryDirectory() as tmp:
        return ptxas_build(kernel, pathlib.Path(tmp), (cc[0], cc[1]))[0]


def main() -> None:
    names = [a for a in sys.argv[1:] if ":" not in a] or sorted(
        n for n in dir(reduce_kernels)
        if n.startswith("REDUCE_") and isinstance(getattr(reduce_kernels, n), dict))
    picks = {(ReduceKind[k], ElementKind[e]) for k, e in
             (a.split(":") for a in sys.argv[1:] if ":" in a)}
    cc = cuda.current_context().device.compute_capability
    print(f"{cuda.current_context().device.name}, cc {cc}", flush=True)
    for name in names:
        for key, kernel in getattr(reduce_kernels, name).items():
            if picks and key not in picks:
                continue
            kernel.prepare()
            function = kernel._function
            regs = function_registers(function)
            local = _local_bytes(function)
            blocks = max_active_blocks(function, 256, 0)
            print(f"{kernel.name} (cap {kernel.max_registers}): {regs} regs, local {local} B, "
                  f"{blocks} blocks/SM at 256 threads | ptxas: {_ptxas(kernel, cc)}",
                  flush=True)


if __name__ == "__main__":
    main()
