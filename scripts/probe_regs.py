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

import re
import shutil
import subprocess
import sys
import tempfile

from cuda.bindings import driver as cudrv
from numba import cuda

import baracuda_numba.kernels.reduce as reduce_kernels
from baracuda_numba.driver import max_active_blocks
from baracuda_numba.launch import Kernel
from baracuda_numba.types import ElementKind, ReduceKind


def _attribute(function: int, name: str) -> int:
    err, value = cudrv.cuFuncGetAttribute(getattr(cudrv.CUfunction_attribute, name), function)
    if int(err):
        raise RuntimeError(f"cuFuncGetAttribute({name}): {err}")
    return int(value)


def _ptxas(kernel: Kernel, cc: tuple[int, int]) -> str:
    """ptxas's register and spill report for the kernel's PTX at its cap (whole program)."""
    if shutil.which("ptxas") is None:
        return "-"
    ptx, _ = cuda.compile_ptx(kernel.py_func, kernel.signature, cc=cc)
    with tempfile.TemporaryDirectory() as tmp:
        source = f"{tmp}/k.ptx"
        with open(source, "w") as f:
            f.write(ptx)
        command = ["ptxas", f"-arch=sm_{cc[0]}{cc[1]}", "-v", source, "-o", f"{tmp}/k.cubin"]
        if kernel.max_registers:
            command.insert(1, f"--maxrregcount={kernel.max_registers}")
        log = subprocess.run(command, capture_output=True, text=True).stderr
    regs = re.search(r"Used (\d+) registers", log)
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    return (f"{regs.group(1) if regs else '?'} regs, spills "
            f"{'/'.join(spills.groups()) if spills else '?'}")


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
            regs = _attribute(function, "CU_FUNC_ATTRIBUTE_NUM_REGS")
            local = _attribute(function, "CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES")
            blocks = max_active_blocks(function, 256, 0)
            print(f"{kernel.name} (cap {kernel.max_registers}): {regs} regs, local {local} B, "
                  f"{blocks} blocks/SM at 256 threads | ptxas: {_ptxas(kernel, cc)}",
                  flush=True)


if __name__ == "__main__":
    main()
