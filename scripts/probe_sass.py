"""Static probe (no GPU): registers, spills and the order of memory operations in the SASS
of a kernel table's kernels, as ptxas (sm_90) compiles them at their register caps.

For each kernel of ``TABLE`` (a ``kernels.reduce`` table such as
``REDUCE_BACKWARD_ROWS_HOLD_KERNELS``; ``KIND:ELEMENT`` pairs pick some), prints ptxas'
register and spill report and one letter per instruction of interest in program order:
``L`` 8-byte global load, ``y`` narrower global load, ``c`` asynchronous copy to shared
memory (``cp.async``: LDGSTS), ``D`` its wait (DEPBAR), ``r`` shared load, ``l`` / ``s``
spill reload / store (local memory), ``a`` FADD, ``S`` 8-byte global store, ``t``
narrower global store, ``|`` block barrier, ``@`` global atomic. A batch whose loads are
meant to be in flight at once reads ``LLLL...aaaa``; ``LaaLaaLaa`` is ptxas issuing each
load just before its use (the nineteenth pass of docs/notes/reduce.md).

The registers are ``ptxas``'s, run alone on the PTX. Numba's build, which makes the
kernels the GPU runs, can give other counts (the column Max gradient: 70 / 64 here, 96 /
124 on the H100, 2026-11-28): ``scripts/probe_regs.py`` reads them on the GPU.

Needs ``ptxas`` on PATH (a CUDA toolkit) and ``nvdisasm`` (the ``nvidia-cuda-nvdisasm``
wheel of the cu13 extra; ``$NVDISASM`` overrides). The PTX's ``.version`` is lowered to
the local ptxas's (``PTX_VERSION``, default 9.0).

    python scripts/probe_sass.py REDUCE_BACKWARD_ROWS_HOLD_KERNELS [VAR:F32 MAX:BF16 ...]
"""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

from numba import cuda

import baracuda_numba.kernels.reduce as reduce_kernels
from baracuda_numba.types import ElementKind, ReduceKind

#: SASS opcode (prefix) -> letter of the order line.
LETTERS = (("LDGSTS", "c"), ("DEPBAR", "D"), ("LDG.E.64", "L"), ("LDG.E", "y"),
           ("LDS", "r"), ("LDL", "l"), ("STL", "s"), ("FADD", "a"), ("STG.E.64", "S"),
           ("STG.E", "t"),
           ("BAR.SYNC", "|"), ("ATOMG", "@"))


def _nvdisasm() -> str:
    if os.environ.get("NVDISASM"):
        return os.environ["NVDISASM"]
    import nvidia

    for root in nvidia.__path__:
        for found in pathlib.Path(root).glob("cu*/bin/nvdisasm"):
            return str(found)
    return shutil.which("nvdisasm") or "nvdisasm"


def order(sass: str) -> str:
    """One letter per instruction of interest (LETTERS), in program order."""
    letters = []
    for line in sass.splitlines():
        match = re.search(r"\b(LDGSTS\S*|DEPBAR\S*|LDG\.E\S*|LDS\S*|LDL\S*|STL\S*|FADD|"
                          r"STG\.E\S*|BAR\.SYNC|ATOMG)\b", line)
        if match:
            letters.append(next(letter for prefix, letter in LETTERS
                                if match.group(1).startswith(prefix)))
    return "".join(letters)


def ptxas_build(kernel: object, workdir: pathlib.Path,
                cc: tuple[int, int] = (9, 0)) -> tuple[str, pathlib.Path]:
    """ptxas' register / spill report of one kernel's PTX at its cap (whole program), and
    the cubin it wrote in ``workdir``."""
    ptx, _ = cuda.compile_ptx(kernel.py_func, kernel.signature, cc=cc)
    ptx = re.sub(r"\.version \d+\.\d+", f".version {os.environ.get('PTX_VERSION', '9.0')}",
                 ptx, count=1)
    source, cubin = workdir / "k.ptx", workdir / "k.cubin"
    source.write_text(ptx)
    args = ["ptxas", f"-arch=sm_{cc[0]}{cc[1]}", "-v", str(source), "-o", str(cubin)]
    if kernel.max_registers:
        args.insert(2, f"--maxrregcount={kernel.max_registers}")
    built = subprocess.run(args, capture_output=True, text=True, check=True)
    report = " | ".join(line.split("info    :")[-1].strip() for line in built.stderr.splitlines()
                        if "registers" in line or "spill" in line)
    return report, cubin


def probe(kernel: object, workdir: pathlib.Path) -> tuple[str, str]:
    """ptxas' register / spill report and the SASS order line of one kernel."""
    report, cubin = ptxas_build(kernel, workdir)
    sass = subprocess.run([_nvdisasm(), "-c", str(cubin)], capture_output=True, text=True,
                          check=True).stdout
    return report, order(sass)


def main() -> None:
    table = getattr(reduce_kernels, sys.argv[1])
    wanted = {(ReduceKind[k], ElementKind[e]) for k, e in
              (pair.split(":") for pair in sys.argv[2:])}
    with tempfile.TemporaryDirectory() as tmp:
        for key, kernel in table.items():
            if wanted and key not in wanted:
                continue
            report, line = probe(kernel, pathlib.Path(tmp))
            print(f"{kernel.name} (cap {kernel.max_registers}): {report}\n  {line}", flush=True)


if __name__ == "__main__":
    main()
